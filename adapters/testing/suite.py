"""Conformance tests every store inherits: the protocol through the Store port, request by request.

Subclass :class:`StoreTests` and provide a ``store_factory`` fixture; each
test below then runs against that store.  What the tests prove:

- every decision (admit, claim, renew, record_step, release, finalize to
  each of the five targets, wake by event, decision, timer and timeout,
  cancel, the four recovery decisions) writes exactly what the kernel
  decided, and ``read()`` shows it: the current rows, every revision
  (1..n, each equal to the execution after that write), every transition
  record in order, registrations, recovery records and evidence;
- every refusal carries the kernel's exact :class:`RefusalCode` and leaves
  the store exactly as it was: the whole ``read()`` view of every
  execution, ``execution_ids()`` and ``expired()`` are compared before and
  after (nothing partial is ever visible);
- claims go in ``eligible_at`` then ``workflow_execution_id`` order, only
  when due, scoped by business when asked, and ``claim_next`` returns None
  when nothing is due;
- a zombie (a worker whose lease expired and was quarantined, resumed and
  claimed by another worker) can no longer renew, step, release, finalize
  or attach evidence, and each attempt changes nothing;
- evidence commits with its decision and only with it; an evidence id used
  twice is a ``StoreError('evidence_conflict')`` that changes nothing, and a
  wait registration key used twice a ``StoreError('registration_conflict')``
  that changes nothing (a woken registration is never reopened);
- ``expired()`` lists exactly the running executions whose lease has
  expired (``lease_expires_at <= now``).
- what the interpreter needs: an evidence revision lands only on top of the
  one before it, on the same execution's object (``evidence_conflict``
  otherwise, naming the object and changing nothing, including for an
  object nobody made); a definition registers each revision once,
  identically or not at all, per Business; an Event wakes exactly the
  waiters of its Business and type whose predicates it matches, with the
  continuation the registration committed, is idempotent when republished
  and refused with other content; an Event committed before a waiter
  registers wakes it as it registers; a timeout is due at the commit time
  plus its delay and wakes as ``timeout``; the first approval determination
  wins, a duplicate is ``Unchanged``, a contradicting one is kept in history,
  and a misbound, unauthorized, out-of-scope, self-approving or foreign
  decision writes nothing.

Sources: the workflow execution contract (seed 000), sections Persistence,
Lease, Fenced Execution Finalization, Expired-lease quarantine, Safe-resume
proof, wait_for_event and Cancellation; seed 001 for the fence.

Every test is fast (no sleeping: the store's clock is a ManualClock the
test moves), so the whole suite runs in seconds against a real database.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest

from fencekeeper.adapters.store import Evidence, ExecutionView, ManualClock, Store, StoreError, VisitView
from fencekeeper.adapters.testing.concurrency import RendezvousClock
from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition, DefinitionError, definition_from_mapping
from fencekeeper.kernel.events import Event
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState, dispatch_state_of

StoreFactory = Callable[[ManualClock], Store]
"""Takes the clock the store must read its time from; returns a fresh, empty store."""

RC = p.RefusalCode

GOVERNOR = "ops"
GRANTED = p.Authority(True, GOVERNOR)
DENIED = p.Authority(False, "mallory", "no grant for this business")
LEASE = timedelta(seconds=30)
EVENT_TYPE = "payment.received"
CORRELATION = (("order", "o-1"),)
CONTRACT = "idempotent by command identity"
"""The reason a resume in these tests gives; the kernel derives the rest of the proof from the store."""

_tokens = itertools.count(1)


# --- helpers a third party may reuse -------------------------------------------------------


def decided(outcome: p.Outcome | None) -> p.Decision:
    """``outcome`` must be a Decision (the request was applied)."""
    assert isinstance(outcome, p.Decision), f"expected a Decision, got {outcome!r}"
    return outcome


def admit(store: Store, execution_id: str = "e-1", business_id: str = "b-1") -> p.Decision:
    return decided(store.admit(p.AdmitRequest(execution_id, business_id, "d-1", 1, "start", GRANTED)))


def claim(
    store: Store, worker_id: str = "w-1", *, business_id: str | None = None, lease: timedelta = LEASE
) -> tuple[str, p.LeaseCredential]:
    """Claim the next eligible execution with a fresh token; its id and the credential."""
    outcome = decided(
        store.claim_next(p.ClaimRequest(worker_id, f"t-{next(_tokens)}", lease), business_id=business_id)
    )
    assert outcome.execution is not None and outcome.lease is not None
    return outcome.execution.execution_id, outcome.lease


def view(store: Store, execution_id: str) -> ExecutionView:
    found = store.read(execution_id)
    assert found is not None, f"read({execution_id!r}) returned None"
    return found


def revision(store: Store, execution_id: str) -> int:
    return view(store, execution_id).execution.revision


def finalize_request(
    store: Store,
    execution_id: str,
    credential: p.LeaseCredential,
    target: ExecutionState | str,
    /,
    **changes: Any,
) -> p.FinalizeRequest:
    """A finalize request that passes every precondition unless ``changes`` break one."""
    fields: dict[str, Any] = {
        "execution_id": execution_id,
        "dispatch_id": execution_id,
        "worker_id": credential.worker_id,
        "lease_token": credential.lease_token,
        "fence": credential.fence,
        "target_state": target,
        "business_id": view(store, execution_id).execution.business_id,
        "expected_revision": revision(store, execution_id),
        "authority": p.Authority(True, credential.worker_id),
    }
    fields.update(changes)
    return p.FinalizeRequest(**fields)


def step_request(store: Store, execution_id: str, credential: p.LeaseCredential, /, **changes: Any) -> p.StepRequest:
    fields: dict[str, Any] = {
        "credential": credential,
        "expected_revision": revision(store, execution_id),
        "step": p.StepRecord("n-1", f"a-{next(_tokens)}"),
        "authority": p.Authority(True, credential.worker_id),
    }
    fields.update(changes)
    return p.StepRequest(**fields)


def recovery_request(
    store: Store, execution_id: str, kind: p.RecoveryKind, command_id: str, /, **changes: Any
) -> p.RecoveryRequest:
    fields: dict[str, Any] = {
        "command_id": command_id,
        "kind": kind,
        "execution_id": execution_id,
        "business_id": view(store, execution_id).execution.business_id,
        "expected_revision": revision(store, execution_id),
        "actor_id": GOVERNOR,
        "authority": GRANTED,
        "command_to_reconcile": "cmd-1" if kind == p.RecoveryKind.RECONCILE_COMMAND else None,
    }
    if kind in (p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.RESUME_SUSPENDED):
        # A resume is decided on the pinned definition as the store holds it.
        register_pinned(store, fields["business_id"])
        fields["next_node_id"] = view(store, execution_id).execution.current_node_id
        fields["rationale"] = CONTRACT
    fields.update(changes)
    return p.RecoveryRequest(**fields)


def register_pinned(store: Store, business_id: str = "b-1") -> None:
    """Register ``d-1`` revision 1 (node ``start``), the definition :func:`admit` pins, if it is not there."""
    # A test that registered its own revision 1 has its resume decided on that one.
    with contextlib.suppress(DefinitionError):
        store.register_definition(_definition(1), business_id, GRANTED)


LOAD_TEST_NODES = ("start", "work", "end")
"""The nodes the load and crash tests' executions visit."""


def resume_at_current_node(
    store: Store, found: ExecutionView, command_id: str, actor_id: str, authority: p.Authority
) -> p.RecoveryRequest:
    """resume_safe of a load-test execution at its current node, after registering the definition it pins.

    The kernel derives the safe-resume proof from what the store holds, so
    the pinned definition must be registered; these tests' executions visit
    only :data:`LOAD_TEST_NODES`, and their visits issue no Command.
    """
    execution = found.execution
    definition = definition_from_mapping(
        {
            "id": execution.definition_id,
            "revision": execution.definition_revision,
            "start": "start",
            "nodes": [
                # start and work each continue to the next node either way, so all three are reachable.
                *(
                    {"id": n, "kind": "condition", "revision": 1, "expression": "true", "bindings": [],
                     "true_next": nxt, "false_next": nxt}
                    for n, nxt in itertools.pairwise(LOAD_TEST_NODES)
                ),
                {"id": LOAD_TEST_NODES[-1], "kind": "end", "revision": 1, "outcome": "succeeded"},
            ],
        }
    )
    store.register_definition(definition, execution.business_id, p.Authority(True, "admin"))
    return p.RecoveryRequest(
        command_id,
        p.RecoveryKind.RESUME_SAFE,
        execution.execution_id,
        execution.business_id,
        execution.revision,
        actor_id,
        authority,
        next_node_id=execution.current_node_id,
        rationale="a load-test visit has no external effect",
    )


def command_evidence(execution_id: str, attempt: str = "a-9") -> tuple[Evidence, Evidence]:
    """A local_command visit's attempt and its issued Command, as a worker commits them before invoking it."""
    attempt_id = f"{execution_id}/{attempt}"
    return (
        Evidence(
            attempt_id,
            "StepAttempt",
            {"node_id": "start", "node_kind": "local_command", "command_id": f"{attempt_id}/command"},
            1,
            "running",
        ),
        Evidence(f"{attempt_id}/command", "Command", {"attempt_id": attempt_id, "command_id": f"{attempt_id}/command"},
                 1, "issued"),
    )


def wait_spec(
    attempt_id: str = "a-wait",
    *,
    event_type: str | None = EVENT_TYPE,
    wake_at: datetime | None = None,
    timeout: bool = False,
    correlation: tuple[tuple[str, str], ...] | None = None,
    wake_after: timedelta | None = None,
    continuations: tuple[tuple[str, str], ...] = (),
) -> p.WaitSpec:
    return p.WaitSpec(
        node_id="n-wait",
        attempt_id=attempt_id,
        event_type=event_type,
        correlation=(correlation if correlation is not None else CORRELATION) if event_type is not None else (),
        wake_at=wake_at,
        timeout=timeout,
        wake_after=wake_after,
        continuations=continuations,
    )


def wake_request(
    key: p.WaitKey,
    reason: p.WakeReason = p.WakeReason.EVENT,
    source_id: str = "ev-1",
    **changes: Any,
) -> p.WakeRequest:
    event = reason in (p.WakeReason.EVENT, p.WakeReason.DECISION)
    fields: dict[str, Any] = {
        "key": key,
        "reason": reason,
        "source_id": source_id,
        "business_id": "b-1",
        "authority": GRANTED,
        "event_type": EVENT_TYPE if event else None,
        "correlation": CORRELATION if event else (),
    }
    fields.update(changes)
    return p.WakeRequest(**fields)


def evidence_key(found: ExecutionView | None) -> object:
    """A view with its evidence bodies (``Evidence`` equality ignores the body)."""
    if found is None:
        return None
    return found, tuple((e.object_id, e.kind, e.body_json()) for e in found.evidence)


def snapshot(store: Store, *also: str) -> object:
    """Everything a client can see: every execution's whole view, the id lists and ``expired()``."""
    ids = store.execution_ids()
    return (
        tuple(ids),
        tuple((state, tuple(store.execution_ids(state))) for state in ExecutionState),
        tuple(store.expired()),
        tuple((eid, evidence_key(store.read(eid))) for eid in sorted({*ids, *also})),
    )


def refused(store: Store, call: Callable[[], p.Outcome | None], code: p.RefusalCode, *also: str) -> p.Refusal:
    """``call`` must be refused with exactly ``code`` and change nothing a client can see."""
    before = snapshot(store, *also)
    outcome = call()
    assert isinstance(outcome, p.Refusal), f"expected refusal {code.value}, got {outcome!r}"
    assert outcome.code == code, f"expected refusal {code.value}, got {outcome.code.value}: {outcome.message}"
    assert snapshot(store, *also) == before, f"a request refused with {code.value} changed the store"
    return outcome


def unchanged(
    store: Store, call: Callable[[], p.Outcome | None], code: p.UnchangedCode, *also: str
) -> p.Unchanged:
    before = snapshot(store, *also)
    outcome = call()
    assert isinstance(outcome, p.Unchanged), f"expected Unchanged({code.value}), got {outcome!r}"
    assert outcome.code == code, outcome
    assert snapshot(store, *also) == before, f"an idempotent repeat ({code.value}) changed the store"
    return outcome


def store_error(store: Store, call: Callable[[], object], code: str, *also: str) -> StoreError:
    before = snapshot(store, *also)
    with pytest.raises(StoreError) as caught:
        call()
    assert caught.value.code == code, f"expected StoreError({code!r}), got {caught.value.code!r}: {caught.value}"
    assert snapshot(store, *also) == before, f"a request that raised {code} changed the store"
    return caught.value


def assert_coherent(found: ExecutionView) -> None:
    """What must hold of every view: rows agree, lease iff claimed, history is the revision list."""
    execution, dispatch = found.execution, found.dispatch
    assert dispatch.workflow_execution_id == execution.execution_id
    assert dispatch.dispatch_state == dispatch_state_of(execution.state), (execution.state, dispatch.dispatch_state)
    lease = (dispatch.lease_token, dispatch.leased_by, dispatch.lease_expires_at)
    if dispatch.dispatch_state == DispatchState.CLAIMED:
        assert all(f is not None for f in lease), lease
    else:
        assert all(f is None for f in lease), lease
    assert dispatch.step_count == execution.step_count <= p.STEP_LIMIT
    assert [r.revision for r in found.revisions] == list(range(1, execution.revision + 1))
    assert found.revisions[-1] == execution


# --- the suite --------------------------------------------------------------------------------


class RequestTests:
    """The request-by-request conformance tests (part of :class:`~fencekeeper.adapters.testing.StoreTests`).

    The class name does not start with ``Test``, so pytest collects only the
    subclasses, once per store.
    """

    @pytest.fixture
    def store_factory(self, request: pytest.FixtureRequest) -> StoreFactory:
        """The store under test: override this fixture, or provide ``fencekeeper_store_factory`` (conftest)."""
        try:
            factory: StoreFactory = request.getfixturevalue("fencekeeper_store_factory")
        except pytest.FixtureLookupError:
            raise NotImplementedError(
                "the store suite needs a store factory: override the store_factory fixture in the StoreTests "
                "subclass, define a fencekeeper_store_factory fixture (conftest.py), or run pytest with "
                "--fencekeeper-store module:callable (docs/conformance.md)"
            ) from None
        return factory

    @pytest.fixture
    def clock(self) -> ManualClock:
        # A ManualClock that the concurrency tests can also use to hold two racers together.
        return RendezvousClock()

    @pytest.fixture
    def store(self, store_factory: StoreFactory, clock: ManualClock) -> Iterator[Store]:
        made = store_factory(clock)
        assert made.execution_ids() == [], "store_factory must return an empty store"
        yield made
        made.close()

    def running(self, store: Store, execution_id: str = "e-1", worker_id: str = "w-1") -> p.LeaseCredential:
        """Admit ``execution_id`` and claim it; the credential."""
        admit(store, execution_id)
        claimed, credential = claim(store, worker_id)
        assert claimed == execution_id
        return credential

    def waiting(self, store: Store, spec: p.WaitSpec, execution_id: str = "e-1") -> p.WaitKey:
        credential = self.running(store, execution_id)
        decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
        return p.WaitKey(execution_id, spec.node_id, spec.attempt_id)

    def in_review(self, store: Store, clock: ManualClock, execution_id: str = "e-1") -> None:
        """Claim, let the lease expire, quarantine: reconciliation_required."""
        self.running(store, execution_id)
        clock.advance(LEASE)
        decided(store.recover(recovery_request(store, execution_id, p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))

    # --- admit ---------------------------------------------------------------------------

    def test_admit_writes_an_eligible_execution_and_dispatch_row(self, store: Store, clock: ManualClock) -> None:
        decision = admit(store, "e-1")
        found = view(store, "e-1")
        assert found.execution == decision.execution
        assert found.execution.state == ExecutionState.ELIGIBLE and found.execution.revision == 1
        assert found.dispatch == p.Dispatch("e-1", DispatchState.ELIGIBLE, eligible_at=clock.now())
        assert found.revisions == (decision.execution,)
        assert found.history == decision.evidence
        assert (found.registrations, found.recoveries, found.evidence) == ((), (), ())
        assert store.execution_ids() == ["e-1"]
        assert store.execution_ids(ExecutionState.ELIGIBLE) == ["e-1"]
        assert store.execution_ids(ExecutionState.RUNNING) == []

    def test_read_of_an_unknown_execution_is_none(self, store: Store) -> None:
        admit(store, "e-1")
        assert store.read("e-2") is None

    def test_admit_of_an_existing_execution_is_refused(self, store: Store) -> None:
        admit(store, "e-1")
        refused(
            store,
            lambda: store.admit(p.AdmitRequest("e-1", "b-2", "d-2", 1, "start", GRANTED)),
            RC.ALREADY_EXISTS,
        )

    def test_admit_without_authority_is_refused(self, store: Store) -> None:
        request = p.AdmitRequest("e-1", "b-1", "d-1", 1, "start", DENIED)
        refused(store, lambda: store.admit(request), RC.NOT_AUTHORIZED, "e-1")
        assert store.read("e-1") is None

    def test_admit_of_a_malformed_id_names_the_field(self, store: Store) -> None:
        refusal = refused(
            store, lambda: store.admit(p.AdmitRequest("bad id", "b-1", "d-1", 1, "start", GRANTED)), RC.INVALID_REQUEST
        )
        assert refusal.field == "execution_id"

    # --- claim ----------------------------------------------------------------------------

    def test_claim_next_returns_none_when_there_is_nothing(self, store: Store) -> None:
        assert store.claim_next(p.ClaimRequest("w-1", "t-1", LEASE)) is None

    def test_claim_assigns_a_fresh_lease_and_the_next_fence(self, store: Store, clock: ManualClock) -> None:
        admit(store, "e-1")
        decision = decided(store.claim_next(p.ClaimRequest("w-1", "t-first", LEASE)))
        assert decision.lease == p.LeaseCredential("w-1", "t-first", 1)
        found = view(store, "e-1")
        assert found.execution == decision.execution
        assert found.execution.state == ExecutionState.RUNNING
        assert (found.execution.revision, found.execution.fence) == (2, 1)
        assert found.dispatch.dispatch_state == DispatchState.CLAIMED
        assert (found.dispatch.lease_token, found.dispatch.leased_by) == ("t-first", "w-1")
        assert found.dispatch.lease_expires_at == clock.now() + LEASE
        assert_coherent(found)

    def test_claim_next_returns_none_when_everything_is_claimed(self, store: Store) -> None:
        self.running(store, "e-1")
        assert store.claim_next(p.ClaimRequest("w-2", "t-2", LEASE)) is None

    def test_claim_next_takes_only_work_that_is_due(self, store: Store, clock: ManualClock) -> None:
        admitted = clock.now()
        admit(store, "e-1")
        clock.set(admitted - timedelta(seconds=1))
        before = snapshot(store)
        assert store.claim_next(p.ClaimRequest("w-1", "t-1", LEASE)) is None
        assert snapshot(store) == before
        clock.set(admitted)
        assert claim(store)[0] == "e-1"

    def test_claim_order_is_eligible_at_then_execution_id(self, store: Store, clock: ManualClock) -> None:
        # Insertion order would give z, b, a; id order alone a, b, z; the
        # protocol's order is eligible_at first, then id: z, a, b.
        admit(store, "e-z")
        clock.advance(timedelta(seconds=1))
        admit(store, "e-b")
        admit(store, "e-a")
        order = [claim(store, f"w-{i}")[0] for i in range(3)]
        assert order == ["e-z", "e-a", "e-b"]

    def test_a_released_execution_queues_behind_older_work(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store, "e-a")
        clock.advance(timedelta(seconds=1))
        admit(store, "e-b")
        clock.advance(timedelta(seconds=1))
        decided(store.release("e-a", p.ReleaseRequest(credential, revision(store, "e-a"))))
        assert view(store, "e-a").dispatch.eligible_at == clock.now()
        assert [claim(store, "w-2")[0], claim(store, "w-3")[0]] == ["e-b", "e-a"]

    def test_claim_next_is_scoped_by_business(self, store: Store) -> None:
        admit(store, "e-1", "b-1")
        admit(store, "e-2", "b-2")
        before = snapshot(store)
        assert store.claim_next(p.ClaimRequest("w-1", "t-x", LEASE), business_id="b-3") is None
        assert snapshot(store) == before
        assert claim(store, business_id="b-2")[0] == "e-2"
        assert store.claim_next(p.ClaimRequest("w-1", "t-y", LEASE), business_id="b-2") is None
        assert claim(store, business_id="b-1")[0] == "e-1"

    def test_claim_with_a_non_positive_lease_is_refused(self, store: Store) -> None:
        admit(store, "e-1")
        refusal = refused(
            store, lambda: store.claim_next(p.ClaimRequest("w-1", "t-1", timedelta(0))), RC.INVALID_REQUEST
        )
        assert refusal.field == "lease_duration"

    # --- renew ----------------------------------------------------------------------------

    def test_renew_extends_the_lease_and_leaves_the_revision(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        clock.advance(timedelta(seconds=10))
        decision = decided(store.renew("e-1", p.RenewRequest(credential, timedelta(seconds=60))))
        found = view(store, "e-1")
        assert found.dispatch == decision.dispatch
        assert found.dispatch.lease_expires_at == clock.now() + timedelta(seconds=60)
        assert found.execution.revision == 2 and len(found.revisions) == 2
        assert found.history[-1] == decision.evidence[0]

    def test_renew_after_expiry_is_refused(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        clock.advance(LEASE)
        refused(store, lambda: store.renew("e-1", p.RenewRequest(credential, LEASE)), RC.LEASE_EXPIRED)

    def test_renew_with_another_token_is_refused(self, store: Store) -> None:
        credential = attrs.evolve(self.running(store), lease_token="t-forged")
        refused(store, lambda: store.renew("e-1", p.RenewRequest(credential, LEASE)), RC.LEASE_TOKEN_MISMATCH)

    def test_renew_by_another_worker_is_refused(self, store: Store) -> None:
        credential = attrs.evolve(self.running(store), worker_id="w-2")
        refused(store, lambda: store.renew("e-1", p.RenewRequest(credential, LEASE)), RC.WORKER_MISMATCH)

    def test_renew_with_another_fence_is_refused(self, store: Store) -> None:
        credential = self.running(store)
        stale = attrs.evolve(credential, fence=credential.fence + 1)
        refused(store, lambda: store.renew("e-1", p.RenewRequest(stale, LEASE)), RC.STALE_FENCE)

    def test_renew_of_unknown_or_unclaimed_work_is_refused(self, store: Store) -> None:
        credential = self.running(store, "e-1")
        admit(store, "e-2")
        refused(store, lambda: store.renew("e-9", p.RenewRequest(credential, LEASE)), RC.EXECUTION_NOT_FOUND, "e-9")
        refused(store, lambda: store.renew("e-2", p.RenewRequest(credential, LEASE)), RC.DISPATCH_NOT_CLAIMED)

    # --- record_step ------------------------------------------------------------------------

    def test_record_step_counts_on_both_rows_with_its_evidence(self, store: Store) -> None:
        credential = self.running(store)
        item = Evidence("ev-step-1", "step_attempt", {"node": "n-1", "attempt": 1})
        request = step_request(store, "e-1", credential, step=p.StepRecord("n-1", "a-1"))
        decision = decided(store.record_step("e-1", request, [item]))
        found = view(store, "e-1")
        assert found.execution == decision.execution
        assert (found.execution.step_count, found.dispatch.step_count) == (1, 1)
        assert found.execution.current_node_id == "n-1" and found.execution.revision == 3
        assert found.dispatch.lease_token == credential.lease_token
        assert [(e.object_id, e.kind, dict(e.body)) for e in found.evidence] == [
            ("ev-step-1", "step_attempt", {"node": "n-1", "attempt": 1})
        ]
        assert_coherent(found)

    def test_a_visit_reads_what_read_shows(self, store: Store) -> None:
        # read_for_visit is what a worker plans from: it must agree with
        # read() on the execution, the dispatch row and the current evidence
        # (their order too), with none, one and several evidence objects.
        assert store.read_for_visit("e-1") is None
        admit(store, "e-1")
        admit(store, "e-2")
        for execution_id in ("e-1", "e-2"):
            self.assert_visit_matches_read(store, execution_id)
        credential = claim(store)[1]
        self.assert_visit_matches_read(store, "e-1")
        items = [
            Evidence("ev-a", "step_attempt", {"n": 1}),
            Evidence("ev-b", "step_attempt", {"n": 2}),
        ]
        decided(store.append_evidence("e-1", credential, items))
        self.assert_visit_matches_read(store, "e-1")
        request = step_request(store, "e-1", credential, step=p.StepRecord("n-1", "a-1"))
        decided(store.record_step("e-1", request, [Evidence("ev-a", "step_attempt", {"n": 3}, 2, "done")]))
        visit = self.assert_visit_matches_read(store, "e-1")
        assert [(e.object_id, e.revision) for e in visit.evidence] == [("ev-a", 2), ("ev-b", 1)]
        self.assert_visit_matches_read(store, "e-2")

    @staticmethod
    def assert_visit_matches_read(store: Store, execution_id: str) -> VisitView:
        found = view(store, execution_id)
        visit = store.read_for_visit(execution_id)
        assert visit == VisitView(found.execution, found.dispatch, found.evidence), (visit, found)
        return visit

    def test_record_step_with_a_stale_revision_is_refused(self, store: Store) -> None:
        credential = self.running(store)
        request = step_request(store, "e-1", credential, expected_revision=1)
        refused(store, lambda: store.record_step("e-1", request, [Evidence("ev-x", "step_attempt")]), RC.STALE_REVISION)

    def test_record_step_without_authority_is_refused(self, store: Store) -> None:
        credential = self.running(store)
        request = step_request(store, "e-1", credential, authority=DENIED)
        refused(store, lambda: store.record_step("e-1", request), RC.NOT_AUTHORIZED)

    def test_record_step_stops_at_the_step_limit(self, store: Store) -> None:
        credential = self.running(store)
        for _ in range(p.STEP_LIMIT):
            decided(store.record_step("e-1", step_request(store, "e-1", credential)))
        assert view(store, "e-1").execution.step_count == p.STEP_LIMIT
        refused(
            store, lambda: store.record_step("e-1", step_request(store, "e-1", credential)), RC.STEP_LIMIT_REACHED
        )
        with_step = finalize_request(store, "e-1", credential, "suspended", step=p.StepRecord("n-2", "a-x"))
        refused(store, lambda: store.finalize(with_step), RC.STEP_LIMIT_REACHED)
        decided(store.finalize(finalize_request(store, "e-1", credential, "suspended", reason="step_limit")))
        assert view(store, "e-1").execution.state == ExecutionState.SUSPENDED

    # --- release ------------------------------------------------------------------------------

    def test_release_makes_the_execution_eligible_again(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        clock.advance(timedelta(seconds=5))
        decision = decided(store.release("e-1", p.ReleaseRequest(credential, revision(store, "e-1"))))
        found = view(store, "e-1")
        assert found.execution == decision.execution and found.dispatch == decision.dispatch
        assert found.execution.state == ExecutionState.ELIGIBLE
        assert found.dispatch == p.Dispatch("e-1", DispatchState.ELIGIBLE, eligible_at=clock.now())
        refused(store, lambda: store.renew("e-1", p.RenewRequest(credential, LEASE)), RC.DISPATCH_NOT_CLAIMED)
        _, again = claim(store, "w-2")
        assert again.fence == 2 and again.lease_token != credential.lease_token

    def test_release_with_a_stale_revision_is_refused(self, store: Store) -> None:
        credential = self.running(store)
        refused(store, lambda: store.release("e-1", p.ReleaseRequest(credential, 1)), RC.STALE_REVISION)

    # --- finalize -------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "target",
        [
            ExecutionState.SUCCEEDED,
            ExecutionState.FAILED,
            ExecutionState.SUSPENDED,
            ExecutionState.RECONCILIATION_REQUIRED,
        ],
        ids=lambda s: s.value,
    )
    def test_finalize_writes_the_target_and_its_evidence_together(
        self, store: Store, target: ExecutionState
    ) -> None:
        credential = self.running(store)
        item = Evidence("ev-outcome-1", "outcome", {"target": target.value})
        request = finalize_request(
            store, "e-1", credential, target, step=p.StepRecord("n-end", "a-end"), error_code="e.code"
        )
        decision = decided(store.finalize(request, [item]))
        found = view(store, "e-1")
        assert found.execution == decision.execution and found.dispatch == decision.dispatch
        assert found.execution.state == target and found.execution.revision == 3
        assert found.dispatch.dispatch_state == dispatch_state_of(target)
        assert found.dispatch.last_error_code == "e.code"
        assert (found.execution.step_count, found.execution.current_node_id) == (1, "n-end")
        assert [(e.object_id, e.body_json()) for e in found.evidence] == [("ev-outcome-1", item.body_json())]
        assert store.execution_ids(target) == ["e-1"]
        assert_coherent(found)

    def test_finalize_to_waiting_commits_the_registration(self, store: Store) -> None:
        credential = self.running(store)
        spec = wait_spec("a-7")
        decision = decided(
            store.finalize(finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=spec))
        )
        found = view(store, "e-1")
        key = p.WaitKey("e-1", "n-wait", "a-7")
        assert found.execution == decision.execution
        assert found.execution.state == ExecutionState.WAITING and found.execution.wait == key
        assert found.registrations == (p.WaitRegistration(key, "b-1", spec),)
        assert_coherent(found)

    def test_finalize_waiting_needs_exactly_its_registration(self, store: Store) -> None:
        credential = self.running(store)
        without = finalize_request(store, "e-1", credential, ExecutionState.WAITING)
        refused(store, lambda: store.finalize(without), RC.WAIT_REGISTRATION_REQUIRED)
        extra = finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED, wait=wait_spec())
        refused(store, lambda: store.finalize(extra), RC.WAIT_REGISTRATION_REQUIRED)

    @pytest.mark.parametrize("target", [ExecutionState.CANCELLED, ExecutionState.ELIGIBLE, ExecutionState.RUNNING])
    def test_finalize_to_a_sixth_target_is_refused(self, store: Store, target: ExecutionState) -> None:
        credential = self.running(store)
        request = finalize_request(store, "e-1", credential, target)
        refused(store, lambda: store.finalize(request, [Evidence("ev-1", "outcome")]), RC.TARGET_NOT_PERMITTED)

    def test_finalize_to_an_unknown_state_names_the_field(self, store: Store) -> None:
        credential = self.running(store)
        refusal = refused(
            store, lambda: store.finalize(finalize_request(store, "e-1", credential, "done")), RC.INVALID_REQUEST
        )
        assert refusal.field == "target_state"

    @pytest.mark.parametrize(
        ("changes", "code"),
        [
            ({"execution_id": "e-9", "dispatch_id": "e-9"}, RC.EXECUTION_NOT_FOUND),
            ({"dispatch_id": "e-2"}, RC.IDENTITY_MISMATCH),
            ({"lease_token": "t-forged"}, RC.LEASE_TOKEN_MISMATCH),
            ({"worker_id": "w-2"}, RC.WORKER_MISMATCH),
            ({"fence": 2}, RC.STALE_FENCE),
            ({"business_id": "b-2"}, RC.BUSINESS_MISMATCH),
            ({"expected_revision": 1}, RC.STALE_REVISION),
            ({"authority": DENIED}, RC.NOT_AUTHORIZED),
        ],
        ids=[
            "execution_not_found",
            "identity_mismatch",
            "lease_token_mismatch",
            "worker_mismatch",
            "stale_fence",
            "business_mismatch",
            "stale_revision",
            "not_authorized",
        ],
    )
    def test_finalize_preconditions_refuse_with_their_own_code(
        self, store: Store, changes: dict[str, Any], code: p.RefusalCode
    ) -> None:
        credential = self.running(store)
        admit(store, "e-2")
        request = finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED, **changes)
        refused(store, lambda: store.finalize(request, [Evidence("ev-outcome", "outcome")]), code, "e-9")

    def test_finalize_after_expiry_is_refused(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        request = finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED)
        clock.advance(LEASE)
        refused(store, lambda: store.finalize(request, [Evidence("ev-late", "outcome")]), RC.LEASE_EXPIRED)

    def test_finalize_of_finished_work_is_refused(self, store: Store) -> None:
        credential = self.running(store)
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED)))
        again = finalize_request(store, "e-1", credential, ExecutionState.FAILED)
        refused(store, lambda: store.finalize(again), RC.DISPATCH_NOT_CLAIMED)

    def test_reusing_a_wait_registration_key_changes_nothing(self, store: Store) -> None:
        # A registration is bound to its execution, node and attempt, and the
        # first committed wake wins (seed 000, wait_for_event).  Registering
        # the same key again must not reopen a woken registration.
        key = self.waiting(store, wait_spec("a-1"))
        decided(store.wake(wake_request(key)))
        _, credential = claim(store, "w-2")
        request = finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=wait_spec("a-1"))
        store_error(store, lambda: store.finalize(request), "registration_conflict")

    # --- wake -----------------------------------------------------------------------------------

    @pytest.mark.parametrize("reason", [p.WakeReason.EVENT, p.WakeReason.DECISION], ids=lambda r: r.value)
    def test_an_exact_event_or_decision_wakes_the_waiter(
        self, store: Store, clock: ManualClock, reason: p.WakeReason
    ) -> None:
        key = self.waiting(store, wait_spec())
        clock.advance(timedelta(seconds=3))
        decision = decided(store.wake(wake_request(key, reason, "src-1")))
        found = view(store, "e-1")
        assert found.execution == decision.execution
        assert found.execution.state == ExecutionState.ELIGIBLE and found.execution.wait is None
        assert found.dispatch.eligible_at == clock.now()
        assert found.registrations == (p.WaitRegistration(key, "b-1", wait_spec(), "src-1", reason),)
        assert claim(store, "w-2")[0] == "e-1"

    @pytest.mark.parametrize(
        "changes",
        [{"event_type": "payment.refunded"}, {"correlation": (("order", "o-2"),)}, {"correlation": ()}],
        ids=["event_type", "correlation", "no_correlation"],
    )
    def test_a_mismatching_event_does_not_wake(self, store: Store, changes: dict[str, Any]) -> None:
        key = self.waiting(store, wait_spec())
        refused(store, lambda: store.wake(wake_request(key, **changes)), RC.WAKE_MISMATCH)

    def test_a_timer_wakes_only_when_due(self, store: Store, clock: ManualClock) -> None:
        due = clock.now() + timedelta(seconds=10)
        key = self.waiting(store, wait_spec(event_type=None, wake_at=due))
        refused(store, lambda: store.wake(wake_request(key, p.WakeReason.TIMER, "timer-1")), RC.WAKE_NOT_DUE)
        refused(store, lambda: store.wake(wake_request(key, p.WakeReason.EVENT)), RC.WAKE_MISMATCH)
        refused(store, lambda: store.wake(wake_request(key, p.WakeReason.TIMEOUT, "timer-1")), RC.WAKE_MISMATCH)
        clock.set(due)
        decided(store.wake(wake_request(key, p.WakeReason.TIMER, "timer-1")))
        registration = view(store, "e-1").registrations[0]
        assert (registration.woken_by, registration.wake_reason) == ("timer-1", p.WakeReason.TIMER)

    def test_a_declared_timeout_wakes_as_a_timeout(self, store: Store, clock: ManualClock) -> None:
        due = clock.now() + timedelta(seconds=10)
        key = self.waiting(store, wait_spec(wake_at=due, timeout=True))
        refused(store, lambda: store.wake(wake_request(key, p.WakeReason.TIMEOUT, "to-1")), RC.WAKE_NOT_DUE)
        clock.advance(timedelta(seconds=10))
        refused(store, lambda: store.wake(wake_request(key, p.WakeReason.TIMER, "to-1")), RC.WAKE_MISMATCH)
        decided(store.wake(wake_request(key, p.WakeReason.TIMEOUT, "to-1")))
        assert view(store, "e-1").registrations[0].wake_reason == p.WakeReason.TIMEOUT

    def test_duplicate_and_racing_wakes_change_nothing(self, store: Store) -> None:
        key = self.waiting(store, wait_spec())
        decided(store.wake(wake_request(key, source_id="ev-1")))
        unchanged(store, lambda: store.wake(wake_request(key, source_id="ev-1")), p.UnchangedCode.ALREADY_WOKEN)
        unchanged(store, lambda: store.wake(wake_request(key, source_id="ev-2")), p.UnchangedCode.ALREADY_WOKEN)
        assert view(store, "e-1").registrations[0].woken_by == "ev-1"

    def test_wake_of_work_that_does_not_wait_is_refused(self, store: Store) -> None:
        admit(store, "e-1")
        key = p.WaitKey("e-1", "n-wait", "a-wait")
        refused(store, lambda: store.wake(wake_request(key)), RC.NOT_WAITING)
        refused(store, lambda: store.wake(wake_request(p.WaitKey("e-9", "n", "a"))), RC.EXECUTION_NOT_FOUND, "e-9")

    def test_wake_of_another_registration_is_refused(self, store: Store) -> None:
        self.waiting(store, wait_spec("a-1"))
        refused(store, lambda: store.wake(wake_request(p.WaitKey("e-1", "n-wait", "a-2"))), RC.NOT_WAITING)

    def test_an_earlier_attempts_registration_never_wakes_the_current_wait(
        self, store: Store, clock: ManualClock
    ) -> None:
        # Seed 000, wait_for_event: a registration is bound to its execution,
        # node and attempt.  The wait of a second visit is woken only through
        # its own registration: the first visit's, woken long ago, answers
        # only for itself, and its earlier timer is never due for the second.
        start = clock.now()
        first = self.waiting(store, wait_spec("a-1", wake_at=start + timedelta(seconds=5)))
        clock.set(start + timedelta(seconds=5))
        decided(store.fire_timer(first, GRANTED))
        _, credential = claim(store, "w-2")
        second = wait_spec("a-2", wake_at=start + timedelta(seconds=60))
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=second)))
        current = p.WaitKey("e-1", "n-wait", "a-2")
        unchanged(store, lambda: store.wake(wake_request(first, source_id="ev-9")), p.UnchangedCode.ALREADY_WOKEN)
        unchanged(store, lambda: store.fire_timer(first, GRANTED), p.UnchangedCode.ALREADY_WOKEN)
        assert store.due_wakes() == []
        refused(store, lambda: store.wake(wake_request(current, p.WakeReason.TIMER, "t-2")), RC.WAKE_NOT_DUE)
        assert view(store, "e-1").execution.wait == current
        clock.set(start + timedelta(seconds=60))
        assert store.due_wakes() == [current]
        decided(store.fire_timer(current, GRANTED))
        woken = {r.key.attempt_id: r.woken_by for r in view(store, "e-1").registrations}
        assert woken == {"a-1": "a-1/timer", "a-2": "a-2/timer"}

    def test_wake_from_another_business_or_without_authority_is_refused(self, store: Store) -> None:
        key = self.waiting(store, wait_spec())
        refused(store, lambda: store.wake(wake_request(key, business_id="b-2")), RC.BUSINESS_MISMATCH)
        refused(store, lambda: store.wake(wake_request(key, authority=DENIED)), RC.NOT_AUTHORIZED)

    # --- cancel ---------------------------------------------------------------------------------

    def test_cancel_of_eligible_work(self, store: Store) -> None:
        admit(store, "e-1")
        decision = decided(store.cancel(p.CancelRequest("e-1", "b-1", 1, GRANTED)))
        found = view(store, "e-1")
        assert found.execution == decision.execution and found.dispatch == decision.dispatch
        assert found.execution.state == ExecutionState.CANCELLED
        assert found.dispatch.dispatch_state == DispatchState.CANCELLED
        assert store.claim_next(p.ClaimRequest("w-1", "t-1", LEASE)) is None

    def test_cancel_of_waiting_work_and_the_wake_after_it(self, store: Store) -> None:
        key = self.waiting(store, wait_spec())
        decided(store.cancel(p.CancelRequest("e-1", "b-1", revision(store, "e-1"), GRANTED)))
        assert view(store, "e-1").execution.state == ExecutionState.CANCELLED
        refused(store, lambda: store.wake(wake_request(key)), RC.NOT_WAITING)

    def test_cancel_of_running_work_is_refused(self, store: Store) -> None:
        self.running(store)
        request = p.CancelRequest("e-1", "b-1", revision(store, "e-1"), GRANTED)
        refused(store, lambda: store.cancel(request), RC.CANCEL_RUNNING)

    def test_cancel_of_finished_work_is_an_illegal_transition(self, store: Store) -> None:
        credential = self.running(store)
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED)))
        request = p.CancelRequest("e-1", "b-1", revision(store, "e-1"), GRANTED)
        refused(store, lambda: store.cancel(request), RC.ILLEGAL_TRANSITION)

    @pytest.mark.parametrize(
        ("request_fields", "code"),
        [
            (("e-1", "b-2", 1, GRANTED), RC.BUSINESS_MISMATCH),
            (("e-1", "b-1", 2, GRANTED), RC.STALE_REVISION),
            (("e-1", "b-1", 1, DENIED), RC.NOT_AUTHORIZED),
            (("e-9", "b-1", 1, GRANTED), RC.EXECUTION_NOT_FOUND),
        ],
        ids=["business_mismatch", "stale_revision", "not_authorized", "execution_not_found"],
    )
    def test_cancel_checks_refuse_with_their_own_code(
        self, store: Store, request_fields: tuple[Any, ...], code: p.RefusalCode
    ) -> None:
        admit(store, "e-1")
        refused(store, lambda: store.cancel(p.CancelRequest(*request_fields)), code, "e-9")

    # --- recover ----------------------------------------------------------------------------------

    def test_quarantine_only_after_expiry(self, store: Store, clock: ManualClock) -> None:
        self.running(store)
        clock.advance(LEASE - timedelta(microseconds=1))
        request = recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")
        refused(store, lambda: store.recover(request), RC.LEASE_NOT_EXPIRED)
        assert store.expired() == []
        clock.advance(timedelta(microseconds=1))
        assert store.expired() == ["e-1"]
        decision = decided(store.recover(request))
        found = view(store, "e-1")
        assert found.execution == decision.execution and found.dispatch == decision.dispatch
        assert found.execution.state == ExecutionState.RECONCILIATION_REQUIRED
        assert found.dispatch.lease_token is None and found.dispatch.last_error_code == "quarantine_expired"
        assert found.recoveries == (decision.recovery,)
        assert store.expired() == []
        assert_coherent(found)

    def test_the_lease_holder_cannot_quarantine_itself(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        clock.advance(LEASE)
        request = recovery_request(
            store,
            "e-1",
            p.RecoveryKind.QUARANTINE_EXPIRED,
            "q-self",
            actor_id=credential.worker_id,
            authority=p.Authority(True, credential.worker_id),
        )
        refused(store, lambda: store.recover(request), RC.WORKER_CANNOT_RECOVER)

    def test_quarantine_of_work_that_is_not_running_is_refused(self, store: Store) -> None:
        admit(store, "e-1")
        request = recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")
        refused(store, lambda: store.recover(request), RC.EXECUTION_NOT_RUNNING)

    def test_fail_from_review(self, store: Store, clock: ManualClock) -> None:
        self.in_review(store, clock)
        decision = decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1")))
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.FAILED
        assert found.recoveries[-1] == decision.recovery and len(found.recoveries) == 2

    def test_resume_safe_with_proof_gives_a_fresh_lease_later(self, store: Store, clock: ManualClock) -> None:
        self.in_review(store, clock)
        eligible_at = view(store, "e-1").dispatch.eligible_at
        clock.advance(timedelta(seconds=5))
        decision = decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1")))
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.ELIGIBLE
        # Recovered work keeps its place in the queue (specs/protocol.md).
        assert found.dispatch.eligible_at == eligible_at < clock.now()
        proof = found.recoveries[-1].proof
        assert decision.recovery is not None and proof is not None and proof == decision.recovery.proof
        assert (proof.continuation, proof.approved_by, proof.idempotency_contract) == ("start", GOVERNOR, CONTRACT)
        _, credential = claim(store, "w-2")
        assert credential.fence == 2

    @pytest.mark.parametrize(
        "changes",
        [{"next_node_id": None}, {"next_node_id": "elsewhere"}, {"rationale": ""}, {"rationale": "   "}],
        ids=["no_continuation", "unpermitted_continuation", "no_contract", "blank_contract"],
    )
    def test_resume_safe_without_the_whole_proof_is_refused(
        self, store: Store, clock: ManualClock, changes: dict[str, Any]
    ) -> None:
        self.in_review(store, clock)
        request = recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1", **changes)
        refused(store, lambda: store.recover(request), RC.UNSAFE_RESUME)

    def test_resume_safe_needs_the_pinned_definition(self, store: Store, clock: ManualClock) -> None:
        admit(store, "e-2", "b-2")  # no definition is registered in b-2
        claim(store, "w-1", business_id="b-2")
        clock.advance(LEASE)
        decided(store.recover(recovery_request(store, "e-2", p.RecoveryKind.QUARANTINE_EXPIRED, "q-2")))
        unpinned = p.RecoveryRequest(
            "r-2", p.RecoveryKind.RESUME_SAFE, "e-2", "b-2", revision(store, "e-2"), GOVERNOR, GRANTED,
            next_node_id="start", rationale=CONTRACT,
        )
        outcome = refused(store, lambda: store.recover(unpinned), RC.UNSAFE_RESUME)
        assert "dependencies_current" in outcome.message
        register_pinned(store, "b-2")
        decided(store.recover(unpinned))

    def test_resume_safe_waits_for_an_unresolved_command(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store, "e-1")
        attempt, command = command_evidence("e-1")
        decided(store.append_evidence("e-1", credential, [attempt, command]))
        clock.advance(LEASE)
        quarantined = attempt.next("reconciliation_required", {"status": "reconciliation_required"})
        decided(
            store.recover(recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1"), [quarantined])
        )
        resume = recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1")
        outcome = refused(store, lambda: store.recover(resume), RC.UNSAFE_RESUME)
        assert command.object_id in outcome.message
        # reconcile_command must name the Command and record a conclusive settlement.
        unnamed = recovery_request(store, "e-1", p.RecoveryKind.RECONCILE_COMMAND, "c-1")
        refused(store, lambda: store.recover(unnamed), RC.NO_UNRESOLVED_COMMAND)
        named = recovery_request(
            store, "e-1", p.RecoveryKind.RECONCILE_COMMAND, "c-1", command_to_reconcile=command.object_id
        )
        refused(store, lambda: store.recover(named), RC.NO_UNRESOLVED_COMMAND)
        settlement = [
            quarantined.next("failed", {"status": "failed", "next_node_id": "start"}),
            command.next("rejected", {"status": "rejected"}),
        ]
        steps = view(store, "e-1").execution.step_count
        decision = decided(store.recover(named, settlement))
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.RECONCILIATION_REQUIRED
        assert found.execution == decision.execution and found.history[-1] == decision.evidence[0]
        # The quarantined visit was never counted; its settlement counts it.
        assert found.execution.step_count == found.dispatch.step_count == steps + 1
        again = recovery_request(
            store, "e-1", p.RecoveryKind.RECONCILE_COMMAND, "c-2", command_to_reconcile=command.object_id
        )
        refused(store, lambda: store.recover(again, settlement), RC.NO_UNRESOLVED_COMMAND)
        # Now, and only now, a separate decision may resume it.
        resume = recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-2")
        decided(store.recover(resume))
        assert view(store, "e-1").execution.state == ExecutionState.ELIGIBLE

    def test_resume_safe_settles_an_attempt_that_issued_no_command(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store, "e-1")
        attempt, _ = command_evidence("e-1")
        pending = Evidence(attempt.object_id, "StepAttempt", {"node_id": "start", "node_kind": "local_command"}, 1,
                           "pending")
        decided(store.append_evidence("e-1", credential, [pending]))
        clock.advance(LEASE)
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))
        decision = decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1")))
        settled = [e for e in view(store, "e-1").evidence if e.object_id == pending.object_id]
        assert [e.state for e in settled] == ["failed"] and decision.objects == tuple(settled)

    def test_suspended_leaves_only_by_a_governed_decision(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store, "e-1")
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.SUSPENDED)))
        refused(
            store,
            lambda: store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1")),
            RC.NOT_IN_RECONCILIATION,
        )
        no_reason = recovery_request(store, "e-1", p.RecoveryKind.RESUME_SUSPENDED, "s-1", rationale="")
        refused(store, lambda: store.recover(no_reason), RC.UNSAFE_RESUME)
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SUSPENDED, "s-1")))
        assert view(store, "e-1").execution.state == ExecutionState.ELIGIBLE
        _, credential = claim(store, "w-2")
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.SUSPENDED)))
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1")))
        assert view(store, "e-1").execution.state == ExecutionState.FAILED
        resume_waiting = recovery_request(store, "e-1", p.RecoveryKind.RESUME_SUSPENDED, "s-2")
        refused(store, lambda: store.recover(resume_waiting), RC.NOT_SUSPENDED)

    def test_a_step_limit_suspension_can_only_be_failed(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store, "e-1")
        decided(
            store.finalize(
                finalize_request(store, "e-1", credential, ExecutionState.SUSPENDED, error_code="step_limit")
            )
        )
        outcome = refused(
            store,
            lambda: store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SUSPENDED, "s-1")),
            RC.UNSAFE_RESUME,
        )
        assert "step_limit" in outcome.message

    @pytest.mark.parametrize(
        "kind",
        [p.RecoveryKind.FAIL, p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.RECONCILE_COMMAND],
        ids=lambda k: k.value,
    )
    def test_governed_decisions_outside_review_are_refused(self, store: Store, kind: p.RecoveryKind) -> None:
        admit(store, "e-1")
        refused(store, lambda: store.recover(recovery_request(store, "e-1", kind, "g-1")), RC.NOT_IN_RECONCILIATION)

    def test_an_identical_recovery_command_returns_the_same_record(self, store: Store, clock: ManualClock) -> None:
        self.running(store)
        clock.advance(LEASE)
        request = recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")
        decision = decided(store.recover(request))
        replay = unchanged(store, lambda: store.recover(request), p.UnchangedCode.RECOVERY_REPLAYED)
        assert replay.record == decision.recovery == view(store, "e-1").recoveries[0]

    def test_a_reused_recovery_identity_is_a_conflict(self, store: Store, clock: ManualClock) -> None:
        self.in_review(store, clock)  # command q-1 quarantined e-1 at revision 2
        admit(store, "e-2")
        other_kind = recovery_request(store, "e-1", p.RecoveryKind.FAIL, "q-1")
        refused(store, lambda: store.recover(other_kind), RC.RECOVERY_CONFLICT)
        other_revision = recovery_request(
            store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1", expected_revision=3
        )
        refused(store, lambda: store.recover(other_revision), RC.RECOVERY_CONFLICT)
        other_execution = recovery_request(store, "e-2", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1", expected_revision=2)
        refused(store, lambda: store.recover(other_execution), RC.RECOVERY_CONFLICT)

    def test_recovery_with_a_stale_revision_is_refused(self, store: Store, clock: ManualClock) -> None:
        self.in_review(store, clock)
        request = recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1", expected_revision=2)
        refused(store, lambda: store.recover(request), RC.STALE_REVISION)

    def test_recovery_without_authority_is_refused(self, store: Store, clock: ManualClock) -> None:
        self.in_review(store, clock)
        request = recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1", authority=DENIED)
        refused(store, lambda: store.recover(request), RC.NOT_AUTHORIZED)

    # --- the zombie -------------------------------------------------------------------------------

    def test_a_zombie_cannot_write_after_its_replacement_claims(self, store: Store, clock: ManualClock) -> None:
        zombie = self.running(store, "e-1", "w-1")
        revision_seen = revision(store, "e-1")
        clock.advance(LEASE)
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1")))
        _, live = claim(store, "w-2")
        assert live.fence == zombie.fence + 1
        current = revision(store, "e-1")
        def zombie_writes(seen: int) -> None:
            refused(store, lambda: store.renew("e-1", p.RenewRequest(zombie, LEASE)), RC.LEASE_TOKEN_MISMATCH)
            step = step_request(store, "e-1", zombie, expected_revision=seen)
            refused(
                store,
                lambda: store.record_step("e-1", step, [Evidence("ev-z1", "step_attempt")]),
                RC.LEASE_TOKEN_MISMATCH,
            )
            refused(store, lambda: store.release("e-1", p.ReleaseRequest(zombie, seen)), RC.LEASE_TOKEN_MISMATCH)
            final = finalize_request(store, "e-1", zombie, ExecutionState.SUCCEEDED, expected_revision=seen)
            refused(store, lambda: store.finalize(final, [Evidence("ev-z2", "outcome")]), RC.LEASE_TOKEN_MISMATCH)
            refused(
                store,
                lambda: store.append_evidence("e-1", zombie, [Evidence("ev-z3", "note")]),
                RC.LEASE_TOKEN_MISMATCH,
            )

        # The zombie presents its own credential, with the revision it saw and
        # with the current one (a zombie that re-read the row is the stronger one).
        zombie_writes(revision_seen)
        zombie_writes(current)
        # Borrowing the replacement's token still fails on the worker, and
        # borrowing its identity too still fails on the fence.
        borrowed = attrs.evolve(zombie, lease_token=live.lease_token)
        refused(store, lambda: store.renew("e-1", p.RenewRequest(borrowed, LEASE)), RC.WORKER_MISMATCH)
        impostor = attrs.evolve(live, fence=zombie.fence)
        refused(store, lambda: store.renew("e-1", p.RenewRequest(impostor, LEASE)), RC.STALE_FENCE)
        # The replacement is unaffected.
        decided(store.finalize(finalize_request(store, "e-1", live, ExecutionState.SUCCEEDED)))
        assert view(store, "e-1").evidence == ()

    # --- evidence ---------------------------------------------------------------------------------

    def test_evidence_commits_with_each_kind_of_write(self, store: Store) -> None:
        credential = self.running(store)
        decided(store.append_evidence("e-1", credential, [Evidence("ev-a", "command", {"id": "cmd-1"})]))
        decided(store.record_step("e-1", step_request(store, "e-1", credential), [Evidence("ev-b", "step_attempt")]))
        items = [Evidence("ev-c", "outcome", {"ok": True}), Evidence("ev-d", "note", {"text": "done"})]
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED), items))
        found = view(store, "e-1")
        assert [(e.object_id, e.kind, dict(e.body)) for e in found.evidence] == [
            ("ev-a", "command", {"id": "cmd-1"}),
            ("ev-b", "step_attempt", {}),
            ("ev-c", "outcome", {"ok": True}),
            ("ev-d", "note", {"text": "done"}),
        ]

    def test_append_evidence_changes_no_row(self, store: Store) -> None:
        credential = self.running(store)
        before = view(store, "e-1")
        decision = decided(store.append_evidence("e-1", credential, [Evidence("ev-a", "command")]))
        assert decision.execution is None and decision.dispatch is None
        after = view(store, "e-1")
        assert attrs.evolve(after, evidence=(), evidence_revisions=()) == before
        assert [e.object_id for e in after.evidence] == ["ev-a"]

    def test_append_evidence_after_expiry_is_refused(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        clock.advance(LEASE)
        refused(
            store, lambda: store.append_evidence("e-1", credential, [Evidence("ev-a", "note")]), RC.LEASE_EXPIRED
        )

    @pytest.mark.parametrize("where", ["same_execution", "other_execution", "same_request"])
    def test_a_reused_evidence_id_is_a_conflict_that_changes_nothing(self, store: Store, where: str) -> None:
        credential = self.running(store, "e-1", "w-1")
        other = self.running(store, "e-2", "w-2")
        decided(store.append_evidence("e-1", credential, [Evidence("ev-1", "note", {"first": True})]))
        items: Sequence[Evidence]
        if where == "same_execution":
            holder, execution_id, items = credential, "e-1", [Evidence("ev-1", "outcome", {"first": False})]
        elif where == "other_execution":
            holder, execution_id, items = other, "e-2", [Evidence("ev-1", "outcome")]
        else:
            holder, execution_id, items = other, "e-2", [Evidence("ev-2", "outcome"), Evidence("ev-2", "note")]
        request = finalize_request(store, execution_id, holder, ExecutionState.SUCCEEDED)
        store_error(store, lambda: store.finalize(request, items), "evidence_conflict")
        step = step_request(store, execution_id, holder)
        store_error(store, lambda: store.record_step(execution_id, step, items), "evidence_conflict")
        store_error(store, lambda: store.append_evidence(execution_id, holder, items), "evidence_conflict")
        assert view(store, "e-1").evidence[0].body == {"first": True}

    def test_evidence_of_a_refused_decision_is_not_visible(self, store: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        request = finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED)
        clock.advance(LEASE)
        refused(store, lambda: store.finalize(request, [Evidence("ev-lost", "outcome")]), RC.LEASE_EXPIRED)
        # The id was not taken either: a later holder may use it.
        clock.advance(timedelta(seconds=1))
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))
        decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.RESUME_SAFE, "r-1")))
        _, live = claim(store, "w-2")
        decided(
            store.finalize(
                finalize_request(store, "e-1", live, ExecutionState.SUCCEEDED), [Evidence("ev-lost", "outcome")]
            )
        )
        assert [e.object_id for e in view(store, "e-1").evidence] == ["ev-lost"]

    # --- history ----------------------------------------------------------------------------------

    def test_history_is_every_revision_and_every_record_in_order(self, store: Store, clock: ManualClock) -> None:
        decisions = [admit(store, "e-1")]
        decisions.append(decided(store.claim_next(p.ClaimRequest("w-1", "t-1", LEASE))))
        credential = decisions[-1].lease
        assert credential is not None
        decisions.append(decided(store.renew("e-1", p.RenewRequest(credential, LEASE))))
        decisions.append(decided(store.record_step("e-1", step_request(store, "e-1", credential))))
        spec = wait_spec("a-9")
        decisions.append(
            decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=spec)))
        )
        decisions.append(decided(store.wake(wake_request(p.WaitKey("e-1", "n-wait", "a-9")))))
        decisions.append(decided(store.claim_next(p.ClaimRequest("w-2", "t-2", LEASE))))
        clock.advance(LEASE)
        decisions.append(
            decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))
        )
        decisions.append(decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1"))))
        found = view(store, "e-1")
        written = [d.execution for d in decisions if d.execution is not None]
        assert list(found.revisions) == written
        assert [r.revision for r in found.revisions] == list(range(1, len(written) + 1))
        assert list(found.history) == [record for d in decisions for record in d.evidence]
        assert [r.command_id for r in found.recoveries] == ["q-1", "f-1"]
        assert found.execution == written[-1] and found.dispatch == decisions[-1].dispatch
        assert_coherent(found)

    def test_refusals_leave_no_history(self, store: Store) -> None:
        credential = self.running(store)
        before = view(store, "e-1")
        refused(store, lambda: store.release("e-1", p.ReleaseRequest(credential, 1)), RC.STALE_REVISION)
        refused(store, lambda: store.cancel(p.CancelRequest("e-1", "b-1", 2, GRANTED)), RC.CANCEL_RUNNING)
        assert view(store, "e-1").history == before.history

    # --- expired ----------------------------------------------------------------------------------

    def test_expired_lists_exactly_running_work_past_its_lease(self, store: Store, clock: ManualClock) -> None:
        admit(store, "e-eligible")
        admit(store, "e-long")
        admit(store, "e-short")
        admit(store, "e-done")
        # Claim order is by id within the same eligible_at: done, eligible, long, short.
        done_id, done = claim(store, "w-1", lease=timedelta(seconds=5))
        assert done_id == "e-done"
        decided(store.finalize(finalize_request(store, "e-done", done, ExecutionState.SUCCEEDED)))
        decided(store.cancel(p.CancelRequest("e-eligible", "b-1", 1, GRANTED)))
        admit(store, "e-fresh")
        assert claim(store, "w-2", lease=timedelta(seconds=60))[0] == "e-fresh"
        assert claim(store, "w-3", lease=timedelta(seconds=60))[0] == "e-long"
        assert claim(store, "w-4", lease=timedelta(seconds=10))[0] == "e-short"
        assert store.expired() == []
        clock.advance(timedelta(seconds=10))  # exactly e-short's expiry
        assert store.expired() == ["e-short"]
        clock.advance(timedelta(seconds=60))
        assert store.expired() == ["e-fresh", "e-long", "e-short"]

    # --- evidence revisions ------------------------------------------------------------------------

    def test_an_evidence_revision_lands_only_on_top_of_the_previous_one(self, store: Store) -> None:
        credential = self.running(store)
        first = Evidence("att-1", "StepAttempt", {"status": "pending"}, 1, "pending")
        decided(store.append_evidence("e-1", credential, [first]))
        second = first.next("running", {"status": "running"})
        decided(store.append_evidence("e-1", credential, [second]))
        before = view(store, "e-1")
        for stale in (second, first.next("failed", {}), attrs.evolve(second, revision=4)):
            with pytest.raises(StoreError) as caught:
                store.append_evidence("e-1", credential, [stale])
            assert caught.value.code == "evidence_conflict"
        assert view(store, "e-1") == before
        assert [(e.revision, e.state) for e in before.evidence_revisions] == [(1, "pending"), (2, "running")]
        assert [(e.object_id, e.revision, e.state) for e in before.evidence] == [("att-1", 2, "running")]

    def test_an_evidence_revision_of_another_execution_is_refused(self, store: Store) -> None:
        credential = self.running(store)
        decided(store.append_evidence("e-1", credential, [Evidence("att-1", "StepAttempt", {}, 1, "pending")]))
        other = self.running(store, "e-2", "w-2")
        before = view(store, "e-1")
        with pytest.raises(StoreError) as caught:
            store.append_evidence("e-2", other, [Evidence("att-1", "StepAttempt", {}, 2, "running")])
        assert caught.value.code == "evidence_conflict"
        assert view(store, "e-1") == before

    # --- definitions ---------------------------------------------------------------------------------

    def test_a_definition_registers_each_revision_once(self, store: Store) -> None:
        first = _definition(1)
        assert store.register_definition(first, "b-1", GRANTED) is True
        assert store.register_definition(first, "b-1", GRANTED) is False  # identical: idempotent
        with pytest.raises(DefinitionError):
            store.register_definition(_definition(3), "b-1", GRANTED)  # a gap
        with pytest.raises(DefinitionError):
            store.register_definition(_definition(1, end="failed"), "b-1", GRANTED)  # same revision, other content
        assert store.register_definition(_definition(2, node_revision=2, end="failed"), "b-1", GRANTED) is True
        assert store.load_definition("b-1", "d-1") == _definition(2, node_revision=2, end="failed")
        assert store.load_definition("b-1", "d-1", 1) == first
        assert store.load_definition("b-1", "d-1", 3) is None
        assert store.load_definition("b-2", "d-1") is None  # another Business's definitions do not exist
        with pytest.raises(StoreError) as caught:
            store.register_definition(_definition(1), "b-2", DENIED)
        assert caught.value.code == "not_authorized"
        assert store.load_definition("b-2", "d-1") is None

    def test_a_definition_revision_kept_in_memory_is_the_registered_one(self, store: Store) -> None:
        # A revision loaded by number is kept (load_definition); what may
        # still change, the latest revision and one not yet registered, must
        # be read afresh, and a kept revision never leaks into another Business.
        first = _definition(1)
        assert store.load_definition("b-1", "d-1", 1) is None
        store.register_definition(first, "b-1", GRANTED)
        assert store.load_definition("b-1", "d-1", 1) == first
        assert store.load_definition("b-1", "d-1", 1) == first
        assert store.load_definition("b-1", "d-1", 2) is None
        second = _definition(2, node_revision=2, end="failed")
        store.register_definition(second, "b-1", GRANTED)
        assert store.load_definition("b-1", "d-1") == second
        assert store.load_definition("b-1", "d-1", 2) == second
        assert store.load_definition("b-1", "d-1", 1) == first
        assert store.load_definition("b-2", "d-1", 1) is None
        other = _definition(1, end="failed")
        store.register_definition(other, "b-2", GRANTED)
        assert store.load_definition("b-2", "d-1", 1) == other
        assert store.load_definition("b-1", "d-1", 1) == first

    # --- events ----------------------------------------------------------------------------------------

    def test_an_event_wakes_exactly_the_waiters_it_matches(self, store: Store) -> None:
        spec = wait_spec(continuations=(("event", "n-next"),))
        key = self.waiting(store, spec)
        other = self.waiting(store, wait_spec(correlation=(("order", "o-2"),)), "e-2")
        result = store.publish_event(_event("ev-1", ("order", "o-1"), ("extra", "x")), GRANTED)
        assert (result.duplicate, result.woken) == (False, ("e-1",))
        woken = view(store, "e-1")
        assert woken.execution.state == ExecutionState.ELIGIBLE
        assert woken.execution.current_node_id == "n-next"  # the registration's continuation for 'event'
        assert woken.registrations[0].woken_by == "ev-1" and woken.registrations[0].key == key
        assert view(store, "e-2").execution.state == ExecutionState.WAITING
        assert view(store, "e-2").registrations[0].key == other

    def test_an_event_of_another_business_or_type_wakes_nothing(self, store: Store) -> None:
        self.waiting(store, wait_spec())
        before = view(store, "e-1")
        assert store.publish_event(_event("ev-1", ("order", "o-1"), business="b-2"), GRANTED).woken == ()
        assert store.publish_event(_event("ev-2", ("order", "o-1"), event_type="payment.refunded"), GRANTED).woken == ()
        assert view(store, "e-1") == before

    def test_republishing_an_event_is_idempotent_and_other_content_is_refused(self, store: Store) -> None:
        self.waiting(store, wait_spec())
        assert store.publish_event(_event("ev-1", ("order", "o-1")), GRANTED).woken == ("e-1",)
        after = view(store, "e-1")
        again = store.publish_event(_event("ev-1", ("order", "o-1")), GRANTED)
        assert (again.duplicate, again.woken) == (True, ())
        with pytest.raises(StoreError) as caught:
            store.publish_event(_event("ev-1", ("order", "o-9")), GRANTED)
        assert caught.value.code == "event_conflict"
        with pytest.raises(StoreError) as denied:
            store.publish_event(_event("ev-3", ("order", "o-1")), DENIED)
        assert denied.value.code == "not_authorized"
        assert view(store, "e-1") == after

    def test_an_event_committed_before_registration_wakes_the_waiter_as_it_registers(self, store: Store) -> None:
        assert store.publish_event(_event("ev-early", ("order", "o-1")), GRANTED).woken == ()
        credential = self.running(store)
        spec = wait_spec(continuations=(("event", "n-next"),))
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=spec)))
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.ELIGIBLE
        assert found.execution.current_node_id == "n-next"
        assert [r.to_state for r in found.history][-2:] == [ExecutionState.WAITING, ExecutionState.ELIGIBLE]
        assert found.registrations[0].woken_by == "ev-early"

    # --- timers --------------------------------------------------------------------------------------

    def test_a_timeout_is_due_at_commit_time_plus_its_delay_and_wakes_as_timeout(
        self, store: Store, clock: ManualClock
    ) -> None:
        spec = wait_spec(wake_after=timedelta(minutes=5), timeout=True, continuations=(("timeout", "n-late"),))
        key = self.waiting(store, spec)
        committed = view(store, "e-1").registrations[0].spec
        assert committed.wake_at == clock.now() + timedelta(minutes=5) and committed.wake_after is None
        clock.advance(timedelta(minutes=5) - timedelta(microseconds=1))
        assert store.due_wakes() == []
        clock.advance(timedelta(microseconds=1))
        assert store.due_wakes() == [key]
        decided(store.fire_timer(key, GRANTED))
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.ELIGIBLE and found.execution.current_node_id == "n-late"
        assert found.registrations[0].wake_reason == p.WakeReason.TIMEOUT
        assert store.due_wakes() == []
        assert isinstance(store.fire_timer(key, GRANTED), p.Unchanged)

    def test_cancelling_a_waiter_closes_its_registration(self, store: Store, clock: ManualClock) -> None:
        due = clock.now() + timedelta(seconds=5)
        key = self.waiting(store, wait_spec(wake_at=due, timeout=True))
        decision = decided(store.cancel(p.CancelRequest("e-1", "b-1", revision(store, "e-1"), GRANTED)))
        assert decision.closes == p.WaitClosure(key, ExecutionEvent.CANCEL)
        (registration,) = view(store, "e-1").registrations
        assert (registration.woken_by, registration.closed_by, registration.is_open) == (None, "cancel", False)
        clock.set(due)
        assert store.due_wakes() == []
        refused(store, lambda: store.fire_timer(key, GRANTED), RC.NOT_WAITING)
        assert store.publish_event(_event("ev-late", ("order", "o-1")), GRANTED).woken == ()
        assert view(store, "e-1").registrations == (registration,)

    def test_registrations_nothing_waits_on_never_starve_a_due_timer(self, store: Store, clock: ManualClock) -> None:
        # More cancelled waiters than one pass's limit, all due before the
        # live one: a pass must still return, and fire, the live one.
        start = clock.now()
        limit = 3
        for n in range(limit + 2):
            self.waiting(store, wait_spec(f"a-stale-{n}", event_type=None, wake_at=start), f"e-stale-{n}")
            decided(store.cancel(p.CancelRequest(f"e-stale-{n}", "b-1", revision(store, f"e-stale-{n}"), GRANTED)))
        live = self.waiting(store, wait_spec("a-live", event_type=None, wake_at=start + timedelta(seconds=1)), "e-live")
        clock.set(start + timedelta(seconds=1))
        assert store.due_wakes(limit) == [live]
        assert store.due_wakes(limit, business_id="b-1") == [live]
        decided(store.fire_timer(live, GRANTED))
        assert view(store, "e-live").execution.state == ExecutionState.ELIGIBLE
        assert store.due_wakes(limit) == []

    # --- approvals ------------------------------------------------------------------------------------

    def test_the_first_determination_wins_and_later_ones_change_nothing(self, store: Store) -> None:
        request = self.awaiting_approval(store)
        accepted = store.decide_approval(_decision(request, "d-1", "approved"))
        assert isinstance(accepted, p.Decision)
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.ELIGIBLE and found.execution.current_node_id == "n-yes"
        same = store.decide_approval(_decision(request, "d-1", "approved"))
        assert isinstance(same, p.Unchanged) and same.code == p.UnchangedCode.ALREADY_DECIDED
        conflict = store.decide_approval(_decision(request, "d-2", "rejected"))
        assert isinstance(conflict, approvals.Recorded)
        after = view(store, "e-1")
        assert after.execution == found.execution
        assert {(e.object_id.rsplit("/", 1)[1], e.state) for e in after.evidence if e.kind == approvals.APPROVAL_DECISION} == {
            ("d-1", "accepted"), ("d-2", "rejected_conflict")
        }
        reused = store.decide_approval(_decision(request, "d-1", "rejected"))
        assert isinstance(reused, p.Refusal) and reused.code == RC.DECISION_CONFLICT

    def test_a_refused_decision_writes_nothing(self, store: Store) -> None:
        request = self.awaiting_approval(store)
        before = view(store, "e-1")
        misbound = attrs.evolve(
            _decision(request, "d-1", "approved"), binding=approvals.Binding("other.op", request.binding.targets, ())
        )
        for decision, code in (
            (misbound, RC.APPROVAL_MISBOUND),
            (attrs.evolve(_decision(request, "d-2", "approved"), authority=DENIED), RC.NOT_AUTHORIZED),
            (attrs.evolve(_decision(request, "d-3", "approved"), reviewer_id="rev-outside"), RC.NOT_AUTHORIZED),
            (attrs.evolve(_decision(request, "d-4", "approved"), reviewer_id=request.requester_id), RC.NOT_AUTHORIZED),
            (attrs.evolve(_decision(request, "d-5", "approved"), business_id="b-2"), RC.APPROVAL_NOT_FOUND),
        ):
            outcome = store.decide_approval(decision)
            assert isinstance(outcome, p.Refusal) and outcome.code == code, (decision, outcome)
        assert view(store, "e-1") == before

    def awaiting_approval(self, store: Store) -> approvals.ApprovalRequest:
        """e-1 waits on an approval request (as a request_approval visit leaves it)."""
        credential = self.running(store)
        request = approvals.ApprovalRequest(
            request_id="att-1/approval",
            execution_id="e-1",
            business_id="b-1",
            node_id="n-ask",
            attempt_id="att-1",
            binding=approvals.Binding("purchase.approve", (("o-1", 3),), (("policy-1", 2),)),
            requester_id="user:requester",
            reviewers=("rev-1", "user:requester"),
            distinct_reviewer=True,
        )
        spec = p.WaitSpec(
            "n-ask",
            "att-1",
            "fencekeeper.approval",
            (("request_id", request.request_id),),
            continuations=(("approved", "n-yes"), ("rejected", "n-no")),
        )
        decided(
            store.finalize(
                finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=spec), [request.evidence()]
            )
        )
        return request


def _decision(request: approvals.ApprovalRequest, decision_id: str, determination: str) -> approvals.ApprovalDecision:
    return approvals.ApprovalDecision(
        decision_id, request.request_id, request.business_id, "rev-1", determination, request.binding, GRANTED
    )


def _event(
    event_id: str, *pairs: tuple[str, str], business: str = "b-1", event_type: str = EVENT_TYPE
) -> Event:
    return Event.build(event_id, business, event_type, dict(pairs), {"amount": 1})


def _definition(revision: int, *, node_revision: int = 1, end: str = "succeeded") -> Definition:
    return definition_from_mapping(
        {
            "id": "d-1",
            "revision": revision,
            "start": "start",
            "nodes": [
                {
                    "id": "start",
                    "kind": "end",
                    "revision": node_revision,
                    "outcome": end,
                    **({"error_code": "e.code"} if end == "failed" else {}),
                }
            ],
        }
    )


__all__ = [
    "CONTRACT",
    "CORRELATION",
    "DENIED",
    "EVENT_TYPE",
    "GOVERNOR",
    "GRANTED",
    "LEASE",
    "LOAD_TEST_NODES",
    "RC",
    "RequestTests",
    "StoreFactory",
    "admit",
    "assert_coherent",
    "claim",
    "command_evidence",
    "decided",
    "evidence_key",
    "finalize_request",
    "recovery_request",
    "refused",
    "register_pinned",
    "resume_at_current_node",
    "revision",
    "snapshot",
    "step_request",
    "store_error",
    "unchanged",
    "view",
    "wait_spec",
    "wake_request",
]
