"""The trace sets converted from public LLM run logs (``ccpo/data/traces``).

Checks the shipped files themselves (schema, shape, statistics, card, prices, licences) and,
when the raw logs are at hand, that ``scripts/convert_public_logs.py`` reproduces them
byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ccpo
from ccpo.llm.prices import load_prices, read_price_file
from ccpo.traces.answers import exact_match
from ccpo.traces.io import read_traces
from ccpo.traces.schema import Trace

TRACES_DIR = Path(ccpo.__file__).parent / "data" / "traces"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "convert_public_logs.py"
RAW = Path(os.environ.get("CCPO_PUBLIC_DATA", "/work/shared/data"))

# name -> (number of traces, number of rounds)
SETS = {"hotpotqa-public": (500, 4)}
SCRIPT_OUTPUTS = [
    "hotpotqa-public.jsonl.gz",
    "hotpotqa-public.prices.json",
    "hotpotqa-public.stats.json",
    "hotpotqa-public.card.md",
    "licenses/FireAct-MIT.txt",
    "licenses/UALA-MIT.txt",
    "licenses/UALA-fork-MIT.txt",
    "licenses/ReAct-MIT.txt",
]

_cache: dict[str, list[Trace]] = {}


def traces_of(name: str) -> list[Trace]:
    if name not in _cache:
        _cache[name] = read_traces(TRACES_DIR / f"{name}.jsonl.gz")
    return _cache[name]


def stats_of(name: str) -> dict:
    return json.loads((TRACES_DIR / f"{name}.stats.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(SETS))
def test_shipped_set_validates_and_has_expected_shape(name: str) -> None:
    n, t = SETS[name]
    path = TRACES_DIR / f"{name}.jsonl.gz"
    assert path.stat().st_size < 2_000_000
    traces = traces_of(name)
    assert len(traces) == n
    assert all(tr.n_rounds == t for tr in traces)
    ids = [tr.id for tr in traces]
    assert len(set(ids)) == n
    assert all(tr.task == "hotpotqa" and len(tr.gold) >= 1 for tr in traces)


@pytest.mark.parametrize("name", sorted(SETS))
def test_stats_file_matches_traces(name: str) -> None:
    traces, stats = traces_of(name), stats_of(name)
    n = len(traces)
    assert stats["n_traces"] == n
    assert stats["n_rounds"] == SETS[name][1]
    for i, row in enumerate(stats["rounds"]):
        rs = [tr.rounds[i] for tr in traces]
        assert row["round"] == i + 1
        assert row["base_correct"] == sum(r.base.correct for r in rs)
        assert row["guide_correct"] == sum(r.guide.correct for r in rs)
        assert row["base_accuracy"] == pytest.approx(row["base_correct"] / n, abs=5e-5)
        assert row["guide_accuracy"] == pytest.approx(row["guide_correct"] / n, abs=5e-5)
        assert row["verdict_yes"] == sum(r.guide.verdict == "yes" for r in rs)
        assert row["base_model"] == sorted({r.base.model for r in rs})
    assert stats["solvable"] == sum(tr.solvable for tr in traces)


@pytest.mark.parametrize("name", sorted(SETS))
def test_card_table_matches_stats(name: str) -> None:
    card = (TRACES_DIR / f"{name}.card.md").read_text(encoding="utf-8")
    stats = stats_of(name)
    n = stats["n_traces"]
    rows = [line for line in card.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == stats["n_rounds"]
    for line, row in zip(rows, stats["rounds"], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert int(cells[0]) == row["round"]
        base = re.fullmatch(r"([0-9.]+) \((\d+)/(\d+)\)", cells[3])
        guide = re.fullmatch(r"([0-9.]+) \((\d+)/(\d+)\)", cells[5])
        assert base and guide, line
        assert (int(base[2]), int(base[3])) == (row["base_correct"], n)
        assert (int(guide[2]), int(guide[3])) == (row["guide_correct"], n)
        assert float(base[1]) == pytest.approx(row["base_accuracy"], abs=5e-5)
        assert float(guide[1]) == pytest.approx(row["guide_accuracy"], abs=5e-5)
    m = re.search(r"Solvable rate[^*]*\*\*([0-9.]+) \((\d+)/(\d+)\)\*\*", card)
    assert m, "card states the solvable rate"
    assert (int(m[2]), int(m[3])) == (stats["solvable"], n)


@pytest.mark.parametrize("name", sorted(SETS))
def test_sidecar_prices_cover_every_model(name: str) -> None:
    sidecar = TRACES_DIR / f"{name}.prices.json"
    models = set().union(*(tr.models() for tr in traces_of(name)))
    read_price_file(sidecar).check(models)  # the sidecar alone prices every model
    table = load_prices(sidecar)  # and it merges over the bundled table
    for m in models:
        p = table.price(m)
        if m.startswith("llama-2"):
            assert (p.input_usd_per_mtok, p.output_usd_per_mtok) == (0.0, 0.0)
        else:  # the guide, at the GPT-4o list price as in the paper
            assert (p.input_usd_per_mtok, p.output_usd_per_mtok) == (2.5, 10.0)


@pytest.mark.parametrize("name", sorted(SETS))
def test_rounds_are_internally_consistent(name: str) -> None:
    for tr in traces_of(name):
        for r in tr.rounds:
            assert r.base.correct == exact_match(r.base.answer, tr.gold, tr.task)
            assert r.guide.correct == exact_match(r.guide.answer, tr.gold, tr.task)
            agree = exact_match(r.guide.answer, [r.base.answer], tr.task)
            assert r.guide.verdict == ("yes" if agree else "no")
            assert "reward =" not in r.base.reasoning  # no gold leak from the environment
            assert len(r.base.reasoning) <= 1500 + len("[…] ")
            assert r.base.logprob_mean is None and r.base.logprob_min is None
            assert r.guide.usage.output_tokens >= 1


def test_notice_and_licences_are_shipped() -> None:
    notice = (TRACES_DIR / "NOTICE.md").read_text(encoding="utf-8")
    assert "CC BY-SA 4.0" in notice and "MIT" in notice
    lic = TRACES_DIR / "licenses"
    for f in ["FireAct-MIT.txt", "UALA-MIT.txt", "UALA-fork-MIT.txt", "ReAct-MIT.txt"]:
        assert "MIT License" in (lic / f).read_text(encoding="utf-8")
    assert "by-sa/4.0" in (lic / "CC-BY-SA-4.0.md").read_text(encoding="utf-8")


@pytest.mark.skipif(not (RAW / "public-logs").is_dir(), reason="raw public logs not available")
@pytest.mark.skipif(not SCRIPT.is_file(), reason="conversion script not in this checkout")
def test_script_reproduces_shipped_files_byte_for_byte(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--logs",
        str(RAW / "public-logs"),
        "--hotpotqa",
        str(RAW / "hotpotqa" / "hotpot_dev_v1_simplified.json"),
        "--mmlu",
        str(RAW / "mmlu"),
        "--out",
        str(tmp_path),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    for rel in SCRIPT_OUTPUTS:
        new, shipped = (tmp_path / rel).read_bytes(), (TRACES_DIR / rel).read_bytes()
        assert new == shipped, f"{rel} differs from the shipped file; re-run the script"
