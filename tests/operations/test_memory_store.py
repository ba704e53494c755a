"""The operation store suite and the service state machine, against the in-memory reference store."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.store import ManualClock, SystemClock
from fencekeeper.adapters.testing.operations_suite import (
    ALICE,
    TENANT,
    OperationStoreTests,
    OpsStoreFactory,
    World,
    run_operation_state_machine,
)


class TestMemoryOperationStore(OperationStoreTests):
    @pytest.fixture
    def ops_store_factory(self) -> OpsStoreFactory:
        return MemoryOperationStore


def test_service_state_machine_on_memory() -> None:
    run_operation_state_machine(MemoryOperationStore, max_examples=40)



def test_a_long_external_action_keeps_its_lease_by_heartbeats() -> None:
    world = World(MemoryOperationStore(SystemClock()), ManualClock())
    original = world.provider.capture

    def slow_capture(key: str, amount: int) -> str:
        time.sleep(0.5)  # longer than the lease: only heartbeats keep it
        return original(key, amount)

    world.provider.capture = slow_capture  # type: ignore[method-assign]
    op_id = world.service.submit(
        tenant=TENANT, principal=ALICE, action="capture_unapproved", input={"order": "o-1", "amount": 1},
        client_key="slow",
    ).operation_id
    worker = DurableOperationWorker(
        world.store, world.actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=timedelta(milliseconds=300)
    )
    report = worker.run_once()
    assert report is not None and report.outcome == "succeeded", report
    assert any(line.event == "heartbeat" for line in world.service.history(op_id))
