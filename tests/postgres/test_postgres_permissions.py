"""A database role without the grants the execution and journal stores need: ``permission_denied``, nothing written.

PostgreSQL reports a missing grant as SQLSTATE 42501.  Each store turns it
into one StoreError naming the role, the object and the privileges it lacks
(the operations store's own classification, shared), and its deployment
check tells a schema the role may not read from one that is not there.  The
roles are cluster-wide: each test makes one with a unique name and drops it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fencekeeper.adapters import bridge, cli
from fencekeeper.adapters.journal_postgres import PostgresJournalStore
from fencekeeper.adapters.postgres_async import open_async_store
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.store import StoreError
from fencekeeper.adapters.testing.journal import created
from fencekeeper.kernel import journal as j
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import NodeEvent, NodeState
from tests.cli.runner import EXAMPLES
from tests.conftest import drop_role
from tests.http.test_postgres_failures import ALICE, ORDER, served_on

OPS = p.Authority(True, "ops")


@pytest.fixture
def app_role(pg_dsn: str, pg_schema: str) -> Iterator[str]:
    """A login role that may read and write every table of the schema (no DELETE, no CREATE); dropped after the test."""
    role = f"fk_exec_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS")  # type: ignore[arg-type]
        conn.execute(f"GRANT USAGE ON SCHEMA {pg_schema} TO {role}")  # type: ignore[arg-type]
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {pg_schema} TO {role}")  # type: ignore[arg-type]
        conn.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {pg_schema} TO {role}")  # type: ignore[arg-type]
    try:
        yield role
    finally:
        drop_role(pg_dsn, role)


def _as_owner(pg_dsn: str, statement: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def _count(pg_dsn: str, schema: str, table: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema}.{table}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def _url(pg_dsn: str, role: str) -> str:
    params = conninfo_to_dict(pg_dsn)
    return f"postgresql://{role}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{params['dbname']}"


def test_an_execution_write_without_its_grant_is_permission_denied_and_writes_nothing(
    pg_dsn: str, pg_schema: str, app_role: str
) -> None:
    _as_owner(pg_dsn, f"REVOKE INSERT ON {pg_schema}.object_revisions FROM {app_role}")
    store = PostgresStore(make_conninfo(pg_dsn, user=app_role), schema=pg_schema, pool_size=1)
    try:
        with pytest.raises(StoreError) as refused:
            store.admit(p.AdmitRequest("e-1", "acme", "d", 1, "start", OPS))
        assert refused.value.code == "permission_denied"
        assert f"role {app_role} lacks INSERT, DELETE on table object_revisions (it has SELECT, UPDATE)" in refused.value.message
        assert "nothing was written" in refused.value.message
        # The pool's one connection is usable again: the store goes on answering.
        assert store.read("e-1") is None
    finally:
        store.close()
    # The admission's other rows (its object, its dispatch) were rolled back with the refused one.
    assert _count(pg_dsn, pg_schema, "objects") == 0
    assert _count(pg_dsn, pg_schema, "workflow_dispatch") == 0


def test_the_asyncio_store_reports_a_missing_grant_alike(pg_dsn: str, pg_schema: str, app_role: str) -> None:
    """Its lookup of the role's privileges goes through the async pool, as its statements do."""
    _as_owner(pg_dsn, f"REVOKE INSERT ON {pg_schema}.object_revisions FROM {app_role}")

    async def admit() -> StoreError:
        store = await open_async_store(make_conninfo(pg_dsn, user=app_role), schema=pg_schema, pool_size=1)
        try:
            with pytest.raises(StoreError) as refused:
                await bridge.run_sync(store.admit, p.AdmitRequest("e-1", "acme", "d", 1, "start", OPS))
            return refused.value
        finally:
            await bridge.run_sync(store.close)

    refused = asyncio.run(admit())
    assert refused.code == "permission_denied"
    assert f"role {app_role} lacks INSERT, DELETE on table object_revisions (it has SELECT, UPDATE)" in refused.message
    assert _count(pg_dsn, pg_schema, "objects") == 0


def test_a_journal_append_without_its_grant_is_permission_denied_and_moves_no_head(
    pg_dsn: str, pg_schema: str, app_role: str
) -> None:
    store = PostgresJournalStore(make_conninfo(pg_dsn, user=app_role), schema=pg_schema)
    try:
        journal = created(store)
        _as_owner(pg_dsn, f"REVOKE INSERT ON {pg_schema}.journal_events FROM {app_role}")
        start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                             "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        with pytest.raises(StoreError) as refused:
            store.append("review-1", start)
        assert refused.value.code == "permission_denied"
        assert f"role {app_role} lacks INSERT, DELETE on table journal_events (it has SELECT, UPDATE)" in refused.value.message
        # The head's UPDATE and the events' INSERT are one statement: neither happened.
        loaded = store.load("review-1")
        assert loaded is not None and loaded.head == journal.head and not loaded.events
    finally:
        store.close()
    assert _count(pg_dsn, pg_schema, "journal_events") == 0


def test_a_journal_read_without_its_grant_is_permission_denied(pg_dsn: str, pg_schema: str, app_role: str) -> None:
    _as_owner(pg_dsn, f"REVOKE SELECT ON {pg_schema}.journal_headers FROM {app_role}")
    store = PostgresJournalStore(make_conninfo(pg_dsn, user=app_role), schema=pg_schema)
    try:
        with pytest.raises(StoreError) as refused:
            store.execution_ids()
        assert refused.value.code == "permission_denied"
        assert f"role {app_role} lacks SELECT, DELETE on table journal_headers (it has INSERT, UPDATE)" in refused.value.message
    finally:
        store.close()


def test_schema_migrations_the_role_may_not_read_is_permission_denied_not_schema_missing(
    pg_dsn: str, pg_schema: str, app_role: str
) -> None:
    """information_schema hides a table the role holds no privilege on; the check looks in the catalogs."""
    as_role = make_conninfo(pg_dsn, user=app_role)
    _as_owner(pg_dsn, f"REVOKE ALL ON {pg_schema}.schema_migrations FROM {app_role}")
    for opening in (
        lambda: PostgresStore(as_role, schema=pg_schema, pool_size=1),
        lambda: PostgresJournalStore(as_role, schema=pg_schema),
    ):
        with pytest.raises(StoreError) as refused:
            opening()
        assert refused.value.code == "permission_denied", refused.value
        assert f"role {app_role} lacks SELECT, INSERT, UPDATE, DELETE on table schema_migrations (it has none of these)" in (
            refused.value.message
        )
    # Without USAGE on the schema, nothing in it can be named: the schema's grant is the one to give.
    _as_owner(pg_dsn, f"REVOKE USAGE ON SCHEMA {pg_schema} FROM {app_role}")
    with pytest.raises(StoreError) as no_usage:
        PostgresStore(as_role, schema=pg_schema, pool_size=1)
    assert no_usage.value.code == "permission_denied"
    assert f"role {app_role} lacks USAGE, CREATE on schema {pg_schema} (it has none of these)" in no_usage.value.message
    # A schema that is not there is still schema_missing, for this role as for any.
    with pytest.raises(StoreError) as missing:
        PostgresStore(as_role, schema=f"{pg_schema}_absent", pool_size=1)
    assert missing.value.code == "schema_missing"


@pytest.mark.parametrize(
    "case",
    [
        ("INSERT ON {schema}.object_revisions", ["run", str(EXAMPLES / "purchase_approval.toml"), "--input",
                                                 '{"amount": 2500, "order_id": "o-1", "order_revision": 1}', "--id", "po-1"]),
        ("SELECT ON {schema}.workflow_dispatch", ["worker", "--until-idle"]),
        ("ALL ON {schema}.schema_migrations", ["inspect", "po-1"]),
    ],
)  # fmt: skip
def test_the_command_line_exits_1_with_one_permission_denied_line(
    pg_dsn: str, pg_schema: str, app_role: str, case: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    revoke, command = case
    _as_owner(pg_dsn, f"REVOKE {revoke.format(schema=pg_schema)} FROM {app_role}")
    objects = _count(pg_dsn, pg_schema, "objects")
    code = cli.main([*command, "--db", _url(pg_dsn, app_role), "--schema", pg_schema])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("fencekeeper: error: "), err
    assert lines[0].endswith("[permission_denied]") and f"role {app_role} lacks" in lines[0], err
    assert _count(pg_dsn, pg_schema, "objects") == objects


def test_the_http_service_answers_a_missing_grant_500_permission_denied(
    pg_dsn: str, pg_schema: str, app_role: str
) -> None:
    with served_on(make_conninfo(pg_dsn, user=app_role), pg_schema) as client:
        objects = _count(pg_dsn, pg_schema, "objects")
        _as_owner(pg_dsn, f"REVOKE INSERT ON {pg_schema}.object_revisions FROM {app_role}")
        run = client.post(
            "/executions", json={"definition": "purchase-approval", "execution_id": "po-1", "input": ORDER}, headers=ALICE
        )
    assert run.status_code == 500, run.text
    error = run.json()["error"]
    assert error["code"] == "permission_denied" and f"role {app_role} lacks INSERT" in error["message"]
    assert _count(pg_dsn, pg_schema, "objects") == objects



def test_check_without_select_on_the_store_tables_reports_one_permission_denied_problem(
    pg_dsn: str, pg_schema: str, app_role: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """schema_migrations readable, objects not: the check's counts are refused, and it says which grant is missing."""
    _as_owner(pg_dsn, f"REVOKE SELECT ON {pg_schema}.objects FROM {app_role}")
    objects = _count(pg_dsn, pg_schema, "objects")
    code = cli.main(["check", "--db", _url(pg_dsn, app_role), "--schema", pg_schema])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert captured.err == "", captured.err
    problems = [line for line in captured.out.splitlines() if "PROBLEM" in line]
    assert len(problems) == 1, captured.out
    assert f"role {app_role} lacks SELECT, DELETE on table objects (it has INSERT, UPDATE)" in problems[0], captured.out
    assert "a missing grant" in problems[0]
    assert "Traceback" not in captured.out
    code = cli.main(["check", "--db", _url(pg_dsn, app_role), "--schema", pg_schema, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and len(report["blocking"]) == 1, report
    assert f"role {app_role} lacks SELECT, DELETE on table objects" in report["blocking"][0]
    assert _count(pg_dsn, pg_schema, "objects") == objects


@pytest.mark.parametrize(
    "case",
    [
        # No privilege at all: information_schema would not list the table, and the check would skip it.
        ("ALL", "operations", "SELECT, INSERT, UPDATE, DELETE on table operations (it has none of these)"),
        ("ALL", "outbox", "SELECT, INSERT, UPDATE, DELETE on table outbox (it has none of these)"),
        ("SELECT", "operation_identities", "SELECT, DELETE on table operation_identities (it has INSERT, UPDATE)"),
        ("SELECT", "object_revisions", "SELECT, DELETE on table object_revisions (it has INSERT, UPDATE)"),
    ],
)
def test_the_deployment_check_reports_a_table_it_may_not_read_as_permission_denied(
    pg_dsn: str, pg_schema: str, app_role: str, capsys: pytest.CaptureFixture[str], case: tuple[str, str, str]
) -> None:
    revoke, table, lacks = case
    command = ["check", "--db", _url(pg_dsn, app_role), "--schema", pg_schema, "--json"]
    assert cli.main(command) == 0, capsys.readouterr()
    granted = json.loads(capsys.readouterr().out)
    assert granted["blocking"] == [] and granted["outbox"] is not None, granted
    _as_owner(pg_dsn, f"REVOKE {revoke} ON {pg_schema}.{table} FROM {app_role}")
    code = cli.main(command)
    captured = capsys.readouterr()
    assert code == 1 and captured.err == "", captured
    report = json.loads(captured.out)
    assert len(report["blocking"]) == 1, report
    assert f"role {app_role} lacks {lacks}: a missing grant" in report["blocking"][0], report
