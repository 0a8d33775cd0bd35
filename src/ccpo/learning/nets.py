"""Policy and critic networks (the paper: three layers of 64 units, trained from scratch, CPU),
built in numpy: no torch.

- :func:`policy_net` maps an observation o_t to logits over the three actions
  ``ACTIONS = ("base", "guide", "next")`` (indices 0, 1, 2);
  :func:`ccpo.learning.heads.log_pi` turns logits into π(·|o) with exact zeros on unavailable
  actions (``next`` at round T).
- :func:`value_net` maps o_t to a scalar (one output); used for both the value critic V_θ and
  the constraint critic V_{C,φ}.
- Both are :class:`~ccpo.learning.mlp.NumpyMLP` (re-exported here): the float64 network the
  training loop, every evaluation and every live decision run on.

"3 layers × 64" is read as three hidden layers of width 64 (tanh), followed by a linear output
layer. **Initialisation** is orthogonal (hidden gain √2; policy head gain 0.01, so the initial
policy is close to uniform; value head gain 1) with zero biases, as in the usual TRPO/PPO
implementations, drawn by :func:`orthogonal` from a seeded :class:`numpy.random.Generator`
(the algorithm of ``torch.nn.init.orthogonal_``: a standard normal matrix, its QR
decomposition, Q with its columns' signs set by R's diagonal). Layers are drawn in order,
input side first, each as the ``[out, in]`` matrix torch would fill, then transposed. The
same generator state gives the same weights on every machine up to the last bits of the QR
(LAPACK), so a network is reproducible given the seed, not bit-identical to torch's draw.
"""

from __future__ import annotations

import math

import numpy as np

from ccpo.learning.mlp import Layer, NumpyMLP
from ccpo.traces.schema import ACTIONS

__all__ = [
    "ACTIONS",
    "BASE",
    "GUIDE",
    "NEXT",
    "N_ACTIONS",
    "NumpyMLP",
    "orthogonal",
    "policy_net",
    "value_net",
]

BASE, GUIDE, NEXT = 0, 1, 2
N_ACTIONS = len(ACTIONS)


def orthogonal(rng: np.random.Generator, n_out: int, n_in: int, gain: float) -> np.ndarray:
    """A ``[n_out, n_in]`` matrix with orthonormal rows or columns (whichever are fewer) times
    ``gain``: QR of a standard normal draw, signs fixed by R's diagonal so that the result is
    distributed uniformly (Haar) over such matrices."""
    flat = rng.standard_normal((n_out, n_in))
    if n_out < n_in:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q *= np.sign(np.diag(r))
    if n_out < n_in:
        q = q.T
    return gain * q


def _mlp(
    obs_dim: int, hidden: int, layers: int, out_dim: int, head_gain: float, rng: np.random.Generator
) -> NumpyMLP:
    if obs_dim < 1 or hidden < 1 or layers < 1:
        raise ValueError(
            f"obs_dim, hidden and layers must be >= 1, got {obs_dim}, {hidden}, {layers}"
        )
    body: list[Layer] = []
    width = obs_dim
    for _ in range(layers):
        body.append((orthogonal(rng, hidden, width, math.sqrt(2)).T, np.zeros(hidden), "tanh"))
        width = hidden
    body.append((orthogonal(rng, out_dim, width, head_gain).T, np.zeros(out_dim), None))
    return NumpyMLP(body)


def policy_net(
    obs_dim: int, rng: np.random.Generator, hidden: int = 64, layers: int = 3
) -> NumpyMLP:
    """π(·|o): observation ``[..., obs_dim]`` → logits ``[..., 3]`` over (base, guide, next),
    initial weights drawn from ``rng`` (head gain 0.01: close to uniform)."""
    return _mlp(obs_dim, hidden, layers, N_ACTIONS, 0.01, rng)


def value_net(
    obs_dim: int, rng: np.random.Generator, hidden: int = 64, layers: int = 3
) -> NumpyMLP:
    """V(o): observation ``[..., obs_dim]`` → ``[..., 1]`` (V_θ and V_{C,φ}), initial weights
    drawn from ``rng``."""
    return _mlp(obs_dim, hidden, layers, 1, 1.0, rng)
