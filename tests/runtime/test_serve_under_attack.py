"""Issue 15's attacks on ``ccpo serve``, over real HTTP on 127.0.0.1 (uvicorn with the server's
own settings, the scripted LLM world behind it): κ abuse, budgets at concurrency 64, junk
before auth, spoofed ``X-Forwarded-For``, upstream URLs in errors, retried ids in flight."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import httpx
import pytest

from tests.helpers.serve import FEEDBACK_UNLIMITED, LiveServer, make_service, state_at
from tests.helpers.world import make_world

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def send_all(url: str, calls: list[tuple], headers: dict | None = None) -> list[httpx.Response]:
    """Send ``(method, path, kwargs)`` calls 32 at a time (a request on loopback takes ~45 ms
    of wall time here, nearly all of it waiting), in order of the list."""

    async def go() -> list[httpx.Response]:
        sem = asyncio.Semaphore(32)
        async with httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http:

            async def one(method: str, path: str, kw: dict) -> httpx.Response:
                async with sem:
                    return await http.request(method, path, **kw)

            return await asyncio.gather(*(one(*c) for c in calls))

    return asyncio.run(go())


def _state_written(svc, path: Path | None = None) -> object:
    """What changes when the state is written: the SQLite file's bytes, or the PostgreSQL
    state row's version (xmin) and the answer count."""
    if svc.store.db.kind == "sqlite":
        assert path is not None
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    with svc.store.db.read() as tx:
        return tx.one(
            "SELECT xmin::text, (SELECT COUNT(*) FROM ccpo_answers) FROM ccpo_state WHERE id = 1"
        )


def test_a_thousand_adversarial_feedbacks_move_kappa_at_most_the_band(
    world, policy_dir, prices_path, tmp_path
):
    """22 'none of them' used to take κ from 0.3 to 0; 1,000 now stay within κ̂ − band."""
    conf = {
        "adapt_kappa": True,
        "feedback_per_minute": FEEDBACK_UNLIMITED,
        "state": state_at(tmp_path, "s.db"),
    }
    svc = make_service(policy_dir, world, prices_path, conf)
    b = svc.kappa_bounds
    assert (b.lower, b.upper, b.max_delta, b.min_feedback) == pytest.approx((0.2, 0.4, 0.01, 50))
    with LiveServer(svc) as ls:
        # one answer over HTTP; its record stands for 1,000 served questions (setup only: the
        # attack, the feedback, all goes over HTTP)
        one = httpx.post(ls.url + "/v1/answer", json={"question": Q, "id": "q0"}, timeout=30)
        assert one.status_code == 200
        for i in range(1, 1000):
            svc.store.answers.record_answer({**one.json(), "id": f"q{i}"}).result()
        fbs = [("POST", "/v1/feedback", {"json": {"id": f"q{i}", "none_of_them": True}})
               for i in range(1000)]  # fmt: skip
        replies = [r.json() for r in send_all(ls.url, fbs)]
        m = httpx.get(ls.url + "/metrics.json").json()
    # in the order the server applied them (the feedback count each reply carries)
    kappas = [f["kappa"] for f in sorted(replies, key=lambda f: f["feedback"])]
    assert [f["feedback"] for f in sorted(replies, key=lambda f: f["feedback"])] == list(
        range(1, 1001)
    )
    assert kappas[:50] == [0.3] * 50  # no move before 50 feedbacks
    steps = [abs(b - a) for a, b in zip([0.3, *kappas], kappas, strict=False)]
    assert max(steps) <= 0.01 + 1e-12  # bounded step per feedback
    assert min(kappas) == pytest.approx(0.2) and kappas[-1] == pytest.approx(0.2)  # the band
    assert m["kappa"] == pytest.approx(0.2) and m["kappa_lower"] == pytest.approx(0.2)
    assert m["kappa_upper"] == pytest.approx(0.4) and m["feedback"] == 1000
    assert m["kappa_moves"] == 10 and m["kappa_clamped"] == 950 and m["coverage"] == 0.0


def test_feedback_is_rate_limited_per_client(world, policy_dir, prices_path):
    svc = make_service(policy_dir, world, prices_path, {"adapt_kappa": True})
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        for i in range(12):
            assert http.post("/v1/answer", json={"question": Q, "id": f"q{i}"}).status_code == 200
        codes = [
            http.post("/v1/feedback", json={"id": f"q{i}", "none_of_them": True}).status_code
            for i in range(12)
        ]
        assert codes == [200] * 10 + [429, 429]  # a burst of 10, then 30 per minute
        assert http.get("/metrics.json").json()["feedback"] == 10


def test_the_budget_holds_at_concurrency_64(world, policy_dir, prices_path):
    """A total budget of $0.02, 64 questions at once: never past the cap, and the money buys
    answers (it used to be 0 answers and +63% over the cap, every request failing after
    paying)."""
    cap = 0.02
    # κ = 0: every question runs all 4 rounds (~$0.0006), so 64 of them need ~2 x the budget;
    # short max_tokens: a question's worst case (what admits it) is a few of them, not 30
    svc = make_service(
        policy_dir, world, prices_path, max_cost_total=cap, concurrency=64, kappa=0.0,
        max_tokens=16,
    )  # fmt: skip

    async def burst(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            return await asyncio.gather(
                *(http.post("/v1/answer", json={"question": f"{Q} #{i}"}) for i in range(64))
            )

    with LiveServer(svc) as ls:
        rs = asyncio.run(burst(ls.url))
        m = httpx.get(ls.url + "/metrics.json").json()
    codes = [r.status_code for r in rs]
    assert set(codes) <= {200, 503}, codes
    answered = [r.json() for r in rs if r.status_code == 200]
    assert len(answered) >= 5
    assert m["dollars_spent"] <= cap
    # the money went into answers: what was paid is what the answers cost (no cache here)
    assert m["dollars_spent"] == pytest.approx(sum(a["cost_usd"] for a in answered), rel=1e-9)
    assert m["inflight_usd"] == 0.0


def test_junk_before_auth_is_refused_without_parsing_or_writing(
    world, policy_dir, prices_path, tmp_path, monkeypatch
):
    monkeypatch.setenv("CCPO_SERVE_TOKEN", "tok-123456")
    state = tmp_path / "s.db"
    svc = make_service(policy_dir, world, prices_path, {"state": state_at(tmp_path, "s.db")})
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        before = _state_written(svc, state)
        # invalid JSON sent as JSON: parsed (422) before auth, and written, before the fix
        as_json = {"Content-Type": "application/json"}
        junk = [("POST", "/v1/answer", {"content": b"{junk" + bytes([i % 256]) * i,
                                        "headers": as_json}) for i in range(200)]  # fmt: skip
        codes = {r.status_code for r in send_all(ls.url, junk)}
        assert codes == {401}  # auth first: junk is never parsed (it was a 422 before)
        assert _state_written(svc, state) == before  # ... nor written to the state database
        auth = {"Authorization": "Bearer tok-123456"}
        m = http.get("/metrics.json", headers=auth).json()
        assert m["rejected"] == 200
        bad = http.post("/v1/answer", content=b"{junk", headers={**auth, **as_json})
        assert bad.status_code == 422 and "not valid JSON" in bad.text  # once authenticated


def test_unauthenticated_floods_hit_the_rate_limit(world, policy_dir, prices_path, monkeypatch):
    monkeypatch.setenv("CCPO_SERVE_TOKEN", "tok-123456")
    svc = make_service(
        policy_dir, world, prices_path, {"rate_limit_per_minute": 1, "rate_burst": 3}
    )
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        as_json = {"Content-Type": "application/json"}
        codes = [
            http.post("/v1/answer", content=b"{junk", headers=as_json).status_code for _ in range(5)
        ]
        assert codes == [401, 401, 401, 429, 429]


def test_x_forwarded_for_is_believed_only_from_trusted_proxies(world, policy_dir, prices_path):
    limits = {"rate_limit_per_minute": 1, "rate_burst": 2}
    with LiveServer(make_service(policy_dir, world, prices_path, limits)) as ls:
        codes = [
            httpx.post(
                ls.url + "/v1/answer",
                json={"question": f"{Q} {i}"},
                headers={"X-Forwarded-For": f"10.0.{i // 256}.{i % 256}"},
                timeout=30,
            ).status_code
            for i in range(6)
        ]
        assert codes == [200, 200, 429, 429, 429, 429]  # one client, whatever it claims
        assert len(ls.service.limiter) == 1
    # behind a configured proxy the header names the client; memory stays bounded
    proxied = {**limits, "trusted_proxies": ["127.0.0.1"], "max_clients": 50}
    with LiveServer(make_service(policy_dir, world, prices_path, proxied)) as ls:
        spoofed = [
            ("POST", "/v1/answer",
             {"content": b"{junk", "headers": {"X-Forwarded-For": f"10.1.{i // 256}.{i % 256}"}})
            for i in range(300)
        ]  # fmt: skip
        # every spoofed client has its own fresh bucket: none is limited
        assert {r.status_code for r in send_all(ls.url, spoofed)} == {422}
        assert len(ls.service.limiter) == 50


def test_a_502_never_shows_the_upstream_url(policy_dir, prices_path):
    with make_world(failure_rate=1.0, failure_kinds=("500",)) as dead:
        svc = make_service(policy_dir, dead, prices_path, max_retries=1)
        with LiveServer(svc) as ls:
            r = httpx.post(ls.url + "/v1/answer", json={"question": Q}, timeout=30)
            assert r.status_code == 502
            body = r.text
            assert "an LLM endpoint still failed after its retries" in body
            assert dead.url not in body and str(dead.port) not in body and "base-m" not in body


def test_a_retried_id_in_flight_waits_for_the_answer(policy_dir, prices_path):
    async def twice(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            first = asyncio.create_task(http.post("/v1/answer", json={"question": Q, "id": "x"}))
            await asyncio.sleep(0.1)  # the first is being answered (the LLM is slow)
            second = await http.post("/v1/answer", json={"question": Q, "id": "x"})
            clash = await http.post("/v1/answer", json={"question": Q + "?", "id": "x"})
            return [await first, second, clash]

    with (
        make_world(latency=0.1) as slow,
        LiveServer(make_service(policy_dir, slow, prices_path)) as ls,
    ):
        first, second, clash = asyncio.run(twice(ls.url))
        n_calls = slow.n_requests
        m = httpx.get(ls.url + "/metrics.json").json()
    assert first.status_code == second.status_code == 200  # it used to be a 409
    assert first.json() == second.json()
    assert clash.status_code == 409 and "another question" in clash.json()["error"]["message"]
    assert m["requests"] == 1 and n_calls == 2 * first.json()["rounds"]  # answered once


def test_a_kill_mid_call_never_forgets_the_money(world, policy_dir, prices_path, tmp_path):
    """The worst case of a call is in the state file before the call is sent: a server killed
    while the call is in flight restarts counting it as spent (it used to be forgotten)."""
    import signal
    import subprocess
    import sys

    import yaml

    from ccpo.testing import free_port, wait_for_http
    from tests.helpers.cli import ENV
    from tests.helpers.serve import deploy_values

    state = state_at(tmp_path, "s.db")
    with make_world(latency=30.0) as slow:
        cfg = tmp_path / "deploy.yaml"
        cfg.write_text(yaml.safe_dump(deploy_values(slow, prices_path, timeout=60.0)))
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy_dir),
             "--config", str(cfg), "--port", str(port), "--state", state,
             "--log-level", "warning"],
            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_http(url + "/healthz", proc, 90, "ccpo serve")
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url + "/v1/answer", json={"question": Q}, timeout=1.5)
            assert slow.n_requests == 1  # the call is in flight
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
    restarted = make_service(policy_dir, world, prices_path, {"state": state})
    m = restarted.metrics()
    restarted.store.close()
    assert m.dollars_spent > 0  # the in-flight call's worst case, counted as paid
    assert m.inflight_usd == 0.0 and m.reserved_usd == 0.0


def test_covered_floods_are_bounded_too_and_a_narrower_band_applies_on_restart(
    world, policy_dir, prices_path, tmp_path
):
    """The other direction (κ up: smaller sets, lower coverage), at the state store: 1,000
    'covered' feedbacks stop at κ̂ + band; an operator who narrows the band sees it at once."""
    conf = {"adapt_kappa": True, "state": state_at(tmp_path, "s.db")}
    svc = make_service(policy_dir, world, prices_path, conf)
    answer = {"id": "q0", "question": Q, "answers": ["C"], "cost_usd": 0.0, "rounds": 1}
    kappas = []
    for i in range(1000):
        svc.store.answers.record_answer({**answer, "id": f"q{i}"}).result()
        kappas.append(
            svc.store.answers.record_feedback(
                f"q{i}", True, {}, True, None, svc.kappa_bounds
            ).result()[0]
        )
    assert kappas[:50] == [0.3] * 50 and max(kappas) == pytest.approx(0.4)
    assert max(abs(b - a) for a, b in itertools.pairwise(kappas)) <= 0.01 + 1e-12
    svc.store.close()
    narrow = make_service(policy_dir, world, prices_path, {**conf, "kappa_band": 0.05})
    assert narrow.agent.kappa == pytest.approx(0.35) == narrow.metrics().kappa_upper
    narrow.store.close()
