"""A ladder's signals are data: they round-trip through the ladder's JSON and the trace file,
append columns after the v1 features (which stay bit for bit what they were), are refused
by name when unknown, and a recorded free-text verdict is paid as part of its round."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ccpo.errors import CCPOError
from ccpo.traces.episodes import build_episodes
from ccpo.traces.featurize import (
    FEATURE_NAMES,
    FEATURE_SPEC,
    check_spec,
    feature_spec,
    featurize_trace,
)
from ccpo.traces.ladder import Ladder, ladder_of_trace
from ccpo.traces.schema import Trace
from ccpo.traces.signals import SIGNAL_FEATURES, normalize_signals, signal_names, text_signals

ALL = ["verdict", "similarity", "length", "refusal", "logprob"]  # not in canonical order


def _with_signals(tr: Trace, signals=ALL, verdict: str | None = "yes") -> Trace:
    d = tr.to_json_dict()
    d["signals"] = list(signals)
    for r in d["rounds"]:
        sig = text_signals(r["base"]["answer"], r["guide"]["answer"])
        if verdict is not None:
            sig["verdict"] = {"model": r["guide"]["model"], "verdict": verdict,
                              "uncertainty": 0.25, "prompt": "ccpo-free-verdict/1",
                              "usage": {"input_tokens": 100, "output_tokens": 1}}  # fmt: skip
        r["signals"] = sig
    return Trace.model_validate(d)


def test_signals_are_ordered_and_checked():
    assert normalize_signals(ALL) == ("similarity", "length", "refusal", "logprob", "verdict")
    with pytest.raises(CCPOError, match=r"unknown signal .vibes.*known: similarity"):
        normalize_signals(["length", "vibes"])
    with pytest.raises(CCPOError, match="needs an embedding_model"):
        normalize_signals(["embedding"])
    assert normalize_signals(["embedding"], "emb") == ("embedding",)


def test_the_ladder_carries_its_signals_through_json(sim_traces):
    lad = ladder_of_trace(sim_traces[0])
    assert "signals" not in lad.to_dict()  # as before: no key without signals
    with_s = ladder_of_trace(_with_signals(sim_traces[0]))
    d = json.loads(json.dumps(with_s.to_dict()))
    assert d["signals"] == ["similarity", "length", "refusal", "logprob", "verdict"]
    assert Ladder.from_dict(d) == with_s and with_s != lad
    with pytest.raises(CCPOError, match="unknown signal"):
        Ladder.from_dict({**d, "signals": ["nope"]})


def test_trace_files_round_trip_and_old_files_are_unchanged(sim_traces):
    tr = sim_traces[0]
    old = tr.to_json_dict()
    assert "signals" not in old and all("signals" not in r for r in old["rounds"])
    assert Trace.model_validate(old).to_json_dict() == old
    new = _with_signals(tr).to_json_dict()
    assert Trace.model_validate(json.loads(json.dumps(new))).to_json_dict() == new
    bad = json.loads(json.dumps(new))
    bad["rounds"][0]["signals"]["verdict"]["model"] = "someone-else"
    with pytest.raises(ValueError, match="guide model"):
        Trace.model_validate(bad)
    bad = {**new, "signals": ["telepathy"]}
    with pytest.raises(ValueError, match="unknown signal"):
        Trace.model_validate(bad)


def test_signal_columns_follow_the_v1_columns_unchanged(sim_traces):
    for tr in sim_traces[:20]:
        v1 = featurize_trace(tr)
        x = featurize_trace(_with_signals(tr))
        names = feature_spec(normalize_signals(ALL))["names"]
        assert x.shape == (tr.n_rounds, len(names)) and names[: len(FEATURE_NAMES)] == list(
            FEATURE_NAMES
        )
        np.testing.assert_array_equal(x[:, : len(FEATURE_NAMES)], v1)
        col = {n: i for i, n in enumerate(names)}
        assert (x[:, col["judge_yes"]] == 1).all() and (x[:, col["judge_no"]] == 0).all()
        assert np.allclose(x[:, col["judge_uncertainty"]], 0.25)
        same = [r.base.answer == r.guide.answer for r in tr.rounds]
        assert ((x[:, col["sim_words"]] == 1.0) >= np.array(same)).all()
    assert feature_spec(()) == FEATURE_SPEC
    assert signal_names(("refusal",)) == list(SIGNAL_FEATURES["refusal"])


def test_a_saved_spec_is_checked_with_its_signals():
    check_spec(FEATURE_SPEC)
    spec = feature_spec(("similarity", "verdict"))
    check_spec(json.loads(json.dumps(spec)))
    with pytest.raises(CCPOError, match="feature spec mismatch"):
        check_spec({**spec, "names": spec["names"][:-1]})
    with pytest.raises(CCPOError, match="newer ccpo"):
        check_spec({**spec, "signals": ["similarity", "telepathy"]})


def test_episodes_use_the_ladder_signals_and_price_the_verdict(sim_traces, prices):
    traces = sim_traces[:30]
    plain = build_episodes(traces, prices)
    ep = build_episodes([_with_signals(t) for t in traces], prices)
    assert plain.feature_spec == FEATURE_SPEC
    assert ep.feature_spec["signals"] == list(normalize_signals(ALL))
    assert ep.obs.shape[-1] == len(ep.feature_spec["names"])
    verdict_usd = prices.cost(traces[0].rounds[0].guide.model, 100, 1)
    np.testing.assert_allclose(ep.round_cost - plain.round_cost, verdict_usd, rtol=1e-12)
    mixed = [_with_signals(traces[0]), *traces[1:]]
    with pytest.raises(CCPOError, match="records the signals"):
        build_episodes(mixed, prices)
