"""Benchmark: Pareto testing of (τ, λ) against today's τ-first calibration of a routed policy.

For each set (``arena-public`` as bundled: judged acceptance; ``mmlu-public`` made label-free:
``correct`` = equals the strongest model's answer, :mod:`ccpo.testing.relabel`; ``NAME:gold``
or ``NAME:label-free`` pick the labels of another), α ∈ {0.1, 0.2} and seeds 0..4 (each seed:
its own training split, fits and ``--splits`` calibration/test splits, the sizes of ``ccpo
compare``), every routed row (``cstop-single+route``, ``auto-single+route``) is fitted once
and calibrated on each calibration split two ways:

- ``τ-first``: τ̂ chosen on the training split by cross-fitting, λ̂ by Learn-then-Test at it
  (the calibration before Pareto testing: the policy with its ``sequence`` removed);
- ``pareto``: one fixed sequence of (τ, λ) pairs, ordered on the training split (the Pareto
  front of estimated risk and cost), walked at the full δ (docs/theory.md, "Pareto testing:
  τ and λ certified together").

It prints per set, α and row, mean ± sd over seeds of the mean over splits: acceptance
(agreement with the reference when label-free) on the test questions, its lowest seed, cost ÷
always-<strongest>, cost ÷ oracle floor, the share of refused calibration splits, rounds run,
estimated latency (:mod:`ccpo.traces.latency`) and the share of test questions started after
round 1. A row whose ``auto`` keeps no router (``always-<reference>``) is scored once and shown
in both forms.

    python benchmarks/bench_pareto.py [--seeds 5] [--splits 100] [--alpha 0.1 --alpha 0.2]
        [--data arena-public --data mmlu-public:label-free] [--rows ROW ...]
        [--out runs/bench_pareto.json]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from _sweep import mean_sd, sweep_parser, write_results

from ccpo.evaluation.harness import make_splits, prices_for, split_sizes, with_latency
from ccpo.evaluation.reproduce import resolve_data
from ccpo.evaluation.rows import make_policy
from ccpo.policies.routing.single import RoutedPolicy
from ccpo.testing.relabel import relabel_against_strongest
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from ccpo.traces.labels import against_text

ROWS = ("cstop-single+route", "auto-single+route")
DATA = ("arena-public", "mmlu-public:label-free")
FORMS = ("τ-first", "pareto")


def episodes(spec: str):
    """(label, episodes) of ``NAME[:gold|:label-free]`` (no suffix: the labels as bundled)."""
    name, _, labels = spec.partition(":")
    (key, path), *_ = resolve_data([name]).items()
    prices = prices_for(path)
    traces = read_traces(path)
    if labels == "label-free":
        traces, ref = relabel_against_strongest(traces, prices)
        return f"{key} (label-free, vs {ref})", build_episodes(traces, prices)
    return key, build_episodes(traces, prices)


def figures(p, ep, sp, alpha, seed) -> dict:
    """One row's figures on every split (its policy as set on ``p``)."""
    m = with_latency(ep, p.evaluate(ep, sp, alpha, seed), sp.test)
    out = {
        "cost": float(m.cost.sum(-1).mean()),
        "acceptance": float(m.covered.mean()),
        "rounds": float(m.length.mean()),
        "latency": float(m.latency.mean()) if m.latency is not None else float("nan"),
        "refused": float(np.mean(p._refused)) if getattr(p, "_refused", None) is not None else 0,
        "later": 0.0,
    }
    pol = getattr(p, "policy", None)
    if isinstance(pol, RoutedPolicy) and p._thresholds is not None:
        probs = pol.episode_scores(ep).probs
        out["later"] = float((pol.router.start(probs[sp.test], p._thresholds[:, :1]) > 0).mean())
    return out


def run_seed(ep, alphas, seed: int, splits: int, rows=ROWS) -> dict[float, dict]:
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    always = f"always-{ep.strongest}"
    out: dict[float, dict] = {a: {} for a in alphas}
    for name in (always, "oracle"):
        p = make_policy(name, None)
        p.fit(ep, sp.train, alphas[0], seed)
        for alpha in alphas:
            out[alpha][name] = figures(p, ep, sp, alpha, seed)
    for name in rows:
        for alpha in alphas:
            p = make_policy(name, None)
            p.fit(ep, sp.train, alpha, seed)
            pol = p.policy
            if not isinstance(pol, RoutedPolicy):  # auto kept a policy without a router
                got = figures(p, ep, sp, alpha, seed)
                for form in FORMS:
                    out[alpha][f"{name} ({form})"] = {**got, "kept": pol.variant}
                continue
            for form, variant in zip(FORMS, (replace(pol, sequence=None), pol), strict=True):
                p.policy = variant
                out[alpha][f"{name} ({form})"] = figures(p, ep, sp, alpha, seed)
    for by in out.values():
        floor, yardstick = by["oracle"]["cost"], by[always]["cost"]
        for r in by.values():
            r["rel_oracle"], r["rel_always"] = r["cost"] / floor, r["cost"] / yardstick
    return out


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--rows", action="append", help=f"routed rows [{', '.join(ROWS)}]")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_pareto.json"))
    args = ap.parse_args()
    alphas = tuple(args.alpha or (0.1, 0.2))
    results = {}
    for spec in args.data or DATA:
        label, ep = episodes(spec)
        what = against_text(ep.labels)
        t0 = time.perf_counter()
        seeds = []
        for s in range(args.seeds):
            seeds.append(run_seed(ep, alphas, s, args.splits, tuple(args.rows or ROWS)))
            print(f"{label}: seed {s} done ({time.perf_counter() - t0:.0f} s)", flush=True)
        for alpha in alphas:
            runs = [by[alpha] for by in seeds]
            key = f"{label}, α = {alpha:g}"
            print(f"\n{key}: {args.seeds} seeds × {args.splits} splits")
            print(
                f"| row | {what} (target {1 - alpha:.2f}) | lowest seed | cost ÷ always | "
                "cost ÷ oracle | refused | rounds | latency s | started later |\n"
                "|---|---|---|---|---|---|---|---|---|"
            )
            table = {}
            for row in runs[0]:
                t = {k: [r[row][k] for r in runs] for k in runs[0][row] if k != "kept"}
                kept = {r[row]["kept"] for r in runs if "kept" in r[row]}
                table[row] = {**t, **({"kept": sorted(kept)} if kept else {})}
                n_kept = sum("kept" in r[row] for r in runs)
                note = f" (kept {', '.join(sorted(kept))} on {n_kept} seeds)" if kept else ""
                print(
                    f"| {row}{note} | {mean_sd(t['acceptance'])} | {min(t['acceptance']):.3f} | "
                    f"{mean_sd(t['rel_always'])} | {mean_sd(t['rel_oracle'])} | "
                    f"{statistics.fmean(t['refused']):.2f} | "
                    f"{statistics.fmean(t['rounds']):.2f} | {statistics.fmean(t['latency']):.1f} | "
                    f"{statistics.fmean(t['later']):.2f} |"
                )
            results[key] = table
    write_results(args.out, results)


if __name__ == "__main__":
    main()
