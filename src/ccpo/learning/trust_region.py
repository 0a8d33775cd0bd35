"""Trust-region maths for CPO (Achiam et al. 2017): conjugate gradient, Fisher-vector products
of categorical policies, the CPO step and a backtracking line search.

Pure numpy, float64, on flat 1-D parameter vectors θ (on CCPO's tiny networks a deep learning
framework's per-operator dispatch costs more than the arithmetic). The caller owns the network:
it supplies the products with its Jacobian (:func:`logit_fisher_vector_product_fn`,
:func:`logit_fisher_blocks`, :func:`span_conjugate_gradient`) and evaluates a candidate θ
(:func:`backtracking_line_search`).

:func:`cpo_step` solves, in the objective convention only (x = θ − θ_k): maximise gᵀx subject
to c + bᵀx ≤ 0 and ½xᵀHx ≤ δ, through its dual, and names the case it took (:class:`CPOInfo`,
:data:`CASE_IDS` in Achiam's ``optim_case`` numbers). Copying the loss convention's dual into
this convention flips the sign of r; the tests check the step against scipy's SLSQP and the
KKT conditions.

Derivation: docs/theory.md, section "The CPO step".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CASE_IDS",
    "OBJECTIVE_CASES",
    "CPOInfo",
    "LineSearchResult",
    "backtracking_line_search",
    "conjugate_gradient",
    "cpo_step",
    "logit_fisher_blocks",
    "logit_fisher_vector_product_fn",
    "span_conjugate_gradient",
]

CASE_IDS: dict[str, int] = {
    "infeasible_recovery": 0,
    "infeasible_dual": 1,
    "feasible_dual": 2,
    "trpo": 3,
    "b_zero": 4,
}
"""Case name → Achiam et al.'s ``optim_case`` number (as logged by safety-starter-agents)."""

OBJECTIVE_CASES: frozenset[str] = frozenset({"feasible_dual", "trpo", "b_zero"})
"""Cases whose step aims at the objective: the line search should require it not to get worse.
(Achiam's ``optim_case > 1``; for ``b_zero`` also when c ≥ 0, since its step is a TRPO step.)"""


def _vector(name: str, v: np.ndarray) -> np.ndarray:
    """``v`` as a 1-D float64 array (no copy if it already is one); ValueError otherwise."""
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {v.shape}")
    return v


# --------------------------------------------------------------------------- CG and FVP


def conjugate_gradient(
    Avp: Callable[[np.ndarray], np.ndarray],
    b: np.ndarray,
    iters: int = 10,
    residual_tol: float = 1e-10,
) -> np.ndarray:
    """Approximately solve A x = b for symmetric positive-definite A given only x ↦ A x.

    Hestenes–Stiefel conjugate gradient from x₀ = 0 (Schulman et al. 2015, Appendix C), at most
    ``iters`` iterations, stopping early when the squared residual ‖b − Ax‖² < ``residual_tol``.
    In exact arithmetic it is exact after ``dim`` iterations. ``b`` is a 1-D array (float64);
    ``Avp`` is called on 1-D float64 arrays it must not modify, and returns the same shape.
    """
    b = _vector("b", b)
    x = np.zeros_like(b)
    r = b.copy()
    p = b.copy()
    rr = float(r @ r)
    for _ in range(iters):
        if rr < residual_tol:
            break
        ap = Avp(p)
        alpha = rr / float(p @ ap)
        x += alpha * p
        r -= alpha * ap
        rr_new = float(r @ r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def logit_fisher_vector_product_fn(
    jvp: Callable[[np.ndarray], np.ndarray],
    vjp: Callable[[np.ndarray], np.ndarray],
    log_q_jac: np.ndarray,
    q: np.ndarray,
    damping: float,
) -> Callable[[np.ndarray], np.ndarray]:
    """v ↦ (F + damping·I) v with F the exact Fisher information of categorical policies
    q_θ(·|s) = f(z_θ(s)) computed from logits z, through the logits' Jacobian-vector products.

    Args:
        jvp: v ↦ Z v, shape ``[P] → [N, A]``, with Z_n = ∂z_n/∂θ ``[A, P]`` the Jacobian of the
            network's logits at state s_n at θ_old (forward mode).
        vjp: u ↦ Zᵀ u = Σ_n Z_nᵀ u_n, shape ``[N, A] → [P]`` (reverse mode).
        log_q_jac: J_n = ∂ log q(·|s_n) / ∂z_n at θ_old, shape ``[N, A, A]`` (row a is
            ∂ log q(a|s_n)/∂z_n). Rows of actions with q = 0 are ignored and may hold anything,
            even ±inf or nan (the log-probability of a masked action is −∞).
        q: q_old(a|s_n), shape ``[N, A]``.
        damping: added to the diagonal.

    At θ_old the Hessian of the mean KL(q_old ‖ q_θ) over the N states is the Fisher matrix
    (Schulman et al. 2015, Appendix C)

        F = (1/N) Σ_n Σ_a q(a|s_n) ∇_θ log q(a|s_n) ∇_θ log q(a|s_n)ᵀ,

    because Σ_a q ∇² log q = −Σ_a q ∇log q ∇log qᵀ when Σ_a q = 1 (the gradient of the KL
    vanishes there, and so does every term with q = 0). By the chain rule ∇_θ log q(·|s_n) =
    J_n Z_n, so

        F = (1/N) Σ_n Z_nᵀ M_n Z_n,   M_n = J_nᵀ diag(q_n) J_n   (A×A),

    and F v = (1/N) Zᵀ(M Z v). F needs neither the P×P matrix nor the ``[N·A, P]`` Jacobian of
    log q: the N small matrices M_n are formed once (rows of J with q = 0 zeroed first, so that
    0·(±inf) does not poison them), and each product is one forward-mode pass (``jvp``), a
    batched A×A mat-vec and one reverse-mode pass (``vjp``) through the network.
    (For a softmax, J_n = I − 1 q_nᵀ and M_n = diag(q_n) − q_n q_nᵀ.)

    Raises:
        ValueError: if ``log_q_jac`` is not ``[N, A, A]`` with ``q`` ``[N, A]`` and N ≥ 1, and,
        at each product, if v is not 1-D or ``jvp``/``vjp`` return the wrong shape.
    """
    M = logit_fisher_blocks(log_q_jac, q)
    n_states, n_actions = M.shape[:2]
    out_shape = (n_states, n_actions)

    def fvp(v: np.ndarray) -> np.ndarray:
        v = _vector("v", v)
        u = np.asarray(jvp(v))
        if u.shape != out_shape:
            raise ValueError(f"jvp(v) must have shape [N, A] = {out_shape}, got {u.shape}")
        fv = np.asarray(vjp(np.einsum("nkl,nl->nk", M, u)))
        if fv.shape != v.shape:
            raise ValueError(f"vjp(u) must have the shape of v {v.shape}, got {fv.shape}")
        return fv + damping * v

    return fvp


def logit_fisher_blocks(log_q_jac: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The Fisher in logit space, per state: M_n = (1/N) J_nᵀ diag(q_n) J_n, ``[N, A, A]``
    (see :func:`logit_fisher_vector_product_fn`; rows of J where q = 0 are ignored).

    Raises:
        ValueError: if ``log_q_jac`` is not ``[N, A, A]`` with ``q`` ``[N, A]`` and N ≥ 1.
    """
    log_q_jac = np.asarray(log_q_jac, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if (
        log_q_jac.ndim != 3
        or q.ndim != 2
        or log_q_jac.shape != (*q.shape, q.shape[1])
        or q.shape[0] == 0
    ):
        raise ValueError(
            f"log_q_jac must be [N, A, A] and q [N, A] with N >= 1, got {log_q_jac.shape} "
            f"and {q.shape}"
        )
    support = q > 0
    J = np.where(support[:, :, None], log_q_jac, 0.0)  # drop rows of q = 0 (may be ±inf/nan)
    w = np.where(support, q, 0.0) / q.shape[0]
    return np.einsum("nak,na,nal->nkl", J, w, J)


def span_conjugate_gradient(
    gram: np.ndarray,
    blocks: np.ndarray,
    u: np.ndarray,
    damping: float,
    iters: int = 10,
    residual_tol: float = 1e-10,
) -> np.ndarray:
    """:func:`conjugate_gradient` for (F + damping·I) x = Zᵀu, run in the span of Zᵀ.

    Args:
        gram: K = Z Zᵀ, ``[N·A, N·A]``, for the logits' Jacobian Z ``[N·A, P]`` (rows in (n, a)
            order; :meth:`ccpo.learning.nets.NumpyMLP.output_gram`).
        blocks: M ``[N, A, A]`` with F = Σ_n Z_nᵀ M_n Z_n (:func:`logit_fisher_blocks`).
        u: ``[N, A]``: the right-hand side is Zᵀu (a policy gradient always is: g = Σ_n Z_nᵀ u_n
            with u_n its gradient in logit space).
        damping, iters, residual_tol: as in :func:`conjugate_gradient`.

    Returns:
        a ``[N, A]`` with x = Zᵀa (one reverse-mode pass turns it into parameters).

    For a right-hand side Zᵀu every conjugate-gradient iterate lies in the span of Zᵀ: r₀ = p₀ =
    Zᵀu and (F + δI) Zᵀa = Zᵀ(M K a + δa). Writing x = Zᵀξ, r = Zᵀρ, p = Zᵀπ, the inner
    products are rᵀr = ρᵀKρ and pᵀ(F + δI)p = πᵀK(MKπ + δπ), so these are the iterates of
    :func:`conjugate_gradient` on the P-dimensional problem (tested equal), computed with
    N·A-dimensional vectors: each iteration costs three N·A × N·A mat-vecs instead of a forward
    and a reverse pass through the network.
    """
    u = np.asarray(u, dtype=np.float64)
    n_states, n_actions = u.shape
    dim = n_states * n_actions
    if gram.shape != (dim, dim) or blocks.shape != (n_states, n_actions, n_actions):
        raise ValueError(
            f"gram must be [N*A, N*A] = {(dim, dim)} and blocks [N, A, A], got {gram.shape} "
            f"and {blocks.shape}"
        )
    # (F + δI) Zᵀa = Zᵀ(mk a + δ a), mk = blockdiag(M) K, one A × A block per state
    mk = np.matmul(blocks, gram.reshape(n_states, n_actions, dim))
    mk = mk.reshape(dim, dim)
    xi = np.zeros(dim)
    rho = u.reshape(-1).copy()
    pi = rho.copy()
    k_rho = gram @ rho
    rr = float(rho @ k_rho)
    for _ in range(iters):
        if rr < residual_tol:
            break
        ap = mk @ pi + damping * pi
        alpha = rr / float(pi @ (gram @ ap))
        xi += alpha * pi
        rho -= alpha * ap
        k_rho = gram @ rho
        rr_new = float(rho @ k_rho)
        pi = rho + (rr_new / rr) * pi
        rr = rr_new
    return xi.reshape(n_states, n_actions)


# --------------------------------------------------------------------------- CPO step


@dataclass(frozen=True)
class CPOInfo:
    """Diagnostics of one CPO step (log as ``cpo/q``, ``cpo/case`` ...).

    In the ``b_zero`` case r, s, A, B are reported as 0 (they are not computed). The
    ``infeasible_recovery`` step x = −√(2δ/s) x_b is reported as λ* = 0, ν* = √(2δ/s), so that
    x = −ν* x_b: these are not multipliers of the infeasible problem.
    """

    case: str
    case_id: int
    q: float
    r: float
    s: float
    A: float
    B: float
    lam: float
    nu: float
    c: float
    delta: float
    predicted_objective: float  # gᵀx, the linearised objective gain of the step
    predicted_constraint: float  # c + bᵀx, the linearised constraint after the step
    predicted_kl: float  # ½xᵀHx, the quadratic model of the KL of the step


def _project(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


def cpo_step(
    g: np.ndarray,
    b: np.ndarray,
    c: float,
    delta: float,
    Hinv_g: np.ndarray,
    Hinv_b: np.ndarray,
    *,
    b_tol: float = 1e-8,
) -> tuple[np.ndarray, CPOInfo]:
    """The CPO update direction x = θ_{k+1} − θ_k (Achiam et al. 2017, Eq. 10 and App. 10.2).

    Objective convention (docs/theory.md, "The CPO step"): maximise gᵀx s.t. c + bᵀx ≤ 0, ½xᵀHx ≤ δ.

    Args:
        g: gradient of the objective to maximise, 1-D.
        b: gradient of the constraint (feasible iff c + bᵀx ≤ 0), 1-D, same units as ``c``.
        c: current constraint value (≤ 0 feasible).
        delta: trust-region radius δ (KL), > 0.
        Hinv_g: H⁻¹g (conjugate gradient), 1-D.
        Hinv_b: H⁻¹b (conjugate gradient), 1-D; ignored in the ``b_zero`` case.
        b_tol: the constraint gradient counts as zero when bᵀb ≤ b_tol.

    Returns:
        ``(x, info)``: the step (a new float64 array) and :class:`CPOInfo`. x is the exact
        solution of the quadratic sub-problem (or the recovery step); the caller still
        line-searches it.

    Raises:
        ValueError: on shape mismatches or δ ≤ 0.
    """
    g, b = np.asarray(g, dtype=np.float64), np.asarray(b, dtype=np.float64)
    x_g, x_b = np.asarray(Hinv_g, dtype=np.float64), np.asarray(Hinv_b, dtype=np.float64)
    for name, t in (("g", g), ("b", b), ("Hinv_g", x_g), ("Hinv_b", x_b)):
        if t.ndim != 1 or t.shape != g.shape:
            raise ValueError(f"{name} must be 1-D with the shape of g {g.shape}, got {t.shape}")
    if not delta > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    c = float(c)
    delta = float(delta)
    eps = 1e-12
    q = float(g @ x_g)
    q_safe = max(q, eps)  # g = 0 gives a zero TRPO step rather than 0/0
    lam_trpo = math.sqrt(q_safe / (2 * delta))

    def finish(
        case: str, alpha: float, beta: float, r: float, s: float, A: float, B: float,
        lam: float, nu: float,
    ) -> tuple[np.ndarray, CPOInfo]:  # fmt: skip
        """x = α x_g + β x_b, so ½xᵀHx = ½(α²q + 2αβr + β²s) needs no H."""
        x = alpha * x_g if beta == 0.0 else alpha * x_g + beta * x_b
        info = CPOInfo(
            case=case, case_id=CASE_IDS[case], q=q, r=r, s=s, A=A, B=B, lam=lam, nu=nu, c=c,
            delta=delta, predicted_objective=float(g @ x),
            predicted_constraint=c + float(b @ x),
            predicted_kl=0.5 * (alpha * alpha * q + 2 * alpha * beta * r + beta * beta * s),
        )  # fmt: skip
        return x, info

    if float(b @ b) <= b_tol:
        return finish("b_zero", 1 / lam_trpo, 0.0, 0.0, 0.0, 0.0, 0.0, lam_trpo, 0.0)

    r = float(g @ x_b)
    s = max(float(b @ x_b), eps)
    A = q - r * r / s  # ≥ 0 by Cauchy–Schwarz in the H⁻¹ inner product
    # g ∥ b up to round-off: A = 0 exactly (else x's component ⟂ b would be round-off / λ).
    if A <= 1e-12 * q_safe:  # noqa: SIM300 (A is the paper's name, not a constant)
        A = 0.0
    B = 2 * delta - c * c / s

    # B ≤ 0: the trust region does not cross the constraint boundary (it may touch it).
    if c < 0 and B <= 0:
        return finish("trpo", 1 / lam_trpo, 0.0, r, s, A, B, lam_trpo, 0.0)
    if c >= 0 and B <= 0:
        nu = math.sqrt(2 * delta / s)
        return finish("infeasible_recovery", 0.0, -nu, r, s, A, B, 0.0, nu)

    # B > 0: minimise the convex dual D(λ) over λ ≥ 0 (docs/theory.md), piece by piece.
    # Region a: λc + r ≥ 0 (ν* ≥ 0 active); region b: λc + r ≤ 0 (ν* = 0).
    inf = math.inf
    region_a: tuple[float, float] | None
    region_b: tuple[float, float] | None
    if c > 0:
        edge = -r / c
        region_a, region_b = (max(edge, 0.0), inf), ((0.0, edge) if edge > 0 else None)
    elif c < 0:
        edge = -r / c
        region_a, region_b = ((0.0, edge) if edge > 0 else None), (max(edge, 0.0), inf)
    else:  # c == 0: ν* = max(0, r/s) does not depend on λ.
        region_a, region_b = ((0.0, inf), None) if r > 0 else (None, (0.0, inf))

    candidates: list[tuple[float, float, str]] = []  # (D(λ), λ, region)
    if region_a is not None:
        lam_a = _project(math.sqrt(A / B), *region_a)
        # λ_a = 0 is only reached when A = 0 (g ∥ b); then D_a(0) = −rc/s.
        d_a = (A / (2 * lam_a) if lam_a > 0 else 0.0) + lam_a * B / 2 - r * c / s
        candidates.append((d_a, lam_a, "a"))
    if region_b is not None:
        lam_b = _project(lam_trpo, *region_b)
        d_b = q_safe / (2 * lam_b) + lam_b * delta if lam_b > 0 else inf
        candidates.append((d_b, lam_b, "b"))
    _, lam, region = min(candidates, key=lambda t: t[0])

    case = "feasible_dual" if c < 0 else "infeasible_dual"
    if region == "b":
        return finish(case, 1 / lam, 0.0, r, s, A, B, lam, 0.0)
    nu = max(0.0, (lam * c + r) / s)
    # x = (x_g − ν x_b)/λ = (x_g − (r/s) x_b)/λ − (c/s) x_b. When λ = 0 (A = 0, g ∥ b) the first
    # term is 0/0; its limit along the dual path is 0 (the minimum-norm optimum).
    alpha = 1 / lam if lam > 0 else 0.0
    beta = -(r / s) * alpha - c / s
    return finish(case, alpha, beta, r, s, A, B, lam, nu)


# --------------------------------------------------------------------------- line search


@dataclass(frozen=True)
class LineSearchResult:
    """Outcome of :func:`backtracking_line_search`.

    ``objective``, ``constraint`` and ``kl`` are measured at the returned parameters: the
    accepted ones, or θ_old (with the caller's old values and kl = 0) if none was.
    """

    accepted: bool
    step_fraction: float  # β^j of the accepted step; 0.0 when nothing was accepted
    steps_tried: int  # number of candidate fractions evaluated (1 … max_backtracks + 1)
    objective: float
    constraint: float
    kl: float


def backtracking_line_search(
    theta_old: np.ndarray,
    step: np.ndarray,
    evaluate: Callable[[np.ndarray], tuple[float, float, float]],
    *,
    objective_old: float,
    constraint_old: float,
    max_kl: float,
    check_objective: bool,
    backtrack_coeff: float = 0.8,
    max_backtracks: int = 10,
) -> tuple[np.ndarray, LineSearchResult]:
    """Backtrack along a CPO/TRPO step until it is acceptable (Achiam et al. 2017, Sec. 6.3).

    Tries θ = θ_old + β^j·step for j = 0, 1, …, ``max_backtracks`` (β = ``backtrack_coeff``),
    calling ``evaluate(θ)`` on each candidate (a new 1-D float64 array), which must return
    ``(objective, constraint, kl)`` at θ: the surrogate objective to maximise, the surrogate
    constraint in cost form (feasible iff ≤ 0, as in :func:`cpo_step`) and the mean KL between
    the old and the candidate policy. The first candidate with all three finite and

    1. ``kl ≤ max_kl`` (no slack: pass e.g. ``1.5 * delta`` to allow some),
    2. ``constraint ≤ max(0, constraint_old)``: a feasible policy stays feasible, an infeasible one
       does not get worse (ties accepted),
    3. if ``check_objective``: ``objective ≥ objective_old`` (ties accepted). Pass
       ``check_objective = info.case in OBJECTIVE_CASES``: recovery steps (c ≥ 0) are judged on
       the constraint alone,

    is accepted. Pure: ``theta_old`` and ``step`` are not modified.

    Returns:
        ``(theta, result)``: the accepted θ, or, if none was accepted, a copy of θ_old equal to
        it exactly, and the :class:`LineSearchResult`.

    Raises:
        ValueError: if ``theta_old`` is not 1-D, ``step`` does not have its shape,
        ``backtrack_coeff`` is not in (0, 1) or ``max_backtracks`` < 0.
    """
    if not 0 < backtrack_coeff < 1:
        raise ValueError(f"backtrack_coeff must be in (0, 1), got {backtrack_coeff}")
    if max_backtracks < 0:
        raise ValueError(f"max_backtracks must be >= 0, got {max_backtracks}")
    theta_old = _vector("theta_old", theta_old)
    step = np.asarray(step, dtype=np.float64)
    if step.shape != theta_old.shape:
        raise ValueError(
            f"step must have the shape of theta_old {theta_old.shape}, got {step.shape}"
        )
    constraint_limit = max(0.0, float(constraint_old))
    for j in range(max_backtracks + 1):
        fraction = backtrack_coeff**j
        theta = theta_old + fraction * step
        objective, constraint, kl = (float(v) for v in evaluate(theta))
        ok = (
            math.isfinite(objective)
            and math.isfinite(constraint)
            and math.isfinite(kl)
            and kl <= max_kl
            and constraint <= constraint_limit
            and (not check_objective or objective >= objective_old)
        )
        if ok:
            return theta, LineSearchResult(True, fraction, j + 1, objective, constraint, kl)
    return theta_old.copy(), LineSearchResult(
        False, 0.0, max_backtracks + 1, float(objective_old), float(constraint_old), 0.0
    )
