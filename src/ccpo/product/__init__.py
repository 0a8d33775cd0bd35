"""Deprecated: the old home of the CLI and the Python API, kept for one release.

``ccpo.product.api`` re-exports :mod:`ccpo.api` with a ``DeprecationWarning``; ``python -m
ccpo.product.cli`` runs :mod:`ccpo.cli` with one. The harness is now :mod:`ccpo.evaluation`,
the reports :mod:`ccpo.report`.
"""
