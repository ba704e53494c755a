"""The SQLite operation store: durable operations in the same file as the executions.

Rules of this module:

- Opening the file goes through the SQLite store's own checks and
  migrations (``sqlite_store``), so an operation store and an execution
  store on one file agree on its schema.
- Every request is one ``BEGIN IMMEDIATE`` transaction: the file's write
  lock is taken before anything is read, so the row a decision is made on
  is the row its write lands on, across threads and processes.  Concurrent
  identical submissions therefore serialize, and the second one finds the
  first's Operation.
- Time is the store's clock (SQLite has no server time), read inside the
  transaction.  An atomic action runs on the same connection, inside that
  transaction, through the guarded context.
- An atomic action's statements are compiled under an authorizer that
  judges only while one of them runs (the store's own BEGIN and COMMIT
  must not meet it): it denies transaction statements (BEGIN, COMMIT,
  ROLLBACK, END), SAVEPOINT and RELEASE, ATTACH and DETACH, every PRAGMA,
  and any write, drop, alteration, index or trigger on the store's own
  tables (and a table or view that would shadow one).  The authorizer is
  installed once, with the connection: installing or removing one expires
  every prepared statement, and compiling the store's statements again
  after each atomic action cost more than the action.  SQLite judges a
  statement when it compiles it, and Python's statement cache reuses a
  compiled one by its text, so an application statement is sent with a
  marker comment after it (``APPLICATION_MARK``): its text is never one of
  the store's statements, compiled unjudged.
- One hung transaction (an action that never returns, a stopped process)
  holds the file's write lock: every other writer of the file waits for it
  up to the busy timeout and then fails (``store_unavailable`` here).
  SQLite has a single writer and no server to end a stalled session;
  docs/operations.md says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import codec
from ..sqlite_store import BUSY_TIMEOUT_MS, MIGRATIONS, _expected_fingerprint, _open, _open_read_only, begin_error
from ..store import Clock, StoreError, SystemClock
from .base import TransactionalOperationStore, Tx
from .ports import OperationView
from .sql import OpsDialect, SqlTx, TransactionEscaped, refusal

SQLITE_OPS = OpsDialect(
    name="sqlite",
    encode_time=codec.encode_time,
    decode_time=codec.decode_time,
    integrity_errors=(sqlite3.IntegrityError,),
)


@functools.cache
def own_tables() -> frozenset[str]:
    """The tables fencekeeper's migrations make (lower case): an atomic action may read them, never write them."""
    newest = max(number for number, _, _ in MIGRATIONS)
    made = {name.lower() for kind, name, _ in _expected_fingerprint(newest) if kind == "table"}
    return frozenset({"schema_migrations", *made})


_REFUSED_ACTIONS = {
    sqlite3.SQLITE_TRANSACTION: "a transaction statement (BEGIN, COMMIT, ROLLBACK, END)",
    sqlite3.SQLITE_SAVEPOINT: "a savepoint (SAVEPOINT, RELEASE, ROLLBACK TO)",
    sqlite3.SQLITE_ATTACH: "ATTACH",
    sqlite3.SQLITE_DETACH: "DETACH",
    sqlite3.SQLITE_PRAGMA: "a PRAGMA",
}
# Actions whose first argument is the table written (INSERT, UPDATE, DELETE, DROP TABLE) or a new
# table or view (CREATE: one named like a store table would shadow it, a temporary one for the rest
# of the connection's life).
_ON_FIRST = frozenset(
    {
        sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_DROP_TEMP_TABLE, sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_TEMP_TABLE,
        sqlite3.SQLITE_CREATE_VIEW, sqlite3.SQLITE_CREATE_TEMP_VIEW,
    }
)  # fmt: skip
# Actions whose second argument is the table: indexes, triggers, ALTER TABLE.
_ON_SECOND = frozenset(
    {
        sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_TEMP_INDEX, sqlite3.SQLITE_DROP_INDEX,
        sqlite3.SQLITE_DROP_TEMP_INDEX, sqlite3.SQLITE_CREATE_TRIGGER, sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
        sqlite3.SQLITE_DROP_TRIGGER, sqlite3.SQLITE_DROP_TEMP_TRIGGER, sqlite3.SQLITE_ALTER_TABLE,
    }
)  # fmt: skip


class _Authorizer:
    """Judges each step of an atomic action's statement as SQLite compiles it; remembers what it denied.

    Installed for the connection's life; it judges only while ``judging``
    (an application statement is being compiled and run).
    """

    def __init__(self) -> None:
        self.tables = own_tables()
        self.judging = False
        self.denied: str | None = None

    def __call__(self, action: int, first: str | None, second: str | None, _db: str | None, _via: str | None) -> int:
        if not self.judging:
            return sqlite3.SQLITE_OK
        what = _REFUSED_ACTIONS.get(action)
        if what is None:
            table = first if action in _ON_FIRST else second if action in _ON_SECOND else None
            if table is not None and table.lower() in self.tables:
                what = f"a change to {table}, one of the store's own tables"
        if what is None:
            return sqlite3.SQLITE_OK
        self.denied = self.denied or what
        return sqlite3.SQLITE_DENY


APPLICATION_MARK = "\n/* fencekeeper: an atomic action's statement */"
"""Appended to every application statement: no store statement has this text, so none is reused for it."""


class _SQLiteOpsTx(SqlTx):
    def __init__(self, conn: sqlite3.Connection, clock: Clock, judge: _Authorizer) -> None:
        super().__init__(lambda sql, params: conn.execute(sql, tuple(params)), SQLITE_OPS, self._application)
        self.conn = conn
        self.clock = clock
        self.judge = judge

    def _application(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        conn, judge = self.conn, self.judge
        judge.judging, judge.denied = True, None
        try:
            # Every row is read while judging too: a statement may be compiled again as it runs.
            rows = [tuple(row) for row in conn.execute(sql + APPLICATION_MARK, tuple(params)).fetchall()]
        except sqlite3.ProgrammingError as exc:
            if "one statement at a time" in str(exc):
                raise refusal("more than one statement in one string", sql) from None
            raise
        except sqlite3.DatabaseError:
            if judge.denied is not None:
                raise refusal(judge.denied, sql) from None
            raise
        finally:
            judge.judging = False
        if not conn.in_transaction:
            raise TransactionEscaped(f"the operation's transaction ended during an atomic action's statement ({sql!r})")
        return rows

    def now(self) -> datetime:
        return self.clock.now()


class SQLiteOperationStore(TransactionalOperationStore):
    """Durable operations in one SQLite file.  One connection per store object; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str], clock: Clock | None = None, *, read_only: bool = False) -> None:
        """Open (creating and migrating as needed) the store at ``path``.

        With ``read_only``, as for the executions' ``SQLiteStore``, the file must
        exist at this code's schema version and is opened only to read: nothing
        is migrated or created beside it, and every write is refused.
        """
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._conn = _open_read_only(self.path) if read_only else _open(self.path)
        self._closed = False
        self._judge = _Authorizer()
        self._conn.set_authorizer(self._judge)

    def _connection(self) -> sqlite3.Connection:
        # After close, sqlite3's own ProgrammingError named nothing; PostgreSQL's closed pool is store_unavailable.
        if self._closed:
            raise StoreError("store_unavailable", f"{self.path}: the store is closed")
        return self._conn

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                # Another writer held the file past the busy timeout: the executions' store's store_locked, which names
                # the holders; the store is there, and the request is refused for now (exit 1), not a bad --db.
                raise begin_error(exc, self.path, BUSY_TIMEOUT_MS / 1000) from None
            try:
                yield _SQLiteOpsTx(conn, self.clock, self._judge)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_SQLiteOpsTx]:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield _SQLiteOpsTx(conn, self.clock, self._judge)
            finally:
                conn.execute("COMMIT")

    def now(self) -> datetime:
        return self.clock.now()

    def view(self, operation_id: str) -> OperationView | None:
        with self._reading() as tx:
            return tx.read_view(operation_id)

    def _read_input(self, operation_id: str) -> str | None:
        with self._lock:
            row = self._connection().execute("SELECT input FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
        return None if row is None else str(row[0])

    def outbox(self, after: str | None = None, limit: int = 100) -> list[Any]:
        with self._reading() as tx:
            return tx.read_outbox(after, limit)

    def active_references(self) -> list[tuple[str, int, str]]:
        rows = self.application_execute(
            "SELECT DISTINCT action_name, action_version, principal FROM operations WHERE outcome IS NULL "
            "ORDER BY action_name, action_version, principal"
        )
        return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]

    def application_execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement of the application's own, committed on its own (setup, reports, tests)."""
        with self._transaction() as tx:
            assert isinstance(tx, SqlTx)
            return [tuple(r) for r in tx.run(sql, params).fetchall()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()
