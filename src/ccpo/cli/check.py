"""``ccpo check``: a trained policy's guarantee on another trace file, with its own κ̂
(:mod:`ccpo.evaluation.check`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ccpo.cli.options import EXIT_FAILED, PricesOpt, warn

_out = Console()


def register(app: typer.Typer) -> None:
    @app.command("check")
    def check_cmd(
        policy: Annotated[
            Path, typer.Option("--policy", help="Trained policy folder (ccpo train).")
        ],
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
                _out.print(line, highlight=False, soft_wrap=True)
        if not report.holds:
            raise typer.Exit(EXIT_FAILED)
