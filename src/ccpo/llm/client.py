"""One OpenAI-compatible chat client for every backend (OpenAI, vLLM, llama.cpp, Ollama, ...).

- Built on the ``openai`` SDK's ``AsyncOpenAI`` with a ``base_url`` per model (endpoint).
- Bounded concurrency: one ``asyncio.Semaphore`` per endpoint URL.
- Retries with exponential backoff and full jitter on 429, 408/409, 5xx, time-outs, connection
  errors and malformed responses (the SDK's own retries are switched off so that every attempt
  is counted and logged here). 401/403/404 are the user's to fix and raise a ``CCPOError`` at
  once.
- Token usage is taken from the response's ``usage`` (estimated as characters/4, and flagged,
  only when an endpoint does not report it).
- Log-probs (``logprobs=True, top_logprobs=k``) are requested by default. An endpoint that
  rejects them (HTTP 400, or a 5xx whose message names log-probs, as llama_cpp.server without
  ``--logits_all`` does) is retried once without, and remembered as "no log-probs" for
  the rest of the run; an endpoint that ignores them simply yields ``logprobs=None``.
- The cache (:mod:`ccpo.llm.cache`) is consulted first; identical requests that are in flight
  at the same time are coalesced, so a paid answer is never paid twice.
- ``max_cost`` (USD, from the price table) refuses new uncached calls once the run's spending
  (:class:`SpendLedger`, shared by the worker processes of ``collect --workers``) reaches it
  (:class:`BudgetExceeded`); every answer already paid for is in the cache.
- HTTP transport: the SDK's aiohttp client (``openai.DefaultAioHttpClient``, the ``aiohttp``
  extra of ``openai``) by default, its httpx client otherwise (``http_backend``). Measured on the
  collection benchmark, aiohttp costs about 20% less client CPU per call, which is what bounds
  throughput at high concurrency against a fast endpoint.
- API keys come from the environment (``api_key_env``) or a config file, are passed only to the
  SDK, and are scrubbed from every error message. They are never part of a cache key or value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any

import openai

from ccpo.errors import CCPOError
from ccpo.llm.cache import ResponseCache, cache_key
from ccpo.llm.prices import PriceTable

log = logging.getLogger("ccpo.llm")

DUMMY_API_KEY = "sk-no-key-required"


class LLMCallError(CCPOError):
    """A call failed for good (retries exhausted, or a request the endpoint refuses)."""


class BudgetExceeded(CCPOError):
    """``--max-cost`` was reached; no new paid calls are made."""


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
        if self.base_url is None or "api.openai.com" in self.base_url:
            return os.environ.get("OPENAI_API_KEY") or DUMMY_API_KEY
        # never send the OpenAI key to another host unless asked to (api_key_env)
        return DUMMY_API_KEY

    @property
    def where(self) -> str:
        return f"'{self.model}' at {self.base_url or 'the OpenAI API'}"


@dataclass
class ChatRequest:
    """One chat-completion request (everything that goes into the cache key)."""

    messages: list[dict[str, str]]
    temperature: float = 0.0
    max_tokens: int = 256
    stop: list[str] | None = None
    logprobs: bool = True
    top_logprobs: int = 5

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


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: dict[str, float] = field(default_factory=dict)


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

    def to_cache(self) -> dict[str, Any]:
        return {
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


class SpendLedger:
    """USD spent by one run, against which ``max_cost`` is checked.

    By default it is this process's own counter. ``collect --workers`` gives every worker
    process a ledger on one shared ``multiprocessing.Value('d')``, so the budget is the run's,
    not each worker's.
    """

    def __init__(self, shared: Any | None = None) -> None:
        self._shared = shared
        self._local = 0.0

    def add(self, usd: float) -> None:
        if self._shared is None:
            self._local += usd
            return
        with self._shared.get_lock():
            self._shared.value += usd

    @property
    def total(self) -> float:
        return self._local if self._shared is None else float(self._shared.value)


HTTP_BACKENDS = ("auto", "aiohttp", "httpx")


def make_http_client(backend: str, timeout: float) -> Any:
    """The SDK's HTTP client for ``backend`` (``auto`` | ``aiohttp`` | ``httpx``).

    ``auto`` takes aiohttp when the ``openai[aiohttp]`` extra is installed, else httpx;
    ``None`` means the SDK's own default (httpx).
    """
    if backend == "httpx":
        return None
    try:
        return openai.DefaultAioHttpClient(timeout=timeout)
    except (AttributeError, RuntimeError):  # an older SDK, or the aiohttp extra is missing
        if backend == "aiohttp":
            raise CCPOError(
                "the aiohttp HTTP backend needs the SDK's extra: pip install 'openai[aiohttp]'"
            ) from None
        return None


def _redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s and len(s) >= 4 and s != DUMMY_API_KEY:
            text = text.replace(s, "***")
    return text


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` for the response's JSON (dicts), None when absent or not a dict."""
    return obj.get(key) if isinstance(obj, dict) else None


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
        lps = []
        for tok in content:
            lp = _get(tok, "logprob")
            if lp is None or not isinstance(lp, int | float) or math.isnan(lp):
                lps = None
                break
            top = {}
            for alt in _get(tok, "top_logprobs") or []:
                if isinstance(_get(alt, "logprob"), int | float):
                    top[str(alt.get("token"))] = float(alt["logprob"])
            lps.append(TokenLogprob(str(_get(tok, "token")), float(lp), top))
    usage = _get(resp, "usage")
    n_in, n_out = _get(usage, "prompt_tokens"), _get(usage, "completion_tokens")
    estimated = False
    if not isinstance(n_in, int) or not isinstance(n_out, int):
        estimated = True
        n_in = max(1, sum(len(m["content"]) for m in request.messages) // 4)
        n_out = max(1, len(text) // 4) if text else 0
    return ChatResult(
        text=text,
        input_tokens=n_in,
        output_tokens=n_out,
        logprobs=lps,
        finish_reason=_get(ch, "finish_reason"),
        usage_estimated=estimated,
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
        if http_backend not in HTTP_BACKENDS:
            raise CCPOError(
                f"http backend must be one of {', '.join(HTTP_BACKENDS)}, not '{http_backend}'"
            )
        self.http_backend = http_backend
        self._rng = random.Random(seed)
        self._sdk: dict[tuple[str | None, str], openai.AsyncOpenAI] = {}
        self._sems: dict[str | None, asyncio.Semaphore] = {}
        self._inflight: dict[str, asyncio.Future[ChatResult]] = {}
        self._no_logprobs: set[tuple[str | None, str]] = set()
        self._secrets: list[str] = []
        # counters
        self.spent_usd = 0.0
        self.n_calls = 0  # successful network calls
        self.n_cached = 0
        self.n_attempts = 0
        self.n_retries = 0

    # ------------------------------------------------------------------ plumbing
    def _sdk_for(self, ep: Endpoint) -> openai.AsyncOpenAI:
        key = ep.resolve_key()
        if key not in self._secrets:
            self._secrets.append(key)
        k = (ep.base_url, key)
        if k not in self._sdk:
            self._sdk[k] = openai.AsyncOpenAI(
                api_key=key,
                base_url=ep.base_url,
                max_retries=0,
                timeout=self.retry.timeout,
                http_client=make_http_client(self.http_backend, self.retry.timeout),
            )
        return self._sdk[k]

    def _sem_for(self, ep: Endpoint) -> asyncio.Semaphore:
        if ep.base_url not in self._sems:
            self._sems[ep.base_url] = asyncio.Semaphore(self.concurrency)
        return self._sems[ep.base_url]

    def _cost(self, model: str, res: ChatResult) -> float:
        if self.prices is None:
            return 0.0
        return self.prices.cost(model, res.input_tokens, res.output_tokens)

    def budget_left(self) -> bool:
        return self.max_cost is None or self.ledger.total < self.max_cost

    async def aclose(self) -> None:
        for c in self._sdk.values():
            with contextlib.suppress(Exception):  # best effort
                await c.close()
        self._sdk.clear()

    # ------------------------------------------------------------------ public
    async def chat(self, ep: Endpoint, request: ChatRequest, sample: int = 0) -> ChatResult:
        """One completion, from the cache when possible; ``sample`` distinguishes draws."""
        fields = request.key_fields(ep.model)
        key = cache_key(fields, sample)
        hit = self.cache.get(key)
        if hit is not None:
            self.n_cached += 1
            return ChatResult.from_cache(hit)
        fut = self._inflight.get(key)
        if fut is not None:  # the same request is being paid for right now: wait for it
            res = await asyncio.shield(fut)
            return ChatResult(**{**res.__dict__, "cached": True, "cost_usd": 0.0})
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._inflight[key] = fut
        try:
            res = await self._call(ep, request)
            res.cost_usd = self._cost(ep.model, res)
            self.spent_usd += res.cost_usd
            self.ledger.add(res.cost_usd)
            self.n_calls += 1
            self.cache.put(key, fields, sample, res.to_cache())
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

    async def _call(self, ep: Endpoint, request: ChatRequest) -> ChatResult:
        if not self.budget_left():
            raise BudgetExceeded(f"budget of ${self.max_cost:.4f} reached")
        sdk = self._sdk_for(ep)
        want_lp = request.logprobs and (ep.base_url, ep.model) not in self._no_logprobs
        attempt = 0
        last = ""
        while True:
            kwargs: dict[str, Any] = {
                "model": ep.model,
                "messages": request.messages,
                "temperature": request.temperature,
                "max_tokens": request.max_tokens,
            }
            if request.stop:
                kwargs["stop"] = request.stop
            if want_lp:
                kwargs["logprobs"] = True
                if request.top_logprobs:
                    kwargs["top_logprobs"] = request.top_logprobs
            self.n_attempts += 1
            try:
                async with self._sem_for(ep):
                    # the SDK's documented raw POST: same request, retries-off client and error
                    # types as chat.completions.create, without the typed-params transform
                    # (~10 ms of CPU per call, profiled, on long prompts) and with the body as
                    # bytes parsed here, instead of the typed response model or the SDK's walk
                    # over the JSON (~3 ms per call: the client's CPU bounds collection
                    # throughput at high concurrency)
                    raw = await sdk.post("/chat/completions", cast_to=bytes, body=kwargs)
                return _parse_completion(json.loads(raw), request)
            except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
                env = ep.api_key_env or "OPENAI_API_KEY"
                raise CCPOError(
                    f"{ep.where}: authentication failed (HTTP {e.status_code}); check the API "
                    f"key in ${env} or the config file"
                ) from None
            except openai.NotFoundError:
                raise CCPOError(
                    f"{ep.where}: not found (HTTP 404); check the model name and the base URL "
                    "(it usually ends in /v1)"
                ) from None
            except openai.APIStatusError as e:
                # log-probs refused: HTTP 400, or a 5xx that names them (llama_cpp.server
                # started without --logits_all answers 500 "logprobs is not supported ...")
                if want_lp and (
                    e.status_code == 400 or (e.status_code >= 500 and "logprobs" in str(e).lower())
                ):
                    log.warning(
                        "%s rejected the log-probs request; continuing without log-probs", ep.where
                    )
                    self._no_logprobs.add((ep.base_url, ep.model))
                    want_lp = False
                    continue
                if e.status_code not in (408, 409, 429) and e.status_code < 500:
                    msg = _redact(str(e), self._secrets)[:300]
                    raise LLMCallError(
                        f"{ep.where}: request refused (HTTP {e.status_code}): {msg}"
                    ) from None
                last = f"HTTP {e.status_code}"
                retry_after = _retry_after(e)
            except openai.APITimeoutError:
                last, retry_after = "timeout", None
            except openai.APIConnectionError:
                last, retry_after = "connection error", None
            except (
                _Malformed,
                openai.APIResponseValidationError,
                ValueError,
                TypeError,
                KeyError,
                AttributeError,
            ) as e:
                last, retry_after = f"malformed response ({type(e).__name__})", None
            if attempt >= self.retry.max_retries:
                raise LLMCallError(
                    f"{ep.where}: giving up after {attempt + 1} attempts (last error: {last})"
                )
            delay = min(self.retry.backoff_max, self.retry.backoff_base * 2**attempt)
            delay = self._rng.uniform(0, delay)
            if retry_after is not None:
                delay = max(delay, min(retry_after, self.retry.backoff_max))
            attempt += 1
            self.n_retries += 1
            log.info("%s: %s; retry %d in %.2fs", ep.where, last, attempt, delay)
            await asyncio.sleep(delay)


def _retry_after(e: openai.APIStatusError) -> float | None:
    try:
        v = e.response.headers.get("retry-after")
        return float(v) if v is not None else None
    except (AttributeError, ValueError, TypeError):
        return None
