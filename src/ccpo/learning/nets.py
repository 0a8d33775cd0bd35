"""Policy and critic networks (the paper: three layers of 64 units, trained from scratch, CPU).

- :class:`PolicyNet` maps an observation o_t to logits over the three actions
  ``ACTIONS = ("base", "guide", "next")`` (indices 0, 1, 2); :func:`masked_probs` turns logits
  into π(·|o) with exact zeros on unavailable actions (``next`` at round T).
- :class:`ValueNet` maps o_t to a scalar; used for both the value critic V_θ and the constraint
  critic V_{C,φ}.

"3 layers × 64" is read as three hidden layers of width 64 (tanh), followed by a linear output
layer. Initialisation is orthogonal (hidden gain √2; policy head gain 0.01, so the initial
policy is close to uniform; value head gain 1) with zero biases, as in the usual TRPO/PPO
implementations; it is deterministic given ``torch.manual_seed``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ccpo.traces.schema import ACTIONS

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


class NumpyMLP:
    """A float64 numpy MLP with one flat parameter vector: forward, reverse- and forward-mode
    derivatives. Made from a ``body`` of :class:`~torch.nn.Linear`, Tanh and ReLU (what this
    module builds); :meth:`copy_to` writes the parameters back into it.

    The training loop runs on these (the networks are tiny: for a batch of ~40 states torch's
    per-operator dispatch cost more than the arithmetic), and every evaluation and live decision
    uses one through :func:`ccpo.learning.trainers.policy_probs`.

    ``theta`` holds, layer by layer, W (``[in, out]``, row-major) then b; ``self.layers`` holds
    views into it, so writing ``theta[:] = ...`` changes the network.
    """

    def __init__(self, body: nn.Sequential, theta: np.ndarray | None = None) -> None:
        """``theta``: optional float64 1-D buffer of exactly :attr:`size` elements to live in
        (e.g. a slice of one vector holding several networks, for one optimizer)."""
        spec: list[tuple[nn.Linear, str | None]] = []
        for module in body:
            if isinstance(module, nn.Linear):
                spec.append((module, None))
            elif isinstance(module, (nn.Tanh, nn.ReLU)) and spec and spec[-1][1] is None:
                spec[-1] = (spec[-1][0], "tanh" if isinstance(module, nn.Tanh) else "relu")
            else:
                raise TypeError(f"NumpyMLP supports Linear, Tanh and ReLU, not {module}")
        sizes = [(lin.in_features, lin.out_features) for lin, _ in spec]
        n_params = sum(i * o + o for i, o in sizes)
        if theta is None:
            theta = np.zeros(n_params)
        elif theta.shape != (n_params,) or theta.dtype != np.float64:
            raise ValueError(f"theta must be a float64 buffer of shape ({n_params},)")
        self.theta = theta
        self.layers: list[tuple[np.ndarray, np.ndarray, str | None]] = []
        offset = 0
        for (lin, act), (i, o) in zip(spec, sizes, strict=True):
            w = self.theta[offset : offset + i * o].reshape(i, o)
            b = self.theta[offset + i * o : offset + i * o + o]
            w[...] = lin.weight.detach().double().numpy().T
            if lin.bias is not None:
                b[...] = lin.bias.detach().double().numpy()
            self.layers.append((w, b, act))
            offset += i * o + o
        self.in_dim = sizes[0][0]
        self.out_dim = sizes[-1][1]

    @property
    def size(self) -> int:
        return int(self.theta.size)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Outputs ``[..., out]`` for inputs ``[..., in]``."""
        h = np.asarray(x, dtype=np.float64)
        for w, b, act in self.layers:
            h = h @ w + b
            if act == "tanh":
                h = np.tanh(h)
            elif act == "relu":
                h = np.maximum(h, 0.0)
        return h

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Outputs ``[N, out]`` for inputs ``[N, in]`` and the tape :meth:`vjp` and :meth:`jvp`
        need: per layer its input h and the activation's derivative at its pre-activation."""
        h = np.asarray(x, dtype=np.float64)
        if h.ndim != 2 or h.shape[1] != self.in_dim:
            raise ValueError(f"x must be [N, {self.in_dim}], got shape {h.shape}")
        tape = []
        for w, b, act in self.layers:
            h_in = h
            h = h @ w + b
            if act == "tanh":
                h = np.tanh(h)
                tape.append((h_in, 1.0 - h * h))
            elif act == "relu":
                tape.append((h_in, (h > 0).astype(np.float64)))
                h = np.maximum(h, 0.0)
            else:
                tape.append((h_in, None))
        return h, tape

    def vjp(
        self,
        tape: list[tuple[np.ndarray, np.ndarray]],
        grad_out: np.ndarray,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Reverse mode: (∂ out / ∂θ)ᵀ grad_out summed over the N rows, a flat ``[P]`` (written
        into ``out`` when given)."""
        grad = np.empty_like(self.theta) if out is None else out
        offset = self.theta.size
        g = grad_out
        for k in range(len(self.layers) - 1, -1, -1):
            w, _, _ = self.layers[k]
            h_in, deriv = tape[k]
            if deriv is not None:
                g = g * deriv
            i, o = w.shape
            offset -= i * o + o
            np.matmul(h_in.T, g, out=grad[offset : offset + i * o].reshape(i, o))
            np.sum(g, axis=0, out=grad[offset + i * o : offset + i * o + o])
            if k:
                g = g @ w.T
        return grad

    def jvp(self, tape: list[tuple[np.ndarray, np.ndarray]], v: np.ndarray) -> np.ndarray:
        """Forward mode: (∂ out / ∂θ) v for a flat ``v`` ``[P]``, per row ``[N, out]``."""
        dh = None
        offset = 0
        for (w, _, _), (h_in, deriv) in zip(self.layers, tape, strict=True):
            i, o = w.shape
            dz = (
                h_in @ v[offset : offset + i * o].reshape(i, o)
                + v[offset + i * o : offset + i * o + o]
            )
            if dh is not None:
                dz += dh @ w
            dh = dz if deriv is None else dz * deriv
            offset += i * o + o
        return dh

    def output_gram(self, tape: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """K = Z Zᵀ ``[N·O, N·O]`` (rows in (n, o) order) for the Jacobian Z = ∂ out / ∂θ
        ``[N·O, P]`` at the taped inputs (the empirical neural tangent kernel), without forming
        Z: for z_l = h_{l−1} W_l + b_l, ∂out_o(n)/∂W_l = h_{l−1}(n) ⊗ δ_l(n, o) and
        ∂out_o(n)/∂b_l = δ_l(n, o), with δ_l(n, o) = ∂out_o(n)/∂z_l(n), so

            K[(n, o), (m, o')] = Σ_l (h_{l−1}(n)·h_{l−1}(m) + 1) (δ_l(n, o)·δ_l(m, o')).
        """
        n, o = tape[0][0].shape[0], self.out_dim
        delta = np.broadcast_to(np.eye(o), (n, o, o))  # ∂out/∂(last layer's output)
        gram = np.zeros((n, o, n, o))
        for k in range(len(self.layers) - 1, -1, -1):
            w, _, _ = self.layers[k]
            h_in, deriv = tape[k]
            if deriv is not None:
                delta = delta * deriv[:, None, :]
            d = delta.reshape(n * o, -1)
            gram += (d @ d.T).reshape(n, o, n, o) * (h_in @ h_in.T + 1.0)[:, None, :, None]
            if k:
                delta = delta @ w.T
        return gram.reshape(n * o, n * o)

    def copy_to(self, body: nn.Sequential) -> None:
        """Write the parameters into ``body`` (the torch network this was made from)."""
        linears = [m for m in body if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for lin, (w, b, _) in zip(linears, self.layers, strict=True):
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                if lin.bias is not None:
                    lin.bias.copy_(torch.from_numpy(b.copy()))
