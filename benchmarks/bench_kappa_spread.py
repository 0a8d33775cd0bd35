"""Benchmark: κ̂'s spread over seeds when `train` calibrates on the paper's calibration size
("before") or on every non-training question ("after"), with the coverage of
each κ̂ on questions `train` never saw.

Per bundled set and seed s (0..19): a held-out set H of n // 7 questions is set aside by a
seeded hash of the ids (seed 1000 + s); `train`'s procedure runs on the rest (n' questions):
the order-free training split (:func:`ccpo.evaluation.harness.id_splits`, seed s), the method
fitted on it, then κ̂ split-conformal on

- **before**: the paper's calibration size (``split_sizes(n')[1]``, a random part of the pool:
  what `train` did before), or
- **after**: every non-training question (what `train` does now).

Both κ̂ are scored on H (coverage, cost per question). Prints per set: κ̂ mean ± sd, min–max,
mean held-out coverage ± its sd over seeds, and the share of seeds below 1 − α on H.

    python benchmarks/bench_kappa_spread.py [--seeds 20] [--alpha 0.1] [--method cstop]
"""

from __future__ import annotations

import argparse

import numpy as np

from ccpo.evaluation.harness import id_order, id_splits, load_episodes, split_sizes
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.learning.replay import calibrate_kappa
from ccpo.policies.registry import fit_policy
from ccpo.traces.episodes import conformal_rollout


def one_seed(ep, alpha: float, seed: int, method: str) -> dict[str, tuple[float, float, float]]:
    """{before, after}: (κ̂, held-out coverage, held-out cost USD/question) for one seed."""
    order = id_order(ep.ids, 1000 + seed)
    held, rest = order[: ep.n // 7], order[ep.n // 7 :]
    work = ep.subset(rest)
    n_train, n_cal, _ = split_sizes(work.n)
    work, sp = id_splits(work, (n_train, work.n - n_train, 0), 1, seed)
    pol = fit_policy(method, work, sp.train, alpha, seed)
    probs = pol.probs(work.obs)
    pool = sp.cal[0]
    out = {}
    test = ep.subset(held)
    test_probs = pol.probs(test.obs)
    for name, cal in (("before", pool[:n_cal]), ("after", pool)):
        kappa = float(calibrate_kappa(work, probs, alpha, cal))
        m = conformal_rollout(test, test_probs, kappa)
        out[name] = (kappa, float(m.covered.mean()), float(m.cost.mean()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--method", default="cstop")
    args = ap.parse_args()
    print(f"α = {args.alpha:g}, method {args.method}, {args.seeds} seeds")
    print("| set | calibration | n_cal | κ̂ mean ± sd | κ̂ min–max | held-out coverage "
          "(mean ± sd over seeds) | seeds < 1 − α | cost ¢/question |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, path in bundled_sets().items():
        ep, _ = load_episodes(path)
        rows = [one_seed(ep, args.alpha, s, args.method) for s in range(args.seeds)]
        rest = ep.n - ep.n // 7
        n_train, n_cal, _ = split_sizes(rest)
        for which, size in (("before", n_cal), ("after", rest - n_train)):
            k = np.array([r[which][0] for r in rows])
            cov = np.array([r[which][1] for r in rows])
            cost = np.array([r[which][2] for r in rows]) * 100
            print(
                f"| {name} | {which} | {size} | {k.mean():.3f} ± {k.std(ddof=1):.3f} | "
                f"{k.min():.3f}–{k.max():.3f} | {cov.mean():.3f} ± {cov.std(ddof=1):.3f} "
                f"(H = {ep.n // 7}) | {(cov < 1 - args.alpha).mean():.0%} | {cost.mean():.4f} |"
            )


if __name__ == "__main__":
    main()
