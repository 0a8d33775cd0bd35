"""What both training loops share around their step: :class:`Run` and :class:`TrainResult`.

:class:`Run` holds the fitted/validation split of the training questions, the observation
normalisation, π (a float64 :class:`~ccpo.learning.nets.NumpyMLP`, its initial weights drawn
from :attr:`Run.init_rng`, see :mod:`ccpo.learning.nets`), the κ tracker, the log and the
checkpoints (``keep_best``, Polyak averaging). A loop asks it for each step's κ and batch,
hands it each step's log entry (:meth:`Run.end_step`: validation, checkpoint scores,
progress) and ends with :meth:`Run.result`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ccpo.learning.config import TrainConfig
from ccpo.learning.conformal import OnlineThreshold
from ccpo.learning.heads import log_pi, policy_probs
from ccpo.learning.nets import NumpyMLP, policy_net
from ccpo.learning.replay import calibrate_kappa, calibrated_cost
from ccpo.traces.episodes import (
    Episodes,
    Metrics,
    allowed_actions,
    conformal_rollout,
    point_rollout,
)

Progress = Callable[[int, dict[str, float]], None]


@dataclass
class TrainResult:
    """What training produces: the score network, normalisation, κ and the log."""

    policy: NumpyMLP
    obs_mean: np.ndarray
    obs_std: np.ndarray
    kappa_online: float
    config: TrainConfig
    log: list[dict[str, float]] = field(default_factory=list)

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """π(a|o) for observations [..., T, F] (``next`` masked at the last round)."""
        return policy_probs(self.policy, obs, self.obs_mean, self.obs_std)


class Run:
    """One training run's state outside the step: data, π, κ, log and checkpoints."""

    def __init__(
        self,
        ep: Episodes,
        train_idx: np.ndarray,
        cfg: TrainConfig,
        rng: np.random.Generator,
        progress: Progress | None = None,
    ) -> None:
        self.ep, self.cfg, self.rng, self.progress = ep, cfg, rng, progress
        n_feat = ep.obs.shape[-1]
        perm = rng.permutation(train_idx)
        n_val = int(len(perm) * cfg.val_frac) if cfg.val_every and len(perm) >= 50 else 0
        self.val_idx, self.fit_idx = perm[:n_val], perm[n_val:]

        # observations normalised by the fitted questions' mean and spread
        flat_obs = ep.obs[self.fit_idx].reshape(-1, n_feat).astype(np.float64)
        self.obs_mean, self.obs_std = flat_obs.mean(0), flat_obs.std(0) + 1e-6
        self.obs_all = (ep.obs - self.obs_mean) / self.obs_std
        self.cost_all = ep.round_cost * cfg.cost_scale  # rewards in units of 1/cost_scale USD
        self.allowed = allowed_actions(ep.horizon)
        self.lam_unit = float(self.cost_all[self.fit_idx].mean())  # c̄: mean round cost
        self.lam_scaled = cfg.lam * self.lam_unit  # λ in mean rounds → reward units
        self.lam_cents = self.lam_scaled / cfg.cost_scale * 100  # the same λ in cents per answer

        # initial weights: π first, then the critics (sampled rollouts), from a stream of
        # their own, so that they do not shift the split and batch draws of ``rng``
        self.init_rng = np.random.default_rng([cfg.seed, 0x1417])
        self.pi = policy_net(n_feat, self.init_rng, hidden=cfg.hidden, layers=cfg.layers)
        self.tracker = OnlineThreshold(alpha=cfg.alpha, kappa=cfg.kappa0, eta0=cfg.eta0, xi=cfg.xi)
        self.log: list[dict[str, float]] = []
        self.best: tuple[float, int, np.ndarray] | None = None  # (select/score, step, θ)
        self.avg_start = int(cfg.average_from * cfg.steps)
        self.theta_sum = np.zeros_like(self.pi.theta)

        # the fitted questions as episodes, for the calibrated κ and keep_best's checkpoint score
        self.calibrated_kappa = cfg.method == "ccpo" and cfg.kappa_update == "calibrated"
        needs_fit_ep = self.calibrated_kappa or (cfg.keep_best and cfg.select_on == "train")
        self.fit_ep = ep.subset(self.fit_idx) if needs_fit_ep else None

    def fit_probs(self) -> np.ndarray:
        """π(·|o) of the current θ on every fitted training question ([n_fit, T, 3])."""
        return np.exp(log_pi(self.pi(self.obs_all[self.fit_idx]), self.allowed))

    def step_kappa(self) -> float:
        """κ_k for this step: the tracker's, first set to κ̂ of the current π on every fitted
        question when ``kappa_update="calibrated"``."""
        if self.calibrated_kappa:
            self.tracker.kappa = float(
                calibrate_kappa(self.fit_ep, self.fit_probs(), self.cfg.alpha)
            )
        return self.tracker.kappa

    def sample_batch(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``size`` fitted questions (with replacement only when there are fewer) and their
        normalised observations, one state a row ([size · T, F])."""
        batch = self.rng.choice(self.fit_idx, size=size, replace=len(self.fit_idx) < size)
        return batch, self.obs_all[batch].reshape(size * self.ep.horizon, -1)

    def end_step(self, step: int, entry: dict[str, float]) -> None:
        """After step ``step`` (κ already moved): average θ, validate and score a checkpoint
        every ``val_every`` steps, log ``entry`` and report progress."""
        cfg, pi = self.cfg, self.pi
        if step > self.avg_start:
            self.theta_sum += pi.theta
        at_check = cfg.val_every and (step % cfg.val_every == 0 or step == cfg.steps)
        if at_check and len(self.val_idx):
            entry.update(
                validate(
                    self.ep, self.val_idx, pi, self.obs_mean, self.obs_std, self.tracker.kappa, cfg
                )
            )
        if at_check and cfg.keep_best and (len(self.val_idx) or cfg.select_on == "train"):
            if cfg.select_on == "train":
                got = calibrated_cost(self.fit_ep, self.fit_probs(), cfg.alpha, seed=cfg.seed)
                cost, size = got.cost * 100, got.set_size
            else:
                cost, size = entry["val/calibrated_cost"], entry["val/calibrated_set_size"]
            # the objective training minimises, in cents per question: cost + λ c̄ · set size
            score = cost + self.lam_cents * size
            entry["select/calibrated_cost"] = float(cost)
            entry["select/score"] = float(score)
            if self.best is None or score < self.best[0]:
                self.best = (score, step, pi.theta.copy())
        self.log.append(entry)
        if self.progress is not None:
            self.progress(step, entry)

    def result(self) -> TrainResult:
        """π at the best checkpoint (``keep_best``), else averaged (``average_from`` < 1),
        else as the last step left it."""
        cfg, pi = self.cfg, self.pi
        if cfg.keep_best and self.best is not None:
            pi.theta[:] = self.best[2]
            self.log[-1]["train/best_step"] = float(self.best[1])
        elif self.avg_start < cfg.steps:
            pi.theta[:] = self.theta_sum / (cfg.steps - self.avg_start)
        return TrainResult(pi, self.obs_mean, self.obs_std, self.tracker.kappa, cfg, self.log)


def rollout_entries(m: Metrics) -> dict[str, float]:
    """The ``train/*`` entries of a batch's conformal rollout C_{π_k,κ_k} (cost in cents)."""
    return {
        "train/cost": float(m.cost.mean() * 100),
        "train/coverage": float(m.covered.mean()),
        "train/set_size": float(m.set_size.mean()),
        "train/length": float(m.length.mean()),
    }


def validate(ep, val_idx, pi, mean, std, kappa, cfg) -> dict[str, float]:
    """The ``val/*`` entries: π's conformal rollout on the held-out questions at κ and at the
    κ̂ that reaches 1 − α there (score quality for the final batch calibration)."""
    probs = policy_probs(pi, ep.obs[val_idx], mean, std)
    sub = ep.subset(val_idx)
    m = conformal_rollout(sub, probs, kappa)
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
