"""Load benchmark of ``ccpo serve`` against the scripted LLM server (real HTTP on 127.0.0.1).

    python benchmarks/bench_serve.py [--requests 500] [--concurrency 32] [--latency 0.01]
    python benchmarks/bench_serve.py --requests 64 --concurrency 64 --max-cost-total 0.05

Three processes: the scripted OpenAI-compatible server (``--latency`` seconds per completion),
``ccpo serve`` with a small CCPO policy trained on synthetic traces, and this load generator
(httpx, ``--concurrency`` requests in flight). Reports errors, p50/p95/max latency and
requests/s, the mean rounds and LLM calls per request, and — separately, in-process — the
policy's own overhead per request (featurize + π + action set, over every round run).

With ``--max-cost-total`` (no warm-up then) it measures the budget under load instead: the
dollars spent against the budget, the questions answered, and the dollars paid for questions
that were not answered (wasted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from _world import start_world

from ccpo.testing import free_port, wait_for_http
from ccpo.traces.prices import write_price_file


def make_policy(folder: Path) -> Path:
    from ccpo.learning.config import TrainConfig
    from ccpo.learning.training import train
    from ccpo.policies.rl import TrainedPolicy
    from ccpo.traces.episodes import build_episodes
    from ccpo.traces.prices import load_prices
    from ccpo.traces.sim import SimConfig, generate

    prices = load_prices()
    ep = build_episodes(generate(SimConfig(n=400, seed=0)), prices)
    res = train(ep, np.arange(300), TrainConfig(steps=60, val_every=0, seed=0))
    pol = TrainedPolicy.from_result(res, "ccpo", prices.to_price_file())
    pol.kappa_batch = 0.3
    return pol.save(folder)


def policy_overhead(policy: Path, cfg: dict, reps: int = 2000) -> dict[str, float]:
    """Featurize + π + action set for every round of a T-round request, in-process."""
    from ccpo.llm.protocol import live_round
    from ccpo.runtime.agent import ConformalAgent

    agent = ConformalAgent.from_artifact(policy, cfg)
    T = agent.horizon
    base = {"model": "bench-base", "answer": "B", "reasoning": "", "logprob_mean": -0.4,
            "logprob_min": -2.0, "usage": {"input_tokens": 300, "output_tokens": 40}}  # fmt: skip
    guide = {"model": "bench-guide", "answer": "C", "verdict": "no", "uncertainty": 0.3,
             "usage": {"input_tokens": 350, "output_tokens": 4}}  # fmt: skip
    rounds = [live_round({"round": t, "base": base, "guide": guide}) for t in range(1, T + 1)]
    for t in range(1, T + 1):  # warm-up
        agent.decide(rounds[:t])
    per_round = []
    t0 = time.perf_counter()
    for _ in range(reps):
        for t in range(1, T + 1):
            a = time.perf_counter()
            agent.decide(rounds[:t])
            per_round.append(time.perf_counter() - a)
    total = time.perf_counter() - t0
    return {
        "policy_ms_per_round_mean": 1e3 * float(np.mean(per_round)),
        "policy_ms_per_round_p95": 1e3 * float(np.percentile(per_round, 95)),
        "policy_ms_per_request_T_rounds": 1e3 * total / reps,
        "horizon": T,
    }


async def load(url: str, n: int, conc: int) -> dict[str, object]:
    sem = asyncio.Semaphore(conc)
    lat: list[float] = []
    errors: list[str] = []
    rounds: list[int] = []
    costs: list[float] = []
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            q = f"Question {i}: which option is right?\nA. one\nB. two\nC. three\nD. four"
            async with sem:
                t0 = time.perf_counter()
                try:
                    r = await client.post("/v1/answer", json={"question": q})
                except httpx.HTTPError as e:
                    errors.append(type(e).__name__)
                    return
                lat.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors.append(f"HTTP {r.status_code}: {r.text[:200]}")
                else:
                    rounds.append(r.json()["rounds"])
                    costs.append(r.json()["cost_usd"])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
        metrics = (await client.get("/metrics.json")).json()
    ms = np.asarray(lat) * 1e3
    return {
        "requests": n,
        "concurrency": conc,
        "errors": len(errors),
        "error_examples": errors[:3],
        "wall_s": wall,
        "requests_per_s": n / wall,
        "latency_ms_p50": float(np.percentile(ms, 50)) if len(ms) else None,
        "latency_ms_p95": float(np.percentile(ms, 95)) if len(ms) else None,
        "latency_ms_max": float(ms.max()) if len(ms) else None,
        "mean_rounds": float(np.mean(rounds)) if rounds else None,
        "llm_calls_per_request": 2 * float(np.mean(rounds)) if rounds else None,
        "answered": len(rounds),
        "answered_cost_usd": float(sum(costs)),
        "server_metrics": metrics,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.01, help="scripted LLM latency (s)")
    ap.add_argument("--policy", type=Path, default=None, help="policy folder [train a small one]")
    ap.add_argument("--kappa", type=float, default=None, help="override κ (lower: more rounds)")
    ap.add_argument(
        "--max-cost-total", type=float, default=None, help="measure a total budget (USD) under load"
    )
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    policy = args.policy or make_policy(tmp / "policy")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    world, llm_url = start_world(args.latency)
    serve = None
    try:
        prices = write_price_file(
            tmp / "prices.json",
            {"bench-base": (0.1, 0.4), "bench-guide": (2.5, 10.0)},
            "benchmark",
        )
        cfg = {
            "task": "mmlu",
            "base_model": "bench-base",
            "base_url": llm_url,
            "guide_model": "bench-guide",
            "guide_url": llm_url,
            "prices": [str(prices)],
            "concurrency": 64,
            "timeout": 30,
        }
        if args.kappa is not None:
            cfg["kappa"] = args.kappa
        if args.max_cost_total is not None:
            cfg["max_cost_total"] = args.max_cost_total
        import yaml

        (tmp / "deploy.yaml").write_text(yaml.safe_dump(cfg))
        port = free_port()
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ccpo",
                "serve",
                "--policy",
                str(policy),
                "--config",
                str(tmp / "deploy.yaml"),
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        wait_for_http(url + "/healthz", serve, 60, "ccpo serve")
        if args.max_cost_total is None:
            asyncio.run(load(url, 20, 4))  # warm-up (connections, first policy call)
        res = asyncio.run(load(url, args.requests, args.concurrency))
        if args.max_cost_total is not None:
            spent = res["server_metrics"]["dollars_spent"]
            print(
                f"budget ${args.max_cost_total:.4f} at concurrency {args.concurrency}: spent "
                f"${spent:.4f} ({100 * (spent / args.max_cost_total - 1):+.1f}%), "
                f"{res['answered']} of {args.requests} answered, "
                f"${spent - res['answered_cost_usd']:.4f} paid for unanswered questions; "
                f"errors: {sorted(set(e[:8] for e in res['error_examples']))}"
            )
            return
        res["scripted_llm_latency_s"] = args.latency
        res.update(policy_overhead(policy, cfg))
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=20)
        world.terminate()
        world.wait(timeout=20)
    sm = res.pop("server_metrics")
    print(json.dumps(res, indent=1))
    print(
        f"\n{res['requests']} requests at concurrency {res['concurrency']} "
        f"(LLM latency {args.latency * 1e3:.0f} ms): {res['errors']} errors; "
        f"p50 {res['latency_ms_p50']:.1f} ms, p95 {res['latency_ms_p95']:.1f} ms; "
        f"{res['requests_per_s']:.1f} requests/s; {res['mean_rounds']:.2f} rounds "
        f"({res['llm_calls_per_request']:.2f} LLM calls) per request; server mean set size "
        f"{sm['mean_set_size']:.2f}\npolicy overhead: {res['policy_ms_per_round_mean']:.3f} ms "
        f"per round, {res['policy_ms_per_request_T_rounds']:.3f} ms per {res['horizon']}-round "
        "request (target ≤ 2 ms)"
    )


if __name__ == "__main__":
    main()
