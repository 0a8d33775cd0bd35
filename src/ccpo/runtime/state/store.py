"""The state of ``ccpo serve``, one store for every replica (:class:`StateStore`): the total
budget's money (spent, reserved, in flight), κ with its online tracker, the counters, and the
answer sets awaiting feedback, on an embedded SQLite file or a shared PostgreSQL database
(:mod:`~ccpo.runtime.state.backends`); the logic is the same for both.

- one writer thread per replica commits every pending operation in one transaction that locks
  the one state row: a budget check and its reservation are one atomic step over all replicas,
  a feedback moves κ exactly once; callers await the commit (a reservation is durable before
  its call is sent, an acknowledged answer or feedback is in the database);
- settlements never block (written with the next transaction); money is held under the
  replica's lease (a dead replica's is counted as spent at its worst case); every awaited
  operation has a deadline, past it :class:`StateUnavailable`; the store has a schema version
  and belongs to one policy artifact (its fingerprint).

The parts, each an object with its own state, made and wired here:
:class:`~ccpo.runtime.state.schema.Schema` (tables, version, migrations: checked as the store
opens), ``engine``, a :class:`~ccpo.runtime.state.engine.CommitEngine` (group commit, writes
sent whole, committed here; κ's tracker and the counters as its last transaction found them),
``money``, a :class:`~ccpo.runtime.state.money.Money` (reserve, settle, the spare wallet,
leases), ``answers``, an :class:`~ccpo.runtime.state.answers.Answers` (answers, feedback,
counts). Callers use the parts directly (``store.money.reserve``, ``store.answers.lookup``,
``store.engine.commits``); the store itself offers what concerns all of it: κ and the counters
(:meth:`StateStore.refresh`), ``health``, ``update_tracker``, ``close``. The contract and the
vocabulary: docs/glossary.md ("State store: how a question's money moves"); why this design:
docs/decisions.md ("Group commit and wallets").
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable

from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.feedback import Counters
from ccpo.runtime.state.answers import Answers
from ccpo.runtime.state.backends import open_backend
from ccpo.runtime.state.batch import Batch, Lease
from ccpo.runtime.state.db import Backend, DuplicateKey, StateUnavailable
from ccpo.runtime.state.engine import FLUSH_S, CommitEngine
from ccpo.runtime.state.money import SPARE_IDLE_S, SPARE_IDLE_UNCAPPED_S, SPARE_ROOM, Money
from ccpo.runtime.state.schema import (
    SCHEMA_VERSION,
    STATE_FORMAT,
    Schema,
    state_texts,
    tracker_json,
)

log = logging.getLogger("ccpo.serve")


def default_replica_id() -> str:
    """``host-pid-random``: unique per process, readable in ``/metrics``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class StateStore:
    """The serve state on a backend; ``location``: None (in memory), a SQLite path or a
    PostgreSQL URL. ``expiry``: seconds a replica's lease (and so its reservations) outlives
    its last sign of life. ``timeout``: the deadline of every operation (seconds)."""

    restored: bool  # the store existed before (False: created by this replica)
    replica: str  # this replica's id (its lease's)

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
        self.replica = replica or default_replica_id()
        self.db: Backend = open_backend(location, timeout=float(timeout), replica=self.replica)
        self.where = self.db.where
        self.engine = CommitEngine(self.db, self.replica, expiry, timeout)
        self.answers = Answers(self.engine, max_records)
        try:
            schema = Schema(self.db)
            self.restored = schema.open(fingerprint, tracker)
            self.money = Money(self.engine, known_worst=schema.known_worst)
            self.engine.attach(self.money, self.answers)
            self.engine.start()
        except BaseException:
            self.db.close()
            raise

    # ------------------------------------------------------------------ reads
    @property
    def counters(self) -> Counters:
        """The counters as this replica's last transaction found them (plus refused requests
        not yet written); κ's tracker likewise: ``engine.tracker``."""
        return self.engine.counters

    @property
    def kappa(self) -> float:
        return self.engine.tracker.kappa

    def refresh(self) -> tuple[OnlineThreshold, Counters]:
        """κ's tracker and the counters as every replica sees them now (plus this replica's
        refused requests not yet written)."""
        self.engine.commit(lambda b: None, read=True).result()
        return self.engine.tracker, self.engine.counters

    async def arefresh(self) -> tuple[OnlineThreshold, Counters]:
        await self.engine.commit(lambda b: None, read=True)
        return self.engine.tracker, self.engine.counters

    def health(self) -> str | None:
        """None while the database answers; else why not (``/healthz`` says degraded)."""
        return self.engine.unavailable()

    # ------------------------------------------------------------------ writes
    def update_tracker(self, change: Callable[[OnlineThreshold], None]) -> OnlineThreshold:
        """Apply an operator's setting to the stored tracker (a new step size, a narrower
        band), in one transaction."""

        def fn(b: Batch) -> OnlineThreshold:
            change(b.tracker)
            return b.tracker

        return self.engine.commit(fn).result()

    def close(self) -> None:
        """Write what is pending (within the deadline), end this replica's lease if it holds
        nothing, and stop the writer. A lease still holding money (its settlements could not
        be written) is left to expire: its calls then count as spent at their worst case."""
        engine, money = self.engine, self.money

        def end(b: Batch) -> float:
            if b.lease.reserved <= 0 and b.lease.inflight <= 0:
                if not b.new_lease:
                    b.tx.run(
                        "DELETE FROM ccpo_leases WHERE replica = ? AND owner = ?",
                        (engine.replica, money.owner),
                    )
                b.lease_ended, b.new_lease = True, False
            return b.lease.reserved

        money.close()
        try:
            held = engine.commit(end).result()
        except Exception as e:  # closing: the database may be gone already
            log.warning("closing the state %s: %s", self.where, e)
            held = money.held()
        engine.stop()
        if held:
            log.warning(
                "replica %s stops holding $%.6f it could not settle: its lease counts it as "
                "spent when it expires",
                engine.replica,
                held,
            )
        self.db.close()


__all__ = [
    "FLUSH_S",
    "SCHEMA_VERSION",
    "SPARE_IDLE_S",
    "SPARE_IDLE_UNCAPPED_S",
    "SPARE_ROOM",
    "STATE_FORMAT",
    "Batch",
    "DuplicateKey",
    "Lease",
    "StateStore",
    "StateUnavailable",
    "default_replica_id",
    "state_texts",
    "tracker_json",
]
