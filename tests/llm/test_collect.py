"""End-to-end collection against the scripted server over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccpo.errors import CCPOError, UnknownModelPriceError
from ccpo.llm.collect import collect, collect_async
from ccpo.llm.config import build_config
from ccpo.llm.run import select_questions
from ccpo.traces.io import read_traces
from tests.helpers.collecting import (
    cfg_for,
    check_traces,
    collect_app,
    ids_of,
    kill9_after_lines,
)
from tests.helpers.world import make_world


@pytest.mark.parametrize("task", ["mmlu", "hotpotqa"])
def test_full_collection_then_rerun_is_free(task, world, tmp_path, prices_file) -> None:
    # a generous timeout: a request timed out under load is retried while the server still
    # answers the first one, which would count a request after the snapshot below
    cfg = cfg_for(
        world,
        tmp_path,
        prices_file,
        task,
        policy_llm=[{"model": "policy-m", "url": world.url}],
        timeout=60.0,
    )
    s = collect(cfg, progress=False)
    assert s.complete and s.done == 4 and not s.failed and s.spent_usd > 0 and s.retries == 0
    traces = check_traces(Path(cfg.out), 4)
    first = select_questions(cfg)[0][0].id  # lines are in completion order: pick by id
    t = next(x for x in traces if x.id == first)
    assert t.task == task and t.meta["kind"] == "base-guide"
    assert t.meta["temperatures"] == [0.0, 1.0, 1.0, 1.0]
    for r in t.rounds:
        assert set(r.policy_llm) == {"policy-m"} and r.policy_llm["policy-m"].action in {
            "guide",
            "next",
        }
        if r.guide.verdict == "yes":
            assert r.guide.answer == r.base.answer
    if task == "hotpotqa":
        assert t.meta["agent"] == "react"
        assert "Action 1: search[" in t.rounds[0].base.reasoning
        assert "Observation 1: [" in t.rounds[0].base.reasoning
    else:
        assert all(r.base.answer in "ABCD" for r in t.rounds)
    # round 2's base prompt carries round 1's reasoning, answer and the guide's reply
    base_reqs = [
        q
        for q in world.requests
        if "Attempt 1" in json.dumps(q) and "Evaluate the answer" not in json.dumps(q)
    ]
    assert base_reqs and "Reviewer:" in base_reqs[0]["messages"][-1]["content"]
    # temperature 0 in round 1, 1.0 after
    temps = {
        q["temperature"]
        for q in world.requests
        if "Attempt" not in json.dumps(q)
        and "Evaluate" not in json.dumps(q)
        and "decision-making" not in json.dumps(q)
    }
    assert temps == {0.0}

    n = world.n_requests
    s2 = collect(cfg, progress=False)
    assert s2.already == 4 and s2.done == 0 and world.n_requests == n
    # rewrite the output from scratch: zero new requests (all from the cache)
    Path(cfg.out).unlink()
    s3 = collect(cfg, progress=False)
    assert s3.done == 4 and s3.calls == 0 and s3.spent_usd == 0 and world.n_requests == n
    assert [t.rounds[-1].base.answer for t in read_traces(cfg.out)] != []


@pytest.mark.parametrize("task", ["mmlu", "hotpotqa"])
def test_twenty_percent_failures_still_complete(task, tmp_path, prices_file) -> None:
    with make_world(failure_rate=0.2, timeout_sleep=0.6, seed=7, latency=0.002) as srv:
        cfg = cfg_for(
            srv, tmp_path, prices_file, task, n=5, concurrency=5, max_retries=12, timeout=0.3
        )
        s = collect(cfg, progress=False)
        assert s.complete and not s.failed and s.retries > 0
        assert set(srv.failure_log) >= {"429", "500", "garbage"}
        check_traces(Path(cfg.out), 5)
        # with the same server behaviour (no failures) the traces are identical
    with make_world() as clean:
        cfg2 = cfg_for(clean, tmp_path / "clean", prices_file, task, n=5)
        collect(cfg2, progress=False)
    a = {t.id: t.to_json_dict()["rounds"] for t in read_traces(cfg.out)}
    b = {t.id: t.to_json_dict()["rounds"] for t in read_traces(cfg2.out)}
    assert a == b


def test_budget_stop_then_resume(world, tmp_path, prices_file) -> None:
    # a CoT call's worst case (max_tokens 512 at $4/Mtok, the prompt's bytes at $1/Mtok) is
    # ~$0.0025: a budget of $0.004 leaves room for a few questions of ~$0.0007
    cfg = cfg_for(world, tmp_path, prices_file, "mmlu", n=6, concurrency=1, max_cost=0.004)
    s = collect(cfg, progress=False)
    assert s.stopped_by_budget and not s.complete and 0 < s.done < 6
    assert s.spent_usd <= 0.004
    got = ids_of(Path(cfg.out))
    assert len(got) == s.done
    paid_first = world.n_completions
    cfg2 = cfg.model_copy(update={"max_cost": None})
    s2 = collect(cfg2, progress=False)
    assert s2.complete and s2.already == s.done
    check_traces(Path(cfg.out), 6)
    # nothing paid twice: every request of the resumed run was a new one
    keys = [json.dumps(q, sort_keys=True) for q in world.requests]
    assert len(keys) == len(set(keys)) == world.n_completions > paid_first


def test_cancel_midway_and_half_written_line(tmp_path, prices_file) -> None:
    with make_world(latency=0.01) as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", n=10, concurrency=2)
        out = Path(cfg.out)

        async def run_until_two() -> None:
            task = asyncio.create_task(collect_async(cfg, progress=False))
            while not out.exists() or out.read_text().count("\n") < 2:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(run_until_two())
        first = ids_of(out)
        assert 2 <= len(first) < 10
        # simulate a kill in the middle of writing a line
        with open(out, "a") as fh:
            fh.write('{"schema": "ccpo.trace/v1", "id": "mmlu-abstr')
        before = srv.n_requests
        s = collect(cfg, progress=False)
        assert s.truncated_partial_line and s.complete
        final = ids_of(out)
        assert Counter(final).most_common(1)[0][1] == 1 and len(final) == 10
        assert final[: len(first)] == first
        assert srv.n_requests - before < 10 * 8  # questions in flight came from the cache


def test_exit_collection(world, tmp_path, prices_file) -> None:
    cfg = build_config(
        None,
        dict(
            task="mmlu",
            n=3,
            base_model="exit-m",
            base_url=world.url,
            out=str(tmp_path / "exit.jsonl"),
            cache=str(tmp_path / "c.sqlite"),
            prices=[str(prices_file)],
        ),
    )
    s = collect(cfg, kind="llm-exit", progress=False)
    assert s.complete
    for t in read_traces(cfg.out):
        assert t.meta["kind"] == "llm-exit" and t.n_rounds == 4
        actions = [r.policy_llm["exit-m"].action for r in t.rounds]
        assert actions == ["next", "next", "base", "base"]
        for r in t.rounds:
            assert r.guide.model == r.base.model == "exit-m" and r.guide.verdict is None
            assert r.guide.answer == r.base.answer and r.guide.usage.input_tokens == 0
    # an EXIT trace file is not mixed with base/guide traces
    cfg2 = cfg_for(world, tmp_path, prices_file, "mmlu", out=cfg.out)
    with pytest.raises(CCPOError, match="llm-exit"):
        collect(cfg2, progress=False)
    # stop at the first [EXIT]
    cfg3 = cfg.model_copy(update={"stop_at_exit": True, "out": str(tmp_path / "e2.jsonl")})
    collect(cfg3, kind="llm-exit", progress=False)
    assert {t.n_rounds for t in read_traces(cfg3.out)} == {3}


def test_no_logprobs_endpoint_gives_nulls(tmp_path, prices_file) -> None:
    with make_world(logprobs_mode="reject") as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", n=2, no_cache=True)
        assert collect(cfg, progress=False).complete
    for t in read_traces(cfg.out):
        for r in t.rounds:
            assert r.guide.uncertainty is None and r.base.logprob_mean is None
            assert r.base.logprob_min is None


def test_unknown_price_fails_before_any_call(world, tmp_path, prices_file) -> None:
    cfg = cfg_for(world, tmp_path, prices_file, "mmlu", guide_model="gpt-unknown-9")
    with pytest.raises(UnknownModelPriceError):
        collect(cfg, progress=False)
    assert world.n_requests == 0


def test_api_key_never_stored(world, tmp_path, prices_file, monkeypatch) -> None:
    secret = "sk-SECRET-abcdef123456"
    monkeypatch.setenv("BASE_KEY", secret)
    monkeypatch.setenv("OPENAI_API_KEY", secret + "-openai")
    cfg = cfg_for(world, tmp_path, prices_file, "mmlu", n=2, base_key_env="BASE_KEY")
    collect(cfg, progress=False)
    for f in tmp_path.iterdir():
        assert b"SECRET-abcdef" not in f.read_bytes(), f
    rows = (
        sqlite3.connect(tmp_path / "cache.sqlite")
        .execute("SELECT request, response FROM responses")
        .fetchall()
    )
    assert rows and all("SECRET" not in a + b for a, b in rows)


def test_cli_collect_with_yaml_config(world, tmp_path, prices_file) -> None:
    app = collect_app()
    conf = tmp_path / "c.yaml"
    conf.write_text(
        f"task: hotpotqa\nrounds: 2\nn: 5\nbase_model: base-m\nbase_url: {world.url}\n"
        f"guide_model: guide-m\nguide_url: {world.url}\nprices: [{prices_file}]\n"
        f"cache: {tmp_path / 'c.sqlite'}\nconcurrency: 2\n"
    )
    out = tmp_path / "cli.jsonl"
    r = CliRunner().invoke(
        app,
        [
            "collect",
            "--config",
            str(conf),
            "--n",
            "2",
            "--out",
            str(out),
            "--policy-llm",
            "policy-m",
            "--policy-llm-url",
            world.url,
            "--quiet",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["complete"] and summary["done"] == 2
    traces = check_traces(out, 2, rounds=2)
    assert "policy-m" in traces[0].rounds[0].policy_llm
    r = CliRunner().invoke(
        app,
        [
            "collect-exit",
            "--config",
            str(conf),
            "--model",
            "exit-m",
            "--url",
            world.url,
            "--out",
            str(tmp_path / "x.jsonl"),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    assert len(read_traces(tmp_path / "x.jsonl")) == 5
    r = CliRunner().invoke(app, ["collect", "--task", "mmlu", "--out", str(out), "--quiet"])
    assert r.exit_code != 0 and isinstance(r.exception, CCPOError)


def test_sigkill_midway_then_resume(tmp_path, prices_file) -> None:
    """A real kill -9 of a collecting process, then a rerun: complete, no duplicates."""
    with make_world(latency=0.01) as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", n=12, concurrency=2)
        out = Path(cfg.out)
        kill9_after_lines(cfg, 3)
        first = ids_of(out)
        assert 3 <= len(first) < 12
        s = collect(cfg, progress=False)
        assert s.complete and s.already == len(first)
        final = ids_of(out)
        assert len(final) == len(set(final)) == 12


def test_auth_failure_stops_the_run(tmp_path, prices_file) -> None:
    with make_world(api_key="the-right-key") as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", n=6)
        with pytest.raises(CCPOError, match="authentication failed"):
            collect(cfg, progress=False)
        assert srv.n_requests <= cfg.concurrency
    assert not Path(cfg.out).exists() or Path(cfg.out).read_text() == ""


def test_collect_runs_an_agree_ladder_and_pays_a_repeated_call_once(world, tmp_path, prices_file):
    """A ``ladder:`` of three models with agreement verdicts: round 2's base is round 1's guide
    (the same call), so it is asked once, stored as reused with zero usage, and the traces
    record the ladder that ``ccpo train`` copies into a policy."""
    from ccpo.traces.ladder import ladder_of

    ladder = [
        {"base": "base-m", "guide": "guide-m", "verdict": "agree"},
        {"base": "guide-m", "guide": "policy-m", "verdict": "agree"},
    ]
    cfg = cfg_for(world, tmp_path, prices_file, "mmlu", ladder=ladder, rounds=2, n=3,
                  base_model=None, guide_model=None,
                  endpoints={"*": {"url": world.url}})  # fmt: skip
    s = collect(cfg, progress=False)
    assert s.complete and s.done == 3
    traces = read_traces(cfg.out)
    lad = ladder_of(traces)
    assert [(r.base.model, r.guide.model, r.verdict) for r in lad.rounds] == [
        ("base-m", "guide-m", "agree"),
        ("guide-m", "policy-m", "agree"),
    ]
    for t in traces:
        r1, r2 = t.rounds
        assert r2.base.reused and r2.base.usage.input_tokens == 0
        assert r2.base.answer == r1.guide.answer and not r1.guide.reused
        assert r1.guide.usage.input_tokens > 0 and r2.guide.usage.input_tokens > 0
        for r in t.rounds:  # agreement: the verdict is "same answer"
            assert r.guide.verdict == ("yes" if r.guide.answer == r.base.answer else "no")
    # 3 questions × 3 distinct calls (base-m, guide-m, policy-m): the repeat was not asked
    assert world.n_completions == 9
    # a model of the ladder with no endpoint is refused before any call
    bad = cfg_for(world, tmp_path, prices_file, "mmlu", ladder=ladder, rounds=2, n=3,
                  base_model=None, guide_model=None, out=str(tmp_path / "bad.jsonl"))  # fmt: skip
    with pytest.raises(CCPOError, match="model 'base-m' has no endpoint"):
        collect(bad, progress=False)
    assert world.n_completions == 9
