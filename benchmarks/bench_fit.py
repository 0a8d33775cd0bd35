"""Benchmark: fit time of CStop and ``--method auto`` per bundled real set and α.

Targets: CStop and ``auto``'s replay-trained candidates fit in ≤ 5 s per (set, α) on 2 cores;
``auto`` with CCPO among its candidates is bounded by its CCPO folds
(``--auto-ccpo-steps``, default 300 steps × 6 fits) and reported beside it. Prints the median
of ``--repeats`` fits on the harness's training split (seed 0), after one warm-up fit (imports).

    python benchmarks/bench_fit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

from _timing import timed

from ccpo.evaluation.harness import load_episodes, make_splits, split_sizes
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.policies.registry import AUTO_CANDIDATES, fit_auto, stopping_fitter

REPLAY = tuple(c for c in AUTO_CANDIDATES if c != "ccpo")  # auto's replay-trained candidates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for name, path in bundled_sets().items():
        ep, _ = load_episodes(path)
        train = make_splits(ep.n, split_sizes(ep.n), 1, 0).train
        stopping_fitter("cstop")(ep, train, 0.1, 0)  # warm-up: one-time imports
        for alpha in (0.05, 0.1, 0.2):
            fits = {
                "cstop": lambda r, a=alpha, e=ep, t=train: stopping_fitter("cstop")(e, t, a, r),
                "auto without ccpo": lambda r, a=alpha, e=ep, t=train: fit_auto(
                    e, t, a, r, candidates=REPLAY
                ),
                "auto": lambda r, a=alpha, e=ep, t=train: fit_auto(e, t, a, r),
            }
            got = {k: statistics.median(timed(f, args.repeats)) for k, f in fits.items()}
            print(
                f"{name} α = {alpha:g}: "
                + ", ".join(f"{k} median {v:.2f} s" for k, v in got.items()),
                flush=True,
            )


if __name__ == "__main__":
    main()
