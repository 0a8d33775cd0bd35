"""The arguments every policy-quality benchmark shares: which sets, α and seeds to sweep."""

from __future__ import annotations

import argparse


def sweep_parser(description: str) -> argparse.ArgumentParser:
    """--data (bundled name or trace file, repeatable; default every bundled set), --alpha
    (repeatable; default 0.05, 0.1, 0.2), --seeds (5) and --splits (100)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", action="append", help="bundled set name or trace file [all]")
    ap.add_argument("--alpha", type=float, action="append")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--splits", type=int, default=100)
    return ap


ALPHAS = (0.05, 0.1, 0.2)


def gold_and_label_free(data):
    """(label, traces, prices) of every set of ``--data``: with gold labels, then relabelled
    against its strongest model (``correct`` = equals that model's answer)."""
    from ccpo.evaluation.harness import prices_for
    from ccpo.evaluation.reproduce import resolve_data
    from ccpo.testing.relabel import relabel_against_strongest
    from ccpo.traces.io import read_traces

    for name, path in resolve_data(data).items():
        prices = prices_for(path)
        gold = read_traces(path)
        free, ref = relabel_against_strongest(gold, prices)
        yield f"{name} (gold)", gold, prices
        yield f"{name} (label-free, vs {ref})", free, prices


def gold_and_label_free_episodes(data):
    """(label, episodes) of every set of ``--data``: with its gold labels (labelled by the
    set's name), then label-free, as :func:`gold_and_label_free`."""
    from ccpo.traces.episodes import build_episodes

    for label, traces, prices in gold_and_label_free(data):
        yield label.removesuffix(" (gold)"), build_episodes(traces, prices)


def mean_sd(xs: list[float]) -> str:
    """``mean ± sd`` of a list (sd 0 for one value)."""
    import statistics

    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f}"


def write_results(out, results, suffix: str = "") -> None:
    """``results`` as indented JSON at ``out`` (its folder made), and a line saying so."""
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {out}{suffix}")


def run_grouped(jobs, run, workers: int = 1) -> dict[str, dict[str, list]]:
    """Run ``run(*args)`` for every ``((group, row), args)`` of ``jobs``, ``workers`` at once
    (threads: each run is a subprocess), and return ``{group: {row: [results, in job
    order]}}``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, workers)) as pool:
        done = list(pool.map(lambda j: run(*j[1]), jobs))
    results: dict[str, dict[str, list]] = {}
    for ((group, row), _), r in zip(jobs, done, strict=True):
        results.setdefault(group, {}).setdefault(row, []).append(r)
    return results
