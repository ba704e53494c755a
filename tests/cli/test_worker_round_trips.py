"""What one worker sends to its database per execution, counted: a bound on round trips, not a timing.

What these tests prove, for one in-process worker driving executions the
way ``fencekeeper worker`` does (``run_pass`` with one claim at a time), with
a handler that does no I/O, after a warm-up (statements are prepared once
per connection):

- every decision is still made by the kernel under its own guard, and the
  intent is committed before the handler is called; a visit that calls no
  handler, and a Command's intent, join the transaction of the claim or
  step before it (specs/protocol.md, "Composed decisions"): a one-node
  execution is one write transaction (the claim and the finalization), a
  two-node one (``local_command`` then ``end``) two (the claim with the
  command's intent, committed before the handler is called; the step with
  its result and the finalization);
- nothing else is sent while the queue is busy: on PostgreSQL the locking
  read brings the execution's evidence, and the view each next visit plans
  from is made from it and the writes kept since (sent with the next ones);
  on SQLite it is read after the writes; the due-timer lookup waits for an
  empty queue or ``timer_interval``, and the definition revision comes
  from memory;
- the whole path stays within the bound measured when it was made:
  PostgreSQL 2 round trips per one-node execution and 4 per two-node one
  (each transaction: its locking read with BEGIN and the evidence read
  behind it, then every write it decided with COMMIT), SQLite 16 and 34
  statements.  A change that adds a round trip fails here;
- a pass that drains the queue, as ``fencekeeper worker`` runs it, sends
  each next claim's locking read on PostgreSQL behind the COMMIT that
  finished the execution before (``NextClaim``); a two-node execution's
  step, which finalizes it, makes the next claim and its Command's intent in
  its own transaction, and a one-node execution's claim, which finalizes it,
  makes the next three claims and their finalizes (``NextClaim.request`` and
  ``more``): a quarter of a round trip and of a write transaction per
  one-node execution, 2 round trips and one write transaction per two-node
  one, every decision still under its own guard;
- an admission through ``service.run`` is one transaction: on PostgreSQL 1
  round trip once the store has admitted one of the definition (its facts
  predicted and checked by the write, ``PostgresStore.admit_run``), 9
  statements on SQLite; a refused one writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.postgres_store import PostgresStore, _PostgresBackend
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.adapters.testing.roundtrips import ONE_NODE, TWO_NODE, Tally, counting
from fencekeeper.adapters.worker import CLAIMS_PER_TRANSACTION, Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState

BUSINESS = "b-1"
PRINCIPAL = "user:operator"
WARM = 3
COUNTED = 10

# (workflow, write transactions, PostgreSQL round trips, SQLite statements) per execution.
# Each decision's outbox row is one more statement on SQLite; on PostgreSQL it
# travels in the decision's one write statement.
BOUNDS = {"one-node": (ONE_NODE, 1, 2, 16), "two-node": (TWO_NODE, 2, 4, 34)}


class _Handler:
    """Applies nothing; records, for each Command, whether its intent was committed when it was called."""

    def __init__(self) -> None:
        self.store: TransactionalStore | None = None
        self.intent_committed: list[bool] = []

    def execute(self, command: i.Command) -> i.CommandResult:
        if self.store is not None:
            # read() is a transaction of its own: it sees only what has been committed.
            view = self.store.read(command.execution_id)
            self.intent_committed.append(
                view is not None
                and {command.command_id, command.attempt_id} <= {e.object_id for e in view.evidence}
            )
        return i.CommandResult(i.CommandStatus.SUCCEEDED)

    def reconcile(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore]:
    if request.param == "sqlite":
        opened: TransactionalStore = SQLiteStore(tmp_path / "count.db")
    else:
        schema = request.getfixturevalue("pg_schema")
        # The check of views made from kept writes reads each one back: not what a worker sends.
        request.getfixturevalue("monkeypatch").setattr(_PostgresBackend, "verify_views", False)
        opened = PostgresStore(request.getfixturevalue("pg_dsn"), schema=schema, pool_size=2)
    try:
        yield opened
    finally:
        opened.close()


def _admit(store: TransactionalStore, workflow: str, text: str, count: int) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(text), BUSINESS, PRINCIPAL, policy)
    for n in range(count):
        outcome = service.run(
            store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id=workflow,
            input={"order_id": f"o-{n}"} if workflow == "two-node" else {},
        )
        assert isinstance(outcome, p.Decision), outcome


def _one_each(worker: Worker, count: int) -> Any:
    """``count`` passes that each claim one execution and drive it to succeeded."""
    for _ in range(count):
        report = worker.run_pass(max_claims=1)
        assert not report.refused, report.refused
        assert len(report.claimed) == 1 and report.finished == {"succeeded": 1}, report


@pytest.mark.parametrize("workflow", sorted(BOUNDS))
def test_round_trips_per_execution_stay_within_the_bound(store: TransactionalStore, workflow: str) -> None:
    text, writes, pg_bound, sqlite_bound = BOUNDS[workflow]
    handler = _Handler()
    # A process clock that stands still: the due-timer lookup is paced by it (at most once per
    # timer_interval while every pass finds work), and a loaded machine must not change the count.
    worker = Worker(
        store, "w-1", examples.grants(BUSINESS, PRINCIPAL), handler, business_id=BUSINESS, monotonic=lambda: 0.0
    )
    _admit(store, workflow, text, WARM + COUNTED)
    _one_each(worker, WARM)
    tally: Tally
    with counting(store) as tally:
        _one_each(worker, COUNTED)
    bound = sqlite_bound if isinstance(store, SQLiteStore) else pg_bound
    assert tally.write_transactions == writes * COUNTED, tally
    assert tally.round_trips <= bound * COUNTED, (tally.round_trips / COUNTED, bound)
    # The transactions are all there: not fewer round trips by skipping one.  On PostgreSQL a write
    # transaction is at least two (BEGIN with the locking read, the writes with COMMIT); on SQLite,
    # BEGIN and COMMIT and more.
    assert tally.round_trips >= 2 * tally.write_transactions


# Per execution in a pass that drains the queue (PostgreSQL round trips, write transactions, and the write
# transactions the pass adds besides the claim that finds nothing: a two-node pass's first claim, whose
# execution's step is its own), and what a pass adds once: the due-timer lookups at its start and end, its
# first claim's transaction, and the last read ahead, which finds nothing and is rolled back, before the
# claim that ends the pass.  A one-node pass's claims each claim four (the warm-up pass's last claim
# finished its execution: the worker offers the claims after from the first).
DRAINED = {"one-node": (Fraction(1, CLAIMS_PER_TRANSACTION), Fraction(1, CLAIMS_PER_TRANSACTION), 0), "two-node": (2, 1, 1)}
PER_PASS = 7


@pytest.mark.parametrize("workflow", sorted(BOUNDS))
def test_a_draining_pass_reads_each_next_claim_ahead(store: TransactionalStore, workflow: str) -> None:
    text, writes, pg_bound, sqlite_bound = BOUNDS[workflow]
    handler = _Handler()
    worker = Worker(
        store, "w-1", examples.grants(BUSINESS, PRINCIPAL), handler, business_id=BUSINESS, monotonic=lambda: 0.0
    )
    _admit(store, workflow, text, WARM)
    worker.run_pass()
    drained = 2 * COUNTED
    _admit(store, workflow, text, drained)
    with counting(store) as tally:
        report = worker.run_pass()
    assert len(report.claimed) == drained and report.finished == {"succeeded": drained}, report
    if isinstance(store, SQLiteStore):
        # Every decision's transaction is there, and the claim that found nothing.
        assert tally.write_transactions == writes * drained + 1, tally
        assert tally.round_trips <= sqlite_bound * drained + PER_PASS * 4, tally
        return
    round_trips, transactions, first = DRAINED[workflow]
    # On PostgreSQL a transaction that finalizes makes the next claim too: one transaction for every four
    # one-node executions, or for every two-node one, the first claim's own, and the claim that found nothing.
    assert tally.write_transactions == transactions * drained + first + 1, tally
    assert tally.round_trips <= round_trips * drained + PER_PASS, (tally.round_trips, drained)
    assert round_trips < pg_bound


def test_the_intent_is_committed_before_the_handler_is_called(store: TransactionalStore) -> None:
    handler = _Handler()
    handler.store = store
    worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), handler, business_id=BUSINESS)
    _admit(store, "two-node", TWO_NODE, 3)
    _one_each(worker, 3)
    assert handler.intent_committed == [True, True, True]


# Admission through service.run: one transaction (the registration check, the definition's
# revision and the admission are one decision), PostgreSQL round trips and SQLite statements.
# On PostgreSQL, after the warm-up: BEGIN, the writes (checking the facts predicted), NOTIFY and COMMIT.
ADMISSION_BOUND = {"postgresql": 1, "sqlite": 9}


@pytest.mark.parametrize("revision", [None, 1])
def test_an_admission_is_one_transaction_within_the_bound(store: TransactionalStore, revision: int | None) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, policy)

    def admit(n: int) -> None:
        outcome = service.run(
            store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
            input={"order_id": f"o-{n}"}, revision=revision,
        )
        assert isinstance(outcome, p.Decision), outcome

    for n in range(WARM):
        admit(n)
    with counting(store) as tally:
        for n in range(WARM, WARM + COUNTED):
            admit(n)
    bound = ADMISSION_BOUND["sqlite" if isinstance(store, SQLiteStore) else "postgresql"]
    assert tally.transactions == COUNTED and tally.write_transactions == COUNTED, tally
    assert tally.round_trips <= bound * COUNTED, (tally.round_trips / COUNTED, bound)
    assert len(store.execution_ids()) == WARM + COUNTED


def test_a_refused_admission_writes_nothing(store: TransactionalStore) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, policy)
    # Bad input is found inside the admission's transaction: it rolls back, nothing is written.
    with pytest.raises(service.OperationError) as missing_input:
        service.run(store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node", input={})
    assert "order_id" in str(missing_input.value)
    # A revision that was never registered is not admitted, and neither is an unknown definition.
    for definition_id, revision in (("two-node", 2), ("nowhere", None)):
        with pytest.raises(service.OperationError) as not_found:
            service.run(
                store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id=definition_id,
                input={"order_id": "o-1"}, revision=revision,
            )
        assert not_found.value.code == "definition_not_found"
    assert store.execution_ids() == []
    # The same identity twice: the second is refused and the first stays as it was.
    first = service.run(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
        input={"order_id": "o-1"}, execution_id="x-1",
    )
    assert isinstance(first, p.Decision)
    again = service.run(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
        input={"order_id": "o-2"}, execution_id="x-1",
    )
    assert isinstance(again, p.Refusal) and again.code == p.RefusalCode.ALREADY_EXISTS
    assert store.execution_ids() == ["x-1"]


THREE_NODE = """
id = "three-node"
revision = 1
start = "ship"
inputs = ["order_id"]

[[nodes]]
id = "ship"
kind = "local_command"
revision = 1
operation = "order.ship"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "shipped"
on_failure = "failed"

[[nodes]]
id = "shipped"
kind = "condition"
revision = 1
expression = "input.order_id == 'o-1'"
bindings = ["input.order_id"]
true_next = "bill"
false_next = "done"

[[nodes]]
id = "bill"
kind = "local_command"
revision = 1
operation = "order.bill"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "done"
on_failure = "failed"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "failed"
kind = "end"
revision = 1
outcome = "failed"
error_code = "ship_failed"
"""


def test_the_view_a_transaction_hands_back_is_what_a_fresh_read_sees(store: TransactionalStore) -> None:
    # The claim's and each step's transaction read the view after their last write; once committed, a
    # read of its own must see exactly that view, or the next visit would plan from something never
    # committed.  A transaction whose last visit finalized hands back none, and its execution has left
    # running; one whose last visit issued a Command hands back none either, and its intent is
    # committed.  "three-node": every claim issues the shipping Command in its transaction; o-1's
    # result step passes the condition and issues the billing Command in one transaction, o-0's and
    # o-2's pass the condition and end.
    seen: list[tuple[str, tuple[str, ...], bool]] = []

    def checked(name: str) -> Any:
        original = getattr(store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            composed = original(*args, **kwargs)
            assert isinstance(composed.outcome, p.Decision), (name, composed)
            assert all(isinstance(outcome, p.Decision) for _, outcome in composed.followed), composed.followed
            execution_id = composed.outcome.execution.execution_id
            fresh = store.read_for_visit(execution_id)
            assert fresh is not None
            if composed.view is not None:
                assert composed.view == fresh, name
            elif composed.followed[-1][0].kind == "intent":
                # The Command's intent committed with the rest; the handler is called next.
                assert fresh.execution.state == ExecutionState.RUNNING
                assert "issued" in {e.state for e in fresh.evidence if e.kind == i.COMMAND}
            else:
                assert composed.followed[-1][0].kind == "finish" and fresh.execution.state != ExecutionState.RUNNING
            seen.append((name, tuple(visit.kind for visit, _ in composed.followed), composed.view is not None))
            return composed

        return call

    store.claim_and_visit = checked("claim_and_visit")  # type: ignore[method-assign]
    store.record_step_and_visit = checked("record_step_and_visit")  # type: ignore[method-assign]
    worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), _Handler(), business_id=BUSINESS)
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(THREE_NODE), BUSINESS, PRINCIPAL, policy)
    for n in range(3):
        outcome = service.run(
            store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="three-node",
            input={"order_id": f"o-{n}"}, execution_id=f"x-{n}",
        )
        assert isinstance(outcome, p.Decision), outcome
    _one_each(worker, 3)
    ship_then_end = [("claim_and_visit", ("intent",), False), ("record_step_and_visit", ("step", "finish"), False)]
    ship_then_bill = [
        ("claim_and_visit", ("intent",), False),
        ("record_step_and_visit", ("step", "intent"), False),
        ("record_step_and_visit", ("finish",), False),
    ]
    assert seen == ship_then_end + ship_then_bill + ship_then_end
