"""The rails that run before a request body is read (:mod:`ccpo.runtime.rails`): the body-size
limit, the bearer token and the per-client rate limit, over real HTTP."""

from __future__ import annotations

import json
import logging

import httpx

from tests.helpers.serve import LiveServer, Q, make_service, post


def test_chunked_oversize_body_is_413(world, policy_dir, prices_path):
    svc = make_service(policy_dir, world, prices_path, {"max_body_bytes": 1024})
    with LiveServer(svc) as ls:

        def chunks():
            yield b'{"question": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        r = httpx.post(ls.url + "/v1/answer", content=chunks(), timeout=10)
        assert r.status_code == 413 and "larger than 1024" in r.json()["error"]["message"]


def test_auth_and_rate_limit(world, policy_dir, prices_path, monkeypatch, caplog):
    token = "s3cret-token-value"
    monkeypatch.setenv("MY_TOKEN", token)
    svc = make_service(
        policy_dir,
        world,
        prices_path,
        {"auth_token_env": "MY_TOKEN", "rate_limit_per_minute": 2, "rate_burst": 5},
    )
    caplog.set_level(logging.DEBUG)
    with LiveServer(svc) as ls:
        assert httpx.get(ls.url + "/healthz").status_code == 200  # open
        r = post(ls.url, "/v1/answer", {"question": Q})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in r.json()["error"]["message"]
        assert post(ls.url, "/v1/answer", {"question": Q}, token="wrong").status_code == 401
        assert httpx.get(ls.url + "/metrics").status_code == 401
        # the two refused posts took from the client's bucket too (the limit comes first)
        codes = [post(ls.url, "/v1/answer", {"question": Q}, token=token) for _ in range(5)]
        assert [c.status_code for c in codes[:3]] == [200, 200, 200]
        assert codes[3].status_code == 429 and int(codes[3].headers["retry-after"]) >= 1
        assert "rate limit" in codes[3].json()["error"]["message"]
        m = httpx.get(ls.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
        assert m.status_code == 200
    assert token not in caplog.text
    assert all(token not in json.dumps(r) for r in world.requests)
