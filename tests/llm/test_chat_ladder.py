"""A chat ladder collected over real HTTP: every step's model receives the app's conversation
(system prompt, earlier turns, the new turn) byte for byte, a step's own system prompt goes in
front of it, every reply is stored verbatim, and what a chat ladder cannot run is refused."""

from __future__ import annotations

import json

import pytest

from ccpo.errors import CCPOError
from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces
from ccpo.traces.ladder import ladder_of
from tests.helpers.chat import LADDER, chat_reply, collect_values, conversation, order_of

OWN_SYSTEM = "Answer for Acme's tier-2 desk."


def test_every_step_receives_the_conversation_byte_for_byte(tmp_path) -> None:
    ladder = [LADDER[0], {**LADDER[1], "guide": {"model": "big-m", "system": OWN_SYSTEM}}]
    with ScriptedServer(fallback=chat_reply) as srv:
        cfg = build_config(None, collect_values(srv, tmp_path, 5, ladder=ladder))
        assert collect(cfg, progress=False).done == 5
        sent = [(r["model"], r["messages"]) for r in srv.requests]
    exported = [json.loads(ln) for ln in (tmp_path / "conversations.jsonl").open()]
    by_order = {order_of(c["messages"]): c["messages"] for c in exported}
    # small-m and mid-m once each (round 2's mid-m is round 1's, paid once), big-m twice: the
    # ladder's step with its own system prompt in front, and the reference without it
    assert sorted(m for m, _ in sent) == ["big-m"] * 10 + ["mid-m"] * 5 + ["small-m"] * 5
    for model, msgs in sent:
        if msgs[0]["content"] == OWN_SYSTEM:
            assert model == "big-m" and msgs[0] == {"role": "system", "content": OWN_SYSTEM}
            msgs = msgs[1:]  # added in front: the app's own system prompt is still there
        assert msgs == by_order[order_of(msgs)]  # every turn, white space and all
        assert msgs[0]["content"] == "You are the support bot of Acme.\n  Keep replies short."
    traces = read_traces(tmp_path / "chat.jsonl")
    for tr in traces:
        i = order_of(tr.messages)
        assert tr.messages == conversation(i) and tr.question == "Same options."
        for r in tr.rounds:
            for step in (r.base, r.guide):  # verbatim: nothing extracted, nothing stripped
                assert step.answer == chat_reply({"model": step.model, "messages": tr.messages})
        assert traces[0].meta["labels"] == "reference:big-m"
        assert tr.rounds[1].guide.correct and tr.gold == [tr.rounds[1].guide.answer]
    answers = {tr.rounds[1].guide.answer for tr in traces}
    assert len(answers) == 5  # "Same options." after five histories: five replies
    assert any(a.startswith("  ") and a.endswith("\n") for a in answers)
    lad = ladder_of(traces)
    assert lad.family == "chat" and lad.round(2).guide.system == OWN_SYSTEM
    assert {r.verdict for r in lad.rounds} == {"agree"}


def test_a_plain_question_is_one_user_turn(tmp_path) -> None:
    """A chat ladder asked a JSONL question without messages sends it as the only turn."""
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Same options."}) + "\n")
    with ScriptedServer(fallback=chat_reply) as srv:
        cfg = build_config(None, collect_values(srv, tmp_path, 1, data=str(data)))
        collect(cfg, progress=False)
        assert {json.dumps(r["messages"]) for r in srv.requests} == {
            json.dumps([{"role": "user", "content": "Same options."}])
        }
    (tr,) = read_traces(tmp_path / "chat.jsonl")
    assert tr.messages is None and tr.rounds[0].base.answer.startswith("Which options?")


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"ladder": [{**LADDER[0], "verdict": "judge"}]}, "agree rounds only"),
        (
            {
                "task": "jsonl",
                "data": None,
                "ladder": [{"base": {"model": "small-m", "system": "x"}, "guide": "mid-m"}],
            },
            "chat family only",
        ),
        ({"task": "support", "family": "short"}, "the short family would not pass on"),
    ],
)
def test_what_a_chat_ladder_cannot_run_is_refused_before_any_call(tmp_path, change, needle) -> None:
    """A judge round; a step's own system prompt outside the chat family; conversations given
    to a family whose prompt takes one question (it would drop them)."""
    with ScriptedServer(fallback=chat_reply) as srv:
        values = collect_values(srv, tmp_path, 2, **change)
        if values["data"] is None:
            (tmp_path / "q.jsonl").write_text('{"id": "a", "question": "Q?", "gold": "x"}\n')
            values["data"] = str(tmp_path / "q.jsonl")
        cfg = build_config(None, values)
        with pytest.raises(CCPOError, match=needle):
            collect(cfg, progress=False)
        assert srv.n_requests == 0


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ({"role": "tool", "content": "42", "tool_call_id": "t1"}, "role 'tool' cannot be passed"),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "an image cannot be passed on",
        ),
        (
            {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]},
            "a tool call cannot be passed on",
        ),
    ],
)
def test_an_exported_conversation_a_model_cannot_take_is_refused_by_line(
    tmp_path, message, needle
) -> None:
    data = tmp_path / "bad.jsonl"
    good = {"id": "ok", "messages": conversation(1)}
    bad = {"id": "bad", "messages": [*conversation(2)[:3], message, conversation(2)[3]]}
    data.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with ScriptedServer(fallback=chat_reply) as srv:
        cfg = build_config(None, collect_values(srv, tmp_path, 1, data=str(data)))
        with pytest.raises(CCPOError) as e:
            collect(cfg, progress=False)
        assert srv.n_requests == 0
    assert f"{data}:2: messages[3]" in str(e.value) and needle in str(e.value)
