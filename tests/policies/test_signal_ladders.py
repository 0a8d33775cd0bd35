"""A ladder's signals travel with the policy: ``ccpo train`` on traces that record signals
writes them into the folder's ladder and feature spec, and the loaded policy decides live
rounds (featurized with those signals) exactly as its replay does; a deployment keeps them.
Traces: SYNTHETIC (``ccpo.traces.sim``) with signals computed from their answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccpo.api import ConformalPolicy
from ccpo.policies import load_policy
from ccpo.runtime.agent import deployment_ladder
from ccpo.runtime.config import DeployConfig
from ccpo.runtime.decision import decide
from ccpo.traces.episodes import build_episodes
from ccpo.traces.featurize import feature_spec
from ccpo.traces.io import write_traces
from ccpo.traces.ladder import Ladder
from ccpo.traces.schema import Trace
from ccpo.traces.signals import text_signals
from tests.helpers.cli import assert_usage_error, ccpo_ok, run_ccpo

SIGNALS = ["similarity", "length", "refusal", "logprob"]


def _with_signals(tr: Trace) -> Trace:
    d = tr.to_json_dict()
    d["signals"] = SIGNALS
    for r in d["rounds"]:
        r["signals"] = text_signals(r["base"]["answer"], r["guide"]["answer"])
    return Trace.model_validate(d)


@pytest.mark.parametrize("answer", ["set", "single"])
def test_signals_round_trip_through_a_policy_folder(tmp_path, sim_traces, prices, answer):
    traces = [_with_signals(t) for t in sim_traces]
    path = tmp_path / "signals.jsonl"
    write_traces(path, traces)
    out = tmp_path / f"policy-{answer}"
    ccpo_ok("train", "--traces", str(path), "--method", "cstop", "--alpha", "0.2",
            "--answer", answer, "--out", str(out))  # fmt: skip
    meta = json.loads((out / "policy.json").read_text())
    assert meta["provenance"]["ladder"]["signals"] == SIGNALS
    assert Ladder.from_dict(meta["provenance"]["ladder"]).signals == tuple(SIGNALS)
    spec = json.loads((out / "features.json").read_text())
    assert spec == feature_spec(tuple(SIGNALS))
    pol = load_policy(out)
    assert pol.feature_spec == spec
    # live decisions (featurized with the folder's signals) stop where the replay stops
    ep = build_episodes(traces, prices)
    ran, _ = pol.replay_answers(ep)
    horizon = pol.trained_horizon()
    for i, tr in enumerate(traces[-40:], start=len(traces) - 40):
        t = 1
        while decide(pol, tr.task, horizon, tr.rounds[:t], pol.threshold, tr.family).go_on:
            t += 1
        assert t == int(np.asarray(ran[i]).sum()), tr.id
    sets = ConformalPolicy.load(out).predict_set(traces[-5:])
    assert len(sets) == 5
    # a deployment that names other models for the one-pair ladder keeps the signals
    lad = deployment_ladder(pol, DeployConfig(base_model="other-base"), horizon, "test")
    assert lad.rounds[0].base.model == "other-base" and lad.signals == tuple(SIGNALS)
    # traces without the signals cannot be scored by it: refused, naming both
    plain = tmp_path / "plain.jsonl"
    write_traces(plain, sim_traces)
    r = run_ccpo("check", "--policy", str(out), "--traces", str(plain))
    assert_usage_error(r, "the ladder signals", "but the traces record none")
