"""The round plan of an imported table (:class:`Cascade`, :func:`plan_cascade`): the models
ordered by list price per token (input + output), ties broken by mean cost per question on
the table, then by name, cheapest first; as **one-model steps** (``steps="one"``: round t
calls the t-th cheapest model alone, so the ladder can stop after any one call, its cheapest
model's included) or paired into rounds (``steps="pair"``: each base with the next stronger
model as its guide, or one named guide for every round); and its ``agree`` ladder
(:meth:`Cascade.ladder`), with a verify step (:func:`with_verifier`: a verifier's Yes/No on
the reply) after the one-model steps ``--verifier`` / ``--verify-after`` name. Ordering by
price rather than by cost on the file keeps a small model that writes long answers below a
larger one of the same or a higher price.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ccpo.errors import CCPOError
from ccpo.traces.answers import family_of
from ccpo.traces.ladder import Ladder, LadderRound, Step, default_prompt, verify_round


@dataclass(frozen=True)
class Cascade:
    """The round plan: ``bases[t]`` and ``guides[t]`` are the models of round t + 1."""

    bases: tuple[str, ...]
    guides: tuple[str, ...]
    cost_per_question: dict[str, float]  # USD, mean over the table's questions
    #: USD per million tokens, input + output list prices (empty: order by cost alone)
    unit_price: dict[str, float] = field(default_factory=dict)
    #: the verifier of the verify steps (None: none) and the models whose step it follows
    verifier: str | None = None
    verify_after: tuple[str, ...] = ()

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
        """The ``agree`` ladder of the cascade: every model answers the question itself (a
        verify step after the one-model steps of :attr:`verify_after`)."""
        fam = family_of(task, family)
        prompt = default_prompt(task, "base", "agree", fam)  # cot; a conversation: chat
        rounds: list[LadderRound] = []
        for b, g in zip(self.bases, self.guides, strict=True):
            rounds.append(LadderRound(Step(b, prompt), Step(g, prompt), "agree"))
            if self.verifier is not None and b in self.verify_after:
                rounds.append(verify_round(Step(b, prompt), self.verifier))
        return Ladder(task, fam, tuple(rounds))


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


def with_verifier(plan: Cascade, verifier: str | None, after: list[str] | None = None) -> Cascade:
    """``plan`` with a verify step by ``verifier`` after the one-model step of each model of
    ``after`` (default: every step but the last, whose reply is returned anyway). Refused:
    paired rounds, a model that is not a step, the last step."""
    if verifier is None:
        if after:
            raise CCPOError("--verify-after needs --verifier MODEL (the model that verifies)")
        return plan
    if not plan.one_model:
        raise CCPOError(
            "--verifier adds a verify step after one-model steps; it cannot follow paired "
            "rounds (drop --steps pair / --guide)"
        )
    steps = list(plan.bases)
    if len(steps) < 2:
        raise CCPOError("--verifier: a ladder of one step has no step to verify before another")
    chosen = list(dict.fromkeys(after)) if after else steps[:-1]
    unknown = [m for m in chosen if m not in steps]
    if unknown:
        raise CCPOError(
            f"--verify-after {', '.join(unknown)}: not a step of the ladder ({', '.join(steps)})"
        )
    if steps[-1] in chosen:
        raise CCPOError(
            f"--verify-after {steps[-1]}: the last step's reply is returned anyway; verify "
            "the steps before it"
        )
    return replace(plan, verifier=verifier, verify_after=tuple(chosen))
