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
                "TRUNCATE outbox, operation_transitions, operation_attempts, operation_identities, "
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


def test_a_lease_that_expires_during_the_action_is_judged_by_database_time(pg_dsn: str, shared_schema: str) -> None:
    import time  # noqa: PLC0415
    from datetime import timedelta  # noqa: PLC0415

    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.testing.operations_suite import accounts, open_accounts  # noqa: PLC0415
    from fencekeeper.kernel import operations as o  # noqa: PLC0415

    store = factory_for(pg_dsn, shared_schema)(None)  # emptied tables; no clock: the database's time
    try:
        open_accounts(store, {"acc-1": 100, "acc-2": 0})
        service = examples.registry()
        from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
            DurableOperationService,
            PrincipalReference,
        )

        DurableOperationService(store, service, examples.resolvers()).submit(
            tenant="t", principal=PrincipalReference("users", 1, "alice"), action="transfer",
            input={"from": "acc-1", "to": "acc-2", "amount": 10}, client_key="k",
        )
        claim = store.claim_next("t", "w1", timedelta(milliseconds=400))
        assert isinstance(claim, o.Decision) and claim.credential is not None
        ran: list[int] = []

        def slow(context: object) -> str:
            ran.append(1)
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})  # type: ignore[arg-type]
            time.sleep(0.6)
            return "null"

        outcome = store.complete(o.CompleteRequest(claim.credential, o.Authority(True, "users:v1:alice")), slow)
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.LEASE_EXPIRED
        assert ran == [1], "decided again after the failed write, the kernel refuses before running the action"
        assert accounts(store) == {"acc-1": 100, "acc-2": 0}
    finally:
        store.close()
