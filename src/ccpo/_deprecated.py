"""Old import paths kept for one release: each moved name still resolves at its old module,
with a ``DeprecationWarning`` that names its new home (:func:`moved`)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: every old module path and where its names went (name → new module, or one module that
#: every public name moved to): the one list of what the next release removes
MOVED: dict[str, Mapping[str, str] | str] = {
    "ccpo.product.api": "ccpo.api",
    "ccpo.product.cli": "ccpo.cli",
    "ccpo.learning.policy": {
        "TrainedPolicy": "ccpo.policies.rl",
        "TrainingRun": "ccpo.policies.rl",
        "horizon_from_obs_mean": "ccpo.policies.rl",
        "PROVENANCE_MUST_MATCH": "ccpo.policies.provenance",
        "PROVENANCE_SHOULD_MATCH": "ccpo.policies.provenance",
        "check_provenance": "ccpo.policies.provenance",
        "load_policy": "ccpo.policies.registry",
    },
    "ccpo.learning.trainers": {
        "train": "ccpo.learning.training",
        "TrainResult": "ccpo.learning.training",
        "TrainConfig": "ccpo.learning.config",
        "allowed_actions": "ccpo.traces.episodes",
        "entropy_and_grad": "ccpo.learning.training.update",
        "target_log_probs": "ccpo.learning.training.update",
        "policy_probs": "ccpo.learning.heads",
    },
}


def moved(old: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the module ``old``: each name :data:`MOVED` lists for it
    is imported from its new module on use, with a warning."""
    homes = MOVED[old]

    def home_of(name: str) -> str | None:
        if not isinstance(homes, str):
            return homes.get(name)
        public = not name.startswith("__") and hasattr(importlib.import_module(homes), name)
        return homes if public else None

    def __getattr__(name: str) -> Any:
        home = home_of(name)
        if home is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old} is deprecated and goes in the next release: import {name} from {home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return __getattr__
