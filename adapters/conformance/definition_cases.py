"""The ``definitions`` layer (specs/definitions.md), generated from the kernel.

Rules of this module:

- Each case is the teaching definition in its JSON form with one edit;
  the expectation is the kernel's validation: valid, or the error code with
  the node and field to blame (never the message).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fencekeeper.kernel.definition import DefinitionError, definition_from_mapping, parse_definition, to_mapping

from .basis import Case

# --- definitions --------------------------------------------------------------------------

_EXAMPLE = """\
id = "purchase-approval"
revision = 1
start = "check_amount"
inputs = ["amount", "order_id"]

[[nodes]]
id = "check_amount"
kind = "condition"
revision = 1
expression = "input.amount >= 1000"
bindings = ["input.amount"]
true_next = "ask_manager"
false_next = "place_order"

[[nodes]]
id = "ask_manager"
kind = "request_approval"
revision = 1
operation = "purchase.approve"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
reviewers = ["user:manager"]
approved_next = "place_order"
rejected_next = "rejected"
timeout = { after_seconds = 86400, next = "rejected" }

[[nodes]]
id = "place_order"
kind = "local_command"
revision = 1
operation = "order.place"
next = "await_payment"
on_failure = "rejected"

[[nodes]]
id = "await_payment"
kind = "wait_for_event"
revision = 1
event_type = "payment.received"
correlation = { order_id = { from = "input.order_id" } }
next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "rejected"
kind = "end"
revision = 1
outcome = "failed"
error_code = "order_rejected"
"""

_DELETE = object()


def _edit(top: dict[str, Any] | None = None, node: str | None = None, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        target = data if node is None else next(n for n in data["nodes"] if n["id"] == node)
        for key, value in {**(top or {}), **fields}.items():
            if value is _DELETE:
                target.pop(key, None)
            else:
                target[key] = value
    return apply


_DEFINITION_EDITS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("valid", _edit()),
    ("unknown_top_level_field", _edit(colour="red")),
    ("missing_id", _edit(id=_DELETE)),
    ("missing_start", _edit(start=_DELETE)),
    ("missing_nodes", _edit(nodes=_DELETE)),
    ("bad_id", _edit(id="purchase approval")),
    ("revision_0", _edit(revision=0)),
    ("revision_boolean", _edit(revision=True)),
    ("revision_string", _edit(revision="1")),
    ("revision_too_big", _edit(revision=2**53)),
    ("title_not_string", _edit(title=7)),
    ("inputs_not_array", _edit(inputs="amount")),
    ("bad_input_name", _edit(inputs=["Amount"])),
    ("duplicate_input", _edit(inputs=["amount", "amount"])),
    ("start_names_nothing", _edit(start="nowhere")),
    ("unknown_node_field", _edit(node="done", colour="red")),
    ("unknown_kind", _edit(node="done", kind="teleport")),
    ("end_without_outcome", _edit(node="done", outcome=_DELETE)),
    ("end_bad_outcome", _edit(node="done", outcome="maybe")),
    ("failed_end_without_error_code", _edit(node="rejected", error_code=_DELETE)),
    ("succeeded_end_with_error_code", _edit(node="done", error_code="x")),
    ("condition_bad_expression", _edit(node="check_amount", expression="input.amount >= ")),
    ("condition_undeclared_binding", _edit(node="check_amount", expression="input.other >= 1")),
    ("condition_dangling_true_next", _edit(node="check_amount", true_next="nowhere")),
    ("node_revision_0", _edit(node="done", revision=0)),
    ("wait_without_event_type", _edit(node="await_payment", event_type=_DELETE)),
    ("wait_reserved_event_type", _edit(node="await_payment", event_type="fencekeeper.approval")),
    ("wait_bad_timeout", _edit(node="await_payment", timeout={"after_seconds": 0, "next": "done"})),
    ("approval_without_reviewers", _edit(node="ask_manager", reviewers=[])),
    ("command_without_operation", _edit(node="place_order", operation=_DELETE)),
    ("binding_of_undeclared_input", _edit(node="check_amount", bindings=["input.nothing"],
                                          expression="input.nothing >= 1")),
    ("float_revision", _edit(node="done", revision=1.5)),
]


def _append(*nodes: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda data: data["nodes"].extend(nodes)


def _condition(node_id: str, true_next: str, false_next: str) -> dict[str, Any]:
    return {"id": node_id, "kind": "condition", "revision": 1, "expression": "input.amount >= 1",
            "bindings": ["input.amount"], "true_next": true_next, "false_next": false_next}


def _typed(**extra: Any) -> Callable[[dict[str, Any]], None]:
    """The example's inputs in the typed form, with more inputs (or replaced ones) as given."""
    return _edit(inputs={"amount": {"type": "integer"}, "order_id": {"type": "string"}, **extra})


_ORDER = {"from": "input.order_id"}
_TARGET = {"id": _ORDER, "revision": 1}

# Cases 4.7.0: the choices specs/definitions.md (Validation, "first" is meant exactly) states, each
# on a definition an implementation that read the order otherwise would blame elsewhere.  A case
# file writes its keys sorted, so "the order written" is the sorted order on the wire.
_BLAME_EDITS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    # What a reference reads is blamed on the operand holding it; only its form on its `.from`.
    ("read/undeclared_input_in_correlation", _edit(node="await_payment", correlation={"order_id": {"from": "input.nothing"}})),
    ("read/undeclared_input_in_target_id", _edit(node="ask_manager", targets=[{"id": {"from": "input.nothing"}, "revision": 1}])),
    ("read/undeclared_input_in_target_revision", _edit(node="ask_manager",
                                                       targets=[{"id": _ORDER, "revision": {"from": "input.nothing"}}])),
    ("read/condition_output_in_target_id", _edit(node="ask_manager", targets=[{"id": {"from": "check_amount.x"}, "revision": 1}])),
    ("read/end_output_in_payload", _edit(node="place_order", payload={"amount": {"from": "done.x"}})),
    ("read/missing_node_in_payload", _edit(node="place_order", payload={"amount": {"from": "ghost.x"}})),
    ("read/own_output_in_payload", _edit(node="place_order", payload={"amount": {"from": "place_order.x"}})),
    ("read/malformed_binding_name_blames_from", _edit(node="await_payment", correlation={"order_id": {"from": "Order"}})),
    # A repeated target or policy is blamed on the later entry, not the list.
    ("repeat/target_blames_later_entry", _edit(node="ask_manager", targets=[_TARGET, {"id": "o-2", "revision": 1}, _TARGET])),
    ("repeat/policy_id_blames_later_entry", _edit(node="ask_manager", policies=[
        {"id": "p", "revision": 1}, {"id": "q", "revision": 1}, {"id": "p", "revision": 2}])),
    ("repeat/target_in_command_blames_later_entry", _edit(node="place_order", targets=[_TARGET, _TARGET])),
    # A key of a table of names that is not a name is blamed on the table, before its value.
    ("key/correlation_key_blames_table", _edit(node="await_payment", correlation={"order_id": _ORDER, "z-ref": "x"})),
    ("key/correlation_key_before_its_value", _edit(node="await_payment", correlation={"Order": {"from": "Order"}})),
    ("key/payload_key_blames_table", _edit(node="place_order", payload={"Amount": 1})),
    ("key/typed_input_key_blames_table", _typed(**{"z-note": {"type": "string"}})),
    ("key/typed_input_key_before_its_value", _typed(**{"Note": {"type": "money"}})),
    # A table of names is read entry by entry: an earlier entry's value is read before a later entry's key.
    ("key/correlation_value_before_a_later_key",
     _edit(node="await_payment", correlation={"order_id": {"from": "Bad"}, "z-ref": "x"})),
    ("key/payload_value_before_a_later_key", _edit(node="place_order", payload={"amount": 1.5, "z-ref": "x"})),
    ("key/typed_input_value_before_a_later_key", _typed(amount={"type": "money"}, **{"z-note": {"type": "string"}})),
    # Keywords that do not apply, and the bounds, in the fixed order whatever the order written.
    ("keyword/minimum_before_enum", _typed(flag={"type": "object", "enum": [1], "minimum": 1})),
    ("keyword/maximum_before_maxLength", _typed(flag={"type": "array", "maxLength": 1, "maximum": 1})),
    ("keyword/minLength_before_maxLength", _typed(flag={"type": "boolean", "maxLength": 1, "minLength": 0})),
    ("keyword/maxLength_before_enum", _typed(flag={"type": "object", "enum": [1], "maxLength": 1})),
    ("keyword/minimum_before_maximum", _typed(flag={"type": "string", "maximum": 1, "minimum": 1})),
    ("bound/minimum_before_maximum", _typed(count={"type": "integer", "maximum": "9", "minimum": "1"})),
    ("bound/minLength_before_maxLength", _typed(note={"type": "string", "maxLength": 5000, "minLength": -1})),
    # An entry of nodes that is not a table is blamed on nodes.
    ("nodes/entry_not_a_table", lambda data: data["nodes"].insert(1, "ask_manager")),
    ("nodes/entry_an_array", lambda data: data["nodes"].append([])),
    # A node's revision is read after its unknown and missing fields, before the fields of its kind.
    ("node/missing_field_before_revision", _edit(node="done", revision=0, outcome=_DELETE)),
    ("node/unknown_field_before_revision", _edit(node="done", revision=0, colour="red")),
    ("node/revision_before_kind_fields", _edit(node="done", revision=0, outcome="maybe")),
    # Unknown fields by the first written, missing fields in the order of their table.
    ("fields/unknown_first_as_written", _edit(node="done", zeta=1, alpha=1)),
    ("fields/unknown_before_missing", _edit(node="done", colour="red", outcome=_DELETE)),
    ("fields/missing_top_level_in_table_order", _edit(nodes=_DELETE, start=_DELETE)),
    ("fields/missing_revision_before_nodes", _edit(nodes=_DELETE, revision=_DELETE)),
    ("fields/missing_command_fields_in_table_order", _edit(node="place_order", operation=_DELETE, next=_DELETE)),
    ("fields/missing_wait_fields_in_table_order", _edit(node="await_payment", event_type=_DELETE, correlation=_DELETE)),
    # A condition-only cycle: found depth first from the first condition in file order.
    ("cycle/blames_node_where_it_closes", _append(_condition("c_a", "c_b", "done"), _condition("c_b", "c_c", "done"),
                                                  _condition("c_c", "c_b", "done"))),
    ("cycle/blames_continuation_into_the_path", _append(_condition("c_a", "done", "c_b"),
                                                        _condition("c_b", "done", "c_a"))),
    ("cycle/first_continuation_in_field_order", _append(_condition("c_a", "c_b", "c_b"),
                                                        _condition("c_b", "c_a", "c_a"))),
    ("cycle/from_first_condition_in_file_order", _append(_condition("c_b", "c_a", "done"),
                                                         _condition("c_a", "c_b", "done"))),
    ("cycle/true_next_explored_first", _append(_condition("c_a", "c_b", "done"), _condition("c_b", "c_c", "c_a"),
                                               _condition("c_c", "c_b", "done"))),
    ("cycle/condition_to_itself", _append(_condition("c_a", "done", "c_a"))),
    # An integer written with a fraction is a float, whatever its value.
    ("float/revision_written_1_0", _edit(revision=1.0)),
    ("float/node_revision_written_1_0", _edit(node="done", revision=1.0)),
    ("float/target_revision_written_1_0", _edit(node="ask_manager", targets=[{"id": _ORDER, "revision": 1.0}])),
    ("float/timeout_written_with_fraction", _edit(node="ask_manager", timeout={"after_seconds": 86400.0, "next": "rejected"})),
    ("float/policy_revision_written_1_0", _edit(node="ask_manager", policies=[{"id": "p", "revision": 1.0}])),
    ("float/typed_input_bound_written_1_0", _typed(count={"type": "integer", "minimum": 1.0})),
]


def _definition_result(data: dict[str, Any]) -> dict[str, Any]:
    try:
        definition = definition_from_mapping(data, "<case>")
    except DefinitionError as exc:
        return {"valid": False, "code": exc.code, "node": exc.node_id, "field": exc.field}
    return {"valid": True, "code": None, "node": None, "field": None, "start": definition.start}


def evaluate_definition(data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one definition case."""
    return _definition_result(data)


def definition_cases() -> list[Case]:
    base = to_mapping(parse_definition(_EXAMPLE))
    cases = []
    for name, edit in [*_DEFINITION_EDITS, *_BLAME_EDITS]:
        data = json.loads(json.dumps(base))
        edit(data)
        # Decided as the wire writes it: a case file's keys are sorted, so that is the order written.
        expected = evaluate_definition(json.loads(json.dumps(data, sort_keys=True)))
        cases.append(
            {
                "id": f"definition/{name}",
                "input": {"definition": data},
                "expected": expected,
                "normative": ["valid", "code", "node", "field"],
            }
        )
    return cases
