"""Trust-region maths for CPO (Achiam et al. 2017): flat parameters, conjugate gradient,
Fisher-vector products, the CPO step and a backtracking line search.

Sign convention (the only one used in this module): **objective convention**. With x = θ − θ_k,

    maximise   gᵀx
    subject to c + bᵀx ≤ 0            (linearised constraint; c ≤ 0 means feasible)
               ½ xᵀHx ≤ δ             (quadratic model of the KL trust region)

- g is the gradient of the surrogate *objective* to be increased (for CCPO, which minimises cost,
  g = −∇ cost surrogate);
- c is the current constraint value in cost form, feasible iff c ≤ 0 (for the coverage
  constraint J̄_C ≥ 1 − α, c = (1 − α) − J̄_C), and b = ∇ of that constraint (so b = −∇J̄_C).
  c and b must be in the same units (both per-episode, or both per-step);
- H is the Fisher information (Hessian of the mean KL at θ_k), used only through the products
  x_g = H⁻¹g and x_b = H⁻¹b computed by conjugate gradient.

Scalars (Achiam et al. 2017, Sec. 6.1 and Appendix 10.2): q = gᵀH⁻¹g, r = gᵀH⁻¹b,
s = bᵀH⁻¹b, A = q − r²/s, B = 2δ − c²/s.

Dual, derived in this convention. The Lagrangian of the (concave) maximisation is
L(x, λ, ν) = gᵀx − ν(c + bᵀx) − λ(½xᵀHx − δ) with λ, ν ≥ 0; maximising over x gives
x = H⁻¹(g − νb)/λ and the dual function (to be *minimised* over λ, ν ≥ 0)

    D(λ, ν) = (q − 2νr + ν²s) / (2λ) − νc + λδ.

∂D/∂ν = 0 gives ν = (λc + r)/s, hence ν*(λ) = max(0, (λc + r)/s). Substituting,

    λc + r > 0  (ν > 0, the constraint is active):   D_a(λ) = A/(2λ) + λB/2 − rc/s,
    λc + r ≤ 0  (ν = 0, the constraint is inactive): D_b(λ) = q/(2λ) + λδ,

with unconstrained minimisers λ_a = √(A/B) and λ_b = √(q/(2δ)). D(λ) = D(λ, ν*(λ)) is convex
and continuous, so λ* is the better of λ_a projected onto {λ ≥ 0 : λc + r ≥ 0} and λ_b projected
onto {λ ≥ 0 : λc + r ≤ 0}. The step is x* = (x_g − ν* x_b)/λ*, evaluated as
x* = (x_g − (r/s) x_b)/λ* − (c/s) x_b when ν* > 0 (exact algebra; it stays finite when g ∥ b
and λ* → 0, where the first term is 0/0 and its limit, the minimum-norm solution, is 0).

In Achiam et al.'s and safety-starter-agents' *loss* convention (g_loss = −g) the same quantity
reads ν* = (λc − r_loss)₊/s with r_loss = −r; copying that formula into objective-convention code
flips the sign of r, which is the bug this module's tests guard against (against scipy SLSQP and
the KKT conditions).

Cases (``CPOInfo.case``; ``case_id`` follows Achiam's ``optim_case`` numbering):

- ``"b_zero"`` (4): bᵀb ≤ ``b_tol``: the constraint has no usable gradient; TRPO step
  x = √(2δ/q) x_g (also when c > 0: nothing first-order can repair the constraint);
- ``"trpo"`` (3): c < 0 and B < 0: the whole trust region is feasible; TRPO step;
- ``"feasible_dual"`` (2): c < 0 and B ≥ 0: feasible, the constraint may bind; dual step;
- ``"infeasible_dual"`` (1): c ≥ 0 and B ≥ 0: infeasible, but the trust region reaches the
  feasible half-space; dual step (it lands in the feasible set);
- ``"infeasible_recovery"`` (0): c ≥ 0 and B < 0: no feasible point in the trust region; take
  the step that decreases the constraint most, x = −√(2δ/s) x_b (reported as λ* = 0,
  ν* = √(2δ/s), so that x = −ν* x_b: these are not multipliers of the infeasible problem).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "CASE_IDS",
    "OBJECTIVE_CASES",
    "CPOInfo",
    "LineSearchResult",
    "backtracking_line_search",
    "categorical_fisher_vector_product_fn",
    "conjugate_gradient",
    "cpo_step",
    "fisher_vector_product",
    "fisher_vector_product_fn",
    "flat_grad",
    "flat_params",
    "set_flat_params",
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


# --------------------------------------------------------------------------- flat parameters


def flat_params(module: nn.Module) -> torch.Tensor:
    """All parameters of ``module`` concatenated into one detached 1-D tensor (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()


def set_flat_params(module: nn.Module, flat: torch.Tensor) -> None:
    """Overwrite the parameters of ``module`` in place from a flat vector (inverse of
    :func:`flat_params`). Raises ``ValueError`` if the size does not match."""
    params = list(module.parameters())
    n = sum(p.numel() for p in params)
    if flat.ndim != 1 or flat.numel() != n:
        raise ValueError(
            f"flat must be a 1-D tensor of {n} elements, got shape {tuple(flat.shape)}"
        )
    offset = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            p.copy_(flat[offset : offset + k].view_as(p))
            offset += k


def flat_grad(
    y: torch.Tensor,
    params: Iterable[torch.Tensor],
    retain_graph: bool | None = None,
    create_graph: bool = False,
) -> torch.Tensor:
    """∂y/∂params for a scalar ``y``, concatenated into one 1-D tensor.

    Parameters that ``y`` does not depend on get zero gradient. ``retain_graph`` defaults to
    ``create_graph``, as in :func:`torch.autograd.grad`.
    """
    params = list(params)
    if y.numel() != 1:
        raise ValueError(f"y must be a scalar, got shape {tuple(y.shape)}")
    grads = torch.autograd.grad(
        y, params, retain_graph=retain_graph, create_graph=create_graph, allow_unused=True
    )
    return torch.cat(
        [
            (torch.zeros_like(p) if g is None else g).reshape(-1)
            for g, p in zip(grads, params, strict=True)
        ]
    )


# --------------------------------------------------------------------------- CG and FVP


def conjugate_gradient(
    Avp: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    iters: int = 10,
    residual_tol: float = 1e-10,
) -> torch.Tensor:
    """Approximately solve A x = b for symmetric positive-definite A given only x ↦ A x.

    Hestenes–Stiefel conjugate gradient from x₀ = 0 (Schulman et al. 2015, Appendix C), at most
    ``iters`` iterations, stopping early when the squared residual ‖b − Ax‖² < ``residual_tol``.
    In exact arithmetic it is exact after ``dim`` iterations.
    """
    if b.ndim != 1:
        raise ValueError(f"b must be a 1-D tensor, got shape {tuple(b.shape)}")
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = torch.dot(r, r)
    for _ in range(iters):
        if rr.item() < residual_tol:
            break
        ap = Avp(p)
        alpha = rr / torch.dot(p, ap)
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = torch.dot(r, r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def fisher_vector_product_fn(
    kl: torch.Tensor,
    params: Sequence[torch.Tensor],
    damping: float,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """v ↦ (H + damping·I) v, with H the Hessian of the scalar mean KL ``kl`` at θ_old.

    ``kl`` must be KL(π_old ‖ π_θ) (or the reverse direction) with π_old detached, evaluated at
    the current parameters θ = θ_old; there its Hessian is the Fisher information matrix
    (Schulman et al. 2015, Appendix C). Double backpropagation, H v = ∇_θ (∇_θ KL · v), without
    ever forming H: ∇_θ KL is built once (with its graph) and every product is one more
    backward pass through it, so the conjugate-gradient solves of a step share it.
    """
    params = list(params)
    grad = flat_grad(kl, params, create_graph=True)

    def fvp(v: torch.Tensor) -> torch.Tensor:
        if v.ndim != 1:
            raise ValueError(f"v must be a 1-D tensor, got shape {tuple(v.shape)}")
        if grad.shape != v.shape:
            raise ValueError(f"v has {v.numel()} elements but params have {grad.numel()}")
        hv = flat_grad(torch.dot(grad, v.detach()), params, retain_graph=True)
        return hv + damping * v.detach()

    return fvp


def categorical_fisher_vector_product_fn(
    log_q_jacobian: torch.Tensor,
    q: torch.Tensor,
    damping: float,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """v ↦ (F + damping·I) v with F the exact Fisher information of categorical policies,
    from their Jacobian instead of double backpropagation.

    Args:
        log_q_jacobian: G = ∂ log q_θ(a|s) / ∂θ at θ_old, shape ``[N, A, P]`` over the N states
            of the KL mean (rows of actions with q = 0 are ignored).
        q: q_old(a|s), shape ``[N, A]``.
        damping: added to the diagonal.

    At θ_old the Hessian of the mean KL(q_old ‖ q_θ) is the Fisher matrix (Schulman et al.
    2015, Appendix C)

        F = (1/N) Σ_s Σ_a q(a|s) ∇_θ log q(a|s) ∇_θ log q(a|s)ᵀ = (1/N) Gᵀ diag(q) G,

    because Σ_a q ∇² log q = −Σ_a q ∇log q ∇log qᵀ when Σ_a q = 1. With G formed once per step,
    every product is two matrix-vector products, Fv = Gᵀ(q ⊙ Gv)/N: it equals
    :func:`fisher_vector_product_fn` on the same KL (tested) at a fraction of the cost when the
    conjugate-gradient solves of a step need many products of a small network.
    """
    if log_q_jacobian.ndim != 3 or q.shape != log_q_jacobian.shape[:2]:
        raise ValueError(
            f"log_q_jacobian must be [N, A, P] and q [N, A], got {tuple(log_q_jacobian.shape)} "
            f"and {tuple(q.shape)}"
        )
    n_states, n_actions, n_params = log_q_jacobian.shape
    G = log_q_jacobian.detach().reshape(n_states * n_actions, n_params)
    weights = q.detach().reshape(-1)
    G = torch.where(weights[:, None] > 0, G, torch.zeros((), dtype=G.dtype))  # 0·(±inf) = 0
    weights = weights / n_states

    def fvp(v: torch.Tensor) -> torch.Tensor:
        if v.ndim != 1:
            raise ValueError(f"v must be a 1-D tensor, got shape {tuple(v.shape)}")
        if v.numel() != n_params:
            raise ValueError(f"v has {v.numel()} elements but params have {n_params}")
        v = v.detach()
        return G.T @ (weights * (G @ v)) + damping * v

    return fvp


def fisher_vector_product(
    kl_fn: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor],
    v: torch.Tensor,
    damping: float,
) -> torch.Tensor:
    """(H + damping·I) v for one ``v``: :func:`fisher_vector_product_fn` on ``kl_fn()``."""
    return fisher_vector_product_fn(kl_fn(), params, damping)(v)


# --------------------------------------------------------------------------- CPO step


@dataclass(frozen=True)
class CPOInfo:
    """Diagnostics of one CPO step (log as ``cpo/q``, ``cpo/case`` ...).

    In the ``b_zero`` case r, s, A, B are reported as 0 (they are not computed).
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
    g: torch.Tensor,
    b: torch.Tensor,
    c: float,
    delta: float,
    Hinv_g: torch.Tensor,
    Hinv_b: torch.Tensor,
    *,
    b_tol: float = 1e-8,
) -> tuple[torch.Tensor, CPOInfo]:
    """The CPO update direction x = θ_{k+1} − θ_k (Achiam et al. 2017, Eq. 10 and App. 10.2).

    Objective convention (module docstring): maximise gᵀx s.t. c + bᵀx ≤ 0, ½xᵀHx ≤ δ.

    Args:
        g: gradient of the objective to maximise, 1-D.
        b: gradient of the constraint (feasible iff c + bᵀx ≤ 0), 1-D, same units as ``c``.
        c: current constraint value (≤ 0 feasible).
        delta: trust-region radius δ (KL), > 0.
        Hinv_g: H⁻¹g (conjugate gradient), 1-D.
        Hinv_b: H⁻¹b (conjugate gradient), 1-D; ignored in the ``b_zero`` case.
        b_tol: the constraint gradient counts as zero when bᵀb ≤ b_tol.

    Returns:
        ``(x, info)``: the step (dtype of ``g``) and :class:`CPOInfo`. x is the exact solution
        of the quadratic sub-problem (or the recovery step); the caller still line-searches it.

    Raises:
        ValueError: on shape mismatches or δ ≤ 0.
    """
    for name, t in (("g", g), ("b", b), ("Hinv_g", Hinv_g), ("Hinv_b", Hinv_b)):
        if t.ndim != 1 or t.shape != g.shape:
            raise ValueError(
                f"{name} must be 1-D with the shape of g {tuple(g.shape)}, got {tuple(t.shape)}"
            )
    if not delta > 0:
        raise ValueError(f"delta must be > 0, got {delta}")
    c = float(c)
    eps = 1e-12
    g, b = g.detach(), b.detach()
    x_g, x_b = Hinv_g.detach(), Hinv_b.detach()
    q = float(torch.dot(g, x_g))
    q_safe = max(q, eps)  # g = 0 gives a zero TRPO step rather than 0/0
    lam_trpo = math.sqrt(q_safe / (2 * delta))

    def finish(
        case: str, alpha: float, beta: float, r: float, s: float, A: float, B: float,
        lam: float, nu: float,
    ) -> tuple[torch.Tensor, CPOInfo]:  # fmt: skip
        """x = α x_g + β x_b, so ½xᵀHx = ½(α²q + 2αβr + β²s) needs no H."""
        x = alpha * x_g if beta == 0.0 else alpha * x_g + beta * x_b
        info = CPOInfo(
            case=case, case_id=CASE_IDS[case], q=q, r=r, s=s, A=A, B=B, lam=lam, nu=nu, c=c,
            delta=delta, predicted_objective=float(torch.dot(g, x)),
            predicted_constraint=c + float(torch.dot(b, x)),
            predicted_kl=0.5 * (alpha * alpha * q + 2 * alpha * beta * r + beta * beta * s),
        )  # fmt: skip
        return x.to(g.dtype), info

    if float(torch.dot(b, b)) <= b_tol:
        return finish("b_zero", 1 / lam_trpo, 0.0, 0.0, 0.0, 0.0, 0.0, lam_trpo, 0.0)

    r = float(torch.dot(g, x_b))
    s = max(float(torch.dot(b, x_b)), eps)
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

    # B > 0: minimise the convex dual D(λ) over λ ≥ 0 (module docstring), piece by piece.
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

    ``objective``, ``constraint`` and ``kl`` are measured at the parameters the module holds on
    return: the accepted ones, or θ_old (with the caller's old values and kl = 0) if none was.
    """

    accepted: bool
    step_fraction: float  # β^j of the accepted step; 0.0 when nothing was accepted
    steps_tried: int  # number of candidate fractions evaluated (1 … max_backtracks + 1)
    objective: float
    constraint: float
    kl: float


def backtracking_line_search(
    module: nn.Module,
    step: torch.Tensor,
    evaluate: Callable[[], tuple[float, float, float]],
    *,
    objective_old: float,
    constraint_old: float,
    max_kl: float,
    check_objective: bool,
    backtrack_coeff: float = 0.8,
    max_backtracks: int = 10,
) -> LineSearchResult:
    """Backtrack along a CPO/TRPO step until it is acceptable (Achiam et al. 2017, Sec. 6.3).

    Tries θ = θ_old + β^j·step for j = 0, 1, …, ``max_backtracks`` (β = ``backtrack_coeff``),
    writing each candidate into ``module`` and calling ``evaluate()`` (under ``no_grad``), which
    must return ``(objective, constraint, kl)`` at the module's current parameters: the surrogate
    objective to maximise, the surrogate constraint in cost form (feasible iff ≤ 0, as in
    :func:`cpo_step`) and the mean KL between the old and the candidate policy. The first
    candidate with all three finite and

    1. ``kl ≤ max_kl`` (no slack: pass e.g. ``1.5 * delta`` to allow some),
    2. ``constraint ≤ max(0, constraint_old)``: a feasible policy stays feasible, an infeasible one
       does not get worse (ties accepted),
    3. if ``check_objective``: ``objective ≥ objective_old`` (ties accepted). Pass
       ``check_objective = info.case in OBJECTIVE_CASES``: recovery steps (c ≥ 0) are judged on
       the constraint alone,

    is accepted and left in ``module``. If none is, θ_old is restored exactly.
    """
    if not 0 < backtrack_coeff < 1:
        raise ValueError(f"backtrack_coeff must be in (0, 1), got {backtrack_coeff}")
    if max_backtracks < 0:
        raise ValueError(f"max_backtracks must be >= 0, got {max_backtracks}")
    theta_old = flat_params(module)
    if step.shape != theta_old.shape:
        raise ValueError(
            f"step must have the shape of the flat parameters {tuple(theta_old.shape)}, "
            f"got {tuple(step.shape)}"
        )
    step = step.detach().to(theta_old.dtype)
    constraint_limit = max(0.0, float(constraint_old))
    for j in range(max_backtracks + 1):
        fraction = backtrack_coeff**j
        set_flat_params(module, theta_old + fraction * step)
        with torch.no_grad():
            objective, constraint, kl = (float(v) for v in evaluate())
        ok = (
            math.isfinite(objective)
            and math.isfinite(constraint)
            and math.isfinite(kl)
            and kl <= max_kl
            and constraint <= constraint_limit
            and (not check_objective or objective >= objective_old)
        )
        if ok:
            return LineSearchResult(True, fraction, j + 1, objective, constraint, kl)
    set_flat_params(module, theta_old)
    return LineSearchResult(
        False, 0.0, max_backtracks + 1, float(objective_old), float(constraint_old), 0.0
    )
