"""Benchmark: policy quality on every bundled real trace set × α × seed (the project's yardstick).

For each set, α ∈ {0.05, 0.1, 0.2} and seeds 0..4 (each seed: its own training split, its own
training runs, its own 100 evaluation splits) it runs every method of ``ccpo compare`` and
prints, per (set, α) and method, mean ± sd over the seeds of

- cost / oracle: the method's mean test-split cost over the oracle floor's on the same splits;
- coverage: mean over seeds and splits, and the worst single split;
- ccpo / cpo-batch: the cost ratio per seed, mean ± sd;
- train s: the method's fit time per (set, α, seed) (CStop / depth-k / auto; the RL methods'
  training is timed per run in ``bench_train.py``).

It ends with one summary table: per (set, α) the best method at coverage ≥ 1 − α − 0.005 and its
cost / oracle. Results go to ``--out`` (JSON) as well.

    python benchmarks/bench_policy_quality.py [--seeds 5] [--splits 100] [--steps 2000]
        [--alpha 0.05 --alpha 0.1 --alpha 0.2] [--data NAME|FILE ...] [--methods a,b,...]
        [--set key=value ...]   # TrainConfig overrides for ccpo / cpo, e.g. --set eta0=0.05
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
from _sweep import ALPHAS, sweep_parser

from ccpo.evaluation.harness import load_episodes, make_splits, row_from_metrics, split_sizes
from ccpo.evaluation.reproduce import resolve_data
from ccpo.evaluation.rows import (
    SpecRow,
    TrainingCache,
    available_policies,
    make_policy,
    training_key,
    training_pool,
)
from ccpo.learning.baselines import oracle_metrics
from ccpo.learning.config import TrainConfig


def _override(cfg: TrainConfig, pairs: list[str]) -> TrainConfig:
    types = {f.name: f.type for f in fields(TrainConfig)}
    kw = {}
    for p in pairs:
        k, v = p.split("=", 1)
        if k not in types:
            raise SystemExit(f"--set: TrainConfig has no field '{k}'")
        t = str(types[k])
        kw[k] = (v.lower() in ("1", "true", "yes")) if "bool" in t else type(getattr(cfg, k))(v)
    return replace(cfg, **kw)


def run_one(path: Path, alpha: float, seed: int, args, pool) -> dict:
    ep, _ = load_episodes(path)
    sizes = split_sizes(ep.n)
    sp = make_splits(ep.n, sizes, args.splits, seed)
    names = available_policies(ep)
    names[-1:-1] = [f"ccpo-lam{lam:g}" for lam in args.lams]
    names = [n for n in names if n in args.methods or not args.methods]
    cache = TrainingCache(_override(TrainConfig(steps=args.steps, seed=seed), args.set))
    pols = [make_policy(n, cache) for n in names]
    keys = [training_key(p.spec) for p in pols if isinstance(p, SpecRow) and p.spec.trains]
    cache.submit(keys, ep, sp.train, alpha, pool)
    oracle_cost = oracle_metrics(ep, sp.test, alpha).cost.sum(-1) * 100  # [R] cents
    out = {}
    for p in pols:
        t0 = time.perf_counter()
        p.fit(ep, sp.train, alpha, seed)
        fit_s = time.perf_counter() - t0
        m = p.evaluate(ep, sp, alpha, seed)
        row = row_from_metrics(p.name, m)
        cost = np.asarray(row.cost_cents_per_split)
        out[p.name] = {
            "cost_cents": row.cost_cents,
            "ratio": float(cost.mean() / oracle_cost.mean()),
            "coverage": row.coverage,
            "worst_split": float(min(row.coverage_per_split)),
            "set_size": row.set_size,
            "fit_s": fit_s if isinstance(p, SpecRow) and not p.spec.trains else None,
            **({"picked": p.choice["picked"]} if getattr(p, "choice", None) else {}),
        }
    return out


def _ms(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f}"


def summarise(name: str, alpha: float, runs: list[dict]) -> tuple[str, dict]:
    methods = list(runs[0])
    lines = [
        f"### {name}, α = {alpha:g} ({len(runs)} seeds; target coverage {1 - alpha:.3f})",
        "",
        "| method | cost / oracle | cost (¢ per test split) | coverage | worst split | "
        "set size | fit s (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    best = None
    for m in methods:
        rs = [r[m] for r in runs]
        cov = statistics.fmean(x["coverage"] for x in rs)
        ratio = [x["ratio"] for x in rs]
        fit = [x["fit_s"] for x in rs if x["fit_s"] is not None]
        miss = " (misses)" if cov < 1 - alpha - 0.005 and m != "oracle" else ""
        lines.append(
            f"| {m} | {_ms(ratio)}{miss} | {_ms([x['cost_cents'] for x in rs])} | {cov:.4f} | "
            f"{min(x['worst_split'] for x in rs):.3f} | "
            f"{statistics.fmean(x['set_size'] for x in rs):.2f} | "
            f"{statistics.median(fit):.2f} |"
            if fit
            else f"| {m} | {_ms(ratio)}{miss} | {_ms([x['cost_cents'] for x in rs])} | "
            f"{cov:.4f} | {min(x['worst_split'] for x in rs):.3f} | "
            f"{statistics.fmean(x['set_size'] for x in rs):.2f} | – |"
        )
        if m != "oracle" and not miss and (best is None or statistics.fmean(ratio) < best[1]):
            best = (m, statistics.fmean(ratio), statistics.stdev(ratio) if len(ratio) > 1 else 0)
    if "ccpo" in methods and "cpo-batch" in methods:
        r = [x["ccpo"]["cost_cents"] / x["cpo-batch"]["cost_cents"] for x in runs]
        lines += ["", f"ccpo / cpo-batch: {_ms(r)} (seeds: {', '.join(f'{x:.3f}' for x in r)})"]
    if "auto" in methods:
        picks = [x["auto"].get("picked", "?") for x in runs]
        lines += [f"auto picked: {', '.join(picks)}"]
    return "\n".join(lines) + "\n", {"best": best}


def main() -> None:
    ap = sweep_parser(__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--methods", default="", help="comma-separated subset [every method]")
    ap.add_argument("--set", action="append", default=[], help="TrainConfig override k=v")
    ap.add_argument(
        "--lams", type=float, nargs="*", help="ccpo-lam rows (λ) [0.5; none with --methods]"
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_policy_quality.json"))
    args = ap.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    if args.lams is None:  # a --methods subset trains no λ row unless --lams asks for one
        args.lams = [] if args.methods else [0.5]
    args.methods += [f"ccpo-lam{lam:g}" for lam in args.lams] if args.methods else []
    if args.methods and "oracle" not in args.methods:
        args.methods.append("oracle")
    alphas = args.alpha or list(ALPHAS)
    sets = resolve_data(args.data)
    t0 = time.perf_counter()
    results: dict[str, dict] = {}
    summary = [
        "| set | α | best method (coverage ≥ 1 − α − 0.005) | cost / oracle |",
        "|---|---|---|---|",
    ]
    report = []
    with training_pool(args.workers) as pool:
        for name, path in sets.items():
            for alpha in alphas:
                runs = [run_one(path, alpha, s, args, pool) for s in range(args.seeds)]
                results[f"{name}@{alpha:g}"] = runs
                text, info = summarise(name, alpha, runs)
                report.append(text)
                print(text, flush=True)
                b = info["best"]
                summary.append(
                    f"| {name} | {alpha:g} | {b[0] if b else '–'} | "
                    + (f"{b[1]:.3f} ± {b[2]:.3f} |" if b else "– |")
                )
    print("\n".join(summary))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": results, "report": report, "summary": summary}))


if __name__ == "__main__":
    main()
