"""Benchmark: one reply under the marginal guarantee and under Learn-then-Test, on small logs.

A team's own logs are small: a judged multi-turn chat benchmark has a few hundred turns, and
``check`` keeps half of them. This draws, ``--draws`` times, ``--questions`` prompts of a
two-model sub-ladder of the bundled ``arena-public`` (default mixtral-8x7b → gpt-4-1106-preview,
60× apart in price), keeps half to check, and runs ``train``'s pipeline on the other half (its
split: ``train_size`` to fit, the rest to calibrate; ``auto`` of one answer, every candidate)
with ``--guarantee marginal`` and ``--guarantee pac`` (δ = 0.1). Accepted = the judge rated the
reply at most ``--points`` below gpt-4-1106-preview's (the bundled set uses 1; a larger margin
makes the cheap model acceptable more often, as on easier chat benchmarks). Per guarantee and
α: mean acceptance on the checked half (and its lowest draw, and the share of draws below
1 − α), cost ÷ always the strong model, the strong model's share of calls, and what auto picked.

    python benchmarks/bench_guarantee.py [--draws 20] [--questions 160] [--points 4]
        [--alpha 0.2 --alpha 0.1] [--models A,B] [--out runs/bench_guarantee.json]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _sweep import write_results

from ccpo.evaluation.harness import prices_for, train_size
from ccpo.evaluation.reproduce import resolve_data
from ccpo.policies.pipeline import train_policy
from ccpo.policies.single import Unreachable
from ccpo.policies.spec import parse_spec
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from ccpo.traces.steps import sub_ladder

MODELS = "mixtral-8x7b-instruct-v0.1,gpt-4-1106-preview"


def relabelled(traces, points: float):
    """Each reply accepted iff its judge score is at least the last model's minus ``points``."""
    out = []
    for tr in traces:
        ref = float(tr.rounds[-1].base.score)
        rounds = []
        for r in tr.rounds:
            ok = float(r.base.score) >= ref - points
            steps = {k: getattr(r, k).model_copy(update={"correct": ok}) for k in ("base", "guide")}
            rounds.append(r.model_copy(update=steps))
        out.append(tr.model_copy(update={"rounds": rounds}))
    return out


def one_draw(ep, draw: int, n: int, alpha: float, guarantee: str) -> dict:
    rng = np.random.default_rng([draw, 77])
    pick = rng.permutation(ep.n)[:n]
    pool, test = pick[: n // 2], pick[n // 2 :]
    fit = train_size(pool.size, single=True)
    spec = parse_spec("auto", answer="single", settings={"guarantee": guarantee})
    try:
        pol = train_policy(spec, ep, pool[:fit], alpha, draw, cal=pool[fit:]).policy
    except Unreachable:
        return {"refused": True}
    sub = ep.subset(test)
    m = pol.rollout(sub, pol.episode_scores(sub), pol.threshold)
    strong = sub.strongest_cost
    return {
        "refused": False,
        "acceptance": float(m.covered.mean()),
        "cost_ratio": float(m.cost.mean() / strong.mean()),
        "strong_share": float((m.cost >= strong * (1 - 1e-9)).mean()),
        "picked": pol.info.get("auto", {}).get("picked", pol.variant),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--questions", type=int, default=160)
    ap.add_argument("--points", type=float, default=4.0)
    ap.add_argument("--alpha", type=float, action="append")
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--out", type=Path, default=Path("runs/bench_guarantee.json"))
    args = ap.parse_args()
    alphas = args.alpha or (0.2, 0.1)
    (_, path), *_ = resolve_data(["arena-public"]).items()
    traces = relabelled(sub_ladder(read_traces(path), args.models.split(",")), args.points)
    ep = build_episodes(traces, prices_for(path))
    cheap = float(ep.correct[:, 0, 0].mean())
    print(f"{args.models}: {ep.n} prompts, cheap reply accepted on {cheap:.3f} "
          f"(at most {args.points:g} points below); {args.draws} draws of {args.questions}",
          flush=True)  # fmt: skip
    t0 = time.perf_counter()
    results: dict = {"models": args.models, "points": args.points, "cheap_accepted": cheap}
    for alpha in alphas:
        print(f"\nα = {alpha:g}\n| guarantee | acceptance (lowest; share < {1 - alpha:.2f}) | "
              "cost ÷ always strong | strong share | refused | auto picked |\n"
              "|---|---|---|---|---|---|")  # fmt: skip
        for guarantee in ("marginal", "pac"):
            # interleaved by draw: both guarantees see the same prompts
            rows = [one_draw(ep, d, args.questions, alpha, guarantee) for d in range(args.draws)]
            ok = [r for r in rows if not r["refused"]]
            acc = np.array([r["acceptance"] for r in ok])
            cost = np.array([r["cost_ratio"] for r in ok])
            share = np.mean([r["strong_share"] for r in ok]) if ok else float("nan")
            picks = Counter(r["picked"] for r in ok).most_common(3)
            low = f"{acc.min():.3f}; {(acc < 1 - alpha).mean():.2f}"
            print(f"| {guarantee} | {acc.mean():.3f} ({low}) "
                  f"| {cost.mean():.3f} ± {cost.std():.3f} | {share:.2f} | "
                  f"{len(rows) - len(ok)}/{len(rows)} | "
                  f"{', '.join(f'{p} {c}' for p, c in picks)} |", flush=True)  # fmt: skip
            results[f"{guarantee}@{alpha:g}"] = rows
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
