"""``ccpo evaluate``, ``ccpo check`` and ``ccpo reproduce``: policies scored on trace files.

- ``evaluate``: named policies and trained policy folders on the same random evaluation
  splits (:mod:`ccpo.evaluation.harness`), results written by :mod:`ccpo.report.results`;
- ``check``: a trained policy's guarantee on another trace file with its own κ̂
  (:mod:`ccpo.evaluation.check`); exit 1 on a shortfall beyond noise;
- ``reproduce``: ``compare`` on every bundled real trace set at several α, one report
  (:mod:`ccpo.evaluation.reproduce`).

The heavy modules are imported inside the commands, so ``ccpo --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ccpo.cli.options import (
    EXIT_FAILED,
    AlphaOpt,
    PricesOpt,
    check_alpha_flag,
    check_out_folder,
    require_training,
    warn,
)

console = Console()


def evaluate(
    traces: Annotated[Path, typer.Option("--traces", help="Trace file (.jsonl[.gz]).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy",
            metavar="NAME|DIR",
            help="Policy name (random, base, guide, uala, oracle, llm-policy:<model>, all) or a "
            "trained policy folder; repeatable.",
        ),
    ] = ["all"],  # noqa: B006
    alpha: AlphaOpt = 0.1,
    splits: Annotated[int, typer.Option(help="Random evaluation splits.", min=1)] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the splits.")] = 0,
    n_train: Annotated[int | None, typer.Option(help="Training split size.")] = None,
    n_cal: Annotated[int | None, typer.Option(help="Calibration split size.")] = None,
    n_test: Annotated[int | None, typer.Option(help="Test split size.")] = None,
    prices: PricesOpt = None,
) -> None:
    """Score policies on R random calibration/test splits; write results.json/.md/.csv and
    box plots of coverage and cost."""
    require_training("ccpo evaluate")  # box plots (matplotlib)
    from ccpo.evaluation.harness import evaluate_policies, load_splits
    from ccpo.evaluation.rows import TrainingCache, resolve_policies
    from ccpo.report.money import print_money
    from ccpo.report.results import write_results
    from ccpo.report.tables import print_results

    ep, used, sizes, sp = load_splits(
        traces, alpha, splits, seed, prices or [], (n_train, n_cal, n_test)
    )
    check_out_folder(out)
    pols = resolve_policies(policy, ep, TrainingCache())
    check_artifacts(pols, traces, alpha)
    with console.status("scoring policies...") as status:
        rows = evaluate_policies(
            ep, pols, sp, alpha, seed, progress=lambda name: status.update(f"scored {name}")
        )
    files = write_results(
        out,
        rows,
        alpha,
        title=traces.name,
        traces=str(traces),
        splits=splits,
        seed=seed,
        sizes=dict(zip(("train", "cal", "test"), sizes, strict=True)),
        against=ep.labels,
        prices=used,
        **({"simulated": ep.simulated} if ep.simulated else {}),
    )
    print_results(console, rows, traces.name, alpha, splits, sizes, ep.labels, ep.simulated)
    print_money(console, rows, sizes[2])
    console.print(f"wrote {', '.join(str(p) for p in files.values())}")


def check_artifacts(pols: list[Any], traces: Path, alpha: float) -> None:
    """Policy folders among ``pols``: refuse another task or horizon than ``traces``; warn
    about other trace files, models, synthetic vs real data, and another α."""
    from ccpo.evaluation.harness import trace_provenance
    from ccpo.evaluation.rows import FolderRow
    from ccpo.policies import check_provenance

    folders = [p for p in pols if isinstance(p, FolderRow) and p.policy is not None]
    if not folders:
        return
    actual = trace_provenance(traces)
    for p in folders:
        rec = p.policy.provenance
        where = f"--policy {p.name}"
        for line in check_provenance(rec, actual, where):
            warn(line)
        trained = rec.get("alpha", p.policy.alpha)
        if abs(trained - alpha) > 1e-12 and p.policy.calibrates:
            warn(f"{where}: trained for α = {trained:g}, re-calibrated and scored at α = {alpha:g}")


def check_cmd(
    policy: Annotated[Path, typer.Option("--policy", help="Trained policy folder (ccpo train).")],
    traces: Annotated[
        Path,
        typer.Option("--traces", help="Trace file of the traffic to check on (.jsonl[.gz])."),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of the report.")
    ] = False,
    prices: PricesOpt = None,
) -> None:
    """Check a policy on new traffic before going live: replay the trace file with the
    policy's own κ̂ (no recalibration, no LLM call) and report coverage with a 95%
    Clopper-Pearson interval, cost per question, answer-set size, the verdict (holds /
    shortfall beyond noise: the whole interval below 1 − α) and the κ that restores
    1 − α on this file. Exit 0 when it holds, 1 on a shortfall beyond noise, 2 on a usage
    or input error (e.g. a policy for another task)."""
    from ccpo.evaluation.check import report_lines, run_check

    report, warnings = run_check(policy, traces, prices or [])
    for line in warnings:
        warn(line)
    if as_json:
        typer.echo(json.dumps(report.to_json()))
    else:
        for line in report_lines(report):
            console.print(line, highlight=False, soft_wrap=True)
        if report.money is not None:
            from ccpo.report.money import rung_table
            from ccpo.report.tables import render_rich

            console.print(render_rich(rung_table(report.money)))
    if not report.holds:
        raise typer.Exit(EXIT_FAILED)


def reproduce_cmd(
    out: Annotated[Path, typer.Option("--out", help="Output folder.")] = Path("runs/reproduce"),
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            metavar="NAME|FILE",
            help="Bundled set name or trace file (repeatable); default: every bundled set.",
        ),
    ] = None,
    alpha: Annotated[
        list[float] | None,
        typer.Option(
            "--alpha", metavar="α", help="α values (repeatable).", callback=check_alpha_flag
        ),
    ] = None,
    splits: Annotated[
        int | None, typer.Option(help="Evaluation splits [100; 20 with --quick].", min=1)
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(help="Training steps per method [2000; 200 with --quick].", min=1),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="20 splits, 200 steps: a quick tour (113 s measured on 2 cores)."
        ),
    ] = False,
    seed: Annotated[
        list[int] | None,
        typer.Option(
            "--seed",
            metavar="S",
            help="Seed of splits and training (repeatable: one run per seed, and tables "
            "of the mean ± sd across seeds; each seed adds the full time again). [0]",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Processes training policies, shared by every α [CPU cores].", min=1),
    ] = None,
) -> None:
    """Run `compare` on every bundled real trace set at α = 0.1 and 0.2 and write one
    report (report.md, report.html with plots inline) with tables, box plots, training
    curves and a cost-vs-coverage frontier. No API key needed."""
    require_training("ccpo reproduce")
    from ccpo.evaluation.harness import check_alpha
    from ccpo.evaluation.reproduce import run_reproduce

    check_out_folder(out)
    alphas = alpha or [0.1, 0.2]
    for a in alphas:
        check_alpha(a)
    run_reproduce(out, data, alphas, splits, steps, quick, seed or [0], console, workers)


def register(app: typer.Typer) -> None:
    """Add ``evaluate``, ``check`` and ``reproduce`` to ``app``."""
    app.command("evaluate")(evaluate)
    app.command("check")(check_cmd)
    app.command("reproduce")(reproduce_cmd)
