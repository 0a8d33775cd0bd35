"""Policy and critic networks (the paper: three layers of 64 units, trained from scratch, CPU).

- :class:`PolicyNet` maps an observation o_t to logits over the three actions
  ``ACTIONS = ("base", "guide", "next")`` (indices 0, 1, 2); :func:`masked_probs` turns logits
  into π(·|o) with exact zeros on unavailable actions (``next`` at round T).
- :class:`ValueNet` maps o_t to a scalar; used for both the value critic V_θ and the constraint
  critic V_{C,φ}.
- :class:`~ccpo.learning.mlp.NumpyMLP` (re-exported here, with :func:`torch_layers`, which
  reads a network's layers as arrays for it) is the float64 numpy copy the training loop,
  every evaluation and every live decision run on.

"3 layers × 64" is read as three hidden layers of width 64 (tanh), followed by a linear output
layer. Initialisation is orthogonal (hidden gain √2; policy head gain 0.01, so the initial
policy is close to uniform; value head gain 1) with zero biases, as in the usual TRPO/PPO
implementations; it is deterministic given ``torch.manual_seed``.
"""

from __future__ import annotations

import math

from ccpo.errors import import_extra
from ccpo.learning.mlp import NumpyMLP, torch_layers
from ccpo.traces.schema import ACTIONS

#: PyTorch is the ``train`` extra: without it, training says which pip install brings it
torch = import_extra("torch", "train", "training CCPO and CPO")
nn = torch.nn

__all__ = [
    "ACTIONS",
    "BASE",
    "GUIDE",
    "NEXT",
    "N_ACTIONS",
    "NumpyMLP",
    "PolicyNet",
    "ValueNet",
    "masked_log_probs",
    "masked_probs",
    "torch_layers",
]

BASE, GUIDE, NEXT = 0, 1, 2
N_ACTIONS = len(ACTIONS)


def _mlp(obs_dim: int, hidden: int, layers: int, out_dim: int, head_gain: float) -> nn.Sequential:
    if obs_dim < 1 or hidden < 1 or layers < 1:
        raise ValueError(
            f"obs_dim, hidden and layers must be >= 1, got {obs_dim}, {hidden}, {layers}"
        )
    mods: list[nn.Module] = []
    width = obs_dim
    for _ in range(layers):
        lin = nn.Linear(width, hidden)
        nn.init.orthogonal_(lin.weight, gain=math.sqrt(2))
        nn.init.zeros_(lin.bias)
        mods += [lin, nn.Tanh()]
        width = hidden
    head = nn.Linear(width, out_dim)
    nn.init.orthogonal_(head.weight, gain=head_gain)
    nn.init.zeros_(head.bias)
    mods.append(head)
    return nn.Sequential(*mods)


def _check_obs(obs: torch.Tensor, obs_dim: int) -> None:
    if obs.ndim < 1 or obs.shape[-1] != obs_dim:
        raise ValueError(f"obs must have shape [..., {obs_dim}], got {tuple(obs.shape)}")


class PolicyNet(nn.Module):
    """π(·|o): observation ``[..., obs_dim]`` → logits ``[..., 3]`` over (base, guide, next)."""

    def __init__(self, obs_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.body = _mlp(obs_dim, hidden, layers, N_ACTIONS, head_gain=0.01)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_obs(obs, self.obs_dim)
        return self.body(obs)

    def probs(self, obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """π(·|o) ``[..., 3]``; masked actions get exactly 0 (see :func:`masked_probs`)."""
        logits = self(obs)
        return torch.softmax(logits, dim=-1) if mask is None else masked_probs(logits, mask)


class ValueNet(nn.Module):
    """V(o): observation ``[..., obs_dim]`` → scalar ``[...]`` (V_θ and V_{C,φ})."""

    def __init__(self, obs_dim: int, hidden: int = 64, layers: int = 3) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.body = _mlp(obs_dim, hidden, layers, 1, head_gain=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        _check_obs(obs, self.obs_dim)
        return self.body(obs).squeeze(-1)


def _masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = torch.as_tensor(mask, device=logits.device)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be boolean (True = allowed), got {mask.dtype}")
    if mask.shape != logits.shape:
        try:
            mask = mask.expand(logits.shape)
        except RuntimeError as err:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to logits "
                f"{tuple(logits.shape)}"
            ) from err
    if not torch.all(mask.any(dim=-1)):
        raise ValueError("every row of mask must allow at least one action")
    return logits.masked_fill(~mask, float("-inf"))


def masked_probs(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the allowed actions only: masked entries are exactly 0, rows sum to 1.

    Args:
        logits: ``[..., A]``.
        mask: boolean, True = allowed, shape ``[..., A]`` or broadcastable to it
            (e.g. ``[A]``); every row must allow at least one action.

    Gradients flow only through the allowed logits.
    """
    return torch.softmax(_masked_logits(logits, mask), dim=-1)


def masked_log_probs(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log of :func:`masked_probs`: ``-inf`` exactly on masked actions.

    Beware 0·(−inf) = NaN when forming expectations such as a KL; weight with ``torch.where``.
    """
    return torch.log_softmax(_masked_logits(logits, mask), dim=-1)
