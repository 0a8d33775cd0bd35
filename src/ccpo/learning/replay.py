"""Exact expectations of the soft conformal policy by replay (CCPO with ``rollouts="exact"``).

A trace holds every round, so the whole set-valued rollout of C_{π,κ} is known and nothing
needs sampling. Each action joins C(o_t) independently with the softmask probability
m_a(o_t) = σ((π(a|o_t) − κ)/ε).

- :func:`soft_set_rollout`: per question the expected cost, set size and coverage
  (:class:`SoftOutcome`), and their exact gradients in logit space (reverse mode, O(T) per
  question). As ε → 0 they are the hard rollout's
  (:func:`ccpo.traces.episodes.conformal_rollout`).
- :func:`point_rollout_expectations`: the same for the point policy a_t ~ π(·|o_t).
- :func:`calibrate_kappa`: split-conformal κ̂, the one place it is computed (a set policy
  keeps its covering scores too: :meth:`ccpo.policies.sets.SetPolicy.calibrate`);
  :func:`calibrated_cost` measures C_κ̂ as the harness would (:class:`Calibrated`).

Derivation: docs/theory.md, sections "Exact expectations by replay" and
"Split-conformal κ̂ (set policies)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ccpo.learning.conformal import split_conformal_threshold
from ccpo.learning.heads import log_pi
from ccpo.traces.episodes import NEXT, Episodes, Metrics, conformal_rollout, covering_scores


@dataclass(frozen=True)
class SoftOutcome:
    """Per-question expectations of the soft rollout, each ``[B]``."""

    cost: np.ndarray
    size: np.ndarray
    coverage: np.ndarray


def _memberships(logits, allowed, kappa, eps):
    p = np.exp(log_pi(logits, allowed))
    u = (p - kappa) / eps
    s = np.where(allowed, np.exp(-np.logaddexp(0.0, -u)), 0.0)  # σ(u), 0 if masked
    top = np.where(allowed, p, -1.0).argmax(-1)
    is_top = np.arange(p.shape[-1]) == top[..., None]
    return p, s, np.where(is_top, 1.0, s), is_top


def _reach(n: np.ndarray) -> np.ndarray:
    """r_1 = 1, r_{t+1} = r_t n_t: the probability that round t is run ([B, T])."""
    r = np.ones_like(n)
    r[:, 1:] = np.cumprod(n[:, :-1], axis=-1)
    return r


def _tail_sums(v: np.ndarray, n: np.ndarray) -> np.ndarray:
    """X_t = v_t + n_t X_{t+1}, X_{T+1} = 0: the expected sum of v from round t on, given that
    round t is run ([B, T + 1]; E[cost], E[size] and the point policy's coverage)."""
    B, T = v.shape
    X = np.zeros((B, T + 1))
    for t in range(T - 1, -1, -1):
        X[:, t] = v[:, t] + n[:, t] * X[:, t + 1]
    return X


def soft_set_rollout(
    logits: np.ndarray,
    allowed: np.ndarray,
    correct: np.ndarray,
    solvable: np.ndarray,
    round_cost: np.ndarray,
    kappa: float,
    eps: float,
    weights: tuple[float, float, float] | None = None,
) -> tuple[SoftOutcome, np.ndarray | None]:
    """Exact expectations of the soft conformal rollout and, if ``weights`` = (w_cost, w_size,
    w_cov) is given, the gradient of Σ_b (w_cost·cost_b + w_size·size_b + w_cov·cov_b) with
    respect to ``logits``.

    Shapes: ``logits`` [B, T, 3], ``allowed`` [T, 3], ``correct`` [B, T, 2] bool,
    ``solvable`` [B] bool, ``round_cost`` [B, T]. Returns (outcome, grad [B, T, 3] or None).
    """
    logits = np.asarray(logits, dtype=np.float64)
    B, T, _ = logits.shape
    p, s, m, is_top = _memberships(logits, allowed, kappa, eps)
    n = m[..., NEXT]  # [B, T]; 0 at T (masked)
    ans = m[..., :2]
    corr = np.asarray(correct, dtype=bool)
    miss = np.where(corr, 1.0 - ans, 1.0)  # per answer: not included, or not correct
    k = miss.prod(-1)  # [B, T]
    v = ans.sum(-1)
    r = _reach(n)
    F, G = _tail_sums(round_cost, n), _tail_sums(v, n)
    U = np.ones((B, T + 1))
    for t in range(T - 1, -1, -1):
        U[:, t] = k[:, t] * (1.0 - n[:, t] + n[:, t] * U[:, t + 1])
    solv = np.asarray(solvable, dtype=bool)
    out = SoftOutcome(cost=F[:, 0], size=G[:, 0], coverage=np.where(solv, 1.0 - U[:, 0], 1.0))
    if weights is None:
        return out, None
    w_cost, w_size, w_cov = weights
    P = np.ones((B, T))
    P[:, 1:] = np.cumprod((k * n)[:, :-1], axis=-1)
    cont = 1.0 - n + n * U[:, 1:]  # [B, T]
    w_cov_b = np.where(solv, w_cov, 0.0)[:, None]
    dm = np.zeros((B, T, 3))
    dm[..., NEXT] = (
        w_cost * r * F[:, 1:] + w_size * r * G[:, 1:] + w_cov_b * P * k * (1.0 - U[:, 1:])
    )
    # Π over the *other* correct answer of the round: miss of the other slot
    other = miss[..., ::-1]
    dm[..., :2] = w_size * r[..., None] + np.where(
        corr, w_cov_b[..., None] * (P * cont)[..., None] * other, 0.0
    )
    ds = np.where(is_top, 0.0, dm)  # the argmax's membership is the constant 1
    du = ds * s * (1.0 - s)
    dp = du / eps
    dlogits = p * (dp - (dp * p).sum(-1, keepdims=True))
    return out, np.where(allowed, dlogits, 0.0)


def calibrate_kappa(
    ep: Episodes, probs: np.ndarray, alpha: float, cal: np.ndarray | None = None
) -> np.ndarray:
    """Split-conformal κ̂ of the membership scores ``probs`` [N, T, 3]: the one place κ̂ is
    computed (batch calibration: docs/theory.md, "Split-conformal κ̂ (set policies)"). The
    covering score of each calibration question (:func:`ccpo.traces.episodes.covering_scores`)
    goes to :func:`ccpo.learning.conformal.split_conformal_threshold`. ``cal``: ``None`` (every
    question of ``ep``: a 0-d array), question indices [n] (0-d) or [K, n] (one κ̂ per row)."""
    scores = covering_scores(ep, probs)
    return split_conformal_threshold(scores if cal is None else scores[cal], alpha)


class Calibrated(NamedTuple):
    """What :func:`calibrated_cost` measures: per question, means over its random halves."""

    cost: float  # USD
    coverage: float
    set_size: float  # answers returned


def calibrated_cost(
    ep: Episodes, probs: np.ndarray, alpha: float, splits: int = 50, seed: int = 0
) -> Calibrated:
    """Cost (USD), coverage and set size of C_κ̂ on ``ep`` as the harness would measure them:
    over ``splits`` random halves, κ̂ split-conformal on one half, measured on the other.
    Used to compare scores on validation questions (averaging over splits smooths the
    α-quantile, which on a few hundred questions rests on a handful of them)."""
    m, _ = calibrated_rollout(ep, probs, alpha, splits, seed)
    return Calibrated(float(m.cost.mean()), float(m.covered.mean()), float(m.set_size.mean()))


def calibrated_rollout(
    ep: Episodes, probs: np.ndarray, alpha: float, splits: int = 50, seed: int = 0
) -> tuple[Metrics, np.ndarray | None]:
    """The per-question outcomes behind :func:`calibrated_cost` and the questions they are
    of ([splits, n − n/2] indices into ``ep``; None: all of ``ep``, below 4 questions)."""
    rng = np.random.default_rng([seed, 0xCA1])
    n = ep.n
    if n < 4:
        kappa = float(calibrate_kappa(ep, probs, alpha))
        return conformal_rollout(ep, probs, kappa), None
    draws = np.stack([rng.permutation(n) for _ in range(splits)])
    cal, test = draws[:, : n // 2], draws[:, n // 2 :]
    return conformal_rollout(ep, probs, calibrate_kappa(ep, probs, alpha, cal), test), test


def point_rollout_expectations(
    logits: np.ndarray,
    allowed: np.ndarray,
    correct: np.ndarray,
    solvable: np.ndarray,
    round_cost: np.ndarray,
    weights: tuple[float, float] | None = None,
) -> tuple[SoftOutcome, np.ndarray | None]:
    """Exact expectations of the *point* policy a_t ~ π(·|o_t) (CPO with ``rollouts="exact"``):
    the episode ends at the first answer, so with p_t = π(·|o_t) and n_t = p_t(next)

    - reach:    r_1 = 1,  r_{t+1} = r_t n_t
    - cost:     E[cost] = Σ_t r_t c_t = F_1,      F_t = c_t + n_t F_{t+1}
    - coverage: P(covered) = Σ_t r_t a_t = V_1,   V_t = a_t + n_t V_{t+1},
                a_t = p_t(base) 1{base correct} + p_t(guide) 1{guide correct}
                (1 for an unsolvable question); the set size is always 1.

    With ``weights`` = (w_cost, w_cov), also the gradient of Σ_b (w_cost·cost_b + w_cov·cov_b)
    in logit space: ∂/∂n_t = r_t (w_cost F_{t+1} + w_cov V_{t+1}), ∂/∂p_t(a) = w_cov r_t
    1{a correct}, then through the masked softmax. Shapes as :func:`soft_set_rollout`.
    """
    logits = np.asarray(logits, dtype=np.float64)
    B, T, _ = logits.shape
    p = np.exp(log_pi(logits, allowed))
    n = p[..., NEXT]  # 0 at T (masked)
    corr = np.asarray(correct, dtype=bool)
    a = (p[..., :2] * corr).sum(-1)
    r = _reach(n)
    F, V = _tail_sums(round_cost, n), _tail_sums(a, n)
    solv = np.asarray(solvable, dtype=bool)
    out = SoftOutcome(cost=F[:, 0], size=np.ones(B), coverage=np.where(solv, V[:, 0], 1.0))
    if weights is None:
        return out, None
    w_cost, w_cov = weights
    w_cov_b = np.where(solv, w_cov, 0.0)[:, None]
    dp = np.zeros((B, T, 3))
    dp[..., NEXT] = r * (w_cost * F[:, 1:] + w_cov_b * V[:, 1:])
    dp[..., :2] = (w_cov_b * r)[..., None] * corr
    dlogits = p * (dp - (dp * p).sum(-1, keepdims=True))
    return out, np.where(allowed, dlogits, 0.0)
