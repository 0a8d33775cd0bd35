"""Verify steps: a cheap verifier model's Yes/No on the reply of the step before it, priced as
its own step, and what an import does for logs that carry no verdicts.

A verify step is a round of a one-model ladder (``verdict_mode: "verify"``,
:func:`ccpo.traces.ladder.verify_round`): its base repeats the reply of the step before it
(``reused``, zero usage: paid there), its guide is the verifier asked with the free-text
verdict prompt, with the verifier's usage, its ``verdict`` and ``uncertainty`` (the
``verdict_yes`` / ``guide_uncertainty`` features). Returning from it returns that reply.

Logs without verdicts: only on request (``traces import --simulate-verifier ACCURACY``) the
verdict is **simulated** (:func:`simulated_verdict`: the reply's label, flipped with
probability 1 − ACCURACY by a hash of (question id, model); :func:`simulated_usage`: the
prompt's and the reply's tokens in, one out), and every trace records it in
``meta.simulated_verifier`` (:func:`simulated_record`), which reports and guarantees name
(:func:`simulated_note`, :func:`simulated_of`). Contract: docs/design.md, "Ladders", "The
verify step"; the table's columns: docs/import.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

#: the trace ``meta`` key that says a trace's verdicts are simulated
SIMULATED_KEY = "simulated_verifier"
#: the most tokens a verdict call may write (it is asked for one word: ``Yes`` or ``No``); a
#: log's verdict that wrote more is replayed at this cap
VERDICT_MAX_TOKENS = 8
#: the version of the simulation (:func:`simulated_verdict`, :func:`simulated_usage`)
SIMULATION = "ccpo-simulated-verifier/1"


def flip_draw(question_id: str, model: str) -> float:
    """A number in [0, 1) fixed by (question id, model): the seeded hash a simulated verdict
    flips by (the same for every accuracy, so the flips at 0.9 are among those at 0.8)."""
    digest = hashlib.sha256(f"{SIMULATION}\x00{question_id}\x00{model}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def simulated_verdict(question_id: str, model: str, correct: bool, accuracy: float) -> str:
    """The simulated verdict on ``model``'s reply to question ``question_id``: ``yes`` iff the
    reply is labelled correct, flipped when :func:`flip_draw` ≥ ``accuracy`` (probability
    1 − accuracy, independently of the label)."""
    right = correct if flip_draw(question_id, model) < accuracy else not correct
    return "yes" if right else "no"


def simulated_usage(input_tokens: int, output_tokens: int) -> tuple[int, int]:
    """(input, output) tokens of a simulated verdict call on a reply written with
    ``input_tokens`` of prompt and ``output_tokens`` of reply: both read, one token written
    (the verdict prompt's own few dozen tokens are not counted)."""
    return input_tokens + output_tokens, 1


def simulated_record(verifier: str, accuracy: float) -> dict[str, Any]:
    """``meta.simulated_verifier`` of traces whose verdicts are simulated."""
    return {
        "model": verifier,
        "accuracy": accuracy,
        "how": f"{SIMULATION}: the reply's label flipped with probability 1 − accuracy by a "
        "hash of (question id, model); usage: the prompt's and the reply's tokens in, 1 out",
    }


def simulated_note(record: dict[str, Any] | None) -> str:
    """How reports and guarantees name simulated verdicts ('' when they are not)."""
    if not record:
        return ""
    acc = record.get("accuracy")
    return (
        f"verify steps' verdicts are SIMULATED ({record.get('model', '?')} as a verifier "
        f"right with probability {acc:g}: the labels flipped at random), not a verifier's: "
        "the figures and the guarantee hold for such a verifier, not for a live one"
    )


def simulated_of(traces: Iterable[Any]) -> dict[str, Any] | None:
    """The ``meta.simulated_verifier`` record of a trace set: the first trace's that has one
    (None when no trace does)."""
    for tr in traces:
        rec = (getattr(tr, "meta", None) or {}).get(SIMULATED_KEY)
        if rec:
            return dict(rec)
    return None
