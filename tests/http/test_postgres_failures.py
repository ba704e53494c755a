"""The HTTP boundary on PostgreSQL when the database does not simply answer: a row held, a race, a lost connection.

A store that cannot do a request now is 503 with its stable code (retry),
never a 500; two clients submitting the same request at once get one
Operation or execution between them.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from fencekeeper.adapters import service
from fencekeeper.adapters.http import create_operations_app
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.kernel.definition import parse_definition

from . import deployment

PURCHASE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "purchase_approval.toml"
ALICE = {"Authorization": "Bearer alice-token"}
ORDER = {"amount": 5, "order_id": "o-1", "order_revision": 1}


@pytest.fixture
def served(pg_dsn: str, pg_schema: str) -> Iterator[TestClient]:
    with served_on(pg_dsn, pg_schema) as client:
        yield client


@contextlib.contextmanager
def served_on(pg_dsn: str, pg_schema: str) -> Iterator[TestClient]:
    executions = PostgresStore(pg_dsn, schema=pg_schema, lock_timeout=0.2, pool_size=4)
    operations = PostgresOperationStore(pg_dsn, schema=pg_schema, lock_timeout=0.2, pool_size=4)
    policy = deployment.policy()
    definition = parse_definition(PURCHASE.read_text(encoding="utf-8"), PURCHASE.name)
    service.register(executions, definition, "acme", deployment.ALICE.executions_principal, policy)
    app = create_operations_app(
        authenticate=deployment.authenticate,
        operations=operations,
        actions=deployment.registry(),
        resolvers=deployment.resolvers(),
        executions=executions,
        policy=policy,
    )
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        operations.close()
        executions.close()


@contextlib.contextmanager
def held(pg_dsn: str, schema: str, query: str, *params: Any) -> Iterator[None]:
    """Rows locked by another session's open transaction until the block ends."""
    with psycopg.connect(pg_dsn, options=f"-c search_path={schema}") as conn:
        assert conn.execute(query, params).fetchall()  # type: ignore[arg-type]
        yield
        conn.rollback()


def test_an_execution_row_held_past_the_lock_timeout_is_503_row_locked(
    served: TestClient, pg_dsn: str, pg_schema: str
) -> None:
    run = served.post(
        "/executions", json={"definition": "purchase-approval", "execution_id": "po-1", "input": ORDER}, headers=ALICE
    )
    assert run.status_code == 201, run.text
    with held(pg_dsn, pg_schema, "SELECT 1 FROM objects WHERE object_id = %s FOR UPDATE", "po-1"):
        locked = served.post("/executions/po-1/cancel", json={"reason": "r"}, headers=ALICE)
    assert locked.status_code == 503, locked.text
    assert locked.json()["error"]["code"] == "row_locked"
    assert locked.headers["Retry-After"] == "1"
    assert not locked.json()["error"]["message"].endswith("[row_locked]")
    assert served.get("/executions/po-1", headers=ALICE).json()["execution"]["state"] == "eligible"
    # Retried once the holder is gone, it goes through.
    cancelled = served.post("/executions/po-1/cancel", json={"reason": "r"}, headers=ALICE)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled", cancelled.text


def test_the_same_submission_from_two_clients_at_once_is_one(served: TestClient) -> None:
    barrier = threading.Barrier(4)
    answers: list[Any] = []

    def submit() -> None:
        barrier.wait()
        answers.append(
            served.post(
                "/operations",
                json={"action": "capture_payment", "input": {"order": "o-1", "amount": 500}},
                headers={**ALICE, "Idempotency-Key": "k-race"},
            )
        )

    def run() -> None:
        barrier.wait()
        answers.append(
            served.post(
                "/executions",
                json={"definition": "purchase-approval", "execution_id": "po-race", "input": ORDER},
                headers=ALICE,
            )
        )

    threads = [threading.Thread(target=f) for f in (submit, submit, run, run)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    operations = [a for a in answers if a.request.url.path == "/operations"]
    executions = [a for a in answers if a.request.url.path == "/executions"]
    assert sorted(a.status_code for a in operations) == [200, 201], [a.text for a in operations]
    assert len({a.json()["operation_id"] for a in operations}) == 1
    assert sorted(a.status_code for a in executions) == [201, 409], [a.text for a in executions]
    refused = next(a.json()["error"] for a in executions if a.status_code == 409)
    assert refused == {"code": "already_exists", "message": "execution 'po-race' already exists"}
    assert [x["execution_id"] for x in served.get("/executions", headers=ALICE).json()["executions"]] == ["po-race"]


def test_a_lost_connection_is_503_and_the_next_request_is_served(pg_dsn: str, pg_schema: str) -> None:
    # The server's own connections, by a name of their own: the database may serve others too.
    name = f"fk-http-{pg_schema}"
    with served_on(make_conninfo(pg_dsn, application_name=name), pg_schema) as client:
        run = client.post(
            "/executions",
            json={"definition": "purchase-approval", "execution_id": "po-1", "input": ORDER},
            headers=ALICE,
        )
        assert run.status_code == 201, run.text
        assert client.get("/operations/op-none", headers=ALICE).status_code == 404
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchall()
        assert ended
        answers = [client.get("/executions/po-1", headers=ALICE) for _ in range(5)]
        answers += [client.get("/operations/op-none", headers=ALICE) for _ in range(5)]
        for answer in answers:
            assert answer.status_code in (200, 404, 503), answer.text
            if answer.status_code == 503:
                assert answer.json()["error"]["code"] == "store_unavailable"
        assert answers[4].status_code == 200 and answers[-1].status_code == 404


def test_text_postgresql_cannot_keep_is_refused_before_the_store(served: TestClient) -> None:
    created = served.post(
        "/operations",
        json={"action": "capture_payment", "input": {"order": "o-1", "amount": 500}},
        headers={**ALICE, "Idempotency-Key": "k-1"},
    )
    operation_id = created.json()["operation_id"]
    for path in ("/operations/a%00b", "/operations/a%00b/history"):
        missing = served.get(path, headers=ALICE)
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"]["code"] == "operation_not_found"
    for reason in ("a\x00b", "a\ud800"):
        refused = served.post(
            f"/operations/{operation_id}/cancel",
            content=json.dumps({"reason": reason}),
            headers={**ALICE, "Content-Type": "application/json"},
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["message"].startswith("reason: contains")
    record = served.get(f"/operations/{operation_id}/history", headers=ALICE).json()
    assert [line["to"] for line in record["history"]] == ["awaiting_approval"]
