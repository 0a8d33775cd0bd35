"""The per-question protocols that produce ``ccpo.trace/v1`` records.

**Base/guide protocol** (paper §3), every round ``t = 1..T`` is run and stored:

1. the base agent answers (MMLU/JSONL: chain of thought; HotpotQA: ReAct with search tools);
   its context holds every earlier round's reasoning, answer and guide reply;
   temperature ``temperature_first`` (0) in round 1 and ``temperature_later`` (1.0) after;
2. the guide sees the question and the base's reasoning + answer and replies ``Yes`` or
   ``No [correct answer]`` (paper template); its uncertainty is ``1 − p(verdict token)``;
3. optionally, each LLM-as-policy model picks an action (``base`` / ``guide`` / ``next``);
   stored in ``policy_llm[model]`` with its usage and raw reply. It never changes the run.

Sample indices (cache keys): a call at temperature 0 uses ``sample_offset``; a call at
temperature > 0 in round ``t`` uses ``sample_offset + t``, so each round's draw is its own
sample and a re-run asks for exactly the same ones.

**LLM-EXIT protocol** (its own trace files, same schema). One model M answers each round with
the same base agent (its context holds its own earlier attempts, no reviewer) and then decides
``[EXIT]`` / ``[CONTINUE]`` with the paper's template. Mapping to the schema:

- ``base``  = M's answer of the round (usage, log-prob stats);
- ``guide`` = the same answer by M, ``verdict: null``, ``uncertainty: null``, zero usage (so
  nothing is counted twice);
- ``policy_llm[M]`` = the decision: ``action: "base"`` for ``[EXIT]`` (return this round's
  answer), ``"next"`` for ``[CONTINUE]`` (or an unreadable reply), with the decision's usage.

All T rounds are run unless ``stop_at_exit`` is set; ``meta.kind`` is ``"llm-exit"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ccpo import __version__
from ccpo.errors import CCPOError
from ccpo.llm.client import Endpoint, LLMClient
from ccpo.llm.config import CollectConfig
from ccpo.llm.prompts import PROMPT_VERSION, PastRound
from ccpo.llm.roles import (
    LOGPROB_DEF,
    UNCERTAINTY_DEF,
    BaseOutput,
    CoTAgent,
    Guide,
    GuideOutput,
    ReActAgent,
    exit_decision,
    policy_decision,
)
from ccpo.llm.tasks.loaders import Question
from ccpo.llm.tasks.scoring import score
from ccpo.llm.tasks.search import BM25Search, SearchBackend, WikipediaSearch, load_corpus
from ccpo.traces.schema import SCHEMA_VERSION, BaseStep, GuideStep, Round, Trace, Usage


@dataclass
class Runner:
    """Everything shared by the questions of one collection run."""

    cfg: CollectConfig
    client: LLMClient
    base: Endpoint
    guide: Endpoint | None
    policies: list[Endpoint]
    agent: CoTAgent | ReActAgent
    shared_search: SearchBackend | None = None
    source: str = ""

    def backend_for(self, q: Question) -> SearchBackend | None:
        if not isinstance(self.agent, ReActAgent):
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

    def trace(self, q: Question, rounds: list[dict[str, Any]], kind: str) -> Trace:
        """The ``ccpo.trace/v1`` record of ``q`` with its ``rounds`` (validated)."""
        return Trace(
            schema=SCHEMA_VERSION,
            id=q.id,
            task=q.task,
            question=q.question,
            gold=q.gold,
            rounds=rounds,
            meta=self.meta(q, kind),
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
            "guide_model": self.guide.model if self.guide else self.base.model,
            "policy_llm": [p.model for p in self.policies],
            "rounds_planned": cfg.rounds,
            "temperatures": [cfg.temperature(t) for t in range(1, cfg.rounds + 1)],
            "agent": "react" if isinstance(self.agent, ReActAgent) else "cot",
            "definitions": {
                "guide.uncertainty": UNCERTAINTY_DEF,
                "base.logprob_mean/min": LOGPROB_DEF,
            },
            **({"question_meta": q.meta} if q.meta else {}),
        }


def make_runner(cfg: CollectConfig, client: LLMClient, kind: str, source: str) -> Runner:
    """The :class:`Runner` of ``kind`` (``base-guide`` or ``llm-exit``) for ``cfg``: its endpoints,
    the task's agent (HotpotQA: ReAct, else chain of thought) and the shared search backend.
    Used by collection and by the deployed agent, so both run rounds the same way."""
    base = cfg.base_endpoint()
    guide = cfg.guide_endpoint() if kind == "base-guide" else None
    policies = [p.endpoint() for p in cfg.policy_llm] if kind == "base-guide" else []
    react = cfg.task == "hotpotqa"
    agent: CoTAgent | ReActAgent = (
        ReActAgent(max_steps=cfg.max_steps)
        if react
        else CoTAgent(cfg.task, max_tokens=cfg.max_tokens)
    )
    shared = None
    if react:
        mode = cfg.search
        if mode == "bm25" or (mode == "auto" and cfg.corpus):
            if not cfg.corpus:
                raise CCPOError("--search bm25 needs --corpus FILE (JSONL of {title, text})")
            shared = BM25Search(load_corpus(cfg.corpus))
        elif mode == "wikipedia":
            shared = WikipediaSearch()
    return Runner(cfg, client, base, guide, policies, agent, shared, source)


def base_record(out: BaseOutput, model: str, q: Question | None = None) -> dict[str, Any]:
    """The base step of a ``ccpo.trace/v1`` round; ``correct`` (scored against ``q.gold``) only
    when the question ``q`` is given (live there is no gold)."""
    mean, mn = out.calls.stats()
    step: dict[str, Any] = {
        "model": model,
        "answer": out.answer,
        "reasoning": out.reasoning,
        "usage": out.calls.usage(),
        "logprob_mean": mean,
        "logprob_min": mn,
    }
    if q is not None:
        step["correct"] = score(q.task, out.answer, q.gold)
    return step


def guide_record(g: GuideOutput, model: str, q: Question | None = None) -> dict[str, Any]:
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
        step["correct"] = score(q.task, g.answer, q.gold)
    return step


def live_round(record: dict[str, Any]) -> Round:
    """A round record without ``correct`` (a live round: there is no gold) as the schema's
    :class:`~ccpo.traces.schema.Round`, which the featurizer reads; built without validation
    (the values come from the client, and ``correct`` is absent: reading it fails)."""
    b, g = record["base"], record["guide"]
    return Round.model_construct(
        round=record["round"],
        base=BaseStep.model_construct(**{**b, "usage": Usage.model_construct(**b["usage"])}),
        guide=GuideStep.model_construct(**{**g, "usage": Usage.model_construct(**g["usage"])}),
        policy_llm=record.get("policy_llm"),
    )


@dataclass
class RoundOutput:
    """What one base → guide round produced (before any scoring against gold)."""

    round: int
    base: BaseOutput
    guide: GuideOutput

    def past(self) -> PastRound:
        """What later rounds' base prompts see of this round."""
        return PastRound(self.base.reasoning, self.base.answer, self.guide.raw)

    def record(
        self, base_model: str, guide_model: str, q: Question | None = None
    ) -> dict[str, Any]:
        """The round as a ``ccpo.trace/v1`` round record, the one place a round becomes one:
        collection stores it (scored against ``q.gold``), the deployed agent featurizes it
        (:func:`live_round`, no ``q``: no ``correct``)."""
        return {
            "round": self.round,
            "base": base_record(self.base, base_model, q),
            "guide": guide_record(self.guide, guide_model, q),
            "policy_llm": None,
        }


async def run_round(
    r: Runner,
    question: str,
    t: int,
    history: list[PastRound],
    backend: SearchBackend | None,
) -> RoundOutput:
    """Round ``t`` (1-based) of the base/guide protocol: the base answers, the guide judges.

    The one definition of a round, shared by collection (:func:`run_base_guide`, all T rounds)
    and the deployed agent (:mod:`ccpo.runtime.agent`, which stops when its policy says so):
    same prompts, temperatures and sample indices, hence the same cache keys.
    """
    assert r.guide is not None
    temp = r.cfg.temperature(t)
    out = await r.agent.run(r.client, r.base, question, history, temp, r.sample(temp, t), backend)
    g = await Guide().judge(r.client, r.guide, question, out.reasoning, out.answer)
    return RoundOutput(t, out, g)


async def run_base_guide(r: Runner, q: Question) -> Trace:
    """All T rounds of base → guide (→ policy LLMs) for one question."""
    assert r.guide is not None
    backend = r.backend_for(q)
    history: list[PastRound] = []
    rounds: list[dict[str, Any]] = []
    for t in range(1, r.cfg.rounds + 1):
        ro = await run_round(r, q.question, t, history, backend)
        out, g = ro.base, ro.guide
        rnd = ro.record(r.base.model, r.guide.model, q)
        if r.policies:
            decisions = {}
            for pe in r.policies:
                d = await policy_decision(
                    r.client,
                    pe,
                    q.question,
                    out.answer,
                    g.verdict,
                    g.answer,
                    g.uncertainty,
                    r.guide.model,
                    r.cfg.coverage,
                )
                decisions[pe.model] = {"action": d.action, "usage": d.calls.usage(), "raw": d.raw}
            rnd["policy_llm"] = decisions
        rounds.append(rnd)
        history.append(ro.past())
    return r.trace(q, rounds, "base-guide")


async def run_exit(r: Runner, q: Question) -> Trace:
    """LLM-EXIT: one model answers and decides [EXIT]/[CONTINUE] each round."""
    backend = r.backend_for(q)
    m = r.base.model
    history: list[PastRound] = []
    answers: list[str] = []
    rounds: list[dict[str, Any]] = []
    for t in range(1, r.cfg.rounds + 1):
        temp = r.cfg.temperature(t)
        out = await r.agent.run(
            r.client, r.base, q.question, history, temp, r.sample(temp, t), backend
        )
        answers.append(out.answer)
        d = await exit_decision(r.client, r.base, q.question, answers)
        base = base_record(out, m, q)
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
        history.append(PastRound(out.reasoning, out.answer, None))
        if r.cfg.stop_at_exit and d.action == "base":
            break
    return r.trace(q, rounds, "llm-exit")
