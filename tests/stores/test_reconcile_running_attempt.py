"""service.reconcile settles a Command whose attempt a quarantine left running.

The quarantine sweep (service.quarantine_expired) hands the store the
interrupted visit's attempt as a review item with its decision
(reconciliation_required).  A quarantine decided through the store itself
(``TransactionalStore.quarantine`` or ``recover``, which take evidence but
need none: the conformance suite quarantines that way) moves the execution
just the same and leaves the attempt ``running``.  ``reconcile`` then makes it
the review item the sweep would have made before it records the answer; without
that, the attempt machine has no move from running to completed, and the
Command could never be settled.  On every store.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from fencekeeper.adapters import service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.ports import WORKFLOW_RECONCILE
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock, TransactionalStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.attempts import STEP_ATTEMPT
from fencekeeper.kernel.machines import ExecutionState
from tests.stores.test_worker_interrupted import BUSINESS, DEFINITION, POLICY, PRINCIPAL, Handler

LEASE = timedelta(seconds=30)


class Unanswered(Handler):
    """The Command ran, and the worker died before its result was committed: no answer to record."""

    def execute(self, command: i.Command) -> i.CommandResult:
        self.executed.append(command.operation)
        raise _Died


class _Died(BaseException):
    pass


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TransactionalStore, ManualClock]]:
    clock = ManualClock()
    opened: TransactionalStore
    if request.param == "memory":
        opened = MemoryStore(clock)
    elif request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "store.db", clock)
    else:
        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

        opened = PostgresStore(request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"), clock=clock)
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    try:
        yield opened, clock
    finally:
        opened.close()


def attempt_states(store: TransactionalStore) -> list[str]:
    view = store.read("x-1")
    assert view is not None
    return [e.state for e in view.evidence if e.kind == STEP_ATTEMPT]


def test_a_command_whose_attempt_a_store_quarantine_left_running_is_settled(
    store: tuple[TransactionalStore, ManualClock],
) -> None:
    opened, clock = store
    handler = Unanswered()
    with pytest.raises(_Died):
        Worker(opened, "w-1", POLICY, handler, lease=LEASE).run_pass()
    assert handler.executed == ["order.first"] and attempt_states(opened) == ["running"]
    clock.advance(LEASE)
    view = opened.read("x-1")
    assert view is not None
    authority = POLICY.check(PRINCIPAL, BUSINESS, WORKFLOW_RECONCILE, (("x-1", view.execution.revision),))
    quarantined = opened.quarantine(
        p.RecoveryRequest(
            command_id="q-direct", kind=p.RecoveryKind.QUARANTINE_EXPIRED, execution_id="x-1", business_id=BUSINESS,
            expected_revision=view.execution.revision, actor_id=PRINCIPAL, authority=authority,
        )
    )  # fmt: skip
    assert isinstance(quarantined, p.Decision)
    assert attempt_states(opened) == ["running"], "the store's own quarantine carries no attempt"
    steps = view.dispatch.step_count

    reconciled = service.reconcile(
        opened, POLICY, Handler(),  # its reconcile answers: applied
        business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1",
    )  # fmt: skip
    assert isinstance(reconciled.outcome, p.Decision), reconciled.outcome
    assert attempt_states(opened) == ["completed"]
    view = opened.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert [e.state for e in view.evidence if e.kind == i.COMMAND] == ["succeeded"]
    # Counted at its settlement, as the sweep's review item is: its worker died before the step.
    assert view.dispatch.step_count == steps + 1
    revisions = [e.state for e in view.evidence_revisions if e.kind == STEP_ATTEMPT]
    assert revisions[-2:] == ["reconciliation_required", "completed"], "the review item is recorded, then settled"
    outcome = service.resume(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", at_node="second",
        rationale="order.first was applied",
    )  # fmt: skip
    assert isinstance(outcome, p.Decision)
    done = Handler()
    worker = Worker(opened, "w-2", POLICY, done, lease=LEASE)
    while worker.run_pass().claimed:
        pass
    assert done.executed == ["order.second"], "the settled Command is not sent again"
    view = opened.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.SUCCEEDED
