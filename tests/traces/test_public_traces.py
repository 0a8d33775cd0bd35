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
from ccpo.traces.answers import exact_match
from ccpo.traces.io import read_traces
from ccpo.traces.ladder import ladder_of_trace
from ccpo.traces.prices import load_prices, read_price_file
from ccpo.traces.schema import Trace

TRACES_DIR = Path(ccpo.__file__).parent / "data" / "traces"
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "convert_public_logs.py"
RAW = Path(os.environ.get("CCPO_PUBLIC_DATA", "/work/shared/data"))

# name -> (number of traces, number of rounds, task)
SETS = {"hotpotqa-public": (500, 4, "hotpotqa"), "mmlu-public": (570, 4, "mmlu")}
SCRIPT_OUTPUTS = [
    *(f"{name}.{ext}" for name in SETS for ext in ("jsonl.gz", "prices.json", "stats.json")),
    *(f"{name}.card.md" for name in SETS),
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
    n, t, task = SETS[name]
    path = TRACES_DIR / f"{name}.jsonl.gz"
    assert path.stat().st_size < 2_000_000
    traces = traces_of(name)
    assert len(traces) == n
    assert all(tr.n_rounds == t for tr in traces)
    ids = [tr.id for tr in traces]
    assert len(set(ids)) == n
    assert all(tr.task == task and len(tr.gold) >= 1 for tr in traces)


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
    # the per-round table: 8 columns (the signal table of some cards has 5)
    rows = [
        line for line in card.splitlines() if re.match(r"^\| \d+ \|", line) and line.count("|") == 9
    ]
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
        if m.startswith("llama-2") or m.endswith("@base"):
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
            assert r.base.logprob_mean == r.base.logprob_min  # one score, or none
            # a guide call is paid where it is first made; a repeat of it is free
            assert r.guide.usage.output_tokens >= 1 or r.guide.reused
        # the recorded ladder: agreement verdicts; a repeated call is marked and paid once
        ladder = ladder_of_trace(tr)
        assert {r.verdict for r in ladder.rounds} == {"agree"}
        for t, r in enumerate(tr.rounds, start=1):
            for role in ("base", "guide"):
                step, src = getattr(r, role), ladder.reused(t, role)
                assert step.reused == (src is not None)
                if src is not None:
                    orig = getattr(tr.rounds[src[0] - 1], src[1])
                    assert step.answer == orig.answer and step.usage.input_tokens == 0


def _auc(scores: list[float], labels: list[bool]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def test_mmlu_public_joins_mmlu_and_carries_signal() -> None:
    """The MMLU set's ids and gold come from the MMLU CSVs (57 subjects × the first 10 test
    rows), and its guide uncertainty, verdicts and base log-prob scores say something about
    correctness (AUC well above 0.5: a set to learn from, not noise)."""
    traces = traces_of("mmlu-public")
    subjects = {tr.meta["subject"] for tr in traces}
    assert len(subjects) == 57
    assert all(tr.id == f"mmlu-{tr.meta['subject']}-{tr.id.rsplit('-', 1)[1]}" for tr in traces)
    assert all(int(tr.id.rsplit("-", 1)[1]) < 10 and tr.gold[0] in "ABCD" for tr in traces)
    r1, r2 = ([tr.rounds[t] for tr in traces] for t in (0, 1))
    # a cascade: round 2's base gives round 1's guide answer
    assert all(a.guide.answer == b.base.answer for a, b in zip(r1, r2, strict=True))
    unc = [r for r in r2 if r.guide.uncertainty is not None]
    assert len(unc) >= 560
    assert _auc([-r.guide.uncertainty for r in unc], [r.guide.correct for r in unc]) > 0.7
    for rs in (r1, r2):
        assert _auc([r.guide.verdict == "yes" for r in rs], [r.base.correct for r in rs]) > 0.7
    r3 = [tr.rounds[2] for tr in traces]
    assert all(r.base.logprob_mean is not None and r.base.logprob_mean <= 0 for r in r3)
    assert _auc([r.base.logprob_mean for r in r3], [r.base.correct for r in r3]) > 0.7
    assert all(r.base.logprob_mean is None for tr in traces for r in tr.rounds[:2])
    assert all(
        r.base.logprob_mean is None for tr in traces_of("hotpotqa-public") for r in tr.rounds
    )


def test_mmlu_public_works_with_the_harness() -> None:
    """``ccpo compare``'s split sizes and episodes build from the set with its sidecar prices;
    the base role is free and the guide is paid, so every round costs more than nothing."""
    from ccpo.evaluation.harness import load_episodes, split_sizes

    ep, _ = load_episodes(TRACES_DIR / "mmlu-public.jsonl.gz")
    assert (ep.n, ep.horizon) == (570, 4)
    assert split_sizes(ep.n) == (408, 81, 81)
    # rounds 1-3 pay the guide; round 4's guide is round 3's call (paid once) and its base free
    assert (ep.round_cost[:, :3] > 0).all() and (ep.round_cost[:, 3] == 0).all()
    stats = stats_of("mmlu-public")
    first = ep.correct.any(-1).argmax(-1)
    oracle = ep.round_cost.cumsum(-1)[range(ep.n), first].mean() * 100
    assert oracle == pytest.approx(stats["oracle_cost_cents_per_question"], abs=1e-5)


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
