"""Benchmark: collection throughput, concurrency 16 vs 1, against the scripted server
(in a process of its own, benchmarks/_world.py).

200 MMLU questions (bundled subset) × 4 rounds (base + guide per round = 1,600 calls), every
reply delayed by 50 ms, cache off. Prints the median wall time over ``--repeats`` runs per
setting and each setting's speed-up over concurrency 1 (target ≥ 8×).

A setting is ``CONCURRENCY:WORKERS`` (``--workers``: client processes sharing the concurrency,
:mod:`ccpo.llm.workers`). The default compares concurrency 16 in two processes and in one
against concurrency 1:

    python benchmarks/bench_collect.py [--questions 200] [--repeats 3] [--settings 16:2,16:1,1:1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _world import start_world

from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.traces.prices import write_price_file

RETRIES = [0]
CALLS: dict[tuple[int, int], list[int]] = {}  # paid calls per run of each setting


def run_once(url: str, n: int, rounds: int, concurrency: int, workers: int, tmp: Path) -> float:
    out = tmp / f"bench-{concurrency}-{workers}-{time.monotonic_ns()}.jsonl"
    prices = write_price_file(tmp / "prices.json", {"base": (0, 0), "guide": (0, 0)}, "bench")
    cfg = build_config(
        None,
        dict(
            task="mmlu",
            n=n,
            rounds=rounds,
            base_model="base",
            base_url=url,
            guide_model="guide",
            guide_url=url,
            out=str(out),
            no_cache=True,
            prices=[str(prices)],
            concurrency=concurrency,
            workers=workers,
        ),
    )
    t0 = time.perf_counter()
    s = collect(cfg, progress=False)
    dt = time.perf_counter() - t0
    assert s.complete and s.done == n, s
    RETRIES[0] += s.retries
    CALLS.setdefault((concurrency, workers), []).append(s.calls)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", type=str, default="16:2,16:1,1:1")
    args = ap.parse_args()
    settings = [tuple(int(v) for v in x.split(":")) for x in args.settings.split(",")]
    calls = args.questions * args.rounds * 2
    print(
        f"{args.questions} questions x {args.rounds} rounds = {calls} calls, "
        f"{args.latency * 1000:.0f} ms latency, {args.repeats} repeats",
        flush=True,
    )
    medians: dict[tuple[int, int], float] = {}
    world, url = start_world(args.latency)  # its own process, like a real LLM server
    try:
        with tempfile.TemporaryDirectory() as d:
            for c, w in settings:
                times = [
                    run_once(url, args.questions, args.rounds, c, w, Path(d))
                    for _ in range(args.repeats)
                ]
                medians[(c, w)] = statistics.median(times)
                paid = statistics.median(CALLS[(c, w)])
                print(
                    f"concurrency {c:>3}, {w} process{'es' if w > 1 else '  '}: median "
                    f"{medians[(c, w)]:7.2f} s  ({paid / medians[(c, w)]:6.1f} calls/s, "
                    f"{paid:.0f} paid calls)  "
                    f"runs: {', '.join(f'{t:.2f}' for t in times)}",
                    flush=True,
                )
    finally:
        world.terminate()
        world.wait(timeout=20)
    print(f"client retries: {RETRIES[0]}")
    base = min(medians)  # the lowest concurrency (1:1 by default) is the baseline
    if base[0] != 1:
        print("no concurrency-1 setting: no speed-up printed")
        return
    # identical questions share their requests (merged in flight, or by the cache), and how
    # many do depends on the setting; so the speed-up is also given in calls per second
    rate = {cw: statistics.median(CALLS[cw]) / m for cw, m in medians.items()}
    for cw, m in medians.items():
        if cw != base:
            sp, sp_rate = medians[base] / m, rate[cw] / rate[base]
            ok = "OK" if min(sp, sp_rate) >= 8 else "BELOW TARGET"
            print(
                f"speed-up {cw[0]}:{cw[1]} vs {base[0]}:{base[1]}: wall time {sp:.1f}x, "
                f"calls/s {sp_rate:.1f}x (target >= 8x on both: {ok})"
            )


if __name__ == "__main__":
    main()
