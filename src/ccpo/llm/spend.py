"""The run's spend ledger and a question's budget, against which ``max_cost`` is checked.

- :class:`SpendLedger`: USD spent and reserved, the paid calls in flight, the admitted
  questions and those of them waiting for room, in named fields (:class:`LedgerSlots` in
  this process; :class:`SharedSlots` in memory shared by the worker processes of ``collect
  --workers``). Every paid call first reserves its worst case (:func:`worst_case_tokens`: the
  bytes of every field of the prompt's messages plus ``max_tokens``) and settles its real
  cost after, so spending never passes the cap however many calls are in flight; a call that
  does not fit waits, then raises :class:`BudgetExceeded` without being sent.
- :class:`RequestBudget` and :data:`request_budget`: one question's own cap, checked the same
  way from its first call on (:class:`RequestBudgetExceeded`).
- :class:`Envelope`: an admitted question's wallet (:meth:`LLMClient.admit`).

``ccpo serve`` keeps its ledger in the state store (``ccpo.runtime.state.ledger``).
"""

from __future__ import annotations

import contextvars
import ctypes
from dataclasses import dataclass, field
from typing import Any

from ccpo.errors import CCPOError
from ccpo.llm.wire import ChatRequest, prompt_token_bound


class BudgetExceeded(CCPOError):
    """``--max-cost`` was reached; no new paid calls are made."""


_BUDGET_POLL_S = 0.01  # how often a call that does not fit the budget looks again


class RequestBudgetExceeded(CCPOError):
    """A question would exceed its own dollar budget; the call that would have was not sent."""


#: a ledger's fields: USD spent (settled), USD reserved, paid calls in flight, admitted
#: questions, admitted questions waiting for room (all floats, as in shared memory)
LEDGER_FIELDS = ("spent", "reserved", "calls", "admitted", "waiting")


class LedgerSlots:
    """The fields of a process's own ledger (:data:`LEDGER_FIELDS`)."""

    __slots__ = LEDGER_FIELDS

    def __init__(self, spent: float = 0.0) -> None:
        self.spent = spent
        self.reserved = self.calls = self.admitted = self.waiting = 0.0


class SharedSlots(ctypes.Structure):
    """The same fields in memory shared by processes: ``ctx.Value(SharedSlots)``."""

    _fields_ = [(name, ctypes.c_double) for name in LEDGER_FIELDS]


class _Held:
    """The fields of a process's own ledger, as a context manager (no lock needed)."""

    __slots__ = ("values",)

    def __init__(self, values: LedgerSlots) -> None:
        self.values = values

    def __enter__(self) -> LedgerSlots:
        return self.values

    def __exit__(self, *exc: object) -> None:
        return None


class _Locked:
    """The fields of a ledger shared by processes (:class:`SharedSlots`), held under its
    lock."""

    __slots__ = ("lock", "values")

    def __init__(self, shared: Any) -> None:
        self.lock, self.values = shared.get_lock(), shared.get_obj()

    def __enter__(self) -> Any:
        self.lock.acquire()
        return self.values

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class SpendLedger:
    """USD spent by one run, USD reserved for it and the paid calls in flight, against which
    ``max_cost`` is checked.

    Every paid call first reserves its worst-case cost (:meth:`try_reserve`: admitted only if
    spent + reserved + worst ≤ cap) and settles it after (:meth:`settle`: the reservation is
    released and the real cost added), so concurrent calls can never take the spending past
    the cap. A question admitted by :meth:`LLMClient.admit` holds a reservation of its
    estimated cost, from which its calls draw first. By default the ledger is this process's
    own; ``collect --workers`` gives every worker process a ledger on one shared
    ``multiprocessing.Value(SharedSlots)``, so the budget is the run's, not each worker's.
    """

    poll_s = _BUDGET_POLL_S  # how often a call that does not fit looks again
    absolute = False  # True: ``total`` is all money ever spent (the cap is the whole budget)
    ADMITTED, WAITING = "admitted", "waiting"  # the fields :meth:`count` counts in

    def __init__(self, shared: Any | None = None, spent: float = 0.0) -> None:
        self._shared = shared
        self._local = LedgerSlots(float(spent))
        self._held = _Held(self._local) if shared is None else _Locked(shared)

    def _values(self) -> Any:
        """``with self._values() as v``: the fields, under the shared memory's lock if any (an
        object made once, not a generator per use: a call reads or writes them six times)."""
        return self._held

    def try_reserve(self, usd: float, cap: float | None, call: bool = False) -> bool:
        """Reserve ``usd`` if it fits under ``cap`` (None: always); False, reserving nothing,
        if it does not. ``call``: for a call about to be sent (counted as in flight)."""
        got = self._reservation(usd, cap, admission=False)
        return self._reserved(call, got if isinstance(got, bool) else got.result())

    async def areserve(
        self,
        usd: float,
        cap: float | None,
        call: bool = False,
        admission: bool = False,
    ) -> bool:
        """:meth:`try_reserve` for the event loop: a ledger kept in a database
        (``ccpo.runtime.state``) awaits its commit here without blocking the loop.
        ``admission``: for a question's wallet, which gives way to admitted questions waiting
        for room (here the client checks :meth:`waiting`; a ledger shared by replicas also
        checks theirs)."""
        got = self._reservation(usd, cap, admission)
        return self._reserved(call, got if isinstance(got, bool) else await got)

    def _reservation(self, usd: float, cap: float | None, admission: bool) -> Any:
        """Reserve ``usd`` under ``cap``: whether it fits (a bool, done here), or a pending
        reservation that ``try_reserve`` waits for and ``areserve`` awaits (a ledger kept in a
        database). The one place a ledger kind says how it reserves."""
        with self._values() as v:
            if cap is not None and v.spent + v.reserved + usd > cap * (1 + 1e-12):
                return False
            v.reserved += usd
            return True

    def _reserved(self, call: bool, ok: bool) -> bool:
        """Once the money is held (``ok``), count the call it is for in flight (``call``).
        Returns ``ok``."""
        if ok:
            with self._values() as v:
                v.calls += float(call)
        return ok

    def settle(self, reserved: float, spent: float, call: bool = False) -> None:
        """Release a reservation of ``reserved`` and record the ``spent`` it really cost.
        ``call``: a call is back (no longer in flight; ``reserved`` may be less than its
        worst case when the rest stays held for its question). Never blocks (a database
        ledger writes it with its next transaction)."""
        with self._values() as v:
            v.reserved = max(0.0, v.reserved - reserved)
            v.spent += spent
            v.calls = max(0.0, v.calls - float(call))

    def add(self, usd: float) -> None:
        self.settle(0.0, usd)

    @property
    def total(self) -> float:
        """USD spent (settled)."""
        with self._values() as v:
            return float(v.spent)

    @property
    def reserved(self) -> float:
        """USD reserved (calls in flight and admitted questions)."""
        with self._values() as v:
            return float(v.reserved)

    def count(self, slot: str, delta: int) -> None:
        """Count a question in (``delta`` 1) or out (-1) of ``ADMITTED`` or ``WAITING``."""
        with self._values() as v:
            setattr(v, slot, max(0.0, getattr(v, slot) + delta))

    def known_worst(self) -> float:
        """The largest worst case of a question known beyond this process (0: none)."""
        return 0.0

    def note_worst(self, usd: float) -> None:
        """A question's worst case reached ``usd`` (kept by a ledger that outlives it)."""

    def waited(self, seconds: float, usd: float) -> None:
        """A reservation of ``usd`` has waited ``seconds`` for room: a ledger may give up
        (raise a :class:`BudgetExceeded`); this one waits as long as room may come."""

    def waiting(self) -> bool:
        """Some admitted question waits for room (questions not yet admitted give way)."""
        with self._values() as v:
            return v.waiting > 0

    def stuck(self, admitted: bool = True) -> bool:
        """Nothing will free room: no call is in flight and every admitted question waits
        (for a question not yet admitted, ``admitted=False``: and none is admitted; the
        admitted ones give way first, and what their wallets held may then admit it)."""
        with self._values() as v:
            return v.calls <= 0 and v.waiting >= v.admitted and (admitted or v.admitted <= 0)


@dataclass
class RequestBudget:
    """The dollar budget of one question (``max_cost_per_request``), checked call by call like
    the run's: see :data:`request_budget`."""

    cap: float
    ledger: SpendLedger = field(default_factory=SpendLedger)


@dataclass
class Envelope:
    """An admitted question's wallet (:meth:`LLMClient.admit`): ``free`` USD held for its calls
    (a call draws its worst case from it and gets back what it did not cost); ``spent``: what
    its paid calls cost so far."""

    free: float
    spent: float = 0.0
    worst: float = 0.0  # the worst cases its paid calls reserved (its ladder's worst case)


#: The budget of the question being answered in this asyncio task (set by the deployed agent);
#: every paid call made on its behalf must fit in it too, round 1 included.
request_budget: contextvars.ContextVar[RequestBudget | None] = contextvars.ContextVar(
    "ccpo_request_budget", default=None
)
_envelope: contextvars.ContextVar[Envelope | None] = contextvars.ContextVar(
    "ccpo_envelope", default=None
)


def worst_case_tokens(request: ChatRequest) -> tuple[int, int]:
    """An upper bound of a request's (input, output) tokens: a token of a byte-level BPE
    tokenizer covers at least one byte (of a message's role, content and ``name``), plus a
    chat template's few tokens per message (:func:`~ccpo.llm.wire.prompt_token_bound`); the
    output is capped by ``max_tokens``. A reply without usage is charged this
    (:func:`~ccpo.llm.wire._parse_completion`)."""
    return prompt_token_bound(request.messages), int(request.max_tokens)
