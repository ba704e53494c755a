"""Events and the exact matching rule that lets one wake a waiter.

The workflow execution contract (seed 000: Node Semantics, ``wait_for_event``).
Rules of this module:

- A match needs exact Event Type equality, the same Business, and every
  predicate of the waiter's correlation descriptor equal to the Event's
  value of the same name.  Nothing is normalised, nothing is fuzzy: values
  are compared as the exact strings they are.  An Event may carry more
  correlation values than a waiter asks for; it matches a waiter only on
  the names the waiter declares.
- Event connectivity is never authority: matching says only which waiters an
  Event *could* wake; the wake itself is a protocol decision.
- An Event carries one to sixteen correlation values: every waiter
  declares at least one predicate, so an Event with none could match
  nothing and is refused rather than kept as history nobody can act on.
- Correlation values are strings.  Definitions may compare with integers
  and booleans; :func:`correlation_value` is the one canonical spelling of
  those, used on both sides, so ``7`` and ``"7"`` match and ``True`` is
  ``"true"``.
- No string of an Event may hold what a store cannot keep as text (a NUL, a
  lone surrogate: kernel/text.py); :meth:`Event.build` refuses it naming the
  field, so that SQLite and PostgreSQL agree.  Its payload is JSON that reads
  back equal (no NaN, string keys only), so a republication is idempotent.
- A payload is bounded as an object input is (kernel/definition.py): at
  most :data:`MAX_PAYLOAD_DEPTH` levels and :data:`MAX_PAYLOAD_JSON`
  characters as compact JSON.  A matching payload becomes the wait node's
  outputs, which every later revision of the attempt carries again, and a
  payload nested past the recursion limit could be published but not read
  back by a worker.  The bound is one of publication: an Event stored
  before it keeps waking its waiters (:func:`wake_outputs`).  Every store
  holds it as well (:func:`checked_payload`), for an Event made without
  :meth:`Event.build`; publishing a stored Event past it again is refused,
  as any publication past it is, not answered as a duplicate.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from . import text
from .common import shown
from .definition import MAX_INPUT_DEPTH, MAX_INPUT_JSON, RESERVED_EVENT_TYPE_PREFIX
from .protocol import WaitSpec

MAX_CORRELATION: Final = 16
MAX_VALUE_LENGTH: Final = 256
MAX_PAYLOAD_JSON: Final = MAX_INPUT_JSON
"""The longest a payload may be, as compact JSON text: the bound of an object input, whose place it takes."""
MAX_PAYLOAD_DEPTH: Final = MAX_INPUT_DEPTH
"""How deeply a payload may nest, the payload object itself the first level: the depth of an object input."""
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}")


class EventError(ValueError):
    """A malformed Event; the message names the field."""

    code = "invalid_event"


def json_problem(value: object, field: str) -> tuple[str, str] | None:
    """The first value in ``value`` that is not JSON a store keeps and reads back equal: ``(field, problem)``.

    NaN equals nothing, itself read back included, and a key that is not a
    string is read back as one: either would make a republished Event a
    conflict with itself, and a Command's outputs (kernel/interpreter.py)
    read otherwise on a later visit than they were reported.  Strings are
    :func:`~fencekeeper.kernel.text.first_problem`'s to check; a member is
    named as it names one.  A value nested past the recursion limit (or
    containing itself) raises RecursionError.
    """
    if value is None or isinstance(value, str | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (field, "must be a finite number")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                # The object is the field at fault, and the key says which member: "lines[1]" read as an index.
                return (field, f"has the key {shown(key)}, of type {type(key).__name__}; object keys must be strings")
            found = json_problem(item, text.member(field, key))
            if found is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = json_problem(item, f"{field}[{index}]")
            if found is not None:
                return found
        return None
    return (field, f"is a {type(value).__name__}, which is not a JSON value")


def payload_nests_deeper(payload: Mapping[str, Any]) -> bool:
    """Whether ``payload`` nests deeper than :data:`MAX_PAYLOAD_DEPTH` levels (itself the first); without recursion."""
    return _walk(payload, measure=False) is not None


def payload_bound_problem(payload: Mapping[str, Any]) -> str | None:
    """Whether ``payload`` nests deeper than :data:`MAX_PAYLOAD_DEPTH` or is surely longer than :data:`MAX_PAYLOAD_JSON`.

    Walked level by level without recursion, before anything that recurses
    (:func:`json_problem`, encoding), so that a payload nested 100,000
    levels deep, or containing itself, is refused here rather than raising
    RecursionError.  The length counted is a lower bound of its compact
    JSON (every string with its quotes, every other value one character),
    so a 50 MB string is refused without being encoded, and a value shared
    many times over is refused before its encoding could grow past memory;
    :meth:`Event.build` measures the exact text once this passes.
    """
    return _walk(payload, measure=True)


def _walk(payload: Mapping[str, Any], *, measure: bool) -> str | None:
    level: list[object] = [payload]
    depth = 0
    least = 0
    while level:
        depth += 1
        if depth > MAX_PAYLOAD_DEPTH:
            return f"nests deeper than {MAX_PAYLOAD_DEPTH} levels"
        below: list[object] = []
        for container in level:
            least += 2
            if isinstance(container, Mapping):
                for key in container:
                    least += (len(key) if isinstance(key, str) else 1) + 3
                items: Any = container.values()
            else:
                items = container
            for item in items:
                if isinstance(item, str):
                    least += len(item) + 2
                elif isinstance(item, Mapping | list | tuple):
                    below.append(item)
                else:
                    least += 1
                if measure and least > MAX_PAYLOAD_JSON:
                    return _TOO_LONG
        # A value shared many times over is one container to a depth question: without this, a payload
        # built in memory (never one read from JSON text) could make each level twice as long as the last.
        level = below if measure else list({id(item): item for item in below}.values())
    return None


_TOO_LONG: Final = f"is longer than {MAX_PAYLOAD_JSON} characters as compact JSON"

# Compact, as an object input is measured; allow_nan=False as a last word on NaN, which json_problem refuses first.
_PAYLOAD_JSON: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def checked_payload(payload: object) -> dict[str, Any]:
    """``payload`` as a store reads it back, or :class:`EventError` naming the field if it may not be published.

    The one payload check of publication: :meth:`Event.build` applies it,
    and so does every store's ``publish_event`` to the Event it is given,
    so that an Event made without :meth:`Event.build` is refused with the
    same message and no store keeps a payload a waiter could not read.
    """
    if not isinstance(payload, Mapping):
        raise EventError("payload: must be an object")
    bound = payload_bound_problem(payload)
    if bound is not None:
        raise EventError(f"payload: {bound}")
    found = json_problem(payload, "payload") or text.first_problem(payload, "payload")
    if found is not None:
        raise EventError(f"{found[0]}: {found[1]}")
    try:
        written = _PAYLOAD_JSON.encode(dict(payload))
    except (TypeError, ValueError) as exc:
        # What the checks above let through and JSON still cannot write: a Mapping that is no dict
        # nested inside, an integer longer than Python writes.
        raise EventError(f"payload: cannot be written as JSON: {shown(str(exc))}") from None
    if len(written) > MAX_PAYLOAD_JSON:
        raise EventError(f"payload: {_TOO_LONG}")
    # The payload as a store reads it back (a tuple is a list), so that publishing the same Event
    # again compares equal to the kept one and is a duplicate, not a conflict.
    kept: dict[str, Any] = json.loads(written)
    return kept


def correlation_value(value: object) -> str:
    """The canonical string of a correlation value (str as is, int in decimal, bool as true/false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    raise EventError(f"correlation values are strings, integers or booleans, not {type(value).__name__}")


@attrs.frozen
class Event:
    """A committed Event: identity, Business, exact type, correlation values and an opaque payload."""

    event_id: str
    business_id: str
    event_type: str
    correlation: tuple[tuple[str, str], ...]
    payload: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)
    payload_withheld: str | None = attrs.field(default=None, eq=False, hash=False)
    """Why ``payload`` is empty although the stored Event has one, or None: a store reading an Event
    published before the bound (:data:`WITHHELD_DEEP`) leaves a payload it could not read safely unread."""

    @classmethod
    def build(
        cls,
        event_id: str,
        business_id: str,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = None,
    ) -> Event:
        """Validate and canonicalise; raises :class:`EventError` naming the field."""
        for field, given in (("event_id", event_id), ("business_id", business_id), ("event_type", event_type)):
            if not isinstance(given, str) or not _ID.fullmatch(given):
                raise EventError(f"{field}: malformed identifier {shown(given)}")
        if event_type.startswith(RESERVED_EVENT_TYPE_PREFIX):
            raise EventError(
                f"event_type: {shown(event_type)} is reserved: types beginning {RESERVED_EVENT_TYPE_PREFIX!r} "
                "are the kernel's own waits, which only an authorized decision wakes"
            )
        if not isinstance(correlation, Mapping):
            raise EventError("correlation: must be an object of name -> value")
        if not correlation:
            # Every waiter declares one to sixteen predicates (seed 000, Node Semantics, wait_for_event:
            # "one or more exact equality predicates"), so an Event with no values could wake nobody, ever.
            raise EventError("correlation: at least one value; an Event without correlation matches no waiter")
        if len(correlation) > MAX_CORRELATION:
            raise EventError(f"correlation: at most {MAX_CORRELATION} values, got {len(correlation)}")
        pairs = []
        for name, value in correlation.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise EventError(f"correlation: malformed name {shown(name)} (lower-case letters, digits, _)")
            try:
                value_text = correlation_value(value)
            except EventError as exc:
                raise EventError(f"correlation.{name}: {exc}") from None
            if len(value_text) > MAX_VALUE_LENGTH:
                raise EventError(f"correlation.{name}: longer than {MAX_VALUE_LENGTH} characters")
            unstorable = text.problem(value_text)
            if unstorable is not None:
                raise EventError(f"correlation.{name}: {unstorable}")
            pairs.append((name, value_text))
        kept = checked_payload({} if payload is None else payload)
        return cls(event_id, business_id, event_type, tuple(sorted(pairs)), kept)

    def same_content(self, other: Event) -> bool:
        """Whether a second publication with this identity is the same Event (then it is idempotent)."""
        return (self.business_id, self.event_type, self.correlation, dict(self.payload), self.payload_withheld) == (
            other.business_id,
            other.event_type,
            other.correlation,
            dict(other.payload),
            other.payload_withheld,
        )


WITHHELD_DEEP: Final = (
    f"the Event's payload nests deeper than {MAX_PAYLOAD_DEPTH} levels (published before payloads were bounded); "
    "it stays on the Event and is not read into the attempt"
)
"""Why a wake carries no payload from a stored Event nested past the bound (:func:`wake_outputs`)."""


def wake_outputs(event: Event) -> tuple[dict[str, Any], str | None]:
    """What a matched Event gives the nodes after the wait, and why its payload was withheld (or None).

    The outputs are the Event's identity and its payload.  Publication
    bounds a payload (:meth:`Event.build`), but an Event stored before it
    was may hold anything a store kept: a long payload is carried as
    before, and one nested deeper than :data:`MAX_PAYLOAD_DEPTH` is not.
    Carried into the attempt, every later read of the execution's evidence
    would have to follow it, and near the recursion limit a worker could
    not, so it failed on every visit.  Its waiter still wakes; the outputs
    hold the Event's identity only, and the reason is recorded on the
    attempt, so that a node reading a member of it finds a missing binding
    (an explicit review), never a crash.  The answer is the same on every
    store: a database does not decode such a payload (``payload_withheld``)
    and the in-memory store's is measured here.
    """
    withheld = event.payload_withheld
    if withheld is None and payload_nests_deeper(event.payload):
        withheld = WITHHELD_DEEP
    if withheld is not None:
        return {"event_id": event.event_id}, withheld
    return {"event_id": event.event_id, **dict(event.payload)}, None


def matches(spec: WaitSpec, business_id: str, event: Event) -> bool:
    """Whether ``event`` matches a waiter of ``business_id`` registered with ``spec``, exactly."""
    if spec.event_type is None or event.event_type != spec.event_type or event.business_id != business_id:
        return False
    values = dict(event.correlation)
    return all(values.get(name) == value for name, value in spec.correlation)


def projection(spec: WaitSpec, event: Event) -> tuple[tuple[str, str], ...]:
    """The event's values on exactly the waiter's names: what the wake request carries."""
    values = dict(event.correlation)
    return tuple((name, values[name]) for name, _ in spec.correlation if name in values)


__all__ = [
    "MAX_CORRELATION",
    "MAX_PAYLOAD_DEPTH",
    "MAX_PAYLOAD_JSON",
    "MAX_VALUE_LENGTH",
    "RESERVED_EVENT_TYPE_PREFIX",
    "WITHHELD_DEEP",
    "Event",
    "EventError",
    "checked_payload",
    "correlation_value",
    "json_problem",
    "matches",
    "payload_bound_problem",
    "payload_nests_deeper",
    "projection",
    "wake_outputs",
]
