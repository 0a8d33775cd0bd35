"""The deployed cost-effective agent: a trained policy folder + live OpenAI-compatible endpoints.

>>> agent = ConformalAgent.from_artifact("runs/ccpo", "deploy.yaml")   # doctest: +SKIP
>>> s = agent.answer("Which city hosted the 1992 Summer Olympics?")    # doctest: +SKIP
>>> s.answers, s.rounds, s.cost_usd                                     # doctest: +SKIP

:class:`ConformalAgent` runs the set-valued rollout live with the replay's own code: round t of
the policy's ladder (:func:`deployment_ladder`) by :func:`ccpo.llm.protocol.run_round` (a step
the ladder repeats is reused, not asked again), o_t as the last row of the featurizer over
rounds 1..t, C(o_t) by :func:`ccpo.runtime.decision.decide`. It goes on iff ``next`` ∈ C(o_t)
and returns an :class:`~ccpo.runtime.answer_set.AnswerSet` (``ccpo.answer/v1``); a point
policy (``cpo``) acts greedily and has no κ. ``max_cost_per_request``
(:class:`RequestBudgetExceeded`) and ``max_cost_total`` (a wallet per question,
:class:`~ccpo.llm.client.BudgetExceeded`) are checked before each round and each call.

Contract: docs/design.md, sections "Episode semantics" and "Answer record `ccpo.answer/v1`";
budgets: docs/deploy.md, "Budgets" (under "`ccpo serve`").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ccpo.errors import CCPOError
from ccpo.llm import tracing
from ccpo.llm.cache import ResponseCache
from ccpo.llm.client import (
    BudgetExceeded,
    Envelope,
    LLMCallError,
    LLMClient,
    RequestBudget,
    RequestBudgetExceeded,
    SpendLedger,
    load_http,
    request_budget,
)
from ccpo.llm.protocol import (
    RoundOutput,
    Runner,
    ask_step,
    live_round,
    make_runner,
    prefetched,
    run_round,
)
from ccpo.llm.tasks.loaders import Question, parse_context
from ccpo.llm.wire import ReplySink, reply_sink
from ccpo.policies.base import Policy
from ccpo.policies.registry import load_policy
from ccpo.runtime.answer_set import AnswerSet, Guarantee, RoundLog, guarantee_of, one_answer
from ccpo.runtime.config import DeployConfig, as_deploy_config
from ccpo.runtime.decision import RoundDecision, decide, policy_horizon
from ccpo.runtime.deployment import (
    PolicyProvenanceWarning,
    deploy_provenance_notes,
    deployment_ladder,
)
from ccpo.runtime.pieces import Held, Timed
from ccpo.traces.answers import normalizer_for
from ccpo.traces.conversation import Conversation, prompt_text
from ccpo.traces.ladder import CHAT
from ccpo.traces.prices import PriceTable, load_prices, prices_from_mapping
from ccpo.traces.routing import routed_rounds
from ccpo.traces.schema import ACTIONS

log = logging.getLogger("ccpo.route")

__all__ = [
    "AnswerSet",
    "BudgetExceeded",
    "ConformalAgent",
    "LLMCallError",
    "PolicyProvenanceWarning",
    "RequestBudgetExceeded",
    "RoundDecision",
    "decide",
    "policy_horizon",
]


# ----------------------------------------------------------------------------- the agent
class ConformalAgent:
    """A trained policy answering live questions with a base and a guide LLM.

    The constructor checks the policy's provenance against the deployment: another task or
    horizon than it was trained on raises :class:`CCPOError`; other models, or a policy trained
    on synthetic traces, give a :class:`PolicyProvenanceWarning` each (also kept in
    ``provenance_warnings``). ``where`` names the policy in those messages.
    """

    def __init__(
        self,
        policy: Policy,
        config: DeployConfig,
        prices: PriceTable | None = None,
        spent_offset: float = 0.0,
        where: str = "policy",
    ) -> None:
        self.policy = policy
        self.config = config
        self.horizon = policy_horizon(policy, config.rounds)
        self.ladder = deployment_ladder(policy, config, self.horizon, where)
        self.task: str = self.ladder.task
        self.family: str = self.ladder.family
        self.collect_config = config.collect_config(self.task, self.horizon, self.family)
        #: every model of the ladder and where it is served (refused here when one has none)
        self.endpoints = {m: self.collect_config.endpoint_for(m) for m in self.ladder.models()}
        self.provenance_warnings = deploy_provenance_notes(  # a config's task: must agree
            policy, config.task or self.task, self.horizon, self.ladder, where
        )
        for line in self.provenance_warnings:
            warnings.warn(line, PolicyProvenanceWarning, stacklevel=2)
        self.prices = prices if prices is not None else self._prices(policy, config)
        self.prices.check(self.ladder.models())
        self._norm = normalizer_for(self.task, self.family)
        if config.kappa is not None and policy.greedy:
            raise CCPOError(
                f"the policy is a point policy ({policy.variant}): it has no κ to override"
            )
        self._kappa: float | None = (
            None
            if policy.greedy
            else float(config.kappa if config.kappa is not None else policy.threshold)
        )
        self.spent_offset = float(spent_offset)
        self.ledger: SpendLedger | None = None  # the total budget's ledger (None: a fresh one)
        self._costliest_round = 0.0  # what the costliest round of a finished question paid
        self._worst_round = 0.0  # the most the calls of one such round reserved (worst cases)
        self._runners: dict[int, tuple[asyncio.AbstractEventLoop, Runner, ResponseCache]] = {}
        self._closed_spent = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: question embeddings asked before routing, and of them the ones that fell back
        self.route_embeddings = self.route_fallbacks = 0
        #: guide calls sent ahead (hedge_above), and of them those cancelled as not needed
        self.hedged = self.hedges_cancelled = 0
        model = policy.route_embedding_model
        self._route_endpoint = None if model is None else self.collect_config.endpoint_for(model)
        load_http()  # now, not on the first question (import ccpo.runtime does not load it)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_artifact(
        cls,
        path: str | Path,
        config: DeployConfig | str | Path | dict[str, Any] | None = None,
        **overrides: Any,
    ) -> ConformalAgent:
        """Load a policy folder; endpoints and prices from ``config`` (YAML path, dict or
        :class:`DeployConfig`) and keyword overrides (``base_model=..., base_url=...``)."""
        cfg = as_deploy_config(config, overrides)
        return cls(load_policy(path), cfg, where=f"policy {path}")

    @staticmethod
    def _prices(policy: Policy, config: DeployConfig) -> PriceTable:
        own = (
            prices_from_mapping(policy.prices, "the policy's prices.json")
            if policy.prices
            else None
        )
        return load_prices(own, *config.prices)

    # ------------------------------------------------------------------ properties
    @functools.cached_property
    def needs_context(self) -> bool:
        """The ladder runs ReAct rounds with no search corpus: questions must bring their
        paragraphs (``context``)."""
        cfg = self.collect_config
        react = any("react" in (r.base.prompt, r.guide.prompt) for r in self.ladder.rounds)
        return react and cfg.search not in ("bm25", "wikipedia") and not cfg.corpus

    @property
    def alpha(self) -> float:
        return self.policy.alpha

    @property
    def guarantee(self) -> Guarantee:
        """What the policy promises: one answer or a set, 1 − α, against gold or a reference
        model (:func:`~ccpo.runtime.answer_set.guarantee_of`)."""
        return guarantee_of(self.policy)

    @property
    def kappa(self) -> float | None:
        """κ in force (None: point policy, greedy)."""
        return self._kappa

    @kappa.setter
    def kappa(self, value: float) -> None:
        if self._kappa is None:
            raise CCPOError("a point policy has no κ")
        self._kappa = float(np.clip(value, 0.0, 1.0))

    @property
    def spent_usd(self) -> float:
        """Dollars actually paid (cache hits are free), including ``spent_offset``."""
        if self.ledger is not None and self.ledger.absolute:  # the shared state's, all of it
            return self.ledger.total
        live = sum(r.client.spent_usd for _, r, _ in self._runners.values())
        return self.spent_offset + self._closed_spent + live

    def budget_left(self) -> bool:
        cap = self.config.max_cost_total
        return cap is None or self.spent_usd < cap

    def decide(self, rounds: Sequence[Any], kappa: float | None = None) -> RoundDecision:
        """The decision after ``rounds`` (see :func:`decide`) at κ in force or ``kappa``."""
        k = self._kappa if kappa is None else kappa
        return decide(self.policy, self.task, self.horizon, rounds, k, self.family)

    # ------------------------------------------------------------------ clients (one per loop)
    def _runner(self) -> Runner:
        loop = asyncio.get_running_loop()
        for key, (lp, r, cache) in list(self._runners.items()):
            if lp.is_closed():  # a loop that is gone: keep its spending, drop its client
                self._closed_spent += r.client.spent_usd
                cache.close()
                del self._runners[key]
        hit = self._runners.get(id(loop))
        if hit is not None and hit[0] is loop:
            return hit[1]
        cfg = self.collect_config
        cap = self.config.max_cost_total
        cache = ResponseCache(cfg.cache_path())
        if cap is None or (self.ledger is not None and self.ledger.absolute):
            budget = cap  # the ledger counts all money spent, not this process's
        else:
            budget = max(0.0, cap - self.spent_usd)
        client = cfg.client(cache, self.prices, budget, self.ledger)
        runner = make_runner(cfg, client, "base-guide", "ccpo deploy", self.ladder)
        runner.chat_max_tokens = self.config.reply_max_tokens
        self._runners[id(loop)] = (loop, runner, cache)
        return runner

    async def aclose(self) -> None:
        """Close the HTTP clients of the running event loop."""
        loop = asyncio.get_running_loop()
        hit = self._runners.pop(id(loop), None)
        if hit is not None:
            self._closed_spent += hit[1].client.spent_usd
            await hit[1].client.aclose()
            hit[2].close()

    def close(self) -> None:
        """Close the private event loop of :meth:`answer` and its clients."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self.aclose())
            self._loop.close()
        self._loop = None

    def __enter__(self) -> ConformalAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ answering
    def answer(self, question: str, **kwargs: Any) -> AnswerSet:
        """Synchronous :meth:`aanswer` (on a private event loop kept between calls)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise CCPOError("answer() called inside an event loop; use `await agent.aanswer()`")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(self.aanswer(question, **kwargs))

    @property
    def takes_conversations(self) -> bool:
        """The policy's family is ``chat``: its models receive the whole conversation (other
        families take the last user turn only: docs/deploy.md, "Conversations")."""
        return self.family == CHAT

    async def aanswer(
        self,
        question: str | Conversation,
        id: str | None = None,
        context: Any = None,
        kappa: float | None = None,
        max_cost: float | None = None,
    ) -> AnswerSet:
        """Answer one question with the set-valued rollout (docs/design.md, "Episode semantics").

        ``context``: optional paragraphs for the offline search tool (hotpotqa), in any layout
        :func:`ccpo.llm.tasks.loaders.parse_context` reads. ``kappa`` overrides κ for this
        call; ``max_cost`` (USD) tightens the per-request budget. ``question`` may be a
        :class:`~ccpo.traces.conversation.Conversation`: a ``chat`` policy's models receive it
        whole; any other family's, its last user turn only.
        """
        t0 = time.perf_counter()
        if isinstance(question, Conversation) and not self.takes_conversations:
            question = question.text
        if not prompt_text(question).strip():
            raise CCPOError("the question is empty")
        k = self._kappa if kappa is None else float(kappa)
        if kappa is not None and self._kappa is None:
            raise CCPOError("a point policy has no κ")
        budget = self.config.max_cost_per_request
        if max_cost is not None:
            budget = max_cost if budget is None else min(budget, max_cost)
        qid = id or uuid.uuid4().hex
        runner = self._runner()
        if not runner.client.budget_left():
            raise BudgetExceeded(
                f"the total budget of ${self.config.max_cost_total:.4f} is spent; "
                "no new LLM calls are made"
            )
        token = request_budget.set(RequestBudget(budget) if budget is not None else None)
        try:
            # admitted when what a question may cost fits what is left of the budget
            client = runner.client
            with tracing.question(self, qid, k) as span:  # a no-op unless tracing is on
                async with client.admit(lambda: self._question_estimate(client)) as env:
                    return span.done(
                        await self._rollout(runner, env, question, qid, context, k, budget, t0)
                    )
        except RequestBudgetExceeded as e:
            raise RequestBudgetExceeded(f"question '{qid}': {e}") from None
        finally:
            request_budget.reset(token)

    def _question_estimate(self, client: LLMClient) -> float | None:
        """What to hold for a question: T x the costliest round of the questions over so far
        (plus a call's worst case: :meth:`LLMClient.question_estimate`); None before one is
        over. Under ``max_cost_total``, T x the largest worst case of a round instead: a
        question is admitted only when its whole ladder's worst case fits, so none is refused
        part way for want of room (docs/deploy.md, "Budgets")."""
        if self.config.max_cost_total is not None:  # (a restart knows it from its ledger)
            w = client.question_estimate(self._worst_round * self.horizon or None) or 0.0
            return max(w, client.ledger.known_worst()) or None
        c = self._costliest_round
        return client.question_estimate(c * self.horizon if c else None)

    async def _rollout(
        self,
        runner: Runner,
        env: Envelope,
        question: str | Conversation,
        qid: str,
        context: Any,
        k: float | None,
        budget: float | None,
        t0: float,
    ) -> AnswerSet:
        """The set-valued rollout of one admitted question (see :meth:`aanswer`)."""
        q = Question(qid, self.task, prompt_text(question), [], parse_context(context, "context"))
        backend = runner.backend_for(q)
        sink = self._streamed_step()
        timed = None if sink is None else Timed(sink.put)
        token = reply_sink.set(None if timed is None else ReplySink(timed.put, sink.step))
        try:
            return await self._rounds(runner, env, question, q, qid, backend, k, budget, t0, timed)
        finally:
            reply_sink.reset(token)

    def _streamed_step(self) -> ReplySink | None:
        """The question's reply sink (:data:`~ccpo.llm.wire.reply_sink`, set by a server whose
        client reads the reply as it comes) at the step whose reply is returned whatever the
        calls before it say, when the policy has one
        (:meth:`~ccpo.policies.base.Policy.decided_step`: the one step of
        ``always-<reference>``; the guide of round T for a single-answer policy). A chat
        policy's only: another family's answer is read from the whole reply."""
        sink = reply_sink.get()
        if sink is None or not self.takes_conversations:
            return None
        step = self.policy.decided_step(self.horizon)
        return None if step is None else sink.at({"round": str(step[0]), "role": step[1]})

    async def _rounds(
        self,
        runner: Runner,
        env: Envelope,
        question: str | Conversation,
        q: Question,
        qid: str,
        backend: Any,
        k: float | None,
        budget: float | None,
        t0: float,
        timed: Timed | None = None,
    ) -> AnswerSet:
        """The rounds of :meth:`_rollout`: from the round the policy starts at, each with the
        steps it calls (:meth:`~ccpo.policies.base.Policy.round_roles`), until it stops.
        ``timed``: the streamed step's sink, which times the first piece it passed on."""
        roles = self.policy.round_roles  # the steps of each round it calls
        outs: list[RoundOutput] = []
        rounds: list[Any] = []  # live rounds (protocol.live_round): a Round's attributes
        logs: list[RoundLog] = []
        answers: dict[str, str] = {}  # normalised → first spelling
        finish: dict[str, str | None] = {}  # normalised → the first spelling's finish_reason
        joined: list[tuple[str, float, int, str]] = []  # (normalised, π(a|o_t), t, a)
        by_model: dict[str, float] = dict.fromkeys(self.ladder.models(), 0.0)
        total = worst = costliest = worst_round = 0.0
        nxt: asyncio.Future[RoundOutput] | None = None  # the next round, already sent
        before = before_worst = 0.0
        first = await self._start_rung(runner, q.question) + 1  # before any call (routing)
        rounds.extend(routed_rounds([], first - 1))  # skipped rounds: blank, as in replay
        ahead = self._hedge(runner, question, q.question, first, backend)
        sent_ahead = prefetched.set(ahead)
        try:
            for t in range(first, self.horizon + 1):
                if nxt is None:
                    before, before_worst = env.spent, env.worst
                    ro = await run_round(runner, question, t, outs, backend, first, roles(t))
                else:
                    ro = await nxt
                    nxt = None
                costliest = max(costliest, env.spent - before)
                worst_round = max(worst_round, env.worst - before_worst)
                outs.append(ro)
                lr = live_round(ro.record())
                rounds.append(lr)
                cb, cg = self.prices.round_costs(lr)
                by_model[lr.base.model] += cb
                by_model[lr.guide.model] += cg
                total += cb + cg
                worst = max(worst, cb + cg)
                d = decide(self.policy, self.task, self.horizon, rounds, k, self.family)
                if d.go_on and t < self.horizon:
                    if budget is not None and total + worst > budget:
                        raise RequestBudgetExceeded(
                            f"round {t + 1} would take it over its budget of "
                            f"${budget:.6f} (spent ${total:.6f} in {t} rounds; the policy "
                            "wants another round)"
                        )
                    # round t + 1 sends its first call before round t's log is written
                    before, before_worst = env.spent, env.worst
                    nxt = asyncio.ensure_future(
                        run_round(runner, question, t + 1, outs, backend, first, roles(t + 1))
                    )
                    await asyncio.sleep(0)  # (it runs up to its first wait for the network)
                logs.append(self._round_log(t, ro, lr, d, cb + cg, answers, joined))
                for out in (ro.base, ro.guide):  # (a reused step has no call of its own)
                    if out.calls.finish_reason is not None:
                        finish.setdefault(self._norm(out.answer), out.calls.finish_reason)
                if not d.go_on:
                    break
        finally:
            if nxt is not None:  # an error or a cancellation before it was awaited
                nxt.cancel()
                await asyncio.gather(nxt, return_exceptions=True)  # its calls settle first
            prefetched.reset(sent_ahead)
            if ahead:  # sent ahead and not needed: cancelled, paid by its usage when it had
                calls = [c for c, _ in ahead.values()]  # finished, else at its worst case
                for c in calls:
                    c.cancel()
                await asyncio.gather(*calls, return_exceptions=True)
                self.hedges_cancelled += len(calls)
            # known to the next questions' estimates once the question is over, not round by
            # round: its first rounds and calls are its cheapest (its prompts grow), and a
            # question admitted on them would hold too little
            self._costliest_round = max(self._costliest_round, costliest)
            if worst_round > self._worst_round:
                self._worst_round = worst_round
                client = runner.client
                client.ledger.note_worst(client.question_estimate(worst_round * self.horizon) or 0)
        best = one_answer(joined)
        # the first token: streamed as it came (a step decided before it was called), else
        # sent once the reply is chosen, not before
        first = timed.at if timed is not None and timed.at is not None else time.perf_counter()
        return AnswerSet(
            id=qid,
            question=q.question,
            conversation=question.key() if isinstance(question, Conversation) else None,
            answers=list(answers.values()),
            answer=None if best is None else answers[best],
            guarantee=self.guarantee,
            rounds=len(outs),
            horizon=self.horizon,
            cost_usd=total,
            cost_by_model=by_model,
            log=logs,
            alpha=self.alpha,
            kappa=k,
            policy=self.policy.variant,
            latency_ms=(time.perf_counter() - t0) * 1000.0,
            ttft_ms=(first - t0) * 1000.0,
            finish_reason=None if best is None else finish.get(best),
        )

    def _hedge(
        self,
        runner: Runner,
        question: str | Conversation,
        text: str,
        first: int,
        backend: Any,
    ) -> dict[tuple[int, str], tuple[asyncio.Future[Any], Any]]:
        """Hedging (``hedge_above``, off by default): the guide of round ``first + 1`` sent at
        once, beside round ``first``, when the policy's chance of going on past round
        ``first`` on this question is above ``hedge_above`` (a routed policy's router: 1 −
        r̂ of its start; another policy has none and never hedges). Round ``first + 1`` takes
        the call (:data:`~ccpo.llm.protocol.prefetched`) if it runs; else it is cancelled when
        the question is over. A streamed reply's pieces are held until the round takes it."""
        level, t = self.config.hedge_above, first + 1
        if level is None or t > self.horizon or self.ladder.round(t).verdict != "agree":
            return {}
        if self.ladder.reused(t, "guide", first) is not None:
            return {}  # (the round copies an earlier call: nothing to send)
        chance = self.policy.escalation_chance(text, first)
        if chance is None or chance <= level:
            return {}
        step = {"round": str(t), "role": "guide"}
        sink = reply_sink.get()
        held = Held(sink.put if sink is not None and sink.step == step else None)
        token = reply_sink.set(None if held.to is None else ReplySink(held.put, step))
        try:  # (the task runs in a copy of this context)
            call = asyncio.ensure_future(ask_step(runner, question, t, "guide", backend))
        finally:
            reply_sink.reset(token)
        self.hedged += 1
        return {(t, "guide"): (call, held.take)}

    async def _start_rung(self, runner: Runner, question: str) -> int:
        """The round to start at (0-based), from the question alone: with a router that reads
        question embeddings, one ``/embeddings`` call within ``route_embedding_timeout``; a
        failed, slow or malformed one falls back to the text-only router (counted, logged):
        it never blocks an answer, and the guarantee holds either way."""
        if self._route_endpoint is None:
            return self.policy.start_rung(question)
        self.route_embeddings += 1
        timeout = self.config.route_embedding_timeout
        try:
            vectors = await runner.client.embed(self._route_endpoint, [question], timeout)
            return self.policy.start_rung(question, vectors[0])
        except (LLMCallError, CCPOError) as e:
            self.route_fallbacks += 1
            log.warning("routing without the question's embedding: %s", e)
            return self.policy.start_rung(question)

    def _round_log(
        self,
        t: int,
        ro: RoundOutput,
        lr: Any,
        d: RoundDecision,
        cost: float,
        answers: dict[str, str],
        joined: list[tuple[str, float, int, str]],
    ) -> RoundLog:
        """Round ``t``'s log, its answers in C(o_t) joined to the set (``answers``: normalised
        → first spelling; ``joined``: (normalised, π(a|o_t), t, a)), its tracing event."""
        tracing.current().round(t, d, cost, ro.reused)
        for i, (a, text) in enumerate((("base", lr.base.answer), ("guide", lr.guide.answer))):
            key = self._norm(text)
            if a in d.actions and key:  # an empty answer adds none
                answers.setdefault(key, text)
                joined.append((key, float(d.probs[i]), t, a))
        return RoundLog(
            round=t,
            base_model=lr.base.model,
            guide_model=lr.guide.model,
            models=ro.models(),
            base_answer=lr.base.answer,
            guide_verdict=lr.guide.verdict,  # type: ignore[arg-type]
            guide_answer=lr.guide.answer,
            uncertainty=lr.guide.uncertainty,
            pi={a: float(v) for a, v in zip(ACTIONS, d.probs, strict=True)},
            actions=list(d.actions),  # type: ignore[arg-type]
            fallback=d.fallback,
            cost_usd=cost,
        )

    def normalize(self, answer: str) -> str:
        """The task's answer normaliser (used for de-duplication and feedback matching)."""
        return self._norm(answer)
