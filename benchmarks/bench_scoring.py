"""Benchmark: score a conformal policy on 1,000 traces × 100 evaluation splits.

Times the whole scoring path of the harness for one conformal row: covering scores of every
question, split-conformal κ̂ on each calibration split, and the set-valued rollout on each test
split (cost, coverage, length, set size). Target: ≤ 1 s. Prints the median of
``--repeats`` runs. Data: SYNTHETIC traces from ccpo.traces.sim.

    python benchmarks/bench_scoring.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ccpo.evaluation.harness import make_splits, row_from_metrics
from ccpo.learning.conformal import split_conformal_threshold
from ccpo.traces.episodes import build_episodes, conformal_rollout, covering_scores
from ccpo.traces.prices import load_prices
from ccpo.traces.sim import SimConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--splits", type=int, default=100)
    args = ap.parse_args()
    ep = build_episodes(generate(SimConfig(n=args.n, seed=1)), load_prices())
    rng = np.random.default_rng(0)
    probs = rng.dirichlet([1, 1, 1], size=(ep.n, ep.horizon))
    probs[:, -1, 2] = 0
    probs[:, -1] /= probs[:, -1].sum(-1, keepdims=True)
    splits = make_splits(ep.n, (args.n - 400, 200, 200), args.splits, seed=0)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        s = covering_scores(ep, probs)
        kappa = split_conformal_threshold(s[splits.cal], 0.1)
        m = conformal_rollout(ep, probs, kappa, splits.test)
        row = row_from_metrics("bench", m, kind="conformal")
        times.append(time.perf_counter() - t0)
    print(
        f"conformal scoring, {ep.n} traces x {args.splits} splits: "
        f"median {statistics.median(times) * 1e3:.1f} ms "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, {args.repeats} runs); "
        f"coverage {row.coverage:.3f}"
    )


if __name__ == "__main__":
    main()
