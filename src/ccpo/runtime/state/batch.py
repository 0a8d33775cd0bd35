"""What one operation of the state store sees and carries: the shared types of the commit
engine (:mod:`~ccpo.runtime.state.engine`) and the parts that run inside its transactions
(:mod:`~ccpo.runtime.state.money`, :mod:`~ccpo.runtime.state.answers`).

- :class:`Batch`: the transaction as an operation sees it (κ's tracker, the counters, this
  replica's lease, the database's clock, what the others hold);
- :class:`Lease`: what a replica holds reserved and in flight, and whether it waits for room;
- :class:`_Delta`: settlements and counts kept in memory until the next transaction;
- :class:`_Op`: one operation handed to the writer, and the future its result goes to;
- :class:`_Redo`: raised by an operation of a batch computed ahead to have it redone;
- :func:`_less`: a subtraction of money that never leaves rounding dust.

Vocabulary (lease, in flight, sent whole): docs/glossary.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.feedback import Counters
from ccpo.runtime.state.db import Tx

_EPS = 1e-12


def _never() -> bool:
    """The default of the store's ``waiting`` and ``alone``: never."""
    return False


def _less(x: float, y: float) -> float:
    """x − y, never below 0, and exactly 0 when only rounding is left (sums of floats)."""
    d = x - y
    return d if d > _EPS else 0.0


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


@dataclass
class _Delta:
    """Settlements and counts not yet written, and whether this replica's lease must be
    (``lease``: whether it waits for room changed): added to the next transaction."""

    reserved: float = 0.0
    spent: float = 0.0
    inflight: float = 0.0
    rejected: int = 0
    errors: int = 0
    lease: bool = False

    def add(self, d: _Delta) -> None:
        """Add ``d`` to this one."""
        self.reserved += d.reserved
        self.spent += d.spent
        self.inflight += d.inflight
        self.rejected += d.rejected
        self.errors += d.errors
        self.lease |= d.lease

    def __bool__(self) -> bool:
        return (
            bool(self.reserved or self.spent or self.inflight or self.rejected or self.errors)
            or self.lease
        )


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
