"""Every decision of ``kernel/protocol.py``, one behaviour at a time.

What this module proves, decision by decision (seed 000: Lease; Fenced
Execution Finalization; wait_for_event; Cancellation; Recovery and
reconciliation extension; seed 001: Claims, leases, and fencing):

- admit makes revision 1 of an eligible execution and an eligible dispatch
  row, and is guarded on "does not exist yet";
- claim takes only eligible, due work and hands out token, worker, expiry and
  the next fence, returning the credential;
- renew, record_step, release and finalize act only for the current token,
  worker and fence before expiry (``now == expiry`` is expired), each wrong
  part of a credential with its own code;
- finalize checks the seed's twelve preconditions *in the seed's order*: a
  request failing preconditions k..12 at once is refused with the k-th code,
  for every k; each of the five targets moves both rows coherently, clears
  the lease and bumps the revision by one; its guard needs a live lease at
  commit;
- wake matches exactly and only when due; the first committed wake wins and
  repeats are Unchanged; it never touches a non-waiting execution;
- cancel wins only against eligible or waiting work, and races claim and
  wake through the guard so that exactly one of two decisions commits;
- recover: quarantine only of an expired claim and not by its holder, fail,
  resume_safe only with the whole proof, reconcile_command only with an
  unresolved Command, idempotent replay and conflicts by command identity;
- malformed input to every decision is a Refusal(INVALID_REQUEST) naming the
  field, never an exception and never a Decision;
- decisions are pure: same inputs, same outcome, inputs untouched;
- (Hypothesis) random credentials, revisions, targets and times around the
  expiry never raise, and every lease-bound Decision was made with the
  current token, worker and fence before expiry.

The tests at the end ("Regressions") each reproduce a defect these tests
found in the kernel: caller-sendable input that escaped as an exception or
was taken as a granted fact, and review, cancel and wake decisions that
ignored the dispatch row's state.  They failed against the kernel when
written and must keep passing.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fencekeeper.kernel import recovery
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState, dispatch_state_of
from fencekeeper.kernel.protocol import (
    FINALIZE_TARGETS,
    STEP_LIMIT,
    AdmitRequest,
    Authority,
    CancelRequest,
    ClaimRequest,
    Decision,
    Dispatch,
    Execution,
    FinalizeRequest,
    Guard,
    LeaseCredential,
    MalformedSnapshot,
    Outcome,
    RecoveryKind,
    RecoveryRecord,
    RecoveryRequest,
    Refusal,
    RefusalCode,
    ReleaseRequest,
    RenewRequest,
    StepRecord,
    StepRequest,
    Unchanged,
    UnchangedCode,
    WaitClosure,
    WaitKey,
    WaitRegistration,
    WaitSpec,
    WakeReason,
    WakeRequest,
    admit,
    cancel,
    claim,
    fenced,
    finalize,
    record_step,
    release,
    renew,
    snapshot_problem,
    wake,
)

# --- builders -------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
EXPIRES = T0 + LEASE
TICK = timedelta(microseconds=1)

EXEC_ID = "ex-1"
BUSINESS = "biz-1"
WORKER = "worker-1"
TOKEN = "token-1"
OPERATOR = "operator-1"

GRANTED = Authority(granted=True, principal_id="principal-1")
DENIED = Authority(granted=False, principal_id="principal-1", reason="membership revoked")

EVENT_SPEC = WaitSpec(
    node_id="node-wait",
    attempt_id="attempt-1",
    event_type="order.paid",
    correlation=(("order_id", "o-42"), ("tenant", "t-1")),
)
TIMER_SPEC = WaitSpec(node_id="node-wait", attempt_id="attempt-1", event_type=None, wake_at=T0 + timedelta(hours=1))
TIMEOUT_SPEC = WaitSpec(
    node_id="node-wait",
    attempt_id="attempt-1",
    event_type="order.paid",
    correlation=(("order_id", "o-42"),),
    wake_at=T0 + timedelta(hours=1),
    timeout=True,
)
CONTRACT = "resume-from-node-2-v1"
UNKNOWN_COMMAND = Evidence("cmd-unknown-7", "Command", {"attempt_id": "a-7"}, 2, "unknown")
QUARANTINED_ATTEMPT = Evidence(
    "a-7", "StepAttempt", {"node_id": "n", "node_kind": "local_command", "command_id": "cmd-unknown-7"}, 3,
    "reconciliation_required",
)
SETTLEMENT = (
    UNKNOWN_COMMAND.next("succeeded", {"status": "succeeded"}),
    QUARANTINED_ATTEMPT.next("completed", {"status": "completed", "next_node_id": "n"}),
)


def facts_for(execution: Execution | None, *, command: bool = False, pinned: bool = True) -> recovery.RecoveryFacts:
    """What a store would hold: the pinned definition (holding the current node) and, with ``command``,
    an unknown Command of a quarantined visit with its settlement submitted."""
    if execution is None or execution.current_node_id is None:
        return recovery.RecoveryFacts()
    definition = PinnedDefinition(execution.definition_id, execution.definition_revision, execution.current_node_id)
    evidence = (QUARANTINED_ATTEMPT, UNKNOWN_COMMAND) if command else ()
    return recovery.RecoveryFacts(
        evidence, definition if pinned else None, SETTLEMENT if command else ()  # type: ignore[arg-type]
    )


@attrs.frozen
class PinnedDefinition:
    """What the kernel reads of a pinned definition: its identity and whether it holds a node."""

    definition_id: str
    revision: int
    node_id: str

    def node(self, node_id: str) -> object | None:
        return object() if node_id == self.node_id else None


def recover(
    execution: Execution | None,
    dispatch: Dispatch | None,
    prior: RecoveryRecord | None,
    request: RecoveryRequest,
    now: datetime,
    *,
    facts: recovery.RecoveryFacts | None = None,
) -> Outcome:
    """The kernel's recover, on the facts a store holding a settled history would pass."""
    if facts is None:
        facts = facts_for(execution, command=request.kind == RecoveryKind.RECONCILE_COMMAND)
    return recovery.recover(execution, dispatch, prior, request, now, facts=facts)


@attrs.frozen
class Snap:
    """The rows a store would hand a decision, plus what the last decision gave back."""

    execution: Execution
    dispatch: Dispatch
    credential: LeaseCredential | None = None
    registration: WaitRegistration | None = None
    recovery: RecoveryRecord | None = None

    @property
    def lease(self) -> LeaseCredential:
        assert self.credential is not None, "this snapshot holds no lease"
        return self.credential


def decided(outcome: Outcome) -> Decision:
    assert isinstance(outcome, Decision), outcome
    return outcome


def refused(outcome: Outcome, code: RefusalCode) -> Refusal:
    assert isinstance(outcome, Refusal), outcome
    assert outcome.code == code, outcome
    return outcome


def applied(snap: Snap, decision: Decision) -> Snap:
    """The rows after the store commits ``decision`` (what a later decision would see)."""
    return Snap(
        execution=decision.execution or snap.execution,
        dispatch=decision.dispatch or snap.dispatch,
        credential=decision.lease or snap.credential,
        registration=decision.registration or snap.registration,
        recovery=decision.recovery or snap.recovery,
    )


def admitted(now: datetime = T0, execution_id: str = EXEC_ID, business_id: str = BUSINESS) -> Snap:
    request = AdmitRequest(execution_id, business_id, "def-1", 1, "node-start", GRANTED)
    decision = decided(admit(None, request, now))
    assert decision.execution is not None and decision.dispatch is not None
    return Snap(decision.execution, decision.dispatch)


def claimed(
    snap: Snap, now: datetime = T0, worker: str = WORKER, token: str = TOKEN, duration: timedelta = LEASE
) -> Snap:
    return applied(snap, decided(claim(snap.execution, snap.dispatch, ClaimRequest(worker, token, duration), now)))


def leased(now: datetime = T0, worker: str = WORKER, token: str = TOKEN, duration: timedelta = LEASE) -> Snap:
    """Admit and claim one execution: running, claimed, fence 1, revision 2."""
    return claimed(admitted(now), now, worker, token, duration)


def finalize_request(
    snap: Snap, target: ExecutionState | str = ExecutionState.SUCCEEDED, **changes: Any
) -> FinalizeRequest:
    """A finalization that passes every precondition for ``snap``'s lease."""
    request = FinalizeRequest(
        execution_id=snap.execution.execution_id,
        dispatch_id=snap.dispatch.workflow_execution_id,
        worker_id=snap.lease.worker_id,
        lease_token=snap.lease.lease_token,
        fence=snap.lease.fence,
        target_state=target,
        business_id=snap.execution.business_id,
        expected_revision=snap.execution.revision,
        authority=GRANTED,
        wait=EVENT_SPEC if target in (ExecutionState.WAITING, "waiting") else None,
    )
    return attrs.evolve(request, **changes)


def finalized(target: ExecutionState, wait: WaitSpec | None = None) -> Snap:
    snap = leased()
    changes: dict[str, Any] = {} if wait is None else {"wait": wait}
    return applied(
        snap, decided(finalize(snap.execution, snap.dispatch, finalize_request(snap, target, **changes), T0))
    )


def waiting(spec: WaitSpec = EVENT_SPEC) -> Snap:
    return finalized(ExecutionState.WAITING, spec)


def cancelled() -> Snap:
    snap = admitted()
    return applied(
        snap, decided(cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, 1, GRANTED), T0))
    )


def in_state(state: ExecutionState) -> Snap:
    """Coherent rows of one execution in ``state``, reached through the protocol itself."""
    if state == ExecutionState.ELIGIBLE:
        return admitted()
    if state == ExecutionState.RUNNING:
        return leased()
    if state == ExecutionState.CANCELLED:
        return cancelled()
    return finalized(state)


def recovery_request(snap: Snap, kind: RecoveryKind, **changes: Any) -> RecoveryRequest:
    request = RecoveryRequest(
        command_id="cmd-1",
        kind=kind,
        execution_id=snap.execution.execution_id,
        business_id=snap.execution.business_id,
        expected_revision=snap.execution.revision,
        actor_id=OPERATOR,
        authority=GRANTED,
        command_to_reconcile="cmd-unknown-7" if kind == RecoveryKind.RECONCILE_COMMAND else None,
        next_node_id=(
            snap.execution.current_node_id
            if kind in (RecoveryKind.RESUME_SAFE, RecoveryKind.RESUME_SUSPENDED)
            else None
        ),
        rationale=CONTRACT,
    )
    return attrs.evolve(request, **changes)


def wake_request(
    snap: Snap, reason: WakeReason = WakeReason.EVENT, source: str = "event-1", **changes: Any
) -> WakeRequest:
    """A wake that matches ``snap``'s registration exactly."""
    assert snap.registration is not None
    spec = snap.registration.spec
    request = WakeRequest(
        key=snap.registration.key,
        reason=reason,
        source_id=source,
        business_id=BUSINESS,
        authority=GRANTED,
        event_type=spec.event_type if reason in (WakeReason.EVENT, WakeReason.DECISION) else None,
        correlation=spec.correlation if reason in (WakeReason.EVENT, WakeReason.DECISION) else (),
    )
    return attrs.evolve(request, **changes)


def steps_counted(snap: Snap, steps: int) -> Snap:
    """``snap`` with ``steps`` steps processed: both rows count them (specs/protocol.md, INV-STEP-LIMIT)."""
    return attrs.evolve(
        snap,
        execution=attrs.evolve(snap.execution, step_count=steps),
        dispatch=attrs.evolve(snap.dispatch, step_count=steps),
    )


def lease_cleared(dispatch: Dispatch) -> bool:
    return dispatch.lease_token is None and dispatch.leased_by is None and dispatch.lease_expires_at is None


def holds(guard: Guard, snap: Snap, now: datetime = T0) -> bool:
    return guard.holds(snap.execution, snap.dispatch, now)


# --- admit ------------------------------------------------------------------------


def test_admit_makes_revision_one_eligible_and_a_due_eligible_row() -> None:
    request = AdmitRequest(EXEC_ID, BUSINESS, "def-1", 3, "node-start", GRANTED)
    decision = decided(admit(None, request, T0))
    assert decision.execution == Execution(
        execution_id=EXEC_ID,
        business_id=BUSINESS,
        state=ExecutionState.ELIGIBLE,
        revision=1,
        definition_id="def-1",
        definition_revision=3,
        current_node_id="node-start",
        step_count=0,
        fence=0,
        wait=None,
    )
    assert decision.dispatch == Dispatch(
        workflow_execution_id=EXEC_ID, dispatch_state=DispatchState.ELIGIBLE, eligible_at=T0
    )
    assert lease_cleared(decision.dispatch)
    (record,) = decision.evidence
    assert (record.from_state, record.to_state, record.revision, record.actor) == (
        None,
        ExecutionState.ELIGIBLE,
        1,
        GRANTED.principal_id,
    )
    assert decision.lease is None and decision.registration is None and decision.recovery is None


def test_admit_guard_expects_nothing_to_exist() -> None:
    decision = decided(admit(None, AdmitRequest(EXEC_ID, BUSINESS, "def-1", 1, "n", GRANTED), T0))
    assert decision.guard.expected_revision == 0
    assert decision.guard.holds(None, None, T0)
    # Once the rows exist (someone else admitted first) the guard fails.
    existing = admitted()
    assert not holds(decision.guard, existing)
    assert not decision.guard.holds(existing.execution, None, T0)


def test_admit_refuses_an_existing_execution() -> None:
    existing = admitted()
    outcome = admit(existing.execution, AdmitRequest(EXEC_ID, BUSINESS, "def-1", 1, "n", GRANTED), T0)
    assert EXEC_ID in refused(outcome, RefusalCode.ALREADY_EXISTS).message


def test_admit_needs_authority() -> None:
    outcome = admit(None, AdmitRequest(EXEC_ID, BUSINESS, "def-1", 1, "n", DENIED), T0)
    assert "membership revoked" in refused(outcome, RefusalCode.NOT_AUTHORIZED).message


# --- claim ------------------------------------------------------------------------


def test_claim_assigns_token_worker_expiry_and_the_next_fence() -> None:
    snap = admitted()
    now = T0 + timedelta(seconds=5)
    decision = decided(claim(snap.execution, snap.dispatch, ClaimRequest(WORKER, TOKEN, LEASE), now))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.RUNNING
    assert decision.execution.revision == snap.execution.revision + 1
    assert decision.execution.fence == snap.execution.fence + 1 == 1
    assert decision.dispatch.dispatch_state == DispatchState.CLAIMED
    assert decision.dispatch.lease_token == TOKEN
    assert decision.dispatch.leased_by == WORKER
    assert decision.dispatch.lease_expires_at == now + LEASE
    assert decision.lease == LeaseCredential(WORKER, TOKEN, 1)
    (record,) = decision.evidence
    assert (record.event, record.lease_token, record.fence, record.actor) == (ExecutionEvent.CLAIM, TOKEN, 1, WORKER)
    # The guard: the rows as they were, no lease yet; not a live-lease guard.
    assert decision.guard.expected_lease_token is None and decision.guard.expected_lease_expires_at is None
    assert not decision.guard.requires_live_lease
    assert holds(decision.guard, snap, now)


def test_a_second_claim_after_release_gets_a_new_fence() -> None:
    first = leased()
    released = applied(first, decided(release(first.execution, first.dispatch, ReleaseRequest(first.lease, 2), T0)))
    second = claimed(released, T0, worker="worker-2", token="token-2")
    assert second.lease == LeaseCredential("worker-2", "token-2", 2)
    assert second.execution.fence == 2


@pytest.mark.parametrize("state", [s for s in ExecutionState if s != ExecutionState.ELIGIBLE], ids=lambda s: s.value)
def test_claim_refuses_every_state_but_eligible(state: ExecutionState) -> None:
    snap = in_state(state)
    outcome = claim(snap.execution, snap.dispatch, ClaimRequest("worker-2", "token-2", LEASE), T0 + timedelta(hours=2))
    assert state.value in refused(outcome, RefusalCode.NOT_ELIGIBLE).message


def test_claim_refuses_eligible_work_that_is_not_due_yet() -> None:
    snap = admitted(now=T0)
    request = ClaimRequest(WORKER, TOKEN, LEASE)
    refused(claim(snap.execution, snap.dispatch, request, T0 - TICK), RefusalCode.NOT_ELIGIBLE)
    decided(claim(snap.execution, snap.dispatch, request, T0))


def test_claim_refuses_missing_or_mismatched_rows() -> None:
    snap = admitted()
    request = ClaimRequest(WORKER, TOKEN, LEASE)
    refused(claim(None, snap.dispatch, request, T0), RefusalCode.EXECUTION_NOT_FOUND)
    refused(claim(snap.execution, None, request, T0), RefusalCode.DISPATCH_NOT_FOUND)
    other = attrs.evolve(snap.dispatch, workflow_execution_id="ex-2")
    refused(claim(snap.execution, other, request, T0), RefusalCode.IDENTITY_MISMATCH)


def test_two_claims_of_one_snapshot_cannot_both_commit() -> None:
    snap = admitted()
    first = decided(claim(snap.execution, snap.dispatch, ClaimRequest(WORKER, TOKEN, LEASE), T0))
    second = decided(claim(snap.execution, snap.dispatch, ClaimRequest("worker-2", "token-2", LEASE), T0))
    assert holds(first.guard, snap) and holds(second.guard, snap)
    after = applied(snap, first)
    assert not holds(second.guard, after)


# --- renew ------------------------------------------------------------------------


def test_renew_extends_the_lease_and_writes_only_the_dispatch_row() -> None:
    snap = leased()
    now = T0 + timedelta(seconds=20)
    decision = decided(renew(snap.execution, snap.dispatch, RenewRequest(snap.lease, LEASE), now))
    assert decision.execution is None
    assert decision.dispatch == attrs.evolve(snap.dispatch, lease_expires_at=now + LEASE)
    assert decision.guard.requires_live_lease
    assert decision.guard.expected_revision == snap.execution.revision
    (record,) = decision.evidence
    # A renewal is not a new revision of the execution object.
    assert record.event == ExecutionEvent.RENEW and record.revision == snap.execution.revision
    assert holds(decision.guard, snap, now)
    assert not holds(decision.guard, snap, EXPIRES)


def test_renew_is_allowed_up_to_the_last_instant_before_expiry() -> None:
    snap = leased()
    request = RenewRequest(snap.lease, LEASE)
    decided(renew(snap.execution, snap.dispatch, request, EXPIRES - TICK))
    # Expiry is exclusive: at the expiry instant the lease is already gone.
    refused(renew(snap.execution, snap.dispatch, request, EXPIRES), RefusalCode.LEASE_EXPIRED)
    refused(renew(snap.execution, snap.dispatch, request, EXPIRES + timedelta(hours=1)), RefusalCode.LEASE_EXPIRED)


@pytest.mark.parametrize(
    ("credential", "code"),
    [
        (LeaseCredential(WORKER, "token-stale", 1), RefusalCode.LEASE_TOKEN_MISMATCH),
        (LeaseCredential("worker-2", TOKEN, 1), RefusalCode.WORKER_MISMATCH),
        (LeaseCredential(WORKER, TOKEN, 2), RefusalCode.STALE_FENCE),
    ],
    ids=["token", "worker", "fence"],
)
def test_renew_names_the_wrong_part_of_the_credential(credential: LeaseCredential, code: RefusalCode) -> None:
    snap = leased()
    refused(renew(snap.execution, snap.dispatch, RenewRequest(credential, LEASE), T0), code)


def test_an_old_fence_cannot_renew_even_with_the_same_token_and_worker() -> None:
    # Seed 001: once fence N+1 owns the execution, N cannot heartbeat.  The
    # same worker re-claims with the same token string, so only the fence
    # tells the old credential from the new one.
    first = leased()
    released = applied(first, decided(release(first.execution, first.dispatch, ReleaseRequest(first.lease, 2), T0)))
    second = claimed(released, T0)
    assert second.lease.lease_token == first.lease.lease_token and second.lease.worker_id == first.lease.worker_id
    refused(renew(second.execution, second.dispatch, RenewRequest(first.lease, LEASE), T0), RefusalCode.STALE_FENCE)
    decided(renew(second.execution, second.dispatch, RenewRequest(second.lease, LEASE), T0))


@pytest.mark.parametrize("state", [s for s in ExecutionState if s != ExecutionState.RUNNING], ids=lambda s: s.value)
def test_renew_refuses_unclaimed_rows(state: ExecutionState) -> None:
    snap = in_state(state)
    credential = LeaseCredential(WORKER, TOKEN, 1)
    refused(renew(snap.execution, snap.dispatch, RenewRequest(credential, LEASE), T0), RefusalCode.DISPATCH_NOT_CLAIMED)


# --- record_step and release --------------------------------------------------------


def test_record_step_counts_one_step_and_keeps_the_lease() -> None:
    snap = leased()
    step = StepRecord("node-2", "attempt-9")
    decision = decided(record_step(snap.execution, snap.dispatch, StepRequest(snap.lease, 2, step, GRANTED), T0))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.RUNNING
    assert decision.execution.revision == 3
    assert decision.execution.step_count == decision.dispatch.step_count == 1
    assert decision.execution.current_node_id == "node-2"
    assert (decision.dispatch.lease_token, decision.dispatch.leased_by, decision.dispatch.lease_expires_at) == (
        TOKEN,
        WORKER,
        EXPIRES,
    )
    assert decision.guard.requires_live_lease


def test_record_step_stops_at_the_step_limit() -> None:
    snap = leased()
    at_99 = steps_counted(snap, STEP_LIMIT - 1)
    request = StepRequest(snap.lease, 2, StepRecord("node-2", "attempt-9"), GRANTED)
    decision = decided(record_step(at_99.execution, at_99.dispatch, request, T0))
    assert decision.execution is not None and decision.execution.step_count == STEP_LIMIT == 100
    at_100 = steps_counted(snap, STEP_LIMIT)
    refused(record_step(at_100.execution, at_100.dispatch, request, T0), RefusalCode.STEP_LIMIT_REACHED)


def test_record_step_refuses_stale_revisions_denied_authority_and_expired_leases() -> None:
    snap = leased()
    step = StepRecord("node-2", "attempt-9")
    refused(
        record_step(snap.execution, snap.dispatch, StepRequest(snap.lease, 1, step, GRANTED), T0),
        RefusalCode.STALE_REVISION,
    )
    refused(
        record_step(snap.execution, snap.dispatch, StepRequest(snap.lease, 2, step, DENIED), T0),
        RefusalCode.NOT_AUTHORIZED,
    )
    refused(
        record_step(snap.execution, snap.dispatch, StepRequest(snap.lease, 2, step, GRANTED), EXPIRES),
        RefusalCode.LEASE_EXPIRED,
    )


def test_release_makes_the_execution_eligible_again_without_a_lease() -> None:
    snap = leased()
    now = T0 + timedelta(seconds=3)
    decision = decided(release(snap.execution, snap.dispatch, ReleaseRequest(snap.lease, 2), now))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.ELIGIBLE
    assert decision.dispatch.dispatch_state == DispatchState.ELIGIBLE
    assert decision.dispatch.eligible_at == now
    assert lease_cleared(decision.dispatch)
    assert decision.execution.revision == 3
    assert decision.guard.requires_live_lease
    refused(release(snap.execution, snap.dispatch, ReleaseRequest(snap.lease, 2), EXPIRES), RefusalCode.LEASE_EXPIRED)
    refused(release(snap.execution, snap.dispatch, ReleaseRequest(snap.lease, 3), now), RefusalCode.STALE_REVISION)


# --- finalize: the twelve preconditions in the seed's order ---------------------------


@attrs.frozen
class Finalization:
    """One finalize call: the rows, the request and the time."""

    execution: Execution | None
    dispatch: Dispatch | None
    request: FinalizeRequest
    now: datetime

    def run(self) -> Outcome:
        return finalize(self.execution, self.dispatch, self.request, self.now)


def _request_change(case: Finalization, **changes: Any) -> Finalization:
    return attrs.evolve(case, request=attrs.evolve(case.request, **changes))


def _execution_change(case: Finalization, **changes: Any) -> Finalization:
    # Once precondition 1 is broken there is no execution left to break further.
    if case.execution is None:
        return case
    return attrs.evolve(case, execution=attrs.evolve(case.execution, **changes))


def _dispatch_change(case: Finalization, **changes: Any) -> Finalization:
    if case.dispatch is None:
        return case
    return attrs.evolve(case, dispatch=attrs.evolve(case.dispatch, **changes))


# The seed's list, verbatim in order: "1. the WorkflowExecution exists; 2. the
# dispatch row exists; 3. execution and dispatch identities match; 4. dispatch
# state is claimed; 5. authoritative WorkflowExecution state is running; 6. the
# exact lease token matches; 7. the exact worker identity matches; 8. the lease
# is unexpired; 9. Business identities are consistent; 10. the expected current
# WorkflowExecution revision is current; 11. current authorization requirements
# are satisfied; 12. the target state is in the permitted set."
PRECONDITIONS: tuple[tuple[str, RefusalCode, Callable[[Finalization], Finalization]], ...] = (
    ("execution exists", RefusalCode.EXECUTION_NOT_FOUND, lambda c: attrs.evolve(c, execution=None)),
    ("dispatch exists", RefusalCode.DISPATCH_NOT_FOUND, lambda c: attrs.evolve(c, dispatch=None)),
    ("identities match", RefusalCode.IDENTITY_MISMATCH, lambda c: _request_change(c, dispatch_id="ex-2")),
    (
        "dispatch claimed",
        RefusalCode.DISPATCH_NOT_CLAIMED,
        # Without its lease, as a row that is not claimed is: one holding lease fields is raised (below).
        lambda c: _dispatch_change(
            c, dispatch_state=DispatchState.SUSPENDED, lease_token=None, leased_by=None, lease_expires_at=None
        ),
    ),
    (
        "execution running",
        RefusalCode.EXECUTION_NOT_RUNNING,
        lambda c: _execution_change(c, state=ExecutionState.SUSPENDED),
    ),
    ("token matches", RefusalCode.LEASE_TOKEN_MISMATCH, lambda c: _request_change(c, lease_token="token-stale")),
    ("worker matches", RefusalCode.WORKER_MISMATCH, lambda c: _request_change(c, worker_id="worker-2")),
    ("lease unexpired", RefusalCode.LEASE_EXPIRED, lambda c: attrs.evolve(c, now=EXPIRES)),
    ("business consistent", RefusalCode.BUSINESS_MISMATCH, lambda c: _request_change(c, business_id="biz-2")),
    ("revision current", RefusalCode.STALE_REVISION, lambda c: _request_change(c, expected_revision=1)),
    ("authorized", RefusalCode.NOT_AUTHORIZED, lambda c: _request_change(c, authority=DENIED)),
    (
        "target permitted",
        RefusalCode.TARGET_NOT_PERMITTED,
        lambda c: _request_change(c, target_state=ExecutionState.CANCELLED),
    ),
)


def _valid_finalization() -> Finalization:
    snap = leased()
    return Finalization(snap.execution, snap.dispatch, finalize_request(snap), T0 + timedelta(seconds=10))


def test_the_precondition_table_is_the_seeds_list() -> None:
    assert [code.value for _, code, _ in PRECONDITIONS] == [
        "execution_not_found",
        "dispatch_not_found",
        "identity_mismatch",
        "dispatch_not_claimed",
        "execution_not_running",
        "lease_token_mismatch",
        "worker_mismatch",
        "lease_expired",
        "business_mismatch",
        "stale_revision",
        "not_authorized",
        "target_not_permitted",
    ]
    # Without any breaker the request succeeds, so each refusal below is
    # caused by the breakers and nothing else.
    decided(_valid_finalization().run())


@pytest.mark.parametrize("k", range(1, 13), ids=[f"{k}-{name}" for k, (name, _, _) in enumerate(PRECONDITIONS, 1)])
def test_finalize_reports_the_first_failing_precondition(k: int) -> None:
    case = _valid_finalization()
    for _, _, breaks in PRECONDITIONS[k - 1 :]:
        case = breaks(case)
    refused(case.run(), PRECONDITIONS[k - 1][1])


@pytest.mark.parametrize("k", range(1, 13), ids=[f"{k}-{name}" for k, (name, _, _) in enumerate(PRECONDITIONS, 1)])
def test_finalize_checks_each_precondition_on_its_own(k: int) -> None:
    _, code, breaks = PRECONDITIONS[k - 1]
    refused(breaks(_valid_finalization()).run(), code)


def test_finalize_refuses_a_dispatch_row_of_another_execution() -> None:
    case = _valid_finalization()
    assert case.dispatch is not None
    case = attrs.evolve(case, dispatch=attrs.evolve(case.dispatch, workflow_execution_id="ex-2"))
    refused(case.run(), RefusalCode.IDENTITY_MISMATCH)


def test_finalize_refuses_a_stale_fence() -> None:
    case = _request_change(_valid_finalization(), fence=2)
    refused(case.run(), RefusalCode.STALE_FENCE)


@pytest.mark.parametrize(
    "target", [ExecutionState.ELIGIBLE, ExecutionState.RUNNING, ExecutionState.CANCELLED, "eligible", "cancelled"]
)
def test_finalize_refuses_every_target_outside_the_five(target: ExecutionState | str) -> None:
    refused(_request_change(_valid_finalization(), target_state=target).run(), RefusalCode.TARGET_NOT_PERMITTED)


def test_the_permitted_targets_are_exactly_the_seeds_five() -> None:
    assert {t.value for t in FINALIZE_TARGETS} == {
        "waiting",
        "succeeded",
        "failed",
        "suspended",
        "reconciliation_required",
    }


@pytest.mark.parametrize("target", FINALIZE_TARGETS, ids=lambda t: t.value)
def test_finalize_moves_both_rows_clears_the_lease_and_bumps_the_revision_once(target: ExecutionState) -> None:
    snap = leased()
    now = T0 + timedelta(seconds=10)
    decision = decided(finalize(snap.execution, snap.dispatch, finalize_request(snap, target), now))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == target
    assert decision.dispatch.dispatch_state == dispatch_state_of(target)
    assert decision.dispatch.dispatch_state.value == target.value  # none of the five is "running"
    assert lease_cleared(decision.dispatch)
    assert decision.execution.revision == snap.execution.revision + 1
    assert decision.execution.fence == snap.execution.fence
    assert decision.execution.step_count == snap.execution.step_count  # no step given, none counted
    (record,) = decision.evidence
    assert (record.from_state, record.to_state, record.revision) == (ExecutionState.RUNNING, target, 3)
    assert record.lease_token == TOKEN and record.actor == WORKER
    if target == ExecutionState.WAITING:
        key = WaitKey(EXEC_ID, EVENT_SPEC.node_id, EVENT_SPEC.attempt_id)
        assert decision.registration == WaitRegistration(key=key, business_id=BUSINESS, spec=EVENT_SPEC)
        assert decision.execution.wait == key
    else:
        assert decision.registration is None and decision.execution.wait is None


def test_finalize_accepts_the_target_as_its_spec_string() -> None:
    snap = leased()
    decision = decided(finalize(snap.execution, snap.dispatch, finalize_request(snap, "succeeded"), T0))
    assert decision.execution is not None and decision.execution.state == ExecutionState.SUCCEEDED


def test_finalize_records_the_error_code_and_the_final_step_in_the_same_decision() -> None:
    snap = leased()
    step = StepRecord("node-end", "attempt-3")
    request = finalize_request(snap, ExecutionState.FAILED, step=step, error_code="validation_denied")
    decision = decided(finalize(snap.execution, snap.dispatch, request, T0))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.step_count == decision.dispatch.step_count == 1
    assert decision.execution.current_node_id == "node-end"
    assert decision.dispatch.last_error_code == "validation_denied"
    assert decision.execution.revision == 3  # step and finalization are one revision, not two


def test_a_waiting_target_needs_its_wait_registration_and_only_it_may_carry_one() -> None:
    snap = leased()
    without = finalize_request(snap, ExecutionState.WAITING, wait=None)
    refusal = refused(finalize(snap.execution, snap.dispatch, without, T0), RefusalCode.WAIT_REGISTRATION_REQUIRED)
    assert refusal.field == "wait"
    with_wait = finalize_request(snap, ExecutionState.SUCCEEDED, wait=EVENT_SPEC)
    refused(finalize(snap.execution, snap.dispatch, with_wait, T0), RefusalCode.WAIT_REGISTRATION_REQUIRED)


def test_finalize_with_a_step_is_refused_at_the_step_limit_but_without_one_may_suspend() -> None:
    snap = leased()
    at_limit = steps_counted(snap, STEP_LIMIT)
    with_step = finalize_request(snap, ExecutionState.SUCCEEDED, step=StepRecord("node-9", "attempt-9"))
    refused(finalize(at_limit.execution, at_limit.dispatch, with_step, T0), RefusalCode.STEP_LIMIT_REACHED)
    suspend = finalize_request(snap, ExecutionState.SUSPENDED, reason="step_limit")
    decision = decided(finalize(at_limit.execution, at_limit.dispatch, suspend, T0))
    assert decision.execution is not None and decision.execution.state == ExecutionState.SUSPENDED
    assert decision.evidence[0].reason == "step_limit"
    # One step below the limit, the final step still counts.
    below = steps_counted(snap, STEP_LIMIT - 1)
    counted = decided(finalize(below.execution, below.dispatch, with_step, T0))
    assert counted.execution is not None and counted.execution.step_count == STEP_LIMIT


def test_the_finalize_guard_needs_a_live_lease_at_commit_time() -> None:
    snap = leased()
    decided_at = T0 + timedelta(seconds=29)
    decision = decided(finalize(snap.execution, snap.dispatch, finalize_request(snap), decided_at))
    guard = decision.guard
    assert guard.requires_live_lease
    assert (guard.expected_revision, guard.expected_state, guard.expected_dispatch_state) == (
        2,
        ExecutionState.RUNNING,
        DispatchState.CLAIMED,
    )
    assert (guard.expected_lease_token, guard.expected_lease_expires_at, guard.expected_fence) == (TOKEN, EXPIRES, 1)
    assert holds(guard, snap, decided_at)
    assert holds(guard, snap, EXPIRES - TICK)
    # Decided while valid, committed after expiry: the store must not apply it.
    assert not holds(guard, snap, EXPIRES)
    assert not holds(guard, snap, EXPIRES + timedelta(minutes=5))


def test_the_finalize_guard_fails_after_any_other_write() -> None:
    snap = leased()
    decision = decided(finalize(snap.execution, snap.dispatch, finalize_request(snap), T0))
    step = decided(
        record_step(snap.execution, snap.dispatch, StepRequest(snap.lease, 2, StepRecord("n", "a"), GRANTED), T0)
    )
    assert not holds(decision.guard, applied(snap, step))
    # A renewal leaves the revision alone but moves the expiry: still a different row.
    renewal = decided(renew(snap.execution, snap.dispatch, RenewRequest(snap.lease, LEASE), T0 + timedelta(seconds=1)))
    assert not holds(decision.guard, applied(snap, renewal))
    # And a reclaim under a new fence with the same token string is caught by the fence.
    same_rows_new_fence = attrs.evolve(snap.execution, fence=2)
    assert not decision.guard.holds(same_rows_new_fence, snap.dispatch, T0)


# --- wake -------------------------------------------------------------------------------


def test_an_exact_event_wakes_the_waiter_into_eligible() -> None:
    snap = waiting()
    now = T0 + timedelta(minutes=5)
    decision = decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap), now))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.ELIGIBLE and decision.execution.wait is None
    assert decision.execution.revision == snap.execution.revision + 1
    assert decision.dispatch.dispatch_state == DispatchState.ELIGIBLE and decision.dispatch.eligible_at == now
    assert lease_cleared(decision.dispatch)
    assert snap.registration is not None
    assert decision.registration == attrs.evolve(snap.registration, woken_by="event-1", wake_reason=WakeReason.EVENT)
    assert not decision.guard.requires_live_lease  # there is no lease to be live
    assert holds(decision.guard, snap, now)


def test_a_decision_wakes_by_the_same_exact_binding() -> None:
    snap = waiting()
    request = wake_request(snap, WakeReason.DECISION, "decision-1")
    decision = decided(wake(snap.execution, snap.dispatch, snap.registration, request, T0))
    assert decision.registration is not None and decision.registration.wake_reason == WakeReason.DECISION


@pytest.mark.parametrize(
    "changes",
    [
        {"event_type": "order.refunded"},
        {"event_type": None},
        {"correlation": (("order_id", "o-43"), ("tenant", "t-1"))},
        {"correlation": (("order_id", "o-42"),)},
        {"correlation": (("order_id", "o-42"), ("tenant", "t-1"), ("zone", "z"))},
        {"correlation": ()},
    ],
    ids=["other-type", "no-type", "other-value", "missing-pair", "extra-pair", "no-correlation"],
)
def test_an_inexact_event_does_not_wake(changes: dict[str, Any]) -> None:
    snap = waiting()
    outcome = wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, **changes), T0)
    refused(outcome, RefusalCode.WAKE_MISMATCH)


def test_an_event_of_another_business_does_not_wake() -> None:
    snap = waiting()
    outcome = wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, business_id="biz-2"), T0)
    refused(outcome, RefusalCode.BUSINESS_MISMATCH)


def test_a_wake_for_another_wait_key_does_not_wake() -> None:
    snap = waiting()
    assert snap.registration is not None
    other = attrs.evolve(snap.registration.key, attempt_id="attempt-2")
    refused(
        wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, key=other), T0),
        RefusalCode.NOT_WAITING,
    )


def test_an_unauthorized_wake_does_not_wake() -> None:
    snap = waiting()
    outcome = wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, authority=DENIED), T0)
    refused(outcome, RefusalCode.NOT_AUTHORIZED)


def test_a_timer_wakes_only_when_due() -> None:
    snap = waiting(TIMER_SPEC)
    assert TIMER_SPEC.wake_at is not None
    request = wake_request(snap, WakeReason.TIMER, "timer-1")
    outcome = wake(snap.execution, snap.dispatch, snap.registration, request, TIMER_SPEC.wake_at - TICK)
    refused(outcome, RefusalCode.WAKE_NOT_DUE)
    decision = decided(wake(snap.execution, snap.dispatch, snap.registration, request, TIMER_SPEC.wake_at))
    assert decision.registration is not None and decision.registration.wake_reason == WakeReason.TIMER


def test_a_timer_or_timeout_wake_needs_the_registration_to_declare_it() -> None:
    # An event waiter declares no wake time at all.
    events = waiting(EVENT_SPEC)
    for reason in (WakeReason.TIMER, WakeReason.TIMEOUT):
        outcome = wake(events.execution, events.dispatch, events.registration, wake_request(events, reason, "t"), T0)
        refused(outcome, RefusalCode.WAKE_MISMATCH)
    # A plain timer is not a timeout, and a timeout is not a plain timer.
    timer = waiting(TIMER_SPEC)
    late = T0 + timedelta(days=1)
    outcome = wake(
        timer.execution, timer.dispatch, timer.registration, wake_request(timer, WakeReason.TIMEOUT, "t"), late
    )
    refused(outcome, RefusalCode.WAKE_MISMATCH)
    timeout = waiting(TIMEOUT_SPEC)
    outcome = wake(
        timeout.execution, timeout.dispatch, timeout.registration, wake_request(timeout, WakeReason.TIMER, "t"), late
    )
    refused(outcome, RefusalCode.WAKE_MISMATCH)
    # A timer-only waiter cannot be woken by an event.
    outcome = wake(
        timer.execution, timer.dispatch, timer.registration, wake_request(timer, event_type="order.paid"), late
    )
    refused(outcome, RefusalCode.WAKE_MISMATCH)


def test_a_declared_timeout_wakes_when_due_and_is_recorded_as_a_timeout() -> None:
    snap = waiting(TIMEOUT_SPEC)
    assert TIMEOUT_SPEC.wake_at is not None
    request = wake_request(snap, WakeReason.TIMEOUT, "timeout-1")
    refused(
        wake(snap.execution, snap.dispatch, snap.registration, request, TIMEOUT_SPEC.wake_at - TICK),
        RefusalCode.WAKE_NOT_DUE,
    )
    decision = decided(wake(snap.execution, snap.dispatch, snap.registration, request, TIMEOUT_SPEC.wake_at))
    assert decision.registration is not None and decision.registration.wake_reason == WakeReason.TIMEOUT
    assert "timeout" in decision.evidence[0].reason


def test_a_duplicate_wake_is_unchanged_and_says_so() -> None:
    snap = waiting()
    first = decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap), T0))
    after = applied(snap, first)
    again = wake(after.execution, after.dispatch, after.registration, wake_request(snap), T0)
    assert isinstance(again, Unchanged) and again.code == UnchangedCode.ALREADY_WOKEN
    assert "already woke" in again.message


def test_a_later_wake_from_another_source_is_unchanged_and_the_first_wins() -> None:
    snap = waiting()
    first = decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, source="event-1"), T0))
    after = applied(snap, first)
    later = wake(after.execution, after.dispatch, after.registration, wake_request(snap, source="event-2"), T0)
    assert isinstance(later, Unchanged) and later.code == UnchangedCode.ALREADY_WOKEN
    assert "'event-1'" in later.message and "first committed wake wins" in later.message


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"business_id": "biz-2"}, RefusalCode.BUSINESS_MISMATCH),
        ({"authority": DENIED}, RefusalCode.NOT_AUTHORIZED),
    ],
    ids=["other-business", "unauthorized"],
)
def test_a_woken_registration_tells_an_unauthorized_or_foreign_caller_nothing(
    changes: dict[str, Any], code: RefusalCode
) -> None:
    # Seed 000, Security: Business isolation and current authority are
    # checked at the boundary; "Event connectivity ... never grant[s]
    # authority".  A caller of another Business, or one whose authority was
    # denied, must get the same refusal whether or not the waiter was already
    # woken -- not an Unchanged naming the source that woke it.
    # kernel/protocol.py wake() answers ALREADY_WOKEN before _check_business
    # and _check_authorized, so this reveals "already woken by 'event-1'".
    snap = waiting()
    after = applied(snap, decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap), T0)))
    request = wake_request(snap, source="event-9", **changes)
    outcome = wake(after.execution, after.dispatch, after.registration, request, T0)
    refusal = refused(outcome, code)
    assert "event-1" not in refusal.message


def test_two_wakes_decided_on_one_snapshot_cannot_both_commit() -> None:
    snap = waiting()
    first = decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, source="event-1"), T0))
    second = decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap, source="event-2"), T0))
    assert not holds(second.guard, applied(snap, first))


@pytest.mark.parametrize("state", [s for s in ExecutionState if s != ExecutionState.WAITING], ids=lambda s: s.value)
def test_a_wake_of_a_non_waiting_execution_is_refused(state: ExecutionState) -> None:
    # The registration of an earlier wait, never woken, is presented with
    # rows that have since moved on (or never waited).
    registration = waiting().registration
    assert registration is not None
    snap = in_state(state)
    request = WakeRequest(
        registration.key, WakeReason.EVENT, "event-1", BUSINESS, GRANTED, EVENT_SPEC.event_type, EVENT_SPEC.correlation
    )
    outcome = wake(snap.execution, snap.dispatch, registration, request, T0)
    # A Refusal carries no rows, so nothing can be written.
    refused(outcome, RefusalCode.NOT_WAITING)


def test_a_wake_after_cancellation_of_the_waiter_is_refused() -> None:
    snap = waiting()
    gone = applied(
        snap,
        decided(
            cancel(
                snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, snap.execution.revision, GRANTED), T0
            )
        ),
    )
    refused(wake(gone.execution, gone.dispatch, gone.registration, wake_request(snap), T0), RefusalCode.NOT_WAITING)


def test_a_wake_without_a_registration_is_refused() -> None:
    snap = waiting()
    refused(wake(snap.execution, snap.dispatch, None, wake_request(snap), T0), RefusalCode.NOT_WAITING)
    refused(wake(None, None, snap.registration, wake_request(snap), T0), RefusalCode.EXECUTION_NOT_FOUND)


# --- cancel -------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [ExecutionState.ELIGIBLE, ExecutionState.WAITING], ids=lambda s: s.value)
def test_cancel_ends_eligible_and_waiting_work(state: ExecutionState) -> None:
    snap = in_state(state)
    request = CancelRequest(EXEC_ID, BUSINESS, snap.execution.revision, GRANTED)
    decision = decided(cancel(snap.execution, snap.dispatch, request, T0))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.CANCELLED and decision.execution.wait is None
    assert decision.dispatch.dispatch_state == DispatchState.CANCELLED
    assert decision.execution.revision == snap.execution.revision + 1
    assert lease_cleared(decision.dispatch)
    assert decision.evidence[0].actor == GRANTED.principal_id
    # Leaving waiting by any route but a wake closes the registration it waited on.
    expected = None if snap.execution.wait is None else WaitClosure(snap.execution.wait, ExecutionEvent.CANCEL)
    assert decision.closes == expected
    assert (decision.closes is None) == (state == ExecutionState.ELIGIBLE)


def test_cancel_refuses_running_work() -> None:
    snap = leased()
    outcome = cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, 2, GRANTED), T0)
    refused(outcome, RefusalCode.CANCEL_RUNNING)


@pytest.mark.parametrize(
    "state",
    [
        ExecutionState.SUCCEEDED,
        ExecutionState.FAILED,
        ExecutionState.CANCELLED,
        ExecutionState.SUSPENDED,
        ExecutionState.RECONCILIATION_REQUIRED,
    ],
    ids=lambda s: s.value,
)
def test_cancel_refuses_terminal_and_review_states(state: ExecutionState) -> None:
    snap = in_state(state)
    outcome = cancel(
        snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, snap.execution.revision, GRANTED), T0
    )
    refused(outcome, RefusalCode.ILLEGAL_TRANSITION)


def test_cancel_refuses_stale_revisions_other_businesses_and_denied_authority() -> None:
    snap = admitted()
    refused(
        cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, 2, GRANTED), T0),
        RefusalCode.STALE_REVISION,
    )
    refused(
        cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, "biz-2", 1, GRANTED), T0),
        RefusalCode.BUSINESS_MISMATCH,
    )
    refused(
        cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, 1, DENIED), T0),
        RefusalCode.NOT_AUTHORIZED,
    )
    refused(cancel(None, None, CancelRequest(EXEC_ID, BUSINESS, 1, GRANTED), T0), RefusalCode.EXECUTION_NOT_FOUND)


def test_cancel_and_claim_of_one_snapshot_have_exactly_one_winner() -> None:
    snap = admitted()
    cancellation = decided(cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, 1, GRANTED), T0))
    claiming = decided(claim(snap.execution, snap.dispatch, ClaimRequest(WORKER, TOKEN, LEASE), T0))
    assert holds(cancellation.guard, snap) and holds(claiming.guard, snap)
    # Whichever the store applies first, the other's guard no longer holds.
    assert not holds(claiming.guard, applied(snap, cancellation))
    assert not holds(cancellation.guard, applied(snap, claiming))
    # And re-deciding on the new rows gives the loser a refusal.
    after_cancel = applied(snap, cancellation)
    refused(
        claim(after_cancel.execution, after_cancel.dispatch, ClaimRequest(WORKER, TOKEN, LEASE), T0),
        RefusalCode.NOT_ELIGIBLE,
    )
    after_claim = applied(snap, claiming)
    refused(
        cancel(after_claim.execution, after_claim.dispatch, CancelRequest(EXEC_ID, BUSINESS, 2, GRANTED), T0),
        RefusalCode.CANCEL_RUNNING,
    )


def test_cancel_and_wake_of_one_snapshot_have_exactly_one_winner() -> None:
    snap = waiting()
    revision = snap.execution.revision
    cancellation = decided(
        cancel(snap.execution, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, revision, GRANTED), T0)
    )
    waking = decided(wake(snap.execution, snap.dispatch, snap.registration, wake_request(snap), T0))
    assert holds(cancellation.guard, snap) and holds(waking.guard, snap)
    assert not holds(waking.guard, applied(snap, cancellation))
    assert not holds(cancellation.guard, applied(snap, waking))


# --- recover ------------------------------------------------------------------------------


def test_quarantine_of_an_expired_claim_clears_the_lease_into_reconciliation() -> None:
    snap = leased()
    request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED)
    # "at or before the authoritative current UTC time": the expiry instant qualifies.
    decision = decided(recover(snap.execution, snap.dispatch, None, request, EXPIRES))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert decision.dispatch.dispatch_state == DispatchState.RECONCILIATION_REQUIRED
    assert lease_cleared(decision.dispatch)
    assert decision.dispatch.last_error_code == "quarantine_expired"
    assert decision.execution.revision == 3 and decision.execution.fence == 1
    assert decision.recovery == RecoveryRecord(
        "cmd-1", RecoveryKind.QUARANTINE_EXPIRED, EXEC_ID, 2, 3, ExecutionState.RECONCILIATION_REQUIRED
    )
    assert holds(decision.guard, snap, EXPIRES)
    # The expired worker stays fenced if it reconnects.
    after = applied(snap, decision)
    late = finalize_request(snap)
    refused(finalize(after.execution, after.dispatch, late, EXPIRES), RefusalCode.DISPATCH_NOT_CLAIMED)


def test_quarantine_refuses_an_unexpired_lease() -> None:
    snap = leased()
    request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED)
    refused(recover(snap.execution, snap.dispatch, None, request, EXPIRES - TICK), RefusalCode.LEASE_NOT_EXPIRED)


def test_the_lease_holder_cannot_quarantine_its_own_lease() -> None:
    snap = leased()
    request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED, actor_id=WORKER)
    refused(recover(snap.execution, snap.dispatch, None, request, EXPIRES), RefusalCode.WORKER_CANNOT_RECOVER)


@pytest.mark.parametrize("state", [s for s in ExecutionState if s != ExecutionState.RUNNING], ids=lambda s: s.value)
def test_quarantine_needs_a_running_execution(state: ExecutionState) -> None:
    snap = in_state(state)
    request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED)
    refused(
        recover(snap.execution, snap.dispatch, None, request, T0 + timedelta(days=1)), RefusalCode.EXECUTION_NOT_RUNNING
    )


def test_quarantine_refuses_another_business_stale_revisions_and_denied_authority() -> None:
    snap = leased()
    for changes, code in (
        ({"business_id": "biz-2"}, RefusalCode.BUSINESS_MISMATCH),
        ({"expected_revision": 1}, RefusalCode.STALE_REVISION),
        ({"authority": DENIED}, RefusalCode.NOT_AUTHORIZED),
    ):
        request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED, **changes)
        refused(recover(snap.execution, snap.dispatch, None, request, EXPIRES), code)


def _in_review() -> Snap:
    snap = leased()
    return applied(
        snap,
        decided(
            recover(
                snap.execution, snap.dispatch, None, recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED), EXPIRES
            )
        ),
    )


def test_fail_ends_a_reviewed_execution() -> None:
    snap = _in_review()
    decision = decided(
        recover(
            snap.execution, snap.dispatch, None, recovery_request(snap, RecoveryKind.FAIL, command_id="cmd-2"), EXPIRES
        )
    )
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.FAILED
    assert decision.dispatch.dispatch_state == DispatchState.FAILED
    assert decision.dispatch.last_error_code == "fail"
    assert decision.execution.revision == snap.execution.revision + 1


def test_resume_safe_with_the_whole_proof_makes_the_execution_claimable_under_a_fresh_fence() -> None:
    snap = _in_review()
    now = EXPIRES + timedelta(minutes=1)
    request = recovery_request(snap, RecoveryKind.RESUME_SAFE, command_id="cmd-2")
    decision = decided(recover(snap.execution, snap.dispatch, None, request, now))
    assert decision.execution is not None and decision.dispatch is not None
    assert decision.execution.state == ExecutionState.ELIGIBLE
    # Recovered work keeps its place in the queue: the eligible_at its row holds, not now.
    assert decision.dispatch.dispatch_state == DispatchState.ELIGIBLE
    assert decision.dispatch.eligible_at == snap.dispatch.eligible_at < now
    assert decision.recovery is not None and decision.recovery.proof is not None
    assert decision.recovery.proof.idempotency_contract == CONTRACT
    assert lease_cleared(decision.dispatch)
    resumed = claimed(applied(snap, decision), now, worker="worker-2", token="token-2")
    assert resumed.lease.fence == 2


@pytest.mark.parametrize(
    ("changes", "facts", "missing"),
    [
        ({"next_node_id": None}, {}, "continuation_approved"),
        ({"next_node_id": "elsewhere"}, {}, "dependencies_current"),
        ({"rationale": ""}, {}, "idempotency_contract"),
        ({}, {"pinned": False}, "dependencies_current"),
        ({}, {"command": True}, "no_unresolved_command"),
    ],
    ids=["no-continuation", "unknown-node", "no-idempotency-contract", "definition-missing", "unresolved-command"],
)
def test_resume_safe_without_the_whole_proof_is_unsafe(
    changes: dict[str, Any], facts: dict[str, bool], missing: str
) -> None:
    snap = _in_review()
    request = recovery_request(snap, RecoveryKind.RESUME_SAFE, **changes)
    outcome = recover(snap.execution, snap.dispatch, None, request, EXPIRES, facts=facts_for(snap.execution, **facts))
    refusal = refused(outcome, RefusalCode.UNSAFE_RESUME)
    assert refusal.field == "next_node_id"
    assert missing in refusal.message


def test_reconcile_command_keeps_the_review_state_and_counts_the_settled_visit() -> None:
    snap = _in_review()
    request = recovery_request(snap, RecoveryKind.RECONCILE_COMMAND, command_id="cmd-2")
    decision = decided(recover(snap.execution, snap.dispatch, None, request, EXPIRES))
    steps = snap.execution.step_count + 1
    assert decision.execution == attrs.evolve(snap.execution, revision=snap.execution.revision + 1, step_count=steps)
    assert decision.dispatch == attrs.evolve(snap.dispatch, step_count=steps)
    (record,) = decision.evidence
    assert record.event is None and record.to_state == ExecutionState.RECONCILIATION_REQUIRED
    assert "cmd-unknown-7" in record.reason
    assert decision.recovery is not None and decision.recovery.resulting_state == ExecutionState.RECONCILIATION_REQUIRED


def test_reconcile_command_counts_no_step_for_an_attempt_its_handler_left_unknown() -> None:
    # Only a quarantined visit (its attempt still reconciliation_required) went uncounted; an attempt the
    # handler answered unknown was counted when its visit finalized to reconciliation_required, so its
    # settlement links the answer without a second step (specs/protocol.md, the reconcile_command row).
    snap = _in_review()
    unknown_attempt = attrs.evolve(QUARANTINED_ATTEMPT, state="unknown")
    facts = recovery.RecoveryFacts(
        (unknown_attempt, UNKNOWN_COMMAND), facts_for(snap.execution).definition,
        (SETTLEMENT[0], unknown_attempt.next("completed", {"status": "completed", "next_node_id": "n"})),
    )
    request = recovery_request(snap, RecoveryKind.RECONCILE_COMMAND, command_id="cmd-2")
    decision = decided(recover(snap.execution, snap.dispatch, None, request, EXPIRES, facts=facts))
    assert decision.execution == attrs.evolve(snap.execution, revision=snap.execution.revision + 1)
    assert decision.dispatch == snap.dispatch


def test_a_resume_never_queues_recovered_work_later_than_now() -> None:
    # eligible_at = min(eligible_at, now): a store clock that stepped back below the row's eligible_at
    # must not leave the resumed execution unclaimable until the clock catches up.
    snap = _in_review()
    earlier = snap.dispatch.eligible_at - timedelta(seconds=5)
    request = recovery_request(snap, RecoveryKind.RESUME_SAFE, command_id="cmd-2")
    decision = decided(recover(snap.execution, snap.dispatch, None, request, earlier))
    assert decision.dispatch is not None and decision.dispatch.eligible_at == earlier


def test_reconcile_command_records_a_settlement_at_the_step_bound_without_counting_past_it() -> None:
    # No visit starts past the bound (the dispatcher stops at 100 processed steps), so facts that show one
    # quarantined there are the store's, not a visit's: the settlement is recorded and INV-STEP-LIMIT holds.
    snap = _in_review()
    at_bound = attrs.evolve(snap.execution, step_count=STEP_LIMIT)
    dispatch = attrs.evolve(snap.dispatch, step_count=STEP_LIMIT)
    request = recovery_request(snap, RecoveryKind.RECONCILE_COMMAND, command_id="cmd-2")
    decision = decided(recover(at_bound, dispatch, None, request, EXPIRES))
    assert decision.execution == attrs.evolve(at_bound, revision=at_bound.revision + 1)
    assert decision.dispatch == dispatch
    assert decision.recovery is not None and decision.recovery.kind == RecoveryKind.RECONCILE_COMMAND


@pytest.mark.parametrize(
    ("changes", "facts"),
    [
        ({"command_to_reconcile": None}, None),
        ({}, recovery.RecoveryFacts((attrs.evolve(UNKNOWN_COMMAND, state="succeeded"),), None, SETTLEMENT)),
        ({}, recovery.RecoveryFacts((QUARANTINED_ATTEMPT, UNKNOWN_COMMAND), None, ())),
    ],
    ids=["no-command", "command-resolved", "no-settlement"],
)
def test_reconcile_command_needs_a_persisted_unresolved_command(
    changes: dict[str, Any], facts: recovery.RecoveryFacts | None
) -> None:
    snap = _in_review()
    request = recovery_request(snap, RecoveryKind.RECONCILE_COMMAND, **changes)
    outcome = recover(snap.execution, snap.dispatch, None, request, EXPIRES, facts=facts)
    refusal = refused(outcome, RefusalCode.NO_UNRESOLVED_COMMAND)
    assert refusal.field == "command_to_reconcile"


@pytest.mark.parametrize("kind", [RecoveryKind.FAIL, RecoveryKind.RESUME_SAFE, RecoveryKind.RECONCILE_COMMAND])
def test_review_decisions_refuse_stale_revisions(kind: RecoveryKind) -> None:
    snap = _in_review()
    request = recovery_request(snap, kind, expected_revision=snap.execution.revision - 1)
    refused(recover(snap.execution, snap.dispatch, None, request, EXPIRES), RefusalCode.STALE_REVISION)


@pytest.mark.parametrize("kind", list(RecoveryKind), ids=lambda k: k.value)
@pytest.mark.parametrize(
    "state", [ExecutionState.SUCCEEDED, ExecutionState.FAILED, ExecutionState.CANCELLED], ids=lambda s: s.value
)
def test_terminal_executions_cannot_be_recovered(state: ExecutionState, kind: RecoveryKind) -> None:
    snap = in_state(state)
    outcome = recover(snap.execution, snap.dispatch, None, recovery_request(snap, kind), T0 + timedelta(days=1))
    expected = {
        RecoveryKind.QUARANTINE_EXPIRED: RefusalCode.EXECUTION_NOT_RUNNING,
        RecoveryKind.RESUME_SUSPENDED: RefusalCode.NOT_SUSPENDED,
    }.get(kind, RefusalCode.NOT_IN_RECONCILIATION)
    refused(outcome, expected)


@pytest.mark.parametrize("kind", [RecoveryKind.RESUME_SAFE, RecoveryKind.RECONCILE_COMMAND])
def test_a_suspended_execution_is_not_in_reconciliation(kind: RecoveryKind) -> None:
    snap = in_state(ExecutionState.SUSPENDED)
    refused(
        recover(snap.execution, snap.dispatch, None, recovery_request(snap, kind), T0),
        RefusalCode.NOT_IN_RECONCILIATION,
    )


@pytest.mark.parametrize(
    ("kind", "state"),
    [(RecoveryKind.FAIL, ExecutionState.FAILED), (RecoveryKind.RESUME_SUSPENDED, ExecutionState.ELIGIBLE)],
)
def test_a_suspended_execution_leaves_by_a_governed_decision(kind: RecoveryKind, state: ExecutionState) -> None:
    snap = in_state(ExecutionState.SUSPENDED)
    decision = decided(recover(snap.execution, snap.dispatch, None, recovery_request(snap, kind), T0))
    assert decision.execution is not None and decision.execution.state == state
    assert decision.execution.revision == snap.execution.revision + 1


def test_resume_suspended_refuses_an_exhausted_step_bound() -> None:
    snap = in_state(ExecutionState.SUSPENDED)
    spent = attrs.evolve(snap.dispatch, last_error_code="step_limit")
    request = recovery_request(snap, RecoveryKind.RESUME_SUSPENDED)
    refusal = refused(recover(snap.execution, spent, None, request, T0), RefusalCode.UNSAFE_RESUME)
    assert "step_limit" in refusal.message


def test_an_identical_recovery_command_replays_its_durable_result() -> None:
    snap = leased()
    request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED)
    first = decided(recover(snap.execution, snap.dispatch, None, request, EXPIRES))
    after = applied(snap, first)
    assert first.recovery is not None
    replay = recover(after.execution, after.dispatch, first.recovery, request, EXPIRES + timedelta(hours=1))
    assert isinstance(replay, Unchanged) and replay.code == UnchangedCode.RECOVERY_REPLAYED
    assert replay.record == first.recovery


@pytest.mark.parametrize(
    "changes",
    [{"kind": RecoveryKind.FAIL}, {"expected_revision": 3}, {"execution_id": "ex-2"}],
    ids=["other-kind", "other-revision", "other-execution"],
)
def test_the_same_command_identity_with_another_decision_is_a_conflict(changes: dict[str, Any]) -> None:
    snap = leased()
    request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED)
    first = decided(recover(snap.execution, snap.dispatch, None, request, EXPIRES))
    after = applied(snap, first)
    outcome = recover(after.execution, after.dispatch, first.recovery, attrs.evolve(request, **changes), EXPIRES)
    refused(outcome, RefusalCode.RECOVERY_CONFLICT)


# --- malformed input, for every decision -----------------------------------------------------

_ADMITTED = admitted()
_LEASED = leased()
_WAITING = waiting()
_REVIEW = _in_review()

Call = Callable[[Any, datetime], Outcome]

# decision name -> (how to call it on valid rows, a request that succeeds there)
DECISIONS: dict[str, tuple[Call, Any]] = {
    "admit": (lambda r, now: admit(None, r, now), AdmitRequest(EXEC_ID, BUSINESS, "def-1", 1, "node-start", GRANTED)),
    "claim": (
        lambda r, now: claim(_ADMITTED.execution, _ADMITTED.dispatch, r, now),
        ClaimRequest(WORKER, TOKEN, LEASE),
    ),
    "renew": (lambda r, now: renew(_LEASED.execution, _LEASED.dispatch, r, now), RenewRequest(_LEASED.lease, LEASE)),
    "record_step": (
        lambda r, now: record_step(_LEASED.execution, _LEASED.dispatch, r, now),
        StepRequest(_LEASED.lease, 2, StepRecord("node-2", "attempt-2"), GRANTED),
    ),
    "release": (lambda r, now: release(_LEASED.execution, _LEASED.dispatch, r, now), ReleaseRequest(_LEASED.lease, 2)),
    "finalize": (
        lambda r, now: finalize(_LEASED.execution, _LEASED.dispatch, r, now),
        finalize_request(_LEASED, ExecutionState.WAITING, step=StepRecord("node-2", "attempt-2"), error_code="e-1"),
    ),
    "wake": (
        lambda r, now: wake(_WAITING.execution, _WAITING.dispatch, _WAITING.registration, r, now),
        wake_request(_WAITING),
    ),
    "cancel": (
        lambda r, now: cancel(_ADMITTED.execution, _ADMITTED.dispatch, r, now),
        CancelRequest(EXEC_ID, BUSINESS, 1, GRANTED),
    ),
    "recover": (
        lambda r, now: recover(_REVIEW.execution, _REVIEW.dispatch, None, r, now),
        recovery_request(_REVIEW, RecoveryKind.RECONCILE_COMMAND),
    ),
}

_CREDENTIAL_IDS = ("credential.worker_id", "credential.lease_token")
ID_FIELDS: dict[str, tuple[str, ...]] = {
    "admit": ("execution_id", "business_id", "definition_id", "start_node_id", "authority.principal_id"),
    "claim": ("worker_id", "lease_token"),
    "renew": _CREDENTIAL_IDS,
    "record_step": (*_CREDENTIAL_IDS, "step.node_id", "step.attempt_id", "authority.principal_id"),
    "release": _CREDENTIAL_IDS,
    "finalize": (
        "execution_id",
        "dispatch_id",
        "worker_id",
        "lease_token",
        "business_id",
        "authority.principal_id",
        "step.node_id",
        "step.attempt_id",
        "wait.node_id",
        "wait.attempt_id",
        "wait.event_type",
        "error_code",
    ),
    "wake": (
        "key.execution_id",
        "key.node_id",
        "key.attempt_id",
        "source_id",
        "business_id",
        "authority.principal_id",
        "event_type",
    ),
    "cancel": ("execution_id", "business_id", "authority.principal_id"),
    "recover": (
        "command_id",
        "execution_id",
        "business_id",
        "actor_id",
        "authority.principal_id",
        "command_to_reconcile",
    ),
}
# Identifier fields where None means "not given" and is valid.
OPTIONAL_IDS = frozenset({"wait.event_type", "event_type", "command_to_reconcile", "error_code"})
REVISION_FIELDS = {
    "admit": "definition_revision",
    "record_step": "expected_revision",
    "release": "expected_revision",
    "finalize": "expected_revision",
    "cancel": "expected_revision",
    "recover": "expected_revision",
}
FENCE_FIELDS = {
    "renew": "credential.fence",
    "record_step": "credential.fence",
    "release": "credential.fence",
    "finalize": "fence",
}
BAD_IDENTIFIERS: tuple[object, ...] = (
    "",
    " ",
    "a b",
    " leading-space",
    "trailing-space ",
    "-starts-with-dash",
    "tab\there",
    "line\nbreak",
    "x" * 129,
    "café",
    42,
    None,
    b"bytes",
)
BAD_NOWS: tuple[object, ...] = (
    datetime(2026, 1, 1),  # naive
    datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))),  # the same instant, not in UTC
    datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-5))),
    date(2026, 1, 1),
    "2026-01-01T00:00:00Z",
    1767225600,
    None,
)
BAD_COUNTS: tuple[object, ...] = (0, -1, True, False, 1.0, "1", None)
BAD_DURATIONS: tuple[object, ...] = (timedelta(0), -TICK, timedelta(seconds=-30), 30, 30.0, None)


def _set(obj: Any, path: str, value: object) -> Any:
    """``obj`` with the (dotted) attribute ``path`` replaced, rebuilding the frozen parents."""
    head, _, rest = path.partition(".")
    return attrs.evolve(obj, **{head: _set(getattr(obj, head), rest, value) if rest else value})


def _outcome(decision: str, path: str | None, value: object, now: object = T0) -> Outcome:
    call, request = DECISIONS[decision]
    if path is not None:
        request = _set(request, path, value)
    return call(request, now)  # type: ignore[arg-type]  # bad `now` values are the point


def _bad_input_cases() -> Iterator[Any]:
    for decision, fields in ID_FIELDS.items():
        for path in fields:
            for number, value in enumerate(BAD_IDENTIFIERS):
                if value is None and path in OPTIONAL_IDS:
                    continue  # None is a valid value there
                yield pytest.param(decision, path, value, path, id=f"{decision}-{path}-id{number}")
    for decision, path in REVISION_FIELDS.items():
        for value in BAD_COUNTS:
            yield pytest.param(decision, path, value, path, id=f"{decision}-{path}-{value!r}")
    for decision, path in FENCE_FIELDS.items():
        for value in BAD_COUNTS:
            yield pytest.param(decision, path, value, path, id=f"{decision}-{path}-{value!r}")
    for decision in ("claim", "renew"):
        for value in BAD_DURATIONS:
            yield pytest.param(decision, "lease_duration", value, "lease_duration", id=f"{decision}-duration-{value!r}")
    for value in ("finished", "", "RUNNING", 3, None):
        yield pytest.param("finalize", "target_state", value, "target_state", id=f"target-{value!r}")
    correlations: tuple[tuple[object, str], ...] = (
        ((("tenant", "t-1"), ("order_id", "o-42")), ""),  # unsorted
        ((("order_id", "o-1"), ("order_id", "o-2")), ""),  # duplicate name
        ((("order_id", 42),), ""),  # a value that is not a string
        ((("order_id", "o-1", "extra"),), ""),  # not a pair
        ([("order_id", "o-42")], ""),  # a list, not a tuple
        ((("bad name", "v"),), "['bad name']"),  # a name that is no identifier
    )
    for number, (value, suffix) in enumerate(correlations):
        yield pytest.param("wake", "correlation", value, "correlation" + suffix, id=f"wake-correlation{number}")
        yield pytest.param(
            "finalize", "wait.correlation", value, "wait.correlation" + suffix, id=f"finalize-correlation{number}"
        )
    structural: tuple[tuple[str, str, object, str], ...] = (
        ("finalize", "wait", WaitSpec("node-wait", "attempt-1", None), "wait"),  # waits for nothing
        ("finalize", "wait", WaitSpec("node-wait", "attempt-1", "order.paid", timeout=True), "wait.timeout"),
        ("finalize", "wait", "order.paid", "wait"),
        ("finalize", "wait.wake_at", datetime(2026, 1, 2), "wait.wake_at"),
        ("finalize", "wait.wake_at", datetime(2026, 1, 2, tzinfo=timezone(timedelta(hours=1))), "wait.wake_at"),
        ("finalize", "step", ("node-2", "attempt-2"), "step"),
        ("record_step", "step", "node-2", "step"),
        ("admit", "authority", True, "authority"),
        ("cancel", "authority", None, "authority"),
        ("renew", "credential", (WORKER, TOKEN, 1), "credential"),
        ("release", "credential", None, "credential"),
        ("wake", "key", (EXEC_ID, "node-wait", "attempt-1"), "key"),
        ("recover", "kind", "reconcile_command", "kind"),
        ("recover", "kind", None, "kind"),
    )
    for decision, path, value, field in structural:
        yield pytest.param(decision, path, value, field, id=f"{decision}-{path}-{type(value).__name__}")
    for decision in DECISIONS:
        for number, value in enumerate(BAD_NOWS):
            yield pytest.param(decision, None, value, "now", id=f"{decision}-now{number}")


@pytest.mark.parametrize("decision", list(DECISIONS))
def test_the_valid_baselines_are_decisions(decision: str) -> None:
    # Each bad-input case below changes exactly one thing of a call that
    # succeeds, so its refusal is caused by that one thing.
    decided(_outcome(decision, None, None))


@pytest.mark.parametrize(("decision", "path", "value", "field"), list(_bad_input_cases()))
def test_malformed_input_is_refused_naming_the_field(
    decision: str, path: str | None, value: object, field: str
) -> None:
    outcome = _outcome(decision, path, value) if path is not None else _outcome(decision, None, None, now=value)
    refusal = refused(outcome, RefusalCode.INVALID_REQUEST)
    assert refusal.field == field
    assert refusal.message.startswith(f"{field}: "), refusal.message


@pytest.mark.parametrize("decision", list(DECISIONS))
def test_a_request_of_another_type_is_refused_naming_the_request(decision: str) -> None:
    # Before any field is read: not an AttributeError on the first field.
    call, request = DECISIONS[decision]
    if decision == "recover":  # the kernel's own, not this module's wrapper that reads the request
        call = lambda r, now: recovery.recover(_REVIEW.execution, _REVIEW.dispatch, None, r, now)  # noqa: E731
    other = next(r for name, (_, r) in DECISIONS.items() if name != decision and type(r) is not type(request))
    for value in (None, "request", other):
        refusal = refused(call(value, T0), RefusalCode.INVALID_REQUEST)
        assert refusal.field == "request"
        assert refusal.message == f"request: must be of type {type(request).__name__}, got {type(value).__name__}"


RowsCall = Callable[[Any, Any], Outcome]
ROW_CALLS: dict[str, tuple[RowsCall, Snap]] = {
    "claim": (lambda e, d: claim(e, d, DECISIONS["claim"][1], T0), _ADMITTED),
    "renew": (lambda e, d: renew(e, d, DECISIONS["renew"][1], T0), _LEASED),
    "record_step": (lambda e, d: record_step(e, d, DECISIONS["record_step"][1], T0), _LEASED),
    "release": (lambda e, d: release(e, d, DECISIONS["release"][1], T0), _LEASED),
    "finalize": (lambda e, d: finalize(e, d, DECISIONS["finalize"][1], T0), _LEASED),
    "fenced": (lambda e, d: fenced(e, d, _LEASED.lease, T0), _LEASED),  # type: ignore[arg-type]
    "wake": (lambda e, d: wake(e, d, _WAITING.registration, wake_request(_WAITING), T0), _WAITING),
    "cancel": (lambda e, d: cancel(e, d, DECISIONS["cancel"][1], T0), _ADMITTED),
    "recover": (lambda e, d: recover(e, d, None, DECISIONS["recover"][1], T0, facts=facts_for(_REVIEW.execution, command=True)), _REVIEW),
}
NAIVE = datetime(2026, 1, 1)
# (row, field, value, the error, the field its message starts with)
BAD_ROWS: tuple[tuple[str, str, object, type[Exception], str], ...] = (
    ("execution", "state", "running", TypeError, "execution.state"),
    ("execution", "state", DispatchState.CLAIMED, TypeError, "execution.state"),
    ("execution", "revision", 0, ValueError, "execution.revision"),
    ("execution", "revision", "2", TypeError, "execution.revision"),
    ("execution", "fence", -1, ValueError, "execution.fence"),
    ("execution", "fence", True, TypeError, "execution.fence"),
    ("execution", "step_count", None, TypeError, "execution.step_count"),
    ("execution", "definition_revision", 0, ValueError, "execution.definition_revision"),
    ("execution", "wait", ("x", "n", "a"), TypeError, "execution.wait"),
    ("dispatch", "dispatch_state", "claimed", TypeError, "dispatch.dispatch_state"),
    ("dispatch", "eligible_at", NAIVE, ValueError, "dispatch.eligible_at"),
    ("dispatch", "eligible_at", None, TypeError, "dispatch.eligible_at"),
    ("dispatch", "lease_expires_at", NAIVE, ValueError, "dispatch.lease_expires_at"),
    ("dispatch", "lease_expires_at", T0.astimezone(timezone(timedelta(hours=1))), ValueError, "dispatch.lease_expires_at"),
    ("dispatch", "step_count", -1, ValueError, "dispatch.step_count"),
    ("dispatch", "lease_token", 7, TypeError, "dispatch.lease_token"),
)


@pytest.mark.parametrize("decision", list(ROW_CALLS))
def test_a_malformed_snapshot_is_a_type_or_value_error_naming_the_field(decision: str) -> None:
    # The rows are the store's, not the caller's: a row no decision could
    # have written is raised as what it is, never reasoned about (before,
    # an AttributeError, a TypeError comparing times, or a Decision with a
    # guard expecting revision 0).
    call, snap = ROW_CALLS[decision]
    decided(call(snap.execution, snap.dispatch))  # the baseline each case changes one field of
    for row, field, value, error, name in BAD_ROWS:
        execution = attrs.evolve(snap.execution, **{field: value}) if row == "execution" else snap.execution
        dispatch = attrs.evolve(snap.dispatch, **{field: value}) if row == "dispatch" else snap.dispatch
        with pytest.raises(error, match=rf"^{re.escape(name)}: ") as raised:
            call(execution, dispatch)
        # One class for every row no decision wrote, which a store catches to report the row (malformed_row).
        assert isinstance(raised.value, MalformedSnapshot)
    with pytest.raises(TypeError, match=r"^execution: must be of type Execution, got Dispatch") as raised:
        call(snap.dispatch, snap.execution)
    assert isinstance(raised.value, MalformedSnapshot)
    # Two rows that read well but disagree are the same class (a ValueError).
    apart = attrs.evolve(snap.dispatch, step_count=snap.execution.step_count + 1)
    with pytest.raises(MalformedSnapshot, match=r"^dispatch\.step_count: ") as raised:
        call(snap.execution, apart)
    assert isinstance(raised.value, ValueError)


def test_what_a_store_read_besides_the_rows_is_checked_as_the_rows_are() -> None:
    snap = _WAITING
    with pytest.raises(TypeError, match=r"^registration: "):
        wake(snap.execution, snap.dispatch, "registration", wake_request(snap), T0)  # type: ignore[arg-type]
    assert snap.registration is not None
    naive_spec = attrs.evolve(snap.registration.spec, wake_at=NAIVE)
    with pytest.raises(ValueError, match=r"^registration\.spec\.wake_at: naive"):
        wake(snap.execution, snap.dispatch, attrs.evolve(snap.registration, spec=naive_spec), wake_request(snap), T0)
    review, request = _REVIEW, DECISIONS["recover"][1]
    with pytest.raises(TypeError, match=r"^prior: "):
        recovery.recover(review.execution, review.dispatch, "prior", request, T0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^facts: "):
        recovery.recover(review.execution, review.dispatch, None, request, T0, facts="facts")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^facts\.evidence: "):
        recovery.recover(review.execution, review.dispatch, None, request, T0, facts=recovery.RecoveryFacts(evidence="e"))  # type: ignore[arg-type]
    admit_request = DECISIONS["admit"][1]
    with pytest.raises(TypeError, match=r"^execution: "):
        admit("existing", admit_request, T0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^id_taken: "):
        admit(None, admit_request, T0, id_taken="no")  # type: ignore[arg-type]


def test_naive_and_offset_times_are_refused_for_what_they_are() -> None:
    # Both are refused above; the message must say which mistake it was.
    naive = refused(_outcome("claim", None, None, now=datetime(2026, 1, 1)), RefusalCode.INVALID_REQUEST)
    assert "naive" in naive.message
    offset = datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    shifted = refused(_outcome("claim", None, None, now=offset), RefusalCode.INVALID_REQUEST)
    assert "not UTC" in shifted.message and "naive" not in shifted.message


def test_malformed_input_is_refused_before_any_precondition() -> None:
    # The execution does not exist and the identifier is malformed: the
    # request is refused for its form, not for the missing execution.
    outcome = finalize(None, None, finalize_request(_LEASED, worker_id="not valid"), T0)
    assert refused(outcome, RefusalCode.INVALID_REQUEST).field == "worker_id"


def test_the_longest_identifier_is_accepted() -> None:
    # 128 characters is the documented limit: the 129-character case above
    # is refused for its length, not for something else.
    decided(_outcome("claim", "worker_id", "w" * 128))


# --- purity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("decision", list(DECISIONS))
def test_a_decision_is_a_function_of_its_inputs(decision: str) -> None:
    call, request = DECISIONS[decision]
    snapshots = (_ADMITTED, _LEASED, _WAITING, _REVIEW)
    before = copy.deepcopy((snapshots, request))
    first = call(request, T0)
    second = call(copy.deepcopy(request), T0)
    assert first == second
    assert (snapshots, request) == before


def test_inputs_and_outcomes_are_frozen() -> None:
    snap = leased()
    decision = decided(finalize(snap.execution, snap.dispatch, finalize_request(snap), T0))
    for obj, name in (
        (snap.execution, "state"),
        (snap.dispatch, "lease_token"),
        (decision, "guard"),
        (decision.guard, "expected_revision"),
        (finalize_request(snap), "fence"),
    ):
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            setattr(obj, name, None)


# --- Hypothesis: lease-bound decisions are made only with the current lease -----------------


@st.composite
def _histories(draw: st.DrawFn) -> tuple[Snap, list[LeaseCredential]]:
    """Rows after 1-3 claims (released in between), then maybe moved on; every credential ever issued."""
    snap = admitted()
    issued: list[LeaseCredential] = []
    for n in range(1, draw(st.integers(1, 3)) + 1):
        if snap.credential is not None:
            rel = release(snap.execution, snap.dispatch, ReleaseRequest(snap.lease, snap.execution.revision), T0)
            snap = applied(snap, decided(rel))
        worker = draw(st.sampled_from([WORKER, "worker-2"]))
        token = draw(st.sampled_from([f"token-{n}", TOKEN]))  # tokens may repeat: only the fence tells
        snap = claimed(snap, T0, worker, token)
        issued.append(snap.lease)
    # Mostly still running (where lease-bound decisions can succeed), sometimes moved on.
    ending = draw(st.sampled_from(["running"] * 4 + ["stepped", "waiting", "succeeded", "quarantined"]))
    if ending in ("waiting", "succeeded"):
        target = ExecutionState(ending)
        snap = applied(snap, decided(finalize(snap.execution, snap.dispatch, finalize_request(snap, target), T0)))
    elif ending == "quarantined":
        request = recovery_request(snap, RecoveryKind.QUARANTINE_EXPIRED)
        snap = applied(snap, decided(recover(snap.execution, snap.dispatch, None, request, EXPIRES)))
    elif ending == "stepped":
        step = StepRequest(snap.lease, snap.execution.revision, StepRecord("node-s", "attempt-s"), GRANTED)
        snap = applied(snap, decided(record_step(snap.execution, snap.dispatch, step, T0)))
    return snap, issued


def _credentials(issued: list[LeaseCredential]) -> st.SearchStrategy[LeaseCredential]:
    """The current credential half of the time; otherwise an old one, a one-part change, or a random one."""
    current = issued[-1]
    # (one_of merges identical branches, so the current credential is weighted through sampled_from.)
    return st.one_of(
        st.sampled_from([current] * 6 + issued),
        st.builds(lambda w: attrs.evolve(current, worker_id=w), st.sampled_from(["worker-2", "worker-3"])),
        st.builds(lambda t: attrs.evolve(current, lease_token=t), st.sampled_from(["token-2", "token-x"])),
        st.builds(lambda f: attrs.evolve(current, fence=f), st.integers(1, 4)),
        st.builds(
            LeaseCredential,
            worker_id=st.sampled_from([WORKER, "worker-2", "worker-3"]),
            lease_token=st.sampled_from([TOKEN, "token-2", "token-3", "token-x"]),
            fence=st.integers(1, 4),
        ),
    )


# Times around the expiry: the exact instant and its neighbours, and anything
# from well before the claim to a little after the expiry.
_offsets = st.one_of(
    st.sampled_from([-LEASE, -TICK, timedelta(0), TICK]),
    st.integers(-31_000_000, 3_000_000).map(lambda us: timedelta(microseconds=us)),
)
_targets = st.one_of(
    st.sampled_from(FINALIZE_TARGETS),
    st.sampled_from(list(ExecutionState)),
    st.sampled_from(["succeeded", "waiting", "finished"]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=_histories(),
    data=st.data(),
    offset=_offsets,
    revision_delta=st.sampled_from([0, 0, 0, -1, 1]),
    target=_targets,
    granted=st.sampled_from([True, True, True, False]),
    with_step=st.booleans(),
    flip_wait=st.sampled_from([False, False, False, True]),
)
def test_lease_bound_decisions_need_the_current_lease(
    *,
    history: tuple[Snap, list[LeaseCredential]],
    data: st.DataObject,
    offset: timedelta,
    revision_delta: int,
    target: ExecutionState | str,
    granted: bool,
    with_step: bool,
    flip_wait: bool,
) -> None:
    snap, issued = history
    credential = data.draw(_credentials(issued), label="credential")
    expiry = snap.dispatch.lease_expires_at or EXPIRES
    now = expiry + offset
    revision = max(1, snap.execution.revision + revision_delta)
    authority = GRANTED if granted else DENIED
    # A wait registration goes with a waiting target, except when deliberately flipped.
    with_wait = (target in (ExecutionState.WAITING, "waiting")) != flip_wait
    outcomes: dict[str, Outcome] = {
        "renew": renew(snap.execution, snap.dispatch, RenewRequest(credential, LEASE), now),
        "record_step": record_step(
            snap.execution, snap.dispatch, StepRequest(credential, revision, StepRecord("n", "a"), authority), now
        ),
        "release": release(snap.execution, snap.dispatch, ReleaseRequest(credential, revision), now),
        "finalize": finalize(
            snap.execution,
            snap.dispatch,
            FinalizeRequest(
                execution_id=EXEC_ID,
                dispatch_id=EXEC_ID,
                worker_id=credential.worker_id,
                lease_token=credential.lease_token,
                fence=credential.fence,
                target_state=target,
                business_id=BUSINESS,
                expected_revision=revision,
                authority=authority,
                step=StepRecord("node-h", "attempt-h") if with_step else None,
                wait=EVENT_SPEC if with_wait else None,
            ),
            now,
        ),
    }
    for name, outcome in outcomes.items():
        kinds = [isinstance(outcome, kind) for kind in (Refusal, Unchanged, Decision)]
        assert kinds.count(True) == 1, (name, outcome)
        assert not isinstance(outcome, Unchanged), (name, outcome)  # no lease-bound decision is idempotent
        # Shown by --hypothesis-show-statistics: every branch, Decision included, is reached.
        event(f"{name}: {outcome.code.value if isinstance(outcome, Refusal) else 'decision'}")
        if isinstance(outcome, Decision):
            # Made with the current token, worker and fence, before expiry,
            # on a running, claimed execution.
            assert snap.execution.state == ExecutionState.RUNNING, name
            assert snap.dispatch.dispatch_state == DispatchState.CLAIMED, name
            assert snap.dispatch.lease_token == credential.lease_token, name
            assert snap.dispatch.leased_by == credential.worker_id, name
            assert snap.execution.fence == credential.fence, name
            assert snap.dispatch.lease_expires_at is not None and now < snap.dispatch.lease_expires_at, name
            # And the store would apply it only while that stays true.
            assert outcome.guard.requires_live_lease, name
            assert outcome.guard.holds(snap.execution, snap.dispatch, now), name
            assert not outcome.guard.holds(snap.execution, snap.dispatch, snap.dispatch.lease_expires_at), name
        if credential.fence < snap.execution.fence:
            # A credential of an earlier claim never decides anything (seed 001).
            assert isinstance(outcome, Refusal), (name, outcome)


def _ids(valid: str) -> st.SearchStrategy[str]:
    """Mostly the value that matches the rows, sometimes another or a malformed one."""
    others = [EXEC_ID, "ex-2", BUSINESS, "biz-2", WORKER, "node-wait", "attempt-1", "", "a b", "x" * 129]
    # sampled_from picks uniformly by position, so repeating the valid value weights it.
    return st.sampled_from([valid] * 40 + others)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=_histories(),
    decision=st.sampled_from(["admit", "claim", "wake", "cancel", "recover"]),
    data=st.data(),
    offset=_offsets,
    revision_delta=st.sampled_from([0, 0, 0, -1, 1, -100]),
    # Mostly a real bool; sometimes a value of another type, which must never pass as granted.
    granted=st.sampled_from([True, True, True, False, "no", 1, None]),
)
def test_no_decision_raises_on_random_requests(
    *,
    history: tuple[Snap, list[LeaseCredential]],
    decision: str,
    data: st.DataObject,
    offset: timedelta,
    revision_delta: int,
    granted: object,
) -> None:
    snap, _ = history
    now = EXPIRES + offset
    revision = snap.execution.revision + revision_delta  # may be 0 or negative: malformed
    authority = Authority(granted, data.draw(_ids("principal-1"), label="principal"))  # type: ignore[arg-type]
    registration = snap.registration
    rows: tuple[Execution | None, Dispatch | None] = (snap.execution, snap.dispatch)
    if decision == "admit":
        existing = data.draw(st.sampled_from([None, snap.execution]), label="existing")
        rows = (None, None)
        request: Any = AdmitRequest(
            data.draw(_ids(EXEC_ID)), data.draw(_ids(BUSINESS)), "def-1", revision, "n", authority
        )
        outcome = admit(existing, request, now)
    elif decision == "claim":
        # The admitted rows (claimable) or the history's rows.
        if data.draw(st.booleans(), label="fresh"):
            rows = (_ADMITTED.execution, _ADMITTED.dispatch)
        duration = data.draw(
            st.one_of(st.integers(-5, 60).map(lambda n: timedelta(seconds=n)), st.just(timedelta.max)), label="duration"
        )
        request = ClaimRequest(data.draw(_ids(WORKER)), data.draw(_ids(TOKEN)), duration)
        outcome = claim(*rows, request, now)
    elif decision == "wake":
        if data.draw(st.booleans(), label="waiting"):
            rows, registration = (_WAITING.execution, _WAITING.dispatch), _WAITING.registration
        key = WaitKey(data.draw(_ids(EXEC_ID)), data.draw(_ids("node-wait")), data.draw(_ids("attempt-1")))
        reason = data.draw(
            st.sampled_from([WakeReason.EVENT, WakeReason.DECISION, *WakeReason, "event"]), label="reason"
        )
        correlation = data.draw(st.sampled_from([EVENT_SPEC.correlation] * 3 + [(), (("b", "1"), ("a", "2"))]))
        event_type = data.draw(st.sampled_from([EVENT_SPEC.event_type] * 3 + [None, "order.other"]))
        request = WakeRequest(
            key, reason, data.draw(_ids("event-1")), data.draw(_ids(BUSINESS)), authority, event_type, correlation
        )
        outcome = wake(*rows, registration, request, now)
    elif decision == "cancel":
        pick = data.draw(st.sampled_from([snap, _ADMITTED, _WAITING]), label="rows")
        rows = (pick.execution, pick.dispatch)
        revision = pick.execution.revision + revision_delta
        request = CancelRequest(data.draw(_ids(EXEC_ID)), data.draw(_ids(BUSINESS)), revision, authority)
        outcome = cancel(*rows, request, now)
    else:
        if data.draw(st.booleans(), label="in review"):
            rows = (_REVIEW.execution, _REVIEW.dispatch)
            revision = _REVIEW.execution.revision + revision_delta
        kind = data.draw(st.sampled_from(list(RecoveryKind)), label="kind")
        request = RecoveryRequest(
            data.draw(_ids("cmd-1")),
            kind,
            data.draw(_ids(EXEC_ID)),
            data.draw(_ids(BUSINESS)),
            revision,
            data.draw(_ids(OPERATOR)),
            authority,
            data.draw(st.sampled_from(["cmd-unknown-7", "cmd-7", None])),
            data.draw(st.sampled_from(["node-start", "elsewhere", None, 7])),
            data.draw(st.sampled_from([CONTRACT, "", None])),
        )
        prior = data.draw(
            st.sampled_from([None, None, None, RecoveryRecord("cmd-1", kind, EXEC_ID, 3, 4, ExecutionState.FAILED)])
        )
        outcome = recover(*rows, prior, request, now)
    kinds = [isinstance(outcome, kind) for kind in (Refusal, Unchanged, Decision)]
    assert kinds.count(True) == 1, outcome
    event(f"{decision}: {outcome.code.value if isinstance(outcome, Refusal | Unchanged) else 'decision'}")
    if isinstance(outcome, Decision):
        # Whatever was decided can be applied to the very rows it was decided on.
        assert outcome.guard.holds(*rows, now), (request, outcome)
        # And no fact of the wrong type was taken as true on the way.
        assert decision == "claim" or granted is True, (request, outcome)


# --- regressions: defects found while writing this module ----------------------------------------
#
# The module promises (its docstring): "returns one of three values, never
# raising for anything a caller can send" and "malformed input is refused
# first, naming the field".  Each test names the defect it reproduces as the
# kernel stood when the test was written.


@pytest.mark.parametrize("duration", [timedelta.max, timedelta(days=999_999_999)], ids=["max", "huge"])
@pytest.mark.parametrize("decision", ["claim", "renew"])
def test_a_huge_lease_duration_is_refused_not_raised(decision: str, duration: timedelta) -> None:
    # Was: claim() and renew() computed ``now + request.lease_duration``
    # unguarded, which overflows the datetime range and raised OverflowError;
    # _check_duration only checked "positive".
    refusal = refused(_outcome(decision, "lease_duration", duration), RefusalCode.INVALID_REQUEST)
    assert refusal.field == "lease_duration" and refusal.message.startswith("lease_duration: ")


@pytest.mark.parametrize("registration_woken", [False, True], ids=["fresh", "already-woken"])
def test_a_wake_reason_that_is_not_a_wake_reason_is_refused(registration_woken: bool) -> None:
    # Was: wake() never validated ``request.reason``; the string "timer"
    # reached ``request.reason.value`` (in the not-declared refusal and in the
    # already-woken message) and raised AttributeError.
    registration = _WAITING.registration
    assert registration is not None
    if registration_woken:
        registration = attrs.evolve(registration, woken_by="event-1", wake_reason=WakeReason.EVENT)
    request = attrs.evolve(wake_request(_WAITING), reason="timer")
    outcome = wake(_WAITING.execution, _WAITING.dispatch, registration, request, T0)
    assert refused(outcome, RefusalCode.INVALID_REQUEST).field == "reason"


@pytest.mark.parametrize(
    ("decision", "path", "value", "field"),
    [
        # Was: facts were tested by truth, so a non-empty string such as
        # "no" passed as granted: fail-open.
        ("admit", "authority.granted", "no", "authority.granted"),
        ("admit", "authority.granted", 1, "authority.granted"),
        ("cancel", "authority.granted", "false", "authority.granted"),
        # A resume's reason and continuation are checked before any proof is derived.
        ("recover-resume", "rationale", 7, "rationale"),
        ("recover-resume", "next_node_id", 7, "next_node_id"),
    ],
    ids=[
        "admit-granted-'no'",
        "admit-granted-1",
        "cancel-granted-'false'",
        "resume-rationale-not-str",
        "resume-continuation-not-str",
    ],
)
def test_a_fact_of_the_wrong_type_is_refused_not_taken_as_true(
    decision: str, path: str, value: object, field: str
) -> None:
    if decision == "recover-resume":
        request = recovery_request(_REVIEW, RecoveryKind.RESUME_SAFE, **{path: value})
        outcome = recover(_REVIEW.execution, _REVIEW.dispatch, None, request, EXPIRES)
    else:
        outcome = _outcome(decision, path, value)
    refusal = refused(outcome, RefusalCode.INVALID_REQUEST)
    assert refusal.field == field and refusal.message.startswith(f"{field}: "), refusal


@pytest.mark.parametrize("kind", [RecoveryKind.FAIL, RecoveryKind.RESUME_SAFE, RecoveryKind.RECONCILE_COMMAND])
def test_review_decisions_check_the_dispatch_state(kind: RecoveryKind) -> None:
    # Seed 000, Governed reconciliation decisions: "Conflicting decisions are
    # rejected when the execution revision, dispatch state, pinned identity,
    # Business, current authority or decision preconditions do not match."
    # Was: recover() checked only the execution's state, so with a dispatch
    # row that is not reconciliation_required, fail and resume_safe raised
    # IllegalTransition (from DISPATCH.step) and reconcile_command decided.
    snap = attrs.evolve(_REVIEW, dispatch=attrs.evolve(_REVIEW.dispatch, dispatch_state=DispatchState.CLAIMED))
    outcome = recover(snap.execution, snap.dispatch, None, recovery_request(snap, kind), EXPIRES)
    refused(outcome, RefusalCode.NOT_IN_RECONCILIATION)


def test_cancel_and_wake_check_the_dispatch_state() -> None:
    # Was: cancel() and wake() checked only the execution's state; a dispatch
    # row that disagrees with it made _move raise IllegalTransition.
    row = attrs.evolve(_ADMITTED.dispatch, dispatch_state=DispatchState.CLAIMED)
    request = CancelRequest(EXEC_ID, BUSINESS, 1, GRANTED)
    refused(cancel(_ADMITTED.execution, row, request, T0), RefusalCode.ILLEGAL_TRANSITION)
    row = attrs.evolve(_WAITING.dispatch, dispatch_state=DispatchState.CLAIMED)
    refused(wake(_WAITING.execution, row, _WAITING.registration, wake_request(_WAITING), T0), RefusalCode.NOT_WAITING)


# Another attempt's registration (kernel/protocol.py wake(); seed 000, wait_for_event: "the wait
# registration is uniquely bound to the execution/node/attempt, and the first committed wake wins").
# The execution waits on attempt-2 of node-wait; its own timer is due a day on, an earlier visit's was
# due an hour on.  Each is a registration a store could hand over for the wake of attempt-2.
_EARLIER_TIMER = WaitRegistration(WaitKey(EXEC_ID, "node-wait", "attempt-1"), BUSINESS, TIMER_SPEC)
STALE_REGISTRATIONS = {
    "earlier-attempt-open": _EARLIER_TIMER,
    "earlier-attempt-woken": attrs.evolve(_EARLIER_TIMER, woken_by="attempt-1/timer", wake_reason=WakeReason.TIMER),
    "earlier-attempt-closed": attrs.evolve(_EARLIER_TIMER, closed_by="cancel"),
    "other-node": attrs.evolve(_EARLIER_TIMER, key=WaitKey(EXEC_ID, "node-other", "attempt-2")),
    "other-execution": attrs.evolve(_EARLIER_TIMER, key=WaitKey("ex-2", "node-wait", "attempt-2")),
}


@pytest.mark.parametrize("name", list(STALE_REGISTRATIONS))
def test_another_attempts_registration_never_wakes_or_answers_for_the_current_wait(name: str) -> None:
    # Was: wake() compared the request's key with the execution's wait, but
    # never the registration it was handed with either.  An earlier attempt's
    # open timer, due before the current one, woke the execution and was the
    # registration marked woken, leaving the current one open with nothing
    # waiting on it; an earlier attempt's woken one answered already_woken,
    # so the wake of the current wait was dropped as a duplicate.
    current = attrs.evolve(TIMER_SPEC, attempt_id="attempt-2", wake_at=T0 + timedelta(days=1))
    snap = waiting(current)
    assert snap.registration is not None and snap.execution.wait == snap.registration.key
    request = wake_request(snap, WakeReason.TIMER, "attempt-2/timer")
    late = T0 + timedelta(days=2)
    stale = STALE_REGISTRATIONS[name]
    refusal = refused(wake(snap.execution, snap.dispatch, stale, request, late), RefusalCode.NOT_WAITING)
    assert "another attempt's registration never wakes this wait" in refusal.message
    assert repr(stale.key.attempt_id) in refusal.message and repr(stale.key.node_id) in refusal.message
    # Before its own time the current wait is not due, whatever the earlier timer said.
    early = T0 + timedelta(hours=2)
    refused(wake(snap.execution, snap.dispatch, snap.registration, request, early), RefusalCode.WAKE_NOT_DUE)
    refused(wake(snap.execution, snap.dispatch, stale, request, early), RefusalCode.NOT_WAITING)
    # The execution's own registration still wakes it, and is the one marked woken.
    decision = decided(wake(snap.execution, snap.dispatch, snap.registration, request, late))
    assert decision.registration is not None and decision.registration.key == snap.execution.wait


def test_a_wake_naming_an_earlier_attempt_is_refused_or_unchanged_and_writes_nothing() -> None:
    # The other side: the wake itself names the earlier attempt, whose registration the store reads by
    # that key.  Woken, it is a duplicate of a wake already committed (Unchanged); open or closed, the
    # execution does not wait on it (not_waiting).  Neither writes.
    current = attrs.evolve(TIMER_SPEC, attempt_id="attempt-2", wake_at=T0 + timedelta(days=1))
    snap = waiting(current)
    late = T0 + timedelta(days=2)
    for name in ("earlier-attempt-open", "earlier-attempt-closed"):
        stale = STALE_REGISTRATIONS[name]
        request = wake_request(snap, WakeReason.TIMER, "attempt-1/timer", key=stale.key)
        refused(wake(snap.execution, snap.dispatch, stale, request, late), RefusalCode.NOT_WAITING)
    stale = STALE_REGISTRATIONS["earlier-attempt-woken"]
    request = wake_request(snap, WakeReason.TIMER, "attempt-1/timer", key=stale.key)
    outcome = wake(snap.execution, snap.dispatch, stale, request, late)
    assert isinstance(outcome, Unchanged) and outcome.code == UnchangedCode.ALREADY_WOKEN


# --- contradictory snapshots (specs/protocol.md, Decisions; kernel/protocol.py _explain_contradiction) ---


@pytest.mark.parametrize("decision", list(ROW_CALLS))
def test_step_counts_that_disagree_are_a_value_error_naming_both(decision: str) -> None:
    # Was: every move wrote the execution's count to both rows, so a dispatch
    # row at the bound and an execution behind it took another step and set
    # the dispatch row's counter back (seed 000, Dispatcher Pass: a later pass
    # "must not ... reset the step counter").
    call, snap = ROW_CALLS[decision]
    ahead = attrs.evolve(snap.dispatch, step_count=snap.execution.step_count + 1)
    with pytest.raises(ValueError, match=r"^dispatch\.step_count: .*execution\.step_count"):
        call(snap.execution, ahead)


def test_a_dispatch_row_at_the_step_bound_is_not_set_back_by_a_step() -> None:
    snap = _LEASED
    at_bound = attrs.evolve(snap.dispatch, step_count=STEP_LIMIT)
    request = StepRequest(snap.lease, snap.execution.revision, StepRecord("node-start", "a-1"), GRANTED)
    with pytest.raises(ValueError, match=r"^dispatch\.step_count: 100 steps, but execution\.step_count is 0"):
        record_step(snap.execution, at_bound, request, T0)


@pytest.mark.parametrize("decision", list(ROW_CALLS))
def test_a_wait_of_another_execution_is_a_value_error_naming_it(decision: str) -> None:
    # Was: a waiting execution whose wait named another execution's
    # registration was cancelled with closes naming that registration: the
    # store closed another execution's wait, which nothing could wake again.
    call, snap = ROW_CALLS[decision]
    foreign = attrs.evolve(snap.execution, wait=WaitKey("ex-2", "node-wait", "attempt-1"))
    with pytest.raises(ValueError, match=r"^execution\.wait: .*'ex-2'.*'ex-1'"):
        call(foreign, snap.dispatch)


@pytest.mark.parametrize("decision", list(ROW_CALLS))
def test_a_waiting_execution_without_its_wait_is_a_value_error_naming_it(decision: str) -> None:
    # Was: a cancel of it closed nothing (closes was None), so the registration it waited on stayed open
    # for an execution that no longer waited; a wake of it was refused as not waiting.
    call, snap = ROW_CALLS[decision]
    lost = attrs.evolve(snap.execution, state=ExecutionState.WAITING, wait=None)
    with pytest.raises(MalformedSnapshot, match=r"^execution\.wait: missing, but execution\.state is waiting") as raised:
        call(lost, snap.dispatch)
    assert isinstance(raised.value, ValueError)


def test_a_wait_left_on_an_execution_that_is_not_waiting_is_never_read() -> None:
    # Not raised: no decision reads a wait outside waiting (a wake and a cancel's closes look at the state
    # first), and every move writes the wait afresh.  Pinned so that none starts reading it.
    key = _WAITING.execution.wait
    stale = attrs.evolve(_ADMITTED.execution, wait=key)
    claimed = decided(claim(stale, _ADMITTED.dispatch, DECISIONS["claim"][1], T0))
    assert claimed.execution is not None and claimed.execution.wait is None and claimed.closes is None
    request = CancelRequest(EXEC_ID, BUSINESS, stale.revision, GRANTED)
    cancelled = decided(cancel(stale, _ADMITTED.dispatch, request, T0))
    assert cancelled.execution is not None and cancelled.execution.wait is None and cancelled.closes is None
    refused(
        wake(stale, _ADMITTED.dispatch, _WAITING.registration, wake_request(_WAITING), T0), RefusalCode.NOT_WAITING
    )


def test_cancel_of_a_waiter_whose_wait_is_another_executions_closes_nothing() -> None:
    snap = _WAITING
    foreign = attrs.evolve(snap.execution, wait=WaitKey("ex-2", "node-wait", "attempt-1"))
    with pytest.raises(ValueError, match=r"^execution\.wait: "):
        cancel(foreign, snap.dispatch, CancelRequest(EXEC_ID, BUSINESS, foreign.revision, GRANTED), T0)


@pytest.mark.parametrize("kind", [RecoveryKind.RESUME_SAFE, RecoveryKind.RECONCILE_COMMAND])
def test_evidence_of_another_execution_among_the_facts_is_a_value_error_naming_it(kind: RecoveryKind) -> None:
    # Was: a resume settled every inert attempt among the facts as not
    # applied, and reconcile_command linked any Command it found there, of
    # whichever execution: their writes landed on another execution's objects.
    snap = _REVIEW
    facts = facts_for(snap.execution, command=kind == RecoveryKind.RECONCILE_COMMAND)
    foreign: Evidence
    if kind == RecoveryKind.RESUME_SAFE:
        foreign = Evidence(
            "ex-2/a3", "StepAttempt", {"execution_id": "ex-2", "node_id": "n", "node_kind": "local_command"}, 1,
            "pending",
        )
    else:
        foreign = Evidence("cmd-unknown-7", "Command", {"execution_id": "ex-2", "attempt_id": "a-7"}, 2, "unknown")
    mixed = attrs.evolve(facts, evidence=(*[e for e in facts.evidence if e.object_id != foreign.object_id], foreign))
    request = recovery_request(snap, kind)
    with pytest.raises(ValueError, match=r"^facts\.evidence\[\d+\]: .*belongs to execution 'ex-2'"):
        recovery.recover(snap.execution, snap.dispatch, None, request, EXPIRES, facts=mixed)
    # The same evidence of this execution is decided on as before.
    own = attrs.evolve(foreign, body={**foreign.body, "execution_id": EXEC_ID})
    mine = attrs.evolve(facts, evidence=(*[e for e in facts.evidence if e.object_id != own.object_id], own))
    decided(recovery.recover(snap.execution, snap.dispatch, None, request, EXPIRES, facts=mine))


@pytest.mark.parametrize("decision", list(ROW_CALLS))
def test_states_that_disagree_are_refused_and_write_nothing(decision: str) -> None:
    # Not raised: the seed lists these as preconditions with their own
    # refusals (finalization 3-5: identities match, dispatch claimed,
    # execution running; Dispatch Lifecycle: "A dispatch row must agree with
    # the authoritative WorkflowExecution state"), and a Refusal writes
    # nothing.  Pinned so that no decision starts deciding on them.
    call, snap = ROW_CALLS[decision]
    for state in ExecutionState:
        if state != snap.execution.state:
            # Only the state disagrees: a waiting execution names its wait (its absence is raised, below).
            wait = snap.execution.wait
            if state == ExecutionState.WAITING and wait is None:
                wait = _WAITING.execution.wait
            outcome = call(attrs.evolve(snap.execution, state=state, wait=wait), snap.dispatch)
            assert isinstance(outcome, Refusal), (state, outcome)
    for dispatch_state in DispatchState:
        if dispatch_state != snap.dispatch.dispatch_state:
            outcome = call(snap.execution, _in_state(snap.dispatch, dispatch_state))
            assert isinstance(outcome, Refusal), (dispatch_state, outcome)
    foreign = attrs.evolve(snap.dispatch, workflow_execution_id="ex-2")
    refused(call(snap.execution, foreign), RefusalCode.IDENTITY_MISMATCH)


def _in_state(dispatch: Dispatch, state: DispatchState) -> Dispatch:
    """``dispatch`` moved to ``state`` as a decision moves it: a row that is not claimed holds no lease."""
    if state is DispatchState.CLAIMED:
        return attrs.evolve(dispatch, dispatch_state=state)
    return attrs.evolve(dispatch, dispatch_state=state, lease_token=None, leased_by=None, lease_expires_at=None)


@pytest.mark.parametrize("decision", list(ROW_CALLS))
def test_a_lease_on_a_row_that_is_not_claimed_is_raised_not_decided_on(decision: str) -> None:
    # Every move out of claimed clears the lease, and the stores' schema holds the three fields to the state;
    # a row that holds a lease it is not claimed under was written by no decision.  Where a claimed row
    # without its lease is refused (the lease checks), this one named a holder no claim made, and a
    # reconciliation's linking revision carried it on to a write the schema refused.
    call, snap = ROW_CALLS[decision]
    held = _LEASED.dispatch
    for state in DispatchState:
        if state is DispatchState.CLAIMED:
            continue
        base = snap.dispatch if snap.dispatch.dispatch_state is state else _in_state(snap.dispatch, state)
        for field in ("lease_token", "leased_by", "lease_expires_at"):
            stray = attrs.evolve(base, **{field: getattr(held, field)})
            with pytest.raises(MalformedSnapshot, match=rf"^dispatch\.{field}: set, but dispatch\.dispatch_state is {state.value}; ") as raised:
                call(snap.execution, stray)
            assert isinstance(raised.value, ValueError)
            assert snapshot_problem(snap.execution, stray) == str(raised.value)
    # The row as a decision leaves it is decided on (or refused), never raised.
    assert snapshot_problem(snap.execution, snap.dispatch) is None


def test_snapshot_problem_names_what_a_decision_would_raise_on_and_nothing_else() -> None:
    # For a reader that shows rows (fencekeeper inspect): the same check, its message, without a decision.
    snap = _ADMITTED
    assert snapshot_problem(snap.execution, snap.dispatch) is None
    apart = attrs.evolve(snap.dispatch, step_count=snap.execution.step_count + 3)
    with pytest.raises(MalformedSnapshot) as raised:
        claim(snap.execution, apart, DECISIONS["claim"][1], T0)
    assert snapshot_problem(snap.execution, apart) == str(raised.value)
    assert str(raised.value).startswith("dispatch.step_count: ")
    lost = attrs.evolve(_WAITING.execution, wait=None)
    assert (snapshot_problem(lost, _WAITING.dispatch) or "").startswith("execution.wait: missing")
