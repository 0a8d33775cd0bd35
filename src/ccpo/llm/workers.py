"""``collect --workers N``: one collection run spread over N client processes.

One Python process's CPU per call caps its throughput however high ``--concurrency`` goes;
against a fast local endpoint (vLLM, llama.cpp) N processes lift that cap N-fold where there
are cores for them (figures: docs/decisions.md, "`collect --workers N`").
:func:`collect_with_workers` keeps every guarantee of a one-process run (:mod:`ccpo.llm.run`):

- the parent takes the output's lock (:func:`~ccpo.llm.run.output_lock`), scans the output
  and deals the remaining questions (:func:`deal`: the same text to the same worker;
  :func:`shares` splits ``--concurrency``, the total);
- workers append whole lines under a shared lock, share the SQLite response cache and one
  :class:`~ccpo.llm.spend.SpendLedger` in shared memory, die with the parent, and all stop on
  a user-fixable error, which the parent raises;
- workers are forked where the platform allows (Linux) and spawned elsewhere.

Contract: docs/cli.md, section "collect".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
from dataclasses import dataclass
from typing import Any

from ccpo.errors import CCPOError, PartialError
from ccpo.llm.cache import ResponseCache
from ccpo.llm.config import CollectConfig
from ccpo.llm.run import (
    CollectSummary,
    Plan,
    ProgressBar,
    output_lock,
    plan_collection,
    run_questions,
)
from ccpo.llm.spend import SharedSlots, SpendLedger
from ccpo.llm.tasks.loaders import Question
from ccpo.traces.io import TraceWriter

log = logging.getLogger("ccpo.collect")

_POLL_S = 0.1  # how often the parent looks at its workers while no event arrives
_COUNTS = ("done", "failed", "spent", "calls", "cached")


@dataclass
class _Shared:
    """What the parent shares with every worker."""

    lock: Any  # multiprocessing.Lock: one output line at a time
    spent: Any  # multiprocessing.Value(SharedSlots): the whole run's ledger
    stop: Any  # multiprocessing.Event: set by a worker hitting a fatal error, or the parent
    events: Any  # multiprocessing.Queue of (kind, worker index, payload)
    parent: int  # the parent's pid: a worker whose parent died writes nothing more


def shares(total: int, parts: int) -> list[int]:
    """Split ``total`` (the concurrency) into ``parts`` near-equal shares, largest first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def deal(todo: list[Question], parts: int) -> list[list[Question]]:
    """Deal questions to ``parts`` workers, keeping questions with the same text together.

    Identical questions send identical requests; in one worker those are merged while in
    flight (and then cached), so that two workers never pay for the same request at the same
    moment. Each group goes to the worker with the fewest questions so far (ties: the lowest
    index), in the order the groups first appear; every question is dealt exactly once.
    """
    groups: dict[str, list[Question]] = {}
    for q in todo:
        groups.setdefault(q.question, []).append(q)
    hands: list[list[Question]] = [[] for _ in range(parts)]
    for group in groups.values():
        min(hands, key=len).extend(group)
    return hands


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when its parent dies; leave at once if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(3)


def _worker_main(
    index: int, cfg: CollectConfig, kind: str, plan: Plan, shared: _Shared
) -> None:  # pragma: no cover - runs in the worker process (covered by the tests' runs)
    _die_with_parent(shared.parent)
    # Ctrl-C reaches the whole process group: the parent alone decides what happens
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert plan.summary is not None
    error: str | None = None
    code = CCPOError.exit_code  # the exit code the error calls for
    try:
        with TraceWriter(plan.out, append=True) as writer:

            def write(trace: Any) -> None:
                with shared.lock:
                    alive = os.getppid() == shared.parent
                    if alive:
                        writer.write(trace)
                if not alive:  # the run was killed: end quietly (the lock released first)
                    os._exit(3)

            def report(s: CollectSummary) -> None:
                shared.events.put(("counts", index, s.counts()))

            fatal = asyncio.run(
                run_questions(
                    cfg,
                    kind,
                    plan,
                    write,
                    report,
                    SpendLedger(shared.spent),
                    halted=shared.stop.is_set,
                )
            )
        if fatal is not None:
            error, code = str(fatal), fatal.exit_code
    except CCPOError as e:
        error, code = str(e), e.exit_code
    except BaseException as e:  # report anything else to the parent rather than die silently
        error = f"worker {index} failed: {type(e).__name__}: {e}"
    if error is not None:
        shared.stop.set()
    shared.events.put(("final", index, (plan.summary, (error, code) if error else None)))
    shared.events.close()
    shared.events.join_thread()


def _died(index: int, exitcode: int) -> str:
    return (
        f"worker {index} ended without a report (exit code {exitcode}); its finished questions "
        "are in the output and its paid calls in the cache: rerun the same command to resume"
    )


def collect_with_workers(
    cfg: CollectConfig,
    kind: str = "base-guide",
    progress: bool = True,
    start_method: str | None = None,
) -> CollectSummary:
    """Run a collection in ``cfg.workers`` worker processes (docs/cli.md, "collect").

    ``start_method``: ``fork`` or ``spawn``; by default fork on Linux and spawn elsewhere.
    """
    plan = plan_collection(cfg, kind)
    with output_lock(plan.out):
        plan.scan(cfg.task)
        summary = plan.summary
        assert summary is not None
        n = min(cfg.workers, cfg.concurrency, len(plan.todo))
        if n == 0:
            return summary
        if start_method is None:
            start_method = "fork" if sys.platform.startswith("linux") else "spawn"
        # create the shared cache (and switch it to WAL) once, here: workers that all create
        # it at the same moment can find it locked
        ResponseCache(cfg.cache_path()).close()
        ctx = mp.get_context(start_method)
        shared = _Shared(ctx.Lock(), ctx.Value(SharedSlots), ctx.Event(), ctx.Queue(), os.getpid())
        procs = []
        hands = deal(plan.todo, n)
        for i, conc in enumerate(shares(cfg.concurrency, n)):
            sub = Plan(plan.out, kind, plan.questions, plan.prices, plan.source, plan.reference)
            sub.todo = hands[i]
            sub.summary = CollectSummary(out=summary.out, total=len(sub.todo))
            wcfg = cfg.model_copy(update={"concurrency": conc, "workers": 1})
            procs.append(
                ctx.Process(
                    target=_worker_main,
                    args=(i, wcfg, kind, sub, shared),
                    name=f"ccpo-collect-{i}",
                    daemon=True,
                )
            )
        for p in procs:
            p.start()
        counts: dict[int, dict[str, Any]] = {}
        finals: dict[int, tuple[CollectSummary | None, tuple[str, int] | None]] = {}
        silent: set[int] = set()  # ended, and no report in the queue at the last look
        bar = ProgressBar(progress, summary.total, summary.already, kind)
        try:
            with bar:
                while len(finals) < n:
                    try:
                        what, i, payload = shared.events.get(timeout=_POLL_S)
                    except queue.Empty:
                        for i, p in enumerate(procs):
                            if i in finals or p.exitcode is None:
                                continue
                            if i in silent:  # ended and still nothing after one more look
                                finals[i] = (None, (_died(i, p.exitcode), PartialError.exit_code))
                                shared.stop.set()
                            silent.add(i)
                        continue
                    if what == "counts":
                        counts[i] = payload
                    else:
                        finals[i] = payload
                        counts[i] = payload[0].counts()
                    bar.update({k: sum(c[k] for c in counts.values()) for k in _COUNTS})
        except BaseException:  # Ctrl-C or worse: stop the workers (their paid calls are cached)
            shared.stop.set()
            for p in procs:
                p.terminate()
            raise
        finally:
            for p in procs:
                p.join(timeout=30)
    errors: list[tuple[str, int]] = []
    for i in range(n):
        part, err = finals[i]
        if part is not None:
            summary.add(part)
        if err is not None:
            errors.append(err)
    if errors:
        message, code = errors[0]
        raise (PartialError if code == PartialError.exit_code else CCPOError)(message)
    return summary
