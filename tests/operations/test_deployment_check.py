"""The deployment check per namespace and tenant (seed 001, Upgrade and operation, step 4).

Missing schema, action or principal resolver blocks (exit 1); outbox lag and
rows past their retention window are warnings; the check never writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from fencekeeper.adapters import deployment, postgres_store
from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableOperationService, PrincipalReference
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.store import ManualClock

from . import empty_actions

ALICE = PrincipalReference("users", 1, "alice")
ROOT = Path(__file__).resolve().parents[2]


def _submit(store: object, tenant: str, key: str, *, retention: timedelta = timedelta(days=1)) -> str:
    service = DurableOperationService(store, examples.registry(), examples.resolvers(), retention=retention)  # type: ignore[arg-type]
    return service.submit(tenant=tenant, principal=ALICE, action="balance", input={"account": "acc-1"}, client_key=key).operation_id


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_missing_action_or_resolver_blocks_and_only_its_tenant_counts(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteOperationStore(db, None)  # type: ignore[arg-type]
    try:
        _submit(store, "acme", "k1")
        _submit(store, "acme", "k2")
        _submit(store, "other", "k1")
    finally:
        store.close()
    before = _digest(db)
    blocked = deployment.check_deployment(
        str(db), tenant="acme", actions=empty_actions.registry(), resolvers=empty_actions.resolvers()
    )
    assert not blocked.ok
    assert [(r.name, r.version, r.count, r.registered) for r in blocked.actions] == [("balance", 1, 2, False)]
    assert [(r.name, r.version, r.count, r.registered) for r in blocked.resolvers] == [("users", 1, 2, False)]
    assert any("action balance v1 is not registered" in b for b in blocked.blocking)
    assert any("principal resolver users v1" in b for b in blocked.blocking)
    passing = deployment.check_deployment(str(db), tenant="acme", actions=examples.registry(), resolvers=examples.resolvers())
    assert passing.ok and passing.blocking == ()
    assert [r.registered for r in passing.actions] == [True]
    # Another tenant with no operations has nothing to block on, whatever the registry.
    empty = deployment.check_deployment(str(db), tenant="nobody", actions=empty_actions.registry(), resolvers=empty_actions.resolvers())
    assert empty.ok and empty.actions == ()
    # Each of acme's two submissions committed an outbox row, and no exporter has delivered either.
    assert passing.outbox is not None and (passing.outbox.rows, passing.outbox.pending) == (2, 2)
    assert passing.outbox.lag_seconds is not None and passing.outbox.lag_seconds >= 0 and passing.outbox.note == ""
    assert _digest(db) == before, "the check wrote to the store"


def test_an_ended_operation_past_its_window_is_a_warning(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    clock = ManualClock(datetime.now(UTC) - timedelta(days=3))
    store = SQLiteOperationStore(db, clock)
    try:
        examples.prepare(store)
        operation_id = _submit(store, "acme", "k1", retention=timedelta(days=1))
        worker = DurableOperationWorker(store, examples.registry(), examples.resolvers(), tenant="acme", worker_id="w")
        report = worker.run_once()
        assert report is not None and report.outcome == "succeeded"
        _submit(store, "acme", "k-open", retention=timedelta(days=1))  # still open: never reported as unpruned
    finally:
        store.close()
    found = deployment.check_deployment(str(db), tenant="acme", actions=examples.registry(), resolvers=examples.resolvers())
    assert found.ok, found.blocking
    assert found.oldest_unpruned is not None
    assert found.oldest_unpruned.table in ("operations", "operation_identities")
    assert found.oldest_unpruned.overdue_seconds > 86_400
    if found.oldest_unpruned.table == "operations":
        assert found.oldest_unpruned.key == operation_id
    assert any("past its window" in w for w in found.warnings)


def test_a_parked_outbox_row_is_reported_apart_from_the_export_lag(tmp_path: Path) -> None:
    from fencekeeper.adapters.outbox import ExportedMessage, ExportRetry, OutboxExporter, SinkError  # noqa: PLC0415

    class Refusing:
        def send(self, message: ExportedMessage) -> None:
            raise SinkError("refused")

        def flush(self) -> None:
            pass

    db = tmp_path / "ops.db"
    now = datetime.now(UTC)
    clock = ManualClock(now - timedelta(hours=1))
    store = SQLiteOperationStore(db, clock)
    try:
        _submit(store, "acme", "k1")
        # Given up on an hour ago: it waits for an operator (export --parked), not for the exporter.
        assert OutboxExporter(store, Refusing(), retry=ExportRetry(maximum_attempts=1)).run(until_idle=True).parked == 1
        clock.set(now)
        _submit(store, "acme", "k2")  # a backlog of one row, just committed
    finally:
        store.close()
    found = deployment.check_deployment(str(db), tenant="acme", actions=examples.registry(), resolvers=examples.resolvers())
    assert found.outbox is not None
    assert (found.outbox.rows, found.outbox.pending, found.outbox.parked) == (2, 1, 1)
    assert found.outbox.oldest_pending_at == now and found.outbox.oldest_parked_at == now - timedelta(hours=1)
    assert found.outbox.lag_seconds is not None and found.outbox.lag_seconds < 300
    assert not any("waiting for export" in w for w in found.warnings), found.warnings
    assert any("1 row(s) parked" in w and "export --parked" in w for w in found.warnings), found.warnings
    shown = found.to_json()["outbox"]
    assert (shown["parked"], shown["oldest_parked_at"]) == (1, (now - timedelta(hours=1)).isoformat())


def _cli(*args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "fencekeeper", *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    return done.returncode, done.stdout


def test_the_command_exits_1_on_a_blocking_finding_and_prints_the_whole_result(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteOperationStore(db, None)  # type: ignore[arg-type]
    try:
        _submit(store, "acme", "k1")
    finally:
        store.close()
    code, out = _cli("check", "--db", str(db), "--tenant", "acme", "--actions", "tests.operations.empty_actions", "--json")
    assert code == 1, out
    result = json.loads(out)
    assert result["ok"] is False and result["tenant"] == "acme"
    assert result["operations"]["referenced_actions"] == [{"name": "balance", "version": 1, "count": 1, "registered": False}]
    assert result["missing_migrations"] == []
    assert result["outbox"]["pending"] == 1 and result["oldest_unpruned"] is None
    code, out = _cli("check", "--db", str(db), "--tenant", "acme", "--actions", examples.__name__, "--json")
    assert code == 0, out
    assert json.loads(out)["operations"]["referenced_resolvers"][0]["registered"] is True


def test_postgres_a_missing_migration_blocks(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = f"fk_chk_{uuid.uuid4().hex[:12]}"
    with monkeypatch.context() as patched:
        patched.setattr(postgres_store, "MIGRATIONS", postgres_store.MIGRATIONS[:-1])
        postgres_store.migrate(pg_dsn, schema)
    try:
        report = deployment.check_deployment(f"{pg_dsn}?schema={schema}")
        newest = postgres_store.MIGRATIONS[-1][0]
        assert not report.ok
        assert any("schema_outdated" in b or "run `fencekeeper migrate`" in b for b in report.blocking), report.blocking
        postgres_store.migrate(pg_dsn, schema)
        report = deployment.check_deployment(f"{pg_dsn}?schema={schema}")
        assert report.ok, report.blocking
        assert report.missing_migrations == () and report.base.schema_version == newest
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def test_postgres_the_check_counts_one_tenant(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        _submit(store, "acme", "k1")
        _submit(store, "other", "k1")
        _submit(store, "other", "k2")
    finally:
        store.close()
    report = deployment.check_deployment(
        f"{pg_dsn}?schema={pg_schema}", tenant="other", actions=empty_actions.registry(), resolvers=empty_actions.resolvers()
    )
    assert not report.ok
    assert [(r.name, r.count) for r in report.actions] == [("balance", 2)]
    # Only the tenant's own outbox rows count: other's two submissions, not acme's one.
    assert report.outbox is not None and (report.outbox.rows, report.outbox.pending, report.outbox.parked) == (2, 2, 0)


def test_the_outbox_lag_counts_the_workflow_executions_of_the_tenants_business_too(tmp_path: Path) -> None:
    """The exporter delivers executions' transitions as well: a stalled exporter must show in the check for them."""
    from fencekeeper.adapters import examples as execution_examples  # noqa: PLC0415
    from fencekeeper.adapters import service  # noqa: PLC0415
    from fencekeeper.adapters.sqlite_store import SQLiteStore  # noqa: PLC0415
    from fencekeeper.kernel.definition import parse_definition  # noqa: PLC0415

    db = tmp_path / "shop.db"
    purchase = ROOT / "docs" / "examples" / "purchase_approval.toml"
    store = SQLiteStore(db)
    try:
        definition = parse_definition(purchase.read_text(encoding="utf-8"), purchase.name)
        for business, execution_id in (("acme", "po-1"), ("acme", "po-2"), ("other", "po-3")):
            policy = execution_examples.grants(business, "user:operator")
            service.register(store, definition, business, "user:operator", policy)
            service.run(
                store, policy, business_id=business, principal_id="user:operator",
                definition_id=definition.definition_id, execution_id=execution_id,
                input={"amount": 2500, "order_id": "o-1", "order_revision": 1},
            )  # fmt: skip
    finally:
        store.close()
    store = SQLiteOperationStore(db, None)  # type: ignore[arg-type]
    try:
        _submit(store, "acme", "k1")
    finally:
        store.close()
    before = _digest(db)
    report = deployment.check_deployment(str(db), tenant="acme")
    # acme's two admissions and its one submission; not the other business's admission.
    assert report.outbox is not None and (report.outbox.rows, report.outbox.pending, report.outbox.parked) == (3, 3, 0)
    assert report.outbox.oldest_pending_at is not None
    other = deployment.check_deployment(str(db), tenant="other")
    assert other.outbox is not None and (other.outbox.rows, other.outbox.pending) == (1, 1)
    assert _digest(db) == before


def test_an_execution_pinned_to_a_definition_the_store_lacks_blocks(tmp_path: Path) -> None:
    from fencekeeper.adapters import examples as execution_examples  # noqa: PLC0415
    from fencekeeper.adapters import service  # noqa: PLC0415
    from fencekeeper.adapters.sqlite_store import SQLiteStore  # noqa: PLC0415
    from fencekeeper.kernel.definition import parse_definition  # noqa: PLC0415

    db = tmp_path / "shop.db"
    purchase = ROOT / "docs" / "examples" / "purchase_approval.toml"
    store = SQLiteStore(db)
    try:
        policy = execution_examples.grants("default", "user:operator")
        definition = parse_definition(purchase.read_text(encoding="utf-8"), purchase.name)
        service.register(store, definition, "default", "user:operator", policy)
        service.run(
            store, policy, business_id="default", principal_id="user:operator", definition_id=definition.definition_id,
            execution_id="po-1", input={"amount": 2500, "order_id": "o-1", "order_revision": 1},
        )  # fmt: skip
    finally:
        store.close()
    held = deployment.check_deployment(str(db))
    assert held.ok, held.blocking
    assert [(r.business, r.name, r.version, r.count, r.registered) for r in held.definitions] == [
        ("default", "purchase-approval", 1, 1, True)
    ]
    # A store restored without the revision its open execution is pinned to (the append-only
    # trigger is lifted for the edit and put back exactly as it was, so the schema reads unaltered).
    import sqlite3  # noqa: PLC0415

    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        [trigger] = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'object_revisions_no_update'").fetchone()
        conn.execute("DROP TRIGGER object_revisions_no_update")
        conn.execute(
            "UPDATE object_revisions SET body = replace(body, '\"definition_revision\":1', '\"definition_revision\":7') "
            "WHERE object_id = 'po-1'"
        )
        conn.execute(trigger)
    missing = deployment.check_deployment(str(db))
    assert not missing.ok
    assert [(r.name, r.version, r.registered) for r in missing.definitions] == [("purchase-approval", 7, False)]
    assert missing.blocking == (
        "definition purchase-approval revision 7 of business default is not in the store; "
        "1 execution(s) not yet ended are pinned to it",
    )


def test_postgres_the_time_source_is_information_not_a_warning(pg_dsn: str, pg_schema: str) -> None:
    """A clean deployment has no warnings, so that an alert on them fires only when something needs doing.

    The clock comparison is reported on every PostgreSQL check, for information
    only (leases are judged by the database's clock alone): it is a note.
    """
    report = deployment.check_deployment(
        f"{pg_dsn}?schema={pg_schema}", tenant="acme", actions=examples.registry(), resolvers=examples.resolvers()
    )
    assert report.ok and report.warnings == ()
    document = report.to_json()
    assert document["warnings"] == []
    assert any("clock_timestamp()" in note for note in document["notes"])
