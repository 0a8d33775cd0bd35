"""The evaluation harness: policies scored on trace files, the way the paper scores them.

- :mod:`~ccpo.evaluation.harness`: the splits (order-free training split, R random
  calibration/test splits), scoring every policy on the same splits, result rows;
- :mod:`~ccpo.evaluation.rows`: policy names and trained policy folders as harness rows
  (baselines, the CPO family, CCPO, the score methods, single-answer rows, ``always-<model>``);
- :mod:`~ccpo.evaluation.comparison`: every method on one trace set at one α (``compare``);
- :mod:`~ccpo.evaluation.reproduce` and :mod:`~ccpo.evaluation.seeds`: every bundled set ×
  α × seed, and the statistics across seeds (``reproduce``);
- :mod:`~ccpo.evaluation.check`: a trained policy's guarantee on new traffic (``check``);
- :mod:`~ccpo.evaluation.dry_run`: a policy answering its own logs live (``dry-run``).

What is written and drawn from the results is :mod:`ccpo.report`.
"""
