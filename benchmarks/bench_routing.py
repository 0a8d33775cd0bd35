"""Benchmark: routing before the first call, against the same single-answer policies without it.

For each bundled set (gold labels, and the same set made label-free: ``correct`` = equals the
strongest model's answer, :mod:`ccpo.testing.relabel`, as ``traces import --reference`` labels
a table), α ∈ {0.1, 0.2} and seeds 0..4 (each seed: its own training split, fits and
``--splits`` evaluation splits), it scores ``auto-single`` with and without the router
(``…+route``: router and τ̂ chosen on the training split, λ̂ by Learn-then-Test on each
calibration split; docs/theory.md, "Routing before the first call"),
``always-<strongest>`` and the oracle floor, and prints per (set, α) and row, mean ± sd over
the seeds of coverage (agreement for the label-free sets), cost ÷ always-<strongest>, cost ÷
oracle, rounds run, the share of refused calibration splits and, for routed rows, the share of
questions started after round 1 at the chosen τ̂ (mean over splits).

    python benchmarks/bench_routing.py [--seeds 5] [--splits 100] [--alpha 0.1 --alpha 0.2]
        [--data NAME|FILE ...] [--out runs/bench_routing.json]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from _sweep import gold_and_label_free_episodes, mean_sd, sweep_parser, write_results
from bench_single import run_seed

from ccpo.traces.labels import against_text

ROWS = ("auto-single", "auto-single+route")


def _routing_figures(p, ep, sp, row) -> dict:
    """Rounds run, and the share of test questions a routed row started after round 1 at its
    split's τ̂ (mean over splits; None for other rows)."""
    th = getattr(p, "_thresholds", None)
    skipped = None
    if p.name.endswith("+route") and th is not None:
        probs = p.policy.episode_scores(ep).probs
        skipped = float((p.policy.router.start(probs[sp.test], th[:, :1]) > 0).mean())
    return {"rounds": row.avg_len, "skipped": skipped}


def _opt(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    return f"{statistics.fmean(got):.2f}" if got else "–"


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_routing.json"))
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    results = {}
    for label, ep in gold_and_label_free_episodes(args.data):
        what = against_text(ep.labels)
        t0 = time.perf_counter()
        seeds = [
            run_seed(ep, alphas, s, args.splits, ROWS, _routing_figures) for s in range(args.seeds)
        ]
        secs = time.perf_counter() - t0
        for alpha in alphas:
            runs = [by[alpha] for by in seeds]
            key = f"{label}, α = {alpha:g}"
            print(
                f"\n{key}: {args.seeds} seeds × {args.splits} splits ({secs:.0f} s all α)",
                flush=True,
            )
            print(
                f"| row | {what} (target {1 - alpha:.2f}) | cost ÷ always | cost ÷ oracle "
                "| rounds | refused | started later |\n|---|---|---|---|---|---|---|"
            )
            table = {}
            for row in runs[0]:
                rs = [r[row] for r in runs]
                table[row] = {k: [r[k] for r in rs] for k in rs[0]}
                t = table[row]
                print(
                    f"| {row} | {mean_sd(t['coverage'])} | {mean_sd(t['rel_always'])} | "
                    f"{mean_sd(t['rel_oracle'])} | {statistics.fmean(t['rounds']):.2f} | "
                    f"{_opt(t['refused'])} | {_opt(t['skipped'])} |"
                )
            results[key] = table
    write_results(args.out, results)


if __name__ == "__main__":
    main()
