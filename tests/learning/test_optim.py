"""Adam on a flat numpy vector: the update of Kingma & Ba (2015), Algorithm 1, as
torch.optim.Adam does it without weight decay or amsgrad, checked against values worked out by
hand and against the algorithm written out one scalar at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ccpo.learning.optim import Adam


def test_two_steps_worked_out_by_hand() -> None:
    """θ₀ = 1, lr = 0.1, g₁ = 1 then g₂ = −1 (β = 0.9, 0.999, ε = 1e-8):
    step 1: m = 0.1, v = 0.001, m̂ = 1, v̂ = 1, so θ₁ = 1 − 0.1 / (1 + ε);
    step 2: m = 0.09 − 0.1 = −0.01, v = 0.000999 + 0.001 = 0.001999, m̂ = −0.01 / 0.19 = −1/19,
    v̂ = 0.001999 / (1 − 0.999²) = 1, so θ₂ = θ₁ + 0.1 · (1/19) / (1 + ε)."""
    theta = np.array([1.0])
    opt = Adam(1, lr=0.1)
    opt.step(theta, np.array([1.0]))
    assert theta[0] == pytest.approx(1 - 0.1 / (1 + 1e-8), rel=1e-15)
    opt.step(theta, np.array([-1.0]))
    assert theta[0] == pytest.approx(1 - 0.1 / (1 + 1e-8) + (0.1 / 19) / (1 + 1e-8), rel=1e-14)


@pytest.mark.parametrize("g", [1e-3, -2.0, 50.0])
def test_a_constant_gradient_moves_lr_a_step(g: float) -> None:
    """With the bias corrections, m̂ = g and v̂ = g² at every step: each step moves θ by
    lr · g / (|g| + ε), about lr against the gradient's sign whatever its size."""
    theta = np.zeros(3)
    opt = Adam(3, lr=0.01)
    for _ in range(25):
        opt.step(theta, np.full(3, g))
    np.testing.assert_allclose(theta, -25 * 0.01 * g / (abs(g) + 1e-8), rtol=1e-12)


def _scalar_adam(theta: list[float], grads: list[list[float]], lr: float) -> list[float]:
    """Algorithm 1 of Kingma & Ba with ε added to √v̂ (torch's placement), one float at a
    time in plain Python."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    out = []
    for i, th in enumerate(theta):
        m = v = 0.0
        for t, g in enumerate((gs[i] for gs in grads), start=1):
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            th -= lr * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
        out.append(th)
    return out


@pytest.mark.parametrize("lr", [1e-3, 0.1])
def test_adam_equals_the_algorithm_written_out(lr: float) -> None:
    """20 steps with gradients spanning six orders of magnitude."""
    rng = np.random.default_rng(0)
    theta = rng.normal(size=50)
    start = theta.tolist()
    grads = [rng.normal(size=50) * rng.choice([1e-4, 1.0, 100.0]) for _ in range(20)]
    opt = Adam(theta.size, lr=lr)
    for g in grads:
        opt.step(theta, g)
    want = _scalar_adam(start, [g.tolist() for g in grads], lr)
    np.testing.assert_allclose(theta, want, rtol=1e-12, atol=1e-14)
    assert opt.t == 20


def test_adam_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="lr"):
        Adam(3, lr=0)
    with pytest.raises(ValueError, match="betas"):
        Adam(3, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="shape"):
        Adam(3).step(np.zeros(3), np.zeros(4))
