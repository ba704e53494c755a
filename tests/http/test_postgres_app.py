"""The HTTP boundary on PostgreSQL as the restricted application role: each request runs in its tenant's scope.

The store is opened unbound (it serves every tenant); forced row-level
security admits a request's statements only because the boundary scopes
each one to the authenticated tenant.
"""

from __future__ import annotations

from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from fencekeeper.adapters.http import create_operations_app
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from tests.operations.test_postgres_tenant_boundary import restricted_role

from . import deployment

__all__ = ["restricted_role"]  # the fixture, used by name below

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


def test_requests_run_in_their_tenant_under_row_level_security(pg_dsn: str, pg_schema: str, restricted_role: str) -> None:
    store = PostgresOperationStore(make_conninfo(pg_dsn, user=restricted_role), schema=pg_schema, pool_size=2)
    try:
        app = create_operations_app(
            authenticate=deployment.authenticate,
            operations=store,
            actions=deployment.registry(),
            resolvers=deployment.resolvers(),
        )
        with TestClient(app) as client:
            body = {"action": "balance", "input": {"account": "acc-1"}}
            alice = client.post("/operations", json=body, headers={**ALICE, "Idempotency-Key": "k-1"})
            assert alice.status_code == 201, alice.text
            bob = client.post("/operations", json=body, headers={**BOB, "Idempotency-Key": "k-1"})
            assert bob.status_code == 201, bob.text
            operation_id = alice.json()["operation_id"]
            assert client.get(f"/operations/{operation_id}", headers=ALICE).status_code == 200
            assert client.get(f"/operations/{operation_id}/history", headers=ALICE).json()["history"][0]["to"] == "admitted"
            assert client.get(f"/operations/{operation_id}", headers=BOB).status_code == 404
            cancelled = client.post(f"/operations/{operation_id}/cancel", json={}, headers=ALICE)
            assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        # Outside a request's scope the same store sees nothing: the database, not only the boundary, filtered.
        assert store.get(operation_id) is None
        with store.tenant_scope("acme"):
            assert store.get(operation_id) is not None
    finally:
        store.close()
