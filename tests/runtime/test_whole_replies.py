"""Whole replies from ``ccpo serve`` with a chat policy, over real HTTP against a scripted
upstream on 127.0.0.1 that honours ``max_tokens`` (and ``stop``) as an endpoint does: a chat
ladder sends no cap of its own, so a reply longer than 512 tokens comes back whole; the
client's ``max_tokens``, ``temperature``, ``top_p`` and ``stop`` reach the models, a header
says where they depart from what was calibrated, and a reply cut at the cap is reported as
``length``, never ``stop`` (so by the replay endpoint too)."""

from __future__ import annotations

import json

import httpx
import pytest

from ccpo.testing.scripted_server import ScriptedServer, tokenize
from tests.helpers.chat import chat_service, conversation, order_of
from tests.helpers.cli import start_server, stop_server
from tests.helpers.serve import LiveServer, post

WORDS = 700  # a reply longer than the 512 tokens every call was capped at before


def long_reply(req: dict) -> str:
    """Every model's reply: the same 700-word text (so the first round agrees)."""
    i = order_of(req["messages"])
    return f"Order {i}:" + "".join(f" step{k}" for k in range(WORDS)) + "\n"


@pytest.fixture
def long_world():
    with ScriptedServer(fallback=long_reply) as srv:
        yield srv


def _serve(chat_policy, url: str, **values) -> LiveServer:
    return chat_service(chat_policy, url, **values)


def _chat(url: str, i: int, **fields) -> httpx.Response:
    body = {"model": "ccpo", "messages": conversation(i), **fields}
    return post(url, "/v1/chat/completions", body)


def test_a_long_reply_comes_back_whole_without_a_cap(chat_policy, long_world) -> None:
    with _serve(chat_policy, long_world.url) as live:
        r = _chat(live.url, 7)
        assert r.status_code == 200, r.text
        content = r.json()["choices"][0]["message"]["content"]
        assert content == long_reply({"messages": conversation(7)})
        assert len(tokenize(content)) > 512
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        assert "x-ccpo-uncalibrated" not in r.headers
        assert long_world.requests
        assert all("max_tokens" not in q and "top_p" not in q for q in long_world.requests)
        assert all(q["temperature"] == 0 for q in long_world.requests)


def test_the_clients_sampling_reaches_the_models_and_a_cut_says_length(
    chat_policy, long_world
) -> None:
    with _serve(chat_policy, long_world.url) as live:
        r = _chat(live.url, 8, max_tokens=20, temperature=0.7, top_p=0.9, stop=["never-said"])
        assert r.status_code == 200, r.text
        assert r.headers["x-ccpo-uncalibrated"] == "max_tokens,temperature,top_p,stop"
        sent = long_world.requests
        assert sent and all(
            (q["max_tokens"], q["temperature"], q["top_p"], q["stop"])
            == (20, 0.7, 0.9, ["never-said"])
            for q in sent
        )
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length"
        whole = long_reply({"messages": conversation(8)})
        assert choice["message"]["content"] == "".join(tokenize(whole)[:20])
        assert r.json()["ccpo"]["finish_reason"] == "length"
        # streamed, the last chunk says the same
        body = {"model": "ccpo", "messages": conversation(9), "stream": True, "max_tokens": 20}
        with httpx.stream("POST", live.url + "/v1/chat/completions", json=body) as s:
            assert s.headers["x-ccpo-uncalibrated"] == "max_tokens"
            events = [ln for ln in s.iter_lines() if ln]
        last = json.loads(events[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length"
        # sampling the calibration used departs from nothing: no header; any cap departs
        # from a ladder calibrated without one (a logged reply may be longer)
        r = _chat(live.url, 10, temperature=0, top_p=1)
        assert r.status_code == 200 and "x-ccpo-uncalibrated" not in r.headers
        r = _chat(live.url, 10, max_tokens=5000)
        assert r.headers["x-ccpo-uncalibrated"] == "max_tokens"
        assert r.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"temperature": "hot"}, "temperature: must be a number from 0 to 2"),
        ({"max_tokens": 0}, "max_tokens: must be a whole number of tokens"),
        ({"top_p": 1.5}, "top_p: must be a number in (0, 1]"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop: must be up to 4 non-empty strings"),
    ],
)
def test_a_wrong_sampling_field_is_a_422_before_any_call(
    chat_policy, long_world, fields, needle
) -> None:
    with _serve(chat_policy, long_world.url) as live:
        r = _chat(live.url, 3, **fields)
        assert r.status_code == 422 and needle in r.json()["error"]["message"], r.text
        assert long_world.n_requests == 0


def test_the_ladders_own_cap_cuts_and_says_so(chat_policy, long_world) -> None:
    with _serve(chat_policy, long_world.url, reply_max_tokens=50) as live:
        r = _chat(live.url, 11)
        assert r.status_code == 200, r.text
        assert {q["max_tokens"] for q in long_world.requests} == {50}
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert len(tokenize(r.json()["choices"][0]["message"]["content"])) == 50
        # a client asking for more than the cap departs from nothing calibrated
        r = _chat(live.url, 12, max_tokens=800)
        assert "x-ccpo-uncalibrated" not in r.headers
        assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_the_replay_endpoint_cuts_at_max_tokens(chat_policy) -> None:
    """Served against the replay of the collected chat traces: whole by default; with the
    client's max_tokens under a logged reply's length, cut and reported as length."""
    proc, url = start_server("replay-server", "--traces", str(chat_policy / "chat.jsonl"))
    try:
        with _serve(chat_policy, url + "/v1") as live:
            i = 5
            whole = _chat(live.url, i)
            assert whole.status_code == 200, whole.text
            text = whole.json()["choices"][0]["message"]["content"]
            assert whole.json()["choices"][0]["finish_reason"] == "stop"
            cut = _chat(live.url, i, max_tokens=2)
            assert cut.status_code == 200, cut.text
            got = cut.json()["choices"][0]
            assert got["finish_reason"] == "length"
            assert len(got["message"]["content"]) < len(text)
            assert text.startswith(got["message"]["content"])
    finally:
        stop_server(proc)
