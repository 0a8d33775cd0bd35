"""Every start's view of a trace set: started at round 1 it is the trace set as always (the
observations and costs of unrouted policies do not move); started later, the repeat of a
skipped call is paid at its original's usage, the skipped rounds cost nothing and read as
blanks; a judge ladder has no views (it cannot be routed)."""

from __future__ import annotations

import numpy as np

from ccpo.evaluation.harness import load_episodes
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices
from ccpo.traces.routing import BLANK_ROUND, paid_steps
from tests.helpers.routing import imported_ladder


def test_round_one_is_the_trace_set_as_always() -> None:
    path = bundled_sets()["hotpotqa-public"]
    ep = build_episodes(
        read_traces(path), load_prices(path.with_name("hotpotqa-public.prices.json"))
    )
    assert ep.routes is not None
    assert np.array_equal(ep.routes.obs[0], ep.obs)
    assert np.array_equal(ep.routes.cost[0], ep.round_cost)


def test_a_ladder_with_signals_routes_on_the_columns_it_is_served_on() -> None:
    """The bundled arena set's ladder names signals (similarity, length, refusal): a routed
    view started at round 1 is the episodes' own observations, signal columns included, the
    columns the live agent computes (a router fitted without them could not be served)."""
    path = bundled_sets()["arena-public"]
    traces = read_traces(path)
    assert traces[0].signals  # the case: a ladder with signals
    ep = build_episodes(traces, load_prices(path.with_name("arena-public.prices.json")))
    assert ep.routes is not None
    assert ep.routes.obs.shape[-1] == ep.obs.shape[-1] == len(ep.feature_spec["names"])
    assert np.array_equal(ep.routes.obs[0], ep.obs)


def test_a_later_start_pays_the_skipped_call_once(tmp_path) -> None:
    traces, prices = imported_ladder(tmp_path, n=20)
    ep, table = load_episodes(traces, [str(prices)])
    trs = read_traces(traces)
    for i, tr in enumerate(trs):
        first_guide = table.usage_cost(tr.rounds[0].guide.model, tr.rounds[0].guide.usage)
        assert tr.rounds[1].base.reused and tr.rounds[1].base.model == tr.rounds[0].guide.model
        assert ep.routes.cost[1, i, 0] == 0.0
        assert ep.routes.cost[1, i, 1] == ep.round_cost[i, 1] + first_guide
        assert ep.routes.cost[1, i, 2] == ep.round_cost[i, 2]  # round 3's repeat is of round 2
        assert [m for m, _ in paid_steps(tr, 1)[0]] == ["small-m", "mid-m"]
    assert not np.array_equal(ep.routes.obs[1, :, 1], ep.obs[:, 1])  # round 1 reads blank
    assert BLANK_ROUND.base.answer == "" and BLANK_ROUND.guide.verdict is None


def test_a_judge_ladder_has_no_views() -> None:
    from ccpo.traces.sim import SimConfig, generate

    assert build_episodes(generate(SimConfig(n=10, seed=0)), load_prices()).routes is None
