"""Several replicas of ``ccpo serve`` on one PostgreSQL state: one budget, one κ, feedback at any
replica, leases that end, a schema version; and the SQLite file of the older one-process format
converted in place. Replicas are real servers on 127.0.0.1 (uvicorn in threads), the state a real
PostgreSQL cluster started by the tests."""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.state import SCHEMA_VERSION, DuplicateKey, StateStore
from ccpo.runtime.state.ledger import StoreLedger
from tests.helpers.serve import FEEDBACK_UNLIMITED, LiveServer, burst, make_service

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def _replicas(n, policy_dir, world, prices_path, url, server=None, **kw):
    return [
        make_service(
            policy_dir, world, prices_path, {"state": url, "replica": f"r{i}", **(server or {})},
            **kw,
        )
        for i in range(n)
    ]  # fmt: skip


def test_two_replicas_spend_one_budget(pg_cluster, world, policy_dir, prices_path):
    """64 questions at once over two replicas with a $0.02 budget (each replica alone could
    spend it all): together they never pass it, and what they paid is what they answered."""
    cap, url = 0.02, pg_cluster.new_database()
    a, b = _replicas(
        2, policy_dir, world, prices_path, url, max_cost_total=cap, kappa=0.0, max_tokens=16
    )

    with LiveServer(a) as la, LiveServer(b) as lb:
        rs = burst([la.url, lb.url], 64)
        ma = httpx.get(la.url + "/metrics.json").json()
        mb = httpx.get(lb.url + "/metrics.json").json()
    assert {r.status_code for r in rs} <= {200, 503}
    answered = [r.json() for r in rs if r.status_code == 200]
    assert len(answered) >= 5
    assert ma["dollars_spent"] == mb["dollars_spent"] <= cap
    # the budget bought answers, not refusals: a question is refused only once its worst
    # case, at most (T + 1) x the worst case of a round, does not fit what is left
    worst = max((s.agent.horizon + 1) * s.agent._worst_round for s in (a, b))
    assert ma["dollars_spent"] >= cap - worst > 0.5 * cap
    refused = [r.json()["error"] for r in rs if r.status_code != 200]
    assert ma["dollars_spent"] == pytest.approx(sum(x["cost_usd"] for x in answered), rel=1e-9), (
        refused
    )
    assert ma["requests"] == mb["requests"] == len(answered)
    assert ma["inflight_usd"] == ma["reserved_usd"] == 0.0
    assert {ma["replica"], mb["replica"]} == {"r0", "r1"}


def test_feedback_at_any_replica_moves_one_kappa_once(pg_cluster, world, policy_dir, prices_path):
    """Answers from replica A, feedback alternately at A and B: both report the same κ and
    counts; a repeated feedback id at the other replica is refused and changes nothing."""
    url = pg_cluster.new_database()
    conf = {"adapt_kappa": True, "kappa_min_feedback": 0, "feedback_per_minute": FEEDBACK_UNLIMITED}
    a, b = _replicas(2, policy_dir, world, prices_path, url, conf)
    k0 = a.agent.kappa
    with LiveServer(a) as la, LiveServer(b) as lb, httpx.Client(timeout=30) as http:
        for i in range(6):
            r = http.post(la.url + "/v1/answer", json={"question": f"{Q} {i}", "id": f"q{i}"})
            assert r.status_code == 200
        for i in range(6):
            at = (la, lb)[i % 2].url
            r = http.post(at + "/v1/feedback", json={"id": f"q{i}", "none_of_them": True})
            assert r.status_code == 200, r.text
        ma = http.get(la.url + "/metrics.json").json()
        mb = http.get(lb.url + "/metrics.json").json()
        again = http.post(lb.url + "/v1/feedback", json={"id": "q0", "none_of_them": True})
        after = http.get(la.url + "/metrics.json").json()
        # the next answer at B runs with the κ feedback at A and B made
        nxt = http.post(lb.url + "/v1/answer", json={"question": Q, "id": "next"}).json()
    assert ma["kappa"] == mb["kappa"] < k0  # six misses lowered the one κ
    assert ma["kappa"] == pytest.approx(k0 - 6 * 0.01)  # one step of max_delta each, once
    assert ma["feedback"] == mb["feedback"] == 6 and ma["coverage"] == 0.0
    assert again.status_code == 409
    assert after["kappa"] == ma["kappa"] and after["feedback"] == 6
    assert nxt["kappa"] == pytest.approx(ma["kappa"])


def test_a_dead_replicas_lease_expires_into_spent_money(pg_cluster):
    """A replica that stops renewing (another host: it cannot be checked for life) keeps its
    money reserved until its lease expires; then its calls count as spent at the worst case
    and what it held for questions is free again. Nothing is held forever."""
    url = pg_cluster.new_database()
    tr = OnlineThreshold(alpha=0.1, kappa=0.3)
    ghost = StateStore(url, "fp", tr, expiry=600.0, replica="ghost")
    # 0.2 in a call, 0.3 held for a question
    assert ghost.money.reserve(0.5, 1.0, inflight=0.2).result()
    ghost.engine._stop.set()  # it dies: no heartbeat, no more writes
    with ghost.db.write() as tx:  # ... on another host, its lease good for a while yet
        tx.run("UPDATE ccpo_leases SET host = 'elsewhere' WHERE replica = 'ghost'")
    live = StateStore(url, "fp", tr, expiry=600.0, replica="live")
    # the ghost's 0.5 still counts against the budget
    assert not live.money.reserve(0.6, 1.0).result()
    with live.db.write() as tx:
        tx.run("UPDATE ccpo_leases SET expires = 0 WHERE replica = 'ghost'")
    assert live.money.reserve(0.6, 1.0).result()  # expired: 0.2 spent, 0.3 released
    c = live.counters
    assert c.spent_usd == pytest.approx(0.2)
    assert c.reserved_usd == pytest.approx(0.6) and c.inflight_usd == pytest.approx(0.0)
    assert [row[0] for row in live.money.leases()] == ["live"]
    assert not live.money.reserve(0.21, 1.0).result()  # 0.2 spent + 0.6 reserved: 0.2 left
    live.close()
    ghost.db.close()


def test_an_admission_gives_way_to_a_question_waiting_at_another_replica(pg_cluster):
    """Under a cap, an admitted question of replica A waiting for room (its wallet short of a
    call) comes before new questions anywhere: B's admissions are refused while A's lease
    says so, though they fit, and go again once A's question has its room. A call of a
    question already admitted does not give way, nor does anything without a cap."""
    url = pg_cluster.new_database()
    tr = OnlineThreshold(alpha=0.1, kappa=0.3)
    a = StateStore(url, "fp", tr, replica="a")
    b = StateStore(url, "fp", tr, replica="b")
    try:
        la = StoreLedger(a)
        assert b.money.reserve(0.1, 1.0, admission=True).result()  # nobody waits: admitted
        assert la.try_reserve(0.5, 1.0)  # A's question ...
        la.count(la.WAITING, 1)  # ... waits for room: its lease says so within FLUSH_S
        a.engine.flush()
        # $0.4 is free, but A's goes first
        assert not b.money.reserve(0.1, 1.0, admission=True).result()
        assert b.money.reserve(0.1, 1.0).result()  # a call of a question B admitted before
        assert b.money.reserve(0.1, None, admission=True).result()  # no cap: nobody gives way
        la.count(la.WAITING, -1)  # A's question has its room
        a.engine.flush()
        assert b.money.reserve(0.1, 1.0, admission=True).result()
        assert b.counters.reserved_usd == pytest.approx(0.9)
    finally:
        a.close()
        b.close()


def test_a_state_of_schema_2_3_or_4_is_converted(tmp_path):
    """Leases gained ``idle`` (v3), ``waiting`` (v4), ``owner`` and ``proc`` (v5): an older
    state gets the columns it lacks, keeps its counters, and is usable by replicas that read
    them."""
    owners = ["owner", "proc"]
    for version, dropped in (
        (4, owners),
        (3, ["waiting", *owners]),
        (2, ["waiting", "idle", *owners]),
    ):
        path = tmp_path / f"v{version}.sqlite"
        s = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1), replica="r")
        assert s.money.reserve(0.25, 1.0).result()
        s.money.settle(0.25, 0.125)
        s.close()
        db = sqlite3.connect(path)
        for col in dropped:
            db.execute(f"ALTER TABLE ccpo_leases DROP COLUMN {col}")
        db.execute("UPDATE ccpo_meta SET value = ? WHERE key = 'schema_version'", (version,))
        db.commit()
        db.close()
        again = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1), replica="r")
        try:
            assert again.counters.spent_usd == pytest.approx(0.125)
            again.money.waiting = lambda: True
            assert again.money.reserve(0.25, 1.0).result()
            with again.db.read() as tx:
                meta = dict(tx.all("SELECT key, value FROM ccpo_meta"))
                lease = tx.one("SELECT idle, waiting, owner FROM ccpo_leases WHERE replica = 'r'")
            assert meta["schema_version"] == str(SCHEMA_VERSION) == "5"
            assert tuple(lease) == (0, 1, again.money.owner)
        finally:
            again.close()


def _answer(qid: str, cost: float) -> dict:
    return {"id": qid, "question": "Q", "answers": ["A"], "cost_usd": cost, "rounds": 1}


def test_a_replica_alone_sends_its_writes_whole_and_redoes_a_race_it_lost(pg_cluster):
    """A replica that finds the state row as it left it (and no other replica holding money)
    sends its next answers and reservations whole (computed ahead, one guarded statement). A
    write of another replica in between, or an answer id already taken, fails the guard:
    nothing of it stays, and the usual transaction redoes it. Every count and dollar adds up
    either way."""
    url = pg_cluster.new_database()
    tr = OnlineThreshold(alpha=0.1, kappa=0.5)
    a = StateStore(url, "fp", tr, replica="a")
    b = StateStore(url, "fp", tr, replica="b")
    try:
        for i in range(4):
            a.answers.record_answer(_answer(f"q{i}", 0.001)).result()
        assert a.engine.commits_whole >= 2 and a.engine.commits_moved == 0
        assert a.money.reserve(0.125, None, inflight=0.125).result()
        whole = a.engine.commits_whole
        assert whole >= 3  # the reservation went whole too
        assert b.money.reserve(0.25, None).result()  # b writes the row a computes from ...
        b.money.settle(0.25, 0.03125)
        b.engine.flush()  # ... twice, and holds nothing after
        a.answers.record_answer(_answer("q4", 0.002)).result()
        assert (a.engine.commits_moved, a.engine.commits_whole) == (
            1,
            whole,
        )  # guard failed, redone
        a.answers.record_answer(_answer("q5", 0.004)).result()  # the row is as a left it again: ...
        a.answers.record_answer(_answer("q6", 0.008)).result()
        assert a.engine.commits_whole == whole + 1  # ... whole again
        with pytest.raises(DuplicateKey):  # taken: the guard fails, the redo refuses it
            a.answers.record_answer(_answer("q6", 0.5)).result()
        assert a.engine.commits_moved == 2
        a.money.settle(0.125, 0.0625, inflight=0.125)
        a.engine.flush()
        c = a.refresh()[1]
        assert c.requests == 7
        assert c.cost_usd == pytest.approx(0.004 + 0.002 + 0.004 + 0.008, abs=1e-15)
        assert (c.spent_usd, c.reserved_usd, c.inflight_usd) == (0.09375, 0.0, 0.0)
        assert sorted((r[0], r[1]) for r in a.money.leases()) == [("a", 0.0), ("b", 0.0)]
        with a.db.read() as tx:
            rows = tx.all("SELECT id, answer FROM ccpo_answers ORDER BY id")
        assert [r[0] for r in rows] == [f"q{i}" for i in range(7)]
        assert json.loads(rows[6][1])["cost_usd"] == 0.008  # the first q6, not the refused one
        # b holds money: once a has seen it, it writes ...
        assert b.money.reserve(0.25, None).result()
        w, m = a.engine.commits_whole, a.engine.commits_moved
        for i in (7, 8, 9):
            a.answers.record_answer(_answer(f"q{i}", 0.001)).result()
        assert (a.engine.commits_whole, a.engine.commits_moved) == (w, m + 1)  # ... the usual way
    finally:
        a.close()
        b.close()


def test_replicas_racing_whole_and_usual_writes_lose_no_count_or_cent(pg_cluster):
    """Two replicas answer and settle from four threads at once, so that writes sent whole
    and usual transactions race for the one state row: the counters and the money come out
    exact (nothing counted twice, nothing lost). (A guard failing and its redo are checked
    step by step in the test above.)"""
    url = pg_cluster.new_database()
    tr = OnlineThreshold(alpha=0.1, kappa=0.5)
    stores = [StateStore(url, "fp", tr, replica=r) for r in ("a", "b")]
    per, usd = 60, 2.0**-10  # a dyadic cost: every sum is exact in floating point

    def work(k: int) -> None:
        s = stores[k % 2]
        for i in range(per):
            s.answers.record_answer(_answer(f"t{k}-{i}", usd)).result()
            s.money.settle(0.0, usd)  # written with the replica's next transaction, whole or not

    try:
        for i in range(3):  # a alone first: its writes go whole
            stores[0].answers.record_answer(_answer(f"solo-{i}", usd)).result()
        assert stores[0].engine.commits_whole > 0
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(work, range(4)))
        for s in stores:
            s.engine.flush()
        c = stores[0].refresh()[1]
        assert c.requests == 4 * per + 3
        assert c.cost_usd == (4 * per + 3) * usd
        assert c.spent_usd == 4 * per * usd
        assert c.reserved_usd == c.inflight_usd == 0.0
    finally:
        for s in stores:
            s.close()


def test_a_prepared_statement_that_vanishes_is_redone_and_no_longer_prepared(pg_cluster, caplog):
    """Behind a connection pooler in transaction mode (PgBouncer before 1.21) a prepared
    statement may not exist on the server session the next write lands on. The write that
    meets that is redone the usual way (nothing lost, nothing counted twice), one warning
    says why, and writes sent whole go on unprepared."""
    url = pg_cluster.new_database()
    s = StateStore(url, "fp", OnlineThreshold(alpha=0.1, kappa=0.5))
    try:
        for i in range(3):
            s.answers.record_answer(_answer(f"q{i}", 0.001)).result()
        assert s.engine.commits_whole >= 1 and s.db._prepare
        for _ in range(4):  # the server forgets them (as the pooler's other session would),
            with s.db._pool.connection() as conn:  # one by one: psycopg sees DEALLOCATE ALL
                names = conn.execute("SELECT name FROM pg_prepared_statements").fetchall()
                for (name,) in names:
                    conn.execute(f'DEALLOCATE "{name}"')
        whole, moved = s.engine.commits_whole, s.engine.commits_moved
        with caplog.at_level("WARNING", logger="ccpo.serve"):
            for i in range(3, 6):
                s.answers.record_answer(_answer(f"q{i}", 0.001)).result()
        assert not s.db._prepare
        assert s.engine.commits_moved == moved + 1  # the one write that met it, redone
        assert s.engine.commits_whole >= whole + 1  # whole again, unprepared
        assert "prepared statements do not last here" in caplog.text
        c = s.refresh()[1]
        assert c.requests == 6 and c.cost_usd == pytest.approx(0.006, abs=1e-15)
    finally:
        s.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_answer_table_keeps_the_newest_max_records(backend, pg_cluster, tmp_path):
    """Past ``max_records`` answers the oldest go (checked every 64 inserts), on either
    backend and whichever way the answers were written: 130 answers, 10 kept, 12 present
    (2 since the last trim), the newest."""
    url = pg_cluster.new_database() if backend == "postgresql" else str(tmp_path / "s.sqlite")
    s = StateStore(url, "fp", OnlineThreshold(alpha=0.1, kappa=0.5), max_records=10)
    try:
        for i in range(130):
            s.answers.record_answer(_answer(f"q{i:03d}", 0.001)).result()
        with s.db.read() as tx:
            kept = [r[0] for r in tx.all("SELECT id FROM ccpo_answers ORDER BY created, id")]
        assert kept == [f"q{i:03d}" for i in range(118, 130)]
        assert s.refresh()[1].requests == 130
    finally:
        s.close()


def test_a_newer_schema_is_refused(pg_cluster):
    url = pg_cluster.new_database()
    tr = OnlineThreshold(alpha=0.1)
    s = StateStore(url, "fp", tr)
    with s.db.write() as tx:
        tx.run("UPDATE ccpo_meta SET value = ? WHERE key = 'schema_version'", (str(99),))
    s.close()
    with pytest.raises(
        CCPOError, match=f"schema version 99, newer than this ccpo's \\({SCHEMA_VERSION}"
    ):
        StateStore(url, "fp", tr)


def test_a_one_process_state_file_is_converted(tmp_path):
    """A SQLite state file of the older format (v1: tables kv, answers) keeps its κ, counters
    and answers; what it had in flight when it stopped counts as spent."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute(
        "CREATE TABLE answers (id TEXT PRIMARY KEY, question TEXT NOT NULL, answer TEXT NOT "
        "NULL, created REAL NOT NULL, feedback TEXT)"
    )
    tracker = {"alpha": 0.1, "kappa": 0.27, "eta0": 0.01, "xi": 0.1, "step": 5}
    counters = {"requests": 3, "spent_usd": 0.5, "inflight_usd": 0.25, "feedback": 1,
                "covered": 1, "recent": [1]}  # fmt: skip
    kv = {"format": "ccpo.serve-state/v1", "fingerprint": "fp", "tracker": json.dumps(tracker),
          "counters": json.dumps(counters)}  # fmt: skip
    for k, v in kv.items():
        db.execute("INSERT INTO kv VALUES (?, ?)", (k, v))
    db.execute("INSERT INTO answers VALUES ('q1', 'Q?', '{\"answers\": [\"A\"]}', 1.0, NULL)")
    db.commit()
    db.close()
    s = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1))
    assert s.restored and s.kappa == 0.27 and s.engine.tracker.step == 5
    assert s.counters.requests == 3 and s.counters.spent_usd == pytest.approx(0.75)
    assert s.counters.inflight_usd == 0.0
    assert s.answers.lookup("q1").result() == ("Q?", {"answers": ["A"]}, None)
    s.close()
    again = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1))  # now the current format
    assert again.counters.spent_usd == pytest.approx(0.75)
    again.close()
