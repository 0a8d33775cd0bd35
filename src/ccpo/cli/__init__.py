"""The ``ccpo`` command line: the root app, every command group registered, errors as exit codes.

Each command group lives in its own module, its commands module-level functions (their
docstrings are their help) that ``register(app)`` adds:
:mod:`ccpo.cli.traces` (traces, prices, sim), :mod:`ccpo.cli.collect` (collect,
collect-exit), :mod:`ccpo.cli.learn` (train, compare), :mod:`ccpo.cli.evaluate` (evaluate,
check, reproduce), :mod:`ccpo.cli.deploy` (ask, serve, replay-server, dry-run).

:func:`main` runs the app and maps every error to one line and an exit code (0 done, 1 partial
or failed, 2 usage or input error, 130 interrupted); :func:`run` is the console script
(``ccpo``, ``python -m ccpo``). Shared options, exit codes and the help layout:
:mod:`ccpo.cli.options`; options derived from the typed configs: :mod:`ccpo.cli.config`.
"""

from __future__ import annotations

import difflib
import errno
import logging
import os
import re
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ccpo import __version__
from ccpo.cli import collect, deploy, evaluate, learn, traces
from ccpo.cli.options import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CCPOTyper, OrderedGroup
from ccpo.errors import CCPOError

console = Console()
err_console = Console(stderr=True)

app = CCPOTyper(
    name="ccpo",
    cls=OrderedGroup,
    help="Cost-effective, reliable LLM agents: collect traces, train and calibrate a conformal "
    "policy, compare it with the paper's baselines, deploy it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no "<bool>" type column for flags (typer 0.29)
    add_completion=False,
)
_state = {"debug": False}
_NOT_PERMITTED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _version(value: bool) -> None:
    if value:
        console.print(f"ccpo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print version.")
    ] = False,
    max_line_bytes: Annotated[
        str | None,
        typer.Option(
            "--max-line-bytes",
            metavar="N",
            help="Longest line a trace file or table may hold, in bytes (k/M/G: powers of "
            "1024) [8M, or $CCPO_MAX_LINE_BYTES]; longer lines are refused before being read "
            "whole.",
        ),
    ] = None,
) -> None:
    _state["debug"] = debug
    if debug:  # matplotlib's own warnings back (see quiet_matplotlib)
        logging.getLogger("matplotlib").setLevel(logging.NOTSET)
    if max_line_bytes is not None:
        from ccpo.traces.io import MAX_LINE_BYTES_ENV, parse_bytes

        # the environment, so that worker processes (compare --workers) read with it too
        os.environ[MAX_LINE_BYTES_ENV] = str(parse_bytes(max_line_bytes, "--max-line-bytes"))


for _group in (traces, evaluate, collect, deploy, learn):
    _group.register(app)


def _click_error_types() -> tuple[type[Exception], type[Exception]]:
    """``(ClickException, Abort)`` of the click that typer runs on: typer ≥ 0.26 ships its own
    copy (``typer._click``), older typer uses the ``click`` package; both are reached through
    typer's public exception classes, so ccpo never imports ``click`` itself."""
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    return click_error, typer.Abort


def _commands(ctx: Any) -> list[str]:
    """The subcommand names of the group a usage error happened in (for "did you mean")."""
    cmd = getattr(ctx, "command", None)
    names = getattr(cmd, "list_commands", None)
    return list(names(ctx)) if names is not None else []


def usage_line(e: Exception) -> str:
    """A click usage error as one line: where (the command), what, a "did you mean" where a
    close name exists, and where to look next."""
    msg = " ".join(e.format_message().split())  # type: ignore[attr-defined]
    # click 8.5 under typer < 0.26 says "Did you mean ...?" twice
    msg = re.sub(r"( Did you mean [^?]*\?)\1+", r"\1", msg)
    ctx = getattr(e, "ctx", None)
    m = re.match(r"No such command '(.+?)'\.", msg)
    if m and "did you mean" not in msg.lower():
        close = difflib.get_close_matches(m.group(1), _commands(ctx), n=1)
        if close:
            msg += f" Did you mean '{close[0]}'?"
    path = getattr(ctx, "command_path", None) or "ccpo"
    return f"{path}: {msg} (see '{path} --help')"


def _error(message: str) -> None:
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)


def quiet_matplotlib() -> None:
    """matplotlib's own warnings off (errors stay): on a machine where its font cache cannot
    be written (a first run under a full disk, a read-only home) it says so on stderr
    ("Could not save font_manager cache", "building the font cache", "created a temporary
    cache directory"), which would turn the command's one error line into several. The plots
    are drawn either way; ``--debug`` shows them."""
    logging.getLogger("matplotlib").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ccpo`` console script; returns the exit code.

    0: done (``--help`` included). 1: partial or failed (a command said so, e.g. ``collect``
    with failed questions or stopped by its budget; or the system refused, e.g. a full disk).
    2: usage or input error (unknown command or option, bad value, malformed file), printed
    as one line; ``--debug`` before the command shows the traceback instead. A group called
    without a command
    (``ccpo``, ``ccpo traces``) prints its help on stderr and exits 2, as click does since 8.2
    (a usage error: the command is missing). 130: interrupted.
    """
    click_error, abort = _click_error_types()
    _state["debug"] = False
    quiet_matplotlib()
    try:
        code = app(args=argv, standalone_mode=False, prog_name="ccpo")
    except CCPOError as e:
        if _state["debug"]:
            raise
        _error(str(e))
        return e.exit_code  # EXIT_USAGE, or EXIT_FAILED for a full disk (OutputWriteError)
    except click_error as e:
        if _state["debug"]:
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # `ccpo`, `ccpo traces`: the help, whole
            typer.echo(e.format_message(), err=True)
            return EXIT_USAGE
        _error(usage_line(e))
        return int(getattr(e, "exit_code", EXIT_USAGE)) or EXIT_USAGE
    except OSError as e:
        if _state["debug"]:
            raise
        _error(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        # a file that cannot be written or read at all (read-only, no permission) is the
        # user's to fix: 2; the system refusing part-way (a full disk, ...): 1
        return EXIT_USAGE if e.errno in _NOT_PERMITTED else EXIT_FAILED
    except (abort, KeyboardInterrupt):
        err_console.print("interrupted")
        return 130
    # standalone_mode=False: click (and typer's own copy) return typer.Exit's code, or the
    # command's return value
    return code if isinstance(code, int) else EXIT_OK


def run() -> None:
    """Console-script wrapper: exit with :func:`main`'s code."""
    sys.exit(main())
