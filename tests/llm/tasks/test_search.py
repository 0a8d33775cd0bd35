"""The offline search tool: BM25 over passages and the ReAct environment's actions."""

from __future__ import annotations

import asyncio

from ccpo.llm.tasks import Passage
from ccpo.llm.tasks.search import BM25Search, ReActEnv, parse_action

# ----------------------------------------------------------------------------- search
PASSAGES = [
    Passage(
        "Eiffel Tower",
        [
            "The Eiffel Tower is in Paris. ",
            "It was built in 1889. ",
            "Gustave Eiffel's company built the tower.",
        ],
    ),
    Passage("Paris", ["Paris is the capital of France. ", "It has 2 million people."]),
    Passage("Berlin", ["Berlin is the capital of Germany."]),
]


def test_bm25_search_exact_title_and_ranking() -> None:
    s = BM25Search(PASSAGES)
    assert s.search_sync("paris")[0].title == "Paris"  # exact title wins
    assert s.search_sync("capital of Germany")[0].title == "Berlin"
    assert s.search_sync("built 1889")[0].title == "Eiffel Tower"
    assert s.search_sync("zzzz") == []
    assert s.search_sync("the of") == []  # only stop words
    assert BM25Search([]).search_sync("x") == []


def test_react_env_search_lookup() -> None:
    env = ReActEnv(BM25Search(PASSAGES))

    def step(a: str, x: str) -> str:
        return asyncio.run(env.step(a, x))

    assert "search first" in step("lookup", "tower")
    obs = step("search", "Eiffel Tower")
    assert obs.startswith("[Eiffel Tower] The Eiffel Tower is in Paris.")
    assert step("lookup", "built") == "(Result 1 / 2) It was built in 1889."
    assert step("lookup", "built").startswith("(Result 2 / 2) Gustave")
    assert step("lookup", "built") == "No more results."
    assert "Could not find" in step("search", "qqqq")


def test_parse_action() -> None:
    assert parse_action("Search[Paris]") == ("search", "Paris")
    assert parse_action(" finish[ yes ] ") == ("finish", "yes")
    assert parse_action("jump[x]") is None
