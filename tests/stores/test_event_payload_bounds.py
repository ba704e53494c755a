"""A payload past the publication bound is refused on every store, writing nothing; an Event stored before still wakes.

Before the bound, a 50 MB payload was kept on the Event and again on the
attempt it completed, on every store alike.  An Event whose payload nested
some 980 levels deep was published, and a worker whose waiter then found it
(the Event committed first) ended on RecursionError inside the store: on
SQLite and PostgreSQL decoding the row, on PostgreSQL writing the attempt
too.  The execution stayed running under its lease, and every later visit
failed the same way.  Such an Event, stored before the bound, now wakes its
waiter without its payload, and the attempt says why; a long one is carried
as it was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.ports import ScriptedHandler
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import attempts
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.events import WITHHELD_DEEP, Event, EventError
from fencekeeper.kernel.machines import ExecutionState

BUSINESS = "default"
PRINCIPAL = "user:operator"
POLICY = examples.grants(BUSINESS, PRINCIPAL)
DEFINITION = parse_definition(
    """\
id = "waits"
revision = 1
start = "await_payment"
inputs = ["order_id"]

[[nodes]]
id = "await_payment"
kind = "wait_for_event"
revision = 1
event_type = "payment.received"
correlation = { order_id = { from = "input.order_id" } }
next = "check_paid"

[[nodes]]
id = "check_paid"
kind = "condition"
revision = 1
expression = "await_payment.amount > 0"
bindings = ["await_payment.amount"]
true_next = "done"
false_next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "waits.toml",
)

Plant = Callable[[str, Any, str], None]
"""Store an Event for order o-1 with this id and payload (as a value, and as its JSON text), as a release
before the bound did."""


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TransactionalStore, Plant]]:
    store: TransactionalStore
    if request.param == "memory":
        store = MemoryStore()

        def plant(event_id: str, payload: Any, text: str) -> None:
            # The in-memory store keeps the Event as given, and its publication now holds the bound too:
            # the row goes in as an earlier release's publication wrote it, past every check.
            event = Event(event_id, BUSINESS, "payment.received", (("order_id", "o-1"),), payload)
            with store._transaction() as tx:
                tx.insert_event(event, store.clock.now())

    elif request.param == "sqlite":
        import sqlite3  # noqa: PLC0415

        store = SQLiteStore(tmp_path / "store.db")

        def plant(event_id: str, payload: Any, text: str) -> None:
            with sqlite3.connect(tmp_path / "store.db") as conn:
                for statement in _rows(event_id, text):
                    conn.execute(statement)

    else:
        import psycopg  # noqa: PLC0415

        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        store = PostgresStore(dsn, schema=schema)

        def plant(event_id: str, payload: Any, text: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
                for statement in _rows(event_id, text):
                    conn.execute(statement)  # type: ignore[arg-type]

    service.register(store, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    try:
        yield store, plant
    finally:
        store.close()


def _rows(event_id: str, payload: str) -> list[str]:
    """The rows a store's publication writes (adapters/sql.py, insert_event), past its checks."""
    return [
        "INSERT INTO events (event_id, business_id, event_type, correlation, payload, committed_at) VALUES "
        f"('{event_id}', '{BUSINESS}', 'payment.received', '[[\"order_id\",\"o-1\"]]', '{payload}', "
        "'2026-01-01T00:00:00.000000+00:00')",
        "INSERT INTO event_keys (business_id, event_type, name, value, event_id) VALUES "
        f"('{BUSINESS}', 'payment.received', 'order_id', 'o-1', '{event_id}')",
    ]


def deep(levels: int) -> tuple[dict[str, Any], str]:
    """A payload with a readable member and one nesting ``levels`` deep in all: built, and written, without recursion."""
    chain: dict[str, Any] = {}
    for _ in range(levels - 2):
        chain = {"d": chain}
    text = '{"amount":5,"d":' + '{"d":' * (levels - 2) + "{}" + "}" * (levels - 2) + "}"
    return {"amount": 5, "d": chain}, text


def publish(store: TransactionalStore, payload: Any, event_id: str = "ev-1") -> service.PublishResult:
    return service.publish(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, event_type="payment.received",
        correlation={"order_id": "o-1"}, payload=payload, event_id=event_id,
    )  # fmt: skip


def admit_and_work(store: TransactionalStore) -> None:
    service.run(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="waits",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    worker = Worker(store, "w-1", POLICY, ScriptedHandler({}))
    while worker.run_pass().claimed:
        pass


def wait_attempt(store: TransactionalStore) -> Any:
    view = store.read("x-1")
    assert view is not None
    (found,) = [e for e in view.evidence if e.kind == attempts.STEP_ATTEMPT and e.body["node_id"] == "await_payment"]
    return found


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"blob": "x" * 50_000_000}, "payload: is longer than 65536 characters as compact JSON"),
        ({"blob": "x" * 65_526}, "payload: is longer than 65536 characters as compact JSON"),
        (nested(100_000), "payload: nests deeper than 32 levels"),
        (nested(33), "payload: nests deeper than 32 levels"),
    ],
    ids=["50MB", "one-over", "100000-levels", "33-levels"],
)
def test_a_payload_past_a_bound_is_refused_and_nothing_is_written(
    opened: tuple[TransactionalStore, Plant], payload: Any, message: str
) -> None:
    store, _ = opened
    service.run(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="waits",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    Worker(store, "w-1", POLICY, ScriptedHandler({})).run_pass()
    with pytest.raises(service.OperationError) as caught:
        publish(store, payload)
    assert (caught.value.code, caught.value.message) == ("invalid_event", message)
    view = store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.WAITING
    # Nothing was written: the same identity then publishes afresh, and wakes the waiter.
    at_bound = {"amount": 1, "blob": ""}
    at_bound["blob"] = "x" * (65_536 - len(json.dumps(at_bound, separators=(",", ":"))))
    assert len(json.dumps(at_bound, separators=(",", ":"))) == 65_536
    again = publish(store, at_bound)
    assert (again.duplicate, again.woken) == (False, ("x-1",))
    assert wait_attempt(store).body["outputs"] == {"event_id": "ev-1", **at_bound}


def test_a_long_payload_stored_before_the_bound_still_wakes_its_waiter_with_it(
    opened: tuple[TransactionalStore, Plant],
) -> None:
    store, plant = opened
    stored = {"amount": 5, "blob": "x" * 100_000}
    plant("ev-old", stored, json.dumps(stored, separators=(",", ":")))
    admit_and_work(store)
    view = store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.SUCCEEDED
    attempt = wait_attempt(store)
    assert attempt.body["outputs"] == {"event_id": "ev-old", **stored}
    assert "payload_withheld" not in attempt.body["wake"]
    # Publishing it again is a publication like any other: past the bound, refused, and nothing changes.
    with pytest.raises(service.OperationError) as caught:
        publish(store, stored, event_id="ev-old")
    assert caught.value.message == "payload: is longer than 65536 characters as compact JSON"


@pytest.mark.parametrize("levels", [33, 5_000])
def test_a_deep_payload_stored_before_the_bound_wakes_its_waiter_without_it(
    opened: tuple[TransactionalStore, Plant], levels: int
) -> None:
    # 5,000 levels is past the recursion limit: the worker's visit ended on RecursionError, every time.
    store, plant = opened
    plant("ev-old", *deep(levels))
    admit_and_work(store)
    attempt = wait_attempt(store)
    assert attempt.state == "completed"
    assert attempt.body["wake"] == {"reason": "event", "source_id": "ev-old", "payload_withheld": WITHHELD_DEEP}
    assert attempt.body["outputs"] == {"event_id": "ev-old"}
    # The node reading a member of it finds none: the explicit review of an unknown condition, not a crash.
    view = store.read("x-1")
    assert view is not None
    assert (view.execution.state, view.execution.current_node_id) == (ExecutionState.SUSPENDED, "check_paid")
    assert view.dispatch.last_error_code == "condition_unknown"
    # The same identity published again with a payload in bounds is another Event: a conflict.
    with pytest.raises(Exception) as caught:
        publish(store, {}, event_id="ev-old")
    assert getattr(caught.value, "code", None) == "event_conflict"


def _direct(event_id: str, payload: Any) -> Event:
    """An Event made without ``Event.build``, as a caller of a store's own ``publish_event`` may make one."""
    return Event(event_id, BUSINESS, "payment.received", (("order_id", "o-1"),), payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"blob": "x" * 65_526}, "payload: is longer than 65536 characters as compact JSON"),
        (nested(33), "payload: nests deeper than 32 levels"),
        (nested(100_000), "payload: nests deeper than 32 levels"),
    ],
    ids=["one-over", "33-levels", "100000-levels"],
)
def test_a_stores_own_publication_holds_the_bound_and_writes_nothing(
    opened: tuple[TransactionalStore, Plant], payload: Any, message: str
) -> None:
    # Every user path builds its Event (Event.build), and the bound was applied there only: an Event made
    # directly and given to publish_event was stored, and read back by the waiter it woke.
    store, _ = opened
    service.run(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="waits",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    Worker(store, "w-1", POLICY, ScriptedHandler({})).run_pass()
    granted = POLICY.check(PRINCIPAL, BUSINESS, service.EVENT_PUBLISH)
    with pytest.raises(EventError) as caught:
        store.publish_event(_direct("ev-1", payload), granted)
    # The same code and message as a publication through the service (the test above).
    assert (caught.value.code, str(caught.value)) == ("invalid_event", message)
    view = store.read("x-1")
    assert view is not None and view.execution.state == ExecutionState.WAITING
    again = store.publish_event(_direct("ev-1", {"amount": 1}), granted)
    assert (again.duplicate, again.woken) == (False, ("x-1",))


def test_the_same_content_as_a_stored_event_past_the_bound_is_refused_not_a_duplicate(
    opened: tuple[TransactionalStore, Plant],
) -> None:
    # specs/interpreter.md, Events: publishing such an Event's identity again is a new publication, past
    # the bound refused; the answer does not depend on what the store holds, and it reads nothing.
    store, plant = opened
    stored = {"amount": 5, "blob": "x" * 100_000}
    plant("ev-old", stored, json.dumps(stored, separators=(",", ":")))
    granted = POLICY.check(PRINCIPAL, BUSINESS, service.EVENT_PUBLISH)
    with pytest.raises(EventError) as caught:
        store.publish_event(_direct("ev-old", stored), granted)
    assert str(caught.value) == "payload: is longer than 65536 characters as compact JSON"
    # Refused, and nothing was written: the stored Event is as it was, and still wakes a waiter with it.
    admit_and_work(store)
    assert wait_attempt(store).body["outputs"] == {"event_id": "ev-old", **stored}
    # Through the service, the same refusal: invalid_event naming the payload, never a duplicate.
    with pytest.raises(service.OperationError) as refused:
        publish(store, stored, event_id="ev-old")
    assert (refused.value.code, refused.value.message) == (
        "invalid_event", "payload: is longer than 65536 characters as compact JSON"
    )
