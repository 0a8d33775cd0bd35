"""Training on sampled rollouts (``rollouts="sampled"``): the paper's Algorithm 1.

Per step: one path per question sampled under π (the behaviour policy); the target policy S
(CCPO: the softmask S_{π,κ}; CPO: π itself) and importance weights ρ = S/π; rewards (minus
the round costs and λ|C| at the answer) and constraint values; the critics V_θ and V_{C,φ}
regressed on V-trace targets (:class:`Critics`), whose advantages give the surrogates; the CPO
step on π; κ moved by the coverage of C_{π_{k+1},κ_k}. :func:`train_sampled` is the whole
loop, its steps numbered as in docs/theory.md, section "Departures from CCPO/CPO" (where the
derivation and the departures from the paper are).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ccpo.learning.config import TrainConfig
from ccpo.learning.heads import log_pi, log_softmask_jacobian, softmax_log_jacobian
from ccpo.learning.nets import NumpyMLP, value_net
from ccpo.learning.optim import Adam
from ccpo.learning.training.run import Run, TrainResult, rollout_entries
from ccpo.learning.training.update import (
    Surrogates,
    TrustRegion,
    cpo_update,
    target_log_probs,
)
from ccpo.learning.vtrace import VTraceOutput, vtrace_targets
from ccpo.traces.episodes import NEXT, conformal_rollout


def train_sampled(run: Run) -> TrainResult:
    """The sampled loop of CCPO or CPO on ``run``'s questions."""
    cfg, ep, pi, allowed = run.cfg, run.ep, run.pi, run.allowed
    B, T = cfg.batch_size, ep.horizon
    ccpo = cfg.method == "ccpo"
    rows, rounds = np.arange(B), np.arange(T)
    critics = Critics(ep.obs.shape[-1], cfg, run.init_rng)
    score_probs = partial(log_pi, allowed=allowed)
    for step in range(1, cfg.steps + 1):
        kappa = run.step_kappa()
        batch, x = run.sample_batch(B)
        sub = ep.subset(batch)

        # 1. rollouts under the behaviour policy π
        logits_old = pi(x).reshape(B, T, 3)
        logp_old_all = log_pi(logits_old, allowed)
        probs_old = np.exp(logp_old_all)
        u = run.rng.random((B, T, 1))
        actions = np.minimum((probs_old.cumsum(-1) < u).sum(-1), 2)  # inverse-CDF sampling
        actions[:, -1] = np.minimum(actions[:, -1], 1)  # 'next' is masked at round T
        valid, t_f = episode_masks(actions)
        logp_b = taken(logp_old_all, actions)

        # 2. target policy S and importance weights ρ = S/π (clipped at 1 inside V-trace)
        jac_pi = softmax_log_jacobian(probs_old)  # ∂ log π / ∂ logits
        if ccpo:
            logS_old_all, jac_S = log_softmask_jacobian(logits_old, allowed, kappa, cfg.eps)
        else:
            logS_old_all, jac_S = logp_old_all, jac_pi
        logS_old = taken(logS_old_all, actions)
        ratio = np.exp(logS_old - logp_b)
        rho = np.minimum(ratio, 1.0)

        # 3. rewards and constraint values; the conformal policy C_{π_k,κ_k} exact by replay
        set_metrics = conformal_rollout(sub, probs_old, kappa)
        hit = sub.correct[rows, t_f, actions[rows, t_f]]
        solvable = sub.solvable
        if ccpo:
            e = np.where(sub.allowed, probs_old, -np.inf)
            in_c = e >= kappa
            in_c[rows[:, None], rounds, e.argmax(-1)] = True
            weight = np.where(valid, in_c.sum(-1), 1).prod(-1).astype(np.float64)  # Π_t |C(o_t)|
            c_final = np.where(solvable, weight * hit, 1.0)
        else:
            c_final = (hit | ~solvable).astype(np.float64)
        at_tf = rounds[None, :] == t_f[:, None]
        round_cost = run.cost_all[batch]
        rewards = -round_cost * valid - at_tf * run.lam_scaled * set_metrics.set_size[:, None]
        cvals = at_tf * c_final[:, None]
        discounts = (~at_tf).astype(np.float64)
        # J̄_C on this batch (paper §4): E_π[Π_t ρ_t |C(o_t)| 1{correct}] + P[not solvable]
        rho_prod = np.where(valid, rho, 1.0).prod(-1)
        jbar_c = float(np.where(solvable, rho_prod * c_final, 1.0).mean())

        # 4. critics: V-trace targets with ρ = min(1, S/π), c̄ = 1; L2 regression
        (vt_r, vt_c), losses = critics.fit(x, (rewards, cvals), discounts, ratio, valid)
        adv = vt_r.pg_advantages[valid]
        scale = adv.std(ddof=1) if adv.size > 1 else 0.0
        adv_r = np.where(valid, (vt_r.pg_advantages - adv.mean()) / (scale + 1e-8), 0.0)
        adv_c = np.where(valid, vt_c.pg_advantages - vt_c.pg_advantages[valid].mean(), 0.0)

        # 5. CPO step on π: surrogates are sums over an episode's steps, averaged over episodes.
        # At θ_k the importance weight S/S_k is 1, so ∇ of Σ w·A is Σ A ∇ log S(a) = Zᵀu with
        # Z = ∂ logits / ∂θ over the valid states and u = A · J[a, :] / B in logit space
        # (J = ∂ log S / ∂ logits): one reverse pass through π.
        _, tape = pi.forward(x[valid.reshape(-1)])
        jac_taken = taken_rows(jac_S, actions)[valid]  # [N, 3]
        u_r = adv_r[valid][:, None] * jac_taken / B
        u_c = -adv_c[valid][:, None] * jac_taken / B
        obj_old, con_old = float(adv_r.sum() / B), float(adv_c.sum() / B)
        # c in cost form, per episode. CPO: the point policy's coverage (J̄_C with ρ = 1).
        # CCPO: the batch coverage of C_{π_k,κ_k} (default) or the paper's surrogate J̄_C.
        use_surrogate = not ccpo or cfg.constraint_value == "surrogate"
        c = (1 - cfg.alpha) - (jbar_c if use_surrogate else float(set_metrics.covered.mean()))
        # log S (CCPO) or log π (CPO) at any logits, for the line search
        target = partial(
            target_log_probs, kappa=kappa, eps=cfg.eps, method=cfg.method, allowed=allowed
        )
        if cfg.trust_region == "score":  # the policy whose KL bounds the step: π or S
            trust, trust_probs = TrustRegion(logp_old_all, jac_pi, valid), score_probs
        else:
            trust, trust_probs = TrustRegion(logS_old_all, jac_S, valid), target
        surrogates = _surrogates(target, trust_probs, actions, valid, logS_old, adv_r, adv_c)
        cpo = cpo_update(pi, x, tape, u_r, u_c, c, obj_old, con_old, trust, surrogates, cfg)

        # 6. online κ from the coverage of C_{π_{k+1}, κ_k} on this batch
        new_probs = np.exp(log_pi(pi(x).reshape(B, T, 3), allowed))
        covered_new = float(conformal_rollout(sub, new_probs, kappa).covered.mean())
        run.tracker.update(covered_new)

        run.end_step(
            step,
            {
                "step": step,
                **rollout_entries(set_metrics),
                "train/pi_cost": float((round_cost * valid).sum(-1).mean() / cfg.cost_scale * 100),
                "train/pi_coverage": float((hit | ~solvable).mean()),
                "constraint/jbar_c": jbar_c,
                "constraint/surrogate_violation": (1 - cfg.alpha) - jbar_c,
                "constraint/c": c,
                "conformal/kappa": kappa,
                "conformal/coverage": covered_new,
                "critic/v_loss": losses[0],
                "critic/vc_loss": losses[1],
                **cpo,
            },
        )
    return run.result()


class Critics:
    """V_θ (rewards) and V_{C,φ} (constraint values): two networks in one parameter vector
    with one Adam, regressed (L2) on V-trace targets over the valid states."""

    def __init__(self, n_feat: int, cfg: TrainConfig, rng: np.random.Generator) -> None:
        bodies = [value_net(n_feat, rng, hidden=cfg.hidden, layers=cfg.layers).layers for _ in "vc"]
        self.size = NumpyMLP(bodies[0]).size
        self.theta, self.grad = np.zeros(2 * self.size), np.zeros(2 * self.size)
        self.nets = [
            NumpyMLP(body, self.theta[k * self.size : (k + 1) * self.size])
            for k, body in enumerate(bodies)
        ]
        self.opt = Adam(self.theta.size, cfg.critic_lr)
        self.iters = cfg.critic_iters

    def fit(self, x, values, discounts, ratio, valid) -> tuple[list[VTraceOutput], list[float]]:
        """V-trace targets of both critics at their current weights (``values``: rewards and
        constraint values ``[B, T]``; no bootstrap), then ``critic_iters`` Adam steps towards
        them; the targets and the two losses of the last iteration, before its step."""
        B, T = valid.shape
        n_valid = int(valid.sum())
        targets = [
            vtrace_targets(net(x).reshape(B, T), np.zeros(B), r, discounts, ratio, mask=valid)
            for net, r in zip(self.nets, values, strict=True)
        ]
        losses: list[float] = []
        for _ in range(self.iters):
            losses = []
            for k, (net, vt) in enumerate(zip(self.nets, targets, strict=True)):
                out, tape = net.forward(x)
                err = np.where(valid, out.reshape(B, T) - vt.vs, 0.0)
                losses.append(float((err * err).sum() / n_valid))
                grad = self.grad[k * self.size : (k + 1) * self.size]
                net.vjp(tape, (2 / n_valid) * err.reshape(-1, 1), out=grad)
            self.opt.step(self.theta, self.grad)
        return targets, losses


def _surrogates(target, trust_probs, actions, valid, logS_old, adv_r, adv_c) -> Surrogates:
    """The line search's surrogates at any θ: the importance-weighted (S_θ/S_k at the sampled
    actions) sums of the reward and constraint advantages, averaged over episodes, and the
    log-probabilities of the trust region's policy."""
    B = valid.shape[0]

    def surrogates(logits: np.ndarray) -> tuple[float, float, np.ndarray]:
        logS = taken(target(logits), actions)
        with np.errstate(over="ignore", invalid="ignore"):
            w = np.where(valid, np.exp(logS - logS_old), 0.0)
        obj, con = float((w * adv_r).sum() / B), float((w * adv_c).sum() / B)
        return obj, con, trust_probs(logits)

    return surrogates


def episode_masks(actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """valid [B, T] (t ≤ t_f) and the index t_f [B] of the first answer action."""
    t_f = (actions != NEXT).argmax(-1)
    return np.arange(actions.shape[-1])[None, :] <= t_f[:, None], t_f


def taken(values: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """values[b, t, actions[b, t]]."""
    return np.take_along_axis(values, actions[..., None], -1)[..., 0]


def taken_rows(jac: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """jac[b, t, actions[b, t], :] for per-state Jacobians ``[B, T, A, A]``."""
    return np.take_along_axis(jac, actions[..., None, None], -2)[..., 0, :]
