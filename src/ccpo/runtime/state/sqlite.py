"""The embedded state database (:class:`SQLiteBackend`), the default: one SQLite file, or in
memory, nothing to start.

The writer's connection takes the file's write lock with ``BEGIN IMMEDIATE`` (a second
process on the same file waits, never interleaves); WAL journal, ``synchronous=NORMAL``. A
second connection that never waits (busy timeout 0, no automatic checkpoint) runs a write sent
whole on the calling thread (``write_whole(steps, wait=False)``): it only appends to the WAL,
in the page cache, or fails at once (:class:`~ccpo.runtime.state.db.Busy`); checkpoints, which
do sync the disk, run on the writer's connection (:meth:`SQLiteBackend.checkpoint`).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ccpo.errors import CCPOError
from ccpo.runtime.state.db import Busy, DuplicateKey, Moved, Step, Tx, _Tx


class _Rows:
    """A statement's rows, read already."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


class _SQLiteTx(_Tx):
    def _execute(self, sql: str, params: Sequence[Any]) -> Any:
        try:
            return self.conn.execute(sql, tuple(params))
        except sqlite3.IntegrityError as e:
            raise DuplicateKey(str(e)) from None

    def send(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return _Rows(self._execute(sql, params).fetchall())


class SQLiteBackend:
    """The embedded default: one SQLite file (``path=None``: in memory, lost on exit)."""

    kind = "sqlite"
    lock = ""
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    here = True  # write_whole(steps, wait=False): appends to the WAL or fails at once

    def __init__(self, path: Path | None, timeout: float = 30.0) -> None:
        self.path = path
        self.where = str(path) if path is not None else "(in memory)"
        self._lock = threading.Lock()
        self._nowait: sqlite3.Connection | None = None  # (in memory: the one connection)
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._connect(timeout)
            self._db.execute("PRAGMA journal_mode=WAL")
            if path is not None:  # (a second connection to :memory: is another database)
                self._nowait = self._connect(0.0)
                self._nowait.execute("PRAGMA wal_autocheckpoint=0")  # the writer's to do
        except (sqlite3.DatabaseError, OSError) as e:
            raise CCPOError(f"{self.where}: not a usable state file ({e})") from None

    def _connect(self, timeout: float) -> sqlite3.Connection:
        db = sqlite3.connect(
            str(self.path) if self.path else ":memory:",
            isolation_level=None,
            check_same_thread=False,
            timeout=timeout,
        )
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    @contextlib.contextmanager
    def write(self) -> Iterator[Tx]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield _SQLiteTx(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[Tx]:
        with self._lock:
            yield _SQLiteTx(self._db)

    def write_whole(self, steps: Sequence[Step], wait: bool = True) -> None:
        """The steps in one transaction, rolled back at the first that changes other rows
        than it expects. ``wait=False``: on the connection that never waits (its caller
        keeps it to one thread at a time), :class:`Busy` if the write lock is held."""
        if wait:
            with self._lock:
                self._whole(self._db, steps)
            return
        if self._nowait is None:  # in memory: no file, no other process; the one connection
            if not self._lock.acquire(blocking=False):
                raise Busy()
            try:
                self._whole(self._db, steps)
            finally:
                self._lock.release()
            return
        try:
            self._nowait.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                raise Busy() from None
            raise
        self._whole(self._nowait, steps, begun=True)

    @staticmethod
    def _whole(db: sqlite3.Connection, steps: Sequence[Step], begun: bool = False) -> None:
        if not begun:
            db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params, n in steps:
                if db.execute(sql, tuple(params)).rowcount != n:
                    raise Moved()
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def checkpoint(self) -> None:
        """A passive checkpoint on the writer's connection (waits for no reader or writer)."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()
            if self._nowait is not None:
                self._nowait.close()
