#!/usr/bin/env python
"""Build the bundled open-ended trace set ``arena-public`` from arena-bench-v1.

Usage::

    python scripts/convert_arena.py /work/shared/data/arena-bench-v1 --out src/ccpo/data/traces

arena-bench-v1 (lmarena/arena-hard-auto, Apache-2.0) holds 300 hard Chatbot-Arena prompts,
the replies of 16 models, and a GPT-4 judge's 1-10 rating of 14 models' replies against
GPT-4's reference answer. This script

1. picks a ladder of five judged models with distinct public list prices (:data:`LADDER`,
   prices dated and sourced in :data:`PRICES`, written to ``arena-public.prices.json``);
2. counts tokens from the texts with one rule for every model, ⌈characters / 4⌉ (no
   tokenizer: the same approximation as the other bundled sets), input = the prompt, output =
   the reply;
3. writes a compact import table (question_id, question, messages, model, answer, score,
   input_tokens, output_tokens) and imports it with ``ccpo traces import``'s own code and the
   acceptance rule :data:`RULE` (docs/decisions.md says why this rule), family ``chat``
   (each prompt a one-turn conversation in ``messages``; replies kept verbatim), with the
   lexical ladder signals :data:`SIGNALS` computed from the replies, as ``ccpo traces import
   --signals`` does (no call, no download);
4. writes ``arena-public.jsonl.gz`` (deterministic gzip), the data card and the licence.

It reads the shared folder only here, never at package run time. Running it twice gives
byte-identical files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

from ccpo.traces.accept import parse_rule
from ccpo.traces.importer import import_signals, open_table, with_text_signals
from ccpo.traces.io import dumps_trace
from ccpo.traces.prices import load_prices

NAME = "arena-public"
TASK = "arena"
FAMILY = "chat"  # a conversation of one user turn; replies verbatim, compared exactly
RULE = "score>=reference-1"  # accepted: rated at most one point below the reference model's
#: the ladder's signals (``traces import --signals``): pure functions of the replies
SIGNALS = ("similarity", "length", "refusal")

#: our model name → (answer file, judgment file) in arena-bench-v1, cheapest first
LADDER = {
    "mistral-7b-instruct-v0.1": ("Mistral-7B-Instruct-v0.1", "Mistral-7B-Instruct-v0.1"),
    "mixtral-8x7b-instruct-v0.1": ("Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B-Instruct-v0.1"),
    "claude-instant-1": ("claude-instant-1", "claude-instant-1"),
    "gpt-3.5-turbo-1106": ("gpt-3.5-turbo-1106", "gpt-3.5-turbo-1106"),
    # the judgment file named gpt-4-turbo judges gpt-4-1106-preview's answers
    "gpt-4-1106-preview": ("gpt-4-1106-preview", "gpt-4-turbo"),
}

_OPENAI = (
    "OpenAI list price announced with the model at DevDay, 2023-11-06 "
    "(https://openai.com/index/new-models-and-developer-products-announced-at-devday/; "
    "still listed under legacy models at https://platform.openai.com/docs/pricing)"
)
_MISTRAL = (
    "Mistral AI API list price of its open-weights endpoints, pricing page as of 2024-02-26 "
    "(https://mistral.ai/technology/#pricing, archived at "
    "https://web.archive.org/web/2024*/mistral.ai/technology)"
)
_ANTHROPIC = (
    "Anthropic API list price of Claude Instant 1.2 from 2023-11-21 "
    "(https://www.anthropic.com/news/claude-2-1; https://www.anthropic.com/pricing, legacy "
    "models)"
)
#: model → (input USD / Mtok, output USD / Mtok, as of, source)
PRICES = {
    "mistral-7b-instruct-v0.1": (0.25, 0.25, "2024-02-26", "open-mistral-7b: " + _MISTRAL),
    "mixtral-8x7b-instruct-v0.1": (0.7, 0.7, "2024-02-26", "open-mixtral-8x7b: " + _MISTRAL),
    "claude-instant-1": (0.8, 2.4, "2023-11-21", _ANTHROPIC),
    "gpt-3.5-turbo-1106": (1.0, 2.0, "2023-11-06", _OPENAI),
    "gpt-4-1106-preview": (10.0, 30.0, "2023-11-06", _OPENAI),
}


def count_tokens(text: str) -> int:
    """⌈characters / 4⌉: the same tokenizer-free count for every model (OpenAI's rule of
    thumb for English text; no tokenizer is downloaded)."""
    return math.ceil(len(text) / 4)


def _jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _score(v: object) -> float | None:
    """A judgment's score: a number, a numeric string ("8.0", "9") or None (no rating)."""
    if v is None:
        return None
    return float(v)  # type: ignore[arg-type]


def table_rows(arena: Path) -> list[dict]:
    """One row per question and ladder model, questions in the file's order."""
    questions = [(q["question_id"], q["turns"][0]) for q in _jsonl(arena / "question.jsonl.gz")]
    rows = []
    answers, scores = {}, {}
    for model, (answer_file, judgment_file) in LADDER.items():
        answers[model] = {
            a["question_id"]: a["choices"][0]["turns"][0]
            for a in _jsonl(arena / "model_answer" / f"{answer_file}.jsonl.gz")
        }
        scores[model] = {
            j["question_id"]: _score(j["score"])
            for j in _jsonl(arena / "model_judgment" / f"{judgment_file}.jsonl.gz")
        }
    for qid, text in questions:
        for model in LADDER:
            reply = answers[model][qid]
            rows.append(
                {
                    "question_id": qid,
                    "question": text,
                    "messages": [{"role": "user", "content": text}],
                    "model": model,
                    "answer": reply,
                    "score": scores[model][qid],
                    "input_tokens": count_tokens(text),
                    "output_tokens": count_tokens(reply),
                }
            )
    return rows


def price_file() -> dict:
    return {
        "as_of": max(p[2] for p in PRICES.values()),
        "source": "ccpo arena-public trace set: each model's public API list price, dated "
        "and sourced per entry (USD per million tokens; pass --prices to re-price)",
        "models": {
            m: {"input_usd_per_mtok": i, "output_usd_per_mtok": o, "as_of": d, "source": s}
            for m, (i, o, d, s) in PRICES.items()
        },
    }


def convert(arena: Path, out: Path, table_out: Path | None = None) -> dict:
    """Write the set into ``out``; return its figures (for the card and the log)."""
    out.mkdir(parents=True, exist_ok=True)
    prices_json = json.dumps(price_file(), indent=1, ensure_ascii=False) + "\n"
    (out / f"{NAME}.prices.json").write_text(prices_json, encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        table = table_out or Path(tmp) / f"{NAME}.table.jsonl"
        with table.open("w", encoding="utf-8") as fh:
            for r in table_rows(arena):
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        prices = load_prices(out / f"{NAME}.prices.json")
        with open_table(table, TASK, prices, family=FAMILY, accept=parse_rule(RULE)) as imp:
            chosen = import_signals(list(SIGNALS))
            traces = [with_text_signals(tr, chosen) for tr in imp.traces()]
            unscored = list(imp.unscored)
            order = imp.cascade.order()
    path = out / f"{NAME}.jsonl.gz"
    with (
        path.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
    ):
        for tr in traces:
            gz.write((dumps_trace(tr) + "\n").encode("utf-8"))
    licenses = out / "licenses"
    licenses.mkdir(exist_ok=True)
    shutil.copyfile(arena / "LICENSE", licenses / "arena-hard-auto-Apache-2.0.txt")
    accepted = {m: 0 for m in order}
    for tr in traces:
        for r in tr.rounds:
            for s in (r.base, r.guide):
                if not s.reused:
                    accepted[s.model] += s.correct
    return {
        "questions": len(traces),
        "left_out": unscored,
        "order": order,
        "accepted": accepted,
        "bytes": path.stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arena", type=Path, help="the arena-bench-v1 folder")
    ap.add_argument("--out", type=Path, required=True, help="e.g. src/ccpo/data/traces")
    ap.add_argument("--table", type=Path, help="also keep the import table here (JSONL)")
    args = ap.parse_args(argv)
    if not (args.arena / "question.jsonl.gz").is_file():
        print(f"{args.arena}: not an arena-bench-v1 folder", file=sys.stderr)
        return 2
    got = convert(args.arena, args.out, args.table)
    n = got["questions"]
    print(f"{NAME}: {n} questions ({len(got['left_out'])} left out: a score is missing), "
          f"{got['bytes']} bytes; rule {RULE}; signals {', '.join(SIGNALS)}")  # fmt: skip
    for m in got["order"]:
        print(f"  {m}: accepted on {got['accepted'][m]}/{n} ({got['accepted'][m] / n:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
