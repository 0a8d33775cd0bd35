"""Policy heads in numpy: logits → log π and log S_{π,κ}, with their Jacobians in logit space.

Rows are states, the last axis the three actions; ``allowed`` (boolean, broadcast to the logits)
marks the actions a state may take (``next`` not at the last round). Masked actions get
log-probability −inf and probability exactly 0.

- :func:`log_pi`: π(a|o), the one masked softmax; :func:`policy_probs` runs a network on
  observations ``[..., T, F]``: what every evaluation, calibration and live decision calls.
- :func:`log_softmask`: CCPO's differentiable conformal policy S_{π,κ}(a|o) ∝ σ((π − κ)/ε),
  a smooth "uniform over C_{π,κ}(o)" (paper Eqs. ``app``, ``sconf``) that tends to
  {argmax π} when every action is below κ, as C's fallback does.
- ``*_jacobian``: also J[..., a, j] = ∂ log q(a) / ∂ z_j, which the trainer chains with the
  network's derivatives; the Fisher products use Jᵀ diag(q) J. Rows of masked actions are
  finite and meaningless: weight them by q = 0. :func:`masked_kl` for the trust region.
"""

from __future__ import annotations

import numpy as np

from ccpo.learning.mlp import NumpyMLP
from ccpo.traces.episodes import allowed_actions

__all__ = [
    "log_pi",
    "log_pi_jacobian",
    "log_softmask",
    "log_softmask_jacobian",
    "masked_kl",
    "policy_probs",
    "softmax_log_jacobian",
]


def _masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    return np.where(allowed, logits, -np.inf)


def _log_normalise(a: np.ndarray) -> np.ndarray:
    """a − logsumexp(a) along the last axis (entries −inf stay −inf)."""
    top = a.max(-1, keepdims=True)
    return a - (top + np.log(np.exp(a - top).sum(-1, keepdims=True)))


def log_pi(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """log π(·|o): log-softmax over the allowed actions, −inf on masked ones."""
    return _log_normalise(_masked(logits, allowed))


def policy_probs(net: NumpyMLP, obs: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Masked π(a|o) as float64 numpy for observations ``[..., T, F]``: the network on
    ``(obs − mean) / std``, then :func:`log_pi` with ``next`` masked at the last round."""
    obs = np.asarray(obs)
    if obs.ndim < 2 or obs.shape[-1] != net.in_dim:
        raise ValueError(f"obs must have shape [..., T, {net.in_dim}], got {obs.shape}")
    logits = net((obs - mean) / std)
    return np.exp(log_pi(logits, allowed_actions(obs.shape[-2])))


def log_pi_jacobian(logits: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log π and J = ∂ log π(a) / ∂ z_j (``[..., A, A]``, :func:`softmax_log_jacobian`)."""
    lp = log_pi(logits, allowed)
    return lp, softmax_log_jacobian(np.exp(lp))


def softmax_log_jacobian(p: np.ndarray) -> np.ndarray:
    """J = ∂ log π(a) / ∂ z_j = δ_aj − π_j (``[..., A, A]``) from π itself (masked or not)."""
    return np.eye(p.shape[-1]) - p[..., None, :]


def _softmask_parts(logits, allowed, kappa, eps):
    p = np.exp(log_pi(logits, allowed))
    u = (p - kappa) / eps
    log_sig = -np.logaddexp(0.0, -u)  # log σ(u), stable for either sign
    return p, u, _log_normalise(np.where(allowed, log_sig, -np.inf))


def log_softmask(logits: np.ndarray, allowed: np.ndarray, kappa: float, eps: float) -> np.ndarray:
    """log S_{π,κ}(·|o) with S ∝ σ((π − κ)/ε) over the allowed actions (paper Eq. ``app``)."""
    return _softmask_parts(logits, allowed, kappa, eps)[2]


def log_softmask_jacobian(
    logits: np.ndarray, allowed: np.ndarray, kappa: float, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """log S and J = ∂ log S(a) / ∂ z_j (``[..., A, A]``).

    With u = (π − κ)/ε, log S = log σ(u) − logsumexp(log σ(u)) and π = softmax(z), the chain
    rule gives J = (I − 1 Sᵀ) · diag(σ(−u) π / ε) · (I − 1 πᵀ): the log-normaliser's Jacobian,
    d log σ(u)/du = σ(−u), du/dπ = 1/ε, and ∂π_k/∂z_j = π_k (δ_kj − π_j).
    """
    p, u, ls = _softmask_parts(logits, allowed, kappa, eps)
    s = np.exp(ls)
    eye = np.eye(p.shape[-1])
    d = np.exp(-np.logaddexp(0.0, u)) * p / eps  # σ(−u) π / ε
    left = eye - s[..., None, :]  # ∂ log S / ∂ log σ(u)
    right = d[..., :, None] * (eye - p[..., None, :])  # ∂ log σ(u) / ∂ z
    return ls, left @ right


def masked_kl(logp_old: np.ndarray, logp_new: np.ndarray, valid: np.ndarray) -> float:
    """Mean over the ``valid`` states of KL(old ‖ new) between categorical distributions
    (terms where the old probability is 0 count 0)."""
    p_old = np.exp(logp_old)
    with np.errstate(invalid="ignore"):  # −inf − (−inf) on masked actions, weighted by 0
        diff = np.where(p_old > 0, logp_old - logp_new, 0.0)
    return float((p_old * diff).sum(-1)[valid].mean())
