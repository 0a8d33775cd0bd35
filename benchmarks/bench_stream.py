"""Time to first token and total latency of a chat reply through ``ccpo serve``, against a
direct call to the strongest model.

    python benchmarks/bench_stream.py [--conversations 40] [--first-token 0.3] [--per-word 0.005]

A scripted chat world (three models; each reply 60-260 words, the strongest's the reference;
3 conversations in 5 hard, which the weaker models mostly get wrong, and which say so)
is collected on a 2-round ``agree`` ladder (small-m/mid-m, small-m/big-m: a question routed to
round 2 skips mid-m), and two single-answer
policies are trained on it at α = 0.2 (labels: big-m's reply): a cascade (``cstop``) and a
routed one (``cstop --route``). Then a scripted upstream on 127.0.0.1 that takes
``--first-token`` seconds to its first token and ``--per-word`` seconds a word after it, and
honours ``max_tokens``, serves every model; each policy is served by its own ``ccpo serve``.
For each held-out conversation, in turn (interleaved, one request at a time), the client
streams

- **direct**: the conversation straight to big-m (``stream: true``);
- **routed** and **cascade**: the conversation to ``ccpo serve`` (``stream: true``);
- **routed, hedged**: the routed policy with ``hedge_above`` (round 2's guide sent beside
  round 1 when the router's chance of going on is above it); its cost is the dollars the
  server paid, cancelled calls (at their worst case: ``reply_max_tokens`` 400, above the
  longest reply, in every ccpo run) included;
- **routed, unstreamed** and **cascade, unstreamed**: the same without streaming (what every
  request waited for before a decided reply streamed through: its first token comes with the
  whole reply);

and records the time to the first content chunk and to the last byte, and the cost (usage x
price; direct: big-m's). Every reply is checked against the world's logged reply of the
model whose reply it is, in full (not cut, ``finish_reason`` stop). Prints p50 / p95 and the
ratios to direct.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from ccpo.llm.collect import collect
from ccpo.llm.config import build_config
from ccpo.testing import free_port, wait_for_http
from ccpo.testing.scripted_server import ScriptedServer, tokenize
from ccpo.traces.prices import write_price_file

SYSTEM = "You are the support bot of Acme."
LADDER = [
    {"base": "small-m", "guide": "mid-m", "verdict": "agree"},
    {"base": "small-m", "guide": "big-m", "verdict": "agree"},
]
#: % of conversations a model answers as big-m does, on easy and on hard ones (3 in 5 are
#: hard, and say so in their last turn: a router can tell them)
SKILL = {"small-m": (90, 5), "mid-m": (95, 20), "big-m": (100, 100)}
CHAT = "/v1/chat/completions"
HARD = "Same options, but for a customs dispute across three countries."
PRICES = {"small-m": (0.1, 0.4), "mid-m": (2.0, 8.0), "big-m": (5.0, 20.0)}  # $/M in, out


def conversation(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"My order {i} is late. Options?"},
        {"role": "assistant", "content": f"For order {i}: refund, or wait two days."},
        {"role": "user", "content": HARD if i % 5 < 3 else "Same options."},
    ]


def reply(req: dict) -> str:
    """A model's reply: big-m's (the reference) on :data:`SKILL` % of orders, else one of its
    own; 60-260 words."""
    first = next(m["content"] for m in req["messages"] if m["role"] == "user")
    i, model = int(first.split()[2]), req["model"]
    hard = req["messages"][-1]["content"] == HARD
    h = int(hashlib.sha256(f"{model}/{i}".encode()).hexdigest()[:4], 16) % 100
    who = "big-m" if h < SKILL.get(model, (100, 100))[hard] else model
    words = 60 + int(hashlib.sha256(f"len/{who}/{i}".encode()).hexdigest()[:4], 16) % 200
    return f"Order {i} ({who}):" + "".join(f" step{k}" for k in range(words)) + "\n"


def train(d: Path, n: int) -> dict[str, Path]:
    with (d / "conversations.jsonl").open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"conv-{i}", "messages": conversation(i)}) + "\n")
    write_price_file(d / "prices.json", PRICES, "bench")
    with ScriptedServer(fallback=reply) as srv:
        values = dict(task="chat", data=str(d / "conversations.jsonl"), ladder=LADDER,
                      endpoints={"*": {"url": srv.url}}, reference="big-m",
                      prices=[str(d / "prices.json")], out=str(d / "chat.jsonl"),
                      no_cache=True, concurrency=16, timeout=30.0)  # fmt: skip
        assert collect(build_config(None, values), progress=False).done
    out = {}
    for name, extra in (("cascade", ()), ("routed", ("--route",))):
        subprocess.run(
            [sys.executable, "-m", "ccpo", "train", "--traces", str(d / "chat.jsonl"),
             "--prices", str(d / "prices.json"), "--method", "cstop", "--answer", "single",
             "--alpha", "0.2", *extra, "--out", str(d / name)],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        out[name] = d / name
    return out


def serve(
    d: Path, name: str, policy: Path, upstream: str, **extra: object
) -> tuple[subprocess.Popen, str]:
    cfg = d / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "endpoints": {"*": {"url": upstream}}, "prices": [str(d / "prices.json")],
        "timeout": 60.0, "server": {"state": str(d / f"{name}.sqlite")},
        "reply_max_tokens": 400, **extra,  # above the longest reply (about 265 tokens)
    }))  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy), "--config", str(cfg),
         "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_for_http(url + "/healthz", proc, 120, "ccpo serve")
    return proc, url


def streamed(client: httpx.Client, url: str, body: dict) -> tuple[float, float, str, dict]:
    """(time to first content chunk, total, content, last chunk with usage or ccpo)."""
    t0 = time.perf_counter()
    ttft, parts, last = None, [], {}
    with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            piece = (c["choices"][0]["delta"].get("content") if c.get("choices") else None) or ""
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            parts.append(piece)
            if (
                c.get("usage")
                or c.get("ccpo")
                or (c.get("choices") and c["choices"][0].get("finish_reason"))
            ):
                last = {**last, **c}
    total = time.perf_counter() - t0
    return (ttft if ttft is not None else total), total, "".join(parts), last


def whole(client: httpx.Client, url: str, body: dict) -> tuple[float, float, str, dict]:
    t0 = time.perf_counter()
    r = client.post(url, json=body)
    r.raise_for_status()
    took = time.perf_counter() - t0
    j = r.json()
    return took, took, j["choices"][0]["message"]["content"], j


def spent_delta(url: str, before: float) -> float:
    """The dollars a server paid since ``before`` (its total then): cancelled calls too."""
    return httpx.get(url + "/metrics.json").json()["dollars_spent"] - before


def q(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=40, help="held-out conversations")
    ap.add_argument("--train", type=int, default=200, help="conversations collected to train")
    ap.add_argument("--first-token", type=float, default=0.3, help="s to the first token")
    ap.add_argument("--per-word", type=float, default=0.005, help="s a word after it")
    ap.add_argument("--hedge-above", type=float, default=0.3, help="the hedged run's level")
    args = ap.parse_args()
    rows: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        policies = train(d, args.train)
        world = ScriptedServer(fallback=reply, first_token_latency=args.first_token,
                               token_latency=args.per_word)  # fmt: skip
        with world:
            procs = {name: serve(d, name, p, world.url) for name, p in policies.items()}
            procs["hedged"] = serve(d, "hedged", policies["routed"], world.url,
                                    hedge_above=args.hedge_above)  # fmt: skip
            try:
                client = httpx.Client(timeout=120)
                hedged_spent = 0.0
                for i in range(10_000, 10_000 + args.conversations):
                    msgs = conversation(i)
                    ccpo = {"model": "ccpo", "messages": msgs}
                    runs = [
                        ("direct (big-m)", streamed, world.url + "/chat/completions",
                         {"model": "big-m", "messages": msgs, "stream": True, "temperature": 0,
                          "stream_options": {"include_usage": True}}),
                        ("ccpo routed", streamed, procs["routed"][1] + CHAT,
                         {**ccpo, "stream": True}),
                        ("ccpo cascade", streamed, procs["cascade"][1] + CHAT,
                         {**ccpo, "stream": True}),
                        (f"ccpo routed, hedged above {args.hedge_above}", streamed,
                         procs["hedged"][1] + CHAT, {**ccpo, "stream": True}),
                        ("ccpo routed, unstreamed", whole, procs["routed"][1] + CHAT, ccpo),
                        ("ccpo cascade, unstreamed", whole, procs["cascade"][1] + CHAT, ccpo),
                    ]  # fmt: skip
                    for name, run, url, body in runs:
                        ttft, total, content, last = run(client, url, body)
                        row = rows.setdefault(name, {"ttft": [], "total": [], "cost": [],
                                                     "whole": [], "rounds": []})  # fmt: skip
                        if "ccpo" in last:
                            s = last["ccpo"]
                            cost, rounds = s["cost_usd"], s["rounds"]
                            if "hedged" in name:  # what the cancelled calls cost (worst case)
                                cost = spent_delta(procs["hedged"][1], hedged_spent)
                                hedged_spent += cost
                            finish = (last["choices"][0] or {}).get("finish_reason")
                        else:
                            u = last["usage"]
                            cost = (
                                u["prompt_tokens"] * PRICES["big-m"][0]
                                + u["completion_tokens"] * PRICES["big-m"][1]
                            ) / 1e6
                            rounds, finish = 0, last["choices"][0]["finish_reason"] if last.get(
                                "choices") else "stop"  # fmt: skip
                        logged = {reply({"model": m, "messages": msgs}) for m in SKILL}
                        row["whole"].append(content in logged and finish == "stop"
                                            and len(tokenize(content)) > 60)  # fmt: skip
                        row["ttft"].append(ttft)
                        row["total"].append(total)
                        row["cost"].append(cost)
                        row["rounds"].append(rounds)
                m = httpx.get(procs["hedged"][1] + "/metrics.json").json()
                hedges = (m["hedged"], m["hedges_cancelled"])
            finally:
                for proc, _ in procs.values():
                    proc.terminate()
                    proc.communicate(timeout=30)
    direct = rows["direct (big-m)"]
    d50, dt50, dcost = q(direct["ttft"], 50), q(direct["total"], 50), np.mean(direct["cost"])
    print(f"{args.conversations} conversations, one at a time; upstream: {args.first_token} s "
          f"to the first token, then {args.per_word * 1000:.0f} ms a word\n")  # fmt: skip
    print(f"hedged run: {hedges[0]} guide calls sent ahead, {hedges[1]} of them cancelled\n")
    print(
        "| run | TTFT p50 | TTFT p95 | TTFT p50 ÷ direct | total p50 | total p95 | "
        "total p50 ÷ direct | mean rounds | cost / conversation | saving vs direct | "
        "whole replies |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        cost = float(np.mean(r["cost"]))
        print(f"| {name} | {q(r['ttft'], 50):.3f} s | {q(r['ttft'], 95):.3f} s | "
              f"{q(r['ttft'], 50) / d50:.2f}× | {q(r['total'], 50):.3f} s | "
              f"{q(r['total'], 95):.3f} s | {q(r['total'], 50) / dt50:.2f}× | "
              f"{np.mean(r['rounds']):.2f} | ${cost:.6f} | {1 - cost / dcost:+.0%} | "
              f"{sum(r['whole'])}/{len(r['whole'])} |")  # fmt: skip


if __name__ == "__main__":
    main()
