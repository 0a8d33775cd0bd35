"""Adam on a flat numpy vector equals torch.optim.Adam."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ccpo.learning.optim import Adam


@pytest.mark.parametrize("lr", [1e-3, 0.1])
def test_adam_matches_torch(lr: float) -> None:
    rng = np.random.default_rng(0)
    theta = rng.normal(size=50)
    ref = torch.nn.Parameter(torch.as_tensor(theta.copy()))
    opt_ref = torch.optim.Adam([ref], lr=lr)
    opt = Adam(theta.size, lr=lr)
    for _ in range(20):
        grad = rng.normal(size=50) * rng.choice([1e-4, 1.0, 100.0])
        ref.grad = torch.as_tensor(grad.copy())
        opt_ref.step()
        opt.step(theta, grad)
    np.testing.assert_allclose(theta, ref.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_adam_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="lr"):
        Adam(3, lr=0)
    with pytest.raises(ValueError, match="betas"):
        Adam(3, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="shape"):
        Adam(3).step(np.zeros(3), np.zeros(4))
