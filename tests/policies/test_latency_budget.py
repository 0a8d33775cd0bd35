"""A latency budget as ``auto`` uses it: which candidates are eligible, which one wins, what
the refusals say, and ``cross_fit`` recording each candidate's validation latency. Pure
functions and small synthetic episodes (:mod:`ccpo.testing.ladder_table`), not LLM output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ccpo.errors import CCPOError
from ccpo.policies.budget import (
    COST,
    LATENCY,
    OverBudget,
    budget_line,
    check_budget,
    check_budget_value,
    eligible,
    pick,
)
from ccpo.policies.registry import fit_policy
from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.episodes import build_episodes
from ccpo.traces.importer import import_table
from ccpo.traces.prices import load_prices


def _fig(cost: float, latency: float) -> dict[str, float]:
    return {COST: cost, "coverage": 0.9, LATENCY: latency}


#: cheap and slow, dear and fast, a tie in cost with the first, one that was refused
FIGURES = {
    "slow": _fig(1.0, 3.0),
    "fast": _fig(5.0, 1.0),
    "also-slow": _fig(1.0, 2.5),
    "refused": {COST: math.inf, "coverage": math.nan, LATENCY: math.nan},
}


def test_without_a_budget_every_candidate_is_eligible_and_the_cheapest_wins() -> None:
    assert eligible(FIGURES, None) == list(FIGURES)
    assert pick(FIGURES) == "slow"  # the tie in cost goes to the earlier candidate


def test_a_budget_keeps_the_cheapest_candidate_within_it() -> None:
    assert eligible(FIGURES, 2.5) == ["fast", "also-slow"]  # ≤ the budget; nan never
    assert pick(FIGURES, 2.5) == "also-slow"
    assert pick(FIGURES, 2.0) == "fast"
    assert pick(FIGURES, 3.0) == "slow"


def test_no_eligible_candidate_names_the_least_latency_and_the_remedy() -> None:
    with pytest.raises(OverBudget) as e:
        pick(FIGURES, 0.5)
    msg = str(e.value)
    assert "no candidate meets --latency-budget 0.5 s" in msg
    assert "the least validation latency is 1.00 s per question (fast)" in msg
    assert "use a larger --latency-budget (at least 1)" in msg
    unknown = {"a": {COST: 1.0, "coverage": 1.0}}  # traces without a latency estimate
    with pytest.raises(OverBudget, match="no latency estimate"):
        pick(unknown, 1.0)
    assert pick(unknown, None) == "a"


def test_a_calibrated_policy_over_the_budget_is_refused_with_both_numbers() -> None:
    check_budget(2.0, 2.0, "cstop-single")  # equal is within
    check_budget(9.0, None, "cstop-single")
    with pytest.raises(OverBudget) as e:
        check_budget(2.345, 2.0, "cstop-single")
    msg = str(e.value)
    assert "cstop-single takes 2.35 s per question" in msg and "--latency-budget 2.0 s" in msg
    assert "not moved to meet a budget" in msg and "--method auto" in msg
    with pytest.raises(OverBudget, match="auto chose it within the budget"):
        check_budget(2.345, 2.0, "cstop-single", auto=True)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_the_budget_is_a_positive_number_of_seconds(bad: float) -> None:
    with pytest.raises(CCPOError, match="--latency-budget must be a number of seconds > 0"):
        check_budget_value(bad)
    check_budget_value(None)
    check_budget_value(0.25)


def test_the_report_line_says_holds_or_exceeds() -> None:
    assert budget_line(3.2, 4.0) == "latency 3.20 s per question (budget 4.0 s): holds"
    assert budget_line(4.01, 4.0) == "latency 4.01 s per question (budget 4.0 s): exceeds"
    assert budget_line(1.0, 1.25).endswith("(budget 1.25 s): holds")


def test_cross_fit_records_each_candidates_latency_and_respects_the_budget(
    tmp_path,
) -> None:
    """On the 4-model import without labels, auto's single-answer candidates each get a
    validation latency (always-big-m's is big-m's own call); a budget between the cheapest
    candidate's latency and the least one moves the pick to a faster candidate."""
    table, prices_path = write_ladder_table(tmp_path, 200, 0, labels=False)
    prices = load_prices(prices_path)
    traces, _ = import_table(table, "qa", prices, family="mcq")
    ep = build_episodes(traces, prices)
    idx = np.arange(140)
    routes = {"auto_route": True}
    free = fit_policy("auto", ep, idx, 0.2, 0, single=True, settings=routes).info["auto"]
    lat = {k: v[LATENCY] for k, v in free["validation"].items()}
    routed = {k for k in lat if k.endswith("+route")}  # the cheapest cascade behind the router
    assert set(lat) == {"cstop", "cstop-lr", "depth-k", "always-big-m", "router", *routed}
    assert len(routed) == 1 and all(math.isfinite(lat[k]) for k in lat)
    assert lat["always-big-m"] == pytest.approx(float(ep.strongest_latency[idx].mean()))
    assert lat[free["picked"]] > min(lat.values()) and "latency_budget_s" not in free
    budget = (lat[free["picked"]] + min(lat.values())) / 2
    held = fit_policy("auto", ep, idx, 0.2, 0, single=True, latency_budget=budget,
                      settings=routes).info["auto"]  # fmt: skip
    assert held["picked"] != free["picked"] and held["latency_budget_s"] == budget
    assert held["validation"][held["picked"]][LATENCY] <= budget
    assert held["validation"] == free["validation"]  # the same figures, another choice
