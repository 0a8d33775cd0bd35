"""One answer per id across concurrent requests, on every backend: a client's retries of one id
sent at once to several real ``ccpo serve`` processes (three replicas on one PostgreSQL state,
two on one SQLite file) are answered once and paid once. The others get that answer (same
replica, or once it is stored) or a JSON 409 saying the id is being answered: never a 5xx,
never a second payment. The upstream is the scripted world, which counts what it bills."""

from __future__ import annotations

import threading

import httpx
import pytest

from ccpo.runtime.state import DuplicateKey
from tests.helpers.world import make_world
from tests.runtime.test_store_faults import Q
from tests.runtime.test_store_faults import serve_process as serve


def same_id_at_once(urls: list[str], n: int, qid: str) -> list[httpx.Response]:
    """``n`` requests of one id and question, released together, spread over ``urls``."""
    out: list[httpx.Response] = []
    go = threading.Barrier(n)

    def one(k: int) -> None:
        with httpx.Client(timeout=60) as http:
            go.wait()
            r = http.post(urls[k % len(urls)] + "/v1/answer", json={"question": Q, "id": qid})
            out.append(r)

    ts = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_retries_of_one_id_at_once_are_answered_and_paid_once(
    store, request, policy_dir, prices_path, tmp_path
):
    """Eight requests of one id at once over the replicas (a client's retries), the upstream
    slow enough that they all overlap: one answer paid (the world bills one question's calls,
    the state counts one request), every response a 200 with that answer or a JSON 409
    ``conflict``; a retry afterwards, at any replica, gets the stored answer for free."""
    if store == "sqlite":
        state, n = str(tmp_path / "state.sqlite"), 2
    else:
        state, n = request.getfixturevalue("pg_cluster").new_database(), 3
    with make_world() as world:
        procs = [serve(tmp_path, world, prices_path, policy_dir, state, f"r{i}") for i in range(n)]
        try:
            urls = [u for _, u in procs]
            world.latency = 0.3  # every request of the burst arrives while the first is paid
            rs = same_id_at_once(urls, 8, "retry-1")
            calls = world.n_requests
            again = [httpx.post(u + "/v1/answer", json={"question": Q, "id": "retry-1"},
                                timeout=60) for u in urls]  # fmt: skip
            metrics = httpx.get(urls[0] + "/metrics.json", timeout=10).json()
            # the calls of one question asked once, for comparison
            n0 = world.n_requests
            one = httpx.post(urls[0] + "/v1/answer", json={"question": Q, "id": "once"}, timeout=60)
            one_calls = world.n_requests - n0
        finally:
            for p, _ in procs:
                p.terminate()
            for p, _ in procs:
                p.wait(timeout=30)
    statuses = sorted(r.status_code for r in rs)
    assert all(s in (200, 409) for s in statuses), [(r.status_code, r.text[:200]) for r in rs]
    ok = [r.json() for r in rs if r.status_code == 200]
    assert ok, statuses
    assert all(x == ok[0] for x in ok)  # one answer
    for r in rs:
        if r.status_code == 409:
            assert r.json()["error"]["type"] == "conflict", r.text
            assert "being answered" in r.text and r.headers["retry-after"] == "1"
    assert one.status_code == 200 and one_calls > 0
    assert calls == one_calls, (calls, one_calls, statuses)  # paid once
    assert metrics["requests"] == 1 and metrics["dollars_spent"] == pytest.approx(
        ok[0]["cost_usd"], rel=1e-9
    )
    assert all(r.status_code == 200 and r.json() == ok[0] for r in again)


def test_a_claim_is_free_again_when_withdrawn_or_when_its_replica_is_gone(state_url):
    """A claim stands while its replica lives: another replica is told who answers; the
    claimer withdraws it when its answer fails; a claim whose replica's lease is gone (a
    replica that died) is taken over; a stored answer is given, never claimed again; feedback
    and lookups see no claim as an answer."""
    from ccpo.learning.conformal import OnlineThreshold
    from ccpo.runtime.state import StateStore

    tr = OnlineThreshold(alpha=0.1, kappa=0.3)
    a = StateStore(state_url, "fp", tr, replica="a")
    b = StateStore(state_url, "fp", tr, replica="b")
    try:
        assert a.answers.claim("x", "q").result() is None
        assert b.answers.claim("x", "q").result() == "a"
        assert a.answers.lookup("x").result() is None and b.answers.lookup("x").result() is None
        assert a.answers.claim("x", "q").result() is None  # its own: still its own
        a.answers.unclaim("x").result()
        assert b.answers.claim("x", "q").result() is None  # withdrawn: B's now
        with b.db.write() as tx:  # B dies: its lease is gone
            tx.run("DELETE FROM ccpo_leases WHERE replica = 'b'")
        assert a.answers.claim("x", "q").result() is None  # taken over
        rec = {"id": "x", "question": "q", "cost_usd": 0.5, "answers": ["A"], "rounds": 1}
        a.answers.record_answer(rec).result()  # the answer replaces A's claim
        stored = b.answers.claim("x", "q").result()
        assert stored is not None and stored[1]["cost_usd"] == 0.5
        assert b.answers.lookup("x").result() == stored
        assert b.answers.claim("y", "q").result() is None
        with pytest.raises(DuplicateKey):  # another replica's claim is not replaced
            a.answers.record_answer({**rec, "id": "y"}).result()
    finally:
        a.close()
        b.close()
