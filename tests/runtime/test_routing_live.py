"""Routing live: a rung the router skips is never called (a scripted server on 127.0.0.1
counts every request by model), the rung it starts at is, and against the trace file's own
replay endpoint the served answers, models paid and cost equal the replay's with routing in
play (a skipped call that a later step repeats is asked and paid there, in both)."""

from __future__ import annotations

from collections import Counter

import pytest

from ccpo.api import ConformalPolicy
from ccpo.evaluation.dry_run import dry_run
from ccpo.policies.registry import load_policy
from ccpo.runtime.agent import ConformalAgent
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces
from ccpo.traces.ladder import Ladder
from tests.helpers.routing import imported_ladder, routed_policy


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    d = tmp_path_factory.mktemp("route")
    traces, prices = imported_ladder(d)
    return traces, prices, routed_policy(d / "policy", traces, prices, tau=0.6)


def test_a_skipped_rung_is_never_called(routed) -> None:
    traces, prices, folder = routed
    pol = load_policy(folder)
    ladder = Ladder.from_dict(pol.provenance["ladder"])
    values = {"endpoints": {"*": {"url": "URL"}}, "prices": [str(prices)], "timeout": 5.0}
    starts: Counter[int] = Counter()
    with ScriptedServer(fallback="Answer: A") as srv:
        values["endpoints"]["*"]["url"] = srv.url
        with ConformalAgent.from_artifact(folder, values) as agent:
            for tr in read_traces(traces)[:60]:
                srv.reset_counters()
                got = agent.answer(tr.question, id=tr.id)
                start = pol.start_rung(tr.question)
                run = {m for r in ladder.rounds[start:] for m in (r.base.model, r.guide.model)}
                skipped = {m for r in ladder.rounds[:start] for m in (r.base.model, r.guide.model)}
                called = Counter(req["model"] for req in srv.requests)
                assert not set(called) & (skipped - run), (tr.id, start, called)
                # the start rung's base repeats a skipped call: it is asked, once
                assert called[ladder.rounds[start].base.model] >= 1
                assert got.log[0].round == start + 1
                assert sum(called.values()) == sum(len(lg.models) for lg in got.log)
                starts[start] += 1
    assert starts[0] and starts[1] + starts[2] >= 20, starts  # routing is in play


def test_dry_run_with_routing_equals_the_replay(routed) -> None:
    traces, prices, folder = routed
    report = dry_run(folder, traces, {"prices": [str(prices)]})
    assert report.ok, report.differences[:3]
    assert report.live_cost_usd == pytest.approx(report.replay_cost_usd, rel=0, abs=1e-12)
    replay = ConformalPolicy.load(folder)
    later = [p for p in replay.predict_set(read_traces(traces)) if p.first_round > 1]
    assert len(later) >= 50
