"""A synthetic import table of four models answering the same multiple-choice questions, for
tests and benchmarks of the ladder path (``traces import`` → ``train`` → ``serve`` against
``replay-server``). Synthetic: not LLM results.

Each question has a difficulty; a model answers right with a probability that rises with its
strength and falls with the difficulty, and reports a confidence that is higher when it is
right (a usable, noisy signal). Prices rise with strength, so the import's cascade orders the
models ``tiny-m`` < ``small-m`` < ``mid-m`` < ``big-m``.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

#: (model, strength, input USD / Mtok, output USD / Mtok)
LADDER_MODELS = (
    ("tiny-m", 0.35, 0.1, 0.4),
    ("small-m", 0.55, 0.3, 1.2),
    ("mid-m", 0.70, 1.0, 4.0),
    ("big-m", 0.85, 5.0, 20.0),
)


def write_ladder_table(
    folder: str | Path,
    n: int = 300,
    seed: int = 0,
    labels: bool = True,
    strengths: tuple[float, ...] | None = None,
) -> tuple[Path, Path]:
    """Write ``table.csv`` (``n`` questions × 4 models, the import format; without the
    ``correct`` column when not ``labels``: logs nobody graded) and ``prices.json`` (the
    models' prices) into ``folder``; return both paths. ``strengths``: the four models'
    strengths instead of :data:`LADDER_MODELS`' (e.g. cheap models that are mostly wrong)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    table = folder / "table.csv"
    with table.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        head = ["question_id", "question", "model", "answer", "correct", "input_tokens",
                "output_tokens", "confidence"]  # fmt: skip
        keep = [c for c in range(len(head)) if labels or head[c] != "correct"]
        w.writerow([head[c] for c in keep])
        for i in range(n):
            gold = rng.choice("ABCD")
            ease = rng.random()
            text = f"Item {i}: which option holds?\nA. a{i}\nB. b{i}\nC. c{i}\nD. d{i}"
            for k, (model, strength, _, _) in enumerate(LADDER_MODELS):
                strength = strengths[k] if strengths else strength
                right = rng.random() < strength * (0.5 + ease)
                answer = gold if right else rng.choice([c for c in "ABCD" if c != gold])
                conf = min(1.0, max(0.0, (0.8 if right else 0.45) + rng.gauss(0, 0.15)))
                row = [f"q{i}", text, model, answer, str(right).lower(),
                       60 + rng.randint(0, 40), 4 + rng.randint(0, 12), round(conf, 3)]  # fmt: skip
                w.writerow([row[c] for c in keep])
    prices = folder / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "as_of": "2026-11-25",
                "source": "ccpo.testing.ladder_table (synthetic)",
                "models": {
                    m: {"input_usd_per_mtok": i, "output_usd_per_mtok": o}
                    for m, _, i, o in LADDER_MODELS
                },
            }
        ),
        encoding="utf-8",
    )
    return table, prices


def main(argv: list[str] | None = None) -> None:
    """``python -m ccpo.testing.ladder_table FOLDER [--questions N] [--seed S] [--no-labels]``:
    write the synthetic table and its prices (an example to try ``traces import`` on)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ccpo.testing.ladder_table", description=__doc__)
    ap.add_argument("folder")
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-labels", action="store_true", help="leave out the correct column")
    a = ap.parse_args(argv)
    table, prices = write_ladder_table(a.folder, a.questions, a.seed, labels=not a.no_labels)
    print(f"wrote {table} ({a.questions} questions × {len(LADDER_MODELS)} models) and {prices}")


if __name__ == "__main__":
    main()
