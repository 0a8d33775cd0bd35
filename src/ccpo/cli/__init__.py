"""The ``ccpo`` command line."""

from ccpo.cli.main import app, main, run

__all__ = ["app", "main", "run"]
