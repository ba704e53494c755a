"""A step's transaction that finalizes its execution claims the worker's next one, on PostgreSQL.

specs/protocol.md, "Composed decisions": after a finalize the same worker's
claim of another execution, and that claim's visits, may join the
transaction, each under its own guard (the model checker proves the shape,
tests/protocol/test_model_check.py).  The PostgreSQL store makes that claim
when the worker offers one (``NextClaim.request``): its candidate is locked
by the step's first exchange, with the stepped execution's own locking read
(``SKIP LOCKED``: it never waits), and its writes go with the same
``COMMIT``.  A two-Command execution then costs one transaction where it cost
two.  What these tests prove:

- the claim is made with the token the worker offered, its Command's intent
  commits with it, and the worker drives it next, in the same pass, calling
  its handler once; every view the store made is what the database reads
  (``verify_views``, on for every PostgreSQL test);
- nothing is offered where the pass will claim no more, by a stopping
  worker, or by a store that does not compose claims; a candidate another
  transaction holds is passed over, and the stepped execution finishes all
  the same;
- an answer lost after such a step committed leaves nothing behind: the next
  pass finds the claimed execution under the offered token and calls its
  handler, once; an interruption there hands nothing back while the claimed
  execution's Command may run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.postgres_async import AsyncPostgresStore
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import Composed, NextClaim, StoreError, TransactionalStore
from fencekeeper.adapters.testing.roundtrips import TWO_NODE, counting
from fencekeeper.adapters.worker import Worker, WorkerEvent
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState
from tests.postgres.claiming import CountingHandler, Watching

BUSINESS = "b-1"
PRINCIPAL = "user:operator"


class _Watched(Watching, PostgresStore):
    """The store, keeping what each step's transaction was offered and what it made; optionally failing once after it."""

    def record_step_and_visit(self, *args: Any, next_claim: NextClaim | None = None, **kwargs: Any) -> Composed:
        return self.watch(next_claim, lambda: super(_Watched, self).record_step_and_visit(*args, next_claim=next_claim, **kwargs))


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[_Watched]:
    watched = _Watched(pg_dsn, schema=pg_schema, pool_size=2)
    watched.offered, watched.made = [], []
    try:
        yield watched
    finally:
        watched.close()


def _admit(store: TransactionalStore, count: int) -> list[str]:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, policy)
    admitted = []
    for n in range(count):
        outcome = service.run(
            store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
            input={"order_id": f"o-{n}"},
        )
        assert isinstance(outcome, p.Decision) and outcome.execution is not None, outcome
        admitted.append(outcome.execution.execution_id)
    return admitted


def _worker(store: TransactionalStore, handler: CountingHandler, events: list[WorkerEvent] | None = None, **kwargs: Any) -> Worker:
    return Worker(
        store, "w-1", examples.grants(BUSINESS, PRINCIPAL), handler, business_id=BUSINESS,
        on_record=None if events is None else events.append, **kwargs,
    )


def _state(store: TransactionalStore, execution_id: str) -> ExecutionState:
    view = store.read_for_visit(execution_id)
    assert view is not None
    return view.execution.state


def test_the_step_that_finalizes_claims_the_next_execution_and_the_pass_drives_it(store: _Watched) -> None:
    first, second = _admit(store, 2)
    handler, events = CountingHandler(), []
    worker = _worker(store, handler, events)
    with counting(store) as tally:
        report = worker.run_pass(max_claims=2)
    assert report.claimed == [first, second]
    assert [_state(store, x) for x in (first, second)] == [ExecutionState.SUCCEEDED] * 2
    assert handler.calls == {first: 1, second: 1}
    # The first step was offered the claim and made it, with the offered token; its Command's intent
    # committed with it, so the second execution's own step was its handler's result, offered nothing more.
    offered = store.offered[0]
    assert offered is not None and offered.request is not None
    then = store.made[0].then
    assert then is not None and isinstance(then.outcome, p.Decision) and then.outcome.lease is not None
    assert then.outcome.lease.lease_token == offered.request.lease_token
    assert then.outcome.execution is not None and then.outcome.execution.execution_id == second
    assert [visit.kind for visit, _ in then.followed] == ["intent"]
    assert store.offered[1] is None and store.made[1].then is None
    # Three transactions for two executions (claim and intent; step, finalize, claim and intent; step and
    # finalize), where each execution took two apart.
    assert tally.transactions == 3
    assert [e.what for e in events if e.execution_id == second][:2] == ["claimed", "command"]


def test_a_pass_that_continues_keeps_claiming_with_each_step(store: _Watched) -> None:
    admitted = _admit(store, 5)
    handler = CountingHandler()
    # A process clock that stands still: a loaded machine must not end the pass's timer interval early.
    worker = _worker(store, handler, monotonic=lambda: 0.0)
    with counting(store) as tally:
        report = worker.run_pass(max_claims=1, continues=True)
        worker.drop_read_ahead()
    # One pass: each step claimed the next (within the pass's timer interval, a second).
    assert report.claimed == admitted
    assert handler.calls == dict.fromkeys(admitted, 1)
    assert all(_state(store, x) == ExecutionState.SUCCEEDED for x in admitted)
    assert tally.transactions == len(admitted) + 1


def test_a_pass_that_continues_stops_offering_once_its_timer_interval_has_passed(store: _Watched) -> None:
    admitted = _admit(store, 3)
    now = [0.0]

    class _Slow(CountingHandler):
        def execute(self, command: i.Command) -> i.CommandResult:
            now[0] += 5.0  # a handler that takes longer than the pass's timer interval (a second)
            return super().execute(command)

    worker = _worker(store, _Slow(), monotonic=lambda: now[0])
    report = worker.run_pass(max_claims=1, continues=True)
    worker.drop_read_ahead()
    # Past the interval no step is offered a claim: the pass ends at its one claim, and the next pass
    # looks at due timers before it claims again.
    assert report.claimed == admitted[:1]
    assert all(offer is None or offer.request is None for offer in store.offered)
    assert [_state(store, x) for x in admitted[1:]] == [ExecutionState.ELIGIBLE] * 2


def test_nothing_is_offered_where_the_pass_claims_no_more_or_the_worker_stops(store: _Watched) -> None:
    first, second = _admit(store, 2)
    handler = CountingHandler()
    assert _worker(store, handler).run_pass(max_claims=1).claimed == [first]
    assert store.offered == [None] and _state(store, second) == ExecutionState.ELIGIBLE
    stopping = _worker(store, handler, stopping=lambda: True)
    stopping.run_pass(max_claims=3)
    assert all(offer is None or offer.request is None for offer in store.offered)
    assert store.made[-1].then is None


def test_a_candidate_another_transaction_holds_is_passed_over(store: _Watched, pg_dsn: str, pg_schema: str) -> None:
    first, second = _admit(store, 2)
    handler = CountingHandler()
    with psycopg.connect(pg_dsn) as other:
        other.execute(f"SELECT 1 FROM {pg_schema}.workflow_dispatch WHERE workflow_execution_id = %s FOR UPDATE", (second,))
        report = _worker(store, handler).run_pass(max_claims=2)
        # The step never waited for the row: it finished its execution and claimed nothing.
        assert report.claimed == [first]
        assert store.made[0].then is None and _state(store, first) == ExecutionState.SUCCEEDED
    assert _worker(store, handler).run_pass(max_claims=1).claimed == [second]
    assert handler.calls == {first: 1, second: 1}


def test_a_lost_answer_after_the_step_leaves_the_claim_to_the_next_pass(store: _Watched) -> None:
    first, second = _admit(store, 2)
    handler = CountingHandler()
    worker = _worker(store, handler)
    store.fail_after = StoreError("store_unavailable", "the answer was lost")
    with pytest.raises(StoreError):
        worker.run_pass(max_claims=2)
    assert worker.holds_unfinished()
    assert _state(store, first) == ExecutionState.SUCCEEDED and _state(store, second) == ExecutionState.RUNNING
    report = worker.run_pass(max_claims=0)
    # Taken up under the offered token, its Command's handler called (never reconciled), once.
    assert second in report.claimed and not worker.holds_unfinished()
    assert _state(store, second) == ExecutionState.SUCCEEDED
    assert handler.calls == {first: 1, second: 1}


def test_an_interruption_after_the_step_hands_back_nothing_whose_command_may_run(store: _Watched) -> None:
    first, second = _admit(store, 2)
    handler = CountingHandler()
    store.fail_after = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        _worker(store, handler).run_pass(max_claims=2)
    # The claimed execution's intent committed: released, another worker would plan it again without
    # knowing whether the Command ran.  Its lease runs out into review instead, as after any such claim.
    view = store.read_for_visit(second)
    assert view is not None and view.execution.state == ExecutionState.RUNNING
    assert view.dispatch.leased_by == "w-1" and _state(store, first) == ExecutionState.SUCCEEDED
    assert handler.calls == {first: 1}


def test_only_the_synchronous_postgresql_store_composes_claims(tmp_path: Any) -> None:
    assert PostgresStore.composes_claims
    assert not AsyncPostgresStore.composes_claims
    assert not MemoryStore.composes_claims
    assert not SQLiteStore.composes_claims
    # On a store that does not, a worker's steps are offered nothing, and each execution is two transactions.
    sqlite = SQLiteStore(tmp_path / "x.db")
    try:
        admitted = _admit(sqlite, 2)
        handler = CountingHandler()
        with counting(sqlite) as tally:
            assert _worker(sqlite, handler).run_pass(max_claims=2).claimed == admitted
        assert tally.transactions == 4
    finally:
        sqlite.close()
