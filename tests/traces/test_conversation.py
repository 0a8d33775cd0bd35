"""A conversation as data: checked and normalised once, keyed by all of it, carried by a trace
(``messages``) without changing files that have none."""

from __future__ import annotations

import json

import pytest

from ccpo.traces.conversation import (
    ConversationError,
    as_conversation,
    check_size,
    conversation_of,
)
from ccpo.traces.schema import Trace
from tests.helpers.chat import conversation


def test_the_same_follow_up_after_two_histories_is_two_conversations() -> None:
    a, b = conversation_of(conversation(1)), conversation_of(conversation(2))
    assert a.text == b.text == "Same options."
    assert a.key() != b.key() and a.key() == conversation_of(conversation(1)).key()
    # text parts are the same text as one string; the order of a message's keys does not matter
    parts = [{**m, "content": [{"type": "text", "text": m["content"][:3]},
                               {"type": "text", "text": m["content"][3:]}]}
             for m in conversation(1)]  # fmt: skip
    assert conversation_of(parts) == a
    flipped = [{"content": m["content"], "role": m["role"]} for m in conversation(1)]
    assert conversation_of(flipped).key() == a.key()
    assert as_conversation("Hi?").as_list() == [{"role": "user", "content": "Hi?"}]


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "a non-empty list of messages is required"),
        ([{"role": "user", "content": "a", "audio": {"id": "x"}}], "messages[0].audio: audio"),
        ([{"role": "function", "content": "a"}, {"role": "user", "content": "b"}],
         "messages[0]: role 'function' cannot be passed on"),
        ([{"role": "user", "content": [{"type": "file", "file": {}}]}],
         "messages[0].content[0]: a file cannot be passed on"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
         "the last message must be the user's new turn"),
    ],
)  # fmt: skip
def test_what_a_model_cannot_be_given_is_named(messages, needle) -> None:
    with pytest.raises(ConversationError) as e:
        conversation_of(messages)
    assert needle in str(e.value)
    with pytest.raises(ConversationError, match="more than the 10 this server accepts"):
        check_size(conversation_of(conversation(1)), max_chars=10)


def _trace(**extra) -> dict:
    step = {"model": "m", "answer": "x", "correct": True,
            "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    rounds = [{"round": 1, "base": step, "guide": step}]
    return {"schema": "ccpo.trace/v1", "id": "a", "task": "chat", "question": "Same options.",
            "gold": ["x"], "rounds": rounds, **extra}  # fmt: skip


def test_a_trace_carries_its_conversation_and_older_files_are_unchanged() -> None:
    tr = Trace.model_validate(_trace(messages=conversation(3)))
    d = tr.to_json_dict()
    assert d["messages"] == conversation(3)
    assert list(d)[list(d).index("question") + 1] == "messages"  # beside the question
    assert Trace.model_validate(json.loads(json.dumps(d))) == tr
    old = Trace.model_validate(_trace())
    assert "messages" not in old.to_json_dict() and old.messages is None
    with pytest.raises(ValueError, match="role 'tool' cannot be passed on"):
        Trace.model_validate(_trace(messages=[{"role": "tool", "content": "x"}]))
