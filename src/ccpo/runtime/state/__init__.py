"""The state of ``ccpo serve`` (money, κ, counters, answer sets awaiting feedback) in one store
shared by every replica: an embedded SQLite file by default, PostgreSQL for several replicas.

- :mod:`~ccpo.runtime.state.backends`: the two databases behind one small interface;
- :mod:`~ccpo.runtime.state.store`: the store (one writer per replica committing in groups,
  one locked row per transaction, leases, deadlines, schema version);
- :mod:`~ccpo.runtime.state.ledger`: the total budget's ledger on the store.
"""

from ccpo.runtime.state.backends import (
    DuplicateKey,
    StateUnavailable,
    is_database_url,
    safe_url,
    unstorable,
)
from ccpo.runtime.state.ledger import StoreLedger
from ccpo.runtime.state.store import SCHEMA_VERSION, StateStore

__all__ = [
    "SCHEMA_VERSION",
    "DuplicateKey",
    "StateStore",
    "StateUnavailable",
    "StoreLedger",
    "is_database_url",
    "safe_url",
    "unstorable",
]
