"""The ladder of a trace set (:mod:`ccpo.traces.ladder`): defaults for old files, the
paid-once rule, the JSON form a policy keeps, and the agree signals."""

from __future__ import annotations

import math

import pytest

from ccpo.errors import CCPOError
from ccpo.traces.answers import exact_match, family_of, normalizer_for
from ccpo.traces.io import parse_trace_line
from ccpo.traces.ladder import (
    Ladder,
    LadderRound,
    Step,
    agree_signals,
    ladder_of,
    ladder_of_trace,
    transfer_signal,
)


def _trace(
    tid: str, rounds: list[tuple[str, str]], task: str = "hotpotqa", meta=None, **round_fields
):
    import json

    rs = [
        {"round": t, **round_fields,
         "base": {"model": b, "answer": "x", "correct": False,
                  "usage": {"input_tokens": 1, "output_tokens": 1}},
         "guide": {"model": g, "answer": "y", "correct": True,
                   "usage": {"input_tokens": 1, "output_tokens": 1}}}
        for t, (b, g) in enumerate(rounds, start=1)
    ]  # fmt: skip
    line = {"schema": "ccpo.trace/v1", "id": tid, "task": task, "question": "q?",
            "gold": ["y"], "rounds": rs, "meta": meta or {}}  # fmt: skip
    return parse_trace_line(json.dumps(line))


def test_an_old_file_reads_as_a_judge_ladder_of_its_models():
    lad = ladder_of_trace(_trace("a", [("b1", "g"), ("b2", "g")], meta={"agent": "react"}))
    assert [r.verdict for r in lad.rounds] == ["judge", "judge"]
    # the paper's prompts as ccpo collect recorded them: a ReAct base, a judging guide
    assert lad.round(1) == LadderRound(Step("b1", "react"), Step("g", "judge"), "judge")
    # a file from elsewhere does not say: chain of thought (no search tool it never used)
    assert ladder_of_trace(_trace("x", [("b", "g")])).round(1).base.prompt == "cot"
    assert lad.models() == ["b1", "g", "b2"] and lad.T == 2
    assert ladder_of_trace(_trace("m", [("b", "g")], task="mmlu")).round(1).base.prompt == "cot"
    # judge rounds never repeat a call: the base's context grows every round
    assert lad.reused(2, "guide") is None


def test_agree_rounds_repeat_a_call_of_the_same_model_and_prompt():
    cascade = Ladder(
        "qa",
        "short",
        tuple(
            LadderRound(Step(b, "cot"), Step(g, "cot"), "agree")
            for b, g in (("m1", "m2"), ("m2", "m3"), ("m3", "m4"))
        ),
    )
    assert cascade.reused(1, "base") is None and cascade.reused(1, "guide") is None
    assert cascade.reused(2, "base") == (1, "guide")
    assert cascade.reused(3, "base") == (2, "guide")
    assert cascade.reused(3, "guide") is None
    one_guide = Ladder(
        "qa", "short",
        (LadderRound(Step("a", "cot"), Step("G", "cot"), "agree"),
         LadderRound(Step("b", "cot"), Step("G", "cot"), "agree"),
         LadderRound(Step("G", "other"), Step("G", "cot"), "agree")),
    )  # fmt: skip
    assert one_guide.reused(2, "guide") == (1, "guide")
    assert one_guide.reused(3, "base") is None  # another prompt: another call
    assert one_guide.reused(3, "guide") == (1, "guide")


def test_the_json_form_round_trips_and_mixed_sets_are_refused():
    lad = Ladder.one_pair("mmlu", "b", "g", 3)
    assert Ladder.from_dict(lad.to_dict()) == lad and lad.family == "mcq"
    with pytest.raises(CCPOError, match="malformed ladder"):
        Ladder.from_dict({"task": "x", "rounds": [{"base": {}}]})
    with pytest.raises(CCPOError, match="verdict 'vote'"):
        d = lad.to_dict()
        d["rounds"][0]["verdict"] = "vote"
        Ladder.from_dict(d)
    same = [_trace("a", [("b", "g")]), _trace("b", [("b", "g")])]
    assert ladder_of(same).models() == ["b", "g"]
    with pytest.raises(CCPOError, match="trace 'c' follows another ladder than 'a'"):
        ladder_of([*same, _trace("c", [("b", "h")])])


def test_agree_signals_and_their_transfer():
    lp, u = agree_signals(0.8)
    assert lp == round(math.log(0.8), 9) and u == 0.2
    assert agree_signals(None) == (None, None)
    assert agree_signals(0.0)[0] == round(math.log(1e-6), 9)  # not −∞
    assert transfer_signal(u, "guide", "base") == lp
    assert transfer_signal(lp, "base", "guide") == u
    assert (
        transfer_signal(u, "guide", "guide") == u and transfer_signal(None, "base", "guide") is None
    )


def test_task_families():
    assert [family_of(t) for t in ("mmlu", "hotpotqa", "jsonl", "medqa", "mmlu-pro")] == [
        "mcq", "short", "short", "short", "mcq"
    ]  # fmt: skip
    assert family_of("medqa", "mcq") == "mcq"
    with pytest.raises(ValueError, match="unknown task family 'letters'"):
        family_of("medqa", "letters")
    with pytest.raises(ValueError, match="built in with family 'mcq'"):
        family_of("mmlu", "short")
    assert normalizer_for("medqa", "mcq")("(b) Paris") == "B"
    assert exact_match("  Paris ", ["Paris"], "city", "exact")
    assert not exact_match("paris", ["Paris"], "city", "exact")  # exact: case matters
    assert exact_match("paris", ["Paris"], "city", "short")
