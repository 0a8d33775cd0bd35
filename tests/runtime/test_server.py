"""``ccpo serve``'s app under uvicorn on 127.0.0.1, against the scripted LLM server (real HTTP)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from ccpo.runtime.answer_set import AnswerSet
from ccpo.runtime.server import openapi_spec
from tests.helpers.serve import FEEDBACK_UNLIMITED, LiveServer, Q, make_service, post, state_at
from tests.helpers.world import make_world

ROOT = Path(__file__).resolve().parents[2]


def test_answer_health_metrics(world, policy_dir, prices_path):
    with LiveServer(make_service(policy_dir, world, prices_path)) as ls:
        h = httpx.get(ls.url + "/healthz").json()
        assert h == {
            "status": "ok", "policy": "ccpo", "horizon": 4, "alpha": 0.1, "kappa": 0.3,
            "detail": None,
        }  # fmt: skip
        r = post(ls.url, "/v1/answer", {"question": Q, "id": "a-1"})
        assert r.status_code == 200, r.text
        s = r.json()
        assert s["id"] == "a-1" and s["answers"] and s["rounds"] >= 1 and s["cost_usd"] > 0
        r2 = post(ls.url, "/v1/answer", {"question": "What is the capital of Peru?"})
        assert r2.status_code == 200 and len(r2.json()["id"]) == 32
        again = post(ls.url, "/v1/answer", {"question": Q, "id": "a-1"})  # idempotent retry
        assert again.json() == s
        # the body is the record the store keeps (serialised once), as the app's model says
        assert ls.service.store.answers.lookup("a-1").result()[1] == s
        assert AnswerSet.model_validate_json(r.content).model_dump(mode="json") == s
        assert r.headers["content-type"] == "application/json"
        clash = post(ls.url, "/v1/answer", {"question": "other", "id": "a-1"})
        assert clash.status_code == 409 and "already used" in clash.json()["error"]["message"]
        m = httpx.get(ls.url + "/metrics.json").json()
        assert m["requests"] == 2 and m["kappa"] == 0.3 and m["feedback"] == 0
        assert m["cost_usd"] == pytest.approx(s["cost_usd"] + r2.json()["cost_usd"])
        assert m["dollars_spent"] == pytest.approx(m["cost_usd"])
        assert m["mean_rounds"] == (s["rounds"] + r2.json()["rounds"]) / 2
        assert m["coverage"] is None
        # this replica's own write transactions: each answer's commit at least
        assert 2 <= m["state_commits"] <= ls.service.store.engine.commits
        prom = httpx.get(ls.url + "/metrics").text
        line = f'ccpo_state_commits_total{{replica="{m["replica"]}"}} '
        assert float(prom.split(line)[1].split()[0]) >= m["state_commits"]


@pytest.mark.parametrize(
    "body, status, needle",
    [
        ({"question": ""}, 422, "question: String should have at least 1 character"),
        ({"question": "   "}, 422, "blank"),
        ({"question": 42}, 422, "question: Input should be a valid string"),
        ({"question": ["a"]}, 422, "question"),
        ({}, 422, "question: Field required"),
        ({"question": "ok", "max_cost_usd": "lots"}, 422, "max_cost_usd"),
        ({"question": "ok", "surprise": 1}, 422, "surprise: Extra inputs are not permitted"),
        ({"question": "ok", "id": "has space"}, 422, "id: String should match pattern"),
        (b"{not json", 422, "not valid JSON"),
        ({"question": "x" * 5000}, 422, "more than the 4000"),
        ({"question": "x" * 20000}, 413, "larger than 8192 bytes"),
    ],
)
def test_bad_input_is_4xx_with_a_message(body, status, needle, world, policy_dir, prices_path):
    svc = make_service(
        policy_dir, world, prices_path, {"max_body_bytes": 8192, "max_question_chars": 4000}
    )
    with LiveServer(svc) as ls:
        world.reset_counters()
        headers = {"Content-Type": "application/json"}
        r = httpx.post(
            ls.url + "/v1/answer",
            **({"json": body} if isinstance(body, dict) else {"content": body}),
            headers=headers,
        )
        assert r.status_code == status, r.text
        assert needle in r.json()["error"]["message"]
        assert world.n_requests == 0  # nothing was sent to an LLM
        fb = post(ls.url, "/v1/feedback", {"id": "x", "correct_answer": "A", "none_of_them": True})
        assert fb.status_code == 422 and "exactly one" in fb.json()["error"]["message"]
        assert httpx.get(ls.url + "/metrics.json").json()["requests"] == 0


def test_survives_a_flaky_endpoint(policy_dir, prices_path):
    with make_world(
        failure_rate=0.2,
        seed=3,
        failure_kinds=("429", "500", "garbage", "timeout"),
        timeout_sleep=0.3,
    ) as flaky:
        svc = make_service(policy_dir, flaky, prices_path, timeout=0.2, max_retries=8)
        with LiveServer(svc) as ls:
            rs = [post(ls.url, "/v1/answer", {"question": f"{Q} #{i}"}) for i in range(25)]
            assert [r.status_code for r in rs] == [200] * 25
            assert flaky.n_failures > 5
            m = httpx.get(ls.url + "/metrics.json").json()
            assert m["requests"] == 25 and m["errors"] == 0


def test_dead_endpoint_is_502_and_nothing_half_written(policy_dir, prices_path, tmp_path):
    with make_world(failure_rate=1.0, failure_kinds=("500",)) as dead:
        svc = make_service(
            policy_dir, dead, prices_path, {"state": state_at(tmp_path, "s.sqlite")}, max_retries=1
        )
        with LiveServer(svc) as ls:
            r = post(ls.url, "/v1/answer", {"question": Q, "id": "dead-1"})
            assert r.status_code == 502
            msg = r.json()["error"]["message"]
            assert "still failed after its retries (request dead-1;" in msg
            m = httpx.get(ls.url + "/metrics.json").json()
            assert m["requests"] == 0 and m["errors"] == 1
            fb = post(ls.url, "/v1/feedback", {"id": "dead-1", "none_of_them": True})
            assert fb.status_code == 404  # no answer record was written


def test_upstream_key_is_never_echoed(policy_dir, prices_path, monkeypatch):
    monkeypatch.setenv("UPSTREAM_KEY", "sk-upstream-very-secret")
    with make_world(api_key="the-right-key") as locked:
        svc = make_service(policy_dir, locked, prices_path, base_key_env="UPSTREAM_KEY")
        with LiveServer(svc) as ls:
            r = post(ls.url, "/v1/answer", {"question": Q})
            assert r.status_code == 502 and "refused the request (its key" in r.text
            assert "sk-upstream-very-secret" not in r.text
            assert "sk-upstream-very-secret" not in httpx.get(ls.url + "/metrics").text


def test_budgets_over_http(world, policy_dir, prices_path):
    cap = 0.02
    svc = make_service(policy_dir, world, prices_path, kappa=0.0, max_cost_total=cap)
    with LiveServer(svc) as ls:
        r = post(ls.url, "/v1/answer", {"question": Q, "max_cost_usd": 2e-4})
        assert r.status_code == 402 and "budget" in r.json()["error"]["message"]
        # round 1 is checked too: nothing is sent for a budget below a call's worst case
        world.reset_counters()
        r = post(ls.url, "/v1/answer", {"question": Q + "!", "max_cost_usd": 1e-300})
        assert r.status_code == 402 and world.n_requests == 0
        codes = []
        for i in range(40):
            r = post(ls.url, "/v1/answer", {"question": f"{Q} {i}"})
            codes.append(r.status_code)
            if r.status_code == 503:
                break
        assert codes[-1] == 503 and "budget" in r.json()["error"]["message"]
        assert codes.count(200) >= 2
        m = httpx.get(ls.url + "/metrics.json").json()
        assert m["dollars_spent"] <= cap  # never past the cap


def _stream(ls: LiveServer, n: int, feedback, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + n):
        s = post(ls.url, "/v1/answer", {"question": f"{Q} v{i}", "id": f"q{i}"}).json()
        f = post(ls.url, "/v1/feedback", {"id": s["id"], **feedback(s)})
        assert f.status_code == 200, f.text
        out.append({**s, "fb": f.json()})
    return out


def test_feedback_moves_kappa_and_persists(world, policy_dir, prices_path, tmp_path):
    state = state_at(tmp_path, "state.sqlite")
    # the operator widened every bound: κ free in [0, 1], any step, from the first feedback
    conf = {
        "state": state,
        "adapt_kappa": True,
        "kappa_eta0": 0.1,
        "kappa_max_step": 5,
        "kappa_band": 1.0,
        "kappa_max_delta": 1.0,
        "kappa_min_feedback": 0,
        "feedback_per_minute": FEEDBACK_UNLIMITED,
    }
    with LiveServer(make_service(policy_dir, world, prices_path, conf)) as ls:
        k0 = httpx.get(ls.url + "/metrics.json").json()["kappa"]
        # a hard phase: nothing returned is right -> κ falls, sets grow
        hard = _stream(ls, 12, lambda s: {"none_of_them": True})
        kappas = [h["fb"]["kappa"] for h in hard]
        assert all(b <= a for a, b in zip([k0, *kappas], kappas, strict=False))
        assert kappas[-1] < k0 - 0.2
        assert kappas[0] > k0 - 0.1  # a gentle first step
        first, last = hard[:2], hard[-4:]
        assert np.mean([len(h["answers"]) for h in last]) > np.mean(
            [len(h["answers"]) for h in first]
        )  # bigger sets ...
        assert np.mean([h["rounds"] for h in last]) > np.mean([h["rounds"] for h in first])
        assert hard[-1]["kappa"] == pytest.approx(kappas[-2])  # answered with the κ in force
        again = post(ls.url, "/v1/feedback", {"id": "q0", "none_of_them": True})
        assert again.status_code == 409
        assert post(ls.url, "/v1/feedback", {"id": "nope", "none_of_them": True}).status_code == 404
        m = httpx.get(ls.url + "/metrics.json").json()
        assert m["coverage"] == 0.0 and m["feedback"] == 12 and m["kappa"] == kappas[-1]
        k_low = kappas[-1]
    # restart: κ, counters and answer records come back from the state file
    with LiveServer(make_service(policy_dir, world, prices_path, conf)) as ls:
        m2 = httpx.get(ls.url + "/metrics.json").json()
        assert m2["kappa"] == pytest.approx(k_low) and m2["feedback"] == 12
        assert m2["requests"] == 12 and m2["dollars_spent"] == pytest.approx(m["dollars_spent"])
        assert post(ls.url, "/v1/feedback", {"id": "q1", "none_of_them": True}).status_code == 409
        # an easy phase: every answer set is right -> κ rises
        easy = _stream(ls, 8, lambda s: {"correct_answer": s["answers"][0]}, start=100)
        assert all(e["fb"]["covered"] for e in easy)
        assert easy[-1]["fb"]["kappa"] > k_low + 0.01
        m3 = httpx.get(ls.url + "/metrics.json").json()
        assert m3["coverage"] == pytest.approx(8 / 20) and m3["recent_coverage"] == m3["coverage"]


def test_fixed_kappa_still_tracks_coverage(world, policy_dir, prices_path):
    with LiveServer(make_service(policy_dir, world, prices_path)) as ls:
        _stream(ls, 3, lambda s: {"none_of_them": True})
        _stream(ls, 1, lambda s: {"correct_answer": s["answers"][-1].upper()}, start=10)
        m = httpx.get(ls.url + "/metrics.json").json()
        assert m["kappa"] == 0.3 and m["coverage"] == 0.25 and not m["adapt_kappa"]


def test_state_file_of_another_policy_is_refused(world, policy_dir, prices_path, tmp_path):
    from ccpo.errors import CCPOError
    from tests.helpers.policies import make_policy

    state = {"state": state_at(tmp_path, "s.sqlite")}
    make_service(policy_dir, world, prices_path, state).store.close()
    other = make_policy(tmp_path / "other", steps=3)
    with pytest.raises(CCPOError, match="another policy"):
        make_service(other, world, prices_path, state)


def test_committed_openapi_matches_the_app():
    committed = json.loads((ROOT / "docs" / "openapi.json").read_text())
    assert committed == openapi_spec(), (
        "docs/openapi.json is stale: run `ccpo serve --write-openapi docs/openapi.json`"
    )


def test_hotpotqa_uses_react_over_the_given_context(world, policy_dir, prices_path):
    svc = make_service(policy_dir, world, prices_path, task="hotpotqa", kappa=0.0)
    with LiveServer(svc) as ls:
        q = "Paris Hilton is named after which city?"
        r = post(ls.url, "/v1/answer", {"question": q})
        assert r.status_code == 422 and "context" in r.json()["error"]["message"]
        ctx = [
            {"title": "Paris Hilton", "text": "Paris Hilton is an American media personality."},
            {"title": "Paris", "text": "Paris is the capital of France."},
        ]
        world.reset_counters()
        r = post(ls.url, "/v1/answer", {"question": q, "context": ctx})
        assert r.status_code == 200, r.text
        s = r.json()
        assert s["rounds"] == 4 and "Paris" in s["answers"]  # the scripted ReAct finishes
        prompts = [x["messages"][-1]["content"] for x in world.requests]
        assert any("Observation 1: [Paris" in p for p in prompts)  # searched the context


def test_healthz_is_answered_before_the_app_with_the_routes_body(world, policy_dir, prices_path):
    """``GET /healthz`` of the served app has the body and status FastAPI's own route gives
    (once answered by a layer ahead of the app, since removed: ccpo.runtime.http)."""
    import asyncio

    from ccpo.runtime.server import create_app

    async def through_the_route(app) -> httpx.Response:  # the app alone: no fast path
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
            return await http.get("/healthz")

    svc = make_service(policy_dir, world, prices_path)
    with LiveServer(svc) as ls:
        fast = httpx.get(ls.url + "/healthz")
        routed = asyncio.run(through_the_route(create_app(svc)))
    assert fast.status_code == routed.status_code == 200
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert fast.json() == routed.json() == svc.health().model_dump(mode="json")


def test_an_answer_utf8_cannot_encode_is_sent_escaped():
    """A lone surrogate an endpoint sent back in an answer: the JSON text stored and sent
    escapes it (pydantic's own serialiser refuses it)."""
    from ccpo.runtime.service import as_json

    s = AnswerSet(id="x", question="q", answers=["a\ud800"], answer="a\ud800", rounds=1,
                  horizon=2, cost_usd=0.0, cost_by_model={}, log=[], alpha=0.1, kappa=0.3,
                  policy="ccpo")  # fmt: skip
    text = as_json(s)
    text.encode("utf-8")  # sendable
    assert json.loads(text)["answers"] == ["a\ud800"]


def test_a_bug_answers_the_documented_json_500_on_both_paths(world, policy_dir, prices_path):
    """A bug while answering (injected: the service's answer raises) gives the JSON 500
    ``internal_error`` naming only the exception's type, on ``/v1/answer`` and on
    ``/v1/chat/completions``."""
    svc = make_service(policy_dir, world, prices_path)

    async def broken(req):
        raise RuntimeError("secret detail")

    svc.answered = broken
    with LiveServer(svc) as ls:
        fast = httpx.post(ls.url + "/v1/answer", json={"question": "Q?"})
        chat = httpx.post(
            ls.url + "/v1/chat/completions",
            json={"model": "ccpo", "messages": [{"role": "user", "content": "Q?"}]},
        )
    for r in (fast, chat):
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err["type"] == "internal_error"
        assert err["message"] == "the server failed (RuntimeError)"
        assert "secret detail" not in r.text


def test_a_bug_in_the_rails_is_the_json_500_too(world, policy_dir, prices_path):
    """A bug in the rails themselves (injected: the token check raises): ``/v1/answer``
    gives the same JSON 500 as a route behind them."""
    svc = make_service(policy_dir, world, prices_path)

    def broken(auth):
        raise RuntimeError("secret detail")

    svc.check_auth = broken
    with LiveServer(svc) as ls:
        fast = httpx.post(ls.url + "/v1/answer", json={"question": "Q?"})
        junk = httpx.post(ls.url + "/v1/answer", content=b"{junk")
        chat = httpx.post(
            ls.url + "/v1/chat/completions",
            json={"model": "ccpo", "messages": [{"role": "user", "content": "Q?"}]},
        )
    for r in (fast, junk, chat):
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["error"] == {
            "type": "internal_error", "message": "the server failed (RuntimeError)"
        }  # fmt: skip
    assert world.n_requests == 0
