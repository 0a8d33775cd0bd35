"""Latency of ``ccpo serve``'s answers as histograms: time to first token and end to end.

:class:`Histogram` counts observations (seconds) in fixed buckets, as Prometheus histograms
do (cumulative ``le`` buckets, a sum and a count); :class:`Latency` holds the two that
``/metrics`` exports: ``ccpo_ttft_seconds`` (from a request's arrival to the first content
chunk sent: a chat policy's reply the policy decided to return before asking streams as the
upstream writes it, any other once the policy has chosen; unstreamed, the whole reply) and
``ccpo_latency_seconds`` (to the last byte). They are this replica's, in memory (restarts
begin again at zero), and count answered requests only. Pure Python: the server
turns them into metric families (:mod:`ccpo.runtime.server`).

Contract: docs/deploy.md, section "Metrics".
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

#: upper bounds (seconds) of the buckets, for LLM latencies: 50 ms to 60 s, no step more than
#: half again the one before it above 1 s (a 1.2 s time to first token is told from a 2 s one);
#: a cached answer falls in the first, a slower one in +Inf
BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10,
    12.5, 15, 20, 25, 30, 40, 50, 60,
)  # fmt: skip


@dataclass
class Histogram:
    """Observations in :data:`BUCKETS` (the last, ``+Inf``, catches the rest)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0
    n: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
            self.total += seconds
            self.n += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, observations ≤ le)`` per bucket, ``+Inf`` last (Prometheus's form)."""
        with self._lock:
            out, running = [], 0
            for le, c in zip([*map(str, BUCKETS), "+Inf"], self.counts, strict=True):
                running += c
                out.append((le, running))
            return out


@dataclass
class Latency:
    """The two latency histograms of one replica."""

    ttft: Histogram = field(default_factory=Histogram)
    end_to_end: Histogram = field(default_factory=Histogram)

    def observe(self, ttft: float, end_to_end: float) -> None:
        self.ttft.observe(ttft)
        self.end_to_end.observe(end_to_end)

    def families(self) -> list[tuple[str, str, Histogram]]:
        """(Prometheus name, help, histogram) of each."""
        return [
            ("ccpo_ttft_seconds", "time to the first byte of a reply's content", self.ttft),
            ("ccpo_latency_seconds", "time to the last byte of a reply", self.end_to_end),
        ]
