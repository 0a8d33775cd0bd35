"""Result files and plots: ``results.json`` (contract), ``results.md``, ``results.csv``, box plots.

``results.json`` follows DESIGN.md ("Results file"): ``{"schema": "ccpo.results/v1", "traces",
"alpha", "splits", "seed", "rows": [...]}``; each row has the paper's columns plus per-split lists.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.table import Table

from ccpo import __version__
from ccpo.product.evaluate import ResultRow

RESULTS_SCHEMA = "ccpo.results/v1"
COLUMNS = ("Policy", "Cost (cents)", "Coverage", "Avg. Len.", "Set Size")


def _cells(r: ResultRow) -> tuple[str, ...]:
    return (
        r.policy,
        f"{r.cost_cents:.3f}",
        f"{r.coverage:.3f}",
        f"{r.avg_len:.2f}",
        f"{r.set_size:.2f}",
    )


def results_document(rows: Sequence[ResultRow], **meta: Any) -> dict[str, Any]:
    """The ``results.json`` object."""
    return {
        "schema": RESULTS_SCHEMA,
        **meta,
        "ccpo_version": __version__,
        "rows": [r.to_json() for r in rows],
    }


def markdown_table(rows: Sequence[ResultRow], title: str | None = None) -> str:
    lines = [f"**{title}**", ""] if title else []
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def rich_table(rows: Sequence[ResultRow], title: str | None = None, alpha: float | None = None):
    """The paper-style table for the terminal; coverage under 1−α is shown in red."""
    t = Table(title=title)
    for c in COLUMNS:
        t.add_column(c, justify="left" if c == "Policy" else "right")
    for r in rows:
        cells = list(_cells(r))
        if alpha is not None and r.coverage < 1 - alpha and r.kind != "bound":
            cells[2] = f"[red]{cells[2]}[/red]"
        t.add_row(*cells)
    return t


def box_plots(rows: Sequence[ResultRow], alpha: float, out: Path, title: str = "") -> list[Path]:
    """Box plots of coverage and cost over the evaluation splits (1−α line on coverage)."""
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


def write_results(
    out: Path, rows: Sequence[ResultRow], alpha: float, title: str = "", **meta: Any
) -> dict[str, Path]:
    """Write results.json, results.md, results.csv and the two box plots into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = results_document(rows, alpha=alpha, **meta)
    files = {"json": out / "results.json", "md": out / "results.md", "csv": out / "results.csv"}
    files["json"].write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    head = f"{title} (α = {alpha:g}, {meta.get('splits', '?')} splits)".strip()
    files["md"].write_text(markdown_table(rows, head), encoding="utf-8")
    with open(files["csv"], "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.policy, r.cost_cents, r.coverage, r.avg_len, r.set_size])
    if rows:
        cov_png, cost_png = box_plots(rows, alpha, out, title)
        files["box_coverage"], files["box_cost"] = cov_png, cost_png
    return files


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
