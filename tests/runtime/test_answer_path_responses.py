"""What a client sees of ``ccpo serve``'s answer path, request by request, over real HTTP: the
status of every kind of answer and refusal, each refusal the one JSON error body with its
headers. Pinned so that anything put ahead of FastAPI's route (a fast path) must answer the
same."""

from __future__ import annotations

import httpx

from tests.helpers.serve import LiveServer, make_service

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
TOKEN = "answer-path-token"
SETTINGS = {"auth_token": TOKEN, "max_body_bytes": 1024, "max_question_chars": 200}


async def _raises(*args, **kw):
    raise RuntimeError("secret detail")


def _fails(*args, **kw):
    raise RuntimeError("secret detail")


def test_each_answer_and_refusal_of_the_answer_path(world, policy_dir, prices_path):
    svc = make_service(policy_dir, world, prices_path, SETTINGS)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    chat = {"model": "ccpo", "messages": [{"role": "user", "content": Q}], "ccpo": {"id": "q-3"}}
    seen: list[httpx.Response] = []
    with LiveServer(svc) as ls:

        def ask(method: str, path: str, **kw) -> None:
            # a connection each: after a bug's 500 uvicorn closes FastAPI's connection
            seen.append(httpx.request(method, ls.url + path, timeout=30, **kw))

        ask("GET", "/healthz")
        ask("POST", "/v1/answer", json={"question": Q, "id": "q-1"}, headers=auth)
        ask("POST", "/v1/answer", json={"question": Q, "id": "q-1"}, headers=auth)  # again
        ask("POST", "/v1/answer", json={"question": "other", "id": "q-1"}, headers=auth)
        ask("POST", "/v1/answer", json={"question": Q})  # no token
        ask("POST", "/v1/answer", json={"question": Q}, headers={"Authorization": "Bearer x"})
        ask("POST", "/v1/answer", content=b"{junk", headers=auth)
        ask("POST", "/v1/answer", json={"question": 7}, headers=auth)
        ask("POST", "/v1/answer", json={"question": "x" * 300}, headers=auth)
        ask("POST", "/v1/answer", json={"question": "y" * 2000}, headers=auth)
        ask("POST", "/v1/answer", content=Q, headers={**auth, "content-type": "text/plain"})
        ask("POST", "/v1/answer", json={"question": Q, "id": "q-2", "max_cost_usd": 1e-12},
            headers=auth)  # fmt: skip
        ask("GET", "/v1/answer", headers=auth)
        ask("POST", "/v1/chat/completions", json=chat, headers=auth)
        ask("POST", "/v1/feedback", json={"id": "q-1", "none_of_them": True}, headers=auth)
        ask("GET", "/no-such-path")
        answered, svc.answered = svc.answered, _raises  # a bug while answering
        ask("POST", "/v1/answer", json={"question": Q}, headers=auth)
        svc.answered = answered
        svc.check_auth = _fails  # a bug in the rails
        ask("POST", "/v1/answer", json={"question": Q}, headers=auth)
        del svc.check_auth
        healthy = svc.health
        svc.health = lambda: healthy().model_copy(
            update={"status": "degraded", "detail": "the state database is away"}
        )
        ask("GET", "/healthz")
        del svc.health
    assert [r.status_code for r in seen] == [
        200, 200, 200, 409, 401, 401, 422, 422, 422, 413, 422, 402, 405, 200, 200, 404, 500,
        500, 503,
    ]  # fmt: skip
    assert all(r.headers["content-type"] == "application/json" for r in seen)
    assert seen[1].json() == seen[2].json() and seen[1].json()["id"] == "q-1"
    errors = [r.json()["error"] for r in seen if r.status_code >= 400 and r.status_code != 503]
    assert all(set(e) == {"type", "message"} for e in errors)
    assert [e["type"] for e in errors] == [
        "conflict", "unauthorized", "unauthorized", "invalid_request", "invalid_request",
        "invalid_request", "too_large", "invalid_request", "request_budget_exceeded",
        "http_error", "http_error", "internal_error", "internal_error",
    ]  # fmt: skip
    assert seen[4].headers["www-authenticate"] == "Bearer"
    assert all("secret detail" not in r.text for r in seen)
    assert seen[-1].json()["status"] == "degraded"


def test_a_rate_limited_answer_is_counted_once(world, policy_dir, prices_path):
    limits = {"rate_limit_per_minute": 1, "rate_burst": 3}
    svc = make_service(policy_dir, world, prices_path, limits)
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        seen = [http.post("/v1/answer", json={"question": Q}) for _ in range(5)]
    assert [r.status_code for r in seen] == [200, 200, 200, 429, 429]
    for r in seen[3:]:
        assert r.json()["error"]["type"] == "rate_limited" and int(r.headers["retry-after"]) >= 1
