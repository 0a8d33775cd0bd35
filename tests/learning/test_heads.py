"""Tests for ccpo.learning.heads: values against torch references, Jacobians against
torch.func.jacrev (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ccpo.learning.heads import (
    log_pi,
    log_pi_jacobian,
    log_softmask,
    log_softmask_jacobian,
    masked_kl,
)
from ccpo.learning.nets import masked_log_probs, masked_probs


def _states(seed: int, n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Logits [n, 3] over a spread of sharpness, the last third with 'next' masked."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, 3)) * rng.choice([0.1, 1.0, 4.0], size=(n, 1))
    allowed = np.ones((n, 3), dtype=bool)
    allowed[2 * n // 3 :, 2] = False
    return logits, allowed


def _torch_softmask(z: torch.Tensor, allowed: torch.Tensor, kappa: float, eps: float):
    """The paper's Eq. (app) written directly in torch: the reference."""
    log_sm = F.logsigmoid((masked_probs(z, allowed) - kappa) / eps).masked_fill(
        ~allowed, -torch.inf
    )
    return log_sm - torch.logsumexp(log_sm, dim=-1, keepdim=True)


def _jacrev(fn, z: np.ndarray) -> np.ndarray:
    """Per-row Jacobian [n, A, A] of a row-wise fn, by jacrev on each row."""
    rows = [torch.func.jacrev(fn)(torch.as_tensor(r)) for r in z]
    return torch.stack(rows).numpy()


@pytest.mark.parametrize("seed", [0, 1])
def test_log_pi_and_its_jacobian(seed: int) -> None:
    z, allowed = _states(seed)
    want = masked_log_probs(torch.as_tensor(z), torch.as_tensor(allowed)).numpy()
    got = log_pi(z, allowed)
    assert np.array_equal(np.isinf(got), ~allowed)
    np.testing.assert_allclose(got[allowed], want[allowed], rtol=1e-12, atol=1e-14)
    lp, jac = log_pi_jacobian(z, allowed)
    np.testing.assert_array_equal(lp, got)
    for i in range(len(z)):
        a = torch.as_tensor(allowed[i])
        ref = torch.func.jacrev(lambda r, a=a: masked_log_probs(r, a))(torch.as_tensor(z[i]))
        ok = allowed[i]  # rows of masked actions are meaningless
        np.testing.assert_allclose(jac[i][ok], ref.numpy()[ok], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kappa", [0.05, 0.3, 0.95])
@pytest.mark.parametrize("eps", [0.01, 0.05])
def test_log_softmask_and_its_jacobian(kappa: float, eps: float) -> None:
    z, allowed = _states(int(kappa * 100))
    al = torch.as_tensor(allowed)
    want = _torch_softmask(torch.as_tensor(z), al, kappa, eps).numpy()
    got = log_softmask(z, allowed, kappa, eps)
    assert np.array_equal(np.isinf(got), ~allowed)
    np.testing.assert_allclose(got[allowed], want[allowed], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, rtol=1e-12)
    ls, jac = log_softmask_jacobian(z, allowed, kappa, eps)
    np.testing.assert_allclose(ls, got, rtol=1e-14)
    assert np.all(np.isfinite(jac))
    for i in range(len(z)):
        a = al[i]
        ref = torch.func.jacrev(lambda r, a=a: _torch_softmask(r, a, kappa, eps))(
            torch.as_tensor(z[i])
        )
        ok = allowed[i]
        np.testing.assert_allclose(jac[i][ok], ref.numpy()[ok], rtol=1e-8, atol=1e-10)


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
