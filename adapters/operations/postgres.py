"""The PostgreSQL operation store: durable operations for many workers on many machines.

Rules of this module:

- Same decisions, same guarded SQL as the SQLite store (``sql.py``); what
  differs is how rows are locked and where time comes from.
- Isolation is READ COMMITTED with explicit row locks: every decision on an
  Operation first locks its row ``FOR UPDATE``, then reads the time, then
  decides.  Cancellation and the guarded effect therefore meet on that lock
  and exactly one of them commits first (seed 001: "deterministically
  competes with a guarded effect through Operation-row locking").  A claim
  takes the row due longest with ``FOR UPDATE SKIP LOCKED`` through the
  partial index ``operations_due``, so workers never wait on each other.
- Submissions of one idempotency identity serialize on a transaction-scoped
  advisory lock of the identity's key, taken before the identity is read:
  the second of two concurrent identical submissions reads the first's
  committed Operation (READ COMMITTED sees it once the lock is granted).
- Authoritative time is the database's ``clock_timestamp()``, read after the
  row lock is held (``now()`` is the transaction's start and would judge a
  lease by a moment before the lock was granted).  Tests may inject a clock.
- An atomic action's statements run on the same connection inside the same
  transaction, so its writes commit with the Operation's success or roll
  back with a refusal.
- Opening the store checks the schema version (``postgres_store``'s
  deployment check): a schema without the operation tables is refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from fencekeeper.kernel import operations as o

from ..outbox_rows import operation_row
from ..postgres_store import _check_schema_name, _one_line, _safe, check_schema
from ..store import Clock, StoreError
from .base import TransactionalOperationStore, Tx
from .ports import OperationView
from .sql import COLUMNS, MUTABLE, OpsDialect, SqlTx, from_row, to_row


def _aware(value: Any) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise StoreError("schema_altered", f"a timestamp column returned {value!r}, not an aware datetime")
    return value.astimezone(UTC)


def _utc(moment: datetime) -> datetime:
    return moment


POSTGRES_OPS = OpsDialect(
    name="postgresql",
    encode_time=_utc,
    decode_time=_aware,
    integrity_errors=(psycopg.errors.UniqueViolation,),
    lock_suffix=" FOR UPDATE",
)


def to_pyformat(sql: str) -> str:
    """The store's and the application's ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


_TIME = "timestamptz"
_COLUMN_TYPES: dict[str, str] = {
    **dict.fromkeys((*COLUMNS, "input"), "text"),
    **dict.fromkeys(("action_version", "revision", "fence", "attempt_count"), "integer"),
    **dict.fromkeys(("admitted_at", "deadline", "retain_until", "next_eligible_at", "lease_expires_at", "attempt_started_at", "due_at", "ended_at"), _TIME),
    "requires_approval": "boolean",
}


class _Params:
    """Parameters of one composed statement, each with its explicit type (INSERT ... SELECT cannot infer them)."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __call__(self, value: Any, sql_type: str) -> str:
        self.values.append(value)
        return f"?::{sql_type}"

    def row(self, values: Sequence[Any], types: Sequence[str]) -> str:
        return ", ".join(self(v, t) for v, t in zip(values, types, strict=True))


class _PgOpsTx(SqlTx):
    def __init__(self, conn: psycopg.Connection[Any], clock: Clock | None) -> None:
        super().__init__(lambda sql, params: conn.execute(to_pyformat(sql), tuple(params)), POSTGRES_OPS)
        self.conn = conn
        self.clock = clock
        self.checks_live_lease = clock is None

    def write(self, decision: o.Decision, input_json: str | None) -> bool:
        """The whole decision as one statement: one round trip, the guard in its WHERE clauses.

        Every other part of the statement writes only if the Operation's own
        write (``u``) touched its row, so a failed guard writes nothing; the
        live-lease clause compares with the database's time at the write.
        """
        guard = decision.guard
        op = decision.operation
        row = to_row(op, self.d)
        p = _Params()
        parts: list[str] = []
        ended = decision.transition.at if op.outcome is not None else None
        if guard.expected_revision == 0:
            columns = (*COLUMNS, "input", "ended_at")
            values = p.row(
                (*row, input_json if input_json is not None else "null", ended), [_COLUMN_TYPES[c] for c in columns]
            )
            parts.append(f"u AS (INSERT INTO operations ({', '.join(columns)}) VALUES ({values}) RETURNING 1)")
        else:
            # Parameters are numbered in the order they are made: build the text in that order too.
            sets = ", ".join(f"{c} = {p(v, _COLUMN_TYPES[c])}" for c, v in zip(MUTABLE, row[9:], strict=True))
            sets += f", ended_at = {p(ended, _TIME)}"
            where = f"operation_id = {p(guard.operation_id, 'text')}"
            where += f" AND revision = {p(guard.expected_revision, 'integer')}"
            where += f" AND fence = {p(guard.expected_fence, 'integer')}"
            if guard.live_until is not None and self.checks_live_lease:
                where += f" AND clock_timestamp() < {p(guard.live_until, _TIME)}"
            parts.append(f"u AS (UPDATE operations SET {sets} WHERE {where} RETURNING 1)")
        identity_written = "1"
        if guard.identity is not None:
            key = (guard.identity.namespace, guard.identity.tenant, guard.identity.principal, guard.identity.client_key)
            if guard.expected_holder is None:
                values = p.row((*key, op.operation_id, op.retain_until), ("text",) * 5 + (_TIME,))
                parts.append(
                    "i AS (INSERT INTO operation_identities (namespace, tenant, principal, client_key, operation_id, "
                    f"retain_until) SELECT {values} FROM u ON CONFLICT DO NOTHING RETURNING 1)"
                )
            else:
                parts.append(
                    f"i AS (UPDATE operation_identities SET operation_id = {p(op.operation_id, 'text')}, "
                    f"retain_until = {p(op.retain_until, _TIME)} WHERE namespace = {p(key[0], 'text')} "
                    f"AND tenant = {p(key[1], 'text')} AND principal = {p(key[2], 'text')} "
                    f"AND client_key = {p(key[3], 'text')} AND operation_id = {p(guard.expected_holder, 'text')} "
                    "AND EXISTS (SELECT 1 FROM u) RETURNING 1)"
                )
            identity_written = "(SELECT count(*) FROM i)"
        for k, attempt in enumerate(decision.attempts):
            values = p.row(
                (attempt.operation_id, attempt.number, attempt.worker_id, attempt.state.value, attempt.started_at,
                 attempt.ended_at, attempt.error_code),
                ("text", "integer", "text", "text", _TIME, _TIME, "text"),
            )
            parts.append(
                f"a{k} AS (INSERT INTO operation_attempts (operation_id, number, worker_id, state, started_at, "
                f"ended_at, error_code) SELECT {values} FROM u ON CONFLICT (operation_id, number) DO UPDATE SET "
                "state = excluded.state, ended_at = excluded.ended_at, error_code = excluded.error_code)"
            )
        t = decision.transition
        values = p.row(
            (t.operation_id, t.revision, None if t.event is None else t.event.value,
             None if t.from_state is None else t.from_state.value, t.to_state.value, t.at, t.actor, t.fence, t.reason),
            ("text", "integer", "text", "text", "text", _TIME, "text", "integer", "text"),
        )
        parts.append(
            "t AS (INSERT INTO operation_transitions (operation_id, revision, event, from_state, to_state, at, actor, "
            f"fence, reason) SELECT {values} FROM u)"
        )
        for k, message in enumerate(decision.outbox):
            r = operation_row(op, t)
            values = p.row(
                (message.message_id, r.kind, r.subject_id, r.tenant, message.topic, message.at, r.payload),
                ("text", "text", "text", "text", "text", _TIME, "text"),
            )
            parts.append(
                f"m{k} AS (INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload) "
                f"SELECT {values} FROM u)"
            )
        sql = f"WITH {', '.join(parts)} SELECT (SELECT count(*) FROM u), {identity_written}"
        try:
            result = self.run(sql, p.values).fetchone()
        except self.d.integrity_errors:
            return False
        return result is not None and int(result[0]) == 1 and int(result[1]) == 1

    _locked_at: datetime | None = None

    def now(self) -> datetime:
        if self.clock is not None:
            return self.clock.now()
        if self._locked_at is not None:
            # The time the locking read brought, after its lock was granted: one round trip fewer.
            moment, self._locked_at = self._locked_at, None
            return moment
        row = self.conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        return _aware(row[0])

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        if self.clock is not None or " FOR UPDATE" not in sql:
            return super()._one(sql, params)
        # The outer query reads the time after the row lock of the inner one is held.
        row = self.run(f"SELECT locked.*, clock_timestamp() FROM ({sql}) AS locked", params).fetchone()
        if row is None:
            return None
        self._locked_at = _aware(row[-1])
        return from_row(row[:-1], self.d)

    def serialize_identity(self, identity: Any) -> None:
        key = "\x1f".join((identity.namespace, identity.tenant, identity.principal, identity.client_key))
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (key,))

    def due_bound(self) -> tuple[str, list[Any]]:
        # The database's time as an uncorrelated sub-select: evaluated once, before
        # the scan, so the index can use it.  Compared with clock_timestamp()
        # itself (volatile, evaluated per row) the index could not be used and
        # every claim read every row.
        if self.clock is not None:
            return "?", [self.clock.now()]
        return "(SELECT clock_timestamp())", []

    def lock_identity(self, identity: o.Identity) -> o.Operation | None:
        self.serialize_identity(identity)
        # After the lock: this statement's snapshot sees a submission that committed while we waited.
        row = self.run(
            "SELECT clock_timestamp(), (SELECT operation_id FROM operation_identities WHERE namespace = ? "
            "AND tenant = ? AND principal = ? AND client_key = ?)",
            (identity.namespace, identity.tenant, identity.principal, identity.client_key),
        ).fetchone()
        assert row is not None
        if row[1] is None:
            if self.clock is None:
                self._locked_at = _aware(row[0])
            return None
        return self.lock_operation(str(row[1]))

    def skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED"

    def enter_pruning(self) -> None:
        # Transaction-scoped: the mode ends with this transaction, and no other session sees it.
        self.run("SELECT set_config('fencekeeper.pruning', 'on', true)", ())

    def leave_pruning(self) -> None:
        self.run("SELECT set_config('fencekeeper.pruning', '', true)", ())


class PostgresOperationStore(TransactionalOperationStore):
    """Durable operations in one PostgreSQL schema (the executions' schema, migrated to version 6 or later)."""

    def __init__(
        self, dsn: str, *, schema: str = "fencekeeper", clock: Clock | None = None, pool_size: int = 4
    ) -> None:
        self.dsn = dsn
        self.schema = _check_schema_name(schema)
        self.clock = clock
        try:
            self._pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=pool_size,
                kwargs={"options": f"-c search_path={self.schema}"},
                open=True,
                timeout=10,
            )
            self._pool.wait(timeout=10)
        except Exception as exc:
            raise StoreError("store_unavailable", f"cannot connect to PostgreSQL ({_safe(dsn)}): {_one_line(exc)}") from None
        try:
            with self._pool.connection() as conn:
                check_schema(conn, self.schema)
        except BaseException:
            self._pool.close()
            raise

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Tx]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield _PgOpsTx(conn, self.clock)
        except psycopg.OperationalError as exc:
            raise StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}") from None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_PgOpsTx]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield _PgOpsTx(conn, self.clock)
        except psycopg.OperationalError as exc:
            raise StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}") from None

    def now(self) -> datetime:
        with self._reading() as tx:
            return tx.now()

    def view(self, operation_id: str) -> OperationView | None:
        with self._reading() as tx:
            return tx.read_view(operation_id)

    def _read_input(self, operation_id: str) -> str | None:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT input FROM operations WHERE operation_id = %s", (operation_id,)).fetchone()
            conn.rollback()
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
            cursor = tx.run(sql, params)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description is not None else []

    def close(self) -> None:
        self._pool.close()
