"""CCPO (paper Algorithm 1) and its CPO baseline: one readable training loop.

Everything runs on replayed traces (no LLM calls). Per step k:

1. **Rollouts under π** (behaviour): a batch of ``batch_size`` training questions; at each round
   sample a_t ~ π(·|o_t) (``next`` masked at T); the episode ends at the first answer, t_f.
2. **Target policy.** CCPO: the stochastic conformal policy S_{π,κ} (paper Eq. ``sconf``), uniform
   over C_{π,κ}(o) = {a : π(a|o) ≥ κ}, made differentiable by the softmask σ((π − κ)/ε)
   (paper Eq. ``app``). CPO: the target is π itself (on-policy, ρ = 1).
3. **Rewards and constraint values** (paper §4, "Critic update"): r_t = −(API cost of round t)
   − 1{t = t_f}·λ|C(q)| (objective convention: we *maximise* minus the cost); for CCPO
   c_{t_f} = Π_{t ≤ t_f}|C(o_t)| · 1{answer correct} (1 if the question is unsolvable), so that
   the ρ-weighted episode value is the paper's surrogate
   J̄_C = E_π[Π_t ρ_t |C(o_t)| 1{π(Q) = Y*}] + P[Y* ∉ Y(Q)]; for CPO c_{t_f} = 1{covered}.
4. **Critics** V_θ and V_{C,φ}: L2 regression on V-trace targets (paper Eq. ``impala``) with
   ρ_t = min(1, S/π), c̄ = 1, the same weights for both; bootstrap only on truncation (never
   here: every episode ends with an answer by round T).
5. **CPO step** (paper Eq. ``policyupdate``; Achiam et al. 2017) in the objective convention
   of :mod:`ccpo.learning.trust_region`: g = ∇ of the reward surrogate, b = −∇ of the
   constraint surrogate, c = (1 − α) − J̄_C, all per episode (same units). Natural-gradient
   directions by conjugate gradient on Fisher-vector products of the mean KL(S_k ‖ S_θ); then
   a backtracking line search that restores θ when nothing is accepted.
6. **Online κ** (paper Eq. ``ccpo_decay`` with the sign corrected, see
   :mod:`ccpo.learning.conformal`): the batch coverage of C_{π_{k+1}, κ_k} (exact set-valued
   rollout) moves κ by η_k (covered − (1 − α)).

Where we depart from the paper (each switchable in :class:`TrainConfig`; the measurements
behind each are in ``docs/decisions.md``, "CCPO and CPO training"):

- ``trust_region="score"``: the KL trust region is on the score policy, KL(π_k ‖ π), not on
  KL(S_k ‖ S) (paper Eq. ``policyupdate``). With a sharp softmask S is a near-step function of π,
  so KL(S) does not restrain π away from the threshold, and π(next) ran to exactly 0.
- ``constraint_value="coverage"``: c = (1 − α) − (coverage of C_{π_k,κ_k} on the batch, exact by
  replay) instead of c = (1 − α) − J̄_C. J̄_C counts every correct answer in the set-valued tree
  (Π|C| weights), sits far above 1 − α, and so the constraint never binds and the policy learns
  nothing about correctness. J̄_C is still computed and logged
  (``constraint/surrogate_violation``), and b still comes from the constraint critic.
- ``eps=0.05`` instead of the paper's 0.01: with ε = 0.01 the softmask saturates and training
  stalls.
- ``kappa_update="calibrated"`` (CCPO, off by default): before each step κ is set to the
  split-conformal κ̂ of the current π on the fitted training questions (exact by replay), the
  threshold evaluation will put on the trained π; step 6 then only moves it within the step.
  CPO always keeps the paper's online κ (``cpo-online`` scores it).
- ``keep_best`` (on, ``select_on="train"``): every ``val_every`` steps the calibrated cost of π
  on the fitted training questions (κ̂ on random halves, cost on the others: what evaluation
  does with the final π) is logged as ``select/calibrated_cost`` (cents per question), and
  training ends at the checkpoint where ``select/score`` = that cost + λ c̄ · calibrated set
  size (the objective being trained; the cost alone at λ = 0) was least. The calibration
  split is never used. It applies to CPO too, so the baselines get the same selection.

**Exact expectations by replay** (``rollouts="exact"``, the default for CCPO): a trace holds
every round, so steps 1–4 need no sampling and no critics. :mod:`ccpo.learning.replay` gives,
per question, the exact expected cost, set size and coverage of the soft conformal rollout
(memberships σ((π − κ)/ε)) and their gradients in logit space; g = ∇(−E[cost] − λ E[size]) and
b = −∇ P(covered) then enter the same CPO step (trust region on π over every state of the batch),
and κ moves as in step 6. ``rollouts="sampled"`` is the paper's Algorithm 1 as above. CPO
keeps the sampled loop by default (``cpo_rollouts``; the rows stay the paper's baseline);
``cpo_rollouts="exact"`` trains it on the point policy's exact expectations
(:func:`ccpo.learning.replay.point_rollout_expectations`) in the same step.

λ is in units of the mean cost of one round on the training questions, so λ = 1 prices an
answer in the set like one more average round (paper: λ in raw reward units).

The final batch calibration on a calibration split is done by the caller (the evaluation
harness calibrates per evaluation split; :class:`ccpo.product.api.ConformalPolicy` on the data
it is given). Seeded and deterministic on CPU.

The loop runs in float64 numpy on :class:`~ccpo.learning.nets.NumpyMLP` copies of the torch
networks (which give the initial weights and hold the result): the networks are so small that
torch's per-operator dispatch cost several times the arithmetic. Gradients are one reverse pass
through π with the heads' logit-space Jacobians (:mod:`ccpo.learning.heads`); the conjugate
gradient runs in the span of the logits' parameter gradients, where g and b live, on the
network's output Gram matrix (:func:`~ccpo.learning.trust_region.span_conjugate_gradient`,
:meth:`~ccpo.learning.nets.NumpyMLP.output_gram`); the critics use
:class:`~ccpo.learning.optim.Adam`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ccpo.learning.config import Method, TrainConfig
from ccpo.learning.conformal import OnlineThreshold
from ccpo.learning.heads import (
    log_pi,
    log_softmask,
    log_softmask_jacobian,
    masked_kl,
    policy_probs,
    softmax_log_jacobian,
)
from ccpo.learning.nets import NumpyMLP, PolicyNet, ValueNet, torch
from ccpo.learning.optim import Adam
from ccpo.learning.replay import (
    calibrate_kappa,
    calibrated_cost,
    point_rollout_expectations,
    soft_set_rollout,
)
from ccpo.learning.trust_region import (
    OBJECTIVE_CASES,
    backtracking_line_search,
    cpo_step,
    logit_fisher_blocks,
    span_conjugate_gradient,
)
from ccpo.learning.vtrace import vtrace_targets
from ccpo.traces.episodes import (
    NEXT,
    Episodes,
    allowed_actions,
    conformal_rollout,
    point_rollout,
)


@dataclass
class TrainResult:
    """What training produces: the score network, normalisation, κ and the log."""

    policy: PolicyNet
    obs_mean: np.ndarray
    obs_std: np.ndarray
    kappa_online: float
    config: TrainConfig
    log: list[dict[str, float]] = field(default_factory=list)

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """π(a|o) for observations [..., T, F] (``next`` masked at the last round)."""
        return policy_probs(self.policy, obs, self.obs_mean, self.obs_std)


def target_log_probs(
    logits: np.ndarray, kappa: float, eps: float, method: Method, allowed: np.ndarray
) -> np.ndarray:
    """log of the target policy: S_{π,κ} for CCPO (:func:`ccpo.learning.heads.log_softmask`,
    paper Eqs. ``sconf`` and ``app``), π itself for CPO."""
    if method == "cpo":
        return log_pi(logits, allowed)
    return log_softmask(logits, allowed, kappa, eps)


def _episode_masks(actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """valid [B, T] (t ≤ t_f) and the index t_f [B] of the first answer action."""
    t_f = (actions != NEXT).argmax(-1)
    return np.arange(actions.shape[-1])[None, :] <= t_f[:, None], t_f


def _taken(values: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """values[b, t, actions[b, t]]."""
    return np.take_along_axis(values, actions[..., None], -1)[..., 0]


def train(
    ep: Episodes,
    train_idx: np.ndarray,
    cfg: TrainConfig,
    progress: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train a CCPO (or CPO) policy on the episodes at ``train_idx``. See the module docstring."""
    rng = np.random.default_rng([cfg.seed, 0xCC90])
    torch.manual_seed(cfg.seed)  # the networks' initial weights
    # tiny matrices: one thread is faster (and two training processes share 2 cores). Torch
    # only builds the initial weights, but its orthogonal init (a QR) took 124 ms instead of
    # 0.3 ms per layer with two intra-op threads on a busy 2-core machine.
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            return _train(ep, np.asarray(train_idx), cfg, rng, progress)
    finally:
        torch.set_num_threads(torch_threads)


def _train(ep, train_idx, cfg, rng, progress) -> TrainResult:
    T, n_feat = ep.horizon, ep.obs.shape[-1]
    exact = (cfg.rollouts if cfg.method == "ccpo" else cfg.cpo_rollouts) == "exact"
    B = cfg.exact_batch_size if exact else cfg.batch_size
    perm = rng.permutation(train_idx)
    n_val = int(len(perm) * cfg.val_frac) if cfg.val_every and len(perm) >= 50 else 0
    val_idx, fit_idx = perm[:n_val], perm[n_val:]

    flat_obs = ep.obs[fit_idx].reshape(-1, n_feat).astype(np.float64)
    obs_mean, obs_std = flat_obs.mean(0), flat_obs.std(0) + 1e-6
    obs_all = (ep.obs - obs_mean) / obs_std
    cost_all = ep.round_cost * cfg.cost_scale
    allowed = allowed_actions(T)
    lam_unit = float(cost_all[fit_idx].mean())  # c̄: mean round cost in reward units
    lam_scaled = cfg.lam * lam_unit  # λ in mean rounds → reward units
    lam_cents = lam_scaled / cfg.cost_scale * 100  # the same λ in cents per answer

    # initial weights from the torch modules (the saved artifact); training runs in float64 numpy
    policy = PolicyNet(n_feat, hidden=cfg.hidden, layers=cfg.layers)
    pi = NumpyMLP(policy.body)
    # the critics V_θ and V_{C,φ} live in one parameter vector with one Adam
    critic_bodies = [ValueNet(n_feat, hidden=cfg.hidden, layers=cfg.layers).body for _ in "vc"]
    n_critic = NumpyMLP(critic_bodies[0]).size
    critic_theta, critic_grad = np.zeros(2 * n_critic), np.zeros(2 * n_critic)
    critics = [
        NumpyMLP(body, critic_theta[k * n_critic : (k + 1) * n_critic])
        for k, body in enumerate(critic_bodies)
    ]
    critic_opt = Adam(critic_theta.size, cfg.critic_lr)
    tracker = OnlineThreshold(alpha=cfg.alpha, kappa=cfg.kappa0, eta0=cfg.eta0, xi=cfg.xi)
    log: list[dict[str, float]] = []
    best: tuple[float, int, np.ndarray] | None = None  # (select/score, step, θ)
    rows = np.arange(B)
    avg_start = int(cfg.average_from * cfg.steps)
    theta_sum = np.zeros_like(pi.theta)

    # the fitted questions as episodes, for the calibrated κ and keep_best's checkpoint score
    calibrated_kappa = cfg.method == "ccpo" and cfg.kappa_update == "calibrated"
    needs_fit_ep = calibrated_kappa or (cfg.keep_best and cfg.select_on == "train")
    fit_ep = ep.subset(fit_idx) if needs_fit_ep else None

    def fit_probs() -> np.ndarray:
        """π(·|o) of the current θ on every fitted training question ([n_fit, T, 3])."""
        return np.exp(log_pi(pi(obs_all[fit_idx]), allowed))

    for step in range(1, cfg.steps + 1):
        if calibrated_kappa:  # κ̂ of the current π on every training question
            tracker.kappa = float(calibrate_kappa(fit_ep, fit_probs(), cfg.alpha))
        kappa = tracker.kappa
        batch = rng.choice(fit_idx, size=B, replace=len(fit_idx) < B)
        x = obs_all[batch].reshape(B * T, n_feat)

        if exact:
            entry = _exact_step(step, pi, x, ep.subset(batch), kappa, cfg, allowed, lam_unit)
            tracker.update(entry["conformal/coverage"])
        else:
            # 1. rollouts under the behaviour policy π
            logits_old = pi(x).reshape(B, T, 3)
            logp_old_all = log_pi(logits_old, allowed)
            probs_old = np.exp(logp_old_all)
            u = rng.random((B, T, 1))
            actions = np.minimum((probs_old.cumsum(-1) < u).sum(-1), 2)  # inverse-CDF sampling
            actions[:, -1] = np.minimum(actions[:, -1], 1)  # 'next' is masked at round T
            valid, t_f = _episode_masks(actions)
            logp_b = _taken(logp_old_all, actions)

            # 2. target policy S and importance weights ρ = S/π (clipped at 1 inside V-trace)
            jac_pi = softmax_log_jacobian(probs_old)  # ∂ log π / ∂ logits
            if cfg.method == "cpo":
                logS_old_all, jac_S = logp_old_all, jac_pi
            else:
                logS_old_all, jac_S = log_softmask_jacobian(logits_old, allowed, kappa, cfg.eps)
            logS_old = _taken(logS_old_all, actions)
            ratio = np.exp(logS_old - logp_b)
            rho = np.minimum(ratio, 1.0)

            # 3. the conformal policy C_{π_k,κ_k} on these questions (exact, by replay)
            sub = ep.subset(batch)
            set_metrics = conformal_rollout(sub, probs_old, kappa)
            hit = sub.correct[rows, t_f, actions[rows, t_f]]
            solvable = sub.solvable
            if cfg.method == "ccpo":
                e = np.where(sub.allowed, probs_old, -np.inf)
                in_c = e >= kappa
                in_c[rows[:, None], np.arange(T), e.argmax(-1)] = True
                weight = (
                    np.where(valid, in_c.sum(-1), 1).prod(-1).astype(np.float64)
                )  # Π_t |C(o_t)|
                c_final = np.where(solvable, weight * hit, 1.0)
            else:
                c_final = (hit | ~solvable).astype(np.float64)
            at_tf = np.arange(T)[None, :] == t_f[:, None]
            round_cost = cost_all[batch]
            rewards = -round_cost * valid - at_tf * lam_scaled * set_metrics.set_size[:, None]
            cvals = at_tf * c_final[:, None]
            discounts = (~at_tf).astype(np.float64)
            # J̄_C on this batch (paper §4): E_π[Π_t ρ_t |C(o_t)| 1{correct}] + P[not solvable]
            rho_prod = np.where(valid, rho, 1.0).prod(-1)
            jbar_c = float(np.where(solvable, rho_prod * c_final, 1.0).mean())

            # 4. critics: V-trace targets with ρ = min(1, S/π), c̄ = 1; L2 regression
            n_valid = int(valid.sum())
            targets = [
                vtrace_targets(net(x).reshape(B, T), np.zeros(B), r, discounts, ratio, mask=valid)
                for net, r in zip(critics, (rewards, cvals), strict=True)
            ]
            for _ in range(cfg.critic_iters):
                losses = []  # of the last iteration, before its step
                for k, (net, vt) in enumerate(zip(critics, targets, strict=True)):
                    out, net_tape = net.forward(x)
                    err = np.where(valid, out.reshape(B, T) - vt.vs, 0.0)
                    losses.append(float((err * err).sum() / n_valid))
                    grad = critic_grad[k * n_critic : (k + 1) * n_critic]
                    net.vjp(net_tape, (2 / n_valid) * err.reshape(-1, 1), out=grad)
                critic_opt.step(critic_theta, critic_grad)
            vt_r, vt_c = targets
            adv = vt_r.pg_advantages[valid]
            scale = adv.std(ddof=1) if adv.size > 1 else 0.0
            adv_r = np.where(valid, (vt_r.pg_advantages - adv.mean()) / (scale + 1e-8), 0.0)
            adv_c = np.where(valid, vt_c.pg_advantages - vt_c.pg_advantages[valid].mean(), 0.0)

            # 5. CPO step on π: surrogates are sums over an episode's steps, averaged over episodes.
            # At θ_k the importance weight S/S_k is 1, so ∇ of Σ w·A is Σ A ∇ log S(a) = Zᵀu with
            # Z = ∂ logits / ∂θ over the valid states and u = A · J[a, :] / B in logit space
            # (J = ∂ log S / ∂ logits): one reverse pass through π.
            _, tape = pi.forward(x[valid.reshape(-1)])
            jac_taken = _taken_rows(jac_S, actions)[valid]  # [N, 3]
            u_r = adv_r[valid][:, None] * jac_taken / B
            u_c = -adv_c[valid][:, None] * jac_taken / B
            g, b = pi.vjp(tape, u_r), pi.vjp(tape, u_c)
            obj_old, con_old = float(adv_r.sum() / B), float(adv_c.sum() / B)
            # c in cost form, per episode. CPO: the point policy's coverage (J̄_C with ρ = 1).
            # CCPO: the batch coverage of C_{π_k,κ_k} (default) or the paper's surrogate J̄_C.
            use_surrogate = cfg.method == "cpo" or cfg.constraint_value == "surrogate"
            c = (1 - cfg.alpha) - (jbar_c if use_surrogate else float(set_metrics.covered.mean()))

            if cfg.trust_region == "score":  # the policy whose KL bounds the step: π or S
                trust_old, jac_trust = logp_old_all, jac_pi
            else:
                trust_old, jac_trust = logS_old_all, jac_S

            def trust_log_probs(logits: np.ndarray) -> np.ndarray:
                if cfg.trust_region == "score":
                    return log_pi(logits, allowed)
                return target_log_probs(logits, kappa, cfg.eps, cfg.method, allowed)

            info, ls = None, None  # stays None when the softmask is flat: nothing to learn here
            if np.any(g) or np.any(b):
                # H⁻¹g and H⁻¹b by conjugate gradient on the trust region's Fisher, run in the span
                # of Zᵀ where g and b live (same iterates, N·3-dimensional vectors)
                gram = pi.output_gram(tape)
                blocks = logit_fisher_blocks(jac_trust[valid], np.exp(trust_old[valid]))
                x_g = pi.vjp(
                    tape, span_conjugate_gradient(gram, blocks, u_r, cfg.damping, cfg.cg_iters)
                )
                x_b = b
                if np.any(b):
                    a_b = span_conjugate_gradient(gram, blocks, u_c, cfg.damping, cfg.cg_iters)
                    x_b = pi.vjp(tape, a_b)
                direction, info = cpo_step(g, b, c, cfg.delta, x_g, x_b)

                def evaluate(theta: np.ndarray) -> tuple[float, float, float]:
                    pi.theta[:] = theta
                    logits = pi(x).reshape(B, T, 3)
                    logS = _taken(
                        target_log_probs(logits, kappa, cfg.eps, cfg.method, allowed), actions
                    )
                    with np.errstate(over="ignore", invalid="ignore"):
                        w = np.where(valid, np.exp(logS - logS_old), 0.0)
                    o, cn = float((w * adv_r).sum() / B), float((w * adv_c).sum() / B)
                    return (
                        o,
                        c - (cn - con_old),
                        masked_kl(trust_old, trust_log_probs(logits), valid),
                    )

                ls = _line_search(pi, direction, evaluate, obj_old, c, info, cfg)

            # 6. online κ from the coverage of C_{π_{k+1}, κ_k} on this batch
            new_probs = np.exp(log_pi(pi(x).reshape(B, T, 3), allowed))
            covered_new = float(conformal_rollout(sub, new_probs, kappa).covered.mean())
            tracker.update(covered_new)

            entry = {
                "step": step,
                "train/cost": float(set_metrics.cost.mean() * 100),
                "train/coverage": float(set_metrics.covered.mean()),
                "train/set_size": float(set_metrics.set_size.mean()),
                "train/length": float(set_metrics.length.mean()),
                "train/pi_cost": float((round_cost * valid).sum(-1).mean() / cfg.cost_scale * 100),
                "train/pi_coverage": float((hit | ~solvable).mean()),
                "constraint/jbar_c": jbar_c,
                "constraint/surrogate_violation": (1 - cfg.alpha) - jbar_c,
                "constraint/c": c,
                "conformal/kappa": kappa,
                "conformal/coverage": covered_new,
                "critic/v_loss": losses[0],
                "critic/vc_loss": losses[1],
                **_cpo_log(info, ls),
            }
        if step > avg_start:
            theta_sum += pi.theta
        at_check = cfg.val_every and (step % cfg.val_every == 0 or step == cfg.steps)
        if at_check and n_val:
            entry.update(_validate(ep, val_idx, pi, obs_mean, obs_std, tracker.kappa, cfg))
        if at_check and cfg.keep_best and (n_val or cfg.select_on == "train"):
            if cfg.select_on == "train":
                got = calibrated_cost(fit_ep, fit_probs(), cfg.alpha, seed=cfg.seed)
                cost, size = got.cost * 100, got.set_size
            else:
                cost, size = entry["val/calibrated_cost"], entry["val/calibrated_set_size"]
            # the objective training minimises, in cents per question: cost + λ c̄ · set size
            score = cost + lam_cents * size
            entry["select/calibrated_cost"] = float(cost)
            entry["select/score"] = float(score)
            if best is None or score < best[0]:
                best = (score, step, pi.theta.copy())
        log.append(entry)
        if progress is not None:
            progress(step, entry)

    if cfg.keep_best and best is not None:
        pi.theta[:] = best[2]
        log[-1]["train/best_step"] = float(best[1])
    elif avg_start < cfg.steps:
        pi.theta[:] = theta_sum / (cfg.steps - avg_start)
    pi.copy_to(policy.body)
    return TrainResult(policy, obs_mean, obs_std, tracker.kappa, cfg, log)


def _line_search(pi, direction, evaluate, obj_old: float, c: float, info, cfg):
    """Backtrack along the CPO step from π's θ (objective checked only in objective cases);
    leaves π at the accepted θ (or at θ_k when nothing is accepted)."""
    theta, ls = backtracking_line_search(
        pi.theta.copy(), direction, evaluate, objective_old=obj_old, constraint_old=c,
        max_kl=cfg.delta, check_objective=info.case in OBJECTIVE_CASES,
        backtrack_coeff=cfg.backtrack_coeff, max_backtracks=cfg.max_backtracks,
    )  # fmt: skip
    pi.theta[:] = theta
    return ls


def _cpo_log(info, ls) -> dict[str, float]:
    """The ``cpo/*`` diagnostics of one step (case −1 / NaN when there was nothing to step)."""
    return {
        "cpo/case": -1.0 if info is None else float(info.case_id),
        "cpo/lambda": math.nan if info is None else info.lam,
        "cpo/nu": math.nan if info is None else info.nu,
        "cpo/kl": 0.0 if ls is None else ls.kl,
        "cpo/accepted": 0.0 if ls is None else float(ls.accepted),
        "cpo/backtracks": 0.0 if ls is None else float(ls.steps_tried - 1),
    }


def entropy_and_grad(logp: np.ndarray) -> tuple[float, np.ndarray]:
    """Σ over states of H(π) = −Σ_a π log π and its gradient in logit space,
    ∂H/∂z_j = −π_j (log π_j + H) (0 on masked actions). ``logp`` [..., A] (−inf = masked)."""
    p = np.exp(logp)
    plogp = p * np.where(p > 0, logp, 0.0)
    h = -plogp.sum(-1, keepdims=True)
    grad = -(plogp + p * h)
    return float(h.sum()), grad


def _exact_step(step, pi, x, sub, kappa, cfg, allowed, lam_unit) -> dict[str, float]:
    """One step on exact expectations by replay (steps 1–5 of the module docstring with
    nothing sampled). CCPO: the soft conformal rollout
    (:func:`ccpo.learning.replay.soft_set_rollout`); CPO: the point policy a_t ~ π
    (:func:`ccpo.learning.replay.point_rollout_expectations`).

    g = ∇ of −E[cost] − λ E[size] and b = −∇ P(covered) are exact per batch (one reverse pass
    through π from their logit-space gradients); c = (1 − α) − the batch coverage of the hard
    C_{π_k,κ_k} (CCPO, as in the sampled variant) or of the point policy (CPO, its exact
    expectation); the trust region is KL(π_k ‖ π) over every state of the batch's questions
    (every round is in the expectation). Updates π in place and returns the log entry (with
    ``conformal/coverage`` of C_{π_{k+1},κ_k} for the κ step)."""
    B, T = sub.n, sub.horizon
    lam_scaled = cfg.lam * lam_unit  # λ and the entropy bonus are priced in mean rounds
    cost = sub.round_cost * cfg.cost_scale
    point = cfg.method == "cpo"

    def expect(logits, w_cost=0.0, w_size=0.0, w_cov=0.0, grad=True):
        """Per-question expectations and (if ``grad``) the logit gradient of the weighted sum."""
        if point:  # the set size of a point policy is 1: λ has nothing to act on
            w = (w_cost, w_cov) if grad else None
            return point_rollout_expectations(logits, allowed, sub.correct, sub.solvable, cost, w)
        w = (w_cost, w_size, w_cov) if grad else None
        return soft_set_rollout(logits, allowed, sub.correct, sub.solvable, cost, kappa, cfg.eps, w)

    logits_old = pi(x).reshape(B, T, 3)
    logp_old = log_pi(logits_old, allowed)
    probs_old = np.exp(logp_old)
    soft, u_r = expect(logits_old, w_cost=-1 / B, w_size=-lam_scaled / B)
    bonus = cfg.entropy * lam_unit / B
    ent, d_ent = entropy_and_grad(logp_old)
    u_r = u_r + bonus * d_ent
    _, u_c = expect(logits_old, w_cov=-1 / B)
    hard = conformal_rollout(sub, probs_old, kappa)
    cov_old = float(soft.coverage.mean())
    c = (1 - cfg.alpha) - (cov_old if point else float(hard.covered.mean()))
    obj_old = float(-soft.cost.mean() - lam_scaled * soft.size.mean()) + bonus * ent
    every = np.ones((B, T), dtype=bool)
    u_r, u_c = u_r.reshape(-1, 3), u_c.reshape(-1, 3)
    _, tape = pi.forward(x)
    g, b = pi.vjp(tape, u_r), pi.vjp(tape, u_c)
    info, ls = None, None
    if np.any(g) or np.any(b):
        gram = pi.output_gram(tape)
        blocks = logit_fisher_blocks(softmax_log_jacobian(probs_old).reshape(-1, 3, 3),
                                     probs_old.reshape(-1, 3))  # fmt: skip
        x_g = pi.vjp(tape, span_conjugate_gradient(gram, blocks, u_r, cfg.damping, cfg.cg_iters))
        x_b = b
        if np.any(b):
            x_b = pi.vjp(
                tape, span_conjugate_gradient(gram, blocks, u_c, cfg.damping, cfg.cg_iters)
            )
        direction, info = cpo_step(g, b, c, cfg.delta, x_g, x_b)

        def evaluate(theta: np.ndarray) -> tuple[float, float, float]:
            pi.theta[:] = theta
            logits = pi(x).reshape(B, T, 3)
            o, _ = expect(logits, grad=False)
            obj = float(-o.cost.mean() - lam_scaled * o.size.mean())
            obj += bonus * entropy_and_grad(log_pi(logits, allowed))[0]
            kl = masked_kl(logp_old, log_pi(logits, allowed), every)
            return obj, c - (float(o.coverage.mean()) - cov_old), kl

        ls = _line_search(pi, direction, evaluate, obj_old, c, info, cfg)
    new_probs = np.exp(log_pi(pi(x).reshape(B, T, 3), allowed))
    prefix = "point" if point else "soft"
    return {
        "step": step,
        "train/cost": float(hard.cost.mean() * 100),
        "train/coverage": float(hard.covered.mean()),
        "train/set_size": float(hard.set_size.mean()),
        "train/length": float(hard.length.mean()),
        f"{prefix}/cost": float(soft.cost.mean() / cfg.cost_scale * 100),
        f"{prefix}/coverage": cov_old,
        f"{prefix}/set_size": float(soft.size.mean()),
        # the surrogate this step constrains is the exact expected coverage (not J̄_C)
        "constraint/surrogate_violation": (1 - cfg.alpha) - cov_old,
        "constraint/c": c,
        "conformal/kappa": kappa,
        "conformal/coverage": float(conformal_rollout(sub, new_probs, kappa).covered.mean()),
        **_cpo_log(info, ls),
    }


def _taken_rows(jac: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """jac[b, t, actions[b, t], :] for per-state Jacobians ``[B, T, A, A]``."""
    return np.take_along_axis(jac, actions[..., None, None], -2)[..., 0, :]


def _validate(ep, val_idx, pi, mean, std, kappa, cfg) -> dict[str, float]:
    probs = policy_probs(pi, ep.obs[val_idx], mean, std)
    sub = ep.subset(val_idx)
    m = conformal_rollout(sub, probs, kappa)
    # score quality for the final batch calibration: cost at the κ̂ that reaches 1 − α here
    kappa_hat = calibrate_kappa(sub, probs, cfg.alpha)
    mc = conformal_rollout(sub, probs, float(kappa_hat))
    out = {
        "val/calibrated_cost": float(mc.cost.mean() * 100),
        "val/calibrated_coverage": float(mc.covered.mean()),
        "val/calibrated_set_size": float(mc.set_size.mean()),
        "val/coverage": float(m.covered.mean()),
        "val/length": float(m.length.mean()),
        "val/cost": float(m.cost.mean() * 100),
        "val/set_size": float(m.set_size.mean()),
    }
    if cfg.method == "cpo":
        greedy = np.where(sub.allowed, probs, -1).argmax(-1)
        pm = point_rollout(sub, greedy)
        out.update(
            {
                "val/point_coverage": float(pm.covered.mean()),
                "val/point_length": float(pm.length.mean()),
            }
        )
    return out


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
