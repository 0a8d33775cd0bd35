"""A routed single-answer policy on the synthetic 4-model import (label-free), with its
router threshold set by hand so that routing is in play (a fixed τ keeps the guarantee: it is
chosen before calibration)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ccpo.evaluation.harness import load_episodes, trace_provenance
from ccpo.policies.registry import fit_single_method
from ccpo.testing.ladder_table import write_ladder_table
from tests.helpers.cli import ccpo_ok


def imported_ladder(folder: Path, n: int = 300, seed: int = 0) -> tuple[Path, Path]:
    """(traces, prices) of the 4-model table imported without labels (agreement with big-m)."""
    table, prices = write_ladder_table(folder, n=n, seed=seed, labels=False)
    traces = folder / "ladder.jsonl"
    ccpo_ok("traces", "import", str(table), "--task", "medqa", "--family", "mcq",
            "--prices", str(prices), "--out", str(traces))  # fmt: skip
    return traces, prices


def routed_policy(folder: Path, traces: Path, prices: Path, tau: float, alpha=0.2) -> Path:
    """A ``cstop-lr-single+route`` policy fitted on the first half of ``traces``, calibrated
    at τ = ``tau`` (λ̂ by Learn-then-Test) on the other half, saved in ``folder``."""
    ep, table = load_episodes(traces, [str(prices)])
    order = np.arange(ep.n)
    pol = fit_single_method("cstop-lr", ep, order[::2], alpha, 0, routed=True)
    pol.taus = (tau,)
    pol.calibrate(ep, order[1::2])
    pol.provenance = {**trace_provenance(traces), "alpha": alpha}
    pol.prices = table.to_price_file()
    pol.save(folder)
    return folder
