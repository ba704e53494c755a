"""Shared fixtures: where the committed files are, and a PostgreSQL schema per test where a server is reachable."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import psycopg
import pytest

from fencekeeper.adapters.postgres_store import _PostgresBackend, migrate

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs" / "machines"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


# --- PostgreSQL ---------------------------------------------------------------------------
#
# The PostgreSQL tests need a server.  Where none is reachable they are
# skipped with one clear reason, unless FENCEKEEPER_REQUIRE_PG is set (CI sets
# it), in which case an unreachable server fails the run.

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def pg_dsn_from_env() -> str:
    return os.environ.get("FENCEKEEPER_PG_DSN", DEFAULT_PG_DSN)


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    dsn = pg_dsn_from_env()
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        if os.environ.get("FENCEKEEPER_REQUIRE_PG"):
            pytest.fail(f"FENCEKEEPER_REQUIRE_PG is set but PostgreSQL is unreachable at {dsn}: {reason}")
        pytest.skip(
            f"PostgreSQL unreachable at {dsn}; start a server or set FENCEKEEPER_PG_DSN "
            "(set FENCEKEEPER_REQUIRE_PG=1 to make this a failure)"
        )
    return dsn


@pytest.fixture
def pg_schema(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, migrated schema for one test, dropped afterwards.

    Every view the store makes from writes it keeps for a later exchange,
    instead of reading it, is checked against the one the database then
    reads (``verify_views``): every PostgreSQL test of a composed decision
    checks it.  Tests that count round trips turn it off.
    """
    monkeypatch.setattr(_PostgresBackend, "verify_views", True)
    schema = f"fk_test_{uuid.uuid4().hex[:12]}"
    migrate(pg_dsn, schema)
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


@contextlib.contextmanager
def granted_role(pg_dsn: str, schema: str, tables: Iterable[str], privileges: str) -> Iterator[str]:
    """A login role the tenant policies bind, with ``privileges`` on ``tables`` and what opening a store needs.

    USAGE on the schema and SELECT on schema_migrations, as
    docs/operating-postgres.md grants an application's role; dropped
    afterwards (:func:`drop_role`).
    """
    role = f"fk_app_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS")  # type: ignore[arg-type]
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")  # type: ignore[arg-type]
        conn.execute(f"GRANT SELECT ON {schema}.schema_migrations TO {role}")  # type: ignore[arg-type]
        for table in tables:
            conn.execute(f"GRANT {privileges} ON {schema}.{table} TO {role}")  # type: ignore[arg-type]
    try:
        yield role
    finally:
        drop_role(pg_dsn, role)


def drop_role(pg_dsn: str, role: str) -> None:
    """End a test role's sessions (a failed assertion may leave one open), then drop its grants and the role."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
        conn.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
        conn.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]
