"""The whole comparison of one trace set at one α: every baseline, the CPO family, CCPO (λ = 0
and λ > 0) and the oracle, on the same training split and evaluation splits."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ccpo.learning.trainers import TrainConfig
from ccpo.product.evaluate import (
    ResultRow,
    check_alpha,
    evaluate_policies,
    load_episodes,
    make_splits,
    split_sizes,
)
from ccpo.product.policies import (
    TrainedRow,
    TrainingCache,
    available_policies,
    policy_label,
    resolve_policies,
)
from ccpo.product.report import rich_table, training_curves, write_results


@dataclass
class CompareOutput:
    rows: list[ResultRow]
    files: dict[str, Path]
    seconds: float


def run_compare(
    traces: Path,
    out: Path,
    *,
    alpha: float,
    splits: int = 100,
    steps: int = 2000,
    seed: int = 0,
    lams: Sequence[float] = (2e-4,),
    eps: float = 0.05,
    prices: Sequence[Path] = (),
    console: Console | None = None,
    title: str | None = None,
    workers: int | None = None,
) -> CompareOutput:
    """``workers``: processes that train the (method, λ) policies at once [CPU cores + 1: a
    run is single-threaded]; results do not depend on it (each run is seeded by its config)."""
    console = console or Console()
    workers = (os.cpu_count() or 1) + 1 if workers is None else workers
    check_alpha(alpha)
    t0 = time.perf_counter()
    ep, _ = load_episodes(traces, prices)
    sizes = split_sizes(ep.n)
    sp = make_splits(ep.n, sizes, splits, seed)
    names = available_policies(ep, trained=True)
    names[-1:-1] = [f"ccpo-lam{lam:g}" for lam in lams if lam > 0]
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, disable=not console.is_terminal,
    ) as prog:  # fmt: skip
        tasks: dict[str, int] = {}

        def on_step(label: str, step: int, entry: dict[str, float]) -> None:
            if label not in tasks:
                tasks[label] = prog.add_task(f"train {label}", total=steps)
            prog.update(tasks[label], completed=step)

        cache = TrainingCache(TrainConfig(steps=steps, seed=seed, eps=eps), progress=on_step)
        policies = resolve_policies(names, ep, cache)
        keys = [
            (p.method, p.lam) for p in policies if isinstance(p, TrainedRow) and p.policy is None
        ]
        if workers > 1 and len(set(keys)) > 1:
            console.print(f"training {len(set(keys))} policies in {workers} processes …")
        cache.prefetch(keys, ep, sp.train, alpha, workers)
        rows = evaluate_policies(ep, policies, sp, alpha, seed)
    title = title or traces.name
    files = write_results(
        out,
        rows,
        alpha,
        title=title,
        traces=str(traces),
        splits=splits,
        seed=seed,
        steps=steps,
        sizes=dict(zip(("train", "cal", "test"), sizes, strict=True)),
    )
    logs = {policy_label(m, lam): p.log for (m, lam), p in cache.trained.items()}
    if logs:
        files["curves"] = training_curves(logs, alpha, out / "training_curves.png")
    seconds = time.perf_counter() - t0
    console.print(
        rich_table(
            rows,
            f"{title}: α = {alpha:g}, {splits} splits, train/cal/test = "
            f"{'/'.join(map(str, sizes))}",
            alpha,
        )
    )
    console.print(f"compare took {seconds:.1f} s; wrote {out}/results.json and plots")
    return CompareOutput(rows, files, seconds)
