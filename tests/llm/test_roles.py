"""The roles' parsers (verdicts, answers, policy and exit decisions), the guide's
uncertainty and log-prob statistics."""

from __future__ import annotations

import math

import pytest

from ccpo.llm.client import ChatResult, TokenLogprob
from ccpo.llm.roles import (
    Calls,
    extract_answer,
    logprob_stats,
    parse_exit,
    parse_policy_action,
    parse_verdict,
    verdict_uncertainty,
)


# ----------------------------------------------------------------------------- parsers
@pytest.mark.parametrize(
    ("text", "verdict", "answer"),
    [
        ("Yes", "yes", None),
        ("yes.", "yes", None),
        ("YES!", "yes", None),
        ('"Yes"', "yes", None),
        ("**Yes**", "yes", None),
        ("No [Paris]", "no", "Paris"),
        ("no [paris].", "no", "paris"),
        ("NO, [Paris]", "no", "Paris"),
        ("No: Paris", "no", "Paris"),
        ("No - Paris.", "no", "Paris"),
        ("**No** [New York City]", "no", "New York City"),
        ("Your response: No [C]", "no", "C"),
        ("No [B. 4]", "no", "B. 4"),
        ("No", "no", None),
        ("No.", "no", None),
        ("Paris", None, "Paris"),
        ("", None, None),
        ("Nope [x]", None, "Nope [x]"),
    ],
)
def test_parse_verdict(text: str, verdict: str | None, answer: str | None) -> None:
    assert parse_verdict(text) == (verdict, answer)


def test_extract_answer() -> None:
    assert extract_answer("think\nmore\nAnswer: B") == "B"
    assert extract_answer("Final answer: **Paris**.") == "Paris"
    assert extract_answer("Answer: A\nsome trailing line\nThe answer is: C") == "C"
    assert extract_answer("just this") == "just this"
    assert extract_answer("") == ""


def test_extract_answer_mmlu_finds_the_claimed_letter() -> None:
    # a small model that ignores "Answer: X" still yields an option letter for MMLU
    assert extract_answer("Mars is red.\nSo the answer is D", "mmlu") == "D"
    assert extract_answer("I think the answer is (B). Done", "mmlu") == "B"
    assert extract_answer("The correct option is C, because ... \nok", "mmlu") == "C"
    assert extract_answer("Answer: B) Mars", "mmlu") == "B) Mars"  # already a letter: kept
    assert extract_answer("the answer is a planet", "mmlu") == "the answer is a planet"
    assert extract_answer("no letter here", "mmlu") == "no letter here"
    # other tasks are untouched
    assert extract_answer("So the answer is D", "hotpotqa") == "So the answer is D"


def test_parse_policy_and_exit() -> None:
    assert parse_policy_action("1") == "base"
    assert parse_policy_action(" 2.") == "guide"
    assert parse_policy_action("Action: 3") == "next"
    assert parse_policy_action("none") is None
    assert parse_exit("[EXIT]") is True
    assert parse_exit("[continue]") is False
    assert parse_exit("???") is None


# ----------------------------------------------------------------------------- uncertainty
def test_verdict_uncertainty() -> None:
    lp = math.log(0.9)
    assert verdict_uncertainty([TokenLogprob("Yes", lp)]) == pytest.approx(0.1)
    # leading white space / markup tokens are skipped: the verdict token counts
    toks = [TokenLogprob("**", -3.0), TokenLogprob(" No", math.log(0.75)), TokenLogprob(" [", 0)]
    assert verdict_uncertainty(toks) == pytest.approx(0.25)
    assert verdict_uncertainty([TokenLogprob("Yes", 0.0)]) == 0.0
    assert verdict_uncertainty(None) is None  # endpoint gave no log-probs
    assert verdict_uncertainty([]) is None


def test_logprob_stats_and_calls() -> None:
    assert logprob_stats([-1.0, -3.0]) == (-2.0, -3.0)
    assert logprob_stats(None) == (None, None)
    c = Calls()
    c.add(ChatResult("a b", 10, 2, [TokenLogprob("a", -1.0), TokenLogprob(" b", -2.0)]))
    c.add(ChatResult("c", 5, 1, [TokenLogprob("c", -3.0)]))
    assert c.stats() == (-2.0, -3.0) and c.usage() == {"input_tokens": 15, "output_tokens": 3}
    c.add(ChatResult("d", 5, 1, None))  # one call without log-probs → stats unavailable
    assert c.stats() == (None, None)
