"""Liveness on PostgreSQL: timers that never starve, sweeps that never block or crash.

What these tests prove, beyond the shipped suite:

- a schema written before migration 6, where cancelling a waiter left its
  registration open, is migrated so that those registrations are closed and
  the live waiter's timer is due and fires;
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from fencekeeper.adapters.postgres_store import PostgresStore, migrate
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.suite import GRANTED, admit, claim, decided, finalize_request, revision, wait_spec
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState


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
        "DELETE FROM schema_migrations WHERE version = 6",
    )
    assert _sql(pg_dsn, pg_schema, "SELECT count(*) FROM wait_registrations WHERE woken_by IS NULL") == [(4,)]
    assert migrate(pg_dsn, pg_schema) == [6]
    closed = _sql(pg_dsn, pg_schema, "SELECT execution_id, closed_by FROM wait_registrations ORDER BY execution_id")
    assert closed == [("e-live", None), ("e-stale-0", "cancel"), ("e-stale-1", "cancel"), ("e-stale-2", "cancel")]
    reopened = PostgresStore(pg_dsn, schema=pg_schema, clock=clock)
    try:
        clock.set(start + timedelta(seconds=1))
        assert reopened.due_wakes(limit=1) == [live]
        decided(reopened.fire_timer(live, GRANTED))
    finally:
        reopened.close()
