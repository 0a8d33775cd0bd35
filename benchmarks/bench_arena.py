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

``--data FILE`` scores another build of the set instead (e.g. the one without signals).

    python benchmarks/bench_arena.py [--seeds 5] [--splits 20] [--alpha 0.1 --alpha 0.2]
        [--data FILE] [--ccpo] [--out runs/bench_arena.json]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from _sweep import mean_sd, sweep_parser, write_results

from ccpo.evaluation.harness import make_splits, prices_for, split_sizes, with_latency
from ccpo.evaluation.reproduce import resolve_data
from ccpo.evaluation.rows import TrainingCache, make_policy
from ccpo.learning.config import TrainConfig
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces

ROWS = ("cstop-single", "auto-single", "cstop-single+route", "cstop", "prompt-router")
#: rows whose fit depends on α (the others store α only, and are calibrated per α)
PER_ALPHA = ("auto-single", "cstop-single+route", "prompt-router", "ccpo")


def run_seed(ep, alphas, seed: int, splits: int, rows=ROWS) -> dict[float, dict]:
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    always = f"always-{ep.strongest}"
    out: dict[float, dict] = {a: {} for a in alphas}
    for name in (*rows, always, "oracle"):
        for k, alpha in enumerate(alphas):
            if k == 0 or name in PER_ALPHA:  # a fresh row (ccpo: trained at this α)
                p = make_policy(name, TrainingCache(replace(TrainConfig(), seed=seed)))
                p.fit(ep, sp.train, alpha, seed)
            m = with_latency(ep, p.evaluate(ep, sp, alpha, seed), sp.test)
            lat = m.latency
            out[alpha][name] = {
                "cost": float(m.cost.sum(-1).mean()),
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
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    (name, path), *_ = resolve_data(args.data or ["arena-public"]).items()
    ep = build_episodes(read_traces(path), prices_for(path))
    t0 = time.perf_counter()
    seeds = []
    for s in range(args.seeds):
        rows = (*ROWS, "ccpo") if args.ccpo else ROWS
        seeds.append(run_seed(ep, alphas, s, args.splits, rows))
        print(f"seed {s} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    results = {}
    for alpha in alphas:
        runs = [by[alpha] for by in seeds]
        print(f"\n{name}, α = {alpha:g}: {args.seeds} seeds × {args.splits} splits")
        print(
            f"| row | judged acceptance (target {1 - alpha:.2f}) | cost ÷ always | "
            "cost ÷ oracle | rounds | latency s | set size |\n|---|---|---|---|---|---|---|"
        )
        table = {}
        for row in runs[0]:
            t = {k: [r[row][k] for r in runs] for k in runs[0][row]}
            table[row] = t
            print(
                f"| {row} | {mean_sd(t['acceptance'])} | {mean_sd(t['rel_always'])} | "
                f"{mean_sd(t['rel_oracle'])} | {statistics.fmean(t['rounds']):.2f} | "
                f"{statistics.fmean(t['latency']):.1f} | {statistics.fmean(t['set_size']):.2f} |"
            )
        results[f"α = {alpha:g}"] = table
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
