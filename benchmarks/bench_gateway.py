"""``ccpo serve`` as a gateway, side by side with the floor.

    python benchmarks/bench_gateway.py [--reps 3] [--questions 1000] [--c1-questions 400]
    python benchmarks/bench_gateway.py --base-src /tmp/base   # + rows of another source tree

Everything is real and on 127.0.0.1, each in its own process: a scripted upstream
(``_upstream.py``: the MMLU world of ``_world.py`` served by aiohttp, ``--latency`` s per
call), the gateways under test, and this load generator (aiohttp). Rows:

- **floor**: ``_floor.py``, a ~20-line aiohttp pass-through replaying, for each question, the
  very LLM calls ccpo made for it (recorded once by the upstream before the measurements);
- **sqlite**: ``ccpo serve`` on a SQLite state file; **pg1** / **pg3**: on one PostgreSQL
  database (``ccpo.testing.postgres``, fsync on) with 1 and 3 replicas, questions spread
  round-robin as a load balancer would;
- **litellm**: the LiteLLM proxy (no database) in front of the upstream, the load generator
  replaying each question's calls through it; skipped unless ``litellm`` is installed;
- with ``--base-src DIR``: **sqlite@base** and **pg1@base**, ``ccpo serve`` run from the source
  tree ``DIR/src`` (e.g. ``git archive <commit> src | tar -x -C DIR``), to measure a change
  before/after in the same run; ``--base-hide uvloop,httptools`` hides those modules from it
  (a tree from before they were in the ``serve`` extra: uvicorn takes them when importable).

Every row gets a fresh state database per start (``ccpo serve``'s default config: no response
cache, no rate limit; ``--cap USD``: under a total budget, ``max_cost_total``). Per row and
repetition: every row is started and warmed up, and ``--c1-questions`` are asked one at a
time, each question of every row in turn (in a random order per question, so that the shared
machine's moments weigh on every row alike; no /healthz polling then); then row by row, a
fresh start, a warm-up and ``--questions`` at concurrency ``--concurrency`` (``--c64-rounds
K``: every row up at once, the questions asked in K rounds of every row in turn), while
/healthz is polled every 20 ms on a connection of its own, from a process of its own (a
probe's time is the gateway's, not the load generator's queueing). Reported,
as medians over ``--reps`` interleaved repetitions (rows in turn within each repetition):
answers/s at c=64, the latency added over the LLM calls' own time (the question's calls ×
``--latency``) p50 at c=1 and c=64, CPU per question of the gateway processes (and of
PostgreSQL), /healthz p99 under load, the store's PostgreSQL commits per question at c=1
(its write transactions, every replica's ``state_commits``; the idle spare wallet's release
included); then each row's
ratios to the floor and the targets (SQLite ≥ 0.6 × the floor's answers/s, PostgreSQL
1 replica ≥ 0.5 ×; added p50 at c=1 ≤ the floor's + 1.5 ms on SQLite, + 3 ms on PostgreSQL;
/healthz p99 ≤ 20 ms; PostgreSQL commits per question ≤ 1.5). The machine is shared: ratios within
one interleaved run are what counts, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np
import yaml
from bench_serve import make_policy

from ccpo.runtime.state.store import SPARE_IDLE_UNCAPPED_S
from ccpo.testing import free_port, wait_for_http
from ccpo.traces.prices import write_price_file

HERE = Path(__file__).resolve().parent
PRICES = {"bench-base": (0.1, 0.4), "bench-guide": (2.5, 10.0)}
CLK = os.sysconf("SC_CLK_TCK")


def question(i: int) -> str:
    return f"Question {i}: which option is right?\nA. one\nB. two\nC. three\nD. four"


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (/proc/PID/stat)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK
    return total


def pg_pids(data_dir: Path) -> list[int]:
    """The PostgreSQL postmaster and its children (backends, writer, WAL)."""
    try:
        master = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == master:
                kids.append(int(d.name))
    return [master, *kids]


class Gateway:
    """Processes answering ``POST /v1/answer`` (one URL each) and how to stop them."""

    def __init__(self, procs: list[subprocess.Popen], urls: list[str]) -> None:
        self.procs, self.urls = procs, urls
        self.state: str | None = None  # ccpo's state (a PostgreSQL URL: commits counted)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


#: every started process's stderr (a pipe nobody reads would stop a chatty server once full),
#: in one folder a run makes (:func:`logged_popen`)
LOGS: list[Path] = []


def logged_popen(cmd: list[str], env: dict, what: str) -> subprocess.Popen:
    """``cmd`` started with its stderr in a file of its own (:data:`LOGS`)."""
    folder = LOGS[0].parent if LOGS else Path(tempfile.mkdtemp(prefix="bench-gateway-logs-"))
    log = folder / f"{len(LOGS)}.log"
    LOGS.append(log)
    with open(log, "w", encoding="utf-8") as err:
        err.write(f"# {what}: {' '.join(cmd)}\n")
        err.flush()
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)


def start_proc(
    cmd: list[str],
    url: str,
    env: dict | None = None,
    what: str = "",
    health: str = "/healthz",
    wait: float = 120,
) -> subprocess.Popen:
    proc = logged_popen(cmd, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, what)
    try:
        wait_for_http(url + health, proc, wait, what)
    except RuntimeError as e:
        proc.kill()
        raise RuntimeError(f"{e}; its stderr: {LOGS[-1]}") from None
    return proc


def report_logs() -> None:
    """Name the processes whose stderr shows an error (a traceback, a logged error)."""
    for p in LOGS:
        text = p.read_text(errors="replace") if p.exists() else ""
        if "Traceback" in text or "ERROR" in text:
            print(f"errors in the stderr of {text.splitlines()[0][2:70]}...: {p}")


def state_commits(gw: Gateway) -> int:
    """The store's write transactions so far, every replica's (``state_commits`` of each
    replica's ``/metrics.json``: its writer's own count; PostgreSQL's statistics, read before,
    reach the statistics views up to 10 s late and counted a warm-up's commits at c=1)."""
    return sum(httpx.get(u + "/metrics.json", timeout=30).json()["state_commits"] for u in gw.urls)


def start_ccpo(policy: Path, config: Path, state: str, n: int, tag: str, env: dict) -> Gateway:
    procs, urls = [], []
    for i in range(n):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "ccpo.product.cli", "serve", "--policy", str(policy),
               "--config", str(config), "--port", str(port), "--state", state,
               "--replica", f"{tag}-{i}", "--log-level", "error"]  # fmt: skip
        procs.append(start_proc(cmd, url, env, f"ccpo serve {tag}-{i}"))
        urls.append(url)
    gw = Gateway(procs, urls)
    gw.state = state
    return gw


def start_floor(llm_url: str, calls: Path) -> Gateway:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, str(HERE / "_floor.py"), str(port), llm_url, str(calls)]
    return Gateway([start_proc(cmd, url, what="floor")], [url])


LITELLM_KEY = "sk-bench-gateway-local"  # recent LiteLLM proxies refuse to start without one


def start_litellm(llm_url: str, tmp: Path) -> Gateway:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = {"model_list": [
        {"model_name": m, "litellm_params": {"model": f"openai/{m}", "api_base": llm_url,
                                             "api_key": "sk-no-key-required"}}
        for m in PRICES
    ], "general_settings": {"master_key": LITELLM_KEY}}  # fmt: skip
    (tmp / "litellm.yaml").write_text(yaml.safe_dump(cfg))
    exe = shutil.which("litellm") or str(Path(sys.executable).parent / "litellm")
    cmd = [exe, "--config", str(tmp / "litellm.yaml"), "--port", str(port), "--host", "127.0.0.1"]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # offline: no price-map fetch
    proc = start_proc(cmd, url, env, "litellm", health="/health/liveliness", wait=180)
    return Gateway([proc], [url])


# /healthz polled every 20 ms from a process of its own (in the load generator's event loop
# a probe's time would include that loop's own queueing), until its stdin closes
POLLER = """
import http.client, json, sys, threading, time, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
out, conn = [], http.client.HTTPConnection(u.hostname, u.port, timeout=10)
while not stop.is_set():
    t0 = time.perf_counter()
    try:
        conn.request("GET", u.path)
        conn.getresponse().read()
        out.append(time.perf_counter() - t0)
    except (OSError, http.client.HTTPException):
        out.append(float("inf"))
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    time.sleep(0.02)
print(json.dumps(out))
"""


#: a question unanswered this long is an error (the run goes on; aiohttp's default is 300 s)
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=120)


async def ask(
    http: aiohttp.ClientSession, url: str, i: int, calls: dict[str, list[str]] | None
) -> float | str:
    """Question ``i`` at ``url``: its latency (s), or what went wrong. ``calls``: replay its
    recorded calls through an OpenAI-compatible proxy (LiteLLM) instead of ``/v1/answer``."""
    t0 = time.perf_counter()
    try:
        if calls is None:
            async with http.post(url + "/v1/answer", json={"question": question(i)}) as r:
                body = await r.read()
                if r.status != 200:
                    return f"HTTP {r.status}: {body[:200]!r}"
        else:
            for b in calls[str(i)]:
                async with http.post(
                    url + "/v1/chat/completions", data=b,
                    headers={"Content-Type": "application/json",
                             "Authorization": f"Bearer {LITELLM_KEY}"},
                ) as r:  # fmt: skip
                    body = await r.read()
                    if r.status != 200:
                        return f"HTTP {r.status}: {body[:200]!r}"
    except (aiohttp.ClientError, TimeoutError) as e:  # (counted as errors: the run goes on)
        return f"{type(e).__name__}: {str(e)[:120]}"
    return time.perf_counter() - t0


async def load(
    gw: Gateway, ids: list[int], conc: int, calls: dict[str, list[str]] | None = None
) -> dict:
    """``ids``' questions, ``conc`` at once, round-robin over the gateway's URLs, /healthz
    polled meanwhile. ``calls``: replay each question's recorded calls (see :func:`ask`)."""
    sem = asyncio.Semaphore(conc)
    lat: dict[int, float] = {}
    errors: list[str] = []
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=CLIENT_TIMEOUT) as http:

        async def one(k: int, i: int) -> None:
            async with sem:
                got = await ask(http, gw.urls[k % len(gw.urls)], i, calls)
            if isinstance(got, str):
                errors.append(got)
            else:
                lat[i] = got

        path = "/healthz" if calls is None else "/health/liveliness"
        poller = subprocess.Popen(
            [sys.executable, "-c", POLLER, gw.urls[0] + path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        t0 = time.perf_counter()
        await asyncio.gather(*(one(k, i) for k, i in enumerate(ids)))
        wall = time.perf_counter() - t0
        health = json.loads(poller.communicate(input="", timeout=60)[0])
    return {"lat": lat, "wall": wall, "errors": errors, "health": health}


async def one_at_a_time(
    gws: dict[str, Gateway], ids: list[int], replay: dict, seed: int = 0
) -> dict:
    """Concurrency 1, every row at once: each question goes to every row in turn (in an order
    drawn at random for each question: a fixed rotation had each row always follow the same
    row, and what that row left running weighed on it), so that what the shared machine is
    doing at a moment weighs on every row alike. A gateway of several replicas takes its
    questions round-robin. ``replay``: the recorded calls for the rows that replay them."""
    rows = list(gws)
    rng = random.Random(seed)
    lat: dict[str, dict[int, float]] = {r: {} for r in rows}
    errors: dict[str, list[str]] = {r: [] for r in rows}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=CLIENT_TIMEOUT) as http:
        for k, i in enumerate(ids):
            for row in rng.sample(rows, len(rows)):
                gw = gws[row]
                got = await ask(http, gw.urls[k % len(gw.urls)], i, replay.get(row))
                if isinstance(got, str):
                    errors[row].append(got)
                else:
                    lat[row][i] = got
    return {r: {"lat": lat[r], "errors": errors[r]} for r in rows}


def added_ms(res: dict, calls: dict[str, list[str]], latency: float) -> np.ndarray:
    """Each answered question's latency minus its LLM calls' own time (ms)."""
    return np.asarray([1e3 * (t - len(calls[str(i)]) * latency) for i, t in res["lat"].items()])


def measure_c1(
    starters: dict, ids: dict[str, list[int]], calls: dict, args, replays: set[str], seed: int = 0
) -> dict[str, dict]:
    """Every row started, warmed, then asked ``ids["c1"]`` one at a time, interleaved
    (:func:`one_at_a_time`): added p50 at c=1 and, on PostgreSQL, commits per question."""
    gws: dict[str, Gateway] = {}
    try:
        for row, start in starters.items():
            gws[row] = start()
            asyncio.run(load(gws[row], ids["warm"], 8, calls if row in replays else None))
        dbs = {r: g for r, g in gws.items() if g.state and "://" in g.state}
        idle = SPARE_IDLE_UNCAPPED_S + 0.5  # (the longer of the two windows)
        time.sleep(idle if dbs else 0)  # the warm-up's spare wallets released
        x0 = {r: state_commits(g) for r, g in dbs.items()}
        res = asyncio.run(one_at_a_time(gws, ids["c1"], {r: calls for r in replays}, seed))
        time.sleep(idle if dbs else 0)  # (includes the commit releasing the idle spare wallet)
        x1 = {r: state_commits(g) for r, g in dbs.items()}
    finally:
        for g in gws.values():
            g.stop()
    return {
        row: {
            "added_ms_p50_c1": float(np.median(added_ms(r, calls, args.latency))),
            "pg_commits_per_question_c1": (x1[row] - x0[row]) / max(1, len(r["lat"]))
            if row in dbs
            else None,
            "errors_c1": r["errors"],
        }
        for row, r in res.items()
    }


def measure(
    start, ids: dict[str, list[int]], calls: dict, args, pg_data: Path | None, replay: bool
) -> dict:
    """Start a gateway, warm it, measure c=64 (answers/s, CPU, /healthz), stop it."""
    gw = start()
    try:
        via = calls if replay else None
        asyncio.run(load(gw, ids["warm"], 8, via))
        got = load_measured(gw, ids["many"], calls, args, pg_data, via)
    finally:
        gw.stop()
    return c64_summary(got, calls, args)


def load_measured(
    gw: Gateway, ids: list[int], calls: dict, args, pg_data: Path | None, via: dict | None
) -> dict:
    """:func:`load` at ``--concurrency``, with the CPU seconds of the gateway and PostgreSQL."""
    pg = pg_pids(pg_data) if pg_data is not None else []
    c0, p0 = cpu_s(gw.pids), cpu_s(pg)
    many = asyncio.run(load(gw, ids, args.concurrency, via))
    c1, p1 = cpu_s(gw.pids), cpu_s(pg)
    return {**many, "cpu": c1 - c0, "pg_cpu": p1 - p0 if pg else None}


def c64_summary(many: dict, calls: dict, args) -> dict:
    """A c=64 measurement's figures (answers/s: answered over the time spent answering)."""
    n = max(1, len(many["lat"]))
    health = np.asarray(many["health"]) * 1e3
    return {
        "answers_per_s": len(many["lat"]) / many["wall"],
        "added_ms_p50_c64": float(np.median(added_ms(many, calls, args.latency))),
        "cpu_ms_per_question": 1e3 * many["cpu"] / n,
        "pg_cpu_ms_per_question": 1e3 * many["pg_cpu"] / n if many["pg_cpu"] is not None else None,
        "healthz_ms_p99": float(np.percentile(health, 99)) if health.size else None,
        "errors": len(many["errors"]),
        "error_examples": many["errors"][:2],
    }


def measure_interleaved(
    starters: dict, ids: dict[str, list[int]], calls: dict, args, pg_data: Path, replays: set,
    seed: int,
) -> dict[str, dict]:  # fmt: skip
    """c=64 with ``--c64-rounds`` K > 1: every row started and warmed at once, then K rounds
    in which each row in turn (in a random order each round) answers a K-th of the questions
    at ``--concurrency``, so that the shared machine's moments weigh on every row alike; each
    row's figures are over its K parts (answers/s: answered over the time spent answering)."""
    rng = random.Random(seed)
    gws: dict[str, Gateway] = {}
    got: dict[str, dict] = {}
    try:
        for row, start in starters.items():
            gws[row] = start()
            asyncio.run(load(gws[row], ids["warm"], 8, calls if row in replays else None))
            got[row] = {"lat": {}, "wall": 0.0, "errors": [], "health": [], "cpu": 0.0,
                        "pg_cpu": 0.0 if row.startswith("pg") else None}  # fmt: skip
        for part in np.array_split(np.asarray(ids["many"]), args.c64_rounds):
            for row in rng.sample(list(gws), len(gws)):
                pg = pg_data if row.startswith("pg") else None
                via = calls if row in replays else None
                m = load_measured(gws[row], [int(i) for i in part], calls, args, pg, via)
                g = got[row]
                g["lat"].update(m["lat"])
                g["errors"] += m["errors"]
                g["health"] += m["health"]
                g["wall"] += m["wall"]
                g["cpu"] += m["cpu"]
                if g["pg_cpu"] is not None:
                    g["pg_cpu"] += m["pg_cpu"] or 0.0
    finally:
        for gw in gws.values():
            gw.stop()
    return {row: c64_summary(g, calls, args) for row, g in got.items()}


def median_of(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--questions", type=int, default=1000, help="questions at --concurrency")
    # (60 a repetition moved a row's c=1 median by up to ±0.3 ms between repetitions, 200 by
    # up to ±0.2: within the margin of the c=1 targets)
    ap.add_argument("--c1-questions", type=int, default=400, help="questions one at a time")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--c64-rounds",
        type=int,
        default=1,
        help="K > 1: every row up at once, the --questions asked in K rounds of every row in "
        "turn (default 1: each row alone, started afresh)",
    )
    ap.add_argument("--latency", type=float, default=0.02, help="upstream latency per call (s)")
    ap.add_argument(
        "--kappa", type=float, default=0.2, help="the policy's κ (0.2: ~3.6 calls/question)"
    )
    ap.add_argument("--rows", default="floor,sqlite,pg1,pg3,litellm", help="rows to run")
    ap.add_argument(
        "--cap", type=float, default=None, help="serve under max_cost_total USD (default: none)"
    )
    ap.add_argument("--base-src", type=Path, default=None, help="also run ccpo from DIR/src")
    ap.add_argument(
        "--base-hide", default="", help="modules the --base-src rows cannot import (a,b,...)"
    )
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    policy = make_policy(tmp / "policy")
    prices = write_price_file(tmp / "prices.json", PRICES, "benchmark")
    up = subprocess.Popen(
        [sys.executable, str(HERE / "_upstream.py"), str(args.latency)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert up.stdout is not None
    llm_url = up.stdout.readline().strip()
    root = llm_url.removesuffix("/v1")
    n_warm = 24
    ids = {
        "warm": list(range(n_warm)),
        "c1": list(range(n_warm, n_warm + args.c1_questions)),
        "many": list(
            range(n_warm + args.c1_questions, n_warm + args.c1_questions + args.questions)
        ),
    }
    every = [i for v in ids.values() for i in v]
    counter = [0]

    def config() -> Path:
        """The deploy config (serve's default: no response cache)."""
        counter[0] += 1
        cfg = {"task": "mmlu", "base_model": "bench-base", "base_url": llm_url,
               "guide_model": "bench-guide", "guide_url": llm_url, "prices": [str(prices)],
               "concurrency": 256, "timeout": 30, "kappa": args.kappa,
               **({"max_cost_total": args.cap} if args.cap else {})}  # fmt: skip
        p = tmp / f"deploy-{counter[0]}.yaml"
        p.write_text(yaml.safe_dump(cfg))
        return p

    rows = [r for r in args.rows.split(",") if r]
    if "litellm" in rows and shutil.which("litellm") is None:
        print("litellm is not installed: its row is skipped", flush=True)
        rows.remove("litellm")
    envs: dict[str, dict] = {"": {}}
    if args.base_src is not None:
        hide = tmp / "hide"  # (--base-hide: a package such a tree was installed without)
        for mod in [m for m in args.base_hide.split(",") if m]:
            (hide / mod).mkdir(parents=True)
            (hide / mod / "__init__.py").write_text(
                "raise ImportError('hidden by the benchmark')\n"
            )
        envs["@base"] = {"PYTHONPATH": f"{hide}:{args.base_src.resolve() / 'src'}"}
        rows += [f"{r}@base" for r in ("sqlite", "pg1") if r in rows]

    out: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": {}}
    try:
        from ccpo.testing.postgres import PostgresCluster

        with PostgresCluster(fsync=True) as pg:
            # record ccpo's calls for every question once (SQLite, the current tree)
            httpx.post(root + "/record", json={"on": True})
            gw = start_ccpo(policy, config(), str(tmp / "record.sqlite"), 1, "record", {})
            try:
                rec = asyncio.run(load(gw, every, args.concurrency))
            finally:
                gw.stop()
            httpx.post(root + "/record", json={"on": False})
            calls = httpx.get(root + "/recorded", timeout=60).json()
            assert not rec["errors"], rec["errors"][:3]
            missing = [i for i in every if str(i) not in calls]
            assert not missing, f"no calls recorded for questions {missing[:5]}"
            calls_path = tmp / "calls.json"
            calls_path.write_text(json.dumps(calls))
            per_q = float(np.mean([len(calls[str(i)]) for i in every]))
            out["llm_calls_per_question"] = per_q
            print(f"ccpo makes {per_q:.2f} LLM calls per question (κ = {args.kappa})", flush=True)

            def starter(row: str):
                name, _, suffix = row.partition("@")
                env = envs["@" + suffix if suffix else ""]
                if name == "floor":
                    return lambda: start_floor(llm_url, calls_path)
                if name == "litellm":
                    return lambda: start_litellm(llm_url, tmp)
                if name == "sqlite":
                    return lambda: start_ccpo(
                        policy, config(), str(tmp / f"s-{time.time_ns()}.sqlite"), 1, row, env
                    )
                k = int(name.removeprefix("pg"))
                return lambda: start_ccpo(policy, config(), pg.new_database(), k, row, env)

            runs: dict[str, list[dict]] = {r: [] for r in rows}
            replays = {r for r in rows if r == "litellm"}
            for rep in range(args.reps):
                one = measure_c1({r: starter(r) for r in rows}, ids, calls, args, replays, rep)
                if args.c64_rounds > 1:
                    many = measure_interleaved(
                        {r: starter(r) for r in rows}, ids, calls, args, pg.data, replays, rep
                    )
                for row in rows:
                    is_pg = row.startswith("pg")
                    res = many[row] if args.c64_rounds > 1 else measure(
                        starter(row), ids, calls, args, pg.data if is_pg else None,
                        replay=row in replays,
                    )  # fmt: skip
                    c1 = one[row]
                    res["errors"] += len(c1.pop("errors_c1"))
                    res.update(c1)
                    runs[row].append(res)
                    short = {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}
                    print(f"rep {rep} {row}: {json.dumps(short)}", flush=True)
    finally:
        up.terminate()
        up.wait(timeout=20)
        report_logs()

    keys = ("answers_per_s", "added_ms_p50_c1", "added_ms_p50_c64", "cpu_ms_per_question",
            "pg_cpu_ms_per_question", "healthz_ms_p99", "pg_commits_per_question_c1")  # fmt: skip
    floor = {k: median_of(runs["floor"], k) for k in keys} if "floor" in runs else None
    print(
        f"\nmedians of {args.reps} interleaved repetitions; upstream {args.latency * 1e3:.0f} "
        f"ms, {out['llm_calls_per_question']:.2f} LLM calls per question, c={args.concurrency}"
    )
    print(f"{'row':<12} {'answers/s':>9} {'x floor':>7} {'added p50 c=1':>13} {'c=64':>7} "
          f"{'CPU ms/q':>8} {'+PG':>5} {'healthz p99':>11} {'PG commits/q c=1':>16} "
          f"{'errors':>6}")  # fmt: skip
    for row in rows:
        med = {k: median_of(runs[row], k) for k in keys}
        ratio = med["answers_per_s"] / floor["answers_per_s"] if floor else None
        med["x_floor_answers_per_s"] = ratio
        if floor:
            med["added_ms_p50_c1_over_floor"] = med["added_ms_p50_c1"] - floor["added_ms_p50_c1"]
        med["errors"] = sum(r["errors"] for r in runs[row])
        med["runs"] = runs[row]
        out["rows"][row] = med

        def f(v, spec=".1f"):
            return "-" if v is None else format(v, spec)

        print(f"{row:<12} {f(med['answers_per_s']):>9} {f(ratio, '.2f'):>7} "
              f"{f(med['added_ms_p50_c1']):>13} {f(med['added_ms_p50_c64']):>7} "
              f"{f(med['cpu_ms_per_question'], '.2f'):>8} {f(med['pg_cpu_ms_per_question']):>5} "
              f"{f(med['healthz_ms_p99']):>11} "
              f"{f(med['pg_commits_per_question_c1'], '.2f'):>16} {med['errors']:>6}")  # fmt: skip
    if floor:
        print("\ntargets (issue 30):")
        for row, share, extra in (("sqlite", 0.6, 1.5), ("pg1", 0.5, 3.0)):
            if row in out["rows"]:
                m = out["rows"][row]
                print(f"  {row}: answers/s {m['x_floor_answers_per_s']:.2f} x floor (target >= "
                      f"{share}); added p50 at c=1 floor {m['added_ms_p50_c1_over_floor']:+.1f} ms "
                      f"(target <= +{extra}); /healthz p99 {m['healthz_ms_p99']:.1f} ms (target "
                      "<= 20)")  # fmt: skip
                if m.get("pg_commits_per_question_c1") is not None:
                    print(f"        PostgreSQL commits per question at c=1 "
                          f"{m['pg_commits_per_question_c1']:.2f} (target <= 1.5)")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
