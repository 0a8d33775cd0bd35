"""The state store's ceiling without HTTP or LLM calls: how many questions per
second ``N`` writer processes push through one store, and how many commits each question
costs. Each process is what a ``ccpo serve`` replica does to its store, with the real store
(:class:`ccpo.runtime.state.StateStore`) and its real ledger (:class:`StoreLedger`):
``concurrency`` questions at once, each admitted with a wallet (one awaited reservation under
a total budget), ``calls`` calls drawn from that wallet (each settled: no write of its own),
the wallet's rest released, and the answer record (awaited). The LLM calls themselves take no
time here: this is the store's ceiling, not a server's.

    python benchmarks/bench_store.py [--seconds 3] [--repeats 3] [--concurrency 64] [--no-cap]

``--no-cap``: no total budget, as ``ccpo serve`` without ``max_cost_total`` (a question's
wallet then comes from the replica's spare one when questions come back to back).

Stores: a throw-away PostgreSQL cluster (fsync on, as deployed) and a SQLite file (WAL);
1 and 3 writer processes; repetitions interleaved (every configuration once per round),
medians reported. Commits per question are the store's own count of its transactions
(``StateStore.commits``); for PostgreSQL also the database's ``xact_commit``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from ccpo.learning.conformal import OnlineThreshold
from ccpo.testing.postgres import PostgresCluster

CALLS = 3.55  # LLM calls per question in the gateway benchmark
WALLET = 0.004  # USD held per question at admission (the scripted world's order)
CALL_COST = 0.0002


def _worker(
    location: str, name: str, seconds: float, conc: int, go, out, cap: float | None = 1e9
) -> None:
    from ccpo.runtime.state import StateStore, StoreLedger

    store = StateStore(location, "bench", OnlineThreshold(alpha=0.1), replica=name, timeout=10)
    ledger = StoreLedger(store)
    answer = {"question": "Which is a prime number? A. 4 B. 6 C. 7 D. 9", "answers": ["C"],
              "cost_usd": 0.0, "rounds": 2, "log": [{"round": 1}, {"round": 2}]}  # fmt: skip

    async def question(i: int) -> None:
        if not await ledger.areserve(WALLET, cap):
            raise RuntimeError("refused")
        n = int(CALLS) + (i % 100 < (CALLS % 1) * 100)
        for _ in range(n):  # a call drawn wholly from the wallet: no write
            await ledger.areserve(0.0, cap, call=True)
            ledger.settle(CALL_COST, CALL_COST, call=True)
        ledger.settle(WALLET - n * CALL_COST, 0.0)
        await store.answers.record_answer(
            {**answer, "id": f"{name}-{i}", "cost_usd": n * CALL_COST}
        )

    async def main() -> tuple[int, int, float, int]:
        done = 0
        stop = False

        async def loop(k: int) -> None:
            nonlocal done
            i = k
            while not stop:
                await question(i)
                i += conc
                done += 1

        tasks = [asyncio.create_task(loop(k)) for k in range(conc)]
        await asyncio.sleep(0.5)  # warm up
        d0, c0, t0 = done, store.engine.commits, time.perf_counter()
        await asyncio.sleep(seconds)
        d1, c1, t1 = done, store.engine.commits, time.perf_counter()
        stop = True
        await asyncio.gather(*tasks)
        return d1 - d0, c1 - c0, t1 - t0, done

    go.wait()
    try:
        n, commits, dt, total = asyncio.run(main())
    except Exception as e:  # reported by the parent, not left to its queue timeout
        out.put(repr(e))
        raise
    finally:
        store.close()
    out.put((n, commits, dt, total))


def run_once(
    location: str, procs: int, seconds: float, conc: int, cap: float | None = 1e9
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    run = uuid.uuid4().hex[:6]
    ps = [
        ctx.Process(target=_worker, args=(location, f"w{k}-{run}", seconds, conc, go, out, cap))
        for k in range(procs)
    ]
    for p in ps:
        p.start()
    time.sleep(2.5)  # every process has opened the store (imports, connection)
    xact0 = _xact(location)
    go.set()
    res = [out.get(timeout=seconds + 120) for _ in ps]
    failed = [r for r in res if isinstance(r, str)]
    if failed:
        raise SystemExit(f"a writer process failed: {failed[0]}")
    xact1 = _xact(location)
    for p in ps:
        p.join()
    _check(location, sum(r[3] for r in res))
    n = sum(r[0] for r in res)
    dt = max(r[2] for r in res)
    row = {"qps": n / dt, "commits_per_q": sum(r[1] for r in res) / n}
    if xact0 is not None and xact1 is not None:
        row["xact_per_q"] = (xact1 - xact0) / n
    return row


def _check(location: str, questions: int) -> None:
    """The store counted every question once and holds nothing back: else the run is void."""
    from ccpo.runtime.state import StateStore

    s = StateStore(location, "bench", OnlineThreshold(alpha=0.1), replica="check")
    c = s.counters
    s.close()
    expected = _check.seen.get(location, 0) + questions  # type: ignore[attr-defined]
    _check.seen[location] = expected  # type: ignore[attr-defined]
    if c.requests != expected or c.reserved_usd > 1e-9 or c.inflight_usd > 1e-9:
        raise SystemExit(
            f"{location}: {c.requests} answers recorded for {expected} questions, "
            f"${c.reserved_usd:.6f} reserved, ${c.inflight_usd:.6f} in flight"
        )


_check.seen = {}  # type: ignore[attr-defined]


def _xact(location: str) -> int | None:
    if "://" not in location:
        return None
    import psycopg

    with psycopg.connect(location, autocommit=True) as c:
        return int(c.execute("SELECT xact_commit FROM pg_stat_database "
                             "WHERE datname = current_database()").fetchone()[0])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--concurrency", type=int, default=64, help="questions at once per process")
    ap.add_argument("--procs", default="1,3", help="writer processes to measure")
    ap.add_argument(
        "--no-cap",
        action="store_true",
        help="no total budget (as serve without max_cost_total: wallets from the spare one)",
    )
    args = ap.parse_args()
    cap = None if args.no_cap else 1e9
    procs = [int(x) for x in args.procs.split(",")]
    with PostgresCluster() as pg, tempfile.TemporaryDirectory() as tmp:
        configs = []
        for p in procs:
            configs.append((f"postgresql, {p} writer(s)", pg.new_database(), p))
            configs.append((f"sqlite, {p} writer(s)", str(Path(tmp) / f"s{p}.sqlite"), p))
        rows: dict[str, list[dict[str, float]]] = {c[0]: [] for c in configs}
        for rep in range(args.repeats):
            for name, loc, p in configs:
                r = run_once(loc, p, args.seconds, args.concurrency, cap)
                rows[name].append(r)
                print(f"round {rep + 1} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
        print(f"\nmedians of {args.repeats} interleaved runs, concurrency {args.concurrency} "
              f"per process, {args.seconds:g} s each, "
              f"{'no cap' if cap is None else 'a cap'}:")  # fmt: skip
        print("| store, writers | questions/s | commits / question | PG xact_commit / question |")
        print("|---|---|---|---|")
        for name, rs in rows.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            xact = f"{med['xact_per_q']:.3f}" if "xact_per_q" in med else "-"
            print(f"| {name} | {med['qps']:.0f} | {med['commits_per_q']:.3f} | {xact} |")


if __name__ == "__main__":
    main()
