"""Benchmark: how much cheaper could a CStop-family rule get on each bundled set and α?

The target is the best method at ≤ 1.5× the oracle floor. Where it misses, this tells
whether the miss is the *score* (the ranking of questions by "going on can still fix it") or
the *calibration* (κ̂ from a calibration split of ~70 questions), by scoring the same fitted
``cstop-lr`` continuation score g_t (5 seeds × 100 splits, as ``bench_policy_quality``) three ways:

- ``harness``: split-conformal κ̂ on each calibration split (what every table reports);
- ``pool κ``: one κ, the conformal quantile of *every* non-training question (calibration and
  test pools together, ~140 questions): what a much larger calibration split would give. Not
  a valid method (it sees the test questions); a bound on what calibration noise costs;
- ``best weights``: per-round weights w_t on g_t (a nested family: continue iff w_t g_t ≥ κ)
  chosen on the *test* splits from a grid: a bound on what tuning the family's shape could give.

    python benchmarks/bench_headroom.py [--data NAME ...] [--alpha 0.05 ...] [--seeds 5]
"""

from __future__ import annotations

import itertools

import numpy as np
from _sweep import ALPHAS, sweep_parser

from ccpo.evaluation.harness import load_episodes, make_splits, split_sizes
from ccpo.evaluation.reproduce import resolve_data
from ccpo.evaluation.rows import conformal_metrics
from ccpo.learning.baselines import oracle_metrics
from ccpo.learning.conformal import split_conformal_threshold
from ccpo.policies.cstop import membership_scores
from ccpo.policies.registry import fit_policy
from ccpo.traces.episodes import conformal_rollout, covering_scores

GRID = (0.03, 0.1, 0.3, 1.0)


def headroom(ep, alpha: float, seed: int, splits: int) -> dict[str, tuple[float, float]]:
    """(cost / oracle, coverage) of the three scorings above for one seed."""
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    oracle = oracle_metrics(ep, sp.test, alpha).cost.sum(-1).mean()
    g = fit_policy("cstop-lr", ep, sp.train, alpha, seed).continuation(ep.obs)

    def score(probs, kappas=None):
        if kappas is None:
            m, _ = conformal_metrics(ep, probs, sp, alpha, None)
        else:
            m = conformal_rollout(ep, probs, kappas, sp.test)
        return float(m.cost.sum(-1).mean() / oracle), float(m.covered.mean())

    probs = membership_scores(g)
    pool = np.setdiff1d(np.arange(ep.n), sp.train)
    kappa = float(split_conformal_threshold(covering_scores(ep, probs)[pool], alpha))
    out = {"harness": score(probs), "pool κ": score(probs, np.full(splits, kappa))}
    best = None
    for w in itertools.product(GRID, repeat=ep.horizon - 1):
        weights = np.array([*w, 0.0]) / max(w)
        got = score(membership_scores(g * weights))
        if best is None or got[0] < best[0]:
            best = got
    out["best weights"] = best
    return out


def main() -> None:
    ap = sweep_parser(__doc__.split("\n")[0])
    args = ap.parse_args()
    print("| set | α | scoring | cost / oracle (mean ± sd over seeds) | coverage |")
    print("|---|---|---|---|---|")
    for name, path in resolve_data(args.data).items():
        ep, _ = load_episodes(path)
        for alpha in args.alpha or list(ALPHAS):
            runs = [headroom(ep, alpha, s, args.splits) for s in range(args.seeds)]
            for kind in runs[0]:
                a = np.array([r[kind] for r in runs])
                print(
                    f"| {name} | {alpha:g} | {kind} | {a[:, 0].mean():.3f} ± "
                    f"{a[:, 0].std(ddof=1):.3f} | {a[:, 1].mean():.4f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
