"""The paper-style results table, one model drawn three ways (Markdown, HTML, terminal).

:func:`results_table` turns result rows into a :class:`TableData`: cost per test split with
its ratio to the oracle floor and to always calling the strongest model, coverage against the
target 1 − α, misses beyond noise flagged (:func:`beyond_noise`: more than :data:`NOISE_SE`
standard errors under; a smaller shortfall is "within noise"), the cheapest row at the target
marked (:func:`cheapest_at_target`). :func:`render_markdown`, :func:`render_html` and
:func:`render_rich` draw any :class:`TableData` the same way; :func:`saving_line` says the
saving in words and :func:`refusal_notes` the single-answer rows Learn-then-Test refused.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ccpo.evaluation.harness import ResultRow
from ccpo.traces.labels import GOLD, against_text

MISS = "✗"
"""Marks a coverage under the target 1 − α in the Markdown tables (red in HTML and terminal)."""


def misses_target(coverage: float, alpha: float) -> bool:
    """True when a coverage, as printed (3 decimals), is below the target 1 − α: the one rule
    every table (terminal, Markdown, HTML) and every ratio line uses to flag a miss."""
    return round(coverage, 3) < round(1.0 - alpha, 3)


NOISE_SE = 2.0
"""A coverage under the target by more than this many standard errors is a miss (✗); less is
marked "within noise"."""


def coverage_se(alpha: float, n_test: int) -> float:
    """Standard error of one test split's coverage at the target: sqrt(α(1 − α)/n_test)."""
    return math.sqrt(alpha * (1.0 - alpha) / n_test)


def beyond_noise(coverage: float, alpha: float, n_test: int | None) -> bool:
    """A miss that is not sampling noise: under the target by more than :data:`NOISE_SE`
    standard errors of a test split's coverage (:func:`coverage_se`); without ``n_test`` every
    miss counts. This is what gets ✗ (red)."""
    if not misses_target(coverage, alpha):
        return False
    return n_test is None or (1.0 - alpha) - coverage > NOISE_SE * coverage_se(alpha, n_test)


def within_noise(coverage: float, alpha: float, n_test: int | None) -> bool:
    """Under the target as printed, but by less than the noise of :func:`beyond_noise`."""
    return misses_target(coverage, alpha) and not beyond_noise(coverage, alpha, n_test)


def refusal_notes(rows: Sequence[ResultRow]) -> list[str]:
    """One line per single-answer row that Learn-then-Test refused on some calibration splits
    (no threshold certified at this α: such a policy is not trained; the row scores the most
    conservative rule, all T rounds, on those splits)."""
    out = []
    for r in rows:
        share = r.extra.get("refused_share") or 0.0
        if share > 0:
            out.append(
                f"{r.policy}: no single-answer threshold certified at this α on {share:.0%} of "
                "the calibration splits (`train --answer single` refuses there; those splits "
                "are scored with all T rounds): use a larger α or answer sets"
            )
    return out


def cost_header(n_test: int | None) -> str:
    """The cost column's name: cost is the total over ONE test split, in cents."""
    return "Cost (¢ per test split" + (f" of {n_test} q.)" if n_test else ")")


def coverage_header(alpha: float | None, labels: str = GOLD) -> str:
    """ "Coverage (target ≥ 0.90)", or "Agreement with <model> (…)" for reference labels."""
    what = "Coverage" if labels == GOLD else against_text(labels).capitalize()
    return what + (f" (target ≥ {1 - alpha:.2f})" if alpha is not None else "")


#: the latency column: estimated from output tokens at a stated speed (traces.latency)
LATENCY_HEADER = "Est. latency (s)"


def latency_cell(r: ResultRow) -> str:
    """A row's estimated end-to-end seconds per question ('–' where not known)."""
    return "–" if r.latency_s is None else f"{r.latency_s:.2f}"


def always_row(rows: Sequence[ResultRow]) -> ResultRow | None:
    """The ``always-<model>`` row (calling the strongest model only), if there is one."""
    found = [r for r in rows if r.kind == "reference"]
    return found[0] if found and found[0].cost_cents > 0 else None


def saving_line(rows: Sequence[ResultRow], alpha: float, labels: str = GOLD) -> str | None:
    """The saving in words: the cheapest method meeting the target as a share of always
    calling the strongest model, with the coverage of both and the oracle ratio beside it,
    e.g. "auto costs 23% of always-gpt-4o at coverage 0.903 (…)": a share of the cost, never
    called a saving (above 100% it is dearer)."""
    ref = always_row(rows)
    if ref is None:
        return None
    what = "coverage" if labels == GOLD else against_text(labels)
    best = cheapest_at_target(rows, alpha)
    alone = f"{ref.policy} alone: {what} {ref.coverage:.3f}"
    if best is None:
        return f"no method reaches {what} {1 - alpha:.2f}; {alone}"
    r = next(x for x in rows if x.policy == best)
    floor = oracle_cost(rows)
    oracle = f", {r.cost_cents / floor:.2f}× the oracle floor" if floor else ""
    return (
        f"{best} costs {r.cost_cents / ref.cost_cents:.0%} of {ref.policy} at {what} "
        f"{r.coverage:.3f}{oracle} ({alone})"
    )


@dataclass
class TableData:
    """A table every renderer (Markdown, HTML, terminal) draws the same way: ``miss[i][j]``
    flags cell (i, j) as under the target; ``best[i][j]`` marks the cheapest at the target."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    miss: list[list[bool]]
    best: list[list[bool]]


def oracle_cost(rows: Sequence[ResultRow]) -> float | None:
    """The cost floor (the ``oracle`` row's cost), if the rows have one and it is positive."""
    floor = [r.cost_cents for r in rows if r.kind == "bound"]
    return floor[0] if floor and floor[0] > 0 else None


def cheapest_at_target(rows: Sequence[ResultRow], alpha: float) -> str | None:
    """The method (not the oracle bound, not the ``always-<model>`` yardstick) with the lowest
    cost among those meeting 1 − α."""
    ok = [
        r
        for r in rows
        if r.kind not in ("bound", "reference") and not misses_target(r.coverage, alpha)
    ]
    return min(ok, key=lambda r: r.cost_cents).policy if ok else None


def results_table(
    rows: Sequence[ResultRow],
    title: str,
    alpha: float | None = None,
    n_test: int | None = None,
    labels: str = GOLD,
) -> TableData:
    """The paper-style table with its units, the target, cost relative to the oracle floor and
    to always calling the strongest model, misses beyond noise flagged (a shortfall within
    noise is written so), and the cheapest row at the target marked."""
    floor = oracle_cost(rows)
    ref = always_row(rows)
    headers = ["Policy", cost_header(n_test)]
    headers += ["Cost / oracle"] if floor else []
    headers += [f"Cost / {ref.policy}"] if ref else []
    cov_head = coverage_header(alpha, labels)
    headers += [cov_head, "Avg. Len.", "Set Size"]
    timed = any(r.latency_s is not None for r in rows)
    headers += [LATENCY_HEADER] if timed else []
    best = cheapest_at_target(rows, alpha) if alpha is not None else None
    cells, miss = [], []
    for r in rows:
        row = [r.policy, f"{r.cost_cents:.3f}"]
        row += [f"{r.cost_cents / floor:.2f}×"] if floor else []
        row += [f"{r.cost_cents / ref.cost_cents:.2f}×"] if ref else []
        noise = alpha is not None and r.kind != "bound" and within_noise(r.coverage, alpha, n_test)
        row += [f"{r.coverage:.3f}" + (" (within noise)" if noise else "")]
        row += [f"{r.avg_len:.2f}", f"{r.set_size:.2f}"]
        row += [latency_cell(r)] if timed else []
        flag = alpha is not None and r.kind != "bound" and beyond_noise(r.coverage, alpha, n_test)
        cells.append(row)
        miss.append([flag and h == cov_head for h in headers])
    marks = [[j == 0 and r.policy == best for j in range(len(headers))] for r in rows]
    return TableData(title, headers, cells, miss, marks)


def _cell_text(c: str, miss: bool, best: bool) -> str:
    return c + (f" {MISS}" if miss else "") + (" ★" if best else "")


def render_markdown(t: TableData) -> str:
    """A Markdown table: misses get ✗, the cheapest at the target gets ★ (and bold)."""
    lines = [f"**{t.title}**", ""] if t.title else []
    lines += ["| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    for row, miss, best in zip(t.rows, t.miss, t.best, strict=True):
        cells = [
            f"**{_cell_text(c, m, b)}**" if b else _cell_text(c, m, b)
            for c, m, b in zip(row, miss, best, strict=True)
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_html(t: TableData) -> str:
    """An HTML table: misses in red (class ``miss``), the cheapest at the target in bold
    (class ``best``)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    body = []
    for row, miss, best in zip(t.rows, t.miss, t.best, strict=True):
        tds = []
        for c, m, b in zip(row, miss, best, strict=True):
            cls = " ".join(k for k, on in (("miss", m), ("best", b)) if on)
            attr = f" class='{cls}'" if cls else ""
            tds.append(f"<td{attr}>{html.escape(_cell_text(c, m, b))}</td>")
        body.append(f"<tr>{''.join(tds)}</tr>")
    cap = f"<caption>{html.escape(t.title)}</caption>" if t.title else ""
    return f"<table>{cap}<tr>{head}</tr>{''.join(body)}</table>"


def render_rich(t: TableData) -> Table:
    """The same table for the terminal: misses in red, the cheapest at the target bold."""
    out = Table(title=t.title, padding=(0, 0), pad_edge=False)
    for i, h in enumerate(t.headers):  # policy names whole; the figures' headers wrap
        out.add_column(h, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row, miss, best in zip(t.rows, t.miss, t.best, strict=True):
        cells = []
        for c, m, b in zip(row, miss, best, strict=True):
            text = escape(_cell_text(c, m, b))
            text = f"[red]{text}[/red]" if m else text
            cells.append(f"[bold]{text}[/bold]" if b else text)
        out.add_row(*cells)
    return out


def print_results(
    console: Console,
    rows: Sequence[ResultRow],
    title: str,
    alpha: float,
    splits: int,
    sizes: Sequence[int],
    labels: str = GOLD,
    simulated: str = "",
) -> None:
    """The results on the terminal: the table (:func:`rich_table`) of ``splits`` evaluation
    splits of train/cal/test ``sizes``, the saving line under it, and what is simulated
    (``simulated``: :func:`ccpo.traces.verify.simulated_note`)."""
    sizes_text = "/".join(map(str, sizes))
    head = f"{title}: α = {alpha:g}, {splits} splits, train/cal/test = {sizes_text}"
    console.print(rich_table(rows, head, alpha, sizes[2], labels))
    saving = saving_line(rows, alpha, labels)
    if saving:
        console.print(f"cheapest at the target: {saving}", highlight=False)
    if simulated:
        console.print(f"[yellow]note:[/yellow] {simulated}", highlight=False)


def rich_table(
    rows: Sequence[ResultRow],
    title: str | None = None,
    alpha: float | None = None,
    n_test: int | None = None,
    labels: str = GOLD,
) -> Table:
    """The paper-style table for the terminal; coverage under 1 − α beyond noise in red."""
    return render_rich(results_table(rows, title or "", alpha, n_test, labels))
