"""The ``prompt-router`` comparison row (a prompt-only router, no guarantee): ``ccpo evaluate``
scores it on the bundled open-ended set, each question answered by one model's single call."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ccpo.cli import main
from ccpo.errors import CCPOError
from ccpo.evaluation.harness import make_splits, prices_for, split_sizes
from ccpo.evaluation.prompt_router import rung_arrays
from ccpo.evaluation.reproduce import bundled_sets
from ccpo.evaluation.rows import make_policy
from ccpo.traces.episodes import build_episodes
from ccpo.traces.io import read_traces


def test_evaluate_scores_the_prompt_router_beside_always_the_strongest(tmp_path: Path) -> None:
    path = bundled_sets()["arena-public"]
    out = tmp_path / "ev"
    argv = ["evaluate", "--traces", str(path), "--out", str(out), "--splits", "3",
            "--alpha", "0.2", "--policy", "prompt-router,always-gpt-4-1106-preview"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["policy"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    router, always = rows["prompt-router"], rows["always-gpt-4-1106-preview"]
    assert router["avg_len"] == 1.0 and router["set_size"] == 1.0  # one reply per question
    assert 0.0 < router["cost_cents"] < always["cost_cents"]  # some questions go cheaper
    assert 0.5 < router["coverage"] <= 1.0 and router["extra"]["tau"] <= 1.0


def test_every_answer_is_one_models_call() -> None:
    path = bundled_sets()["arena-public"]
    ep = build_episodes(read_traces(path), prices_for(path))
    sp = make_splits(ep.n, split_sizes(ep.n), 2, seed=0)
    row = make_policy("prompt-router", None)
    row.fit(ep, sp.train, 0.2, 0)
    m = row.evaluate(ep, sp, 0.2, 0)
    cost, ok, _ = rung_arrays(ep)
    for k, test in enumerate(
        sp.test
    ):  # each cost is exactly one rung's call, its label that rung's
        rung = np.argmax(np.isclose(cost[test], m.cost[k][:, None]), axis=1)
        assert np.allclose(cost[test, rung], m.cost[k])
        assert (ok[test, rung] == m.covered[k]).all()


def test_a_ladder_with_one_guide_for_every_round_is_refused() -> None:
    path = bundled_sets()["mmlu-public"]  # its guide answers in every round: no single calls
    ep = build_episodes(read_traces(path), prices_for(path))
    sp = make_splits(ep.n, split_sizes(ep.n), 2, seed=0)
    with pytest.raises(CCPOError, match="needs a cascade ladder"):
        make_policy("prompt-router", None).fit(ep, sp.train, 0.2, 0)
