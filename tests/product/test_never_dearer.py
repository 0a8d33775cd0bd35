"""Never dearer than the reference: where the cheap rungs rarely agree with the reference,
``auto`` keeps calling the reference alone (sets and single answers), ``train`` says what a
policy costs against it and warns when it is not cheaper, ``dry-run`` serves it equal to its
replay, and ``check`` names a single answer's threshold λ̂ and never proposes a value
``serve`` refuses. Tables are synthetic (:mod:`ccpo.testing.ladder_table`), not LLM output;
everything user-facing goes through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ccpo.testing.ladder_table import write_ladder_table
from tests.helpers.cli import ccpo_ok

#: cheap models almost never right: a cascade pays every rung before it agrees
HARD = (0.05, 0.05, 0.05, 0.85)


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def hard(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hard")
    table, prices = write_ladder_table(d, 400, 0, labels=False, strengths=HARD)
    out = d / "hard.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "qa", "--family", "mcq",
            "--prices", str(prices), "--out", str(out))  # fmt: skip
    return out


@pytest.mark.parametrize("answer", ["set", "single"])
def test_auto_keeps_the_reference_alone_where_nothing_is_cheaper(hard: Path, answer: str) -> None:
    out = hard.parent / f"auto-{answer}"
    # one answer: without the routed candidates (a router spends the miss budget: below)
    unrouted = ["--no-auto-route"] if answer == "single" else []
    r = ccpo_ok("train", "--traces", str(hard), "--alpha", "0.1", "--answer", answer,
                "--auto-ccpo-steps", "0", "--out", str(out), *unrouted)  # fmt: skip
    flat = _flat(r.stdout)
    assert "always-big-m validation cost" in flat and "← picked" in flat
    assert "fitted always-big-m (auto)" in flat and "big-m answers alone" in flat
    meta = json.loads((out / "policy.json").read_text())
    assert (meta["method"], meta["model"], meta["answer"]) == ("always", "big-m", answer)
    picked = meta["info"]["auto"]
    costs = {k: v["cost_cents_per_question"] for k, v in picked["validation"].items()}
    assert picked["picked"] == "always-big-m" and costs["always-big-m"] < min(
        v for k, v in costs.items() if k != "always-big-m"
    )
    # served: one call of big-m per question, equal to the replay (answers, models, cost)
    dry = ccpo_ok("dry-run", "--policy", str(out), "--traces", str(hard), "--n", "12")
    assert "12/12 answer sets equal the policy's replay; 12 LLM calls" in _flat(dry.stdout)
    # the guarantee says what holds: agreement 1 by construction
    chk = ccpo_ok("check", "--policy", str(out), "--traces", str(hard), "--json")
    got = json.loads(chk.stdout)
    assert got["coverage"] == 1.0 and got["rounds"] == 1.0
    assert got["cost_ratio_to_reference"] == pytest.approx(1.0)


def test_a_routed_pick_is_never_dearer_than_the_reference_and_holds_alpha(hard: Path) -> None:
    """With the routed candidates (``--auto-route``), a router may start a share of the questions
    at a cheap rung, spending the miss budget α allows: its pick is certified, costs no more
    than the reference alone on the calibration questions, and holds α there."""
    out = hard.parent / "auto-routed"
    r = ccpo_ok("train", "--traces", str(hard), "--alpha", "0.1", "--answer", "single",
                "--auto-ccpo-steps", "0", "--auto-route", "--out", str(out))  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    validation = summary["auto"]["validation"]
    assert "router" in validation and "always-big-m" in validation, _flat(r.stdout)
    assert summary["cost_ratio_to_reference"] <= 1.0
    assert summary["calibration_coverage"] >= 0.9


def test_train_says_what_a_policy_costs_against_the_reference_and_warns(hard: Path) -> None:
    r = ccpo_ok("train", "--traces", str(hard), "--alpha", "0.1", "--method", "cstop",
                "--out", str(hard.parent / "cstop"))  # fmt: skip
    flat = _flat(r.stdout + " " + r.stderr)
    assert "on the calibration questions cstop costs " in flat and "% of always-big-m (" in flat
    assert "cstop is not cheaper than calling big-m alone" in flat
    assert "--method auto, which keeps always-big-m" in flat
    assert "saving" not in flat
    summary = json.loads((hard.parent / "cstop" / "summary.json").read_text())
    assert summary["reference"] == "always-big-m" and summary["cost_ratio_to_reference"] > 1


def test_check_of_a_single_answer_names_lambda_and_proposes_no_refused_value(
    tmp_path: Path,
) -> None:
    """Trained where the ladder is right, checked where its last round is mostly wrong (gold
    labels: the cheapest model is right, the last round wrong): nothing is certified there,
    and none is proposed (it used to print κ to restore 2, which serve refuses)."""
    good, prices = write_ladder_table(tmp_path / "good", 400, 0)
    bad, _ = write_ladder_table(tmp_path / "bad", 200, 1, strengths=(0.9, 0.05, 0.05, 0.05))
    for table in (good, bad):
        ccpo_ok("traces", "import", str(table), "--task", "qa", "--family", "mcq",
                "--prices", str(prices), "--out", str(table.with_suffix(".jsonl")))  # fmt: skip
    pol = tmp_path / "pol"
    ccpo_ok("train", "--traces", str(good.with_suffix(".jsonl")), "--alpha", "0.2",
            "--answer", "single", "--method", "cstop", "--out", str(pol))  # fmt: skip
    traffic = str(bad.with_suffix(".jsonl"))
    from tests.helpers.cli import run_ccpo

    human = run_ccpo("check", "--policy", str(pol), "--traces", traffic)
    assert human.returncode == 1, human.stderr
    flat = _flat(human.stdout)
    assert "its own λ̂ = " in flat and "κ" not in flat
    assert "no λ restores 1 − α on this file" in flat and "set kappa:" not in flat
    got = json.loads(run_ccpo("check", "--policy", str(pol), "--traces", traffic, "--json").stdout)
    assert got["kappa_to_restore"] is None and got["threshold_name"] == "λ̂"


def test_auto_s_pick_dearer_once_calibrated_is_not_told_to_use_auto() -> None:
    """auto picks on its training folds; calibrated (a dearer threshold on few calibration
    questions) its pick may cost more than the reference alone: the warning then says so,
    not "train with --method auto", which it was."""
    from ccpo.evaluation.yardstick import Yardstick

    picked = Yardstick("cstop-single", "big-m", 0.011, 0.010, False, True, by_auto=True)
    said = picked.warning()
    assert said is not None and "costs 110% of always-big-m" in said
    assert "auto chose it on its training folds" in said and "--method auto" not in said
    other = Yardstick("cstop-single", "big-m", 0.011, 0.010, False, True)
    assert "train with --method auto, which keeps always-big-m" in (other.warning() or "")
