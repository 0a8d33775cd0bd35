"""Benchmark: collection throughput, concurrency 16 vs 1, against the scripted server
(in a process of its own, benchmarks/_world.py).

200 MMLU questions (bundled subset) × 4 rounds (base + guide per round = 1,600 calls), every
reply delayed by 50 ms, cache off. Prints the median wall time over ``--repeats`` runs per
concurrency level and the speed-up (target ≥ 8×).

    python benchmarks/bench_collect.py [--questions 200] [--repeats 3]
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
from ccpo.llm.prices import write_price_file

RETRIES = [0]


def run_once(url: str, n: int, rounds: int, concurrency: int, tmp: Path) -> float:
    out = tmp / f"bench-{concurrency}-{time.monotonic_ns()}.jsonl"
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
        ),
    )
    t0 = time.perf_counter()
    s = collect(cfg, progress=False)
    dt = time.perf_counter() - t0
    assert s.complete and s.done == n, s
    RETRIES[0] += s.retries
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--levels", type=str, default="16,1")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    calls = args.questions * args.rounds * 2
    print(
        f"{args.questions} questions x {args.rounds} rounds = {calls} calls, "
        f"{args.latency * 1000:.0f} ms latency, {args.repeats} repeats"
    )
    medians: dict[int, float] = {}
    world, url = start_world(args.latency)  # its own process, like a real LLM server
    try:
        with tempfile.TemporaryDirectory() as d:
            for c in levels:
                times = [
                    run_once(url, args.questions, args.rounds, c, Path(d))
                    for _ in range(args.repeats)
                ]
                medians[c] = statistics.median(times)
                print(
                    f"concurrency {c:>3}: median {medians[c]:7.2f} s  "
                    f"({calls / medians[c]:6.1f} calls/s, "
                    f"{args.questions / medians[c]:6.2f} questions/s)  "
                    f"runs: {', '.join(f'{t:.2f}' for t in times)}"
                )
    finally:
        world.terminate()
        world.wait(timeout=20)
    print(f"client retries: {RETRIES[0]}")
    if len(levels) >= 2:
        hi, lo = max(levels), min(levels)
        sp = medians[lo] / medians[hi]
        ok = "OK" if sp >= 8 else "BELOW TARGET"
        print(f"speed-up {hi} vs {lo}: {sp:.1f}x (target >= 8x: {ok})")


if __name__ == "__main__":
    main()
