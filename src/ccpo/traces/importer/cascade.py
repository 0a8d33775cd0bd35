"""The round plan of an imported table (:class:`Cascade`, :func:`plan_cascade`): the models
ordered by mean cost per question, cheapest first, paired into rounds (each base with the
next stronger model as its guide, or one named guide for every round), and its ``agree``
ladder (:meth:`Cascade.ladder`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ccpo.errors import CCPOError
from ccpo.traces.answers import family_of
from ccpo.traces.ladder import Ladder, LadderRound, Step, default_prompt


@dataclass(frozen=True)
class Cascade:
    """The round plan: ``bases[t]`` and ``guides[t]`` are the models of round t + 1."""

    bases: tuple[str, ...]
    guides: tuple[str, ...]
    cost_per_question: dict[str, float]  # USD, mean over the table's questions

    @property
    def rounds(self) -> int:
        return len(self.bases)

    def order(self) -> list[str]:
        """The models, cheapest per question first (ties by name)."""
        return sorted(self.cost_per_question, key=lambda m: (self.cost_per_question[m], m))

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


def plan_cascade(cost: dict[str, float], guide: str | None = None) -> Cascade:
    """Order the models by mean cost per question (``cost``, USD; cheapest first, ties by
    name) and pair them in rounds; a named guide must be a model of the table."""
    models = sorted(cost)
    order = sorted(models, key=lambda m: (cost[m], m))
    if guide is None:
        return Cascade(tuple(order[:-1]), tuple(order[1:]), cost)
    if guide not in models:
        raise CCPOError(f"--guide '{guide}' is not a model of the table ({', '.join(models)})")
    bases = tuple(m for m in order if m != guide)
    return Cascade(bases, (guide,) * len(bases), cost)
