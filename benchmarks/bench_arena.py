"""Benchmark: the judged guarantee on the bundled open-ended set, beside a prompt-only router.

On ``arena-public`` (291 hard Chatbot-Arena prompts, five models' real replies, a GPT-4
judge's ratings; accepted = rated at most one point below gpt-4-1106-preview's reply; the
ladder records the lexical signals similarity, length, refusal), for α ∈ {0.1, 0.2} and seeds
0..4 (each seed: its own training split, its own fits, ``--splits`` calibration/test splits
of the held-out questions, the sizes of ``ccpo compare``), it scores

- ``cstop-single``, ``auto-single``: one reply, λ̂ by Learn-then-Test (δ = 0.1) on each
  calibration split (guarantee: P(judge accepts the reply) ≥ 1 − α with prob. ≥ 1 − δ);
- ``cstop-single+route``: the same behind the question-text router (τ̂ on training);
- ``cstop`` (and ``ccpo`` with ``--ccpo``: RL training, about a minute per seed): the set
  policies (split-conformal κ̂; covered = some reply of the set accepted);
- ``always-gpt-4-1106-preview`` (the yardstick), ``prompt-router`` (no guarantee: a text
  classifier per cheaper model, threshold fitted on the training questions) and ``oracle``;

and prints per α and row, mean ± sd over seeds of the mean over splits: judged acceptance on
the held-out questions, cost ÷ always-the-strongest, cost ÷ oracle floor, rounds run and the
estimated end-to-end latency (:mod:`ccpo.traces.latency`: 0.5 s to the first token, 50
tokens/s, an agree round's two calls at once; a routed question counts the rounds it runs,
its first round's calls at once: ``RouteViews.latency``).

``--data FILE`` scores another build of the set instead (e.g. the one without signals, or one
imported with ``--steps pair``). ``--models A,B`` scores the sub-ladder of those models
(:func:`ccpo.traces.steps.sub_ladder`: e.g. a two-model ladder). ``--split train`` uses
``ccpo train``'s split instead of ``compare``'s: a quarter of the questions held out for the
test, the rest split as ``train`` splits a single answer (:func:`ccpo.evaluation.harness.
train_size`: 30% to fit, the rest to calibrate). ``--rows`` picks the rows (comma-separated;
``router`` is ``depth-k-single+route``: the routed start alone, no look at the reply).
"strong share" is the share of test questions on which the strongest model was paid.

    python benchmarks/bench_arena.py [--seeds 5] [--splits 20] [--alpha 0.1 --alpha 0.2]
        [--data FILE] [--models A,B] [--split compare|train] [--rows R1,R2] [--ccpo]
        [--out runs/bench_arena.json]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from _sweep import mean_sd, sweep_parser, write_results

from ccpo.evaluation.harness import (
    make_splits,
    prices_for,
    split_sizes,
    train_size,
    with_latency,
)
from ccpo.evaluation.reproduce import resolve_data
from ccpo.evaluation.rows import TrainingCache, make_policy
from ccpo.learning.config import TrainConfig
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from ccpo.traces.steps import sub_ladder

ROWS = ("cstop-single", "auto-single", "cstop-single+route", "cstop", "prompt-router")
#: rows whose fit depends on α (the others store α only, and are calibrated per α)
PER_ALPHA = ("auto-single", "cstop-single+route", "prompt-router", "ccpo", "router",
             "depth-k-single+route", "cstop-lr-single+route")  # fmt: skip
ALIASES = {"router": "depth-k-single+route"}


def sizes_for(n: int, split: str) -> tuple[int, int, int]:
    """(train, calibration, test) sizes: ``compare``'s 5:1:1, or ``train``'s rule on the
    three quarters not held out for the test."""
    if split == "compare":
        return split_sizes(n)
    test = n // 4
    fit = train_size(n - test, single=True)
    return fit, n - test - fit, test


def run_seed(ep, alphas, seed: int, splits: int, rows=ROWS, split="compare") -> dict:
    sp = make_splits(ep.n, sizes_for(ep.n, split), splits, seed)
    always = f"always-{ep.strongest}"
    out: dict[float, dict] = {a: {} for a in alphas}
    strong = ep.strongest_cost[sp.test]  # [K, n]
    for name in (*rows, always, "oracle"):
        for k, alpha in enumerate(alphas):
            if k == 0 or name in PER_ALPHA:  # a fresh row (ccpo: trained at this α)
                p = make_policy(
                    ALIASES.get(name, name), TrainingCache(replace(TrainConfig(), seed=seed))
                )
                p.fit(ep, sp.train, alpha, seed)
            m = with_latency(ep, p.evaluate(ep, sp, alpha, seed), sp.test)
            lat = m.latency
            out[alpha][name] = {
                "cost": float(m.cost.sum(-1).mean()),
                "strong_share": float((m.cost >= strong * (1 - 1e-9)).mean()),
                "acceptance": float(m.covered.mean()),
                "rounds": float(m.length.mean()),
                "latency": float(lat.mean()),
                "set_size": float(m.set_size.mean()),
            }
    for rows in out.values():
        floor, yardstick = rows["oracle"]["cost"], rows[always]["cost"]
        for r in rows.values():
            r["rel_oracle"], r["rel_always"] = r["cost"] / floor, r["cost"] / yardstick
    return out


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.set_defaults(splits=20)
    ap.add_argument("--ccpo", action="store_true", help="also the RL set policy ccpo")
    ap.add_argument("--out", type=Path, default=Path("runs/bench_arena.json"))
    ap.add_argument("--models", help="the sub-ladder of these models (comma-separated)")
    ap.add_argument("--split", choices=("compare", "train"), default="compare")
    ap.add_argument("--rows", help="rows to score (comma-separated) [%(default)s]",
                    default=",".join(ROWS))  # fmt: skip
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    (name, path), *_ = resolve_data(args.data or ["arena-public"]).items()
    traces = read_traces(path)
    if args.models:
        traces = sub_ladder(traces, args.models.split(","))
        name = f"{name} [{' → '.join(args.models.split(','))}]"
    ep = build_episodes(traces, prices_for(path))
    t0 = time.perf_counter()
    seeds = []
    sizes = sizes_for(ep.n, args.split)
    print(f"{name}: T = {ep.horizon}; train / calibration / test = {sizes}", flush=True)
    for s in range(args.seeds):
        rows = tuple(args.rows.split(",")) + (("ccpo",) if args.ccpo else ())
        seeds.append(run_seed(ep, alphas, s, args.splits, rows, args.split))
        print(f"seed {s} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    results = {}
    for alpha in alphas:
        runs = [by[alpha] for by in seeds]
        print(f"\n{name}, α = {alpha:g}: {args.seeds} seeds × {args.splits} splits")
        print(
            f"| row | judged acceptance (target {1 - alpha:.2f}) | cost ÷ always | "
            "cost ÷ oracle | strong share | rounds | latency s | set size |\n"
            "|---|---|---|---|---|---|---|---|"
        )
        table = {}
        for row in runs[0]:
            t = {k: [r[row][k] for r in runs] for k in runs[0][row]}
            table[row] = t
            print(
                f"| {row} | {mean_sd(t['acceptance'])} | {mean_sd(t['rel_always'])} | "
                f"{mean_sd(t['rel_oracle'])} | {statistics.fmean(t['strong_share']):.2f} | "
                f"{statistics.fmean(t['rounds']):.2f} | "
                f"{statistics.fmean(t['latency']):.1f} | {statistics.fmean(t['set_size']):.2f} |"
            )
        results[f"α = {alpha:g}"] = table
        for row, t in table.items():
            if row.endswith(("single", "route", "router")):
                per = ", ".join(f"{a:.3f}" for a in t["acceptance"])
                print(f"acceptance per seed, {row}: {per}")
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
