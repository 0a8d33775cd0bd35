"""What the deployed agent returns for one question: :class:`AnswerSet` (format ``ccpo.answer/v1``).

The same JSON object is returned by ``ConformalAgent.answer``, ``ccpo ask --json`` and
``POST /v1/answer``.

- ``answers``: the set, de-duplicated with the task normaliser; an empty answer (empty after
  normalisation: a round that produced no answer) is never a member, it simply adds none.
- ``answer``: the **one answer** an app can use. For a single-answer policy it is the answer
  the policy returned; for a set policy the set's most likely member (:func:`one_answer`):
  the member whose action had the highest π(a|o_t) when it joined the set, ties going to the
  later (stronger) round, then to the guide's answer over the base's. ``null`` when the set
  is empty.
- ``guarantee``: what the policy promises (:class:`Guarantee`): one answer or a set, the
  target 1 − α, and what "correct" means (``against``: gold labels, or agreement with the
  reference model the traces were labelled by, :mod:`ccpo.traces.labels`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ccpo.policies.base import Policy
from ccpo.traces.labels import GOLD

ANSWER_FORMAT = "ccpo.answer/v1"


class Guarantee(BaseModel):
    """What the policy that answered guarantees, and against what."""

    model_config = ConfigDict(extra="forbid")

    answer: Literal["single", "set"] = Field(
        description="single: one answer per question; set: an answer set"
    )
    target: float = Field(description="1 − α: the promised probability")
    against: str = Field(
        description="what correct means: 'gold' (labelled answers), 'reference:<model>' "
        "(agreement with that model's answer), 'scored:{…}' (a score column and its rule) or "
        "'judged:{…}' (an LLM judge's verdict against a reference model's reply)"
    )
    statement: str = Field(description="the guarantee in words")


def guarantee_of(policy: Policy) -> Guarantee:
    """The guarantee of a trained policy: its answer kind, 1 − α, and ``against`` from its
    provenance (``"gold"`` when absent)."""
    return Guarantee(
        answer=policy.answer,
        target=round(1.0 - float(policy.alpha), 12),
        against=policy.provenance.get("against") or GOLD,
        statement=policy.guarantee_statement(),
    )


def one_answer(members: Iterable[tuple[str, float, int, str]]) -> str | None:
    """The most likely member of an answer set, from ``(key, π(a|o_t), t, a)`` for each time
    a member joined it (a = ``base`` or ``guide``): the highest π, ties to the later round,
    then to the guide; ``None`` when nothing joined. Returns the member's key."""
    best = max(members, key=lambda m: (m[1], m[2], m[3] == "guide"), default=None)
    return None if best is None else best[0]


class RoundLog(BaseModel):
    """One round that was run: what the models said, what π made of it, what it cost."""

    model_config = ConfigDict(extra="forbid")

    round: int = Field(description="round index t (1-based)")
    base_model: str = Field("", description="the round's base model (the ladder's)")
    guide_model: str = Field("", description="the round's guide model (the ladder's)")
    models: list[str] = Field(
        default_factory=list,
        description="the models called and paid for in this round (an answer the ladder "
        "repeats from an earlier round is reused, not asked again)",
    )
    base_answer: str = Field(description="the base model's answer in this round")
    guide_verdict: Literal["yes", "no"] | None = Field(
        description="the guide's verdict on the base answer (null: unreadable reply)"
    )
    guide_answer: str = Field(description="the guide's answer (the base's when it said yes)")
    uncertainty: float | None = Field(description="guide uncertainty 1 − p(verdict token)")
    pi: dict[str, float] = Field(description="π(a|o_t) over base, guide, next")
    actions: list[Literal["base", "guide", "next"]] = Field(
        description="the action set C(o_t) = {a : π(a|o_t) ≥ κ} (empty → {argmax π})"
    )
    fallback: bool = Field(description="C(o_t) was empty and fell back to {argmax π}")
    cost_usd: float = Field(description="base + guide cost of this round (usage × price)")


class AnswerSet(BaseModel):
    """The answer set of one question with its cost, per-round log and the α, κ in force."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["ccpo.answer/v1"] = ANSWER_FORMAT
    id: str = Field(description="request id (given by the caller, or generated)")
    question: str
    conversation: str | None = Field(
        None,
        description="SHA-256 of the conversation a chat policy answered (all its messages; "
        "docs/design.md, Conversations); null for a question",
    )
    answers: list[str] = Field(
        description="distinct answers (task normaliser; first spelling kept), in round order; "
        "never an empty answer"
    )
    answer: str | None = Field(
        None,
        description="the one answer: a single-answer policy's answer; for a set policy the "
        "set's most likely member (highest π(a|o_t) when it joined; ties to the later round, "
        "then the guide); null when the set is empty",
    )
    guarantee: Guarantee | None = Field(
        None, description="what the policy guarantees (null only in answers stored by old versions)"
    )
    rounds: int = Field(description="rounds run (models were called in exactly these rounds)")
    horizon: int = Field(description="T, the round budget of the policy")
    cost_usd: float = Field(description="Σ over rounds run of base + guide cost (usage × price)")
    cost_by_model: dict[str, float] = Field(description="cost_usd broken down by model")
    log: list[RoundLog]
    alpha: float = Field(description="target miscoverage α of the policy")
    kappa: float | None = Field(description="κ in force (null for a point policy: greedy π)")
    policy: str = Field(description="policy variant (ccpo, cpo-batch, ...)")
    latency_ms: float = Field(0.0, description="wall time of the whole request")
    ttft_ms: float | None = Field(
        None,
        description="time to first token: from the question's arrival to the first piece of "
        "the reply's content passed on as the upstream streamed it (a streamed request whose "
        "reply the policy chose before calling its step), else to the policy's choice of its "
        "reply, the first moment any of it can be sent (null in answers stored by old "
        "versions)",
    )
    finish_reason: str | None = Field(
        None,
        description="why the endpoint stopped writing the one answer's reply, as it said: "
        "stop, or length when it was cut at max_tokens (null: no answer, or not reported)",
    )
