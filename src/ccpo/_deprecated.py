"""Old import paths kept for one release: each moved name still resolves at its old module,
with a ``DeprecationWarning`` that names its new home (:func:`moved`)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved(old: str, homes: Mapping[str, str] | str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the module ``old``: each name of ``homes`` (name → the
    module it moved to; or one module that every public name moved to) is imported from its
    new module on use, with a warning."""

    def home_of(name: str) -> str | None:
        if not isinstance(homes, str):
            return homes.get(name)
        public = not name.startswith("__") and hasattr(importlib.import_module(homes), name)
        return homes if public else None

    def __getattr__(name: str) -> Any:
        home = home_of(name)
        if home is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(
            f"{old} is deprecated and goes in the next release: import {name} from {home}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return __getattr__
