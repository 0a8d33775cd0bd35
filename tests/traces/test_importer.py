"""``ccpo traces import``: a table of several models' answers → a ccpo.trace/v1 cascade.

The tables here are small and written by the tests (illustrative numbers, not LLM output).
User-facing behaviour (output, errors, exit codes) goes through the real ``ccpo`` entry point, a
subprocess where it fails; commands that succeed may run its function in this process
(``tests.helpers.cli.ccpo_ok``).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from ccpo.cli import main
from ccpo.errors import CCPOError, UnknownModelPriceError
from ccpo.evaluation.harness import load_episodes
from ccpo.traces.importer import import_table
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices
from tests.helpers.cli import CCPO, ccpo_ok, run_ccpo
from tests.helpers.importing import HEADER, table_rows, write_csv

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "import-example.csv"


def _typed(row: dict) -> dict:
    """A row of :func:`table_rows` as a JSONL table writes it: typed JSON values, not text."""
    out = {**row, "correct": row["correct"] == "true"}
    for k in ("confidence", "logprob"):
        out[k] = float(row[k]) if row[k] else None
    return out


def test_happy_path_csv_and_jsonl_give_the_same_cascade(tmp_path: Path) -> None:
    prices = load_prices()
    # pairs (--steps pair), whose verdicts compare two models; one model per step, the
    # default: tests/traces/test_one_model_steps.py
    traces, plan = import_table(
        write_csv(tmp_path / "t.csv", table_rows()), "mmlu", prices, steps="pair"
    )
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(json.dumps(_typed(r)) + "\n" for r in table_rows()), encoding="utf-8")
    traces2, plan2 = import_table(jsonl, "mmlu", prices, steps="pair")
    bom = tmp_path / "bom.csv"  # a spreadsheet's "CSV UTF-8" export starts with a BOM
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "t.csv").read_bytes())
    assert import_table(bom, "mmlu", prices, steps="pair")[1] == plan
    same = [t.model_dump(exclude={"meta"}) for t in traces]
    assert same == [t.model_dump(exclude={"meta"}) for t in traces2]
    assert traces[0].meta["source"] == "imported from t.csv by ccpo traces import"
    assert plan == plan2

    assert [t.id for t in traces] == ["q1", "q2", "q3"]
    assert all(t.n_rounds == 3 and t.task == "mmlu" for t in traces)
    q1, q2, q3 = traces
    r1 = q1.rounds[0]
    assert (r1.base.model, r1.guide.model) == ("gpt-4.1-nano", "gpt-4o-mini")
    assert r1.guide.verdict == "no"  # A vs (b)
    assert q2.rounds[0].guide.verdict == "yes"  # "C." and "C" are one option letter
    assert q3.rounds[0].base.answer == "" and q3.rounds[0].guide.verdict == "no"
    # no gold column: the answers marked correct, one per option letter, first seen first
    assert q1.gold == ["B. the answer"]
    assert q3.gold == ["A. the answer"]
    # log-prob score and uncertainty from the row's probability
    assert r1.base.logprob_mean == pytest.approx(-0.5)  # logprob column kept
    assert r1.guide.uncertainty is None  # gpt-4o-mini has neither column
    last = q1.rounds[2]
    assert last.guide.model == "gpt-4o" and last.guide.uncertainty == pytest.approx(0.2)
    assert q1.rounds[1].base.logprob_mean is None
    # usage is each model's own row
    assert r1.guide.usage.input_tokens == 100 and r1.guide.usage.output_tokens == 10


def test_rounds_are_ordered_by_price_per_token_then_cost_per_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = load_prices()
    _, plan = import_table(
        write_csv(tmp_path / "t.csv", table_rows()), "mmlu", prices, steps="pair"
    )
    assert plan.bases == ("gpt-4.1-nano", "gpt-4o-mini", "gpt-4.1-mini")
    assert plan.guides == ("gpt-4o-mini", "gpt-4.1-mini", "gpt-4o")
    # a cheap-per-token model that writes many tokens stays below the dearer-per-token ones
    # (ordering by cost on the file put it last, and round 1 returned a weaker model's answer)
    rows = table_rows()
    for r in rows:
        if r["model"] == "gpt-4.1-nano":
            r["output_tokens"] = 100_000
    table = write_csv(tmp_path / "u.csv", rows)
    _, plan = import_table(table, "mmlu", prices)
    assert plan.bases[0] == "gpt-4.1-nano" and plan.bases[-1] == "gpt-4o"
    assert plan.cost_per_question["gpt-4.1-nano"] > plan.cost_per_question["gpt-4o"]
    # the same through the console script's function: round 1's base is the cheapest per token
    monkeypatch.setenv("COLUMNS", "200")
    out = ccpo_ok("traces", "import", str(table), "--task", "mmlu", "--out", str(tmp_path / "o"))
    rows = [line for line in out.stdout.splitlines() if line.startswith("│ ")]
    assert [r.split("│")[2].strip() for r in rows] == [
        "gpt-4.1-nano", "gpt-4o-mini", "gpt-4.1-mini", "gpt-4o",
    ]  # fmt: skip


def test_a_tie_in_price_per_token_goes_to_the_lower_cost_per_question(tmp_path: Path) -> None:
    rows = [r for r in table_rows() if r["model"] in ("gpt-4o", "gpt-4.1-nano")]
    twin = [
        {**r, "model": "gemini-2.0-flash", "output_tokens": 5}
        for r in rows
        if r["model"] == "gpt-4.1-nano"
    ]  # same list price as gpt-4.1-nano, fewer tokens
    _, plan = import_table(write_csv(tmp_path / "t.csv", rows + twin), "mmlu", load_prices())
    assert plan.order() == ["gemini-2.0-flash", "gpt-4.1-nano", "gpt-4o"]


def test_named_guide_guides_every_round(tmp_path: Path) -> None:
    traces, plan = import_table(
        write_csv(tmp_path / "t.csv", table_rows()), "mmlu", load_prices(), guide="gpt-4.1-mini"
    )
    assert plan.bases == ("gpt-4.1-nano", "gpt-4o-mini", "gpt-4o")
    assert plan.guides == ("gpt-4.1-mini",) * 3
    assert all(r.guide.model == "gpt-4.1-mini" for t in traces for r in t.rounds)
    with pytest.raises(CCPOError, match="--guide 'gpt-9'"):
        import_table(tmp_path / "t.csv", "mmlu", load_prices(), guide="gpt-9")


def test_unknown_model_needs_prices_and_prices_file_fixes_it(tmp_path: Path) -> None:
    rows = table_rows()
    for r in rows:
        if r["model"] == "gpt-4o":
            r["model"] = "my-local-model"
    table = write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(UnknownModelPriceError, match="my-local-model"):
        import_table(table, "mmlu", load_prices())
    res = run_ccpo(
        "traces", "import", str(table), "--task", "mmlu", "--out", str(tmp_path / "o.jsonl")
    )
    assert res.returncode == 2 and "my-local-model" in res.stderr and "--prices" in res.stderr
    pf = tmp_path / "prices.json"
    pf.write_text(
        json.dumps(
            {
                "as_of": "2026-11-23",
                "source": "test",
                "models": {"my-local-model": {"input_usd_per_mtok": 0, "output_usd_per_mtok": 0}},
            }
        )
    )
    out = tmp_path / "o.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "mmlu", "--out", str(out),
            "--prices", str(pf))  # fmt: skip
    assert read_traces(out)[0].rounds[0].base.model == "my-local-model"  # free: the first base


def _bad(
    capsys, tmp_path: Path, rows: list[dict], *needles: str, header: list[str] = HEADER
) -> str:
    """Import a bad table through the CLI's entry function: exit 2, one line naming the file
    and the needles, and no output file."""
    table = write_csv(tmp_path / "bad.csv", rows, header)
    out = tmp_path / "never.jsonl"
    code = main(["traces", "import", str(table), "--task", "mmlu", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3  # one line, soft-wrapped at most
    flat = " ".join(err.split())
    for n in ("bad.csv", *needles):
        assert n in flat, flat
    assert not out.exists()  # nothing half-written
    return flat


@pytest.mark.parametrize(
    ("row", "column", "value", "needle"),
    [
        (2, "correct", "maybe", "expected true or false"),
        (5, "input_tokens", "-3", "greater than or equal to 0"),
        (7, "confidence", "1.5", "less than or equal to 1"),
        (4, "output_tokens", "many", "integer"),
        (3, "question_id", "", "at least 1 character"),
    ],
)
def test_bad_cell_names_row_and_column(
    capsys, tmp_path: Path, row: int, column: str, value: str, needle: str
) -> None:
    rows = table_rows()
    rows[row - 2][column] = value  # row 1 is the header, as a spreadsheet numbers them
    _bad(capsys, tmp_path, rows, f"row {row}", f"column '{column}'", needle)


def test_bad_tables_are_one_line_errors(capsys, tmp_path: Path) -> None:
    rows = table_rows()
    _bad(
        capsys,
        tmp_path,
        rows,
        "row 1",
        "column 'answer'",
        "missing",
        header=[h for h in HEADER if h != "answer"],
    )
    _bad(capsys, tmp_path, [*rows, dict(rows[0])], "row 14", "column 'model'", "twice (row 2)")
    _bad(
        capsys,
        tmp_path,
        rows[:-1],
        "column 'model'",
        "question 'q3' has no row for model 'gpt-4o-mini'",
    )
    odd = [dict(r) for r in rows]
    odd[1]["question"] = "another text"
    _bad(capsys, tmp_path, odd, "row 3", "column 'question'", "differs from row 2")
    _bad(capsys, tmp_path, [r for r in rows if r["model"] == "gpt-4o"], "at least two models")


def test_bad_row_through_the_console_script(tmp_path: Path) -> None:
    rows = table_rows()
    rows[3]["correct"] = "perhaps"
    table = write_csv(tmp_path / "bad.csv", rows)
    res = run_ccpo("traces", "import", str(table), "--task", "mmlu", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "bad.csv: row 5, column 'correct': expected true or false" in res.stderr


def test_output_is_not_overwritten_without_force(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    out.write_text("precious\n")
    table = write_csv(tmp_path / "t.csv", table_rows())
    res = run_ccpo("traces", "import", str(table), "--task", "mmlu", "--out", str(out))
    assert res.returncode == 2 and "--force" in res.stderr
    assert out.read_text() == "precious\n"
    ccpo_ok("traces", "import", str(table), "--task", "mmlu", "--out", str(out), "--force")
    assert len(read_traces(out)) == 3


def test_readme_example_runs_as_written_and_feeds_the_harness(tmp_path: Path) -> None:
    """The README's command on docs/examples/import-example.csv, then the imported file
    through validate and the episode engine."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    cmd = "ccpo traces import docs/examples/import-example.csv --task qa --out imported.jsonl"
    assert cmd in readme
    assert len(EXAMPLE.read_text(encoding="utf-8").splitlines()) == 21  # header + 20 rows
    shutil.copytree(REPO / "docs" / "examples", tmp_path / "docs" / "examples")
    res = subprocess.run(
        [CCPO, *cmd.split()[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    for line in (
        "wrote 5 traces to imported.jsonl",
        "│ 4    │ gpt-4o       │ 0.0142      │",  # one model per step
    ):
        assert line in res.stdout and line in readme
    out = tmp_path / "imported.jsonl"
    assert run_ccpo("traces", "validate", str(out)).returncode == 0
    ep, _ = load_episodes(out)
    assert (ep.n, ep.horizon) == (5, 4) and ep.one_model
    assert ep.correct[:, 0, 0].sum() == 1  # gpt-4.1-nano right on 1 of 5
    assert math.isclose(float(ep.uncertainty[0, 1]), 1 - 0.81)  # gpt-4o-mini's confidence


@pytest.mark.parametrize(
    ("column", "value", "needle"),
    [
        ("correct", "false", "valid boolean"),
        ("correct", 0, "valid boolean"),
        ("input_tokens", "100", "valid integer"),
        ("output_tokens", 10.0, "valid integer"),
        ("confidence", "0.8", "valid number"),
    ],
)
def test_jsonl_values_are_typed_json_csv_cells_are_text(tmp_path: Path, column, value, needle):
    """A CSV's cells are text ("false", "100" are read as what they say); a JSONL table is typed
    JSON, so the same text there is refused in one line naming the file, row and column."""
    rows = [_typed(r) for r in table_rows()]
    rows[2][column] = value
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    res = run_ccpo("traces", "import", str(table), "--task", "mmlu", "--out", str(tmp_path / "o"))
    assert res.returncode == 2, res.stderr
    err = " ".join(res.stderr.split())
    assert f"t.jsonl: row 3, column '{column}': Input should be a {needle}" in err, err
    assert not (tmp_path / "o").exists()
    # the CSV twin of the same table, with "false"/"100" as its cells, imports
    assert len(import_table(write_csv(tmp_path / "t.csv", table_rows()), "mmlu", load_prices())[0])


def test_a_table_line_over_the_cap_is_refused_before_it_is_read_whole(tmp_path: Path) -> None:
    """CSV and JSONL (also gzip-compressed): a line over the cap is one line naming the file, the
    line and the cap (exit 2), through the console script with a 64 kB cap."""
    import gzip

    huge = {**_typed(table_rows()[0]), "question": "x" * 100_000}
    rows = [json.dumps(_typed(r)) for r in table_rows()]
    rows[1] = json.dumps(huge)
    jsonl = tmp_path / "t.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")
    csv_rows = table_rows()
    csv_rows[4]["reasoning"] = "y" * 100_000
    table = write_csv(tmp_path / "t.csv", csv_rows, [*HEADER, "reasoning"])
    # the CSV's 5th row (row 6) starts on line 22: each question cell spans five lines
    for path, line in ((jsonl, 2), (table, 26)):
        res = run_ccpo("--max-line-bytes", "64k", "traces", "import", str(path), "--task", "mmlu",
                   "--out", str(tmp_path / "o.jsonl"))  # fmt: skip
        err = " ".join(res.stderr.split())
        assert res.returncode == 2, res.stderr
        assert f"{path.name}:{line}: line longer than the cap of 65536 bytes" in err, err
        assert "Traceback" not in res.stderr
    # a gzip-compressed JSONL table within the cap imports
    ok = tmp_path / "ok.jsonl.gz"
    with gzip.open(ok, "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(_typed(r)) + "\n" for r in table_rows()))
    assert len(import_table(ok, "mmlu", load_prices())[0]) == 3
