"""A composed transaction on PostgreSQL: its writes kept and sent with its COMMIT, its views made, not read.

The claim's locking read brings the execution's evidence; the claim's write
(or the step's) is kept, and the view the next visit plans from is made from
that evidence and the decision (``_PostgresBackend.write_and_view``).  What
these tests prove:

- a kept write whose guard fails on the server, whether at the COMMIT or
  ahead of a later statement of the transaction, and whether the
  transaction's decisions went as one statement or (a later guard not
  holding on the rows the one before left) one each, aborts the whole
  transaction: nothing of it is written, the request is decided again with
  its writes checked one by one, and the execution is claimed, stepped and
  finished exactly once;
- the view made from the kept writes is what the database reads after them:
  every PostgreSQL test checks that (``verify_views``, set by the
  ``pg_schema`` fixture); here a mistake in making it is shown to be caught,
  and an evidence object keeps, in the view, the kind it was stored as;
- a chain goes as one statement only where that commits what its decisions,
  one statement each, would: a later decision that revises an evidence
  object at another kind than it was stored as is refused, as it is alone,
  and one whose revision is not on top of the one before is named as it
  is alone;
- a decision written while the chain is kept (``write``) sends its own
  statement, after the chain's, and is told whether its own guard held.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.postgres_store import PostgresStore, _PostgresBackend, _same_view
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import NextVisit, StoreError, TransactionalStore, VisitView
from fencekeeper.adapters.testing.roundtrips import ONE_NODE, TWO_NODE
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionEvent, ExecutionState

BUSINESS = "b-1"
LEASE = timedelta(seconds=30)
PRINCIPAL = "user:operator"
WORKFLOWS = {"one-node": ONE_NODE, "two-node": TWO_NODE}
GRANTED = p.Authority(granted=True, principal_id=PRINCIPAL)
CLAIM = p.ClaimRequest("w-1", "t-1", LEASE)


class _Succeeds:
    def execute(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)

    def reconcile(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(pg_dsn, schema=pg_schema, pool_size=2)
    try:
        yield opened
    finally:
        opened.close()


def _admit(store: TransactionalStore, workflow: str) -> str:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(WORKFLOWS[workflow]), BUSINESS, PRINCIPAL, policy)
    outcome = service.run(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id=workflow,
        input={"order_id": "o-1"} if workflow == "two-node" else {},
    )
    assert isinstance(outcome, p.Decision) and outcome.execution is not None, outcome
    return outcome.execution.execution_id


def _stale(decision: p.Decision) -> p.Decision:
    """``decision`` with a guard no row matches: the execution's revision as it never was."""
    guard = decision.guard
    return attrs.evolve(decision, guard=attrs.evolve(guard, expected_revision=guard.expected_revision + 7))


@pytest.mark.parametrize("verify", [False, True], ids=["failing-at-the-commit", "failing-ahead-of-a-read"])
# The claim and the step are each the first of their transaction's decisions (the one statement's guard);
# a stale finalization follows one whose rows it does not match, so each decision goes as its own statement.
@pytest.mark.parametrize(
    ("workflow", "decision"), [("one-node", "claim"), ("two-node", "record_step"), ("one-node", "finalize")]
)
def test_a_kept_write_that_fails_on_the_server_is_decided_again_and_lands_once(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, workflow: str, decision: str, verify: bool
) -> None:
    # With verify_views the kept write is sent ahead of the read that checks the view (a later
    # statement of the transaction); without it, with the COMMIT.  Either way its guard fails there.
    monkeypatch.setattr(_PostgresBackend, "verify_views", verify)
    execution_id = _admit(store, workflow)
    real = getattr(p, decision)
    calls: list[p.Outcome] = []

    def stale_once(*args: Any) -> p.Outcome:
        outcome = real(*args)
        calls.append(outcome)
        return _stale(outcome) if len(calls) == 1 and isinstance(outcome, p.Decision) else outcome

    monkeypatch.setattr(p, decision, stale_once)
    sent: list[int] = []
    kept_and_viewed = _PostgresBackend._kept_and_viewed

    def counted(self: _PostgresBackend, *args: Any) -> VisitView:
        sent.append(1)
        return kept_and_viewed(self, *args)

    monkeypatch.setattr(_PostgresBackend, "_kept_and_viewed", counted)
    statements: list[int] = []
    chain_statements = _PostgresBackend._chain_statements

    def chained(self: _PostgresBackend) -> Any:
        built = chain_statements(self)
        statements.append(len(built))
        return built

    monkeypatch.setattr(_PostgresBackend, "_chain_statements", chained)
    worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), _Succeeds(), business_id=BUSINESS)
    report = worker.run_pass(max_claims=1)
    assert report.finished == {"succeeded": 1}, report
    # The stale decision's write was kept (its view made), failed on the server, and was decided again.
    assert len(calls) == 2 and sent
    # Its transaction's decisions went as one statement, or one each where a guard did not follow.
    assert statements[0] == (2 if decision == "finalize" else 1), statements
    found = store.read(execution_id)
    assert found is not None and found.execution.state == ExecutionState.SUCCEEDED
    events = [t.event for t in found.history]
    assert events.count(ExecutionEvent.CLAIM) == 1
    assert events.count(ExecutionEvent.FINALIZE_SUCCEEDED) == 1
    assert events.count(ExecutionEvent.RECORD_STEP) == (1 if workflow == "two-node" else 0)
    # One attempt per node visited, each at its last revision: nothing of the failed transaction.
    attempts = [e for e in found.evidence if e.kind == "StepAttempt"]
    assert len(attempts) == len({e.object_id for e in attempts}) == (2 if workflow == "two-node" else 1)


def test_the_check_of_made_views_sees_a_missing_object_a_body_and_a_lease(store: PostgresStore) -> None:
    # What every PostgreSQL test's check compares: an Evidence's equality leaves its body out, the check does not.
    execution_id = _admit(store, "two-node")
    worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), _Succeeds(), business_id=BUSINESS)
    assert worker.run_pass(max_claims=1).finished == {"succeeded": 1}
    read = store.read_for_visit(execution_id)
    assert read is not None and len(read.evidence) >= 2
    assert _same_view(read, store.read_for_visit(execution_id) or read)
    last = read.evidence[-1]
    changed_body = attrs.evolve(last, body={**last.body, "extra": 1})
    assert changed_body == last  # what the check must not rely on
    for wrong in (
        attrs.evolve(read, evidence=read.evidence[:-1]),
        attrs.evolve(read, evidence=(*read.evidence[:-1], changed_body)),
        attrs.evolve(read, evidence=tuple(reversed(read.evidence))),
        attrs.evolve(read, dispatch=attrs.evolve(read.dispatch, lease_token="another")),
    ):
        assert not _same_view(wrong, read)


def test_a_chain_goes_as_one_statement_only_where_no_part_needs_anothers_write() -> None:
    # A claim, then a finalization to waiting decided on the rows the claim left: one statement.
    from fencekeeper.adapters.postgres_store import _Link, _one_statement_holds  # noqa: PLC0415
    from tests.protocol.test_decisions import T0, admitted, decided, finalize_request  # noqa: PLC0415

    admission = admitted()
    claim = decided(p.claim(admission.execution, admission.dispatch, p.ClaimRequest("w-1", "t-1", LEASE), T0))
    assert claim.execution is not None and claim.dispatch is not None and claim.lease is not None
    before_claim = VisitView(admission.execution, admission.dispatch, ())
    after_claim = VisitView(claim.execution, claim.dispatch, ())
    snap = attrs.evolve(admission, execution=claim.execution, dispatch=claim.dispatch, credential=claim.lease)
    wait = decided(p.finalize(claim.execution, claim.dispatch, finalize_request(snap, ExecutionState.WAITING), T0))
    assert wait.registration is not None
    chain = [_Link(claim, (), before_claim), _Link(wait, (), after_claim)]
    assert _one_statement_holds(chain, T0)
    # A later guard that does not hold on the rows the one before left: one statement each.
    assert not _one_statement_holds([chain[0], attrs.evolve(chain[1], before=before_claim)], T0)
    # A registration before the last decision (a later one could close it), or two closings: one each.
    registering = attrs.evolve(claim, registration=wait.registration)
    assert not _one_statement_holds([attrs.evolve(chain[0], decision=registering), chain[1]], T0)
    closing = p.WaitClosure(wait.registration.key, ExecutionEvent.CANCEL)
    closes_twice = [
        attrs.evolve(chain[0], decision=attrs.evolve(claim, closes=closing)),
        attrs.evolve(chain[1], decision=attrs.evolve(wait, closes=closing)),
    ]
    assert not _one_statement_holds(closes_twice, T0)
    assert _one_statement_holds([closes_twice[0], chain[1]], T0)


def _stepping(*visits: tuple[Evidence, ...]) -> Any:
    """A planner that records one step at the current node per item of ``visits``, with its evidence, then stops.

    It plans from the view alone, as a worker's does: a request decided again plans the same steps.
    """

    def plan(view: VisitView, now: Any, credential: p.LeaseCredential) -> NextVisit | None:
        done = view.execution.step_count
        if done >= len(visits):
            return None
        step = p.StepRecord(view.execution.current_node_id, f"attempt-{done}")
        return NextVisit("step", p.StepRequest(credential, view.execution.revision, step, GRANTED), visits[done])

    return plan


CREATED = Evidence("x-1", "KindA", {"n": 1}, 1, "made")
"""An evidence object's first revision, and its next one at another kind: the object stays a KindA."""
RETYPED = Evidence("x-1", "KindB", {"n": 2}, 2, "made")


@pytest.mark.parametrize("verify", [False, True], ids=["as-a-worker-sends", "checking-views"])
def test_a_later_decision_revising_an_object_at_another_kind_is_refused_as_it_is_alone(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, verify: bool
) -> None:
    # One at a time, the second step's revision lands only on an object of its own kind
    # (_queue_evidence's compare-and-set), and there is none: evidence_conflict, as on every
    # store.  As one statement the object is inserted once, at the first step's kind, and the
    # second step's revision would be written beside it unchecked.
    monkeypatch.setattr(_PostgresBackend, "verify_views", verify)
    execution_id = _admit(store, "one-node")
    with pytest.raises(StoreError) as raised:
        store.claim_and_visit(CLAIM, _stepping((CREATED,), (RETYPED,)), business_id=BUSINESS)
    assert raised.value.code == "evidence_conflict", raised.value
    found = store.read(execution_id)
    assert found is not None and found.execution.state == ExecutionState.ELIGIBLE
    assert ExecutionEvent.CLAIM not in [t.event for t in found.history]
    assert "x-1" not in {e.object_id for e in found.evidence}


@pytest.mark.parametrize("verify", [False, True], ids=["as-a-worker-sends", "checking-views"])
def test_a_made_view_keeps_the_kind_an_object_was_stored_as(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, verify: bool
) -> None:
    # Within one decision every store stores an object at its first revision's kind
    # (_queue_evidence); the view the composed transaction hands back says what was stored.
    monkeypatch.setattr(_PostgresBackend, "verify_views", verify)
    execution_id = _admit(store, "one-node")
    composed = store.claim_and_visit(CLAIM, _stepping((CREATED, RETYPED)), business_id=BUSINESS)
    assert [type(outcome) for _, outcome in composed.followed] == [p.Decision]
    read = store.read_for_visit(execution_id)
    assert composed.view is not None and read is not None
    assert [(e.object_id, e.kind) for e in read.evidence][-1] == ("x-1", "KindA")
    assert _same_view(composed.view, read), (composed.view.evidence, read.evidence)


@pytest.mark.parametrize("verify", [False, True], ids=["as-a-worker-sends", "checking-views"])
def test_a_later_decisions_revision_gap_is_named_as_its_own_statement_names_it(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verify: bool
) -> None:
    # As one statement the chain's revisions of an object are checked together; the one
    # named is the one not on top of the one before it, as each decision alone (SQLite) names it.
    monkeypatch.setattr(_PostgresBackend, "verify_views", verify)
    second = Evidence("x-1", "KindA", {"n": 2}, 2, "made")
    gap = Evidence("x-1", "KindA", {"n": 4}, 4, "made")
    messages = []
    alone = SQLiteStore(tmp_path / "alone.db")
    try:
        for opened in (store, alone):
            _admit(opened, "one-node")
            with pytest.raises(StoreError) as raised:
                opened.claim_and_visit(CLAIM, _stepping((CREATED, second), (gap,)), business_id=BUSINESS)
            assert raised.value.code == "evidence_conflict", raised.value
            messages.append(str(raised.value))
    finally:
        alone.close()
    assert "revision 4 is not on top of revision 3" in messages[1], messages
    assert messages[0] == messages[1]


class _Rollback(Exception):
    pass


@pytest.mark.parametrize("holds", [True, False], ids=["its-guard-holds", "its-guard-fails"])
def test_a_write_after_kept_ones_is_sent_as_its_own_and_checked_as_its_own(store: PostgresStore, holds: bool) -> None:
    # The kept chain goes first (whatever is sent next sees it); the write after it is
    # its own statement, with its own values, and reports its own guard.
    execution_id = _admit(store, "one-node")
    claim = store.claim_next(CLAIM, business_id=BUSINESS)
    assert isinstance(claim, p.Decision) and claim.lease is not None
    lease = claim.lease
    with pytest.raises(_Rollback), store._transaction() as tx:
        tx.lock_for_visit(execution_id)
        now = tx.now(store.clock)
        execution, dispatch = tx.load(execution_id)
        assert execution is not None
        first = p.record_step(
            execution, dispatch, p.StepRequest(lease, execution.revision, p.StepRecord("start", "a-1"), GRANTED), now
        )
        assert isinstance(first, p.Decision)
        written, view = tx.write_and_view(first, (), now, execution_id)
        assert written and view is not None and tx.keeps_any()
        second = p.record_step(
            view.execution,
            view.dispatch,
            p.StepRequest(lease, view.execution.revision, p.StepRecord("start", "a-2"), GRANTED),
            now,
        )
        assert isinstance(second, p.Decision)
        if not holds:
            second = _stale(second)
        assert tx.write(second, (), now) is holds
        if holds:
            after = tx.view_so_far(execution_id)
            assert after is not None and after.execution == second.execution
        raise _Rollback
    found = store.read(execution_id)
    assert found is not None and found.execution.revision == execution.revision


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("workflow", ["one-node", "two-node"])
def test_every_revision_row_stores_its_own_body_whether_its_text_was_kept_from_a_made_view_or_not(
    store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, workflow: str, verify: bool
) -> None:
    # A body encoded for a made view is written from that text (_body_text), not encoded again:
    # each revision row must still hold exactly its own revision's canonical text.
    monkeypatch.setattr(_PostgresBackend, "verify_views", verify)
    execution_id = _admit(store, workflow)
    written: dict[tuple[str, int], str] = {}
    reused: list[str] = []
    body_text = _PostgresBackend._body_text

    def recorded(self: _PostgresBackend, item: Evidence) -> str:
        if id(item) in self._texts:
            reused.append(item.object_id)
        text = body_text(self, item)
        assert text == item.body_json(), item
        written[(item.object_id, item.revision)] = text
        return text

    monkeypatch.setattr(_PostgresBackend, "_body_text", recorded)
    worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), _Succeeds(), business_id=BUSINESS)
    report = worker.run_pass(max_claims=1)
    assert report.finished == {"succeeded": 1}, report
    # A view is made before its decision is written for the claim (which brings no evidence) and the
    # step; for the transaction's last decision only when views are checked (nothing plans from it).
    assert bool(reused) == (workflow == "two-node" or verify), reused
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            f"SELECT v.object_id, v.revision, v.body FROM {store.schema}.object_revisions v "  # type: ignore[arg-type]
            f"JOIN {store.schema}.objects o ON o.object_id = v.object_id WHERE o.parent_id = %s",
            (execution_id,),
        ).fetchall()
    stored = {(str(r[0]), int(r[1])): str(r[2]) for r in rows}
    # Every revision the worker wrote, and only those (the admission's input is the one before it).
    assert {key: stored[key] for key in written} == written
    assert len(stored) == len(written) + 1
