"""Scripts written against the modules before the policy interface keep working for one
release: the old paths resolve every name they had, to the very same object, and warn."""

from __future__ import annotations

import importlib

import pytest

OLD = {
    "ccpo.learning.policy": {
        "TrainedPolicy": ("ccpo.policies.rl", "RLPolicy"),
        "load_policy": ("ccpo.policies", "load_policy"),
        "check_provenance": ("ccpo.policies.provenance", "check_provenance"),
        "horizon_from_obs_mean": ("ccpo.policies.rl", "horizon_from_obs_mean"),
    },
    "ccpo.learning.trainers": {
        "train": ("ccpo.learning.training", "train"),
        "TrainResult": ("ccpo.learning.training", "TrainResult"),
        "TrainConfig": ("ccpo.learning.config", "TrainConfig"),
        "target_log_probs": ("ccpo.learning.training.update", "target_log_probs"),
    },
}
CASES = [(old, name, *new) for old, names in OLD.items() for name, new in names.items()]


@pytest.mark.parametrize(("old", "name", "module", "new_name"), CASES)
def test_an_old_path_gives_the_same_object_and_warns(old, name, module, new_name):
    mod = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated.*import {name} from"):
        got = getattr(mod, name)
    assert got is getattr(importlib.import_module(module), new_name)


def test_from_import_warns_too():
    with pytest.warns(DeprecationWarning, match="ccpo.learning.policy"):
        from ccpo.learning.policy import TrainedPolicy  # noqa: F401


def test_an_unknown_name_is_an_attribute_error():
    mod = importlib.import_module("ccpo.learning.trainers")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        mod.nothing  # noqa: B018
