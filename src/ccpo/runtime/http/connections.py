"""Bounded connections for ``ccpo serve``: slow or idle clients cannot hold the server.

uvicorn alone waits forever for a request head or body that trickles in, and accepts
connections until the process runs out of file descriptors. :func:`guarded_protocol` closes
that gap in the connection itself, a subclass of uvicorn's own HTTP protocol (h11 or httptools,
as ``http="auto"`` picks it), with the settings of :class:`~ccpo.runtime.config.ServerConfig`:
``header_timeout`` and ``body_timeout`` (a head or body slower than that: 408 and closed),
``max_connections`` (one more: 503 and closed; the cap fitted to ``ulimit -n`` by
:func:`connection_limits`), a head over :data:`MAX_HEAD_BYTES` (431 and closed, whichever
parser runs), a request the parser refuses or with both Content-Length and Transfer-Encoding
(400); ``keep_alive_timeout`` is uvicorn's own timer. This is a rail, not a fast path: it is
always on. Its replies are the server's one JSON error body with ``connection: close``,
written to the socket directly. Connections are counted in uvicorn's own set of open
connections, which every close path leaves through ``connection_lost``.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ccpo.runtime.rails import error_response

log = logging.getLogger("ccpo.serve")

#: file descriptors kept back from ``max_connections`` for everything else the process opens
#: (the listening socket, the state file, the LLM endpoints' connections, logs), besides the
#: connections accepted in one turn of the event loop (see :func:`connection_limits`)
BASE_FDS = 64
#: uvicorn's ``backlog`` (its default): the kernel's queue of connections not yet accepted, and
#: the most asyncio accepts in one turn of its loop; lowered under a low open-file limit, where
#: that many at once could run the process out of descriptors before the cap closes them
MAX_BACKLOG = 2048
#: seconds a connection refused over the cap waits for its request's first bytes before it is
#: closed (see ``GuardedHTTPProtocol.connection_made``)
REFUSE_LINGER = 0.1
#: the most bytes a request head may take (h11's default limit, applied to httptools too)
MAX_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    """What ``serve`` can hold under the process's open-file limit ``nofile``: ``cap``
    connections at once, accepting at most ``backlog`` in one turn of the event loop."""

    cap: int
    backlog: int
    nofile: int | None  # None: no limit


def _raw_error(status: int, reason: str, type_: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response (the one JSON error body) that closes the connection."""
    body = bytes(error_response(status, type_, message).body)
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def _two_lengths(headers: list[tuple[bytes, bytes]]) -> bool:
    """A request head with both Content-Length and Transfer-Encoding: two answers to where its
    body ends, which a proxy in front may read the other way (request smuggling)."""
    names = {name.lower() for name, _ in headers}
    return b"content-length" in names and b"transfer-encoding" in names


#: the reply to a request the HTTP parser refuses (see :func:`json_errors_protocol`)
BAD_REQUEST = _raw_error(
    400,
    "Bad Request",
    "bad_request",
    "malformed HTTP request (request line, headers, Content-Length or Transfer-Encoding)",
)


def connection_limits(wanted: int) -> ConnectionLimits:
    """``wanted`` connections, or fewer: past the open-file limit (``ulimit -n``) uvicorn
    cannot accept any connection at all. The soft limit is raised first, within the hard one,
    as far as ``wanted`` needs (as Go and nginx do; the hard limit, ``ulimit -Hn``, is the
    operator's). Kept free: :data:`BASE_FDS` for the rest of the process, and four times
    ``backlog``: connections refused but lingering for their request (at most ``backlog``)
    and three turns of the event loop's accepting (``backlog`` each), which are open before
    the cap can close them (asyncio accepts in one turn, makes the transport in the next,
    calls ``connection_made`` in the one after). ``backlog`` is uvicorn's default
    (:data:`MAX_BACKLOG`) when the limit leaves room for it, else a 32nd of the limit (at least
    8): a shorter queue costs a client arriving in a burst a retried SYN (a second or more),
    never a file descriptor the process does not have."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + BASE_FDS + 4 * MAX_BACKLOG
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):  # pragma: no cover - a platform that refuses
                pass
    if soft == resource.RLIM_INFINITY:
        return ConnectionLimits(wanted, MAX_BACKLOG, None)
    backlog = min(MAX_BACKLOG, max(8, soft // 32, (soft - BASE_FDS - wanted) // 4))
    return ConnectionLimits(max(1, min(wanted, soft - BASE_FDS - 4 * backlog)), backlog, soft)


def json_errors_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (as ``http="auto"`` picks it) whose reply to a request its
    parser refuses (a garbage request line, a bad Content-Length, both Content-Length and
    Transfer-Encoding, ...) is the JSON error, not uvicorn's text/plain; the connection is
    closed, as uvicorn closes it. The base of :func:`guarded_protocol`; alone for
    ``replay-server``."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class JSONErrorsProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def send_400_response(self, msg: str) -> None:
            self.transport.write(BAD_REQUEST)
            self.transport.close()

    return JSONErrorsProtocol


def guarded_protocol(
    header_timeout: float,
    body_timeout: float,
    limits: ConnectionLimits,
    on_body_timeout: Callable[[], None] | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (as ``http="auto"`` picks it) with a deadline for each
    request head and body and at most ``limits.cap`` open connections (see the module doc and
    :func:`connection_limits`). ``on_body_timeout()`` is called for each request refused for a
    slow body (to count it)."""
    head_reply = _raw_error(
        408, "Request Timeout", "timeout", f"request head not received within {header_timeout:g} s"
    )
    body_reply = _raw_error(
        408, "Request Timeout", "timeout", f"request body not received within {body_timeout:g} s"
    )
    busy_reply = _raw_error(
        503,
        "Service Unavailable",
        "busy",
        f"too many open connections ({limits.cap}); retry shortly",
    )
    head_too_large = _raw_error(
        431,
        "Request Header Fields Too Large",
        "head_too_large",
        f"request head over {MAX_HEAD_BYTES} bytes",
    )
    full = [False]  # the cap was reached (warned once until a connection fits again)

    class GuardedHTTPProtocol(json_errors_protocol()):  # type: ignore[misc]
        """A connection with a deadline for each request head and body and a place among at
        most ``cap`` open connections. The phase is read from uvicorn's request cycle (the same
        attributes in h11 and httptools): no cycle, or its response complete → waiting for a
        head; a cycle still receiving its body → the body's deadline; otherwise none."""

        max_open = limits.cap
        max_lingering = limits.backlog  # refused connections waiting for their request

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)  # joins uvicorn's server_state.connections
            self._deadline: asyncio.TimerHandle | None = None
            self._phase: str | None = None  # "head" | "body" | None: what the timer waits for
            self._cycle_seen: Any = None
            self._head_bytes = 0  # bytes received of a request head not complete yet
            self._refused = len(self.connections) > self.max_open
            if self._refused:
                if not full[0]:
                    full[0] = True
                    log.warning("%d connections open: refusing more (503)", self.max_open)
                transport.write(busy_reply)
                # closed once the request's first bytes are read (closing with them unread
                # would reset the connection, and the client might never see the 503), or
                # after REFUSE_LINGER s; at once if too many are lingering already.
                # connection_lost then frees the place and the file descriptor.
                if len(self.connections) > self.max_open + self.max_lingering:
                    transport.close()
                else:
                    self._deadline = self.loop.call_later(REFUSE_LINGER, transport.close)
                return
            full[0] = False
            self._arm("head")

        def _arm(self, phase: str) -> None:
            self._disarm()
            secs = header_timeout if phase == "head" else body_timeout
            self._phase = phase
            self._deadline = self.loop.call_later(secs, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline, self._phase = None, None

        def _ours(self) -> bool:
            """The connection is open and still HTTP (not closing, not handed to WebSocket)."""
            return not self.transport.is_closing() and self.transport.get_protocol() is self

        def _track(self) -> None:
            """(Re)arm or disarm the deadline for the phase the connection is now in."""
            cycle = self.cycle
            if cycle is not self._cycle_seen:  # a new request head is complete: met
                self._cycle_seen = cycle
                self._disarm()
                if cycle is not None and _two_lengths(cycle.scope["headers"]):
                    # h11 lets Transfer-Encoding win (httptools refuses it itself): refused
                    # before the app, whose task has not run yet, reads a body or answers
                    cycle.disconnected = True
                    self.send_400_response("")
                    return
            if cycle is None or cycle.response_complete:
                want: str | None = "head"  # bytes of a (next) request head have arrived
            elif cycle.more_body:
                want = "body"
            else:
                want = None  # the whole request is in: the app's time is not limited here
            if want is None:
                self._disarm()
            elif self._phase != want:
                self._arm(want)

        def data_received(self, data: bytes) -> None:
            if self._refused:  # the 503 is written: the request is read, unparsed, and closed
                self.transport.close()
                return
            super().data_received(data)
            if self._ours():
                self._track()
                self._head_bytes = self._head_bytes + len(data) if self._phase == "head" else 0
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._disarm()
                    self.transport.write(head_too_large)
                    self.transport.close()
            else:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._head_bytes = 0
            if not self._ours():
                self._disarm()
            elif self.cycle is not self._cycle_seen:  # a pipelined request has started
                self._track()
            else:  # idle until the next request's first byte: uvicorn's keep-alive timer
                self._disarm()

        def _expired(self) -> None:
            phase = self._phase
            self._deadline, self._phase = None, None
            if not self._ours():
                return
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
            if phase == "body":
                if not self.cycle.response_started:  # never a 408 in the middle of an answer
                    self.transport.write(body_reply)
                    if on_body_timeout is not None:
                        on_body_timeout()
                log.info("%s: request body not received within %g s: closed", client, body_timeout)
            else:
                self.transport.write(head_reply)
                log.info(
                    "%s: request head not received within %g s: closed", client, header_timeout
                )
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self._disarm()
            super().send_400_response(msg)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)  # leaves server_state.connections

    return GuardedHTTPProtocol
