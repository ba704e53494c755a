"""``fencekeeper serve --db postgresql://...``: the same server on PostgreSQL, driven over real HTTP.

Each request's rows are read back with SQL of the test's own (as the
superuser the fixtures connect as, past the tenant policies): what the
answers say is what committed, a refused request committed nothing, and
every transition wrote its outbox row.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

from .test_serve import call, register_purchase, serving

ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}


@contextlib.contextmanager
def sql(pg_dsn: str, schema: str) -> Iterator[Any]:
    with psycopg.connect(pg_dsn, autocommit=True, options=f"-c search_path={schema}") as conn:

        def rows(query: str, *params: Any) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.execute(query, params).fetchall()]  # type: ignore[arg-type]

        yield rows


def test_serve_on_postgresql_commits_what_it_answers(pg_dsn: str, pg_schema: str) -> None:
    register_purchase(pg_dsn, pg_schema)
    with serving(["--db", pg_dsn, "--schema", pg_schema]) as (base, process), sql(pg_dsn, pg_schema) as rows:
        capture = {"action": "capture_payment", "input": {"order": "o-1", "amount": 500}}
        status, created = call(base, "POST", "/operations", capture, {**ALICE, "Idempotency-Key": "k-1"})
        assert status == 201, created
        operation_id = created["operation_id"]
        assert rows("SELECT tenant, principal, client_key, action_name, state, outcome FROM operations") == [
            ("acme", "users:v1:alice", "k-1", "capture_payment", "awaiting_approval", None)
        ]
        assert rows("SELECT tenant, client_key, operation_id FROM operation_identities") == [("acme", "k-1", operation_id)]
        admitted = rows("SELECT revision, to_state FROM operation_transitions ORDER BY revision")
        assert admitted[-1][1] == "awaiting_approval"

        # Answered from what is stored, and nothing more is written: a replay, a conflict, a forged
        # tenant in the body, a body that does not parse.
        status, again = call(base, "POST", "/operations", capture, {**ALICE, "Idempotency-Key": "k-1"})
        assert (status, again["operation_id"], again["created"]) == (200, operation_id, False)
        conflict = {**capture, "input": {"order": "o-1", "amount": 7}}
        assert call(base, "POST", "/operations", conflict, {**ALICE, "Idempotency-Key": "k-1"})[0] == 409
        forged = {**capture, "tenant": "beta"}
        assert call(base, "POST", "/operations", forged, {**ALICE, "Idempotency-Key": "k-2"})[0] == 422
        assert call(base, "POST", "/operations", {"action": 5}, {**ALICE, "Idempotency-Key": "k-3"})[0] == 422
        assert rows("SELECT count(*) FROM operations") == [(1,)]
        assert rows("SELECT revision, to_state FROM operation_transitions ORDER BY revision") == admitted

        status, record = call(base, "GET", f"/operations/{operation_id}", headers=ALICE)
        assert (status, record["state"], record["tenant"]) == (200, "awaiting_approval", "acme")
        assert call(base, "GET", f"/operations/{operation_id}", headers=BOB)[0] == 404
        assert call(base, "POST", f"/operations/{operation_id}/cancel", {}, BOB)[0] == 404
        assert rows("SELECT state FROM operations") == [("awaiting_approval",)]

        status, cancelled = call(base, "POST", f"/operations/{operation_id}/cancel", {"reason": "not needed"}, ALICE)
        assert (status, cancelled["state"]) == (200, "cancelled"), cancelled
        assert rows("SELECT state, outcome, cancel_requested_by FROM operations") == [
            ("cancelled", "cancelled", "users:v1:alice")
        ]
        history = rows("SELECT revision, to_state, actor, reason FROM operation_transitions ORDER BY revision")
        assert [(r, s) for r, s, _, _ in history[:-1]] == admitted and history[-1][1:] == ("cancelled", "users:v1:alice", "not needed")
        served_history = call(base, "GET", f"/operations/{operation_id}/history", headers=ALICE)[1]["history"]
        assert [(h["revision"], h["to"]) for h in served_history] == [(r, s) for r, s, _, _ in history]
        # One outbox row per committed transition, in order, in the same tenant.
        assert rows(
            "SELECT topic, tenant FROM outbox WHERE kind = 'operation' AND subject_id = %s ORDER BY seq", operation_id
        ) == [(f"operation.{state}", "acme") for _, state, _, _ in history]

        # The executions' routes run on the same database.
        status, run = call(
            base, "POST", "/executions",
            {"definition": "purchase-approval", "input": {"amount": 2500, "order_id": "o-9", "order_revision": 1}}, ALICE,
        )  # fmt: skip
        assert status == 201 and run["business_id"] == "acme", run
        execution_id = run["execution_id"]
        assert rows("SELECT business_id FROM objects WHERE object_id = %s", execution_id) == [("acme",)]
        status, stopped = call(base, "POST", f"/executions/{execution_id}/cancel", {}, ALICE)
        assert status == 200, stopped
        assert rows("SELECT state FROM objects WHERE object_id = %s", execution_id) == [("cancelled",)]
        assert rows("SELECT topic FROM outbox WHERE kind = 'execution' AND subject_id = %s ORDER BY seq", execution_id)[-1] == (
            "execution.cancelled",
        )

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0


def test_many_clients_at_once_on_keep_alive_connections_get_no_server_error(pg_dsn: str, pg_schema: str) -> None:
    """Sixteen clients, each on one kept-alive connection, racing on shared keys, ids and events.

    The server's pools are smaller than its thread pool, so requests queue for a connection: each
    answer is still one of the documented ones, and the rows say one operation per key and one
    execution per id.
    """
    register_purchase(pg_dsn, pg_schema)
    answers: list[tuple[str, int, bytes]] = []
    lock = threading.Lock()
    start = threading.Barrier(16)

    def client(number: int, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        headers = {**ALICE, "Content-Type": "application/json"}
        start.wait()
        try:
            for round_ in range(6):
                for method, path, body, extra in (
                    ("POST", "/operations", {"action": "capture_payment", "input": {"order": f"o-{round_ % 3}", "amount": 5}},
                     {"Idempotency-Key": f"k-{round_ % 3}"}),
                    ("POST", "/executions", {"definition": "purchase-approval", "execution_id": f"po-{round_ % 3}",
                                             "input": {"amount": 5, "order_id": "o-1", "order_revision": 1}}, {}),
                    ("POST", "/events", {"type": "payment.received", "correlation": {"order_id": "o-1"},
                                         "event_id": f"ev-{round_ % 2}"}, {}),
                    ("POST", f"/executions/po-{(round_ + number) % 3}/cancel", {"reason": "r"}, {}),
                    ("GET", "/executions", None, {}),
                    ("HEAD", "/executions", None, {}),
                ):  # fmt: skip
                    conn.request(method, path, None if body is None else json.dumps(body), {**headers, **extra})
                    response = conn.getresponse()
                    data = response.read()
                    assert response.getheader("Content-Length") is not None
                    if method != "HEAD":
                        assert len(data) == int(response.getheader("Content-Length", "-1"))
                    with lock:
                        answers.append((f"{method} {path.split('/')[-1]}", response.status, data))
        finally:
            conn.close()

    with serving(["--db", pg_dsn, "--schema", pg_schema]) as (base, process), sql(pg_dsn, pg_schema) as rows:
        threads = [threading.Thread(target=client, args=(number, base)) for number in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        stderr = process.stderr.read() if process.stderr else ""
        assert len(answers) == 16 * 6 * 6
        failed = [(what, status, data[:200]) for what, status, data in answers if status >= 500]
        assert not failed, failed
        assert {status for what, status, _ in answers if what == "POST operations"} == {200, 201}
        assert {status for what, status, _ in answers if what == "POST executions"} == {201, 409}
        assert {status for what, status, _ in answers if what == "POST cancel"} <= {200, 404, 409}
        assert rows("SELECT count(*) FROM operations") == [(3,)]
        assert rows("SELECT count(DISTINCT client_key) FROM operation_identities") == [(3,)]
        assert sorted(r[0] for r in rows("SELECT workflow_execution_id FROM workflow_dispatch")) == ["po-0", "po-1", "po-2"]
        assert "Traceback" not in stderr, stderr
