"""docs/operating-postgres.md's own worker program, run as written against a fresh schema.

The page's loop runs until the process is stopped; here its idle wait
(``store.wait_for_work``) ends the loop the first time it is reached, once
the queue is drained.  The page names the schema ``fencekeeper``; the
store is opened in the test's own schema instead.  The rest is the page's
code, and the execution it finds must have run to its end.

The page's two roles are made as it writes them (in a schema and with role
names of the test's own), and the application's role, with only the grants
the page gives it, runs a workflow execution to its end through a
reconciliation and writes a journal: a grant the page leaves out fails it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import fencekeeper
from fencekeeper.adapters import examples, postgres_store
from tests.cli.runner import EXAMPLES, ok
from tests.conftest import drop_role

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operating-postgres.md"
PURCHASE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "purchase_approval.toml"


class Idle(Exception):
    """The page's worker reached its idle wait: the queue was drained."""


def test_the_pages_worker_program_drains_its_business(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    block = "\n".join(line.removeprefix("  ") for line in block.splitlines())  # the block sits in a list item
    policy = examples.grants("acme", "user:operator")
    client = fencekeeper.connect(
        f"{pg_dsn}?schema={pg_schema}", policy=policy, handler=examples.handler(), business="acme",
        principal="user:operator",
    )  # fmt: skip
    try:
        admitted = client.run(PURCHASE, {"amount": 50, "order_id": "o-1", "order_revision": 1}, execution_id="po-1")
        assert admitted.state is fencekeeper.ExecutionState.ELIGIBLE

        page_store = postgres_store.PostgresStore

        def in_this_schema(dsn: str, **options: Any) -> postgres_store.PostgresStore:
            return page_store(dsn, **(options | {"schema": pg_schema}))

        def idle(self: postgres_store.PostgresStore, timeout: float) -> bool:
            assert timeout == 5.0
            raise Idle

        monkeypatch.setattr(postgres_store, "PostgresStore", in_this_schema)
        monkeypatch.setattr(page_store, "wait_for_work", idle)
        namespace: dict[str, Any] = {"dsn": pg_dsn, "policy": policy, "handler": examples.handler()}
        with pytest.raises(Idle):
            exec(compile(block, str(PAGE), "exec"), namespace)  # the page's own code, as a reader runs it
        namespace["store"].close()
        assert namespace["report"].claimed == []  # the pass that found nothing led to the wait
        assert client.get("po-1").state is fencekeeper.ExecutionState.SUCCEEDED
    finally:
        client.close()


def test_the_migrations_the_page_says_a_new_schema_gets_are_this_fencekeepers() -> None:
    text = " ".join(PAGE.read_text(encoding="utf-8").split())  # the list wraps across lines
    found = re.search(r"on a new schema, `applied migrations \[([0-9, ]+)\]`", text)
    assert found is not None
    assert [int(n) for n in found.group(1).split(",")] == [number for number, _, _ in postgres_store.MIGRATIONS]


@pytest.fixture
def page_roles(pg_dsn: str) -> Iterator[tuple[str, str, str]]:
    """The page's owner and application roles and their schema, named for this test; dropped afterwards."""
    tag = uuid.uuid4().hex[:10]
    owner, app, schema = f"fk_owner_{tag}", f"fk_app_{tag}", f"fk_page_{tag}"
    try:
        yield owner, app, schema
    finally:
        for role in (app, owner):  # the owner's DROP OWNED drops the schema
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                known = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if known is not None:
                drop_role(pg_dsn, role)


def _as(pg_dsn: str, role: str, schema: str) -> str:
    params = conninfo_to_dict(pg_dsn)
    return f"postgresql://{role}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{params['dbname']}?schema={schema}"


def test_the_application_role_the_page_grants_runs_executions_and_journals(
    pg_dsn: str, page_roles: tuple[str, str, str], tmp_path: Path
) -> None:
    owner, app, schema = page_roles
    block = next(b for b in re.findall(r"```sql\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S) if "ROLE fk_app" in b)
    sql = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--"))
    sql = re.sub(r"\bfk_owner\b", owner, re.sub(r"\bfk_app\b", app, re.sub(r"\bfencekeeper\b", schema, sql)))
    statements = [s.strip() for s in sql.split(";") if s.strip()]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)  # type: ignore[arg-type]
            if statement.startswith("CREATE SCHEMA"):  # "Now, as fk_owner: fencekeeper migrate"
                ok("migrate", "--db", _as(pg_dsn, owner, schema), cwd=tmp_path)

    db = _as(pg_dsn, app, schema)
    refund = '{"amount": 40, "payment_id": "p-7"}'
    ok("run", EXAMPLES / "refund_needs_reconciliation.toml", "--db", db, "--input", refund, "--id", "rf-1", cwd=tmp_path)
    ok("worker", "--db", db, "--until-idle", cwd=tmp_path)
    ok("reconcile", "--db", db, "rf-1", "--settle", cwd=tmp_path)
    ok("reconcile", "--db", db, "rf-1", "--resume-at", "refunded", "--because", "applied", cwd=tmp_path)
    ok("worker", "--db", db, "--until-idle", cwd=tmp_path)
    [listed] = json.loads(ok("list", "--db", db, "--json", cwd=tmp_path).stdout)
    assert listed["state"] == "succeeded"
    ok("check", "--db", db, cwd=tmp_path)
    journal = EXAMPLES / "journal"
    ok(
        "journal", "new", "review-1", "--db", db, "--workflow", journal / "review.workflow.json",
        "--policy", journal / "review.policy.json", "--as", "carol", "--head-file", tmp_path / "review-1.head",
        cwd=tmp_path,
    )  # fmt: skip
    ok("journal", "append", "review-1", "--db", db, "--file", journal / "review-1.jsonl",
       "--head-file", tmp_path / "review-1.head", cwd=tmp_path)  # fmt: skip
