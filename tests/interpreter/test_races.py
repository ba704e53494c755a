"""Cancellation races claim and wake through the database, with two connections (SQLite and PostgreSQL).

Seed 000, Cancellation: 'It competes transactionally with claim, wake and
resume: the coordination boundary and lease token determine one winner,
and the loser observes the committed state.'
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock, TransactionalStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionEvent, ExecutionState

from .conftest import BUSINESS, OPS, RUNNER, example

COUNT = 30


@pytest.fixture(params=["sqlite", "postgres"])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TransactionalStore, TransactionalStore]]:
    clock = ManualClock()
    stores: list[TransactionalStore]
    if request.param == "sqlite":
        stores = [SQLiteStore(tmp_path / "race.db", clock), SQLiteStore(tmp_path / "race.db", clock)]
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        stores = [PostgresStore(dsn, schema=schema, clock=clock, pool_size=1) for _ in range(2)]
    yield stores[0], stores[1]
    for store in stores:
        store.close()


def _race(*actions: Callable[[], None]) -> None:
    barrier = threading.Barrier(len(actions))
    errors: list[BaseException] = []

    def run(action: Callable[[], None]) -> None:
        barrier.wait()
        try:
            action()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors


def test_cancel_races_claim_and_exactly_one_wins(two_stores: tuple[TransactionalStore, TransactionalStore]) -> None:
    a, b = two_stores
    policy = examples.grants(BUSINESS, RUNNER, OPS)
    service.register(a, example("refund_needs_reconciliation"), BUSINESS, RUNNER, policy)
    ids = [f"x-{n:02d}" for n in range(COUNT)]
    for execution_id in ids:
        service.run(a, policy, business_id=BUSINESS, principal_id=RUNNER, definition_id="refund",
                    input={"payment_id": "p", "amount": 1}, execution_id=execution_id)
    claimed: list[str] = []
    cancelled: list[str] = []
    refused: list[str] = []

    def claim_all() -> None:
        for n in range(COUNT):
            outcome = a.claim_next(p.ClaimRequest("w-1", f"tok-{n}", timedelta(seconds=60)))
            if isinstance(outcome, p.Decision) and outcome.execution is not None:
                claimed.append(outcome.execution.execution_id)

    def cancel_all() -> None:
        for execution_id in ids:
            outcome = service.cancel(b, policy, business_id=BUSINESS, principal_id=OPS, execution_id=execution_id)
            (cancelled if isinstance(outcome, p.Decision) else refused).append(execution_id)

    _race(claim_all, cancel_all)
    assert set(claimed).isdisjoint(cancelled)
    assert sorted(claimed + cancelled) == ids  # every execution has exactly one winner
    assert sorted(refused) == sorted(claimed)  # and the loser saw the committed state
    for execution_id in ids:
        view = a.read(execution_id)
        assert view is not None
        want = ExecutionState.RUNNING if execution_id in claimed else ExecutionState.CANCELLED
        assert view.execution.state == want


def test_cancel_races_wake_and_no_cancelled_execution_is_woken(
    two_stores: tuple[TransactionalStore, TransactionalStore],
) -> None:
    a, b = two_stores
    policy = examples.grants(BUSINESS, RUNNER, OPS)
    service.register(a, example("payment_with_timeout"), BUSINESS, RUNNER, policy)
    ids = [f"x-{n:02d}" for n in range(COUNT)]
    for execution_id in ids:
        service.run(a, policy, business_id=BUSINESS, principal_id=RUNNER, definition_id="payment-with-timeout",
                    input={"order_id": f"o-{execution_id}", "amount": 1}, execution_id=execution_id)
    Worker(a, "w-1", policy, examples.handler()).run_pass()
    woken: list[str] = []

    def publish_all() -> None:
        for execution_id in ids:
            result = service.publish(a, policy, business_id=BUSINESS, principal_id=RUNNER,
                                     event_type="payment.received", correlation={"order_id": f"o-{execution_id}"},
                                     payload={"paid": 1})
            woken.extend(result.woken)

    cancel_refused: dict[str, p.RefusalCode] = {}

    def cancel_all() -> None:
        for execution_id in reversed(ids):
            outcome = service.cancel(b, policy, business_id=BUSINESS, principal_id=OPS, execution_id=execution_id)
            if isinstance(outcome, p.Refusal):
                cancel_refused[execution_id] = outcome.code

    _race(publish_all, cancel_all)
    for execution_id in ids:
        view = a.read(execution_id)
        assert view is not None
        events = [r.event for r in view.history]
        [registration] = view.registrations
        if execution_id in woken:
            # The wake won: it committed first.  Cancellation then either met the
            # eligible execution and cancelled it, or had read the waiting revision
            # and was refused as stale: the loser observes the committed state.
            assert registration.woken_by is not None
            if execution_id in cancel_refused:
                assert cancel_refused[execution_id] == p.RefusalCode.STALE_REVISION
                assert view.execution.state == ExecutionState.ELIGIBLE
            else:
                assert events.index(ExecutionEvent.WAKE) < events.index(ExecutionEvent.CANCEL)
                assert view.execution.state == ExecutionState.CANCELLED
        else:
            # Cancellation won: the Event is kept as history and woke nothing.
            assert execution_id not in cancel_refused
            assert registration.woken_by is None and ExecutionEvent.WAKE not in events
            assert view.execution.state == ExecutionState.CANCELLED
