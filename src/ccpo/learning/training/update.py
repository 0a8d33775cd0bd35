"""The pieces both training loops share inside their step: the target policy, the entropy
bonus, and step 5, the CPO update of π (:func:`cpo_update`).

A loop gives :func:`cpo_update` the logit-space gradients of its reward and constraint
surrogates at θ_k (one reverse pass through π gives g and b), the constraint value c, the
:class:`TrustRegion` (the policy whose KL bounds the step) and ``surrogates(logits)``, the
surrogates at any θ for the line search. Derivation: docs/theory.md, section "Departures from
CCPO/CPO".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ccpo.learning.config import Method, TrainConfig
from ccpo.learning.heads import log_pi, log_softmask, masked_kl
from ccpo.learning.nets import NumpyMLP
from ccpo.learning.trust_region import (
    OBJECTIVE_CASES,
    CPOInfo,
    LineSearchResult,
    backtracking_line_search,
    cpo_step,
    logit_fisher_blocks,
    span_conjugate_gradient,
)

Tape = list[tuple[np.ndarray, np.ndarray]]  # NumpyMLP.forward's record for its vjp
#: ``surrogates(logits)`` → (reward surrogate, constraint surrogate, the trust policy's log-probs)
Surrogates = Callable[[np.ndarray], tuple[float, float, np.ndarray]]


def target_log_probs(
    logits: np.ndarray, kappa: float, eps: float, method: Method, allowed: np.ndarray
) -> np.ndarray:
    """log of the target policy: S_{π,κ} for CCPO (:func:`ccpo.learning.heads.log_softmask`,
    paper Eqs. ``sconf`` and ``app``), π itself for CPO."""
    if method == "cpo":
        return log_pi(logits, allowed)
    return log_softmask(logits, allowed, kappa, eps)


def entropy_and_grad(logp: np.ndarray) -> tuple[float, np.ndarray]:
    """Σ over states of H(π) = −Σ_a π log π and its gradient in logit space,
    ∂H/∂z_j = −π_j (log π_j + H) (0 on masked actions). ``logp`` [..., A] (−inf = masked)."""
    p = np.exp(logp)
    plogp = p * np.where(p > 0, logp, 0.0)
    h = -plogp.sum(-1, keepdims=True)
    grad = -(plogp + p * h)
    return float(h.sum()), grad


@dataclass(frozen=True)
class TrustRegion:
    """The policy whose mean KL(θ_k ‖ θ) over the states ``mask`` selects bounds a step: its
    log-probabilities at θ_k ``[B, T, A]`` and their logit Jacobians ``[B, T, A, A]``."""

    log_probs_old: np.ndarray
    jacobian: np.ndarray
    mask: np.ndarray  # [B, T]


def cpo_update(
    pi: NumpyMLP,
    x: np.ndarray,
    tape: Tape,
    u_r: np.ndarray,
    u_c: np.ndarray,
    c: float,
    obj_old: float,
    con_old: float,
    trust: TrustRegion,
    surrogates: Surrogates,
    cfg: TrainConfig,
) -> dict[str, float]:
    """Step 5 on π in place: g = Zᵀu_r and b = Zᵀu_c (``tape`` of the states the upstream
    logit gradients ``u_r``, ``u_c`` belong to), H⁻¹g and H⁻¹b by conjugate gradient on the
    trust region's Fisher in the span of Zᵀ where g and b live, the CPO direction
    (:func:`~ccpo.learning.trust_region.cpo_step`) and a backtracking line search on the
    states ``x`` that leaves π at θ_k when nothing is accepted. Returns the ``cpo/*`` entries
    (case −1 when the surrogates are flat: nothing to learn)."""
    g, b = pi.vjp(tape, u_r), pi.vjp(tape, u_c)
    if not (np.any(g) or np.any(b)):
        return cpo_log(None, None)
    gram = pi.output_gram(tape)
    blocks = logit_fisher_blocks(
        trust.jacobian[trust.mask], np.exp(trust.log_probs_old[trust.mask])
    )
    x_g = pi.vjp(tape, span_conjugate_gradient(gram, blocks, u_r, cfg.damping, cfg.cg_iters))
    x_b = b
    if np.any(b):
        x_b = pi.vjp(tape, span_conjugate_gradient(gram, blocks, u_c, cfg.damping, cfg.cg_iters))
    direction, info = cpo_step(g, b, c, cfg.delta, x_g, x_b)

    def evaluate(theta: np.ndarray) -> tuple[float, float, float]:
        """(reward surrogate, constraint c, trust-region KL) at θ."""
        pi.theta[:] = theta
        obj, con, trust_new = surrogates(pi(x).reshape(trust.log_probs_old.shape))
        kl = masked_kl(trust.log_probs_old, trust_new, trust.mask)
        return obj, c - (con - con_old), kl

    theta, ls = backtracking_line_search(
        pi.theta.copy(), direction, evaluate, objective_old=obj_old, constraint_old=c,
        max_kl=cfg.delta, check_objective=info.case in OBJECTIVE_CASES,
        backtrack_coeff=cfg.backtrack_coeff, max_backtracks=cfg.max_backtracks,
    )  # fmt: skip
    pi.theta[:] = theta
    return cpo_log(info, ls)


def cpo_log(info: CPOInfo | None, ls: LineSearchResult | None) -> dict[str, float]:
    """The ``cpo/*`` diagnostics of one step (case −1 / NaN when there was nothing to step)."""
    return {
        "cpo/case": -1.0 if info is None else float(info.case_id),
        "cpo/lambda": math.nan if info is None else info.lam,
        "cpo/nu": math.nan if info is None else info.nu,
        "cpo/kl": 0.0 if ls is None else ls.kl,
        "cpo/accepted": 0.0 if ls is None else float(ls.accepted),
        "cpo/backtracks": 0.0 if ls is None else float(ls.steps_tried - 1),
    }
