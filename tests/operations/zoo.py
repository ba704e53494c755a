"""The operation bug zoo: broken variants of the operation decisions, each naming the invariant it breaks.

Each variant reintroduces one mistake real job systems make: finishing the
work of a replaced attempt, re-using an approval for every retry, letting an
effect commit after cancellation, admitting one request twice, answering a
revoked principal's resubmission with its Operation, calling a
provider again after a lost reply, giving up on an effect the provider
said it did not apply, starting an effect after the overall deadline (an
atomic commit, an external intent), ending an Operation whose issued call
was never answered as a missed deadline, a limit of Attempts or a failure,
or refusing a claim of an Operation the store
finds due (a grace after an owner's lease expired).  A checker
that passes the real decisions but misses any of these proves nothing, so
``test_model_check.py`` runs every variant and asserts the named invariant
is the one reported.

Rules: a variant wraps the real decision and removes *one* check (never a
copy of it), so the zoo cannot drift from what it mutates; where the real
decision also asks the store to recheck something in its guard, the variant
drops that too (the bug is "nobody checks").
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.machines import OperationState
from fencekeeper.kernel.opsmodel import TICK, Invariant, OpsProtocol

Decide = Callable[..., o.Outcome]


@attrs.frozen
class Variant:
    name: str
    description: str
    breaks: Invariant
    protocol: OpsProtocol


def _claim_leaving_old_attempt_running(op: o.Operation | None, request: o.ClaimRequest, now: datetime) -> o.Outcome:
    outcome = o.claim(op, request, now)
    if isinstance(outcome, o.Decision):
        kept = tuple(a for a in outcome.attempts if a.state is not o.AttemptState.ABANDONED)
        return attrs.evolve(outcome, attempts=kept)
    return outcome


def _as_current_owner(decide: Decide) -> Decide:
    """The decision judged as if the presented credential were the current owner's: no fence, no worker check."""

    def variant(op: o.Operation | None, request: object, now: datetime) -> o.Outcome:
        if op is not None and op.owner is not None and hasattr(request, "credential"):
            request = attrs.evolve(request, credential=o.Credential(op.operation_id, op.owner, op.fence))
        return decide(op, request, now)

    return variant


def _claim_consuming_every_time(op: o.Operation | None, request: o.ClaimRequest, now: datetime) -> o.Outcome:
    outcome = o.claim(op, request, now)
    if isinstance(outcome, o.Decision) and outcome.credential is not None and outcome.operation.approval is not None:
        approval = attrs.evolve(outcome.operation.approval, consumed_by=outcome.credential.fence)
        return attrs.evolve(outcome, operation=attrs.evolve(outcome.operation, approval=approval))
    return outcome


def _claim_with_a_grace_after_expiry(op: o.Operation | None, request: o.ClaimRequest, now: datetime) -> o.Outcome:
    """Replaces an expired owner only a tick after its lease ran out ("it may just be late")."""
    if (
        op is not None
        and op.state is OperationState.RUNNING
        and op.lease_expires_at is not None
        and now < op.lease_expires_at + TICK
    ):
        return o.Refusal(o.RefusalCode.NOT_ELIGIBLE, f"the owner's lease expired at {op.lease_expires_at}; grace")
    return o.claim(op, request, now)


def _complete_on_cancelled(op: o.Operation | None, request: o.CompleteRequest, now: datetime) -> o.Outcome:
    """Finalizes 'whenever the row is still owned by me', ignoring that cancellation ended it."""
    if op is not None and op.state is OperationState.CANCELLED and op.fence == request.credential.fence:
        running = attrs.evolve(
            op,
            state=OperationState.RUNNING,
            owner=request.credential.worker_id,
            lease_expires_at=now + (op.deadline - op.admitted_at),
            attempt_started_at=now,
            outcome=None,  # as a running row holds it: the bug is in the decision, not in the value
            error_code=None,
        )
        outcome = o.complete(running, request, now)
        if isinstance(outcome, o.Decision):
            return attrs.evolve(outcome, guard=attrs.evolve(outcome.guard, live_until=None))
        return outcome
    return o.complete(op, request, now)


def _cancel_anything(op: o.Operation | None, request: o.CancelRequest, now: datetime) -> o.Outcome:
    """Cancels even a finished operation, as if terminal states were not final."""
    if op is not None and op.state in (OperationState.SUCCEEDED, OperationState.FAILED):
        pretend = attrs.evolve(op, state=OperationState.ADMITTED, outcome=None, error_code=None)
        outcome = o.cancel(pretend, request, now)
        if isinstance(outcome, o.Decision):
            return attrs.evolve(outcome, transition=attrs.evolve(outcome.transition, from_state=op.state))
        return outcome
    return o.cancel(op, request, now)


def _submit_without_identity_guard(existing: o.Operation | None, request: o.SubmitRequest, now: datetime) -> o.Outcome:
    outcome = o.submit(existing, request, now)
    if isinstance(outcome, o.Decision):
        return attrs.evolve(outcome, guard=attrs.evolve(outcome.guard, identity=None, expected_holder=None))
    return outcome


def _submit_authorizing_only_new_identities(
    existing: o.Operation | None, request: o.SubmitRequest, now: datetime
) -> o.Outcome:
    """The authority judged only when the identity names no Operation: a stored one answers whoever asks for it."""
    if existing is not None and (now < existing.retain_until or existing.outcome is None):
        request = attrs.evolve(request, authority=attrs.evolve(request.authority, granted=True))
    return o.submit(existing, request, now)


def _heartbeat_ignoring_expiry(op: o.Operation | None, request: o.HeartbeatRequest, now: datetime) -> o.Outcome:
    if op is not None and op.lease_expires_at is not None and now >= op.lease_expires_at:
        pretend = attrs.evolve(op, lease_expires_at=now + (op.lease_expires_at - op.admitted_at))
        outcome = o.heartbeat(pretend, request, now)
        if isinstance(outcome, o.Decision):
            return attrs.evolve(outcome, guard=attrs.evolve(outcome.guard, live_until=None))
        return outcome
    return o.heartbeat(op, request, now)


def _ignoring_the_deadline(decide: Decide) -> Decide:
    """The decision judged as if the overall deadline lay far ahead, in the decision and in its commit's guard."""

    def variant(op: o.Operation | None, request: object, now: datetime) -> o.Outcome:
        if op is None:
            return decide(op, request, now)
        outcome = decide(attrs.evolve(op, deadline=op.deadline + 1000 * TICK), request, now)
        if isinstance(outcome, o.Decision):
            written = attrs.evolve(outcome.operation, deadline=op.deadline)
            guard = attrs.evolve(outcome.guard, live_until=op.lease_expires_at)
            return attrs.evolve(outcome, operation=written, guard=guard)
        return outcome

    return variant


def _ignoring_an_unanswered_call(decide: Decide) -> Decide:
    """The decision judged as if every issue of the effect had been answered; what it writes keeps the record."""

    def variant(op: o.Operation | None, request: object, now: datetime) -> o.Outcome:
        if op is None or op.effect_unsettled_since is None:
            return decide(op, request, now)
        outcome = decide(attrs.evolve(op, effect_unsettled_since=None), request, now)
        if isinstance(outcome, o.Decision) and outcome.operation.effect_id is not None:
            written = attrs.evolve(outcome.operation, effect_unsettled_since=op.effect_unsettled_since)
            return attrs.evolve(outcome, operation=written)
        return outcome

    return variant


def _plan_ignoring_answers(op: o.Operation) -> o.EffectPlan:
    # Any recorded intent counts as unanswered, even one the provider answered "not applied".
    return o.effect_plan(attrs.evolve(op, effect_unsettled_since=0) if op.effect_id is not None else op)


def _plan_ignoring_ambiguity(op: o.Operation) -> o.EffectPlan:
    return o.effect_plan(attrs.evolve(op, effect_unsettled_since=None))


ZOO: tuple[Variant, ...] = (
    Variant(
        "reclaim-without-abandoning",
        "a replacement claim leaves the expired attempt running beside the new one",
        Invariant.ONE_OWNER,
        OpsProtocol(claim=_claim_leaving_old_attempt_running),
    ),
    Variant(
        "zombie-completes",
        "completion checks neither the fence nor the worker: a replaced owner finishes the replacement's work",
        Invariant.FENCED_WRITES,
        OpsProtocol(complete=_as_current_owner(o.complete)),
    ),
    Variant(
        "zombie-retries",
        "a replaced owner's failure report is taken as the current attempt's and schedules a retry",
        Invariant.FENCED_WRITES,
        OpsProtocol(fail=_as_current_owner(o.fail)),
    ),
    Variant(
        "heartbeat-after-expiry",
        "an owner whose lease expired extends it anyway",
        Invariant.FENCED_WRITES,
        OpsProtocol(heartbeat=_heartbeat_ignoring_expiry),
    ),
    Variant(
        "approval-per-attempt",
        "every claim consumes the approval again instead of once per operation",
        Invariant.APPROVAL_ONCE,
        OpsProtocol(claim=_claim_consuming_every_time),
    ),
    Variant(
        "effect-after-cancel",
        "the effect commits while the operation row says cancelled",
        Invariant.CANCEL_OR_EFFECT,
        OpsProtocol(complete=_complete_on_cancelled),
    ),
    Variant(
        "cancel-rewrites-terminal",
        "cancellation rewrites an operation that already ended",
        Invariant.ONE_TERMINAL,
        OpsProtocol(cancel=_cancel_anything),
    ),
    Variant(
        "submit-without-identity-guard",
        "admission checks the identity when it decides but not when it commits",
        Invariant.ONE_OPERATION,
        OpsProtocol(submit=_submit_without_identity_guard),
    ),
    Variant(
        "resubmission-without-authority",
        "an identical resubmission is answered with the stored Operation although the principal is no longer "
        "authorized: the identity's stored provenance taken for permission",
        Invariant.AUTHORIZED_ANSWER,
        OpsProtocol(submit=_submit_authorizing_only_new_identities),
    ),
    Variant(
        "unknown-after-a-declined-call",
        "a retry treats any earlier intent as ambiguous and ends external_outcome_unknown, even after the "
        "provider's recorded answer that the effect was not applied",
        Invariant.UNKNOWN_ONLY_IF_AMBIGUOUS,
        OpsProtocol(effect_plan=_plan_ignoring_answers),
    ),
    Variant(
        "reclaim-after-a-grace",
        "a claim waits a grace tick after an owner's lease expired, while a store finds the Operation due at the "
        "expiry: the due row is refused, and stays first in its tenant's queue",
        Invariant.DUE_CLAIMED,
        OpsProtocol(claim=_claim_with_a_grace_after_expiry),
    ),
    Variant(
        "atomic-commit-after-the-deadline",
        "an owner whose lease outlives the deadline commits its atomic action's writes after it",
        Invariant.NO_EFFECT_AFTER_DEADLINE,
        OpsProtocol(complete=_ignoring_the_deadline(o.complete)),
    ),
    Variant(
        "intent-after-the-deadline",
        "an owner whose lease outlives the deadline records an external effect's intent after it, and may call",
        Invariant.NO_EFFECT_AFTER_DEADLINE,
        OpsProtocol(record_intent=_ignoring_the_deadline(o.record_intent)),
    ),
    Variant(
        "deadline-ends-an-unanswered-call",
        "a claim past the deadline ends the Operation deadline_exceeded although an issued call was never "
        "answered: no one asks the provider, and the record says nothing happened while the call may have been "
        "applied",
        Invariant.UNANSWERED_NOT_DEADLINE,
        OpsProtocol(claim=_ignoring_an_unanswered_call(o.claim)),
    ),
    Variant(
        "attempts-end-an-unanswered-call",
        "a replacement that finds every Attempt used ends the Operation max_attempts_exceeded although an issued "
        "call was never answered: the record says a limit was hit while the call may have been applied",
        Invariant.UNANSWERED_NOT_FAILED,
        OpsProtocol(claim=_ignoring_an_unanswered_call(o.claim)),
    ),
    Variant(
        "failure-ends-an-unanswered-call",
        "a denial, a failure that is not retryable or the last Attempt's failure ends the Operation by its own name "
        "although an issued call was never answered",
        Invariant.UNANSWERED_NOT_FAILED,
        OpsProtocol(fail=_ignoring_an_unanswered_call(o.fail)),
    ),
    Variant(
        "misbound-approval-ends-an-unanswered-call",
        "a claim that finds an approval an earlier release consumed, which authorizes nothing now, ends the "
        "Operation approval_misbound although that release's Attempt issued a call never answered",
        Invariant.UNANSWERED_NOT_FAILED,
        OpsProtocol(claim=_ignoring_an_unanswered_call(o.claim)),
    ),
    Variant(
        "resend-after-a-lost-reply",
        "a retry calls a provider that can neither deduplicate nor be asked while an earlier call is unanswered",
        Invariant.NO_BLIND_RESEND,
        OpsProtocol(effect_plan=_plan_ignoring_ambiguity),
    ),
)
