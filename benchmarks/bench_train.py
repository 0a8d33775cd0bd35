"""Benchmark: 2,000 CCPO steps (batch 10, 1,000 training traces, T = 4) on this machine.

Target: ≤ 60 s. Prints the median of ``--repeats`` runs.
Data: SYNTHETIC (ccpo.traces.sim).

    python benchmarks/bench_train.py [--repeats 3] [--steps 2000]
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import median_line, timed

from ccpo.learning.config import TrainConfig
from ccpo.learning.training import train
from ccpo.traces.episodes import build_episodes
from ccpo.traces.prices import load_prices
from ccpo.traces.sim import SimConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--method", default="ccpo")
    args = ap.parse_args()
    ep = build_episodes(generate(SimConfig(n=1000, seed=2)), load_prices())
    # warm-up: one-time imports and first-call costs, not training time
    train(ep, np.arange(ep.n), TrainConfig(method=args.method, steps=2, val_every=0))
    times = timed(
        lambda r: train(
            ep,
            np.arange(ep.n),
            TrainConfig(method=args.method, steps=args.steps, seed=r, val_every=0),
        ),
        args.repeats,
    )
    print(f"{args.method}: {args.steps} steps, batch 10, 1000 traces, T=4: {median_line(times)}")


if __name__ == "__main__":
    main()
