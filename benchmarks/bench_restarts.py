"""Money through restarts, shared host names and the end of a budget: the audit's scenarios
against real ``ccpo serve`` processes, the scripted LLM world in its own process (it keeps its
own bill: the tokens it served) and a throw-away PostgreSQL cluster (fsync off).

    python benchmarks/bench_restarts.py [--only restart,namespaces,dead,end,local] [--out F]

Run it once on the tree under test and once with ``PYTHONPATH=<old tree>/src`` for the
figures before (the replicas run whatever ``ccpo`` the environment imports).

- ``restart``: a replica alone on SQLite, ``--replica r0``, 8 questions in flight, kill -9,
  the same command again, more questions, a clean stop and one more start: the money left
  reserved, and the spend recorded against the bill;
- ``namespaces``: two replicas of one host name, B in a PID namespace of its own
  (``unshare``), 16 clients for 20 s with a 4 s lease expiry: the spend recorded against the
  bill (B judged A's pid gone and ended its live lease at every heartbeat);
- ``dead``: B (another PID namespace: "another host") holds the budget's room in calls and is
  killed; 8 questions at A: their longest wait, their answers (503 and its Retry-After);
- ``end``: caps of one and two questions' worth, 16 clients at once on a fresh replica: the
  share of the spend that went to questions refused part way;
- ``local``: B on the same host (same PID namespace) killed holding money, A idle: how long
  until A has ended B's lease (the docs say "at once").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from _world import start_world
from bench_replicas import PRICES, billed_usd
from bench_serve import make_policy

from ccpo.testing import free_port, wait_for_http
from ccpo.testing.postgres import PostgresCluster
from ccpo.traces.prices import write_price_file

Q = "Question {}: which option is right?\nA. one\nB. two\nC. three\nD. four"
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]


class Serve:
    """One ``ccpo serve`` process (``wrap``: a command it runs under, e.g. ``unshare``)."""

    def __init__(self, cfg: Path, policy: Path, state: str, name: str, wrap=()) -> None:
        self.cfg, self.policy, self.state, self.name, self.wrap = cfg, policy, state, name, wrap
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Serve:
        self.proc = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "ccpo", "serve", "--policy", str(self.policy),
             "--config", str(self.cfg), "--port", str(self.port), "--state", self.state,
             "--replica", self.name, "--log-level", "error"],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for_http(self.url + "/healthz", self.proc, 90, f"replica {self.name}")
        return self

    def metrics(self) -> dict:
        return httpx.get(self.url + "/metrics.json", timeout=30).json()

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)  # (and what it runs under)
        self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def ask(urls: list[str], n: int, conc: int, tag: str, until: float | None = None) -> list:
    """``n`` questions (or as many as fit before ``until``), ``conc`` at once, round-robin:
    (status, seconds, body, Retry-After) each."""
    out: list = []
    sem = asyncio.Semaphore(conc)
    async with httpx.AsyncClient(timeout=300) as http:

        async def one(i: int) -> None:
            async with sem:
                if until is not None and time.monotonic() > until:
                    return
                t0 = time.monotonic()
                try:
                    r = await http.post(urls[i % len(urls)] + "/v1/answer",
                                        json={"question": Q.format(f"{tag}{i}")})  # fmt: skip
                except httpx.TransportError as e:
                    out.append((type(e).__name__, time.monotonic() - t0, None, None))
                    return
                out.append((r.status_code, time.monotonic() - t0, r.json(),
                            r.headers.get("retry-after")))  # fmt: skip

        await asyncio.gather(*(one(i) for i in range(n)))
    return out


def codes(res: list) -> dict:
    c: dict = {}
    for s, *_ in res:
        c[str(s)] = c.get(str(s), 0) + 1
    return c


class Bench:
    def __init__(self, tmp: Path, pg: PostgresCluster) -> None:
        self.tmp, self.pg = tmp, pg
        self.policy = make_policy(tmp / "policy")
        self.prices = write_price_file(tmp / "prices.json", PRICES, "benchmark")
        flat = dict.fromkeys(PRICES, (1.0, 4.0))
        self.flat = write_price_file(tmp / "flat.json", flat, "benchmark")
        self.worlds: list[subprocess.Popen] = []
        self.running: list[Serve] = []

    def world(self, latency: float) -> tuple[str, str]:
        proc, url = start_world(latency)
        self.worlds.append(proc)
        return url, url.removesuffix("/v1")

    def config(self, name: str, llm: str, **kw) -> Path:
        cfg = {"task": "mmlu", "base_model": "bench-base", "base_url": llm,
               "guide_model": "bench-guide", "guide_url": llm, "prices": [str(self.prices)],
               "concurrency": 64, "timeout": 60, "kappa": 0.3,
               "server": {"feedback_per_minute": 1e9, **kw.pop("server", {})}, **kw}  # fmt: skip
        p = self.tmp / f"{name}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        return p

    def serve(self, cfg: Path, state: str, name: str, wrap=()) -> Serve:
        s = Serve(cfg, self.policy, state, name, wrap).start()
        self.running.append(s)
        return s

    def close(self) -> None:
        for s in self.running:
            s.stop()
        for w in self.worlds:
            w.terminate()

    # ------------------------------------------------------------------ the scenarios
    def restart(self) -> dict:
        llm, root = self.world(1.0)
        cfg = self.config("restart", llm)
        state = str(self.tmp / "restart.sqlite")
        r0 = self.serve(cfg, state, "r0")
        asyncio.run(ask([r0.url], 2, 1, "warm-"))  # what a question costs is known
        bg = subprocess.Popen([sys.executable, "-c", _BACKGROUND, r0.url], env=os.environ)
        _held(r0)  # 8 questions with calls in flight
        time.sleep(0.5)
        r0.kill9()
        bg.wait(timeout=120)
        r0 = self.serve(cfg, state, "r0")  # the same command again
        after = r0.metrics()
        asyncio.run(ask([r0.url], 4, 2, "more-"))
        r0.stop()
        r0 = self.serve(cfg, state, "r0")
        time.sleep(1.0)
        m = r0.metrics()
        r0.stop()
        billed = billed_usd(root, self.prices)
        return {
            "reserved_usd_after_restart": after["reserved_usd"],
            "reserved_usd_after_clean_stop_and_restart": m["reserved_usd"],
            "inflight_usd_after_clean_stop_and_restart": m["inflight_usd"],
            "spent_usd": m["dollars_spent"],
            "billed_usd": billed,
            "spent_minus_billed_usd": m["dollars_spent"] - billed,
        }

    def namespaces(self, seconds: float = 20.0) -> dict:
        llm, root = self.world(0.3)
        cfg = self.config("ns", llm, server={"reservation_expiry": 4.0})
        state = self.pg.new_database()
        a = self.serve(cfg, state, "a")
        b = self.serve(cfg, state, "b", wrap=UNSHARE)
        res = asyncio.run(ask([a.url, b.url], 10_000, 16, "ns-", time.monotonic() + seconds))
        time.sleep(1.0)
        m = a.metrics()
        a.stop()
        b.stop()
        billed = billed_usd(root, self.prices)
        return {
            "answered": sum(1 for s, *_ in res if s == 200),
            "codes": codes(res),
            "spent_usd": m["dollars_spent"],
            "billed_usd": billed,
            "overstated_pct": round(100 * (m["dollars_spent"] / billed - 1), 2),
        }

    def dead(self, cap: float) -> dict:
        llm, _ = self.world(3.0)
        cfg = self.config("dead", llm, max_cost_total=cap, server={"reservation_expiry": 60.0})
        state = self.pg.new_database()
        a = self.serve(cfg, state, "a")
        b = self.serve(cfg, state, "b", wrap=UNSHARE)
        asyncio.run(ask([a.url, b.url], 2, 1, "warm-"))
        bg = subprocess.Popen([sys.executable, "-c", _BACKGROUND, b.url, "16"], env=os.environ)
        _held(a)  # B's questions are admitted, as many as fit, and call
        time.sleep(2.0)
        held = a.metrics()["reserved_usd"]
        b.kill9()
        bg.wait(timeout=300)
        t0 = time.monotonic()
        res = asyncio.run(ask([a.url], 8, 8, "wait-"))
        a.stop()
        return {
            "cap_usd": cap,
            "held_by_dead_replica_usd": held,
            "codes": codes(res),
            "longest_wait_s": round(max(dt for _, dt, *_ in res), 1),
            "all_answered_within_s": round(time.monotonic() - t0, 1),
            "retry_after": sorted({ra for *_, ra in res if ra}),
            "error_types": sorted({b["error"]["type"] for s, _, b, _ in res if b and s != 200}),
        }

    def end(self) -> dict:
        llm, _ = self.world(0.05)
        # 4 rounds a question, a call's worst case near what it costs (short replies, input
        # and output at the tests' prices): a budget of a question or two can pay one
        kw = {"kappa": 0.0, "max_tokens": 16, "prices": [str(self.flat)]}
        probe = self.serve(self.config("probe-end", llm, **kw), str(self.tmp / "p.db"), "p")
        asyncio.run(ask([probe.url], 4, 1, "p-"))
        per_q = probe.metrics()["dollars_spent"] / 4
        probe.stop()
        out: dict = {"question_usd": per_q}
        for k in (1, 2):  # a budget one replica used; two replicas started on what is left
            cap = round((1 + k) * per_q * 1.1, 8)
            cfg = self.config(f"end{k}", llm, max_cost_total=cap, **kw)
            state = self.pg.new_database()
            first = self.serve(cfg, state, f"end{k}-0")
            paid = asyncio.run(ask([first.url], 1, 1, f"f{k}-"))[0][2]["cost_usd"]
            first.stop()
            rs = [self.serve(cfg, state, f"end{k}-{i}") for i in (1, 2)]
            res = asyncio.run(ask([r.url for r in rs], 16, 16, f"e{k}-"))
            m = rs[0].metrics()
            for r in rs:
                r.stop()
            answered = paid + sum(b["cost_usd"] for st, _, b, _ in res if st == 200)
            spent = m["dollars_spent"]
            out[f"left_{k}_questions"] = {
                "cap_usd": cap,
                "codes": codes(res),
                "spent_usd": spent,
                "spent_on_refused_usd": spent - answered,
                "refused_share_of_spend": round((spent - answered) / spent, 3) if spent else 0.0,
            }
        return out

    def local(self, repeats: int = 3) -> dict:
        llm, _ = self.world(5.0)
        cfg = self.config("local", llm)  # the default expiry: 120 s, a heartbeat every 30 s
        state = self.pg.new_database()
        a = self.serve(cfg, state, "a")
        out: dict = {"held_usd": [], "settled_after_s": []}
        for k in range(repeats):
            b = self.serve(cfg, state, f"b{k}")
            asyncio.run(ask([b.url], 1, 1, f"warm{k}-"))
            bg = subprocess.Popen([sys.executable, "-c", _BACKGROUND, b.url], env=os.environ)
            out["held_usd"].append(_held(a))
            b.kill9()
            t0 = time.monotonic()
            while a.metrics()["reserved_usd"] > 0 and time.monotonic() - t0 < 60:
                time.sleep(0.1)
            out["settled_after_s"].append(round(time.monotonic() - t0, 1))
            bg.kill()
        a.stop()
        return out


def _held(s: Serve, within: float = 30.0) -> float:
    """Once the state holds money (a background load's wallets): how much."""
    t0 = time.monotonic()
    while (held := s.metrics()["reserved_usd"]) <= 0 and time.monotonic() - t0 < within:
        time.sleep(0.1)
    return held


# a load in a process of its own: N (default 8) questions at once to URL, answers ignored
_BACKGROUND = """
import sys, threading, httpx
url, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
def one(i):
    try:
        httpx.post(url + "/v1/answer", json={"question": f"Question bg{i}: A. 1 B. 2"}, timeout=60)
    except Exception:
        pass
ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in ts]
[t.join() for t in ts]
"""

SCENARIOS = ("restart", "namespaces", "dead", "end", "local")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    ap.add_argument(
        "--dead-cap", type=float, default=0.05,
        help="max_cost_total of 'dead': low enough that the dead replica's wallets hold its "
        "room (0.05 for wallets of a ladder's worst case; 0.03 for the older estimates)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if shutil.which("unshare") is None:
        sys.exit("needs unshare (util-linux) for a PID namespace of its own")
    tmp = Path(tempfile.mkdtemp(prefix="bench-restarts-"))
    out: dict = {}
    with PostgresCluster(fsync=False) as pg:
        bench = Bench(tmp, pg)
        try:
            for name in args.only.split(","):
                run = getattr(bench, name)
                out[name] = run(args.dead_cap) if name == "dead" else run()
                print(name, json.dumps(out[name]), flush=True)
                bench.close()
                bench.running.clear()
                bench.worlds.clear()
        finally:
            bench.close()
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
