"""Training on exact expectations by replay (``rollouts="exact"``): no sampling, no critics.

A trace holds every round, so a batch's expected cost, set size and coverage under π, and
their gradients in logit space, are exact (:mod:`ccpo.learning.replay`). CCPO takes them over
the soft conformal rollout at κ_k (memberships σ((π − κ)/ε),
:func:`~ccpo.learning.replay.soft_set_rollout`), CPO over the point policy a_t ~ π
(:func:`~ccpo.learning.replay.point_rollout_expectations`). g = ∇(−E[cost] − λ E[size]) plus an
entropy bonus and b = −∇ P(covered) enter the CPO step with the trust region on π over every
state of the batch; κ then moves by the coverage of C_{π_{k+1},κ_k}. :func:`train_exact` is
the whole loop. Derivation: docs/theory.md, section "Departures from CCPO/CPO".
"""

from __future__ import annotations

import numpy as np

from ccpo.learning.config import TrainConfig
from ccpo.learning.heads import log_pi, softmax_log_jacobian
from ccpo.learning.replay import point_rollout_expectations, soft_set_rollout
from ccpo.learning.training.run import Run, TrainResult, rollout_entries
from ccpo.learning.training.update import (
    Surrogates,
    TrustRegion,
    cpo_update,
    entropy_and_grad,
)
from ccpo.traces.episodes import Episodes, conformal_rollout


def train_exact(run: Run) -> TrainResult:
    """The exact loop of CCPO (or CPO with ``cpo_rollouts="exact"``) on ``run``'s questions."""
    cfg, pi, allowed = run.cfg, run.pi, run.allowed
    B, T = cfg.exact_batch_size, run.ep.horizon
    point = cfg.method == "cpo"  # CPO: the point policy (its set size is 1)
    lam = run.lam_scaled  # λ and the entropy bonus are priced in mean rounds
    bonus = cfg.entropy * run.lam_unit / B
    every = np.ones((B, T), dtype=bool)  # every state of the batch is in the expectation
    for step in range(1, cfg.steps + 1):
        kappa = run.step_kappa()
        batch, x = run.sample_batch(B)
        sub = run.ep.subset(batch)
        expect = _expectations(sub, kappa, point, cfg, allowed)

        # 1–4. exact expectations at θ_k and the logit gradients of both surrogates
        logits_old = pi(x).reshape(B, T, 3)
        logp_old = log_pi(logits_old, allowed)
        probs_old = np.exp(logp_old)
        soft, u_r = expect(logits_old, w_cost=-1 / B, w_size=-lam / B)
        ent, d_ent = entropy_and_grad(logp_old)
        u_r = u_r + bonus * d_ent
        _, u_c = expect(logits_old, w_cov=-1 / B)
        hard = conformal_rollout(sub, probs_old, kappa)  # C_{π_k,κ_k}, exact by replay
        cov_old = float(soft.coverage.mean())
        # c in cost form. CCPO: the batch coverage of the hard C_{π_k,κ_k} (as the sampled
        # loop); CPO: the point policy's exact expected coverage
        c = (1 - cfg.alpha) - (cov_old if point else float(hard.covered.mean()))
        obj_old = float(-soft.cost.mean() - lam * soft.size.mean()) + bonus * ent

        # 5. CPO step on π, trust region KL(π_k ‖ π) over every state
        _, tape = pi.forward(x)
        trust = TrustRegion(logp_old, softmax_log_jacobian(probs_old), every)
        cpo = cpo_update(
            pi, x, tape, u_r.reshape(-1, 3), u_c.reshape(-1, 3), c, obj_old, cov_old, trust,
            _surrogates(expect, lam, bonus, allowed), cfg,
        )  # fmt: skip

        # 6. online κ from the coverage of C_{π_{k+1}, κ_k} on this batch
        new_probs = np.exp(log_pi(pi(x).reshape(B, T, 3), allowed))
        covered_new = float(conformal_rollout(sub, new_probs, kappa).covered.mean())
        run.tracker.update(covered_new)

        prefix = "point" if point else "soft"
        run.end_step(
            step,
            {
                "step": step,
                **rollout_entries(hard),
                f"{prefix}/cost": float(soft.cost.mean() / cfg.cost_scale * 100),
                f"{prefix}/coverage": cov_old,
                f"{prefix}/set_size": float(soft.size.mean()),
                # the surrogate this step constrains is the exact expected coverage (not J̄_C)
                "constraint/surrogate_violation": (1 - cfg.alpha) - cov_old,
                "constraint/c": c,
                "conformal/kappa": kappa,
                "conformal/coverage": covered_new,
                **cpo,
            },
        )
    return run.result()


def _expectations(sub: Episodes, kappa: float, point: bool, cfg: TrainConfig, allowed):
    """``expect(logits, w_cost, w_size, w_cov, grad)``: the batch's per-question expectations
    (cost, size, coverage) under the rollout of ``logits`` and, if ``grad``, the logit gradient
    of their weighted sum. CPO's point policy has set size 1: λ has nothing to act on."""
    cost = sub.round_cost * cfg.cost_scale

    def expect(logits, w_cost=0.0, w_size=0.0, w_cov=0.0, grad=True):
        if point:
            w = (w_cost, w_cov) if grad else None
            return point_rollout_expectations(logits, allowed, sub.correct, sub.solvable, cost, w)
        w = (w_cost, w_size, w_cov) if grad else None
        return soft_set_rollout(logits, allowed, sub.correct, sub.solvable, cost, kappa, cfg.eps, w)

    return expect


def _surrogates(expect, lam: float, bonus: float, allowed: np.ndarray) -> Surrogates:
    """The line search's surrogates at any θ: −E[cost] − λ E[size] + the entropy bonus, the
    expected coverage, and log π (the trust region's policy)."""

    def surrogates(logits: np.ndarray) -> tuple[float, float, np.ndarray]:
        o, _ = expect(logits, grad=False)
        logp = log_pi(logits, allowed)
        obj = float(-o.cost.mean() - lam * o.size.mean()) + bonus * entropy_and_grad(logp)[0]
        return obj, float(o.coverage.mean()), logp

    return surrogates
