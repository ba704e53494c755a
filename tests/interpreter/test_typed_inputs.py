"""Typed inputs: a definition declares each input's type, and admission refuses what does not fit.

What these tests prove:

- every keyword of the declared subset of JSON Schema (type, enum,
  minimum/maximum, minLength/maxLength, required) admits what fits and
  refuses what does not, with one message naming ``input.<field>``;
- a names-only declaration keeps its old meaning (each input a required
  string, number or boolean), a number being what a node reads: an integer
  beyond 64 bits is refused, every 64-bit one kept;
- a boolean is never a number (nor passes an integer ``enum`` or bounds),
  an integer in an object or array is within +-(2^53 - 1), and an integer
  too long to print is refused with a message, not a ValueError;
- a host subclass of a scalar type (an ``IntEnum``, a ``str`` subclass) is
  refused, since a node reads exact types only;
- a string no store can keep (a lone surrogate, a NUL), anywhere in a
  value, is refused at admission naming the field, typed or not;
- a refused admission writes nothing: the store holds no execution after it;
- :func:`input_schema` states the same rules as standard JSON Schema.
"""

from __future__ import annotations

import enum
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel.definition import input_schema, parse_definition, to_json

TYPED = parse_definition(
    """\
id = "typed"
revision = 1
start = "check"

[inputs]
amount = { type = "integer", minimum = 1, maximum = 1000000 }
currency = { type = "string", enum = ["EUR", "GBP"], description = "ISO 4217" }
note = { type = "string", minLength = 2, maxLength = 10, required = false }
rate = { type = "number", minimum = 0 }
rush = { type = "boolean", required = false }
lines = { type = "array", required = false }
meta = { type = "object", required = false }

[[nodes]]
id = "check"
kind = "condition"
revision = 1
expression = "input.amount >= 100"
bindings = ["input.amount"]
true_next = "done"
false_next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "typed.toml",
)

NAMES_ONLY = parse_definition(
    """\
id = "names-only"
revision = 1
start = "done"
inputs = ["order_id"]

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "names_only.toml",
)

GOOD: dict[str, Any] = {"amount": 250, "currency": "EUR", "rate": 1.5}


def admit(definition: Any, data: dict[str, Any]) -> dict[str, Any]:
    body = i.input_evidence("x-1", definition, "user:alice", data).body
    recorded: dict[str, Any] = body["input"]
    return recorded


def refused(definition: Any, data: dict[str, Any]) -> str:
    with pytest.raises(i.InputError) as caught:
        i.input_evidence("x-1", definition, "user:alice", data)
    assert caught.value.code == "invalid_input"
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_what_fits_is_admitted_as_given() -> None:
    assert admit(TYPED, GOOD) == GOOD
    full = GOOD | {"note": "rush it", "rush": True, "lines": [{"sku": "a", "qty": 2}], "meta": {"tags": ["x"]}}
    assert admit(TYPED, full) == full
    # An integer is a number; bounds are inclusive.
    assert admit(TYPED, GOOD | {"rate": 0, "amount": 1000000})["rate"] == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"amount": "250"}, "input.amount: must be an integer, found string"),
        ({"amount": 250.0}, "input.amount: must be an integer, found 250.0 (write it without a fraction)"),
        ({"amount": True}, "input.amount: must be an integer, found boolean"),
        ({"amount": None}, "input.amount: must be an integer, found null"),
        ({"amount": 0}, "input.amount: 0 is below the minimum 1"),
        ({"amount": 1000001}, "input.amount: 1000001 is above the maximum 1000000"),
        ({"amount": 2**60}, "input.amount: integer 1152921504606846976 is beyond +-9007199254740991"),
        ({"currency": "usd"}, 'input.currency: "usd" is not one of "EUR", "GBP"'),
        ({"currency": 7}, "input.currency: must be a string, found integer"),
        ({"note": "x"}, "input.note: is 1 characters long; at least 2 are required"),
        ({"note": "x" * 11}, "input.note: is 11 characters long; at most 10 are allowed"),
        ({"rate": "1.5"}, "input.rate: must be a number, found string"),
        ({"rate": -0.5}, "input.rate: -0.5 is below the minimum 0"),
        ({"rate": float("nan")}, "input.rate: must be a finite number"),
        ({"rush": "yes"}, "input.rush: must be a boolean, found string"),
        ({"lines": {"sku": "a"}}, "input.lines: must be an array, found object"),
        ({"meta": []}, "input.meta: must be an object, found array"),
        ({"meta": {"n": float("inf")}}, "input.meta: must be a finite number"),
        ({"meta": {"n": 2**53}}, "input.meta: integer 9007199254740992 is beyond"),
        ({"lines": ["x" * 70_000]}, "input.lines: is longer than 65536 characters as JSON"),
        ({"extra": 1}, "input.extra: not an input of typed (declared: amount, currency, lines, meta, note, rate, rush)"),
    ],
)
def test_what_does_not_fit_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    assert message in refused(TYPED, GOOD | change)


def test_nesting_is_bounded() -> None:
    deep: Any = "end"
    for _ in range(40):
        deep = [deep]
    assert "input.lines: nests deeper than 32 levels" in refused(TYPED, GOOD | {"lines": deep})


def test_required_inputs_must_be_given_and_optional_ones_need_not() -> None:
    assert "input.amount: required by typed and missing" in refused(TYPED, {"currency": "EUR", "rate": 1})
    assert "input.rate: required by typed and missing" in refused(TYPED, {"amount": 5, "currency": "EUR"})
    assert "rush" not in admit(TYPED, GOOD)


def test_names_only_keeps_its_meaning() -> None:
    for value in ("o-1", 7, 2.5, True):
        assert admit(NAMES_ONLY, {"order_id": value}) == {"order_id": value}
    assert "input.order_id: required by names-only and missing" in refused(NAMES_ONLY, {})
    assert "must be a string, number or boolean, not list" in refused(NAMES_ONLY, {"order_id": [1]})
    assert "longer than 4096 characters" in refused(NAMES_ONLY, {"order_id": "x" * 4097})


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64, 10**30])
def test_a_names_only_integer_beyond_64_bits_is_refused(value: int) -> None:
    # A condition reads no such integer (specs/expressions.md, Values): admitted, the execution
    # would suspend at its first condition instead of being refused here.
    assert refused(NAMES_ONLY, {"order_id": value}) == (
        f"input.order_id: integer {value} is outside the 64-bit signed range "
        "-9223372036854775808 to 9223372036854775807, the only integers a node reads"
    )


def test_a_names_only_input_keeps_every_64_bit_integer_and_both_booleans() -> None:
    # The names-only form keeps its meaning: the whole 64-bit range, beyond the typed form's +-(2^53 - 1).
    for value in (2**63 - 1, -(2**63), 2**53, True, False):
        recorded = admit(NAMES_ONLY, {"order_id": value})["order_id"]
        assert recorded == value and type(recorded) is type(value)


@pytest.mark.parametrize(("definition", "name"), [(NAMES_ONLY, "order_id"), (TYPED, "amount"), (TYPED, "rate")])
def test_an_integer_too_long_to_print_is_refused_not_raised(definition: Any, name: str) -> None:
    # str() of an integer past sys.get_int_max_str_digits raises ValueError: the message must not call it.
    base = {} if definition is NAMES_ONLY else GOOD
    for value in (10**5000, -(10**5000)):
        message = refused(definition, base | {name: value})
        assert message.startswith(f"input.{name}: integer of about 5001 digits is "), message


def test_a_nested_integer_too_long_to_print_is_refused_naming_the_input() -> None:
    assert refused(TYPED, GOOD | {"meta": {"n": [1, 10**5000]}}).startswith(
        "input.meta: integer of about 5001 digits is beyond +-9007199254740991"
    )


def test_an_infinity_for_an_integer_input_is_named_as_not_finite() -> None:
    # Not "found inf (write it without a fraction)": no writing of an infinity is an integer.
    assert refused(TYPED, GOOD | {"amount": float("-inf")}) == "input.amount: must be a finite number"


class _Level(enum.IntEnum):
    HIGH = 250


class _Tag(str):
    pass


class _Rate(float):
    pass


@pytest.mark.parametrize(
    ("definition", "name", "value", "plain"),
    [
        (NAMES_ONLY, "order_id", _Level.HIGH, "int"),
        (NAMES_ONLY, "order_id", _Tag("o-1"), "str"),
        (NAMES_ONLY, "order_id", _Rate(1.5), "float"),
        (TYPED, "amount", _Level.HIGH, "int"),
        (TYPED, "currency", _Tag("EUR"), "str"),
        (TYPED, "rate", _Rate(1.5), "float"),
    ],
)
def test_a_host_subclass_of_a_scalar_is_refused(definition: Any, name: str, value: object, plain: str) -> None:
    # A condition reads exact types only (specs/expressions.md, Values): the in-memory store kept the
    # object and the execution suspended at its condition, while SQLite's JSON read back a plain value.
    base = {} if definition is NAMES_ONLY else GOOD
    assert refused(definition, base | {name: value}) == (
        f"input.{name}: is a {type(value).__name__}, a subclass of {plain}; give a plain {plain}"
    )


def test_a_host_subclass_is_refused_before_anything_is_written_on_the_in_memory_store() -> None:
    store = MemoryStore()
    policy = examples.grants("default", "user:alice")
    service.register(store, NAMES_ONLY, "default", "user:alice", policy)
    with pytest.raises(service.OperationError) as caught:
        service.run(
            store, policy, business_id="default", principal_id="user:alice",
            definition_id="names-only", input={"order_id": _Level.HIGH}, execution_id="x-1",
        )  # fmt: skip
    assert caught.value.code == "invalid_input" and caught.value.message.startswith("input.order_id: is a _Level")
    assert store.execution_ids() == []


_NOT_A_STRING = "every key of a JSON object is a string"


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({1: "a"}, f"input.meta: has a key of type int; {_NOT_A_STRING}"),
        ({1: "a", "1": "b"}, f"input.meta: has a key of type int; {_NOT_A_STRING}"),
        ({None: 1}, f"input.meta: has a key of type NoneType; {_NOT_A_STRING}"),
        ({"ok": {(1, 2): "x"}}, f"input.meta: has a key of type tuple; {_NOT_A_STRING}"),
        ({10**5000: "x"}, f"input.meta: has a key of type int; {_NOT_A_STRING}"),
        # Storable text is checked first (step 2), naming the key that holds the NUL however it prints.
        ({10**5000: "\x00"}, "input.meta.<int>: contains NUL (U+0000)"),
    ],
    ids=["int", "int-and-its-string", "none", "tuple-nested", "integer-too-long-to-print", "nul-under-such-a-key"],
)
def test_an_object_key_that_is_not_a_string_is_refused(meta: dict[Any, Any], message: str) -> None:
    # Only the Python API can give one: JSON would rename 1 to "1" (clashing with a "1" already there), a
    # tuple made the store's own JSON writer raise inside its transaction, and an integer too long to
    # print made the message itself raise.
    assert refused(TYPED, GOOD | {"meta": meta}).startswith(message)


BOUNDED = parse_definition(
    """\
id = "bounded"
revision = 1
start = "done"

[inputs]
level = { type = "integer", enum = [0, 1] }
ratio = { type = "number", minimum = 0, maximum = 1 }
flag = { type = "boolean", enum = [true], required = false }

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "bounded.toml",
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"level": True}, "input.level: must be an integer, found boolean"),
        ({"level": False}, "input.level: must be an integer, found boolean"),
        ({"ratio": True}, "input.ratio: must be a number, found boolean"),
        ({"ratio": False}, "input.ratio: must be a number, found boolean"),
        ({"flag": 1}, "input.flag: must be a boolean, found integer"),
    ],
)
def test_a_boolean_is_never_a_number_nor_a_number_a_boolean(change: dict[str, Any], message: str) -> None:
    # Python's True == 1 must not pass an integer enum [0, 1] or the bounds 0..1 (specs/expressions.md, Values).
    assert refused(BOUNDED, {"level": 1, "ratio": 0.5} | change) == message
    assert admit(BOUNDED, {"level": 1, "ratio": 1, "flag": True}) == {"level": 1, "ratio": 1, "flag": True}


@pytest.mark.parametrize("value", [2**53 - 1, -(2**53 - 1)])
def test_a_nested_integer_within_2_53_is_kept(value: int) -> None:
    data = GOOD | {"meta": {"n": value, "deep": [[value]], "yes": True}, "lines": [value]}
    assert admit(TYPED, data) == data


@pytest.mark.parametrize("value", [2**53, -(2**53), 2**64])
@pytest.mark.parametrize(("name", "place"), [("meta", lambda v: {"deep": [[v]]}), ("lines", lambda v: [1, v])])
def test_a_nested_integer_beyond_2_53_is_refused(value: int, name: str, place: Any) -> None:
    message = refused(TYPED, GOOD | {name: place(value)})
    assert message == f"input.{name}: integer {value} is beyond +-9007199254740991, which JSON readers cannot all hold exactly"


@pytest.mark.parametrize(
    ("definition", "data", "field"),
    [
        (NAMES_ONLY, {"order_id": "o-\ud800"}, "input.order_id"),
        (TYPED, GOOD | {"currency": "\udfff"}, "input.currency"),
        (TYPED, GOOD | {"note": "a\udc80b"}, "input.note"),
        (TYPED, GOOD | {"lines": ["ok", {"sku": "\ud83d"}]}, "input.lines[1].sku"),
        (TYPED, GOOD | {"meta": {"\ud800": 1}}, "input.meta key '\\ud800'"),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_field(definition: Any, data: dict[str, Any], field: str) -> None:
    message = refused(definition, data)
    assert message.startswith(f"{field}: contains an unpaired surrogate (U+"), message
    # The message itself can be printed on any terminal: it holds no surrogate.
    message.encode("utf-8")


@pytest.mark.parametrize(
    ("definition", "data", "field"),
    [
        (NAMES_ONLY, {"order_id": "o-1\x00"}, "input.order_id"),
        (TYPED, GOOD | {"meta": {"notes": ["fine", "bad\x00"]}}, "input.meta.notes[1]"),
    ],
)
def test_a_nul_is_refused_naming_the_field(definition: Any, data: dict[str, Any], field: str) -> None:
    assert refused(definition, data).startswith(f"{field}: contains NUL (U+0000)")


def test_a_refused_admission_writes_nothing() -> None:
    store = MemoryStore()
    policy = examples.grants("default", "user:alice")
    service.register(store, TYPED, "default", "user:alice", policy)
    for bad in ({"amount": 0}, {"currency": "usd"}, {"note": "\ud800x"}):
        with pytest.raises(service.OperationError) as caught:
            service.run(
                store, policy, business_id="default", principal_id="user:alice",
                definition_id="typed", input=GOOD | bad, execution_id="x-1",
            )  # fmt: skip
        assert caught.value.code == "invalid_input"
        assert store.execution_ids() == []
    admitted = service.run(
        store, policy, business_id="default", principal_id="user:alice",
        definition_id="typed", input=GOOD, execution_id="x-1",
    )  # fmt: skip
    assert isinstance(admitted, service.p.Decision)


def test_the_input_schema_states_the_same_rules_in_standard_json_schema() -> None:
    schema = input_schema(TYPED)
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["amount", "currency", "rate"]
    properties: Any = schema["properties"]
    assert properties["amount"] == {"type": "integer", "minimum": 1, "maximum": 1000000}
    assert properties["currency"] == {"type": "string", "description": "ISO 4217", "enum": ["EUR", "GBP"]}
    assert properties["note"] == {"type": "string", "minLength": 2, "maxLength": 10}
    names_only: Any = input_schema(NAMES_ONLY)
    assert names_only["required"] == ["order_id"]
    assert names_only["properties"]["order_id"] == {"type": ["string", "number", "boolean"]}


def test_typed_inputs_survive_the_canonical_json_form() -> None:
    from fencekeeper.kernel.definition import from_json  # noqa: PLC0415 - the round trip under test

    again = from_json(to_json(TYPED))
    assert again == TYPED
    assert again.input_types is not None and [t.name for t in again.input_types] == list(TYPED.inputs)
    # `required = true` written out or left to its default is the same definition.
    explicit = to_json(TYPED).replace('"minimum":1,"type":"integer"', '"minimum":1,"required":true,"type":"integer"')
    assert from_json(explicit) == TYPED
