"""The money of the state store (:class:`Money`, the ``money`` of
:class:`~ccpo.runtime.state.store.StateStore`): reservations under the total budget, their
settlements, the spare wallet, and the leases under which a replica holds money.

- :meth:`Money.reserve`: reserve under the cap, atomically over all replicas, durable once
  committed (a :class:`~ccpo.runtime.state.engine.Pending`: waited for or awaited);
  :meth:`Money.settle`: release and spend, written with the next transaction (never
  blocking);
- :meth:`Money.take_spare`: a wallet from the spare one, with no write; :meth:`~Money.top_up`
  refills it in a write (``SPARE_IDLE_S``, ``SPARE_IDLE_UNCAPPED_S``, ``SPARE_ROOM``);
- :meth:`~Money.read_leases` / ``_release`` / :meth:`~Money.apply`: every lease read once per
  transaction (expired ones, and the one a restart under this replica id finds, settled at
  their worst case), pending settlements applied; :meth:`~Money.neighbour_gone`: a process
  of this host holding money exited;
- :meth:`Money.note_worst`: a question's worst case, kept in the state for restarts.

Vocabulary (wallet, spare, lease, lease owner, in flight, orphan): docs/glossary.md.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from ccpo.errors import CCPOError
from ccpo.runtime.state.batch import _EPS, Batch, Lease, _Delta, _less, _never, _Op, _Redo
from ccpo.runtime.state.engine import CommitEngine, Pending
from ccpo.runtime.state.process import gone, owner_token, process_identity
from ccpo.runtime.state.schema import WORST_KEY

log = logging.getLogger("ccpo.serve")

SPARE_IDLE_S = 1.0  # a spare wallet nobody took for this long is released (under a cap)
#: ... and without a cap (``max_cost_total``), where a spare holds no room another question
#: could use: at low traffic (a question every few seconds) each question then takes its
#: wallet with no commit on its critical path (a round trip to the database); the cost is a
#: spare counted as spent at its worst case if the replica dies in that time
SPARE_IDLE_UNCAPPED_S = 5.0
SPARE_ROOM = 16  # under a cap, a spare is topped up only if this many wallets fit after it

LOOK_S = 0.5  # how often the writer looks whether a process of this host holding money exited


class LeaseTaken(CCPOError):
    """This replica's lease was taken over by another process started with the same replica
    id: this one no longer writes (its money was counted as spent by the other)."""


def _hold(b: Batch, usd: float, inflight: float) -> None:
    """Inside a transaction: reserve ``usd`` in the counters and this replica's lease,
    ``inflight`` of it counted in flight."""
    c, lease = b.counters, b.lease
    c.reserved_usd += usd
    c.inflight_usd += inflight
    lease.reserved += usd
    lease.inflight += inflight


class Money:
    """The money of the state store on the commit ``engine``: reservations, settlements, the
    spare wallet and this replica's lease. Its operations are the engine's
    (:meth:`CommitEngine.commit`); settlements and releases are
    pending in the engine (:meth:`CommitEngine.pend`); :meth:`read_leases`, :meth:`apply`,
    :meth:`top_up` run inside the engine's transactions, :meth:`committed` after each commit.
    ``known_worst``: a question's largest worst case, as the store found it
    (:meth:`note_worst`)."""

    def __init__(self, engine: CommitEngine, known_worst: float = 0.0) -> None:
        self.engine = engine
        self.known_worst = known_worst
        self.host = socket.gethostname()
        self.owner = owner_token()  # this process's leases are its own (not its host's and pid's)
        self.proc = process_identity()  # where others on this host check it for life
        self._neighbours: list[str] = []  # processes of this host holding money (their proc)
        # the other leases holding money, as the last transaction read them: (replica, USD,
        # seconds until the lease expires)
        self.holders: list[tuple[str, float, float]] = []
        self._next_look = 0.0
        self._lease_lost = False
        # the database's clock at this replica's last read of the leases, and the leases that
        # expired while it could not see the database (from, until when: see read_leases)
        self._seen: float | None = None
        self._grace: tuple[float, float] | None = None
        self.mirror = Lease()  # the lease as this replica's last commit left it
        self.orphan = Lease()  # what a lost lease held (counted as spent when it expired)
        self.others_busy = False  # another replica holds money it will free by itself
        self.others_hold = False  # another replica holds money (busy, or its questions wait)
        self.others_waiting = False  # an admitted question of another replica waits for room
        # whether an admitted question of this replica waits for room (its ledger sets it):
        # written to its lease with every write, and a change of it makes one (waiting_changed)
        self.waiting: Callable[[], bool] = _never
        # the spare wallet: reserved and counted in flight, durably, for this
        # replica's next question; topped up to ``_spare_want`` by write transactions
        self._spare = 0.0
        self._spare_want = 0.0
        self._spare_cap: float | None = None  # the total budget the questions asking run under
        self._spare_taken: float | None = None  # when a question last asked for it
        self._spare_streak = False  # the last two asked within SPARE_IDLE_S: worth topping up
        self._no_spare = False  # closing: no spare any more

    # ------------------------------------------------------------------ reserve and settle
    def reserve(
        self,
        usd: float,
        cap: float | None,
        inflight: float = 0.0,
        idle: bool | Callable[[], bool] = False,
        admission: bool = False,
    ) -> Pending[bool]:
        """Reserve ``usd`` under the total budget ``cap`` (None: no cap) if spent + reserved
        + ``usd`` ≤ ``cap`` over all replicas, ``inflight`` of it counted as spent should this
        replica die before settling it; False (nothing reserved) if it does not fit, then
        ``idle`` (or its value when the transaction runs) says whether every question of this
        replica waits for room. ``admission``: a question's wallet, which under a cap gives
        way (False) while an admitted question of another replica waits for room (a lease's
        ``waiting``). Durable once committed (``.result()``, or awaited); atomic across
        replicas."""

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
            _hold(b, usd, inflight)
            b.lease.idle = False
            return True

        def undo(ok: bool) -> None:
            if ok:
                self.settle(usd, 0.0, inflight)

        return self.engine.commit(fn, undo=undo, whole=True)

    def settle(self, reserved: float, spent: float, inflight: float = 0.0) -> None:
        """Release ``reserved`` (``inflight`` of it counted in flight) and add ``spent``:
        written with this replica's next transaction (within ``FLUSH_S``), never blocking;
        retried until written while the replica lives (until then the money stays reserved)."""
        self.engine.pend(_Delta(reserved, spent, inflight))

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
        with self.engine.cond:
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

    def spare_idle_at(self) -> float | None:
        """When the spare goes back unless a question asks for it (None: there is none).
        Under the engine's ``cond``."""
        if self._spare <= 0 and self._spare_want <= 0:
            return None
        return (self._spare_taken or 0.0) + self._spare_idle()

    def top_up(self, b: Batch) -> float:
        """Inside a write transaction: reserve what the spare lacks (all of it counted in
        flight); the amount, added to the spare once committed."""
        with self.engine.cond:
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
            _hold(b, top, top)
        return top

    def drop_spare(self) -> None:
        """Release the spare (nobody asked for it lately): a settlement written with the next
        transaction, at once. Under the engine's ``cond``."""
        self._spare_want = 0.0
        self._spare_streak = False
        if self._spare > 0:
            self._release_spare()
            self.engine.flush_now()

    def close(self) -> None:
        """The store closes: the spare goes back, and no question takes one any more."""
        with self.engine.cond:
            self._no_spare = True
            self.drop_spare()

    def _release_spare(self) -> None:
        """The spare back to the budget: a settlement written with the next transaction.
        Under the engine's ``cond``."""
        spare, self._spare = self._spare, 0.0
        self.engine.pend(_Delta(reserved=spare, inflight=spare), lazy=False)

    def note_worst(self, usd: float) -> None:
        """A question's worst case (T x the largest worst case of a round) grew to ``usd``:
        kept in ``ccpo_meta`` for the replicas that start later (a restart's first question
        is admitted on it, not run without a wallet). Never blocking: written by the next
        transaction, only when it grows."""
        if usd <= self.known_worst * (1 + _EPS):
            return
        known, self.known_worst = self.known_worst, usd

        def fn(b: Batch) -> None:
            row = b.tx.one("SELECT value FROM ccpo_meta WHERE key = ?", (WORST_KEY,))
            if row is None:
                b.tx.run("INSERT INTO ccpo_meta (key, value) VALUES (?, ?)", (WORST_KEY, str(usd)))
            elif float(row[0]) < usd:
                b.tx.run("UPDATE ccpo_meta SET value = ? WHERE key = ?", (str(usd), WORST_KEY))

        try:
            self.engine.submit(_Op(fn))  # (nobody waits for it)
        except CCPOError:  # the database is away: the next growth writes it
            self.known_worst = known

    def waiting_changed(self) -> None:
        """Whether a question of this replica waits for room (:attr:`waiting`) changed: the
        lease says so with the next transaction, within ``FLUSH_S`` (never blocking)."""
        self.engine.pend(_Delta(lease=True))

    # ------------------------------------------------------------------ leases
    def leases(self) -> list[tuple[str, float, float, float]]:
        """(replica, reserved, in flight, expires) of every lease."""

        def fn(b: Batch) -> list[tuple[str, float, float, float]]:
            return [
                (r, float(a), float(x), float(e))
                for r, a, x, e in b.tx.all(
                    "SELECT replica, reserved_usd, inflight_usd, expires FROM ccpo_leases"
                )
            ]

        return self.engine.commit(fn, read=True).result()

    def read_leases(self, b: Batch, rows: list[tuple[Any, ...]], beat: bool) -> None:
        """Every lease in one read: expired ones (and, on a heartbeat, those of exited
        processes of this host's PID namespace) end, their calls counted as spent at the worst
        case; a lease under this replica's id left by an earlier process (a restart) ends the
        same way when this one starts, and :class:`LeaseTaken` if it is found later (another
        process took this id over); this replica's becomes ``b.lease`` (a new one if it has
        none); ``b.others_busy``: another replica holds money and is not waiting for room;
        ``b.others_hold``: another holds money; ``b.others_waiting``: an admitted question of
        another waits for room."""
        replica_id, engine = self.engine.replica, self.engine
        self._blackout(b.now)
        busy = hold = waits = False
        holders: list[tuple[str, float, float]] = []
        for replica, reserved, inflight, expires, idle, waiting, owner, proc in rows:
            reserved, inflight = float(reserved), float(inflight)
            mine = replica == replica_id
            if mine and owner != self.owner:
                if engine.commits:
                    raise LeaseTaken(
                        f"replica {replica_id}: another process started with this replica id "
                        "took its lease over; this one stops serving (give every replica its "
                        "own --replica id)"
                    )
                log.warning(
                    "replica %s starts again: the lease its last process left ends", replica
                )
                self._release(b, replica, reserved, inflight)
                continue
            # this replica's own lease (its owner is this process) is alive whatever its
            # expiry says: found expired (a stall of the database, or of this process), it
            # is renewed, not counted as spent
            expired = not mine and float(expires) < b.now and not self._spared(float(expires))
            dead = expired or (beat and not mine and gone(proc, self.proc))
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
                    holders.append((replica, reserved, float(expires) - b.now))
        b.others_busy, b.others_hold, b.others_waiting = busy, hold, waits
        self.holders = holders
        self.look(rows)
        if b.new_lease:
            held = self.mirror
            if self._lease_lost or held.reserved > 0 or held.inflight > 0:
                log.warning(
                    "replica %s: its lease had expired (no transaction for %.0f s); what it "
                    "held ($%.6f) was counted as spent",
                    replica_id,
                    engine.expiry,
                    held.reserved,
                )
                b.orphan = Lease(
                    b.orphan.reserved + held.reserved, b.orphan.inflight + held.inflight
                )
                b.lease_lost = True

    def _blackout(self, now: float) -> None:
        """``now``: the database's clock in this transaction. A gap since this replica's last
        read of the leases longer than half the expiry (every replica writes at least every
        quarter of it: its heartbeat) means it could not see the database meanwhile (the
        database stalled, or this process did): the leases that expired in that gap may be of
        live replicas that could not renew either, so they are spared until half an expiry
        from now (a heartbeat of theirs and more). Leases that expired before it end as
        usual."""
        last, self._seen = self._seen, now
        if last is not None and now - last > self.engine.expiry / 2:
            self._grace = (last, now + self.engine.expiry / 2)
            log.warning(
                "replica %s: no transaction for %.1f s (the database or this process stalled);"
                " leases that expired meanwhile are given %.0f s to renew",
                self.engine.replica,
                now - last,
                self.engine.expiry / 2,
            )

    def _spared(self, expires: float) -> bool:
        """A lease that expired in this replica's last blackout, within its grace."""
        g = self._grace
        return g is not None and expires > g[0] and self._seen is not None and self._seen < g[1]

    def look(self, rows: list[tuple[Any, ...]]) -> None:
        """From the leases as a transaction read them (``_LEASES``, a read-only one too):
        the processes of this host's PID namespace holding money, which the writer watches
        (:meth:`neighbour_gone`)."""
        here = self.proc.rsplit("/", 2)[0]
        self._neighbours = [
            proc
            for replica, reserved, *_, proc in rows
            if replica != self.engine.replica and float(reserved) > 0 and proc
            and proc.rsplit("/", 2)[0] == here
        ]  # fmt: skip

    def neighbour_gone(self) -> bool:
        """A process of this host's PID namespace that held money under a lease (as this
        replica's last transaction read them) has exited: a heartbeat ends its lease now
        rather than at its expiry. Looks at most every ``LOOK_S`` (the writer's thread)."""
        now = time.monotonic()
        if not self._neighbours or now < self._next_look:
            return False
        self._next_look = now + LOOK_S
        return any(gone(p, self.proc) for p in self._neighbours)

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
    def apply(b: Batch, d: _Delta) -> None:
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

    def lease_values(self, lease: Lease) -> tuple[float, float, float, int, int]:
        """This replica's lease as both write paths write it (reserved, in flight, the expiry
        to add to the database's clock, idle, waiting), ``waiting`` taken now."""
        lease.waiting = self.waiting()
        expiry = self.engine.expiry
        return lease.reserved, lease.inflight, expiry, int(lease.idle), int(lease.waiting)

    def lease_lost(self) -> bool:
        """This replica's lease expired and it has not written a new one yet."""
        return self._lease_lost

    def committed(self, b: Batch, top: float) -> None:
        """After a write committed: this replica's lease and the others' as it left them, and
        the spare's top-up (``top``) added (what a lost lease held of it counted as spent)."""
        self.mirror, self.orphan = b.lease, b.orphan
        self.others_busy, self.others_hold = b.others_busy, b.others_hold
        self.others_waiting = b.others_waiting
        with self.engine.cond:
            if b.lease_lost:  # the spare was in the lease that ended: counted as spent
                gone, self._spare = self._spare, 0.0
                self.orphan = Lease(
                    _less(self.orphan.reserved, gone), _less(self.orphan.inflight, gone)
                )
            self._spare += top
        if b.new_lease:
            self._lease_lost = False

    def held(self) -> float:
        """What this replica holds reserved, as its last commit left it (a lost lease's too)."""
        return self.mirror.reserved + self.orphan.reserved
