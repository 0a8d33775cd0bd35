"""Moved to :mod:`ccpo.runtime.http.connections` (the connection guard); this module
re-exports its names."""

from __future__ import annotations

from ccpo.runtime.http.connections import (
    BASE_FDS,
    MAX_BACKLOG,
    MAX_HEAD_BYTES,
    REFUSE_LINGER,
    ConnectionLimits,
    connection_limits,
    guarded_protocol,
)

__all__ = [
    "BASE_FDS", "MAX_BACKLOG", "MAX_HEAD_BYTES", "REFUSE_LINGER", "ConnectionLimits",
    "connection_limits", "guarded_protocol",
]  # fmt: skip
