"""OpenTelemetry traces of the deployed agent: one span per question, a child span per LLM call.

Off unless the standard OTLP settings ask for it: ``ccpo serve`` calls
:func:`configure_from_env`, which turns tracing on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and neither ``OTEL_SDK_DISABLED=true`` nor
``OTEL_TRACES_EXPORTER=none`` says otherwise); the SDK reads every other ``OTEL_*`` setting
itself. Spans leave over OTLP/HTTP from a background batch processor, flushed at exit. Unset,
nothing of OpenTelemetry is imported and the two hooks (:func:`question`, :func:`llm_call`)
cost one attribute test each; set without the ``otel`` extra, the command stops.

Spans follow the GenAI semantic conventions (semconv 1.37+): ``invoke_agent ccpo`` per question
(:class:`_Question`, one ``ccpo.round`` event per round) and ``chat <model>`` per call (a reused
step makes no call and has no span). A W3C ``traceparent`` makes the question a child of the
caller's span (:class:`IncomingContext`). Prompts and answers are exported only on the
conventions' opt-in; API keys and URLs never (an endpoint's host and port only).

Contract (the span tree, attributes, privacy): docs/deploy.md, "OpenTelemetry traces".
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ccpo import __version__
from ccpo.errors import CCPOError, require_extra

#: the settings that turn tracing on (either)
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
CONTENT_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SERVICE_NAME = "ccpo"
OPENAI_HOST = "api.openai.com"

_state: dict[str, Any] = {"tracer": None, "content": False}
_question: contextvars.ContextVar[_Question | None] = contextvars.ContextVar(
    "ccpo_trace_question", default=None
)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def wanted(env: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP endpoint variable that asks for traces, or None when tracing stays off."""
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return None
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    return next((v for v in ENDPOINT_VARS if env.get(v, "").strip()), None)


def configure_from_env() -> str | None:
    """Turn tracing on when the ``OTEL_*`` environment variables ask for it (docs/deploy.md,
    "OpenTelemetry traces"; the SDK reads them from the environment too); returns where spans go
    (``scheme://host:port``, never the path or credentials) or None (off).

    :class:`CCPOError` when they ask for something ccpo cannot do (OTLP over gRPC) and
    :class:`~ccpo.errors.MissingExtraError` when the ``otel`` extra is not installed."""
    env = os.environ
    var = wanted(env)
    if var is None:
        return None
    for p in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        proto = env.get(p, "").strip().lower()
        if proto and proto != "http/protobuf":
            raise CCPOError(
                f"{p}={proto}: ccpo exports traces over OTLP/HTTP only (http/protobuf); point "
                f"{var} at the collector's HTTP port (4318) and unset {p}"
            )
        if proto:
            break
    where = _origin(env[var])
    if where is None:
        raise CCPOError(f"{var} must be an http:// or https:// URL, e.g. http://collector:4318")
    purpose = f"{var} is set: exporting OpenTelemetry traces"
    for module in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"):
        require_extra(module, "otel", purpose)
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # none yet (opentelemetry-instrument makes one)
        ours = {"service.name": SERVICE_NAME, "service.version": __version__}
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over ccpo's defaults
        resource = Resource.create({**ours, **OTELResourceDetector().detect().attributes})
        provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER is read here
        exporter = OTLPSpanExporter()  # endpoint, headers, timeout, ... from the environment
        provider.add_span_processor(BatchSpanProcessor(exporter))  # flushed at exit (atexit)
        # ccpo's own, not the global one: FastAPI's built-in telemetry follows the global
        # provider and so stays off; a question's trace is the tree docs/deploy.md shows
    _state.update(
        tracer=provider.get_tracer("ccpo", __version__), content=_truthy(env.get(CONTENT_VAR))
    )
    return where


def _origin(url: str) -> str | None:
    """``scheme://host[:port]`` of an http(s) URL (no user info, path or query), else None."""
    u = urlsplit(url.strip())
    try:
        port = u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not u.hostname:
        return None
    return f"{u.scheme}://{u.hostname}{f':{port}' if port else ''}"


def _set(span: Any, attrs: dict[str, Any]) -> None:
    """Set the attributes whose value is not None (OpenTelemetry refuses None)."""
    span.set_attributes({k: v for k, v in attrs.items() if v is not None})


def _failed(span: Any, e: BaseException) -> None:
    """A span's error: the exception's type only (its message may hold a URL or a reply)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", type(e).__name__)
    span.set_status(Status(StatusCode.ERROR, type(e).__name__))


@contextlib.contextmanager
def _span(name: str, kind: str, attrs: dict[str, Any]) -> Iterator[Any]:
    """A span of ccpo's tracer (``kind``: a ``SpanKind`` name), current while the block runs,
    with ``attrs`` set; an exception out of the block marks it failed (:func:`_failed`)."""
    from opentelemetry.trace import SpanKind

    with _state["tracer"].start_as_current_span(
        name,
        kind=getattr(SpanKind, kind),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        _set(span, attrs)
        try:
            yield span
        except BaseException as e:
            _failed(span, e)
            raise


# ----------------------------------------------------------------------------- the question
class _Question:
    """The question being answered (its span), found by the LLM calls made for it."""

    def __init__(self, span: Any) -> None:
        self.span = span
        self.tokens = [0, 0]

    def round(self, t: int, decision: Any, cost_usd: float, reused: Sequence[str] = ()) -> None:
        """Round ``t``'s decision (C(o_t), π, whether it goes on) as a ``ccpo.round`` event."""
        probs = [float(p) for p in decision.probs]
        attrs = {
            "ccpo.round": t,
            "ccpo.decision": "+".join(decision.actions),
            "ccpo.go_on": bool(decision.go_on),
            "ccpo.fallback": bool(decision.fallback),
            "ccpo.pi.base": probs[0],
            "ccpo.pi.guide": probs[1],
            "ccpo.pi.next": probs[2],
            "ccpo.cost_usd": float(cost_usd),
        }
        if reused:
            attrs["ccpo.reused"] = list(reused)
        self.span.add_event("ccpo.round", attrs)
        self.span.set_attribute("ccpo.decision", attrs["ccpo.decision"])

    def done(self, answer_set: Any) -> Any:
        """The answer set's figures on the span; returns the answer set."""
        _set(
            self.span,
            {
                "ccpo.rounds": answer_set.rounds,
                "ccpo.set_size": len(answer_set.answers),
                "ccpo.cost_usd": float(answer_set.cost_usd),
                "gen_ai.usage.input_tokens": self.tokens[0],
                "gen_ai.usage.output_tokens": self.tokens[1],
            },
        )
        return answer_set


class _Off:
    """What the hooks give when tracing is off: every method does nothing."""

    def round(self, *args: Any, **kwargs: Any) -> None:
        pass

    def done(self, result: Any) -> Any:
        return result


_OFF = _Off()


class _OffContext:
    """What :func:`question` and :func:`llm_call` return when tracing is off: a context made
    once that gives :data:`_OFF` (no generator per question or call on the hot path)."""

    def __enter__(self) -> _Off:
        return _OFF

    def __exit__(self, *exc: object) -> None:
        return None


_OFF_CONTEXT = _OffContext()


def current() -> _Question | _Off:
    """The question being answered in this task (a no-op when tracing is off)."""
    return _question.get() or _OFF


def question(
    agent: Any, qid: str, kappa: float | None
) -> contextlib.AbstractContextManager[_Question | _Off]:
    """The span of one question answered by ``agent`` (a ``ConformalAgent``); the LLM calls
    made inside become its children. Gives what records its rounds and result."""
    if _state["tracer"] is None:
        return _OFF_CONTEXT
    return _question_span(agent, qid, kappa)


@contextlib.contextmanager
def _question_span(agent: Any, qid: str, kappa: float | None) -> Iterator[_Question]:
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": SERVICE_NAME,
        "ccpo.question.id": qid,
        "ccpo.task": agent.task,
        "ccpo.policy": agent.policy.variant,
        "ccpo.alpha": float(agent.alpha),
        "ccpo.kappa": None if kappa is None else float(kappa),
        "ccpo.horizon": int(agent.horizon),
    }
    with _span(f"invoke_agent {SERVICE_NAME}", "INTERNAL", attrs) as span:
        q = _Question(span)
        token = _question.set(q)
        try:
            yield q
        finally:
            _question.reset(token)


class IncomingContext:
    """ASGI middleware: the trace context a request brings (W3C ``traceparent`` /
    ``tracestate`` and ``baggage``, or what ``OTEL_PROPAGATORS`` names) becomes the parent of
    the spans made while it is answered, so that a question joins its caller's trace. With
    tracing off it only passes the request on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if _state["tracer"] is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, propagate

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        token = context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)


# ----------------------------------------------------------------------------- an LLM call
class _Call:
    """One LLM call's span: :meth:`done` records the result on it."""

    def __init__(self, span: Any, request: Any) -> None:
        self.span = span
        self.request = request

    def done(self, res: Any) -> Any:
        _set(
            self.span,
            {
                "gen_ai.response.model": getattr(res, "model", None),
                "gen_ai.response.finish_reasons": [res.finish_reason]
                if res.finish_reason
                else None,
                "gen_ai.usage.input_tokens": int(res.input_tokens),
                "gen_ai.usage.output_tokens": int(res.output_tokens),
                "ccpo.cached": bool(res.cached),
                "ccpo.cost_usd": float(res.cost_usd),
                "ccpo.usage_estimated": bool(res.usage_estimated) or None,
            },
        )
        q = _question.get()
        if q is not None:
            q.tokens[0] += int(res.input_tokens)
            q.tokens[1] += int(res.output_tokens)
        if _state["content"]:
            out = [{"role": "assistant", "parts": [{"type": "text", "content": res.text}]}]
            self.span.set_attribute("gen_ai.output.messages", json.dumps(out))
        return res


def _server(base_url: str | None) -> tuple[str | None, int | None]:
    """``server.address`` / ``server.port`` of an endpoint (never its path or user info)."""
    u = urlsplit(base_url or f"https://{OPENAI_HOST}/v1")
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        port = None
    return u.hostname, port


def llm_call(endpoint: Any, request: Any) -> contextlib.AbstractContextManager[_Call | _Off]:
    """The span of one chat completion (``endpoint``: an ``Endpoint``, ``request``: a
    ``ChatRequest``), cache hits included; gives what records the ``ChatResult``."""
    if _state["tracer"] is None:
        return _OFF_CONTEXT
    return _llm_call_span(endpoint, request)


@contextlib.contextmanager
def _llm_call_span(endpoint: Any, request: Any) -> Iterator[_Call]:
    host, port = _server(endpoint.base_url)
    step = request.step or {}
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai" if host == OPENAI_HOST else "_OTHER",
        "gen_ai.request.model": endpoint.model,
        "gen_ai.request.max_tokens": int(request.max_tokens),
        "gen_ai.request.temperature": float(request.temperature),
        "server.address": host,
        "server.port": port,
        "ccpo.round": int(step["round"]) if "round" in step else None,
        "ccpo.role": step.get("role"),
    }
    if _state["content"]:
        msgs = [
            {"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]}
            for m in request.messages
        ]
        attrs["gen_ai.input.messages"] = json.dumps(msgs)
    with _span(f"chat {endpoint.model}", "CLIENT", attrs) as span:
        yield _Call(span, request)
