"""The five machines of fencekeeper, as literal tables.

Rules of this module:

- Everything that decides which state follows which lives here, as data.
  There is no transition hidden in code elsewhere: the protocol
  (``protocol.py``) asks :func:`step` for every state change it makes, the
  diagrams and ``specs/machines/*.toml`` are generated from these tables,
  and a test fails if the committed TOML differs from the export by a byte.
- Each table cites the seed sentence or table row it comes from.  A
  transition the seed leaves implicit is marked ``derived`` and says why.
- States and events are typed enums whose *values* are the spec strings, so
  that ``ExecutionState("running")`` round-trips with the TOML and the node
  machine keeps seed 002's hyphenated event names verbatim.
- This module knows nothing of leases, tokens, revisions or time.  Those are
  the protocol's business; a machine answers only "from this state, does
  this event lead somewhere, and where?".

Why code and not files: the kernel does no I/O, so it cannot read
``specs/`` at import time; literal tables also give mypy typed enums and give
a reader one machine's whole truth in one place.  The TOML files are the
language-neutral export of these tables, kept honest by the byte-identity
test (``tests/tables/test_specs_committed.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

import attrs

from .errors import IllegalTransition, InvalidSpec
from .spec import MachineSpec, TransitionSpec, build_machine_spec

# The contracts' file names, as each spec's ``source`` names its contract.  A reader never sees
# them in prose: docs/glossary.md ("The three contracts") maps each to its name and describes it.
SEED_000 = "000_b48b716f7ed7660f.txt"
SEED_001 = "001_24a1fd5f517dd332.txt"
SEED_002 = "002_a0269be443952cd4.txt"

class TableEnum(enum.Enum):
    """An enum whose members hash by identity.

    ``Enum.__hash__`` is a Python-level function (it hashes the member's
    name); table lookups call it twice per step, which made it most of the
    cost of :meth:`Machine.step`.  Members are singletons compared by
    identity, so identity hashing is equivalent and runs in C.
    """

    __hash__ = object.__hash__


S = TypeVar("S", bound=enum.Enum)
E = TypeVar("E", bound=enum.Enum)


@attrs.frozen
class Machine(Generic[S, E]):
    """A validated machine with typed states and events.

    ``table`` is read-only; :meth:`step` is the only way to ask it anything
    that decides.
    """

    spec: MachineSpec
    state_type: type[S]
    event_type: type[E]
    table: Mapping[tuple[S, E], S]

    @property
    def name(self) -> str:
        """The machine's name, as in its spec file (``execution``, ``dispatch``, ...)."""
        return self.spec.name

    def step(self, state: S, event: E) -> S:
        """The state ``event`` leads to from ``state``, or :class:`IllegalTransition`.

        A ``state`` or ``event`` that is not a member of this machine's enums
        (a spec string, another machine's member) is a TypeError naming it.

        Contracts (PEP 316, checked by CrossHair; see tests/contracts):

        raises: IllegalTransition
        post: (state, event) in self.table
        post: __return__ == self.table[(state, event)]
        post: self.allows(state, event)
        """
        try:
            return self.table[(state, event)]
        except (KeyError, TypeError):
            # Only a miss pays for the type check: a spec string or another
            # machine's enum is a caller's mistake, not an illegal transition.
            self._check_types(state, event)
            raise IllegalTransition(self.spec.name, str(state.value), str(event.value)) from None

    def allows(self, state: S, event: E) -> bool:
        """Whether :meth:`step` would accept ``event`` in ``state``.

        post: __return__ == (event in self.events_from(state))
        """
        try:
            if (state, event) in self.table:
                return True
        except TypeError:  # unhashable: not of this machine, said below
            pass
        self._check_types(state, event)
        return False

    def events_from(self, state: S) -> tuple[E, ...]:
        """The events legal in ``state``, in table order.

        post: len(set(__return__)) == len(__return__)
        post: all((state, e) in self.table for e in __return__)
        post: len(__return__) == sum(1 for (s, _) in self.table if s == state)
        """
        self._check_state(state)
        return tuple(e for (s, e) in self.table if s == state)

    def _check_types(self, state: object, event: object) -> None:
        """A TypeError naming ``state`` or ``event`` when it is not a member of this machine's enums."""
        self._check_state(state)
        if not isinstance(event, self.event_type):
            raise TypeError(f"machine {self.spec.name!r}: event must be a member of {self.event_type.__name__}, got {event!r}")

    def _check_state(self, state: object) -> None:
        if not isinstance(state, self.state_type):
            raise TypeError(f"machine {self.spec.name!r}: state must be a member of {self.state_type.__name__}, got {state!r}")

    @property
    def initial(self) -> tuple[S, ...]:
        """The states an instance may start in."""
        return tuple(self.state_type(s) for s in self.spec.initial)

    @property
    def terminal(self) -> frozenset[S]:
        """Absorbing states: no transition leaves them."""
        return frozenset(self.state_type(s) for s in self.spec.terminal)

    @property
    def review(self) -> frozenset[S]:
        """Non-terminal states only a governed decision may leave."""
        return frozenset(self.state_type(s) for s in self.spec.review)


def machine_from_spec(spec: MachineSpec, state_type: type[S], event_type: type[E]) -> Machine[S, E]:
    """Bind a validated spec to its enums; they must name exactly the same things."""
    where = f"machine {spec.name!r}"
    spec_states = set(spec.states)
    enum_states = {str(s.value) for s in state_type}
    if spec_states != enum_states:
        raise InvalidSpec(
            where,
            f"states differ from {state_type.__name__}: "
            f"spec only {sorted(spec_states - enum_states)}, enum only {sorted(enum_states - spec_states)}",
        )
    spec_events = set(spec.events)
    enum_events = {str(e.value) for e in event_type}
    if spec_events != enum_events:
        raise InvalidSpec(
            where,
            f"events differ from {event_type.__name__}: "
            f"spec only {sorted(spec_events - enum_events)}, enum only {sorted(enum_events - spec_events)}",
        )
    table = {
        (state_type(t.source), event_type(t.event)): state_type(t.target) for t in spec.transitions
    }
    return Machine(spec=spec, state_type=state_type, event_type=event_type, table=MappingProxyType(table))


def step(machine: Machine[S, E], state: S, event: E) -> S:
    """Module-level spelling of :meth:`Machine.step`."""
    if not isinstance(machine, Machine):
        raise TypeError(f"machine must be a Machine (one of MACHINES), got {machine!r}")
    return machine.step(state, event)


def _t(event: str, source: str, target: str, cite: str, rationale: str | None = None) -> TransitionSpec:
    return TransitionSpec(
        event=event,
        source=source,
        target=target,
        cite=cite,
        derived=rationale is not None,
        rationale=rationale,
    )


# --- execution (seed 000: WorkflowExecution Lifecycle) ------------------------


class ExecutionState(TableEnum):
    """The states of a workflow execution (specs/machines/execution.toml)."""

    ELIGIBLE = "eligible"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    RECONCILIATION_REQUIRED = "reconciliation_required"


class ExecutionEvent(TableEnum):
    """The events of a workflow execution (specs/machines/execution.toml); the dispatch row takes the same ones."""

    CLAIM = "claim"
    CANCEL = "cancel"
    RENEW = "renew"
    RECORD_STEP = "record_step"
    RELEASE = "release"
    FINALIZE_WAITING = "finalize_waiting"
    FINALIZE_SUCCEEDED = "finalize_succeeded"
    FINALIZE_FAILED = "finalize_failed"
    FINALIZE_SUSPENDED = "finalize_suspended"
    FINALIZE_RECONCILIATION_REQUIRED = "finalize_reconciliation_required"
    WAKE = "wake"
    SUSPEND = "suspend"
    QUARANTINE_EXPIRED = "quarantine_expired"
    FAIL = "fail"
    RESUME_SAFE = "resume_safe"
    RESUME_SUSPENDED = "resume_suspended"


# The rows of seed 000's lifecycle table, in the table's order, then the
# governed reconciliation decisions of its recovery extension.  Dispatch
# mirrors these rows exactly (seed 000, Dispatch Lifecycle), so both machines
# are built from this one list and cannot drift apart.
_ROW = "WorkflowExecution Lifecycle row "
_LIFECYCLE: tuple[tuple[str, ...], ...] = (
    ("claim", "eligible", "running",
     _ROW + "'eligible | running': Atomic claim assigns fresh lease token, technical worker identity and expiry"),
    ("cancel", "eligible", "cancelled",
     _ROW + "'eligible | cancelled': Authorized Command cancellation wins before claim"),
    ("renew", "running", "running",
     _ROW + "'running | running': Fenced renewal ... continues under the same valid lease token"),
    ("record_step", "running", "running",
     _ROW + "'running | running': ... or a committed node transition continues under the same valid lease token"),
    ("finalize_waiting", "running", "waiting",
     _ROW + "'running | waiting': Wait/approval node commits its step attempt, correlation/dependency data "
     "and wait registration, then releases the lease"),
    ("release", "running", "eligible",
     _ROW + "'running | eligible': Safe pass continuation under the current valid lease through release()"),
    ("finalize_succeeded", "running", "succeeded",
     _ROW + "'running | succeeded': end success and terminal evidence commit under the valid lease"),
    ("finalize_failed", "running", "failed",
     _ROW + "'running | failed': Deterministic terminal failure and evidence commit under the valid lease"),
    ("finalize_suspended", "running", "suspended",
     _ROW + "'running | suspended': Cycle, unsupported continuation, exhausted bound, changed dependency, "
     "or unknown condition is durably explained"),
    ("finalize_reconciliation_required", "running", "reconciliation_required",
     _ROW + "'running | reconciliation_required': Command/Attempt outcome cannot be classified conclusively"),
    ("wake", "waiting", "eligible",
     _ROW + "'waiting | eligible': Exact matching Event, Decision, or configured one-time UTC wake is durably "
     "recorded; waiter is re-eligible, not directly executed"),
    ("cancel", "waiting", "cancelled",
     _ROW + "'waiting | cancelled': Authorized cancellation commits before the next local Action"),
    ("suspend", "waiting", "suspended",
     _ROW + "'waiting | suspended': Configuration/dependency invalidation or unsupported wait continuation "
     "requires review"),
    ("quarantine_expired", "running", "reconciliation_required",
     "Governed reconciliation decisions row 'quarantine_expired | running + expired claimed': Atomically "
     "clears the expired lease and enters reconciliation_required"),
    ("fail", "reconciliation_required", "failed",
     "Governed reconciliation decisions row 'fail | reconciliation_required': Records an explicit terminal "
     "recovery Outcome and transitions execution/dispatch to failed"),
    ("resume_safe", "reconciliation_required", "eligible",
     "Governed reconciliation decisions row 'resume_safe | reconciliation_required only after the "
     "safe-resume proof': transitions execution/dispatch to eligible; a later claim receives a fresh lease"),
    # Seed 000 leaves suspended without a way out in its current
    # implementation and names the shape of one: 'A suspended execution ...
    # requires an explicitly defined future governed continuation', added
    # 'only after current dependencies and evidence are rechecked'.  These two
    # rows define it, so that no execution is stuck without a governed exit
    # (specs/protocol.md, Leaving suspended).
    ("fail", "suspended", "failed",
     _ROW + "'suspended | none in the current implementation': 'A future governed recovery operation may add an "
     "explicit continuation'; Governed reconciliation decisions row 'fail': 'Records an explicit terminal "
     "recovery Outcome and transitions execution/dispatch to failed'",
     "Without it one mistyped input leaves an execution that can never finish.  An authorized operator may end "
     "it explicitly, under fresh authority and the expected revision, as fail ends reconciliation_required; "
     "no work is replayed."),
    ("resume_suspended", "suspended", "eligible",
     _ROW + "'suspended | none in the current implementation': 'A future governed recovery operation may add an "
     "explicit continuation only after current dependencies and evidence are rechecked'",
     "The governed continuation the seed anticipates: an authorized operator, after fixing what suspended it "
     "(a grant, a missing definition revision, an input), re-enters the node the visit stopped at as a new "
     "attempt.  The recovery decision rechecks the pinned definition and that no Command is unresolved."),
)

EXECUTION_SPEC = build_machine_spec(
    MachineSpec(
        name="execution",
        source=f"{SEED_000}: WorkflowExecution Lifecycle; Recovery and reconciliation extension",
        states=tuple(s.value for s in ExecutionState),
        initial=("eligible",),
        terminal=("succeeded", "failed", "cancelled"),
        review=("suspended", "reconciliation_required"),
        transitions=tuple(_t(*row) for row in _LIFECYCLE),
    ),
    "machine 'execution'",
)
EXECUTION: Machine[ExecutionState, ExecutionEvent] = machine_from_spec(
    EXECUTION_SPEC, ExecutionState, ExecutionEvent
)


# --- dispatch (seed 000: Dispatch Lifecycle) ---------------------------------


class DispatchState(TableEnum):
    """The states of a workflow_dispatch row (specs/machines/dispatch.toml): the execution's, with running called claimed."""

    ELIGIBLE = "eligible"
    CLAIMED = "claimed"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"
    RECONCILIATION_REQUIRED = "reconciliation_required"


DispatchEvent = ExecutionEvent
"""Dispatch takes the execution's events: its transitions mirror them."""

# The one place the two vocabularies differ: the execution is ``running``
# while its dispatch row is ``claimed``.
_DISPATCH_OF = {"running": "claimed"}

DISPATCH_SPEC = build_machine_spec(
    MachineSpec(
        name="dispatch",
        source=f"{SEED_000}: Dispatch Lifecycle; Recovery and reconciliation extension",
        states=tuple(s.value for s in DispatchState),
        initial=("eligible",),
        terminal=("succeeded", "failed", "cancelled"),
        review=("suspended", "reconciliation_required"),
        transitions=tuple(
            _t(
                e,
                _DISPATCH_OF.get(s, s),
                _DISPATCH_OF.get(t, t),
                "Dispatch Lifecycle: 'Allowed dispatch transitions mirror the execution transitions' "
                f"(running is claimed); mirrors {c}",
                *rationale,
            )
            for e, s, t, c, *rationale in _LIFECYCLE
        ),
    ),
    "machine 'dispatch'",
)
DISPATCH: Machine[DispatchState, ExecutionEvent] = machine_from_spec(
    DISPATCH_SPEC, DispatchState, ExecutionEvent
)


def dispatch_state_of(state: ExecutionState) -> DispatchState:
    """The dispatch state that agrees with an execution state (seed 000, Dispatch Lifecycle).

    The two vocabularies differ only in running/claimed, and the mirrored
    machines must admit the same events and move in lockstep:

    post: isinstance(__return__, DispatchState)
    post: __return__.value == ("claimed" if state.value == "running" else state.value)
    post: DISPATCH.events_from(__return__) == EXECUTION.events_from(state)
    post: all(dispatch_state_of(EXECUTION.step(state, e)) == DISPATCH.step(__return__, e) for e in EXECUTION.events_from(state))
    """
    known = _DISPATCH_STATE_OF.get(state) if type(state) is ExecutionState else None
    return known if known is not None else DispatchState(_DISPATCH_OF.get(state.value, state.value))


_DISPATCH_STATE_OF: dict[ExecutionState, DispatchState] = {
    state: DispatchState(_DISPATCH_OF.get(state.value, state.value)) for state in ExecutionState
}
""":func:`dispatch_state_of` for every member, spelt once: two decisions of every execution ask it, and an
enum's ``value`` and call each run Python code.  Anything else takes the spelling above (and fails as it does)."""


# --- node (seed 002: Closed state machine) -------------------------------------


class NodeState(TableEnum):
    """The states of a DAG node in the execution journal (specs/machines/node.toml)."""

    PENDING = "pending"
    READY = "ready"
    ACTIVE = "active"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    INVALIDATED = "invalidated"
    SUPERSEDED = "superseded"


class NodeEvent(TableEnum):
    """The events of a DAG node (specs/machines/node.toml), with seed 002's hyphenated names verbatim."""

    DEPENDENCIES_SATISFIED = "dependencies-satisfied"
    WORK_STARTED = "work-started"
    WORK_BLOCKED = "work-blocked"
    BLOCK_CLEARED = "block-cleared"
    WORK_COMPLETED = "work-completed"
    WORK_FAILED = "work-failed"
    RETRY_AUTHORIZED = "retry-authorized"
    WORK_INVALIDATED = "work-invalidated"
    SUCCESSOR_BOUND = "successor-bound"


_CSM = "Closed state machine: "
NODE_SPEC = build_machine_spec(
    MachineSpec(
        name="node",
        source=f"{SEED_002}: Closed state machine",
        states=tuple(s.value for s in NodeState),
        initial=("ready", "pending"),
        terminal=("superseded",),
        review=(),
        transitions=(
            _t("dependencies-satisfied", "pending", "ready", _CSM + "pending ──dependencies-satisfied──→ ready"),
            _t("work-started", "ready", "active", _CSM + "ready ──work-started──→ active"),
            _t("work-blocked", "active", "blocked", _CSM + "active ──work-blocked──→ blocked"),
            _t("block-cleared", "blocked", "active", _CSM + "blocked ──block-cleared──→ active"),
            _t("work-completed", "active", "completed", _CSM + "active ──work-completed──→ completed"),
            _t("work-failed", "active", "failed", _CSM + "active ──work-failed──→ failed"),
            _t("retry-authorized", "failed", "ready", _CSM + "failed ──retry-authorized──→ ready"),
            *(
                _t(
                    "work-invalidated",
                    source,
                    "invalidated",
                    _CSM + "pending | ready | active | blocked | completed | failed └─ work-invalidated → invalidated",
                )
                for source in ("pending", "ready", "active", "blocked", "completed", "failed")
            ),
            _t("successor-bound", "invalidated", "superseded", _CSM + "invalidated ──successor-bound→ superseded"),
        ),
    ),
    "machine 'node'",
)
NODE: Machine[NodeState, NodeEvent] = machine_from_spec(NODE_SPEC, NodeState, NodeEvent)


def initial_node_state(has_predecessors: bool) -> NodeState:
    """Seed 002: 'Root DAG nodes begin ready; nodes with predecessors begin pending.'

    post: __return__ in NODE.initial
    post: (__return__ is NodeState.READY) == (not has_predecessors)
    post: (__return__ is NodeState.PENDING) == has_predecessors
    """
    return NodeState.PENDING if has_predecessors else NodeState.READY


# --- step attempt (seed 000: Generic Step-Attempt Object) ----------------------


class AttemptState(TableEnum):
    """The states of a step attempt (specs/machines/attempt.toml)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RECONCILIATION_REQUIRED = "reconciliation_required"


class AttemptEvent(TableEnum):
    """The events of a step attempt (specs/machines/attempt.toml)."""

    START = "start"
    REJECT = "reject"
    COMPLETE = "complete"
    FAIL = "fail"
    OUTCOME_UNKNOWN = "outcome_unknown"
    QUARANTINE_EXPIRED = "quarantine_expired"
    RECONCILE_APPLIED = "reconcile_applied"
    RECONCILE_NOT_APPLIED = "reconcile_not_applied"


_GSA = "Generic Step-Attempt Object: "
ATTEMPT_SPEC = build_machine_spec(
    MachineSpec(
        name="attempt",
        source=f"{SEED_000}: Generic Step-Attempt Object; local_command; Failure classification and recovery",
        states=tuple(s.value for s in AttemptState),
        initial=("pending",),
        terminal=("completed", "failed"),
        review=("unknown", "reconciliation_required"),
        transitions=(
            _t("start", "pending", "running",
               _GSA + "'The object is created before consequential node work.'",
               "An attempt is created pending before its work and becomes running when the work begins; the "
               "seed names both states but no event between them."),
            _t("reject", "pending", "failed",
               "Failure classification and recovery: 'Authorization denial, stale revision or dependency "
               "mismatch | Rejected or suspended | Fail closed'",
               "The recheck at the node boundary happens before consequential work, so a denial fails the "
               "attempt without it ever running; 'failed' is terminal for the attempt."),
            _t("complete", "running", "completed",
               _GSA + "'completed and failed are terminal for that attempt.'",
               "Conclusive success of the node's work completes the attempt."),
            _t("fail", "running", "failed",
               _GSA + "'completed and failed are terminal for that attempt.'",
               "A deterministic failure or rejection of the node's work is conclusive and terminal."),
            _t("outcome_unknown", "running", "unknown",
               "local_command: 'An unresolved Command result becomes unknown / reconciliation_required.'",
               "The attempt cannot be classified conclusively; it records unknown and is never resent."),
            _t("quarantine_expired", "pending", "reconciliation_required",
               _GSA + "'pending/running are recoverable only according to the lease/reconciliation rules.'",
               "A lease that expires before the attempt started still leaves the visit unexplained; "
               "quarantine makes it an explicit review item rather than inferring that nothing happened."),
            _t("quarantine_expired", "running", "reconciliation_required",
               _GSA + "'pending/running are recoverable only according to the lease/reconciliation rules.'",
               "Expired-lease quarantine 'is not ... proof that a consequential Operation did not occur', so "
               "an interrupted running attempt needs reconciliation."),
            _t("reconcile_applied", "unknown", "completed",
               _GSA + "'unknown and reconciliation_required require explicit reconciliation evidence before "
               "any safe continuation.'",
               "Reconciliation evidence that the work was applied settles the attempt as completed."),
            _t("reconcile_not_applied", "unknown", "failed",
               "Safe-resume proof: 'A not-applied determination may permit a separately identified new "
               "Attempt'",
               "A not-applied determination settles this attempt as failed; any retry is a new attempt."),
            _t("reconcile_applied", "reconciliation_required", "completed",
               _GSA + "'unknown and reconciliation_required require explicit reconciliation evidence before "
               "any safe continuation.'",
               "Reconciliation evidence that the work was applied settles the attempt as completed."),
            _t("reconcile_not_applied", "reconciliation_required", "failed",
               "Safe-resume proof: 'A not-applied determination may permit a separately identified new "
               "Attempt'",
               "A not-applied determination settles this attempt as failed; any retry is a new attempt."),
        ),
    ),
    "machine 'attempt'",
)
ATTEMPT: Machine[AttemptState, AttemptEvent] = machine_from_spec(ATTEMPT_SPEC, AttemptState, AttemptEvent)


# --- durable operation (seed 001: Guaranteed behavior) ---------------------------


class OperationState(TableEnum):
    """The states of a durable Operation (specs/machines/operation.toml)."""

    ADMITTED = "admitted"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    OUTCOME_UNKNOWN = "outcome_unknown"


class OperationEvent(TableEnum):
    """The events of a durable Operation (specs/machines/operation.toml)."""

    REQUIRE_APPROVAL = "require_approval"
    APPROVE = "approve"
    REJECT = "reject"
    APPROVAL_EXPIRED = "approval_expired"
    CLAIM = "claim"
    HEARTBEAT = "heartbeat"
    RECLAIM_EXPIRED = "reclaim_expired"
    SUCCEED = "succeed"
    FAIL = "fail"
    RETRY = "retry"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCEL = "cancel"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    RECORD_INTENT = "record_intent"
    APPROVAL_MISBOUND = "approval_misbound"


OPERATION_SPEC = build_machine_spec(
    MachineSpec(
        name="operation",
        source=f"{SEED_001}: Guaranteed behavior",
        states=tuple(s.value for s in OperationState),
        initial=("admitted",),
        terminal=("succeeded", "failed", "cancelled", "outcome_unknown"),
        review=(),
        transitions=(
            _t("require_approval", "admitted", "awaiting_approval",
               "Approval, cancellation, and limits: 'A durable approval decision is bound to the exact "
               "Operation ... It is consumed once per logical Operation'",
               "An action that needs approval cannot be claimed until a decision exists, so the operation "
               "waits in its own state rather than being claimable."),
            _t("approve", "awaiting_approval", "admitted",
               "Approval, cancellation, and limits: 'It is consumed once per logical Operation and remains "
               "valid across replacement Attempts.'",
               "An approval makes the operation claimable again; replacement attempts reuse it."),
            _t("reject", "awaiting_approval", "failed",
               "Approval, cancellation, and limits: 'It never overrides current authorization.'",
               "A rejection is a conclusive determination; nothing may run, so the operation fails."),
            _t("approval_expired", "awaiting_approval", "failed",
               "Approval, cancellation, and limits: 'bound to the exact Operation, normalized input, "
               "action/version, tenant, requester and approver provenance, and expiry.'",
               "An approval that can no longer be given ends the operation rather than waiting forever."),
            _t("cancel", "awaiting_approval", "cancelled",
               "Approval, cancellation, and limits: 'Cancellation persists intent ... It prevents later work "
               "when it wins'",
               "Nothing has run yet, so a cancellation simply wins."),
            _t("claim", "admitted", "running",
               "Claims, leases, and fencing: 'A claim locks the Operation, validates eligibility, creates an "
               "Attempt, increments the fence, and establishes one owner atomically.'",
               "Each claim is one physical Attempt of the one logical Operation."),
            _t("cancel", "admitted", "cancelled",
               "Approval, cancellation, and limits: 'It prevents later work when it wins'",
               "Before a claim, cancellation wins outright."),
            _t("deadline_exceeded", "admitted", "failed",
               "Approval, cancellation, and limits: 'Overall deadline, next eligibility, Attempt count, and "
               "maximum Attempts survive restart.'",
               "An operation past its overall deadline may not be claimed again, so it fails explicitly."),
            _t("approval_expired", "admitted", "failed",
               "Approval, cancellation, and limits: 'bound to the exact Operation, normalized input, "
               "action/version, tenant, requester and approver provenance, and expiry.'",
               "An approval that expired before the first Attempt consumed it authorizes nothing, so the "
               "operation fails instead of running on it."),
            _t("approval_misbound", "admitted", "failed",
               "Approval, cancellation, and limits: 'A durable approval decision is bound to the exact "
               "Operation, normalized input, action/version, tenant, requester and approver provenance'",
               "An approval bound to anything else (or given by the requester) authorizes nothing and can "
               "never become usable, so the claim ends the operation instead of refusing it for ever."),
            _t("approval_misbound", "running", "failed",
               "Claims, leases, and fencing: 'A replacement records expired ownership as abandoned before "
               "advancing the fence.'",
               "A replacement claim that finds the approval unusable records the expired Attempt abandoned and "
               "ends the operation rather than starting an Attempt the approval does not authorize."),
            _t("deadline_exceeded", "running", "failed",
               "Approval, cancellation, and limits: 'Overall deadline, next eligibility, Attempt count, and "
               "maximum Attempts survive restart.'",
               "An owner whose lease expired after the overall deadline is recorded abandoned and no replacement "
               "is made: the operation fails with its deadline named."),
            _t("record_intent", "running", "running",
               "Tasks, external effects, history, and retention: 'External effect intent and a stable "
               "operation-scoped identity are stored before the provider boundary.'",
               "The owner commits the intent and the stable effect id before it calls the provider, so a "
               "replacement knows the effect may have been issued and reconciles instead of resending."),
            _t("heartbeat", "running", "running",
               "Claims, leases, and fencing: 'Once fence N+1 owns the Operation, N cannot heartbeat'",
               "The current owner extends its lease without changing state."),
            _t("reclaim_expired", "running", "running",
               "Claims, leases, and fencing: 'A replacement records expired ownership as abandoned before "
               "advancing the fence.'",
               "A replacement claim of an expired Attempt keeps the operation running under fence N+1."),
            _t("succeed", "running", "succeeded",
               "Durable truth and recovery: 'Attempt success, Operation success, result, transition, and "
               "outbox intent share one transaction.'",
               "The owner's guarded success commit ends the operation."),
            _t("fail", "running", "failed",
               "Current authorization: 'A missing, malformed, deleted, disabled, membership-removed, or "
               "revoked identity fails closed'",
               "A conclusive failure (or the last permitted Attempt failing) ends the operation."),
            _t("retry", "running", "admitted",
               "Current authorization: 'explicitly temporary resolution failure can use bounded retry'; "
               "'Attempt count, and maximum Attempts survive restart.'",
               "A retryable failure with Attempts left returns the operation to the queue at its next "
               "eligibility time; the failed Attempt stays recorded."),
            _t("outcome_unknown", "running", "outcome_unknown",
               "Tasks, external effects, history, and retention: 'An unreconcilable ambiguous result becomes external_outcome_unknown.'",
               "No safe next step exists once an effect may or may not have happened and cannot be "
               "reconciled; the state is final and says so."),
            _t("outcome_unknown", "admitted", "outcome_unknown",
               "Tasks, external effects, history, and retention: 'An unreconcilable ambiguous result becomes external_outcome_unknown.'",
               "An Operation waiting for its retry may hold an earlier Attempt's unanswered call; once its "
               "deadline passes nothing may repeat it, and the deadline sweep, which cannot ask the provider, "
               "ends it with its outcome unknown rather than as if nothing had been issued."),
            _t("cancel", "running", "cancelled",
               "Approval, cancellation, and limits: 'Cancellation persists intent and deterministically "
               "competes with a guarded effect through Operation-row locking.'",
               "When cancellation wins the row lock before the guarded effect, the running Attempt is fenced "
               "and the operation is cancelled; it does not undo committed work."),
        ),
    ),
    "machine 'operation'",
)
OPERATION: Machine[OperationState, OperationEvent] = machine_from_spec(
    OPERATION_SPEC, OperationState, OperationEvent
)


MACHINES: Mapping[str, Machine[enum.Enum, enum.Enum]] = MappingProxyType(
    {
        m.name: m  # type: ignore[misc]
        for m in (EXECUTION, DISPATCH, NODE, ATTEMPT, OPERATION)
    }
)
"""Every machine by name, in the order the specs and docs list them."""


__all__ = [
    "ATTEMPT",
    "ATTEMPT_SPEC",
    "DISPATCH",
    "DISPATCH_SPEC",
    "EXECUTION",
    "EXECUTION_SPEC",
    "MACHINES",
    "NODE",
    "NODE_SPEC",
    "OPERATION",
    "OPERATION_SPEC",
    "SEED_000",
    "SEED_001",
    "SEED_002",
    "AttemptEvent",
    "AttemptState",
    "DispatchEvent",
    "DispatchState",
    "ExecutionEvent",
    "ExecutionState",
    "Machine",
    "NodeEvent",
    "NodeState",
    "OperationEvent",
    "OperationState",
    "TableEnum",
    "dispatch_state_of",
    "initial_node_state",
    "machine_from_spec",
    "step",
]
