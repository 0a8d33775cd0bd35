"""What the state store asks of a database, whichever it is
(:mod:`~ccpo.runtime.state.sqlite`, :mod:`~ccpo.runtime.state.postgres`).

- :class:`Backend`: a write transaction holding the store's one lock until it commits
  (``write``), a read (``read``), a write sent whole (``write_whole``: guarded steps, all or
  none), a checkpoint, and the SQL spellings that differ (``lock``, ``now``); :class:`Tx`: one
  open transaction (SQL written once, with ``?`` placeholders); :class:`Step`: one guarded
  statement of a write sent whole;
- the errors: :class:`DuplicateKey`, :class:`StateUnavailable`, :class:`OperationRefused`
  (public), :class:`Moved` and :class:`Busy` (a write sent whole that found the rows
  changed, or the lock held); :func:`database_away`: an error that is the database's, not
  one operation's;
- where a state may live: :func:`is_database_url`, :func:`safe_url` (printable, never a
  password), :func:`location_problem`; what may be stored: :func:`unstorable`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit

from ccpo.errors import CCPOError

POSTGRES_SCHEMES = ("postgresql", "postgres")


class DuplicateKey(CCPOError):
    """An insert met a row with the same key (e.g. an answer id used by a concurrent request)."""


class Moved(Exception):
    """A write sent whole (:meth:`Backend.write_whole`) found the rows it was computed from
    changed by another replica: nothing of it was done; the store redoes it the usual way."""


class Busy(Exception):
    """A write that may not wait (``write_whole(steps, wait=False)``) found the file's write
    lock held (by another process, or a checkpoint): nothing was done."""


class StateUnavailable(CCPOError):
    """The state database did not answer within the deadline, or failed: nothing was done
    (``ccpo serve`` answers a JSON 503 ``state_unavailable``)."""


class OperationRefused(CCPOError):
    """The database refused one operation (a statement of its own failed): nothing of it was
    done; the other operations of its transaction were redone without it and committed."""


def database_away(e: BaseException) -> bool:
    """``e`` says the database is away or busy (a connection lost, a lock, a time-out), not
    that one operation's statement is wrong: its transaction fails as a whole, retried."""
    if isinstance(e, sqlite3.OperationalError):
        return True
    psycopg = sys.modules.get("psycopg")  # (loaded when a PostgreSQL state is open)
    return psycopg is not None and isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)


def unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored as text by both backends (None: it can): a NUL character
    (PostgreSQL refuses it) or a lone surrogate (not UTF-8)."""
    if "\x00" in text:
        return "it contains a NUL character (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "it contains a lone surrogate (not valid UTF-8)"
    return None


Step = tuple[str, Sequence[Any], int]
"""One statement of a write sent whole: SQL (an INSERT or UPDATE, ``?`` placeholders), its
parameters, and how many rows it must change."""


class Tx(Protocol):
    """One open transaction."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    def send(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Send a statement now, read its rows later (``.fetchall()``): in PostgreSQL's write
        transactions statements sent one after the other go in one round trip."""
        ...


class Backend(Protocol):
    """A database the state store runs on."""

    kind: str  # "sqlite" | "postgresql"
    where: str  # printable: a path, or user@host:port/db (never a password)
    lock: str  # appended to the state row's SELECT in a write transaction
    now: str  # SQL: the database's clock, epoch seconds
    here: bool  # write_whole(steps, wait=False) is offered: it never waits (see SQLite)

    def write(self) -> contextlib.AbstractContextManager[Tx]: ...

    def write_whole(self, steps: Sequence[Step], wait: bool = True) -> None:
        """Run the ``steps`` as one transaction, durable when it returns, if each changes
        exactly the rows it expects; else none of them (:class:`Moved`). ``wait=False``
        (only where ``here``): without waiting for a lock or the disk, else :class:`Busy`."""
        ...

    def read(self) -> contextlib.AbstractContextManager[Tx]: ...

    def checkpoint(self) -> None:
        """Move what writes that may not wait appended to the log into the database."""
        ...

    def close(self) -> None: ...


def is_database_url(location: str) -> bool:
    """True for ``scheme://...`` (a database URL rather than a file path)."""
    return "://" in location


def safe_url(url: str) -> str:
    """``url`` as it may be printed: scheme, user, host, port and database, no password."""
    u = urlsplit(url)
    user = f"{u.username}@" if u.username else ""
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{user}{u.hostname or ''}{port}{u.path}"


def location_problem(location: str) -> str | None:
    """Why ``location`` cannot be a state (None: it can be): a URL of a store ccpo does not
    know, or a PostgreSQL URL holding a password. The message shows no password; the config
    checks it (so that it names ``--state`` or the config's key) and :func:`open_backend`."""
    if not is_database_url(location):
        return None
    scheme = location.split("://", 1)[0].lower()
    if scheme not in POSTGRES_SCHEMES:
        return (
            f"'{scheme}://' is not a store ccpo knows; give a SQLite file path or "
            "postgresql://USER@HOST:PORT/DB"
        )
    try:
        shown = safe_url(location)
    except ValueError as e:  # a port that is not a number, ...
        return f"not a database URL ({e}); give postgresql://USER@HOST:PORT/DB"
    if urlsplit(location).password:
        return (
            f"{shown}: the URL holds a password; give it in $PGPASSWORD or "
            "~/.pgpass instead (it must not be in a config file or on a command line)"
        )
    return None


class _Tx:
    """:class:`Tx` over a DB-API connection; subclasses say how a statement is executed."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def _execute(self, sql: str, params: Sequence[Any]) -> Any:
        raise NotImplementedError

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._execute(sql, params)

    def send(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self._execute(sql, params)
