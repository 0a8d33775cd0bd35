"""Serving overhead of a ladder policy: ``ccpo serve`` against ``ccpo replay-server``.

    python benchmarks/bench_ladder_serve.py [--questions 1000] [--concurrency 16] [--method auto]

A 4-model table (:mod:`ccpo.testing.ladder_table`, synthetic) is imported as traces
(``traces import``), a policy is trained on it (``train``), and three processes run on
127.0.0.1: ``ccpo replay-server`` on the trace file, ``ccpo serve`` with the policy and an
``endpoints: {"*": replay}`` config, and this load generator (httpx, ``--concurrency`` requests
in flight). Per question it measures

- **served**: the client's wall time of ``POST /v1/answer`` (the whole ladder rollout:
  featurize, π, the action set, every LLM call over HTTP, the state store);
- **replay only**: the same LLM calls (the models the served log says were paid, round by
  round, with the same prompts) sent straight to the replay endpoint by a plain client at the
  same concurrency, one question's calls in sequence as the agent makes them;
- **overhead** = served − replay only (what ``serve`` adds per question);

and reports medians and p99s, and that every served answer set equals the policy's replay.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from ccpo.api import ConformalPolicy
from ccpo.llm.prompts import cot_messages
from ccpo.testing import free_port, wait_for_http
from ccpo.testing.ladder_table import write_ladder_table
from ccpo.traces.io import read_traces


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "ccpo", *args], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def start(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", *args, "--port", str(port),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url + "/healthz", proc, 120, args[0])
    return proc, url


async def run_all(n: int, concurrency: int, one) -> list[float]:
    """``one(i)`` for i < n with ``concurrency`` in flight; per-item seconds."""
    sem = asyncio.Semaphore(concurrency)
    out = [0.0] * n

    async def go(i: int) -> None:
        async with sem:
            t0 = time.perf_counter()
            await one(i)
            out[i] = time.perf_counter() - t0

    await asyncio.gather(*(go(i) for i in range(n)))
    return out


def pct(xs: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--method", default="auto")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ccpo-bench-ladder-"))
    table, prices = write_ladder_table(work, n=max(args.questions, 1400), seed=1)
    traces_file = work / "ladder.jsonl"
    cli("traces", "import", str(table), "--task", "medqa", "--family", "mcq",
        "--prices", str(prices), "--out", str(traces_file))  # fmt: skip
    policy = work / "policy"
    cli("train", "--traces", str(traces_file), "--method", args.method, "--alpha", "0.1",
        "--prices", str(prices), "--out", str(policy))  # fmt: skip
    traces = read_traces(traces_file)[: args.questions]
    t0 = time.perf_counter()
    expected = ConformalPolicy.load(policy).predict_set(traces)
    replay_cpu = (time.perf_counter() - t0) / len(traces)

    rs, replay = start("replay-server", "--traces", str(traces_file))
    cfg = work / "deploy.yaml"
    cfg.write_text(yaml.safe_dump({"endpoints": {"*": {"url": replay + "/v1"}},
                                   "concurrency": args.concurrency}))  # fmt: skip
    sv, serve = start("serve", "--policy", str(policy), "--config", str(cfg))
    served: list[dict] = [{}] * len(traces)
    try:
        limits = httpx.Limits(max_connections=args.concurrency * 2)

        async def bench() -> tuple[list[float], list[float]]:
            async with httpx.AsyncClient(timeout=120, limits=limits) as c:
                # warm-up: one question through both (imports, first connections)
                await c.post(serve + "/v1/answer", json={"question": traces[0].question})

                async def ask(i: int) -> None:
                    body = {"question": traces[i].question, "id": f"b{i}"}
                    r = await c.post(serve + "/v1/answer", json=body)
                    r.raise_for_status()
                    served[i] = r.json()

                t_served = await run_all(len(traces), args.concurrency, ask)

                async def direct(i: int) -> None:
                    msgs = cot_messages("medqa", traces[i].question, [], "mcq")
                    for lg in served[i]["log"]:
                        for role, model in (
                            ("base", lg["base_model"]),
                            ("guide", lg["guide_model"]),
                        ):
                            if model not in lg["models"]:  # reused: not asked again
                                continue
                            r = await c.post(
                                replay + "/v1/chat/completions",
                                json={"model": model, "messages": msgs, "temperature": 0.0},
                                headers={"X-CCPO-Round": str(lg["round"]), "X-CCPO-Role": role},
                            )
                            r.raise_for_status()

                t_direct = await run_all(len(traces), args.concurrency, direct)
                return t_served, t_direct

        t0 = time.perf_counter()
        t_served, t_direct = asyncio.run(bench())
        wall = time.perf_counter() - t0
    finally:
        for p in (sv, rs):
            p.terminate()
            p.communicate(timeout=30)

    same = sum(
        s["answers"] == e.answers
        and s["rounds"] == e.rounds
        and abs(s["cost_usd"] - e.cost_usd) < 1e-12
        for s, e in zip(served, expected, strict=True)
    )
    over = np.asarray(t_served) - np.asarray(t_direct)
    calls = sum(len(lg["models"]) for s in served for lg in s["log"])
    per = calls / len(traces)
    print(f"{len(traces)} questions, concurrency {args.concurrency}, policy {args.method}; "
          f"{calls} LLM calls ({per:.2f} per question); wall {wall:.1f} s")  # fmt: skip
    print(f"served == the policy's replay: {same}/{len(traces)}")
    inside = [s["latency_ms"] / 1000.0 for s in served]
    rows = (("served", t_served), ("  in serve", inside), ("replay only", t_direct),
            ("overhead", over))  # fmt: skip
    for name, xs in rows:
        print(f"{name:>12}: median {pct(xs, 50):7.2f} ms   p99 {pct(xs, 99):7.2f} ms")
    print(f"in-process replay (predict_set): {replay_cpu * 1000:.3f} ms per question")
    return 0 if same == len(traces) else 1


if __name__ == "__main__":
    raise SystemExit(main())
