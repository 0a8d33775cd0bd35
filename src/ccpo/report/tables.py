"""Result files and plots: ``results.json`` (contract), ``results.md``, ``results.csv``, box plots.

``results.json`` follows DESIGN.md ("Results file"): ``{"schema": "ccpo.results/v1", "traces",
"alpha", "splits", "seed", "rows": [...]}``; each row has the paper's columns plus per-split lists.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import html
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from ccpo import __version__
from ccpo.errors import import_extra
from ccpo.evaluation.harness import ResultRow
from ccpo.traces.labels import GOLD, against_text, reference_model

RESULTS_SCHEMA = "ccpo.results/v1"
COLUMNS = ("Policy", "Cost (cents)", "Coverage", "Avg. Len.", "Set Size")
"""Columns of ``results.csv`` (a machine-readable file: fixed names, no units in them)."""
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
    what = "Coverage" if reference_model(labels) is None else against_text(labels).capitalize()
    return what + (f" (target ≥ {1 - alpha:.2f})" if alpha is not None else "")


def always_row(rows: Sequence[ResultRow]) -> ResultRow | None:
    """The ``always-<model>`` row (calling the strongest model only), if there is one."""
    found = [r for r in rows if r.kind == "reference"]
    return found[0] if found and found[0].cost_cents > 0 else None


def saving_line(rows: Sequence[ResultRow], alpha: float, labels: str = GOLD) -> str | None:
    """The saving in words: the cheapest method meeting the target as a share of always
    calling the strongest model, with the coverage of both and the oracle ratio beside it,
    e.g. "auto: 23% of always-gpt-4o at coverage 0.903 (…)"."""
    ref = always_row(rows)
    if ref is None:
        return None
    what = "coverage" if reference_model(labels) is None else against_text(labels)
    best = cheapest_at_target(rows, alpha)
    alone = f"{ref.policy} alone: {what} {ref.coverage:.3f}"
    if best is None:
        return f"no method reaches {what} {1 - alpha:.2f}; {alone}"
    r = next(x for x in rows if x.policy == best)
    floor = oracle_cost(rows)
    oracle = f", {r.cost_cents / floor:.2f}× the oracle floor" if floor else ""
    return (
        f"{best}: {r.cost_cents / ref.cost_cents:.0%} of {ref.policy} at {what} "
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
    headers += [coverage_header(alpha, labels), "Avg. Len.", "Set Size"]
    best = cheapest_at_target(rows, alpha) if alpha is not None else None
    cells, miss = [], []
    for r in rows:
        row = [r.policy, f"{r.cost_cents:.3f}"]
        row += [f"{r.cost_cents / floor:.2f}×"] if floor else []
        row += [f"{r.cost_cents / ref.cost_cents:.2f}×"] if ref else []
        noise = alpha is not None and r.kind != "bound" and within_noise(r.coverage, alpha, n_test)
        row += [f"{r.coverage:.3f}" + (" (within noise)" if noise else "")]
        row += [f"{r.avg_len:.2f}", f"{r.set_size:.2f}"]
        flag = alpha is not None and r.kind != "bound" and beyond_noise(r.coverage, alpha, n_test)
        cells.append(row)
        miss.append([flag and h == headers[-3] for h in headers])
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
    out = Table(title=t.title)
    for i, h in enumerate(t.headers):
        out.add_column(h, justify="left" if i == 0 else "right")
    for row, miss, best in zip(t.rows, t.miss, t.best, strict=True):
        cells = []
        for c, m, b in zip(row, miss, best, strict=True):
            text = escape(_cell_text(c, m, b))
            text = f"[red]{text}[/red]" if m else text
            cells.append(f"[bold]{text}[/bold]" if b else text)
        out.add_row(*cells)
    return out


def results_document(rows: Sequence[ResultRow], **meta: Any) -> dict[str, Any]:
    """The ``results.json`` object."""
    return {
        "schema": RESULTS_SCHEMA,
        **meta,
        "ccpo_version": __version__,
        "rows": [r.to_json() for r in rows],
    }


def markdown_table(
    rows: Sequence[ResultRow],
    title: str | None = None,
    alpha: float | None = None,
    n_test: int | None = None,
    labels: str = GOLD,
) -> str:
    return render_markdown(results_table(rows, title or "", alpha, n_test, labels))


def rich_table(
    rows: Sequence[ResultRow],
    title: str | None = None,
    alpha: float | None = None,
    n_test: int | None = None,
    labels: str = GOLD,
) -> Table:
    """The paper-style table for the terminal; coverage under 1 − α beyond noise in red."""
    return render_rich(results_table(rows, title or "", alpha, n_test, labels))


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend. matplotlib is the ``train`` extra
    (plots come with training, comparing and reproducing; serving never draws)."""
    import_extra("matplotlib", "train", "plotting").use("Agg")
    import matplotlib.pyplot as plt

    return plt


def box_plots(rows: Sequence[ResultRow], alpha: float, out: Path, title: str = "") -> list[Path]:
    """Box plots of coverage and cost over the evaluation splits (1−α line on coverage)."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    names = [r.policy for r in rows]
    paths = []
    for key, label, fname in (
        ("coverage_per_split", "Coverage", "box_coverage.png"),
        ("cost_cents_per_split", "Cost per test split (cents)", "box_cost.png"),
    ):
        fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) + 2), 3.6))
        ax.boxplot([getattr(r, key) for r in rows], showfliers=True)
        ax.set_xticks(range(1, len(rows) + 1), names, rotation=30, ha="right")
        ax.set_ylabel(label)
        if key == "coverage_per_split":
            ax.axhline(1 - alpha, color="tab:red", ls="--", lw=1, label=f"1−α = {1 - alpha:g}")
            ax.legend(loc="lower right", fontsize=8)
        n = len(rows[0].coverage_per_split) if rows else 0
        ax.set_title(f"{title} {label.lower()} over {n} splits, α = {alpha:g}".strip(), fontsize=10)
        fig.tight_layout()
        p = out / fname
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A fresh hidden sibling folder of ``out`` to write files into; when the block ends
    without error they move into ``out`` (made if need be; files of the same names replaced),
    and the sibling goes in every case. A failed write (a full disk) so leaves ``out`` as it
    was, with no half-made files; it is raised as an :class:`OSError` naming the file in
    ``out`` (torch reports one as a ``RuntimeError``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        try:
            yield tmp
        except OSError as e:
            where = out / Path(e.filename).name if e.filename else out
            raise OSError(e.errno, e.strerror or str(e), str(where)) from None
        except RuntimeError as e:  # torch.save's write failures
            msg = f"cannot write the files ({str(e).splitlines()[0]})"
            raise OSError(errno.EIO, msg, str(out)) from None
        out.mkdir(exist_ok=True)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "policy.json"):  # it last
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_results(
    out: Path, rows: Sequence[ResultRow], alpha: float, title: str = "", **meta: Any
) -> dict[str, Path]:
    """Write results.json, results.md, results.csv and the two box plots into ``out`` (all or
    none of them: see :func:`staged_folder`); returns their paths."""
    out = Path(out)
    with staged_folder(out) as tmp:
        files = _write_results(tmp, rows, alpha, title, **meta)
    return {k: out / p.name for k, p in files.items()}


def _write_results(
    out: Path, rows: Sequence[ResultRow], alpha: float, title: str = "", **meta: Any
) -> dict[str, Path]:
    doc = results_document(rows, alpha=alpha, **meta)
    files = {"json": out / "results.json", "md": out / "results.md", "csv": out / "results.csv"}
    files["json"].write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    head = f"{title} (α = {alpha:g}, {meta.get('splits', '?')} splits)".strip()
    n_test = (meta.get("sizes") or {}).get("test")
    labels = meta.get("against", GOLD)
    text = markdown_table(rows, head, alpha, n_test, labels)
    saving = saving_line(rows, alpha, labels)
    text = (f"**Saving:** {saving}\n\n" if saving else "") + text
    notes = refusal_notes(rows)
    text += "".join(f"\n- {n}" for n in notes) + ("\n" if notes else "")
    files["md"].write_text(text + price_lines(meta.get("prices")), encoding="utf-8")
    with open(files["csv"], "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.policy, r.cost_cents, r.coverage, r.avg_len, r.set_size])
    if rows:
        cov_png, cost_png = box_plots(rows, alpha, out, title)
        files["box_coverage"], files["box_cost"] = cov_png, cost_png
    return files


def price_lines(prices: dict[str, Any] | None) -> str:
    """The price table the figures use, one line per model (with its source, which names any
    stand-in price), as Markdown."""
    if not prices:
        return ""
    lines = ["", "**Prices used** (USD per million input / output tokens):", ""]
    for m, p in prices.items():
        src = f" — {p['source']}" if p.get("source") else ""
        lines.append(f"- {m}: {p['input_usd_per_mtok']:g} / {p['output_usd_per_mtok']:g}{src}")
    return "\n".join(lines) + "\n"


CURVES = (
    ("train/cost", "cost per question (¢), conformal set"),
    ("train/coverage", "batch coverage of C"),
    ("conformal/kappa", "κ (online)"),
    ("constraint/surrogate_violation", "(1−α) − J̄_C (surrogate violation)"),
    ("val/coverage", "validation coverage"),
    ("val/length", "validation avg. length"),
)


def _smooth(y: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(y):
        acc += v
        if i >= k:
            acc -= y[i - k]
        out.append(acc / min(i + 1, k))
    return out


def training_curves(logs: dict[str, list[dict[str, float]]], alpha: float, out: Path) -> Path:
    """Training curves like the paper's appendix figures, one line per trained method."""
    plt = pyplot()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, (key, label) in zip(axes.ravel(), CURVES, strict=True):
        for name, log in logs.items():
            pts = [(e["step"], e[key]) for e in log if key in e]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            k = 1 if key.startswith("val/") else max(1, len(ys) // 50)
            ax.plot(xs, _smooth(list(ys), k), label=name, lw=1.2)
        if key in ("train/coverage", "val/coverage"):
            ax.axhline(1 - alpha, color="tab:red", ls="--", lw=1)
        if key == "constraint/surrogate_violation":
            ax.axhline(0, color="gray", ls=":", lw=1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"training curves, α = {alpha:g}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
