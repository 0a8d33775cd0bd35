"""Deprecated: policies moved to :mod:`ccpo.policies` (``from ccpo import load_policy``).

Every name this module had still resolves here for one release, with a DeprecationWarning.
"""

from ccpo._deprecated import moved

__getattr__ = moved(
    __name__,
    {
        "TrainedPolicy": "ccpo.policies.rl",
        "TrainingRun": "ccpo.policies.rl",
        "horizon_from_obs_mean": "ccpo.policies.rl",
        "PROVENANCE_MUST_MATCH": "ccpo.policies.provenance",
        "PROVENANCE_SHOULD_MATCH": "ccpo.policies.provenance",
        "check_provenance": "ccpo.policies.provenance",
        "load_policy": "ccpo.policies.registry",
    },
)
