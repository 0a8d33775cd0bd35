"""CCPO and CPO training: :func:`train`, :class:`TrainResult`, :class:`TrainConfig`.

The loops live in :mod:`ccpo.learning.training` (one module per mode: exact expectations by
replay, or the paper's sampled rollouts); this module is the path scripts and the docs import
them from. Derivation and the departures from the paper: docs/theory.md, section "Departures
from CCPO/CPO".
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ccpo.learning.config import TrainConfig
from ccpo.learning.heads import policy_probs
from ccpo.learning.training import train
from ccpo.learning.training.run import TrainResult
from ccpo.learning.training.update import entropy_and_grad, target_log_probs
from ccpo.traces.episodes import allowed_actions

__all__ = [
    "TrainConfig",
    "TrainResult",
    "allowed_actions",
    "config_dict",
    "entropy_and_grad",
    "policy_probs",
    "target_log_probs",
    "train",
]


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    return asdict(cfg)
