"""ccpo: Conformal Constrained Policy Optimization for cost-effective LLM agents.

>>> from ccpo import ConformalPolicy, read_traces, load_policy   # doctest: +SKIP

The package is laid out by architecture, the arrows pointing inward (``tests/test_layering.py``):

- ``ccpo.traces``     — the trace side: the ``ccpo.trace/v1`` schema, I/O, prices, featurizer,
  episodes, and ``ccpo.traces.sim``, a *synthetic* trace generator for tests and demos.
- ``ccpo.learning``   — the learning side: conformal maths, baselines, networks, trainers.
- ``ccpo.llm``        — the LLM side: clients, cache, agents, tasks, collection.
- ``ccpo.runtime``    — the deployed agent and the HTTP service.
- ``ccpo.evaluation`` — the harness: splits, scoring, comparisons, ``check``, ``reproduce``.
- ``ccpo.report``     — result files, tables, plots and the reports.
- ``ccpo.cli``        — the ``ccpo`` command line; ``ccpo.api`` — the Python API.

The three names above are loaded on first use, so ``import ccpo`` stays cheap (it imports
nothing else).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["ConformalPolicy", "load_policy", "read_traces"]

#: the public names, and the module each is loaded from on first use (named, not imported
#: here: modules below import ``__version__`` from this one)
_PUBLIC = {
    "ConformalPolicy": "ccpo.api",
    "load_policy": "ccpo.policies.registry",
    "read_traces": "ccpo.traces.io",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'ccpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
