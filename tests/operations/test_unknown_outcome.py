"""An owner write whose outcome the store could not report: the operation worker takes its Attempt up again.

A connection lost inside a completion, a failure, an external effect's
intent or its answer leaves the worker not knowing whether its transaction
committed.  Before, the worker raised (or, inside an action's run, sent a
``handler_error`` failure instead), its loop waited for the store and
claimed again: the Operation stayed running under the old owner until the
lease expired, and the next claim recorded that Attempt abandoned; on the
last Attempt it ended ``max_attempts_exceeded`` (or
``external_outcome_unknown``) with the action's result in the worker's hand.
Now the next pass reads the Operation first: a write that committed is
reported, one that did not is sent again under the same credential, and an
Operation another owner, an expired lease, a cancellation or a limit holds is
left alone (specs/operations.md, "An owner write of unknown outcome").

What is checked here, on the memory, SQLite and PostgreSQL stores, with one
Attempt allowed: for each owner write of a read-only, an atomic and an
external action, lost before it reaches the store, inside its transaction
(atomic: the action ran, and was rolled back), or after its commit, the
Operation ends ``succeeded`` with the action's result, under its one
Attempt, the action or the provider called once (atomic: its write present
once); and what is left alone is left alone.  A claim whose answer was lost
is found by the worker's id; a renewal the store fails for a moment is
tried again rather than given up.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations import worker as worker_module
from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.ports import GuardedContext, OperationStore, OperationView
from fencekeeper.adapters.operations.service import (
    ActionFailed,
    DurableAction,
    DurableActionRegistry,
    DurableOperationService,
)
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.operations.worker import DurableOperationWorker, WorkReport
from fencekeeper.adapters.store import STOP_TAKE_UP_WAITS, ManualClock, StoreError, SystemClock
from fencekeeper.adapters.testing.operations_suite import (
    ALICE,
    LEASE,
    TENANT,
    World,
    accounts,
    open_accounts,
    transfers,
)
from fencekeeper.kernel import operations as o
from fencekeeper.kernel.machines import OperationState

LOST = "the connection to the store was lost"
ONCE = o.RetryPolicy(maximum_attempts=1)


class Lossy:
    """An operation store whose connection is lost in the ``nth`` call of ``call`` (once).

    ``when``: ``before`` the request reaches the store (nothing written),
    ``inside`` its transaction (an atomic completion: the action runs, then
    the transaction is lost and rolled back), or ``after`` its commit (only
    the answer is lost).  ``down`` more calls of any kind fail the same way
    after it: the store away for a while.
    """

    def __init__(self, inner: OperationStore, call: str, *, nth: int = 1, when: str = "before", down: int = 0) -> None:
        self._inner = inner
        self._call = call
        self._nth = nth
        self._when = when
        self._down_after = down
        self.down = 0
        self.calls: list[str] = []
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._inner, name)
        if not callable(inner):
            return inner

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down > 0:
                self.down -= 1
                raise StoreError("store_unavailable", LOST)
            self.calls.append(name)
            if name != self._call or self.lost or self.calls.count(name) != self._nth:
                return inner(*args, **kwargs)
            self.lost += 1
            self.down = self._down_after
            if self._when == "after":
                inner(*args, **kwargs)
            elif self._when == "inside":
                request, action = args

                def lost_inside(context: GuardedContext) -> str:
                    action(context)
                    raise StoreError("store_unavailable", LOST)

                inner(request, lost_inside)
                raise AssertionError("the transaction was meant to be lost")
            raise StoreError("store_unavailable", LOST)

        return call


class Counted:
    """Handlers that count their calls, for each effect class, allowed one Attempt (``attempts``: more)."""

    def __init__(self, world: World, *, attempts: int = 1, adapter: Any = None) -> None:
        self.calls = 0
        policy = o.RetryPolicy(maximum_attempts=attempts)
        self.adapter = adapter or world.adapter

        def echo(value: Any) -> Any:
            self.calls += 1
            return {"echo": value}

        def transfer(context: GuardedContext, value: Any) -> Any:
            self.calls += 1
            return examples.transfer(context, value)

        self.actions = DurableActionRegistry(
            (
                DurableAction("echo", 1, o.EffectClass.READ_ONLY, echo, policy=policy),
                DurableAction(
                    "move", 1, o.EffectClass.ATOMIC, transfer, normalize=examples.normalize_transfer, policy=policy
                ),
                DurableAction(
                    "capture", 1, o.EffectClass.EXTERNAL, lambda value: value, normalize=examples.normalize_capture,
                    adapter=self.adapter, policy=policy,
                ),
            )
        )  # fmt: skip


INPUTS = {
    "echo": {"n": 1},
    "move": {"from": "acc-1", "to": "acc-2", "amount": 10},
    "capture": {"order": "o-1", "amount": 250},
}


def opened(kind: str, tmp_path: Path, request: pytest.FixtureRequest, clock: ManualClock) -> OperationStore:
    if kind == "memory":
        return MemoryOperationStore(clock)
    if kind == "sqlite":
        return SQLiteOperationStore(tmp_path / "ops.db", clock)
    from fencekeeper.adapters.operations.postgres import PostgresOperationStore  # noqa: PLC0415 - only where PostgreSQL runs

    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    return PostgresOperationStore(dsn, schema=schema, clock=clock, pool_size=2)


@pytest.fixture(autouse=True)
def _no_busy_namesake_left() -> Iterator[None]:
    # A worker a test leaves holding a lost write stays a busy namesake of the process (for its id) until it
    # is collected, and a later test's worker of the same id would then rightly take nothing up.
    yield
    gc.collect()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    clock = ManualClock()
    store = opened(request.param, tmp_path, request, clock)
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    try:
        yield World(store, clock)
    finally:
        store.close()


def submit(world: World, counted: Counted, action: str, key: str = "k1") -> str:
    service = DurableOperationService(world.store, counted.actions, world.resolvers, namespace="shop")
    return service.submit(tenant=TENANT, principal=ALICE, action=action, input=INPUTS[action], client_key=key).operation_id


def worker(world: World, store: Any, counted: Counted, name: str = "w1") -> DurableOperationWorker:
    return DurableOperationWorker(store, counted.actions, world.resolvers, tenant=TENANT, worker_id=name, lease=LEASE)


def drain(run_once: Callable[[], WorkReport | None], *, passes: int = 20) -> tuple[list[WorkReport], int]:
    """Passes until one finds nothing to do, waiting out the store as ``op worker``'s loop does; reports and raises."""
    reports: list[WorkReport] = []
    raised = 0
    for _ in range(passes):
        try:
            report = run_once()
        except StoreError as exc:
            assert (exc.code, exc.message) == ("store_unavailable", LOST)
            raised += 1
            continue
        if report is None:
            return reports, raised
        reports.append(report)
    raise AssertionError("the worker never went idle")


def the_view(world: World, operation_id: str) -> OperationView:
    view = world.store.view(operation_id)
    assert view is not None
    return view


def attempts(view: OperationView) -> list[tuple[int, str, str]]:
    return [(a.number, a.worker_id, a.state.value) for a in view.attempts]


# Every owner write of one Attempt of each effect class, as the worker sends them, and where each can be lost.
WRITES = [
    ("echo", "complete", "before"),
    ("echo", "complete", "after"),
    ("move", "complete", "before"),
    ("move", "complete", "inside"),
    ("move", "complete", "after"),
    ("capture", "record_intent", "before"),
    ("capture", "record_intent", "after"),
    ("capture", "complete", "before"),
    ("capture", "complete", "after"),
]


@pytest.mark.parametrize(("action", "call", "when"), WRITES, ids=["-".join(w) for w in WRITES])
def test_a_lost_owner_write_is_taken_up_and_the_one_attempt_succeeds(
    world: World, action: str, call: str, when: str
) -> None:
    counted = Counted(world)
    op_id = submit(world, counted, action)
    lossy = Lossy(world.store, call, when=when)
    reports, raised = drain(worker(world, lossy, counted).run_once)
    view = the_view(world, op_id)
    assert view.operation.state is OperationState.SUCCEEDED, (view.operation, reports)
    assert (lossy.lost, raised) == (1, 1)
    # Its one Attempt, never abandoned: the write was finished under the credential it was sent with.
    assert attempts(view) == [(1, "w1", "succeeded")]
    assert [(r.operation_id, r.attempt, r.outcome, r.resumed) for r in reports] == [(op_id, 1, "succeeded", True)]
    assert reports[0].detail.startswith("resumed: the store answers again and "), reports[0].detail
    committed = when == "after" and call == "complete"
    assert ("had committed before its answer was lost" in reports[0].detail) is committed, reports[0].detail
    # Nothing was sent again that had committed: a completion once in the history, and the intent once.
    events = [t.event.value for t in view.history if t.event is not None]
    assert events.count("succeed") == 1 and events.count("record_intent") == (action == "capture"), events
    if action == "echo":
        assert counted.calls == 1
        assert view.operation.result == '{"echo":{"n":1}}'
    elif action == "move":
        # Lost inside its transaction, the action ran and was rolled back; it ran again in the new one.
        assert counted.calls == (2 if when == "inside" else 1)
        assert accounts(world.store) == {"acc-1": 90, "acc-2": 10}
        assert transfers(world.store) == {op_id}
    else:
        # The provider was called once, under the operation's one effect id: never asked again for an answer
        # the worker held, and called after an intent whose answer was lost only once that intent was read.
        assert world.provider.calls == [f"{op_id}/effect"]
        assert world.provider.captures == {f"{op_id}/effect": 250}
        assert view.operation.result == f'{{"amount":250,"receipt":"cap-{op_id}/effect"}}'


def test_a_lost_failure_is_sent_again_as_it_was(world: World) -> None:
    counted = Counted(world)

    def declined(value: Any) -> Any:
        counted.calls += 1
        raise ActionFailed("declined", "the account is closed", retryable=False)

    counted.actions = DurableActionRegistry((DurableAction("echo", 1, o.EffectClass.READ_ONLY, declined, policy=ONCE),))
    op_id = submit(world, counted, "echo")
    for when in ("before", "after"):
        if when == "after":
            op_id = submit(world, counted, "echo", key="k2")
        lossy = Lossy(world.store, "fail", when=when)
        reports, raised = drain(worker(world, lossy, counted).run_once)
        assert (lossy.lost, raised) == (1, 1)
        view = the_view(world, op_id)
        assert (view.operation.outcome, view.operation.error_code) == (o.TerminalOutcome.ACTION_FAILED, "declined")
        assert attempts(view) == [(1, "w1", "failed")]
        assert [(r.outcome, r.resumed) for r in reports] == [("action_failed", True)], reports
    assert counted.calls == 2


def test_a_lost_unknown_outcome_is_sent_again_and_the_provider_is_not_asked_twice(world: World) -> None:
    adapter = examples.PaymentCaptureAdapter(world.provider, idempotent=False, reconcilable=False)
    counted = Counted(world, adapter=adapter)
    world.provider.mode = "timeout"
    op_id = submit(world, counted, "capture")
    lossy = Lossy(world.store, "outcome_unknown", when="before")
    reports, raised = drain(worker(world, lossy, counted).run_once)
    assert (lossy.lost, raised) == (1, 1)
    view = the_view(world, op_id)
    assert view.operation.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
    assert attempts(view) == [(1, "w1", "outcome_unknown")]
    assert world.provider.calls == [f"{op_id}/effect"]
    assert [(r.outcome, r.resumed) for r in reports] == [("external_outcome_unknown", True)]


def test_a_lost_renewal_before_a_reconciled_repeat_is_sent_again_then_the_provider_called(world: World) -> None:
    # Attempt 1's call times out and the provider has nothing: attempt 2 reconciles, renews, and performs.
    counted = Counted(world, attempts=2)
    world.provider.mode = "timeout"
    op_id = submit(world, counted, "capture")
    first = worker(world, world.store, counted).run_once()
    assert first is not None and first.outcome == "retry", first
    world.provider.mode = "ok"
    world.clock.advance(timedelta(minutes=1))
    lossy = Lossy(world.store, "heartbeat", when="before")
    reports, raised = drain(worker(world, lossy, counted).run_once)
    assert (lossy.lost, raised) == (1, 1)
    view = the_view(world, op_id)
    assert view.operation.state is OperationState.SUCCEEDED
    assert attempts(view) == [(1, "w1", "failed"), (2, "w1", "succeeded")]
    assert world.provider.calls == [f"{op_id}/effect"] * 2
    assert [(r.outcome, r.resumed) for r in reports] == [("succeeded", True)]
    assert "lease renewal is sent again" in reports[0].detail


def test_a_store_down_for_a_while_is_waited_out_and_the_write_still_taken_up(world: World) -> None:
    counted = Counted(world)
    op_id = submit(world, counted, "echo")
    lossy = Lossy(world.store, "complete", when="after", down=3)
    reports, raised = drain(worker(world, lossy, counted).run_once)
    # The loss, then three passes whose read of the operation failed again, each raising and remembering.
    assert raised == 4
    assert attempts(the_view(world, op_id)) == [(1, "w1", "succeeded")]
    assert [(r.outcome, r.resumed) for r in reports] == [("succeeded", True)]
    assert counted.calls == 1


@pytest.mark.parametrize(("call", "when"), [("claim_next", "after"), ("complete", "before"), ("complete", "after")])
def test_a_stopping_worker_finishes_the_attempt_whose_answer_was_lost_and_claims_nothing(
    world: World, call: str, when: str
) -> None:
    # `op worker` stopped (SIGTERM, Ctrl-C) while its store was away: its last look finishes the Attempt under
    # its lease within a few seconds, rather than leaving it to expire and, at its last Attempt, fail.
    counted = Counted(world)
    op_id = submit(world, counted, "echo")
    other = submit(world, counted, "echo", key="k2")
    lossy = Lossy(world.store, call, when=when, down=2)
    stopping = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        stopping.run_once()
    assert stopping.holds_unfinished()
    slept: list[float] = []
    report = stopping.take_up_before_stop(sleep=slept.append)
    assert slept == [0.2, 0.4], "the two failures after the loss, waited out"
    assert report is not None and (report.outcome, report.resumed) == ("succeeded", True)
    assert not stopping.holds_unfinished()
    claimed, left = (op_id, other) if report.operation_id == op_id else (other, op_id)
    assert attempts(the_view(world, claimed)) == [(1, "w1", "succeeded")] and counted.calls == 1
    # Nothing more: the other due operation is not claimed by a stopping worker.
    assert the_view(world, left).operation.state is OperationState.ADMITTED
    assert stopping.take_up_before_stop(sleep=slept.append) is None


def test_a_stopping_worker_gives_an_outage_a_few_seconds_only(world: World) -> None:
    counted = Counted(world)
    op_id = submit(world, counted, "echo")
    lossy = Lossy(world.store, "complete", when="after", down=1000)
    stopping = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        stopping.run_once()
    slept: list[float] = []
    assert stopping.take_up_before_stop(sleep=slept.append) is None
    assert slept == list(STOP_TAKE_UP_WAITS) and stopping.holds_unfinished()  # left to the ordinary reclaim
    assert attempts(the_view(world, op_id)) == [(1, "w1", "succeeded")], "the lost completion had committed"


def _lost(world: World, counted: Counted, action: str) -> tuple[str, Lossy, DurableOperationWorker]:
    """An operation whose completion was lost before it reached the store: its worker remembers it."""
    op_id = submit(world, counted, action)
    lossy = Lossy(world.store, "complete", when="before")
    lost = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        lost.run_once()
    assert lossy.lost == 1
    return op_id, lossy, lost


def test_a_lease_that_expired_meanwhile_is_left_to_the_ordinary_reclaim(world: World) -> None:
    counted = Counted(world, attempts=2)
    op_id, lossy, lost = _lost(world, counted, "move")
    world.clock.advance(LEASE + timedelta(seconds=1))
    lossy.calls.clear()
    before = the_view(world, op_id)
    lapsed = lost.run_once()
    # Read, found expired, left alone, and said: nothing written.
    assert lossy.calls == ["view", "now"], lossy.calls
    assert the_view(world, op_id) == before
    assert lapsed is not None and (lapsed.attempt, lapsed.outcome, lapsed.resumed) == (1, "lease_expired", True)
    assert "attempt 1's lease ran out" in lapsed.detail and "the next claim replaces the attempt" in lapsed.detail
    # The ordinary reclaim then replaces the expired Attempt.
    report = lost.run_once()
    assert report is not None and (report.attempt, report.outcome, report.resumed) == (2, "succeeded", False)
    view = the_view(world, op_id)
    assert attempts(view) == [(1, "w1", "abandoned"), (2, "w1", "succeeded")]
    assert accounts(world.store) == {"acc-1": 90, "acc-2": 10}


def test_an_operation_another_owner_holds_by_then_is_left_alone(world: World) -> None:
    counted = Counted(world, attempts=2)
    op_id, lossy, lost = _lost(world, counted, "move")
    world.clock.advance(LEASE + timedelta(seconds=1))
    other = world.store.claim_next(TENANT, "w2", LEASE)
    assert isinstance(other, o.Decision) and other.credential is not None
    before = the_view(world, op_id)
    lossy.calls.clear()
    assert lost.run_once() is None
    assert the_view(world, op_id) == before
    assert lossy.calls == ["view", "now", "claim_next"], lossy.calls
    assert attempts(before) == [(1, "w1", "abandoned"), (2, "w2", "running")]
    assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}


def test_an_operation_cancelled_meanwhile_is_left_alone(world: World) -> None:
    counted = Counted(world)
    op_id, _, lost = _lost(world, counted, "echo")
    service = DurableOperationService(world.store, counted.actions, world.resolvers, namespace="shop")
    service.cancel(op_id, principal=ALICE, tenant=TENANT)
    before = the_view(world, op_id)
    assert lost.run_once() is None
    assert the_view(world, op_id) == before
    assert before.operation.outcome is o.TerminalOutcome.CANCELLED
    assert attempts(before) == [(1, "w1", "cancelled")]


# A claim names no operation before it commits: the worker asks the store what runs under its id.
CLAIMS = [
    ("echo", "claim_next", "before"),
    ("echo", "claim_next", "after"),
    ("move", "claim_next", "after"),
    ("capture", "claim_next", "after"),
    # The claim's answer came, and the read of the input before the first write failed: nothing was begun.
    ("echo", "input_value", "before"),
]


@pytest.mark.parametrize(("action", "call", "when"), CLAIMS, ids=["-".join(c) for c in CLAIMS])
def test_a_claim_whose_answer_was_lost_is_found_and_its_one_attempt_runs(
    world: World, action: str, call: str, when: str
) -> None:
    counted = Counted(world)
    op_id = submit(world, counted, action)
    lossy = Lossy(world.store, call, when=when)
    reports, raised = drain(worker(world, lossy, counted).run_once)
    view = the_view(world, op_id)
    assert view.operation.state is OperationState.SUCCEEDED, (view.operation, reports)
    assert (lossy.lost, raised) == (1, 1)
    assert attempts(view) == [(1, "w1", "succeeded")]
    committed = when == "after" or call == "input_value"
    assert [(r.attempt, r.outcome, r.resumed) for r in reports] == [(1, "succeeded", committed)], reports
    if committed:
        assert "attempt 1's claim had committed before its answer was lost" in reports[0].detail, reports[0].detail
    assert counted.calls == (action != "capture")
    assert world.provider.calls == ([f"{op_id}/effect"] if action == "capture" else [])


def test_a_claim_lost_after_its_lease_ran_out_is_left_to_the_ordinary_reclaim(world: World) -> None:
    counted = Counted(world, attempts=2)
    op_id = submit(world, counted, "echo")
    lossy = Lossy(world.store, "claim_next", when="after")
    lost = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        lost.run_once()
    world.clock.advance(LEASE + timedelta(seconds=1))
    lossy.calls.clear()
    report = lost.run_once()
    # Found under this worker's id but expired: not run under that credential; the claim replaced it.
    assert lossy.calls[:4] == ["running_under", "view", "now", "claim_next"], lossy.calls
    assert report is not None and (report.attempt, report.outcome, report.resumed) == (2, "succeeded", False)
    assert attempts(the_view(world, op_id)) == [(1, "w1", "abandoned"), (2, "w1", "succeeded")]
    assert counted.calls == 1


def test_the_stores_say_which_operations_run_under_a_worker(world: World) -> None:
    counted = Counted(world, attempts=2)
    first, second = submit(world, counted, "echo"), submit(world, counted, "echo", key="k2")
    store: Any = world.store
    assert store.running_under(TENANT, "w1") == []
    claimed = [world.store.claim_next(TENANT, name, LEASE) for name in ("w1", "w2")]
    assert all(isinstance(c, o.Decision) for c in claimed)
    mine = [c.operation.operation_id for c in claimed if isinstance(c, o.Decision)]
    assert sorted(mine) == sorted([first, second])
    assert store.running_under(TENANT, "w1") == [mine[0]]
    assert store.running_under(TENANT, "w1", namespace="shop") == [mine[0]]
    assert store.running_under(TENANT, "w1", namespace="elsewhere") == []
    assert store.running_under("tenant-b", "w1") == []
    # Whatever its lease: the worker judges that from the operation as it reads it.
    world.clock.advance(LEASE + timedelta(seconds=1))
    assert store.running_under(TENANT, "w2") == [mine[1]]


def test_a_renewal_the_store_fails_for_a_moment_is_tried_again_and_the_lease_kept() -> None:
    # A read-only action longer than its lease: only renewals keep it.  The first one meets the store away.
    world = World(MemoryOperationStore(SystemClock()), ManualClock())
    renewals: list[str] = []
    heartbeat = world.store.heartbeat

    def lost_once(request: o.HeartbeatRequest) -> o.Outcome:
        renewals.append("lost" if not renewals else "renewed")
        if renewals == ["lost"]:
            raise StoreError("store_unavailable", LOST)
        return heartbeat(request)

    world.store.heartbeat = lost_once  # type: ignore[method-assign]

    def slow(value: Any) -> Any:
        time.sleep(0.5)
        return value

    actions = DurableActionRegistry((DurableAction("slow", 1, o.EffectClass.READ_ONLY, slow, policy=ONCE),))
    service = DurableOperationService(world.store, actions, world.resolvers, namespace="shop")
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="slow", input={"n": 1}, client_key="k").operation_id
    worker = DurableOperationWorker(
        world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=timedelta(milliseconds=300)
    )
    report = worker.run_once()
    # Given up after the first failure, the lease ran out under the action and its completion was refused.
    assert report is not None and (report.outcome, report.resumed) == ("succeeded", False), report
    assert renewals[0] == "lost" and "renewed" in renewals, renewals
    assert attempts(the_view(world, op_id)) == [(1, "w1", "succeeded")]


def test_a_claim_lost_while_a_namesake_of_the_process_is_busy_takes_up_its_own_attempt_only(world: World) -> None:
    # Workers made without an id share the host's and process's: what runs under it may be another one's.  The
    # claim's own token tells which: the lost claim's Attempt is taken up, the namesake's is left to it.
    counted = Counted(world)
    held = submit(world, counted, "echo")
    namesake_store = Lossy(world.store, "complete", when="before")
    namesake = worker(world, namesake_store, counted)
    with pytest.raises(StoreError):
        namesake.run_once()  # it holds `held`, its completion to be taken up
    op_id = submit(world, counted, "echo", key="k2")
    lossy = Lossy(world.store, "claim_next", when="after")
    lost = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        lost.run_once()
    report = lost.run_once()
    assert report is not None and (report.operation_id, report.outcome, report.resumed) == (op_id, "succeeded", True)
    assert "running_under" in lossy.calls and counted.calls == 2
    assert attempts(the_view(world, op_id)) == [(1, "w1", "succeeded")]
    assert attempts(the_view(world, held)) == [(1, "w1", "running")], "the namesake's own, untouched"
    # The namesake still finishes its own.
    report = namesake.run_once()
    assert report is not None and (report.operation_id, report.outcome, report.resumed) == (held, "succeeded", True)
    assert attempts(the_view(world, held)) == [(1, "w1", "succeeded")]


def test_a_claim_lost_before_it_committed_takes_nothing_of_a_namesake_in_another_process(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes under one worker id (replicas given the same --id).  One runs an Attempt; the other's claim
    # is lost before it commits.  Asked what runs under the id, the store would name the first one's Attempt,
    # live and this id's: by its id alone the second took it up and ran its action a second time.  By its claim's
    # token it finds nothing, and claims as usual.
    counted = Counted(world)
    held = submit(world, counted, "echo")
    first = worker(world, Lossy(world.store, "complete", when="before"), counted)
    with pytest.raises(StoreError):
        first.run_once()  # it runs `held` (its completion not yet through)
    # Another process: none of this process's namesakes (the in-process guard) stands in the way.
    monkeypatch.setattr(worker_module, "_namesakes", lambda worker_id: worker_module._Namesakes())
    lossy = Lossy(world.store, "claim_next", when="before")
    second = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        second.run_once()
    assert second.run_once() is None, "nothing was claimed, and nothing of the first's is taken"
    assert "running_under" in lossy.calls and counted.calls == 1
    assert attempts(the_view(world, held)) == [(1, "w1", "running")]
    report = first.run_once()
    assert report is not None and (report.operation_id, report.outcome) == (held, "succeeded")
    assert counted.calls == 1, "its action ran once"


class Told:
    """An adapter that notes each call to the provider in ``said`` (the store's calls, as a Lossy store notes them)."""

    def __init__(self, inner: examples.PaymentCaptureAdapter, said: list[str]) -> None:
        self.inner = inner
        self.said = said
        self.idempotent = inner.idempotent

    def perform(self, effect_id: str, payload: Any) -> Any:
        self.said.append("perform")
        return self.inner.perform(effect_id, payload)

    def reconcile(self, effect_id: str) -> Any:
        self.said.append("reconcile")
        return self.inner.reconcile(effect_id)


@pytest.mark.parametrize("plan", ["perform", "reconcile"])
def test_an_intent_taken_up_renews_the_lease_before_the_call_whatever_the_plan(world: World, plan: str) -> None:
    # The intent committed and its answer was lost: the provider's call comes after a renewal under the fence
    # (the intent's own write is old by then), and, when an earlier issue is unanswered, after the look.
    lossy = Lossy(world.store, "record_intent", when="after")
    counted = Counted(world, attempts=2, adapter=Told(world.adapter, lossy.calls))
    op_id = submit(world, counted, "capture")
    if plan == "reconcile":
        world.provider.mode = "timeout"  # attempt 1's call: unanswered, and nothing captured
        first = worker(world, world.store, counted).run_once()
        assert first is not None and first.outcome == "retry", first
        world.provider.mode = "ok"
        world.clock.advance(timedelta(minutes=1))
    lost = worker(world, lossy, counted)
    with pytest.raises(StoreError):
        lost.run_once()
    assert lossy.lost == 1 and lossy.calls[-1] == "record_intent", lossy.calls
    lossy.calls.clear()
    report = lost.run_once()
    assert report is not None and (report.outcome, report.resumed) == ("succeeded", True), report
    assert "its effect's intent had committed: the provider is called now" in report.detail, report.detail
    looked = ["reconcile"] if plan == "reconcile" else []
    assert lossy.calls == ["view", "now", *looked, "heartbeat", "perform", "complete"], lossy.calls
    view = the_view(world, op_id)
    intents = [t.fence for t in view.history if t.event is not None and t.event.value == "record_intent"]
    assert intents == ([1, 2] if plan == "reconcile" else [1]), intents  # the lost one not sent again
    assert attempts(view)[-1] == (2 if plan == "reconcile" else 1, "w1", "succeeded")


def test_a_lost_claim_takes_up_the_last_attempt_claimed_under_the_id(world: World) -> None:
    # Two Operations run under w1 with live leases: one a worker gave up (made again, its claim lost too),
    # and the one the claim whose answer was just lost made.  Only the one claimed last is this claim's.
    counted = Counted(world)
    older = submit(world, counted, "echo")
    given_up = worker(world, Lossy(world.store, "claim_next", when="after"), counted)
    with pytest.raises(StoreError):
        given_up.run_once()
    del given_up
    gc.collect()  # no longer a busy namesake of the process
    world.clock.advance(timedelta(seconds=1))
    newer = submit(world, counted, "echo", key="k2")
    lossy = Lossy(world.store, "claim_next", when="after")
    reports, raised = drain(worker(world, lossy, counted).run_once)
    assert raised == 1 and lossy.calls.count("running_under") == 1, lossy.calls
    assert [(r.operation_id, r.attempt, r.outcome, r.resumed) for r in reports] == [(newer, 1, "succeeded", True)]
    assert attempts(the_view(world, newer)) == [(1, "w1", "succeeded")]
    # The older one is left to its lease, as after a crash: nothing of it was run under this worker's claim.
    assert attempts(the_view(world, older)) == [(1, "w1", "running")] and counted.calls == 1
