"""Typed config fields that carry their own help text (:func:`knob`), so the command line can
show every field of a config dataclass as an option without reading its source."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def knob(default: Any, help: str) -> Any:
    """A dataclass field with ``default`` and a one-line ``help`` (read by ``ccpo.cli.config``
    from ``dataclasses.fields(cls)[i].metadata["help"]``)."""
    return field(default=default, metadata={"help": help})
