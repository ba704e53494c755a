"""Pruning workflow executions: only ended ones, only past their window, whole, batched, resumable; and
nothing but pruning deletes an execution's rows (the triggers of migration ``execution_pruning``), on
SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters import cli, examples, service
from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.sql import SqlTx
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import (
    ExportedMessage,
    ExportRetry,
    OutboxExporter,
    SinkError,
    discard,
    outbox_status,
    parked_messages,
)
from fencekeeper.adapters.retention import RetentionWindows, _remove_executions, prune
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import EXAMPLES
from tests.outbox.conftest import rows

POLICY = examples.grants("default", "user:operator")
WHO = {"business_id": "default", "principal_id": "user:operator"}
SPEC = json.dumps(
    {"node_id": "ask_manager", "attempt_id": "a-1", "event_type": None, "correlation": [], "wake_at": None, "timeout": None}
)
DAY = RetentionWindows(executions=timedelta(days=1))

# Each table with the column naming the execution a row belongs to (evidence objects: through parent_id).
FOOTPRINT = {
    "objects": "SELECT count(*) FROM objects WHERE object_id = ? OR parent_id = ?",
    "object_revisions": "SELECT count(*) FROM object_revisions WHERE object_id = ? OR object_id IN "
    "(SELECT object_id FROM objects WHERE parent_id = ?)",
    "workflow_dispatch": "SELECT count(*) FROM workflow_dispatch WHERE workflow_execution_id = ? AND ? <> ''",
    "transitions": "SELECT count(*) FROM transitions WHERE execution_id = ? AND ? <> ''",
    "wait_registrations": "SELECT count(*) FROM wait_registrations WHERE execution_id = ? AND ? <> ''",
    "commands": "SELECT count(*) FROM commands WHERE execution_id = ? AND ? <> ''",
}
DELETES = {
    "objects": "DELETE FROM objects WHERE object_id = ? OR parent_id = ?",
    "object_revisions": FOOTPRINT["object_revisions"].replace("SELECT count(*) FROM", "DELETE FROM"),
    **{table: sql.replace("SELECT count(*) FROM", "DELETE FROM") for table, sql in FOOTPRINT.items() if table not in (
        "objects", "object_revisions")},
}  # fmt: skip


@pytest.fixture(params=["sqlite", "postgresql"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, TransactionalOperationStore, ManualClock]]:
    """An execution store and an operation store on one database, and the clock both read."""
    clock = ManualClock()
    if request.param == "sqlite":
        executions: Any = SQLiteStore(tmp_path / "fk.db", clock=clock)
        operations: TransactionalOperationStore = SQLiteOperationStore(tmp_path / "fk.db", clock)
    else:
        from fencekeeper.adapters.operations.postgres import PostgresOperationStore  # noqa: PLC0415
        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        executions = PostgresStore(dsn, schema=schema, clock=clock, pool_size=2)
        operations = PostgresOperationStore(dsn, schema=schema, clock=clock, pool_size=2)
    try:
        yield executions, operations, clock
    finally:
        operations.close()
        executions.close()


def drain(executions: Any) -> None:
    worker = Worker(executions, "w-1", POLICY, examples.handler(), business_id="default")
    while worker.run_pass().claimed:
        pass


def purchases(executions: Any, *amounts: int) -> None:
    """po-0, po-1, ...: a small amount runs to its end; 1000 or more waits for a manager's approval."""
    path = EXAMPLES / "purchase_approval.toml"
    definition = parse_definition(path.read_text(encoding="utf-8"), path.name)
    service.register(executions, definition, "default", "user:operator", POLICY)
    for n, amount in enumerate(amounts):
        service.run(
            executions, POLICY, **WHO, definition_id=definition.definition_id, execution_id=f"po-{n}",
            input={"amount": amount, "order_id": f"o-{n}", "order_revision": 1},
        )  # fmt: skip
    drain(executions)


def cancel(executions: Any, n: int) -> None:
    service.cancel(executions, POLICY, **WHO, execution_id=f"po-{n}")


def side_rows(store: TransactionalOperationStore, clock: ManualClock, *execution_ids: str) -> None:
    """A lease renewal's transition, a closed wait registration and a command row for each execution.

    The example definition writes none of these three tables (no renewal, no
    event or timer wait, no reconciliation), so the test writes one row of
    each, as the store would, for the triggers and the pruner to meet.
    """
    with store._transaction() as tx:
        assert isinstance(tx, SqlTx)
        at = tx.d.encode_time(clock.now())
        for eid in execution_ids:
            tx.run(
                "INSERT INTO transitions (execution_id, event, from_state, to_state, revision, at, actor, lease_token, "
                "fence, reason) VALUES (?, 'renew', 'running', 'running', 1, ?, 'w-1', 'l-1', 1, 'renewal')",
                (eid, at),
            )
            tx.run(
                "INSERT INTO wait_registrations (execution_id, node_id, attempt_id, business_id, spec, closed_by) "
                "VALUES (?, 'ask_manager', 'a-1', 'default', ?, 'cancel')",
                (eid, SPEC),
            )
            tx.run(
                "INSERT INTO commands (command_id, command_type, business_id, execution_id, body, recorded_at) "
                "VALUES (?, 'audit_note', 'default', ?, '{}', ?)",
                (f"{eid}/cmd", eid, at),
            )


def exported(store: TransactionalOperationStore) -> None:
    """Every message delivered: an execution is pruned only once nothing of it is left to export."""
    OutboxExporter(store, _Refusing()).run(until_idle=True)
    assert outbox_status(store).pending == 0


def footprint(store: TransactionalOperationStore, execution_id: str) -> dict[str, int]:
    return {table: int(rows(store, sql, (execution_id, execution_id))[0][0]) for table, sql in FOOTPRINT.items()}  # type: ignore[call-overload]


def state(store: TransactionalOperationStore, execution_id: str) -> object:
    found = rows(store, "SELECT state FROM objects WHERE object_id = ?", (execution_id,))
    return found[0][0] if found else None


def test_ended_executions_go_whole_after_their_window_and_live_ones_stay(
    stores: tuple[Any, TransactionalOperationStore, ManualClock],
) -> None:
    executions, store, clock = stores
    purchases(executions, 5, 2500, 2500)
    cancel(executions, 1)
    side_rows(store, clock, "po-0", "po-1", "po-2")
    assert [state(store, f"po-{n}") for n in range(3)] == ["succeeded", "cancelled", "waiting"]
    ended = footprint(store, "po-0")
    cancelled = footprint(store, "po-1")
    assert ended["objects"] > 1 and ended["object_revisions"] > ended["objects"], "evidence objects and revisions"
    assert min(ended.values()) >= 1 and min(cancelled.values()) >= 1
    live = footprint(store, "po-2")
    assert min(live.values()) >= 1
    definitions = rows(store, "SELECT count(*) FROM objects WHERE object_type = 'WorkflowDefinition'")
    events = rows(store, "SELECT count(*) FROM events")

    exported(store)
    assert prune(store, RetentionWindows()).executions == 0, "without an executions window they are kept"
    clock.advance(timedelta(hours=20))
    assert prune(store, DAY).executions == 0, "inside the window"
    clock.advance(timedelta(days=10))
    report = prune(store, DAY)
    assert (report.executions, report.execution_rows) == (2, sum(ended.values()) + sum(cancelled.values()))
    assert footprint(store, "po-0") == footprint(store, "po-1") == dict.fromkeys(FOOTPRINT, 0)
    assert footprint(store, "po-2") == live, "a waiting execution is never pruned, however old"
    assert rows(store, "SELECT count(*) FROM objects WHERE object_type = 'WorkflowDefinition'") == definitions
    assert rows(store, "SELECT count(*) FROM events") == events, "events are the Business's"
    assert executions.read("po-0") is None
    # Its id is free again (docs/outbox.md): a run with it starts a new execution.
    service.run(
        executions, POLICY, **WHO, definition_id="purchase-approval", execution_id="po-0",
        input={"amount": 5, "order_id": "o-0", "order_revision": 1},
    )  # fmt: skip
    assert state(store, "po-0") == "eligible"

    # What stayed still works: po-2 is cancelled now, and goes in its turn.
    cancel(executions, 2)
    assert state(store, "po-2") == "cancelled"
    exported(store)
    assert prune(store, DAY).executions == 0, "its window counts from when it ended"
    clock.advance(timedelta(days=2))
    assert prune(store, DAY).executions == 1
    assert [r[0] for r in rows(store, "SELECT object_id FROM objects WHERE object_type = 'WorkflowExecution'")] == ["po-0"]



def test_nothing_but_pruning_deletes_an_executions_rows(stores: tuple[Any, TransactionalOperationStore, ManualClock]) -> None:
    executions, store, clock = stores
    purchases(executions, 5, 2500)
    side_rows(store, clock, "po-0", "po-1")
    assert [state(store, "po-0"), state(store, "po-1")] == ["succeeded", "waiting"]
    before = {eid: footprint(store, eid) for eid in ("po-0", "po-1")}
    assert min(before["po-0"].values()) >= 1 and min(before["po-1"].values()) >= 1, "every table has rows to refuse"
    # Outside pruning mode: refused even for the ended execution.
    for table, sql in DELETES.items():
        with pytest.raises(Exception, match=r"pruning|append-only"):
            rows(store, sql, ("po-0", "po-0"))
        assert footprint(store, "po-0") == before["po-0"], table
    # In pruning mode: refused for the live one, and for what belongs to no execution.
    for table, sql in DELETES.items():
        with pytest.raises(Exception, match=r"pruned|ended executions"), store._transaction() as tx:
            assert isinstance(tx, SqlTx)
            tx.enter_pruning()
            tx.run(sql, ("po-1", "po-1"))
        assert footprint(store, "po-1") == before["po-1"], table
    with pytest.raises(Exception, match=r"pruned|ended executions"), store._transaction() as tx:
        assert isinstance(tx, SqlTx)
        tx.enter_pruning()
        tx.run("DELETE FROM objects WHERE object_type = 'WorkflowDefinition'", ())
    assert rows(store, "SELECT count(*) FROM objects WHERE object_type = 'WorkflowDefinition'") == [(1,)]
    with pytest.raises(Exception, match="append-only"):
        rows(store, "UPDATE transitions SET reason = 'rewritten'")
    with pytest.raises(Exception, match="append-only"):
        rows(store, "UPDATE object_revisions SET body = '{}' WHERE object_id = ?", ("po-0",))
    # In pruning mode, the ended execution's rows may go (here by hand, in the pruner's order).
    with store._transaction() as tx:
        assert isinstance(tx, SqlTx)
        tx.enter_pruning()
        for table in ("object_revisions", "objects", "transitions", "wait_registrations", "commands",
                      "workflow_dispatch"):  # fmt: skip
            if table == "objects":
                tx.run("DELETE FROM objects WHERE parent_id = ?", ("po-0",))
                continue
            tx.run(DELETES[table], ("po-0", "po-0"))
        tx.run("DELETE FROM objects WHERE object_id = ?", ("po-0",))
        tx.leave_pruning()
    assert footprint(store, "po-0") == dict.fromkeys(FOOTPRINT, 0)


def test_execution_batches_are_bounded_and_a_stopped_prune_resumes(
    stores: tuple[Any, TransactionalOperationStore, ManualClock],
) -> None:
    executions, store, clock = stores
    purchases(executions, 5, 5, 2500, 2500, 2500)
    for n in (2, 3):
        cancel(executions, n)
    exported(store)
    clock.advance(timedelta(days=2))
    # 40 rows a batch: two executions per transaction.
    first = prune(store, DAY, batch_size=40, max_batches=1)
    assert (first.executions, first.finished) == (2, False)
    rest = prune(store, DAY, batch_size=40)
    assert (rest.executions, rest.finished) == (2, True)
    assert [state(store, f"po-{n}") for n in range(5)] == [None, None, None, None, "waiting"]


def test_prune_executions_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "fk.db"
    executions = SQLiteStore(db, clock=ManualClock())  # 2026-01-01: long ago, for a window of 30 days
    try:
        purchases(executions, 5, 2500)
    finally:
        executions.close()

    def prune_json(*args: str) -> tuple[int, Any]:
        capsys.readouterr()
        code = cli.main(["prune", "--db", str(db), *args, "--json"])
        return code, json.loads(capsys.readouterr().out)

    code, report = prune_json()
    assert (code, report["executions"], report["execution_rows"]) == (0, 0, 0), "kept unless --executions is given"
    code, report = prune_json("--executions", "30d")
    assert (code, report["executions"]) == (0, 0), "kept until its messages are exported"
    assert cli.main(["export", "--db", str(db), "--sink", f"file:{tmp_path / 'events.jsonl'}", "--until-idle"]) == 0
    code, report = prune_json("--executions", "30d")
    assert (code, report["executions"], report["finished"]) == (0, 1, True) and report["execution_rows"] > 1
    with contextlib.closing(sqlite3.connect(db)) as conn:
        left = conn.execute("SELECT object_id, state FROM objects WHERE object_type = 'WorkflowExecution'").fetchall()
    assert left == [("po-1", "waiting")]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(["prune", "--db", str(db), "--executions", "soon"])
    assert exited.value.code == 2 and "not a duration" in capsys.readouterr().err


@pytest.mark.parametrize("stores", ["postgresql"], indirect=True)
def test_a_decision_on_an_execution_pruned_while_it_waited_is_refused_cleanly(
    stores: tuple[Any, TransactionalOperationStore, ManualClock], pg_dsn: str
) -> None:
    executions, operations, _ = stores
    purchases(executions, 5000)  # po-0 waits for a manager's decision
    cancel(executions, 0)
    request = service.approval_request(executions, "po-0")
    assert request is not None and state(operations, "po-0") == "cancelled"
    decision = approvals.ApprovalDecision(
        "d-1", request.request_id, "default", "user:manager", "approved", request.binding, p.Authority(True, "user:manager")
    )
    holding, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def pruning() -> None:  # one executions batch of prune, held open until the decision waits for it
        with operations._transaction() as tx:
            assert isinstance(tx, SqlTx)
            tx.enter_pruning()
            tx.run("SELECT object_id FROM objects WHERE object_id = 'po-0' FOR UPDATE", ())
            assert _remove_executions(tx, ["po-0"]).executions == 1
            tx.leave_pruning()
            holding.set()
            release.wait(20)

    def deciding() -> None:
        try:
            outcome["result"] = executions.decide_approval(decision)
        except Exception as exc:
            outcome["error"] = exc

    prune_thread = threading.Thread(target=pruning)
    prune_thread.start()
    assert holding.wait(20)
    decide_thread = threading.Thread(target=deciding)
    decide_thread.start()
    with psycopg.connect(pg_dsn, autocommit=True) as watch:
        deadline = time.monotonic() + 20
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        while time.monotonic() < deadline and watch.execute(waiting).fetchone() != (1,):
            time.sleep(0.02)
    release.set()
    prune_thread.join(20)
    decide_thread.join(20)
    assert "error" not in outcome, repr(outcome.get("error"))
    assert isinstance(outcome["result"], p.Refusal)
    assert state(operations, "po-0") is None


class _Refusing:
    """A sink that keeps what it was sent and refuses every message of the executions in ``refusing``."""

    def __init__(self, *refusing: str) -> None:
        self.sent: list[ExportedMessage] = []
        self.refusing = set(refusing)

    def send(self, message: ExportedMessage) -> None:
        if message.subject_id in self.refusing:
            raise SinkError(f"refused {message.subject_id}")
        self.sent.append(message)

    def flush(self) -> None:
        pass


def test_an_id_reused_after_pruning_starts_a_subject_its_old_messages_do_not_hold_back(
    stores: tuple[Any, TransactionalOperationStore, ManualClock],
) -> None:
    executions, store, clock = stores
    purchases(executions, 5, 7)  # po-0 and po-1 run to their end
    sink = _Refusing("po-0")
    exporter = OutboxExporter(store, sink, retry=ExportRetry(maximum_attempts=1))
    exporter.run(until_idle=True)
    old = parked_messages(store)
    assert old and {m.subject_id for m in old} == {"po-0"}, "po-0's first message is parked, and holds the rest"

    clock.advance(timedelta(days=2))
    # An execution whose messages are not all exported is kept: its history explains them, and its id stays
    # taken, so that no new execution's messages queue behind them.
    report = prune(store, DAY)
    assert (report.executions, state(store, "po-0"), state(store, "po-1")) == (1, "succeeded", None)
    for m in old:
        assert discard(store, m.message_id)
    sink.refusing.clear()
    exporter.run(until_idle=True)
    assert prune(store, DAY).executions == 1 and state(store, "po-0") is None

    # po-0 and po-1 again: each a new execution, whose every message is delivered, in commit order.
    earlier = {m.message_id for m in (*sink.sent, *old)}
    top = max(m.seq for m in (*sink.sent, *old))
    sink.sent.clear()
    for n in (0, 1):
        service.run(
            executions, POLICY, **WHO, definition_id="purchase-approval", execution_id=f"po-{n}",
            input={"amount": 5, "order_id": f"o-{n}", "order_revision": 1},
        )  # fmt: skip
    drain(executions)
    exporter.run(until_idle=True)
    assert outbox_status(store).pending == 0 and parked_messages(store) == []
    for n in (0, 1):
        mine = [m for m in sink.sent if m.subject_id == f"po-{n}"]
        assert [m.topic for m in mine][:1] == ["execution.eligible"] and mine[-1].topic == "execution.succeeded"
        assert [m.seq for m in mine] == sorted(m.seq for m in mine)
        # The same subject and revisions as the pruned execution's: neither a message id nor a seq of theirs,
        # so that a consumer deduplicating on the one, or keeping the last of the other, drops nothing.
        assert mine[0].seq > top and not earlier & {m.message_id for m in mine}
