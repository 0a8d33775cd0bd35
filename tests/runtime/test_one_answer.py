"""What the app receives: ``answer`` (one answer) and ``guarantee`` on ``POST /v1/answer``; the
chat content of a single-answer policy is exactly that answer (one line, streamed too); an
empty answer is never in a served set. Over real HTTP: ``ccpo serve``'s app under uvicorn,
the scripted LLM world on 127.0.0.1, the ``openai`` SDK as the chat client.

A real single-answer policy served end to end (one line of content, streamed too) is in
``tests/product/test_label_free_deploy.py``."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import openai

from ccpo.learning.config import StopConfig, TrainConfig
from ccpo.policies import RLPolicy, RulePolicy, SingleAnswerPolicy
from ccpo.runtime.agent import ConformalAgent
from ccpo.runtime.answer_set import guarantee_of, one_answer
from ccpo.runtime.config import load_deploy_config
from ccpo.runtime.service import Service, artifact_fingerprint
from ccpo.traces.answers import normalize_choice
from tests.helpers.serve import LiveServer, deploy_values
from tests.helpers.world import cot_reply, make_world

QS = [f"Which is item {i}?\nA. a{i}\nB. b{i}\nC. c{i}\nD. d{i}" for i in range(8)]


def _service(policy_dir: Path, srv, prices: Path, **kw) -> Service:
    values = deploy_values(srv, prices, **kw)
    values["server"] = {"state": None}
    agent = ConformalAgent.from_artifact(policy_dir, load_deploy_config(None, values))
    return Service(agent, artifact_fingerprint(policy_dir))


def _most_likely(s: dict) -> str | None:
    """``answer`` recomputed from the per-round log: the member with the highest π when it
    joined (ties: later round, then guide)."""
    joined = []
    for r in s["log"]:
        for a in ("base", "guide"):
            text = r[f"{a}_answer"]
            if a in r["actions"] and normalize_choice(text):
                joined.append((normalize_choice(text), r["pi"][a], r["round"], a))
    key = one_answer(joined)
    return None if key is None else next(a for a in s["answers"] if normalize_choice(a) == key)


def test_one_answer_is_the_highest_pi_then_the_later_round_then_the_guide() -> None:
    assert one_answer([]) is None
    assert one_answer([("a", 0.4, 1, "base"), ("b", 0.7, 1, "guide"), ("c", 0.5, 2, "base")]) == "b"
    assert one_answer([("a", 0.6, 1, "guide"), ("b", 0.6, 2, "base")]) == "b"  # later round
    assert one_answer([("a", 0.6, 2, "guide"), ("b", 0.6, 2, "base")]) == "a"  # the guide


def test_the_guarantee_names_its_answer_mode_target_and_labels() -> None:
    g = guarantee_of(RulePolicy(None, 4, StopConfig(alpha=0.1)))
    assert (g.answer, g.target, g.against) == ("set", 0.9, "gold")
    assert g.statement == (
        "P(the answer set misses every correct answer and some round answers correctly) ≤ 0.1"
    )
    g = guarantee_of(SingleAnswerPolicy(None, 4, StopConfig(alpha=0.2)))
    assert g.statement == "P(the answer is wrong and some round answers correctly) ≤ 0.2"
    g = guarantee_of(
        SingleAnswerPolicy(
            None, 4, StopConfig(alpha=0.2), provenance={"against": "reference:gpt-4o"}
        )
    )
    assert (g.answer, g.target, g.against) == ("single", 0.8, "reference:gpt-4o")
    assert g.statement == "the answer equals gpt-4o's with probability ≥ 0.8"
    greedy = RLPolicy(None, "cpo", np.zeros(3), np.ones(3), TrainConfig(alpha=0.1), 0.5)
    point = guarantee_of(greedy)
    assert point.statement.startswith("none: a point policy")


def test_v1_answer_adds_answer_and_guarantee(world, policy_dir, prices_path) -> None:
    with LiveServer(_service(policy_dir, world, prices_path, kappa=0.2)) as ls:
        sets = [httpx.post(ls.url + "/v1/answer", json={"question": q}).json() for q in QS]
    assert sum(len(s["answers"]) for s in sets) > len(sets)  # some sets hold several answers
    for s in sets:
        assert s["guarantee"] == {
            "answer": "set",
            "target": 0.9,
            "against": "gold",
            "statement": "P(the answer set misses every correct answer and some round answers "
            "correctly) ≤ 0.1",
        }
        assert s["answer"] in s["answers"] and s["answer"] == _most_likely(s)


def test_an_empty_answer_is_never_in_a_served_set_nor_content(policy_dir, prices_path) -> None:
    """The base model answers nothing; at κ = 0 every action is in C(o_t), so the base's empty
    answer would join every set: it never does, and no content line is empty."""

    def silent_base(req: dict) -> str:
        return "" if req["model"] == "base-m" else cot_reply(req)

    with make_world() as srv:
        srv.fallback = silent_base
        with LiveServer(_service(policy_dir, srv, prices_path, kappa=0.0)) as ls:
            client = openai.OpenAI(base_url=ls.url + "/v1", api_key="-", max_retries=0)
            for q in QS[:4]:
                r = client.chat.completions.create(
                    model="ccpo", messages=[{"role": "user", "content": q}]
                )
                s, content = r.model_extra["ccpo"], r.choices[0].message.content
                first = s["log"][0]
                assert first["base_answer"] == "" and "base" in first["actions"]  # chosen ...
                assert "" not in s["answers"]  # ... and left out
                assert "" not in content.split("\n") and content == "\n".join(s["answers"])
                assert s["answer"] is None or s["answer"] in s["answers"]
