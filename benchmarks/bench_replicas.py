"""Several replicas of ``ccpo serve`` on one PostgreSQL state: throughput, one budget, one κ,
and ``kill -9`` under load. Everything is real and on 127.0.0.1: a throw-away
PostgreSQL cluster (fsync on), the scripted LLM world in its own process (it counts the
tokens it bills), N ``ccpo serve`` processes, and this load generator, which spreads
questions round-robin over the replicas like a load balancer (a refused connection goes to
the next replica).

    python benchmarks/bench_replicas.py [--questions 2000] [--concurrency 64] [--latency 0.02]

Phases: (1) throughput: SQLite with 1 replica, PostgreSQL with 1 and 3 (requests/s, p50/p99
latency and the latency ccpo adds over the LLM calls' own time); (2) the budget over 3
replicas (spent ≤ budget, ≥ 90% of it); (3) 300 feedbacks round-robin, κ at every replica;
(4) faults: 3 replicas with a budget, feedback after every answer, replica 1 killed with
SIGKILL (and restarted) at one third of the load and replica 2 at two thirds; then every
acknowledged answer and feedback must be in the database, no lease past its expiry, the
recorded spend ≥ what the endpoints billed and ≤ the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml
from _world import start_world
from bench_serve import make_policy

from ccpo.testing import free_port, wait_for_http
from ccpo.testing.postgres import PostgresCluster
from ccpo.traces.prices import read_price_file, write_price_file

PRICES = {"bench-base": (0.1, 0.4), "bench-guide": (2.5, 10.0)}


class Replica:
    """One ``ccpo serve`` process."""

    def __init__(self, policy: Path, config: Path, state: str, name: str, *flags: str) -> None:
        self.policy, self.config, self.state, self.name = policy, config, state, name
        self.flags = flags
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Replica:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ccpo", "serve", "--policy", str(self.policy),
             "--config", str(self.config), "--port", str(self.port), "--state", self.state,
             "--replica", self.name, "--log-level", "error", *self.flags],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for_http(self.url + "/healthz", self.proc, 90, f"replica {self.name}")
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def billed_usd(world_url: str, prices_path: Path) -> float:
    """What the scripted endpoints billed so far (their token counts at the price table)."""
    table = read_price_file(prices_path)
    b = httpx.get(world_url + "/ccpo-billing").json()
    return sum(table.cost(m, i, o) for m, (i, o) in b.items())


async def drive(
    replicas: list[Replica],
    n: int,
    conc: int,
    prefix: str,
    feedback: bool = False,
    on_progress=None,
) -> dict:
    """``n`` questions, ``conc`` at once, round-robin over ``replicas`` (a refused or dropped
    connection: the next replica). Acknowledged answers and feedbacks are listed."""
    sem = asyncio.Semaphore(conc)
    lat, rounds, codes = [], [], {}
    acked, fb_acked = [], []
    done = [0]
    limits = httpx.Limits(max_connections=conc * 2, max_keepalive_connections=conc * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:

        async def post(i: int, path: str, body: dict) -> httpx.Response | None:
            for k in range(3 * len(replicas)):
                r = replicas[(i + k) % len(replicas)]
                try:
                    return await http.post(r.url + path, json=body)
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            return None

        async def one(i: int) -> None:
            qid = f"{prefix}{i}"
            q = f"Question {prefix}{i}: which option is right?\nA. one\nB. two\nC. three\nD. four"
            async with sem:
                t0 = time.perf_counter()
                r = await post(i, "/v1/answer", {"question": q, "id": qid})
                dt = time.perf_counter() - t0
                code = r.status_code if r is not None else "no replica"
                codes[code] = codes.get(code, 0) + 1
                if r is not None and r.status_code == 200:
                    a = r.json()
                    lat.append(dt)
                    rounds.append(a["rounds"])
                    acked.append(qid)
                    if feedback:
                        body = {"id": qid, "correct_answer": a["answers"][0]}
                        f = await post(i + 1, "/v1/feedback", body)
                        if f is not None and f.status_code in (200, 409):
                            fb_acked.append(qid)  # 409: applied already (a retried post)
                done[0] += 1
                if on_progress is not None:
                    on_progress(done[0])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    return {"lat": np.asarray(lat), "rounds": np.asarray(rounds), "codes": codes,
            "wall": wall, "acked": acked, "fb_acked": fb_acked}  # fmt: skip


def summary(res: dict, latency: float) -> dict:
    ms = res["lat"] * 1e3
    added = ms - 2 * res["rounds"] * latency * 1e3  # minus the LLM calls' own time
    return {
        "answered": len(ms),
        "codes": {str(k): v for k, v in res["codes"].items()},
        "requests_per_s": round(len(ms) / res["wall"], 1),
        "latency_ms_p50": round(float(np.percentile(ms, 50)), 1),
        "latency_ms_p99": round(float(np.percentile(ms, 99)), 1),
        "added_ms_p50": round(float(np.percentile(added, 50)), 1),
        "added_ms_p99": round(float(np.percentile(added, 99)), 1),
        "mean_rounds": round(float(res["rounds"].mean()), 3),
    }


def metrics(r: Replica) -> dict:
    return httpx.get(r.url + "/metrics.json", timeout=30).json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--latency", type=float, default=0.02, help="scripted LLM latency (s)")
    ap.add_argument("--expiry", type=float, default=5.0, help="reservation expiry (s)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    n, conc = args.questions, args.concurrency

    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    policy = make_policy(tmp / "policy")
    prices = write_price_file(tmp / "prices.json", PRICES, "benchmark")
    world, llm_url = start_world(args.latency)
    world_root = llm_url.removesuffix("/v1")
    out: dict = {"questions": n, "concurrency": conc, "llm_latency_s": args.latency}
    running: list[Replica] = []

    def config(name: str, **kw) -> Path:
        cfg = {"task": "mmlu", "base_model": "bench-base", "base_url": llm_url,
               "guide_model": "bench-guide", "guide_url": llm_url, "prices": [str(prices)],
               "concurrency": 64, "timeout": 30, "kappa": 0.3,
               "server": {"feedback_per_minute": 1e9, "reservation_expiry": args.expiry,
                          **kw.pop("server", {})}, **kw}  # fmt: skip
        p = tmp / f"{name}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        return p

    def start(k: int, cfg: Path, state: str, tag: str) -> list[Replica]:
        rs = [Replica(policy, cfg, state, f"{tag}-{i}").start() for i in range(k)]
        running.extend(rs)
        return rs

    def stop_all() -> None:
        for r in running:
            r.stop()
        running.clear()

    try:
        with PostgresCluster(fsync=True) as pg:
            # (1) throughput
            plain = config("plain")
            for label, k, state in (
                ("sqlite_1", 1, str(tmp / "s.sqlite")),
                ("postgres_1", 1, pg.new_database()),
                ("postgres_3", 3, pg.new_database()),
            ):
                rs = start(k, plain, state, label)
                asyncio.run(drive(rs, 40, 8, f"warm-{label}-"))
                out[label] = summary(asyncio.run(drive(rs, n, conc, f"{label}-")), args.latency)
                print(label, out[label], flush=True)
                stop_all()

            # (2) one budget over 3 replicas: about 60% of what n questions cost
            state = pg.new_database()
            rs = start(3, plain, state, "probe")
            asyncio.run(drive(rs, 100, 16, "probe-"))
            m = metrics(rs[0])
            cost_per_q = m["cost_usd"] / m["requests"]
            stop_all()
            budget = round(0.6 * n * cost_per_q, 4)
            rs = start(3, config("budget", max_cost_total=budget), pg.new_database(), "budget")
            b0 = billed_usd(world_root, prices)
            res = asyncio.run(drive(rs, n, conc, "budget-"))
            ms = [metrics(r) for r in rs]
            out["budget"] = {
                "budget_usd": budget,
                "spent_usd": ms[0]["dollars_spent"],
                "share_of_budget": round(ms[0]["dollars_spent"] / budget, 4),
                "billed_usd": billed_usd(world_root, prices) - b0,
                "spent_same_at_every_replica": len({x["dollars_spent"] for x in ms}) == 1,
                "answered": len(res["acked"]),
                "codes": {str(k): v for k, v in res["codes"].items()},
            }
            print("budget", out["budget"], flush=True)
            stop_all()

            # (3) one κ: 300 feedbacks round-robin
            adapt = config("adapt", server={"adapt_kappa": True, "kappa_min_feedback": 0})
            rs = start(3, adapt, pg.new_database(), "kappa")
            res = asyncio.run(drive(rs, 300, 32, "kappa-", feedback=True))
            ms = [metrics(r) for r in rs]
            out["kappa"] = {
                "feedbacks_acknowledged": len(res["fb_acked"]),
                "kappa_per_replica": {x["replica"]: x["kappa"] for x in ms},
                "feedback_per_replica": {x["replica"]: x["feedback"] for x in ms},
                "one_kappa": len({x["kappa"] for x in ms}) == 1,
            }
            print("kappa", out["kappa"], flush=True)
            stop_all()

            # (4) faults: kill -9 twice under load, with a budget and feedback
            fault_budget = round(0.8 * n * cost_per_q, 4)
            cfg = config("fault", max_cost_total=fault_budget, server={"adapt_kappa": True})
            state = pg.new_database()
            rs = start(3, cfg, state, "fault")
            b0 = billed_usd(world_root, prices)
            kills: list[str] = []

            def progress(done: int) -> None:
                for at, idx in ((n // 3, 1), (2 * n // 3, 2)):
                    if done == at:
                        victim = rs[idx]
                        victim.kill9()
                        kills.append(victim.name)
                        # restarted at once (as an orchestrator would), a new replica id
                        new = Replica(policy, cfg, state, f"{victim.name}-restarted")
                        new.port, new.url = victim.port, victim.url
                        asyncio.get_running_loop().run_in_executor(None, new.start)
                        running.append(new)

            res = asyncio.run(drive(rs, n, conc, "fault-", feedback=True, on_progress=progress))
            billed = billed_usd(world_root, prices) - b0
            time.sleep(args.expiry + 1.0)  # every dead lease is past its expiry now
            live = [r for r in running if r.proc is not None and r.proc.poll() is None]
            metrics(live[0])  # a read; the heartbeats (every expiry/4) have swept the leases
            time.sleep(args.expiry / 2)
            import psycopg

            with psycopg.connect(state) as conn:
                ids = {r[0] for r in conn.execute("SELECT id FROM ccpo_answers")}
                with_fb = {
                    r[0]
                    for r in conn.execute("SELECT id FROM ccpo_answers WHERE feedback IS NOT NULL")
                }
                counters = json.loads(
                    conn.execute("SELECT counters FROM ccpo_state WHERE id = 1").fetchone()[0]
                )
                now = conn.execute("SELECT extract(epoch from clock_timestamp())").fetchone()[0]
                leases = conn.execute(
                    "SELECT replica, reserved_usd, inflight_usd, expires FROM ccpo_leases"
                ).fetchall()
            out["fault"] = {
                "killed": kills,
                "budget_usd": fault_budget,
                "answers_acknowledged": len(res["acked"]),
                "answers_stored": len(set(res["acked"]) & ids),
                "feedbacks_acknowledged": len(res["fb_acked"]),
                "feedbacks_stored": len(set(res["fb_acked"]) & with_fb),
                "spent_recorded_usd": counters["spent_usd"],
                "billed_usd": billed,
                "spent_ge_billed": counters["spent_usd"] >= billed - 1e-9,
                "spent_le_budget": counters["spent_usd"] <= fault_budget * (1 + 1e-9),
                "reserved_usd_left": counters["reserved_usd"],
                "leases_past_expiry": sum(1 for x in leases if float(x[3]) < float(now)),
                "leases": [x[0] for x in leases],
                "codes": {str(k): v for k, v in res["codes"].items()},
                "kappa_per_replica": {x["replica"]: x["kappa"] for x in map(metrics, live)},
            }
            print("fault", out["fault"], flush=True)
            stop_all()
    finally:
        stop_all()
        world.terminate()
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
