"""``ccpo serve``: the deployed agent over HTTP (FastAPI + uvicorn, the optional extra ``serve``).

Endpoints (the OpenAPI spec is served at ``/openapi.json`` and committed as
``docs/openapi.json``):

- ``POST /v1/answer`` ``{"question", "id"?, "context"?, "max_cost_usd"?}`` → an
  :class:`~ccpo.runtime.answer_set.AnswerSet`, with the one ``answer`` and the ``guarantee``
  (single or set, target 1 − α, against gold or a reference model). Re-sending an id with
  the same question returns the stored answer set (no new spending); the same id with another
  question is a 409.
- ``POST /v1/feedback`` ``{"id", "correct_answer"}``, ``{"id", "none_of_them": true}`` or
  ``{"id", "unanswerable": true}`` (counted as covered, as in calibration) →
  updates the running coverage estimate and, with ``adapt_kappa``, κ (the training tracker,
  :mod:`ccpo.runtime.feedback`).
- ``POST /v1/chat/completions``: the same, OpenAI-compatible, so that existing OpenAI clients
  switch by changing ``base_url``: model ``ccpo``, the last user message is the question; the
  reply's content is a single-answer policy's one answer, or a set policy's answer set (one
  answer per line) (:func:`~ccpo.runtime.schemas.chat_content`), and the full
  ``ccpo.answer/v1`` object rides alongside as ``ccpo``. A ``chat`` policy passes the whole
  conversation on and replies with the chosen reply, whole; another family says what it drops
  (``X-CCPO-Dropped``, a log line). ``extra_body={"ccpo": {"id", "context",
  "max_cost_usd"}}`` passes the native fields.
- ``GET /healthz`` (never needs auth), ``GET /metrics`` (Prometheus text format: requests,
  dollars, set size, rounds, coverage on feedback, κ with its band and every move, latency
  histograms: :mod:`ccpo.runtime.latency`) and
  ``GET /metrics.json`` (the same as JSON).

Rails, all checked before a request body is read: optional bearer token
(``server.auth_token_env`` / ``$CCPO_SERVE_TOKEN`` / ``server.auth_token``; compared in
constant time, never logged); per-client token-bucket rate limits (requests and, separately,
feedbacks) → 429, keyed by the peer's address (``X-Forwarded-For`` is believed only from
``server.trusted_proxies``; the limiters remember at most ``max_clients`` addresses); bodies
over ``max_body_bytes`` → 413. Before those, in the connection itself
(:mod:`ccpo.runtime.http.connections`): a request head slower than ``header_timeout`` or a body
slower than ``body_timeout`` → 408 and closed; a head over 16 kB → 431 and closed; what the
HTTP parser refuses → 400 and closed; connections
over ``max_connections`` → 503 and closed. Then: questions over ``max_question_chars`` → 422;
per-request budget → 402; total budget spent → 503; an LLM endpoint that still fails after its
retries, or refuses ccpo's key or model → 502 (a short reason and the request's id: the
endpoint, its host and port and what it said are in the server log only, as is the state
database's URL), with nothing recorded for that request but the dollars it paid; a question
a replay endpoint (``ccpo replay-server``) does not hold → 404 ``not_recorded``; the state
database away → 503 ``state_unavailable`` before any LLM call (``/healthz`` then answers 503
``degraded``); the server stopping past its grace period → 503 ``shutting_down``; text the
database cannot store (NUL) → 422. A retry of an id
still being answered waits for that answer. Every error body is ``{"error": {"type": ...,
"message": ...}}``, a bug's 500 (``internal_error``; ``policy_error`` when the policy itself
fails on a question, with any error of its own: counted, ``x-should-retry: false``,
``/healthz`` degraded after three in a row) included; every 5xx is counted by kind
(``ccpo_server_errors``). Refused requests are counted in memory, not written one by one.

The module holds the app (routes, error handlers, the Prometheus export, uvicorn's settings);
the connection guard, where ``serve`` reaches into uvicorn, is :mod:`ccpo.runtime.http`;
the service it serves is :mod:`ccpo.runtime.service`, the wire models
:mod:`ccpo.runtime.schemas`, the rails that run before a body is read
:mod:`ccpo.runtime.rails`.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ccpo import __version__
from ccpo.errors import CCPOError
from ccpo.llm import tracing
from ccpo.llm.wire import ReplySink, reply_sink, request_sampling

try:
    import uvicorn
    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError:  # pragma: no cover - exercised in a subprocess test
    raise CCPOError(
        "ccpo serve needs FastAPI, uvicorn and prometheus-client: pip install 'ccpo[serve]'"
    ) from None

from ccpo.runtime.answer_set import AnswerSet
from ccpo.runtime.http.connections import connection_limits, guarded_protocol
from ccpo.runtime.latency import Latency
from ccpo.runtime.rails import Guard, error_response
from ccpo.runtime.schemas import (
    UNSTORABLE,
    AnswerRequest,
    ApiError,
    ChatCompletion,
    ChatCompletionRequest,
    ErrorBody,
    FeedbackRequest,
    FeedbackResponse,
    Health,
    ServerMetrics,
    chat_completion,
    chat_completion_chunks,
    chat_content,
    completion_chunk,
    dropped,
    finish_reason,
)
from ccpo.runtime.service import Service

__all__ = ["Service", "create_app", "openapi_spec", "run", "uvicorn_config"]

log = logging.getLogger("ccpo.serve")


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": desc}
    for code, desc in (
        (401, "missing or wrong bearer token"),
        (413, "request body too large"),
        (422, "invalid request (the message says which field and why)"),
        (429, "rate limit exceeded"),
    )
}
_ANSWER_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    402: {"model": ErrorBody, "description": "the per-request budget would be exceeded"},
    404: {
        "model": ErrorBody,
        "description": "not_recorded: the question is not in the recorded traces that the "
        "LLM endpoints replay (ccpo replay-server)",
    },
    409: {"model": ErrorBody, "description": "id already used for another question"},
    502: {"model": ErrorBody, "description": "an LLM endpoint failed after its retries"},
    503: {
        "model": ErrorBody,
        "description": "the total budget is spent (budget_exhausted), has no room after "
        "budget_wait (budget_busy, with Retry-After), the state database is away "
        "(state_unavailable: no LLM call was made), or the server is stopping (shutting_down)",
    },
}
_FEEDBACK_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    404: {"model": ErrorBody, "description": "unknown (or expired) id"},
    409: {"model": ErrorBody, "description": "feedback already given for this id"},
    503: {"model": ErrorBody, "description": "the state database is away (state_unavailable)"},
}


# ----------------------------------------------------------------------------- Prometheus
_COUNTERS = {  # Metrics field -> (Prometheus name, help)
    "requests": ("ccpo_requests", "questions answered"),
    "errors": ("ccpo_errors", "questions that failed (upstream error, budget)"),
    "rejected": ("ccpo_rejected", "requests refused before any LLM call"),
    "dollars_spent": ("ccpo_spent_usd", "USD paid to the LLM endpoints"),
    "cost_usd": ("ccpo_cost_usd", "sum of cost_usd of answered questions (usage x price)"),
    "feedback": ("ccpo_feedback", "feedbacks received"),
    "kappa_moves": ("ccpo_kappa_moves", "feedbacks that moved kappa"),
    "kappa_clamped": ("ccpo_kappa_clamped", "kappa steps cut short by the step bound or band"),
    "state_commits": ("ccpo_state_commits", "write transactions this replica committed"),
    "state_commits_whole": ("ccpo_state_commits_whole", "of them, sent whole (one statement)"),
    "state_commits_here": ("ccpo_state_commits_here", "of those, committed on the event loop"),
    "route_embeddings": ("ccpo_route_embeddings", "question embeddings asked before routing"),
    "route_fallbacks": ("ccpo_route_fallbacks", "of them, missing: routed by the text alone"),
    "hedged": ("ccpo_hedged", "guide calls sent ahead (hedge_above)"),
    "hedges_cancelled": ("ccpo_hedges_cancelled", "of them, cancelled as not needed"),
}
_GAUGES = {
    "mean_set_size": ("ccpo_mean_set_size", "mean number of answers returned"),
    "mean_rounds": ("ccpo_mean_rounds", "mean rounds run per question"),
    "coverage": ("ccpo_coverage", "share of feedback that was covered"),
    "recent_coverage": ("ccpo_recent_coverage", "coverage over the last 200 feedbacks"),
    "recent_feedback": ("ccpo_recent_feedback", "feedbacks in the recent coverage window"),
    "coverage_target": ("ccpo_coverage_target", "the coverage target 1 - alpha"),
    "coverage_short": (
        "ccpo_coverage_short",
        "1 if recent coverage is below 1 - alpha beyond noise (Clopper-Pearson 95%)",
    ),
    "kappa": ("ccpo_kappa", "kappa in force"),
    "kappa_artifact": ("ccpo_kappa_artifact", "kappa of the artifact (or the config)"),
    "kappa_lower": ("ccpo_kappa_lower", "the lowest kappa feedback may reach"),
    "kappa_upper": ("ccpo_kappa_upper", "the highest kappa feedback may reach"),
    "kappa_level": ("ccpo_kappa_level", "calibration level of online kappa (starts at alpha)"),
    "alpha": ("ccpo_alpha", "target miscoverage alpha"),
    "adapt_kappa": ("ccpo_adapt_kappa", "1 if kappa is updated from feedback"),
    "budget_usd": ("ccpo_budget_usd", "the total budget in USD"),
    "inflight_usd": (
        "ccpo_inflight_usd",
        "USD counted as spent should its replica die: wallets of questions being answered",
    ),
    "reserved_usd": ("ccpo_reserved_usd", "USD reserved: calls in flight and admitted questions"),
    "uptime_s": ("ccpo_uptime_seconds", "seconds since the server started"),
}


class _MetricsCollector:
    """The service's metrics as Prometheus metric families (absent values are left out)."""

    def __init__(self, m: ServerMetrics, latency: Latency | None = None) -> None:
        self.m = m
        self.latency = latency

    def collect(self) -> Any:
        d = self.m.model_dump()
        label = [self.m.replica]  # the shared state's values, as this replica reports them
        for kind, table in ((CounterMetricFamily, _COUNTERS), (GaugeMetricFamily, _GAUGES)):
            for field_, (name, doc) in table.items():
                if d[field_] is not None:  # a gauge with no value yet (counters always have one)
                    family = kind(name, doc, labels=["replica"])
                    family.add_metric(label, float(d[field_]))
                    yield family
        errors = CounterMetricFamily(
            "ccpo_server_errors", "5xx answers of this replica by kind", labels=["replica", "kind"]
        )
        for kind, n in sorted(self.m.errors_by_kind.items()):
            errors.add_metric([*label, kind], float(n))
        yield errors
        for name, doc, h in self.latency.families() if self.latency else ():
            hist = HistogramMetricFamily(name, doc, labels=["replica"])
            hist.add_metric(label, h.cumulative(), h.total)
            yield hist


def prometheus_text(m: ServerMetrics, latency: Latency | None = None) -> bytes:
    """``m`` (and this replica's ``latency`` histograms) in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MetricsCollector(m, latency))
    return generate_latest(registry)


def _dropped(roles: list[str], s: Service, response: Response, qid: str) -> None:
    """Say what a policy of another family than ``chat`` did not pass on to its models of
    messages of these ``roles`` (the system prompt, the earlier turns): the ``X-CCPO-Dropped``
    header and a log line."""
    if s.agent.takes_conversations:
        return
    said = dropped(roles)
    if said:
        response.headers["X-CCPO-Dropped"] = ",".join(said)
        log.info(
            "request %s: %s not passed on (a %s policy answers the last user turn)",
            qid, " and ".join(said), s.agent.family,
        )  # fmt: skip


# ----------------------------------------------------------------------------- the app
def create_app(service: Service | None = None) -> FastAPI:
    """The FastAPI app; ``service=None`` builds it for its OpenAPI spec only."""
    holder: dict[str, Service | None] = {"service": service}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        svc = holder["service"]
        if svc is not None:
            await svc.aclose()

    app = FastAPI(
        title="ccpo serve",
        version=__version__,
        description="A cost-effective LLM agent: a cheap base model, an expensive guide model and "
        "a conformal policy that returns one answer, or an answer set, that is correct (or "
        "agrees with a reference model) with probability ≥ 1 − α. See docs/deploy.md.",
        lifespan=lifespan,
    )
    app.add_middleware(Guard, holder=holder)
    # documents the bearer token in the spec; the check itself runs in Guard, before the body
    bearer = HTTPBearer(auto_error=False, description="the server's token, if it has one")

    def svc() -> Service:
        s = holder["service"]
        if s is None:  # pragma: no cover - spec-only app
            raise ApiError(503, "unavailable", "no policy loaded")
        return s

    async def guarded(_: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Service:
        # async: a sync dependency would hop to a worker thread on every request
        return svc()

    def failed(kind: str) -> None:
        """Count a 5xx answer of this kind (``/metrics``: ``ccpo_server_errors``)."""
        s = holder["service"]
        if s is not None:
            s.failures[kind] += 1

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        if e.status >= 500:
            failed(e.type)
        return error_response(e.status, e.type, e.message, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        parts = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            if err.get("type") == "json_invalid":
                loc, msg = "body", "not valid JSON"
            parts.append(msg if err.get("type") == UNSTORABLE else f"{loc}: {msg}")  # (has it)
        s = holder["service"]
        if s is not None:
            s.store.answers.count_rejected()
        return error_response(422, "invalid_request", "; ".join(parts) or "invalid request")

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:
        failed("internal_error")
        return bug_response(request.method, request.url.path, e)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error_response(
            e.status_code, "http_error", str(e.detail), getattr(e, "headers", None)
        )

    @app.post(
        "/v1/answer",
        response_model=AnswerSet,
        responses=_ANSWER_ERRORS,
        summary="Answer a question with the conformal policy",
    )
    async def answer(req: AnswerRequest, s: Service = Depends(guarded)) -> Response:
        t0 = time.perf_counter()
        # the JSON the store keeps, serialised once (FastAPI would validate and dump again)
        body = await s.answer_json(req)
        took = time.perf_counter() - t0
        s.latency.observe(took, took)
        response = Response(body, media_type="application/json")
        if req.conversation is not None:
            _dropped(req.conversation.roles, s, response, req.id or "(no id)")
        return response

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletion,
        responses={
            **_ANSWER_ERRORS,
            200: {
                "content": {"text/event-stream": {}},
                "description": "the completion; with stream: true, chat.completion.chunk events "
                "(the answer set once the policy stops) and [DONE]",
            },
            404: {
                "model": ErrorBody,
                "description": "unknown model; or not_recorded: the conversation is not in "
                "the recorded traces that the LLM endpoints replay (ccpo replay-server)",
            },
        },
        summary="The same, OpenAI-compatible: model 'ccpo'; the last user message is the question",
    )
    async def chat_completions(
        req: ChatCompletionRequest, response: Response, s: Service = Depends(guarded)
    ) -> ChatCompletion | StreamingResponse:
        t0 = time.perf_counter()
        reply = s.agent.takes_conversations  # a chat policy: the conversation, the reply whole
        try:
            native = req.answer_request(conversation=reply)
            sampling = req.sampling() if reply else None  # (another family ignores them)
        except ApiError:
            s.store.answers.count_rejected()
            raise
        if sampling is not None:  # the chat steps' requests take them (ChatAgent.request)
            departs = sampling.departures(s.agent.config.reply_max_tokens)
            if departs:
                response.headers["X-CCPO-Uncalibrated"] = ",".join(departs)
        pieces: asyncio.Queue[str] = asyncio.Queue()
        token = request_sampling.set(sampling)
        sink = reply_sink.set(ReplySink(pieces.put_nowait) if req.stream and reply else None)
        try:  # (the task runs in a copy of this context: the sampling and the sink)
            answering = asyncio.ensure_future(s.answer(native))
        finally:
            request_sampling.reset(token)
            reply_sink.reset(sink)
        first = asyncio.ensure_future(pieces.get())
        try:
            await asyncio.wait((answering, first), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server stopping: the question stops with it
            first.cancel()
            answering.cancel()
            raise
        if not answering.done():  # the chosen reply is streaming: pass it through as it comes
            return StreamingResponse(
                _passed_through(s, answering, first, pieces, t0),
                media_type="text/event-stream",
                headers=dict(response.headers),
            )
        first.cancel()
        answer_set = answering.result()
        _dropped([m.role for m in req.messages], s, response, answer_set.id)
        if not req.stream:
            took = time.perf_counter() - t0
            s.latency.observe(took, took)
            return chat_completion(answer_set, reply)
        chunks = chat_completion_chunks(answer_set, reply)

        async def events():  # timed as sent: the first content, then [DONE]
            ttft = None
            for c in chunks:
                if ttft is None and c["choices"][0]["delta"].get("content"):
                    ttft = time.perf_counter() - t0
                yield f"data: {json.dumps(c)}\n\n"
            yield "data: [DONE]\n\n"
            took = time.perf_counter() - t0
            s.latency.observe(took if ttft is None else ttft, took)

        return StreamingResponse(
            events(), media_type="text/event-stream", headers=dict(response.headers)
        )

    async def _passed_through(
        s: Service,
        answering: asyncio.Future[AnswerSet],
        first: asyncio.Future[str],
        pieces: asyncio.Queue[str],
        t0: float,
    ) -> AsyncIterator[str]:
        """A chat policy's reply streamed as the upstream writes it (the policy decided to
        return it before it was asked: ``ConformalAgent._streamed_step``): the role, each
        piece as it arrives (time to first token: the first), then what the answer set adds
        (nothing, unless its reply is another), the last chunk with ``finish_reason`` and the
        AnswerSet as ``ccpo``, and ``[DONE]``. A failure after the first piece is an
        ``error`` event (the status was sent)."""
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def event(delta: dict[str, str], finish: str | None = None, **extra: Any) -> str:
            return f"data: {json.dumps(completion_chunk(cid, created, delta, finish, **extra))}\n\n"

        yield event({"role": "assistant", "content": ""})
        sent = first.result()
        yield event({"content": sent})
        ttft = time.perf_counter() - t0
        more: asyncio.Future[str] | None = None
        try:
            while True:
                more = asyncio.ensure_future(pieces.get())
                await asyncio.wait((answering, more), return_when=asyncio.FIRST_COMPLETED)
                if not more.done():  # answered: what came before it is in the queue
                    more.cancel()
                    break
                sent += more.result()
                yield event({"content": more.result()})
            while not pieces.empty():
                piece = pieces.get_nowait()
                sent += piece
                yield event({"content": piece})
            answer_set = answering.result()
        except ApiError as e:
            if e.status >= 500:
                s.failures[e.type] += 1
            yield f"data: {json.dumps({'error': {'type': e.type, 'message': e.message}})}\n\n"
            yield "data: [DONE]\n\n"
            return
        finally:  # the client gone, or the server stopping: the question stops with it
            if more is not None:
                more.cancel()
            if not answering.done():
                answering.cancel()
        whole = chat_content(answer_set, True)
        if whole != sent:
            rest = whole.removeprefix(sent) if whole.startswith(sent) else whole
            log.warning("request %s: the reply returned is not the one streamed", answer_set.id)
            yield event({"content": rest})
        final = finish_reason(answer_set, True)
        yield event({}, final, ccpo=answer_set.model_dump(mode="json"))
        yield "data: [DONE]\n\n"
        s.latency.observe(ttft, time.perf_counter() - t0)

    @app.post(
        "/v1/feedback",
        response_model=FeedbackResponse,
        responses=_FEEDBACK_ERRORS,
        summary="Report the correct answer of a served question (updates coverage and κ)",
    )
    async def feedback(req: FeedbackRequest, s: Service = Depends(guarded)) -> FeedbackResponse:
        return await s.feedback(req)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
            401: _ERRORS[401],
        },
    )
    async def metrics(s: Service = Depends(guarded)) -> Response:
        """Counters and gauges in the Prometheus text format (auth, no rate limit: for
        scrapers)."""
        text = prometheus_text(await s.ametrics(), s.latency)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics.json", response_model=ServerMetrics, responses={401: _ERRORS[401]})
    async def metrics_json(s: Service = Depends(guarded)) -> ServerMetrics:
        """The same metrics as JSON (counters since the state file was created)."""
        return await s.ametrics()

    @app.get(
        "/healthz",
        response_model=Health,
        responses={503: {"model": Health, "description": "degraded: the state database is away"}},
    )
    async def healthz() -> Health | JSONResponse:
        """Answered without touching the database: 200 ``ok``, or 503 ``degraded`` (with
        why) while the state database is away."""
        h = svc().health()
        return h if h.status == "ok" else JSONResponse(h.model_dump(), status_code=503)

    app.add_middleware(tracing.IncomingContext)  # a caller's traceparent (tracing on only)
    return app


def bug_response(method: str, path: str, e: Exception) -> Any:
    """A bug's JSON 500 (``internal_error``, naming the exception's type only), logged with
    its traceback."""
    log.error("%s %s failed", method, path, exc_info=e)
    return error_response(500, "internal_error", f"the server failed ({type(e).__name__})")


def openapi_spec() -> dict[str, Any]:
    """The OpenAPI document of the app (independent of any policy or config)."""
    return create_app(None).openapi()


def uvicorn_config(service: Service, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for the app: ``X-Forwarded-For`` / ``-Proto`` are believed only from
    ``server.trusted_proxies`` (uvicorn's default would trust them from 127.0.0.1); slow and
    idle clients are bounded by ``header_timeout``, ``body_timeout``, ``keep_alive_timeout``
    and ``max_connections`` (:mod:`ccpo.runtime.http.connections`)."""
    cfg = service.cfg
    trusted = cfg.trusted_proxies
    limits = connection_limits(cfg.max_connections)
    if limits.cap < cfg.max_connections:
        log.warning(
            "max_connections lowered from %d to %d: the open-file limit (ulimit -n) is %s",
            cfg.max_connections, limits.cap, limits.nofile,
        )  # fmt: skip
    return uvicorn.Config(
        create_app(service),
        host=cfg.host,
        port=cfg.port,
        log_level=log_level,
        lifespan="on",
        proxy_headers=bool(trusted),
        forwarded_allow_ips=list(trusted) if trusted else None,
        server_header=False,
        # SIGTERM: questions running get this long; then their calls count at the worst case
        timeout_graceful_shutdown=cfg.shutdown_grace,  # type: ignore[arg-type]
        # slow and idle clients (http/connections.py): deadlines for each request head and
        # body, a cap on open connections, the idle time of a kept-alive one
        http=guarded_protocol(
            cfg.header_timeout, cfg.body_timeout, limits, service.store.answers.count_rejected
        ),
        timeout_keep_alive=cfg.keep_alive_timeout,  # type: ignore[arg-type]
        backlog=limits.backlog,
    )


GC_THRESHOLDS = (10_000, 10, 10)  # Python's default: (700, 10, 10)


def quiet_gc() -> None:
    """Keep the cyclic garbage collector from stalling the event loop while serving: what
    exists once the service is loaded (modules, the policy, FastAPI's app: about 90,000
    objects) is moved out of the collector's sight (``gc.freeze``), and the youngest
    generation is collected every 10,000 allocations instead of 700. Measured at c=64
    (docs/decisions.md): full collections took 53–63 ms every 1.6 s (every question in
    flight and ``/healthz`` waited); after, 7–10 ms, and the collector's time fell from
    about 10% of the loop's to 1%."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(service: Service, log_level: str = "info") -> None:  # pragma: no cover - CLI path
    host = service.cfg.host
    if host not in ("127.0.0.1", "localhost", "::1") and service.token is None:
        log.warning("serving on %s without a bearer token: anyone who can reach it can spend", host)
    quiet_gc()
    uvicorn.Server(uvicorn_config(service, log_level)).run()
