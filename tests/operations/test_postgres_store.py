"""The operation store suite and the service state machine against PostgreSQL (a schema per test)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.postgres_store import migrate
from fencekeeper.adapters.testing.operations_suite import (
    OperationStoreTests,
    OpsStoreFactory,
    run_operation_state_machine,
)


@pytest.fixture(scope="module")
def shared_schema(pg_dsn: str) -> Iterator[str]:
    """One migrated schema for the module; each store made from it starts from emptied tables."""
    schema = f"fk_ops_{uuid.uuid4().hex[:12]}"
    migrate(pg_dsn, schema)
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def factory_for(pg_dsn: str, schema: str) -> OpsStoreFactory:
    def make(clock: object) -> PostgresOperationStore:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
            conn.execute(
                "TRUNCATE operation_outbox, operation_transitions, operation_attempts, operation_identities, "
                "operations"
            )
            conn.execute("DROP TABLE IF EXISTS app_accounts, app_transfers")
        return PostgresOperationStore(pg_dsn, schema=schema, clock=clock, pool_size=2)  # type: ignore[arg-type]

    return make


class TestPostgresOperationStore(OperationStoreTests):
    @pytest.fixture
    def ops_store_factory(self, pg_dsn: str, shared_schema: str) -> OpsStoreFactory:
        return factory_for(pg_dsn, shared_schema)


def test_service_state_machine_on_postgres(pg_dsn: str, shared_schema: str) -> None:
    run_operation_state_machine(factory_for(pg_dsn, shared_schema), max_examples=5)


def test_database_time_decides_without_an_injected_clock(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresOperationStore(pg_dsn, schema=pg_schema)
    try:
        with psycopg.connect(pg_dsn) as conn:
            database_now = conn.execute("SELECT clock_timestamp()").fetchone()
        assert database_now is not None
        assert abs((store.now() - database_now[0]).total_seconds()) < 5
    finally:
        store.close()
