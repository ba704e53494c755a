"""Every transition writes its outbox row in its own transaction; what a row says never changes.

Proves, on SQLite and PostgreSQL: one outbox row per transition of an
Operation and of a workflow execution, in order, with a self-contained
payload; a refused decision writes none; the message columns refuse UPDATE.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.service import DurableOperationError
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.testing.operations_suite import World
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import EXAMPLES
from tests.outbox.conftest import rows


def test_every_operation_transition_writes_one_row_with_it(world: World, store: TransactionalOperationStore) -> None:
    op_id = world.transfer("k1", 5)
    report = world.worker("w1").run_once()
    assert report is not None and report.outcome == "succeeded"
    transitions = rows(store, "SELECT revision, to_state FROM operation_transitions WHERE operation_id = ? "
                              "ORDER BY revision", (op_id,))  # fmt: skip
    outbox = rows(store, "SELECT message_id, topic, payload FROM outbox WHERE subject_id = ? ORDER BY seq", (op_id,))
    assert [r[0] for r in outbox] == [f"{op_id}/{rev}" for rev, _ in transitions]
    assert [r[1] for r in outbox] == [f"operation.{state}" for _, state in transitions]
    last = json.loads(str(outbox[-1][2]))
    assert (last["operation_id"], last["tenant"], last["outcome"], last["revision"]) == (
        op_id, "tenant-a", "succeeded", transitions[-1][0],
    )  # fmt: skip


def test_a_refused_decision_writes_no_outbox_row(world: World, store: TransactionalOperationStore) -> None:
    world.transfer("k1", 5)
    before = rows(store, "SELECT count(*) FROM outbox")
    with pytest.raises(DurableOperationError):
        world.transfer("k1", 6)  # the same identity with another input: idempotency_conflict
    assert rows(store, "SELECT count(*) FROM outbox") == before


def test_what_an_outbox_row_says_cannot_be_changed(world: World, store: TransactionalOperationStore) -> None:
    op_id = world.transfer("k1", 5)
    for column, value in (("payload", "{}"), ("topic", "x"), ("message_id", "other")):
        with pytest.raises(Exception, match="never changes"):
            rows(store, f"UPDATE outbox SET {column} = ? WHERE subject_id = ?", (value, op_id))
    assert rows(store, "SELECT topic FROM outbox WHERE subject_id = ?", (op_id,)) == [("operation.admitted",)]


def _run_purchases(store: object) -> None:
    policy = examples.grants("default", "user:operator")
    path = EXAMPLES / "purchase_approval.toml"
    definition = parse_definition(path.read_text(encoding="utf-8"), path.name)
    service.register(store, definition, "default", "user:operator", policy)  # type: ignore[arg-type]
    for n in range(3):
        service.run(
            store, policy, business_id="default", principal_id="user:operator",  # type: ignore[arg-type]
            definition_id=definition.definition_id, execution_id=f"po-{n}",
            input={"amount": 5 + n, "order_id": f"o-{n}", "order_revision": 1},
        )  # fmt: skip
    worker = Worker(store, "w-1", policy, examples.handler(), business_id="default")  # type: ignore[arg-type]
    while worker.run_pass().claimed:
        pass


def test_every_execution_transition_writes_one_row_with_it_sqlite(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ex.db")
    try:
        _run_purchases(store)
    finally:
        store.close()
    import sqlite3  # noqa: PLC0415

    conn = sqlite3.connect(tmp_path / "ex.db")
    try:
        for n in range(3):
            history = conn.execute(
                "SELECT revision, to_state FROM execution_transitions WHERE execution_id = ? "
                "ORDER BY revision, rank, seq", (f"po-{n}",),
            ).fetchall()  # fmt: skip
            messages = conn.execute(
                "SELECT payload, tenant FROM outbox WHERE kind = 'execution' AND subject_id = ? ORDER BY seq", (f"po-{n}",)
            ).fetchall()
            assert len(history) >= 2
            payloads = [json.loads(p) for p, _ in messages]
            assert [(p["revision"], p["to_state"]) for p in payloads] == [tuple(h) for h in history]
            assert {t for _, t in messages} == {"default"}
    finally:
        conn.close()


def test_every_execution_transition_writes_one_row_with_it_postgresql(pg_dsn: str, pg_schema: str) -> None:
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

    store = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        _run_purchases(store)
    finally:
        store.close()
    import psycopg  # noqa: PLC0415

    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        for n in range(3):
            revisions = [
                r[0] for r in conn.execute(
                    "SELECT revision FROM object_revisions WHERE object_id = %s ORDER BY revision", (f"po-{n}",)
                ).fetchall()
            ]  # fmt: skip
            payloads = [
                json.loads(r[0]) for r in conn.execute(
                    "SELECT payload FROM outbox WHERE kind = 'execution' AND subject_id = %s ORDER BY seq", (f"po-{n}",)
                ).fetchall()
            ]  # fmt: skip
            # Each revision's transition, in order (a renewal would add a row at the same revision).
            assert sorted({p["revision"] for p in payloads}) == revisions
            assert [p["revision"] for p in payloads] == sorted(p["revision"] for p in payloads)


@pytest.mark.parametrize("business_id", [None, "default"])
@pytest.mark.parametrize("moved", [False, True])
def test_an_execution_row_says_what_the_generic_encoder_says(business_id: str | None, moved: bool) -> None:
    # The payload is written out by hand for the kernel's exact types: it must be the generic text, byte for byte.
    from datetime import UTC, datetime  # noqa: PLC0415

    from fencekeeper.adapters import outbox_rows  # noqa: PLC0415
    from fencekeeper.kernel import protocol as p  # noqa: PLC0415
    from fencekeeper.kernel.machines import ExecutionEvent, ExecutionState  # noqa: PLC0415

    record = p.TransitionRecord(
        "po-1", ExecutionEvent.CLAIM if moved else None, ExecutionState.ELIGIBLE if moved else None,
        ExecutionState.RUNNING, 7, datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), 'worker:w-"é\\', "tok-1", 3,
        "cla\u2028imed\n",
    )  # fmt: skip
    row = outbox_rows.execution_row(record, business_id)
    fields = json.loads(row.payload)
    assert row.payload == outbox_rows._json(fields)
    assert row.message_id.startswith("po-1/7/") and len(row.message_id.rsplit("/", 1)[1]) == 16
    assert (fields["message_id"], fields["to_state"], fields["event"], fields["actor"], fields.get("business_id")) == (
        row.message_id, "running", "claim" if moved else None, 'worker:w-"é\\', business_id,
    )  # fmt: skip
    assert row.message_id != outbox_rows.execution_row(record, business_id).message_id


@pytest.mark.parametrize("ended", [False, True])
def test_an_operation_row_says_what_the_generic_encoder_says(ended: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The payload is written out by hand for the kernel's exact types: it must be the generic text, byte for byte.
    from datetime import UTC, datetime  # noqa: PLC0415

    from fencekeeper.adapters import outbox_rows  # noqa: PLC0415
    from fencekeeper.kernel import operations as o  # noqa: PLC0415
    from fencekeeper.kernel.machines import OperationEvent, OperationState  # noqa: PLC0415

    at = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    operation = o.Operation(
        "op-1", o.Identity("shop", "tenant-a", "users:v1:alice", "key-1"), "transfer", 3, o.EffectClass.ATOMIC,
        "0" * 64, OperationState.FAILED if ended else OperationState.ADMITTED, 4, o.RetryPolicy(), at, at, at, at,
        outcome=o.TerminalOutcome.ACTION_FAILED if ended else None, error_code='bad "é\\' if ended else None,
    )  # fmt: skip
    transition = o.Transition(
        "op-1", 4, OperationEvent.FAIL if ended else None, OperationState.RUNNING if ended else None,
        operation.state, at, 'worker:w-"é\\', 2, "fa\u2028iled\n",
    )  # fmt: skip
    generic = outbox_rows._json
    with monkeypatch.context() as patched:
        patched.setattr(outbox_rows, "_json", None)  # the kernel's own types never take the generic path
        row = outbox_rows.operation_row(operation, transition)
    fields = json.loads(row.payload)
    assert row.payload == generic(fields)
    assert (row.message_id, row.topic, fields["event"], fields["outcome"], fields["error_code"], fields["actor"]) == (
        "op-1/4", f"operation.{operation.state.value}", "fail" if ended else None,
        "action_failed" if ended else None, 'bad "é\\' if ended else None, 'worker:w-"é\\',
    )  # fmt: skip
    assert len(fields) == 17 and (fields["revision"], fields["action_version"], fields["at"]) == (
        4, 3, "2026-01-02T03:04:05.000006+00:00",
    )  # fmt: skip


def _outbox_count(pg_dsn: str, pg_schema: str) -> int:
    import psycopg  # noqa: PLC0415 - PostgreSQL only

    with psycopg.connect(pg_dsn, options=f"-c search_path={pg_schema}") as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    assert row is not None
    return int(row[0])


def test_an_execution_decision_whose_guard_fails_at_the_commit_writes_no_outbox_row(
    pg_dsn: str, pg_schema: str
) -> None:
    from fencekeeper.adapters import store as store_module  # noqa: PLC0415
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415
    from fencekeeper.adapters.testing.suite import claim, decided  # noqa: PLC0415
    from fencekeeper.kernel import protocol as p  # noqa: PLC0415

    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=2)
    try:
        admitted = store.admit(p.AdmitRequest("e-1", "acme", "d", 1, "start", p.Authority(True, "ops")))
        assert isinstance(admitted, p.Decision)
        execution_id, credential = claim(store)
        before = _outbox_count(pg_dsn, pg_schema)
        with pytest.raises(store_module._KeptWriteFailed), store._transaction() as tx:
            tx.lock(execution_id)
            now = tx.now(store.clock)
            decision = decided(p.renew(*tx.load(execution_id), p.RenewRequest(credential, timedelta(seconds=30)), now))
            # A guard no row matches: the database finds out only at the COMMIT, and rolls it all back.
            guard = attrs.evolve(decision.guard, expected_revision=decision.guard.expected_revision + 7)
            stale = attrs.evolve(decision, guard=guard)
            assert tx.write_last(stale, (), now) is True
        assert _outbox_count(pg_dsn, pg_schema) == before, "a rolled-back renewal published nothing"
        decided(store.renew(execution_id, p.RenewRequest(credential, timedelta(seconds=30))))
        assert _outbox_count(pg_dsn, pg_schema) == before + 1, "the same renewal, committed, publishes one"
    finally:
        store.close()
