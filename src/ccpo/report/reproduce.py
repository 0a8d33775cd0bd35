"""The ``reproduce`` report: report.md and report.html over every trace set, α and seed.

:func:`write_report` writes, with one :class:`~ccpo.report.document.Doc`: the saving per set
and α, the summary across sets (:func:`summary_table`: cost / oracle floor and coverage, mean
± sd across seeds), a headline per set and α (:func:`headline`), how sure the figures are
(:func:`spread_line`), then per set its prices, tables, CCPO's cost ratios, box plots,
training curves (with :func:`kappa_notes`) and the cost-vs-coverage frontier. The runs and
their statistics across seeds are :mod:`ccpo.evaluation.reproduce` and
:mod:`ccpo.evaluation.seeds`.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ccpo.evaluation.seeds import (
    Group,
    Section,
    groups_of,
    ratio_lines,
    row_of,
    seed_ratio_lines,
)
from ccpo.report.document import Doc
from ccpo.report.money import MONEY_NOTE, money_table
from ccpo.report.results import price_items
from ccpo.report.tables import (
    MISS,
    TableData,
    beyond_noise,
    cheapest_at_target,
    cost_header,
    coverage_header,
    misses_target,
    oracle_cost,
    refusal_notes,
    results_table,
    within_noise,
)
from ccpo.traces.labels import GOLD, against_text

KAPPA_COLLAPSED = 1e-3
"""A κ below this is reported as collapsed (the set holds every action)."""


def _seed_table(rows: list[dict], title: str, alpha: float, n_test: int | None) -> TableData:
    """The across-seeds table of one set and α (rows from
    :func:`~ccpo.evaluation.seeds.seed_summary`)."""
    headers = [
        "Policy",
        f"{cost_header(n_test)}, mean ± sd",
        "Cost / oracle, mean ± sd",
        f"{coverage_header(alpha)}, mean",
        "Coverage, lowest seed",
    ]
    best = _cheapest(rows, alpha)
    cells, miss, marks = [], [], []
    for r in rows:
        rel = "–" if r["rel"] is None else f"{r['rel']:.2f} ± {r['rel_sd']:.2f}×"
        cells.append(
            [r["policy"], f"{r['cost_cents']:.3f} ± {r['cost_sd']:.3f}", rel,
             f"{r['coverage']:.3f}", f"{r['coverage_min']:.3f}"]
        )  # fmt: skip
        flag = r["kind"] != "bound"
        miss.append(
            [False, False, False, flag and beyond_noise(r["coverage"], alpha, n_test),
             flag and beyond_noise(r["coverage_min"], alpha, n_test)]
        )  # fmt: skip
        marks.append([r["policy"] == best] + [False] * 4)
    return TableData(title, headers, cells, miss, marks)


def _cheapest(rows: list[dict], alpha: float) -> str | None:
    """:func:`cheapest_at_target` of summary rows (dicts with policy, cost, coverage, kind)."""
    return cheapest_at_target([row_of(r) for r in rows], alpha)


def summary_table(groups: list[Group]) -> TableData:
    """The report's opening table: one column per (set, α), one row per policy; each cell is
    cost / oracle floor and coverage (mean ± sd across seeds when there are several)."""
    headers = ["Policy"]
    cols = []
    for g in groups:
        floors = [f for f in (oracle_cost(s.rows) for s in g.sections) if f]
        floor = statistics.fmean(floors) if floors else None
        per = f" of {g.n_test} q." if g.n_test else ""
        oracle = f"; oracle {floor:.2f}¢ per split{per}" if floor else ""
        what = "coverage" if g.labels == GOLD else against_text(g.labels)
        headers.append(f"{g.label}: cost / oracle · {what} (target ≥ {1 - g.alpha:.2f}{oracle})")
        cols.append({r["policy"]: r for r in g.summary})
    names = [n for n in dict.fromkeys(p for c in cols for p in c) if n != "oracle"]
    multi = any(len(g.sections) > 1 for g in groups)
    cells, miss, marks = [], [], []
    for n in names:
        row, m, b = [n], [False], [False]
        for g, col in zip(groups, cols, strict=True):
            r = col.get(n)
            if r is None:
                row.append("–")
                m.append(False)
                b.append(False)
                continue
            rel = "–" if r["rel"] is None else f"{r['rel']:.2f}"
            if multi and r["rel"] is not None:
                rel += f" ± {r['rel_sd']:.2f}"
            noise = r["kind"] != "bound" and within_noise(r["coverage"], g.alpha, g.n_test)
            row.append(f"{rel}× · {r['coverage']:.3f}" + (" (within noise)" if noise else ""))
            m.append(r["kind"] != "bound" and beyond_noise(r["coverage"], g.alpha, g.n_test))
            b.append(n == _cheapest(list(col.values()), g.alpha))
        cells.append(row)
        miss.append(m)
        marks.append(b)
    return TableData("", headers, cells, miss, marks)


def headline(g: Group) -> str:
    """Which method is cheapest at the target, by how much, and how sure we are (the oracle
    bound and the always-<model> yardstick are not candidates: the saving line has the
    latter)."""
    rows = [r for r in g.summary if r["kind"] not in ("bound", "reference")]
    ok = sorted(
        (r for r in rows if not misses_target(r["coverage"], g.alpha)),
        key=lambda r: r["cost_cents"],
    )
    if not ok:
        return f"{g.label}: no policy reaches the target coverage {1 - g.alpha:.2f}."
    win = ok[0]
    rel = "" if win["rel"] is None else f", {win['rel']:.2f}× the oracle floor"
    line = f"{g.label}: cheapest at the target is {win['policy']}{rel}"
    if len(ok) > 1:
        nxt = ok[1]
        gap = 1 - win["cost_cents"] / nxt["cost_cents"]
        line += (
            f", tied with {nxt['policy']} (within 0.5%)"
            if gap < 0.005
            else f", {gap:.0%} cheaper than the next, {nxt['policy']}"
        )
    if len(g.sections) > 1:
        wins = sum(cheapest_at_target(s.rows, g.alpha) == win["policy"] for s in g.sections)
        missed = f"; it misses the target in {win['misses']} of them" if win["misses"] else ""
        line += (
            f" (means over {len(g.sections)} seeds; cheapest at the target in {wins} of "
            f"{len(g.sections)} seeds{missed}; its cost / oracle sd across seeds "
            f"{win['rel_sd'] or 0:.2f})"
        )
    else:
        line += f" ({_split_spread(g.sections[0], win['policy'])}; one seed)"
    return line + "."


def _split_spread(s: Section, policy: str) -> str:
    """The sd over the evaluation splits of a row's cost / oracle (test-split noise only)."""
    by = {r.policy: r for r in s.rows}
    floor = [r for r in s.rows if r.kind == "bound"]
    pol = by[policy]
    if not floor or not pol.cost_cents_per_split:
        return f"{len(pol.cost_cents_per_split)} splits"
    ratios = [
        c / f
        for c, f in zip(pol.cost_cents_per_split, floor[0].cost_cents_per_split, strict=True)
        if f > 0
    ]
    sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    return f"sd {sd:.2f} over {len(ratios)} evaluation splits"


SINGLE_SEED_CAVEAT = (
    "How sure: this is ONE seed. Every row that learns from the training split (cpo*, ccpo*, "
    "cstop, auto, …) is a single training run on one split; on a few hundred questions its "
    "cost can move by tens of percent from seed to seed, so the order of close rows, and the "
    "headline ratios, can flip between runs. Rerun with `--seed 0 --seed 1 --seed 2` for mean "
    "± sd across seeds. The split-to-split sd above measures test-split noise only."
)


def spread_line(groups: list[Group]) -> str:
    """An honest line on seed-to-seed spread: measured when there are several seeds."""
    seeds = max(len(g.sections) for g in groups)
    if seeds < 2:
        return SINGLE_SEED_CAVEAT
    worst = max(
        ((r["rel_sd"], r["policy"], g.label) for g in groups for r in g.summary
         if r["rel_sd"] is not None and r["kind"] != "bound"),
        default=None,
    )  # fmt: skip
    line = (
        f"How sure: ± is the sd across {seeds} seeds (each seed trains its own policies on "
        "its own split and draws its own evaluation splits)."
    )
    if worst:
        line += (
            f" The largest seed-to-seed sd of cost / oracle is {worst[0]:.2f} "
            f"({worst[1]}, {worst[2]}); a difference between two rows smaller than about "
            "twice that is not resolved by these seeds."
        )
    return line


def kappa_notes(s: Section) -> list[str]:
    """Say when a trained policy's online κ collapsed to (nearly) 0 during training: the κ
    panel of the training curves then shows a policy that stopped trading coverage for cost."""
    out = []
    for name, k in s.kappa_online.items():
        if k >= KAPPA_COLLAPSED:
            continue
        use = (
            "cpo-online scores with this κ as is"
            if name == "cpo"
            else f"the {name} row re-calibrates κ̂ on each calibration split, so its coverage "
            "still holds, but its sets were not learned to be small"
        )
        out.append(
            f"{name}: the online κ collapsed to {k:.2g} during training (κ panel of the "
            f"training curves): C(o) keeps every action with π ≥ κ, so its online sets are "
            f"near their largest; {use}."
        )
    return out


def write_report(
    out: Path, sections: list[Section], frontiers: dict[str, Path], meta: dict
) -> tuple[Path, Path]:
    """``report.md`` and ``report.html``: the summary across sets first (cost / oracle floor
    and coverage against the target, misses flagged, the cheapest at the target marked, how
    sure), then per set: tables, ratio lines, box plots, training curves and the frontier."""
    groups = groups_of(sections)
    multi = len(meta["seeds"]) > 1
    doc = Doc(out, "ccpo reproduce")
    doc.para(
        f"Settings: α ∈ {{{', '.join(f'{a:g}' for a in meta['alphas'])}}}, "
        f"{meta['splits']} evaluation splits, {meta['steps']} training steps per method, "
        f"seed {', '.join(str(x) for x in meta['seeds'])}"
        f"{' (--quick)' if meta['quick'] else ''}. Wall time {meta['seconds']:.0f} s."
    )
    doc.para(
        "Data are real answers of real LLMs from public run logs (see each set's data card); "
        "they are not the paper's traces. Cost is the API cost of answering one test split "
        "(the number of questions is in each header), in cents, averaged over the evaluation "
        "splits. `oracle` is a cost floor (it knows which round first holds a correct "
        "answer), not a policy: cost / oracle = 1.00× would be perfect."
    )
    doc.para(MONEY_NOTE + " One such table closes each set's section at each α.")
    savings = [g.saving for g in groups if g.saving]
    if savings:
        doc.heading("The saving")
        doc.para(
            "Per set and α: the cheapest method that meets the target, as a share of the cost of "
            "always calling the strongest model of the ladder (the `always-<model>` row: that "
            "model alone on every question, with its own coverage), beside its oracle ratio."
        )
        doc.bullets(savings)
    doc.heading("Summary across sets")
    doc.para(
        f"Each cell: cost / oracle floor · coverage{' (mean ± sd across seeds)' if multi else ''}."
        f" {MISS} marks a coverage under the target 1 − α by more than two standard errors of a "
        "test split's coverage, sqrt(α(1 − α)/n_test); a smaller shortfall is marked (within "
        "noise); ★ marks the cheapest method that meets the target in its column. Rows "
        "`*-single` return exactly one answer per question (set size 1; calibrated by "
        "conformal risk control: the guarantee holds on average over calibration draws, "
        "as split conformal's for the sets)."
    )
    doc.table(summary_table(groups))
    doc.bullets(
        [headline(g) for g in groups]
        + [f"{s.name}, α = {s.alpha:g}: {n}" for s in sections for n in refusal_notes(s.rows)]
    )
    doc.para(spread_line(groups), "caveat" if not multi else "note")
    for name in dict.fromkeys(s.name for s in sections):
        doc.heading(name)
        prices = next(s for s in sections if s.name == name).results.get("prices")
        if prices:
            doc.para("Prices the figures use (USD per million input / output tokens; the source "
                     "says where a price stands in for another model's):")  # fmt: skip
            doc.bullets(price_items(prices))
        for g in [g for g in groups if g.name == name]:
            if multi:
                title = f"{g.label}, across seeds {', '.join(str(s.seed) for s in g.sections)}"
                doc.table(_seed_table(g.summary, title, g.alpha, g.n_test))
                doc.para("CCPO cost ratios over seeds (lower is cheaper):")
                doc.bullets(seed_ratio_lines(g.sections) or ["n/a"])
            for s in g.sections:
                title = g.label + (f", seed {s.seed}" if multi else "")
                doc.heading(title, 3)
                doc.table(results_table(s.rows, "", s.alpha, s.n_test, g.labels))
                doc.para("CCPO cost ratios (lower is cheaper):")
                doc.bullets(ratio_lines(s.results["rows"], s.alpha) or ["n/a"])
                doc.images(
                    [s.folder / "box_coverage.png", s.folder / "box_cost.png"],
                    ["coverage", "cost"],
                )
                doc.images([s.folder / "training_curves.png"], ["training curves"])
                doc.bullets(kappa_notes(s))
                money = money_table(s.rows, s.n_test, "")
                if money.rows:
                    doc.heading("Where the money goes (paid · returned)", 4)
                    doc.table(money)
        doc.heading("cost vs coverage across α", 3)
        doc.images([frontiers[name]], ["frontier"])
    return doc.write("report")
