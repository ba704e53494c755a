"""The operation store suite and the service state machine against the SQLite operation store."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import (
    OpsStoreFactory,
    SqlOperationStoreTests,
    World,
    check_an_older_intent_is_reconciled_not_resent,
    check_identities_after_the_migration,
    leave_an_unanswered_and_a_succeeded_capture,
    leave_identities_keyed_by_the_whole_reference,
    open_accounts,
)


def factory_in(directory: Path) -> OpsStoreFactory:
    names = itertools.count()
    return lambda clock: SQLiteOperationStore(directory / f"ops-{next(names)}.db", clock)


class TestSQLiteOperationStore(SqlOperationStoreTests):
    state_machine_examples = 10

    @pytest.fixture
    def ops_store_factory(self, tmp_path: Path) -> OpsStoreFactory:
        return factory_in(tmp_path)


def test_migration_10_leaves_an_older_intent_unsettled_for_good(tmp_path: Path) -> None:
    import sqlite3  # noqa: PLC0415

    path, clock = tmp_path / "older.db", ManualClock()
    store = SQLiteOperationStore(path, clock)
    crashed, succeeded = leave_an_unanswered_and_a_succeeded_capture(World(store, clock))
    store.close()
    # What a file at version 9 held: intents, and nothing said whether they were answered
    # (and nothing of the migrations after 10).
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ALTER TABLE operations DROP COLUMN effect_unsettled_since")
        conn.execute("DROP TRIGGER journal_heads_move_forward")
        conn.execute("ALTER TABLE operation_attempts DROP COLUMN claim_token")
        conn.execute("DELETE FROM schema_migrations WHERE version >= 10")  # 12 changes rows only: it runs again
    finally:
        conn.close()
    store = SQLiteOperationStore(path, clock)
    try:
        check_an_older_intent_is_reconciled_not_resent(World(store, clock), crashed, succeeded)
    finally:
        store.close()


def test_migration_12_keys_identities_by_the_stable_reference_and_loses_nothing(tmp_path: Path) -> None:
    import sqlite3  # noqa: PLC0415

    path, clock = tmp_path / "keys.db", ManualClock()
    store = SQLiteOperationStore(path, clock)
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    before = leave_identities_keyed_by_the_whole_reference(World(store, clock))
    store.close()
    # What a file at version 11 held: identities keyed by the whole reference, two of them one
    # principal's under two versions of its resolver.
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in before.statements:
            conn.execute(statement)
        conn.execute("ALTER TABLE operation_attempts DROP COLUMN claim_token")
        conn.execute("DELETE FROM schema_migrations WHERE version >= 12")
    finally:
        conn.close()
    store = SQLiteOperationStore(path, clock)
    migrated = store.application_execute("SELECT client_key, principal, operation_id FROM operation_identities")
    assert store.application_execute("SELECT max(version) FROM schema_migrations") == [(13,)]
    store.close()
    # Run again (its record lost), it changes nothing.
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ALTER TABLE operation_attempts DROP COLUMN claim_token")  # 13 would add it again
        conn.execute("DELETE FROM schema_migrations WHERE version >= 12")
    finally:
        conn.close()
    store = SQLiteOperationStore(path, clock)
    try:
        again = store.application_execute("SELECT client_key, principal, operation_id FROM operation_identities")
        assert sorted(again) == sorted(migrated)
        check_identities_after_the_migration(World(store, clock), before)
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


_HISTORY = ("operation_transitions", "outbox", "operation_attempts", "operation_identities")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE operations SET state = 'succeeded'",
        "DELETE FROM operation_attempts",
        "INSERT INTO operation_transitions SELECT * FROM operation_transitions",
        "UPDATE operation_identities SET operation_id = 'elsewhere'",
        "DELETE FROM outbox",
        "INSERT INTO pruning_mode (holder) VALUES ('me')",
        "DELETE FROM pruning_mode",  # the very text of a store statement, compiled (and cached) before
        "DROP TABLE operation_transitions",
        "ALTER TABLE operations ADD COLUMN extra TEXT",
        "CREATE TRIGGER sneaky AFTER UPDATE ON operations BEGIN SELECT 1; END",
        "CREATE TEMP TABLE operations (operation_id TEXT)",
        "PRAGMA foreign_keys = OFF",
        "ATTACH DATABASE ':memory:' AS other",
        "UPDATE objects SET state = 'failed'",
    ],
)
def test_an_atomic_action_cannot_write_the_stores_own_tables(tmp_path: Path, statement: str) -> None:
    from typing import Any  # noqa: PLC0415

    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.operations.ports import GuardedContext, StatementRefused  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import DurableAction, DurableActionRegistry  # noqa: PLC0415
    from fencekeeper.adapters.operations.worker import DurableOperationWorker  # noqa: PLC0415
    from fencekeeper.adapters.store import ManualClock  # noqa: PLC0415
    from fencekeeper.adapters.testing.operations_suite import LEASE, TENANT, World, accounts, open_accounts  # noqa: PLC0415
    from fencekeeper.kernel.operations import EffectClass  # noqa: PLC0415

    clock = ManualClock()
    store = SQLiteOperationStore(tmp_path / "ops.db", clock)
    try:
        open_accounts(store, {"acc-1": 100, "acc-2": 0})
        world = World(store, clock)
        op_id = world.transfer("k1", 10)
        assert store.prune_identities() == 0  # the store's own statements, compiled unjudged and cached
        refused: list[str] = []

        def meddle(context: GuardedContext, value: Any) -> Any:
            result = examples.transfer(context, value)
            try:
                context.execute(statement)
            except StatementRefused as exc:
                refused.append(str(exc))
                raise
            return result

        actions = DurableActionRegistry((DurableAction("transfer", 1, EffectClass.ATOMIC, meddle),))
        worker = DurableOperationWorker(store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=LEASE)
        report = worker.run_once()
        assert len(refused) == 1, refused
        assert report is not None and report.outcome == "retry"
        assert accounts(store) == {"acc-1": 100, "acc-2": 0}
        record = world.service.get(op_id)
        assert record is not None and [a.error_code for a in record.attempts] == ["handler_error"]
        # The store's own statements still run, and its tables are only what its decisions wrote.
        assert store.application_execute("SELECT count(*) FROM sqlite_temp_master") == [(0,)]
        assert "other" not in {row[1] for row in store.application_execute("PRAGMA database_list")}
        assert store.application_execute("SELECT state, attempt_count FROM operations") == [("admitted", 1)]
        counts = [store.application_execute(f"SELECT count(*) FROM {t}")[0][0] for t in _HISTORY]
        assert counts == [3, 3, 1, 1]
        assert store.application_execute("PRAGMA foreign_keys") == [(1,)]
    finally:
        store.close()
