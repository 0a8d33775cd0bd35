#!/usr/bin/env python
"""Convert public LLM run logs into ``ccpo.trace/v1`` trace sets that ship with the package.

Usage::

    python scripts/convert_public_logs.py --logs /work/shared/data/public-logs \\
        --hotpotqa /work/shared/data/hotpotqa/hotpot_dev_v1_simplified.json \\
        --mmlu /work/shared/data/mmlu --out src/ccpo/data/traces

Writes, per trace set ``<name>``: ``<name>.jsonl.gz`` (the traces), ``<name>.prices.json``
(sidecar price file), ``<name>.stats.json`` (per-round accuracies) and ``<name>.card.md`` (the
data card), and copies the upstream licence texts into ``licenses/``. The output is
deterministic: running the script twice gives byte-identical files (gzip header without a
time stamp or file name, sorted inputs, no clocks).

Only ``hotpotqa-public`` is built. ``--mmlu`` is accepted (and checked) but no MMLU set is
written: the public MMLU logs hold one model only (GPT-3.5-turbo-instruct in every prompting
mode), so there is no real cheap-base / strong-guide split (see ``NOTICE.md`` and the report
in the card of ``hotpotqa-public``).

Round mapping of ``hotpotqa-public`` (T = 4; base rounds get stronger, like repeated attempts):

=====  =====================================  ==========================================
round  base (real LLaMA-2 runs)               guide (real GPT-3.5-turbo-instruct runs)
=====  =====================================  ==========================================
1      LLaMA-2-7B ReAct (FireAct, LoRA)       standard prompting (uala-gpt35)
2      LLaMA-2-13B ReAct (FireAct, LoRA)      ReAct (uala-gpt35)
3      LLaMA-2-70B CoT (UALA run, 1st stage)  chain of thought (uala-gpt35)
4      LLaMA-2-70B UALA (ReAct if uncertain)  UALA (uala-gpt35)
=====  =====================================  ==========================================
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccpo.traces.answers import exact_match, normalize_answer
from ccpo.traces.io import dumps_trace
from ccpo.traces.schema import SCHEMA_VERSION, BaseStep, GuideStep, Round, Trace, Usage

TASK = "hotpotqa"
SET_NAME = "hotpotqa-public"
N_ROUNDS = 4
KEEP_CHARS = 1500  # reasoning texts are truncated to their last KEEP_CHARS characters
TRUNCATION_MARK = "[…] "

GUIDE_MODEL = "gpt-3.5-turbo-instruct"
BASE_MODELS = ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-2-70b")  # rounds 1..4

FIREACT_7B = "hotpotqa_dev_0_500_llama_models_lora_llama-2-7b-d_1000_0.7_2023-09-19-00-49-36.json"
FIREACT_13B = "hotpotqa_dev_0_500_llama_models_lora_llama-2-13b-d_1000_0.7_2023-09-18-13-40-08.json"
HIRO_UALA = "llama2-hotpotqa-dev-uala-nooracle.jsonl"
GUIDE_MODES = ("standard", "react", "cot", "uala")  # guide source of rounds 1..4 (by accuracy)

# The paper's guide template (appendix "Guide Model Template"); the base's reasoning and answer
# fill ``A:``. Only used to count the guide's input tokens.
GUIDE_TEMPLATE = (
    "Evaluate the answer.\n"
    '- If correct, reply "Yes".\n'
    '- If incorrect, reply "No [correct answer]" (only the correct answer, nothing else).\n'
    "Q: {question}\n"
    "A: {reasoning}\nAnswer: {answer}\n"
    "Your response:"
)

# Lines that would leak the gold answer into the reasoning text (the environments of ReAct,
# FireAct and UALA print the reward after ``finish``).
_REWARD_LINE = re.compile(r"^Observation(?: \d+)?: Episode finished, reward = .*$\n?", re.M)
_UNCERTAINTY = re.compile(
    r"MeasureUncertainty \[(.*?)\]\s*\nObservation \d+: Answer’s uncertainty is ([0-9.]+)"
)
_FINISH = re.compile(r"^Action(?: \d+)?:\s*[Ff]inish\[(.*)\]\s*$", re.M)
_FIRST_ANSWER = re.compile(r"^Answer:[ \t]*(.*)$", re.M)


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def count_tokens(text: str) -> int:
    """Approximate token count: ⌈characters / 4⌉ (OpenAI's rule of thumb for English text).

    There is no offline tokenizer here (tiktoken downloads its tables), so every usage in the
    converted traces is this deterministic approximation, not a tokenizer count.
    """
    return math.ceil(len(text) / 4)


def strip_reward_lines(text: str) -> str:
    """Drop the environment's ``Episode finished, reward = …`` lines (they reveal correctness)."""
    return _REWARD_LINE.sub("", text)


def truncate(text: str, keep: int = KEEP_CHARS) -> str:
    """Keep the last ``keep`` characters (where the answer is), marking a cut with ``[…]``."""
    text = text.strip()
    if len(text) <= keep:
        return text
    return TRUNCATION_MARK + text[-keep:]


def react_usage(context: str, body: str) -> tuple[int, int]:
    """Token usage of a ReAct episode: one call per Thought/Action block.

    Each call reads everything before it (``context`` plus the earlier steps and observations)
    and writes its Thought/Action lines; ``Observation`` lines come from the tool.
    Returns ``(input_tokens, output_tokens)``.
    """
    inp = out = 0
    seen = context
    block: list[str] = []

    def flush() -> None:
        nonlocal inp, out, seen
        if block:
            text = "\n".join(block) + "\n"
            inp += count_tokens(seen)
            out += count_tokens(text)
            seen += text
            block.clear()

    for line in body.splitlines():
        if line.startswith("Observation"):
            flush()
            seen += line + "\n"
        elif line.strip():
            block.append(line)
    flush()
    return inp, out


def measured_uncertainties(traj: str) -> list[tuple[str, float]]:
    """Every ``(answer, uncertainty)`` a UALA trajectory measured, in order."""
    return [(a.strip(), float(u)) for a, u in _UNCERTAINTY.findall(traj)]


@dataclass
class Attempt:
    """One answer of one model on one question, as read from a log."""

    model: str
    answer: str
    reasoning: str  # full text the guide would read (reward lines removed, not truncated)
    input_tokens: int
    output_tokens: int
    uncertainty: float | None = None
    measured: list[tuple[str, float]] = field(default_factory=list)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# --------------------------------------------------------------------------------------------
# one reader per source log format
# --------------------------------------------------------------------------------------------
def read_hotpotqa(path: Path) -> list[dict[str, Any]]:
    """HotpotQA dev (``hotpot_dev_v1_simplified.json``): a list of {question, answer, type}."""
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


def read_fireact(path: Path, model: str) -> dict[int, Attempt]:
    """FireAct ReAct runs: a dict ``question_idx → {pred, traj, prompt, …}``.

    ``traj`` holds the instruction prompt, then ``### Response:`` and the Thought / Action /
    Observation lines. The answer is the last ``finish[…]`` argument in its original casing
    (``pred`` is lower-cased and stripped of punctuation); ``pred`` is the fall-back.
    """
    with path.open(encoding="utf-8") as fh:
        raw = json.load(fh)
    out: dict[int, Attempt] = {}
    for key in sorted(raw, key=int):
        rec = raw[key]
        traj: str = rec["traj"]
        head, sep, body = traj.partition("### Response:\n")
        if not sep:
            head, body = "", traj
        context = (rec.get("prompt") or "") + head + sep
        body = strip_reward_lines(body)
        finishes = _FINISH.findall(body)
        answer = finishes[-1].strip() if finishes else str(rec.get("pred", "")).strip()
        inp, outp = react_usage(context, body)
        out[int(key)] = Attempt(model, answer, body.strip(), inp, outp)
    return out


def read_hiro_uala(
    path: Path, prompts: dict[str, str]
) -> tuple[dict[int, Attempt], dict[int, Attempt]]:
    """The LLaMA-2-70B UALA run (a fork of the UALA code): one JSON line per question.

    ``traj`` starts with a CoT answer (``Answer: …``) and its measured uncertainty; if that is
    above the threshold UALA activates the tool and runs ReAct (answer: the ReAct ``Finish``,
    or the CoT "backoff" answer when the ReAct answer is invalid). Returns two dicts:
    the CoT stage (round 3) and the final UALA answer (round 4).

    Few-shot prompts are not in this log; the fork runs UALA's code, so UALA's
    ``prompts.json`` (``hotpotqa_cot`` / ``hotpotqa_react``) is counted as the input prompt.
    Round 4 continues the round-3 run, so its usage counts only the extra ReAct calls
    (0 when the CoT answer was kept).
    """
    cot: dict[int, Attempt] = {}
    final: dict[int, Attempt] = {}
    for rec in sorted(_read_jsonl(path), key=lambda r: r["question_idx"]):
        idx = int(rec["question_idx"])
        traj = strip_reward_lines(rec["traj"])
        measured = measured_uncertainties(traj)
        question_line, _, rest = traj.partition("\n")
        m = _FIRST_ANSWER.search(rest)
        cot_text = rest[: m.end()] if m else rest
        cot_answer = m.group(1).strip() if m else ""
        c_in = count_tokens(prompts.get("hotpotqa_cot", "") + question_line + "\nThought:")
        cot[idx] = Attempt(
            "llama-2-70b",
            cot_answer,
            cot_text.strip(),
            c_in,
            count_tokens(cot_text),
            uncertainty=measured[0][1] if measured else None,
        )
        activated = "Activate Tool." in traj
        if activated:
            react = traj.split("Activate Tool.\n", 1)[1]
            react_body = re.split(
                r"^Thought \d+: (?:Let me check the uncertainty|Returned tool)",
                react,
                maxsplit=1,
                flags=re.M,
            )[0]
            r_in, r_out = react_usage(
                prompts.get("hotpotqa_react", "") + question_line + "\n", react_body
            )
        else:
            r_in, r_out = 0, 0
        answer = str(rec["answer"]).strip()
        final[idx] = Attempt(
            "llama-2-70b",
            answer,
            rest.strip(),
            r_in,
            r_out,
            uncertainty=uncertainty_of(answer, measured),
        )
    return cot, final


def read_uala_gpt35(path: Path) -> dict[int, Attempt]:
    """A UALA-repository GPT-3.5 run (standard / cot / react / uala): JSON lines with
    ``answer, question_idx, traj``. UALA-mode trajectories also hold the measured
    uncertainties of the answers they produced (kept in ``Attempt.measured``).

    Only the answer is used as the guide's reply; the guide's usage is counted from the
    protocol (it reads the base's reasoning and writes "Yes" / "No [answer]"), not from this
    run, so the token fields here are left at 0.
    """
    out: dict[int, Attempt] = {}
    for rec in sorted(_read_jsonl(path), key=lambda r: r["question_idx"]):
        traj = strip_reward_lines(rec.get("traj", ""))
        out[int(rec["question_idx"])] = Attempt(
            GUIDE_MODEL,
            str(rec["answer"]).strip(),
            traj,
            0,
            0,
            measured=measured_uncertainties(traj),
        )
    return out


# --------------------------------------------------------------------------------------------
# building the trace set
# --------------------------------------------------------------------------------------------
def uncertainty_of(answer: str, measured: list[tuple[str, float]]) -> float | None:
    """A UALA run's measured uncertainty of this (normalised) answer, if it measured it.

    UALA measures the uncertainty of its CoT answer and, when it activated the tool, of its
    ReAct answer. ``answer`` (e.g. a GPT-3.5 answer from another prompting mode, or UALA's
    own final answer) gets the last measurement of the same normalised answer to the same
    question, else ``None``.
    """
    key = normalize_answer(answer)
    if not key:
        return None
    hits = [u for a, u in measured if normalize_answer(a) == key]
    return hits[-1] if hits else None


def make_round(
    t: int,
    question: str,
    gold: list[str],
    base: Attempt,
    guide: Attempt,
    measured: list[tuple[str, float]],
) -> Round:
    """One round: the base attempt, and the guide's verdict on it plus its own answer."""
    verdict = "yes" if exact_match(guide.answer, [base.answer], TASK) else "no"
    reply = "Yes" if verdict == "yes" else f"No {guide.answer}"
    prompt = GUIDE_TEMPLATE.format(question=question, reasoning=base.reasoning, answer=base.answer)
    return Round(
        round=t,
        base=BaseStep(
            model=base.model,
            answer=base.answer,
            reasoning=truncate(base.reasoning),
            correct=exact_match(base.answer, gold, TASK),
            usage=Usage(input_tokens=base.input_tokens, output_tokens=base.output_tokens),
            logprob_mean=None,
            logprob_min=None,
        ),
        guide=GuideStep(
            model=GUIDE_MODEL,
            verdict=verdict,
            answer=guide.answer,
            correct=exact_match(guide.answer, gold, TASK),
            uncertainty=uncertainty_of(guide.answer, measured),
            usage=Usage(input_tokens=count_tokens(prompt), output_tokens=count_tokens(reply)),
        ),
    )


def build_hotpotqa(logs: Path, hotpotqa_path: Path) -> list[Trace]:
    """The ``hotpotqa-public`` trace set: 500 HotpotQA dev questions × 4 rounds."""
    dev = read_hotpotqa(hotpotqa_path)
    prompts = json.loads((logs / "uala-gpt35" / "prompts.json").read_text(encoding="utf-8"))
    base_r1 = read_fireact(logs / "fireact-llama2" / FIREACT_7B, "llama-2-7b")
    base_r2 = read_fireact(logs / "fireact-llama2" / FIREACT_13B, "llama-2-13b")
    base_r3, base_r4 = read_hiro_uala(logs / "uala-llama2-hiro" / HIRO_UALA, prompts)
    guides = [read_uala_gpt35(logs / "uala-gpt35" / f"hotpotqa-dev-{m}.jsonl") for m in GUIDE_MODES]

    # question order: the order of the UALA logs = random.Random(233).shuffle(range(7405))[:500]
    order = [
        int(r["question_idx"])
        for r in _read_jsonl(logs / "uala-gpt35" / "hotpotqa-dev-standard.jsonl")
    ]
    for name, src in [
        ("llama-2-70b", base_r3),
        *[(m, g) for m, g in zip(GUIDE_MODES, guides, strict=True)],
    ]:
        if set(src) != set(order):
            raise SystemExit(f"{name}: question set differs from the UALA standard log")
    measured_all = guides[GUIDE_MODES.index("uala")]

    traces: list[Trace] = []
    for idx in order:
        rec = dev[idx]
        question, gold = rec["question"].strip(), [rec["answer"].strip()]
        found = [base_r1.get(idx), base_r2.get(idx), base_r3.get(idx), base_r4.get(idx)]
        missing = [t for t, b in enumerate(found, start=1) if b is None]
        # a question missing from a base log: an empty (wrong) attempt with no usage
        bases = [b or Attempt(BASE_MODELS[t], "", "", 0, 0) for t, b in enumerate(found)]
        measured = measured_all[idx].measured
        rounds = [
            make_round(t, question, gold, bases[t - 1], guides[t - 1][idx], measured)
            for t in range(1, N_ROUNDS + 1)
        ]
        meta: dict[str, Any] = {
            "source": "public LLM run logs (FireAct, UALA, a UALA fork); see the data card",
            "collected_at": "2023-09 .. 2024 (public run logs; not a live base/guide dialogue)",
            "question_idx": idx,
            "hotpotqa_type": rec.get("type"),
            "base_uncertainty": [None, None, base_r3[idx].uncertainty, base_r4[idx].uncertainty],
        }
        if missing:
            meta["missing_base_rounds"] = missing
        traces.append(
            Trace(
                schema=SCHEMA_VERSION,
                id=f"hotpotqa-dev-{idx}",
                task=TASK,
                question=question,
                gold=gold,
                rounds=rounds,
                meta=meta,
            )
        )
    return traces


# --------------------------------------------------------------------------------------------
# statistics, card, prices, output
# --------------------------------------------------------------------------------------------
def trace_stats(traces: list[Trace]) -> dict[str, Any]:
    """Per-round accuracies (counts and rates), solvable rate, usage totals."""
    n = len(traces)
    rounds = []
    for t in range(N_ROUNDS):
        rs = [tr.rounds[t] for tr in traces]
        base_c = sum(r.base.correct for r in rs)
        guide_c = sum(r.guide.correct for r in rs)
        yes = sum(r.guide.verdict == "yes" for r in rs)
        unc = sum(r.guide.uncertainty is not None for r in rs)
        rounds.append(
            {
                "round": t + 1,
                "base_model": sorted({r.base.model for r in rs}),
                "base_correct": base_c,
                "base_accuracy": round(base_c / n, 4),
                "guide_model": sorted({r.guide.model for r in rs}),
                "guide_correct": guide_c,
                "guide_accuracy": round(guide_c / n, 4),
                "verdict_yes": yes,
                "base_empty_answers": sum(not r.base.answer for r in rs),
                "guide_empty_answers": sum(not r.guide.answer for r in rs),
                "guide_uncertainty_present": unc,
                "base_input_tokens": sum(r.base.usage.input_tokens for r in rs),
                "base_output_tokens": sum(r.base.usage.output_tokens for r in rs),
                "guide_input_tokens": sum(r.guide.usage.input_tokens for r in rs),
                "guide_output_tokens": sum(r.guide.usage.output_tokens for r in rs),
            }
        )
    solvable = sum(tr.solvable for tr in traces)
    base_solvable = sum(any(r.base.correct for r in tr.rounds) for tr in traces)
    guide_solvable = sum(any(r.guide.correct for r in tr.rounds) for tr in traces)
    return {
        "name": SET_NAME,
        "task": TASK,
        "n_traces": n,
        "n_rounds": N_ROUNDS,
        "rounds": rounds,
        "solvable": solvable,
        "solvable_rate": round(solvable / n, 4),
        "base_solvable": base_solvable,
        "guide_solvable": guide_solvable,
    }


def price_file() -> dict[str, Any]:
    """Sidecar prices: base models local at 0, the guide at the GPT-4o list price (paper)."""
    zero = {
        "input_usd_per_mtok": 0.0,
        "output_usd_per_mtok": 0.0,
        "source": "local open-weights model, priced at 0 as in the paper",
    }
    return {
        "as_of": "2025-08-07",
        "source": (
            "ccpo hotpotqa-public trace set: prices as in the CCPO paper (base local at 0, guide "
            "at the GPT-4o list price of USD 2.50 / 10.00 per million input / output tokens, "
            "OpenAI pricing page as of 2025-08-07). The guide in these logs really is "
            "gpt-3.5-turbo-instruct (list price USD 1.50 / 2.00); pass --prices to re-price."
        ),
        "models": {
            GUIDE_MODEL: {
                "input_usd_per_mtok": 2.5,
                "output_usd_per_mtok": 10.0,
                "source": "GPT-4o list price, standing in for the paper's GPT-4o guide",
            },
            "llama-2-7b": dict(zero),
            "llama-2-13b": dict(zero),
            "llama-2-70b": dict(zero),
        },
    }


def card_table(stats: dict[str, Any]) -> str:
    n = stats["n_traces"]
    rows = [
        "| round | base source | base model | base accuracy | guide source | guide accuracy "
        "| guide says yes | guide uncertainty present |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, (bsrc, gsrc) in zip(stats["rounds"], ROUND_SOURCES, strict=True):
        rows.append(
            f"| {r['round']} | {bsrc} | {', '.join(r['base_model'])} "
            f"| {r['base_accuracy']:.4f} ({r['base_correct']}/{n}) | {gsrc} "
            f"| {r['guide_accuracy']:.4f} ({r['guide_correct']}/{n}) "
            f"| {r['verdict_yes']}/{n} | {r['guide_uncertainty_present']}/{n} |"
        )
    return "\n".join(rows)


ROUND_SOURCES = [
    (
        "FireAct LLaMA-2-7B ReAct (`fireact-llama2/…llama-2-7b…json`)",
        "GPT-3.5 standard (`uala-gpt35/hotpotqa-dev-standard.jsonl`)",
    ),
    (
        "FireAct LLaMA-2-13B ReAct (`fireact-llama2/…llama-2-13b…json`)",
        "GPT-3.5 ReAct (`uala-gpt35/hotpotqa-dev-react.jsonl`)",
    ),
    (
        "LLaMA-2-70B CoT, first stage of UALA (`uala-llama2-hiro/…-uala-nooracle.jsonl`)",
        "GPT-3.5 CoT (`uala-gpt35/hotpotqa-dev-cot.jsonl`)",
    ),
    (
        "LLaMA-2-70B UALA final answer (same file)",
        "GPT-3.5 UALA (`uala-gpt35/hotpotqa-dev-uala.jsonl`)",
    ),
]


CARD_TEMPLATE = r"""# Data card: `hotpotqa-public` (real public LLM run logs as `ccpo.trace/v1`)

`hotpotqa-public.jsonl.gz` holds {{N}} HotpotQA dev questions with T = 4 rounds each, built
from **real answers of real models** published with three research repositories. It lets
`ccpo` train, calibrate and compare policies on real LLM behaviour offline. It is **not** a
reproduction of the paper's traces (the paper uses LLaMA-2-7B / LLaMA-3.2-3B with a GPT-4o
guide in a live base/guide dialogue); see "Departures from the paper's protocol".

Built by `scripts/convert_public_logs.py` (deterministic; re-running it on the same logs gives
byte-identical files). Side files: `hotpotqa-public.prices.json` (sidecar prices),
`hotpotqa-public.stats.json` (the numbers below, machine-readable).

## Questions and gold
The 500 questions are `random.Random(233).shuffle(list(range(7405)))[:500]` of
`hotpot_dev_v1_simplified.json` (HotpotQA dev, as vendored in the ReAct repository), in that
order; `question_idx` indexes that file. Question text and the gold answer come from that
file (the logs' `gt_answer` agrees). Trace ids are `hotpotqa-dev-<question_idx>`;
`meta.question_idx` and `meta.hotpotqa_type` (bridge / comparison) are kept.

## Rounds: where each answer comes from
Base attempts get stronger round by round, like the paper's repeated attempts; the guide's
modes are ordered by their accuracy on these 500 questions (standard < ReAct < CoT < UALA).

{{TABLE}}

Log files (folder `public-logs/`):
- round 1 base: `fireact-llama2/hotpotqa_dev_0_500_llama_models_lora_`
  `llama-2-7b-d_1000_0.7_2023-09-19-00-49-36.json`
  (FireAct LoRA-fine-tuned LLaMA-2-7B, ReAct with a web-search tool);
- round 2 base: `fireact-llama2/hotpotqa_dev_0_500_llama_models_lora_`
  `llama-2-13b-d_1000_0.7_2023-09-18-13-40-08.json`
  (same, LLaMA-2-13B; holds 499 questions: question 3992 is missing, so its round-2 base
  answer is empty, wrong and free, and `meta.missing_base_rounds = [2]`);
- rounds 3 and 4 base: `uala-llama2-hiro/llama2-hotpotqa-dev-uala-nooracle.jsonl` (LLaMA-2-70B,
  8-bit, UALA without oracle). Round 3 is the CoT stage (the first `Answer:` of the
  trajectory); round 4 is UALA's final answer: the ReAct (Wikipedia tool) answer when the CoT
  answer's uncertainty was above the threshold 1.79 (101 questions; 27 of them fell back to the
  CoT answer because the ReAct answer was invalid), else the CoT answer kept (399 questions, so
  round 4 repeats round 3 there);
- guide, rounds 1-4: `uala-gpt35/hotpotqa-dev-{standard,react,cot,uala}.jsonl`
  (GPT-3.5-turbo-instruct, UALA repository). `uala-oracle` is not used (it asks an oracle, i.e.
  uses the gold answer, when uncertain).
- `uala-llama2-hiro/llama2-hotpotqa-dev-uala-nooracle-step-scores.jsonl` (per-ReAct-step
  tentative answers, 101 questions) and the fine-tuned GPT-3.5 FireAct run are not used.

Solvable rate (some base or guide answer in some round is correct): **{{SOLVABLE}}**.
Base-only solvable: {{BASE_SOLVABLE}}; guide-only solvable: {{GUIDE_SOLVABLE}}.

## Fields
- `base.answer`: the run's answer in its original casing (FireAct: last `finish[…]` argument;
  UALA: as logged). `correct` = `ccpo.traces.answers.exact_match(answer, gold, "hotpotqa")`
  (SQuAD/HotpotQA normalised exact match; no accent folding, so "Véronique" ≠ "Veronique").
  Where a log reports `em`, our counts equal it (round 3 has no logged `em`).
- `base.reasoning`: the trajectory after the prompt (Thought / Action / Observation lines; for
  UALA also its MeasureUncertainty steps), with the environments' `Episode finished, reward = …`
  lines removed (they reveal correctness), truncated to its last {{KEEP_CHARS}} characters
  (a cut is marked by a leading `[…] `). Usage is counted on the full text.
- `base.logprob_mean`, `base.logprob_min`: null (no log holds token log-probabilities).
- `guide.answer`: the GPT-3.5 run's answer in that round's mode. `guide.verdict` = `yes` iff the
  guide's answer equals the base answer under the task normaliser (`exact_match`), else `no`.
  `guide.correct` = `exact_match(guide.answer, gold)`.
- `guide.uncertainty`: UALA's logged uncertainty of GPT-3.5 giving the same normalised answer to
  the same question (the UALA run measured its CoT answer and, when it used the tool, its ReAct
  answer); null when that answer was never measured (see the last column above). **Weak
  signal**: it is the entropy of a temperature-5 softmax over the answer tokens' log-probs and
  is close to ln(number of answer tokens). The base's own UALA uncertainties (rounds 3 and 4)
  are kept in `meta.base_uncertainty` (a list per round, null where not measured).
- `policy_llm`: null (no LLM-as-policy decisions were logged).
- Empty answers (a run that gave none: cut-off CoT, ReAct that never finished, the missing
  13B question) are kept as `""`, count as wrong, and an empty guide answer gives verdict
  `no`. Rounds 1 / 2 / 3 / 4: base {{BASE_EMPTY}}, guide {{GUIDE_EMPTY}}.

## Token usage (approximate; no tokenizer was run)
All `usage` numbers are **counted from the logged texts with ⌈characters / 4⌉ per text**
(OpenAI's rule of thumb for English; no offline tokenizer is available and tiktoken downloads
its tables). They are deterministic approximations, not the APIs' usage reports.
- Base, ReAct rounds: one call per Thought/Action block; each call's input is everything before
  it (instruction prompt, earlier steps and observations), its output the block itself.
  FireAct is zero-shot (its `prompt` field is empty; the instruction header is in `traj`).
- Base, LLaMA-2-70B: its few-shot prompts are not logged; the fork runs UALA's code, so UALA's
  `prompts.json` (`hotpotqa_cot`, `hotpotqa_react`) is counted as the prompt (an assumption).
  Round 3 counts the CoT call; round 4 continues that run and counts only its extra ReAct
  calls (0 tokens when UALA kept the CoT answer).
- Guide: the paper's guide template filled with the question, the base's full (untruncated)
  reasoning and answer as input; `Yes` or `No <guide answer>` as output.

## Prices (`hotpotqa-public.prices.json`)
As in the paper: the LLaMA-2 base models run locally at 0; the guide is priced at the **GPT-4o
list price, USD 2.50 / 10.00 per million input / output tokens**, because the paper's guide is
GPT-4o. The guide in these logs really is `gpt-3.5-turbo-instruct` (list price 1.50 / 2.00); the
sidecar overrides the bundled price of that name for this trace set only. Pass `--prices` to
re-price.

## Departures from the paper's protocol
- These are independent runs, not a live base/guide dialogue: the guide never saw the base's
  reasoning; its "verdict" is derived by comparing its own answer with the base answer, and its
  answer comes from its own standard / ReAct / CoT / UALA run. The base never saw the guide's
  reply from an earlier round (in the paper the base's context holds earlier rounds and guide
  replies).
- Different models: LLaMA-2-7B/13B are FireAct's LoRA fine-tunes (trained on ReAct
  trajectories), LLaMA-2-70B is the plain 8-bit model, the guide is GPT-3.5-turbo-instruct, not
  GPT-4o. The guide is only slightly more accurate than the base, unlike GPT-4o vs LLaMA-2-7B.
- Different tools: FireAct searched the web (search-engine snippets), UALA searched Wikipedia.
- Rounds come from different models and prompting strategies rather than repeated attempts of
  one base model with a growing context.
- Token counts are approximations (above); guide uncertainty is a weak, partly missing signal.

## Licences and provenance
- Question text and gold answers: HotpotQA (Yang et al. 2018), CC BY-SA 4.0
  (`licenses/CC-BY-SA-4.0.md`), via the ReAct repository (MIT). Observation texts inside
  `reasoning` quote Wikipedia (CC BY-SA 4.0) and web-search snippets. **The trace file as a
  whole is therefore shared under CC BY-SA 4.0.**
- FireAct logs: MIT, Copyright (c) 2023 Baian Chen (Andrew) — `licenses/FireAct-MIT.txt`.
- UALA logs and `prompts.json`: MIT, Copyright (c) 2024 Jiuzhou Han — `licenses/UALA-MIT.txt`.
- LLaMA-2-70B UALA logs (public fork of UALA): MIT — `licenses/UALA-fork-MIT.txt`.
- ReAct repository (vendored HotpotQA file): MIT — `licenses/ReAct-MIT.txt`.
- Model outputs are from Meta's LLaMA-2 (Llama 2 Community License) and OpenAI's
  GPT-3.5-turbo-instruct, as published by the repositories above.
- Changes: converted to `ccpo.trace/v1`; reward lines removed; reasoning truncated; verdicts,
  correctness and token counts derived as described; question text and gold taken from HotpotQA.
  See `NOTICE.md`.

## Reproduce
```
python scripts/convert_public_logs.py --logs <data>/public-logs \
    --hotpotqa <data>/hotpotqa/hotpot_dev_v1_simplified.json --mmlu <data>/mmlu \
    --out src/ccpo/data/traces
```
"""


def render_card(stats: dict[str, Any], template: str) -> str:
    n = stats["n_traces"]
    values = {
        "TABLE": card_table(stats),
        "N": str(n),
        "SOLVABLE": f"{stats['solvable_rate']:.4f} ({stats['solvable']}/{n})",
        "BASE_SOLVABLE": f"{stats['base_solvable'] / n:.4f} ({stats['base_solvable']}/{n})",
        "GUIDE_SOLVABLE": f"{stats['guide_solvable'] / n:.4f} ({stats['guide_solvable']}/{n})",
        "KEEP_CHARS": str(KEEP_CHARS),
        "BASE_EMPTY": " / ".join(str(r["base_empty_answers"]) for r in stats["rounds"]),
        "GUIDE_EMPTY": " / ".join(str(r["guide_empty_answers"]) for r in stats["rounds"]),
    }
    out = template
    for k, v in values.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def write_jsonl_gz(path: Path, traces: list[Trace]) -> None:
    """Deterministic gzip: no time stamp and no file name in the header."""
    with (
        path.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        for tr in traces:
            gz.write((dumps_trace(tr) + "\n").encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


LICENSE_COPIES = {
    "fireact-llama2/LICENSE": "FireAct-MIT.txt",
    "uala-gpt35/LICENSE": "UALA-MIT.txt",
    "uala-llama2-hiro/LICENSE": "UALA-fork-MIT.txt",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=Path, required=True, help="folder with the public run logs")
    ap.add_argument(
        "--hotpotqa",
        type=Path,
        required=True,
        help="hotpot_dev_v1_simplified.json (question text and gold by question_idx)",
    )
    ap.add_argument(
        "--mmlu",
        type=Path,
        default=None,
        help="MMLU csv folder (accepted for symmetry; no MMLU set is built, see doc)",
    )
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    args = ap.parse_args(argv)

    for p in (args.logs, args.hotpotqa):
        if not p.exists():
            ap.error(f"{p} does not exist")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    traces = build_hotpotqa(args.logs, args.hotpotqa)
    stats = trace_stats(traces)
    write_jsonl_gz(out / f"{SET_NAME}.jsonl.gz", traces)
    write_json(out / f"{SET_NAME}.prices.json", price_file())
    write_json(out / f"{SET_NAME}.stats.json", stats)
    card = render_card(stats, CARD_TEMPLATE)
    (out / f"{SET_NAME}.card.md").write_text(card, encoding="utf-8")

    lic = out / "licenses"
    lic.mkdir(exist_ok=True)
    for src, dst in LICENSE_COPIES.items():
        shutil.copyfile(args.logs / src, lic / dst)
    react_lic = args.hotpotqa.parent / "REACT_REPO_LICENSE"
    if react_lic.is_file():
        shutil.copyfile(react_lic, lic / "ReAct-MIT.txt")

    size = (out / f"{SET_NAME}.jsonl.gz").stat().st_size
    print(
        f"{SET_NAME}: {len(traces)} traces, {size / 1e6:.2f} MB, "
        f"solvable {stats['solvable_rate']:.3f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
