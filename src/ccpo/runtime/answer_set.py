"""What the deployed agent returns for one question: :class:`AnswerSet` (format ``ccpo.answer/v1``).

The same JSON object is returned by ``ConformalAgent.answer``, ``ccpo ask --json`` and
``POST /v1/answer``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ANSWER_FORMAT = "ccpo.answer/v1"


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
    answers: list[str] = Field(
        description="distinct answers (task normaliser; first spelling kept), in round order"
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
