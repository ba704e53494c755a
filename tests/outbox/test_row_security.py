"""The exporter and the pruner refuse a role the tenant policies bind with no tenant set (PostgreSQL).

The outbox's policy (migration 10) shows such a role every workflow
execution's message and no Operation's.  Run as the application's role,
which docs/operating-postgres.md grants SELECT and UPDATE on the outbox, the
exporter delivered the executions' messages, left every Operation's pending
for ever and reported the backlog empty (``--status`` exit 0): nothing said
that a subscriber would never hear of an Operation.  The cross-tenant tools
are the operator's (docs/operating-postgres.md): now each refuses such a
role in one line, before it writes anything.  Scoped to a tenant, it sees
what it was scoped to, as its caller asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from fencekeeper.adapters import cli
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.outbox import (
    ExportedMessage,
    OutboxExporter,
    discard,
    outbox_status,
    parked_messages,
    requeue,
)
from fencekeeper.adapters.retention import RetentionWindows, prune
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.operations_suite import TENANT, World, open_accounts
from tests.conftest import granted_role
from tests.operations.test_postgres_tenant_boundary import TABLES


class Recording:
    def __init__(self) -> None:
        self.sent: list[ExportedMessage] = []

    def send(self, message: ExportedMessage) -> None:
        self.sent.append(message)

    def flush(self) -> None:
        pass


@pytest.fixture
def application_role(pg_dsn: str, pg_schema: str) -> Iterator[str]:
    """The application's role as docs/operating-postgres.md grants it, with DELETE too (so only the policies bind it)."""
    with granted_role(pg_dsn, pg_schema, TABLES, "SELECT, INSERT, UPDATE, DELETE") as role:
        yield role


@pytest.fixture
def written(pg_dsn: str, pg_schema: str) -> int:
    """Operations run to their end by the operator's role (a superuser here); their outbox rows, counted."""
    clock = ManualClock()
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    try:
        open_accounts(store, {"acc-1": 1_000, "acc-2": 0})
        world = World(store, clock)
        for n in range(3):
            world.transfer(f"k{n}", 1)
        worker = world.worker("w1")
        while worker.run_once() is not None:
            pass
        return int(store.application_execute("SELECT count(*) FROM outbox")[0][0])
    finally:
        store.close()


def _outbox(pg_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        return sorted(map(tuple, conn.execute("SELECT * FROM outbox").fetchall()), key=repr)


def _as(pg_dsn: str, role: str) -> str:
    return make_conninfo(pg_dsn, user=role)


def test_the_exporter_and_its_reports_refuse_a_role_that_sees_no_operation(
    pg_dsn: str, pg_schema: str, application_role: str, written: int
) -> None:
    before = _outbox(pg_dsn, pg_schema)
    store = PostgresOperationStore(_as(pg_dsn, application_role), schema=pg_schema, pool_size=1)
    try:
        sink = Recording()
        calls = [
            lambda: OutboxExporter(store, sink).run(until_idle=True),
            lambda: outbox_status(store),
            lambda: parked_messages(store),
            lambda: requeue(store, "x/1"),
            lambda: discard(store, "x/1"),
        ]
        for call in calls:
            with pytest.raises(StoreError) as refused:
                call()
            assert refused.value.code == "permission_denied"
            assert application_role in refused.value.message and "row-level security" in refused.value.message
        assert sink.sent == []
    finally:
        store.close()
    assert _outbox(pg_dsn, pg_schema) == before, "nothing claimed, marked or changed"


def test_scoped_to_a_tenant_the_exporter_delivers_that_tenants_messages(
    pg_dsn: str, pg_schema: str, application_role: str, written: int
) -> None:
    store = PostgresOperationStore(_as(pg_dsn, application_role), schema=pg_schema, pool_size=1, tenant=TENANT)
    try:
        sink = Recording()
        OutboxExporter(store, sink).run(until_idle=True)
        assert len(sink.sent) == written
        assert outbox_status(store).pending == 0
    finally:
        store.close()


def test_the_pruner_refuses_a_role_that_sees_no_operation(
    pg_dsn: str, pg_schema: str, application_role: str, written: int
) -> None:
    store = PostgresOperationStore(_as(pg_dsn, application_role), schema=pg_schema, pool_size=1)
    try:
        with pytest.raises(StoreError) as refused:
            prune(store, RetentionWindows(operations=timedelta(0), results=timedelta(0), history=timedelta(0)))
        assert refused.value.code == "permission_denied"
    finally:
        store.close()


@pytest.mark.usefixtures("written")
def test_export_status_as_the_application_role_exits_1_in_one_line(
    pg_dsn: str,
    pg_schema: str,
    application_role: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # A URL, as a user types it: the same server and database, as the application's role.
    parts = urlsplit(pg_dsn)
    netloc = f"{application_role}@{parts.hostname}" + ("" if parts.port is None else f":{parts.port}")
    db = urlunsplit(parts._replace(netloc=netloc))
    sink = tmp_path / "events.jsonl"
    for args in (["--status"], ["--sink", f"file:{sink}", "--until-idle"]):
        code = cli.main(["export", "--db", db, "--schema", pg_schema, *args])
        out, err = capsys.readouterr()
        assert code == 1, err
        assert out == ""
        [line] = err.splitlines()
        assert line.startswith("fencekeeper: error: ") and line.endswith("[permission_denied]"), line
        assert application_role in line
    assert not sink.exists() or sink.read_text() == ""
