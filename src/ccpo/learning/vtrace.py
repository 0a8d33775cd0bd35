"""V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA, Eq. 1):
:func:`vtrace_targets` returns :class:`VTraceOutput` (``vs``, ``pg_advantages``).

Layout: batch-major ``[B, T]`` (B episodes, T rounds); ``bootstrap_value`` is ``[B]``.

- ``mask``: a prefix mask (1…1 0…0) of the steps taken. Padded steps are ignored (they may
  hold any finite value or NaN) and get ``vs = values`` and ``pg_advantages = 0``, so an
  unmasked L2 loss on them is 0.
- ``discounts[b, t]`` = γ_t, applied after step t: 0 at a terminal step, else γ (1 here).
- ``bootstrap_value[b]`` = V(x_L) enters only through the last valid step's discount, so it
  counts only when an episode was truncated.

CCPO passes ``rhos = S(a_t|o_t) / π(a_t|o_t)`` (ratios, not log-ratios), the same for both
critics. With ρ̄ = 1 (the default) the fixed point is the value of min(π, S), not of S; Eq. 1
is computed as it is (``clip_rho=None`` for untruncated ratios).

Derivation: docs/theory.md, section "V-trace".
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["VTraceOutput", "vtrace_targets"]

ArrayLike = Any  # anything ``np.asarray`` accepts: arrays, lists, scalars


class VTraceOutput(NamedTuple):
    """V-trace outputs, both ``[B, T]`` float64 arrays (fresh, never views of the inputs).

    Attributes:
        vs: value targets v_s (equal to ``values`` at padded steps).
        pg_advantages: policy-gradient advantages (0 at padded steps).
    """

    vs: np.ndarray
    pg_advantages: np.ndarray


def _check_mask(mask: np.ndarray) -> np.ndarray:
    if mask.dtype != np.bool_:
        as_bool = mask.astype(np.bool_)
        # True == 1 and False == 0 only for 0/1 entries (2, -1, 0.5 and NaN all fail).
        if not (as_bool == mask).all():
            raise ValueError("mask must hold only 0/1 (or be boolean)")
        mask = as_bool
    # Prefix mask: once a step is invalid, every later step is invalid.
    if mask.shape[1] > 1 and (mask[:, 1:] > mask[:, :-1]).any():
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
    discount and bootstrap semantics. Inputs may be anything ``np.asarray`` accepts (numpy
    arrays, lists, floats) and are converted to float64; they are never modified.

    Args:
        values: V(x_t) under the current critic, ``[B, T]``.
        bootstrap_value: V(x_L) after the last valid step, ``[B]`` (used only on truncation).
        rewards: r_t, ``[B, T]``.
        discounts: γ_t applied after step t (0 at terminal steps), ``[B, T]``.
        rhos: importance ratios π_target(a_t|x_t) / μ(a_t|x_t) ≥ 0 (not logs), ``[B, T]``.
        clip_rho: ρ̄, truncation of ρ_t in δ_t V (None: no truncation). Paper: 1.
        clip_c: c̄, truncation of the trace coefficients c_t (None: no truncation). Paper: 1.
        mask: 1 for valid steps, a prefix mask ``[B, T]`` (boolean or 0/1); None means every
            step is valid.
        clip_pg_rho: truncation of the ratio in the policy-gradient advantage (None: none).
        pg_rho_weighted: if False, the advantage is the unweighted r_t + γ_t v_{t+1} − V(x_t).

    Returns:
        ``VTraceOutput(vs, pg_advantages)``, each a new ``[B, T]`` float64 array.

    Raises:
        ValueError: on shape mismatches, a non-prefix mask, negative ratios or non-positive
            clipping thresholds.
    """
    f64 = np.float64
    v = np.asarray(values, dtype=f64)
    if v.ndim != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(v.shape)}")
    bsz, horizon = v.shape
    boot = np.asarray(bootstrap_value, dtype=f64)
    r = np.asarray(rewards, dtype=f64)
    disc = np.asarray(discounts, dtype=f64)
    rho = np.asarray(rhos, dtype=f64)
    if boot.shape != (bsz,):
        raise ValueError(f"bootstrap_value must be [B]=({bsz},), got shape {tuple(boot.shape)}")
    for name, a in (("rewards", r), ("discounts", disc), ("rhos", rho)):
        if a.shape != v.shape:
            raise ValueError(
                f"{name} must have the shape of values {tuple(v.shape)}, got {tuple(a.shape)}"
            )
    m: np.ndarray | None = None
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != v.shape:
            raise ValueError(
                f"mask must have the shape of values {tuple(v.shape)}, got {tuple(m.shape)}"
            )
        m = _check_mask(m)
    for name, clip in (("clip_rho", clip_rho), ("clip_c", clip_c), ("clip_pg_rho", clip_pg_rho)):
        if clip is not None and not clip > 0:
            raise ValueError(f"{name} must be positive or None, got {clip}")

    # Padded entries may hold garbage (even NaN): zero them before any arithmetic. np.where
    # returns new arrays, so the caller's inputs are never written to.
    if m is not None:
        v_valid = np.where(m, v, 0.0)
        r = np.where(m, r, 0.0)
        disc = np.where(m, disc, 0.0)
        rho = np.where(m, rho, 0.0)
    else:
        v_valid = v
    if (rho < 0).any():
        raise ValueError("rhos are importance ratios and must be >= 0 (not log-ratios)")

    rho_clipped = rho if clip_rho is None else np.minimum(rho, clip_rho)
    if clip_c is None:
        cs = rho
    elif clip_c == clip_rho:  # the paper's ρ̄ = c̄: share the clipped ratios
        cs = rho_clipped
    else:
        cs = np.minimum(rho, clip_c)

    # V(x_{t+1}): the next valid value, or the bootstrap value after the last valid step
    # (a padded step's own V(x_{t+1}) is irrelevant: its discount is 0).
    v_tp1 = np.empty((bsz, horizon), dtype=f64)
    v_tp1[:, -1] = boot
    if m is None:
        v_tp1[:, :-1] = v[:, 1:]
    else:
        v_tp1[:, :-1] = np.where(m[:, 1:], v[:, 1:], boot[:, None])
    # γ_t V(x_{t+1}), exactly 0 at terminal steps even if the bootstrap value is NaN/inf
    # (the next value is zeroed before the product, so 0 · inf never happens).
    nonterminal = disc != 0
    disc_v_tp1 = np.where(nonterminal, v_tp1, 0.0)
    disc_v_tp1 *= disc
    # δ_t V; exactly 0 at padded steps, where ρ, r, γ and V were all zeroed above.
    deltas = r + disc_v_tp1
    deltas -= v_valid
    deltas *= rho_clipped

    # Backward recursion: acc_s = v_s − V(x_s) = δ_s + γ_s c_s acc_{s+1}, acc_L = 0.
    # Column T is acc_T = 0; padded steps stay exactly 0 (their δ and γ are 0).
    disc_cs = disc * cs
    corr = np.empty((bsz, horizon + 1), dtype=f64)
    corr[:, horizon] = 0.0
    for t in range(horizon - 1, -1, -1):
        acc = corr[:, t]
        np.multiply(disc_cs[:, t], corr[:, t + 1], out=acc)
        acc += deltas[:, t]
    vs_minus_v = corr[:, :horizon]
    vs = v_valid + vs_minus_v
    if m is not None:
        vs = np.where(m, vs, v)

    # v_{s+1} for the advantage: next target, or V(x_L) after the last valid step. Since
    # acc = 0 at padded steps and after T, v_{s+1} = V(x_{s+1}) + acc_{s+1} covers both cases.
    vs_tp1 = v_tp1 + corr[:, 1:]
    disc_vs_tp1 = np.where(nonterminal, vs_tp1, 0.0)
    disc_vs_tp1 *= disc
    # Exactly 0 at padded steps (r, γ, V and ρ were zeroed), without a final mask.
    pg_adv = r + disc_vs_tp1
    pg_adv -= v_valid
    if pg_rho_weighted:
        pg_adv *= rho if clip_pg_rho is None else np.minimum(rho, clip_pg_rho)
    return VTraceOutput(vs=vs, pg_advantages=pg_adv)
