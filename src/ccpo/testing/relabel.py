"""A bundled trace set turned label-free: ``correct`` by agreement with its strongest model.

What ``ccpo traces import --reference MODEL`` does to a table without labels, done here on
traces that have gold (for tests and benchmarks: the gold is dropped from what ``correct``
means, so a label-free run can be measured on public data). Per question the reference answer
is the strongest model's (:func:`ccpo.traces.episodes.strongest_model`: the ladder's most
expensive model; its last call that is not a reuse); a step is correct iff its answer equals
the reference answer under the task family's normaliser (an empty answer agrees with nothing);
``meta.labels`` becomes ``"reference:<model>"`` (:mod:`ccpo.traces.labels`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ccpo.traces.answers import normalizer_for
from ccpo.traces.episodes import strongest_model
from ccpo.traces.labels import reference_labels
from ccpo.traces.prices import PriceTable
from ccpo.traces.schema import Trace


def relabel_against_strongest(
    traces: Sequence[Trace], prices: PriceTable
) -> tuple[list[Trace], str]:
    """(the traces labelled by agreement with the strongest model, that model's name)."""
    model = strongest_model(traces, prices)
    if not model:
        raise ValueError("the traces do not all call one strongest model")
    out = []
    for tr in traces:
        norm = normalizer_for(tr.task, tr.family)
        steps = [s for r in tr.rounds for s in (r.base, r.guide)]
        ref = norm([s for s in steps if s.model == model and not s.reused][-1].answer)
        rounds = [
            r.model_copy(
                update={
                    role: getattr(r, role).model_copy(
                        update={"correct": ref != "" and norm(getattr(r, role).answer) == ref}
                    )
                    for role in ("base", "guide")
                }
            )
            for r in tr.rounds
        ]
        meta = {**tr.meta, "labels": reference_labels(model)}
        out.append(tr.model_copy(update={"rounds": rounds, "meta": meta}))
    return out, model
