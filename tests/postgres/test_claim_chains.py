"""A claim's transaction that finalizes its execution claims the worker's next ones, on PostgreSQL.

specs/protocol.md, "Composed decisions": after a finalize the same worker's
claim of another execution, and that claim's visits, may join the
transaction, each under its own guard; a claim's transaction is one such
chain as much as a step's is (the model checker's composed configurations
reach claim, finalize, claim, finalize).  A worker whose last claim finished
its execution in the claim's own transaction (one-node work) offers its next
claim up to ``CLAIMS_PER_TRANSACTION - 1`` claims after (``NextClaim.request``
and ``more``); the PostgreSQL store then locks that many candidates more with
the claim's one locking read (``SKIP LOCKED``) and reads every execution's
evidence behind it, so each further claim costs no exchange of its own, and
up to four executions commit with one ``COMMIT``.  What these tests prove:

- a draining pass of one-node executions claims them four to a transaction,
  each claim with its own token, and every view the store made is what the
  database reads (``verify_views``, on for every PostgreSQL test); a pass
  offers no more claims than its ``max_claims`` leaves room for;
- the first claim of a worker, and any claim after one whose execution went
  on to a handler, offers nothing: two-node work never locks a candidate it
  cannot use;
- a candidate after an execution the transaction does not finalize is left
  eligible, its lock gone with the ``COMMIT``; one another transaction holds
  is passed over; one whose row is malformed is not claimed, and the
  worker's own next claim passes over it as always;
- an execution claimed after another's finalize whose next visit calls a
  handler commits its Command's intent in that transaction, ends the chain,
  and the pass calls the handler, once;
- an answer lost after such a transaction committed leaves nothing behind:
  the next pass looks up every offered token in order and finds the claim
  whose Command's intent committed, its handler called, never reconciled;
  an interruption there hands back nothing whose Command may run.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.store import (
    Composed,
    NextClaim,
    NextVisit,
    Planner,
    StoreError,
    TransactionalStore,
    VisitView,
)
from fencekeeper.adapters.testing.roundtrips import ONE_NODE, TWO_NODE, counting
from fencekeeper.adapters.worker import CLAIMS_PER_TRANSACTION, Worker
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState
from tests.postgres.claiming import CountingHandler, Watching, admit_in_order

BUSINESS = "b-1"
PRINCIPAL = "user:operator"
POLICY = examples.grants(BUSINESS, PRINCIPAL)


class _Watched(Watching, PostgresStore):
    """The store, keeping what each claim's transaction was offered and what it made; optionally failing once after it."""

    unplanned: frozenset[str] = frozenset()
    """Executions whose visits the planner leaves to the worker (it plans none in the transaction)."""

    def claim_and_visit(
        self, request: p.ClaimRequest, plan: Planner, *args: Any, next_claim: NextClaim | None = None, **kwargs: Any
    ) -> Composed:
        def planner(view: VisitView, now: datetime, credential: p.LeaseCredential) -> NextVisit | None:
            return None if view.execution.execution_id in self.unplanned else plan(view, now, credential)

        return self.watch(
            next_claim,
            lambda: super(_Watched, self).claim_and_visit(request, planner, *args, next_claim=next_claim, **kwargs),
        )


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[_Watched]:
    watched = _Watched(pg_dsn, schema=pg_schema, pool_size=2)
    watched.offered, watched.made = [], []
    for text in (ONE_NODE, TWO_NODE):
        service.register(watched, parse_definition(text), BUSINESS, PRINCIPAL, POLICY)
    try:
        yield watched
    finally:
        watched.close()


def _admit(store: TransactionalStore, *workflows: str) -> list[str]:
    return admit_in_order(store, BUSINESS, PRINCIPAL, *workflows)


def _worker(store: TransactionalStore, handler: CountingHandler, **kwargs: Any) -> Worker:
    # A process clock that stands still: a loaded machine must not end the pass's timer interval early.
    kwargs.setdefault("monotonic", lambda: 0.0)
    return Worker(store, "w-1", POLICY, handler, business_id=BUSINESS, **kwargs)


def _state(store: TransactionalStore, execution_id: str) -> ExecutionState:
    view = store.read_for_visit(execution_id)
    assert view is not None
    return view.execution.state


def _offers(store: _Watched) -> list[bool]:
    return [offer is not None and offer.request is not None for offer in store.offered]


def _warmed(store: _Watched, handler: CountingHandler) -> Worker:
    """A worker whose last claim finished its one-node execution in the claim's transaction: it offers next."""
    (warm,) = _admit(store, "one-node")
    worker = _worker(store, handler)
    assert worker.run_pass(max_claims=1).claimed == [warm]
    store.offered.clear()
    store.made.clear()
    return worker


def _chain(composed: Composed) -> list[Composed]:
    """The claims a transaction made after finalizes, in order."""
    made = []
    while composed.then is not None:
        composed = composed.then
        made.append(composed)
    return made


def test_a_draining_pass_claims_one_node_executions_four_to_a_transaction(store: _Watched) -> None:
    admitted = _admit(store, *["one-node"] * 7)
    worker = _worker(store, CountingHandler())
    with counting(store) as tally:
        report = worker.run_pass()
        worker.drop_read_ahead()
    assert CLAIMS_PER_TRANSACTION == 4
    assert report.claimed == admitted and report.finished == {"succeeded": 7}
    assert all(_state(store, x) == ExecutionState.SUCCEEDED for x in admitted)
    # The first claim offers nothing (nothing yet says the work is one-node); then each claim offers three,
    # and claims each next after the one before finalized: 1; 2 to 5; 6 and 7; the claim that finds nothing.
    assert _offers(store) == [False, True, True, True]
    assert tally.write_transactions == 4
    assert [len(_chain(made)) for made in store.made] == [0, 3, 1, 0]
    for offer, made in zip(store.offered[1:3], store.made[1:3], strict=True):
        assert offer is not None and offer.request is not None
        tokens = [offer.request.lease_token, *(more.lease_token for more in offer.more)]
        assert len(tokens) == CLAIMS_PER_TRANSACTION - 1
        for then, token in zip(_chain(made), tokens, strict=False):
            # Claimed with the token offered for it, a fence of its own, and finalized in the same transaction.
            assert isinstance(then.outcome, p.Decision) and then.outcome.lease is not None
            assert then.outcome.lease.lease_token == token
            assert [visit.kind for visit, _ in then.followed] == ["finish"]
    assert store.made[3].outcome is None and store.made[3].then is None


def test_a_pass_offers_no_more_claims_than_its_max_claims_leaves_room_for(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    admitted = _admit(store, *["one-node"] * 6)
    report = worker.run_pass(max_claims=3)
    worker.drop_read_ahead()
    assert report.claimed == admitted[:3]
    offer = store.offered[0]
    assert offer is not None and offer.request is not None and len(offer.more) == 1
    assert [_state(store, x) for x in admitted[3:]] == [ExecutionState.ELIGIBLE] * 3


def test_a_chain_ends_at_an_execution_that_goes_on_to_its_handler(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, command, last = _admit(store, "one-node", "two-node", "one-node")
    report = worker.run_pass(max_claims=3)
    worker.drop_read_ahead()
    # Claimed after the first's finalize, the second committed its Command's intent, which ends the chain: the
    # third candidate, locked by the claim's read, was left, and the second's step claimed it after its own
    # finalize.
    assert [len(_chain(made)) for made in store.made] == [1]
    assert [visit.kind for visit, _ in _chain(store.made[0])[0].followed] == ["intent"]
    assert report.claimed == [first, command, last] and handler.calls == {command: 1}
    assert all(_state(store, x) == ExecutionState.SUCCEEDED for x in (first, command, last))


def test_a_lost_answer_after_a_chain_takes_up_each_claim_in_order(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, second, third = _admit(store, "one-node", "one-node", "two-node")
    store.fail_after = StoreError("store_unavailable", "the answer was lost")
    with pytest.raises(StoreError):
        worker.run_pass(max_claims=3)
    assert worker.holds_unfinished()
    assert [_state(store, x) for x in (first, second)] == [ExecutionState.SUCCEEDED] * 2
    assert _state(store, third) == ExecutionState.RUNNING
    report = worker.run_pass(max_claims=0)
    # The first two tokens name no running execution (each finished); the third's is taken up, and its
    # Command's handler called (its intent kept through the two look-ups, never reconciled), once.
    assert report.claimed == [third] and not worker.holds_unfinished()
    assert _state(store, third) == ExecutionState.SUCCEEDED
    assert handler.calls == {third: 1}


def test_two_node_work_offers_nothing_with_its_claims(store: _Watched) -> None:
    admitted = _admit(store, *["two-node"] * 3)
    handler = CountingHandler()
    report = _worker(store, handler).run_pass()
    assert report.claimed == admitted and handler.calls == dict.fromkeys(admitted, 1)
    # Its steps claim next (tests/postgres/test_claim_after_finalize.py); its claims lock one candidate.
    assert not any(_offers(store))


def test_a_second_candidate_the_claimed_execution_does_not_finalize_before_is_left_to_the_next_claim(
    store: _Watched,
) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    command, after = _admit(store, "two-node", "one-node")
    report = worker.run_pass(max_claims=2)
    # Offered (the last claim finished its execution), the claim's execution went on to its handler: the
    # second candidate, locked by the claim's read, was not claimed, and its lock went with the COMMIT,
    # so the step's own claim after its finalize (SKIP LOCKED) found it.
    assert _offers(store) == [True] and store.made[0].then is None
    assert report.claimed == [command, after] and handler.calls == {command: 1}
    assert [_state(store, x) for x in (command, after)] == [ExecutionState.SUCCEEDED] * 2


def test_an_execution_claimed_second_commits_its_commands_intent_and_is_driven_next(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, second = _admit(store, "one-node", "two-node")
    report = worker.run_pass(max_claims=2)
    assert report.claimed == [first, second]
    then = store.made[0].then
    assert then is not None and [visit.kind for visit, _ in then.followed] == ["intent"]
    assert [_state(store, x) for x in (first, second)] == [ExecutionState.SUCCEEDED] * 2
    assert handler.calls == {second: 1}


def test_a_second_candidate_another_transaction_holds_is_passed_over(
    store: _Watched, pg_dsn: str, pg_schema: str
) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, held, third = _admit(store, *["one-node"] * 3)
    with psycopg.connect(pg_dsn) as other:
        other.execute(f"SELECT 1 FROM {pg_schema}.workflow_dispatch WHERE workflow_execution_id = %s FOR UPDATE", (held,))
        report = worker.run_pass(max_claims=2)
        worker.drop_read_ahead()
        # The claim never waited for the row: it locked the next one instead, and claimed it after the first.
        assert report.claimed == [first, third]
        then = store.made[0].then
        assert then is not None and isinstance(then.outcome, p.Decision) and then.outcome.execution is not None
        assert then.outcome.execution.execution_id == third
        assert _state(store, held) == ExecutionState.ELIGIBLE
    assert _worker(store, handler).run_pass(max_claims=1).claimed == [held]


def test_a_malformed_second_candidate_is_not_claimed_and_is_passed_over_after(
    store: _Watched, pg_dsn: str, pg_schema: str
) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, damaged, third = _admit(store, *["one-node"] * 3)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {pg_schema}.objects SET revision = 99 WHERE object_id = %s", (damaged,))
    report = worker.run_pass()
    worker.drop_read_ahead()
    # Claimed first with the damaged row locked behind it: nothing was made of that row there.  The
    # worker's next claim met it at the head of the queue and passed over it, as any claim does.
    assert store.made[0].then is None
    assert report.claimed == [first, third] and [r.execution_id for r in report.malformed] == [damaged]
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f"SELECT revision FROM {pg_schema}.objects WHERE object_id = %s", (damaged,)).fetchone()
    assert row == (99,)


def test_a_lost_answer_after_the_claim_leaves_the_second_claim_to_the_next_pass(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, second = _admit(store, "one-node", "two-node")
    store.fail_after = StoreError("store_unavailable", "the answer was lost")
    with pytest.raises(StoreError):
        worker.run_pass(max_claims=2)
    assert worker.holds_unfinished()
    assert _state(store, first) == ExecutionState.SUCCEEDED and _state(store, second) == ExecutionState.RUNNING
    report = worker.run_pass(max_claims=0)
    # The first claim's token names no running execution (it finished); the second's is taken up, and its
    # Command's handler called (its intent kept, never reconciled), once.
    assert report.claimed == [second] and not worker.holds_unfinished()
    assert _state(store, second) == ExecutionState.SUCCEEDED
    assert handler.calls == {second: 1}


def test_an_interruption_after_the_claim_hands_back_nothing_whose_command_may_run(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, second = _admit(store, "one-node", "two-node")
    store.fail_after = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        worker.run_pass(max_claims=2)
    # The second execution's intent committed: released, another worker would plan it again without
    # knowing whether the Command ran.  Its lease runs out into review instead, as after any such claim.
    view = store.read_for_visit(second)
    assert view is not None and view.execution.state == ExecutionState.RUNNING
    assert view.dispatch.leased_by == "w-1" and _state(store, first) == ExecutionState.SUCCEEDED
    assert handler.calls == {}


def test_an_interruption_after_the_claim_hands_back_a_second_claim_that_issued_nothing(store: _Watched) -> None:
    handler = CountingHandler()
    worker = _warmed(store, handler)
    first, second = _admit(store, "one-node", "one-node")
    # The second claim's visits are left to the worker (none planned in the transaction), and the
    # interruption lands before it drives them: its lease is handed back, not left to expire into review.
    store.unplanned = frozenset({second})
    store.fail_after = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        worker.run_pass(max_claims=2)
    assert _state(store, first) == ExecutionState.SUCCEEDED
    view = store.read_for_visit(second)
    assert view is not None and view.execution.state == ExecutionState.ELIGIBLE and view.dispatch.leased_by is None
