"""Where ``ccpo serve`` keeps its state: an embedded SQLite file (the default, nothing to start)
or a PostgreSQL database shared by several replicas (``server.state: postgresql://...``).

Both offer the same four things to :class:`~ccpo.runtime.state.store.StateStore`: a write
transaction that holds the store's one lock until it commits (:meth:`Backend.write`), a read
(:meth:`Backend.read`), a write sent whole (:meth:`Backend.write_whole`: guarded steps, all
or none, in PostgreSQL one prepared statement) and the SQL spellings that differ (``lock``:
the row-lock clause; ``now``: the database's clock in epoch seconds). SQL is written once,
with ``?`` placeholders. SQLite also offers a write sent whole that never waits (``here``)
and the checkpoint that goes with it (:meth:`Backend.checkpoint`; PostgreSQL: nothing to do).

- **SQLite**: the writer's connection, ``BEGIN IMMEDIATE`` takes the file's write lock (so
  a second process on the same file waits, never interleaves); WAL journal. A second
  connection that never waits (busy timeout 0, no automatic checkpoint) runs a write sent
  whole on the calling thread (``write_whole(steps, wait=False)``): it only appends to the
  WAL, in the page cache (``synchronous=NORMAL``: no fsync at commit), or fails at once
  (:class:`Busy`); checkpoints, which do fsync, run on the writer's connection
  (:meth:`SQLiteBackend.checkpoint`).
- **PostgreSQL** (``pip install 'ccpo[postgres]'``: psycopg 3 and its pool): a small
  connection pool; a write transaction locks the store's one state row with ``SELECT ... FOR
  UPDATE`` (the store does that), which serialises every write of every replica at that row.
  The URL carries no password: libpq takes it from ``$PGPASSWORD`` or ``~/.pgpass``, and no
  message ever prints more of the URL than user, host, port and database.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from ccpo.errors import CCPOError

POSTGRES_SCHEMES = ("postgresql", "postgres")
log = logging.getLogger("ccpo.serve")


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


def open_backend(location: str | Path | None, timeout: float = 5.0) -> Backend:
    """The backend for ``server.state``: None (in memory), a file path (SQLite) or a
    ``postgresql://USER@HOST:PORT/DB`` URL. Anything else with ``://`` is refused.
    ``timeout``: seconds to wait for a connection or the database's lock."""
    if location is None:
        return SQLiteBackend(None, timeout)
    loc = str(location)
    if not is_database_url(loc):
        return SQLiteBackend(Path(loc), timeout)
    problem = location_problem(loc)
    if problem is not None:
        raise CCPOError(f"server.state: {problem}")
    return PostgresBackend(loc, connect_timeout=timeout)


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


# ----------------------------------------------------------------------------- SQLite
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


# ----------------------------------------------------------------------------- PostgreSQL
class _Later:
    """The rows of a statement sent in a batch, read once the batch has gone."""

    def __init__(self, tx: _PgTx) -> None:
        self.tx = tx
        self.rows: list[tuple[Any, ...]] | None = None

    def fetchall(self) -> list[tuple[Any, ...]]:
        if self.rows is None:
            self.tx.flush()
        assert self.rows is not None
        return self.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self.fetchall()
        return rows[0] if rows else None


class _PgTx(_Tx):
    """Statements are queued and go out together, in one round trip, when a result is read
    (or the transaction commits): e.g. BEGIN, the answers' insert, the state row's lock and
    the leases' read in one; the lease and state writes with COMMIT in another. They are
    bound client-side (psycopg's ``ClientCursor``, PostgreSQL's simple query protocol: the
    one that takes several statements at once)."""

    def __init__(self, conn: Any, begin: bool = False) -> None:
        super().__init__(conn)
        self._queued: list[tuple[str, Sequence[Any], _Later | None]] = []
        if begin:
            self.run("BEGIN")

    def send(self, sql: str, params: Sequence[Any] = ()) -> _Later:
        later = _Later(self)
        self._queued.append((sql, params, later))
        return later

    def run(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._queued.append((sql, params, None))

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self.send(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.send(sql, params).fetchall()

    def flush(self) -> None:
        """Send what is queued, in one round trip; each statement's rows to its reader."""
        import psycopg

        queued, self._queued = self._queued, []
        if not queued:
            return
        cur = psycopg.ClientCursor(self.conn)
        # the SQL is written with ? placeholders; psycopg's are %s; bound in one call
        text = cur.mogrify(
            "; ".join(q.replace("?", "%s") for q, _, _ in queued),
            [x for _, p, _ in queued for x in p],
        )
        tuples = psycopg.pq.ExecStatus.TUPLES_OK
        with _errors():
            cur.execute(text)
            for k, (_, _, later) in enumerate(queued):
                if k:
                    cur.nextset()
                if later is not None:  # (the status, not .description: no column objects)
                    res = cur.pgresult
                    later.rows = cur.fetchall() if res and res.status == tuples else []


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    """A unique-key violation as :class:`DuplicateKey` (met when a result is read: in a
    pipeline that is later than the statement was sent); a division by zero, the guard of a
    write sent whole (the store's only division), as :class:`Moved`."""
    import psycopg

    try:
        yield
    except psycopg.errors.UniqueViolation as e:
        raise DuplicateKey(str(e).splitlines()[0]) from None
    except psycopg.errors.DivisionByZero:  # the guard of write_whole (no other SQL divides)
        raise Moved() from None


class PostgresBackend:
    """PostgreSQL through psycopg 3 and a connection pool (shared by the replicas)."""

    kind = "postgresql"
    lock = " FOR UPDATE"
    _prepare = True  # a write sent whole is a prepared statement (until that fails once)
    now = "extract(epoch from clock_timestamp())::float8"
    here = False  # every write is a round trip: never on an event loop

    def __init__(self, url: str, pool_size: int = 4, connect_timeout: float = 5.0) -> None:
        self.where = safe_url(url)
        problem = location_problem(url)
        if problem is not None:
            raise CCPOError(f"server.state: {problem}")
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise CCPOError(
                "a PostgreSQL state needs psycopg 3 and its pool: pip install 'ccpo[postgres]'"
            ) from None
        # check the database is there first: one line naming the host, never the password
        try:
            psycopg.connect(url, connect_timeout=max(1, round(connect_timeout))).close()
        except psycopg.Error as e:
            first = (str(e).strip().splitlines() or ["unknown error"])[0]
            raise CCPOError(f"cannot reach the state database {self.where}: {first}") from None
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            # a server gone silent is noticed by TCP keep-alives; a broken connection is
            # dropped by the pool when the transaction that met it fails
            kwargs={
                "autocommit": True,
                "connect_timeout": max(2, round(connect_timeout)),
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
            },
            timeout=connect_timeout,
            open=True,
            name="ccpo-state",
        )

    @contextlib.contextmanager
    def write(self) -> Iterator[Tx]:
        with self._pool.connection() as conn:
            tx = _PgTx(conn, begin=True)
            try:
                yield tx
                tx.run("COMMIT")
                tx.flush()
            except BaseException:
                if not conn.closed and conn.info.transaction_status != 0:  # not idle
                    with contextlib.suppress(Exception):
                        conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def read(self) -> Iterator[Tx]:
        with self._pool.connection() as conn:
            yield _PgTx(conn)

    def checkpoint(self) -> None:
        """Nothing to do: PostgreSQL checkpoints by itself."""

    def write_whole(self, steps: Sequence[Step], wait: bool = True) -> None:
        """One statement, so one round trip and its own transaction (autocommit): the steps
        as data-modifying CTEs, and a guard that divides by zero (undoing the statement)
        unless each changed the rows it expected. Bound by the server and prepared: its plan
        is made once per connection rather than per call."""
        import psycopg

        ctes = [f"s{k} AS ({sql} RETURNING 1)" for k, (sql, _, _) in enumerate(steps)]
        ok = " AND ".join(f"(SELECT count(*) FROM s{k}) = {n}" for k, (_, _, n) in enumerate(steps))
        sql = f"WITH {', '.join(ctes)} SELECT 1 / ({ok})::int"
        params = [x for _, p, _ in steps for x in p]
        prepare = self._prepare
        try:
            with self._pool.connection() as conn, _errors():
                conn.execute(sql.replace("?", "%s"), params, prepare=prepare)
        except (
            psycopg.errors.InvalidSqlStatementName,  # a pooler in transaction mode lost it
            psycopg.errors.DuplicatePreparedStatement,  # or gave us another client's session
        ) as e:
            if not prepare:
                raise
            self._prepare = False  # nothing was run: the store redoes the batch its usual way
            log.warning(
                "state database %s: prepared statements do not last here (%s; a connection "
                "pooler in transaction mode?); writes sent whole are no longer prepared",
                self.where,
                str(e).strip().splitlines()[0],
            )
            raise Moved() from None

    def close(self) -> None:
        self._pool.close()
