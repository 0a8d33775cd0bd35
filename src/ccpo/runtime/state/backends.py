"""Where ``ccpo serve`` keeps its state: an embedded SQLite file (the default, nothing to start)
or a PostgreSQL database shared by several replicas (``server.state: postgresql://...``).

:func:`open_backend` picks one for a location. Both offer the same things to
:class:`~ccpo.runtime.state.store.StateStore` (:class:`~ccpo.runtime.state.db.Backend`, in
:mod:`~ccpo.runtime.state.db` with the errors and the URL helpers): a write transaction that
holds the store's one lock until it commits, a read, a write sent whole (guarded steps, all or
none) and the SQL spellings that differ. SQLite (:mod:`~ccpo.runtime.state.sqlite`) also
offers a write sent whole that never waits (``here``) and the checkpoint that goes with it;
PostgreSQL: :mod:`~ccpo.runtime.state.postgres`.

The names of the backends and of their interface are re-exported here.
"""

from __future__ import annotations

from pathlib import Path

from ccpo.errors import CCPOError
from ccpo.runtime.state.db import (
    POSTGRES_SCHEMES,
    Backend,
    Busy,
    DuplicateKey,
    Moved,
    StateUnavailable,
    Step,
    Tx,
    is_database_url,
    location_problem,
    safe_url,
    unstorable,
)
from ccpo.runtime.state.postgres import PostgresBackend
from ccpo.runtime.state.sqlite import SQLiteBackend


def open_backend(
    location: str | Path | None, timeout: float = 5.0, replica: str | None = None
) -> Backend:
    """The backend for ``server.state``: None (in memory), a file path (SQLite) or a
    ``postgresql://USER@HOST:PORT/DB`` URL. Anything else with ``://`` is refused.
    ``timeout``: seconds to wait for a connection or the database's lock; ``replica``: who
    opens it (PostgreSQL: its sessions' ``application_name``, ``ccpo/<replica>``)."""
    if location is None:
        return SQLiteBackend(None, timeout)
    loc = str(location)
    if not is_database_url(loc):
        return SQLiteBackend(Path(loc), timeout)
    problem = location_problem(loc)
    if problem is not None:
        raise CCPOError(f"server.state: {problem}")
    return PostgresBackend(loc, connect_timeout=timeout, replica=replica)


__all__ = [
    "POSTGRES_SCHEMES",
    "Backend",
    "Busy",
    "DuplicateKey",
    "Moved",
    "PostgresBackend",
    "SQLiteBackend",
    "StateUnavailable",
    "Step",
    "Tx",
    "is_database_url",
    "location_problem",
    "open_backend",
    "safe_url",
    "unstorable",
]
