"""The techniques, one sibling module each, all with the same interface
(:class:`ccpo.policies.pipeline.Technique`): ``NAMES``, the methods it fits, and
``fit(spec, ep, train_idx, alpha, seed, progress) → Policy``, fitted on the training questions
and complete (not calibrated yet: :func:`ccpo.policies.pipeline.train_policy` does that).

- :mod:`~ccpo.policies.techniques.rl`: π trained by CCPO / CPO (the trainer imported on first use);
- :mod:`~ccpo.policies.techniques.stopping`: CStop and the fixed rules, sets or one answer;
- :mod:`~ccpo.policies.techniques.reference`: calling the reference model alone;
- :mod:`~ccpo.policies.techniques.auto`: the cheapest of the others by cross-fitting.
"""
