"""Deprecated: the Python API moved to :mod:`ccpo.api` (``from ccpo import ConformalPolicy``).

Every name of :mod:`ccpo.api` still resolves here, with a ``DeprecationWarning`` on use.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    api = importlib.import_module("ccpo.api")
    if name.startswith("__") or not hasattr(api, name):
        raise AttributeError(f"module 'ccpo.product.api' has no attribute {name!r}")
    warnings.warn(
        f"ccpo.product.api is deprecated: import {name} from ccpo.api"
        + (" (or from ccpo)" if name == "ConformalPolicy" else ""),
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(api, name)
