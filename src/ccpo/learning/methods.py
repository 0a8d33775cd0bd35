"""Moved to :mod:`ccpo.policies` (kept so that imports of ``ccpo.learning.methods`` work)."""

# ruff: noqa: F401

from ccpo.policies.registry import (
    METHODS,
    Kind,
    MethodSpec,
    Scoring,
    compare_rows,
    method_help,
    method_names,
    resolve_method,
    variant_name,
)
