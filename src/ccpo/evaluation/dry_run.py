"""``ccpo dry-run``: a policy answering live against its own logs, checked against its replay.

The last step before going live with a policy trained on your logs. The trace file is served
by the replay endpoint (:mod:`ccpo.runtime.replay_server`, in this process, on a free port of
127.0.0.1), every model of the policy's ladder is pointed at it, and the deployed agent
(:class:`~ccpo.runtime.agent.ConformalAgent`, the code ``ccpo serve`` runs) answers the file's
questions over real HTTP. Each served answer set is compared with the policy's replay on the
same question (:meth:`ccpo.api.ConformalPolicy.predict_set`): answers, rounds run,
models paid and cost must be equal. Zero API cost; any difference is a bug to report.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccpo.api import ConformalPolicy
from ccpo.errors import CCPOError, failing_as
from ccpo.policies.base import Policy
from ccpo.traces.io import read_traces


@dataclass
class DryRunReport:
    """What a dry run found: questions asked, how many equal their replay, the differences."""

    questions: int
    equal: int
    live_cost_usd: float
    replay_cost_usd: float
    calls: int
    seconds: float
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.equal == self.questions


class ReplayThread:
    """The replay endpoint's app (``app``) under uvicorn in a daemon thread on a free loopback
    port, its base URL ``url`` (``…/v1``); a context manager."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        cfg = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(cfg)
        self._thread = threading.Thread(
            target=lambda: self.server.run(sockets=[self._sock]), daemon=True
        )

    def __enter__(self) -> ReplayThread:
        self._thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if time.monotonic() - t0 > 30 or not self._thread.is_alive():
                raise CCPOError("the replay endpoint did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=20)
        self._sock.close()


def _paid(trace: Any, rounds: int, pol: Policy, first: int = 1) -> list[list[str]]:
    """The models a replay pays in ``rounds`` rounds from round ``first`` (routing may skip
    the ones before it: a call of theirs that a later step repeats is paid there), each round
    as the policy runs it (:meth:`~ccpo.policies.base.Policy.round_roles`)."""
    called = [pol.round_roles(t) for t in range(first, first + rounds)]
    if any(len(roles) < 2 for roles in called):  # a step called alone, the other skipped
        return [
            [getattr(trace.rounds[t - 1], role).model for role in roles]
            for t, roles in enumerate(called, start=first)
        ]
    if first > 1:
        from ccpo.traces.routing import paid_steps

        return [[m for m, _ in steps] for steps in paid_steps(trace, first - 1)[:rounds]]
    return [
        [s.model for s in (r.base, r.guide) if not getattr(s, "reused", False)]
        for r in trace.rounds[:rounds]
    ]


def asked(tr: Any) -> Any:
    """What a trace's question is asked as: its conversation (a chat trace), else its text."""
    from ccpo.traces.answers import family_of

    chat = tr.messages is not None and family_of(tr.task, tr.family) == "chat"
    return tr.conversation() if chat else tr.question


def check_traces(pol: Policy, folder: str | Path, traces_path: str | Path) -> None:
    """The policy's recorded provenance against the trace file, before anything is asked: a
    policy of another task or number of rounds T is refused (one line saying which), other
    differences (another file, other models) warn (:class:`PolicyProvenanceWarning`)."""
    from ccpo.evaluation.harness import trace_provenance
    from ccpo.policies import check_provenance
    from ccpo.runtime.agent import PolicyProvenanceWarning

    for line in check_provenance(pol.provenance, trace_provenance(traces_path), f"policy {folder}"):
        warnings.warn(line, PolicyProvenanceWarning, stacklevel=2)


def dry_run(
    policy: str | Path,
    traces_path: str | Path,
    config: dict[str, Any] | None = None,
    n: int | None = None,
    concurrency: int = 16,
    progress: Callable[[int], None] | None = None,
) -> DryRunReport:
    """Answer ``n`` questions of ``traces_path`` (evenly spread; all by default) live with
    ``policy`` against the replay endpoint and compare each with the policy's replay.
    ``config``: deploy settings (prices, rails, κ; endpoints are the replay endpoint's)."""
    from ccpo.runtime.agent import ConformalAgent, PolicyProvenanceWarning
    from ccpo.runtime.replay_server import ReplayIndex, create_replay_app

    replay = ConformalPolicy.load(policy)
    check_traces(replay.policy, policy, traces_path)
    all_traces = read_traces(traces_path)
    step = max(1, len(all_traces) // n) if n else 1
    chosen = all_traces[::step][: n or len(all_traces)]
    with ReplayThread(create_replay_app(ReplayIndex(all_traces, str(traces_path)))) as rs:
        models = {m for tr in all_traces for m in tr.models()}
        models |= {tr.question_embedding.model for tr in all_traces if tr.question_embedding}
        models = sorted(models)
        values = {
            **(config or {}),
            "endpoints": {m: {"url": rs.url} for m in models},
            "concurrency": concurrency,
            "cache": None,
        }
        with warnings.catch_warnings():  # provenance: checked against the file itself above
            warnings.simplefilter("ignore", PolicyProvenanceWarning)
            agent = ConformalAgent.from_artifact(policy, values)
        replay.prices = agent.prices  # the same table as the live agent's
        if agent.kappa is not None and replay.policy is not None:
            replay.policy.set_threshold(agent.kappa)  # and the same κ (a config may set one)
        with failing_as(f"the replay of the policy {policy} on {traces_path}"):
            expected = replay.predict_set(chosen)

        async def ask_all() -> list[Any]:
            sem = asyncio.Semaphore(concurrency)
            done = 0

            async def one(tr: Any) -> Any:
                nonlocal done
                async with sem:
                    s = await agent.aanswer(asked(tr), id=tr.id)
                done += 1
                if progress is not None:
                    progress(done)
                return s

            try:
                return await asyncio.gather(*(one(tr) for tr in chosen))
            finally:
                await agent.aclose()

        t0 = time.perf_counter()
        with failing_as(f"the live policy {policy} against the replay of {traces_path}"):
            served = asyncio.run(ask_all())
        seconds = time.perf_counter() - t0
    diffs: list[str] = []
    for tr, got, want in zip(chosen, served, expected, strict=True):
        paid = [lg.models for lg in got.log]
        problems = []
        if got.answers != want.answers:
            problems.append(f"answers {got.answers} vs replay {want.answers}")
        if got.rounds != want.rounds:
            problems.append(f"rounds {got.rounds} vs replay {want.rounds}")
        expected_paid = _paid(tr, want.rounds, replay.policy, want.first_round)
        if paid != expected_paid:
            problems.append(f"models paid {paid} vs replay {expected_paid}")
        if abs(got.cost_usd - want.cost_usd) > 1e-12:
            problems.append(f"cost ${got.cost_usd:.8f} vs replay ${want.cost_usd:.8f}")
        if problems:
            diffs.append(f"{tr.id}: " + "; ".join(problems))
    return DryRunReport(
        questions=len(chosen),
        equal=len(chosen) - len(diffs),
        live_cost_usd=sum(s.cost_usd for s in served),
        replay_cost_usd=sum(p.cost_usd for p in expected),
        calls=sum(len(lg.models) for s in served for lg in s.log),
        seconds=seconds,
        differences=diffs,
    )
