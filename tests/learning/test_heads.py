"""Tests for ccpo.learning.heads: values against the formulas written out directly, Jacobians
against the complex step on them (exact to rounding, float64)."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.learning.heads import (
    log_pi,
    log_pi_jacobian,
    log_softmask,
    log_softmask_jacobian,
    masked_kl,
)


def _states(seed: int, n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Logits [n, 3] over a spread of sharpness, the last third with 'next' masked."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 3)) * rng.choice([0.1, 1.0, 4.0], size=(n, 1))
    allowed = np.ones((n, 3), dtype=bool)
    allowed[2 * n // 3 :, 2] = False
    return logits, allowed


def _log_normalise(a: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """log of exp(a) / Σ_allowed exp(a) on allowed entries, 0 elsewhere (complex-safe: the
    logits here are small enough for exp without a shift)."""
    e = np.where(allowed, np.exp(np.where(allowed, a, 0)), 0)
    return np.where(allowed, a - np.log(e.sum(-1, keepdims=True)), 0)


def _ref_log_pi(z: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    return _log_normalise(z, allowed)


def _ref_softmask(z: np.ndarray, allowed: np.ndarray, kappa: float, eps: float) -> np.ndarray:
    """The paper's Eq. (app) written directly: log σ((π − κ)/ε), normalised over the allowed
    actions (log σ(x) = −log(1 + e^{−x}))."""
    p = np.exp(_ref_log_pi(z, allowed))
    log_sig = -np.log(1 + np.exp(-(p - kappa) / eps))
    return _log_normalise(log_sig, allowed)


def _complex_step_jacobian(fn, z: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Per-row Jacobian ``[n, A, A]`` (J[i, a, j] = ∂ fn(z)[i, a] / ∂ z[i, j]) of a row-wise
    ``fn``, by the complex step: Im fn(z + i h e_j) / h, no difference taken."""
    h = 1e-30
    cols = []
    for j in range(z.shape[1]):
        zc = z.astype(complex)
        zc[:, j] += 1j * h
        cols.append(fn(zc, allowed).imag / h)
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("seed", [0, 1])
def test_log_pi_and_its_jacobian(seed: int) -> None:
    z, allowed = _states(seed)
    want = _ref_log_pi(z, allowed)
    got = log_pi(z, allowed)
    assert np.array_equal(np.isinf(got), ~allowed)
    np.testing.assert_allclose(got[allowed], want[allowed], rtol=1e-12, atol=1e-14)
    lp, jac = log_pi_jacobian(z, allowed)
    np.testing.assert_array_equal(lp, got)
    ref = _complex_step_jacobian(_ref_log_pi, z, allowed)
    for i in range(len(z)):
        ok = allowed[i]  # rows of masked actions are meaningless
        np.testing.assert_allclose(jac[i][ok], ref[i][ok], rtol=1e-10, atol=1e-12)
    assert np.all(ref[allowed[:, 2] == 0, :, 2] == 0)  # a masked logit moves nothing


def test_log_pi_gives_exact_zeros_on_masked_actions_even_for_extreme_logits() -> None:
    p = np.exp(log_pi(np.array([[1e4, -1e4, 1e4]]), np.array([[False, True, True]])))
    assert p[0, 0] == 0.0 and np.isfinite(p).all()
    np.testing.assert_allclose(p[0], [0.0, 0.0, 1.0], atol=0)


@pytest.mark.parametrize("kappa", [0.05, 0.3, 0.95])
@pytest.mark.parametrize("eps", [0.01, 0.05])
def test_log_softmask_and_its_jacobian(kappa: float, eps: float) -> None:
    z, allowed = _states(int(kappa * 100))
    want = _ref_softmask(z, allowed, kappa, eps)
    got = log_softmask(z, allowed, kappa, eps)
    assert np.array_equal(np.isinf(got), ~allowed)
    np.testing.assert_allclose(got[allowed], want[allowed], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, rtol=1e-12)
    ls, jac = log_softmask_jacobian(z, allowed, kappa, eps)
    np.testing.assert_allclose(ls, got, rtol=1e-14)
    assert np.all(np.isfinite(jac))
    ref = _complex_step_jacobian(lambda r, a: _ref_softmask(r, a, kappa, eps), z, allowed)
    for i in range(len(z)):
        ok = allowed[i]
        np.testing.assert_allclose(jac[i][ok], ref[i][ok], rtol=1e-8, atol=1e-10)


def test_masked_kl() -> None:
    z, allowed = _states(3)
    old = log_pi(z, allowed)
    new = log_pi(z + np.random.default_rng(4).normal(size=z.shape), allowed)
    valid = np.arange(len(z)) % 4 != 1
    p = np.exp(old)
    diff = old - np.where(allowed, new, 0.0)  # masked entries are dropped below
    want = np.mean([np.sum(p[i][allowed[i]] * diff[i][allowed[i]]) for i in np.where(valid)[0]])
    assert masked_kl(old, new, valid) == pytest.approx(want, rel=1e-12)
    assert masked_kl(old, old, valid) == 0.0
    assert masked_kl(old, new, valid) > 0
