"""The PostgreSQL journal store: the rules of journal_store.py, on a shared server.

Rules of this module (beyond those of ``journal_store.py``):

- An append is one statement in autocommit: a data-modifying CTE moves the
  head row from the expected head (``UPDATE ... WHERE head = %s``) and
  inserts the events only if it did.  The statement is atomic, so nothing
  is half-written; a concurrent appender that expected the same head waits
  for the row lock, then finds the head changed, updates nothing and
  inserts nothing, and is refused ``stale_head``.  One round trip per
  append, the same as a bare insert.  An append of one event (a
  transition's) passes its ordinal, digest and record as plain parameters;
  only a batch passes them as arrays to ``unnest``, whose dumping and
  planning cost more than the rest of the statement.
- A load reads the header, the head row and the events in one REPEATABLE
  READ snapshot, so the head it checks is the head of the events it read.
- The schema must have been migrated (``fencekeeper migrate``); opening
  runs the same deployment check as the PostgreSQL execution store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from fencekeeper.kernel import journal as j

from .journal_store import JournalStoreBase, StoredChain, Tail
from .postgres_store import _one_line, _safe, check_schema, check_schema_name, permission_denied
from .store import Clock, StoreError, checked_again_if_lost

# The head's compare-and-set, and the insert that runs only if it moved: every append's guard.
_MOVE_HEAD_THEN_INSERT = """
WITH moved AS (
    UPDATE journal_heads SET head = %s, length = %s
    WHERE execution_id = %s AND head = %s
    RETURNING execution_id
)
INSERT INTO journal_events (execution_id, ordinal, digest, record)
"""

_APPEND = _MOVE_HEAD_THEN_INSERT + """SELECT moved.execution_id, e.ordinal, e.digest, e.record
FROM moved, unnest(%s::integer[], %s::text[], %s::bytea[]) AS e(ordinal, digest, record)
"""

# The same statement for the common case of one event: the same guard and
# the same atomicity, without building, sending and unnesting three arrays.
_APPEND_ONE = _MOVE_HEAD_THEN_INSERT + """SELECT moved.execution_id, %s::integer, %s::text, %s::bytea FROM moved
"""

_CREATE = """
WITH header AS (
    INSERT INTO journal_headers (execution_id, header, digest, workflow, policy)
    VALUES (%s, %s, %s, %s, %s)
    ON CONFLICT (execution_id) DO NOTHING
    RETURNING execution_id, digest
)
INSERT INTO journal_heads (execution_id, head, length) SELECT execution_id, digest, 0 FROM header
"""


class PostgresJournalStore(JournalStoreBase):
    """Journals in one PostgreSQL schema; one connection per store object, shared between threads under a lock."""

    def __init__(self, dsn: str, *, schema: str = "fencekeeper", clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.schema = check_schema_name(schema)
        self._lock = threading.Lock()
        self._dsn = dsn
        self._conn = self._connect()
        self._cursor: psycopg.Cursor[Any] | None = None
        self._closed = False
        def check() -> None:
            # A connection lost before the check is answered (a backend ended, a failover) is replaced
            # for the next try: the store then opens as the same loss a moment later would be ridden out.
            if self._conn.broken:
                self._conn = self._connect()
            check_schema(self._conn, self.schema)

        try:
            checked_again_if_lost(check, psycopg.OperationalError)
        except psycopg.OperationalError as exc:
            # Lost between the connection and the check, every try: what every other call of the store says of it.
            self._conn.close()
            raise StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}") from None
        except BaseException:
            self._conn.close()
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._dsn, autocommit=True, options=f"-c search_path={self.schema}", connect_timeout=10)
        except psycopg.Error as exc:
            raise StoreError(
                "store_unavailable", f"cannot connect to PostgreSQL ({_safe(self._dsn)}): {_one_line(exc)}"
            ) from None

    def _connected(self) -> psycopg.Connection[Any]:
        # Called under the lock.  A connection the server or the network lost
        # (broken, not closed by close()) is opened again for the next call: the
        # call that found it dead has already failed store_unavailable, and an
        # append whose outcome it left unknown is settled by the head's
        # compare-and-set on the next one.  A long-lived process keeps working
        # after a restart of the server or a failover.
        if self._closed:
            # Else the connection close() closed was opened again, and nothing would close it.
            raise StoreError("store_unavailable", f"the PostgreSQL journal store of schema {self.schema} is closed")
        if self._conn.broken or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _statements(self) -> psycopg.Cursor[Any]:
        # Called under the lock.  One cursor for the store's single statements,
        # made again with each connection: Connection.execute builds a cursor
        # (and copies the adapters map) for every statement, some 10 us of CPU
        # on a statement that costs 25-35 in all.
        conn = self._connected()
        if self._cursor is None or self._cursor.connection is not conn:
            self._cursor = conn.cursor()
        return self._cursor

    def _lost(self, exc: psycopg.OperationalError) -> StoreError:
        """The error of a call that met a lost connection, which is closed so that the next call opens another.

        psycopg marks most lost connections broken, but not all: a backend
        terminated between two calls can leave libpq still waiting on the
        command it sent ("another command is already in progress" on the
        next).  Whatever the connection says of itself, it is not used again.
        """
        with contextlib.suppress(Exception):
            self._conn.close()
        return StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}")

    def _privileges(self, statement: Any, params: Sequence[object]) -> list[tuple[Any, ...]]:
        # Called under the lock, from a refused call: the store's one connection is idle again.
        return self._conn.execute(statement, params).fetchall()

    def _run(self, sql: str, params: Sequence[Any]) -> int:
        with self._lock:
            try:
                return self._statements().execute(sql, params).rowcount
            except psycopg.errors.InsufficientPrivilege as exc:
                # An append is one autocommit statement, a read one transaction rolled back on the way
                # out: nothing was written, and the connection is free for the lookup.
                raise permission_denied(exc, self._privileges) from None
            except psycopg.OperationalError as exc:
                raise self._lost(exc) from None

    def _insert_header(self, journal: j.Journal, workflow: bytes, policy: bytes) -> bool:
        header = journal.header
        inserted = self._run(_CREATE, (header.execution_id, j.encode_header(header), header.digest, workflow, policy))
        return inserted == 1

    def _commit_events(
        self, execution_id: str, expected: str, events: Sequence[tuple[j.Event, bytes]], length: int
    ) -> bool:
        if len(events) == 1:
            event, record = events[0]
            params = (event.digest, length, execution_id, expected, event.ordinal, event.digest, record)
            return self._run(_APPEND_ONE, params) == 1
        written = self._run(
            _APPEND,
            (
                events[-1][0].digest,
                length,
                execution_id,
                expected,
                [e.ordinal for e, _ in events],
                [e.digest for e, _ in events],
                [record for _, record in events],
            ),
        )
        return written == len(events)

    def _stored(self, execution_id: str) -> StoredChain | None:
        with self._lock:
            try:
                conn = self._connected()
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    row = conn.execute(
                        "SELECT h.header, h.workflow, h.policy, g.head, g.length, h.digest FROM journal_headers h "
                        "JOIN journal_heads g USING (execution_id) WHERE h.execution_id = %s",
                        (execution_id,),
                    ).fetchone()
                    if row is None:
                        return None
                    events = conn.execute(
                        "SELECT record, digest, ordinal FROM journal_events WHERE execution_id = %s ORDER BY ordinal",
                        (execution_id,),
                    ).fetchall()
            except psycopg.errors.InsufficientPrivilege as exc:
                raise permission_denied(exc, self._privileges) from None
            except psycopg.OperationalError as exc:
                raise self._lost(exc) from None
        return StoredChain(
            execution_id=execution_id,
            header=bytes(row[0]),
            events=tuple(bytes(r[0]) for r in events),
            workflow=bytes(row[1]),
            policy=bytes(row[2]),
            head=str(row[3]),
            length=int(row[4]),
            header_digest=str(row[5]),
            event_digests=tuple(str(r[1]) for r in events),
            event_ordinals=tuple(int(r[2]) for r in events),
        )

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._statements().execute(sql, params).fetchall()
            except psycopg.errors.InsufficientPrivilege as exc:
                raise permission_denied(exc, self._privileges) from None
            except psycopg.OperationalError as exc:
                raise self._lost(exc) from None

    def _stored_head(self, execution_id: str) -> str | None:
        rows = self._fetch("SELECT head FROM journal_heads WHERE execution_id = %s", (execution_id,))
        return str(rows[0][0]) if rows else None

    def _header_row(self, execution_id: str) -> tuple[bytes, str] | None:
        rows = self._fetch("SELECT header, digest FROM journal_headers WHERE execution_id = %s", (execution_id,))
        return (bytes(rows[0][0]), str(rows[0][1])) if rows else None

    def _tail(self, execution_id: str, after: int) -> Tail | None:
        with self._lock:
            try:
                conn = self._connected()
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    row = conn.execute(
                        "SELECT head, length FROM journal_heads WHERE execution_id = %s", (execution_id,)
                    ).fetchone()
                    if row is None:
                        return None
                    events = conn.execute(
                        "SELECT record, digest, ordinal FROM journal_events WHERE execution_id = %s AND ordinal > %s "
                        "ORDER BY ordinal",
                        (execution_id, after),
                    ).fetchall()
            except psycopg.errors.InsufficientPrivilege as exc:
                raise permission_denied(exc, self._privileges) from None
            except psycopg.OperationalError as exc:
                raise self._lost(exc) from None
        return (
            [bytes(r[0]) for r in events],
            [str(r[1]) for r in events],
            [int(r[2]) for r in events],
            str(row[0]),
            int(row[1]),
        )

    def execution_ids(self) -> list[str]:
        rows = self._fetch("SELECT execution_id FROM journal_headers ORDER BY execution_id", ())
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()
        with self._cache_lock:
            # Nothing is answered from it after close: an append of repeats only would have been.
            self._cache.clear()
