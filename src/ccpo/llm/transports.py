"""The HTTP transports the client POSTs through, one pooled session per client.

- :class:`_AiohttpTransport`: the default (``aiohttp`` imported and its session made on first
  use, in the running loop; :func:`load_http` imports it ahead of the first question).
- :class:`_HttpxTransport`: over ``httpx.AsyncClient``, made on first use.
- :func:`make_transport` picks one from ``http_backend`` (:data:`HTTP_BACKENDS`; ``auto``
  takes aiohttp when it is installed, else httpx).

A transport's ``post(url, headers, body)`` returns (status, headers, body bytes);
``post_lines(url, headers, body, on_line)`` the same for a streamed reply, whose 2xx body goes
line by line to ``on_line`` as it arrives (and is returned empty); its
``errors`` are the failures below HTTP, ``timeouts`` its time-outs and ``unsent`` the failures
before the request left (never billed). ``RetryPolicy.timeout`` bounds each attempt (aiohttp:
the whole attempt; httpx: each of connect, write and read).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from ccpo.errors import CCPOError


def load_http() -> None:
    """Import the default HTTP transport (``aiohttp``) now: a long-lived agent does this when it
    is made, so that its first question does not pay the import (``import ccpo.runtime`` does
    not)."""
    import aiohttp  # noqa: F401


HTTP_BACKENDS = ("auto", "aiohttp", "httpx")


class _Transport:
    """What both transports hold: the time-out of an attempt and the failures they tell apart,
    the built-in ones until their library is imported on first use."""

    name: str

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        #: a failure below HTTP (mapped by :func:`transport_error`)
        self.errors: tuple[type[BaseException], ...] = (OSError,)
        self.timeouts: tuple[type[BaseException], ...] = (TimeoutError,)
        #: failures before the request left (no connection): never billed
        self.unsent: tuple[type[BaseException], ...] = (ConnectionRefusedError,)


class _AiohttpTransport(_Transport):
    """POSTs over one pooled ``aiohttp`` session (aiohttp imported and the session made on
    first use, in the running loop)."""

    name = "aiohttp"

    def __init__(self, timeout: float) -> None:
        if importlib.util.find_spec("aiohttp") is None:
            raise ImportError("aiohttp")
        super().__init__(timeout)
        self._session: Any = None

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, bytes]:
        async with self._open().post(url, data=body, headers=headers) as r:
            return r.status, r.headers, await r.read()

    async def post_lines(
        self, url: str, headers: dict[str, str], body: bytes, on_line: Callable[[bytes], None]
    ) -> tuple[int, Any, bytes]:
        async with self._open().post(url, data=body, headers=headers) as r:
            if not 200 <= r.status < 300:
                return r.status, r.headers, await r.read()
            async for line in r.content:
                on_line(line)
            return r.status, r.headers, b""

    def _open(self) -> Any:
        """The session (made on first use)."""
        if self._session is None:
            import aiohttp

            self.errors = (aiohttp.ClientError, OSError)
            self.unsent = (aiohttp.ClientConnectorError, ConnectionRefusedError)
            self._session = aiohttp.ClientSession(
                # the client's semaphores bound the connections per endpoint
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _HttpxTransport(_Transport):
    """POSTs over one pooled ``httpx.AsyncClient`` (made on first use)."""

    name = "httpx"

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self._client: Any = None

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, bytes]:
        r = await self._open().post(url, content=body, headers=headers)
        return r.status_code, r.headers, r.content

    async def post_lines(
        self, url: str, headers: dict[str, str], body: bytes, on_line: Callable[[bytes], None]
    ) -> tuple[int, Any, bytes]:
        async with self._open().stream("POST", url, content=body, headers=headers) as r:
            if not 200 <= r.status_code < 300:
                return r.status_code, r.headers, await r.aread()
            async for line in r.aiter_lines():
                on_line(line.encode("utf-8"))
            return r.status_code, r.headers, b""

    def _open(self) -> Any:
        """The client (made on first use)."""
        if self._client is None:
            import httpx

            self.errors = (httpx.TransportError, OSError)
            self.timeouts = (TimeoutError, httpx.TimeoutException)
            self.unsent = (httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError)
            self._client = httpx.AsyncClient(
                timeout=self._timeout,
                follow_redirects=True,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def make_transport(backend: str, timeout: float) -> _AiohttpTransport | _HttpxTransport:
    """The HTTP transport for ``backend`` (``auto`` | ``aiohttp`` | ``httpx``): ``auto`` takes
    aiohttp when it is installed, else httpx."""
    if backend not in HTTP_BACKENDS:
        raise CCPOError(f"http backend must be one of {', '.join(HTTP_BACKENDS)}, not '{backend}'")
    if backend == "httpx":
        return _HttpxTransport(timeout)
    try:
        return _AiohttpTransport(timeout)
    except ImportError:
        if backend == "aiohttp":
            raise CCPOError("the aiohttp HTTP backend needs aiohttp: pip install aiohttp") from None
        return _HttpxTransport(timeout)
