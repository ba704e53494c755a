"""The execution journal: a hash-chained record of a DAG's node states, and its replay.

The DAG node journal contract (seed 002), all sections; the byte-level format and
every refusal code are specified in ``specs/journal.md``.  Rules of this
module:

- The journal is the only authority on what happened to a node.  A node's
  state changes only by an event appended here, and only along the node
  machine's table (``machines.NODE``), asked at run time for every event:
  no transition is decided anywhere else.  Invalidated and superseded nodes
  therefore never resume, because the table has no way out of them.
- The header's digest is the chain root; event one names it as
  ``previous``, every later event names the event before it.  Ordinals are
  one-based and contiguous.  An event's digest covers its whole record, so
  removing, reordering, inserting, duplicating or splicing a record, or
  changing any byte of one, is found by :func:`replay`.
- Every command names the head it expects and the prior state of every node
  it touches.  A writer whose head is stale is refused (``stale_head``),
  never rebased onto the new head.  A request id seen before with the same
  request digest is an idempotent repeat (:class:`Unchanged`); with another
  digest it is ``conflicting_request``.  The request digest covers the
  stable content of the command (everything but the time, which belongs to
  the record).
- A new request's ``rationale`` and ``error`` are each at most
  ``MAX_RATIONALE`` characters (``invalid_request``, naming the field), as
  all free text given with a decision is.  The bound is checked when a
  command is appended, never in replay: replay reads what was appended, so
  a chain stored before the bound, with longer text, still replays, and a
  request it recorded is still an idempotent repeat.
- Authority is the digest-bound policy's: an actor must hold the role it
  acts in, the node must admit that role, and only a human may do human
  work, complete hybrid work, authorize a retry of non-automated work, give
  a human-only approval or bind a successor execution.
- An invalidation names an invalidation policy the authority policy
  declares (else ``unverified_authority``), in a role that policy admits
  (else ``forged_role``); automation may invalidate work a human did only
  where that policy says so (else ``automation_claims_human``).  It appends
  one event per node of the full descendant closure of the nodes it names,
  in the workflow's topological order, as one batch; a command whose nodes
  are not closed under descendants is ``partial_invalidation``.
- A successor binding supersedes every invalidated node at once, and only
  invalidated nodes, and names a successor whose header (found by the
  caller's header lookup, which an append cannot do without) has the named
  digest, declares that it supersedes this execution and runs the same
  workflow; else ``bad_successor_binding``.
- The projection (node states, attempt history, head, request digests) is
  derived from the header and events by :func:`replay`, and by
  :func:`preview`/:func:`append` one command at a time; both run the same
  rules (:func:`_apply`), so replaying a chain checks every rule every event
  was appended under, and a stored chain that breaks one is refused with
  that rule's code.  The projection is never stored as authority.
- The attempt history says how every attempt ended.  An invalidation ends
  the open attempt (authorized, active or blocked) of each node it covers
  as ``invalidated``, naming the event that cut it off; the records do not
  change, only what replay derives from them.  A successor binding ends no
  attempt: it supersedes only invalidated nodes, whose attempts have ended.
- The values are ``journal_records.py``, the bytes ``journal_codec.py``;
  this module re-exports both, so ``from fencekeeper.kernel import journal``
  is the whole API.
- Everything here is pure: the caller supplies the time (``now``, UTC) and
  receives values.  Nothing is half-applied: a refused command leaves the
  journal it was given exactly as it was.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Final, TypeAlias, TypeVar

import attrs

from .canonical import digest_bytes, digest_of, is_digest, record_bytes
from .common import MAX_RATIONALE, shown
from .dag import NodeKind, VerifiedWorkflow
from .definition import IDENTIFIER
from .journal_codec import (
    command_from_json,
    decode_event,
    decode_header,
    encode_event,
    encode_header,
    policy_from_json,
    read_event,
)
from .journal_codes import JournalCode, JournalError, Refusal
from .journal_records import (
    FORMAT,
    MAX_WHOLE,
    SUCCESSOR_KIND,
    ActorKind,
    Appended,
    Approval,
    Assignment,
    Attempt,
    AttemptRef,
    AttemptStatus,
    AuthorityPolicy,
    BindSuccessor,
    Command,
    Event,
    EventLog,
    Header,
    Invalidate,
    Invalidation,
    InvalidationPolicy,
    Journal,
    NodeExpectation,
    Outcome,
    RecordRef,
    RequestIndex,
    Transition,
    Unchanged,
    VerifiedPolicy,
    _Recorded,
    format_time,
    request_digest,
)
from .machines import NODE, NodeEvent, NodeState, initial_node_state

_K = TypeVar("_K")
_V = TypeVar("_V")

C = JournalCode


# --- verification of the authority and the header ---------------------------------------------


@functools.lru_cache(maxsize=4096)
def _is_identifier(value: str) -> bool:
    # Remembered: replay checks the same few actors, roles, nodes and record
    # kinds on every event, and the answer depends on the text alone.
    return IDENTIFIER.fullmatch(value) is not None


def _identifier(value: str, where: str, code: JournalCode = C.INVALID_REQUEST) -> None:
    # The type first: the remembered match takes only hashable text.
    if type(value) is not str or not _is_identifier(value):
        raise JournalError(code, f"{where}: malformed identifier {shown(value)}")


def _argument(value: object, kind: type | tuple[type, ...], name: str) -> None:
    """An argument that is not of its type: a TypeError naming it, before anything reads it.

    Not a refusal: these are the values a caller builds once (the verified
    workflow and policy, the journal, the stored bytes), not a command.
    """
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise TypeError(f"{name}: must be of type {names}, got {type(value).__name__}")


def _stored_events(events: object) -> None:
    # Any sequence of records; text or bytes would be taken apart character by character.
    if not isinstance(events, Sequence) or isinstance(events, str | bytes | bytearray):
        raise TypeError(f"events: must be a sequence of stored records (bytes), got {type(events).__name__}")


def verify_policy(policy: AuthorityPolicy, workflow: VerifiedWorkflow) -> VerifiedPolicy:
    """The policy, if it is bound to ``workflow`` and approved by one of its humans; else ``unverified_authority``."""
    _argument(policy, AuthorityPolicy, "policy")
    _argument(workflow, VerifiedWorkflow, "workflow")
    bad = C.UNVERIFIED_AUTHORITY
    for value, where in ((policy.policy_id, "policy"), (policy.scope, "scope"), (policy.protocol, "protocol")):
        _identifier(value, f"policy: {where}", bad)
    if policy.workflow_digest != workflow.digest:
        raise JournalError(
            bad, f"policy {policy.policy_id!r} is bound to workflow {policy.workflow_digest}, not {workflow.digest}"
        )
    actors: dict[str, Assignment] = {}
    for assignment in policy.assignments:
        _identifier(assignment.actor_id, "policy: assignments: actor", bad)
        for role in assignment.roles:
            _identifier(role, f"policy: actor {assignment.actor_id!r}: roles", bad)
        if assignment.actor_id in actors:
            raise JournalError(bad, f"policy: actor {assignment.actor_id!r} is assigned twice")
        actors[assignment.actor_id] = assignment
    approver = actors.get(policy.approved_by)
    if approver is None or approver.kind is not ActorKind.HUMAN:
        raise JournalError(bad, f"policy: approved_by {policy.approved_by!r} is not a human actor of the policy")
    invalidations: dict[str, InvalidationPolicy] = {}
    for declared in policy.invalidation_policies:
        where = f"policy: invalidation policy {declared.policy_id!r}"
        _identifier(declared.policy_id, "policy: invalidation_policies: policy", bad)
        if declared.policy_id in invalidations:
            raise JournalError(bad, f"{where} is declared twice")
        # Never empty: an invalidation policy that named no role would admit
        # nobody, and "any role" is not something the human approver granted.
        if not declared.roles:
            raise JournalError(bad, f"{where} names no role that may invalidate")
        for role in declared.roles:
            _identifier(role, f"{where}: roles", bad)
        if len(set(declared.roles)) != len(declared.roles):
            raise JournalError(bad, f"{where} names a role twice")
        invalidations[declared.policy_id] = declared
    return VerifiedPolicy(
        policy=policy,
        digest=digest_of(policy.to_json()),
        actors=MappingProxyType(actors),
        invalidations=MappingProxyType(invalidations),
    )


def create_header(
    execution_id: str,
    workflow: VerifiedWorkflow,
    policy: VerifiedPolicy,
    *,
    created_by: str,
    now: datetime,
    supersedes: str | None = None,
) -> Header:
    """A header binding ``workflow`` and ``policy``, created by one of the policy's humans."""
    _argument(workflow, VerifiedWorkflow, "workflow")
    _argument(policy, VerifiedPolicy, "policy")
    _identifier(execution_id, "execution id")
    if supersedes is not None:
        _identifier(supersedes, "supersedes")
        if supersedes == execution_id:
            raise JournalError(C.BAD_SUCCESSOR_BINDING, f"execution {execution_id!r} cannot supersede itself")
    header = Header(
        execution_id=execution_id,
        workflow_digest=workflow.digest,
        policy_digest=policy.digest,
        protocol=policy.policy.protocol,
        nodes=workflow.order,
        created_by=created_by,
        created_at=format_time(now),
        supersedes=supersedes,
    )
    header = attrs.evolve(header, digest=digest_bytes(record_bytes(header.body_json())))
    _check_header_binding(header, workflow, policy)
    return header


def _check_header_binding(header: Header, workflow: VerifiedWorkflow, policy: VerifiedPolicy) -> None:
    bad = C.UNVERIFIED_AUTHORITY
    if header.workflow_digest != workflow.digest:
        raise JournalError(bad, f"the header is bound to workflow {header.workflow_digest}, not {workflow.digest}", 0)
    if header.policy_digest != policy.digest:
        raise JournalError(bad, f"the header is bound to policy {header.policy_digest}, not {policy.digest}", 0)
    if policy.policy.workflow_digest != workflow.digest:
        raise JournalError(bad, "the policy is not bound to the header's workflow", 0)
    if header.protocol != policy.policy.protocol:
        raise JournalError(bad, f"the header names protocol {header.protocol!r}, the policy {policy.policy.protocol!r}", 0)
    if header.nodes != workflow.order:
        raise JournalError(bad, "the header's node set is not the workflow's", 0)
    creator = policy.actors.get(header.created_by)
    if creator is None or creator.kind is not ActorKind.HUMAN:
        raise JournalError(bad, f"created_by {header.created_by!r} is not a human actor of the policy", 0)


def new_journal(header: Header, workflow: VerifiedWorkflow, policy: VerifiedPolicy) -> Journal:
    """The empty journal of ``header``: roots ``ready``, every other node ``pending``."""
    _argument(header, Header, "header")
    _argument(workflow, VerifiedWorkflow, "workflow")
    _argument(policy, VerifiedPolicy, "policy")
    _check_header_binding(header, workflow, policy)
    if header.digest != digest_bytes(record_bytes(header.body_json())):
        raise JournalError(C.ALTERED_DIGEST, "the header's digest does not match its content", 0)
    if header.supersedes == header.execution_id:
        # create_header refuses to write it; a stored header is held to the same rule.
        raise JournalError(
            C.BAD_SUCCESSOR_BINDING, f"supersedes: execution {header.execution_id!r} cannot supersede itself", 0
        )
    states = {
        node_id: initial_node_state(bool(workflow.nodes[node_id].predecessors)) for node_id in workflow.order
    }
    return Journal(
        header=header,
        workflow=workflow,
        policy=policy,
        events=EventLog(),
        states=MappingProxyType(states),
        attempts=MappingProxyType({}),
        workers=MappingProxyType({}),
        requests=RequestIndex(),
    )


# --- preview and append -----------------------------------------------------------------------


class _Builder:
    """The projection being extended, one event at a time, without copying the journal's history.

    In replay (``stored`` is set) each event a rule emits is checked against
    the stored one instead of being signed, and the stored one is kept.
    """

    __slots__ = (
        "attempts", "base", "events", "execution_id", "head", "headers", "records", "requests", "resolve", "states",
        "stored", "workers",
    )  # fmt: skip

    def __init__(self, base: Journal, resolve: Resolver | None = None, headers: HeaderLookup | None = None) -> None:
        self.base = base
        self.resolve = resolve
        self.headers = headers
        self.events: list[Event] = []
        self.records: list[bytes] = []
        self.head = base.head
        self.requests: dict[str, _Recorded] = {}
        self.states = _mutable(base.states)
        self.attempts = _mutable(base.attempts)
        self.workers = _mutable(base.workers)
        self.stored: list[Event] | None = None
        self.execution_id = base.header.execution_id

    def known_request(self, request_id: str) -> _Recorded | None:
        found = self.requests.get(request_id)
        return found if found is not None else self.base.requests.recorded(request_id)

    def emit(self, event: Event) -> None:
        if self.stored is None:
            event, record = event.signed()
            self.records.append(record)
        else:
            event = _matches_stored(event, self.stored)
        self.events.append(event)
        self.head = event.digest
        self.states[event.node_id] = event.resulting_state

    def journal(self) -> Journal:
        base = self.base
        return Journal(
            header=base.header,
            workflow=base.workflow,
            policy=base.policy,
            events=base.events.extended(self.events),
            states=MappingProxyType(self.states),
            attempts=MappingProxyType(self.attempts),
            workers=MappingProxyType(self.workers),
            requests=base.requests.extended(self.requests),
        )


def _mutable(mapping: Mapping[_K, _V]) -> dict[_K, _V]:
    # A journal's mappings are read-only proxies of dicts: the proxy's copy()
    # is its dict's own, several times faster than dict() walking the proxy,
    # and paid on every append.
    return mapping.copy() if isinstance(mapping, MappingProxyType) else dict(mapping)


def _matches_stored(produced: Event, stored: list[Event]) -> Event:
    if not stored:
        raise JournalError(C.MALFORMED_RECORD, "the stored batch is shorter than its request produces")
    expected = stored.pop(0)
    if produced == expected:
        return expected
    if produced.resulting_state != expected.resulting_state:
        raise JournalError(
            C.INVALID_TRANSITION,
            f"records {expected.prior_state.value} --{expected.event.value}--> {expected.resulting_state.value}; "
            f"the node table says {produced.resulting_state.value}",
        )
    if produced.request_digest != expected.request_digest:
        raise JournalError(C.ALTERED_DIGEST, "the request digest does not match the request the event records")
    differing = next(
        f.name for f in attrs.fields(Event) if f.eq and getattr(produced, f.name) != getattr(expected, f.name)
    )
    raise JournalError(C.MALFORMED_RECORD, f"{differing}: differs from what its request produces")


Resolver: TypeAlias = Callable[[RecordRef], bool]
"""Seed 002's record resolver: whether a referenced record exists, held elsewhere, with exactly that digest."""

HeaderLookup: TypeAlias = Callable[[str], Header | None]
"""The header of the execution with this id, strictly decoded, or None if there is none (a successor's)."""


def preview(
    journal: Journal,
    command: Command,
    now: datetime,
    resolve: Resolver | None = None,
    *,
    headers: HeaderLookup | None = None,
) -> Outcome:
    """What appending ``command`` at ``now`` would do: the new journal and its events, an idempotent repeat, or a refusal.

    With ``resolve``, every record the command references (records,
    approval records, an invalidation's source) must resolve, or the command
    is refused ``unresolved_record``.  A successor binding is admitted only
    with ``headers``, which must find the successor's header, with the digest
    the binding names, declaring that it supersedes this execution and bound
    to the same workflow; else ``bad_successor_binding``.
    """
    _argument(journal, Journal, "journal")
    try:
        at = format_time(now)
    except JournalError as exc:
        return exc.refusal
    builder = _Builder(journal, resolve, headers)
    try:
        repeated = _apply(builder, command, at)
    except JournalError as exc:
        return exc.refusal
    if repeated:
        recorded = journal.requests.recorded(command.request_id)
        assert recorded is not None
        return Unchanged(journal, command.request_id, journal.events[recorded.first - 1 : recorded.first - 1 + recorded.count])
    return Appended(builder.journal(), tuple(builder.events), tuple(builder.records))


def append(
    journal: Journal,
    command: Command,
    now: datetime,
    resolve: Resolver | None = None,
    *,
    headers: HeaderLookup | None = None,
) -> Journal | Refusal:
    """The journal with ``command`` appended (the same journal for an idempotent repeat), or a refusal."""
    outcome = preview(journal, command, now, resolve, headers=headers)
    if isinstance(outcome, Refusal):
        return outcome
    return outcome.journal


def _apply(builder: _Builder, command: Command, at: str, digest: str | None = None) -> bool:
    """Run every rule for ``command``, emitting its events; True for an idempotent repeat (nothing emitted).

    ``digest``, when given, is ``request_digest(command)`` computed another
    way (replay has it from the stored record's text, see ``read_event``).
    """
    _check_common(command)
    known = builder.known_request(command.request_id)
    if known is None and builder.stored is None:
        # Only a new request is held to the bound, and only when it is
        # appended: a chain stored before the bound existed replays as it
        # was written, and a request it recorded is still recognised as a
        # repeat.  Checked before the request digest, which would encode
        # all of an over-long text.
        _check_bounds(command)
    if digest is None:
        digest = request_digest(command)
    if known is not None:
        if known.digest == digest:
            return True
        raise JournalError(
            C.CONFLICTING_REQUEST, f"request {command.request_id!r} was recorded with other content ({known.digest})"
        )
    if command.expected_head != builder.head:
        raise JournalError(C.STALE_HEAD, f"expected head {command.expected_head}, but the head is {builder.head}")
    if builder.resolve is not None:
        for record in _references(command):
            if not builder.resolve(record):
                raise JournalError(
                    C.UNRESOLVED_RECORD, f"record {record.kind}/{record.ref_id} with digest {record.digest} does not resolve"
                )
    before = len(builder.events)
    if isinstance(command, Transition):
        _transition(builder, command, digest, at)
    elif isinstance(command, Invalidate):
        _invalidate(builder, command, digest, at)
    else:
        _bind_successor(builder, command, digest, at)
    emitted = len(builder.events) - before
    builder.requests[command.request_id] = _Recorded(digest, len(builder.base.events) + before + 1, emitted)
    return False


def _references(command: Command) -> tuple[RecordRef, ...]:
    if isinstance(command, Transition):
        return (*command.records, *(a.record for a in command.approvals))
    if isinstance(command, Invalidate):
        return (command.source,)
    # A successor's header is resolved by the header lookup, which also
    # checks what the header declares (_bind_successor).
    return ()


def _of_type(value: object, kind: type | tuple[type, ...], where: str) -> None:
    """A field of a command that is not of its type: refused as it would be once written, never appended."""
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise JournalError(C.INVALID_REQUEST, f"{where}: must be of type {names}, got {type(value).__name__}")


def _tuple_of(values: object, kind: type, where: str) -> None:
    # A list has always been taken where a tuple is declared, and replays alike.
    _of_type(values, (tuple, list), where)
    assert isinstance(values, tuple | list)
    for value in values:
        _of_type(value, kind, where)


_COMMANDS: Final = (Transition, Invalidate, BindSuccessor)


def _check_common(command: Command) -> None:
    # Every field of its type before any is read: a command is appended only
    # if its record can be replayed, and replay reads each field by its type.
    _of_type(command, _COMMANDS, "command")
    _of_type(command.rationale, str, "rationale")
    _storable(command.rationale, "rationale")
    _identifier(command.request_id, "request_id")
    _identifier(command.actor_id, "actor")
    _identifier(command.role, "role")
    if not is_digest(command.expected_head):
        raise JournalError(C.INVALID_REQUEST, f"expected_head: {shown(command.expected_head)} is not a sha256: digest")
    if isinstance(command, Transition):
        _identifier(command.node_id, "node")
        _of_type(command.event, NodeEvent, "event")
        _of_type(command.prior_state, NodeState, "prior_state")
        _tuple_of(command.records, RecordRef, "records")
        _tuple_of(command.approvals, Approval, "approvals")
        if command.error is not None:
            _of_type(command.error, str, "error")
            _storable(command.error, "error")
        for record in command.records:
            _check_record(record, "records")
        for approval in command.approvals:
            _identifier(approval.actor_id, "approvals: actor")
            _identifier(approval.role, "approvals: role")
            _check_record(approval.record, "approvals: record")
        if command.attempt is not None:
            _of_type(command.attempt, AttemptRef, "attempt")
            _identifier(command.attempt.attempt_id, "attempt id")
            if type(command.attempt.sequence) is not int:
                raise JournalError(C.INVALID_REQUEST, f"attempt sequence {shown(command.attempt.sequence)} is not a whole number")
            if not 1 <= command.attempt.sequence <= MAX_WHOLE:
                raise JournalError(C.INVALID_REQUEST, f"attempt sequence {shown(command.attempt.sequence)} is out of range")
        if len({(r.kind, r.ref_id) for r in command.records}) != len(command.records):
            raise JournalError(C.INVALID_REQUEST, "records: a kind/id is referenced twice")
        if command.event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
            raise JournalError(
                C.INVALID_REQUEST, f"{command.event.value} is appended by an invalidation or successor binding command"
            )
    else:
        _tuple_of(command.nodes, NodeExpectation, "nodes")
        if not command.nodes:
            raise JournalError(C.INVALID_REQUEST, "nodes: names no node")
        for expectation in command.nodes:
            _identifier(expectation.node_id, "nodes")
            _of_type(expectation.prior_state, NodeState, "nodes: prior_state")
        if len({n.node_id for n in command.nodes}) != len(command.nodes):
            raise JournalError(C.INVALID_REQUEST, "nodes: names a node twice")
        if isinstance(command, Invalidate):
            _check_record(command.source, "source")
            _identifier(command.policy, "policy")
        else:
            _check_record(command.successor, "successor")


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _storable(value: str, where: str) -> None:
    # A lone surrogate has no UTF-8 form, so no canonical bytes: without this
    # the command failed only when its record was encoded, as a
    # malformed_record naming no field.  NUL is not refused here, unlike in
    # kernel/text.py: a record keeps it escaped (\u0000) in bytes, never in a
    # text column, and chains that hold one replay as they always have.
    found = _SURROGATE.search(value)
    if found is not None:
        raise JournalError(
            C.INVALID_REQUEST,
            f"{where}: contains an unpaired surrogate (U+{ord(found.group()):04X}), which is not a character",
        )


def _check_bounds(command: Command) -> None:
    """The free text of a command appended now: at most ``MAX_RATIONALE`` characters each (specs/journal.md, section 6, rule 2)."""
    texts = [("rationale", command.rationale)]
    if isinstance(command, Transition) and command.error is not None:
        texts.append(("error", command.error))
    for where, text in texts:
        if len(text) > MAX_RATIONALE:
            raise JournalError(C.INVALID_REQUEST, f"{where}: must be at most {MAX_RATIONALE} characters, got {len(text)}")


def _check_record(record: RecordRef, where: str) -> None:
    _of_type(record, RecordRef, where)
    _identifier(record.kind, f"{where}: kind")
    _identifier(record.ref_id, f"{where}: id")
    if not is_digest(record.digest):
        raise JournalError(C.INVALID_REQUEST, f"{where}: digest {shown(record.digest)} is not sha256: and 64 hex digits")


def _node(builder: _Builder, node_id: str, prior: NodeState) -> NodeState:
    state = builder.states.get(node_id)
    if state is None:
        raise JournalError(C.UNKNOWN_NODE, f"node {node_id!r} is not in workflow {builder.base.workflow.workflow_id!r}")
    if state is not prior:
        raise JournalError(C.PRIOR_STATE_MISMATCH, f"node {node_id!r} is {state.value}, not {prior.value}")
    return state


def _step(node_id: str, state: NodeState, event: NodeEvent) -> NodeState:
    if not NODE.allows(state, event):
        raise JournalError(
            C.INVALID_TRANSITION, f"node {node_id!r}: the node machine has no {event.value} from {state.value}"
        )
    return NODE.step(state, event)


def _authorize(
    builder: _Builder,
    actor_id: str,
    role: str,
    *,
    node_roles: Sequence[str],
    human: bool,
    what: str | Callable[[], str],
) -> None:
    """``what`` names the act in a refusal; a callable is asked only when one is made (replay authorizes every event)."""
    assignment = builder.base.policy.actors.get(actor_id)
    if assignment is None:
        raise JournalError(C.FORGED_ROLE, f"actor {actor_id!r} has no assignment in the policy")
    if role not in assignment.roles:
        raise JournalError(C.FORGED_ROLE, f"actor {actor_id!r} is not assigned role {role!r} by the policy")
    if node_roles and role not in node_roles:
        raise JournalError(C.FORGED_ROLE, f"{_text(what)} does not admit role {role!r}")
    if human and assignment.kind is not ActorKind.HUMAN:
        raise JournalError(C.AUTOMATION_CLAIMS_HUMAN, f"{_text(what)} needs a human; {actor_id!r} is automation")


def _text(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def _needs_human(kind: NodeKind, event: NodeEvent) -> bool:
    if kind is NodeKind.HUMAN:
        return event is not NodeEvent.DEPENDENCIES_SATISFIED
    if kind is NodeKind.AUTOMATED:
        return False
    # Hybrid work may be done by automation, but completed only by a human;
    # an approval node's work is its approvals, checked on their own.
    return event in (NodeEvent.WORK_COMPLETED, NodeEvent.RETRY_AUTHORIZED)


def _transition(builder: _Builder, command: Transition, digest: str, at: str) -> None:
    node_id = command.node_id
    state = _node(builder, node_id, command.prior_state)
    resulting = _step(node_id, state, command.event)
    node = builder.base.workflow.nodes[node_id]
    _authorize(
        builder,
        command.actor_id,
        command.role,
        # That the dependencies are satisfied is a fact about other nodes, not
        # work on this one: any role the policy grants may record it.
        node_roles=() if command.event is NodeEvent.DEPENDENCIES_SATISFIED else node.roles,
        human=_needs_human(node.kind, command.event),
        what=lambda: f"{command.event.value} on {node.kind.value} node {node_id!r}",
    )
    event = command.event
    attempts = builder.attempts.get(node_id, ())
    if event is NodeEvent.DEPENDENCIES_SATISFIED:
        gaps = [p for p in node.predecessors if builder.states[p] is not NodeState.COMPLETED]
        if gaps:
            raise JournalError(
                C.DEPENDENCY_GAP,
                f"node {node_id!r}: predecessors {gaps} are not completed and current",
            )
        if command.attempt is not None:
            raise JournalError(C.INVALID_ATTEMPT, f"{event.value} binds no attempt")
    else:
        _check_independence(builder, node_id, command.actor_id)
        builder.attempts[node_id] = _attempts_after(node_id, event, command.attempt, command.error, attempts)
        workers = builder.workers.get(node_id, frozenset())
        if command.actor_id not in workers:
            builder.workers[node_id] = workers | {command.actor_id}
    if event is NodeEvent.WORK_FAILED and not command.error:
        raise JournalError(C.INVALID_REQUEST, "work-failed must say what the error was")
    if event is not NodeEvent.WORK_FAILED and command.error is not None:
        raise JournalError(C.INVALID_REQUEST, f"{event.value} carries no error")
    if event is NodeEvent.WORK_COMPLETED:
        held = {(r.kind, r.ref_id) for r in command.records}
        missing = [f"{a.kind}/{a.artifact_id}" for a in node.outputs if (a.kind, a.artifact_id) not in held]
        if missing:
            raise JournalError(
                C.MISSING_DECLARED_OUTPUT, f"node {node_id!r}: completion does not reference {', '.join(missing)}"
            )
    if command.approvals or (node.kind is NodeKind.APPROVAL and event is NodeEvent.WORK_COMPLETED):
        _check_approvals(builder, command, node_id)
    builder.emit(
        Event(
            execution_id=builder.execution_id,
            ordinal=len(builder.base.events) + len(builder.events) + 1,
            previous=builder.head,
            request_id=command.request_id,
            request_digest=digest,
            node_id=node_id,
            event=event,
            prior_state=state,
            resulting_state=resulting,
            actor_id=command.actor_id,
            role=command.role,
            at=at,
            rationale=command.rationale,
            attempt=command.attempt,
            records=command.records,
            approvals=command.approvals,
            error=command.error,
            invalidation=None,
            successor=None,
        )
    )


def _check_independence(builder: _Builder, node_id: str, actor_id: str) -> None:
    independent = builder.base.workflow.independent[node_id]
    if not independent:
        return
    for other in sorted(independent):
        if actor_id in builder.workers.get(other, ()):
            raise JournalError(
                C.NOT_INDEPENDENT,
                f"node {node_id!r} must be worked independently of {other!r}, where {actor_id!r} has worked",
            )


def _attempts_after(
    node_id: str, event: NodeEvent, attempt: AttemptRef | None, error: str | None, attempts: tuple[Attempt, ...]
) -> tuple[Attempt, ...]:
    """The node's attempt history after ``event``; every earlier attempt, failures included, is kept."""
    if attempt is None:
        raise JournalError(C.INVALID_ATTEMPT, f"{_where(node_id, event)} must bind an attempt id and sequence")
    last = attempts[-1] if attempts else None
    opens = event in (NodeEvent.WORK_STARTED, NodeEvent.RETRY_AUTHORIZED)
    if event is NodeEvent.WORK_STARTED and last is not None and last.status is AttemptStatus.AUTHORIZED:
        # A retry authorized this attempt; the work now starts it.
        if (attempt.attempt_id, attempt.sequence) != (last.attempt_id, last.sequence):
            raise JournalError(
                C.INVALID_ATTEMPT, f"{_where(node_id, event)}: the authorized attempt is {last.attempt_id!r} #{last.sequence}"
            )
        return (*attempts[:-1], attrs.evolve(last, status=AttemptStatus.ACTIVE))
    if opens:
        if attempt.sequence != len(attempts) + 1:
            raise JournalError(C.INVALID_ATTEMPT, f"{_where(node_id, event)}: the next attempt is #{len(attempts) + 1}, not #{attempt.sequence}")
        if any(a.attempt_id == attempt.attempt_id for a in attempts):
            raise JournalError(C.INVALID_ATTEMPT, f"{_where(node_id, event)}: attempt id {attempt.attempt_id!r} was used before")
        status = AttemptStatus.ACTIVE if event is NodeEvent.WORK_STARTED else AttemptStatus.AUTHORIZED
        return (*attempts, Attempt(attempt.attempt_id, attempt.sequence, status))
    if last is None or (attempt.attempt_id, attempt.sequence) != (last.attempt_id, last.sequence):
        current = "none" if last is None else f"{last.attempt_id!r} #{last.sequence}"
        raise JournalError(C.INVALID_ATTEMPT, f"{_where(node_id, event)}: binds {attempt.attempt_id!r} #{attempt.sequence}; the current attempt is {current}")
    status = _STATUS_AFTER[event]
    return (*attempts[:-1], Attempt(last.attempt_id, last.sequence, status, error))


def _where(node_id: str, event: NodeEvent) -> str:
    return f"node {node_id!r}: {event.value}"


_STATUS_AFTER: Final = MappingProxyType({
    NodeEvent.WORK_BLOCKED: AttemptStatus.BLOCKED,
    NodeEvent.BLOCK_CLEARED: AttemptStatus.ACTIVE,
    NodeEvent.WORK_COMPLETED: AttemptStatus.COMPLETED,
    NodeEvent.WORK_FAILED: AttemptStatus.FAILED,
})  # fmt: skip


def _check_approvals(builder: _Builder, command: Transition, node_id: str) -> None:
    node = builder.base.workflow.nodes[node_id]
    requirement = node.approval
    if requirement is None or command.event is not NodeEvent.WORK_COMPLETED:
        raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r}: approvals belong only to an approval node's completion")
    actors = builder.base.policy.actors
    for approval in command.approvals:
        assignment = actors.get(approval.actor_id)
        if assignment is None or approval.role not in assignment.roles:
            raise JournalError(
                C.FORGED_ROLE, f"approval by {approval.actor_id!r} as {approval.role!r} is not granted by the policy"
            )
        if approval.role not in (requirement.roles or node.roles):
            raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r} does not take approvals as {approval.role!r}")
        if requirement.human_only and assignment.kind is not ActorKind.HUMAN:
            raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r} takes human approvals only; {approval.actor_id!r} is automation")
    # One decision given twice is one approval, distinct actors required or
    # not: an approval record stands for one approval, and an actor approves
    # once in a role.  Else a repeat would count towards the minimum.
    records: set[tuple[str, str]] = set()
    for approval in command.approvals:
        record = (approval.record.kind, approval.record.ref_id)
        if record in records:
            raise JournalError(
                C.INVALID_APPROVAL, f"node {node_id!r}: approval record {'/'.join(record)} is given for two approvals"
            )
        records.add(record)
    if len(command.approvals) < requirement.minimum:
        raise JournalError(
            C.INVALID_APPROVAL, f"node {node_id!r} needs {requirement.minimum} approvals, got {len(command.approvals)}"
        )
    approvers = [a.actor_id for a in command.approvals]
    if requirement.distinct_actors and len(set(approvers)) != len(approvers):
        raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r} needs distinct approvers; got {approvers}")
    given: set[tuple[str, str]] = set()
    for approval in command.approvals:
        if (approval.actor_id, approval.role) in given:
            raise JournalError(
                C.INVALID_APPROVAL, f"node {node_id!r}: {approval.actor_id!r} approves as {approval.role!r} twice"
            )
        given.add((approval.actor_id, approval.role))
    missing = [r for r in requirement.roles if r not in {a.role for a in command.approvals}]
    if missing:
        raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r} needs an approval as {', '.join(missing)}")


class _ShortBatch(JournalError):
    """A batch command that leaves out nodes its request must cover.

    Replay tells it from the batch's other refusals: a stored batch read up
    to a record that cannot be read is short whenever that record is one of
    its own, and that record is then the first bad one (``continue_replay``).
    """


def _batch_event(
    builder: _Builder,
    command: Invalidate | BindSuccessor,
    *,
    digest: str,
    at: str,
    node_id: str,
    state: NodeState,
    event: NodeEvent,
) -> None:
    builder.emit(
        Event(
            execution_id=builder.execution_id,
            ordinal=len(builder.base.events) + len(builder.events) + 1,
            previous=builder.head,
            request_id=command.request_id,
            request_digest=digest,
            node_id=node_id,
            event=event,
            prior_state=state,
            resulting_state=_step(node_id, state, event),
            actor_id=command.actor_id,
            role=command.role,
            at=at,
            rationale=command.rationale,
            attempt=None,
            records=(),
            approvals=(),
            error=None,
            invalidation=Invalidation(command.source, command.policy) if isinstance(command, Invalidate) else None,
            successor=command.successor if isinstance(command, BindSuccessor) else None,
        )
    )


def _invalidate(builder: _Builder, command: Invalidate, digest: str, at: str) -> None:
    named: dict[str, NodeState] = {}
    for expectation in command.nodes:
        named[expectation.node_id] = _node(builder, expectation.node_id, expectation.prior_state)
        _step(expectation.node_id, expectation.prior_state, NodeEvent.WORK_INVALIDATED)
    policy = builder.base.policy
    declared = policy.invalidations.get(command.policy)
    if declared is None:
        raise JournalError(
            C.UNVERIFIED_AUTHORITY,
            f"invalidation policy {command.policy!r} is not declared by authority policy {policy.policy.policy_id!r}",
        )
    _authorize(
        builder,
        command.actor_id,
        command.role,
        node_roles=declared.roles,
        human=False,
        what=f"invalidation policy {command.policy!r}",
    )
    workflow = builder.base.workflow
    closure = [
        node_id
        for node_id in workflow.closure(tuple(named))
        if builder.states[node_id] not in (NodeState.INVALIDATED, NodeState.SUPERSEDED)
    ]
    missing = [node_id for node_id in closure if node_id not in named]
    if missing:
        raise _ShortBatch(
            C.PARTIAL_INVALIDATION,
            f"invalidating {sorted(named)} leaves dependent nodes {missing} appearing current; the batch must name them too",
        )
    if policy.actors[command.actor_id].kind is not ActorKind.HUMAN and not declared.automation_may_invalidate_human_work:
        # Seed 002: human and hybrid work needs an actor "admitted by ... the
        # digest-bound authority policy"; undoing work a human did is such
        # an act, so automation may do it only where the policy says so.
        human_work = [
            node_id
            for node_id in closure
            if any(
                (worker := policy.actors.get(actor)) is not None and worker.kind is ActorKind.HUMAN
                for actor in builder.workers.get(node_id, ())
            )
        ]
        if human_work:
            raise JournalError(
                C.AUTOMATION_CLAIMS_HUMAN,
                f"{command.actor_id!r} is automation and invalidation policy {command.policy!r} does not let "
                f"automation invalidate work humans did on {human_work}",
            )
    for node_id in closure:
        _batch_event(
            builder,
            command,
            digest=digest,
            at=at,
            node_id=node_id,
            state=named[node_id],
            event=NodeEvent.WORK_INVALIDATED,
        )
        _cut_off(builder, node_id, builder.events[-1].ordinal)


def _cut_off(builder: _Builder, node_id: str, ordinal: int) -> None:
    """End the node's open attempt, if it has one, as ``invalidated`` by the event at ``ordinal``.

    Invalidated nodes never resume, so an attempt left authorized, active or
    blocked would read forever as work still under way.  Only the last
    attempt can be open (a new one opens only after the last has failed).
    """
    attempts = builder.attempts.get(node_id, ())
    if attempts and attempts[-1].status.is_open:
        ended = attrs.evolve(attempts[-1], status=AttemptStatus.INVALIDATED, ended_by=ordinal)
        builder.attempts[node_id] = (*attempts[:-1], ended)


def _bind_successor(builder: _Builder, command: BindSuccessor, digest: str, at: str) -> None:
    successor = command.successor
    bad = C.BAD_SUCCESSOR_BINDING
    if successor.kind != SUCCESSOR_KIND:
        raise JournalError(bad, f"successor: names a {successor.kind!r} record, not an {SUCCESSOR_KIND!r} header")
    _check_record(successor, "successor")
    if successor.ref_id == builder.execution_id:
        raise JournalError(bad, "successor: an execution cannot succeed itself")
    named: dict[str, NodeState] = {}
    for expectation in command.nodes:
        named[expectation.node_id] = _node(builder, expectation.node_id, expectation.prior_state)
    not_invalidated = [n for n, s in named.items() if s is not NodeState.INVALIDATED]
    if not_invalidated:
        raise JournalError(bad, f"nodes {not_invalidated} are not invalidated; only invalidated work can be superseded")
    invalidated = [n for n in builder.base.workflow.order if builder.states[n] is NodeState.INVALIDATED]
    left = [n for n in invalidated if n not in named]
    if left:
        raise _ShortBatch(bad, f"invalidated nodes {left} would be left without the successor")
    _authorize(
        builder, command.actor_id, command.role, node_roles=(), human=True, what="binding a successor execution"
    )
    _check_successor_header(builder, successor)
    for node_id in invalidated:
        _batch_event(
            builder,
            command,
            digest=digest,
            at=at,
            node_id=node_id,
            state=NodeState.INVALIDATED,
            event=NodeEvent.SUCCESSOR_BOUND,
        )


def _check_successor_header(builder: _Builder, successor: RecordRef) -> None:
    """Seed 002: a successor execution takes over this one's work, so its header must say so, for this workflow."""
    bad = C.BAD_SUCCESSOR_BINDING
    if builder.headers is None:
        if builder.stored is None:
            raise JournalError(bad, f"successor {successor.ref_id!r}: its header cannot be checked (no header lookup)")
        # Replaying a chain on its own: the successor's header is not at
        # hand, and the binding is checked only as far as this chain goes
        # (specs/journal.md, "What this does not claim").
        return
    try:
        header = builder.headers(successor.ref_id)
    except JournalError as exc:
        # A stored header that does not decode is no successor's header.
        raise JournalError(bad, f"successor {successor.ref_id!r}: its header cannot be read: {exc.detail}") from None
    if header is None:
        raise JournalError(bad, f"successor {successor.ref_id!r}: no such execution")
    if header.execution_id != successor.ref_id:
        # The lookup is the caller's: what it finds must be the named execution's own header.
        raise JournalError(
            bad, f"successor {successor.ref_id!r}: the header found is execution {header.execution_id!r}'s"
        )
    if header.digest != successor.digest:
        raise JournalError(
            bad, f"successor {successor.ref_id!r}: its header's digest is {header.digest}, not {successor.digest}"
        )
    if header.supersedes != builder.execution_id:
        declared = "nothing" if header.supersedes is None else repr(header.supersedes)
        raise JournalError(
            bad, f"successor {successor.ref_id!r} declares that it supersedes {declared}, not {builder.execution_id!r}"
        )
    if header.workflow_digest != builder.base.header.workflow_digest:
        raise JournalError(
            bad,
            f"successor {successor.ref_id!r} runs workflow {header.workflow_digest}, "
            f"not this execution's {builder.base.header.workflow_digest}",
        )


# --- replay -------------------------------------------------------------------------------------


def _command_of(group: Sequence[Event]) -> Command:
    """The command a stored event (or batch of events) records, rebuilt from the events alone."""
    first = group[0]
    if first.event is NodeEvent.WORK_INVALIDATED and first.invalidation is not None:
        return Invalidate(
            request_id=first.request_id,
            expected_head=first.previous,
            source=first.invalidation.source,
            policy=first.invalidation.policy,
            nodes=_expectations(group),
            actor_id=first.actor_id,
            role=first.role,
            rationale=first.rationale,
        )
    if first.event is NodeEvent.SUCCESSOR_BOUND and first.successor is not None:
        return BindSuccessor(
            request_id=first.request_id,
            expected_head=first.previous,
            successor=first.successor,
            nodes=_expectations(group),
            actor_id=first.actor_id,
            role=first.role,
            rationale=first.rationale,
        )
    if first.event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
        missing = "invalidation" if first.event is NodeEvent.WORK_INVALIDATED else "successor"
        raise JournalError(C.MALFORMED_RECORD, f"a {first.event.value} event must carry its {missing}")
    return Transition(
        request_id=first.request_id,
        expected_head=first.previous,
        node_id=first.node_id,
        event=first.event,
        prior_state=first.prior_state,
        actor_id=first.actor_id,
        role=first.role,
        rationale=first.rationale,
        attempt=first.attempt,
        records=first.records,
        approvals=first.approvals,
        error=first.error,
    )


def _expectations(group: Sequence[Event]) -> tuple[NodeExpectation, ...]:
    return tuple(NodeExpectation(e.node_id, e.prior_state) for e in group)


def replay(
    header: bytes,
    events: Sequence[bytes],
    workflow: VerifiedWorkflow,
    policy: VerifiedPolicy,
    resolve: Resolver | None = None,
    *,
    headers: HeaderLookup | None = None,
) -> Journal:
    """Rebuild the journal from its stored bytes alone, checking every rule; JournalError names the first bad record.

    Each record is checked in this order, so that the code says what is
    wrong with the first record that is wrong: its bytes and fields
    (``non_canonical``, ``unknown_field``, ``missing_field``,
    ``malformed_record``, ``altered_digest``), that it belongs to this
    journal (``foreign_record``), that it follows the head (``broken_chain``),
    its ordinal (``ordinal_gap``), and then every rule its request was
    appended under, with that rule's code.  A batch left short by a record
    that cannot be read names that record (specs/journal.md, section 7).
    """
    _argument(header, (bytes, bytearray), "header")
    _stored_events(events)
    return continue_replay(new_journal(decode_header(header), workflow, policy), events, resolve, headers=headers)


def continue_replay(
    journal: Journal,
    events: Sequence[bytes],
    resolve: Resolver | None = None,
    *,
    headers: HeaderLookup | None = None,
) -> Journal:
    """``journal`` extended by the stored events that follow it, each checked exactly as :func:`replay` checks it.

    ``events[0]`` must be the event with ordinal ``len(journal.events) + 1``
    and name ``journal.head`` as its previous digest.  A store that holds a
    journal it already verified reads only the events appended since, so
    catching up costs what is new, not the whole history.
    """
    _argument(journal, Journal, "journal")
    _stored_events(events)
    offset = len(journal.events)
    builder = _Builder(journal, resolve, headers)
    builder.stored = []
    position = 0
    pending: tuple[Event, str | None] | None = None
    while position < len(events) or pending is not None:
        first, request = (
            pending
            if pending is not None
            else _next_event(events, position, builder.head, builder.execution_id, offset)
        )
        pending = None
        group = [first]
        position = first.ordinal - offset
        deferred: JournalError | None = None
        if first.event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
            # A batch is the run of events of one request: gather it whole.
            # A bad record after it is reported only after the batch itself
            # is checked, so that the first bad record is the one named.
            while position < len(events):
                try:
                    following = _next_event(events, position, group[-1].digest, builder.execution_id, offset)
                except JournalError as exc:
                    deferred = exc
                    break
                position = following[0].ordinal - offset
                if following[0].request_id != first.request_id or following[0].event is not first.event:
                    pending = following
                    break
                group.append(following[0])
        builder.stored = list(group)
        try:
            # The request digest from the record's text is that of a lone
            # transition; a batch's command is rebuilt and encoded.
            repeated = _apply(builder, _command_of(group), first.at, request if len(group) == 1 else None)
        except _ShortBatch as exc:
            # The batch as read leaves nodes out, and the record after it
            # could not be read: that record may be one of the batch's own
            # (rewritten, removed or moved), and is then the first bad
            # record; a batch whose own records break a rule is refused
            # before its closure is counted, so it is still named.
            if deferred is not None:
                raise deferred from None
            raise exc.at(first.ordinal) from None
        except JournalError as exc:
            raise exc.at(first.ordinal) from None
        if repeated:
            raise JournalError(C.CONFLICTING_REQUEST, f"request {first.request_id!r} is recorded twice", first.ordinal)
        if builder.stored:
            raise JournalError(
                C.PARTIAL_INVALIDATION if first.event is NodeEvent.WORK_INVALIDATED else C.BAD_SUCCESSOR_BINDING,
                "the batch holds more events than its request produces",
                first.ordinal,
            )
        if deferred is not None:
            raise deferred
    return builder.journal()


def link_error(head: str, expected_ordinal: int, previous: str, ordinal: int) -> JournalCode | None:
    """Which chain rule a record naming ``previous`` and ``ordinal`` breaks, where ``head`` and ``expected_ordinal`` are due.

    The link is checked before the ordinal: a record removed, moved or
    repeated names the wrong predecessor, which is what went wrong, whatever
    its number says.

    Contracts (PEP 316, checked by CrossHair; see tests/contracts):

    post: (__return__ is None) == (previous == head and ordinal == expected_ordinal)
    post: (__return__ is JournalCode.BROKEN_CHAIN) == (previous != head)
    post: (__return__ is JournalCode.ORDINAL_GAP) == (previous == head and ordinal != expected_ordinal)
    """
    if previous != head:
        return JournalCode.BROKEN_CHAIN
    if ordinal != expected_ordinal:
        return JournalCode.ORDINAL_GAP
    return None


def _next_event(
    events: Sequence[bytes], position: int, head: str, execution_id: str, offset: int
) -> tuple[Event, str | None]:
    """The event at ``position`` if it belongs here, and its request digest if its bytes give it (``read_event``)."""
    ordinal = offset + position + 1
    event, request = read_event(events[position], ordinal)
    if event.execution_id != execution_id:
        raise JournalError(
            C.FOREIGN_RECORD, f"belongs to execution {event.execution_id!r}, not {execution_id!r}", ordinal
        )
    broken = link_error(head, ordinal, event.previous, event.ordinal)
    if broken is C.BROKEN_CHAIN:
        raise JournalError(broken, f"names previous {event.previous}, but the head is {head}", ordinal)
    if broken is C.ORDINAL_GAP:
        raise JournalError(broken, f"carries ordinal {event.ordinal}, expected {ordinal}", ordinal)
    return event, request


def attempt_history(journal: Journal, node_id: str) -> tuple[Attempt, ...]:
    """Every attempt of ``node_id``, oldest first, with how it ended; empty for a node never attempted."""
    return journal.attempts.get(node_id, ())


__all__ = [
    "FORMAT",
    "SUCCESSOR_KIND",
    "ActorKind",
    "Appended",
    "Approval",
    "Assignment",
    "Attempt",
    "AttemptRef",
    "AttemptStatus",
    "AuthorityPolicy",
    "BindSuccessor",
    "Command",
    "Event",
    "EventLog",
    "Header",
    "HeaderLookup",
    "Invalidate",
    "Invalidation",
    "InvalidationPolicy",
    "Journal",
    "JournalCode",
    "JournalError",
    "NodeExpectation",
    "Outcome",
    "RecordRef",
    "Refusal",
    "RequestIndex",
    "Resolver",
    "Transition",
    "Unchanged",
    "VerifiedPolicy",
    "append",
    "attempt_history",
    "command_from_json",
    "continue_replay",
    "create_header",
    "decode_event",
    "decode_header",
    "encode_event",
    "encode_header",
    "format_time",
    "link_error",
    "new_journal",
    "policy_from_json",
    "preview",
    "replay",
    "request_digest",
    "verify_policy",
]
