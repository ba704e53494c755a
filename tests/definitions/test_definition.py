"""Workflow definitions: the example reads exactly, every refusal names its culprit, registration keeps revisions immutable.

- The example of ``specs/definitions.md`` parses with every field where it
  belongs, round-trips through the canonical JSON form and TOML, and has a
  fixed digest (another implementation must compute the same one).
- Every refusal ``kernel/definition.py`` makes is provoked once, by editing
  the example, and must be a :class:`DefinitionError` whose ``node_id``,
  ``field`` and message say what was wrong.
- Lenient decoding keeps an unknown kind and a dangling continuation and
  nothing else.
- :func:`check_registration` accepts exactly the next revision, repeats
  idempotently, and refuses a changed revision or a reused node revision
  with different content.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import attrs
import pytest

from fencekeeper.kernel.definition import (
    MAX_INTEGER,
    SUPPORTED_KINDS,
    ConditionNode,
    Definition,
    DefinitionError,
    EndNode,
    InputType,
    LocalCommandNode,
    Node,
    PolicyRef,
    Ref,
    RequestApprovalNode,
    Target,
    Timeout,
    UnsupportedNode,
    WaitForEventNode,
    check_registration,
    continuations,
    definition_from_mapping,
    digest,
    from_json,
    parse_definition,
    reads,
    to_json,
    to_mapping,
)
from fencekeeper.kernel.errors import KernelError
from fencekeeper.kernel.expr import parse

from .examples import EXAMPLE, EXAMPLE_DIGEST
from .strategies import render_toml

ORDER = Target(object_id=Ref("input.order_id"), revision=Ref("input.order_revision"))


def example() -> Definition:
    return parse_definition(EXAMPLE, "approval.toml")


def example_data() -> dict[str, Any]:
    return tomllib.loads(EXAMPLE)


def node_data(data: dict[str, Any], node_id: str) -> dict[str, Any]:
    found: dict[str, Any] = next(n for n in data["nodes"] if n.get("id") == node_id)
    return found


def refusal(data: object, *, strict: bool = True) -> DefinitionError:
    with pytest.raises(DefinitionError) as caught:
        if strict:
            definition_from_mapping(data, "approval.toml")  # type: ignore[arg-type]
        else:
            from_json(json.dumps(data), strict=False, source="approval.toml")
    return caught.value


# --- the example ---------------------------------------------------------------------------------


def test_example_top_level_fields() -> None:
    d = example()
    assert (d.definition_id, d.revision, d.title, d.start) == ("purchase-approval", 1, "Purchase approval", "check_amount")
    assert d.inputs == ("amount", "order_id", "order_revision")
    assert [n.node_id for n in d.nodes] == ["check_amount", "ask_manager", "await_payment", "place_order", "done", "rejected"]
    assert [n.kind for n in d.nodes] == [
        "condition",
        "request_approval",
        "wait_for_event",
        "local_command",
        "end",
        "end",
    ]


def test_example_nodes_are_exactly_as_written() -> None:
    d = example()
    check = d.node("check_amount")
    assert isinstance(check, ConditionNode)
    assert check == ConditionNode(
        node_id="check_amount",
        revision=1,
        expression="input.amount >= 1000",
        bindings=("input.amount",),
        true_next="ask_manager",
        false_next="place_order",
        ast=parse("input.amount >= 1000"),
    )
    assert check.ast == parse("input.amount >= 1000")
    assert d.node("ask_manager") == RequestApprovalNode(
        node_id="ask_manager",
        revision=1,
        operation="purchase.approve",
        targets=(ORDER,),
        policies=(PolicyRef("purchasing", 3),),
        reviewers=("user:manager",),
        approved_next="place_order",
        rejected_next="rejected",
        distinct_reviewer=True,
        timeout=Timeout(after=timedelta(days=1), next="rejected"),
    )
    assert d.node("await_payment") == WaitForEventNode(
        node_id="await_payment",
        revision=1,
        event_type="payment.received",
        correlation=(("order_id", Ref("input.order_id")),),
        next="done",
        timeout=Timeout(after=timedelta(hours=1), next="rejected"),
    )
    assert d.node("place_order") == LocalCommandNode(
        node_id="place_order",
        revision=1,
        operation="order.place",
        targets=(ORDER,),
        payload=(("amount", Ref("input.amount")), ("channel", "web")),
        next="await_payment",
        on_failure="rejected",
    )
    assert d.node("done") == EndNode(node_id="done", revision=1, outcome="succeeded", error_code=None)
    assert d.node("rejected") == EndNode(node_id="rejected", revision=1, outcome="failed", error_code="order_rejected")


def test_node_lookup_and_successors() -> None:
    d = example()
    assert d.node("nowhere") is None
    assert all(d.node(n.node_id) is n for n in d.nodes)
    successors = {n.node_id: d.successors(n) for n in d.nodes}
    assert successors == {
        "check_amount": ("ask_manager", "place_order"),
        "ask_manager": ("place_order", "rejected", "rejected"),
        "await_payment": ("done", "rejected"),
        "place_order": ("await_payment", "rejected"),
        "done": (),
        "rejected": (),
    }
    ask = d.node("ask_manager")
    assert ask is not None
    assert continuations(ask) == (
        ("approved_next", "place_order"),
        ("rejected_next", "rejected"),
        ("timeout.next", "rejected"),
    )
    place = d.node("place_order")
    assert place is not None
    assert reads(place) == (
        ("targets[0].id", "input.order_id"),
        ("targets[0].revision", "input.order_revision"),
        ("payload.amount", "input.amount"),
    )


def test_defaults_of_optional_fields() -> None:
    data = example_data()
    del data["title"], data["inputs"]
    ask = node_data(data, "ask_manager")
    del ask["policies"], ask["distinct_reviewer"], ask["timeout"]
    ask["targets"] = [{"id": "order-1", "revision": 4}]
    place = node_data(data, "place_order")
    del place["targets"], place["payload"]
    del node_data(data, "await_payment")["timeout"]
    node_data(data, "check_amount")["expression"] = "true"
    node_data(data, "check_amount")["bindings"] = []
    node_data(data, "await_payment")["correlation"] = {"channel": "web"}
    d = definition_from_mapping(data)
    assert (d.title, d.inputs) == ("", ())
    approval = d.node("ask_manager")
    assert isinstance(approval, RequestApprovalNode)
    assert (approval.policies, approval.distinct_reviewer, approval.timeout) == ((), True, None)
    assert approval.targets == (Target(object_id="order-1", revision=4),)
    command = d.node("place_order")
    assert isinstance(command, LocalCommandNode)
    assert (command.targets, command.payload) == ((), ())


def test_names_are_stored_sorted_so_order_written_does_not_matter() -> None:
    data = example_data()
    data["inputs"] = ["order_revision", "amount", "order_id"]
    node_data(data, "ask_manager")["reviewers"] = ["user:z", "user:a"]
    node_data(data, "place_order")["payload"] = {"channel": "web", "amount": {"from": "input.amount"}}
    node_data(data, "check_amount")["bindings"] = ["input.order_id", "input.amount"]
    d = definition_from_mapping(data)
    assert d.inputs == ("amount", "order_id", "order_revision")
    approval = d.node("ask_manager")
    assert isinstance(approval, RequestApprovalNode)
    assert approval.reviewers == ("user:a", "user:z")
    command = d.node("place_order")
    assert isinstance(command, LocalCommandNode)
    assert [key for key, _ in command.payload] == ["amount", "channel"]
    condition = d.node("check_amount")
    assert isinstance(condition, ConditionNode)
    assert condition.bindings == ("input.amount", "input.order_id")


def test_unused_declared_bindings_are_fine() -> None:
    data = example_data()
    node_data(data, "check_amount")["bindings"] = ["input.amount", "input.order_id", "place_order.result"]
    condition = definition_from_mapping(data).node("check_amount")
    assert isinstance(condition, ConditionNode)
    assert condition.bindings == ("input.amount", "input.order_id", "place_order.result")


def test_acting_nodes_outputs_may_be_read() -> None:
    data = example_data()
    node_data(data, "place_order")["payload"]["approved_by"] = {"from": "ask_manager.reviewer"}
    node_data(data, "await_payment")["correlation"]["command"] = {"from": "place_order.command_id"}
    d = definition_from_mapping(data)
    command = d.node("place_order")
    assert isinstance(command, LocalCommandNode)
    assert dict(command.payload)["approved_by"] == Ref("ask_manager.reviewer")


def test_cycles_through_acting_nodes_are_allowed() -> None:
    data = example_data()
    node_data(data, "await_payment")["timeout"]["next"] = "check_amount"
    d = definition_from_mapping(data)
    wait = d.node("await_payment")
    assert wait is not None
    assert d.successors(wait) == ("done", "check_amount")


# --- JSON, TOML and the digest ----------------------------------------------------------------------


def test_json_round_trip() -> None:
    d = example()
    text = to_json(d)
    assert from_json(text) == d
    assert to_json(from_json(text)) == text
    assert json.loads(text) == to_mapping(d)


def test_json_is_canonical() -> None:
    d = attrs.evolve(example(), title='Bestellfreigabe "café"\n')
    text = to_json(d)
    # Keys sorted, no whitespace between tokens, characters written as UTF-8
    # and only '"', '\\' and control characters escaped (RFC 8785).
    assert text.startswith('{"id":"purchase-approval","inputs":["amount","order_id","order_revision"],"nodes":[{')
    assert text.endswith(',"revision":1,"start":"check_amount","title":"Bestellfreigabe \\"café\\"\\n"}')
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_toml_round_trip() -> None:
    d = example()
    assert parse_definition(render_toml(to_mapping(d))) == d


def test_digest_is_fixed_and_is_the_sha256_of_the_json() -> None:
    d = example()
    assert digest(d) == EXAMPLE_DIGEST
    assert digest(d) == "sha256:" + hashlib.sha256(to_json(d).encode("utf-8")).hexdigest()
    assert digest(parse_definition(EXAMPLE)) == digest(d)


def test_digest_ignores_how_the_text_was_written() -> None:
    data = example_data()
    data["inputs"].reverse()
    data = {key: data[key] for key in reversed(list(data))}
    node_data(data, "place_order")["payload"] = {"channel": "web", "amount": {"from": "input.amount"}}
    assert digest(definition_from_mapping(data)) == EXAMPLE_DIGEST


def _changed(field: attrs.Attribute[Any], value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        assert value, f"the example needs a non-empty {field.name} to vary it"
        return value[:-1]
    if isinstance(value, Timeout):
        return attrs.evolve(value, after=value.after + timedelta(seconds=1))
    assert value is None, field.name
    if field.name == "input_types":
        # Names only -> the same names typed: a different definition, with a different digest.
        return tuple(InputType(name, "string") for name in ("amount", "order_id", "order_revision"))
    return Timeout(after=timedelta(seconds=5), next="done") if field.name == "timeout" else "code"


def _every_variation(d: Definition) -> list[tuple[str, Definition]]:
    """The example with one field changed, for every field of it and of its nodes."""
    variations = []
    for field in attrs.fields(Definition):
        if field.name not in ("nodes", "_index"):
            change: dict[str, Any] = {field.name: _changed(field, getattr(d, field.name))}
            variations.append((field.name, attrs.evolve(d, **change)))
    for number, node in enumerate(d.nodes):
        for field in attrs.fields(type(node)):
            if field.name == "ast":
                continue
            node_change: dict[str, Any] = {field.name: _changed(field, getattr(node, field.name))}
            nodes = (*d.nodes[:number], attrs.evolve(node, **node_change), *d.nodes[number + 1 :])
            variations.append((f"{node.node_id}.{field.name}", attrs.evolve(d, nodes=nodes)))
    return variations


def test_digest_changes_with_every_field() -> None:
    d = example()
    variations = _every_variation(d)
    assert len(variations) > 40
    digests = {name: digest(v) for name, v in variations}
    assert EXAMPLE_DIGEST not in digests.values()
    assert len(set(digests.values())) == len(digests)


@pytest.mark.parametrize(("one", "other"), [(True, 1), (False, 0), (1, "1")])
def test_an_operand_type_is_part_of_its_identity(one: object, other: object) -> None:
    # Python says True == 1; a definition does not, and neither does its JSON.
    def variant(value: object) -> Definition:
        data = example_data()
        node_data(data, "place_order")["payload"]["channel"] = value
        node_data(data, "place_order")["targets"] = [{"id": "order-1", "revision": {"from": "input.order_revision"}}]
        node_data(data, "await_payment")["correlation"]["flag"] = value
        return definition_from_mapping(data)

    a, b = variant(one), variant(other)
    assert a != b
    assert a.node("place_order") != b.node("place_order")
    assert a.node("await_payment") != b.node("await_payment")
    assert digest(a) != digest(b)
    with pytest.raises(DefinitionError, match="already registered with different content"):
        check_registration(b, [a])
    assert Target(object_id="o", revision=1) != Target(object_id="o", revision=True)
    assert hash(Target(object_id="o", revision=1)) == hash(Target(object_id="o", revision=1))


def test_equality_and_hash_ignore_the_parsed_tree() -> None:
    a, b = example(), example()
    assert a == b and hash(a) == hash(b)
    assert a.nodes[0] is not b.nodes[0]


# --- the error ----------------------------------------------------------------------------------------


def test_error_names_source_node_and_field() -> None:
    data = example_data()
    node_data(data, "ask_manager")["approved_next"] = "place"
    error = refusal(data)
    assert str(error) == "approval.toml: node 'ask_manager': field 'approved_next': continuation 'place' names no node"
    assert (error.source, error.node_id, error.field) == ("approval.toml", "ask_manager", "approved_next")
    assert error.problem == "continuation 'place' names no node"
    assert error.code == "invalid_definition"
    assert isinstance(error, KernelError)


def test_error_without_node_or_field() -> None:
    assert str(DefinitionError("x.toml", "problem")) == "x.toml: problem"
    assert str(DefinitionError("x.toml", "problem", field="start")) == "x.toml: field 'start': problem"
    assert str(DefinitionError("x.toml", "problem", node_id="a")) == "x.toml: node 'a': problem"


# --- refusals --------------------------------------------------------------------------------------

DELETE = object()


def top(**changes: object) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for key, value in changes.items():
            if value is DELETE:
                del data[key]
            else:
                data[key] = copy.deepcopy(value)

    return edit


def at(node_id: str, **changes: object) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        top(**changes)(node_data(data, node_id))

    return edit


def add_nodes(*nodes: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["nodes"].extend(copy.deepcopy(list(nodes)))

    return edit


def both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        for e in edits:
            e(data)

    return edit


def end(node_id: str) -> dict[str, Any]:
    return {"id": node_id, "kind": "end", "revision": 1, "outcome": "succeeded"}


def condition(node_id: str, true_next: str, false_next: str) -> dict[str, Any]:
    return {
        "id": node_id,
        "kind": "condition",
        "revision": 1,
        "expression": "true",
        "bindings": [],
        "true_next": true_next,
        "false_next": false_next,
    }


ORDER_DATA = {"id": {"from": "input.order_id"}, "revision": {"from": "input.order_revision"}}


def typed(**changes: Any) -> Callable[[dict[str, Any]], None]:
    """The example's three inputs declared with types, ``changes`` merged into (or replacing) one each."""
    inputs: dict[str, Any] = {
        "amount": {"type": "integer", "minimum": 1},
        "order_id": {"type": "string", "maxLength": 64},
        "order_revision": {"type": "integer", "minimum": 1},
    }
    for name, change in changes.items():
        if isinstance(change, dict):
            merged = change if name not in inputs or "type" in change else inputs[name] | change
            inputs[name] = {key: value for key, value in merged.items() if value is not DELETE}
        else:
            inputs[name] = change
    return top(inputs=inputs)
MANY = {f"k{i}": "v" for i in range(17)}

REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str | None, str | None, str]] = [
    # top level
    ("unknown top-level field", top(colour="red"), None, "colour", "unknown top-level field 'colour'; allowed: id, revision"),
    ("unknown top-level fields", top(colour="red", size=3), None, "colour", "unknown top-level fields 'colour', 'size'"),
    ("missing id", top(id=DELETE), None, "id", "missing required top-level field 'id'"),
    ("missing revision", top(revision=DELETE), None, "revision", "missing required top-level field 'revision'"),
    ("missing start", top(start=DELETE), None, "start", "missing required top-level field 'start'"),
    ("missing nodes", top(nodes=DELETE), None, "nodes", "missing required top-level field 'nodes'"),
    ("bad definition id", top(id="purchase approval"), None, "id", "'purchase approval' is not a valid definition id"),
    ("revision 0", top(revision=0), None, "revision", "must be between 1 and 9007199254740991, found 0"),
    ("revision boolean", top(revision=True), None, "revision", "must be an integer, found boolean"),
    ("revision string", top(revision="1"), None, "revision", "must be an integer, found string"),
    ("revision float", top(revision=1.5), None, "revision", "found float 1.5 (floats are not allowed in definitions"),
    ("revision too big", top(revision=2**53), None, "revision", "must be between 1 and 9007199254740991"),
    ("title not a string", top(title=7), None, "title", "must be a string, found integer"),
    ("title too long", top(title="x" * 257), None, "title", "is 257 characters long; at most 256 are allowed"),
    ("inputs not an array", top(inputs="amount"), None, "inputs", "must be an array of input names or a table of input name -> type, found string"),
    ("bad input name", top(inputs=["Amount"]), None, "inputs[0]", "'Amount' is not a valid input name"),
    ("dotted input name", top(inputs=["order.id"]), None, "inputs[0]", "'order.id' is not a valid input name"),
    ("duplicate input", top(inputs=["amount", "order_id", "order_revision", "amount"]), None, "inputs", "lists input name 'amount' twice"),
    # typed inputs
    ("typed input not a table", typed(amount="integer"), None, "inputs.amount", "must be a table, found string"),
    ("typed input without type", typed(amount={"minimum": 1, "type": DELETE}), None, "inputs.amount.type", "missing required input field 'type'"),
    ("typed input bad name", typed(Amount={"type": "string"}), None, "inputs", "'Amount' is not a valid input name"),
    ("unknown input type", typed(amount={"type": "money"}), None, "inputs.amount.type", "'money' is not an input type; the types are string, integer"),
    ("unknown input keyword", typed(amount={"pattern": "x"}), None, "inputs.amount.pattern", "unknown input field 'pattern'; allowed: type, description, required"),
    ("minimum on a string", typed(order_id={"minimum": 1}), None, "inputs.order_id.minimum", "applies to integer and number inputs, not to a string input"),
    ("maxLength on an integer", typed(amount={"maxLength": 3}), None, "inputs.amount.maxLength", "applies to string inputs, not to an integer input"),
    ("enum on an object", typed(extra={"type": "object", "enum": [1]}), None, "inputs.extra.enum", "applies to string and integer and number and boolean inputs"),
    ("float minimum", typed(amount={"minimum": 0.5}), None, "inputs.amount.minimum", "floats are not allowed in definitions"),
    ("minimum above maximum", typed(amount={"minimum": 10, "maximum": 9}), None, "inputs.amount.maximum", "is 9, below minimum 10"),
    ("maxLength too long", typed(order_id={"maxLength": 5000}), None, "inputs.order_id.maxLength", "must be between 0 and 4096, found 5000"),
    ("negative minLength", typed(order_id={"minLength": -1}), None, "inputs.order_id.minLength", "must be between 0 and 4096, found -1"),
    ("required not a boolean", typed(amount={"required": "yes"}), None, "inputs.amount.required", "must be true or false, found string"),
    ("empty enum", typed(order_id={"enum": []}), None, "inputs.order_id.enum", "must list 1 to 64 entries, found 0"),
    ("enum of the wrong type", typed(order_id={"enum": ["o-1", 2]}), None, "inputs.order_id.enum[1]", "must be a string, found integer, so it could never be admitted"),
    ("enum outside the bounds", typed(amount={"enum": [5, 50], "maximum": 10}), None, "inputs.amount.enum[1]", "50 is above the maximum 10, so it could never be admitted"),
    ("enum repeats", typed(amount={"enum": [5, 5]}), None, "inputs.amount.enum", "lists 5 twice"),
    ("enum reference", typed(amount={"enum": [{"from": "input.amount"}]}), None, "inputs.amount.enum[0]", "must be a literal value, not a reference"),
    ("object input read by a node", typed(order_id={"type": "object"}), "ask_manager", "targets[0].id", "reads 'input.order_id', an object input; a node reads only strings, numbers and booleans"),
    ("array input read by a condition", typed(amount={"type": "array"}), "check_amount", "bindings", "reads 'input.amount', an array input"),
    ("typed input undeclared", top(inputs={"amount": {"type": "integer"}, "order_id": {"type": "string"}}), "ask_manager", "targets[0].revision", "'order_revision' is not a declared input"),
    ("too many inputs", top(inputs=[f"i{n}" for n in range(65)]), None, "inputs", "must list at most 64 entries, found 65"),
    ("start names no node", top(start="nowhere"), None, "start", "start 'nowhere' names no node"),
    ("bad start", top(start="Check"), None, "start", "'Check' is not a valid node id"),
    ("nodes a table", top(nodes={"a": 1}), None, "nodes", "must be an array of tables ([[nodes]]), found table"),
    ("no nodes", top(nodes=[]), None, "nodes", "must list 1 to 200 nodes, found 0"),
    ("too many nodes", top(nodes=[end(f"n{i}") for i in range(201)]), None, "nodes", "must list 1 to 200 nodes, found 201"),
    ("node not a table", top(nodes=["done"]), None, "nodes", "node #1 must be a table, found string"),
    # every node
    ("node without id", at("ask_manager", id=DELETE), None, "id", "node #2 has no 'id'"),
    ("node id not a string", at("ask_manager", id=2), None, "id", "node #2: must be a string, found integer"),
    ("bad node id", at("ask_manager", id="Ask-Manager"), None, "id", "node #2: 'Ask-Manager' is not a valid node id"),
    ("reserved node id", at("ask_manager", id="input"), None, "id", "the node id 'input' is reserved"),
    ("duplicate node id", at("await_payment", id="check_amount"), "check_amount", "id", "duplicate node id 'check_amount' (also node #1)"),
    ("missing kind", at("done", kind=DELETE), "done", "kind", "missing required field 'kind'"),
    ("kind not a string", at("done", kind=5), "done", "kind", "must be a string, found integer"),
    (
        "unknown kind",
        at("done", kind="parallel"),
        "done",
        "kind",
        "unknown node kind 'parallel'; supported: condition, wait_for_event, request_approval, local_command, end",
    ),
    ("unknown node field", at("check_amount", colour="red"), "check_amount", "colour", "unknown condition node field 'colour'; allowed: id, kind"),
    ("unknown node fields", at("done", a=1, b=2), "done", "a", "unknown end node fields 'a', 'b'"),
    ("field of another kind", at("done", next="rejected"), "done", "next", "unknown end node field 'next'"),
    ("node revision 0", at("done", revision=0), "done", "revision", "must be between 1 and"),
    ("node revision float", at("done", revision=1.0), "done", "revision", "found float 1.0 (floats are not allowed"),
    ("continuation not a string", at("place_order", next=5), "place_order", "next", "must be a string, found integer"),
    ("bad continuation", at("place_order", next="Await"), "place_order", "next", "'Await' is not a valid node id"),
    # condition
    ("expression not a string", at("check_amount", expression=1000), "check_amount", "expression", "must be a string, found integer"),
    ("empty expression", at("check_amount", expression=" "), "check_amount", "expression", "at position 0: the expression is empty"),
    ("expression syntax", at("check_amount", expression="input.amount >= "), "check_amount", "expression", "at position 16: expected a value after '>='"),
    (
        "expression reads undeclared binding",
        at("check_amount", expression="input.amount >= 1000 and input.total < 5"),
        "check_amount",
        "expression",
        "reads 'input.total', which is not among its declared bindings",
    ),
    ("bindings not an array", at("check_amount", bindings="input.amount"), "check_amount", "bindings", "must be an array, found string"),
    ("bad binding name", at("check_amount", bindings=["amount"]), "check_amount", "bindings[0]", "'amount' is not a valid binding name"),
    ("duplicate binding", at("check_amount", bindings=["input.amount", "input.amount"]), "check_amount", "bindings", "lists binding name 'input.amount' twice"),
    (
        "binding of an undeclared input",
        at("check_amount", bindings=["input.amount", "input.total"]),
        "check_amount",
        "bindings",
        "reads 'input.total', but 'total' is not a declared input",
    ),
    # wait_for_event
    ("bad event type", at("await_payment", event_type="payment received"), "await_payment", "event_type", "is not a valid event type"),
    ("correlation not a table", at("await_payment", correlation=[]), "await_payment", "correlation", "must be a table, found array"),
    ("empty correlation", at("await_payment", correlation={}), "await_payment", "correlation", "must have 1 to 16 entries, found 0"),
    ("too many correlation predicates", at("await_payment", correlation=MANY), "await_payment", "correlation", "must have 1 to 16 entries, found 17"),
    ("bad correlation key", at("await_payment", correlation={"OrderId": 1}), "await_payment", "correlation", "'OrderId' is not a valid key"),
    ("long correlation string", at("await_payment", correlation={"order_id": "x" * 257}), "await_payment", "correlation.order_id", "at most 256"),
    ("correlation float", at("await_payment", correlation={"amount": 2.5}), "await_payment", "correlation.amount", "found float 2.5"),
    (
        "reference with an extra field",
        at("await_payment", correlation={"order_id": {"from": "input.order_id", "default": 1}}),
        "await_payment",
        "correlation.order_id.default",
        "unknown reference field 'default'",
    ),
    ("reference without from", at("await_payment", correlation={"order_id": {}}), "await_payment", "correlation.order_id.from", "missing required reference field 'from'"),
    ("bad reference name", at("await_payment", correlation={"order_id": {"from": "input"}}), "await_payment", "correlation.order_id.from", "'input' is not a valid binding name"),
    ("timeout not a table", at("await_payment", timeout=3600), "await_payment", "timeout", "must be a table, found integer"),
    ("timeout zero", at("await_payment", timeout={"after_seconds": 0, "next": "rejected"}), "await_payment", "timeout.after_seconds", "must be between 1 and 31622400, found 0"),
    ("timeout over 366 days", at("await_payment", timeout={"after_seconds": 366 * 86400 + 1, "next": "rejected"}), "await_payment", "timeout.after_seconds", "found 31622401"),
    ("timeout float", at("await_payment", timeout={"after_seconds": 1.5, "next": "rejected"}), "await_payment", "timeout.after_seconds", "floats are not allowed"),
    ("timeout without next", at("await_payment", timeout={"after_seconds": 5}), "await_payment", "timeout.next", "missing required timeout field 'next'"),
    ("timeout unknown field", at("await_payment", timeout={"after_seconds": 5, "next": "done", "at": "x"}), "await_payment", "timeout.at", "unknown timeout field 'at'"),
    # request_approval
    ("bad operation", at("ask_manager", operation=""), "ask_manager", "operation", "'' is not a valid operation id"),
    ("no targets", at("ask_manager", targets=[]), "ask_manager", "targets", "must list 1 to 16 entries, found 0"),
    ("too many targets", at("ask_manager", targets=[{"id": f"o{i}", "revision": 1} for i in range(17)]), "ask_manager", "targets", "must list 1 to 16 entries, found 17"),
    ("target not a table", at("ask_manager", targets=["order"]), "ask_manager", "targets[0]", "must be a table, found string"),
    ("target revision 0", at("ask_manager", targets=[{"id": "o", "revision": 0}]), "ask_manager", "targets[0].revision", "must be between 1 and"),
    ("target revision string", at("ask_manager", targets=[{"id": "o", "revision": "3"}]), "ask_manager", "targets[0].revision", 'must be an integer or { from = "<binding>" }, found string'),
    ("target id integer", at("ask_manager", targets=[{"id": 5, "revision": 1}]), "ask_manager", "targets[0].id", 'must be a string or { from = "<binding>" }, found integer'),
    ("target id empty", at("ask_manager", targets=[{"id": "", "revision": 1}]), "ask_manager", "targets[0].id", "must not be empty"),
    ("repeated target", at("ask_manager", targets=[ORDER_DATA, ORDER_DATA]), "ask_manager", "targets[1]", "repeats targets[0]"),
    ("target without revision", at("ask_manager", targets=[{"id": "o"}]), "ask_manager", "targets[0].revision", "missing required target field 'revision'"),
    ("target unknown field", at("ask_manager", targets=[{"id": "o", "revision": 1, "type": "order"}]), "ask_manager", "targets[0].type", "unknown target field 'type'"),
    ("too many policies", at("ask_manager", policies=[{"id": f"p{i}", "revision": 1} for i in range(17)]), "ask_manager", "policies", "must list at most 16 entries, found 17"),
    ("repeated policy", at("ask_manager", policies=[{"id": "p", "revision": 1}, {"id": "p", "revision": 2}]), "ask_manager", "policies[1]", "lists policy 'p' twice"),
    ("policy revision boolean", at("ask_manager", policies=[{"id": "p", "revision": True}]), "ask_manager", "policies[0].revision", "must be an integer, found boolean"),
    ("bad policy id", at("ask_manager", policies=[{"id": "-p", "revision": 1}]), "ask_manager", "policies[0].id", "'-p' is not a valid policy id"),
    ("no reviewers", at("ask_manager", reviewers=[]), "ask_manager", "reviewers", "must list 1 to 64 entries, found 0"),
    ("too many reviewers", at("ask_manager", reviewers=[f"user:{i}" for i in range(65)]), "ask_manager", "reviewers", "must list 1 to 64 entries, found 65"),
    ("bad reviewer", at("ask_manager", reviewers=["user manager"]), "ask_manager", "reviewers[0]", "'user manager' is not a valid reviewer id"),
    ("repeated reviewer", at("ask_manager", reviewers=["user:m", "user:m"]), "ask_manager", "reviewers", "lists reviewer id 'user:m' twice"),
    ("distinct_reviewer not a boolean", at("ask_manager", distinct_reviewer="yes"), "ask_manager", "distinct_reviewer", "must be true or false, found string"),
    # local_command
    ("too many payload entries", at("place_order", payload={f"k{i}": i for i in range(65)}), "place_order", "payload", "must have at most 64 entries, found 65"),
    ("payload integer too big", at("place_order", payload={"amount": 2**53}), "place_order", "payload.amount", "must be between -9007199254740991 and 9007199254740991"),
    ("payload float", at("place_order", payload={"amount": 12.5}), "place_order", "payload.amount", "found float 12.5 (floats are not allowed"),
    ("payload array", at("place_order", payload={"amount": [1]}), "place_order", "payload.amount", 'a boolean or { from = "<binding>" }, found array'),
    ("bad payload key", at("place_order", payload={"Amount": 1}), "place_order", "payload", "'Amount' is not a valid key"),
    ("long payload string", at("place_order", payload={"note": "é" * 257}), "place_order", "payload.note", "is 257 characters long"),
    ("too many command targets", at("place_order", targets=[{"id": f"o{i}", "revision": 1} for i in range(17)]), "place_order", "targets", "must list at most 16 entries, found 17"),
    # end
    ("bad outcome", at("done", outcome="cancelled"), "done", "outcome", "must be 'succeeded' or 'failed', found 'cancelled'"),
    ("failed without error code", at("rejected", error_code=DELETE), "rejected", "error_code", "an end node with outcome 'failed' needs an error code"),
    ("succeeded with error code", at("done", error_code="oops"), "done", "error_code", "only an end node with outcome 'failed' has an error code"),
    ("bad error code", at("rejected", error_code="order rejected"), "rejected", "error_code", "'order rejected' is not a valid error code"),
    # the graph
    ("dangling true_next", at("check_amount", true_next="ask"), "check_amount", "true_next", "continuation 'ask' names no node"),
    ("dangling false_next", at("check_amount", false_next="place"), "check_amount", "false_next", "continuation 'place' names no node"),
    ("dangling approved_next", at("ask_manager", approved_next="place"), "ask_manager", "approved_next", "continuation 'place' names no node"),
    ("dangling rejected_next", at("ask_manager", rejected_next="reject"), "ask_manager", "rejected_next", "continuation 'reject' names no node"),
    ("dangling approval timeout", at("ask_manager", timeout={"after_seconds": 5, "next": "gone"}), "ask_manager", "timeout.next", "continuation 'gone' names no node"),
    ("dangling wait next", at("await_payment", next="finished"), "await_payment", "next", "continuation 'finished' names no node"),
    ("dangling wait timeout", at("await_payment", timeout={"after_seconds": 5, "next": "gone"}), "await_payment", "timeout.next", "continuation 'gone' names no node"),
    ("dangling command next", at("place_order", next="pay"), "place_order", "next", "continuation 'pay' names no node"),
    ("dangling on_failure", at("place_order", on_failure="failed"), "place_order", "on_failure", "continuation 'failed' names no node"),
    ("unreachable node", add_nodes(end("orphan")), "orphan", None, "not reachable from start 'check_amount', so it can never run"),
    (
        "unreachable island",
        add_nodes(condition("island", "orphan", "orphan"), end("orphan")),
        "island",
        None,
        "not reachable from start 'check_amount'",
    ),
    (
        "condition cycle",
        both(
            at("check_amount", false_next="loop_a"),
            add_nodes(condition("loop_a", "loop_b", "place_order"), condition("loop_b", "loop_a", "done")),
        ),
        "loop_a",
        "true_next",
        "condition cycle loop_a -> loop_b -> loop_a: condition nodes alone can never wait, act or end",
    ),
    ("condition self-loop", at("check_amount", false_next="check_amount"), "check_amount", "false_next", "condition cycle check_amount -> check_amount"),
    # bindings
    ("reference to an undeclared input", at("place_order", payload={"amount": {"from": "input.total"}}), "place_order", "payload.amount", "reads 'input.total', but 'total' is not a declared input"),
    ("reference to no node", at("place_order", payload={"amount": {"from": "ghost.amount"}}), "place_order", "payload.amount", "reads 'ghost.amount', but no node 'ghost' exists"),
    ("reference to a condition", at("place_order", payload={"ok": {"from": "check_amount.result"}}), "place_order", "payload.ok", "'check_amount' is a condition node, which has no outputs"),
    ("reference to an end node", at("place_order", payload={"ok": {"from": "done.outcome"}}), "place_order", "payload.ok", "'done' is an end node, which has no outputs"),
    ("reference to itself", at("place_order", payload={"ok": {"from": "place_order.result"}}), "place_order", "payload.ok", "reads 'place_order.result', its own output"),
    ("target reference to no node", at("ask_manager", targets=[{"id": {"from": "ghost.id"}, "revision": 1}]), "ask_manager", "targets[0].id", "no node 'ghost' exists"),
    ("correlation reference to itself", at("await_payment", correlation={"x": {"from": "await_payment.x"}}), "await_payment", "correlation.x", "its own output"),
    ("condition binding of an end node", at("check_amount", bindings=["input.amount", "done.x"]), "check_amount", "bindings", "'done' is an end node"),
]


@pytest.mark.parametrize(
    ("edit", "node_id", "field", "message"),
    [pytest.param(*case[1:], id=case[0]) for case in REFUSALS],
)
def test_refusal(edit: Callable[[dict[str, Any]], None], node_id: str | None, field: str | None, message: str) -> None:
    data = example_data()
    edit(data)
    error = refusal(data)
    assert (error.node_id, error.field) == (node_id, field), str(error)
    assert message in error.problem, str(error)
    assert str(error).startswith("approval.toml: ")
    assert "\n" not in str(error)
    # The JSON form is refused identically.
    with pytest.raises(DefinitionError) as from_stored:
        from_json(json.dumps(data), source="approval.toml")
    assert str(from_stored.value) == str(error)


def test_refusal_table_is_not_vacuous() -> None:
    # Guards the table: each edit must really change the example.
    for name, edit, *_ in REFUSALS:
        data = example_data()
        edit(data)
        assert json.dumps(data) != json.dumps(example_data()), name


def test_expression_error_keeps_its_position() -> None:
    data = example_data()
    node_data(data, "check_amount")["expression"] = "input.amount >= "
    error = refusal(data)
    assert error.position == 16


# --- text that is not a definition ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('id = "x"\nrevision = \n', "not valid TOML: Invalid value (at line 2, column 12)"),
        ('id = "x"\nid = "y"\n', "not valid TOML"),
    ],
)
def test_toml_syntax_errors_carry_line_and_column(text: str, message: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text, "bad.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("bad.toml: not valid TOML")
    assert "line" in str(caught.value)


def test_toml_table_of_nodes_is_refused() -> None:
    text = EXAMPLE.replace("[[nodes]]", "[nodes]", 1).split("[[nodes]]")[0]
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text)
    assert caught.value.field == "nodes"
    assert "must be an array of tables ([[nodes]]), found table" in str(caught.value)


def test_toml_float_is_refused_with_a_reason() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(EXAMPLE.replace("revision = 3", "revision = 3.0"))
    assert caught.value.field == "policies[0].revision"
    assert "floats are not allowed in definitions; use an integer or a string" in str(caught.value)


def test_toml_datetime_is_named() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_definition(EXAMPLE.replace('title = "Purchase approval"', "title = 2026-11-02T12:48:00Z"))
    assert (caught.value.field, caught.value.problem) == ("title", "must be a string, found datetime")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("[1]", "a definition must be a table (a JSON object), found array"),
        ('"x"', "a definition must be a table (a JSON object), found string"),
        ('{"id": "a", "id": "b"}', "not valid JSON: duplicate key 'id' in an object"),
        ('{"revision": NaN}', "not valid JSON: NaN is not a JSON number"),
        ("[" * 100_000, "not valid JSON: nested too deeply"),
    ],
)
def test_json_that_is_not_a_definition(text: str, message: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        from_json(text, source="stored")
    assert str(caught.value) == f"stored: {message}"


def test_json_null_and_surrogates_are_refused() -> None:
    data = to_mapping(example())
    data["title"] = None
    with pytest.raises(DefinitionError, match="field 'title': must be a string, found null"):
        from_json(json.dumps(data))
    text = to_json(example()).replace("Purchase approval", "\\ud800")
    with pytest.raises(DefinitionError, match=r"unpaired surrogate \(U\+D800\)"):
        from_json(text)


# --- lenient decoding ----------------------------------------------------------------------------------


def _with_parallel_node() -> dict[str, Any]:
    data = to_mapping(example())
    nodes: list[dict[str, Any]] = data["nodes"]  # type: ignore[assignment]
    nodes.append({"id": "fan_out", "kind": "parallel", "revision": 2, "branches": ["done", "rejected"]})
    nodes[-1]["then"] = "later"
    node_data(data, "place_order")["next"] = "fan_out"
    return data


def test_unknown_kind_is_refused_strictly() -> None:
    with pytest.raises(DefinitionError) as caught:
        from_json(json.dumps(_with_parallel_node()))
    assert (caught.value.node_id, caught.value.field) == ("fan_out", "kind")
    assert "unknown node kind 'parallel'" in str(caught.value)


def test_unknown_kind_becomes_unsupported_node_leniently() -> None:
    d = from_json(json.dumps(_with_parallel_node()), strict=False)
    fan_out = d.node("fan_out")
    assert fan_out == UnsupportedNode(node_id="fan_out", revision=2, kind_name="parallel")
    assert fan_out is not None and fan_out.kind == "unsupported"
    assert d.successors(fan_out) == ()
    # await_payment is now reached only through the unsupported node, whose
    # continuations are unknown: it is kept, not refused as unreachable.
    assert d.node("await_payment") is not None


def test_dangling_continuation_is_kept_leniently() -> None:
    data = to_mapping(example())
    node_data(data, "place_order")["on_failure"] = "compensate"
    with pytest.raises(DefinitionError, match="continuation 'compensate' names no node"):
        from_json(json.dumps(data))
    d = from_json(json.dumps(data), strict=False)
    place = d.node("place_order")
    assert place is not None
    assert d.successors(place) == ("await_payment", "compensate")
    assert d.node("compensate") is None


def test_a_wait_on_a_reserved_event_type_is_refused_and_a_stored_one_still_loads() -> None:
    # No published Event may carry a fencekeeper.* type (only a Decision wakes such a wait), so a
    # definition's wait on one could never be woken; a revision stored before the rule still loads.
    data = to_mapping(example())
    node_data(data, "await_payment")["event_type"] = "fencekeeper.approval"
    error = refusal(data)
    assert (error.node_id, error.field) == ("await_payment", "event_type")
    assert "'fencekeeper.approval' is reserved" in str(error)
    stored = from_json(json.dumps(data), strict=False)
    wait = stored.node("await_payment")
    assert isinstance(wait, WaitForEventNode) and wait.event_type == "fencekeeper.approval"
    node_data(data, "await_payment")["event_type"] = "fencekeeper_approval"
    assert definition_from_mapping(data).node("await_payment") is not None


def test_outputs_of_an_unsupported_node_may_be_read_leniently() -> None:
    data = _with_parallel_node()
    node_data(data, "await_payment")["correlation"]["branch"] = {"from": "fan_out.branch"}
    d = from_json(json.dumps(data), strict=False)
    wait = d.node("await_payment")
    assert isinstance(wait, WaitForEventNode)
    assert ("branch", Ref("fan_out.branch")) in wait.correlation


@pytest.mark.parametrize(
    ("edit", "node_id", "field", "message"),
    [
        (at("done", colour="red"), "done", "colour", "unknown end node field 'colour'"),
        (at("fan_out", revision=DELETE), "fan_out", "revision", "missing required field 'revision'"),
        (at("fan_out", kind="not a kind"), "fan_out", "kind", "is not a valid node kind"),
        (at("fan_out", id="done"), "done", "id", "duplicate node id 'done'"),
        (top(start="nowhere"), None, "start", "start 'nowhere' names no node"),
        (top(extra=1), None, "extra", "unknown top-level field"),
        (at("place_order", payload={"a": {"from": "ghost.a"}}), "place_order", "payload.a", "no node 'ghost' exists"),
        (at("check_amount", false_next="check_amount"), "check_amount", "false_next", "condition cycle"),
    ],
)
def test_lenient_decoding_checks_everything_else(
    edit: Callable[[dict[str, Any]], None], node_id: str | None, field: str | None, message: str
) -> None:
    data = _with_parallel_node()
    edit(data)
    error = refusal(data, strict=False)
    assert (error.node_id, error.field) == (node_id, field), str(error)
    assert message in error.problem


def test_lenient_decoding_still_refuses_unreachable_nodes_when_every_kind_is_known() -> None:
    data = to_mapping(example())
    data["nodes"].append(end("orphan"))  # type: ignore[attr-defined]
    error = refusal(data, strict=False)
    assert (error.node_id, error.field) == ("orphan", None)


def test_a_leniently_read_unsupported_node_cannot_be_written() -> None:
    d = from_json(json.dumps(_with_parallel_node()), strict=False)
    with pytest.raises(DefinitionError) as caught:
        to_json(d)
    assert (caught.value.node_id, caught.value.field) == ("fan_out", "kind")
    assert "cannot be written" in str(caught.value)


def test_lenient_decoding_of_a_valid_definition_is_the_strict_one() -> None:
    assert from_json(to_json(example()), strict=False) == example()


# --- registration ----------------------------------------------------------------------------------


def revision_of(d: Definition, number: int, **changes: Any) -> Definition:
    return attrs.evolve(d, revision=number, **changes)


def with_node(d: Definition, node: Node) -> Definition:
    return attrs.evolve(d, nodes=tuple(node if n.node_id == node.node_id else n for n in d.nodes))


def _done(d: Definition) -> EndNode:
    done = d.node("done")
    assert isinstance(done, EndNode)
    return done


def test_first_revision_registers() -> None:
    assert check_registration(example(), []) is True


def test_first_registration_must_be_revision_1() -> None:
    with pytest.raises(DefinitionError) as caught:
        check_registration(revision_of(example(), 2), [])
    assert caught.value.field == "revision"
    assert "revision 2 does not follow the registered revisions; the next is 1" in str(caught.value)


def test_next_revision_registers() -> None:
    one = example()
    two = revision_of(one, 2, title="Purchase approval, v2")
    three = revision_of(one, 3)
    assert check_registration(two, [one]) is True
    assert check_registration(three, [two, one]) is True


def test_a_gap_is_refused() -> None:
    one = example()
    with pytest.raises(DefinitionError) as caught:
        check_registration(revision_of(one, 3), [one])
    assert str(caught.value) == (
        "definition 'purchase-approval' revision 3: field 'revision': "
        "revision 3 does not follow the registered revisions; the next is 2"
    )


def test_identical_reregistration_is_idempotent() -> None:
    one = example()
    two = revision_of(one, 2, title="v2")
    assert check_registration(example(), [one]) is False
    assert check_registration(revision_of(one, 2, title="v2"), [two, one]) is False
    # Identical content read again (a fresh parse: a new tree object) is still identical.
    assert check_registration(parse_definition(EXAMPLE), [one, two]) is False


def test_changed_same_numbered_revision_is_refused() -> None:
    one = example()
    two = revision_of(one, 2)
    with pytest.raises(DefinitionError) as caught:
        check_registration(revision_of(one, 2, title="other"), [one, two])
    assert caught.value.field == "revision"
    assert "revision 2 is already registered with different content" in str(caught.value)


def test_reused_node_revision_with_different_content_is_refused() -> None:
    one = example()
    changed = attrs.evolve(_done(one), outcome="failed", error_code="changed")
    two = revision_of(with_node(one, changed), 2)
    with pytest.raises(DefinitionError) as caught:
        check_registration(two, [one])
    error = caught.value
    assert (error.node_id, error.field) == ("done", "revision")
    assert (
        "node 'done' revision 1 differs from the registered node 'done' revision 1 "
        "(in definition revision 1); give the changed node a new revision"
    ) in str(error)


def test_changed_node_with_a_new_revision_is_accepted() -> None:
    one = example()
    changed = attrs.evolve(_done(one), revision=2, outcome="failed", error_code="changed")
    assert check_registration(revision_of(with_node(one, changed), 2), [one]) is True


def test_unchanged_node_reused_across_revisions_is_accepted() -> None:
    one = example()
    two = revision_of(one, 2, title="only the title changed")
    assert two.nodes == one.nodes
    assert check_registration(two, [one]) is True


def test_node_revision_checked_against_every_registered_revision() -> None:
    one = example()
    # Revision 2 gave 'done' a new revision 2; revision 3 reuses that number for other content.
    done_2 = attrs.evolve(_done(one), revision=2, error_code=None, outcome="succeeded")
    two = revision_of(with_node(one, done_2), 2)
    three = revision_of(with_node(one, attrs.evolve(done_2, outcome="failed", error_code="changed")), 3)
    with pytest.raises(DefinitionError, match=r"node 'done' revision 2 differs .* \(in definition revision 2\)"):
        check_registration(three, [two, one])
    assert check_registration(revision_of(with_node(one, done_2), 3), [two, one]) is True


def test_registration_refuses_revisions_of_another_definition() -> None:
    other = attrs.evolve(example(), definition_id="other")
    with pytest.raises(DefinitionError, match="another definition, 'other'"):
        check_registration(revision_of(example(), 2), [other])


# --- constants ---------------------------------------------------------------------------------


def test_supported_kinds_are_the_seeds_five() -> None:
    assert SUPPORTED_KINDS == ("condition", "wait_for_event", "request_approval", "local_command", "end")
    assert [cls.kind for cls in (ConditionNode, WaitForEventNode, RequestApprovalNode, LocalCommandNode, EndNode)] == list(
        SUPPORTED_KINDS
    )


def test_integer_bound_is_the_exact_double_range() -> None:
    # Every integer up to the bound survives a reader that holds numbers as doubles; the next ones do not.
    assert int(float(MAX_INTEGER)) == MAX_INTEGER
    assert int(float(MAX_INTEGER + 2)) != MAX_INTEGER + 2


def test_a_binding_that_uses_a_reserved_word_is_refused() -> None:
    text = EXAMPLE.replace('inputs = ["amount"', 'inputs = ["not", "amount"').replace(
        'bindings = ["input.amount"]', 'bindings = ["input.amount", "input.not"]'
    )
    with pytest.raises(DefinitionError) as caught:
        parse_definition(text, "reserved.toml")
    assert caught.value.node_id == "check_amount" and caught.value.field == "bindings[1]"
    assert "reserved word 'not'" in str(caught.value)
