"""Random definitions: every valid one reads and round-trips; every one corruption of it is refused, naming the culprit.

- A random valid definition (``strategies.definition_mappings``) reads the
  same from its mapping, from TOML written by the tests' own writer, and
  from its canonical JSON; writing it again gives the same bytes, and so
  the same digest.
- One random corruption of a valid definition -- a dropped required field,
  a dangling continuation, a duplicated node id, an unknown kind, a value
  of the wrong type, an unknown field, an unreachable node, an undeclared
  binding -- is always refused with a :class:`DefinitionError` whose
  ``node_id`` and ``field`` are exactly the node and field corrupted.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fencekeeper.kernel.definition import (
    REQUIRED_FIELDS,
    Definition,
    DefinitionError,
    continuations,
    definition_from_mapping,
    digest,
    from_json,
    parse_definition,
    to_json,
    to_mapping,
)

from .strategies import definition_mappings, render_toml, valid_definitions

# Names a generated definition never uses (generated names have at most 11 characters).
MISSING = "no_such_node_here"
ORPHAN = "orphaned_end_node"


@settings(max_examples=60, deadline=None)
@given(definition_mappings())
def test_valid_definitions_read_the_same_every_way(data: dict[str, Any]) -> None:
    definition = definition_from_mapping(data)
    assert parse_definition(render_toml(data)) == definition
    text = to_json(definition)
    assert from_json(text) == definition
    assert from_json(text, strict=False) == definition
    assert parse_definition(render_toml(to_mapping(definition))) == definition
    assert to_json(from_json(text)) == text
    assert digest(from_json(text)) == digest(definition)


@settings(max_examples=30, deadline=None)
@given(valid_definitions())
def test_every_node_is_found_and_every_continuation_resolves(definition: Definition) -> None:
    assert definition.node(definition.start) is not None
    for node in definition.nodes:
        assert definition.node(node.node_id) is node
        assert all(definition.node(target) is not None for target in definition.successors(node))


@settings(max_examples=20, deadline=None)
@given(valid_definitions(), st.data())
def test_digest_changes_with_the_title_and_revision(definition: Definition, data: st.DataObject) -> None:
    title = data.draw(st.text(max_size=5).filter(lambda t: t != definition.title))
    assert digest(attrs.evolve(definition, title=title)) != digest(definition)
    assert digest(attrs.evolve(definition, revision=definition.revision + 1)) != digest(definition)


# --- corruptions ---------------------------------------------------------------------------------

Corruption = tuple[str, Callable[[dict[str, Any]], None], str | None, str | None]
"""(description, edit applied to a deep copy, the node_id and the field the refusal must name)."""

WRONG_TYPE: dict[type, object] = {str: 7, int: "7", bool: "yes", list: "x", dict: 1.5}


def _node(data: dict[str, Any], node_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in data["nodes"] if n["id"] == node_id)
    return found


def _ref_positions(node: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every ``{ from = ... }`` in ``node``, with the field the validator names for it."""
    found = []
    for key in ("correlation", "payload"):
        for name, value in node.get(key, {}).items():
            if isinstance(value, dict):
                found.append((f"{key}.{name}", value))
    for number, target in enumerate(node.get("targets", [])):
        for part in ("id", "revision"):
            if isinstance(target[part], dict):
                found.append((f"targets[{number}].{part}", target[part]))
    return found


def _set_path(node: dict[str, Any], field: str, value: object) -> None:
    if field == "timeout.next":
        node["timeout"]["next"] = value
    else:
        node[field] = value


CATEGORIES = (
    "drop_required",
    "dangle_continuation",
    "duplicate_id",
    "unknown_kind",
    "wrong_type",
    "unknown_field",
    "unreachable_node",
    "bad_binding",
)


@st.composite
def corruptions(draw: st.DrawFn, data: dict[str, Any], category: str) -> Corruption:
    """One corruption of ``category`` applicable to ``data`` (rejected by ``assume`` when none is)."""
    nodes: list[dict[str, Any]] = data["nodes"]
    node = draw(st.sampled_from(nodes))
    node_id: str = node["id"]
    options: list[Corruption] = []

    if category == "drop_required":
        top_key = draw(st.sampled_from(REQUIRED_FIELDS["definition"]))
        options.append((f"drop top-level {top_key}", lambda d: d.pop(top_key), None, top_key))
        node_key = draw(st.sampled_from(REQUIRED_FIELDS[node["kind"]]))
        options.append(
            (
                f"drop {node_key} of {node_id}",
                lambda d: _node(d, node_id).pop(node_key),
                None if node_key == "id" else node_id,
                node_key,
            )
        )
        if "timeout" in node:
            part = draw(st.sampled_from(REQUIRED_FIELDS["timeout"]))
            options.append(
                (
                    f"drop timeout.{part} of {node_id}",
                    lambda d: _node(d, node_id)["timeout"].pop(part),
                    node_id,
                    f"timeout.{part}",
                )
            )

    elif category == "dangle_continuation":
        # Any node with a continuation (every valid definition but a lone end node has one).
        acting = [n for n in nodes if _continuation_fields(n)]
        if acting:
            dangling = draw(st.sampled_from(acting))
            dangled = draw(st.sampled_from(_continuation_fields(dangling)))
            options.append(
                (
                    f"dangle {dangling['id']}.{dangled}",
                    lambda d: _set_path(_node(d, dangling["id"]), dangled, MISSING),
                    dangling["id"],
                    dangled,
                )
            )

    elif category == "duplicate_id" and len(nodes) > 1:
        # A later node takes an earlier one's id; the later one is refused, naming the id.
        first, second = sorted(draw(st.lists(st.integers(0, len(nodes) - 1), min_size=2, max_size=2, unique=True)))
        duplicated, later = nodes[first]["id"], nodes[second]["id"]
        options.append((f"duplicate {duplicated}", lambda d: _node(d, later).update(id=duplicated), duplicated, "id"))

    elif category == "unknown_kind":
        options.append((f"unknown kind for {node_id}", lambda d: _node(d, node_id).update(kind="parallel"), node_id, "kind"))

    elif category == "wrong_type":
        typed_key = draw(st.sampled_from(sorted(data)))
        top_wrong = WRONG_TYPE[type(data[typed_key])]
        options.append(
            (f"wrong type of top-level {typed_key}", lambda d: d.update({typed_key: top_wrong}), None, typed_key)
        )
        node_typed_key = draw(st.sampled_from(sorted(node)))
        node_wrong = WRONG_TYPE[type(node[node_typed_key])]
        options.append(
            (
                f"wrong type of {node_id}.{node_typed_key}",
                lambda d: _node(d, node_id).update({node_typed_key: node_wrong}),
                None if node_typed_key == "id" else node_id,
                node_typed_key,
            )
        )

    elif category == "unknown_field":
        options.append(("unknown top-level field", lambda d: d.update(colour="red"), None, "colour"))
        options.append((f"unknown field of {node_id}", lambda d: _node(d, node_id).update(colour="red"), node_id, "colour"))

    elif category == "unreachable_node":
        position = draw(st.integers(0, len(nodes)))
        orphan = {"id": ORPHAN, "kind": "end", "revision": 1, "outcome": "succeeded"}
        options.append((f"unreachable node at #{position + 1}", lambda d: d["nodes"].insert(position, orphan), ORPHAN, None))

    elif category == "bad_binding":
        # A reference, or a condition binding, naming no declared input or no node.
        bad = draw(st.sampled_from([f"input.{MISSING}", f"{MISSING}.value"]))
        for candidate in nodes:
            candidate_id = candidate["id"]
            for rebound, _ref in _ref_positions(candidate):
                options.append(
                    (
                        f"bad reference {candidate_id}.{rebound}",
                        _rebinding(candidate_id, rebound, bad),
                        candidate_id,
                        rebound,
                    )
                )
            if candidate["kind"] == "condition":
                options.append(
                    (
                        f"bad binding of {candidate_id}",
                        _adding_binding(candidate_id, bad),
                        candidate_id,
                        "bindings",
                    )
                )
            if candidate["kind"] in ("wait_for_event", "local_command"):
                key = "correlation" if candidate["kind"] == "wait_for_event" else "payload"
                options.append(
                    (
                        f"bad {key} reference of {candidate_id}",
                        _adding_reference(candidate_id, key, bad),
                        candidate_id,
                        f"{key}.{ORPHAN}",
                    )
                )

    assume(options)
    return draw(st.sampled_from(options))


Edit = Callable[[dict[str, Any]], None]


def _rebinding(node_id: str, field: str, name: str) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        dict(_ref_positions(_node(data, node_id)))[field]["from"] = name

    return edit


def _adding_binding(node_id: str, name: str) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        _node(data, node_id)["bindings"].append(name)

    return edit


def _adding_reference(node_id: str, key: str, name: str) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        _node(data, node_id).setdefault(key, {})[ORPHAN] = {"from": name}

    return edit


def _continuation_fields(node: dict[str, Any]) -> list[str]:
    fields: list[str] = [
        f for f in ("true_next", "false_next", "next", "approved_next", "rejected_next", "on_failure") if f in node
    ]
    if "timeout" in node:
        fields.append("timeout.next")
    return fields


@pytest.mark.parametrize("category", CATEGORIES)
@settings(max_examples=30, deadline=None)
@given(data=definition_mappings(), choice=st.data())
def test_one_corruption_is_always_refused_naming_its_culprit(
    category: str, data: dict[str, Any], choice: st.DataObject
) -> None:
    description, edit, node_id, field = choice.draw(corruptions(data, category))
    broken = copy.deepcopy(data)
    edit(broken)
    with pytest.raises(DefinitionError) as caught:
        definition_from_mapping(broken, "random.toml")
    error = caught.value
    assert error.problem, description
    assert (error.node_id, error.field) == (node_id, field), f"{description}: {error}"
    assert node_id is not None or field is not None
    # The JSON form of the same text is refused in the same words.
    with pytest.raises(DefinitionError) as stored:
        from_json(json.dumps(broken), source="random.toml")
    assert str(stored.value) == str(error)


def test_continuation_fields_cover_the_kernels() -> None:
    # Guards the corruption list: it must know every continuation field the kernel declares.
    definition = definition_from_mapping(
        {
            "id": "d",
            "revision": 1,
            "start": "a",
            "nodes": [
                {"id": "a", "kind": "condition", "revision": 1, "expression": "true", "bindings": [], "true_next": "b", "false_next": "c"},
                {
                    "id": "b",
                    "kind": "request_approval",
                    "revision": 1,
                    "operation": "op",
                    "targets": [{"id": "o", "revision": 1}],
                    "reviewers": ["r"],
                    "approved_next": "c",
                    "rejected_next": "d",
                    "timeout": {"after_seconds": 1, "next": "d"},
                },
                {"id": "c", "kind": "local_command", "revision": 1, "operation": "op", "next": "e", "on_failure": "d"},
                {"id": "e", "kind": "wait_for_event", "revision": 1, "event_type": "t", "correlation": {"k": 1}, "next": "d"},
                {"id": "d", "kind": "end", "revision": 1, "outcome": "succeeded"},
            ],
        }
    )
    kernel_fields = {field for node in definition.nodes for field, _ in continuations(node)}
    test_fields = {field for node in to_mapping(definition)["nodes"] for field in _continuation_fields(node)}  # type: ignore[attr-defined]
    assert kernel_fields == test_fields == {
        "true_next",
        "false_next",
        "next",
        "approved_next",
        "rejected_next",
        "on_failure",
        "timeout.next",
    }
