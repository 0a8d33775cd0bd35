"""End to end with a real small model: SmolLM2-135M under ``llama_cpp.server`` on 127.0.0.1.

Collects ``--n`` MMLU and ``--n`` HotpotQA traces (bundled subsets) with SmolLM2 as both base
and guide, then answers a few questions with ``ccpo ask``'s agent (a policy trained on
synthetic traces: this checks the live path, not the policy's quality). Prints wall times, LLM
calls, seconds per call and per-round base/guide accuracy. Needs ``pip install 'ccpo[llama]'``.

The base and the guide run in two servers: the guide's with ``--logits_all`` (its verdict
uncertainty comes from log-probs), the base's without (several times faster on CPU; the client
then records the base without log-prob features, as it would for any endpoint that has none).

    python benchmarks/bench_smollm2.py [--n 20] [--rounds 2] [--asks 3] [--tasks mmlu,hotpotqa]
        [--out-dir DIR]

With ``--out-dir`` the traces go to DIR/<task>.jsonl and a stopped run resumes where it was
(collection is append-only); the timings then cover only the questions this run collected.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.testing.llama_server import (
    MODEL,
    LlamaServer,
    find_smollm2_gguf,
    llama_server_available,
)
from ccpo.traces.io import read_traces
from ccpo.traces.prices import load_prices, write_price_file
from ccpo.traces.stats import trace_stats

QUESTIONS = [
    "Which planet is known as the Red Planet?\nA. Venus\nB. Mars\nC. Jupiter\nD. Saturn",
    "What is 7 times 8?\nA. 54\nB. 56\nC. 58\nD. 64",
    "Which gas do plants take in for photosynthesis?\nA. Oxygen\nB. Nitrogen\nC. Carbon "
    "dioxide\nD. Helium",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--asks", type=int, default=3)
    ap.add_argument("--tasks", default="mmlu,hotpotqa")
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args()
    why = llama_server_available()
    if why:
        sys.exit(f"cannot run: {why}")
    tmp = args.out_dir or Path(tempfile.mkdtemp(prefix="bench-smollm2-"))
    tmp.mkdir(parents=True, exist_ok=True)
    prices = write_price_file(tmp / "prices.json", {MODEL: (0, 0)}, "local model")
    table = load_prices(str(prices))
    gguf = find_smollm2_gguf()
    with LlamaServer(gguf, logits_all=False) as base, LlamaServer(gguf) as guide:
        print(f"llama_cpp.server x 2 up in {base.startup_s:.1f} + {guide.startup_s:.1f} s")
        for task in args.tasks.split(","):
            cfg = build_config(
                None,
                dict(
                    task=task, n=args.n, rounds=args.rounds, base_model=MODEL,
                    base_url=base.url, guide_model=MODEL, guide_url=guide.url,
                    out=str(tmp / f"{task}.jsonl"), no_cache=True, prices=[str(prices)],
                    concurrency=1, max_tokens=128, max_steps=4, timeout=300.0,
                ),
            )  # fmt: skip
            t0 = time.perf_counter()
            s = collect(cfg, progress=False)
            wall = time.perf_counter() - t0
            print(f"traces: {cfg.out}")
            st = trace_stats(read_traces(cfg.out), table)
            print(
                f"{task}: {s.done} questions x {args.rounds} rounds in {wall:.1f} s; "
                f"{s.calls} LLM calls ({wall / max(s.calls, 1):.2f} s/call); "
                f"solvable {st.solvable_rate:.2f}"
            )
            for r in st.table():
                print(
                    f"  round {r['round']}: base acc {r['base_acc']:.2f}, guide acc "
                    f"{r['guide_acc']:.2f}, guide 'yes' {r['verdict_yes']:.2f}, tokens "
                    f"base {r['base_tokens']:.0f} / guide {r['guide_tokens']:.0f}"
                )
        if args.asks:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.helpers.policies import make_policy

            from ccpo.runtime import ConformalAgent

            policy = make_policy(tmp / "policy", steps=30)
            cfg = dict(task="mmlu", base_model=MODEL, base_url=base.url, guide_model=MODEL,
                       guide_url=guide.url, prices=[str(prices)], timeout=300.0)  # fmt: skip
            with ConformalAgent.from_artifact(policy, cfg) as agent:
                for q in QUESTIONS[: args.asks]:
                    a = agent.answer(q)
                    print(
                        f"ask: {a.latency_ms / 1000:.1f} s, {a.rounds} rounds, answers "
                        f"{a.answers}, κ {a.kappa:.3f}: {q.splitlines()[0]}"
                    )


if __name__ == "__main__":
    main()
