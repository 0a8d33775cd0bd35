"""``ccpo traces``, ``ccpo prices`` and ``ccpo sim``: the trace files and the prices in force.

- ``traces validate`` / ``traces stats``: check a ccpo.trace/v1 file against the schema, and
  summarise it (rounds, accuracy or agreement per round, ladder, cost);
- ``traces import``: per-question answers of several models (CSV or JSONL) as a cascade of
  traces (:mod:`ccpo.traces.importer`), with their prices beside them;
- ``prices show``: the price table in force (bundled, merged with ``--prices`` files);
- ``sim``: SYNTHETIC traces (:mod:`ccpo.traces.sim`) for tests and demos.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ccpo.cli.config import build_config, config_options
from ccpo.cli.options import CCPOTyper, PricesOpt, count
from ccpo.errors import CCPOError
from ccpo.traces.sim import SimConfig

console = Console()


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


def traces_stats(
    file: Annotated[Path, typer.Argument(help="A .jsonl or .jsonl.gz trace file.")],
    prices: PricesOpt = None,
) -> None:
    """Questions, rounds, per-round accuracy (or agreement with the reference model that
    labelled the traces), solvable rate, mean tokens and cost per round."""
    from ccpo.evaluation.harness import prices_for
    from ccpo.traces.io import iter_traces
    from ccpo.traces.labels import GOLD, against_text, rule_labels
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
    if st.simulated:
        from ccpo.traces.verify import simulated_note

        console.print(f"[yellow]note:[/yellow] {simulated_note(st.simulated)}", highlight=False)
    acc = "acc" if labels == [GOLD] else ("accept" if rule_labels(labels[0]) else "agree")
    t = Table()
    if lad is not None and all(r.one_model or r.verifies for r in lad.rounds):  # one per step
        verify = any(r.verifies for r in lad.rounds)
        for c in ("step", "model", acc, *(("yes",) if verify else ()), "tokens", "cost ¢"):
            t.add_column(c, justify="right")
        for r, lr in zip(st.table(), lad.rounds, strict=False):
            name = f"{lr.guide.model} verifies" if lr.verifies else lr.base.model
            yes = (f"{r['verdict_yes']:.3f}" if lr.verifies else "",) if verify else ()
            tokens = r["guide_tokens"] if lr.verifies else r["base_tokens"]
            t.add_row(str(r["round"]), name, f"{r['base_acc']:.3f}", *yes, f"{tokens:.0f}",
                      f"{r['cost_cents']:.4f}")  # fmt: skip
        console.print(t)
        return
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


def traces_import(
    table: Annotated[Path, typer.Argument(help="A CSV (with header) or JSONL table.")],
    out: Annotated[Path, typer.Option("--out", help="Output .jsonl or .jsonl.gz trace file.")],
    task: Annotated[
        str,
        typer.Option(
            help="Task name (any: medqa, ...); mmlu, hotpotqa, jsonl and chat are built in."
        ),
    ],
    family: Annotated[
        str | None,
        typer.Option(
            help="Answer family of a task that is not built in: mcq (option letters), short "
            "(SQuAD-style free text; the default), exact (equal after trimming), number (the "
            "last number in the answer, compared as a number: maths) or chat (replies to a "
            "conversation, compared verbatim; a messages column holds it)."
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
    accept: Annotated[
        str | None,
        typer.Option(
            metavar="RULE",
            help="Label by the table's 'score' column: a row is correct iff its score meets "
            "RULE, 'score OP NUMBER' or 'score OP reference[±NUMBER]' (the reference model's "
            "score on the same question; --reference names it, else the most expensive "
            "model), e.g. 'score>=8' or 'score>=reference-1'. A question with a missing score "
            "is left out (counted).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing --out file.")] = False,
    prices: PricesOpt = None,
    signals: Annotated[
        str | None,
        typer.Option(
            metavar="LIST",
            help="Record these ladder signals, computed from the answers (comma-separated: "
            "similarity, length, refusal, logprob); policies trained on the traces use them.",
        ),
    ] = None,
    steps: Annotated[
        str | None,
        typer.Option(
            metavar="one|pair",
            help="one (the default): each round calls one model, cheapest first, so the "
            "ladder can stop after any call, its cheapest model's reply included. pair: "
            "round t calls the t-th cheapest model and the next stronger one (the layout "
            "of earlier imports; the default with --guide).",
        ),
    ] = None,
    verifier: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL",
            help="A verify step after each step but the last: MODEL's Yes/No on the reply, "
            "priced as its own step; verdicts from the table's verdict, verdict_input_tokens, "
            "verdict_output_tokens[, verdict_confidence] columns, or --simulate-verifier.",
        ),
    ] = None,
    verify_after: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL[,MODEL]",
            help="With --verifier: verify only the replies of these steps' models.",
        ),
    ] = None,
    simulate_verifier: Annotated[
        float | None,
        typer.Option(
            metavar="ACCURACY",
            help="SIMULATE the verdicts of a table without them: the reply's label flipped "
            "with probability 1 − ACCURACY; the traces and every report say so.",
        ),
    ] = None,
) -> None:
    """Import per-question answers of several models (question_id, question, model, answer,
    input_tokens, output_tokens[, correct, logprob, confidence, gold, reasoning]) as a
    cascade, cheapest model first: one model per round (--steps one), or round t's base the
    t-th cheapest model and its guide the next stronger one (--steps pair, or --guide). The
    traces record this ladder (verdict = agreement), so a policy trained on them
    can be served on the same models; an answer a later round repeats is charged once. Without
    'correct' (or with --reference) the labels are agreement with a reference model; a
    question whose reference answer is empty is dropped (counted). --verifier adds verify
    steps (docs/import.md). With --prices, the prices of the table's models are written
    beside the output (OUT.prices.json), where stats, train and compare find them. The table
    is streamed (memory: one question at a time)."""
    from ccpo.traces.accept import parse_rule
    from ccpo.traces.importer import import_signals, open_table, with_text_signals
    from ccpo.traces.io import write_traces
    from ccpo.traces.labels import against_text
    from ccpo.traces.prices import load_prices

    if out.exists() and not force:
        raise CCPOError(f"{out} exists; pass --force to overwrite it")
    rule = None if accept is None else parse_rule(accept)
    price_table = load_prices(*(prices or []))
    chosen = import_signals((signals or "").replace(",", " ").split())
    after = [m.strip() for m in (verify_after or "").split(",") if m.strip()] or None
    with open_table(
        table, task, price_table, guide, family, reference, rule, steps, verifier, after,
        simulate_verifier,
    ) as imp:  # fmt: skip
        plan = imp.cascade
        costs = ", ".join(f"{m} {100 * plan.cost_per_question[m]:.4f}" for m in plan.order())
        console.print(
            f"{table.name}: {imp.questions} questions; mean cost per question (¢): {costs}"
        )
        ref = imp.reference
        if imp.rule is not None:
            _print_scored(imp)
        elif imp.from_gold:
            from ccpo.traces.answers import family_of

            console.print(
                "labels: the table's gold answers (an answer is correct iff it equals the gold "
                f"under the {family_of(task, family)} normaliser; no correct column)",
                highlight=False,
            )
        elif ref is not None:
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
        ladder = imp.ladder()
        if plan.one_model:
            for c in ("step", "model", "mean cost ¢"):
                t.add_column(c)
            for i, lr in enumerate(ladder.rounds, start=1):
                m, v = lr.base.model, lr.verifies
                t.add_row(str(i), f"{lr.guide.model} verifies {m}'s reply" if v else m,
                          "" if v else f"{100 * plan.cost_per_question[m]:.4f}")  # fmt: skip
        else:
            for c in ("round", "base", "guide", "verdict"):
                t.add_column(c)
            for i, (b, g) in enumerate(zip(plan.bases, plan.guides, strict=True), start=1):
                paid = [
                    f"{m} (reused, paid once)" if ladder.reused(i, role) else m
                    for m, role in ((b, "base"), (g, "guide"))
                ]
                t.add_row(str(i), *paid, "agree")
        console.print(t)
        if chosen:
            console.print(f"signals: {', '.join(chosen)}", highlight=False)
        if plan.verifier is not None:
            from ccpo.traces.verify import simulated_note, simulated_record

            sim = None if imp.simulate is None else simulated_record(plan.verifier, imp.simulate)
            said = simulated_note(sim) or "the table's verdict columns (the verifier's calls)"
            console.print(f"verdicts: {said}", highlight=False)
        n = write_traces(out, (with_text_signals(tr, chosen) for tr in imp.traces()))
        dropped, unscored = imp.dropped, imp.unscored
    if unscored:
        console.print(
            f"left out {len(unscored)} of {imp.questions} questions: a model's score is missing "
            f"(never guessed): {', '.join(unscored[:5])}{' …' if len(unscored) > 5 else ''}",
            highlight=False,
        )
    if dropped:
        shown = ", ".join(dropped[:5]) + (" …" if len(dropped) > 5 else "")
        why = (
            "no row has a gold answer (nothing to label by)"
            if imp.from_gold
            else f"{ref}'s answer is empty (nothing to agree with)"
        )
        console.print(
            f"dropped {len(dropped)} of {imp.questions} questions: {why}: {shown}",
            highlight=False,
        )
    console.print(f"[green]wrote[/green] {n} traces to {out}")
    if prices:  # the verifier's price too: its verdicts are priced calls of the traces
        verifier_models = [] if plan.verifier is None else [plan.verifier]
        _write_sidecar(out, price_table, [*plan.order(), *verifier_models])


def _write_sidecar(out: Path, table, models) -> None:
    """The prices of ``models`` (those ``table`` has) beside the trace file ``out``
    (``OUT.prices.json``, where stats, train and compare read them), said on the console."""
    from ccpo.evaluation.harness import sidecar_path
    from ccpo.traces.io import written_whole
    from ccpo.traces.prices import PriceTable

    own = PriceTable({m: table.price(m) for m in models if table.has(m)}, table.sources)
    side = sidecar_path(out)
    with written_whole(side) as tmp:
        tmp.write_text(json.dumps(own.to_price_file(), indent=1) + "\n", encoding="utf-8")
    console.print(
        f"[green]wrote[/green] the prices of its models to {side} (read beside the traces by "
        "stats, train and compare)",
        soft_wrap=True,  # (a path is never cut)
    )


def traces_judge(
    traces: Annotated[Path, typer.Argument(help="A .jsonl or .jsonl.gz trace file.")],
    out: Annotated[Path, typer.Option("--out", help="Output .jsonl or .jsonl.gz trace file.")],
    judge_model: Annotated[str, typer.Option(help="The judge model's name at --judge-url.")],
    judge_url: Annotated[
        str | None,
        typer.Option(help="The judge's OpenAI-compatible base URL (default: the OpenAI API)."),
    ] = None,
    judge_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the judge's API key.")
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            help="rating: a 1-10 rating given the reference reply, accepted by --accept; "
            "pairwise: which reply is better, asked in both orders, accepted unless the "
            "reference wins; both: accepted when both accept."
        ),
    ] = "rating",
    accept: Annotated[
        str | None,
        typer.Option(
            metavar="RULE",
            help="Which ratings accept a reply ('score OP NUMBER') [default: score>=8].",
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL",
            help="The model whose reply is the yardstick (default: the last round's guide).",
        ),
    ] = None,
    cache: Annotated[
        Path | None,
        typer.Option(help="Response cache (SQLite) [default: ~/.cache/ccpo/responses.sqlite]."),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Judge calls in flight.")] = 8,
    max_cost: Annotated[
        float | None, typer.Option(help="Stop before the judge's spend passes this (USD).")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    force: Annotated[bool, typer.Option(help="Overwrite an existing --out file.")] = False,
    prices: PricesOpt = None,
) -> None:
    """Label each ladder model's reply by an LLM judge that compares it with the reference
    model's reply to the same conversation (the trace's messages, else its question). Prompts
    are ccpo's own (versioned), at temperature 0; every call is cached, so an interrupted run
    resumes without paying twice. A judge reply without a readable rating is asked once more,
    then left unjudged: its question is left out and counted, never guessed. The judge, the
    mode and the rule are recorded in meta.labels and named in every guarantee. The ladder
    models' prices (the input's own TRACES.prices.json beside it, and --prices) are written
    beside the output, as import writes them."""
    import asyncio

    from ccpo.cli.options import EXIT_FAILED
    from ccpo.evaluation.harness import prices_for, sidecar_prices
    from ccpo.llm.client import Endpoint, LLMClient
    from ccpo.llm.config import default_cache_path
    from ccpo.llm.judge import PROMPT_VERSION, Judge, JudgeCache, judge_traces, reference_of
    from ccpo.traces.accept import parse_rule
    from ccpo.traces.io import read_traces, write_traces
    from ccpo.traces.labels import against_text

    if out.exists() and not force:
        raise CCPOError(f"{out} exists; pass --force to overwrite it")
    own_prices = sidecar_prices(traces)  # the input's (an import's --prices), carried over
    price_table = prices_for(traces, prices or [])
    price_table.check([judge_model])
    rows = read_traces(traces)
    if not rows:
        raise CCPOError(f"{traces}: holds no traces")
    replies = JudgeCache(cache or default_cache_path(), price_table, judge_model)
    client = LLMClient(replies, price_table, concurrency, max_cost=max_cost)
    endpoint = Endpoint(judge_model, judge_url, judge_key_env)
    if mode == "pairwise" and accept is not None:
        raise CCPOError(
            "--accept applies to ratings; --mode pairwise accepts a reply unless the judge "
            "prefers the reference's (drop --accept, or use --mode both)"
        )
    rule = None if mode == "pairwise" else parse_rule(accept or "score>=8")
    judge = Judge(client, endpoint, mode, rule)
    reference_of(rows, reference)  # a usage error, before the run (whose errors cost money)
    s = judge.summary
    progress = _JudgeProgress(len(rows), quiet)

    async def run():
        try:
            return await judge_traces(judge, rows, reference, lambda: progress.tick(client))
        finally:
            await client.aclose()

    try:
        with progress:
            labelled = asyncio.run(run())
    except CCPOError as e:  # the budget, the judge gone for good (refusing, not answering)
        console.print(
            f"[red]stopped[/red]: {e}; {_judge_spend(s)}; every reply paid for is cached: rerun "
            f"(with a larger --max-cost if it stopped there) to finish without paying for them "
            f"again; {out} not written",
            highlight=False,
        )
        raise typer.Exit(EXIT_FAILED) from None
    except KeyboardInterrupt:
        console.print(f"[red]interrupted[/red]: {_judge_spend(s)}; {out} not written",
                      highlight=False)  # fmt: skip
        raise
    n = write_traces(out, labelled)
    labels = labelled[0].meta["labels"] if labelled else judge.labels(reference or "?")
    console.print(f"labels: {against_text(labels)} (prompts {PROMPT_VERSION})",
                  highlight=False, soft_wrap=True)  # fmt: skip
    console.print(
        f"judged {s.replies} replies of {s.questions} questions: {s.accepted} accepted; "
        f"{s.retried} judge replies unreadable and asked again; {len(s.unjudged)} unjudged "
        f"(never guessed); {_judge_spend(s)}",
        highlight=False,
    )
    for what, ids in (("unjudged, question left out", s.unjudged),
                      ("reference reply empty, question left out", s.no_reference)):  # fmt: skip
        if ids:
            shown = "; ".join(ids[:5]) + (" …" if len(ids) > 5 else "")
            console.print(f"{len(ids)} {what}: {shown}", highlight=False)
    console.print(f"[green]wrote[/green] {n} traces to {out}")
    if prices or own_prices:  # the ladder's prices travel with its traces, as import's do
        _write_sidecar(out, price_table, sorted({m for tr in rows for m in tr.models()}))


def _judge_spend(s) -> str:
    """What a judging has cost (a :class:`~ccpo.llm.judge.JudgeSummary`): in all so far, this
    run's part and the earlier runs' whose replies the cache served."""
    return (
        f"spent ${s.total_usd:.4f} in all: ${s.spent_usd:.4f} by this run on {s.calls} judge "
        f"calls, ${s.earlier_usd:.4f} by earlier runs ({s.cached} replies served by the cache)"
    )


class _JudgeProgress:
    """A rich progress bar of judged questions and the judge's spend (none when quiet)."""

    def __init__(self, total: int, quiet: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._p = None if quiet else Progress(
            TextColumn("[bold]judge"), BarColumn(), MofNCompleteColumn(),
            TextColumn("${task.fields[cost]:.4f} calls {task.fields[calls]}"),
            console=Console(stderr=True),
        )  # fmt: skip
        self._task = None if self._p is None else self._p.add_task(
            "judge", total=total, cost=0.0, calls=0
        )  # fmt: skip

    def tick(self, client) -> None:
        if self._p is not None:
            self._p.update(self._task, advance=1, cost=client.spent_usd, calls=client.n_calls)

    def __enter__(self):
        if self._p is not None:
            self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)


def _print_scored(imp) -> None:
    """The labels of an import with --accept, in words."""
    from ccpo.traces.labels import against_text

    console.print(f"labels: {against_text(imp.labels)} (--accept {imp.rule.text})", highlight=False)
    if imp.replaced:
        console.print("note: the scores replace the table's correct/gold labels", highlight=False)


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


def traces_embed(
    traces: Annotated[Path, typer.Argument(help="A .jsonl or .jsonl.gz trace file.")],
    out: Annotated[Path, typer.Option("--out", help="Output .jsonl or .jsonl.gz trace file.")],
    embedding_model: Annotated[
        str, typer.Option(help="The embedding model's name at --embedding-url.")
    ],
    embedding_url: Annotated[
        str | None,
        typer.Option(help="Its OpenAI-compatible base URL (default: the OpenAI API)."),
    ] = None,
    embedding_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding its API key.")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Questions per /embeddings call.")] = 32,
    timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds one /embeddings call may take.")
    ] = 60.0,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    force: Annotated[bool, typer.Option(help="Overwrite an existing --out file.")] = False,
) -> None:
    """Record each trace's question embedding (a chat trace's last user turn) from an
    OpenAI-compatible /embeddings endpoint, for `train --route --route-embeddings`. A batch
    that fails is asked once more, then nothing is written. Serve asks the same model (the
    deployment's endpoint for it) per question; a failure there falls back to the text."""
    import asyncio

    from ccpo.llm.client import Endpoint, LLMClient
    from ccpo.llm.question_embed import embed_traces
    from ccpo.traces.io import read_traces, write_traces

    if out.exists() and not force:
        raise CCPOError(f"{out} exists; pass --force to overwrite it")
    rows = read_traces(traces)
    if not rows:
        raise CCPOError(f"{traces}: holds no traces")
    endpoint = Endpoint(embedding_model, embedding_url, embedding_key_env)
    endpoint.resolve_key()  # a missing key variable is said before any call
    client = LLMClient(None, None, 1)
    progress = Progress(
        TextColumn("[bold]embed"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=quiet, transient=True,
    )  # fmt: skip

    async def run():
        try:
            task = progress.add_task("embed", total=len(rows))
            tick = lambda k: progress.advance(task, k)  # noqa: E731
            return await embed_traces(client, endpoint, rows, batch, timeout, tick)
        finally:
            await client.aclose()

    with progress:
        embedded = asyncio.run(run())
    n = write_traces(out, embedded)
    dim = len(embedded[0].question_embedding.vector)  # type: ignore[union-attr]
    console.print(
        f"[green]wrote[/green] {n} traces to {out}: each question's embedding by "
        f"{embedding_model} ({dim} numbers)",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Add the ``traces`` and ``prices`` groups and ``sim`` to ``app``."""
    traces_app = CCPOTyper(
        help="Validate, summarise and import ccpo.trace/v1 files.", no_args_is_help=True
    )
    traces_app.command("validate")(traces_validate)
    traces_app.command("stats")(traces_stats)
    traces_app.command("import")(traces_import)
    traces_app.command("judge")(traces_judge)
    traces_app.command("embed")(traces_embed)
    prices_app = CCPOTyper(help="Show the price table in force.", no_args_is_help=True)
    prices_app.command("show")(prices_show)
    app.add_typer(traces_app, name="traces")
    app.add_typer(prices_app, name="prices")
    app.command("sim")(sim)
