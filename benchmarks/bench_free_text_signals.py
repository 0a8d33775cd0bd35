"""Benchmark: do the free-text signals make a stopping policy cheaper at the same acceptance?

A free-text set is built here (nothing bundled) from ``arena-bench-v1`` (Apache-2.0; real
replies of real models to 300 hard Chatbot-Arena prompts, each judged by GPT-4 against a
reference): the replies of three models as a cascade, Mistral-7B-Instruct-v0.1 →
Mixtral-8x7B-Instruct-v0.1 → gpt-4-1106-preview (the judgment file ``gpt-4-turbo``), imported
as ``ccpo traces import`` would (an ``agree`` ladder, family ``exact``); a reply is accepted
(``correct``) iff its judge score is ≥ 8 (an unrated reply counts as not accepted). Tokens are
counted from the texts (characters / 4); prices are stand-ins written below. The same traces
are featurized twice: v1 features only, and with the ladder signals ``similarity, length,
refusal, logprob`` (computed from the replies; ``embedding`` and ``verdict`` need calls and
are not measured here).

For each seed (its own training split of 150 questions; 100 calibration/test splits of the
other 150 into 75 + 75), single-answer ``cstop`` and ``auto`` are fitted on each feature set
and calibrated by Learn-then-Test (δ = 0.1) at each α; reported: held-out coverage as the
guarantee counts it (the reply is accepted, or no rung's reply is) and cost ÷ always-gpt-4,
mean ± sd over seeds. A threshold sweep on the held-out questions also gives each fitted
score's least cost at a fixed held-out coverage (0.80, 0.85, 0.90), which compares the
scores without the calibration's noise. ``--ablate`` adds each signal alone.

    python benchmarks/bench_free_text_signals.py [--seeds 5] [--splits 100]
        [--alpha 0.1 --alpha 0.2] [--data DIR] [--ablate] [--out runs/free_text_signals.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ccpo.evaluation.harness import make_splits, row_from_metrics
from ccpo.evaluation.rows import make_policy
from ccpo.policies.registry import fit_policy
from ccpo.traces.episodes import build_episodes, single_rollout
from ccpo.traces.importer import import_signals, import_table, with_text_signals
from ccpo.traces.prices import ModelPrice, PriceTable, load_prices

DATA = Path("/work/shared/data/arena-bench-v1")
#: (answer file, judgment file, price in / out USD per million tokens: stand-ins, list prices
#: of early 2024 as published by Mistral AI and OpenAI; not bundled, not a claim)
MODELS = {
    "mistral-7b": ("Mistral-7B-Instruct-v0.1", "Mistral-7B-Instruct-v0.1", 0.25, 0.25),
    "mixtral-8x7b": ("Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B-Instruct-v0.1", 0.7, 0.7),
    "gpt-4-turbo": ("gpt-4-1106-preview", "gpt-4-turbo", 10.0, 30.0),
}
SIGNALS = ["similarity", "length", "refusal", "logprob"]
ACCEPT = 8
SIZES = (150, 75, 75)
TARGETS = (0.80, 0.85, 0.90)
METHODS = ("cstop-single", "cstop-lr-single", "auto-single")


def _rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def build_table(data: Path, out: Path) -> tuple[Path, dict[str, int]]:
    """The import table (JSONL) of the three models' replies, labelled score ≥ 8."""
    questions = {q["question_id"]: q["turns"][0] for q in _rows(data / "question.jsonl.gz")}
    unrated: dict[str, int] = {}
    with open(out, "w", encoding="utf-8") as fh:
        for name, (answers, judged, _, _) in MODELS.items():
            score = {
                r["question_id"]: r["score"]
                for r in _rows(data / f"model_judgment/{judged}.jsonl.gz")
            }
            unrated[name] = sum(s is None for s in score.values())
            for a in _rows(data / f"model_answer/{answers}.jsonl.gz"):
                qid = a["question_id"]
                if qid not in questions or qid not in score:
                    continue
                text = a["choices"][0]["turns"][0]
                s = score[qid]
                row = {
                    "question_id": qid,
                    "question": questions[qid],
                    "model": name,
                    "answer": text,
                    "correct": s is not None and float(s) >= ACCEPT,
                    "input_tokens": max(1, len(questions[qid]) // 4),
                    "output_tokens": max(1, len(text) // 4),
                }
                fh.write(json.dumps(row) + "\n")
    return out, unrated


def least_cost_at(ep, scores, idx: np.ndarray, targets) -> dict[float, float]:
    """The least mean cost per question over stopping thresholds whose held-out coverage on
    ``idx`` (accepted, or no rung accepted) reaches each target; nan where none does."""
    sub, sc = ep.subset(idx), np.asarray(scores)[idx]
    grid = np.unique(np.concatenate([np.quantile(sc, np.linspace(0, 1, 201)), [np.inf]]))
    pts = []
    for lam in grid:
        m = single_rollout(sub, sc, float(lam))
        pts.append((float(m.covered.mean()), float(m.cost.mean())))
    return {t: min((c for a, c in pts if a >= t), default=float("nan")) for t in targets}


def run_seed(eps: dict, alphas, seed: int, splits: int) -> dict:
    out: dict = {}
    any_ep = next(iter(eps.values()))
    sp = make_splits(any_ep.n, SIZES, splits, seed)
    always = make_policy(f"always-{any_ep.strongest}", None)
    for feats, ep in eps.items():
        for alpha in alphas:
            always.fit(ep, sp.train, alpha, seed)
            base = row_from_metrics("always", always.evaluate(ep, sp, alpha, seed))
            yard = float(np.mean(base.cost_cents_per_split))
            for method in METHODS:
                p = make_policy(method, None)
                p.fit(ep, sp.train, alpha, seed)
                row = row_from_metrics(method, p.evaluate(ep, sp, alpha, seed),
                                       **getattr(p, "result_extra", dict)())  # fmt: skip
                out[(feats, alpha, method)] = {
                    "acceptance": row.coverage,
                    "rel_always": float(np.mean(row.cost_cents_per_split)) / yard,
                    "refused": row.extra.get("refused_share"),
                }
        pol = fit_policy("cstop", ep, sp.train, 0.2, seed, single=True)
        held = np.setdiff1d(np.arange(ep.n), sp.train)
        at = least_cost_at(ep, pol.scores(ep.obs), held, TARGETS)
        yard_q = float(ep.strongest_cost[held].mean())
        for t, c in at.items():
            out[(feats, "matched", t)] = c / yard_q
    return out


def _ms(xs) -> str:
    xs = [x for x in xs if x is not None and not np.isnan(x)]
    if not xs:
        return "–"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--alpha", type=float, action="append")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--splits", type=int, default=100)
    ap.add_argument("--out", type=Path, default=Path("runs/free_text_signals.json"))
    ap.add_argument("--ablate", action="store_true", help="also each signal alone")
    args = ap.parse_args()
    alphas = args.alpha or [0.1, 0.2]
    own = {m: ModelPrice(input_usd_per_mtok=i, output_usd_per_mtok=o, source="bench stand-in")
           for m, (_, _, i, o) in MODELS.items()}  # fmt: skip
    prices = load_prices(PriceTable(own, ["bench stand-in"]))
    with tempfile.TemporaryDirectory() as tmp:
        table, unrated = build_table(args.data, Path(tmp) / "arena3.jsonl")
        traces, _ = import_table(table, "arena", prices, family="exact")
    sets = {"v1": (), "v1 + signals": import_signals(SIGNALS)}
    if args.ablate:
        sets.update({f"v1 + {s}": (s,) for s in SIGNALS if s != "logprob"})
    eps = {
        name: build_episodes([with_text_signals(t, sig) for t in traces], prices)
        for name, sig in sets.items()
    }
    ep = eps["v1"]
    acc = {
        name: statistics.fmean(
            next(s.correct for r in t.rounds for s in (r.base, r.guide) if s.model == name)
            for t in traces
        )
        for name in MODELS
    }
    print(f"{ep.n} questions, {ep.horizon} rounds; accepted (score ≥ {ACCEPT}): "
          f"{ {m: round(a, 3) for m, a in acc.items()} }; solvable {ep.solvable.mean():.3f}; "
          f"unrated replies {unrated}")  # fmt: skip
    t0 = time.perf_counter()
    runs = [run_seed(eps, alphas, s, args.splits) for s in range(args.seeds)]
    print(f"{args.seeds} seeds × {args.splits} splits in {time.perf_counter() - t0:.0f} s\n")
    results: dict = {}
    print(f"{'features':14s} {'α':>5s} {'row':14s} {'coverage':>16s} {'cost/always':>16s} "
          f"{'refused':>8s}")  # fmt: skip
    for key in runs[0]:
        vals = [r[key] for r in runs]
        results[" | ".join(map(str, key))] = vals
        if key[1] == "matched":
            continue
        feats, alpha, method = key
        print(f"{feats:14s} {alpha:5.2f} {method:14s} "
              f"{_ms([v['acceptance'] for v in vals]):>16s} "
              f"{_ms([v['rel_always'] for v in vals]):>16s} "
              f"{_ms([v['refused'] for v in vals]):>8s}")  # fmt: skip
    print("\npaired by seed, with signals − v1 (cost ÷ always; seeds where signals are cheaper)")
    for alpha in alphas:
        for method in METHODS:
            d = [r[("v1 + signals", alpha, method)]["rel_always"]
                 - r[("v1", alpha, method)]["rel_always"] for r in runs]  # fmt: skip
            print(
                f"  α = {alpha:.2f} {method:16s} {_ms(d):>16s}  "
                f"{sum(x < 0 for x in d)}/{len(d)} cheaper, {sum(x > 0 for x in d)} dearer"
            )
    print("\nleast cost ÷ always at a held-out coverage (cstop score, threshold sweep)")
    for t in TARGETS:
        print(f"  coverage ≥ {t:.2f}:")
        for f in eps:
            d = [r[(f, "matched", t)] - r[("v1", "matched", t)] for r in runs]
            print(
                f"    {f:18s} {_ms([r[(f, 'matched', t)] for r in runs]):>16s}   "
                f"− v1 paired: {_ms(d)}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
