"""``ccpo train`` and ``ccpo compare``: train CCPO / the CPO family and compare every method."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated

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
from ccpo.errors import CCPOError
from ccpo.learning.config import StopConfig, TrainConfig
from ccpo.policies.budget import LATENCY, budget_line, check_budget, check_budget_value, within
from ccpo.policies.registry import method_help, method_names, resolve_method, variant_name
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
            "solvable questions (methods auto, cstop, cstop-lr, depth-k; calibrated by "
            "Learn-then-Test, guarantee with probability ≥ 1 − δ). Default: single on chat "
            "traces (a reply is one reply), set otherwise.",
            show_default=False,
        ),
    ] = None,
    delta: Annotated[
        float,
        typer.Option(
            help="--answer single: the guarantee holds w.p. ≥ 1 − δ over the calibration questions."
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
    found = resolve_method(method)
    if found is None:
        raise CCPOError(f"--method must be one of {method_names()} or ccpo-lam<λ>, got '{method}'")
    check_answer(answer, method, delta, route)
    if route_embeddings and (not route or answer == "set"):
        raise CCPOError("--route-embeddings works with --route and single answers")
    settings = config or {}
    spec, lam = found[0], found[1] or settings[TrainConfig]["lam"]
    if not spec.fitted_on_replay:
        require_training(f"ccpo train --method {method}")
    check_out_folder(out, "policy.json", force)
    stop_settings = settings.get(StopConfig, {})
    build_config(StopConfig, stop_settings)  # a bad value is refused before any work
    cfg = build_config(
        TrainConfig,
        {**settings[TrainConfig], "method": spec.trainer or "ccpo", "alpha": alpha,
         "seed": seed, "lam": lam},
    )  # fmt: skip
    ep, price_table = load_episodes(traces, prices or [])
    answer = answer or default_answer(ep.family, method, route)
    if answer == "set" and ep.family == CHAT:
        warn(
            "a set policy on chat traces: the app is shown one reply of the set, and the "
            "guarantee covers the set, not that reply (--answer single guarantees the reply)"
        )
    from ccpo.policies.rl import RLPolicy
    from ccpo.report.plots import training_curves
    from ccpo.report.results import staged_folder

    ep, sp, sizes = train_splits(ep, seed)
    short = calibration_shortfall(alpha, sizes["calibration"])
    if short is not None and spec.calibrates:  # κ̂ by split conformal
        warn(short)
    provenance = {**trace_provenance(traces), "alpha": alpha}
    if latency_budget is not None:
        provenance["latency_budget_s"] = latency_budget
    if answer == "single":
        _train_single(
            method, ep, sp, sizes, alpha, seed, delta, price_table, out, provenance,
            stop_settings, routed=route, route_embeddings=route_embeddings,
            budget=latency_budget,
        )  # fmt: skip
        return
    if spec.fitted_on_replay:
        _train_stopping(
            method, ep, sp, sizes, alpha, seed, price_table, out, provenance, stop_settings,
            latency_budget, routed=route,
        )  # fmt: skip
        return
    from ccpo.learning.training import train  # torch: only for CCPO / CPO, once data is read

    steps = cfg.steps
    variant = variant_name(spec.name, lam)
    t0 = time.perf_counter()
    with _progress() as prog:
        task = prog.add_task(f"train {variant}", total=steps, info="")
        res = train(
            ep,
            sp.train,
            cfg,
            lambda step, e: prog.update(task, completed=step, info=_step_info(e)),
        )
    seconds = time.perf_counter() - t0
    pol = RLPolicy.from_result(res, variant, price_table.to_price_file())
    summary, full = _calibrate(pol, ep, sp.cal[0], alpha, provenance, sizes)
    summary = {"variant": variant, "seconds": round(seconds, 2),
               "kappa_online": pol.kappa_online, **summary}  # fmt: skip
    _hold_budget(summary, latency_budget, variant)
    y = _yardstick(pol, ep, sp.cal[0], summary)
    with staged_folder(out) as tmp:  # all files or none (a full disk)
        pol.save(tmp)
        training_curves({variant: res.log}, alpha, tmp / "training_curves.png")
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    console.print(
        f"trained [bold]{variant}[/bold] in {seconds:.1f} s on "
        f"{count(sizes['train'], 'question')}; κ = {pol.kappa:.4g} "
        f"(online {pol.kappa_online:.4g}); "
        f"calibration coverage {summary['calibration_coverage']:.3f} on "
        f"{count(sizes['calibration'], 'question')}"
    )
    if not pol.greedy:
        warn_degenerate(full, pol.kappa, alpha, sp.cal.shape[1])
    _print_yardstick(y)
    _print_latency(summary)
    console.print(f"wrote policy folder {out}")


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


def default_answer(family: str, method: str, route: bool) -> str:
    """``train``'s answer kind without ``--answer``: ``single`` on a chat ladder (an app shows
    one reply, and a guarantee on a set of replies says nothing about the one it shows) or
    with ``--route``, when the method has a single form; ``set`` otherwise (the paper's)."""
    from ccpo.policies.registry import single_form_of

    if (family == CHAT or route) and single_form_of(method):
        if family == CHAT and not route:
            console.print(
                "chat traces: training a single-reply policy (--answer single; "
                "--answer set for sets of replies)"
            )
        return "single"
    return "set"


def check_answer(answer: str | None, method: str, delta: float, route: bool = False) -> None:
    """``--answer``, ``--delta`` and ``--route`` of ``train``: a one-line usage error before
    any work (``answer`` None: the default, :func:`default_answer`)."""
    from ccpo.policies.registry import SINGLE_METHODS, single_form_of

    sets = ("auto", "cstop", "cstop-lr")
    if route and not (single_form_of(method) if answer != "set" else method in sets):
        raise CCPOError(
            "--route works with --method auto, cstop or cstop-lr (answer sets), or "
            f"auto, {', '.join(SINGLE_METHODS)} (--answer single)"
        )
    if answer is None:
        return
    if answer not in ("set", "single"):
        raise CCPOError(f"--answer must be 'set' or 'single', got '{answer}'")
    if answer == "single" and not single_form_of(method):
        raise CCPOError(
            f"--answer single works with --method auto, {', '.join(SINGLE_METHODS)}; "
            f"'{method}' returns answer sets (drop --answer single)"
        )
    if not 0 < delta < 1:
        raise CCPOError(f"--delta must be strictly between 0 and 1, got {delta}")


def train_splits(ep, seed: int):
    """``train``'s split: the training questions of the harness (:func:`ccpo.evaluation.harness.
    split_sizes`, chosen by :func:`~ccpo.evaluation.harness.id_splits`: order-free), and κ̂
    calibrated on **every** other question (the paper's 1000/200/200 protocol, with a test
    split, stays in ``compare`` / ``reproduce``). Returns the reordered episodes, the splits
    and the sizes ``{"train", "calibration"}`` that summary.json records."""
    from ccpo.evaluation.harness import id_splits, split_sizes

    n_train = split_sizes(ep.n)[0]
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


def _calibrate(pol, ep, cal, alpha: float, provenance: dict, sizes):
    """Split-conformal κ̂ on the calibration questions (batch scoring) and the provenance, set
    on ``pol``; returns the calibration figures for summary.json and the full-set rate."""
    from ccpo.evaluation.harness import full_set_rate
    from ccpo.policies.route_sets import StartedView

    if pol.calibrates:
        pol.calibrate(ep, cal)
    pol.provenance = provenance
    pol.feature_spec = ep.feature_spec  # the observations it was fitted on (ladder signals)
    cal_ep = ep.subset(cal)
    kappa = pol.threshold
    sc = pol.episode_scores(cal_ep)  # a routed set's: each question's started view
    view_ep, probs = (sc.ep, sc.probs) if isinstance(sc, StartedView) else (cal_ep, sc)
    full = full_set_rate(view_ep, probs, kappa)
    cal_m = pol.rollout(cal_ep, sc, kappa)
    summary = {
        "kappa": kappa,
        "calibration_coverage": float(cal_m.covered.mean()),
        "calibration_cost_cents": float(cal_m.cost.sum() * 100),
        "calibration_full_set_rate": full,
        "sizes": sizes,
        **_latency_fields(cal_ep, cal_m, provenance),
    }
    return summary, full


def _latency_fields(cal_ep, m, provenance: dict) -> dict:
    """summary.json's estimated latency on the calibration questions (``calibration_latency_s``,
    seconds per question) and the budget it is held to (``latency_budget_s``), if any."""
    from ccpo.traces.latency import mean_latency

    out = {"calibration_latency_s": mean_latency(cal_ep.round_latency, None, m)}
    budget = provenance.get("latency_budget_s")
    return out if budget is None else {**out, "latency_budget_s": budget}


def _hold_budget(summary: dict, budget: float | None, variant: str) -> None:
    """Refuse (nothing written) a calibrated policy over ``--latency-budget``
    (:func:`ccpo.policies.budget.check_budget`)."""
    check_budget(summary["calibration_latency_s"], budget, variant, "auto" in summary)


def _print_latency(summary: dict) -> None:
    """ "calibration latency 1.23 s per question (budget 1.5 s): holds", with a budget."""
    budget = summary.get("latency_budget_s")
    if budget is not None:
        line = budget_line(summary["calibration_latency_s"], budget)
        console.print(f"on the calibration questions {line}", highlight=False)


def _threshold_text(pol, how: str = "") -> str:
    """ "κ̂ = 0.42", "λ̂ = 0.93 (Learn-then-Test, δ = 0.1)", or what a policy without one does."""
    if pol.alone is not None:
        return f"no threshold: {pol.model} answers alone"
    return f"{pol.threshold_name} = {pol.threshold:.4g}{how}"


def _yardstick(pol, ep, cal, summary: dict):
    """The policy's calibration cost against calling the reference alone
    (:mod:`ccpo.evaluation.yardstick`), added to ``summary``; ``None`` without one model."""
    from ccpo.evaluation.yardstick import yardstick

    cost = summary["calibration_cost_cents"] / 100 / max(len(cal), 1)
    y = yardstick(pol.variant, ep, cal, cost, pol.alone is not None)
    if y is not None:
        summary.update(reference=y.name, cost_ratio_to_reference=y.ratio)
    return y


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
    latency budget, their estimated latency too, those over it marked."""
    for name, f in figures.items():
        mark = "  ← picked" if name == picked else ""
        lat = None if budget is None else f.get(LATENCY, math.nan)
        if lat is not None and not within(lat, budget):
            mark = "  not eligible" if math.isnan(lat) else "  over the latency budget"
        console.print(
            f"  {name:10s} validation cost {f['cost_cents_per_question']:.4f}¢/question, "
            f"coverage {f['coverage']:.3f}"
            + ("" if lat is None else f", latency {lat:.2f} s")
            + mark
        )


def _train_stopping(
    method, ep, sp, sizes, alpha, seed, price_table, out: Path, provenance: dict, settings: dict,
    budget: float | None = None, routed: bool = False,
) -> None:  # fmt: skip
    """``train --method`` of a method fitted on replay (:mod:`ccpo.policies.registry`): fit on
    the training split (auto: choose by cross-fitted validation calibrated cost),
    split-conformal κ̂ on the calibration split, write the policy folder and summary.json
    (with auto's choice)."""
    from ccpo.policies.registry import fit_method
    from ccpo.report.results import staged_folder

    t0 = time.perf_counter()
    with console.status(f"fitting {method} on {count(sizes['train'], 'question')} …"):
        pol, sel = fit_method(
            method, ep, sp.train, alpha, seed, settings=settings, latency_budget=budget
        )
        if routed:
            pol = _route_set(pol, ep, sp.train, seed)
    seconds = time.perf_counter() - t0
    pol.prices = price_table.to_price_file()
    cal = sp.cal[0]
    summary, full = _calibrate(pol, ep, cal, alpha, provenance, sizes)
    summary = {"method": method, "variant": pol.variant, "seconds": round(seconds, 2), **summary,
               **({"auto": sel.to_json()} if sel is not None else {})}  # fmt: skip
    _hold_budget(summary, budget, pol.variant)
    y = _yardstick(pol, ep, cal, summary)
    with staged_folder(out) as tmp:  # all files or none (a full disk)
        pol.save(tmp)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if sel is not None:
        _print_choice(sel.figures, sel.method, budget)
    console.print(
        f"fitted [bold]{pol.variant}[/bold]{' (auto)' if sel else ''} in {seconds:.1f} s on "
        f"{count(sizes['train'], 'question')}; {_threshold_text(pol)}; calibration coverage "
        f"{summary['calibration_coverage']:.3f} on {count(len(cal), 'question')}"
    )
    _print_yardstick(y)
    _print_latency(summary)
    if pol.alone is None:
        warn_degenerate(full, pol.threshold, alpha, len(cal))
    console.print(f"wrote policy folder {out}")


def _route_set(pol, ep, train_idx, seed: int):
    """A CStop set policy behind a router (:mod:`ccpo.policies.route_sets`); any other pick
    of ``auto`` is kept unrouted, and said so."""
    from ccpo.policies.route_sets import route_set_policy

    routed = route_set_policy(pol, ep, train_idx, seed)
    if routed is pol:
        console.print(f"{pol.variant} is not routed (set routing applies to cstop and cstop-lr)")
    return routed


def _train_single(
    method, ep, sp, sizes, alpha, seed, delta, price_table, out: Path, provenance, settings,
    routed: bool = False, route_embeddings: bool = False, budget: float | None = None,
) -> None:  # fmt: skip
    """``train --answer single``: fit the stopping score on the training split (auto: choose
    by cross-fitted validation cost), λ̂ by Learn-then-Test on the calibration split
    (:mod:`ccpo.policies.single`), write the policy folder and summary.json. Refuses with the
    reachable α when no threshold is certified."""
    from ccpo.policies.registry import fit_single_method
    from ccpo.report.results import staged_folder
    from ccpo.traces.labels import against_text

    what = against_text(provenance.get("against", "gold")).replace("accuracy", "coverage")

    t0 = time.perf_counter()
    with console.status(f"fitting {method} (single answer) on {sizes['train']} questions …"):
        pol = fit_single_method(
            method, ep, sp.train, alpha, seed, delta, settings=settings, routed=routed,
            route_embeddings=route_embeddings, latency_budget=budget,
        )  # fmt: skip
    seconds = time.perf_counter() - t0
    pol.prices = price_table.to_price_file()
    pol.provenance = provenance
    pol.feature_spec = ep.feature_spec
    cal = sp.cal[0]
    cal_ep = ep.subset(cal)
    got = pol.calibrate(cal_ep)
    m = pol.rollout(cal_ep, pol.episode_scores(cal_ep), pol.threshold)
    summary = {
        "method": method, "variant": pol.variant, "answer": "single", "seconds": round(seconds, 2),
        "threshold": pol.threshold, "delta": delta, "calibration_misses": got.misses,
        "calibration_coverage": float(m.covered.mean()),
        "calibration_cost_cents": float(m.cost.sum() * 100),
        "calibration_rounds": float(m.length.mean()), "sizes": sizes, **pol.info,
        **({"route_tau": pol.tau} if routed and pol.alone is None else {}),
        **_latency_fields(cal_ep, m, provenance),
    }  # fmt: skip
    _hold_budget(summary, budget, pol.variant)
    y = _yardstick(pol, ep, cal, summary)
    with staged_folder(out) as tmp:  # all files or none (a full disk)
        pol.save(tmp)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    auto = pol.info.get("auto")
    if auto:
        _print_choice(auto["validation"], auto["picked"], budget)
    console.print(
        f"fitted [bold]{pol.variant}[/bold]{' (auto)' if auto else ''} in {seconds:.1f} s on "
        f"{sizes['train']} questions; {_threshold_text(pol, f' (Learn-then-Test, δ = {delta:g})')}"
        "; "
        f"calibration {what} {summary['calibration_coverage']:.3f}, "
        f"{summary['calibration_rounds']:.2f} rounds on {len(cal)} questions"
    )
    _print_yardstick(y)
    _print_latency(summary)
    console.print(f"wrote policy folder {out}")


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``compare`` to ``app``."""
    app.command("train")(train_cmd)
    app.command("compare")(compare_cmd)
