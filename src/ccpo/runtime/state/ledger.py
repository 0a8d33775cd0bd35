"""The total budget's ledger of ``ccpo serve``, kept in the state store so that every replica
spends from one budget (:class:`StoreLedger`)."""

from __future__ import annotations

from ccpo.llm.client import SpendLedger
from ccpo.runtime.state.store import StateStore


class StoreLedger(SpendLedger):
    """A :class:`~ccpo.llm.client.SpendLedger` whose money lives in the state store: a
    reservation is admitted only if it fits the budget over *all* replicas (one transaction,
    :meth:`StateStore.reserve`), a call's worst case is in the store as in flight before the
    call is sent, and its settlement adds the real cost (:meth:`StateStore.settle`). So a
    replica killed mid-call leaves its money counted (see the store's leases), and N replicas
    never spend N budgets.

    ``total`` is all money spent under this state (``absolute``: the client's cap is the whole
    ``max_cost_total``, not what is left of it). The counts of this process's calls and admitted
    questions stay local (they decide when a waiting question gives up); whether a call is in
    flight anywhere comes from the store."""

    poll_s = 0.05  # a question waiting for room looks again at this pace (a transaction each)
    absolute = True

    def __init__(self, store: StateStore) -> None:
        super().__init__()
        self.store = store

    def try_reserve(
        self, usd: float, cap: float | None, call: bool = False, sent: float = 0.0
    ) -> bool:
        if not self.store.reserve(usd, cap, inflight=sent if call else 0.0):
            return False
        with self._values() as v:
            v[2] += float(call)
        return True

    def settle(
        self, reserved: float, spent: float, call: bool = False, sent: float | None = None
    ) -> None:
        worst = reserved if sent is None else sent
        self.store.settle(reserved, spent, inflight=worst if call else 0.0)
        with self._values() as v:
            v[2] = max(0.0, v[2] - float(call))

    @property
    def total(self) -> float:
        return self.store.counters.spent_usd

    @property
    def reserved(self) -> float:
        return self.store.counters.reserved_usd

    def stuck(self) -> bool:
        """No call in flight on any replica (as of this replica's last transaction) and every
        question admitted here waits for room: nothing will free any."""
        with self._values() as v:
            local_idle = v[2] <= 0 and v[4] >= v[3]
        return local_idle and self.store.counters.inflight_usd <= 1e-12
