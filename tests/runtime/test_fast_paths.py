"""Each fast path of ``ccpo serve`` (:mod:`ccpo.runtime.http`) switched off takes FastAPI's and
uvicorn's plain route with the same responses: the same requests, sent in the same order to a
server with every fast path on and to one with a variant of the switches, get the same status
codes, headers and JSON bodies (over real HTTP, against the scripted LLM server)."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.helpers.serve import LiveServer, Q, make_service

SWITCHES = ("fast_answer", "fast_health", "joined_writes")
VARIANTS = {
    "all off": dict.fromkeys(SWITCHES, False),
    **{f"only {s}": {t: t == s for t in SWITCHES} for s in SWITCHES},
}
TOKEN = "fast-path-token"
SETTINGS = {"auth_token": TOKEN, "max_body_bytes": 1024, "max_question_chars": 200}


def _seen(r: httpx.Response) -> tuple:
    """What a client sees of a response: status, headers (but the date), JSON or text body;
    what varies from run to run (wall times, a rate limit's wait) masked."""
    headers = {k: v for k, v in r.headers.items() if k != "date"}
    if "retry-after" in headers:
        headers["retry-after"] = "N"
    try:
        body = r.json()
    except ValueError:
        return r.status_code, headers, r.text
    if _mask(body):
        headers["content-length"] = "N"
    if r.status_code == 429:
        body["error"]["message"] = re.sub(r"[\d.]+ s$", "N s", body["error"]["message"])
    return r.status_code, headers, body


def _mask(body) -> bool:
    """Mask what varies from run to run (wall times, a completion's id and time); any?"""
    if isinstance(body, list):
        return any([_mask(b) for b in body])
    if not isinstance(body, dict):
        return False
    masked = [body.pop(k, None) is not None for k in ("latency_ms", "created")]
    if str(body.get("id", "")).startswith("chatcmpl-"):
        body["id"] = "chatcmpl-N"
    return any([*masked, *(_mask(v) for v in body.values())])


def _exchange(svc, ls: LiveServer) -> list[tuple]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    chat = {"model": "ccpo", "messages": [{"role": "user", "content": Q}], "ccpo": {"id": "q-3"}}
    seen = []

    def ask(method: str, path: str, **kw) -> None:
        # a connection each: after a bug's 500 uvicorn closes FastAPI's (which re-raises)
        seen.append(_seen(httpx.request(method, ls.url + path, timeout=30, **kw)))

    ask("GET", "/healthz")
    ask("HEAD", "/healthz")
    ask("POST", "/v1/answer", json={"question": Q, "id": "q-1"}, headers=auth)
    ask("POST", "/v1/answer", json={"question": Q, "id": "q-1"}, headers=auth)  # again
    ask("POST", "/v1/answer", json={"question": "other", "id": "q-1"}, headers=auth)  # 409
    ask("POST", "/v1/answer", json={"question": Q})  # no token: 401
    ask("POST", "/v1/answer", json={"question": Q}, headers={"Authorization": "Bearer x"})
    ask("POST", "/v1/answer", content=b"{junk", headers=auth)
    ask("POST", "/v1/answer", json={"question": 7}, headers=auth)
    ask("POST", "/v1/answer", json={"question": "x" * 300}, headers=auth)
    ask("POST", "/v1/answer", json={"question": "y" * 2000}, headers=auth)  # 413
    ask("POST", "/v1/answer", content=Q, headers={**auth, "content-type": "text/plain"})
    ask(
        "POST", "/v1/answer", json={"question": Q, "id": "q-2", "max_cost_usd": 1e-12}, headers=auth
    )
    ask("GET", "/v1/answer", headers=auth)
    ask("POST", "/v1/chat/completions", json=chat, headers=auth)
    ask("POST", "/v1/feedback", json={"id": "q-1", "none_of_them": True}, headers=auth)
    ask("GET", "/no-such-path")
    answered, svc.answered = svc.answered, _raises
    ask("POST", "/v1/answer", json={"question": Q}, headers=auth)  # a bug: 500
    svc.answered = answered
    svc.check_auth = _fails  # a bug in the rails
    ask("POST", "/v1/answer", json={"question": Q}, headers=auth)
    ask("POST", "/v1/answer", content=b"{junk", headers=auth)
    del svc.check_auth
    healthy = svc.health
    svc.health = lambda: healthy().model_copy(
        update={"status": "degraded", "detail": "the state database is away"}
    )
    ask("GET", "/healthz")  # degraded: 503
    del svc.health
    return seen


async def _raises(*args, **kw):
    raise RuntimeError("secret detail")


def _fails(*args, **kw):
    raise RuntimeError("secret detail")


def _run(world, policy_dir, prices_path, switches: dict) -> list[tuple]:
    svc = make_service(policy_dir, world, prices_path, {**SETTINGS, **switches})
    with LiveServer(svc) as ls:
        return _exchange(svc, ls)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_fast_path_switched_off_answers_the_same(world, policy_dir, prices_path, variant):
    on = _run(world, policy_dir, prices_path, dict.fromkeys(SWITCHES, True))
    off = _run(world, policy_dir, prices_path, VARIANTS[variant])
    statuses = [s[0] for s in on]
    assert statuses == [200, 405, 200, 200, 409, 401, 401, 422, 422, 422, 413, 422, 402, 405,
                        200, 200, 404, 500, 500, 500, 503]  # fmt: skip
    for i, (a, b) in enumerate(zip(on, off, strict=True)):
        assert a == b, (i, a, b)


def test_rate_limits_are_the_same_with_fast_paths_off(world, policy_dir, prices_path):
    """The rate limit counts a request once on either route (the rails run once)."""
    limits = {"rate_limit_per_minute": 1, "rate_burst": 3}

    def codes(switches: dict) -> list[tuple]:
        svc = make_service(policy_dir, world, prices_path, {**limits, **switches})
        with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
            return [_seen(http.post("/v1/answer", json={"question": Q})) for _ in range(5)]

    on, off = codes({}), codes(VARIANTS["all off"])
    assert [s[0] for s in on] == [200, 200, 200, 429, 429]
    assert [s[:2] for s in on] == [s[:2] for s in off]
    assert [s[2]["error"] for s in on[3:]] == [s[2]["error"] for s in off[3:]]
