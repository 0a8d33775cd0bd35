"""Tests for ccpo.learning.nets (the networks and their numpy initialisation) and
ccpo.learning.mlp (forward pass and derivatives, checked by the complex step)."""

from __future__ import annotations

import numpy as np
import pytest

from ccpo.learning.heads import policy_probs
from ccpo.learning.nets import (
    ACTIONS,
    BASE,
    GUIDE,
    N_ACTIONS,
    NEXT,
    NumpyMLP,
    orthogonal,
    policy_net,
    value_net,
)

OBS_DIM = 9


def _obs(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(*shape, OBS_DIM))


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_action_indices_match_the_schema() -> None:
    assert ACTIONS == ("base", "guide", "next") and N_ACTIONS == 3
    assert (ACTIONS[BASE], ACTIONS[GUIDE], ACTIONS[NEXT]) == ("base", "guide", "next")


def test_shapes_and_architecture() -> None:
    pi, v = policy_net(OBS_DIM, _rng()), value_net(OBS_DIM, _rng())
    assert pi(_obs(5)).shape == (5, 3)
    assert pi(_obs(2, 4)).shape == (2, 4, 3)
    assert pi(_obs(1)[0]).shape == (3,)
    assert v(_obs(5)).shape == (5, 1)
    # 3 hidden layers of 64 (tanh), then the linear head
    for net, out in ((pi, 3), (v, 1)):
        assert [(w.shape, act) for w, _, act in net.layers] == [
            ((OBS_DIM, 64), "tanh"), ((64, 64), "tanh"), ((64, 64), "tanh"), ((64, out), None),
        ]  # fmt: skip
    assert len(policy_net(OBS_DIM, _rng(), hidden=8, layers=1).layers) == 2
    with pytest.raises(ValueError, match=r"\[N, 9\]"):
        pi.forward(np.zeros((5, OBS_DIM + 1)))
    with pytest.raises(ValueError, match="layers"):
        value_net(OBS_DIM, _rng(), layers=0)


def test_initial_weights_are_orthogonal_with_the_stated_gains_and_zero_biases() -> None:
    """Hidden layers: gain √2; the policy head 0.01 and the value head 1. Each layer as the
    [out, in] matrix has orthonormal rows or columns (whichever are fewer) times its gain."""
    for net, head_gain in ((policy_net(OBS_DIM, _rng(3)), 0.01), (value_net(OBS_DIM, _rng(3)), 1)):
        for k, (w, b, _) in enumerate(net.layers):
            gain = head_gain if k == len(net.layers) - 1 else np.sqrt(2)
            small = w.T @ w if w.shape[1] <= w.shape[0] else w @ w.T  # the fewer's Gram
            np.testing.assert_allclose(small, gain**2 * np.eye(len(small)), atol=1e-12)
            assert np.all(b == 0.0)


def test_orthogonal_is_uniform_over_signs_and_rotations() -> None:
    """Q's signs are fixed by R's diagonal (as torch.nn.init.orthogonal_ does): without that,
    numpy's QR (Householder) gives a first column biased towards one sign; with it, the
    entries of Q have mean 0 and variance 1/n, as for a Haar-random orthogonal matrix. 4000
    draws of 3 × 3: each entry's mean has s.e. √(1/3/4000) ≈ 0.0091, bound 5 s.e."""
    gen = _rng(7)
    draws = np.stack([orthogonal(gen, 3, 3, 1.0) for _ in range(4000)])
    assert np.all(np.abs(draws.mean(0)) < 5 * np.sqrt(1 / 3 / 4000))
    np.testing.assert_allclose((draws**2).mean(0), 1 / 3, atol=0.02)


def test_initial_policy_is_near_uniform() -> None:
    p = policy_probs(policy_net(OBS_DIM, _rng()), _obs(16, 4), np.zeros(OBS_DIM), np.ones(OBS_DIM))
    np.testing.assert_allclose(p[:, :-1], 1 / 3, atol=0.05)  # next masked at the last round
    np.testing.assert_allclose(p[:, -1, :2], 1 / 2, atol=0.05)


def test_deterministic_given_seed() -> None:
    a = [net(_obs(4)) for net in (policy_net(OBS_DIM, _rng(123)), value_net(OBS_DIM, _rng(9)))]
    b = [net(_obs(4)) for net in (policy_net(OBS_DIM, _rng(123)), value_net(OBS_DIM, _rng(9)))]
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.allclose(policy_net(OBS_DIM, _rng(124))(_obs(4)), a[0])


def _random_mlp(seed: int, sizes: tuple[int, ...], acts: tuple[str | None, ...]) -> NumpyMLP:
    rng = _rng(seed)
    return NumpyMLP(
        [
            (rng.normal(size=(i, o)) / np.sqrt(i), rng.normal(size=o) * 0.3, act)
            for i, o, act in zip(sizes[:-1], sizes[1:], acts, strict=True)
        ]
    )


def _reference_forward(theta: np.ndarray, mlp: NumpyMLP, x: np.ndarray) -> np.ndarray:
    """The network written out from its documented layout (per layer W [in, out] row-major,
    then b), in any dtype: complex θ gives the complex step."""
    h, offset = x.astype(theta.dtype), 0
    for w, _, act in mlp.layers:
        i, o = w.shape
        h = (
            h @ theta[offset : offset + i * o].reshape(i, o)
            + theta[offset + i * o : offset + i * o + o]
        )
        offset += i * o + o
        h = np.tanh(h) if act == "tanh" else h
    return h


def _jacobian(mlp: NumpyMLP, x: np.ndarray) -> np.ndarray:
    """∂ out / ∂θ ``[N, O, P]`` by the complex step (exact to rounding: no difference taken)."""
    h = 1e-30
    cols = []
    for p in range(mlp.size):
        theta = mlp.theta.astype(complex)
        theta[p] += 1j * h
        cols.append(_reference_forward(theta, mlp, x).imag / h)
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("out", [3, 1])
def test_numpy_mlp_vjp_and_jvp_match_the_complex_step(layers: int, out: int) -> None:
    """The trainer's derivatives: reverse mode (gradients), forward mode (Fisher products) and
    the output Gram matrix Z Zᵀ of the span conjugate gradient equal those of the Jacobian
    taken by the complex step on the network written out independently."""
    sizes = (5, *([7] * layers), out)
    mlp = _random_mlp(layers, sizes, ("tanh",) * layers + (None,))
    x = _rng(10 + layers).normal(size=(6, 5))
    out_, tape = mlp.forward(x)
    np.testing.assert_allclose(out_, _reference_forward(mlp.theta, mlp, x), rtol=1e-12, atol=1e-14)
    jac = _jacobian(mlp, x)
    assert jac.shape == (6, out, mlp.size)
    rng = _rng(layers)
    u = rng.normal(size=out_.shape)
    v = rng.normal(size=mlp.size)
    np.testing.assert_allclose(mlp.vjp(tape, u), np.einsum("no,nop->p", u, jac), rtol=1e-10)
    np.testing.assert_allclose(mlp.jvp(tape, v), jac @ v, rtol=1e-10, atol=1e-12)
    flat = jac.reshape(-1, jac.shape[2])  # rows in (n, o) order
    np.testing.assert_allclose(mlp.output_gram(tape), flat @ flat.T, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"\[N, 5\]"):
        mlp.forward(x[0])


def test_numpy_mlp_theta_is_the_network() -> None:
    net = policy_net(5, _rng(), hidden=8, layers=2)
    mlp = NumpyMLP(net.layers)
    x = _rng(2).normal(size=(3, 5))
    before = mlp(x)
    mlp.theta[:] = mlp.theta * 1.5  # writing θ changes the network (views, not copies)
    assert not np.allclose(mlp(x), before)
    np.testing.assert_array_equal(net(x), before)  # built from net's layers: a copy
    # a network can live in a slice of a shared buffer (one optimizer for several networks)
    buf = np.zeros(mlp.size + 4)
    shared = NumpyMLP(net.layers, buf[2 : 2 + mlp.size])
    np.testing.assert_array_equal(buf[2 : 2 + mlp.size], net.theta)
    buf[2 : 2 + mlp.size] *= 0.5
    assert np.allclose(shared.theta, 0.5 * net.theta)
    with pytest.raises(ValueError, match="theta must be"):
        NumpyMLP(net.layers, np.zeros(mlp.size + 1))


def test_state_dict_names_and_layouts_round_trip() -> None:
    """torch's names and layouts (W as [out, in], one module index per activation): what
    policy folders store, the old weights.pt included."""
    net = policy_net(5, _rng(), hidden=8, layers=2)
    state = net.state_dict()
    assert {k: v.shape for k, v in state.items()} == {
        "body.0.weight": (8, 5), "body.0.bias": (8,), "body.2.weight": (8, 8),
        "body.2.bias": (8,), "body.4.weight": (3, 8), "body.4.bias": (3,),
    }  # fmt: skip
    back = NumpyMLP.from_state_dict(state)
    np.testing.assert_array_equal(back.theta, net.theta)
    assert [act for _, _, act in back.layers] == ["tanh", "tanh", None]
    with pytest.raises(ValueError, match="unexpected parameter"):
        NumpyMLP.from_state_dict({**state, "extra": np.zeros(1)})


def test_policy_probs_is_the_masked_softmax_of_the_network() -> None:
    net = _random_mlp(4, (5, 16, 16, 3), ("tanh", "tanh", None))
    obs = _rng(1).normal(size=(9, 4, 5))
    mean, std = obs.reshape(-1, 5).mean(0), obs.reshape(-1, 5).std(0)
    p = policy_probs(net, obs, mean, std)
    z = _reference_forward(net.theta, net, (obs - mean) / std)
    allowed = np.ones((4, 3), dtype=bool)
    allowed[-1, NEXT] = False
    e = np.where(allowed, np.exp(z), 0.0)
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), rtol=1e-10, atol=1e-12)
    assert np.all(p[:, -1, NEXT] == 0.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    assert np.ptp(p) > 0.3  # far from uniform: a real comparison
    with pytest.raises(ValueError, match="obs must have shape"):
        policy_probs(net, obs[..., :4], mean[:4], std[:4])


def test_policy_probs_of_a_question_do_not_depend_on_its_batch() -> None:
    """Replay scores every question in one batch [N, T, F] (κ̂ is one of those scores); live,
    ``decide`` scores a question alone ([T, F]). Bit for bit equal, so a question whose π is
    exactly κ̂ gets the same action set both ways (BLAS can round a row by its place in
    a batch: test_stopping's batch test found it for a matrix-vector product)."""
    from ccpo.traces.featurize import N_FEATURES

    mlp = policy_net(N_FEATURES, _rng())
    mlp.theta[:] = _rng(1).normal(0.0, 0.5, size=mlp.size)  # away from the tiny head init
    rng = _rng(0)
    mean, std = rng.normal(size=N_FEATURES), rng.uniform(0.5, 2.0, N_FEATURES)
    for n, T in ((257, 4), (500, 3), (33, 6)):
        obs = rng.normal(size=(n, T, N_FEATURES)).astype(np.float32)
        batch = policy_probs(mlp, obs, mean, std)
        for i in range(0, n, 7):
            np.testing.assert_array_equal(policy_probs(mlp, obs[i], mean, std), batch[i])
