"""Label-free, end to end, through the real entry points over real HTTP on 127.0.0.1: a
4-model table without ``correct`` → ``traces import`` (labels by agreement with its most
expensive model) → ``train`` → ``serve`` against ``replay-server`` on the same traces → the
app receives one answer and a guarantee against the reference, and every served set equals
the policy's replay."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from ccpo.api import ConformalPolicy
from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.io import read_traces
from tests.helpers.cli import ccpo_ok, start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def label_free(tmp_path_factory) -> dict[str, Path]:
    """A 4-model table without ``correct`` imported as traces (labels by agreement with its
    most expensive model, ``big-m``) and the replay endpoint serving them."""
    tmp_path = tmp_path_factory.mktemp("free")
    src, prices = write_ladder_table(tmp_path / "src", n=240, seed=7)
    table = tmp_path / "logs.csv"
    with src.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    with table.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=[k for k in rows[0] if k != "correct"],
                           extrasaction="ignore")  # fmt: skip
        w.writeheader()
        w.writerows(rows)
    traces = tmp_path / "logs.jsonl"
    res = ccpo_ok("traces", "import", str(table), "--task", "medqa", "--family", "mcq",
               "--prices", str(prices), "--out", str(traces))  # fmt: skip
    assert "labels: agreement with big-m" in " ".join(res.stdout.split())
    replay, replay_url = start_server("replay-server", "--traces", str(traces))
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": {"*": {"url": replay_url + "/v1"}},
                                   "prices": [str(prices)]}))  # fmt: skip
    yield {"dir": tmp_path, "traces": traces, "config": cfg}
    stop_server(replay)


def test_a_table_without_labels_serves_answers_against_its_reference(label_free) -> None:
    traces, cfg = label_free["traces"], label_free["config"]
    policy = label_free["dir"] / "pol"
    ccpo_ok(
        "train",
        "--traces",
        str(traces),
        "--method",
        "cstop",
        "--alpha",
        "0.2",
        "--out",
        str(policy),
    )  # fmt: skip  (the prices come from beside the traces)
    prov = json.loads((policy / "policy.json").read_text())["provenance"]
    assert prov["against"] == "reference:big-m"

    chosen = read_traces(traces)[::24][:10]
    want = {p.id: p for p in ConformalPolicy.load(policy).predict_set(chosen)}
    serve, url = start_server("serve", "--policy", str(policy), "--config", str(cfg))
    try:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for tr in chosen:
            r = sdk.chat.completions.create(
                model="ccpo", messages=[{"role": "user", "content": tr.question}]
            )
            s = r.model_extra["ccpo"]
            assert s["guarantee"]["against"] == "reference:big-m"
            assert s["guarantee"]["answer"] == "set" and s["guarantee"]["target"] == 0.8
            assert "big-m's answer" in s["guarantee"]["statement"]
            assert s["answers"] == want[tr.id].answers and s["rounds"] == want[tr.id].rounds
            assert s["answer"] in s["answers"]
            assert r.choices[0].message.content == "\n".join(s["answers"])
        native = httpx.post(url + "/v1/answer", json={"question": chosen[0].question}).json()
        assert native["guarantee"]["against"] == "reference:big-m" and native["answer"]
        # ccpo ask says the same in words
        out = ccpo_ok("ask", chosen[0].question, "--policy", str(policy), "--config", str(cfg))
        flat = " ".join(out.stdout.split())
        assert f"answer: {native['answer']!r} (the most likely of" in flat
        assert "guarantee: the answer set contains big-m's answer with probability ≥ 0.8" in flat
    finally:
        stop_server(serve)


@pytest.mark.parametrize("stream", [False, True])
def test_a_single_answer_policy_serves_one_line_equal_to_its_replay(label_free, stream) -> None:
    """``train --answer single`` on the label-free import, served against its replay: the chat
    content is exactly the one answer (no newline, streamed too), equal to the replay's, with
    the set, rounds and cost under ``ccpo`` and the guarantee against the reference."""
    traces, cfg = label_free["traces"], label_free["config"]
    policy = label_free["dir"] / f"single-{stream}"
    ccpo_ok("train", "--traces", str(traces), "--answer", "single", "--alpha", "0.2",
         "--out", str(policy))  # fmt: skip
    meta = json.loads((policy / "policy.json").read_text())
    assert meta["answer"] == "single" and meta["provenance"]["against"] == "reference:big-m"
    chosen = read_traces(traces)[::24][:10]
    want = {p.id: p for p in ConformalPolicy.load(policy).predict_set(chosen)}
    serve, url = start_server("serve", "--policy", str(policy), "--config", str(cfg))
    try:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for tr in chosen:
            msgs = [{"role": "user", "content": tr.question}]
            if stream:
                chunks = list(sdk.chat.completions.create(model="ccpo", messages=msgs,
                                                          stream=True))  # fmt: skip
                content = "".join(c.choices[0].delta.content or "" for c in chunks)
                s = chunks[-1].model_extra["ccpo"]
            else:
                r = sdk.chat.completions.create(model="ccpo", messages=msgs)
                content, s = r.choices[0].message.content, r.model_extra["ccpo"]
            assert s["guarantee"]["answer"] == "single" and s["guarantee"]["target"] == 0.8
            assert s["guarantee"]["against"] == "reference:big-m"
            assert "equals big-m's" in s["guarantee"]["statement"]
            assert len(want[tr.id].answers) == 1
            assert s["answers"] == want[tr.id].answers and s["rounds"] == want[tr.id].rounds
            assert content == s["answer"] == s["answers"][0] and "\n" not in content
            assert s["cost_usd"] > 0 and s["log"][0]["models"]
    finally:
        stop_server(serve)
