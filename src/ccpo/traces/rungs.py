"""The rungs of a ladder: each distinct paid call, in the order the ladder makes them.

A round has two steps (base, guide); an ``agree`` round may repeat an earlier call (stored
``reused``, paid once: :meth:`ccpo.traces.ladder.Ladder.reused`). A **rung** is a call that
is not such a repeat, and a step's reply is its rung's reply. So a cascade of pairs (each
round's base the previous round's guide) has T + 1 rungs: round 1's base, then every round's
guide; a ladder of one-model steps (each round's guide repeats its base) has T, one per
round; a ``judge`` ladder has 2T. A **verify step**'s rung is its verifier's call (its base
repeats the reply it verifies): paid when the step is run, never returned, since its "reply"
is a verdict; returning at a verify step returns the verified reply, so that reply's rung is
the one returned.

- :class:`Rungs` (built by :func:`ladder_rungs`): the rung each step's call stands for and
  the rung each step's reply is [N, T, 2] (equal but at verify steps' verifiers), the cost
  of each rung's call [N, R] and the rungs' models and steps;
- :func:`rung_masks`: per question and rung, whether any of a set of steps belongs to it
  (paid: a step run, by :attr:`Rungs.of_step`; returned: a step whose reply is returned, by
  :attr:`Rungs.reply_of_step`).

What the figures mean: docs/design.md, "How evaluation works" (where the money goes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ccpo.traces.ladder import ladder_of_trace
from ccpo.traces.prices import PriceTable
from ccpo.traces.signals import is_verify

ROLES = ("base", "guide")


@dataclass(frozen=True)
class Rungs:
    """The R rungs of a trace set, cheapest call first in ladder order."""

    of_step: np.ndarray  # [N, T, 2] int: the rung whose call step (t, role) is or repeats
    cost: np.ndarray  # [N, R] USD of each rung's call (0 where a question lacks it)
    models: tuple[str, ...]  # [R] the model of each rung (the first trace's)
    steps: tuple[tuple[int, str], ...]  # [R] (round t 1-based, role) of each rung's call
    #: [N, T, 2] int: the rung whose reply step (t, role) returns (a verify step's verifier:
    #: the verified reply's); None: ``of_step`` (a ladder without verify steps)
    reply_of_step: np.ndarray | None = None
    #: [R] the model whose reply each rung verifies ('' for a rung that answers); () none
    verifies: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.models)

    @property
    def replies(self) -> np.ndarray:
        """[N, T, 2] the rung whose reply each step returns."""
        return self.of_step if self.reply_of_step is None else self.reply_of_step

    def verified(self, r: int) -> str:
        """The model whose reply rung ``r`` verifies ('' when it answers the question)."""
        return self.verifies[r] if self.verifies else ""

    def label(self, r: int) -> str:
        """ "gpt-4o (round 4 guide)": the rung's model and the step that calls it; on a
        ladder of one model per step (a rung per round, each its base's call) "gpt-4o (step
        4)"; a verify step's "gpt-4o-mini (step 2, verifies gpt-4.1-nano)"."""
        t, role = self.steps[r]
        if all(u == k for k, (u, _) in enumerate(self.steps, start=1)):
            what = self.verified(r)
            return f"{self.models[r]} (step {t}" + (f", verifies {what})" if what else ")")
        return f"{self.models[r]} (round {t} {role})"

    def subset(self, idx: np.ndarray) -> Rungs:
        idx = np.asarray(idx)
        replies = None if self.reply_of_step is None else self.reply_of_step[idx]
        return Rungs(
            self.of_step[idx], self.cost[idx], self.models, self.steps, replies, self.verifies
        )


def step_origins(trace: Any) -> list[tuple[tuple[int, str], ...]]:
    """Per round, the (round, role) of the call each of its two steps stands for: itself, or
    for a step stored ``reused`` the earlier step it repeats."""
    ladder = ladder_of_trace(trace)
    out = []
    for t, r in enumerate(trace.rounds, start=1):
        pair = []
        for role in ROLES:
            src = ladder.reused(t, role) if getattr(r, role).reused else None
            pair.append(src or (t, role))
        out.append(tuple(pair))
    return out


def reply_origins(trace: Any, calls: list[tuple[tuple[int, str], ...]]) -> list[tuple]:
    """Per round, the (round, role) of the call each step's reply comes from: its call's
    (``calls``, :func:`step_origins`), but a verify step's verifier returns the reply it
    verifies, its base's."""
    return [
        (pair[0], pair[0]) if is_verify(r) else pair
        for r, pair in zip(trace.rounds, calls, strict=True)
    ]


def ladder_rungs(traces: Sequence[Any], prices: PriceTable) -> Rungs:
    """The :class:`Rungs` of a trace set (one T): every call that is not a repeat, ordered by
    round then base before guide; a rung's cost is its step's (:meth:`PriceTable.round_costs`,
    a free-text verdict call included with the guide)."""
    origins = [step_origins(tr) for tr in traces]
    keys = sorted(
        {o for per in origins for pair in per for o in pair},
        key=lambda k: (k[0], ROLES.index(k[1])),
    )
    index = {k: i for i, k in enumerate(keys)}
    N, T = len(traces), traces[0].n_rounds if traces else 0
    of_step = np.zeros((N, T, 2), dtype=np.int64)
    replies = np.zeros((N, T, 2), dtype=np.int64)
    cost = np.zeros((N, len(keys)))
    models: dict[tuple[int, str], str] = {}
    verifies: dict[tuple[int, str], str] = {}
    for i, (tr, per) in enumerate(zip(traces, origins, strict=True)):
        for t, (pair, reply) in enumerate(zip(per, reply_origins(tr, per), strict=True)):
            for j, (o, ro) in enumerate(zip(pair, reply, strict=True)):
                of_step[i, t, j], replies[i, t, j] = index[o], index[ro]
            r = tr.rounds[t]
            for j, (role, c) in enumerate(zip(ROLES, prices.round_costs(r), strict=True)):
                if pair[j] == (t + 1, role):  # the call itself, not a repeat
                    cost[i, index[(t + 1, role)]] = c
                    models.setdefault((t + 1, role), getattr(r, role).model)
            if is_verify(r):
                verifies.setdefault((t + 1, "guide"), r.base.model)
    verified = tuple(verifies.get(k, "") for k in keys) if verifies else ()
    return Rungs(
        of_step, cost, tuple(models[k] for k in keys), tuple(keys),
        replies if verifies else None, verified,
    )  # fmt: skip


def rung_masks(of_step: np.ndarray, steps: np.ndarray, count: int) -> np.ndarray:
    """[..., R] bool: some step marked in ``steps`` [..., T, 2] belongs to rung r
    (``of_step`` [..., T, 2], the rung of each step, broadcasting against ``steps``)."""
    hit = (of_step[..., None] == np.arange(count)) & np.asarray(steps, dtype=bool)[..., None]
    return hit.any(axis=(-3, -2))
