"""One operation store per test, SQLite or PostgreSQL, with a clock the test moves, and a World over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import World, open_accounts


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[TransactionalOperationStore]:
    opened: TransactionalOperationStore
    if request.param == "sqlite":
        opened = SQLiteOperationStore(tmp_path / "ops.db", clock)
    else:
        from fencekeeper.adapters.operations.postgres import PostgresOperationStore  # noqa: PLC0415

        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        opened = PostgresOperationStore(dsn, schema=schema, clock=clock, pool_size=4)
    open_accounts(opened, {"acc-1": 1_000_000, "acc-2": 0})
    yield opened
    opened.close()


@pytest.fixture
def world(store: TransactionalOperationStore, clock: ManualClock) -> World:
    return World(store, clock)


def rows(store: TransactionalOperationStore, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    return getattr(store, "application_execute")(sql, params)  # noqa: B009 - both SQL stores have it
