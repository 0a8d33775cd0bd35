"""A float64 numpy multilayer perceptron: forward pass and its derivatives.

:class:`NumpyMLP` is the network of every evaluation and live decision (the policy folder's
weights are read as arrays, :mod:`ccpo.learning.weights`) and of the training loop (reverse-
and forward-mode derivatives, the output Gram matrix). :mod:`ccpo.learning.nets` draws its
initial weights; :meth:`NumpyMLP.state_dict` names them as a torch ``state_dict`` would, the
layout of policy folders (old ``weights.pt`` files included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

import numpy as np

__all__ = ["ACTIVATIONS", "Layer", "NumpyMLP"]

ACTIVATIONS = ("tanh", "relu")
Layer = tuple[np.ndarray, np.ndarray, str | None]
"""(W ``[in, out]``, b ``[out]``, the activation after the layer: "tanh", "relu" or None)."""


class NumpyMLP:
    """A float64 numpy MLP with one flat parameter vector: forward, reverse- and forward-mode
    derivatives.

    The training loop runs on these (the networks are tiny: for a batch of ~40 states a deep
    learning framework's per-operator dispatch costs more than the arithmetic), and every
    evaluation and live decision uses one through :func:`ccpo.learning.heads.policy_probs`.

    ``theta`` holds, layer by layer, W (``[in, out]``, row-major) then b; ``self.layers`` holds
    views into it, so writing ``theta[:] = ...`` changes the network.
    """

    def __init__(self, body: Sequence[Layer], theta: np.ndarray | None = None) -> None:
        """``body``: the layers as :data:`Layer` tuples (copied). ``theta``: optional float64
        1-D buffer of exactly :attr:`size` elements to live in (e.g. a slice of one vector
        holding several networks, for one optimizer)."""
        for w, b, act in body:
            if w.ndim != 2 or b.shape != (w.shape[1],) or act not in (*ACTIVATIONS, None):
                raise ValueError(
                    f"a layer must be W [in, out], b [out] and one of {ACTIVATIONS} or None, "
                    f"got W {w.shape}, b {b.shape}, {act!r}"
                )
        sizes = [w.shape for w, _, _ in body]
        for (_, o), (i, _) in pairwise(sizes):
            if o != i:
                raise ValueError(f"layer widths do not chain: {sizes}")
        n_params = sum(i * o + o for i, o in sizes)
        if theta is None:
            theta = np.zeros(n_params)
        elif theta.shape != (n_params,) or theta.dtype != np.float64:
            raise ValueError(f"theta must be a float64 buffer of shape ({n_params},)")
        self.theta = theta
        self.layers: list[Layer] = []
        offset = 0
        for (w_in, b_in, act), (i, o) in zip(body, sizes, strict=True):
            w = self.theta[offset : offset + i * o].reshape(i, o)
            b = self.theta[offset + i * o : offset + i * o + o]
            w[...], b[...] = w_in, b_in
            self.layers.append((w, b, act))
            offset += i * o + o
        self.in_dim = sizes[0][0]
        self.out_dim = sizes[-1][1]

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, np.ndarray], prefix: str = "body.", activation: str = "tanh"
    ) -> NumpyMLP:
        """The network whose torch-style ``state_dict`` is ``state`` (arrays, e.g. from
        :func:`ccpo.learning.weights.read_weights`): the Linear layers ``{prefix}{i}.weight``
        (``[out, in]``) and ``.bias`` in module order, ``activation`` after every layer but the
        last (the layout :mod:`ccpo.learning.nets` builds). Raises ValueError on other keys."""
        found: dict[int, dict[str, np.ndarray]] = {}
        for key, value in state.items():
            index, _, kind = key.removeprefix(prefix).partition(".")
            if not key.startswith(prefix) or not index.isdigit() or kind not in ("weight", "bias"):
                raise ValueError(f"unexpected parameter {key!r} (expected {prefix}<i>.weight/bias)")
            found.setdefault(int(index), {})[kind] = np.asarray(value, dtype=np.float64)
        if not found or any(set(p) != {"weight", "bias"} for p in found.values()):
            raise ValueError("every layer needs a weight and a bias")
        order = sorted(found)
        return cls(
            [
                (found[i]["weight"].T, found[i]["bias"], None if i == order[-1] else activation)
                for i in order
            ]
        )

    def state_dict(self, prefix: str = "body.") -> dict[str, np.ndarray]:
        """The inverse of :meth:`from_state_dict`: torch's names and layouts (W as
        ``[out, in]``), module indices counting one module per activation."""
        out: dict[str, np.ndarray] = {}
        index = 0
        for w, b, act in self.layers:
            out[f"{prefix}{index}.weight"], out[f"{prefix}{index}.bias"] = w.T.copy(), b.copy()
            index += 1 if act is None else 2
        return out

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
            term = (d @ d.T).reshape(n, o, n, o)
            term *= (h_in @ h_in.T + 1.0)[:, None, :, None]
            gram += term
            if k:  # one (N·O × width) GEMM, not N small ones
                delta = (d @ w.T).reshape(n, o, -1)
        return gram.reshape(n * o, n * o)
