"""A 200 reply without ``usage`` is charged at its worst case (the prompt's UTF-8 bytes plus
the chat template's allowance, and ``max_tokens``), never at an estimate below what the
endpoint could have billed: the recorded spend stays at least the endpoint's own bill, and
``max_cost`` holds against that bill. The endpoint here keeps its own bill and counts every
digit as a token (as many tokenizers do): characters / 4 is far below it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from ccpo.llm.client import BudgetExceeded, ChatRequest, Endpoint, LLMClient, RetryPolicy
from ccpo.llm.spend import worst_case_tokens
from ccpo.llm.wire import _parse_completion
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.prices import load_prices, write_price_file

FAST = RetryPolicy(max_retries=2, backoff_base=0.005, backoff_max=0.05, timeout=5)
_DIGIT_TOKENS = re.compile(r"\d|[^\d\s]+|\s+")


def digit_tokens(text: str) -> int:
    """An endpoint's own count: each digit a token, each other run of characters one."""
    return len(_DIGIT_TOKENS.findall(text)) + 4  # and its chat template's few tokens


def _prices(tmp_path: Path):
    """$1,000 / $4,000 per million input / output tokens of model ``m``."""
    write_price_file(tmp_path / "p.json", {"m": (1000.0, 4000.0)}, "test")
    return load_prices(tmp_path / "p.json")


def test_a_reply_without_usage_counts_its_worst_case() -> None:
    """The tokens of a reply without usage are the request's worst case (what was reserved
    for it), flagged as such; a reply with usage keeps its own."""
    req = ChatRequest([{"role": "user", "content": "1234567890" * 20}], max_tokens=64)
    reply = {"choices": [{"message": {"content": "42"}}]}
    r = _parse_completion(reply, req)
    assert (r.input_tokens, r.output_tokens) == worst_case_tokens(req) and r.usage_estimated
    assert r.input_tokens >= digit_tokens("1234567890" * 20)
    half = {**reply, "usage": {"prompt_tokens": 7, "completion_tokens": "x"}}
    r = _parse_completion(half, req)
    assert (r.input_tokens, r.output_tokens) == (7, 64) and r.usage_estimated
    full = {**reply, "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
    r = _parse_completion(full, req)
    assert (r.input_tokens, r.output_tokens) == (7, 1) and not r.usage_estimated


def test_the_budget_holds_against_the_bill_of_an_endpoint_without_usage(tmp_path: Path) -> None:
    """Digit-heavy questions to an endpoint that omits usage and bills a token per digit:
    the client stops before its bill passes ``max_cost``, and records at least that bill
    (it used to record characters / 4 and keep sending past the cap)."""
    prices = _prices(tmp_path)
    cap = 5.0

    async def go(url: str) -> LLMClient:
        c = LLMClient(prices=prices, retry=FAST, max_cost=cap, concurrency=4)
        ep = Endpoint("m", url)

        async def ask(i: int) -> None:
            q = f"What is {i:04d} + " + " + ".join(str(10**9 + 7 * i * k) for k in range(12))
            await c.chat(ep, ChatRequest([{"role": "user", "content": q}], max_tokens=16))

        with pytest.raises(BudgetExceeded):
            for i in range(0, 2000, 4):
                await asyncio.gather(*(ask(i + k) for k in range(4)))
        await c.aclose()
        return c

    with ScriptedServer(fallback="The sum is 1234", usage=False, prompt_tokens=digit_tokens) as srv:
        c = run(go(srv.url))
        billed = sum(prices.cost(m, i, o) for m, (i, o) in srv.billed.items())
    assert srv.n_completions > 10
    assert billed <= cap  # the cap holds against the endpoint's bill
    assert c.ledger.total >= billed and c.spent_usd >= billed  # never recorded below it


def run(coro):
    return asyncio.run(coro)
