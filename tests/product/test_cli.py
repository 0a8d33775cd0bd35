"""The CLI end to end: evaluate writes its files; bad input is one clear line, exit code 2."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from ccpo.cli import main


def test_evaluate_writes_table_and_files(tmp_path, sim_file, capsys):
    out = tmp_path / "ev"
    code = main(
        [
            "evaluate",
            "--traces",
            str(sim_file),
            "--alpha",
            "0.2",
            "--splits",
            "20",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "uala" in printed and "Coverage" in printed
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema"] == "ccpo.results/v1" and doc["alpha"] == 0.2 and doc["splits"] == 20
    names = [r["policy"] for r in doc["rows"]]
    assert names == [
        "random",
        "base",
        "guide",
        "uala",
        "depth-k",
        "agree-k",
        "llm-policy:sim-guide",
        "always-sim-guide",  # the strongest model of the ladder alone: the saving's yardstick
        "oracle",
    ]
    for r in doc["rows"]:
        assert len(r["cost_cents_per_split"]) == 20
        assert r["cost_cents"] == pytest.approx(sum(r["cost_cents_per_split"]) / 20, rel=1e-5)
        assert r["coverage"] == pytest.approx(sum(r["coverage_per_split"]) / 20, rel=1e-5)
    rows = list(csv.reader((out / "results.csv").open()))
    assert rows[0] == ["Policy", "Cost (cents)", "Coverage", "Avg. Len.", "Set Size"]
    assert len(rows) == 1 + len(names)
    md = (out / "results.md").read_text()
    assert "Cost (¢ per test split of 42 q.)" in md and "Coverage (target ≥ 0.80)" in md
    by = {r["policy"]: r for r in doc["rows"]}
    se = (0.2 * 0.8 / 42) ** 0.5  # a test split's coverage sd at the target
    for name, r in by.items():
        short = round(r["coverage"], 3) < 0.8
        miss = name != "oracle" and short and 0.8 - r["coverage"] > 2 * se
        noise = name != "oracle" and short and not miss
        assert (f"{r['coverage']:.3f} ✗" in md) == miss, name
        assert (f"{r['coverage']:.3f} (within noise)" in md) == noise, name
    cheapest = min(
        (
            r
            for r in doc["rows"]
            if r["policy"] not in ("oracle", "always-sim-guide") and round(r["coverage"], 3) >= 0.8
        ),
        key=lambda r: r["cost_cents"],
    )
    assert f"| **{cheapest['policy']} ★** |" in md and md.count("★") == 1
    for png in ("box_coverage.png", "box_cost.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_traces_validate_and_stats(sim_file, capsys):
    assert main(["traces", "validate", str(sim_file)]) == 0
    assert "300 traces" in capsys.readouterr().out
    assert main(["traces", "stats", str(sim_file)]) == 0
    out = capsys.readouterr().out
    assert "solvable" in out and "base acc" in out
    # the ladder the file records (sim traces: the one-pair judge ladder of their models)
    assert "ladder: round 1: sim-base → sim-guide (judge); round 2:" in " ".join(out.split())


def _one_line_error(capsys, argv, *needles):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 3  # one line (soft-wrapped at most)
    for n in needles:
        assert n in err
    return err


def test_bad_alpha(capsys, sim_file, tmp_path):
    _one_line_error(
        capsys,
        ["evaluate", "--traces", str(sim_file), "--alpha", "1.5", "--out", str(tmp_path)],
        "alpha",
    )


def test_missing_file(capsys, tmp_path):
    _one_line_error(
        capsys, ["traces", "validate", str(tmp_path / "nope.jsonl")], "nope.jsonl", "no such file"
    )


def test_malformed_line_names_file_line_field(capsys, tmp_path, sim_file):
    lines = sim_file.read_text().splitlines()
    obj = json.loads(lines[4])
    obj["rounds"][1]["guide"]["verdict"] = "maybe"
    lines[4] = json.dumps(obj)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    _one_line_error(
        capsys, ["traces", "validate", str(bad)], "bad.jsonl:5", "rounds.1.guide.verdict"
    )


def test_unknown_model_price(capsys, tmp_path, sim_file):
    text = sim_file.read_text().replace('"sim-guide"', '"my-new-model"')
    p = tmp_path / "unpriced.jsonl"
    p.write_text(text)
    _one_line_error(
        capsys,
        ["evaluate", "--traces", str(p), "--out", str(tmp_path / "o")],
        "my-new-model",
        "--prices",
    )


def test_prices_flag_fixes_unknown_model(capsys, tmp_path, sim_file):
    text = sim_file.read_text().replace('"sim-guide"', '"my-new-model"')
    p = tmp_path / "unpriced.jsonl"
    p.write_text(text)
    pf = tmp_path / "prices.json"
    pf.write_text(
        json.dumps(
            {
                "as_of": "2026-11-22",
                "source": "test",
                "models": {"my-new-model": {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}},
            }
        )
    )
    assert main(["traces", "stats", str(p), "--prices", str(pf)]) == 0


def test_debug_shows_traceback(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ccpo",
            "--debug",
            "traces",
            "validate",
            str(tmp_path / "nope.jsonl"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ccpo",
            "traces",
            "validate",
            str(tmp_path / "nope.jsonl"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no such file" in r.stderr
