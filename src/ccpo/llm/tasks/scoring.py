"""Scorers: one per task, all through :mod:`ccpo.traces.answers` (no second normaliser).

- ``mmlu``: the option letter (``normalize_choice``): ``"(b) Paris"`` scores as ``"B"``.
- everything else (``hotpotqa``, ``jsonl``): SQuAD/HotpotQA normalised exact match.
"""

from __future__ import annotations

from ccpo.traces.answers import exact_match


def score(task: str, prediction: str, gold: list[str], family: str | None = None) -> bool:
    """True iff ``prediction`` matches some gold answer under the task's normaliser (its
    family's: :func:`ccpo.traces.answers.family_of`)."""
    return exact_match(prediction or "", list(gold), task, family)
