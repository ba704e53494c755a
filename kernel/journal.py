"""The execution journal: a hash-chained record of a DAG's node states, and its replay.

Seed 002 (002_a0269be443952cd4.txt), all sections; the byte-level format and
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
- Authority is the digest-bound policy's: an actor must hold the role it
  acts in, the node must admit that role, and only a human may do human
  work, complete hybrid work, authorize a retry of non-automated work, give
  a human-only approval or bind a successor execution.
- An invalidation appends one event per node of the full descendant
  closure of the nodes it names, in the workflow's topological order, as one
  batch; a command whose nodes are not closed under descendants is
  ``partial_invalidation``.  A successor binding supersedes every
  invalidated node at once, and only invalidated nodes.
- The projection (node states, attempt history, head, request digests) is
  derived from the header and events by :func:`replay`, and by
  :func:`preview`/:func:`append` one command at a time; both run the same
  rules (:func:`_apply`), so replaying a chain checks every rule every event
  was appended under, and a stored chain that breaks one is refused with
  that rule's code.  The projection is never stored as authority.
- Everything here is pure: the caller supplies the time (``now``, UTC) and
  receives values.  Nothing is half-applied: a refused command leaves the
  journal it was given exactly as it was.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Final, TypeAlias, overload

import attrs

from .canonical import Json, canonical_bytes, digest_bytes, digest_of, is_digest, parse_canonical, record_bytes
from .dag import (
    NodeKind,
    VerifiedWorkflow,
    strict_list,
    strict_object,
    strict_text,
    strict_texts,
)
from .definition import IDENTIFIER
from .journal_codes import JournalCode, JournalError, Refusal
from .machines import NODE, NodeEvent, NodeState, initial_node_state

FORMAT: Final = "fencekeeper.journal/1"
"""The header's ``format``: which version of specs/journal.md its chain follows."""

SUCCESSOR_KIND: Final = "execution"
"""The record kind a successor binding names: the successor execution's header."""

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")

C = JournalCode
_MAX_WHOLE = 2**53 - 1
"""The largest number a record holds (ordinals, attempt sequences): JSON's exact range."""


# --- values -----------------------------------------------------------------------------------


class ActorKind(enum.Enum):
    HUMAN = "human"
    AUTOMATION = "automation"


@attrs.frozen
class Assignment:
    """One actor's immutable roles under a policy."""

    actor_id: str
    kind: ActorKind
    roles: tuple[str, ...]

    def to_json(self) -> dict[str, Json]:
        return {"actor": self.actor_id, "kind": self.kind.value, "roles": list(self.roles)}


@attrs.frozen
class AuthorityPolicy:
    """Seed 002: ``WorkflowExecutionAuthorityPolicy``: one scope, one workflow, one protocol, fixed roles."""

    policy_id: str
    scope: str
    workflow_digest: str
    protocol: str
    assignments: tuple[Assignment, ...]
    approved_by: str
    """The human who approved this policy; must be a human assignment of it."""

    def to_json(self) -> dict[str, Json]:
        return {
            "approved_by": self.approved_by,
            "assignments": [a.to_json() for a in self.assignments],
            "policy": self.policy_id,
            "protocol": self.protocol,
            "scope": self.scope,
            "workflow_digest": self.workflow_digest,
        }


@attrs.frozen(eq=False)
class VerifiedPolicy:
    policy: AuthorityPolicy
    digest: str
    actors: Mapping[str, Assignment]


@attrs.frozen
class Header:
    """Seed 002: ``WorkflowExecutionHeader``.  Its digest is the chain root."""

    execution_id: str
    workflow_digest: str
    policy_digest: str
    protocol: str
    nodes: tuple[str, ...]
    created_by: str
    created_at: str
    supersedes: str | None = None
    """The execution this one takes over from, if any."""
    digest: str = attrs.field(default="", eq=False)

    def body_json(self) -> dict[str, Json]:
        return {
            "created_at": self.created_at,
            "created_by": self.created_by,
            "execution": self.execution_id,
            "format": FORMAT,
            "nodes": list(self.nodes),
            "policy_digest": self.policy_digest,
            "protocol": self.protocol,
            "supersedes": self.supersedes,
            "workflow_digest": self.workflow_digest,
        }

    def to_json(self) -> dict[str, Json]:
        return {**self.body_json(), "digest": self.digest}


@attrs.frozen
class RecordRef:
    """A stable reference to a record held elsewhere: kind, id and digest, never a path."""

    kind: str
    ref_id: str
    digest: str

    def to_json(self) -> dict[str, Json]:
        return {"digest": self.digest, "id": self.ref_id, "kind": self.kind}


@attrs.frozen
class Approval:
    actor_id: str
    role: str
    record: RecordRef
    """The approval record itself (who decided what, held by the conduct module)."""

    def to_json(self) -> dict[str, Json]:
        return {"actor": self.actor_id, "record": self.record.to_json(), "role": self.role}


@attrs.frozen
class AttemptRef:
    attempt_id: str
    sequence: int

    def to_json(self) -> dict[str, Json]:
        return {"id": self.attempt_id, "sequence": self.sequence}


@attrs.frozen
class Invalidation:
    source: RecordRef
    """The independently resolvable record that made the work invalid (a retraction, say)."""
    policy: str
    """The workflow's invalidation-policy reference."""

    def to_json(self) -> dict[str, Json]:
        return {"policy": self.policy, "source": self.source.to_json()}


@attrs.frozen
class Event:
    """Seed 002: ``WorkflowExecutionEvent``.  ``digest`` covers every other field."""

    execution_id: str
    ordinal: int
    previous: str
    request_id: str
    request_digest: str
    node_id: str
    event: NodeEvent
    prior_state: NodeState
    resulting_state: NodeState
    actor_id: str
    role: str
    at: str
    rationale: str
    attempt: AttemptRef | None
    records: tuple[RecordRef, ...]
    approvals: tuple[Approval, ...]
    error: str | None
    invalidation: Invalidation | None
    successor: RecordRef | None
    # Not compared: replay checks a stored event against the one its request
    # produces field by field, and the stored digest separately.
    digest: str = attrs.field(default="", eq=False)

    def body_json(self) -> dict[str, Json]:
        return {
            "actor": self.actor_id,
            "approvals": [a.to_json() for a in self.approvals],
            "at": self.at,
            "attempt": None if self.attempt is None else self.attempt.to_json(),
            "error": self.error,
            "event": self.event.value,
            "execution": self.execution_id,
            "invalidation": None if self.invalidation is None else self.invalidation.to_json(),
            "node": self.node_id,
            "ordinal": self.ordinal,
            "previous": self.previous,
            "prior_state": self.prior_state.value,
            "rationale": self.rationale,
            "records": [r.to_json() for r in self.records],
            "request": {"digest": self.request_digest, "id": self.request_id},
            "resulting_state": self.resulting_state.value,
            "role": self.role,
            "successor": None if self.successor is None else self.successor.to_json(),
        }

    def to_json(self) -> dict[str, Json]:
        return {**self.body_json(), "digest": self.digest}


class AttemptStatus(enum.Enum):
    AUTHORIZED = "authorized"
    ACTIVE = "active"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"


@attrs.frozen
class Attempt:
    attempt_id: str
    sequence: int
    status: AttemptStatus
    error: str | None = None


# --- commands ---------------------------------------------------------------------------------


@attrs.frozen
class NodeExpectation:
    node_id: str
    prior_state: NodeState


@attrs.frozen
class Transition:
    """Move one node by one event of the table (not ``work-invalidated`` or ``successor-bound``)."""

    request_id: str
    expected_head: str
    node_id: str
    event: NodeEvent
    prior_state: NodeState
    actor_id: str
    role: str
    rationale: str = ""
    attempt: AttemptRef | None = None
    records: tuple[RecordRef, ...] = ()
    approvals: tuple[Approval, ...] = ()
    error: str | None = None

    def request_json(self) -> dict[str, Json]:
        return {
            "actor": self.actor_id,
            "approvals": [a.to_json() for a in self.approvals],
            "attempt": None if self.attempt is None else self.attempt.to_json(),
            "command": "transition",
            "error": self.error,
            "event": self.event.value,
            "expected_head": self.expected_head,
            "node": self.node_id,
            "prior_state": self.prior_state.value,
            "rationale": self.rationale,
            "records": [r.to_json() for r in self.records],
            "role": self.role,
        }


@attrs.frozen
class Invalidate:
    """Invalidate ``nodes``, which must be the whole closure of what they name, because of ``source``."""

    request_id: str
    expected_head: str
    source: RecordRef
    policy: str
    nodes: tuple[NodeExpectation, ...]
    actor_id: str
    role: str
    rationale: str = ""

    def request_json(self) -> dict[str, Json]:
        return {
            "actor": self.actor_id,
            "command": "invalidate",
            "expected_head": self.expected_head,
            "nodes": _expectations_json(self.nodes),
            "policy": self.policy,
            "rationale": self.rationale,
            "role": self.role,
            "source": self.source.to_json(),
        }


@attrs.frozen
class BindSuccessor:
    """Bind the successor execution whose header is ``successor``; supersedes every invalidated node."""

    request_id: str
    expected_head: str
    successor: RecordRef
    nodes: tuple[NodeExpectation, ...]
    actor_id: str
    role: str
    rationale: str = ""

    def request_json(self) -> dict[str, Json]:
        return {
            "actor": self.actor_id,
            "command": "bind-successor",
            "expected_head": self.expected_head,
            "nodes": _expectations_json(self.nodes),
            "rationale": self.rationale,
            "role": self.role,
            "successor": self.successor.to_json(),
        }


Command: TypeAlias = Transition | Invalidate | BindSuccessor


def _expectations_json(nodes: Sequence[NodeExpectation]) -> list[Json]:
    # Sorted: a batch names a set of nodes, and replay rebuilds the command
    # from events in the workflow's order, not in the order it was written.
    return [{"node": n.node_id, "prior_state": n.prior_state.value} for n in sorted(nodes, key=lambda n: n.node_id)]


def request_digest(command: Command) -> str:
    """The digest of the command's stable content (seed: "RequestDigest is computed over the stable request content")."""
    return digest_bytes(record_bytes(command.request_json()))


# --- the journal ------------------------------------------------------------------------------
#
# A journal is an immutable value, and appending makes a new one.  Copying
# the whole history for every append would make an append cost grow with
# the journal (about 40 ms at 50,000 events), so the history and the request
# index are persistent structures: a new journal shares all but a small,
# bounded part of them with the journal it extends, and nothing is ever
# changed in place.


_CHUNK = 256
_BUCKETS = 64


class EventLog(Sequence[Event]):
    """The events of a journal, in order: an immutable sequence that shares its chunks with the log it extends.

    Appending copies only the last chunk (at most 256 events) and the tuple
    of chunks, so it costs the same at the ten-thousandth event as at the
    tenth.  Every chunk but the last is full.
    """

    __slots__ = ("_chunks", "_length")

    def __init__(self, chunks: tuple[tuple[Event, ...], ...] = (), length: int = 0) -> None:
        self._chunks = chunks
        self._length = length

    def extended(self, events: Sequence[Event]) -> EventLog:
        chunks = list(self._chunks)
        for event in events:
            if chunks and len(chunks[-1]) < _CHUNK:
                chunks[-1] = (*chunks[-1], event)
            else:
                chunks.append((event,))
        return EventLog(tuple(chunks), self._length + len(events))

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Event, ...]: ...

    def __getitem__(self, index: int | slice) -> Event | tuple[Event, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("event index out of range")
        return self._chunks[index // _CHUNK][index % _CHUNK]

    def __iter__(self) -> Iterator[Event]:
        for chunk in self._chunks:
            yield from chunk

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventLog({self._length} events)"


@attrs.frozen
class _Recorded:
    digest: str
    first: int
    """The ordinal of the request's first event."""
    count: int


class RequestIndex(Mapping[str, str]):
    """Request id -> request digest, for idempotency: an immutable map sharing its buckets with the one it extends.

    Extending copies only the buckets the new requests fall in.  Each entry
    also knows the events its request appended (:meth:`recorded`).
    """

    __slots__ = ("_buckets", "_length")

    def __init__(self, buckets: tuple[Mapping[str, _Recorded], ...] | None = None, length: int = 0) -> None:
        self._buckets = buckets if buckets is not None else tuple({} for _ in range(_BUCKETS))
        self._length = length

    def extended(self, entries: Mapping[str, _Recorded]) -> RequestIndex:
        if not entries:
            return self
        buckets = list(self._buckets)
        copied: set[int] = set()
        added = 0
        for request_id, recorded in entries.items():
            number = hash(request_id) % _BUCKETS
            if number not in copied:
                buckets[number] = dict(buckets[number])
                copied.add(number)
            bucket = buckets[number]
            assert isinstance(bucket, dict)
            added += request_id not in bucket
            bucket[request_id] = recorded
        return RequestIndex(tuple(MappingProxyType(b) if i in copied else b for i, b in enumerate(buckets)),
                            self._length + added)  # fmt: skip

    def recorded(self, request_id: str) -> _Recorded | None:
        return self._buckets[hash(request_id) % _BUCKETS].get(request_id)

    def __getitem__(self, request_id: str) -> str:
        found = self.recorded(request_id)
        if found is None:
            raise KeyError(request_id)
        return found.digest

    def __iter__(self) -> Iterator[str]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._length


@attrs.frozen(eq=False)
class Journal:
    """A header, its events, and the projection derived from them.  Build with :func:`new_journal` or :func:`replay`."""

    header: Header
    workflow: VerifiedWorkflow
    policy: VerifiedPolicy
    events: EventLog
    states: Mapping[str, NodeState]
    attempts: Mapping[str, tuple[Attempt, ...]]
    requests: RequestIndex
    """Request id -> request digest, for idempotency."""

    @property
    def head(self) -> str:
        return self.events[-1].digest if self.events else self.header.digest

    @property
    def execution_id(self) -> str:
        return self.header.execution_id


@attrs.frozen
class Appended:
    journal: Journal
    events: tuple[Event, ...]


@attrs.frozen
class Unchanged:
    """The request was already recorded with the same digest: an idempotent repeat."""

    journal: Journal
    request_id: str
    events: tuple[Event, ...] = ()
    """The events the request appended when it was first recorded (the last one's digest is the head it made)."""


Outcome: TypeAlias = Appended | Unchanged | Refusal


# --- verification of the authority and the header ---------------------------------------------


def format_time(now: datetime) -> str:
    """``now`` as the record's time text; naive or non-UTC times are refused."""
    offset = now.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise JournalError(C.INVALID_REQUEST, f"time {now.isoformat()} must be timezone-aware UTC")
    return now.astimezone(UTC).strftime(_TIME_FORMAT)


def _check_time(text: str, where: str) -> None:
    # Fixed widths make the spelling unique; fromisoformat then rejects dates that do not exist.
    if _TIME.fullmatch(text) is None:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {text!r} is not a UTC time like 2026-01-01T00:00:00.000000Z")
    try:
        datetime.fromisoformat(text[:-1])
    except ValueError:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {text!r} is not a real moment") from None


def _identifier(value: str, where: str, code: JournalCode = C.INVALID_REQUEST) -> None:
    if not IDENTIFIER.fullmatch(value):
        raise JournalError(code, f"{where}: malformed identifier {value!r}")


def verify_policy(policy: AuthorityPolicy, workflow: VerifiedWorkflow) -> VerifiedPolicy:
    """The policy, if it is bound to ``workflow`` and approved by one of its humans; else ``unverified_authority``."""
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
    return VerifiedPolicy(policy=policy, digest=digest_of(policy.to_json()), actors=MappingProxyType(actors))


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
    _check_header_binding(header, workflow, policy)
    if header.digest != digest_bytes(record_bytes(header.body_json())):
        raise JournalError(C.ALTERED_DIGEST, "the header's digest does not match its content", 0)
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
        requests=RequestIndex(),
    )


# --- preview and append -----------------------------------------------------------------------


class _Builder:
    """The projection being extended, one event at a time, without copying the journal's history.

    In replay (``stored`` is set) each event a rule emits is checked against
    the stored one instead of being signed, and the stored one is kept.
    """

    __slots__ = ("attempts", "base", "events", "execution_id", "head", "requests", "states", "stored")

    def __init__(self, base: Journal) -> None:
        self.base = base
        self.events: list[Event] = []
        self.head = base.head
        self.requests: dict[str, _Recorded] = {}
        self.states = dict(base.states)
        self.attempts = dict(base.attempts)
        self.stored: list[Event] | None = None
        self.execution_id = base.header.execution_id

    def known_request(self, request_id: str) -> _Recorded | None:
        found = self.requests.get(request_id)
        return found if found is not None else self.base.requests.recorded(request_id)

    def emit(self, event: Event) -> None:
        if self.stored is None:
            event = attrs.evolve(event, digest=digest_bytes(record_bytes(event.body_json())))
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
            requests=base.requests.extended(self.requests),
        )


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


def preview(journal: Journal, command: Command, now: datetime) -> Outcome:
    """What appending ``command`` at ``now`` would do: the new journal and its events, an idempotent repeat, or a refusal."""
    try:
        at = format_time(now)
    except JournalError as exc:
        return exc.refusal
    builder = _Builder(journal)
    try:
        repeated = _apply(builder, command, at)
    except JournalError as exc:
        return exc.refusal
    if repeated:
        recorded = journal.requests.recorded(command.request_id)
        assert recorded is not None
        return Unchanged(journal, command.request_id, journal.events[recorded.first - 1 : recorded.first - 1 + recorded.count])
    return Appended(builder.journal(), tuple(builder.events))


def append(journal: Journal, command: Command, now: datetime) -> Journal | Refusal:
    """The journal with ``command`` appended (the same journal for an idempotent repeat), or a refusal."""
    outcome = preview(journal, command, now)
    if isinstance(outcome, Refusal):
        return outcome
    return outcome.journal


def _apply(builder: _Builder, command: Command, at: str) -> bool:
    """Run every rule for ``command``, emitting its events; True for an idempotent repeat (nothing emitted)."""
    _check_common(command)
    digest = request_digest(command)
    known = builder.known_request(command.request_id)
    if known is not None:
        if known.digest == digest:
            return True
        raise JournalError(
            C.CONFLICTING_REQUEST, f"request {command.request_id!r} was recorded with other content ({known.digest})"
        )
    if command.expected_head != builder.head:
        raise JournalError(C.STALE_HEAD, f"expected head {command.expected_head}, but the head is {builder.head}")
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


def _check_common(command: Command) -> None:
    _identifier(command.request_id, "request_id")
    _identifier(command.actor_id, "actor")
    _identifier(command.role, "role")
    if not is_digest(command.expected_head):
        raise JournalError(C.INVALID_REQUEST, f"expected_head: {command.expected_head!r} is not a sha256: digest")
    if isinstance(command, Transition):
        _identifier(command.node_id, "node")
        for record in command.records:
            _check_record(record, "records")
        for approval in command.approvals:
            _identifier(approval.actor_id, "approvals: actor")
            _identifier(approval.role, "approvals: role")
            _check_record(approval.record, "approvals: record")
        if command.attempt is not None:
            _identifier(command.attempt.attempt_id, "attempt id")
            if not 1 <= command.attempt.sequence <= _MAX_WHOLE:
                raise JournalError(C.INVALID_REQUEST, f"attempt sequence {command.attempt.sequence} is out of range")
        if len({(r.kind, r.ref_id) for r in command.records}) != len(command.records):
            raise JournalError(C.INVALID_REQUEST, "records: a kind/id is referenced twice")
        if command.event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
            raise JournalError(
                C.INVALID_REQUEST, f"{command.event.value} is appended by an invalidation or successor binding command"
            )
    else:
        if not command.nodes:
            raise JournalError(C.INVALID_REQUEST, "nodes: names no node")
        for expectation in command.nodes:
            _identifier(expectation.node_id, "nodes")
        if len({n.node_id for n in command.nodes}) != len(command.nodes):
            raise JournalError(C.INVALID_REQUEST, "nodes: names a node twice")
        if isinstance(command, Invalidate):
            _check_record(command.source, "source")
            _identifier(command.policy, "policy")


def _check_record(record: RecordRef, where: str) -> None:
    _identifier(record.kind, f"{where}: kind")
    _identifier(record.ref_id, f"{where}: id")
    if not is_digest(record.digest):
        raise JournalError(C.INVALID_REQUEST, f"{where}: digest {record.digest!r} is not sha256: and 64 hex digits")


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
    builder: _Builder, actor_id: str, role: str, *, node_roles: Sequence[str], human: bool, what: str
) -> None:
    assignment = builder.base.policy.actors.get(actor_id)
    if assignment is None:
        raise JournalError(C.FORGED_ROLE, f"actor {actor_id!r} has no assignment in the policy")
    if role not in assignment.roles:
        raise JournalError(C.FORGED_ROLE, f"actor {actor_id!r} is not assigned role {role!r} by the policy")
    if node_roles and role not in node_roles:
        raise JournalError(C.FORGED_ROLE, f"{what} does not admit role {role!r}")
    if human and assignment.kind is not ActorKind.HUMAN:
        raise JournalError(C.AUTOMATION_CLAIMS_HUMAN, f"{what} needs a human; {actor_id!r} is automation")


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
        what=f"{command.event.value} on {node.kind.value} node {node_id!r}",
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
        builder.attempts[node_id] = _attempts_after(node_id, event, command.attempt, command.error, attempts)
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


def _attempts_after(
    node_id: str, event: NodeEvent, attempt: AttemptRef | None, error: str | None, attempts: tuple[Attempt, ...]
) -> tuple[Attempt, ...]:
    """The node's attempt history after ``event``; every earlier attempt, failures included, is kept."""
    where = f"node {node_id!r}: {event.value}"
    if attempt is None:
        raise JournalError(C.INVALID_ATTEMPT, f"{where} must bind an attempt id and sequence")
    last = attempts[-1] if attempts else None
    opens = event in (NodeEvent.WORK_STARTED, NodeEvent.RETRY_AUTHORIZED)
    if event is NodeEvent.WORK_STARTED and last is not None and last.status is AttemptStatus.AUTHORIZED:
        # A retry authorized this attempt; the work now starts it.
        if (attempt.attempt_id, attempt.sequence) != (last.attempt_id, last.sequence):
            raise JournalError(
                C.INVALID_ATTEMPT, f"{where}: the authorized attempt is {last.attempt_id!r} #{last.sequence}"
            )
        return (*attempts[:-1], attrs.evolve(last, status=AttemptStatus.ACTIVE))
    if opens:
        if attempt.sequence != len(attempts) + 1:
            raise JournalError(C.INVALID_ATTEMPT, f"{where}: the next attempt is #{len(attempts) + 1}, not #{attempt.sequence}")
        if any(a.attempt_id == attempt.attempt_id for a in attempts):
            raise JournalError(C.INVALID_ATTEMPT, f"{where}: attempt id {attempt.attempt_id!r} was used before")
        status = AttemptStatus.ACTIVE if event is NodeEvent.WORK_STARTED else AttemptStatus.AUTHORIZED
        return (*attempts, Attempt(attempt.attempt_id, attempt.sequence, status))
    if last is None or (attempt.attempt_id, attempt.sequence) != (last.attempt_id, last.sequence):
        current = "none" if last is None else f"{last.attempt_id!r} #{last.sequence}"
        raise JournalError(C.INVALID_ATTEMPT, f"{where}: binds {attempt.attempt_id!r} #{attempt.sequence}; the current attempt is {current}")
    status = {
        NodeEvent.WORK_BLOCKED: AttemptStatus.BLOCKED,
        NodeEvent.BLOCK_CLEARED: AttemptStatus.ACTIVE,
        NodeEvent.WORK_COMPLETED: AttemptStatus.COMPLETED,
        NodeEvent.WORK_FAILED: AttemptStatus.FAILED,
    }[event]
    return (*attempts[:-1], Attempt(last.attempt_id, last.sequence, status, error))


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
    if len(command.approvals) < requirement.minimum:
        raise JournalError(
            C.INVALID_APPROVAL, f"node {node_id!r} needs {requirement.minimum} approvals, got {len(command.approvals)}"
        )
    approvers = [a.actor_id for a in command.approvals]
    if requirement.distinct_actors and len(set(approvers)) != len(approvers):
        raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r} needs distinct approvers; got {approvers}")
    missing = [r for r in requirement.roles if r not in {a.role for a in command.approvals}]
    if missing:
        raise JournalError(C.INVALID_APPROVAL, f"node {node_id!r} needs an approval as {', '.join(missing)}")


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
    _authorize(builder, command.actor_id, command.role, node_roles=(), human=False, what="invalidation")
    workflow = builder.base.workflow
    closure = [
        node_id
        for node_id in workflow.closure(tuple(named))
        if builder.states[node_id] not in (NodeState.INVALIDATED, NodeState.SUPERSEDED)
    ]
    missing = [node_id for node_id in closure if node_id not in named]
    if missing:
        raise JournalError(
            C.PARTIAL_INVALIDATION,
            f"invalidating {sorted(named)} leaves dependent nodes {missing} appearing current; the batch must name them too",
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
        raise JournalError(bad, f"invalidated nodes {left} would be left without the successor")
    _authorize(
        builder, command.actor_id, command.role, node_roles=(), human=True, what="binding a successor execution"
    )
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


# --- the codec: records to bytes and back -----------------------------------------------------


def encode_header(header: Header) -> bytes:
    return record_bytes(header.to_json())


def encode_event(event: Event) -> bytes:
    return record_bytes(event.to_json())


def _digest_field(value: object, where: str) -> str:
    text = strict_text(value, where)
    if not is_digest(text):
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {text!r} is not sha256: and 64 lowercase hex digits")
    return text


def _optional_text(value: object, where: str) -> str | None:
    return None if value is None else strict_text(value, where)


def _record_ref(value: object, where: str) -> RecordRef:
    obj = strict_object(value, where, required=("digest", "id", "kind"), optional=())
    return RecordRef(
        kind=strict_text(obj["kind"], f"{where}.kind"),
        ref_id=strict_text(obj["id"], f"{where}.id"),
        digest=_digest_field(obj["digest"], f"{where}.digest"),
    )


def _whole(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_WHOLE:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: must be a whole number from 0 to {_MAX_WHOLE}")
    return value


def _enum_member(kind: type[NodeState] | type[NodeEvent], value: object, where: str) -> NodeState | NodeEvent:
    text = strict_text(value, where)
    try:
        return kind(text)
    except ValueError:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {text!r} is not a node {kind.__name__[4:].lower()}") from None


_HEADER_FIELDS = (
    "created_at", "created_by", "digest", "execution", "format", "nodes",
    "policy_digest", "protocol", "supersedes", "workflow_digest",
)  # fmt: skip
_EVENT_FIELDS = (
    "actor", "approvals", "at", "attempt", "digest", "error", "event", "execution", "invalidation", "node",
    "ordinal", "previous", "prior_state", "rationale", "records", "request", "resulting_state", "role", "successor",
)  # fmt: skip


def decode_header(data: bytes) -> Header:
    """Strictly rehydrate a header: canonical bytes, known fields only, and a digest that matches."""
    try:
        obj = strict_object(parse_canonical(data), "header", required=_HEADER_FIELDS, optional=())
        if obj["format"] != FORMAT:
            raise JournalError(C.MALFORMED_RECORD, f"format: {obj['format']!r} is not {FORMAT!r}")
        header = Header(
            execution_id=strict_text(obj["execution"], "execution"),
            workflow_digest=_digest_field(obj["workflow_digest"], "workflow_digest"),
            policy_digest=_digest_field(obj["policy_digest"], "policy_digest"),
            protocol=strict_text(obj["protocol"], "protocol"),
            nodes=strict_texts(obj["nodes"], "nodes"),
            created_by=strict_text(obj["created_by"], "created_by"),
            created_at=strict_text(obj["created_at"], "created_at"),
            supersedes=_optional_text(obj["supersedes"], "supersedes"),
            digest=_digest_field(obj["digest"], "digest"),
        )
        _check_time(header.created_at, "created_at")
        if _body_digest(data, obj, header.digest) != header.digest:
            raise JournalError(C.ALTERED_DIGEST, "the digest does not match the header's content")
    except JournalError as exc:
        raise exc.at(0) from None
    return header


def decode_event(data: bytes, ordinal: int | None = None) -> Event:
    """Strictly rehydrate one event (``ordinal`` is where it was found, for messages)."""
    try:
        return _decode_event(data)
    except JournalError as exc:
        raise exc if ordinal is None else exc.at(ordinal) from None


def _decode_event(data: bytes) -> Event:
    obj = strict_object(parse_canonical(data), "event", required=_EVENT_FIELDS, optional=())
    request = strict_object(obj["request"], "request", required=("digest", "id"), optional=())
    attempt_obj = obj["attempt"]
    attempt = None
    if attempt_obj is not None:
        fields = strict_object(attempt_obj, "attempt", required=("id", "sequence"), optional=())
        attempt = AttemptRef(strict_text(fields["id"], "attempt.id"), _whole(fields["sequence"], "attempt.sequence"))
    invalidation = None
    if obj["invalidation"] is not None:
        fields = strict_object(obj["invalidation"], "invalidation", required=("policy", "source"), optional=())
        invalidation = Invalidation(
            _record_ref(fields["source"], "invalidation.source"), strict_text(fields["policy"], "invalidation.policy")
        )
    approvals = []
    for n, item in enumerate(strict_list(obj["approvals"], "approvals")):
        fields = strict_object(item, f"approvals[{n}]", required=("actor", "record", "role"), optional=())
        approvals.append(
            Approval(
                strict_text(fields["actor"], f"approvals[{n}].actor"),
                strict_text(fields["role"], f"approvals[{n}].role"),
                _record_ref(fields["record"], f"approvals[{n}].record"),
            )
        )
    at = strict_text(obj["at"], "at")
    _check_time(at, "at")
    event = Event(
        execution_id=strict_text(obj["execution"], "execution"),
        ordinal=_whole(obj["ordinal"], "ordinal"),
        previous=_digest_field(obj["previous"], "previous"),
        request_id=strict_text(request["id"], "request.id"),
        request_digest=_digest_field(request["digest"], "request.digest"),
        node_id=strict_text(obj["node"], "node"),
        event=NodeEvent(_enum_member(NodeEvent, obj["event"], "event").value),
        prior_state=NodeState(_enum_member(NodeState, obj["prior_state"], "prior_state").value),
        resulting_state=NodeState(_enum_member(NodeState, obj["resulting_state"], "resulting_state").value),
        actor_id=strict_text(obj["actor"], "actor"),
        role=strict_text(obj["role"], "role"),
        at=at,
        rationale=strict_text(obj["rationale"], "rationale"),
        attempt=attempt,
        records=tuple(_record_ref(item, f"records[{n}]") for n, item in enumerate(strict_list(obj["records"], "records"))),
        approvals=tuple(approvals),
        error=_optional_text(obj["error"], "error"),
        invalidation=invalidation,
        successor=None if obj["successor"] is None else _record_ref(obj["successor"], "successor"),
        digest=_digest_field(obj["digest"], "digest"),
    )
    if _body_digest(data, obj, event.digest) != event.digest:
        raise JournalError(C.ALTERED_DIGEST, "the digest does not match the event's content")
    return event


def _body_digest(data: bytes, obj: Mapping[str, object], digest: str) -> str:
    """The digest of the record's bytes without its own ``digest`` member.

    ``data`` is already known canonical, and the canonical form of an object
    without one member is the canonical form with that member's text (and
    the comma before it: ``digest`` is never a record's first key) cut out,
    so the cut bytes are hashed without encoding the record again.  The
    member's text can occur only once: a nested digest equal to the
    record's own would be a fixed point of SHA-256.
    """
    member = b',"digest":"' + digest.encode("ascii") + b'"'
    if data.count(member) == 1:
        return digest_bytes(data.replace(member, b"", 1))
    body = dict(obj)
    del body["digest"]
    return digest_bytes(canonical_bytes(body))  # type: ignore[arg-type]


# --- replay -------------------------------------------------------------------------------------


def _command_of(group: Sequence[Event]) -> Command:
    """The command a stored event (or batch of events) records, rebuilt from the events alone."""
    first = group[0]
    nodes = tuple(NodeExpectation(e.node_id, e.prior_state) for e in group)
    if first.event is NodeEvent.WORK_INVALIDATED and first.invalidation is not None:
        return Invalidate(
            request_id=first.request_id,
            expected_head=first.previous,
            source=first.invalidation.source,
            policy=first.invalidation.policy,
            nodes=nodes,
            actor_id=first.actor_id,
            role=first.role,
            rationale=first.rationale,
        )
    if first.event is NodeEvent.SUCCESSOR_BOUND and first.successor is not None:
        return BindSuccessor(
            request_id=first.request_id,
            expected_head=first.previous,
            successor=first.successor,
            nodes=nodes,
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


def replay(
    header: bytes, events: Sequence[bytes], workflow: VerifiedWorkflow, policy: VerifiedPolicy
) -> Journal:
    """Rebuild the journal from its stored bytes alone, checking every rule; JournalError names the first bad record.

    Each record is checked in this order, so that the code says what is
    wrong with the first record that is wrong: its bytes and fields
    (``non_canonical``, ``unknown_field``, ``missing_field``,
    ``malformed_record``, ``altered_digest``), that it belongs to this
    journal (``foreign_record``), that it follows the head (``broken_chain``),
    its ordinal (``ordinal_gap``), and then every rule its request was
    appended under, with that rule's code.
    """
    head = decode_header(header)
    journal = new_journal(head, workflow, policy)
    builder = _Builder(journal)
    builder.stored = []
    position = 0
    pending: Event | None = None
    while position < len(events) or pending is not None:
        first = pending if pending is not None else _next_event(events, position, builder.head, builder.execution_id)
        pending = None
        group = [first]
        position = first.ordinal
        deferred: JournalError | None = None
        if first.event in (NodeEvent.WORK_INVALIDATED, NodeEvent.SUCCESSOR_BOUND):
            # A batch is the run of events of one request: gather it whole.
            # A bad record after it is reported only after the batch itself
            # is checked, so that the first bad record is the one named.
            while position < len(events):
                try:
                    following = _next_event(events, position, group[-1].digest, builder.execution_id)
                except JournalError as exc:
                    deferred = exc
                    break
                position = following.ordinal
                if following.request_id != first.request_id or following.event is not first.event:
                    pending = following
                    break
                group.append(following)
        builder.stored = list(group)
        try:
            repeated = _apply(builder, _command_of(group), first.at)
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


def _next_event(events: Sequence[bytes], position: int, head: str, execution_id: str) -> Event:
    ordinal = position + 1
    event = decode_event(events[position], ordinal)
    if event.execution_id != execution_id:
        raise JournalError(
            C.FOREIGN_RECORD, f"belongs to execution {event.execution_id!r}, not {execution_id!r}", ordinal
        )
    broken = link_error(head, ordinal, event.previous, event.ordinal)
    if broken is C.BROKEN_CHAIN:
        raise JournalError(broken, f"names previous {event.previous}, but the head is {head}", ordinal)
    if broken is C.ORDINAL_GAP:
        raise JournalError(broken, f"carries ordinal {event.ordinal}, expected {ordinal}", ordinal)
    return event


# --- reading a policy from JSON -----------------------------------------------------------------


def policy_from_json(value: object, where: str = "policy") -> AuthorityPolicy:
    """A policy from its JSON form (the same fields as :meth:`AuthorityPolicy.to_json`)."""
    obj = strict_object(
        value,
        where,
        required=("approved_by", "assignments", "policy", "protocol", "scope", "workflow_digest"),
        optional=(),
    )
    assignments = []
    for n, item in enumerate(strict_list(obj["assignments"], f"{where}.assignments")):
        at = f"{where}.assignments[{n}]"
        fields = strict_object(item, at, required=("actor", "kind", "roles"), optional=())
        kind_text = strict_text(fields["kind"], f"{at}.kind")
        try:
            kind = ActorKind(kind_text)
        except ValueError:
            raise JournalError(C.MALFORMED_RECORD, f"{at}.kind: {kind_text!r} is not human or automation") from None
        assignments.append(
            Assignment(strict_text(fields["actor"], f"{at}.actor"), kind, strict_texts(fields["roles"], f"{at}.roles"))
        )
    return AuthorityPolicy(
        policy_id=strict_text(obj["policy"], f"{where}.policy"),
        scope=strict_text(obj["scope"], f"{where}.scope"),
        workflow_digest=_digest_field(obj["workflow_digest"], f"{where}.workflow_digest"),
        protocol=strict_text(obj["protocol"], f"{where}.protocol"),
        assignments=tuple(assignments),
        approved_by=strict_text(obj["approved_by"], f"{where}.approved_by"),
    )


_COMMON_FIELDS = ("command", "request", "actor", "role")
_COMMAND_FIELDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "transition": (
        (*_COMMON_FIELDS, "node", "event", "prior_state"),
        ("expected_head", "rationale", "attempt", "records", "approvals", "error"),
    ),
    "invalidate": ((*_COMMON_FIELDS, "source", "policy", "nodes"), ("expected_head", "rationale")),
    "bind-successor": ((*_COMMON_FIELDS, "successor", "nodes"), ("expected_head", "rationale")),
}


def command_from_json(value: object, expected_head: str | None = None, where: str = "command") -> Command:
    """A command from its JSON form (specs/journal.md, section 6, plus ``request``, the request id).

    ``expected_head`` is used when the JSON does not name one; a command
    always carries one in the end.  Raises JournalError (``unknown_field``,
    ``missing_field``, ``malformed_record``) naming the field.
    """
    if not isinstance(value, dict) or not isinstance(value.get("command"), str):
        raise JournalError(C.MALFORMED_RECORD, f'{where}: must be an object with "command" naming its kind')
    kind = value["command"]
    if kind not in _COMMAND_FIELDS:
        raise JournalError(C.MALFORMED_RECORD, f"{where}.command: {kind!r} is not one of {sorted(_COMMAND_FIELDS)}")
    required, optional = _COMMAND_FIELDS[kind]
    obj = strict_object(value, where, required=required, optional=optional)
    head = obj.get("expected_head", expected_head)
    if head is None:
        raise JournalError(C.MISSING_FIELD, f"{where}: missing field 'expected_head'")
    common = {
        "request_id": strict_text(obj["request"], f"{where}.request"),
        "expected_head": strict_text(head, f"{where}.expected_head"),
        "actor_id": strict_text(obj["actor"], f"{where}.actor"),
        "role": strict_text(obj["role"], f"{where}.role"),
        "rationale": strict_text(obj.get("rationale", ""), f"{where}.rationale"),
    }
    if kind == "transition":
        attempt = obj.get("attempt")
        attempt_ref = None
        if attempt is not None:
            fields = strict_object(attempt, f"{where}.attempt", required=("id", "sequence"), optional=())
            attempt_ref = AttemptRef(
                strict_text(fields["id"], f"{where}.attempt.id"), _whole(fields["sequence"], f"{where}.attempt.sequence")
            )
        approvals = []
        for n, item in enumerate(strict_list(obj.get("approvals", []), f"{where}.approvals")):
            at = f"{where}.approvals[{n}]"
            fields = strict_object(item, at, required=("actor", "record", "role"), optional=())
            approvals.append(
                Approval(
                    strict_text(fields["actor"], f"{at}.actor"),
                    strict_text(fields["role"], f"{at}.role"),
                    _record_ref(fields["record"], f"{at}.record"),
                )
            )
        return Transition(
            node_id=strict_text(obj["node"], f"{where}.node"),
            event=NodeEvent(_enum_member(NodeEvent, obj["event"], f"{where}.event").value),
            prior_state=NodeState(_enum_member(NodeState, obj["prior_state"], f"{where}.prior_state").value),
            attempt=attempt_ref,
            records=tuple(
                _record_ref(item, f"{where}.records[{n}]")
                for n, item in enumerate(strict_list(obj.get("records", []), f"{where}.records"))
            ),
            approvals=tuple(approvals),
            error=_optional_text(obj.get("error"), f"{where}.error"),
            **common,
        )
    nodes = []
    for n, item in enumerate(strict_list(obj["nodes"], f"{where}.nodes")):
        fields = strict_object(item, f"{where}.nodes[{n}]", required=("node", "prior_state"), optional=())
        nodes.append(
            NodeExpectation(
                strict_text(fields["node"], f"{where}.nodes[{n}].node"),
                NodeState(_enum_member(NodeState, fields["prior_state"], f"{where}.nodes[{n}].prior_state").value),
            )
        )
    if kind == "invalidate":
        return Invalidate(
            source=_record_ref(obj["source"], f"{where}.source"),
            policy=strict_text(obj["policy"], f"{where}.policy"),
            nodes=tuple(nodes),
            **common,
        )
    return BindSuccessor(successor=_record_ref(obj["successor"], f"{where}.successor"), nodes=tuple(nodes), **common)


def attempt_history(journal: Journal, node_id: str) -> tuple[Attempt, ...]:
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
    "Invalidate",
    "Invalidation",
    "Journal",
    "JournalCode",
    "JournalError",
    "NodeExpectation",
    "RecordRef",
    "Refusal",
    "RequestIndex",
    "Transition",
    "Unchanged",
    "VerifiedPolicy",
    "append",
    "attempt_history",
    "command_from_json",
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
