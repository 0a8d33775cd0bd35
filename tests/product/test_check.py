"""`ccpo check`: a policy trained on the easier half of mmlu-public's subjects (real bundled
traces) holds on its own traffic and falls short beyond noise on the harder half; the coverage
it reports is the replay's; input errors are exit 2. Exit codes other than 0 are checked
through the real entry point (a subprocess); the rest runs the console script's function in
this process (``tests.helpers.cli.ccpo_in``)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ccpo.api import ConformalPolicy
from ccpo.testing.shift import subject_shift
from tests.helpers.cli import ccpo_in, ccpo_ok


def _ccpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ccpo", *args], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    d = tmp_path_factory.mktemp("shift")
    easy, hard = subject_shift(d)
    ccpo_ok("train", "--traces", str(easy), "--method", "cstop", "--alpha", "0.1",
            "--out", str(d / "pol"))  # fmt: skip
    return d / "pol", easy, hard


def test_check_holds_on_its_own_traffic_and_reports_the_replay(shifted):
    pol, easy, _ = shifted
    got = json.loads(ccpo_ok("check", "--policy", str(pol), "--traces", str(easy), "--json").stdout)
    sets = ConformalPolicy.load(pol).predict_set(str(easy))  # the API's replay, its own κ̂
    assert got["coverage"] == pytest.approx(np.mean([s.covered for s in sets]), abs=1e-12)
    assert got["cost_usd_per_question"] == pytest.approx(np.mean([s.cost_usd for s in sets]))
    assert got["holds"] is True and got["questions"] == len(sets) == 290
    lo, hi = got["coverage_ci"]
    assert lo < got["coverage"] < hi and got["interval"] == "Clopper-Pearson 95%"
    assert got["kappa"] == json.loads((pol / "policy.json").read_text())["kappa_batch"]


def test_check_finds_the_shortfall_on_shifted_traffic(shifted):
    pol, _, hard = shifted
    r = ccpo_in("check", "--policy", str(pol), "--traces", str(hard), "--json")
    assert r.returncode == 1, r.stderr
    got = json.loads(r.stdout)
    assert got["holds"] is False and got["coverage_ci"][1] < 0.9
    assert got["verdict"] == "shortfall beyond noise"
    assert "trained on easy.jsonl" in r.stderr  # another file: a warning, not a refusal
    # κ to restore meets 1 − α on this file, with larger sets
    assert got["kappa_to_restore"] < got["kappa"] and got["coverage_at_restore"] >= 0.9
    human = _ccpo("check", "--policy", str(pol), "--traces", str(hard))
    assert human.returncode == 1 and "shortfall beyond noise" in human.stdout
    assert "Clopper-Pearson" in human.stdout


def test_check_input_errors_are_exit_2(shifted, sim_file, tmp_path):
    pol, easy, _ = shifted
    missing = _ccpo("check", "--policy", str(pol), "--traces", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "nope.jsonl" in missing.stderr
    other_task = _ccpo("check", "--policy", str(pol), "--traces", str(sim_file))
    assert other_task.returncode == 2 and "task" in other_task.stderr
    no_policy = _ccpo("check", "--policy", str(tmp_path), "--traces", str(easy))
    assert no_policy.returncode == 2
    point = tmp_path / "point"
    ccpo_ok("train", "--traces", str(sim_file), "--method", "cpo", "--steps", "5",
            "--out", str(point))  # fmt: skip
    r = _ccpo("check", "--policy", str(point), "--traces", str(sim_file))
    assert r.returncode == 2 and "point policy" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_check_scores_a_single_answer_policy_with_its_own_threshold(tmp_path):
    """A label-free import (agreement with big-m), `train --answer single`: `check` replays one
    answer per question at the policy's λ̂ (= the API's replay), and its restoring threshold
    is Learn-then-Test on the file, whose empirical agreement then meets 1 − α."""
    from ccpo.testing.ladder_table import write_ladder_table

    table, prices = write_ladder_table(tmp_path / "logs", n=400, seed=5, labels=False)
    traces = tmp_path / "logs.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "qa", "--family", "mcq",
            "--prices", str(prices), "--out", str(traces))  # fmt: skip
    pol = tmp_path / "one"
    ccpo_ok("train", "--traces", str(traces), "--answer", "single", "--alpha", "0.1",
            "--out", str(pol))  # fmt: skip
    r = ccpo_in("check", "--policy", str(pol), "--traces", str(traces), "--json")
    assert r.returncode in (0, 1), r.stderr
    got = json.loads(r.stdout)
    sets = ConformalPolicy.load(pol).predict_set(str(traces))
    assert all(len(s.answers) == 1 for s in sets) and got["set_size"] == 1.0
    assert got["coverage"] == pytest.approx(np.mean([s.covered for s in sets]), abs=1e-12)
    assert got["cost_usd_per_question"] == pytest.approx(np.mean([s.cost_usd for s in sets]))
    assert got["against"] == "agreement with big-m"
    assert got["kappa"] == json.loads((pol / "policy.json").read_text())["lambda_hat"]
    assert got["coverage_at_restore"] >= 0.9
    assert r.returncode == (0 if got["holds"] else 1)
