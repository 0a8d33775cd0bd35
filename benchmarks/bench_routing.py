"""Benchmark: routing before the first call, against the same single-answer policies without it.

For each bundled set (gold labels, and the same set made label-free: ``correct`` = equals the
strongest model's answer, :mod:`ccpo.testing.relabel`, as ``traces import --reference`` labels
a table), α ∈ {0.1, 0.2} and seeds 0..4 (each seed: its own training split, fits and 100
evaluation splits), it scores ``auto-single`` and ``cstop-single`` with and without the router
(``…+route``: the router fitted on the training split, (τ, λ) certified together by
Learn-then-Test on each calibration split; docs/theory.md, "Routing before the first call"),
``always-<strongest>`` and the oracle floor, and prints per (set, α) and row, mean ± sd over
the seeds of coverage (agreement for the label-free sets), cost ÷ always-<strongest>, cost ÷
oracle, rounds run, the share of refused calibration splits and, for routed rows, the share of
questions started after round 1 at the chosen τ̂ (mean over splits).

    python benchmarks/bench_routing.py [--seeds 5] [--splits 100] [--alpha 0.1 --alpha 0.2]
        [--data NAME|FILE ...] [--out runs/bench_routing.json]
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
from _sweep import sweep_parser

from ccpo.evaluation.harness import make_splits, prices_for, row_from_metrics, split_sizes
from ccpo.evaluation.reproduce import resolve_data
from ccpo.evaluation.rows import make_policy
from ccpo.testing.relabel import relabel_against_strongest
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from ccpo.traces.labels import against_text

ROWS = ("auto-single", "auto-single+route", "cstop-single", "cstop-single+route")


def _skipped_share(p, ep, sp) -> float | None:
    """The share of test questions a routed row started after round 1 (mean over splits)."""
    th = getattr(p, "_thresholds", None)
    if not p.name.endswith("+route") or th is None:
        return None
    probs = p.policy.episode_scores(ep).probs
    return float((p.policy.router.start(probs[sp.test], th[:, :1]) > 0).mean())


def run_seed(ep, alphas, seed: int, splits: int) -> dict[float, dict]:
    """Every row at every α for one seed (its training split and evaluation splits)."""
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    always = f"always-{ep.strongest}"
    out: dict[float, dict] = {a: {} for a in alphas}
    for name in (*ROWS, always, "oracle"):
        p = make_policy(name, None)
        for k, alpha in enumerate(alphas):
            if k == 0 or name.startswith("auto"):
                p.fit(ep, sp.train, alpha, seed)
            m = p.evaluate(ep, sp, alpha, seed)
            row = row_from_metrics(name, m, **getattr(p, "result_extra", dict)())
            out[alpha][name] = {
                "cost": np.asarray(row.cost_cents_per_split),
                "coverage": row.coverage,
                "rounds": row.avg_len,
                "refused": row.extra.get("refused_share"),
                "skipped": _skipped_share(p, ep, sp),
            }
    for rows in out.values():
        floor, yardstick = rows["oracle"]["cost"].mean(), rows[always]["cost"].mean()
        for r in rows.values():
            r["rel_oracle"] = float(r["cost"].mean() / floor)
            r["rel_always"] = float(r["cost"].mean() / yardstick)
            r["cost"] = float(r["cost"].mean())
    return out


def _ms(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f}"


def _opt(xs: list[float | None]) -> str:
    got = [x for x in xs if x is not None]
    return f"{statistics.fmean(got):.2f}" if got else "–"


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_routing.json"))
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    results = {}
    for name, path in resolve_data(args.data).items():
        prices = prices_for(path)
        gold = read_traces(path)
        free, ref = relabel_against_strongest(gold, prices)
        for label, traces in ((name, gold), (f"{name} (label-free, vs {ref})", free)):
            ep = build_episodes(traces, prices)
            what = against_text(ep.labels)
            t0 = time.perf_counter()
            seeds = [run_seed(ep, alphas, s, args.splits) for s in range(args.seeds)]
            secs = time.perf_counter() - t0
            for alpha in alphas:
                runs = [by[alpha] for by in seeds]
                key = f"{label}, α = {alpha:g}"
                print(f"\n{key}: {args.seeds} seeds × {args.splits} splits ({secs:.0f} s all α)")
                print(
                    f"| row | {what} (target {1 - alpha:.2f}) | cost ÷ always | cost ÷ oracle "
                    "| rounds | refused | started later |\n|---|---|---|---|---|---|---|"
                )
                table = {}
                for row in runs[0]:
                    rs = [r[row] for r in runs]
                    table[row] = {k: [r[k] for r in rs] for k in rs[0]}
                    t = table[row]
                    print(
                        f"| {row} | {_ms(t['coverage'])} | {_ms(t['rel_always'])} | "
                        f"{_ms(t['rel_oracle'])} | {statistics.fmean(t['rounds']):.2f} | "
                        f"{_opt(t['refused'])} | {_opt(t['skipped'])} |"
                    )
                results[key] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
