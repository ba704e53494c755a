"""A stored Operation row that contradicts its state is refused as ``malformed_row``, and nothing is written.

Old code, a hand edit or damage can leave a running row without an owner,
a lease, a start or a claim, or an admitted row with an owner left over.  Every store refuses such a row as it reads it,
before a decision reasons about it: the claim that would replace its
expired owner, the owner's own heartbeat and completion and a cancellation
all fail with one ``StoreError('malformed_row')`` naming the operation and
the field, and every table stays as it was.  Met as the next due row, it is
named instead (a ``ClaimRefused`` coded ``malformed_row``), so that a worker
reports it once and passes over it while the tenant's other work goes on.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.ports import ClaimRefused
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableOperationError, ResolutionStatus
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.operations_suite import ALICE, LEASE, TENANT, World, accounts, open_accounts
from fencekeeper.kernel import operations as o


class Damaged:
    """A store under test, how to damage one of its rows behind its back, and everything it holds."""

    def __init__(
        self,
        store: TransactionalOperationStore,
        damage: Callable[[str, str, Any], None],
        rows: Callable[[], Any],
        edit: Callable[[str, tuple[Any, ...]], None] | None = None,
    ) -> None:
        self.store = store
        self.damage = damage
        self.rows = rows
        self.edit = edit
        """Runs one statement (``?`` placeholders) on a SQL store's tables behind its back."""


def _memory(clock: ManualClock, tmp_path: Path, request: pytest.FixtureRequest) -> Damaged:
    store = MemoryOperationStore(clock)

    def damage(operation_id: str, column: str, value: Any) -> None:
        if column == "input":  # held as the text a SQL store holds in its column
            store._state.inputs[operation_id] = value
            return
        # A store of values can be handed one changed around its constructor; nothing else can build it.
        object.__setattr__(store._state.operations[operation_id], column, value)

    # Read when asked: every commit replaces the store's state.
    return Damaged(store, damage, lambda: store._state.copy())  # noqa: PLW0108


def _sqlite(clock: ManualClock, tmp_path: Path, request: pytest.FixtureRequest) -> Damaged:
    path = tmp_path / "ops.db"
    store = SQLiteOperationStore(path, clock)

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None)

    def damage(operation_id: str, column: str, value: Any) -> None:
        conn = connect()
        try:
            # A hand edit past the table's own check (running <=> owner and lease), as an older file lacks it.
            conn.execute("PRAGMA ignore_check_constraints = ON")
            conn.execute(f"UPDATE operations SET {column} = ? WHERE operation_id = ?", (value, operation_id))
        finally:
            conn.close()

    def rows() -> dict[str, list[tuple[Any, ...]]]:
        conn = connect()
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
        finally:
            conn.close()

    def edit(sql: str, params: tuple[Any, ...]) -> None:
        conn = connect()
        try:
            conn.execute(sql, params)
        finally:
            conn.close()

    return Damaged(store, damage, rows, edit)


def _postgres(clock: ManualClock, tmp_path: Path, request: pytest.FixtureRequest) -> Damaged:
    dsn: str = request.getfixturevalue("pg_dsn")
    schema: str = request.getfixturevalue("pg_schema")
    store = PostgresOperationStore(dsn, schema=schema, clock=clock, pool_size=2)

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute(f"SET search_path TO {schema}")
        return conn

    def damage(operation_id: str, column: str, value: Any) -> None:
        with connect() as conn:
            # A hand edit past the table's own check (running <=> owner and lease): someone dropped it first.
            for (name,) in conn.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = 'operations'::regclass AND contype = 'c' "
                "AND pg_get_constraintdef(oid) LIKE '%owner%'"
            ).fetchall():
                conn.execute(f'ALTER TABLE operations DROP CONSTRAINT "{name}"')
            conn.execute(
                f"UPDATE operations SET {column} = %s WHERE operation_id = %s",
                (value, operation_id),
            )

    def rows() -> dict[str, list[tuple[Any, ...]]]:
        with connect() as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                    "AND table_type = 'BASE TABLE' ORDER BY table_name",
                    (schema,),
                )
            ]
            return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}

    def edit(sql: str, params: tuple[Any, ...]) -> None:
        with connect() as conn:
            conn.execute(sql.replace("?", "%s"), params)

    return Damaged(store, damage, rows, edit)


@pytest.fixture(params=[_memory, _sqlite, _postgres], ids=["memory", "sqlite", "postgres"])
def damaged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Damaged, World, ManualClock]]:
    clock = ManualClock()
    under_test = request.param(clock, tmp_path, request)
    open_accounts(under_test.store, {"acc-1": 100, "acc-2": 0})
    yield under_test, World(under_test.store, clock), clock
    under_test.store.close()


BROKEN = [
    ("owner", None),
    ("attempt_started_at", None),
    ("fence", 0),
]


def passed_over(outcome: object, op_id: str, column: str) -> None:
    """``claim_next``'s answer for a due row it cannot read: named, coded ``malformed_row``, with the store's message."""
    assert isinstance(outcome, ClaimRefused), outcome
    assert (outcome.operation_id, outcome.code, outcome.field) == (op_id, o.RefusalCode.MALFORMED_ROW, column)
    assert outcome.message.startswith(f"operation {op_id!r}: {column}: ") and "[" not in outcome.message
    assert "\n" not in outcome.message


def rows_of(under_test: Damaged, op_id: str) -> Any:
    """Everything the store holds of one Operation (its row, input, attempts, history, outbox messages)."""
    held = under_test.rows()
    if isinstance(under_test.store, MemoryOperationStore):
        return (
            held.operations[op_id], held.inputs.get(op_id), held.attempts.get(op_id), held.history.get(op_id),
            [m for m in held.outbox if op_id in repr(m)],
        )
    return {table: [r for r in rows if any(op_id in str(v) for v in r)]
            for table, rows in held.items()}


@pytest.mark.parametrize(("column", "value"), BROKEN, ids=[c for c, _ in BROKEN])
def test_a_running_row_that_breaks_its_state_is_refused_by_every_request_and_nothing_is_written(
    damaged: tuple[Damaged, World, ManualClock], column: str, value: Any
) -> None:
    under_test, world, clock = damaged
    store = under_test.store
    op_id = world.transfer("k1", 10)
    claim = store.claim_next(TENANT, "w1", LEASE)
    assert isinstance(claim, o.Decision) and claim.credential is not None
    credential = claim.credential
    under_test.damage(op_id, column, value)
    before = under_test.rows()
    granted = o.Authority(True, ALICE.ref)

    def refused(request: Callable[[], object]) -> None:
        with pytest.raises(StoreError) as raised:
            request()
        assert raised.value.code == "malformed_row"
        assert f"operation {op_id!r}: {column}: " in raised.value.message
        assert under_test.rows() == before

    refused(lambda: store.heartbeat(o.HeartbeatRequest(credential, LEASE)))
    refused(lambda: store.complete(o.CompleteRequest(credential, granted)))
    refused(lambda: store.fail(o.FailRequest(credential, "busy", retryable=True)))
    refused(lambda: store.cancel(o.CancelRequest(op_id, ALICE.ref, granted)))
    clock.advance(LEASE + timedelta(seconds=1))  # the owner's lease expired: a claim would replace it
    refused(lambda: store.claim(op_id, o.ClaimRequest("w2", LEASE)))
    refused(lambda: world.service.cancel(op_id, principal=ALICE))
    passed_over(store.claim_next(TENANT, "w2", LEASE), op_id, column)
    assert under_test.rows() == before
    report = world.worker("w2").run_once()
    assert report is not None and (report.operation_id, report.outcome) == (op_id, "malformed_row")
    assert under_test.rows() == before


def test_an_admitted_row_left_with_an_owner_is_refused_to_claims_cancels_and_resubmissions(
    damaged: tuple[Damaged, World, ManualClock],
) -> None:
    # The tables' own check lets this one through (an owner without a lease on a row that is not running).
    under_test, world, _ = damaged
    store = under_test.store
    op_id = world.transfer("k1", 10)
    under_test.damage(op_id, "owner", "w-old")
    before = under_test.rows()
    passed_over(store.claim_next(TENANT, "w1", LEASE), op_id, "owner")
    assert under_test.rows() == before
    for request in (
        lambda: store.claim(op_id, o.ClaimRequest("w1", LEASE)),
        lambda: world.service.cancel(op_id, principal=ALICE),
        lambda: world.transfer("k1", 10),
    ):
        with pytest.raises(StoreError) as raised:
            request()
        assert raised.value.code == "malformed_row"
        assert f"operation {op_id!r}: owner: set only while running" in raised.value.message
        assert under_test.rows() == before


def test_another_tenants_malformed_row_does_not_exist_for_a_caller_acting_for_one_tenant(
    damaged: tuple[Damaged, World, ManualClock],
) -> None:
    # A caller acting for tenant-b learns neither that tenant-a's operation exists nor what its row holds.
    under_test, world, _ = damaged
    op_id = world.transfer("k1", 10)
    under_test.damage(op_id, "owner", "w-old")
    before = under_test.rows()
    assert world.service.get(op_id, tenant="tenant-b") is None
    for request in (
        lambda: world.service.history(op_id, tenant="tenant-b"),
        lambda: world.service.cancel(op_id, principal=ALICE, tenant="tenant-b"),
    ):
        with pytest.raises(DurableOperationError) as raised:
            request()
        assert raised.value.code == "operation_not_found"
        assert "owner" not in raised.value.message
    assert under_test.rows() == before


def test_a_worker_passes_over_a_malformed_due_row_once_and_runs_the_tenants_other_work(
    damaged: tuple[Damaged, World, ManualClock],
) -> None:
    """One damaged row does not halt its tenant's queue: it is reported once, left as it was, and passed over."""
    under_test, world, clock = damaged
    bad = world.transfer("k-bad", 10)
    clock.advance(timedelta(seconds=1))  # due first, so every claim meets it before the others
    good = [world.transfer("k-good-1", 1)]
    clock.advance(timedelta(seconds=1))
    good.append(world.transfer("k-good-2", 2))
    under_test.damage(bad, "owner", "w-old")
    before = rows_of(under_test, bad)

    reports = world.worker("w1").run_until_idle()

    assert [(r.operation_id, r.outcome) for r in reports] == [
        (bad, "malformed_row"), (good[0], "succeeded"), (good[1], "succeeded"),
    ]
    assert f"operation {bad!r}: owner: set only while running" in reports[0].detail
    assert "passed over until" in reports[0].detail
    assert rows_of(under_test, bad) == before
    for op_id in good:
        operation = under_test.store.get(op_id)
        assert operation is not None and operation.outcome is o.TerminalOutcome.SUCCEEDED


def test_a_view_of_the_callers_own_malformed_row_is_refused_by_every_store(
    damaged: tuple[Damaged, World, ManualClock],
) -> None:
    # The memory store is the reference the SQL stores are compared with: it answers status and history as they do.
    under_test, world, _ = damaged
    op_id = world.transfer("k1", 10)
    under_test.damage(op_id, "owner", "w-old")
    before = under_test.rows()
    for request in (
        lambda: world.service.get(op_id),
        lambda: world.service.get(op_id, tenant=TENANT),
        lambda: world.service.history(op_id, tenant=TENANT),
    ):
        with pytest.raises(StoreError) as raised:
            request()
        assert raised.value.code == "malformed_row"
        assert f"operation {op_id!r}: owner: set only while running" in raised.value.message
    assert under_test.rows() == before


def test_what_the_kernel_answers_before_it_reads_the_row_is_answered_by_every_store(
    damaged: tuple[Damaged, World, ManualClock],
) -> None:
    """A request refused for itself, or a submitter no longer authorized, is told so and nothing about the row.

    The kernel judges the request and the submitter's current authority before the Operation the identity names;
    a store that read the row first would answer ``malformed_row`` with what the row holds instead.
    """
    under_test, world, _ = damaged
    store = under_test.store
    op_id = world.transfer("k1", 10)
    under_test.damage(op_id, "owner", "w-old")
    before = under_test.rows()
    granted = o.Authority(True, ALICE.ref)
    credential = o.Credential(op_id, "w-old", 1)
    for request, field in (
        (lambda: store.heartbeat(o.HeartbeatRequest(credential, timedelta(0))), "lease_duration"),
        (lambda: store.cancel(o.CancelRequest(op_id, ALICE.ref, granted, "bad\x00reason")), "reason"),
        (lambda: store.claim(op_id, o.ClaimRequest("w1", timedelta(0))), "lease_duration"),
        (lambda: store.claim_next(TENANT, "w1", timedelta(0)), "lease_duration"),
    ):
        refusal = request()
        assert isinstance(refusal, o.Refusal) and not isinstance(refusal, ClaimRefused), refusal
        assert (refusal.code, refusal.field) == (o.RefusalCode.INVALID_REQUEST, field)
    world.directory.set("alice", ResolutionStatus.DISABLED)
    with pytest.raises(DurableOperationError) as raised:
        world.transfer("k1", 10)
    assert raised.value.code == "not_authorized" and op_id not in raised.value.message
    assert "w-old" not in raised.value.message
    assert under_test.rows() == before


@pytest.fixture(params=[_sqlite, _postgres], ids=["sqlite", "postgres"])
def damaged_sql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Damaged, World, ManualClock]]:
    """A SQL store: its columns can hold text no Operation value can (a store of values cannot)."""
    clock = ManualClock()
    under_test = request.param(clock, tmp_path, request)
    open_accounts(under_test.store, {"acc-1": 100, "acc-2": 0})
    yield under_test, World(under_test.store, clock), clock
    under_test.store.close()


UNREADABLE = [
    ("policy", "{}"),
    ("policy", "not json"),
    ("approval", '{"approved": true}'),
]


@pytest.mark.parametrize(("column", "value"), UNREADABLE, ids=[f"{c}={v}" for c, v in UNREADABLE])
def test_a_column_that_cannot_be_read_is_a_malformed_row_and_the_queue_goes_on(
    damaged_sql: tuple[Damaged, World, ManualClock], column: str, value: str
) -> None:
    # As a state or outcome no version writes: named by its column, never a traceback that stops every worker.
    under_test, world, clock = damaged_sql
    bad = world.transfer("k-bad", 10)
    clock.advance(timedelta(seconds=1))
    good = world.transfer("k-good", 1)
    under_test.damage(bad, column, value)
    before = under_test.rows()
    passed_over(under_test.store.claim_next(TENANT, "w1", LEASE), bad, column)
    with pytest.raises(StoreError) as raised:
        world.service.get(bad)
    assert raised.value.code == "malformed_row" and f"operation {bad!r}: {column}: " in raised.value.message
    assert world.service.get(bad, tenant="tenant-b") is None
    assert under_test.rows() == before
    reports = world.worker("w1").run_until_idle()
    assert [(r.operation_id, r.outcome) for r in reports] == [(bad, "malformed_row"), (good, "succeeded")]


UNREADABLE_INPUTS = ["not json", "", '{"amount": NaN, "from": "acc-1", "to": "acc-2"}']


@pytest.mark.parametrize("value", UNREADABLE_INPUTS, ids=["not json", "empty", "NaN"])
def test_an_input_that_cannot_be_read_is_refused_by_the_claim_and_uses_no_attempt(
    damaged: tuple[Damaged, World, ManualClock], value: str
) -> None:
    """The claim that would hand the input to a worker reads it first: one malformed row, passed over, not a crash.

    A worker that claimed and then failed to decode it would end with a traceback after its claim committed, and
    each restart would use up an attempt (until ``max_attempts_exceeded``) while the tenant's queue stalls.
    """
    under_test, world, clock = damaged
    store = under_test.store
    bad = world.transfer("k-bad", 10)
    clock.advance(timedelta(seconds=1))
    good = world.transfer("k-good", 1)
    under_test.damage(bad, "input", value)
    before = under_test.rows()
    passed_over(store.claim_next(TENANT, "w1", LEASE), bad, "input")
    assert under_test.rows() == before
    with pytest.raises(StoreError) as raised:
        world.service.get(bad)
    assert raised.value.code == "malformed_row" and f"operation {bad!r}: input: " in raised.value.message
    assert "\n" not in raised.value.message
    assert world.service.get(bad, tenant="tenant-b") is None
    # History does not read the input: what happened to the row stays visible while it is repaired.
    assert [line.to_state for line in world.service.history(bad)] == ["admitted"]
    assert under_test.rows() == before
    bad_rows = rows_of(under_test, bad)

    reports = world.worker("w1").run_until_idle()

    assert [(r.operation_id, r.outcome) for r in reports] == [(bad, "malformed_row"), (good, "succeeded")]
    assert f"operation {bad!r}: input: " in reports[0].detail and "passed over until" in reports[0].detail
    assert rows_of(under_test, bad) == bad_rows
    operation = store.get(bad)
    assert operation is not None and operation.attempt_count == 0


def test_a_result_that_cannot_be_read_is_a_malformed_row_of_status_alone(
    damaged: tuple[Damaged, World, ManualClock],
) -> None:
    under_test, world, _ = damaged
    op_id = world.transfer("k1", 10)
    assert [r.outcome for r in world.worker("w1").run_until_idle()] == ["succeeded"]
    under_test.damage(op_id, "result", "{not json")
    before = under_test.rows()
    with pytest.raises(StoreError) as raised:
        world.service.get(op_id)
    assert raised.value.code == "malformed_row" and f"operation {op_id!r}: result: " in raised.value.message
    assert [line.to_state for line in world.service.history(op_id)] == ["admitted", "running", "succeeded"]
    assert under_test.rows() == before


def test_an_input_damaged_after_its_claim_is_reported_and_passed_over_not_a_traceback() -> None:
    """The worker's own read of the input, for a store that did not hand it the claim's: one report, no crash."""
    clock = ManualClock()

    class DamagedAfterClaim(MemoryOperationStore):
        def claim_next(self, *args: Any, **kwargs: Any) -> o.Outcome | None:
            outcome = super().claim_next(*args, **kwargs)
            if isinstance(outcome, o.Decision) and outcome.credential is not None:
                self._claimed.clear()  # the worker reads the input again, after this hand edit
                self._state.inputs[outcome.operation.operation_id] = "not json"
            return outcome

    store = DamagedAfterClaim(clock)
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    world = World(store, clock)
    op_id = world.transfer("k1", 10)
    worker = world.worker("w1")

    reports = worker.run_until_idle()

    assert [(r.operation_id, r.attempt, r.outcome) for r in reports] == [(op_id, 1, "malformed_row")]
    assert f"operation {op_id!r}: input: " in reports[0].detail and "passed over until" in reports[0].detail
    clock.advance(LEASE * 3)  # the attempt's lease and the pause have ended: the next claim meets the row
    assert worker.run_until_idle() == []  # refused by the claim, and not reported a second time
    operation = store.get(op_id)
    assert operation is not None and operation.attempt_count == 1
    assert accounts(store) == {"acc-1": 100, "acc-2": 0}


def _copied_transition(column: str, value: str) -> str:
    """A statement appending a copy of an Operation's first transition, with ``column`` holding ``value``.

    The history is append-only (its triggers refuse an update), so other code or a hand edit adds to it.
    """
    columns = ["operation_id", "revision", "event", "from_state", "to_state", "at", "actor", "fence", "reason"]
    chosen = ["99" if c == "revision" else f"'{value}'" if c == column else c for c in columns]
    return (
        f"INSERT INTO operation_transitions ({', '.join(columns)}) SELECT {', '.join(chosen)} "
        "FROM operation_transitions WHERE operation_id = ? AND revision = 1"
    )


HISTORY_DAMAGE = [
    ("operation_attempts.state", "UPDATE operation_attempts SET state = 'bogus' WHERE operation_id = ?"),
    ("operation_transitions.event", _copied_transition("event", "bogus")),
    ("operation_transitions.from_state", _copied_transition("from_state", "bogus")),
    ("operation_transitions.to_state", _copied_transition("to_state", "bogus")),
]
SQLITE_HISTORY_DAMAGE = [
    # PostgreSQL's timestamptz columns hold only times; a SQLite file's text columns hold anything.
    ("operation_attempts.started_at", "UPDATE operation_attempts SET started_at = 'yesterday' WHERE operation_id = ?"),
    ("operation_attempts.ended_at", "UPDATE operation_attempts SET ended_at = '2026-01-01T00:00:00' WHERE operation_id = ?"),
    ("operation_transitions.at", _copied_transition("at", "yesterday")),
]


def history_refused(under_test: Damaged, world: World, column: str, sql: str) -> None:
    """Status and history of an Operation one of whose attempts or transitions cannot be read: one error, no write."""
    op_id = world.transfer("k1", 10)
    assert [r.outcome for r in world.worker("w1").run_until_idle()] == ["succeeded"]
    assert under_test.edit is not None
    under_test.edit(sql, (op_id,))
    before = under_test.rows()
    for request in (
        lambda: world.service.get(op_id),
        lambda: world.service.get(op_id, tenant=TENANT),
        lambda: world.service.history(op_id),
        lambda: world.service.history(op_id, tenant=TENANT),
    ):
        with pytest.raises(StoreError) as raised:
            request()
        assert raised.value.code == "malformed_row", raised.value
        assert raised.value.message.startswith(f"operation {op_id!r}: {column}: "), raised.value.message
        assert "\n" not in raised.value.message
    assert world.service.get(op_id, tenant="tenant-b") is None
    with pytest.raises(DurableOperationError) as refused:
        world.service.history(op_id, tenant="tenant-b")
    assert refused.value.code == "operation_not_found" and column not in refused.value.message
    assert under_test.rows() == before


@pytest.mark.parametrize(("column", "sql"), HISTORY_DAMAGE, ids=[c for c, _ in HISTORY_DAMAGE])
def test_an_attempt_or_transition_that_cannot_be_read_is_a_malformed_row_of_status_and_history(
    damaged_sql: tuple[Damaged, World, ManualClock], column: str, sql: str
) -> None:
    under_test, world, _ = damaged_sql
    history_refused(under_test, world, column, sql)


@pytest.mark.parametrize(("column", "sql"), SQLITE_HISTORY_DAMAGE, ids=[c for c, _ in SQLITE_HISTORY_DAMAGE])
def test_a_time_in_the_history_that_cannot_be_read_is_a_malformed_row(
    tmp_path: Path, request: pytest.FixtureRequest, column: str, sql: str
) -> None:
    clock = ManualClock()
    under_test = _sqlite(clock, tmp_path, request)
    try:
        open_accounts(under_test.store, {"acc-1": 100, "acc-2": 0})
        history_refused(under_test, World(under_test.store, clock), column, sql)
    finally:
        under_test.store.close()
