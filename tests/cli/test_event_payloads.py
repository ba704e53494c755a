"""``fencekeeper event --payload`` past the payload's bounds, and ``fencekeeper worker`` past an Event stored before them.

Before the bound, ``event`` published a 50 MB payload, and one nested 985
levels deep; ``worker --until-idle`` then ended on "RecursionError: maximum
recursion depth exceeded while decoding a JSON object" at the first waiter
that found that Event, and left the execution running under its lease.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from fencekeeper.kernel.events import WITHHELD_DEEP
from tests.cli.runner import assert_one_error_line, data, fencekeeper, ok, snapshot
from tests.definitions.examples import WAITS


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ('{"blob": "' + "x" * 50_000_000 + '"}', "--payload: payload: is longer than 65536 characters as compact JSON"),
        ('{"blob": "' + "x" * 65_526 + '"}', "--payload: payload: is longer than 65536 characters as compact JSON"),
        ('{"a": ' * 32 + "{}" + "}" * 32, "--payload: payload: nests deeper than 32 levels"),
        ('{"a": ' * 100_000 + "{}" + "}" * 100_000, "--payload: payload.json: not valid JSON: nested too deeply"),
    ],
    ids=["50MB", "65537-characters", "33-levels", "100000-levels"],
)  # fmt: skip
def test_a_payload_past_a_bound_is_exit_2_in_one_line_and_writes_nothing(tmp_path: Path, payload: str, says: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    ok("migrate", "--db", store / "shop.db", cwd=tmp_path)
    (tmp_path / "payload.json").write_text(payload, encoding="utf-8")
    before = snapshot(store)
    result = fencekeeper(
        "event", "--db", store / "shop.db", "payment.received", "--correlation", '{"order_id": "o-1"}',
        "--payload", "@payload.json", "--id", "ev-1", cwd=tmp_path,
    )  # fmt: skip
    assert assert_one_error_line(result, 2) == f"fencekeeper: error: {says}"
    assert result.stdout == ""
    assert snapshot(store) == before


def test_a_worker_wakes_a_waiter_past_a_deep_event_stored_before_the_bound(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    (tmp_path / "waits.toml").write_text(WAITS, encoding="utf-8")
    ok("migrate", "--db", db, cwd=tmp_path)
    # What a release before the bound published and kept: 985 levels, past what json follows on a worker's stack.
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO events (event_id, business_id, event_type, correlation, payload, committed_at) VALUES "
            "('ev-old', 'default', 'payment.received', '[[\"order_id\",\"o-1\"]]', ?, '2026-01-01T00:00:00.000000+00:00')",
            ('{"d":' * 984 + "{}" + "}" * 984,),
        )
        conn.execute(
            "INSERT INTO event_keys (business_id, event_type, name, value, event_id) "
            "VALUES ('default', 'payment.received', 'order_id', 'o-1', 'ev-old')"
        )
    ok("run", "waits.toml", "--db", db, "--input", '{"order_id": "o-1"}', "--id", "x-1", cwd=tmp_path)
    result = fencekeeper("worker", "--db", db, "--until-idle", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    view = data("inspect", "x-1", "--db", db, cwd=tmp_path)
    assert view["execution"]["state"] == "succeeded"
    # Every revision of the wait's attempt, the completed one last: none carries the payload.
    revisions = [e for e in view["evidence"] if e["kind"] == "StepAttempt" and e["body"]["node_id"] == "await_payment"]
    completed = revisions[-1]
    assert completed["state"] == "completed"
    assert completed["body"]["outputs"] == {"event_id": "ev-old"}
    assert completed["body"]["wake"]["payload_withheld"] == WITHHELD_DEEP
    assert all('"d"' not in json.dumps(revision) for revision in revisions)
