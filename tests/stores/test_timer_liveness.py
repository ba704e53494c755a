"""Due timers are never starved by wait registrations nothing waits on.

What these tests prove, beyond the shipped suite's own timer tests:

- a worker pass with more cancelled timer waiters than ``due_wakes``'
  default limit (100) still fires the live timer behind them, on the
  memory and SQLite stores;
- a SQLite file written before migration 5, where cancelling a waiter left
  its registration open, is migrated so that those registrations are closed
  (``closed_by = 'cancel'``), the one a live waiter waits on stays open, and
  its timer fires;
- the stateful machine's liveness invariant can see: run against a memory
  store that drops the closure (the old behaviour), it fails.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import attrs
import hypothesis
import pytest

from fencekeeper.adapters import examples, sqlite_store
from fencekeeper.adapters.memory import MemoryStore, _MemoryBackend
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import Backend, Evidence, ManualClock, TransactionalStore
from fencekeeper.adapters.testing import stateful
from fencekeeper.adapters.testing.suite import GRANTED, admit, claim, decided, finalize_request, revision, wait_spec
from fencekeeper.adapters.worker import PassReport, Worker
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

DEFAULT_LIMIT = 100


def _waiting(store: TransactionalStore, execution_id: str, spec: p.WaitSpec) -> p.WaitKey:
    admit(store, execution_id)
    claimed, credential = claim(store, "w-setup")
    assert claimed == execution_id
    decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
    return p.WaitKey(execution_id, spec.node_id, spec.attempt_id)


def _stale_and_live(store: TransactionalStore, clock: ManualClock, stale: int) -> p.WaitKey:
    """``stale`` cancelled timer waiters due first, then one live waiter due a second later."""
    start = clock.now()
    for n in range(stale):
        execution_id = f"e-stale-{n:03d}"
        _waiting(store, execution_id, wait_spec(f"a-{n}", event_type=None, wake_at=start))
        decided(store.cancel(p.CancelRequest(execution_id, "b-1", revision(store, execution_id), GRANTED)))
    live = _waiting(store, "e-live", wait_spec("a-live", event_type=None, wake_at=start + timedelta(seconds=1)))
    clock.set(start + timedelta(seconds=1))
    return live


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_pass_fires_the_live_timer_behind_more_stale_registrations_than_its_limit(
    kind: str, tmp_path: Path
) -> None:
    clock = ManualClock()
    store: TransactionalStore = MemoryStore(clock) if kind == "memory" else SQLiteStore(tmp_path / "s.db", clock=clock)
    try:
        live = _stale_and_live(store, clock, DEFAULT_LIMIT + 1)
        worker = Worker(store, "w-1", examples.grants("b-1"), examples.handler())
        report = PassReport()
        worker.fire_due_timers(report)
        assert report.timers_fired == 1
        found = store.read(live.execution_id)
        assert found is not None and found.execution.state == ExecutionState.ELIGIBLE
        assert found.registrations[0].woken_by == "a-live/timer"
        stale = store.read("e-stale-000")
        assert stale is not None and stale.registrations[0].closed_by == "cancel"
    finally:
        store.close()


def _downgrade_to_version_4(path: Path) -> None:
    """Put back what a store written before migration 5 held: no closed_by, and the old indexes."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DROP INDEX wait_registrations_event")
        conn.execute("DROP INDEX wait_registrations_due")
        conn.execute("ALTER TABLE wait_registrations DROP COLUMN closed_by")
        # Migration 2's indexes, exactly as it wrote them.
        conn.execute(
            "CREATE INDEX wait_registrations_event ON wait_registrations (business_id, event_type) "
            "WHERE woken_by IS NULL"
        )
        conn.execute(
            "CREATE INDEX wait_registrations_due ON wait_registrations (wake_at) "
            "WHERE woken_by IS NULL AND wake_at IS NOT NULL"
        )
        # Nothing of the migrations after 4 either.
        for table in (
            "journal_heads", "journal_events", "journal_headers", "outbox", "pruning_mode",
            "operation_transitions", "operation_attempts", "operation_identities", "operations",
        ):
            conn.execute(f"DROP TABLE {table}")
        # Migration 9's pruning triggers on the execution tables, and migration 1's refusals back.
        for trigger in ("objects", "object_revisions", "workflow_dispatch", "transitions", "wait_registrations",
                        "commands"):  # fmt: skip
            conn.execute(f"DROP TRIGGER {trigger}_no_delete")
        for table in ("object_revisions", "transitions", "commands"):
            conn.execute(
                f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table}\n"
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            )
        conn.execute("DELETE FROM schema_migrations WHERE version >= 5")
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_migration_5_closes_registrations_left_open_by_earlier_cancellations(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock)
    live = _stale_and_live(store, clock, 3)
    store.close()
    _downgrade_to_version_4(path)
    conn = sqlite3.connect(path)
    try:
        # What the old code left: every registration open, the cancelled ones too.
        assert conn.execute("SELECT count(*) FROM wait_registrations WHERE woken_by IS NULL").fetchone() == (4,)
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (4,)
    finally:
        conn.close()

    store = SQLiteStore(path, clock=clock)
    try:
        for n in range(3):
            found = store.read(f"e-stale-{n:03d}")
            assert found is not None and found.registrations[0].closed_by == "cancel"
        found = store.read(live.execution_id)
        assert found is not None and found.registrations[0].is_open
        assert store.due_wakes(limit=1) == [live]
        decided(store.fire_timer(live, GRANTED))
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        newest = max(number for number, _, _ in sqlite_store.MIGRATIONS)
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (newest,)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


class _ForgetsToCloseBackend(_MemoryBackend):
    """The memory store as it was: a decision's closure of a registration is dropped on the floor."""

    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        return super().write(attrs.evolve(decision, closes=None), evidence, now)


class _ForgetsToClose(MemoryStore):
    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with self._lock:
            backend = _ForgetsToCloseBackend(self._rows_now())
            yield backend
            self._rows = backend.rows


def test_the_state_machine_sees_a_store_that_leaves_registrations_open() -> None:
    # The proof can see: against a store that keeps the old behaviour (a
    # cancelled waiter's registration stays open), the stateful machine fails
    # on the invariant that a registration is open exactly while waited on.
    settings = hypothesis.settings(stateful.DEFAULT_SETTINGS, max_examples=200, database=None)
    with pytest.raises(AssertionError, match="open registrations"):
        stateful.run_store_state_machine(_ForgetsToClose, settings)
