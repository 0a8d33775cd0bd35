"""Ladders of one model per step, as trace sets: a shorter ladder of some of their models.

:func:`sub_ladder` keeps the steps of the named models (in the ladder's order) and renumbers
them, so that a two-model ladder (a team's cheap and strong model) can be studied on logs of
more models without a new import: the kept steps' replies, usage and labels are the recorded
ones, and their pure signals are recomputed against the step now before them
(:func:`ccpo.traces.signals.compared`). A verify step stays with the step it verifies, unless
that step is now the last. Contract: docs/design.md, "Ladders".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ccpo.errors import CCPOError
from ccpo.traces.importer.build import with_text_signals
from ccpo.traces.schema import Trace
from ccpo.traces.signals import is_solo, is_verify


def sub_ladder(traces: Iterable[Trace], models: Sequence[str]) -> list[Trace]:
    """The traces restricted to the steps of ``models`` (each a step of every trace's ladder
    of one model per step), renumbered 1..k in the ladder's order. A :class:`CCPOError` says
    what is wrong: a paired ladder, or a model that is not one of its steps."""
    want = list(dict.fromkeys(models))
    if len(want) < 1:
        raise CCPOError("a sub-ladder needs at least one model")
    out = []
    for tr in traces:
        if not all(is_solo(r) or is_verify(r) for r in tr.rounds):
            raise CCPOError(
                f"trace '{tr.id}': a sub-ladder needs one model per step (import with "
                "`--steps one`, the default)"
            )
        have = [r.base.model for r in tr.rounds if is_solo(r)]
        missing = [m for m in want if m not in have]
        if missing:
            raise CCPOError(
                f"trace '{tr.id}': {', '.join(missing)} is not a step of its ladder "
                f"({', '.join(have)})"
            )
        kept = [r for r in tr.rounds if r.base.model in want]
        last = max(i for i, r in enumerate(kept) if is_solo(r))
        kept = [r for i, r in enumerate(kept) if not (is_verify(r) and i > last)]
        rounds = [r.model_copy(update={"round": t}) for t, r in enumerate(kept, start=1)]
        short = tr.model_copy(update={"rounds": rounds})
        out.append(with_text_signals(short, tuple(tr.signals or ())))
    return out
