"""What a trace set's ``correct`` fields are measured against: gold labels or a reference model.

Without gold labels, ``correct`` means "equals the reference model's answer on this question
under the task family's normaliser" (docs/design.md, "Labels from a reference"; derivation:
docs/theory.md, "Label-free agreement"): the reference's own answer is correct and every
question is solvable. Everything downstream is unchanged; what changes is the claim, which
traces, policies, reports and served answers must state.

Contract (trace files): a trace whose labels come from a reference model carries
``meta.labels = "reference:<model>"``; a trace without ``meta.labels`` (or with ``"gold"``) is
labelled by gold answers. A policy records the same string as ``against`` in its provenance.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ccpo.errors import CCPOError

GOLD = "gold"
REFERENCE_PREFIX = "reference:"


def reference_labels(model: str) -> str:
    """The ``meta.labels`` / ``against`` string of labels made by agreement with ``model``."""
    return f"{REFERENCE_PREFIX}{model}"


def reference_model(labels: str) -> str | None:
    """The reference model named by ``labels`` (``None`` for gold labels)."""
    return labels[len(REFERENCE_PREFIX) :] if labels.startswith(REFERENCE_PREFIX) else None


def trace_labels(trace: Any) -> str:
    """``"gold"`` or ``"reference:<model>"`` for one trace (read from ``meta.labels``)."""
    meta = getattr(trace, "meta", None) or {}
    labels = meta.get("labels", GOLD) if isinstance(meta, dict) else GOLD
    if not isinstance(labels, str) or not (labels == GOLD or reference_model(labels)):
        raise CCPOError(
            f'trace {getattr(trace, "id", "?")!r}: meta.labels must be "gold" or '
            f'"reference:<model>", got {labels!r}'
        )
    return labels


def labels_of(traces: Iterable[Any]) -> str:
    """The labels of a whole trace set; a set mixing gold and reference labels is refused."""
    return one_label({trace_labels(t) for t in traces})


def one_label(seen: set[str], where: str = "the trace set") -> str:
    """The one label source among ``seen`` (``"gold"`` when empty); several are refused."""
    if len(seen) > 1:
        raise CCPOError(
            f"{where} mixes labels {sorted(seen)}: a guarantee must be against one thing"
        )
    return next(iter(seen)) if seen else GOLD


def against_text(labels: str) -> str:
    """How a report or a served answer names what coverage is measured against.

    ``"accuracy"`` for gold labels, ``"agreement with gpt-4o"`` for reference labels.
    """
    model = reference_model(labels)
    return "accuracy" if model is None else f"agreement with {model}"
