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
    for name, edit in _DEFINITION_EDITS:
        data = json.loads(json.dumps(base))
        edit(data)
        expected = evaluate_definition(data)
        cases.append(
            {
                "id": f"definition/{name}",
                "input": {"definition": data},
                "expected": expected,
                "normative": ["valid", "code", "node", "field"],
            }
        )
    return cases
