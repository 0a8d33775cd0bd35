"""One OpenAI-compatible chat client for every backend (OpenAI, vLLM, llama.cpp, Ollama, ...).

:class:`LLMClient` POSTs ``/chat/completions`` itself, without the ``openai`` SDK's per-call
overhead (why, with the measurement: docs/decisions.md); ``collect``, ``ask`` and ``serve``
all call :meth:`LLMClient.chat`. Around each call it keeps the response cache
(:mod:`ccpo.llm.cache`, under the key of the request as it is actually sent; identical
requests in flight in one process are coalesced), one semaphore per endpoint URL, retries
with exponential backoff and full jitter (:class:`RetryPolicy`), the log-prob fallback (an
endpoint that refuses log-probs is asked again without, and remembered), and the budget (a
reservation per paid call in the :class:`SpendLedger`, :meth:`LLMClient.admit` per question).

Its parts, re-exported here: :mod:`ccpo.llm.wire` (requests, replies, endpoints, JSON),
:mod:`ccpo.llm.transports` (aiohttp, httpx), :mod:`ccpo.llm.http_errors` (HTTP status to
error) and :mod:`ccpo.llm.spend` (the spend ledger, budgets).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ccpo.errors import CCPOError
from ccpo.llm import tracing
from ccpo.llm.cache import ResponseCache, cache_key
from ccpo.llm.http_errors import (
    LLMCallError,
    _causes,
    _LogprobsRefused,
    auth_error,
    error_codes,
    key_source,
    parse_retry_after,
    refused_error,
    status_error,
    transport_error,
)
from ccpo.llm.spend import (
    BudgetExceeded,
    Envelope,
    LedgerSlots,
    RequestBudget,
    RequestBudgetExceeded,
    SharedSlots,
    SpendLedger,
    _envelope,
    request_budget,
    worst_case_tokens,
)
from ccpo.llm.transports import HTTP_BACKENDS, load_http, make_transport
from ccpo.llm.wire import (
    DUMMY_API_KEY,
    OPENAI_HOST,
    OPENAI_URL,
    ChatRequest,
    ChatResult,
    Endpoint,
    StreamedReply,
    TokenLogprob,
    _Malformed,
    _orjson,  # noqa: F401  (re-exported: the JSON module in use)
    _parse_completion,
    _request_body,
    chat_url,
    host_port,
    is_openai_api,
    redact_url,
    reply_json,
    without_userinfo,
)
from ccpo.traces.prices import PriceTable

__all__ = [
    "DUMMY_API_KEY",
    "HTTP_BACKENDS",
    "OPENAI_HOST",
    "OPENAI_URL",
    "BudgetExceeded",
    "ChatRequest",
    "ChatResult",
    "Endpoint",
    "Envelope",
    "LLMCallError",
    "LLMClient",
    "LedgerSlots",
    "RequestBudget",
    "RequestBudgetExceeded",
    "RetryPolicy",
    "SharedSlots",
    "SpendLedger",
    "TokenLogprob",
    "auth_error",
    "chat_url",
    "error_codes",
    "host_port",
    "is_openai_api",
    "key_source",
    "load_http",
    "make_transport",
    "parse_retry_after",
    "redact_url",
    "refused_error",
    "reply_json",
    "request_budget",
    "status_error",
    "transport_error",
    "without_userinfo",
    "worst_case_tokens",
]

log = logging.getLogger("ccpo.llm")

_USER_AGENT = "ccpo (OpenAI-compatible chat client)"


@dataclass
class RetryPolicy:
    """Retry and time-out settings (seconds)."""

    max_retries: int = 8
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    timeout: float = 120.0


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
    def _headers(self, endpoint: Endpoint, request: ChatRequest | None) -> dict[str, str]:
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
        if request is not None and request.step:
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

    async def chat(
        self,
        endpoint: Endpoint,
        request: ChatRequest,
        sample: int = 0,
        on_delta: Callable[[str], None] | None = None,
    ) -> ChatResult:
        """One completion, from the cache when possible; ``sample`` distinguishes draws.
        ``on_delta``: the reply is streamed, each piece of its content given to it as it
        arrives (a cached reply whole, at once); the result is the same.

        The cache key is always that of the request actually sent: an endpoint that refuses
        log-probs has its answers cached under the key without them, so a later run against
        an endpoint that serves them asks again.
        """
        with tracing.llm_call(endpoint, request) as span:  # a no-op unless tracing is on
            try:
                got = await self._chat_once(
                    endpoint, self._as_sent(endpoint, request), sample, on_delta
                )
            except _LogprobsRefused:
                if (endpoint.base_url, endpoint.model) not in self._no_logprobs:
                    log.warning(
                        "%s rejected the log-probs request; continuing without log-probs",
                        endpoint.where,
                    )
                    self._no_logprobs.add((endpoint.base_url, endpoint.model))
                sent = self._as_sent(endpoint, request)
                got = await self._chat_once(endpoint, sent, sample, on_delta)
            return span.done(got)

    async def embed(
        self, endpoint: Endpoint, texts: list[str], timeout: float
    ) -> list[list[float]]:
        """The embeddings of ``texts`` from ``endpoint``'s ``/embeddings`` (OpenAI-compatible),
        in order. One attempt within ``timeout`` seconds, neither cached nor priced: the
        caller falls back to lexical similarity instead of retrying (:mod:`ccpo.llm.signals`).
        Raises :class:`LLMCallError` (status or transport; never the reply's text)."""
        url = chat_url(endpoint.base_url).removesuffix("/chat/completions") + "/embeddings"
        headers = self._headers(endpoint, None)
        if "@" in url:
            url = without_userinfo(url)
        body = json.dumps({"model": endpoint.model, "input": texts}).encode()
        self.n_attempts += 1
        try:
            async with self._sem_for(endpoint):
                sent = self._http.post(url, headers, body)
                status, _, raw = await asyncio.wait_for(sent, timeout)
        except TimeoutError:
            raise LLMCallError(f"{endpoint.where}: embeddings took over {timeout:g} s") from None
        except self._http.errors as e:
            what = transport_error(e, endpoint, self._http.timeouts)
            raise LLMCallError(f"{endpoint.where}: embeddings {what}") from None
        if not 200 <= status < 300:
            raise LLMCallError(f"{endpoint.where}: embeddings HTTP {status}")
        try:
            data = sorted(reply_json(raw)["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (_Malformed, ValueError, TypeError, KeyError) as e:
            what = f"malformed embeddings ({type(e).__name__})"
            raise LLMCallError(f"{endpoint.where}: {what}") from None
        if len(vectors) != len(texts):
            what = f"{len(vectors)} embeddings for {len(texts)} texts"
            raise LLMCallError(f"{endpoint.where}: {what}")
        self.n_calls += 1  # made and paid for, even when unusable
        if not all(math.isfinite(x) for v in vectors for x in v):
            raise LLMCallError(f"{endpoint.where}: embeddings with NaN or infinite numbers")
        return vectors

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
        first. The ledger may give up on a wait that lasts (:meth:`SpendLedger.waited`)."""
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
        t0 = asyncio.get_running_loop().time()
        try:
            while not await room():
                ledger.waited(asyncio.get_running_loop().time() - t0, usd)
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
            if env.free > 0:  # what its calls did not use (also without a cap)
                self.ledger.settle(env.free, 0.0)
            env.free = 0.0

    async def _chat_once(
        self,
        endpoint: Endpoint,
        request: ChatRequest,
        sample: int,
        on_delta: Callable[[str], None] | None = None,
    ) -> ChatResult:
        cached = self.cache.enabled
        fields: dict[str, Any] = {}
        key: Hashable
        if cached:
            fields = request.key_fields(endpoint.model)
            key = cache_key(fields, sample)
            hit = self.cache.get(key)
            if hit is not None:
                self.n_cached += 1
                res = ChatResult.from_cache(hit)
                if on_delta is not None and res.text:
                    on_delta(res.text)
                return res
        else:  # the same request in flight is all it is compared with: no digest needed
            key = request.flight_key(endpoint.model, sample)
        fut = self._inflight.get(key)
        if fut is not None:  # the same request is being paid for right now: wait for it
            res = await asyncio.shield(fut)
            if on_delta is not None and res.text:
                on_delta(res.text)
            return ChatResult(**{**res.__dict__, "cached": True, "cost_usd": 0.0})
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._inflight[key] = fut
        try:
            worst = self.worst_cost(endpoint, request)
            rb = await self._reserve(worst)
            env = _envelope.get()
            held = True  # a reservation of ``worst`` is held for the attempt in flight
            if env is not None:
                env.worst += worst

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
                res = await self._call(endpoint, request, rebill, on_delta)
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
        on_delta: Callable[[str], None] | None = None,
    ) -> ChatResult:
        """Send ``request`` until it succeeds, retrying the failures :func:`status_error` and
        :func:`transport_error` deem passing (the one place a call meets the network).

        An attempt whose outcome is unknown may have been billed: the request may have left
        and no HTTP status came back (a time-out, a connection cut after sending), or a 2xx
        came back that cannot be read (its usage unknown). Before retrying one, ``rebill()``
        counts it at its worst case and reserves the next attempt's; when the last attempt
        is one, the :class:`LLMCallError` says so (``unsure``). An HTTP error status or a
        connection never made is not billed. With ``on_delta`` the reply is streamed to it;
        an attempt that has passed some of its content on is not retried."""
        url = chat_url(endpoint.base_url)
        headers = self._headers(endpoint, request)
        if "@" in url and "Authorization" in headers:
            # the API key's bearer header wins over credentials in the URL (aiohttp refuses
            # the pair, httpx would send the URL's as basic auth instead of the key)
            url = without_userinfo(url)
        want_lp = request.logprobs
        body = _request_body(endpoint.model, request, want_lp, stream=on_delta is not None)
        attempt = 0
        passed_on = False  # some of a streamed reply's content went to on_delta
        while True:
            self.n_attempts += 1
            retry_after: float | None = None
            unsure = False
            try:
                if on_delta is None:
                    async with self._sem_for(endpoint):
                        status, resp_headers, raw = await self._http.post(url, headers, body)
                    if 200 <= status < 300:
                        unsure = True  # billed; usage unknown until it parses
                        return _parse_completion(reply_json(raw), request)
                else:
                    streamed = StreamedReply()

                    def on_line(line: bytes, streamed: StreamedReply = streamed) -> None:
                        nonlocal passed_on, unsure
                        unsure = True  # a 2xx is streaming: billed
                        piece = streamed.feed(line)
                        if piece is not None:
                            passed_on = True
                            on_delta(piece)

                    async with self._sem_for(endpoint):
                        status, resp_headers, raw = await self._http.post_lines(
                            url, headers, body, on_line
                        )
                    if 200 <= status < 300:
                        unsure = True
                        return _parse_completion(streamed.completion(), request)
                last, retry_after = status_error(endpoint, status, resp_headers, raw, want_lp)
            except self._http.errors as e:
                last = transport_error(e, endpoint, self._http.timeouts)
                unsure = not any(isinstance(x, self._http.unsent) for x in _causes(e))
            except (_Malformed, ValueError, TypeError, KeyError, AttributeError) as e:
                last = f"malformed response ({type(e).__name__})"
            if attempt >= self.retry.max_retries or passed_on:
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
