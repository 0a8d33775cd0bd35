"""Small import tables of four models in each answer family the docs show (``mcq``, ``short``,
``chat``), labelled as the docs label them, for the tests that run every documented
combination. SYNTHETIC: illustrative answers written by the tests, not LLM output.

A question has an ease; a model is right with a probability that rises with its strength and
the ease (big-m, the reference, always is), so a cascade can stop early on easy questions; the
hardest ones (the cheap models almost never right) say so in their text ("an old model"), so a
router (``--route``) can start them at a later rung.
mcq answers are option letters labelled by agreement with big-m (quick start 2: no labels);
short answers are code names with a ``correct`` column; chat replies answer a conversation (a
system prompt and a user turn) with a judge-like ``score`` and ``--accept
"score>=reference-1"`` (quick start 3). A wrong chat reply is often a refusal or short, so
the lexical signals (``--signals``) carry information; mcq and short rows carry a
``confidence``."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ccpo.traces.prices import write_price_file

#: (model, strength, input USD / Mtok, output USD / Mtok), cheapest first
MODELS = (
    ("tiny-m", 0.35, 0.1, 0.4),
    ("small-m", 0.55, 0.3, 1.2),
    ("mid-m", 0.70, 1.0, 4.0),
    ("big-m", 1.0, 5.0, 20.0),
)
FAMILIES = ("mcq", "short", "chat")
SYSTEM = "You are the help desk of Acme routers. Keep replies short."
SIGNALS = "similarity,length,refusal"  # the lexical signals quick start 3 imports


def _answer(
    family: str, i: int, k: int, right: bool, gold: str, hard: bool, rng: random.Random
) -> dict:
    model, what = MODELS[k][0], " (an old model)" if hard else ""
    if family == "mcq":
        wrong = rng.choice([c for c in "ABCD" if c != gold])
        return {"question": f"Item {i}{what}: which option holds?\nA. a{i}\nB. b{i}\nC. c{i}"
                            f"\nD. d{i}", "answer": gold if right else wrong}  # fmt: skip
    if family == "short":
        answer = f"Falcon {i}" if right else f"Heron {k}{i}"
        return {"question": f"What is project {i}'s code name{what}?", "answer": answer,
                "correct": right}  # fmt: skip
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"How do I reset router {i}{what}?"}]  # fmt: skip
    if right:
        reply = (
            f"To reset router {i}, hold its reset button for ten seconds, wait for the light "
            f"to blink, then sign in with the default password ({model})."
        )
    elif rng.random() < 0.4:
        reply = "I'm sorry, I can't help with that."
    else:
        reply = f"Router {i}? Try unplugging it."
    return {"messages": messages, "answer": reply, "score": 9 if right else rng.choice([3, 5, 6])}


def write_family_table(folder: Path, family: str, n: int, seed: int = 0) -> tuple[Path, Path]:
    """``<family>.jsonl`` (``n`` questions × the four :data:`MODELS`) and ``prices.json`` in
    ``folder``; returns both paths."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    table = folder / f"{family}.jsonl"
    with table.open("w", encoding="utf-8") as fh:
        for i in range(n):
            ease, gold = rng.random(), rng.choice("ABCD")
            hard = ease < 0.3  # the text says so: a router can send it up the ladder at once
            for k, (model, strength, _, _) in enumerate(MODELS):
                chance = 0.05 if hard else strength * (0.5 + ease)
                right = strength == 1.0 or rng.random() < chance
                row = {"question_id": f"q{i}", "model": model,
                       **_answer(family, i, k, right, gold, hard, rng)}  # fmt: skip
                row["input_tokens"] = 60 + rng.randint(0, 40)
                row["output_tokens"] = max(1, len(row["answer"]) // 4)
                if family != "chat":
                    conf = (0.8 if right else 0.45) + rng.gauss(0, 0.15)
                    row["confidence"] = round(min(1.0, max(0.0, conf)), 3)
                fh.write(json.dumps(row) + "\n")
    models = {m: (i, o) for m, _, i, o in MODELS}
    prices = write_price_file(folder / "prices.json", models, "synthetic (tests)")
    return table, prices


def import_args(family: str, table: Path, prices: Path, out: Path, signals: bool) -> list[str]:
    """``ccpo traces import`` of ``table`` as the docs show it for ``family``."""
    task = {"mcq": ["--task", "medqa", "--family", "mcq"], "short": ["--task", "qa"],
            "chat": ["--task", "chat", "--accept", "score>=reference-1"]}[family]  # fmt: skip
    extra = ["--signals", SIGNALS] if signals else []
    return ["traces", "import", str(table), *task, *extra, "--prices", str(prices),
            "--out", str(out)]  # fmt: skip
