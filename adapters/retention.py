"""Bounded retention: pruning what has ended and is past its window, in small batches.

Seed 001 (Tasks, external effects, history, and retention): "Pruning is
batched, keeps active work, and preserves idempotency identities for their
full promised window. Result and error bodies may expire before terminal
Operation metadata."  specs/operations.md (Retention) states the rules;
docs/operating.md shows the commands.

Rules of this module:

- Every window counts from a moment the row itself records: an Operation's
  ``ended_at`` (the transition that ended it), an outbox row's
  ``exported_at``.  Nothing that has not ended (``outcome IS NULL``) and no
  outbox row that has not been exported is ever a candidate, whatever the
  windows say.
- An idempotency identity is kept until its own ``retain_until`` (the
  window promised when it was admitted) *and* its ``identities`` window
  after the Operation ended, whichever is later.  An Operation's row goes
  only once no identity names it, so an identity never outlives its
  Operation's record.
- Result bodies (``results``) may expire before the metadata
  (``operations``); the Operation stays, with ``result`` NULL and
  ``result_expired_at`` set.  Only codes are kept for errors (the error
  "body" is the code), so they live with the metadata.
- Each batch is one short transaction touching at most ``batch_size`` rows
  of the kind it prunes (an Operation's own row takes its attempts and any
  transitions left with it), so workers wait for a prune no longer than for
  one of their own commits.  Nothing is kept in memory between batches but
  how far the executions' scan got within one call: a prune that is stopped
  or killed resumes where the database says it was.
- Workflow executions are pruned only when an ``executions`` window is
  given (by default they are kept): an execution that has ended
  (succeeded, failed, cancelled) and was last changed before the window
  goes whole, with its evidence objects, revisions, dispatch row,
  transitions, wait registrations and commands, once every outbox message
  of it has been exported (or discarded): until then its id stays taken,
  so no new execution under that id queues behind its messages.  A batch takes
  ``batch_size // EXECUTION_ROWS`` executions, so its rows stay near
  ``batch_size``.  Events are a Business's, not an execution's, and stay;
  the execution's outbox rows go with the outbox window, once exported.
- Deleting is possible only here: every batch enters the triggers'
  explicit pruning mode first (migration ``outbox_and_pruning``; for
  executions ``execution_pruning``), and the triggers still refuse any row
  of unended work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import attrs

from fencekeeper.kernel.common import shown

from .operations.base import TransactionalOperationStore
from .operations.sql import SqlTx
from .store import StoreError


def _positive(name: str, *, optional: bool = False) -> Callable[[object, object, timedelta | None], None]:
    def check(_: object, __: object, value: timedelta | None) -> None:
        if value is None and optional:
            return
        if not isinstance(value, timedelta) or value < timedelta(0):
            raise StoreError("invalid_input", f"{name}: must be a duration of zero or more, got {shown(value)}")

    return check


EXECUTION_ROWS = 20
"""About how many rows one ended execution has (revisions, evidence, transitions, ...): a batch of
``batch_size`` rows takes ``batch_size // EXECUTION_ROWS`` executions (at least one)."""

_ENDED_EXECUTION = "object_type = 'WorkflowExecution' AND state IN ('succeeded', 'failed', 'cancelled')"

_UNEXPORTED_MESSAGE = (
    "SELECT 1 FROM outbox WHERE kind = 'execution' AND subject_id = objects.object_id AND exported_at IS NULL"
)
"""An execution's message not yet exported (parked included): the execution waits for it.

Pruned, its id would be free while the message was still undelivered: a new
execution run under that id shares its subject (``kind``, ``subject_id``),
and every message of the new one would queue behind the old one's, held for
as long as that stays parked.  Kept, the old execution explains its messages
until they are out, and its id frees only once nothing of it is left to send.
"""


@attrs.frozen
class RetentionWindows:
    """How long each kind is kept after its work ended (outbox: after it was exported)."""

    operations: timedelta = attrs.field(default=timedelta(days=30), validator=_positive("operations"))
    """An ended Operation's metadata: its row, its attempts."""
    results: timedelta = attrs.field(default=timedelta(days=7), validator=_positive("results"))
    """Result bodies; at most ``operations``."""
    identities: timedelta = attrs.field(default=timedelta(0), validator=_positive("identities"))
    """Beyond each identity's own promised window (``retain_until``), after its Operation ended."""
    history: timedelta = attrs.field(default=timedelta(days=14), validator=_positive("history"))
    """Transition history of ended Operations; at most ``operations``."""
    outbox: timedelta = attrs.field(default=timedelta(days=7), validator=_positive("outbox"))
    """Outbox rows, after they were exported (rows never exported are never pruned)."""
    executions: timedelta | None = attrs.field(default=None, validator=_positive("executions", optional=True))
    """Ended workflow executions, after their last change; None keeps them (the default)."""

    def __attrs_post_init__(self) -> None:
        for name in ("results", "history"):
            if getattr(self, name) > self.operations:
                raise StoreError(
                    "invalid_input",
                    f"{name}: {getattr(self, name)} is longer than operations ({self.operations}); an Operation's "
                    f"{name} cannot outlive its record",
                )


@attrs.frozen
class PruneReport:
    """What one prune removed, by kind, and how many batches (transactions) it took."""

    results_expired: int = 0
    identities: int = 0
    transitions: int = 0
    attempts: int = 0
    operations: int = 0
    outbox: int = 0
    executions: int = 0
    """Ended workflow executions removed, each with all its rows."""
    execution_rows: int = 0
    """Those executions' rows, of every table, their own objects rows included."""
    batches: int = 0
    finished: bool = True
    """False when ``max_batches`` stopped it with work left: run it again to go on."""

    def __add__(self, other: PruneReport) -> PruneReport:
        fields = [f.name for f in attrs.fields(PruneReport) if f.name != "finished"]
        added = {name: getattr(self, name) + getattr(other, name) for name in fields}
        return PruneReport(**added, finished=self.finished and other.finished)


def _expire_results(tx: SqlTx, cutoff: datetime, now: datetime, limit: int) -> PruneReport:
    # `result IS NOT NULL` on the UPDATE itself, not only in its sub-select: a row another prune expired while
    # this one waited for it is rechecked (PostgreSQL) against these conditions alone, and must keep the time
    # it expired at and not be counted twice.
    changed = tx.run(
        "UPDATE operations SET result = NULL, result_expired_at = ? WHERE result IS NOT NULL AND operation_id IN "
        "(SELECT operation_id FROM operations WHERE outcome IS NOT NULL AND result IS NOT NULL AND ended_at <= ? "
        "LIMIT ?)",
        (tx.d.encode_time(now), tx.d.encode_time(cutoff), limit),
    )
    return PruneReport(results_expired=int(changed.rowcount))


def _identities(tx: SqlTx, cutoff: datetime, now: datetime, limit: int) -> PruneReport:
    # The Operation the identity names is part of the match: a resubmission that moved the identity to a new
    # Operation while this DELETE waited for the row (PostgreSQL rechecks only the row) leaves it alone.
    gone = tx.run(
        "DELETE FROM operation_identities WHERE (namespace, tenant, principal, client_key, operation_id) IN ("
        "SELECT i.namespace, i.tenant, i.principal, i.client_key, i.operation_id FROM operation_identities i "
        "JOIN operations o ON o.operation_id = i.operation_id "
        "WHERE i.retain_until <= ? AND o.outcome IS NOT NULL AND o.ended_at <= ? LIMIT ?)",
        (tx.d.encode_time(now), tx.d.encode_time(cutoff), limit),
    )
    return PruneReport(identities=int(gone.rowcount))


def _history(tx: SqlTx, cutoff: datetime, now: datetime, limit: int) -> PruneReport:
    gone = tx.run(
        "DELETE FROM operation_transitions WHERE (operation_id, revision) IN (SELECT t.operation_id, t.revision "
        "FROM operation_transitions t JOIN operations o ON o.operation_id = t.operation_id "
        "WHERE o.outcome IS NOT NULL AND o.ended_at <= ? LIMIT ?)",
        (tx.d.encode_time(cutoff), limit),
    )
    return PruneReport(transitions=int(gone.rowcount))


def _operations(tx: SqlTx, cutoff: datetime, now: datetime, limit: int) -> PruneReport:
    ids = [
        str(r[0])
        for r in tx.run(
            "SELECT o.operation_id FROM operations o WHERE o.outcome IS NOT NULL AND o.ended_at <= ? "
            "AND NOT EXISTS (SELECT 1 FROM operation_identities i WHERE i.operation_id = o.operation_id) "
            f"ORDER BY o.ended_at LIMIT ?{' FOR UPDATE SKIP LOCKED' if tx.d.name == 'postgresql' else ''}",
            (tx.d.encode_time(cutoff), limit),
        ).fetchall()
    ]
    if not ids:
        return PruneReport()
    marks = ", ".join("?" for _ in ids)
    transitions = tx.run(f"DELETE FROM operation_transitions WHERE operation_id IN ({marks})", ids).rowcount
    attempts = tx.run(f"DELETE FROM operation_attempts WHERE operation_id IN ({marks})", ids).rowcount
    operations = tx.run(f"DELETE FROM operations WHERE operation_id IN ({marks})", ids).rowcount
    return PruneReport(transitions=int(transitions), attempts=int(attempts), operations=int(operations))


def _outbox(tx: SqlTx, cutoff: datetime, now: datetime, limit: int) -> PruneReport:
    # SQLite numbers a new row one past the largest seq the table holds (seq is its rowid, without
    # AUTOINCREMENT): with the newest row gone, the next message would take a seq already delivered, and a
    # consumer keeping each subject's last seq would read it as older, and could drop it.  The newest row
    # stays, so seq only grows.  PostgreSQL's identity column never gives a number twice.
    newest = " AND seq < (SELECT max(seq) FROM outbox)" if tx.d.name == "sqlite" else ""
    gone = tx.run(
        "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE exported_at IS NOT NULL AND exported_at <= ?"
        f"{newest} ORDER BY exported_at LIMIT ?)",
        (tx.d.encode_time(cutoff), limit),
    )
    return PruneReport(outbox=int(gone.rowcount))


def _executions(scan: list[str]) -> Callable[[SqlTx, datetime, datetime, int], PruneReport]:
    """The executions' step; ``scan`` holds the last execution id a batch of this call took.

    Ended executions have no index of their own (module rules), so each batch
    walks ``objects`` in id order from where the one before stopped instead
    of reading again the rows it deleted (on PostgreSQL, dead until vacuumed).
    """

    def step(tx: SqlTx, cutoff: datetime, now: datetime, limit: int) -> PruneReport:
        ids = [
            str(r[0])
            for r in tx.run(
                f"SELECT object_id FROM objects WHERE object_id > ? AND {_ENDED_EXECUTION} AND updated_at <= ? "
                f"AND NOT EXISTS ({_UNEXPORTED_MESSAGE}) ORDER BY object_id LIMIT ?{' FOR UPDATE SKIP LOCKED' if tx.d.name == 'postgresql' else ''}",
                (scan[0], tx.d.encode_time(cutoff), limit),
            ).fetchall()
        ]
        if ids:
            scan[0] = ids[-1]
        return _remove_executions(tx, ids)

    return step


def _remove_executions(tx: SqlTx, ids: list[str]) -> PruneReport:
    if not ids:
        return PruneReport()
    marks = ", ".join("?" for _ in ids)
    # Children before what they reference: evidence revisions, evidence objects, then the execution's own.
    statements = (
        f"DELETE FROM object_revisions WHERE object_id IN (SELECT object_id FROM objects WHERE parent_id IN ({marks}))",
        f"DELETE FROM objects WHERE parent_id IN ({marks})",
        f"DELETE FROM object_revisions WHERE object_id IN ({marks})",
        f"DELETE FROM transitions WHERE execution_id IN ({marks})",
        f"DELETE FROM wait_registrations WHERE execution_id IN ({marks})",
        f"DELETE FROM commands WHERE execution_id IN ({marks})",
        f"DELETE FROM workflow_dispatch WHERE workflow_execution_id IN ({marks})",
    )
    gone = sum(int(tx.run(statement, ids).rowcount) for statement in statements)
    executions = int(tx.run(f"DELETE FROM objects WHERE object_id IN ({marks})", ids).rowcount)
    return PruneReport(executions=executions, execution_rows=gone + executions)


def _removed(report: PruneReport) -> int:
    return (
        report.results_expired + report.identities + report.transitions + report.operations + report.outbox
        + report.executions
    )  # fmt: skip


_LONGEST_REST = 86_400 * 366 * 100
"""A century, the longest ``--pause``: a tiny ``duty`` asks for more than ``time.sleep`` takes (OverflowError)."""


def prune(
    store: TransactionalOperationStore,
    windows: RetentionWindows | None = None,
    *,
    batch_size: int = 500,
    max_batches: int | None = None,
    pause: float = 0.0,
    duty: float = 0.25,
    time_limit: float | None = None,
) -> PruneReport:
    """Prune everything past its window, ``batch_size`` rows per transaction; returns what was removed.

    Runs each kind until a batch finds less than a full batch, in this
    order: result bodies, identities, transition history, Operations,
    outbox, and workflow executions when ``windows.executions`` is set.  ``max_batches`` bounds the batches of this call that remove
    something (the report says whether it finished; a batch that finds
    nothing is not counted, so a resumed prune gets past the kinds already
    done).  Between full batches it waits ``pause`` seconds, and at least
    long enough that it holds the store no more than ``duty`` of the time
    (a batch of 40 ms at the default 0.25 is followed by 120 ms of rest):
    on SQLite a prune and the workers take turns at one write lock, and a
    pruner that asked again at once would win it over the workers' busy
    waits (bench/retention.py).  ``time_limit`` seconds: start no batch
    after it (the report says whether it finished).
    """
    windows = windows or RetentionWindows()
    if not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000:
        raise StoreError("invalid_input", f"batch_size: must be between 1 and 100000, got {shown(batch_size)}")
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise StoreError("invalid_input", f"max_batches: must be a positive integer, got {shown(max_batches)}")
    if pause < 0:
        raise StoreError("invalid_input", f"pause: must be zero or more seconds, got {shown(pause)}")
    if not 0 < duty <= 1:
        raise StoreError("invalid_input", f"duty: must be above 0 and at most 1, got {shown(duty)}")
    steps: list[tuple[timedelta, Callable[[SqlTx, datetime, datetime, int], PruneReport], int]] = [
        (windows.results, _expire_results, batch_size),
        (windows.identities, _identities, batch_size),
        (windows.history, _history, batch_size),
        (windows.operations, _operations, batch_size),
        (windows.outbox, _outbox, batch_size),
    ]
    if windows.executions is not None:
        steps.append((windows.executions, _executions([""]), max(1, batch_size // EXECUTION_ROWS)))
    stop_at = None if time_limit is None else time.monotonic() + time_limit
    total = PruneReport()
    spent = 0  # batches that removed something: a resumed prune re-checks the earlier kinds without using its budget
    for window, step, limit in steps:
        while True:
            if stop_at is not None and time.monotonic() >= stop_at:
                return attrs.evolve(total, finished=False)
            if max_batches is not None and spent >= max_batches:
                # Finished only if nothing is left: without asking, a prune whose last batch emptied its
                # kind reported work left whenever a kind after it (or this one) had none.
                if _work_left(store, window, step):
                    return attrs.evolve(total, finished=False)
                break
            report, held = _batch(store, window, step, limit)
            total = total + attrs.evolve(report, batches=1)
            spent += _removed(report) > 0
            if _removed(report) < limit:
                break
            rest = min(max(pause, held * (1 - duty) / duty), _LONGEST_REST)
            if stop_at is not None:
                # No batch starts after the limit: resting past it would only delay the report.
                rest = min(rest, max(0.0, stop_at - time.monotonic()))
            if rest > 0:
                time.sleep(rest)
    return total


class _WorkLeft(Exception):
    """Raised inside a probe's transaction (:func:`_work_left`), so that what it removed is rolled back."""


def _work_left(
    store: TransactionalOperationStore,
    window: timedelta,
    step: Callable[[SqlTx, datetime, datetime, int], PruneReport],
) -> bool:
    """Whether ``step`` has anything left to remove: a batch of one, rolled back if it found something."""
    try:
        _batch(store, window, step, 1, probe=True)
    except _WorkLeft:
        return True
    return False


def _batch(
    store: TransactionalOperationStore,
    window: timedelta,
    step: Callable[[SqlTx, datetime, datetime, int], PruneReport],
    limit: int,
    *,
    probe: bool = False,
) -> tuple[PruneReport, float]:
    """One batch, and how long it held the store (from its lock granted to its commit; not the wait for it).

    With ``probe``, a batch that removes something raises :class:`_WorkLeft` instead of committing.
    """
    with store._transaction() as tx:  # the store's own transaction: its lock order, its clock
        started = time.monotonic()
        if not isinstance(tx, SqlTx):
            raise StoreError("invalid_input", "pruning needs a SQL store (SQLite or PostgreSQL)")
        tx.refuse_partial_view("pruning", "operations")
        now = tx.now()
        tx.enter_pruning()
        report = step(tx, now - window, now, limit)
        if probe and _removed(report) > 0:
            raise _WorkLeft
        tx.leave_pruning()
    return report, time.monotonic() - started


__all__ = ["EXECUTION_ROWS", "PruneReport", "RetentionWindows", "prune"]
