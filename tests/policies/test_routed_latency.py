"""A routed question's estimated latency counts the rounds it runs, as the live agent runs
them: nothing for skipped rounds, the start round's two calls at once (its base, the skipped
round's guide, is called there), then one new call per round (the base repeats the last
guide). Recomputed here from the traces' own token counts."""

from __future__ import annotations

import numpy as np

from ccpo.evaluation.harness import load_episodes, with_latency
from ccpo.policies.registry import fit_policy
from ccpo.policies.routing.single import TAUS, routed_outcomes
from ccpo.traces.io import read_traces
from ccpo.traces.latency import call_seconds
from tests.helpers.routing import imported_ladder


def _expected(tr, start: int, stop: int) -> float:
    out = 0.0
    for t in range(start, stop + 1):
        r = tr.rounds[t]
        guide = call_seconds(r.guide.usage.output_tokens)
        if t == start:  # the base is called here: round 1's own, else the skipped guide's
            base = r.base if t == 0 else tr.rounds[t - 1].guide
            out += max(call_seconds(base.usage.output_tokens), guide)
        else:
            out += guide
    return out


def test_a_routed_question_counts_the_rounds_it_runs(tmp_path) -> None:
    traces, prices = imported_ladder(tmp_path, n=60)
    ep, _ = load_episodes(traces, [str(prices)])
    trs = read_traces(traces)
    pol = fit_policy("cstop-lr", ep, np.arange(30), 0.3, 0, single=True, routed=True)
    sc = pol.episode_scores(ep)
    started_late = 0
    for tau in TAUS:
        for lam in (0.0, 0.5, 2.0):
            s, stop, m = routed_outcomes(ep, sc, tau, lam)
            started_late += int((s > 0).sum())
            want = [_expected(tr, int(s[i]), int(stop[i])) for i, tr in enumerate(trs)]
            assert np.allclose(m.latency, want), (tau, lam)
            # the harness keeps a row's own latency instead of summing rounds 1..length
            idx = np.arange(ep.n)
            assert np.array_equal(with_latency(ep, m, idx).latency, m.latency)
    assert started_late > 0  # routing was in play
