"""The operation store suite and the service state machine against the SQLite operation store."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import (
    OperationStoreTests,
    OpsStoreFactory,
    World,
    check_an_older_intent_is_reconciled_not_resent,
    leave_an_unanswered_and_a_succeeded_capture,
    run_operation_state_machine,
)


def factory_in(directory: Path) -> OpsStoreFactory:
    names = itertools.count()
    return lambda clock: SQLiteOperationStore(directory / f"ops-{next(names)}.db", clock)


class TestSQLiteOperationStore(OperationStoreTests):
    @pytest.fixture
    def ops_store_factory(self, tmp_path: Path) -> OpsStoreFactory:
        return factory_in(tmp_path)


def test_service_state_machine_on_sqlite(tmp_path: Path) -> None:
    run_operation_state_machine(factory_in(tmp_path), max_examples=10)


def test_migration_10_leaves_an_older_intent_unsettled_for_good(tmp_path: Path) -> None:
    import sqlite3  # noqa: PLC0415

    path, clock = tmp_path / "older.db", ManualClock()
    store = SQLiteOperationStore(path, clock)
    crashed, succeeded = leave_an_unanswered_and_a_succeeded_capture(World(store, clock))
    store.close()
    # What a file at version 9 held: intents, and nothing said whether they were answered.
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ALTER TABLE operations DROP COLUMN effect_unsettled_since")
        conn.execute("DELETE FROM schema_migrations WHERE version >= 10")
    finally:
        conn.close()
    store = SQLiteOperationStore(path, clock)
    try:
        check_an_older_intent_is_reconciled_not_resent(World(store, clock), crashed, succeeded)
    finally:
        store.close()


def test_application_tables_in_the_file_are_the_applications_but_our_tables_stay_ours(tmp_path: Path) -> None:
    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.sqlite_store import SQLiteStore  # noqa: PLC0415
    from fencekeeper.adapters.store import StoreError  # noqa: PLC0415

    path = tmp_path / "shared.db"
    store = SQLiteOperationStore(path)
    examples.prepare(store)
    store.application_execute("CREATE INDEX app_accounts_balance ON app_accounts (balance)")
    store.close()
    SQLiteStore(path).close()  # the application's tables and indexes are not an alteration
    SQLiteOperationStore(path).close()
    import sqlite3  # noqa: PLC0415

    conn = sqlite3.connect(path)
    conn.execute("CREATE INDEX by_hand ON operations (tenant)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError) as raised:
        SQLiteOperationStore(path)
    assert raised.value.code == "schema_altered"
