"""A conversation through ``ccpo serve`` to a real small model (``llama_cpp.server`` +
SmolLM2-135M on 127.0.0.1, behind a recording proxy): every upstream call receives the app's
system prompt and both earlier turns byte for byte, and the chat content is one of the model's
replies, whole; then the same local model judges chat replies through ``ccpo traces judge``.
Skipped unless the optional extra ``llama`` is installed. The chat policy is trained on the
scripted chat world (its three model names all reach the one real model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.testing.llama_server import LlamaServer, find_smollm2_gguf, llama_server_available
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.io import read_traces
from ccpo.traces.prices import write_price_file
from tests.helpers.chat import RecordingProxy, chat_reply, collect_values, conversation
from tests.helpers.cli import ccpo_ok
from tests.helpers.serve import LiveServer, post

pytestmark = pytest.mark.llama


def chat_policy(d: Path) -> Path:
    """A CStop chat policy trained on the scripted chat world's ladder."""
    with ScriptedServer(fallback=chat_reply) as srv:
        assert collect(build_config(None, collect_values(srv, d, 120)), progress=False).done
    ccpo_ok("train", "--traces", str(d / "chat.jsonl"), "--prices", str(d / "prices.json"),
            "--method", "cstop", "--alpha", "0.2", "--out", str(d / "pol"))  # fmt: skip
    return d / "pol"


def serve_a_conversation(policy: Path, prices: Path, upstream: str) -> None:
    """Serve ``policy`` with every model at ``upstream`` (through a recording proxy), send a
    conversation with a system prompt and two earlier turns, and check what each upstream
    call received and what came back."""
    from ccpo.runtime.config import load_deploy_config
    from ccpo.runtime.server import Service

    messages = conversation(3)
    assert messages[0]["role"] == "system" and len(messages) == 4
    with RecordingProxy(upstream) as proxy:
        values = {"endpoints": {"*": {"url": proxy.url}}, "prices": [str(prices)],
                  "timeout": 300.0, "max_tokens": 48, "server": {"state": None}}  # fmt: skip
        service = Service.from_artifact(policy, load_deploy_config(None, values))
        with LiveServer(service) as live:
            r = post(live.url, "/v1/chat/completions", {"model": "ccpo", "messages": messages})
    assert r.status_code == 200, r.text
    s, content = r.json()["ccpo"], r.json()["choices"][0]["message"]["content"]
    assert len(proxy.requests) == sum(len(lg["models"]) for lg in s["log"]) >= 1
    for req in proxy.requests:  # the system prompt and both earlier turns, byte for byte
        assert req["messages"] == messages
    replies = [rep["choices"][0]["message"]["content"] for rep in proxy.replies]
    assert content == s["answer"] and content in replies  # one model's reply, whole


def test_a_conversation_reaches_the_real_model_whole(tmp_path) -> None:
    why = llama_server_available()
    if why:
        pytest.skip(why)
    policy = chat_policy(tmp_path)
    with LlamaServer(find_smollm2_gguf()) as llama:
        serve_a_conversation(policy, tmp_path / "prices.json", llama.url)


def test_the_real_model_judges_chat_replies_and_a_rerun_pays_nothing(tmp_path) -> None:
    """Four conversations of the scripted chat ladder, judged by SmolLM2 (a 1-10 rating
    against big-m's reply): every judge call reaches the real model at temperature 0 with the
    conversation in its prompt; each reply is rated 1-10 and labelled by the rule, or its
    question is left out as unjudged (a 135M model often writes no rating; never guessed);
    a second run with the same cache makes no call."""
    why = llama_server_available()
    if why:
        pytest.skip(why)
    with ScriptedServer(fallback=chat_reply) as srv:
        assert collect(build_config(None, collect_values(srv, tmp_path, 4)), progress=False).done
    traces, judged = tmp_path / "chat.jsonl", tmp_path / "judged.jsonl"
    judge_prices = write_price_file(tmp_path / "judge.json", {"smollm2": (0.1, 0.1)}, "test")
    argv = ["traces", "judge", str(traces), "--out", str(judged), "--judge-model", "smollm2",
            "--prices", str(tmp_path / "prices.json"), "--prices", str(judge_prices),
            "--cache", str(tmp_path / "cache.sqlite"), "--concurrency", "1", "--quiet"]  # fmt: skip
    gguf = find_smollm2_gguf()
    with LlamaServer(gguf, logits_all=False) as llama, RecordingProxy(llama.url) as proxy:
        res = ccpo_ok(*argv, "--judge-url", proxy.url)
        asked = list(proxy.requests)
        again = ccpo_ok(*argv, "--judge-url", proxy.url, "--force")
        assert len(proxy.requests) == len(asked)  # the rerun is served by the cache
    flat = " ".join(res.stdout.split())
    calls = re.search(r"on (\d+) judge calls, 0 served by the cache", flat)
    assert calls and int(calls.group(1)) == len(asked) >= 4, flat  # two replies a question
    rerun = re.search(
        r"on 0 judge calls, (\d+) served by the cache", " ".join(again.stdout.split())
    )
    assert rerun and int(rerun.group(1)) >= len(asked), again.stdout  # identical asks share one
    assert {r["temperature"] for r in asked} == {0.0}
    for req in asked:
        prompt = "\n".join(m["content"] for m in req["messages"])
        assert "Same options." in prompt and "is late. Options?" in prompt
    unjudged = re.search(r"(\d+) unjudged \(never guessed\)", flat)
    kept = read_traces(judged)
    left_out = 4 - len(kept)  # each question left out holds one or two unjudged replies
    assert unjudged and left_out <= int(unjudged.group(1)) <= 2 * left_out, flat
    for tr in kept:
        for r in tr.rounds:
            for st in (r.base, r.guide):
                rating = (st.model_extra or {}).get("judge", {}).get("rating")
                if st.model != "big-m" and rating is not None:
                    assert 1 <= rating <= 10 and st.correct == (rating >= 8), (st, rating)
