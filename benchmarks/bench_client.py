"""CPU per LLM call of ``ccpo.llm.client.LLMClient`` against a bare aiohttp POST (the floor).

    python benchmarks/bench_client.py [--calls 2000] [--concurrency 32] [--reps 3]
    python benchmarks/bench_client.py --base-src /tmp/base   # + the client of another tree

Each variant runs in a process of its own against the gateway benchmark's scripted upstream
(``_upstream.py``, ``--latency`` s per call), sends ``--calls`` chat completions (log-probs on,
a ~300-byte prompt, as a round's base call) ``--concurrency`` at a time, and reports its own
CPU seconds per call (user + system). Variants in turn within each of ``--reps``
repetitions; medians and ratios to the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT = "Answer the question. Think step by step, then write 'Answer: <letter>'.\n" * 3


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _floor(url: str, n: int, conc: int) -> float:
    import aiohttp

    sem = asyncio.Semaphore(conc)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def one(i: int) -> None:
            msgs = [{"role": "user", "content": f"{PROMPT}{i}"}]
            body = {"model": "bench-base", "messages": msgs, "temperature": 0.0,
                    "max_tokens": 256, "logprobs": True, "top_logprobs": 5}  # fmt: skip
            async with sem, http.post(url + "/chat/completions", json=body) as r:
                json.loads(await r.read())["choices"][0]["message"]["content"]

        await one(-1)
        c0 = _cpu()
        await asyncio.gather(*(one(i) for i in range(n)))
        return (_cpu() - c0) / n


async def _ccpo(url: str, n: int, conc: int) -> float:
    from ccpo.llm.client import ChatRequest, Endpoint, LLMClient

    c = LLMClient(concurrency=conc)
    ep = Endpoint("bench-base", url)

    def req(i: int) -> ChatRequest:
        return ChatRequest([{"role": "user", "content": f"{PROMPT}{i}"}], max_tokens=256)

    await c.chat(ep, req(-1))
    c0 = _cpu()
    await asyncio.gather(*(c.chat(ep, req(i)) for i in range(n)))
    per = (_cpu() - c0) / n
    await c.aclose()
    return per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--latency", type=float, default=0.02)
    ap.add_argument("--base-src", type=Path, default=None, help="also the client of DIR/src")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, url = args.worker
        fn = _floor if kind == "floor" else _ccpo
        print(asyncio.run(fn(url, args.calls, args.concurrency)))
        return

    up = subprocess.Popen(
        [sys.executable, str(HERE / "_upstream.py"), str(args.latency)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert up.stdout is not None
    url = up.stdout.readline().strip()
    variants = {"floor": {}, "ccpo": {}}
    if args.base_src is not None:
        variants["ccpo@base"] = {"PYTHONPATH": str(args.base_src.resolve() / "src")}
    runs: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for rep in range(args.reps):
            for name, env in variants.items():
                cmd = [sys.executable, __file__, "--worker", name.split("@")[0], url, "--calls",
                       str(args.calls), "--concurrency", str(args.concurrency)]  # fmt: skip
                out = subprocess.run(
                    cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True
                )
                runs[name].append(float(out.stdout.strip().splitlines()[-1]))
                print(f"rep {rep} {name}: {1e3 * runs[name][-1]:.3f} ms CPU per call", flush=True)
    finally:
        up.terminate()
        up.wait(timeout=20)
    floor = statistics.median(runs["floor"])
    print(f"\nmedians of {args.reps} interleaved repetitions, {args.calls} calls each:")
    for name, r in runs.items():
        m = statistics.median(r)
        print(f"  {name:<10} {1e3 * m:.3f} ms CPU per call ({m / floor:.2f} x floor)")


if __name__ == "__main__":
    main()
