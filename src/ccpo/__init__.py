"""ccpo: Conformal Constrained Policy Optimization for cost-effective LLM agents.

The package is laid out by architecture:

- ``ccpo.llm``      — the LLM side: clients, cache, agents, tasks, collection.
- ``ccpo.traces``   — the trace side: the ``ccpo.trace/v1`` schema, I/O, prices, featurizer,
  episodes, and ``ccpo.traces.sim``, a *synthetic* trace generator for tests and demos (never
  LLM results).
- ``ccpo.learning`` — the learning side: conformal maths, baselines, networks, CPO/CCPO trainers.
- ``ccpo.product``  — the product side: evaluation harness, reports, the ``ccpo`` CLI, runtime.
"""

__version__ = "0.1.0"
