"""The plots of the reports, drawn with matplotlib (the ``train`` extra) on the Agg backend.

- :func:`box_plots`: coverage and cost of every row over the evaluation splits;
- :func:`training_curves`: cost, coverage, κ and the constraint during training, one line
  per trained method (the paper's appendix figures);
- :func:`frontier_plot`: cost vs coverage of every row across α (``reproduce``), policies
  whose points coincide named together (:func:`frontier_points`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ccpo.errors import import_extra
from ccpo.evaluation.harness import ResultRow
from ccpo.report.tables import cost_header

if TYPE_CHECKING:
    from ccpo.evaluation.seeds import Section


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
