"""Which thresholds of a fixed sequence pass: Learn-then-Test (with probability 1 − δ) or
conformal risk control (marginal).

A single-answer policy is calibrated along a sequence θ_0, θ_1, …, θ_m of thresholds fixed
before the calibration questions are seen, from the safest (θ_0: run every round, return the
last round's answer) to the cheapest: the stopping thresholds λ (``ccpo.policies.single``) or
the (τ, λ) pairs of a routed policy's Pareto sequence (``ccpo.policies.routing.pareto``). On
calibration question i, L_i(j) ∈ {0, 1} is a miss at θ_j: the returned answer is wrong on a
solvable question. The walk keeps the last θ_j before the first one that fails a test.

**With probability 1 − δ (``delta`` a number: Learn-then-Test).** θ_j passes when the
binomial p-value P(Binomial(n, α) ≤ k_j) ≤ δ, k_j = Σ_i L_i(j). Fixed-sequence testing
controls the family-wise error at δ, so P_cal(R(θ̂) ≤ α) ≥ 1 − δ: the guarantee holds for
all but a δ share of calibration draws (docs/theory.md, "Learn-then-Test (single answer)").

**Marginal (``delta`` None: conformal risk control).** After Angelopoulos, Bates, Fisch, Lei
& Schuster (2022). The miss indicator need not be monotone along the sequence (a later
round's reply can be wrong where an earlier one was right), so each question's loss is
monotonised: L̃_i(j) = max_{j' ≤ j} L_i(j'), non-decreasing in j and ≥ L_i(j). θ_j passes
when

    (Σ_{i ≤ n} L̃_i(j) + 1) / (n + 1) ≤ α.

The left side is non-decreasing in j, so the passing indices are a prefix {0, …, ĵ}; the walk
keeps ĵ, and refuses when θ_0 fails.

*Derivation.* Let question n + 1 be a new one, exchangeable with the n calibration questions
given the training split (which fixed the sequence and the scores). Let ĵ* be the last j
with (1/(n+1)) Σ_{i ≤ n+1} L̃_i(j) ≤ α (a prefix again; define ĵ* = −1 when empty). Since
L̃_{n+1}(j) ≤ 1, every j that passes the test above passes this one, so ĵ ≤ ĵ* whenever the
walk does not refuse, and by monotonicity L̃_{n+1}(ĵ) ≤ L̃_{n+1}(ĵ*). ĵ* is a symmetric
function of the n + 1 questions, so by exchangeability

    E[L̃_{n+1}(ĵ*) ; ĵ* ≥ 0] = E[(1/(n+1)) Σ_{i ≤ n+1} L̃_i(ĵ*) ; ĵ* ≥ 0] ≤ α.

Hence P(the walk certifies some θ, and the answer to a new solvable question is wrong) ≤ α:
on average over calibration draws and new questions, not for each draw. When θ_0 never misses
(labels relative to the reference the last round calls, as on chat imports) the walk refuses
only for n < 1/α − 1, and E[miss] ≤ α exactly. A question counted at its worse of two ways
(a router's fallback) has loss max of both: still ≥ the loss it meets, and still monotonised.

Marginal control needs far fewer questions than the 1 − δ version: at n = 56, α = 0.2 it
allows 10 monotonised misses, Learn-then-Test at δ = 0.1 allows 6
(docs/theory.md, "Marginal single answers: conformal risk control").

**Validating as the calibration will (``like = n_cal``; no guarantee of its own).** ``auto``
scores each candidate on training questions by calibrating on halves of a few dozen of them
and measuring on the others. A test run on a half of n_h questions is far stricter than the
same test on the n_cal calibration questions ``train`` will use (at α = 0.2 the marginal test
allows 6 misses in 35, 31 in 162), so a candidate that calibration would certify can look
refused, and ``auto`` falls back to a dearer one. With ``like``, a half emulates the
calibration instead: θ_j passes when Σ_i L̃_i(j) ≤ n_h · k*(n_cal) / n_cal, with k*(n) the
most misses the test passes on n questions (:func:`allowed_misses`). This only chooses among
candidates on training questions; the winner is calibrated on the calibration split by the
test above, so its guarantee is untouched (docs/theory.md, "auto: cross-fitting keeps the
guarantee").

Both tests come down to one rule: θ_j passes when its (monotonised, for the marginal test)
misses number at most k*(n), the most the test allows on n questions (:func:`allowed_misses`):
the binomial p-value is non-decreasing in k, and (k + 1)/(n + 1) ≤ α iff k ≤ ⌊α(n + 1)⌋ − 1.

Main names: :func:`passes`, :func:`marginal_bound`, :func:`allowed_misses`,
:func:`certified`, :func:`test_level`, :data:`MARGINAL`, :data:`PAC`.
"""

from __future__ import annotations

import numpy as np

PAC = "pac"
"""The guarantee holds with probability ≥ 1 − δ over the calibration draw (Learn-then-Test)."""
MARGINAL = "marginal"
"""The guarantee holds on average over the calibration draw (conformal risk control)."""
GUARANTEES = (PAC, MARGINAL)


def marginal_bound(losses: np.ndarray) -> np.ndarray:
    """(Σ_i L̃_i(j) + 1) / (n + 1) for each index j of a sequence: ``losses`` [M, n] (bool or
    0/1, rows in the order of the sequence), L̃ their running maximum along it."""
    loss = np.maximum.accumulate(np.asarray(losses, dtype=np.float64), axis=0)
    n = loss.shape[-1]
    return (loss.sum(-1) + 1.0) / (n + 1.0)


def allowed_misses(n: int, alpha: float, delta: float | None) -> int:
    """k*(n): the most misses of ``n`` calibration questions at which a rule still passes
    (−1 when even k = 0 does not): the largest k with (k + 1)/(n + 1) ≤ α (marginal,
    ``delta`` None), or with P(Binomial(n, α) ≤ k) ≤ δ. A certified rule misses on at most
    k/n of the calibration questions: the rest of α is what few questions cost
    (docs/theory.md, "Learn-then-Test (single answer)", "How many calibration questions")."""
    if n < 1:
        return -1
    if delta is None:
        return int(np.floor(alpha * (n + 1) - 1 + 1e-9))
    from scipy.stats import binom

    k = int(binom.ppf(delta, n, alpha))  # the least k with P(X ≤ k) ≥ δ
    while k >= 0 and binom.cdf(k, n, alpha) > delta:
        k -= 1
    return k


def test_level(guarantee: str, delta: float) -> float | None:
    """What a single answer's calibration tests at under ``guarantee``: δ, or None for the
    marginal test."""
    return None if guarantee == MARGINAL else delta


def certified(k: int, n: int, alpha: float, delta: float | None, like: int | None = None) -> bool:
    """k misses of n pass the test of one rule (k ≤ k*(n): the binomial test at δ, or with
    ``delta`` None (k + 1)/(n + 1) ≤ α); with ``like``, at the miss rate the test allows on
    ``like`` questions (k ≤ n · k*(like) / like: module docstring)."""
    m = n if like is None else like
    return n > 0 and k <= n * allowed_misses(m, alpha, delta) / m + 1e-9


def passes(
    losses: np.ndarray, alpha: float, delta: float | None, like: int | None = None
) -> np.ndarray:
    """[M] bool: which indices of a sequence pass the test (module docstring): the binomial
    test at ``delta``, or, with ``delta`` None, the marginal test on the running maximum L̃.
    ``losses`` [M, n]. ``like``: at the miss rate the test allows on ``like`` calibration
    questions (``auto``'s validation)."""
    losses = np.asarray(losses, dtype=np.float64)
    if delta is None:
        losses = np.maximum.accumulate(losses, axis=0)
    n = losses.shape[-1]
    m = n if like is None else like
    return losses.sum(-1) <= n * allowed_misses(m, alpha, delta) / m + 1e-9


def last_passing(
    losses: np.ndarray, alpha: float, delta: float | None, like: int | None = None
) -> int:
    """The index kept by the walk: the last one before the first failure; −1 when the first
    (θ_0) fails. ``like``: the test emulates ``like`` calibration questions (:func:`passes`)."""
    fails = np.flatnonzero(~passes(losses, alpha, delta, like))
    return int((fails[0] if fails.size else len(losses)) - 1)


def marginal_questions(alpha: float) -> int:
    """The least n at which the marginal test can pass anything: (0 + 1)/(n + 1) ≤ α."""
    import math

    return max(1, math.ceil(1.0 / alpha - 1.0 - 1e-12))
