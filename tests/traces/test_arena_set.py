"""The bundled open-ended set ``arena-public``: it loads with its judged labels, dated prices
and licence, ``scripts/convert_arena.py`` rebuilds it byte for byte when the raw data is at
hand, and ``ccpo reproduce`` runs on it and reports a saving against always calling the
strongest model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ccpo
from ccpo.cli import main
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.traces.io import read_traces
from ccpo.traces.labels import labels_of, rule_labels
from ccpo.traces.prices import read_price_file

TRACES = Path(ccpo.__file__).parent / "data" / "traces"
REPO = Path(__file__).resolve().parents[2]
RAW = Path(os.environ.get("CCPO_PUBLIC_DATA", "/work/shared/data")) / "arena-bench-v1"
# by list price per token, cheapest first
MODELS = ("mistral-7b-instruct-v0.1", "mixtral-8x7b-instruct-v0.1", "gpt-3.5-turbo-1106",
          "claude-instant-1", "gpt-4-1106-preview")  # fmt: skip
SIGNALS = ["similarity", "length", "refusal"]


def test_the_set_loads_with_its_rule_prices_and_licence() -> None:
    path = bundled_sets()["arena-public"]
    assert path.stat().st_size < 1_200_000  # small enough to ship
    traces = read_traces(path)
    assert len(traces) == 291 and {t.n_rounds for t in traces} == {5}  # one model per step
    labels = labels_of(traces)
    assert rule_labels(labels) == {"kind": "scored", "rule": "score>=reference-1",
                                   "reference": "gpt-4-1106-preview"}  # fmt: skip
    assert all(t.solvable for t in traces)  # the reference's own reply meets the rule
    ladder = [r.base.model for r in traces[0].rounds]
    assert tuple(ladder) == MODELS
    assert all(r.guide.reused and r.guide.model == r.base.model for r in traces[0].rounds)
    assert all(t.signals == SIGNALS for t in traces)  # the lexical signals, recorded per round
    assert all(r.signals is not None and r.signals.sim_chars is not None
               for t in traces for r in t.rounds)  # fmt: skip
    for t in traces:  # each label is the rule applied to the kept scores
        ref = t.rounds[-1].guide.model_extra["score"]
        for r in t.rounds:
            for s in (r.base, r.guide):
                assert s.correct == (s.model_extra["score"] >= ref - 1)
    prices = read_price_file(TRACES / "arena-public.prices.json")
    for m in MODELS:
        p = prices.price(m)
        assert p.as_of and re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.as_of) and "https://" in p.source
    assert len({(prices.price(m).input_usd_per_mtok, prices.price(m).output_usd_per_mtok)
                for m in MODELS}) == 5  # fmt: skip
    licence = (TRACES / "licenses" / "arena-hard-auto-Apache-2.0.txt").read_text()
    assert licence.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "arena-public.jsonl.gz" in (TRACES / "NOTICE.md").read_text()


@pytest.mark.skipif(not RAW.is_dir(), reason="arena-bench-v1 not at hand")
def test_the_script_rebuilds_the_set_byte_for_byte(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "convert_arena.py"), str(RAW), "--out",
         str(tmp_path)], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "291 questions (9 left out: a score is missing)" in res.stdout
    for name in ("arena-public.jsonl.gz", "arena-public.prices.json",
                 "licenses/arena-hard-auto-Apache-2.0.txt"):  # fmt: skip
        # digests, not bytes: a mismatch of a 1 MB file must not make pytest diff it
        got, want = (hashlib.sha256((d / name).read_bytes()).digest() for d in (tmp_path, TRACES))
        assert got == want, f"{name}: rebuilt file differs from the bundled one"


def test_reproduce_runs_on_it_and_reports_a_saving(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["reproduce", "--data", "arena-public", "--splits", "3", "--steps", "20",
            "--alpha", "0.2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "arena-public" / "alpha-0.2" / "results.json").read_text())
    rows = {r["policy"]: r for r in results["rows"]}
    always = rows["always-gpt-4-1106-preview"]
    assert always["coverage"] == 1.0  # the reference always meets its own rule
    report = (out / "report.md").read_text()
    assert "of always-gpt-4-1106-preview at acceptance (scores ≥ gpt-4-1106-preview's" in report
