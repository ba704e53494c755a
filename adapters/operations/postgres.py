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
  advisory lock of the identity's key, taken by the statement that reads
  the identity.  That statement's snapshot may predate a concurrent
  identical submission's commit; the identity's primary key then refuses
  the second insert, the guard fails, and the submission is decided again
  in a new transaction, which reads the first's committed Operation.  The
  Operation an identity names is read, not locked: an identical
  resubmission never waits for a worker holding its row.
- The store's own statements are prepared once per connection and run by
  name without a cursor (``postgres_store._run``); an atomic action's
  statements, arbitrary SQL, go through psycopg's cursor.  A write
  transaction is opened by its first statement, ``BEGIN`` travelling ahead
  of it in one exchange, and ended by the decision's write, ``COMMIT``
  travelling behind it in one exchange: a guard that did not hold fails
  the write on the server (migration 11's ``fencekeeper_guard_held``), so
  that COMMIT rolls back the whole transaction, an atomic action's writes
  included, and the store reports the guard failing as before.  A
  transaction that writes nothing (a refusal) is ended by
  :meth:`PostgresOperationStore._transaction`.  Still one transaction per
  decision, all of it or nothing; the write is its last statement.
- Authoritative time is the database's ``clock_timestamp()``, read after the
  row lock is held (``now()`` is the transaction's start and would judge a
  lease by a moment before the lock was granted).  Tests may inject a clock.
- An atomic action's statements run on the same connection inside the same
  transaction, so its writes commit with the Operation's success or roll
  back with a refusal.  None of them may end, split or leave it: a
  transaction or session statement (``sql.transaction_control``) is refused
  before it is sent, and every statement goes by the extended protocol
  (even without parameters, where psycopg would use the simple one), which
  takes one statement per string, so ``UPDATE ...; COMMIT`` is refused by
  the server with nothing run.  After each one the connection must still be
  inside the transaction, or the attempt ends ``transaction_escaped``.  The
  store's own tables are not shielded from an action's statements here
  (the same role writes both); docs/operations.md says so.
- Every session carries ``lock_timeout`` and
  ``idle_in_transaction_session_timeout`` in its connection request (no
  round trip), as the executions' store does: a request waits for a row
  lock at most ``lock_timeout`` (then ``row_locked``, nothing written), and
  a session stopped or hung inside a transaction (an atomic action's
  included) is ended by the server after ``idle_in_transaction_timeout``,
  its locks released and nothing of it committed, so that an expired lease
  is replaced.  That timeout should not exceed the shortest lease of the
  workers on the store (docs/operations.md, "Timeouts").
- A decision that leaves an Operation due at once (a submission, an
  approval granted) sends
  ``NOTIFY "fencekeeper_operations:<schema>"`` behind its write, in the
  same exchange, committed with it or not at all: an idle worker
  (:meth:`PostgresOperationStore.wait_for_work`) claims it when it
  commits, not on its next poll.  Work that becomes due later (a backoff, a
  lease running out, a deadline) is found by the poll.  The channel is the
  executions' one's neighbour, not the same: a submission wakes no
  execution worker.
- Opening the store checks the schema version (``postgres_store``'s
  deployment check): a schema without the operation tables is refused.
- The tenant boundary (migration 9, forced row-level security): a store
  opened with ``tenant=`` sets ``fencekeeper.tenant`` for its whole session
  (in the connection request: no round trip), as a tenant-scoped worker
  needs; :meth:`tenant_scope` sets it for each transaction opened inside
  (``set_config(..., true)``: it ends with the transaction, so a pooled
  connection never carries one request's tenant into the next), as the HTTP
  boundary does per request.  A store opened without either reads every
  tenant only as a role that bypasses row-level security (a superuser or
  BYPASSRLS: the operator's role); as the restricted application role it
  sees nothing, which is the boundary failing closed.  PostgreSQL refuses a
  row outside the policies and a missing grant with one SQLSTATE (42501):
  the first is ``tenant_denied``, the second ``permission_denied``, naming
  the role, the object and the privileges the role lacks on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import pq
from psycopg._queries import PostgresQuery
from psycopg_pool import ConnectionPool

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.common import identifier_problem

from ..codec import OPERATION_TEXT
from ..outbox_rows import operation_row
from ..postgres_store import (
    GUARD_FAILED,
    IDLE_IN_TRANSACTION_TIMEOUT,
    LOCK_TIMEOUT,
    Listener,
    _check_schema_name,
    _milliseconds,
    _one_line,
    _run,
    _safe,
    check_schema,
    permission_denied,
    row_security_refusal,
)
from ..store import Clock, StoreError, checked_again_if_lost
from .base import TransactionalOperationStore, Tx, due_at
from .ports import OperationView
from .sql import (
    COLUMNS,
    MUTABLE,
    OpsDialect,
    SqlTx,
    TransactionEscaped,
    refusal,
    to_row,
    transaction_control,
)


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
    **dict.fromkeys(("action_version", "revision", "fence", "attempt_count", "effect_unsettled_since"), "integer"),
    **dict.fromkeys(("admitted_at", "deadline", "retain_until", "next_eligible_at", "lease_expires_at", "attempt_started_at", "due_at", "ended_at"), _TIME),
    "requires_approval": "boolean",
}


def _slots(types: Sequence[str]) -> str:
    """Placeholders with their explicit types (INSERT ... SELECT cannot infer them)."""
    return ", ".join(f"?::{t}" for t in types)


_NEW_COLUMNS = (*COLUMNS, "input", "ended_at")
_ATTEMPT_TYPES = ("text", "integer", "text", "text", _TIME, _TIME, "text", "text")
_TRANSITION_TYPES = ("text", "integer", "text", "text", "text", _TIME, "text", "integer", "text")
_OUTBOX_TYPES = ("text", "text", "text", "text", "text", _TIME, "text")


@functools.lru_cache(maxsize=256)
def _write_sql(new: bool, live: bool, identity: str | None, attempts: int, outbox: int) -> str:
    """The statement writing one decision of this shape; :func:`_write_values` gives its parameters, in order.

    Decisions of one shape (a new Operation with its identity, a claim, a
    completion with its outbox message) repeat, so the text is made once per
    shape, and the store's prepared statement is found by it.
    """
    parts: list[str] = []
    if new:
        values = _slots([_COLUMN_TYPES[c] for c in _NEW_COLUMNS])
        parts.append(f"u AS (INSERT INTO operations ({', '.join(_NEW_COLUMNS)}) VALUES ({values}) RETURNING 1)")
    else:
        sets = ", ".join(f"{c} = ?::{_COLUMN_TYPES[c]}" for c in MUTABLE) + f", ended_at = ?::{_TIME}"
        where = "operation_id = ?::text AND revision = ?::integer AND fence = ?::integer"
        if live:
            where += f" AND clock_timestamp() < ?::{_TIME}"
        parts.append(f"u AS (UPDATE operations SET {sets} WHERE {where} RETURNING 1)")
    identity_written = "1"
    if identity == "new":
        parts.append(
            "i AS (INSERT INTO operation_identities (namespace, tenant, principal, client_key, operation_id, "
            f"retain_until) SELECT {_slots(('text',) * 5 + (_TIME,))} FROM u ON CONFLICT DO NOTHING RETURNING 1)"
        )
    elif identity == "moved":
        parts.append(
            f"i AS (UPDATE operation_identities SET operation_id = ?::text, retain_until = ?::{_TIME} "
            "WHERE namespace = ?::text AND tenant = ?::text AND principal = ?::text AND client_key = ?::text "
            "AND operation_id = ?::text AND EXISTS (SELECT 1 FROM u) RETURNING 1)"
        )
    if identity is not None:
        identity_written = "(SELECT count(*) FROM i)"
    for k in range(attempts):
        parts.append(
            f"a{k} AS (INSERT INTO operation_attempts (operation_id, number, worker_id, state, started_at, "
            f"ended_at, error_code, claim_token) SELECT {_slots(_ATTEMPT_TYPES)} FROM u ON CONFLICT (operation_id, number) "
            "DO UPDATE SET state = excluded.state, ended_at = excluded.ended_at, error_code = excluded.error_code)"
        )
    parts.append(
        "t AS (INSERT INTO operation_transitions (operation_id, revision, event, from_state, to_state, at, actor, "
        f"fence, reason) SELECT {_slots(_TRANSITION_TYPES)} FROM u)"
    )
    for k in range(outbox):
        parts.append(
            f"m{k} AS (INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload) "
            f"SELECT {_slots(_OUTBOX_TYPES)} FROM u)"
        )
    # The guard is judged on the server (migration 11): a guard that did not hold fails the
    # statement, so the COMMIT sent behind it rolls the transaction back.
    return f"WITH {', '.join(parts)} SELECT fencekeeper_guard_held((SELECT count(*) FROM u) = 1 AND {identity_written} = 1)"


def _write_values(
    decision: o.Decision,
    input_json: str | None,
    live: bool,
    row: tuple[Any, ...],
    key: tuple[str, ...] | None,
    *,
    token_of: Callable[[o.Decision, o.Attempt], str | None],
) -> list[Any]:
    """The parameters of :func:`_write_sql`'s statement for ``decision``, in the order of its placeholders.

    ``key`` is ``identity_columns`` of the guard's identity (the transaction's, made once), None without one.
    """
    guard = decision.guard
    op = decision.operation
    # When the Operation ended: what retention counts its windows from (migration outbox_and_pruning).
    ended = decision.transition.at if op.outcome is not None else None
    if guard.expected_revision == 0:
        values = [*row, input_json if input_json is not None else "null", ended]
    else:
        values = [*row[9:], ended, guard.operation_id, guard.expected_revision, guard.expected_fence]
        if live:
            values.append(guard.live_until)
    if guard.identity is not None:
        assert key is not None, "a write under an identity's guard without its key columns"
        if guard.expected_holder is None:
            values += (*key, op.operation_id, op.retain_until)
        else:
            values += (op.operation_id, op.retain_until, *key, guard.expected_holder)
    for attempt in decision.attempts:
        values += (attempt.operation_id, attempt.number, attempt.worker_id, attempt.state.value, attempt.started_at,
                   attempt.ended_at, attempt.error_code, token_of(decision, attempt))
    t = decision.transition
    values += (t.operation_id, t.revision, None if t.event is None else OPERATION_TEXT[t.event],
               None if t.from_state is None else OPERATION_TEXT[t.from_state], OPERATION_TEXT[t.to_state], t.at,
               t.actor, t.fence, t.reason)
    for message in decision.outbox:
        r = operation_row(op, t)
        values += (message.message_id, r.kind, r.subject_id, r.tenant, message.topic, message.at, r.payload)
    return values


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> int:
    """How many parameters one of :func:`_write_sql`'s statements takes (counted once per shape, as it is made)."""
    return sql.count("?")


@functools.lru_cache(maxsize=512)
def _store_sql(sql: str) -> str:
    """One of the store's own statements with ``%s`` placeholders (they hold no literal ``%`` or ``?``)."""
    return sql.replace("?", "%s")


@functools.cache
def _extended_cursor() -> type[psycopg.Cursor[Any]]:
    """A cursor class that always sends by the extended protocol: one statement per string, the server refusing more.

    psycopg 3 sends a statement without parameters by the simple protocol,
    which runs every statement of the string (``UPDATE ...; COMMIT`` would
    commit); forcing the extended protocol is what psycopg itself does in
    pipeline mode and for ``stream()``.  Made on first use, not at import:
    a module-level subclass of psycopg's cursor drags psycopg's private
    annotations into the API reference this module is part of.
    """

    class ExtendedCursor(psycopg.Cursor[Any]):
        def _execute_send(
            self, query: PostgresQuery, *, force_extended: bool = False, binary: bool | None = None
        ) -> None:
            super()._execute_send(query, force_extended=True, binary=binary)

    return ExtendedCursor


_MANY_STATEMENTS = "cannot insert multiple commands into a prepared statement"


def run_application(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """One statement of the application's, inside the transaction open on ``conn`` (or opened by it); its rows."""
    control = transaction_control(sql)
    if control is not None:
        raise refusal(control, sql)
    cursor = _extended_cursor()(conn)
    try:
        cursor.execute(to_pyformat(sql), tuple(params))
    except psycopg.errors.SyntaxError as exc:
        if _MANY_STATEMENTS in str(exc):
            raise refusal("more than one statement in one string", sql) from None
        raise
    if conn.pgconn.transaction_status != pq.TransactionStatus.INTRANS:
        raise TransactionEscaped(f"the operation's transaction ended during an atomic action's statement ({sql!r})")
    return [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []


class _PgOpsTx(SqlTx):
    def __init__(self, conn: psycopg.Connection[Any], clock: Clock | None, schema: str) -> None:
        # The store's statements go through the execution store's _run (prepared by name on
        # each connection, no cursor: a few microseconds each instead of tens); what an
        # atomic action sends is arbitrary SQL and goes through a psycopg cursor, guarded.
        super().__init__(
            self._store_statement,
            POSTGRES_OPS,
            application=functools.partial(run_application, conn),
        )
        self.conn = conn
        self.clock = clock
        self.schema = schema
        self.checks_live_lease = clock is None
        # The schema name is checked ([a-z_][a-z0-9_]*), so the quoted identifier needs no escaping.
        self._notify = f'NOTIFY "{channel(schema)}"'.encode()

    def _store_statement(
        self, sql: str, params: Sequence[Any], *, commit: bool = False, then: bytes | None = None
    ) -> Any:
        # A write transaction (PostgresOperationStore._transaction) is opened by its
        # first statement, in the same exchange; psycopg's cursor opens its own
        # when an atomic action's statement comes first.
        assert not self.ended, "a statement after the decision's write, which ended the transaction"
        opening = self.opens and self.conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        try:
            return _run(self.conn, _store_sql(sql), params, begin=opening, commit=commit, then=then)
        finally:
            # With its COMMIT, the statement ends the transaction whatever it did: committed, or rolled back.
            self.ended = self.ended or commit

    opens = False
    """Whether this transaction is opened by its first statement (a write transaction) or already open (a read)."""

    ended = False
    """Whether the decision's write ended this transaction (its COMMIT travels with it)."""

    def write(self, decision: o.Decision, input_json: str | None) -> bool:
        """The whole decision as one statement, and in a write transaction its COMMIT: one round trip.

        The guard is in the statement's WHERE clauses.  Every other part of it
        writes only if the Operation's own write (``u``) touched its row, and a
        guard that did not hold fails the statement (migration 11), so the
        COMMIT behind it is skipped and the transaction's context rolls
        everything back, an atomic action's writes too; the live-lease clause
        compares with the database's time at the write.  The write is
        therefore the transaction's last statement.
        """
        guard = decision.guard
        live = guard.live_until is not None and self.checks_live_lease
        identity = None if guard.identity is None else "new" if guard.expected_holder is None else "moved"
        sql = _write_sql(guard.expected_revision == 0, live, identity, len(decision.attempts), len(decision.outbox))
        key = None if guard.identity is None else self.key_columns(guard.identity)
        values = _write_values(decision, input_json, live, to_row(decision.operation, self.d), key, token_of=self.token_of)
        assert _placeholders(sql) == len(values), "the write's text and parameters disagree"
        # Runs only if the write succeeded, so a guard that failed wakes nobody.
        notify = self._notify if self.opens and _due_now(decision) else None
        try:
            result = self._store_statement(sql, values, commit=self.opens, then=notify).fetchone()
        except self.d.integrity_errors:
            return False
        except psycopg.DatabaseError as exc:
            if exc.sqlstate == GUARD_FAILED:
                return False
            raise
        return result is not None and result[0] is True

    _locked_at: datetime | None = None

    def now(self) -> datetime:
        if self.clock is not None:
            return self.clock.now()
        if self._locked_at is not None:
            # The time the locking read brought, after its lock was granted: one round trip fewer.
            moment, self._locked_at = self._locked_at, None
            return moment
        row = self.run("SELECT clock_timestamp()", ()).fetchone()
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
        return self._from_read(row[:-1])

    def serialize_identity(self, identity: Any) -> None:
        key = _identity_key(self.schema, self.key_columns(identity))
        self.run("SELECT 1 FROM pg_advisory_xact_lock(hashtextextended(?, 1))", (key,))

    def due_bound(self) -> tuple[str, list[Any]]:
        # The database's time as an uncorrelated sub-select: evaluated once, before
        # the scan, so the index can use it.  Compared with clock_timestamp()
        # itself (volatile, evaluated per row) the index could not be used and
        # every claim read every row.
        if self.clock is not None:
            return "?", [self.clock.now()]
        return "(SELECT clock_timestamp())", []

    def lock_identity(self, identity: o.Identity) -> o.Operation | None:
        # The identity's lock, the time after it, and the lookup: one round trip.  The
        # lookup reads the statement's snapshot, taken before a wait for the lock, so
        # a concurrent identical submission that committed during that wait is not
        # seen here.  Its identity row is: this submission's write inserts the identity
        # ON CONFLICT DO NOTHING and reports the guard failed, so the transaction rolls
        # back and decides again (base._run), and then finds the committed Operation.
        #
        # The Operation it names is read, not locked: a worker inside an atomic action holds
        # that row for as long as the action runs, and an identical resubmission (a client's
        # retry) must not wait for it, nor fail row_locked.  Nothing admission decides needs
        # the row held: it reads the immutable binding and whether the Operation has ended,
        # and it writes only a new Operation and the identity, under the identity's lock.
        columns = self.key_columns(identity)
        row = self.run(
            "SELECT clock_timestamp(), (SELECT operation_id FROM operation_identities WHERE namespace = ? "
            "AND tenant = ? AND principal = ? AND client_key = ?) FROM pg_advisory_xact_lock(hashtextextended(?, 1))",
            (*columns, _identity_key(self.schema, columns)),
        ).fetchone()
        assert row is not None
        if self.clock is None:
            self._locked_at = _aware(row[0])
        if row[1] is None:
            return None
        return self.read_operation(str(row[1]))

    def skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED"

    def refuse_partial_view(self, tool: str, table: str) -> None:
        # A role the tenant policies bind, with no tenant set, sees no Operation's row at all (the boundary
        # failing closed) but every execution's: the exporter would deliver the executions' messages and
        # report the Operations' as nothing to do, silently, for as long as it ran.  Scoped to a tenant
        # (fencekeeper.tenant set), it sees what it was scoped to, as the caller asked.
        row = self.run(
            "SELECT row_security_active(?), coalesce(current_setting('fencekeeper.tenant', true), ''), current_user",
            (table,),
        ).fetchone()
        if row is not None and row[0] and not row[1]:
            raise StoreError(
                "permission_denied",
                f"{tool} reads every tenant's rows, but role {row[2]} is bound by the tenant policies (row-level "
                f"security) with no tenant set, so it would see none of the Operations'; run it as the operator's "
                f"role (the schema's owner with BYPASSRLS, or a superuser: docs/operating-postgres.md); nothing was "
                f"written",
            )

    def enter_pruning(self) -> None:
        # Transaction-scoped: the mode ends with this transaction, and no other session sees it.
        self.run("SELECT set_config('fencekeeper.pruning', 'on', true)", ())

    def leave_pruning(self) -> None:
        self.run("SELECT set_config('fencekeeper.pruning', '', true)", ())


# The server ending a session (idle_in_transaction_session_timeout is FATAL 25P03, which psycopg
# does not count as an OperationalError) is a lost connection like any other.
_CONNECTION_LOST = (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)

CHANNEL = "fencekeeper_operations"
"""The ``NOTIFY`` channel's prefix; a store's channel is ``<CHANNEL>:<schema>`` (:func:`channel`)."""


def channel(schema: str) -> str:
    """The channel on which a schema's stores announce Operations that became due at once."""
    return f"{CHANNEL}:{schema}"


def _due_now(decision: o.Decision) -> bool:
    # As of the decision's own time: a submission's next_eligible_at is that time, a retry's is later.
    due = due_at(decision.operation)
    return due is not None and due <= decision.transition.at


def _identity_key(schema: str, columns: tuple[str, str, str, str]) -> str:
    # The advisory lock's key is the row's key (``identity_columns``): submissions under two versions of one
    # principal's resolver serialize on one lock, as they meet on one row.  Advisory locks are the whole
    # database's, so the schema is part of the key: stores in two schemas of one database never wait for
    # each other's identities, as they never meet on a row.
    return "\x1f".join((schema, *columns))


def _check_tenant(tenant: str) -> str:
    problem = identifier_problem(tenant)
    if problem is not None:
        raise StoreError("tenant_scope", f"tenant: {problem}")
    return tenant


class PostgresOperationStore(TransactionalOperationStore):
    """Durable operations in one PostgreSQL schema (the executions' schema, migrated to version 6 or later)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fencekeeper",
        clock: Clock | None = None,
        pool_size: int = 4,
        tenant: str | None = None,
        lock_timeout: float | None = None,
        idle_in_transaction_timeout: float | None = None,
    ) -> None:
        """``lock_timeout`` and ``idle_in_transaction_timeout`` are seconds (defaults: ``LOCK_TIMEOUT``, ``IDLE_IN_TRANSACTION_TIMEOUT``)."""
        lock_timeout = LOCK_TIMEOUT if lock_timeout is None else lock_timeout
        idle = IDLE_IN_TRANSACTION_TIMEOUT if idle_in_transaction_timeout is None else idle_in_transaction_timeout
        for name, seconds in (("lock_timeout", lock_timeout), ("idle_in_transaction_timeout", idle)):
            if not 0 < seconds <= 86_400:
                raise ValueError(f"{name}: must be positive seconds, at most a day, got {seconds!r}")
        self.dsn = dsn
        self.schema = _check_schema_name(schema)
        self.clock = clock
        self.lock_timeout = lock_timeout
        self.idle_in_transaction_timeout = idle
        self.tenant = _check_tenant(tenant) if tenant is not None else None
        self.channel = channel(self.schema)
        self._listener = Listener(dsn, self.channel, f"the PostgreSQL operation store of schema {self.schema}")
        self._scope: contextvars.ContextVar[str | None] = contextvars.ContextVar(f"fencekeeper_tenant_{id(self)}", default=None)
        self._closed = False
        # Both timeouts travel with the connection request: no round trip of their own.
        options = (
            f"-c search_path={self.schema} -c lock_timeout={_milliseconds(lock_timeout)} "
            f"-c idle_in_transaction_session_timeout={_milliseconds(idle)}"
        )
        if self.tenant is not None:
            # Identifiers hold no space or backslash: the value needs no escaping in options.
            options += f" -c fencekeeper.tenant={self.tenant}"
        try:
            self._pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=pool_size,
                # psycopg's own preparing is off: it deallocates every prepared
                # statement of a connection after a rollback, the store's too (_run).
                kwargs={"options": options, "prepare_threshold": None},
                open=True,
                timeout=10,
            )
            self._pool.wait(timeout=10)
        except Exception as exc:
            raise StoreError("store_unavailable", f"cannot connect to PostgreSQL ({_safe(dsn)}): {_one_line(exc)}") from None
        def check() -> None:
            with self._pool.connection() as conn:
                check_schema(conn, self.schema)

        try:
            checked_again_if_lost(check, psycopg.OperationalError)
        except psycopg.OperationalError as exc:
            # Lost between the pool's connection and the check: what every other call of the store says of it.
            self._pool.close()
            raise StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}") from None
        except psycopg.errors.InsufficientPrivilege as exc:
            # A role without its grant on schema_migrations; the pool still answers which privilege it lacks.
            refused = self._refused(exc)
            self._pool.close()
            raise refused from None
        except BaseException:
            self._pool.close()
            raise

    @contextlib.contextmanager
    def tenant_scope(self, tenant: str) -> Iterator[None]:
        _check_tenant(tenant)
        if self.tenant is not None and tenant != self.tenant:
            raise StoreError("tenant_scope", f"tenant: this store is opened for tenant {self.tenant!r}, not {tenant!r}")
        token = self._scope.set(tenant)
        try:
            yield
        finally:
            self._scope.reset(token)

    def _enter_scope(self, conn: psycopg.Connection[Any]) -> None:
        scoped = self._scope.get()
        if scoped is not None:
            # Local to the transaction, so it opens it (BEGIN in the same exchange) when none is open yet.
            opening = conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            _run(conn, "SELECT set_config('fencekeeper.tenant', %s, true)", (scoped,), begin=opening)

    BOUNDS_CONNECTION_WAIT = True
    """``_transaction(wait=...)`` waits at most that many seconds for a pooled connection (a stopping exporter)."""

    @contextlib.contextmanager
    def _transaction(self, *, wait: float | None = None) -> Iterator[Tx]:
        # Not psycopg's transaction block: its BEGIN would cost a round trip of its own.  The
        # first statement opens the transaction in its own exchange (_run's begin); it is
        # committed here on a normal exit and rolled back on any exception, as before.
        # The pool's getconn/putconn, not its connection() block: that block's own commit or
        # rollback on exit (and its timing) repeat what this one does, on every decision.
        try:
            conn = self._pool.getconn(timeout=wait)
            try:
                tx = _PgOpsTx(conn, self.clock, self.schema)
                tx.opens = True
                try:
                    self._enter_scope(conn)
                    yield tx
                except BaseException:
                    conn.rollback()  # nothing to send when the write's COMMIT already ended it
                    raise
                if not tx.ended:  # no decision written (a refusal): the reads end here
                    conn.commit()
                elif conn.pgconn.transaction_status == pq.TransactionStatus.INERROR:
                    # The write failed its guard (write() answered False): its COMMIT was skipped
                    # with it (_run), and the aborted transaction, an atomic action's writes in it,
                    # is rolled back here rather than by the pool.
                    conn.rollback()
            finally:
                # A connection left broken or inside a transaction is replaced or reset by the pool.
                self._pool.putconn(conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            # Rolled back above: nothing was written.
            raise self._refused(exc) from None
        except psycopg.errors.LockNotAvailable as exc:
            raise self._row_locked(exc) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: BaseException) -> StoreError:
        """``store_unavailable`` for a call whose connection failed, or that came after :meth:`close`.

        A closed pool refuses as a lost connection would (psycopg's PoolClosed
        is an OperationalError); the SQLite and in-memory stores say closed.
        """
        if self._closed:
            return StoreError("store_unavailable", f"the PostgreSQL operation store of schema {self.schema} is closed")
        # As the execution store does: the pool hands its idle connections out unchecked, and after a server
        # restart or pg_terminate_backend each of them failed a request of its own.  A worker waiting out its
        # failures came back, after each pause, to connections ended meanwhile, and never got through while
        # backends were ended every 0.4 s.  Checked now, on the failure's path only, the dead ones are replaced
        # and the next request gets a live connection.
        with contextlib.suppress(Exception):
            self._pool.check()
        return StoreError("store_unavailable", f"PostgreSQL connection failed: {_one_line(exc)}")

    def _refused(self, exc: psycopg.Error) -> StoreError:
        """``tenant_denied`` for the tenant policies' refusal, ``permission_denied`` for a grant the role lacks."""
        if row_security_refusal(exc):
            # The application's own tenant filter let through a row the database's boundary did not.
            return StoreError(
                "tenant_denied",
                f"PostgreSQL's row-level security refused the write: the row is not of the tenant this "
                f"session is scoped to (fencekeeper.tenant); nothing was written ({_one_line(exc)})",
            )
        return permission_denied(exc, self._privileges)

    def _privileges(self, statement: Any, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """A privilege lookup, on a connection of its own: the refused statement's transaction is aborted."""
        with self._pool.connection(timeout=5) as conn:
            return conn.execute(statement, params).fetchall()

    def _row_locked(self, exc: Exception) -> StoreError:
        return StoreError(
            "row_locked",
            f"a lock this request needs (the operation's row, or its identity's) has been held by another "
            f"transaction for over {self.lock_timeout:g} s (lock_timeout); nothing was written. A stalled session "
            f"holds it (a worker inside an atomic action, an open psql transaction): it is ended after "
            f"{self.idle_in_transaction_timeout:g} s idle (idle_in_transaction_session_timeout); retry then, or "
            f"find it in pg_stat_activity ({_one_line(exc)})",
        )

    @contextlib.contextmanager
    def _reading(self) -> Iterator[_PgOpsTx]:
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                self._enter_scope(conn)
                yield _PgOpsTx(conn, self.clock, self.schema)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise self._refused(exc) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None

    def now(self) -> datetime:
        with self._reading() as tx:
            return tx.now()

    def view(self, operation_id: str) -> OperationView | None:
        with self._reading() as tx:
            return tx.read_view(operation_id)

    def _read_input(self, operation_id: str) -> str | None:
        try:
            with self._pool.connection() as conn:
                self._enter_scope(conn)
                row = _run(conn, "SELECT input FROM operations WHERE operation_id = %s", (operation_id,)).fetchone()
                conn.rollback()
        except psycopg.errors.InsufficientPrivilege as exc:
            raise self._refused(exc) from None
        except _CONNECTION_LOST as exc:
            raise self._unavailable(exc) from None
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
            return tx.application(sql, params)

    def wait_for_work(self, timeout: float) -> bool:
        """Block until an Operation may have become due, or ``timeout`` seconds pass.

        True when a notification arrived: a decision of this schema committed
        an Operation due at once, for any tenant.  Workers still poll after a
        timeout: a notification is a hint, never the only way to find work.
        """
        return self._listener.wait(timeout)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self._pool.close()
