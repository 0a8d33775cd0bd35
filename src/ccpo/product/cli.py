"""Deprecated: the ``ccpo`` command line moved to :mod:`ccpo.cli` (``python -m ccpo``).

``python -m ccpo.product.cli`` still runs it, after one ``DeprecationWarning`` on stderr.
``app`` and ``run`` stay importable here without a warning (the console script of an install
made before the move points at ``ccpo.product.cli:run``); any other name of :mod:`ccpo.cli`
resolves with a ``DeprecationWarning``.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from ccpo.cli import app, run

__all__ = ["app", "run"]


def __getattr__(name: str) -> Any:
    cli = importlib.import_module("ccpo.cli")
    if name.startswith("__") or not hasattr(cli, name):
        raise AttributeError(f"module 'ccpo.product.cli' has no attribute {name!r}")
    warnings.warn(
        f"ccpo.product.cli is deprecated: import {name} from ccpo.cli",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(cli, name)


if __name__ == "__main__":
    warnings.warn(
        "python -m ccpo.product.cli is deprecated: run python -m ccpo (or ccpo)",
        DeprecationWarning,
        stacklevel=1,
    )
    run()
