"""An execution row edited by hand is one ``malformed_row`` error naming it, on SQLite and PostgreSQL.

An execution's row names its current revision, whose body another table
holds.  A row that names a revision with no body, or a body that is no
execution revision, used to fail deep in the JSON reader (``TypeError``), an
internal error with a traceback for every command that read it.  Now each
read of it (``read``, which ``inspect`` and the review commands use, and a
worker's claim) fails with
``StoreError('malformed_row')`` naming the execution, and nothing is
written: the worker's command reports the row and stops, rather than a
traceback, and every other execution still reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import StoreError, TransactionalStore
from fencekeeper.adapters.testing.roundtrips import TWO_NODE
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition

BUSINESS = "default"
PRINCIPAL = "user:operator"
POLICY = examples.grants(BUSINESS, PRINCIPAL)
_BODY = (
    "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
    "VALUES ('x-1', 99, 'eligible', '{body}', '2026-01-01T00:00:00.000000+00:00'); "
    "UPDATE objects SET revision = 99 WHERE object_id = 'x-1'"
)
DAMAGES = {
    # Revisions are append-only, so a damaged body is a new revision the row is pointed at.
    "a revision with no body": "UPDATE objects SET revision = 99 WHERE object_id = 'x-1'",
    "a body that is no revision": _BODY.replace("{body}", '{"not": "an execution"}'),
    "a body that is no JSON": _BODY.replace("{body}", "garbled"),
}


@pytest.fixture(params=["sqlite", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TransactionalStore, Callable[[str], Any]]]:
    store: TransactionalStore
    if request.param == "sqlite":
        import sqlite3  # noqa: PLC0415

        store = SQLiteStore(tmp_path / "store.db")

        def edit(sql: str) -> None:
            with sqlite3.connect(tmp_path / "store.db") as conn:
                conn.executescript(sql)

    else:
        import psycopg  # noqa: PLC0415

        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        store = PostgresStore(dsn, schema=schema)

        def edit(sql: str) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
                for statement in sql.split("; "):
                    conn.execute(statement)  # type: ignore[arg-type]

    service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, POLICY)
    for n in (1, 2):
        outcome = service.run(
            store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
            input={"order_id": f"o-{n}"}, execution_id=f"x-{n}",
        )  # fmt: skip
        assert isinstance(outcome, p.Decision), outcome
    try:
        yield store, edit
    finally:
        store.close()


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_execution_row_is_one_error_naming_it(
    opened: tuple[TransactionalStore, Callable[[str], Any]], damage: str
) -> None:
    store, edit = opened
    edit(DAMAGES[damage])
    with pytest.raises(StoreError) as raised:
        store.read("x-1")
    assert raised.value.code == "malformed_row"
    assert "execution 'x-1'" in raised.value.message and "edited by hand or damaged" in raised.value.message
    # The other execution reads as before.
    view = store.read("x-2")
    assert view is not None and view.execution.execution_id == "x-2"


def test_a_worker_that_claims_a_damaged_row_names_it_and_writes_nothing(
    opened: tuple[TransactionalStore, Callable[[str], Any]],
) -> None:
    store, edit = opened
    before = store.read("x-2")
    edit(DAMAGES["a revision with no body"])
    worker = Worker(store, examples.handler(), POLICY, "w-1", lease=timedelta(seconds=30))
    with pytest.raises(StoreError) as raised:
        # x-1 was admitted first, so it is the first eligible execution a claim picks.
        worker.run_pass(max_claims=1)
    assert raised.value.code == "malformed_row" and "execution 'x-1'" in raised.value.message
    assert store.read("x-2") == before


def test_a_row_whose_state_was_edited_is_a_guard_conflict_that_says_so(
    opened: tuple[TransactionalStore, Callable[[str], Any]],
) -> None:
    # The execution's revision still reads, so nothing is malformed; but every guard written from it
    # misses the edited row. The refusal says what may have happened, and nothing is written.
    store, edit = opened
    edit("UPDATE objects SET state = 'waiting' WHERE object_id = 'x-1'")
    before = store.read("x-1")
    with pytest.raises(StoreError) as raised:
        service.cancel(store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", reason="r")
    assert raised.value.code == "guard_conflict" and "edited by hand" in raised.value.message
    assert store.read("x-1") == before
