"""The ``ccpo`` command line. Every command has ``--help``; errors are one line (``--debug``
shows the traceback)."""

from __future__ import annotations

import difflib
import errno
import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from ccpo import __version__
from ccpo.cli.config import build_config, config_options
from ccpo.cli.options import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    AlphaOpt,
    PricesOpt,
    check_out_folder,
    count,
    require_training,
    warn,
)
from ccpo.errors import CCPOError
from ccpo.traces.sim import SimConfig

console = Console()
err_console = Console(stderr=True)

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
traces_app = CCPOTyper(
    help="Validate, summarise and import ccpo.trace/v1 files.", no_args_is_help=True
)
prices_app = CCPOTyper(help="Show the price table in force.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
app.add_typer(prices_app, name="prices")

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
    if max_line_bytes is not None:
        from ccpo.traces.io import MAX_LINE_BYTES_ENV, parse_bytes

        # the environment, so that worker processes (compare --workers) read with it too
        os.environ[MAX_LINE_BYTES_ENV] = str(parse_bytes(max_line_bytes, "--max-line-bytes"))


@traces_app.command("validate")
def traces_validate(
    file: Annotated[Path, typer.Argument(help="A .jsonl or .jsonl.gz trace file.")],
) -> None:
    """Check every line against the ccpo.trace/v1 schema (streams; stops at the first error)."""
    from ccpo.traces.io import iter_traces

    n = rounds = 0
    for tr in iter_traces(file):  # also refuses duplicate ids and mixed tasks
        n += 1
        rounds += tr.n_rounds
    console.print(
        f"[green]ok[/green] {file}: {count(n, 'trace')}, {count(rounds, 'round')}, "
        "schema ccpo.trace/v1"
    )


@traces_app.command("stats")
def traces_stats(
    file: Annotated[Path, typer.Argument(help="A .jsonl or .jsonl.gz trace file.")],
    prices: PricesOpt = None,
) -> None:
    """Questions, rounds, per-round accuracy (or agreement with the reference model that
    labelled the traces), solvable rate, mean tokens and cost per round."""
    from ccpo.evaluation.harness import prices_for
    from ccpo.traces.io import iter_traces
    from ccpo.traces.labels import GOLD, against_text
    from ccpo.traces.stats import trace_stats

    table = prices_for(file, prices or [])
    st = trace_stats(iter_traces(file), table)
    hist = ", ".join(f"{k} rounds: {v}" for k, v in sorted(st.rounds_hist.items()))
    console.print(
        f"[bold]{file}[/bold]: {count(st.questions, 'question')} ({hist}); "
        f"task {', '.join(sorted(st.tasks))}; solvable {st.solvable_rate:.3f}; "
        f"models {', '.join(sorted(st.models))}"
    )
    lad = st.ladder()
    console.print(
        f"ladder: {lad.describe()}"
        if lad is not None
        else f"ladder: the traces follow {len(st.ladders)}+ different ladders (not deployable "
        "as one policy)",
        highlight=False,
        soft_wrap=True,
    )
    labels = sorted(st.labels) or [GOLD]
    console.print(
        "correct = "
        + " / ".join(
            "gold answers (accuracy)" if lab == GOLD else against_text(lab) for lab in labels
        )
        + (" (mixed labels: one guarantee needs one)" if len(labels) > 1 else ""),
        highlight=False,
    )
    acc = "acc" if labels == [GOLD] else "agree"
    t = Table()
    for c in ("round", f"base {acc}", f"guide {acc}", "guide yes", "base tok", "guide tok",
              "cost ¢"):  # fmt: skip
        t.add_column(c, justify="right")
    for r in st.table():
        t.add_row(
            str(r["round"]),
            f"{r['base_acc']:.3f}",
            f"{r['guide_acc']:.3f}",
            f"{r['verdict_yes']:.3f}",
            f"{r['base_tokens']:.0f}",
            f"{r['guide_tokens']:.0f}",
            f"{r['cost_cents']:.4f}",
        )
    console.print(t)


@traces_app.command("import")
def traces_import(
    table: Annotated[Path, typer.Argument(help="A CSV (with header) or JSONL table.")],
    out: Annotated[Path, typer.Option("--out", help="Output .jsonl or .jsonl.gz trace file.")],
    task: Annotated[
        str,
        typer.Option(help="Task name (any: medqa, ...); mmlu, hotpotqa, jsonl are built in."),
    ],
    family: Annotated[
        str | None,
        typer.Option(
            help="Answer family of a task that is not built in: mcq (option letters), short "
            "(SQuAD-style free text; the default) or exact (equal after trimming)."
        ),
    ] = None,
    guide: Annotated[
        str | None, typer.Option(help="One model as the guide of every round (default: a cascade).")
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL",
            help="Label by agreement with this model of the table: a row is correct iff its "
            "answer equals MODEL's on that question (task normaliser). A table without a "
            "'correct' column is labelled so anyway, against its most expensive model unless "
            "named; with 'correct' present, agreement replaces it.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing --out file.")] = False,
    prices: PricesOpt = None,
) -> None:
    """Import per-question answers of several models (question_id, question, model, answer,
    input_tokens, output_tokens[, correct, logprob, confidence, gold, reasoning]) as a
    cascade: round t's base is the t-th cheapest model, its guide the next stronger one (or
    --guide). The traces record this ladder (verdict = agreement), so a policy trained on them
    can be served on the same models; an answer a later round repeats is charged once. Without
    'correct' (or with --reference) the labels are agreement with a reference model; a
    question whose reference answer is empty is dropped (counted). With --prices, the prices
    of the table's models are written beside the output (OUT.prices.json), where stats, train
    and compare find them. The table is streamed (memory: one question at a time)."""
    from ccpo.evaluation.harness import sidecar_path
    from ccpo.traces.importer import open_table
    from ccpo.traces.io import write_traces
    from ccpo.traces.labels import against_text
    from ccpo.traces.prices import load_prices

    if out.exists() and not force:
        raise CCPOError(f"{out} exists; pass --force to overwrite it")
    price_table = load_prices(*(prices or []))
    with open_table(table, task, price_table, guide, family, reference) as imp:
        plan = imp.cascade
        costs = ", ".join(f"{m} {100 * plan.cost_per_question[m]:.4f}" for m in plan.order())
        console.print(
            f"{table.name}: {imp.questions} questions; mean cost per question (¢): {costs}"
        )
        ref = imp.reference
        if ref is not None:
            why = (
                "named with --reference"
                if imp.reference_named
                else ("the most expensive model of the table; name another with --reference")
            )
            console.print(f"labels: {against_text(imp.labels)} ({why})", highlight=False)
            if imp.replaced:
                console.print(
                    f"note: agreement with {ref} replaces the table's correct/gold labels",
                    highlight=False,
                )
        t = Table()
        for c in ("round", "base", "guide", "verdict"):
            t.add_column(c)
        ladder = imp.ladder()
        for i, (b, g) in enumerate(zip(plan.bases, plan.guides, strict=True), start=1):
            paid = [
                f"{m} (reused, paid once)" if ladder.reused(i, role) else m
                for m, role in ((b, "base"), (g, "guide"))
            ]
            t.add_row(str(i), *paid, "agree")
        console.print(t)
        n = write_traces(out, imp.traces())
        dropped = imp.dropped
    if dropped:
        shown = ", ".join(dropped[:5]) + (" …" if len(dropped) > 5 else "")
        console.print(
            f"dropped {len(dropped)} of {imp.questions} questions: {ref}'s answer is empty "
            f"(nothing to agree with): {shown}",
            highlight=False,
        )
    console.print(f"[green]wrote[/green] {n} traces to {out}")
    if prices:
        from ccpo.traces.io import written_whole
        from ccpo.traces.prices import PriceTable

        own = PriceTable({m: price_table.price(m) for m in plan.order()}, price_table.sources)
        side = sidecar_path(out)
        with written_whole(side) as tmp:
            tmp.write_text(json.dumps(own.to_price_file(), indent=1) + "\n", encoding="utf-8")
        console.print(
            f"[green]wrote[/green] the prices of its models to {side} (read beside the traces "
            "by stats, train and compare)"
        )


@prices_app.command("show")
def prices_show(
    prices: PricesOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the table in the price-file format.")
    ] = False,
) -> None:
    """List every model's price (USD per million tokens) with its date and source."""
    from ccpo.traces.prices import load_prices

    table = load_prices(*(prices or []))
    if as_json:
        typer.echo(json.dumps(table.to_price_file(), indent=1, sort_keys=True))
        return
    t = Table()
    t.add_column("model", no_wrap=True)  # never cut a model name: it is what users type
    for c in ("in $/Mtok", "out $/Mtok", "as of"):
        t.add_column(c, justify="right" if "$" in c else "left", no_wrap=True)
    t.add_column("source", min_width=10)
    for name, p in sorted(table.models.items()):
        t.add_row(
            name,
            f"{p.input_usd_per_mtok:g}",
            f"{p.output_usd_per_mtok:g}",
            p.as_of or "",
            p.source or "",
        )
    console.print(t)


@app.command("sim")
@config_options((SimConfig, (), "The generator (ccpo.traces.sim.SimConfig)"))
def sim(
    out: Annotated[Path, typer.Option("--out", help="Output .jsonl or .jsonl.gz file.")],
    config: dict | None = None,
) -> None:
    """Write SYNTHETIC traces (for tests and demos; not LLM results)."""
    from ccpo.traces.io import write_traces
    from ccpo.traces.sim import generate

    cfg = build_config(SimConfig, (config or {}).get(SimConfig, {}))
    k = write_traces(out, generate(cfg))
    console.print(f"wrote {k} [yellow]synthetic[/yellow] traces to {out}")


@app.command("evaluate")
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
    require_training("ccpo evaluate")  # box plots (matplotlib); trainable names (torch)
    from ccpo.evaluation.harness import (
        check_alpha,
        evaluate_policies,
        id_splits,
        load_episodes,
        split_sizes,
        used_prices,
    )
    from ccpo.evaluation.rows import TrainingCache, resolve_policies
    from ccpo.report.tables import rich_table, saving_line, write_results

    check_alpha(alpha)
    ep, table = load_episodes(traces, prices or [])
    sizes = split_sizes(ep.n, n_train, n_cal, n_test)
    ep, sp = id_splits(ep, sizes, splits, seed)
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
        prices=used_prices(ep, table),
    )
    console.print(
        rich_table(
            rows,
            f"{traces.name}: α = {alpha:g}, {splits} splits, "
            f"train/cal/test = {'/'.join(map(str, sizes))}",
            alpha,
            sizes[2],
            ep.labels,
        )
    )
    saving = saving_line(rows, alpha, ep.labels)
    if saving:
        console.print(f"saving: {saving}")
    console.print(f"wrote {', '.join(str(p) for p in files.values())}")


def check_artifacts(pols: list[Any], traces: Path, alpha: float) -> None:
    """Policy folders among ``pols``: refuse another task or horizon than ``traces``; warn
    about other trace files, models, synthetic vs real data, and another α."""
    from ccpo.evaluation.harness import trace_provenance
    from ccpo.evaluation.rows import ArtifactRow
    from ccpo.learning.policy import check_provenance

    folders = [p for p in pols if isinstance(p, ArtifactRow) and p.policy is not None]
    if not folders:
        return
    actual = trace_provenance(traces)
    for p in folders:
        rec = getattr(p.policy, "provenance", None) or {}
        where = f"--policy {p.name}"
        for line in check_provenance(rec, actual, where):
            warn(line)
        trained = rec.get("alpha", p.policy.alpha)
        if abs(trained - alpha) > 1e-12 and p.scoring == "batch":
            warn(f"{where}: trained for α = {trained:g}, re-calibrated and scored at α = {alpha:g}")


def _register_commands() -> None:
    from ccpo.cli.check import register as register_check
    from ccpo.cli.collect import register as register_collect
    from ccpo.cli.deploy import register as register_deploy
    from ccpo.cli.learn import register as register_learn
    from ccpo.cli.reproduce import register as register_reproduce

    register_collect(app)
    register_deploy(app)
    register_check(app)
    register_learn(app)
    register_reproduce(app)


_register_commands()


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


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console-script wrapper: exit with :func:`main`'s code."""
    sys.exit(main())
