"""The client over real HTTP: retries, log-prob fallback, coalescing, budget, key hygiene."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from ccpo.errors import CCPOError
from ccpo.llm.cache import ResponseCache
from ccpo.llm.client import (
    DUMMY_API_KEY,
    BudgetExceeded,
    ChatRequest,
    Endpoint,
    LLMCallError,
    LLMClient,
    RetryPolicy,
    make_http_client,
)
from ccpo.llm.prices import load_prices
from ccpo.testing.scripted_server import ScriptedServer

FAST = RetryPolicy(max_retries=10, backoff_base=0.005, backoff_max=0.05, timeout=0.3)


def _req(text: str = "hello", **kw) -> ChatRequest:
    return ChatRequest([{"role": "user", "content": text}], **kw)


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("backend", ["aiohttp", "httpx"])
def test_retries_every_failure_kind(backend) -> None:
    async def go(srv: ScriptedServer) -> list[str]:
        c = LLMClient(retry=FAST, seed=1, http_backend=backend)
        ep = Endpoint("m", srv.url)
        out = await asyncio.gather(*(c.chat(ep, _req(f"q{i}")) for i in range(40)))
        await c.aclose()
        assert c.n_retries >= 1 and c.n_calls == 40
        return [r.text for r in out]

    with ScriptedServer(
        fallback=lambda r: "ok " + r["messages"][0]["content"],
        failure_rate=0.3,
        timeout_sleep=0.6,
        seed=3,
    ) as srv:
        texts = run(go(srv))
        assert texts == [f"ok q{i}" for i in range(40)]
        assert set(srv.failure_log) == {"429", "500", "timeout", "garbage"}
        assert srv.n_completions == 40


def test_http_backend_choice(monkeypatch) -> None:
    # auto takes the SDK's aiohttp client (the openai[aiohttp] extra is a dependency)
    assert isinstance(make_http_client("auto", 5.0), openai.DefaultAioHttpClient)
    assert make_http_client("httpx", 5.0) is None  # the SDK's own httpx client
    with pytest.raises(CCPOError, match="http backend must be one of"):
        LLMClient(http_backend="curl")

    def missing(**kw):
        raise RuntimeError("To use the aiohttp client you must have installed ... extra")

    # without the extra: auto falls back to httpx, an explicit aiohttp says what to install
    monkeypatch.setattr(openai, "DefaultAioHttpClient", missing)
    assert make_http_client("auto", 5.0) is None
    with pytest.raises(CCPOError, match=r"pip install 'openai\[aiohttp\]'"):
        make_http_client("aiohttp", 5.0)


def test_gives_up_after_max_retries() -> None:
    async def go(url: str) -> None:
        c = LLMClient(retry=RetryPolicy(max_retries=2, backoff_base=0.001, timeout=1))
        try:
            await c.chat(Endpoint("m", url), _req())
        finally:
            await c.aclose()

    with ScriptedServer(failure_rate=1.0, failure_kinds=["503"]) as srv:
        with pytest.raises(
            LLMCallError, match=r"giving up after 3 attempts \(last error: HTTP 503"
        ):
            run(go(srv.url))
        assert srv.n_requests == 3


@pytest.mark.parametrize("mode", ["reject", "reject500", "ignore"])
def test_logprobs_rejected_or_ignored(mode: str) -> None:
    async def go(url: str):
        c = LLMClient(retry=FAST)
        ep = Endpoint("m", url)
        a = await c.chat(ep, _req("a"))
        b = await c.chat(ep, _req("b"))
        await c.aclose()
        return a, b

    with ScriptedServer(fallback="Yes", logprobs_mode=mode) as srv:
        a, b = run(go(srv.url))
        assert a.text == "Yes" and a.logprobs is None and b.logprobs is None
        # a rejecting endpoint is asked once with log-probs, then never again
        assert srv.n_requests == (2 if mode == "ignore" else 3)


def test_logprobs_and_usage_recorded() -> None:
    async def go(url: str):
        c = LLMClient(retry=FAST)
        r = await c.chat(Endpoint("m", url), _req("one two three", max_tokens=10))
        await c.aclose()
        return r

    with ScriptedServer(fallback="Yes it is", token_logprob=lambda t: -0.5) as srv:
        r = run(go(srv.url))
        assert r.input_tokens == 3 and r.output_tokens == 3
        assert [t.logprob for t in r.logprobs] == [-0.5] * 3 and len(r.logprobs[0].top) == 5
        assert srv.requests[0]["logprobs"] is True and srv.requests[0]["top_logprobs"] == 5


def test_cache_and_inflight_coalescing(tmp_path: Path) -> None:
    async def go(url: str, cache: ResponseCache):
        c = LLMClient(cache=cache, retry=FAST)
        ep = Endpoint("m", url)
        rs = await asyncio.gather(*(c.chat(ep, _req("same")) for _ in range(5)))
        r2 = await c.chat(ep, _req("same"), sample=1)  # another sample: a new call
        await c.aclose()
        return rs, r2

    cache = ResponseCache(tmp_path / "c.sqlite")
    with ScriptedServer(fallback="x", latency=0.05) as srv:
        rs, _ = run(go(srv.url, cache))
        assert srv.n_requests == 2
        assert sum(not r.cached for r in rs) == 1
        run(go(srv.url, cache))
        assert srv.n_requests == 2  # everything from the cache now


def test_budget_stops_new_paid_calls(tmp_path: Path) -> None:
    prices = tmp_path / "p.json"
    prices.write_text(
        '{"as_of": "x", "source": "t", "models": {"m": '
        '{"input_usd_per_mtok": 1000000, "output_usd_per_mtok": 0}}}'
    )

    async def go(url: str):
        c = LLMClient(prices=load_prices(prices), retry=FAST, max_cost=2.5)
        ep = Endpoint("m", url)
        spent = []
        with pytest.raises(BudgetExceeded):
            for i in range(10):
                await c.chat(ep, _req(f"q{i}"))  # 1 input token = $1
                spent.append(c.spent_usd)
        await c.aclose()
        return spent

    with ScriptedServer(fallback="x") as srv:
        assert run(go(srv.url)) == [1.0, 2.0, 3.0]
        assert srv.n_requests == 3


def test_auth_error_is_clear_and_never_shows_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-THE-SECRET-KEY-123"
    monkeypatch.setenv("MY_KEY", secret)

    async def go(url: str, env: str) -> None:
        c = LLMClient(retry=FAST)
        try:
            await c.chat(Endpoint("m", url, env), _req())
        finally:
            await c.aclose()

    with ScriptedServer(fallback="x", api_key="right-key") as srv:
        with pytest.raises(CCPOError) as ei:
            run(go(srv.url, "MY_KEY"))
        assert "authentication failed" in str(ei.value) and "$MY_KEY" in str(ei.value)
        assert secret not in str(ei.value)
        monkeypatch.setenv("MY_KEY", "right-key")
        run(go(srv.url, "MY_KEY"))
    with pytest.raises(CCPOError, match="NOPE_KEY is not set"):
        Endpoint("m", None, "NOPE_KEY").resolve_key()


def test_not_found_and_bad_request() -> None:
    async def go(url: str, lp: bool) -> None:
        c = LLMClient(retry=FAST)
        try:
            await c.chat(Endpoint("m", url), _req(logprobs=lp))
        finally:
            await c.aclose()

    with (
        ScriptedServer(failure_rate=1.0, failure_kinds=["404"]) as srv,
        pytest.raises(CCPOError, match="not found"),
    ):
        run(go(srv.url, True))
    with (
        ScriptedServer(failure_rate=1.0, failure_kinds=["400"]) as srv,
        pytest.raises(LLMCallError, match="HTTP 400"),
    ):
        run(go(srv.url, False))


def test_default_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert Endpoint("gpt-4o").resolve_key() == "sk-openai"
    assert Endpoint("gpt-4o", "https://api.openai.com/v1").resolve_key() == "sk-openai"
    # a local or third-party endpoint never gets the OpenAI key by default
    assert Endpoint("llama", "http://127.0.0.1:8000/v1").resolve_key() == DUMMY_API_KEY
    monkeypatch.setenv("VLLM_KEY", "k2")
    assert Endpoint("llama", "http://127.0.0.1:8000/v1", "VLLM_KEY").resolve_key() == "k2"
    assert "k2" not in repr(Endpoint("m", None, None, "k2"))
