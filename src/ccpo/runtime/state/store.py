"""The state of ``ccpo serve``, one store for every replica: the total budget's money (spent,
reserved, in flight), κ with its online tracker, the counters, and the answer sets awaiting
feedback. The backend is an embedded SQLite file or a shared PostgreSQL database
(:mod:`ccpo.runtime.state.backends`); the logic here is the same for both.

**One lock, at one row.** Every write is one transaction that first locks the single row of
``ccpo_state`` (``SELECT ... FOR UPDATE`` in PostgreSQL; ``BEGIN IMMEDIATE`` in SQLite), then
reads the money, κ and counters, changes them and writes them back. All writes of all replicas
are therefore serialised at that row: a budget check and its reservation are one atomic step
(no check-then-increment race), a feedback moves κ exactly once, a repeated feedback id finds
the first one's record. Why a row lock rather than an advisory lock or counters kept apart:
the row lock is released by commit or by the death of the connection, needs no key to agree
on, and makes "the state" one consistent read; the price is that writes do not run in
parallel, which at a few writes per LLM call (milliseconds each) is far from the bottleneck
(measured in ``benchmarks/bench_replicas.py``).

**Money never forgotten.** A call's worst case is reserved (in the database) before the call
is sent, and settled with its real cost after (:class:`~ccpo.runtime.state.ledger.
StoreLedger`). Reservations are held under the replica's **lease** (a ``ccpo_leases`` row with
an expiry, renewed by every write of the replica and by a heartbeat thread): a replica that
dies (``kill -9``) stops renewing, and once its lease expires any replica settles what it
held in calls *as spent at the worst case* (the endpoint may have billed it) and releases
the rest (money held for questions not yet calling). A lease of a process on the same host
that no longer exists is settled at once. Nothing is held forever.

**Schema with a version.** Tables are created on first start, with ``schema_version`` in
``ccpo_meta``; a store of a newer version is refused, a SQLite file of the older one-process
format (``ccpo.serve-state/v1``) is converted in place. The store records a fingerprint of
the policy artifact and refuses to be used with another policy.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.feedback import Counters, FeedbackError, KappaBounds, apply_feedback
from ccpo.runtime.state.backends import Backend, DuplicateKey, Tx, open_backend

log = logging.getLogger("ccpo.serve")

SCHEMA_VERSION = 2  # 1: the one-process SQLite format (tables kv, answers)
STATE_FORMAT = "ccpo.serve-state"
_TRIM_EVERY = 64  # answers inserted between two trims of the answer table
_SCHEMA_LOCK = 0x63_63_70_6F  # PostgreSQL advisory lock id while creating tables ("ccpo")

_DDL = (
    "CREATE TABLE IF NOT EXISTS ccpo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_state (id INTEGER PRIMARY KEY, tracker TEXT NOT NULL,"
    " counters TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_leases (replica TEXT PRIMARY KEY, host TEXT NOT NULL,"
    " pid INTEGER NOT NULL, reserved_usd DOUBLE PRECISION NOT NULL,"
    " inflight_usd DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_answers (id TEXT PRIMARY KEY, question TEXT NOT NULL,"
    " answer TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, feedback TEXT, replica TEXT)",
    "CREATE INDEX IF NOT EXISTS ccpo_answers_created ON ccpo_answers (created)",
)

T = TypeVar("T")


def default_replica_id() -> str:
    """``host-pid-random``: unique per process, readable in ``/metrics``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _less(x: float, y: float) -> float:
    """x − y, never below 0, and exactly 0 when only rounding is left (sums of floats)."""
    d = x - y
    return d if d > 1e-12 else 0.0


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's
        return False
    return False


class StateStore:
    """The serve state on a backend; ``location``: None (in memory), a SQLite path or a
    PostgreSQL URL. ``expiry``: seconds a replica's lease (and so its reservations) outlives
    its last sign of life."""

    def __init__(
        self,
        location: str | None,
        fingerprint: str,
        tracker: OnlineThreshold,
        max_records: int = 100_000,
        expiry: float = 120.0,
        replica: str | None = None,
    ) -> None:
        self.db: Backend = open_backend(location)
        self.where = self.db.where
        self.max_records = max_records
        self.expiry = float(expiry)
        self.replica = replica or default_replica_id()
        self.host = socket.gethostname()
        self._pending_rejected = 0
        self._inserted = 0
        self._lease_lost = False
        try:
            self.restored = self._open(fingerprint, tracker)
        except BaseException:
            self.db.close()
            raise
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="ccpo-lease", daemon=True)
        self._beat.start()

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
                restored = True
            else:
                self._create(tx, fingerprint, tracker, Counters())
                restored = False
        self._mutate(self._beat_once)
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
            (json.dumps(asdict(tracker)), json.dumps(counters.to_json())),
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

    # ------------------------------------------------------------------ the one write path
    def _mutate(self, change: Callable[[Tx, OnlineThreshold, Counters, float], T]) -> T:
        """Lock the state row, expire dead leases, apply ``change(tx, tracker, counters,
        now)``, write the row back; one transaction (nothing of it stays on failure)."""
        with self.db.write() as tx:
            row = tx.one(
                f"SELECT tracker, counters, {self.db.now} FROM ccpo_state WHERE id = 1"
                f"{self.db.lock}"
            )
            tracker, c = self._parse(row)
            now = float(row[2])  # type: ignore[index]
            self._expire(tx, c, now)
            pending = self._pending_rejected
            c.rejected += pending
            out = change(tx, tracker, c, now)
            tx.run(
                "UPDATE ccpo_state SET tracker = ?, counters = ? WHERE id = 1",
                (json.dumps(asdict(tracker)), json.dumps(c.to_json())),
            )
        self._pending_rejected -= pending
        self.tracker, self.counters = tracker, c
        return out

    # ------------------------------------------------------------------ leases
    @staticmethod
    def _release(tx: Tx, c: Counters, replica: str, reserved: float, inflight: float) -> None:
        """A lease is over: what it held in calls is spent (at the worst case), the rest is
        free again."""
        c.spent_usd += inflight
        c.inflight_usd = _less(c.inflight_usd, inflight)
        c.reserved_usd = _less(c.reserved_usd, reserved)
        tx.run("DELETE FROM ccpo_leases WHERE replica = ?", (replica,))
        if inflight > 0 or reserved > 0:
            log.warning(
                "replica %s is gone: $%.6f it had in calls counted as spent, $%.6f it held "
                "for questions released",
                replica,
                inflight,
                max(0.0, reserved - inflight),
            )

    def _expire(self, tx: Tx, c: Counters, now: float) -> None:
        for replica, reserved, inflight in tx.all(
            "SELECT replica, reserved_usd, inflight_usd FROM ccpo_leases WHERE expires < ?",
            (now,),
        ):
            if replica == self.replica:
                self._lease_lost = True
            self._release(tx, c, replica, reserved, inflight)

    def _settle_dead_here(self, tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> None:
        """Leases of processes of this host that no longer exist end now, not at expiry."""
        for replica, pid, reserved, inflight in tx.all(
            "SELECT replica, pid, reserved_usd, inflight_usd FROM ccpo_leases WHERE host = ?",
            (self.host,),
        ):
            if replica != self.replica and _process_gone(int(pid)):
                self._release(tx, c, replica, reserved, inflight)

    def _renew(self, tx: Tx, now: float) -> tuple[float, float]:
        """This replica's lease, renewed (created if absent): (reserved, in flight) it holds."""
        row = tx.one(
            "SELECT reserved_usd, inflight_usd FROM ccpo_leases WHERE replica = ?",
            (self.replica,),
        )
        if row is None:
            if self._lease_lost:
                log.warning(
                    "replica %s: its lease had expired (no write or heartbeat for %.0f s); "
                    "what it held was counted as spent",
                    self.replica,
                    self.expiry,
                )
                self._lease_lost = False
            tx.run(
                "INSERT INTO ccpo_leases (replica, host, pid, reserved_usd, inflight_usd, "
                "expires) VALUES (?, ?, ?, 0, 0, ?)",
                (self.replica, self.host, os.getpid(), now + self.expiry),
            )
            return 0.0, 0.0
        tx.run(
            "UPDATE ccpo_leases SET expires = ? WHERE replica = ?",
            (now + self.expiry, self.replica),
        )
        return float(row[0]), float(row[1])

    def _set_lease(self, tx: Tx, reserved: float, inflight: float) -> None:
        tx.run(
            "UPDATE ccpo_leases SET reserved_usd = ?, inflight_usd = ? WHERE replica = ?",
            (reserved, inflight, self.replica),
        )

    def _beat_once(self, tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> None:
        self._settle_dead_here(tx, tracker, c, now)
        self._renew(tx, now)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.expiry / 4):
            try:
                self._mutate(self._beat_once)
            except Exception as e:  # the database is away: the next write says so
                log.warning("lease heartbeat of %s failed: %s", self.replica, e)

    # ------------------------------------------------------------------ money
    def reserve(self, usd: float, cap: float | None, inflight: float = 0.0) -> bool:
        """Reserve ``usd`` under the total budget ``cap`` (None: no cap) if spent + reserved
        + ``usd`` ≤ ``cap`` over all replicas, and mark ``inflight`` USD as a call about to be
        sent; False (nothing reserved) if it does not fit. Atomic across replicas."""

        def change(tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> bool:
            mine, flying = self._renew(tx, now)
            if cap is not None and c.spent_usd + c.reserved_usd + usd > cap * (1 + 1e-12):
                return False
            c.reserved_usd += usd
            c.inflight_usd += inflight
            self._set_lease(tx, mine + usd, flying + inflight)
            return True

        return self._mutate(change)

    def settle(self, reserved: float, spent: float, inflight: float = 0.0) -> None:
        """Release ``reserved`` (``inflight`` of it a call that is back) and add ``spent``.
        After a lost lease only what the lease still holds is released (the rest was counted
        when it expired)."""

        def change(tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> None:
            mine, flying = self._renew(tx, now)
            r, i = min(reserved, mine), min(inflight, flying)
            c.reserved_usd = _less(c.reserved_usd, r)
            c.inflight_usd = _less(c.inflight_usd, i)
            c.spent_usd += spent
            self._set_lease(tx, _less(mine, r), _less(flying, i))

        self._mutate(change)

    # ------------------------------------------------------------------ reads
    def lookup(self, qid: str) -> tuple[str, dict[str, Any], str | None] | None:
        """(question, answer-set JSON, feedback JSON or None) of a served id."""
        with self.db.read() as tx:
            row = tx.one("SELECT question, answer, feedback FROM ccpo_answers WHERE id = ?", (qid,))
        if row is None:
            return None
        return row[0], json.loads(row[1]), row[2]

    def refresh(self) -> tuple[OnlineThreshold, Counters]:
        """κ's tracker and the counters as every replica sees them now (plus this replica's
        refused requests not yet written)."""
        with self.db.read() as tx:
            row = tx.one("SELECT tracker, counters FROM ccpo_state WHERE id = 1")
        self.tracker, self.counters = self._parse(row)
        self.counters.rejected += self._pending_rejected
        return self.tracker, self.counters

    @property
    def kappa(self) -> float:
        return self.tracker.kappa

    def leases(self) -> list[tuple[str, float, float, float]]:
        """(replica, reserved, in flight, expires) of every lease."""
        with self.db.read() as tx:
            return [
                (r, float(a), float(b), float(e))
                for r, a, b, e in tx.all(
                    "SELECT replica, reserved_usd, inflight_usd, expires FROM ccpo_leases"
                )
            ]

    # ------------------------------------------------------------------ writes
    def update_tracker(self, change: Callable[[OnlineThreshold], None]) -> OnlineThreshold:
        """Apply an operator's setting to the stored tracker (a new step size, a narrower
        band), in one transaction."""
        return self._mutate(lambda tx, tracker, c, now: (change(tracker), tracker)[1])

    def record_answer(self, answer: dict[str, Any]) -> None:
        """Store an answered question and count it, in one transaction;
        :class:`DuplicateKey` if its id is taken."""
        self._inserted += 1
        trim = self._inserted % _TRIM_EVERY == 0

        def change(tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> None:
            tx.run(
                "INSERT INTO ccpo_answers (id, question, answer, created, replica) "
                "VALUES (?, ?, ?, ?, ?)",
                (answer["id"], answer["question"], json.dumps(answer), now, self.replica),
            )
            c.requests += 1
            c.cost_usd += float(answer["cost_usd"])
            c.set_size_sum += len(answer["answers"])
            c.rounds_sum += int(answer["rounds"])
            if trim:
                n = int(tx.one("SELECT COUNT(*) FROM ccpo_answers")[0])  # type: ignore[index]
                if n > self.max_records:
                    tx.run(
                        "DELETE FROM ccpo_answers WHERE id IN (SELECT id FROM ccpo_answers "
                        "ORDER BY created ASC LIMIT ?)",
                        (n - self.max_records,),
                    )

        self._mutate(change)

    def count_rejected(self) -> None:
        """Count a request refused before any work: in memory only (written with this
        replica's next write), so that a flood of junk costs no database writes."""
        self._pending_rejected += 1

    def record_error(self) -> None:
        """Count a failed request."""

        def change(tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> None:
            c.errors += 1

        self._mutate(change)

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

        def change(tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> float:
            row = tx.one(f"SELECT feedback FROM ccpo_answers WHERE id = ?{self.db.lock}", (qid,))
            if row is None:
                raise FeedbackError(404, f"no answered question with id '{qid}' (or expired)")
            if row[0] is not None:
                raise FeedbackError(409, f"feedback for id '{qid}' was already given")
            tx.run("UPDATE ccpo_answers SET feedback = ? WHERE id = ?", (json.dumps(feedback), qid))
            apply_feedback(tracker, c, covered, adapt, max_step, bounds or KappaBounds())
            return tracker.kappa

        return self._mutate(change)

    def close(self) -> None:
        """Stop the heartbeat; a lease holding nothing ends now (one holding money is left to
        expire: its calls may have been billed)."""
        self._stop.set()
        self._beat.join(timeout=5)
        try:

            def end(tx: Tx, tracker: OnlineThreshold, c: Counters, now: float) -> None:
                tx.run(
                    "DELETE FROM ccpo_leases WHERE replica = ? AND reserved_usd <= 0 "
                    "AND inflight_usd <= 0",
                    (self.replica,),
                )

            self._mutate(end)
        except Exception as e:  # closing: the database may be gone already
            log.warning("closing the state %s: %s", self.where, e)
        self.db.close()


__all__ = ["SCHEMA_VERSION", "DuplicateKey", "StateStore"]
