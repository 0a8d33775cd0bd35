"""What the ``ccpo`` commands share: exit codes, options, checks, and the help layout.

- exit codes :data:`EXIT_OK` (0), :data:`EXIT_FAILED` (1: partial or failed) and
  :data:`EXIT_USAGE` (2: usage or input error);
- options several commands take: ``--prices`` (:data:`PricesOpt`), ``--alpha``
  (:data:`AlphaOpt`), ``--force`` (:data:`ForceOpt`);
- checks before any work is done: :func:`check_out_folder`, :func:`require_training`;
- :func:`warn` and :func:`count` for the one-line messages;
- :class:`CCPOTyper`: a typer app whose commands list their options in panels
  (:class:`PanelCommand`), its root group in :data:`COMMAND_ORDER` (:class:`OrderedGroup`).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from ccpo.errors import CCPOError, require_extra

#: the order ``ccpo --help`` lists the commands in: the main job first, the synthetic
#: generator last (a command not named here comes before ``sim``)
COMMAND_ORDER = (
    "reproduce", "train", "compare", "evaluate", "check", "ask", "serve", "dry-run",
    "replay-server", "collect", "collect-exit", "traces", "prices", "sim",
)  # fmt: skip


class PanelCommand(TyperCommand):
    """A command whose plain help lists its options in panels: the command's own options
    first ("Options"), then one section per ``rich_help_panel`` (the research knobs of a
    config, say) in the order they first appear. Typer draws panels only in its rich help,
    which ccpo does not use (``rich_markup_mode=None``)."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args: list[tuple[str, str]] = []
        panels: dict[str | None, list[tuple[str, str]]] = {None: []}
        for param in self.get_params(ctx):
            rec = param.get_help_record(ctx)
            if rec is None:
                continue
            if param.param_type_name == "argument":
                args.append(rec)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None), []).append(rec)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        for title, recs in panels.items():
            if recs:
                with formatter.section(title or "Options"):
                    formatter.write_dl(recs)


class OrderedGroup(TyperGroup):
    """A command group listing its commands in :data:`COMMAND_ORDER`."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {n: i for i, n in enumerate(COMMAND_ORDER)}
        last = rank["sim"]
        return sorted(names, key=lambda n: (rank.get(n, last - 0.5), names.index(n)))


class CCPOTyper(typer.Typer):
    """``typer.Typer`` whose commands are :class:`PanelCommand` unless told otherwise."""

    def command(self, name: str | None = None, *, cls: Any = None, **kw: Any) -> Any:
        return super().command(name, cls=cls or PanelCommand, **kw)


EXIT_OK = 0
"""The command did everything it was asked."""
EXIT_FAILED = 1
"""Partial or failed: some work was not done (failed questions, a budget stop, a full disk)."""
EXIT_USAGE = 2
"""Usage or input error: unknown command or option, bad value, malformed or missing file."""

PricesOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--prices",
        metavar="FILE",
        help="Price file(s) merged over the bundled table (repeatable).",
    ),
]


def check_alpha_flag(value: Any) -> Any:
    """``--alpha`` (one value or a repeated option's list) must lie in (0, 1): a usage error
    naming the flag otherwise."""
    for a in value if isinstance(value, list) else [value]:
        if a is not None and not 0.0 < a < 1.0:  # NaN too
            raise typer.BadParameter(f"{a:g} is not a miscoverage level: α must be in (0, 1)")
    return value


AlphaOpt = Annotated[
    float,
    typer.Option(
        "--alpha", metavar="α", help="Miscoverage level α in (0, 1).", callback=check_alpha_flag
    ),
]

ForceOpt = Annotated[
    bool, typer.Option("--force", help="Replace what --out already holds (default: refuse).")
]

_err = Console(stderr=True)


def count(n: int, noun: str) -> str:
    """``1 question``, ``5 questions``: a number with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def quiet_http_logs() -> None:
    """The HTTP clients' per-request log lines off (commands that call LLMs draw their own
    progress)."""
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def warn(message: str) -> None:
    """One ``warning:`` line on stderr (the command goes on)."""
    _err.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)


def check_writable(out: Path) -> None:
    """Refuse, before any work is done, an ``--out`` folder that cannot be made or written: a
    path under a file, a read-only folder or file system. Probes with a nameless temporary
    file in ``out`` or its nearest existing parent, so it creates nothing."""
    parent = out.absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CCPOError(f"--out {out}: {parent} is a file, not a folder; choose a folder path")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise CCPOError(
            f"--out {out}: cannot write in {parent} ({e.strerror or e}); choose a writable folder"
        ) from None


def check_out_folder(out: Path, holds: str | None = None, force: bool = False) -> None:
    """Refuse an ``--out`` that is a file or cannot be written (:func:`check_writable`), and
    (unless ``force``) a folder already holding ``holds`` (e.g. ``policy.json``: a trained
    policy is never replaced without a word)."""
    if out.exists() and not out.is_dir():
        raise CCPOError(f"--out {out} is a file, not a folder; choose a folder path")
    check_writable(out)
    if holds is not None and (out / holds).exists() and not force:
        raise CCPOError(
            f"--out {out} already holds {holds}; pass --force to replace it, or choose "
            "another --out"
        )


def require_training(command: str) -> None:
    """Refuse ``command`` before any work, with the pip install that brings what it needs,
    when the ``train`` extra is missing: matplotlib (the training curves and the comparison
    plots). Serving, asking and the score methods do not need it."""
    require_extra("matplotlib", "train", command)
