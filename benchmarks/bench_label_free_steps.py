"""Benchmark: label-free multi-model ladders from the public logs, pairs against one model a step.

From the public run logs (``--logs``: FireAct, UALA and a UALA fork, see the data README of
the folder) it builds two ``traces import`` tables (one row per question × model:
``question_id, question, model, answer, input_tokens, output_tokens``; no ``correct``, so the
labels are agreement with the reference, the dearest model):

- ``hotpotqa-5``: HotpotQA dev, the 464 questions every model answered (463 once the
  reference's one empty answer is dropped), five models ordered by list price: LLaMA-2-7B and
  -13B fine-tuned for ReAct (FireAct, LoRA), LLaMA-2-70B chain of thought (the UALA fork's
  first stage), GPT-3.5-turbo-instruct chain of thought (UALA), GPT-3.5-turbo-0613 fine-tuned
  for ReAct (FireAct): the reference;
- ``mmlu-modes``: MMLU test (570 questions; 520 once ReAct's empty answers are dropped), one
  model, GPT-3.5-turbo-instruct, in four prompting modes (standard, chain of thought, UALA,
  ReAct with web search), priced alike and so ordered by their mean cost per question (the
  rule of ``traces import``): a mode ladder, the reference its dearest mode (ReAct).

Tokens are counted as the bundled sets count them (``scripts/convert_public_logs.py``: one
call per Thought/Action block, every call reading what came before, ⌈characters / 4⌉); prices
are :data:`PRICES` (dated list prices, their sources stated; ``--prices FILE`` re-prices;
``llama-2-70b`` there overrides the bundled table's local price of 0).

Each table is imported twice, ``--steps pair`` (the old default: K − 1 rounds of two models)
and ``--steps one`` (the default: one model per step); with the bundled ``mmlu-public`` and
``hotpotqa-public`` relabelled against their strongest model (:mod:`ccpo.testing.relabel`;
paired rounds, as shipped) every ladder goes through the real CLI: per seed 0..4 the
questions are shuffled and halved; ``ccpo train --answer single --alpha α --seed s --method
M`` (M of ``--methods``: ``auto``, and ``cstop`` to show what the learned stopper costs when
``auto`` keeps the reference; each with and without ``--route``) on one half (``train``'s own
split: 30% to fit, the rest to calibrate), ``ccpo check --json`` on the other. Per (ladder,
α, layout, row) it prints, over the seeds: agreement with the reference (mean ± sd, lowest
seed, every seed), cost ÷ always-the-reference and ÷ the oracle floor at α, the share of
questions on which the reference's own call was paid, rounds run and what ``train`` kept; per
layout, three bounds ÷ always-the-reference on the same halves (:func:`floors`).

    python benchmarks/bench_label_free_steps.py [--logs DIR] [--seeds 5]
        [--alpha 0.1 --alpha 0.2] [--ladders hotpotqa-5,mmlu-modes,mmlu-public,hotpotqa-public]
        [--methods auto,cstop] [--prices FILE] [--jobs 1] [--guarantee marginal|pac]
        [--work runs/label_free_steps]
        [--out runs/bench_label_free_steps.json]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from itertools import product
from pathlib import Path

from _sweep import mean_sd, run_grouped, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import convert_public_logs as logs  # noqa: E402  (the bundled sets' log readers and counts)

FIREACT_FT = (
    "hotpotqa_dev_0_500_ft_gpt-3.5-turbo-0613_princeton-nlp__7woQRsdi_0.0_2023-09-21-16-19-51.json"
)
INSTRUCT = "gpt-3.5-turbo-instruct"
#: the five HotpotQA models, cheapest list price first (the last is the reference)
HOTPOTQA_MODELS = (
    "llama-2-7b-fireact",
    "llama-2-13b-fireact",
    "llama-2-70b",
    INSTRUCT,
    "gpt-3.5-turbo-0613-fireact",
)
MMLU_MODES = ("standard", "cot", "uala", "react")
TOGETHER = (
    "Together AI serverless list price of the Llama-2 models of this size (same price in and "
    "out), pricing page https://www.together.ai/pricing as of 2024-02; read by hand, not "
    "verified offline; a LoRA fine-tune priced as its base model"
)
#: USD per million input / output tokens; gpt-3.5-turbo-instruct is the bundled table's price
PRICES = {
    "as_of": "2024-02-01",
    "source": "bench_label_free_steps: dated public list prices, one source per model",
    "models": {
        "llama-2-7b-fireact": {"input_usd_per_mtok": 0.2, "output_usd_per_mtok": 0.2,
                               "as_of": "2024-02-01", "source": TOGETHER},
        "llama-2-13b-fireact": {"input_usd_per_mtok": 0.22, "output_usd_per_mtok": 0.22,
                                "as_of": "2024-02-01", "source": TOGETHER},
        "llama-2-70b": {"input_usd_per_mtok": 0.9, "output_usd_per_mtok": 0.9,
                        "as_of": "2024-02-01", "source": TOGETHER},
        "gpt-3.5-turbo-0613-fireact": {
            "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 6.0, "as_of": "2023-11-06",
            "source": "OpenAI list price of a fine-tuned gpt-3.5-turbo's usage from DevDay, "
                      "2023-11-06 (https://openai.com/index/new-models-and-developer-products-"
                      "announced-at-devday/; 12 / 16 at its launch on 2023-08-22)"},
        **{f"{INSTRUCT}@{m}": {
            "input_usd_per_mtok": 1.5, "output_usd_per_mtok": 2.0, "as_of": "2025-08-07",
            "source": f"{INSTRUCT} (bundled price table), prompted in mode {m}"}
           for m in MMLU_MODES},
    },
}  # fmt: skip
LADDERS = ("hotpotqa-5", "mmlu-modes", "mmlu-public", "hotpotqa-public")


# --------------------------------------------------------------------------------------------
# the tables
# --------------------------------------------------------------------------------------------
def row(qid: str, question: str, a: logs.Attempt) -> dict:
    """One ``traces import`` row of an attempt."""
    return {
        "question_id": qid,
        "question": question,
        "model": a.model,
        "answer": a.answer,
        "input_tokens": a.input_tokens,
        "output_tokens": a.output_tokens,
    }


def read_fireact_chat(path: Path, model: str) -> dict[int, logs.Attempt]:
    """FireAct's fine-tuned GPT-3.5 run: ``question_idx → {pred, traj}``, ``traj`` a chat
    (the question, then assistant Thought/Action turns and user Observation turns). Each
    assistant turn is a call reading every message before it; the answer is the last
    ``finish[…]`` (``pred``, lower-cased, as a fall-back)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    out: dict[int, logs.Attempt] = {}
    for key in sorted(raw, key=int):
        seen, inp, outp, answer = "", 0, 0, ""
        for m in raw[key]["traj"]:
            if m["role"] == "assistant":
                inp += logs.count_tokens(seen)
                outp += logs.count_tokens(m["content"])
                finishes = logs._FINISH.findall(m["content"])
                answer = finishes[-1].strip() if finishes else answer
            seen += m["content"] + "\n"
        out[int(key)] = logs.Attempt(model, answer or str(raw[key]["pred"]), "", inp, outp)
    return out


def read_cot(path: Path, prompt: str, model: str) -> tuple[dict[int, str], dict[int, logs.Attempt]]:
    """A UALA chain-of-thought run (``Question: …`` then ``Thought: …`` and ``Answer: …``):
    the question texts and one call per question (the few-shot ``prompt`` and the question
    in, the thought and answer out)."""
    questions, out = {}, {}
    for rec in logs._read_jsonl(path):
        line, _, rest = rec["traj"].partition("\n")
        idx = int(rec["question_idx"])
        questions[idx] = line.removeprefix("Question:").strip()
        inp = logs.count_tokens(prompt + line + "\nThought:")
        out[idx] = logs.Attempt(
            model,
            str(rec["answer"]).strip(),
            "",
            inp,
            logs.count_tokens(rest.removeprefix("Thought:")),
        )
    return questions, out


def hotpotqa_table(folder: Path) -> list[dict]:
    """The five-model HotpotQA table: the questions every model has a log entry for."""
    prompts = json.loads((folder / "uala-gpt35" / "prompts.json").read_text(encoding="utf-8"))
    fire = folder / "fireact-llama2"
    questions, instruct = read_cot(
        folder / "uala-gpt35" / "hotpotqa-dev-cot.jsonl", prompts["hotpotqa_cot"], INSTRUCT
    )
    llama70, _ = logs.read_hiro_uala(folder / "uala-llama2-hiro" / logs.HIRO_UALA, prompts)
    assert {a.model for a in llama70.values()} == {HOTPOTQA_MODELS[2]}
    runs = [
        logs.read_fireact(fire / logs.FIREACT_7B, HOTPOTQA_MODELS[0]),
        logs.read_fireact(fire / logs.FIREACT_13B, HOTPOTQA_MODELS[1]),
        llama70,
        instruct,
        read_fireact_chat(fire / FIREACT_FT, HOTPOTQA_MODELS[4]),
    ]
    return [
        row(f"hotpotqa-dev-{i}", questions[i], run[i])
        for i in questions
        if all(i in run for run in runs)
        for run in runs
    ]


def mmlu_table(folder: Path) -> list[dict]:
    """The MMLU mode ladder: GPT-3.5-turbo-instruct in each of :data:`MMLU_MODES` (UALA: its
    tool-free first stage plus the ReAct calls it made when uncertain)."""
    folder = folder / "uala-gpt35"
    prompts = json.loads((folder / "prompts.json").read_text(encoding="utf-8"))
    runs, texts = {}, {}
    for mode in MMLU_MODES:
        model = f"{INSTRUCT}@{mode}"
        path = folder / f"mmlu-test-{mode}.jsonl"
        texts[mode], runs[mode] = logs.read_mmlu_run(path, mode, prompts, model)
        if [" ".join(t.split()) for t in texts[mode]] != [
            " ".join(t.split()) for t in texts["standard"]
        ]:
            raise SystemExit(f"{path}: questions differ from the standard log")
    for i, (q, a) in enumerate(zip(texts["uala"], runs["uala"], strict=True)):
        first = logs.uala_first_stage(a, prompts, q)
        runs["uala"][i] = replace(
            a, input_tokens=a.input_tokens + first.input_tokens,
            output_tokens=a.output_tokens + first.output_tokens,
        )  # fmt: skip
    return [
        row(f"mmlu-test-{i}", q, runs[mode][i])
        for i, q in enumerate(texts["standard"])
        for mode in MMLU_MODES
    ]


# --------------------------------------------------------------------------------------------
# the ladders: imported twice, or a bundled set relabelled
# --------------------------------------------------------------------------------------------
def cli(*args, ok: tuple[int, ...] = (0,)) -> str:
    """Run ``ccpo ARGS`` (this interpreter's package) and return its stdout."""
    cmd = [sys.executable, "-m", "ccpo", *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    return p.stdout


def ladder_files(name: str, folder: Path, work: Path, prices: list[Path]) -> dict[str, Path]:
    """Layout → trace file of ladder ``name`` (with its sidecar prices), built under ``work``."""
    from ccpo.evaluation.harness import prices_for, sidecar_path
    from ccpo.evaluation.reproduce import resolve_data
    from ccpo.testing.relabel import relabel_against_strongest
    from ccpo.traces.io import read_traces, write_traces

    work.mkdir(parents=True, exist_ok=True)
    if name in ("mmlu-public", "hotpotqa-public"):
        (_, path), *_ = resolve_data([name]).items()
        free, _ = relabel_against_strongest(read_traces(path), prices_for(path, prices))
        out = work / f"{name}.jsonl"
        write_traces(out, free)
        shutil.copyfile(sidecar_path(path), sidecar_path(out))
        return {"pairs (bundled)": out}
    table, task = work / f"{name}.table.jsonl", name.split("-")[0]
    rows = hotpotqa_table(folder) if task == "hotpotqa" else mmlu_table(folder)
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    price_file = work / "prices.json"
    price_file.write_text(json.dumps(PRICES, indent=1) + "\n", encoding="utf-8")
    files = {}
    for layout, steps in (("pairs", "pair"), ("one model per step", "one")):
        out = work / f"{name}-{steps}.jsonl"
        extra = [a for p in prices for a in ("--prices", p)]
        cli("traces", "import", table, "--task", task, "--steps", steps, "--prices", price_file,
            *extra, "--out", out, "--force")  # fmt: skip
        files[layout] = out
    return files


def halves(path: Path, seed: int, dest: Path) -> tuple[Path, Path]:
    """The questions of ``path`` shuffled by ``seed`` and halved: (training file, check file),
    each with the sidecar prices."""
    from ccpo.evaluation.harness import sidecar_path
    from ccpo.traces.io import read_traces, write_traces

    traces = read_traces(path)
    ids = sorted(t.id for t in traces)
    random.Random(seed).shuffle(ids)
    first = set(ids[: len(ids) // 2])
    dest.mkdir(parents=True, exist_ok=True)
    out = (dest / "train.jsonl", dest / "check.jsonl")
    write_traces(out[0], [t for t in traces if t.id in first])
    write_traces(out[1], [t for t in traces if t.id not in first])
    for p in out:
        shutil.copyfile(sidecar_path(path), sidecar_path(p))
    return out


def floors(path: Path, alpha: float) -> dict[str, float]:
    """Mean USD per question on ``path`` of three bounds: the oracle floor at ``alpha``
    (:func:`ccpo.learning.baselines.oracle_metrics`: the first round that agrees, ⌊α n⌋
    questions left at round 1), a perfect stopper (the same, every question covered) and a
    perfect router (only the cheapest round that agrees is called, as a routed start that
    skips the rounds before it pays: :func:`ccpo.traces.routing.route_views`)."""
    import numpy as np

    from ccpo.evaluation.harness import prices_for
    from ccpo.learning.baselines import oracle_metrics
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.io import read_traces
    from ccpo.traces.routing import route_views

    traces, prices = read_traces(path), prices_for(path)
    ep = build_episodes(traces, prices)
    idx = np.arange(ep.n)[None]
    views = route_views(traces, prices)
    t = np.arange(ep.horizon)
    alone = views.cost[t, :, t]  # [T, N]: round t's calls when the question starts there
    agree = ep.correct.any(-1).T  # [T, N]
    router = np.where(agree, alone, np.inf).min(0)
    return {
        "oracle": float(oracle_metrics(ep, idx, alpha).cost.mean()),
        "stopper": float(oracle_metrics(ep, idx, 0.0).cost.mean()),
        "router": float(np.where(np.isfinite(router), router, alone[0]).mean()),
    }


def run_one(
    train: Path, check: Path, alpha: float, seed: int, method: str, route: bool, out: Path,
    guarantee: str | None = None,
) -> dict:  # fmt: skip
    """``ccpo train --answer single`` on ``train``, ``ccpo check --json`` on ``check``;
    ``guarantee``: train's ``--guarantee`` (None: its default)."""
    extra = ["--guarantee", guarantee] if guarantee else []
    cli("train", "--traces", train, "--out", out, "--answer", "single", "--alpha", alpha,
        "--seed", seed, "--method", method, *(["--route"] if route else []), *extra,
        "--force")  # fmt: skip
    rep = json.loads(cli("check", "--policy", out, "--traces", check, "--json", ok=(0, 1)))
    ref = rep["reference"].removeprefix("always-")
    # the reference's own call: its last rung (a pair ladder's guides may all be that model)
    paid = [r["paid"] for r in rep["money"]["rungs"] if r["model"] == ref][-1]
    fl = floors(check, alpha)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return {
        "agreement": rep["coverage"],
        "holds": rep["holds"],
        "rel_always": rep["cost_ratio_to_reference"],
        "rel_oracle": rep["cost_usd_per_question"] / fl["oracle"],
        "oracle_rel_always": fl["oracle"] / rep["reference_cost_usd_per_question"],
        "stopper_rel_always": fl["stopper"] / rep["reference_cost_usd_per_question"],
        "router_rel_always": fl["router"] / rep["reference_cost_usd_per_question"],
        "reference_paid": paid,
        "rounds": rep["rounds"],
        "kept": summary.get("variant", summary["method"]),
        "questions": rep["questions"],
    }


# --------------------------------------------------------------------------------------------
# the sweep and its tables
# --------------------------------------------------------------------------------------------
def print_tables(name: str, alpha: float, rows: dict[str, list[dict]]) -> None:
    """One markdown table of ``rows`` (row label → its runs over the seeds)."""
    print(f"\n{name}, α = {alpha:g}: {len(next(iter(rows.values())))} seeds, "
          f"{next(iter(rows.values()))[0]['questions']} questions checked per seed")  # fmt: skip
    print(
        f"| layout | row | agreement (target {1 - alpha:.2f}) | lowest seed | cost ÷ always-ref "
        "| cost ÷ oracle | ref paid | rounds | kept |\n|---|---|---|---|---|---|---|---|---|"
    )
    for label, runs in rows.items():
        t = {k: [r[k] for r in runs] for k in runs[0]}
        kept = Counter("always-ref" if k.startswith("always-") else k for k in t["kept"])
        kept = ", ".join(f"{k} ×{n}" for k, n in kept.most_common())
        print(
            f"| {label} | {mean_sd(t['agreement'])} | {min(t['agreement']):.3f} | "
            f"{mean_sd(t['rel_always'])} | {mean_sd(t['rel_oracle'])} | "
            f"{statistics.fmean(t['reference_paid']):.2f} | {statistics.fmean(t['rounds']):.2f} "
            f"| {kept} |"
        )
    first: dict[str, list[dict]] = {}
    for label, runs in rows.items():
        first.setdefault(label.split(" | ")[0], runs)
    for layout, runs in first.items():  # the bounds: the same for every row of a layout
        floor = statistics.fmean(r["oracle_rel_always"] for r in runs)
        stopper = statistics.fmean(r["stopper_rel_always"] for r in runs)
        router = statistics.fmean(r["router_rel_always"] for r in runs)
        print(
            f"{layout}: oracle floor {floor:.3f}×, perfect stopper {stopper:.3f}×, "
            f"perfect router {router:.3f}× always-ref"
        )
    for label, runs in rows.items():
        print(f"agreement per seed, {label}: " + ", ".join(f"{r['agreement']:.3f}" for r in runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alpha", type=float, action="append", help="[0.1 and 0.2]")
    ap.add_argument("--seeds", type=int, default=5, help="[%(default)s]")
    ap.add_argument("--logs", type=Path, default=ROOT.parent / "shared" / "data" / "public-logs",
                    help="the public run logs [%(default)s]")  # fmt: skip
    ap.add_argument("--ladders", default=",".join(LADDERS), help="[%(default)s]")
    ap.add_argument("--prices", type=Path, action="append", default=[],
                    help="price file(s) over PRICES (re-price the models)")  # fmt: skip
    ap.add_argument("--methods", default="auto,cstop", help="train --method values [%(default)s]")
    ap.add_argument("--jobs", type=int, default=1, help="train/check runs at once [1]")
    ap.add_argument("--guarantee", choices=("marginal", "pac"),
                    help="train's --guarantee [its default]")  # fmt: skip
    ap.add_argument("--work", type=Path, default=Path("runs/label_free_steps"))
    ap.add_argument("--out", type=Path, default=Path("runs/bench_label_free_steps.json"))
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    ladders, methods = args.ladders.split(","), args.methods.split(",")
    if {"hotpotqa-5", "mmlu-modes"} & set(ladders) and not args.logs.is_dir():
        ap.error(f"--logs {args.logs}: no such folder (the public run logs)")
    t0 = time.perf_counter()
    jobs = []
    for name in ladders:
        for layout, path in ladder_files(name, args.logs, args.work / name, args.prices).items():
            for seed in range(args.seeds):
                dest = args.work / name / layout.split()[0] / f"seed{seed}"
                train, check = halves(path, seed, dest)
                for alpha, method, route in product(alphas, methods, (False, True)):
                    flag = " --route" if route else ""
                    pol = dest / f"policy-{alpha:g}-{method}{flag.replace(' --', '-')}"
                    jobs.append(
                        ((f"{name}, α = {alpha:g}", f"{layout} | {method}{flag}"),
                         (train, check, alpha, seed, method, route, pol, args.guarantee))
                    )  # fmt: skip
    print(f"{len(jobs)} train/check runs ({time.perf_counter() - t0:.0f} s to build)", flush=True)
    results = run_grouped(jobs, run_one, args.jobs)
    for key, rows in results.items():
        name, alpha = key.split(", α = ")
        print_tables(name, float(alpha), rows)
    write_results(args.out, results, f" ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
