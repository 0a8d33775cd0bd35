"""Benchmark: fit time of CStop and ``--method auto`` per bundled real set and α.

Target (issue 13): the new method trains in ≤ 5 s per (set, α) on 2 cores. Prints the median
of ``--repeats`` fits on the harness's training split (seed 0), after one warm-up fit (imports).

    python benchmarks/bench_fit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

from _timing import timed

from ccpo.learning.stopping import fit_auto, stopping_fitter
from ccpo.product.evaluate import load_episodes, make_splits, split_sizes
from ccpo.product.reproduce import bundled_sets


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
                "auto": lambda r, a=alpha, e=ep, t=train: fit_auto(e, t, a, r),
            }
            cstop, auto = (statistics.median(timed(f, args.repeats)) for f in fits.values())
            print(f"{name} α = {alpha:g}: cstop median {cstop:.2f} s, auto median {auto:.2f} s")


if __name__ == "__main__":
    main()
