"""The public API is importable from the top, cheaply; the old paths of what users import
(``ccpo.product.api``, ``python -m ccpo.product.cli``) keep working for one release and say
where the names went with a ``DeprecationWarning``."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_public_api_is_importable_from_the_top() -> None:
    from ccpo import ConformalPolicy, load_policy, read_traces
    from ccpo.api import ConformalPolicy as moved
    from ccpo.learning.policy import load_policy as loader
    from ccpo.traces.io import read_traces as reader

    assert (ConformalPolicy, load_policy, read_traces) == (moved, loader, reader)


def test_importing_ccpo_loads_nothing_else() -> None:
    code = "import sys, ccpo; print(sorted(m for m in sys.modules if m.split('.')[0] in "
    code += "('ccpo', 'torch', 'numpy')))"
    r = _python("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['ccpo']"]


def test_an_unknown_top_level_name_is_an_attribute_error() -> None:
    import ccpo

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ccpo.nope  # noqa: B018


def test_the_old_api_path_warns_and_gives_the_same_class() -> None:
    from ccpo.api import ConformalPolicy, PredictedSet

    with pytest.warns(DeprecationWarning, match=r"ccpo\.api"):
        from ccpo.product.api import ConformalPolicy as old
    assert old is ConformalPolicy
    with pytest.warns(DeprecationWarning):
        from ccpo.product.api import PredictedSet as old_set
    assert old_set is PredictedSet
    with pytest.raises(ImportError):
        from ccpo.product.api import nope  # noqa: F401


def test_the_old_cli_module_gives_app_and_run_quietly() -> None:
    import ccpo.cli

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from ccpo.product.cli import app, run
    assert (app, run) == (ccpo.cli.app, ccpo.cli.run)
    with pytest.warns(DeprecationWarning, match=r"ccpo\.cli"):
        from ccpo.product.cli import main
    assert main is ccpo.cli.main


def test_python_m_ccpo_runs_the_cli() -> None:
    r = _python("-m", "ccpo", "--version")
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "ccpo 0.1.0", "")


def test_python_m_ccpo_product_cli_still_runs_and_warns_once() -> None:
    r = _python("-m", "ccpo.product.cli", "--version")
    assert (r.returncode, r.stdout.strip()) == (0, "ccpo 0.1.0"), r.stderr
    assert r.stderr.count("DeprecationWarning") == 1 and "python -m ccpo" in r.stderr
    r = _python("-m", "ccpo.product.cli", "trian")
    assert r.returncode == 2
    assert r.stderr.count("DeprecationWarning") == 1
    assert "No such command 'trian'. Did you mean 'train'?" in r.stderr
