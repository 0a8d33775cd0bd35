"""Benchmark: two-model ladders with gold labels, from the public logs (the math bar's proxy).

Issue 50's held-out check includes a two-model ladder with gold labels (a grade-school math
set): ``traces import`` → ``train --answer single`` on one half → ``check`` on the other, at
α = 0.2. No such logs are bundled; the nearest public ones are the HotpotQA runs of the
label-free benchmark (:mod:`bench_label_free_steps`, same readers, tokens and dated prices),
here labelled by HotpotQA's gold answer (a ``gold`` column; the ``short`` family's
SQuAD-normalised exact match) instead of agreement with the dearest model. Two-model ladders
(``--pairs``, cheap → strong), one model per step (the import's default), ``--signals
length,refusal`` (the reply's own signals; these logs record no log-probs).

Per seed the questions are shuffled and halved; ``ccpo train --answer single --alpha α
--seed s --method M`` on one half (``train``'s own split), ``ccpo check --json`` on the
other. Acceptance is ``check``'s coverage: the returned reply is right, a question no model
gets right counted as covered (the guarantee's population is the solvable questions); the
table also gives accuracy over all questions,
cost ÷ always-the-strong model, the share of questions on which the strong model was paid,
rounds and the oracle floor. EM on HotpotQA is low (the strong model is right on about a
third of the questions), so this is a proxy for the pipeline, not for the math bar's prices.

    python benchmarks/bench_gold_two_model.py [--logs DIR] [--seeds 5] [--alpha 0.2]
        [--pairs llama-2-13b-fireact:gpt-3.5-turbo-0613-fireact,...] [--methods auto,cstop]
        [--jobs 1] [--work runs/gold_two_model] [--out runs/bench_gold_two_model.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from itertools import product
from pathlib import Path

import bench_label_free_steps as lf
from _sweep import mean_sd, run_grouped, write_results

ROOT = Path(__file__).resolve().parents[1]
PAIRS = (
    "llama-2-13b-fireact:gpt-3.5-turbo-0613-fireact",
    "llama-2-70b:gpt-3.5-turbo-0613-fireact",
    "llama-2-7b-fireact:gpt-3.5-turbo-instruct",
)


def gold_table(logs_dir: Path, hotpot: Path, cheap: str, strong: str) -> list[dict]:
    """The rows of ``cheap`` and ``strong`` from the five-model HotpotQA table, each with the
    question's gold answer (``hotpot_dev_v1_simplified.json`` by question index)."""
    gold = json.loads(hotpot.read_text(encoding="utf-8"))
    rows = [r for r in lf.hotpotqa_table(logs_dir) if r["model"] in (cheap, strong)]
    for r in rows:
        r["gold"] = str(gold[int(r["question_id"].rsplit("-", 1)[1])]["answer"])
    return rows


def ladder(logs_dir: Path, hotpot: Path, pair: str, work: Path) -> Path:
    """Import the two-model gold table of ``pair`` (one model per step) into ``work``."""
    cheap, strong = pair.split(":")
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table.jsonl"
    rows = gold_table(logs_dir, hotpot, cheap, strong)
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    prices = work / "prices.json"
    prices.write_text(json.dumps(lf.PRICES, indent=1) + "\n", encoding="utf-8")
    out = work / "traces.jsonl"
    lf.cli("traces", "import", table, "--task", "hotpotqa", "--prices", prices,
           "--signals", "length,refusal", "--out", out, "--force")  # fmt: skip
    return out


def run_one(train: Path, check: Path, alpha: float, seed: int, method: str, out: Path) -> dict:
    """``ccpo train --answer single`` on ``train``, ``ccpo check --json`` on ``check``; a
    training that refuses (nothing certifiable at α) is ``{"refused": why}``."""
    cmd = [sys.executable, "-m", "ccpo", "train", "--traces", train, "--out", out, "--answer",
           "single", "--alpha", alpha, "--seed", seed, "--method", method, "--force"]  # fmt: skip
    p = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
    if p.returncode == 2 and ("cannot be certified" in p.stderr or "certify only" in p.stderr):
        return {"refused": " ".join(p.stderr.split())}
    if p.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {p.returncode}\n{p.stderr[-3000:]}")
    rep = json.loads(lf.cli("check", "--policy", out, "--traces", check, "--json", ok=(0, 1)))
    ref = rep["reference"].removeprefix("always-")
    paid = [r["paid"] for r in rep["money"]["rungs"] if r["model"] == ref][-1]
    fl = lf.floors(check, alpha)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {
        "acceptance": rep["coverage"],
        "accuracy_all": rep["coverage"] - rep["unsolvable"],
        "unsolvable": rep["unsolvable"],
        "holds": rep["holds"],
        "rel_always": rep["cost_ratio_to_reference"],
        "oracle_rel_always": fl["oracle"] / rep["reference_cost_usd_per_question"],
        "strong_paid": paid,
        "rounds": rep["rounds"],
        "kept": summary.get("variant", summary["method"]),
        "questions": rep["questions"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alpha", type=float, action="append", help="[0.2]")
    ap.add_argument("--seeds", type=int, default=5, help="[%(default)s]")
    ap.add_argument("--logs", type=Path, default=ROOT.parent / "shared" / "data" / "public-logs")
    ap.add_argument("--hotpotqa", type=Path, default=ROOT.parent / "shared" / "data" / "hotpotqa"
                    / "hotpot_dev_v1_simplified.json")  # fmt: skip
    ap.add_argument("--pairs", default=",".join(PAIRS), help="cheap:strong,… [%(default)s]")
    ap.add_argument("--methods", default="auto,cstop", help="[%(default)s]")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("runs/gold_two_model"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench_gold_two_model.json"))
    args = ap.parse_args()
    if not args.logs.is_dir() or not args.hotpotqa.is_file():
        ap.error(f"need the public logs ({args.logs}) and HotpotQA dev ({args.hotpotqa})")
    alphas = args.alpha or (0.2,)
    t0 = time.perf_counter()
    jobs = []
    for pair in args.pairs.split(","):
        path = ladder(args.logs, args.hotpotqa, pair, args.work / pair.replace(":", "--"))
        for seed in range(args.seeds):
            dest = args.work / pair.replace(":", "--") / f"seed{seed}"
            train, check = lf.halves(path, seed, dest)
            for alpha, method in product(alphas, args.methods.split(",")):
                pol = dest / f"policy-{alpha:g}-{method}"
                key = (f"{pair}, α = {alpha:g}", method)
                jobs.append((key, (train, check, alpha, seed, method, pol)))
    print(f"{len(jobs)} train/check runs", flush=True)
    results = run_grouped(jobs, run_one, args.jobs)
    for key, rows in results.items():
        first = next(iter(rows.values()))
        print(f"\n{key}: {len(first)} seeds, half the questions checked per seed")
        print("| method | acceptance | lowest seed | accuracy (all) | cost ÷ always-strong "
              "| strong paid | rounds | oracle ÷ always | kept |\n"
              "|---|---|---|---|---|---|---|---|---|")  # fmt: skip
        for method, every in rows.items():
            refused = [r["refused"] for r in every if "refused" in r]
            runs = [r for r in every if "refused" not in r]
            if refused:
                print(f"| {method} | refused on {len(refused)} of {len(every)} seeds: "
                      f"{refused[0][:160]} |")  # fmt: skip
            if not runs:
                continue
            t = {k: [r[k] for r in runs] for k in runs[0]}
            print(f"| {method} | {mean_sd(t['acceptance'])} | {min(t['acceptance']):.3f} | "
                  f"{statistics.fmean(t['accuracy_all']):.3f} | {mean_sd(t['rel_always'])} | "
                  f"{statistics.fmean(t['strong_paid']):.2f} | "
                  f"{statistics.fmean(t['rounds']):.2f} | "
                  f"{statistics.fmean(t['oracle_rel_always']):.3f} | "
                  f"{', '.join(sorted(set(t['kept'])))} |")  # fmt: skip
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
