"""The report's saving against always calling the strongest model, the within-noise mark and
the agreement wording of label-free traces (pure pieces, and `ccpo evaluate` end to end)."""

from __future__ import annotations

import json
import shutil

import pytest

from ccpo.evaluation.harness import ResultRow, prices_for
from ccpo.report.tables import (
    beyond_noise,
    coverage_header,
    coverage_se,
    results_table,
    saving_line,
    within_noise,
)
from ccpo.testing.relabel import relabel_against_strongest
from ccpo.traces.io import read_traces, write_traces
from tests.helpers.cli import ccpo_ok

MMLU = "src/ccpo/data/traces/mmlu-public.jsonl.gz"


def _row(name: str, cost: float, cov: float, kind: str = "conformal") -> ResultRow:
    return ResultRow(name, cost, cov, 1.0, 1.0, kind=kind)


def test_noise_marks():
    se = coverage_se(0.1, 100)
    assert se == pytest.approx(0.03)
    assert not within_noise(0.9, 0.1, 100) and not beyond_noise(0.9, 0.1, 100)
    assert within_noise(0.85, 0.1, 100) and not beyond_noise(0.85, 0.1, 100)  # 1.7 SE short
    assert beyond_noise(0.83, 0.1, 100) and not within_noise(0.83, 0.1, 100)  # 2.3 SE short
    assert beyond_noise(0.899, 0.1, None)  # no test size known: every miss counts
    t = results_table([_row("a", 1.0, 0.85), _row("b", 2.0, 0.80)], "", 0.1, 100)
    cov = t.headers.index("Coverage (target ≥ 0.90)")
    assert t.rows[0][cov] == "0.850 (within noise)" and not t.miss[0][cov]
    assert t.rows[1][cov] == "0.800" and t.miss[1][cov]


def test_saving_line_and_agreement_wording():
    rows = [
        _row("cstop", 2.3, 0.91),
        _row("auto", 2.0, 0.89),  # misses the target: not the cheapest at it
        _row("always-gpt-4o", 10.0, 0.95, "reference"),
        _row("oracle", 1.0, 0.90, "bound"),
    ]
    assert saving_line(rows, 0.1) == (
        "cstop costs 23% of always-gpt-4o at coverage 0.910, 2.30× the oracle floor "
        "(always-gpt-4o alone: coverage 0.950)"
    )
    ref = "reference:gpt-4o"
    assert saving_line(rows, 0.1, ref).startswith(
        "cstop costs 23% of always-gpt-4o at agreement with gpt-4o 0.910"
    )
    assert coverage_header(0.1, ref) == "Agreement with gpt-4o (target ≥ 0.90)"
    assert saving_line(rows[:1], 0.1) is None  # no always row, no saving line
    t = results_table(rows, "", 0.1, 100, ref)
    assert "Cost / always-gpt-4o" in t.headers
    assert t.rows[0][t.headers.index("Cost / always-gpt-4o")] == "0.23×"


def test_evaluate_label_free_says_agreement(tmp_path):
    """A bundled set relabelled against its strongest model: results.json carries against,
    the table says agreement, and always-<reference> agrees with itself on every question."""
    traces, model = relabel_against_strongest(read_traces(MMLU), prices_for(MMLU))
    path = tmp_path / "free.jsonl.gz"
    write_traces(path, traces)
    shutil.copy(MMLU.removesuffix(".jsonl.gz") + ".prices.json", tmp_path / "free.prices.json")
    out = tmp_path / "ev"
    r = ccpo_ok("evaluate", "--traces", str(path), "--policy",
                f"depth-k,always-{model},cstop-single,oracle", "--alpha", "0.1",
                "--splits", "10", "--out", str(out))  # fmt: skip
    res = json.loads((out / "results.json").read_text())
    assert res["against"] == f"reference:{model}"
    by = {x["policy"]: x for x in res["rows"]}
    assert by[f"always-{model}"]["coverage"] == 1.0
    # every row has an estimated latency beside its cost; one call alone beats a cascade
    assert all(x["latency_s"] > 0 for x in res["rows"])
    assert by[f"always-{model}"]["latency_s"] < by["depth-k"]["latency_s"]
    assert by["cstop-single"]["set_size"] == 1.0
    md = (out / "results.md").read_text()
    assert f"Agreement with {model} (target ≥ 0.90)" in md and "Coverage (" not in md
    assert "Est. latency (s)" in md
    assert md.startswith("**Cheapest at the target:** ")
    assert " costs " in md and f"of always-{model} at agreement with {model}" in md
    # the terminal says what the figure is: a share of the cost, not "saving: pol: 74% of"
    flat = " ".join(r.stdout.split())
    assert "cheapest at the target: " in flat and "costs " in flat and "saving:" not in flat


def test_refusal_notes_name_single_rows_without_a_certified_threshold():
    from ccpo.report.tables import refusal_notes

    rows = [
        ResultRow("auto-single", 1.0, 0.87, 4.0, 1.0, kind="single", extra={"refused_share": 0.45}),
        ResultRow("cstop-single", 1.0, 0.95, 1.2, 1.0, kind="single", extra={"refused_share": 0}),
        _row("cstop", 1.0, 0.9),
    ]
    (note,) = refusal_notes(rows)
    assert note.startswith("auto-single: no single-answer threshold certified at this α on 45%")
