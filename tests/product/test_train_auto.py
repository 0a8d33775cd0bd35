"""`ccpo train --method auto` (the default) and the stopping methods, through the console
script's function (``ccpo.cli.main``): the choice and its figures are recorded, and the folder
evaluates and loads in the API (SYNTHETIC data, ccpo.traces.sim)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccpo.api import ConformalPolicy
from ccpo.cli import main
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok


def test_train_auto_records_the_choice_and_evaluates(sim_file, tmp_path, capsys):
    out = tmp_path / "auto"
    r = ccpo_ok("train", "--traces", str(sim_file), "--alpha", "0.2", "--auto-ccpo-steps", "100",
                "--out", str(out))  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    meta = json.loads((out / "policy.json").read_text())
    auto = summary["auto"]
    costs = {k: v["cost_cents_per_question"] for k, v in auto["validation"].items()}
    assert auto["picked"] == min(costs, key=costs.get) == meta["variant"]
    assert "ccpo" in costs and "agree-k" in costs  # auto considers CCPO
    assert meta["info"]["auto"]["picked"] == auto["picked"]
    assert "← picked" in r.stdout and auto["picked"] in r.stdout
    assert 0.0 <= meta["kappa_batch"] <= 1.0
    ev = tmp_path / "ev"
    assert main(["evaluate", "--traces", str(sim_file), "--policy", str(out), "--policy",
                 "depth-k", "--alpha", "0.2", "--splits", "5", "--out", str(ev)]) == 0  # fmt: skip
    rows = {x["policy"]: x for x in json.loads((ev / "results.json").read_text())["rows"]}
    assert set(rows) == {"auto", "depth-k"}
    assert rows["auto"]["coverage"] > 0.6


@pytest.mark.parametrize("method", ["cstop", "depth-k"])
def test_stopping_methods_through_the_api(sim_file, tmp_path, method):
    traces = read_traces(sim_file)
    out = tmp_path / method
    assert main(["train", "--traces", str(sim_file), "--method", method, "--out", str(out)]) == 0
    pol = ConformalPolicy.load(out)
    assert pol.is_calibrated and pol.method == method
    sets = pol.predict_set(traces[:20])
    assert all(1 <= s.rounds <= 4 and s.answers for s in sets)
    fresh = ConformalPolicy(method=method, alpha=0.1).fit(traces[:200])
    with pytest.raises(Exception, match="calibrate"):
        fresh.predict_set(traces[:2])
    fresh.calibrate(traces[200:260])
    assert np.isfinite(fresh.policy.kappa)


def test_unknown_method_is_one_line(sim_file, tmp_path, capsys):
    code = main(["train", "--traces", str(sim_file), "--method", "nope", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "--method must be one of auto" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("method", "variant"), [("agree-k", "agree-k"), ("ccpo-lam0.5", "ccpo-lam0.5")]
)
def test_every_registered_method_trains(sim_file, tmp_path, method, variant):
    """Names come from one registry: agree-k (once refused by a hand-copied list) and a
    ccpo-lam<λ> name train through the entry point and record their variant."""
    out = tmp_path / method
    args = ["train", "--traces", str(sim_file), "--method", method, "--steps", "3"]
    assert main([*args, "--out", str(out)]) == 0
    meta = json.loads((out / "policy.json").read_text())
    assert meta["variant"] == variant
    if method.startswith("ccpo-lam"):
        assert meta["config"]["lam"] == 0.5


def test_api_takes_set_valued_methods_only(sim_file):
    """The API calibrates κ̂ by split conformal, so a row scored another way (cpo-online's
    online κ) is refused with the list of what it takes; λ rides on the method name."""
    with pytest.raises(Exception, match="method must be one of auto"):
        ConformalPolicy(method="cpo-online")
    pol = ConformalPolicy(method="ccpo-lam0.5")
    assert pol.config.method == "ccpo" and pol.config.lam == 0.5
    assert ConformalPolicy(method="cpo").config.method == "cpo"
