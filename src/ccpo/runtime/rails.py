"""The rails of ``ccpo serve`` that run before a request body is read: per-client rate limits
(token buckets), the bearer token, and the body-size limit (:class:`Guard`, a pure-ASGI
middleware; the body limit alone, :class:`BodyLimit`, guards ``ccpo replay-server``), with the
one JSON error body every refusal uses."""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

from ccpo.runtime.schemas import ApiError


def error_response(
    status: int, type_: str, message: str, headers: dict | None = None
) -> JSONResponse:
    """The error body of every refusal: ``{"error": {"type": ..., "message": ...}}``."""
    return JSONResponse(
        {"error": {"type": type_, "message": message}}, status_code=status, headers=headers
    )


def check_bearer(token: str | None, authorization: str | None) -> None:
    """The ``Authorization`` header must carry the bearer ``token`` (if the server has one);
    compared in constant time."""
    if token is None:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        given = ""
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(
            401,
            "unauthorized",
            "missing or wrong bearer token (send 'Authorization: Bearer <token>')",
            {"WWW-Authenticate": "Bearer"},
        )


def check_rate(limiter: RateLimiter | None, client: str, what: str) -> None:
    """``client``'s token bucket in ``limiter`` (None: no limit); ``what`` names the requests
    in the 429's message."""
    if limiter is None:
        return
    wait = limiter.take(client)
    if wait > 0:
        per_minute = limiter.rate * 60.0
        raise ApiError(
            429,
            "rate_limited",
            f"rate limit of {per_minute:g} {what} per minute exceeded; retry in {wait:.1f} s",
            {"Retry-After": str(math.ceil(wait))},
        )


class RateLimiter:
    """Token bucket per client address: ``rate`` per minute, ``burst`` at once; remembers at
    most ``max_clients`` addresses (the least recently seen are forgotten first)."""

    def __init__(self, per_minute: float, burst: int, max_clients: int = 10_000) -> None:
        self.rate, self.burst, self.max_clients = per_minute / 60.0, float(burst), max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str) -> float:
        """0 when allowed, else seconds until the next request would be."""
        now = time.monotonic()
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return 0.0 if allowed else (1.0 - tokens) / self.rate


class _BodyTooLarge(BaseException):
    """Raised by the body reader; a BaseException so that FastAPI's body parser (which turns
    every Exception into a 400) lets it through to :class:`Guard`."""


#: paths behind the bearer token, and whether each is rate-limited (and by which bucket)
_GUARDED: dict[str, str | None] = {
    "/v1/answer": "requests",
    "/v1/chat/completions": "requests",
    "/v1/feedback": "feedback",
    "/metrics": None,  # for scrapers: auth only
    "/metrics.json": None,
}


class Guard:
    """Pure-ASGI middleware: the rails that run before a request body is read or parsed, so
    that junk from an unauthenticated or flooding client costs no parsing and no database
    write: the client's rate limit (429), the bearer token (401), then the body size (413, by
    Content-Length when given, else while streaming)."""

    def __init__(self, app: Any, holder: dict[str, Any]) -> None:
        """``holder["service"]``: the :class:`~ccpo.runtime.service.Service` whose rails
        these are (None: an app built for its OpenAPI spec only, no rails)."""
        self.app, self.holder = app, holder

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        svc = self.holder.get("service")
        if scope["type"] != "http" or svc is None or scope.get("ccpo.guarded"):
            await self.app(scope, receive, send)  # (guarded already: once per request)
            return
        scope["ccpo.guarded"] = True
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        if path in _GUARDED:
            client = (scope.get("client") or ("?", 0))[0]
            bucket = _GUARDED[path]
            try:
                if bucket is not None:
                    svc.check_rate(client, feedback=bucket == "feedback")
                auth = headers.get(b"authorization")
                svc.check_auth(auth.decode("latin-1") if auth is not None else None)
            except ApiError as e:
                svc.store.answers.count_rejected()
                await error_response(e.status, e.type, e.message, e.headers)(scope, receive, send)
                return
        await limit_body(
            self.app, scope, receive, send, svc.cfg.max_body_bytes, svc.store.answers.count_rejected
        )


async def limit_body(
    app: Any, scope: Any, receive: Any, send: Any, limit: int, rejected: Callable[[], Any]
) -> None:
    """Run ``app`` on one HTTP request whose body may hold at most ``limit`` bytes: a 413
    (``too_large``) by its Content-Length when given, else as soon as the body read so far
    passes the limit, before the app parses any of it; ``rejected()`` counts the refusal."""
    headers = dict(scope.get("headers") or [])
    msg = f"request body larger than {limit} bytes"
    try:
        too_big = int(headers.get(b"content-length", b"0")) > limit
    except ValueError:
        too_big = False
    if too_big:
        rejected()
        await error_response(413, "too_large", msg)(scope, receive, send)
        return
    seen = 0
    started = False

    async def recv() -> Any:
        nonlocal seen
        m = await receive()
        if m["type"] == "http.request":
            seen += len(m.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge
        return m

    async def snd(m: Any) -> None:
        nonlocal started
        if m["type"] == "http.response.start":
            started = True
        await send(m)

    try:
        await app(scope, recv, snd)
    except* _BodyTooLarge:
        if not started:
            rejected()
            await error_response(413, "too_large", msg)(scope, receive, send)


class BodyLimit:
    """Pure-ASGI middleware: :func:`limit_body` on every HTTP request (``ccpo replay-server``'s
    rail; ``ccpo serve``'s :class:`Guard` runs it after its own)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await limit_body(self.app, scope, receive, send, self.limit, lambda: None)
