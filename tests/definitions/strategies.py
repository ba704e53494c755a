"""Hypothesis strategies for workflow definitions, and a TOML writer for their mappings.

- :func:`definition_mappings` draws the TOML/JSON structure of a random
  *valid* definition: a random graph of the five kinds in which every node
  is reachable from ``start``, no cycle consists of condition nodes alone,
  and every binding is declared.  It is built to be valid, not filtered:
  a spanning tree from ``start`` is laid first (each new node takes a free
  continuation of an earlier one), then every remaining continuation points
  anywhere, except that a condition may point to a condition only further
  down the tree order, which rules out condition-only cycles.  The last
  node is an end node, so a condition always has somewhere to go.
- :func:`valid_definitions` is the same, read into :class:`Definition`
  objects; tests of the interpreter reuse it.
- :func:`render_toml` writes any such mapping as TOML text, independently of
  the kernel, so that the TOML reader is tested on text the kernel did not
  write.

Text fields (the title, string literals in payloads, correlations and
object ids) are hostile: any Unicode character but a surrogate, including
quotes, backslashes and control characters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from fencekeeper.kernel.definition import MAX_INTEGER, Definition, definition_from_mapping
from fencekeeper.kernel.expr import KEYWORDS

KINDS = ("condition", "wait_for_event", "request_approval", "local_command", "end")
ACTING_KINDS = ("wait_for_event", "request_approval", "local_command")
"""The kinds whose outputs other nodes may read."""

OUTPUT_FIELDS = ("status", "reviewer", "result", "amount")

# At most 11 characters, so the fixed names corruptions use (longer) never collide;
# never a word the expression language reserves, which no binding may use.
# (Built from alphabets rather than from_regex, which is several times slower to draw from.)
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_ALNUM = _LOWER + _LOWER.upper() + "0123456789"
names_ = st.builds(
    str.__add__, st.sampled_from(_LOWER), st.text(_LOWER + "0123456789_", max_size=10)
).filter(lambda s: s != "input" and s not in KEYWORDS)
identifiers = st.builds(str.__add__, st.sampled_from(_ALNUM), st.text(_ALNUM + "._:@/-", max_size=20))
hostile_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=24)
literals = st.one_of(hostile_text, st.integers(-MAX_INTEGER, MAX_INTEGER), st.booleans())


def _continuation_fields(kind: str, timeout: bool) -> list[str]:
    return {
        "condition": ["true_next", "false_next"],
        "wait_for_event": ["next", *(["timeout.next"] if timeout else [])],
        "request_approval": ["approved_next", "rejected_next", *(["timeout.next"] if timeout else [])],
        "local_command": ["next", "on_failure"],
        "end": [],
    }[kind]


@st.composite
def _expression(draw: st.DrawFn, bindings: list[str]) -> str:
    """A condition source reading some (possibly none) of ``bindings``."""
    if not bindings:
        return draw(st.sampled_from(["true", "false", "1 < 2", '"a" in ["a", "b"]']))
    read = draw(st.lists(st.sampled_from(bindings), min_size=1, max_size=3, unique=True))
    parts = []
    for name in read:
        form = draw(st.sampled_from(["{} >= 1000", '{} == "web"', "{}", "not {}", "{} in [1, 2, 3]", "{} != true"]))
        parts.append(form.format(name))
    joiner = draw(st.sampled_from([" and ", " or "]))
    return joiner.join(f"({p})" for p in parts)


@st.composite
def _operand(draw: st.DrawFn, refs: list[str]) -> object:
    if len(refs) > 0 and draw(st.booleans()):
        return {"from": draw(st.sampled_from(refs))}
    return draw(literals)


@st.composite
def _targets(draw: st.DrawFn, refs: list[str], minimum: int) -> list[dict[str, object]]:
    count = draw(st.integers(minimum, 3))
    targets: list[dict[str, object]] = []
    while len(targets) < count:
        object_id: object = draw(hostile_text.filter(bool))
        if len(refs) > 0 and draw(st.booleans()):
            object_id = {"from": draw(st.sampled_from(refs))}
        revision: object = draw(st.integers(1, MAX_INTEGER))
        if len(refs) > 0 and draw(st.booleans()):
            revision = {"from": draw(st.sampled_from(refs))}
        target = {"id": object_id, "revision": revision}
        if target not in targets:
            targets.append(target)
        else:
            count -= 1
    return targets


@st.composite
def _keyed(draw: st.DrawFn, refs: list[str], minimum: int, maximum: int) -> dict[str, object]:
    keys = draw(st.lists(names_, min_size=minimum, max_size=maximum, unique=True))
    return {key: draw(_operand(refs)) for key in keys}


@st.composite
def _timeout(draw: st.DrawFn) -> dict[str, object]:
    return {"after_seconds": draw(st.integers(1, 366 * 86400)), "next": None}


@st.composite
def _input_type(draw: st.DrawFn, kind: str) -> dict[str, object]:
    """A valid type declaration of ``kind``: every keyword that applies, each present or not."""
    data: dict[str, object] = {"type": kind}
    if draw(st.booleans()):
        data["required"] = draw(st.booleans())
    if draw(st.booleans()):
        data["description"] = draw(hostile_text)
    if kind in ("integer", "number"):
        low, high = sorted(draw(st.lists(st.integers(-MAX_INTEGER, MAX_INTEGER), min_size=2, max_size=2)))
        if draw(st.booleans()):
            data["minimum"] = low
        if draw(st.booleans()):
            data["maximum"] = high
        if draw(st.booleans()):
            data["enum"] = draw(st.lists(st.integers(low, high), min_size=1, max_size=4, unique=True))
            data["minimum"], data["maximum"] = low, high
    elif kind == "string":
        short, long = sorted(draw(st.lists(st.integers(0, 4096), min_size=2, max_size=2)))
        if draw(st.booleans()):
            data["minLength"] = short
        if draw(st.booleans()):
            data["maxLength"] = long
        if draw(st.booleans()):
            data.pop("minLength", None)
            data.pop("maxLength", None)
            data["enum"] = draw(st.lists(hostile_text, min_size=1, max_size=4, unique=True))
    elif kind == "boolean" and draw(st.booleans()):
        data["enum"] = draw(st.lists(st.booleans(), min_size=1, max_size=2, unique=True))
    return data


@st.composite
def _typed_inputs(draw: st.DrawFn, read: list[str]) -> dict[str, object]:
    """Types for the inputs nodes read (scalars only: no node reads an object or array), and maybe unread ones."""
    table = {name: draw(_input_type(draw(st.sampled_from(["string", "integer", "number", "boolean"])))) for name in read}
    for name in draw(st.lists(names_.filter(lambda n: n not in read), max_size=2, unique=True)):
        table[name] = draw(_input_type(draw(st.sampled_from(["object", "array", "string"]))))
    return table


@st.composite
def definition_mappings(draw: st.DrawFn, max_nodes: int = 10) -> dict[str, Any]:
    """The TOML/JSON structure of a random valid definition (see the module docstring)."""
    count = draw(st.integers(1, max_nodes))
    ids = draw(st.lists(names_, min_size=count, max_size=count, unique=True))
    inputs = draw(st.lists(names_, max_size=4, unique=True))

    # The shape: a kind per node and where each continuation leads.
    kinds: list[str] = []
    timeouts: list[bool] = []
    free: list[tuple[int, str]] = []
    edges: dict[tuple[int, str], int] = {}
    for index in range(count):
        if index > 0:
            slot = free.pop(draw(st.integers(0, len(free) - 1)))
            edges[slot] = index
        if index == count - 1:
            kind = "end"
        elif not free:
            # Something must stay open for the nodes still to come.
            kind = draw(st.sampled_from(KINDS[:-1]))
        else:
            kind = draw(st.sampled_from(KINDS))
        timeout = kind in ("wait_for_event", "request_approval") and draw(st.booleans())
        kinds.append(kind)
        timeouts.append(timeout)
        free += [(index, field) for field in _continuation_fields(kind, timeout)]
    for index, field in free:
        choices = [
            j for j in range(count) if not (kinds[index] == "condition" and kinds[j] == "condition" and j <= index)
        ]
        edges[(index, field)] = draw(st.sampled_from(choices))

    outputs = {
        index: [f"{ids[index]}.{field}" for field in OUTPUT_FIELDS] for index in range(count) if kinds[index] in ACTING_KINDS
    }

    nodes: list[dict[str, Any]] = []
    for index, (node_id, kind) in enumerate(zip(ids, kinds, strict=True)):
        refs = [f"input.{name}" for name in inputs] + [
            name for other, names in outputs.items() if other != index for name in names
        ]

        def nxt(field: str, index: int = index) -> str:
            return ids[edges[(index, field)]]

        node: dict[str, Any] = {"id": node_id, "kind": kind, "revision": draw(st.integers(1, 5))}
        if kind == "condition":
            bindings = draw(st.lists(st.sampled_from(refs), max_size=4, unique=True)) if refs else []
            node["expression"] = draw(_expression(bindings))
            node["bindings"] = bindings
            node["true_next"] = nxt("true_next")
            node["false_next"] = nxt("false_next")
        elif kind == "wait_for_event":
            node["event_type"] = draw(identifiers)
            node["correlation"] = draw(_keyed(refs, 1, 3))
            node["next"] = nxt("next")
        elif kind == "request_approval":
            node["operation"] = draw(identifiers)
            node["targets"] = draw(_targets(refs, 1))
            if draw(st.booleans()):
                policy_ids = draw(st.lists(identifiers, max_size=3, unique=True))
                node["policies"] = [{"id": p, "revision": draw(st.integers(1, 9))} for p in policy_ids]
            node["reviewers"] = draw(st.lists(identifiers, min_size=1, max_size=3, unique=True))
            if draw(st.booleans()):
                node["distinct_reviewer"] = draw(st.booleans())
            node["approved_next"] = nxt("approved_next")
            node["rejected_next"] = nxt("rejected_next")
        elif kind == "local_command":
            node["operation"] = draw(identifiers)
            if draw(st.booleans()):
                node["targets"] = draw(_targets(refs, 0))
            if draw(st.booleans()):
                node["payload"] = draw(_keyed(refs, 0, 4))
            node["next"] = nxt("next")
            node["on_failure"] = nxt("on_failure")
        else:
            node["outcome"] = draw(st.sampled_from(["succeeded", "failed"]))
            if node["outcome"] == "failed":
                node["error_code"] = draw(identifiers)
        if timeouts[index]:
            node["timeout"] = draw(_timeout()) | {"next": nxt("timeout.next")}
        nodes.append(node)

    data: dict[str, Any] = {"id": draw(identifiers), "revision": draw(st.integers(1, 50)), "start": ids[0]}
    if draw(st.booleans()):
        data["title"] = draw(hostile_text)
    if draw(st.booleans()):
        data["inputs"] = draw(_typed_inputs(inputs))
    elif len(inputs) > 0 or draw(st.booleans()):
        data["inputs"] = inputs
    # File order is free: start need not come first.
    data["nodes"] = draw(st.permutations(nodes))
    return data


def valid_definitions(max_nodes: int = 10) -> st.SearchStrategy[Definition]:
    """Random valid :class:`Definition` objects, read (so validated) by the kernel."""
    return definition_mappings(max_nodes).map(definition_from_mapping)


# --- a TOML writer for the tests --------------------------------------------------------------


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string."""
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


def toml_value(value: object) -> str:
    """Any value of the structure as an inline TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_string(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def render_toml(data: Mapping[str, Any]) -> str:
    """The mapping of a definition as TOML: top-level keys, then one ``[[nodes]]`` block per node."""
    lines = [f"{toml_string(key)} = {toml_value(value)}" for key, value in data.items() if key != "nodes"]
    for node in data.get("nodes", []):
        lines += ["", "[[nodes]]"]
        lines += [f"{toml_string(key)} = {toml_value(value)}" for key, value in node.items()]
    return "\n".join(lines) + "\n"
