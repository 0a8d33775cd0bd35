"""A message's ``name`` reaches every model of a chat ladder, and the endpoint bills it: the
worst case a paid call reserves, the cost charged for a reply without ``usage`` and the size
limit of a conversation all count it. Real ``ccpo serve`` (uvicorn on 127.0.0.1) against a
scripted endpoint that keeps its own bill from every byte of the messages it receives (a
byte-level tokenizer's worst: role, name and content, and a few template tokens)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from ccpo.runtime.config import load_deploy_config
from ccpo.runtime.server import Service
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.prices import load_prices, write_price_file
from tests.helpers.chat import SKILL, chat_reply, conversation
from tests.helpers.serve import STORE, LiveServer, post

CAP = 0.05  # USD, max_cost_total
NAME = "customer-" + "x" * 1500  # a long name (a local server takes any string)


def byte_bill(req: dict) -> int:
    """The endpoint's own count of a request's prompt tokens: one a byte of every text field
    of every message, four a message and three a request (its chat template)."""
    n = 3
    for m in req["messages"]:
        n += 4 + sum(len(v.encode()) for v in m.values() if isinstance(v, str))
    return n


def named(i: int) -> list[dict]:
    """Conversation ``i`` with a long ``name`` on its first user turn."""
    c = conversation(i)
    c[1] = {**c[1], "name": NAME}
    return c


async def _ask(url: str, ids: range) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as http:
        return await asyncio.gather(
            *(http.post(url + "/v1/chat/completions", json={"model": "ccpo", "messages": named(i)})
              for i in ids)
        )  # fmt: skip


def _serve(policy, srv, tmp_path, **server) -> LiveServer:
    prices = tmp_path / "prices.json"
    write_price_file(prices, dict.fromkeys(SKILL, (2.0, 8.0)), "test")
    values = {
        "endpoints": {"*": {"url": srv.url}},
        "prices": [str(prices)],
        "timeout": 5.0,
        "backoff_base": 0.005,
        "max_tokens": 16,
        "reply_max_tokens": 16,  # a chat reply's cap: under a budget, its worst case is priced
        "max_cost_total": CAP,
        "server": {"state": STORE.at(tmp_path, "state.sqlite"), **server},
    }
    return LiveServer(Service.from_artifact(policy / "pol", load_deploy_config(None, values)))


@pytest.mark.parametrize("usage", [True, False], ids=["usage", "no-usage"])
def test_the_cap_holds_and_the_spend_is_recorded_against_a_bill_of_names(
    chat_policy,
    tmp_path,
    usage,
) -> None:
    """Conversations with a long ``name`` until the budget refuses: what the endpoint billed
    stays under the cap, and ccpo records at least that (it reserved and charged the content
    only: the bill passed the cap, and without usage the spend was recorded far below it)."""
    with ScriptedServer(fallback=chat_reply, usage=usage, bill_prompt=byte_bill) as srv:
        with _serve(chat_policy, srv, tmp_path) as live:
            codes: list[int] = []
            for start in range(0, 80, 8):  # eight at a time, as a busy app sends them
                for r in asyncio.run(_ask(live.url, range(start, start + 8))):
                    codes.append(r.status_code)
                    if r.status_code != 200:
                        assert r.json()["error"]["type"] == "budget_exhausted", r.text
                if codes[-1] != 200:
                    break
            recorded = httpx.get(live.url + "/metrics.json").json()["dollars_spent"]
        prices = load_prices(tmp_path / "prices.json")
        billed = sum(prices.cost(m, i, o) for m, (i, o) in srv.billed.items())
        sent = [m for q in srv.requests for m in q["messages"] if m.get("name")]
    assert codes.count(200) >= 2 and 503 in codes, codes  # answered, then refused
    assert sent and all(m["name"] == NAME for m in sent)  # the name reached the models
    print(json.dumps({"usage": usage, "billed": billed, "recorded": recorded, "cap": CAP}))
    assert billed <= CAP, (billed, CAP)
    assert recorded >= billed * (1 - 1e-9), (recorded, billed)


def test_a_name_counts_in_the_size_limit_before_any_call(chat_policy, tmp_path) -> None:
    """A conversation whose content fits ``max_conversation_chars`` but whose name does not
    is a 422 before any paid call."""
    assert sum(len(m["content"]) for m in named(1)) < 1000
    with (
        ScriptedServer(fallback=chat_reply) as srv,
        _serve(chat_policy, srv, tmp_path, max_conversation_chars=1000) as live,
    ):
        r = post(live.url, "/v1/chat/completions", {"model": "ccpo", "messages": named(1)})
        assert r.status_code == 422, r.text
        assert "server.max_conversation_chars" in r.json()["error"]["message"]
        assert srv.n_requests == 0
