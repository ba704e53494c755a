"""specs/definition.schema.json agrees with the kernel's validator.

The schema is for other implementations; nothing in fencekeeper reads it,
so these tests are what keeps it true:

- its ``required`` and ``properties`` lists are exactly the validator's
  field lists (``REQUIRED_FIELDS`` / ``OPTIONAL_FIELDS``), table by table,
  and its node kinds are exactly ``SUPPORTED_KINDS``;
- every definition the tests hold as valid (the example, random valid
  definitions), in its canonical JSON form and as written, satisfies it;
- definitions broken in a way the schema can express (a missing, unknown or
  mistyped field, an unknown kind) are refused by both.

Checking needs a JSON Schema evaluator, and the project takes no
dependency for one; :func:`schema_errors` below evaluates the keywords the
schema uses, and a test confirms the schema uses no others, so no keyword
is silently ignored.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencekeeper.kernel.definition import (
    OPTIONAL_FIELDS,
    REQUIRED_FIELDS,
    SUPPORTED_KINDS,
    DefinitionError,
    definition_from_mapping,
    parse_definition,
    to_json,
)

from .examples import EXAMPLE
from .strategies import definition_mappings

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "specs" / "definition.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))

ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "default"})
EVALUATED = frozenset(
    {
        "$ref",
        "type",
        "const",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "allOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
    }
)
SUBSCHEMA_MAPS = frozenset({"$defs", "properties"})
SUBSCHEMA_LISTS = frozenset({"allOf", "oneOf"})
SUBSCHEMAS = frozenset({"items", "additionalProperties", "propertyNames", "not", "if", "then", "else"})


# --- a small evaluator for the keywords the schema uses ------------------------------------------


def _type_ok(value: object, name: str) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
    }[name]


def _resolve(ref: str) -> dict[str, Any]:
    assert ref.startswith("#/$defs/"), ref
    schema: dict[str, Any] = SCHEMA["$defs"][ref.removeprefix("#/$defs/")]
    return schema


def schema_errors(value: object, schema: dict[str, Any] | bool = SCHEMA, path: str = "$") -> list[str]:
    """Every way ``value`` fails ``schema`` (an empty list when it satisfies it)."""
    if schema is True:
        return []
    if schema is False:
        return [f"{path}: not allowed"]
    errors: list[str] = []
    if "$ref" in schema:
        errors += schema_errors(value, _resolve(schema["$ref"]), path)
    if "type" in schema and not _type_ok(value, schema["type"]):
        return [*errors, f"{path}: not of type {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: not one of {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema:
            pattern = schema["pattern"]
            assert pattern.startswith("^") and pattern.endswith("$"), pattern
            if not re.fullmatch(pattern[1:-1], value):
                errors.append(f"{path}: does not match {pattern}")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: length out of bounds")
    in_bounds = schema.get("minimum", value) <= value <= schema.get("maximum", value) if _type_ok(value, "integer") else True
    if not in_bounds:
        errors.append(f"{path}: out of bounds")
    if isinstance(value, list):
        if "items" in schema:
            for number, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{path}[{number}]")
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: item count out of bounds")
        if schema.get("uniqueItems") and any(value[i] in value[:i] for i in range(len(value))):
            errors.append(f"{path}: items not unique")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], f"{path}.{key}")
            elif "additionalProperties" in schema:
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{key}")
            if "propertyNames" in schema:
                errors += schema_errors(key, schema["propertyNames"], f"{path} key {key!r}")
        errors += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        if len(value) < schema.get("minProperties", 0) or len(value) > schema.get("maxProperties", len(value)):
            errors.append(f"{path}: property count out of bounds")
    for sub in schema.get("allOf", []):
        errors += schema_errors(value, sub, path)
    if "oneOf" in schema:
        passing = sum(not schema_errors(value, sub, path) for sub in schema["oneOf"])
        if passing != 1:
            errors.append(f"{path}: matches {passing} of the oneOf alternatives, not exactly one")
    if "not" in schema and not schema_errors(value, schema["not"], path):
        errors.append(f"{path}: matches a schema it must not")
    if "if" in schema:
        branch = "then" if not schema_errors(value, schema["if"], path) else "else"
        if branch in schema:
            errors += schema_errors(value, schema[branch], path)
    return errors


def _subschemas(schema: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(schema, dict):
        return
    yield path, schema
    for key, value in schema.items():
        if key in SUBSCHEMA_MAPS:
            for name, sub in value.items():
                yield from _subschemas(sub, f"{path}.{key}.{name}")
        elif key in SUBSCHEMA_LISTS:
            for number, sub in enumerate(value):
                yield from _subschemas(sub, f"{path}.{key}[{number}]")
        elif key in SUBSCHEMAS:
            yield from _subschemas(value, f"{path}.{key}")


# --- the schema's own shape ------------------------------------------------------------------


def test_schema_is_draft_2020_12() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_uses_only_evaluated_keywords() -> None:
    seen = set()
    for path, schema in _subschemas(SCHEMA):
        unknown = set(schema) - EVALUATED - ANNOTATIONS
        assert not unknown, f"{path} uses {sorted(unknown)}, which schema_errors() does not evaluate"
        seen |= set(schema)
    # Guards the walk: if it stopped at the root, the check above would prove nothing.
    assert {"oneOf", "if", "propertyNames", "uniqueItems", "not"} <= seen


def test_every_ref_resolves() -> None:
    for path, schema in _subschemas(SCHEMA):
        if "$ref" in schema:
            assert isinstance(_resolve(schema["$ref"]), dict), path


@pytest.mark.parametrize("table", sorted(REQUIRED_FIELDS))
def test_required_and_properties_match_the_validator(table: str) -> None:
    schema = SCHEMA["$defs"][table]
    assert sorted(schema["required"]) == sorted(REQUIRED_FIELDS[table])
    assert sorted(schema["properties"]) == sorted(REQUIRED_FIELDS[table] + OPTIONAL_FIELDS[table])
    assert schema["additionalProperties"] is False


def test_node_kinds_match_the_supported_kinds() -> None:
    alternatives = [_resolve(sub["$ref"]) for sub in SCHEMA["$defs"]["node"]["oneOf"]]
    assert tuple(a["properties"]["kind"]["const"] for a in alternatives) == SUPPORTED_KINDS
    assert set(SUPPORTED_KINDS) <= set(REQUIRED_FIELDS)


def test_root_is_a_definition() -> None:
    assert SCHEMA["$ref"] == "#/$defs/definition"


# --- examples satisfy it --------------------------------------------------------------------------


def test_the_example_satisfies_the_schema() -> None:
    definition = parse_definition(EXAMPLE)
    assert schema_errors(json.loads(to_json(definition))) == []


@settings(max_examples=30, deadline=None)
@given(definition_mappings())
def test_valid_definitions_satisfy_the_schema(data: dict[str, Any]) -> None:
    definition = definition_from_mapping(data)
    assert schema_errors(json.loads(to_json(definition))) == []
    # As written, with optional fields left out, too.
    assert schema_errors(json.loads(json.dumps(data))) == []


# --- structural breakage is refused by both -----------------------------------------------------

WRONG_TYPE = {str: 7, int: "7", bool: "yes", list: "x", dict: 1.5}


@settings(max_examples=40, deadline=None)
@given(definition_mappings(), st.data())
def test_structural_breakage_is_refused_by_schema_and_validator(data: dict[str, Any], choice: st.DataObject) -> None:
    broken = copy.deepcopy(data)
    table = choice.draw(st.sampled_from([broken, *broken["nodes"]]))
    how = choice.draw(st.sampled_from(["drop", "unknown", "wrong_type", "kind"]))
    if how == "drop":
        key = choice.draw(st.sampled_from(REQUIRED_FIELDS["definition" if table is broken else table["kind"]]))
        del table[key]
    elif how == "unknown":
        table["colour"] = "red"
    elif how == "wrong_type":
        key = choice.draw(st.sampled_from(sorted(table)))
        table[key] = WRONG_TYPE[type(table[key])]
    else:
        table["kind"] = "parallel"
    assert schema_errors(broken), f"the schema accepts {broken!r}"
    with pytest.raises(DefinitionError):
        definition_from_mapping(broken)


def test_schema_ties_error_code_to_a_failed_end() -> None:
    end = SCHEMA["$defs"]["end"]
    assert schema_errors({"id": "x", "kind": "end", "revision": 1, "outcome": "failed", "error_code": "e"}, end) == []
    assert schema_errors({"id": "x", "kind": "end", "revision": 1, "outcome": "succeeded"}, end) == []
    assert schema_errors({"id": "x", "kind": "end", "revision": 1, "outcome": "failed"}, end) == ["$: missing 'error_code'"]
    assert schema_errors({"id": "x", "kind": "end", "revision": 1, "outcome": "succeeded", "error_code": "e"}, end)


def test_schema_refuses_a_wait_on_a_reserved_event_type_as_the_validator_does() -> None:
    data = json.loads(to_json(parse_definition(EXAMPLE)))
    wait = next(node for node in data["nodes"] if node["kind"] == "wait_for_event")
    wait["event_type"] = "fencekeeper.approval"
    assert schema_errors(data, SCHEMA)
    with pytest.raises(DefinitionError, match="is reserved"):
        definition_from_mapping(data)
    wait["event_type"] = "fencekeeper_approval.x"
    assert schema_errors(data, SCHEMA) == []
    definition_from_mapping(data)
