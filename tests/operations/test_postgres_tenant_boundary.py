"""The PostgreSQL tenant boundary (seed 001, Required production profile): forced row-level security by tenant.

A restricted application role, created for this test run only (roles are
cluster-wide: a unique name, dropped afterwards), connects with tenant A set
and tries, with hand-written SQL, to read and write tenant B's rows.  Every
attempt must see nothing or be refused, and B's rows must be exactly as they
were.  The store's own connection path, scoped to a tenant, must still work
as that role.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableOperationService, PrincipalReference
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.postgres_store import MIGRATIONS, migrate
from fencekeeper.adapters.store import StoreError
from tests.conftest import drop_role, granted_role

TABLES = ("operations", "operation_identities", "operation_attempts", "operation_transitions", "outbox")
# How each child table names its Operation.
CHILDREN = {"operation_attempts": "operation_id", "operation_transitions": "operation_id", "outbox": "subject_id"}
ALICE = PrincipalReference("users", 1, "alice")


@pytest.fixture
def restricted_role(pg_dsn: str, pg_schema: str) -> Iterator[str]:
    """A login role with the grants docs/operating-postgres.md shows, and nothing else; dropped after the test."""
    with granted_role(pg_dsn, pg_schema, TABLES, "SELECT, INSERT, UPDATE") as role:
        yield role


def _service(store: PostgresOperationStore) -> DurableOperationService:
    return DurableOperationService(store, examples.registry(), examples.resolvers())


def _seed(pg_dsn: str, schema: str) -> dict[str, str]:
    """In each of tenants a and b, one Operation run to its end and one still open, written by the owner.

    The owner here is a superuser, which the policies do not bind: what an
    operator's role sees.  The ended one brings Attempt and outbox rows.
    """
    store = PostgresOperationStore(pg_dsn, schema=schema, pool_size=1)
    try:
        examples.prepare(store)
        service = _service(store)
        ids = {}
        for tenant in ("a", "b"):
            for suffix in ("", "_open"):
                admission = service.submit(
                    tenant=tenant, principal=ALICE, action="balance", input={"account": "acc-1"},
                    client_key=f"k-{tenant}{suffix}",
                )
                ids[tenant + suffix] = admission.operation_id
            worker = DurableOperationWorker(
                store, service.actions, service.resolvers, tenant=tenant, worker_id=f"w-{tenant}", lease=timedelta(seconds=30)
            )
            report = worker.run_once()
            assert report is not None and report.outcome == "succeeded", report
        return ids
    finally:
        store.close()


def _snapshot(pg_dsn: str, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        return {table: sorted(map(tuple, conn.execute(f"SELECT * FROM {table}").fetchall()), key=repr) for table in TABLES}  # type: ignore[arg-type]


def _as(pg_dsn: str, role: str, schema: str, tenant: str | None) -> psycopg.Connection[Any]:
    options = f"-c search_path={schema}" + (f" -c fencekeeper.tenant={tenant}" if tenant is not None else "")
    return psycopg.connect(make_conninfo(pg_dsn, user=role, options=options), autocommit=True)


def test_the_restricted_role_cannot_read_or_write_another_tenants_rows(
    pg_dsn: str, pg_schema: str, restricted_role: str
) -> None:
    ids = _seed(pg_dsn, pg_schema)
    before = _snapshot(pg_dsn, pg_schema)
    # Each table holds rows of both tenants, so an empty answer below is the policy, not an empty table.
    assert all(before[table] for table in ("operations", "operation_identities", "operation_transitions", "outbox"))
    with _as(pg_dsn, restricted_role, pg_schema, "a") as conn:
        # Reading: only tenant a's rows exist, however the question is put.
        assert sorted(r[0] for r in conn.execute("SELECT operation_id FROM operations")) == sorted([ids["a"], ids["a_open"]])
        assert conn.execute("SELECT count(*) FROM operations WHERE tenant = 'b'").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM operation_identities WHERE tenant = 'b'").fetchone() == (0,)
        for table, key in CHILDREN.items():
            rows = conn.execute(f"SELECT count(*) FROM {table} WHERE {key} = %s", (ids["b"],)).fetchone()  # type: ignore[arg-type]
            assert rows == (0,), table
        for table, key in CHILDREN.items():
            rows = conn.execute(f"SELECT count(*) FROM {table} WHERE {key} = %s", (ids["a"],)).fetchone()  # type: ignore[arg-type]
            assert rows is not None and rows[0] >= 1, table
        # Updating tenant b's rows touches none of them.
        assert conn.execute("UPDATE operations SET state = 'canceled' WHERE tenant = 'b'").rowcount == 0
        assert conn.execute("UPDATE operation_identities SET retain_until = now() WHERE tenant = 'b'").rowcount == 0
        assert conn.execute("UPDATE operation_attempts SET state = 'x' WHERE operation_id = %s", (ids["b"],)).rowcount == 0
        # Moving one of its own rows into tenant b, or writing a row of tenant b, is refused.
        refusals = [
            ("UPDATE operations SET tenant = 'b' WHERE operation_id = %s", (ids["a"],)),
            ("UPDATE operation_identities SET tenant = 'b' WHERE operation_id = %s", (ids["a"],)),
            (
                "INSERT INTO operations SELECT * FROM (SELECT 'op-forged' AS operation_id, namespace, 'b' AS tenant, "
                "principal, client_key, action_name, action_version, effect_class, input_digest, input, state, revision, "
                "fence, attempt_count, policy, admitted_at, deadline, retain_until, next_eligible_at, requires_approval, "
                "approval, owner, lease_expires_at, attempt_started_at, effect_id, outcome, error_code, result, "
                "cancel_requested_by, due_at FROM operations WHERE operation_id = %s) AS forged",
                (ids["a"],),
            ),
            (
                "INSERT INTO operation_identities VALUES ('default', 'b', 'users:v1:mallory', 'k', %s, now())",
                (ids["a"],),
            ),
            (
                "INSERT INTO operation_transitions (operation_id, revision, to_state, at, actor, fence, reason) "
                "VALUES (%s, 99, 'canceled', now(), 'mallory', 0, 'forged')",
                (ids["b"],),
            ),
            (
                "INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload) "
                "VALUES ('m-forged', 'operation', %s, 'b', 't', now(), '{}')",
                (ids["b"],),
            ),
            (
                "INSERT INTO operation_attempts VALUES (%s, 1, 'w', 'running', now(), NULL, NULL)",
                (ids["b"],),
            ),
        ]
        for sql, params in refusals:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql, params)  # type: ignore[arg-type]
        # No DELETE is granted at all.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM operations WHERE tenant = 'b'")
    with _as(pg_dsn, restricted_role, pg_schema, None) as conn:
        # No tenant set: the boundary fails closed.
        for table in TABLES:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,), table  # type: ignore[arg-type]
    assert _snapshot(pg_dsn, pg_schema) == before


def test_the_store_works_as_the_restricted_role_within_its_tenant(
    pg_dsn: str, pg_schema: str, restricted_role: str
) -> None:
    ids = _seed(pg_dsn, pg_schema)
    as_role = make_conninfo(pg_dsn, user=restricted_role)
    # Bound to tenant a for the session, as a tenant-scoped worker opens it.
    store = PostgresOperationStore(as_role, schema=pg_schema, pool_size=1, tenant="a")
    try:
        service = _service(store)
        admission = service.submit(
            tenant="a", principal=ALICE, action="balance", input={"account": "acc-2"}, client_key="k-new"
        )
        assert admission.created
        record = service.get(admission.operation_id)
        assert record is not None and record.tenant == "a"
        assert len(service.history(admission.operation_id)) == 1
        assert service.get(ids["a"]) is not None
        # Tenant b's Operation does not exist for this store, and submitting into b is refused by the policy.
        assert service.get(ids["b"]) is None
        with pytest.raises(StoreError) as denied:
            service.submit(tenant="b", principal=ALICE, action="balance", input={"account": "acc-1"}, client_key="k-x")
        assert denied.value.code == "tenant_denied"
        with pytest.raises(StoreError) as refused:
            store.tenant_scope("b").__enter__()
        assert refused.value.code == "tenant_scope"
    finally:
        store.close()
    # Unbound, with a scope per request, as the HTTP boundary opens it.
    store = PostgresOperationStore(as_role, schema=pg_schema, pool_size=1)
    try:
        service = _service(store)
        assert service.get(ids["a"]) is None  # no scope: nothing is visible
        with store.tenant_scope("b"):
            assert service.get(ids["b"]) is not None
            assert service.get(ids["a"]) is None
        with store.tenant_scope("a"):
            record = service.cancel(ids["a_open"], principal=ALICE, reason="done")
            assert record.state.value == "cancelled"
        # The scope ended with its transaction: the pooled connection carries no tenant into the next one.
        assert service.get(ids["a"]) is None
    finally:
        store.close()


def test_the_owner_role_migrates_a_schema_an_administrator_created_for_it(pg_dsn: str) -> None:
    """docs/operating-postgres.md's operator role: it owns the schema, and has no CREATE on the database.

    An administrator runs ``CREATE SCHEMA ... AUTHORIZATION fk_owner``; the
    owner then runs ``fencekeeper migrate``.  PostgreSQL checks the database's
    CREATE privilege before it looks whether a schema exists, so migrate must
    not ask to create one that is already there.
    """
    suffix = uuid.uuid4().hex[:12]
    role, schema = f"fk_owner_{suffix}", f"fk_test_{suffix}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN BYPASSRLS")  # type: ignore[arg-type]
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {role}")  # type: ignore[arg-type]
    try:
        owner = make_conninfo(pg_dsn, user=role)
        assert migrate(owner, schema) == [number for number, _, _ in MIGRATIONS]
        assert migrate(owner, schema) == []
        store = PostgresOperationStore(owner, schema=schema, pool_size=1)
        try:
            admitted = _service(store).submit(
                tenant="a", principal=ALICE, action="balance", input={"account": "acc-1"}, client_key="k-1"
            )
            assert admitted.created
        finally:
            store.close()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            # Its sessions first: one left open would hold the schema's locks.
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
        drop_role(pg_dsn, role)


def _accounts(pg_dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_dsn) as conn:
        return [tuple(r) for r in conn.execute(f"SELECT * FROM {schema}.app_accounts ORDER BY account_id")]  # type: ignore[arg-type]


def test_a_missing_grant_is_permission_denied_and_a_crossing_stays_tenant_denied(
    pg_dsn: str, pg_schema: str, restricted_role: str
) -> None:
    """Both are SQLSTATE 42501; only the policies' refusal is the tenant boundary's."""
    _seed(pg_dsn, pg_schema)  # the owner made the application's tables, as prepare() does
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"GRANT SELECT ON {pg_schema}.app_accounts TO {restricted_role}")  # type: ignore[arg-type]
    before, accounts = _snapshot(pg_dsn, pg_schema), _accounts(pg_dsn, pg_schema)
    store = PostgresOperationStore(make_conninfo(pg_dsn, user=restricted_role), schema=pg_schema, pool_size=1, tenant="a")
    try:
        # The grant it has works: the refusals below are about the grants it lacks.
        assert store.application_execute("SELECT balance FROM app_accounts WHERE account_id = ?", ("acc-1",)) == [(10_000,)]
        with pytest.raises(StoreError) as insert:
            store.application_execute("INSERT INTO app_accounts (account_id, balance) VALUES (?, ?)", ("acc-9", 5))
        assert insert.value.code == "permission_denied"
        assert f"role {restricted_role} lacks INSERT, UPDATE, DELETE on table app_accounts (it has SELECT)" in insert.value.message
        assert "not the tenant boundary" in insert.value.message
        # An actions module's prepare creates tables: the schema's CREATE is the owner's.
        with pytest.raises(StoreError) as create:
            examples.prepare(store)
        assert create.value.code == "permission_denied"
        assert f"role {restricted_role} lacks CREATE on schema {pg_schema} (it has USAGE)" in create.value.message
        # An atomic action's statement without its grant: the attempt fails, and none of its writes commit.
        service = _service(store)
        admission = service.submit(
            tenant="a", principal=ALICE, action="transfer", input={"from": "acc-1", "to": "acc-2", "amount": 5},
            client_key="k-transfer",
        )
        worker = DurableOperationWorker(store, service.actions, service.resolvers, tenant="a", worker_id="w-a")
        reports = [worker.run_once(), worker.run_once()]  # the seed's open balance check, then the transfer
        report = next(r for r in reports if r is not None and r.operation_id == admission.operation_id)
        assert report.outcome == "retry", report
        assert f"role {restricted_role} lacks" in report.detail and "not the tenant boundary" in report.detail
        record = service.get(admission.operation_id)
        assert record is not None and [a.error_code for a in record.attempts] == ["handler_error"]
        # A write into another tenant, through the same store, is still the tenant boundary's refusal.
        with pytest.raises(StoreError) as crossing:
            service.submit(tenant="b", principal=ALICE, action="balance", input={"account": "acc-1"}, client_key="k-b")
        assert crossing.value.code == "tenant_denied"
        assert "row-level security" in crossing.value.message and "nothing was written" in crossing.value.message
    finally:
        store.close()
    assert _accounts(pg_dsn, pg_schema) == accounts
    with psycopg.connect(pg_dsn) as conn:
        created = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_name LIKE 'app%%' "
            "ORDER BY table_name",
            (pg_schema,),
        ).fetchall()
    assert created == [("app_accounts",), ("app_transfers",)]
    after = _snapshot(pg_dsn, pg_schema)
    # What the tenant's own submission and failed attempt wrote to the store's tables, and nothing of tenant b.
    assert all(row[2] != "b" for row in after["operations"] if row not in before["operations"])


def test_a_missing_read_grant_is_permission_denied_when_opening_and_reading(
    pg_dsn: str, pg_schema: str, restricted_role: str
) -> None:
    as_role = make_conninfo(pg_dsn, user=restricted_role)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"REVOKE SELECT ON {pg_schema}.outbox FROM {restricted_role}")  # type: ignore[arg-type]
    store = PostgresOperationStore(as_role, schema=pg_schema, pool_size=1, tenant="a")
    try:
        with pytest.raises(StoreError) as reading:
            store.outbox()
        assert reading.value.code == "permission_denied"
        assert f"role {restricted_role} lacks SELECT, DELETE on table outbox (it has INSERT, UPDATE)" in reading.value.message
    finally:
        store.close()
    # Opening reads schema_migrations.  (Without any privilege on it at all, the same: the check looks for
    # it in the catalogs, which list it to every role; tests/postgres/test_postgres_permissions.py.)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"REVOKE SELECT ON {pg_schema}.schema_migrations FROM {restricted_role}")  # type: ignore[arg-type]
        conn.execute(f"GRANT UPDATE ON {pg_schema}.schema_migrations TO {restricted_role}")  # type: ignore[arg-type]
    with pytest.raises(StoreError) as opening:
        PostgresOperationStore(as_role, schema=pg_schema, pool_size=1, tenant="a")
    assert opening.value.code == "permission_denied"
    assert f"role {restricted_role} lacks SELECT, INSERT, DELETE on table schema_migrations (it has UPDATE)" in (
        opening.value.message
    )


def test_op_worker_as_a_role_that_may_not_create_tables_exits_1_with_permission_denied(
    pg_dsn: str, pg_schema: str, restricted_role: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/operations.md: the default actions module's prepare creates tables, which the restricted role may not."""
    from fencekeeper.adapters import cli  # noqa: PLC0415

    params = conninfo_to_dict(pg_dsn)
    url = f"postgresql://{restricted_role}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{params['dbname']}"
    before = _snapshot(pg_dsn, pg_schema)
    code = cli.main(["op", "worker", "--db", url, "--schema", pg_schema, "--tenant", "a", "--until-idle"])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("fencekeeper: error: "), err
    assert lines[0].endswith("[permission_denied]") and f"lacks CREATE on schema {pg_schema}" in lines[0]
    assert _snapshot(pg_dsn, pg_schema) == before
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"{pg_schema}.app_accounts",)).fetchone() == (None,)
