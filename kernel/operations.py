"""Durable operations, as pure decisions.

The durable operations contract (seed 001) describes a durable Operation: one
logical request, admitted under a scoped idempotency identity and executed
by workers as separately recorded Attempts under a lease and a fence, with
approvals, cancellation, limits and three classes of effect.  This module
decides every change of an Operation; ``specs/operations.md`` states the same
rules language-neutrally, with the refusal codes and invariants.

Rules of this module:

- Every public function is a *decision*: it takes immutable snapshots (the
  Operation, and where relevant its stored approval), a request and the
  authoritative time ``now`` (read by the store once, inside the
  transaction, after it locked the Operation's row) and returns exactly one of

  * :class:`Refusal` -- a stable :class:`RefusalCode`, a message naming the
    field or precondition, and no writes;
  * :class:`Unchanged` -- an idempotent repeat (the same submission, the
    same approval decision, a repeated cancellation), with the stored
    Operation, writing nothing;
  * :class:`Decision` -- the Operation's next revision, the Attempt rows to
    write, the approval to store, the transition record and outbox row, and
    the :class:`Guard` the store applies as one compare-and-set.

  Nothing a caller sends makes a decision raise.  A stored Operation whose
  fields contradict its state cannot be made (:func:`operation_problem`);
  one made around its constructor raises
  :class:`~fencekeeper.kernel.errors.InvalidOperation` from every decision
  rather than being decided on.
- Which state follows which is ``machines.OPERATION``'s business; this
  module decides *whether* an event may happen (fences, leases, limits,
  approvals, authority, time), never where it leads.
- The kernel never reads a clock and never makes an identifier: ``now``, the
  new operation id and the worker id are arguments.  Digests are computed
  by the caller (a normalised-input digest is a pure function of the input,
  but the normaliser belongs to the application's action).
- An expired owner is replaced automatically (seed 001, Claims, leases, and
  fencing): the claim that replaces it records the old Attempt ``abandoned``
  *before* it advances the fence, in the same decision.  Executions of seed
  000 quarantine instead; ``specs/protocol.md`` states both policies side by
  side.
- Every write of the Operation is one revision higher, and every decision
  that moves it names the current fence in its guard, so a decision made by
  fence N cannot commit once fence N+1 exists, whatever it decided.
- Stored provenance is never permission: completion and submission take an
  :class:`Authority` fact from a check the caller made against *current*
  facts, and an approval never stands in for it.  That fact answers for
  one principal: one for another than the request acts for (the
  submitter, the canceller, the approver, the Operation's own principal
  on completion) is refused ``not_authorized`` naming
  ``authority.principal``, granted or not.  A submission's authority
  is judged before its identity, so an identity naming the principal's own
  Operation never answers a caller no longer authorized.  Only an external
  success is recorded whatever its authority says: it is the provider's
  answer to a call already issued, no side effect of its own.
- An external effect's record says whether it may have been issued without
  a conclusive answer (``Operation.effect_unsettled_since``, seed 001,
  Tasks, external effects, history, and retention): only an issue whose
  provider answered "failed, not applied" to the Attempt that issued it,
  committed under that Attempt's fence, settles it.  :func:`effect_plan`
  reads it: a settled effect is performed again with the same effect id, an
  unsettled one is reconciled first and never resent blindly.
"""

from __future__ import annotations

import enum
import json
import operator
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs

from .common import IDENTIFIER, duration_problem, identifier_problem, later_problem, shown, utc_problem
from .errors import InvalidOperation
from .machines import OPERATION, OperationEvent, OperationState
from .recovery import MAX_RATIONALE
from .text import problem as text_problem

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_IDENTIFIER_MATCH: Final = IDENTIFIER.fullmatch


class EffectClass(enum.Enum):
    """What an action may do (seed 001: DurableOperationWorker 'and their documented effect-class selection')."""

    ATOMIC = "atomic"
    """Writes only the application's own tables, in the store transaction that completes the Attempt."""
    READ_ONLY = "read_only"
    """Writes nothing besides its result."""
    EXTERNAL = "external"
    """Calls a provider; intent and a stable effect id are committed before the call."""


class EffectPlan(enum.Enum):
    """What an Attempt of an external action must do before it may call the provider (:func:`effect_plan`)."""

    PERFORM = "perform"
    """No issue of the effect can have been applied: no intent was ever recorded, or every issue was answered
    conclusively "not applied".  Call the provider, with the Operation's stable effect id."""
    RECONCILE = "reconcile"
    """An earlier Attempt's issue may have been applied and has no conclusive answer: ask the provider what became
    of it (``reconcile``) before anything is repeated; without an answer, only an idempotent provider is called
    again, and any other ends ``external_outcome_unknown``."""


class TerminalOutcome(enum.Enum):
    """Why a terminal Operation ended.  Values are stable and published in specs/operations.md."""

    SUCCEEDED = "succeeded"
    ACTION_FAILED = "action_failed"
    NOT_AUTHORIZED = "not_authorized"
    APPROVAL_REJECTED = "approval_rejected"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_MISBOUND = "approval_misbound"
    """The claim found no approval that authorizes this Operation (see :func:`claim`): it can never run."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MAX_ATTEMPTS_EXCEEDED = "max_attempts_exceeded"
    CANCELLED = "cancelled"
    EXTERNAL_OUTCOME_UNKNOWN = "external_outcome_unknown"


class AttemptState(enum.Enum):
    """One physical claim's fate.  ``running`` is the only non-final one."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"
    """Its lease expired and a later claim replaced it (or the deadline ended it)."""
    CANCELLED = "cancelled"
    """Cancellation won the Operation's row while it ran; its effect's commit is refused."""
    OUTCOME_UNKNOWN = "outcome_unknown"


class RefusalCode(enum.Enum):
    """Every reason an operation decision can refuse.  Values are stable and published in specs/operations.md."""

    INVALID_REQUEST = "invalid_request"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    OPERATION_NOT_FOUND = "operation_not_found"
    NOT_AUTHORIZED = "not_authorized"
    NOT_ELIGIBLE = "not_eligible"
    NOT_RUNNING = "not_running"
    WORKER_MISMATCH = "worker_mismatch"
    STALE_FENCE = "stale_fence"
    LEASE_EXPIRED = "lease_expired"
    WRONG_EFFECT_CLASS = "wrong_effect_class"
    INTENT_REQUIRED = "intent_required"
    NOT_AWAITING_APPROVAL = "not_awaiting_approval"
    APPROVAL_MISBOUND = "approval_misbound"
    APPROVAL_EXPIRED = "approval_expired"
    SELF_APPROVAL = "self_approval"
    DECISION_CONFLICT = "decision_conflict"
    CANCEL_TOO_LATE = "cancel_too_late"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    MALFORMED_ROW = "malformed_row"
    """Never a decision's: a store's ``claim_next`` names with it a due row it cannot read as an Operation
    (``operation_problem``), which a worker passes over.  Every other request on that row raises the store's
    ``malformed_row`` error instead."""
    ACTION_NOT_REGISTERED = "action_not_registered"
    """Never a decision's: a store's ``claim_next`` names with it a due row whose claim would start an Attempt of an
    action version the claiming worker has not registered.  The claim is rolled back, no Attempt is used, and the
    worker passes over the row; a worker that has the version claims it."""


STORE_REFUSALS: frozenset[RefusalCode] = frozenset({RefusalCode.MALFORMED_ROW, RefusalCode.ACTION_NOT_REGISTERED})
"""Codes no decision of this module returns: a store's answer about a row it cannot read.  The
conformance cases, which hold the kernel's decisions, reach every other code."""


class UnchangedCode(enum.Enum):
    """Why an idempotent repeat wrote nothing (specs/operations.md, Shape of a decision)."""

    SAME_SUBMISSION = "same_submission"
    ALREADY_DECIDED = "already_decided"
    ALREADY_CANCELLED = "already_cancelled"


# --- values -------------------------------------------------------------------------


@attrs.frozen(cache_hash=True)
class Identity:
    """The scoped idempotency identity of a submission (seed 001, Scoped idempotency), as the submitter gave it.

    ``principal`` is the initiating principal's full *reference* (never a
    credential), resolver version included: the Operation keeps it as its
    provenance, and the worker resolves exactly that reference before every
    side effect.  Lookups compare :func:`identity_key`, which leaves the
    version out: the same client key from two principals is two identities,
    and from one principal under two versions of its resolver is one.
    """

    namespace: str
    tenant: str
    principal: str
    client_key: str


@attrs.frozen(cache_hash=True)
class IdentityKey:
    """What a store looks an identity up by and keeps it under: :func:`identity_key` of an :class:`Identity`."""

    namespace: str
    tenant: str
    principal: str
    """:func:`stable_principal` of the submitter's reference."""
    client_key: str


def stable_principal(reference: str) -> str:
    """The part of a principal reference that names the principal, whatever the version of its resolver.

    A reference is ``resolver:vVERSION:subject``; its stable form is
    ``resolver:v*:subject``.  A resolver's new version is a new way to look
    up the same people (seed 001 expects versions to change while work is
    in flight), so ``users:v1:alice`` and ``users:v2:alice`` have one stable
    form.  ``*`` is not a character of any reference (identifiers are
    ``A-Z a-z 0-9 . _ : @ / -``), so no reference is the stable form of
    another; text of another shape is its own stable form.
    """
    if not isinstance(reference, str):
        raise TypeError(f"reference: must be of type str, got {type(reference).__name__}")
    resolver, version, subject = (*reference.split(":", 2), "", "")[:3]
    if version[:1] == "v" and version[1:].isdigit() and version[1:].isascii() and subject:
        return f"{resolver}:v*:{subject}"
    return reference


def identity_key(identity: Identity) -> IdentityKey:
    """The key under which ``identity`` is looked up and stored: every store keys identities by it.

    The namespace, the tenant, the client key and the principal's
    :func:`stable_principal`: a submitter's retry after its resolver moved
    to a new version finds the Operation its first submission admitted
    (seed 001, Scoped idempotency: "the stable initiating-principal
    reference").
    """
    if not isinstance(identity, Identity):
        raise TypeError(f"identity: must be of type Identity, got {type(identity).__name__}")
    return IdentityKey(identity.namespace, identity.tenant, stable_principal(identity.principal), identity.client_key)


@attrs.frozen(cache_hash=True)
class RetryPolicy:
    """Limits, in the names Temporal users know.  All of them survive restart: they are stored on the Operation."""

    initial_interval: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    maximum_interval: timedelta = timedelta(minutes=5)
    maximum_attempts: int = 5
    schedule_to_close: timedelta = timedelta(hours=1)
    """The overall deadline, counted from admission."""

    def backoff(self, attempts_made: int) -> timedelta:
        """The pause after the ``attempts_made``-th failed Attempt: grows by the coefficient, capped."""
        try:
            seconds = self.initial_interval.total_seconds() * self.backoff_coefficient ** max(0, attempts_made - 1)
        except OverflowError:  # past every float after enough failures: capped like any other long pause
            seconds = 10**9
        return min(timedelta(seconds=min(seconds, 10**9)), self.maximum_interval)


@attrs.frozen(cache_hash=True)
class Approval:
    """A durable approval decision, bound to everything seed 001 lists.

    ``consumed_by`` is the Attempt number that consumed it: it is consumed
    once per logical Operation and stays valid for replacement Attempts.
    """

    approval_id: str
    operation_id: str
    input_digest: str
    action_name: str
    action_version: int
    tenant: str
    requester: str
    approver: str
    approved: bool
    expires_at: datetime
    decided_at: datetime
    consumed_by: int | None = None


@attrs.frozen(cache_hash=True)
class Operation:
    """One revision of an Operation.

    ``fence`` counts claims: the *n*-th claim creates Attempt *n* and hands
    out fence *n*; only a credential with the current fence is honoured.
    ``owner``/``lease_expires_at``/``attempt_started_at`` describe the
    current Attempt and are set exactly while the Operation is running.

    A value whose fields contradict its state cannot be made: its
    construction raises :class:`~fencekeeper.kernel.errors.InvalidOperation`
    naming the Operation and the field (:func:`operation_problem` has the
    rules).  Decisions never make one; a store's row can hold one (old code,
    a hand edit, damage), and it is refused as it is read, before any
    decision reasons about it.
    """

    operation_id: str
    identity: Identity
    action_name: str
    action_version: int
    effect_class: EffectClass
    input_digest: str
    state: OperationState
    revision: int
    policy: RetryPolicy
    admitted_at: datetime
    deadline: datetime
    retain_until: datetime
    """The idempotency identity answers with this Operation until then, and no longer."""
    next_eligible_at: datetime
    requires_approval: bool = False
    approval: Approval | None = None
    fence: int = 0
    attempt_count: int = 0
    owner: str | None = None
    lease_expires_at: datetime | None = None
    attempt_started_at: datetime | None = None
    effect_id: str | None = None
    """Set when an external effect's intent is committed; stable for every later Attempt."""
    effect_unsettled_since: int | None = None
    """The fence of the Attempt whose committed intent began the effect's issues without a conclusive answer.

    None: nothing of the effect may have been applied unanswered (no intent yet, every issue answered "not
    applied", or it succeeded).  A later intent keeps the earliest fence, so only the Attempt that began the
    window can settle it (its own issue is then the only one: every other Attempt was fenced before it).  0 is
    an intent recorded before this fact was, which no Attempt can settle.
    """
    outcome: TerminalOutcome | None = None
    error_code: str | None = None
    result: str | None = None
    """The action's result (JSON text), committed with success."""
    cancel_requested_by: str | None = None

    def __attrs_post_init__(self) -> None:
        problem = operation_problem(self)
        if problem is not None:
            raise InvalidOperation(self.operation_id, *problem)


_ENDED_WITH: Final = {
    OperationState.SUCCEEDED: frozenset({TerminalOutcome.SUCCEEDED}),
    OperationState.CANCELLED: frozenset({TerminalOutcome.CANCELLED}),
    OperationState.OUTCOME_UNKNOWN: frozenset({TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN}),
    OperationState.FAILED: frozenset(TerminalOutcome)
    - {TerminalOutcome.SUCCEEDED, TerminalOutcome.CANCELLED, TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN},
}
"""The outcomes each terminal state may end with (specs/operations.md, Terminal outcomes)."""


def operation_problem(operation: Operation) -> tuple[str, str] | None:
    """The first field of ``operation`` that contradicts its state, as ``(field, problem)``; None when all agree.

    The rules every decision keeps (specs/operations.md, Operation):

    - running: an ``owner``, a ``lease_expires_at`` and an
      ``attempt_started_at`` (its current Attempt), a ``fence`` and an
      ``attempt_count`` of at least 1 (a claim made it), no ``outcome``;
    - any other state: none of ``owner``, ``lease_expires_at``,
      ``attempt_started_at`` (no Attempt is current);
    - admitted, awaiting_approval: no ``outcome``; awaiting_approval only
      with ``requires_approval``;
    - a terminal state: an ``outcome`` of that state (``succeeded`` for
      succeeded, ``cancelled`` for cancelled, ``external_outcome_unknown``
      for outcome_unknown, any other for failed);
    - an unsettled external effect (``effect_unsettled_since``) has the
      ``effect_id`` its intent recorded.

    - every field of its type: ``state`` an ``OperationState``, the times
      UTC datetimes, ``revision`` and ``action_version`` at least 1,
      ``fence`` and ``attempt_count`` at least 0 (:func:`_field_problem`).

    Every decision relies on these (a replaced owner's Attempt is written
    from ``owner`` and ``attempt_started_at``), so a value that breaks one
    is never decided on.
    """
    if not _fields_hold(operation):
        found = _field_problem(operation)
        if found is not None:
            return found
    state = operation.state
    if state is OperationState.RUNNING:
        if not operation.owner:
            return "owner", "a running operation names the worker of its current attempt; this one names none"
        if operation.lease_expires_at is None:
            return "lease_expires_at", "a running operation's current attempt holds a lease; this one has none"
        if operation.attempt_started_at is None:
            return "attempt_started_at", "a running operation's current attempt has a start; this one has none"
        if operation.fence < 1:
            return "fence", f"a running operation was claimed, so its fence is at least 1; it is {operation.fence}"
        if operation.attempt_count < 1:
            return "attempt_count", f"a running operation has made an attempt; it counts {operation.attempt_count}"
    else:
        for name, value in (
            ("owner", operation.owner),
            ("lease_expires_at", operation.lease_expires_at),
            ("attempt_started_at", operation.attempt_started_at),
        ):
            if value is not None:
                return name, f"set only while running; this {state.value} operation has {value!s}"
    ended_with = _ENDED_WITH.get(state)
    outcome = operation.outcome
    if ended_with is None:
        if outcome is not None:
            return "outcome", f"a {state.value} operation has not ended, yet it has outcome {outcome.value}"
        if state is OperationState.AWAITING_APPROVAL and not operation.requires_approval:
            return "requires_approval", "an operation awaiting approval requires one; this one does not"
    elif outcome not in ended_with:
        allowed = ", ".join(sorted(t.value for t in ended_with))
        return "outcome", (
            f"a {state.value} operation ends with {allowed}; it has {'none' if outcome is None else outcome.value}"
        )
    if operation.effect_unsettled_since is not None and operation.effect_id is None:
        return "effect_id", "an unsettled external effect has the effect id its intent recorded; this one has none"
    return None


def _stored_value(operation: object) -> None:
    """For the questions that take an Operation, not a decision's ``Operation | None``: None is no answer."""
    if not isinstance(operation, Operation):
        raise TypeError(f"operation: must be of type Operation, got {type(operation).__name__}")
    _stored(operation)


_REQUIRED_TIMES: Final = ("admitted_at", "deadline", "retain_until", "next_eligible_at")
_OPTIONAL_TIMES: Final = ("lease_expires_at", "attempt_started_at")


def _fields_hold(operation: Operation) -> bool:
    """Whether every field is of its type and range: one expression, as every construction asks it."""
    return (
        type(operation.state) is OperationState
        and type(operation.revision) is int
        and operation.revision >= 1
        and type(operation.fence) is int
        and operation.fence >= 0
        and type(operation.attempt_count) is int
        and operation.attempt_count >= 0
        and type(operation.action_version) is int
        and operation.action_version >= 1
        and type(operation.effect_class) is EffectClass
        and type(operation.policy) is RetryPolicy
        and type(operation.identity) is Identity
        and (operation.outcome is None or type(operation.outcome) is TerminalOutcome)
        and (operation.effect_unsettled_since is None or type(operation.effect_unsettled_since) is int)
        and type(operation.admitted_at) is datetime
        and operation.admitted_at.tzinfo is UTC
        and type(operation.deadline) is datetime
        and operation.deadline.tzinfo is UTC
        and type(operation.retain_until) is datetime
        and operation.retain_until.tzinfo is UTC
        and type(operation.next_eligible_at) is datetime
        and operation.next_eligible_at.tzinfo is UTC
        and (operation.lease_expires_at is None or (type(operation.lease_expires_at) is datetime and operation.lease_expires_at.tzinfo is UTC))
        and (operation.attempt_started_at is None or (type(operation.attempt_started_at) is datetime and operation.attempt_started_at.tzinfo is UTC))
    )


def _field_problem(operation: Operation) -> tuple[str, str] | None:
    """The first field not of its type or range, as ``(field, problem)``; behind :func:`_fields_hold`."""
    kinds: tuple[tuple[str, type], ...] = (
        ("state", OperationState),
        ("effect_class", EffectClass),
        ("policy", RetryPolicy),
        ("identity", Identity),
    )
    for name, kind in kinds:
        value = getattr(operation, name)
        if not isinstance(value, kind):
            return name, f"must be of type {kind.__name__}, got {type(value).__name__}"
    if operation.outcome is not None and not isinstance(operation.outcome, TerminalOutcome):
        return "outcome", f"must be of type TerminalOutcome or None, got {type(operation.outcome).__name__}"
    for name, least in (("revision", 1), ("action_version", 1), ("fence", 0), ("attempt_count", 0)):
        value = getattr(operation, name)
        if not isinstance(value, int) or isinstance(value, bool):
            return name, f"must be an integer, got {type(value).__name__}"
        if value < least:
            return name, f"must be at least {least}, got {value}"
    since = operation.effect_unsettled_since
    if since is not None and (not isinstance(since, int) or isinstance(since, bool)):
        return "effect_unsettled_since", f"must be an integer or None, got {type(since).__name__}"
    for name in (*_REQUIRED_TIMES, *_OPTIONAL_TIMES):
        value = getattr(operation, name)
        if value is None and name in _OPTIONAL_TIMES:
            continue
        problem = utc_problem(value)
        if problem is not None:
            return name, problem
    return None


def _stored(operation: Operation | None, argument: str = "operation") -> None:
    """Refuse a stored Operation made around its constructor (``object.__setattr__``, a store of values).

    The constructor refuses every other such value; this check keeps a decision from reasoning about one anyway.
    """
    if operation is not None and not isinstance(operation, Operation):
        raise TypeError(f"{argument}: must be of type Operation or None, got {type(operation).__name__}")
    if operation is not None:
        problem = operation_problem(operation)
        if problem is not None:
            raise InvalidOperation(operation.operation_id, *problem)


@attrs.frozen(cache_hash=True)
class Attempt:
    """One physical Attempt of an Operation: ``number`` is the fence its claim received; written as it starts and ends."""

    operation_id: str
    number: int
    worker_id: str
    state: AttemptState
    started_at: datetime
    ended_at: datetime | None = None
    error_code: str | None = None


@attrs.frozen(cache_hash=True)
class Credential:
    """What a worker presents: the Operation, who it is, and the fence its claim received."""

    operation_id: str
    worker_id: str
    fence: int


@attrs.frozen
class Authority:
    """The result of a check of *current* facts (seed 001, Current authorization) for ``principal``.

    It answers for that principal only: every decision that takes one refuses it when ``principal`` is not the
    principal the request acts for (any version of its resolver being the same principal).
    """

    granted: bool
    principal: str
    reason: str = ""


@attrs.frozen(cache_hash=True)
class Transition:
    """One line of an Operation's history; ``revision`` is the revision it made."""

    operation_id: str
    revision: int
    event: OperationEvent | None
    from_state: OperationState | None
    to_state: OperationState
    at: datetime
    actor: str
    fence: int
    reason: str


@attrs.frozen(cache_hash=True)
class OutboxMessage:
    """Committed with the transition that caused it; ``message_id`` is stable, so consumers can deduplicate."""

    message_id: str
    operation_id: str
    topic: str
    at: datetime


@attrs.frozen(cache_hash=True)
class Guard:
    """The compare-and-set the store applies: all of it holds, or nothing is written.

    ``expected_revision`` 0 means no Operation may exist under this id.
    ``expected_holder`` (submissions only) is the Operation id the identity
    must name at commit (None: the identity must be free), so two identical
    submissions racing each other create one Operation; a store finds the
    identity by its :func:`identity_key`, so that holds for two submissions
    under two versions of the principal's resolver too.  ``live_until`` asks
    the store to check, with its own time at commit, that the lease it names
    has not expired since the decision.
    """

    operation_id: str
    expected_revision: int
    expected_fence: int
    identity: Identity | None = None
    expected_holder: str | None = None
    live_until: datetime | None = None

    def holds(self, operation: Operation | None, holder: str | None, now: datetime) -> bool:
        """Whether the store may apply the decision (the reference semantics every store implements)."""
        if self.identity is not None and holder != self.expected_holder:
            return False
        if self.live_until is not None and not now < self.live_until:
            return False
        if operation is None:
            return self.expected_revision == 0
        return operation.revision == self.expected_revision and operation.fence == self.expected_fence


@attrs.frozen(cache_hash=True)
class Decision:
    """Everything one decision writes, together, under ``guard``."""

    guard: Guard
    operation: Operation
    transition: Transition
    attempts: tuple[Attempt, ...] = ()
    """Attempt rows to write, in order (an abandoned one before its replacement)."""
    outbox: tuple[OutboxMessage, ...] = ()
    credential: Credential | None = None
    """Set by a claim: what the claiming worker presents from now on."""


@attrs.frozen
class Refusal:
    """No writes: a stable code, a message naming the field or precondition, and ``field`` where one field is at fault.

    Always for ``invalid_request``; for another code where the request
    names the fault (``not_authorized`` naming ``authority.principal``: an
    answer for another principal).  Which codes carry one is in
    specs/conformance.md (``operations``).
    """

    code: RefusalCode
    message: str
    field: str | None = None


@attrs.frozen
class Unchanged:
    """An idempotent repeat: nothing is written, and ``operation`` is the Operation as stored."""

    code: UnchangedCode
    message: str
    operation: Operation


Outcome = Decision | Refusal | Unchanged


# --- requests -------------------------------------------------------------------------


@attrs.frozen
class SubmitRequest:
    """Admit an Operation under a scoped idempotency identity (decided by :func:`submit`)."""

    operation_id: str
    """Fresh, made by the caller; used only if the identity is new."""
    identity: Identity
    action_name: str
    action_version: int
    effect_class: EffectClass
    input_digest: str
    authority: Authority
    policy: RetryPolicy = RetryPolicy()
    retention: timedelta = timedelta(days=1)
    """The idempotency window: how long the identity answers with this Operation."""
    requires_approval: bool = False
    earlier_input_digest: str | None = None
    """The digest earlier releases gave this input, set only when it differs from ``input_digest``.

    Before numbers were made canonical, ``1.0`` and ``-0.0`` were digested as written; an Operation admitted
    then under this digest is this submission's, so its faithful retry is not a conflict after an upgrade
    (specs/operations.md, "Equal input").  Never stored: a new Operation has ``input_digest``.
    """


@attrs.frozen
class ClaimRequest:
    """A worker's claim of the next Attempt, for ``lease_duration`` from now (:func:`claim`)."""

    worker_id: str
    lease_duration: timedelta


@attrs.frozen
class HeartbeatRequest:
    """Extend the current owner's lease by ``lease_duration`` from now (:func:`heartbeat`)."""

    credential: Credential
    lease_duration: timedelta


@attrs.frozen
class IntentRequest:
    """Commit an external effect's intent and its stable effect id before the provider is called (:func:`record_intent`)."""

    credential: Credential


@attrs.frozen
class CompleteRequest:
    """The owner's success, with a current authority and the result as JSON text (:func:`complete`)."""

    credential: Credential
    authority: Authority
    result: str = "null"


@attrs.frozen
class FailRequest:
    """The owner's failure of its Attempt: retried while Attempts are left if ``retryable``, else final (:func:`fail`)."""

    credential: Credential
    error_code: str
    retryable: bool
    not_authorized: bool = False
    """The failure is a current-authorization denial: it fails closed, whatever ``retryable`` says."""
    effect_not_applied: bool = False
    """External effects: the provider answered this Attempt's own call conclusively, "failed, not applied".

    Never for a lost reply, a timeout, an exception or a reconciliation: those leave the effect unsettled.
    """


@attrs.frozen
class UnknownRequest:
    """An external effect whose result is ambiguous and could not be reconciled."""

    credential: Credential
    detail: str = ""
    """Kept in the transition's reason: text a store can keep, at most ``MAX_RATIONALE`` characters."""


@attrs.frozen
class DecideRequest:
    """An approver's decision, bound to the exact Operation, input, action, tenant and expiry (:func:`decide`)."""

    approval_id: str
    operation_id: str
    input_digest: str
    action_name: str
    action_version: int
    tenant: str
    approver: str
    approved: bool
    expires_at: datetime
    authority: Authority


@attrs.frozen
class CancelRequest:
    """Cancel an Operation, with the canceller's current authority and an optional reason (:func:`cancel`)."""

    operation_id: str
    principal: str
    authority: Authority
    reason: str = ""


# --- input validation -------------------------------------------------------------------


class _Invalid(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.refusal = Refusal(RefusalCode.INVALID_REQUEST, f"{field}: {problem}", field)


def _check(field: str, problem: str | None) -> None:
    if problem is not None:
        raise _Invalid(field, problem)


def _check_id(field: str, value: object) -> None:
    # The common case (a well-formed str) without two calls more; anything else is judged by identifier_problem.
    if type(value) is str and _IDENTIFIER_MATCH(value):
        return
    _check(field, identifier_problem(value))


def _check_request(value: object, kind: type) -> None:
    # The request itself, before any of its fields is read: a None or a
    # request of another decision is refused, not an AttributeError.
    if not isinstance(value, kind):
        raise _Invalid("request", f"must be of type {kind.__name__}, got {type(value).__name__}")


def _check_positive(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _Invalid(field, f"must be a positive integer, got {shown(value)}")


def _check_digest(field: str, value: object) -> None:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise _Invalid(field, "must be a sha-256 digest in lower-case hex (64 characters)")


def _check_authority(field: str, value: object) -> None:
    if not isinstance(value, Authority):
        raise _Invalid(field, "must be an Authority fact")
    if not isinstance(value.granted, bool):
        raise _Invalid(f"{field}.granted", f"must be true or false, got {shown(value.granted)}")
    _check_id(f"{field}.principal", value.principal)


def _check_credential(value: object) -> None:
    if not isinstance(value, Credential):
        raise _Invalid("credential", "must be a Credential")
    _check_id("credential.operation_id", value.operation_id)
    _check_id("credential.worker_id", value.worker_id)
    _check_positive("credential.fence", value.fence)


def _check_policy(value: object) -> None:
    if not isinstance(value, RetryPolicy):
        raise _Invalid("policy", "must be a RetryPolicy")
    _check("policy.initial_interval", duration_problem(value.initial_interval))
    _check("policy.maximum_interval", duration_problem(value.maximum_interval))
    _check("policy.schedule_to_close", duration_problem(value.schedule_to_close))
    _check_positive("policy.maximum_attempts", value.maximum_attempts)
    coefficient = value.backoff_coefficient
    if not isinstance(coefficient, int | float) or isinstance(coefficient, bool) or not 1 <= coefficient <= 100:
        raise _Invalid("policy.backoff_coefficient", f"must be a number from 1 to 100, got {shown(coefficient)}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# NaN and the infinities are Python's extension of JSON; a store reads a result back as JSON without them.
_RESULT_JSON: Final = json.JSONDecoder(parse_constant=_no_constant)

MAX_RESULT_DEPTH: Final = 32
"""How deeply a result may nest, each array or object a level: the bound of an Event payload and an object input.

A reader in any language reads a result this deep (specs/operations.md, "Well-formed requests"); past some depth
of its own each one fails, at a depth no two of them share, and Python's decoder at its recursion limit.
"""

# A JSON string (its escapes included) or a bracket: what the depth of a text is counted from, strings skipped.
_RESULT_TOKEN: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def result_depth_problem(text: str) -> str | None:
    """Whether the JSON text ``text`` nests deeper than :data:`MAX_RESULT_DEPTH` levels, counted without recursion.

    Counted before the text is decoded, so the decoder never goes deeper than the bound.  On JSON text the count
    is exact; on text that is not JSON it may differ from the decoder's, which refuses that text in any case.
    """
    depth = 0
    for token in _RESULT_TOKEN.finditer(text):
        bracket = token.group()
        if bracket in ("[", "{"):
            depth += 1
            if depth > MAX_RESULT_DEPTH:
                return f"must be JSON text nested at most {MAX_RESULT_DEPTH} levels deep"
        elif bracket in ("]", "}"):
            depth -= 1
    return None


def _json_text_problem(text: str) -> str | None:
    """Why ``text`` is no result a store can keep and read back as JSON, or None."""
    unstorable = text_problem(text) or result_depth_problem(text)
    if unstorable is not None:
        return unstorable
    try:
        _RESULT_JSON.decode(text)
    except ValueError as exc:  # json.JSONDecodeError is one
        return f"must be JSON text: {exc}"
    return None


def _check_now(now: object) -> None:
    _check("now", utc_problem(now))


def _same_principal(one: str, other: str) -> bool:
    """Whether two principal references name one principal: the same resolver and subject, whatever the version.

    A resolver's new version is a new way to look up the same people, so
    ``users:v2:alice`` may not approve what ``users:v1:alice`` requested
    (:func:`stable_principal`, the same rule idempotency keys by).
    """
    return stable_principal(one) == stable_principal(other)


def _misbound_authority(authority: Authority, principal: str, whom: str) -> Refusal | None:
    """``not_authorized`` naming ``authority.principal`` when the authority answers for another principal than ``principal``.

    An authority is the result of a check of current facts *for one principal* (seed 001, Current
    authorization: "resolves a current Principal, verifies the immutable provenance binding, and rechecks"); a
    granted answer for someone else says nothing of ``principal``, so it authorizes nothing, and is refused before
    it is read as granted or denied.  One principal under another version of its resolver is the same principal
    (:func:`_same_principal`), as the approver's check and the idempotency key say.
    """
    if _same_principal(authority.principal, principal):
        return None
    return Refusal(
        RefusalCode.NOT_AUTHORIZED,
        f"authority.principal: the authority answers for {authority.principal!r}, not for {whom} {principal!r}; "
        "an answer for another principal authorizes nothing",
        "authority.principal",
    )


_ADMITTED_STATE: Final = OPERATION.initial[0]
"""The state a new Operation starts in (the machine's first initial state; ``initial`` builds its tuple anew)."""
_IDENTITY_FIELDS: Final = tuple((f"identity.{name}", name) for name in ("namespace", "tenant", "principal", "client_key"))

_OPERATION_FIELDS: Final = tuple(field.name for field in attrs.fields(Operation))
_OPERATION_POSITIONS: Final = {name: position for position, name in enumerate(_OPERATION_FIELDS)}
_OPERATION_VALUES: Final = operator.attrgetter(*_OPERATION_FIELDS)
"""Every field of an Operation, in order, in one call (a getattr per field costs several times more)."""


def _evolve(operation: Operation, changes: dict[str, Any]) -> Operation:
    """``attrs.evolve`` for an Operation, without its per-call introspection of the class.

    Every decision makes a new revision, and this is the most frequent step of
    a worker's pass; the result is the same value ``attrs.evolve`` gives (the
    class's own ``__init__`` builds it), and an unknown field is an error.
    """
    values = list(_OPERATION_VALUES(operation))
    for name, value in changes.items():
        position = _OPERATION_POSITIONS.get(name)
        if position is None:
            raise TypeError(f"Operation has no field {name!r}")
        values[position] = value
    return Operation(*values)


# --- helpers ----------------------------------------------------------------------------


def _iso(value: datetime | None) -> str:
    return "never" if value is None else value.isoformat()


def _guard(operation: Operation, *, live: bool = False, event: OperationEvent | None = None) -> Guard:
    return Guard(
        operation.operation_id,
        operation.revision,
        operation.fence,
        live_until=(operation.lease_expires_at if event is None else _live_until(operation, event)) if live else None,
    )


def _begins_effect(operation: Operation, event: OperationEvent) -> bool:
    """Whether a commit of ``event`` starts the Operation's effect: an external intent, or an atomic success.

    Neither may commit from the overall deadline on (seed 001, Approval, cancellation, and limits: the deadline
    is a limit that survives restart; specs/operations.md, "The overall deadline and effects").  An external
    call's answer, a failure, an unknown outcome and a read-only result start nothing and stay allowed.
    """
    if event is OperationEvent.RECORD_INTENT:
        return True
    return event is OperationEvent.SUCCEED and operation.effect_class is EffectClass.ATOMIC


def _live_until(operation: Operation, event: OperationEvent) -> datetime | None:
    """The guard's ``live_until`` for an owner's decision: the lease, and for one that starts an effect the deadline.

    Judged again at commit with the store's own time, so a decision made just before the deadline that commits
    after it (an atomic action that ran past it) writes nothing.
    """
    lease = operation.lease_expires_at
    if lease is not None and _begins_effect(operation, event):
        return min(lease, operation.deadline)
    return lease


def commit_refusal(decision: Decision, now: datetime) -> Refusal | None:
    """The refusal a store answers when ``decision``'s guard ``live_until`` has passed at its commit, ``now``.

    None while it holds.  ``deadline_exceeded`` for a decision that starts an effect (an external intent, an
    atomic success) once the overall deadline has come, else ``lease_expired``: deciding again at ``now``
    gives the same code.
    """
    if not isinstance(decision, Decision):
        raise TypeError(f"decision: must be of type Decision, got {type(decision).__name__}")
    problem = utc_problem(now)
    if problem is not None:
        raise (TypeError if not isinstance(now, datetime) else ValueError)(f"now: {problem}")
    live = decision.guard.live_until
    if live is None or now < live:
        return None
    after, event = decision.operation, decision.transition.event
    if event is not None and _begins_effect(after, event) and now >= after.deadline:
        return _past_deadline(after, now, event)
    return Refusal(
        RefusalCode.LEASE_EXPIRED, f"the lease expired at {live.isoformat()} before the commit at {now.isoformat()}"
    )


def _past_deadline(operation: Operation, now: datetime, event: OperationEvent) -> Refusal:
    what = "an external effect's intent" if event is OperationEvent.RECORD_INTENT else "an atomic action's effect"
    return Refusal(
        RefusalCode.DEADLINE_EXCEEDED,
        f"the deadline {_iso(operation.deadline)} has passed (now {_iso(now)}): {what} may not begin",
    )


def _unanswered(operation: Operation) -> bool:
    """Whether the Operation's external effect has an issued call no conclusive answer settled.

    Such an Operation never ends by its deadline as if nothing had happened (seed 001, Tasks, external
    effects, history, and retention: "An unreconcilable ambiguous result becomes external_outcome_unknown"):
    a claim gives a worker the chance to ask the provider, and whatever ends it without an answer ends it
    ``external_outcome_unknown`` (specs/operations.md, "The overall deadline and effects").
    """
    return operation.effect_class is EffectClass.EXTERNAL and operation.effect_unsettled_since is not None


def _issued_note(operation: Operation) -> str:
    """What an ending's reason says of an issued, unanswered call, as a cancellation's reason does."""
    since = operation.effect_unsettled_since
    by = "before its attempt was recorded" if since == 0 else f"by attempt {since}"
    return f"external effect {operation.effect_id} was issued {by} and never answered; it is not resent"


def _outbox(operation: Operation, now: datetime) -> tuple[OutboxMessage, ...]:
    """Every transition gets one outbox message, committed with it; its id is the revision the transition made."""
    return (
        OutboxMessage(
            f"{operation.operation_id}/{operation.revision}",
            operation.operation_id,
            f"operation.{operation.state.value}",
            now,
        ),
    )


def _move(
    operation: Operation,
    event: OperationEvent,
    *,
    now: datetime,
    actor: str,
    reason: str,
    changes: dict[str, Any] | None = None,
    keep_owner: bool = False,
) -> tuple[Operation, Transition]:
    """The Operation after ``event``: the table decides the state; the owner survives only a move that keeps it.

    ``changes`` are the decision's own fields on top of that move, made in the
    same new revision (one construction, not one per step).
    """
    state = OPERATION.step(operation.state, event)
    kept = keep_owner and state is OperationState.RUNNING
    fields: dict[str, Any] = {
        "state": state,
        "revision": operation.revision + 1,
        "owner": operation.owner if kept else None,
        "lease_expires_at": operation.lease_expires_at if kept else None,
        "attempt_started_at": operation.attempt_started_at if kept else None,
    }
    if changes is not None:
        fields.update(changes)
    moved = _evolve(operation, fields)
    record = Transition(
        operation.operation_id,
        moved.revision,
        event,
        operation.state,
        moved.state,
        now,
        actor,
        moved.fence,
        reason,
    )
    return moved, record


def _decision(
    before: Operation,
    after: Operation,
    record: Transition,
    now: datetime,
    *,
    live: bool = False,
    attempts: tuple[Attempt, ...] = (),
    credential: Credential | None = None,
) -> Decision:
    return Decision(
        guard=_guard(before, live=live, event=record.event),
        operation=after,
        transition=record,
        attempts=attempts,
        outbox=_outbox(after, now),
        credential=credential,
    )


def _end_attempt(operation: Operation, state: AttemptState, now: datetime, error_code: str | None = None) -> Attempt:
    """The current Attempt, ended.  Only for a running Operation (it has an owner and a start)."""
    if operation.owner is None or operation.attempt_started_at is None:
        # Unreachable for a value the constructor accepted: named, in case one was made around it.
        field = "owner" if operation.owner is None else "attempt_started_at"
        raise InvalidOperation(operation.operation_id, field, "a running operation's current attempt has one")
    return Attempt(
        operation.operation_id,
        operation.fence,
        operation.owner,
        state,
        operation.attempt_started_at,
        now,
        error_code,
    )


def _refuse_missing(operation: Operation | None, operation_id: str) -> Refusal | None:
    _stored(operation)
    if operation is None:
        return Refusal(RefusalCode.OPERATION_NOT_FOUND, f"operation {operation_id!r} does not exist")
    if operation.operation_id != operation_id:
        return Refusal(
            RefusalCode.OPERATION_NOT_FOUND,
            f"the snapshot is of {operation.operation_id!r}, the request names {operation_id!r}",
        )
    return None


def check_owner(operation: Operation | None, credential: Credential, now: datetime) -> Refusal | None:
    """Whether ``credential`` is the Operation's current owner at ``now``: None, or the first failing check.

    The order (specs/operations.md, Owner checks): does it exist, is the
    fence current, does it run, is it this worker, is the lease live.  A
    fence that is not current is refused as ``stale_fence`` whatever else holds:
    once fence N+1 exists, N can do nothing (seed 001, Claims, leases, and
    fencing).  The guarded atomic context asks this before it lets the
    action's writes commit.  A malformed credential or ``now`` is
    ``invalid_request`` naming it, as a decision refuses it.
    """
    try:
        _check_credential(credential)
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    return _owner_refusal(operation, credential, now)


def _owner_refusal(operation: Operation | None, credential: Credential, now: datetime) -> Refusal | None:
    """:func:`check_owner` for a credential and a time a decision has already checked."""
    refusal = _refuse_missing(operation, credential.operation_id)
    if refusal is not None or operation is None:
        return refusal
    if credential.fence != operation.fence:
        return Refusal(
            RefusalCode.STALE_FENCE,
            f"credential carries fence {credential.fence}, current fence is {operation.fence}",
        )
    if operation.state is not OperationState.RUNNING:
        return Refusal(RefusalCode.NOT_RUNNING, f"operation is {operation.state.value}, not running")
    if operation.owner != credential.worker_id:
        return Refusal(
            RefusalCode.WORKER_MISMATCH, f"attempt {operation.fence} is owned by {operation.owner!r}"
        )
    if operation.lease_expires_at is None or now >= operation.lease_expires_at:
        return Refusal(
            RefusalCode.LEASE_EXPIRED,
            f"lease expired at {_iso(operation.lease_expires_at)}; now is {_iso(now)}",
        )
    return None


# --- decisions ----------------------------------------------------------------------------


def submit(existing: Operation | None, request: SubmitRequest, now: datetime) -> Outcome:
    """Admission under a scoped idempotency identity (seed 001, Scoped idempotency).

    ``existing`` is the Operation the identity names, if any: the store
    looks it up by :func:`identity_key`, so it may have been admitted under
    another version of the principal's resolver, and it keeps that
    reference as its provenance (an identical resubmission is answered with
    it unchanged; the worker resolves the reference it was admitted under).  Within its
    window an identical submission (same action name, version and
    normalised-input digest, or the ``earlier_input_digest`` an Operation
    admitted before numbers were canonical holds) is the same Operation; anything else under the
    identity is a deterministic ``idempotency_conflict``.  After the window,
    once its Operation has ended, the identity is free again and names the
    new Operation; an Operation still active keeps its identity.

    The authority is judged before the identity is: a caller whose current
    authority is not granted is refused ``not_authorized`` exactly as a new
    submission would be, whatever the identity names.  The identity carries
    the principal's reference, which is stored provenance, never
    permission; answering with the Operation (or with a conflict naming it)
    would give its state to a caller no longer authorized to query it
    (seed 001, Durable truth and recovery; Current authorization).
    """
    try:
        _check_request(request, SubmitRequest)
        _check_id("operation_id", request.operation_id)
        if not isinstance(request.identity, Identity):
            raise _Invalid("identity", "must be an Identity")
        for field, name in _IDENTITY_FIELDS:
            _check_id(field, getattr(request.identity, name))
        _check_id("action_name", request.action_name)
        _check_positive("action_version", request.action_version)
        if not isinstance(request.effect_class, EffectClass):
            raise _Invalid("effect_class", f"must be one of {[e.value for e in EffectClass]}")
        _check_digest("input_digest", request.input_digest)
        if request.earlier_input_digest is not None:
            _check_digest("earlier_input_digest", request.earlier_input_digest)
        _check_authority("authority", request.authority)
        _check_policy(request.policy)
        _check("retention", duration_problem(request.retention))
        if not isinstance(request.requires_approval, bool):
            raise _Invalid("requires_approval", "must be true or false")
        _check_now(now)
        _check("policy.schedule_to_close", later_problem(now, request.policy.schedule_to_close))
        _check("retention", later_problem(now, request.retention))
    except _Invalid as exc:
        return exc.refusal
    misbound = _misbound_authority(request.authority, request.identity.principal, "the submitter")
    if misbound is not None:
        return misbound
    if not request.authority.granted:
        why = f": {request.authority.reason}" if request.authority.reason else ""
        return Refusal(RefusalCode.NOT_AUTHORIZED, f"{request.authority.principal!r} may not submit{why}")
    _stored(existing, "existing")
    if existing is not None and (now < existing.retain_until or existing.outcome is None):
        differs = [
            (name, getattr(existing, name), getattr(request, name))
            for name in ("action_name", "action_version", "input_digest")
            if getattr(existing, name) != getattr(request, name)
            and not (name == "input_digest" and existing.input_digest == request.earlier_input_digest)
        ]
        if differs:
            name, stored, given = differs[0]
            return Refusal(
                RefusalCode.IDEMPOTENCY_CONFLICT,
                f"the idempotency key {request.identity.client_key!r} already names operation "
                f"{existing.operation_id!r} with {name} {stored!r}; this submission has {given!r}",
                name,
            )
        return Unchanged(
            UnchangedCode.SAME_SUBMISSION,
            f"identical to the submission that admitted {existing.operation_id!r}",
            existing,
        )
    operation = Operation(
        operation_id=request.operation_id,
        identity=request.identity,
        action_name=request.action_name,
        action_version=request.action_version,
        effect_class=request.effect_class,
        input_digest=request.input_digest,
        state=_ADMITTED_STATE,
        revision=1,
        policy=request.policy,
        admitted_at=now,
        deadline=now + request.policy.schedule_to_close,
        retain_until=now + max(request.retention, request.policy.schedule_to_close),
        next_eligible_at=now,
        requires_approval=request.requires_approval,
    )
    event = None
    if request.requires_approval:
        event = OperationEvent.REQUIRE_APPROVAL
        operation = _evolve(operation, {"state": OPERATION.step(operation.state, event)})
    record = Transition(
        operation.operation_id, 1, event, None, operation.state, now, request.identity.principal, 0, "admitted"
    )
    guard = Guard(
        request.operation_id,
        0,
        0,
        identity=request.identity,
        expected_holder=existing.operation_id if existing is not None else None,
    )
    return Decision(guard=guard, operation=operation, transition=record, outbox=_outbox(operation, now))


def expire(operation: Operation | None, now: datetime, actor: str = "system:deadline") -> Outcome:
    """End an Operation whose overall deadline has passed, naming the limit (seed 001: limits survive restart).

    A running Operation is ended only once its owner's lease has expired
    too: a live owner keeps its chance to record the answer to a call it
    began before the deadline, or to end its Attempt, before the sweep
    fences it.  It can begin no effect meanwhile: an intent and an atomic
    success are refused from the deadline on (:func:`record_intent`,
    :func:`complete`), and its retryable failure ends the Operation
    ``deadline_exceeded`` at once (:func:`fail`).

    An external effect with an issued call no conclusive answer settled
    (``effect_unsettled_since``) ends ``external_outcome_unknown`` instead,
    its reason saying so: the sweep cannot ask the provider and nothing may
    repeat the call past the deadline, so the result is ambiguous and
    unreconciled, never a deadline missed with nothing done.
    """
    try:
        # The actor is the transition's recorded actor, as a worker's or principal's id is elsewhere.
        _check_id("actor", actor)
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    if operation is None:
        return Refusal(RefusalCode.OPERATION_NOT_FOUND, "no such operation")
    _stored(operation)
    if now < operation.deadline:
        return Refusal(RefusalCode.NOT_ELIGIBLE, f"deadline is {_iso(operation.deadline)}; now is {_iso(now)}")
    state = operation.state
    outcome = TerminalOutcome.DEADLINE_EXCEEDED
    if state is OperationState.AWAITING_APPROVAL:
        event, outcome = OperationEvent.APPROVAL_EXPIRED, TerminalOutcome.APPROVAL_EXPIRED
    elif state is OperationState.ADMITTED:
        event = OperationEvent.DEADLINE_EXCEEDED
    elif state is OperationState.RUNNING:
        if operation.lease_expires_at is not None and now < operation.lease_expires_at:
            return Refusal(RefusalCode.NOT_ELIGIBLE, f"owner's lease is live until {_iso(operation.lease_expires_at)}")
        event = OperationEvent.DEADLINE_EXCEEDED
    else:
        return Refusal(RefusalCode.NOT_ELIGIBLE, f"operation is already {state.value}")
    attempts = (_end_attempt(operation, AttemptState.ABANDONED, now, "lease_expired"),) if operation.owner else ()
    reason = f"deadline {_iso(operation.deadline)} passed"
    if event is OperationEvent.DEADLINE_EXCEEDED and _unanswered(operation):
        # No one asked the provider, and past the deadline no call may be repeated: the result is ambiguous
        # and cannot be reconciled here, which the seed names external_outcome_unknown, not a missed deadline.
        event, outcome = OperationEvent.OUTCOME_UNKNOWN, TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
        reason += f"; {_issued_note(operation)}: its outcome is unknown"
    after, record = _move(
        operation,
        event,
        now=now,
        actor=actor,
        reason=reason,
        changes={"outcome": outcome, "error_code": outcome.value},
    )
    return _decision(operation, after, record, now, attempts=attempts)


def claim(operation: Operation | None, request: ClaimRequest, now: datetime) -> Outcome:
    """Create the next Attempt, advance the fence and set one owner, atomically (seed 001, Claims, leases, and fencing).

    Claimable: an admitted Operation whose next eligibility has come, or a
    running one whose owner's lease has expired.  The latter is replaced
    automatically: its Attempt is recorded ``abandoned`` first, in the same
    decision.  Past the deadline (whatever its next eligibility says), or
    with every Attempt used, the claim ends the Operation with the named
    limit instead of creating an Attempt, with one exception: past the
    deadline, an external effect with an issued, unanswered call and an
    Attempt left gets that Attempt, so that a worker may ask the provider
    (a look, not an effect: its intent is refused) and record the answer;
    with none left it ends ``external_outcome_unknown`` as :func:`expire`
    decides, and so does a replacement that finds every Attempt used
    while such a call is unanswered (no Attempt is left to look with).

    An Operation that needs an approval and holds none that authorizes it
    (none, a rejection, one bound to another Operation, input, action,
    tenant or requester, or the requester's own) ends ``approval_misbound``:
    ``decide`` never stores such an approval and refuses every decision once
    one is stored, so it can never become usable, and a refusal here would
    leave the Operation due and first in its tenant's queue for good.  So a
    claim of an Operation :func:`due` says is due never refuses: it creates
    an Attempt or ends the Operation.  Such an approval can follow an issued
    call only in a row no decision of this module wrote (one an earlier
    release consumed, an edited one): with that call unanswered the claim
    ends it ``external_outcome_unknown`` instead, its ``error_code``
    ``approval_misbound``, as every other ending of an unanswered call.
    """
    try:
        _check_request(request, ClaimRequest)
        _check_id("worker_id", request.worker_id)
        _check("lease_duration", duration_problem(request.lease_duration))
        _check_now(now)
        _check("lease_duration", later_problem(now, request.lease_duration))
    except _Invalid as exc:
        return exc.refusal
    if operation is None:
        return Refusal(RefusalCode.OPERATION_NOT_FOUND, "no such operation")
    _stored(operation)
    state = operation.state
    if state is OperationState.RUNNING:
        if operation.lease_expires_at is not None and now < operation.lease_expires_at:
            return Refusal(
                RefusalCode.NOT_ELIGIBLE,
                f"attempt {operation.fence} is owned by {operation.owner!r} until {_iso(operation.lease_expires_at)}",
            )
    elif state is OperationState.ADMITTED:
        # Past the deadline it is due (``due``) and ends, even if its next eligibility lies beyond the deadline.
        if now < operation.next_eligible_at and now < operation.deadline:
            return Refusal(RefusalCode.NOT_ELIGIBLE, f"eligible only from {_iso(operation.next_eligible_at)}")
    elif state is OperationState.AWAITING_APPROVAL and now >= operation.deadline:
        return expire(operation, now, request.worker_id)
    else:
        return Refusal(RefusalCode.NOT_ELIGIBLE, f"operation is {state.value}; only admitted work can be claimed")
    # Past the deadline an issued, unanswered call gets an Attempt that can only look (its intent is refused
    # deadline_exceeded): asking the provider is no new effect, and its answer is what the record must say.
    look = now >= operation.deadline and _unanswered(operation)
    if look and state is OperationState.RUNNING and operation.attempt_count >= operation.policy.maximum_attempts:
        look = False  # no Attempt is left to look with: expire ends it external_outcome_unknown
    if now >= operation.deadline and not look:
        return expire(operation, now, request.worker_id)
    abandoned: tuple[Attempt, ...] = ()
    if state is OperationState.RUNNING:
        abandoned = (_end_attempt(operation, AttemptState.ABANDONED, now, "lease_expired"),)
        if operation.attempt_count >= operation.policy.maximum_attempts:
            event, outcome = OperationEvent.FAIL, TerminalOutcome.MAX_ATTEMPTS_EXCEEDED
            reason = f"attempt {operation.fence} abandoned and all {operation.attempt_count} attempts are used"
            if _unanswered(operation):
                # No Attempt is left to ask the provider with, and none may repeat the call: the limit would say
                # nothing happened while the call may have been applied, the seed's ambiguous result.
                event, outcome = OperationEvent.OUTCOME_UNKNOWN, TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
                reason += f"; {_issued_note(operation)}: its outcome is unknown"
            after, record = _move(
                operation,
                event,
                now=now,
                actor=request.worker_id,
                reason=reason,
                changes={"outcome": outcome, "error_code": outcome.value},
            )
            return _decision(operation, after, record, now, attempts=abandoned)
    approval = operation.approval
    if operation.requires_approval:
        # The table only lets an approved Operation become admitted; this checks its expiry and binding.
        flaw = _approval_flaw(operation)
        if flaw is not None:
            event, outcome = OperationEvent.APPROVAL_MISBOUND, TerminalOutcome.APPROVAL_MISBOUND
            reason = (f"attempt {operation.fence} abandoned; " if abandoned else "") + f"{flaw}: it can never run"
            if _unanswered(operation):
                # An approval an earlier release consumed (or an edited row) let an Attempt issue the call; the
                # approval authorizes no Attempt now, so none is left to ask the provider with, and the ending must
                # not say nothing happened while the call may have been applied: the seed's ambiguous result.
                event, outcome = OperationEvent.OUTCOME_UNKNOWN, TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
                reason += f"; {_issued_note(operation)}: its outcome is unknown"
            after, record = _move(
                operation,
                event,
                now=now,
                actor=request.worker_id,
                reason=reason,
                # The code still names what ended it, as a failure's does.
                changes={"outcome": outcome, "error_code": "approval_misbound"},
            )
            return _decision(operation, after, record, now, attempts=abandoned)
        assert approval is not None
        if approval.consumed_by is None:
            if now >= approval.expires_at:
                after, record = _move(
                    operation,
                    OperationEvent.APPROVAL_EXPIRED,
                    now=now,
                    actor=request.worker_id,
                    reason=f"approval {approval.approval_id!r} expired at {_iso(approval.expires_at)} unused",
                    changes={"outcome": TerminalOutcome.APPROVAL_EXPIRED, "error_code": "approval_expired"},
                )
                return _decision(operation, after, record, now)
            approval = attrs.evolve(approval, consumed_by=operation.fence + 1)
    fence = operation.fence + 1
    event = OperationEvent.RECLAIM_EXPIRED if state is OperationState.RUNNING else OperationEvent.CLAIM
    expires = now + request.lease_duration
    reason = (
        f"attempt {operation.fence} abandoned (lease expired {_iso(operation.lease_expires_at)}); attempt {fence}"
        if abandoned
        else f"attempt {fence}"
    )
    if approval is not None and approval is not operation.approval:
        # The consumption is a change of this revision like the fence: history says which approval it was.
        reason += f"; approval {approval.approval_id} by {approval.approver} consumed"
    if look:
        reason += (
            f"; the deadline {_iso(operation.deadline)} has passed and {_issued_note(operation)}: "
            "this attempt may only ask the provider"
        )
    after, record = _move(
        operation,
        event,
        now=now,
        actor=request.worker_id,
        reason=reason,
        changes={
            "fence": fence,
            "attempt_count": operation.attempt_count + 1,
            "owner": request.worker_id,
            "lease_expires_at": expires,
            "attempt_started_at": now,
            "approval": approval,
        },
    )
    started = Attempt(operation.operation_id, fence, request.worker_id, AttemptState.RUNNING, now)
    return _decision(
        operation,
        after,
        record,
        now,
        attempts=(*abandoned, started),
        credential=Credential(operation.operation_id, request.worker_id, fence),
    )


def _approval_flaw(operation: Operation) -> str | None:
    """Why the stored approval does not authorize this Operation, or None when it does (its expiry aside)."""
    approval = operation.approval
    if approval is None:
        return "the operation needs an approval and holds none"
    if not approval.approved:
        return f"approval {approval.approval_id!r} is a rejection"
    bound = (
        approval.operation_id == operation.operation_id
        and approval.input_digest == operation.input_digest
        and approval.action_name == operation.action_name
        and approval.action_version == operation.action_version
        and approval.tenant == operation.identity.tenant
        and approval.requester == operation.identity.principal
        # The same principal under another version of its resolver is still the requester, as decide says.
        and not _same_principal(approval.approver, approval.requester)
    )
    if not bound:
        return f"approval {approval.approval_id!r} is not bound to this operation"
    if operation.state is OperationState.RUNNING and approval.consumed_by is None:
        # The first claim consumes it; a running Operation whose approval no Attempt consumed was not
        # authorized by it, and its expiry cannot be judged any more (approval_expired ends only admitted work).
        return f"approval {approval.approval_id!r} was consumed by no attempt of this running operation"
    return None


def heartbeat(operation: Operation | None, request: HeartbeatRequest, now: datetime) -> Outcome:
    """The current owner extends its lease, before expiry only, and never past the overall deadline.

    The deadline bounds every renewal (seed 001: the overall deadline survives
    restart, and so must survive an owner that keeps renewing): before it the
    lease is extended at most to the deadline, never shortened, so a lease
    the claim granted past it stands; from the deadline on a heartbeat is
    refused ``deadline_exceeded``, the lease runs out, and the next claim
    ends the Operation ``deadline_exceeded`` (or, with an issued call
    unanswered, hands out an Attempt that may only ask the provider).
    """
    try:
        _check_request(request, HeartbeatRequest)
        _check_credential(request.credential)
        _check("lease_duration", duration_problem(request.lease_duration))
        _check_now(now)
        _check("lease_duration", later_problem(now, request.lease_duration))
    except _Invalid as exc:
        return exc.refusal
    refusal = _owner_refusal(operation, request.credential, now)
    if refusal is not None:
        return refusal
    assert operation is not None
    if now >= operation.deadline:
        return Refusal(
            RefusalCode.DEADLINE_EXCEEDED,
            f"the deadline {_iso(operation.deadline)} has passed (now {_iso(now)}): the lease is not renewed",
        )
    expires = max(min(now + request.lease_duration, operation.deadline), operation.lease_expires_at or now)
    after, record = _move(
        operation,
        OperationEvent.HEARTBEAT,
        now=now,
        actor=request.credential.worker_id,
        reason=f"lease until {_iso(expires)}",
        keep_owner=True,
        changes={"lease_expires_at": expires},
    )
    return _decision(operation, after, record, now, live=True)


def record_intent(operation: Operation | None, request: IntentRequest, now: datetime) -> Outcome:
    """Commit an external effect's intent and its stable, operation-scoped effect id before the provider is called.

    The effect id is the same for every Attempt of the Operation, so an
    idempotent provider sees the same key on every try; a repeated intent
    (a later Attempt) keeps the first one and says so in history.  From the
    intent on, the effect is unsettled: the provider may apply it and its
    answer may be lost.  An intent on a settled effect begins a new window
    with this Attempt's fence; one on an unsettled effect keeps the earlier
    fence, so this Attempt's answer alone cannot settle the earlier issue.

    No call begins from the overall deadline on: an intent is refused
    ``deadline_exceeded`` then, under a live lease too, and its guard holds
    it to the earlier of the lease and the deadline at commit.
    """
    try:
        _check_request(request, IntentRequest)
        _check_credential(request.credential)
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    refusal = _owner_refusal(operation, request.credential, now)
    if refusal is not None:
        return refusal
    assert operation is not None
    if operation.effect_class is not EffectClass.EXTERNAL:
        return Refusal(
            RefusalCode.WRONG_EFFECT_CLASS, f"{operation.effect_class.value} actions record no external intent"
        )
    if now >= operation.deadline:
        # The intent precedes the provider call, so refusing it is what keeps a call from starting past the
        # deadline; a live owner's answer to a call it began in time is still recorded (complete, fail).
        return _past_deadline(operation, now, OperationEvent.RECORD_INTENT)
    effect_id = operation.effect_id or f"{operation.operation_id}/effect"
    unsettled = operation.effect_unsettled_since
    if operation.effect_id is None:
        note = ""
    elif unsettled is None:
        note = " (again: every earlier issue was answered not applied)"
    else:
        note = " (again: an earlier issue is unanswered; reconcile before any repeat)"
    after, record = _move(
        operation,
        OperationEvent.RECORD_INTENT,
        now=now,
        actor=request.credential.worker_id,
        reason=f"effect {effect_id} intent{note}",
        keep_owner=True,
        changes={"effect_id": effect_id, "effect_unsettled_since": operation.fence if unsettled is None else unsettled},
    )
    return _decision(operation, after, record, now, live=True)


def complete_refusal(operation: Operation | None, request: CompleteRequest, now: datetime) -> Refusal | None:
    """The refusal :func:`complete` answers ``request`` with, or None when it decides a success.

    The same checks in the same order, without building the decision: a
    store asks this before it runs an atomic action, and :func:`complete`
    (which asks it too) once the action's result is known.
    """
    try:
        _check_request(request, CompleteRequest)
        _check_credential(request.credential)
        _check_authority("authority", request.authority)
        if not isinstance(request.result, str):
            raise _Invalid("result", "must be JSON text")
        _check("result", _json_text_problem(request.result))
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    refusal = _owner_refusal(operation, request.credential, now)
    if refusal is not None or operation is None:
        return refusal
    # Whatever the effect class: an external success is recorded whatever its authority *says*, but an answer
    # for another principal is no answer about this Operation's at all, and a caller that sends one is mistaken.
    refusal = _misbound_authority(request.authority, operation.identity.principal, "the operation's principal")
    if refusal is not None:
        return refusal
    if not request.authority.granted and operation.effect_class is not EffectClass.EXTERNAL:
        # An external success is the provider's answer to a call already issued (after the authority its Attempt
        # checked): it begins nothing, and refusing it would only lose what the provider did.
        why = f": {request.authority.reason}" if request.authority.reason else ""
        return Refusal(RefusalCode.NOT_AUTHORIZED, f"{request.authority.principal!r} is not authorized now{why}")
    if operation.effect_class is EffectClass.ATOMIC and now >= operation.deadline:
        # An atomic success is its effect: nothing of it may become visible from the deadline on.
        return _past_deadline(operation, now, OperationEvent.SUCCEED)
    if operation.effect_class is EffectClass.EXTERNAL and operation.effect_unsettled_since is None:
        return Refusal(
            RefusalCode.INTENT_REQUIRED,
            "an external effect completes only after an intent recorded since its last answer",
        )
    return None


def complete(operation: Operation | None, request: CompleteRequest, now: datetime) -> Outcome:
    """The owner's guarded success: Attempt, Operation, result, transition and outbox in one decision.

    For an atomic action the store applies this in the same transaction as
    the action's own writes, so both commit or neither does.  Current
    authorization is checked here, not only at submission: a denial is a
    refusal and the store rolls the action's writes back with it.  An
    atomic success is its effect, so from the overall deadline on it is
    refused ``deadline_exceeded``, and its guard holds it to the earlier of
    the lease and the deadline at commit; an external success records the
    answer to a call begun before the deadline and is decided after it,
    and whatever the authority: it begins nothing (the call it answers was
    issued under the authority its Attempt checked), so a principal revoked
    since does not lose what the provider did.
    """
    refusal = complete_refusal(operation, request, now)
    if refusal is not None:
        return refusal
    assert operation is not None
    after, record = _move(
        operation,
        OperationEvent.SUCCEED,
        now=now,
        actor=request.credential.worker_id,
        reason=f"attempt {operation.fence} succeeded",
        # A success is the effect's conclusive answer: nothing of it is left unsettled.
        changes={
            "outcome": TerminalOutcome.SUCCEEDED,
            "result": request.result,
            "error_code": None,
            "effect_unsettled_since": None,
        },
    )
    attempt = _end_attempt(operation, AttemptState.SUCCEEDED, now)
    return _decision(operation, after, record, now, live=True, attempts=(attempt,))


def fail(operation: Operation | None, request: FailRequest, now: datetime) -> Outcome:
    """The owner reports a failure: retried after backoff while Attempts and time remain, else a named end.

    A current-authorization denial never retries (it fails closed); a
    retryable failure from the deadline on ends ``deadline_exceeded``, one
    with no Attempt left ``max_attempts_exceeded``, and one whose next
    eligibility would fall past the deadline ``deadline_exceeded``.  Where
    any of these, or a failure that is not retryable, ends it while an
    issued call of its external effect is unanswered (and this failure does
    not settle it), it ends ``external_outcome_unknown`` instead, with the
    request's error code: nothing may repeat the call, and the outcome says
    the effect may have happened.

    ``effect_not_applied`` records the provider's conclusive "not applied"
    answer to this Attempt's own call.  It settles the effect only if this
    Attempt began its unsettled window (``effect_unsettled_since`` is its
    fence): then its call was the only issue since the last answer, so a
    later Attempt may perform again.  If an earlier Attempt's issue is still
    unanswered, the effect stays unsettled and the history says so.
    """
    try:
        _check_request(request, FailRequest)
        _check_credential(request.credential)
        _check_id("error_code", request.error_code)
        for name in ("retryable", "not_authorized", "effect_not_applied"):
            if not isinstance(getattr(request, name), bool):
                raise _Invalid(name, "must be true or false")
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    refusal = _owner_refusal(operation, request.credential, now)
    if refusal is not None:
        return refusal
    assert operation is not None
    settle: dict[str, Any] = {}
    note = ""
    if request.effect_not_applied:
        if operation.effect_class is not EffectClass.EXTERNAL:
            return Refusal(RefusalCode.WRONG_EFFECT_CLASS, "only an external effect has a provider's answer")
        if operation.effect_unsettled_since == operation.fence:
            settle = {"effect_unsettled_since": None}
            note = f"; effect {operation.effect_id} answered not applied"
        elif operation.effect_unsettled_since is not None:
            note = (
                f"; effect {operation.effect_id} answered not applied, but the issue of attempt "
                f"{operation.effect_unsettled_since} is unanswered"
            )
    attempt = _end_attempt(operation, AttemptState.FAILED, now, request.error_code)
    actor = request.credential.worker_id
    terminal: TerminalOutcome | None = None
    event = OperationEvent.FAIL
    if request.not_authorized:
        terminal = TerminalOutcome.NOT_AUTHORIZED
    elif not request.retryable:
        terminal = TerminalOutcome.ACTION_FAILED
    elif now >= operation.deadline:
        # Both limits may be spent; the deadline is named first, as a claim names it (and as the owner refused
        # an effect past the deadline expects its failure to end the Operation).
        terminal, event = TerminalOutcome.DEADLINE_EXCEEDED, OperationEvent.DEADLINE_EXCEEDED
    elif operation.attempt_count >= operation.policy.maximum_attempts:
        terminal = TerminalOutcome.MAX_ATTEMPTS_EXCEEDED
    else:
        eligible = now + operation.policy.backoff(operation.attempt_count)
        if eligible >= operation.deadline:
            terminal, event = TerminalOutcome.DEADLINE_EXCEEDED, OperationEvent.DEADLINE_EXCEEDED
        else:
            after, record = _move(
                operation,
                OperationEvent.RETRY,
                now=now,
                actor=actor,
                reason=f"attempt {operation.fence} failed ({request.error_code}){note}; eligible again {_iso(eligible)}",
                changes={"next_eligible_at": eligible, "error_code": request.error_code, **settle},
            )
            return _decision(operation, after, record, now, live=True, attempts=(attempt,))
    outcome = terminal
    if not settle and _unanswered(operation):
        # Whatever ends it -- the deadline, the last Attempt, a denial of current authority, a failure that is not
        # retryable -- it ends with a call issued and no conclusive answer to it (a look that found nothing
        # included: the call may still land), and no Attempt may repeat it: the seed's ambiguous result.  The
        # request's error code still says what ended it.
        if event is OperationEvent.DEADLINE_EXCEEDED:
            limit = f"the deadline {_iso(operation.deadline)}"
        elif terminal is TerminalOutcome.MAX_ATTEMPTS_EXCEEDED:
            limit = f"the last of {operation.policy.maximum_attempts} attempts"
        elif terminal is TerminalOutcome.NOT_AUTHORIZED:
            limit = "the denial of current authority"
        else:
            limit = "a failure that is not retryable"
        event, outcome = OperationEvent.OUTCOME_UNKNOWN, TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN
        note += f"; {limit} leaves no retry and {_issued_note(operation)}"
    after, record = _move(
        operation,
        event,
        now=now,
        actor=actor,
        reason=f"attempt {operation.fence} failed ({request.error_code}){note}: {outcome.value}",
        changes={"outcome": outcome, "error_code": request.error_code, **settle},
    )
    return _decision(operation, after, record, now, live=True, attempts=(attempt,))


def outcome_unknown(operation: Operation | None, request: UnknownRequest, now: datetime) -> Outcome:
    """An ambiguous external result that reconciliation could not settle: final, and never resent."""
    try:
        _check_request(request, UnknownRequest)
        _check_credential(request.credential)
        if not isinstance(request.detail, str):
            raise _Invalid("detail", "must be text")
        # The detail is kept in the transition, as a cancellation's reason is: text every store can keep, bounded
        # alike, or a NUL and a lone surrogate fail inside the store's transaction instead of being refused here.
        _check("detail", text_problem(request.detail))
        if len(request.detail) > MAX_RATIONALE:
            raise _Invalid("detail", f"must be at most {MAX_RATIONALE} characters, got {len(request.detail)}")
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    refusal = _owner_refusal(operation, request.credential, now)
    if refusal is not None:
        return refusal
    assert operation is not None
    if operation.effect_class is not EffectClass.EXTERNAL:
        return Refusal(RefusalCode.WRONG_EFFECT_CLASS, "only an external effect can have an unknown outcome")
    if operation.effect_unsettled_since is None:
        # Nothing unanswered: no intent, or every issue was answered not applied and none recorded since.
        return Refusal(
            RefusalCode.INTENT_REQUIRED, "no intent is recorded since the last answer, so nothing can be ambiguous"
        )
    after, record = _move(
        operation,
        OperationEvent.OUTCOME_UNKNOWN,
        now=now,
        actor=request.credential.worker_id,
        reason=f"effect {operation.effect_id}: {request.detail or 'ambiguous and not reconcilable'}",
        changes={"outcome": TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN, "error_code": "external_outcome_unknown"},
    )
    attempt = _end_attempt(operation, AttemptState.OUTCOME_UNKNOWN, now, "external_outcome_unknown")
    return _decision(operation, after, record, now, live=True, attempts=(attempt,))


def decide(operation: Operation | None, request: DecideRequest, now: datetime) -> Outcome:
    """Store an approval decision bound to the exact Operation (seed 001, Approval, cancellation, and limits).

    The approver's current authority is asked first: a denied approver
    learns nothing of what is stored.  Then every binding is compared and
    the first that differs is named; the requester may not approve their own
    Operation; an expiry already past is refused, and so is any decision
    once the Operation's own deadline has passed (``deadline_exceeded``: it
    ends ``approval_expired``); a repeat of the stored decision is
    Unchanged, any other decision after it is a conflict.
    """
    try:
        _check_request(request, DecideRequest)
        _check_id("approval_id", request.approval_id)
        _check_id("operation_id", request.operation_id)
        _check_digest("input_digest", request.input_digest)
        _check_id("action_name", request.action_name)
        _check_positive("action_version", request.action_version)
        _check_id("tenant", request.tenant)
        _check_id("approver", request.approver)
        if not isinstance(request.approved, bool):
            raise _Invalid("approved", "must be true or false")
        _check("expires_at", utc_problem(request.expires_at))
        _check_authority("authority", request.authority)
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    refusal = _refuse_missing(operation, request.operation_id)
    if refusal is not None:
        return refusal
    assert operation is not None
    # Current authority first (seed 001: an approval "never overrides current authorization"): an
    # approver denied now is answered neither by a decision stored earlier nor by the stored bindings.
    misbound = _misbound_authority(request.authority, request.approver, "the approver")
    if misbound is not None:
        return misbound
    if not request.authority.granted:
        why = f": {request.authority.reason}" if request.authority.reason else ""
        return Refusal(RefusalCode.NOT_AUTHORIZED, f"{request.approver!r} may not decide this operation{why}")
    for name, stored, given in (
        ("input_digest", operation.input_digest, request.input_digest),
        ("action_name", operation.action_name, request.action_name),
        ("action_version", operation.action_version, request.action_version),
        ("tenant", operation.identity.tenant, request.tenant),
    ):
        if stored != given:
            return Refusal(
                RefusalCode.APPROVAL_MISBOUND,
                f"{name}: the decision names {given!r}, operation {operation.operation_id!r} has {stored!r}",
                name,
            )
    stored_approval = operation.approval
    if stored_approval is not None:
        same = (
            stored_approval.approval_id == request.approval_id
            and stored_approval.approver == request.approver
            and stored_approval.approved == request.approved
        )
        if same:
            return Unchanged(UnchangedCode.ALREADY_DECIDED, "this decision is already stored", operation)
        return Refusal(
            RefusalCode.DECISION_CONFLICT,
            f"operation {operation.operation_id!r} was already decided by {stored_approval.approval_id!r}",
        )
    if operation.state is not OperationState.AWAITING_APPROVAL:
        return Refusal(
            RefusalCode.NOT_AWAITING_APPROVAL, f"operation is {operation.state.value}, not awaiting_approval"
        )
    if now >= operation.deadline:
        # Past its deadline the Operation can only end approval_expired (the next claim's sweep ends it):
        # a decision stored now would turn that into deadline_exceeded or approval_rejected by the
        # accident of which came first, and an approval here can never be used.
        return Refusal(
            RefusalCode.DEADLINE_EXCEEDED,
            f"the operation's deadline {_iso(operation.deadline)} has passed (now {_iso(now)}); it ends approval_expired",
        )
    if _same_principal(request.approver, operation.identity.principal):
        return Refusal(
            RefusalCode.SELF_APPROVAL, f"{request.approver!r} requested this operation and may not decide it", "approver"
        )
    if request.expires_at <= now:
        return Refusal(
            RefusalCode.APPROVAL_EXPIRED, f"expires_at {_iso(request.expires_at)} is not after now {_iso(now)}",
            "expires_at",
        )
    approval = Approval(
        approval_id=request.approval_id,
        operation_id=operation.operation_id,
        input_digest=operation.input_digest,
        action_name=operation.action_name,
        action_version=operation.action_version,
        tenant=operation.identity.tenant,
        requester=operation.identity.principal,
        approver=request.approver,
        approved=request.approved,
        expires_at=request.expires_at,
        decided_at=now,
    )
    if request.approved:
        after, record = _move(
            operation,
            OperationEvent.APPROVE,
            now=now,
            actor=request.approver,
            reason=f"approved by {request.approver} until {_iso(request.expires_at)}",
            changes={"approval": approval, "next_eligible_at": now},
        )
    else:
        after, record = _move(
            operation,
            OperationEvent.REJECT,
            now=now,
            actor=request.approver,
            reason=f"rejected by {request.approver}",
            changes={"approval": approval, "outcome": TerminalOutcome.APPROVAL_REJECTED, "error_code": "approval_rejected"},
        )
    return _decision(operation, after, record, now)


def cancel(operation: Operation | None, request: CancelRequest, now: datetime) -> Outcome:
    """Persist cancellation; it competes with the guarded effect for the Operation's row.

    If it commits first, the running Attempt is recorded ``cancelled`` and
    its effect's commit is refused (its guard names the revision this
    changes).  If the effect committed first, this is ``cancel_too_late``.
    Both that answer and a repeat's ``already_cancelled`` are given only to
    a principal whose current authority to cancel is granted.
    It never undoes anything: an external effect already issued stays
    issued, and the transition record says its intent was recorded.
    """
    try:
        _check_request(request, CancelRequest)
        _check_id("operation_id", request.operation_id)
        _check_id("principal", request.principal)
        _check_authority("authority", request.authority)
        if not isinstance(request.reason, str):
            raise _Invalid("reason", "must be text")
        # The reason is kept in the transition: NUL or a lone surrogate would fail inside the store's transaction.
        _check("reason", text_problem(request.reason))
        if len(request.reason) > MAX_RATIONALE:
            # The bound of a workflow execution's review decision and recovery rationale: a reason people read in
            # the history, not a payload.
            raise _Invalid("reason", f"must be at most {MAX_RATIONALE} characters, got {len(request.reason)}")
        _check_now(now)
    except _Invalid as exc:
        return exc.refusal
    refusal = _refuse_missing(operation, request.operation_id)
    if refusal is not None:
        return refusal
    assert operation is not None
    # Current authority first: a repeat answered Unchanged (with the Operation) or a late cancel naming
    # its outcome would tell a principal who may not cancel what became of the Operation.
    misbound = _misbound_authority(request.authority, request.principal, "the canceller")
    if misbound is not None:
        return misbound
    if not request.authority.granted:
        why = f": {request.authority.reason}" if request.authority.reason else ""
        return Refusal(RefusalCode.NOT_AUTHORIZED, f"{request.principal!r} may not cancel{why}")
    if operation.state is OperationState.CANCELLED:
        return Unchanged(UnchangedCode.ALREADY_CANCELLED, "the operation is already cancelled", operation)
    if operation.state in OPERATION.terminal:
        return Refusal(
            RefusalCode.CANCEL_TOO_LATE,
            f"operation already ended {operation.state.value} ({operation.outcome.value if operation.outcome else ''})",
        )
    attempts: tuple[Attempt, ...] = ()
    note = request.reason or "cancelled"
    if operation.state is OperationState.RUNNING:
        attempts = (_end_attempt(operation, AttemptState.CANCELLED, now, "cancelled"),)
        note += f"; attempt {operation.fence} fenced"
    # Whatever the state: an Operation waiting for its retry may hold an earlier Attempt's unanswered issue.
    if operation.effect_unsettled_since is not None:
        note += f"; external effect {operation.effect_id} may have been issued and is not undone"
    after, record = _move(
        operation,
        OperationEvent.CANCEL,
        now=now,
        actor=request.principal,
        reason=note,
        changes={"outcome": TerminalOutcome.CANCELLED, "error_code": "cancelled", "cancel_requested_by": request.principal},
    )
    return _decision(operation, after, record, now, attempts=attempts)


def effect_plan(operation: Operation) -> EffectPlan:
    """What an Attempt of an external action does before the provider, from the Operation as claimed.

    ``reconcile`` exactly when an earlier issue of the effect may have been
    applied without a conclusive answer (a lost reply, a timeout, a crash
    between intent and answer, a replaced owner): seed 001's "reconcilable
    providers are checked before repeat" and "an unreconcilable ambiguous
    result becomes external_outcome_unknown".  ``perform`` when nothing was
    issued or every issue was answered "not applied": performing again
    resends nothing blindly, since no earlier issue can have taken effect.
    """
    _stored_value(operation)
    return EffectPlan.PERFORM if operation.effect_unsettled_since is None else EffectPlan.RECONCILE


def due(operation: Operation, now: datetime) -> bool:
    """Whether a claim (or the deadline sweep) would do something with this Operation at ``now``.

    Stores use the same rule in SQL to find work; this is its reference.
    """
    _stored_value(operation)
    problem = utc_problem(now)
    if problem is not None:
        raise (TypeError if not isinstance(now, datetime) else ValueError)(f"now: {problem}")
    if operation.state is OperationState.ADMITTED:
        return now >= operation.next_eligible_at or now >= operation.deadline
    if operation.state is OperationState.RUNNING:
        return operation.lease_expires_at is None or now >= operation.lease_expires_at
    if operation.state is OperationState.AWAITING_APPROVAL:
        return now >= operation.deadline
    return False


__all__ = [
    "STORE_REFUSALS",
    "Approval",
    "Attempt",
    "AttemptState",
    "Authority",
    "CancelRequest",
    "ClaimRequest",
    "CompleteRequest",
    "Credential",
    "DecideRequest",
    "Decision",
    "EffectClass",
    "EffectPlan",
    "FailRequest",
    "Guard",
    "HeartbeatRequest",
    "Identity",
    "IdentityKey",
    "IntentRequest",
    "Operation",
    "OutboxMessage",
    "Outcome",
    "Refusal",
    "RefusalCode",
    "RetryPolicy",
    "SubmitRequest",
    "TerminalOutcome",
    "Transition",
    "Unchanged",
    "UnchangedCode",
    "UnknownRequest",
    "cancel",
    "check_owner",
    "claim",
    "commit_refusal",
    "complete",
    "complete_refusal",
    "decide",
    "due",
    "effect_plan",
    "expire",
    "fail",
    "heartbeat",
    "identity_key",
    "operation_problem",
    "outcome_unknown",
    "record_intent",
    "result_depth_problem",
    "stable_principal",
    "submit",
]
