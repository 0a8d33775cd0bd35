"""``always-<reference>`` as a candidate of ``auto``: against gold labels it is eligible only
where its accuracy passes the binomial test at δ (here it does not, so it is not kept),
its calibration refuses an α it cannot certify, and its replay pays exactly one call.
Synthetic tables (:mod:`ccpo.testing.ladder_table`), not LLM output."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.learning.config import StopConfig
from ccpo.policies.reference import ReferencePolicy, reference_validator
from ccpo.policies.registry import fit_policy
from ccpo.policies.single import Unreachable
from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.episodes import build_episodes
from ccpo.traces.importer import import_table
from ccpo.traces.prices import load_prices

#: the dearest model is wrong where cheaper ones are right: it misses answerable questions
WEAK_TOP = (0.6, 0.6, 0.6, 0.5)


@pytest.fixture(scope="module")
def gold(tmp_path_factory):
    """Gold labels; big-m, the dearest, is no better than the others."""
    table, prices_path = write_ladder_table(
        tmp_path_factory.mktemp("g"), 400, 0, strengths=WEAK_TOP
    )
    prices = load_prices(prices_path)
    traces, _ = import_table(table, "qa", prices, family="mcq")
    return build_episodes(traces, prices)


def test_against_gold_labels_it_is_not_kept_below_the_target(gold) -> None:
    idx = np.arange(200)
    accuracy = 1 - float((~gold.strongest_correct & gold.solvable)[idx].mean())
    assert gold.strongest == "big-m" and accuracy < 0.9  # it would miss α = 0.1
    cost, _ = reference_validator(0.1)(gold.subset(idx))
    assert cost == float("inf")
    for pol in (
        fit_policy("auto", gold, idx, 0.1, 0, settings={"auto_ccpo_steps": 0}),
        fit_policy("auto", gold, idx, 0.1, 0, single=True),
    ):
        assert pol.info["auto"]["picked"] != "always-big-m"
        assert pol.start_rung("q") == 0 and pol.round_roles(1) == ("base", "guide")
    with pytest.raises(Unreachable, match="certify only α ≥"):
        ReferencePolicy.fit(gold, "single", StopConfig(alpha=0.1)).calibrate(gold, idx)


def test_its_replay_pays_one_call_and_returns_that_answer(gold) -> None:
    pol = ReferencePolicy.fit(gold, "set", StopConfig(alpha=0.5))
    pol.calibrate(gold)
    m = pol.rollout(gold, pol.scores(gold.obs), 1.0)
    assert np.array_equal(m.cost, gold.strongest_cost) and (m.length == 1).all()
    assert (gold.strongest_cost < gold.round_cost.sum(-1)).all()  # it skips every rung
    reach, included = pol.replay_answers(gold)
    t, role = pol.step
    assert pol.start_rung("q") == t - 1 and pol.round_roles(t) == (role,)  # live: one step
    assert (reach.sum(-1) == 1).all() and reach[:, t - 1].all()
    assert included[:, t - 1, 1 if role == "guide" else 0].all() and included.sum() == gold.n
    assert "P(wrong on a question some round can answer) ≤ 0.5" in pol.guarantee_statement()
