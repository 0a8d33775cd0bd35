"""``traces import --accept RULE``: a team's own scores become labels by a stated rule, the
rule's grammar is checked through the real entry point, and a policy trained on scored
traces says the rule in its guarantee."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from ccpo.policies.registry import load_policy
from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.accept import parse_rule
from ccpo.traces.io import read_traces
from ccpo.traces.labels import labels_of, rule_labels
from tests.helpers.cli import assert_usage_error, ccpo_in, run_ccpo
from tests.helpers.importing import HEADER, labels_by_model, table_rows, write_csv

SCORED = [h for h in HEADER if h != "correct"] + ["score"]
# q -> model -> score (gpt-4o is the most expensive model: the reference of relative rules)
SCORES = {
    "q1": {"gpt-4.1-nano": 3, "gpt-4o-mini": 8, "gpt-4.1-mini": 9, "gpt-4o": 9},
    "q2": {"gpt-4.1-nano": 7, "gpt-4o-mini": 6, "gpt-4.1-mini": 8.5, "gpt-4o": 7},
    "q3": {"gpt-4.1-nano": 2, "gpt-4o-mini": 5, "gpt-4.1-mini": 4, "gpt-4o": 6},
}


def _scored_table(tmp_path: Path, missing: tuple[str, str] | None = None) -> Path:
    rows = table_rows()
    for r in rows:
        s = SCORES[r["question_id"]][r["model"]]
        r["score"] = "" if (r["question_id"], r["model"]) == missing else str(s)
    return write_csv(tmp_path / "scored.csv", rows, SCORED)


def _import(tmp_path: Path, table: Path, *extra: str, run=run_ccpo):
    """``ccpo traces import`` of ``table`` through the console script, or through ``run``
    (:func:`~tests.helpers.cli.ccpo_in`, in this process, for the imports that succeed)."""
    out = tmp_path / "o.jsonl"
    res = run("traces", "import", str(table), "--task", "qa", "--family", "exact",
              "--out", str(out), *extra)  # fmt: skip
    return res, out


@pytest.mark.parametrize(
    "rule,canonical",
    [
        ("score>=8", "score>=8"),
        (" score >= 7.5 ", "score>=7.5"),
        ("score>reference", "score>reference"),
        ("score>=reference-1", "score>=reference-1"),
        ("SCORE==reference+0.5", "score==reference+0.5"),
    ],
)
def test_the_grammar_reads_its_rules(rule: str, canonical: str) -> None:
    assert parse_rule(rule).text == canonical


@pytest.mark.parametrize(
    "rule",
    ["score>=", "rating>=8", "score=>8", "score>=8 and score<10", "8<=score", "score>=ref-1",
     "score>=reference*2", "score>=-", "score>=nan"],
)  # fmt: skip
def test_a_bad_rule_is_refused_through_the_cli_naming_the_grammar(tmp_path: Path, rule) -> None:
    table = _scored_table(tmp_path)
    res, out = _import(tmp_path, table, "--accept", rule)
    assert_usage_error(res, "--accept", "score OP NUMBER", "score>=reference-1")
    assert not out.exists()


def test_an_absolute_rule_labels_each_row_by_its_own_score(tmp_path: Path) -> None:
    res, out = _import(tmp_path, _scored_table(tmp_path), "--accept", "score>=8", run=ccpo_in)
    assert res.returncode == 0, res.stderr
    assert "labels: acceptance (scores ≥ 8) (--accept score>=8)" in " ".join(res.stdout.split())
    want = {q: {m: s >= 8 for m, s in by.items()} for q, by in SCORES.items()}
    assert labels_by_model(out) == want
    traces = read_traces(out)
    assert labels_of(traces) == 'scored:{"rule":"score>=8"}'
    assert rule_labels(labels_of(traces)) == {"kind": "scored", "rule": "score>=8"}
    q3 = next(t for t in traces if t.id == "q3")
    assert not q3.solvable  # no reply meets the rule: not a question any round can answer
    assert q3.rounds[0].base.model_extra["score"] == 2  # the score kept beside its label


def test_a_relative_rule_compares_with_the_reference_models_score(tmp_path: Path) -> None:
    res, out = _import(tmp_path, _scored_table(tmp_path), "--accept", "score>=reference-1",
                       run=ccpo_in)  # fmt: skip
    assert res.returncode == 0, res.stderr
    ref = {q: by["gpt-4o"] for q, by in SCORES.items()}
    want = {q: {m: s >= ref[q] - 1 for m, s in by.items()} for q, by in SCORES.items()}
    assert labels_by_model(out) == want
    want_labels = 'scored:{"reference":"gpt-4o","rule":"score>=reference-1"}'
    assert labels_of(read_traces(out)) == want_labels
    # another reference, named
    res, out = _import(tmp_path, _scored_table(tmp_path), "--accept", "score>reference",
                       "--reference", "gpt-4.1-mini", "--force", run=ccpo_in)  # fmt: skip
    assert res.returncode == 0, res.stderr
    ref = {q: by["gpt-4.1-mini"] for q, by in SCORES.items()}
    assert labels_by_model(out) == {
        q: {m: s > ref[q] for m, s in by.items()} for q, by in SCORES.items()
    }


def test_a_missing_score_leaves_its_question_out_and_says_so(tmp_path: Path) -> None:
    table = _scored_table(tmp_path, missing=("q2", "gpt-4o-mini"))
    res, out = _import(tmp_path, table, "--accept", "score>=8", run=ccpo_in)
    assert res.returncode == 0, res.stderr
    assert "left out 1 of 3 questions: a model's score is missing (never guessed): q2" in " ".join(
        res.stdout.split()
    )
    assert sorted(t.id for t in read_traces(out)) == ["q1", "q3"]


def test_scores_without_a_rule_and_a_rule_without_scores_are_refused(tmp_path: Path) -> None:
    res, out = _import(tmp_path, _scored_table(tmp_path))
    assert_usage_error(res, "'score' column", "--accept")
    assert not out.exists()
    plain = write_csv(tmp_path / "plain.csv", table_rows())
    res, out = _import(tmp_path, plain, "--accept", "score>=8")
    assert_usage_error(res, "column 'score'", "needs a 'score' column")
    res, out = _import(tmp_path, _scored_table(tmp_path), "--accept", "score>=8", "--reference",
                       "gpt-4o")  # fmt: skip
    assert_usage_error(res, "--reference gpt-4o", "relative rule")
    assert not out.exists()


def test_a_policy_on_scored_traces_states_the_rule_in_its_guarantee(tmp_path: Path) -> None:
    table, prices = write_ladder_table(tmp_path, n=160, seed=3)
    rows = list(csv.DictReader(table.open(encoding="utf-8")))
    for i, r in enumerate(rows):  # a right answer scores 8-10, a wrong one 2-7 (synthetic)
        r["score"] = str(8 + i % 3 if r.pop("correct") == "true" else 2 + i % 6)
    scored = tmp_path / "scored.csv"
    with scored.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "scored.jsonl"
    res = ccpo_in("traces", "import", str(scored), "--task", "mmlu", "--out", str(out),
                  "--prices", str(prices), "--accept", "score>=reference-1")  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = ccpo_in("train", "--traces", str(out), "--alpha", "0.2", "--method", "depth-k",
                  "--answer", "single", "--out", str(tmp_path / "pol"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    meta = json.loads((tmp_path / "pol" / "policy.json").read_text())
    assert meta["provenance"]["against"] == labels_of(read_traces(out))
    statement = load_policy(tmp_path / "pol").guarantee_statement()
    assert statement == (
        "the answer scores ≥ big-m's score − 1 (the table's scores) with probability ≥ 0.8"
    )


@pytest.mark.parametrize(
    "labels",
    ['scored:{"rule":"score>>8"}', "scored:{rule}", 'scored:{"rule":8}', 'judged:{"judge":"j"}',
     'judged:{"judge":"j","reference":"r","rule":"rating>=8"}'],
)  # fmt: skip
def test_a_trace_set_with_malformed_scored_or_judged_labels_is_refused(tmp_path, labels) -> None:
    res, out = _import(tmp_path, _scored_table(tmp_path), "--accept", "score>=8", run=ccpo_in)
    assert res.returncode == 0, res.stderr
    lines = out.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["meta"]["labels"] = labels
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    res = run_ccpo("traces", "stats", str(tmp_path / "bad.jsonl"))
    assert_usage_error(res, "meta.labels must be", "scored:{...}")
