"""An Event's payload is bounded at publication as an object input is: 32 levels, 65,536 characters of compact JSON.

Before the bound a 50 MB payload was kept whole, on the Event and again on
the attempt its wake completed, and one nested 100,000 levels deep ended
``Event.build`` with a RecursionError (a bare exception out of the Python
API).  One nested some 980 levels was published, and every worker visit that
then registered a matching waiter ended on RecursionError.  The stores'
side of it, and the wake of an Event stored before the bound, are in
tests/stores/test_event_payload_bounds.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fencekeeper.kernel.definition import MAX_INPUT_DEPTH, MAX_INPUT_JSON
from fencekeeper.kernel.events import (
    MAX_PAYLOAD_DEPTH,
    MAX_PAYLOAD_JSON,
    WITHHELD_DEEP,
    Event,
    EventError,
    json_problem,
    wake_outputs,
)

CORRELATION = {"order_id": "o-1"}


def nested(levels: int) -> dict[str, Any]:
    """A payload of exactly ``levels`` levels of objects, itself the first."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def flat(length: int) -> dict[str, Any]:
    """A payload exactly ``length`` characters long as compact JSON."""
    payload = {"blob": ""}
    payload["blob"] = "x" * (length - len(json.dumps(payload, separators=(",", ":"))))
    return payload


def refusal(payload: Any) -> str:
    with pytest.raises(EventError) as caught:
        Event.build("ev-1", "biz-1", "order.paid", CORRELATION, payload)
    return str(caught.value)


def test_the_bounds_are_those_of_an_object_input() -> None:
    assert (MAX_PAYLOAD_JSON, MAX_PAYLOAD_DEPTH) == (MAX_INPUT_JSON, MAX_INPUT_DEPTH) == (65_536, 32)


def test_a_payload_at_the_bounds_is_published() -> None:
    assert Event.build("ev-1", "biz-1", "order.paid", CORRELATION, flat(MAX_PAYLOAD_JSON)).payload == flat(MAX_PAYLOAD_JSON)
    deep = Event.build("ev-1", "biz-1", "order.paid", CORRELATION, nested(MAX_PAYLOAD_DEPTH))
    assert deep.payload == nested(MAX_PAYLOAD_DEPTH)
    # Arrays are levels as objects are.
    Event.build("ev-1", "biz-1", "order.paid", CORRELATION, {"a": json.loads("[" * 31 + "]" * 31)})


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (flat(MAX_PAYLOAD_JSON + 1), "payload: is longer than 65536 characters as compact JSON"),
        ({"blob": "x" * 50_000_000}, "payload: is longer than 65536 characters as compact JSON"),
        # Many short members: the exact text is measured once the walk's lower bound passes.
        ({f"k{i}": i for i in range(6000)}, "payload: is longer than 65536 characters as compact JSON"),
        # Escapes count: a quote is written as two characters.
        ({"q": '"' * 40_000}, "payload: is longer than 65536 characters as compact JSON"),
        (nested(MAX_PAYLOAD_DEPTH + 1), "payload: nests deeper than 32 levels"),
        ({"a": json.loads("[" * 32 + "]" * 32)}, "payload: nests deeper than 32 levels"),
        (nested(100_000), "payload: nests deeper than 32 levels"),
    ],
    ids=["one-over", "50MB", "many-members", "escapes", "33-levels", "33-with-arrays", "100000-levels"],
)
def test_a_payload_past_a_bound_is_refused_in_one_line_naming_the_payload(payload: Any, message: str) -> None:
    assert refusal(payload) == message


def test_a_payload_containing_itself_is_refused_not_recursed_into() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    assert refusal(loop) == "payload: nests deeper than 32 levels"


def test_a_payload_sharing_one_value_many_times_is_refused_before_it_is_written() -> None:
    # 2**30 leaves as JSON: measured by the walk, never encoded.
    shared: Any = ["x"]
    for _ in range(30):
        shared = [shared, shared]
    assert refusal({"tree": shared}) == "payload: is longer than 65536 characters as compact JSON"


def test_a_payload_json_cannot_write_is_refused_not_raised() -> None:
    from types import MappingProxyType  # noqa: PLC0415

    message = refusal({"inner": MappingProxyType({"a": 1})})
    assert message.startswith("payload: cannot be written as JSON: "), message


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ({"lines": {1: "a"}}, ("outputs.lines", "has the key 1, of type int; object keys must be strings")),
        ({"lines": [{(1, 2): "a"}]}, ("outputs.lines[0]", "has the key (1, 2), of type tuple; object keys must be strings")),
        ({None: 1}, ("outputs", "has the key None, of type NoneType; object keys must be strings")),
    ],
)
def test_a_key_that_is_no_string_is_named_with_the_object_holding_it(value: Any, found: tuple[str, str]) -> None:
    # It was "outputs.lines[1]: keys must be strings", which reads as the second item of an array.
    assert json_problem(value, "outputs") == found


def test_an_integer_key_in_a_payload_is_refused_naming_the_key() -> None:
    assert refusal({"lines": {7: "a"}}) == "payload.lines: has the key 7, of type int; object keys must be strings"


def test_a_wake_carries_the_payload_of_an_event_stored_before_the_bound() -> None:
    # A bound of publication only: what a store kept still reaches the nodes after the wait.
    stored = Event("ev-1", "biz-1", "order.paid", (("order_id", "o-1"),), flat(MAX_PAYLOAD_JSON * 2))
    assert wake_outputs(stored) == ({"event_id": "ev-1", **flat(MAX_PAYLOAD_JSON * 2)}, None)
    kept = Event("ev-2", "biz-1", "order.paid", (("order_id", "o-1"),), nested(MAX_PAYLOAD_DEPTH))
    assert wake_outputs(kept) == ({"event_id": "ev-2", **nested(MAX_PAYLOAD_DEPTH)}, None)


@pytest.mark.parametrize("levels", [MAX_PAYLOAD_DEPTH + 1, 100_000])
def test_a_wake_withholds_a_stored_payload_nested_past_the_bound(levels: int) -> None:
    stored = Event("ev-1", "biz-1", "order.paid", (("order_id", "o-1"),), {"amount": 5, "deep": nested(levels - 1)})
    assert wake_outputs(stored) == ({"event_id": "ev-1"}, WITHHELD_DEEP)
    # A database leaves such a payload unread and says so; the wake says the same.
    unread = Event("ev-1", "biz-1", "order.paid", (("order_id", "o-1"),), {}, payload_withheld=WITHHELD_DEEP)
    assert wake_outputs(unread) == ({"event_id": "ev-1"}, WITHHELD_DEEP)


def test_an_event_left_unread_is_not_the_same_content_as_one_with_an_empty_payload() -> None:
    # A republication with {} of an Event whose stored payload was withheld is a conflict, not a repeat.
    unread = Event("ev-1", "biz-1", "order.paid", (("order_id", "o-1"),), {}, payload_withheld=WITHHELD_DEEP)
    empty = Event.build("ev-1", "biz-1", "order.paid", CORRELATION, {})
    assert not empty.same_content(unread)
    assert empty.same_content(Event.build("ev-1", "biz-1", "order.paid", CORRELATION))
