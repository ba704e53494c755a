"""The bug zoo: deliberately broken variants of the protocol's decisions.

Each variant reintroduces one mistake that real job systems make (most
often: letting a worker whose lease expired, or was replaced, finish the
work) and names the invariant the model checker must report.  A checker
that passes the real protocol but misses any of these proves nothing, so
``test_bug_zoo.py`` runs every variant and asserts the named invariant is
the one reported.

Rules of this module:

- A variant is the real decision with *one* check removed, built by
  wrapping the real function, never by copying it, so that the zoo cannot
  drift from the protocol it mutates.
- Where the real decision would also ask the store to recheck something in
  its guard (``requires_live_lease``), the variant drops that too: the bug
  is "nobody checks", not "the decision forgot but the store caught it".
  Defence in depth is shown separately by the variant that keeps every
  decision but turns the store's guard off.
- A store that composes decisions (a claim or a step and the holder's next
  decision, in one transaction) can get the composition wrong without any
  decision being wrong; that variant is switched on in the ``Protocol``
  bundle, as the guard is.  Its two mistakes come together because either
  alone is harmless: a second decision planned on the world before the
  first write fails its own guard, and one planned on the written world
  has a guard that holds (``test_bug_zoo.py`` checks both).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import attrs

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel import recovery
from fencekeeper.kernel.machines import DispatchState, ExecutionState
from fencekeeper.kernel.modelcheck import Invariant, Protocol

Decide = Callable[..., p.Outcome]


def _without_live_guard(outcome: p.Outcome) -> p.Outcome:
    if isinstance(outcome, p.Decision):
        return attrs.evolve(outcome, guard=attrs.evolve(outcome.guard, requires_live_lease=False))
    return outcome


def _ignoring_expiry(decide: Decide) -> Decide:
    """The decision as if the lease never expired: it is judged at a moment just before expiry."""

    def variant(execution: p.Execution | None, dispatch: p.Dispatch | None, request: object, now: datetime) -> p.Outcome:
        if dispatch is not None and dispatch.lease_expires_at is not None and now >= dispatch.lease_expires_at:
            outcome = decide(execution, dispatch, request, dispatch.lease_expires_at - timedelta(microseconds=1))
            return _without_live_guard(outcome)
        return decide(execution, dispatch, request, now)

    return variant


def _current_credential(execution: p.Execution | None, dispatch: p.Dispatch | None) -> p.LeaseCredential | None:
    if execution is None or dispatch is None or dispatch.lease_token is None or dispatch.leased_by is None:
        return None
    return p.LeaseCredential(dispatch.leased_by, dispatch.lease_token, execution.fence)


def _release_without_token_check(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.ReleaseRequest, now: datetime
) -> p.Outcome:
    # Whatever credential is presented, the row's own one is checked instead.
    current = _current_credential(execution, dispatch)
    if current is not None:
        request = attrs.evolve(request, credential=current)
    return p.release(execution, dispatch, request, now)


def _finalize_without_token_check(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.FinalizeRequest, now: datetime
) -> p.Outcome:
    current = _current_credential(execution, dispatch)
    if current is not None:
        request = attrs.evolve(
            request, worker_id=current.worker_id, lease_token=current.lease_token, fence=current.fence
        )
    return p.finalize(execution, dispatch, request, now)


def _finalize_sixth_target(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.FinalizeRequest, now: datetime
) -> p.Outcome:
    # "cancelled" accepted as a finalization target: decided as a failure,
    # then written as cancelled.
    if request.target_state != ExecutionState.CANCELLED:
        return p.finalize(execution, dispatch, request, now)
    outcome = p.finalize(execution, dispatch, attrs.evolve(request, target_state=ExecutionState.FAILED), now)
    if not isinstance(outcome, p.Decision) or outcome.execution is None or outcome.dispatch is None:
        return outcome
    return attrs.evolve(
        outcome,
        execution=attrs.evolve(outcome.execution, state=ExecutionState.CANCELLED),
        dispatch=attrs.evolve(outcome.dispatch, dispatch_state=DispatchState.CANCELLED),
    )


def _wake_twice(
    execution: p.Execution | None,
    dispatch: p.Dispatch | None,
    registration: p.WaitRegistration | None,
    request: p.WakeRequest,
    now: datetime,
) -> p.Outcome:
    # The duplicate check is missing: a second delivery records a second wake.
    outcome = p.wake(execution, dispatch, registration, request, now)
    if isinstance(outcome, p.Unchanged) and registration is not None and execution is not None and dispatch is not None:
        return p.Decision(
            guard=p.Guard(
                execution.execution_id,
                execution.revision,
                execution.state,
                dispatch.dispatch_state,
                dispatch.lease_token,
                dispatch.lease_expires_at,
                execution.fence,
            ),
            execution=None,
            dispatch=None,
            evidence=(),
            registration=attrs.evolve(registration, woken_by=request.source_id, wake_reason=request.reason),
        )
    return outcome


def _cancel_running(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.CancelRequest, now: datetime
) -> p.Outcome:
    # Running work is cancelled as if it were eligible, lease and all.
    if execution is None or dispatch is None or execution.state != ExecutionState.RUNNING:
        return p.cancel(execution, dispatch, request, now)
    # The pretended row holds no lease, as an eligible one does (the kernel raises on one that does); the
    # guard then expects the real row's.
    outcome = p.cancel(
        attrs.evolve(execution, state=ExecutionState.ELIGIBLE),
        attrs.evolve(
            dispatch,
            dispatch_state=DispatchState.ELIGIBLE,
            lease_token=None,
            leased_by=None,
            lease_expires_at=None,
        ),
        request,
        now,
    )
    if isinstance(outcome, p.Decision) and outcome.dispatch is not None:
        guard = attrs.evolve(
            outcome.guard,
            expected_state=ExecutionState.RUNNING,
            expected_dispatch_state=DispatchState.CLAIMED,
            expected_lease_token=dispatch.lease_token,
            expected_lease_expires_at=dispatch.lease_expires_at,
        )
        return attrs.evolve(outcome, guard=guard)
    return outcome


def _quarantine_by_holder(
    execution: p.Execution | None,
    dispatch: p.Dispatch | None,
    prior: p.RecoveryRecord | None,
    request: p.RecoveryRequest,
    now: datetime,
    *,
    facts: recovery.RecoveryFacts | None = None,
) -> p.Outcome:
    # The check that the actor is not the lease holder is missing.
    if dispatch is not None and request.actor_id == dispatch.leased_by:
        request = attrs.evolve(request, actor_id="someone-else")
    return recovery.recover(execution, dispatch, prior, request, now, facts=facts)


def _quarantine_before_expiry(
    execution: p.Execution | None,
    dispatch: p.Dispatch | None,
    prior: p.RecoveryRecord | None,
    request: p.RecoveryRequest,
    now: datetime,
    *,
    facts: recovery.RecoveryFacts | None = None,
) -> p.Outcome:
    # The expiry condition is missing: any claimed running execution can be taken.
    if (
        request.kind == p.RecoveryKind.QUARANTINE_EXPIRED
        and dispatch is not None
        and dispatch.lease_expires_at is not None
        and now < dispatch.lease_expires_at
    ):
        return recovery.recover(execution, dispatch, prior, request, dispatch.lease_expires_at, facts=facts)
    return recovery.recover(execution, dispatch, prior, request, now, facts=facts)


def _recovery_forgets_identity(
    execution: p.Execution | None,
    dispatch: p.Dispatch | None,
    prior: p.RecoveryRecord | None,
    request: p.RecoveryRequest,
    now: datetime,
    *,
    facts: recovery.RecoveryFacts | None = None,
) -> p.Outcome:
    # The command identity is not looked up: a reused identity decides again.
    return recovery.recover(execution, dispatch, None, request, now, facts=facts)


def _resume_without_proof(
    execution: p.Execution | None,
    dispatch: p.Dispatch | None,
    prior: p.RecoveryRecord | None,
    request: p.RecoveryRequest,
    now: datetime,
    *,
    facts: recovery.RecoveryFacts | None = None,
) -> p.Outcome:
    # The store's evidence is not consulted: only the definition is, so an
    # unknown Command is taken as settled.
    if facts is not None and request.kind == p.RecoveryKind.RESUME_SAFE:
        facts = recovery.RecoveryFacts((), facts.definition, facts.submitted)
    return recovery.recover(execution, dispatch, prior, request, now, facts=facts)


def _suspended_dead_end(
    execution: p.Execution | None,
    dispatch: p.Dispatch | None,
    prior: p.RecoveryRecord | None,
    request: p.RecoveryRequest,
    now: datetime,
    *,
    facts: recovery.RecoveryFacts | None = None,
) -> p.Outcome:
    # As the seed's current implementation: 'suspended | none'.
    if execution is not None and execution.state == ExecutionState.SUSPENDED:
        return p.Refusal(p.RefusalCode.NOT_IN_RECONCILIATION, "suspended has no governed continuation")
    return recovery.recover(execution, dispatch, prior, request, now, facts=facts)


def _waiting_without_registration(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.FinalizeRequest, now: datetime
) -> p.Outcome:
    # The wait registration is "committed later", so a waiter can exist without one.
    outcome = p.finalize(execution, dispatch, request, now)
    if isinstance(outcome, p.Decision) and outcome.registration is not None:
        return attrs.evolve(outcome, registration=None)
    return outcome


def _release_keeps_lease(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.ReleaseRequest, now: datetime
) -> p.Outcome:
    # The row goes back to eligible but keeps its lease fields.
    outcome = p.release(execution, dispatch, request, now)
    if isinstance(outcome, p.Decision) and outcome.dispatch is not None and dispatch is not None:
        kept = attrs.evolve(
            outcome.dispatch,
            lease_token=dispatch.lease_token,
            leased_by=dispatch.leased_by,
            lease_expires_at=dispatch.lease_expires_at,
        )
        return attrs.evolve(outcome, dispatch=kept)
    return outcome


def _cancel_forgets_dispatch(
    execution: p.Execution | None, dispatch: p.Dispatch | None, request: p.CancelRequest, now: datetime
) -> p.Outcome:
    # Only the execution is written; the dispatch row is left as it was.
    outcome = p.cancel(execution, dispatch, request, now)
    if isinstance(outcome, p.Decision):
        return attrs.evolve(outcome, dispatch=None)
    return outcome


@attrs.frozen
class Variant:
    name: str
    description: str
    protocol: Protocol
    breaks: Invariant


ZOO: tuple[Variant, ...] = (
    Variant(
        "finalize-without-expiry-check",
        "finalize accepts a lease past its expiry (and does not ask the store to recheck)",
        Protocol(finalize=_ignoring_expiry(p.finalize)),
        Invariant.FENCED_WRITES,
    ),
    Variant(
        "renew-after-expiry",
        "renew extends a lease that has already expired",
        Protocol(renew=_ignoring_expiry(p.renew)),
        Invariant.FENCED_WRITES,
    ),
    Variant(
        "release-without-token-check",
        "release checks the row's own token instead of the presented one",
        Protocol(release=_release_without_token_check),
        Invariant.FENCED_WRITES,
    ),
    Variant(
        "finalize-without-token-check",
        "finalize checks the row's own token, worker and fence instead of the presented ones",
        Protocol(finalize=_finalize_without_token_check),
        Invariant.FENCED_WRITES,
    ),
    Variant(
        "wake-twice",
        "a duplicate delivery records a second wake of the same registration",
        Protocol(wake=_wake_twice),
        Invariant.ONE_WAKE,
    ),
    Variant(
        "cancel-running",
        "cancellation takes running work away from its lease holder",
        Protocol(cancel=_cancel_running),
        Invariant.CANCEL_NOT_RUNNING,
    ),
    Variant(
        "quarantine-by-expired-worker",
        "the worker whose lease expired quarantines its own execution",
        Protocol(recover=_quarantine_by_holder),
        Invariant.QUARANTINE_EXPIRED_ONLY,
    ),
    Variant(
        "quarantine-before-expiry",
        "quarantine takes an execution whose lease is still live",
        Protocol(recover=_quarantine_before_expiry),
        Invariant.QUARANTINE_EXPIRED_ONLY,
    ),
    Variant(
        "recovery-reused-identity",
        "a recovery command identity is not looked up, so a reused one decides again",
        Protocol(recover=_recovery_forgets_identity),
        Invariant.RECOVERY_IDEMPOTENT,
    ),
    Variant(
        "resume-without-proof",
        "resume_safe derives its proof without the store's evidence, so an unknown Command passes",
        Protocol(recover=_resume_without_proof),
        Invariant.SAFE_RESUME_PROVEN,
    ),
    Variant(
        "suspended-dead-end",
        "a suspended execution can be neither failed nor resumed, as before its governed continuation existed",
        Protocol(recover=_suspended_dead_end),
        Invariant.GOVERNED_EXIT,
    ),
    Variant(
        "finalize-sixth-target",
        "finalize accepts cancelled as a target",
        Protocol(finalize=_finalize_sixth_target),
        Invariant.FINALIZE_TARGETS,
    ),
    Variant(
        "store-ignores-guard",
        "every decision is right, but the store applies a decision made earlier without its compare-and-set",
        Protocol(apply_guard=False),
        Invariant.CANCEL_NOT_RUNNING,
    ),
    Variant(
        "waiting-without-registration",
        "finalize to waiting commits without its wait registration",
        Protocol(finalize=_waiting_without_registration),
        Invariant.WAITING_REGISTERED,
    ),
    Variant(
        "release-keeps-lease",
        "release makes the row eligible but leaves the lease fields set",
        Protocol(release=_release_keeps_lease),
        Invariant.LEASE_IFF_CLAIMED,
    ),
    Variant(
        "cancel-forgets-dispatch",
        "cancellation writes the execution but not its dispatch row",
        Protocol(cancel=_cancel_forgets_dispatch),
        Invariant.AGREE,
    ),
    Variant(
        "composed-on-stale-world",
        "a composed transaction decides its second decision on the world before the first write and checks "
        "only the first guard, so the second overwrites the first (a lost step)",
        Protocol(compose=True, compose_plans_on_written=False, compose_guards_each=False),
        Invariant.REVISION_PLUS_ONE,
    ),
    Variant(
        "guard-without-expiry",
        "finalize is right when decided, but its guard does not ask the store to recheck expiry at commit",
        Protocol(finalize=lambda *args: _without_live_guard(p.finalize(*args))),
        Invariant.FENCED_WRITES,
    ),
)
