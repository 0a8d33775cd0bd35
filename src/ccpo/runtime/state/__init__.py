"""The state of ``ccpo serve`` (money, κ, counters, answer sets awaiting feedback) in one store
shared by every replica: an embedded SQLite file by default, PostgreSQL for several replicas.

- :mod:`~ccpo.runtime.state.store`: the store, :class:`StateStore` (a façade over its parts:
  :mod:`~ccpo.runtime.state.schema` tables, version and migrations;
  :mod:`~ccpo.runtime.state.engine` one writer per replica committing in groups;
  :mod:`~ccpo.runtime.state.money` reservations, settlements, the spare wallet, leases;
  :mod:`~ccpo.runtime.state.answers` answers and feedback; :mod:`~ccpo.runtime.state.batch`
  the types they share);
- :mod:`~ccpo.runtime.state.backends`: the two databases behind one small interface
  (:mod:`~ccpo.runtime.state.db`, :mod:`~ccpo.runtime.state.sqlite`,
  :mod:`~ccpo.runtime.state.postgres`);
- :mod:`~ccpo.runtime.state.ledger`: the total budget's ledger on the store.
"""

from ccpo.runtime.state.backends import (
    DuplicateKey,
    StateUnavailable,
    is_database_url,
    safe_url,
    unstorable,
)
from ccpo.runtime.state.ledger import BudgetBusy, StoreLedger
from ccpo.runtime.state.store import SCHEMA_VERSION, StateStore

__all__ = [
    "SCHEMA_VERSION",
    "BudgetBusy",
    "DuplicateKey",
    "StateStore",
    "StateUnavailable",
    "StoreLedger",
    "is_database_url",
    "safe_url",
    "unstorable",
]
