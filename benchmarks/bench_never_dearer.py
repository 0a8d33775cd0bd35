"""Benchmark: never dearer than the reference. ``auto`` with and without the candidate
``always-<reference>`` (calling the reference, or with gold labels the strongest model, alone).

For each bundled set with gold labels and the same set label-free (``correct`` = equals the
strongest model's answer, :mod:`ccpo.testing.relabel`), α ∈ {0.1, 0.2}, seeds 0..4 (each:
its own training split and evaluation splits), it scores ``auto`` and ``auto-single`` with
the candidate (as shipped) and without it (the learned winner: the ablation),
``always-<reference>``, ``depth-k`` and the oracle floor, and prints mean ± sd over the seeds of

- cost ÷ always-<reference> (mean test-split cost over its cost on the same splits);
- coverage (agreement for the label-free sets);
- how often ``auto`` picked ``always-<reference>`` (seeds);
- estimated end-to-end latency per question (:mod:`ccpo.traces.latency`: 0.5 s to the first
  token, 50 output tokens/s, an agree round's calls at once).

CCPO is not a candidate here (``auto_ccpo_steps`` = 0: minutes of training per fit). A
label-free ``traces import`` of a table made from a bundled set holds two models (the base
and the guide of its logs), hence one round, which no stopping rule can learn from: the
relabelled set stands for it.

    python benchmarks/bench_never_dearer.py [--seeds 5] [--splits 100] [--alpha 0.1 ...]
        [--data NAME|FILE ...] [--out runs/bench_never_dearer.json]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
from _sweep import gold_and_label_free, sweep_parser, write_results

from ccpo.evaluation.harness import (
    make_splits,
    row_from_metrics,
    split_sizes,
    with_latency,
)
from ccpo.evaluation.rows import SpecRow, make_policy
from ccpo.policies.spec import parse_spec
from ccpo.traces.episodes import build_episodes
from ccpo.traces.labels import against_text

SETTINGS = {"auto_ccpo_steps": 0}


def _score(p, ep, sp, alpha, seed) -> dict:
    m = with_latency(ep, p.evaluate(ep, sp, alpha, seed), sp.test)
    row = row_from_metrics(p.name, m, **getattr(p, "result_extra", dict)())
    return {"cost": float(np.mean(row.cost_cents_per_split)), "coverage": row.coverage,
            "latency": row.latency_s, "picked": row.extra.get("picked")}  # fmt: skip


def _learned(p, ep, sp, alpha, seed, single: bool):
    """The ablation: the row's learned winner (what auto shipped before the candidate)."""
    info = p.policy.info["auto"]
    ref = [k for k in info["validation"] if k.startswith("always-")]
    if info["picked"] not in ref:
        return p  # the same policy
    learned = {k: v for k, v in info["validation"].items() if k not in ref}
    best = min(learned, key=lambda k: learned[k]["cost_cents_per_question"])
    q = SpecRow(parse_spec(best, answer="single" if single else "set", settings=SETTINGS))
    q.fit(ep, sp.train, alpha, seed)
    return q


def run_seed(ep, alphas, seed: int, splits: int) -> dict[float, dict]:
    sp = make_splits(ep.n, split_sizes(ep.n), splits, seed)
    always = f"always-{ep.strongest}"
    out: dict[float, dict] = {a: {} for a in alphas}
    for alpha in alphas:
        for name, single in (("auto", False), ("auto-single", True)):
            p = SpecRow(parse_spec(name, settings=SETTINGS))
            p.fit(ep, sp.train, alpha, seed)
            out[alpha][name] = _score(p, ep, sp, alpha, seed)
            q = _learned(p, ep, sp, alpha, seed, single)
            out[alpha][f"{name} without {always}"] = (
                out[alpha][name] if q is p else _score(q, ep, sp, alpha, seed)
            )
        for name in ("depth-k", always, "oracle"):
            p = make_policy(name, None)
            p.fit(ep, sp.train, alpha, seed)
            out[alpha][name] = _score(p, ep, sp, alpha, seed)
    for rows in out.values():
        yardstick = rows[always]["cost"]
        for r in rows.values():
            r["rel_always"] = r["cost"] / yardstick
    return out


def _ms(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.2f} ± {sd:.2f}"


def print_table(label: str, what: str, alpha: float, runs: list[dict]) -> dict:
    """One (set, α): a Markdown table of every row, mean ± sd over the seeds."""
    print(f"\n{label}, α = {alpha:g}")
    print(f"| row | cost ÷ always | {what} (target {1 - alpha:.2f}) | picked always | "
          "est. latency (s) |")  # fmt: skip
    print("|---|---|---|---|---|")
    table = {}
    for row in runs[0]:
        rs = [r[row] for r in runs]
        table[row] = {k: [r[k] for r in rs] for k in rs[0]}
        picked = sum(1 for r in rs if (r["picked"] or "").startswith("always-"))
        shown = f"{picked}/{len(rs)}" if row in ("auto", "auto-single") else ""
        print(f"| {row} | {_ms(table[row]['rel_always'])} | {_ms(table[row]['coverage'])} | "
              f"{shown} | {_ms(table[row]['latency'])} |")  # fmt: skip
    return table


def main() -> None:
    ap = sweep_parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bench_never_dearer.json"))
    args = ap.parse_args()
    alphas = args.alpha or (0.1, 0.2)
    results = {}
    for label, traces, prices in gold_and_label_free(args.data):
        ep = build_episodes(traces, prices)
        t0 = time.perf_counter()
        seeds = [run_seed(ep, alphas, s, args.splits) for s in range(args.seeds)]
        print(f"\n{label}: {args.seeds} seeds × {args.splits} splits "
              f"({time.perf_counter() - t0:.0f} s all α)")  # fmt: skip
        for alpha in alphas:
            runs = [by[alpha] for by in seeds]
            table = print_table(label, against_text(ep.labels), alpha, runs)
            results[f"{label}, α = {alpha:g}"] = table
    write_results(args.out, results)


if __name__ == "__main__":
    main()
