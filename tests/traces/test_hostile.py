"""Hostile trace files: every reader refuses them with one line naming file, line and field
(through the real ``ccpo`` entry point), never a traceback, never a silently moved result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ccpo.cli import main
from tests.helpers.cli import ENV as CHILD_ENV

ROOT = Path(__file__).resolve().parents[2]
ENV = {**CHILD_ENV, "COLUMNS": "300"}


def _dicts(sim_traces, n: int = 60) -> list[dict]:
    return [t.to_json_dict() for t in sim_traces[:n]]


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def _set(d: dict, dotted: str, value) -> dict:
    d = json.loads(json.dumps(d))
    node = d
    *head, last = dotted.split(".")
    for k in head:
        node = node[int(k)] if k.isdigit() else node[k]
    node[last] = value
    return d


def _hostile(sim_traces, kind: str) -> tuple[list, int, str]:
    """(rows, 1-based bad line, text the error must contain)."""
    rows: list = _dicts(sim_traces)
    line = 5
    if kind == "deep":
        rows[line - 1] = "[" * 100_000
        return rows, line, "nested too deeply"
    if kind == "nan":
        rows[line - 1] = json.dumps(rows[line - 1]).replace(
            '"uncertainty": ' + json.dumps(rows[line - 1]["rounds"][0]["guide"]["uncertainty"]),
            '"uncertainty": NaN',
            1,
        )
        return rows, line, "NaN is not a number JSON allows"
    if kind == "inf":
        rows[line - 1] = json.dumps(
            _set(rows[line - 1], "rounds.0.base.logprob_mean", -1.0)
        ).replace("-1.0", "-Infinity", 1)
        return rows, line, "-Infinity is not a number JSON allows"
    bad = {
        "unc_negative": ("rounds.0.guide.uncertainty", -3, "rounds.0.guide.uncertainty"),
        "unc_huge": ("rounds.0.guide.uncertainty", 1e300, "rounds.0.guide.uncertainty"),
        "logprob_positive": ("rounds.1.base.logprob_min", 5.0, "rounds.1.base.logprob_min"),
        "tokens_huge": ("rounds.0.base.usage.input_tokens", 1e300, "input_tokens"),
        # strict types: a string or a float is not what the schema says, even if it reads as one
        "correct_string": (
            "rounds.1.guide.correct",
            "false",
            "field 'rounds.1.guide.correct': Input should be a valid boolean",
        ),
        "correct_int": ("rounds.0.base.correct", 0, "rounds.0.base.correct"),
        "tokens_float": (
            "rounds.0.guide.usage.output_tokens",
            6.0,
            "field 'rounds.0.guide.usage.output_tokens': Input should be a valid integer",
        ),
        "tokens_string": ("rounds.0.base.usage.input_tokens", "812", "valid integer"),
        "round_float": ("rounds.0.round", 1.0, "field 'rounds.0.round'"),
        "logprob_string": ("rounds.0.base.logprob_mean", "-0.5", "valid number"),
    }
    if kind in bad:
        path, value, needle = bad[kind]
        rows[line - 1] = _set(rows[line - 1], path, value)
        return rows, line, needle
    if kind == "duplicate_id":
        rows[line - 1] = _set(rows[line - 1], "id", rows[1]["id"])
        return rows, line, "appears twice (first on line 2)"
    if kind == "mixed_task":
        rows[line - 1] = _set(rows[line - 1], "task", "hotpotqa")
        return rows, line, "one task per file"
    raise AssertionError(kind)


KINDS = [
    "deep",
    "nan",
    "inf",
    "unc_negative",
    "unc_huge",
    "logprob_positive",
    "tokens_huge",
    "correct_string",
    "correct_int",
    "tokens_float",
    "tokens_string",
    "round_float",
    "logprob_string",
    "duplicate_id",
    "mixed_task",
]


@pytest.mark.parametrize("kind", KINDS)
def test_validate_and_stats_refuse_with_one_line(kind, sim_traces, tmp_path, capsys):
    rows, line, needle = _hostile(sim_traces, kind)
    f = _write(tmp_path / "bad.jsonl", rows)
    for cmd in (["traces", "validate", str(f)], ["traces", "stats", str(f)]):
        assert main(cmd) != 0
        err = capsys.readouterr().err
        assert f"bad.jsonl:{line}" in err and needle in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "kind", ["deep", "nan", "duplicate_id", "mixed_task", "unc_huge", "correct_string"]
)
def test_evaluate_refuses_through_the_console_script(kind, sim_traces, tmp_path):
    rows, line, needle = _hostile(sim_traces, kind)
    f = _write(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "ev"
    r = subprocess.run(
        [sys.executable, "-m", "ccpo", "evaluate", "--traces", str(f), "--out",
         str(out), "--splits", "2", "--policy", "base"],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0
    assert f"bad.jsonl:{line}" in r.stderr and needle in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (out / "results.json").exists()  # nothing written from a bad file


def test_the_bounds_keep_every_real_trace(tmp_path):
    """The bundled public traces (uncertainty up to 4.23) still validate."""
    f = ROOT / "src" / "ccpo" / "data" / "traces" / "hotpotqa-public.jsonl.gz"
    assert main(["traces", "validate", str(f)]) == 0
