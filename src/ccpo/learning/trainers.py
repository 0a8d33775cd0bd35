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

Where we depart from the paper, and why (each switchable in :class:`TrainConfig`; measured on
the synthetic traces of ``ccpo.sim``, α = 0.1, 1000 steps, 100 evaluation splits):

- ``trust_region="score"``: the KL trust region is on the score policy, KL(π_k ‖ π), not on
  KL(S_k ‖ S) (paper Eq. ``policyupdate``). With a sharp softmask S is a near-step function of π,
  so KL(S) does not restrain π away from the threshold: π(next) ran to exactly 0 (float32) within
  ~100 steps, after which neither the softmask gradient nor κ could bring it back (test cost
  46.7¢ vs 38.0¢ with the score trust region).
- ``constraint_value="coverage"``: c = (1 − α) − (coverage of C_{π_k,κ_k} on the batch, exact by
  replay) instead of c = (1 − α) − J̄_C. J̄_C counts every correct answer in the set-valued tree
  (Π|C| weights), sits far above 1 − α, and so the constraint never binds and the policy learns
  nothing about correctness. J̄_C is still computed and logged
  (``constraint/surrogate_violation``), and b still comes from the constraint critic.
- ``eps=0.05`` instead of the paper's 0.01: with ε = 0.01 the softmask saturates and training
  stalls (the same 38.0¢ after 1000 and 2000 steps); ε = 0.05 reached 27.4¢ at α = 0.1 and 13.8¢
  at α = 0.2 (cpo-batch: 29.5¢ and 20.4¢).

The final batch calibration on a calibration split is done by the caller (the evaluation
harness calibrates per evaluation split; :class:`ccpo.product.api.ConformalPolicy` on the data
it is given). Seeded and deterministic on CPU.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from ccpo.learning.conformal import OnlineThreshold, split_conformal_threshold
from ccpo.learning.nets import (
    NumpyMLP,
    PolicyNet,
    ValueNet,
    masked_log_probs,
    masked_probs,
    mlp_jacobian,
)
from ccpo.learning.trust_region import (
    OBJECTIVE_CASES,
    backtracking_line_search,
    categorical_fisher_vector_product_fn,
    conjugate_gradient,
    cpo_step,
    flat_grad,
)
from ccpo.learning.vtrace import vtrace_targets
from ccpo.traces.episodes import (
    NEXT,
    Episodes,
    conformal_rollout,
    covering_scores,
    point_rollout,
)

Method = Literal["ccpo", "cpo"]
TrustRegion = Literal["score", "target"]
ConstraintValue = Literal["coverage", "surrogate"]


@dataclass
class TrainConfig:
    """Hyperparameters (paper §5 "Training" defaults where the paper gives them)."""

    method: Method = "ccpo"  # "ccpo": target S_{π,κ}; "cpo": target π (pointwise CPO)
    alpha: float = 0.1  # miscoverage level α
    lam: float = 0.0  # λ, set-size penalty in USD per answer in the final reward
    steps: int = 2000  # training steps (paper: 1500-2000)
    batch_size: int = 10  # questions per step (paper: 10)
    hidden: int = 64  # hidden units per layer (paper: 64)
    layers: int = 3  # layers of policy and critics (paper: 3)
    critic_lr: float = 1e-3  # Adam learning rate of V_θ and V_{C,φ} (paper: 1e-3)
    critic_iters: int = 4  # critic gradient steps per training step
    delta: float = 0.01  # KL trust-region radius δ (paper: 0.01)
    eps: float = 0.05  # softmask temperature ε (paper: 0.01; see the module docstring)
    xi: float = 0.1  # decay exponent ξ of η_k = η_0 k^(−1/2−ξ) (paper: 0.1)
    eta0: float = 0.5  # initial online step η_0
    kappa0: float = 0.3  # initial threshold κ_0
    damping: float = 0.1  # Fisher damping in the conjugate-gradient solves
    cg_iters: int = 10  # conjugate-gradient iterations
    backtrack_coeff: float = 0.8  # line-search step shrink factor
    max_backtracks: int = 10  # line-search attempts after the full step
    cost_scale: float = 1e4  # rewards in units of 1e-4 USD (numerics only; steps are invariant)
    val_every: int = 100  # validation every N steps (0: never)
    val_frac: float = 0.1  # share of the training split held out for validation
    # end with the checkpoint of least validation calibrated cost. Off: the validation split is
    # small (10% of training), and on synthetic traces picking by it chose early, worse
    # checkpoints (cost ratio to random 0.85 instead of 0.59 at seed 3)
    keep_best: bool = False
    seed: int = 0  # seeds torch and numpy
    trust_region: TrustRegion = "score"  # KL of the trust region: "score" π or "target" S (paper)
    constraint_value: ConstraintValue = "coverage"  # c from batch coverage of C, or "surrogate" J̄_C

    def __post_init__(self) -> None:
        if self.method not in ("ccpo", "cpo"):
            raise ValueError(f"method must be 'ccpo' or 'cpo', got {self.method!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.trust_region not in ("score", "target"):
            raise ValueError(f"trust_region must be 'score' or 'target', got {self.trust_region!r}")
        if self.constraint_value not in ("coverage", "surrogate"):
            raise ValueError("constraint_value must be 'coverage' or 'surrogate'")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError("steps and batch_size must be positive")


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


def policy_probs(
    net: PolicyNet | NumpyMLP, obs: np.ndarray, mean: np.ndarray, std: np.ndarray
) -> np.ndarray:
    """Masked π(a|o) as float64 numpy for observations [..., T, F]: a float64 numpy forward
    (:class:`~ccpo.learning.nets.NumpyMLP`; pass one to reuse its weight copy), the one
    function every evaluation, calibration and live decision goes through."""
    forward = net if isinstance(net, NumpyMLP) else NumpyMLP(net.body)
    obs = np.asarray(obs)
    if obs.ndim < 2 or obs.shape[-1] != forward.in_dim:
        raise ValueError(f"obs must have shape [..., T, {forward.in_dim}], got {obs.shape}")
    logits = forward((obs - mean) / std)
    logits[..., -1, NEXT] = -np.inf  # 'next' is not allowed at the last round
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _allowed(T: int) -> torch.Tensor:
    m = torch.ones(T, 3, dtype=torch.bool)
    m[-1, NEXT] = False
    return m


def _masked_probs(logits: torch.Tensor, T: int) -> torch.Tensor:
    """π(a|o) over [..., T, 3] logits with ``next`` masked at the last round."""
    return masked_probs(logits, _allowed(T))


def target_log_probs(
    logits: torch.Tensor,
    kappa: float,
    eps: float,
    method: Method,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """log S(a|o) over all actions from the score network's logits [..., T, 3] (−inf if masked).

    CCPO: S_{π,κ}(a|o) ∝ σ((π(a|o) − κ)/ε) over the allowed actions (paper Eqs. ``sconf`` and
    ``app``). When every action is below κ this tends to {argmax π}, matching the empty-set
    fallback of C. CPO: S = π. ``allowed`` (boolean, broadcast to the logits) defaults to
    ``next`` masked at the last of the T rounds; pass it for logits of other shapes.
    """
    mask = _allowed(logits.shape[-2]) if allowed is None else allowed
    if method == "cpo":
        return masked_log_probs(logits, mask)
    log_sm = F.logsigmoid((masked_probs(logits, mask) - kappa) / eps).masked_fill(~mask, -torch.inf)
    return log_sm - torch.logsumexp(log_sm, dim=-1, keepdim=True)


def _episode_masks(actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """valid [B, T] (t ≤ t_f) and the index t_f [B] of the first answer action."""
    is_answer = actions != NEXT
    t_f = is_answer.to(torch.int64).argmax(dim=-1)
    steps = torch.arange(actions.shape[-1])
    return steps[None, :] <= t_f[:, None], t_f


def _kl(logp_old: torch.Tensor, logp_new: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid states of KL(old ‖ new) between categorical distributions."""
    p_old = logp_old.exp()
    terms = torch.where(p_old > 0, p_old * (logp_old - logp_new), torch.zeros_like(p_old))
    return terms.sum(-1)[valid].mean()


def _trust_region_fvp(
    pi: PolicyNet,
    x: torch.Tensor,
    valid: torch.Tensor,
    log_q_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    damping: float,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Fisher-vector product of the trust-region KL at θ_old: the mean over valid states of
    KL(q_old ‖ q_θ), q = π or S given per state by ``log_q_fn(logits, allowed)``, from the
    Jacobian G = ∂ log q / ∂θ (:func:`ccpo.learning.nets.mlp_jacobian` with log q as the head):
    see :func:`ccpo.learning.trust_region.categorical_fisher_vector_product_fn`."""
    allowed = _allowed(x.shape[-2]).expand(*valid.shape, -1)[valid]  # [N, 3]
    log_q, G = mlp_jacobian(pi.body, x[valid], head=lambda z: log_q_fn(z, allowed))
    return categorical_fisher_vector_product_fn(G, log_q.exp(), damping)


def train(
    ep: Episodes,
    train_idx: np.ndarray,
    cfg: TrainConfig,
    progress: Callable[[int, dict[str, float]], None] | None = None,
) -> TrainResult:
    """Train a CCPO (or CPO) policy on the episodes at ``train_idx``. See the module docstring."""
    rng = np.random.default_rng([cfg.seed, 0xCC90])
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: one thread is faster and deterministic
    try:
        return _train(ep, np.asarray(train_idx), cfg, rng, progress)
    finally:
        torch.set_num_threads(threads)


def _train(ep, train_idx, cfg, rng, progress) -> TrainResult:
    T = ep.horizon
    perm = rng.permutation(train_idx)
    n_val = int(len(perm) * cfg.val_frac) if cfg.val_every and len(perm) >= 50 else 0
    val_idx, fit_idx = perm[:n_val], perm[n_val:]

    flat_obs = ep.obs[fit_idx].reshape(-1, ep.obs.shape[-1]).astype(np.float64)
    obs_mean, obs_std = flat_obs.mean(0), flat_obs.std(0) + 1e-6
    obs_all = torch.as_tensor((ep.obs - obs_mean) / obs_std, dtype=torch.float32)
    cost_all = torch.as_tensor(ep.round_cost * cfg.cost_scale, dtype=torch.float32)
    correct_all = torch.as_tensor(ep.correct)
    solvable_all = torch.as_tensor(ep.solvable)

    pi = PolicyNet(ep.obs.shape[-1], hidden=cfg.hidden, layers=cfg.layers)
    v_net = ValueNet(ep.obs.shape[-1], hidden=cfg.hidden, layers=cfg.layers)
    vc_net = ValueNet(ep.obs.shape[-1], hidden=cfg.hidden, layers=cfg.layers)
    critic_params = [*v_net.parameters(), *vc_net.parameters()]
    # fused: one kernel for all parameters (3x faster than the per-tensor loop on CPU)
    critic_opt = torch.optim.Adam(critic_params, lr=cfg.critic_lr, fused=True)
    params = list(pi.parameters())
    tracker = OnlineThreshold(alpha=cfg.alpha, kappa=cfg.kappa0, eta0=cfg.eta0, xi=cfg.xi)
    log: list[dict[str, float]] = []
    best: tuple[float, int, dict] | None = None  # (validation calibrated cost, step, weights)

    for step in range(1, cfg.steps + 1):
        kappa = tracker.kappa
        batch = rng.choice(fit_idx, size=cfg.batch_size, replace=len(fit_idx) < cfg.batch_size)
        bt = torch.as_tensor(batch)
        x = obs_all[bt]  # [B, T, F]

        # 1. rollouts under the behaviour policy π
        with torch.no_grad():
            logits_old = pi(x)
            probs_old = _masked_probs(logits_old, T)  # [B, T, 3]
            logp_old_all = masked_log_probs(logits_old, _allowed(T))
            u = torch.as_tensor(rng.random((len(batch), T, 1)), dtype=torch.float32)
            actions = (probs_old.cumsum(-1) < u).sum(-1).clamp(max=2)  # inverse-CDF sampling
            actions[:, -1] = actions[:, -1].clamp(max=1)  # 'next' is masked at round T
            valid, t_f = _episode_masks(actions)
            logp_b = torch.log(probs_old.gather(-1, actions[..., None])[..., 0])

            # 2. target policy S and importance weights ρ = S/π (clipped at 1 inside V-trace)
            logS_old_all = target_log_probs(logits_old, kappa, cfg.eps, cfg.method)
            logS_old = logS_old_all.gather(-1, actions[..., None])[..., 0]
            ratio = torch.exp(logS_old - logp_b)
            rho = torch.clamp(ratio, max=1.0)

            # 3. the conformal policy C_{π_k,κ_k} on these questions (exact, by replay)
            sub = ep.subset(batch)
            set_metrics = conformal_rollout(sub, probs_old.double().numpy(), kappa)
            set_size = torch.as_tensor(set_metrics.set_size, dtype=torch.float32)
            bidx = torch.arange(len(batch))
            answered = actions[bidx, t_f]
            hit = correct_all[bt][bidx, t_f, answered]
            solvable = solvable_all[bt]
            if cfg.method == "ccpo":
                p_np = probs_old.double().numpy()
                e = np.where(sub.allowed, p_np, -np.inf)
                in_c = e >= kappa
                in_c[np.arange(len(batch))[:, None], np.arange(T), e.argmax(-1)] = True
                c_size = torch.as_tensor(in_c.sum(-1), dtype=torch.float32)  # |C(o_t)|
                weight = torch.where(valid, c_size, torch.ones_like(c_size)).prod(-1)
                c_final = torch.where(solvable, weight * hit.float(), torch.ones_like(weight))
            else:
                c_final = (hit | ~solvable).float()
            at_tf = torch.nn.functional.one_hot(t_f, T).bool()
            rewards = -cost_all[bt] * valid
            rewards = rewards - at_tf * (cfg.lam * cfg.cost_scale) * set_size[:, None]
            cvals = at_tf * c_final[:, None]
            discounts = (~at_tf).float()
            # J̄_C on this batch (paper §4): E_π[Π_t ρ_t |C(o_t)| 1{correct}] + P[not solvable]
            rho_prod = torch.where(valid, rho, torch.ones_like(rho)).prod(-1)
            jbar_c = float(torch.where(solvable, rho_prod * c_final, 1.0).mean())

        # 4. critics: V-trace targets with ρ = min(1, S/π), c̄ = 1; L2 regression
        def targets(net: ValueNet, r: torch.Tensor):
            with torch.no_grad():
                vals = net(x)
                out = vtrace_targets(vals, torch.zeros(len(batch)), r, discounts, ratio, mask=valid)
            return out

        vt_r, vt_c = targets(v_net, rewards), targets(vc_net, cvals)
        for _ in range(cfg.critic_iters):
            critic_opt.zero_grad()
            v_loss = ((v_net(x) - vt_r.vs)[valid] ** 2).mean()
            vc_loss = ((vc_net(x) - vt_c.vs)[valid] ** 2).mean()
            (v_loss + vc_loss).backward()
            critic_opt.step()
        adv_r = vt_r.pg_advantages
        adv_r = torch.where(valid, (adv_r - adv_r[valid].mean()) / (adv_r[valid].std() + 1e-8), 0)
        adv_c = torch.where(valid, vt_c.pg_advantages - vt_c.pg_advantages[valid].mean(), 0)

        # 5. CPO step on π: surrogates are sums over an episode's steps, averaged over episodes
        def trust_log_probs(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
            """log of the policy whose KL bounds the step: π ("score") or S ("target")."""
            if cfg.trust_region == "score":
                return masked_log_probs(logits, allowed)
            return target_log_probs(logits, kappa, cfg.eps, cfg.method, allowed)

        trust_old = logp_old_all if cfg.trust_region == "score" else logS_old_all

        def surrogates() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            logits = pi(x)
            logS_all = target_log_probs(logits, kappa, cfg.eps, cfg.method)
            logS = logS_all.gather(-1, actions[..., None])[..., 0]
            w = torch.where(valid, torch.exp(logS - logS_old), 0)
            n = len(batch)
            kl = _kl(trust_old, trust_log_probs(logits, _allowed(T)), valid)
            return (w * adv_r).sum() / n, (w * adv_c).sum() / n, kl

        obj, con, _ = surrogates()
        g = flat_grad(obj, params, retain_graph=True)
        b = -flat_grad(con, params, retain_graph=True)
        # c in cost form, per episode. CPO: the point policy's coverage (J̄_C with ρ = 1).
        # CCPO: the batch coverage of C_{π_k,κ_k} (default) or the paper's surrogate J̄_C.
        use_surrogate = cfg.method == "cpo" or cfg.constraint_value == "surrogate"
        c = (1 - cfg.alpha) - (jbar_c if use_surrogate else float(set_metrics.covered.mean()))

        if torch.count_nonzero(g) == 0 and torch.count_nonzero(b) == 0:
            info, ls = None, None  # the softmask is flat here: nothing to learn from this batch
        else:
            fvp = _trust_region_fvp(pi, x, valid, trust_log_probs, cfg.damping)
            x_g = conjugate_gradient(fvp, g, cfg.cg_iters)
            x_b = conjugate_gradient(fvp, b, cfg.cg_iters) if torch.any(b != 0) else b
            direction, info = cpo_step(g, b, c, cfg.delta, x_g, x_b)
            obj_old, con_old = float(obj.detach()), float(con.detach())

            def evaluate() -> tuple[float, float, float]:
                o, cn, kl = surrogates()
                return float(o), c - (float(cn) - con_old), float(kl)

            ls = backtracking_line_search(
                pi, direction, evaluate, objective_old=obj_old, constraint_old=c,
                max_kl=cfg.delta, check_objective=info.case in OBJECTIVE_CASES,
                backtrack_coeff=cfg.backtrack_coeff, max_backtracks=cfg.max_backtracks,
            )  # fmt: skip

        # 6. online κ from the coverage of C_{π_{k+1}, κ_k} on this batch
        with torch.no_grad():
            new_probs = _masked_probs(pi(x), T).double().numpy()
        covered_new = float(conformal_rollout(sub, new_probs, kappa).covered.mean())
        tracker.update(covered_new)

        entry = {
            "step": step,
            "train/cost": float(set_metrics.cost.mean() * 100),
            "train/coverage": float(set_metrics.covered.mean()),
            "train/set_size": float(set_metrics.set_size.mean()),
            "train/length": float(set_metrics.length.mean()),
            "train/pi_cost": float(((cost_all[bt] * valid).sum(-1)).mean() / cfg.cost_scale * 100),
            "train/pi_coverage": float((hit | ~solvable).float().mean()),
            "constraint/jbar_c": jbar_c,
            "constraint/surrogate_violation": (1 - cfg.alpha) - jbar_c,
            "constraint/c": c,
            "conformal/kappa": kappa,
            "conformal/coverage": covered_new,
            "critic/v_loss": v_loss.item(),
            "critic/vc_loss": vc_loss.item(),
            "cpo/case": -1.0 if info is None else float(info.case_id),
            "cpo/lambda": math.nan if info is None else info.lam,
            "cpo/nu": math.nan if info is None else info.nu,
            "cpo/kl": 0.0 if ls is None else ls.kl,
            "cpo/accepted": 0.0 if ls is None else float(ls.accepted),
            "cpo/backtracks": 0.0 if ls is None else float(ls.steps_tried - 1),
        }
        if cfg.val_every and n_val and (step % cfg.val_every == 0 or step == cfg.steps):
            entry.update(_validate(ep, val_idx, pi, obs_mean, obs_std, tracker.kappa, cfg))
            if best is None or entry["val/calibrated_cost"] < best[0]:
                best = (entry["val/calibrated_cost"], step, copy.deepcopy(pi.state_dict()))
        log.append(entry)
        if progress is not None:
            progress(step, entry)

    if cfg.keep_best and best is not None:
        pi.load_state_dict(best[2])
        log[-1]["train/best_step"] = float(best[1])
    return TrainResult(pi, obs_mean, obs_std, tracker.kappa, cfg, log)


def _validate(ep, val_idx, pi, mean, std, kappa, cfg) -> dict[str, float]:
    probs = policy_probs(pi, ep.obs[val_idx], mean, std)
    sub = ep.subset(val_idx)
    m = conformal_rollout(sub, probs, kappa)
    # score quality for the final batch calibration: cost at the κ̂ that reaches 1 − α here
    kappa_hat = split_conformal_threshold(covering_scores(sub, probs), cfg.alpha)
    mc = conformal_rollout(sub, probs, float(kappa_hat))
    out = {
        "val/calibrated_cost": float(mc.cost.mean() * 100),
        "val/calibrated_coverage": float(mc.covered.mean()),
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
