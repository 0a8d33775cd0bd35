"""Pareto testing: the router threshold τ and the stopping threshold λ certified together.

Every pair θ = (τ, λ) of a fixed grid (:data:`PARETO_TAUS` × λ_0 = RUN_ALL, 1, …, 0) gets, on
the **training** questions' out-of-fold scores, an estimated risk R̂(θ) (the share of misses,
counting θ_0's too: each question at its worse of with and without its embedding) and cost
Ĉ(θ). :func:`pareto_sequence` keeps the pairs no other beats on both (the Pareto front),
orders them from the safest to the cheapest, and puts θ_0 = (no routing, run every round)
first. :func:`pareto_ltt` walks that one sequence on the calibration questions at the full δ
(binomial p-values, as :func:`~ccpo.policies.single.ltt_threshold`) and returns the last pair
rejected before the first failure. The order is a function of the training split alone, so
this is fixed-sequence testing: P_cal(R(τ̂, λ̂) ≤ α) ≥ 1 − δ. θ_0 fails exactly when the
τ-first λ_0 does, so a refusal means what it meant. After Laufer-Goldshtein, Fisch, Barzilay
& Jaakkola (2023); derivation: docs/theory.md, "Pareto testing: τ and λ certified together".

Main names: :func:`pareto_sequence`, :func:`pareto_ltt`, :func:`pareto_front`,
:func:`pair_outcomes`, :data:`PARETO_TAUS`.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ccpo.errors import CCPOError
from ccpo.policies.base import Calibration
from ccpo.policies.risk_control import last_passing
from ccpo.policies.routing.holder import NO_ROUTE
from ccpo.policies.single import (
    GRID,
    RUN_ALL,
    candidate_thresholds,
    unreachable,
)
from ccpo.traces.episodes import Episodes, single_losses, single_stops

PARETO_TAUS = (NO_ROUTE, *(round(0.05 * k, 2) for k in range(19, 0, -1)))
"""The router thresholds of the grid, fixed before any data: no routing, then 0.95, 0.90, …,
0.05 (λ: every candidate threshold). Finer than the :data:`TAUS` a τ-first choice picks
from: here a τ costs no δ, only training-split estimates."""


class Routed(Protocol):
    """What the walk reads of a routed replay
    (:class:`~ccpo.policies.routing.single.RoutedScores`)."""

    fallback_probs: np.ndarray | None
    latency: np.ndarray | None  # [S, N, T] estimated seconds of round t started at s

    def at(
        self, tau: Any, sel: Any = ..., fallback: bool = ...
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def pair_outcomes(
    ep: Episodes, sc: Routed, tau: float, lams: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loss [M, n] bool, cost [M, n] USD, delay [M, n]) of every question of ``ep`` at (τ, λ)
    for each λ of ``lams``: the loss is a miss in either mode when a fallback router exists
    (docs/theory.md, "Embeddings, with a fallback"); cost and delay are those of the mode with
    embeddings, the delay in estimated seconds (rounds run when ``sc`` has no latency)."""
    lams = np.asarray(lams, dtype=np.float64)
    start, h, cost = sc.at(tau)
    loss = single_losses(ep, h, lams)
    if sc.fallback_probs is not None:
        loss = loss | single_losses(ep, sc.at(tau, fallback=True)[1], lams)
    ran = np.arange(ep.horizon) >= start[:, None]
    stop = single_stops(h[None], lams[:, None])  # [M, n]
    per_round = np.ones_like(cost) if sc.latency is None else sc.latency[start, np.arange(ep.n)]
    spent, waited = (np.cumsum(x * ran, axis=-1)[None] for x in (cost, per_round))
    until = stop[..., None]  # paid and waited up to and with the stop round
    return loss, *(np.take_along_axis(x, until, -1)[..., 0] for x in (spent, waited))


def pareto_front(risk: np.ndarray, cost: np.ndarray, *ties: np.ndarray) -> np.ndarray:
    """Indices of the points no other beats on both risk and cost, from the least risk to the
    least cost (risk strictly rising, cost strictly falling); of points equal on both, the
    least by ``ties`` (keys in order of priority; the first point when all are equal)."""
    order = np.lexsort((*reversed(ties), cost, risk))
    keep, best = [], np.inf
    for i in order:
        if cost[i] < best:
            keep.append(i)
            best = cost[i]
    return np.asarray(keep, dtype=np.int64)


def pareto_sequence(
    ep: Episodes, sc: Routed, taus=PARETO_TAUS, grid: int = GRID
) -> tuple[np.ndarray, np.ndarray]:
    """(the order of the test [m, 2] of (τ, λ) pairs; their estimated risk, cost and delay
    [m, 3]) from the training questions ``ep`` and their out-of-fold scores ``sc``: θ_0 = (no
    routing, run every round), then the Pareto front of the grid from the safest pair to the
    cheapest (θ_0 dropped from it). A pair's risk counts θ_0's misses with its own: the walk
    meets it only once θ_0 has passed, so only the misses it adds can stop it there."""
    lams = candidate_thresholds(grid)
    first = pair_outcomes(ep, sc, NO_ROUTE, np.array([RUN_ALL]))[0]  # θ_0's misses [1, n]
    pairs, figures = [], []
    for tau in taus:
        loss, cost, delay = pair_outcomes(ep, sc, float(tau), lams)
        pairs.append(np.stack([np.full(lams.size, float(tau)), lams], axis=1))
        risk = (loss | first).mean(1)  # counted with θ_0's misses: what the walk meets after it
        figures.append(np.stack([risk, cost.mean(1), delay.mean(1)], axis=1))
    every, est = np.concatenate(pairs), np.concatenate(figures)
    front = pareto_front(est[:, 0], est[:, 1], est[:, 2], every[:, 1])  # ties: the least
    # delay, then the least λ (the sooner stop where training questions cannot tell them apart)
    is_first = (every[:, 0] == NO_ROUTE) & (every[:, 1] == RUN_ALL)
    if not is_first.any():
        raise CCPOError("the Pareto grid must hold (no routing, run every round)")
    front = front[~is_first[front]]
    head = np.flatnonzero(is_first)[:1]
    order = np.concatenate([head, front])
    return every[order], est[order]


def pareto_ltt(
    ep: Episodes, sc: Routed, alpha: float, delta: float | None, sequence: np.ndarray
) -> tuple[float, Calibration]:
    """(τ̂, the calibration of λ̂): fixed-sequence testing along ``sequence`` [m, 2] (made on
    the training split: :func:`pareto_sequence`) on the calibration questions ``ep`` at the
    full δ (``delta`` None: conformal risk control along the sequence, a marginal guarantee:
    :mod:`ccpo.policies.risk_control`); the last pair passed before the first failure.
    Raises :class:`~ccpo.policies.single.Unreachable`, naming the α it certifies, when θ_0
    fails."""
    seq = np.asarray(sequence, dtype=np.float64)
    n = ep.n
    if n < 1:
        raise CCPOError("cannot calibrate a single-answer policy on zero questions")
    loss = np.zeros((len(seq), n), dtype=bool)
    for tau in np.unique(seq[:, 0]):
        rows = seq[:, 0] == tau
        loss[rows] = pair_outcomes(ep, sc, float(tau), seq[rows, 1])[0]
    k = loss.sum(-1)
    last = last_passing(loss, alpha, delta)
    if last < 0:
        raise unreachable(alpha, delta, int(k[0]), n, ep.horizon)
    return float(seq[last, 0]), Calibration(float(seq[last, 1]), int(k[last]), n, int(last + 1))


__all__ = [
    "PARETO_TAUS", "pair_outcomes", "pareto_front", "pareto_ltt", "pareto_sequence",
]  # fmt: skip
