"""`ccpo compare` trains its policies in worker processes: the rows must not depend on it
(SYNTHETIC data, ccpo.traces.sim)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from ccpo.evaluation.comparison import run_compare, start_training
from ccpo.evaluation.rows import training_pool


def test_parallel_training_gives_the_same_rows(sim_file, tmp_path):
    """One process, three processes, and a pool shared with another comparison (as
    ``reproduce`` runs every α) give the same rows."""
    args = dict(alpha=0.2, splits=3, steps=8)
    rows = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        run_compare(sim_file, out, workers=workers, console=Console(quiet=True), **args)
        rows[workers] = json.loads((out / "results.json").read_text())["rows"]
    with training_pool(2) as pool:
        other = start_training(sim_file, pool, alpha=0.1, splits=3, steps=8)
        cache = start_training(sim_file, pool, **args)
        assert len(cache.pending) == 3 and len(other.pending) == 3
        run_compare(sim_file, tmp_path / "pool", cache=cache, console=Console(quiet=True), **args)
        assert not cache.pending and len(cache.trained) == 3
        with pytest.raises(ValueError, match="other steps"):
            run_compare(sim_file, tmp_path / "bad", alpha=0.1, splits=3, steps=9, cache=other)
    rows["pool"] = json.loads((tmp_path / "pool" / "results.json").read_text())["rows"]
    names = [r["policy"] for r in rows[1]]
    assert {"cpo-batch", "ccpo", "ccpo-lam0.5"} <= set(names)
    assert rows[1] == rows[3] == rows["pool"]


def test_a_baseline_name_is_the_baseline_even_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """A folder named like a baseline (``/tmp/base``) in the working directory is not taken for
    a policy folder unless it holds one; a folder that does is still read as the policy."""
    from ccpo.errors import CCPOError
    from ccpo.evaluation.rows import make_policy
    from ccpo.learning.baselines import FixedAnswerPolicy

    (tmp_path / "base").mkdir()
    (tmp_path / "mine").mkdir()
    monkeypatch.chdir(tmp_path)
    assert isinstance(make_policy("base", None), FixedAnswerPolicy)
    with pytest.raises(CCPOError, match="not a trained policy folder"):
        make_policy("mine", None)
