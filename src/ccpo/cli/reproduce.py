"""``ccpo reproduce``: the one-command tour on the bundled real trace sets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ccpo.cli.options import check_alpha_flag, check_out_folder, require_training

console = Console()


def register(app: typer.Typer) -> None:
    @app.command("reproduce")
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
                "--quick", help="20 splits, 200 steps: a quick tour (32 s measured on 2 cores)."
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
