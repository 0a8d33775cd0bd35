"""A round becomes a record in one place: the collector stores it, the live agent reads it."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.llm.protocol import RoundOutput, live_round
from ccpo.llm.roles import BaseOutput, Calls, GuideOutput
from ccpo.llm.tasks.loaders import Question
from ccpo.traces.featurize import featurize_rounds
from ccpo.traces.schema import Round


def _round(t: int, base: str, verdict: str, guide: str) -> RoundOutput:
    b = BaseOutput(base, f"reasoning {t}", Calls(800 + t, 90, [-0.2, -1.5], 1))
    g = GuideOutput(verdict, guide, f"{verdict} {guide}", 0.1 * t, Calls(900, 5, None, 1))
    return RoundOutput(t, b, g)


def test_the_live_round_is_the_stored_round_without_correct():
    q = Question("q1", "hotpotqa", "Who?", ["Paris"], [])
    outs = [_round(1, "Lyon", "no", "Paris"), _round(2, "Paris", "yes", "Paris")]
    stored = [Round.model_validate(o.record("b", "g", q)) for o in outs]
    live = [live_round(o.record("b", "g")) for o in outs]
    assert [(r.base.correct, r.guide.correct) for r in stored] == [(False, True), (True, True)]
    np.testing.assert_array_equal(
        featurize_rounds("hotpotqa", 4, live, None, ()),
        featurize_rounds("hotpotqa", 4, stored, None, ()),
    )
    assert live[0].base.logprob_min == -1.5 and live[1].guide.usage.input_tokens == 900
    with pytest.raises(AttributeError):
        _ = live[0].base.correct  # live there is no gold: nothing pretends to know
