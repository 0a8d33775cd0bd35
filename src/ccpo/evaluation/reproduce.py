"""``ccpo reproduce``: every bundled real trace set × every α through ``compare``, then one
report (Markdown, and HTML with the plots inline) with the paper-style tables, the box plots,
the training curves and a cost-vs-coverage frontier across α."""

from __future__ import annotations

import base64
import html
import json
import os
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from rich.console import Console

from ccpo.errors import CCPOError
from ccpo.evaluation.comparison import run_compare, start_training
from ccpo.evaluation.harness import ResultRow
from ccpo.evaluation.rows import training_pool
from ccpo.learning.methods import variant_name
from ccpo.report.tables import (
    MISS,
    TableData,
    beyond_noise,
    cheapest_at_target,
    cost_header,
    coverage_header,
    misses_target,
    oracle_cost,
    pyplot,
    refusal_notes,
    render_html,
    render_markdown,
    results_table,
    saving_line,
    within_noise,
)
from ccpo.traces.labels import GOLD, against_text

QUICK = {"splits": 20, "steps": 200}
FULL = {"splits": 100, "steps": 2000}
RATIO_BASELINES = ("cpo-batch", "cpo-online", "uala")
KAPPA_COLLAPSED = 1e-3
"""A κ below this is reported as collapsed (the set holds every action)."""


def bundled_sets(folder: Path | None = None) -> dict[str, Path]:
    """Name → path of every trace set (``NAME.jsonl.gz``) shipped in ``ccpo/data/traces``
    (or in ``folder``): a set added there is picked up by ``reproduce`` with no code change."""
    folder = folder or resources.files("ccpo.data").joinpath("traces")
    out = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".jsonl.gz"):
            out[entry.name.removesuffix(".jsonl.gz")] = Path(str(entry))
    return dict(sorted(out.items()))


def resolve_data(data: Sequence[str] | None) -> dict[str, Path]:
    """``--data`` values (bundled names or files) → name → path; none means every bundled set."""
    sets = bundled_sets()
    if not data:
        if not sets:
            raise CCPOError("no bundled trace sets found in the package; pass --data FILE")
        return sets
    out = {}
    for d in data:
        if d in sets:
            out[d] = sets[d]
        elif Path(d).is_file():
            name = Path(d).name
            for suffix in (".gz", ".jsonl"):
                name = name.removesuffix(suffix)
            out[name] = Path(d)
        else:
            raise CCPOError(
                f"--data {d!r} is neither a bundled set ({', '.join(sets) or 'none'}) nor a file"
            )
    return out


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


def _seed_table(rows: list[dict], title: str, alpha: float, n_test: int | None) -> TableData:
    """The across-seeds table of one set and α (rows from :func:`seed_summary`)."""
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


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "p", "*")


def frontier_points(sections: list[Section]) -> list[tuple[list[str], list[tuple]]]:
    """(policies, [(coverage, cost) per α in the order of ``sections``]) with the policies
    whose points coincide at every α in one entry (a plot would draw one over the other)."""
    policies: dict[str, list[tuple[float, float]]] = {}
    for s in sections:
        for r in s.rows:
            policies.setdefault(r.policy, []).append((r.coverage, r.cost_cents))
    same: dict[tuple, list[str]] = {}
    for pol, pts in policies.items():
        same.setdefault(tuple((round(x, 6), round(y, 6)) for x, y in pts), []).append(pol)
    return [(names, policies[names[0]]) for names in same.values()]


def frontier_plot(name: str, sections: list[Section], out: Path) -> Path:
    """Cost vs coverage of every row, a line per policy across α (filled marker at the
    smallest α, hollow at the others), each target 1 − α drawn and labelled; policies whose
    points coincide at every α are named together in the legend (``cpo = guide``)."""
    sections = sorted(sections, key=lambda s: s.alpha)
    alphas = [s.alpha for s in sections]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.get_cmap("tab20").colors
    for i, (names, pts) in enumerate(frontier_points(sections)):
        xs, ys = zip(*pts, strict=True)
        color = "black" if names[0] == "oracle" else colors[(2 * i) % 20]
        marker = "*" if names[0] == "oracle" else MARKERS[i % len(MARKERS)]
        ls = "-" if names[0].startswith("ccpo") else ("--" if names[0].startswith("cpo") else ":")
        label = " = ".join(names) + (" (bound)" if names[0] == "oracle" else "")
        ax.plot(xs, ys, ls, marker=marker, color=color, lw=1.2, ms=7, mfc="white", label=label)
        ax.plot(xs[0], ys[0], marker, color=color, ms=7)  # filled: the smallest α, on top
    for a in alphas:
        ax.axvline(1 - a, color="tab:red", ls=":", lw=0.9)
        ax.text(1 - a, 1.0, f" target 1−α = {1 - a:.2f} (α = {a:g})", rotation=90,
                va="top", ha="right", fontsize=7, color="tab:red",
                transform=ax.get_xaxis_transform())  # fmt: skip
    n_test = sections[0].n_test if sections else None
    ax.set_xlabel("coverage (mean over evaluation splits)")
    ax.set_ylabel(cost_header(n_test).replace("¢", "cents"))
    fill = ", ".join(
        f"{'filled' if j == 0 else 'hollow'} marker: α = {a:g}" for j, a in enumerate(alphas)
    )
    ax.set_title(f"{name}: cost vs coverage across α ({fill})", fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def _inline_code(escaped: str) -> str:
    """Markdown `code` spans as HTML <code> (on already-escaped text)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)


class Doc:
    """The report as Markdown and HTML at once: every block is written to both, so the two
    never disagree (tables come from one :class:`TableData`)."""

    def __init__(self, out: Path, title: str) -> None:
        self.out = out
        self.md: list[str] = [f"# {title}", ""]
        self.html: list[str] = [
            f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;max-width:1150px;margin:auto;padding:0 1em}"
            "table{border-collapse:collapse;margin:.6em 0}caption{text-align:left;"
            "font-weight:bold;padding:.3em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
            "text-align:right}td:first-child,th:first-child{text-align:left}"
            "th{background:#f3f3f3}td.miss{color:#b00;background:#fde8e8}"
            "td.best{font-weight:bold;background:#e6f4e6}p.note{color:#555}"
            "p.caveat{background:#fff6d6;padding:.5em;border-left:4px solid #e0b000}"
            "</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
        ]

    def heading(self, text: str, level: int = 2) -> None:
        self.md += ["#" * level + " " + text, ""]
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def para(self, text: str, cls: str = "") -> None:
        self.md += [text, ""]
        attr = f" class='{cls}'" if cls else ""
        self.html.append(f"<p{attr}>{_inline_code(html.escape(text))}</p>")

    def bullets(self, items: list[str]) -> None:
        if not items:
            return
        self.md += [f"- {x}" for x in items] + [""]
        self.html.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in items) + "</ul>")

    def table(self, t: TableData) -> None:
        self.md += [render_markdown(t)]
        self.html.append(render_html(t))

    def images(self, paths: list[Path], alts: list[str]) -> None:
        links = (f"![{a}]({p.relative_to(self.out)})" for p, a in zip(paths, alts, strict=True))
        self.md += [" ".join(links), ""]
        self.html += [_img(p) for p in paths]

    def write(self) -> tuple[Path, Path]:
        md_path, html_path = self.out / "report.md", self.out / "report.html"
        md_path.write_text("\n".join(self.md) + "\n", encoding="utf-8")
        html_path.write_text("\n".join([*self.html, "</body></html>"]) + "\n", encoding="utf-8")
        return md_path, html_path


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
        "Learn-then-Test, so the guarantee holds with probability ≥ 1 − δ)."
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
            doc.bullets(
                [
                    f"{m}: {p['input_usd_per_mtok']:g} / {p['output_usd_per_mtok']:g}"
                    + (f" — {p['source']}" if p.get("source") else "")
                    for m, p in prices.items()
                ]
            )
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
        doc.heading("cost vs coverage across α", 3)
        doc.images([frontiers[name]], ["frontier"])
    return doc.write()


def run_reproduce(
    out: Path,
    data: Sequence[str] | None = None,
    alphas: Sequence[float] = (0.1, 0.2),
    splits: int | None = None,
    steps: int | None = None,
    quick: bool = False,
    seeds: Sequence[int] = (0,),
    console: Console | None = None,
    workers: int | None = None,
) -> dict:
    """``workers``: processes for the training runs of every comparison [CPU cores].
    ``seeds``: one comparison per seed (its own splits and training runs); with more than one,
    the report adds across-seeds tables and ratios (mean ± sd), and folders get ``seed-S``."""
    seeds = list(dict.fromkeys(seeds)) or [0]
    console = console or Console()
    preset = QUICK if quick else FULL
    splits = preset["splits"] if splits is None else splits
    steps = preset["steps"] if steps is None else steps
    if splits < 1 or steps < 1:
        raise CCPOError(f"--splits and --steps must be at least 1, got {splits} and {steps}")
    t0 = time.perf_counter()
    sets = resolve_data(data)
    sections: list[Section] = []
    runs = [
        (name, path, alpha, seed)
        for name, path in sets.items()
        for alpha in alphas
        for seed in seeds
    ]
    # one pool for every comparison's training runs, all submitted up front: processes start
    # once, and the next α trains while this one is evaluated and plotted
    with training_pool(workers or os.cpu_count() or 1) as pool:
        caches = [
            start_training(path, pool, alpha=alpha, splits=splits, steps=steps, seed=seed)
            for _, path, alpha, seed in runs
        ]
        for (name, path, alpha, seed), cache in zip(runs, caches, strict=True):
            folder = out / name / f"alpha-{alpha:g}"
            if len(seeds) > 1:
                folder = folder / f"seed-{seed}"
            console.rule(f"{name}, α = {alpha:g}" + (f", seed {seed}" if len(seeds) > 1 else ""))
            run_compare(
                path,
                folder,
                alpha=alpha,
                splits=splits,
                steps=steps,
                seed=seed,
                console=console,
                title=name,
                cache=cache,
            )
            results = json.loads((folder / "results.json").read_text())
            kappas = {variant_name(m, lam): p.kappa_online for (m, lam), p in cache.trained.items()}
            sections.append(Section(name, alpha, folder, results, seed, kappas))
    frontiers = {  # the first seed's runs
        n: frontier_plot(
            n, [s for s in sections if s.name == n and s.seed == seeds[0]], out / n / "frontier.png"
        )
        for n in sets
    }
    meta = {
        "alphas": list(alphas),
        "splits": splits,
        "steps": steps,
        "seeds": seeds,
        "quick": quick,
        "seconds": time.perf_counter() - t0,
        "data": {k: str(v) for k, v in sets.items()},
    }
    md, page = write_report(out, sections, frontiers, meta)
    (out / "reproduce.json").write_text(json.dumps(meta, indent=1) + "\n")
    console.print(f"reproduce took {meta['seconds']:.0f} s; report: {md} and {page}")
    return meta
