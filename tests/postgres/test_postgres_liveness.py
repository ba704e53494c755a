"""Liveness on PostgreSQL: timers that never starve, sweeps that never block or crash.

What these tests prove, beyond the shipped suite:

- a schema written before migration 6, where cancelling a waiter left its
  registration open, is migrated so that those registrations are closed and
  the live waiter's timer is due and fires;
- two sweeps started together (threads, each with its own store, as two
  machines) quarantine every expired execution exactly once and report the
  other's as moved on, never as a problem or a crash;
- a sweep facing a row that another transaction holds (a stalled session)
  skips it within ``SWEEP_LOCK_WAIT``, whatever the session's lock_timeout,
  reports it as locked, and quarantines the rest; the next sweep takes it;
- the store's sessions carry ``lock_timeout`` and
  ``idle_in_transaction_session_timeout``: a request that meets a row held
  past the lock timeout fails with ``row_locked`` and writes nothing, and a
  session of the store left idle inside a transaction is ended by the
  server, releasing its locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, timedelta

import psycopg
import pytest

from fencekeeper.adapters import examples, postgres_store, service
from fencekeeper.adapters.postgres_store import PostgresStore, migrate
from fencekeeper.adapters.store import ManualClock, StoreError, TransactionalStore
from fencekeeper.adapters.testing.suite import (
    GRANTED,
    admit,
    claim,
    decided,
    finalize_request,
    revision,
    snapshot,
    wait_spec,
)
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState
from tests.stores.test_sweep_liveness import (
    BUSINESS,
    assert_each_quarantined_once,
    expired_with_attempts,
    sweep_together,
)


def _sql(pg_dsn: str, schema: str, *statements: str) -> list[tuple[object, ...]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        rows: list[tuple[object, ...]] = []
        for statement in statements:
            cursor = conn.execute(statement)  # type: ignore[arg-type]
            rows = cursor.fetchall() if cursor.description else []
        return rows


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(pg_dsn: str, pg_schema: str, clock: ManualClock) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_dsn, schema=pg_schema, clock=clock)
    yield s
    s.close()


def _waiting(store: PostgresStore, execution_id: str, spec: p.WaitSpec) -> p.WaitKey:
    admit(store, execution_id)
    claimed, credential = claim(store, "w-setup")
    assert claimed == execution_id
    decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
    return p.WaitKey(execution_id, spec.node_id, spec.attempt_id)


# --- timers -------------------------------------------------------------------------------------


def test_migration_6_closes_registrations_left_open_by_earlier_cancellations(
    pg_dsn: str, pg_schema: str, store: PostgresStore, clock: ManualClock
) -> None:
    start = clock.now()
    for n in range(3):
        _waiting(store, f"e-stale-{n}", wait_spec(f"a-{n}", event_type=None, wake_at=start))
        decided(store.cancel(p.CancelRequest(f"e-stale-{n}", "b-1", revision(store, f"e-stale-{n}"), GRANTED)))
    live = _waiting(store, "e-live", wait_spec("a-live", event_type=None, wake_at=start + timedelta(seconds=1)))
    store.close()
    # What a schema at version 5 held: no closed_by (its indexes go with it), every registration open.
    _sql(
        pg_dsn,
        pg_schema,
        "ALTER TABLE wait_registrations DROP COLUMN closed_by",
        "CREATE INDEX wait_registrations_event ON wait_registrations (business_id, event_type) WHERE woken_by IS NULL",
        "CREATE INDEX wait_registrations_due ON wait_registrations (wake_at) "
        "WHERE woken_by IS NULL AND wake_at IS NOT NULL",
        # and nothing of the migrations after it.
        "DROP TABLE journal_heads, journal_events, journal_headers",
        "DROP TABLE outbox, operation_transitions, operation_attempts, operation_identities, operations",
        "DROP FUNCTION fencekeeper_outbox_fixed, fencekeeper_operation_stays_ended, fencekeeper_prunable, "
        "fencekeeper_operation_tenant, fencekeeper_guard_held, fencekeeper_journal_head_forward",
        # Migration 12's pruning triggers (they go with their function), and migration 1's append-only function back.
        "DROP FUNCTION fencekeeper_execution_prunable CASCADE",
        "DROP FUNCTION fencekeeper_execution_ended",
        "CREATE OR REPLACE FUNCTION fencekeeper_append_only() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;\nEND $$",
        "DELETE FROM schema_migrations WHERE version >= 6",
    )
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM wait_registrations WHERE woken_by IS NULL") == [(4,)]
    assert migrate(pg_dsn, pg_schema) == [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    closed = _sql(pg_dsn, pg_schema, "SELECT execution_id, closed_by FROM wait_registrations ORDER BY execution_id")
    assert closed == [("e-live", None), ("e-stale-0", "cancel"), ("e-stale-1", "cancel"), ("e-stale-2", "cancel")]
    reopened = PostgresStore(pg_dsn, schema=pg_schema, clock=clock)
    try:
        clock.set(start + timedelta(seconds=1))
        assert reopened.due_wakes(limit=1) == [live]
        decided(reopened.fire_timer(live, GRANTED))
    finally:
        reopened.close()


# --- sweeps ---------------------------------------------------------------------------------------


def test_two_sweeps_at_once_quarantine_every_execution_once(
    pg_dsn: str, pg_schema: str, store: PostgresStore, clock: ManualClock
) -> None:
    other = PostgresStore(pg_dsn, schema=pg_schema, clock=clock)
    try:
        ids = expired_with_attempts(store, clock, 30)
        sweeps = sweep_together([store, other])
        assert_each_quarantined_once(store, ids, sweeps)
    finally:
        other.close()


def _hold_rows(pg_dsn: str, schema: str, execution_id: str) -> psycopg.Connection[tuple[object, ...]]:
    """A session that locks an execution's rows and then stalls inside its transaction."""
    conn = psycopg.connect(pg_dsn)
    conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
    conn.execute("SELECT 1 FROM objects WHERE object_id = %s FOR UPDATE", (execution_id,))
    conn.execute("SELECT 1 FROM workflow_dispatch WHERE workflow_execution_id = %s FOR UPDATE", (execution_id,))
    return conn


def test_a_sweep_skips_a_row_a_stalled_transaction_holds_and_reports_it(
    pg_dsn: str, pg_schema: str, clock: ManualClock
) -> None:
    # The session's own lock timeout is long: skipping must not depend on it.
    store = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, lock_timeout=600)
    policy = examples.grants(BUSINESS, "user:ops")
    try:
        ids = expired_with_attempts(store, clock, 3)
        holder = _hold_rows(pg_dsn, pg_schema, ids[0])
        result: list[service.Sweep] = []
        try:
            sweeper = threading.Thread(
                target=lambda: result.append(
                    service.quarantine_expired(store, policy, business_id=BUSINESS, principal_id="user:ops")
                )
            )
            sweeper.start()
            sweeper.join(timeout=60)
            assert not sweeper.is_alive(), "the sweep waited for the stalled transaction"
        finally:
            holder.rollback()
            holder.close()
        (sweep,) = result
        assert list(sweep.locked) == [ids[0]] and "locked by another transaction" in sweep.locked[ids[0]]
        assert sorted(sweep.quarantined) == ids[1:] and sweep.problems == {}
        view = store.read(ids[0])
        assert view is not None and view.execution.state == ExecutionState.RUNNING, "a skipped row is untouched"
        again = service.quarantine_expired(store, policy, business_id=BUSINESS, principal_id="user:ops")
        assert again.quarantined == [ids[0]] and again.locked == {}
    finally:
        store.close()


# --- session timeouts -------------------------------------------------------------------------------


def _setting(store: TransactionalStore, name: str) -> object:
    assert isinstance(store, PostgresStore)
    with store._pool.connection() as conn:
        row = conn.execute(f"SHOW {name}").fetchone()  # type: ignore[arg-type]
        assert row is not None
        return row[0]


def test_the_store_sessions_carry_a_lock_timeout_and_an_idle_in_transaction_timeout(
    store: PostgresStore,
) -> None:
    assert _setting(store, "lock_timeout") == "5s"
    assert _setting(store, "idle_in_transaction_session_timeout") == "30s"


def test_the_store_sessions_read_times_in_utc_itself(store: PostgresStore) -> None:
    # Not merely an offset of zero: datetime.UTC, which the store then uses as it is (no conversion).
    assert _setting(store, "TimeZone") == "UTC"
    with store._pool.connection() as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None and row[0].tzinfo is UTC


def test_a_row_held_past_the_lock_timeout_fails_the_request_and_writes_nothing(
    pg_dsn: str, pg_schema: str, clock: ManualClock
) -> None:
    store = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, lock_timeout=0.3)
    try:
        admit(store, "e-1", BUSINESS)
        before = snapshot(store)
        holder = _hold_rows(pg_dsn, pg_schema, "e-1")
        try:
            with pytest.raises(StoreError) as caught:
                store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED))
        finally:
            holder.rollback()
            holder.close()
        assert caught.value.code == "row_locked"
        assert "0.3 s" in caught.value.message and "pg_stat_activity" in caught.value.message
        assert "\n" not in caught.value.message
        assert snapshot(store) == before
        decided(store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED)))
    finally:
        store.close()


def test_a_store_session_idle_inside_a_transaction_is_ended_and_lets_go_of_its_locks(
    pg_dsn: str, pg_schema: str, clock: ManualClock
) -> None:
    stalled = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, idle_in_transaction_timeout=0.5)
    store = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, lock_timeout=10)
    try:
        admit(store, "e-1", BUSINESS)
        # A session of the store that took the rows and then stopped (as a SIGSTOPped process would).
        with stalled._pool.connection() as conn:
            conn.execute("BEGIN")
            conn.execute("SELECT 1 FROM objects WHERE object_id = 'e-1' FOR UPDATE")
            time.sleep(2.0)  # four times the timeout: the server ends the session well within it
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                conn.execute("SELECT 1")
        decided(store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED)))
    finally:
        stalled.close()
        store.close()


def test_a_request_whose_session_the_server_ended_fails_as_store_unavailable(
    pg_dsn: str, pg_schema: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker stopped inside a transaction past idle_in_transaction_session_timeout, then resumed:
    # its request fails as one the caller retries (not as an unexpected error), and the next one
    # gets a fresh session.
    store = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, idle_in_transaction_timeout=0.3, pool_size=1)
    try:
        admit(store, "e-1", BUSINESS)
        original = postgres_store._PostgresBackend.lock
        stalls = [True]

        def stalled_lock(self: postgres_store._PostgresBackend, execution_id: str, *, wait: float | None = None) -> None:
            if stalls.pop() if stalls else False:
                self.conn.execute("SELECT 1")  # inside the transaction now
                time.sleep(1.5)  # stopped, then resumed, well past the 0.3 s timeout
            original(self, execution_id, wait=wait)

        monkeypatch.setattr(postgres_store._PostgresBackend, "lock", stalled_lock)
        with pytest.raises(StoreError) as caught:
            store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED))
        assert caught.value.code == "store_unavailable"
        assert "idle-in-transaction" in caught.value.message
        decided(store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED)))
    finally:
        store.close()
