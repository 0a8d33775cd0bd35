"""Tests for ccpo.learning.nets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ccpo.learning.nets import (
    ACTIONS,
    BASE,
    GUIDE,
    N_ACTIONS,
    NEXT,
    NumpyMLP,
    PolicyNet,
    ValueNet,
    masked_log_probs,
    masked_probs,
)

OBS_DIM = 9


def _obs(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, OBS_DIM, generator=torch.Generator().manual_seed(seed))


def test_action_indices_match_the_schema() -> None:
    assert ACTIONS == ("base", "guide", "next") and N_ACTIONS == 3
    assert (ACTIONS[BASE], ACTIONS[GUIDE], ACTIONS[NEXT]) == ("base", "guide", "next")


def test_shapes_and_architecture() -> None:
    torch.manual_seed(0)
    pi, v = PolicyNet(OBS_DIM), ValueNet(OBS_DIM)
    assert pi(_obs(5)).shape == (5, 3)
    assert pi(_obs(2, 4)).shape == (2, 4, 3)
    assert pi(_obs(1)[0]).shape == (3,)
    assert v(_obs(5)).shape == (5,)
    assert v(_obs(2, 4)).shape == (2, 4)
    # 3 hidden layers of 64, then the head.
    for net, out in ((pi, 3), (v, 1)):
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        assert [(m.in_features, m.out_features) for m in linears] == [
            (OBS_DIM, 64), (64, 64), (64, 64), (64, out),
        ]  # fmt: skip
    small = PolicyNet(OBS_DIM, hidden=8, layers=1)
    assert len([m for m in small.modules() if isinstance(m, nn.Linear)]) == 2
    with pytest.raises(ValueError, match="obs must have shape"):
        pi(torch.zeros(5, OBS_DIM + 1))
    with pytest.raises(ValueError, match="layers"):
        ValueNet(OBS_DIM, layers=0)


def test_initial_policy_is_near_uniform() -> None:
    torch.manual_seed(0)
    p = PolicyNet(OBS_DIM).probs(_obs(16))
    assert torch.allclose(p, torch.full_like(p, 1 / 3), atol=0.05)


def test_deterministic_given_seed() -> None:
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        pi, v = PolicyNet(OBS_DIM), ValueNet(OBS_DIM)
        outs.append((pi(_obs(4)), v(_obs(4))))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    torch.manual_seed(124)
    assert not torch.equal(PolicyNet(OBS_DIM)(_obs(4)), outs[0][0])


def test_masked_probs_exact_zeros_and_normalised() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 3) * 5
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[::2, NEXT] = False  # round T: 'next' unavailable
    mask[1, BASE] = False
    p = masked_probs(logits, mask)
    assert torch.all(p[~mask] == 0.0)
    assert torch.all(p[mask] > 0)
    torch.testing.assert_close(p.sum(-1), torch.ones(6))
    # Allowed actions keep their relative odds.
    row = p[0, :2] / p[0, :2].sum()
    torch.testing.assert_close(row, torch.softmax(logits[0, :2], -1))
    # A mask broadcast over the batch.
    q = masked_probs(logits, torch.tensor([True, True, False]))
    assert torch.all(q[:, NEXT] == 0.0)
    torch.testing.assert_close(q.sum(-1), torch.ones(6))
    # Extreme logits: still exact zeros and no NaN.
    big = torch.tensor([[1e4, -1e4, 1e4]])
    assert torch.equal(
        masked_probs(big, torch.tensor([[False, True, True]]))[0, 0], torch.tensor(0.0)
    )


def test_masked_log_probs_and_gradients() -> None:
    logits = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
    mask = torch.tensor([True, True, False])
    logp = masked_log_probs(logits, mask)
    assert torch.all(torch.isneginf(logp[:, NEXT]))
    torch.testing.assert_close(logp[:, :2].exp(), masked_probs(logits, mask)[:, :2])
    masked_probs(logits, mask)[:, BASE].sum().backward()
    assert torch.all(torch.isfinite(logits.grad))
    assert torch.all(logits.grad[:, NEXT] == 0.0)


def test_policy_probs_with_mask() -> None:
    torch.manual_seed(0)
    pi = PolicyNet(OBS_DIM)
    p = pi.probs(_obs(3), torch.tensor([True, True, False]))
    assert torch.all(p[:, NEXT] == 0.0)
    torch.testing.assert_close(p.sum(-1), torch.ones(3))


def test_bad_masks_raise() -> None:
    logits = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="at least one"):
        masked_probs(logits, torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(ValueError, match="boolean"):
        masked_probs(logits, torch.ones(2, 3))
    with pytest.raises(ValueError, match="broadcast"):
        masked_probs(logits, torch.ones(2, 4, dtype=torch.bool))


def _jacrev(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """∂ net(x) / ∂θ ``[N, O, P]`` by torch.func.jacrev, θ in NumpyMLP's flat order (per layer
    W as [in, out] row-major, then b)."""
    params = dict(net.body.named_parameters())
    jac = torch.func.jacrev(lambda p: torch.func.functional_call(net.body, p, (x,)))(params)
    blocks = []
    for name in params:
        j = jac[name]
        if name.endswith("weight"):  # torch's [out, in] → [in, out]
            j = j.transpose(-1, -2)
        blocks.append(j.reshape(*j.shape[:2], -1))
    out = torch.cat(blocks, dim=2)
    return out if out.ndim == 3 else out[:, None, :]


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("kind", ["policy", "value"])
def test_numpy_mlp_vjp_and_jvp_match_jacrev(layers: int, kind: str) -> None:
    """The trainer's derivatives: reverse mode (gradients) and forward mode (Fisher products)
    of the numpy MLP equal torch.func.jacrev of the torch network with the same weights, and
    so does the output Gram matrix Z Zᵀ of the span conjugate gradient."""
    torch.manual_seed(layers)
    net = (PolicyNet if kind == "policy" else ValueNet)(5, hidden=7, layers=layers).double()
    x = torch.randn(6, 5, dtype=torch.float64)
    mlp = NumpyMLP(net.body)
    jac = _jacrev(net, x).detach().numpy()  # [N, O, P]
    out, tape = mlp.forward(x.numpy())
    np.testing.assert_allclose(out, net.body(x).detach().numpy(), rtol=1e-12, atol=1e-14)
    assert jac.shape[2] == mlp.size == sum(p.numel() for p in net.parameters())
    rng = np.random.default_rng(layers)
    u = rng.normal(size=out.shape)
    v = rng.normal(size=mlp.size)
    np.testing.assert_allclose(mlp.vjp(tape, u), np.einsum("no,nop->p", u, jac), rtol=1e-10)
    np.testing.assert_allclose(mlp.jvp(tape, v), jac @ v, rtol=1e-10, atol=1e-12)
    flat = jac.reshape(-1, jac.shape[2])  # rows in (n, o) order
    np.testing.assert_allclose(mlp.output_gram(tape), flat @ flat.T, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"\[N, 5\]"):
        mlp.forward(x[0].numpy())


def test_numpy_mlp_theta_is_the_network_and_copies_back() -> None:
    torch.manual_seed(0)
    net = PolicyNet(5, hidden=8, layers=2)
    mlp = NumpyMLP(net.body)
    x = np.random.default_rng(2).normal(size=(3, 5))
    before = mlp(x)
    mlp.theta[:] = mlp.theta * 1.5  # writing θ changes the network (views, not copies)
    assert not np.allclose(mlp(x), before)
    # a network can live in a slice of a shared buffer (one optimizer for several networks)
    buf = np.zeros(mlp.size + 4)
    shared = NumpyMLP(net.body, buf[2 : 2 + mlp.size])
    np.testing.assert_array_equal(buf[2 : 2 + mlp.size], NumpyMLP(net.body).theta)
    buf[2 : 2 + mlp.size] *= 0.5
    assert np.allclose(shared.theta, 0.5 * NumpyMLP(net.body).theta)
    with pytest.raises(ValueError, match="theta must be"):
        NumpyMLP(net.body, np.zeros(mlp.size + 1))
    mlp.copy_to(net.body)
    with torch.no_grad():
        np.testing.assert_allclose(
            net(torch.as_tensor(x, dtype=torch.float32)).numpy(), mlp(x), rtol=1e-5, atol=1e-6
        )


def test_numpy_mlp_matches_torch_forward() -> None:
    """The float64 numpy forward used for every evaluation and live decision equals the torch
    network on the same weights, for any leading shape."""
    torch.manual_seed(3)
    net = PolicyNet(5, hidden=16, layers=3)
    x = np.random.default_rng(0).normal(size=(7, 4, 5))
    with torch.no_grad():
        want = net.double()(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(NumpyMLP(net.body)(x), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="supports"):
        NumpyMLP(nn.Sequential(nn.Linear(5, 3), nn.Softmax(-1)))


def test_policy_probs_numpy_equals_torch_masked_probs() -> None:
    from ccpo.learning.heads import policy_probs

    torch.manual_seed(4)
    net = PolicyNet(5)
    obs = np.random.default_rng(1).normal(size=(9, 4, 5))
    mean, std = obs.reshape(-1, 5).mean(0), obs.reshape(-1, 5).std(0)
    p = policy_probs(net, obs, mean, std)
    allowed = torch.ones(4, 3, dtype=torch.bool)
    allowed[-1, NEXT] = False
    with torch.no_grad():
        want = masked_probs(net.double()(torch.as_tensor((obs - mean) / std)), allowed).numpy()
    np.testing.assert_allclose(p, want, rtol=1e-10, atol=1e-12)
    assert np.all(p[:, -1, NEXT] == 0.0)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    with pytest.raises(ValueError, match="obs must have shape"):
        policy_probs(net, obs[..., :4], mean[:4], std[:4])


def test_policy_probs_of_a_question_do_not_depend_on_its_batch() -> None:
    """Replay scores every question in one batch [N, T, F] (κ̂ is one of those scores); live,
    ``decide`` scores a question alone ([T, F]). Bit for bit equal, so a question whose π is
    exactly κ̂ gets the same action set both ways (BLAS can round a row by its place in
    a batch: test_stopping's batch test found it for a matrix-vector product)."""
    from ccpo.learning.heads import policy_probs
    from ccpo.traces.featurize import N_FEATURES

    torch.manual_seed(0)
    net = PolicyNet(N_FEATURES)
    for p in net.parameters():  # away from the tiny head init, so rounding shows
        p.data.normal_(0.0, 0.5)
    mlp = NumpyMLP(net.body)
    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=N_FEATURES), rng.uniform(0.5, 2.0, N_FEATURES)
    for n, T in ((257, 4), (500, 3), (33, 6)):
        obs = rng.normal(size=(n, T, N_FEATURES)).astype(np.float32)
        batch = policy_probs(mlp, obs, mean, std)
        for i in range(0, n, 7):
            np.testing.assert_array_equal(policy_probs(mlp, obs[i], mean, std), batch[i])
