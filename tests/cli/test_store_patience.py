"""A worker rides out a store that fails for a while, and gives up on one that keeps failing.

What these tests prove:

- ``StorePatience`` waits a retryable StoreError out with a backoff (0.2 s,
  doubling, at most 5 s) until the store has failed every request for its
  budget, gives up on any other code at once, and starts again after a
  request goes through;
- ``fencekeeper worker`` and ``fencekeeper op worker`` ride out more lost
  connections in a row than a pool holds (an administrator ending the
  role's sessions kills every idle connection at once, so each retry can
  meet another dead one), and still exit 1 on an error they cannot ride out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import cli, cli_ops
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.store import RIDE_OUT_SECONDS, StoreError, StorePatience
from fencekeeper.adapters.worker import Worker

PURCHASE = str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "purchase_approval.toml")
LOST = 8
"""Lost connections in a row: more than the five the workers once stopped after."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_retryable_error_is_waited_out_with_a_backoff_until_the_budget_is_spent() -> None:
    clock = Clock()
    patience = StorePatience(budget=30.0, clock=clock)
    waits = []
    while (wait := patience.failed("store_unavailable")) is not None:
        waits.append(wait)
        clock.now += wait
    assert waits[:6] == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert set(waits[6:]) == {5.0}
    assert sum(waits[:-1]) < 30.0 <= sum(waits)  # gave up at the first failure past the budget, not before


def test_a_request_that_goes_through_starts_the_count_again() -> None:
    clock = Clock()
    patience = StorePatience(budget=30.0, clock=clock)
    for _ in range(3):
        for code in ("store_unavailable", "row_locked", "store_locked"):
            assert patience.failed(code) is not None
        clock.now += 29.0
        patience.succeeded()
    assert patience.failed("store_unavailable") == 0.2


def test_an_error_that_does_not_pass_by_itself_is_given_up_at_once() -> None:
    patience = StorePatience()
    for code in ("schema_altered", "permission_denied", "malformed_row", "read_only"):
        assert patience.failed(code) is None
    assert RIDE_OUT_SECONDS >= 30.0


class Quick(StorePatience):
    """The same decisions, without the waits, so that a test rides out many failures in no time."""

    def failed(self, code: str) -> float | None:
        wait = super().failed(code)
        return None if wait is None else 0.0


def test_fencekeeper_worker_rides_out_more_lost_connections_than_its_pool_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "shop.db")
    assert cli.main(["run", PURCHASE, "--db", db, "--id", "po-1", "--input",
                     '{"amount": 50, "order_id": "po-1", "order_revision": 1}']) == 0  # fmt: skip
    capsys.readouterr()
    real = Worker.run_pass
    raised: list[str] = []

    def flaky(self: Worker, **kwargs: Any) -> Any:
        if len(raised) < LOST:
            raised.append("store_unavailable")
            raise StoreError("store_unavailable", "PostgreSQL connection failed: the connection is lost")
        return real(self, **kwargs)

    monkeypatch.setattr(cli, "StorePatience", Quick)
    monkeypatch.setattr(Worker, "run_pass", flaky)
    assert cli.main(["worker", "--db", db, "--until-idle", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert raised == ["store_unavailable"] * LOST
    assert summary["claimed"] >= 1 and summary["stopped_by"] == "idle" and not summary["errors"]

    def broken(self: Worker, **kwargs: Any) -> Any:
        raise StoreError("schema_altered", "the executions table has changed under this worker")

    monkeypatch.setattr(Worker, "run_pass", broken)
    assert cli.main(["worker", "--db", db, "--until-idle", "--json"]) == 1
    assert "[schema_altered]" in capsys.readouterr().err


def test_fencekeeper_op_worker_rides_out_more_lost_connections_than_its_pool_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "ops.db")
    transfer = '{"from": "acc-1", "to": "acc-2", "amount": 5}'
    assert cli.main(["op", "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer, "--json"]) == 0
    op_id = json.loads(capsys.readouterr().out)["operation_id"]
    real = DurableOperationWorker.run_once
    raised: list[str] = []

    def flaky(self: DurableOperationWorker) -> Any:
        if len(raised) < LOST:
            raised.append("store_unavailable")
            raise StoreError("store_unavailable", "PostgreSQL connection failed: the connection is lost")
        return real(self)

    monkeypatch.setattr(cli_ops, "StorePatience", Quick)
    monkeypatch.setattr(DurableOperationWorker, "run_once", flaky)
    assert cli.main(["op", "worker", "--db", db, "--until-idle", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert raised == ["store_unavailable"] * LOST
    assert [(r["operation_id"], r["outcome"]) for r in report["reports"]] == [(op_id, "succeeded")]
    assert report["stopped_by"] == "idle" and "errors" not in report
