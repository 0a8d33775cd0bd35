"""Routing by question embeddings live: ``ccpo traces embed`` records them from a scripted
``/embeddings`` endpoint on 127.0.0.1; served, the router asks that endpoint once per
question and starts where the embedded router says; an endpoint that fails, is slower than
``route_embedding_timeout`` or answers NaN or Infinity never blocks an answer: the question
is routed by its text alone (the fallback router), counted in the agent and in
``/metrics``; against the trace file's own replay endpoint (which serves the recorded
embeddings) the dry run equals the replay."""

from __future__ import annotations

import httpx
import pytest

from ccpo.evaluation.dry_run import dry_run
from ccpo.policies.registry import load_policy
from ccpo.runtime.agent import ConformalAgent
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok, run_ccpo
from tests.helpers.routing import EMBED_MODEL, difficulty_embedder, imported_ladder, routed_policy
from tests.helpers.serve import LiveServer, post

N_ASKED = 20


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    d = tmp_path_factory.mktemp("route-emb")
    traces, prices = imported_ladder(d, n=300, seed=3)
    embed = difficulty_embedder(traces)
    out = d / "embedded.jsonl"
    with ScriptedServer(embed=embed) as srv:
        res = ccpo_ok("traces", "embed", str(traces), "--out", str(out), "--embedding-model",
                      EMBED_MODEL, "--embedding-url", srv.url, "--batch", "64",
                      "--quiet")  # fmt: skip
        assert srv.n_embeddings == 5  # 300 questions, 64 a call
    assert f"embedding by {EMBED_MODEL} (8 numbers)" in " ".join(res.stdout.split())
    folder = routed_policy(d / "policy", out, prices, tau=0.6, embeddings=True)
    return out, prices, folder, embed


def _agent_values(prices, url: str, **extra) -> dict:
    return {"endpoints": {"*": {"url": url}}, "prices": [str(prices)], "timeout": 5.0, **extra}


def test_traces_record_each_questions_embedding(embedded) -> None:
    out, _, _, embed = embedded
    for tr in read_traces(out)[:20]:
        assert tr.question_embedding.model == EMBED_MODEL
        assert tr.question_embedding.vector == [round(x, 6) for x in embed(tr.question)]


def test_the_router_reads_the_embedding_and_falls_back_without_blocking(embedded) -> None:
    traces, prices, folder, embed = embedded
    pol = load_policy(folder)
    asked = read_traces(traces)[:N_ASKED]
    cases = {  # endpoint behaviour → whether the embedded router decides
        "answers": (dict(embed=embed), {}, True),
        "fails": (dict(), {}, False),  # no /embeddings: 404
        "slow": (dict(embed=embed, embed_latency=0.5), {"route_embedding_timeout": 0.1}, False),
        "NaN": (dict(embed=lambda q: [float("nan"), *embed(q)[1:]]), {}, False),
        "Infinity": (dict(embed=lambda q: [*embed(q)[:-1], float("inf")]), {}, False),
    }
    differ = 0
    for name, (server_kw, cfg, used) in cases.items():
        with ScriptedServer(fallback="Answer: A", **server_kw) as srv:
            values = _agent_values(prices, srv.url, **cfg)
            with ConformalAgent.from_artifact(folder, values) as agent:
                for tr in asked:
                    got = agent.answer(tr.question, id=tr.id)
                    vec = tr.question_embedding.vector if used else None
                    assert got.log[0].round == pol.start_rung(tr.question, vec) + 1, name
                    differ += pol.start_rung(tr.question, tr.question_embedding.vector) != (
                        pol.start_rung(tr.question)
                    )
                assert agent.route_embeddings == N_ASKED, name
                assert agent.route_fallbacks == (0 if used else N_ASKED), name
    assert differ > 0  # the two routers disagree somewhere: the check above can fail


def test_serve_counts_fallbacks_in_metrics(embedded) -> None:
    from ccpo.runtime.config import load_deploy_config
    from ccpo.runtime.server import Service

    traces, prices, folder, _ = embedded
    with ScriptedServer(fallback="Answer: A") as srv:  # no /embeddings at all
        values = _agent_values(prices, srv.url, server={"state": None})
        service = Service.from_artifact(folder, load_deploy_config(None, values))
        with LiveServer(service) as live:
            for tr in read_traces(traces)[:5]:
                msgs = [{"role": "user", "content": tr.question}]
                r = post(live.url, "/v1/chat/completions", {"model": "ccpo", "messages": msgs})
                assert r.status_code == 200, r.text
            m = httpx.get(live.url + "/metrics.json", timeout=30).json()
    assert m["route_embeddings"] == 5 and m["route_fallbacks"] == 5


def test_dry_run_against_the_replay_serves_the_recorded_embeddings(embedded) -> None:
    traces, prices, folder, _ = embedded
    report = dry_run(folder, traces, {"prices": [str(prices)]}, n=100)
    assert report.ok, report.differences[:3]


def test_a_failing_embeddings_endpoint_writes_nothing(embedded, tmp_path) -> None:
    traces = embedded[0]
    out = tmp_path / "never.jsonl"
    with ScriptedServer() as srv:  # no /embeddings: 404 twice
        res = run_ccpo("traces", "embed", str(traces), "--out", str(out), "--embedding-model",
                       EMBED_MODEL, "--embedding-url", srv.url, "--quiet")  # fmt: skip
    assert res.returncode != 0 and "failed twice" in res.stderr and "nothing written" in res.stderr
    assert not out.exists()
