"""One replica frozen (SIGSTOP) in the middle of a write, its transaction open on the one state
row's lock: the other replicas answer again within the limits ccpo sets on its own PostgreSQL
sessions (``idle_in_transaction_session_timeout``, ``lock_timeout``: the state timeout), not
for the whole freeze; once it is continued, the frozen one (its transaction cut) reconnects and
answers. Real ``ccpo serve`` processes on a throw-away PostgreSQL, the scripted upstream."""

from __future__ import annotations

import os
import signal
import time

import httpx

from tests.helpers.world import make_world
from tests.runtime.test_store_faults import Load
from tests.runtime.test_store_faults import serve_process as serve

TIMEOUT = 2.0  # server.state_timeout (the default): the limits ccpo sets derive from it
FREEZE = 8.0  # seconds the replica stays frozen


def frozen_in_a_transaction(pid: int, replica: str, url: str, tries: int = 200) -> float:
    """SIGSTOP ``pid`` (replica ``replica``) as soon as the database sees a transaction of its
    open, until it stays stopped in one (idle in transaction for 0.3 s); when it did."""
    import psycopg

    mine = f"application_name = 'ccpo/{replica}' AND state = 'idle in transaction'"
    with psycopg.connect(url, autocommit=True) as db:
        for _ in range(tries):
            t_end = time.monotonic() + 2.0
            while time.monotonic() < t_end:
                if db.execute(f"SELECT 1 FROM pg_stat_activity WHERE {mine}").fetchone():
                    break
            os.kill(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            time.sleep(0.3)
            q = f"SELECT 1 FROM pg_stat_activity WHERE {mine} AND now() - state_change > '0.3 s'"
            if db.execute(q).fetchone():
                return t0
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    raise AssertionError("the replica never stopped inside a transaction")


def test_a_frozen_replica_costs_the_others_seconds_and_recovers(
    pg_cluster, policy_dir, prices_path, tmp_path
):
    """Three replicas under load; one is stopped with the state row locked and kept stopped
    8 s. The other two answer 200 again within the state timeout plus the time to notice it
    (they used to answer 503 for the whole freeze); every refusal is a JSON 503
    ``state_unavailable``; continued, the frozen one answers again within seconds; nothing
    stays reserved."""
    url = pg_cluster.new_database()
    with make_world(latency=0.02) as world:
        procs = [serve(tmp_path, world, prices_path, policy_dir, url, f"r{i}") for i in range(3)]
        (frozen, fu), (_, bu), (_, cu) = procs
        try:
            with (
                Load(fu, 3, feedback=False, tag="a") as a,
                Load(bu, 2, feedback=False, tag="b") as b,
                Load(cu, 2, feedback=False, tag="c") as c,
            ):
                while b.answers_ok() + c.answers_ok() < 10:
                    time.sleep(0.05)
                t0 = frozen_in_a_transaction(frozen.pid, "r0", url)
                time.sleep(max(0.0, t0 + FREEZE - time.monotonic()))
                back = [x.first_ok_after(t0) for x in (b, c)]
                os.kill(frozen.pid, signal.SIGCONT)
                t1 = time.monotonic()
                while a.first_ok_after(t1) is None and time.monotonic() - t1 < 20:
                    time.sleep(0.1)
                again = a.first_ok_after(t1)
            metrics = {}
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                metrics = httpx.get(bu + "/metrics.json", timeout=10).json()
                if metrics["reserved_usd"] == 0 and metrics["inflight_usd"] == 0:
                    break
                time.sleep(0.2)
        finally:
            for p, _ in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
            for p, _ in procs:
                p.wait(timeout=30)
    waits = [None if t is None else round(t - t0, 2) for t in back]
    print(f"the others answered again {waits} s into an {FREEZE:g} s freeze")
    assert all(t is not None for t in back), waits
    assert max(waits) <= TIMEOUT + 2.5, waits  # (before: the whole freeze, 8 s)
    errors = {body["error"]["type"] for x in (a, b, c) for code, body, *_ in x.seen if code != 200}
    assert errors <= {"state_unavailable"}, errors
    assert again is not None and again - t1 < 10.0  # the frozen one recovers
    assert metrics["reserved_usd"] == 0 and metrics["inflight_usd"] == 0, metrics
