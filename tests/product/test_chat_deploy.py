"""A chat app's traffic end to end through the real entry points, over real HTTP on 127.0.0.1:
conversations (each ending in the same follow-up, "Same options.") collected by ``ccpo
collect`` on a chat ladder, trained, and checked by ``ccpo dry-run``: every served answer equals
its replay, so the replay endpoint told the conversations apart by their whole history; and an
app's logs with a ``messages`` column imported, trained and served by ``ccpo serve`` against
``ccpo replay-server``: each reply one model's whole logged output."""

from __future__ import annotations

import csv
import json
import re

import openai
import pytest
import yaml

from ccpo.api import ConformalPolicy
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces
from tests.helpers.chat import SKILL, chat_prices, chat_reply, collect_values, conversation
from tests.helpers.cli import ccpo_ok, start_server, stop_server

pytestmark = pytest.mark.slow


def test_collect_train_and_dry_run_on_a_chat_ladder(tmp_path) -> None:
    with ScriptedServer(fallback=chat_reply) as srv:
        values = collect_values(srv, tmp_path, 150)
        cfg = tmp_path / "collect.yaml"
        cfg.write_text(yaml.safe_dump(values))
        ccpo_ok("collect", "--config", str(cfg), "--quiet")
    traces = tmp_path / "chat.jsonl"
    assert {t.question for t in read_traces(traces)} == {"Same options."}
    prices = str(tmp_path / "prices.json")
    ccpo_ok("train", "--traces", str(traces), "--prices", prices, "--method", "cstop",
            "--alpha", "0.2", "--out", str(tmp_path / "pol"))  # fmt: skip
    res = ccpo_ok("dry-run", "--policy", str(tmp_path / "pol"), "--traces", str(traces),
                  "--prices", prices)  # fmt: skip
    assert "150/150 answer sets equal the policy's replay" in res.stdout
    live, replay = (float(x) for x in re.findall(r"\$([0-9.]+)", res.stdout))
    assert live == replay > 0


def test_imported_chat_logs_serve_whole_replies_against_their_replay(tmp_path) -> None:
    """A table of three models' replies to 240 conversations with a ``correct`` column,
    imported as the chat family, trained at α = 0.2 on it and served against the replay of
    the same file with the conversations (system prompt and history) as an app sends them."""
    table = tmp_path / "logs.csv"
    with table.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["question_id", "messages", "model", "answer", "correct", "input_tokens",
                    "output_tokens"])  # fmt: skip
        for i in range(240):
            msgs = conversation(i)
            good = chat_reply({"model": "big-m", "messages": msgs})
            for m in SKILL:
                reply = chat_reply({"model": m, "messages": msgs})
                w.writerow([f"c{i}", json.dumps(msgs), m, reply, str(reply == good).lower(),
                            90, len(reply) // 4])  # fmt: skip
    traces = tmp_path / "chat.jsonl"
    prices = str(chat_prices(tmp_path / "prices.json"))
    ccpo_ok("traces", "import", str(table), "--task", "support", "--family", "chat",
            "--prices", prices, "--out", str(traces))  # fmt: skip
    policy = tmp_path / "pol"
    res = ccpo_ok("train", "--traces", str(traces), "--prices", prices, "--method", "cstop",
                  "--alpha", "0.2", "--out", str(policy))  # fmt: skip
    assert "training a single-reply policy" in " ".join(res.stdout.split())  # chat's default
    chosen = read_traces(traces)[::20]
    want = {p.id: p for p in ConformalPolicy.load(policy).predict_set(chosen)}
    replay, replay_url = start_server("replay-server", "--traces", str(traces))
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": {"*": {"url": replay_url + "/v1"}},
                                   "prices": [prices]}))  # fmt: skip
    serve, url = start_server("serve", "--policy", str(policy), "--config", str(cfg))
    try:
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for tr in chosen:
            r = sdk.chat.completions.create(model="ccpo", messages=tr.messages)
            content, s = r.choices[0].message.content, r.model_extra["ccpo"]
            logged = {st.answer for rd in tr.rounds for st in (rd.base, rd.guide)}
            assert content in logged and content == s["answer"]  # one model's whole output
            assert s["guarantee"]["answer"] == "single"  # the guarantee is on that reply
            assert s["answers"] == want[tr.id].answers and s["rounds"] == want[tr.id].rounds
    finally:
        stop_server(serve)
        stop_server(replay)


def test_calling_the_reference_alone_serves_a_conversation_as_it_replays(tmp_path) -> None:
    """``always-<reference>`` on a chat ladder: the live agent calls the one step alone with the
    whole conversation, and its answers, models paid and cost equal the replay's."""
    from ccpo.evaluation.harness import trace_provenance
    from ccpo.learning.config import StopConfig
    from ccpo.policies.reference import ReferencePolicy
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.prices import load_prices

    with ScriptedServer(fallback=chat_reply) as srv:
        values = collect_values(srv, tmp_path, 20)
        cfg = tmp_path / "collect.yaml"
        cfg.write_text(yaml.safe_dump(values))
        ccpo_ok("collect", "--config", str(cfg), "--quiet")
    traces, prices = tmp_path / "chat.jsonl", tmp_path / "prices.json"
    ep = build_episodes(read_traces(traces), load_prices(prices))
    pol = ReferencePolicy.fit(ep, "single", StopConfig(alpha=0.2))
    pol.calibrate(ep)
    pol.provenance = {**trace_provenance(traces), "alpha": 0.2}  # as ``train`` records it
    pol.save(tmp_path / "pol")
    res = ccpo_ok("dry-run", "--policy", str(tmp_path / "pol"), "--traces", str(traces),
                  "--prices", str(prices))  # fmt: skip
    assert "20/20 answer sets equal the policy's replay; 20 LLM calls" in " ".join(
        res.stdout.split()
    )
