"""``ccpo reproduce``: every bundled real trace set × every α × every seed through ``compare``.

:func:`run_reproduce` trains every comparison's policies in one process pool (all submitted
up front, so the next α trains while this one is scored), runs
:func:`~ccpo.evaluation.comparison.run_compare` per set, α and seed, draws the frontier
across α and writes one report (:func:`ccpo.report.reproduce.write_report`). The bundled sets
are the ``NAME.jsonl.gz`` files of ``ccpo/data/traces`` (:func:`bundled_sets`); ``--data``
names them or trace files (:func:`resolve_data`). :data:`QUICK` and :data:`FULL` are the
presets of splits and training steps.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from rich.console import Console

from ccpo.errors import CCPOError
from ccpo.evaluation.comparison import run_compare, start_training
from ccpo.evaluation.rows import training_pool
from ccpo.evaluation.seeds import Section
from ccpo.policies.spec import variant_name
from ccpo.report.plots import frontier_plot
from ccpo.report.reproduce import write_report

QUICK = {"splits": 20, "steps": 200}
FULL = {"splits": 100, "steps": 2000}


def bundled_sets(folder: Path | None = None) -> dict[str, Path]:
    """Name → path of every trace set (``NAME.jsonl.gz``) shipped in ``ccpo/data/traces``
    (or in ``folder``): a set added there is picked up by ``reproduce`` with no code change."""
    folder = folder or resources.files("ccpo.data").joinpath("traces")
    out = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".jsonl.gz"):
            out[entry.name.removesuffix(".jsonl.gz")] = Path(str(entry))
    return dict(sorted(out.items()))


def resolve_data(data: Sequence[str] | None) -> dict[str, Path]:
    """``--data`` values (bundled names or files) → name → path; none means every bundled set."""
    sets = bundled_sets()
    if not data:
        if not sets:
            raise CCPOError("no bundled trace sets found in the package; pass --data FILE")
        return sets
    out = {}
    for d in data:
        if d in sets:
            out[d] = sets[d]
        elif Path(d).is_file():
            name = Path(d).name
            for suffix in (".gz", ".jsonl"):
                name = name.removesuffix(suffix)
            out[name] = Path(d)
        else:
            raise CCPOError(
                f"--data {d!r} is neither a bundled set ({', '.join(sets) or 'none'}) nor a file"
            )
    return out


def run_reproduce(
    out: Path,
    data: Sequence[str] | None = None,
    alphas: Sequence[float] = (0.1, 0.2),
    splits: int | None = None,
    steps: int | None = None,
    quick: bool = False,
    seeds: Sequence[int] = (0,),
    console: Console | None = None,
    workers: int | None = None,
) -> dict:
    """``workers``: processes for the training runs of every comparison [CPU cores].
    ``seeds``: one comparison per seed (its own splits and training runs); with more than one,
    the report adds across-seeds tables and ratios (mean ± sd), and folders get ``seed-S``."""
    seeds = list(dict.fromkeys(seeds)) or [0]
    console = console or Console()
    preset = QUICK if quick else FULL
    splits = preset["splits"] if splits is None else splits
    steps = preset["steps"] if steps is None else steps
    if splits < 1 or steps < 1:
        raise CCPOError(f"--splits and --steps must be at least 1, got {splits} and {steps}")
    t0 = time.perf_counter()
    sets = resolve_data(data)
    sections: list[Section] = []
    runs = [
        (name, path, alpha, seed)
        for name, path in sets.items()
        for alpha in alphas
        for seed in seeds
    ]
    # one pool for every comparison's training runs, all submitted up front: processes start
    # once, and the next α trains while this one is evaluated and plotted
    with training_pool(workers or os.cpu_count() or 1) as pool:
        plans = [
            dict(alpha=alpha, splits=splits, steps=steps, seed=seed) for *_, alpha, seed in runs
        ]
        caches = [start_training(r[1], pool, **plan) for r, plan in zip(runs, plans, strict=True)]
        for (name, path, alpha, seed), cache, plan in zip(runs, caches, plans, strict=True):
            folder = out / name / f"alpha-{alpha:g}"
            if len(seeds) > 1:
                folder = folder / f"seed-{seed}"
            console.rule(f"{name}, α = {alpha:g}" + (f", seed {seed}" if len(seeds) > 1 else ""))
            run_compare(path, folder, console=console, title=name, cache=cache, **plan)
            results = json.loads((folder / "results.json").read_text())
            kappas = {
                variant_name(*key): p.summary_fields()["kappa_online"]
                for key, p in cache.trained.items()
            }
            sections.append(Section(name, alpha, folder, results, seed, kappas))
    frontiers = {  # the first seed's runs
        n: frontier_plot(
            n, [s for s in sections if s.name == n and s.seed == seeds[0]], out / n / "frontier.png"
        )
        for n in sets
    }
    meta = {
        "alphas": list(alphas),
        "splits": splits,
        "steps": steps,
        "seeds": seeds,
        "quick": quick,
        "seconds": time.perf_counter() - t0,
        "data": {k: str(v) for k, v in sets.items()},
    }
    md, page = write_report(out, sections, frontiers, meta)
    (out / "reproduce.json").write_text(json.dumps(meta, indent=1) + "\n")
    console.print(f"reproduce took {meta['seconds']:.0f} s; report: {md} and {page}")
    return meta
