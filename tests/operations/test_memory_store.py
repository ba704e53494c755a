"""The operation store suite and the service state machine, against the in-memory reference store."""

from __future__ import annotations

import pytest

from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.testing.operations_suite import (
    OperationStoreTests,
    OpsStoreFactory,
    run_operation_state_machine,
)


class TestMemoryOperationStore(OperationStoreTests):
    @pytest.fixture
    def ops_store_factory(self) -> OpsStoreFactory:
        return MemoryOperationStore


def test_service_state_machine_on_memory() -> None:
    run_operation_state_machine(MemoryOperationStore, max_examples=40)
