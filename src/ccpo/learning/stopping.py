"""Moved to :mod:`ccpo.policies` (kept so that imports of ``ccpo.learning.stopping`` work)."""

# ruff: noqa: F401

from ccpo.learning.config import (
    Learner,
    StopConfig,
)
from ccpo.policies.auto import (
    Fitter,
    Selection,
)
from ccpo.policies.classifier import (
    fixable_probability,
    round_scores,
    stop_features,
)
from ccpo.policies.cstop import (
    STOPPING_METHODS,
    StoppingPolicy,
    fit_stopping,
    fixable_labels,
    membership_scores,
)
from ccpo.policies.registry import (
    AUTO_CANDIDATES,
    SCORE_METHODS,
    candidate_fitter,
    fit_auto,
    fit_method,
    select_method,
    stopping_fitter,
)
from ccpo.policies.rules import (
    FIXED_RULES,
    agree_schedule,
    depth_schedule,
)
