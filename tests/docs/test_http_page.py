"""docs/http.md's Python, run as a reader would paste it, then asked what the page's curl lines ask.

The page leaves the stores, the registry, the resolvers and the policy to
the deployment; here they are the test deployment's (tests/http/deployment.py),
and the page's own ``authenticate`` decides who each request is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from fencekeeper.adapters import connect
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from tests.http import deployment

PAGE = Path(__file__).resolve().parents[2] / "docs" / "http.md"


def test_the_pages_app_answers_as_its_curl_lines_say(tmp_path: Path) -> None:
    (block,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    db = tmp_path / "http.db"
    execution_store = connect.open_store(str(db))
    operation_store = SQLiteOperationStore(db)
    namespace: dict[str, Any] = {
        "operation_store": operation_store,
        "my_actions": deployment.registry(),
        "my_resolvers": deployment.resolvers(),
        "execution_store": execution_store,
        "my_policy": deployment.policy(),
    }
    try:
        exec(compile(block, str(PAGE), "exec"), namespace)  # the page's own code, as a reader runs it
        alice = {"Authorization": "Bearer s3cr3t-alice", "Content-Type": "application/json"}
        with TestClient(namespace["app"]) as client:
            body = {"action": "capture_payment", "input": {"order": "o-1", "amount": 2500}}
            first = client.post("/operations", json=body, headers=alice | {"Idempotency-Key": "order-o-1"})
            assert first.status_code == 201, first.text
            assert (first.json()["created"], first.json()["state"]) == (True, "awaiting_approval")
            assert first.json()["tenant"] == "acme" and first.json()["namespace"] == "shop"
            again = client.post("/operations", json=body, headers=alice | {"Idempotency-Key": "order-o-1"})
            assert again.status_code == 200 and again.json()["operation_id"] == first.json()["operation_id"]
            other = {"action": "capture_payment", "input": {"order": "o-1", "amount": 9999}}
            conflict = client.post("/operations", json=other, headers=alice | {"Idempotency-Key": "order-o-1"})
            assert (conflict.status_code, conflict.json()["error"]["code"]) == (409, "idempotency_conflict")
            # The page's approver, with the token the page gives her, binds the decision to the digest she saw.
            carol = {"Authorization": "Bearer s3cr3t-carol", "Content-Type": "application/json"}
            decision = client.post(
                f"/operations/{first.json()['operation_id']}/decision",
                json={"approve": True, "input_digest": first.json()["input_digest"]},
                headers=carol,
            )
            assert decision.status_code == 200, decision.text
            assert decision.json()["approved_by"] == "users:v1:carol"
            anonymous = client.get(f"/operations/{first.json()['operation_id']}")
            assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "not_authenticated")
            listed = client.get("/executions", params={"state": "waiting"}, headers=alice)
            assert listed.status_code == 200 and listed.json() == {"executions": []}
    finally:
        operation_store.close()
        execution_store.close()
