"""Dry run of a ladder with signals: free-text traces collected with every signal (verdict and
embeddings included), a policy trained on them by ``ccpo train``, then ``ccpo serve`` against
``ccpo replay-server`` on the same file: every served answer, round count and cost equals the
policy's replay, and the replay endpoint is never asked for a verdict or an embedding (the
recorded signals ride along). Replies are SYNTHETIC (:mod:`tests.helpers.freetext`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from ccpo.api import ConformalPolicy
from ccpo.llm.collect import collect
from ccpo.traces.io import read_traces
from tests.helpers import freetext
from tests.helpers.cli import ccpo_ok, start_server, stop_server

pytestmark = pytest.mark.slow


def test_served_answers_with_signals_equal_the_replay(tmp_path):
    with freetext.world(embed=freetext.embed) as srv:
        cfg = freetext.config(srv, tmp_path, n=90, reference="big-m")
        assert collect(cfg, progress=False).complete
    traces_file = Path(cfg.out)
    policy = tmp_path / "policy"
    ccpo_ok("train", "--traces", str(traces_file), "--method", "cstop", "--alpha", "0.2",
            "--prices", str(tmp_path / "prices.json"), "--out", str(policy))  # fmt: skip
    ladder = json.loads((policy / "policy.json").read_text())["provenance"]["ladder"]
    assert ladder["signals"] == freetext.SIGNALS and ladder["embedding_model"] == "embed-m"
    traces = read_traces(traces_file)[::4]
    expected = {p.id: p for p in ConformalPolicy.load(policy).predict_set(traces)}
    replay, rurl = start_server("replay-server", "--traces", str(traces_file))
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(yaml.safe_dump({"endpoints": {"*": {"url": rurl + "/v1"}},
                                      "prices": [str(tmp_path / "prices.json")]}))  # fmt: skip
    try:
        proc, url = start_server("serve", "--policy", str(policy), "--config", str(deploy))
        try:
            depth = set()
            for tr in traces:
                r = httpx.post(url + "/v1/answer", json={"question": tr.question, "id": tr.id},
                               timeout=60)  # fmt: skip
                assert r.status_code == 200, r.text
                got, want = r.json(), expected[tr.id]
                assert (got["answers"], got["rounds"]) == (want.answers, want.rounds), tr.id
                assert abs(got["cost_usd"] - want.cost_usd) < 1e-12, tr.id
                depth.add(want.rounds)
        finally:
            stop_server(proc)
        health = httpx.get(rurl + "/healthz").json()
        assert health["missing"] == 0 and health["answered"] > 0
    finally:
        stop_server(replay)
    assert depth == {1, 2}, depth  # the policy stops at both rounds: a real ladder run
