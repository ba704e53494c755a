"""The due-timer lookup is paced while the queue is busy, and a due timer is never starved by work.

What these tests prove, for ``Worker.run_pass`` with one claim a pass (as
``fencekeeper worker`` runs it), on SQLite with a hand-moved process clock:

- while every pass finds work, the lookup is skipped for less than
  ``timer_interval`` and made once it has passed, even though the queue is
  still busy: a due timer waits at most that long behind a stream of work;
- with the process clock standing still (the interval never passes), the
  pass that finds the queue empty looks before it ends and fires the timer,
  so a pass that reports nothing claimed and no timer fired has looked.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.roundtrips import ONE_NODE
from fencekeeper.adapters.testing.suite import admit, claim, decided, finalize_request, wait_spec
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState

BUSINESS = "b-1"
PRINCIPAL = "user:operator"
WORK = 5



def _timer_and_work(store: SQLiteStore, clock: ManualClock) -> None:
    """A waiter whose timer is due a second from now, then ``WORK`` one-node executions queued."""
    admit(store, "e-timer", BUSINESS)
    claimed, credential = claim(store, "w-setup")
    assert claimed == "e-timer"
    spec = wait_spec("a-timer", event_type=None, wake_at=clock.now() + timedelta(seconds=1))
    decided(store.finalize(finalize_request(store, "e-timer", credential, ExecutionState.WAITING, wait=spec)))
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(ONE_NODE), BUSINESS, PRINCIPAL, policy)
    for _ in range(WORK):
        assert isinstance(
            service.run(store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="one-node", input={}),
            p.Decision,
        )


def _state(store: SQLiteStore, execution_id: str) -> ExecutionState:
    view = store.read(execution_id)
    assert view is not None
    return view.execution.state


def test_a_busy_queue_delays_the_timer_lookup_by_at_most_the_interval(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "s.db", clock=clock)
    try:
        _timer_and_work(store, clock)
        process = [0.0]
        worker = Worker(
            store, "w-1", examples.grants(BUSINESS, PRINCIPAL), examples.handler(), business_id=BUSINESS,
            timer_interval=1.0, monotonic=lambda: process[0],
        )
        first = worker.run_pass(max_claims=1)  # looks (nothing due yet), claims one: the queue is busy
        assert first.timers_fired == 0 and len(first.claimed) == 1
        clock.advance(timedelta(seconds=1))  # the timer is due now
        process[0] = 0.5
        skipped = worker.run_pass(max_claims=1)
        assert skipped.timers_fired == 0 and len(skipped.claimed) == 1
        assert _state(store, "e-timer") == ExecutionState.WAITING
        process[0] = 1.0  # the interval has passed; work is still queued
        looked = worker.run_pass(max_claims=1)
        assert looked.timers_fired == 1 and len(looked.claimed) == 1
        assert _state(store, "e-timer") == ExecutionState.ELIGIBLE
    finally:
        store.close()


def test_the_pass_that_finds_the_queue_empty_looks_for_timers(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SQLiteStore(tmp_path / "s.db", clock=clock)
    try:
        _timer_and_work(store, clock)
        worker = Worker(
            store, "w-1", examples.grants(BUSINESS, PRINCIPAL), examples.handler(), business_id=BUSINESS,
            monotonic=lambda: 0.0,  # the interval never passes
        )
        assert len(worker.run_pass(max_claims=1).claimed) == 1
        clock.advance(timedelta(seconds=1))
        reports = [worker.run_pass(max_claims=1) for _ in range(WORK)]
        # The four passes that still found work did not look; the one that found the queue empty did.
        assert [len(r.claimed) for r in reports] == [1, 1, 1, 1, 0]
        assert [r.timers_fired for r in reports] == [0, 0, 0, 0, 1]
        assert _state(store, "e-timer") == ExecutionState.ELIGIBLE
    finally:
        store.close()
