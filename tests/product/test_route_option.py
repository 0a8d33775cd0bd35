"""``ccpo train --route``: a routed single-answer folder (router file with the Pareto sequence
its calibration walked, τ̂ beside λ̂, loaded back as a routed policy that recalibrates as it
was calibrated); one-line usage errors for a set policy and for a judge ladder, which cannot be
routed, through the real entry point (a subprocess). The trainings that succeed run the console
script's function in this process (``tests.helpers.cli.ccpo_ok``)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from ccpo.evaluation.harness import load_episodes
from ccpo.policies.registry import load_policy
from ccpo.policies.routing.pareto import PARETO_TAUS
from ccpo.policies.routing.single import ROUTE_FILE, TAUS, RoutedPolicy
from tests.helpers.cli import assert_usage_error, ccpo_ok
from tests.helpers.routing import imported_ladder


def _ccpo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ccpo", *args], capture_output=True, text=True, timeout=300
    )


def test_train_route_writes_a_routed_folder(tmp_path) -> None:
    traces, prices = imported_ladder(tmp_path, n=200)
    out = tmp_path / "policy"
    ccpo_ok("train", "--traces", str(traces), "--answer", "single", "--route",
            "--alpha", "0.2", "--prices", str(prices), "--out", str(out))  # fmt: skip
    meta = json.loads((out / "policy.json").read_text())
    assert (out / ROUTE_FILE).is_file() and meta["route"]["tau"] in PARETO_TAUS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["route_tau"] == meta["route"]["tau"]
    assert summary["route_calibration"] == "pareto"
    pol = load_policy(out)
    assert isinstance(pol, RoutedPolicy) and pol.is_calibrated and pol.variant.endswith("+route")
    assert pol.sequence is not None and tuple(pol.sequence[0]) == (2.0, 2.0)
    assert [pol.tau, pol.threshold] in pol.sequence.tolist()
    ep, _ = load_episodes(traces, [str(prices)])
    cal = np.arange(ep.n)
    th, _ = pol.split_thresholds(ep, pol.episode_scores(ep), cal[None], pol.alpha)
    assert th.shape == (1, 2) and list(th[0]) in pol.sequence.tolist()


def test_route_refuses_unroutable_methods_and_judge_ladders(tmp_path) -> None:
    traces, prices = imported_ladder(tmp_path, n=60)
    for extra in (["--answer", "set", "--method", "depth-k"], ["--method", "ccpo"]):
        r = _ccpo("train", "--traces", str(traces), "--route", *extra,
                  "--out", str(tmp_path / "a"), "--prices", str(prices))  # fmt: skip
        assert_usage_error(r, "--route works with --method auto, cstop or cstop-lr")
        assert not (tmp_path / "a").exists()
    r = _ccpo("train", "--traces", str(traces), "--route", "--answer", "set",
              "--route-embeddings", "--out", str(tmp_path / "a"),
              "--prices", str(prices))  # fmt: skip
    assert_usage_error(r, "--route-embeddings works with --route and single answers")
    sim = tmp_path / "sim.jsonl"
    ccpo_ok("sim", "--n", "200", "--out", str(sim))
    r = _ccpo("train", "--traces", str(sim), "--answer", "single", "--route", "--alpha", "0.3",
              "--out", str(tmp_path / "b"))  # fmt: skip
    assert_usage_error(r, "agree rounds")
    assert not (tmp_path / "b").exists()


def test_train_route_writes_a_routed_set_folder(tmp_path) -> None:
    from ccpo.policies.routing.sets import RoutedSetPolicy

    traces, prices = imported_ladder(tmp_path, n=200)
    out = tmp_path / "sets"
    r = ccpo_ok("train", "--traces", str(traces), "--answer", "set", "--route", "--method",
                "cstop", "--alpha", "0.2", "--prices", str(prices), "--out", str(out))  # fmt: skip
    assert "fitted cstop+route" in " ".join(r.stdout.split())
    meta = json.loads((out / "policy.json").read_text())
    assert meta["answer"] == "set" and meta["route"]["tau"] in TAUS
    pol = load_policy(out)
    assert isinstance(pol, RoutedSetPolicy) and pol.is_calibrated
