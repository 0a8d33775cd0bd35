"""Deprecated: the ``ccpo`` command line moved to :mod:`ccpo.cli` (``python -m ccpo``).

``python -m ccpo.product.cli`` still runs it, after one ``DeprecationWarning`` on stderr.
``app`` and ``run`` stay importable here without a warning (the console script of an install
made before the move points at ``ccpo.product.cli:run``); any other name of :mod:`ccpo.cli`
resolves with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings

from ccpo._deprecated import moved
from ccpo.cli import app, run

__all__ = ["app", "run"]


__getattr__ = moved("ccpo.product.cli")  # also run as __main__ (python -m)


if __name__ == "__main__":
    warnings.warn(
        "python -m ccpo.product.cli is deprecated: run python -m ccpo (or ccpo)",
        DeprecationWarning,
        stacklevel=1,
    )
    run()
