"""Slow clients against ``ccpo serve``: how long a slow connection is held and
how long ``/healthz`` takes while ``--connections`` of them each hold a partial request.

    python benchmarks/bench_slow_clients.py [--connections 2000] [--nofile 1024] [--duration 40]
        [--unguarded] [--set header_timeout=10 --set body_timeout=10 ...]   # server.* settings

``ccpo serve`` runs in a subprocess under ``ulimit -n --nofile`` (soft and hard: the usual
default; a higher limit hides the problem) on 127.0.0.1, with a small policy trained on
synthetic traces and LLM endpoints that are never called (``/healthz`` calls none).
``--unguarded`` is "before": the same ``ccpo serve`` with uvicorn's plain settings (no
deadlines, no connection cap, its default backlog), i.e. the fix disabled and nothing else.

Half of the slow clients trickle a request head one byte every ``--trickle`` seconds, the other
half send a whole head and then a body one byte at a time. All of them are started at once;
none reconnects. ``/healthz`` is probed on a fresh connection every ``--probe-every`` seconds
(an answer slower than 5 s counts as none). Nothing runs past ``--duration`` seconds. This
process raises its own open-file soft limit to its hard limit (it holds every connection); it
needs ``--connections`` + 100. Prints one JSON object: for the slow connections, how many
were closed by the server, with which status and after how long (median / max), how many were
still open at the end (or failed to connect), and when the last was closed; for ``/healthz``,
every probe (time into the run, status, seconds), their statuses and latency while slow
connections were held and after, and the time from the last close to the first 200; the
server's most open file descriptors and the ``Too many open files`` lines in its log.
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
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from bench_serve import make_policy

from ccpo.testing import free_port
from ccpo.traces.prices import write_price_file

HEAD = b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
BODY_HEAD = (
    b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    b"content-length: 60000\r\n\r\n"
)

# "before": ccpo serve with uvicorn's plain settings for connections (the fix disabled)
UNGUARDED = """
import runpy, sys
import ccpo.runtime.server as server
configure = server.uvicorn_config
def plain(service, log_level="info"):
    c = configure(service, log_level)
    c.http, c.backlog, c.timeout_keep_alive = "auto", 2048, 5
    return c
server.uvicorn_config = plain
sys.argv = ["ccpo", *sys.argv[1:]]
runpy.run_module("ccpo", run_name="__main__")
"""


def start_serve(
    folder: Path, nofile: int, settings: dict, unguarded: bool
) -> tuple[subprocess.Popen, int]:
    """``ccpo serve`` under ``ulimit -n nofile`` on a free port of 127.0.0.1; waits for it."""
    policy = folder / "policy"
    if not (policy / "policy.json").exists():
        make_policy(policy)
    prices = write_price_file(folder / "p.json", {"base-m": (1, 4), "guide-m": (1, 4)}, "bench")
    port = free_port()
    conf = {
        "task": "mmlu",
        "base_model": "base-m",
        "base_url": "http://127.0.0.1:9/v1",  # never called: /healthz calls no LLM
        "guide_model": "guide-m",
        "guide_url": "http://127.0.0.1:9/v1",
        "prices": [str(prices)],
        "server": {"port": port, "state": str(folder / "state.db"), **settings},
    }
    (folder / "serve.yaml").write_text(yaml.safe_dump(conf))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    args = ["serve", "--policy", str(policy), "--config", str(folder / "serve.yaml"),
            "--log-level", "warning"]  # fmt: skip
    cmd = [sys.executable, "-c", UNGUARDED, *args] if unguarded else [
        str(Path(sys.executable).with_name("ccpo")), *args]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "serve.log", "wb"),  # noqa: SIM115
        preexec_fn=limit,
    )
    t0 = time.monotonic()
    while time.monotonic() - t0 < 90:
        if proc.poll() is not None:
            raise RuntimeError((folder / "serve.log").read_text())
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("ccpo serve did not start")


async def slow_client(
    port: int, body: bool, trickle: float, end: float, closes: list[float]
) -> tuple[str, float | None]:
    """How this slow connection ended: ``("connect_failed", None)``, ``("open", None)`` (still
    open at ``end``), or the status the server sent before closing it (``"408"``, ``"503"``;
    ``"none"``: closed without a reply) with the seconds it was held (the loop time of the
    close is appended to ``closes``)."""
    loop = asyncio.get_running_loop()
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    except (OSError, TimeoutError):
        return "connect_failed", None
    t0 = loop.time()
    got = b""
    try:
        w.write(BODY_HEAD + b"{" if body else HEAD)
        await w.drain()
        while loop.time() < end:
            try:
                data = await asyncio.wait_for(r.read(4096), min(trickle, end - loop.time()))
            except TimeoutError:
                w.write(b" " if body else b"X")
                await w.drain()
                continue
            if not data:  # the server closed it
                closes.append(loop.time())
                return (got[9:12].decode() if got.startswith(b"HTTP/1.1 ") else "none"), (
                    loop.time() - t0
                )
            got += data
        return "open", None
    except OSError:  # reset by the server
        closes.append(loop.time())
        return (got[9:12].decode() if got.startswith(b"HTTP/1.1 ") else "none"), loop.time() - t0
    finally:
        w.close()


async def probe(port: int, timeout: float = 5.0) -> tuple[str, float | None]:
    """A fresh ``GET /healthz``: its status (or the error: ``TimeoutError`` if no answer within
    ``timeout``) and seconds."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        async with asyncio.timeout(timeout):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            await w.drain()
            data = await r.read()
            w.close()
    except (OSError, TimeoutError) as e:  # named: refused, reset, timed out
        return type(e).__name__, None
    status = data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "none"
    return status, loop.time() - t0


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


async def attack(
    pid: int, port: int, n: int, trickle: float, duration: float, every: float
) -> dict:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    end = t0 + duration
    closes: list[float] = []
    clients = [
        asyncio.create_task(slow_client(port, i % 2 == 1, trickle, end, closes)) for i in range(n)
    ]
    probes: list[tuple[float, str, float | None]] = []
    fds: list[int] = []
    await asyncio.sleep(1.0)
    while loop.time() < end - 5:
        at = loop.time() - t0
        fds.append(open_fds(pid) or 0)
        status, secs = await probe(port)
        probes.append((round(at, 2), status, None if secs is None else round(secs, 4)))
        await asyncio.sleep(max(0.0, every - (loop.time() - t0 - at)))
    ends = await asyncio.gather(*clients)
    by_status: dict[str, list[float]] = {}
    for status, held in ends:
        by_status.setdefault(status, []).append(held if held is not None else float("nan"))

    def held(st: str, h: list[float]) -> dict:
        if st in ("open", "connect_failed"):
            return {"n": len(h)}
        return {"n": len(h), "held_s_median": round(statistics.median(h), 2),
                "held_s_max": round(max(h), 2)}  # fmt: skip

    last = max(closes) - t0 if len(closes) == n else None  # all closed by the server: when
    during = [p for p in probes if last is None or p[0] < last]
    after = [p for p in probes if last is not None and p[0] >= last]

    def summary(ps: list[tuple[float, str, float | None]]) -> dict:
        secs = [p[2] for p in ps if p[2] is not None]
        return {
            "statuses": {st: sum(1 for p in ps if p[1] == st) for st in sorted({p[1] for p in ps})},
            "s_median": round(statistics.median(secs), 4) if secs else None,
            "s_max": round(max(secs), 4) if secs else None,
        }

    first_ok = next((p for p in after if p[1] == "200"), None)
    return {
        "connections": n,
        "slow_connections": {st: held(st, h) for st, h in sorted(by_status.items())},
        "slow_all_closed_at_s": None if last is None else round(last, 2),
        "healthz_probes": probes,
        "healthz_while_slow_held": summary(during),
        "healthz_after_all_closed": summary(after),
        "healthz_first_200_after_all_closed_s": (  # from the last close to that 200's answer
            None if first_ok is None else round(first_ok[0] + first_ok[2] - last, 3)  # type: ignore[operator]
        ),
        "server_max_open_fds": max(fds) if fds else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--nofile", type=int, default=1024)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--trickle", type=float, default=2.0, help="seconds between slow bytes")
    ap.add_argument("--probe-every", type=float, default=0.25, help="seconds between probes")
    ap.add_argument("--unguarded", action="store_true", help="before: uvicorn's plain settings")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    settings = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # this side holds them all
    if hard != resource.RLIM_INFINITY and hard < args.connections + 100:
        sys.exit(f"this process may open only {hard} files (ulimit -Hn); it needs "
                 f"{args.connections + 100}")  # fmt: skip
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as d:
        proc, port = start_serve(Path(d), args.nofile, settings, args.unguarded)
        try:
            out = asyncio.run(
                attack(
                    proc.pid, port, args.connections, args.trickle, args.duration, args.probe_every
                )
            )
            status, secs = asyncio.run(probe(port))
            out["healthz_after_attack"] = [status, None if secs is None else round(secs, 4)]
            out["server_alive"] = proc.poll() is None
            log = (Path(d) / "serve.log").read_text(errors="replace")
            out["log_too_many_open_files"] = log.count("Too many open files")
            lines = log.splitlines()  # what ran out (the line before each, deduplicated)
            out["log_too_many_open_files_first"] = sorted({
                lines[i - 1][:160] for i, x in enumerate(lines) if "Too many open files" in x
            })[:5]  # fmt: skip
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    out.update(settings=settings, nofile=args.nofile, unguarded=args.unguarded)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
