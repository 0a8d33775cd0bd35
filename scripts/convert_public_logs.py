#!/usr/bin/env python
"""Convert public LLM run logs into ``ccpo.trace/v1`` trace sets that ship with the package.

Usage::

    python scripts/convert_public_logs.py --logs /work/shared/data/public-logs \\
        --hotpotqa /work/shared/data/hotpotqa/hotpot_dev_v1_simplified.json \\
        --mmlu /work/shared/data/mmlu --out src/ccpo/data/traces

Writes, per trace set ``<name>``: ``<name>.jsonl.gz`` (the traces), ``<name>.prices.json``
(sidecar price file), ``<name>.stats.json`` (per-round accuracies) and ``<name>.card.md`` (the
data card, filled from ``scripts/data_cards/<name>.md``), and copies the upstream licence texts
into ``licenses/``. The output is deterministic: running the script twice gives byte-identical
files (gzip header without a time stamp or file name, sorted inputs, no clocks).

Two sets are built: ``hotpotqa-public`` always, ``mmlu-public`` when ``--mmlu`` is given.

Round mapping of ``hotpotqa-public`` (T = 4; base rounds get stronger, like repeated attempts):

=====  =====================================  ==========================================
round  base (real LLaMA-2 runs)               guide (real GPT-3.5-turbo-instruct runs)
=====  =====================================  ==========================================
1      LLaMA-2-7B ReAct (FireAct, LoRA)       standard prompting (uala-gpt35)
2      LLaMA-2-13B ReAct (FireAct, LoRA)      ReAct (uala-gpt35)
3      LLaMA-2-70B CoT (UALA run, 1st stage)  chain of thought (uala-gpt35)
4      LLaMA-2-70B UALA (ReAct if uncertain)  UALA (uala-gpt35)
=====  =====================================  ==========================================

Round mapping of ``mmlu-public`` (T = 4; one model, GPT-3.5-turbo-instruct, in every role): a
cascade over its prompting modes ordered by accuracy, the rule ``ccpo traces import`` applies to
models: round t's base is the t-th weakest mode, its guide the next stronger one (see its data
card for why and for the figures):

=====  =======================================  ========================================
round  base (priced 0, as the paper's base)     guide (priced as GPT-4o, as in the paper)
=====  =======================================  ========================================
1      chain of thought                         ReAct (web search)
2      ReAct (web search)                       standard prompting (direct answer)
3      UALA 1st stage (direct answer)           UALA final answer
4      UALA final answer                        UALA final answer
=====  =======================================  ========================================
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ccpo.llm.tasks.loaders import Question, load_mmlu
from ccpo.traces.answers import exact_match, normalizer_for
from ccpo.traces.io import dumps_trace
from ccpo.traces.ladder import ladder_of_trace
from ccpo.traces.prices import ModelPrice, PriceTable
from ccpo.traces.schema import SCHEMA_VERSION, BaseStep, GuideStep, Round, Trace, Usage

TASK = "hotpotqa"
N_ROUNDS = 4
KEEP_CHARS = 1500  # reasoning texts are truncated to their last KEEP_CHARS characters
TRUNCATION_MARK = "[…] "

GUIDE_MODEL = "gpt-3.5-turbo-instruct"
BASE_MODELS = ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-2-70b")  # rounds 1..4

FIREACT_7B = "hotpotqa_dev_0_500_llama_models_lora_llama-2-7b-d_1000_0.7_2023-09-19-00-49-36.json"
FIREACT_13B = "hotpotqa_dev_0_500_llama_models_lora_llama-2-13b-d_1000_0.7_2023-09-18-13-40-08.json"
HIRO_UALA = "llama2-hotpotqa-dev-uala-nooracle.jsonl"
GUIDE_MODES = ("standard", "react", "cot", "uala")  # guide source of rounds 1..4 (by accuracy)

MMLU_TASK = "mmlu"
MMLU_ROWS = 10  # the UALA MMLU runs use the first 10 test rows of each of the 57 subjects
MMLU_MODES = ("standard", "cot", "react", "uala")  # uala-oracle is not used (it reads the gold)
# the base and the guide are one model; the base role gets its own name so that it can be
# priced at 0 like the paper's local base model
MMLU_BASE_MODEL = GUIDE_MODEL + "@base"

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
    r"MeasureUncertainty \[(.*?)\]\s*\nObservation(?: \d+)?: Answer’s uncertainty is ([0-9.]+)"
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


_TOOL_END = re.compile(r"^Thought(?: \d+)?: (?:Let me check the uncertainty|Returned tool)", re.M)


def uala_tool_usage(traj: str, react_context: str) -> tuple[int, int]:
    """Usage of the ReAct calls a UALA run made after ``Activate Tool.`` (0, 0 if it did not).

    The tool stage ends where UALA measures the returned answer or falls back to its first
    answer; ``react_context`` is the ReAct few-shot prompt plus the question.
    """
    if "Activate Tool." not in traj:
        return 0, 0
    react = traj.split("Activate Tool.\n", 1)[1]
    return react_usage(react_context, _TOOL_END.split(react, maxsplit=1)[0])


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
    logprob: float | None = None  # a log-prob-like score of the answer (base rounds), if any


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
        react_context = prompts.get("hotpotqa_react", "") + question_line + "\n"
        r_in, r_out = uala_tool_usage(traj, react_context)
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
def uncertainty_of(
    answer: str, measured: list[tuple[str, float]], task: str = TASK
) -> float | None:
    """A UALA run's measured uncertainty of this (normalised) answer, if it measured it.

    UALA measures the uncertainty of its CoT answer and, when it activated the tool, of its
    ReAct answer. ``answer`` (e.g. a GPT-3.5 answer from another prompting mode, or UALA's
    own final answer) gets the last measurement of the same normalised answer to the same
    question (under ``task``'s answer normaliser), else ``None``.
    """
    norm = normalizer_for(task)
    key = norm(answer)
    if not key:
        return None
    hits = [u for a, u in measured if norm(a) == key]
    return hits[-1] if hits else None


def make_round(
    t: int,
    question: str,
    gold: list[str],
    base: Attempt,
    guide: Attempt,
    measured: list[tuple[str, float]],
    task: str = TASK,
) -> Round:
    """One round: the base attempt, and the guide's verdict on it plus its own answer.

    The verdict is agreement under ``task``'s normaliser; the guide's uncertainty is UALA's
    measurement of its answer (:func:`uncertainty_of`); the base's log-prob-like score, if
    any, fills both ``logprob_mean`` and ``logprob_min`` (a one-token answer).
    """
    verdict = "yes" if exact_match(guide.answer, [base.answer], task) else "no"
    reply = "Yes" if verdict == "yes" else f"No {guide.answer}"
    prompt = GUIDE_TEMPLATE.format(question=question, reasoning=base.reasoning, answer=base.answer)
    return Round(
        round=t,
        base=BaseStep(
            model=base.model,
            answer=base.answer,
            reasoning=truncate(base.reasoning),
            correct=exact_match(base.answer, gold, task),
            usage=Usage(input_tokens=base.input_tokens, output_tokens=base.output_tokens),
            logprob_mean=base.logprob,
            logprob_min=base.logprob,
        ),
        guide=GuideStep(
            model=guide.model,
            verdict=verdict,
            answer=guide.answer,
            correct=exact_match(guide.answer, gold, task),
            uncertainty=uncertainty_of(guide.answer, measured, task),
            usage=Usage(input_tokens=count_tokens(prompt), output_tokens=count_tokens(reply)),
        ),
    )


#: the prompt (a name for the log's run) of each round's base and guide step: the ladder the
#: traces record (verdict by agreement); none is a prompt ccpo writes live (cot, react), so a
#: live deployment runs the family's chain-of-thought prompt for each, one draw per name
HOTPOTQA_PROMPTS = (
    ("fireact-react", "gpt35-standard"),
    ("fireact-react", "gpt35-react"),
    ("uala-cot", "gpt35-cot"),
    ("uala-final", "gpt35-uala"),
)
MMLU_PROMPTS = (
    ("gpt35-cot", "gpt35-react"),
    ("gpt35-react", "gpt35-standard"),
    ("gpt35-uala-first", "gpt35-uala-final"),
    ("gpt35-uala-final", "gpt35-uala-final"),
)


def apply_ladder(traces: list[Trace], prompts: tuple[tuple[str, str], ...]) -> list[Trace]:
    """Record the ladder in every round (``verdict_mode: agree``, each step's ``prompt``) and
    charge a call the ladder repeats once (:meth:`ccpo.traces.ladder.Ladder.reused`: the
    same model with the same prompt on the same question): the repeat keeps its answer and
    signals and gets zero usage and ``reused: true``. In ``mmlu-public`` that is round 4's
    guide (UALA's final answer, already round 3's guide); ``hotpotqa-public`` repeats none."""
    for tr in traces:
        for r, (bp, gp) in zip(tr.rounds, prompts, strict=True):
            r.verdict_mode = "agree"
            r.base.prompt, r.guide.prompt = bp, gp
        ladder = ladder_of_trace(tr)
        for t, r in enumerate(tr.rounds, start=1):
            for role in ("base", "guide"):
                src = ladder.reused(t, role)
                if src is None:
                    continue
                step, orig = getattr(r, role), getattr(tr.rounds[src[0] - 1], src[1])
                if (step.answer, step.correct) != (orig.answer, orig.correct) or src[1] != role:
                    raise SystemExit(f"{tr.id} round {t} {role}: not a repeat of {src}")
                if role == "guide" and step.uncertainty != orig.uncertainty:
                    raise SystemExit(f"{tr.id} round {t} guide: another uncertainty than {src}")
                step.usage = Usage(input_tokens=0, output_tokens=0)
                step.reused = True
    return traces


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
# MMLU: the UALA GPT-3.5 runs, joined to the MMLU CSVs by question text
# --------------------------------------------------------------------------------------------
_MMLU_BODY = re.compile(r"\n(?=(?:Thought|Answer):)")
_FIRST_THOUGHT = re.compile(r"^Thought:[ \t]*(.*)$", re.M)


def split_mmlu_traj(traj: str) -> tuple[str, str]:
    """A UALA MMLU trajectory as ``(question with options, the rest)``; the question text is
    everything before the first ``Thought:`` / ``Answer:`` line, without ``Question: ``."""
    parts = _MMLU_BODY.split(traj, maxsplit=1)
    head = parts[0].removeprefix("Question:").strip()
    return head, parts[1] if len(parts) > 1 else ""


def _squash(text: str) -> str:
    return " ".join(text.split())


def join_mmlu(mmlu_dir: Path, log_questions: list[str]) -> list[Question]:
    """The MMLU test question of each log record, matched by question text (with options).

    The logs are in directory-listing order, not sorted, so positions say nothing; the text
    does. A text found in two subjects (one pair in MMLU) goes to the subject of the nearest
    uniquely matched neighbour in the log. Raises if a record matches no question or a question
    is used twice.
    """
    pool = [q for q in load_mmlu(mmlu_dir / "test") if int(q.id.rsplit("-", 1)[1]) < MMLU_ROWS]
    by_text: dict[str, list[Question]] = {}
    for q in pool:
        by_text.setdefault(_squash(q.question), []).append(q)
    cands = [by_text.get(_squash(t), []) for t in log_questions]
    for i, c in enumerate(cands):
        if not c:
            raise SystemExit(f"MMLU log record {i}: question text not found in {mmlu_dir}/test")
    unique = {i: c[0].meta["subject"] for i, c in enumerate(cands) if len(c) == 1}
    out: list[Question] = []
    for i, c in enumerate(cands):
        if len(c) > 1:
            near = min(unique, key=lambda j: (abs(j - i), j))
            c = [q for q in c if q.meta["subject"] == unique[near]] or c
        out.append(c[0])
    if len({q.id for q in out}) != len(out):
        raise SystemExit("MMLU logs: two records matched the same question")
    return out


def read_mmlu_run(
    path: Path, mode: str, prompts: dict[str, str], model: str
) -> tuple[list[str], list[Attempt]]:
    """One UALA GPT-3.5 MMLU run (``mmlu-test-<mode>.jsonl``) in log order: the question texts
    and one attempt per record, with usage counted as for ``hotpotqa-public``.

    ``standard``: one call (few-shot prompt + question + ``Answer:``) writing the answer.
    ``cot``: one call writing the ``Thought:`` text. ``react``: one call per Thought/Action
    block. ``uala``: UALA's final answer; its usage is only the ReAct calls it made after its
    first (standard-prompt) stage, whose own usage is :func:`uala_first_stage`'s.
    """
    questions: list[str] = []
    out: list[Attempt] = []
    for rec in sorted(_read_jsonl(path), key=lambda r: r["question_idx"]):
        traj = strip_reward_lines(rec["traj"])
        question, body = split_mmlu_traj(traj)
        answer = str(rec["answer"]).strip()
        context = "Question: " + question + "\n"
        if mode == "standard":
            usage = (
                count_tokens(prompts["mmlu_standard"] + context + "Answer:"),
                count_tokens(answer),
            )
        elif mode == "cot":
            usage = count_tokens(prompts["mmlu_cot"] + context + "Thought:"), count_tokens(body)
        elif mode == "react":
            usage = react_usage(prompts["mmlu_react_google"] + context, body)
        else:
            usage = uala_tool_usage(traj, prompts["mmlu_react_google"] + context)
        measured = measured_uncertainties(traj)
        questions.append(question)
        out.append(Attempt(model, answer, body.strip(), *usage, measured=measured))
    return questions, out


def uala_first_stage(run: Attempt, prompts: dict[str, str], question: str) -> Attempt:
    """The first, tool-free stage of a UALA MMLU run: a standard-prompt answer (``Thought: X``)
    and its measured uncertainty."""
    m = _FIRST_THOUGHT.search(run.reasoning)
    answer = m.group(1).strip() if m else ""
    return Attempt(
        run.model,
        answer,
        m.group(0) if m else "",
        count_tokens(prompts["mmlu_standard"] + "Question: " + question + "\nAnswer:"),
        count_tokens(answer),
        uncertainty=run.measured[0][1] if run.measured else None,
    )


def with_logprob(a: Attempt) -> Attempt:
    """``a`` with the negation of its measured uncertainty as its log-prob-like score."""
    return replace(a, logprob=None if a.uncertainty is None else -a.uncertainty)


def build_mmlu(logs: Path, mmlu_dir: Path) -> list[Trace]:
    """The ``mmlu-public`` trace set: 570 MMLU test questions × 4 rounds (see the module doc)."""
    folder = logs / "uala-gpt35"
    prompts = json.loads((folder / "prompts.json").read_text(encoding="utf-8"))
    runs: dict[str, list[Attempt]] = {}
    texts: dict[str, list[str]] = {}
    for mode in MMLU_MODES:
        texts[mode], runs[mode] = read_mmlu_run(
            folder / f"mmlu-test-{mode}.jsonl", mode, prompts, GUIDE_MODEL
        )
    for mode in MMLU_MODES:
        if [_squash(t) for t in texts[mode]] != [_squash(t) for t in texts["standard"]]:
            raise SystemExit(f"mmlu-test-{mode}.jsonl: questions differ from the standard log")
    questions = join_mmlu(mmlu_dir, texts["standard"])

    traces: list[Trace] = []
    for i, q in enumerate(questions):
        uala = runs["uala"][i]
        measured = uala.measured
        first = with_logprob(uala_first_stage(uala, prompts, texts["uala"][i]))
        final = with_logprob(
            replace(uala, uncertainty=uncertainty_of(uala.answer, measured, MMLU_TASK))
        )
        pairs = [
            (runs["cot"][i], runs["react"][i]),
            (runs["react"][i], runs["standard"][i]),
            (first, uala),
            (final, uala),
        ]
        rounds = [
            make_round(
                t,
                q.question,
                q.gold,
                replace(base, model=MMLU_BASE_MODEL),
                guide,
                measured,
                MMLU_TASK,
            )
            for t, (base, guide) in enumerate(pairs, start=1)
        ]
        traces.append(
            Trace(
                schema=SCHEMA_VERSION,
                id=q.id,
                task=MMLU_TASK,
                question=q.question,
                gold=q.gold,
                rounds=rounds,
                meta={
                    "source": "public run logs (UALA, GPT-3.5-turbo-instruct); see the data card",
                    "collected_at": "2024 (public run logs; not a live base/guide dialogue)",
                    "subject": q.meta["subject"],
                    "log_position": i,
                    "base_uncertainty": [None, None, first.uncertainty, final.uncertainty],
                },
            )
        )
    return traces


# --------------------------------------------------------------------------------------------
# statistics, card, prices, output
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SetSpec:
    """What differs between the shipped sets: names, models, sources and price wording."""

    name: str
    task: str
    base_models: tuple[str, ...]  # priced at 0, as the paper's local base
    base_price_source: str
    price_note: str  # the sidecar's top-level ``source``
    round_sources: tuple[tuple[str, str], ...]  # (base source, guide source) per round


HOTPOTQA_SPEC = SetSpec(
    name="hotpotqa-public",
    task=TASK,
    base_models=("llama-2-7b", "llama-2-13b", "llama-2-70b"),
    base_price_source="local open-weights model, priced at 0 as in the paper",
    price_note=(
        "ccpo hotpotqa-public trace set: prices as in the CCPO paper (base local at 0, guide "
        "at the GPT-4o list price of USD 2.50 / 10.00 per million input / output tokens, "
        "OpenAI pricing page as of 2025-08-07). The guide in these logs really is "
        "gpt-3.5-turbo-instruct (list price USD 1.50 / 2.00); pass --prices to re-price."
    ),
    round_sources=(
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
    ),
)

MMLU_SPEC = SetSpec(
    name="mmlu-public",
    task=MMLU_TASK,
    base_models=(MMLU_BASE_MODEL,),
    base_price_source=(
        "gpt-3.5-turbo-instruct in the base role, priced at 0 as the paper prices its local base"
    ),
    price_note=(
        "ccpo mmlu-public trace set: prices as in the CCPO paper (base at 0 like the paper's "
        "local base, guide at the GPT-4o list price of USD 2.50 / 10.00 per million input / "
        "output tokens, OpenAI pricing page as of 2025-08-07). Base and guide in these logs "
        "are both gpt-3.5-turbo-instruct (list price USD 1.50 / 2.00); pass --prices to "
        "re-price."
    ),
    round_sources=(
        ("GPT-3.5 CoT (`mmlu-test-cot.jsonl`)", "GPT-3.5 ReAct (`mmlu-test-react.jsonl`)"),
        (
            "GPT-3.5 ReAct (same as round 1's guide)",
            "GPT-3.5 standard (`mmlu-test-standard.jsonl`)",
        ),
        (
            "GPT-3.5 UALA, first (tool-free) stage (`mmlu-test-uala.jsonl`)",
            "GPT-3.5 UALA final answer (`mmlu-test-uala.jsonl`)",
        ),
        ("GPT-3.5 UALA final answer (same file)", "GPT-3.5 UALA final answer (same as round 3)"),
    ),
)


def _auc(scores: list[float], labels: list[bool]) -> float | None:
    """Area under the ROC curve of ``scores`` for ``labels`` (ties count one half); None if a
    class is empty. How well a signal ranks correct answers above wrong ones (0.5 = no signal)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return round(wins / (len(pos) * len(neg)), 4)


def signal_stats(rs: list[Round]) -> dict[str, Any]:
    """How much each observable signal of one round tells about correctness (AUCs)."""
    unc = [r for r in rs if r.guide.uncertainty is not None]
    lp = [r for r in rs if r.base.logprob_mean is not None]
    return {
        "auc_verdict_base_correct": _auc(
            [float(r.guide.verdict == "yes") for r in rs], [r.base.correct for r in rs]
        ),
        "auc_guide_certainty_guide_correct": _auc(
            [-(r.guide.uncertainty or 0.0) for r in unc], [r.guide.correct for r in unc]
        ),
        "base_logprob_present": len(lp),
        "auc_base_logprob_base_correct": _auc(
            [r.base.logprob_mean or 0.0 for r in lp], [r.base.correct for r in lp]
        ),
    }


def trace_stats(traces: list[Trace], spec: SetSpec) -> dict[str, Any]:
    """Per-round accuracies (counts and rates), solvable rate, usage totals; for sets other
    than ``hotpotqa-public`` (whose stats file predates them) also signal AUCs per round and
    the oracle's cost."""
    n = len(traces)
    rounds = []
    for t in range(N_ROUNDS):
        rs = [tr.rounds[t] for tr in traces]
        base_c = sum(r.base.correct for r in rs)
        guide_c = sum(r.guide.correct for r in rs)
        yes = sum(r.guide.verdict == "yes" for r in rs)
        unc = sum(r.guide.uncertainty is not None for r in rs)
        row = {
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
        if spec is not HOTPOTQA_SPEC:
            row.update(signal_stats(rs))
        rounds.append(row)
    solvable = sum(tr.solvable for tr in traces)
    base_solvable = sum(any(r.base.correct for r in tr.rounds) for tr in traces)
    guide_solvable = sum(any(r.guide.correct for r in tr.rounds) for tr in traces)
    out = {
        "name": spec.name,
        "task": spec.task,
        "n_traces": n,
        "n_rounds": N_ROUNDS,
        "rounds": rounds,
        "solvable": solvable,
        "solvable_rate": round(solvable / n, 4),
        "base_solvable": base_solvable,
        "guide_solvable": guide_solvable,
    }
    if spec is not HOTPOTQA_SPEC:
        out["solvable_by_round"] = [
            sum(any(r.base.correct or r.guide.correct for r in tr.rounds[:t]) for tr in traces)
            for t in range(1, N_ROUNDS + 1)
        ]
        out["oracle_cost_cents_per_question"] = oracle_cost_cents(traces, spec)
    return out


def oracle_cost_cents(traces: list[Trace], spec: SetSpec) -> float:
    """Mean cost (US cents) of the oracle at full coverage, as ``ccpo compare`` defines it: it
    stops at the first round holding a correct answer and pays rounds 1..t (an unsolvable
    question costs round 1)."""
    table = read_price_file_dict(price_file(spec))
    total = 0.0
    for tr in traces:
        hits = [t for t, r in enumerate(tr.rounds) if r.base.correct or r.guide.correct]
        for r in tr.rounds[: (hits[0] if hits else 0) + 1]:
            for step in (r.base, r.guide):
                total += table.cost(step.model, step.usage.input_tokens, step.usage.output_tokens)
    return round(100 * total / len(traces), 6)


def read_price_file_dict(obj: dict[str, Any]) -> PriceTable:
    """The price table of a price-file dict (as written to ``<name>.prices.json``)."""
    return PriceTable(
        models={m: ModelPrice(**p) for m, p in obj["models"].items()}, sources=[obj["source"]]
    )


def price_file(spec: SetSpec) -> dict[str, Any]:
    """Sidecar prices: base models at 0, the guide at the GPT-4o list price (paper)."""
    zero = {
        "input_usd_per_mtok": 0.0,
        "output_usd_per_mtok": 0.0,
        "source": spec.base_price_source,
    }
    return {
        "as_of": "2025-08-07",
        "source": spec.price_note,
        "models": {
            GUIDE_MODEL: {
                "input_usd_per_mtok": 2.5,
                "output_usd_per_mtok": 10.0,
                "source": "GPT-4o list price, standing in for the paper's GPT-4o guide",
            },
            **{m: dict(zero) for m in spec.base_models},
        },
    }


def card_table(stats: dict[str, Any], spec: SetSpec) -> str:
    n = stats["n_traces"]
    rows = [
        "| round | base source | base model | base accuracy | guide source | guide accuracy "
        "| guide says yes | guide uncertainty present |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, (bsrc, gsrc) in zip(stats["rounds"], spec.round_sources, strict=True):
        rows.append(
            f"| {r['round']} | {bsrc} | {', '.join(r['base_model'])} "
            f"| {r['base_accuracy']:.4f} ({r['base_correct']}/{n}) | {gsrc} "
            f"| {r['guide_accuracy']:.4f} ({r['guide_correct']}/{n}) "
            f"| {r['verdict_yes']}/{n} | {r['guide_uncertainty_present']}/{n} |"
        )
    return "\n".join(rows)


def signal_table(stats: dict[str, Any]) -> str:
    """Per round: AUCs of the verdict, the guide's certainty and the base's log-prob score."""

    def f(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}"

    n = stats["n_traces"]
    rows = [
        "| round | verdict yes → base correct | guide certainty → guide correct "
        "| base log-prob score present | base log-prob score → base correct |",
        "|---|---|---|---|---|",
    ]
    for r in stats["rounds"]:
        rows.append(
            f"| {r['round']} | {f(r['auc_verdict_base_correct'])} "
            f"| {f(r['auc_guide_certainty_guide_correct'])} "
            f"| {r['base_logprob_present']}/{n} | {f(r['auc_base_logprob_base_correct'])} |"
        )
    return "\n".join(rows)


def render_card(stats: dict[str, Any], spec: SetSpec, template: str) -> str:
    """Fill a card template's ``{{NAME}}`` fields from the set's statistics."""
    n = stats["n_traces"]
    values = {
        "TABLE": card_table(stats, spec),
        "N": str(n),
        "SOLVABLE": f"{stats['solvable_rate']:.4f} ({stats['solvable']}/{n})",
        "BASE_SOLVABLE": f"{stats['base_solvable'] / n:.4f} ({stats['base_solvable']}/{n})",
        "GUIDE_SOLVABLE": f"{stats['guide_solvable'] / n:.4f} ({stats['guide_solvable']}/{n})",
        "KEEP_CHARS": str(KEEP_CHARS),
        "BASE_EMPTY": " / ".join(str(r["base_empty_answers"]) for r in stats["rounds"]),
        "GUIDE_EMPTY": " / ".join(str(r["guide_empty_answers"]) for r in stats["rounds"]),
    }
    if "oracle_cost_cents_per_question" in stats:
        values["SIGNALS"] = signal_table(stats)
        values["ORACLE_CENTS"] = f"{stats['oracle_cost_cents_per_question']:.4f}"
        values["SOLVABLE_BY_ROUND"] = " / ".join(
            f"{k / n:.4f} ({k}/{n})" for k in stats["solvable_by_round"]
        )
    out = template
    for k, v in values.items():
        out = out.replace("{{" + k + "}}", v)
    if "{{" in out:
        raise SystemExit(f"{spec.name}: card template has an unfilled field")
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


def write_set(out: Path, spec: SetSpec, traces: list[Trace]) -> dict[str, Any]:
    """Write one set's traces, sidecar prices, statistics and data card; return the stats."""
    stats = trace_stats(traces, spec)
    write_jsonl_gz(out / f"{spec.name}.jsonl.gz", traces)
    write_json(out / f"{spec.name}.prices.json", price_file(spec))
    write_json(out / f"{spec.name}.stats.json", stats)
    template = (CARDS / f"{spec.name}.md").read_text(encoding="utf-8")
    (out / f"{spec.name}.card.md").write_text(render_card(stats, spec, template), encoding="utf-8")
    size = (out / f"{spec.name}.jsonl.gz").stat().st_size
    print(
        f"{spec.name}: {len(traces)} traces, {size / 1e6:.2f} MB, "
        f"solvable {stats['solvable_rate']:.3f}",
        file=sys.stderr,
    )
    return stats


CARDS = Path(__file__).resolve().parent / "data_cards"
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
        help="MMLU csv folder (with test/<subject>_test.csv); builds mmlu-public when given",
    )
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    args = ap.parse_args(argv)

    for p in (args.logs, args.hotpotqa, *([args.mmlu] if args.mmlu else [])):
        if not p.exists():
            ap.error(f"{p} does not exist")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    hotpotqa = apply_ladder(build_hotpotqa(args.logs, args.hotpotqa), HOTPOTQA_PROMPTS)
    write_set(out, HOTPOTQA_SPEC, hotpotqa)
    if args.mmlu is not None:
        write_set(out, MMLU_SPEC, apply_ladder(build_mmlu(args.logs, args.mmlu), MMLU_PROMPTS))

    lic = out / "licenses"
    lic.mkdir(exist_ok=True)
    for src, dst in LICENSE_COPIES.items():
        shutil.copyfile(args.logs / src, lic / dst)
    react_lic = args.hotpotqa.parent / "REACT_REPO_LICENSE"
    if react_lic.is_file():
        shutil.copyfile(react_lic, lic / "ReAct-MIT.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
