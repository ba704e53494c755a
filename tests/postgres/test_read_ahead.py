"""A worker's next claim, read ahead behind the COMMIT of the transaction that finished its execution.

On PostgreSQL a worker that will claim again tells the store so
(``NextClaim``); when a composed transaction finishes its execution, the
next claim's locking read goes to the server behind that transaction's
``COMMIT``, in the same exchange, as the first statement of the claim's own
transaction.  The two transactions stay two, each with its own decisions
and guards; the claim's is only opened earlier.  What these tests prove:

- what a read ahead locked is its worker's next claim: another worker's
  claim passes over it (``SKIP LOCKED``), and the worker then claims and
  finishes it;
- a read ahead that is not used writes nothing and holds nothing once its
  worker asks for anything else: another call of the store on the same
  thread, ``drop_read_ahead``, a claim that passes over other executions,
  and ``close`` each roll it back, and anyone may claim the execution,
  which is as it was;
- a read ahead behind a write that fails at the COMMIT is not made, and the
  write is decided again and lands once; a read ahead that itself fails
  takes nothing from the COMMIT before it;
- a read ahead that finds nothing keeps no transaction open, and a pass
  that will claim no more (``max_claims``, a stopping worker) leaves nothing
  read ahead.

The round trips this saves are counted in tests/cli/test_worker_round_trips.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.postgres_store import PostgresStore, _Ahead, _PostgresBackend
from fencekeeper.adapters.store import NextClaim, TransactionalStore
from fencekeeper.adapters.testing.roundtrips import ONE_NODE, TWO_NODE
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState
from tests.postgres.claiming import admit_in_order

BUSINESS = "b-1"
LEASE = timedelta(seconds=30)
PRINCIPAL = "user:operator"
WORKFLOWS = {"one-node": ONE_NODE, "two-node": TWO_NODE}
NEXT = NextClaim(BUSINESS)


class _Succeeds:
    def execute(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)

    def reconcile(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)


@pytest.fixture
def stores(pg_dsn: str, pg_schema: str) -> Iterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one schema: two workers' processes."""
    first = PostgresStore(pg_dsn, schema=pg_schema, pool_size=2)
    second = PostgresStore(pg_dsn, schema=pg_schema, pool_size=2)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _admit(store: TransactionalStore, workflow: str, count: int) -> list[str]:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(WORKFLOWS[workflow]), BUSINESS, PRINCIPAL, policy)
    return admit_in_order(store, BUSINESS, PRINCIPAL, *[workflow] * count)


def _worker(store: TransactionalStore, worker_id: str = "w-1", **kwargs: Any) -> Worker:
    return Worker(store, worker_id, examples.grants(BUSINESS, PRINCIPAL), _Succeeds(), business_id=BUSINESS, **kwargs)


def _claim(store: PostgresStore, token: str, **kwargs: Any) -> p.Outcome | None:
    """One claim of a one-node execution with its finalization, in one transaction (as a worker makes it)."""
    composed = store.claim_and_visit(
        p.ClaimRequest("w-1", token, LEASE), _worker(store)._plan_next, business_id=BUSINESS, **kwargs
    )
    if composed.outcome is not None:
        assert [visit.kind for visit, _ in composed.followed] == ["finish"], composed.followed
    return composed.outcome


def _claimed(outcome: p.Outcome | None) -> str | None:
    if outcome is None:
        return None
    assert isinstance(outcome, p.Decision) and outcome.execution is not None, outcome
    return outcome.execution.execution_id


def _others_claim(store: PostgresStore) -> str | None:
    """Another worker's claim (its own process's store); None when it finds nothing it may lock."""
    return _claimed(store.claim_next(p.ClaimRequest("w-2", "t-other", LEASE), business_id=BUSINESS))


def _state(store: PostgresStore, execution_id: str) -> tuple[ExecutionState, int]:
    view = store.read_for_visit(execution_id)
    assert view is not None
    return view.execution.state, view.execution.revision


def test_what_is_read_ahead_is_the_next_claim_of_its_worker(stores: tuple[PostgresStore, PostgresStore]) -> None:
    mine, theirs = stores
    first, second = _admit(mine, "one-node", 2)
    assert _claimed(_claim(mine, "t-1", next_claim=NEXT)) == first
    # The second execution's rows are locked by the claim read ahead: another worker passes over them.
    assert _others_claim(theirs) is None
    assert _claimed(_claim(mine, "t-2")) == second
    assert _state(theirs, first)[0] == _state(theirs, second)[0] == ExecutionState.SUCCEEDED


@pytest.mark.parametrize("how", ["another-call", "drop", "other-skip", "close"])
def test_a_read_ahead_that_is_not_used_writes_nothing_and_lets_go(
    stores: tuple[PostgresStore, PostgresStore], how: str
) -> None:
    mine, theirs = stores
    first, second = _admit(mine, "one-node", 2)
    before = _state(theirs, second)
    assert _claimed(_claim(mine, "t-1", next_claim=NEXT)) == first
    assert _others_claim(theirs) is None
    if how == "another-call":
        # Any other call of the store on this thread: the worker will not claim next.
        assert mine.read_for_visit(second) is not None
    elif how == "drop":
        mine.drop_read_ahead()
    elif how == "close":
        mine.close()
    else:
        # A claim that passes over an execution the read did not: read afresh, and it claims as any claim does.
        assert _claimed(_claim(mine, "t-2", skip={"x-elsewhere"})) == second
        assert _state(theirs, second)[0] == ExecutionState.SUCCEEDED
        return
    assert _state(theirs, second) == before
    assert _others_claim(theirs) == second


def test_a_read_ahead_is_its_own_threads(stores: tuple[PostgresStore, PostgresStore]) -> None:
    # Each of a process's worker threads reads ahead its own next claim; another thread's calls leave it alone.
    mine, theirs = stores
    first, second = _admit(mine, "one-node", 2)
    claimed: list[str | None] = []
    read = threading.Event()
    go_on = threading.Event()

    def worker_thread() -> None:
        claimed.append(_claimed(_claim(mine, "t-1", next_claim=NEXT)))
        read.set()
        go_on.wait(10)
        claimed.append(_claimed(_claim(mine, "t-2")))

    thread = threading.Thread(target=worker_thread)
    thread.start()
    assert read.wait(10)
    assert mine.read_for_visit(first) is not None  # this thread's call
    assert _others_claim(theirs) is None
    go_on.set()
    thread.join(10)
    assert claimed == [first, second]


def test_a_write_that_fails_at_the_commit_reads_nothing_ahead_and_lands_once(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The finalization's guard fails on the server the first time: its COMMIT is skipped, and so is the
    # read ahead behind it; the claim is decided again, written as it is made, and lands once.
    monkeypatch.setattr(_PostgresBackend, "verify_views", False)
    mine, theirs = stores
    first, second = _admit(mine, "one-node", 2)
    real = p.finalize
    calls: list[p.Outcome] = []

    def stale_once(*args: Any) -> p.Outcome:
        outcome = real(*args)
        calls.append(outcome)
        if len(calls) == 1 and isinstance(outcome, p.Decision):
            guard = attrs.evolve(outcome.guard, expected_revision=outcome.guard.expected_revision + 7)
            return attrs.evolve(outcome, guard=guard)
        return outcome

    monkeypatch.setattr(p, "finalize", stale_once)
    assert _claimed(_claim(mine, "t-1", next_claim=NEXT)) == first
    assert len(calls) == 2
    assert _state(theirs, first) == (ExecutionState.SUCCEEDED, 3)
    # Decided again with every write made as it goes, the transaction keeps nothing for its COMMIT,
    # and nothing rides behind it: the second execution is anyone's.
    assert _others_claim(theirs) == second


def test_a_read_ahead_that_fails_takes_nothing_from_the_commit_before_it(
    stores: tuple[PostgresStore, PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, theirs = stores
    first, second = _admit(mine, "one-node", 2)

    def failing(self: _PostgresBackend, claim: NextClaim) -> _Ahead:
        return _Ahead((("SELECT 1 / 0", ()), ("SELECT 1", ())), None)

    monkeypatch.setattr(_PostgresBackend, "ahead_of", failing)
    assert _claimed(_claim(mine, "t-1", next_claim=NEXT)) == first
    assert _state(theirs, first)[0] == ExecutionState.SUCCEEDED
    # Its transaction was rolled back at once: nothing held, and the next claim claims.
    assert _others_claim(theirs) == second


def test_a_read_ahead_that_finds_nothing_keeps_no_transaction_open(stores: tuple[PostgresStore, PostgresStore]) -> None:
    mine, theirs = stores
    (first,) = _admit(mine, "one-node", 1)
    assert _claimed(_claim(mine, "t-1", next_claim=NEXT)) == first
    assert not mine._parked
    # Work admitted afterwards is found by the next claim, which reads afresh.
    (second,) = _admit(theirs, "one-node", 1)
    assert _claimed(_claim(mine, "t-2", next_claim=NEXT)) == second


@pytest.mark.parametrize("workflow", sorted(WORKFLOWS))
@pytest.mark.parametrize("how", ["max-claims", "stopping"])
def test_a_pass_that_claims_no_more_leaves_nothing_read_ahead(
    stores: tuple[PostgresStore, PostgresStore], workflow: str, how: str
) -> None:
    mine, theirs = stores
    admitted = _admit(mine, workflow, 3)
    if how == "max-claims":
        report = _worker(mine).run_pass(max_claims=2)
    else:
        stop = threading.Event()
        worker = _worker(mine, stopping=stop.is_set, on_event=lambda execution_id, what, detail: stop.set())
        report = worker.run_pass()
    assert report.claimed == admitted[: len(report.claimed)] and report.claimed
    assert not mine._parked
    assert _others_claim(theirs) == admitted[len(report.claimed)]


@pytest.mark.parametrize("workflow", sorted(WORKFLOWS))
def test_a_draining_pass_finishes_every_execution_once(stores: tuple[PostgresStore, PostgresStore], workflow: str) -> None:
    mine, theirs = stores
    admitted = _admit(mine, workflow, 6)
    commands: list[str] = []

    class _Recording(_Succeeds):
        def execute(self, command: i.Command) -> i.CommandResult:
            # Its intent is committed before it is called, whatever was read ahead since.
            view = theirs.read(command.execution_id)
            assert view is not None and command.command_id in {e.object_id for e in view.evidence}
            commands.append(command.execution_id)
            return super().execute(command)

    worker = Worker(mine, "w-1", examples.grants(BUSINESS, PRINCIPAL), _Recording(), business_id=BUSINESS)
    report = worker.run_pass()
    assert report.claimed == admitted and report.finished == {"succeeded": 6}, report
    assert commands == (admitted if workflow == "two-node" else [])
    assert not mine._parked
    for execution_id in admitted:
        view = theirs.read(execution_id)
        assert view is not None and view.execution.state == ExecutionState.SUCCEEDED and view.execution.fence == 1


def test_a_read_ahead_kept_past_half_the_idle_timeout_is_claimed_afresh(pg_dsn: str, pg_schema: str) -> None:
    # A worker whose hook stalled while it reported the execution before: the server has ended the session
    # of the claim read ahead (idle in a transaction).  The claim is made afresh, not on that session.
    mine = PostgresStore(pg_dsn, schema=pg_schema, pool_size=2, idle_in_transaction_timeout=0.4)
    try:
        first, second = _admit(mine, "one-node", 2)
        assert _claimed(_claim(mine, "t-1", next_claim=NEXT)) == first
        assert mine._parked
        threading.Event().wait(0.8)
        assert _claimed(_claim(mine, "t-2")) == second
    finally:
        mine.close()
