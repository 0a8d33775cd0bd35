"""A trained policy as a folder (the artifact): weights, κ, featurizer spec, config, prices,
training log and library version — and the phases that use it.

Layout of an artifact folder::

    policy.json        format "ccpo.policy/v1", ccpo version, method, α, κ (online, batch),
                       horizon T, observation normalisation, network shape, config,
                       provenance (task, trace file and its sha256, base/guide models,
                       horizon T, α, synthetic)
    weights.pt         state_dict of the score network π (torch.save's format, read without
                       torch: ccpo.learning.weights)
    features.json      the featurizer spec it was trained on (checked on load)
    prices.json        the price table used for training (price-file format)
    train_log.jsonl    one line of diagnostics per training step

Loading a folder made by an incompatible format or featurizer fails with a clear message;
:func:`check_provenance` compares the recorded provenance with the traces or endpoints a policy
is used on (older folders without provenance load as before and are not checked).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ccpo.errors import CCPOError
from ccpo.learning.artifact import read_meta, read_side_files, write_folder
from ccpo.learning.config import TrainConfig
from ccpo.learning.conformal import CalibrationScores
from ccpo.learning.heads import policy_probs
from ccpo.learning.mlp import NumpyMLP
from ccpo.learning.weights import read_weights, write_weights
from ccpo.traces.featurize import FEATURE_NAMES, FEATURE_SPEC


class TrainingRun(Protocol):
    """What :meth:`TrainedPolicy.from_result` reads of a training run
    (:class:`ccpo.learning.trainers.TrainResult`), stated here so that the artifact never
    imports the trainer (nor torch through it)."""

    @property
    def policy(self) -> Any: ...  # the score network; its ``body`` becomes a NumpyMLP
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
class TrainedPolicy:
    """π (a score network with its observation normalisation) plus the thresholds κ.

    The network is a float64 numpy copy of the trained weights: deciding with a policy needs
    numpy only (no torch)."""

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
    provenance: dict[str, Any] = field(default_factory=dict)  # see check_provenance
    horizon: int | None = None  # T, the rounds of the traces it was trained on
    info: dict[str, Any] = field(default_factory=dict)  # e.g. the choice made by auto

    answer = "set"  # returns an answer set (single-answer policies: ccpo.learning.single)

    @classmethod
    def from_result(
        cls,
        res: TrainingRun,
        variant: str | None = None,
        prices: dict[str, Any] | None = None,
        horizon: int | None = None,
    ) -> TrainedPolicy:
        """The policy a training run produced. ``horizon``: T of the training episodes; when
        not given it is read off the run's observation normalisation, where it is exact (the
        mean of ``is_last_round`` over whole training episodes is 1/T, see
        :func:`horizon_from_obs_mean`)."""
        return cls(
            NumpyMLP(res.policy.body),
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
    def scoring(self) -> str:
        """How the policy answers: "point" (greedy π), "online" (κ from training) or "batch"."""
        return {"cpo": "point", "cpo-online": "online"}.get(self.variant, "batch")

    @property
    def alpha(self) -> float:
        return self.config.alpha

    @property
    def kappa(self) -> float:
        """κ in force: the batch-calibrated one when there is one, else the online one."""
        return self.kappa_online if self.kappa_batch is None else self.kappa_batch

    def probs(self, obs: np.ndarray) -> np.ndarray:
        """π(a|o) for observations [..., T, F] (``next`` masked at the last round)."""
        return policy_probs(self.net, obs, self.obs_mean, self.obs_std)

    def save(self, folder: str | Path) -> Path:
        meta = {
            "method": self.config.method,
            "variant": self.variant,
            "answer": self.answer,
            "alpha": self.alpha,
            "kappa_online": self.kappa_online,
            "kappa_batch": self.kappa_batch,
            **({"calibration_scores": self.calibration.to_json()} if self.calibration else {}),
            "horizon": self.horizon,
            "obs_mean": self.obs_mean.tolist(),
            "obs_std": self.obs_std.tolist(),
            "obs_dim": int(self.net.in_dim),
            "config": asdict(self.config),
            "provenance": self.provenance,
            **({"info": self.info} if self.info else {}),
        }
        out = write_folder(folder, meta, self.feature_spec, self.prices, self.log)
        write_weights(out / "weights.pt", self.net.state_dict())
        return out

    @classmethod
    def load(cls, folder: str | Path, meta: dict[str, Any] | None = None) -> TrainedPolicy:
        """Load a CCPO / CPO folder (``meta``: its policy.json if already read)."""
        d = Path(folder)
        meta = read_meta(d) if meta is None else meta
        spec, prices, log = read_side_files(d)
        cfg = TrainConfig(**meta["config"])
        net = _load_net(d / "weights.pt", meta["obs_dim"], cfg)
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
    """The score network of ``weights.pt`` as numpy (no torch), checked against the shape
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


PROVENANCE_MUST_MATCH = ("task", "horizon")
"""Provenance fields whose mismatch makes a policy meaningless (refused)."""
PROVENANCE_SHOULD_MATCH = ("traces_sha256", "base_models", "guide_models", "synthetic")
"""Provenance fields whose mismatch is allowed but worth a warning."""


def check_provenance(recorded: dict[str, Any], actual: dict[str, Any], where: str) -> list[str]:
    """Compare a policy's recorded provenance with what it is used on (``where`` names both
    in messages). Raises :class:`CCPOError` when a field of :data:`PROVENANCE_MUST_MATCH`
    differs; returns one warning line per differing field of :data:`PROVENANCE_SHOULD_MATCH`.
    Fields absent on either side are not compared."""

    def differs(key: str) -> bool:
        return key in recorded and key in actual and recorded[key] != actual[key]

    for key in PROVENANCE_MUST_MATCH:
        if differs(key):
            raise CCPOError(
                f"{where}: the policy was trained with {key} = {recorded[key]!r} but is used "
                f"with {key} = {actual[key]!r}; train a policy for these traces/endpoints"
            )
    notes = {
        "traces_sha256": lambda: (
            f"trained on {recorded.get('traces', 'another file')} (sha256 "
            f"{str(recorded['traces_sha256'])[:12]}), used on a file with sha256 "
            f"{str(actual['traces_sha256'])[:12]}"
        ),
        "base_models": lambda: (
            f"trained with base model(s) {', '.join(recorded['base_models'])}, used with "
            f"{', '.join(actual['base_models'])}"
        ),
        "guide_models": lambda: (
            f"trained with guide model(s) {', '.join(recorded['guide_models'])}, used with "
            f"{', '.join(actual['guide_models'])}"
        ),
        "synthetic": lambda: (
            "trained on SYNTHETIC traces (ccpo sim), used on real ones"
            if recorded["synthetic"]
            else "trained on real traces, used on synthetic ones"
        ),
    }
    return [f"{where}: {notes[k]()}" for k in PROVENANCE_SHOULD_MATCH if differs(k)]


def load_policy(folder: str | Path) -> Any:
    """Load any policy folder: CCPO / CPO (:class:`TrainedPolicy`) or a stopping method
    (CStop, ``depth-k``: :class:`ccpo.learning.stopping.StoppingPolicy`) or a single-answer
    policy (``"answer": "single"``: :class:`ccpo.learning.single.SingleAnswerPolicy`), by its
    policy.json."""
    from ccpo.learning.stopping import SCORE_METHODS, StoppingPolicy

    meta = read_meta(folder)  # parsed once, handed to the artifact class
    if meta.get("answer") == "single":
        from ccpo.learning.single import SingleAnswerPolicy

        return SingleAnswerPolicy.load(folder, meta)
    if meta.get("method") in SCORE_METHODS:
        return StoppingPolicy.load(folder, meta)
    return TrainedPolicy.load(folder, meta)
