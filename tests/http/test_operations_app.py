"""The HTTP boundary in process (Starlette's TestClient): who may do what, and what a refusal leaves behind.

Authentication is the deployment's (tests/http/deployment.py): no body or
header chooses its own principal or tenant.  Every refusal below is checked
against a dump of the whole database taken before it: nothing is written.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fencekeeper.adapters import connect, service
from fencekeeper.adapters.http import create_operations_app
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    DurableOperationService,
    EffectClass,
)
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.kernel.definition import parse_definition

from . import deployment

ROOT = Path(__file__).resolve().parents[2]
PURCHASE = ROOT / "docs" / "examples" / "purchase_approval.toml"
ALICE = {"Authorization": "Bearer alice-token"}
BOB = {"Authorization": "Bearer bob-token"}
CAROL = {"Authorization": "Bearer carol-token"}
MALLORY = {"Authorization": "Bearer mallory-token"}
CAPTURE = {"action": "capture_payment", "input": {"order": "o-1", "amount": 500}}


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    db = tmp_path / "http.db"
    executions = connect.open_store(str(db))
    operations = SQLiteOperationStore(db)
    policy = deployment.policy()
    definition = parse_definition(PURCHASE.read_text(encoding="utf-8"), PURCHASE.name)
    service.register(executions, definition, "acme", deployment.ALICE.executions_principal, policy)
    application = create_operations_app(
        authenticate=deployment.authenticate,
        operations=operations,
        actions=deployment.registry(),
        resolvers=deployment.resolvers(),
        executions=executions,
        policy=policy,
    )
    try:
        with TestClient(application) as client:
            yield client, db
    finally:
        operations.close()
        executions.close()


def dump(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return list(conn.iterdump())


def error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]  # type: ignore[no-any-return]


def submit(client: TestClient, headers: dict[str, str], key: str, body: dict[str, Any] = CAPTURE) -> Any:
    return client.post("/operations", json=body, headers={**headers, "Idempotency-Key": key})


def test_a_request_without_a_valid_identity_is_401(app: tuple[TestClient, Path]) -> None:
    client, db = app
    before = dump(db)
    for headers in ({}, {"Authorization": "Bearer nobody"}, {"Authorization": "Basic YWxpY2U6eA=="}):
        for method, path in (
            ("POST", "/operations"), ("GET", "/operations/op-1"), ("GET", "/operations/op-1/history"),
            ("POST", "/operations/op-1/decision"), ("POST", "/operations/op-1/cancel"),
            ("POST", "/executions"), ("GET", "/executions"), ("GET", "/executions/x-1"),
            ("POST", "/executions/x-1/decision"), ("POST", "/executions/x-1/cancel"), ("POST", "/events"),
        ):  # fmt: skip
            response = client.request(method, path, json=CAPTURE, headers={**headers, "Idempotency-Key": "k"})
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert error(response)["code"] == "not_authenticated"
    assert dump(db) == before


def test_submission_is_idempotent_and_a_conflicting_reuse_is_409(app: tuple[TestClient, Path]) -> None:
    client, db = app
    first = submit(client, ALICE, "k-1")
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True and first.json()["tenant"] == "acme"
    assert first.json()["principal"] == "users:v1:alice"
    again = submit(client, ALICE, "k-1")
    assert again.status_code == 200 and again.json()["operation_id"] == first.json()["operation_id"]
    assert again.json()["created"] is False
    before = dump(db)
    conflict = submit(client, ALICE, "k-1", {"action": "capture_payment", "input": {"order": "o-1", "amount": 999}})
    assert conflict.status_code == 409, conflict.text
    assert error(conflict)["code"] == "idempotency_conflict"
    assert dump(db) == before
    # The same key of another principal is another identity.
    other = submit(client, CAROL, "k-1")
    assert other.status_code == 201 and other.json()["operation_id"] != first.json()["operation_id"]


def test_an_idempotency_key_sent_twice_is_422_and_nothing_is_written(app: tuple[TestClient, Path]) -> None:
    # The first was taken: admitted under a key the client may not have meant, and a retry that sends the
    # other key admits a second operation.
    client, db = app
    before = dump(db)
    headers = [*ALICE.items(), ("Content-Type", "application/json"), ("Idempotency-Key", "k-1"), ("Idempotency-Key", "k-2")]
    response = client.post("/operations", json=CAPTURE, headers=headers)
    assert response.status_code == 422, response.text
    assert (error(response)["code"], error(response)["field"]) == ("invalid_body", "Idempotency-Key")
    assert dump(db) == before


def test_status_history_decision_and_cancellation(app: tuple[TestClient, Path]) -> None:
    client, _ = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    status = client.get(f"/operations/{operation_id}", headers=ALICE)
    assert status.status_code == 200 and status.json()["state"] == "awaiting_approval"
    history = client.get(f"/operations/{operation_id}/history", headers=ALICE).json()["history"]
    assert [line["to"] for line in history] == ["awaiting_approval"]
    digest = status.json()["input_digest"]
    approved = client.post(f"/operations/{operation_id}/decision", json={"approve": True, "input_digest": digest}, headers=CAROL)
    assert approved.status_code == 200, approved.text
    assert approved.json()["approved_by"] == "users:v1:carol"
    cancelled = client.post(f"/operations/{operation_id}/cancel", json={"reason": "changed my mind"}, headers=ALICE)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    again = client.post(f"/operations/{operation_id}/decision", json={"approve": False}, headers=CAROL)
    assert again.status_code == 409, again.text


def test_a_forged_tenant_reaches_nothing_and_writes_nothing(app: tuple[TestClient, Path]) -> None:
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    execution = client.post(
        "/executions", json={"definition": "purchase-approval", "input": {"amount": 2500, "order_id": "o-1", "order_revision": 1}},
        headers=ALICE,
    )  # fmt: skip
    assert execution.status_code == 201, execution.text
    execution_id = execution.json()["execution_id"]
    before = dump(db)
    # A body cannot choose the tenant or the principal.
    for field, value in (("tenant", "beta"), ("principal", "users:v1:bob"), ("namespace", "other")):
        forged = submit(client, BOB, "k-forged", {**CAPTURE, field: value})
        assert forged.status_code == 422, forged.text
        assert error(forged)["field"] == field
    forged_run = client.post("/executions", json={"definition": "purchase-approval", "business": "acme"}, headers=BOB)
    assert forged_run.status_code == 422
    # Nor does a header: bob's tenant is beta, whatever he sends.
    spoofed = {**BOB, "X-Tenant": "acme", "X-Fencekeeper-Tenant": "acme"}
    for method, path, body in (
        ("GET", f"/operations/{operation_id}", None),
        ("GET", f"/operations/{operation_id}/history", None),
        ("POST", f"/operations/{operation_id}/decision", {"approve": True}),
        ("POST", f"/operations/{operation_id}/cancel", {}),
        ("GET", f"/executions/{execution_id}", None),
        ("POST", f"/executions/{execution_id}/cancel", {}),
        ("POST", f"/executions/{execution_id}/decision", {"determination": "approved"}),
    ):
        response = client.request(method, path, json=body, headers=spoofed)
        assert response.status_code == 404, (method, path, response.text)
    assert client.get("/executions", headers=spoofed).json() == {"executions": []}
    assert dump(db) == before
    assert client.get(f"/operations/{operation_id}", headers=ALICE).json()["state"] == "awaiting_approval"


def test_a_principal_without_the_grant_is_403_and_nothing_is_written(app: tuple[TestClient, Path]) -> None:
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    execution = client.post(
        "/executions", json={"definition": "purchase-approval", "input": {"amount": 5, "order_id": "o-1", "order_revision": 1}},
        headers=ALICE,
    )  # fmt: skip
    assert execution.status_code == 201, execution.text
    execution_id = execution.json()["execution_id"]
    before = dump(db)
    refused = [
        submit(client, MALLORY, "k-m"),
        client.post(f"/operations/{operation_id}/decision", json={"approve": True}, headers=MALLORY),
        client.post(f"/operations/{operation_id}/cancel", json={}, headers=MALLORY),
        # Seed 000, Cancellation: the executions' policy grants mallory nothing, so her cancel writes nothing.
        client.post(f"/executions/{execution_id}/cancel", json={"reason": "mine now"}, headers=MALLORY),
        client.post(
            "/executions", json={"definition": "purchase-approval", "input": {"amount": 5, "order_id": "o-2", "order_revision": 1}},
            headers=MALLORY,
        ),
    ]
    for response in refused:
        assert response.status_code == 403, response.text
        assert error(response)["code"] == "not_authorized"
    assert dump(db) == before


MALFORMED_OPERATIONS: list[tuple[str, str, bytes | None, str | None]] = [
    ("/operations", "not json", b"{", None),
    ("/operations", "an array", b"[]", None),
    ("/operations", "no action", b'{"input": {}}', "action"),
    ("/operations", "action not a string", b'{"action": 5}', "action"),
    ("/operations", "version zero", b'{"action": "capture_payment", "version": 0}', "version"),
    ("/operations", "version a bool", b'{"action": "capture_payment", "version": true}', "version"),
    ("/operations", "unknown field", b'{"action": "capture_payment", "input": {}, "priority": 1}', "priority"),
    ("/operations", "unknown action", b'{"action": "nope", "input": {}}', None),
    ("/operations", "input the action rejects", b'{"action": "capture_payment", "input": {"order": "o"}}', None),
    ("/operations", "not a finite number", b'{"action": "capture_payment", "input": {"order": "o", "amount": NaN}}', None),
    ("/operations/{op}/decision", "approve missing", b"{}", "approve"),
    ("/operations/{op}/decision", "approve a string", b'{"approve": "yes"}', "approve"),
    ("/operations/{op}/decision", "approval id malformed", b'{"approve": true, "approval_id": "a b"}', "approval_id"),
    ("/operations/{op}/cancel", "reason a number", b'{"reason": 5}', "reason"),
    ("/operations/{op}/cancel", "reason with a lone surrogate", b'{"reason": "a\\ud800"}', "reason"),
    ("/operations/{op}/cancel", "reason with NUL", b'{"reason": "a\\u0000b"}', "reason"),
    ("/executions", "definition as text", b'{"definition": "id = \\"x\\"\\nrevision = 1"}', "definition"),
    ("/executions", "input not an object", b'{"definition": "purchase-approval", "input": [1]}', "input"),
    ("/executions", "input the definition rejects", b'{"definition": "purchase-approval", "input": {"amount": "x"}}', None),
    ("/executions/{x}/decision", "determination unknown", b'{"determination": "maybe"}', "determination"),
    # Malformed whatever the execution's state: 422 with its field, not the 409 of a refusal.
    ("/executions/{x}/decision", "rationale too long", b'{"determination": "approved", "rationale": "' + b"r" * 2001 + b'"}', "rationale"),
    ("/executions/{x}/cancel", "reason a list", b'{"reason": []}', "reason"),
    ("/executions/{x}/cancel", "execution reason with a lone surrogate", b'{"reason": "\\udc00"}', "reason"),
    ("/events", "no correlation", b'{"type": "payment.received"}', "correlation"),
    ("/events", "payload not finite", b'{"type": "paid", "correlation": {"a": "b"}, "payload": {"x": NaN}}', None),
    ("/events", "correlation a string", b'{"type": "payment.received", "correlation": "o-1"}', "correlation"),
    ("/events", "correlation empty", b'{"type": "payment.received", "correlation": {}}', "correlation"),
    # Read as the command line reads its JSON (kernel/strict_json.py): json would keep the second, silently.
    ("/operations/{op}/cancel", "a member named twice", b'{"reason": "a", "reason": "b"}', None),
]


@pytest.mark.parametrize(("path", "what", "body", "field"), MALFORMED_OPERATIONS, ids=[m[1] for m in MALFORMED_OPERATIONS])
def test_a_malformed_body_is_422_naming_the_field_and_writes_nothing(
    app: tuple[TestClient, Path], path: str, what: str, body: bytes, field: str | None
) -> None:
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    execution = client.post(
        "/executions", json={"definition": "purchase-approval", "input": {"amount": 2500, "order_id": "o-1", "order_revision": 1}},
        headers=ALICE,
    )  # fmt: skip
    execution_id = execution.json()["execution_id"]
    before = dump(db)
    keyed = {"Idempotency-Key": "k-2"} if path == "/operations" else {}
    response = client.post(
        path.format(op=operation_id, x=execution_id),
        content=body,
        headers={**ALICE, **keyed, "Content-Type": "application/json"},
    )
    assert response.status_code == 422, (what, response.text)
    problem = error(response)
    if field is not None:
        assert problem.get("field") == field or problem["message"].startswith(f"{field}:"), problem
    assert dump(db) == before


EVENT_REFUSALS = [
    # Each names the body member the request carried: the Event as a whole ("event") is no member of it.
    # A member within it follows, as the kernel names it (as an input's member is: "input: input.total").
    (b'{"type": "paid", "correlation": {"a": "b"}, "payload": {"x": ["a\\u0000"]}}', "payload",
     "payload: payload.x[0]: contains NUL (U+0000), which a store cannot keep in text"),
    (b'{"type": "payment.received", "correlation": {}}', "correlation",
     "correlation: at least one value; an Event without correlation matches no waiter"),
    (b'{"type": "payment.received", "correlation": {"order_id": [1]}}', "correlation",
     "correlation: correlation.order_id: correlation values are strings, integers or booleans, not list"),
    (b'{"type": "", "correlation": {"a": "b"}}', "type", "type: malformed identifier ''"),
    (b'{"type": "fencekeeper.approval", "correlation": {"a": "b"}}', "type",
     "type: 'fencekeeper.approval' is reserved: types beginning 'fencekeeper.' are the kernel's own waits, "
     "which only an authorized decision wakes"),
]


@pytest.mark.parametrize(("body", "field", "message"), EVENT_REFUSALS, ids=["payload", "correlation-empty",
                                                                            "correlation-member", "type-empty",
                                                                            "type-reserved"])
def test_an_event_refusal_names_the_member_the_request_carried(
    app: tuple[TestClient, Path], body: bytes, field: str, message: str
) -> None:
    client, db = app
    before = dump(db)
    response = client.post("/events", content=body, headers={**ALICE, "Content-Type": "application/json"})
    assert (response.status_code, error(response)) == (422, {"code": "invalid_event", "field": field, "message": message})
    assert dump(db) == before


def test_submission_without_an_idempotency_key_is_422(app: tuple[TestClient, Path]) -> None:
    client, db = app
    before = dump(db)
    response = client.post("/operations", json=CAPTURE, headers=ALICE)
    assert response.status_code == 422
    assert error(response) == {
        "code": "idempotency_key_missing",
        "message": "Idempotency-Key: this request requires the header",
        "field": "Idempotency-Key",
    }
    malformed = client.post("/operations", json=CAPTURE, headers={**ALICE, "Idempotency-Key": "a b"})
    assert malformed.status_code == 422
    assert dump(db) == before


def test_workflow_executions_run_list_inspect_event_and_cancel(app: tuple[TestClient, Path]) -> None:
    client, _ = app
    run = client.post(
        "/executions",
        json={"definition": "purchase-approval", "execution_id": "po-1", "input": {"amount": 5, "order_id": "o-1", "order_revision": 1}},
        headers=ALICE,
    )
    assert run.status_code == 201, run.text
    assert run.json()["business_id"] == "acme" and run.json()["state"] == "eligible"
    again = client.post("/executions", json={"definition": "purchase-approval", "execution_id": "po-1", "input": {}}, headers=ALICE)
    assert again.status_code in (409, 422), again.text
    listed = client.get("/executions", headers=ALICE).json()["executions"]
    assert [x["execution_id"] for x in listed] == ["po-1"]
    assert client.get("/executions?state=nonsense", headers=ALICE).status_code == 422
    inspected = client.get("/executions/po-1", headers=ALICE)
    assert inspected.status_code == 200 and inspected.json()["execution"]["execution_id"] == "po-1"
    published = client.post("/events", json={"type": "payment.received", "correlation": {"order_id": "o-9"}}, headers=ALICE)
    assert published.status_code == 200, published.text
    cancelled = client.post("/executions/po-1/cancel", json={"reason": "test"}, headers=ALICE)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["state"] == "cancelled"
    assert client.post("/executions/po-1/cancel", json={}, headers=ALICE).status_code == 409
    # A definition that is not registered is named as one; the Python client's hint about files is not a request's.
    unknown = client.post("/executions", json={"definition": "nowhere", "input": {}}, headers=ALICE)
    assert unknown.status_code == 404 and error(unknown)["code"] == "definition_not_found", unknown.text
    assert "'nowhere'" in unknown.text and "pathlib" not in unknown.text


def test_a_body_over_the_limit_is_413_and_unread(app: tuple[TestClient, Path]) -> None:
    from fencekeeper.adapters.http import MAX_BODY_BYTES  # noqa: PLC0415

    client, db = app
    before = dump(db)
    huge = b'{"action": "capture_payment", "input": "' + b"x" * MAX_BODY_BYTES + b'"}'
    response = client.post(
        "/operations", content=huge, headers={**ALICE, "Idempotency-Key": "k-big", "Content-Type": "application/json"}
    )
    assert response.status_code == 413 and error(response)["code"] == "body_too_large"
    assert dump(db) == before


EVENT = b'{"type": "payment.received", "correlation": {"order_id": "o-1"}, "payload": '


@pytest.mark.parametrize(
    ("payload", "status", "problem"),
    [
        # Inside the 1 MiB body, past the payload's bound: malformed, as an object input past its own is.
        (
            b'{"blob": "' + b"x" * 65_526 + b'"}',
            422,
            {"code": "invalid_event", "field": "payload",
             "message": "payload: is longer than 65536 characters as compact JSON"},
        ),
        (
            b'{"a": ' * 32 + b"{}" + b"}" * 32,
            422,
            {"code": "invalid_event", "field": "payload", "message": "payload: nests deeper than 32 levels"},
        ),
        # Past what the body's reader follows: refused before the payload is looked at.
        (
            b'{"a": ' * 100_000 + b"{}" + b"}" * 100_000,
            422,
            {"code": "invalid_body", "message": "the body is not JSON this boundary reads: nested too deeply"},
        ),
        # Past the body's bound (a 50 MB payload among them): 413, unread.
        (
            b'{"blob": "' + b"x" * (2 << 20) + b'"}',
            413,
            {"code": "body_too_large", "message": f"the body is {len(EVENT) + (2 << 20) + 13} bytes; at most 1048576 are read"},
        ),
    ],
    ids=["65537-characters", "33-levels", "100000-levels", "2MiB"],
)  # fmt: skip
def test_an_event_payload_past_a_bound_is_refused_naming_it_and_writes_nothing(
    app: tuple[TestClient, Path], payload: bytes, status: int, problem: dict[str, str]
) -> None:
    client, db = app
    before = dump(db)
    response = client.post(
        "/events", content=EVENT + payload + b"}", headers={**ALICE, "Content-Type": "application/json"}
    )
    assert (response.status_code, error(response)) == (status, problem)
    assert dump(db) == before
    # A payload at the bounds is published.
    at_bound = b'{"blob": "' + b"x" * 65_525 + b'"}'
    assert client.post("/events", content=EVENT + at_bound + b"}", headers={**ALICE, "Content-Type": "application/json"}).status_code == 200


def test_an_async_authenticate_is_awaited(tmp_path: Path) -> None:
    async def authenticate(request: Any) -> Any:
        return deployment.authenticate(request)

    store = SQLiteOperationStore(tmp_path / "async.db")
    try:
        application = create_operations_app(
            authenticate=authenticate, operations=store, actions=deployment.registry(), resolvers=deployment.resolvers()
        )
        with TestClient(application) as client:
            assert submit(client, {}, "k-1").status_code == 401
            created = submit(client, ALICE, "k-1")
            assert created.status_code == 201 and created.json()["principal"] == "users:v1:alice"
            # Without an execution store the execution routes are not there at all.
            assert client.get("/executions", headers=ALICE).status_code == 404
    finally:
        store.close()


def test_http_and_python_take_numbers_equal_in_json_for_one_input(tmp_path: Path) -> None:
    # A JavaScript client cannot write 1.0, and a Python one may: both resend one request (specs/operations.md,
    # "Equal input"), whichever surface admitted it first, and both refuse the same other input.
    store = SQLiteOperationStore(tmp_path / "numbers.db")
    record = DurableAction("record", 1, EffectClass.READ_ONLY, lambda value: value)
    actions = DurableActionRegistry((record,))
    try:
        application = create_operations_app(
            authenticate=deployment.authenticate, operations=store, actions=actions, resolvers=deployment.resolvers()
        )
        python = DurableOperationService(store, actions, deployment.resolvers())
        headers = {**ALICE, "Content-Type": "application/json"}
        with TestClient(application) as client:

            def post(key: str, body: bytes) -> Any:
                return client.post("/operations", content=body, headers={**headers, "Idempotency-Key": key})

            first = post("k-1", b'{"action": "record", "input": {"amount": 1.0, "credit": -0.0}}')
            assert first.status_code == 201, first.text
            assert first.json()["input"] == {"amount": 1, "credit": 0}
            again = post("k-1", b'{"action": "record", "input": {"amount": 1, "credit": 0}}')
            assert (again.status_code, again.json()["operation_id"]) == (200, first.json()["operation_id"])
            admitted = python.submit(tenant="acme", principal=deployment.ALICE.reference, action="record",
                                     input={"amount": 1, "credit": 0.0}, client_key="k-1")
            assert (admitted.operation_id, admitted.created) == (first.json()["operation_id"], False)
            assert admitted.record.input_digest == first.json()["input_digest"]
            # Admitted by Python first, found over HTTP.
            second = python.submit(tenant="acme", principal=deployment.ALICE.reference, action="record",
                                   input={"amount": 2}, client_key="k-2")
            over_http = post("k-2", b'{"action": "record", "input": {"amount": 2.0}}')
            assert (over_http.status_code, over_http.json()["operation_id"]) == (200, second.operation_id)
            conflict = post("k-2", b'{"action": "record", "input": {"amount": 2.5}}')
            assert conflict.status_code == 409 and error(conflict)["code"] == "idempotency_conflict"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("store_unavailable", 503),
        ("row_locked", 503),
        ("store_locked", 503),
        ("tenant_denied", 403),
        ("permission_denied", 500),
        ("schema_mismatch", 500),
    ],
)
def test_a_store_error_maps_to_its_status(code: str, status: int) -> None:
    from fencekeeper.adapters import http  # noqa: PLC0415
    from fencekeeper.adapters.store import StoreError  # noqa: PLC0415

    problem = http._from_store_error(StoreError(code, "why"))
    assert (problem.status, problem.code) == (status, code)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 100_000, id="nested deeper than the parser recurses"),
        pytest.param(b'{"action": "capture_payment", "version": ' + b"9" * 5000 + b"}", id="an integer of 5000 digits"),
    ],
)
def test_a_body_the_parser_cannot_read_is_422_not_a_server_error(app: tuple[TestClient, Path], body: bytes) -> None:
    client, db = app
    before = dump(db)
    response = TestClient(client.app, raise_server_exceptions=False).post(
        "/operations", content=body, headers={**ALICE, "Idempotency-Key": "k-1", "Content-Type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert error(response)["code"] == "invalid_body"
    assert dump(db) == before


@pytest.mark.parametrize("amount", [b"18446744073709551616", b"-9223372036854775809", b"1" + b"0" * 30])
def test_an_input_integer_no_node_reads_is_422_invalid_input_and_writes_nothing(
    app: tuple[TestClient, Path], amount: bytes
) -> None:
    # purchase-approval declares names only: a number there is one its condition reads, within 64 bits.
    client, db = app
    before = dump(db)
    body = b'{"definition": "purchase-approval", "input": {"amount": ' + amount + b', "order_id": "o-1", "order_revision": 1}}'
    response = client.post("/executions", content=body, headers={**ALICE, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    problem = error(response)
    assert problem["code"] == "invalid_input" and problem["field"] == "input", problem
    assert f"input.amount: integer {amount.decode()} is outside the 64-bit signed range" in problem["message"]
    assert dump(db) == before


def test_an_unknown_path_or_method_is_the_documented_error_shape(app: tuple[TestClient, Path]) -> None:
    client, db = app
    before = dump(db)
    unknown = client.get("/nowhere", headers=ALICE)
    assert unknown.status_code == 404 and error(unknown)["code"] == "not_found"
    wrong = client.delete("/operations/op-1", headers=ALICE)
    assert wrong.status_code == 405 and error(wrong)["code"] == "method_not_allowed"
    assert set(wrong.headers["Allow"].split(", ")) == {"GET", "HEAD"}
    both = client.put("/executions", json={}, headers=ALICE)
    assert both.status_code == 405 and set(both.headers["Allow"].split(", ")) == {"GET", "HEAD", "POST"}
    assert dump(db) == before


def test_a_query_parameter_a_route_does_not_take_is_422_naming_it(app: tuple[TestClient, Path]) -> None:
    client, db = app
    before = dump(db)
    for method, path, name in (
        ("GET", "/executions?stat=waiting", "stat"),
        ("GET", "/executions?state=waiting&state=eligible", "state"),
        ("POST", "/executions?state=waiting", "state"),
        ("POST", "/operations?tenant=beta", "tenant"),
        ("GET", "/operations/op-1?verbose=1", "verbose"),
    ):
        response = client.request(method, path, json=CAPTURE, headers={**ALICE, "Idempotency-Key": "k-q"})
        assert response.status_code == 422, (path, response.text)
        assert error(response)["code"] == "invalid_query" and error(response)["field"] == name, response.text
    assert client.get("/executions?state=waiting", headers=ALICE).json() == {"executions": []}
    assert dump(db) == before


def test_an_unexpected_failure_is_500_in_the_documented_shape_without_its_details(tmp_path: Path) -> None:
    def authenticate(request: Any) -> Any:
        raise RuntimeError("secret-detail of a broken deployment")

    store = SQLiteOperationStore(tmp_path / "broken.db")
    try:
        application = create_operations_app(
            authenticate=authenticate, operations=store, actions=deployment.registry(), resolvers=deployment.resolvers()
        )
        with TestClient(application, raise_server_exceptions=False) as client:
            response = client.get("/operations/op-1", headers=ALICE)
        assert response.status_code == 500
        assert error(response)["code"] == "internal_error"
        assert "secret-detail" not in response.text
    finally:
        store.close()


def test_a_post_that_does_not_declare_json_is_415_and_writes_nothing(app: tuple[TestClient, Path]) -> None:
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    before = dump(db)
    # What a cross-site form or a no-cors fetch can send with a session cookie, without a preflight.
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {**ALICE, "Idempotency-Key": "k-2"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        for path, body in (("/operations", b'{"action": "capture_payment", "input": {"order": "o-2", "amount": 5}}'),
                           (f"/operations/{operation_id}/cancel", b"")):  # fmt: skip
            response = client.post(path, content=body, headers=headers)
            assert response.status_code == 415, (content_type, path, response.text)
            assert error(response)["code"] == "unsupported_media_type"
    assert dump(db) == before
    declared = client.post(
        f"/operations/{operation_id}/cancel", content=b"", headers={**ALICE, "Content-Type": "application/json; charset=utf-8"}
    )
    assert declared.status_code == 200, declared.text


def test_an_execution_whose_id_holds_a_slash_is_reachable(app: tuple[TestClient, Path]) -> None:
    client, _ = app
    order = {"amount": 5, "order_id": "o-1", "order_revision": 1}
    run = client.post(
        "/executions", json={"definition": "purchase-approval", "execution_id": "orders/o-1", "input": order}, headers=ALICE
    )
    assert run.status_code == 201, run.text
    for path in ("/executions/orders/o-1", "/executions/orders%2Fo-1"):
        inspected = client.get(path, headers=ALICE)
        assert inspected.status_code == 200, (path, inspected.text)
        assert inspected.json()["execution"]["execution_id"] == "orders/o-1"
    assert client.get("/executions/orders/o-2", headers=ALICE).json()["error"]["code"] == "execution_not_found"
    cancelled = client.post("/executions/orders/o-1/cancel", json={"reason": "r"}, headers=ALICE)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled", cancelled.text
    wrong = client.post("/executions/orders/o-1", json={}, headers=ALICE)
    assert wrong.status_code == 405 and error(wrong)["code"] == "method_not_allowed"


def test_an_operation_service_refusal_names_its_field(app: tuple[TestClient, Path]) -> None:
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    before = dump(db)
    answers = {
        "action": submit(client, ALICE, "k-2", {"action": "nope", "input": {}}),
        "input": submit(client, ALICE, "k-3", {"action": "capture_payment", "input": {"order": "o"}}),
        "reason": client.post(f"/operations/{operation_id}/cancel", json={"reason": "a\x00b"}, headers=ALICE),
        "input_digest": client.post(
            f"/operations/{operation_id}/decision", json={"approve": True, "input_digest": "xyz"}, headers=CAROL
        ),
    }
    for field, response in answers.items():
        assert response.status_code == 422, (field, response.text)
        assert error(response)["field"] == field, response.text
    assert dump(db) == before


def test_a_damaged_input_or_transition_is_one_malformed_row_error_and_another_tenant_sees_nothing(
    app: tuple[TestClient, Path],
) -> None:
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]

    def edit(sql: str) -> None:
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
            conn.execute(sql, (operation_id,))

    def malformed(path: str, column: str) -> None:
        response = client.get(path, headers=ALICE)
        assert response.status_code == 500, response.text
        problem = error(response)
        assert problem["code"] == "malformed_row"
        assert problem["message"].startswith(f"operation {operation_id!r}: {column}: "), problem

    edit("UPDATE operations SET input = 'not json' WHERE operation_id = ?")
    before = dump(db)
    malformed(f"/operations/{operation_id}", "input")
    history = client.get(f"/operations/{operation_id}/history", headers=ALICE)
    assert history.status_code == 200 and [line["to"] for line in history.json()["history"]] == ["awaiting_approval"]
    assert dump(db) == before
    edit(
        "INSERT INTO operation_transitions (operation_id, revision, event, from_state, to_state, at, actor, fence, "
        "reason) SELECT operation_id, 99, 'bogus', from_state, to_state, at, actor, fence, reason "
        "FROM operation_transitions WHERE operation_id = ? AND revision = 1"
    )
    before = dump(db)
    malformed(f"/operations/{operation_id}/history", "operation_transitions.event")
    malformed(f"/operations/{operation_id}", "operation_transitions.event")
    for path in (f"/operations/{operation_id}", f"/operations/{operation_id}/history"):
        other = client.get(path, headers=BOB)
        assert other.status_code == 404 and error(other)["code"] == "operation_not_found", other.text
        assert "bogus" not in other.text and "input" not in other.text
    assert dump(db) == before


def test_a_principal_the_directory_cannot_answer_for_now_is_503_and_nothing_is_written(tmp_path: Path) -> None:
    # A temporary outage of the identity provider was 403 not_authorized: a refusal a client does not retry.
    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import PrincipalResolverRegistry, ResolutionStatus  # noqa: PLC0415

    db = tmp_path / "http.db"
    operations = SQLiteOperationStore(db)
    directory = examples.Directory()
    directory.set("alice", ResolutionStatus.ACTIVE, frozenset({"acme"}))
    resolvers = PrincipalResolverRegistry(retries=1, pause=0)
    resolvers.register("users", 1, directory)
    application = create_operations_app(
        authenticate=deployment.authenticate, operations=operations, actions=deployment.registry(), resolvers=resolvers
    )
    try:
        with TestClient(application) as client:
            op_id = submit(client, ALICE, "k1").json()["operation_id"]
            directory.set("alice", ResolutionStatus.UNAVAILABLE)
            before = dump(db)
            for response in (
                submit(client, ALICE, "k1"),
                submit(client, ALICE, "k2"),
                client.post(f"/operations/{op_id}/cancel", json={}, headers=ALICE),
            ):
                assert response.status_code == 503, response.text
                assert error(response)["code"] == "principal_unavailable"
                assert response.headers["Retry-After"] == "1"
                assert op_id not in error(response)["message"]
            assert dump(db) == before
            directory.set("alice", ResolutionStatus.ACTIVE, frozenset({"acme"}))
            again = submit(client, ALICE, "k1")
            assert (again.status_code, again.json()["operation_id"]) == (200, op_id)
    finally:
        operations.close()


def test_a_refused_value_of_any_length_is_quoted_by_its_start(app: tuple[TestClient, Path]) -> None:
    """An unknown action of 100,000 characters is named by its first 80 (kernel.common.shown) in the problem."""
    client, db = app
    before = dump(db)
    huge = "a" * 100_000
    refused = submit(client, ALICE, "k-huge", {"action": huge, "input": {}})
    assert refused.status_code in {400, 404, 422}, refused.text[:500]
    problem = error(refused)
    assert len(problem["message"]) < 300, problem["message"][:500]
    assert "'" + "a" * 70 in problem["message"]
    assert dump(db) == before


def test_an_event_id_published_again_with_other_content_is_409_and_writes_nothing(app: tuple[TestClient, Path]) -> None:
    # It was 500 event_conflict: the client's own id reused, answered as a failure of the server.
    client, db = app
    first = {"type": "payment.received", "correlation": {"order_id": "o-1"}, "event_id": "ev-1"}
    assert client.post("/events", json=first, headers=ALICE).status_code == 200
    again = client.post("/events", json=first, headers=ALICE)
    assert again.status_code == 200 and again.json()["duplicate"] is True, again.text
    before = dump(db)
    other = client.post("/events", json={**first, "correlation": {"order_id": "o-2"}}, headers=ALICE)
    assert other.status_code == 409, other.text
    assert error(other)["code"] == "event_conflict"
    assert dump(db) == before


@pytest.mark.parametrize(
    ("changed", "field"),
    [({"input": {"order": "o-1", "amount": 7}}, "input"), ({"action": "balance", "input": {"account": "acc-1"}}, "action")],
)
def test_an_idempotency_conflict_names_the_field_of_the_request(
    app: tuple[TestClient, Path], changed: dict[str, Any], field: str
) -> None:
    # The kernel names its stored column (input_digest, action_name): no request has a field of that name.
    client, db = app
    assert submit(client, ALICE, "k-1").status_code == 201
    before = dump(db)
    conflict = submit(client, ALICE, "k-1", {**CAPTURE, **changed})
    assert conflict.status_code == 409, conflict.text
    assert (error(conflict)["code"], error(conflict)["field"]) == ("idempotency_conflict", field)
    assert dump(db) == before


def test_an_idempotency_key_in_the_drafts_string_syntax_is_the_same_key(app: tuple[TestClient, Path]) -> None:
    # The draft's Idempotency-Key is a Structured Field string, sent with its quotes; it was 422.
    client, db = app
    quoted = submit(client, ALICE, '"order-o-1"')
    assert quoted.status_code == 201, quoted.text
    bare = submit(client, ALICE, "order-o-1")
    assert (bare.status_code, bare.json()["operation_id"]) == (200, quoted.json()["operation_id"])
    before = dump(db)
    for malformed in ('"order o-1"', '"a\\"b"', '""', '"'):
        refused = submit(client, ALICE, malformed)
        assert refused.status_code == 422, (malformed, refused.text)
        assert error(refused)["field"] == "Idempotency-Key"
    assert dump(db) == before


BODIES_NOT_UTF8 = [
    pytest.param('{"type": "paid", "correlation": {"a": "b"}}'.encode("utf-16"), id="UTF-16 with its byte order mark"),
    pytest.param('{"type": "paid", "correlation": {"a": "b"}}'.encode("utf-32"), id="UTF-32"),
    pytest.param(b'{"type": "pay\xed\xa0\x80", "correlation": {"a": "b"}}', id="a surrogate encoded on its own"),
    pytest.param(b'{"type": "paym\xe9nt", "correlation": {"a": "b"}}', id="Latin-1"),
    pytest.param(b'\xef\xbb\xbf{"type": "paid", "correlation": {"a": "b"}}', id="UTF-8 behind a byte order mark"),
]


@pytest.mark.parametrize("body", BODIES_NOT_UTF8)
def test_a_body_that_is_not_utf8_json_is_422_invalid_body_and_writes_nothing(app: tuple[TestClient, Path], body: bytes) -> None:
    # json reads bytes in any of the UTF encodings, and a lone surrogate through surrogatepass: all were taken.
    client, db = app
    before = dump(db)
    for content_type in ("application/json", "application/json; charset=utf-16"):
        response = client.post("/events", content=body, headers={**ALICE, "Content-Type": content_type})
        assert response.status_code == 422, response.text
        assert error(response)["code"] == "invalid_body", response.text
    assert dump(db) == before


def test_a_path_with_a_trailing_slash_is_404_in_the_documented_shape_not_a_redirect(app: tuple[TestClient, Path]) -> None:
    # Starlette answered 307 to the path without it, an address built from the Host header that a client follows.
    client, db = app
    before = dump(db)
    for method, path in (("POST", "/operations/"), ("GET", "/operations/op-1/"), ("POST", "/events/")):
        response = client.request(
            method, path, json=CAPTURE, headers={**ALICE, "Idempotency-Key": "k-1"}, follow_redirects=False
        )
        assert response.status_code == 404, (path, response.status_code, response.headers)
        assert error(response)["code"] == "not_found"
        assert response.headers["content-type"] == "application/json"
    assert dump(db) == before


def test_a_header_sent_twice_that_names_one_thing_is_refused(app: tuple[TestClient, Path]) -> None:
    # The first was taken: a second credential, or a text/plain body behind a JSON Content-Type, went unseen.
    client, db = app
    before = dump(db)
    body = b'{"type": "paid", "correlation": {"a": "b"}}'
    two_credentials = [("Authorization", "Bearer alice-token"), ("Authorization", "Bearer bob-token"),
                       ("Content-Type", "application/json")]  # fmt: skip
    refused = client.post("/events", content=body, headers=two_credentials)
    assert refused.status_code == 401 and error(refused)["code"] == "not_authenticated", refused.text
    two_types = [*ALICE.items(), ("Content-Type", "application/json"), ("Content-Type", "text/plain")]
    refused = client.post("/events", content=body, headers=two_types)
    assert refused.status_code == 415, refused.text
    assert (error(refused)["code"], error(refused)["field"]) == ("unsupported_media_type", "Content-Type")
    assert dump(db) == before


def test_a_type_error_is_said_in_json_words(app: tuple[TestClient, Path]) -> None:
    # A JavaScript or Go client has no "str", "dict" or "NoneType".
    client, _ = app
    said = {
        b'{"action": 5}': "action: must be a string, got an integer",
        b'{"action": "capture_payment", "version": true}': "version: must be an integer, got true or false",
        b'{"action": "capture_payment", "version": null}': "version: must be an integer, got null",
        b"[1]": "the body must be a JSON object, not an array",
        b"null": "the body must be a JSON object, not null",
    }
    for body, message in said.items():
        response = client.post(
            "/operations", content=body, headers={**ALICE, "Idempotency-Key": "k-1", "Content-Type": "application/json"}
        )
        assert response.status_code == 422 and error(response)["message"] == message, response.text


def test_a_client_gone_before_its_body_arrived_is_no_server_failure(tmp_path: Path) -> None:
    # Left to the 500 handler, every upload a client gave up on was logged as a bug, traceback and all.
    import asyncio  # noqa: PLC0415

    store = SQLiteOperationStore(tmp_path / "gone.db")
    application = create_operations_app(
        authenticate=deployment.authenticate, operations=store, actions=deployment.registry(), resolvers=deployment.resolvers()
    )
    before = dump(tmp_path / "gone.db")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/operations", "raw_path": b"/operations", "root_path": "", "query_string": b"",
        "headers": [(b"authorization", b"Bearer alice-token"), (b"content-type", b"application/json"),
                    (b"idempotency-key", b"k-1"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    arriving = [{"type": "http.request", "body": b'{"action"', "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return arriving.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    try:
        asyncio.run(application(scope, receive, send))
    finally:
        store.close()
    assert sent[0]["status"] == 400, sent
    assert b'"body_incomplete"' in sent[1]["body"]
    assert dump(tmp_path / "gone.db") == before


def test_an_idempotency_key_on_a_post_that_does_not_take_one_is_422_and_writes_nothing(
    app: tuple[TestClient, Path],
) -> None:
    # Ignored, it promised a safe retry: POST /executions sent twice with one key admitted two executions.
    client, db = app
    operation_id = submit(client, ALICE, "k-1").json()["operation_id"]
    order = {"amount": 5, "order_id": "o-1", "order_revision": 1}
    before = dump(db)
    for path, body in (
        ("/executions", {"definition": "purchase-approval", "input": order}),
        ("/events", {"type": "payment.received", "correlation": {"order_id": "o-1"}}),
        (f"/operations/{operation_id}/cancel", {}),
        (f"/operations/{operation_id}/decision", {"approve": True}),
    ):
        for _ in range(2):
            response = client.post(path, json=body, headers={**ALICE, "Idempotency-Key": "run-once"})
            assert response.status_code == 422, (path, response.text)
            assert (error(response)["code"], error(response)["field"]) == ("invalid_body", "Idempotency-Key")
    assert dump(db) == before
    # A GET is safe to repeat already: the header changes nothing there.
    assert client.get("/executions", headers={**ALICE, "Idempotency-Key": "k-9"}).status_code == 200
