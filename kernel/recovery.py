"""Governed recovery, as pure decisions: quarantine, fail, reconcile a Command, resume.

The workflow execution contract (seed 000: Recovery and reconciliation extension:
Recovery Operation; Expired-lease quarantine; Governed reconciliation
decisions; Safe-resume proof).  Every decision here is one workflow_reconcile
command, made by an authorized principal, never by a worker.

Rules of this module:

- Each rule is its own function, small enough to read on one screen;
  :func:`recover` only validates the request, answers a repeated command
  from its stored result, and hands over to the rule for its kind.
- Nothing a caller *asserts* is proof.  The safe-resume proof and every
  "this Command is unresolved" fact are derived here from
  :class:`RecoveryFacts`: the execution's evidence as the store holds it,
  read in the decision's own transaction, and the pinned definition.  The
  caller contributes only what only it can know -- what the CommandHandler
  answered, and the operator's explicit choice of continuation with its
  reason -- and both are recorded with the decision.
- A resume never defaults to the current node: ``current_node_id`` 'is not
  proof of safety by itself'.  The operator names the continuation, and it
  must be one the evidence permits (:func:`permitted_continuations`).
- reconcile_command and the resume that may follow are two decisions, two
  transactions, each separately authorized: 'The Workflow remains in
  reconciliation until the outcome is conclusive and a separate governed
  continuation is committed.'
- suspended is left only by ``fail`` or ``resume_suspended``: the governed
  continuation this project defines where the seed leaves one to be defined
  (specs/protocol.md, Leaving suspended).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Final

import attrs

from . import attempts
from .common import shown
from .definition import Definition
from .evidence import Evidence
from .machines import AttemptEvent, AttemptState, DispatchState, ExecutionEvent, ExecutionState
from .protocol import (
    MAX_RATIONALE,
    STEP_LIMIT,
    Decision,
    Dispatch,
    Execution,
    Outcome,
    RecoveryKind,
    RecoveryRecord,
    RecoveryRequest,
    Refusal,
    RefusalCode,
    SafeResumeEvidence,
    TransitionRecord,
    Unchanged,
    UnchangedCode,
    _check_authority,
    _check_authorized,
    _check_business,
    _check_id,
    _check_pair,
    _check_request,
    _check_revision,
    _check_revision_current,
    _check_rows,
    _check_text,
    _check_utc,
    _first,
    _guard,
    _Invalid,
    _invalid,
    _iso,
    _move,
    _refuse,
    _snapshot_count,
    _snapshot_type,
    _SnapshotValueError,
)

COMMAND_KIND: Final = "Command"
"""The evidence kind of a Command envelope (``interpreter.COMMAND``)."""
UNSETTLED_COMMAND_STATES: Final = frozenset({"issued", "unknown"})
"""A Command in one of these states may have been applied, or may still be: it must be reconciled."""
STEP_LIMIT_CODE: Final = "step_limit"


@attrs.frozen
class RecoveryFacts:
    """What the store holds, read in the recovery's own transaction.

    ``evidence`` is the current revision of every evidence object of the
    execution, in creation order; ``definition`` the pinned definition
    revision, or None when it is not registered; ``submitted`` the evidence
    revisions the caller asks to commit with the decision (a reconciled
    Command's settlement), so that the decision can check what it records.
    """

    evidence: tuple[Evidence, ...] = ()
    definition: Definition | None = None
    submitted: tuple[Evidence, ...] = ()


# --- what the evidence says -------------------------------------------------------------


def _commands(evidence: Sequence[Evidence]) -> dict[str, Evidence]:
    return {item.object_id: item for item in evidence if item.kind == COMMAND_KIND}


def _attempts(evidence: Sequence[Evidence]) -> list[Evidence]:
    return [item for item in evidence if item.kind == attempts.STEP_ATTEMPT]


def unresolved_commands(evidence: Sequence[Evidence]) -> list[str]:
    """Commands that may have been applied, or may still be: issued or unknown, never settled."""
    return [cid for cid, item in _commands(evidence).items() if item.state in UNSETTLED_COMMAND_STATES]


def inert_attempts(evidence: Sequence[Evidence]) -> list[Evidence]:
    """Unsettled local_command attempts that provably did no work: no Command of theirs exists.

    A Command is committed under the lease *before* the handler is called
    (seed 000, local_command: 'Stable Command identity must exist before
    invocation'), so an attempt without one never reached the handler.
    """
    commands = _commands(evidence)
    return [
        item
        for item in _attempts(evidence)
        if item.state in (AttemptState.PENDING.value, AttemptState.UNKNOWN.value,
                          AttemptState.RECONCILIATION_REQUIRED.value)
        and f"{item.object_id}/command" not in commands
        and "command_id" not in item.body
    ]


def _settle_inert(attempt: Evidence, principal_id: str) -> Evidence:
    detail = "no Command was issued by this visit; settled as not applied by governed recovery"
    event = AttemptEvent.REJECT if attempt.state == AttemptState.PENDING.value else AttemptEvent.RECONCILE_NOT_APPLIED
    return attempts.advance(attempt, event, detail=detail, reconciled_by=principal_id)


def _unexplained(evidence: Sequence[Evidence], inert: Sequence[Evidence]) -> list[str]:
    """Unsettled local_command attempts that are not inert: their Command's fate is still open."""
    inert_ids = {item.object_id for item in inert}
    return [
        item.object_id
        for item in _attempts(evidence)
        if item.body.get("node_kind") == "local_command"
        and item.state not in (AttemptState.COMPLETED.value, AttemptState.FAILED.value)
        and item.object_id not in inert_ids
    ]


def permitted_continuations(execution: Execution, evidence: Sequence[Evidence]) -> tuple[str, ...]:
    """Where the evidence lets an execution in reconciliation_required resume (seed 000, Safe-resume proof).

    The newest attempt at the current node decides: none, or one settled as
    not applied, permits re-entering the node as a new attempt ('a separately
    identified new Attempt'); a settled attempt permits the continuation it
    recorded; a completed one permits only that, since re-entering would
    repeat applied work.
    """
    node_id = execution.current_node_id
    if node_id is None:
        return ()
    here = [item for item in _attempts(evidence) if item.body.get("node_id") == node_id]
    if not here:
        return (node_id,)
    latest = here[-1]
    recorded = latest.body.get("next_node_id")
    if latest.state == AttemptState.COMPLETED.value:
        return (str(recorded),) if isinstance(recorded, str) else ()
    if latest.state == AttemptState.FAILED.value:
        return tuple(dict.fromkeys([node_id, *([recorded] if isinstance(recorded, str) else [])]))
    return ()


# --- the decision ------------------------------------------------------------------------


def recover(
    execution: Execution | None,
    dispatch: Dispatch | None,
    prior: RecoveryRecord | None,
    request: RecoveryRequest,
    now: datetime,
    *,
    facts: RecoveryFacts | None = None,
) -> Outcome:
    """A governed workflow_reconcile decision of any kind.

    ``prior`` is the stored result of an earlier command with the same
    identity, if any: the identical command returns it (:class:`Unchanged`);
    the same identity with another decision, execution or expected revision
    is a conflict that changes nothing (seed 000, Expired-lease quarantine).
    ``facts`` is required by reconcile_command and both resumes; without it
    they refuse, since nothing else may stand in for the evidence.
    """
    try:
        _validate(request, now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    _check_prior_and_facts(prior, facts)
    _check_facts_belong(execution, facts)
    if prior is not None:
        return _replayed(execution, prior, request)
    refusal = _check_pair(execution, dispatch, request.execution_id)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    return _RULES[request.kind](execution, dispatch, request, now, facts or RecoveryFacts())


def _validate(request: RecoveryRequest, now: datetime) -> None:
    _check_request(request, RecoveryRequest)
    _check_id("command_id", request.command_id)
    if not isinstance(request.kind, RecoveryKind):
        raise _invalid("kind", f"unknown recovery decision {shown(request.kind)}")
    _check_id("execution_id", request.execution_id)
    _check_id("business_id", request.business_id)
    _check_revision("expected_revision", request.expected_revision)
    _check_id("actor_id", request.actor_id)
    _check_authority("authority", request.authority)
    if request.command_to_reconcile is not None:
        _check_id("command_to_reconcile", request.command_to_reconcile)
    resumes = (RecoveryKind.RESUME_SAFE, RecoveryKind.RESUME_SUSPENDED)
    if request.next_node_id is not None:
        _check_id("next_node_id", request.next_node_id)
        if request.kind not in resumes:
            raise _invalid("next_node_id", "only a resume names a continuation")
    if not isinstance(request.rationale, str) or len(request.rationale) > MAX_RATIONALE:
        raise _invalid("rationale", f"must be a string of at most {MAX_RATIONALE} characters")
    # The rationale is kept with the decision's history: no NUL, no lone surrogate (kernel/text.py).
    _check_text("rationale", request.rationale)
    _check_utc("now", now)


def _check_prior_and_facts(prior: object, facts: object) -> None:
    """What the store read besides the rows, checked as protocol._check_rows checks them."""
    if prior is not None:
        _snapshot_type("prior", prior, RecoveryRecord)
        assert isinstance(prior, RecoveryRecord)
        _snapshot_type("prior.kind", prior.kind, RecoveryKind)
        _snapshot_type("prior.command_id", prior.command_id, str)
        _snapshot_type("prior.execution_id", prior.execution_id, str)
        _snapshot_count("prior.expected_revision", prior.expected_revision, 1)
    if facts is not None:
        _snapshot_type("facts", facts, RecoveryFacts)
        assert isinstance(facts, RecoveryFacts)
        for name in ("evidence", "submitted"):
            items = getattr(facts, name)
            _snapshot_type(f"facts.{name}", items, tuple)
            for number, item in enumerate(items):
                _snapshot_type(f"facts.{name}[{number}]", item, Evidence)


def _check_facts_belong(execution: Execution | None, facts: RecoveryFacts | None) -> None:
    """Raises for evidence of another execution among the execution's facts, naming the item.

    The facts are the store's, like the rows.  A resume settles the inert
    attempts it finds there (``Decision.objects``) and reconcile_command
    links the Command it finds: handed another execution's evidence, either
    would write to that execution's objects.  An object that names no
    execution is taken as the store's word.
    """
    if execution is None or facts is None:
        return
    for number, item in enumerate(facts.evidence):
        body = item.body
        owner = body.get("execution_id") if isinstance(body, Mapping) else None
        if isinstance(owner, str) and owner != execution.execution_id:
            raise _SnapshotValueError(
                f"facts.evidence[{number}]: {item.object_id!r} belongs to execution {owner!r}, "
                f"not to execution.execution_id {execution.execution_id!r}"
            )


def _replayed(execution: Execution | None, prior: RecoveryRecord, request: RecoveryRequest) -> Outcome:
    # A stored result is returned only to a caller who may see it.
    refusal = _first(
        _check_business(execution, request.business_id) if execution is not None else None,
        _check_authorized(request.authority),
    )
    if refusal is not None:
        return refusal
    if (prior.kind, prior.execution_id, prior.expected_revision) == (
        request.kind,
        request.execution_id,
        request.expected_revision,
    ):
        return Unchanged(
            UnchangedCode.RECOVERY_REPLAYED,
            f"recovery command {request.command_id!r} already decided {prior.kind.value}",
            prior,
        )
    return _refuse(
        RefusalCode.RECOVERY_CONFLICT,
        f"recovery command {request.command_id!r} already decided {prior.kind.value} for "
        f"{prior.execution_id!r} at revision {prior.expected_revision}",
    )


def _governed(execution: Execution, dispatch: Dispatch, request: RecoveryRequest) -> Refusal | None:
    """Preconditions every decision shares once its source state holds: revision, authority, not the worker."""
    refusal = _first(
        _check_revision_current(execution, request.expected_revision),
        _check_authorized(request.authority),
    )
    if refusal is not None:
        return refusal
    if dispatch.leased_by is not None and request.actor_id == dispatch.leased_by:
        # Seed 000: 'A technical worker identity or expired lease token is
        # not recovery authority' and 'The expired worker cannot perform
        # this transition.'
        return _refuse(
            RefusalCode.WORKER_CANNOT_RECOVER, f"{request.actor_id!r} holds the lease and cannot recover it"
        )
    return None


def _in_review(
    execution: Execution, dispatch: Dispatch, request: RecoveryRequest, *states: ExecutionState
) -> Refusal | None:
    """The source state of a review decision, then the business, then :func:`_governed`."""
    if execution.state not in states or dispatch.dispatch_state.value != execution.state.value:
        wanted = " or ".join(state.value for state in states)
        code = RefusalCode.NOT_SUSPENDED if states == (ExecutionState.SUSPENDED,) else RefusalCode.NOT_IN_RECONCILIATION
        return _refuse(
            code,
            f"execution is {execution.state.value} and dispatch {dispatch.dispatch_state.value}, not {wanted}",
        )
    return _first(_check_business(execution, request.business_id), _governed(execution, dispatch, request))


def _decided(
    execution: Execution,
    dispatch: Dispatch,
    request: RecoveryRequest,
    now: datetime,
    *,
    reason: str,
    objects: tuple[Evidence, ...] = (),
    proof: SafeResumeEvidence | None = None,
    count_step: bool = False,
) -> Decision:
    """The decision's rows: its table move (or, for reconcile_command, a linking revision) and its record."""
    actor = request.actor_id
    text = f"recovery {request.kind.value} by command {request.command_id}" + (f": {reason}" if reason else "")
    if request.kind == RecoveryKind.RECONCILE_COMMAND:
        new_execution, new_dispatch, record = _linking_revision(execution, dispatch, request, now, reason=text, count_step=count_step)
    else:
        resumes = request.kind in (RecoveryKind.RESUME_SAFE, RecoveryKind.RESUME_SUSPENDED)
        new_execution, new_dispatch, record = _move(
            execution,
            dispatch,
            ExecutionEvent(request.kind.value),
            now=now,
            actor=actor,
            reason=text,
            keep_lease=False,
            eligible_at=_resume_eligible_at(dispatch, now) if resumes else None,
            error_code=None if resumes else request.kind.value,
            node_id=request.next_node_id if resumes else None,
        )
    recovery = RecoveryRecord(
        command_id=request.command_id,
        kind=request.kind,
        execution_id=execution.execution_id,
        expected_revision=request.expected_revision,
        resulting_revision=new_execution.revision,
        resulting_state=new_execution.state,
        proof=proof,
    )
    return Decision(
        guard=_guard(execution, dispatch),
        execution=new_execution,
        dispatch=new_dispatch,
        evidence=(record,),
        recovery=recovery,
        objects=objects,
    )


def _resume_eligible_at(dispatch: Dispatch, now: datetime) -> datetime:
    """Recovered work keeps its place: it is queued at the time it last became eligible, not behind the backlog.

    The dispatcher orders by eligible_at (seed 000, Dispatcher Pass).  An
    execution that an operator has just reviewed already waited its turn
    once; putting it behind everything admitted since would make recovery
    take as long as the whole queue.  It is taken as at most now (a store
    clock may have stepped back below it), so it is claimable at once, and
    it never jumps ahead of work that was already waiting before it.
    """
    return min(dispatch.eligible_at, now)


def _linking_revision(
    execution: Execution,
    dispatch: Dispatch,
    request: RecoveryRequest,
    now: datetime,
    *,
    reason: str,
    count_step: bool,
) -> tuple[Execution, Dispatch, TransitionRecord]:
    """reconcile_command: not a state transition; a new revision links the settlement.

    The visit whose Command is settled here counts as one step if its worker
    never committed it (a quarantined visit): a visit counts when it is
    settled, whoever settles it (seed 000, Dispatcher Pass: 'A pass counts one
    durable node visit/step attempt as one step').
    """
    steps = execution.step_count + (1 if count_step else 0)
    new_execution = attrs.evolve(execution, revision=execution.revision + 1, step_count=steps)
    new_dispatch = attrs.evolve(dispatch, step_count=steps)
    record = TransitionRecord(
        execution_id=execution.execution_id,
        event=None,
        from_state=execution.state,
        to_state=execution.state,
        revision=new_execution.revision,
        at=now,
        actor=request.actor_id,
        lease_token=None,
        fence=execution.fence,
        reason=f"{reason}: delegated {request.command_to_reconcile} to CommandHandler::reconcile",
    )
    return new_execution, new_dispatch, record


# --- one function per rule ------------------------------------------------------------------


def _quarantine_expired(
    execution: Execution, dispatch: Dispatch, request: RecoveryRequest, now: datetime, facts: RecoveryFacts
) -> Outcome:
    """Seed 000, Expired-lease quarantine: conditions 1 to 6, in order."""
    if execution.state != ExecutionState.RUNNING:
        return _refuse(RefusalCode.EXECUTION_NOT_RUNNING, f"execution is {execution.state.value}, not running")
    if dispatch.dispatch_state != DispatchState.CLAIMED:
        return _refuse(
            RefusalCode.DISPATCH_NOT_CLAIMED, f"dispatch row is {dispatch.dispatch_state.value}, not claimed"
        )
    refusal = _check_business(execution, request.business_id)
    if refusal is not None:
        return refusal
    if dispatch.lease_expires_at is None or dispatch.lease_expires_at > now:
        return _refuse(
            RefusalCode.LEASE_NOT_EXPIRED,
            f"lease runs until {_iso(dispatch.lease_expires_at)}; now is {_iso(now)}",
        )
    refusal = _governed(execution, dispatch, request)
    if refusal is not None:
        return refusal
    return _decided(execution, dispatch, request, now, reason="")


def _fail(
    execution: Execution, dispatch: Dispatch, request: RecoveryRequest, now: datetime, facts: RecoveryFacts
) -> Outcome:
    """An explicit terminal recovery Outcome, from either review state; nothing is replayed."""
    refusal = _in_review(
        execution, dispatch, request, ExecutionState.RECONCILIATION_REQUIRED, ExecutionState.SUSPENDED
    )
    if refusal is not None:
        return refusal
    return _decided(execution, dispatch, request, now, reason=request.rationale)


def _reconcile_command(
    execution: Execution, dispatch: Dispatch, request: RecoveryRequest, now: datetime, facts: RecoveryFacts
) -> Outcome:
    """Record a conclusive answer about a persisted, unresolved Command; the execution stays in review."""
    refusal = _in_review(execution, dispatch, request, ExecutionState.RECONCILIATION_REQUIRED)
    if refusal is not None:
        return refusal
    command_id = request.command_to_reconcile
    stored = _commands(facts.evidence).get(command_id or "")
    if command_id is None or stored is None or stored.state not in UNSETTLED_COMMAND_STATES:
        found = "names no Command" if command_id is None else (
            f"{command_id!r} is not a Command of this execution" if stored is None
            else f"{command_id!r} is already {stored.state}"
        )
        return Refusal(
            RefusalCode.NO_UNRESOLVED_COMMAND,
            f"reconcile_command needs a persisted, unresolved Command: the request {found}",
            "command_to_reconcile",
        )
    attempt_id = str(stored.body.get("attempt_id", ""))
    settled_command = _newest(facts.submitted, command_id)
    settled_attempt = _newest(facts.submitted, attempt_id)
    if (
        settled_command is None
        or settled_command.state in UNSETTLED_COMMAND_STATES
        or settled_attempt is None
        or settled_attempt.state not in (AttemptState.COMPLETED.value, AttemptState.FAILED.value)
    ):
        return Refusal(
            RefusalCode.NO_UNRESOLVED_COMMAND,
            f"reconcile_command must record a conclusive settlement of {command_id!r} and of its attempt "
            f"{attempt_id!r}; an answer that is still unknown is not recorded",
            "command_to_reconcile",
        )
    before = _newest(facts.evidence, attempt_id)
    # A quarantined visit was never counted: its worker died before the
    # step committed.  Its settlement is where it counts -- up to the bound:
    # no visit starts once 100 steps are processed (seed 000, Dispatcher
    # Pass), so a quarantined one there is the store's facts, not a visit,
    # and the settlement is recorded without a 101st step (INV-STEP-LIMIT).  A quarantine decided
    # without the attempt's evidence (a store's own quarantine takes none) leaves it running: its
    # worker died before the step all the same.
    uncounted = before is not None and before.state in (
        AttemptState.RECONCILIATION_REQUIRED.value,
        AttemptState.RUNNING.value,
    )
    return _decided(
        execution, dispatch, request, now, reason="", count_step=uncounted and execution.step_count < STEP_LIMIT
    )


def _newest(evidence: Sequence[Evidence], object_id: str) -> Evidence | None:
    found = [item for item in evidence if item.object_id == object_id]
    return max(found, key=lambda item: item.revision) if found else None


def _resume_safe(
    execution: Execution, dispatch: Dispatch, request: RecoveryRequest, now: datetime, facts: RecoveryFacts
) -> Outcome:
    """Seed 000, Safe-resume proof: every fact derived from stored evidence, the continuation chosen explicitly."""
    refusal = _in_review(execution, dispatch, request, ExecutionState.RECONCILIATION_REQUIRED)
    if refusal is not None:
        return refusal
    return _resume(execution, dispatch, request, now, facts, permitted=permitted_continuations)


def _resume_suspended(
    execution: Execution, dispatch: Dispatch, request: RecoveryRequest, now: datetime, facts: RecoveryFacts
) -> Outcome:
    """The governed continuation out of suspended: re-enter the node the visit stopped at, after a fix."""
    refusal = _in_review(execution, dispatch, request, ExecutionState.SUSPENDED)
    if refusal is not None:
        return refusal
    if dispatch.last_error_code == STEP_LIMIT_CODE:
        # Seed 000, Dispatcher Pass: a later pass 'must not ... reset the
        # step counter', so a resume would only suspend again at once.
        return Refusal(
            RefusalCode.UNSAFE_RESUME,
            "the execution used its whole step bound (step_limit); resuming cannot continue it, only fail can end it",
            "kind",
        )
    return _resume(
        execution,
        dispatch,
        request,
        now,
        facts,
        permitted=lambda ex, _evidence: () if ex.current_node_id is None else (ex.current_node_id,),
    )


def _resume(
    execution: Execution,
    dispatch: Dispatch,
    request: RecoveryRequest,
    now: datetime,
    facts: RecoveryFacts,
    *,
    permitted: Callable[[Execution, Sequence[Evidence]], tuple[str, ...]],
) -> Outcome:
    """The proof both resumes share; refuses with every fact that does not hold."""
    principal = request.authority.principal_id
    inert = inert_attempts(facts.evidence)
    settled = tuple(_settle_inert(item, principal) for item in inert)
    after = _overlay(facts.evidence, settled)
    unresolved = unresolved_commands(after)
    unexplained = _unexplained(after, ())
    allowed = permitted(execution, after)
    definition = facts.definition
    pinned = definition is not None and (definition.definition_id, definition.revision) == (
        execution.definition_id,
        execution.definition_revision,
    )
    chosen = request.next_node_id
    problems: list[str] = []
    if unresolved or unexplained:
        problems.append(
            "no_unresolved_command: "
            + ", ".join([f"Command {c} is not settled" for c in unresolved] + [f"attempt {a} is not settled"
                                                                             for a in unexplained])
            + " (reconcile it first)"
        )
    if not pinned:
        problems.append(
            f"dependencies_current: definition {execution.definition_id} revision {execution.definition_revision} "
            "is not registered"
        )
    elif chosen is not None and definition is not None and definition.node(chosen) is None:
        problems.append(f"dependencies_current: node {chosen!r} is not in the pinned definition")
    if chosen is None:
        problems.append(
            "continuation_approved: name the continuation explicitly"
            + (f" (the evidence permits {', '.join(allowed)})" if allowed else "")
        )
    elif chosen not in allowed:
        problems.append(
            f"continuation_approved: the evidence does not permit resuming at {chosen!r}"
            + (f" (it permits {', '.join(allowed)})" if allowed else " (it permits no continuation; fail it)")
        )
    if not request.rationale.strip():
        what = "idempotency_contract" if request.kind == RecoveryKind.RESUME_SAFE else "rationale"
        problems.append(f"{what}: say why entering the continuation is safe")
    if problems:
        return Refusal(RefusalCode.UNSAFE_RESUME, "safe-resume proof fails: " + "; ".join(problems), "next_node_id")
    assert chosen is not None
    proof = SafeResumeEvidence(
        no_unresolved_command=True,
        dependencies_current=True,
        continuation_approved=True,
        idempotency_contract=request.rationale,
        continuation=chosen,
        approved_by=principal,
        basis=_basis(after, inert, execution, allowed),
    )
    return _decided(
        execution, dispatch, request, now, reason=f"resumes at {chosen}: {request.rationale}", objects=settled,
        proof=proof,
    )


def _overlay(evidence: Sequence[Evidence], newer: Sequence[Evidence]) -> tuple[Evidence, ...]:
    replaced = {item.object_id: item for item in newer}
    return tuple(replaced.get(item.object_id, item) for item in evidence)


def _basis(
    evidence: Sequence[Evidence], inert: Sequence[Evidence], execution: Execution, allowed: Sequence[str]
) -> tuple[str, ...]:
    commands = _commands(evidence)
    lines = [f"{len(commands)} Command(s), every one settled: " + (
        ", ".join(f"{cid} {item.state}" for cid, item in commands.items()) or "none issued"
    )]
    lines += [f"attempt {item.object_id} issued no Command: settled as not applied" for item in inert]
    lines.append(
        f"definition {execution.definition_id} revision {execution.definition_revision} is registered; "
        f"the evidence permits {', '.join(allowed)}"
    )
    return tuple(lines)


_Rule = Callable[[Execution, Dispatch, RecoveryRequest, datetime, RecoveryFacts], Outcome]
_RULES: Final[Mapping[RecoveryKind, _Rule]] = {
    RecoveryKind.QUARANTINE_EXPIRED: _quarantine_expired,
    RecoveryKind.FAIL: _fail,
    RecoveryKind.RECONCILE_COMMAND: _reconcile_command,
    RecoveryKind.RESUME_SAFE: _resume_safe,
    RecoveryKind.RESUME_SUSPENDED: _resume_suspended,
}

__all__ = [
    "COMMAND_KIND",
    "MAX_RATIONALE",
    "RecoveryFacts",
    "inert_attempts",
    "permitted_continuations",
    "recover",
    "unresolved_commands",
]
