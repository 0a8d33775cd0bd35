"""The commit engine of the state store (:class:`CommitEngine`, the ``engine`` of
:class:`~ccpo.runtime.state.store.StateStore`): one writer thread per replica takes every
operation pending into one transaction (group commit) and hands each result back to its
caller (a thread, or an event loop once per transaction).

- :meth:`~CommitEngine.commit`: an operation for the next transaction, a :class:`Pending`
  that a thread waits for (``.result()``) and an event loop awaits (:meth:`~CommitEngine.run`,
  :meth:`~CommitEngine.arun`), within the deadline (``timeout``), else
  :class:`StateUnavailable`;
- :meth:`~CommitEngine.pend`: settlements and counts written with the next transaction;
- ``_write_loop``: the writer thread (batches, the heartbeat, probes while the database is
  away, checkpoints); ``_run_batch``: one transaction, read and written (``_transact``) or
  sent whole from the rows as this replica left them (``_write_whole``);
- ``_run_here``: a lone question's write committed on the event loop itself when that cannot
  wait (SQLite), checkpointed by the writer every ``_CHECKPOINT_EVERY`` commits;
- ``_lazy``: have pending settlements written within ``FLUSH_S`` without waking the writer;
- an operation whose own statement the database refuses fails alone (:class:`OperationRefused`):
  its transaction is redone without it, so the others of its batch commit.

Vocabulary (sent whole, committed here, group commit) and the contract: docs/glossary.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.feedback import Counters
from ccpo.runtime.state.batch import Batch, Lease, _Delta, _never, _Op, _Record, _Redo
from ccpo.runtime.state.db import (
    Backend,
    Busy,
    Moved,
    OperationRefused,
    StateUnavailable,
    Step,
    Tx,
    database_away,
)
from ccpo.runtime.state.schema import (
    SCHEMA_VERSION,
    VERSION_SQL,
    SchemaChanged,
    check_version,
    parse_state,
    state_texts,
    version_moved,
)

log = logging.getLogger("ccpo.serve")

FLUSH_S = 1.0  # a settlement waits at most this long for a transaction to ride on
_CHECKPOINT_EVERY = 256  # commits on the caller's thread between two checkpoints by the writer

_WHOLE_MAX = 500  # answer rows in one insert statement
_LEASES = (  # every lease, as each transaction reads them (Money.read_leases)
    "SELECT replica, reserved_usd, inflight_usd, expires, idle, waiting, owner, proc "
    "FROM ccpo_leases"
)

T = TypeVar("T")


def answer_rows(replica: str, answers: list[_Record]) -> list[tuple[str, str, str, str]]:
    """The rows of answer records (each with its JSON text, None: made here): id, question,
    the record, the replica."""
    return [(a["id"], a["question"], t or json.dumps(a), replica) for a, t in answers]


def insert_sql(now_sql: str, n: int) -> str:
    """The insert of ``n`` answer rows (:func:`answer_rows`), skipping ids already taken but
    for this replica's claims (:meth:`~ccpo.runtime.state.answers.Answers.claim`: the row of
    an id being answered, its answer ``''``), which the answer replaces."""
    return (
        "INSERT INTO ccpo_answers (id, question, answer, replica, created) VALUES "
        + ", ".join([f"(?, ?, ?, ?, {now_sql})"] * n)
        + " ON CONFLICT (id) DO UPDATE SET question = excluded.question, answer = "
        "excluded.answer, created = excluded.created WHERE ccpo_answers.answer = '' AND "
        "ccpo_answers.replica = excluded.replica"
    )


def insert_answers(tx: Tx, now_sql: str, replica: str, answers: list[_Record]) -> list:
    """Send the inserts of answer records (each with its JSON text, None: made here), 500 rows
    a statement, skipping ids already taken (but this replica's claims); each statement's
    rows (``.fetchall()``) are the ids that went in. Sent before the state row is locked, so
    that the lock is held for less."""
    sent = []
    for k in range(0, len(answers), _WHOLE_MAX):
        rows = answer_rows(replica, answers[k : k + _WHOLE_MAX])
        sql = insert_sql(now_sql, len(rows)) + " RETURNING id"  # the ids that went in
        sent.append(tx.send(sql, [x for row in rows for x in row]))
    return sent


class Pending(Generic[T]):
    """An operation for the engine's next transaction, one of each kind whether its caller
    is a thread or an event loop: :meth:`result` sends it and waits for its commit (any
    thread but the writer's and no event loop's), ``await`` sends it and awaits its commit
    without blocking the loop (:meth:`CommitEngine.arun`). Once, either way. A caller that
    stops waiting (the deadline, a cancellation) leaves the operation skipped if the writer
    has not taken it, else its result undone after the commit."""

    __slots__ = ("_engine", "op")

    def __init__(self, engine: CommitEngine, op: _Op) -> None:
        self._engine = engine
        self.op = op  # (a test may run it in a batch of its own making)

    def result(self) -> T:
        return self._engine.run(self.op)

    def __await__(self) -> Generator[Any, None, T]:
        return self._engine.arun(self.op).__await__()

    def __bool__(self) -> bool:  # a forgotten .result() must not pass for True
        raise TypeError("a pending state operation: take its .result() or await it")


class MoneyPart(Protocol):
    """What the engine asks of the store's money (:class:`~ccpo.runtime.state.money.Money`)
    inside and after each transaction: this replica's lease, its spare wallet, the others'
    leases."""

    owner: str
    proc: str
    host: str
    mirror: Lease
    orphan: Lease
    others_busy: bool
    others_hold: bool
    others_waiting: bool

    def read_leases(self, b: Batch, rows: list[tuple[Any, ...]], beat: bool) -> None: ...
    def look(self, rows: list[tuple[Any, ...]]) -> None: ...
    def apply(self, b: Batch, d: _Delta) -> None: ...
    def top_up(self, b: Batch) -> float: ...
    def lease_values(self, lease: Lease) -> tuple[float, float, float, int, int]: ...
    def committed(self, b: Batch, top: float) -> None: ...
    def lease_lost(self) -> bool: ...
    def neighbour_gone(self) -> bool: ...
    def spare_idle_at(self) -> float | None: ...
    def drop_spare(self) -> None: ...


class AnswersPart(Protocol):
    """What the engine asks of the store's answers
    (:class:`~ccpo.runtime.state.answers.Answers`): the trim of the answer table."""

    def trim_due(self, added: int) -> bool: ...
    def trim(self, tx: Tx | None, added: int) -> None: ...


class _Refused(Exception):
    """An operation's own statement failed in the database (not the database itself): its
    transaction is undone and redone without it."""

    def __init__(self, op: _Op, error: Exception) -> None:
        self.op, self.error = op, error
        super().__init__(str(error))


def _deliver(ops: list[tuple[_Op, bool, Any]]) -> None:
    """Hand a transaction's results to the awaiting coroutines (in their loop's thread); a
    result whose caller is gone is undone (a reservation released)."""
    for op, ok, value in ops:
        fut = op.afut
        assert fut is not None
        if fut.done():
            if ok and op.undo is not None:
                op.undo(value)
        elif ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _deliver_closed(items: list[tuple[_Op, bool, Any]]) -> None:
    """A transaction's results whose loop is closed: nobody takes them; undone."""
    for op, ok, value in items:
        if ok and op.undo is not None:
            op.undo(value)


class CommitEngine:
    """The writer of :class:`~ccpo.runtime.state.store.StateStore`: its queue, its thread,
    its transactions and what this replica knows of the state row after each commit (κ's
    tracker, the counters). Inside a transaction it asks the store's money and answers
    (:meth:`attach`) for their part: the leases read and written, settlements applied, the
    spare topped up, the answer table trimmed. ``db``: the backend; ``replica``: this
    replica's id; ``expiry``: seconds its lease outlives its last transaction; ``timeout``:
    the deadline of every operation (seconds)."""

    tracker: OnlineThreshold  # κ's tracker as this replica's last transaction found it
    counters: Counters  # the counters, likewise (plus refused requests not yet written)
    money: MoneyPart
    answers: AnswersPart

    def __init__(self, db: Backend, replica: str, expiry: float, timeout: float) -> None:
        self.db = db
        self.where = db.where
        self.replica = replica
        self.expiry = float(expiry)
        self.timeout = float(timeout)
        # whether the event loop awaiting this store has nothing else to do (a lone question;
        # its service sets it): its writes sent whole may then commit on it (_run_here)
        self.alone: Callable[[], bool] = _never
        self.commits = 0  # transactions committed by the writer (benchmarks, tests)
        self.commits_whole = 0  # of them sent whole (one round trip: _write_whole)
        self.commits_moved = 0  # sent whole, found the state moved, redone
        self.commits_here = 0  # of them run on the caller's thread (_run_here)
        self._batch = threading.Lock()  # held by whoever runs a transaction (writer or here)
        self._here_n = 0  # commits here since the writer's last checkpoint
        self._checkpoint_due = False
        self._texts: tuple[str, str] | None = None  # the state row as last read or written
        self._solo = False  # the last transaction found the row as this replica left it
        self._delta = _Delta()  # settlements and counts for the next transaction (under cond)
        self._queue: list[_Op] = []
        self.cond = threading.Condition()  # guards the queue and the pending delta
        self._flush_at: float | None = None
        self._busy_since: float | None = None  # a transaction has been running since
        self._down: str | None = None  # why the last transaction failed (None: it did not)
        self._closing = False
        self._stop = threading.Event()  # set by stop: the writer thread ends
        self._writer = threading.Thread(target=self._write_loop, name="ccpo-state", daemon=True)

    def attach(self, money: MoneyPart, answers: AnswersPart) -> None:
        """The parts this engine's transactions ask for theirs (see the class)."""
        self.money, self.answers = money, answers

    def start(self) -> None:
        """The first transaction (this replica's lease taken, the state row read), then the
        writer thread."""
        self._run_batch([], beat=True)
        self._writer.start()

    def stop(self) -> None:
        """Refuse new operations and stop the writer (within the deadline)."""
        with self.cond:
            self._closing = True
            self._stop.set()
            self.cond.notify_all()
        self._writer.join(timeout=self.timeout + 1)

    def pend(self, d: _Delta, lazy: bool = True) -> None:
        """Add settlements and counts (or a lease to write) to the next transaction, never
        blocking; ``lazy``: written within ``FLUSH_S`` (else whenever one runs)."""
        with self.cond:
            self._delta.add(d)
            if lazy:
                self._lazy()

    def flush_now(self) -> None:
        """Have the writer write what is pending at once (under ``cond``)."""
        self._flush_at = time.monotonic()
        self.cond.notify()

    def pending(self) -> bool:
        """Settlements wait to be written (money this replica is about to free)."""
        with self.cond:
            return self._delta.reserved > 0

    def flush(self) -> None:
        """Write what is pending now (and wait for it)."""
        self.commit(lambda b: None, whole=True).result()

    # ------------------------------------------------------------------ the writer
    def submit(self, op: _Op) -> _Op:
        """Queue ``op`` for the writer's next transaction; :class:`StateUnavailable` at once
        while the database is known to be away (nothing queued)."""
        why = self.unavailable()
        if why is not None:
            raise StateUnavailable(f"the state database {self.where} is unavailable: {why}")
        with self.cond:
            if self._closing:
                raise StateUnavailable("the state store is closing (the server is stopping)")
            self._queue.append(op)
            self.cond.notify()
        return op

    def _late(self) -> StateUnavailable:
        return StateUnavailable(
            f"the state database {self.where} did not answer within {self.timeout:g} s"
        )

    def _submit_op(self, op: _Op, loop: bool = False) -> _Op:
        """``op`` with a future for its result (of the running event loop with ``loop``),
        queued."""
        if loop:
            op.afut = asyncio.get_running_loop().create_future()
        else:
            op.fut = concurrent.futures.Future()
        return self.submit(op)

    def commit(
        self, fn: Callable[[Batch], T], read: bool = False, undo: Any = None, whole: bool = False
    ) -> Pending[T]:
        """``fn`` for the writer's next transaction (``read``: it only reads; ``undo``: what
        undoes its result once committed if its caller stopped waiting; ``whole``: it computes
        on the batch alone), sent when its result is asked for: :class:`Pending`."""
        return Pending(self, _Op(fn, read=read, undo=undo, whole=whole))

    def run(self, op: _Op) -> Any:
        """``op``'s result, committed by the writer (any thread but the writer's and no event
        loop's)."""
        return self._wait(self._submit_op(op))

    def _wait(self, op: _Op) -> Any:
        assert op.fut is not None
        try:
            return op.fut.result(self.timeout)
        except concurrent.futures.TimeoutError:
            with self.cond:  # the writer hands out thread results under this lock too
                if op.fut.done():
                    return op.fut.result()
                op.abandoned = True  # skipped if not taken yet, else undone after its commit
            raise self._late() from None

    async def arun(self, op: _Op) -> Any:
        """``op``'s result for an event loop: committed on it when the loop is alone and
        that cannot wait (:meth:`_run_here`), else by the writer, awaited."""
        if op.whole and self.alone():
            here = self._run_here(op)
            if here is not None:
                ok, value = here
                if not ok:
                    raise value
                return value
        return await self._await(self._submit_op(op, loop=True))

    async def _await(self, op: _Op) -> Any:
        fut = op.afut
        assert fut is not None
        try:  # awaited directly (wait_for would wrap it: two more turns of the loop)
            async with asyncio.timeout(self.timeout):  # on expiry op.afut is cancelled: gone
                return await fut
        except TimeoutError:
            # the result came in the turn of the loop the deadline did (a stalled loop, a
            # database back after a stall): committed, so the caller's, not left held
            if self._committed_result(fut):
                return fut.result()
            raise self._late() from None
        except asyncio.CancelledError:  # the caller is gone: a result it missed is undone
            if self._committed_result(fut) and op.undo is not None:
                op.undo(fut.result())
            raise

    @staticmethod
    def _committed_result(fut: asyncio.Future[Any]) -> bool:
        """``fut`` holds an operation's result (it committed)."""
        return fut.done() and not fut.cancelled() and fut.exception() is None

    def unavailable(self) -> str | None:
        """Why the database is considered away now (None: it is not): the last transaction
        failed, or the one running has taken longer than the deadline."""
        if self._down is not None:
            return self._down
        since = self._busy_since
        if since is not None and time.monotonic() - since > self.timeout:
            return f"a transaction has waited {time.monotonic() - since:.1f} s for it"
        return None

    def _write_loop(self) -> None:
        beat_every = self.expiry / 4
        next_beat = time.monotonic() + beat_every
        backoff = 0.0
        while True:
            with self.cond:
                while True:
                    now = time.monotonic()
                    if self._stop.is_set():
                        return
                    if self._queue or (self._closing and self._delta):
                        break
                    if self._flush_at is not None and now >= self._flush_at:
                        break
                    if self.money.neighbour_gone():  # settled now, not when its lease expires
                        next_beat = now
                    if now >= next_beat or (self._down is not None and now >= backoff):
                        break
                    wake = next_beat if self._down is None else backoff
                    idle_at = self.money.spare_idle_at()
                    if idle_at is not None:
                        if now >= idle_at:
                            self.money.drop_spare()
                            continue
                        wake = min(wake, idle_at)
                    wake = min(wake, now + FLUSH_S / 2, self._flush_at or wake)
                    self.cond.wait(max(0.0, wake - now))
                if self._down is not None and time.monotonic() < backoff:
                    ops: list[_Op] = []  # away: eager operations were refused; probe only
                else:
                    ops, self._queue = [op for op in self._queue if not op.gone()], []
                self._flush_at = None
            beat = time.monotonic() >= next_beat or self._down is not None
            try:
                self._run_batch(ops, beat=beat)
            except Exception as e:  # the database is away (or refused the transaction)
                why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                if self._down is None:
                    log.warning("state database %s unavailable: %s", self.where, why)
                self._down = why
                backoff = time.monotonic() + 0.5
                how = "is unavailable" if isinstance(e, SchemaChanged) else "failed"
                err = StateUnavailable(f"the state database {self.where} {how}: {why}")
                self._hand_out(ops, [(False, err)] * len(ops))
                continue
            if self._down is not None:
                log.warning("state database %s is back", self.where)
                self._down = None
            if self._checkpoint_due:  # what commits on the loop appended to the log
                self._checkpoint_due = False
                try:
                    self.db.checkpoint()
                except Exception as e:
                    log.warning("state database %s: a checkpoint failed: %s", self.where, e)
            if beat:
                next_beat = time.monotonic() + beat_every

    def _run_batch(self, ops: list[_Op], beat: bool = False) -> None:
        """One transaction for ``ops`` (and the pending settlements and counts); each op's
        result (or its own :class:`CCPOError`) is handed out after the commit: sent whole
        when it can be (:meth:`_write_whole`), else read, computed and written
        (:meth:`_transact`). An op whose own statement the database refuses is taken out
        and the transaction redone without it; it gets :class:`OperationRefused`."""
        refused: list[tuple[_Op, tuple[bool, Any]]] = []
        while True:
            try:
                self._run_batch_once(ops, beat)
                break
            except _Refused as r:
                why = (str(r.error).strip().splitlines() or [type(r.error).__name__])[0]
                log.warning(
                    "state %s: an operation was refused (%s); the others redone", self.where, why
                )
                ops = [op for op in ops if op is not r.op]
                err = OperationRefused(f"the state database {self.where} refused it: {why}")
                refused.append((r.op, (False, err)))
        if refused:
            self._hand_out([op for op, _ in refused], [res for _, res in refused])

    def _run_batch_once(self, ops: list[_Op], beat: bool) -> None:
        """:meth:`_run_batch`'s one transaction; :class:`_Refused` undoes it."""
        with self._batch:
            delta = self._take_pending()
            writes = beat or bool(delta) or any(not op.read for op in ops)
            records = [(op.answer, op.text) for op in ops if op.answer is not None]
            self._busy_since = time.monotonic()
            try:
                done = None
                if writes and not beat and self._whole_ready(ops, len(records)):
                    done = self._write_whole(ops, records, delta)
                if done is None:
                    done = self._transact(ops, records, delta, writes, beat)
            except BaseException as e:
                self.pend(delta, lazy=False)  # written by none: to the next transaction
                if self._may_be_schema(e):
                    version_moved(self.db)  # a newer ccpo's tables: say that instead
                raise
            finally:
                self._busy_since = None
            results = self._committed(done, writes)
        self._hand_out(ops, results)

    def _may_be_schema(self, e: BaseException) -> bool:
        """A failed transaction's error may come from tables another version changed: worth a
        read of the version (not when PostgreSQL's connection failed: that read would wait
        for the pool; SQLite's errors of either kind are all ``OperationalError``, and its
        read costs nothing)."""
        if not isinstance(e, Exception) or isinstance(e, SchemaChanged):
            return False
        return self.db.kind == "sqlite" or not database_away(e)

    def _run_here(self, op: _Op) -> tuple[bool, Any] | None:
        """Run ``op`` in a transaction of its own on the calling thread, an event loop with
        nothing else to do (a lone question), when that cannot wait: the backend offers it
        (SQLite: :meth:`Backend.write_whole` with ``wait=False`` only appends to the WAL in the
        page cache, or fails at once; in memory it tries the one connection's lock without
        waiting), the writer is idle with nothing queued, and the batch can be sent whole
        (:meth:`_whole_ready`). Saves the two thread wake-ups of a hand-over to the writer and
        back, on every answer's critical path (what that costs: docs/glossary.md, "committed
        here"). Its result, as :meth:`_run_ops` gives it; None: nothing was done (the caller
        queues ``op`` for the writer)."""
        if not self.db.here or self._down is not None or not self._batch.acquire(False):
            return None
        try:
            with self.cond:
                if self._queue or self._closing:
                    return None
            records = [(op.answer, op.text)] if op.answer is not None else []
            if not self._whole_ready([op], len(records)):
                return None
            delta = self._take_pending()
            try:
                done = self._write_whole([op], records, delta, wait=False)
            except Exception as e:  # the writer meets it again, and reports it
                log.debug("state %s: a write here failed (%s); handed to the writer", self.where, e)
                done = None
            if done is None:
                self.pend(delta, lazy=False)
                return None
            result = self._committed(done, writes=True)[0]
            self.commits_here += 1
            with self.cond:
                if not self._delta:
                    self._flush_at = None  # what it was set for went with this commit
                self._here_n += 1
                if self._here_n >= _CHECKPOINT_EVERY:
                    self._here_n, self._checkpoint_due = 0, True
                    self._lazy()
            return result
        finally:
            self._batch.release()

    def _take_pending(self) -> _Delta:
        """The settlements and counts not yet written (and whether the lease must be)."""
        with self.cond:
            delta, self._delta = self._delta, _Delta()
        return delta

    def _committed(
        self, done: tuple[Batch, list[tuple[bool, Any]], float, tuple[str, str]], writes: bool
    ) -> list[tuple[bool, Any]]:
        """After a commit: what this replica knows of the rows (its lease, the others', the
        state row's text, the spare's top-up); the ops' results."""
        b, results, top, self._texts = done
        if writes:
            self.commits += 1
            self.money.committed(b, top)
        self.tracker, self.counters = b.tracker, b.counters
        self.counters.rejected += self._delta.rejected
        return results

    def _transact(
        self, ops: list[_Op], records: list[_Record], delta: _Delta, writes: bool, beat: bool
    ) -> tuple[Batch, list[tuple[bool, Any]], float, tuple[str, str]]:
        """The batch read, computed and written in one transaction; (the batch, the ops'
        results, the spare's top-up, the state row's text as committed). Round trips in
        PostgreSQL: the answers inserted, the state row (locked) and the leases read; the
        lease and the state row written back."""
        top = 0.0
        with self.db.write() if writes else self.db.read() as tx:
            # sent together (one round trip in PostgreSQL): the answers, the state row
            # (locked) and, read once it is locked, the leases
            inserts = insert_answers(tx, self.db.now, self.replica, records)
            lock = self.db.lock if writes else ""
            state = tx.send(
                f"SELECT tracker, counters, {self.db.now}, {VERSION_SQL} FROM ccpo_state "
                f"WHERE id = 1{lock}"
            )
            leases = tx.send(_LEASES)  # (a read too: whether a neighbour holds money)
            went_in = {r[0] for rows in inserts for r in rows.fetchall()}
            row = state.fetchone()
            if row is not None:  # another version: nothing of this is committed
                check_version(row[3])
            tracker, c = parse_state(self.where, row)
            assert row is not None
            texts = (row[0], row[1])
            self._solo = texts == self._texts  # no other replica wrote since this one did
            money = self.money
            b = Batch(tx, tracker, c, Lease(), float(row[2]), money.orphan, inserted=went_in)
            if writes:
                money.read_leases(b, leases.fetchall(), beat)
                money.apply(b, delta)
            else:
                money.look(leases.fetchall())
            added = len(went_in)  # (the ops take their ids out of it)
            results = self._run_ops(ops, b)
            if added:
                self.answers.trim(tx, added)
            if writes:
                top = money.top_up(b)
                values = money.lease_values(b.lease)
                if b.new_lease:
                    tx.run(
                        "INSERT INTO ccpo_leases (reserved_usd, inflight_usd, expires, idle, "
                        "waiting, replica, host, pid, owner, proc) VALUES "
                        f"(?, ?, {self.db.now} + ?, ?, ?, ?, ?, ?, ?, ?)",
                        (*values, self.replica, money.host, os.getpid(), money.owner, money.proc),
                    )
                elif not b.lease_ended:
                    tx.run(
                        "UPDATE ccpo_leases SET reserved_usd = ?, inflight_usd = ?, "
                        f"expires = {self.db.now} + ?, idle = ?, waiting = ? WHERE replica = ?",
                        (*values, self.replica),
                    )
                texts = state_texts(b.tracker, b.counters)
                tx.run("UPDATE ccpo_state SET tracker = ?, counters = ? WHERE id = 1", texts)
        return b, results, top, texts

    def _whole_ready(self, ops: list[_Op], n: int) -> bool:
        """The batch may be sent whole: this replica's last transaction found nobody else had
        written since its own and no other replica holding money (so the row it left is
        likely still there when the batch arrives: a guard that fails costs a round trip,
        and a wait for the row lock of the replica that moved it), its lease is its own,
        every op computes on the batch alone, and no trim is due (``n``: answers in it)."""
        if not self._solo or self.money.others_hold or self.money.lease_lost():
            return False
        return n <= _WHOLE_MAX and not self.answers.trim_due(n) and all(op.whole for op in ops)

    def _write_whole(
        self, ops: list[_Op], records: list[_Record], delta: _Delta, wait: bool = True
    ) -> tuple[Batch, list[tuple[bool, Any]], float, tuple[str, str]] | None:
        """:meth:`_transact` without reading first: computed from the state row and lease as
        this replica's last transaction left them, and sent as guarded steps
        (:meth:`Backend.write_whole`: in PostgreSQL one statement, one round trip, no row lock
        held across a round trip). Nothing is done unless the state row and this replica's
        lease were still what the batch was computed from and every answer went in; then (or
        when an op asks for it, :class:`_Redo`) None: :meth:`_transact` redoes the batch. The
        writes are the ones :meth:`_transact` would have made from the same rows.
        ``wait=False``: sent without waiting (:meth:`_run_here`); None if that would wait."""
        ids = {a["id"] for a, _ in records}
        money = self.money
        old, m = self._texts, money.mirror
        assert old is not None
        tracker, c = parse_state(self.where, old)
        now = self.db.now
        b = Batch(
            tx=None,  # type: ignore[arg-type]  # (ops sent whole run no SQL of their own)
            tracker=tracker,
            counters=c,
            lease=Lease(m.reserved, m.inflight, m.idle, m.waiting),
            now=math.nan,  # (only the leases' read needs the database's clock)
            orphan=money.orphan,
            new_lease=False,
            others_busy=money.others_busy,
            others_hold=money.others_hold,
            others_waiting=money.others_waiting,
            inserted=set(ids),
            ahead=True,
        )
        try:
            money.apply(b, delta)
            results = self._run_ops(ops, b)
            top = money.top_up(b)
            texts = state_texts(b.tracker, b.counters)
            steps: list[Step] = []
            if records:
                rows = answer_rows(self.replica, records)
                steps.append((insert_sql(now, len(rows)), [x for r in rows for x in r], len(ids)))
            # (tables of another version: Moved, and the transaction redone refuses it)
            steps.append((
                "UPDATE ccpo_state SET tracker = ?, counters = ? WHERE id = 1 AND tracker = ? "
                f"AND counters = ? AND {VERSION_SQL} = ?", (*texts, *old, str(SCHEMA_VERSION)), 1,
            ))  # fmt: skip
            steps.append((
                f"UPDATE ccpo_leases SET reserved_usd = ?, inflight_usd = ?, expires = {now} + ?,"
                f" idle = ?, waiting = ? WHERE replica = ? AND owner = ? AND expires >= {now}"
                " AND reserved_usd = ? AND inflight_usd = ?",
                (*money.lease_values(b.lease), self.replica, money.owner, m.reserved, m.inflight),
                1,
            ))  # fmt: skip
            self.db.write_whole(steps, wait=wait)
        except (_Redo, Busy):
            return None
        except Moved:
            self._solo = False
            self.commits_moved += 1
            return None
        self.answers.trim(None, len(ids))  # (none is due: _whole_ready)
        self.commits_whole += 1
        return b, results, top, texts

    @staticmethod
    def _run_ops(ops: list[_Op], b: Batch) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any]] = []
        for op in ops:
            try:
                results.append((True, op.fn(b)))
            except CCPOError as e:  # this operation's own refusal (a duplicate id, ...)
                results.append((False, e))
            except _Redo:
                raise  # (a batch computed ahead, to be redone the usual way)
            except Exception as e:
                if database_away(e):
                    raise
                raise _Refused(op, e) from e  # its own statement: redone without it
        return results

    def _hand_out(self, ops: list[_Op], results: list[tuple[bool, Any]]) -> None:
        """Results to their callers: one hand-over per event loop, thread waiters directly."""
        loops: dict[asyncio.AbstractEventLoop, list[tuple[_Op, bool, Any]]] = {}
        with self.cond:  # under the lock a thread giving up takes (see _wait)
            for op, (ok, value) in zip(ops, results, strict=True):
                if op.afut is not None:
                    loops.setdefault(op.afut.get_loop(), []).append((op, ok, value))
                elif op.abandoned:
                    if ok and op.undo is not None:
                        op.undo(value)
                elif op.fut is not None:
                    if ok:
                        op.fut.set_result(value)
                    else:
                        op.fut.set_exception(value)
        for loop, items in loops.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody awaits these any more
                _deliver_closed(items)

    def _lazy(self) -> None:
        """Have the writer write the delta within ``FLUSH_S``. Without waking it: waking a
        thread costs the event loop a context switch, on every question's critical path (see
        docs/glossary.md, "settlement"); an idle writer looks every ``FLUSH_S / 2`` instead,
        and the next transaction takes the delta anyway."""
        if self._flush_at is None:
            self._flush_at = time.monotonic() + FLUSH_S / 2
