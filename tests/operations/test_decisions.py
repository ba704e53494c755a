"""Every operation decision: what it writes, what it refuses with which code, and that refusals name the field."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.machines import OperationEvent, OperationState

from .kernel_fixtures import GRANTED, IDENTITY, LEASE, POLICY, SECOND, T0, admitted, claimed, digest, submit_request


def test_submit_admits_a_new_operation_under_a_guard_on_the_free_identity() -> None:
    outcome = o.submit(None, submit_request(), T0)
    assert isinstance(outcome, o.Decision)
    op = outcome.operation
    assert (op.state, op.revision, op.fence, op.attempt_count) == (OperationState.ADMITTED, 1, 0, 0)
    assert op.deadline == T0 + POLICY.schedule_to_close
    assert outcome.guard == o.Guard("op-1", 0, 0, identity=IDENTITY, expected_holder=None)
    assert outcome.transition.to_state is OperationState.ADMITTED


def test_identical_submission_is_the_same_operation_and_other_input_conflicts() -> None:
    existing = admitted()
    same = o.submit(existing, submit_request(operation_id="op-2"), T0 + SECOND)
    assert isinstance(same, o.Unchanged) and same.code is o.UnchangedCode.SAME_SUBMISSION
    assert same.operation.operation_id == "op-1"
    for field, value in (("input_digest", digest("other")), ("action_version", 2), ("action_name", "refund")):
        outcome = o.submit(existing, submit_request(operation_id="op-2", **{field: value}), T0 + SECOND)
        assert isinstance(outcome, o.Refusal)
        assert (outcome.code, outcome.field) == (o.RefusalCode.IDEMPOTENCY_CONFLICT, field)


def test_an_operation_admitted_under_the_earlier_digest_of_the_input_is_the_same_submission() -> None:
    # Admitted before numbers were canonical: {"n":1.0} was digested as written.  Its retry now carries the
    # canonical digest and, beside it, the earlier one; the stored Operation answers to that.
    existing = admitted(input_digest=digest('{"n":1.0}'))
    retry = submit_request(operation_id="op-2", input_digest=digest('{"n":1}'), earlier_input_digest=digest('{"n":1.0}'))
    same = o.submit(existing, retry, T0 + SECOND)
    assert isinstance(same, o.Unchanged) and same.operation == existing
    # The earlier digest stands only for the input: another action or version under it still conflicts, and
    # a new Operation is admitted under the canonical digest, never the earlier one.
    other = o.submit(existing, attrs.evolve(retry, action_version=2), T0 + SECOND)
    assert isinstance(other, o.Refusal) and other.field == "action_version"
    new = o.submit(None, retry, T0)
    assert isinstance(new, o.Decision) and new.operation.input_digest == digest('{"n":1}')
    unrelated = o.submit(existing, attrs.evolve(retry, earlier_input_digest=digest('{"n":2.0}')), T0 + SECOND)
    assert isinstance(unrelated, o.Refusal) and unrelated.field == "input_digest"


def test_after_the_window_the_identity_names_a_new_operation_once_the_old_one_ended() -> None:
    existing = admitted()
    later = existing.retain_until
    active = o.submit(existing, submit_request(operation_id="op-2", input_digest=digest("x")), later)
    assert isinstance(active, o.Refusal) and active.code is o.RefusalCode.IDEMPOTENCY_CONFLICT
    existing = attrs.evolve(existing, state=OperationState.FAILED, outcome=o.TerminalOutcome.DEADLINE_EXCEEDED)
    outcome = o.submit(existing, submit_request(operation_id="op-2", input_digest=digest("x")), later)
    assert isinstance(outcome, o.Decision)
    assert outcome.guard.expected_holder == "op-1"
    assert outcome.operation.operation_id == "op-2"


@pytest.mark.parametrize(
    ("reference", "stable"),
    [
        ("users:v1:alice", "users:v*:alice"),
        ("users:v2:alice", "users:v*:alice"),
        ("users:v010:alice", "users:v*:alice"),
        ("users:v1:team:alice", "users:v*:team:alice"),  # the subject is everything after the version
        ("staff:v1:alice", "staff:v*:alice"),
        ("users:alice", "users:alice"),  # not of the versioned shape: its own stable form
        ("users:vx:alice", "users:vx:alice"),
        ("users:v:alice", "users:v:alice"),
        ("users:v1:", "users:v1:"),
    ],
)
def test_the_stable_principal_leaves_out_only_the_resolvers_version(reference: str, stable: str) -> None:
    assert o.stable_principal(reference) == stable
    assert o.identity_key(attrs.evolve(IDENTITY, principal=reference)) == o.IdentityKey(
        IDENTITY.namespace, IDENTITY.tenant, stable, IDENTITY.client_key
    )


def test_one_principal_under_two_resolver_versions_is_one_identity_and_keeps_its_provenance() -> None:
    existing = admitted()
    again = submit_request(operation_id="op-2", identity=attrs.evolve(IDENTITY, principal="users:v2:alice"),
                           authority=o.Authority(True, "users:v2:alice"))
    assert o.identity_key(again.identity) == o.identity_key(IDENTITY)
    same = o.submit(existing, again, T0 + SECOND)
    assert isinstance(same, o.Unchanged) and same.code is o.UnchangedCode.SAME_SUBMISSION
    assert same.operation == existing and same.operation.identity.principal == "users:v1:alice"
    conflict = o.submit(existing, attrs.evolve(again, input_digest=digest("other")), T0 + SECOND)
    assert isinstance(conflict, o.Refusal) and conflict.code is o.RefusalCode.IDEMPOTENCY_CONFLICT
    # Another subject or another resolver is another identity.
    for principal in ("users:v1:bob", "staff:v1:alice", "users:alice"):
        assert o.identity_key(attrs.evolve(IDENTITY, principal=principal)) != o.identity_key(IDENTITY)
    # A stable form is no reference (``*`` is in no identifier), so none can be submitted as one.
    posing = o.submit(None, attrs.evolve(again, identity=attrs.evolve(IDENTITY, principal="users:v*:alice")), T0)
    assert isinstance(posing, o.Refusal) and posing.field == "identity.principal"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("operation_id", "bad id"),
        ("action_name", ""),
        ("action_version", 0),
        ("input_digest", "abc"),
        ("earlier_input_digest", "ABC"),
        ("effect_class", "atomic"),
        ("retention", timedelta(0)),
        ("policy", o.RetryPolicy(maximum_attempts=0)),
        ("identity", o.Identity("shop", "t", "p", "has space")),
    ],
)
def test_malformed_submission_is_refused_naming_the_field(field: str, value: object) -> None:
    outcome = o.submit(None, submit_request(**{field: value}), T0)
    assert isinstance(outcome, o.Refusal)
    assert outcome.code is o.RefusalCode.INVALID_REQUEST
    assert outcome.field is not None and outcome.field.startswith(field)


def test_submission_without_authority_is_refused() -> None:
    outcome = o.submit(None, submit_request(authority=o.Authority(False, "users:v1:alice", "disabled")), T0)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_AUTHORIZED


def test_a_resubmission_without_current_authority_gets_the_refusal_a_new_submission_gets() -> None:
    # Stored provenance is never permission: the identity names the principal's Operation, but only an
    # authorized caller may have it back (seed 001, Durable truth and recovery; Current authorization).
    revoked = o.Authority(False, "users:v1:alice", "revoked: revoked")
    fresh = o.submit(None, submit_request(authority=revoked), T0 + SECOND)
    assert isinstance(fresh, o.Refusal) and fresh.code is o.RefusalCode.NOT_AUTHORIZED
    existing = admitted()
    ended = attrs.evolve(existing, state=OperationState.SUCCEEDED, outcome=o.TerminalOutcome.SUCCEEDED)
    for stored in (existing, ended):
        for changes in ({}, {"input_digest": digest("other")}):  # identical, and a conflict (which names the op)
            outcome = o.submit(stored, submit_request(operation_id="op-2", authority=revoked, **changes), T0 + SECOND)
            assert outcome == fresh


def test_naive_time_is_refused() -> None:
    outcome = o.submit(None, submit_request(), T0.replace(tzinfo=None))
    assert isinstance(outcome, o.Refusal) and outcome.field == "now"


def test_claim_creates_attempt_one_and_fence_one() -> None:
    op, credential, decision = claimed(admitted(), "w1", T0)
    assert (op.state, op.fence, op.attempt_count, op.owner) == (OperationState.RUNNING, 1, 1, "w1")
    assert credential == o.Credential("op-1", "w1", 1)
    assert [a.state for a in decision.attempts] == [o.AttemptState.RUNNING]
    assert decision.guard.expected_fence == 0


def test_live_owner_cannot_be_replaced() -> None:
    op, _, _ = claimed(admitted(), "w1", T0)
    outcome = o.claim(op, o.ClaimRequest("w2", LEASE), T0 + LEASE - SECOND)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_ELIGIBLE


def test_expired_owner_is_replaced_after_its_attempt_is_recorded_abandoned() -> None:
    op, old, _ = claimed(admitted(), "w1", T0)
    later = T0 + LEASE
    new_op, new, decision = claimed(op, "w2", later)
    assert decision.transition.event is OperationEvent.RECLAIM_EXPIRED
    assert [(a.number, a.state) for a in decision.attempts] == [
        (1, o.AttemptState.ABANDONED),
        (2, o.AttemptState.RUNNING),
    ]
    assert (new_op.fence, new_op.owner, new.fence) == (2, "w2", 2)
    # Fence 1 can do nothing any more, even with a fresh clock reading.
    for decide, request in (
        (o.heartbeat, o.HeartbeatRequest(old, LEASE)),
        (o.complete, o.CompleteRequest(old, GRANTED)),
        (o.fail, o.FailRequest(old, "boom", retryable=True)),
    ):
        outcome = decide(new_op, request, later)  # type: ignore[operator]
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.STALE_FENCE


def test_replacement_with_every_attempt_used_fails_with_the_named_limit() -> None:
    op = admitted(policy=attrs.evolve(POLICY, maximum_attempts=1))
    op, _, _ = claimed(op, "w1", T0)
    outcome = o.claim(op, o.ClaimRequest("w2", LEASE), T0 + LEASE)
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.outcome is o.TerminalOutcome.MAX_ATTEMPTS_EXCEEDED
    assert [a.state for a in outcome.attempts] == [o.AttemptState.ABANDONED]
    assert outcome.outbox and outcome.outbox[0].topic == "operation.failed"


def test_claim_past_the_deadline_ends_it_as_deadline_exceeded() -> None:
    op = admitted()
    outcome = o.claim(op, o.ClaimRequest("w1", LEASE), op.deadline)
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.state is OperationState.FAILED
    assert outcome.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED
    assert outcome.credential is None


def test_heartbeat_extends_and_needs_a_live_lease() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    outcome = o.heartbeat(op, o.HeartbeatRequest(cred, LEASE), T0 + 5 * SECOND)
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.lease_expires_at == T0 + 15 * SECOND
    assert outcome.guard.live_until == T0 + LEASE
    late = o.heartbeat(op, o.HeartbeatRequest(cred, LEASE), T0 + LEASE)
    assert isinstance(late, o.Refusal) and late.code is o.RefusalCode.LEASE_EXPIRED


def test_complete_writes_success_result_and_outbox_under_a_live_guard() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    outcome = o.complete(op, o.CompleteRequest(cred, GRANTED, '{"ok": true}'), T0 + SECOND)
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.outcome is o.TerminalOutcome.SUCCEEDED
    assert outcome.operation.result == '{"ok": true}'
    assert [a.state for a in outcome.attempts] == [o.AttemptState.SUCCEEDED]
    assert outcome.guard == o.Guard("op-1", op.revision, 1, live_until=op.lease_expires_at)
    assert [m.topic for m in outcome.outbox] == ["operation.succeeded"]


def test_complete_refuses_without_current_authority() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    outcome = o.complete(op, o.CompleteRequest(cred, o.Authority(False, "users:v1:alice", "revoked")), T0)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_AUTHORIZED


def test_complete_refusal_answers_what_complete_refuses_and_none_where_it_decides() -> None:
    # The store asks complete_refusal before it runs an atomic action: it must agree with complete on every request.
    op, cred, _ = claimed(admitted(), "w1", T0)
    cases: list[tuple[o.Operation | None, o.CompleteRequest, object]] = [
        (op, o.CompleteRequest(cred, GRANTED), T0 + SECOND),
        (op, o.CompleteRequest(cred, o.Authority(False, "users:v1:alice", "revoked")), T0),
        (op, o.CompleteRequest(attrs.evolve(cred, fence=2), GRANTED), T0),
        (op, o.CompleteRequest(attrs.evolve(cred, worker_id="w2"), GRANTED), T0),
        (op, o.CompleteRequest(cred, GRANTED), T0 + LEASE),
        (op, o.CompleteRequest(cred, GRANTED, 7), T0),  # type: ignore[arg-type]
        (op, o.CompleteRequest(cred, GRANTED), T0.replace(tzinfo=None)),
        (None, o.CompleteRequest(cred, GRANTED), T0),
        (admitted(), o.CompleteRequest(cred, GRANTED), T0),
        (claimed(admitted(effect_class=o.EffectClass.EXTERNAL), "w1", T0)[0], o.CompleteRequest(cred, GRANTED), T0),
    ]
    codes = []
    for operation, request, now in cases:
        outcome = o.complete(operation, request, now)  # type: ignore[arg-type]
        refusal = o.complete_refusal(operation, request, now)  # type: ignore[arg-type]
        assert refusal == (outcome if isinstance(outcome, o.Refusal) else None)
        codes.append(None if refusal is None else refusal.code)
    assert codes == [
        None,
        o.RefusalCode.NOT_AUTHORIZED,
        o.RefusalCode.STALE_FENCE,
        o.RefusalCode.WORKER_MISMATCH,
        o.RefusalCode.LEASE_EXPIRED,
        o.RefusalCode.INVALID_REQUEST,
        o.RefusalCode.INVALID_REQUEST,
        o.RefusalCode.OPERATION_NOT_FOUND,
        o.RefusalCode.STALE_FENCE,  # never claimed: fence 0
        o.RefusalCode.INTENT_REQUIRED,
    ]


def test_retryable_failure_backs_off_then_runs_out_of_attempts() -> None:
    op = admitted()
    now = T0
    for number in range(1, 4):
        op, cred, _ = claimed(op, f"w{number}", now)
        outcome = o.fail(op, o.FailRequest(cred, "busy", retryable=True), now)
        assert isinstance(outcome, o.Decision)
        op = outcome.operation
        if number < 3:
            assert op.state is OperationState.ADMITTED
            assert op.next_eligible_at == now + POLICY.backoff(number)
            refused = o.claim(op, o.ClaimRequest("wx", LEASE), now)
            assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.NOT_ELIGIBLE
            now = op.next_eligible_at
    assert op.outcome is o.TerminalOutcome.MAX_ATTEMPTS_EXCEEDED


def test_authorization_denial_fails_closed_without_retry() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    outcome = o.fail(op, o.FailRequest(cred, "revoked", retryable=True, not_authorized=True), T0)
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.outcome is o.TerminalOutcome.NOT_AUTHORIZED


def test_backoff_grows_and_is_capped() -> None:
    policy = o.RetryPolicy(initial_interval=SECOND, backoff_coefficient=3, maximum_interval=10 * SECOND)
    assert [policy.backoff(n) for n in (1, 2, 3, 4)] == [SECOND, 3 * SECOND, 9 * SECOND, 10 * SECOND]


@pytest.mark.parametrize("coefficient", [100, 10.0])
def test_a_long_run_of_failures_backs_off_by_the_cap_instead_of_raising(coefficient: float) -> None:
    # Each pause is capped at the maximum long before the coefficient's power leaves the floats.
    policy = attrs.evolve(
        POLICY, backoff_coefficient=coefficient, maximum_attempts=1000, schedule_to_close=timedelta(days=30)
    )
    assert policy.backoff(400) == policy.maximum_interval
    op, cred, _ = claimed(attrs.evolve(admitted(policy=policy), attempt_count=399), "w1", T0)
    outcome = o.fail(op, o.FailRequest(cred, "busy", retryable=True), T0)
    assert isinstance(outcome, o.Decision) and outcome.operation.state is OperationState.ADMITTED
    assert outcome.operation.next_eligible_at == T0 + policy.maximum_interval


def _approval_op() -> o.Operation:
    op = admitted(requires_approval=True)
    assert op.state is OperationState.AWAITING_APPROVAL
    return op


def _decide(op: o.Operation, **changes: object) -> o.Outcome:
    fields: dict[str, object] = {
        "approval_id": "ap-1",
        "operation_id": op.operation_id,
        "input_digest": op.input_digest,
        "action_name": op.action_name,
        "action_version": op.action_version,
        "tenant": op.identity.tenant,
        "approver": "users:v1:bob",
        "approved": True,
        "expires_at": T0 + timedelta(minutes=5),
        "authority": o.Authority(True, "users:v1:bob"),
    }
    fields.update(changes)
    return o.decide(op, o.DecideRequest(**fields), T0 + SECOND)  # type: ignore[arg-type]


def test_an_awaiting_operation_cannot_be_claimed() -> None:
    outcome = o.claim(_approval_op(), o.ClaimRequest("w1", LEASE), T0)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_ELIGIBLE


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("input_digest", digest("other"), o.RefusalCode.APPROVAL_MISBOUND),
        ("action_version", 9, o.RefusalCode.APPROVAL_MISBOUND),
        ("tenant", "tenant-b", o.RefusalCode.APPROVAL_MISBOUND),
        ("operation_id", "op-9", o.RefusalCode.OPERATION_NOT_FOUND),
        ("approver", "users:v1:alice", o.RefusalCode.SELF_APPROVAL),
        # The requester under another version of their resolver is still the requester.
        ("approver", "users:v2:alice", o.RefusalCode.SELF_APPROVAL),
        ("expires_at", T0, o.RefusalCode.APPROVAL_EXPIRED),
        ("authority", o.Authority(False, "users:v1:bob"), o.RefusalCode.NOT_AUTHORIZED),
    ],
)
def test_a_misbound_or_invalid_decision_is_refused(field: str, value: object, code: o.RefusalCode) -> None:
    changes: dict[str, object] = {field: value}
    if field == "approver":
        changes["authority"] = o.Authority(True, str(value))
    outcome = _decide(_approval_op(), **changes)
    assert isinstance(outcome, o.Refusal) and outcome.code is code, outcome


def test_approval_is_consumed_once_and_survives_a_replacement() -> None:
    decided = _decide(_approval_op())
    assert isinstance(decided, o.Decision) and decided.operation.state is OperationState.ADMITTED
    repeat = _decide(decided.operation)
    assert isinstance(repeat, o.Unchanged) and repeat.code is o.UnchangedCode.ALREADY_DECIDED
    other = _decide(decided.operation, approval_id="ap-2", approved=False)
    assert isinstance(other, o.Refusal) and other.code is o.RefusalCode.DECISION_CONFLICT
    op, _, _ = claimed(decided.operation, "w1", T0 + SECOND)
    assert op.approval is not None and op.approval.consumed_by == 1
    # A replacement after the approval's expiry still runs: it was consumed by attempt 1.
    late = T0 + timedelta(minutes=6)
    op2, _, _ = claimed(op, "w2", late)
    assert op2.approval is not None and op2.approval.consumed_by == 1 and op2.fence == 2


@pytest.mark.parametrize("approver", ["users:v1:alice", "users:v2:alice"])
def test_a_claim_ends_a_stored_approval_its_requester_gave_under_any_resolver_version(approver: str) -> None:
    """The claim's binding check agrees with decide's self_approval: one principal under every resolver version.

    Such an approval can never become usable, so the claim ends the Operation rather than refusing it (a refused
    due row would stay first in its tenant's queue).
    """
    decided = _decide(_approval_op())
    assert isinstance(decided, o.Decision) and decided.operation.approval is not None
    assert decided.operation.identity.principal == "users:v1:alice"
    # A stored approval the kernel would never write today (decide refuses it), as an older store may hold.
    forged = attrs.evolve(decided.operation, approval=attrs.evolve(decided.operation.approval, approver=approver))
    outcome = o.claim(forged, o.ClaimRequest("w1", LEASE), T0 + SECOND)
    assert isinstance(outcome, o.Decision) and outcome.credential is None, outcome
    assert (outcome.operation.state, outcome.operation.outcome) == (
        OperationState.FAILED, o.TerminalOutcome.APPROVAL_MISBOUND
    )
    assert "is not bound to this operation" in outcome.transition.reason


def test_an_approval_that_expires_unused_ends_the_operation() -> None:
    decided = _decide(_approval_op())
    assert isinstance(decided, o.Decision)
    outcome = o.claim(decided.operation, o.ClaimRequest("w1", LEASE), T0 + timedelta(minutes=5))
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.outcome is o.TerminalOutcome.APPROVAL_EXPIRED


def test_rejection_fails_the_operation() -> None:
    outcome = _decide(_approval_op(), approved=False)
    assert isinstance(outcome, o.Decision)
    assert outcome.operation.outcome is o.TerminalOutcome.APPROVAL_REJECTED


def test_cancel_wins_before_the_effect_and_then_the_effect_is_refused() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    effect = o.complete(op, o.CompleteRequest(cred, GRANTED), T0 + SECOND)
    assert isinstance(effect, o.Decision)
    cancelled = o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0 + SECOND)
    assert isinstance(cancelled, o.Decision)
    assert [a.state for a in cancelled.attempts] == [o.AttemptState.CANCELLED]
    # Once cancel committed, the effect decided earlier no longer holds its guard ...
    assert not effect.guard.holds(cancelled.operation, None, T0 + SECOND)
    # ... and deciding again refuses.
    again = o.complete(cancelled.operation, o.CompleteRequest(cred, GRANTED), T0 + SECOND)
    assert isinstance(again, o.Refusal) and again.code is o.RefusalCode.NOT_RUNNING
    repeat = o.cancel(cancelled.operation, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0)
    assert isinstance(repeat, o.Unchanged)


def test_a_cancellation_reason_is_at_most_as_long_as_a_review_decisions_rationale() -> None:
    # The bound of the executions' review decisions and recoveries (kernel/recovery.py): a reason of any length was
    # kept in the transition.
    from fencekeeper.kernel.recovery import MAX_RATIONALE  # noqa: PLC0415

    op = admitted()
    longest = o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", GRANTED, "x" * MAX_RATIONALE), T0)
    assert isinstance(longest, o.Decision) and longest.transition.reason == "x" * MAX_RATIONALE
    outcome = o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", GRANTED, "x" * (MAX_RATIONALE + 1)), T0)
    assert outcome == o.Refusal(
        o.RefusalCode.INVALID_REQUEST, f"reason: must be at most 2000 characters, got {MAX_RATIONALE + 1}", "reason"
    )


@pytest.mark.parametrize(
    ("detail", "problem"),
    [
        ("a\x00b", "NUL"),
        ("\ud800", "surrogate"),
        ("x" * 2001, "must be at most 2000 characters, got 2001"),
    ],
)
def test_an_unknown_outcomes_detail_is_text_a_store_keeps_and_bounded_as_a_cancellation_reason(
    detail: str, problem: str
) -> None:
    # The detail is kept in the transition.  Unchecked, a NUL failed PostgreSQL's insert and a lone surrogate the
    # encoding of either store, inside the transaction, instead of being refused naming the field.
    op, cred, _ = claimed(admitted(effect_class=o.EffectClass.EXTERNAL), "w1", T0)
    intent = o.record_intent(op, o.IntentRequest(cred), T0)
    assert isinstance(intent, o.Decision)
    outcome = o.outcome_unknown(intent.operation, o.UnknownRequest(cred, detail), T0)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.INVALID_REQUEST, outcome
    assert outcome.field == "detail" and problem in outcome.message, outcome.message
    longest = o.outcome_unknown(intent.operation, o.UnknownRequest(cred, "x" * 2000), T0)
    assert isinstance(longest, o.Decision) and longest.transition.reason.endswith("x" * 2000)


def test_cancel_after_the_effect_is_too_late() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    effect = o.complete(op, o.CompleteRequest(cred, GRANTED), T0 + SECOND)
    assert isinstance(effect, o.Decision)
    outcome = o.cancel(effect.operation, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.CANCEL_TOO_LATE


def test_external_effect_needs_intent_and_keeps_one_effect_id() -> None:
    op, cred, _ = claimed(admitted(effect_class=o.EffectClass.EXTERNAL), "w1", T0)
    refused = o.complete(op, o.CompleteRequest(cred, GRANTED), T0)
    assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.INTENT_REQUIRED
    intent = o.record_intent(op, o.IntentRequest(cred), T0)
    assert isinstance(intent, o.Decision)
    effect_id = intent.operation.effect_id
    assert effect_id == "op-1/effect"
    op2, cred2, _ = claimed(intent.operation, "w2", T0 + LEASE)
    again = o.record_intent(op2, o.IntentRequest(cred2), T0 + LEASE)
    assert isinstance(again, o.Decision) and again.operation.effect_id == effect_id
    unknown = o.outcome_unknown(again.operation, o.UnknownRequest(cred2, "timeout"), T0 + LEASE)
    assert isinstance(unknown, o.Decision)
    assert unknown.operation.state is OperationState.OUTCOME_UNKNOWN
    assert unknown.operation.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN


def _external_with_intent(worker: str = "w1") -> tuple[o.Operation, o.Credential]:
    op, cred, _ = claimed(admitted(effect_class=o.EffectClass.EXTERNAL), worker, T0)
    assert o.effect_plan(op) is o.EffectPlan.PERFORM
    intent = o.record_intent(op, o.IntentRequest(cred), T0)
    assert isinstance(intent, o.Decision)
    return intent.operation, cred


def test_an_intent_leaves_the_effect_unsettled_since_its_attempt() -> None:
    op, cred = _external_with_intent()
    assert op.effect_unsettled_since == cred.fence == 1
    assert o.effect_plan(op) is o.EffectPlan.RECONCILE


def test_a_conclusive_not_applied_answer_settles_the_effect_and_the_retry_performs_again() -> None:
    op, cred = _external_with_intent()
    failed = o.fail(op, o.FailRequest(cred, "effect_failed", retryable=True, effect_not_applied=True), T0 + SECOND)
    assert isinstance(failed, o.Decision)
    assert failed.operation.state is OperationState.ADMITTED
    assert failed.operation.effect_unsettled_since is None
    assert failed.operation.effect_id == "op-1/effect"
    assert "answered not applied" in failed.transition.reason
    now = failed.operation.next_eligible_at
    retry, cred2, _ = claimed(failed.operation, "w2", now)
    assert o.effect_plan(retry) is o.EffectPlan.PERFORM
    # Nothing is unanswered until the retry records its intent: no unknown outcome, no success.
    for outcome in (
        o.outcome_unknown(retry, o.UnknownRequest(cred2), now),
        o.complete(retry, o.CompleteRequest(cred2, GRANTED), now),
    ):
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.INTENT_REQUIRED
    again = o.record_intent(retry, o.IntentRequest(cred2), now)
    assert isinstance(again, o.Decision)
    assert again.operation.effect_id == "op-1/effect" and again.operation.effect_unsettled_since == 2
    assert "every earlier issue was answered not applied" in again.transition.reason
    done = o.complete(again.operation, o.CompleteRequest(cred2, GRANTED), now)
    assert isinstance(done, o.Decision) and done.operation.outcome is o.TerminalOutcome.SUCCEEDED
    assert done.operation.effect_unsettled_since is None


@pytest.mark.parametrize("how", ["retryable failure", "lease expiry"])
def test_an_ambiguous_end_leaves_the_effect_unsettled_and_the_next_attempt_reconciles(how: str) -> None:
    op, cred = _external_with_intent()
    if how == "retryable failure":  # a lost reply, a timeout, an exception: no conclusive answer
        failed = o.fail(op, o.FailRequest(cred, "handler_error", retryable=True), T0 + SECOND)
        assert isinstance(failed, o.Decision)
        op, at = failed.operation, failed.operation.next_eligible_at
    else:  # the worker crashed between intent and answer
        at = T0 + LEASE
    assert op.effect_unsettled_since == 1
    retry, cred2, _ = claimed(op, "w2", at)
    assert o.effect_plan(retry) is o.EffectPlan.RECONCILE
    again = o.record_intent(retry, o.IntentRequest(cred2), at)
    assert isinstance(again, o.Decision) and again.operation.effect_unsettled_since == 1
    assert "reconcile before any repeat" in again.transition.reason
    unknown = o.outcome_unknown(again.operation, o.UnknownRequest(cred2, "not reconcilable"), at)
    assert isinstance(unknown, o.Decision) and unknown.operation.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN


def test_a_not_applied_answer_cannot_settle_an_earlier_attempts_unanswered_issue() -> None:
    op, _ = _external_with_intent()
    replaced, cred2, _ = claimed(op, "w2", T0 + LEASE)  # attempt 1's call may still land
    again = o.record_intent(replaced, o.IntentRequest(cred2), T0 + LEASE)
    assert isinstance(again, o.Decision)
    request = o.FailRequest(cred2, "effect_failed", retryable=True, effect_not_applied=True)
    failed = o.fail(again.operation, request, T0 + LEASE + SECOND)
    assert isinstance(failed, o.Decision)
    assert failed.operation.effect_unsettled_since == 1
    assert o.effect_plan(failed.operation) is o.EffectPlan.RECONCILE
    assert "the issue of attempt 1 is unanswered" in failed.transition.reason


def test_an_intent_recorded_before_settlement_was_known_is_never_settled() -> None:
    op, cred = _external_with_intent()
    legacy = attrs.evolve(op, effect_unsettled_since=0)  # what the migration writes for an older intent
    failed = o.fail(legacy, o.FailRequest(cred, "effect_failed", retryable=True, effect_not_applied=True), T0)
    assert isinstance(failed, o.Decision) and failed.operation.effect_unsettled_since == 0
    assert o.effect_plan(failed.operation) is o.EffectPlan.RECONCILE


def test_a_not_applied_answer_is_refused_for_an_action_that_is_not_external() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    refused = o.fail(op, o.FailRequest(cred, "busy", retryable=True, effect_not_applied=True), T0)
    assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.WRONG_EFFECT_CLASS
    malformed = o.fail(op, o.FailRequest(cred, "busy", retryable=True, effect_not_applied="yes"), T0)  # type: ignore[arg-type]
    assert isinstance(malformed, o.Refusal) and malformed.field == "effect_not_applied"


def test_cancel_says_an_effect_may_have_been_issued_only_while_it_is_unsettled() -> None:
    op, cred = _external_with_intent()
    stop = o.CancelRequest("op-1", "users:v1:alice", GRANTED)
    unsettled = o.cancel(op, stop, T0 + SECOND)
    assert isinstance(unsettled, o.Decision) and "may have been issued" in unsettled.transition.reason
    failed = o.fail(op, o.FailRequest(cred, "effect_failed", retryable=True, effect_not_applied=True), T0 + SECOND)
    assert isinstance(failed, o.Decision)
    retry, _, _ = claimed(failed.operation, "w2", failed.operation.next_eligible_at)
    settled = o.cancel(retry, stop, failed.operation.next_eligible_at)
    assert isinstance(settled, o.Decision) and "may have been issued" not in settled.transition.reason


def test_atomic_actions_record_no_intent_and_cannot_be_unknown() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    for outcome in (o.record_intent(op, o.IntentRequest(cred), T0), o.outcome_unknown(op, o.UnknownRequest(cred), T0)):
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.WRONG_EFFECT_CLASS


def test_expire_waits_for_a_live_owner_then_abandons_it() -> None:
    op, _, _ = claimed(admitted(), "w1", T0 + timedelta(minutes=9, seconds=55))
    live = o.expire(op, op.deadline)
    assert isinstance(live, o.Refusal)
    ended = o.expire(op, op.lease_expires_at)  # type: ignore[arg-type]
    assert isinstance(ended, o.Decision)
    assert ended.transition.event is OperationEvent.DEADLINE_EXCEEDED
    assert [a.state for a in ended.attempts] == [o.AttemptState.ABANDONED]


def test_every_refusal_code_is_published() -> None:
    text = (Path(__file__).resolve().parents[2] / "specs" / "operations.md").read_text()
    for code in (*o.RefusalCode, *o.TerminalOutcome, *o.UnchangedCode):
        assert f"`{code.value}`" in text, code


@pytest.mark.parametrize("approver", ["users:v1:bob", "staff:v1:alice", "users:v1:alice2"])
def test_another_resolver_or_subject_may_approve(approver: str) -> None:
    outcome = _decide(_approval_op(), approver=approver, authority=o.Authority(True, approver))
    assert isinstance(outcome, o.Decision), outcome


BOB_DENIED = o.Authority(False, "users:v1:bob", "not the requester")


@pytest.mark.parametrize("ended", ["cancelled", "succeeded"])
def test_a_cancellation_without_authority_is_refused_whatever_the_operation_became(ended: str) -> None:
    """A repeat or a late cancel tells a principal who may not cancel nothing of the Operation, and grants nothing."""
    op, cred, _ = claimed(admitted(), "w1", T0)
    if ended == "cancelled":
        finished = o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0 + SECOND)
    else:
        finished = o.complete(op, o.CompleteRequest(cred, GRANTED, '{"secret": 1}'), T0 + SECOND)
    assert isinstance(finished, o.Decision)
    outcome = o.cancel(finished.operation, o.CancelRequest("op-1", "users:v1:bob", BOB_DENIED), T0 + 2 * SECOND)
    assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_AUTHORIZED, outcome
    assert ended not in outcome.message


def test_a_decision_without_authority_is_refused_before_anything_stored_is_compared() -> None:
    """Neither the stored decision nor the stored bindings answer an approver whose current authority is denied."""
    decided = _decide(_approval_op())
    assert isinstance(decided, o.Decision)
    revoked = o.Authority(False, "users:v1:bob", "revoked")
    for changes in ({}, {"approval_id": "ap-2", "approved": False}, {"input_digest": digest("other")}):
        outcome = _decide(decided.operation, authority=revoked, **changes)
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.NOT_AUTHORIZED, (changes, outcome)
        assert decided.operation.input_digest not in outcome.message and "ap-1" not in outcome.message



def test_a_heartbeat_never_carries_the_lease_past_the_deadline() -> None:
    """The overall deadline bounds an Attempt that keeps renewing: past it a heartbeat is refused, before it capped."""
    op = admitted()
    deadline = op.deadline
    op, cred, _ = claimed(op, "w1", deadline - 15 * SECOND)
    capped = o.heartbeat(op, o.HeartbeatRequest(cred, LEASE), deadline - 7 * SECOND)
    assert isinstance(capped, o.Decision)
    assert capped.operation.lease_expires_at == deadline
    # A lease the claim granted past the deadline stands (a live owner keeps its chance to record an answer) ...
    late, late_cred, _ = claimed(admitted(), "w1", deadline - SECOND)
    kept = o.heartbeat(late, o.HeartbeatRequest(late_cred, LEASE), deadline - SECOND / 2)
    assert isinstance(kept, o.Decision) and kept.operation.lease_expires_at == late.lease_expires_at
    # ... but nothing renews it once the deadline has passed.
    refused = o.heartbeat(late, o.HeartbeatRequest(late_cred, LEASE), deadline)
    assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.DEADLINE_EXCEEDED, refused
    ended = o.claim(late, o.ClaimRequest("w2", LEASE), late.lease_expires_at)  # type: ignore[arg-type]
    assert isinstance(ended, o.Decision) and ended.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED


@pytest.mark.parametrize("effect", [o.EffectClass.EXTERNAL, o.EffectClass.ATOMIC])
def test_no_effect_begins_from_the_deadline_on_under_a_live_lease(effect: o.EffectClass) -> None:
    """Seed 001: the overall deadline is a limit.  An intent and an atomic success past it are refused, writing
    nothing; before it, their guard holds them to the deadline at commit; the owner's failure ends it so."""
    op = admitted(effect_class=effect)
    deadline = op.deadline
    op, cred, _ = claimed(op, "w1", deadline - SECOND)
    assert op.lease_expires_at is not None and op.lease_expires_at > deadline  # a live owner past the deadline
    begin = (
        (lambda at: o.record_intent(op, o.IntentRequest(cred), at))
        if effect is o.EffectClass.EXTERNAL
        else (lambda at: o.complete(op, o.CompleteRequest(cred, GRANTED), at))
    )
    refused = begin(deadline)
    assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.DEADLINE_EXCEEDED, refused
    assert "deadline" in refused.message
    in_time = begin(deadline - SECOND / 2)
    assert isinstance(in_time, o.Decision) and in_time.guard.live_until == deadline
    assert o.commit_refusal(in_time, deadline - SECOND / 4) is None
    late = o.commit_refusal(in_time, deadline)
    assert late is not None and late.code is o.RefusalCode.DEADLINE_EXCEEDED
    ended = o.fail(op, o.FailRequest(cred, "deadline_exceeded", retryable=True), deadline)
    assert isinstance(ended, o.Decision) and ended.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED
    assert ended.transition.event is OperationEvent.DEADLINE_EXCEEDED


def test_an_answer_to_a_call_begun_before_the_deadline_is_recorded_after_it() -> None:
    op = admitted(effect_class=o.EffectClass.EXTERNAL)
    deadline = op.deadline
    op, cred, _ = claimed(op, "w1", deadline - SECOND)
    intent = o.record_intent(op, o.IntentRequest(cred), deadline - SECOND / 2)
    assert isinstance(intent, o.Decision)
    issued = intent.operation
    success = o.complete(issued, o.CompleteRequest(cred, GRANTED, '{"ok":true}'), deadline + SECOND)
    assert isinstance(success, o.Decision) and success.operation.outcome is o.TerminalOutcome.SUCCEEDED
    # Its guard is the lease alone: the answer commits after the deadline.
    assert success.guard.live_until == issued.lease_expires_at
    assert o.commit_refusal(success, deadline + SECOND) is None
    unknown = o.outcome_unknown(issued, o.UnknownRequest(cred, "timed out"), deadline + SECOND)
    assert isinstance(unknown, o.Decision)
    assert unknown.operation.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN


def _issued_before_the_deadline(**changes: object) -> o.Operation:
    """An external Operation whose intent committed just before the deadline, under a lease that ends after it."""
    op = admitted(effect_class=o.EffectClass.EXTERNAL, **changes)
    deadline = op.deadline
    op, cred, _ = claimed(op, "w1", deadline - SECOND)
    intent = o.record_intent(op, o.IntentRequest(cred), deadline - SECOND / 2)
    assert isinstance(intent, o.Decision) and intent.operation.lease_expires_at is not None
    return intent.operation


def test_a_claim_past_the_deadline_gives_an_unanswered_call_an_attempt_that_may_only_look() -> None:
    issued = _issued_before_the_deadline()
    late = issued.lease_expires_at
    assert late is not None and late > issued.deadline
    claim = o.claim(issued, o.ClaimRequest("w2", LEASE), late)
    assert isinstance(claim, o.Decision) and claim.credential is not None, claim
    assert [(a.number, a.state) for a in claim.attempts] == [(1, o.AttemptState.ABANDONED), (2, o.AttemptState.RUNNING)]
    assert "never answered" in claim.transition.reason and "may only ask the provider" in claim.transition.reason
    looking = claim.operation
    refused = o.record_intent(looking, o.IntentRequest(claim.credential), late)
    assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.DEADLINE_EXCEEDED
    found = o.complete(looking, o.CompleteRequest(claim.credential, GRANTED, '{"ok":true}'), late)
    assert isinstance(found, o.Decision) and found.operation.outcome is o.TerminalOutcome.SUCCEEDED
    # With no Attempt left there is none to look with: the claim ends it unknown, as the sweep does.
    used = attrs.evolve(issued, policy=attrs.evolve(POLICY, maximum_attempts=1))
    ended = o.claim(used, o.ClaimRequest("w2", LEASE), late)
    assert isinstance(ended, o.Decision) and ended.credential is None
    assert ended.operation.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN


def test_the_deadline_sweep_ends_an_unanswered_call_unknown_saying_it_was_issued() -> None:
    issued = _issued_before_the_deadline()
    late = issued.lease_expires_at
    assert late is not None
    swept = o.expire(issued, late)
    assert isinstance(swept, o.Decision), swept
    assert (swept.operation.state, swept.operation.outcome) == (
        OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN,
    )
    assert swept.transition.event is OperationEvent.OUTCOME_UNKNOWN
    assert swept.operation.effect_unsettled_since == 1
    assert f"external effect {issued.effect_id} was issued by attempt 1 and never answered" in swept.transition.reason
    # An Operation that issued nothing still ends by its deadline.
    quiet = o.expire(admitted(effect_class=o.EffectClass.EXTERNAL), issued.deadline)
    assert isinstance(quiet, o.Decision) and quiet.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED


def test_a_late_commit_of_an_owner_decision_that_begins_nothing_is_lease_expired() -> None:
    op, cred, _ = claimed(admitted(), "w1", T0)
    failed = o.fail(op, o.FailRequest(cred, "busy", retryable=True), T0 + SECOND)
    assert isinstance(failed, o.Decision) and op.lease_expires_at is not None
    late = o.commit_refusal(failed, op.lease_expires_at)
    assert late is not None and late.code is o.RefusalCode.LEASE_EXPIRED
    assert o.commit_refusal(failed, op.lease_expires_at - SECOND) is None


def test_a_retryable_failure_past_the_deadline_names_the_deadline_before_the_attempts() -> None:
    op = admitted(policy=attrs.evolve(POLICY, maximum_attempts=1))
    op, cred, _ = claimed(op, "w1", op.deadline - SECOND)
    ended = o.fail(op, o.FailRequest(cred, "busy", retryable=True), op.deadline)
    assert isinstance(ended, o.Decision) and ended.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED
    before = o.fail(op, o.FailRequest(cred, "busy", retryable=True), op.deadline - SECOND / 2)
    assert isinstance(before, o.Decision) and before.operation.outcome is o.TerminalOutcome.MAX_ATTEMPTS_EXCEEDED


@pytest.mark.parametrize("approved", [True, False])
def test_a_decision_after_the_deadline_is_refused_and_the_operation_ends_approval_expired(approved: bool) -> None:
    """Past its deadline an Operation awaiting approval can only end approval_expired, whenever the sweep comes."""
    op = _approval_op()
    late = o.decide(
        op,
        o.DecideRequest("ap-1", op.operation_id, op.input_digest, op.action_name, op.action_version,
                        op.identity.tenant, "users:v1:bob", approved, op.deadline + timedelta(minutes=5),
                        o.Authority(True, "users:v1:bob")),
        op.deadline,
    )
    assert isinstance(late, o.Refusal) and late.code is o.RefusalCode.DEADLINE_EXCEEDED, late
    swept = o.claim(op, o.ClaimRequest("w1", LEASE), op.deadline)
    assert isinstance(swept, o.Decision) and swept.operation.outcome is o.TerminalOutcome.APPROVAL_EXPIRED



def test_the_claim_that_consumes_an_approval_says_so_in_history() -> None:
    decided = _decide(_approval_op())
    assert isinstance(decided, o.Decision)
    _, _, first = claimed(decided.operation, "w1", T0 + SECOND)
    assert "approval ap-1" in first.transition.reason and "users:v1:bob" in first.transition.reason
    assert first.operation.approval is not None and first.operation.approval.consumed_by == 1
    _, _, replacement = claimed(first.operation, "w2", T0 + SECOND + LEASE)
    assert "approval" not in replacement.transition.reason


def test_cancel_between_attempts_says_an_earlier_attempts_effect_may_have_been_issued() -> None:
    """Waiting for its retry, an Operation whose intent is unanswered still may have its effect applied."""
    op, cred = _external_with_intent()
    ambiguous = o.fail(op, o.FailRequest(cred, "effect_ambiguous", retryable=True), T0 + SECOND)
    assert isinstance(ambiguous, o.Decision) and ambiguous.operation.state is OperationState.ADMITTED
    assert ambiguous.operation.effect_unsettled_since == 1
    cancelled = o.cancel(ambiguous.operation, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0 + 2 * SECOND)
    assert isinstance(cancelled, o.Decision)
    assert "may have been issued" in cancelled.transition.reason, cancelled.transition.reason


_REQUEST_DECISIONS = (
    ("submit", o.SubmitRequest),
    ("claim", o.ClaimRequest),
    ("heartbeat", o.HeartbeatRequest),
    ("record_intent", o.IntentRequest),
    ("complete", o.CompleteRequest),
    ("complete_refusal", o.CompleteRequest),
    ("fail", o.FailRequest),
    ("outcome_unknown", o.UnknownRequest),
    ("decide", o.DecideRequest),
    ("cancel", o.CancelRequest),
)


@pytest.mark.parametrize(("name", "kind"), _REQUEST_DECISIONS)
def test_a_request_of_another_type_is_refused_naming_the_request(name: str, kind: type) -> None:
    # Before any field is read: not an AttributeError on the request's first field.
    decision = getattr(o, name)
    operation, _, _ = claimed(admitted(), "w-1", T0)
    for value in (None, "request", o.ClaimRequest("w-1", LEASE) if kind is not o.ClaimRequest else o.IntentRequest):
        outcome = decision(operation, value, T0)
        assert isinstance(outcome, o.Refusal), outcome
        assert (outcome.code, outcome.field) == (o.RefusalCode.INVALID_REQUEST, "request")
        assert outcome.message == f"request: must be of type {kind.__name__}, got {type(value).__name__}"


@pytest.mark.parametrize("actor", [None, "", "has space", 7])
def test_expire_refuses_an_actor_that_is_no_identifier(actor: object) -> None:
    # Before: the deadline was decided with the actor recorded as given (None included).
    operation = admitted()
    outcome = o.expire(operation, operation.deadline, actor)  # type: ignore[arg-type]
    assert isinstance(outcome, o.Refusal), outcome
    assert (outcome.code, outcome.field) == (o.RefusalCode.INVALID_REQUEST, "actor")
    assert isinstance(o.expire(operation, operation.deadline, "system:deadline"), o.Decision)


@pytest.mark.parametrize(
    "result", ["{", "not json", "NaN", '{"amount": Infinity}', "", '"a\x00b"', '"\ud800"']
)
def test_complete_refuses_a_result_that_is_no_storable_json_text(result: str) -> None:
    # Before: the success was decided and its result written, and a store
    # then read the row back as malformed_row (a result that is not JSON).
    operation, credential, _ = claimed(admitted(), "w-1", T0)
    request = o.CompleteRequest(credential, GRANTED, result)
    for decide in (o.complete, o.complete_refusal):
        outcome = decide(operation, request, T0 + SECOND)
        assert isinstance(outcome, o.Refusal), outcome
        assert (outcome.code, outcome.field) == (o.RefusalCode.INVALID_REQUEST, "result")
    assert isinstance(o.complete(operation, attrs.evolve(request, result='{"ok": [1, 2.5, null]}'), T0 + SECOND), o.Decision)


@pytest.mark.parametrize(
    ("result", "decided"),
    [
        ("[" * 32 + "]" * 32, True),
        ('{"a":' * 31 + "{}" + "}" * 31, True),
        ("[" * 31 + '"' + "[{" * 50 + '\\"' + '"' + "]" * 31, True),  # brackets in a string nest nothing
        ("[" * 33 + "]" * 33, False),
        ('{"a":' * 32 + "{}" + "}" * 32, False),
        ("[" * 1000 + "]" * 1000, False),
        ("[" * 100_000, False),
    ],
    ids=["32-arrays", "32-objects", "brackets-in-a-string", "33-arrays", "33-objects", "1000", "100000-unclosed"],
)
def test_a_result_nests_at_most_32_levels(result: str, decided: bool) -> None:
    # Before: Python's decoder decided, refusing "nested too deeply" at its recursion limit, near 1000 levels,
    # a bound no other language shares; operations.md now states 32, the bound of an Event payload.
    operation, credential, _ = claimed(admitted(), "w-1", T0)
    outcome = o.complete(operation, o.CompleteRequest(credential, GRANTED, result), T0 + SECOND)
    if decided:
        assert isinstance(outcome, o.Decision), outcome
        assert outcome.operation.result == result
    else:
        assert isinstance(outcome, o.Refusal), outcome
        assert (outcome.code, outcome.field) == (o.RefusalCode.INVALID_REQUEST, "result")
        assert "nested at most 32 levels" in outcome.message
    assert o.MAX_RESULT_DEPTH == 32


def test_the_questions_beside_the_decisions_name_a_malformed_argument() -> None:
    # Before: AttributeErrors on None, and datetime comparison errors on a naive now.
    operation, credential, _ = claimed(admitted(), "w-1", T0)
    naive = T0.replace(tzinfo=None)
    for value, field in ((None, "credential"), (("op-1", "w-1", 1), "credential")):
        refusal = o.check_owner(operation, value, T0)  # type: ignore[arg-type]
        assert refusal is not None and (refusal.code, refusal.field) == (o.RefusalCode.INVALID_REQUEST, field)
    refusal = o.check_owner(operation, credential, naive)
    assert refusal is not None and (refusal.code, refusal.field) == (o.RefusalCode.INVALID_REQUEST, "now")
    assert o.check_owner(operation, credential, T0) is None
    for value in (None, "op-1"):
        with pytest.raises(TypeError, match=r"^operation: must be of type Operation, got "):
            o.effect_plan(value)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^operation: must be of type Operation, got "):
            o.due(value, T0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^now: naive datetime"):
        o.due(operation, naive)
    with pytest.raises(TypeError, match=r"^now: must be a datetime"):
        o.due(operation, None)  # type: ignore[arg-type]


def test_the_identity_helpers_name_an_argument_not_of_its_type() -> None:
    # Before: AttributeErrors ('NoneType' object has no attribute 'split' / 'namespace').
    with pytest.raises(TypeError, match=r"^reference: must be of type str, got NoneType"):
        o.stable_principal(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^identity: must be of type Identity, got tuple"):
        o.identity_key(("shop", "tenant-a", "users:v1:alice", "key-1"))  # type: ignore[arg-type]


def _issued_by_attempt(number: int, **changes: object) -> tuple[o.Operation, o.Credential]:
    """An external Operation whose ``number``-th Attempt (every earlier one failed retryably) recorded its intent."""
    op = admitted(effect_class=o.EffectClass.EXTERNAL, **changes)
    now = T0
    for _ in range(number - 1):
        op, cred, _ = claimed(op, "w1", now)
        retried = o.fail(op, o.FailRequest(cred, "busy", retryable=True), now)
        assert isinstance(retried, o.Decision) and retried.operation.state is OperationState.ADMITTED
        op, now = retried.operation, retried.operation.next_eligible_at
    op, cred, _ = claimed(op, "w1", now)
    intent = o.record_intent(op, o.IntentRequest(cred), now)
    assert isinstance(intent, o.Decision)
    return intent.operation, cred


def test_a_replacement_finding_every_attempt_used_ends_an_unanswered_call_unknown() -> None:
    issued, _ = _issued_by_attempt(3)
    assert issued.attempt_count == POLICY.maximum_attempts and issued.lease_expires_at is not None
    ended = o.claim(issued, o.ClaimRequest("w2", LEASE), issued.lease_expires_at)
    assert isinstance(ended, o.Decision) and ended.credential is None, ended
    assert (ended.operation.state, ended.operation.outcome, ended.operation.error_code) == (
        OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN, "external_outcome_unknown",
    )
    assert ended.transition.event is OperationEvent.OUTCOME_UNKNOWN
    assert [(a.number, a.state, a.error_code) for a in ended.attempts] == [(3, o.AttemptState.ABANDONED, "lease_expired")]
    assert ended.operation.effect_unsettled_since == 3
    assert f"external effect {issued.effect_id} was issued by attempt 3 and never answered" in ended.transition.reason
    # A call answered "not applied" (or none issued) still ends by the limit it hit.
    answered = attrs.evolve(issued, effect_unsettled_since=None)
    limit = o.claim(answered, o.ClaimRequest("w2", LEASE), issued.lease_expires_at)
    assert isinstance(limit, o.Decision) and limit.operation.outcome is o.TerminalOutcome.MAX_ATTEMPTS_EXCEEDED


@pytest.mark.parametrize(
    ("request_changes", "ended_by"),
    [
        ({"retryable": True}, "the last of 3 attempts"),
        ({"retryable": False}, "a failure that is not retryable"),
        ({"retryable": False, "not_authorized": True}, "the denial of current authority"),
    ],
)
def test_a_failure_that_ends_an_operation_with_its_call_unanswered_ends_it_unknown(
    request_changes: dict[str, bool], ended_by: str
) -> None:
    issued, cred = _issued_by_attempt(3)
    ended = o.fail(issued, o.FailRequest(cred, "handler_error", **request_changes), T0 + 10 * SECOND)
    assert isinstance(ended, o.Decision), ended
    assert (ended.operation.state, ended.operation.outcome) == (
        OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN,
    )
    # The request's code still says what ended it; the effect stays unsettled.
    assert ended.operation.error_code == "handler_error" and ended.operation.effect_unsettled_since == 3
    assert ended.transition.event is OperationEvent.OUTCOME_UNKNOWN
    assert ended_by in ended.transition.reason and "was issued by attempt 3 and never answered" in ended.transition.reason
    assert [(a.number, a.state) for a in ended.attempts] == [(3, o.AttemptState.FAILED)]


def test_an_ending_failure_that_settles_its_own_call_or_follows_none_keeps_its_outcome() -> None:
    issued, cred = _issued_by_attempt(3)
    declined = o.FailRequest(cred, "effect_failed", retryable=False, effect_not_applied=True)
    settled = o.fail(issued, declined, T0 + 10 * SECOND)
    assert isinstance(settled, o.Decision) and settled.operation.outcome is o.TerminalOutcome.ACTION_FAILED
    quiet, quiet_cred, _ = claimed(admitted(effect_class=o.EffectClass.EXTERNAL), "w1", T0)
    denied = o.fail(quiet, o.FailRequest(quiet_cred, "not_authorized", retryable=False, not_authorized=True), T0)
    assert isinstance(denied, o.Decision) and denied.operation.outcome is o.TerminalOutcome.NOT_AUTHORIZED
    # An earlier Attempt's call stays unanswered when a later one's own call is declined: the outcome is unknown.
    earlier = attrs.evolve(issued, effect_unsettled_since=2)
    still = o.fail(earlier, declined, T0 + 10 * SECOND)
    assert isinstance(still, o.Decision) and still.operation.outcome is o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN


def test_an_external_success_is_recorded_whatever_the_authority_says() -> None:
    # A principal revoked since the call was issued: the provider's answer is still what the record says.
    issued, cred = _issued_by_attempt(1)
    revoked = o.Authority(False, "users:v1:alice", "revoked")
    found = o.complete(issued, o.CompleteRequest(cred, revoked, '{"ok":true}'), T0 + SECOND)
    assert isinstance(found, o.Decision) and found.operation.outcome is o.TerminalOutcome.SUCCEEDED
    # An atomic or read-only success is its action's own work and still needs current authority.
    for effect_class in (o.EffectClass.ATOMIC, o.EffectClass.READ_ONLY):
        op, own, _ = claimed(admitted(effect_class=effect_class), "w1", T0)
        refused = o.complete(op, o.CompleteRequest(own, revoked), T0)
        assert isinstance(refused, o.Refusal) and refused.code is o.RefusalCode.NOT_AUTHORIZED


# --- an authority answers for one principal (seed 001, Current authorization) ---------------------------------

MALLORY = o.Authority(True, "users:v1:mallory")
"""A granted answer, but for another principal than the one each request acts for."""


def _misbound(outcome: o.Outcome) -> None:
    assert isinstance(outcome, o.Refusal), outcome
    assert (outcome.code, outcome.field) == (o.RefusalCode.NOT_AUTHORIZED, "authority.principal"), outcome
    assert "users:v1:mallory" in outcome.message


def test_a_submission_whose_authority_answers_for_another_principal_is_refused() -> None:
    _misbound(o.submit(None, submit_request(authority=MALLORY), T0))
    # Before the identity answers: the Operation it names is not given back, nor a conflict naming it.
    existing = admitted()
    _misbound(o.submit(existing, submit_request(operation_id="op-2", authority=MALLORY), T0 + SECOND))
    _misbound(o.submit(existing, submit_request(operation_id="op-2", input_digest=digest("x"), authority=MALLORY),
                       T0 + SECOND))
    # A denied answer for someone else is no answer about the submitter either: the binding is named.
    _misbound(o.submit(None, submit_request(authority=attrs.evolve(MALLORY, granted=False)), T0))


@pytest.mark.parametrize("effect_class", list(o.EffectClass))
def test_a_completion_whose_authority_answers_for_another_principal_is_refused(effect_class: o.EffectClass) -> None:
    op, cred, _ = claimed(admitted(effect_class=effect_class), "w1", T0)
    if effect_class is o.EffectClass.EXTERNAL:
        intent = o.record_intent(op, o.IntentRequest(cred), T0)
        assert isinstance(intent, o.Decision)
        op = intent.operation
    request = o.CompleteRequest(cred, MALLORY, '{"ok":true}')
    _misbound(o.complete_refusal(op, request, T0 + SECOND))
    _misbound(o.complete(op, request, T0 + SECOND))
    # The owner checks still come first: a stale credential is told so, whatever its authority.
    stale = o.complete(op, attrs.evolve(request, credential=attrs.evolve(cred, fence=2)), T0 + SECOND)
    assert isinstance(stale, o.Refusal) and stale.code is o.RefusalCode.STALE_FENCE


def test_a_cancellation_whose_authority_answers_for_another_principal_is_refused() -> None:
    op, _, _ = claimed(admitted(), "w1", T0)
    _misbound(o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", MALLORY), T0 + SECOND))
    # Whatever the Operation became: a repeat and a late cancel tell it nothing either.
    cancelled = o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0 + SECOND)
    assert isinstance(cancelled, o.Decision)
    _misbound(o.cancel(cancelled.operation, o.CancelRequest("op-1", "users:v1:alice", MALLORY), T0 + SECOND))


def test_a_decision_whose_authority_answers_for_another_principal_is_refused_naming_it() -> None:
    _misbound(_decide(_approval_op(), authority=MALLORY))


def test_an_authority_under_another_version_of_the_principals_resolver_answers_for_that_principal() -> None:
    """The one rule of principals: ``users:v2:alice`` is ``users:v1:alice`` (the idempotency key and self-approval say so)."""
    moved = o.Authority(True, "users:v2:alice")
    assert isinstance(o.submit(None, submit_request(authority=moved), T0), o.Decision)
    op, cred, _ = claimed(admitted(), "w1", T0)
    assert isinstance(o.complete(op, o.CompleteRequest(cred, moved), T0 + SECOND), o.Decision)
    assert isinstance(o.cancel(op, o.CancelRequest("op-1", "users:v1:alice", moved), T0 + SECOND), o.Decision)
    decided = _decide(_approval_op(), authority=o.Authority(True, "users:v2:bob"))
    assert isinstance(decided, o.Decision) and decided.operation.approval is not None
    assert decided.operation.approval.approver == "users:v1:bob"


@pytest.mark.parametrize("how", ["replacement", "retry"])
def test_an_approval_that_authorizes_nothing_after_an_issued_call_ends_it_unknown(how: str) -> None:
    """``approval_misbound`` after a call: only a row no decision writes, but then its ending is the call's.

    decide never stores such an approval and the first claim's check is the one every later claim repeats, so
    the kernel's own decisions never reach it; an earlier release did consume a self-approval given under another
    version of the requester's resolver (``_same_principal`` came later), and its Attempt may have issued a call.
    """
    op = admitted(effect_class=o.EffectClass.EXTERNAL, requires_approval=True)
    decided = _decide(op)
    assert isinstance(decided, o.Decision)
    op, cred, _ = claimed(decided.operation, "w1", T0 + SECOND)
    intent = o.record_intent(op, o.IntentRequest(cred), T0 + SECOND)
    assert isinstance(intent, o.Decision)
    issued = intent.operation
    assert issued.approval is not None and issued.lease_expires_at is not None
    if how == "retry":
        retried = o.fail(issued, o.FailRequest(cred, "handler_error", retryable=True), T0 + SECOND)
        assert isinstance(retried, o.Decision) and retried.operation.state is OperationState.ADMITTED
        issued = retried.operation
    # As an earlier release stored and consumed it: the requester's own approval, under the next resolver version.
    older = attrs.evolve(issued, approval=attrs.evolve(issued.approval, approver="users:v2:alice"))
    now = T0 + timedelta(minutes=1)
    ended = o.claim(older, o.ClaimRequest("w2", LEASE), now)
    assert isinstance(ended, o.Decision) and ended.credential is None, ended
    assert (ended.operation.state, ended.operation.outcome, ended.operation.error_code) == (
        OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN, "approval_misbound",
    )
    assert ended.transition.event is OperationEvent.OUTCOME_UNKNOWN
    assert ended.operation.effect_unsettled_since == 1
    assert "is not bound to this operation" in ended.transition.reason
    assert f"external effect {issued.effect_id} was issued by attempt 1 and never answered" in ended.transition.reason
    expected = [(1, o.AttemptState.ABANDONED, "lease_expired")] if how == "replacement" else []
    assert [(a.number, a.state, a.error_code) for a in ended.attempts] == expected
    # Every issue answered "not applied": nothing may have happened, and the ending keeps its own name.
    settled = o.claim(attrs.evolve(older, effect_unsettled_since=None), o.ClaimRequest("w2", LEASE), now)
    assert isinstance(settled, o.Decision) and settled.operation.outcome is o.TerminalOutcome.APPROVAL_MISBOUND


def test_the_kernels_own_decisions_never_reach_approval_misbound_after_an_issued_call() -> None:
    """An approval decide stored and a claim consumed authorizes every later claim: the check reads only bound fields."""
    op = admitted(effect_class=o.EffectClass.EXTERNAL, requires_approval=True)
    decided = _decide(op)
    assert isinstance(decided, o.Decision)
    op, cred, _ = claimed(decided.operation, "w1", T0 + SECOND)
    intent = o.record_intent(op, o.IntentRequest(cred), T0 + SECOND)
    assert isinstance(intent, o.Decision)
    replaced = o.claim(intent.operation, o.ClaimRequest("w2", LEASE), T0 + SECOND + LEASE)
    assert isinstance(replaced, o.Decision) and replaced.credential is not None, replaced
    assert replaced.operation.approval == intent.operation.approval


def test_an_operation_awaiting_approval_ends_approval_expired_whatever_its_row_says_of_an_effect() -> None:
    """specs/operations.md (claim, expire): the unanswered-call exception is for admitted and running Operations.

    One awaiting approval has never been claimed, so no decision issued a call for it; a row that says one is
    unanswered (edited, or written by older code) still ends approval_expired past the deadline, by a claim or
    the sweep, since the machine has no outcome_unknown from that state and no Attempt may start.
    """
    op = attrs.evolve(_approval_op(), effect_class=o.EffectClass.EXTERNAL, effect_id="op-1/effect",
                      effect_unsettled_since=1)
    for outcome in (o.claim(op, o.ClaimRequest("w1", LEASE), op.deadline), o.expire(op, op.deadline, "sweeper")):
        assert isinstance(outcome, o.Decision), outcome
        assert outcome.operation.outcome is o.TerminalOutcome.APPROVAL_EXPIRED
        assert outcome.attempts == () and outcome.credential is None
