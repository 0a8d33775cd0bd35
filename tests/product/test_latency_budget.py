"""``train --latency-budget``: the policy's mean estimated latency per question must stay
within it. ``auto`` keeps the cheapest candidate within the budget (sets and single answers),
refuses when none is, a named method over it is refused without moving its threshold, and
``check`` reports the latency against the recorded budget. Tables are synthetic
(:mod:`ccpo.testing.ladder_table`), not LLM output. Usage errors go through the real entry point
(a subprocess); the commands that succeed run the console script's function in this process
(``tests.helpers.cli.ccpo_in``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ccpo.testing.ladder_table import write_ladder_table
from tests.helpers.cli import assert_usage_error, ccpo_in, ccpo_ok, run_ccpo
from tests.helpers.routing import imported_ladder


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def ladder(tmp_path_factory) -> Path:
    """The 4-model import without labels (agreement with big-m), 200 questions."""
    return imported_ladder(tmp_path_factory.mktemp("ladder"), n=200)[0]


@pytest.fixture(scope="module")
def cstop_free(ladder: Path) -> Path:
    """``cstop`` (single answer) trained on the ladder without a budget."""
    out = ladder.parent / "cstop-free"
    ok = _train(ladder, out, "--answer", "single", "--method", "cstop")
    assert ok.returncode == 0, ok.stderr
    return out


def _train(traces: Path, out: Path, *args: str, run=ccpo_in):
    """``ccpo train`` at α = 0.2, auto without its CCPO candidate; in this process, or through
    ``run`` (:func:`~tests.helpers.cli.run_ccpo`: the console script, for usage errors)."""
    return run("train", "--traces", str(traces), "--alpha", "0.2", "--auto-ccpo-steps", "0",
               "--out", str(out), *args)  # fmt: skip


def _auto(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["auto"]


@pytest.mark.parametrize("answer", ["set", "single"])
def test_auto_keeps_the_cheapest_candidate_within_the_budget(ladder: Path, answer: str) -> None:
    free = _train(ladder, ladder.parent / f"free-{answer}", "--answer", answer)
    assert free.returncode == 0, free.stderr
    got = _auto(ladder.parent / f"free-{answer}")
    lat = {k: v["latency_s_per_question"] for k, v in got["validation"].items()}
    assert "latency" not in free.stdout  # as before: no budget, no latency column
    assert lat[got["picked"]] > min(lat.values())  # a faster candidate exists
    budget = round((lat[got["picked"]] + min(lat.values())) / 2, 3)
    out = ladder.parent / f"held-{answer}"
    r = _train(ladder, out, "--answer", answer, "--latency-budget", str(budget))
    assert r.returncode == 0, r.stderr
    held = _auto(out)
    assert held["picked"] != got["picked"] and held["latency_budget_s"] == budget
    within = [k for k in lat if lat[k] <= budget]
    costs = {k: v["cost_cents_per_question"] for k, v in held["validation"].items()}
    assert held["picked"] == min(within, key=costs.__getitem__)  # the cheapest eligible
    row = rf"{got['picked']} validation cost \S+¢/question, coverage \S+, latency \S+ s "
    assert re.search(row + "over the latency budget", _flat(r.stdout))  # marked, not eligible
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calibration_latency_s"] <= budget
    assert summary["latency_budget_s"] == budget
    meta = json.loads((out / "policy.json").read_text())
    assert meta["provenance"]["latency_budget_s"] == budget
    assert "per question (budget" in _flat(r.stdout) and "): holds" in _flat(r.stdout)


def test_an_impossible_budget_is_refused_naming_the_least_latency(ladder: Path) -> None:
    out = ladder.parent / "impossible"
    r = _train(ladder, out, "--answer", "single", "--latency-budget", "0.3", run=run_ccpo)
    err = assert_usage_error(r, "no candidate meets --latency-budget 0.3 s",
                             "the least validation latency is", "(always-big-m)",
                             "use a larger --latency-budget")  # fmt: skip
    assert "s per question" in err
    assert not out.exists()


def test_a_named_method_over_the_budget_is_refused_not_moved(
    ladder: Path, cstop_free: Path
) -> None:
    out = ladder.parent / "cstop-over"
    free = json.loads((cstop_free / "summary.json").read_text())
    latency = free["calibration_latency_s"]
    budget = round(latency * 0.8, 3)
    r = _train(ladder, out, "--answer", "single", "--method", "cstop",
               "--latency-budget", str(budget), run=run_ccpo)  # fmt: skip
    assert_usage_error(r, f"cstop-single takes {latency:.2f} s per question",
                       "on the calibration questions", f"over --latency-budget {budget:g} s;",
                       "nothing written", "not moved to meet a budget")  # fmt: skip
    assert not out.exists()
    within = _train(ladder, out, "--answer", "single", "--method", "cstop",
                    "--latency-budget", str(round(latency * 1.2, 3)))  # fmt: skip
    assert within.returncode == 0, within.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["threshold"] == free["threshold"]  # the budget never moves λ̂


@pytest.mark.parametrize("bad", ["0", "-1", "inf"])
def test_a_budget_that_is_not_a_positive_number_is_a_usage_error(tmp_path, bad: str) -> None:
    r = _train(tmp_path / "missing.jsonl", tmp_path / "pol", "--latency-budget", bad, run=run_ccpo)
    assert_usage_error(r, "--latency-budget must be a number of seconds > 0")


def test_check_reports_the_latency_against_the_recorded_budget(
    ladder: Path, cstop_free: Path, tmp_path
) -> None:
    """Trained within its budget on the ladder, checked there (holds) and on traffic where the
    cheap models rarely agree with big-m, so more rounds run (exceeds); a policy trained
    without a budget prints no such line."""
    table, prices = write_ladder_table(tmp_path, 60, 1, labels=False,
                                       strengths=(0.05, 0.05, 0.05, 0.85))  # fmt: skip
    hard = tmp_path / "hard.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "medqa", "--family", "mcq",
            "--prices", str(prices), "--out", str(hard), "--steps", "pair")  # fmt: skip
    pol = tmp_path / "pol"
    # Learn-then-Test's λ̂: on the hard traffic it runs past the budget
    ok = _train(ladder, pol, "--answer", "single", "--method", "cstop", "--guarantee", "pac",
                "--latency-budget", "1.6")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    here = ccpo_in("check", "--policy", str(pol), "--traces", str(ladder))
    line = [x for x in here.stdout.splitlines() if x.startswith("latency ")]
    assert len(line) == 1 and line[0].endswith("per question (budget 1.6 s): holds"), here.stdout
    there = _flat(ccpo_in("check", "--policy", str(pol), "--traces", str(hard)).stdout)
    got = re.search(r"latency (\S+) s per question \(budget 1.6 s\): exceeds", there)
    assert got and float(got.group(1)) > 1.6, there
    before = ccpo_in("check", "--policy", str(cstop_free), "--traces", str(ladder))
    assert before.returncode == 0 and "budget" not in before.stdout


def test_a_routed_auto_held_to_the_reference_alone_is_written_unrouted(ladder: Path) -> None:
    """Only always-big-m is fast enough: with --route, auto keeps it (one model alone has no
    rung to skip) instead of refusing to route it."""
    out = ladder.parent / "routed"
    # without auto's routed candidates (a router alone is one call too: it can fit)
    r = _train(ladder, out, "--answer", "single", "--route", "--latency-budget", "0.9",
               "--no-auto-route")  # fmt: skip
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "policy.json").read_text())
    assert (meta["method"], meta["model"]) == ("always", "big-m") and "route" not in meta
    summary = json.loads((out / "summary.json").read_text())
    assert summary["calibration_latency_s"] <= 0.9 and "route_tau" not in summary
