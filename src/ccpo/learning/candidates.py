"""Moved to :mod:`ccpo.policies` (kept so that imports of ``ccpo.learning.candidates`` work)."""

# ruff: noqa: F401

from ccpo.policies.registry import (
    AUTO_RL_STEPS,
    RL_CANDIDATES,
    rl_fitter,
)
