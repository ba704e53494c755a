"""SQL shared by the database stores: guarded writes and history reads, written once.

Rules of this module:

- One transaction's reads and writes for a decision live here, in SQL that
  SQLite and PostgreSQL both speak; a store supplies its :class:`Dialect`
  (placeholder, null-safe equality, how times are stored, which exception a
  unique violation raises) and whatever it does differently (locking,
  claiming, the clock).
- Every UPDATE carries its part of the kernel's guard in its WHERE clause,
  and every INSERT of something that must be unique relies on the database's
  own constraint.  A write that touches no row, or hits a constraint, makes
  :meth:`SqlBackend.write` return False, and the caller rolls the whole
  transaction back: nothing partial is ever visible.
- Execution revisions, transition records, commands and evidence are only
  ever inserted.  Every transition record also appends its outbox row
  (``outbox_rows``) in the same transaction.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar

import attrs

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.events import MAX_PAYLOAD_DEPTH, WITHHELD_DEEP, Event, matches
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState

from . import codec
from .codec import TEXT
from .outbox_rows import execution_row
from .store import (
    Backend,
    Evidence,
    ExecutionView,
    StoreError,
    VisitView,
    evidence_revision_conflict,
    registration_conflict,
)

EXECUTION_TYPE = "WorkflowExecution"
DEFINITION_TYPE = "WorkflowDefinition"
RECOVERY_COMMAND_TYPE = "workflow_reconcile"

_DISPATCH_STATES = {state.value: state for state in DispatchState}
"""A dispatch row's state by its text: a lookup in C, where DispatchState(text) runs enum's lookup in Python."""
_DISPATCH_LISTED = {ExecutionState.ELIGIBLE: DispatchState.ELIGIBLE, ExecutionState.RUNNING: DispatchState.CLAIMED}
"""Execution states listed through workflow_dispatch's partial indexes, with the dispatch state each mirrors."""


@attrs.frozen
class Dialect:
    name: str
    placeholder: str
    same: str
    """Null-safe equality: ``IS`` in SQLite, ``IS NOT DISTINCT FROM`` in PostgreSQL."""
    seq: str
    """The column that orders rows by insertion."""
    encode_time: Callable[[datetime], object]
    decode_time: Callable[[Any], datetime]
    integrity_errors: tuple[type[Exception], ...]
    wait_item: str
    """SQL for item ``{index}`` of the ``wait`` key stored in an execution revision's JSON ``{body}``.

    NULL, never an error, where it can be: for a body that is not JSON (a
    hand edit, damage) the due-timer lookup must pass over that execution,
    not fail for every worker."""
    unreadable_json: tuple[type[Exception], ...] = ()
    """What the database raises where ``wait_item`` cannot be NULL for a body that is not JSON
    (PostgreSQL before 16 has no test for JSON text but the cast itself): the lookup is then made again
    with the bodies read here (:meth:`SqlBackend.due_registrations`)."""


def _spell(dialect: Dialect, sql: str) -> str:
    return sql.replace(" IS ?", f" {dialect.same} ?").replace("{seq}", dialect.seq).replace("?", dialect.placeholder)


_NEXT_ELIGIBLE = (
    "SELECT d.workflow_execution_id, (SELECT body FROM object_revisions r WHERE r.object_id = o.object_id "
    "AND r.revision = o.revision), d.dispatch_state, d.eligible_at, d.lease_token, d.leased_by, "
    "d.lease_expires_at, d.step_count, d.last_error_code "
    "FROM workflow_dispatch d JOIN objects o ON o.object_id = d.workflow_execution_id "
    f"WHERE d.dispatch_state = 'eligible' AND d.eligible_at <= ? AND o.object_type = '{EXECUTION_TYPE}' "
    "AND (CAST(? AS TEXT) IS NULL OR o.business_id = ?) "
)
_NEXT_ELIGIBLE_SQL = _NEXT_ELIGIBLE + "ORDER BY d.eligible_at, d.workflow_execution_id LIMIT 1"
_NEXT_ELIGIBLE_SKIPPING_SQL = (
    _NEXT_ELIGIBLE
    + "AND d.workflow_execution_id NOT IN (SELECT value FROM json_each(?)) "
    + "ORDER BY d.eligible_at, d.workflow_execution_id LIMIT 1"
)
"""The claim's read when a worker passes over executions (a JSON array of their ids): SQLite's only."""


def _waits_on(body: object, node_id: str, attempt_id: str) -> bool:
    """Whether an execution revision's stored ``body`` waits on ``node_id`` and ``attempt_id``: False for one that is no JSON."""
    try:
        wait = json.loads(body)["wait"]  # type: ignore[arg-type]
        return bool(wait[1] == node_id and wait[2] == attempt_id)
    except (ValueError, TypeError, KeyError, IndexError):
        return False


class SqlBackend(Backend):
    """The guarded reads and writes of one transaction, in SQL both SQLite and PostgreSQL speak.

    Statements are written once, with ``?`` placeholders and ``IS ?`` for
    null-safe equality; :meth:`_sql` turns them into the dialect's spelling.
    """

    dialect: ClassVar[Dialect]
    revisions_carry_transitions: ClassVar[bool] = False
    """Whether an execution revision row holds the transition that made it (SQLite, from migration 4)."""
    evidence_sql: ClassVar[str] = (
        "SELECT o.object_id, o.object_type, v.body, o.revision, o.state FROM objects o JOIN object_revisions v "
        "ON v.object_id = o.object_id AND v.revision = o.revision WHERE o.parent_id = ? ORDER BY o.{seq}"
    )
    """An execution's current evidence, oldest object first; a dialect whose planner needs it spelt otherwise sets its own."""
    writes_outbox: ClassVar[bool] = True
    """Whether every transition record appends its outbox row (from SQLite migration 8, PostgreSQL 9)."""
    _spellings: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Statements are few and fixed, so each is spelt once per dialect and
        # looked up by its text: cheaper on every call than hashing the dialect.
        cls._spellings = {}

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._picked: dict[str, tuple[p.Execution, p.Dispatch | None]] = {}
        """Rows next_eligible() read for the load() that follows it; each is used once."""

    def _sql(self, sql: str) -> str:
        spelled = self._spellings.get(sql)
        if spelled is None:
            spelled = _spell(self.dialect, sql)
            if len(self._spellings) < 4096:  # a bound, should a statement ever carry a value
                self._spellings[sql] = spelled
        return spelled

    def _execute(self, sql: str, params: Sequence[object] = ()) -> Any:
        return self.conn.execute(self._sql(sql), params)

    def _body_text(self, item: Evidence) -> str:
        """The text ``item``'s revision row stores: its body as canonical JSON."""
        return item.body_json()

    def _encode_optional_time(self, moment: datetime | None) -> object:
        return None if moment is None else self.dialect.encode_time(moment)

    def _decode_optional_time(self, value: Any) -> datetime | None:
        return None if value is None else self.dialect.decode_time(value)

    def expired(self, now: datetime) -> list[str]:
        rows = self._execute(
            "SELECT workflow_execution_id FROM workflow_dispatch WHERE dispatch_state = 'claimed' "
            "AND lease_expires_at <= ? ORDER BY workflow_execution_id",
            (self.dialect.encode_time(now),),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def leased_to(self, worker_id: str, lease_token: str) -> str | None:
        # Through the partial index of claimed rows: only the executions running now are read.
        row = self._execute(
            "SELECT workflow_execution_id FROM workflow_dispatch WHERE dispatch_state = 'claimed' "
            "AND leased_by = ? AND lease_token = ?",
            (worker_id, lease_token),
        ).fetchone()
        return None if row is None else str(row[0])

    def execution_ids(self, state: ExecutionState | None) -> list[str]:
        # The state is an enum member, so it is spelt into the SQL: a bound
        # value compared with a partial index's condition makes SQLite prepare
        # the statement again on every call.
        if state is None:
            sql = f"SELECT object_id FROM objects WHERE object_type = '{EXECUTION_TYPE}' ORDER BY object_id"
        elif state in _DISPATCH_LISTED:
            # Eligible and running executions are found through the dispatch
            # table's own partial indexes (the SQLite store does not index
            # them a second time); the execution's state is still checked, as
            # it is the authority.
            # CROSS JOIN: SQLite keeps the written order, dispatch rows first;
            # left to itself on a young file it walks every object instead.
            sql = (
                "SELECT o.object_id FROM workflow_dispatch d CROSS JOIN objects o "
                f"WHERE d.dispatch_state = '{_DISPATCH_LISTED[state].value}' "
                f"AND o.object_id = d.workflow_execution_id AND o.object_type = '{EXECUTION_TYPE}' "
                f"AND o.state = '{state.value}' ORDER BY o.object_id"
            )
        elif state == ExecutionState.SUCCEEDED:
            # Where nearly every execution ends: listing them reads about as
            # many rows as there are executions, with or without an index, so
            # the SQLite store keeps none (it would cost a page on every success).
            sql = (
                f"SELECT object_id FROM objects WHERE object_type = '{EXECUTION_TYPE}' "
                f"AND state = '{state.value}' ORDER BY object_id"
            )
        else:
            # The partial index's own condition, repeated so SQLite sees it holds.
            sql = (
                f"SELECT object_id FROM objects WHERE object_type = '{EXECUTION_TYPE}' "
                f"AND state NOT IN ('eligible', 'running', 'succeeded') AND state = '{state.value}' "
                "ORDER BY object_id"
            )
        return [str(r[0]) for r in self._execute(sql).fetchall()]

    business_id: str | None = None
    """When set, rows of any other business do not exist for this backend."""

    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        picked = self._picked.pop(execution_id, None)
        if picked is not None:
            return picked
        row = self._execute(
            # One round trip: the current revision's body by primary key (a
            # scalar subquery, so no plan, nor missing statistics after a bulk
            # load, can turn it into a scan) beside the dispatch row.  The type
            # is spelt, not bound: SQLite prepares a join again on every call
            # when a bound value meets a partial index's condition (here
            # objects_execution_state's), which cost more than the query.
            "SELECT (SELECT body FROM object_revisions r WHERE r.object_id = o.object_id "
            "AND r.revision = o.revision), d.dispatch_state, d.eligible_at, d.lease_token, d.leased_by, "
            "d.lease_expires_at, d.step_count, d.last_error_code "
            "FROM objects o LEFT JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id "
            f"WHERE o.object_id = ? AND o.object_type = '{EXECUTION_TYPE}' "
            "AND (CAST(? AS TEXT) IS NULL OR o.business_id = ?)",
            (execution_id, self.business_id, self.business_id),
        ).fetchone()
        if row is None:
            return None, None
        return codec.decode_execution(row[0], execution_id), self._dispatch_from(execution_id, row[1:])

    def admission_facts(
        self, execution_id: str, definition_object_id: str, business_id: str
    ) -> tuple[p.Execution | None, bool, int | None]:
        # One statement: what the identity names and the definition's latest revision.
        row = self._execute(
            "SELECT (SELECT object_type FROM objects WHERE object_id = ?), (SELECT revision FROM objects "
            f"WHERE object_id = ? AND object_type = '{DEFINITION_TYPE}' AND business_id = ?)",
            (execution_id, definition_object_id, business_id),
        ).fetchone()
        return self._admission_from(execution_id, row[0], row[1])

    def _admission_from(
        self, execution_id: str, kind: str | None, head: int | None
    ) -> tuple[p.Execution | None, bool, int | None]:
        """The facts from what the identity names (``kind``): the execution is read only when it names one."""
        latest = None if head is None else int(head)
        if kind is None:
            return None, False, latest
        if kind != EXECUTION_TYPE:
            return None, True, latest
        existing = self.load(execution_id)[0]
        return existing, existing is None, latest

    def view_so_far(self, execution_id: str) -> VisitView | None:
        # The same one statement, with the transaction going on after it.
        return self.visit_view(execution_id)

    def visit_view(self, execution_id: str) -> VisitView | None:
        """:meth:`TransactionalStore.read_for_visit` in one statement, so one snapshot without a transaction block.

        One row per evidence object (one row with NULLs when there is none),
        each beside the execution's current revision and dispatch row.
        """
        sql, params = self._visit_view_statement(execution_id)
        return self._visit_view_from(execution_id, self._execute(sql, params).fetchall())

    def _visit_view_statement(self, execution_id: str) -> tuple[str, tuple[object, ...]]:
        return (
            "SELECT x.body, d.dispatch_state, d.eligible_at, d.lease_token, d.leased_by, d.lease_expires_at, "
            "d.step_count, d.last_error_code, e.object_id, e.object_type, v.body, e.revision, e.state "
            "FROM objects o JOIN object_revisions x ON x.object_id = o.object_id AND x.revision = o.revision "
            "JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id "
            "LEFT JOIN objects e ON e.parent_id = o.object_id "
            "LEFT JOIN object_revisions v ON v.object_id = e.object_id AND v.revision = e.revision "
            f"WHERE o.object_id = ? AND o.object_type = '{EXECUTION_TYPE}' "
            "AND (CAST(? AS TEXT) IS NULL OR o.business_id = ?) ORDER BY e.{seq}",
            (execution_id, self.business_id, self.business_id),
        )

    def _visit_view_from(self, execution_id: str, rows: Sequence[Sequence[Any]]) -> VisitView | None:
        if not rows:
            return None
        first = rows[0]
        dispatch = self._dispatch_from(execution_id, first[1:8])
        assert dispatch is not None  # an inner join
        evidence = tuple(Evidence(r[8], r[9], json.loads(r[10]), r[11], r[12]) for r in rows if r[8] is not None)
        return VisitView(codec.decode_execution(first[0], execution_id), dispatch, evidence)

    def object_exists(self, object_id: str) -> bool:
        return self._execute("SELECT 1 FROM objects WHERE object_id = ?", (object_id,)).fetchone() is not None

    def load_registration(self, key: p.WaitKey) -> p.WaitRegistration | None:
        row = self._execute(
            "SELECT business_id, spec, woken_by, wake_reason, closed_by FROM wait_registrations "
            "WHERE execution_id = ? AND node_id = ? AND attempt_id = ?",
            (key.execution_id, key.node_id, key.attempt_id),
        ).fetchone()
        if row is None:
            return None
        return p.WaitRegistration(
            key=key,
            business_id=row[0],
            spec=codec.decode_wait_spec(row[1]),
            woken_by=row[2],
            wake_reason=None if row[3] is None else p.WakeReason(row[3]),
            closed_by=row[4],
        )

    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None:
        row = self._execute(
            "SELECT body FROM commands WHERE command_id = ? AND command_type = ?",
            (command_id, RECOVERY_COMMAND_TYPE),
        ).fetchone()
        return None if row is None else codec.decode_recovery(row[0])

    def next_eligible(self, now: datetime, business_id: str | None, skip: frozenset[str] = frozenset()) -> str | None:
        # No row locks: right where the whole database is write-locked for the
        # transaction (SQLite); PostgreSQL overrides this with SKIP LOCKED.
        # The rows load() reads come back with the id, so a claim reads once;
        # nothing can change them before load() while the write lock is held.
        scope = business_id if business_id is not None else self.business_id
        params: tuple[object, ...] = (self.dialect.encode_time(now), scope, scope)
        if skip:
            # Only a worker that met a malformed row passes any over: every other claim runs the
            # statement without this condition, as it always has.
            params = (*params, codec.dumps(sorted(skip)))
        row = self._execute(
            _NEXT_ELIGIBLE_SQL if not skip else _NEXT_ELIGIBLE_SKIPPING_SQL,
            params,
        ).fetchone()
        if row is None:
            return None
        execution_id = str(row[0])
        self._picked[execution_id] = (codec.decode_execution(row[1], execution_id), self._dispatch_from(execution_id, row[2:]))
        return execution_id

    def _batch(self) -> contextlib.AbstractContextManager[object]:
        """Where the writes of one decision are sent together; PostgreSQL makes them one statement."""
        return contextlib.nullcontext()

    def _conflict_table(self, exc: Exception) -> str | None:
        """The table whose unique constraint ``exc`` reports."""
        match = re.search(r"constraint failed: (\w+)\.", str(exc))
        return match.group(1) if match else None

    def _conflict_object(self, exc: Exception) -> str | None:
        """The object id in the key ``exc`` reports as duplicated, where the database says."""
        return None

    def _missing_object(self, exc: Exception) -> str | None:
        """The object id ``exc`` reports a revision of as having no object row, where the database says."""
        return None

    def _missing_revision(self, evidence: Sequence[Evidence], exc: Exception) -> Evidence | None:
        """The revision of ``evidence`` that ``exc`` refused for want of its object, if that is what it says.

        A revision past the first goes on top of an existing object of this
        execution (the compare-and-set in :meth:`_queue_evidence`); of an
        object nobody made, the revision row's foreign key fails first.  That
        is the same conflict as any revision not on top of its object's:
        the caller's evidence, not the execution, is what is wrong.
        """
        later = [item for item in evidence if item.revision > 1]
        named = self._missing_object(exc)
        if named is not None:
            return next((item for item in later if item.object_id == named), None)
        if "FOREIGN KEY constraint failed" in str(exc):
            # SQLite names no key, but checks it at once: the compare-and-set before it has touched no row.
            return next((item for item, cursor in self._revision_checks if cursor.rowcount == 0), None)
        return None

    def _guarded(self, sql: str, params: Sequence[object]) -> None:
        """A write that must touch exactly one row, or the decision does not hold."""
        self._checks.append(self._execute(sql, params))

    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        # Every statement is queued first and every guard checked once, at the
        # end: a store that batches them (PostgreSQL: one statement) pays one
        # round trip for all, and one that does not loses nothing, since a
        # failed guard rolls back all.
        if decision.guard.expected_revision == 0 and (decision.execution is None or decision.dispatch is None):
            return False
        self._checks: list[Any] = []
        self._revision_checks: list[tuple[Evidence, Any]] = []
        try:
            with self._batch():
                self._queue_writes(decision, evidence, now)
        except self.dialect.integrity_errors as exc:
            self._write_conflict(decision, evidence, exc)
            return False
        self._check_revisions()
        return all(cursor.rowcount == 1 for cursor in self._checks)

    def _write_conflict(self, decision: p.Decision, evidence: Sequence[Evidence], exc: Exception) -> None:
        """Raise what the unique-key conflict ``exc`` of ``decision``'s writes means, unless its guard failed.

        Returns when the conflict is the decision's guard failing (the
        execution moved on, or another admission of its id committed first):
        nothing is written and the caller decides again.
        """
        table = self._conflict_table(exc)
        if table == "wait_registrations" and decision.registration is not None:
            raise registration_conflict(decision.registration.key) from None
        missing = self._missing_revision(evidence, exc)
        if missing is not None:
            raise evidence_revision_conflict(missing) from None
        later = [item for item in evidence if item.revision > 1]
        # The duplicate revision is an evidence object's when the database
        # names it, or (where it does not) when every guard so far held;
        # otherwise the execution moved on: a guard failure.
        if table == "object_revisions" and later:
            named = self._conflict_object(exc)
            ours = {item.object_id: item for item in later}
            if named in ours:
                raise evidence_revision_conflict(ours[named]) from None
            if named is None and all(c.rowcount == 1 for c in self._checks):
                raise evidence_revision_conflict(later[0]) from None
        if table == "objects" and evidence and decision.guard.expected_revision != 0:
            raise StoreError(
                "evidence_conflict",
                f"evidence {', '.join(repr(e.object_id) for e in evidence)}: an id already exists; "
                "evidence is never overwritten",
            ) from None

    def _check_revisions(self) -> None:
        stale = [item for item, cursor in self._revision_checks if cursor.rowcount != 1]
        if stale:
            raise evidence_revision_conflict(stale[0])

    def _queue_writes(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> None:
        self._queue_rows(decision.guard, decision.execution, decision.dispatch, now)
        self._queue_records(decision, now)
        execution = decision.execution
        at = self.dialect.encode_time(now)
        self._queue_evidence(decision.guard.execution_id, evidence, at, None if execution is None else execution.business_id)

    def _queue_rows(
        self, guard: p.Guard, execution: p.Execution | None, dispatch: p.Dispatch | None, now: datetime
    ) -> None:
        """The execution's two rows as a decision leaves them (None: unchanged), under ``guard``; inserted at revision 0."""
        at = self.dialect.encode_time(now)
        eid = guard.execution_id
        if guard.expected_revision == 0:
            assert execution is not None and dispatch is not None
            self._execute(
                "INSERT INTO objects (object_id, object_type, business_id, revision, state, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (eid, EXECUTION_TYPE, execution.business_id, execution.revision, TEXT[execution.state], at, at),
            )
            self._execute(
                "INSERT INTO workflow_dispatch (workflow_execution_id, dispatch_state, eligible_at, lease_token, "
                "leased_by, lease_expires_at, step_count, last_error_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (eid, *self._dispatch_values(dispatch)),
            )
        else:
            expected_state = None if guard.expected_state is None else TEXT[guard.expected_state]
            if execution is not None:
                self._guarded(
                    "UPDATE objects SET revision = ?, state = ?, updated_at = ? "
                    "WHERE object_id = ? AND object_type = ? AND revision = ? AND state = ?",
                    (
                        execution.revision,
                        TEXT[execution.state],
                        at,
                        eid,
                        EXECUTION_TYPE,
                        guard.expected_revision,
                        expected_state,
                    ),
                )
            # The dispatch row is always written under its part of the guard;
            # when the execution object is not written, the guard's revision
            # is checked by the same statement, so a renewal cannot land on a
            # revision it did not see.
            values = self._dispatch_values(dispatch) if dispatch is not None else None
            sql = (
                "UPDATE workflow_dispatch SET dispatch_state = ?, eligible_at = ?, lease_token = ?, leased_by = ?, "
                "lease_expires_at = ?, step_count = ?, last_error_code = ? "
                if values is not None
                else "UPDATE workflow_dispatch SET dispatch_state = dispatch_state "
            )
            sql += (
                "WHERE workflow_execution_id = ? AND dispatch_state = ? AND lease_token IS ? "
                "AND lease_expires_at IS ?"
            )
            params: list[object] = list(values) if values is not None else []
            params += [
                eid,
                None if guard.expected_dispatch_state is None else TEXT[guard.expected_dispatch_state],
                guard.expected_lease_token,
                self._encode_optional_time(guard.expected_lease_expires_at),
            ]
            if guard.requires_live_lease:
                sql += " AND lease_expires_at > ?"
                params.append(at)
            if execution is None:
                sql += " AND EXISTS (SELECT 1 FROM objects WHERE object_id = ? AND revision = ? AND state = ?)"
                params += [eid, guard.expected_revision, expected_state]
            self._guarded(sql, params)

    def _queue_records(self, decision: p.Decision, now: datetime) -> None:
        """What ``decision`` appends: the execution's revision, its registration, closure, recovery, transitions, outbox."""
        at = self.dialect.encode_time(now)
        eid = decision.guard.execution_id
        execution = decision.execution
        records = decision.evidence
        if execution is not None:
            body = codec.encode_execution(execution)
            carried = self._carried(records, execution, now) if self.revisions_carry_transitions else None
            if carried is None:
                self._execute(
                    "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (eid, execution.revision, TEXT[execution.state], body, at),
                )
            else:
                self._execute(
                    "INSERT INTO object_revisions (object_id, revision, state, body, committed_at, event, "
                    "from_state, actor, lease_token, fence, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        eid,
                        execution.revision,
                        TEXT[execution.state],
                        body,
                        at,
                        None if carried.event is None else TEXT[carried.event],
                        None if carried.from_state is None else TEXT[carried.from_state],
                        carried.actor,
                        carried.lease_token,
                        carried.fence,
                        carried.reason,
                    ),
                )
                records = tuple(r for r in records if r is not carried)
        if decision.registration is not None:
            self._queue_registration(decision.registration)
        closure = decision.closes
        if closure is not None:
            # Not guarded: closing a registration that is already closed (or
            # woken) changes nothing, in every store.
            self._execute(
                "UPDATE wait_registrations SET closed_by = ? "
                "WHERE execution_id = ? AND node_id = ? AND attempt_id = ? AND woken_by IS NULL AND closed_by IS NULL",
                (closure.by.value, closure.key.execution_id, closure.key.node_id, closure.key.attempt_id),
            )
        if decision.recovery is not None:
            self._execute(
                "INSERT INTO commands (command_id, command_type, business_id, execution_id, body, recorded_at) "
                "VALUES (?, ?, (SELECT business_id FROM objects WHERE object_id = ?), ?, ?, ?)",
                (
                    decision.recovery.command_id,
                    RECOVERY_COMMAND_TYPE,
                    eid,
                    eid,
                    codec.encode_recovery(decision.recovery),
                    at,
                ),
            )
        for r in records:
            self._execute(
                "INSERT INTO transitions (execution_id, event, from_state, to_state, revision, at, actor, "
                "lease_token, fence, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r.execution_id,
                    None if r.event is None else TEXT[r.event],
                    None if r.from_state is None else TEXT[r.from_state],
                    TEXT[r.to_state],
                    r.revision,
                    at if r.at is now else self.dialect.encode_time(r.at),
                    r.actor,
                    r.lease_token,
                    r.fence,
                    r.reason,
                ),
            )
        business_id = None if execution is None else execution.business_id
        for r in decision.evidence if self.writes_outbox else ():
            # The transition's outbox row, in the same transaction (outbox_rows).
            row = execution_row(r, business_id)
            self._execute(
                "INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload) VALUES "
                "(?, ?, ?, COALESCE(?, (SELECT business_id FROM objects WHERE object_id = ?)), ?, ?, ?)",
                (
                    row.message_id,
                    row.kind,
                    row.subject_id,
                    business_id,
                    r.execution_id,
                    row.topic,
                    at if r.at is now else self.dialect.encode_time(r.at),
                    row.payload,
                ),
            )

    @staticmethod
    def _carried(
        records: Sequence[p.TransitionRecord], execution: p.Execution, now: datetime
    ) -> p.TransitionRecord | None:
        """The record the new revision row can carry: the one that made exactly this revision, now."""
        for r in records:
            if (
                r.execution_id == execution.execution_id
                and r.revision == execution.revision
                and r.to_state == execution.state
                and r.at == now
            ):
                return r
        return None

    def _queue_evidence(
        self, eid: str, evidence: Sequence[Evidence], at: object, business_id: str | None = None
    ) -> None:
        # The object row is written once per object, at the newest revision
        # the decision brings (an attempt may go pending -> running -> completed
        # in one commit); every revision gets its own append-only row.  Besides
        # saving statements, this lets a store send the whole decision as one
        # statement (PostgreSQL), where no part may depend on another's write.
        groups: dict[str, list[Evidence]] = {}
        for item in evidence:
            groups.setdefault(item.object_id, []).append(item)
        for items in groups.values():
            first, last = items[0], items[-1]
            # The revision named is the first one not on top of the one before it, as a
            # statement of its own would name it (a composed chain's are grouped here).
            for before, item in itertools.pairwise(items):
                if item.revision != before.revision + 1:
                    raise evidence_revision_conflict(item)
            if first.revision == 1 and business_id is not None:
                # The execution's Business is known: written directly, since a
                # statement cannot read back an execution row it inserts itself.
                self._execute(
                    "INSERT INTO objects (object_id, object_type, business_id, parent_id, revision, state, "
                    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (first.object_id, first.kind, business_id, eid, last.revision, last.state, at, at),
                )
            elif first.revision == 1:
                self._execute(
                    "INSERT INTO objects (object_id, object_type, business_id, parent_id, revision, state, "
                    "created_at, updated_at) SELECT ?, ?, business_id, object_id, ?, ?, ?, ? FROM objects "
                    "WHERE object_id = ?",
                    (first.object_id, first.kind, last.revision, last.state, at, at, eid),
                )
            else:
                # A new revision lands only on top of the one before it, on an
                # object of this execution: a compare-and-set like the guard's.
                cursor = self._execute(
                    "UPDATE objects SET revision = ?, state = ?, updated_at = ? "
                    "WHERE object_id = ? AND revision = ? AND parent_id = ? AND object_type = ?",
                    (last.revision, last.state, at, first.object_id, first.revision - 1, eid, first.kind),
                )
                self._revision_checks.append((first, cursor))
            for item in items:
                self._execute(
                    "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (item.object_id, item.revision, item.state, self._body_text(item), at),
                )

    def append_objects(self, execution_id: str, evidence: Sequence[Evidence], now: datetime) -> bool:
        """Evidence that no execution row change accompanies (a decision kept in history)."""
        self._checks = []
        self._revision_checks = []
        try:
            with self._batch():
                self._queue_evidence(execution_id, evidence, self.dialect.encode_time(now))
        except self.dialect.integrity_errors as exc:
            missing = self._missing_revision(evidence, exc)
            if missing is not None:
                raise evidence_revision_conflict(missing) from None
            raise StoreError(
                "evidence_conflict",
                f"evidence {', '.join(repr(e.object_id) for e in evidence)}: an id already exists; "
                "evidence is never overwritten",
            ) from None
        self._check_revisions()
        return True

    # --- evidence, definitions, events, timers ------------------------------------

    def execution_evidence(self, execution_id: str) -> list[Evidence]:
        rows = self._execute(self.evidence_sql, (execution_id,)).fetchall()
        return [Evidence(r[0], r[1], json.loads(r[2]), r[3], r[4]) for r in rows]

    def load_evidence(self, object_id: str) -> Evidence | None:
        row = self._execute(
            "SELECT o.object_type, o.revision, o.state, v.body FROM objects o JOIN object_revisions v "
            "ON v.object_id = o.object_id AND v.revision = o.revision "
            "WHERE o.object_id = ? AND o.parent_id IS NOT NULL AND (CAST(? AS TEXT) IS NULL OR o.business_id = ?)",
            (object_id, self.business_id, self.business_id),
        ).fetchone()
        if row is None:
            return None
        return Evidence(object_id, row[0], json.loads(row[3]), row[1], row[2])

    def definition_revisions(self, object_id: str) -> list[tuple[str, int, str]]:
        rows = self._execute(
            "SELECT o.business_id, v.revision, v.body FROM objects o JOIN object_revisions v "
            f"ON v.object_id = o.object_id WHERE o.object_id = ? AND o.object_type = '{DEFINITION_TYPE}' "
            "ORDER BY v.revision",
            (object_id,),
        ).fetchall()
        return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]

    def insert_definition(self, object_id: str, business_id: str, revision: int, body: str, now: datetime) -> bool:
        at = self.dialect.encode_time(now)
        if revision == 1:
            try:
                self._execute(
                    "INSERT INTO objects (object_id, object_type, business_id, revision, state, created_at, "
                    "updated_at) VALUES (?, ?, ?, 1, 'registered', ?, ?)",
                    (object_id, DEFINITION_TYPE, business_id, at, at),
                )
            except self.dialect.integrity_errors:
                # Another transaction registered the first revision after this
                # one read none (PostgreSQL: concurrent registrations of one
                # definition); the caller decides again on what it committed.
                return False
        else:
            cursor = self._execute(
                "UPDATE objects SET revision = ?, updated_at = ? WHERE object_id = ? AND revision = ? "
                "AND object_type = ?",
                (revision, at, object_id, revision - 1, DEFINITION_TYPE),
            )
            if cursor.rowcount != 1:
                return False  # registered meanwhile, as above
        self._execute(
            "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
            "VALUES (?, ?, 'registered', ?, ?)",
            (object_id, revision, body, at),
        )
        return True

    def _event_from(self, row: Sequence[Any]) -> Event:
        # An Event published before payloads were bounded may nest past what json.loads follows on a
        # worker's stack: left unread, and said so (kernel/events.py, wake_outputs), rather than a
        # RecursionError on every visit that looks for it.
        withheld = WITHHELD_DEEP if codec.nests_deeper(row[4], MAX_PAYLOAD_DEPTH) else None
        return Event(
            event_id=row[0],
            business_id=row[1],
            event_type=row[2],
            correlation=tuple((n, v) for n, v in json.loads(row[3])),
            payload={} if withheld is not None else json.loads(row[4]),
            payload_withheld=withheld,
        )

    def load_event(self, event_id: str) -> Event | None:
        row = self._execute(
            "SELECT event_id, business_id, event_type, correlation, payload FROM events WHERE event_id = ?",
            (event_id,),
        ).fetchone()
        return None if row is None else self._event_from(row)

    def insert_event(self, event: Event, now: datetime) -> None:
        self._execute(
            "INSERT INTO events (event_id, business_id, event_type, correlation, payload, committed_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                event.event_id,
                event.business_id,
                event.event_type,
                codec.dumps([list(pair) for pair in event.correlation]),
                codec.dumps(dict(event.payload)),
                self.dialect.encode_time(now),
            ),
        )
        for name, value in event.correlation:
            self._execute(
                "INSERT INTO event_keys (business_id, event_type, name, value, event_id) VALUES (?, ?, ?, ?, ?)",
                (event.business_id, event.event_type, name, value, event.event_id),
            )

    def matching_events(self, spec: p.WaitSpec, business_id: str) -> list[Event]:
        # Bounded by the index: only Events of this Business and type carrying
        # the first predicate's exact value are read, then checked in full.
        if spec.event_type is None or not spec.correlation:
            return []
        name, value = spec.correlation[0]
        rows = self._execute(
            "SELECT e.event_id, e.business_id, e.event_type, e.correlation, e.payload FROM event_keys k "
            "JOIN events e ON e.event_id = k.event_id "
            "WHERE k.business_id = ? AND k.event_type = ? AND k.name = ? AND k.value = ? ORDER BY e.{seq}",
            (business_id, spec.event_type, name, value),
        ).fetchall()
        return [e for e in map(self._event_from, rows) if matches(spec, business_id, e)]

    def waiting_registrations(self, business_id: str, event_type: str) -> list[p.WaitRegistration]:
        rows = self._execute(
            "SELECT execution_id, node_id, attempt_id, business_id, spec FROM wait_registrations "
            "WHERE business_id = ? AND event_type = ? AND woken_by IS NULL AND closed_by IS NULL "
            "ORDER BY execution_id, node_id, attempt_id",
            (business_id, event_type),
        ).fetchall()
        return [
            p.WaitRegistration(p.WaitKey(r[0], r[1], r[2]), r[3], codec.decode_wait_spec(r[4])) for r in rows
        ]

    def due_registrations(self, now: datetime | None, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        """As :meth:`Backend.due_registrations`; ``now`` None is the database's own time as the statement starts."""
        scope = business_id if business_id is not None else self.business_id
        if scope is not None and self.business_id is not None and scope != self.business_id:
            return []
        # Only registrations a timer can act on: open, and the one their
        # execution's current revision still waits on.  A registration left
        # open by anything else can then never fill the limit and starve the
        # due ones behind it.
        bound = ("statement_timestamp()", ()) if now is None else ("?", (self.dialect.encode_time(now),))
        try:
            rows = self._execute(self._due_sql(bound[0]), (*bound[1], scope, scope, limit)).fetchall()
        except self.dialect.unreadable_json:
            # One execution's revision body is not JSON (a hand edit, damage), and the database's
            # reading of it failed the whole lookup: every worker's, on every pass, so no timer
            # would fire again.  The same lookup, the bodies read here, passes over that execution
            # as a claim does (`fencekeeper check` lists it).
            return self._due_read_here(bound, scope, limit)
        return [p.WaitKey(r[0], r[1], r[2]) for r in rows]

    def _due_sql(self, bound: str = "?", *, bodies: bool = False) -> str:
        def item(index: int) -> str:
            return self.dialect.wait_item.format(body="r.body", index=index)

        return (
            "SELECT w.execution_id, w.node_id, w.attempt_id" + (", r.body" if bodies else "")
            + " FROM wait_registrations w "
            "JOIN objects o ON o.object_id = w.execution_id "
            "JOIN object_revisions r ON r.object_id = o.object_id AND r.revision = o.revision "
            f"WHERE w.woken_by IS NULL AND w.closed_by IS NULL AND w.wake_at IS NOT NULL AND w.wake_at <= {bound} "
            f"AND o.object_type = '{EXECUTION_TYPE}' AND o.state = 'waiting' "
            + ("" if bodies else f"AND {item(1)} = w.node_id AND {item(2)} = w.attempt_id ")
            + "AND (CAST(? AS TEXT) IS NULL OR w.business_id = ?) ORDER BY w.wake_at, w.execution_id "
            + ("LIMIT ? OFFSET ?" if bodies else "LIMIT ?")
        )

    def _due_read_here(self, bound: tuple[str, tuple[object, ...]], scope: str | None, limit: int) -> list[p.WaitKey]:
        """:meth:`due_registrations`, each registration held to its execution's wait here: a body that is no JSON is passed over.

        Page by page, so that registrations passed over cannot fill the limit
        and starve the due ones behind them.
        """
        keys: list[p.WaitKey] = []
        offset = 0
        sql = self._due_sql(bound[0], bodies=True)
        while len(keys) < limit:
            rows = self._execute(sql, (*bound[1], scope, scope, limit, offset)).fetchall()
            keys.extend(p.WaitKey(r[0], r[1], r[2]) for r in rows if _waits_on(r[3], r[1], r[2]))
            if len(rows) < limit:
                break
            offset += limit
        return keys[:limit]

    def _queue_registration(self, registration: p.WaitRegistration) -> None:
        key = registration.key
        if registration.woken_by is None:
            # A registration is unique per execution, node and attempt; reusing
            # one is a conflict the database refuses.
            self._execute(
                "INSERT INTO wait_registrations (execution_id, node_id, attempt_id, business_id, spec, event_type, "
                "wake_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    key.execution_id,
                    key.node_id,
                    key.attempt_id,
                    registration.business_id,
                    codec.encode_wait_spec(registration.spec),
                    registration.spec.event_type,
                    self._encode_optional_time(registration.spec.wake_at),
                ),
            )
            return
        self._guarded(
            "UPDATE wait_registrations SET woken_by = ?, wake_reason = ? "
            "WHERE execution_id = ? AND node_id = ? AND attempt_id = ? AND woken_by IS NULL",
            (
                registration.woken_by,
                None if registration.wake_reason is None else registration.wake_reason.value,
                key.execution_id,
                key.node_id,
                key.attempt_id,
            ),
        )

    def _dispatch_values(self, d: p.Dispatch) -> tuple[object, ...]:
        return (
            TEXT[d.dispatch_state],
            self.dialect.encode_time(d.eligible_at),
            d.lease_token,
            d.leased_by,
            self._encode_optional_time(d.lease_expires_at),
            d.step_count,
            d.last_error_code,
        )


    def _dispatch_from(self, execution_id: str, row: Sequence[Any]) -> p.Dispatch | None:
        if row[0] is None:
            return None
        return p.Dispatch(
            workflow_execution_id=execution_id,
            # Any text that is no state's still fails as DispatchState() fails.
            dispatch_state=_DISPATCH_STATES.get(row[0]) or DispatchState(row[0]),
            eligible_at=self.dialect.decode_time(row[1]),
            lease_token=row[2],
            leased_by=row[3],
            lease_expires_at=self._decode_optional_time(row[4]),
            step_count=row[5],
            last_error_code=row[6],
        )

    def _history_query(self, execution_id: str) -> tuple[str, tuple[object, ...]]:
        """The statement reading an execution's transitions, oldest first."""
        if not self.revisions_carry_transitions:
            return (
                "SELECT event, from_state, to_state, revision, at, actor, lease_token, fence, reason "
                "FROM transitions WHERE execution_id = ? ORDER BY seq",
                (execution_id,),
            )
        # The execution_transitions view, written out so that each half is
        # read through its own index.
        return (
            "SELECT event, from_state, to_state, revision, at, actor, lease_token, fence, reason FROM ("
            "SELECT event, from_state, state AS to_state, revision, committed_at AS at, actor, lease_token, fence, "
            "reason, 0 AS rank, NULL AS seq FROM object_revisions WHERE object_id = ? AND reason IS NOT NULL "
            "UNION ALL SELECT event, from_state, to_state, revision, at, actor, lease_token, fence, reason, 1, seq "
            "FROM transitions WHERE execution_id = ?) AS history ORDER BY revision, rank, seq",
            (execution_id, execution_id),
        )

    def read_view(self, execution_id: str) -> ExecutionView | None:
        """The execution with its whole history, or None."""
        execution, dispatch = self.load(execution_id)
        if execution is None or dispatch is None:
            return None
        revisions = tuple(
            codec.decode_execution(r[0], execution_id)
            for r in self._execute(
                "SELECT body FROM object_revisions WHERE object_id = ? ORDER BY revision", (execution_id,)
            )
        )
        history = tuple(
            p.TransitionRecord(
                execution_id=execution_id,
                event=None if r[0] is None else ExecutionEvent(r[0]),
                from_state=None if r[1] is None else ExecutionState(r[1]),
                to_state=ExecutionState(r[2]),
                revision=r[3],
                at=self.dialect.decode_time(r[4]),
                actor=r[5],
                lease_token=r[6],
                fence=r[7],
                reason=r[8],
            )
            for r in self._execute(*self._history_query(execution_id))
        )
        keys = self._execute(
            "SELECT node_id, attempt_id FROM wait_registrations WHERE execution_id = ? "
            "ORDER BY {seq}",
            (execution_id,),
        ).fetchall()
        registrations = tuple(
            r
            for r in (self.load_registration(p.WaitKey(execution_id, k[0], k[1])) for k in keys)
            if r is not None
        )
        recoveries = tuple(
            codec.decode_recovery(r[0])
            for r in self._execute(
                "SELECT body FROM commands WHERE execution_id = ? AND command_type = ? ORDER BY {seq}",
                (execution_id, RECOVERY_COMMAND_TYPE),
            )
        )
        all_revisions = tuple(
            (r[5], Evidence(r[0], r[1], json.loads(r[2]), r[3], r[4]))
            for r in self._execute(
                "SELECT o.object_id, o.object_type, v.body, v.revision, v.state, o.revision FROM objects o "
                "JOIN object_revisions v ON v.object_id = o.object_id "
                "WHERE o.parent_id = ? ORDER BY o.{seq}, v.revision",
                (execution_id,),
            )
        )
        current = {item.object_id: item for last, item in all_revisions if item.revision == last}
        order = list(dict.fromkeys(item.object_id for _, item in all_revisions))
        return ExecutionView(
            execution,
            dispatch,
            revisions,
            history,
            registrations,
            recoveries,
            tuple(current[object_id] for object_id in order),
            tuple(item for _, item in all_revisions),
        )


__all__ = [
    "DEFINITION_TYPE",
    "EXECUTION_TYPE",
    "RECOVERY_COMMAND_TYPE",
    "Dialect",
    "SqlBackend",
]
