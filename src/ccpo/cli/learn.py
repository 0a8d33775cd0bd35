"""``ccpo train`` and ``ccpo compare``: train CCPO / the CPO family and compare every method."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ccpo.cli.config import build_config, config_options
from ccpo.cli.options import (
    AlphaOpt,
    ForceOpt,
    PricesOpt,
    check_out_folder,
    count,
    require_training,
    warn,
)
from ccpo.learning.config import StopConfig, TrainConfig
from ccpo.policies.budget import LATENCY, budget_line, check_budget_value, within
from ccpo.policies.routing.holder import SUFFIX as ROUTE_SUFFIX
from ccpo.policies.spec import default_answer, method_help, parse_spec
from ccpo.traces.ladder import CHAT

console = Console()

#: StopConfig fields the train command sets itself (the method names the learner; the κ
#: tracker's settings belong to `ccpo serve --adapt-kappa`)
_STOP_FIXED = ("alpha", "seed", "learner", "eta0", "xi", "batch_size")
DEGENERATE = 0.95
"""``train`` warns when C(o) is every action at every round on this share of calibration
questions."""


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
        transient=False, disable=not console.is_terminal,
    )  # fmt: skip


def _step_info(entry: dict[str, float]) -> str:
    return (
        f"cost {entry['train/cost']:.3f}¢ cov {entry['train/coverage']:.2f} "
        f"κ {entry['conformal/kappa']:.3f}"
    )


@config_options(
    (TrainConfig, ("method", "alpha", "seed"), "Training: ccpo and the cpo family"),
    (StopConfig, _STOP_FIXED, "Fitting: cstop, cstop-lr (auto's candidates too)"),
)
def train_cmd(
    traces: Annotated[Path, typer.Option("--traces", help="Trace file (.jsonl[.gz]).")],
    out: Annotated[Path, typer.Option("--out", help="Output policy folder.")],
    method: Annotated[str, typer.Option(help=method_help())] = "auto",
    alpha: AlphaOpt = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the split and of training.")] = 0,
    answer: Annotated[
        str | None,
        typer.Option(
            help="set: return an answer set covering a correct answer w.p. ≥ 1 − α (the "
            "paper's policies); single: return exactly one answer, correct w.p. ≥ 1 − α on "
            "solvable questions (methods auto, cstop, cstop-lr, depth-k; see --guarantee). "
            "Default: single on chat "
            "traces (a reply is one reply), set otherwise.",
            show_default=False,
        ),
    ] = None,
    delta: Annotated[
        float,
        typer.Option(
            help="--answer single --guarantee pac: the guarantee holds w.p. ≥ 1 − δ over the "
            "calibration questions."
        ),
    ] = 0.1,
    route: Annotated[
        bool,
        typer.Option(
            "--route",
            help="--answer single: decide from the question text alone, before any call, "
            "which round to start at (skipped rounds are neither called nor paid); the "
            "router's and the stopping thresholds are certified together (Learn-then-Test).",
        ),
    ] = False,
    route_embeddings: Annotated[
        bool,
        typer.Option(
            "--route-embeddings",
            help="With --route: the router reads each question's recorded embedding too "
            "(`ccpo traces embed`); a text-only router stands in where the embedding is "
            "missing when served, and the guarantee covers both.",
        ),
    ] = False,
    latency_budget: Annotated[
        float | None,
        typer.Option(
            "--latency-budget",
            metavar="SECONDS",
            help="The policy's mean estimated latency per question must be ≤ SECONDS (a mean "
            "over questions): auto keeps the cheapest candidate within it; another method is "
            "refused when its calibrated policy exceeds it (its threshold is never moved).",
            show_default=False,
        ),
    ] = None,
    prices: PricesOpt = None,
    force: ForceOpt = False,
    config: dict | None = None,
) -> None:
    """Train a policy on the training split and calibrate κ on every other question.

    The training questions are chosen by a seeded hash of the question ids (the same
    questions in any line order give the same policy), as many as `compare` trains on.

    Writes a policy folder (weights, κ, featurizer spec, config, prices, provenance: task,
    trace file sha256, models, T, α; training log, training curves) that `ccpo evaluate
    --policy DIR`, `ccpo ask`, `ccpo serve` and the Python API load. Refuses to replace an
    existing policy folder without --force; warns when the calibrated policy is degenerate
    (C(o) holds every action at every round).
    """
    from ccpo.evaluation.harness import (
        calibration_shortfall,
        check_alpha,
        load_episodes,
        trace_provenance,
    )

    check_alpha(alpha)
    check_budget_value(latency_budget)
    settings = config or {}
    stop_settings = settings.get(StopConfig, {})
    spec = parse_spec(method, answer=answer, route=route, route_embeddings=route_embeddings,
                      lam=settings[TrainConfig]["lam"], delta=delta, settings=stop_settings,
                      latency_budget=latency_budget)  # fmt: skip
    if spec.trains:
        require_training(f"ccpo train --method {method}")
    check_out_folder(out, "policy.json", force)
    build_config(StopConfig, stop_settings)  # a bad value is refused before any work
    cfg = build_config(
        TrainConfig,
        {**settings[TrainConfig], "method": spec.technique.trainer or "ccpo", "alpha": alpha,
         "seed": seed, "lam": spec.lam},
    )  # fmt: skip
    ep, price_table = load_episodes(traces, prices or [])
    spec = replace(spec, train_config=cfg)
    if answer is None:
        spec = replace(spec, answer=default_answer(ep.family, spec.method, route))
        if spec.single and ep.family == CHAT and not route:
            console.print(
                "chat traces: training a single-reply policy (--answer single; "
                "--answer set for sets of replies)"
            )
    if not spec.single and ep.family == CHAT:
        warn(
            "a set policy on chat traces: the app is shown one reply of the set, and the "
            "guarantee covers the set, not that reply (--answer single guarantees the reply)"
        )
    ep, sp, sizes = train_splits(ep, seed, spec.single)
    short = calibration_shortfall(alpha, sizes["calibration"])
    if short is not None and spec.technique.calibrates:  # κ̂ by split conformal
        warn(short)
    provenance = {**trace_provenance(traces), "alpha": alpha}
    if latency_budget is not None:
        provenance["latency_budget_s"] = latency_budget
    got = _fit(spec, ep, sp, alpha, seed, price_table.to_price_file(), provenance)
    _report(spec, got, ep, sp.cal[0], alpha, out)


@config_options(
    (TrainConfig, ("method", "alpha", "seed", "lam"), "Training: ccpo and the cpo family")
)
def compare_cmd(
    traces: Annotated[Path, typer.Option("--traces", help="Trace file (.jsonl[.gz]).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder.")],
    alpha: AlphaOpt = 0.1,
    splits: Annotated[int, typer.Option(help="Random evaluation splits.", min=1)] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the splits and of training.")] = 0,
    lam: Annotated[
        list[float] | None,
        typer.Option(metavar="λ", help="Extra CCPO rows with λ > 0 (repeatable)."),
    ] = None,
    prices: PricesOpt = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Processes training policies at once [CPU cores + 1].", min=1),
    ] = None,
    config: dict | None = None,
) -> None:
    """Train and evaluate every method and baseline the traces allow, on the same splits.

    Writes results.json (all rows), results.md/.csv, box plots of coverage and cost, and
    training curves.
    """
    require_training("ccpo compare")
    from ccpo.evaluation.comparison import run_compare

    check_out_folder(out)
    settings = dict((config or {})[TrainConfig])
    build_config(TrainConfig, settings)  # a bad combination is refused before any work
    run_compare(
        traces,
        out,
        alpha=alpha,
        splits=splits,
        steps=settings.pop("steps"),
        seed=seed,
        lams=[0.5] if lam is None else lam,
        eps=settings.pop("eps"),
        prices=prices or [],
        console=console,
        workers=workers,
        settings=settings,
    )


def train_splits(ep, seed: int, single: bool = False):
    """``train``'s split: the training questions (:func:`ccpo.evaluation.harness.train_size`:
    as ``compare`` trains, or for a single answer ⌈0.3 n⌉ so that Learn-then-Test has the
    rest; chosen by :func:`~ccpo.evaluation.harness.id_splits`: order-free), and the policy
    calibrated on **every** other question (the paper's 1000/200/200 protocol, with a test
    split, stays in ``compare`` / ``reproduce``). Returns the reordered episodes, the splits
    and the sizes ``{"train", "calibration"}`` that summary.json records."""
    from ccpo.evaluation.harness import id_splits, train_size

    n_train = train_size(ep.n, single)
    ep, sp = id_splits(ep, (n_train, ep.n - n_train, 0), 1, seed)
    return ep, sp, {"train": n_train, "calibration": ep.n - n_train}


def warn_degenerate(full: float, kappa: float, alpha: float, n_cal: int) -> None:
    """Warn when C(o) holds every action at every round on ≥ :data:`DEGENERATE` of the
    ``n_cal`` calibration questions (``full``, from
    :func:`ccpo.evaluation.harness.full_set_rate`); the remedy is more data when they are too
    few for α (:func:`ccpo.evaluation.harness.calibration_shortfall`, said before training)."""
    from ccpo.evaluation.harness import calibration_shortfall

    if full >= DEGENERATE:
        remedy = (
            "the calibration questions are too few for this α (see above)"
            if calibration_shortfall(alpha, n_cal) is not None
            else "try more --steps, another --seed or a larger α"
        )
        warn(
            f"degenerate policy: on {full:.0%} of the calibration questions C(o) holds every "
            f"action at every round (κ = {kappa:.3g}), so it runs all T rounds and returns "
            f"every answer, at the cost of running everything; {remedy}"
        )


def ltt_slack(n_cal: int, alpha: float, delta: float) -> str | None:
    """What ``n_cal`` calibration questions cost a single answer, when it is much: the most
    misses Learn-then-Test lets a certified rule make on them (below 0.8 α, the rest of α is
    paid in calls to stronger models), and how many questions would allow 0.8 α (said when
    that is at least a quarter more)."""
    from ccpo.policies.single import allowed_misses, questions_for

    k = allowed_misses(n_cal, alpha, delta)
    need = questions_for(alpha, delta, 0.8)
    if k < 0 or k / n_cal >= 0.8 * alpha or need < 1.25 * n_cal:
        return None
    return (
        f"note: on {n_cal} calibration questions a certified rule may miss on at most {k} "
        f"({k / n_cal:.1%}) at α = {alpha:g}, δ = {delta:g}, so the policy escalates more than "
        f"α asks; about {need} calibration questions would let it miss on {0.8 * alpha:.0%}"
    )


def _print_latency(summary: dict) -> None:
    """ "calibration latency 1.23 s per question (budget 1.5 s): holds", with a budget."""
    budget = summary.get("latency_budget_s")
    if budget is not None:
        line = budget_line(summary["calibration_latency_s"], budget)
        console.print(f"on the calibration questions {line}", highlight=False)


def _print_yardstick(y) -> None:
    """ "on the calibration questions X costs 74% of always-M (…)", and a warning when the
    policy is not cheaper than calling the reference alone."""
    if y is None:
        return
    console.print(f"on the calibration questions {y.line()}", highlight=False)
    if y.warning():
        warn(y.warning())


def _print_choice(
    figures: dict[str, dict[str, float]], picked: str, budget: float | None = None
) -> None:
    """auto's candidates with their validation cost and coverage, the pick marked; with a
    latency budget, their estimated latency too, those over it marked; what the routed
    candidates are, when there are any."""
    width = max(10, *(len(n) for n in figures))
    for name, f in figures.items():
        mark = "  ← picked" if name == picked else ""
        lat = None if budget is None else f.get(LATENCY, math.nan)
        if lat is not None and not within(lat, budget):
            mark = "  not eligible" if math.isnan(lat) else "  over the latency budget"
        console.print(
            f"  {name:{width}s} validation cost {f['cost_cents_per_question']:.4f}¢/question, "
            f"coverage {f['coverage']:.3f}"
            + ("" if lat is None else f", latency {lat:.2f} s")
            + mark
        )
    both = [n for n in figures if n.endswith(ROUTE_SUFFIX)]
    if "router" in figures or both:
        said = ["router: the prompt alone picks the model whose reply is returned"]
        said += [f"{n}: that router picks where to start, then {n[: -len(ROUTE_SUFFIX)]} "
                 "decides after each reply" for n in both]  # fmt: skip
        console.print("  (" + "; ".join(said) + ")", highlight=False)


def _auto_pick(auto: dict[str, Any] | None) -> str:
    """`` (auto)`` after a fitted policy's name, `` (auto: router)`` for a routed pick."""
    if not auto:
        return ""
    picked = auto.get("picked", "")
    return " (auto: router)" if picked == "router" else " (auto)"


def _fit(spec, ep, sp, alpha: float, seed: int, prices: dict, provenance: dict):
    """:func:`ccpo.policies.pipeline.train_policy` on the training split, calibrated on the
    calibration split, with a progress bar (RL steps) or a status line while it fits."""
    from ccpo.policies.pipeline import train_policy

    n = count(sp.train.size, "question")
    fit = partial(train_policy, spec, ep, sp.train, alpha, seed, cal=sp.cal[0], prices=prices,
                  provenance=provenance)  # fmt: skip
    if not spec.trains:
        single = " (single answer)" if spec.single else ""
        with console.status(f"fitting {spec.method}{single} on {n} …"):
            return fit()
    assert spec.train_config is not None
    with _progress() as prog:
        task = prog.add_task(f"train {spec.variant}", total=spec.train_config.steps, info="")
        return fit(progress=lambda step, e: prog.update(task, completed=step, info=_step_info(e)))


def _report(spec, got, ep, cal, alpha: float, out: Path) -> None:
    """Write the policy folder and summary.json (all files or none), and say what was fitted:
    auto's choice, the threshold and calibration figures, the cost against calling the
    reference alone, the estimated latency, a degenerate set."""
    from ccpo.evaluation.yardstick import yardstick
    from ccpo.report.plots import training_curves
    from ccpo.report.results import staged_folder

    pol, summary = got.policy, got.summary
    for note in got.notes:
        console.print(note)
    cost = summary["calibration_cost_cents"] / 100 / max(len(cal), 1)
    y = yardstick(pol.variant, pol, ep, cal, cost, by_auto="auto" in summary)
    if y is not None:
        summary.update(reference=y.name, cost_ratio_to_reference=y.ratio)
    with staged_folder(out) as tmp:  # all files or none (a full disk)
        pol.save(tmp)
        if spec.trains:
            training_curves({pol.variant: pol.log}, alpha, tmp / "training_curves.png")
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    auto = summary.get("auto")
    if auto:
        _print_choice(auto["validation"], auto["picked"], spec.latency_budget)
    n_train, n_cal = (count(summary["sizes"][k], "question") for k in ("train", "calibration"))
    how = f"in {summary['seconds']:.1f} s on {n_train}"
    if spec.trains:
        k = summary["kappa"] if summary["kappa"] is not None else summary["kappa_online"]
        console.print(
            f"trained [bold]{pol.variant}[/bold] {how}; κ = {k:.4g} (online "
            f"{summary['kappa_online']:.4g}); calibration coverage "
            f"{summary['calibration_coverage']:.3f} on {n_cal}"
        )
    elif spec.single:
        from ccpo.traces.labels import against_text

        what = against_text(pol.provenance.get("against", "gold")).replace("accuracy", "coverage")
        marginal = summary.get("guarantee") == "marginal"
        how_certified = (
            " (conformal risk control: marginal)"
            if marginal
            else f" (Learn-then-Test, δ = {spec.delta:g})"
        )
        ltt = pol.threshold_text(how_certified)
        console.print(
            f"fitted [bold]{pol.variant}[/bold]{_auto_pick(auto)} {how}; {ltt}; "
            f"calibration {what} {summary['calibration_coverage']:.3f}, "
            f"{summary['calibration_rounds']:.2f} rounds on {n_cal}"
        )
        slack = None if marginal else ltt_slack(summary["sizes"]["calibration"], alpha, spec.delta)
        if slack:
            console.print(slack, highlight=False)
    else:
        console.print(
            f"fitted [bold]{pol.variant}[/bold]{_auto_pick(auto)} {how}; "
            f"{pol.threshold_text()}; calibration coverage "
            f"{summary['calibration_coverage']:.3f} on {n_cal}"
        )
    if not (spec.single or spec.greedy):
        warn_degenerate(summary["calibration_full_set_rate"], pol.threshold, alpha, len(cal))
    _print_yardstick(y)
    _print_latency(summary)
    if ep.simulated:
        console.print(f"[yellow]note:[/yellow] {ep.simulated}", highlight=False)
    console.print(f"wrote policy folder {out}")


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``compare`` to ``app``."""
    app.command("train")(train_cmd)
    app.command("compare")(compare_cmd)
