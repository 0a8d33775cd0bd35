"""One model per step: an imported ladder whose every round calls one model, so that it can stop
after any call (its cheapest model's reply included), and two-model ladders end to end.

Tables are written by the tests (seeded, illustrative numbers, not LLM output). User-facing
behaviour goes through the real ``ccpo`` entry point.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from ccpo.evaluation.harness import load_episodes, train_calibration_size, train_size
from ccpo.evaluation.prompt_router import rung_arrays
from ccpo.policies.single import allowed_misses, questions_for
from ccpo.traces.importer import import_table
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices
from ccpo.traces.signals import compared, is_solo, signal_columns
from ccpo.traces.similarity import word_jaccard
from tests.helpers.cli import ccpo_ok, run_ccpo
from tests.helpers.importing import table_rows, write_csv

CHEAP, STRONG = "gpt-4.1-nano", "gpt-4o"  # bundled prices: nano is far cheaper per token


def two_model_table(path: Path, n: int = 120, seed: int = 7) -> Path:
    """``n`` short-answer questions × two models, JSONL. The strong model is always right; the
    cheap one is right on about 60%, and its wrong replies are long hedges (a reply signal a
    stopping rule can learn)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        gold = f"answer {i}"
        ok = bool(rng.random() < 0.6)
        cheap = gold if ok else "it is hard to say, perhaps " + " ".join(["maybe"] * 12)
        for model, ans, right, out in (
            (CHEAP, cheap, ok, 5 if ok else 40),
            (STRONG, gold, True, 6),
        ):
            rows.append(
                {
                    "question_id": f"q{i:03d}",
                    "question": f"What is item {i}?",
                    "model": model,
                    "answer": ans,
                    "correct": right,
                    "input_tokens": 200,
                    "output_tokens": out,
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_an_import_is_one_model_per_step_by_default(tmp_path: Path) -> None:
    prices = load_prices()
    table = write_csv(tmp_path / "t.csv", table_rows())
    traces, plan = import_table(table, "mmlu", prices)
    assert plan.one_model and plan.order() == list(plan.bases)
    assert [r.base.model for r in traces[0].rounds] == [
        "gpt-4.1-nano", "gpt-4o-mini", "gpt-4.1-mini", "gpt-4o",
    ]  # fmt: skip
    for tr in traces:
        for r in tr.rounds:
            assert is_solo(r) and r.guide.reused and r.guide.answer == r.base.answer
            assert r.guide.usage.input_tokens + r.guide.usage.output_tokens == 0
    ep, _ = load_episodes(_write(tmp_path / "one.jsonl", traces), [])
    assert ep.one_model and ep.horizon == 4
    # stopping after step 1 pays the cheapest model alone (100 in, 10 out at its price)
    nano = prices.cost("gpt-4.1-nano", 100, 10)
    assert ep.round_cost[:, 0] == pytest.approx([nano] * 3)
    pair, plan2 = import_table(table, "mmlu", prices, steps="pair")
    assert not plan2.one_model and pair[0].n_rounds == 3  # the earlier layout, on request


def _write(path: Path, traces) -> Path:
    from ccpo.traces.io import write_traces

    write_traces(path, traces)
    return path


def test_guide_with_one_model_steps_is_a_usage_error(tmp_path: Path) -> None:
    table = write_csv(tmp_path / "t.csv", table_rows())
    res = run_ccpo("traces", "import", str(table), "--task", "mmlu", "--out",
                   str(tmp_path / "o.jsonl"), "--guide", "gpt-4o", "--steps", "one")  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "--guide" in res.stderr and "--steps pair" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o.jsonl").exists()
    res = run_ccpo("traces", "import", str(table), "--task", "mmlu", "--out",
                   str(tmp_path / "o.jsonl"), "--steps", "three")  # fmt: skip
    assert res.returncode == 2 and "one" in res.stderr and "pair" in res.stderr


def test_a_one_model_steps_signals_compare_it_with_the_step_before(tmp_path: Path) -> None:
    rows = [dict(r) for r in table_rows()]
    for r in rows:  # free-text replies so that similarity and length vary
        r["answer"] = f"{r['model']} says {r['answer']} because of reasons"
    traces, _ = import_table(write_csv(tmp_path / "t.csv", rows), "qa", load_prices())
    rounds = traces[0].rounds
    cols = signal_columns(rounds, ("similarity", "length", "refusal"))
    assert cols[0, 0] == 0.0  # the first step has no step before it: blank
    for i in range(1, len(rounds)):
        earlier, later = compared(rounds, i)
        assert (earlier.answer, later.answer) == (rounds[i - 1].base.answer, rounds[i].base.answer)
        assert cols[i, 0] == pytest.approx(word_jaccard(earlier.answer, later.answer))
        assert cols[i, 0] < 1.0  # never the reply against itself
    # a step run after skipped steps (a routed start: blank rounds) sees a blank before it
    blank = rounds[0].model_copy(update={"base": rounds[0].base.model_copy(update={"answer": ""})})
    got = signal_columns([blank, rounds[1]], ("similarity",))
    assert got[1].tolist() == [0.0, 0.0]


def test_a_two_model_ladder_trains_a_single_answer_and_dry_run_equals_replay(
    tmp_path: Path,
) -> None:
    table = two_model_table(tmp_path / "two.jsonl")
    traces = tmp_path / "two.traces.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "qa", "--signals", "length",
            "--out", str(traces))  # fmt: skip
    assert [tr.n_rounds for tr in read_traces(traces)] == [2] * 120
    pol = tmp_path / "pol"
    res = ccpo_ok("train", "--traces", str(traces), "--method", "cstop", "--answer", "single",
                  "--alpha", "0.2", "--out", str(pol))  # fmt: skip
    summary = json.loads((pol / "summary.json").read_text())
    assert summary["sizes"] == {"train": 40, "calibration": 80}  # calibration gets the most
    assert summary["calibration_coverage"] >= 0.8
    # it learned to stop at the cheap model when its reply is short: fewer than 2 calls
    assert summary["calibration_rounds"] < 1.8, res.stdout
    res = ccpo_ok("dry-run", "--policy", str(pol), "--traces", str(traces))
    assert "120/120 answer sets equal the policy's replay" in res.stdout
    calls = int(res.stdout.split(" LLM calls")[0].rsplit(" ", 1)[-1])
    assert calls < 2 * 120  # one call per step run: the cheap reply is returned alone


def test_the_prompt_router_rungs_of_a_one_model_ladder_are_its_rounds(tmp_path: Path) -> None:
    table = two_model_table(tmp_path / "two.jsonl", n=30)
    traces, _ = import_table(table, "qa", load_prices())
    ep, _ = load_episodes(_write(tmp_path / "t.jsonl", traces), [])
    cost, ok, _ = rung_arrays(ep)
    assert cost.shape == (30, 2) and np.allclose(cost, ep.round_cost)
    assert ok[:, 1].all() and (ok[:, 0] == ep.correct[:, 0, 0]).all()


def test_allowed_misses_is_the_binomial_tail_at_delta() -> None:
    def tail(k: int, n: int, a: float) -> float:
        return sum(math.comb(n, j) * a**j * (1 - a) ** (n - j) for j in range(k + 1))

    for n, a in ((22, 0.1), (41, 0.1), (41, 0.2), (159, 0.2)):
        k = allowed_misses(n, a, 0.1)
        assert tail(k, n, a) <= 0.1 < tail(k + 1, n, a)
    assert allowed_misses(21, 0.1, 0.1) == -1  # 0.9^21 > 0.1: nothing can be certified
    assert questions_for(0.1, 0.1) == 22 and questions_for(0.2, 0.1) == 11
    n = questions_for(0.2, 0.1, 0.8)
    assert allowed_misses(n, 0.2, 0.1) >= math.ceil(0.16 * n)


def test_train_leaves_a_single_answer_most_questions_to_calibrate() -> None:
    assert train_size(291, single=True) == 88 and train_calibration_size(291, True) == 203
    assert train_size(60, single=True) == 30  # at most half
    assert train_size(1400, single=True) == 420
    assert train_size(291) == 209  # set policies train as compare does


def test_a_routed_one_model_ladder_calls_each_model_it_runs_once_live(tmp_path: Path) -> None:
    """Routing on one model per step, live against a scripted server on 127.0.0.1: a question
    started at step s calls no model of an earlier step and each model it runs exactly once
    (a step is one call); against the file's own replay, dry-run equals the replay."""
    from collections import Counter

    from ccpo.evaluation.dry_run import dry_run
    from ccpo.policies.registry import load_policy
    from ccpo.runtime.agent import ConformalAgent
    from ccpo.testing.scripted_server import ScriptedServer
    from ccpo.traces.ladder import Ladder
    from tests.helpers.routing import imported_ladder, routed_policy

    traces, prices = imported_ladder(tmp_path, n=160, steps="one")
    folder = routed_policy(tmp_path / "policy", traces, prices, tau=0.6)
    pol = load_policy(folder)
    ladder = Ladder.from_dict(pol.provenance["ladder"])
    assert ladder.T == 4 and all(r.one_model for r in ladder.rounds)
    values = {"endpoints": {"*": {"url": "URL"}}, "prices": [str(prices)], "timeout": 5.0}
    starts: Counter[int] = Counter()
    with ScriptedServer(fallback="Answer: A") as srv:
        values["endpoints"]["*"]["url"] = srv.url
        with ConformalAgent.from_artifact(folder, values) as agent:
            for tr in read_traces(traces)[:40]:
                srv.reset_counters()
                got = agent.answer(tr.question, id=tr.id)
                start = pol.start_rung(tr.question)
                called = Counter(req["model"] for req in srv.requests)
                ran = [ladder.rounds[lg.round - 1].base.model for lg in got.log]
                assert got.log[0].round == start + 1
                assert called == Counter(ran) and max(called.values()) == 1, (tr.id, called)
                starts[start] += 1
    assert len(starts) >= 2 and max(starts) > 0, starts  # routing is in play
    # a question sent straight to the last step calls the strongest model alone, once
    assert starts[ladder.T - 1] > 0
    report = dry_run(folder, traces, {"prices": [str(prices)]})
    assert report.ok, report.differences[:3]
    assert report.live_cost_usd == pytest.approx(report.replay_cost_usd, rel=0, abs=1e-12)
