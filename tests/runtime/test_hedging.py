"""Hedging (``hedge_above``) over real HTTP against scripted upstreams on 127.0.0.1: a routed
chat policy sends round 2's guide at once, beside round 1, when its chance of going on is above
the level; a question that goes on takes that call (asked once, its reply the one returned), one
that stops cancels it, and what the cancelled call may have cost is counted in the dollars
spent (its worst case: it was cut off), with the hedges in ``/metrics``. Off by default."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ccpo.testing.scripted_server import ScriptedServer
from tests.helpers.chat import chat_reply, chat_service, conversation, trained_chat_policies
from tests.helpers.serve import post


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    return trained_chat_policies(
        # Learn-then-Test's λ̂ goes on to round 2 on part of the traffic: what a hedge needs
        tmp_path_factory.mktemp("chat"),
        routed=("--answer", "single", "--route", "--guarantee", "pac"),
    )


def _ask(url: str, i: int) -> dict:
    r = post(url, "/v1/chat/completions", {"model": "ccpo", "messages": conversation(i)})
    assert r.status_code == 200, r.text
    return r.json()["ccpo"]


def test_a_hedged_call_is_taken_when_needed_and_cancelled_when_not(routed) -> None:
    fast = ScriptedServer(fallback=chat_reply)
    slow = ScriptedServer(fallback=chat_reply, latency=1.0)  # big-m: still writing at round 1's end
    with fast, slow:
        endpoints = {"big-m": {"url": slow.url}, "*": {"url": fast.url}}
        with chat_service(routed, fast.url, "routed", endpoints=endpoints) as plain:
            with ThreadPoolExecutor(8) as pool:  # big-m's second each, 8 at a time
                ids = range(3000, 3040)
                asked = dict(zip(ids, pool.map(lambda i: _ask(plain.url, i), ids), strict=True))
            assert httpx.get(plain.url + "/metrics.json").json()["hedged"] == 0  # off
        stops = [i for i, s in asked.items() if s["rounds"] == 1 and s["log"][0]["round"] == 1]
        goes_on = [i for i, s in asked.items() if s["rounds"] == 2]
        assert stops and goes_on
        with chat_service(routed, fast.url, "routed", endpoints=endpoints,
                          hedge_above=0.001) as live:  # fmt: skip
            slow.reset_counters()
            s = _ask(live.url, goes_on[0])
            assert slow.n_requests == 1  # round 2 took the call sent ahead: asked once
            assert s["answer"] == asked[goes_on[0]]["answer"]
            assert s["cost_usd"] == pytest.approx(asked[goes_on[0]]["cost_usd"])
            m = httpx.get(live.url + "/metrics.json").json()
            assert (m["hedged"], m["hedges_cancelled"]) == (1, 0)
            spent = m["dollars_spent"]
            slow.reset_counters()
            s = _ask(live.url, stops[0])
            assert s["rounds"] == 1 and s["answer"] == asked[stops[0]]["answer"]
            assert slow.n_requests == 1  # sent ahead, then cancelled
            m = httpx.get(live.url + "/metrics.json").json()
            assert (m["hedged"], m["hedges_cancelled"]) == (2, 1)
            # the cancelled call counts at its worst case: more than the answer's own cost
            assert m["dollars_spent"] - spent > s["cost_usd"] + 1e-6
