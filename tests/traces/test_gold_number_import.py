"""A table with gold answers and no ``correct`` column is labelled by its gold, and the
``number`` family compares numbers (a maths set's final answers): the two-model ladder of such
a table imports, trains one answer and checks on held-out questions. Tables are written by the
tests (illustrative, not LLM output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccpo.traces.answers import exact_match, normalize_number
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok, run_ccpo
from tests.helpers.importing import math_table


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is $1,200.00.", "1200"),
        ("1200", "1200"),
        ("Answer: 18.50", "18.5"),
        ("-0", "0"),
        ("so x = 3, then 4.5 cups", "4.5"),
        ("Answer: -12", "-12"),
        ("between 5-6 apples", "6"),  # a range's dash is no minus sign
        ("a -7 b", "-7"),
        (".5", "0.5"),
        ("1,000,000 people", "1000000"),
        ("no number here", ""),
    ],
)
def test_the_number_family_keeps_the_last_number_in_canonical_form(text, number) -> None:
    assert normalize_number(text) == number


def test_number_answers_match_as_numbers_and_no_number_matches_nothing() -> None:
    assert exact_match("So she pays $1,200.", ["1200.0"], "gsm", "number")
    assert not exact_match("So she pays $1,201.", ["1200"], "gsm", "number")
    assert not exact_match("I cannot tell.", [""], "gsm", "number")  # "" never equals


def test_a_gold_column_labels_the_table_and_a_question_without_gold_is_dropped(
    tmp_path: Path,
) -> None:
    table, truth = math_table(tmp_path / "math.jsonl")
    out = tmp_path / "t.jsonl"
    res = ccpo_ok("traces", "import", str(table), "--task", "gsm", "--family", "number",
                  "--out", str(out))  # fmt: skip
    flat = " ".join(res.stdout.split())
    assert "labels: the table's gold answers" in flat and "number normaliser" in flat
    assert "dropped 1 of 241 questions: no row has a gold answer" in flat and "nogold" in flat
    traces = {t.id: t for t in read_traces(out)}
    assert len(traces) == 240
    got = {i: (t.rounds[0].base.correct, t.rounds[1].base.correct) for i, t in traces.items()}
    assert got == truth  # every label is the table's gold, whatever the answer's form
    assert {t.family for t in traces.values()} == {"number"}
    # --reference still replaces the gold, with a note
    res = ccpo_ok("traces", "import", str(table), "--task", "gsm", "--family", "number",
                  "--reference", "gpt-4o", "--out", str(tmp_path / "r.jsonl"))  # fmt: skip
    assert "agreement with gpt-4o replaces the table's correct/gold labels" in " ".join(
        res.stdout.split()
    )
    # a family that does not exist is one line through the console script
    bad = run_ccpo("traces", "import", str(table), "--task", "gsm", "--family", "numbers",
                   "--out", str(tmp_path / "x.jsonl"))  # fmt: skip
    assert bad.returncode == 2 and "unknown task family 'numbers'" in bad.stderr
    assert "number" in bad.stderr and "Traceback" not in bad.stderr


def test_a_two_model_maths_ladder_meets_alpha_on_held_out_questions_below_the_strong_cost(
    tmp_path: Path,
) -> None:
    """Statistical: seed 0 table, train's seed 0. Held-out acceptance (check's coverage on
    120 questions) ≥ 1 − α − 0.08 (about two standard errors at 0.8), cost below always the
    strong model: the cheap reply is returned where its confidence is high."""
    table, _ = math_table(tmp_path / "math.jsonl", n=480)
    traces = tmp_path / "t.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "gsm", "--family", "number",
            "--out", str(traces))  # fmt: skip
    lines = traces.read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "fit.jsonl").write_text("".join(lines[:240]), encoding="utf-8")
    (tmp_path / "held.jsonl").write_text("".join(lines[240:]), encoding="utf-8")
    pol = tmp_path / "pol"
    ccpo_ok("train", "--traces", str(tmp_path / "fit.jsonl"), "--answer", "single",
            "--alpha", "0.2", "--seed", "0", "--out", str(pol))  # fmt: skip
    res = ccpo_ok("check", "--policy", str(pol), "--traces", str(tmp_path / "held.jsonl"),
                  "--json")  # fmt: skip
    rep = json.loads(res.stdout)
    assert rep["coverage"] >= 0.8 - 0.08, rep
    assert rep["cost_ratio_to_reference"] < 0.8, rep  # the cheap reply is returned often
    assert rep["rounds"] < 1.8, rep
