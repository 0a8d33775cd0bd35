"""A ladder's signals at collect and serve time, over real HTTP on 127.0.0.1: the collector
records them in every round (the verdict prompt sent, embeddings asked), a failing or slow
embeddings endpoint falls back to lexical similarity and is counted, and rounds run live
against ``ccpo replay-server`` give the very observations the stored traces give."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from ccpo.llm.client import LLMClient
from ccpo.llm.collect import collect
from ccpo.llm.prompts import FREE_VERDICT_VERSION, free_verdict_messages
from ccpo.llm.protocol import live_round, make_runner, run_base_guide, run_round
from ccpo.llm.run import select_questions
from ccpo.testing.scripted_server import prompt_text
from ccpo.traces.featurize import feature_spec, featurize_rounds, featurize_trace
from ccpo.traces.io import read_traces
from ccpo.traces.ladder import ladder_of
from ccpo.traces.prices import load_prices
from ccpo.traces.similarity import char_ngram_cosine, cosine, word_jaccard
from tests.helpers import freetext
from tests.helpers.cli import start_server, stop_server


def _collect(tmp: Path, **kw) -> list:
    with freetext.world(embed=freetext.embed) as srv:
        cfg = freetext.config(srv, tmp, **kw)
        s = collect(cfg, progress=False)
        assert s.complete and not s.failed
        return read_traces(Path(cfg.out)), srv.requests


def test_collection_records_every_signal_and_sends_the_verdict_prompt(tmp_path):
    traces, requests = _collect(tmp_path)
    assert len(traces) == 6
    lad = ladder_of(traces)
    assert lad.signals == tuple(freetext.SIGNALS) and lad.embedding_model == "embed-m"
    verdict_bodies = [r for r in requests if prompt_text(r).startswith("You review a reply")]
    assert len(verdict_bodies) == 6 * 2  # one per round
    prices = load_prices(tmp_path / "prices.json")
    for tr in traces:
        for r in tr.rounds:
            s = r.signals
            b, g = r.base.answer, r.guide.answer
            assert s.sim_words == word_jaccard(b, g) and s.sim_chars == char_ngram_cosine(b, g)
            assert s.sim_embedding == cosine(freetext.embed(b), freetext.embed(g))
            assert s.embedding_error is None
            assert s.verdict.model == r.guide.model and s.verdict.prompt == FREE_VERDICT_VERSION
            assert s.verdict.verdict in ("yes", "no") and s.verdict.usage.input_tokens > 0
            assert s.verdict.uncertainty is not None  # the scripted server gives log-probs
            # the verdict prompt the guide's model was sent: the question and the base's reply
            sent = free_verdict_messages(tr.question, b)
            assert any(
                q["messages"] == sent and q["model"] == r.guide.model for q in verdict_bodies
            )
            # the verdict call is part of the round's cost
            plain = prices.usage_cost(r.base.model, r.base.usage) + prices.usage_cost(
                r.guide.model, r.guide.usage
            )
            assert prices.round_cost(r) > plain
    refused = [tr for tr in traces if tr.rounds[0].signals.base_refusal]
    assert refused and all("can't help" in tr.rounds[0].base.answer for tr in refused)
    x = featurize_trace(traces[0])
    assert x.shape == (2, len(feature_spec(lad.signals)["names"]))


@pytest.mark.parametrize("how", ["missing", "slow"])
def test_a_failing_or_slow_embeddings_endpoint_falls_back_to_lexical(tmp_path, how):
    kw = {} if how == "missing" else {"embed": freetext.embed, "embed_latency": 1.0}
    with freetext.world(**kw) as srv:
        cfg = freetext.config(srv, tmp_path, n=3, embedding_timeout=0.2)
        runner = make_runner(cfg, LLMClient(), "base-guide", "test")
        questions = select_questions(cfg)[0]

        async def run():
            try:
                return [await run_base_guide(runner, q) for q in questions]
            finally:
                await runner.client.aclose()

        traces = asyncio.run(run())
    stats = runner.signal_stats
    assert stats.embedding_calls == 6 and stats.embedding_fallbacks == 6
    assert stats.verdict_calls == 6
    want = "HTTP 404" if how == "missing" else "took over 0.2 s"
    col = feature_spec(runner.ladder.signals)["names"].index("sim_embedding_missing")
    for tr in traces:
        for r in tr.rounds:
            assert r.signals.sim_embedding is None and want in r.signals.embedding_error
            assert r.signals.sim_words == word_jaccard(r.base.answer, r.guide.answer)
        assert (featurize_trace(tr)[:, col] == 1.0).all()


def test_rounds_run_live_against_the_replay_server_equal_the_stored_traces(tmp_path):
    traces, _ = _collect(tmp_path)
    proc, url = start_server("replay-server", "--traces", str(tmp_path / "free.jsonl"))
    try:
        (tmp_path / "live").mkdir()
        with freetext.world() as dead:  # no embeddings here: replay needs none
            cfg = freetext.config(dead, tmp_path / "live", url=url + "/v1")
        runner = make_runner(cfg, LLMClient(), "base-guide", "dry run")

        async def live(question: str) -> list:
            outs = []
            for t in (1, 2):
                outs.append(await run_round(runner, question, t, outs, None))
            return outs

        async def run_all():
            try:
                return [await live(tr.question) for tr in traces]
            finally:
                await runner.client.aclose()

        runs = asyncio.run(run_all())
    finally:
        stop_server(proc)
    assert runner.signal_stats.embedding_calls == 0 and runner.signal_stats.verdict_calls == 0
    signals = runner.ladder.signals
    for tr, outs in zip(traces, runs, strict=True):
        rounds = [live_round(o.record()) for o in outs]
        np.testing.assert_array_equal(
            featurize_rounds(tr.task, 2, rounds, tr.family, signals), featurize_trace(tr)
        )
        for lr, r in zip(rounds, tr.rounds, strict=True):
            assert lr.signals.sim_embedding == r.signals.sim_embedding
            assert lr.signals.verdict.verdict == r.signals.verdict.verdict
