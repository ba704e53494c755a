"""An execution row edited by hand is one ``malformed_row`` error naming it, on SQLite and PostgreSQL.

An execution's row names its current revision, whose body another table
holds.  A row that names a revision with no body, or a body that is no
execution revision, used to fail deep in the JSON reader (``TypeError``), an
internal error with a traceback for every command that read it.  Now each
read of it (``read``, which ``inspect`` and the review commands use) fails
with ``StoreError('malformed_row')`` naming the execution, and nothing is
written.

A worker's claim that meets such a row at the head of the queue must not
stop the queue behind it: every worker's claim would pick the same row
again.  The worker passes over it (reported once, named in its report),
runs every other execution, never writes the row, and claims it again once
it is repaired: a new worker at once, the same worker when its pause ends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.client import Client
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import StoreError, TransactionalStore
from fencekeeper.adapters.testing.roundtrips import TWO_NODE
from fencekeeper.adapters.worker import MALFORMED_PAUSE_LIMIT, PassReport, Worker, WorkerEvent
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import fencekeeper

BUSINESS = "default"
PRINCIPAL = "user:operator"
POLICY = examples.grants(BUSINESS, PRINCIPAL)
_BODY = (
    "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
    "VALUES ('x-1', 99, 'eligible', '{body}', '2026-01-01T00:00:00.000000+00:00'); "
    "UPDATE objects SET revision = 99 WHERE object_id = 'x-1'"
)
DAMAGES = {
    # Revisions are append-only, so a damaged body is a new revision the row is pointed at.
    "a revision with no body": "UPDATE objects SET revision = 99 WHERE object_id = 'x-1'",
    "a body that is no revision": _BODY.replace("{body}", '{"not": "an execution"}'),
    "a body that is no JSON": _BODY.replace("{body}", "garbled"),
}


Opened = tuple[TransactionalStore, Callable[[str], Any]]


@pytest.fixture(params=["sqlite", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    """The store with x-1 and x-2 admitted (x-1 first), and ``edit``: SQL on the store's database, past the store."""
    store: TransactionalStore
    if request.param == "sqlite":
        import sqlite3  # noqa: PLC0415

        store = SQLiteStore(tmp_path / "store.db")
        request.node.db_args = ["--db", str(tmp_path / "store.db")]

        def edit(sql: str) -> list[tuple[Any, ...]]:
            with sqlite3.connect(tmp_path / "store.db") as conn:
                *changes, last = sql.split("; ")
                for statement in changes:
                    conn.execute(statement)
                return [tuple(row) for row in conn.execute(last).fetchall()]

    else:
        import psycopg  # noqa: PLC0415

        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        store = PostgresStore(dsn, schema=schema)
        request.node.db_args = ["--db", dsn, "--schema", schema]

        def edit(sql: str) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = []
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
                for statement in sql.split("; "):
                    cursor = conn.execute(statement)  # type: ignore[arg-type]
                    rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
            return rows

    service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, POLICY)
    for n in (1, 2, 3):
        outcome = service.run(
            store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
            input={"order_id": f"o-{n}"}, execution_id=f"x-{n}",
        )  # fmt: skip
        assert isinstance(outcome, p.Decision), outcome
    try:
        yield store, edit
    finally:
        store.close()


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_execution_row_is_one_error_naming_it(
    opened: tuple[TransactionalStore, Callable[[str], Any]], damage: str
) -> None:
    store, edit = opened
    edit(DAMAGES[damage])
    with pytest.raises(StoreError) as raised:
        store.read("x-1")
    assert raised.value.code == "malformed_row"
    assert "execution 'x-1'" in raised.value.message and "edited by hand or damaged" in raised.value.message
    # The other execution reads as before.
    view = store.read("x-2")
    assert view is not None and view.execution.execution_id == "x-2"


_ROWS = (
    "SELECT o.object_id, o.object_type, o.state, o.revision, o.business_id, d.dispatch_state, d.eligible_at, "
    "d.lease_token, d.leased_by, d.lease_expires_at, d.step_count, d.last_error_code "
    "FROM objects o JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id WHERE o.object_id = 'x-1'"
)
"""x-1's execution and dispatch rows as the database holds them (what a worker must leave untouched)."""
_REVISIONS = "SELECT count(*) FROM object_revisions WHERE object_id = 'x-1'"
_REPAIR = "UPDATE objects SET revision = 1 WHERE object_id = 'x-1'"


def _worker(store: TransactionalStore, worker_id: str, clock: list[float], events: list[WorkerEvent]) -> Worker:
    return Worker(
        store, worker_id, POLICY, examples.handler(), lease=timedelta(seconds=30),
        monotonic=lambda: clock[0], on_record=events.append,
    )  # fmt: skip


CONTRADICTIONS = {
    # Each row reads, but the kernel will not decide on the two together (specs/protocol.md, the rows' checks).
    "step counts the two rows disagree on": "UPDATE workflow_dispatch SET step_count = 3 WHERE workflow_execution_id = 'x-1'",
}


@pytest.mark.parametrize("damage", sorted({**DAMAGES, **CONTRADICTIONS}))
def test_a_damaged_row_at_the_head_of_the_queue_is_passed_over_and_left_as_it_is(
    opened: Opened, damage: str
) -> None:
    store, edit = opened
    edit({**DAMAGES, **CONTRADICTIONS}[damage])
    before = (edit(_ROWS), edit(_REVISIONS))
    events: list[WorkerEvent] = []
    # x-1 was admitted first, so it is the first eligible execution every claim picks.
    report = _worker(store, "w-1", [0.0], events).run_pass()
    assert sorted(report.claimed) == ["x-2", "x-3"]
    assert report.finished == {"succeeded": 2}
    [malformed] = report.malformed
    assert (malformed.execution_id, malformed.code) == ("x-1", "malformed_row")
    assert "execution 'x-1'" in malformed.message and "nothing was written" in malformed.message
    # One line that says what to do, as a warning in the structured log.
    [told] = [e for e in events if e.what == "malformed"]
    assert told.execution_id == "x-1" and told.code == "malformed_row"
    assert "fencekeeper inspect x-1" in told.detail and "fencekeeper check" in told.detail
    assert "until the row is repaired" in told.detail
    # Nothing written for it: its rows and its revisions are exactly as they were, eligible.
    assert (edit(_ROWS), edit(_REVISIONS)) == before
    assert before[0][0][5] == "eligible"


_STRAY_LEASE = (
    "UPDATE workflow_dispatch SET lease_token = 'tok-stray', leased_by = 'w-gone', "
    "lease_expires_at = '2026-01-01T00:00:00.000000+00:00' WHERE workflow_execution_id = 'x-1'"
)


def test_an_eligible_row_holding_a_lease_is_passed_over_and_left_as_it_is(opened: Opened) -> None:
    # The schema holds the three lease fields to the state on both stores; a row past that check (SQLite's
    # ignore_check_constraints, a PostgreSQL constraint dropped) was claimed over its stray lease, as if
    # whole.  The kernel raises it as a row no decision wrote, and the store reports it naming it.
    store, edit = opened
    bypass = (
        "PRAGMA ignore_check_constraints = ON"
        if isinstance(store, SQLiteStore)
        else "ALTER TABLE workflow_dispatch DROP CONSTRAINT workflow_dispatch_check"
    )
    edit(f"{bypass}; {_STRAY_LEASE}; {_ROWS}")
    before = (edit(_ROWS), edit(_REVISIONS))
    assert before[0][0][5:8] == ("eligible", before[0][0][6], "tok-stray")
    report = _worker(store, "w-1", [0.0], []).run_pass()
    assert sorted(report.claimed) == ["x-2", "x-3"] and report.finished == {"succeeded": 2}
    [malformed] = report.malformed
    assert (malformed.execution_id, malformed.code) == ("x-1", "malformed_row")
    assert "dispatch.lease_token: set, but dispatch.dispatch_state is eligible" in malformed.message
    assert (edit(_ROWS), edit(_REVISIONS)) == before


def test_a_damaged_row_is_reported_once_and_claimed_again_by_the_same_worker_after_its_pause(opened: Opened) -> None:
    store, edit = opened
    edit(DAMAGES["a revision with no body"])
    clock, events = [0.0], []
    worker = _worker(store, "w-1", clock, events)
    first = worker.run_pass()
    assert [m.execution_id for m in first.malformed] == ["x-1"]
    assert sorted(first.claimed) == ["x-2", "x-3"]
    # Passed over: the next passes neither meet it nor report it.
    for _ in range(3):
        again = worker.run_pass()
        assert (again.claimed, again.malformed) == ([], [])
    clock[0] = 31.0  # past the first pause (the lease), still damaged: met again, not told again
    later = worker.run_pass()
    assert [m.execution_id for m in later.malformed] == ["x-1"] and later.claimed == []
    assert [e.execution_id for e in events if e.what == "malformed"] == ["x-1"]
    edit(_REPAIR)
    clock[0] = 60.0  # the second pause is twice the first: not yet
    assert worker.run_pass().claimed == []
    clock[0] = 31.0 + 61.0
    repaired = worker.run_pass()
    assert repaired.claimed == ["x-1"] and repaired.finished == {"succeeded": 1}
    assert repaired.malformed == []


def test_a_repaired_row_is_claimed_by_a_new_worker_at_once(opened: Opened) -> None:
    store, edit = opened
    edit(DAMAGES["a body that is no JSON"])
    assert _worker(store, "w-1", [0.0], []).run_pass().claimed == ["x-2", "x-3"]
    edit(_REPAIR)
    report = _worker(store, "w-2", [0.0], []).run_pass()
    assert report.claimed == ["x-1"] and report.malformed == []
    # (Read from its rows: the damaged revision stays in its history, which ``read`` would show.)
    assert [row[2] for row in edit(_ROWS)] == ["succeeded"]


def test_the_pause_doubles_up_to_its_limit() -> None:
    worker = Worker(MemoryStore(), "w-1", POLICY, examples.handler(), lease=timedelta(seconds=30))
    report = PassReport()
    lengths = []
    for _ in range(12):
        worker._pass_over("x-1", "damaged", report)
        lengths.append(worker._passing_over["x-1"].length)
    assert lengths[:3] == [30.0, 60.0, 120.0]
    assert lengths[-1] == MALFORMED_PAUSE_LIMIT.total_seconds()


def test_the_python_api_drains_past_a_damaged_row(opened: Opened) -> None:
    store, edit = opened
    edit(DAMAGES["a revision with no body"])
    client = Client(store, policy=POLICY, handler=examples.handler(), business=BUSINESS, principal=PRINCIPAL)
    report = client.run_until_idle()
    assert sorted(report.claimed) == ["x-2", "x-3"]
    assert [m.execution_id for m in report.malformed] == ["x-1"]
    edit(_REPAIR)
    with client.start_workers(2, poll=0.05) as pool:
        assert pool.wait_until_idle(timeout=30)
    assert pool.errors == [] and pool.report.claimed == ["x-1"]


def test_a_claim_passes_over_the_executions_it_is_told_to(opened: Opened) -> None:
    store, _ = opened
    request = p.ClaimRequest("w-1", "t-1", timedelta(seconds=30))
    outcome = store.claim_next(request, skip={"x-1", "x-2"})
    assert isinstance(outcome, p.Decision) and outcome.execution is not None
    assert outcome.execution.execution_id == "x-3"
    assert store.claim_next(p.ClaimRequest("w-1", "t-2", timedelta(seconds=30)), skip={"x-1", "x-2"}) is None
    # Without it, the head of the queue as always.
    outcome = store.claim_next(p.ClaimRequest("w-1", "t-3", timedelta(seconds=30)))
    assert isinstance(outcome, p.Decision) and outcome.execution is not None
    assert outcome.execution.execution_id == "x-1"


@pytest.mark.parametrize("damage", sorted({**DAMAGES, **CONTRADICTIONS}))
def test_check_lists_a_damaged_execution_as_a_warning(opened: Opened, request: pytest.FixtureRequest, tmp_path: Path, damage: str) -> None:
    _, edit = opened
    edit({**DAMAGES, **CONTRADICTIONS}[damage])
    check = fencekeeper("check", *request.node.db_args, "--json", cwd=tmp_path)
    assert check.returncode == 0, check
    found = json.loads(check.stdout)
    assert found["damaged_executions"] == ["x-1"]
    # Pinned to its definition still when its revision reads; the others counted as before.
    pinned = 3 if damage in CONTRADICTIONS else 2
    assert [(r["name"], r["count"]) for r in found["referenced_definitions"]] == [("two-node", pinned)]


@pytest.mark.parametrize("shape", [[], ["--concurrency", "3"], ["--processes", "2"]], ids=["one", "threads", "processes"])
def test_fencekeeper_worker_until_idle_drains_past_a_damaged_row_and_exits_1_naming_it(
    opened: Opened, request: pytest.FixtureRequest, tmp_path: Path, shape: list[str]
) -> None:
    _, edit = opened
    edit(DAMAGES["a revision with no body"])
    before = edit(_ROWS)
    db = request.node.db_args
    result = fencekeeper("worker", *db, "--until-idle", "--json", *shape, cwd=tmp_path)
    assert result.returncode == 1, result
    summary = json.loads(result.stdout)
    assert summary["claimed"] == 2 and summary["finished"] == {"succeeded": 2} and summary["errors"] == []
    assert [(m["execution_id"], m["code"]) for m in summary["malformed"]] == [("x-1", "malformed_row")]
    lines = result.stderr.splitlines()
    assert lines[-1].startswith("fencekeeper: error: passed over 1 execution(s) whose stored row is damaged: x-1")
    assert lines[-1].endswith("[malformed_row]")
    told = [line for line in lines if "execution x-1: malformed_row:" in line]
    # Once per process, whatever its threads: each thread meets the row, one line tells what to do.
    assert len(told) == (2 if "--processes" in shape else 1), result.stderr
    assert "until the row is repaired" in told[0]
    assert edit(_ROWS) == before
    # The check lists it; once repaired, the next worker runs it and exits 0.
    check = fencekeeper("check", *db, "--json", cwd=tmp_path)
    assert check.returncode == 0, check
    found = json.loads(check.stdout)
    assert found["damaged_executions"] == ["x-1"]
    assert any("x-1" in w and "malformed_row" in w for w in found["warnings"])
    edit(_REPAIR)
    again = fencekeeper("worker", *db, "--until-idle", "--json", cwd=tmp_path)
    assert again.returncode == 0, again
    assert json.loads(again.stdout)["finished"] == {"succeeded": 1}
    assert json.loads(fencekeeper("check", *db, "--json", cwd=tmp_path).stdout)["damaged_executions"] == []


def test_a_row_whose_state_was_edited_is_a_guard_conflict_that_says_so(
    opened: tuple[TransactionalStore, Callable[[str], Any]],
) -> None:
    # The execution's revision still reads, so nothing is malformed; but every guard written from it
    # misses the edited row. The refusal says what may have happened, and nothing is written.
    store, edit = opened
    edit("UPDATE objects SET state = 'waiting' WHERE object_id = 'x-1'")
    before = store.read("x-1")
    with pytest.raises(StoreError) as raised:
        service.cancel(store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", reason="r")
    assert raised.value.code == "guard_conflict" and "edited by hand" in raised.value.message
    assert store.read("x-1") == before


def test_a_due_timer_of_a_damaged_waiting_execution_is_passed_over_and_the_others_fire(tmp_path: Path) -> None:
    import sqlite3  # noqa: PLC0415

    from fencekeeper.adapters.store import ManualClock  # noqa: PLC0415
    from fencekeeper.adapters.testing.suite import admit, claim, decided, finalize_request, wait_spec  # noqa: PLC0415
    from fencekeeper.kernel.machines import ExecutionState  # noqa: PLC0415

    clock = ManualClock()
    store = SQLiteStore(tmp_path / "timers.db", clock=clock)
    try:
        for execution_id in ("e-a", "e-b"):
            admit(store, execution_id)
            claimed, credential = claim(store, "w-setup")
            assert claimed == execution_id
            spec = wait_spec(f"a-{execution_id}", event_type=None, wake_at=clock.now())
            decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
        with sqlite3.connect(tmp_path / "timers.db") as conn:
            # Still waiting on the same registration, so the due-timer lookup finds it; but no execution
            # revision (its fence is gone), so the timer's decision cannot read it.
            conn.execute(
                "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
                "SELECT object_id, 99, state, json_remove(body, '$.fence'), committed_at FROM object_revisions "
                "WHERE object_id = 'e-a' AND revision = (SELECT revision FROM objects WHERE object_id = 'e-a')"
            )
            conn.execute("UPDATE objects SET revision = 99 WHERE object_id = 'e-a'")
            before = conn.execute("SELECT * FROM objects WHERE object_id = 'e-a'").fetchall()
        worker = Worker(store, "w-1", examples.grants("b-1"), examples.handler())
        report = PassReport()
        worker.fire_due_timers(report)
        assert report.timers_fired == 1
        assert [(m.execution_id, m.code) for m in report.malformed] == [("e-a", "malformed_row")]
        woken = store.read("e-b")
        assert woken is not None and woken.execution.state == ExecutionState.ELIGIBLE
        with sqlite3.connect(tmp_path / "timers.db") as conn:
            assert conn.execute("SELECT * FROM objects WHERE object_id = 'e-a'").fetchall() == before
        # Passed over from then on: the next lookup neither meets nor reports it.
        again = PassReport()
        worker.fire_due_timers(again)
        assert (again.timers_fired, again.malformed) == (0, [])
    finally:
        store.close()


def test_a_claim_that_passes_over_a_row_still_skips_the_rows_others_hold(pg_dsn: str, pg_schema: str) -> None:
    import psycopg  # noqa: PLC0415

    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

    store = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, POLICY)
        for n in (1, 2, 3):
            service.run(
                store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
                input={"order_id": f"o-{n}"}, execution_id=f"x-{n}",
            )  # fmt: skip
        with psycopg.connect(pg_dsn) as holder:
            # Another transaction holds x-2's rows, as a worker in the middle of a decision does.
            holder.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
            holder.execute(
                "SELECT 1 FROM objects o JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id "
                "WHERE o.object_id = 'x-2' FOR UPDATE OF o, d"
            )
            outcome = store.claim_next(p.ClaimRequest("w-1", "t-1", timedelta(seconds=30)), skip={"x-1"})
            assert isinstance(outcome, p.Decision) and outcome.execution is not None
            assert outcome.execution.execution_id == "x-3"
            holder.rollback()
    finally:
        store.close()


def _empty_store(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Opened:
    """An empty store of ``kind`` (nothing admitted), and ``edit``: one SQL statement past the store, its rows."""
    store: TransactionalStore
    if kind == "sqlite":
        import sqlite3  # noqa: PLC0415

        store = SQLiteStore(tmp_path / "empty.db")

        def edit(sql: str) -> list[tuple[Any, ...]]:
            with sqlite3.connect(tmp_path / "empty.db") as conn:
                return [tuple(row) for row in conn.execute(sql).fetchall()]

        return store, edit
    import psycopg  # noqa: PLC0415

    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    store = PostgresStore(dsn, schema=schema)

    def edit_pg(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
            cursor = conn.execute(sql)  # type: ignore[arg-type]
            return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    return store, edit_pg


@pytest.mark.parametrize("body", ["garbled", '{"wait": ["e-a", "n", "\\u0000"]}'])
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_due_timer_of_an_execution_whose_body_is_no_json_does_not_stop_the_lookup(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, body: str
) -> None:
    # The due-timer lookup reads each waiting execution's wait out of its revision body in SQL. One
    # body that is no JSON (or holds an escape PostgreSQL's jsonb cannot keep) failed that reading,
    # and with it the lookup of every worker on every pass: no timer anywhere fired again (SQLite
    # raised its own "malformed JSON", uncaught).  The lookup passes over that execution now, as a
    # claim does, and the other timers fire.
    from datetime import UTC, datetime  # noqa: PLC0415

    from fencekeeper.adapters.testing.suite import admit, claim, decided, finalize_request, wait_spec  # noqa: PLC0415
    from fencekeeper.kernel.machines import ExecutionState  # noqa: PLC0415

    store, edit = _empty_store(request, tmp_path, kind)
    try:
        due = datetime.now(UTC) - timedelta(minutes=1)
        for execution_id in ("e-a", "e-b", "e-c"):
            admit(store, execution_id)
            claimed, credential = claim(store, "w-setup")
            assert claimed == execution_id
            spec = wait_spec(f"a-{execution_id}", event_type=None, wake_at=due)
            decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
        edit(
            "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) "
            f"SELECT object_id, 99, state, '{body}', committed_at FROM object_revisions "
            "WHERE object_id = 'e-a' AND revision = (SELECT revision FROM objects WHERE object_id = 'e-a')"
        )
        edit("UPDATE objects SET revision = 99 WHERE object_id = 'e-a'")
        rows = "SELECT * FROM objects WHERE object_id = 'e-a'"
        before = edit(rows)
        # A limit of one: the damaged execution, first in the order, must not fill it.
        assert [key.execution_id for key in store.due_wakes(limit=1)] == ["e-b"]
        report = PassReport()
        Worker(store, "w-1", examples.grants("b-1"), examples.handler()).fire_due_timers(report)
        assert report.timers_fired == 2
        for woken in ("e-b", "e-c"):
            view = store.read(woken)
            assert view is not None and view.execution.state == ExecutionState.ELIGIBLE
        assert edit(rows) == before
        assert store.due_wakes() == []
    finally:
        store.close()


@pytest.mark.parametrize("damage", sorted({**DAMAGES, **CONTRADICTIONS}))
def test_inspect_shows_the_error_the_workers_hint_sends_the_operator_to(
    opened: Opened, request: pytest.FixtureRequest, tmp_path: Path, damage: str
) -> None:
    # The worker's malformed line says `fencekeeper inspect ID` shows the error.  For two step counts that
    # disagree, inspect showed both counts and no error: both rows read, and nothing said a claim would not
    # decide on them.
    store, edit = opened
    edit({**DAMAGES, **CONTRADICTIONS}[damage])
    events: list[WorkerEvent] = []
    _worker(store, "w-1", [0.0], events).run_pass()
    [told] = [e for e in events if e.what == "malformed"]
    assert f"`fencekeeper inspect {told.execution_id}` shows the error" in told.detail
    # What the store found, without the execution it names and the store's own note.
    error = told.detail.split("execution 'x-1': ", 1)[1].split(" (the stored row", 1)[0]
    db = request.node.db_args
    shown = fencekeeper("inspect", "x-1", *db, cwd=tmp_path)
    assert error in shown.stdout + shown.stderr, (error, shown)
    if damage in CONTRADICTIONS:
        assert shown.returncode == 0, shown
        assert f"damaged [malformed_row] {error} (no decision is made on these rows" in shown.stdout
        assert json.loads(fencekeeper("inspect", "x-1", *db, "--json", cwd=tmp_path).stdout)["damaged"] == error
    # An execution whose rows are whole says nothing of the kind.
    whole = fencekeeper("inspect", "x-2", *db, cwd=tmp_path)
    assert whole.returncode == 0 and "damaged" not in whole.stdout
    assert json.loads(fencekeeper("inspect", "x-2", *db, "--json", cwd=tmp_path).stdout)["damaged"] is None


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_rows_that_disagree_are_malformed_row_on_every_wake_path(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    # A waiting execution whose two rows read but contradict each other (the kernel raises
    # MalformedSnapshot on them) is malformed_row naming it on every path that wakes: a worker's
    # timer lookup passes over it and fires the rest, where a bare ValueError stopped the worker; a
    # publication that would wake it fails whole, naming it (its Event would commit without the
    # wake it owes), and nothing is written.
    from datetime import UTC, datetime  # noqa: PLC0415

    from fencekeeper.adapters.testing import suite  # noqa: PLC0415
    from fencekeeper.kernel.events import Event  # noqa: PLC0415
    from fencekeeper.kernel.machines import ExecutionState  # noqa: PLC0415

    store, edit = _empty_store(request, tmp_path, kind)
    try:
        due = datetime.now(UTC) - timedelta(minutes=1)
        for execution_id in ("e-a", "e-b"):
            suite.admit(store, execution_id)
            claimed, credential = suite.claim(store, "w-setup")
            assert claimed == execution_id
            spec = suite.wait_spec(f"a-{execution_id}", wake_at=due)
            suite.decided(store.finalize(suite.finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
        edit("UPDATE workflow_dispatch SET step_count = 7 WHERE workflow_execution_id = 'e-a'")
        rows = "SELECT * FROM workflow_dispatch ORDER BY workflow_execution_id"
        before = edit(rows)
        event = Event.build("ev-1", "b-1", suite.EVENT_TYPE, dict(suite.CORRELATION), {"amount": 1})
        with pytest.raises(StoreError) as raised:
            store.publish_event(event, suite.GRANTED)
        assert raised.value.code == "malformed_row" and "execution 'e-a'" in raised.value.message
        assert edit(rows) == before
        assert edit("SELECT count(*) FROM events") == [(0,)]
        report = PassReport()
        Worker(store, "w-1", examples.grants("b-1"), examples.handler()).fire_due_timers(report)
        assert report.timers_fired == 1
        assert [(m.execution_id, m.code) for m in report.malformed] == [("e-a", "malformed_row")]
        assert edit("SELECT dispatch_state FROM workflow_dispatch WHERE workflow_execution_id = 'e-a'") == [("waiting",)]
        view = store.read("e-b")
        assert view is not None and view.execution.state == ExecutionState.ELIGIBLE
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_rows_that_disagree_are_malformed_row_on_every_decision_of_their_execution(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    # A renewal, a step, a release, a finalization or a cancellation on rows the kernel will not decide on
    # (MalformedSnapshot) raised the kernel's bare ValueError, an internal error with a traceback; each is now
    # malformed_row naming the execution, as a claim and every wake path are, and nothing is written.
    from fencekeeper.adapters.testing import suite  # noqa: PLC0415
    from fencekeeper.kernel.machines import ExecutionState  # noqa: PLC0415

    store, edit = _empty_store(request, tmp_path, kind)
    try:
        suite.admit(store, "e-r")
        claimed, credential = suite.claim(store, "w-1")
        assert claimed == "e-r"
        at = suite.revision(store, "e-r")
        suite.admit(store, "e-c")
        edit("UPDATE workflow_dispatch SET step_count = 7 WHERE workflow_execution_id IN ('e-r', 'e-c')")
        rows = "SELECT * FROM workflow_dispatch ORDER BY workflow_execution_id"
        before = edit(rows), edit("SELECT count(*) FROM object_revisions")
        decisions: dict[str, Callable[[], object]] = {
            "renew": lambda: store.renew("e-r", p.RenewRequest(credential, suite.LEASE)),
            "release": lambda: store.release("e-r", p.ReleaseRequest(credential, at)),
            "finalize": lambda: store.finalize(
                suite.finalize_request(store, "e-r", credential, ExecutionState.SUCCEEDED)
            ),
            "cancel": lambda: store.cancel(p.CancelRequest("e-c", "b-1", 1, suite.GRANTED)),
        }
        for name, decide in decisions.items():
            with pytest.raises(StoreError) as raised:
                decide()
            named = "e-c" if name == "cancel" else "e-r"
            assert raised.value.code == "malformed_row", (name, raised.value)
            assert f"execution {named!r}" in raised.value.message and "step_count" in raised.value.message, name
        assert (edit(rows), edit("SELECT count(*) FROM object_revisions")) == before
    finally:
        store.close()


def test_a_store_wrapper_that_predates_skip_still_drives_a_worker(tmp_path: Path) -> None:
    # The worker passes ``skip`` to claim_and_visit only while it passes something over: a store that
    # wraps another (a ledger, a proxy) written before ``skip`` existed is called as it always was.
    store = SQLiteStore(tmp_path / "wrapped.db")

    class Wrapper:
        def __init__(self, inner: SQLiteStore) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def claim_and_visit(self, request: p.ClaimRequest, plan: Any, *, business_id: str | None = None) -> Any:
            return self._inner.claim_and_visit(request, plan, business_id=business_id)

    try:
        service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, POLICY)
        outcome = service.run(
            store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
            input={"order_id": "o-1"}, execution_id="x-1",
        )  # fmt: skip
        assert isinstance(outcome, p.Decision), outcome
        report = Worker(Wrapper(store), "w-1", POLICY, examples.handler()).run_pass()  # type: ignore[arg-type]
        assert report.claimed == ["x-1"] and report.malformed == []
        view = store.read("x-1")
        assert view is not None and view.execution.state.value == "succeeded"
    finally:
        store.close()
