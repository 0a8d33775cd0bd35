"""Moved to :mod:`ccpo.runtime.http.connections` (the connection guard) and
:mod:`ccpo.runtime.http.joined_writes`; this module re-exports their names."""

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
from ccpo.runtime.http.joined_writes import JoinedWrites

__all__ = [
    "BASE_FDS", "MAX_BACKLOG", "MAX_HEAD_BYTES", "REFUSE_LINGER", "ConnectionLimits",
    "JoinedWrites", "connection_limits", "guarded_protocol",
]  # fmt: skip
