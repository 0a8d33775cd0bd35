"""The per-question protocols that produce ``ccpo.trace/v1`` records.

- :func:`run_round`: the one definition of a round of any ladder (:mod:`ccpo.traces.ladder`;
  the paper's protocol, §3, is the one-pair ``judge`` ladder). Collection
  (:func:`run_base_guide`, all T rounds), the deployed agent (:mod:`ccpo.runtime.agent`) and
  so a replay endpoint see the same models, prompts, temperatures and sample indices, hence the
  same requests and cache keys. A step the ladder repeats is copied, not asked (paid once).
  In collection LLM-as-policy models may pick an action too; that never changes the run.
- :func:`labels_for`, :func:`reference_answer`: labels from a reference model (collection
  only). The reference answers alone after the rounds, or its answer is reused; every step is
  scored against it; an empty reference answer leaves the question out (:class:`NoReferenceAnswer`).
- :func:`run_exit`: the LLM-EXIT protocol (one model answers and decides [EXIT] / [CONTINUE];
  its own trace files, same schema). :class:`Runner` (:func:`make_runner`) holds a run's client,
  endpoints, ladder and settings; every request names its step in ``X-CCPO-*`` headers.

Contract: docs/design.md, sections "Ladders" (how a round runs), "Labels from a reference"
(derivation: docs/theory.md, "Label-free agreement") and "Trace schema `ccpo.trace/v1`".
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import math
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from ccpo import __version__
from ccpo.errors import CCPOError
from ccpo.llm.client import Endpoint, LLMClient
from ccpo.llm.config import CollectConfig
from ccpo.llm.prompts import PROMPT_VERSION, PastRound, policy_messages
from ccpo.llm.roles import (
    LOGPROB_DEF,
    UNCERTAINTY_DEF,
    BaseAgent,
    BaseOutput,
    Calls,
    ChatAgent,
    CoTAgent,
    Guide,
    GuideOutput,
    ReActAgent,
    exit_decision,
    policy_decision,
)
from ccpo.llm.signals import SignalStats, round_signals, verify_reply
from ccpo.llm.tasks.loaders import Question
from ccpo.llm.tasks.scoring import score
from ccpo.llm.tasks.search import BM25Search, SearchBackend, WikipediaSearch, load_corpus
from ccpo.traces.answers import exact_match, normalizer_for
from ccpo.traces.conversation import Conversation
from ccpo.traces.labels import reference_labels
from ccpo.traces.ladder import (
    CHAT,
    KNOWN_PROMPTS,
    Ladder,
    LadderRound,
    Step,
    agree_signals,
    default_prompt,
    transfer_signal,
)
from ccpo.traces.schema import SCHEMA_VERSION, Trace

ROLES = ("base", "guide")


@dataclass
class Runner:
    """Everything shared by the questions of one collection run (or one deployment): the
    ladder, the endpoint of each of its models and the base agents."""

    cfg: CollectConfig
    client: LLMClient
    ladder: Ladder
    endpoints: dict[str, Endpoint]
    policies: list[Endpoint]
    shared_search: SearchBackend | None = None
    source: str = ""
    agents: dict[tuple[str, str | None], BaseAgent] = field(default_factory=dict)
    signal_stats: SignalStats = field(default_factory=SignalStats)
    #: a chat step's cap on its reply's tokens (None: none, the model's own limit)
    chat_max_tokens: int | None = None

    @property
    def base(self) -> Endpoint:
        """Round 1's base endpoint (LLM-EXIT's one model)."""
        return self.endpoints[self.ladder.round(1).base.model]

    @property
    def guide(self) -> Endpoint:
        return self.endpoints[self.ladder.round(1).guide.model]

    @property
    def agent(self) -> CoTAgent | ReActAgent:
        """Round 1's base agent."""
        return self.agent_for(self.ladder.round(1).base.prompt)

    def agent_for(self, prompt: str, system: str | None = None) -> BaseAgent:
        """The agent that writes ``prompt``: in the ``chat`` family the conversation itself
        (with the step's own ``system`` prompt in front); else ``react``: ReAct, anything
        else: chain of thought."""
        kind = CHAT if self.ladder.family == CHAT else "react" if prompt == "react" else "cot"
        key = (kind, system if kind == CHAT else None)
        if key not in self.agents:
            self.agents[key] = (
                ChatAgent(self.cfg.task, self.cfg.max_tokens, CHAT, system, self.chat_max_tokens)
                if kind == CHAT
                else ReActAgent(max_steps=self.cfg.max_steps)
                if kind == "react"
                else CoTAgent(self.cfg.task, self.cfg.max_tokens, self.ladder.family)
            )
        return self.agents[key]

    def uses_react(self) -> bool:
        return any(
            r.base.prompt == "react" or r.guide.prompt == "react" for r in self.ladder.rounds
        )

    def backend_for(self, q: Question) -> SearchBackend | None:
        if not self.uses_react():
            return None
        if self.shared_search is not None:
            return self.shared_search
        if q.context:
            return BM25Search(q.context)
        raise CCPOError(
            f"question {q.id} has no 'context' paragraphs for the offline search tool; pass "
            "--search bm25 --corpus FILE or --search wikipedia"
        )

    def sample(self, temperature: float, round_: int) -> int:
        return self.cfg.sample_offset + (round_ if temperature > 0 else 0)

    def trace(
        self,
        q: Question,
        rounds: list[dict[str, Any]],
        kind: str,
        reference: dict[str, Any] | None = None,
    ) -> Trace:
        """The ``ccpo.trace/v1`` record of ``q`` with its ``rounds`` (validated); with the
        ``reference`` call that labelled them (:func:`labels_for`), ``meta.labels`` says so."""
        meta = self.meta(q, kind)
        if reference is not None:
            meta["labels"] = reference_labels(reference["model"])
            meta["reference"] = reference
        return Trace(
            schema=SCHEMA_VERSION,
            id=q.id,
            task=q.task,
            family=self.cfg.family,
            question=q.question,
            messages=q.conversation.as_list() if q.conversation else None,
            gold=q.gold,
            rounds=rounds,
            meta=meta,
            signals=list(self.ladder.signals) or None,
            embedding_model=self.ladder.embedding_model,
        )

    def meta(self, q: Question, kind: str) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "kind": kind,
            "source": self.source,
            "collected_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "collector": f"ccpo {__version__}",
            "prompts": PROMPT_VERSION,
            "base_model": self.base.model,
            "guide_model": self.guide.model if kind == "base-guide" else self.base.model,
            "policy_llm": [p.model for p in self.policies],
            "rounds_planned": cfg.rounds,
            "temperatures": [cfg.temperature(t) for t in range(1, cfg.rounds + 1)],
            "agent": _agent_name(self.agent),
            "definitions": {
                "guide.uncertainty": UNCERTAINTY_DEF,
                "base.logprob_mean/min": LOGPROB_DEF,
            },
            **({"question_meta": q.meta} if q.meta else {}),
        }


def _agent_name(agent: BaseAgent) -> str:
    return (
        "react"
        if isinstance(agent, ReActAgent)
        else CHAT
        if isinstance(agent, ChatAgent)
        else "cot"
    )


def make_runner(
    cfg: CollectConfig, client: LLMClient, kind: str, source: str, ladder: Ladder | None = None
) -> Runner:
    """The :class:`Runner` of ``kind`` (``base-guide`` or ``llm-exit``) for ``cfg``: the ladder
    (``ladder``, else the config's: its ``ladder:`` rounds or the one base/guide pair), the
    endpoint of every model of it, and the shared search backend. Used by collection and by
    the deployed agent, so both run rounds the same way."""
    if ladder is None:
        ladder = cfg.make_ladder() if kind == "base-guide" else cfg.exit_ladder()
    if ladder.family == CHAT and (
        kind != "base-guide" or not ladder.verdicts() <= {"agree", "verify"}
    ):
        raise CCPOError(
            "the chat family runs agree rounds only, and verify steps (each model answers the "
            "conversation; the judge template and LLM-EXIT read a short answer): set verdict: "
            "agree in every round of the ladder"
        )
    if ladder.family != CHAT and any(r.step(ro).system for r in ladder.rounds for ro in ROLES):
        raise CCPOError("a step's system: prompt is for the chat family only (its own prompts)")
    called = [*ladder.models(), *([cfg.reference] if cfg.reference else [])]
    called += [ladder.embedding_model] if ladder.embedding_model else []
    endpoints = {m: cfg.endpoint_for(m) for m in called}
    policies = [p.endpoint() for p in cfg.policy_llm] if kind == "base-guide" else []
    shared = None
    runner = Runner(cfg, client, ladder, endpoints, policies, None, source)
    if runner.uses_react():
        mode = cfg.search
        if mode == "bm25" or (mode == "auto" and cfg.corpus):
            if not cfg.corpus:
                raise CCPOError("--search bm25 needs --corpus FILE (JSONL of {title, text})")
            shared = BM25Search(load_corpus(cfg.corpus))
        elif mode == "wikipedia":
            shared = WikipediaSearch()
    runner.shared_search = shared
    return runner


def base_record(
    out: BaseOutput, model: str, q: Question | None = None, family: str | None = None
) -> dict[str, Any]:
    """The base step of a ``ccpo.trace/v1`` round; ``correct`` (scored against ``q.gold``) only
    when the question ``q`` is given (live there is no gold)."""
    mean, mn = out.logprob_stats()
    step: dict[str, Any] = {
        "model": model,
        "answer": out.answer,
        "reasoning": out.reasoning,
        "usage": out.calls.usage(),
        "logprob_mean": mean,
        "logprob_min": mn,
    }
    if q is not None:
        step["correct"] = score(q.task, out.answer, q.gold, family)
    return step


def guide_record(
    g: GuideOutput, model: str, q: Question | None = None, family: str | None = None
) -> dict[str, Any]:
    """The guide step of a ``ccpo.trace/v1`` round (``correct`` as in :func:`base_record`)."""
    step: dict[str, Any] = {
        "model": model,
        "verdict": g.verdict,
        "answer": g.answer,
        "uncertainty": g.uncertainty,
        "usage": g.calls.usage(),
        "raw": g.raw,
    }
    if q is not None:
        step["correct"] = score(q.task, g.answer, q.gold, family)
    return step


def live_round(record: dict[str, Any]) -> SimpleNamespace:
    """A round record without ``correct`` (a live round: there is no gold) with the attributes
    of the schema's :class:`~ccpo.traces.schema.Round` (``round``, ``base`` and ``guide`` with
    their ``usage``), which the featurizer and the price table read: namespaces, not validated
    (the values come from the client; ``correct`` is absent: reading it fails). pydantic's
    ``model_construct`` of the five models costs several times as much, on the path after an
    LLM call's wait (figures: docs/decisions.md, "The serving stack")."""
    b, g = record["base"], record["guide"]
    sig = record.get("signals")
    if sig is not None and sig.get("verdict") is not None:
        v = sig["verdict"]
        sig = {**sig, "verdict": SimpleNamespace(**{**v, "usage": SimpleNamespace(**v["usage"])})}
    return SimpleNamespace(
        round=record["round"],
        base=SimpleNamespace(**{**b, "usage": SimpleNamespace(**b["usage"])}),
        guide=SimpleNamespace(**{**g, "usage": SimpleNamespace(**g["usage"])}),
        policy_llm=record.get("policy_llm"),
        verdict_mode=record.get("verdict_mode"),
        signals=None if sig is None else SimpleNamespace(**sig),
    )


@dataclass
class RoundOutput:
    """What one round of a ladder produced (before any scoring against gold)."""

    round: int
    base: BaseOutput
    guide: GuideOutput
    spec: LadderRound | None = None  # None: a one-pair judge round (tests build these)
    reused: tuple[str, ...] = ()  # the roles that repeat an earlier call (zero usage)
    signals: dict[str, Any] | None = None  # the ladder's signals of this round, if it has any
    skipped: tuple[str, ...] = ()  # the roles the policy did not call (blank, zero usage)

    def past(self) -> PastRound:
        """What later rounds' base prompts see of this round."""
        return PastRound(self.base.reasoning, self.base.answer, self.guide.raw)

    def record(
        self,
        base_model: str | None = None,
        guide_model: str | None = None,
        q: Question | None = None,
        family: str | None = None,
    ) -> dict[str, Any]:
        """The round as a ``ccpo.trace/v1`` round record, the one place a round becomes one:
        collection stores it (scored against ``q.gold``), the deployed agent featurizes it
        (:func:`live_round`, no ``q``: no ``correct``). The models are the ladder's."""
        spec = self.spec
        bm = spec.base.model if spec else base_model
        gm = spec.guide.model if spec else guide_model
        assert bm is not None and gm is not None
        rec: dict[str, Any] = {
            "round": self.round,
            "base": base_record(self.base, bm, q, family),
            "guide": guide_record(self.guide, gm, q, family),
            "policy_llm": None,
        }
        if self.signals is not None:
            rec["signals"] = self.signals
        if spec is not None:
            rec["verdict_mode"] = spec.verdict
            for role in ("base", "guide"):
                rec[role]["prompt"] = spec.step(role).prompt
                if spec.step(role).system is not None:
                    rec[role]["system"] = spec.step(role).system
                if role in self.reused:
                    rec[role]["reused"] = True
        return rec

    def models(self) -> list[str]:
        """The models this round paid for (a reused step is not asked again)."""
        assert self.spec is not None
        free = (*self.reused, *self.skipped)
        paid = [self.spec.step(ro).model for ro in ("base", "guide") if ro not in free]
        if (self.signals or {}).get("verdict") and self.spec.guide.model not in paid:
            paid.append(self.spec.guide.model)  # the free-text verdict call
        return paid


def _step(t: int, role: str) -> dict[str, str]:
    return {"round": str(t), "role": role}


async def _ask_alone(
    r: Runner, question: str | Conversation, spec: Step, step: dict[str, str] | None, backend: Any
) -> BaseOutput:
    """``spec``'s model answers the question itself (no context, T = 0; a prompt without a
    template is its own draw): an ``agree`` step, or the reference of :func:`labels_for`."""
    draw = 0 if spec.prompt in KNOWN_PROMPTS else zlib.crc32(spec.prompt.encode()) % 10_000 + 1
    return await r.agent_for(spec.prompt, spec.system).run(
        r.client,
        r.endpoints[spec.model],
        question,
        [],
        0.0,
        r.cfg.sample_offset + draw,
        backend,
        step,
    )


#: steps of the question being answered already sent ahead (hedged): (round, role) → (the
#: call, what to do when the round takes it); a round takes such a step instead of asking
prefetched: contextvars.ContextVar[
    dict[tuple[int, str], tuple[asyncio.Future[Any], Any]] | None
] = contextvars.ContextVar("prefetched", default=None)


async def _answer_alone(
    r: Runner, question: str | Conversation, t: int, role: str, backend: Any
) -> tuple[BaseOutput, float | None]:
    """An ``agree`` step (:func:`_ask_alone`) and its signal: a base's ``log p``, a guide's
    ``1 − p`` (:func:`agree_signals`), or what a replay endpoint recorded; a step sent ahead
    (:data:`prefetched`) is taken, not asked again."""
    ahead = (prefetched.get() or {}).pop((t, role), None)
    if ahead is not None:
        call, taken = ahead
        taken()
        return await call
    return await _step_alone(r, question, t, role, backend)


async def ask_step(
    r: Runner, question: str | Conversation, t: int, role: str, backend: Any
) -> tuple[BaseOutput, float | None]:
    """Step ``role`` of ``agree`` round ``t`` asked on its own, with the request (and cache
    key) the whole round sends: what hedging sends ahead (:data:`prefetched`)."""
    if r.ladder.round(t).verdict != "agree":
        raise CCPOError(f"round {t} is a judge round: its {role} cannot be asked alone")
    return await _step_alone(r, question, t, role, backend)


async def _step_alone(
    r: Runner, question: str | Conversation, t: int, role: str, backend: Any
) -> tuple[BaseOutput, float | None]:
    out = await _ask_alone(r, question, r.ladder.round(t).step(role), _step(t, role), backend)
    if out.recorded is not None:
        key = "logprob_mean" if role == "base" else "uncertainty"
        return out, out.recorded.get(key)
    lps = out.calls.logprobs
    base_lp, u = agree_signals(math.exp(sum(lps) / len(lps)) if lps else None)
    out.signals = (base_lp, base_lp)
    return out, base_lp if role == "base" else u


def _answer_of(ro: RoundOutput, role: str) -> tuple[BaseOutput, float | None]:
    """A step of an earlier round as (answer, signal)."""
    if role == "base":
        return ro.base, ro.base.logprob_stats()[0]
    g = ro.guide
    return BaseOutput(g.answer, g.raw, g.calls), g.uncertainty


class NoReferenceAnswer(Exception):
    """The reference model's answer to a question is empty after normalisation: the question
    has nothing to agree with and no label (collection leaves it out and counts it)."""


async def reference_answer(
    r: Runner,
    question: str | Conversation,
    outs: list[RoundOutput],
    backend: SearchBackend | None,
) -> tuple[BaseOutput, bool]:
    """The reference model's answer to ``question`` and whether it was reused: the ``agree``
    step ``(reference, cot)`` of the rounds run, if the ladder made that call, else a call of
    its own (:func:`_ask_alone`; no round/role headers: a replay endpoint finds it by model)."""
    assert r.cfg.reference is not None
    spec = Step(r.cfg.reference, default_prompt(r.ladder.task, "base", "agree", r.ladder.family))
    for t, ro in enumerate(outs, start=1):
        lr = r.ladder.round(t)
        for role in ("base", "guide"):
            if lr.verdict == "agree" and lr.step(role) == spec:
                return _answer_of(ro, role)[0], True
    return await _ask_alone(r, question, spec, None, backend), False


async def labels_for(
    r: Runner,
    q: Question,
    outs: list[RoundOutput],
    backend: SearchBackend | None,
) -> tuple[Question, dict[str, Any] | None]:
    """The question as its rounds are scored: ``q`` itself (its gold), or with a reference
    model (``cfg.reference``) ``q`` with the reference's answer as its only gold, and the
    reference call for ``meta.reference``. Raises :class:`NoReferenceAnswer` when that answer
    is empty after normalisation."""
    if not r.cfg.reference:
        return q, None
    out, reused = await reference_answer(r, q.prompt, outs, backend)
    if not normalizer_for(r.ladder.task, r.ladder.family)(out.answer):
        raise NoReferenceAnswer(f"{r.cfg.reference} gave no answer to {q.id}")
    call = {
        "model": r.cfg.reference,
        "answer": out.answer,
        "usage": Calls().usage() if reused else out.calls.usage(),
        "reused": reused,
    }
    return dataclasses.replace(q, gold=[out.answer]), call


async def with_signals(r: Runner, question: str | Conversation, ro: RoundOutput) -> RoundOutput:
    """``ro`` with its signals recorded when the ladder names some (docs/design.md,
    "Signals"); a conversation's signals read its last user turn."""
    if r.ladder.signals:
        question = question if isinstance(question, str) else question.text
        ro.signals = await round_signals(
            r.client, r.ladder, r.endpoints, question, ro.round, ro.base, ro.guide,
            r.signal_stats, r.cfg.embedding_timeout,
        )  # fmt: skip
    return ro


async def run_round(
    r: Runner,
    question: str | Conversation,
    t: int,
    earlier: list[RoundOutput],
    backend: SearchBackend | None,
    start: int = 1,
    roles: tuple[str, ...] = ROLES,
) -> RoundOutput:
    """Round ``t`` (1-based) of the runner's ladder, after the ``earlier`` rounds of the same
    question (docs/design.md, "Ladders": how a round runs). ``question`` is the question, or
    in the ``chat`` family the conversation (its steps' prompt: docs/design.md,
    "Conversations"). ``start``: the first round run (``earlier`` holds rounds start..t − 1;
    a routed question skipped the rounds before it, so a step repeating one of their calls is
    asked here). ``roles``: the steps the policy calls in this round
    (:meth:`ccpo.policies.base.Policy.round_roles`); in an ``agree`` round the others are
    left blank, neither called nor paid (``always-<reference>`` calls its one step so). With
    its signals when both steps ran."""
    lr = r.ladder.round(t)
    skipped = tuple(role for role in ROLES if role not in roles)
    if skipped and lr.verdict != "agree":
        raise CCPOError(f"round {t} is a {lr.verdict} round: its {roles[0]} cannot be called alone")
    if lr.verifies:
        return await _verify_round(r, question, t, earlier, backend, start)
    if lr.verdict == "judge":
        history = [e.past() for e in earlier]
        temp = r.cfg.temperature(t)
        out = await r.agent_for(lr.base.prompt).run(
            r.client,
            r.endpoints[lr.base.model],
            question,
            history,
            temp,
            r.sample(temp, t),
            backend,
            _step(t, "base"),
        )
        g = await Guide().judge(
            r.client,
            r.endpoints[lr.guide.model],
            question,
            out.reasoning,
            out.answer,
            step=_step(t, "guide"),
        )
        return await with_signals(r, question, RoundOutput(t, out, g, lr))
    # agree: each step answers alone, or copies the earlier call it repeats (paid once); the
    # calls of the round depend on nothing of each other, so they are sent at once
    steps: dict[str, tuple[BaseOutput, float | None]] = {
        role: (BaseOutput("", "", Calls()), None) for role in skipped
    }
    reused: list[str] = []
    fresh = [role for role in roles if r.ladder.reused(t, role, start) is None]
    calls = [asyncio.ensure_future(_answer_alone(r, question, t, ro, backend)) for ro in fresh]
    try:
        got = await asyncio.gather(*calls)
    except BaseException:  # one failed (or we were cancelled): the other stops too, settled
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        raise
    steps.update(zip(fresh, got, strict=True))
    for role in roles:
        src = r.ladder.reused(t, role, start)
        if src is None:
            continue
        u, ro = src
        orig, value = _answer_of(earlier[u - start], ro) if u < t else steps[ro]
        sig = transfer_signal(value, ro, role)
        steps[role] = (BaseOutput(orig.answer, orig.reasoning, Calls(), (sig, sig)), sig)
        reused.append(role)
    (b, _), (ga, u_guide) = steps["base"], steps["guide"]
    same = exact_match(ga.answer, [b.answer], r.ladder.task, r.ladder.family)
    verdict = None if skipped else "yes" if same else "no"
    g = GuideOutput(verdict, ga.answer, ga.reasoning, u_guide, ga.calls)
    g.recorded = ga.recorded  # a replay endpoint's step (its recorded signals)
    ro = RoundOutput(t, b, g, lr, tuple(reused), skipped=skipped)
    return ro if skipped else await with_signals(r, question, ro)


async def _verify_round(
    r: Runner,
    question: str | Conversation,
    t: int,
    earlier: list[RoundOutput],
    backend: SearchBackend | None,
    start: int,
) -> RoundOutput:
    """A verify step (docs/design.md, "Ladders", "The verify step"): its base is the reply of
    the step before, copied (paid there; asked here when a routed question skipped that
    step), then the verifier says Yes/No on it (:func:`ccpo.llm.signals.verify_reply`)."""
    lr = r.ladder.round(t)
    src = r.ladder.reused(t, "base", start)
    reused: tuple[str, ...] = ()
    if src is None:
        b, _ = await _answer_alone(r, question, t, "base", backend)
    else:
        u, role = src
        orig, value = _answer_of(earlier[u - start], role)
        sig = transfer_signal(value, role, "base")
        b, reused = BaseOutput(orig.answer, orig.reasoning, Calls(), (sig, sig)), ("base",)
    g = await verify_reply(r.client, r.endpoints[lr.guide.model], question, b.answer, t)
    return await with_signals(r, question, RoundOutput(t, b, g, lr, reused))


async def run_base_guide(r: Runner, q: Question) -> Trace:
    """All T rounds of the ladder (→ policy LLMs) for one question."""
    backend = r.backend_for(q)
    outs: list[RoundOutput] = []
    chosen: list[dict[str, Any] | None] = []
    for t in range(1, r.ladder.T + 1):
        ro = await run_round(r, q.prompt, t, outs, backend)
        out, g = ro.base, ro.guide
        decisions = None
        if r.policies:
            decisions = {}
            for pe in r.policies:
                guide = ro.spec.guide.model if ro.spec else r.guide.model
                asked = policy_messages(
                    q.question, out.answer, g.verdict, g.answer, g.uncertainty, guide,
                    r.cfg.coverage,
                )  # fmt: skip
                d = await policy_decision(r.client, pe, asked)
                decisions[pe.model] = {"action": d.action, "usage": d.calls.usage(), "raw": d.raw}
        chosen.append(decisions)
        outs.append(ro)
    scored, reference = await labels_for(r, q, outs, backend)
    rounds = []
    for ro, decisions in zip(outs, chosen, strict=True):
        rnd = ro.record(q=scored, family=r.ladder.family)
        rnd["policy_llm"] = decisions
        rounds.append(rnd)
    return r.trace(scored, rounds, "base-guide", reference)


async def run_exit(r: Runner, q: Question) -> Trace:
    """LLM-EXIT: one model answers and decides [EXIT]/[CONTINUE] each round."""
    backend = r.backend_for(q)
    m = r.base.model
    history: list[PastRound] = []
    answers: list[str] = []
    said: list[tuple[BaseOutput, Any]] = []
    for t in range(1, r.cfg.rounds + 1):
        temp = r.cfg.temperature(t)
        out = await r.agent.run(
            r.client, r.base, q.question, history, temp, r.sample(temp, t), backend
        )
        answers.append(out.answer)
        d = await exit_decision(r.client, r.base, q.question, answers)
        said.append((out, d))
        history.append(PastRound(out.reasoning, out.answer, None))
        if r.cfg.stop_at_exit and d.action == "base":
            break
    scored, reference = await labels_for(r, q, [], backend)
    rounds: list[dict[str, Any]] = []
    for t, (out, d) in enumerate(said, start=1):
        base = base_record(out, m, scored)
        rounds.append(
            {
                "round": t,
                "base": base,
                "guide": {
                    "model": m,
                    "verdict": None,
                    "answer": out.answer,
                    "correct": base["correct"],
                    "uncertainty": None,
                    "usage": {"input_tokens": 0, "output_tokens": 0},
                },
                "policy_llm": {m: {"action": d.action, "usage": d.calls.usage(), "raw": d.raw}},
            }
        )
    return r.trace(scored, rounds, "llm-exit", reference)
