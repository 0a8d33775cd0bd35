"""Streaming statistics of a trace file (``ccpo traces stats``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ccpo.errors import UnknownModelPriceError
from ccpo.traces.labels import trace_labels
from ccpo.traces.ladder import Ladder, ladder_of_trace
from ccpo.traces.prices import PriceTable
from ccpo.traces.schema import Trace
from ccpo.traces.verify import simulated_of


@dataclass
class RoundStats:
    n: int = 0
    base_correct: int = 0
    guide_correct: int = 0
    verdict_yes: int = 0
    base_tokens: int = 0
    guide_tokens: int = 0
    cost_usd: float = 0.0


@dataclass
class TraceStats:
    """Accumulated over a stream of traces; one pass, constant memory per round."""

    questions: int = 0
    solvable: int = 0
    tasks: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)
    rounds_hist: dict[int, int] = field(default_factory=dict)
    per_round: list[RoundStats] = field(default_factory=list)
    ladders: dict[Ladder, int] = field(default_factory=dict)  # ladder → traces following it
    labels: set[str] = field(default_factory=set)  # "gold" / "reference:<model>" (traces.labels)
    simulated: dict | None = None  # meta.simulated_verifier of the first trace with one

    def add(self, tr: Trace, prices: PriceTable) -> None:
        self.questions += 1
        lad = ladder_of_trace(tr)
        if lad in self.ladders or len(self.ladders) < 8:  # a few distinct ones at most
            self.ladders[lad] = self.ladders.get(lad, 0) + 1
        self.solvable += tr.solvable
        self.labels.add(trace_labels(tr))
        self.simulated = self.simulated or simulated_of([tr])
        self.tasks.add(tr.task)
        self.models |= tr.models()
        self.rounds_hist[tr.n_rounds] = self.rounds_hist.get(tr.n_rounds, 0) + 1
        while len(self.per_round) < tr.n_rounds:
            self.per_round.append(RoundStats())
        for r, s in zip(tr.rounds, self.per_round, strict=False):
            b, g = r.base, r.guide
            s.n += 1
            s.base_correct += b.correct
            s.guide_correct += g.correct
            s.verdict_yes += g.verdict == "yes"
            s.base_tokens += b.usage.input_tokens + b.usage.output_tokens
            s.guide_tokens += g.usage.input_tokens + g.usage.output_tokens
            cb, cg = prices.round_costs(r)
            s.cost_usd += cb
            s.cost_usd += cg

    def table(self) -> list[dict[str, float]]:
        """Per round: accuracies, yes-rate, mean tokens, mean cost in cents."""
        return [
            {
                "round": t,
                "n": s.n,
                "base_acc": s.base_correct / s.n,
                "guide_acc": s.guide_correct / s.n,
                "verdict_yes": s.verdict_yes / s.n,
                "base_tokens": s.base_tokens / s.n,
                "guide_tokens": s.guide_tokens / s.n,
                "cost_cents": 100 * s.cost_usd / s.n,
            }
            for t, s in enumerate(self.per_round, start=1)
        ]

    def ladder(self) -> Ladder | None:
        """The ladder every trace follows, or None when they differ."""
        return next(iter(self.ladders)) if len(self.ladders) == 1 else None

    @property
    def solvable_rate(self) -> float:
        return self.solvable / self.questions if self.questions else float("nan")


def trace_stats(traces: Iterable[Trace], prices: PriceTable) -> TraceStats:
    """The statistics of ``traces`` in one pass. Models without a price are gathered over the
    whole stream and refused together at the end (one error naming all of them)."""
    st = TraceStats()
    seen: set[str] = set()
    missing: set[str] = set()
    for tr in traces:
        paid = {m for r in tr.rounds for m in (r.base.model, r.guide.model)}
        missing |= {m for m in paid - seen if not prices.has(m)}
        seen |= paid
        if not missing:
            st.add(tr, prices)
    if missing:
        raise UnknownModelPriceError(*sorted(missing))
    return st


__all__ = ["RoundStats", "TraceStats", "trace_stats"]
