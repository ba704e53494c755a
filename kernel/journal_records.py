"""The execution journal's values: policy, header, events, commands, and the journal itself.

The DAG node journal contract (seed 002: Key types and services).  What the
records mean and how they are written is specs/journal.md; the rules that
decide which records may follow which are ``journal.py``.  Rules of this
module:

- Every value is immutable (attrs frozen classes, tuples, read-only
  mappings).  A journal's history and request index are persistent
  structures (:class:`EventLog`, :class:`RequestIndex`): a new journal
  shares all but a small, bounded part of them with the journal it
  extends, and nothing is changed in place.
- ``body_json``/``request_json`` give the exact JSON value whose canonical
  bytes are digested; member names are the format's, so they are ASCII,
  and numbers are whole and in JSON's exact range (``canonical.record_bytes``
  relies on both).
- Nothing here decides: no rule, no I/O, no clock.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Final, TypeAlias, overload

import attrs

from .canonical import Json, digest_bytes, record_bytes, text_bytes, value_text
from .common import shown
from .dag import VerifiedWorkflow
from .journal_codes import JournalCode, JournalError, Refusal
from .machines import NodeEvent, NodeState

FORMAT: Final = "fencekeeper.journal/1"
"""The header's ``format``: which version of specs/journal.md its chain follows."""

SUCCESSOR_KIND: Final = "execution"
"""The record kind a successor binding names: the successor execution's header."""

MAX_WHOLE: Final = 2**53 - 1
"""The largest number a record holds (ordinals, attempt sequences): JSON's exact range."""

_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")

C = JournalCode


# --- values -----------------------------------------------------------------------------------


class ActorKind(enum.Enum):
    """Whether an actor of a policy is a person or automation (specs/journal.md, section 3).

    The journal keeps human work human: only a ``human`` actor may do human
    work, complete hybrid work, authorize a retry of non-automated work,
    give a human-only approval or bind a successor, and an ``automation``
    actor may invalidate work a human did only where its invalidation policy
    says so (``automation_claims_human``).
    """

    HUMAN = "human"
    AUTOMATION = "automation"


@attrs.frozen
class Assignment:
    """One actor's immutable roles under a policy."""

    actor_id: str
    kind: ActorKind
    roles: tuple[str, ...]

    def to_json(self) -> dict[str, Json]:
        """The assignment as the policy's ``assignments`` member writes it (specs/journal.md, section 3)."""
        return {"actor": self.actor_id, "kind": self.kind.value, "roles": list(self.roles)}


@attrs.frozen
class InvalidationPolicy:
    """An invalidation policy the authority policy declares: who may invalidate work under its name.

    Seed 002, Invalidation: an invalidation binds "the workflow
    invalidation-policy reference"; the reference must name one of these.
    """

    policy_id: str
    roles: tuple[str, ...]
    """The roles that may invalidate under this policy (an actor must also hold the role)."""
    automation_may_invalidate_human_work: bool = False
    """Whether an automation actor may invalidate a node a human has worked on."""

    def to_json(self) -> dict[str, Json]:
        """The declaration as the policy's ``invalidation_policies`` member writes it (specs/journal.md, section 3)."""
        return {
            "automation_may_invalidate_human_work": self.automation_may_invalidate_human_work,
            "policy": self.policy_id,
            "roles": list(self.roles),
        }


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
    invalidation_policies: tuple[InvalidationPolicy, ...] = ()
    """The invalidation policies an invalidation may name; none declared, no invalidation is admitted."""

    def to_json(self) -> dict[str, Json]:
        """The policy's JSON value; the policy digest is the digest of its canonical bytes (specs/journal.md, section 3)."""
        value: dict[str, Json] = {
            "approved_by": self.approved_by,
            "assignments": [a.to_json() for a in self.assignments],
            "policy": self.policy_id,
            "protocol": self.protocol,
            "scope": self.scope,
            "workflow_digest": self.workflow_digest,
        }
        # Written only when some are declared: a policy declaring none keeps
        # the bytes, and so the digest, it had before the member existed, and
        # the chains bound to it still replay (specs/journal.md, section 3).
        if self.invalidation_policies:
            value["invalidation_policies"] = [p.to_json() for p in self.invalidation_policies]
        return value


@attrs.frozen(eq=False)
class VerifiedPolicy:
    """An authority policy that ``journal.verify_policy`` accepted for one workflow, with its digest and lookups.

    Only a verified policy binds a header or a journal, so every rule that
    asks who may act (specs/journal.md, sections 3 and 6) reads a policy
    whose workflow digest, single assignments, human approver and
    invalidation policies were checked once.
    """

    policy: AuthorityPolicy
    digest: str
    actors: Mapping[str, Assignment]
    invalidations: Mapping[str, InvalidationPolicy] = attrs.field(factory=lambda: MappingProxyType({}))
    """The declared invalidation policies, by id."""


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
        """Every member but ``digest``: the value whose canonical bytes the header's digest covers (specs/journal.md, section 4)."""
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
        """The header record as stored: its body and its digest, the chain root."""
        return {**self.body_json(), "digest": self.digest}


@attrs.frozen
class RecordRef:
    """A stable reference to a record held elsewhere: kind, id and digest, never a path."""

    kind: str
    ref_id: str
    digest: str

    def to_json(self) -> dict[str, Json]:
        """The reference as a record writes it: ``{"kind", "id", "digest"}`` (specs/journal.md, section 5)."""
        return {"digest": self.digest, "id": self.ref_id, "kind": self.kind}


@attrs.frozen
class Approval:
    """One approval an event carries: who approved, in which role, and the record of the decision.

    The journal checks the actor and role against the policy and the node's
    requirement (``forged_role``, ``invalid_approval``; specs/journal.md,
    section 6); what was decided is the referenced record's, not the journal's.
    """

    actor_id: str
    role: str
    record: RecordRef
    """The approval record itself (who decided what, held by the conduct module)."""

    def to_json(self) -> dict[str, Json]:
        """The approval as an event's ``approvals`` member writes it (specs/journal.md, section 5)."""
        return {"actor": self.actor_id, "record": self.record.to_json(), "role": self.role}


@attrs.frozen
class AttemptRef:
    """The attempt an event binds: its id and its one-based sequence among the node's attempts.

    A node's attempts follow one another: a new one opens only after the
    last has failed, and an event naming one that is missing, reused, out
    of sequence or not the current one is ``invalid_attempt``
    (specs/journal.md, sections 6 and 8).
    """

    attempt_id: str
    sequence: int

    def to_json(self) -> dict[str, Json]:
        """The reference as an event's ``attempt`` member writes it: ``{"id", "sequence"}``."""
        return {"id": self.attempt_id, "sequence": self.sequence}


@attrs.frozen
class Invalidation:
    """Why a ``work-invalidated`` event's node no longer counts: the source record and the policy it acted under.

    Seed 002, Invalidation and successor execution: an invalidation "binds
    an independently resolvable source record and the workflow
    invalidation-policy reference"; the reference must name a policy the
    authority policy declares (specs/journal.md, section 3).
    """

    source: RecordRef
    """The independently resolvable record that made the work invalid (a retraction, say)."""
    policy: str
    """The workflow's invalidation-policy reference."""

    def to_json(self) -> dict[str, Json]:
        """The invalidation as an event's ``invalidation`` member writes it (specs/journal.md, section 5)."""
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
        """Every member but ``digest``: the value whose canonical bytes the event's digest covers (specs/journal.md, section 5)."""
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
        """The event record as stored: its body and its digest, which the next event names as ``previous``."""
        return {**self.body_json(), "digest": self.digest}

    def signed(self) -> tuple[Event, bytes]:
        """This event with its digest over its body's canonical bytes, and its record's bytes, made in one pass.

        The body is written in two parts, the members before ``digest`` and
        those after it, each member's value by ``canonical.value_text``;
        joined, they are the body's canonical bytes, and with the digest
        member between them the record's, the same bytes ``encode_event``
        writes (tests/journal/test_codec.py checks both against encoding
        the whole value).
        """
        t, m = value_text, _member_text
        before = text_bytes(
            f'{{"actor":{t(self.actor_id)},"approvals":{_approvals_text(self.approvals)},"at":{t(self.at)},'
            f'"attempt":{_attempt_text(self.attempt)}'
        )
        after = text_bytes(
            f'"error":{t(self.error)},"event":{m(self.event)},"execution":{t(self.execution_id)},'
            f'"invalidation":{"null" if self.invalidation is None else t(self.invalidation.to_json())},'
            f'"node":{t(self.node_id)},"ordinal":{t(self.ordinal)},"previous":{t(self.previous)},'
            f'"prior_state":{m(self.prior_state)},"rationale":{t(self.rationale)},'
            f'"records":{_refs_text(self.records)},"request":{{"digest":{t(self.request_digest)},"id":{t(self.request_id)}}},'
            f'"resulting_state":{m(self.resulting_state)},"role":{t(self.role)},'
            f'"successor":{"null" if self.successor is None else _ref_text(self.successor)}}}'
        )
        digest = digest_bytes(before + b"," + after)
        signed = Event(
            self.execution_id, self.ordinal, self.previous, self.request_id, self.request_digest, self.node_id,
            self.event, self.prior_state, self.resulting_state, self.actor_id, self.role, self.at, self.rationale,
            self.attempt, self.records, self.approvals, self.error, self.invalidation, self.successor, digest,
        )  # fmt: skip
        return signed, before + b',"digest":"' + digest.encode() + b'",' + after


# The texts value_text gives of the values records hold most often, written
# as to_json() and the encoder would write them (tests/journal/test_codec.py).


# The text of every node event and state, written once: reading an enum
# member's value goes through a Python-level descriptor, and each event and
# request names three members.
_MEMBER_TEXT: Final[Mapping[NodeEvent | NodeState, str]] = MappingProxyType(
    {member: value_text(member.value) for member in (*NodeEvent, *NodeState)}
)


def _member_text(member: NodeEvent | NodeState) -> str:
    text = _MEMBER_TEXT.get(member)
    return text if text is not None else value_text(member.value)


def _ref_text(ref: RecordRef) -> str:
    return f'{{"digest":{value_text(ref.digest)},"id":{value_text(ref.ref_id)},"kind":{value_text(ref.kind)}}}'


def _refs_text(refs: tuple[RecordRef, ...]) -> str:
    return "[" + ",".join([_ref_text(r) for r in refs]) + "]"


def _attempt_text(attempt: AttemptRef | None) -> str:
    if attempt is None:
        return "null"
    return f'{{"id":{value_text(attempt.attempt_id)},"sequence":{value_text(attempt.sequence)}}}'


def _approvals_text(approvals: tuple[Approval, ...]) -> str:
    return "[]" if not approvals else value_text([a.to_json() for a in approvals])


class AttemptStatus(enum.Enum):
    """How an attempt stands (specs/journal.md, section 8): open (the first three) or ended (the rest)."""

    AUTHORIZED = "authorized"
    ACTIVE = "active"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    INVALIDATED = "invalidated"
    """The node was invalidated while this attempt was open: it was cut off, neither completed nor failed."""

    @property
    def is_open(self) -> bool:
        """Whether the attempt may still end: only a node's last attempt can be open."""
        return self in _OPEN


_OPEN: Final = frozenset({AttemptStatus.AUTHORIZED, AttemptStatus.ACTIVE, AttemptStatus.BLOCKED})


@attrs.frozen
class Attempt:
    """One attempt of a node's history as replay derives it: its id, sequence, status and how it ended.

    Derived, never written (specs/journal.md, section 7, The projection): an
    event records only the attempt it binds, so every chain keeps its bytes,
    digests, node states and head, whenever it was written.  No attempt is
    ever removed or replaced.
    """

    attempt_id: str
    sequence: int
    status: AttemptStatus
    error: str | None = None
    ended_by: int | None = None
    """For an ``invalidated`` attempt, the ordinal of the work-invalidated event that cut it off.

    That event binds no attempt, so without this the history could not say
    which record ended the attempt; a completed or failed attempt is ended
    by an event that names it, and carries None.  Derived at replay, never
    written to a record.
    """


# --- commands ---------------------------------------------------------------------------------


@attrs.frozen
class NodeExpectation:
    """A node a batch command touches, and the state its writer believes it is in.

    Every command names the prior state of every node it touches, and is
    refused ``prior_state_mismatch`` when the journal says otherwise
    (specs/journal.md, section 6): a writer acts only on what it has read.
    """

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
        """The transition request whose canonical bytes the request digest covers; no time (specs/journal.md, section 6)."""
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

    def request_bytes(self) -> bytes:
        """``record_bytes(self.request_json())``, written member by member as ``Event.signed`` writes an event."""
        t, m = value_text, _member_text
        return text_bytes(
            f'{{"actor":{t(self.actor_id)},"approvals":{_approvals_text(self.approvals)},'
            f'"attempt":{_attempt_text(self.attempt)},"command":"transition","error":{t(self.error)},'
            f'"event":{m(self.event)},"expected_head":{t(self.expected_head)},"node":{t(self.node_id)},'
            f'"prior_state":{m(self.prior_state)},"rationale":{t(self.rationale)},'
            f'"records":{_refs_text(self.records)},"role":{t(self.role)}}}'
        )


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
        """The invalidation request whose canonical bytes the request digest covers; ``nodes`` sorted by id (section 6)."""
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
        """The successor-binding request whose canonical bytes the request digest covers; ``nodes`` sorted by id (section 6)."""
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
    if isinstance(command, Transition):
        return digest_bytes(command.request_bytes())
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
_BITS = 6
_FANOUT = 1 << _BITS
_EMPTY_BUCKET: Mapping[str, _Recorded] = MappingProxyType({})
_EMPTY_PAGES = tuple(tuple(_EMPTY_BUCKET for _ in range(_FANOUT)) for _ in range(_FANOUT))


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
        """A new log of these events followed by ``events``; this one is unchanged."""
        chunks = list(self._chunks)
        events = tuple(events)
        # Fill the last chunk, then cut the rest into full chunks: a replay
        # extends by the whole history at once, and growing a chunk one
        # event at a time would copy it once per event.
        taken = 0
        if chunks and len(chunks[-1]) < _CHUNK:
            taken = _CHUNK - len(chunks[-1])
            chunks[-1] = (*chunks[-1], *events[:taken])
        chunks.extend(events[start : start + _CHUNK] for start in range(taken, len(events), _CHUNK))
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

    A two-level trie of buckets (64 pages of 64), chosen by the id's hash:
    extending copies the page tuple, the pages the new requests fall in and
    their buckets, so an append copies a bucket of about n/4,096 entries
    where one level of 64 copied n/64 (at 100,000 requests, some 24 entries
    against some 1,560).  A bucket is never changed once a map holds it.
    Each entry also knows the events its request appended (:meth:`recorded`).
    """

    __slots__ = ("_length", "_pages")

    def __init__(self, pages: tuple[tuple[Mapping[str, _Recorded], ...], ...] | None = None, length: int = 0) -> None:
        self._pages = pages if pages is not None else _EMPTY_PAGES
        self._length = length

    def extended(self, entries: Mapping[str, _Recorded]) -> RequestIndex:
        """A new index with ``entries`` added (a repeated id takes the new entry); this one is unchanged."""
        if not entries:
            return self
        if len(entries) == 1:
            # An append records one request: copy its page and bucket without the bookkeeping of a batch.
            ((request_id, recorded),) = entries.items()
            number = hash(request_id)
            at_page, at_bucket = (number >> _BITS) % _FANOUT, number % _FANOUT
            one_page = self._pages[at_page]
            one_bucket = dict(one_page[at_bucket])
            length = self._length + (request_id not in one_bucket)
            one_bucket[request_id] = recorded
            page_copy = list(one_page)
            page_copy[at_bucket] = one_bucket
            pages_copy = list(self._pages)
            pages_copy[at_page] = tuple(page_copy)
            return RequestIndex(tuple(pages_copy), length)
        pages = list(self._pages)
        copied: dict[int, list[Mapping[str, _Recorded]]] = {}
        fresh: set[tuple[int, int]] = set()
        added = 0
        for request_id, recorded in entries.items():
            number = hash(request_id)
            where = ((number >> _BITS) % _FANOUT, number % _FANOUT)
            page = copied.get(where[0])
            if page is None:
                page = copied[where[0]] = list(pages[where[0]])
            if where not in fresh:
                page[where[1]] = dict(page[where[1]])
                fresh.add(where)
            bucket = page[where[1]]
            assert isinstance(bucket, dict)
            added += request_id not in bucket
            bucket[request_id] = recorded
        for number, page in copied.items():
            pages[number] = tuple(page)
        return RequestIndex(tuple(pages), self._length + added)

    def recorded(self, request_id: str) -> _Recorded | None:
        """The request's digest and the events it appended, or None if the id was never recorded."""
        number = hash(request_id)
        return self._pages[(number >> _BITS) % _FANOUT][number % _FANOUT].get(request_id)

    def __getitem__(self, request_id: str) -> str:
        found = self.recorded(request_id)
        if found is None:
            raise KeyError(request_id)
        return found.digest

    def __iter__(self) -> Iterator[str]:
        for page in self._pages:
            for bucket in page:
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
    workers: Mapping[str, frozenset[str]]
    """Node -> every actor who has done work on it (started, blocked, cleared, completed, failed, retried)."""
    requests: RequestIndex
    """Request id -> request digest, for idempotency."""

    @property
    def head(self) -> str:
        """The digest of the last event, or the header's (the chain root) before the first; every command names it."""
        # Read from the log's last chunk (every chunk holds an event): the
        # head is asked several times an append, and indexing the log runs
        # two Python-level methods.
        chunks = self.events._chunks
        return chunks[-1][-1].digest if chunks else self.header.digest

    @property
    def execution_id(self) -> str:
        """The header's execution id, which every event of the chain carries."""
        return self.header.execution_id


@attrs.frozen
class Appended:
    """A command the journal accepted: the journal after it, and the events it appended, in order.

    The caller stores ``events`` (``stored_records`` gives their bytes);
    the new journal is a value, and nothing is stored until the caller does.
    A batch command (an invalidation, a successor binding) appends one event
    per node it covers.
    """

    journal: Journal
    events: tuple[Event, ...]
    records: tuple[bytes, ...] = attrs.field(default=(), eq=False, repr=False)
    """Each event's record bytes, as ``encode_event`` writes them, when made with its digest (else empty)."""

    def stored_records(self) -> tuple[bytes, ...]:
        """What a store writes for ``events``: their canonical record bytes, in order."""
        if len(self.records) == len(self.events):
            return self.records
        return tuple(record_bytes(e.to_json()) for e in self.events)


@attrs.frozen
class Unchanged:
    """The request was already recorded with the same digest: an idempotent repeat."""

    journal: Journal
    request_id: str
    events: tuple[Event, ...] = ()
    """The events the request appended when it was first recorded (the last one's digest is the head it made)."""


Outcome: TypeAlias = Appended | Unchanged | Refusal



# --- time ---------------------------------------------------------------------------------------


def format_time(now: datetime) -> str:
    """``now`` as the record's time text; naive or non-UTC times are refused, and anything but a datetime."""
    if not isinstance(now, datetime):
        # A string or a date has no utcoffset(): an AttributeError out of preview, append or create_header.
        raise JournalError(C.INVALID_REQUEST, f"time must be a timezone-aware UTC datetime, not {type(now).__name__}")
    offset = now.utcoffset()
    if offset is None or offset:
        raise JournalError(C.INVALID_REQUEST, f"time {now.isoformat()} must be timezone-aware UTC")
    # isoformat, not strftime: it writes the year in four digits below 1000
    # too (strftime's %Y does not), the fixed width check_time reads back.
    # A zero offset is always written "+00:00", replaced by "Z".
    return now.isoformat(timespec="microseconds")[:-6] + "Z"


def check_time(text: str, where: str) -> None:
    # Fixed widths make the spelling unique; fromisoformat then rejects dates that do not exist.
    if _TIME.fullmatch(text) is None:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {shown(text)} is not a UTC time like 2026-01-01T00:00:00.000000Z")
    try:
        datetime.fromisoformat(text[:-1])
    except ValueError:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {shown(text)} is not a real moment") from None
