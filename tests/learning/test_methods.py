"""The method registry: one table names every method the CLI, the harness and the API take."""

from __future__ import annotations

import pytest

from ccpo.errors import CCPOError
from ccpo.policies.registry import METHODS, SCORE_METHODS, compare_rows, method_help, resolve_method


def test_score_methods_are_what_stopping_fits():
    assert {n for n, s in METHODS.items() if s.kind == "score"} == {"auto", *SCORE_METHODS}
    assert all(s.trainer in ("ccpo", "cpo") for s in METHODS.values() if s.kind == "rl")


def test_resolve_reads_lambda_and_refuses_nonsense():
    spec, lam = resolve_method("ccpo-lam0.5")
    assert (spec.name, lam) == ("ccpo", 0.5)
    assert resolve_method("cpo-online")[0].scoring == "online"
    assert resolve_method("random") is None  # a baseline row, not a method
    with pytest.raises(CCPOError, match="cannot read λ"):
        resolve_method("ccpo-lam1e")


def test_help_names_every_method_and_rows_end_with_auto():
    text = method_help()
    assert all(f"{name}:" in text for name in METHODS)
    rows = compare_rows()
    assert rows[-1] == "auto" and rows[:4] == ["cpo", "cpo-batch", "cpo-online", "ccpo"]
    assert set(rows) <= set(METHODS)


def test_one_name_for_a_trained_policy():
    """train, compare and the API name a trained (method, λ) through variant_name, and it
    reads back through resolve_method."""
    from ccpo.policies.registry import variant_name

    assert variant_name("ccpo") == "ccpo" and variant_name("ccpo", 0.5) == "ccpo-lam0.5"
    assert variant_name("cpo-batch", 0.5) == "cpo-batch"  # λ prices sets, a point π has none
    spec, lam = resolve_method(variant_name("ccpo", 0.25))
    assert spec.name == "ccpo" and lam == 0.25
