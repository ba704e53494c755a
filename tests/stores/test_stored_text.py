"""SQLite and PostgreSQL agree on text neither can keep the same way: both refuse it, before writing.

A NUL in an Event's correlation value used to be accepted by SQLite and to
fail inside PostgreSQL's transaction as ``DataError``; a lone surrogate in an
admission input used to be stored and then make the execution unreadable.
Both are now refused by the kernel's validation, the same way on every
store, and the store is left as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.kernel.definition import parse_definition

BUSINESS = "default"
PRINCIPAL = "user:operator"
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
next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "waits.toml",
)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore]:
    opened: TransactionalStore
    if request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "store.db")
    else:
        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415 - psycopg only for this one

        opened = PostgresStore(request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"))
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, policy)
    try:
        yield opened
    finally:
        opened.close()


@pytest.mark.parametrize(
    ("correlation", "payload", "field"),
    [
        ({"order_id": "o-\x001"}, None, "correlation.order_id"),
        ({"order_id": "o-\ud8001"}, None, "correlation.order_id"),
        ({"order_id": "o-1"}, {"note": "a\x00b"}, "payload.note"),
    ],
)
def test_both_stores_refuse_an_event_they_could_not_keep_alike(
    store: TransactionalStore, correlation: dict[str, Any], payload: dict[str, Any] | None, field: str
) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    with pytest.raises(service.OperationError) as caught:
        service.publish(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=PRINCIPAL,
            event_type="payment.received",
            correlation=correlation,
            payload=payload,
            event_id="ev-1",
        )
    assert caught.value.code == "invalid_event"
    assert caught.value.message.startswith(f"{field}: contains "), caught.value.message
    # Nothing was written: the same identity then publishes afresh, not as a repeat.
    again = service.publish(
        store,
        policy,
        business_id=BUSINESS,
        principal_id=PRINCIPAL,
        event_type="payment.received",
        correlation={"order_id": "o-1"},
        event_id="ev-1",
    )
    assert not again.duplicate


@pytest.mark.parametrize("order_id", ["o-\x001", "o-\udc80"])
def test_both_stores_refuse_an_input_they_could_not_keep_alike(store: TransactionalStore, order_id: str) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    with pytest.raises(service.OperationError) as caught:
        service.run(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=PRINCIPAL,
            definition_id="waits",
            input={"order_id": order_id},
            execution_id="x-1",
        )
    assert caught.value.code == "invalid_input"
    assert caught.value.message.startswith("input.order_id: contains "), caught.value.message
    assert store.execution_ids() == []
