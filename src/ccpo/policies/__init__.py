"""Policies: one interface (:class:`Policy`), one module per technique.

- :mod:`~ccpo.policies.base`: the interface, :class:`RoundDecision`, :class:`Calibration`;
- :mod:`~ccpo.policies.sets`: what set policies share (membership scores, split-conformal κ̂);
- :mod:`~ccpo.policies.rl`: π trained by CCPO / CPO, with κ (:class:`RLPolicy`);
- :mod:`~ccpo.policies.cstop`: conformal stopping learnt on replay (:class:`StoppingPolicy`);
- :mod:`~ccpo.policies.rules`: fixed rules ``depth-k`` / ``agree-k`` (:class:`RulePolicy`);
- :mod:`~ccpo.policies.single`: one answer, Learn-then-Test (:class:`SingleAnswerPolicy`);
- :mod:`~ccpo.policies.reference`: calling the reference model alone;
- :mod:`~ccpo.policies.auto`: choosing a technique by cross-fitting;
- :mod:`~ccpo.policies.spec`: a method name and its options parsed once (:class:`PolicySpec`);
- :mod:`~ccpo.policies.techniques`: how each technique is fitted, one interface;
- :mod:`~ccpo.policies.pipeline`: :func:`train_policy`, the one way to make a policy;
- :mod:`~ccpo.policies.routing`: routing before the first call;
- :mod:`~ccpo.policies.registry`: a folder back to its class (:func:`load_policy`);
- :mod:`~ccpo.policies.folder` and :mod:`~ccpo.policies.provenance`: the folder on disk.
"""

from ccpo.policies.base import Calibration, Policy, RoundDecision
from ccpo.policies.cstop import StoppingPolicy
from ccpo.policies.pipeline import Trained, train_policy
from ccpo.policies.provenance import check_provenance
from ccpo.policies.registry import (
    fit_policy,
    load_policy,
    resolve_method,
)
from ccpo.policies.rl import RLPolicy
from ccpo.policies.rules import RulePolicy
from ccpo.policies.single import SingleAnswerPolicy
from ccpo.policies.spec import PolicySpec, parse_spec

__all__ = [
    "Calibration",
    "Policy",
    "PolicySpec",
    "RLPolicy",
    "RoundDecision",
    "RulePolicy",
    "SingleAnswerPolicy",
    "StoppingPolicy",
    "Trained",
    "check_provenance",
    "fit_policy",
    "load_policy",
    "parse_spec",
    "resolve_method",
    "train_policy",
]
