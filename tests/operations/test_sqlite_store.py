"""The operation store suite and the service state machine against the SQLite operation store."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.testing.operations_suite import (
    OperationStoreTests,
    OpsStoreFactory,
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
