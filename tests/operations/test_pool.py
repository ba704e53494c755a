"""``OperationWorkerPool``: durable-operation workers in threads of a Python program, as ``fencekeeper op worker`` runs them.

The command line runs this same loop (tests/cli/test_op_worker_*.py run it
in real processes, store outages and signals included); these tests hold
what a program that starts a pool itself relies on: it drains, it wakes
when poked or notified, it waits a store out and gives up on anything
else, stopping every worker, and it refuses settings it cannot run with.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.pool import OperationWorkerPool
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableOperationError, DurableOperationService, PrincipalReference
from fencekeeper.adapters.operations.worker import DurableOperationWorker, WorkReport
from fencekeeper.adapters.store import ManualClock, StoreError, SystemClock
from fencekeeper.adapters.testing.operations_suite import TENANT, World, accounts, open_accounts

WOKEN_WITHIN = 15.0
"""Far inside the 60 s poll of these pools: a report this soon was woken, not polled for."""


@pytest.fixture
def world() -> Iterator[World]:
    store = MemoryOperationStore(SystemClock())
    world = World(store, ManualClock())
    open_accounts(store, {"acc-1": 1_000, "acc-2": 0})
    yield world


def _workers(world: World, count: int) -> list[DurableOperationWorker]:
    return [world.worker(f"w-{n}") for n in range(1, count + 1)]


def _until(condition: Any, seconds: float = WOKEN_WITHIN) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        time.sleep(0.01)


def test_an_until_idle_pool_drains_every_due_operation_once(world: World) -> None:
    submitted = {world.transfer(f"k-{n}", amount=n + 1) for n in range(12)}
    told: list[tuple[str, str]] = []
    pool = OperationWorkerPool(
        _workers(world, 3), until_idle=True, on_report=lambda worker, report: told.append((worker.worker_id, report.operation_id))
    )
    with pool:
        assert pool.join(60)
        assert not pool.stopping  # it ran out of work; nobody asked it to stop
    assert sorted(r.operation_id for r in pool.reports) == sorted(submitted)
    assert {r.outcome for r in pool.reports} == {"succeeded"} and pool.errors == []
    assert sorted(operation_id for _, operation_id in told) == sorted(submitted)
    assert {worker for worker, _ in told} <= {"w-1", "w-2", "w-3"}
    assert accounts(world.store) == {"acc-1": 1_000 - sum(range(1, 13)), "acc-2": sum(range(1, 13))}


def test_an_idle_pool_is_woken_by_a_poke_and_stops_when_asked(world: World) -> None:
    pool = OperationWorkerPool(_workers(world, 2), poll=60).start()
    try:
        time.sleep(0.2)  # both workers found nothing and wait out their 60 s poll
        operation_id = world.transfer("k-late")
        pool.poke()
        _until(lambda: any(r.operation_id == operation_id for r in pool.reports))
    finally:
        assert pool.stop(timeout=10)
    assert pool.stopping and not pool.running
    assert [r.outcome for r in pool.reports] == ["succeeded"]


class _Flaky:
    """The operation store, failing its first ``failures`` claims (a pass's first request) with ``code``, nothing claimed."""

    def __init__(self, store: MemoryOperationStore, failures: int, code: str = "store_unavailable") -> None:
        self._store = store
        self._failures = failures
        self._code = code

    def claim_next(self, *args: Any, **kwargs: Any) -> Any:
        if self._failures > 0:
            self._failures -= 1
            raise StoreError(self._code, f"PostgreSQL connection failed: {self._code} (injected)")
        return self._store.claim_next(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_store_failure_that_may_pass_is_waited_out_and_said(world: World) -> None:
    operation_id = world.transfer("k-1")
    flaky = _Flaky(world.store, failures=2)  # type: ignore[arg-type]
    worker = DurableOperationWorker(flaky, world.actions, world.resolvers, tenant=TENANT, worker_id="w-1")  # type: ignore[arg-type]
    failed: list[int] = []
    answered: list[int] = []
    pool = OperationWorkerPool(
        [worker], until_idle=True, on_store_failed=lambda: failed.append(1), on_store_answered=answered.append
    )
    with pool:
        assert pool.join(30)
    assert [r.operation_id for r in pool.reports] == [operation_id] and pool.errors == []
    assert len(failed) == 2
    # The first request through tells the two failures before it; the ones after tell none.
    assert answered[0] == 2 and set(answered[1:]) <= {0}, answered


def test_any_other_error_stops_every_worker_and_is_listed(world: World) -> None:
    for n in range(4):
        world.transfer(f"k-{n}")
    broken = _Flaky(world.store, failures=1, code="schema_altered")  # type: ignore[arg-type]
    workers = [
        DurableOperationWorker(broken, world.actions, world.resolvers, tenant=TENANT, worker_id="w-1"),  # type: ignore[arg-type]
        world.worker("w-2"),
    ]
    pool = OperationWorkerPool(workers, poll=60)
    with pool:
        assert pool.join(30)  # w-1's error stopped w-2 too, idle or not
    assert pool.stopping and len(pool.errors) == 1
    assert pool.errors[0].startswith("w-1: PostgreSQL connection failed: schema_altered") and "[schema_altered]" in pool.errors[0]


def test_a_report_callback_that_raises_stops_the_pool_and_says_so(world: World) -> None:
    world.transfer("k-1")

    def tell(worker: DurableOperationWorker, report: WorkReport) -> None:
        raise BrokenPipeError("stdout is closed")

    pool = OperationWorkerPool(_workers(world, 1), poll=60, on_report=tell)
    with pool:
        assert pool.join(30)
    assert len(pool.reports) == 1 and pool.reports[0].outcome == "succeeded"
    assert pool.errors == ["w-1: on_report: BrokenPipeError: stdout is closed"]


@pytest.mark.parametrize("poll", [0, -1, math.nan, math.inf, 86_401, True, "1"])
def test_a_poll_it_cannot_wait_is_refused_naming_it(world: World, poll: Any) -> None:
    with pytest.raises(DurableOperationError) as raised:
        OperationWorkerPool(_workers(world, 1), poll=poll)
    assert raised.value.code == "invalid_request" and raised.value.field == "poll", raised.value


def test_a_pool_of_no_workers_or_started_twice_is_refused(world: World) -> None:
    with pytest.raises(DurableOperationError) as raised:
        OperationWorkerPool([])
    assert raised.value.field == "workers"
    with OperationWorkerPool(_workers(world, 1), until_idle=True) as pool:
        with pytest.raises(DurableOperationError) as again:
            pool.start()
        assert again.value.field == "pool"


def test_on_postgresql_a_submission_wakes_an_idle_pool(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=3)
    try:
        examples.prepare(store)
        actions, resolvers = examples.registry(), examples.resolvers()
        service = DurableOperationService(store, actions, resolvers)
        workers = [DurableOperationWorker(store, actions, resolvers, tenant="default", worker_id=f"w-{n}") for n in (1, 2)]
        with OperationWorkerPool(workers, poll=60) as pool:
            time.sleep(0.5)  # listening, and both workers idle for 60 s
            for n in range(2):
                operation_id = service.submit(
                    tenant="default", principal=PrincipalReference("users", 1, "alice"), action="transfer",
                    input={"from": "acc-1", "to": "acc-2", "amount": 5}, client_key=f"k-{n}",
                ).operation_id  # fmt: skip
                _until(lambda: any(r.operation_id == operation_id for r in pool.reports))  # noqa: B023
        assert [r.outcome for r in pool.reports] == ["succeeded", "succeeded"] and pool.errors == []
    finally:
        store.close()
