"""Broken variants of the SQLite store: each differs from SQLiteStore by one realistic bug.

The transaction here is SQLiteStore's own ``_Write``, written out once more
so that a variant can change what it begins with or which backend (SQL
dialect) it hands the shared loop; reads use the same backend.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import ClassVar

import attrs

from fencekeeper.adapters.sqlite_store import _BUSY, SQLITE, SQLiteStore, _SQLiteBackend, locked_error
from fencekeeper.adapters.store import Backend, ExecutionView, StoreError
from fencekeeper.kernel.machines import ExecutionState


class _Store(SQLiteStore):
    begin: ClassVar[str] = "BEGIN IMMEDIATE"
    backend: ClassVar[type[_SQLiteBackend]] = _SQLiteBackend

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with self._lock:
            try:
                self._conn.execute(self.begin)
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode in _BUSY:
                    raise locked_error(self.path, self.busy_timeout) from None
                raise StoreError("store_unavailable", f"{self.path}: cannot begin a write: {exc}") from None
            try:
                yield self.backend(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def expired(self) -> list[str]:
        now = self.clock.now()
        with self._read() as conn:
            return self.backend(conn).expired(now)

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        with self._read() as conn:
            return self.backend(conn).execution_ids(state)

    def read(self, execution_id: str) -> ExecutionView | None:
        with self._read() as conn:
            return self.backend(conn).read_view(execution_id)


class DeferredBegin(_Store):
    """Transactions begin DEFERRED: the write lock is taken at the first write, after the rows were read."""

    begin = "BEGIN"


def _in_seconds(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")


def _in_milliseconds(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds")


class _SecondsBackend(_SQLiteBackend):
    dialect = attrs.evolve(SQLITE, encode_time=_in_seconds)


class _MillisecondsBackend(_SQLiteBackend):
    dialect = attrs.evolve(SQLITE, encode_time=_in_milliseconds)


class TimesInWholeSeconds(_Store):
    """Every time column is written in whole seconds (isoformat timespec='seconds')."""

    backend = _SecondsBackend


class TimesInMilliseconds(_Store):
    """Every time column is written in milliseconds, as a JavaScript Date would keep it."""

    backend = _MillisecondsBackend
