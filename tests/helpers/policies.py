"""Tiny trained policies (T = 4) on SYNTHETIC traces (``ccpo.traces.sim``), saved as artifacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ccpo.learning.config import TrainConfig
from ccpo.learning.training import train
from ccpo.policies.rl import TrainedPolicy
from ccpo.traces.episodes import build_episodes
from ccpo.traces.prices import load_prices
from ccpo.traces.sim import SimConfig, generate


def make_policy(folder: Path, method: str = "ccpo", steps: int = 30) -> Path:
    """Train a tiny policy on synthetic traces (T = 4) and save it as an artifact."""
    traces = generate(SimConfig(n=300, seed=0))
    prices = load_prices()
    ep = build_episodes(traces, prices)
    cfg = TrainConfig(method=method, alpha=0.1, steps=steps, val_every=0, seed=0)
    res = train(ep, np.arange(200), cfg)
    variant = "ccpo" if method == "ccpo" else "cpo"
    pol = TrainedPolicy.from_result(res, variant, prices.to_price_file())
    if pol.scoring == "batch":
        pol.kappa_batch = 0.3
    pol.save(folder)
    return folder


def make_stop_policy(folder: Path, method: str = "cstop") -> Path:
    """Fit a replay-trained stopping policy (CStop) on the same synthetic traces and save it."""
    from ccpo.policies.registry import stopping_fitter

    prices = load_prices()
    ep = build_episodes(generate(SimConfig(n=300, seed=0)), prices)
    pol = stopping_fitter(method)(ep, np.arange(200), 0.1, 0)
    pol.prices = prices.to_price_file()
    pol.kappa_batch = 0.3
    pol.save(folder)
    return folder
