"""Moved to :mod:`ccpo.policies` (kept so that imports of ``ccpo.learning.policy`` work)."""

# ruff: noqa: F401

from ccpo.policies.provenance import (
    PROVENANCE_MUST_MATCH,
    PROVENANCE_SHOULD_MATCH,
    check_provenance,
)
from ccpo.policies.registry import (
    load_policy,
)
from ccpo.policies.rl import (
    TrainedPolicy,
    TrainingRun,
    horizon_from_obs_mean,
)
