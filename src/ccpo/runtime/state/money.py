"""The money of the state store (:class:`Money`, a part of
:class:`~ccpo.runtime.state.store.StateStore`): reservations under the total budget, their
settlements, the spare wallet, and the leases under which a replica holds money.

- :meth:`Money.areserve` / :meth:`~Money.reserve`: reserve under the cap, atomically over all
  replicas, durable when it returns; :meth:`Money.settle`: release and spend, written with
  the next transaction (never blocking);
- :meth:`Money.take_spare`: a wallet from the spare one, with no write; ``_top_up`` refills it
  in a write (``SPARE_IDLE_S``, ``SPARE_IDLE_UNCAPPED_S``, ``SPARE_ROOM``);
- ``_leases`` / ``_release`` / ``_apply``: every lease read once per transaction (expired ones,
  and the one a restart under this replica id finds, settled at their worst case), pending
  settlements applied; ``_neighbour_gone``: a process of this host holding money exited;
- :meth:`Money.note_worst`: a question's worst case, kept in the state for restarts.

Vocabulary (wallet, spare, lease, lease owner, in flight, orphan): docs/glossary.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ccpo.errors import CCPOError
from ccpo.runtime.state.batch import _EPS, Batch, Lease, _Delta, _less, _never, _Op, _Redo
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

_LEASES = (  # every lease, as :meth:`Money._leases` reads them
    "SELECT replica, reserved_usd, inflight_usd, expires, idle, waiting, owner, proc "
    "FROM ccpo_leases"
)
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
    """Reservations, settlements, the spare wallet and the leases of
    :class:`~ccpo.runtime.state.store.StateStore`. Its operations go through the store's
    commit engine (``_call``, ``_acall``); settlements and releases are added to its pending
    ``_delta`` under ``_cond``; ``_leases``, ``_apply`` and ``_top_up`` run inside its
    transactions."""

    replica: str
    host: str
    expiry: float
    known_worst: float
    _cond: threading.Condition
    _delta: _Delta

    def _init_money(self) -> None:
        self.owner = owner_token()  # this process's leases are its own (not its host's and pid's)
        self.proc = process_identity()  # where others on this host check it for life
        self._neighbours: list[str] = []  # processes of this host holding money (their proc)
        # the other leases holding money, as the last transaction read them: (replica, USD,
        # seconds until the lease expires)
        self.holders: list[tuple[str, float, float]] = []
        self._next_look = 0.0
        self._lease_lost = False
        self._mirror = Lease()  # the lease as this replica's last commit left it
        self._orphan = Lease()  # what a lost lease held (counted as spent when it expired)
        self.others_busy = False  # another replica holds money it will free by itself
        self.others_hold = False  # another replica holds money (busy, or its questions wait)
        self.others_waiting = False  # an admitted question of another replica waits for room
        # whether an admitted question of this replica waits for room (its ledger sets it):
        # written to its lease with every write, and a change of it makes one (waiting_changed)
        self.waiting: Callable[[], bool] = _never
        self._lease_dirty = False
        # the spare wallet: reserved and counted in flight, durably, for this
        # replica's next question; topped up to ``_spare_want`` by write transactions
        self._spare = 0.0
        self._spare_want = 0.0
        self._spare_cap: float | None = None  # the total budget the questions asking run under
        self._spare_taken: float | None = None  # when a question last asked for it
        self._spare_streak = False  # the last two asked within SPARE_IDLE_S: worth topping up
        self._no_spare = False  # closing: no spare any more

    # ------------------------------------------------------------------ reserve and settle
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
            _hold(b, usd, inflight)
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
            _hold(b, top, top)
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
            self._submit(_Op(fn))  # type: ignore[attr-defined]  # (nobody waits for it)
        except CCPOError:  # the database is away: the next growth writes it
            self.known_worst = known

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

        return self._call(fn, read=True)

    def _leases(self, b: Batch, rows: list[tuple[Any, ...]], beat: bool) -> None:
        """Every lease in one read: expired ones (and, on a heartbeat, those of exited
        processes of this host's PID namespace) end, their calls counted as spent at the worst
        case; a lease under this replica's id left by an earlier process (a restart) ends the
        same way when this one starts, and :class:`LeaseTaken` if it is found later (another
        process took this id over); this replica's becomes ``b.lease`` (a new one if it has
        none); ``b.others_busy``: another replica holds money and is not waiting for room;
        ``b.others_hold``: another holds money; ``b.others_waiting``: an admitted question of
        another waits for room."""
        busy = hold = waits = False
        holders: list[tuple[str, float, float]] = []
        for replica, reserved, inflight, expires, idle, waiting, owner, proc in rows:
            reserved, inflight = float(reserved), float(inflight)
            mine = replica == self.replica
            if mine and owner != self.owner:
                if self.commits:  # type: ignore[attr-defined]  # (the engine's count)
                    raise LeaseTaken(
                        f"replica {self.replica}: another process started with this replica id "
                        "took its lease over; this one stops serving (give every replica its "
                        "own --replica id)"
                    )
                log.warning(
                    "replica %s starts again: the lease its last process left ends", replica
                )
                self._release(b, replica, reserved, inflight)
                continue
            dead = float(expires) < b.now or (beat and not mine and gone(proc, self.proc))
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
        self._look(rows)
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

    def _look(self, rows: list[tuple[Any, ...]]) -> None:
        """From the leases as a transaction read them (``_LEASES``, a read-only one too):
        the processes of this host's PID namespace holding money, which the writer watches
        (:meth:`_neighbour_gone`)."""
        here = self.proc.rsplit("/", 2)[0]
        self._neighbours = [
            proc
            for replica, reserved, *_, proc in rows
            if replica != self.replica and float(reserved) > 0 and proc
            and proc.rsplit("/", 2)[0] == here
        ]  # fmt: skip

    def _neighbour_gone(self) -> bool:
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
