"""The fast paths ``answer`` and ``health`` (``server.fast_answer``, ``server.fast_health``):
pure-ASGI layers that answer ahead of FastAPI's middleware stack, routing and validation.

- :class:`FastAnswer`, innermost of the app's middlewares: a ``POST /v1/answer`` whose JSON
  body is a valid :class:`~ccpo.runtime.schemas.AnswerRequest` goes straight to the service,
  its answer set sent as the JSON text the store keeps; anything else goes to the app with its
  body replayed, so that every refusal keeps the app's exact message.
- :class:`FastHealth`, outermost, around the whole app: ``GET /healthz`` answered with the
  route's body (``health``), and ``POST /v1/answer`` sent to the same tracing context, rails
  and :class:`FastAnswer` as inside the app, ahead of FastAPI's own outer middlewares
  (``answer``).

With both switches off the app is FastAPI's alone, and every request takes its routes; the
status codes, bodies and headers are the same either way (``tests/runtime/test_fast_paths.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ccpo.llm import tracing
from ccpo.runtime.rails import Guard, bug_response, error_response
from ccpo.runtime.schemas import AnswerRequest, ApiError

if TYPE_CHECKING:
    from ccpo.runtime.service import Service


class FastAnswer:
    """Pure ASGI, innermost of the middlewares (inside the rails and the tracing context): a
    ``POST /v1/answer`` whose JSON body is a valid :class:`AnswerRequest` goes straight to the
    service, its answer set sent as the JSON text the store keeps (skipping FastAPI's routing,
    body parsing, dependencies and exception middleware). Anything else (another content type,
    a body that does not validate) goes to the app with its body replayed, so that every
    refusal keeps the app's exact message; errors are the same JSON bodies as the app's
    handlers give."""

    def __init__(self, app: Any, holder: dict[str, Service | None]) -> None:
        self.app, self.holder = app, holder

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        svc = self.holder.get("service")
        if (
            svc is None
            or scope["type"] != "http"
            or scope["path"] != "/v1/answer"
            or scope["method"] != "POST"
            or _content_type(scope) != b"application/json"
            or scope.get("ccpo.fast")  # tried already (ahead of FastAPI: FastHealth)
        ):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            m = await receive()
            if m["type"] != "http.request":  # the client went away
                return
            chunks.append(m.get("body", b""))
            more = m.get("more_body", False)
        body = b"".join(chunks)
        try:
            req = AnswerRequest.model_validate_json(body)
        except ValueError:  # the app refuses it, with its own message
            scope["ccpo.fast"] = True
            await self.app(scope, _replayed(body, receive), send)
            return
        try:
            text = await svc.answer_json(req)
        except ApiError as e:
            await error_response(e.status, e.type, e.message, e.headers)(scope, receive, send)
            return
        except Exception as e:  # as the app's handler of bugs does
            await bug_response("POST", "/v1/answer", e)(scope, receive, send)
            return
        data = text.encode()
        headers = [(b"content-length", b"%d" % len(data)), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _content_type(scope: Any) -> bytes:
    for k, v in scope.get("headers") or ():
        if k == b"content-type":
            return v.split(b";", 1)[0].strip().lower()
    return b""


def _replayed(body: bytes, receive: Any) -> Any:
    """``receive`` with the body already read given back first."""
    given = False

    async def again() -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class FastHealth:
    """Pure ASGI, outermost. ``health``: ``GET /healthz`` answered before FastAPI's middleware
    stack, routing and validation (the same body as the route's), so that under load a probe
    waits only for its turn of the event loop. ``answer``: a ``POST /v1/answer`` goes to the
    same rails, tracing context and :class:`FastAnswer` as inside the app, but ahead of
    FastAPI's own outer middlewares (its error handler, telemetry hook and body limit; a bug
    there is the same JSON 500); what FastAnswer does not take goes on to the app, whose rails
    then pass it through (:class:`~ccpo.runtime.rails.Guard` runs once per request).
    Everything else goes to ``app``."""

    def __init__(self, app: Any, service: Service, health: bool = True, answer: bool = True):
        self.app, self.service, self.health, self.ahead = app, service, health, answer
        holder: dict[str, Service | None] = {"service": service}
        self.answer = tracing.IncomingContext(Guard(FastAnswer(app, holder), holder))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.ahead and scope["type"] == "http" and scope["path"] == "/v1/answer":
            await self._answer(scope, receive, send)
            return
        if (
            not self.health
            or scope["type"] != "http"
            or scope["path"] != "/healthz"
            or scope["method"] != "GET"
        ):
            await self.app(scope, receive, send)
            return
        try:
            h = self.service.health()
            body = h.model_dump_json().encode()
        except Exception:  # a bug: the app's route answers it (a JSON 500, logged)
            await self.app(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        status = 200 if h.status == "ok" else 503
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.answer(scope, receive, send)
        except Exception as e:  # a bug: a JSON 500, as FastAPI's error middleware would send
            try:
                await bug_response(scope["method"], scope["path"], e)(scope, receive, send)
            except Exception:  # the response had begun: the server logs the bug
                raise e from None
