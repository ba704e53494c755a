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
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import codec
from ..sqlite_store import _open
from ..store import Clock, StoreError, SystemClock
from .base import TransactionalOperationStore, Tx
from .ports import OperationView
from .sql import OpsDialect, SqlTx

SQLITE_OPS = OpsDialect(
    name="sqlite",
    encode_time=codec.encode_time,
    decode_time=codec.decode_time,
    integrity_errors=(sqlite3.IntegrityError,),
)


class _SQLiteOpsTx(SqlTx):
    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        super().__init__(lambda sql, params: conn.execute(sql, tuple(params)), SQLITE_OPS)
        self.clock = clock

    def now(self) -> datetime:
        return self.clock.now()


class SQLiteOperationStore(TransactionalOperationStore):
    """Durable operations in one SQLite file.  One connection per store object; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str], clock: Clock | None = None) -> None:
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._conn = _open(self.path)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError("store_unavailable", f"{self.path}: cannot begin a write: {exc}") from None
            try:
                yield _SQLiteOpsTx(conn, self.clock)
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
            self._conn.execute("BEGIN")
            try:
                yield _SQLiteOpsTx(self._conn, self.clock)
            finally:
                self._conn.execute("COMMIT")

    def now(self) -> datetime:
        return self.clock.now()

    def view(self, operation_id: str) -> OperationView | None:
        with self._reading() as tx:
            return tx.read_view(operation_id)

    def _read_input(self, operation_id: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT input FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
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
            self._conn.close()
