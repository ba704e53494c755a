"""The command line on PostgreSQL: run, worker, inspect and check against a migrated schema; never an implicit migration.

Uses the ``pg_dsn`` and ``pg_schema`` fixtures of tests/conftest.py (skipped
with one reason where no server is reachable, unless FENCEKEEPER_REQUIRE_PG
is set).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from fencekeeper.adapters import postgres_store
from tests.cli.runner import EXAMPLES, assert_one_error_line, data, fencekeeper, ok


@pytest.fixture
def unmigrated(pg_dsn: str) -> Iterator[str]:
    """A schema name nobody has migrated; dropped afterwards in case anything created it."""
    schema = f"fk_cli_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def _schema_exists(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,))
        return found.fetchone() is not None


def test_run_worker_inspect_and_check_on_postgres(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    order = '{"amount": 50, "order_id": "o-1", "order_revision": 1}'
    admitted = ok("run", EXAMPLES / "purchase_approval.toml", "--db", url, "--input", order, "--id", "pg-1", cwd=tmp_path)
    assert admitted.stdout == "pg-1\n"
    summary = data("worker", "--db", pg_dsn, "--schema", pg_schema, "--until-idle", "--concurrency", "2", cwd=tmp_path)
    assert summary["claimed"] == 1 and summary["finished"] == {"succeeded": 1}
    view = data("inspect", "pg-1", "--db", url, cwd=tmp_path)
    assert view["execution"]["state"] == "succeeded"
    assert [r["event"] for r in view["history"]] == [
        None, "claim", "record_step", "record_step", "finalize_succeeded",
    ]  # fmt: skip
    assert "finalize_succeeded: running -> succeeded" in ok("inspect", "pg-1", "--db", url, cwd=tmp_path).stdout
    report = data("check", "--db", url, cwd=tmp_path)
    assert report["ok"] is True and report["store"] == "postgresql"
    assert report["schema_version"] == report["code_version"]
    assert report["definitions"] == 1 and report["executions"] == {"succeeded": 1}
    assert any("clock_timestamp()" in note for note in report["notes"])
    assert "password" not in report["location"]


def test_an_unmigrated_schema_blocks_and_is_never_created(pg_dsn: str, unmigrated: str, tmp_path: Path) -> None:
    url = f"{pg_dsn}?schema={unmigrated}"
    blocked = fencekeeper("check", "--db", url, "--json", cwd=tmp_path)
    assert blocked.returncode == 1
    report = json.loads(blocked.stdout)
    assert report["ok"] is False and "has no fencekeeper tables" in report["problems"][0]
    order = '{"amount": 50, "order_id": "o-1", "order_revision": 1}'
    refused = fencekeeper("run", EXAMPLES / "purchase_approval.toml", "--db", url, "--input", order, cwd=tmp_path)
    assert "schema_missing" in assert_one_error_line(refused, code=1)
    assert not _schema_exists(pg_dsn, unmigrated)
    migrated = data("migrate", "--db", url, cwd=tmp_path)
    assert migrated["applied"] == [n for n, _, _ in postgres_store.MIGRATIONS]
    assert data("check", "--db", url, cwd=tmp_path)["ok"] is True


def test_check_reports_an_execution_state_edited_by_hand_on_postgres(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    order = '{"amount": 50, "order_id": "o-1", "order_revision": 1}'
    ok("run", EXAMPLES / "purchase_approval.toml", "--db", url, "--input", order, "--id", "pg-1", cwd=tmp_path)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {pg_schema}.objects SET state = 'bogus' WHERE object_id = 'pg-1'")
    result = fencekeeper("check", "--db", url, "--json", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (1, ""), result.stderr
    report = json.loads(result.stdout)
    assert report["executions"] == {"bogus": 1}
    assert any("1 in state 'bogus'" in problem for problem in report["problems"])


def test_an_execution_id_error_does_not_show_the_password_of_db(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    """The store is named as check names it (Location.describe): never with the DSN's password."""
    parts = urlsplit(pg_dsn)
    password = parts.password
    if password is None:
        # A server that asks for no password (as the suite's does) ignores one given.
        password = "not-to-be-shown"
        user = parts.username or "postgres"
        parts = parts._replace(netloc=f"{user}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else ""))
    url = f"{urlunsplit(parts)}?schema={pg_schema}"
    ok("migrate", "--db", url, cwd=tmp_path)
    for args in (["inspect", "nope"], ["cancel", "nope"], ["reconcile", "nope"], ["decide", "nope", "--approve", "--as", "user:m"]):
        line = assert_one_error_line(fencekeeper(*args, "--db", url, cwd=tmp_path), code=2)
        assert line.startswith("fencekeeper: error: EXECUTION_ID: no execution 'nope' in "), line
        assert password not in line and f"schema {pg_schema}" in line, line
    for args in (["journal", "show", "nope"], ["journal", "verify", "nope"], ["journal", "replay", "nope"]):
        line = assert_one_error_line(fencekeeper(*args, "--db", url, cwd=tmp_path), code=2)
        assert "no journal 'nope' in " in line and password not in line, line
