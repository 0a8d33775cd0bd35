"""RL policies: a score network π trained by CCPO or CPO, used with a threshold κ.

:class:`RLPolicy` holds π (a float64 numpy network, :class:`~ccpo.learning.mlp.NumpyMLP`)
with its observation normalisation and the thresholds κ: ``kappa_online`` (tracked during
training) and ``kappa_batch`` (split-conformal κ̂). Its variant says how π is used:

- ``ccpo``, ``ccpo-lam<λ>``, ``cpo-batch``: C_κ̂ with κ̂ calibrated on held-out questions;
- ``cpo-online``: C_κ with the κ tracked online during training;
- ``cpo``: greedy (argmax π), no set and no guarantee.

Training lives in :mod:`ccpo.learning.training`; :meth:`RLPolicy.from_result` turns a
run into a policy without importing it. Derivations: docs/theory.md, "Departures from CCPO/CPO".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.config import TrainConfig
from ccpo.learning.conformal import CalibrationScores
from ccpo.learning.heads import policy_probs
from ccpo.learning.mlp import NumpyMLP
from ccpo.learning.weights import WEIGHTS_FILE, read_weights, weights_path, write_weights
from ccpo.policies.base import Calibration
from ccpo.policies.folder import read_meta, read_side_files, write_folder
from ccpo.policies.sets import SetPolicy
from ccpo.policies.spec import METHODS, MethodSpec, resolve_method
from ccpo.traces.episodes import Episodes, Metrics, point_rollout
from ccpo.traces.featurize import FEATURE_NAMES, FEATURE_SPEC


class TrainingRun(Protocol):
    """What :meth:`RLPolicy.from_result` reads of a training run
    (:class:`ccpo.learning.training.TrainResult`), stated here so that the policy never
    imports the trainer."""

    @property
    def policy(self) -> NumpyMLP: ...  # the score network (copied into the policy)
    @property
    def obs_mean(self) -> np.ndarray: ...
    @property
    def obs_std(self) -> np.ndarray: ...
    @property
    def kappa_online(self) -> float: ...
    @property
    def config(self) -> TrainConfig: ...
    @property
    def log(self) -> list[dict[str, float]]: ...


@dataclass
class RLPolicy(SetPolicy):
    """π (a score network with its observation normalisation) plus the thresholds κ."""

    net: NumpyMLP
    variant: str  # ccpo, ccpo-lam<λ>, cpo, cpo-batch or cpo-online: how π and κ are used
    obs_mean: np.ndarray
    obs_std: np.ndarray
    config: TrainConfig
    kappa_online: float
    kappa_batch: float | None = None
    calibration: CalibrationScores | None = None  # κ̂'s scores (online level tracker)
    feature_spec: dict[str, Any] = field(default_factory=lambda: dict(FEATURE_SPEC))
    prices: dict[str, Any] | None = None
    log: list[dict[str, float]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    horizon: int | None = None  # T, the rounds of the traces it was trained on
    info: dict[str, Any] = field(default_factory=dict)  # e.g. the choice made by auto

    @classmethod
    def from_result(
        cls,
        res: TrainingRun,
        variant: str | None = None,
        prices: dict[str, Any] | None = None,
        horizon: int | None = None,
    ) -> RLPolicy:
        """The policy a training run produced. ``horizon``: T of the training episodes; when
        not given it is read off the run's observation normalisation, where it is exact (see
        :func:`horizon_from_obs_mean`)."""
        return cls(
            NumpyMLP(res.policy.layers),
            variant or res.config.method,
            res.obs_mean,
            res.obs_std,
            res.config,
            res.kappa_online,
            prices=prices,
            log=res.log,
            horizon=horizon if horizon is not None else horizon_from_obs_mean(res.obs_mean),
        )

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def train_config(self) -> TrainConfig:
        return self.config

    @property
    def technique(self) -> MethodSpec:
        """The method its variant names (``ccpo-lam<λ>`` is ``ccpo``'s): how π is used; a
        name of no method is used as ``ccpo`` is (split-conformal κ̂)."""
        found = resolve_method(self.variant)
        return METHODS["ccpo"] if found is None else found[0]

    @property
    def scoring(self) -> str:
        """How π is used: "point" (greedy), "online" (κ from training) or "batch" (κ̂)."""
        return self.technique.scoring

    @property
    def greedy(self) -> bool:
        return self.technique.greedy

    @property
    def calibrates(self) -> bool:
        return self.technique.calibrates

    @property
    def kappa(self) -> float:
        """κ in force: the batch-calibrated one when there is one, else the online one."""
        return self.kappa_online if self.kappa_batch is None else self.kappa_batch

    def summary_fields(self) -> dict[str, Any]:
        return {"kappa_online": self.kappa_online}

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """π(a|o) for observations [..., T, F] (``next`` masked at the last round)."""
        return policy_probs(self.net, obs, self.obs_mean, self.obs_std)

    def calibrate(self, ep: Episodes, cal: np.ndarray | None = None) -> Calibration:
        if not self.calibrates:
            raise CCPOError(
                f"a {self.variant} policy is not calibrated on held-out questions "
                "(its κ is the online one, or it is greedy)"
            )
        return super().calibrate(ep, cal)

    def split_thresholds(
        self, ep: Episodes, scores: np.ndarray, cal: np.ndarray, alpha: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """κ̂ per split (batch), the online κ on every split, or NaN (greedy: no κ)."""
        if self.calibrates:
            return super().split_thresholds(ep, scores, cal, alpha)
        fixed = np.nan if self.greedy else float(self.kappa_online)
        return np.full(len(cal), fixed), np.zeros(len(cal), dtype=bool)

    def rollout(
        self, ep: Episodes, scores: np.ndarray, thresholds: Any, idx: np.ndarray | None = None
    ) -> Metrics:
        if self.greedy:
            actions = np.where(ep.allowed, scores, -1.0).argmax(-1)
            return point_rollout(ep, actions if idx is None else actions[idx], idx)
        return super().rollout(ep, scores, thresholds, idx)

    def trained_horizon(self) -> int | None:
        return self.horizon if self.horizon is not None else horizon_from_obs_mean(self.obs_mean)

    def save(self, folder: str | Path) -> Path:
        meta = {
            **self.folder_header(),
            "kappa_online": self.kappa_online,
            "kappa_batch": self.kappa_batch,
            **({"calibration_scores": self.calibration.to_json()} if self.calibration else {}),
            "obs_mean": self.obs_mean.tolist(),
            "obs_std": self.obs_std.tolist(),
            "obs_dim": int(self.net.in_dim),
        }
        out = write_folder(folder, meta, self.feature_spec, self.prices, self.log)
        write_weights(out / WEIGHTS_FILE, self.net.state_dict())
        return out

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any] | None = None) -> RLPolicy:
        """Load a CCPO / CPO folder (``meta``: its policy.json if already read)."""
        d = Path(folder)
        meta = read_meta(d) if meta is None else meta
        spec, prices, log = read_side_files(d)
        cfg = TrainConfig(**meta["config"])
        net = _load_net(weights_path(d), meta["obs_dim"], cfg)
        obs_mean = np.asarray(meta["obs_mean"])
        provenance = meta.get("provenance") or {}
        horizon = meta.get("horizon")
        if horizon is None:
            # folders saved before policy.json stored T: the CLI's record it in their
            # provenance; for the others (Python API) the normalisation is the only way
            horizon = provenance.get("horizon") or horizon_from_obs_mean(obs_mean)
        return cls(
            net,
            meta.get("variant", cfg.method),
            obs_mean,
            np.asarray(meta["obs_std"]),
            cfg,
            float(meta["kappa_online"]),
            kappa_batch=meta.get("kappa_batch"),
            calibration=CalibrationScores.from_json(meta.get("calibration_scores")),
            feature_spec=spec,
            prices=prices,
            log=log,
            provenance=provenance,
            horizon=None if horizon is None else int(horizon),
            info=meta.get("info") or {},
        )


#: the name this class had before the policy interface (kept for scripts written against it)
TrainedPolicy = RLPolicy


def horizon_from_obs_mean(obs_mean: np.ndarray) -> int | None:
    """T read off a training run's observation mean: the ``is_last_round`` feature is 1 in
    one round of T, so its mean over whole training episodes is exactly 1/T. None when the
    mean is not of that form (a normalisation from something else)."""
    m = float(np.asarray(obs_mean)[FEATURE_NAMES.index("is_last_round")])
    if not 0 < m <= 1:
        return None
    horizon = round(1.0 / m)
    return horizon if abs(1.0 / horizon - m) <= 1e-3 else None


def _load_net(path: Path, obs_dim: int, cfg: TrainConfig) -> NumpyMLP:
    """The score network of ``weights.npz`` (or an older folder's ``weights.pt``), checked
    against the shape
    policy.json declares (``obs_dim`` inputs, ``cfg.layers`` hidden layers of ``cfg.hidden``
    units, tanh, 3 outputs). One-line :class:`CCPOError` naming the file otherwise."""
    try:
        net = NumpyMLP.from_state_dict(read_weights(path), activation="tanh")
    except (ValueError, FileNotFoundError) as e:
        raise CCPOError(f"{path}: cannot load the network ({e})") from None
    shapes = [w.shape for w, _, _ in net.layers]
    want = [(obs_dim, cfg.hidden)] + [(cfg.hidden, cfg.hidden)] * (cfg.layers - 1)
    if shapes != [*want, (cfg.hidden, 3)]:
        raise CCPOError(
            f"{path}: cannot load the network (layer shapes {shapes}, but policy.json declares "
            f"{obs_dim} inputs and {cfg.layers} hidden layers of {cfg.hidden})"
        )
    return net
