"""A collection run in one process: questions → ``ccpo.trace/v1`` lines, resumable,
observable, budgeted (:func:`ccpo.llm.collect.collect` runs it, or several in
:mod:`ccpo.llm.workers`).

- :func:`plan_collection` (:class:`Plan`), :func:`scan_output`, :func:`output_lock`: what is
  left to do, and one run per output file. Ids already written are skipped; a half-written
  last line is cut off and redone from the cache; a complete malformed line is an error.
- :func:`run_questions`: append-only output, one flushed line per finished question. Budget
  (``max_cost``): a question starts only when the costliest question so far, plus one call's
  worst case, still fits, and every paid call reserves its worst case first
  (:meth:`ccpo.llm.client.LLMClient.admit`), so the budget buys whole traces.
- :class:`CollectSummary`, :class:`ProgressBar`: what the run did (``stopped_by_budget``, ...).

Contract: docs/cli.md, section "collect".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError
from ccpo.llm.cache import ResponseCache
from ccpo.llm.client import BudgetExceeded, LLMCallError, SpendLedger
from ccpo.llm.config import CollectConfig
from ccpo.llm.protocol import NoReferenceAnswer, make_runner, run_base_guide, run_exit
from ccpo.llm.tasks.loaders import Question, default_data_path, load_questions
from ccpo.traces.io import TraceWriter
from ccpo.traces.labels import GOLD, reference_labels
from ccpo.traces.prices import PriceTable, load_prices
from ccpo.traces.schema import Trace

log = logging.getLogger("ccpo.collect")


@dataclass
class CollectSummary:
    """What a run did (also printed by the CLI)."""

    out: str
    total: int = 0  # questions selected
    already: int = 0  # found in the output file at start
    done: int = 0  # written by this run
    failed: list[str] = field(default_factory=list)  # ids whose calls failed for good
    dropped: list[str] = field(default_factory=list)  # ids the reference did not answer
    labels: str = "gold"  # what correct is measured against (ccpo.traces.labels)
    stopped_by_budget: bool = False
    spent_usd: float = 0.0
    calls: int = 0  # paid (network) calls
    cached: int = 0  # calls served by the cache
    retries: int = 0
    truncated_partial_line: bool = False

    @property
    def complete(self) -> bool:
        """Every question is in the output, or has no label (``dropped``: the reference gave
        no answer; a rerun asks it again, from the cache)."""
        return self.already + self.done + len(self.dropped) == self.total

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "complete": self.complete}

    def counts(self) -> dict[str, Any]:
        """What the progress bar shows (summed over the processes of ``collect --workers``)."""
        return {
            "done": self.done,
            "failed": len(self.failed),
            "spent": self.spent_usd,
            "calls": self.calls,
            "cached": self.cached,
        }

    def add(self, part: CollectSummary) -> None:
        """Add one worker's part of the run (``collect --workers``)."""
        self.done += part.done
        self.failed += part.failed
        self.dropped += part.dropped
        self.stopped_by_budget |= part.stopped_by_budget
        self.spent_usd += part.spent_usd
        self.calls += part.calls
        self.cached += part.cached
        self.retries += part.retries


def scan_output(path: Path, task: str, kind: str) -> tuple[set[str], bool]:
    """Ids already in ``path``; cuts a half-written last line. Returns (ids, truncated)."""
    if not path.exists():
        return set(), False
    if path.suffix == ".gz":
        raise CCPOError(f"{path}: collect writes plain .jsonl (append-safe); gzip it afterwards")
    data = path.read_bytes()
    truncated = False
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        with open(path, "r+b") as fh:
            fh.truncate(cut)
        data = data[:cut]
        truncated = True
        log.warning("%s: removed a half-written last line; that question will be redone", path)
    ids: set[str] = set()
    for ln, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            qid = str(obj["id"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CCPOError(
                f"{path}:{ln}: not a trace line; the output file must only be written by "
                "ccpo collect (use another --out)"
            ) from None
        if obj.get("task") != task:
            raise CCPOError(
                f"{path}:{ln}: holds task '{obj.get('task')}' traces, not '{task}'; use another "
                "--out"
            )
        okind = (obj.get("meta") or {}).get("kind")
        if okind is not None and okind != kind:
            raise CCPOError(f"{path}:{ln}: holds '{okind}' traces, not '{kind}'; use another --out")
        ids.add(qid)
    return ids, truncated


def select_questions(cfg: CollectConfig) -> tuple[list[Question], str]:
    qs = load_questions(cfg.task, cfg.data, need_gold=cfg.reference is None, family=cfg.family)
    source = cfg.data or f"bundled:{default_data_path(cfg.task).name}"
    if cfg.shuffle_seed is not None:
        qs = list(qs)
        random.Random(cfg.shuffle_seed).shuffle(qs)
    if cfg.n is not None:
        qs = qs[: cfg.n]
    return qs, source


@dataclass
class Plan:
    """What a run has to do: its checked settings, then (after :meth:`scan`) the questions
    not yet in the output."""

    out: Path
    kind: str
    questions: list[Question]
    prices: PriceTable
    source: str
    reference: str | None = None
    todo: list[Question] = field(default_factory=list)
    summary: CollectSummary | None = None

    def scan(self, task: str) -> None:
        """Read the output (cutting a half-written last line): what is left to do."""
        present, truncated = scan_output(self.out, task, self.kind)
        self.todo = [q for q in self.questions if q.id not in present]
        self.summary = CollectSummary(
            out=str(self.out),
            total=len(self.questions),
            already=len(self.questions) - len(self.todo),
            truncated_partial_line=truncated,
            labels=self.labels,
        )

    @property
    def labels(self) -> str:
        """What the run's ``correct`` fields are measured against (``meta.labels``)."""
        return reference_labels(self.reference) if self.reference else GOLD


def plan_collection(cfg: CollectConfig, kind: str) -> Plan:
    """Check the output path, the questions and that every model is priced (before any
    call: never a silent zero)."""
    if not cfg.out:
        raise CCPOError("no output file: pass --out FILE.jsonl")
    questions, source = select_questions(cfg)
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise CCPOError("the question file holds duplicate ids")
    prices = load_prices(*cfg.prices)
    if kind == "base-guide":
        ladder = cfg.make_ladder()
        models = [*ladder.models(), *(p.model for p in cfg.policy_llm)]
        for m in ladder.models():
            cfg.endpoint_for(m)  # a model of the ladder without an endpoint: refused now
    else:
        models = [cfg.base_endpoint().model]
    if cfg.reference:
        cfg.endpoint_for(cfg.reference)  # the reference answers every question: needs one
        models.append(cfg.reference)
    prices.check(models)
    return Plan(Path(cfg.out), kind, questions, prices, source, cfg.reference)


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the output file for the whole run, so that two runs
    (or a run and the worker processes of a killed one) never append to it at once.

    Worker processes started by fork inherit the lock: it is free only once every process of
    the run has ended. Where ``fcntl`` does not exist (Windows) there is no lock. An output file
    this run created is removed again if the run wrote nothing to it (a start-up failure).
    """
    existed = out.exists()
    try:
        with _locked(out):
            yield
    finally:
        # a run that failed before writing a line leaves no empty output behind
        with contextlib.suppress(OSError):
            if not existed and out.stat().st_size == 0:
                out.unlink()


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fh = open(out, "ab")  # noqa: SIM115 - closed below, after the lock is released
    except OSError as e:
        raise CCPOError(f"{out}: cannot write ({e.strerror or e})") from None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CCPOError(
                f"{out} is being written by another ccpo collect run that is still going; wait "
                "for it to end (or stop it), or use another --out"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


async def run_questions(
    cfg: CollectConfig,
    kind: str,
    plan: Plan,
    write: Callable[[Trace], None],
    report: Callable[[CollectSummary], None],
    ledger: SpendLedger | None = None,
    halted: Callable[[], bool] = lambda: False,
) -> CCPOError | None:
    """Run ``plan.todo`` in this process, ``cfg.concurrency`` questions at a time.

    Each finished trace goes to ``write``; ``plan.summary`` is kept current and given to
    ``report`` after every question. A user-fixable error (:class:`CCPOError`) stops every
    question at once and is returned, not raised. ``halted`` lets another party (the parent of
    ``collect --workers``) stop the run between questions.
    """
    summary = plan.summary
    assert summary is not None, "scan the plan first"
    cache = ResponseCache(cfg.cache_path())
    client = cfg.client(cache, plan.prices, cfg.max_cost, ledger)
    runner = make_runner(cfg, client, kind, plan.source)
    run_one = run_base_guide if kind == "base-guide" else run_exit
    queue: asyncio.Queue[Question] = asyncio.Queue()
    for q in plan.todo:
        queue.put_nowait(q)
    stop = asyncio.Event()
    fatal: list[CCPOError] = []
    costliest: list[float] = []  # what the costliest question so far paid

    def tally() -> None:  # the client's counters into the summary
        summary.spent_usd, summary.calls, summary.cached, summary.retries = (
            client.spent_usd,
            client.n_calls,
            client.n_cached,
            client.n_retries,
        )

    async def worker() -> None:
        while not stop.is_set() and not halted():
            try:
                q = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                # admitted only when the costliest question so far (and a call's worst case) fits
                async with client.admit(
                    lambda: client.question_estimate(costliest[0] if costliest else None)
                ) as env:
                    trace = await run_one(runner, q)
                costliest[:] = [max([env.spent, *costliest])]
            except BudgetExceeded:
                summary.stopped_by_budget = True
                stop.set()
                return
            except NoReferenceAnswer as e:  # no label: left out, counted
                log.info("question %s left out: %s", q.id, e)
                summary.dropped.append(q.id)
                tally()
                report(summary)
                continue
            except LLMCallError as e:
                log.warning("question %s failed: %s", q.id, e)
                summary.failed.append(q.id)
                tally()
                report(summary)
                continue
            except CCPOError as e:  # user-fixable (a refused key, say)
                fatal.append(e)
            else:
                try:
                    write(trace)
                except CCPOError as e:  # the output cannot be written (disk full, ...)
                    fatal.append(e)
            if fatal:  # user-fixable: stop everything now
                stop.set()
                me = asyncio.current_task()
                for t in tasks:
                    if t is not me:
                        t.cancel()
                return
            summary.done += 1
            tally()
            report(summary)
            if not client.budget_left():
                summary.stopped_by_budget = True
                stop.set()

    try:
        n_tasks = min(cfg.concurrency, len(plan.todo))
        tasks = [asyncio.create_task(worker()) for _ in range(n_tasks)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, asyncio.CancelledError):
                raise res
    finally:
        tally()
        await client.aclose()
        cache.close()
    return fatal[0] if fatal else None


async def collect_async(
    cfg: CollectConfig, kind: str = "base-guide", progress: bool = True
) -> CollectSummary:
    """Run a collection (``kind``: ``base-guide`` or ``llm-exit``) in this process and return
    its summary. (``cfg.workers`` is for :func:`collect`, which can start processes.)"""
    plan = plan_collection(cfg, kind)
    with output_lock(plan.out):
        plan.scan(cfg.task)
        assert plan.summary is not None
        if not plan.todo:
            return plan.summary
        bar = ProgressBar(progress, plan.summary.total, plan.summary.already, kind)
        with TraceWriter(plan.out, append=True) as writer, bar:
            fatal = await run_questions(
                cfg, kind, plan, writer.write, lambda s: bar.update(s.counts())
            )
    if fatal is not None:
        raise fatal
    return plan.summary


class ProgressBar:
    """A rich progress bar (questions done / total, dollars spent, cache hits)."""

    def __init__(self, enabled: bool, total: int, already: int, kind: str) -> None:
        self.enabled = enabled
        self.already = already
        self._p = None
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._p = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("${task.fields[cost]:.4f}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task = self._p.add_task(
            f"collect {kind}", total=total, completed=already, cost=0.0, info=""
        )

    def __enter__(self) -> ProgressBar:
        if self._p is not None:
            self._p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)

    def update(self, counts: dict[str, Any], already: int | None = None) -> None:
        """Show ``counts`` (``CollectSummary.counts``, or their sum over the workers)."""
        if self._p is None:
            return
        info = f"calls {counts['calls']} cached {counts['cached']}"
        if counts["failed"]:
            info += f" failed {counts['failed']}"
        self._p.update(
            self._task,
            completed=self.already + counts["done"],
            cost=counts["spent"],
            info=info,
        )
