"""``ccpo serve`` with a chat policy, over real HTTP against a recording scripted server: the
app's conversation reaches every model byte for byte, the reply comes back whole (streamed as
server-sent events too), what cannot be passed on is a 422 before any call is paid, latency is
measured, and a policy of another family says what it drops."""

from __future__ import annotations

import json
import logging
import re
import sys

import httpx
import openai
import pytest

from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces import conversation as conversation_module
from tests.helpers.chat import SKILL, chat_reply, chat_service, conversation
from tests.helpers.serve import LiveServer, make_service, post

GOOD = "  Order {i}: a refund, or wait two days.\n\nAnything else?\n"


@pytest.fixture
def chat_world():
    with ScriptedServer(fallback=chat_reply) as srv:
        yield srv


def _serve(chat_policy, srv, **server) -> LiveServer:
    return chat_service(chat_policy, srv.url, server=server, timeout=5.0)


def _all_right() -> int:
    """An order every model replies to with the same good reply (white space and all)."""
    return next(
        i for i in range(1000, 3000)
        if all(chat_reply({"model": m, "messages": conversation(i)}) == GOOD.format(i=i)
               for m in SKILL)
    )  # fmt: skip


def test_the_conversation_reaches_every_model_and_the_reply_comes_back_whole(
    chat_policy, chat_world
) -> None:
    with _serve(chat_policy, chat_world) as live:
        sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
        for i in (_all_right(), 1001, 1002, 1003):
            chat_world.reset_counters()
            r = sdk.chat.completions.with_raw_response.create(
                model="ccpo", messages=conversation(i)
            )
            assert "x-ccpo-dropped" not in r.headers
            done = r.parse()
            content, s = done.choices[0].message.content, done.model_extra["ccpo"]
            sent = [(q["model"], q["messages"]) for q in chat_world.requests]
            assert sent and all(msgs == conversation(i) for _, msgs in sent)  # byte for byte
            # the content is one model's whole reply, as it wrote it: the one answer
            replies = {chat_reply({"model": m, "messages": conversation(i)}) for m, _ in sent}
            assert content == s["answer"] and content in replies
            assert s["question"] == "Same options."
            assert 0 < s["ttft_ms"] <= s["latency_ms"]
        assert content  # (the last one, as a sanity check of the loop)
    first = _all_right()
    assert GOOD.format(i=first).startswith("  ") and GOOD.format(i=first).endswith("?\n")


def test_a_chosen_reply_streams_as_server_sent_events(chat_policy, chat_world) -> None:
    i = _all_right()
    with _serve(chat_policy, chat_world) as live:
        body = {"model": "ccpo", "messages": conversation(i), "stream": True}
        with httpx.stream("POST", live.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [ln for ln in r.iter_lines() if ln]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        parts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
        assert "".join(parts) == GOOD.format(i=i) and len(parts) == 3  # one line a chunk
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["ccpo"]["answer"] == GOOD.format(i=i)
        # the openai SDK reads the same stream
        sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)
        got = sdk.chat.completions.create(model="ccpo", messages=conversation(i), stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in got) == GOOD.format(i=i)


def _with(i: int, *extra: dict) -> list[dict]:
    """Conversation ``i`` with ``extra`` messages before its last turn."""
    c = conversation(i)
    return [*c[:-1], *extra, c[-1]]


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        (_with(1, {"role": "tool", "content": "42", "tool_call_id": "t1"}),
         "messages[3]: role 'tool' cannot be passed on"),
        (_with(1, {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]}),
         "messages[3].tool_calls: a tool call cannot be passed on"),
        (_with(1, {"role": "user", "content": [{"type": "image_url",
                                                "image_url": {"url": "https://x/y.png"}}]}),
         "part 0 is of type 'image_url'"),
        (_with(1, {"role": "user", "content": [{"type": "input_audio",
                                                "input_audio": {"data": "", "format": "wav"}}]}),
         "part 0 is of type 'input_audio'"),
        (_with(1, {"role": "developer", "content": "Be brief."}),
         "messages[3]: role 'developer' cannot be passed on"),
        (conversation(1)[:3], "the last message must be the user's new turn"),
        (_with(1, {"role": "user", "content": "x" * 600}),
         "more than the 500 this server accepts (server.max_conversation_chars)"),
    ],
)  # fmt: skip
def test_what_cannot_be_passed_on_is_a_422_before_any_call(
    chat_policy, chat_world, messages, needle
) -> None:
    with _serve(chat_policy, chat_world, max_conversation_chars=500) as live:
        r = post(live.url, "/v1/chat/completions", {"model": "ccpo", "messages": messages})
        assert r.status_code == 422, r.text
        assert needle in r.json()["error"]["message"]
        assert chat_world.n_requests == 0  # nothing was asked, nothing paid
        m = httpx.get(live.url + "/metrics.json").json()
        assert m["rejected"] == 1 and m["requests"] == 0 and m["dollars_spent"] == 0


def test_latency_histograms_count_every_answer(chat_policy, chat_world) -> None:
    with _serve(chat_policy, chat_world) as live:
        for i, stream in ((1, False), (2, True), (3, False)):
            body = {"model": "ccpo", "messages": conversation(i), "stream": stream}
            assert post(live.url, "/v1/chat/completions", body).status_code == 200
        assert post(live.url, "/v1/answer", {"question": "What now?"}).status_code == 200
        text = httpx.get(live.url + "/metrics").text
    for name in ("ccpo_ttft_seconds", "ccpo_latency_seconds"):
        assert f"# TYPE {name} histogram" in text
        count = re.search(rf'^{name}_count{{replica="[^"]*"}} (\S+)$', text, re.M)
        inf = re.search(rf'^{name}_bucket{{le="\+Inf",replica="[^"]*"}} (\S+)$', text, re.M)
        total = re.search(rf'^{name}_sum{{replica="[^"]*"}} (\S+)$', text, re.M)
        assert count and inf and total, text[-2000:]
        assert float(count.group(1)) == float(inf.group(1)) == 4 and float(total.group(1)) > 0


def test_another_family_says_what_it_does_not_pass_on(
    policy_dir, world, prices_path, tmp_path, caplog
) -> None:
    """An MMLU policy answers the last user turn only: the system prompt and the earlier turns
    are dropped, and the response header and a log line say so."""
    q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
    full = [{"role": "system", "content": "SYSTEM-TEXT"},
            {"role": "user", "content": "EARLIER-TURN"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": q}]  # fmt: skip
    cases = [(full, "system,history"), (full[1:], "history"), (full[:1] + full[3:], "system"),
             (full[3:], None)]  # fmt: skip
    with LiveServer(make_service(policy_dir, world, prices_path)) as live:
        r = post(live.url, "/v1/answer", {"messages": full})
        assert r.status_code == 200 and r.headers["x-ccpo-dropped"] == "system,history"
        assert r.json()["question"] == q and r.json()["conversation"] is None
        for messages, dropped in cases:
            world.reset_counters()
            with caplog.at_level(logging.INFO, logger="ccpo.serve"):
                caplog.clear()
                r = post(live.url, "/v1/chat/completions", {"model": "ccpo", "messages": messages})
            assert r.status_code == 200, r.text
            assert r.headers.get("x-ccpo-dropped") == dropped
            sent = json.dumps(world.requests)
            assert "SYSTEM-TEXT" not in sent and "EARLIER-TURN" not in sent and "prime" in sent
            said = [
                rec.getMessage() for rec in caplog.records if "not passed on" in rec.getMessage()
            ]
            assert len(said) == (dropped is not None)
            if dropped:
                assert " and ".join(dropped.split(",")) in said[0] and "mcq policy" in said[0]
        body = {"model": "ccpo", "messages": full, "stream": True}
        with httpx.stream("POST", live.url + "/v1/chat/completions", json=body) as r:
            assert r.headers["x-ccpo-dropped"] == "system,history"
            assert r.headers["content-type"].startswith("text/event-stream")
            assert [ln for ln in r.iter_lines() if ln][-1] == "data: [DONE]"


def test_an_id_stands_for_its_whole_conversation(chat_policy, chat_world) -> None:
    """The same id again with the same conversation is the stored answer (nothing asked); with
    the same follow-up after another history it is another question: a 409. ``/v1/answer``
    takes the conversation as ``messages`` (its question is the last user turn)."""
    with _serve(chat_policy, chat_world) as live:
        native = post(live.url, "/v1/answer", {"id": "c-1", "messages": conversation(7)})
        assert native.status_code == 200 and native.json()["question"] == "Same options."
        assert native.json()["conversation"] and "x-ccpo-dropped" not in native.headers
        chat_world.reset_counters()
        again = {"model": "ccpo", "messages": conversation(7), "ccpo": {"id": "c-1"}}
        r = post(live.url, "/v1/chat/completions", again)
        assert r.status_code == 200 and chat_world.n_requests == 0
        assert r.json()["ccpo"] == native.json()
        other = {**again, "messages": conversation(8)}
        r = post(live.url, "/v1/chat/completions", other)
        assert r.status_code == 409 and "already used for another question" in r.text
        assert chat_world.n_requests == 0


def _count_parses(monkeypatch) -> list[int]:
    """Every call of the one parser of conversations, by every module that holds it, counted
    (the real parser still does the work)."""
    calls: list[int] = []
    real = conversation_module.conversation_of

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    for module in list(sys.modules.values()):
        if vars(module).get("conversation_of") is real:
            monkeypatch.setattr(module, "conversation_of", counted)
    return calls


def test_a_conversation_is_parsed_once_per_request(
    chat_policy, chat_world, policy_dir, world, prices_path, monkeypatch
) -> None:
    """The messages become one conversation at the HTTP edge: each request, on either
    endpoint, for a chat policy or another family's, parses them exactly once."""
    calls = _count_parses(monkeypatch)
    with _serve(chat_policy, chat_world) as live:
        for path, body in (
            ("/v1/chat/completions", {"model": "ccpo", "messages": conversation(11)}),
            ("/v1/chat/completions", {"model": "ccpo", "messages": conversation(12),
                                      "ccpo": {"id": "once-1"}}),
            ("/v1/answer", {"messages": conversation(13)}),
            ("/v1/answer", {"id": "once-2", "messages": conversation(14)}),
            ("/v1/answer", {"question": "Same options.", "messages": conversation(15)}),
        ):  # fmt: skip
            calls.clear()
            r = post(live.url, path, body)
            assert r.status_code == 200, r.text
            assert len(calls) == 1, (path, body, len(calls))
    with LiveServer(make_service(policy_dir, world, prices_path)) as live:
        calls.clear()
        r = post(live.url, "/v1/answer", {"messages": conversation(16)})
        assert r.status_code == 200 and r.json()["conversation"] is None
        assert len(calls) == 1, len(calls)
