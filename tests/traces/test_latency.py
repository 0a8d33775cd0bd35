"""Estimated latency from the traces' usage: an ``agree`` round takes its longer call (sent at
once), a ``judge`` round the sum of its two, a reused step nothing; a question sums the rounds
it ran; calling one model alone takes that call."""

from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from ccpo.traces.latency import (
    FIRST_TOKEN_SECONDS,
    TOKENS_PER_SECOND,
    call_seconds,
    question_latency,
    round_seconds,
)


def _step(out: int, reused: bool = False) -> NS:
    return NS(usage=NS(output_tokens=out), reused=reused)


def test_a_round_takes_its_longer_call_when_both_are_sent_at_once() -> None:
    a, b = call_seconds(100), call_seconds(10)
    assert a == pytest.approx(FIRST_TOKEN_SECONDS + 100 / TOKENS_PER_SECOND)
    assert round_seconds(NS(base=_step(100), guide=_step(10), verdict_mode="agree")) == a
    assert round_seconds(NS(base=_step(100), guide=_step(10), verdict_mode="judge")) == a + b
    reused = NS(base=_step(100, reused=True), guide=_step(10), verdict_mode="agree")
    assert round_seconds(reused) == b


def test_a_question_sums_the_rounds_it_ran() -> None:
    per_round = np.array([[1.0, 2.0, 4.0], [0.5, 0.5, 0.5]])
    got = question_latency(per_round, np.array([[0, 1], [1, 0]]), np.array([[3, 1], [2, 2]]))
    assert got.tolist() == [[7.0, 0.5], [1.0, 3.0]]
