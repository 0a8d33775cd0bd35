"""The state database shared by several replicas (:class:`PostgresBackend`, ``server.state:
postgresql://...``; ``pip install 'ccpo[postgres]'``: psycopg 3 and its pool).

A small connection pool; a write transaction's statements are queued and go out together, in
one round trip, when a result is read or it commits (:class:`_PgTx`); the store locks its one
state row with ``SELECT ... FOR UPDATE``, which serialises every write of every replica at that
row. A write sent whole is one prepared statement of data-modifying CTEs with a guard that
divides by zero unless each step changed the rows it expected. The URL carries no password:
libpq takes it from ``$PGPASSWORD`` or ``~/.pgpass``, and no message ever prints more of the
URL than user, host, port and database.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from ccpo.errors import CCPOError
from ccpo.runtime.state.db import DuplicateKey, Moved, Step, Tx, _Tx, location_problem, safe_url

log = logging.getLogger("ccpo.serve")


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

    def __init__(self, conn: Any, begin: Sequence[str] = ()) -> None:
        super().__init__(conn)
        self._queued: list[tuple[str, Sequence[Any], _Later | None]] = []
        for sql in begin:  # (BEGIN and what the transaction sets)
            self.run(sql)

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

    def __init__(
        self,
        url: str,
        pool_size: int = 4,
        connect_timeout: float = 5.0,
        replica: str | None = None,
    ) -> None:
        self.where = safe_url(url)
        # what a replica frozen (SIGSTOP, a pause of its host) or cut off in the middle of a
        # transaction may cost the others, which wait for the state row's lock it holds: the
        # server ends its transaction (and session) after this long idle, and a statement
        # waiting this long for a lock gives up; the state timeout, at least 1 s
        self.limit_ms = max(1000, round(connect_timeout * 1000))
        limits = [
            f"SET {{}}{name} = {self.limit_ms}"
            for name in ("idle_in_transaction_session_timeout", "lock_timeout")
        ]
        # set on each session as the pool opens it (statements sent whole, reads), and in
        # each write transaction (a pooler in transaction mode may hand any server session)
        self._session = "; ".join(x.format("") for x in limits)
        self._begin = ["BEGIN", *(x.format("LOCAL ") for x in limits)]
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
                # who holds what, in pg_stat_activity and the server's log
                "application_name": f"ccpo/{replica or 'replica'}"[:63],
            },
            configure=self._configure,
            timeout=connect_timeout,
            open=True,
            name="ccpo-state",
        )

    def _configure(self, conn: Any) -> None:
        """A new session: the limits on a frozen replica's transaction (see ``__init__``)."""
        conn.execute(self._session)

    @contextlib.contextmanager
    def write(self) -> Iterator[Tx]:
        with self._pool.connection() as conn:
            tx = _PgTx(conn, begin=self._begin)
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
