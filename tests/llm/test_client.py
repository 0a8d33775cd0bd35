"""The client over real HTTP: retries, log-prob fallback, coalescing, budget, key hygiene."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

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
    make_transport,
    parse_retry_after,
    worst_case_tokens,
)
from ccpo.testing import free_port
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.prices import load_prices

FAST = RetryPolicy(max_retries=10, backoff_base=0.005, backoff_max=0.05, timeout=0.3)
#: FAST without its short timeout, for the budget tests, whose server never fails: there a call
#: that takes over 0.3 s on a loaded machine would be counted at its worst case and end the run
#: early
STEADY = RetryPolicy(max_retries=10, backoff_base=0.005, backoff_max=0.05, timeout=60.0)


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
    # auto takes aiohttp (a dependency); httpx on request
    assert make_transport("auto", 5.0).name == "aiohttp"
    assert make_transport("httpx", 5.0).name == "httpx"
    with pytest.raises(CCPOError, match="http backend must be one of"):
        LLMClient(http_backend="curl")

    # without aiohttp: auto falls back to httpx, an explicit aiohttp says what to install
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # import aiohttp -> ImportError
    assert make_transport("auto", 5.0).name == "httpx"
    with pytest.raises(CCPOError, match=r"pip install aiohttp"):
        make_transport("aiohttp", 5.0)


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


def _dollar_per_input_token(tmp_path: Path):
    prices = tmp_path / "p.json"
    prices.write_text(
        '{"as_of": "x", "source": "t", "models": {"m": '
        '{"input_usd_per_mtok": 1000000, "output_usd_per_mtok": 0}}}'
    )
    return load_prices(prices)


def test_budget_stops_new_paid_calls(tmp_path: Path) -> None:
    prices = _dollar_per_input_token(tmp_path)
    # "qNNN" is 1 input token on the scripted server ($1); its worst case is its bytes + the
    # role's bytes and the chat template's allowance: 4 + 4 + 8 + 16 = 32 tokens ($32)
    assert worst_case_tokens(_req("q000", max_tokens=4)) == (32, 4)

    async def go(url: str):
        c = LLMClient(prices=prices, retry=STEADY, max_cost=100.0)
        ep = Endpoint("m", url)
        spent = []
        with pytest.raises(BudgetExceeded, match="could cost up to"):
            for i in range(200):
                await c.chat(ep, _req(f"q{i:03d}", max_tokens=4))
                spent.append(c.spent_usd)
        await c.aclose()
        return spent

    with ScriptedServer(fallback="x") as srv:
        spent = run(go(srv.url))
        # a call is sent only while spent + $32 <= $100: the 69th is the last
        assert spent == [float(i) for i in range(1, 70)]
        assert srv.n_requests == 69  # the refused call was never sent


def test_admitted_questions_short_of_room_give_their_wallets_back_before_any_is_refused(
    tmp_path: Path,
) -> None:
    """Near the end of a budget, two admitted questions whose wallets fall short of their
    second calls wait, and a third waits to be admitted. Nothing is in flight: rather than
    refuse a question that has paid for a call, the waiting wallets go back to the budget,
    both admitted questions finish, and the third (which has paid nothing) is refused
    instead of being admitted ahead of them. Every dollar paid bought an answer."""
    prices = _dollar_per_input_token(tmp_path)
    # a call: 22 scripted input tokens ($22), worst case $67; wallets of $70 (one call's
    # worst case): two fit the $150 budget. After their first calls the two admitted wait
    # for $19 more each (room $10) and the third for its $70: all wait, nothing in flight.

    async def go(url: str):
        c = LLMClient(prices=prices, retry=STEADY, max_cost=150.0, concurrency=8)
        ep = Endpoint("m", url)

        async def question(i: int, calls: int) -> int:
            if i == 2:
                await asyncio.sleep(0.01)  # after the first two are admitted
            async with c.admit(lambda: 70.0):
                for k in range(calls):
                    await c.chat(ep, _req(f"q{i}{k} " + "w " * 20, max_tokens=4))
            return i

        rs = await asyncio.gather(
            question(0, 2), question(1, 2), question(2, 1), return_exceptions=True
        )
        await c.aclose()
        return c, rs

    with ScriptedServer(fallback="x", latency=0.02) as srv:
        c, rs = run(go(srv.url))
        sent = [r["messages"][-1]["content"][:3] for r in srv.requests]
    assert rs[:2] == [0, 1], rs
    assert isinstance(rs[2], BudgetExceeded) and "up to $70" in str(rs[2]), rs
    assert sorted(sent) == ["q00", "q01", "q10", "q11"]  # the third sent nothing
    assert c.spent_usd == pytest.approx(88.0) and c.ledger.reserved == pytest.approx(0.0)
    assert not c.ledger.waiting()


def test_budget_holds_at_concurrency_64(tmp_path: Path) -> None:
    prices = _dollar_per_input_token(tmp_path)

    async def go(url: str):
        c = LLMClient(prices=prices, retry=STEADY, max_cost=300.0, concurrency=64)
        ep = Endpoint("m", url)
        rs = await asyncio.gather(
            *(c.chat(ep, _req(f"q{i} " + "w " * 20, max_tokens=4)) for i in range(64)),
            return_exceptions=True,
        )
        await c.aclose()
        return c, rs

    with ScriptedServer(fallback="x", latency=0.02) as srv:
        c, rs = run(go(srv.url))
        ok = [r for r in rs if not isinstance(r, BaseException)]
        refused = [r for r in rs if isinstance(r, BaseException)]
        assert all(isinstance(r, BudgetExceeded) for r in refused)
        # 22 scripted tokens ($22) a call, worst case 43 bytes + 24 -> $67: the calls in flight
        # together never pass $300, and the money spent is exactly what was answered
        assert c.spent_usd <= 300.0 and len(ok) == srv.n_requests
        assert c.spent_usd == pytest.approx(22.0 * len(ok))
        assert len(ok) == 11  # spent + $67 <= $300 admits calls until $233


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


def test_a_400_that_does_not_name_logprobs_keeps_them(tmp_path: Path) -> None:
    """One context-length-like 400 fails that request only: log-probs stay on for the rest."""

    async def go(url: str, cache: ResponseCache):
        c = LLMClient(cache=cache, retry=FAST)
        ep = Endpoint("m", url)
        rs = await asyncio.gather(
            *(c.chat(ep, _req(f"q{i}")) for i in range(12)), return_exceptions=True
        )
        await c.aclose()
        return rs

    cache = ResponseCache(tmp_path / "c.sqlite")
    with ScriptedServer(fallback="Yes", failure_rate=0.25, failure_kinds=["400"], seed=2) as srv:
        rs = run(go(srv.url, cache))
        failed = [r for r in rs if isinstance(r, BaseException)]
        ok = [r for r in rs if not isinstance(r, BaseException)]
        assert failed and all(isinstance(r, LLMCallError) and "HTTP 400" in str(r) for r in failed)
        assert ok and all(r.logprobs is not None for r in ok)
        assert all(q.get("logprobs") is True for q in srv.requests)  # never switched off
        assert srv.n_requests == 12  # a 400 is not retried without log-probs


def test_answers_without_logprobs_are_never_cached_as_with_them(tmp_path: Path) -> None:
    async def go(url: str, cache: ResponseCache):
        c = LLMClient(cache=cache, retry=FAST)
        r = await c.chat(Endpoint("m", url), _req("same"))
        await c.aclose()
        return r

    cache = ResponseCache(tmp_path / "c.sqlite")
    with ScriptedServer(fallback="Yes", logprobs_mode="reject") as srv:
        assert run(go(srv.url, cache)).logprobs is None
        assert run(go(srv.url, cache)).logprobs is None  # the no-log-probs answer, cached
        assert srv.n_completions == 1  # paid once
    with ScriptedServer(fallback="Yes") as healthy:  # the same model, now with log-probs
        r = run(go(healthy.url, cache))
        assert r.logprobs is not None and not r.cached and healthy.n_completions == 1


def test_the_openai_key_goes_only_to_the_openai_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    for url in (
        "http://127.0.0.1:9/api.openai.com/v1",
        "https://api.openai.com.evil.tld/v1",
        "https://evil.tld/v1?x=api.openai.com",
        "http://api.openai.com/v1",  # not over TLS
        "https://user@evil.tld/api.openai.com",
    ):
        assert Endpoint("gpt-4o", url).resolve_key() == DUMMY_API_KEY, url
    for url in (None, "https://api.openai.com/v1", "https://API.OpenAI.com./v1"):
        assert Endpoint("gpt-4o", url).resolve_key() == "sk-openai-secret", url

    async def go(url: str) -> None:
        c = LLMClient(retry=FAST)
        try:
            await c.chat(Endpoint("gpt-4o", url), _req())
        finally:
            await c.aclose()

    # over real HTTP: a server whose path merely contains the OpenAI host never gets the key
    with ScriptedServer(fallback="x", api_key="sk-openai-secret") as srv:
        url = srv.url.removesuffix("/v1") + "/api.openai.com/v1"
        with pytest.raises(CCPOError, match="authentication failed"):
            run(go(url))
        assert srv.n_requests == 1


@pytest.mark.parametrize(
    "headers, wait",
    [
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, 10.0),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_retry_after_forms(headers, wait) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert parse_retry_after(headers, now=now) == wait


def test_retry_after_ms_is_honoured_over_http() -> None:
    async def go(url: str) -> float:
        c = LLMClient(retry=RetryPolicy(max_retries=3, backoff_base=0.001, timeout=5))
        t0 = time.monotonic()
        await c.chat(Endpoint("m", url), _req())
        await c.aclose()
        return time.monotonic() - t0

    with ScriptedServer(
        fallback="x",
        failure_rate=0.5,
        failure_kinds=["429"],
        seed=1,
        failure_headers={"retry-after-ms": "300"},
    ) as srv:
        elapsed = run(go(srv.url))
        assert srv.failure_log[:1] == ["429"] and srv.n_completions == 1
        # the server asked for 300 ms; the jittered backoff alone would wait ~1 ms
        assert elapsed >= 0.3 * len(srv.failure_log)


@pytest.mark.parametrize("backend", ["aiohttp", "httpx"])
def test_refused_connection_is_not_a_timeout(backend) -> None:
    """Nothing listening: "connection refused by 127.0.0.1:PORT" (the aiohttp transport raises
    it as a timeout); a server that never answers in time: "timeout". No key in either."""
    key = "sk-secret-refused-1234"

    async def go(url: str) -> str:
        retry = RetryPolicy(max_retries=1, backoff_base=0.001, timeout=0.3)
        c = LLMClient(retry=retry, http_backend=backend)
        try:
            await c.chat(Endpoint("m", url, api_key=key), _req())
        except LLMCallError as e:
            return str(e)
        finally:
            await c.aclose()
        raise AssertionError("the call succeeded")

    port = free_port()
    msg = run(go(f"http://127.0.0.1:{port}/v1"))
    assert f"last error: connection refused by 127.0.0.1:{port})" in msg, msg
    assert "timeout" not in msg and key not in msg
    with ScriptedServer(failure_rate=1.0, failure_kinds=["timeout"], timeout_sleep=1.0) as srv:
        msg = run(go(srv.url))
    assert "last error: timeout)" in msg and "refused" not in msg and key not in msg, msg


def test_calls_need_neither_the_openai_sdk_nor_an_eager_transport():
    """`import ccpo.runtime` (and so `ccpo.llm.client`) and making a client load no HTTP
    transport; a call over real HTTP loads aiohttp and never the ``openai`` SDK (the client
    speaks the API itself)."""
    with ScriptedServer(fallback="Yes", token_logprob=lambda t: -0.25) as srv:
        script = (
            "import asyncio, sys, ccpo.runtime\n"
            "from ccpo.llm import client\n"
            "client.LLMClient()\n"
            "before = 'aiohttp' in sys.modules\n"
            "async def go():\n"
            "    c = client.LLMClient()\n"
            "    r = await c.chat(client.Endpoint('m', sys.argv[1]), client.ChatRequest(\n"
            "        [{'role': 'user', 'content': 'hi'}]))\n"
            "    await c.aclose()\n"
            "    return r\n"
            "r = asyncio.run(go())\n"
            "print(before, 'aiohttp' in sys.modules, 'openai' in sys.modules, r.text,\n"
            "      r.logprobs[0].logprob)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, srv.url], capture_output=True, text=True, timeout=60
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False", "Yes", "-0.25"]


def test_scripted_world_is_quiet_when_a_client_resets(capfd) -> None:
    """A client killed mid-request (a replica under kill -9 in bench_replicas) resets its
    connection: the world keeps serving and prints no traceback for it."""
    import socket
    import struct

    import httpx

    with ScriptedServer(fallback="A") as srv:
        port = int(srv.url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")  # half a request head
            s.close()  # SO_LINGER 0: a reset, not a FIN
        time.sleep(0.3)
        r = httpx.post(
            srv.url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err


def _billed_usd(srv: ScriptedServer) -> float:
    """What the scripted endpoint billed ($1 an input token, model "m")."""
    return float(srv.billed.get("m", [0, 0])[0])


@pytest.mark.parametrize("backend", ["aiohttp", "httpx"])
def test_an_attempt_with_no_reply_is_counted_at_its_worst_case(tmp_path: Path, backend) -> None:
    """The endpoint takes 0.4 s, the client waits 0.15 s, twice: both attempts time out, the
    endpoint completes (and bills) both anyway. The ledger records each at its worst case
    ($32: ≥ the $1 billed), so recorded spend ≥ billed; nothing stays reserved."""
    prices = _dollar_per_input_token(tmp_path)
    retry = RetryPolicy(max_retries=1, backoff_base=0.001, backoff_max=0.001, timeout=0.15)

    async def go(url: str):
        c = LLMClient(prices=prices, retry=retry, http_backend=backend)
        with pytest.raises(LLMCallError, match="timeout") as e:
            await c.chat(Endpoint("m", url), _req("q000", max_tokens=4))
        await c.aclose()
        return c, e.value

    with ScriptedServer(fallback="x", latency=0.4) as srv:
        c, err = run(go(srv.url))
        time.sleep(0.6)  # the endpoint finishes what it was sent
        billed = _billed_usd(srv)
    assert srv.n_requests == 2 and billed == 2.0 and err.unsure
    assert c.spent_usd == c.ledger.total == 2 * 32.0 >= billed
    assert c.ledger.reserved == 0.0


def test_a_timeout_then_a_reply_records_both_and_an_http_error_records_nothing(
    tmp_path: Path,
) -> None:
    """Seeded failures (seed 4: the first request fails, the second not): a time-out (no
    reply read) is counted at its worst case ($32) beside the reply's $1; an HTTP 500 is not
    billed, so only the reply's $1 is recorded."""
    prices = _dollar_per_input_token(tmp_path)
    retry = RetryPolicy(max_retries=3, backoff_base=0.001, backoff_max=0.001, timeout=0.2)

    async def go(url: str):
        c = LLMClient(prices=prices, retry=retry)
        r = await c.chat(Endpoint("m", url), _req("q000", max_tokens=4))
        await c.aclose()
        return c, r

    for kind, expect in (("timeout", 32.0 + 1.0), ("500", 1.0)):
        with ScriptedServer(
            fallback="x", failure_rate=0.5, failure_kinds=[kind], timeout_sleep=0.3, seed=4
        ) as srv:
            c, r = run(go(srv.url))
        assert srv.failure_log == [kind] and srv.n_completions == 1, srv.failure_log
        assert r.cost_usd == 1.0
        assert c.spent_usd == c.ledger.total == expect and c.ledger.reserved == 0.0


def test_a_retry_after_an_unsure_attempt_needs_room_in_the_budget(tmp_path: Path) -> None:
    """A $40 budget holds one $32 worst case: the first attempt times out and counts $32, the
    retry would need another $32 and is never sent (BudgetExceeded); spend stays ≤ the cap."""
    prices = _dollar_per_input_token(tmp_path)
    retry = RetryPolicy(max_retries=3, backoff_base=0.001, backoff_max=0.001, timeout=0.15)

    async def go(url: str):
        c = LLMClient(prices=prices, retry=retry, max_cost=40.0)
        with pytest.raises(BudgetExceeded):
            await c.chat(Endpoint("m", url), _req("q000", max_tokens=4))
        await c.aclose()
        return c

    with ScriptedServer(fallback="x", latency=0.4) as srv:
        c = run(go(srv.url))
    assert srv.n_requests == 1
    assert c.ledger.total == 32.0 <= 40.0 and c.ledger.reserved == 0.0


@pytest.mark.parametrize("backend", ["aiohttp", "httpx"])
def test_credentials_in_the_url_beside_an_api_key(backend) -> None:
    """An endpoint URL with ``user:password@`` and an API key: the key's bearer header is
    what the endpoint gets, on both transports (aiohttp refused the pair outright)."""

    async def go(url: str):
        c = LLMClient(retry=RetryPolicy(max_retries=0, timeout=5), http_backend=backend)
        try:
            return await c.chat(Endpoint("m", url, api_key="sk-url-cred"), _req())
        finally:
            await c.aclose()

    with ScriptedServer(fallback="fine", api_key="sk-url-cred") as srv:
        r = run(go(srv.url.replace("http://", "http://user:pw@")))
    assert r.text == "fine" and srv.n_completions == 1


def test_token_logprobs_of_a_reply_and_its_odd_shapes() -> None:
    """A reply's per-token log-probs: alternatives without a number are skipped; a token
    without one (absent, text, NaN) or not an object leaves the reply without log-probs."""
    from ccpo.llm.client import _parse_completion

    def reply(content):
        msg = {"role": "assistant", "content": "Yes"}
        return {"choices": [{"message": msg, "logprobs": {"content": content}}], "usage": {}}

    req = ChatRequest([{"role": "user", "content": "q"}])
    ok = [{"token": "Yes", "logprob": -0.5,
           "top_logprobs": [{"token": "Yes", "logprob": -0.5}, {"token": "No", "logprob": "x"},
                            "junk", {"token": 7, "logprob": -3}]}]  # fmt: skip
    r = _parse_completion(reply(ok), req)
    assert [(t.token, t.logprob, t.top) for t in r.logprobs] == [
        ("Yes", -0.5, {"Yes": -0.5, "7": -3.0})
    ]
    assert r.usage_estimated and r.input_tokens >= 1
    for bad in ([{"token": "a"}], [{"token": "a", "logprob": "x"}],
                [{"token": "a", "logprob": float("nan")}], ["a"], [*ok, None]):  # fmt: skip
        assert _parse_completion(reply(bad), req).logprobs is None, bad
    assert _parse_completion(reply([]), req).logprobs is None  # nothing given: none


def test_reply_json_reads_what_the_standard_library_reads() -> None:
    """The reply parser (orjson in the serve extra) gives json.loads's result, NaN included
    (orjson refuses it: the standard library reads it); an integer past 64 bits comes as a
    float (so a token count that large is no count: the usage is estimated); what neither
    reads is a ValueError, as before (a malformed reply)."""
    import json

    from ccpo.llm.client import _orjson, reply_json

    assert _orjson is not None  # the dev install has the serve extra
    for raw in (
        b'{"choices": [{"message": {"content": "B"}, "logprobs": {"content": [{"token": "B",'
        b' "logprob": -0.25, "top_logprobs": [{"token": "A", "logprob": -1.5e-3}]}]}}]}',
        b'{"a": NaN, "b": -Infinity}',
        b'{"n": 12345678901234567, "s": "\\u00e9\\ud83d\\ude00"}',
        '{"k": "é", "k": 2}'.encode(),
    ):
        got, want = reply_json(raw), json.loads(raw)
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), raw
    for bad in (b"", b"{", b'{"a": 1}x', b"\xff\xfe"):
        with pytest.raises(ValueError):
            reply_json(bad)
    big = reply_json(b'{"usage": {"prompt_tokens": 123456789012345678901234567890}}')
    assert isinstance(big["usage"]["prompt_tokens"], float)


def test_reply_json_without_orjson_is_json(monkeypatch) -> None:
    """The core install (no orjson) parses with the standard library, errors included."""
    import json

    from ccpo.llm import wire as client

    monkeypatch.setattr(client, "_orjson", None)
    raw = b'{"a": [1, 2.5, "\\u00e9"], "n": 123456789012345678901234567890}'
    assert client.reply_json(raw) == json.loads(raw)
    assert isinstance(client.reply_json(raw)["n"], int)
    with pytest.raises(ValueError):
        client.reply_json(b"{")


def test_alternatives_are_read_when_asked_and_compare_as_before() -> None:
    """A token's alternatives are read on demand, with the same filter as before; two
    tokens are equal when token, log-prob and alternatives are."""
    from ccpo.llm.client import TokenLogprob

    lazy = TokenLogprob("Yes", -0.5, alts=[{"token": "No", "logprob": -1}, {"token": "x"}, 3])
    assert lazy == TokenLogprob("Yes", -0.5, {"No": -1.0})
    assert lazy.top == {"No": -1.0} and lazy != TokenLogprob("Yes", -0.5)
    assert TokenLogprob("a", -1.0, alts="not a list").top == {}
    assert "top={'No': -1.0}" in repr(lazy)


@pytest.mark.parametrize("orjson", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 0.7, float("nan")])
def test_a_request_body_is_the_json_it_was(temperature: float, orjson: bool, monkeypatch) -> None:
    """The request body (orjson in the serve extra, json in the core install) is the JSON
    json.dumps wrote: the same values, non-ASCII text as UTF-8; a NaN temperature goes out as
    json wrote it; a lone surrogate fails as it did (UnicodeEncodeError)."""
    import json

    from ccpo.llm import wire as client
    from ccpo.llm.client import _request_body

    if not orjson:
        monkeypatch.setattr(client, "_orjson", None)

    msgs = [{"role": "system", "content": "Réponds «vite» 😀"}, {"role": "user", "content": "Q?"}]
    req = ChatRequest(msgs, temperature, max_tokens=64, stop=["\n\n"], top_logprobs=3)
    for want_lp in (True, False):
        body = _request_body("m", req, want_lp)
        lp = {"logprobs": True, "top_logprobs": 3} if want_lp else {}
        want = {"model": "m", "messages": msgs, "temperature": temperature, "max_tokens": 64,
                "stop": ["\n\n"], **lp}  # fmt: skip
        got = json.loads(body)
        if temperature == temperature:  # (NaN != NaN)
            assert got == want
        assert "Réponds «vite» 😀".encode() in body
        assert (b"NaN" in body) == (temperature != temperature)
        assert (b'"top_logprobs":' in body.replace(b" ", b"")) == want_lp
    bad = ChatRequest([{"role": "user", "content": "a \ud800 b"}])
    with pytest.raises(UnicodeEncodeError):
        _request_body("m", bad, True)
