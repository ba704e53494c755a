"""SQLite and PostgreSQL agree on text neither can keep the same way: both refuse it, before writing.

A NUL in an Event's correlation value used to be accepted by SQLite and to
fail inside PostgreSQL's transaction as ``DataError``; a lone surrogate in an
admission input used to be stored and then make the execution unreadable,
and one in a governed recovery's rationale (a non-UTF-8 byte in
``reconcile --because``) failed inside the store as ``UnicodeEncodeError``.
All are now refused by the kernel's validation, the same way on every
store, and the store is left as it was.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState
from tests.definitions.examples import WAITS

BUSINESS = "default"
PRINCIPAL = "user:operator"
DEFINITION = parse_definition(WAITS, "waits.toml")


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


@pytest.mark.parametrize("rationale", ["bad \x00 why", "bad \udcff byte"], ids=["nul", "surrogate"])
def test_both_stores_refuse_a_recovery_rationale_they_could_not_keep_alike(
    store: TransactionalStore, rationale: str
) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.run(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="waits",
        input={"order_id": "o-1"}, execution_id="x-1",
    )
    # A worker that claims and disappears: its lease expires and a sweep puts it in review.
    claimed = store.claim_next(p.ClaimRequest("gone-1", secrets.token_hex(16), timedelta(milliseconds=50)))
    assert isinstance(claimed, p.Decision)
    time.sleep(0.1)
    assert service.quarantine_expired(store, policy, business_id=BUSINESS, principal_id=PRINCIPAL).quarantined == [
        "x-1"
    ]
    before = store.read("x-1")
    assert before is not None and before.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    outcome = service.fail(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", rationale=rationale
    )
    assert isinstance(outcome, p.Refusal), outcome
    assert (outcome.code, outcome.field) == (p.RefusalCode.INVALID_REQUEST, "rationale"), outcome
    assert store.read("x-1") == before


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("bad \x00 why", "reason: contains NUL"),
        ("bad \udcff byte", "reason: contains an unpaired surrogate"),
        ("x" * (p.MAX_RATIONALE + 1), f"reason: must be at most 2000 characters, got {p.MAX_RATIONALE + 1}"),
    ],
    ids=["nul", "surrogate", "too-long"],
)
def test_a_cancellation_reason_is_checked_by_the_service_before_anything_is_written(
    store: TransactionalStore, reason: str, message: str
) -> None:
    # The reason goes into the cancellation's Command evidence, which no kernel decision reads: the client and
    # the HTTP routes bounded it, a direct caller of service.cancel did not (SQLite kept a NUL, PostgreSQL
    # failed inside its transaction).
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.run(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="waits",
        input={"order_id": "o-1"}, execution_id="x-1",
    )
    before = store.read("x-1")
    with pytest.raises(service.OperationError) as caught:
        service.cancel(store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", reason=reason)
    assert caught.value.code == "invalid_argument"
    assert caught.value.message.startswith(message), caught.value.message
    assert store.read("x-1") == before
    # At the bound it is kept as given.
    longest = "y" * p.MAX_RATIONALE
    outcome = service.cancel(
        store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", reason=longest
    )
    assert isinstance(outcome, p.Decision), outcome
    after = store.read("x-1")
    assert after is not None and after.execution.state == ExecutionState.CANCELLED
    assert [e.body["reason"] for e in after.evidence if e.object_id == "x-1/cancel/r1"] == [longest]
