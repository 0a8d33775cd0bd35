"""Golden tests for ccpo.learning.trust_region (CPO, Achiam et al. 2017).

The CPO step is checked against a generic solver (scipy SLSQP) and against the KKT conditions
of the objective-convention problem: maximise gᵀx s.t. c + bᵀx ≤ 0, ½xᵀHx ≤ δ. The Fisher-vector
product is checked against the explicit Fisher matrix and against the Hessian of the mean KL
(by the complex step).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest
from scipy.optimize import minimize

from ccpo.learning.trust_region import (
    CASE_IDS,
    OBJECTIVE_CASES,
    backtracking_line_search,
    conjugate_gradient,
    cpo_step,
    logit_fisher_blocks,
    logit_fisher_vector_product_fn,
    span_conjugate_gradient,
)

DELTA = 0.01

# --------------------------------------------------------------------------- helpers


def _spd(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.normal(size=(n, n))
    return m @ m.T / n + 0.3 * np.eye(n)


def _solve_cpo(
    g: np.ndarray, b: np.ndarray, c: float, h: np.ndarray, delta: float = DELTA
) -> tuple[np.ndarray, object]:
    x, info = cpo_step(g, b, c, delta, np.linalg.solve(h, g), np.linalg.solve(h, b))
    assert isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == g.shape
    return x, info


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
    z = np.zeros(3)
    with pytest.raises(ValueError, match="Hinv_b"):
        cpo_step(z, z, 0.0, DELTA, z, np.zeros(4))
    with pytest.raises(ValueError, match="g must be 1-D"):
        cpo_step(np.zeros((3, 1)), z, 0.0, DELTA, z, z)
    with pytest.raises(ValueError, match="delta"):
        cpo_step(z, z, 0.0, 0.0, z, z)


def test_module_is_pure_numpy() -> None:
    code = (
        "import sys, ccpo.learning.trust_region; "
        "sys.exit(1 if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --------------------------------------------------------------------------- CG


@pytest.mark.parametrize("seed", range(5))
def test_conjugate_gradient_matches_numpy_solve(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 20))
    a = _spd(rng, n)
    b = rng.normal(size=n)
    x = conjugate_gradient(lambda v: a @ v, b, iters=3 * n, residual_tol=1e-24)
    assert x.dtype == np.float64 and x.shape == (n,)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)


def test_conjugate_gradient_zero_rhs_and_iteration_cap() -> None:
    calls = []
    a = np.eye(4) * 2

    def avp(v: np.ndarray) -> np.ndarray:
        calls.append(1)
        return a @ v

    assert np.array_equal(conjugate_gradient(avp, np.zeros(4)), np.zeros(4))
    assert not calls
    rng = np.random.default_rng(1)
    m = _spd(rng, 12)
    b = np.ones(12)
    conjugate_gradient(lambda v: (calls.append(1), m @ v)[1], b, iters=3)
    assert len(calls) == 3
    assert np.array_equal(b, np.ones(12))  # the right-hand side is not modified
    with pytest.raises(ValueError, match="1-D"):
        conjugate_gradient(avp, np.ones((4, 1)))


# --------------------------------------------------------------------------- Fisher


def _masked_softmax(z: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Softmax over the allowed actions of each row of z [N, A]; q = 0 exactly elsewhere."""
    z = np.where(allowed, z, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _softmax_log_q_jac(q: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """J_n = ∂ log q(·|s_n)/∂z_n = I − 1 q_nᵀ on the allowed rows (log q_a = z_a − logsumexp of
    the allowed z); the rows of masked actions get ±inf/nan, which must be ignored."""
    n_actions = q.shape[1]
    J = np.eye(n_actions)[None] - q[:, None, :]
    J[~allowed] = np.array([np.inf, np.nan, -np.inf, np.nan])[:n_actions]
    return J


def _explicit_fisher(Z: np.ndarray, J: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(1/N) Σ_n Σ_{a: q>0} q_a (J_n Z_n)_aᵀ (J_n Z_n)_a, term by term."""
    n_states, n_actions, n_params = Z.shape
    F = np.zeros((n_params, n_params))
    for n in range(n_states):
        for a in range(n_actions):
            if q[n, a] > 0:
                grad_log_q = J[n, a] @ Z[n]  # ∇_θ log q(a|s_n), [P]
                F += q[n, a] * np.outer(grad_log_q, grad_log_q)
    return F / n_states


def _dense_jvp_vjp(
    Z: np.ndarray,
) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    return (lambda v: Z @ v), (lambda u: np.einsum("nap,na->p", Z, u))


def _masked_problem(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Z [N, A, P], allowed [N, A] (last action masked in some states), q, J from a softmax."""
    rng = np.random.default_rng(seed)
    n_states, n_actions, n_params = 9, 3, 13
    Z = rng.normal(size=(n_states, n_actions, n_params))
    allowed = np.ones((n_states, n_actions), dtype=bool)
    allowed[::3, -1] = False
    q = _masked_softmax(rng.normal(size=(n_states, n_actions)), allowed)
    return Z, allowed, q, _softmax_log_q_jac(q, allowed)


@pytest.mark.parametrize("seed", [0, 1])
def test_logit_fisher_vector_product_equals_explicit_masked_fisher(seed: int) -> None:
    Z, allowed, q, J = _masked_problem(seed)
    n_states, _, n_params = Z.shape
    assert np.all(q[~allowed] == 0) and np.all(q[allowed] > 0)
    assert not np.all(np.isfinite(J))  # the masked rows really are poisoned
    J_in, q_in = J.copy(), q.copy()
    damping = 0.1
    fvp = logit_fisher_vector_product_fn(*_dense_jvp_vjp(Z), J, q, damping)
    fvp0 = logit_fisher_vector_product_fn(*_dense_jvp_vjp(Z), J, q, 0.0)
    np.testing.assert_array_equal(J, J_in)  # inputs untouched
    np.testing.assert_array_equal(q, q_in)
    F = _explicit_fisher(Z, J, q)
    # The softmax identity J_nᵀ diag(q_n) J_n = diag(q_n) − q_n q_nᵀ.
    F_softmax = sum(Z[n].T @ (np.diag(q[n]) - np.outer(q[n], q[n])) @ Z[n] for n in range(len(q)))
    np.testing.assert_allclose(F, F_softmax / n_states, rtol=1e-10, atol=1e-14)
    rng = np.random.default_rng(100 + seed)
    for _ in range(3):
        v = rng.normal(size=n_params)
        v_in = v.copy()
        out = fvp(v)
        assert out.dtype == np.float64 and out.shape == (n_params,)
        np.testing.assert_allclose(out, F @ v + damping * v, rtol=1e-10)
        np.testing.assert_allclose(fvp0(v), F @ v, rtol=1e-10)
        np.testing.assert_array_equal(v, v_in)
    # CG on the FVP solves the damped Fisher system.
    x = conjugate_gradient(fvp, v, iters=200, residual_tol=1e-28)
    np.testing.assert_allclose(
        x, np.linalg.solve(F + damping * np.eye(n_params), v), rtol=1e-6, atol=1e-8
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("iters", [1, 3, 10])
def test_span_conjugate_gradient_has_the_iterates_of_conjugate_gradient(seed, iters) -> None:
    """CG run on coefficients a (x = Zᵀa) with the Gram matrix K = Z Zᵀ gives the same x as
    conjugate_gradient on the P-dimensional Fisher products, iteration for iteration, for a
    right-hand side Zᵀu (masked actions included)."""
    rng = np.random.default_rng(seed)
    n_states, n_actions, n_params = 6, 3, 40
    Z = rng.normal(size=(n_states, n_actions, n_params))
    allowed = np.ones((n_states, n_actions), dtype=bool)
    allowed[::2, -1] = False
    q = _masked_softmax(rng.normal(size=(n_states, n_actions)) * 2, allowed)
    J = _softmax_log_q_jac(q, allowed)
    u = rng.normal(size=(n_states, n_actions))
    damping = 0.1
    jvp, vjp = _dense_jvp_vjp(Z)
    want = conjugate_gradient(
        logit_fisher_vector_product_fn(jvp, vjp, J, q, damping), vjp(u), iters
    )
    flat = Z.reshape(-1, n_params)
    a = span_conjugate_gradient(flat @ flat.T, logit_fisher_blocks(J, q), u, damping, iters)
    assert a.shape == u.shape
    np.testing.assert_allclose(vjp(a), want, rtol=1e-8, atol=1e-10)
    # converged, it solves the damped Fisher system
    a = span_conjugate_gradient(flat @ flat.T, logit_fisher_blocks(J, q), u, damping, 200, 1e-28)
    F = _explicit_fisher(Z, J, q)
    np.testing.assert_allclose(
        vjp(a), np.linalg.solve(F + damping * np.eye(n_params), vjp(u)), rtol=1e-6, atol=1e-8
    )
    with pytest.raises(ValueError, match="gram"):
        span_conjugate_gradient(np.eye(3), logit_fisher_blocks(J, q), u, damping)


@pytest.mark.parametrize("seed", [0, 1])
def test_logit_fisher_vector_product_equals_kl_hessian_of_a_linear_policy(seed: int) -> None:
    """For logits z_n = X_n θ, F v equals the Hessian of the mean KL(q_old ‖ q_θ) at θ_old times
    v, with masked actions: H v by the complex step on KL's gradient, itself checked against
    the complex step on KL."""
    rng = np.random.default_rng(seed)
    n_states, n_actions, n_params = 7, 3, 6
    X = rng.normal(size=(n_states, n_actions, n_params))
    theta_old = rng.normal(size=n_params)
    allowed = np.ones((n_states, n_actions), dtype=bool)
    allowed[1::2, -1] = False
    q = _masked_softmax(X @ theta_old, allowed)
    damping = 0.05
    fvp = logit_fisher_vector_product_fn(
        *_dense_jvp_vjp(X), _softmax_log_q_jac(q, allowed), q, damping
    )

    def log_q(theta: np.ndarray) -> np.ndarray:  # complex-safe: 0 on masked actions
        z = np.einsum("nap,p->na", X, theta)
        lse = np.log(np.where(allowed, np.exp(np.where(allowed, z, 0)), 0).sum(-1, keepdims=True))
        return np.where(allowed, z - lse, 0)

    def kl(theta: np.ndarray):  # mean KL(q_old ‖ q_θ)
        return np.sum(
            q * (np.where(allowed, np.log(np.where(allowed, q, 1)), 0) - log_q(theta)), -1
        ).mean()

    def grad_kl(theta: np.ndarray) -> np.ndarray:  # mean_n X_nᵀ (q_θ − q_old)
        return np.einsum("nap,na->p", X, np.exp(log_q(theta)) * allowed - q) / n_states

    h = 1e-30  # complex steps: derivatives exact to rounding, no difference taken
    theta = rng.normal(size=n_params)
    step = [kl(theta + 1j * h * e).imag / h for e in np.eye(n_params)]
    np.testing.assert_allclose(grad_kl(theta), step, rtol=1e-10, atol=1e-14)
    assert np.all(np.abs(grad_kl(theta_old)) < 1e-15)  # KL's minimum
    for _ in range(3):
        v = rng.normal(size=n_params)
        hv = grad_kl(theta_old + 1j * h * v).imag / h  # H v, H the Hessian of the mean KL
        np.testing.assert_allclose(fvp(v), hv + damping * v, rtol=1e-9, atol=1e-12)


def test_logit_fisher_vector_product_validates_shapes() -> None:
    Z, _, q, J = _masked_problem(0)
    n_params = Z.shape[2]
    jvp, vjp = _dense_jvp_vjp(Z)
    for bad_J, bad_q in [
        (J[0], q),  # not [N, A, A]
        (J[:, :, :2], q),
        (J, q[:, :2]),
        (J[:-1], q),
        (J, q[0]),
        (J[:0], q[:0]),  # N = 0
    ]:
        with pytest.raises(ValueError, match=r"\[N, A, A\]"):
            logit_fisher_vector_product_fn(jvp, vjp, bad_J, bad_q, 0.1)
    fvp = logit_fisher_vector_product_fn(jvp, vjp, J, q, 0.1)
    with pytest.raises(ValueError, match="1-D"):
        fvp(np.ones((n_params, 1)))
    bad_jvp = logit_fisher_vector_product_fn(lambda v: jvp(v)[:, :2], vjp, J, q, 0.1)
    with pytest.raises(ValueError, match="jvp"):
        bad_jvp(np.ones(n_params))
    bad_vjp = logit_fisher_vector_product_fn(jvp, lambda u: vjp(u)[:-1], J, q, 0.1)
    with pytest.raises(ValueError, match="vjp"):
        bad_vjp(np.ones(n_params))


# --------------------------------------------------------------------------- line search


def _evaluator(
    theta_old: np.ndarray, calls: list[np.ndarray] | None = None
) -> Callable[[np.ndarray], tuple[float, float, float]]:
    """objective −‖θ − (2, 2)‖², constraint θ₀ − 1 (≤ 0 feasible), KL ½‖θ − θ_old‖²."""
    target = np.array([2.0, 2.0])
    theta_old = theta_old.copy()

    def evaluate(theta: np.ndarray) -> tuple[float, float, float]:
        if calls is not None:
            calls.append(theta.copy())
        return (
            float(-((theta - target) ** 2).sum()),
            float(theta[0] - 1.0),
            float(0.5 * ((theta - theta_old) ** 2).sum()),
        )

    return evaluate


def test_line_search_backtracks_to_the_trust_region() -> None:
    old = np.array([0.0, 0.0])
    calls: list[np.ndarray] = []
    evaluate = _evaluator(old, calls)
    obj0, con0, _ = evaluate(old)
    calls.clear()
    step = np.array([0.0, 1.0])  # KL of the full step: 0.5
    theta, res = backtracking_line_search(
        old, step, evaluate, objective_old=obj0, constraint_old=con0, max_kl=0.1,
        check_objective=True, backtrack_coeff=0.5, max_backtracks=10,
    )  # fmt: skip
    # 0.5·f² ≤ 0.1 ⇔ f ≤ 0.447: f = 1, 0.5 rejected, 0.25 accepted.
    assert res.accepted and res.step_fraction == 0.25 and res.steps_tried == 3
    assert [c.tolist() for c in calls] == [[0.0, 1.0], [0.0, 0.5], [0.0, 0.25]]
    assert np.array_equal(theta, old + 0.25 * step) and theta.dtype == np.float64
    assert np.array_equal(old, [0.0, 0.0]) and np.array_equal(step, [0.0, 1.0])  # pure
    assert res.kl == pytest.approx(0.5 * 0.25**2)
    assert res.objective > obj0 and res.constraint <= 0


def test_line_search_keeps_feasibility_and_allows_recovery() -> None:
    # Feasible start: a step crossing θ₀ = 1 is rejected until it stays feasible.
    old = np.array([0.5, 0.0])
    evaluate = _evaluator(old)
    obj0, con0, _ = evaluate(old)
    theta, res = backtracking_line_search(
        old, np.array([1.0, 0.0]), evaluate, objective_old=obj0, constraint_old=con0,
        max_kl=10.0, check_objective=True, backtrack_coeff=0.5,
    )  # fmt: skip
    assert res.accepted and res.step_fraction == 0.5 and res.constraint == pytest.approx(0.0)
    assert np.array_equal(theta, [1.0, 0.0])
    # Infeasible start, recovery step: the objective gets worse but is not checked.
    old = np.array([1.5, 2.0])
    evaluate = _evaluator(old)
    obj0, con0, _ = evaluate(old)
    theta, res = backtracking_line_search(
        old, np.array([-0.2, 0.0]), evaluate, objective_old=obj0, constraint_old=con0,
        max_kl=10.0, check_objective=False,
    )  # fmt: skip
    assert res.accepted and res.step_fraction == 1.0 and res.objective < obj0
    assert res.constraint < con0
    assert np.array_equal(theta, old + np.array([-0.2, 0.0]))


def test_line_search_restores_theta_when_nothing_is_accepted() -> None:
    old = np.array([0.3, -0.7])
    evaluate = _evaluator(old)
    obj0, con0, _ = evaluate(old)
    step = np.array([-1.0, -1.0])  # away from the target: worse
    theta, res = backtracking_line_search(
        old, step, evaluate, objective_old=obj0, constraint_old=con0, max_kl=1.0,
        check_objective=True, backtrack_coeff=0.8, max_backtracks=6,
    )  # fmt: skip
    assert not res.accepted and res.steps_tried == 7 and res.step_fraction == 0.0
    assert np.array_equal(theta, old) and theta.dtype == np.float64  # bit-for-bit
    assert not np.shares_memory(theta, old)  # a copy
    assert np.array_equal(old, [0.3, -0.7])
    assert (res.objective, res.constraint, res.kl) == (obj0, con0, 0.0)


def test_line_search_rejects_non_finite_and_bad_arguments() -> None:
    old = np.array([0.0, 0.0])
    step = np.ones(2)
    for bad in [(float("nan"), -1.0, 0.0), (0.0, float("inf"), 0.0), (0.0, -1.0, float("nan"))]:
        theta, res = backtracking_line_search(
            old, step, lambda _theta, bad=bad: bad, objective_old=0.0, constraint_old=-1.0,
            max_kl=1.0, check_objective=False, max_backtracks=2,
        )  # fmt: skip
        assert not res.accepted and res.steps_tried == 3 and np.array_equal(theta, old)

    def ok(_theta: np.ndarray) -> tuple[float, float, float]:
        return (0.0, 0.0, 0.0)

    common = {"objective_old": 0.0, "constraint_old": 0.0, "max_kl": 1.0, "check_objective": True}
    with pytest.raises(ValueError, match="step"):
        backtracking_line_search(old, np.ones(3), ok, **common)
    with pytest.raises(ValueError, match="theta_old"):
        backtracking_line_search(np.zeros((2, 1)), np.ones((2, 1)), ok, **common)
    for coeff in (0.0, 1.0):
        with pytest.raises(ValueError, match="backtrack_coeff"):
            backtracking_line_search(old, step, ok, backtrack_coeff=coeff, **common)
    with pytest.raises(ValueError, match="max_backtracks"):
        backtracking_line_search(old, step, ok, max_backtracks=-1, **common)


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
    """CG + logit FVP + cpo_step + line search on a linear-softmax policy z_n = X_n θ: the
    accepted step has a real KL ≤ δ and, for a feasible start, keeps the surrogate constraint
    feasible."""
    rng = np.random.default_rng(3)
    n_states, n_actions, n_params = 7, 3, 8
    X = rng.normal(size=(n_states, n_actions, n_params))
    theta_old = 0.5 * rng.normal(size=n_params)
    rows = np.arange(n_states)
    actions = rng.integers(0, n_actions, size=n_states)
    adv = rng.normal(size=n_states)
    cadv = rng.normal(size=n_states)
    c0 = -0.02

    def log_q(theta: np.ndarray) -> np.ndarray:
        z = X @ theta
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    logq_old = log_q(theta_old)
    q_old = np.exp(logq_old)

    def surrogates(theta: np.ndarray) -> tuple[float, float]:
        ratio = np.exp(log_q(theta)[rows, actions] - logq_old[rows, actions])
        return float((ratio * adv).mean()), c0 + float((ratio * cadv).mean() - cadv.mean())

    def kl(theta: np.ndarray) -> float:  # mean KL(q_old ‖ q_θ)
        return float((q_old * (logq_old - log_q(theta))).sum(-1).mean())

    # Analytic gradients at θ_old (ratio = 1): ∇ log q(a|s_n) = (J_n X_n)_a, J_n = I − 1 q_nᵀ.
    J = np.eye(n_actions)[None] - q_old[:, None, :]
    grad_log_q_a = np.einsum("nk,nkp->np", J[rows, actions], X)
    g = (adv[:, None] * grad_log_q_a).mean(0)
    b = (cadv[:, None] * grad_log_q_a).mean(0)
    eps = 1e-6
    for grad, fn in ((g, lambda t: surrogates(t)[0]), (b, lambda t: surrogates(t)[1])):
        fd = [(fn(theta_old + eps * e) - fn(theta_old - eps * e)) / (2 * eps)
              for e in np.eye(n_params)]  # fmt: skip
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-9)

    fvp = logit_fisher_vector_product_fn(*_dense_jvp_vjp(X), J, q_old, 1e-3)
    x, info = cpo_step(
        g, b, c0, DELTA, conjugate_gradient(fvp, g, 30), conjugate_gradient(fvp, b, 30)
    )
    obj0, con0 = surrogates(theta_old)
    assert con0 == pytest.approx(c0, abs=1e-15)

    def evaluate(theta: np.ndarray) -> tuple[float, float, float]:
        o, c = surrogates(theta)
        return o, c, kl(theta)

    theta, res = backtracking_line_search(
        theta_old, x, evaluate, objective_old=obj0, constraint_old=c0, max_kl=DELTA,
        check_objective=info.case in OBJECTIVE_CASES,
    )  # fmt: skip
    assert res.accepted
    assert res.kl <= DELTA and res.constraint <= 0.0 and res.objective >= obj0
    np.testing.assert_array_equal(theta, theta_old + res.step_fraction * x)
    assert res.kl == pytest.approx(kl(theta), abs=0) and res.objective == surrogates(theta)[0]
    # The quadratic model of the KL is close to the real KL for the full step.
    if res.step_fraction == 1.0:
        assert res.kl == pytest.approx(info.predicted_kl, rel=0.3)
