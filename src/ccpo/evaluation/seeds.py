"""The comparisons of ``reproduce`` and their statistics across seeds.

A :class:`Section` is one comparison (a trace set at one α and one seed, read back from its
results.json); a :class:`Group` is every seed of one set at one α. :func:`seed_summary` gives
one row per policy over the seeds (cost mean ± sd, cost / oracle floor mean ± sd, coverage
mean and lowest); :func:`ratio_lines` and :func:`seed_ratio_lines` CCPO's cost over each
strong baseline's (:data:`RATIO_BASELINES`), noting the sides that miss 1 − α.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ccpo.evaluation.harness import ResultRow
from ccpo.report.tables import misses_target, oracle_cost, saving_line
from ccpo.traces.labels import GOLD

RATIO_BASELINES = ("cpo-batch", "cpo-online", "uala")


@dataclass
class Section:
    """One comparison in the report: a trace set at one α and one seed."""

    name: str
    alpha: float
    folder: Path
    results: dict
    seed: int = 0
    kappa_online: dict[str, float] = field(default_factory=dict)  # trained π → final online κ

    @property
    def rows(self) -> list[ResultRow]:
        return [row_of(r) for r in self.results["rows"]]

    @property
    def n_test(self) -> int | None:
        return (self.results.get("sizes") or {}).get("test")


def row_of(r: dict) -> ResultRow:
    """A ``results.json`` row as a :class:`ResultRow` (the oracle is a bound, not a policy)."""
    known = {k: v for k, v in r.items() if k in ResultRow.__dataclass_fields__}
    known.setdefault("avg_len", float("nan"))
    known.setdefault("set_size", float("nan"))
    known.setdefault("kind", "bound" if r["policy"] == "oracle" else "point")
    return ResultRow(**known)


def _miss_note(name: str, coverage: float, alpha: float) -> str:
    return f"{name} misses the target: coverage {coverage:.3f} < {1 - alpha:.2f}"


def _ratio_pairs(names: list[str]) -> list[tuple[str, str]]:
    return [(o, b) for o in names if o.startswith("ccpo") for b in RATIO_BASELINES if b in names]


def ratio_lines(rows: list[dict], alpha: float) -> list[str]:
    """CCPO's cost over each strong baseline's, with a note for each side that misses 1 − α."""
    by = {r["policy"]: r for r in rows}
    out = []
    for ours, base in _ratio_pairs(list(by)):
        a, b = by[ours], by[base]
        if b["cost_cents"] == 0:
            continue
        notes = [
            _miss_note(n, x["coverage"], alpha)
            for n, x in ((base, b), (ours, a))
            if misses_target(x["coverage"], alpha)
        ]
        note = f" ({'; '.join(notes)})" if notes else ""
        out.append(f"{ours} / {base}: {a['cost_cents'] / b['cost_cents']:.3f}{note}")
    return out


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    """Mean and sample sd (0 for one value)."""
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def seed_summary(sections: list[Section]) -> list[dict]:
    """One row per policy over the seeds of one set and α: cost mean ± sd, cost relative to
    the oracle floor mean ± sd, coverage mean and the lowest seed's coverage (each seed is its
    own training run and its own splits)."""
    by_seed = [{r.policy: r for r in s.rows} for s in sections]
    floors = [oracle_cost(list(b.values())) for b in by_seed]
    out = []
    for pol, first in by_seed[0].items():
        runs = [(b[pol], f) for b, f in zip(by_seed, floors, strict=True) if pol in b]
        cost, cost_sd = _mean_sd([r.cost_cents for r, _ in runs])
        rel = [r.cost_cents / f for r, f in runs if f]
        rel_mean, rel_sd = _mean_sd(rel) if rel else (None, None)
        cov = [r.coverage for r, _ in runs]
        out.append(
            {"policy": pol, "kind": first.kind, "seeds": len(runs), "cost_cents": cost,
             "cost_sd": cost_sd, "rel": rel_mean, "rel_sd": rel_sd,
             "coverage": statistics.fmean(cov), "coverage_min": min(cov),
             "misses": sum(misses_target(c, sections[0].alpha) for c in cov)}
        )  # fmt: skip
    return out


def seed_ratio_lines(sections: list[Section]) -> list[str]:
    """CCPO's cost over each strong baseline's, per seed and their mean, noting the seeds in
    which either side misses 1 − α."""
    alpha = sections[0].alpha
    by_seed = [(s.seed, {r["policy"]: r for r in s.results["rows"]}) for s in sections]
    out = []
    for ours, base in _ratio_pairs(list(by_seed[0][1])):
        pairs = [(k, b) for k, b in by_seed if ours in b and base in b and b[base]["cost_cents"]]
        if not pairs:
            continue
        ratios = [b[ours]["cost_cents"] / b[base]["cost_cents"] for _, b in pairs]
        each = ", ".join(f"{r:.3f}" for r in ratios)
        notes = []
        for name in (base, ours):
            seeds = [str(k) for k, b in pairs if misses_target(b[name]["coverage"], alpha)]
            if seeds:
                notes.append(f"{name} misses the target in seed {', '.join(seeds)}")
        note = f"; {'; '.join(notes)}" if notes else ""
        out.append(f"{ours} / {base}: mean {statistics.fmean(ratios):.3f} (seeds: {each}{note})")
    return out


@dataclass
class Group:
    """Every seed of one trace set at one α."""

    name: str
    alpha: float
    sections: list[Section]

    @property
    def summary(self) -> list[dict]:
        return seed_summary(self.sections)

    @property
    def n_test(self) -> int | None:
        return self.sections[0].n_test

    @property
    def label(self) -> str:
        return f"{self.name}, α = {self.alpha:g}"

    @property
    def labels(self) -> str:
        """What correct means in these traces (``results.json`` ``against``)."""
        return self.sections[0].results.get("against", GOLD)

    @property
    def saving(self) -> str | None:
        """:func:`ccpo.report.tables.saving_line` on the (seed-averaged) rows."""
        line = saving_line([row_of(r) for r in self.summary], self.alpha, self.labels)
        return None if line is None else f"{self.label}: {line}"


def groups_of(sections: list[Section]) -> list[Group]:
    """Sections grouped by (set, α), in report order."""
    keys = dict.fromkeys((s.name, s.alpha) for s in sections)
    return [Group(n, a, [s for s in sections if (s.name, s.alpha) == (n, a)]) for n, a in keys]
