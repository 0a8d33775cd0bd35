"""The total budget's ledger of ``ccpo serve``, kept in the state store so that every replica
spends from one budget.

- :class:`StoreLedger`: reservations, settlements and waits for room on the store; the largest
  worst case of a question (:meth:`StoreLedger.known_worst`), kept in the state so that a
  restarted replica admits its first question on it;
- :class:`BudgetBusy`: a question that waited ``server.budget_wait`` for room gives up (503
  ``budget_busy`` with ``Retry-After``, naming who holds the room).

Vocabulary (admission, wallet, lease, budget_busy) and the budget's rules: docs/glossary.md,
docs/deploy.md ("Budgets").
"""

from __future__ import annotations

import math
import time

from ccpo.llm.client import BudgetExceeded, SpendLedger
from ccpo.runtime.state.engine import Pending
from ccpo.runtime.state.money import Money
from ccpo.runtime.state.store import StateStore

BUSY_RETRY_S = 5  # Retry-After when the room is held by replicas that renew their leases


class BudgetBusy(BudgetExceeded):
    """A question waited ``budget_wait`` seconds for room in the total budget, held by
    questions in flight or by a replica that stopped renewing its lease; ``retry_after``:
    seconds after which room may be free (when that lease expires, if one is the cause)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StoreLedger(SpendLedger):
    """A :class:`~ccpo.llm.client.SpendLedger` whose money lives in the state store: a
    reservation is admitted only if it fits the budget over *all* replicas (one transaction,
    :meth:`Money.reserve`, awaited without blocking the event loop) and is durable
    before the call it is for is sent. Every reserved dollar is counted in flight (spent at
    its worst case should this replica die): a question's wallet, reserved once at admission,
    pays its calls' worst cases with no write per call, so the store cannot tell which part
    of it is in a call. Settlements (:meth:`settle`) never block: they ride on the replica's
    next transaction (:meth:`Money.settle`). So a replica killed mid-call leaves its
    money counted (see the store's leases), and N replicas never spend N budgets.

    ``total`` is all money spent under this state (``absolute``: the client's cap is the whole
    ``max_cost_total``, not what is left of it). The counts of this process's calls and admitted
    questions stay local (they decide when a waiting question gives up); whether another
    replica holds money it will free comes from the store (its leases' ``idle``), and whether
    an admitted question of another waits for room (``waiting``: admissions here give way to
    it, as to this replica's own, see :meth:`LLMClient._wait_for_room`)."""

    poll_s = 0.05  # a question waiting for room looks again at this pace (rides on batches)
    stuck_s = 0.5  # nothing frees room for this long (several transactions): give up
    absolute = True

    def __init__(self, store: StateStore, max_wait: float | None = None) -> None:
        super().__init__()
        self.store = store
        self.money: Money = store.money
        self.max_wait = max_wait  # seconds a reservation may wait for room (None: no limit)
        self._stuck_since: float | None = None
        store.money.waiting = self.waiting  # on its lease: admissions at other replicas give way

    def count(self, slot: str, delta: int) -> None:
        before = self.waiting()
        super().count(slot, delta)
        if slot == self.WAITING and self.waiting() != before:
            self.money.waiting_changed()

    def _idle(self) -> bool:
        """No call of this replica in flight and every question admitted here waits."""
        with self._values() as v:
            return v.calls <= 0 and v.waiting >= v.admitted

    def _reservation(self, usd: float, cap: float | None, admission: bool) -> bool | Pending[bool]:
        """True when ``usd`` needs no write: a call drawn wholly from its question's wallet
        (the wallet is in the store, counted in flight, since the question was admitted),
        or a wallet taken from the spare one (reserved by an earlier transaction); else the
        store's reservation of it, all of it counted in flight, to be committed (awaited by
        ``areserve`` without blocking the loop, waited for by ``try_reserve``)."""
        if usd <= 0 or self.money.take_spare(usd, cap):
            return True
        return self.money.reserve(usd, cap, usd, idle=self._idle, admission=admission)

    def settle(self, reserved: float, spent: float, call: bool = False) -> None:
        if reserved > 0 or spent > 0:
            self.money.settle(reserved, spent, inflight=reserved)
        with self._values() as v:
            v.calls = max(0.0, v.calls - float(call))

    @property
    def total(self) -> float:
        return self.store.counters.spent_usd

    @property
    def reserved(self) -> float:
        return self.store.counters.reserved_usd

    def stuck(self, admitted: bool = True) -> bool:
        """Nothing will free room: for ``stuck_s`` on end, every question admitted here
        waited, no call of this replica was in flight, none of its settlements waited to be
        written, and no other replica held money it was not waiting with (as of this
        replica's last transactions). The time bridges the moments between a question's
        admission and its first call, or between two calls of another replica. A question
        not yet admitted (``admitted=False``) also waits while admitted questions anywhere
        hold money, or another replica's admitted question waits for room: they go first,
        and their wallets may then admit it."""
        now = time.monotonic()
        money = self.money
        if not self._idle() or money.others_busy or self.store.engine.pending():
            self._stuck_since = None
            return False
        if self._stuck_since is None:
            self._stuck_since = now
        if not admitted and (self._admitted() or money.others_hold or money.others_waiting):
            return False
        return now - self._stuck_since >= self.stuck_s

    def _admitted(self) -> bool:
        with self._values() as v:
            return v.admitted > 0

    def known_worst(self) -> float:
        return self.money.known_worst

    def note_worst(self, usd: float) -> None:
        self.money.note_worst(usd)

    def waited(self, seconds: float, usd: float) -> None:
        """Past ``max_wait`` seconds: :class:`BudgetBusy`, naming who holds the room. A
        lease that has gone unrenewed for longer than a heartbeat (a quarter of this
        replica's ``reservation_expiry``, which replicas are meant to share) belongs to a
        replica that may be down: its money comes free when that lease expires."""
        if self.max_wait is None or seconds < self.max_wait:
            return
        money, expiry = self.money, self.store.engine.expiry
        c = self.store.counters
        head = (
            f"no room in the total budget for ${usd:.6f} after waiting {seconds:.0f} s "
            f"(spent ${c.spent_usd:.4f}, reserved ${c.reserved_usd:.4f})"
        )
        late = [(r, x, left) for r, x, left in money.holders if left < expiry * 0.75 - 1]
        if late:
            after = math.ceil(max(0.0, min(left for _, _, left in late))) + 1
            who = "; ".join(
                f"replica {r} holds ${x:.4f} and has not renewed its lease for "
                f"{expiry - left:.0f} s (it may be down): it expires in {max(0, left):.0f} s"
                for r, x, left in late
            )
        else:
            after = BUSY_RETRY_S
            who = (
                "held by questions in flight ("
                + ", ".join(
                    [f"this replica ${money.mirror.reserved:.4f}"]
                    + [f"replica {r} ${x:.4f}" for r, x, _ in money.holders]
                )
                + ")"
            )
        raise BudgetBusy(f"{head}: {who}; retry after {after} s", after)
