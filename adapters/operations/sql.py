"""The SQL both operation stores share: rows, the guarded write, the locking reads, the guarded context.

Rules of this module:

- An Operation is one row of ``operations`` with exactly the kernel's
  fields (the retry policy and the approval as JSON text), its normalised
  input and ``due_at`` (``base.due_at``: when a claim next has something to
  do with it), which the partial index of due work covers.  A field added
  by a later migration is a column after ``due_at``, so rows read by
  position keep their earlier positions.
- A decision is written under its guard in SQL too: the UPDATE's WHERE
  names the revision and the fence the decision was made on, a new
  Operation or a new identity is an INSERT the primary key refuses twice;
  a write that touches no row returns False and the transaction is rolled
  back (``base``).  Row locks (PostgreSQL) or the file's write lock
  (SQLite) make that rare; the guard is the second line of defence.
- Attempts are upserted by ``(operation_id, number)``; transitions and
  outbox messages are appended (one outbox row per transition,
  ``outbox_rows``) and never changed.  ``ended_at`` is the time of the
  transition that ended the Operation: the retention windows count from it.
- Deleting anything is pruning's alone (``retention``): a transaction that
  prunes enters the triggers' explicit mode first (``enter_pruning``).
- The guarded context runs the application's statements on the same
  connection, in the same transaction, and refuses once it is closed.
  Statements are written with ``?`` placeholders on every store.  Each
  store's application executor refuses a statement that would end, split
  or leave that transaction (``StatementRefused``); once one is refused the
  context refuses everything after it and its transaction cannot commit.
  A transaction found ended behind the store's back after an application
  statement is ``TransactionEscaped``: conclusive, never retried, never a
  success.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.common import shown
from fencekeeper.kernel.errors import InvalidOperation
from fencekeeper.kernel.machines import OperationEvent, OperationState

from ..codec import OPERATION_TEXT
from ..outbox_rows import OUTBOX_INSERT, operation_row
from .base import Tx, due_at
from .ports import GuardedContext, MalformedRow, OperationView, StaleContext, StatementRefused
from .service import ActionFailed

COLUMNS = (
    "operation_id",
    "namespace",
    "tenant",
    "principal",
    "client_key",
    "action_name",
    "action_version",
    "effect_class",
    "input_digest",
    "state",
    "revision",
    "fence",
    "attempt_count",
    "policy",
    "admitted_at",
    "deadline",
    "retain_until",
    "next_eligible_at",
    "requires_approval",
    "approval",
    "owner",
    "lease_expires_at",
    "attempt_started_at",
    "effect_id",
    "outcome",
    "error_code",
    "result",
    "cancel_requested_by",
    "due_at",
    "effect_unsettled_since",
)
MUTABLE = COLUMNS[9:]
"""Every column but the identity and the action: what a decision on an existing Operation may change."""
_SELECT = "SELECT " + ", ".join(COLUMNS) + " FROM operations"
_SELECT_WITH_INPUT = "SELECT " + ", ".join(COLUMNS) + ", input FROM operations"


@attrs.frozen
class OpsDialect:
    name: str
    encode_time: Callable[[datetime], Any]
    decode_time: Callable[[Any], datetime]
    integrity_errors: tuple[type[Exception], ...]
    lock_suffix: str = ""
    """Appended to a locking read: `` FOR UPDATE`` on PostgreSQL."""

    def time(self, moment: datetime | None) -> Any:
        return None if moment is None else self.encode_time(moment)

    def optional_time(self, value: Any) -> datetime | None:
        return None if value is None else self.decode_time(value)


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def encode_policy(policy: o.RetryPolicy) -> str:
    # Every write of an Operation stores its policy, and a deployment has a handful of them: each
    # one's text is made once.  Keyed by the coefficient's type too: 2 and 2.0 are equal policies
    # whose texts differ, and the text stored stays the one json.dumps gives for this value.
    key = (policy, type(policy.backoff_coefficient))
    text = _POLICY_TEXTS.get(key)
    if text is None:
        text = json.dumps(
            {
                "initial_interval": _seconds(policy.initial_interval),
                "backoff_coefficient": policy.backoff_coefficient,
                "maximum_interval": _seconds(policy.maximum_interval),
                "maximum_attempts": policy.maximum_attempts,
                "schedule_to_close": _seconds(policy.schedule_to_close),
            },
            sort_keys=True,
        )
        if len(_POLICY_TEXTS) >= _POLICIES_KEPT:
            _POLICY_TEXTS.clear()
        _POLICY_TEXTS[key] = text
    return text


_POLICIES_KEPT = 256
_POLICY_TEXTS: dict[tuple[o.RetryPolicy, type], str] = {}


@functools.lru_cache(maxsize=_POLICIES_KEPT)
def decode_policy(text: str) -> o.RetryPolicy:
    """The policy a stored text names; a RetryPolicy is an immutable value, so one is shared by every read of it."""
    data = json.loads(text)
    return o.RetryPolicy(
        initial_interval=timedelta(seconds=data["initial_interval"]),
        backoff_coefficient=data["backoff_coefficient"],
        maximum_interval=timedelta(seconds=data["maximum_interval"]),
        maximum_attempts=data["maximum_attempts"],
        schedule_to_close=timedelta(seconds=data["schedule_to_close"]),
    )


def encode_approval(approval: o.Approval | None) -> str | None:
    if approval is None:
        return None
    fields = attrs.asdict(approval)
    fields["expires_at"] = approval.expires_at.isoformat()
    fields["decided_at"] = approval.decided_at.isoformat()
    return json.dumps(fields, sort_keys=True)


def decode_approval(text: str | None) -> o.Approval | None:
    if text is None:
        return None
    data = json.loads(text)
    data["expires_at"] = datetime.fromisoformat(data["expires_at"])
    data["decided_at"] = datetime.fromisoformat(data["decided_at"])
    return o.Approval(**data)


def identity_columns(identity: o.Identity) -> tuple[str, str, str, str]:
    """The key columns of ``identity``'s row of ``operation_identities``: its ``identity_key``, never its full reference.

    ``principal`` there is the stable form (``users:v*:alice``), so a
    submission under another version of the principal's resolver finds the
    same row; ``operations.principal`` keeps the reference the Operation was
    admitted under.
    """
    key = o.identity_key(identity)
    return key.namespace, key.tenant, key.principal, key.client_key


def to_row(op: o.Operation, d: OpsDialect) -> tuple[Any, ...]:
    return (
        op.operation_id,
        op.identity.namespace,
        op.identity.tenant,
        op.identity.principal,
        op.identity.client_key,
        op.action_name,
        op.action_version,
        op.effect_class.value,
        op.input_digest,
        OPERATION_TEXT[op.state],
        op.revision,
        op.fence,
        op.attempt_count,
        encode_policy(op.policy),
        d.time(op.admitted_at),
        d.time(op.deadline),
        d.time(op.retain_until),
        d.time(op.next_eligible_at),
        op.requires_approval,
        encode_approval(op.approval),
        op.owner,
        d.time(op.lease_expires_at),
        d.time(op.attempt_started_at),
        op.effect_id,
        None if op.outcome is None else op.outcome.value,
        op.error_code,
        op.result,
        op.cancel_requested_by,
        d.time(due_at(op)),
        op.effect_unsettled_since,
    )


# Enum members by value: a dictionary lookup instead of the Enum call, which is slow on every row
# read; a value not among them is a malformed row, named by its column.
_EFFECT_CLASSES = {e.value: e for e in o.EffectClass}
_STATES = {s.value: s for s in OperationState}
_OUTCOMES = {t.value: t for t in o.TerminalOutcome}


def from_row(row: Sequence[Any], d: OpsDialect) -> o.Operation:
    """The Operation of a row of ``COLUMNS``, read by position (every claim and decision reads one)."""
    if len(row) != len(COLUMNS):
        raise ValueError(f"a row of operations has {len(row)} columns, not {len(COLUMNS)}")
    try:
        return _operation(row, d)
    except InvalidOperation as error:
        raise MalformedRow(error, str(row[1]), str(row[2])) from None
    except (ValueError, TypeError, KeyError) as exc:
        # Text no version of this store writes (JSON that is not a policy, a time without its offset): as for
        # an unknown state, the row is named by its column, and a claim passes over it instead of stopping.
        raise MalformedRow(_unreadable_column(row, d, exc), str(row[1]), str(row[2])) from None


def _operation(row: Sequence[Any], d: OpsDialect) -> o.Operation:
    decode, optional = d.decode_time, d.optional_time
    operation_id, outcome = row[0], row[24]
    return o.Operation(
        operation_id=row[0],
        identity=o.Identity(row[1], row[2], row[3], row[4]),
        action_name=row[5],
        action_version=int(row[6]),
        effect_class=_EFFECT_CLASSES.get(row[7]) or _unknown(operation_id, "effect_class", row[7]),
        input_digest=row[8],
        state=_STATES.get(row[9]) or _unknown(operation_id, "state", row[9]),
        revision=int(row[10]),
        fence=int(row[11]),
        attempt_count=int(row[12]),
        policy=decode_policy(row[13]),
        admitted_at=decode(row[14]),
        deadline=decode(row[15]),
        retain_until=decode(row[16]),
        next_eligible_at=decode(row[17]),
        requires_approval=bool(row[18]),
        approval=decode_approval(row[19]),
        owner=row[20],
        lease_expires_at=optional(row[21]),
        attempt_started_at=optional(row[22]),
        effect_id=row[23],
        outcome=None if outcome is None else _OUTCOMES.get(outcome) or _unknown(operation_id, "outcome", outcome),
        error_code=row[25],
        result=row[26],
        cancel_requested_by=row[27],
        effect_unsettled_since=None if row[29] is None else int(row[29]),
    )


def _unreadable_column(row: Sequence[Any], d: OpsDialect, error: Exception) -> InvalidOperation:
    """The first column of ``row`` that cannot be read, once reading the row failed (never on the way of a read)."""
    readers: dict[str, Callable[[Any], Any]] = {
        **dict.fromkeys(("action_version", "revision", "fence", "attempt_count"), int),
        "policy": decode_policy,
        **dict.fromkeys(("admitted_at", "deadline", "retain_until", "next_eligible_at"), d.decode_time),
        "approval": decode_approval,
        **dict.fromkeys(("lease_expires_at", "attempt_started_at"), d.optional_time),
        "effect_unsettled_since": lambda value: None if value is None else int(value),
    }
    found = _first_unreadable(row, COLUMNS, readers)
    if found is not None:
        return InvalidOperation(str(row[0]), *found)
    return InvalidOperation(str(row[0]), "row", f"cannot be read ({type(error).__name__}: {error})")


def _first_unreadable(
    row: Sequence[Any], columns: Sequence[str], readers: dict[str, Callable[[Any], Any]]
) -> tuple[str, str] | None:
    """The first of ``readers``' columns of ``row`` whose reader raises, and why; None when each reads."""
    for column, read in readers.items():
        value = row[columns.index(column)]
        try:
            read(value)
        except (ValueError, TypeError, KeyError) as exc:
            return column, f"{shown(value)} cannot be read ({type(exc).__name__}: {exc})"
    return None


def _unknown(operation_id: Any, column: str, value: Any) -> Any:
    """A column holding a value no version of this store writes (the tables' own checks were bypassed)."""
    raise InvalidOperation(str(operation_id), column, f"{value!r} is not a value this column may hold")


ATTEMPT_COLUMNS = ("operation_id", "number", "worker_id", "state", "started_at", "ended_at", "error_code")
TRANSITION_COLUMNS = ("operation_id", "revision", "event", "from_state", "to_state", "at", "actor", "fence", "reason")
_SELECT_ATTEMPTS = (
    f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM operation_attempts WHERE operation_id = ? ORDER BY number"
)
_SELECT_TRANSITIONS = (
    f"SELECT {', '.join(TRANSITION_COLUMNS)} FROM operation_transitions WHERE operation_id = ? ORDER BY revision"
)


def _attempt(r: Sequence[Any], d: OpsDialect) -> o.Attempt:
    return o.Attempt(
        str(r[0]), int(r[1]), str(r[2]), o.AttemptState(r[3]), d.decode_time(r[4]), d.optional_time(r[5]), r[6]
    )


def _transition(r: Sequence[Any], d: OpsDialect) -> o.Transition:
    return o.Transition(
        str(r[0]),
        int(r[1]),
        None if r[2] is None else OperationEvent(r[2]),
        None if r[3] is None else OperationState(r[3]),
        OperationState(r[4]),
        d.decode_time(r[5]),
        str(r[6]),
        int(r[7]),
        str(r[8]),
    )


def _unreadable_line(
    operation: o.Operation,
    attempts: Sequence[Sequence[Any]],
    transitions: Sequence[Sequence[Any]],
    d: OpsDialect,
    error: Exception,
) -> MalformedRow:
    """The first column of an Operation's attempts or history that cannot be read, once reading them failed.

    A state or event no version writes, a time that does not parse: named by its table and column, as a column of
    the Operation's own row is, so that status and history fail with one ``malformed_row`` instead of a traceback.
    """
    tables: tuple[tuple[str, str, tuple[str, ...], Sequence[Sequence[Any]], dict[str, Callable[[Any], Any]]], ...] = (
        (
            "operation_attempts",
            "attempt",
            ATTEMPT_COLUMNS,
            attempts,
            {"number": int, "state": o.AttemptState, "started_at": d.decode_time, "ended_at": d.optional_time},
        ),
        (
            "operation_transitions",
            "revision",
            TRANSITION_COLUMNS,
            transitions,
            {
                "revision": int,
                "event": _optional(OperationEvent),
                "from_state": _optional(OperationState),
                "to_state": OperationState,
                "at": d.decode_time,
                "fence": int,
            },
        ),
    )
    for table, key, columns, rows, readers in tables:
        for r in rows:
            found = _first_unreadable(r, columns, readers)
            if found is not None:
                column, why = found
                return _line_error(operation, f"{table}.{column}", f"{key} {r[1]!r}: {why}")
    return _line_error(operation, "history", f"cannot be read ({type(error).__name__}: {error})")


def _optional(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else read(value)


def _line_error(operation: o.Operation, field: str, problem: str) -> MalformedRow:
    return MalformedRow(
        InvalidOperation(operation.operation_id, field, problem), operation.identity.namespace, operation.identity.tenant
    )


Execute = Callable[[str, Sequence[Any]], Any]
"""Runs one statement with ``?`` placeholders; returns an object with ``fetchall()`` and ``rowcount``."""

ApplicationExecute = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]
"""Runs one statement an atomic action sends, guarded; returns its rows (none for a statement without rows)."""


class TransactionEscaped(ActionFailed):
    """After an application statement the store's transaction was no longer open: what it wrote may be committed.

    The store's refusals make this unreachable; if it is reached anyway the
    attempt ends conclusively (not retryable: a retry could apply the effect
    twice) and is never recorded as a success.
    """

    def __init__(self, message: str) -> None:
        super().__init__("transaction_escaped", message, retryable=False)


# What may open a statement: whitespace, comments (block comments nest in PostgreSQL) and empty
# statements, which PostgreSQL drops before it counts the statements of a string.
_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|;)+")
_WORD = re.compile(r"[A-Za-z_]+")
_ENDS_OR_SPLITS = frozenset({"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE"})


def _skip_noise(sql: str, at: int) -> int:
    while True:
        match = _NOISE.match(sql, at)
        if match is not None:
            at = match.end()
        if sql.startswith("/*", at):
            depth, at = 1, at + 2
            while depth and at < len(sql):
                if sql.startswith("/*", at):
                    depth, at = depth + 1, at + 2
                elif sql.startswith("*/", at):
                    depth, at = depth - 1, at + 2
                else:
                    at += 1
            continue
        if match is None:
            return at


def transaction_control(sql: str) -> str | None:
    """The words that make ``sql`` a statement controlling the transaction or the session; None if it is not one.

    Only a statement's opening words decide (after whitespace, comments and
    empty statements): ``BEGIN``, ``START``, ``COMMIT``, ``END``,
    ``ROLLBACK``, ``ABORT``, ``SAVEPOINT``, ``RELEASE``, ``PREPARE
    TRANSACTION`` (``COMMIT``/``ROLLBACK PREPARED`` are among the first),
    ``SET [LOCAL] TRANSACTION``, ``SET SESSION`` and every other session-level
    ``SET`` or ``RESET`` (it would outlive the transaction on a pooled
    connection: ``SET LOCAL`` and ``SET CONSTRAINTS`` end with it), and
    ``DISCARD``.  A second statement in the same string is the server's to
    refuse (PostgreSQL's extended protocol takes one).
    """
    words: list[str] = []
    at = 0
    while len(words) < 3:
        at = _skip_noise(sql, at)
        match = _WORD.match(sql, at)
        if match is None:
            break
        words.append(match.group().upper())
        at = match.end()
    if not words:
        return None
    first = words[0]
    second, third = (*words[1:], "", "")[:2]
    if first in _ENDS_OR_SPLITS or first == "DISCARD":
        return first
    if first == "PREPARE" and second == "TRANSACTION":
        return "PREPARE TRANSACTION"
    if first == "SET" and second == "LOCAL" and third in ("TRANSACTION", "SESSION"):
        return f"SET LOCAL {third}"
    if first in ("SET", "RESET") and second not in ("LOCAL", "CONSTRAINTS"):
        return f"{first} {second}".strip()
    return None


def refusal(what: str, sql: str) -> StatementRefused:
    shown = " ".join(sql.split())
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return StatementRefused(
        f"{what} is refused in an atomic action: its statements run inside the operation's own transaction "
        f"and may neither end, split or leave it nor write the store's own tables ({shown!r})"
    )


class SqlContext:
    """The guarded context of an atomic action: the Operation's own transaction, until it is closed."""

    def __init__(self, execute: ApplicationExecute, dialect: str, operation: o.Operation) -> None:
        self.operation_id = operation.operation_id
        self.fence = operation.fence
        self.dialect = dialect
        self._execute: ApplicationExecute | None = execute
        self.refused: Exception | None = None
        """The refusal (or escape) this context met: it fails every later statement and the commit."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self._execute is None:
            raise StaleContext("the operation's transaction has ended; nothing more may be written through it")
        if self.refused is not None:
            raise self.refused
        try:
            return self._execute(sql, params)
        except (StatementRefused, TransactionEscaped) as exc:
            self.refused = exc
            raise

    @property
    def tables(self) -> dict[str, dict[Any, Any]]:
        raise StaleContext("a SQL store's application tables are written with execute()")

    def close(self) -> None:
        self._execute = None


class SqlTx(Tx):
    """One transaction on a SQL connection.  Subclasses say how to read the time and lock.

    ``execute`` runs the store's own statements; ``application`` runs what
    an atomic action sends through the guarded context, on the same
    connection and in the same transaction, refusing what would end, split
    or leave it (each store says how).  A store may give its own statements
    a faster path than arbitrary SQL can take.
    """

    def __init__(self, execute: Execute, dialect: OpsDialect, application: ApplicationExecute) -> None:
        self.run = execute
        self.application = application
        self.d = dialect
        self._inputs: dict[str, str] = {}
        """Inputs the claim's locking read brought with its Operation, for input_of() in this transaction."""
        self._key: tuple[o.Identity, tuple[str, str, str, str]] | None = None
        """The identity this transaction locked and its key columns: a submission's lookup and write share them."""

    def key_columns(self, identity: o.Identity) -> tuple[str, str, str, str]:
        """``identity_columns(identity)``, made once per transaction: the lock, the lookup and the write all use it."""
        if self._key is not None and self._key[0] is identity:
            return self._key[1]
        columns = identity_columns(identity)
        self._key = (identity, columns)
        return columns

    # -- reads ------------------------------------------------------------------------------

    def _one(self, sql: str, params: Sequence[Any]) -> o.Operation | None:
        row = self.run(sql, params).fetchone()
        return None if row is None else self._from_read(row)

    def _from_read(self, row: Sequence[Any]) -> o.Operation:
        # A read that selected the input too (the claim's) has one column more than COLUMNS.
        if len(row) > len(COLUMNS):
            self._inputs[str(row[0])] = str(row[len(COLUMNS)])
        return from_row(row[: len(COLUMNS)], self.d)

    def lock_operation(self, operation_id: str) -> o.Operation | None:
        return self._one(f"{_SELECT} WHERE operation_id = ?{self.d.lock_suffix}", (operation_id,))

    def read_operation(self, operation_id: str) -> o.Operation | None:
        """The Operation as committed, without its row lock (admission's read: see ``Tx.lock_identity``)."""
        return self._one(f"{_SELECT} WHERE operation_id = ?", (operation_id,))

    def lock_identity(self, identity: o.Identity) -> o.Operation | None:
        self.serialize_identity(identity)
        row = self.run(
            "SELECT operation_id FROM operation_identities WHERE namespace = ? AND tenant = ? AND principal = ? "
            "AND client_key = ?",
            self.key_columns(identity),
        ).fetchone()
        return None if row is None else self.read_operation(str(row[0]))

    def serialize_identity(self, identity: o.Identity) -> None:
        """Make concurrent submissions of one identity's key wait for each other (PostgreSQL: an advisory lock)."""

    def lock_next_due(
        self, tenant: str, namespace: str | None, skip: frozenset[str] = frozenset()
    ) -> o.Operation | None:
        bound_sql, bound_params = self.due_bound()
        scope = " AND namespace = ?" if namespace is not None else ""
        passed_over = sorted(skip)
        if passed_over:
            scope += f" AND operation_id NOT IN ({', '.join('?' * len(passed_over))})"
        params: list[Any] = [tenant, *bound_params, *([namespace] if namespace is not None else []), *passed_over]
        # The input comes with the row: a worker that claims runs the action next.
        return self._one(
            f"{_SELECT_WITH_INPUT} WHERE tenant = ? AND due_at IS NOT NULL AND due_at <= {bound_sql}{scope} "
            f"ORDER BY due_at, operation_id LIMIT 1{self.skip_locked()}",
            params,
        )

    def running_under(
        self, tenant: str, namespace: str | None, worker_id: str, claim_token: str | None = None
    ) -> list[str]:
        scope = " AND namespace = ?" if namespace is not None else ""
        # The current Attempt's number is the Operation's fence: the one its last claim began.
        token = (
            " AND EXISTS (SELECT 1 FROM operation_attempts a WHERE a.operation_id = operations.operation_id "
            "AND a.number = operations.fence AND a.claim_token = ?)"
            if claim_token is not None
            else ""
        )
        rows = self.run(
            f"SELECT operation_id FROM operations WHERE tenant = ? AND state = ? AND owner = ?{scope}{token} "
            "ORDER BY operation_id",
            [tenant, OperationState.RUNNING.value, worker_id, *([namespace] if namespace is not None else []),
             *([claim_token] if claim_token is not None else [])],
        ).fetchall()
        return [str(row[0]) for row in rows]

    def due_bound(self) -> tuple[str, list[Any]]:
        """The SQL of "now" for finding due work, and its parameters (the store's time by default)."""
        return "?", [self.d.encode_time(self.now())]

    def skip_locked(self) -> str:
        return ""

    def refuse_partial_view(self, tool: str, table: str) -> None:
        """Refuse ``tool``, which reads every tenant's rows of ``table``, where the tenant policies hide some.

        A store without row-level security shows every row (SQLite): nothing
        to refuse.  PostgreSQL's override (migration 9's forced policies).
        """

    # -- the guarded write --------------------------------------------------------------------

    def write(self, decision: o.Decision, input_json: str | None) -> bool:
        guard = decision.guard
        op = decision.operation
        row = to_row(op, self.d)
        ended = self.d.time(decision.transition.at) if op.outcome is not None else None
        if guard.expected_revision == 0:
            placeholders = ", ".join("?" for _ in COLUMNS)
            try:
                self.run(
                    f"INSERT INTO operations ({', '.join(COLUMNS)}, input, ended_at) VALUES ({placeholders}, ?, ?)",
                    (*row, input_json if input_json is not None else "null", ended),
                )
            except self.d.integrity_errors:
                return False
        else:
            assignments = ", ".join(f"{c} = ?" for c in MUTABLE)
            changed = self.run(
                f"UPDATE operations SET {assignments}, ended_at = ? WHERE operation_id = ? AND revision = ? "
                "AND fence = ?",
                (*row[9:], ended, guard.operation_id, guard.expected_revision, guard.expected_fence),
            )
            if changed.rowcount != 1:
                return False
        if guard.identity is not None:
            key = self.key_columns(guard.identity)
            if guard.expected_holder is None:
                try:
                    self.run(
                        "INSERT INTO operation_identities (namespace, tenant, principal, client_key, operation_id, "
                        "retain_until) VALUES (?, ?, ?, ?, ?, ?)",
                        (*key, op.operation_id, self.d.time(op.retain_until)),
                    )
                except self.d.integrity_errors:
                    return False
            else:
                moved = self.run(
                    "UPDATE operation_identities SET operation_id = ?, retain_until = ? WHERE namespace = ? AND "
                    "tenant = ? AND principal = ? AND client_key = ? AND operation_id = ?",
                    (op.operation_id, self.d.time(op.retain_until), *key, guard.expected_holder),
                )
                if moved.rowcount != 1:
                    return False
        for attempt in decision.attempts:
            self.run(
                "INSERT INTO operation_attempts (operation_id, number, worker_id, state, started_at, ended_at, "
                "error_code, claim_token) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (operation_id, number) DO UPDATE "
                "SET state = excluded.state, ended_at = excluded.ended_at, error_code = excluded.error_code",
                (
                    attempt.operation_id,
                    attempt.number,
                    attempt.worker_id,
                    attempt.state.value,
                    self.d.time(attempt.started_at),
                    self.d.time(attempt.ended_at),
                    attempt.error_code,
                    self.token_of(decision, attempt),
                ),
            )
        t = decision.transition
        self.run(
            "INSERT INTO operation_transitions (operation_id, revision, event, from_state, to_state, at, actor, "
            "fence, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                t.operation_id,
                t.revision,
                None if t.event is None else t.event.value,
                None if t.from_state is None else t.from_state.value,
                t.to_state.value,
                self.d.time(t.at),
                t.actor,
                t.fence,
                t.reason,
            ),
        )
        for message in decision.outbox:
            r = operation_row(op, t)
            self.run(OUTBOX_INSERT, (message.message_id, r.kind, r.subject_id, r.tenant, message.topic,
                                     self.d.time(message.at), r.payload))
        return True

    def input_of(self, operation_id: str) -> str | None:
        if operation_id in self._inputs:
            return self._inputs[operation_id]
        row = self.run("SELECT input FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
        return None if row is None else str(row[0])

    def enter_pruning(self) -> None:
        """Let this transaction delete history rows of ended work (the triggers' explicit mode, SQLite)."""
        self.run("INSERT INTO pruning_mode (holder) VALUES ('prune')", ())

    def leave_pruning(self) -> None:
        self.run("DELETE FROM pruning_mode", ())

    def prune_identities(self, limit: int) -> int:
        self.enter_pruning()
        pruned = self.run(
            # With the Operation it names, as retention.py's: an identity moved meanwhile is not this one.
            "DELETE FROM operation_identities WHERE (namespace, tenant, principal, client_key, operation_id) IN ("
            "SELECT i.namespace, i.tenant, i.principal, i.client_key, i.operation_id FROM operation_identities i "
            "JOIN operations o ON o.operation_id = i.operation_id "
            "WHERE i.retain_until <= ? AND o.outcome IS NOT NULL LIMIT ?)",
            (self.d.encode_time(self.now()), limit),
        )
        self.leave_pruning()
        return int(pruned.rowcount)

    # -- the guarded context ---------------------------------------------------------------------

    def context(self, operation: o.Operation) -> GuardedContext:
        return SqlContext(self.application, self.d.name, operation)

    def close_context(self, context: GuardedContext) -> None:
        assert isinstance(context, SqlContext)
        context.close()
        if context.refused is not None:
            # An action that caught the refusal and returned still must not commit: what it
            # meant to run did not run, and its transaction is the one it tried to leave.
            raise context.refused

    # -- views ----------------------------------------------------------------------------------

    def read_view(self, operation_id: str) -> OperationView | None:
        row = self.run(f"{_SELECT_WITH_INPUT} WHERE operation_id = ?", (operation_id,)).fetchone()
        if row is None:
            return None
        operation = from_row(row[:-1], self.d)
        attempt_rows = self.run(_SELECT_ATTEMPTS, (operation_id,)).fetchall()
        transition_rows = self.run(_SELECT_TRANSITIONS, (operation_id,)).fetchall()
        try:
            attempts = tuple(_attempt(r, self.d) for r in attempt_rows)
            history = tuple(_transition(r, self.d) for r in transition_rows)
        except (ValueError, TypeError, KeyError) as exc:
            raise _unreadable_line(operation, attempt_rows, transition_rows, self.d, exc) from None
        return OperationView(operation, str(row[-1]), attempts, history)

    def read_outbox(self, after: str | None, limit: int) -> list[o.OutboxMessage]:
        if after is None:
            rows = self.run(
                "SELECT message_id, subject_id, topic, at FROM outbox WHERE kind = 'operation' ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
        else:
            rows = self.run(
                "SELECT message_id, subject_id, topic, at FROM outbox WHERE kind = 'operation' AND seq > "
                "(SELECT seq FROM outbox WHERE message_id = ?) ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        return [o.OutboxMessage(str(r[0]), str(r[1]), str(r[2]), self.d.decode_time(r[3])) for r in rows]
