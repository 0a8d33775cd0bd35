"""The state of ``ccpo serve``, one store for every replica: the total budget's money (spent,
reserved, in flight), κ with its online tracker, the counters, and the answer sets awaiting
feedback. The backend is an embedded SQLite file or a shared PostgreSQL database
(:mod:`ccpo.runtime.state.backends`); the logic here is the same for both. Why this design
and what it costs: docs/decisions.md ("Group commit and envelopes").

**One writer per replica, group commit.** Nothing here waits on the event loop. Every
operation is handed to the replica's one writer thread (but for the one case below), which
takes *all* operations pending at that moment into one transaction: it locks the single
row of ``ccpo_state`` (``SELECT ... FOR UPDATE`` in PostgreSQL; ``BEGIN IMMEDIATE`` in
SQLite), reads money, κ and counters, applies the operations in order, writes the row back
and commits. Callers await the commit
(:meth:`StateStore.areserve`, :meth:`~StateStore.arecord_answer`, ...), so a reservation is
durable before its call is sent and an acknowledged answer or feedback is in the database.
The row lock is taken once per batch, not once per operation: under load one commit carries
many questions. Serialised at that row, a budget check and its reservation are still one
atomic step over all replicas (no check-then-increment race), a feedback moves κ exactly
once, a repeated feedback id finds the first one's record.

**Sent whole while alone.** A replica whose last transaction found the state row as it had
left it (nobody else wrote in between) and no other replica holding money computes its next
batch ahead, from that row and its own lease, and sends the writes whole
(:meth:`~ccpo.runtime.state.backends.Backend.write_whole`): the answers inserted, the state
row and the lease written, each guarded by the rows it must change, so that nothing is done
unless the row and the lease were still what the batch was computed from and every answer
went in. Then the batch is redone the usual way. The writes are those the usual transaction
would have made from the same rows. In PostgreSQL that is one prepared statement: a round
trip saved and the row lock held across none (an answer's transaction 2.0 → 1.5 ms at
concurrency 1); in SQLite, two reads and their parsing. Batches that read (feedback,
lookups), heartbeats (they end expired leases), trims, and a reservation that does not fit
(an expired lease read the usual way might make room) always go the usual way.

**A lone question's writes, committed where they are.** When the event loop has nothing
else to do (``alone``: its service answers one question) and the backend offers a write that
cannot wait (SQLite: a second connection with busy timeout 0 and no automatic checkpoint,
which only appends to the WAL in the page cache, ``synchronous=NORMAL``), a write that can be
sent whole commits on the loop itself (:meth:`StateStore._run_here`), provided the writer is
idle with nothing queued. Handing it to the writer and back costs two thread wake-ups,
0.2–0.3 ms on every answer's critical path at concurrency 1. Anything that would wait (the
file's write lock held by another process, a batch that must read) goes to the writer as
usual; the writer checkpoints every ``_CHECKPOINT_EVERY`` such commits (a checkpoint syncs
the disk). PostgreSQL never: every write there is a round trip.

**Settlements never block and are never lost.** Releasing money and adding what a call cost
(:meth:`StateStore.settle`) is a delta kept in memory and written with the replica's next
transaction (at the latest ``FLUSH_S`` later, or by the heartbeat); a transaction that fails
leaves the delta to the next one. Until written, the money stays reserved and counted in the
lease at its worst case, so the budget errs only on the safe side.

**A spare wallet.** A replica answering questions back to back keeps one question's wallet
reserved ahead (:meth:`StateStore.take_spare`): its answer's transaction tops the spare up,
the next question takes it with no write. At concurrency 1 a question then costs one commit
(its answer), not two, and its first call waits for none. The spare is money reserved and
counted in flight like any wallet (spent at its worst case if the replica dies); it goes back
once nobody asked for it for ``SPARE_IDLE_S`` (``SPARE_IDLE_UNCAPPED_S`` without a cap, where
it holds no room another could use), or at once when a question needs more than it holds
(released in the transaction that reserves that question's wallet, so the spare never
stands between a question and room in the budget). Under a cap (``max_cost_total``) it is
topped up only while what is left of the budget after it still holds ``SPARE_ROOM`` wallets:
near the end of a budget no replica keeps money aside that another could spend.

**Money never forgotten.** Reservations are held under the replica's **lease** (a
``ccpo_leases`` row with an expiry, renewed by every transaction of the replica and by the
heartbeat): a replica that dies (``kill -9``) stops renewing, and once its lease expires any
replica settles what it held in calls *as spent at the worst case* (the endpoint may have
billed it) and releases the rest. A lease of a process on the same host that no longer exists
is settled at once. A replica that finds its own lease gone (the database was away longer than
the expiry) keeps what it held then apart (``_orphan``): settling it releases nothing more.

**Deadlines.** Every awaited operation has one (``timeout``): past it, or at once while the
database is known to be away (the last transaction failed, or one has hung longer than the
deadline), :class:`StateUnavailable` is raised (``ccpo serve``: a JSON 503
``state_unavailable``) and nothing is spent. The writer keeps probing and the replica recovers
by itself when the database answers again (:meth:`StateStore.health`). An operation whose
caller gave up but which committed anyway is undone (a reservation is released).

**Schema with a version.** Tables are created on first start, with ``schema_version`` in
``ccpo_meta``; a store of a newer version is refused, older ones are converted in place (v1:
the one-process SQLite format ``ccpo.serve-state/v1``; v2: leases without ``idle``; v3:
without ``waiting``). The store
records a fingerprint of the policy artifact and refuses to be used with another policy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.feedback import Counters, KappaBounds, apply_feedback
from ccpo.runtime.state.backends import (
    Backend,
    Busy,
    DuplicateKey,
    Moved,
    StateUnavailable,
    Step,
    Tx,
    open_backend,
    unstorable,
)

log = logging.getLogger("ccpo.serve")

SCHEMA_VERSION = 4  # 1: the one-process SQLite format (tables kv, answers); 2: no leases.idle;
# 3: no leases.waiting
STATE_FORMAT = "ccpo.serve-state"
FLUSH_S = 1.0  # a settlement waits at most this long for a transaction to ride on
SPARE_IDLE_S = 1.0  # a spare wallet nobody took for this long is released (under a cap)
#: ... and without a cap (``max_cost_total``), where a spare holds no room another question
#: could use: at low traffic (a question every few seconds) each question then takes its
#: wallet with no commit on its critical path (a round trip to PostgreSQL, ~1.1 ms here); the
#: cost is a spare counted as spent at its worst case if the replica dies in that time
SPARE_IDLE_UNCAPPED_S = 5.0
SPARE_ROOM = 16  # under a cap, a spare is topped up only if this many wallets fit after it
_TRIM_EVERY = 64  # answers inserted between two trims of the answer table
_WHOLE_MAX = 500  # answer rows in one insert statement
_CHECKPOINT_EVERY = 256  # commits on the caller's thread between two checkpoints by the writer
_SCHEMA_LOCK = 0x63_63_70_6F  # PostgreSQL advisory lock id while creating tables ("ccpo")
_EPS = 1e-12

_DDL = (
    "CREATE TABLE IF NOT EXISTS ccpo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_state (id INTEGER PRIMARY KEY, tracker TEXT NOT NULL,"
    " counters TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_leases (replica TEXT PRIMARY KEY, host TEXT NOT NULL,"
    " pid INTEGER NOT NULL, reserved_usd DOUBLE PRECISION NOT NULL,"
    " inflight_usd DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL,"
    " idle INTEGER NOT NULL DEFAULT 0, waiting INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS ccpo_answers (id TEXT PRIMARY KEY, question TEXT NOT NULL,"
    " answer TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, feedback TEXT, replica TEXT)",
    "CREATE INDEX IF NOT EXISTS ccpo_answers_created ON ccpo_answers (created)",
)

_LEASES = (
    "SELECT replica, host, pid, reserved_usd, inflight_usd, expires, idle, waiting FROM ccpo_leases"
)

T = TypeVar("T")


_TRACKER_FIELDS = tuple(f.name for f in fields(OnlineThreshold))


def tracker_json(t: OnlineThreshold) -> dict[str, Any]:
    """κ's tracker as JSON values (its fields are numbers: no deep copy)."""
    return {f: getattr(t, f) for f in _TRACKER_FIELDS}


def state_texts(tracker: OnlineThreshold, counters: Counters) -> tuple[str, str]:
    """The state row's ``tracker`` and ``counters`` columns, as written."""
    return json.dumps(tracker_json(tracker)), json.dumps(counters.to_json())


def default_replica_id() -> str:
    """``host-pid-random``: unique per process, readable in ``/metrics``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _never() -> bool:
    return False


def _less(x: float, y: float) -> float:
    """x − y, never below 0, and exactly 0 when only rounding is left (sums of floats)."""
    d = x - y
    return d if d > _EPS else 0.0


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's
        return False
    return False


@dataclass
class Lease:
    """This replica's lease as the running transaction sees it: what it holds reserved, the
    part of that counted as spent if it dies (in flight), whether all its questions wait
    for room (``idle``: it will free nothing by itself), and whether one of its admitted
    questions waits for room (``waiting``: questions are admitted nowhere meanwhile)."""

    reserved: float = 0.0
    inflight: float = 0.0
    idle: bool = False
    waiting: bool = False


@dataclass
class Batch:
    """What an operation sees inside the writer's transaction."""

    tx: Tx
    tracker: OnlineThreshold
    counters: Counters
    lease: Lease
    now: float
    orphan: Lease  # what a lost lease of this replica held, not yet settled
    new_lease: bool = True  # this replica has no lease row yet
    lease_ended: bool = False  # its lease row was deleted (a clean stop)
    lease_lost: bool = False  # its lease had expired: what it held is now ``orphan``
    others_busy: bool = False
    others_hold: bool = False
    others_waiting: bool = False
    inserted: set[str] = field(default_factory=set)  # answer ids this transaction inserted
    ahead: bool = False  # computed ahead, to be sent whole: the leases were not read


class _Redo(Exception):
    """An op of a batch computed ahead needs the batch done the usual way (e.g. a budget
    check that fails might pass once the leases have been read: an expired one frees room)."""


_Record = tuple[dict[str, Any], str | None]  # an answer record and its JSON (None: not made)


def answer_rows(replica: str, answers: list[_Record]) -> list[tuple[str, str, str, str]]:
    """The rows of answer records (each with its JSON text, None: made here): id, question,
    the record, the replica."""
    return [(a["id"], a["question"], t or json.dumps(a), replica) for a, t in answers]


def insert_sql(now_sql: str, n: int) -> str:
    """The insert of ``n`` answer rows (:func:`answer_rows`), skipping ids already taken."""
    return (
        "INSERT INTO ccpo_answers (id, question, answer, replica, created) VALUES "
        + ", ".join([f"(?, ?, ?, ?, {now_sql})"] * n)
        + " ON CONFLICT (id) DO NOTHING"
    )


def insert_answers(tx: Tx, now_sql: str, replica: str, answers: list[_Record]) -> list:
    """Send the inserts of answer records (each with its JSON text, None: made here), 500 rows
    a statement, skipping ids already taken; each statement's rows (``.fetchall()``) are the
    ids that went in. Sent before the state row is locked, so that the lock is held for less."""
    sent = []
    for k in range(0, len(answers), _WHOLE_MAX):
        rows = answer_rows(replica, answers[k : k + _WHOLE_MAX])
        sql = insert_sql(now_sql, len(rows)) + " RETURNING id"  # the ids that went in
        sent.append(tx.send(sql, [x for row in rows for x in row]))
    return sent


@dataclass
class _Delta:
    """Settlements and counts not yet written: added to the next transaction."""

    reserved: float = 0.0
    spent: float = 0.0
    inflight: float = 0.0
    rejected: int = 0
    errors: int = 0

    def __bool__(self) -> bool:
        return bool(self.reserved or self.spent or self.inflight or self.rejected or self.errors)


@dataclass(eq=False)
class _Op:
    """One operation for the writer. Its result goes to ``afut`` (an asyncio future of the
    caller's loop: results are handed to a loop once per transaction) or to ``fut`` (a
    thread waiting)."""

    fn: Callable[[Batch], Any]
    read: bool = False  # reads only: no row lock, no lease renewal
    whole: bool = False  # computes on the batch alone (no SQL of its own): may be sent whole
    answer: dict[str, Any] | None = None  # an answer record, inserted before the lock
    text: str | None = None  # the record as JSON (None: json.dumps(answer))
    undo: Callable[[Any], None] | None = None  # after a commit its caller no longer awaited
    fut: concurrent.futures.Future | None = None
    afut: asyncio.Future | None = None
    abandoned: bool = False

    def gone(self) -> bool:
        """The caller stopped waiting (a deadline, a cancellation)."""
        return self.abandoned or (self.afut is not None and self.afut.done())


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
    for op, ok, value in items:
        if ok and op.undo is not None:
            op.undo(value)


class StateStore:
    """The serve state on a backend; ``location``: None (in memory), a SQLite path or a
    PostgreSQL URL. ``expiry``: seconds a replica's lease (and so its reservations) outlives
    its last sign of life. ``timeout``: the deadline of every operation (seconds)."""

    def __init__(
        self,
        location: str | None,
        fingerprint: str,
        tracker: OnlineThreshold,
        max_records: int = 100_000,
        expiry: float = 120.0,
        replica: str | None = None,
        timeout: float = 2.0,
    ) -> None:
        self.timeout = float(timeout)
        self.db: Backend = open_backend(location, timeout=self.timeout)
        self.where = self.db.where
        self.max_records = max_records
        self.expiry = float(expiry)
        self.replica = replica or default_replica_id()
        self.host = socket.gethostname()
        self._inserted = 0
        self._lease_lost = False
        self._mirror = Lease()  # the lease as this replica's last commit left it
        self._orphan = Lease()  # what a lost lease held (counted as spent when it expired)
        self.others_busy = False  # another replica holds money it will free by itself
        self.others_hold = False  # another replica holds money (busy, or its questions wait)
        self.others_waiting = False  # an admitted question of another replica waits for room
        # whether an admitted question of this replica waits for room (its ledger sets it):
        # written to its lease with every write, and a change of it makes one (waiting_changed)
        self.waiting: Callable[[], bool] = _never
        # whether the event loop awaiting this store has nothing else to do (a lone question;
        # its service sets it): its writes sent whole may then commit on it (_run_here)
        self.alone: Callable[[], bool] = _never
        self._lease_dirty = False
        self.commits = 0  # transactions committed by the writer (benchmarks, tests)
        self.commits_whole = 0  # of them sent whole (one round trip: _write_whole)
        self.commits_moved = 0  # sent whole, found the state moved, redone
        self.commits_here = 0  # of them run on the caller's thread (_run_here)
        self._batch = threading.Lock()  # held by whoever runs a transaction (writer or here)
        self._here_n = 0  # commits here since the writer's last checkpoint
        self._checkpoint_due = False
        self._texts: tuple[str, str] | None = None  # the state row as last read or written
        self._solo = False  # the last transaction found the row as this replica left it
        self._delta = _Delta()
        # the spare wallet: reserved and counted in flight, durably, for this
        # replica's next question; topped up to ``_spare_want`` by write transactions
        self._spare = 0.0
        self._spare_want = 0.0
        self._spare_cap: float | None = None  # the total budget the questions asking run under
        self._spare_taken: float | None = None  # when a question last asked for it
        self._spare_streak = False  # the last two asked within SPARE_IDLE_S: worth topping up
        self._no_spare = False  # closing: no spare any more
        self._queue: list[_Op] = []
        self._cond = threading.Condition()
        self._flush_at: float | None = None
        self._busy_since: float | None = None  # a transaction has been running since
        self._down: str | None = None  # why the last transaction failed (None: it did not)
        self._closing = False
        try:
            self.restored = self._open(fingerprint, tracker)
        except BaseException:
            self.db.close()
            raise
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="ccpo-state", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ schema
    def _open(self, fingerprint: str, tracker: OnlineThreshold) -> bool:
        with self.db.write() as tx:
            if self.db.kind == "postgresql":  # two replicas starting at once: one creates
                tx.one("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            v1 = self._read_v1(tx)
            for stmt in _DDL:
                tx.run(stmt)
            meta = dict(tx.all("SELECT key, value FROM ccpo_meta"))
            if not meta and v1 is not None:
                meta = self._migrate_v1(tx, v1, fingerprint)
            if meta:
                version = int(meta.get("schema_version", "0"))
                if version > SCHEMA_VERSION:
                    raise CCPOError(
                        f"{self.where}: the state has schema version {version}, newer than "
                        f"this ccpo's ({SCHEMA_VERSION}); upgrade ccpo on this replica"
                    )
                if meta.get("format") != STATE_FORMAT:
                    raise CCPOError(f"{self.where}: not a ccpo serve state")
                if meta.get("fingerprint") != fingerprint:
                    raise CCPOError(
                        f"{self.where}: this state belongs to another policy artifact; use "
                        "another state (or delete it to start afresh)"
                    )
                if version in (2, 3):  # leases learn whether their replica waits for room
                    for col in ("idle", "waiting")[version - 2 :]:
                        add = f"ALTER TABLE ccpo_leases ADD COLUMN {col} INTEGER NOT NULL"
                        tx.run(add + " DEFAULT 0")
                    tx.run(
                        "UPDATE ccpo_meta SET value = ? WHERE key = 'schema_version'",
                        (str(SCHEMA_VERSION),),
                    )
                restored = True
            else:
                self._create(tx, fingerprint, tracker, Counters())
                restored = False
        self._run_batch([], beat=True)
        return restored

    @staticmethod
    def _create(
        tx: Tx, fingerprint: str, tracker: OnlineThreshold, counters: Counters
    ) -> dict[str, str]:
        """Write the meta rows (schema version, format, the policy's fingerprint) and the one
        state row of a new store; returns the meta rows."""
        meta = {
            "schema_version": str(SCHEMA_VERSION),
            "format": STATE_FORMAT,
            "fingerprint": fingerprint,
        }
        for k, v in meta.items():
            tx.run("INSERT INTO ccpo_meta (key, value) VALUES (?, ?)", (k, v))
        tx.run(
            "INSERT INTO ccpo_state (id, tracker, counters) VALUES (1, ?, ?)",
            state_texts(tracker, counters),
        )
        return meta

    def _read_v1(self, tx: Tx) -> dict[str, str] | None:
        """The key/value table of a one-process SQLite state file (format v1), if this is one."""
        if self.db.kind != "sqlite" or not tx.one(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kv'"
        ):
            return None
        return dict(tx.all("SELECT key, value FROM kv"))

    def _migrate_v1(self, tx: Tx, kv: dict[str, str], fingerprint: str) -> dict[str, str]:
        """Convert a v1 file in place: its tracker, counters and answers carry over; what it
        had in flight when it stopped counts as spent."""
        if kv.get("format") != "ccpo.serve-state/v1":
            raise CCPOError(f"{self.where}: not a ccpo serve state file")
        if kv.get("fingerprint") != fingerprint:
            raise CCPOError(
                f"{self.where}: this state file belongs to another policy artifact; use "
                "another state (or delete it to start afresh)"
            )
        tracker = OnlineThreshold(**json.loads(kv["tracker"]))
        counters = Counters.from_json(json.loads(kv["counters"]))
        counters.spent_usd += counters.inflight_usd
        counters.inflight_usd = counters.reserved_usd = 0.0
        meta = self._create(tx, fingerprint, tracker, counters)
        tx.run(
            "INSERT INTO ccpo_answers (id, question, answer, created, feedback) "
            "SELECT id, question, answer, created, feedback FROM answers"
        )
        tx.run("DROP TABLE answers")
        tx.run("DROP TABLE kv")
        log.warning("%s: converted from the one-process state format (v1)", self.where)
        return meta

    def _parse(self, row: tuple[Any, ...] | None) -> tuple[OnlineThreshold, Counters]:
        """κ's tracker and the counters of the state row (tracker, counters, ...)."""
        if row is None:
            raise CCPOError(f"{self.where}: the state row is missing; was it cleared?")
        return OnlineThreshold(**json.loads(row[0])), Counters.from_json(json.loads(row[1]))

    # ------------------------------------------------------------------ the writer
    def _submit(self, op: _Op) -> _Op:
        """Queue ``op`` for the writer's next transaction; :class:`StateUnavailable` at once
        while the database is known to be away (nothing queued)."""
        why = self.unavailable()
        if why is not None:
            raise StateUnavailable(f"the state database {self.where} is unavailable: {why}")
        with self._cond:
            if self._closing:
                raise StateUnavailable("the state store is closing (the server is stopping)")
            self._queue.append(op)
            self._cond.notify()
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
        return self._submit(op)

    def _call(
        self, fn: Callable[[Batch], T], read: bool = False, undo: Any = None, whole: bool = False
    ) -> T:
        """Run ``fn`` in the writer's next transaction and wait for its commit (any thread
        but the writer's and no event loop's)."""
        return self._wait(self._submit_op(_Op(fn, read=read, undo=undo, whole=whole)))

    def _wait(self, op: _Op) -> Any:
        assert op.fut is not None
        try:
            return op.fut.result(self.timeout)
        except concurrent.futures.TimeoutError:
            with self._cond:  # the writer hands out thread results under this lock too
                if op.fut.done():
                    return op.fut.result()
                op.abandoned = True  # skipped if not taken yet, else undone after its commit
            raise self._late() from None

    async def _acall(
        self, fn: Callable[[Batch], T], read: bool = False, undo: Any = None, whole: bool = False
    ) -> T:
        """:meth:`_call` for the event loop: awaits the commit without blocking the loop. A
        caller that stops waiting (deadline, cancellation) leaves its future done: the writer
        skips the operation if it has not taken it, else its result is undone on delivery."""
        return await self._arun(_Op(fn, read=read, undo=undo, whole=whole))

    async def _arun(self, op: _Op) -> Any:
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
        assert op.afut is not None
        try:  # awaited directly (wait_for would wrap it: two more turns of the loop)
            async with asyncio.timeout(self.timeout):  # on expiry op.afut is cancelled: gone
                return await op.afut
        except TimeoutError:
            raise self._late() from None

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
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._stop.is_set():
                        return
                    if self._queue or (self._closing and self._delta):
                        break
                    if self._flush_at is not None and now >= self._flush_at:
                        break
                    if now >= next_beat or (self._down is not None and now >= backoff):
                        break
                    wake = next_beat if self._down is None else backoff
                    if self._spare > 0 or self._spare_want > 0:
                        idle_at = (self._spare_taken or 0.0) + self._spare_idle()
                        if now >= idle_at:
                            self._drop_spare()
                            continue
                        wake = min(wake, idle_at)
                    wake = min(wake, now + FLUSH_S / 2, self._flush_at or wake)
                    self._cond.wait(max(0.0, wake - now))
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
                err = StateUnavailable(f"the state database {self.where} failed: {why}")
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
        (:meth:`_transact`)."""
        with self._batch:
            delta, dirty = self._take_pending()
            writes = beat or dirty or bool(delta) or any(not op.read for op in ops)
            records = [(op.answer, op.text) for op in ops if op.answer is not None]
            self._busy_since = time.monotonic()
            try:
                done = None
                if writes and not beat and self._whole_ready(ops, len(records)):
                    done = self._write_whole(ops, records, delta)
                if done is None:
                    done = self._transact(ops, records, delta, writes, beat)
            except BaseException:
                self._give_back(delta, dirty)  # written by none: to the next transaction
                raise
            finally:
                self._busy_since = None
            results = self._committed(done, writes)
        self._hand_out(ops, results)

    def _run_here(self, op: _Op) -> tuple[bool, Any] | None:
        """Run ``op`` in a transaction of its own on the calling thread, an event loop with
        nothing else to do (a lone question), when that cannot wait: the backend offers it
        (SQLite: :meth:`Backend.write_whole` with ``wait=False`` only appends to the WAL in the
        page cache, or fails at once; in memory it tries the one connection's lock without
        waiting), the writer is idle with nothing queued, and
        the batch can be sent whole (:meth:`_whole_ready`). Saves the two thread wake-ups of
        a hand-over to the writer and back (0.2–0.3 ms at concurrency 1, on every answer's
        critical path). Its result, as :meth:`_run_ops` gives it; None: nothing was done (the
        caller queues ``op`` for the writer)."""
        if not self.db.here or self._down is not None or not self._batch.acquire(False):
            return None
        try:
            with self._cond:
                if self._queue or self._closing:
                    return None
            records = [(op.answer, op.text)] if op.answer is not None else []
            if not self._whole_ready([op], len(records)):
                return None
            delta, dirty = self._take_pending()
            try:
                done = self._write_whole([op], records, delta, wait=False)
            except Exception as e:  # the writer meets it again, and reports it
                log.debug("state %s: a write here failed (%s); handed to the writer", self.where, e)
                done = None
            if done is None:
                self._give_back(delta, dirty)
                return None
            result = self._committed(done, writes=True)[0]
            self.commits_here += 1
            with self._cond:
                if not self._delta and not self._lease_dirty:
                    self._flush_at = None  # what it was set for went with this commit
                self._here_n += 1
                if self._here_n >= _CHECKPOINT_EVERY:
                    self._here_n, self._checkpoint_due = 0, True
                    self._lazy()
            return result
        finally:
            self._batch.release()

    def _take_pending(self) -> tuple[_Delta, bool]:
        """The settlements and counts not yet written, and whether the lease must be."""
        with self._cond:
            delta, self._delta = self._delta, _Delta()
            dirty, self._lease_dirty = self._lease_dirty, False
        return delta, dirty

    def _give_back(self, delta: _Delta, dirty: bool) -> None:
        """What :meth:`_take_pending` took, written by no transaction: to the next one."""
        with self._cond:
            d = self._delta
            d.reserved += delta.reserved
            d.spent += delta.spent
            d.inflight += delta.inflight
            d.rejected += delta.rejected
            d.errors += delta.errors
            self._lease_dirty |= dirty

    def _committed(
        self, done: tuple[Batch, list[tuple[bool, Any]], float, tuple[str, str]], writes: bool
    ) -> list[tuple[bool, Any]]:
        """After a commit: what this replica knows of the rows (its lease, the others', the
        state row's text, the spare's top-up); the ops' results."""
        b, results, top, self._texts = done
        if writes:
            self.commits += 1
            self._mirror, self._orphan = b.lease, b.orphan
            self.others_busy, self.others_hold = b.others_busy, b.others_hold
            self.others_waiting = b.others_waiting
            with self._cond:
                if b.lease_lost:  # the spare was in the lease that ended: counted as spent
                    gone, self._spare = self._spare, 0.0
                    self._orphan = Lease(
                        _less(self._orphan.reserved, gone), _less(self._orphan.inflight, gone)
                    )
                self._spare += top
            if b.new_lease:
                self._lease_lost = False
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
                f"SELECT tracker, counters, {self.db.now} FROM ccpo_state WHERE id = 1{lock}"
            )
            leases = tx.send(_LEASES) if writes else None
            went_in = {r[0] for rows in inserts for r in rows.fetchall()}
            row = state.fetchone()
            tracker, c = self._parse(row)
            assert row is not None
            texts = (row[0], row[1])
            self._solo = texts == self._texts  # no other replica wrote since this one did
            b = Batch(tx, tracker, c, Lease(), float(row[2]), self._orphan, inserted=went_in)
            if leases is not None:
                self._leases(b, leases.fetchall(), beat)
                self._apply(b, delta)
            added = len(went_in)  # (the ops take their ids out of it)
            results = self._run_ops(ops, b)
            if added:
                self._trim(tx, added)
            if writes:
                top = self._top_up(b)
                values = self._lease_values(b.lease)
                if b.new_lease:
                    tx.run(
                        "INSERT INTO ccpo_leases (reserved_usd, inflight_usd, expires, idle, "
                        "waiting, replica, host, pid) VALUES "
                        f"(?, ?, {self.db.now} + ?, ?, ?, ?, ?, ?)",
                        (*values, self.replica, self.host, os.getpid()),
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
        if not self._solo or self.others_hold or self._lease_lost:
            return False
        return n <= _WHOLE_MAX and not self._trim_due(n) and all(op.whole for op in ops)

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
        old, m = self._texts, self._mirror
        assert old is not None
        tracker, c = self._parse(old)
        now = self.db.now
        b = Batch(
            tx=None,  # type: ignore[arg-type]  # (ops sent whole run no SQL of their own)
            tracker=tracker,
            counters=c,
            lease=Lease(m.reserved, m.inflight, m.idle, m.waiting),
            now=math.nan,  # (only the leases' read needs the database's clock)
            orphan=self._orphan,
            new_lease=False,
            others_busy=self.others_busy,
            others_hold=self.others_hold,
            others_waiting=self.others_waiting,
            inserted=set(ids),
            ahead=True,
        )
        try:
            self._apply(b, delta)
            results = self._run_ops(ops, b)
            top = self._top_up(b)
            texts = state_texts(b.tracker, b.counters)
            steps: list[Step] = []
            if records:
                rows = answer_rows(self.replica, records)
                steps.append((insert_sql(now, len(rows)), [x for r in rows for x in r], len(ids)))
            steps.append((
                "UPDATE ccpo_state SET tracker = ?, counters = ? WHERE id = 1 AND tracker = ? "
                "AND counters = ?", (*texts, *old), 1,
            ))  # fmt: skip
            steps.append((
                f"UPDATE ccpo_leases SET reserved_usd = ?, inflight_usd = ?, expires = {now} + ?,"
                f" idle = ?, waiting = ? WHERE replica = ? AND expires >= {now} AND "
                "reserved_usd = ? AND inflight_usd = ?",
                (*self._lease_values(b.lease), self.replica, m.reserved, m.inflight), 1,
            ))  # fmt: skip
            self.db.write_whole(steps, wait=wait)
        except (_Redo, Busy):
            return None
        except Moved:
            self._solo = False
            self.commits_moved += 1
            return None
        self._inserted += len(ids)
        self.commits_whole += 1
        return b, results, top, texts

    def _lease_values(self, lease: Lease) -> tuple[float, float, float, int, int]:
        """This replica's lease as both write paths write it (reserved, in flight, the expiry
        to add to the database's clock, idle, waiting), ``waiting`` taken now."""
        lease.waiting = self.waiting()
        return lease.reserved, lease.inflight, self.expiry, int(lease.idle), int(lease.waiting)

    @staticmethod
    def _run_ops(ops: list[_Op], b: Batch) -> list[tuple[bool, Any]]:
        results: list[tuple[bool, Any]] = []
        for op in ops:
            try:
                results.append((True, op.fn(b)))
            except CCPOError as e:  # this operation's own refusal (a duplicate id, ...)
                results.append((False, e))
        return results

    def _hand_out(self, ops: list[_Op], results: list[tuple[bool, Any]]) -> None:
        """Results to their callers: one hand-over per event loop, thread waiters directly."""
        loops: dict[asyncio.AbstractEventLoop, list[tuple[_Op, bool, Any]]] = {}
        with self._cond:  # under the lock a thread giving up takes (see _call)
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

    # ------------------------------------------------------------------ leases
    def _leases(self, b: Batch, rows: list[tuple[Any, ...]], beat: bool) -> None:
        """Every lease in one read: expired ones (and, on a heartbeat, those of dead processes
        of this host) end, their calls counted as spent at the worst case; this replica's
        becomes ``b.lease`` (a new one if it has none); ``b.others_busy``: another replica
        holds money and is not waiting for room; ``b.others_hold``: another holds money;
        ``b.others_waiting``: an admitted question of another waits for room."""
        busy = hold = waits = False
        for replica, host, pid, reserved, inflight, expires, idle, waiting in rows:
            reserved, inflight = float(reserved), float(inflight)
            mine = replica == self.replica
            dead = float(expires) < b.now or (
                beat and not mine and host == self.host and _process_gone(int(pid))
            )
            if dead:
                self._release(b, replica, reserved, inflight)
                self._lease_lost |= mine
            elif mine:
                b.lease = Lease(reserved, inflight, bool(idle), bool(waiting))
                b.new_lease = False
            else:
                waits = waits or bool(waiting)
                if reserved > 0:
                    hold = True
                    busy = busy or not idle
        b.others_busy, b.others_hold, b.others_waiting = busy, hold, waits
        if b.new_lease:
            held = self._mirror
            if self._lease_lost or held.reserved > 0 or held.inflight > 0:
                log.warning(
                    "replica %s: its lease had expired (no transaction for %.0f s); what it "
                    "held ($%.6f) was counted as spent",
                    self.replica,
                    self.expiry,
                    held.reserved,
                )
                b.orphan = Lease(
                    b.orphan.reserved + held.reserved, b.orphan.inflight + held.inflight
                )
                b.lease_lost = True

    @staticmethod
    def _release(b: Batch, replica: str, reserved: float, inflight: float) -> None:
        """A lease is over: what it held in calls is spent (at the worst case), the rest is
        free again."""
        c = b.counters
        c.spent_usd += inflight
        c.inflight_usd = _less(c.inflight_usd, inflight)
        c.reserved_usd = _less(c.reserved_usd, reserved)
        b.tx.run("DELETE FROM ccpo_leases WHERE replica = ?", (replica,))
        if inflight > 0 or reserved > 0:
            log.warning(
                "replica %s is gone: $%.6f it had in calls counted as spent, $%.6f it held "
                "for questions released",
                replica,
                inflight,
                max(0.0, reserved - inflight),
            )

    @staticmethod
    def _apply(b: Batch, d: _Delta) -> None:
        """Write pending settlements and counts: release ``d.reserved`` (``d.inflight`` of it
        counted in flight) and add ``d.spent``. What a lost lease held is released first,
        from what this replica kept apart (it left the counters when the lease expired)."""
        c, lease, o = b.counters, b.lease, b.orphan
        c.rejected += d.rejected
        c.errors += d.errors
        c.spent_usd += d.spent
        r_old, i_old = min(d.reserved, o.reserved), min(d.inflight, o.inflight)
        b.orphan = Lease(_less(o.reserved, r_old), _less(o.inflight, i_old))
        r, i = (
            min(_less(d.reserved, r_old), lease.reserved),
            min(_less(d.inflight, i_old), lease.inflight),
        )
        c.reserved_usd = _less(c.reserved_usd, r)
        c.inflight_usd = _less(c.inflight_usd, i)
        lease.reserved, lease.inflight = _less(lease.reserved, r), _less(lease.inflight, i)

    # ------------------------------------------------------------------ money
    def _reserve_op(
        self,
        usd: float,
        cap: float | None,
        inflight: float,
        idle: bool | Callable[[], bool],
        admission: bool = False,
    ) -> tuple[Callable[[Batch], bool], Callable[[bool], None]]:
        def fn(b: Batch) -> bool:
            c = b.counters
            behind = admission and cap is not None and b.others_waiting
            if behind or (
                cap is not None and c.spent_usd + c.reserved_usd + usd > cap * (1 + _EPS)
            ):
                if b.ahead:  # the leases, read by the usual way, may free room (one expired,
                    raise _Redo()  # or the question waiting elsewhere got its room)
                b.lease.idle = idle() if callable(idle) else idle
                return False
            c.reserved_usd += usd
            c.inflight_usd += inflight
            b.lease.reserved += usd
            b.lease.inflight += inflight
            b.lease.idle = False
            return True

        def undo(ok: bool) -> None:
            if ok:
                self.settle(usd, 0.0, inflight)

        return fn, undo

    def reserve(
        self,
        usd: float,
        cap: float | None,
        inflight: float = 0.0,
        idle: bool | Callable[[], bool] = False,
        admission: bool = False,
    ) -> bool:
        """Reserve ``usd`` under the total budget ``cap`` (None: no cap) if spent + reserved
        + ``usd`` ≤ ``cap`` over all replicas, ``inflight`` of it counted as spent should this
        replica die before settling it; False (nothing reserved) if it does not fit, then
        ``idle`` (or its value when the transaction runs) says whether every question of this
        replica waits for room. ``admission``: a question's wallet, which under a cap gives
        way (False) while an admitted question of another replica waits for room (a lease's
        ``waiting``). Durable when it returns; atomic across replicas."""
        fn, undo = self._reserve_op(usd, cap, inflight, idle, admission)
        return self._call(fn, undo=undo, whole=True)

    async def areserve(
        self,
        usd: float,
        cap: float | None,
        inflight: float = 0.0,
        idle: bool | Callable[[], bool] = False,
        admission: bool = False,
    ) -> bool:
        """:meth:`reserve` without blocking the event loop."""
        fn, undo = self._reserve_op(usd, cap, inflight, idle, admission)
        return await self._acall(fn, undo=undo, whole=True)

    def settle(self, reserved: float, spent: float, inflight: float = 0.0) -> None:
        """Release ``reserved`` (``inflight`` of it counted in flight) and add ``spent``:
        written with this replica's next transaction (within ``FLUSH_S``), never blocking;
        retried until written while the replica lives (until then the money stays reserved)."""
        with self._cond:
            d = self._delta
            d.reserved += reserved
            d.spent += spent
            d.inflight += inflight
            self._lazy()

    def _lazy(self) -> None:
        """Have the writer write the delta within ``FLUSH_S``. Without waking it: waking a
        thread costs the event loop a context switch (0.2 ms measured on a busy 2-core
        machine, on every question's critical path at concurrency 1); an idle writer looks
        every ``FLUSH_S / 2`` instead, and the next transaction takes the delta anyway."""
        if self._flush_at is None:
            self._flush_at = time.monotonic() + FLUSH_S / 2

    # ------------------------------------------------------------------ the spare wallet
    def take_spare(self, usd: float, cap: float | None = None) -> bool:
        """Take ``usd`` from the spare wallet, money reserved and counted in flight by an
        earlier transaction of this replica (so durable), with no write; False if it holds
        less (then what it holds is released with the next transaction, the one that
        reserves this question's wallet). Questions asked back to back (two within
        :meth:`_spare_idle`) have the next write transaction top it up to their wallet's size
        (under the total budget ``cap``, only while ``SPARE_ROOM`` wallets still fit after
        it), so at concurrency 1 a question costs one commit (its answer) instead of two; the
        spare goes back (one write) once nobody asked for it for that long."""
        now = time.monotonic()
        with self._cond:
            if self._no_spare:
                return False
            last, self._spare_taken = self._spare_taken, now
            self._spare_cap = cap
            self._spare_streak = last is not None and now - last < self._spare_idle()
            if self._spare_streak:
                self._spare_want = max(self._spare_want, usd)
            if self._spare + _EPS >= usd and usd > 0:
                self._spare = _less(self._spare, usd)
                return True
            if self._spare > 0:  # too small for this question: it must not hold room back
                self._release_spare()
            return False

    def _spare_idle(self) -> float:
        """How long the spare waits unasked before it goes back: ``SPARE_IDLE_S`` under a
        cap (the last question's), ``SPARE_IDLE_UNCAPPED_S`` without. Under ``_cond``."""
        return SPARE_IDLE_S if self._spare_cap is not None else SPARE_IDLE_UNCAPPED_S

    def _top_up(self, b: Batch) -> float:
        """Inside a write transaction: reserve what the spare lacks (all of it counted in
        flight); the amount, added to the spare once committed."""
        with self._cond:
            if not self._spare_streak or self._no_spare:
                return 0.0
            top = _less(self._spare_want, self._spare)
            cap, want = self._spare_cap, self._spare_want
        c = b.counters
        if cap is not None and top > 0:
            left = cap * (1 + _EPS) - (c.spent_usd + c.reserved_usd + top)
            if left < SPARE_ROOM * want:
                return 0.0
        if top > 0:
            c.reserved_usd += top
            c.inflight_usd += top
            b.lease.reserved += top
            b.lease.inflight += top
        return top

    def _drop_spare(self) -> None:
        """Release the spare (nobody asked for it lately, or the store closes): a settlement
        written with the next transaction, at once. Under ``_cond``."""
        self._spare_want = 0.0
        self._spare_streak = False
        if self._spare > 0:
            self._release_spare()
            self._flush_at = time.monotonic()
            self._cond.notify()

    def _release_spare(self) -> None:
        """The spare back to the budget: a settlement written with the next transaction.
        Under ``_cond``."""
        spare, self._spare = self._spare, 0.0
        d = self._delta
        d.reserved += spare
        d.inflight += spare

    def waiting_changed(self) -> None:
        """Whether a question of this replica waits for room (:attr:`waiting`) changed: the
        lease says so with the next transaction, within ``FLUSH_S`` (never blocking)."""
        with self._cond:
            self._lease_dirty = True
            self._lazy()

    def pending(self) -> bool:
        """Settlements wait to be written (money this replica is about to free)."""
        with self._cond:
            return self._delta.reserved > 0

    def flush(self) -> None:
        """Write what is pending now (and wait for it)."""
        self._call(lambda b: None, whole=True)

    # ------------------------------------------------------------------ reads
    def _lookup(self, qid: str) -> Callable[[Batch], tuple[str, dict[str, Any], str | None] | None]:
        def fn(b: Batch) -> tuple[str, dict[str, Any], str | None] | None:
            row = b.tx.one(
                "SELECT question, answer, feedback FROM ccpo_answers WHERE id = ?", (qid,)
            )
            return None if row is None else (row[0], json.loads(row[1]), row[2])

        return fn

    def lookup(self, qid: str) -> tuple[str, dict[str, Any], str | None] | None:
        """(question, answer-set JSON, feedback JSON or None) of a served id."""
        return self._call(self._lookup(qid), read=True)

    async def alookup(self, qid: str) -> tuple[str, dict[str, Any], str | None] | None:
        return await self._acall(self._lookup(qid), read=True)

    def refresh(self) -> tuple[OnlineThreshold, Counters]:
        """κ's tracker and the counters as every replica sees them now (plus this replica's
        refused requests not yet written)."""
        self._call(lambda b: None, read=True)
        return self.tracker, self.counters

    async def arefresh(self) -> tuple[OnlineThreshold, Counters]:
        await self._acall(lambda b: None, read=True)
        return self.tracker, self.counters

    @property
    def kappa(self) -> float:
        return self.tracker.kappa

    def leases(self) -> list[tuple[str, float, float, float]]:
        """(replica, reserved, in flight, expires) of every lease."""

        def fn(b: Batch) -> list[tuple[str, float, float, float]]:
            return [
                (r, float(a), float(x), float(e))
                for r, a, x, e in b.tx.all(
                    "SELECT replica, reserved_usd, inflight_usd, expires FROM ccpo_leases"
                )
            ]

        return self._call(fn, read=True)

    def health(self) -> str | None:
        """None while the database answers; else why not (``/healthz`` says degraded)."""
        return self.unavailable()

    # ------------------------------------------------------------------ writes
    def update_tracker(self, change: Callable[[OnlineThreshold], None]) -> OnlineThreshold:
        """Apply an operator's setting to the stored tracker (a new step size, a narrower
        band), in one transaction."""

        def fn(b: Batch) -> OnlineThreshold:
            change(b.tracker)
            return b.tracker

        return self._call(fn)

    def _answer_op(self, answer: dict[str, Any], text: str | None = None) -> _Op:
        why = unstorable(answer.get("question", "")) or unstorable(answer.get("id", ""))
        if why:
            raise CCPOError(f"the answer cannot be stored: {why}")

        def fn(b: Batch) -> None:
            if answer["id"] not in b.inserted:  # taken before, or by an earlier op here
                raise DuplicateKey(f"answer id '{answer['id']}' is taken")
            b.inserted.discard(answer["id"])
            c = b.counters
            c.requests += 1
            c.cost_usd += float(answer["cost_usd"])
            c.set_size_sum += len(answer["answers"])
            c.rounds_sum += int(answer["rounds"])

        return _Op(fn, answer=answer, text=text, whole=True)

    def _trim_due(self, added: int) -> bool:
        """Inserting ``added`` more answers reaches the next trim."""
        return self._inserted // _TRIM_EVERY != (self._inserted + added) // _TRIM_EVERY

    def _trim(self, tx: Tx, added: int) -> None:
        """Every ``_TRIM_EVERY`` answers, the oldest beyond ``max_records`` go."""
        due = self._trim_due(added)
        self._inserted += added
        if not due:
            return
        n = int(tx.one("SELECT COUNT(*) FROM ccpo_answers")[0])  # type: ignore[index]
        if n > self.max_records:
            tx.run(
                "DELETE FROM ccpo_answers WHERE id IN (SELECT id FROM ccpo_answers "
                "ORDER BY created ASC LIMIT ?)",
                (n - self.max_records,),
            )

    def record_answer(self, answer: dict[str, Any]) -> None:
        """Store an answered question and count it, durably when it returns;
        :class:`DuplicateKey` if its id is taken."""
        self._wait(self._submit_op(self._answer_op(answer)))

    async def arecord_answer(self, answer: dict[str, Any], text: str | None = None) -> None:
        """:meth:`record_answer` without blocking the event loop. ``text``: the record as JSON
        when the caller has it already (``answer`` then needs only the fields counted: id,
        question, cost_usd, answers, rounds)."""
        await self._arun(self._answer_op(answer, text))

    def count_rejected(self) -> None:
        """Count a request refused before any work: in memory only (written with this
        replica's next transaction), so that a flood of junk costs no database writes."""
        with self._cond:
            self._delta.rejected += 1

    def record_error(self) -> None:
        """Count a failed request (written with the next transaction, within ``FLUSH_S``)."""
        with self._cond:
            self._delta.errors += 1
            self._lazy()

    def _feedback_op(
        self,
        qid: str,
        covered: bool,
        feedback: dict[str, Any],
        adapt: bool,
        max_step: int | None,
        bounds: KappaBounds | None,
    ) -> Callable[[Batch], tuple[float, int, int]]:
        from ccpo.runtime.feedback import FeedbackError

        def fn(b: Batch) -> tuple[float, int, int]:
            row = b.tx.one(f"SELECT feedback FROM ccpo_answers WHERE id = ?{self.db.lock}", (qid,))
            if row is None:
                raise FeedbackError(404, f"no answered question with id '{qid}' (or expired)")
            if row[0] is not None:
                raise FeedbackError(409, f"feedback for id '{qid}' was already given")
            b.tx.run(
                "UPDATE ccpo_answers SET feedback = ? WHERE id = ?", (json.dumps(feedback), qid)
            )
            c = b.counters
            apply_feedback(b.tracker, c, covered, adapt, max_step, bounds or KappaBounds())
            return b.tracker.kappa, c.feedback, c.covered

        return fn

    def record_feedback(
        self,
        qid: str,
        covered: bool,
        feedback: dict[str, Any],
        adapt: bool,
        max_step: int | None,
        bounds: KappaBounds | None = None,
    ) -> float:
        """Apply one feedback, exactly once over all replicas: coverage counters and (if
        ``adapt``) one κ step within ``bounds`` (:func:`~ccpo.runtime.feedback.
        apply_feedback`). A second feedback for the same id is refused (409) and changes
        nothing. Returns κ."""
        return self._call(self._feedback_op(qid, covered, feedback, adapt, max_step, bounds))[0]

    async def arecord_feedback(
        self,
        qid: str,
        covered: bool,
        feedback: dict[str, Any],
        adapt: bool,
        max_step: int | None,
        bounds: KappaBounds | None = None,
    ) -> tuple[float, int, int]:
        """:meth:`record_feedback` without blocking the event loop; returns κ, and the
        feedbacks and covered ones counted once this one was (other operations of the same
        transaction may follow it)."""
        return await self._acall(self._feedback_op(qid, covered, feedback, adapt, max_step, bounds))

    def close(self) -> None:
        """Write what is pending (within the deadline), end this replica's lease if it holds
        nothing, and stop the writer. A lease still holding money (its settlements could not
        be written) is left to expire: its calls then count as spent at their worst case."""

        def end(b: Batch) -> float:
            if b.lease.reserved <= 0 and b.lease.inflight <= 0:
                if not b.new_lease:
                    b.tx.run("DELETE FROM ccpo_leases WHERE replica = ?", (self.replica,))
                b.lease_ended, b.new_lease = True, False
            return b.lease.reserved

        with self._cond:
            self._no_spare = True
            self._drop_spare()
        try:
            held = self._call(end)
        except Exception as e:  # closing: the database may be gone already
            log.warning("closing the state %s: %s", self.where, e)
            held = self._mirror.reserved + self._orphan.reserved
        with self._cond:
            self._closing = True
            self._stop.set()
            self._cond.notify_all()
        self._writer.join(timeout=self.timeout + 1)
        if held:
            log.warning(
                "replica %s stops holding $%.6f it could not settle: its lease counts it as "
                "spent when it expires",
                self.replica,
                held,
            )
        self.db.close()


__all__ = ["SCHEMA_VERSION", "DuplicateKey", "StateStore", "StateUnavailable"]
