"""The trace side: schema ``ccpo.trace/v1``, streaming I/O, prices, featurizer, the episode
engine and the synthetic generator (``sim``)."""
