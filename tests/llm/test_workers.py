"""``collect --workers``: several client processes, one output, one cache, one budget.

Real worker processes (forked) against the scripted server on 127.0.0.1.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ccpo.errors import CCPOError
from ccpo.llm.collect import collect
from ccpo.llm.run import output_lock
from ccpo.llm.tasks.loaders import Question
from ccpo.llm.workers import collect_with_workers, deal, shares
from ccpo.traces.io import read_traces
from tests.helpers.collecting import (
    cfg_for,
    check_traces,
    collect_app,
    ids_of,
    kill9_after_lines,
)
from tests.helpers.world import make_world

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the tests fork worker processes (Linux)"
)


def test_shares_split_the_concurrency() -> None:
    assert shares(16, 2) == [8, 8]
    assert shares(5, 2) == [3, 2]
    assert shares(7, 3) == [3, 2, 2]
    for total in range(1, 30):
        for parts in range(1, total + 1):
            got = shares(total, parts)
            assert sum(got) == total and min(got) >= 1 and max(got) - min(got) <= 1


def test_deal_keeps_identical_questions_together() -> None:
    texts = ["a", "b", "a", "c", "d", "b", "a", "e", "f", "g"]
    todo = [Question(f"q{i}", "mmlu", t, ["A"]) for i, t in enumerate(texts)]
    for parts in (1, 2, 3):
        hands = deal(todo, parts)
        assert sorted(q.id for h in hands for q in h) == sorted(q.id for q in todo)
        owner = {q.question: i for i, h in enumerate(hands) for q in h}
        for i, h in enumerate(hands):
            assert all(owner[q.question] == i for q in h)  # a text lives in one hand only
        # balanced up to the largest group (3 x "a")
        assert max(map(len, hands)) - min(map(len, hands)) <= 3
    assert [len(h) for h in deal(todo, 2)] == [5, 5]
    assert deal(todo, 2) == deal(todo, 2)  # deterministic


@pytest.mark.parametrize("task", ["mmlu", "hotpotqa"])
def test_workers_give_the_same_traces_and_a_free_rerun(task, world, tmp_path, prices_file):
    cfg = cfg_for(world, tmp_path, prices_file, task, n=7, concurrency=4, workers=2, timeout=60)
    s = collect(cfg, progress=False)
    assert s.complete and s.done == 7 and not s.failed and s.spent_usd > 0
    assert s.calls > 7 * 8 // 2  # 4 rounds x (base + guide + ReAct steps), some repeats cached
    check_traces(Path(cfg.out), 7)
    # the same collection in one process gives the same traces (the server is deterministic)
    one = cfg_for(world, tmp_path / "one", prices_file, task, n=7, concurrency=4)
    s1 = collect(one, progress=False)
    assert (s1.calls, s1.spent_usd) == (s.calls, pytest.approx(s.spent_usd, rel=1e-12))
    a = {t.id: t.to_json_dict()["rounds"] for t in read_traces(cfg.out)}
    b = {t.id: t.to_json_dict()["rounds"] for t in read_traces(one.out)}
    assert a == b
    # a rerun of the finished run makes no request; from scratch, the shared cache answers all
    n = world.n_requests
    s2 = collect(cfg, progress=False)
    assert s2.already == 7 and s2.done == 0 and world.n_requests == n
    Path(cfg.out).unlink()
    s3 = collect(cfg, progress=False)
    assert s3.done == 7 and s3.calls == 0 and world.n_requests == n
    assert s3.cached == s.calls + s.cached  # every call of the first run, from the cache


def test_spawned_workers(world, tmp_path, prices_file) -> None:
    """The start method of platforms without fork (macOS, Windows): everything is pickled."""
    cfg = cfg_for(world, tmp_path, prices_file, "mmlu", n=4, concurrency=2, workers=2)
    s = collect_with_workers(cfg, progress=False, start_method="spawn")
    assert s.complete and s.done == 4 and not s.failed and s.spent_usd > 0
    check_traces(Path(cfg.out), 4)


def test_workers_with_twenty_percent_failures(tmp_path, prices_file) -> None:
    with make_world(failure_rate=0.2, timeout_sleep=0.6, seed=11, latency=0.002) as srv:
        cfg = cfg_for(
            srv, tmp_path, prices_file, "mmlu", n=8, concurrency=4, workers=2, max_retries=12,
            timeout=0.3,
        )  # fmt: skip
        s = collect(cfg, progress=False)
        assert s.complete and not s.failed and s.retries > 0
        assert set(srv.failure_log) >= {"429", "500", "garbage"}
    check_traces(Path(cfg.out), 8)  # every question once, none lost


def _cache_costs(path: Path) -> list[float]:
    """USD of every paid call in the cache (prices_file: $1 / $4 per million tokens)."""
    rows = sqlite3.connect(path).execute("SELECT response FROM responses").fetchall()
    out = []
    for (resp,) in rows:
        r = json.loads(resp)
        out.append((r["input_tokens"] * 1.0 + r["output_tokens"] * 4.0) / 1e6)
    return out


def test_workers_share_one_budget(world, tmp_path, prices_file) -> None:
    max_cost = 0.004
    cfg = cfg_for(
        world, tmp_path, prices_file, "mmlu", n=12, concurrency=2, workers=2, max_cost=max_cost
    )
    s = collect(cfg, progress=False)
    assert s.stopped_by_budget and not s.complete and 0 < s.done < 12
    assert len(ids_of(Path(cfg.out))) == s.done
    costs = _cache_costs(tmp_path / "cache.sqlite")
    # the workers' spending adds up to what was paid ...
    assert s.calls == len(costs) and s.spent_usd == pytest.approx(sum(costs), rel=1e-9)
    # ... and never passes the run's budget (reservations in the shared ledger), where two
    # budgets of max_cost (one per worker) would have let it reach ~2 x max_cost
    assert s.spent_usd <= max_cost
    s2 = collect(cfg.model_copy(update={"max_cost": None}), progress=False)
    assert s2.complete and s2.already == s.done
    check_traces(Path(cfg.out), 12)
    keys = [json.dumps(q, sort_keys=True) for q in world.requests]
    assert len(keys) == len(set(keys))  # nothing paid twice


def test_a_fatal_error_in_a_worker_stops_the_run(tmp_path, prices_file) -> None:
    with make_world(api_key="the-right-key") as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", n=8, workers=2)
        with pytest.raises(CCPOError, match="authentication failed"):
            collect(cfg, progress=False)
        assert srv.n_requests <= cfg.concurrency
    assert not Path(cfg.out).exists()  # a run that wrote nothing leaves no empty output


def test_a_second_run_on_the_same_output_is_refused(world, tmp_path, prices_file) -> None:
    cfg = cfg_for(world, tmp_path, prices_file, "mmlu", n=2)
    for workers in (1, 2):
        # another run holds the file
        with output_lock(Path(cfg.out)), pytest.raises(CCPOError, match="another ccpo collect"):
            collect(cfg.model_copy(update={"workers": workers}), progress=False)
    assert world.n_requests == 0
    assert collect(cfg, progress=False).complete  # the lock is free again


def _lock_is_free(path: Path) -> bool:
    with open(path, "ab") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return True


def test_sigkill_of_the_parent_then_resume(tmp_path, prices_file) -> None:
    """kill -9 of the parent: its workers end with it, and a rerun completes with no duplicate."""
    with make_world(latency=0.01) as srv:
        cfg = cfg_for(srv, tmp_path, prices_file, "mmlu", n=16, concurrency=4, workers=2)
        out = Path(cfg.out)
        kill9_after_lines(cfg, 3)  # the parent only
        # the workers die with their parent and so release the output's lock
        deadline = time.monotonic() + 10
        while not _lock_is_free(out):
            assert time.monotonic() < deadline, "worker processes outlived their parent"
            time.sleep(0.05)
        first = ids_of(out)
        assert 3 <= len(first) < 16
        time.sleep(0.3)  # a live orphan would append within this time (10 ms per call)
        assert ids_of(out) == first
        s = collect(cfg, progress=False)
        assert s.complete and s.already == len(first)
        final = ids_of(out)
        assert len(final) == len(set(final)) == 16


def test_cli_collect_with_workers_and_progress_bar(world, tmp_path, prices_file) -> None:
    app = collect_app()
    out = tmp_path / "w.jsonl"
    args = ["collect", "--task", "mmlu", "--n", "6", "--rounds", "2", "--workers", "2"]
    args += ["--base-model", "base-m", "--base-url", world.url, "--guide-model", "guide-m"]
    args += ["--guide-url", world.url, "--prices", str(prices_file), "--out", str(out)]
    args += ["--cache", str(tmp_path / "c.sqlite"), "--concurrency", "4", "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["complete"] and summary["done"] == 6 and summary["calls"] > 0
    # the parent's bar counted every worker's questions and their spending
    assert "6/6" in r.stderr and f"${summary['spent_usd']:.4f}" in r.stderr
    check_traces(out, 6, rounds=2)
