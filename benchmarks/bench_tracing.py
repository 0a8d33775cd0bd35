"""What OpenTelemetry tracing costs the deployed agent, per question (in-process, real HTTP).

    python benchmarks/bench_tracing.py [--reps 7] [--questions 40] [--latency 0.0]

The agent (a small CCPO policy on synthetic traces, κ = 0 so that every question runs all T
rounds: 2T LLM calls) answers ``--questions`` distinct questions one after another against the
scripted LLM server (a process of its own), with tracing **off** (the hooks' no-op path, as
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is unset) and **on** (spans batched and exported over
OTLP/HTTP to :mod:`ccpo.testing.otlp_receiver`, a process of its own). The two modes alternate
within each repetition (which goes first alternates too); reported: the median over
repetitions of the mean ms per question in each mode, their ratio on / off and the median of
the repetitions' own ratios (the two modes ran back to back: steadier), plus the hooks'
own cost per LLM call in each mode, timed alone in-process (steadier on a busy machine).
Needs the ``dev`` extra (SDK, exporter and proto).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from _world import start_world
from bench_serve import make_policy

from ccpo.llm import tracing
from ccpo.llm.client import ChatRequest, ChatResult, Endpoint
from ccpo.testing import free_port
from ccpo.traces.prices import write_price_file


async def per_question_ms(agent, questions: list[str]) -> float:
    t0 = time.perf_counter()
    for q in questions:
        await agent.aanswer(q)
    return 1e3 * (time.perf_counter() - t0) / len(questions)


async def alternate(agent, modes: dict, reps: int, questions: int) -> dict[str, list[float]]:
    """Mean ms per question of each mode (the tracer in force) in every repetition; the modes
    alternate, and so does which goes first; every question is new (nothing coalesces)."""
    times: dict[str, list[float]] = {m: [] for m in modes}
    tracing._state["tracer"] = None  # the benchmark's only use of the switch
    await per_question_ms(agent, ["warm-up: which is a prime?\nA. 4\nB. 7"])
    n = 0
    for r in range(reps):
        for mode in list(modes) if r % 2 == 0 else list(modes)[::-1]:
            tracing._state["tracer"] = modes[mode]
            qs = [f"Question {n + i}: which is a prime?\nA. 4\nB. 7" for i in range(questions)]
            n += questions
            times[mode].append(await per_question_ms(agent, qs))
    tracing._state["tracer"] = None
    await agent.aclose()
    return times


def hooks_us(reps: int) -> float:
    """µs per LLM call of the hooks alone in the mode in force (enter, done, exit), best of 5
    runs of ``reps`` calls (on: a span made, filled and queued for export; ``reps`` stays
    under the export queue's 2048 spans, so none is dropped)."""
    ep, req = (
        Endpoint("m", "http://127.0.0.1:1/v1"),
        ChatRequest([{"role": "user", "content": "x"}]),
    )
    res = ChatResult("B", 10, 2, finish_reason="stop")

    def once() -> None:
        with tracing.llm_call(ep, req) as span:
            span.done(res)

    return 1e6 * min(timeit.repeat(once, number=reps, repeat=5)) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--questions", type=int, default=40)
    ap.add_argument("--latency", type=float, default=0.0, help="scripted LLM latency (s)")
    args = ap.parse_args()
    world, llm_url = start_world(args.latency)
    port = free_port()
    with tempfile.TemporaryFile("w+") as received:
        rx = subprocess.Popen(
            [sys.executable, "-m", "ccpo.testing.otlp_receiver", str(port)], stdout=received
        )
        try:
            out = run(llm_url, port, args)
            time.sleep(1.0)  # the last batch leaves
        finally:
            rx.terminate()
            rx.wait()
            world.terminate()
        received.seek(0)
        out["traces_received"] = sum(line.startswith("invoke_agent") for line in received)
    print(json.dumps(out, indent=1))


def run(llm_url: str, port: int, args: argparse.Namespace) -> dict:
    from ccpo.runtime.agent import ConformalAgent

    tmp = Path(tempfile.mkdtemp(prefix="ccpo-bench-tracing-"))
    policy = make_policy(tmp / "policy")
    prices = write_price_file(
        tmp / "prices.json", {"bench-base": (0.1, 0.4), "bench-guide": (2.5, 10.0)}, "bench"
    )
    cfg = {"task": "mmlu", "base_model": "bench-base", "base_url": llm_url,
           "guide_model": "bench-guide", "guide_url": llm_url, "prices": [str(prices)],
           "kappa": 0.0}  # fmt: skip
    agent = ConformalAgent.from_artifact(policy, cfg)
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"
    tracing.configure_from_env()
    modes = {"off": None, "on": tracing._state["tracer"]}
    times = asyncio.run(alternate(agent, modes, args.reps, args.questions))
    hooks = {}
    for mode, tracer in modes.items():
        tracing._state["tracer"] = tracer
        hooks[mode] = hooks_us(1000 if tracer else 100_000)
        time.sleep(0.5)  # the queue empties
    tracing._state["tracer"] = None
    med = {m: statistics.median(v) for m, v in times.items()}
    return {
        "questions_per_rep": args.questions,
        "llm_calls_per_question": 2 * agent.horizon,
        "ms_per_question_median": med,
        "runs_ms": {m: [round(x, 3) for x in v] for m, v in times.items()},
        "ratio_on_over_off": med["on"] / med["off"],
        # each repetition's on / off (the two ran back to back): steadier under load
        "ratio_paired_median": statistics.median(
            a / b for a, b in zip(times["on"], times["off"], strict=True)
        ),
        "traces_expected": args.reps * args.questions,  # every question of the "on" runs
        "hooks_us_per_llm_call": hooks,
    }


if __name__ == "__main__":
    main()
