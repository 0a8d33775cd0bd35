"""Moved to :mod:`ccpo.policies` (kept so that imports of ``ccpo.learning.single`` work)."""

# ruff: noqa: F401

from ccpo.policies.base import (
    Calibration,
)
from ccpo.policies.registry import (
    fit_single_method,
)
from ccpo.policies.rules import (
    depth_scores,
)
from ccpo.policies.single import (
    DELTA,
    GRID,
    RUN_ALL,
    SINGLE_METHODS,
    SUFFIX,
    SingleAnswerPolicy,
    Unreachable,
    binomial_pvalues,
    calibrate_splits,
    candidate_thresholds,
    fit_single,
    ltt_threshold,
    reachable_alpha,
    reached_labels,
    single_name,
    validation_cost,
)
