"""The workflow interpreter, as pure decisions: what one node visit must write.

The workflow execution contract (seed 000: Purpose and Invariants; Node Semantics;
Dispatcher Pass; Generic Step-Attempt Object; Failure and Recovery).

Rules of this module:

- A visit is planned from a :class:`Context`: the execution, its *pinned*
  definition revision, the workflow principal and input recorded at
  admission, and the outputs of earlier attempts.  Node resolution is
  execution -> pinned definition revision -> exact node binding -> exact node
  revision; nothing newer is ever consulted.
- :func:`plan_visit` returns a :class:`Step` (continue at the selected node,
  via the protocol's ``record_step``), a :class:`Finish` (leave running via
  ``finalize``: waiting, succeeded, failed, suspended or
  reconciliation_required) or an :class:`Invoke` (a local command: commit
  the attempt and the Command first, then hand the Command to the
  CommandHandler, then :func:`settle`).  Each carries every evidence
  revision that must commit with it.  The caller (the worker) turns them into
  protocol requests under its lease; this module never touches a store.
- Every visit creates its step attempt (revision 1, ``pending``) before any
  consequential work, and counts as exactly one step when it commits.  At
  the 100-step limit no further visit is planned: the execution is
  suspended with reason ``step_limit``.
- Nothing unknown is ever guessed.  A condition whose result is unknown, a
  binding that cannot be resolved, a node kind this code cannot run, a
  continuation that names no node, a definition that is not the pinned one:
  each suspends the execution with an inspectable reason.  A command whose
  result is unknown makes the execution reconciliation_required, and a
  Command once issued is never issued again: a visit that finds an earlier
  attempt at the same node still unsettled goes to reconciliation instead.
  A result no store can keep (:func:`storable_result`) is unknown too: the
  handler may have applied the Command, and what it said cannot be recorded.
- Authority is rechecked at every consequential node (request_approval,
  local_command) against current facts, supplied by the caller as an
  :class:`~fencekeeper.kernel.protocol.Authority` answer to
  :func:`authority_query`; a denial is evidence and fails closed.  The
  lease is never authority.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import attrs

from . import attempts
from .approvals import APPROVAL_REQUEST, ApprovalRequest, Binding
from .common import SHOWN_LENGTH, shown
from .definition import (
    MAX_INPUT_JSON,
    MAX_INPUT_TEXT,
    ConditionNode,
    Definition,
    EndNode,
    LocalCommandNode,
    Node,
    Operand,
    Ref,
    RequestApprovalNode,
    Scalar,
    Target,
    WaitForEventNode,
    integer_text,
    reads,
)
from .events import (
    MAX_PAYLOAD_DEPTH,
    RESERVED_EVENT_TYPE_PREFIX,
    correlation_value,
    json_problem,
    payload_nests_deeper,
)
from .evidence import Evidence
from .expr import INTEGER_MAX, INTEGER_MIN, Truth, evaluate
from .machines import AttemptEvent, AttemptState, ExecutionState
from .protocol import MAX_RATIONALE, STEP_LIMIT, Authority, Execution, StepRecord, WaitSpec
from .text import first_problem
from .text import problem as text_problem

APPROVAL_EVENT_TYPE: Final = RESERVED_EVENT_TYPE_PREFIX + "approval"
"""The Event Type an approval request's registration waits on; only Decisions wake it (reason ``decision``):
no Event may be published with a reserved type (``events.RESERVED_EVENT_TYPE_PREFIX``)."""

EXECUTION_INPUT: Final = "ExecutionInput"
COMMAND: Final = "Command"


class Reason(enum.Enum):
    """Why a visit suspended or failed: stable codes, stored as the dispatch row's last_error_code."""

    STEP_LIMIT = "step_limit"
    CONDITION_UNKNOWN = "condition_unknown"
    UNRESOLVED_BINDING = "unresolved_binding"
    UNSUPPORTED_NODE = "unsupported_node"
    DANGLING_CONTINUATION = "dangling_continuation"
    DEFINITION_NOT_PINNED = "definition_not_pinned"
    NOT_AUTHORIZED = "not_authorized"
    COMMAND_UNKNOWN = "command_unknown"
    COMMAND_UNSETTLED = "command_unsettled"


# --- what a visit reads ---------------------------------------------------------------------


@attrs.frozen
class Context:
    """Everything a visit may read, taken from durable objects by the caller."""

    execution: Execution
    definition: Definition | None
    """The pinned revision, or None when it cannot be found (the visit suspends)."""
    principal_id: str
    """The workflow principal recorded at admission: server-supplied, never from a definition or payload."""
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Mapping[str, Any]]
    """Per node id, the outputs of its latest completed attempt."""
    unsettled: tuple[Evidence, ...] = ()
    """Attempts at the current node that never reached a terminal state (an interrupted visit)."""


def context_from_evidence(
    execution: Execution, definition: Definition | None, evidence: Sequence[Evidence]
) -> Context:
    """Build the context from an execution's current evidence objects (creation order)."""
    principal = ""
    inputs: Mapping[str, Any] = {}
    outputs: dict[str, Mapping[str, Any]] = {}
    unsettled: list[Evidence] = []
    for item in evidence:
        if item.kind == EXECUTION_INPUT:
            principal = str(item.body.get("principal_id", ""))
            inputs = dict(item.body.get("input", {}))
        elif item.kind == attempts.STEP_ATTEMPT:
            state = AttemptState(item.state)
            if state == AttemptState.COMPLETED:
                outputs[str(item.body["node_id"])] = dict(item.body.get("outputs", {}))
            elif (
                state not in (AttemptState.FAILED,)
                and item.body.get("node_id") == execution.current_node_id
                and item.body.get("node_kind") == LocalCommandNode.kind
            ):
                unsettled.append(item)
    return Context(execution, definition, principal, inputs, outputs, tuple(unsettled))


_MISSING: Final = object()


def _resolve(operand: Operand, ctx: Context) -> object:
    """The value of a literal or a declared binding; ``_MISSING`` when it has none."""
    if not isinstance(operand, Ref):
        return operand
    head, _, field = operand.name.partition(".")
    source = ctx.inputs if head == "input" else ctx.outputs.get(head, {})
    value = source.get(field, _MISSING)
    return _MISSING if value is None else value


def _resolve_all(pairs: Sequence[tuple[str, Operand]], ctx: Context) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    missing: list[str] = []
    for name, operand in pairs:
        value = _resolve(operand, ctx)
        if value is _MISSING or isinstance(value, (dict, list)):
            missing.append(operand.name if isinstance(operand, Ref) else name)
        else:
            values[name] = value
    return values, missing


def _targets(targets: Sequence[Target], ctx: Context) -> tuple[list[tuple[str, int]], list[str]]:
    resolved: list[tuple[str, int]] = []
    missing: list[str] = []
    for number, target in enumerate(targets):
        object_id = _resolve(target.object_id, ctx)
        revision = _resolve(target.revision, ctx)
        if not isinstance(object_id, (str, int)) or isinstance(object_id, bool):
            missing.append(f"targets[{number}].id")
            continue
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
            missing.append(f"targets[{number}].revision")
            continue
        resolved.append((str(object_id), revision))
    return resolved, missing


# --- what a visit writes ------------------------------------------------------------------


@attrs.frozen
class Step:
    """Continue at ``step.next_node_id``: one step, committed with ``evidence`` (``record_step``)."""

    step: StepRecord
    evidence: tuple[Evidence, ...]


def _history_line(reason: str) -> str:
    # The finalization's reason is bounded (protocol.MAX_RATIONALE), but a
    # visit's reason quotes what it met: correlation values of up to 4096
    # characters each, a handler's detail, a policy's denial.  A reason over
    # the bound would have the finalization refused and leave the execution
    # running until its lease expired, so it is cut short here; the visit's
    # evidence objects keep every word of it.
    if len(reason) <= MAX_RATIONALE:
        return reason
    return reason[: MAX_RATIONALE - 1] + "\u2026"


@attrs.frozen
class Finish:
    """Leave running for ``target`` (``finalize``), with the visit counted when ``step`` is set.

    ``reason`` is the history line of the finalization: one longer than
    ``protocol.MAX_RATIONALE`` characters is cut to it, ending in an ellipsis.
    """

    target: ExecutionState
    step: StepRecord | None
    evidence: tuple[Evidence, ...]
    reason: str = attrs.field(converter=_history_line)
    error_code: str | None = None
    wait: WaitSpec | None = None


@attrs.frozen
class Command:
    """One stable Command envelope (seed 000, local_command); ``command_id`` is its identity.

    ``fence`` is the fence of the lease the Command was issued under.  It is
    how the fence reaches the effect: the store refuses a replaced worker's
    *writes*, but only the system that applies the Command can refuse its
    *effect*.  A handler that remembers the highest fence it has seen for an
    execution refuses a lower one (``Rejection.STALE_FENCE``), so a worker
    paused past its lease cannot apply work its replacement now owns.  The
    lease token is not passed: it is a coordination credential, and a fence
    (a number that only grows) is what a remote system can compare.
    """

    command_id: str
    execution_id: str
    attempt_id: str
    principal_id: str
    business_id: str
    operation: str
    targets: tuple[tuple[str, int], ...]
    payload: Mapping[str, Scalar] = attrs.field(eq=False, hash=False)
    fence: int = 0

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Command:
        """The envelope a stored evidence body holds."""
        return cls(
            command_id=body["command_id"],
            execution_id=body["execution_id"],
            attempt_id=body["attempt_id"],
            principal_id=body["principal_id"],
            business_id=body["business_id"],
            operation=body["operation"],
            targets=tuple((str(t), int(r)) for t, r in body["targets"]),
            payload=dict(body["payload"]),
            # Commands recorded before the fence was carried have none.
            fence=int(body.get("fence", 0)),
        )

    def to_json(self) -> dict[str, Any]:
        """The envelope as the JSON body its evidence object stores."""
        return {
            "command_id": self.command_id,
            "execution_id": self.execution_id,
            "attempt_id": self.attempt_id,
            "principal_id": self.principal_id,
            "business_id": self.business_id,
            "operation": self.operation,
            "targets": [list(t) for t in self.targets],
            "payload": dict(self.payload),
            "fence": self.fence,
        }


@attrs.frozen
class Invoke:
    """A local command: commit ``evidence`` under the lease, then invoke ``command``, then :func:`settle`."""

    node: LocalCommandNode
    command: Command
    attempt: Evidence
    """The attempt's newest revision (``running``) once ``evidence`` commits."""
    evidence: tuple[Evidence, ...]


Plan = Step | Finish | Invoke


class CommandStatus(enum.Enum):
    """What a CommandHandler reports: applied, refused, or not known (then it is never resent, only reconciled)."""

    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    UNKNOWN = "unknown"


class Rejection(enum.Enum):
    """Deterministic rejections: explicit evidence, followed by the node's on_failure continuation."""

    VALIDATION = "validation"
    AUTHORIZATION = "authorization"
    STALE_VERSION = "stale_version"
    REJECTED = "rejected"
    STALE_FENCE = "stale_fence"
    """The handler refused a Command issued under a fence older than one it has already seen: not applied."""


@attrs.frozen
class CommandResult:
    """What the CommandHandler reports.  Anything it cannot classify conclusively is UNKNOWN.

    ``detail`` is text and ``outputs`` an object of JSON values, both of
    which the Command's evidence keeps: a result no store could keep is
    taken as UNKNOWN (:func:`storable_result`).
    """

    status: CommandStatus
    rejection: Rejection | None = None
    detail: str = ""
    outputs: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)


MAX_RESULT_LENGTH: Final = MAX_INPUT_JSON
"""The most characters a handler's ``detail`` may have, and its ``outputs`` as compact JSON text.

The bound of an object input (definitions.MAX_INPUT_JSON): outputs are read
by later nodes as inputs are, and every revision of the attempt and of the
Command that records them carries them again."""

# allow_nan=False: NaN and the infinities are Python's extension of JSON, which other readers refuse.
_OUTPUTS_JSON: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _result_problem(result: CommandResult) -> tuple[str, str, object] | None:
    """What in ``result`` no store can keep, read back and replay alike: ``(field, problem, value given)``."""
    if not isinstance(result.status, CommandStatus):
        return ("status", f"must be a CommandStatus, not {type(result.status).__name__}", result.status)
    if result.rejection is not None and not isinstance(result.rejection, Rejection):
        return ("rejection", f"must be a Rejection or None, not {type(result.rejection).__name__}", result.rejection)
    detail = result.detail
    if not isinstance(detail, str):
        return ("detail", f"must be text, not {type(detail).__name__}", detail)
    unstorable = text_problem(detail)
    if unstorable is not None:
        return ("detail", unstorable, detail)
    if len(detail) > MAX_RESULT_LENGTH:
        return ("detail", f"is {len(detail)} characters long, above the bound of {MAX_RESULT_LENGTH}", detail)
    outputs = result.outputs
    if not isinstance(outputs, Mapping):
        return ("outputs", f"must be an object of names to JSON values, not {type(outputs).__name__}", outputs)
    try:
        # The checks an Event's payload passes.  Depth first, level by level without recursion: outputs
        # nested some 900 levels deep were kept, and a later read that recursed through them (a store's
        # JSON decoder, a condition) passed Python's limit and ended the worker.  Then storable text (it
        # names any key), then JSON values.
        found = (
            ("outputs", f"nests deeper than {MAX_PAYLOAD_DEPTH} levels") if payload_nests_deeper(outputs) else None
        ) or (first_problem(outputs, "outputs") or json_problem(outputs, "outputs"))
    except RecursionError:
        found = ("outputs", "nests too deeply, or contains itself")
    except Exception as exc:  # a key whose str() raises: the handler's fault, never the end of the worker
        found = ("outputs", f"could not be read: {type(exc).__name__}")
    if found is not None:
        return (*found, outputs)
    try:
        written = _OUTPUTS_JSON.encode(dict(outputs))
    except Exception as exc:
        # What the checks above let through and JSON still cannot write: a Mapping that is no dict nested
        # inside, an integer longer than Python writes, a mapping whose items() raises.
        return ("outputs", f"cannot be written as JSON: {_one_line(exc)}", outputs)
    if len(written) > MAX_RESULT_LENGTH:
        return ("outputs", f"is {len(written)} characters long as JSON, above the bound of {MAX_RESULT_LENGTH}", outputs)
    return None


def _storable(command_id: str, operation: str, result: CommandResult) -> CommandResult:
    found = _result_problem(result)
    if found is None:
        # As every store reads the outputs back (a tuple is a list, an IntEnum its number), so that the
        # in-memory store hands a later visit the same values as a database does.
        return attrs.evolve(result, outputs=json.loads(_OUTPUTS_JSON.encode(dict(result.outputs))))
    field, problem, given = found
    return CommandResult(
        CommandStatus.UNKNOWN,
        None,
        f"the handler's result for Command {command_id} ({operation}) cannot be stored, so its outcome is unknown: "
        f"{field}: {problem}; given {_given(given)}",
    )


def _one_line(exc: Exception) -> str:
    """An exception's message as one storable line, cut as :func:`shown` cuts a value."""
    said = " ".join(str(exc).split())
    return said if len(said) <= SHOWN_LENGTH and text_problem(said) is None else shown(said)


def _given(value: object) -> str:
    """``value`` as the evidence quotes it: :func:`shown`, or its type when even that is no storable text."""
    try:
        quoted = shown(value)
    except Exception:  # a host object whose repr raises is named by its type
        quoted = ""
    # repr escapes NUL and lone surrogates in strings, but an object's own __repr__ may return them.
    return quoted if quoted and text_problem(quoted) is None else f"<{type(value).__name__}>"


def storable_result(command: Command, result: CommandResult) -> CommandResult:
    """``result`` as every store keeps it, or, when no store could, UNKNOWN with a detail that says why.

    A handler error like any other (specs/interpreter.md, The handler
    contract): ``status`` and ``rejection`` of their types, ``detail`` text
    of at most :data:`MAX_RESULT_LENGTH` characters with no NUL and no lone
    surrogate, and ``outputs`` an object of JSON values (string keys, finite
    numbers, storable text) at most that long as JSON.  A result that is
    not is no conclusive answer: the Command may have been applied, so it
    is never taken as settled, and the detail names the Command, the field
    and what was given (shown, cut short).  :func:`settle` and
    :func:`reconcile_command` check every result through this.
    """
    return _storable(command.command_id, command.operation, result)


@attrs.frozen
class AuthorityQuery:
    """What the caller must ask its AuthorityPolicy before a consequential node."""

    principal_id: str
    business_id: str
    operation: str
    targets: tuple[tuple[str, int], ...]


# --- planning -------------------------------------------------------------------------------


def current_node(ctx: Context) -> Node | None:
    """The definition's node the execution is at (an UnsupportedNode when the pinned definition lacks it)."""
    definition = ctx.definition
    node_id = ctx.execution.current_node_id
    if definition is None or node_id is None:
        return None
    return definition.node(node_id)


def authority_query(ctx: Context) -> AuthorityQuery | None:
    """The check a consequential node needs before its visit is planned; None for the others."""
    node = current_node(ctx)
    if isinstance(node, (RequestApprovalNode, LocalCommandNode)):
        targets, _ = _targets(node.targets, ctx)
        return AuthorityQuery(ctx.principal_id, ctx.execution.business_id, node.operation, tuple(targets))
    return None


def plan_visit(
    ctx: Context, now: datetime, *, worker_id: str, fence: int, node_authority: Authority | None = None
) -> Plan:
    """The next visit at the execution's current node."""
    execution = ctx.execution
    if execution.step_count >= STEP_LIMIT:
        return Finish(
            ExecutionState.SUSPENDED,
            None,
            (),
            f"{STEP_LIMIT} steps processed and work remains at node {execution.current_node_id}",
            Reason.STEP_LIMIT.value,
        )
    definition = ctx.definition
    node_id = execution.current_node_id or ""
    if definition is None or (definition.definition_id, definition.revision) != (
        execution.definition_id,
        execution.definition_revision,
    ):
        return _reject(
            _unresolved_node(ctx, now, worker_id, fence),
            Reason.DEFINITION_NOT_PINNED,
            f"definition {execution.definition_id} revision {execution.definition_revision} is not available",
        )
    node = definition.node(node_id)
    if node is None:
        return _reject(
            _unresolved_node(ctx, now, worker_id, fence),
            Reason.DANGLING_CONTINUATION,
            f"node {node_id!r} does not exist in definition {definition.definition_id} revision "
            f"{definition.revision}",
        )
    attempt = attempts.start(
        execution,
        node_id=node.node_id,
        node_revision=node.revision,
        node_kind=node.kind,
        worker_id=worker_id,
        fence=fence,
        inputs=_inputs_of(node, ctx),
        now=now,
    )
    dangling = [target for target in definition.successors(node) if definition.node(target) is None]
    if dangling:
        return _reject(
            attempt, Reason.DANGLING_CONTINUATION,
            f"node {node.node_id!r} continues at {', '.join(map(repr, dangling))}, which names no node",
        )
    match node:
        case ConditionNode():
            return _condition(node, ctx, attempt)
        case WaitForEventNode():
            return _wait_for_event(node, ctx, attempt, now)
        case RequestApprovalNode():
            return _request_approval(node, ctx, attempt, now, node_authority)
        case LocalCommandNode():
            return _local_command(node, ctx, attempt, node_authority, fence)
        case EndNode():
            return _end(node, attempt)
        case _:
            return _reject(
                attempt, Reason.UNSUPPORTED_NODE,
                f"node {node.node_id!r} is of kind {getattr(node, 'kind_name', node.kind)!r}, "
                "which this interpreter does not run",
            )


def _inputs_of(node: Node, ctx: Context) -> dict[str, Any]:
    """The values the visit reads, recorded with the attempt's identity (its original inputs)."""
    recorded: dict[str, Any] = {}
    for _field, name in reads(node):
        value = _resolve(Ref(name), ctx)
        recorded[name] = None if value is _MISSING else value
    return recorded


def _unresolved_node(ctx: Context, now: datetime, worker_id: str, fence: int) -> Evidence:
    """The attempt of a visit that could not even resolve its node: still recorded, then rejected."""
    return attempts.start(
        ctx.execution,
        node_id=ctx.execution.current_node_id or "none",
        node_revision=0,
        node_kind="unresolved",
        worker_id=worker_id,
        fence=fence,
        inputs={},
        now=now,
    )


def _reject(attempt: Evidence, reason: Reason, message: str) -> Finish:
    """The node cannot run: the attempt fails before any work, the execution is suspended for review."""
    failed = attempts.advance(attempt, AttemptEvent.REJECT, reason=reason.value, detail=message)
    return Finish(
        ExecutionState.SUSPENDED,
        _step(attempt),
        (attempt, failed),
        message,
        reason.value,
    )


def _step(attempt: Evidence, next_node_id: str | None = None) -> StepRecord:
    return StepRecord(str(attempt.body["node_id"]), attempt.object_id, next_node_id)


def _condition(node: ConditionNode, ctx: Context, attempt: Evidence) -> Plan:
    bindings = {}
    missing = []
    for name in node.bindings:
        value = _resolve(Ref(name), ctx)
        if value is _MISSING:
            missing.append(name)
        else:
            bindings[name] = value
    truth = evaluate(node.ast, bindings)
    if truth == Truth.UNKNOWN:
        detail = (
            f"condition {node.expression!r} is unknown"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + "; unknown is not false, so the execution is suspended for review"
        )
        return Finish(
            ExecutionState.SUSPENDED,
            _step(attempt),
            (
                attempt,
                *attempts.settle(
                    attempt,
                    AttemptEvent.START,
                    AttemptEvent.FAIL,
                    result=truth.value,
                    missing=missing,
                    reason=Reason.CONDITION_UNKNOWN.value,
                ),
            ),
            detail,
            Reason.CONDITION_UNKNOWN.value,
        )
    chosen = node.true_next if truth == Truth.TRUE else node.false_next
    return Step(
        _step(attempt, chosen),
        (
            attempt,
            *attempts.settle(
                attempt,
                AttemptEvent.START,
                AttemptEvent.COMPLETE,
                result=truth.value,
                next_node_id=chosen,
                outputs={"result": truth == Truth.TRUE},
            ),
        ),
    )


def _unresolved(attempt: Evidence, missing: Sequence[str]) -> Finish:
    return _reject(
        attempt,
        Reason.UNRESOLVED_BINDING,
        f"node {attempt.body['node_id']!r} cannot resolve {', '.join(missing)}",
    )


def _continuations(*pairs: tuple[str, str | None]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((outcome, node) for outcome, node in pairs if node is not None))


def _wait_for_event(node: WaitForEventNode, ctx: Context, attempt: Evidence, now: datetime) -> Plan:
    values, missing = _resolve_all(node.correlation, ctx)
    correlation: list[tuple[str, str]] = []
    for name, value in values.items():
        try:
            correlation.append((name, correlation_value(value)))
        except ValueError:
            missing.append(name)
    if missing:
        return _unresolved(attempt, missing)
    timeout = node.timeout
    spec = WaitSpec(
        node_id=node.node_id,
        attempt_id=attempt.object_id,
        event_type=node.event_type,
        correlation=tuple(sorted(correlation)),
        wake_after=None if timeout is None else timeout.after,
        timeout=timeout is not None,
        continuations=_continuations(("event", node.next), ("timeout", None if timeout is None else timeout.next)),
    )
    running = attempts.advance(
        attempt, AttemptEvent.START, waiting_for={"event_type": node.event_type, "correlation": dict(correlation)}
    )
    return Finish(
        ExecutionState.WAITING,
        _step(attempt),
        (attempt, running),
        f"waiting for {node.event_type} {dict(correlation)}",
        wait=spec,
    )


def _request_approval(
    node: RequestApprovalNode, ctx: Context, attempt: Evidence, now: datetime, authority: Authority | None
) -> Plan:
    targets, missing = _targets(node.targets, ctx)
    if missing:
        return _unresolved(attempt, missing)
    if authority is None or not authority.granted:
        return _reject(
            attempt,
            Reason.NOT_AUTHORIZED,
            f"{ctx.principal_id!r} may not request {node.operation}: "
            f"{'no authority check was made' if authority is None else authority.reason or 'denied'}",
        )
    request = ApprovalRequest(
        request_id=f"{attempt.object_id}/approval",
        execution_id=ctx.execution.execution_id,
        business_id=ctx.execution.business_id,
        node_id=node.node_id,
        attempt_id=attempt.object_id,
        binding=Binding(
            node.operation, tuple(targets), tuple((p.policy_id, p.revision) for p in node.policies)
        ),
        requester_id=ctx.principal_id,
        reviewers=node.reviewers,
        distinct_reviewer=node.distinct_reviewer,
    )
    timeout = node.timeout
    spec = WaitSpec(
        node_id=node.node_id,
        attempt_id=attempt.object_id,
        event_type=APPROVAL_EVENT_TYPE,
        correlation=(("request_id", request.request_id),),
        wake_after=None if timeout is None else timeout.after,
        timeout=timeout is not None,
        continuations=_continuations(
            ("approved", node.approved_next),
            ("rejected", node.rejected_next),
            ("timeout", None if timeout is None else timeout.next),
        ),
    )
    running = attempts.advance(attempt, AttemptEvent.START, approval_request=request.request_id)
    return Finish(
        ExecutionState.WAITING,
        _step(attempt),
        (attempt, running, request.evidence()),
        f"waiting for a decision on {request.request_id} ({node.operation})",
        wait=spec,
    )


def _local_command(
    node: LocalCommandNode, ctx: Context, attempt: Evidence, authority: Authority | None, fence: int
) -> Plan:
    if ctx.unsettled:
        # An earlier visit issued a Command whose result was never recorded:
        # it may have been applied, so it is never sent again.
        earlier = ", ".join(item.object_id for item in ctx.unsettled)
        return Finish(
            ExecutionState.RECONCILIATION_REQUIRED,
            None,
            (),
            f"attempt {earlier} at node {node.node_id!r} never settled; its Command must be reconciled, not resent",
            Reason.COMMAND_UNSETTLED.value,
        )
    targets, missing = _targets(node.targets, ctx)
    values, missing_payload = _resolve_all(node.payload, ctx)
    if missing or missing_payload:
        return _unresolved(attempt, [*missing, *missing_payload])
    if authority is None or not authority.granted:
        denial = "no authority check was made" if authority is None else authority.reason or "denied"
        failed = attempts.advance(
            attempt, AttemptEvent.REJECT, reason=Reason.NOT_AUTHORIZED.value, detail=denial,
            next_node_id=node.on_failure,
        )
        return Step(_step(attempt, node.on_failure), (attempt, failed))
    command = Command(
        command_id=f"{attempt.object_id}/command",
        execution_id=ctx.execution.execution_id,
        attempt_id=attempt.object_id,
        principal_id=ctx.principal_id,
        business_id=ctx.execution.business_id,
        operation=node.operation,
        targets=tuple(targets),
        payload=values,
        fence=fence,
    )
    running = attempts.advance(attempt, AttemptEvent.START, command_id=command.command_id)
    issued = Evidence(command.command_id, COMMAND, command.to_json(), 1, "issued")
    return Invoke(node, command, running, (attempt, running, issued))


def intent_as_planned(invoke: Invoke, planned: Execution, execution: Execution, evidence: Sequence[Evidence]) -> bool:
    """Whether a read (``execution`` and its ``evidence``) shows ``invoke``'s intent committed, as planned, unsettled.

    ``planned`` is the execution ``invoke`` was planned on.  True only where
    the read is exactly the intent and nothing after it: the execution at
    the revision it was planned on, its node still current, and every
    evidence object the intent commits at the revision, state and body it
    planned (the attempt at its newest, ``running``, revision).  This is
    what lets a worker whose answer to the intent's ``COMMIT`` was lost call
    the handler for it, once (specs/protocol.md, "A decision of unknown
    outcome"; seed 000, Fenced Execution Finalization: "Stable Command
    identity must exist before invocation").  Anything else (an attempt settled or moved on, a
    revision since, an object missing or different) is False, and the
    visit is planned afresh from the read, which sends an unsettled Command
    to reconciliation, never to its handler again.
    """
    if execution.revision != planned.revision or execution.current_node_id != invoke.node.node_id:
        return False
    wanted = {item.object_id: item for item in invoke.evidence}
    wanted[invoke.attempt.object_id] = invoke.attempt
    found = 0
    for item in evidence:
        intended = wanted.get(item.object_id)
        if intended is None:
            continue
        if (item.kind, item.revision, item.state) != (intended.kind, intended.revision, intended.state):
            return False
        # Compared as the text a store writes: a body read back holds lists where a plan holds tuples.
        if item.body_json() != intended.body_json():
            return False
        found += 1
    return found == len(wanted)


def settle(invoke: Invoke, result: CommandResult) -> Step | Finish:
    """What the Command's result commits: its outcome, the attempt's, and where the execution goes."""
    node, attempt = invoke.node, invoke.attempt
    result = storable_result(invoke.command, result)
    outcome = {"status": result.status.value, "detail": result.detail, "outputs": dict(result.outputs)}
    if result.rejection is not None:
        outcome["rejection"] = result.rejection.value
    command = Evidence(invoke.command.command_id, COMMAND, invoke.command.to_json(), 1, "issued").next(
        result.status.value, outcome
    )
    if result.status == CommandStatus.SUCCEEDED:
        done = attempts.advance(
            attempt, AttemptEvent.COMPLETE, outputs=dict(result.outputs), next_node_id=node.next
        )
        return Step(_step(attempt, node.next), (done, command))
    if result.status == CommandStatus.REJECTED and result.rejection is not None:
        failed = attempts.advance(
            attempt,
            AttemptEvent.FAIL,
            rejection=result.rejection.value,
            detail=result.detail,
            next_node_id=node.on_failure,
        )
        return Step(_step(attempt, node.on_failure), (failed, command))
    unknown = attempts.advance(attempt, AttemptEvent.OUTCOME_UNKNOWN, detail=result.detail)
    return Finish(
        ExecutionState.RECONCILIATION_REQUIRED,
        _step(attempt),
        (unknown, command),
        f"Command {invoke.command.command_id} ({node.operation}) has no conclusive result: {result.detail}",
        Reason.COMMAND_UNKNOWN.value,
    )


@attrs.frozen
class Reconciliation:
    """What a conclusive answer about an unsettled Command commits, and where the execution resumes."""

    evidence: tuple[Evidence, ...]
    next_node_id: str


def reconcile_command(
    node: LocalCommandNode, attempt: Evidence, command: Evidence, result: CommandResult, principal_id: str
) -> Reconciliation | None:
    """Settle an unsettled Command by what the CommandHandler found out, never by sending it again.

    Seed 000, local_command: 'Authorized reconciliation may settle the
    existing Command/Attempt or create only the explicitly permitted next
    evidence'.  Applied: the attempt completes and the execution resumes at
    ``next``; not applied: the attempt fails and it resumes at
    ``on_failure``.  None while the answer is still unknown, or is no
    result a store can keep (:func:`storable_result`): nothing may be
    recorded or resumed then.
    """
    result = _storable(command.object_id, str(command.body.get("operation", "")), result)
    if result.status == CommandStatus.UNKNOWN:
        return None
    applied = result.status == CommandStatus.SUCCEEDED
    continuation = node.next if applied else node.on_failure
    settled_attempt = attempts.advance(
        attempt,
        AttemptEvent.RECONCILE_APPLIED if applied else AttemptEvent.RECONCILE_NOT_APPLIED,
        outputs=dict(result.outputs),
        detail=result.detail,
        reconciled_by=principal_id,
        next_node_id=continuation,
    )
    settled_command = command.next(
        result.status.value,
        {"status": result.status.value, "detail": result.detail, "outputs": dict(result.outputs), "reconciled": True},
    )
    return Reconciliation((settled_attempt, settled_command), continuation)


def _end(node: EndNode, attempt: Evidence) -> Finish:
    succeeded = node.outcome == "succeeded"
    return Finish(
        ExecutionState.SUCCEEDED if succeeded else ExecutionState.FAILED,
        _step(attempt),
        (
            attempt,
            *attempts.settle(
                attempt, AttemptEvent.START, AttemptEvent.COMPLETE, outcome=node.outcome, error_code=node.error_code
            ),
        ),
        f"end {node.node_id}: {node.outcome}" + (f" ({node.error_code})" if node.error_code else ""),
        node.error_code,
    )


# --- admission ----------------------------------------------------------------------------------


class InputError(ValueError):
    """An admission input that does not fit the definition; the message names the field."""

    code = "invalid_input"


def _untyped_problem(value: object) -> str | None:
    """The rule for an input declared by name only: a string, a finite number or a boolean.

    A number is what the expression language calls one (specs/expressions.md,
    Values): a finite binary64 decimal or a 64-bit integer.  An integer
    beyond 64 bits is no value to a condition (it reads as unknown and the
    execution suspends), so admission refuses it instead.  The typed form's
    bound is narrower (+-(2^53 - 1), kernel/definition.py); this one keeps
    every value the names-only form admitted and a node could read.
    """
    if isinstance(value, str):
        if len(value) > MAX_INPUT_TEXT:
            return f"longer than {MAX_INPUT_TEXT} characters"
    elif isinstance(value, float):
        if not math.isfinite(value):
            return "must be a finite number"
    elif isinstance(value, bool):
        # Before int, which it subclasses: a boolean is its own type and has no range.
        return None
    elif isinstance(value, int):
        if not INTEGER_MIN <= value <= INTEGER_MAX:
            return (
                f"integer {integer_text(value)} is outside the 64-bit signed range "
                f"{INTEGER_MIN} to {INTEGER_MAX}, the only integers a node reads"
            )
    else:
        return f"must be a string, number or boolean, not {type(value).__name__}"
    return None


def _subclass_problem(value: object) -> str | None:
    """A host subclass of a scalar type (an IntEnum, a str subclass, numpy's float64): no value to a node.

    The expression language reads exact types only (specs/expressions.md,
    Values: a subclass may redefine equality).  A store that keeps the
    object as given (the in-memory one) would hand it to a condition, which
    finds it unknown and suspends; a store that writes JSON would read back
    a plain value.  Refused here, it means one thing on every store.
    """
    for plain in (bool, str, int, float):
        if isinstance(value, plain):
            if type(value) is plain:
                return None
            return f"is a {type(value).__name__}, a subclass of {plain.__name__}; give a plain {plain.__name__}"
    return None


def input_evidence(
    execution_id: str, definition: Definition, principal_id: str, data: Mapping[str, Any]
) -> Evidence:
    """The admission record of an execution: who runs it and with what input; raises InputError.

    Every declared input is checked against its type (specs/definitions.md,
    Typed inputs); a names-only input takes a string, a number or a boolean.
    Either way every string must be storable text (kernel/text.py).
    """
    if not isinstance(data, Mapping):
        raise InputError("input: must be a JSON object")
    declared = set(definition.inputs)
    unknown = sorted(set(data) - declared, key=str)
    if unknown:
        # A name that would garble the message, or flood it, is quoted (and cut) as shown() quotes values.
        name = unknown[0] if str(unknown[0]).isprintable() and len(str(unknown[0])) <= SHOWN_LENGTH else shown(unknown[0])
        raise InputError(
            f"input.{name}: not an input of {definition.definition_id} "
            f"(declared: {', '.join(definition.inputs) or 'none'})"
        )
    types = {t.name: t for t in definition.input_types or ()}
    required = [name for name in definition.inputs if name not in types or types[name].required]
    missing = [name for name in required if name not in data]
    if missing:
        raise InputError(f"input.{missing[0]}: required by {definition.definition_id} and missing")
    for name in sorted(data):
        value = data[name]
        # What no store can keep is named first: it is the same problem whatever the type says.
        unstorable = first_problem(value, f"input.{name}")
        if unstorable is not None:
            raise InputError(f"{unstorable[0]}: {unstorable[1]}")
        declared_type = types.get(name)
        found = _subclass_problem(value)
        if found is None:
            found = _untyped_problem(value) if declared_type is None else declared_type.problem(value)
        if found is not None:
            raise InputError(f"input.{name}: {found}")
    return Evidence(
        f"{execution_id}/input",
        EXECUTION_INPUT,
        {
            "principal_id": principal_id,
            "definition_id": definition.definition_id,
            "definition_revision": definition.revision,
            "input": dict(data),
        },
        1,
        "recorded",
    )


__all__ = [
    "APPROVAL_EVENT_TYPE",
    "APPROVAL_REQUEST",
    "COMMAND",
    "EXECUTION_INPUT",
    "MAX_RESULT_LENGTH",
    "AuthorityQuery",
    "Command",
    "CommandResult",
    "CommandStatus",
    "Context",
    "Finish",
    "InputError",
    "Invoke",
    "Plan",
    "Reason",
    "Reconciliation",
    "Rejection",
    "Step",
    "authority_query",
    "context_from_evidence",
    "current_node",
    "input_evidence",
    "intent_as_planned",
    "plan_visit",
    "reconcile_command",
    "settle",
    "storable_result",
]
