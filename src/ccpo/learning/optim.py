"""Adam on a flat numpy parameter vector (Kingma & Ba 2015), for the critics V_θ and V_{C,φ}.

The update of ``torch.optim.Adam`` without weight decay or amsgrad (tested against values worked
out by hand from the formula):
m ← β₁m + (1 − β₁)g, v ← β₂v + (1 − β₂)g², θ ← θ − lr · (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε).
"""

from __future__ import annotations

import math

import numpy as np


class Adam:
    """Adam state (m, v, t) for one flat parameter vector; :meth:`step` updates it in place."""

    def __init__(
        self, size: int, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps=1e-8
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = np.zeros(size)
        self.v = np.zeros(size)
        self.t = 0

    def step(self, theta: np.ndarray, grad: np.ndarray) -> None:
        """One Adam update of ``theta`` (in place) with gradient ``grad`` of the loss."""
        if grad.shape != self.m.shape or theta.shape != self.m.shape:
            raise ValueError(f"theta and grad must have shape {self.m.shape}")
        b1, b2 = self.betas
        self.t += 1
        self.m *= b1
        self.m += (1 - b1) * grad
        self.v *= b2
        self.v += (1 - b2) * grad * grad
        step_size = self.lr / (1 - b1**self.t)
        denom = np.sqrt(self.v) / math.sqrt(1 - b2**self.t) + self.eps
        theta -= step_size * self.m / denom
