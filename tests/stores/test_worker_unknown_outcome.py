"""A decision whose outcome the store could not report: the worker takes its lease up again once the store answers.

A connection lost inside a claim, an intent's commit, a step or a
finalization leaves the worker not knowing whether its transaction
committed.  Before, the worker raised, its loop waited for the store and
claimed something else: the execution stayed running under the old lease
until the lease expired and a quarantine sweep sent it to review, where an
operator had to continue it (seed 000, Lease: "A process crash leaves the
lease to expire").  Now the worker's next pass reads the execution first and
goes on where the read shows it still running under its own lease: a
handler's answer in hand is committed, an intent it committed without
calling its handler has the handler called, once, and the rest is planned
afresh.  What is checked here, on every store, for every place the loss can
land, committed or not: the execution ends as if nothing had happened (one
claim, each Command run exactly once, nobody's review), and a lease that ran
out or passed to another worker meanwhile is left alone.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import client as client_module
from fencekeeper.adapters import service
from fencekeeper.adapters.aio import AsyncClient
from fencekeeper.adapters.client import Client, _hand_back_on_stop
from fencekeeper.adapters.errors import StoreFailure
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import (
    STOP_TAKE_UP_WAITS,
    ManualClock,
    StoreError,
    StorePatience,
    TransactionalStore,
)
from fencekeeper.adapters.worker import PassReport, Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionEvent, ExecutionState

from .test_worker_interrupted import BUSINESS, DEFINITION, POLICY, PRINCIPAL, Handler, finish

LOST = "the connection to the store was lost"


class Lossy:
    """The store, whose connection is lost in the ``nth`` call of ``call``: before its transaction commits, or after.

    After the commit, the worker's answer is what is lost; before it, nothing
    was written.  ``down`` more calls of any kind fail the same way after it
    (the store away for a while).  Without ``composed``, claims and steps
    compose no visit, so every visit is the worker's own (an intent's own
    ``append_evidence``, a ``finalize``).
    """

    def __init__(
        self, inner: TransactionalStore, call: str, *, nth: int = 1, committed: bool, composed: bool, down: int = 0
    ) -> None:
        self._inner = inner
        self._call = call
        self._nth = nth
        self._committed = committed
        self._composed = composed
        self.down = 0
        self._down_after = down
        self.calls: list[str] = []
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        inner = getattr(self._inner, name)
        if not callable(inner) or name in ("clock", "known_definition"):
            # known_definition makes no round trip: a planner asks it inside the transaction being committed.
            return inner

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down > 0:
                self.down -= 1
                raise StoreError("store_unavailable", LOST)
            if name in ("claim_and_visit", "record_step_and_visit") and not self._composed:
                args = (*args[:-1], lambda *_: None)
            self.calls.append(name)
            if name != self._call or self.calls.count(name) != self._nth:
                return inner(*args, **kwargs)
            self.lost += 1
            try:
                if self._committed:
                    inner(*args, **kwargs)
            finally:
                # Away once the call is over: set before it, a composed call's planner met the outage
                # inside the transaction, which then rolled back instead of committing.
                self.down = self._down_after
            raise StoreError("store_unavailable", LOST)

        return call


def drain(worker: Worker, store: Lossy) -> PassReport:
    """Passes until idle, waiting out the store as ``fencekeeper worker``'s loop does; what the passes did."""
    total = PassReport()
    for _ in range(50):
        try:
            report = worker.run_pass()
        except StoreError as exc:
            assert exc.code == "store_unavailable" and exc.message == LOST
            continue
        total.claimed += report.claimed
        total.steps += report.steps
        total.finished.update(report.finished)
        total.refused += report.refused
        if not report.claimed and not report.timers_fired:
            return total
    raise AssertionError("the worker never went idle")


def opened_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest, clock: ManualClock) -> TransactionalStore:
    if kind == "memory":
        return MemoryStore(clock)
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "store.db", clock)
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415 - only where PostgreSQL runs

    return PostgresStore(request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"))


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore]:
    opened = opened_store(request.param, tmp_path, request, ManualClock())
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    try:
        yield opened
    finally:
        opened.close()


# Every call of a two-Command execution's run, as a worker makes it: uncomposed, each visit its own
# transaction; composed, the claim carries the first intent and each result the next visit.
UNCOMPOSED = [
    ("claim_and_visit", 1),
    ("append_evidence", 1),
    ("record_step_and_visit", 1),
    ("append_evidence", 2),
    ("record_step_and_visit", 2),
    ("finalize", 1),
]
COMPOSED = [("claim_and_visit", 1), ("record_step_and_visit", 1), ("record_step_and_visit", 2)]
FINISHING = {("finalize", 1, False), ("record_step_and_visit", 2, True)}
"""The transactions that end the execution (the last, composed, carries the end node's finalization)."""
PLACES = [(call, nth, False) for call, nth in UNCOMPOSED] + [(call, nth, True) for call, nth in COMPOSED]


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "rolled-back"])
@pytest.mark.parametrize(("call", "nth", "composed"), PLACES, ids=[f"{c}-{n}-{'composed' if k else 'alone'}" for c, n, k in PLACES])
def test_a_lost_answer_anywhere_ends_as_if_nothing_happened(
    any_store: TransactionalStore, call: str, nth: int, composed: bool, committed: bool
) -> None:
    handler, seen = Handler(), []
    store = Lossy(any_store, call, nth=nth, committed=committed, composed=composed)
    worker = Worker(store, "w-1", POLICY, handler, on_event=lambda _x, what, _d: seen.append(what))  # type: ignore[arg-type]
    report = drain(worker, store)
    assert store.lost == 1, f"the loss never landed: {store.calls}"
    view = any_store.read("x-1")
    assert view is not None
    assert view.execution.state == ExecutionState.SUCCEEDED, (view.execution.state, seen)
    assert handler.executed == ["order.first", "order.second"], "each Command once: none lost, none run twice"
    assert view.execution.fence == 1, "one claim: the lease was taken up, not left to expire and claimed again"
    events = [t.event for t in view.history]
    assert ExecutionEvent.QUARANTINE_EXPIRED not in events and events.count(ExecutionEvent.CLAIM) == 1
    assert report.refused == []
    assert report.claimed == ["x-1"], "claimed once, whether the claim's answer was lost or not"
    held = committed or call != "claim_and_visit"
    finished = committed and (call, nth, composed) in FINISHING
    if held and not finished:
        assert "resumed" in seen
    else:
        assert "resumed" not in seen  # nothing held (a claim rolled back), or nothing left to do (it ended)
    assert worker.holds_command("x-1") is False


def test_a_lost_answer_with_the_store_away_for_a_while(any_store: TransactionalStore) -> None:
    # The pass that takes the lease up meets the store still down: it raises again, remembering the lease.
    handler = Handler()
    store = Lossy(any_store, "append_evidence", nth=1, committed=True, composed=False, down=4)
    worker = Worker(store, "w-1", POLICY, handler)  # type: ignore[arg-type]
    drain(worker, store)
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.SUCCEEDED
    assert handler.executed == ["order.first", "order.second"] and view.execution.fence == 1


class Unknowing(Handler):
    """Answers the first Command UNKNOWN: its result sends the execution to reconciliation."""

    def execute(self, command: i.Command) -> i.CommandResult:
        self.executed.append(command.operation)
        return i.CommandResult(i.CommandStatus.UNKNOWN, None, "the provider timed out")


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "rolled-back"])
def test_an_unknown_answer_in_hand_is_committed_as_the_handler_gave_it(
    any_store: TransactionalStore, committed: bool
) -> None:
    # The finalization carrying the handler's UNKNOWN is lost: the answer is committed, not a guess of it
    # (`command_unsettled` would say no answer came at all), and the handler is not asked again.
    handler = Unknowing()
    store = Lossy(any_store, "finalize", committed=committed, composed=False)
    worker = Worker(store, "w-1", POLICY, handler)  # type: ignore[arg-type]
    drain(worker, store)
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert handler.executed == ["order.first"]
    assert view.dispatch.last_error_code == i.Reason.COMMAND_UNKNOWN.value


def lost_then(
    call: str, clock: ManualClock, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> tuple[TransactionalStore, Handler, Worker]:
    """An admitted execution, and a worker whose ``call`` committed and lost its answer."""
    opened = opened_store(kind, tmp_path, request, clock)
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    handler = Handler()
    worker = Worker(Lossy(opened, call, committed=True, composed=False), "w-1", POLICY, handler)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        worker.run_pass()
    return opened, handler, worker


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "rolled-back"])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])  # a clock the test moves (PostgreSQL's is the server's)
def test_a_take_up_past_half_the_lease_renews_before_the_handler_even_when_that_answer_is_lost(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, committed: bool
) -> None:
    # The intent committed and its answer was lost, and the store came back with less than half the lease left.
    # The Command's handler gets what every visit starts with: the take-up renews first (it called the handler
    # on what was left).  That renewal's answer is lost too; the next pass goes on: the Command is sent once,
    # under the fence the claim gave, and the execution ends.
    clock = ManualClock()
    opened, handler, worker = lost_then("append_evidence", clock, tmp_path, request, kind)
    clock.advance(worker.lease * 0.6)
    worker.store = Lossy(opened, "renew", committed=committed, composed=False)  # type: ignore[assignment]
    with pytest.raises(StoreError):
        worker.run_pass()
    assert worker.store.lost == 1 and handler.executed == []  # type: ignore[attr-defined]
    renewals: list[datetime] = []
    real = handler.execute

    def execute(command: i.Command) -> i.CommandResult:
        view = opened.read("x-1")
        assert view is not None and view.dispatch.lease_expires_at is not None
        renewals.append(view.dispatch.lease_expires_at)
        return real(command)

    handler.execute = execute  # type: ignore[method-assign]
    drain(worker, worker.store)  # type: ignore[arg-type]
    view = opened.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.SUCCEEDED
    assert handler.executed == ["order.first", "order.second"] and view.execution.fence == 1
    # The first Command ran with a whole lease ahead of it, as the visit that issued it would have.
    assert renewals[0] - clock.now() == worker.lease
    opened.close()


class _LateRenewal:
    """The store, whose clock passes the lease's expiry just as a renewal is asked: the renewal is refused."""

    def __init__(self, inner: TransactionalStore, clock: ManualClock, lease: timedelta) -> None:
        self._inner, self._clock, self._lease = inner, clock, lease

    def renew(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.advance(self._lease)
        return self._inner.renew(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_take_up_whose_renewal_is_refused_never_calls_the_handler(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    # The take-up's renewal comes too late (the lease ran out between the read and the renewal): the Command
    # is never sent under a lease no longer held, and no later pass sends it; the sweep takes the execution.
    clock = ManualClock()
    opened, handler, worker = lost_then("append_evidence", clock, tmp_path, request, kind)
    clock.advance(worker.lease * 0.6)
    worker.store = _LateRenewal(opened, clock, worker.lease)  # type: ignore[assignment]
    report = worker.run_pass()
    assert [r.code for r in report.refused] == ["lease_expired"], report.refused
    assert handler.executed == [] and not worker.holds_command("x-1")
    assert worker.run_pass().claimed == [] and handler.executed == []
    sweep = service.quarantine_expired(opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL)
    assert sweep.quarantined == ["x-1"] and handler.executed == []
    opened.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_lease_that_ran_out_while_the_store_was_away_is_left_to_the_sweep(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    # The intent committed; then the store was away longer than the lease.  Nothing may be written under
    # it any more, and whether the Command ran is no longer this worker's to settle: it is not sent.
    clock = ManualClock()
    opened, handler, worker = lost_then("append_evidence", clock, tmp_path, request, kind)
    clock.advance(worker.lease)
    told: list[tuple[str, str]] = []
    worker.on_event = lambda _x, what, detail: told.append((what, detail))
    report = worker.run_pass()
    # The pass the loss ended hands on its claim; nothing more is claimed, refused or sent, and it says why.
    assert handler.executed == [] and report.refused == [] and report.claimed == ["x-1"]
    assert [what for what, _ in told] == ["lapsed"] and "fencekeeper reconcile --quarantine" in told[0][1]
    assert worker.run_pass().claimed == []
    view = opened.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.RUNNING
    sweep = service.quarantine_expired(opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL)
    assert sweep.quarantined == ["x-1"]
    view = opened.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    opened.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_lease_another_worker_holds_by_then_is_left_alone(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    # The claim committed and its answer was lost; the lease ran out, a sweep and an operator's resume
    # made the execution eligible, and w-2 holds it now.  w-1, back, finds a lease that is not its own.
    clock = ManualClock()
    opened, handler, worker = lost_then("claim_and_visit", clock, tmp_path, request, kind)
    clock.advance(worker.lease)
    assert service.quarantine_expired(opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL).quarantined == ["x-1"]
    resumed = service.resume(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", at_node="first",
        rationale="its claim's answer was lost; no Command was issued",
    )  # fmt: skip
    assert isinstance(resumed, p.Decision)
    claimed = opened.claim_and_visit(p.ClaimRequest("w-2", "t-2", worker.lease), lambda *_: None)
    assert isinstance(claimed.outcome, p.Decision)
    report = worker.run_pass()
    assert report.claimed == [] and report.steps == 0 and report.refused == [] and handler.executed == []
    view = opened.read("x-1")
    assert view is not None and view.dispatch.leased_by == "w-2" and view.execution.state == ExecutionState.RUNNING
    opened.close()


def test_events_say_what_was_taken_up(tmp_path: Path) -> None:
    clock = ManualClock()
    opened = MemoryStore(clock)
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    told: list[tuple[str, str]] = []
    store = Lossy(opened, "record_step_and_visit", committed=False, composed=False)
    worker = Worker(store, "w-1", POLICY, Handler(), on_event=lambda _x, what, detail: told.append((what, detail)))  # type: ignore[arg-type]
    drain(worker, store)
    resumed = [detail for what, detail in told if what == "resumed"]
    assert len(resumed) == 1
    assert "x-1:a" in resumed[0] or "command" in resumed[0]
    assert "its result is committed now" in resumed[0]



@pytest.mark.parametrize(("call", "first"), [("claim_and_visit", ["leased_to", "read_for_visit"]), ("append_evidence", ["read_for_visit"])])
def test_the_pass_after_a_loss_reads_the_execution_before_any_timer_or_claim(
    any_store: TransactionalStore, call: str, first: list[str]
) -> None:
    # A claim of unknown outcome is looked up by its token first; a visit's, read by its execution's id.
    store = Lossy(any_store, call, committed=True, composed=False)
    worker = Worker(store, "w-1", POLICY, Handler())  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        worker.run_pass()
    lost = len(store.calls)  # (kept, not cleared: the Lossy store counts calls to find the one it loses)
    worker.run_pass()
    after = store.calls[lost:]
    assert after[: len(first)] == first, after
    assert "due_wakes" in after and "claim_and_visit" in after, after


def test_an_unsettled_command_the_worker_cannot_account_for_goes_to_reconciliation_never_to_its_handler(
    any_store: TransactionalStore,
) -> None:
    # The intent committed and its answer was lost, and the worker holds nothing of it (no answer, no intent of
    # its own waiting): the read is planned afresh, and the unsettled Command is reconciled, not sent.
    handler, seen = Handler(), []
    store = Lossy(any_store, "append_evidence", committed=True, composed=False)
    worker = Worker(store, "w-1", POLICY, handler, on_event=lambda _x, what, _d: seen.append(what))  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        worker.run_pass()
    assert worker.holds_unfinished()
    worker._at.intent = None  # what a worker that kept nothing of its intent would hold
    worker.run_pass()
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert view.dispatch.last_error_code == i.Reason.COMMAND_UNSETTLED.value
    assert handler.executed == [] and "resumed" in seen and view.execution.fence == 1


UNFINISHED = (ExecutionState.ELIGIBLE, ExecutionState.RUNNING)


def test_a_pool_of_workers_takes_the_lease_up_too(any_store: TransactionalStore) -> None:
    # The client's pool (client.start_workers) waits out the store and keeps its workers: the same take-up.
    handler = Handler()
    store = Lossy(any_store, "record_step_and_visit", committed=True, composed=True, down=2)
    client = Client(store, policy=POLICY, handler=handler, business=BUSINESS, principal=PRINCIPAL)  # type: ignore[arg-type]
    with client.start_workers(1, poll=0.05) as pool:
        deadline = time.monotonic() + 30
        # Read past the wrapper: the test's own reads must not meet the loss it stages.
        while (view := any_store.read("x-1")) is None or view.execution.state in UNFINISHED:
            assert time.monotonic() < deadline, view
            time.sleep(0.02)
    assert view.execution.state == ExecutionState.SUCCEEDED and pool.errors == []
    assert handler.executed == ["order.first", "order.second"] and store.lost == 1
    assert view.execution.fence == 1


class _QuickPatience(StorePatience):
    """The command line's patience, its backoff shortened: the same give-up rule, over the same budget."""

    def failed(self, code: str) -> float | None:
        wait = super().failed(code)
        return None if wait is None else 0.01


def test_a_pool_rides_out_an_outage_as_long_as_the_command_line_does(
    any_store: TransactionalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool's worker gave up after five failed tries in a row, about six seconds: a server restart or a failover
    # ended every worker of a program's pool, where `fencekeeper worker` waits out 30 s.  Now the same patience.
    monkeypatch.setattr(client_module, "StorePatience", _QuickPatience)
    handler = Handler()
    store = Lossy(any_store, "record_step_and_visit", committed=True, composed=True, down=12)
    client = Client(store, policy=POLICY, handler=handler, business=BUSINESS, principal=PRINCIPAL)  # type: ignore[arg-type]
    with client.start_workers(1, poll=0.05) as pool:
        deadline = time.monotonic() + 30
        while (view := any_store.read("x-1")) is None or view.execution.state in UNFINISHED:
            assert time.monotonic() < deadline and pool.errors == [], (view, pool.errors)
            time.sleep(0.02)
    assert view.execution.state == ExecutionState.SUCCEEDED and pool.errors == [] and store.down == 0
    assert handler.executed == ["order.first", "order.second"]


def test_a_pool_stopped_while_it_waits_out_the_store_finishes_the_visit_and_hands_the_lease_back(
    any_store: TransactionalStore,
) -> None:
    # As `fencekeeper worker`: a pool stopped between its tries does not leave the lease to expire into review.
    handler = Handler()
    store = Lossy(any_store, "record_step_and_visit", committed=False, composed=False, down=4)
    client = Client(store, policy=POLICY, handler=handler, business=BUSINESS, principal=PRINCIPAL)  # type: ignore[arg-type]
    pool = client.start_workers(1, poll=0.05)
    try:
        deadline = time.monotonic() + 30
        while not (store.lost == 1 and store.down <= 3):  # the answer lost, and the first try after it failed
            assert time.monotonic() < deadline and pool.errors == [], pool.errors
            time.sleep(0.01)
    finally:
        pool.stop()
    assert pool.errors == [] and pool.released == ["x-1"] and store.down == 0
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.ELIGIBLE, "handed back"
    assert view.execution.current_node_id == "second", "the first Command's answer is committed"
    assert handler.executed == ["order.first"] and view.execution.fence == 1
    finish(any_store, handler)
    assert handler.executed == ["order.first", "order.second"]


def test_run_until_idle_goes_on_with_what_a_failed_call_held(any_store: TransactionalStore) -> None:
    # client.run_until_idle makes a worker per call: the one whose answer was lost is kept for the next.
    handler = Handler()
    store = Lossy(any_store, "append_evidence", nth=2, committed=True, composed=False)
    client = Client(store, policy=POLICY, handler=handler, business=BUSINESS, principal=PRINCIPAL)  # type: ignore[arg-type]
    with pytest.raises(StoreFailure) as failed:
        client.run_until_idle(worker_id="w-1")
    assert failed.value.code.value == "store_unavailable" and handler.executed == ["order.first"]
    report = client.run_until_idle(worker_id="w-9")  # the held worker goes on first, as w-1
    assert report.claimed == ["x-1"] and report.finished["succeeded"] == 1
    assert handler.executed == ["order.first", "order.second"]
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.SUCCEEDED and view.execution.fence == 1
    assert {t.actor for t in view.history if t.event == ExecutionEvent.FINALIZE_SUCCEEDED} == {"w-1"}
    assert client.run_until_idle().claimed == []  # nothing held any more


def test_the_asyncio_run_until_idle_goes_on_with_what_a_failed_call_held(any_store: TransactionalStore) -> None:
    # The asyncio client's calls run the sync client's passes in threads, each with a stop of its own (for
    # cancellation): the held worker keeps its one stop hook, asked about the next call's stop.
    handler = Handler()
    store = Lossy(any_store, "append_evidence", nth=2, committed=True, composed=False)
    client = AsyncClient(Client(store, policy=POLICY, handler=handler, business=BUSINESS, principal=PRINCIPAL))  # type: ignore[arg-type]

    async def scenario() -> tuple[StoreFailure, PassReport, PassReport]:
        with pytest.raises(StoreFailure) as failed:
            await client.run_until_idle(worker_id="w-1")
        report = await client.run_until_idle(worker_id="w-9")  # the held worker goes on first, as w-1
        return failed.value, report, await client.run_until_idle()

    failure, report, after = asyncio.run(scenario())
    assert failure.code.value == "store_unavailable"
    assert report.claimed == ["x-1"] and report.finished["succeeded"] == 1 and after.claimed == []
    assert handler.executed == ["order.first", "order.second"]
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.SUCCEEDED and view.execution.fence == 1
    assert {t.actor for t in view.history if t.event == ExecutionEvent.FINALIZE_SUCCEEDED} == {"w-1"}


@pytest.mark.parametrize("committed", [False, True], ids=["lost-before-commit", "lost-after-commit"])
@pytest.mark.parametrize("down", [0, 3])
def test_a_stopping_worker_finishes_the_visit_whose_answer_was_lost_and_hands_the_lease_back(
    any_store: TransactionalStore, down: int, committed: bool
) -> None:
    # Stopped (SIGTERM, Ctrl-C) while the store was away mid-visit: fencekeeper worker's last look finishes that
    # visit under the lease and its hook hands the lease back, so nothing waits for a lease to run out.  Where
    # the lost step had committed, the lease is handed back on taking it up: no further visit, no second Command.
    handler = Handler()
    store = Lossy(any_store, "record_step_and_visit", committed=committed, composed=False, down=down)
    worker = Worker(store, "w-1", POLICY, handler)  # type: ignore[arg-type]
    stopping = threading.Event()
    _hand_back_on_stop(worker, stopping.is_set)  # the hook a stopping worker runs after a committed visit
    with pytest.raises(StoreError):
        worker.run_pass()
    stopping.set()
    assert worker.holds_unfinished()
    report = worker.take_up_before_stop()  # rides out the `down` failures within its few seconds
    assert report is not None and report.claimed == ["x-1"] and report.steps == (0 if committed else 1)
    view = any_store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.ELIGIBLE, "handed back"
    assert view.execution.current_node_id == "second", "the first Command's answer is committed"
    assert handler.executed == ["order.first"] and not worker.holds_unfinished()
    finish(any_store, handler)
    assert handler.executed == ["order.first", "order.second"]


class Altered:
    """The store, whose schema was altered under the worker: every read fails, and not with a doubt to wait out."""

    def __init__(self, inner: TransactionalStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("leased_to", "read_for_visit", "read"):

            def altered(*_: object) -> None:
                raise StoreError("schema_altered", "a column of executions is missing")

            return altered
        return getattr(self._inner, name)


def test_a_stopping_worker_reports_what_else_fails_its_last_look(any_store: TransactionalStore) -> None:
    # Only the store's retryable doubt is ridden out (and then given up on); anything else reaches the
    # command's summary as an error, not silence.
    handler = Handler()
    worker = Worker(Lossy(any_store, "append_evidence", committed=True, composed=False), "w-1", POLICY, handler)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        worker.run_pass()
    worker.store = Altered(any_store)  # type: ignore[assignment]
    with pytest.raises(StoreError) as raised:
        worker.take_up_before_stop()
    assert raised.value.code == "schema_altered" and handler.executed == []


def test_a_stopping_worker_does_not_wait_out_an_outage(any_store: TransactionalStore) -> None:
    handler = Handler()
    store = Lossy(any_store, "append_evidence", committed=True, composed=False, down=1000)
    worker = Worker(store, "w-1", POLICY, handler)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        worker.run_pass()
    started = time.monotonic()
    assert worker.take_up_before_stop() is None
    assert time.monotonic() - started < sum(STOP_TAKE_UP_WAITS) + 1
    assert handler.executed == [] and worker.holds_unfinished()  # left for the sweep once the lease runs out
