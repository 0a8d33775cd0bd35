"""The round plan of an imported table (:class:`Cascade`, :func:`plan_cascade`): the models
ordered by list price per token (input + output), ties broken by mean cost per question on
the table, then by name, cheapest first; as **one-model steps** (``steps="one"``: round t
calls the t-th cheapest model alone, so the ladder can stop after any one call, its cheapest
model's included) or paired into rounds (``steps="pair"``: each base with the next stronger
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

    @property
    def one_model(self) -> bool:
        """Whether each round is one model's call (its guide repeats its base)."""
        return self.bases == self.guides

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


#: how an import lays out its rounds (``traces import --steps``)
STEPS = ("one", "pair")


def plan_cascade(
    cost: dict[str, float],
    guide: str | None = None,
    unit_price: dict[str, float] | None = None,
    steps: str = "pair",
) -> Cascade:
    """Order the models by list price per token (``unit_price``, input + output USD per
    million tokens), ties by mean cost per question (``cost``, USD), then by name, cheapest
    first; as one-model steps (``steps="one"``) or paired in rounds. A named guide must be a
    model of the table, and pairs rounds."""
    models = sorted(cost)
    unit = dict(unit_price or {})
    order = _ordered(cost, unit)
    if steps not in STEPS:
        raise CCPOError(f"--steps '{steps}': choose one (a model per step) or pair")
    if steps == "one":
        if guide is not None:
            raise CCPOError(
                "--guide pairs every model with one guide; it needs --steps pair "
                "(one-model steps have no guide)"
            )
        return Cascade(tuple(order), tuple(order), cost, unit)
    if guide is None:
        return Cascade(tuple(order[:-1]), tuple(order[1:]), cost, unit)
    if guide not in models:
        raise CCPOError(f"--guide '{guide}' is not a model of the table ({', '.join(models)})")
    bases = tuple(m for m in order if m != guide)
    return Cascade(bases, (guide,) * len(bases), cost, unit)
