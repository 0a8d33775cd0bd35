"""The service behind ``ccpo serve``: the deployed agent, its persistent state (κ, coverage,
counters, answer sets kept for feedback) and the server's rails, one handler per endpoint. The
HTTP app around it is :mod:`ccpo.runtime.server`; the wire models are
:mod:`ccpo.runtime.schemas`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections import Counter
from pathlib import Path

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.llm.client import BudgetExceeded, LLMCallError
from ccpo.llm.http_errors import NotRecorded
from ccpo.llm.wire import EndpointError
from ccpo.runtime.agent import ConformalAgent, RequestBudgetExceeded
from ccpo.runtime.answer_set import AnswerSet
from ccpo.runtime.config import DeployConfig
from ccpo.runtime.feedback import RECENT, Counters, FeedbackError, drift, online_kappa
from ccpo.runtime.latency import Latency
from ccpo.runtime.rails import RateLimiter, check_bearer, check_rate
from ccpo.runtime.schemas import (
    AnswerRequest,
    ApiError,
    FeedbackRequest,
    FeedbackResponse,
    Health,
    ServerMetrics,
)
from ccpo.runtime.state import (
    BudgetBusy,
    DuplicateKey,
    StateStore,
    StateUnavailable,
    StoreLedger,
)
from ccpo.runtime.state.db import OperationRefused
from ccpo.traces.conversation import ConversationError, check_size

log = logging.getLogger("ccpo.serve")

#: what a client is told when the state database is away (where it is, the server log says)
_STATE_AWAY = "the state database is unavailable"
#: how a schema version another ccpo wrote is explained (``state.schema.version_problem``:
#: versions and what to do, nothing of where): a client and ``/healthz`` are told that too
_SCHEMA_WHY = "its tables have schema version"


def state_away(why: str) -> str:
    """What a client may be told of why the state database is away: that it is, and a
    schema version another ccpo wrote; never the database's URL, host or port (in ``why``
    as the driver said it)."""
    at = why.find(_SCHEMA_WHY)
    return _STATE_AWAY if at < 0 else f"{_STATE_AWAY}: {why[at:]}"


POLICY_FAILURES = 3
"""Questions in a row the policy itself fails on (a bug, not an endpoint) before ``/healthz``
says ``degraded``; one answered question clears it."""

Answered = tuple[AnswerSet, str]  # an answer set and its JSON text
Asked = tuple[str, str | None]  # a question and its conversation's key (chat policies)


def as_json(s: AnswerSet) -> str:
    """``s`` as JSON text; with \\u escapes when it holds what UTF-8 cannot encode (a lone
    surrogate an endpoint sent back in an answer)."""
    try:
        return s.model_dump_json()
    except ValueError:  # pydantic's serialisation error
        return json.dumps(s.model_dump(mode="json"))


def artifact_fingerprint(folder: str | Path) -> str:
    """SHA-256 over the artifact's policy.json and model file (ties a state file to it)."""
    h = hashlib.sha256()
    for name in ("policy.json", "weights.pt", "weights.npz", "model.pkl"):
        p = Path(folder) / name
        if p.exists():
            h.update(name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


class Service:
    """The agent, its persistent state and the server's rails."""

    def __init__(self, agent: ConformalAgent, fingerprint: str) -> None:
        self.agent = agent
        self.cfg = cfg = agent.config.server
        if cfg.adapt_kappa and agent.kappa is None:
            raise CCPOError(
                f"adapt_kappa: the policy is a point policy ({agent.policy.variant}) without κ"
            )
        if cfg.adapt_kappa and not agent.policy.tracks_online:
            raise CCPOError(
                f"adapt_kappa: {agent.policy.variant} is a single-answer policy; its threshold "
                "is certified by Learn-then-Test, which the online κ tracker does not keep: "
                "serve it without --adapt-kappa"
            )
        self.token = cfg.token()
        pol = agent.policy
        self.kappa_artifact = agent.kappa
        # training takes one κ step per batch of questions; here one per question
        eta, xi = pol.online_step
        tracker, self.kappa_bounds = online_kappa(
            agent.kappa, pol.alpha, eta, xi, cfg, pol.calibration
        )
        self.store = StateStore(
            cfg.state,
            fingerprint,
            tracker,
            cfg.max_records,
            expiry=cfg.reservation_expiry,
            replica=cfg.replica,
            timeout=cfg.state_timeout,
        )
        if self.store.restored:

            def operator_settings(t: OnlineThreshold) -> None:
                if cfg.kappa_eta0:  # an explicit step size wins over the stored one
                    t.eta0 = cfg.kappa_eta0
                if cfg.adapt_kappa:  # a band narrowed by the operator applies at once
                    self.kappa_bounds.clamp(t)

            self.store.update_tracker(operator_settings)
            if cfg.adapt_kappa:
                agent.kappa = self.store.kappa
        agent.ledger = StoreLedger(self.store, max_wait=cfg.budget_wait)
        self.limiter = self._limiter(cfg.rate_limit_per_minute, cfg.rate_burst)
        self.feedback_limiter = self._limiter(cfg.feedback_per_minute, cfg.feedback_burst)
        self._answering: dict[str, tuple[Asked, asyncio.Future[Answered]]] = {}
        self._active = 0  # questions being answered (awaited on shutdown)
        # a lone question's writes may commit on the loop (SQLite, where that never waits)
        self.store.engine.alone = lambda: self._active == 1
        self._idle = asyncio.Event()
        self._idle.set()
        self.started = time.monotonic()
        self.latency = Latency()  # this replica's, for /metrics
        #: this replica's 5xx answers by kind (the error body's type), for /metrics
        self.failures: Counter[str] = Counter()
        self._policy_failures: list[str] = []  # the questions in a row the policy failed on
        self._short_since: int | None = None  # feedback count at the last drift warning

    def _limiter(self, per_minute: float | None, burst: int) -> RateLimiter | None:
        return RateLimiter(per_minute, burst, self.cfg.max_clients) if per_minute else None

    @classmethod
    def from_artifact(cls, policy: str | Path, config: DeployConfig) -> Service:
        return cls(ConformalAgent.from_artifact(policy, config), artifact_fingerprint(policy))

    # ------------------------------------------------------------------ guards
    def check_auth(self, authorization: str | None) -> None:
        """The ``Authorization`` header must carry the bearer token (if the server has one)."""
        check_bearer(self.token, authorization)

    def check_rate(self, client: str, feedback: bool = False) -> None:
        """The client's token bucket (the feedback one for ``/v1/feedback``)."""
        if feedback:
            check_rate(self.feedback_limiter, client, "feedbacks")
        else:
            check_rate(self.limiter, client, "requests")

    def _reject(self, status: int, type_: str, message: str) -> ApiError:
        self.store.answers.count_rejected()
        return ApiError(status, type_, message)

    @staticmethod
    def withheld(
        status: int, type_: str, reason: str, detail: Exception, rid: str | None = None
    ) -> ApiError:
        """An error whose detail names internal places (the state database's URL, an LLM
        endpoint's model, host and port, what it answered): the client gets ``reason`` and
        the request's id (``rid``, else a new one), the server log the detail under that id
        (its URLs already without passwords: ``where`` of the endpoint or the database)."""
        rid = rid or uuid.uuid4().hex
        log.warning("request %s: %s: %s", rid, reason, detail)
        if isinstance(detail, StateUnavailable):
            reason = state_away(str(detail))
        return ApiError(status, type_, f"{reason} (request {rid}; the server log has why)")

    # ------------------------------------------------------------------ handlers
    async def answer(self, req: AnswerRequest) -> AnswerSet:
        """Answer ``req`` (see :mod:`ccpo.runtime.server`); the state database away: 503
        ``state_unavailable`` before any LLM call; the server stopping (its grace period
        over): 503 ``shutting_down``, the calls cut off counted at their worst case."""
        return (await self.answered(req))[0]

    async def answer_json(self, req: AnswerRequest) -> str:
        """:meth:`answer` as the JSON text that was stored (serialised once)."""
        return (await self.answered(req))[1]

    async def answered(self, req: AnswerRequest) -> Answered:
        """:meth:`answer` with its JSON text."""
        self._active += 1
        self._idle.clear()
        try:
            return await self._answer_once(req)
        except StateUnavailable as e:
            raise self.withheld(503, "state_unavailable", _STATE_AWAY, e, req.id) from None
        except asyncio.CancelledError:  # only the server's shutdown cancels a request
            raise ApiError(
                503, "shutting_down", "the server stopped before the question was answered"
            ) from None
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def _answer_once(self, req: AnswerRequest) -> Answered:
        # (text a database refuses was refused by the request's model: schemas.Storable)
        if len(req.question) > self.cfg.max_question_chars:
            raise self._reject(
                422,
                "invalid_request",
                f"question: {len(req.question)} characters, more than the "
                f"{self.cfg.max_question_chars} this server accepts",
            )
        if req.conversation is not None:
            try:
                check_size(req.conversation, self.cfg.max_conversation_chars)
            except ConversationError as e:
                raise self._reject(422, "invalid_request", str(e)) from None
        if req.id is None:
            return await self._answer(req)
        asked = self._asked(req)
        busy = self._answering.get(req.id)
        if busy is not None:  # a retry while the first is still being answered: its answer
            if busy[0] != asked:
                raise self._reject(
                    409, "conflict", f"id '{req.id}' is being answered for another question"
                )
            return await asyncio.shield(busy[1])
        # taken here before any await: a retry arriving meanwhile waits for this one
        fut: asyncio.Future[Answered] = asyncio.get_running_loop().create_future()
        self._answering[req.id] = (asked, fut)
        try:
            s = await self._answer_claimed(req, asked)
            fut.set_result(s)
            return s
        except BaseException as e:
            if isinstance(e, Exception):
                fut.set_exception(e)
                fut.exception()  # retrieved: waiters re-raise it themselves
            else:
                fut.cancel()
            raise
        finally:
            del self._answering[req.id]

    async def _answer_claimed(self, req: AnswerRequest, asked: Asked) -> Answered:
        """Answer ``req`` (its id new to this replica) once over all replicas: its id claimed
        in the state first (:meth:`~ccpo.runtime.state.answers.Answers.claim`); an id stored
        already gives its answer, an id another replica is answering a 409."""
        assert req.id is not None
        old = await self.store.answers.claim(req.id, req.question)
        if isinstance(old, str):  # (refused before any work, as self._reject counts it)
            self.store.answers.count_rejected()
            raise ApiError(
                409,
                "conflict",
                f"id '{req.id}' is being answered by another replica; ask again for its answer",
                headers={"Retry-After": "1"},
            )
        if old is not None:
            if (old[0], old[1].get("conversation")) == asked:
                s = AnswerSet.model_validate(old[1])
                return s, as_json(s)
            raise self._reject(
                409, "conflict", f"id '{req.id}' was already used for another question"
            )
        try:
            return await self._answer(req)
        except Exception:
            with contextlib.suppress(Exception):  # else it is taken over once stale
                await self.store.answers.unclaim(req.id)
            raise

    def _asked(self, req: AnswerRequest) -> Asked:
        """What an id stands for: the question and, for a chat policy, the conversation (the
        same follow-up after another history is another question)."""
        conv = req.conversation if self.agent.takes_conversations else None
        return req.question, None if conv is None else conv.key()

    async def _answer(self, req: AnswerRequest) -> Answered:
        agent = self.agent
        if (
            agent.needs_context
            and not req.context
            and agent.collect_config.search not in ("bm25", "wikipedia")
            and not agent.collect_config.corpus
        ):
            raise self._reject(
                422,
                "invalid_request",
                "context: this agent's ReAct rounds have no search corpus; send the question's "
                "paragraphs as context: [{title, text}, ...]",
            )
        if not agent.budget_left():
            raise self._reject(
                503,
                "budget_exhausted",
                f"the server's total budget of ${agent.config.max_cost_total:.4f} is spent; "
                "no new LLM calls are made",
            )
        if self.cfg.adapt_kappa:  # κ as feedback at any replica has moved it
            agent.kappa = (await self.store.arefresh())[0].kappa
        ctx = [p.model_dump() for p in req.context] if req.context else None
        asked = req.question if req.conversation is None else req.conversation
        try:
            s = await agent.aanswer(asked, id=req.id, context=ctx, max_cost=req.max_cost_usd)
        except StateUnavailable:
            raise
        except RequestBudgetExceeded as e:
            self.store.answers.record_error()
            raise ApiError(402, "request_budget_exceeded", str(e)) from None
        except BudgetBusy as e:
            self.store.answers.record_error()
            raise ApiError(
                503, "budget_busy", str(e), headers={"Retry-After": str(e.retry_after)}
            ) from None
        except BudgetExceeded as e:
            self.store.answers.record_error()
            raise ApiError(503, "budget_exhausted", f"total budget reached: {e}") from None
        except NotRecorded as e:  # a replay endpoint: the model and URL are right
            self.store.answers.record_error()
            what = "conversation" if agent.takes_conversations else "question"
            why = (
                f"this {what} is not in the recorded traces the LLM endpoints replay (ccpo "
                f"replay-server answers only the {what}s of its trace file)"
            )
            raise self.withheld(404, "not_recorded", why, e, req.id) from None
        except LLMCallError as e:
            self.store.answers.record_error()
            why = "an LLM endpoint still failed after its retries"
            raise self.withheld(502, "upstream_error", why, e, req.id) from None
        except EndpointError as e:  # the endpoint refused our key, or knows no such model
            self.store.answers.record_error()
            why = "an LLM endpoint refused the request (its key or model)"
            raise self.withheld(502, "upstream_error", why, e, req.id) from None
        except OperationRefused as e:  # the state database refused one of its writes
            self.store.answers.record_error()
            raise self.withheld(500, "internal_error", "the state database refused an "
                                "operation", e, req.id) from None  # fmt: skip
        except Exception as e:  # the policy (a bug, or an error of its own): it fails again
            self.store.answers.record_error()
            self._policy_failures.append(type(e).__name__)
            log.error("request %s: the policy failed", req.id, exc_info=e)
            raise ApiError(
                500,
                "policy_error",
                f"the policy failed on this question ({type(e).__name__}); a retry would "
                "fail the same way and pay for its calls again",
                headers={"x-should-retry": "false"},  # (the openai SDKs read it)
            ) from None
        self._policy_failures.clear()
        text = as_json(s)  # once: stored, and the response's body
        counted = {"id": s.id, "question": s.question, "cost_usd": s.cost_usd,
                   "answers": s.answers, "rounds": s.rounds}  # fmt: skip
        try:
            await self.store.answers.record_answer(counted, text)
        except DuplicateKey:
            raise ApiError(
                409, "conflict", f"id '{s.id}' was used by a concurrent request"
            ) from None
        return s, text

    async def feedback(self, req: FeedbackRequest) -> FeedbackResponse:
        try:
            return await self._feedback(req)
        except StateUnavailable as e:
            raise self.withheld(503, "state_unavailable", _STATE_AWAY, e, req.id) from None

    async def _feedback(self, req: FeedbackRequest) -> FeedbackResponse:
        agent = self.agent
        old = await self.store.answers.lookup(req.id)
        if old is None:
            raise ApiError(404, "not_found", f"no answered question with id '{req.id}'")
        answers = old[1]["answers"]
        if req.none_of_them or req.unanswerable:
            covered = req.unanswerable  # unanswerable: covered, as calibration counts it
        else:
            truth = agent.normalize(req.correct_answer or "")
            if not truth:
                raise ApiError(422, "invalid_request", "correct_answer: empty after normalisation")
            covered = truth in {agent.normalize(a) for a in answers}
        try:
            kappa, n, n_covered = await self.store.answers.record_feedback(
                req.id,
                covered,
                req.model_dump(exclude={"id"}),
                self.cfg.adapt_kappa,
                self.cfg.kappa_max_step,
                self.kappa_bounds,
            )
        except FeedbackError as e:
            raise ApiError(
                e.status, "conflict" if e.status == 409 else "not_found", str(e)
            ) from None
        if self.cfg.adapt_kappa:
            agent.kappa = kappa
        c = self.store.counters
        self._watch_drift(c)
        return FeedbackResponse(
            id=req.id, covered=covered, kappa=agent.kappa, coverage=n_covered / n, feedback=n
        )

    def _watch_drift(self, c: Counters) -> None:
        """Log a warning when the coverage of recent feedback falls below 1 − α beyond noise
        (:func:`ccpo.runtime.feedback.drift`): once when it starts, again every
        :data:`~ccpo.runtime.feedback.RECENT` feedbacks while it lasts."""
        d = drift(c, self.agent.alpha)
        if not d.short:
            self._short_since = None
            return
        if self._short_since is None or c.feedback - self._short_since >= RECENT:
            self._short_since = c.feedback
            log.warning(
                "coverage of the last %d feedbacks is %.3f, below the target %.3f beyond noise "
                "(Clopper-Pearson 95%%): the traffic may have shifted; check the policy on "
                "recent traces (ccpo check) or let κ adapt (adapt_kappa)",
                d.n,
                d.coverage,
                d.target,
            )

    def metrics(self) -> ServerMetrics:
        """The shared state as every replica sees it now, with this replica's id (blocking:
        the app awaits :meth:`ametrics`)."""
        return self._metrics(*self.store.refresh())

    async def ametrics(self) -> ServerMetrics:
        """:meth:`metrics` without blocking the event loop."""
        try:
            return self._metrics(*await self.store.arefresh())
        except StateUnavailable as e:
            raise self.withheld(503, "state_unavailable", _STATE_AWAY, e) from None

    def _metrics(self, tracker: OnlineThreshold, c: Counters) -> ServerMetrics:
        if self.cfg.adapt_kappa:
            self.agent.kappa = tracker.kappa
        point = self.agent.kappa is None
        d = drift(c, self.agent.alpha)
        return ServerMetrics(
            requests=c.requests,
            errors=c.errors,
            rejected=c.rejected,
            dollars_spent=c.spent_usd,
            cost_usd=c.cost_usd,
            mean_set_size=c.set_size_sum / c.requests if c.requests else None,
            mean_rounds=c.rounds_sum / c.requests if c.requests else None,
            feedback=c.feedback,
            coverage=c.covered / c.feedback if c.feedback else None,
            recent_coverage=d.coverage,
            recent_feedback=d.n,
            coverage_target=d.target,
            coverage_short=d.short,
            kappa=self.agent.kappa,
            kappa_artifact=self.kappa_artifact,
            kappa_lower=None if point else self.kappa_bounds.kappa_range[0],
            kappa_upper=None if point else self.kappa_bounds.kappa_range[1],
            kappa_level=None if self.kappa_bounds.scores is None else tracker.level,
            kappa_moves=c.kappa_moves,
            kappa_clamped=c.kappa_clamped,
            alpha=self.agent.alpha,
            adapt_kappa=self.cfg.adapt_kappa,
            budget_usd=self.agent.config.max_cost_total,
            inflight_usd=c.inflight_usd,
            reserved_usd=c.reserved_usd,
            replica=self.store.replica,
            state_commits=self.store.engine.commits,
            state_commits_whole=self.store.engine.commits_whole,
            state_commits_here=self.store.engine.commits_here,
            route_embeddings=self.agent.route_embeddings,
            route_fallbacks=self.agent.route_fallbacks,
            uptime_s=time.monotonic() - self.started,
            hedged=self.agent.hedged,
            hedges_cancelled=self.agent.hedges_cancelled,
            errors_by_kind=dict(self.failures),
        )

    def health(self) -> Health:
        """``ok``, or ``degraded`` with why (the state database is away: questions get 503
        until it is back; or the policy failed on the last :data:`POLICY_FAILURES` questions);
        answered without touching the database."""
        a = self.agent
        away = self.store.health()
        # the driver's reason may name the database's host and port: the log has it
        why = None if away is None else state_away(away)
        failed = self._policy_failures
        if why is None and len(failed) >= POLICY_FAILURES:
            why = (
                f"the policy failed on the last {len(failed)} questions ({failed[-1]}); see the log"
            )
        return Health(
            status="ok" if why is None else "degraded",
            policy=a.policy.variant,
            horizon=a.horizon,
            alpha=a.alpha,
            kappa=a.kappa,
            detail=why,
        )

    async def aclose(self) -> None:
        """Stop: questions still running (cancelled by the server after its grace period)
        settle first, their cut-off calls at the worst case; then what is pending is written
        and the lease ends (:meth:`StateStore.close`)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout=5.0)
        except TimeoutError:
            log.warning("%d questions still running at shutdown", self._active)
        await self.agent.aclose()
        await asyncio.to_thread(self.store.close)
