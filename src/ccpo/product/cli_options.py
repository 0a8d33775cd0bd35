"""Options shared by several ``ccpo`` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

PricesOpt = Annotated[
    list[Path] | None,
    typer.Option("--prices", help="Price file(s) merged over the bundled table (repeatable)."),
]
