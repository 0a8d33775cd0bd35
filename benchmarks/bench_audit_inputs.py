"""The audit's three input scenarios against real ``ccpo serve`` processes, with a scripted
upstream on 127.0.0.1 that keeps its own bill. Run it once per tree (before and after):

    python benchmarks/bench_audit_inputs.py --tree /path/to/ccpo [--out results.json]

``--tree``: the checkout whose ``ccpo serve`` is measured (its ``src`` first on the path);
this harness (upstream, clients, PostgreSQL cluster with fsync on) is this checkout's.

1. ``flood``: PostgreSQL; 8 clients ask questions for 15 s while another sends 24 feedbacks
   whose id holds a NUL (one every 0.625 s, inside a feedback limit of 120/min). Figures:
   the other clients' 503 share, bare (non-JSON) 500s, ``/healthz`` degraded samples, and
   what was paid for questions then not answered.
2. ``no_usage``: SQLite, ``max_cost_total: 0.30``; the upstream omits ``usage`` and bills a
   token per digit; digit-heavy questions until the budget refuses. Figures: billed vs
   recorded, billed as a share of the cap.
3. ``schema``: PostgreSQL, one replica serving questions and feedback; after 3 s a newer
   ccpo's conversion is simulated (the version raised, and a counter added to the state
   row as a newer version would write it). Figures: answers acknowledged after it (written
   into a schema the replica does not know), bare 500s, JSON 503s naming the versions,
   money left in the replica's lease after it stopped, and recorded vs billed once a
   successor (this tree, the conversion undone) has settled that lease.
   ``schema_version_only``: the same with the version raised alone (a conversion that
   changed nothing the old replica reads).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml
from _world import base, guide
from bench_serve import make_policy

from ccpo.testing import free_port, wait_for_http
from ccpo.testing.postgres import PostgresCluster
from ccpo.testing.scripted_server import ScriptedServer
from ccpo.traces.prices import read_price_file, write_price_file

PRICES = {"bench-base": (0.1, 0.4), "bench-guide": (2.5, 10.0)}  # USD per million tokens
_DIGITS = re.compile(r"\d|[^\d\s]+|\s+")


def digit_tokens(text: str) -> int:
    """The upstream's own count of a prompt: each digit a token (as many tokenizers do),
    each other run of characters one, and its chat template's few."""
    return len(_DIGITS.findall(text)) + 4


class Serve:
    """One ``ccpo serve`` process of the tree under test."""

    def __init__(self, tree: Path, policy: Path, config: Path, state: str, name: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONUNBUFFERED": "1"}
        for attempt in range(3):  # (a free port may be taken by another process meanwhile)
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ccpo", "serve", "--policy", str(policy), "--config",
                 str(config), "--port", str(self.port), "--state", state, "--replica", name,
                 "--log-level", "error"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                wait_for_http(self.url + "/healthz", self.proc, 120, f"replica {name}")
                return
            except RuntimeError as e:
                print(f"  replica {name} did not start ({e}); again", flush=True)
                if attempt == 2:
                    raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def question(k: int, i: int, digits: bool = False) -> str:
    if digits:
        a, b = 10**11 + 7919 * (97 * k + i), 10**11 + 104729 * (31 * i + k)
        opts = [a + b, a + b + 10, a - b, a + b - 100]
        return f"Question {k}-{i}: what is {a} + {b}?\n" + "\n".join(
            f"{'ABCD'[j]}. {o}" for j, o in enumerate(opts)
        )
    return f"Question {k}-{i}: which option is right?\nA. one\nB. two\nC. three\nD. four"


def load(
    url: str, seconds: float, clients: int = 8, digits: bool = False, refused: int | None = None
) -> dict:
    """``clients`` threads asking distinct questions for ``seconds`` (or until ``refused``
    were not answered); every response's status, whether it was JSON, its error type and
    cost, and the time."""
    out: list[dict] = []
    end = time.monotonic() + seconds

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            i = 0
            while time.monotonic() < end:
                if refused is not None and sum(r["status"] != 200 for r in out) >= refused:
                    return
                t = time.monotonic()
                r = http.post("/v1/answer", json={"question": question(k, i, digits)})
                out.append(describe(r, t))
                i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"responses": out}


def describe(r: httpx.Response, t: float) -> dict:
    is_json = r.headers.get("content-type", "").startswith("application/json")
    body = r.json() if is_json else {}
    err = body.get("error") or {}
    return {"t": t, "status": r.status_code, "json": is_json, "type": err.get("type"),
            "message": err.get("message"), "cost": body.get("cost_usd", 0.0)}  # fmt: skip


def billed(world: ScriptedServer, prices: Path) -> float:
    table = read_price_file(prices)
    return sum(table.cost(m, i, o) for m, (i, o) in dict(world.billed).items())


def config(tmp: Path, llm: str, prices: Path, name: str, **server) -> Path:
    cfg = {"task": "mmlu", "base_model": "bench-base", "base_url": llm,
           "guide_model": "bench-guide", "guide_url": llm, "prices": [str(prices)],
           "concurrency": 16, "timeout": 30, "kappa": 0.3,
           "server": {"reservation_expiry": 5.0, **server.pop("server", {})}, **server}  # fmt: skip
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def counts(rs: list[dict]) -> dict:
    """Responses by status (and error type; "bare": not JSON), with one message of each."""
    by: dict[str, int] = {}
    for r in rs:
        key = str(r["status"]) + ("" if r["json"] else " bare")
        key += f" {r['type']}" if r["type"] else ""
        if key not in by and r["message"]:
            print(f"  {key}: {r['message'][:300]}", flush=True)
        by[key] = by.get(key, 0) + 1
    return by


def flood(
    tree: Path, tmp: Path, policy: Path, pg: PostgresCluster, world, llm: str, prices: Path
) -> dict:
    cfg = config(tmp, llm, prices, "flood", server={"feedback_per_minute": 120})
    srv = Serve(tree, policy, cfg, pg.new_database(), "flood")
    try:
        b0 = billed(world, prices)
        health: list[str] = []
        fb: list[dict] = []
        done = threading.Event()

        def attack() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                for i in range(24):
                    t = time.monotonic()
                    body = {"id": f"x{i}\x00y", "none_of_them": True}
                    fb.append(describe(http.post("/v1/feedback", json=body), t))
                    done.wait(0.625)

        def watch() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                while not done.is_set():
                    health.append(http.get("/healthz").json()["status"])
                    done.wait(0.1)

        side = [threading.Thread(target=attack), threading.Thread(target=watch)]
        for t in side:
            t.start()
        rs = load(srv.url, 15.0)["responses"]
        done.set()
        for t in side:
            t.join()
        time.sleep(2.0)  # calls cut off by a 503 finish and are billed
        paid = billed(world, prices) - b0
        answered = sum(r["cost"] for r in rs if r["status"] == 200)
        return {
            "questions": len(rs),
            "codes": counts(rs),
            "share_503": round(sum(r["status"] == 503 for r in rs) / max(1, len(rs)), 4),
            "bare_500": sum(r["status"] == 500 and not r["json"] for r in rs + fb),
            "feedback_codes": counts(fb),
            "healthz_degraded": f"{sum(h != 'ok' for h in health)}/{len(health)}",
            "billed_usd": round(paid, 6),
            "paid_not_answered_usd": round(max(0.0, paid - answered), 6),
        }
    finally:
        srv.stop()


def no_usage(tree: Path, tmp: Path, policy: Path, llm: str, prices: Path, world) -> dict:
    cap = 0.30
    cfg = config(tmp, llm, prices, "usage", max_cost_total=cap)
    state = str(tmp / "usage.sqlite")
    srv = Serve(tree, policy, cfg, state, "usage")
    try:
        b0 = billed(world, prices)
        rs = load(srv.url, 300.0, digits=True, refused=8)["responses"]
        time.sleep(2.0)
        m = httpx.get(srv.url + "/metrics.json", timeout=30).json()
        paid = billed(world, prices) - b0
        return {
            "cap_usd": cap,
            "questions": len(rs),
            "codes": counts(rs),
            "billed_usd": round(paid, 6),
            "recorded_usd": round(m["dollars_spent"], 6),
            "recorded_over_billed": round(m["dollars_spent"] / paid, 4) if paid else None,
            "billed_over_cap": round(paid / cap, 4),
        }
    finally:
        srv.stop()


def schema(
    tree: Path,
    tmp: Path,
    policy: Path,
    pg: PostgresCluster,
    world,
    llm: str,
    prices: Path,
    counter: bool = True,
) -> dict:
    import psycopg

    cfg = config(tmp, llm, prices, "schema", server={"feedback_per_minute": 1e9})
    url = pg.new_database()
    srv = Serve(tree, policy, cfg, url, "old")
    converted: list[float] = []
    try:
        b0 = billed(world, prices)

        def convert() -> None:
            time.sleep(3.0)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("UPDATE ccpo_meta SET value = '99' WHERE key = 'schema_version'")
                if counter:  # a newer version's counter in the state row
                    row = conn.execute("SELECT counters FROM ccpo_state WHERE id = 1").fetchone()
                    c = {**json.loads(row[0]), "refunded_usd": 0.0}
                    sql = "UPDATE ccpo_state SET counters = %s WHERE id = 1"
                    conn.execute(sql, (json.dumps(c),))
            converted.append(time.monotonic())

        side = threading.Thread(target=convert)
        side.start()
        fbs: list[dict] = []
        rs = load(srv.url, 10.0)["responses"]
        side.join()
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            for i in range(20):
                t = time.monotonic()
                body = {"id": f"unknown-{i}", "none_of_them": True}
                fbs.append(describe(http.post("/v1/feedback", json=body), t))
        after = [r for r in rs if r["t"] >= converted[0]]
    finally:
        srv.stop()
    time.sleep(1.0)
    with psycopg.connect(url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT COALESCE(SUM(reserved_usd), 0), COALESCE(SUM(inflight_usd), 0) FROM ccpo_leases"
        ).fetchone()
        # the successor: the conversion undone, so that this tree's replica stands for the
        # newer ccpo; it settles the old replica's lease once it expires
        conn.execute("UPDATE ccpo_meta SET value = '4' WHERE key = 'schema_version'")
        row = conn.execute("SELECT counters FROM ccpo_state WHERE id = 1").fetchone()
        c = json.loads(row[0])
        c.pop("refunded_usd", None)
        conn.execute("UPDATE ccpo_state SET counters = %s WHERE id = 1", (json.dumps(c),))
    new = Serve(tree, policy, cfg, url, "new")
    try:
        time.sleep(8.0)  # the old lease expires (5 s) and a heartbeat ends it
        m = httpx.get(new.url + "/metrics.json", timeout=30).json()
    finally:
        new.stop()
    named = [r for r in after + fbs if r["status"] == 503 and "99" in (r["message"] or "")]
    return {
        "questions_after_conversion": len(after),
        "codes_after": counts(after),
        "feedback_codes_after": counts(fbs),
        "acknowledged_into_newer_schema": sum(r["status"] == 200 for r in after),
        "bare_500": sum(r["status"] == 500 and not r["json"] for r in after + fbs),
        "json_503_naming_versions": len(named),
        "example_message": (named[0]["message"] if named else None),
        "lease_left_reserved_usd": round(float(left[0]), 6),
        "lease_left_inflight_usd": round(float(left[1]), 6),
        "billed_usd": round(billed(world, prices) - b0, 6),
        "recorded_after_successor_usd": round(m["dollars_spent"], 6),
        "reserved_after_successor_usd": round(m["reserved_usd"], 6),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    names = ["flood", "no_usage", "schema", "schema_version_only"]
    ap.add_argument("--only", choices=names, action="append")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    prices = write_price_file(tmp / "prices.json", PRICES, "benchmark")
    policy = make_policy(tmp / "policy")
    rules = [(r"^Evaluate the answer\.", guide)]
    plain = ScriptedServer(rules=rules, fallback=base, latency=0.05).start()
    bare = ScriptedServer(
        rules=rules, fallback=base, latency=0.05, usage=False, prompt_tokens=digit_tokens
    ).start()
    only = set(args.only or names)
    out: dict = {"tree": str(args.tree)}
    try:
        with PostgresCluster(fsync=True) as pg:
            if "flood" in only:
                out["flood"] = flood(args.tree, tmp, policy, pg, plain, plain.url, prices)
                print("flood", out["flood"], flush=True)
            if "no_usage" in only:
                out["no_usage"] = no_usage(args.tree, tmp, policy, bare.url, prices, bare)
                print("no_usage", out["no_usage"], flush=True)
            if "schema" in only:
                out["schema"] = schema(args.tree, tmp, policy, pg, plain, plain.url, prices)
                print("schema", out["schema"], flush=True)
            if "schema_version_only" in only:
                out["schema_version_only"] = schema(
                    args.tree, tmp, policy, pg, plain, plain.url, prices, counter=False
                )
                print("schema_version_only", out["schema_version_only"], flush=True)
    finally:
        plain.stop()
        bare.stop()
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
