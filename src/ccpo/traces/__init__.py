"""The trace side: schema ``ccpo.trace/v1``, streaming I/O, featurizer and the episode engine."""
