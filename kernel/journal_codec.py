"""The execution journal's codec: records to canonical bytes and strictly back, and commands from JSON.

The DAG node journal contract (seed 002: Key types and services,
``WorkflowExecutionCanonicalCodec``); specs/journal.md, sections 1 and 4-6.
Rules of this module:

- Reading is strict: canonical bytes only (``canonical.parse_canonical``),
  exactly the format's members (``unknown_field``, ``missing_field``), each
  of its type (``malformed_record``), and a digest that matches the record
  (``altered_digest``).  Nothing is repaired or defaulted on the way in.
- Replay reads through :func:`read_event`, whose fast reader takes only
  plain transition records and accepts exactly what the strict reader
  accepts, giving the same event; anything else, and every refusal, is the
  strict reader's (tests/journal/test_fast_reader.py).
- Commands and policies come from people and files, so their JSON readers
  name the field that is wrong; they decide nothing (``journal.py`` does).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime

from .canonical import canonical_bytes, digest_bytes, is_digest, parse_canonical, record_bytes
from .common import shown
from .dag import strict_flag, strict_list, strict_object, strict_text, strict_texts
from .definition import IDENTIFIER
from .journal_codes import JournalCode, JournalError
from .journal_records import (
    _TIME,
    FORMAT,
    MAX_WHOLE,
    ActorKind,
    Approval,
    Assignment,
    AttemptRef,
    AuthorityPolicy,
    BindSuccessor,
    Command,
    Event,
    Header,
    Invalidate,
    Invalidation,
    InvalidationPolicy,
    NodeExpectation,
    RecordRef,
    Transition,
    check_time,
)
from .machines import NodeEvent, NodeState

C = JournalCode


# --- the codec: records to bytes and back -----------------------------------------------------


def encode_header(header: Header) -> bytes:
    """The header's stored bytes: its canonical record (specs/journal.md), the first line of a chain."""
    return record_bytes(header.to_json())


def encode_event(event: Event) -> bytes:
    """The event's stored bytes: its canonical record (specs/journal.md), one line of a chain."""
    return record_bytes(event.to_json())


def _digest_field(value: object, where: str) -> str:
    text = strict_text(value, where)
    if not is_digest(text):
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {shown(text)} is not sha256: and 64 lowercase hex digits")
    return text


def _optional_text(value: object, where: str) -> str | None:
    return None if value is None else strict_text(value, where)


def _identifier_field(value: object, where: str) -> str:
    text = strict_text(value, where)
    if IDENTIFIER.fullmatch(text) is None:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {shown(text)} is not an identifier (specs/journal.md, section 1)")
    return text


def _record_ref(value: object, where: str) -> RecordRef:
    obj = strict_object(value, where, required=("digest", "id", "kind"), optional=())
    return RecordRef(
        kind=strict_text(obj["kind"], f"{where}.kind"),
        ref_id=strict_text(obj["id"], f"{where}.id"),
        digest=_digest_field(obj["digest"], f"{where}.digest"),
    )


def _whole(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WHOLE:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: must be a whole number from 0 to {MAX_WHOLE}")
    return value


def _enum_member(kind: type[NodeState] | type[NodeEvent], value: object, where: str) -> NodeState | NodeEvent:
    text = strict_text(value, where)
    try:
        return kind(text)
    except ValueError:
        raise JournalError(C.MALFORMED_RECORD, f"{where}: {shown(text)} is not a node {kind.__name__[4:].lower()}") from None


_HEADER_FIELDS = (
    "created_at", "created_by", "digest", "execution", "format", "nodes",
    "policy_digest", "protocol", "supersedes", "workflow_digest",
)  # fmt: skip
_EVENT_FIELDS = (
    "actor", "approvals", "at", "attempt", "digest", "error", "event", "execution", "invalidation", "node",
    "ordinal", "previous", "prior_state", "rationale", "records", "request", "resulting_state", "role", "successor",
)  # fmt: skip


def _members(value: dict[str, object], fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, object]:
    """A record's members, every one of ``fields`` and any of ``optional``, or the refusal naming the member.

    Only the member: the ordinal the error is raised at names the record
    ("header: ", "event 7: "), and naming it again would read "header:
    header: ...".
    """
    unknown = sorted(set(value) - set(fields) - set(optional))
    if unknown:
        raise JournalError(C.UNKNOWN_FIELD, f"unknown field {shown(unknown[0])}")
    for name in fields:
        if name not in value:
            raise JournalError(C.MISSING_FIELD, f"missing field {shown(name)}")
    return value


def decode_header(data: bytes) -> Header:
    """Strictly rehydrate a header: canonical bytes, known fields only, and a digest that matches."""
    try:
        obj = _members(parse_canonical(data), _HEADER_FIELDS)
        if obj["format"] != FORMAT:
            raise JournalError(C.MALFORMED_RECORD, f"format: {shown(obj['format'])} is not {FORMAT!r}")
        header = Header(
            # The header's own ids, as create_header checks them: the events'
            # execution, and a successor binding's supersedes, are compared
            # with these, so they are held to the identifier spelling too.
            execution_id=_identifier_field(obj["execution"], "execution"),
            workflow_digest=_digest_field(obj["workflow_digest"], "workflow_digest"),
            policy_digest=_digest_field(obj["policy_digest"], "policy_digest"),
            protocol=strict_text(obj["protocol"], "protocol"),
            nodes=strict_texts(obj["nodes"], "nodes"),
            created_by=strict_text(obj["created_by"], "created_by"),
            created_at=strict_text(obj["created_at"], "created_at"),
            supersedes=None if obj["supersedes"] is None else _identifier_field(obj["supersedes"], "supersedes"),
            digest=_digest_field(obj["digest"], "digest"),
        )
        check_time(header.created_at, "created_at")
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
    obj = _members(parse_canonical(data), _EVENT_FIELDS)
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
    check_time(at, "at")
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


# --- the fast reader: a plain transition event, recognised whole ---------------------------------
#
# Replay reads every record of a journal, and most are transitions whose
# strings are plain printable ASCII.  For those, one regular expression
# written from the format (section 4: the members in canonical order, each
# of its type, strings that need no escape, whole numbers without a sign or
# leading zero, digests spelt as the codec spells them) recognises exactly
# the canonical bytes of an event the strict reader accepts, without
# parsing and re-encoding the record.  Canonical, because for such a value
# JCS writes each string between quotes as it is and each whole number in
# plain decimal, which is all the expression admits.  What it does not
# recognise (a non-ASCII or escaped string, approvals, an invalidation, a
# successor, anything malformed) takes the strict reader, which alone
# decides refusals, so every code and message is the strict reader's.

_PLAIN = r'[ !#-\[\]-~]*'  # printable ASCII but '"' and '\': RFC 8785 writes such a string as it is
_FAST_DIGEST = r"sha256:[0-9a-f]{64}"
_FAST_WHOLE = r"0|[1-9][0-9]{0,15}"
_FAST_REF = rf'\{{"digest":"{_FAST_DIGEST}","id":"{_PLAIN}","kind":"{_PLAIN}"\}}'
_FAST_REFS = re.compile(rf'\{{"digest":"({_FAST_DIGEST})","id":"({_PLAIN})","kind":"({_PLAIN})"\}}')
_FAST_TIME = _TIME.pattern  # check_time's spelling
_FAST_EVENT = re.compile(
    rf'\{{"actor":"({_PLAIN})","approvals":\[\],"at":"({_FAST_TIME})",'
    rf'"attempt":(null|\{{"id":"({_PLAIN})","sequence":({_FAST_WHOLE})\}}),"digest":"({_FAST_DIGEST})",'
    rf'"error":(null|"({_PLAIN})"),"event":"({_PLAIN})","execution":"({_PLAIN})","invalidation":null,'
    rf'"node":"({_PLAIN})","ordinal":({_FAST_WHOLE}),"previous":"({_FAST_DIGEST})","prior_state":"({_PLAIN})",'
    rf'"rationale":"({_PLAIN})","records":(\[(?:{_FAST_REF}(?:,{_FAST_REF})*)?\]),'
    rf'"request":\{{"digest":"({_FAST_DIGEST})","id":"({_PLAIN})"\}},"resulting_state":"({_PLAIN})",'
    rf'"role":"({_PLAIN})","successor":null\}}'
)
_DIGEST_MEMBER_START = len(',"digest":"')
_EVENTS_BY_VALUE = {e.value: e for e in NodeEvent}
_STATES_BY_VALUE = {s.value: s for s in NodeState}
_BATCH_EVENTS = frozenset({NodeEvent.WORK_INVALIDATED.value, NodeEvent.SUCCESSOR_BOUND.value})


def read_event(data: bytes, ordinal: int | None = None) -> tuple[Event, str | None]:
    """:func:`decode_event`, and the request digest of the transition the event records when its bytes give it.

    The digest (``None`` when not given) is ``request_digest`` of the
    transition replay rebuilds from the event, computed from the record's
    own text: each member of the request is written exactly as the event
    writes it (tests/journal/test_codec.py checks both against the slow
    path).  Refusals are :func:`decode_event`'s, code and message.
    """
    fast = _read_plain_transition(data)
    if fast is not None:
        return fast
    return decode_event(data, ordinal), None


def _read_plain_transition(data: bytes) -> tuple[Event, str | None] | None:
    """The event and its request digest if the fast reader recognises ``data`` and every check passes; else None."""
    if not data.isascii():
        return None
    text = data.decode("ascii")
    match = _FAST_EVENT.fullmatch(text)
    if match is None:
        return None
    (actor, at, attempt_text, attempt_id, sequence, digest, error_text, error, event_name, execution, node,
     ordinal, previous, prior, rationale, records_text, request_digest, request_id, resulting, role) = match.groups()  # fmt: skip
    event = _EVENTS_BY_VALUE.get(event_name)
    prior_state = _STATES_BY_VALUE.get(prior)
    resulting_state = _STATES_BY_VALUE.get(resulting)
    number = int(ordinal)
    if event is None or prior_state is None or resulting_state is None or number > MAX_WHOLE:
        return None
    attempt = None
    if attempt_id is not None:
        attempt_sequence = int(sequence)
        if attempt_sequence > MAX_WHOLE:
            return None
        attempt = AttemptRef(attempt_id, attempt_sequence)
    try:
        # check_time's second half; the expression spelt its first.
        datetime.fromisoformat(at[:-1])
    except ValueError:
        return None
    # The record without its own digest member, cut where the expression
    # found that member (group 6 is the digest's value) (one character a byte: the record is ASCII).
    body = hashlib.sha256(data[: match.start(6) - _DIGEST_MEMBER_START])
    body.update(data[match.end(6) + 1 :])
    if "sha256:" + body.hexdigest() != digest:
        return None
    stored = Event(
        execution_id=execution,
        ordinal=number,
        previous=previous,
        request_id=request_id,
        request_digest=request_digest,
        node_id=node,
        event=event,
        prior_state=prior_state,
        resulting_state=resulting_state,
        actor_id=actor,
        role=role,
        at=at,
        rationale=rationale,
        attempt=attempt,
        records=tuple(RecordRef(kind, ref_id, ref_digest) for ref_digest, ref_id, kind in _FAST_REFS.findall(records_text)),
        approvals=(),
        error=error,
        invalidation=None,
        successor=None,
        digest=digest,
    )
    if event_name in _BATCH_EVENTS:
        return stored, None
    # Transition.request_json of the command rebuilt from this event, in
    # canonical form: every member's value is written as the event writes it.
    request = (
        f'{{"actor":"{actor}","approvals":[],"attempt":{attempt_text},"command":"transition","error":{error_text},'
        f'"event":"{event_name}","expected_head":"{previous}","node":"{node}","prior_state":"{prior}",'
        f'"rationale":"{rationale}","records":{records_text},"role":"{role}"}}'
    )
    return stored, digest_bytes(request.encode("ascii"))


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



# --- reading a policy from JSON -----------------------------------------------------------------


def policy_from_json(value: object, where: str = "policy") -> AuthorityPolicy:
    """A policy from its JSON form (the same fields as :meth:`AuthorityPolicy.to_json`)."""
    obj = strict_object(
        value,
        where,
        required=("approved_by", "assignments", "policy", "protocol", "scope", "workflow_digest"),
        optional=("invalidation_policies",),
    )
    assignments = []
    for n, item in enumerate(strict_list(obj["assignments"], f"{where}.assignments")):
        at = f"{where}.assignments[{n}]"
        fields = strict_object(item, at, required=("actor", "kind", "roles"), optional=())
        kind_text = strict_text(fields["kind"], f"{at}.kind")
        try:
            kind = ActorKind(kind_text)
        except ValueError:
            raise JournalError(C.MALFORMED_RECORD, f"{at}.kind: {shown(kind_text)} is not human or automation") from None
        assignments.append(
            Assignment(strict_text(fields["actor"], f"{at}.actor"), kind, strict_texts(fields["roles"], f"{at}.roles"))
        )
    invalidations = []
    for n, item in enumerate(strict_list(obj.get("invalidation_policies", []), f"{where}.invalidation_policies")):
        at = f"{where}.invalidation_policies[{n}]"
        fields = strict_object(
            item, at, required=("policy", "roles"), optional=("automation_may_invalidate_human_work",)
        )
        automation = strict_flag(
            fields.get("automation_may_invalidate_human_work", False), f"{at}.automation_may_invalidate_human_work"
        )
        invalidations.append(
            InvalidationPolicy(
                strict_text(fields["policy"], f"{at}.policy"), strict_texts(fields["roles"], f"{at}.roles"), automation
            )
        )
    return AuthorityPolicy(
        invalidation_policies=tuple(invalidations),
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
    ``missing_field``, ``malformed_record``) naming the field, within
    ``where`` ("command.node: ...").  An empty ``where`` is for a caller
    whose message names the command already ("command 2: "): the field is
    then named alone ("missing field 'actor'", "node: ..."), as a record's
    member is, not "command 2: command: ...".
    """

    def at(field: str) -> str:
        return f"{where}.{field}" if where else field

    own = f"{where}: " if where else ""
    if not isinstance(value, dict) or not isinstance(value.get("command"), str):
        raise JournalError(C.MALFORMED_RECORD, f'{own}must be an object with "command" naming its kind')
    kind = value["command"]
    if kind not in _COMMAND_FIELDS:
        raise JournalError(C.MALFORMED_RECORD, f"{at('command')}: {shown(kind)} is not one of {sorted(_COMMAND_FIELDS)}")
    required, optional = _COMMAND_FIELDS[kind]
    if where:
        obj = strict_object(value, where, required=required, optional=optional)
    else:
        obj = _members(value, tuple(required), tuple(optional))
    # A null expected_head is a value of the wrong type, not an absent one
    # (which the caller's head fills): "missing field" would misname it.
    head = obj.get("expected_head", expected_head)
    if head is None and "expected_head" not in obj:
        raise JournalError(C.MISSING_FIELD, f"{own}missing field 'expected_head'")
    common = {
        "request_id": strict_text(obj["request"], at("request")),
        "expected_head": strict_text(head, at("expected_head")),
        "actor_id": strict_text(obj["actor"], at("actor")),
        "role": strict_text(obj["role"], at("role")),
        "rationale": strict_text(obj.get("rationale", ""), at("rationale")),
    }
    if kind == "transition":
        attempt = obj.get("attempt")
        attempt_ref = None
        if attempt is not None:
            fields = strict_object(attempt, at("attempt"), required=("id", "sequence"), optional=())
            attempt_ref = AttemptRef(
                strict_text(fields["id"], at("attempt.id")), _whole(fields["sequence"], at("attempt.sequence"))
            )
        approvals = []
        for n, item in enumerate(strict_list(obj.get("approvals", []), at("approvals"))):
            approval = at(f"approvals[{n}]")
            fields = strict_object(item, approval, required=("actor", "record", "role"), optional=())
            approvals.append(
                Approval(
                    strict_text(fields["actor"], f"{approval}.actor"),
                    strict_text(fields["role"], f"{approval}.role"),
                    _record_ref(fields["record"], f"{approval}.record"),
                )
            )
        return Transition(
            node_id=strict_text(obj["node"], at("node")),
            event=NodeEvent(_enum_member(NodeEvent, obj["event"], at("event")).value),
            prior_state=NodeState(_enum_member(NodeState, obj["prior_state"], at("prior_state")).value),
            attempt=attempt_ref,
            records=tuple(
                _record_ref(item, at(f"records[{n}]"))
                for n, item in enumerate(strict_list(obj.get("records", []), at("records")))
            ),
            approvals=tuple(approvals),
            error=_optional_text(obj.get("error"), at("error")),
            **common,
        )
    nodes = []
    for n, item in enumerate(strict_list(obj["nodes"], at("nodes"))):
        fields = strict_object(item, at(f"nodes[{n}]"), required=("node", "prior_state"), optional=())
        nodes.append(
            NodeExpectation(
                strict_text(fields["node"], at(f"nodes[{n}].node")),
                NodeState(_enum_member(NodeState, fields["prior_state"], at(f"nodes[{n}].prior_state")).value),
            )
        )
    if kind == "invalidate":
        return Invalidate(
            source=_record_ref(obj["source"], at("source")),
            policy=strict_text(obj["policy"], at("policy")),
            nodes=tuple(nodes),
            **common,
        )
    return BindSuccessor(successor=_record_ref(obj["successor"], at("successor")), nodes=tuple(nodes), **common)


__all__ = [
    "command_from_json",
    "decode_event",
    "decode_header",
    "encode_event",
    "encode_header",
    "policy_from_json",
    "read_event",
]
