"""A connection lost while a store opens, or while ``op worker`` prepares, is ridden out as it is inside the loop.

An administrator ending a backend (``pg_terminate_backend``, a failover) at
the moment a worker starts says nothing about the store: the same loss a
moment later is waited out by the worker's loop (``StorePatience``).  Before,
a worker started into it exited 2, as if its ``--db`` named no usable store.
A store that cannot be reached at all is still reported at once.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters import cli, cli_ops, journal_postgres, postgres_store
from fencekeeper.adapters.operations import postgres as ops_postgres
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.store import StoreError

TERMINATED = "terminating connection due to administrator command"


def _lost_first(real: Callable[..., Any], times: int, calls: list[int]) -> Callable[..., Any]:
    """``real``, raising a lost connection on its first ``times`` calls."""

    def check(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:
            raise psycopg.OperationalError(TERMINATED)
        return real(*args, **kwargs)

    return check


def test_an_operation_store_opens_through_a_connection_lost_during_its_check(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(ops_postgres, "check_schema", _lost_first(ops_postgres.check_schema, 2, calls))
    store = open_operation_store(pg_dsn, schema=pg_schema, create=False)
    store.close()
    assert len(calls) == 3


def test_an_operation_store_lost_on_every_check_is_unavailable(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(ops_postgres, "check_schema", _lost_first(ops_postgres.check_schema, 99, calls))
    with pytest.raises(StoreError) as raised:
        open_operation_store(pg_dsn, schema=pg_schema, create=False)
    assert raised.value.code == "store_unavailable" and TERMINATED in raised.value.message
    assert len(calls) == 3


def test_an_execution_store_opens_through_a_connection_lost_during_its_check(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(postgres_store, "check_schema_with", _lost_first(postgres_store.check_schema_with, 2, calls))
    postgres_store.PostgresStore(pg_dsn, schema=pg_schema).close()
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(postgres_store, "check_schema_with", _lost_first(postgres_store.check_schema_with, 99, calls))
    with pytest.raises(StoreError) as raised:
        postgres_store.PostgresStore(pg_dsn, schema=pg_schema)
    assert raised.value.code == "store_unavailable" and len(calls) == 3


def test_a_server_that_cannot_be_reached_is_reported_at_once() -> None:
    # Nothing listens on port 1: connecting fails, which is no lost connection to wait out.
    with pytest.raises(StoreError) as raised:
        open_operation_store("postgresql://postgres@127.0.0.1:1/test", schema="fk_nowhere", create=False)
    assert raised.value.code == "store_unavailable" and "cannot connect" in raised.value.message


def _failing_prepare(codes: list[str]) -> tuple[Callable[[Any], None], list[int]]:
    calls: list[int] = []

    def prepare(store: Any) -> None:
        calls.append(1)
        if len(calls) <= len(codes):
            raise StoreError(codes[len(calls) - 1], f"PostgreSQL connection failed: {TERMINATED}")

    return prepare, calls


class _Stop:
    """What ``_prepare_patiently`` asks of the worker pool: whether a stop was asked, and a wait a stop cuts short."""

    def __init__(self, *, asked: bool = False) -> None:
        self.event = threading.Event()
        if asked:
            self.event.set()

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    def wait_for_stop(self, seconds: float) -> bool:
        return self.event.wait(seconds)


def test_prepare_is_tried_again_after_a_lost_connection() -> None:
    prepare, calls = _failing_prepare(["store_unavailable", "store_unavailable"])
    cli_ops._prepare_patiently(prepare, object(), _Stop())  # type: ignore[arg-type]
    assert len(calls) == 3


def test_prepare_failing_otherwise_or_while_stopping_is_not_tried_again() -> None:
    prepare, calls = _failing_prepare(["schema_missing"])
    with pytest.raises(StoreError, match=TERMINATED):
        cli_ops._prepare_patiently(prepare, object(), _Stop())  # type: ignore[arg-type]
    assert len(calls) == 1
    stopping = _Stop(asked=True)
    prepare, calls = _failing_prepare(["store_unavailable"])
    with pytest.raises(StoreError):
        cli_ops._prepare_patiently(prepare, object(), stopping)  # type: ignore[arg-type]
    assert len(calls) == 1


ACTIONS = '''
from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.store import StoreError

registry = examples.registry
resolvers = examples.resolvers
calls = []


def prepare(store):
    calls.append(1)
    if len(calls) == 1:
        raise StoreError("store_unavailable", "PostgreSQL connection failed: terminating connection due to administrator command")
    examples.prepare(store)
'''


def test_op_worker_started_into_a_lost_connection_keeps_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"lost_actions_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(ACTIONS, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    db = str(tmp_path / "ops.db")
    transfer = '{"from": "acc-1", "to": "acc-2", "amount": 5}'
    assert cli.main(["op", "submit", "transfer", "--db", db, "--key", "k-1", "--input", transfer, "--actions", name]) == 0
    capsys.readouterr()
    code = cli.main(["op", "worker", "--until-idle", "--db", db, "--actions", name, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sys.modules[name].calls == [1, 1]


def test_a_journal_store_opens_through_its_backend_ended_before_its_check(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real loss, not a raised error: the backend of the store's one connection is ended from outside,
    # as pg_terminate_backend ends it, and the check then fails on it; the store opens on a new one.
    real = journal_postgres.check_schema
    ended: list[int] = []

    def check(conn: psycopg.Connection[Any], schema: str) -> None:
        if not ended:
            ended.append(conn.info.backend_pid)
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        real(conn, schema)

    monkeypatch.setattr(journal_postgres, "check_schema", check)
    store = journal_postgres.PostgresJournalStore(pg_dsn, schema=pg_schema)
    try:
        assert ended and store._conn.info.backend_pid != ended[0]
    finally:
        store.close()
