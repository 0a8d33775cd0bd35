"""Six faults of the state store, against a throw-away PostgreSQL (its own cluster: these tests
pause and stop it) and the scripted LLM world, which counts what it bills. After each fault:
reserved and in-flight money back to 0, no 5xx that is not the documented JSON, ``/healthz``
answering through a database pause, the recorded spend at least what was billed (after a SIGTERM and
after ``kill -9`` too), no acknowledged answer or feedback lost.

1. a settlement while the database is away is retried, never left in the lease (and
   questions get 503 at once rather than hanging): ``test_database_away_*``;
2. SIGTERM while calls outlast the grace period: ``test_sigterm_*``;
3. the database paused 5 s, or stopped and started: ``test_database_away_*``;
4. database failures answer a bare 500: ``test_database_away_*`` (every 5xx is JSON);
5. a NUL character in a question: ``test_text_the_database_cannot_store_*``;
6. without ``max_cost_total`` reserved money was never released: ``test_without_a_cap_*``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ccpo.runtime.state.store import SPARE_IDLE_S, SPARE_IDLE_UNCAPPED_S
from ccpo.testing import free_port, wait_for_http
from ccpo.traces.prices import load_prices
from tests.helpers.serve import FEEDBACK_UNLIMITED, LiveServer, deploy_values, make_service
from tests.helpers.world import make_world

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"
ROOT = Path(__file__).resolve().parents[2]
# this tree's ccpo first (the venv's may be installed from another checkout)
ENV_ROOT = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


@pytest.fixture(scope="module")
def pg():
    """A cluster of this module's own: its tests pause and stop it."""
    from ccpo.testing.postgres import PostgresCluster, find_pg_bin

    if find_pg_bin() is None or importlib.util.find_spec("psycopg") is None:
        pytest.skip("no PostgreSQL or psycopg on this machine")
    with PostgresCluster(fsync=False, in_ram=True) as cluster:
        yield cluster


def billed_usd(world, prices: Path) -> float:
    """What the scripted world billed, at the test's prices."""
    table = load_prices(prices)
    return sum(table.cost(m, i, o) for m, (i, o) in world.billed.items())


def settled(url: str, within: float = 15.0) -> dict:
    """The metrics once nothing is reserved or in flight (asserted within ``within`` s)."""
    deadline = time.monotonic() + within
    while True:
        m = httpx.get(url + "/metrics.json", timeout=5).json()
        if (m["reserved_usd"] == 0 and m["inflight_usd"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def wait_billed(world, timeout: float = 30.0) -> None:
    """Until every call the world received has been answered (and billed) or failed."""
    deadline = time.monotonic() + timeout
    while world.n_completions + world.n_failures < world.n_requests:
        assert time.monotonic() < deadline, "the world did not finish its calls"
        time.sleep(0.05)


def billed_and_recorded(world, prices: Path, policy: Path, state: str):
    """Once the world has finished its calls: what it billed, and the metrics a replica
    started afterwards on ``state`` reads there."""
    wait_billed(world)
    billed = billed_usd(world, prices)
    svc = make_service(policy, world, prices, {"state": state})
    try:
        return billed, svc.metrics()
    finally:
        svc.store.close()


class Load:
    """Threads asking questions (and, with ``feedback``, giving feedback on every answer)
    until stopped; every response kept as (status, json or None, question id, feedback?,
    seconds), and each question's (start, end, status) by ``time.monotonic``."""

    def __init__(self, url: str, threads: int = 6, feedback: bool = True, tag: str = "t") -> None:
        self.url, self.stop, self.feedback, self.tag = url, threading.Event(), feedback, tag
        self.seen: list[tuple[int, dict | None, str, bool, float]] = []
        self.spans: list[tuple[float, float, int]] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(k,)) for k in range(threads)]

    def _keep(self, r: httpx.Response, qid: str, feedback: bool) -> None:
        try:
            body = r.json()
        except ValueError:
            body = None
        with self._lock:
            self.seen.append((r.status_code, body, qid, feedback, r.elapsed.total_seconds()))

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            i = 0
            while not self.stop.is_set():
                qid = f"{self.tag}{k}-{i}"
                i += 1
                t0 = time.monotonic()
                r = http.post("/v1/answer", json={"question": f"{Q} #{qid}", "id": qid})
                self.spans.append((t0, time.monotonic(), r.status_code))
                self._keep(r, qid, False)
                if r.status_code == 200 and self.feedback:
                    f = http.post("/v1/feedback", json={"id": qid, "none_of_them": True})
                    self._keep(f, qid, True)
                elif r.status_code != 200:
                    time.sleep(0.05)

    def first_ok_after(self, t: float) -> float | None:
        """When the first question sent after ``t`` was answered (None: none was)."""
        ends = [e for s, e, code in self.spans if s > t and code == 200]
        return min(ends) if ends else None

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def answers_ok(self) -> int:
        return sum(1 for s, _, _, fb, _ in self.seen if s == 200 and not fb)


@pytest.mark.parametrize("fault", ["pause", "stop"])
def test_database_away_fails_closed_and_recovers(fault, pg, world, policy_dir, prices_path):
    """Under load: the database paused 5 s (SIGSTOP) or stopped and started again. While it
    is away every question gets a JSON 503 ``state_unavailable`` within the deadline and
    ``/healthz`` answers (503 ``degraded``); it recovers by itself; the settlements of the
    calls that were in flight are written once it is back (nothing stays reserved); every
    acknowledged answer and feedback is in the database; spent ≥ billed."""
    world.latency = 0.05
    url = pg.new_database()
    server = {"state": url, "state_timeout": 0.5, "feedback_per_minute": FEEDBACK_UNLIMITED}
    svc = make_service(policy_dir, world, prices_path, server, max_cost_total=50.0, kappa=0.0)
    health: list[tuple[int, str, float]] = []
    with LiveServer(svc) as ls, Load(ls.url) as load:
        while load.answers_ok() < 5:  # the load is running
            time.sleep(0.05)
        ok_before = load.answers_ok()
        if fault == "pause":
            pg.pause()
        else:
            pg.stop_server()
        try:
            t_end = time.monotonic() + 5.0
            while time.monotonic() < t_end:
                t0 = time.monotonic()
                h = httpx.get(ls.url + "/healthz", timeout=2.0)
                health.append((h.status_code, h.json()["status"], time.monotonic() - t0))
                time.sleep(0.2)
        finally:
            if fault == "pause":
                pg.resume()
            else:
                pg.start_server()
        during = len(load.seen)
        back = time.monotonic()
        while load.answers_ok() <= ok_before + 5:  # it serves again by itself
            assert time.monotonic() - back < 15, "the replica did not recover"
            time.sleep(0.05)
    wait_billed(world)
    after = make_service(policy_dir, world, prices_path, {"state": url})
    m = after.metrics()
    acked = [qid for s, _, qid, fb, _ in load.seen if s == 200 and not fb]
    acked_fb = [qid for s, _, qid, fb, _ in load.seen if s == 200 and fb]
    stored = [after.store.answers.lookup(q).result() for q in acked]
    stored_fb = [after.store.answers.lookup(q).result() for q in acked_fb]
    after.store.close()
    # /healthz answered all through, and said so while the database was away
    assert all(dt < 1.5 for _, _, dt in health), health
    assert ("degraded" in {s for _, s, _ in health}) and {c for c, _, _ in health} <= {200, 503}
    # every 5xx was the documented JSON; the ones while away said why
    fives = [(s, b, dt) for s, b, _, _, dt in load.seen if s >= 500]
    assert fives and all(b is not None and "error" in b for _, b, _ in fives), fives[:3]
    assert {b["error"]["type"] for _, b, _ in fives} == {"state_unavailable"}
    assert all(s in (200, 503) for s, *_ in load.seen)
    # refused within the deadline (0.5 s) plus the calls a question had made, not hanging
    assert max(dt for *_, dt in fives) < 2.5
    assert len(load.seen) > during  # answered again after the fault
    # money: nothing left reserved; every billed dollar recorded
    assert m.reserved_usd == 0.0 and m.inflight_usd == 0.0
    assert m.dollars_spent >= billed_usd(world, prices_path) - 1e-12
    # nothing acknowledged lost
    assert all(x is not None and x[1]["id"] == q for x, q in zip(stored, acked, strict=True))
    # a feedback that got a 503 may have committed after its deadline (no undo): the stored
    # ones are every acknowledged one and at most every one sent
    sent_fb = [qid for s, _, qid, fb, _ in load.seen if fb]
    assert m.requests >= len(acked) and len(acked_fb) <= m.feedback <= len(sent_fb)
    assert all(x is not None and x[2] is not None for x in stored_fb)


def serve_process(
    tmp_path: Path, world, prices: Path, policy: Path, state: str, name: str = "r0", **server
) -> tuple:
    """``ccpo serve`` in a subprocess (it gets real signals) on ``state``, replica ``name``
    (``server``: more of its settings); (process, URL)."""
    cfg = tmp_path / f"{name}.yaml"
    values = deploy_values(world, prices, timeout=60.0, max_cost_total=5.0, kappa=0.0)
    values["server"] = {"replica": name, **server}
    cfg.write_text(yaml.safe_dump(values))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy),
         "--config", str(cfg), "--port", str(port), "--state", state, "--log-level", "warning"],
        env={**os.environ, "PYTHONPATH": ENV_ROOT}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(url + "/healthz", proc, 90, "ccpo serve")
    except BaseException:
        proc.kill()
        raise
    return proc, url


def _ask_in_background(url: str, n: int) -> tuple[list, threading.Thread]:
    out: list = []

    def go() -> None:
        def one(i: int) -> None:
            try:
                r = httpx.post(url + "/v1/answer", json={"question": f"{Q} {i}"}, timeout=30)
                out.append((r.status_code, r.headers.get("content-type", ""), r.text))
            except httpx.TransportError as e:
                out.append((None, "", type(e).__name__))

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    t = threading.Thread(target=go)
    t.start()
    return out, t


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_sigterm_counts_calls_cut_off_after_the_grace_at_their_worst(
    store, pg, policy_dir, prices_path, tmp_path
):
    """SIGTERM while every call takes 2 s and the grace is 0.3 s: the questions get a JSON
    503 ``shutting_down`` (not a bare 500), the calls cut off are counted at their worst
    case, so the recorded spend is at least what the endpoint billed, and nothing is left
    reserved or in flight (it used to record $0 for them)."""
    state = str(tmp_path / "s.db") if store == "sqlite" else pg.new_database()
    with make_world(latency=2.0) as slow:
        proc, url = serve_process(
            tmp_path, slow, prices_path, policy_dir, state, shutdown_grace=0.3
        )
        try:
            out, t = _ask_in_background(url, 3)
            while slow.n_requests < 3:  # every question has a call in flight
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            assert proc.wait(timeout=30) == -signal.SIGTERM  # uvicorn re-raises it on exit
            assert time.monotonic() - t0 < 10  # the grace, then the cut-off calls settled
            t.join(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        billed, m = billed_and_recorded(slow, prices_path, policy_dir, state)
    assert billed > 0 and m.dollars_spent >= billed
    assert m.reserved_usd == 0.0 and m.inflight_usd == 0.0
    assert len(out) == 3
    for status, ctype, text in out:  # a JSON 503, or the connection closed: never a bare 500
        assert status in (503, None), text
        if status == 503:
            assert ctype.startswith("application/json") and "shutting_down" in text


def test_kill_9_leaves_the_calls_counted_at_their_worst(pg, policy_dir, prices_path, tmp_path):
    """``kill -9`` with calls in flight (each question drawing on its wallet, no write per
    call): a replica started afterwards on the same host ends the dead one's lease at once,
    counting what it held as spent: at least what the endpoint billed, nothing left held."""
    state = pg.new_database()
    with make_world() as slow:
        proc, url = serve_process(tmp_path, slow, prices_path, policy_dir, state)
        try:
            # the first question runs alone (it tells the server what a question costs)
            assert httpx.post(url + "/v1/answer", json={"question": Q}, timeout=60).is_success
            slow.latency = 1.5
            n0 = slow.n_requests
            _, t = _ask_in_background(url, 4)
            while slow.n_requests < n0 + 4:
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=20)
            t.join(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        billed, m = billed_and_recorded(slow, prices_path, policy_dir, state)
    assert billed > 0 and m.dollars_spent >= billed
    assert m.reserved_usd == 0.0 and m.inflight_usd == 0.0
    assert m.requests == 1


def test_text_the_database_cannot_store_is_refused_before_any_call(
    pg, world, policy_dir, prices_path
):
    """A NUL character (PostgreSQL cannot store it) or a lone surrogate, in a question or its
    context: 422 with the documented body, before any LLM call (it used to pay the calls,
    then fail the insert with a 500, and a retry paid again)."""
    svc = make_service(policy_dir, world, prices_path, {"state": pg.new_database()})
    bad = [
        {"question": "Which is prime?\x00 A. 4"},
        {"question": Q, "context": [{"title": "t", "text": "para\x00graph"}]},
    ]
    with LiveServer(svc) as ls:
        rs = [httpx.post(ls.url + "/v1/answer", json=b, timeout=30) for b in bad]
        raw = httpx.post(
            ls.url + "/v1/answer",
            content=b'{"question": "Which is prime? \\ud800"}',
            headers={"content-type": "application/json"},
            timeout=30,
        )
        calls_refused = world.n_requests
        ok = httpx.post(ls.url + "/v1/answer", json={"question": Q}, timeout=30)
        m = httpx.get(ls.url + "/metrics.json").json()
    for r in [*rs, raw]:
        assert r.status_code == 422, r.text
        assert r.json()["error"]["type"] == "invalid_request"
    assert "NUL" in rs[0].json()["error"]["message"] and "question" in rs[0].text
    assert "context.0.text" in rs[1].json()["error"]["message"]
    assert raw.json()["error"]["message"].startswith("question:")  # refused while parsing
    assert calls_refused == 0  # no LLM call for any of them
    assert ok.status_code == 200 and world.n_requests > 0  # the store itself is fine
    assert m["rejected"] == 3 and m["requests"] == 1


def test_without_a_cap_nothing_stays_reserved_and_calls_are_not_written(
    pg, world, policy_dir, prices_path
):
    """No ``max_cost_total``: every question's wallet is released with its answer (reserved
    money used to pile up), and the store writes per question, not per call."""
    svc = make_service(policy_dir, world, prices_path, {"state": pg.new_database()}, kappa=0.0)
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        c0 = svc.store.engine.commits
        answered = [http.post("/v1/answer", json={"question": f"{Q} {i}"}) for i in range(12)]
        commits = svc.store.engine.commits - c0
        m = settled(ls.url, within=SPARE_IDLE_UNCAPPED_S + 3)
    assert all(r.status_code == 200 for r in answered)
    assert m["reserved_usd"] == 0.0 and m["inflight_usd"] == 0.0
    assert m["dollars_spent"] == pytest.approx(sum(r.json()["cost_usd"] for r in answered))
    assert m["dollars_spent"] >= billed_usd(world, prices_path) - 1e-12
    calls = world.n_requests
    assert calls >= 12 * 8  # κ = 0: four rounds of two calls each
    # the first question pays its calls one reservation each (nothing known yet); every
    # later one: its wallet at admission and its answer (settlements ride along)
    assert commits <= 8 + 1 + 2 * 11 + 2, (commits, calls)


def test_a_lost_lease_never_releases_money_held_since(tmp_path):
    """A replica whose lease expired while the database was away (another replica counted
    what it held as spent) keeps that apart: settling it later releases nothing that the
    replica has reserved since, and nothing of another replica's."""
    from ccpo.learning.conformal import OnlineThreshold
    from ccpo.runtime.state import StateStore

    path, tr = str(tmp_path / "s.db"), OnlineThreshold(alpha=0.1)
    a = StateStore(path, "fp", tr, replica="a")
    b = StateStore(path, "fp", tr, replica="b")
    try:
        # a wallet, then the database goes away...
        assert a.money.reserve(0.5, 1.0, inflight=0.5).result()
        with a.db.write() as tx:  # ... longer than the expiry
            tx.run("UPDATE ccpo_leases SET expires = 0 WHERE replica = 'a'")
        # b ends a's lease: 0.5 counted as spent
        assert b.money.reserve(0.1, 1.0, inflight=0.1).result()
        assert b.counters.spent_usd == pytest.approx(0.5)
        assert a.money.reserve(0.2, 1.0, inflight=0.2).result()  # a is back, with a new lease
        a.money.settle(0.5, 0.3, inflight=0.5)  # the old wallet settles (its calls cost 0.3)
        a.engine.flush()
        c = a.counters
        assert c.reserved_usd == pytest.approx(0.3) and c.inflight_usd == pytest.approx(0.3)
        assert c.spent_usd == pytest.approx(0.8)  # counted twice: more than billed, never less
        assert dict((r, (x, y)) for r, x, y, _ in a.money.leases()) == {
            "a": pytest.approx((0.2, 0.2)), "b": pytest.approx((0.1, 0.1)),
        }  # fmt: skip
        a.money.settle(0.2, 0.1, inflight=0.2)
        a.engine.flush()
        assert a.counters.reserved_usd == pytest.approx(0.1)  # b's, untouched
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("cap", [None, 5.0], ids=["no-cap", "cap"])
def test_back_to_back_questions_cost_one_commit_each(pg, world, policy_dir, prices_path, cap):
    """Questions one after the other, without ``max_cost_total`` or under one with room:
    each takes its wallet from the spare one its predecessor's answer transaction reserved
    (durable before any of its calls is sent, counted in flight), so it costs one commit, its
    answer; once nobody asks, the spare goes back and nothing stays reserved."""
    svc = make_service(
        policy_dir, world, prices_path, {"state": pg.new_database()}, kappa=0.0,
        **({} if cap is None else {"max_cost_total": cap}),
    )  # fmt: skip
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        warm = [http.post("/v1/answer", json={"question": f"{Q} w{i}"}) for i in range(3)]
        assert svc.store.counters.inflight_usd > 0  # the spare, held for the next question
        c0 = svc.store.engine.commits
        answered = [http.post("/v1/answer", json={"question": f"{Q} {i}"}) for i in range(10)]
        commits = svc.store.engine.commits - c0
        m = settled(ls.url, within=SPARE_IDLE_UNCAPPED_S + 3)
    assert all(r.status_code == 200 for r in warm + answered)
    assert commits <= 10 + 1, commits  # (+1: a settlement or the heartbeat may run alone)
    assert m["reserved_usd"] == 0.0 and m["inflight_usd"] == 0.0
    assert m["dollars_spent"] == pytest.approx(sum(r.json()["cost_usd"] for r in warm + answered))
    assert m["dollars_spent"] >= billed_usd(world, prices_path) - 1e-12


def test_under_a_cap_the_spare_never_holds_room_a_question_needs(tmp_path):
    """Under a total budget: the spare is topped up only while ``SPARE_ROOM`` wallets still
    fit after it; a question needing more than it holds releases it in the transaction that
    reserves its wallet (so that the spare's money is room for it); reserved and spent never
    pass the cap."""
    from ccpo.learning.conformal import OnlineThreshold
    from ccpo.runtime.state import StateStore
    from ccpo.runtime.state.store import SPARE_ROOM

    cap, w = 1.0, 0.01

    def store(name: str) -> StateStore:
        return StateStore(str(tmp_path / name), "fp", OnlineThreshold(alpha=0.1), replica="a")

    a = store("room.db")
    try:
        assert not a.money.take_spare(w, cap) and not a.money.take_spare(
            w, cap
        )  # asked back to back
        # this question's wallet: its transaction tops one up
        assert a.money.reserve(w, cap, w).result()
        assert a.counters.reserved_usd == pytest.approx(2 * w)
        n = a.engine.commits
        assert a.money.take_spare(w, cap) and a.engine.commits == n  # the next wallet: no write
        # both wallets settle, spending all but SPARE_ROOM + 0.5 wallets: no new spare
        a.money.settle(2 * w, cap - (SPARE_ROOM + 0.5) * w, inflight=2 * w)
        a.engine.flush()
        assert a.counters.reserved_usd == 0.0  # one would leave < SPARE_ROOM wallets
        assert not a.money.take_spare(w, cap)
        c = a.counters
        assert c.spent_usd + c.reserved_usd <= cap + 1e-12
    finally:
        a.close()
    a = store("big.db")
    try:
        assert not a.money.take_spare(w, cap) and not a.money.take_spare(w, cap)
        assert a.money.reserve(w, cap, w).result()
        assert a.counters.reserved_usd == pytest.approx(2 * w)  # wallet + spare
        big = cap - 2 * w + w / 2  # fits only with the spare's money
        assert not a.money.take_spare(big, cap)  # too small: released ...
        # ... in this transaction: room for the question
        assert a.money.reserve(big, cap, big).result()
        c = a.counters
        assert c.reserved_usd == pytest.approx(w + big)  # and no new spare (no room)
        assert c.spent_usd + c.reserved_usd <= cap + 1e-12
    finally:
        a.close()


def test_the_spare_outlasts_a_pause_without_a_cap_and_goes_back_in_a_second_under_one(tmp_path):
    """Without a cap a spare holds no room another question could use: it waits
    ``SPARE_IDLE_UNCAPPED_S`` for the next question (taken after a 2 s pause with no write);
    under a cap it goes back after ``SPARE_IDLE_S``, so that it never keeps room aside long."""
    from ccpo.learning.conformal import OnlineThreshold
    from ccpo.runtime.state import StateStore

    tr = OnlineThreshold(alpha=0.1)
    free = StateStore(str(tmp_path / "free.db"), "fp", tr, replica="free")
    capped = StateStore(str(tmp_path / "capped.db"), "fp", tr, replica="capped")
    try:
        asked = time.monotonic()
        for store, cap in ((free, None), (capped, 5.0)):
            assert not store.money.take_spare(0.2, cap) and not store.money.take_spare(0.2, cap)
            store.engine.flush()  # topped up: two questions asked back to back
            assert store.counters.reserved_usd == pytest.approx(0.2)
        deadline = asked + SPARE_IDLE_S + 1.5  # (the writer looks at least every 0.5 s)
        assert deadline < asked + SPARE_IDLE_UNCAPPED_S
        while capped.refresh()[1].reserved_usd > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert capped.counters.reserved_usd == 0.0 and capped.counters.inflight_usd == 0.0
        assert not capped.money.take_spare(0.2, 5.0)  # gone back: this question reserves its own
        time.sleep(max(0.0, asked + SPARE_IDLE_S + 1.0 - time.monotonic()))
        n = free.engine.commits
        assert (
            free.money.take_spare(0.2) and free.engine.commits == n
        )  # still held after 2 s: no write
    finally:
        free.close()
        capped.close()


def test_the_spare_wallet_is_durable_released_when_idle_and_never_released_twice(tmp_path):
    """The spare wallet at the store: topped up only by a transaction that runs anyway, taken
    without a write, released after ``SPARE_IDLE_UNCAPPED_S`` unused (no cap); a lease lost
    while it was held (counted as spent by another replica) does not release it a second
    time."""
    from ccpo.learning.conformal import OnlineThreshold
    from ccpo.runtime.state import StateStore

    path, tr = str(tmp_path / "s.db"), OnlineThreshold(alpha=0.1)
    a = StateStore(path, "fp", tr, replica="a")
    b = StateStore(path, "fp", tr, replica="b")
    try:
        assert not a.money.take_spare(0.2)  # none yet; a second ask soon after asks for one
        assert not a.money.take_spare(0.2)
        a.engine.flush()  # a transaction that runs anyway tops it up: durable, in flight
        assert a.counters.reserved_usd == pytest.approx(0.2)
        assert a.counters.inflight_usd == pytest.approx(0.2)
        n = a.engine.commits
        assert a.money.take_spare(0.2) and a.engine.commits == n  # no write
        a.money.settle(0.2, 0.05, inflight=0.2)  # that question's wallet settles
        a.engine.flush()  # ... and the spare is topped up again
        assert a.counters.spent_usd == pytest.approx(0.05)
        assert a.counters.reserved_usd == pytest.approx(0.2)
        deadline = time.monotonic() + SPARE_IDLE_UNCAPPED_S + 3  # (asked without a cap)
        while a.refresh()[1].reserved_usd > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert a.counters.reserved_usd == 0.0 and a.counters.inflight_usd == 0.0
        # held while the lease is lost: counted as spent once, released never
        assert not a.money.take_spare(0.1) and not a.money.take_spare(0.1)
        a.engine.flush()
        with a.db.write() as tx:
            tx.run("UPDATE ccpo_leases SET expires = 0 WHERE replica = 'a'")
        b.engine.flush()  # b ends a's lease: the spare (0.1) counted as spent
        assert b.counters.spent_usd == pytest.approx(0.15)
        assert a.money.take_spare(0.05)  # half of it goes to a question: a wallet since
        a.engine.flush()  # a is back with a new lease; what was left of the spare is not released
        a.money.settle(0.05, 0.01, inflight=0.05)
        a.engine.flush()
        c = a.counters
        assert c.spent_usd == pytest.approx(0.16)  # more than billed, never less
        leases = {r: (x, y) for r, x, y, _ in a.money.leases()}
        assert c.reserved_usd == pytest.approx(sum(x for x, _ in leases.values()))
        assert c.inflight_usd == pytest.approx(sum(y for _, y in leases.values()))
    finally:
        a.close()
        b.close()
    assert StateStore(path, "fp", tr, replica="c").counters.reserved_usd == 0.0
