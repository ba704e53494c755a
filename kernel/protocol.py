"""The lease and fencing protocol, as pure decisions.

The workflow execution contract (seed 000: Lease; Fenced Execution Finalization;
Recovery and reconciliation extension) says how a WorkflowExecution and its
workflow_dispatch row move together under a lease.  The durable
operations contract (seed 001: Claims, leases, and fencing) adds the fence
counter: once fence N+1 owns an execution, fence N can no longer heartbeat,
mutate or finalize.

Rules of this module:

- Every function here is a *decision*: it takes immutable snapshots, a
  request and the authoritative time ``now`` (read by the store, once per
  transaction) and returns one of three values, never raising for anything a
  caller can send:

  * :class:`Refusal` -- a stable code, a message naming the field or
    precondition, and no writes;
  * :class:`Unchanged` -- an idempotent repeat (a duplicate wake, a repeated
    recovery command) that says so and writes nothing;
  * :class:`Decision` -- exactly what must be written together (the new
    execution revision, the new dispatch row, the wait registration, the
    recovery record, the evidence) and the compare-and-set :class:`Guard`
    the store must apply atomically.  If the guard does not hold when the
    store applies it, nothing is written and the store re-decides.

- State changes go through the machine tables (``machines.EXECUTION`` and
  ``machines.DISPATCH``); this module decides *whether* an event may happen
  (leases, tokens, fences, revisions, time, authority), never *where* it
  leads.
- The kernel never reads a clock and never makes a token: ``now`` and the
  fresh lease token are arguments.
- Lease ownership is never authority.  Decisions with business consequences
  take an :class:`Authority` fact, the result of a check the caller made
  against current facts, and refuse without it.
- Preconditions are checked in the order the seed lists them, so the first
  failing one names the refusal; malformed input is refused first, naming
  the field, before any precondition is looked at.
- The snapshots are the store's, not the caller's: a row no decision could
  have written (a state of another type, a revision of 0, a naive time) is
  raised as a TypeError or ValueError naming the field (``_check_rows``),
  never refused and never reasoned about; so are two rows no decisions could
  have written together where a decision would write the contradiction on
  (``_explain_contradiction``).  Disagreements the seed lists as
  preconditions (identities, states) are refused, as it lists them.
- A wait registration is open exactly while its execution waits on it.  A
  wake closes it by recording who woke it; every other way out of
  ``waiting`` (cancel, suspend, any route added later) closes it in the
  same decision through :attr:`Decision.closes` (built by
  :func:`_closing`), so that no open registration is ever left for the
  timer and Event paths to find and refuse forever.
- Every write of the execution object is a new revision, exactly one higher.
  A renewal writes only the dispatch row (lease metadata is coordination
  data, not the generic object), so it leaves the revision alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Final

import attrs

from .common import IDENTIFIER, MAX_RATIONALE, duration_problem, identifier_problem, later_problem, shown, utc_problem
from .evidence import Evidence
from .machines import (
    DISPATCH,
    EXECUTION,
    DispatchState,
    ExecutionEvent,
    ExecutionState,
    dispatch_state_of,
)
from .text import problem as text_problem

STEP_LIMIT: Final = 100
"""Seed 000, Dispatcher Pass: 'At 100 processed steps, the future dispatcher must stop.'"""

FINALIZE_TARGETS: Final = (
    ExecutionState.WAITING,
    ExecutionState.SUCCEEDED,
    ExecutionState.FAILED,
    ExecutionState.SUSPENDED,
    ExecutionState.RECONCILIATION_REQUIRED,
)
"""Seed 000, Fenced Execution Finalization: the exact five permitted targets."""

_FINALIZE_EVENT: Final[Mapping[ExecutionState, ExecutionEvent]] = {
    ExecutionState.WAITING: ExecutionEvent.FINALIZE_WAITING,
    ExecutionState.SUCCEEDED: ExecutionEvent.FINALIZE_SUCCEEDED,
    ExecutionState.FAILED: ExecutionEvent.FINALIZE_FAILED,
    ExecutionState.SUSPENDED: ExecutionEvent.FINALIZE_SUSPENDED,
    ExecutionState.RECONCILIATION_REQUIRED: ExecutionEvent.FINALIZE_RECONCILIATION_REQUIRED,
}

_IDENTIFIER = IDENTIFIER


class RefusalCode(enum.Enum):
    """Every reason a decision can refuse.  Values are stable and published in specs/protocol.md."""

    INVALID_REQUEST = "invalid_request"
    ALREADY_EXISTS = "already_exists"
    # The twelve preconditions of finalization, in the seed's order; the
    # other decisions reuse the ones that apply to them.
    EXECUTION_NOT_FOUND = "execution_not_found"
    DISPATCH_NOT_FOUND = "dispatch_not_found"
    IDENTITY_MISMATCH = "identity_mismatch"
    DISPATCH_NOT_CLAIMED = "dispatch_not_claimed"
    EXECUTION_NOT_RUNNING = "execution_not_running"
    LEASE_TOKEN_MISMATCH = "lease_token_mismatch"
    WORKER_MISMATCH = "worker_mismatch"
    LEASE_EXPIRED = "lease_expired"
    BUSINESS_MISMATCH = "business_mismatch"
    STALE_REVISION = "stale_revision"
    NOT_AUTHORIZED = "not_authorized"
    TARGET_NOT_PERMITTED = "target_not_permitted"
    # Fence counter (seed 001): the credential's fence is not the current one.
    STALE_FENCE = "stale_fence"
    # Other decisions.
    NOT_ELIGIBLE = "not_eligible"
    ILLEGAL_TRANSITION = "illegal_transition"
    STEP_LIMIT_REACHED = "step_limit_reached"
    WAIT_REGISTRATION_REQUIRED = "wait_registration_required"
    NOT_WAITING = "not_waiting"
    WAKE_MISMATCH = "wake_mismatch"
    WAKE_NOT_DUE = "wake_not_due"
    CANCEL_RUNNING = "cancel_running"
    LEASE_NOT_EXPIRED = "lease_not_expired"
    WORKER_CANNOT_RECOVER = "worker_cannot_recover"
    NOT_IN_RECONCILIATION = "not_in_reconciliation"
    UNSAFE_RESUME = "unsafe_resume"
    NO_UNRESOLVED_COMMAND = "no_unresolved_command"
    NOT_SUSPENDED = "not_suspended"
    RECOVERY_CONFLICT = "recovery_conflict"
    # Approvals (seed 000: request_approval).
    APPROVAL_NOT_FOUND = "approval_not_found"
    APPROVAL_MISBOUND = "approval_misbound"
    APPROVAL_CLOSED = "approval_closed"
    DECISION_CONFLICT = "decision_conflict"


class UnchangedCode(enum.Enum):
    """Why an idempotent repeat wrote nothing."""

    ALREADY_WOKEN = "already_woken"
    RECOVERY_REPLAYED = "recovery_replayed"
    ALREADY_DECIDED = "already_decided"


# --- snapshots ----------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Execution:
    """One revision of a WorkflowExecution object (seed 000: Persistence, generic object).

    ``fence`` counts claims: the *n*-th claim hands out fence *n*, and only
    a credential carrying the current fence can write (seed 001).  ``wait``
    names the registration a waiting execution waits on.
    """

    execution_id: str
    business_id: str
    state: ExecutionState
    revision: int
    definition_id: str
    definition_revision: int
    current_node_id: str | None
    step_count: int = 0
    fence: int = 0
    wait: WaitKey | None = None


@attrs.frozen(cache_hash=True)
class Dispatch:
    """The workflow_dispatch row, with exactly the seed's fields (seed 000: Persistence)."""

    workflow_execution_id: str
    dispatch_state: DispatchState
    eligible_at: datetime
    lease_token: str | None = None
    leased_by: str | None = None
    lease_expires_at: datetime | None = None
    step_count: int = 0
    last_error_code: str | None = None


@attrs.frozen(cache_hash=True)
class WaitKey:
    """A wait registration is unique per execution, node and attempt (seed 000: wait_for_event)."""

    execution_id: str
    node_id: str
    attempt_id: str


class WakeReason(enum.Enum):
    """What woke a waiter: an Event, an approval Decision, a one-time timer, or its declared timeout."""

    EVENT = "event"
    DECISION = "decision"
    TIMER = "timer"
    TIMEOUT = "timeout"


DETERMINATIONS: Final = ("approved", "rejected")
"""What an approval Decision determines (seed 000: request_approval)."""

WAKE_OUTCOMES: Final = ("approved", "event", "rejected", "timeout", "timer")
"""The outcomes a wait registration may name a continuation for."""


@attrs.frozen(cache_hash=True)
class WaitSpec:
    """What a waiter waits for: an exact Event Type and exact equality predicates, or a UTC time.

    ``correlation`` is a sorted tuple of ``(name, value)`` pairs: finite,
    deterministic, exact (seed 000: wait_for_event).  ``wake_at`` is an
    optional one-time UTC wake; ``timeout`` marks that wake as the declared
    timeout continuation (recorded as a distinct wake reason).
    """

    node_id: str
    attempt_id: str
    event_type: str | None
    correlation: tuple[tuple[str, str], ...] = ()
    wake_at: datetime | None = None
    timeout: bool = False
    wake_after: timedelta | None = None
    """A one-time wake relative to the commit: finalization turns it into
    ``wake_at`` with the store's authoritative time, so no worker's clock
    decides when a timeout fires."""
    continuations: tuple[tuple[str, str], ...] = ()
    """Sorted ``(outcome, node_id)`` pairs committed with the registration, so
    that a wake selects the continuation without consulting anything newer
    (seed 000, request_approval: 'commits ... the selected continuation
    before changing the execution to eligible').  Outcomes are ``event``,
    ``timer``, ``timeout``, ``approved`` and ``rejected``; a wake whose outcome
    has none leaves the execution at the waiting node."""


@attrs.frozen(cache_hash=True)
class WaitRegistration:
    """A committed wait registration; ``woken_by`` is set by the first committed wake.

    ``closed_by`` is set instead when the execution left ``waiting`` by
    another route: the event that moved it (``cancel``, ``suspend``).  A
    closed registration is never due, never matched and never woken.
    """

    key: WaitKey
    business_id: str
    spec: WaitSpec
    woken_by: str | None = None
    wake_reason: WakeReason | None = None
    closed_by: str | None = None

    @property
    def is_open(self) -> bool:
        """Whether the execution still waits on it: neither woken nor closed."""
        return self.woken_by is None and self.closed_by is None


@attrs.frozen(cache_hash=True)
class WaitClosure:
    """A registration a decision closes without a wake: its execution leaves ``waiting`` by ``by``."""

    key: WaitKey
    by: ExecutionEvent


@attrs.frozen
class Authority:
    """The result of an authorization check the caller made against current facts.

    Seed 000, Security: 'A lease token proves only coordination ownership.'
    """

    granted: bool
    principal_id: str
    reason: str = ""


@attrs.frozen(cache_hash=True)
class LeaseCredential:
    """What a worker presents: who it is, its token, and the fence its claim received."""

    worker_id: str
    lease_token: str
    fence: int


@attrs.frozen
class StepRecord:
    """One durable node visit (seed 000, Dispatcher Pass: one visit counts one step).

    ``next_node_id`` is the continuation the visit selected; the execution's
    ``current_node_id`` moves to it in the same commit.  Without one (a
    waiting, terminal or suspended visit) the execution stays at the node.
    """

    node_id: str
    attempt_id: str
    next_node_id: str | None = None


class RecoveryKind(enum.Enum):
    """The governed recovery decisions :func:`~fencekeeper.kernel.recovery.recover` makes (specs/protocol.md, Decisions)."""

    QUARANTINE_EXPIRED = "quarantine_expired"
    FAIL = "fail"
    RESUME_SAFE = "resume_safe"
    RECONCILE_COMMAND = "reconcile_command"
    RESUME_SUSPENDED = "resume_suspended"


@attrs.frozen(cache_hash=True)
class RecoveryRecord:
    """The durable result of one governed recovery command (seed 000: workflow_reconcile).

    Stored by command identity; a repeat of the identical command returns it.
    """

    command_id: str
    kind: RecoveryKind
    execution_id: str
    expected_revision: int
    resulting_revision: int
    resulting_state: ExecutionState
    proof: SafeResumeEvidence | None = None
    """For a resume: the proof the kernel established, recorded with the decision."""


@attrs.frozen(cache_hash=True)
class SafeResumeEvidence:
    """The safe-resume proof of seed 000 (Safe-resume proof), as the kernel established it.

    It is never taken from a caller: ``kernel.recovery`` derives each fact
    from the evidence the store holds (``RecoveryFacts``) and from the
    operator's explicit, authorized choice, and refuses the resume when one
    does not hold.  The record is kept with the recovery decision so that an
    auditor can see what the resume rested on.  ``current_node_id`` and
    ``step_count`` are deliberately absent: the seed says they 'are not proof
    of safety by themselves'.
    """

    no_unresolved_command: bool
    """No Command of the execution is issued or unknown, and no step attempt is left unexplained."""
    dependencies_current: bool
    """The pinned definition revision is registered and holds the continuation node."""
    continuation_approved: bool
    """An authorized operator chose this continuation explicitly, and the evidence permits it."""
    idempotency_contract: str
    """The operator's recorded reason why entering the continuation is safe."""
    continuation: str = ""
    """The node the execution resumes at."""
    approved_by: str = ""
    """The principal whose explicit, authorized decision this was."""
    basis: tuple[str, ...] = ()
    """The evidence each fact rests on, one line each, for inspection."""


# --- results ------------------------------------------------------------------


@attrs.frozen
class Refusal:
    """No writes.  ``field`` names the malformed request field, if that is the reason."""

    code: RefusalCode
    message: str
    field: str | None = None


@attrs.frozen
class Unchanged:
    """An idempotent repeat: nothing is written; ``record`` is the durable result, if any."""

    code: UnchangedCode
    message: str
    record: RecoveryRecord | None = None


@attrs.frozen(cache_hash=True)
class Guard:
    """The compare-and-set the store applies: all of it holds, or nothing is written.

    ``expected_revision`` of 0 means the execution must not exist yet.
    ``expected_lease_token`` and ``expected_lease_expires_at`` of None mean
    the row must hold no lease.  ``requires_live_lease`` asks the store to
    check, with its own authoritative time at commit, that the lease has not
    expired since the decision was made: a decision made while the lease was
    valid must not commit after it expired.
    """

    execution_id: str
    expected_revision: int
    expected_state: ExecutionState | None
    expected_dispatch_state: DispatchState | None
    expected_lease_token: str | None
    expected_lease_expires_at: datetime | None
    expected_fence: int
    requires_live_lease: bool = False

    def holds(self, execution: Execution | None, dispatch: Dispatch | None, now: datetime) -> bool:
        """Whether the store may apply the decision to these rows at ``now`` (the reference semantics).

        Contracts (PEP 316, checked by CrossHair; see tests/contracts).  It
        never accepts half a pair of rows, and accepts no rows only for a
        guard that expects none (rows exist from revision 1).  Its live-lease
        clause is checked through ``_guard``'s contract.

        pre: execution is None or execution.revision >= 1
        post: not __return__ or (execution is None) == (dispatch is None) == (self.expected_revision == 0)
        """
        if execution is None or dispatch is None:
            return self.expected_revision == 0 and execution is None and dispatch is None
        return (
            execution.execution_id == self.execution_id
            and execution.revision == self.expected_revision
            and execution.state == self.expected_state
            and execution.fence == self.expected_fence
            and dispatch.dispatch_state == self.expected_dispatch_state
            and dispatch.lease_token == self.expected_lease_token
            and dispatch.lease_expires_at == self.expected_lease_expires_at
            and (
                not self.requires_live_lease
                or (dispatch.lease_expires_at is not None and now < dispatch.lease_expires_at)
            )
        )


@attrs.frozen(cache_hash=True)
class TransitionRecord:
    """Evidence of one decision: the history line ``fencekeeper inspect`` shows."""

    execution_id: str
    event: ExecutionEvent | None
    from_state: ExecutionState | None
    to_state: ExecutionState
    revision: int
    at: datetime
    actor: str
    lease_token: str | None
    fence: int
    reason: str


@attrs.frozen(cache_hash=True)
class Decision:
    """Everything one decision writes, together, under ``guard``."""

    guard: Guard
    execution: Execution | None
    dispatch: Dispatch | None
    evidence: tuple[TransitionRecord, ...]
    registration: WaitRegistration | None = None
    recovery: RecoveryRecord | None = None
    lease: LeaseCredential | None = None
    """Set by a claim: the credential the claiming worker must present from now on."""
    closes: WaitClosure | None = None
    """The wait registration this decision closes: its execution leaves waiting other than by a wake."""
    objects: tuple[Evidence, ...] = ()
    """Evidence object revisions the decision itself writes (a recovery settles attempts it proved
    inert); the store writes them with the caller's evidence, in the same transaction."""


Outcome = Decision | Refusal | Unchanged


# --- requests -------------------------------------------------------------------


@attrs.frozen
class AdmitRequest:
    """Admit a new execution at its definition's start node (decided by :func:`admit`)."""

    execution_id: str
    business_id: str
    definition_id: str
    definition_revision: int
    start_node_id: str
    authority: Authority


@attrs.frozen
class ClaimRequest:
    """A worker's claim of an eligible execution, with the fresh lease token it will present (:func:`claim`)."""

    worker_id: str
    lease_token: str
    """Fresh, made by the caller; the kernel never makes a token."""
    lease_duration: timedelta


@attrs.frozen
class RenewRequest:
    """Extend the lease the credential holds by ``lease_duration`` from now (:func:`renew`)."""

    credential: LeaseCredential
    lease_duration: timedelta


@attrs.frozen
class StepRequest:
    """Record one node visit under the lease, at the execution's expected revision (:func:`record_step`)."""

    credential: LeaseCredential
    expected_revision: int
    step: StepRecord
    authority: Authority


@attrs.frozen
class ReleaseRequest:
    """Hand the lease back: running -> eligible, for another worker to continue at once (:func:`release`)."""

    credential: LeaseCredential
    expected_revision: int


@attrs.frozen
class FinalizeRequest:
    """Seed 000: finalizeLeasedExecution(execution_id, dispatch_id, worker_id, lease_token, target_state)."""

    execution_id: str
    dispatch_id: str
    worker_id: str
    lease_token: str
    fence: int
    target_state: ExecutionState | str
    business_id: str
    expected_revision: int
    authority: Authority
    step: StepRecord | None = None
    """The final node visit, counted in the same commit (evidence and finalization together)."""
    wait: WaitSpec | None = None
    """Required exactly when the target is waiting: the registration commits with it."""
    reason: str = ""
    """Kept with the history: text a store can keep (kernel/text.py), at most ``MAX_RATIONALE`` characters."""
    error_code: str | None = None
    """A bounded, non-secret diagnostic code for dispatch.last_error_code (seed 000: Persistence)."""


@attrs.frozen
class WakeRequest:
    """A wake from a committed Event, a Decision, or a one-time UTC timer.

    ``source_id`` identifies the Event or Decision (or the timer firing);
    ``authority`` carries the check that the source is authorized and
    correctly bound (Event connectivity alone is not authority).
    """

    key: WaitKey
    reason: WakeReason
    source_id: str
    business_id: str
    authority: Authority
    event_type: str | None = None
    correlation: tuple[tuple[str, str], ...] = ()
    outcome: str | None = None
    """A Decision's determination (``approved`` or ``rejected``); only with reason DECISION."""


@attrs.frozen
class CancelRequest:
    """Cancel an eligible or waiting execution, with the canceller's authority (:func:`cancel`)."""

    execution_id: str
    business_id: str
    expected_revision: int
    authority: Authority


@attrs.frozen
class RecoveryRequest:
    """A governed workflow_reconcile command (seed 000: Recovery Operation)."""

    command_id: str
    kind: RecoveryKind
    execution_id: str
    business_id: str
    expected_revision: int
    actor_id: str
    authority: Authority
    command_to_reconcile: str | None = None
    """reconcile_command: the persisted Command whose settlement the caller's evidence records."""
    next_node_id: str | None = None
    """resume_safe and resume_suspended: the continuation the operator chose explicitly (seed 000:
    'an explicit continuation only after current dependencies and evidence are rechecked').
    Required: a resume never defaults to the current node, which 'is not proof of safety by itself'."""
    rationale: str = ""
    """resume_safe: the idempotency contract (why entering the continuation is safe); resume_suspended:
    what was fixed.  Required for both, and recorded with the decision."""


# --- input validation -----------------------------------------------------------


class _Invalid(Exception):
    """Internal: carries a refusal out of the validators; never escapes this module."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _invalid(field: str, problem: str) -> _Invalid:
    return _Invalid(Refusal(RefusalCode.INVALID_REQUEST, f"{field}: {problem}", field))


# The identifier, UTC and duration rules are common.py's, shared with durable operations.


def _check_id(field: str, value: object) -> None:
    problem = identifier_problem(value)
    if problem is not None:
        raise _invalid(field, problem)


def _check_utc(field: str, value: object) -> None:
    problem = utc_problem(value)
    if problem is not None:
        raise _invalid(field, problem)


def _check_duration(field: str, value: object) -> None:
    problem = duration_problem(value)
    if problem is not None:
        raise _invalid(field, problem)


def _expiry(field: str, now: datetime, duration: timedelta) -> datetime:
    problem = later_problem(now, duration)
    if problem is not None:
        raise _invalid(field, problem)
    return now + duration


def _check_revision(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _invalid(field, f"must be a positive integer, got {shown(value)}")


def _check_fence(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _invalid(field, f"must be a positive integer, got {shown(value)}")


def _check_authority(field: str, value: object) -> None:
    if not isinstance(value, Authority):
        raise _invalid(field, "must be an Authority fact")
    # A fact that is not exactly True or False must never pass as granted.
    _check_bool(f"{field}.granted", value.granted)
    _check_id(f"{field}.principal_id", value.principal_id)


# --- snapshot validation ---------------------------------------------------------
#
# The rows are not a caller's request: a store read them.  A snapshot no
# decision could have written (a spec string for a state, a naive time, a
# revision of 0) is a defect of whatever made it, so it is raised, as a
# TypeError or ValueError naming the argument and field, before any decision
# reasons about it; refusing it would blame the request.  The exceptions are
# MalformedSnapshot as well, so that a store can tell a row it read and the
# kernel will not decide on (it reports that row as malformed_row) from any
# other error, without reading a message.


class MalformedSnapshot(Exception):
    """A snapshot no decision could have written: a field of another type or range, or two rows that contradict each other.

    Raised before any decision is made, never returned: the rows are what a
    store read, so this is a defect of whatever wrote or built them (a hand
    edit, damage, a caller's own snapshot), not of the request.  The message
    starts with the field (``execution.revision: ...``,
    ``dispatch.step_count: ...``).  Every instance is also a ``TypeError``
    (a field of another type) or a ``ValueError`` (a value out of range, two
    rows that disagree), as it was before this class named them.
    """


class _SnapshotTypeError(MalformedSnapshot, TypeError):
    pass


class _SnapshotValueError(MalformedSnapshot, ValueError):
    pass


def _snapshot_type(field: str, value: object, kind: type, *, optional: bool = False) -> None:
    if not isinstance(value, kind) and not (optional and value is None):
        wanted = f"{kind.__name__} or None" if optional else kind.__name__
        raise _SnapshotTypeError(f"{field}: must be of type {wanted}, got {type(value).__name__}")


def _snapshot_count(field: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _SnapshotTypeError(f"{field}: must be an integer, got {type(value).__name__}")
    if value < least:
        raise _SnapshotValueError(f"{field}: must be at least {least}, got {value}")


def _snapshot_time(field: str, value: object, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    _snapshot_type(field, value, datetime)
    problem = utc_problem(value)
    if problem is not None:
        raise _SnapshotValueError(f"{field}: {problem}")


# An enum member read through its class costs as much again as the rest of this comparison (Python 3.11).
_WAITING: Final = ExecutionState.WAITING
_CLAIMED: Final = DispatchState.CLAIMED


def _check_rows(execution: object, dispatch: object) -> None:
    """Both snapshots of their types, each field of its type and range (see above); None is a missing row.

    Every decision runs this, so the common case is one expression per row;
    only a row that fails it is examined field by field for the message.
    Two rows that each read well but contradict each other where a decision
    would carry the contradiction into what it writes are raised the same
    way (:func:`_explain_contradiction`).
    """
    if execution is not None and not (
        type(execution) is Execution
        and type(execution.state) is ExecutionState
        and type(execution.revision) is int
        and execution.revision >= 1
        and type(execution.fence) is int
        and execution.fence >= 0
        and type(execution.step_count) is int
        and execution.step_count >= 0
        and type(execution.definition_revision) is int
        and execution.definition_revision >= 1
        and type(execution.execution_id) is str
        and type(execution.business_id) is str
        and type(execution.definition_id) is str
        and (execution.current_node_id is None or type(execution.current_node_id) is str)
        and (
            execution.wait is None
            or (type(execution.wait) is WaitKey and execution.wait.execution_id == execution.execution_id)
        )
        # Only a waiting execution whose key is gone: a key left on one that is not waiting is never read.
        and (execution.wait is not None or execution.state is not _WAITING)
    ):
        _explain_rows(execution, None)
    if dispatch is not None and not (
        type(dispatch) is Dispatch
        and type(dispatch.dispatch_state) is DispatchState
        and type(dispatch.eligible_at) is datetime
        and dispatch.eligible_at.tzinfo is UTC
        and (
            dispatch.lease_expires_at is None
            or (type(dispatch.lease_expires_at) is datetime and dispatch.lease_expires_at.tzinfo is UTC)
        )
        and type(dispatch.step_count) is int
        and dispatch.step_count >= 0
        and type(dispatch.workflow_execution_id) is str
        and (dispatch.lease_token is None or type(dispatch.lease_token) is str)
        and (dispatch.leased_by is None or type(dispatch.leased_by) is str)
        and (dispatch.last_error_code is None or type(dispatch.last_error_code) is str)
        # The execution, if any, passed the check above.
        and (type(execution) is not Execution or dispatch.step_count == execution.step_count)
        # Only a claimed row holds a lease (_explain_contradiction).
        and (
            dispatch.dispatch_state is _CLAIMED
            or (dispatch.lease_token is None and dispatch.leased_by is None and dispatch.lease_expires_at is None)
        )
    ):
        _explain_rows(execution, dispatch)


def snapshot_problem(execution: object, dispatch: object) -> str | None:
    """Why no decision would be made on these rows (the :class:`MalformedSnapshot` every one raises), or None.

    The same check each decision makes first, for a reader that shows rows
    rather than decides on them (``fencekeeper inspect``): two rows that
    each read well, but disagree where a decision would write the
    disagreement on, are named as a decision would name them.
    """
    try:
        _check_rows(execution, dispatch)
    except MalformedSnapshot as exc:
        return str(exc)
    return None


def _explain_rows(execution: object, dispatch: object) -> None:
    """The field-by-field check behind :func:`_check_rows`: raises for the first bad field, if any."""
    if execution is not None:
        _snapshot_type("execution", execution, Execution)
        assert isinstance(execution, Execution)
        for name in ("execution_id", "business_id", "definition_id"):
            _snapshot_type(f"execution.{name}", getattr(execution, name), str)
        _snapshot_type("execution.current_node_id", execution.current_node_id, str, optional=True)
        _snapshot_type("execution.state", execution.state, ExecutionState)
        _snapshot_count("execution.revision", execution.revision, 1)
        _snapshot_count("execution.definition_revision", execution.definition_revision, 1)
        _snapshot_count("execution.step_count", execution.step_count, 0)
        _snapshot_count("execution.fence", execution.fence, 0)
        _snapshot_type("execution.wait", execution.wait, WaitKey, optional=True)
    if dispatch is not None:
        _snapshot_type("dispatch", dispatch, Dispatch)
        assert isinstance(dispatch, Dispatch)
        _snapshot_type("dispatch.workflow_execution_id", dispatch.workflow_execution_id, str)
        _snapshot_type("dispatch.dispatch_state", dispatch.dispatch_state, DispatchState)
        _snapshot_time("dispatch.eligible_at", dispatch.eligible_at)
        for name in ("lease_token", "leased_by", "last_error_code"):
            _snapshot_type(f"dispatch.{name}", getattr(dispatch, name), str, optional=True)
        _snapshot_time("dispatch.lease_expires_at", dispatch.lease_expires_at, optional=True)
        _snapshot_count("dispatch.step_count", dispatch.step_count, 0)
    _explain_contradiction(execution, dispatch)


def _explain_contradiction(execution: object, dispatch: object) -> None:
    """Raises for two well-typed rows that no decisions could have written together.

    Only where a decision would otherwise write the contradiction on:

    - ``execution.wait`` naming another execution: cancelling the waiter
      would close that execution's registration (``closes``), leaving its
      wait with nothing that can ever wake it;
    - a ``waiting`` execution with no ``wait``: only a finalization with a
      registration enters waiting.  Cancelling it would close nothing, so
      the registration it waits on would stay open for an execution that
      no longer waits (every way out of waiting but a wake closes it, see
      the module's rules); and no wake or timer could ever match it.

    A ``wait`` left on an execution that is not waiting is not raised: no
    decision reads it there (a wake and :func:`_closing` look at the state
    first; a store's timers and approvals hold a registration to a waiting
    execution), and every move writes ``wait`` afresh.
    - the two step counts apart: every move writes the execution's count
      to both rows, so a dispatch row at the bound would be set back below
      it, which seed 000 (Dispatcher Pass) forbids: a later pass 'must not
      ... reset the step counter'.
    - a lease field (``lease_token``, ``leased_by``, ``lease_expires_at``)
      on a row that is not claimed: every move out of claimed clears all
      three (:func:`_move`), and seed 000 (Lease) assigns a lease only by a
      claim, so the row names a holder no claim made.  A reconciliation's
      linking revision keeps the dispatch row's fields and would write it
      on, where a store's schema refuses it (its CHECK of the three
      against the state) as an error naming no execution.  A claimed row
      without them is not raised here: no decision writes it on (each one
      on a claimed row checks the lease first, :func:`_check_lease`, and
      refuses), and the same CHECK refuses it on write.

    The other disagreements are refused by the checks of each decision, as
    the seed lists them: a dispatch row of another execution
    (``identity_mismatch``, finalization precondition 3) and states that
    disagree (``dispatch_not_claimed``, ``execution_not_running``,
    ``not_eligible``, ``not_waiting``, ``illegal_transition``,
    ``not_in_reconciliation``), neither writing anything.
    """
    if (
        isinstance(execution, Execution)
        and execution.wait is not None
        and execution.wait.execution_id != execution.execution_id
    ):
        raise _SnapshotValueError(
            f"execution.wait: names a registration of execution {execution.wait.execution_id!r}, "
            f"not of execution.execution_id {execution.execution_id!r}"
        )
    if isinstance(execution, Execution) and execution.state is ExecutionState.WAITING and execution.wait is None:
        raise _SnapshotValueError(
            "execution.wait: missing, but execution.state is waiting; a waiting execution names the "
            "registration it waits on"
        )
    if isinstance(dispatch, Dispatch) and dispatch.dispatch_state is not _CLAIMED:
        for name in ("lease_token", "leased_by", "lease_expires_at"):
            if getattr(dispatch, name) is not None:
                raise _SnapshotValueError(
                    f"dispatch.{name}: set, but dispatch.dispatch_state is {dispatch.dispatch_state.value}; "
                    "only a claimed row holds a lease"
                )
    if (
        isinstance(execution, Execution)
        and isinstance(dispatch, Dispatch)
        and execution.step_count != dispatch.step_count
    ):
        raise _SnapshotValueError(
            f"dispatch.step_count: {dispatch.step_count} steps, but execution.step_count is "
            f"{execution.step_count}; the two rows count the same steps"
        )


def _check_registration(registration: object) -> None:
    """The wait registration a wake reads, as :func:`_check_rows` checks the rows."""
    if registration is None:
        return
    _snapshot_type("registration", registration, WaitRegistration)
    assert isinstance(registration, WaitRegistration)
    _snapshot_type("registration.key", registration.key, WaitKey)
    _snapshot_type("registration.business_id", registration.business_id, str)
    _snapshot_type("registration.spec", registration.spec, WaitSpec)
    _snapshot_time("registration.spec.wake_at", registration.spec.wake_at, optional=True)
    _snapshot_type("registration.woken_by", registration.woken_by, str, optional=True)
    _snapshot_type("registration.closed_by", registration.closed_by, str, optional=True)


def _check_request(value: object, kind: type) -> None:
    # The request itself, before any of its fields is read: a None or a
    # request of another decision is refused, not an AttributeError.
    if not isinstance(value, kind):
        raise _invalid("request", f"must be of type {kind.__name__}, got {type(value).__name__}")


def _check_bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _invalid(field, f"must be true or false, got {shown(value)}")


def _check_credential(value: object) -> None:
    if not isinstance(value, LeaseCredential):
        raise _invalid("credential", "must be a LeaseCredential")
    _check_id("credential.worker_id", value.worker_id)
    _check_id("credential.lease_token", value.lease_token)
    _check_fence("credential.fence", value.fence)


def _check_step(field: str, value: object) -> None:
    if not isinstance(value, StepRecord):
        raise _invalid(field, "must be a StepRecord")
    _check_id(f"{field}.node_id", value.node_id)
    _check_id(f"{field}.attempt_id", value.attempt_id)
    if value.next_node_id is not None:
        _check_id(f"{field}.next_node_id", value.next_node_id)


def _check_correlation(field: str, value: object) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value
    ):
        raise _invalid(field, "must be a tuple of (name, value) string pairs")
    names = [p[0] for p in value]
    if names != sorted(set(names)):
        raise _invalid(field, "names must be unique and sorted, so that equal descriptors compare equal")
    for name, text in value:
        _check_id(f"{field}[{name!r}]", name)
        _check_text(f"{field}[{name!r}]", text)


def _check_text(field: str, value: object) -> None:
    # A store keeps the value as text: see kernel/text.py for what it may not hold.
    if not isinstance(value, str):
        raise _invalid(field, f"must be a string, got {type(value).__name__}")
    unstorable = text_problem(value)
    if unstorable is not None:
        raise _invalid(field, unstorable)


def _check_wait_spec(field: str, value: object) -> None:
    if not isinstance(value, WaitSpec):
        raise _invalid(field, "must be a WaitSpec")
    _check_id(f"{field}.node_id", value.node_id)
    _check_id(f"{field}.attempt_id", value.attempt_id)
    if value.event_type is not None:
        _check_id(f"{field}.event_type", value.event_type)
    _check_correlation(f"{field}.correlation", value.correlation)
    if value.wake_at is not None:
        _check_utc(f"{field}.wake_at", value.wake_at)
    if value.wake_after is not None:
        _check_duration(f"{field}.wake_after", value.wake_after)
        if value.wake_at is not None:
            raise _invalid(f"{field}.wake_after", "give wake_at or wake_after, not both")
    timed = value.wake_at is not None or value.wake_after is not None
    if value.event_type is None and not timed:
        raise _invalid(field, "waits for nothing: give an event_type, a wake_at, or both")
    if value.timeout and not timed:
        raise _invalid(f"{field}.timeout", "a timeout continuation needs a wake_at")
    pairs = value.continuations
    if not isinstance(pairs, tuple) or not all(
        isinstance(pair, tuple) and len(pair) == 2 and pair[0] in WAKE_OUTCOMES for pair in pairs
    ):
        raise _invalid(f"{field}.continuations", f"must be (outcome, node_id) pairs; outcomes are {WAKE_OUTCOMES}")
    if [pair[0] for pair in pairs] != sorted({pair[0] for pair in pairs}):
        raise _invalid(f"{field}.continuations", "outcomes must be unique and sorted")
    for outcome, node_id in pairs:
        _check_id(f"{field}.continuations[{outcome}]", node_id)


def _parse_target(value: object) -> ExecutionState:
    if isinstance(value, ExecutionState):
        return value
    if isinstance(value, str):
        try:
            return ExecutionState(value)
        except ValueError:
            pass
    raise _invalid("target_state", f"unknown state {shown(value)}")


# --- helpers ---------------------------------------------------------------------


def _refuse(code: RefusalCode, message: str) -> Refusal:
    return Refusal(code, message)


def _guard(execution: Execution, dispatch: Dispatch, *, live: bool = False) -> Guard:
    """The guard of a decision made on these rows: it holds on them exactly while any lease it needs is live.

    pre: execution.revision >= 1
    post: __return__.holds(execution, dispatch, dispatch.eligible_at) == (not live or (dispatch.lease_expires_at is not None and dispatch.eligible_at < dispatch.lease_expires_at))
    """
    return Guard(
        execution_id=execution.execution_id,
        expected_revision=execution.revision,
        expected_state=execution.state,
        expected_dispatch_state=dispatch.dispatch_state,
        expected_lease_token=dispatch.lease_token,
        expected_lease_expires_at=dispatch.lease_expires_at,
        expected_fence=execution.fence,
        requires_live_lease=live,
    )


def _move(
    execution: Execution,
    dispatch: Dispatch,
    event: ExecutionEvent,
    *,
    now: datetime,
    actor: str,
    reason: str,
    keep_lease: bool,
    eligible_at: datetime | None = None,
    step: StepRecord | None = None,
    error_code: str | None = None,
    wait: WaitKey | None = None,
    fence: int | None = None,
    node_id: str | None = None,
) -> tuple[Execution, Dispatch, TransitionRecord]:
    """Both rows after ``event``: the tables decide the states, this only carries fields over.

    Every move is one new revision; the dispatch row follows the execution's
    state; the lease survives only a move that keeps it and stays claimed.

    pre: EXECUTION.allows(execution.state, event) and dispatch.dispatch_state == dispatch_state_of(execution.state)
    post: __return__[0].revision == execution.revision + 1 and __return__[0].state == EXECUTION.step(execution.state, event) and __return__[1].dispatch_state == dispatch_state_of(__return__[0].state)
    post: (__return__[1].lease_token, __return__[1].leased_by, __return__[1].lease_expires_at) == ((dispatch.lease_token, dispatch.leased_by, dispatch.lease_expires_at) if keep_lease and __return__[1].dispatch_state == DispatchState.CLAIMED else (None, None, None))
    """
    new_state = EXECUTION.step(execution.state, event)
    new_dispatch_state = DISPATCH.step(dispatch.dispatch_state, event)
    # The two tables are built from one list and must agree; a mismatch here
    # is a defect in machines.py, not a request problem.
    assert new_dispatch_state == dispatch_state_of(new_state), (event, new_state, new_dispatch_state)
    steps = execution.step_count + (1 if step is not None else 0)
    # Built field by field rather than with attrs.evolve: this runs on every
    # decision, and evolve costs as much again in introspection.
    new_execution = Execution(
        execution_id=execution.execution_id,
        business_id=execution.business_id,
        definition_id=execution.definition_id,
        definition_revision=execution.definition_revision,
        state=new_state,
        revision=execution.revision + 1,
        step_count=steps,
        current_node_id=(
            node_id
            if node_id is not None
            else (step.next_node_id or step.node_id)
            if step is not None
            else execution.current_node_id
        ),
        wait=wait,
        fence=execution.fence if fence is None else fence,
    )
    lease_kept = keep_lease and new_dispatch_state == DispatchState.CLAIMED
    new_dispatch = Dispatch(
        workflow_execution_id=dispatch.workflow_execution_id,
        dispatch_state=new_dispatch_state,
        eligible_at=eligible_at if eligible_at is not None else dispatch.eligible_at,
        lease_token=dispatch.lease_token if lease_kept else None,
        leased_by=dispatch.leased_by if lease_kept else None,
        lease_expires_at=dispatch.lease_expires_at if lease_kept else None,
        step_count=steps,
        # Success clears it: an error an execution got past is no longer its last word.
        last_error_code=(
            error_code
            if error_code is not None
            else None
            if new_state == ExecutionState.SUCCEEDED
            else dispatch.last_error_code
        ),
    )
    record = TransitionRecord(
        execution_id=execution.execution_id,
        event=event,
        from_state=execution.state,
        to_state=new_state,
        revision=new_execution.revision,
        at=now,
        actor=actor,
        lease_token=dispatch.lease_token,
        fence=execution.fence,
        reason=reason,
    )
    return new_execution, new_dispatch, record


def _closing(execution: Execution, event: ExecutionEvent) -> WaitClosure | None:
    """The registration ``event`` closes: the one a waiting execution waits on, unless a wake ends it.

    A wake closes its registration itself (it records who woke it); any
    other event out of ``waiting`` must close it here, or the registration
    stays open with nothing waiting on it.

    post: (__return__ is None) == (execution.state != ExecutionState.WAITING or execution.wait is None or event == ExecutionEvent.WAKE)
    """
    if execution.state != ExecutionState.WAITING or execution.wait is None or event == ExecutionEvent.WAKE:
        return None
    return WaitClosure(execution.wait, event)


def _check_pair(execution: Execution | None, dispatch: Dispatch | None, execution_id: str) -> Refusal | None:
    """Seed 000 finalization preconditions 1 to 3, shared by every decision on an existing execution.

    post: (None if __return__ is None else __return__.code) == (RefusalCode.EXECUTION_NOT_FOUND if execution is None else RefusalCode.DISPATCH_NOT_FOUND if dispatch is None else None if execution.execution_id == execution_id == dispatch.workflow_execution_id else RefusalCode.IDENTITY_MISMATCH)
    """
    if execution is None:
        return _refuse(RefusalCode.EXECUTION_NOT_FOUND, f"execution {execution_id!r} does not exist")
    if dispatch is None:
        return _refuse(RefusalCode.DISPATCH_NOT_FOUND, f"no dispatch row for execution {execution_id!r}")
    if execution.execution_id != execution_id or dispatch.workflow_execution_id != execution.execution_id:
        return _refuse(
            RefusalCode.IDENTITY_MISMATCH,
            f"execution {execution.execution_id!r} and dispatch row {dispatch.workflow_execution_id!r} "
            f"do not both belong to {execution_id!r}",
        )
    return None


def _check_lease(
    execution: Execution, dispatch: Dispatch, credential: LeaseCredential, now: datetime
) -> Refusal | None:
    """Seed 000 finalization preconditions 4 to 8, plus seed 001's fence.

    The lease is valid exactly when all of them hold, and the first that
    fails, in the seed's order, names the refusal:

    pre: now.tzinfo is not None
    pre: dispatch.lease_expires_at is None or dispatch.lease_expires_at.tzinfo is not None
    post: (__return__ is None) == (dispatch.dispatch_state == DispatchState.CLAIMED and execution.state == ExecutionState.RUNNING and dispatch.lease_token == credential.lease_token and dispatch.leased_by == credential.worker_id and dispatch.lease_expires_at is not None and now < dispatch.lease_expires_at and credential.fence == execution.fence)
    post: __return__ is None or __return__.code == (RefusalCode.DISPATCH_NOT_CLAIMED if dispatch.dispatch_state != DispatchState.CLAIMED else RefusalCode.EXECUTION_NOT_RUNNING if execution.state != ExecutionState.RUNNING else RefusalCode.LEASE_TOKEN_MISMATCH if dispatch.lease_token != credential.lease_token else RefusalCode.WORKER_MISMATCH if dispatch.leased_by != credential.worker_id else RefusalCode.LEASE_EXPIRED if dispatch.lease_expires_at is None or now >= dispatch.lease_expires_at else RefusalCode.STALE_FENCE)
    """
    if dispatch.dispatch_state != DispatchState.CLAIMED:
        return _refuse(
            RefusalCode.DISPATCH_NOT_CLAIMED, f"dispatch row is {dispatch.dispatch_state.value}, not claimed"
        )
    if execution.state != ExecutionState.RUNNING:
        return _refuse(RefusalCode.EXECUTION_NOT_RUNNING, f"execution is {execution.state.value}, not running")
    if dispatch.lease_token != credential.lease_token:
        return _refuse(RefusalCode.LEASE_TOKEN_MISMATCH, "lease token is not the current one")
    if dispatch.leased_by != credential.worker_id:
        return _refuse(
            RefusalCode.WORKER_MISMATCH,
            f"lease is held by {dispatch.leased_by!r}, not {credential.worker_id!r}",
        )
    if dispatch.lease_expires_at is None or now >= dispatch.lease_expires_at:
        return _refuse(
            RefusalCode.LEASE_EXPIRED, f"lease expired at {_iso(dispatch.lease_expires_at)}; now is {_iso(now)}"
        )
    if credential.fence != execution.fence:
        return _refuse(
            RefusalCode.STALE_FENCE, f"credential carries fence {credential.fence}, current fence is {execution.fence}"
        )
    return None


def _check_held(
    execution: Execution | None, dispatch: Dispatch | None, credential: LeaseCredential, now: datetime
) -> Refusal | None:
    """Preconditions 1 to 8 and the fence, for a request that names its execution only by its rows."""
    execution_id = execution.execution_id if execution is not None else "?"
    refusal = _check_pair(execution, dispatch, execution_id)
    if refusal is not None or execution is None or dispatch is None:
        return refusal
    return _check_lease(execution, dispatch, credential, now)


def _check_business(execution: Execution, business_id: str) -> Refusal | None:
    """Seed 000 finalization precondition 9.

    post: (None if __return__ is None else __return__.code) == (None if execution.business_id == business_id else RefusalCode.BUSINESS_MISMATCH)
    """
    if execution.business_id != business_id:
        return _refuse(
            RefusalCode.BUSINESS_MISMATCH,
            f"execution belongs to business {execution.business_id!r}, request to {business_id!r}",
        )
    return None


def _check_revision_current(execution: Execution, expected: int) -> Refusal | None:
    """Seed 000 finalization precondition 10.

    post: (None if __return__ is None else __return__.code) == (None if execution.revision == expected else RefusalCode.STALE_REVISION)
    """
    if execution.revision != expected:
        return _refuse(
            RefusalCode.STALE_REVISION, f"expected revision {expected}, current revision is {execution.revision}"
        )
    return None


def _check_authorized(authority: Authority) -> Refusal | None:
    """Seed 000 finalization precondition 11 (the caller's check of current facts, never the lease).

    post: (None if __return__ is None else __return__.code) == (None if authority.granted else RefusalCode.NOT_AUTHORIZED)
    """
    if not authority.granted:
        why = f": {authority.reason}" if authority.reason else ""
        return _refuse(RefusalCode.NOT_AUTHORIZED, f"{authority.principal_id!r} is not authorized{why}")
    return None


def _iso(value: datetime | None) -> str:
    return "never" if value is None else value.isoformat()


def _first(*checks: Refusal | None) -> Refusal | None:
    """The first refusal, in the order given: the order of the seed's preconditions.

    post: __return__ is next((check for check in checks if check is not None), None)
    """
    for refusal in checks:
        if refusal is not None:
            return refusal
    return None


# --- decisions ---------------------------------------------------------------------


def admit(existing: Execution | None, request: AdmitRequest, now: datetime, *, id_taken: bool = False) -> Outcome:
    """A new eligible execution and its eligible dispatch row (seed 000, 007B's committed eligible row).

    ``id_taken`` says the identity already names another generic object (an
    evidence object, say): object identities are one space, so that is
    refused like an existing execution.
    """
    try:
        _check_request(request, AdmitRequest)
        _check_id("execution_id", request.execution_id)
        _check_id("business_id", request.business_id)
        _check_id("definition_id", request.definition_id)
        _check_revision("definition_revision", request.definition_revision)
        _check_id("start_node_id", request.start_node_id)
        _check_authority("authority", request.authority)
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(existing, None)
    if not isinstance(id_taken, bool):
        raise TypeError(f"id_taken: must be of type bool, got {type(id_taken).__name__}")
    if existing is not None:
        return _refuse(RefusalCode.ALREADY_EXISTS, f"execution {request.execution_id!r} already exists")
    if id_taken:
        return _refuse(
            RefusalCode.ALREADY_EXISTS, f"{request.execution_id!r} already identifies another object"
        )
    refusal = _check_authorized(request.authority)
    if refusal is not None:
        return refusal
    execution = Execution(
        execution_id=request.execution_id,
        business_id=request.business_id,
        state=EXECUTION.initial[0],
        revision=1,
        definition_id=request.definition_id,
        definition_revision=request.definition_revision,
        current_node_id=request.start_node_id,
    )
    dispatch = Dispatch(
        workflow_execution_id=request.execution_id,
        dispatch_state=DISPATCH.initial[0],
        eligible_at=now,
    )
    record = TransitionRecord(
        execution_id=request.execution_id,
        event=None,
        from_state=None,
        to_state=execution.state,
        revision=1,
        at=now,
        actor=request.authority.principal_id,
        lease_token=None,
        fence=0,
        reason="admitted",
    )
    guard = Guard(request.execution_id, 0, None, None, None, None, 0)
    return Decision(guard=guard, execution=execution, dispatch=dispatch, evidence=(record,))


def claim(execution: Execution | None, dispatch: Dispatch | None, request: ClaimRequest, now: datetime) -> Outcome:
    """Eligible only: assign the fresh token, the worker and the expiry, and advance the fence.

    Seed 000, WorkflowExecution Lifecycle: 'Atomic claim assigns fresh lease
    token, technical worker identity and expiry'; seed 001: a claim
    'increments the fence, and establishes one owner atomically'.
    """
    try:
        _check_request(request, ClaimRequest)
        _check_id("worker_id", request.worker_id)
        _check_id("lease_token", request.lease_token)
        _check_duration("lease_duration", request.lease_duration)
        _check_utc("now", now)
        expires = _expiry("lease_duration", now, request.lease_duration)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    execution_id = execution.execution_id if execution is not None else "?"
    refusal = _check_pair(execution, dispatch, execution_id)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    if execution.state != ExecutionState.ELIGIBLE or dispatch.dispatch_state != DispatchState.ELIGIBLE:
        return _refuse(
            RefusalCode.NOT_ELIGIBLE,
            f"execution is {execution.state.value} and dispatch {dispatch.dispatch_state.value}; only eligible "
            "work can be claimed",
        )
    if now < dispatch.eligible_at:
        return _refuse(RefusalCode.NOT_ELIGIBLE, f"eligible only from {_iso(dispatch.eligible_at)}")
    new_execution, new_dispatch, record = _move(
        execution,
        dispatch,
        ExecutionEvent.CLAIM,
        now=now,
        actor=request.worker_id,
        reason="claimed",
        keep_lease=False,
        fence=execution.fence + 1,
    )
    # Built field by field rather than with attrs.evolve, as _move builds them: every claim runs this.
    new_dispatch = Dispatch(
        workflow_execution_id=new_dispatch.workflow_execution_id,
        dispatch_state=new_dispatch.dispatch_state,
        eligible_at=new_dispatch.eligible_at,
        lease_token=request.lease_token,
        leased_by=request.worker_id,
        lease_expires_at=expires,
        step_count=new_dispatch.step_count,
        last_error_code=new_dispatch.last_error_code,
    )
    record = TransitionRecord(
        execution_id=record.execution_id,
        event=record.event,
        from_state=record.from_state,
        to_state=record.to_state,
        revision=record.revision,
        at=record.at,
        actor=record.actor,
        lease_token=request.lease_token,
        fence=new_execution.fence,
        reason=record.reason,
    )
    lease = LeaseCredential(request.worker_id, request.lease_token, new_execution.fence)
    return Decision(
        guard=_guard(execution, dispatch),
        execution=new_execution,
        dispatch=new_dispatch,
        evidence=(record,),
        lease=lease,
    )


def renew(execution: Execution | None, dispatch: Dispatch | None, request: RenewRequest, now: datetime) -> Outcome:
    """Only before expiry, only by the current token, worker and fence.  Writes the dispatch row only."""
    try:
        _check_request(request, RenewRequest)
        _check_credential(request.credential)
        _check_duration("lease_duration", request.lease_duration)
        _check_utc("now", now)
        expires = _expiry("lease_duration", now, request.lease_duration)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    refusal = _check_held(execution, dispatch, request.credential, now)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    # The table must admit renewal from here; it always does for running.
    EXECUTION.step(execution.state, ExecutionEvent.RENEW)
    new_dispatch = attrs.evolve(dispatch, lease_expires_at=expires)
    record = TransitionRecord(
        execution_id=execution.execution_id,
        event=ExecutionEvent.RENEW,
        from_state=execution.state,
        to_state=execution.state,
        revision=execution.revision,
        at=now,
        actor=request.credential.worker_id,
        lease_token=request.credential.lease_token,
        fence=execution.fence,
        reason=f"renewed until {_iso(new_dispatch.lease_expires_at)}",
    )
    return Decision(guard=_guard(execution, dispatch, live=True), execution=None, dispatch=new_dispatch, evidence=(record,))


def record_step(
    execution: Execution | None, dispatch: Dispatch | None, request: StepRequest, now: datetime
) -> Outcome:
    """A committed node transition under the valid lease: one step, at most 100 (seed 000, Dispatcher Pass)."""
    try:
        _check_request(request, StepRequest)
        _check_credential(request.credential)
        _check_revision("expected_revision", request.expected_revision)
        _check_step("step", request.step)
        _check_authority("authority", request.authority)
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    refusal = _check_held(execution, dispatch, request.credential, now)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    refusal = _first(
        _check_revision_current(execution, request.expected_revision),
        _check_authorized(request.authority),
    )
    if refusal is not None:
        return refusal
    if execution.step_count >= STEP_LIMIT:
        return _refuse(
            RefusalCode.STEP_LIMIT_REACHED,
            f"{STEP_LIMIT} steps processed; finalize to suspended with reason step_limit",
        )
    new_execution, new_dispatch, record = _move(
        execution,
        dispatch,
        ExecutionEvent.RECORD_STEP,
        now=now,
        actor=request.credential.worker_id,
        reason=f"step at node {request.step.node_id} (attempt {request.step.attempt_id})",
        keep_lease=True,
        step=request.step,
    )
    return Decision(
        guard=_guard(execution, dispatch, live=True), execution=new_execution, dispatch=new_dispatch, evidence=(record,)
    )


def release(
    execution: Execution | None, dispatch: Dispatch | None, request: ReleaseRequest, now: datetime
) -> Outcome:
    """Ordinary continuation running -> eligible under the valid lease (seed 000: release())."""
    try:
        _check_request(request, ReleaseRequest)
        _check_credential(request.credential)
        _check_revision("expected_revision", request.expected_revision)
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    refusal = _check_held(execution, dispatch, request.credential, now)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    refusal = _first(
        _check_revision_current(execution, request.expected_revision),
    )
    if refusal is not None:
        return refusal
    new_execution, new_dispatch, record = _move(
        execution,
        dispatch,
        ExecutionEvent.RELEASE,
        now=now,
        actor=request.credential.worker_id,
        reason="released for continuation",
        keep_lease=False,
        eligible_at=now,
    )
    return Decision(
        guard=_guard(execution, dispatch, live=True), execution=new_execution, dispatch=new_dispatch, evidence=(record,)
    )


def finalize(
    execution: Execution | None, dispatch: Dispatch | None, request: FinalizeRequest, now: datetime
) -> Outcome:
    """Seed 000, Fenced Execution Finalization: twelve preconditions in the seed's order, five targets.

    The lease is released in the same decision.  A waiting target commits
    its wait registration with it; a final node visit given as ``step`` is
    counted in the same commit.
    """
    try:
        _check_request(request, FinalizeRequest)
        _check_id("execution_id", request.execution_id)
        _check_id("dispatch_id", request.dispatch_id)
        _check_id("worker_id", request.worker_id)
        _check_id("lease_token", request.lease_token)
        _check_fence("fence", request.fence)
        target = _parse_target(request.target_state)
        _check_id("business_id", request.business_id)
        _check_revision("expected_revision", request.expected_revision)
        _check_authority("authority", request.authority)
        if request.step is not None:
            _check_step("step", request.step)
        if request.wait is not None:
            _check_wait_spec("wait", request.wait)
        if request.error_code is not None:
            _check_id("error_code", request.error_code)
        _check_text("reason", request.reason)
        if len(request.reason) > MAX_RATIONALE:
            raise _invalid("reason", f"must be at most {MAX_RATIONALE} characters, got {len(request.reason)}")
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    # 1-3: existence and identity.
    refusal = _check_pair(execution, dispatch, request.execution_id)
    if refusal is None and dispatch is not None and request.dispatch_id != dispatch.workflow_execution_id:
        refusal = _refuse(
            RefusalCode.IDENTITY_MISMATCH,
            f"dispatch_id {request.dispatch_id!r} does not identify the dispatch row of {request.execution_id!r}",
        )
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    credential = LeaseCredential(request.worker_id, request.lease_token, request.fence)
    refusal = _first(
        # 4-8: dispatch claimed, execution running, token, worker, expiry (and the fence).
        _check_lease(execution, dispatch, credential, now),
        # 9: business; 10: revision; 11: authorization.
        _check_business(execution, request.business_id),
        _check_revision_current(execution, request.expected_revision),
        _check_authorized(request.authority),
    )
    if refusal is not None:
        return refusal
    # 12: the target.
    if target not in FINALIZE_TARGETS:
        return _refuse(
            RefusalCode.TARGET_NOT_PERMITTED,
            f"finalization may target only {', '.join(t.value for t in FINALIZE_TARGETS)}; not {target.value}",
        )
    if (target == ExecutionState.WAITING) != (request.wait is not None):
        return Refusal(
            RefusalCode.WAIT_REGISTRATION_REQUIRED,
            "wait: a waiting target needs its wait registration, and only a waiting target may carry one",
            "wait",
        )
    if request.step is not None and execution.step_count >= STEP_LIMIT:
        return _refuse(
            RefusalCode.STEP_LIMIT_REACHED,
            f"{STEP_LIMIT} steps processed; finalize to suspended without another step",
        )
    wait_key = (
        WaitKey(execution.execution_id, request.wait.node_id, request.wait.attempt_id)
        if request.wait is not None
        else None
    )
    new_execution, new_dispatch, record = _move(
        execution,
        dispatch,
        _FINALIZE_EVENT[target],
        now=now,
        actor=request.worker_id,
        reason=request.reason or f"finalized to {target.value}",
        keep_lease=False,
        step=request.step,
        wait=wait_key,
        error_code=request.error_code,
    )
    spec = request.wait
    if spec is not None and spec.wake_after is not None:
        try:
            spec = attrs.evolve(spec, wake_at=_expiry("wait.wake_after", now, spec.wake_after), wake_after=None)
        except _Invalid as exc:
            return exc.refusal
    registration = (
        WaitRegistration(key=wait_key, business_id=execution.business_id, spec=spec)
        if wait_key is not None and spec is not None
        else None
    )
    return Decision(
        guard=_guard(execution, dispatch, live=True),
        execution=new_execution,
        dispatch=new_dispatch,
        evidence=(record,),
        registration=registration,
    )


def fenced(
    execution: Execution | None, dispatch: Dispatch | None, credential: LeaseCredential, now: datetime
) -> Outcome:
    """A decision that changes no row: it lets a store attach evidence under the current lease.

    Evidence is a write like any other, so it is fenced like renewal:
    finalization preconditions 1 to 8 and the fence, and a guard that asks
    the store to recheck expiry at commit.
    """
    try:
        _check_credential(credential)
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    refusal = _check_held(execution, dispatch, credential, now)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    return Decision(guard=_guard(execution, dispatch, live=True), execution=None, dispatch=None, evidence=())


def wake(
    execution: Execution | None,
    dispatch: Dispatch | None,
    registration: WaitRegistration | None,
    request: WakeRequest,
    now: datetime,
) -> Outcome:
    """Waiting -> eligible on an exact match; the first committed wake wins (seed 000: wait_for_event).

    A duplicate or later wake of an already woken registration is
    :class:`Unchanged`.  A wake never touches a terminal or review state.
    ``registration`` must be the one ``request.key`` names, which the
    execution waits on: any other (an earlier attempt's, say) is refused
    ``not_waiting``, woken or not.
    """
    try:
        _check_request(request, WakeRequest)
        if not isinstance(request.key, WaitKey):
            raise _invalid("key", "must be a WaitKey")
        _check_id("key.execution_id", request.key.execution_id)
        _check_id("key.node_id", request.key.node_id)
        _check_id("key.attempt_id", request.key.attempt_id)
        if not isinstance(request.reason, WakeReason):
            raise _invalid("reason", f"unknown wake reason {shown(request.reason)}")
        _check_id("source_id", request.source_id)
        _check_id("business_id", request.business_id)
        _check_authority("authority", request.authority)
        if request.event_type is not None:
            _check_id("event_type", request.event_type)
        _check_correlation("correlation", request.correlation)
        if request.outcome is not None and (
            request.reason != WakeReason.DECISION or request.outcome not in DETERMINATIONS
        ):
            raise _invalid("outcome", f"only a decision wake carries an outcome, one of {DETERMINATIONS}")
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    _check_registration(registration)
    # Only the registration the wake names may answer for it: another
    # attempt's (an earlier visit of the node, another node) must neither
    # wake the wait the execution has now nor, already woken, swallow a wake
    # of it as a duplicate (seed 000, wait_for_event: 'uniquely bound to the
    # execution/node/attempt').
    named = registration is not None and registration.key == request.key
    if named and registration is not None and registration.woken_by is not None:
        # Who woke a waiter is told only to a caller who may know it.
        if registration.business_id != request.business_id:
            return _refuse(
                RefusalCode.BUSINESS_MISMATCH,
                f"the registration belongs to another business than {request.business_id!r}",
            )
        refusal = _check_authorized(request.authority)
        if refusal is not None:
            return refusal
        same = registration.woken_by == request.source_id
        return Unchanged(
            UnchangedCode.ALREADY_WOKEN,
            (
                f"this {request.reason.value} already woke the waiter"
                if same
                else f"already woken by {registration.woken_by!r}; the first committed wake wins"
            ),
        )
    refusal = _check_pair(execution, dispatch, request.key.execution_id)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    if (
        execution.state != ExecutionState.WAITING
        or dispatch.dispatch_state != DispatchState.WAITING
        or execution.wait != request.key
        or registration is None
        or (named and not registration.is_open)
    ):
        return _refuse(
            RefusalCode.NOT_WAITING,
            f"execution is {execution.state.value} (dispatch {dispatch.dispatch_state.value}) and does not wait "
            f"on node {request.key.node_id!r} "
            f"attempt {request.key.attempt_id!r}",
        )
    if not named:
        given = registration.key
        return _refuse(
            RefusalCode.NOT_WAITING,
            f"the registration given is {given.execution_id!r} node {given.node_id!r} attempt "
            f"{given.attempt_id!r}, not the one the execution waits on (node {request.key.node_id!r} attempt "
            f"{request.key.attempt_id!r}); another attempt's registration never wakes this wait",
        )
    refusal = _first(_check_business(execution, request.business_id), _check_authorized(request.authority))
    if refusal is not None:
        return refusal
    spec = registration.spec
    if request.reason in (WakeReason.EVENT, WakeReason.DECISION):
        if spec.event_type is None or request.event_type != spec.event_type or request.correlation != spec.correlation:
            return _refuse(RefusalCode.WAKE_MISMATCH, "event type or correlation does not match the registration exactly")
    else:
        if spec.wake_at is None or spec.timeout != (request.reason == WakeReason.TIMEOUT):
            return _refuse(RefusalCode.WAKE_MISMATCH, f"the registration declares no {request.reason.value} wake")
        if now < spec.wake_at:
            return _refuse(RefusalCode.WAKE_NOT_DUE, f"wake is due at {_iso(spec.wake_at)}; now is {_iso(now)}")
    outcome = request.outcome if request.reason == WakeReason.DECISION else request.reason.value
    continuation = dict(spec.continuations).get(outcome or "")
    new_execution, new_dispatch, record = _move(
        execution,
        dispatch,
        ExecutionEvent.WAKE,
        now=now,
        actor=request.authority.principal_id,
        reason=f"woken by {request.reason.value} {request.source_id}"
        + (f" ({request.outcome})" if request.outcome is not None else "")
        + (f"; continues at {continuation}" if continuation is not None else ""),
        keep_lease=False,
        eligible_at=now,
        wait=None,
        node_id=continuation,
    )
    return Decision(
        guard=_guard(execution, dispatch),
        execution=new_execution,
        dispatch=new_dispatch,
        evidence=(record,),
        registration=attrs.evolve(registration, woken_by=request.source_id, wake_reason=request.reason),
    )


def cancel(execution: Execution | None, dispatch: Dispatch | None, request: CancelRequest, now: datetime) -> Outcome:
    """Eligible or waiting -> cancelled; running work is refused (seed 000: Cancellation).

    Cancellation races claim and wake through the guard: whichever commits
    first moves the revision, and the other's guard no longer holds.
    """
    try:
        _check_request(request, CancelRequest)
        _check_id("execution_id", request.execution_id)
        _check_id("business_id", request.business_id)
        _check_revision("expected_revision", request.expected_revision)
        _check_authority("authority", request.authority)
        _check_utc("now", now)
    except _Invalid as exc:
        return exc.refusal
    _check_rows(execution, dispatch)
    refusal = _check_pair(execution, dispatch, request.execution_id)
    if refusal is not None:
        return refusal
    assert execution is not None and dispatch is not None
    refusal = _first(
        _check_business(execution, request.business_id),
        _check_revision_current(execution, request.expected_revision),
        _check_authorized(request.authority),
    )
    if refusal is not None:
        return refusal
    if execution.state == ExecutionState.RUNNING:
        # The table has no running -> cancelled: the lease holder may be in
        # the middle of a local Action, and only a reconciliation path may
        # establish that no unsafe work remains.
        return _refuse(
            RefusalCode.CANCEL_RUNNING, "running work cannot be cancelled while its lease holder may be acting"
        )
    if not (
        EXECUTION.allows(execution.state, ExecutionEvent.CANCEL)
        and DISPATCH.allows(dispatch.dispatch_state, ExecutionEvent.CANCEL)
        and dispatch.dispatch_state == dispatch_state_of(execution.state)
    ):
        return _refuse(
            RefusalCode.ILLEGAL_TRANSITION,
            f"a {execution.state.value} execution (dispatch {dispatch.dispatch_state.value}) cannot be cancelled",
        )
    new_execution, new_dispatch, record = _move(
        execution,
        dispatch,
        ExecutionEvent.CANCEL,
        now=now,
        actor=request.authority.principal_id,
        reason="cancelled",
        keep_lease=False,
        wait=None,
    )
    return Decision(
        guard=_guard(execution, dispatch),
        execution=new_execution,
        dispatch=new_dispatch,
        evidence=(record,),
        closes=_closing(execution, ExecutionEvent.CANCEL),
    )


__all__ = [
    "DETERMINATIONS",
    "FINALIZE_TARGETS",
    "MAX_RATIONALE",
    "STEP_LIMIT",
    "WAKE_OUTCOMES",
    "AdmitRequest",
    "Authority",
    "CancelRequest",
    "ClaimRequest",
    "Decision",
    "Dispatch",
    "Execution",
    "FinalizeRequest",
    "Guard",
    "LeaseCredential",
    "MalformedSnapshot",
    "Outcome",
    "RecoveryKind",
    "RecoveryRecord",
    "RecoveryRequest",
    "Refusal",
    "RefusalCode",
    "ReleaseRequest",
    "RenewRequest",
    "SafeResumeEvidence",
    "StepRecord",
    "StepRequest",
    "TransitionRecord",
    "Unchanged",
    "UnchangedCode",
    "WaitClosure",
    "WaitKey",
    "WaitRegistration",
    "WaitSpec",
    "WakeReason",
    "WakeRequest",
    "admit",
    "cancel",
    "claim",
    "fenced",
    "finalize",
    "record_step",
    "release",
    "renew",
    "snapshot_problem",
    "wake",
]
