"""V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA, Eq. 1).

Layout: **batch-major** ``[B, T]`` (B episodes, T rounds; ``T`` is the round budget, 4 in the
paper). Every per-step tensor has shape ``[B, T]``; ``bootstrap_value`` has shape ``[B]``.

Variable-length episodes are padded to T on the right and described by

- ``mask[b, t]`` = 1 for the steps that were actually taken. It must be a prefix mask
  (1…1 0…0): an episode is the contiguous run of valid steps from t = 0. Padded steps are
  ignored entirely (their rewards, discounts, values and ratios may hold any finite value or
  NaN) and get ``vs = values`` and ``pg_advantages = 0``, so an unmasked L2 loss on them is 0.
- ``discounts[b, t]`` = γ_t, the discount applied *after* step t: 0 at a terminal step (the
  episode ended with an answer), γ otherwise (γ = 1 in the paper).
- ``bootstrap_value[b]`` = V(x_L), the value of the state after the last valid step. It is used
  only through ``discounts[b, L-1]``: with a terminal last step (discount 0) it has no effect, so
  the value is bootstrapped only when an episode was truncated.

Definition (Espeholt et al. 2018, Eq. 1), for a valid step s of an episode of length L::

    v_s = V(x_s) + Σ_{t=s}^{L-1} (Π_{i=s}^{t-1} γ_i c_i) δ_t V,
    δ_t V = ρ_t (r_t + γ_t V(x_{t+1}) − V(x_t)),
    ρ_t = min(ρ̄, π(a_t|x_t) / μ(a_t|x_t)),   c_i = min(c̄, π(a_i|x_i) / μ(a_i|x_i)),

computed by the equivalent backward recursion (the paper's Eq. impala, with γ = 1)::

    v_s − V(x_s) = δ_s V + γ_s c_s (v_{s+1} − V(x_{s+1})),   v_L − V(x_L) = 0.

The policy-gradient advantage (Espeholt et al. 2018, Sec. 4.2) is
``ρ^pg_s (r_s + γ_s v_{s+1} − V(x_s))`` with ``ρ^pg_s = min(ρ̄_pg, π/μ)`` and ``v_L = V(x_L)``
(the bootstrap value). With ``pg_rho_weighted=False`` it is the paper's unweighted
``Â_s = r_s + γ_s v_{s+1} − V(x_s)``, for surrogates that carry their own importance ratio.

In CCPO the behaviour policy μ is the score policy π and the target is the stochastic conformal
policy S_{π,κ}; callers pass ``rhos = S(a_t|o_t) / π(a_t|o_t)`` (ratios, not log-ratios) and use
the same ratios for the value critic V_θ and the constraint critic V_{C,φ}.

Note on the fixed point (Espeholt et al. 2018, Remark 1). With ρ̄ = 1 (the paper's choice and our
default) the V-trace operator's fixed point is the value of the policy

    π_ρ̄(a|x) ∝ min(ρ̄ μ(a|x), π_target(a|x)) = min(π(a|o), S(a|o)),

not the value of the target S itself: clipping trades this bias for bounded variance. This
module computes exactly Eq. 1 and does NOT try to correct for the bias (pass ``clip_rho=None``
for untruncated ratios if that is what you want).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

__all__ = ["VTraceOutput", "vtrace_targets"]

ArrayLike = torch.Tensor | np.ndarray


class VTraceOutput(NamedTuple):
    """V-trace outputs, both ``[B, T]`` and without gradient.

    Attributes:
        vs: value targets v_s (equal to ``values`` at padded steps).
        pg_advantages: policy-gradient advantages (0 at padded steps).
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor


def _as_float_tensor(x: ArrayLike | float, like: torch.Tensor | None) -> torch.Tensor:
    t = torch.as_tensor(x)
    if like is not None:
        t = t.to(dtype=like.dtype, device=like.device)
    elif not torch.is_floating_point(t):
        t = t.to(torch.get_default_dtype())
    return t.detach()


def _check_mask(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype != torch.bool:
        if not torch.all((mask == 0) | (mask == 1)):
            raise ValueError("mask must hold only 0/1 (or be boolean)")
        mask = mask != 0
    # Prefix mask: once a step is invalid, every later step is invalid.
    if mask.shape[1] > 1 and torch.any(~mask[:, :-1] & mask[:, 1:]):
        raise ValueError("mask must be a prefix mask (1…1 0…0) along the time axis")
    return mask


def vtrace_targets(
    values: ArrayLike,
    bootstrap_value: ArrayLike,
    rewards: ArrayLike,
    discounts: ArrayLike,
    rhos: ArrayLike,
    clip_rho: float | None = 1.0,
    clip_c: float | None = 1.0,
    *,
    mask: ArrayLike | None = None,
    clip_pg_rho: float | None = 1.0,
    pg_rho_weighted: bool = True,
) -> VTraceOutput:
    """V-trace value targets and policy-gradient advantages (Espeholt et al. 2018, Eq. 1).

    All per-step inputs are batch-major ``[B, T]``; see the module docstring for the padding,
    discount and bootstrap semantics. Computed without gradient (these are regression targets).

    Args:
        values: V(x_t) under the current critic, ``[B, T]``.
        bootstrap_value: V(x_L) after the last valid step, ``[B]`` (used only on truncation).
        rewards: r_t, ``[B, T]``.
        discounts: γ_t applied after step t (0 at terminal steps), ``[B, T]``.
        rhos: importance ratios π_target(a_t|x_t) / μ(a_t|x_t) ≥ 0 (not logs), ``[B, T]``.
        clip_rho: ρ̄, truncation of ρ_t in δ_t V (None: no truncation). Paper: 1.
        clip_c: c̄, truncation of the trace coefficients c_t (None: no truncation). Paper: 1.
        mask: 1 for valid steps, a prefix mask ``[B, T]``; None means every step is valid.
        clip_pg_rho: truncation of the ratio in the policy-gradient advantage (None: none).
        pg_rho_weighted: if False, the advantage is the unweighted r_t + γ_t v_{t+1} − V(x_t).

    Returns:
        ``VTraceOutput(vs, pg_advantages)``, each ``[B, T]``, dtype of ``values``.

    Raises:
        ValueError: on shape mismatches, a non-prefix mask, negative ratios or non-positive
            clipping thresholds.
    """
    v = _as_float_tensor(values, None)
    if v.ndim != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(v.shape)}")
    bsz, horizon = v.shape
    boot = _as_float_tensor(bootstrap_value, v)
    r = _as_float_tensor(rewards, v)
    disc = _as_float_tensor(discounts, v)
    rho = _as_float_tensor(rhos, v)
    if boot.shape != (bsz,):
        raise ValueError(f"bootstrap_value must be [B]=({bsz},), got shape {tuple(boot.shape)}")
    for name, t in (("rewards", r), ("discounts", disc), ("rhos", rho)):
        if t.shape != v.shape:
            raise ValueError(
                f"{name} must have the shape of values {tuple(v.shape)}, got {tuple(t.shape)}"
            )
    if mask is None:
        m = torch.ones((bsz, horizon), dtype=torch.bool, device=v.device)
    else:
        m = torch.as_tensor(mask, device=v.device)
        if m.shape != v.shape:
            raise ValueError(
                f"mask must have the shape of values {tuple(v.shape)}, got {tuple(m.shape)}"
            )
        m = _check_mask(m)
    for name, clip in (("clip_rho", clip_rho), ("clip_c", clip_c), ("clip_pg_rho", clip_pg_rho)):
        if clip is not None and not clip > 0:
            raise ValueError(f"{name} must be positive or None, got {clip}")

    with torch.no_grad():
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        # Padded entries may hold garbage (even NaN): replace them before any arithmetic.
        v_valid = torch.where(m, v, zero)
        r = torch.where(m, r, zero)
        disc = torch.where(m, disc, zero)
        rho = torch.where(m, rho, zero)
        if torch.any(rho < 0):
            raise ValueError("rhos are importance ratios and must be >= 0 (not log-ratios)")

        rho_clipped = rho if clip_rho is None else torch.clamp(rho, max=clip_rho)
        cs = rho if clip_c is None else torch.clamp(rho, max=clip_c)

        # V(x_{t+1}): the next valid value, or the bootstrap value after the last valid step.
        next_valid = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)
        v_next = torch.cat([v_valid[:, 1:], boot[:, None]], dim=1)
        v_tp1 = torch.where(next_valid, v_next, boot[:, None].expand_as(v_next))

        # γ_t V(x_{t+1}), exactly 0 at terminal steps even if the bootstrap value is NaN/inf.
        disc_v_tp1 = torch.where(disc != 0, disc * v_tp1, zero)
        deltas = torch.where(m, rho_clipped * (r + disc_v_tp1 - v_valid), zero)

        # Backward recursion: acc_s = v_s − V(x_s) = δ_s + γ_s c_s acc_{s+1}, acc_L = 0.
        acc = torch.zeros(bsz, dtype=v.dtype, device=v.device)
        corrections = []
        for t in range(horizon - 1, -1, -1):
            acc = torch.where(m[:, t], deltas[:, t] + disc[:, t] * cs[:, t] * acc, zero)
            corrections.append(acc)
        corrections.reverse()
        vs_minus_v = torch.stack(corrections, dim=1)
        vs = torch.where(m, v_valid + vs_minus_v, v)

        # v_{s+1} for the advantage: next target, or V(x_L) after the last valid step.
        vs_next = torch.cat([vs[:, 1:], boot[:, None]], dim=1)
        vs_tp1 = torch.where(next_valid, vs_next, boot[:, None].expand_as(vs_next))
        if pg_rho_weighted:
            pg_rho = rho if clip_pg_rho is None else torch.clamp(rho, max=clip_pg_rho)
        else:
            pg_rho = torch.ones_like(rho)
        disc_vs_tp1 = torch.where(disc != 0, disc * vs_tp1, zero)
        pg_adv = torch.where(m, pg_rho * (r + disc_vs_tp1 - v_valid), zero)
    return VTraceOutput(vs=vs, pg_advantages=pg_adv)
