"""Time per round of CStop's continuation score: scikit-learn's ``predict_proba`` against the
compiled trees of ``ccpo.learning.trees`` (the same floats).

    python benchmarks/bench_trees.py [--calls 300] [--reps 5]

For each bundled trace set, CStop is fitted on the training split (seed 0) and one round's
classifier rows (T − 1 rows, as a live question scores them) are scored ``--calls`` times by
each, the two in turn within each of ``--reps`` repetitions; medians per call and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ccpo.evaluation.harness import load_episodes, make_splits, split_sizes
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.learning.trees import compile_hgb
from ccpo.policies.classifier import stop_features
from ccpo.policies.registry import stopping_fitter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    for name, path in bundled_sets().items():
        ep, _ = load_episodes(path)
        sp = make_splits(ep.n, split_sizes(ep.n), 1, seed=0)
        model = stopping_fitter("cstop")(ep, sp.train, 0.1, 0).model
        trees = compile_hgb(model)
        rows = stop_features(ep.obs[:1])[0, :-1]  # one question's rounds 1..T-1
        ways = {
            "sklearn": lambda m=model, x=rows: m.predict_proba(x)[:, 1],
            "compiled": lambda t=trees, x=rows: t.predict_proba(x),
        }
        assert np.array_equal(ways["sklearn"](), ways["compiled"]())
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(args.reps):
            for k, fn in ways.items():
                fn()
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                times[k].append((time.perf_counter() - t0) / args.calls)
        sk, co = statistics.median(times["sklearn"]), statistics.median(times["compiled"])
        print(
            f"{name}: {trees.roots.size} trees, depth {trees.depth}, {rows.shape[0]} rows a "
            f"round: sklearn {1e3 * sk:.3f} ms, compiled {1e3 * co:.3f} ms per round "
            f"({sk / co:.1f}x; medians of {args.reps})"
        )


if __name__ == "__main__":
    main()
