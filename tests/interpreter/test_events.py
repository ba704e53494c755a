"""What an Event may carry at publication (specs/interpreter.md, Events): each rule refused alone, naming its field."""

from __future__ import annotations

import pytest

from fencekeeper.kernel.events import MAX_CORRELATION, MAX_VALUE_LENGTH, Event, EventError


def build(correlation: dict[str, object], event_type: str = "payment.received") -> Event:
    return Event.build("ev-1", "b-1", event_type, correlation, {})


@pytest.mark.parametrize(
    ("event_type", "correlation", "field"),
    [
        ("payment.received", {}, "correlation"),
        ("payment.received", {f"k{n}": "v" for n in range(MAX_CORRELATION + 1)}, "correlation"),
        ("payment.received", {"Order": "o-1"}, "correlation"),
        ("payment.received", {"order_id": "x" * (MAX_VALUE_LENGTH + 1)}, "correlation.order_id"),
        ("payment.received", {"order_id": 10**300}, "correlation.order_id"),
        ("payment.received", {"order_id": 1.5}, "correlation.order_id"),
        ("payment.received", {"order_id": None}, "correlation.order_id"),
        ("payment.received", {"order_id": ["o-1"]}, "correlation.order_id"),
        ("payment.received", {"order_id": "o\x00-1"}, "correlation.order_id"),
        ("fencekeeper.approval", {"request_id": "e-1/a2/approval"}, "event_type"),
        ("fencekeeper.anything", {"order_id": "o-1"}, "event_type"),
    ],
    ids=["none", "seventeen", "name", "long", "long-integer", "decimal", "null", "array", "nul", "approval-type",
         "reserved-type"],
)
def test_a_malformed_event_is_refused_naming_its_field(
    event_type: str, correlation: dict[str, object], field: str
) -> None:
    with pytest.raises(EventError) as refused:
        build(correlation, event_type)
    assert str(refused.value).startswith(f"{field}:")
    assert refused.value.code == "invalid_event"


def test_an_event_at_every_bound_is_published_with_canonical_strings() -> None:
    at_bounds = {f"k{n}": "v" for n in range(MAX_CORRELATION - 4)}
    at_bounds |= {"long": "x" * MAX_VALUE_LENGTH, "count": -12, "paid": True, "late": False}
    event = build(at_bounds)
    values = dict(event.correlation)
    assert len(values) == MAX_CORRELATION == 16 and MAX_VALUE_LENGTH == 256
    assert (values["count"], values["paid"], values["late"]) == ("-12", "true", "false")
    assert [name for name, _ in event.correlation] == sorted(values)
    # A type that only resembles a reserved one is an ordinary type: the prefix is exact.
    assert build({"order_id": "o-1"}, "Fencekeeper.approval").event_type == "Fencekeeper.approval"
