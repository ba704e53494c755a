"""Machine specifications: the language-neutral form of a transition table.

Rules of this module:

- A :class:`MachineSpec` is plain data (strings only), the shape other
  implementations read from ``specs/machines/*.toml``.  Typed enums live in
  ``machines.py``; this module knows nothing about any particular machine.
- :func:`parse_machine_spec` takes *text*, never a path: the kernel does no
  I/O, so whoever reads the file passes its contents and its name.
- Every spec is validated when it is built, whichever way it is built
  (literal data in ``machines.py`` or parsed TOML), in the manner of
  python-statemachine's factory: well-formed fields, unique
  ``(source, event)`` pairs, every state reachable from an initial one,
  terminal states absorbing, and every state that is neither terminal nor a
  review state able to reach a terminal one.  A spec that fails any rule
  raises :class:`InvalidSpec` naming the file and the transition or field.
- :func:`render_machine_spec` is the one TOML writer.  Its output is
  byte-stable, so the committed files can be compared with it exactly.
"""

from __future__ import annotations

import tomllib
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .common import shown
from .errors import InvalidSpec

_TOP_FIELDS = ("name", "source", "states", "initial", "terminal", "review", "transitions")
_TRANSITION_FIELDS = ("event", "source", "target", "cite", "derived", "rationale")


@attrs.frozen
class TransitionSpec:
    """One row of a machine table: ``event`` moves ``source`` to ``target``."""

    event: str
    source: str
    target: str
    cite: str
    derived: bool = False
    rationale: str | None = None

    def describe(self) -> str:
        """The transition as one line, ``event: source -> target``, for messages."""
        return _describe(self.event, self.source, self.target)


def _describe(event: object, source: object, target: object) -> str:
    # Names are shown escaped so that an error message stays one line even
    # when a malformed spec puts a newline in a name.
    return f"{_show(event)}: {_show(source)} -> {_show(target)}"


def _show(value: object) -> str:
    text = str(value)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


@attrs.frozen
class MachineSpec:
    """A whole machine: its states, its special state sets and its table.

    Construct it with :func:`build_machine_spec` (or :func:`parse_machine_spec`)
    so that it is validated; the constructor alone does not validate, which
    lets tests build deliberately broken specs.
    """

    name: str
    source: str
    states: tuple[str, ...]
    initial: tuple[str, ...]
    terminal: tuple[str, ...]
    review: tuple[str, ...]
    transitions: tuple[TransitionSpec, ...]

    @property
    def events(self) -> tuple[str, ...]:
        """Every event the table names, in order of first appearance."""
        return tuple(dict.fromkeys(t.event for t in self.transitions))

    def table(self) -> dict[tuple[str, str], str]:
        """``(source, event) -> target``; assumes the spec is validated."""
        return {(t.source, t.event): t.target for t in self.transitions}


def build_machine_spec(spec: MachineSpec, filename: str) -> MachineSpec:
    """Validate ``spec`` and return it unchanged, or raise :class:`InvalidSpec`."""
    _validate(spec, filename)
    return spec


# --- validation -------------------------------------------------------------


def _validate(spec: MachineSpec, filename: str) -> None:
    def fail(problem: str) -> None:
        raise InvalidSpec(filename, problem)

    if not spec.name:
        fail("field 'name' must be a non-empty string")
    if not spec.source:
        fail("field 'source' must cite the seed file and section")
    if not spec.states:
        fail("field 'states' must list at least one state")
    known = set(spec.states)
    if any(not state for state in spec.states):
        fail("field 'states' must not contain an empty state name")
    if len(known) != len(spec.states):
        fail(f"field 'states' lists a state twice: {_first_duplicate(spec.states)!r}")
    for field, values in (
        ("initial", spec.initial),
        ("terminal", spec.terminal),
        ("review", spec.review),
    ):
        for value in values:
            if value not in known:
                fail(f"field {shown(field)} names unknown state {shown(value)}")
        if len(set(values)) != len(values):
            fail(f"field {field!r} lists a state twice: {_first_duplicate(values)!r}")
    if not spec.initial:
        fail("field 'initial' must list at least one state")
    both = set(spec.terminal) & set(spec.review)
    if both:
        fail(f"state {sorted(both)[0]!r} cannot be both terminal and review")

    seen: dict[tuple[str, str], TransitionSpec] = {}
    for number, t in enumerate(spec.transitions, start=1):
        where = f"transition #{number} ({t.describe()})"
        if not t.event:
            fail(f"{where}: field 'event' must be a non-empty string")
        for field, value in (("source", t.source), ("target", t.target)):
            if value not in known:
                fail(f"{where}: field {shown(field)} names unknown state {shown(value)}")
        if not t.cite:
            fail(f"{where}: field 'cite' must quote the seed it comes from")
        if t.derived and not t.rationale:
            fail(f"{where}: a derived transition needs a 'rationale'")
        if not t.derived and t.rationale is not None:
            fail(f"{where}: 'rationale' belongs only to derived transitions")
        key = (t.source, t.event)
        if key in seen:
            fail(
                f"{where}: duplicate (source, event) pair, already given by "
                f"({seen[key].describe()})"
            )
        seen[key] = t

    for number, t in enumerate(spec.transitions, start=1):
        if t.source in spec.terminal:
            fail(f"transition #{number} ({t.describe()}) leaves terminal state {t.source!r}")

    successors: dict[str, set[str]] = {s: set() for s in spec.states}
    for t in spec.transitions:
        successors[t.source].add(t.target)
    reachable = _closure(spec.initial, successors)
    for state in spec.states:
        if state not in reachable:
            fail(f"state {state!r} is not reachable from an initial state")
    terminal = set(spec.terminal)
    for state in spec.states:
        if state in terminal or state in spec.review:
            continue
        if not _closure((state,), successors) & terminal:
            fail(f"state {state!r} cannot reach a terminal state")


def _closure(start: Sequence[str], successors: Mapping[str, set[str]]) -> set[str]:
    seen = set(start)
    queue = deque(start)
    while queue:
        for nxt in successors[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _first_duplicate(values: Sequence[str]) -> str:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            return value
        seen.add(value)
    raise AssertionError("no duplicate")  # pragma: no cover - callers checked


# --- TOML -------------------------------------------------------------------


def parse_machine_spec(text: str, filename: str) -> MachineSpec:
    """Parse and validate the TOML text of a machine spec read from ``filename``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSpec(filename, f"not valid TOML: {exc}") from None
    _refuse_unknown(doc, _TOP_FIELDS, filename, "top level")
    raw_transitions = doc.get("transitions", [])
    if not isinstance(raw_transitions, list):
        raise InvalidSpec(filename, "field 'transitions' must be an array of tables")
    transitions = []
    for number, raw in enumerate(raw_transitions, start=1):
        transitions.append(_parse_transition(raw, number, filename))
    spec = MachineSpec(
        name=_string(doc, "name", filename, "top level"),
        source=_string(doc, "source", filename, "top level"),
        states=_strings(doc, "states", filename),
        initial=_strings(doc, "initial", filename),
        terminal=_strings(doc, "terminal", filename),
        review=_strings(doc, "review", filename),
        transitions=tuple(transitions),
    )
    return build_machine_spec(spec, filename)


def _parse_transition(raw: Any, number: int, filename: str) -> TransitionSpec:
    if not isinstance(raw, dict):
        raise InvalidSpec(filename, f"transition #{number} must be a table")
    where = f"transition #{number} ({_describe(raw.get('event', '?'), raw.get('source', '?'), raw.get('target', '?'))})"
    _refuse_unknown(raw, _TRANSITION_FIELDS, filename, where)
    if "derived" not in raw:
        raise InvalidSpec(filename, f"{where}: missing field 'derived'")
    derived = raw.get("derived")
    if not isinstance(derived, bool):
        raise InvalidSpec(filename, f"{where}: field 'derived' must be true or false")
    rationale = raw.get("rationale")
    if rationale is not None and not isinstance(rationale, str):
        raise InvalidSpec(filename, f"{where}: field 'rationale' must be a string")
    return TransitionSpec(
        event=_string(raw, "event", filename, where),
        source=_string(raw, "source", filename, where),
        target=_string(raw, "target", filename, where),
        cite=_string(raw, "cite", filename, where),
        derived=derived,
        rationale=rationale,
    )


def _refuse_unknown(doc: Mapping[str, Any], allowed: Sequence[str], filename: str, where: str) -> None:
    for key in doc:
        if key not in allowed:
            raise InvalidSpec(filename, f"{where}: unknown field {key!r}")


def _string(doc: Mapping[str, Any], field: str, filename: str, where: str) -> str:
    if field not in doc:
        raise InvalidSpec(filename, f"{where}: missing field {field!r}")
    value = doc[field]
    if not isinstance(value, str):
        raise InvalidSpec(filename, f"{where}: field {field!r} must be a string")
    return value


def _strings(doc: Mapping[str, Any], field: str, filename: str) -> tuple[str, ...]:
    if field not in doc:
        raise InvalidSpec(filename, f"top level: missing field {field!r}")
    value = doc[field]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidSpec(filename, f"top level: field {field!r} must be an array of strings")
    return tuple(value)


def render_machine_spec(spec: MachineSpec) -> str:
    """The canonical TOML text of ``spec`` (what ``specs/machines/`` commits)."""
    lines = [
        f"name = {_quote(spec.name)}",
        f"source = {_quote(spec.source)}",
        f"states = {_quote_list(spec.states)}",
        f"initial = {_quote_list(spec.initial)}",
        f"terminal = {_quote_list(spec.terminal)}",
        f"review = {_quote_list(spec.review)}",
    ]
    for t in spec.transitions:
        lines += [
            "",
            "[[transitions]]",
            f"event = {_quote(t.event)}",
            f"source = {_quote(t.source)}",
            f"target = {_quote(t.target)}",
            f"cite = {_quote(t.cite)}",
            f"derived = {'true' if t.derived else 'false'}",
        ]
        if t.rationale is not None:
            lines.append(f"rationale = {_quote(t.rationale)}")
    return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    """``value`` as one TOML basic string that reads back as exactly ``value``.

    post: __return__.startswith('"') and __return__.endswith('"') and len(__return__) >= 2
    post: chr(10) not in __return__ and chr(13) not in __return__
    post: tomllib.loads("k = " + __return__)["k"] == value
    """
    # A TOML basic string: escape the backslash, the quote and every control
    # character (TOML forbids them raw); everything else is written as UTF-8.
    out = ['"']
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _quote_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


__all__ = [
    "MachineSpec",
    "TransitionSpec",
    "build_machine_spec",
    "parse_machine_spec",
    "render_machine_spec",
]
