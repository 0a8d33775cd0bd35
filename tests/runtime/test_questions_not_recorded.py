"""A conversation the replay endpoint does not hold, over real HTTP: ``ccpo replay-server``
refuses it with a 404 whose code is ``not_recorded`` (a model it lacks for a recorded
conversation is a 404 naming the model, without that code); ``ccpo serve`` in front of it
answers a 404 ``not_recorded`` saying the conversation is not in the recorded traces (never a
502 blaming the model name or the URL), asked once (the openai SDK does not retry it), counted
as no server failure; the next recorded conversation is answered."""

from __future__ import annotations

import httpx
import openai
import pytest

from ccpo.evaluation.dry_run import ReplayThread
from ccpo.runtime.replay_server import ReplayIndex, create_replay_app
from tests.helpers.chat import chat_service, conversation


@pytest.fixture
def replay(chat_policy):
    app = create_replay_app(ReplayIndex.from_file(chat_policy / "chat.jsonl"))
    with ReplayThread(app) as rs:
        yield rs.url


def _ask(url: str, model: str, messages: list[dict]) -> httpx.Response:
    body = {"model": model, "messages": messages}
    return httpx.post(url + "/chat/completions", json=body, timeout=30)


def test_the_replay_endpoint_says_which_is_missing(replay) -> None:
    r = _ask(replay, "small-m", conversation(5000))  # (the file holds orders 0-119)
    err = r.json()["error"]
    assert r.status_code == 404 and err["code"] == "not_recorded", r.text
    assert "this conversation is not in the recorded traces" in err["message"]
    r = _ask(replay, "other-m", conversation(3))
    err = r.json()["error"]
    assert r.status_code == 404 and "code" not in err, r.text
    assert "model 'other-m' has no recorded answer" in err["message"]
    assert _ask(replay, "small-m", conversation(3)).status_code == 200


def test_serve_says_the_conversation_is_not_recorded(chat_policy, replay) -> None:
    with chat_service(chat_policy, replay) as live:
        sdk = openai.OpenAI(base_url=live.url + "/v1", api_key="none")  # its default retries
        with pytest.raises(openai.NotFoundError) as e:
            sdk.chat.completions.create(model="ccpo", messages=conversation(5000))
        err = e.value.response.json()["error"]
        assert err["type"] == "not_recorded", err
        assert "this conversation is not in the recorded traces" in err["message"]
        assert "model" not in err["message"] and "URL" not in err["message"]
        metrics = lambda: httpx.get(live.url + "/metrics.json").json()  # noqa: E731
        assert metrics()["errors"] == 1  # the SDK asked once: no retry
        assert httpx.get(replay.removesuffix("/v1") + "/healthz").json()["missing"] >= 1
        done = sdk.chat.completions.create(model="ccpo", messages=conversation(3))
        assert done.choices[0].message.content
        m = metrics()
        assert m["errors"] == 1 and m["errors_by_kind"] == {}, m  # a 404: no server failure
        assert httpx.get(live.url + "/healthz").json()["status"] == "ok"
