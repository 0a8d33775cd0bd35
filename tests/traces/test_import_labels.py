"""``ccpo traces import`` without labels (agreement with a reference model), its price file
beside the output, line ends and streaming. Tables are small and written by the tests
(illustrative, not LLM output). Errors and exit codes go through the ``ccpo`` console script (a
subprocess); the commands that succeed run its function in this process
(``tests.helpers.cli.ccpo_in``)."""

from __future__ import annotations

import csv
import json
import random
import tracemalloc
from pathlib import Path

from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.importer import import_table
from ccpo.traces.io import read_traces
from ccpo.traces.labels import labels_of
from ccpo.traces.prices import load_prices
from tests.helpers.cli import ccpo_in, run_ccpo
from tests.helpers.importing import HEADER, table_rows, write_csv

NO_LABELS = [h for h in HEADER if h != "correct"]


def _import(tmp_path: Path, table: Path, *extra: str, out: str = "o.jsonl", run=ccpo_in):
    """``ccpo traces import`` of ``table`` at task mmlu, in this process or through ``run``
    (:func:`~tests.helpers.cli.run_ccpo`: the console script, for errors)."""
    res = run("traces", "import", str(table), "--task", "mmlu", "--out", str(tmp_path / out),
              *extra)  # fmt: skip
    return res, tmp_path / out


def test_a_table_without_correct_is_labelled_by_the_most_expensive_model(tmp_path: Path) -> None:
    table = write_csv(tmp_path / "t.csv", table_rows(), NO_LABELS)
    res, out = _import(tmp_path, table, "--steps", "pair")  # round 1: two models' labels
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "labels: agreement with gpt-4o (the most expensive model of the table" in flat
    traces = read_traces(out)
    assert labels_of(traces) == "reference:gpt-4o"
    assert all(t.meta["labels"] == "reference:gpt-4o" for t in traces)
    by_id = {t.id: t for t in traces}
    # q1: gpt-4o says "B. the answer"; nano "A" disagrees, 4o-mini "(b)" agrees (letter B)
    r1 = by_id["q1"].rounds[0]
    assert (r1.base.correct, r1.guide.correct) == (False, True)
    assert by_id["q1"].gold == ["B. the answer"]
    # q3: gpt-4o's "A. the answer" is right by definition, 4o-mini's "D" is not, though the
    # table's (ignored) labels never mattered: every question is solvable
    last = by_id["q3"].rounds[-1]
    assert last.guide.model == "gpt-4o" and last.guide.correct
    assert by_id["q3"].rounds[0].guide.correct is False
    assert all(t.solvable for t in traces)
    stats = ccpo_in("traces", "stats", str(out))
    assert stats.returncode == 0 and "agreement with gpt-4o" in " ".join(stats.stdout.split())


def test_reference_replaces_labels_with_a_note_and_empty_reference_answers_are_dropped(
    tmp_path: Path,
) -> None:
    rows = table_rows()  # labels present: --reference replaces them
    for r in rows:
        if r["question_id"] == "q2" and r["model"] == "gpt-4o-mini":
            r["answer"] = "  "  # the reference said nothing on q2
    table = write_csv(tmp_path / "t.csv", rows)
    res, out = _import(tmp_path, table, "--reference", "gpt-4o-mini", "--steps", "pair")
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "labels: agreement with gpt-4o-mini (named with --reference)" in flat
    assert "note: agreement with gpt-4o-mini replaces the table's correct/gold labels" in flat
    assert "dropped 1 of 3 questions: gpt-4o-mini's answer is empty" in flat and "q2" in flat
    assert "wrote 2 traces" in flat
    traces = {t.id: t for t in read_traces(out)}
    assert set(traces) == {"q1", "q3"}
    # q3: gpt-4o-mini said "D" (marked wrong in the table): now it is the reference, right
    q3 = traces["q3"]
    assert q3.gold == ["D"] and q3.rounds[0].guide.correct
    assert not q3.rounds[-1].guide.correct  # gpt-4o's "A. the answer" disagrees with D
    # an unknown reference is one line naming the flag and the models
    res, _ = _import(tmp_path, table, "--reference", "gpt-9", out="x.jsonl", run=run_ccpo)
    assert res.returncode == 2 and "--reference 'gpt-9' is not a model of the table" in res.stderr
    # the library call gives the same traces as the command wrote
    same, _ = import_table(table, "mmlu", load_prices(), reference="gpt-4o-mini")
    assert [t.id for t in same] == ["q1", "q3"]


def test_every_reference_answer_empty_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    rows = table_rows()
    for r in rows:
        if r["model"] == "gpt-4o":
            r["answer"] = ""
    res, out = _import(tmp_path, write_csv(tmp_path / "t.csv", rows, NO_LABELS), run=run_ccpo)
    assert res.returncode == 2 and "answered none of the 3 questions" in res.stderr
    assert not out.exists()


def test_gold_labels_keep_needing_correct_on_every_jsonl_row(tmp_path: Path) -> None:
    rows = [{**r, "correct": r["correct"] == "true", "confidence": None, "logprob": None}
            for r in table_rows()]  # fmt: skip
    del rows[4]["correct"]
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    res, _ = _import(tmp_path, table, run=run_ccpo)
    assert res.returncode == 2
    assert "t.jsonl: row 5, column 'correct': missing or empty" in " ".join(res.stderr.split())
    assert "--reference" in res.stderr
    # a CSV's blank cell is no label either: refused with gold labels, ignored with a reference
    rows = table_rows()
    rows[3]["correct"] = ""
    table = write_csv(tmp_path / "blank.csv", rows)
    res, _ = _import(tmp_path, table, out="b.jsonl", run=run_ccpo)
    assert res.returncode == 2
    assert "blank.csv: row 5, column 'correct': missing or empty" in " ".join(res.stderr.split())
    res, out = _import(tmp_path, table, "--reference", "gpt-4o", out="r.jsonl")
    assert res.returncode == 0, res.stderr
    assert len(read_traces(out)) == 3


def test_prices_are_written_beside_the_output_for_stats_train_and_compare(tmp_path: Path) -> None:
    table, prices = write_ladder_table(tmp_path, n=60, seed=3)
    out = tmp_path / "lad.jsonl.gz"
    res = ccpo_in("traces", "import", str(table), "--task", "mmlu", "--out", str(out),
                  "--prices", str(prices))  # fmt: skip
    assert res.returncode == 0, res.stderr
    side = tmp_path / "lad.prices.json"
    assert side.is_file()
    written = json.loads(side.read_text())["models"]
    assert sorted(written) == ["big-m", "mid-m", "small-m", "tiny-m"]  # only the table's
    assert written["big-m"]["input_usd_per_mtok"] == 5.0
    # without --prices, these commands find the models' prices beside the traces
    assert ccpo_in("traces", "stats", str(out)).returncode == 0
    res = ccpo_in("train", "--traces", str(out), "--alpha", "0.2", "--method", "cstop",
                  "--out", str(tmp_path / "pol"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    side.unlink()  # and without it they could not
    res = run_ccpo("traces", "stats", str(out))
    assert res.returncode == 2 and "--prices" in res.stderr


def test_a_cr_only_table_reads_like_its_lf_twin(tmp_path: Path) -> None:
    lf = write_csv(tmp_path / "lf.csv", table_rows())
    cr = tmp_path / "cr.csv"
    cr.write_bytes(lf.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r"))
    assert b"\n" not in cr.read_bytes()
    res, out = _import(tmp_path, cr)
    assert res.returncode == 0, res.stderr
    twin = import_table(lf, "mmlu", load_prices())[0]
    assert [t.model_dump(exclude={"meta"}) for t in read_traces(out)] == [
        t.model_dump(exclude={"meta"}) for t in twin
    ]
    # a file mixing line ends (a bare CR inside an LF file) is one clear line, not "row 0"
    mixed = tmp_path / "mixed.csv"
    data = lf.read_bytes().replace(b"\r\n", b"\n")
    mixed.write_bytes(data.replace(b"logprob\n", b"logprob\r", 1))
    res, _ = _import(tmp_path, mixed, out="m.jsonl", run=run_ccpo)
    assert res.returncode == 2, res.stdout
    flat = " ".join(res.stderr.split())
    assert "mixed.csv: row" in flat and "bare CR" in flat and "row 0" not in flat, flat


def _shuffled_table(path: Path, n: int, seed: int) -> Path:
    """``n`` questions × 4 models with rows in random order (questions interleaved)."""
    src, _ = write_ladder_table(path.parent / f"src-{n}", n=n, seed=seed)
    with src.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    random.Random(seed).shuffle(rows)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_import_streams_rows_in_any_order_in_memory_that_does_not_grow(tmp_path: Path) -> None:
    """Rows of a question need not be adjacent (the questions come out in first-seen order),
    and the import's peak Python memory hardly grows with the table: a table 4× larger peaks
    within 2× (measured 1.4×: pydantic-core's bounded caches; holding the rows, as before,
    grows 4×). tracemalloc counts Python allocations, deterministic for a given table."""
    from ccpo.traces.importer import open_table

    peaks = {}
    for n in (100, 100, 400):  # the first run warms up (imports, caches)
        table = _shuffled_table(tmp_path / f"t{n}.csv", n, seed=n)
        prices = load_prices(tmp_path / f"src-{n}" / "prices.json")
        with open_table(table, "mmlu", prices) as imp:
            ids = [t.id for t in imp.traces()]
        with table.open(newline="", encoding="utf-8") as fh:
            first_seen = list(dict.fromkeys(r["question_id"] for r in csv.DictReader(fh)))
        assert ids == first_seen and len(ids) == n
        tracemalloc.start()
        with open_table(table, "mmlu", prices) as imp:
            assert sum(1 for _ in imp.traces()) == n
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[400] < 2 * peaks[100], peaks


def test_a_policy_trained_on_agreement_labels_records_against(tmp_path: Path) -> None:
    """provenance.against (policy.json) is the traces' meta.labels: the reference, or gold."""
    table, prices = write_ladder_table(tmp_path, n=80, seed=5)
    for name, extra, against in (
        ("ref", ("--reference", "mid-m"), "reference:mid-m"),
        ("gold", (), "gold"),
    ):
        out = tmp_path / f"{name}.jsonl"
        res = ccpo_in("traces", "import", str(table), "--task", "mmlu", "--out", str(out),
                      "--prices", str(prices), *extra)  # fmt: skip
        assert res.returncode == 0, res.stderr
        res = ccpo_in("train", "--traces", str(out), "--alpha", "0.2", "--method", "cstop",
                      "--out", str(tmp_path / f"pol-{name}"))  # fmt: skip
        assert res.returncode == 0, res.stderr
        meta = json.loads((tmp_path / f"pol-{name}" / "policy.json").read_text())
        assert meta["provenance"]["against"] == against


def test_a_cr_only_line_over_the_cap_is_refused_naming_its_line(tmp_path: Path) -> None:
    rows = table_rows()
    rows[4]["reasoning"] = "y" * 100_000
    lf = write_csv(tmp_path / "lf.csv", rows, [*HEADER, "reasoning"])
    cr = tmp_path / "cr.csv"
    cr.write_bytes(lf.read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r"))
    res = run_ccpo("--max-line-bytes", "64k", "traces", "import", str(cr), "--task", "mmlu",
               "--out", str(tmp_path / "o.jsonl"))  # fmt: skip
    assert res.returncode == 2
    # the 5th row (row 6) starts on line 22: each question cell spans five lines
    assert "cr.csv:26: line longer than the cap of 65536 bytes" in " ".join(res.stderr.split())
