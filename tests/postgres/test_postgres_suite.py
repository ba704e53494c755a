"""The PostgreSQL store passes the shipped store suite, unchanged, against a real server.

Exactly as for the memory and SQLite stores (tests/stores): one import and
one fixture.  Every store the suite asks for gets its own freshly migrated
schema, so tests never see each other's rows; the schemas are dropped
afterwards.  The stateful machine compares the store with the pure kernel
model request by request.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from fencekeeper.adapters.postgres_store import PostgresStore, migrate
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing import StoreFactory, StoreTests


class _Schemas:
    """Makes a store in a new schema per call; drops them all at the end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.made: list[tuple[str, PostgresStore]] = []

    def __call__(self, clock: ManualClock) -> PostgresStore:
        schema = f"fk_suite_{uuid.uuid4().hex[:12]}"
        migrate(self.dsn, schema)
        store = PostgresStore(self.dsn, schema=schema, clock=clock, pool_size=1)
        self.made.append((schema, store))
        return store

    def drop_all(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for schema, store in self.made:
                store.close()
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
        self.made.clear()


@pytest.fixture
def schemas(pg_dsn: str) -> Iterator[_Schemas]:
    made = _Schemas(pg_dsn)
    yield made
    made.drop_all()


class TestPostgresStore(StoreTests):
    @pytest.fixture
    def store_factory(self, schemas: _Schemas) -> StoreFactory:
        return schemas

