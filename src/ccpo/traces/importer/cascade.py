"""The round plan of an imported table (:class:`Cascade`, :func:`plan_cascade`): the models
ordered by list price per token (input + output), ties broken by mean cost per question on
the table, then by name, cheapest first; paired into rounds (each base with the next stronger
model as its guide, or one named guide for every round); and its ``agree`` ladder
(:meth:`Cascade.ladder`). Ordering by price rather than by cost on the file keeps a small
model that writes long answers below a larger one of the same or a higher price.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ccpo.errors import CCPOError
from ccpo.traces.answers import family_of
from ccpo.traces.ladder import Ladder, LadderRound, Step, default_prompt


@dataclass(frozen=True)
class Cascade:
    """The round plan: ``bases[t]`` and ``guides[t]`` are the models of round t + 1."""

    bases: tuple[str, ...]
    guides: tuple[str, ...]
    cost_per_question: dict[str, float]  # USD, mean over the table's questions
    #: USD per million tokens, input + output list prices (empty: order by cost alone)
    unit_price: dict[str, float] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.bases)

    def order(self) -> list[str]:
        """The models, cheapest first: by price per token, then mean cost per question, then
        name."""
        return _ordered(self.cost_per_question, self.unit_price)

    def ladder(self, task: str, family: str | None = None) -> Ladder:
        """The ``agree`` ladder of the cascade: every model answers the question itself."""
        fam = family_of(task, family)
        prompt = default_prompt(task, "base", "agree", fam)  # cot; a conversation: chat
        return Ladder(
            task,
            fam,
            tuple(
                LadderRound(Step(b, prompt), Step(g, prompt), "agree")
                for b, g in zip(self.bases, self.guides, strict=True)
            ),
        )


def _ordered(cost: dict[str, float], unit_price: dict[str, float]) -> list[str]:
    return sorted(cost, key=lambda m: (unit_price.get(m, 0.0), cost[m], m))


def plan_cascade(
    cost: dict[str, float], guide: str | None = None, unit_price: dict[str, float] | None = None
) -> Cascade:
    """Order the models by list price per token (``unit_price``, input + output USD per
    million tokens), ties by mean cost per question (``cost``, USD), then by name, cheapest
    first; and pair them in rounds. A named guide must be a model of the table."""
    models = sorted(cost)
    unit = dict(unit_price or {})
    order = _ordered(cost, unit)
    if guide is None:
        return Cascade(tuple(order[:-1]), tuple(order[1:]), cost, unit)
    if guide not in models:
        raise CCPOError(f"--guide '{guide}' is not a model of the table ({', '.join(models)})")
    bases = tuple(m for m in order if m != guide)
    return Cascade(bases, (guide,) * len(bases), cost, unit)
