"""The state store's tables and their version: created on first start, checked on every
start, older versions converted in place (:class:`Schema`, the check
:class:`~ccpo.runtime.state.store.StateStore` runs as it opens).

- ``_DDL``: the tables (``ccpo_meta``, ``ccpo_state``: the one state row, ``ccpo_leases``,
  ``ccpo_answers``); ``SCHEMA_VERSION``: their version, kept in ``ccpo_meta``;
- :meth:`Schema.open`: create or check (a newer version, another format or another policy
  artifact's fingerprint is refused), convert v1 (the one-process SQLite format), v2 and v3
  (leases without ``idle`` / ``waiting``), v4 (without ``owner`` / ``proc``) in place;
- :func:`tracker_json`, :func:`state_texts`, :func:`parse_state`: the state row's columns
  (κ's tracker and the counters, as JSON) written and read;
- ``VERSION_SQL``, :func:`check_version`, :class:`SchemaChanged`: every transaction
  reads the version with the state row and refuses to write into another version (a newer
  ccpo converted the tables while this replica serves: docs/deploy.md, "Upgrading").

PostgreSQL replicas starting at once create the tables under an advisory lock.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from typing import Any

from ccpo.errors import CCPOError
from ccpo.learning.conformal import OnlineThreshold
from ccpo.runtime.feedback import Counters
from ccpo.runtime.state.db import Backend, StateUnavailable, Tx

log = logging.getLogger("ccpo.serve")

SCHEMA_VERSION = 5  # 1: the one-process SQLite format (tables kv, answers); 2: no leases.idle;
# 3: no leases.waiting; 4: leases without owner and proc (owned by host and pid)
STATE_FORMAT = "ccpo.serve-state"
WORST_KEY = "question_worst_usd"  # in ccpo_meta: the largest worst case a question held
VERSION_SQL = "(SELECT value FROM ccpo_meta WHERE key = 'schema_version')"  # read in every tx
_SCHEMA_LOCK = 0x63_63_70_6F  # PostgreSQL advisory lock id while creating tables ("ccpo")

_DDL = (
    "CREATE TABLE IF NOT EXISTS ccpo_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_state (id INTEGER PRIMARY KEY, tracker TEXT NOT NULL,"
    " counters TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ccpo_leases (replica TEXT PRIMARY KEY, host TEXT NOT NULL,"
    " pid INTEGER NOT NULL, reserved_usd DOUBLE PRECISION NOT NULL,"
    " inflight_usd DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL,"
    " idle INTEGER NOT NULL DEFAULT 0, waiting INTEGER NOT NULL DEFAULT 0,"
    " owner TEXT NOT NULL DEFAULT '', proc TEXT NOT NULL DEFAULT '')",
    "CREATE TABLE IF NOT EXISTS ccpo_answers (id TEXT PRIMARY KEY, question TEXT NOT NULL,"
    " answer TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, feedback TEXT, replica TEXT)",
    "CREATE INDEX IF NOT EXISTS ccpo_answers_created ON ccpo_answers (created)",
)

_TRACKER_FIELDS = tuple(f.name for f in fields(OnlineThreshold))


def tracker_json(t: OnlineThreshold) -> dict[str, Any]:
    """κ's tracker as JSON values (its fields are numbers: no deep copy)."""
    return {f: getattr(t, f) for f in _TRACKER_FIELDS}


def state_texts(tracker: OnlineThreshold, counters: Counters) -> tuple[str, str]:
    """The state row's ``tracker`` and ``counters`` columns, as written."""
    return json.dumps(tracker_json(tracker)), json.dumps(counters.to_json())


def _migrate_owners(tx: Tx) -> None:
    """v4 → v5: a lease learns its owner (a random token per process) and where its process
    can be checked for life; leases written before have neither (empty: they end when they
    expire, or when their replica id starts again)."""
    for col in ("owner", "proc"):
        tx.run(f"ALTER TABLE ccpo_leases ADD COLUMN {col} TEXT NOT NULL DEFAULT ''")


class SchemaChanged(StateUnavailable):
    """The tables have another schema version than this replica's (a newer ccpo converted
    them): it writes nothing more, and says so (``ccpo serve`` answers a JSON 503
    ``state_unavailable`` naming both versions; ``/healthz`` is degraded)."""


def version_problem(found: Any) -> str | None:
    """Why a replica may not write to tables of schema version ``found`` (None: it may)."""
    if str(found) == str(SCHEMA_VERSION):
        return None
    if str(found).isdigit() and int(found) > SCHEMA_VERSION:
        return (
            f"its tables have schema version {found}, newer than this replica's "
            f"({SCHEMA_VERSION}): a newer ccpo converted them while this one serves; this "
            "replica writes nothing more: stop it and start the newer ccpo in its place "
            '(docs/deploy.md, "Upgrading")'
        )
    return (
        f"its tables have schema version {found}, not this replica's ({SCHEMA_VERSION}); "
        "this replica writes nothing more: restart it (it converts older tables as it starts)"
    )


def check_version(found: Any) -> None:
    """:class:`SchemaChanged` unless ``found`` (the version a transaction read) is this
    replica's."""
    why = version_problem(found)
    if why is not None:
        raise SchemaChanged(why)


def version_moved(db: Backend) -> None:
    """After a transaction failed: :class:`SchemaChanged` if the tables have another version
    now (a newer ccpo may have changed what the statement used); else nothing (the failure
    is reported as it was)."""
    try:
        with db.read() as tx:
            row = tx.one(f"SELECT {VERSION_SQL}")
    except Exception:  # the database is away: the failure says so itself
        return
    if row is not None:
        check_version(row[0])


def parse_state(where: str, row: tuple[Any, ...] | None) -> tuple[OnlineThreshold, Counters]:
    """κ's tracker and the counters of the state row (tracker, counters, ...) of the state
    at ``where``."""
    if row is None:
        raise CCPOError(f"{where}: the state row is missing; was it cleared?")
    return OnlineThreshold(**json.loads(row[0])), Counters.from_json(json.loads(row[1]))


class Schema:
    """The tables of the state on ``db``: created, or checked and converted, by :meth:`open`
    (the store then runs its first transaction, which takes the lease)."""

    def __init__(self, db: Backend) -> None:
        self.db = db
        self.where = db.where
        self.known_worst = 0.0  # WORST_KEY as the store opened

    def open(self, fingerprint: str, tracker: OnlineThreshold) -> bool:
        """Create the tables, or check and convert them; whether the state existed before."""
        with self.db.write() as tx:
            if self.db.kind == "postgresql":  # two replicas starting at once: one creates
                tx.one("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            v1 = self._read_v1(tx)
            for stmt in _DDL:
                tx.run(stmt)
            meta = dict(tx.all("SELECT key, value FROM ccpo_meta"))
            if not meta and v1 is not None:
                meta = self._migrate_v1(tx, v1, fingerprint)
            if meta:
                version = int(meta.get("schema_version", "0"))
                if version > SCHEMA_VERSION:
                    raise CCPOError(
                        f"{self.where}: the state has schema version {version}, newer than "
                        f"this ccpo's ({SCHEMA_VERSION}); upgrade ccpo on this replica"
                    )
                if meta.get("format") != STATE_FORMAT:
                    raise CCPOError(f"{self.where}: not a ccpo serve state")
                if meta.get("fingerprint") != fingerprint:
                    raise CCPOError(
                        f"{self.where}: this state belongs to another policy artifact; use "
                        "another state (or delete it to start afresh)"
                    )
                if version in (2, 3):  # leases learn whether their replica waits for room
                    for col in ("idle", "waiting")[version - 2 :]:
                        add = f"ALTER TABLE ccpo_leases ADD COLUMN {col} INTEGER NOT NULL"
                        tx.run(add + " DEFAULT 0")
                if version in (2, 3, 4):
                    _migrate_owners(tx)
                if 2 <= version < SCHEMA_VERSION:
                    tx.run(
                        "UPDATE ccpo_meta SET value = ? WHERE key = 'schema_version'",
                        (str(SCHEMA_VERSION),),
                    )
                self.known_worst = float(meta.get(WORST_KEY, "0"))
                restored = True
            else:
                self._create(tx, fingerprint, tracker, Counters())
                restored = False
        return restored

    @staticmethod
    def _create(
        tx: Tx, fingerprint: str, tracker: OnlineThreshold, counters: Counters
    ) -> dict[str, str]:
        """Write the meta rows (schema version, format, the policy's fingerprint) and the one
        state row of a new store; returns the meta rows."""
        meta = {
            "schema_version": str(SCHEMA_VERSION),
            "format": STATE_FORMAT,
            "fingerprint": fingerprint,
        }
        for k, v in meta.items():
            tx.run("INSERT INTO ccpo_meta (key, value) VALUES (?, ?)", (k, v))
        tx.run(
            "INSERT INTO ccpo_state (id, tracker, counters) VALUES (1, ?, ?)",
            state_texts(tracker, counters),
        )
        return meta

    def _read_v1(self, tx: Tx) -> dict[str, str] | None:
        """The key/value table of a one-process SQLite state file (format v1), if this is one."""
        if self.db.kind != "sqlite" or not tx.one(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kv'"
        ):
            return None
        return dict(tx.all("SELECT key, value FROM kv"))

    def _migrate_v1(self, tx: Tx, kv: dict[str, str], fingerprint: str) -> dict[str, str]:
        """Convert a v1 file in place: its tracker, counters and answers carry over; what it
        had in flight when it stopped counts as spent."""
        if kv.get("format") != "ccpo.serve-state/v1":
            raise CCPOError(f"{self.where}: not a ccpo serve state file")
        if kv.get("fingerprint") != fingerprint:
            raise CCPOError(
                f"{self.where}: this state file belongs to another policy artifact; use "
                "another state (or delete it to start afresh)"
            )
        tracker = OnlineThreshold(**json.loads(kv["tracker"]))
        counters = Counters.from_json(json.loads(kv["counters"]))
        counters.spent_usd += counters.inflight_usd
        counters.inflight_usd = counters.reserved_usd = 0.0
        meta = self._create(tx, fingerprint, tracker, counters)
        tx.run(
            "INSERT INTO ccpo_answers (id, question, answer, created, feedback) "
            "SELECT id, question, answer, created, feedback FROM answers"
        )
        tx.run("DROP TABLE answers")
        tx.run("DROP TABLE kv")
        log.warning("%s: converted from the one-process state format (v1)", self.where)
        return meta
