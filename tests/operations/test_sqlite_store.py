"""The operation store suite and the service state machine against the SQLite operation store."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.testing.operations_suite import (
    OperationStoreTests,
    OpsStoreFactory,
)


def factory_in(directory: Path) -> OpsStoreFactory:
    names = itertools.count()
    return lambda clock: SQLiteOperationStore(directory / f"ops-{next(names)}.db", clock)


class TestSQLiteOperationStore(OperationStoreTests):
    state_machine_examples = 10

    @pytest.fixture
    def ops_store_factory(self, tmp_path: Path) -> OpsStoreFactory:
        return factory_in(tmp_path)


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
