"""A chat reply the policy decided to return before it asked for it streams straight through
``ccpo serve``, over real HTTP against a scripted upstream on 127.0.0.1 that streams one token a
chunk: the first piece reaches the client while the upstream is still writing the reply (it
is held after its first token until the test lets it go), the pieces join to the whole reply,
and the time to first token is counted at that first piece (in ``/metrics`` and in the
answer's ``ttft_ms``). A set policy, whose reply is
chosen after its calls, streams nothing of them."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from ccpo.testing.scripted_server import ScriptedServer
from tests.helpers.chat import chat_reply, chat_service, conversation, trained_chat_policies
from tests.helpers.serve import LiveServer, post


@pytest.fixture(scope="module")
def chat_policies(tmp_path_factory):
    """A single-answer and a set policy trained on the scripted chat world's ladder."""
    from ccpo.evaluation.harness import trace_provenance
    from ccpo.learning.config import StopConfig
    from ccpo.policies.reference import ReferencePolicy
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.io import read_traces
    from ccpo.traces.prices import load_prices

    d = trained_chat_policies(
        tmp_path_factory.mktemp("chat"),
        # Learn-then-Test's λ̂ reaches round T on part of the traffic (the marginal one may not)
        single=("--answer", "single", "--guarantee", "pac"),
        set=("--answer", "set"),
    )
    traces = d / "chat.jsonl"  # and always-big-m, as test_chat_deploy makes it
    ep = build_episodes(read_traces(traces), load_prices(d / "prices.json"))
    pol = ReferencePolicy.fit(ep, "single", StopConfig(alpha=0.2))
    pol.calibrate(ep)
    pol.provenance = {**trace_provenance(traces), "alpha": 0.2}
    pol.save(d / "reference")
    return d


def _serve(d, answer: str, url: str) -> LiveServer:
    return chat_service(d, url, answer)


def _to_the_last_round(live: LiveServer, horizon: int = 2) -> int:
    """A conversation the single-answer policy answers in round T."""
    for i in range(2000, 2200):
        r = post(live.url, "/v1/chat/completions", {"model": "ccpo", "messages": conversation(i)})
        if r.json()["ccpo"]["rounds"] == horizon:
            return i
    raise AssertionError("no conversation reaches round T")


def _chunks(lines) -> list[dict]:
    return [json.loads(ln.removeprefix("data: ")) for ln in lines if ln and ln != "data: [DONE]"]


def test_the_last_rounds_reply_streams_while_the_upstream_writes_it(chat_policies) -> None:
    hold = threading.Event()
    srv = ScriptedServer(fallback=chat_reply)
    with srv, _serve(chat_policies, "single", srv.url) as live:
        i = _to_the_last_round(live)
        whole = chat_reply({"model": "big-m", "messages": conversation(i)})
        srv.hold = hold
        srv.reset_counters()
        body = {"model": "ccpo", "messages": conversation(i), "stream": True}
        lines = []
        with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=20) as r:
            assert r.status_code == 200
            it = r.iter_lines()
            for ln in it:
                lines.append(ln)
                got = _chunks(lines)
                if any(c["choices"] and c["choices"][0]["delta"].get("content") for c in got):
                    break
            # the first piece is here while the upstream is still held after its first token
            assert not hold.is_set()
            streamed = [q for q in srv.requests if q.get("stream")]
            assert [q["model"] for q in streamed] == ["big-m"]
            hold.set()
            lines.extend(it)
        chunks = _chunks(lines)
        assert [ln for ln in lines if ln][-1] == "data: [DONE]"
        parts = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
        assert "".join(parts) == whole
        assert len([p for p in parts if p]) > 3  # piece by piece, as the upstream wrote it
        last = chunks[-1]
        assert last["choices"][0]["finish_reason"] == "stop"
        assert last["ccpo"]["answer"] == whole and last["ccpo"]["rounds"] == 2
        # the other calls were not streamed, and every call of the question was paid once
        assert sum(1 for q in srv.requests if q["model"] == "big-m") == 1
        text = httpx.get(live.url + "/metrics").text
    count = re.search(r'^ccpo_ttft_seconds_count{replica="[^"]*"} (\S+)$', text, re.M)
    assert count and float(count.group(1)) >= 1
    assert 'ccpo_ttft_seconds_bucket{le="0.05"' in text
    assert 'ccpo_ttft_seconds_bucket{le="60"' in text
    # a set policy chooses its reply after its calls: they are read whole
    with ScriptedServer(fallback=chat_reply) as srv, _serve(chat_policies, "set", srv.url) as live:
        for i in range(2000, 2010):
            body = {"model": "ccpo", "messages": conversation(i), "stream": True}
            with httpx.stream("POST", live.url + "/v1/chat/completions", json=body) as r:
                lines = list(r.iter_lines())
            chunks = _chunks(lines)
            assert chunks[-1]["ccpo"]["answer"] == "".join(
                c["choices"][0]["delta"].get("content") or "" for c in chunks
            )
        assert srv.requests and not any(q.get("stream") for q in srv.requests)


def test_the_reference_alone_streams_its_one_call(chat_policies) -> None:
    hold = threading.Event()
    srv = ScriptedServer(fallback=chat_reply, hold=hold)
    with srv, _serve(chat_policies, "reference", srv.url) as live:
        body = {"model": "ccpo", "messages": conversation(7), "stream": True}
        lines = []
        with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=20) as r:
            it = r.iter_lines()
            for ln in it:
                lines.append(ln)
                if any(c["choices"][0]["delta"].get("content") for c in _chunks(lines)):
                    break
            assert not hold.is_set()  # the upstream is still writing it
            assert [(q["model"], q.get("stream")) for q in srv.requests] == [("big-m", True)]
            time.sleep(0.3)  # the rest of the reply comes 0.3 s after its first piece
            hold.set()
            lines.extend(it)
        chunks = _chunks(lines)
        whole = chat_reply({"model": "big-m", "messages": conversation(7)})
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == whole
        s = chunks[-1]["ccpo"]
        assert s["answer"] == whole and s["cost_usd"] > 0
        # the answer's time to first token is its first piece's, not the end of the reply
        assert 0 < s["ttft_ms"] < s["latency_ms"] - 250, s
