"""Typed models of the trace schema ``ccpo.trace/v1``: :class:`Trace`, :class:`Round`,
:class:`BaseStep`, :class:`GuideStep`, :class:`PolicyLLMDecision`, :class:`Usage`
(``SCHEMA_VERSION``, ``ACTIONS``).

One JSON object per line; ``rounds`` holds every round that was run. Validation refuses what a
hostile or broken file could use to move results silently: numbers must be physically possible
(finite floats, log-probs ≤ 0, the guide's uncertainty in [0, ``MAX_UNCERTAINTY``], at most
``MAX_TOKENS`` per call) and types strict (a boolean is ``true``/``false``, a count a JSON
integer, a number a JSON number). ``logprob_*``, ``uncertainty`` and ``policy_llm`` may be null
or absent. The optional ladder fields (``verdict_mode``: ``judge``, ``agree`` or
``verify``, ``prompt``, ``reused``, ``system``, ``family``) are read by
:mod:`ccpo.traces.ladder`; files without them read as a ``judge`` ladder. A ``chat`` trace
carries its conversation in ``messages``. The optional signal fields (a trace's ``signals``
and ``embedding_model``, a round's ``signals``: :class:`RoundSignals`) are read by
:mod:`ccpo.traces.signals`.

Contract: docs/design.md, section "Trace schema `ccpo.trace/v1`".
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ccpo.errors import CCPOError
from ccpo.traces.conversation import (
    Conversation,
    ConversationError,
    as_conversation,
    conversation_of,
)
from ccpo.traces.signals import normalize_signals

SCHEMA_VERSION = "ccpo.trace/v1"

Action = Literal["base", "guide", "next"]
ACTIONS: tuple[str, str, str] = ("base", "guide", "next")


MAX_UNCERTAINTY = 32.0
MAX_TOKENS = 10**9


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False, allow_inf_nan=False)


class Usage(_Model):
    """Token usage of one call, as reported by the endpoint (or counted, for converted logs)."""

    input_tokens: int = Field(ge=0, le=MAX_TOKENS, strict=True)
    output_tokens: int = Field(ge=0, le=MAX_TOKENS, strict=True)


class _Step(_Model):
    """What base and guide steps share: the ladder fields."""

    prompt: str | None = Field(None, min_length=1)
    reused: bool = Field(False, strict=True)
    #: a chat step's own system prompt, sent in front of the conversation
    system: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _reused_is_free(self) -> _Step:
        u = getattr(self, "usage", None)
        if self.reused and u is not None and (u.input_tokens or u.output_tokens):
            raise ValueError("a reused step (the same call as an earlier one) has zero usage")
        return self


class BaseStep(_Step):
    """The base agent's attempt in one round."""

    model: str
    answer: str
    reasoning: str = ""
    correct: bool = Field(strict=True)
    usage: Usage
    logprob_mean: float | None = Field(None, le=0, strict=True)
    logprob_min: float | None = Field(None, le=0, strict=True)


class GuideStep(_Step):
    """The guide's reply in one round: a verdict on the base answer and its own answer."""

    model: str
    verdict: Literal["yes", "no"] | None = None
    answer: str
    correct: bool = Field(strict=True)
    uncertainty: float | None = Field(None, ge=0, le=MAX_UNCERTAINTY, strict=True)
    usage: Usage

    @field_validator("verdict", mode="before")
    @classmethod
    def _lower_verdict(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v


class SignalVerdict(_Model):
    """The free-text verdict of a round: its guide model says Yes/No on the base's reply."""

    model: str
    verdict: Literal["yes", "no"] | None = None
    uncertainty: float | None = Field(None, ge=0, le=1, strict=True)
    usage: Usage
    prompt: str | None = None  # the verdict prompt's version


class RoundSignals(_Model):
    """What a round recorded of its ladder's signals (:mod:`ccpo.traces.signals`)."""

    sim_words: float | None = Field(None, ge=0, le=1, strict=True)
    sim_chars: float | None = Field(None, ge=0, le=1, strict=True)
    base_refusal: bool | None = Field(None, strict=True)
    guide_refusal: bool | None = Field(None, strict=True)
    sim_embedding: float | None = Field(None, ge=-1, le=1, strict=True)
    embedding_error: str | None = None  # why the embedding is missing (lexical only then)
    verdict: SignalVerdict | None = None


class PolicyLLMDecision(_Model):
    """An LLM-as-policy decision for one round (LLM baselines), with the usage it cost."""

    action: Action
    usage: Usage


class Round(_Model):
    """One round of the base/guide protocol."""

    round: int = Field(ge=1, strict=True)
    base: BaseStep
    guide: GuideStep
    policy_llm: dict[str, PolicyLLMDecision] | None = None
    verdict_mode: Literal["judge", "agree", "verify"] | None = None
    signals: RoundSignals | None = None

    @model_validator(mode="after")
    def _verify_returns_its_reply(self) -> Round:
        b, g = self.base, self.guide
        if self.verdict_mode == "verify" and (
            not b.reused or g.answer != b.answer or g.correct != b.correct
        ):
            raise ValueError(
                "a verify round repeats the reply before it (base reused) and returns it: its "
                "guide's answer and correct are its base's"
            )
        return self

    @model_validator(mode="after")
    def _verdict_by_guide(self) -> Round:
        v = self.signals.verdict if self.signals is not None else None
        if v is not None and v.model != self.guide.model:
            raise ValueError(
                f"signals.verdict is made by the round's guide model ({self.guide.model}), "
                f"not {v.model}"
            )
        return self


class QuestionEmbedding(_Model):
    """The embedding of a trace's question (its conversation's text, for chat) by ``model``
    (``ccpo traces embed``): what a router reads before any call (ccpo.policies.routing)."""

    model: str = Field(min_length=1)
    vector: list[float] = Field(min_length=1)


class Trace(_Model):
    """One question with all rounds that were run. ``schema`` must equal ``ccpo.trace/v1``."""

    schema_: Literal["ccpo.trace/v1"] = Field(alias="schema")
    id: str = Field(min_length=1)
    task: str
    family: Literal["mcq", "short", "exact", "chat", "number"] | None = None
    question: str
    #: the conversation of a ``chat`` trace (its ``question`` is the last user turn); None: none
    messages: list[dict[str, Any]] | None = None
    gold: list[str] = Field(min_length=1)
    rounds: list[Round] = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)
    signals: list[str] | None = None  # the ladder's signals (ccpo.traces.signals)
    embedding_model: str | None = None  # the model of the ``embedding`` signal
    question_embedding: QuestionEmbedding | None = None  # for a router (traces embed)

    model_config = ConfigDict(extra="allow", populate_by_name=True, allow_inf_nan=False)

    @field_validator("rounds")
    @classmethod
    def _rounds_in_order(cls, rounds: list[Round]) -> list[Round]:
        for i, r in enumerate(rounds, start=1):
            if r.round != i:
                raise ValueError(
                    f"rounds must be numbered 1..T in order without gaps; "
                    f"position {i} holds round {r.round}"
                )
        return rounds

    @field_validator("rounds")
    @classmethod
    def _verify_after_its_step(cls, rounds: list[Round]) -> list[Round]:
        for i, r in enumerate(rounds):
            if r.verdict_mode != "verify":
                continue
            p = rounds[i - 1] if i else None
            if (
                p is None
                or p.verdict_mode != "agree"
                or (p.base.model, p.base.prompt) != (r.base.model, r.base.prompt)
                or (p.guide.model, p.guide.prompt) != (p.base.model, p.base.prompt)
            ):
                raise ValueError(
                    f"round {r.round} verifies {r.base.model}'s reply, but the round before it "
                    "is not that model's one-model step (a verify step follows the step it checks)"
                )
        return rounds

    @field_validator("messages")
    @classmethod
    def _text_messages(cls, v: list[dict[str, Any]] | None) -> list[dict[str, str]] | None:
        try:
            return None if v is None else conversation_of(v).as_list()
        except ConversationError as e:
            raise ValueError(str(e)) from None

    def conversation(self) -> Conversation:
        """The conversation this trace answers: its ``messages`` (checked when read), else its
        question as one user turn."""
        if self.messages is None:
            return as_conversation(self.question)
        return Conversation(tuple(dict(m) for m in self.messages))

    @field_validator("signals")
    @classmethod
    def _known_signals(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        try:
            return list(normalize_signals(v, "-"))
        except CCPOError as e:
            raise ValueError(str(e)) from None

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    @property
    def solvable(self) -> bool:
        """True iff some base or guide answer in some round is correct (Y* ∈ Y(q))."""
        return any(r.base.correct or r.guide.correct for r in self.rounds)

    def models(self) -> set[str]:
        """Every model name whose usage this trace records."""
        out: set[str] = set()
        for r in self.rounds:
            out.add(r.base.model)
            out.add(r.guide.model)
            out.update((r.policy_llm or {}).keys())
            if r.signals is not None and r.signals.verdict is not None:
                out.add(r.signals.verdict.model)
        return out

    def to_json_dict(self) -> dict[str, Any]:
        """The wire form: ``schema`` first, nulls kept, as docs/design.md shows it; the optional
        ladder fields only where they are set (so older files round-trip unchanged)."""
        d = self.model_dump(by_alias=True, mode="json")
        for k in ("family", "messages", "signals", "embedding_model", "question_embedding"):
            if d.get(k) is None:
                d.pop(k, None)
        for r in d["rounds"]:
            if r.get("verdict_mode") is None:
                r.pop("verdict_mode", None)
            if r.get("signals") is None:
                r.pop("signals", None)
            else:
                r["signals"] = {k: v for k, v in r["signals"].items() if v is not None}
            for step in (r["base"], r["guide"]):
                prompt, reused = step.pop("prompt", None), step.pop("reused", False)
                system = step.pop("system", None)
                if prompt is not None:  # the ladder fields last, after the v1 fields
                    step["prompt"] = prompt
                if system is not None:
                    step["system"] = system
                if reused:
                    step["reused"] = True
        return d
