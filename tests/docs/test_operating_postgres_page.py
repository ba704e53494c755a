"""docs/operating-postgres.md's own worker program, run as written against a fresh schema.

The page's loop runs until the process is stopped; here its idle wait
(``store.wait_for_work``) ends the loop the first time it is reached, once
the queue is drained.  The page names the schema ``fencekeeper``; the
store is opened in the test's own schema instead.  The rest is the page's
code, and the execution it finds must have run to its end.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import fencekeeper
from fencekeeper.adapters import examples, postgres_store

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
