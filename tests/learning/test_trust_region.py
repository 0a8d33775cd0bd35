"""Golden tests for ccpo.learning.trust_region (CPO, Achiam et al. 2017).

The CPO step is checked against a generic solver (scipy SLSQP) and against the KKT conditions
of the objective-convention problem: maximise gᵀx s.t. c + bᵀx ≤ 0, ½xᵀHx ≤ δ.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from torch import nn
from torch.func import functional_call

from ccpo.learning.trust_region import (
    CASE_IDS,
    OBJECTIVE_CASES,
    backtracking_line_search,
    categorical_fisher_vector_product_fn,
    conjugate_gradient,
    cpo_step,
    fisher_vector_product,
    fisher_vector_product_fn,
    flat_grad,
    flat_params,
    set_flat_params,
)

DELTA = 0.01

# --------------------------------------------------------------------------- helpers


def _spd(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.normal(size=(n, n))
    return m @ m.T / n + 0.3 * np.eye(n)


def _solve_cpo(
    g: np.ndarray, b: np.ndarray, c: float, h: np.ndarray, delta: float = DELTA
) -> tuple[np.ndarray, object]:
    t = torch.as_tensor
    x, info = cpo_step(t(g), t(b), c, delta, t(np.linalg.solve(h, g)), t(np.linalg.solve(h, b)))
    return x.numpy(), info


def _slsqp_max(g: np.ndarray, b: np.ndarray, c: float, h: np.ndarray, delta: float) -> np.ndarray:
    """max gᵀx s.t. c + bᵀx ≤ 0, ½xᵀHx ≤ δ, by SLSQP (best of a few starts)."""
    cons = [
        {"type": "ineq", "fun": lambda x: -(c + b @ x), "jac": lambda x: -b},
        {"type": "ineq", "fun": lambda x: delta - 0.5 * x @ h @ x, "jac": lambda x: -h @ x},
    ]
    best = None
    rng = np.random.default_rng(0)
    for x0 in [np.zeros_like(g), *(0.01 * rng.normal(size=g.shape) for _ in range(3))]:
        res = minimize(
            lambda x: -g @ x, x0, jac=lambda x: -g, constraints=cons, method="SLSQP",
            options={"ftol": 1e-15, "maxiter": 2000},
        )  # fmt: skip
        feasible = c + b @ res.x <= 1e-9 and 0.5 * res.x @ h @ res.x <= delta * (1 + 1e-9)
        if feasible and (best is None or g @ res.x > g @ best):
            best = res.x
    assert best is not None, "SLSQP found no feasible point"
    return best


def _slsqp_min_constraint(b: np.ndarray, h: np.ndarray, delta: float) -> np.ndarray:
    """min bᵀx s.t. ½xᵀHx ≤ δ (the recovery step), by SLSQP."""
    cons = [{"type": "ineq", "fun": lambda x: delta - 0.5 * x @ h @ x, "jac": lambda x: -h @ x}]
    res = minimize(
        lambda x: b @ x, np.zeros_like(b), jac=lambda x: b, constraints=cons, method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 2000},
    )  # fmt: skip
    return res.x


def _check_kkt(
    x: np.ndarray, info, g: np.ndarray, b: np.ndarray, c: float, h: np.ndarray, delta: float
) -> None:
    """KKT of max gᵀx s.t. c + bᵀx ≤ 0 (ν), ½xᵀHx ≤ δ (λ)."""
    lam, nu = info.lam, info.nu
    scale = np.linalg.norm(g) + nu * np.linalg.norm(b)
    # Stationarity: g − νb − λHx = 0.
    np.testing.assert_allclose(g - nu * b - lam * h @ x, 0.0, atol=1e-9 * scale)
    # Primal feasibility.
    assert c + b @ x <= 1e-10
    assert 0.5 * x @ h @ x <= delta * (1 + 1e-10)
    # Dual feasibility.
    assert lam >= 0 and nu >= 0
    # Complementary slackness.
    assert abs(nu * (c + b @ x)) <= 1e-10
    assert abs(lam * (0.5 * x @ h @ x - delta)) <= 1e-10
    # Reported predictions match the explicit quadratic model.
    assert info.predicted_objective == pytest.approx(g @ x, rel=1e-9, abs=1e-12)
    assert info.predicted_constraint == pytest.approx(c + b @ x, rel=1e-9, abs=1e-12)
    assert info.predicted_kl == pytest.approx(0.5 * x @ h @ x, rel=1e-9, abs=1e-12)


def _problem(seed: int, kind: str) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, str]:
    """A random problem of the requested kind and the case cpo_step should report."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 9))
    h = _spd(rng, n)
    g = rng.normal(size=n)
    hinv = np.linalg.inv(h)
    q = g @ hinv @ g
    while True:
        if kind == "active":  # objective direction increases the constraint
            b = g + 0.7 * rng.normal(size=n)
        elif kind == "inactive":  # objective direction decreases the constraint
            b = -g + 0.7 * rng.normal(size=n)
        else:
            b = rng.normal(size=n)
        s = b @ hinv @ b
        r = g @ hinv @ b
        edge = np.sqrt(2 * DELTA * s)  # |c| at which B = 0
        trpo_violation = np.sqrt(2 * DELTA / q) * r  # bᵀ(TRPO step)
        if kind == "trpo":
            return g, b, -1.5 * edge, h, "trpo"
        if kind == "recovery":
            return g, b, 1.5 * edge, h, "infeasible_recovery"
        if kind == "infeasible_dual":
            return g, b, rng.uniform(0.1, 0.9) * edge, h, "infeasible_dual"
        c = -rng.uniform(0.1, 0.9) * edge
        if kind == "active" and c + trpo_violation > 0.01 * edge:
            return g, b, c, h, "feasible_dual"
        if kind == "inactive" and c + trpo_violation < -0.01 * edge:
            return g, b, c, h, "feasible_dual"


# --------------------------------------------------------------------------- CPO step


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", ["trpo", "active", "inactive", "infeasible_dual"])
def test_cpo_step_matches_slsqp_and_kkt(seed: int, kind: str) -> None:
    g, b, c, h, case = _problem(seed, kind)
    x, info = _solve_cpo(g, b, c, h)
    assert info.case == case and info.case_id == CASE_IDS[case]
    _check_kkt(x, info, g, b, c, h, DELTA)
    want = _slsqp_max(g, b, c, h, DELTA)
    np.testing.assert_allclose(x, want, atol=2e-6 * np.linalg.norm(want))
    assert g @ x >= g @ want - 1e-9
    if kind == "active":
        assert info.nu > 0 and c + b @ x == pytest.approx(0.0, abs=1e-10)
    if kind in ("inactive", "trpo"):
        trpo = np.sqrt(2 * DELTA / (g @ np.linalg.solve(h, g))) * np.linalg.solve(h, g)
        assert info.nu == 0.0
        np.testing.assert_allclose(x, trpo, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("seed", range(8))
def test_cpo_step_infeasible_recovery_minimises_constraint(seed: int) -> None:
    g, b, c, h, _ = _problem(seed, "recovery")
    x, info = _solve_cpo(g, b, c, h)
    assert info.case == "infeasible_recovery" and info.case_id == 0
    # The problem really is infeasible: the best point of the trust region violates.
    want = _slsqp_min_constraint(b, h, DELTA)
    assert c + b @ want > 0
    np.testing.assert_allclose(x, want, atol=2e-6 * np.linalg.norm(want))
    assert b @ x <= b @ want + 1e-10
    assert 0.5 * x @ h @ x == pytest.approx(DELTA, rel=1e-10)
    np.testing.assert_allclose(x, -info.nu * np.linalg.solve(h, b), rtol=1e-12)
    assert info.B < 0 and info.c > 0


@pytest.mark.parametrize("c", [-0.3, 0.0, 0.3])
def test_cpo_step_b_zero_is_trpo(c: float) -> None:
    rng = np.random.default_rng(42)
    h = _spd(rng, 5)
    g, b = rng.normal(size=5), 1e-6 * rng.normal(size=5)
    x, info = _solve_cpo(g, b, c, h)
    assert info.case == "b_zero" and info.case_id == 4
    xg = np.linalg.solve(h, g)
    np.testing.assert_allclose(x, np.sqrt(2 * DELTA / (g @ xg)) * xg, rtol=1e-12)
    assert 0.5 * x @ h @ x == pytest.approx(DELTA, rel=1e-10)
    assert info.nu == 0.0 and info.lam == pytest.approx(np.sqrt((g @ xg) / (2 * DELTA)))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("k", "c_frac"), [(2.0, -0.5), (2.0, 0.5), (-2.0, 0.5), (-2.0, -0.5)])
def test_cpo_step_b_parallel_to_g(seed: int, k: float, c_frac: float) -> None:
    """b = k g: A = 0. When the constraint binds, the optimum is not unique (any x on the
    boundary with the same gᵀx): compare objective values, feasibility and KKT."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 9))
    h = _spd(rng, n)
    g = rng.normal(size=n)
    b = k * g
    s = b @ np.linalg.solve(h, b)
    c = c_frac * np.sqrt(2 * DELTA * s)
    x, info = _solve_cpo(g, b, c, h)
    assert info.A == 0.0
    assert np.all(np.isfinite(x))
    _check_kkt(x, info, g, b, c, h, DELTA)
    want = _slsqp_max(g, b, c, h, DELTA)
    assert g @ x == pytest.approx(g @ want, rel=1e-6, abs=1e-9)
    if k > 0:  # the constraint binds; our x is the minimum-norm optimum, on the b direction
        assert c + b @ x == pytest.approx(0.0, abs=1e-12)
        xb = np.linalg.solve(h, b)
        np.testing.assert_allclose(x, -(c / s) * xb, rtol=1e-10)
    else:  # objective and constraint agree: the TRPO step
        xg = np.linalg.solve(h, g)
        np.testing.assert_allclose(x, np.sqrt(2 * DELTA / (g @ xg)) * xg, rtol=1e-8)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cpo_step_c_exactly_zero(sign: float) -> None:
    rng = np.random.default_rng(7)
    h = _spd(rng, 6)
    g = rng.normal(size=6)
    b = sign * g + 0.5 * rng.normal(size=6)  # r > 0 or r < 0
    x, info = _solve_cpo(g, b, 0.0, h)
    assert info.case == "infeasible_dual"
    _check_kkt(x, info, g, b, 0.0, h, DELTA)
    want = _slsqp_max(g, b, 0.0, h, DELTA)
    np.testing.assert_allclose(x, want, atol=2e-6 * np.linalg.norm(want))


def test_sign_of_r_regression() -> None:
    """A feasible problem where the loss-convention formula ν = (λc − r)/s, pasted into
    objective-convention code, gives a step that violates the constraint."""
    g, b, c, h, _ = _problem(3, "active")
    x, info = _solve_cpo(g, b, c, h)
    xg, xb = np.linalg.solve(h, g), np.linalg.solve(h, b)
    wrong_nu = max(0.0, (info.lam * c - info.r) / info.s)
    wrong_x = (xg - wrong_nu * xb) / info.lam
    assert c + b @ wrong_x > 1e-6  # the bug: infeasible
    assert c + b @ x <= 1e-10  # ours: feasible


def test_cpo_step_validates_inputs() -> None:
    z = torch.zeros(3)
    with pytest.raises(ValueError, match="Hinv_b"):
        cpo_step(z, z, 0.0, DELTA, z, torch.zeros(4))
    with pytest.raises(ValueError, match="delta"):
        cpo_step(z, z, 0.0, 0.0, z, z)


# --------------------------------------------------------------------------- CG


@pytest.mark.parametrize("seed", range(5))
def test_conjugate_gradient_matches_numpy_solve(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 20))
    a = _spd(rng, n)
    b = rng.normal(size=n)
    at = torch.as_tensor(a)
    x = conjugate_gradient(lambda v: at @ v, torch.as_tensor(b), iters=3 * n, residual_tol=1e-24)
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)


def test_conjugate_gradient_zero_rhs_and_iteration_cap() -> None:
    calls = []
    a = torch.eye(4, dtype=torch.float64) * 2

    def avp(v: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return a @ v

    assert torch.equal(
        conjugate_gradient(avp, torch.zeros(4, dtype=torch.float64)),
        torch.zeros(4, dtype=torch.float64),
    )
    assert not calls
    rng = np.random.default_rng(1)
    m = torch.as_tensor(_spd(rng, 12))
    conjugate_gradient(
        lambda v: (calls.append(1), m @ v)[1], torch.ones(12, dtype=torch.float64), iters=3
    )
    assert len(calls) == 3


# --------------------------------------------------------------------------- flat params, FVP


def _tiny_policy(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).double()


def test_flat_params_round_trip_and_errors() -> None:
    net = _tiny_policy(0)
    theta = flat_params(net)
    assert theta.shape == (sum(p.numel() for p in net.parameters()),)
    set_flat_params(net, theta + 1.0)
    torch.testing.assert_close(flat_params(net), theta + 1.0)
    set_flat_params(net, theta)
    assert torch.equal(flat_params(net), theta)
    theta[0] = 123.0  # a copy, not a view
    assert flat_params(net)[0] != 123.0
    with pytest.raises(ValueError, match="elements"):
        set_flat_params(net, torch.zeros(3, dtype=torch.float64))


def test_flat_grad_matches_autograd_and_zero_for_unused() -> None:
    net = _tiny_policy(0)
    unused = nn.Parameter(torch.ones(2, dtype=torch.float64))
    params = [*net.parameters(), unused]
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = net(x).pow(2).sum()
    grad = flat_grad(y, params)
    y2 = net(x).pow(2).sum()
    y2.backward()
    want = torch.cat(
        [p.grad.reshape(-1) for p in net.parameters()] + [torch.zeros(2, dtype=torch.float64)]
    )
    torch.testing.assert_close(grad, want)
    with pytest.raises(ValueError, match="scalar"):
        flat_grad(net(x), params)


def _kl_setup(seed: int) -> tuple[nn.Module, torch.Tensor, Callable[[], torch.Tensor]]:
    net = _tiny_policy(seed)
    states = torch.randn(7, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logp_old = torch.log_softmax(net(states), dim=-1)

    def kl_fn() -> torch.Tensor:  # mean KL(π_old ‖ π_θ)
        logp = torch.log_softmax(net(states), dim=-1)
        return (logp_old.exp() * (logp_old - logp)).sum(-1).mean()

    return net, states, kl_fn


@pytest.mark.parametrize("seed", [0, 1])
def test_fisher_vector_product_matches_explicit_hessian_and_fisher(seed: int) -> None:
    net, states, kl_fn = _kl_setup(seed)
    params = list(net.parameters())
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for p in params]
    theta = flat_params(net)

    def unflatten(flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, i = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            k = int(np.prod(shape))
            out[name] = flat[i : i + k].view(shape)
            i += k
        return out

    logp_old = torch.log_softmax(net(states), dim=-1).detach()

    def kl_of_flat(flat: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(functional_call(net, unflatten(flat), (states,)), dim=-1)
        return (logp_old.exp() * (logp_old - logp)).sum(-1).mean()

    hess = torch.autograd.functional.hessian(kl_of_flat, theta)
    # Explicit Fisher: E_s[Jᵀ (diag p − p pᵀ) J], J = ∂logits/∂θ.
    jac = torch.autograd.functional.jacobian(
        lambda f: functional_call(net, unflatten(f), (states,)), theta
    )  # [N, 3, P]
    p = logp_old.exp()
    fisher = torch.zeros_like(hess)
    for i in range(states.shape[0]):
        m = torch.diag(p[i]) - torch.outer(p[i], p[i])
        fisher += jac[i].T @ m @ jac[i]
    fisher /= states.shape[0]
    torch.testing.assert_close(hess, fisher, rtol=1e-9, atol=1e-12)

    damping = 0.1
    v = torch.randn(theta.numel(), dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    fvp = fisher_vector_product(kl_fn, params, v, damping)
    torch.testing.assert_close(fvp, fisher @ v + damping * v, rtol=1e-9, atol=1e-12)
    # CG on the FVP solves the damped Fisher system.
    x = conjugate_gradient(
        lambda u: fisher_vector_product(kl_fn, params, u, damping), v, iters=200, residual_tol=1e-28
    )
    eye = torch.eye(theta.numel(), dtype=torch.float64)
    torch.testing.assert_close(
        x, torch.linalg.solve(fisher + damping * eye, v), rtol=1e-6, atol=1e-8
    )


@pytest.mark.parametrize("trust", ["score", "target"])
@pytest.mark.parametrize("seed", [0, 1])
def test_jacobian_fisher_equals_double_backprop_on_masked_policies(trust: str, seed: int) -> None:
    """The one-Jacobian FVP (from a generic jacrev G, and as the trainer builds it by the chain
    rule through the logits) equals the Hessian-vector product of the mean KL by double
    backpropagation, for the masked score policy π and for the softmask S."""
    from ccpo.learning.nets import PolicyNet, masked_log_probs
    from ccpo.learning.trainers import _trust_region_fvp, target_log_probs

    torch.manual_seed(seed)
    net = PolicyNet(4, hidden=8, layers=2).double()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3, 4, dtype=torch.float64, generator=gen)  # [B, T, F]
    valid = torch.rand(5, 3, generator=gen) < 0.7
    valid[:, 0] = True
    allowed = torch.ones(3, 3, dtype=torch.bool)
    allowed[-1, 2] = False  # 'next' masked at the last round

    def log_q(logits: torch.Tensor, mask: torch.Tensor = allowed) -> torch.Tensor:
        if trust == "score":
            return masked_log_probs(logits, mask)
        return target_log_probs(logits, kappa=0.3, eps=0.05, method="ccpo", allowed=mask)

    with torch.no_grad():
        old = log_q(net(x))

    def kl() -> torch.Tensor:
        new = log_q(net(x))
        terms = torch.where(old.exp() > 0, old.exp() * (old - new), 0.0)
        return terms.sum(-1)[valid].mean()

    want_fn = fisher_vector_product_fn(kl(), list(net.parameters()), damping=0.1)
    jac = torch.func.jacrev(lambda p: log_q(functional_call(net, p, (x,)))[valid])(
        dict(net.named_parameters())
    )
    G = torch.cat([jac[name].flatten(2) for name, _ in net.named_parameters()], dim=2)
    generic_fn = categorical_fisher_vector_product_fn(G, old[valid].exp(), damping=0.1)
    trainer_fn = _trust_region_fvp(net, x, valid, log_q, damping=0.1)
    for _ in range(3):
        v = torch.randn(flat_params(net).numel(), dtype=torch.float64, generator=gen)
        want = want_fn(v)
        torch.testing.assert_close(generic_fn(v), want, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(trainer_fn(v), want, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="elements"):
        generic_fn(torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\[N, A, P\]"):
        categorical_fisher_vector_product_fn(G[0], old[valid].exp(), damping=0.1)


# --------------------------------------------------------------------------- line search


class _Point(nn.Module):
    def __init__(self, theta: list[float]) -> None:
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(theta, dtype=torch.float64))


def _evaluator(module: _Point, theta_old: torch.Tensor) -> Callable[[], tuple[float, float, float]]:
    """objective −‖θ − (2, 2)‖², constraint θ₀ − 1 (≤ 0 feasible), KL ½‖θ − θ_old‖²."""
    target = torch.tensor([2.0, 2.0], dtype=torch.float64)

    def evaluate() -> tuple[float, float, float]:
        th = module.theta.detach()
        return (
            float(-((th - target) ** 2).sum()),
            float(th[0] - 1.0),
            float(0.5 * ((th - theta_old) ** 2).sum()),
        )

    return evaluate


def test_line_search_backtracks_to_the_trust_region() -> None:
    mod = _Point([0.0, 0.0])
    old = flat_params(mod)
    evaluate = _evaluator(mod, old)
    obj0, con0, _ = evaluate()
    step = torch.tensor([0.0, 1.0], dtype=torch.float64)  # KL of the full step: 0.5
    res = backtracking_line_search(
        mod, step, evaluate, objective_old=obj0, constraint_old=con0, max_kl=0.1,
        check_objective=True, backtrack_coeff=0.5, max_backtracks=10,
    )  # fmt: skip
    # 0.5·f² ≤ 0.1 ⇔ f ≤ 0.447: f = 1, 0.5 rejected, 0.25 accepted.
    assert res.accepted and res.step_fraction == 0.25 and res.steps_tried == 3
    torch.testing.assert_close(flat_params(mod), old + 0.25 * step)
    assert res.kl == pytest.approx(0.5 * 0.25**2)
    assert res.objective > obj0 and res.constraint <= 0


def test_line_search_keeps_feasibility_and_allows_recovery() -> None:
    # Feasible start: a step crossing θ₀ = 1 is rejected until it stays feasible.
    mod = _Point([0.5, 0.0])
    evaluate = _evaluator(mod, flat_params(mod))
    obj0, con0, _ = evaluate()
    res = backtracking_line_search(
        mod, torch.tensor([1.0, 0.0], dtype=torch.float64), evaluate, objective_old=obj0,
        constraint_old=con0, max_kl=10.0, check_objective=True, backtrack_coeff=0.5,
    )  # fmt: skip
    assert res.accepted and res.step_fraction == 0.5 and res.constraint == pytest.approx(0.0)
    # Infeasible start, recovery step: the objective gets worse but is not checked.
    mod = _Point([1.5, 2.0])
    evaluate = _evaluator(mod, flat_params(mod))
    obj0, con0, _ = evaluate()
    res = backtracking_line_search(
        mod, torch.tensor([-0.2, 0.0], dtype=torch.float64), evaluate, objective_old=obj0,
        constraint_old=con0, max_kl=10.0, check_objective=False,
    )  # fmt: skip
    assert res.accepted and res.step_fraction == 1.0 and res.objective < obj0
    assert res.constraint < con0


def test_line_search_restores_theta_when_nothing_is_accepted() -> None:
    mod = _Point([0.3, -0.7])
    old = flat_params(mod)
    evaluate = _evaluator(mod, old)
    obj0, con0, _ = evaluate()
    step = torch.tensor([-1.0, -1.0], dtype=torch.float64)  # away from the target: worse
    res = backtracking_line_search(
        mod, step, evaluate, objective_old=obj0, constraint_old=con0, max_kl=1.0,
        check_objective=True, backtrack_coeff=0.8, max_backtracks=6,
    )  # fmt: skip
    assert not res.accepted and res.steps_tried == 7 and res.step_fraction == 0.0
    assert torch.equal(flat_params(mod), old)  # bit-for-bit
    assert (res.objective, res.constraint, res.kl) == (obj0, con0, 0.0)


def test_line_search_rejects_non_finite_and_bad_arguments() -> None:
    mod = _Point([0.0, 0.0])
    old = flat_params(mod)
    step = torch.ones(2, dtype=torch.float64)
    res = backtracking_line_search(
        mod, step, lambda: (float("nan"), -1.0, 0.0), objective_old=0.0, constraint_old=-1.0,
        max_kl=1.0, check_objective=False, max_backtracks=2,
    )  # fmt: skip
    assert not res.accepted and torch.equal(flat_params(mod), old)
    with pytest.raises(ValueError, match="step"):
        backtracking_line_search(
            mod, torch.ones(3), lambda: (0.0, 0.0, 0.0), objective_old=0.0, constraint_old=0.0,
            max_kl=1.0, check_objective=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match="backtrack_coeff"):
        backtracking_line_search(
            mod, step, lambda: (0.0, 0.0, 0.0), objective_old=0.0, constraint_old=0.0,
            max_kl=1.0, check_objective=True, backtrack_coeff=1.0,
        )  # fmt: skip


def test_objective_cases_are_the_feasible_ones() -> None:
    assert {"trpo", "feasible_dual", "b_zero"} == OBJECTIVE_CASES
    assert set(CASE_IDS) == {
        "trpo",
        "feasible_dual",
        "b_zero",
        "infeasible_dual",
        "infeasible_recovery",
    }


# --------------------------------------------------------------------------- end to end


def test_cpo_update_on_a_tiny_policy_respects_the_trust_region() -> None:
    """CG + FVP + cpo_step + line search on a categorical policy: the accepted step has a real
    KL ≤ δ and, for a feasible start, keeps the surrogate constraint feasible."""
    net, states, kl_fn = _kl_setup(3)
    params = list(net.parameters())
    gen = torch.Generator().manual_seed(3)
    actions = torch.randint(0, 3, (states.shape[0],), generator=gen)
    adv = torch.randn(states.shape[0], dtype=torch.float64, generator=gen)
    cadv = torch.randn(states.shape[0], dtype=torch.float64, generator=gen)
    with torch.no_grad():
        logp_old = torch.log_softmax(net(states), dim=-1)
    logp_old_a = logp_old.gather(1, actions[:, None])[:, 0]
    c0 = -0.02

    def surrogates() -> tuple[torch.Tensor, torch.Tensor]:
        ratio = torch.exp(
            torch.log_softmax(net(states), -1).gather(1, actions[:, None])[:, 0] - logp_old_a
        )
        return (ratio * adv).mean(), c0 + (ratio * cadv).mean() - cadv.mean()

    obj, con = surrogates()
    g = flat_grad(obj, params, retain_graph=True)
    b = flat_grad(con, params)

    def fvp(v: torch.Tensor) -> torch.Tensor:
        return fisher_vector_product(kl_fn, params, v, 1e-3)

    x, info = cpo_step(
        g, b, c0, DELTA, conjugate_gradient(fvp, g, 30), conjugate_gradient(fvp, b, 30)
    )

    def evaluate() -> tuple[float, float, float]:
        o, c = surrogates()
        return float(o), float(c), float(kl_fn())

    res = backtracking_line_search(
        net, x, evaluate, objective_old=float(obj.detach()), constraint_old=c0, max_kl=DELTA,
        check_objective=info.case in OBJECTIVE_CASES,
    )  # fmt: skip
    assert res.accepted
    assert res.kl <= DELTA and res.constraint <= 0.0 and res.objective >= float(obj.detach())
    # The quadratic model of the KL is close to the real KL for the full step.
    if res.step_fraction == 1.0:
        assert res.kl == pytest.approx(info.predicted_kl, rel=0.3)
