"""Random action probabilities for the learning and episode tests."""

from __future__ import annotations

import numpy as np


def random_probs(rng: np.random.Generator, n: int, T: int) -> np.ndarray:
    """Random π(a|o_t) over (base, guide, next) with 'next' masked at round T."""
    p = rng.dirichlet([0.7, 0.7, 0.7], size=(n, T))
    p[:, -1, 2] = 0.0
    p[:, -1] /= p[:, -1].sum(-1, keepdims=True)
    return p
