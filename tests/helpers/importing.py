"""Small tables of several models' answers for ``ccpo traces import`` (illustrative numbers
written by the tests, not LLM output)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from ccpo.traces.importer import REQUIRED_COLUMNS

# per-token prices (bundled table): nano < 4o-mini < 4.1-mini < 4o, names not in that order
MODELS = ("gpt-4o", "gpt-4.1-nano", "gpt-4.1-mini", "gpt-4o-mini")
HEADER = [*REQUIRED_COLUMNS, "correct", "confidence", "logprob"]


def table_rows() -> list[dict]:
    """Three MMLU-style questions × four models. Answers are option letters in varied forms."""
    answers = {  # question -> model -> (answer, correct)
        "q1": {"gpt-4.1-nano": ("A", False), "gpt-4o-mini": ("(b)", True)},
        "q2": {"gpt-4.1-nano": ("C.", True), "gpt-4o-mini": ("C", True)},
        "q3": {"gpt-4.1-nano": ("", False), "gpt-4o-mini": ("D", False)},
    }
    out = []
    for q, gold in (("q1", "B"), ("q2", "C"), ("q3", "A")):
        for m in MODELS:
            ans, ok = answers[q].get(m, (f"{gold}. the answer", True))
            out.append(
                {
                    "question_id": q,
                    "question": f"Question {q}?\nA. a\nB. b\nC. c\nD. d",
                    "model": m,
                    "answer": ans,
                    "correct": "true" if ok else "false",
                    "input_tokens": 100,
                    "output_tokens": 10,
                    "confidence": "0.8" if m == "gpt-4o" else "",
                    "logprob": "-0.5" if m == "gpt-4.1-nano" else "",
                }
            )
    return out


def write_csv(path: Path, rows: list[dict], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return path


def labels_by_model(path: Path) -> dict[str, dict[str, bool]]:
    """question → model → correct, read from a trace file."""
    from ccpo.traces.io import read_traces

    got: dict[str, dict[str, bool]] = {}
    for tr in read_traces(path):
        for r in tr.rounds:
            for s in (r.base, r.guide):
                got.setdefault(tr.id, {})[s.model] = s.correct
    return got


def math_table(path: Path, n: int = 240, seed: int = 0, strong: float = 0.95) -> tuple[Path, dict]:
    """A two-model maths table (JSONL; ``gold`` numbers, no ``correct``): a cheap model right
    on about 70% of the questions, more often when its confidence is high, and a strong one
    right on ``strong`` of them; answers in the forms models write them. Returns the table
    and, per question, which of (cheap, strong) is right by construction."""
    rng = random.Random(seed)
    rows, truth = [], {}
    forms = ("The answer is {}.", "Answer: {}", "{}", "So the total is ${}.")
    for i in range(n):
        gold = rng.randint(2, 5000)
        conf = rng.random()
        right = (rng.random() < 0.35 + 0.6 * conf, rng.random() < strong)
        truth[f"m{i}"] = right
        for model, ok, tokens in (("gpt-4o-mini", right[0], 150), ("gpt-4o", right[1], 250)):
            value = gold if ok else gold + rng.randint(1, 40)
            shown = f"{value:,}" if value >= 1000 and rng.random() < 0.5 else str(value)
            row = {
                "question_id": f"m{i}",
                "question": f"Problem {i}: how many apples are left?",
                "model": model,
                "answer": rng.choice(forms).format(shown),
                "input_tokens": 120,
                "output_tokens": tokens,
                "confidence": round(conf, 3) if model == "gpt-4o-mini" else None,
            }
            if i or model == "gpt-4o":  # question m0's gold is on one row only: still labelled
                row["gold"] = str(gold) if rng.random() < 0.5 else f"{gold}.0"
            rows.append(row)
    rows.append({**rows[-1], "question_id": "nogold", "gold": None, "model": "gpt-4o"})
    rows.append({**rows[-1], "model": "gpt-4o-mini"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, truth
