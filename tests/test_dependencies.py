"""Every requirement in pyproject.toml has an upper bound.

A fresh install resolves the newest versions a requirement allows: typer 0.29 (its own
click) once turned every usage error into a traceback while the tests stayed green, and a
new ruff minor adds lint rules that fail CI's ``ruff check``. A bound lets a new major (a
new minor below 1.0) in only after the tests have run on it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# a requirement's name, its extras, and the version clauses before any marker
_REQ = re.compile(r"^\s*([A-Za-z0-9._-]+)\s*(\[[^\]]*\])?\s*([^;]*)")


def _requirements() -> list[tuple[str, str]]:
    meta = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    reqs = [("dependencies", r) for r in meta["dependencies"]]
    for extra, rs in meta["optional-dependencies"].items():
        reqs += [(extra, r) for r in rs]
    return reqs


def _upper_bound(clauses: str) -> bool:
    """``clauses`` (``>=1.2,<2``) cap the version: a ``<``, ``<=``, ``==`` or ``~=`` clause."""
    return any(re.match(r"\s*(<|<=|==|~=)\s*\d", c) for c in clauses.split(","))


def test_every_requirement_has_an_upper_bound():
    reqs = _requirements()
    assert len(reqs) > 20  # the parse found them (core, serve, train, otel, postgres, dev)
    unbounded = []
    for where, req in reqs:
        m = _REQ.match(req)
        assert m is not None, req
        name, _, clauses = m.groups()
        if where == "dev" and name == "ccpo":  # the project's own extras, bounded above
            continue
        if not _upper_bound(clauses):
            unbounded.append(f"{where}: {req}")
    assert not unbounded, "requirements without an upper bound:\n" + "\n".join(unbounded)


def test_the_check_sees_a_missing_bound():
    assert not _upper_bound(">=0.110")
    assert not _upper_bound("")
    assert _upper_bound(">=0.110,<0.166")
    assert _upper_bound("==2.13.0")


# ------------------------------------------------------------------------ no torch, no CUDA
#: what the registry's torch brings (its CUDA build: 5.2 GB in a venv, 2.7 GB of nvidia/,
#: 0.7 GB of triton); no extra of ccpo may require any of them, directly or not
HEAVY = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*)$")


def _closure(dist_name: str, extras: tuple[str, ...]) -> dict[str, str]:
    """Every installed distribution that ``dist_name[extras]`` requires, recursively, read
    from the installed metadata (each requirement's marker evaluated for the extras asked of
    it): normalised name → the requirement chain that brought it."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    todo = [(dist_name, extras, dist_name)]
    seen: set[tuple[str, str]] = set()
    while todo:
        name, asked, chain = todo.pop()
        for extra in ("", *asked):
            if (canonicalize_name(name), extra) in seen:
                continue
            seen.add((canonicalize_name(name), extra))
            try:
                requires = distribution(name).requires or []
            except PackageNotFoundError:
                continue  # required by a marker that holds, yet absent: pip check's business
            for text in requires:
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                    continue
                dep = canonicalize_name(req.name)
                found.setdefault(dep, f"{chain} → {req}")
                todo.append((dep, tuple(sorted(req.extras)), f"{chain} → {req}"))
    return found


def test_the_dev_install_requires_no_torch_triton_or_nvidia_package():
    """``pip install -e '.[dev]'`` (the README's set-up) as installed here: the requirements
    of ccpo[dev], followed through every extra and every dependency, name none of them."""
    deps = _closure("ccpo", ("dev",))
    # the walk went through the extras (dev → serve, train, otel, postgres) and beyond
    assert {"fastapi", "matplotlib", "psycopg", "numpy", "scikit-learn", "pytest"} <= set(deps)
    assert "pillow" in deps  # a dependency of matplotlib: two levels down
    heavy = {name: why for name, why in deps.items() if HEAVY.match(name)}
    assert not heavy, "\n".join(heavy.values())


def test_no_extra_in_pyproject_names_torch():
    """pyproject.toml itself (the installed metadata above may be older than the clone)."""
    named = [(where, req) for where, req in _requirements() if HEAVY.match(_REQ.match(req)[1])]
    assert not named, named
    assert "train" in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]


def test_the_closure_sees_a_heavy_requirement():
    """The walk would report torch: here it finds pytest's own requirements the same way."""
    deps = _closure("pytest", ())
    assert "pluggy" in deps and "iniconfig" in deps
    assert not HEAVY.match("matplotlib") and HEAVY.match("nvidia-cublas-cu12")
    assert HEAVY.match("triton") and HEAVY.match("torch")
