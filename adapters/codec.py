"""How kernel values are written into database rows and read back, shared by every database store.

Rules of this module:

- Times are stored as ISO 8601 text in UTC with microseconds and an explicit
  ``+00:00`` offset, always the same width, so that comparing the text in SQL
  (``lease_expires_at > ?``, ``ORDER BY eligible_at``) compares the instants.
- An execution revision is stored whole, as canonical JSON (sorted keys, no
  spaces), so a revision row is the complete object at that revision and
  reading it back gives an equal value.
- Decoding is strict: a row that does not decode is a broken database, and
  says so, rather than a value with holes.
- A revision row is never changed once written, so the text of an execution
  revision determines its value: decoded (and freshly encoded) revisions are
  kept in a bounded cache keyed by that text, and a worker that reads back
  the revision it has just written does not parse it again.
"""

from __future__ import annotations

import collections
import json
import re
import threading
from datetime import UTC, datetime
from typing import Any

import attrs

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState, OperationEvent, OperationState

from .store import StoreError

_FIRST = datetime(1, 1, 1, tzinfo=UTC)
_last: tuple[datetime, str] = (_FIRST, _FIRST.isoformat(timespec="microseconds"))
"""The time encoded last, and its text.  A decision spells its one moment several times (the rows
of each transition, their outbox rows, the guard), and isoformat costs some 3 us; a datetime never
changes, so the same object has the same text.  Replaced whole, never changed: threads share it."""


def encode_time(moment: datetime) -> str:
    global _last  # noqa: PLW0603 (see _last)
    last = _last
    if moment is last[0]:
        return last[1]
    if moment.tzinfo is UTC:  # what every store clock gives: no conversion to make
        text = moment.isoformat(timespec="microseconds")
    elif moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: the stores keep UTC only")
    else:
        text = moment.astimezone(UTC).isoformat(timespec="microseconds")
    _last = (moment, text)
    return text


def encode_optional_time(moment: datetime | None) -> str | None:
    return None if moment is None else encode_time(moment)


def decode_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is UTC:  # as every time this module writes reads back
        return moment
    if moment.tzinfo is None:
        raise ValueError(f"stored time {text!r} has no offset")
    return moment.astimezone(UTC)


def decode_optional_time(text: str | None) -> datetime | None:
    return None if text is None else decode_time(text)


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
# json.dumps builds a new encoder on every call that passes options; one
# shared encoder writes the same text (it keeps no state between calls).


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


# Possessive: a string is never split two ways, so text with a quote left open (a row edited by hand)
# fails to match at once instead of backtracking through every split of the characters after it.
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\{\}|\[\]")


def nests_deeper(text: str, levels: int) -> bool:
    """Whether the JSON ``text`` nests objects and arrays more than ``levels`` deep; without decoding it.

    ``json.loads`` follows nesting on the interpreter's stack, so text nested
    near the recursion limit decodes in one call and raises RecursionError in
    a deeper one: a store asks this first of text it did not bound itself
    (an Event published before payloads were).  Text with no more brackets
    than ``levels`` is answered by counting them; otherwise strings are
    dropped, then the innermost pairs, once a level, in C.
    """
    if text.count("{") + text.count("[") <= levels:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(levels):
        if not brackets:
            return False
        brackets = _INNERMOST.sub("", brackets)
    return bool(brackets)


class _Revisions:
    """A bounded map from the text of execution revisions to their value, least recently used first out."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: collections.OrderedDict[str, p.Execution] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> p.Execution | None:
        with self._lock:
            value = self._values.get(text)
            if value is not None:
                self._values.move_to_end(text)
            return value

    def put(self, text: str, value: p.Execution) -> None:
        with self._lock:
            self._values[text] = value
            if len(self._values) > self.size:
                self._values.popitem(last=False)


_REVISIONS = _Revisions(4096)


_quote = json.encoder.encode_basestring_ascii
"""How ``json.dumps`` writes a string (ensure_ascii, its default): quoted and escaped, in C."""

TEXT: dict[ExecutionState | ExecutionEvent | DispatchState, str] = {
    member: member.value for kind in (ExecutionState, ExecutionEvent, DispatchState) for member in kind
}
"""The text a row holds for a state or event: its value.

``member.value`` runs enum's property in Python, and a decision's rows spell
some twenty of them; these members hash by identity (TableEnum), so a lookup
here runs in C, in a fifth of the time."""

OPERATION_TEXT: dict[OperationState | OperationEvent, str] = {
    member: member.value for kind in (OperationState, OperationEvent) for member in kind
}
"""As :data:`TEXT`, for an Operation's states and events (the rows, the transition and the outbox row of every
Operation decision spell several)."""


def encode_execution(execution: p.Execution) -> str:
    e = execution
    wait = e.wait
    # Written out in canonical order (the keys sorted) when every field has
    # the exact type the kernel gives it: the same text as the generic
    # encoder, a few microseconds sooner on every decision.  Anything else
    # goes through the generic encoder.
    if (
        type(e.execution_id) is str
        and type(e.business_id) is str
        and type(e.definition_id) is str
        and (e.current_node_id is None or type(e.current_node_id) is str)
        and type(e.revision) is int
        and type(e.definition_revision) is int
        and type(e.step_count) is int
        and type(e.fence) is int
        and (
            wait is None
            or (type(wait.execution_id) is str and type(wait.node_id) is str and type(wait.attempt_id) is str)
        )
    ):
        node = "null" if e.current_node_id is None else _quote(e.current_node_id)
        waits = (
            "null"
            if wait is None
            else f"[{_quote(wait.execution_id)},{_quote(wait.node_id)},{_quote(wait.attempt_id)}]"
        )
        text = (
            f'{{"business_id":{_quote(e.business_id)},"current_node_id":{node},'
            f'"definition_id":{_quote(e.definition_id)},"definition_revision":{e.definition_revision},'
            f'"execution_id":{_quote(e.execution_id)},"fence":{e.fence},"revision":{e.revision},'
            f'"state":{_quote(TEXT[e.state])},"step_count":{e.step_count},"wait":{waits}}}'
        )
        _REVISIONS.put(text, execution)
        return text
    text = dumps(
        {
            "execution_id": execution.execution_id,
            "business_id": execution.business_id,
            "state": execution.state.value,
            "revision": execution.revision,
            "definition_id": execution.definition_id,
            "definition_revision": execution.definition_revision,
            "current_node_id": execution.current_node_id,
            "step_count": execution.step_count,
            "fence": execution.fence,
            "wait": None if wait is None else [wait.execution_id, wait.node_id, wait.attempt_id],
        }
    )
    _REVISIONS.put(text, execution)
    return text


def decode_execution(text: str | None, execution_id: str | None = None) -> p.Execution:
    """The execution revision ``text`` holds; StoreError('malformed_row') naming ``execution_id`` if it holds none.

    ``text`` is None where the execution's row names a revision that has no
    stored body (a row edited by hand or damaged): a request that meets it
    fails with one error naming the execution, never a traceback, and
    writes nothing.
    """
    if text is None:
        raise _malformed(execution_id, "its row names a revision with no stored body")
    known = _REVISIONS.get(text)
    if known is not None:
        return known
    try:
        body = json.loads(text)
        wait = body["wait"]
        execution = p.Execution(
            execution_id=body["execution_id"],
            business_id=body["business_id"],
            state=ExecutionState(body["state"]),
            revision=body["revision"],
            definition_id=body["definition_id"],
            definition_revision=body["definition_revision"],
            current_node_id=body["current_node_id"],
            step_count=body["step_count"],
            fence=body["fence"],
            wait=None if wait is None else p.WaitKey(*wait),
        )
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise _malformed(execution_id, f"its stored revision cannot be read ({type(exc).__name__}: {exc})") from None
    _REVISIONS.put(text, execution)
    return execution


def _malformed(execution_id: str | None, what: str) -> StoreError:
    named = "an execution" if execution_id is None else f"execution {execution_id!r}"
    return StoreError(
        "malformed_row",
        f"{named}: {what} (the stored row was edited by hand or damaged; nothing was written)",
        execution_id=execution_id,
    )


def encode_wait_spec(spec: p.WaitSpec) -> str:
    return dumps(
        {
            "node_id": spec.node_id,
            "attempt_id": spec.attempt_id,
            "event_type": spec.event_type,
            "correlation": [list(pair) for pair in spec.correlation],
            "wake_at": encode_optional_time(spec.wake_at),
            "timeout": spec.timeout,
            "continuations": [list(pair) for pair in spec.continuations],
        }
    )


def decode_wait_spec(text: str) -> p.WaitSpec:
    body = json.loads(text)
    return p.WaitSpec(
        node_id=body["node_id"],
        attempt_id=body["attempt_id"],
        event_type=body["event_type"],
        correlation=tuple((name, value) for name, value in body["correlation"]),
        wake_at=decode_optional_time(body["wake_at"]),
        timeout=body["timeout"],
        # Registrations written before continuations existed have none.
        continuations=tuple((outcome, node) for outcome, node in body.get("continuations", ())),
    )


def encode_recovery(record: p.RecoveryRecord) -> str:
    body: dict[str, object] = {
        "command_id": record.command_id,
        "kind": record.kind.value,
        "execution_id": record.execution_id,
        "expected_revision": record.expected_revision,
        "resulting_revision": record.resulting_revision,
        "resulting_state": record.resulting_state.value,
    }
    if record.proof is not None:
        body["proof"] = {**attrs.asdict(record.proof), "basis": list(record.proof.basis)}
    return dumps(body)


def decode_recovery(text: str) -> p.RecoveryRecord:
    body = json.loads(text)
    proof = body.get("proof")
    return p.RecoveryRecord(
        command_id=body["command_id"],
        kind=p.RecoveryKind(body["kind"]),
        execution_id=body["execution_id"],
        expected_revision=body["expected_revision"],
        resulting_revision=body["resulting_revision"],
        resulting_state=ExecutionState(body["resulting_state"]),
        # Records written before the kernel kept its proof have none.
        proof=None if proof is None else p.SafeResumeEvidence(**{**proof, "basis": tuple(proof.get("basis", ()))}),
    )


__all__ = [
    "decode_execution",
    "decode_optional_time",
    "decode_recovery",
    "decode_time",
    "decode_wait_spec",
    "dumps",
    "encode_execution",
    "encode_optional_time",
    "encode_recovery",
    "encode_time",
    "encode_wait_spec",
]
