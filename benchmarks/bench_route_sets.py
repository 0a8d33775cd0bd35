"""Benchmark: routing CStop answer sets before the first call, against the unrouted sets.

For every bundled set (``--data``), with its own labels and label-free (relabelled against
its strongest model), α in ``--alpha`` and seeds 0..4 (each seed: its own training split and
fits, ``--splits`` calibration/test splits of the held-out questions, ``compare``'s sizes):
``cstop`` (the set policy, κ̂ split conformal) and ``cstop+route`` (router, τ̂ and the
refitted classifier on the training split, κ̂ on each question's started view:
docs/theory.md, "Routing before the first call", "Sets"). Printed: held-out coverage (the
guarantee: ≥ 1 − α marginally), cost ÷ always-the-strongest, answers per set, rounds run,
and the share of test questions started after round 1; mean ± sd over seeds.

    python benchmarks/bench_route_sets.py [--data arena-public ...] [--seeds 5] [--splits 20]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from _sweep import gold_and_label_free_episodes, mean_sd, sweep_parser, write_results

from ccpo.evaluation.harness import make_splits, split_sizes
from ccpo.policies.registry import fit_policy

ROWS = ("cstop", "cstop+route")


def run_seed(ep, alphas, seed: int, splits: int) -> dict:
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    out: dict = {}
    for alpha in alphas:
        got = {}
        for row in ROWS:
            pol = fit_policy("cstop", ep, sp.train, alpha, seed, routed=row.endswith("route"))
            scores = pol.episode_scores(ep)
            kappas, _ = pol.split_thresholds(ep, scores, sp.cal, alpha)
            m = pol.rollout(ep, scores, kappas, sp.test)
            late = float((scores.start[sp.test] > 0).mean()) if hasattr(scores, "start") else 0.0
            always = ep.strongest_cost[sp.test].sum(-1)
            got[row] = (float(m.covered.mean()), float((m.cost.sum(-1) / always).mean()),
                        float(m.set_size.mean()), float(m.length.mean()), late)  # fmt: skip
        out[alpha] = got
    return out


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_route_sets.json"))
    args = ap.parse_args()
    alphas = tuple(args.alpha or (0.1, 0.2))
    results, t0 = {}, time.perf_counter()
    for label, ep in gold_and_label_free_episodes(args.data):
        if ep.routes is None:
            print(f"{label}: not an agree ladder, skipped")
            continue
        per = [run_seed(ep, alphas, s, args.splits) for s in range(args.seeds)]
        results[label] = {str(a): {r: [p[a][r] for p in per] for r in ROWS} for a in alphas}
        for a in alphas:
            print(f"\n{label}, α = {a}: {args.seeds} seeds × {args.splits} splits "
                  f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
            print("| row | coverage | cost ÷ always | set size | rounds | started late |")
            print("|---|---|---|---|---|---|")
            for r in ROWS:
                xs = np.asarray(results[label][str(a)][r])
                cols = [mean_sd(list(xs[:, k])) for k in range(5)]
                print(f"| {r} | " + " | ".join(cols) + " |")
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
