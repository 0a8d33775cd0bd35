"""A lone question's writes committed on the event loop itself (SQLite,
``CommitEngine._run_here``). What that saves is measured by ``benchmarks/bench_gateway.py``
(concurrency 1); here: it is the same durable commit, it never waits (another connection
holding the file's write lock sends the write to the writer thread instead), and what it
appends to the log is checkpointed by the writer."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time

import httpx
import pytest

from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.state import DuplicateKey, StateStore, engine
from tests.helpers.serve import LiveServer, make_service

Q = "Which is a prime number?\nA. 4\nB. 6\nC. 7\nD. 9"


def _answer(i: int) -> dict:
    return {"id": f"q{i}", "question": f"question {i}", "cost_usd": 0.25, "answers": ["C"],
            "rounds": 2}  # fmt: skip


async def _record(s: StateStore, answer: dict) -> None:
    """``answer`` stored, awaited on the event loop ``asyncio.run`` makes."""
    await s.answers.record_answer(answer)


def _ids(path, immutable: bool = False) -> set[str]:
    """The answer ids another connection reads (``immutable``: the database file alone, not
    what the log holds yet)."""
    url = f"file:{path}?immutable=1" if immutable else f"file:{path}"
    for _ in range(50):
        db = sqlite3.connect(url, uri=True)
        try:
            return {r[0] for r in db.execute("SELECT id FROM ccpo_answers")}
        except sqlite3.OperationalError:  # immutable: the table itself is still in the log
            return set()
        except sqlite3.DatabaseError:  # immutable: read while a checkpoint writes the file
            time.sleep(0.02)
        finally:
            db.close()
    raise AssertionError(f"{path} stayed unreadable")


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "not-alone"])
@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_lone_answer_commits_on_the_loop_and_is_durable_when_awaited(tmp_path, alone, where):
    path = tmp_path / "s.sqlite"
    s = StateStore(str(path) if where == "file" else None, "fp", OnlineThreshold(alpha=0.1))
    s.engine.alone = lambda: alone
    seen: list[set[str]] = []

    async def answer_three() -> None:
        for i in range(3):
            await s.answers.record_answer(_answer(i))
            if where == "file":
                seen.append(_ids(path))  # committed: another connection reads it at once

    try:
        asyncio.run(answer_three())
        # (the first transaction after opening reads the row: it does not know it yet)
        assert s.engine.commits_here == (2 if alone else 0)
        assert s.counters.requests == 3 and s.counters.cost_usd == pytest.approx(0.75)
        if where == "file":
            assert seen == [{"q0"}, {"q0", "q1"}, {"q0", "q1", "q2"}]
        with pytest.raises(DuplicateKey):  # a taken id: refused, the same way
            asyncio.run(_record(s, _answer(1)))
        assert s.counters.requests == 3
    finally:
        s.close()
    if where == "file":  # what it counted is in the state a restart reads
        again = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1))
        try:
            assert again.counters.requests == 3 and _ids(path) == {"q0", "q1", "q2"}
        finally:
            again.close()


def test_a_commit_here_never_waits_for_the_file_lock(tmp_path):
    """Another process (here: connection) holds the file's write lock for 1 s: the lone
    answer goes to the writer thread, which waits for the lock; the event loop keeps
    running meanwhile (a ticker every 10 ms never misses 0.4 s)."""
    path = tmp_path / "s.sqlite"
    s = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1))
    s.engine.alone = lambda: True
    other = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    try:
        asyncio.run(_record(s, _answer(-1)))  # (the first one reads the row first)
        asyncio.run(_record(s, _answer(0)))
        assert s.engine.commits_here == 1
        other.execute("BEGIN IMMEDIATE")
        threading.Timer(1.0, lambda: other.execute("COMMIT")).start()

        async def record_while_locked() -> tuple[float, float]:
            gaps, last = [], time.monotonic()

            async def tick() -> None:
                nonlocal last
                while True:
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            t0 = time.monotonic()
            await s.answers.record_answer(_answer(1))
            took = time.monotonic() - t0
            ticker.cancel()
            return took, max(gaps, default=took)  # (no tick at all: blocked throughout)

        took, gap = asyncio.run(record_while_locked())
        assert took >= 0.9  # it waited for the lock: in the writer thread, not on the loop
        assert gap < 0.4, gap
        assert s.engine.commits_here == 1  # that one went to the writer
        assert _ids(path) == {"q-1", "q0", "q1"}
        asyncio.run(_record(s, _answer(2)))  # the lock is free again: here again
        assert s.engine.commits_here == 2
    finally:
        other.close()
        s.close()


def test_what_commits_here_append_to_the_log_the_writer_checkpoints(tmp_path, monkeypatch):
    """Commits here never checkpoint (a checkpoint syncs the disk); every
    ``_CHECKPOINT_EVERY`` of them the writer does, within ``FLUSH_S``: the answers reach the
    database file itself (read without the log)."""
    monkeypatch.setattr(engine, "_CHECKPOINT_EVERY", 4)
    path = tmp_path / "s.sqlite"
    s = StateStore(str(path), "fp", OnlineThreshold(alpha=0.1))
    s.engine.alone = lambda: True
    try:

        async def answer(ids: range) -> None:
            for i in ids:
                await s.answers.record_answer(_answer(i))

        asyncio.run(answer(range(4)))  # (the first one reads the row first: not here)
        time.sleep(engine.FLUSH_S)
        assert s.engine.commits_here == 3 and _ids(path, immutable=True) == set()  # only in the log
        asyncio.run(answer(range(4, 9)))
        assert s.engine.commits_here == 8
        deadline = time.monotonic() + 2 * engine.FLUSH_S + 1
        while len(_ids(path, immutable=True)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {f"q{i}" for i in range(5)} <= _ids(path, immutable=True)
    finally:
        s.close()


def test_serve_commits_a_lone_questions_writes_on_the_loop(
    world, policy_dir, prices_path, tmp_path
):
    """``ccpo serve`` on a SQLite file, questions one at a time: their writes commit on the
    loop (``state_commits_here``); questions at once go to the writer; every answer is
    stored and counted either way."""
    state = str(tmp_path / "serve.sqlite")
    svc = make_service(policy_dir, world, prices_path, {"state": state}, kappa=0.0)
    with LiveServer(svc) as ls, httpx.Client(base_url=ls.url, timeout=30) as http:
        one = [http.post("/v1/answer", json={"question": f"{Q} {i}"}) for i in range(6)]
        here = http.get("/metrics.json").json()["state_commits_here"]

        async def at_once() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=ls.url, timeout=30) as ah:
                qs = [ah.post("/v1/answer", json={"question": f"{Q} x{i}"}) for i in range(8)]
                return await asyncio.gather(*qs)

        many = asyncio.run(at_once())
        m = http.get("/metrics.json").json()
    assert all(r.status_code == 200 for r in one + many)
    assert here >= 5, here  # (the first question's may take the usual way: nothing known)
    assert m["requests"] == 14
    assert m["state_commits_here"] <= m["state_commits_whole"] <= m["state_commits"]
    assert _ids(state) == {r.json()["id"] for r in one + many}
