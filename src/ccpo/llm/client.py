"""One OpenAI-compatible chat client for every backend (OpenAI, vLLM, llama.cpp, Ollama, ...).

- A raw HTTP POST of ``/chat/completions`` to each model's ``base_url`` (endpoint), the reply's
  JSON read into the few fields a round needs (text, usage, log-probs): the request and the
  error statuses are the OpenAI API's, without the ``openai`` SDK's per-call overhead (why,
  with the measurement: docs/decisions.md). ``collect``, ``ask`` and ``serve`` all call
  :meth:`LLMClient.chat`. Requests are written and replies parsed by ``orjson`` when it is
  installed (the ``serve`` extra), else by the standard library (:func:`reply_json`).
- Bounded concurrency: one ``asyncio.Semaphore`` per endpoint URL.
- Retries with exponential backoff and full jitter on 429, 408/409, 5xx, time-outs, connection
  errors and malformed responses (every attempt is counted and logged here; ``Retry-After`` /
  ``retry-after-ms`` are honoured). 401/403/404 are the user's to fix and raise a
  ``CCPOError`` at once. Every HTTP status is mapped in one function, :func:`status_error`
  (:func:`auth_error`, :func:`refused_error`).
- Token usage is taken from the response's ``usage`` (estimated as characters/4, and flagged,
  only when an endpoint does not report it).
- Log-probs (``logprobs=True, top_logprobs=k``) are requested by default. An endpoint that
  rejects them (an HTTP 400 or 5xx whose message names log-probs, as llama_cpp.server without
  ``--logits_all`` does) is asked again without, and remembered as "no log-probs" for the
  rest of the run; any other 400 (a context-length error, say) fails that request only. An
  endpoint that ignores them simply yields ``logprobs=None``.
- The cache (:mod:`ccpo.llm.cache`) is consulted first, under the key of the request as it
  is actually sent (so answers without log-probs never pose as answers with them);
  identical requests that are in flight at the same time in one process are coalesced.
  Processes sharing a cache file do not coalesce across processes: two collectors that send
  the same request at the same moment both pay for it (``collect --workers`` deals identical
  questions to the same worker to avoid this).
- ``max_cost`` (USD, from the price table): every paid call first reserves its worst-case
  cost (:func:`worst_case_tokens`: the prompt's bytes plus ``max_tokens``) in the run's
  :class:`SpendLedger` (shared by the worker processes of ``collect --workers``) and settles
  the real cost after, so spending never passes the cap, however many calls are in flight; a
  call that does not fit waits for those in flight, then raises :class:`BudgetExceeded`
  without being sent. A question's own budget (:data:`request_budget`) is checked the same
  way, from its first call on (:class:`RequestBudgetExceeded`).
- HTTP transport: an ``aiohttp`` session by default, an ``httpx`` client otherwise
  (``http_backend``): one pooled session per client; ``RetryPolicy.timeout`` bounds each
  attempt (aiohttp: the whole attempt; httpx: each of connect, write and read).
- API keys come from the environment (``api_key_env``) or a config file, are sent only as the
  ``Authorization`` header of their endpoint, and are never part of a cache key or value. An
  upstream error's text never reaches an error message or a log (providers echo the key they
  were sent, partly masked): only its identifiers do (:func:`error_codes`); a password in an
  endpoint URL is shown as ``***`` (:func:`redact_url`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import dataclasses
import email.utils
import functools
import importlib.util
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ccpo.errors import CCPOError
from ccpo.llm import tracing
from ccpo.llm.cache import ResponseCache, cache_key
from ccpo.traces.prices import PriceTable

try:  # the serve extra: a reply with log-probs parses in about a third of json's time
    import orjson as _orjson
except ImportError:  # pragma: no cover - the core install
    _orjson = None  # type: ignore[assignment]

log = logging.getLogger("ccpo.llm")

DUMMY_API_KEY = "sk-no-key-required"


class LLMCallError(CCPOError):
    """A call failed for good (retries exhausted, or a request the endpoint refuses).
    ``unsure``: its last attempt may have been billed (no reply read; counted at its worst
    case)."""

    unsure: bool = False


class BudgetExceeded(CCPOError):
    """``--max-cost`` was reached; no new paid calls are made."""


def load_http() -> None:
    """Import the default HTTP transport (``aiohttp``) now: a long-lived agent does this when it
    is made, so that its first question does not pay the import (``import ccpo.runtime`` does
    not)."""
    import aiohttp  # noqa: F401


OPENAI_HOST = "api.openai.com"
OPENAI_URL = f"https://{OPENAI_HOST}/v1"


@functools.lru_cache(maxsize=256)  # asked on every call (its key, its headers)
def is_openai_api(base_url: str | None) -> bool:
    """True iff ``base_url`` is the OpenAI API itself: no URL (the SDK's default), or an
    ``https`` URL whose parsed host is exactly ``api.openai.com`` (not a path or a longer host
    that merely contains it)."""
    if base_url is None:
        return True
    try:
        parts = urlsplit(base_url)
        host = (parts.hostname or "").rstrip(".").lower()
    except ValueError:
        return False
    return parts.scheme == "https" and host == OPENAI_HOST


@dataclass(frozen=True)
class Endpoint:
    """A model served at an OpenAI-compatible URL.

    ``api_key_env`` names the environment variable holding the key; ``api_key`` is a key read
    from a config file. With neither, the OpenAI API (no ``base_url``) gets ``OPENAI_API_KEY``
    and any other endpoint a dummy key (local servers ignore it): the OpenAI key is never sent
    to another host unless ``api_key_env`` says so.
    """

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False, compare=False)

    def resolve_key(self) -> str:
        if self.api_key:
            return self.api_key
        if self.api_key_env:
            val = os.environ.get(self.api_key_env)
            if not val:
                raise CCPOError(
                    f"model '{self.model}': environment variable {self.api_key_env} is not set "
                    "(it should hold the API key)"
                )
            return val
        if is_openai_api(self.base_url):
            return os.environ.get("OPENAI_API_KEY") or DUMMY_API_KEY
        # never send the OpenAI key to another host unless asked to (api_key_env)
        return DUMMY_API_KEY

    @property
    def where(self) -> str:
        return (
            f"'{self.model}' at {redact_url(self.base_url) if self.base_url else 'the OpenAI API'}"
        )


@dataclass
class ChatRequest:
    """One chat-completion request (everything that goes into the cache key)."""

    messages: list[dict[str, str]]
    temperature: float = 0.0
    max_tokens: int = 256
    stop: list[str] | None = None
    logprobs: bool = True
    top_logprobs: int = 5
    #: which ladder step sends it (``{"round": "2", "role": "guide"}``): sent as ``X-CCPO-*``
    #: headers, which a replay endpoint reads and real endpoints ignore; not part of the key
    step: dict[str, str] | None = None

    def headers(self) -> dict[str, str]:
        """The ``X-CCPO-Round`` / ``X-CCPO-Role`` headers of :attr:`step`."""
        return {f"X-CCPO-{k.capitalize()}": str(v) for k, v in (self.step or {}).items()}

    def flight_key(self, model: str, sample: int) -> tuple[Any, ...]:
        """What tells this request from another in flight: the fields of
        :meth:`key_fields` and ``sample``, as a tuple (hashed, not serialised)."""
        return (
            model,
            tuple((m["role"], m["content"]) for m in self.messages),
            float(self.temperature),
            int(self.max_tokens),
            tuple(self.stop) if self.stop else None,
            bool(self.logprobs),
            int(self.top_logprobs) if self.logprobs else 0,
            int(sample),
        )

    def key_fields(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in self.messages],
            "temperature": float(self.temperature),
            "max_tokens": int(self.max_tokens),
            "stop": list(self.stop) if self.stop else None,
            "logprobs": bool(self.logprobs),
            "top_logprobs": int(self.top_logprobs) if self.logprobs else 0,
        }


class TokenLogprob:
    """A token's log-prob and ``top``: of its alternatives (``top_logprobs``), those with a
    number, by token. A reply's alternatives are read when ``top`` is first asked for (by the
    response cache or a trace; a live round reads ``logprob`` only)."""

    __slots__ = ("_alts", "_top", "logprob", "token")

    def __init__(
        self,
        token: str,
        logprob: float,
        top: dict[str, float] | None = None,
        *,
        alts: Sequence[Any] = (),
    ) -> None:
        """``top``, or ``alts``: the reply's ``top_logprobs`` entries, read on demand."""
        self.token, self.logprob = token, logprob
        self._top, self._alts = top, alts

    @property
    def top(self) -> dict[str, float]:
        if self._top is None:
            self._top = _alternatives(self._alts)
            self._alts = ()
        return self._top

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenLogprob):
            return NotImplemented
        return (self.token, self.logprob, self.top) == (other.token, other.logprob, other.top)

    def __repr__(self) -> str:
        return f"TokenLogprob(token={self.token!r}, logprob={self.logprob!r}, top={self.top!r})"


@dataclass
class ChatResult:
    """A normalised completion: text, usage, per-token log-probs (or None)."""

    text: str
    input_tokens: int
    output_tokens: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    usage_estimated: bool = False
    cached: bool = False
    cost_usd: float = 0.0
    #: a replay endpoint's recorded parse of this reply (``ccpo_replay``: answer, verdict,
    #: signals), taken as recorded rather than parsed again; None from a real endpoint
    recorded: dict[str, Any] | None = None
    model: str | None = None  # the model that answered, as the response names it (not cached)

    def to_cache(self) -> dict[str, Any]:
        return {
            "recorded": self.recorded,
            "text": self.text,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "logprobs": None
            if self.logprobs is None
            else [[t.token, t.logprob, t.top] for t in self.logprobs],
            "finish_reason": self.finish_reason,
            "usage_estimated": self.usage_estimated,
        }

    @classmethod
    def from_cache(cls, d: dict[str, Any]) -> ChatResult:
        lps = d.get("logprobs")
        return cls(
            text=d["text"],
            input_tokens=int(d["input_tokens"]),
            output_tokens=int(d["output_tokens"]),
            logprobs=None
            if lps is None
            else [TokenLogprob(t, float(lp), dict(top or {})) for t, lp, top in lps],
            finish_reason=d.get("finish_reason"),
            usage_estimated=bool(d.get("usage_estimated", False)),
            cached=True,
            recorded=d.get("recorded"),
        )


@dataclass
class RetryPolicy:
    """Retry and time-out settings (seconds)."""

    max_retries: int = 8
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    timeout: float = 120.0


class _Malformed(Exception):
    pass


class _LogprobsRefused(Exception):
    """The endpoint refused a request because it asked for log-probs."""


_BUDGET_POLL_S = 0.01  # how often a call that does not fit the budget looks again


class RequestBudgetExceeded(CCPOError):
    """A question would exceed its own dollar budget; the call that would have was not sent."""


#: a ledger's fields: USD spent (settled), USD reserved, paid calls in flight, admitted
#: questions, admitted questions waiting for room (all floats, as in shared memory)
LEDGER_FIELDS = ("spent", "reserved", "calls", "admitted", "waiting")


class LedgerSlots:
    """The fields of a process's own ledger (:data:`LEDGER_FIELDS`)."""

    __slots__ = LEDGER_FIELDS

    def __init__(self, spent: float = 0.0) -> None:
        self.spent = spent
        self.reserved = self.calls = self.admitted = self.waiting = 0.0


class SharedSlots(ctypes.Structure):
    """The same fields in memory shared by processes: ``ctx.Value(SharedSlots)``."""

    _fields_ = [(name, ctypes.c_double) for name in LEDGER_FIELDS]


class _Held:
    """The fields of a process's own ledger, as a context manager (no lock needed)."""

    __slots__ = ("values",)

    def __init__(self, values: LedgerSlots) -> None:
        self.values = values

    def __enter__(self) -> LedgerSlots:
        return self.values

    def __exit__(self, *exc: object) -> None:
        return None


class _Locked:
    """The fields of a ledger shared by processes (:class:`SharedSlots`), held under its
    lock."""

    __slots__ = ("lock", "values")

    def __init__(self, shared: Any) -> None:
        self.lock, self.values = shared.get_lock(), shared.get_obj()

    def __enter__(self) -> Any:
        self.lock.acquire()
        return self.values

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class SpendLedger:
    """USD spent by one run, USD reserved for it and the paid calls in flight, against which
    ``max_cost`` is checked.

    Every paid call first reserves its worst-case cost (:meth:`try_reserve`: admitted only if
    spent + reserved + worst ≤ cap) and settles it after (:meth:`settle`: the reservation is
    released and the real cost added), so concurrent calls can never take the spending past
    the cap. A question admitted by :meth:`LLMClient.admit` holds a reservation of its
    estimated cost, from which its calls draw first. By default the ledger is this process's
    own; ``collect --workers`` gives every worker process a ledger on one shared
    ``multiprocessing.Value(SharedSlots)``, so the budget is the run's, not each worker's.
    """

    poll_s = _BUDGET_POLL_S  # how often a call that does not fit looks again
    absolute = False  # True: ``total`` is all money ever spent (the cap is the whole budget)
    ADMITTED, WAITING = "admitted", "waiting"  # the fields :meth:`count` counts in

    def __init__(self, shared: Any | None = None, spent: float = 0.0) -> None:
        self._shared = shared
        self._local = LedgerSlots(float(spent))
        self._held = _Held(self._local) if shared is None else _Locked(shared)

    def _values(self) -> Any:
        """``with self._values() as v``: the fields, under the shared memory's lock if any (an
        object made once, not a generator per use: a call reads or writes them six times)."""
        return self._held

    def try_reserve(
        self,
        usd: float,
        cap: float | None,
        call: bool = False,
        admission: bool = False,
    ) -> bool:
        """Reserve ``usd`` if it fits under ``cap`` (None: always); False, reserving nothing,
        if it does not. ``call``: for a call about to be sent (counted as in flight).
        ``admission``: for a question's wallet, which gives way to admitted questions waiting
        for room (here the client checks :meth:`waiting`; a ledger shared by replicas also
        checks theirs)."""
        with self._values() as v:
            if cap is not None and v.spent + v.reserved + usd > cap * (1 + 1e-12):
                return False
            v.reserved += usd
            v.calls += float(call)
            return True

    async def areserve(
        self,
        usd: float,
        cap: float | None,
        call: bool = False,
        admission: bool = False,
    ) -> bool:
        """:meth:`try_reserve` for the event loop: a ledger kept in a database
        (``ccpo.runtime.state``) awaits its commit here without blocking the loop."""
        return self.try_reserve(usd, cap, call=call, admission=admission)

    def settle(self, reserved: float, spent: float, call: bool = False) -> None:
        """Release a reservation of ``reserved`` and record the ``spent`` it really cost.
        ``call``: a call is back (no longer in flight; ``reserved`` may be less than its
        worst case when the rest stays held for its question). Never blocks (a database
        ledger writes it with its next transaction)."""
        with self._values() as v:
            v.reserved = max(0.0, v.reserved - reserved)
            v.spent += spent
            v.calls = max(0.0, v.calls - float(call))

    def add(self, usd: float) -> None:
        self.settle(0.0, usd)

    @property
    def total(self) -> float:
        """USD spent (settled)."""
        with self._values() as v:
            return float(v.spent)

    @property
    def reserved(self) -> float:
        """USD reserved (calls in flight and admitted questions)."""
        with self._values() as v:
            return float(v.reserved)

    def count(self, slot: str, delta: int) -> None:
        """Count a question in (``delta`` 1) or out (-1) of ``ADMITTED`` or ``WAITING``."""
        with self._values() as v:
            setattr(v, slot, max(0.0, getattr(v, slot) + delta))

    def waiting(self) -> bool:
        """Some admitted question waits for room (questions not yet admitted give way)."""
        with self._values() as v:
            return v.waiting > 0

    def stuck(self, admitted: bool = True) -> bool:
        """Nothing will free room: no call is in flight and every admitted question waits
        (for a question not yet admitted, ``admitted=False``: and none is admitted; the
        admitted ones give way first, and what their wallets held may then admit it)."""
        with self._values() as v:
            return v.calls <= 0 and v.waiting >= v.admitted and (admitted or v.admitted <= 0)


@dataclass
class RequestBudget:
    """The dollar budget of one question (``max_cost_per_request``), checked call by call like
    the run's: see :data:`request_budget`."""

    cap: float
    ledger: SpendLedger = field(default_factory=SpendLedger)


@dataclass
class Envelope:
    """An admitted question's wallet (:meth:`LLMClient.admit`): ``free`` USD held for its calls
    (a call draws its worst case from it and gets back what it did not cost); ``spent``: what
    its paid calls cost so far."""

    free: float
    spent: float = 0.0


#: The budget of the question being answered in this asyncio task (set by the deployed agent);
#: every paid call made on its behalf must fit in it too, round 1 included.
request_budget: contextvars.ContextVar[RequestBudget | None] = contextvars.ContextVar(
    "ccpo_request_budget", default=None
)
_envelope: contextvars.ContextVar[Envelope | None] = contextvars.ContextVar(
    "ccpo_envelope", default=None
)


def worst_case_tokens(request: ChatRequest) -> tuple[int, int]:
    """An upper bound of a request's (input, output) tokens: a token of a byte-level BPE
    tokenizer covers at least one byte, plus a chat template's few tokens per message; the
    output is capped by ``max_tokens``."""
    n_in = sum(len(m["content"].encode("utf-8")) + 8 for m in request.messages) + 16
    return n_in, int(request.max_tokens)


HTTP_BACKENDS = ("auto", "aiohttp", "httpx")


class _AiohttpTransport:
    """POSTs over one pooled ``aiohttp`` session (aiohttp imported and the session made on
    first use, in the running loop)."""

    name = "aiohttp"

    def __init__(self, timeout: float) -> None:
        if importlib.util.find_spec("aiohttp") is None:
            raise ImportError("aiohttp")
        self._timeout = timeout
        self._session: Any = None
        #: a failure below HTTP (mapped by :func:`transport_error`)
        self.errors: tuple[type[BaseException], ...] = (OSError,)
        self.timeouts: tuple[type[BaseException], ...] = (TimeoutError,)
        #: failures before the request left (no connection): never billed
        self.unsent: tuple[type[BaseException], ...] = (ConnectionRefusedError,)

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, bytes]:
        if self._session is None:
            import aiohttp

            self.errors = (aiohttp.ClientError, OSError)
            self.unsent = (aiohttp.ClientConnectorError, ConnectionRefusedError)
            self._session = aiohttp.ClientSession(
                # the client's semaphores bound the connections per endpoint
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        async with self._session.post(url, data=body, headers=headers) as r:
            return r.status, r.headers, await r.read()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _HttpxTransport:
    """POSTs over one pooled ``httpx.AsyncClient`` (made on first use)."""

    name = "httpx"

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._client: Any = None
        self.errors: tuple[type[BaseException], ...] = (OSError,)
        self.timeouts: tuple[type[BaseException], ...] = (TimeoutError,)
        self.unsent: tuple[type[BaseException], ...] = (ConnectionRefusedError,)

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, Any, bytes]:
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
        r = await self._client.post(url, content=body, headers=headers)
        return r.status_code, r.headers, r.content

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


def without_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` part."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


def chat_url(base_url: str | None) -> str:
    """Where a chat completion is POSTed: ``{base_url}/chat/completions``; without a base URL,
    ``$OPENAI_BASE_URL`` or the OpenAI API (as the ``openai`` SDK does)."""
    base = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
    return base.rstrip("/") + "/chat/completions"


def redact_url(url: str) -> str:
    """``url`` as it may be printed or logged: a password in its user info replaced by
    ``***`` (``http://user:***@host/v1``); any other URL unchanged."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url.split("@")[-1] if "@" in url else url  # unparseable: drop any user info
    if not password:
        return url
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{parts.netloc.rpartition('@')[2]}"))


def host_port(base_url: str | None) -> str:
    """``host:port`` of an endpoint URL (the OpenAI API's without one), never its path, query
    or user info (where a key could hide)."""
    u = urlsplit(base_url or f"https://{OPENAI_HOST}/v1")
    try:
        port = u.port
    except ValueError:
        port = None
    port = port or (443 if u.scheme == "https" else 80)
    host = u.hostname or "?"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _causes(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and all(x is not c for c in chain):
        chain.append(x)
        x = x.__cause__ or x.__context__
    return chain


def transport_error(
    e: BaseException, endpoint: Endpoint, timeouts: tuple[type[BaseException], ...]
) -> str:
    """What went wrong below HTTP, in a few words: "connection refused by host:port" when
    nothing listens there, "timeout" for a real one (``timeouts``: the transport's time-out
    exceptions), else "connection error"."""
    chain = _causes(e)
    if any(isinstance(x, ConnectionRefusedError) for x in chain):
        return f"connection refused by {host_port(endpoint.base_url)}"
    # an OSError below a time-out (a DNS failure, a reset) is no time-out
    other = any(isinstance(x, OSError) and not isinstance(x, TimeoutError) for x in chain)
    if any(isinstance(x, timeouts) for x in chain) and not other:
        return "timeout"
    return f"connection error ({host_port(endpoint.base_url)})"


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` for the response's JSON (dicts), None when absent or not a dict."""
    return obj.get(key) if isinstance(obj, dict) else None


def _token_logprobs(content: list[Any]) -> list[TokenLogprob] | None:
    """The tokens' log-probs of a choice's ``logprobs.content`` (None when a token has none,
    or not a number); their alternatives are read when asked for (:func:`_alternatives`).
    Written out rather than through :func:`_get`: a reply carries (1 + top_logprobs) entries
    per token."""
    lps = []
    append = lps.append
    for tok in content:
        if not isinstance(tok, dict):
            return None
        lp = tok.get("logprob")
        if not isinstance(lp, int | float) or lp != lp:  # absent, not a number, NaN
            return None
        alts = tok.get("top_logprobs")
        append(TokenLogprob(str(tok.get("token")), float(lp), alts=alts or ()))
    return lps


def _alternatives(alts: Any) -> dict[str, float]:
    """A token's ``top_logprobs`` entries, those with a number, by token (else {})."""
    top: dict[str, float] = {}
    if isinstance(alts, list | tuple):
        for alt in alts:
            if isinstance(alt, dict):
                v = alt.get("logprob")
                if isinstance(v, int | float):
                    top[str(alt.get("token"))] = float(v)
    return top


def reply_json(raw: bytes) -> Any:
    """A reply body's JSON: ``orjson`` when installed, else (and for what it refuses that the
    standard library reads: NaN, Infinity) :func:`json.loads`. (orjson reads an integer past
    64 bits as a float: a token count that large is then no count, the usage is estimated.)"""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def _parse_completion(resp: Any, request: ChatRequest) -> ChatResult:
    """Turn a chat-completion response body (JSON as dicts) into a ChatResult; raise
    ``_Malformed`` for anything unusable."""
    choices = _get(resp, "choices")
    if not choices or not isinstance(choices, list):
        raise _Malformed("response has no choices")
    ch = choices[0]
    text = _get(_get(ch, "message"), "content")
    if not isinstance(text, str):
        raise _Malformed("response has no message content")
    lps: list[TokenLogprob] | None = None
    content = _get(_get(ch, "logprobs"), "content")
    if content and isinstance(content, list):
        lps = _token_logprobs(content)
    usage = _get(resp, "usage")
    n_in, n_out = _get(usage, "prompt_tokens"), _get(usage, "completion_tokens")
    estimated = False
    if not isinstance(n_in, int) or not isinstance(n_out, int):
        estimated = True
        n_in = max(1, sum(len(m["content"]) for m in request.messages) // 4)
        n_out = max(1, len(text) // 4) if text else 0
    recorded = _get(resp, "ccpo_replay")
    return ChatResult(
        text=text,
        input_tokens=n_in,
        output_tokens=n_out,
        logprobs=lps,
        finish_reason=_get(ch, "finish_reason"),
        usage_estimated=estimated,
        recorded=recorded if isinstance(recorded, dict) else None,
        model=_get(resp, "model") if isinstance(_get(resp, "model"), str) else None,
    )


class LLMClient:
    """Async chat client with cache, retries, bounded concurrency and cost accounting."""

    def __init__(
        self,
        cache: ResponseCache | None = None,
        prices: PriceTable | None = None,
        concurrency: int = 8,
        retry: RetryPolicy | None = None,
        max_cost: float | None = None,
        seed: int | None = None,
        http_backend: str = "auto",
        ledger: SpendLedger | None = None,
    ) -> None:
        if concurrency < 1:
            raise CCPOError("concurrency must be at least 1")
        self.cache = cache if cache is not None else ResponseCache(None)
        self.prices = prices
        self.concurrency = concurrency
        self.retry = retry or RetryPolicy()
        self.max_cost = max_cost
        self.ledger = ledger if ledger is not None else SpendLedger()
        self.http_backend = http_backend
        self._http = make_transport(http_backend, self.retry.timeout)
        self._rng = random.Random(seed)
        self._sems: dict[str | None, asyncio.Semaphore] = {}
        self._inflight: dict[Hashable, asyncio.Future[ChatResult]] = {}
        self._no_logprobs: set[tuple[str | None, str]] = set()
        self._probe = asyncio.Lock()
        self.max_call_worst = 0.0  # the largest worst case a paid call reserved so far
        # counters
        self.spent_usd = 0.0
        self.n_calls = 0  # successful network calls
        self.n_cached = 0
        self.n_attempts = 0
        self.n_retries = 0

    # ------------------------------------------------------------------ plumbing
    def _headers(self, endpoint: Endpoint, request: ChatRequest) -> dict[str, str]:
        """The request's headers: the endpoint's key as a bearer token (remembered, to be
        scrubbed from every message), the OpenAI organisation / project from
        ``$OPENAI_ORG_ID`` / ``$OPENAI_PROJECT_ID`` for the OpenAI API, the ladder step."""
        key = endpoint.resolve_key()
        h = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
        }
        if is_openai_api(endpoint.base_url):
            for env, name in (
                ("OPENAI_ORG_ID", "OpenAI-Organization"),
                ("OPENAI_PROJECT_ID", "OpenAI-Project"),
            ):
                if os.environ.get(env):
                    h[name] = os.environ[env]
        if request.step:
            h.update(request.headers())
        return h

    def _sem_for(self, endpoint: Endpoint) -> asyncio.Semaphore:
        if endpoint.base_url not in self._sems:
            self._sems[endpoint.base_url] = asyncio.Semaphore(self.concurrency)
        return self._sems[endpoint.base_url]

    def _cost(self, model: str, res: ChatResult) -> float:
        if self.prices is None:
            return 0.0
        return self.prices.cost(model, res.input_tokens, res.output_tokens)

    def budget_left(self) -> bool:
        return self.max_cost is None or self.ledger.total < self.max_cost

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):  # best effort
            await self._http.aclose()

    # ------------------------------------------------------------------ public
    def _as_sent(self, endpoint: Endpoint, request: ChatRequest) -> ChatRequest:
        """The request as it goes to ``endpoint``: without log-probs once it refused them."""
        if request.logprobs and (endpoint.base_url, endpoint.model) in self._no_logprobs:
            return dataclasses.replace(request, logprobs=False)
        return request

    async def chat(self, endpoint: Endpoint, request: ChatRequest, sample: int = 0) -> ChatResult:
        """One completion, from the cache when possible; ``sample`` distinguishes draws.

        The cache key is always that of the request actually sent: an endpoint that refuses
        log-probs has its answers cached under the key without them, so a later run against
        an endpoint that serves them asks again.
        """
        with tracing.llm_call(endpoint, request) as span:  # a no-op unless tracing is on
            return span.done(await self._chat(endpoint, request, sample))

    async def _chat(self, endpoint: Endpoint, request: ChatRequest, sample: int) -> ChatResult:
        try:
            return await self._chat_once(endpoint, self._as_sent(endpoint, request), sample)
        except _LogprobsRefused:
            if (endpoint.base_url, endpoint.model) not in self._no_logprobs:
                log.warning(
                    "%s rejected the log-probs request; continuing without log-probs",
                    endpoint.where,
                )
                self._no_logprobs.add((endpoint.base_url, endpoint.model))
            return await self._chat_once(endpoint, self._as_sent(endpoint, request), sample)

    def worst_cost(self, endpoint: Endpoint, request: ChatRequest) -> float:
        """The most a request can cost (:func:`worst_case_tokens` at the model's price)."""
        if self.prices is None:
            return 0.0
        return self.prices.cost(endpoint.model, *worst_case_tokens(request))

    async def _wait_for_room(self, usd: float, call: bool, env: Envelope | None = None) -> None:
        """Reserve ``usd`` in the run's ledger, waiting while room may still come free (calls
        in flight settle, admitted questions finish and release what they hold);
        :class:`BudgetExceeded` once nothing can free room and it still does not fit.

        ``env``: the wallet of the admitted question this call is for, drawn on first. Its
        question counts as waiting meanwhile. When every admitted question waits and no call
        is in flight (each wallet short of its next call's worst case, the rest of the budget
        held by the others' wallets), the wallets are given back to the budget rather than a
        question refused after it has paid for calls: the others then find room, finish and
        release what they held, and this one draws its whole call from the budget. Only
        once it has nothing left to give back, and a poll later still nothing moves, is it
        refused. A question's admission (``call`` False) waits while admitted questions wait
        for room, here or (a ledger in a database) at another replica: they were paid for
        first."""
        held = min(env.free, usd) if env is not None else 0.0
        if env is not None:
            env.free -= held
        ledger, admission = self.ledger, not call

        async def room() -> bool:
            if admission and ledger.waiting():
                return False
            return await ledger.areserve(usd - held, self.max_cost, call=call, admission=admission)

        if await room():
            return
        if env is not None:
            ledger.count(SpendLedger.WAITING, 1)
        try:
            while not await room():
                if ledger.stuck(env is not None):
                    if env is not None and env.free + held > 0:
                        ledger.settle(env.free + held, 0.0)  # its wallet, back to the budget
                        env.free = held = 0.0
                    else:
                        raise BudgetExceeded(
                            f"budget of ${self.max_cost:.4f} reached (spent "
                            f"${ledger.total:.4f}, ${ledger.reserved:.4f} reserved; the "
                            f"next could cost up to ${usd:.6f})"
                        )
                await asyncio.sleep(ledger.poll_s)
        except BaseException:
            if env is not None:
                env.free += held
            raise
        finally:
            if env is not None:
                ledger.count(SpendLedger.WAITING, -1)

    async def _reserve(self, usd: float) -> RequestBudget | None:
        """Reserve ``usd`` before a paid call: in its question's budget (if any:
        :class:`RequestBudgetExceeded` at once when it does not fit) and in the run's, drawing
        first on the question's admitted envelope. Nothing is sent unless this returns."""
        rb = request_budget.get()
        if rb is not None and not rb.ledger.try_reserve(usd, rb.cap):
            raise RequestBudgetExceeded(
                f"the next call could cost up to ${usd:.6f}; the question's budget of "
                f"${rb.cap:.6f} has ${max(0.0, rb.cap - rb.ledger.total):.6f} left"
            )
        try:
            await self._wait_for_room(usd, call=True, env=_envelope.get())
        except BudgetExceeded:
            if rb is not None:
                rb.ledger.settle(usd, 0.0)
            raise
        self.max_call_worst = max(self.max_call_worst, usd)
        return rb

    def question_estimate(self, cost: float | None) -> float | None:
        """What to hold for a question that should cost about ``cost`` (the costliest one so
        far): that, plus the largest worst case of one call, so that each of its calls finds
        its worst case in the question's wallet. None while nothing is known."""
        return None if cost is None else cost + self.max_call_worst

    @contextlib.asynccontextmanager
    async def admit(self, estimate: Callable[[], float | None]) -> AsyncIterator[Envelope]:
        """Admit one question (a whole episode of calls) only when ``estimate()`` (USD, see
        :meth:`question_estimate`) fits the budget: hold that much for it until it ends, so
        that questions are not started that the budget cannot finish (their money would be
        wasted). While ``estimate()`` is None (nothing known yet) questions run one at a time.
        Without ``max_cost`` nothing waits: ``estimate()`` (when known) is held all the same,
        so that the question's calls draw their worst cases from it and a ledger kept in a
        database writes once per question, not per call. Raises :class:`BudgetExceeded` when
        the question cannot be admitted."""
        if self.max_cost is None:
            est = estimate() or 0.0
            if est > 0:
                await self.ledger.areserve(est, None)
            async with self._enveloped(est, admitted=False) as env:
                yield env
            return
        est = estimate()
        if est is None:
            await self._probe.acquire()
            est = estimate()  # known once the question before has run
            if est is None:  # run alone, as the probe
                try:
                    async with self._enveloped(0.0) as env:
                        yield env
                finally:
                    self._probe.release()
                return
            self._probe.release()
        await self._wait_for_room(est, call=False)
        async with self._enveloped(est) as env:
            yield env

    @contextlib.asynccontextmanager
    async def _enveloped(self, held: float, admitted: bool = True) -> AsyncIterator[Envelope]:
        """Run a question in an envelope of ``held`` USD already reserved; release the rest."""
        env = Envelope(held)
        token = _envelope.set(env)
        if admitted:
            self.ledger.count(SpendLedger.ADMITTED, 1)
        try:
            yield env
        finally:
            _envelope.reset(token)
            if admitted:
                self.ledger.count(SpendLedger.ADMITTED, -1)
            if env.free > 0:  # what its calls did not use (also without a cap: issue 30)
                self.ledger.settle(env.free, 0.0)
            env.free = 0.0

    async def _chat_once(self, endpoint: Endpoint, request: ChatRequest, sample: int) -> ChatResult:
        cached = self.cache.enabled
        fields: dict[str, Any] = {}
        key: Hashable
        if cached:
            fields = request.key_fields(endpoint.model)
            key = cache_key(fields, sample)
            hit = self.cache.get(key)
            if hit is not None:
                self.n_cached += 1
                return ChatResult.from_cache(hit)
        else:  # the same request in flight is all it is compared with: no digest needed
            key = request.flight_key(endpoint.model, sample)
        fut = self._inflight.get(key)
        if fut is not None:  # the same request is being paid for right now: wait for it
            res = await asyncio.shield(fut)
            return ChatResult(**{**res.__dict__, "cached": True, "cost_usd": 0.0})
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._inflight[key] = fut
        try:
            worst = self.worst_cost(endpoint, request)
            rb = await self._reserve(worst)
            env = _envelope.get()
            held = True  # a reservation of ``worst`` is held for the attempt in flight

            def settle(cost: float) -> None:
                """Record an attempt's ``cost`` and release its reservation."""
                nonlocal held
                if env is None:
                    self.ledger.settle(worst, cost, call=True)
                else:  # what the call did not cost stays held, for its question (one step)
                    self.ledger.settle(cost, cost, call=True)
                    env.spent += cost
                    env.free += worst - cost
                if rb is not None:
                    rb.ledger.settle(worst, cost)
                self.spent_usd += cost
                held = False

            async def rebill() -> None:
                """An attempt that may have been billed (no reply read) is counted at its
                worst case before the next is sent, which reserves its own."""
                nonlocal rb, held
                settle(worst)
                rb = await self._reserve(worst)
                held = True

            cost = 0.0
            try:
                res = await self._call(endpoint, request, rebill)
                cost = res.cost_usd = self._cost(endpoint.model, res)
            except asyncio.CancelledError:
                cost = worst  # cut off mid-call (a shutdown): it may have been billed in full
                raise
            except LLMCallError as e:
                cost = worst if e.unsure else 0.0  # the last attempt may have been billed
                raise
            finally:
                if held:
                    settle(cost)
            self.n_calls += 1
            if cached:
                self.cache.put(key, fields, sample, res.to_cache())  # type: ignore[arg-type]
            fut.set_result(res)
            return res
        except BaseException as e:
            if not fut.done():
                if isinstance(e, Exception):
                    fut.set_exception(e)
                    fut.exception()  # mark as retrieved: waiters re-raise it themselves
                else:
                    fut.cancel()
            raise
        finally:
            self._inflight.pop(key, None)

    async def _call(
        self,
        endpoint: Endpoint,
        request: ChatRequest,
        rebill: Callable[[], Awaitable[None]] | None = None,
    ) -> ChatResult:
        """Send ``request`` until it succeeds, retrying the failures :func:`status_error` and
        :func:`transport_error` deem passing (the one place a call meets the network).

        An attempt whose outcome is unknown may have been billed: the request may have left
        and no HTTP status came back (a time-out, a connection cut after sending), or a 2xx
        came back that cannot be read (its usage unknown). Before retrying one, ``rebill()``
        counts it at its worst case and reserves the next attempt's; when the last attempt
        is one, the :class:`LLMCallError` says so (``unsure``). An HTTP error status or a
        connection never made is not billed."""
        url = chat_url(endpoint.base_url)
        headers = self._headers(endpoint, request)
        if "@" in url and "Authorization" in headers:
            # the API key's bearer header wins over credentials in the URL (aiohttp refuses
            # the pair, httpx would send the URL's as basic auth instead of the key)
            url = without_userinfo(url)
        want_lp = request.logprobs
        body = _request_body(endpoint.model, request, want_lp)
        attempt = 0
        while True:
            self.n_attempts += 1
            retry_after: float | None = None
            unsure = False
            try:
                async with self._sem_for(endpoint):
                    status, resp_headers, raw = await self._http.post(url, headers, body)
                if 200 <= status < 300:
                    unsure = True  # billed; usage unknown until it parses
                    return _parse_completion(reply_json(raw), request)
                last, retry_after = status_error(endpoint, status, resp_headers, raw, want_lp)
            except self._http.errors as e:
                last = transport_error(e, endpoint, self._http.timeouts)
                unsure = not any(isinstance(x, self._http.unsent) for x in _causes(e))
            except (_Malformed, ValueError, TypeError, KeyError, AttributeError) as e:
                last = f"malformed response ({type(e).__name__})"
            if attempt >= self.retry.max_retries:
                err = LLMCallError(
                    f"{endpoint.where}: giving up after {attempt + 1} attempts (last error: {last})"
                )
                err.unsure = unsure
                raise err
            delay = min(self.retry.backoff_max, self.retry.backoff_base * 2**attempt)
            delay = self._rng.uniform(0, delay)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.retry.backoff_max))
            attempt += 1
            self.n_retries += 1
            log.info("%s: %s; retry %d in %.2fs", endpoint.where, last, attempt, delay)
            if unsure and rebill is not None:
                await rebill()
            await asyncio.sleep(delay)


_USER_AGENT = "ccpo (OpenAI-compatible chat client)"


def _request_body(model: str, request: ChatRequest, want_lp: bool) -> bytes:
    """The JSON body of a chat-completion request, as the OpenAI API takes it."""
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
    }
    if request.stop:
        body["stop"] = request.stop
    if want_lp:
        body["logprobs"] = True
        if request.top_logprobs:
            body["top_logprobs"] = request.top_logprobs
    # orjson: a tenth of json's time (it writes NaN as null: json's NaN goes out as it did; what
    # orjson refuses, json says why)
    if _orjson is not None and math.isfinite(request.temperature):
        try:
            return _orjson.dumps(body)
        except _orjson.JSONEncodeError:
            pass
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def _error_body(raw: bytes) -> tuple[str, Any]:
    """An error reply's text and its JSON body (None when it is not JSON)."""
    text = raw.decode("utf-8", "replace")
    try:
        return text, json.loads(text)
    except ValueError:
        return text, None


#: what an upstream error body may show of itself: identifiers (``context_length_exceeded``,
#: ``model_not_found``, ``max_tokens``), never free text, which may echo a key (masked or not)
_SAFE_WORD = re.compile(r"[a-z_]{1,64}")


def error_codes(body: Any) -> list[str]:
    """The ``code``, ``type`` and ``param`` of an OpenAI-style error body (``{"error": {...}}``)
    that are plain identifiers (lower-case letters and ``_``): the part of an upstream error
    that may reach a client or a log. Its ``message`` never does: providers echo the key they
    were sent in it, partly masked (``sk-sec********3456``)."""
    inner = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return []
    found = [inner.get(k) for k in ("code", "type", "param")]
    return list(dict.fromkeys(v for v in found if isinstance(v, str) and _SAFE_WORD.fullmatch(v)))


def key_source(endpoint: Endpoint) -> str:
    """Where the key sent to ``endpoint`` came from, as its owner would fix it."""
    if endpoint.api_key:
        return f"the api_key given for '{endpoint.model}' in the config file"
    if endpoint.api_key_env:
        return f"${endpoint.api_key_env}"
    if is_openai_api(endpoint.base_url):
        return "$OPENAI_API_KEY"
    return (
        f"the config: no key is sent to this host unless named (endpoints: {{{endpoint.model}: "
        "{url: ..., key_env: VAR}})"
    )


def auth_error(endpoint: Endpoint, status: int) -> CCPOError:
    """An HTTP 401/403: the key is the user's to fix (named by where it came from)."""
    return CCPOError(
        f"{endpoint.where}: authentication failed (HTTP {status}); check the API key in "
        f"{key_source(endpoint)}"
    )


def refused_error(endpoint: Endpoint, status: int, body: Any) -> CCPOError:
    """An HTTP 4xx that retrying cannot help (404: a :class:`CCPOError`, the model or URL is
    the user's to fix; another: an :class:`LLMCallError` for this request only), with the
    body's identifiers (:func:`error_codes`) and never its text."""
    codes = error_codes(body)
    said = f": {', '.join(codes)}" if codes else ""
    if status == 404:
        return CCPOError(
            f"{endpoint.where}: not found (HTTP 404{said}); check the model name and the base "
            "URL (it usually ends in /v1)"
        )
    return LLMCallError(
        f"{endpoint.where}: request refused (HTTP {status}{said}; the endpoint's message is "
        "not shown, it may echo the API key)"
    )


def status_error(
    endpoint: Endpoint,
    status: int,
    headers: Any,
    raw: bytes,
    want_lp: bool,
) -> tuple[str, float | None]:
    """Map an HTTP error reply: raise when retrying cannot help (401/403: the key,
    :func:`auth_error`; 404: the model or URL, another 4xx but 408/409/429: this request only,
    :func:`refused_error`; log-probs refused: :class:`_LogprobsRefused`), else return (what went
    wrong, seconds the server asked to wait) for a retry. No message shows the body's text."""
    text, body = _error_body(raw)
    if status in (401, 403):
        raise auth_error(endpoint, status)
    # log-probs refused: an HTTP 400 or 5xx whose body names them (llama_cpp.server started
    # without --logits_all answers 500 "logprobs is not supported ..."); any other 400 (a
    # context-length error, say) is this request's problem only
    if want_lp and (status == 400 or status >= 500) and "logprob" in text.lower():
        raise _LogprobsRefused
    if status not in (408, 409, 429) and status < 500:
        raise refused_error(endpoint, status, body)
    return f"HTTP {status}", parse_retry_after(headers)


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from a response's headers: ``retry-after-ms`` (OpenAI's), else
    ``Retry-After`` as seconds or as an HTTP date; None when absent or unreadable."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            v = float(ms) / 1000.0
            return v if math.isfinite(v) and v >= 0 else None
        ra = headers.get("retry-after")
    except (AttributeError, ValueError, TypeError):
        return None
    if ra is None:
        return None
    try:
        v = float(ra)
        return v if math.isfinite(v) and v >= 0 else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(ra).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - (time.time() if now is None else now))
