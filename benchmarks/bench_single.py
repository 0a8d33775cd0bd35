"""Benchmark: single-answer policies beside the set methods, and the saving against always
calling the strongest model.

For each bundled set (gold labels, and the same set made label-free: ``correct`` = equals the
strongest model's answer, :mod:`ccpo.testing.relabel`), α ∈ {0.1, 0.2} and seeds 0..4 (each
seed: its own training split, its own fits, its own 100 evaluation splits) it scores the score
methods of ``ccpo compare`` (set: ``cstop``, ``auto``, ``depth-k``; single: ``cstop-single``,
``auto-single``, ``depth-k-single``), ``always-<strongest>`` and the oracle floor, and prints per
(set, α) and row, mean ± sd over the seeds of

- coverage (agreement with the reference for the label-free sets), mean over splits;
- cost / oracle and cost / always-<strongest> (mean test-split cost over theirs, same splits);
- set size;
- refused: the share of calibration splits on which Learn-then-Test certified no threshold
  (single rows; such a split is scored with the most conservative rule, all T rounds).

CCPO and the CPO family are left out (minutes of training per run); ``ccpo reproduce`` shows
them beside the single rows. Results also go to ``--out`` (JSON).

    python benchmarks/bench_single.py [--seeds 5] [--splits 100] [--alpha 0.1 --alpha 0.2]
        [--data NAME|FILE ...] [--out runs/bench_single.json]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
from _sweep import gold_and_label_free_episodes, mean_sd, sweep_parser, write_results

from ccpo.evaluation.harness import make_splits, row_from_metrics, split_sizes
from ccpo.evaluation.rows import make_policy
from ccpo.traces.labels import against_text

ROWS = ("cstop", "auto", "depth-k", "cstop-single", "auto-single", "depth-k-single")


def run_seed(ep, alphas, seed: int, splits: int, rows=ROWS, extra=None) -> dict[float, dict]:
    """Every row at every α for one seed (its training split and evaluation splits). A fit
    that does not depend on α (every row but ``auto*`` and the routed ``…+route``, whose τ is
    chosen at α: the classifiers and fixed rules only store α) is made once and calibrated per
    α. ``extra(row, ep, splits, result)``: more figures of a row (a dict)."""
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    always = f"always-{ep.strongest}"
    out: dict[float, dict] = {a: {} for a in alphas}
    for name in (*rows, always, "oracle"):
        p = make_policy(name, None)  # no RL rows here: no training cache needed
        for k, alpha in enumerate(alphas):
            if k == 0 or name.startswith("auto") or name.endswith("+route"):
                p.fit(ep, sp.train, alpha, seed)
            m = p.evaluate(ep, sp, alpha, seed)
            row = row_from_metrics(name, m, **getattr(p, "result_extra", dict)())
            out[alpha][name] = {
                "cost": np.asarray(row.cost_cents_per_split),
                "coverage": row.coverage,
                "set_size": row.set_size,
                "refused": row.extra.get("refused_share"),
                **(extra(p, ep, sp, row) if extra else {}),
            }
    for rows in out.values():
        floor, yardstick = rows["oracle"]["cost"].mean(), rows[always]["cost"].mean()
        for r in rows.values():
            r["rel_oracle"] = float(r["cost"].mean() / floor)
            r["rel_always"] = float(r["cost"].mean() / yardstick)
            r["cost"] = float(r["cost"].mean())
    return out


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_single.json"))
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    results = {}
    for label, ep in gold_and_label_free_episodes(args.data):
        what = against_text(ep.labels)
        t0 = time.perf_counter()
        seeds = [run_seed(ep, alphas, s, args.splits) for s in range(args.seeds)]
        secs = time.perf_counter() - t0
        for alpha in alphas:
            runs = [by[alpha] for by in seeds]
            key = f"{label}, α = {alpha:g}"
            print(f"\n{key}: {args.seeds} seeds × {args.splits} splits ({secs:.0f} s all α)")
            print(
                f"{'row':32s} {what + ' (target ' + f'{1 - alpha:.2f})':>34s} "
                f"{'cost/oracle':>16s} {'cost/always':>16s} {'set size':>8s} {'refused':>8s}"
            )
            table = {}
            for row in runs[0]:
                rs = [r[row] for r in runs]
                cov = [r["coverage"] for r in rs]
                ref_share = [r["refused"] for r in rs if r["refused"] is not None]
                table[row] = {
                    "coverage": cov,
                    "rel_oracle": [r["rel_oracle"] for r in rs],
                    "rel_always": [r["rel_always"] for r in rs],
                    "set_size": [r["set_size"] for r in rs],
                    "refused": ref_share,
                }
                print(
                    f"{row:32s} {mean_sd(cov):>34s} {mean_sd(table[row]['rel_oracle']):>16s} "
                    f"{mean_sd(table[row]['rel_always']):>16s} "
                    f"{statistics.fmean(table[row]['set_size']):8.2f} "
                    f"{(f'{statistics.fmean(ref_share):.2f}' if ref_share else '–'):>8s}"
                )
            results[key] = table
    write_results(args.out, results)


if __name__ == "__main__":
    main()
