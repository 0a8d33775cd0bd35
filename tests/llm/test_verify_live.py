"""A verify step run live over real HTTP (a scripted OpenAI-compatible server on 127.0.0.1):
the verifier receives the whole conversation and the reply it judges, once per question, and
is paid as its own call; the reply is not asked twice. A single answer trained on the
collected traces answers a dry run exactly as its replay, a deployed agent runs the verify
step against the scripted server, and a question started at the verify step (a routed start)
asks the reply there, then the verifier. Replies are SCRIPTED (:mod:`tests.helpers.chat`)."""

from __future__ import annotations

import asyncio
import collections
import re

from ccpo.llm.client import LLMClient
from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.llm.protocol import make_runner, run_round
from ccpo.runtime.agent import ConformalAgent
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.conversation import Conversation
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices, write_price_file
from tests.helpers.chat import chat_reply, collect_values, conversation
from tests.helpers.cli import ccpo_ok

LADDER = [  # small-m, then judge-m's verdict on its reply, then big-m
    {"base": "small-m", "guide": "small-m", "verdict": "agree"},
    {"base": "small-m", "guide": "judge-m", "verdict": "verify"},
    {"base": "big-m", "guide": "big-m", "verdict": "agree"},
]
JUDGED = r"Is the reply acceptable\?"
ASKED = re.compile(r"Reply:\n(.*)\n\nIs the reply acceptable\?", re.S)


def judge(req: dict) -> str:
    """judge-m accepts a reply that offers the refund (the right one in the chat world)."""
    reply = ASKED.search(req["messages"][-1]["content"]).group(1)
    return "Yes" if "a refund" in reply else "No"


def test_the_verifier_is_called_live_and_a_dry_run_equals_the_replay(tmp_path) -> None:
    prices = write_price_file(
        tmp_path / "verify-prices.json",
        {"small-m": (0.1, 0.4), "judge-m": (0.2, 0.8), "big-m": (5.0, 20.0)},
        "test",
    )
    with ScriptedServer(rules=[(JUDGED, judge)], fallback=chat_reply) as srv:
        values = collect_values(srv, tmp_path, 60, ladder=LADDER, prices=[str(prices)])
        assert collect(build_config(None, values), progress=False).done == 60
        sent = [(r["model"], r["messages"]) for r in srv.requests]
    # one call each: small-m's reply is verified, not asked again; big-m's is the reference's
    assert collections.Counter(m for m, _ in sent) == {"small-m": 60, "judge-m": 60, "big-m": 60}
    traces = read_traces(tmp_path / "chat.jsonl")
    table = load_prices(prices)
    for tr in traces:
        step, check = tr.rounds[0], tr.rounds[1]
        i = int(tr.id.split("-")[1])
        (text,) = [  # the whole conversation, then the reply as it was written
            m[0]["content"] for model, m in sent
            if model == "judge-m" and f"My order {i} is" in m[0]["content"]
        ]  # fmt: skip
        for m in conversation(i):
            assert f"{m['role']}: {m['content']}" in text
        assert ASKED.search(text).group(1) == step.base.answer
        assert check.verdict_mode == "verify" and check.base.reused
        assert check.guide.answer == step.base.answer and check.guide.model == "judge-m"
        assert check.guide.verdict == ("yes" if "a refund" in step.base.answer else "no")
        assert table.round_cost(check) == table.usage_cost("judge-m", check.guide.usage) > 0
    policy = tmp_path / "policy"
    ccpo_ok("train", "--traces", str(tmp_path / "chat.jsonl"), "--method", "cstop",
            "--answer", "single", "--alpha", "0.2", "--prices", str(prices),
            "--out", str(policy))  # fmt: skip
    res = ccpo_ok("dry-run", "--policy", str(policy), "--traces", str(tmp_path / "chat.jsonl"),
                  "--prices", str(prices))  # fmt: skip
    assert "60/60 answer sets equal the policy's replay" in res.stdout, res.stdout
    # the deployed agent runs the verify step live against the scripted server
    with ScriptedServer(rules=[(JUDGED, judge)], fallback=chat_reply) as srv:
        agent = ConformalAgent.from_artifact(
            policy, {"endpoints": {"*": {"url": srv.url}}, "prices": [str(prices)]}
        )
        try:
            went_on = []
            for i in range(100, 140):
                srv.requests.clear()
                got = agent.answer(Conversation(tuple(conversation(i))), id=f"c{i}")
                if got.rounds >= 2:
                    went_on.append((got, [r["model"] for r in srv.requests]))
                if len(went_on) == 3:
                    break
        finally:
            agent.close()
    # a question started at the verify step (a routed start) asks the reply there, then the
    # verifier, and pays both
    with ScriptedServer(rules=[(JUDGED, judge)], fallback=chat_reply) as srv:
        here = {**values, "endpoints": {"*": {"url": srv.url}}}
        runner = make_runner(build_config(None, here), LLMClient(), "base-guide", "test")

        async def started_at_the_check():
            try:
                return await run_round(runner, Conversation(tuple(conversation(3))), 2, [],
                                       None, start=2)  # fmt: skip
            finally:
                await runner.client.aclose()

        ro = asyncio.run(started_at_the_check())
        assert [r["model"] for r in srv.requests] == ["small-m", "judge-m"]
    assert ro.reused == () and ro.models() == ["small-m", "judge-m"]
    assert (
        ro.guide.answer
        == ro.base.answer
        == chat_reply({"model": "small-m", "messages": conversation(3)})
    )
    assert went_on  # some questions went past the first step
    for got, models in went_on:
        assert models[:2] == ["small-m", "judge-m"]  # the reply, then its verdict
        assert got.log[1].models == ["judge-m"] and got.log[1].guide_verdict in ("yes", "no")
        assert got.cost_by_model["judge-m"] == got.log[1].cost_usd > 0
