"""The operations people and systems call: run, publish, decide, cancel, quarantine, reconcile.

The workflow execution contract (seed 000: Cancellation; request_approval;
wait_for_event; Recovery and reconciliation extension).  Rules of this
module:

- Every operation names the principal who asks, and asks the
  AuthorityPolicy about *that* principal before anything else; the answer
  goes to the kernel, which refuses without it.  Nothing a client sends
  chooses a Business, a principal or a state.
- Each operation is one store transaction.  Settling a Command
  (:func:`reconcile`) and resuming (:func:`resume`) are separate operations,
  each separately authorized: the proof a resume needs is derived by the
  kernel from what the store holds, never asserted here.  A refused
  operation writes nothing.
- Bad input raises :class:`OperationError` with a stable code and a message
  naming the field, before anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import attrs

from fencekeeper.kernel import approvals, attempts, recovery
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.common import shown
from fencekeeper.kernel.definition import Definition, LocalCommandNode
from fencekeeper.kernel.events import Event, EventError
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import AttemptEvent, AttemptState, ExecutionState
from fencekeeper.kernel.text import problem as text_problem

from .ports import (
    APPROVAL_DECIDE,
    DEFINITION_REGISTER,
    EVENT_PUBLISH,
    WORKFLOW_CANCEL,
    WORKFLOW_RECONCILE,
    WORKFLOW_RUN,
    AuthorityPolicy,
    CommandHandler,
    ask,
)
from .store import ExecutionView, PublishResult, StoreError, TransactionalStore


class OperationError(Exception):
    """A request that cannot be made as given; ``code`` is stable, the message names the field."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def register(
    store: TransactionalStore, definition: Definition, business_id: str, principal_id: str, policy: AuthorityPolicy
) -> bool:
    """Register a definition revision; True if new, False if the identical revision was already there."""
    if not isinstance(definition, Definition):
        # A mapping or text failed deep in the store, on an AttributeError naming no field.
        raise OperationError(
            "invalid_argument",
            f"definition: must be a Definition (fencekeeper.kernel.definition: parse_definition, "
            f"definition_from_mapping), not {type(definition).__name__}",
        )
    authority = ask(policy, principal_id, business_id, DEFINITION_REGISTER)
    return store.register_definition(definition, business_id, authority)


def run(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business_id: str,
    principal_id: str,
    definition_id: str,
    input: Mapping[str, Any],
    revision: int | None = None,
    execution_id: str | None = None,
) -> p.Outcome:
    """Admit an execution pinned to a registered definition revision (the latest unless given).

    One transaction (``TransactionalStore.admit_run``): the definition's
    registration is checked, and the revision pinned, in the admission's
    own decision.  Bad input raises inside it, and nothing is written.
    """
    if revision is not None and (not isinstance(revision, int) or isinstance(revision, bool) or revision < 1):
        # A string was a TypeError from inside the store's definition lookup.
        raise OperationError("invalid_argument", f"revision: must be a positive int, got {shown(revision)}")
    execution_id = execution_id or f"x-{uuid.uuid4().hex[:12]}"

    def make(definition: Definition) -> tuple[p.AdmitRequest, list[Evidence]]:
        try:
            record = i.input_evidence(execution_id, definition, principal_id, input)
        except i.InputError as exc:
            raise OperationError(exc.code, str(exc)) from None
        authority = ask(policy, principal_id, business_id, WORKFLOW_RUN, ((definition_id, definition.revision),))
        request = p.AdmitRequest(
            execution_id, business_id, definition.definition_id, definition.revision, definition.start, authority
        )
        return request, [record]

    outcome = store.admit_run(execution_id, business_id, definition_id, revision, make)
    if outcome is None:
        which = f"revision {revision} of " if revision is not None else ""
        raise OperationError("definition_not_found", f"definition: no {which}{shown(definition_id)} in {business_id!r}")
    return outcome


def publish(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business_id: str,
    principal_id: str,
    event_type: str,
    correlation: Mapping[str, object],
    payload: Mapping[str, Any] | None = None,
    event_id: str | None = None,
) -> PublishResult:
    """Commit an Event and wake every waiter it matches exactly."""
    try:
        event = Event.build(event_id or f"ev-{uuid.uuid4().hex[:12]}", business_id, event_type, correlation, payload)
    except EventError as exc:
        raise OperationError(EventError.code, str(exc)) from None
    return store.publish_event(event, ask(policy, principal_id, business_id, EVENT_PUBLISH))


def approval_request(store: TransactionalStore, execution_id: str) -> approvals.ApprovalRequest | None:
    """The newest approval request of an execution, as a reviewer would be shown it."""
    view = store.read(execution_id)
    if view is None:
        return None
    found = [e for e in view.evidence if e.kind == approvals.APPROVAL_REQUEST]
    return approvals.ApprovalRequest.from_json(found[-1].body) if found else None


def decide(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business_id: str,
    reviewer_id: str,
    request: approvals.ApprovalRequest,
    determination: str,
    decision_id: str | None = None,
    rationale: str = "",
) -> approvals.DecideOutcome | p.Decision:
    """A reviewer's decision on ``request`` as shown to them (its binding is what they decide on)."""
    authority = ask(policy,
        reviewer_id, business_id, APPROVAL_DECIDE, request.binding.targets
    )
    decision = approvals.ApprovalDecision(
        decision_id=decision_id or f"d-{uuid.uuid4().hex[:12]}",
        request_id=request.request_id,
        business_id=business_id,
        reviewer_id=reviewer_id,
        determination=determination,
        binding=request.binding,
        authority=authority,
        rationale=rationale,
    )
    return store.decide_approval(decision)


def cancel(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business_id: str,
    principal_id: str,
    execution_id: str,
    reason: str = "",
) -> p.Outcome:
    """Cancel an eligible or waiting execution (running work is refused).

    ``reason`` is kept in the cancellation's Command evidence, which the
    kernel does not read: it is checked here as the kernel checks a
    recovery's rationale (storable text, at most ``MAX_RATIONALE``
    characters), or ``OperationError("invalid_argument")`` naming it.
    """
    _check_reason("reason", reason)
    view = store.read(execution_id)
    revision = view.execution.revision if view is not None else 1
    authority = ask(policy, principal_id, business_id, WORKFLOW_CANCEL, ((execution_id, revision),))
    # Cancellation is Command-mediated (seed 000, Cancellation): the Command
    # commits with the decision, so a cancelled execution names who cancelled it.
    command = Evidence(
        f"{execution_id}/cancel/r{revision}",
        i.COMMAND,
        {
            "operation": WORKFLOW_CANCEL,
            "principal_id": principal_id,
            "business_id": business_id,
            "targets": [[execution_id, revision]],
            "reason": reason,
        },
        1,
        "succeeded",
    )
    return store.cancel(p.CancelRequest(execution_id, business_id, revision, authority), [command])


LOST_RACE: frozenset[p.RefusalCode] = frozenset(
    {
        p.RefusalCode.EXECUTION_NOT_RUNNING,
        p.RefusalCode.DISPATCH_NOT_CLAIMED,
        p.RefusalCode.LEASE_NOT_EXPIRED,
        p.RefusalCode.STALE_REVISION,
    }
)
"""Refusals of a sweep's quarantine that only mean something else moved the execution first."""


@attrs.frozen
class Sweep:
    """What one quarantine sweep did, execution by execution.

    ``outcomes``: the kernel's answer for every execution this sweep decided
    on (a Decision it applied, an ``Unchanged`` replay of the same command,
    or a refusal that is a real problem).  ``moved_on``: executions that
    another sweep, or a recovery, moved first (a lost race, not a problem),
    with what was found.  ``locked``: executions whose rows another
    transaction held for longer than the store's ``SWEEP_LOCK_WAIT``
    (a stalled session), skipped untouched; the next sweep takes them.
    """

    outcomes: dict[str, p.Outcome] = attrs.field(factory=dict)
    moved_on: dict[str, str] = attrs.field(factory=dict)
    locked: dict[str, str] = attrs.field(factory=dict)

    @property
    def quarantined(self) -> list[str]:
        """The executions this sweep moved to reconciliation_required."""
        return [x for x, o in self.outcomes.items() if isinstance(o, p.Decision)]

    @property
    def problems(self) -> dict[str, p.Refusal]:
        """The refusals that are real problems (not lost races), by execution."""
        return {x: o for x, o in self.outcomes.items() if isinstance(o, p.Refusal)}


def quarantine_expired(
    store: TransactionalStore, policy: AuthorityPolicy, *, business_id: str, principal_id: str
) -> Sweep:
    """Move every expired running execution of ``business_id`` to reconciliation_required.

    Safe to run from many machines at once, and idempotent: each execution
    is quarantined once, under the command identity ``q-<id>-r<revision>``
    of the revision found expired, so the identical command from another
    sweep is an ``Unchanged`` replay.  An execution another sweep (or a
    recovery) moved first is reported in ``moved_on``, not as a problem.
    Rows another transaction holds are waited for at most ``SWEEP_LOCK_WAIT``
    seconds each, then reported in ``locked``, so a sweep ends after one pass
    over what was expired when it started.
    """
    sweep = Sweep()
    for execution_id in store.expired():
        view = store.read(execution_id)
        if view is None or view.execution.business_id != business_id:
            continue
        execution = view.execution
        if execution.state != ExecutionState.RUNNING:
            # Read from one snapshot: the execution and its attempt moved together.
            sweep.moved_on[execution_id] = f"already {execution.state.value} at revision {execution.revision}"
            continue
        authority = ask(policy, principal_id, business_id, WORKFLOW_RECONCILE, ((execution_id, execution.revision),))
        # The interrupted visit's attempt becomes an explicit review item too:
        # expiry is no proof that its work did or did not happen.
        attempt = _unsettled_attempt(view.evidence)
        evidence = [] if attempt is None else [
            attempts.advance(attempt, AttemptEvent.QUARANTINE_EXPIRED, quarantined_by=principal_id)
        ]
        request = p.RecoveryRequest(
            command_id=f"q-{execution_id}-r{execution.revision}",
            kind=p.RecoveryKind.QUARANTINE_EXPIRED,
            execution_id=execution_id,
            business_id=business_id,
            expected_revision=execution.revision,
            actor_id=principal_id,
            authority=authority,
        )
        try:
            outcome = store.quarantine(request, evidence)
        except StoreError as exc:
            if exc.code != "row_locked":
                raise
            again = store.read(execution_id)
            if again is not None and again.execution.revision != execution.revision:
                # The holder was a decision on this row that committed meanwhile.
                sweep.moved_on[execution_id] = f"moved on to {again.execution.state.value} while locked"
            else:
                sweep.locked[execution_id] = exc.message
            continue
        if isinstance(outcome, p.Refusal) and outcome.code in LOST_RACE:
            sweep.moved_on[execution_id] = f"moved on before this sweep committed [{outcome.code.value}]: {outcome.message}"
            continue
        sweep.outcomes[execution_id] = outcome
    return sweep


@attrs.frozen
class Reconciled:
    """What settling a Command did: the handler's answer and the recovery decision that recorded it."""

    command_id: str | None
    result: i.CommandResult | None
    outcome: p.Outcome


@attrs.frozen
class RecoveryView:
    """What is known about an execution in a review state: what an operator sees before choosing.

    Nothing here is a decision.  ``unresolved`` are Commands that must be
    settled (:func:`reconcile`) before any resume; ``permitted`` are the
    continuations the stored evidence allows a resume to name now.
    """

    execution: p.Execution
    last_error_code: str | None
    unresolved: tuple[i.Command, ...]
    inert_attempts: tuple[str, ...]
    permitted: tuple[str, ...]
    definition_registered: bool


def recovery_view(store: TransactionalStore, *, business_id: str, execution_id: str) -> RecoveryView:
    """Read, never write: the facts a resume or a settlement would be decided on."""
    view = _reviewable(store, business_id, execution_id)
    execution = view.execution
    evidence = view.evidence
    inert = recovery.inert_attempts(evidence)
    commands = [
        i.Command.from_json(item.body)
        for item in evidence
        if item.kind == i.COMMAND and item.object_id in recovery.unresolved_commands(evidence)
    ]
    if execution.state == ExecutionState.SUSPENDED:
        permitted: tuple[str, ...] = () if execution.current_node_id is None else (execution.current_node_id,)
    else:
        permitted = recovery.permitted_continuations(execution, evidence)
    definition = store.load_definition(business_id, execution.definition_id, execution.definition_revision)
    return RecoveryView(
        execution,
        view.dispatch.last_error_code,
        tuple(commands),
        tuple(item.object_id for item in inert),
        permitted if not commands else (),
        definition is not None,
    )


def _reviewable(store: TransactionalStore, business_id: str, execution_id: str) -> ExecutionView:
    view = store.read(execution_id)
    if view is None or view.execution.business_id != business_id:
        raise OperationError("execution_not_found", f"execution_id: no execution {shown(execution_id)} in {business_id!r}")
    if view.execution.state not in (ExecutionState.RECONCILIATION_REQUIRED, ExecutionState.SUSPENDED):
        raise OperationError(
            "not_in_review",
            f"execution_id: {execution_id!r} is {view.execution.state.value}, "
            "not reconciliation_required or suspended",
        )
    return view


def _recovery_request(
    view: ExecutionView, kind: p.RecoveryKind, principal_id: str, authority: p.Authority, **extra: Any
) -> p.RecoveryRequest:
    execution = view.execution
    return p.RecoveryRequest(
        command_id=f"r-{execution.execution_id}-{kind.value}-r{execution.revision}",
        kind=kind,
        execution_id=execution.execution_id,
        business_id=execution.business_id,
        expected_revision=execution.revision,
        actor_id=principal_id,
        authority=authority,
        **extra,
    )


def reconcile(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    handler: CommandHandler,
    *,
    business_id: str,
    principal_id: str,
    execution_id: str,
) -> Reconciled:
    """Settle an execution's unresolved Command by asking what became of it, never by resending it.

    Seed 000, Governed reconciliation decisions, reconcile_command: the
    handler's ``reconcile`` (never ``execute``) is asked; a conclusive answer
    is recorded against the Command and its attempt.  The execution stays in
    reconciliation_required: resuming it is a separate, separately authorized
    decision (:func:`resume`).  An answer that is still unknown records
    nothing and is returned as a ``no_unresolved_command`` refusal.
    """
    view = _reviewable(store, business_id, execution_id)
    execution = view.execution
    authority = ask(policy, principal_id, business_id, WORKFLOW_RECONCILE, ((execution_id, execution.revision),))
    unresolved = recovery.unresolved_commands(view.evidence)
    if not unresolved:
        raise OperationError(
            "no_unresolved_command", f"execution_id: {execution_id!r} has no unresolved Command to reconcile"
        )
    command_item = _find(view.evidence, unresolved[-1])
    assert command_item is not None
    command = i.Command.from_json(command_item.body)
    attempt = _find(view.evidence, command.attempt_id)
    definition = store.load_definition(business_id, execution.definition_id, execution.definition_revision)
    node = None if definition is None or attempt is None else definition.node(str(attempt.body["node_id"]))
    if attempt is None or not isinstance(node, LocalCommandNode):
        raise OperationError(
            "definition_not_found",
            f"the node of Command {command.command_id} is not a local_command of the pinned definition",
        )
    result = handler.reconcile(command)
    if not isinstance(result, i.CommandResult):
        # As the worker takes such an answer from execute: it tells nothing, so the Command is still unknown
        # (an AttributeError from reconcile_command before).
        result = i.CommandResult(
            i.CommandStatus.UNKNOWN, None, f"handler returned {type(result).__name__}, not a CommandResult"
        )
    # An answer no store can keep is no answer: still unknown, and the refusal below says why.
    result = i.storable_result(command, result)
    review: tuple[Evidence, ...] = ()
    if attempt.state == AttemptState.RUNNING.value:
        # Left running by a quarantine decided through the store itself (TransactionalStore.quarantine
        # and recover take the attempt's evidence but need none; the sweep, quarantine_expired, passes
        # it): made here the explicit review item the sweep makes it, and recorded with the settlement,
        # since the attempt machine settles a review item, never a running attempt.
        attempt = attempts.advance(attempt, AttemptEvent.QUARANTINE_EXPIRED, quarantined_by=principal_id)
        review = (attempt,)
    settled = i.reconcile_command(node, attempt, command_item, result, principal_id)
    if settled is None:
        still = p.Refusal(
            p.RefusalCode.NO_UNRESOLVED_COMMAND, f"Command {command.command_id} is still unknown: {result.detail}"
        )
        return Reconciled(command.command_id, result, still)
    outcome = store.recover(
        _recovery_request(
            view, p.RecoveryKind.RECONCILE_COMMAND, principal_id, authority, command_to_reconcile=command.command_id
        ),
        (*review, *settled.evidence),
    )
    return Reconciled(command.command_id, result, outcome)


def resume(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business_id: str,
    principal_id: str,
    execution_id: str,
    at_node: str | None,
    rationale: str,
    input: Mapping[str, Any] | None = None,
) -> p.Outcome:
    """The governed continuation out of a review state: an explicit, authorized operator decision.

    From reconciliation_required this is resume_safe: the kernel derives the
    safe-resume proof from the stored evidence (every Command settled, the
    pinned definition registered, ``at_node`` a continuation the evidence
    permits) and records it with ``rationale`` as the idempotency contract.
    From suspended it is resume_suspended: re-enter the node the visit
    stopped at, after a fix; ``input`` may correct the execution's input,
    recorded as a new revision of it (the original stays in history).
    """
    view = _reviewable(store, business_id, execution_id)
    execution = view.execution
    authority = ask(policy, principal_id, business_id, WORKFLOW_RECONCILE, ((execution_id, execution.revision),))
    suspended = execution.state == ExecutionState.SUSPENDED
    evidence: list[Evidence] = []
    if input is not None:
        if not suspended:
            raise OperationError("invalid_input", "input: only a suspended execution's input may be corrected")
        definition = store.load_definition(business_id, execution.definition_id, execution.definition_revision)
        stored = _find(view.evidence, f"{execution_id}/input")
        if definition is None or stored is None:
            raise OperationError("definition_not_found", f"execution_id: {execution_id!r} has no pinned definition")
        try:
            corrected = i.input_evidence(execution_id, definition, str(stored.body["principal_id"]), input)
        except i.InputError as exc:
            raise OperationError(exc.code, str(exc)) from None
        evidence.append(stored.next("corrected", {"input": corrected.body["input"], "corrected_by": principal_id}))
    kind = p.RecoveryKind.RESUME_SUSPENDED if suspended else p.RecoveryKind.RESUME_SAFE
    return store.recover(
        _recovery_request(view, kind, principal_id, authority, next_node_id=at_node, rationale=rationale), evidence
    )


def fail(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    *,
    business_id: str,
    principal_id: str,
    execution_id: str,
    rationale: str = "",
) -> p.Outcome:
    """End an execution in a review state as failed: an explicit terminal recovery Outcome, nothing replayed."""
    view = _reviewable(store, business_id, execution_id)
    authority = ask(policy,
        principal_id, business_id, WORKFLOW_RECONCILE, ((execution_id, view.execution.revision),)
    )
    return store.recover(_recovery_request(view, p.RecoveryKind.FAIL, principal_id, authority, rationale=rationale))


def _check_reason(field: str, value: object) -> None:
    """A reason a person gives, kept in evidence no kernel decision checks: bounded as the kernel bounds one."""
    if not isinstance(value, str):
        raise OperationError("invalid_argument", f"{field}: must be a string, not {type(value).__name__}")
    unstorable = text_problem(value)
    if unstorable is None and len(value) > p.MAX_RATIONALE:
        unstorable = f"must be at most {p.MAX_RATIONALE} characters, got {len(value)}"
    if unstorable is not None:
        raise OperationError("invalid_argument", f"{field}: {unstorable}")


def _find(evidence: tuple[Evidence, ...], object_id: str) -> Evidence | None:
    return next((e for e in evidence if e.object_id == object_id), None)


def _unsettled_attempt(evidence: tuple[Evidence, ...]) -> Evidence | None:
    """The newest step attempt that is not terminal: the visit the execution stopped in."""
    found = [
        e for e in evidence if e.kind == attempts.STEP_ATTEMPT and e.state not in ("completed", "failed")
    ]
    return found[-1] if found else None


__all__ = [
    "OperationError",
    "Reconciled",
    "RecoveryView",
    "Sweep",
    "approval_request",
    "cancel",
    "decide",
    "fail",
    "publish",
    "quarantine_expired",
    "reconcile",
    "recovery_view",
    "register",
    "resume",
    "run",
]
