"""Deprecated: training moved to :mod:`ccpo.learning.training` (one loop per mode).

Every name this module had still resolves here for one release, with a DeprecationWarning.
"""

from ccpo._deprecated import moved

__getattr__ = moved(
    __name__,
    {
        "train": "ccpo.learning.training",
        "TrainResult": "ccpo.learning.training",
        "TrainConfig": "ccpo.learning.config",
        "allowed_actions": "ccpo.traces.episodes",
        "entropy_and_grad": "ccpo.learning.training.update",
        "target_log_probs": "ccpo.learning.training.update",
        "policy_probs": "ccpo.learning.heads",
    },
)
