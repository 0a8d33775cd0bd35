"""The task scorers: an answer against the gold answers."""

from __future__ import annotations

import pytest

from ccpo.llm.tasks import score


# ----------------------------------------------------------------------------- scorers
@pytest.mark.parametrize(
    ("task", "pred", "gold", "ok"),
    [
        ("mmlu", "B", ["B"], True),
        ("mmlu", "(b) Paris", ["B"], True),
        ("mmlu", "The answer is C.", ["C"], True),
        ("mmlu", "A", ["B"], False),
        ("hotpotqa", "the Seth MacFarlane!", ["Seth MacFarlane"], True),
        ("hotpotqa", "Seth", ["Seth MacFarlane"], False),
        ("jsonl", "two", ["2", "two"], True),
        ("hotpotqa", "", ["x"], False),
    ],
)
def test_scorer(task: str, pred: str, gold: list[str], ok: bool) -> None:
    assert score(task, pred, gold) is ok
