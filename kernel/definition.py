"""Workflow Definitions: the validated graph of nodes an execution interprets.

The workflow execution contract (seed 000: Purpose and Invariants; Node Semantics;
Dispatcher Pass) says what a definition is for: an execution pins one
definition and one exact revision, and interprets it node by node through
exactly five kinds -- condition, wait_for_event, request_approval,
local_command and end.  ``specs/definitions.md`` is the language-neutral
statement of the format; ``specs/definition.schema.json`` describes its JSON
form.

Rules of this module:

- A :class:`Definition` is a value: frozen, compared field by field, and
  written by one canonical writer (:func:`to_json`) whose SHA-256 is its
  :func:`digest`.  The TOML form people write and the JSON form stores keep
  are the same structure and are read by the same validator.
- Parsing takes text, never a path: the kernel does no I/O, so whoever reads
  the file passes its contents and its name (the ``source`` every error
  names).
- Everything is checked when a definition is read, so that an execution
  never discovers a broken graph halfway through a run: every field is
  known, typed and bounded; every continuation names a node; every node is
  reachable from ``start``; no cycle consists of condition nodes alone (it
  could never wait, act or end); every value read at run time is a declared
  binding; every condition expression parses and reads only its declared
  bindings.  A refusal is a :class:`DefinitionError` naming the source, the
  node and the field.  The checks run in one fixed order (the fields of a
  table, the nodes in file order, then the graph), so a broken definition
  is always refused with the same message.
- Lenient decoding (``from_json(..., strict=False)``) exists for one reason:
  a stored definition written by newer code, with a node kind this code does
  not know, must still load, so that the interpreter can suspend the
  execution at that node with an inspectable reason (seed 000: "Unsupported
  kinds or continuations are refused into an inspectable suspended state")
  instead of crashing.  It keeps unknown kinds (as :class:`UnsupportedNode`)
  and dangling continuations; it checks everything else.
- Revisions are immutable.  A registered definition revision never changes,
  and neither does a node revision: a node whose content changes gets a new
  revision (:func:`check_registration`).  An execution resolves a node as
  execution -> pinned definition revision -> exact node binding -> exact
  node revision, so the "current" version of a node is never consulted.
- No floats anywhere: a definition is exact data (TOML floats are refused
  with a message saying so), and every integer stays within +-(2**53 - 1) so
  every JSON reader holds it exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import date, datetime, time, timedelta
from types import MappingProxyType, UnionType
from typing import ClassVar, Final, NoReturn, TypeAlias

import attrs

from . import strict_json
from .common import shown
from .errors import KernelError
from .expr import KEYWORDS, Expr, ExpressionError, names, parse

SUPPORTED_KINDS: Final = ("condition", "wait_for_event", "request_approval", "local_command", "end")
"""Seed 000, Purpose and Invariants: 'The supported node kinds are exactly ...'."""

OUTCOMES: Final = ("succeeded", "failed")
"""The outcomes of an end node (seed 000, Node Semantics, ``end``: succeeded or a terminal failure)."""

MAX_NODES: Final = 200
MAX_INPUTS: Final = 64
MAX_BINDINGS: Final = 64
MAX_TARGETS: Final = 16
MAX_POLICIES: Final = 16
MAX_REVIEWERS: Final = 64
MAX_CORRELATION: Final = 16
MAX_PAYLOAD: Final = 64
MAX_TEXT: Final = 256
"""The longest title, object id literal, or string literal in a payload or correlation."""
MAX_INPUT_TEXT: Final = 4096
"""The longest string an admission input may be (and the bound on an input type's length keywords)."""
MAX_INPUT_JSON: Final = 65_536
"""The longest an object or array input may be, as compact JSON text."""
MAX_INPUT_DEPTH: Final = 32
"""How deeply an object or array input may nest."""
MAX_ENUM: Final = 64
INPUT_TYPES: Final = ("string", "integer", "number", "boolean", "object", "array")
"""The JSON Schema types an input may declare (specs/definitions.md, Typed inputs)."""
MAX_INTEGER: Final = 2**53 - 1
"""Integers beyond this lose precision in JSON readers that hold numbers as doubles."""
MAX_TIMEOUT: Final = timedelta(days=366)

IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}")
"""Definition ids, operation ids, event types, policy ids, reviewer ids and error codes."""
NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""Node ids, input names, binding fields, payload and correlation keys: no dots, so a dotted
binding name ``<node id>.<field>`` always splits in one way."""

INPUT: Final = "input"
"""The prefix of admission inputs in binding names (``input.amount``); no node may be called this."""


# --- the data model -----------------------------------------------------------------


@attrs.frozen
class Ref:
    """A value read at run time from a declared binding: ``input.<input>`` or ``<node id>.<field>``."""

    name: str


Scalar: TypeAlias = str | int | bool
Operand: TypeAlias = Scalar | Ref


def _typed(value: Operand) -> tuple[str, Operand]:
    # Python says True == 1, a definition does not: `true` and `1` are
    # different payloads, with different canonical JSON.  Operands are
    # compared (and hashed) together with their type.
    return (type(value).__name__, value)


def _typed_pairs(pairs: tuple[tuple[str, Operand], ...]) -> tuple[tuple[str, tuple[str, Operand]], ...]:
    return tuple((key, _typed(value)) for key, value in pairs)


@attrs.frozen
class Timeout:
    """An explicit one-time timeout (seed 000: 'No implicit timeout is applied').

    When it fires the execution continues at ``next``, recorded as a distinct
    wake reason, never as a matching event or a determination.
    """

    after: timedelta
    next: str


@attrs.frozen
class Target:
    """An exact target object and the revision the node expects it to be at."""

    object_id: Operand = attrs.field(eq=_typed)
    revision: Operand = attrs.field(eq=_typed)


@attrs.frozen
class PolicyRef:
    """An applicable policy, pinned to an exact revision."""

    policy_id: str
    revision: int


@attrs.frozen
class ConditionNode:
    """Evaluate ``expression`` over the declared ``bindings``; true -> ``true_next``, false -> ``false_next``.

    An unknown result is not false: the interpreter suspends (seed 000, Node
    Semantics, ``condition``).
    """

    node_id: str
    revision: int
    expression: str
    bindings: tuple[str, ...]
    true_next: str
    false_next: str
    # Parsed once when the definition is read; the source text is what is
    # compared, hashed and stored.
    ast: Expr = attrs.field(eq=False, repr=False)
    kind: ClassVar[str] = "condition"


@attrs.frozen
class WaitForEventNode:
    """Wait for one committed event of ``event_type`` matching every correlation predicate exactly."""

    node_id: str
    revision: int
    event_type: str
    correlation: tuple[tuple[str, Operand], ...] = attrs.field(eq=_typed_pairs)
    next: str
    timeout: Timeout | None = None
    kind: ClassVar[str] = "wait_for_event"


@attrs.frozen
class RequestApprovalNode:
    """Ask a reviewer in ``reviewers`` for one approved or rejected determination on exact targets."""

    node_id: str
    revision: int
    operation: str
    targets: tuple[Target, ...]
    policies: tuple[PolicyRef, ...]
    reviewers: tuple[str, ...]
    approved_next: str
    rejected_next: str
    distinct_reviewer: bool = True
    timeout: Timeout | None = None
    kind: ClassVar[str] = "request_approval"


@attrs.frozen
class LocalCommandNode:
    """Submit one command; settled -> ``next``, deterministic rejection -> ``on_failure``.

    An unresolved result is neither: it is reconciliation_required (seed 000,
    Node Semantics, ``local_command``).
    """

    node_id: str
    revision: int
    operation: str
    targets: tuple[Target, ...]
    payload: tuple[tuple[str, Operand], ...] = attrs.field(eq=_typed_pairs)
    next: str
    on_failure: str
    kind: ClassVar[str] = "local_command"


@attrs.frozen
class EndNode:
    """End the execution as ``succeeded``, or ``failed`` with ``error_code``."""

    node_id: str
    revision: int
    outcome: str
    error_code: str | None = None
    kind: ClassVar[str] = "end"


@attrs.frozen
class UnsupportedNode:
    """A node of a kind this code does not know, kept by lenient decoding of a stored definition."""

    node_id: str
    revision: int
    kind_name: str
    kind: ClassVar[str] = "unsupported"


Node: TypeAlias = ConditionNode | WaitForEventNode | RequestApprovalNode | LocalCommandNode | EndNode | UnsupportedNode


def continuations(node: Node) -> tuple[tuple[str, str], ...]:
    """Every continuation ``node`` declares, as ``(field, node id)`` in field order.

    ``timeout.next`` is included; an end node and an unsupported node declare none.
    """
    match node:
        case ConditionNode():
            return (("true_next", node.true_next), ("false_next", node.false_next))
        case WaitForEventNode():
            return (("next", node.next), *_timeout_continuation(node.timeout))
        case RequestApprovalNode():
            return (
                ("approved_next", node.approved_next),
                ("rejected_next", node.rejected_next),
                *_timeout_continuation(node.timeout),
            )
        case LocalCommandNode():
            return (("next", node.next), ("on_failure", node.on_failure))
        case EndNode() | UnsupportedNode():
            return ()


def _timeout_continuation(timeout: Timeout | None) -> tuple[tuple[str, str], ...]:
    return () if timeout is None else (("timeout.next", timeout.next),)


def reads(node: Node) -> tuple[tuple[str, str], ...]:
    """Every binding name ``node`` may read at run time, as ``(field, name)`` in field order.

    For a condition these are its declared ``bindings`` (field ``bindings``);
    for the other kinds, every :class:`Ref` among their operands (fields such
    as ``targets[0].revision`` or ``payload.amount``).
    """
    match node:
        case ConditionNode():
            return tuple(("bindings", name) for name in node.bindings)
        case WaitForEventNode():
            return tuple((f"correlation.{key}", v.name) for key, v in node.correlation if isinstance(v, Ref))
        case RequestApprovalNode():
            return _target_reads(node.targets)
        case LocalCommandNode():
            return _target_reads(node.targets) + tuple(
                (f"payload.{key}", v.name) for key, v in node.payload if isinstance(v, Ref)
            )
        case EndNode() | UnsupportedNode():
            return ()


def _target_reads(targets: tuple[Target, ...]) -> tuple[tuple[str, str], ...]:
    found = []
    for number, target in enumerate(targets):
        for part, value in (("id", target.object_id), ("revision", target.revision)):
            if isinstance(value, Ref):
                found.append((f"targets[{number}].{part}", value.name))
    return tuple(found)


@attrs.frozen
class InputType:
    """The type an input declares: a subset of JSON Schema, checked at admission.

    ``required`` is said of the input itself (JSON Schema says it in a list on
    the enclosing object; :func:`input_schema` writes it there).  The
    keywords that apply depend on ``type``: ``minimum``/``maximum`` on
    integer and number, ``min_length``/``max_length`` on string, ``enum`` on
    the scalar types.
    """

    name: str
    type: str
    required: bool = True
    description: str = ""
    enum: tuple[Scalar, ...] | None = attrs.field(default=None, eq=lambda v: None if v is None else tuple(map(_typed, v)))
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not an admissible value of this input, or None (the message follows the field name)."""
        found = _type_problem(self.type, value)
        if found is not None:
            return found
        if isinstance(value, str):
            if self.min_length is not None and len(value) < self.min_length:
                return f"is {len(value)} characters long; at least {self.min_length} are required"
            most = MAX_INPUT_TEXT if self.max_length is None else self.max_length
            if len(value) > most:
                return f"is {len(value)} characters long; at most {most} are allowed"
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                return f"{shown(value)} is below the minimum {self.minimum}"
            if self.maximum is not None and value > self.maximum:
                return f"{shown(value)} is above the maximum {self.maximum}"
        if self.enum is not None and not any(_same_value(value, allowed) for allowed in self.enum):
            return f"{_spell(value)} is not one of {', '.join(_spell(v) for v in self.enum)}"
        return None


def _same_value(value: object, allowed: Scalar) -> bool:
    # JSON Schema equality: 2 and 2.0 are equal numbers, true is not 1.
    if isinstance(value, bool) or isinstance(allowed, bool):
        return isinstance(value, bool) and isinstance(allowed, bool) and value == allowed
    return value == allowed


def _spell(value: object) -> str:
    return json.dumps(value, ensure_ascii=True) if isinstance(value, str | bool | int | float) else type(value).__name__


_JSON_TYPE_NAMES: Final = {str: "string", bool: "boolean", int: "integer", float: "number", dict: "object", list: "array"}


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    for python_type, name in _JSON_TYPE_NAMES.items():
        if isinstance(value, python_type):
            return name
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def integer_text(value: int) -> str:
    """``value`` as a message shows it after "integer ": in full up to 39 digits, else by its length.

    ``str()`` of an integer longer than ``sys.get_int_max_str_digits()``
    (4300 digits by default) raises, and a refusal must not.
    """
    if value.bit_length() <= 128:
        return str(value)
    return f"of about {math.floor(value.bit_length() * math.log10(2)) + 1} digits"


def _type_problem(kind: str, value: object) -> str | None:
    """Whether ``value`` is of the JSON type ``kind``, stored whole (size, depth, text and numbers checked)."""
    found = _json_kind(value)
    if isinstance(value, float) and not math.isfinite(value):
        # Named as what it is, before the type: an infinity is no JSON number, with or without a fraction.
        return "must be a finite number"
    if kind == "number":
        if found not in ("integer", "number"):
            return f"must be a number, found {found}"
    elif kind == "integer" and found == "number":
        # JSON Schema counts 2.0 as an integer; a node reading it would not.
        return f"must be an integer, found {shown(value)} (write it without a fraction)"
    elif found != kind:
        return f"must be {_article(kind)}, found {found}"
    return _stored_problem(value, 0)


def _stored_problem(value: object, depth: int) -> str | None:
    """What in a JSON value cannot be kept exactly: a NaN, an integer too long to read back, a nesting too deep."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        return f"integer {integer_text(value)} is beyond +-{MAX_INTEGER}, which JSON readers cannot all hold exactly"
    if isinstance(value, Mapping | list | tuple):
        if depth >= MAX_INPUT_DEPTH:
            return f"nests deeper than {MAX_INPUT_DEPTH} levels"
        if isinstance(value, Mapping):
            # Through the Python API a key may be anything: JSON would rename 1 to "1" (or clash with a
            # "1" already there), and a tuple would fail inside the store's transaction.
            odd = [key for key in value if not isinstance(key, str)]
            if odd:
                return f"has a key of type {type(odd[0]).__name__}; every key of a JSON object is a string"
        items = value.values() if isinstance(value, Mapping) else value
        for item in items:
            found = _stored_problem(item, depth + 1)
            if found is not None:
                return found
        if depth == 0 and len(json.dumps(value, separators=(",", ":"), ensure_ascii=False)) > MAX_INPUT_JSON:
            return f"is longer than {MAX_INPUT_JSON} characters as JSON"
    elif not isinstance(value, str | int | float | bool):
        return f"is a {type(value).__name__}, which is not a JSON value"
    return None


def input_schema(definition: Definition) -> dict[str, object]:
    """The JSON Schema (draft 2020-12) of ``definition``'s admission input: what admission checks.

    Names-only inputs are required scalars: a string, a number or a boolean.
    """
    properties: dict[str, object] = {}
    required: list[str] = []
    if definition.input_types is None:
        for name in definition.inputs:
            properties[name] = {"type": ["string", "number", "boolean"]}
            required.append(name)
    else:
        for declared in definition.input_types:
            schema: dict[str, object] = {"type": declared.type}
            for keyword, value in (
                ("description", declared.description or None),
                ("enum", None if declared.enum is None else list(declared.enum)),
                ("minimum", declared.minimum),
                ("maximum", declared.maximum),
                ("minLength", declared.min_length),
                ("maxLength", declared.max_length),
            ):
                if value is not None:
                    schema[keyword] = value
            properties[declared.name] = schema
            if declared.required:
                required.append(declared.name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"input of {definition.definition_id} revision {definition.revision}",
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _index_nodes(definition: Definition) -> Mapping[str, Node]:
    return MappingProxyType({node.node_id: node for node in definition.nodes})


@attrs.frozen
class Definition:
    """One revision of a workflow definition.

    Build it with :func:`parse_definition`, :func:`definition_from_mapping` or
    :func:`from_json` so that it is validated; the constructor alone does not
    validate, which lets tests build deliberately broken definitions.
    """

    definition_id: str
    revision: int
    title: str
    start: str
    inputs: tuple[str, ...]
    """Every declared input name, sorted."""
    nodes: tuple[Node, ...]
    input_types: tuple[InputType, ...] | None = None
    """The declared types, in ``inputs`` order; None when the definition declares names only."""
    _index: Mapping[str, Node] = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_index_nodes, takes_self=True)
    )

    def node(self, node_id: str) -> Node | None:
        """The node called ``node_id``, or None (a dangling continuation of a leniently read definition)."""
        return self._index.get(node_id)

    def successors(self, node: Node) -> tuple[str, ...]:
        """Every continuation ``node`` declares, in field order (``timeout.next`` included)."""
        return tuple(target for _field, target in continuations(node))


RESERVED_EVENT_TYPE_PREFIX: Final = "fencekeeper."
"""Event Types the kernel's own waits use (an approval request waits on ``fencekeeper.approval``).

Only a reviewer's authorized Decision may wake such a wait (seed 000,
request_approval: 'An approval resolution must be an authorized governed
Decision'; 'Unauthorized ... decisions do not wake the execution'), so no
published Event may carry one of these types: it would match the wait's
exact type and predicate and wake it with no decision at all.  For the same
reason a definition's wait_for_event may not name one: no Event could ever
match it, and it would end only by its timeout."""


class DefinitionError(KernelError):
    """A definition that is malformed or fails validation, or may not be registered.

    The message is one line: ``source: node 'x': field 'y': problem``, without
    the node part or the field part when none is to blame.  ``position`` is
    the character offset in the expression when the expression failed to
    parse.
    """

    code = "invalid_definition"

    def __init__(
        self,
        source: str,
        problem: str,
        *,
        node_id: str | None = None,
        field: str | None = None,
        position: int | None = None,
    ) -> None:
        parts = [source]
        if node_id is not None:
            parts.append(f"node {shown(node_id)}")
        if field is not None:
            parts.append(f"field {shown(field)}")
        parts.append(problem)
        super().__init__(": ".join(parts))
        self.source = source
        self.node_id = node_id
        self.field = field
        self.problem = problem
        self.position = position


# --- the fields of each form ----------------------------------------------------------------

# The field lists of the TOML/JSON form, in the order the writer emits them
# (it sorts keys anyway).  specs/definition.schema.json lists the same names;
# tests/definitions keeps the two in agreement.
REQUIRED_FIELDS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "definition": ("id", "revision", "start", "nodes"),
        "condition": ("id", "kind", "revision", "expression", "bindings", "true_next", "false_next"),
        "wait_for_event": ("id", "kind", "revision", "event_type", "correlation", "next"),
        "request_approval": (
            "id",
            "kind",
            "revision",
            "operation",
            "targets",
            "reviewers",
            "approved_next",
            "rejected_next",
        ),
        "local_command": ("id", "kind", "revision", "operation", "next", "on_failure"),
        "end": ("id", "kind", "revision", "outcome"),
        "input": ("type",),
        "timeout": ("after_seconds", "next"),
        "target": ("id", "revision"),
        "policy": ("id", "revision"),
        "ref": ("from",),
    }
)
OPTIONAL_FIELDS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "definition": ("title", "inputs"),
        "input": ("description", "required", "enum", "minimum", "maximum", "minLength", "maxLength"),
        "condition": (),
        "wait_for_event": ("timeout",),
        "request_approval": ("policies", "distinct_reviewer", "timeout"),
        "local_command": ("targets", "payload"),
        "end": ("error_code",),
        "timeout": (),
        "target": (),
        "policy": (),
        "ref": (),
    }
)


# --- reading ----------------------------------------------------------------------------


def parse_definition(text: str, source: str = "<definition>") -> Definition:
    """Parse and validate the TOML text of a definition read from ``source``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)".
        raise DefinitionError(source, f"not valid TOML: {exc}") from None
    return definition_from_mapping(data, source)


def definition_from_mapping(data: Mapping[str, object], source: str = "<definition>") -> Definition:
    """Validate the TOML/JSON structure ``data`` (as :mod:`tomllib` or :mod:`json` returns it)."""
    return _Reader(source, strict=True).definition(data)


def from_json(text: str, *, strict: bool = True, source: str = "<stored definition>") -> Definition:
    """Read the JSON form; with ``strict=False`` keep unknown kinds and dangling continuations."""
    try:
        data = strict_json.loads(text)
    except json.JSONDecodeError as exc:
        raise DefinitionError(source, f"not valid JSON: {exc}") from None
    except strict_json.StrictJsonError as exc:
        raise DefinitionError(source, f"not valid JSON: {exc}") from None
    return _Reader(source, strict=strict).definition(data)


def _kind_of(value: object) -> str:
    """The TOML/JSON type of ``value``, as error messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return f"float {shown(value)} (floats are not allowed in definitions; use an integer or a string)"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    # datetime before date: every datetime is a date.
    if isinstance(value, datetime):
        return "datetime"
    if isinstance(value, date):
        return "date"
    if isinstance(value, time):
        return "time"
    return type(value).__name__


def _unpaired_surrogate(text: str) -> str | None:
    # Only JSON can carry one ("\ud800"); it is not a character, and the
    # canonical writer could not encode it as UTF-8.
    for ch in text:
        if 0xD800 <= ord(ch) <= 0xDFFF:
            return f"U+{ord(ch):04X}"
    return None


def _names(values: Sequence[str] | Mapping[str, object]) -> str:
    return ", ".join(repr(v) for v in values)


class _Reader:
    """One validation of one definition; every method raises the first problem it finds."""

    def __init__(self, source: str, *, strict: bool) -> None:
        self.source = source
        self.strict = strict

    def fail(self, problem: str, *, node_id: str | None = None, field: str | None = None) -> NoReturn:
        raise DefinitionError(self.source, problem, node_id=node_id, field=field)

    # --- top level ---

    def definition(self, data: object) -> Definition:
        if not isinstance(data, Mapping):
            self.fail(f"a definition must be a table (a JSON object), found {_kind_of(data)}")
        self.fields(data, "definition", node_id=None, where="top-level", prefix="")
        definition_id = self.identifier(data["id"], "id", None, "definition id")
        revision = self.revision(data["revision"], "revision", None)
        title = self.text(data.get("title", ""), "title", None, allow_empty=True)
        inputs, input_types = self.inputs(data.get("inputs", []))
        start = self.node_name(data["start"], "start", None)
        nodes = self.nodes(data["nodes"])
        definition = Definition(
            definition_id=definition_id,
            revision=revision,
            title=title,
            start=start,
            inputs=inputs,
            nodes=nodes,
            input_types=input_types,
        )
        self.graph(definition)
        return definition

    def fields(self, data: Mapping[str, object], kind: str, *, node_id: str | None, where: str, prefix: str) -> None:
        """Refuse unknown and missing fields of one table, naming them."""
        allowed = REQUIRED_FIELDS[kind] + OPTIONAL_FIELDS[kind]
        unknown = [key for key in data if key not in allowed]
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            self.fail(
                f"unknown {where} field{plural} {_names(unknown)}; allowed: {', '.join(allowed)}",
                node_id=node_id,
                field=prefix + str(unknown[0]),
            )
        missing = [key for key in REQUIRED_FIELDS[kind] if key not in data]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            self.fail(
                f"missing required {where} field{plural} {_names(missing)}",
                node_id=node_id,
                field=prefix + missing[0],
            )

    # --- scalars ---

    def expect(
        self, value: object, wanted: type | UnionType, field: str, node_id: str | None, described: str
    ) -> None:
        # bool is an int in Python, never in a definition.
        if isinstance(value, bool) and wanted is int:
            self.fail(f"must be {described}, found boolean", node_id=node_id, field=field)
        if not isinstance(value, wanted):
            self.fail(f"must be {described}, found {_kind_of(value)}", node_id=node_id, field=field)

    def integer(self, value: object, field: str, node_id: str | None, minimum: int, maximum: int) -> int:
        self.expect(value, int, field, node_id, "an integer")
        assert isinstance(value, int)
        if not minimum <= value <= maximum:
            self.fail(f"must be between {minimum} and {maximum}, found {value}", node_id=node_id, field=field)
        return value

    def revision(self, value: object, field: str, node_id: str | None) -> int:
        return self.integer(value, field, node_id, 1, MAX_INTEGER)

    def string(self, value: object, field: str, node_id: str | None) -> str:
        self.expect(value, str, field, node_id, "a string")
        assert isinstance(value, str)
        return value

    def identifier(self, value: object, field: str, node_id: str | None, what: str) -> str:
        text = self.string(value, field, node_id)
        if not IDENTIFIER.fullmatch(text):
            self.fail(
                f"{shown(text)} is not a valid {what} (1 to 128 of A-Z a-z 0-9 . _ : @ / -, "
                "starting with a letter or digit)",
                node_id=node_id,
                field=field,
            )
        return text

    def event_type(self, value: object, node_id: str) -> str:
        text = self.identifier(value, "event_type", node_id, "event type")
        # Strict only: a stored revision registered before this rule still loads, and its wait still
        # ends by its timeout as it always could.
        if self.strict and text.startswith(RESERVED_EVENT_TYPE_PREFIX):
            self.fail(
                f"{shown(text)} is reserved: event types beginning {RESERVED_EVENT_TYPE_PREFIX!r} are the kernel's "
                "own waits', which no published Event may carry, so this wait could never be woken",
                node_id=node_id,
                field="event_type",
            )
        return text

    def node_name(self, value: object, field: str, node_id: str | None, what: str = "node id") -> str:
        text = self.string(value, field, node_id)
        if not NAME.fullmatch(text):
            self.fail(
                f"{shown(text)} is not a valid {what} (1 to 64 of a-z 0-9 _, starting with a letter)",
                node_id=node_id,
                field=field,
            )
        return text

    def text(self, value: object, field: str, node_id: str | None, *, allow_empty: bool) -> str:
        text = self.string(value, field, node_id)
        if not allow_empty and not text:
            self.fail("must not be empty", node_id=node_id, field=field)
        if len(text) > MAX_TEXT:
            self.fail(f"is {len(text)} characters long; at most {MAX_TEXT} are allowed", node_id=node_id, field=field)
        surrogate = _unpaired_surrogate(text)
        if surrogate is not None:
            self.fail(f"contains an unpaired surrogate ({surrogate}), which is not a character", node_id=node_id, field=field)
        return text

    def boolean(self, value: object, field: str, node_id: str | None) -> bool:
        self.expect(value, bool, field, node_id, "true or false")
        assert isinstance(value, bool)
        return value

    def array(self, value: object, field: str, node_id: str | None, minimum: int, maximum: int) -> Sequence[object]:
        # A tuple is an array too, for callers that build the structure in code.
        self.expect(value, list | tuple, field, node_id, "an array")
        assert isinstance(value, list | tuple)
        if not minimum <= len(value) <= maximum:
            self.fail(
                f"must list {_between(minimum, maximum)} entries, found {len(value)}", node_id=node_id, field=field
            )
        return value

    def table(self, value: object, field: str, node_id: str | None) -> Mapping[str, object]:
        self.expect(value, Mapping, field, node_id, "a table")
        assert isinstance(value, Mapping)
        return value

    def names_list(
        self,
        value: object,
        field: str,
        node_id: str | None,
        what: str,
        maximum: int,
        *,
        minimum: int = 0,
        check: Callable[[object, str, str | None, str], str] | None = None,
    ) -> tuple[str, ...]:
        """A list of unique names, returned sorted (the order written carries no meaning)."""
        items = self.array(value, field, node_id, minimum, maximum)
        read = check or self.node_name
        seen: set[str] = set()
        for number, item in enumerate(items):
            name = read(item, f"{field}[{number}]", node_id, what)
            if name in seen:
                self.fail(f"lists {what} {shown(name)} twice", node_id=node_id, field=field)
            seen.add(name)
        return tuple(sorted(seen))

    def binding_name(self, value: object, field: str, node_id: str | None, what: str = "binding name") -> str:
        text = self.string(value, field, node_id)
        head, dot, tail = text.partition(".")
        if not (dot and NAME.fullmatch(head) and NAME.fullmatch(tail)):
            self.fail(
                f"{shown(text)} is not a valid {what} ('input.<input name>' or '<node id>.<field>')",
                node_id=node_id,
                field=field,
            )
        reserved = [part for part in (head, tail) if part in KEYWORDS]
        if reserved:
            # A condition could never read it: the expression language reserves the word.
            self.fail(
                f"{shown(text)} uses the reserved word {shown(reserved[0])} (reserved: {', '.join(sorted(KEYWORDS))})",
                node_id=node_id,
                field=field,
            )
        return text

    def operand(self, value: object, field: str, node_id: str | None) -> Operand:
        if isinstance(value, Mapping):
            self.fields(value, "ref", node_id=node_id, where="reference", prefix=f"{field}.")
            return Ref(self.binding_name(value["from"], f"{field}.from", node_id))
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return self.integer(value, field, node_id, -MAX_INTEGER, MAX_INTEGER)
        if isinstance(value, str):
            return self.text(value, field, node_id, allow_empty=True)
        self.fail(
            f"must be a string, an integer, a boolean or {{ from = \"<binding>\" }}, found {_kind_of(value)}",
            node_id=node_id,
            field=field,
        )

    def keyed_operands(
        self, value: object, field: str, node_id: str, minimum: int, maximum: int
    ) -> tuple[tuple[str, Operand], ...]:
        data = self.table(value, field, node_id)
        if not minimum <= len(data) <= maximum:
            self.fail(f"must have {_between(minimum, maximum)} entries, found {len(data)}", node_id=node_id, field=field)
        entries = []
        for key, item in data.items():
            name = self.node_name(key, field, node_id, "key")
            entries.append((name, self.operand(item, f"{field}.{name}", node_id)))
        return tuple(sorted(entries, key=lambda entry: entry[0]))

    # --- inputs ---

    def inputs(self, value: object) -> tuple[tuple[str, ...], tuple[InputType, ...] | None]:
        """Names only (an array: each a required scalar), or a table of name -> type."""
        if not isinstance(value, Mapping):
            if not isinstance(value, list | tuple):
                self.fail(
                    f"must be an array of input names or a table of input name -> type, found {_kind_of(value)}",
                    field="inputs",
                )
            return self.names_list(value, "inputs", None, "input name", MAX_INPUTS), None
        if len(value) > MAX_INPUTS:
            self.fail(f"must have at most {MAX_INPUTS} entries, found {len(value)}", field="inputs")
        types = []
        for name, declared in value.items():
            self.node_name(name, "inputs", None, "input name")
            types.append(self.input_type(name, declared))
        types.sort(key=lambda t: t.name)
        return tuple(t.name for t in types), tuple(types)

    def input_type(self, name: str, value: object) -> InputType:
        field = f"inputs.{name}"
        data = self.table(value, field, None)
        self.fields(data, "input", node_id=None, where="input", prefix=f"{field}.")
        kind = self.string(data["type"], f"{field}.type", None)
        if kind not in INPUT_TYPES:
            self.fail(f"{shown(kind)} is not an input type; the types are {', '.join(INPUT_TYPES)}", field=f"{field}.type")
        applies = {
            "minimum": ("integer", "number"),
            "maximum": ("integer", "number"),
            "minLength": ("string",),
            "maxLength": ("string",),
            "enum": ("string", "integer", "number", "boolean"),
        }
        for keyword, types in applies.items():
            if keyword in data and kind not in types:
                self.fail(
                    f"applies to {' and '.join(types)} inputs, not to {_article(kind)} input", field=f"{field}.{keyword}"
                )
        bounds = {
            keyword: self.integer(data[keyword], f"{field}.{keyword}", None, -MAX_INTEGER, MAX_INTEGER)
            if keyword in ("minimum", "maximum")
            else self.integer(data[keyword], f"{field}.{keyword}", None, 0, MAX_INPUT_TEXT)
            for keyword in ("minimum", "maximum", "minLength", "maxLength")
            if keyword in data
        }
        for low, high in (("minimum", "maximum"), ("minLength", "maxLength")):
            if low in bounds and high in bounds and bounds[low] > bounds[high]:
                self.fail(f"is {bounds[high]}, below {low} {bounds[low]}", field=f"{field}.{high}")
        declared = InputType(
            name=name,
            type=kind,
            required=self.boolean(data.get("required", True), f"{field}.required", None),
            description=self.text(data.get("description", ""), f"{field}.description", None, allow_empty=True),
            minimum=bounds.get("minimum"),
            maximum=bounds.get("maximum"),
            min_length=bounds.get("minLength"),
            max_length=bounds.get("maxLength"),
        )
        if "enum" not in data:
            return declared
        items = self.array(data["enum"], f"{field}.enum", None, 1, MAX_ENUM)
        values: list[Scalar] = []
        for number, item in enumerate(items):
            where = f"{field}.enum[{number}]"
            if isinstance(item, Mapping):
                self.fail("must be a literal value, not a reference", field=where)
            literal = self.operand(item, where, None)
            assert not isinstance(literal, Ref)
            problem = declared.problem(literal)
            if problem is not None:
                self.fail(f"{problem}, so it could never be admitted", field=where)
            if any(_typed(literal) == _typed(earlier) for earlier in values):
                self.fail(f"lists {_spell(literal)} twice", field=f"{field}.enum")
            values.append(literal)
        return attrs.evolve(declared, enum=tuple(values))

    # --- structured values ---

    def timeout(self, value: object, node_id: str) -> Timeout:
        data = self.table(value, "timeout", node_id)
        self.fields(data, "timeout", node_id=node_id, where="timeout", prefix="timeout.")
        most = MAX_TIMEOUT // timedelta(seconds=1)
        seconds = self.integer(data["after_seconds"], "timeout.after_seconds", node_id, 1, most)
        return Timeout(after=timedelta(seconds=seconds), next=self.node_name(data["next"], "timeout.next", node_id))

    def targets(self, value: object, node_id: str, minimum: int) -> tuple[Target, ...]:
        items = self.array(value, "targets", node_id, minimum, MAX_TARGETS)
        targets: list[Target] = []
        for number, item in enumerate(items):
            field = f"targets[{number}]"
            data = self.table(item, field, node_id)
            self.fields(data, "target", node_id=node_id, where="target", prefix=f"{field}.")
            object_id = data["id"]
            if not isinstance(object_id, Mapping):
                self.expect(object_id, str, f"{field}.id", node_id, 'a string or { from = "<binding>" }')
            revision = data["revision"]
            if not isinstance(revision, Mapping):
                self.expect(revision, int, f"{field}.revision", node_id, 'an integer or { from = "<binding>" }')
                self.revision(revision, f"{field}.revision", node_id)
            target = Target(
                object_id=self.operand(object_id, f"{field}.id", node_id),
                revision=self.operand(revision, f"{field}.revision", node_id),
            )
            if target.object_id == "":
                self.fail("must not be empty", node_id=node_id, field=f"{field}.id")
            if target in targets:
                self.fail(f"repeats targets[{targets.index(target)}]", node_id=node_id, field=field)
            targets.append(target)
        return tuple(targets)

    def policies(self, value: object, node_id: str) -> tuple[PolicyRef, ...]:
        items = self.array(value, "policies", node_id, 0, MAX_POLICIES)
        policies: list[PolicyRef] = []
        for number, item in enumerate(items):
            field = f"policies[{number}]"
            data = self.table(item, field, node_id)
            self.fields(data, "policy", node_id=node_id, where="policy", prefix=f"{field}.")
            policy = PolicyRef(
                policy_id=self.identifier(data["id"], f"{field}.id", node_id, "policy id"),
                revision=self.revision(data["revision"], f"{field}.revision", node_id),
            )
            if any(p.policy_id == policy.policy_id for p in policies):
                self.fail(f"lists policy {shown(policy.policy_id)} twice", node_id=node_id, field=field)
            policies.append(policy)
        return tuple(policies)

    # --- nodes ---

    def nodes(self, value: object) -> tuple[Node, ...]:
        if not isinstance(value, list | tuple):
            self.fail(f"must be an array of tables ([[nodes]]), found {_kind_of(value)}", field="nodes")
        if not 1 <= len(value) <= MAX_NODES:
            self.fail(f"must list {_between(1, MAX_NODES)} nodes, found {len(value)}", field="nodes")
        nodes: list[Node] = []
        first: dict[str, int] = {}
        for number, item in enumerate(value, start=1):
            if not isinstance(item, Mapping):
                self.fail(f"node #{number} must be a table, found {_kind_of(item)}", field="nodes")
            if "id" not in item:
                self.fail(f"node #{number} has no 'id'", field="id")
            node_id = item["id"]
            if not isinstance(node_id, str):
                self.fail(f"node #{number}: must be a string, found {_kind_of(node_id)}", field="id")
            if not NAME.fullmatch(node_id):
                self.fail(
                    f"node #{number}: {shown(node_id)} is not a valid node id (1 to 64 of a-z 0-9 _, starting with a letter)",
                    field="id",
                )
            if node_id == INPUT:
                self.fail(
                    f"node #{number}: the node id {shown(INPUT)} is reserved: binding names 'input.<name>' read admission inputs",
                    field="id",
                )
            if node_id in first:
                self.fail(f"duplicate node id {shown(node_id)} (also node #{first[node_id]})", node_id=node_id, field="id")
            first[node_id] = number
            nodes.append(self.node(item, node_id))
        return tuple(nodes)

    def node(self, data: Mapping[str, object], node_id: str) -> Node:
        if "kind" not in data:
            self.fail("missing required field 'kind'", node_id=node_id, field="kind")
        kind = self.string(data["kind"], "kind", node_id)
        if kind not in SUPPORTED_KINDS:
            if self.strict:
                self.fail(f"unknown node kind {shown(kind)}; supported: {', '.join(SUPPORTED_KINDS)}", node_id=node_id, field="kind")
            # Written by newer code: keep what every node has, and leave the
            # rest to the code that knows the kind.
            kind_name = self.identifier(kind, "kind", node_id, "node kind")
            if "revision" not in data:
                self.fail("missing required field 'revision'", node_id=node_id, field="revision")
            return UnsupportedNode(node_id=node_id, revision=self.revision(data["revision"], "revision", node_id), kind_name=kind_name)
        self.fields(data, kind, node_id=node_id, where=f"{kind} node", prefix="")
        revision = self.revision(data["revision"], "revision", node_id)
        match kind:
            case "condition":
                return self.condition(data, node_id, revision)
            case "wait_for_event":
                return WaitForEventNode(
                    node_id=node_id,
                    revision=revision,
                    event_type=self.event_type(data["event_type"], node_id),
                    correlation=self.keyed_operands(data["correlation"], "correlation", node_id, 1, MAX_CORRELATION),
                    next=self.node_name(data["next"], "next", node_id),
                    timeout=self.timeout(data["timeout"], node_id) if "timeout" in data else None,
                )
            case "request_approval":
                return RequestApprovalNode(
                    node_id=node_id,
                    revision=revision,
                    operation=self.identifier(data["operation"], "operation", node_id, "operation id"),
                    targets=self.targets(data["targets"], node_id, 1),
                    policies=self.policies(data.get("policies", []), node_id),
                    reviewers=self.names_list(
                        data["reviewers"],
                        "reviewers",
                        node_id,
                        "reviewer id",
                        MAX_REVIEWERS,
                        minimum=1,
                        check=self.identifier,
                    ),
                    distinct_reviewer=self.boolean(data.get("distinct_reviewer", True), "distinct_reviewer", node_id),
                    approved_next=self.node_name(data["approved_next"], "approved_next", node_id),
                    rejected_next=self.node_name(data["rejected_next"], "rejected_next", node_id),
                    timeout=self.timeout(data["timeout"], node_id) if "timeout" in data else None,
                )
            case "local_command":
                return LocalCommandNode(
                    node_id=node_id,
                    revision=revision,
                    operation=self.identifier(data["operation"], "operation", node_id, "operation id"),
                    targets=self.targets(data.get("targets", []), node_id, 0),
                    payload=self.keyed_operands(data.get("payload", {}), "payload", node_id, 0, MAX_PAYLOAD),
                    next=self.node_name(data["next"], "next", node_id),
                    on_failure=self.node_name(data["on_failure"], "on_failure", node_id),
                )
            case _:
                return self.end(data, node_id, revision)

    def condition(self, data: Mapping[str, object], node_id: str, revision: int) -> ConditionNode:
        bindings = self.names_list(
            data["bindings"], "bindings", node_id, "binding name", MAX_BINDINGS, check=self.binding_name
        )
        # Emptiness and length are the expression language's own limits
        # (specs/expressions.md); parse() refuses them with a position.
        expression = self.string(data["expression"], "expression", node_id)
        try:
            ast = parse(expression)
        except ExpressionError as exc:
            raise DefinitionError(
                self.source,
                f"at position {exc.position}: {exc.problem}",
                node_id=node_id,
                field="expression",
                position=exc.position,
            ) from None
        for name in sorted(names(ast)):
            if name not in bindings:
                self.fail(f"reads {shown(name)}, which is not among its declared bindings", node_id=node_id, field="expression")
        return ConditionNode(
            node_id=node_id,
            revision=revision,
            expression=expression,
            bindings=bindings,
            true_next=self.node_name(data["true_next"], "true_next", node_id),
            false_next=self.node_name(data["false_next"], "false_next", node_id),
            ast=ast,
        )

    def end(self, data: Mapping[str, object], node_id: str, revision: int) -> EndNode:
        outcome = self.string(data["outcome"], "outcome", node_id)
        if outcome not in OUTCOMES:
            self.fail(f"must be 'succeeded' or 'failed', found {shown(outcome)}", node_id=node_id, field="outcome")
        error_code = None
        if outcome == "failed":
            if "error_code" not in data:
                self.fail("an end node with outcome 'failed' needs an error code", node_id=node_id, field="error_code")
            error_code = self.identifier(data["error_code"], "error_code", node_id, "error code")
        elif "error_code" in data:
            self.fail("only an end node with outcome 'failed' has an error code", node_id=node_id, field="error_code")
        return EndNode(node_id=node_id, revision=revision, outcome=outcome, error_code=error_code)

    # --- the graph ---

    def graph(self, definition: Definition) -> None:
        by_id = {node.node_id: node for node in definition.nodes}
        if definition.start not in by_id:
            self.fail(f"start {shown(definition.start)} names no node", field="start")
        if self.strict:
            for node in definition.nodes:
                for field, target in continuations(node):
                    if target not in by_id:
                        self.fail(f"continuation {shown(target)} names no node", node_id=node.node_id, field=field)
        for node in definition.nodes:
            for field, name in reads(node):
                self.binding(definition, node, field, name, by_id)
        self.condition_cycles(definition)
        # With an unsupported node the graph's edges are not all known, so a
        # node reached only through it would look unreachable.
        if not any(isinstance(node, UnsupportedNode) for node in definition.nodes):
            reachable = _reachable(definition)
            for node in definition.nodes:
                if node.node_id not in reachable:
                    self.fail(
                        f"not reachable from start {shown(definition.start)}, so it can never run "
                        "(is a continuation misspelt?)",
                        node_id=node.node_id,
                    )

    def binding(self, definition: Definition, node: Node, field: str, name: str, by_id: Mapping[str, Node]) -> None:
        head, _dot, tail = name.partition(".")
        if head == INPUT:
            if tail not in definition.inputs:
                self.fail(f"reads {shown(name)}, but {shown(tail)} is not a declared input", node_id=node.node_id, field=field)
            declared = next((t for t in definition.input_types or () if t.name == tail), None)
            if declared is not None and declared.type in ("object", "array"):
                self.fail(
                    f"reads {shown(name)}, {_article(declared.type)} input; a node reads only strings, numbers and booleans",
                    node_id=node.node_id,
                    field=field,
                )
            return
        source = by_id.get(head)
        if source is None:
            self.fail(f"reads {shown(name)}, but no node {shown(head)} exists", node_id=node.node_id, field=field)
        if source is node:
            # Its own outputs do not exist yet when a node is visited.
            self.fail(f"reads {shown(name)}, its own output; a node reads only other nodes' outputs", node_id=node.node_id, field=field)
        if isinstance(source, ConditionNode | EndNode):
            self.fail(
                f"reads {shown(name)}, but {shown(head)} is {_article(source.kind)} node, which has no outputs "
                "(only wait_for_event, request_approval and local_command nodes have)",
                node_id=node.node_id,
                field=field,
            )

    def condition_cycles(self, definition: Definition) -> None:
        conditions = {node.node_id: node for node in definition.nodes if isinstance(node, ConditionNode)}
        done: set[str] = set()
        path: list[str] = []

        def visit(node_id: str) -> None:
            path.append(node_id)
            for _field, target in continuations(conditions[node_id]):
                if target in path:
                    cycle = [*path[path.index(target) :], target]
                    first = conditions[target]
                    closing_field = next(f for f, t in continuations(first) if t == cycle[1])
                    self.fail(
                        f"condition cycle {' -> '.join(cycle)}: condition nodes alone can never wait, act or end",
                        node_id=target,
                        field=closing_field,
                    )
                if target in conditions and target not in done:
                    visit(target)
            path.pop()
            done.add(node_id)

        for node_id in conditions:
            if node_id not in done:
                visit(node_id)


def _article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _between(minimum: int, maximum: int) -> str:
    return f"at most {maximum}" if minimum == 0 else f"{minimum} to {maximum}"


def _reachable(definition: Definition) -> set[str]:
    seen = {definition.start}
    stack = [definition.start]
    while stack:
        node = definition.node(stack.pop())
        if node is None:
            continue
        for target in definition.successors(node):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


# --- writing ----------------------------------------------------------------------------


def to_mapping(definition: Definition) -> dict[str, object]:
    """The JSON/TOML structure of ``definition``: what :func:`definition_from_mapping` reads back.

    Every optional field is written except an absent ``timeout`` or
    ``error_code`` (TOML has no null).  A definition holding an
    :class:`UnsupportedNode` cannot be written: lenient decoding kept only
    what every node has, so writing it would silently drop the rest.
    """
    return {
        "id": definition.definition_id,
        "revision": definition.revision,
        "title": definition.title,
        "start": definition.start,
        "inputs": list(definition.inputs) if definition.input_types is None else _input_types_mapping(definition),
        "nodes": [_node_mapping(node) for node in definition.nodes],
    }


def _input_types_mapping(definition: Definition) -> dict[str, object]:
    # Every keyword is written when it is set, and `required` always: the
    # canonical form spells out the default so that both spellings hash alike.
    written: dict[str, object] = {}
    for declared in definition.input_types or ():
        data: dict[str, object] = {"type": declared.type, "required": declared.required}
        if declared.description:
            data["description"] = declared.description
        for keyword, value in (
            ("enum", None if declared.enum is None else list(declared.enum)),
            ("minimum", declared.minimum),
            ("maximum", declared.maximum),
            ("minLength", declared.min_length),
            ("maxLength", declared.max_length),
        ):
            if value is not None:
                data[keyword] = value
        written[declared.name] = data
    return written


def _node_mapping(node: Node) -> dict[str, object]:
    data: dict[str, object] = {"id": node.node_id, "kind": node.kind, "revision": node.revision}
    match node:
        case ConditionNode():
            data |= {
                "expression": node.expression,
                "bindings": list(node.bindings),
                "true_next": node.true_next,
                "false_next": node.false_next,
            }
        case WaitForEventNode():
            data |= {
                "event_type": node.event_type,
                "correlation": {key: _operand_value(v) for key, v in node.correlation},
                "next": node.next,
            }
            if node.timeout is not None:
                data["timeout"] = _timeout_value(node.timeout)
        case RequestApprovalNode():
            data |= {
                "operation": node.operation,
                "targets": [_target_value(t) for t in node.targets],
                "policies": [{"id": p.policy_id, "revision": p.revision} for p in node.policies],
                "reviewers": list(node.reviewers),
                "distinct_reviewer": node.distinct_reviewer,
                "approved_next": node.approved_next,
                "rejected_next": node.rejected_next,
            }
            if node.timeout is not None:
                data["timeout"] = _timeout_value(node.timeout)
        case LocalCommandNode():
            data |= {
                "operation": node.operation,
                "targets": [_target_value(t) for t in node.targets],
                "payload": {key: _operand_value(v) for key, v in node.payload},
                "next": node.next,
                "on_failure": node.on_failure,
            }
        case EndNode():
            data["outcome"] = node.outcome
            if node.error_code is not None:
                data["error_code"] = node.error_code
        case UnsupportedNode():
            raise DefinitionError(
                "<definition>",
                f"is of kind {node.kind_name!r}, unknown to this code; a leniently read definition cannot be written",
                node_id=node.node_id,
                field="kind",
            )
    return data


def _operand_value(value: Operand) -> object:
    return {"from": value.name} if isinstance(value, Ref) else value


def _target_value(target: Target) -> dict[str, object]:
    return {"id": _operand_value(target.object_id), "revision": _operand_value(target.revision)}


def _timeout_value(timeout: Timeout) -> dict[str, object]:
    return {"after_seconds": timeout.after // timedelta(seconds=1), "next": timeout.next}


def to_json(definition: Definition) -> str:
    """The canonical JSON text of ``definition``: keys sorted, no whitespace, UTF-8 characters unescaped.

    With no floats and ASCII keys this is exactly RFC 8785 (JSON
    Canonicalization Scheme) output, so another implementation computes the
    same bytes, and so the same :func:`digest`.
    """
    return json.dumps(to_mapping(definition), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(definition: Definition) -> str:
    """``"sha256:"`` and the hex SHA-256 of the UTF-8 bytes of :func:`to_json`."""
    return "sha256:" + hashlib.sha256(to_json(definition).encode("utf-8")).hexdigest()


# --- registration -------------------------------------------------------------------------


def check_registration(new: Definition, registered: Sequence[Definition]) -> bool:
    """May ``new`` be registered beside ``registered`` (earlier revisions of its id, any order)?

    Returns False when ``new`` is already registered, identically, under its
    revision number (registering it again changes nothing), True when it may
    be registered.  Raises :class:`DefinitionError` when its revision is not
    exactly one more than the highest registered (1 when none is), when its
    revision number is registered with different content, or when it reuses
    a registered node revision with different content.
    """
    source = f"definition {new.definition_id!r} revision {new.revision}"
    for earlier in registered:
        if earlier.definition_id != new.definition_id:
            raise DefinitionError(
                source, f"is checked against revision {earlier.revision} of another definition, {earlier.definition_id!r}"
            )
    same = [earlier for earlier in registered if earlier.revision == new.revision]
    if same:
        if all(earlier == new for earlier in same):
            return False
        raise DefinitionError(
            source,
            f"revision {new.revision} is already registered with different content; "
            "a registered revision never changes, so register the change as a new revision",
            field="revision",
        )
    expected = max((earlier.revision for earlier in registered), default=0) + 1
    if new.revision != expected:
        raise DefinitionError(
            source, f"revision {new.revision} does not follow the registered revisions; the next is {expected}", field="revision"
        )
    for node in new.nodes:
        for earlier, old in _same_node_revisions(node, registered):
            if old != node:
                raise DefinitionError(
                    source,
                    f"node {node.node_id!r} revision {node.revision} differs from the registered node "
                    f"{node.node_id!r} revision {node.revision} (in definition revision {earlier.revision}); "
                    "give the changed node a new revision",
                    node_id=node.node_id,
                    field="revision",
                )
    return True


def _same_node_revisions(node: Node, registered: Sequence[Definition]) -> Iterator[tuple[Definition, Node]]:
    for earlier in sorted(registered, key=lambda d: d.revision):
        old = earlier.node(node.node_id)
        if old is not None and old.revision == node.revision:
            yield earlier, old


__all__ = [
    "IDENTIFIER",
    "INPUT",
    "INPUT_TYPES",
    "MAX_BINDINGS",
    "MAX_CORRELATION",
    "MAX_ENUM",
    "MAX_INPUTS",
    "MAX_INPUT_DEPTH",
    "MAX_INPUT_JSON",
    "MAX_INPUT_TEXT",
    "MAX_INTEGER",
    "MAX_NODES",
    "MAX_PAYLOAD",
    "MAX_POLICIES",
    "MAX_REVIEWERS",
    "MAX_TARGETS",
    "MAX_TEXT",
    "MAX_TIMEOUT",
    "NAME",
    "OPTIONAL_FIELDS",
    "OUTCOMES",
    "REQUIRED_FIELDS",
    "RESERVED_EVENT_TYPE_PREFIX",
    "SUPPORTED_KINDS",
    "ConditionNode",
    "Definition",
    "DefinitionError",
    "EndNode",
    "InputType",
    "LocalCommandNode",
    "Node",
    "Operand",
    "PolicyRef",
    "Ref",
    "RequestApprovalNode",
    "Scalar",
    "Target",
    "Timeout",
    "UnsupportedNode",
    "WaitForEventNode",
    "check_registration",
    "continuations",
    "definition_from_mapping",
    "digest",
    "from_json",
    "input_schema",
    "integer_text",
    "parse_definition",
    "reads",
    "to_json",
    "to_mapping",
]
