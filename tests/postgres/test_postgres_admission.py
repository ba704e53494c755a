"""An admission's writes travel with its COMMIT on PostgreSQL: what that must not change.

``service.run`` is one transaction of two round trips: ``BEGIN`` with the
statement that reads the admission's facts, then the decision's one write
statement, ``NOTIFY`` and ``COMMIT`` in one pipelined exchange
(``_PostgresBackend.write_last``, ``commit_kept``).  The writes' result is
then only known at the commit, so these tests pin what must hold anyway:

- two admissions of one execution id at once: exactly one execution, the
  other request gets the kernel's ``already_exists`` refusal (decided again
  on what the winner committed), nothing of the loser written;
- a kept write that fails leaves the database exactly as it was, sends no
  notification, and leaves the pooled connection idle and usable, its
  prepared statements in place;
- a connection lost before that exchange is ``store_unavailable``, with
  nothing written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq

from fencekeeper.adapters import examples, postgres_store, service
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.store import Evidence, StoreError, _GuardFailed
from fencekeeper.adapters.testing.concurrency import RendezvousClock, race
from fencekeeper.adapters.testing.roundtrips import TWO_NODE
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition, parse_definition

BUSINESS = "b-1"
PRINCIPAL = "user:operator"
POLICY = examples.grants(BUSINESS, PRINCIPAL)
OPS = p.Authority(True, "ops")


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[PostgresStore]:
    # One connection: the request after a failed one runs on the connection it left.
    s = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    service.register(s, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, POLICY)
    yield s
    s.close()


def _run(store: PostgresStore, execution_id: str, order: str) -> p.Outcome:
    return service.run(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
        input={"order_id": order}, execution_id=execution_id,
    )


def _database(pg_dsn: str, schema: str) -> dict[str, list[str]]:
    """Every row of every table of the schema, as text, sorted: the database as a client cannot see it."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        tables = [
            str(r[0])
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
                (schema,),
            )
        ]
        assert "objects" in tables and "workflow_dispatch" in tables, tables
        return {
            table: sorted(
                str(r[0]) for r in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t')
            )
            for table in tables
        }


def _kept_failures(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """What the kept writes raised at their commit, recorded as they are sent."""
    failures: list[BaseException] = []
    original = postgres_store._PostgresBackend.commit_kept

    def recorded(self: Any, notify: bytes | None, *ahead: Any) -> Any:
        try:
            return original(self, notify, *ahead)
        except BaseException as exc:
            failures.append(exc)
            raise

    monkeypatch.setattr(postgres_store._PostgresBackend, "commit_kept", recorded)
    return failures


def test_two_admissions_of_one_id_at_once_admit_it_once(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = RendezvousClock()
    first = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    second = PostgresStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    failures = _kept_failures(monkeypatch)
    try:
        # Held long enough for a loaded machine: nothing serializes two admissions before their time is read.
        a, b = race(clock, lambda: _run(first, "x-race", "o-a"), lambda: _run(second, "x-race", "o-b"), hold=10.0)
    finally:
        first.close()
        second.close()
    # Both read the facts (no execution yet) before either wrote: both decided to admit.
    assert clock.met
    outcomes = [a.value(), b.value()]
    decisions = [o for o in outcomes if isinstance(o, p.Decision)]
    refusals = [o for o in outcomes if isinstance(o, p.Refusal)]
    assert len(decisions) == 1 and len(refusals) == 1, outcomes
    assert refusals[0].code == p.RefusalCode.ALREADY_EXISTS, refusals[0]
    # The loser's kept writes failed at its commit, as a guard failure, and it was decided again.
    assert len(failures) == 1 and isinstance(failures[0], _GuardFailed), failures
    winner = "o-a" if outcomes[0] is decisions[0] else "o-b"
    assert store.execution_ids() == ["x-race"]
    view = store.read("x-race")
    assert view is not None and view.execution.revision == 1 and len(view.history) == 1
    assert [(e.object_id, e.body["input"]) for e in view.evidence] == [("x-race/input", {"order_id": winner})]


def test_a_kept_write_that_fails_changes_nothing_and_sends_no_notice(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The admission's input evidence id is already another execution's object: the facts
    # (the execution id is free) say admit, and the kept INSERT fails at the commit.
    taken = store.admit(
        p.AdmitRequest("e-other", BUSINESS, "two-node", 1, "ship", OPS), [Evidence("x-1/input", "note", {})]
    )
    assert isinstance(taken, p.Decision), taken
    assert isinstance(_run(store, "x-0", "o-0"), p.Decision)  # its statements prepared on the one connection
    waiter = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        while waiter.wait_for_work(0.1):  # subscribed, earlier notices drained
            pass
        before = _database(pg_dsn, pg_schema)
        failures = _kept_failures(monkeypatch)
        with pytest.raises(StoreError) as raised:
            _run(store, "x-1", "o-1")
        # Decided twice, both times failing on the taken id: today's answer to a conflict
        # the facts cannot see, as when the writes were sent before the commit.
        assert raised.value.code == "guard_conflict", raised.value
        assert len(failures) == 2 and all(isinstance(f, _GuardFailed) for f in failures), failures
        assert _database(pg_dsn, pg_schema) == before
        assert waiter.wait_for_work(0.5) is False
        with store._pool.connection() as conn:
            assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
        prepared = _prepared(store)
        assert isinstance(_run(store, "x-2", "o-2"), p.Decision)
        assert prepared.keys() <= _prepared(store).keys()
        assert waiter.wait_for_work(5.0) is True
    finally:
        waiter.close()
    assert store.execution_ids() == ["e-other", "x-0", "x-2"]


def _prepared(store: PostgresStore) -> dict[str, int]:
    with store._pool.connection() as conn:
        rows = conn.execute("SELECT name, generic_plans + custom_plans FROM pg_prepared_statements").fetchall()
    return {str(name): int(runs) for name, runs in rows}


def test_a_connection_lost_before_the_kept_write_is_store_unavailable(
    pg_dsn: str, pg_schema: str, store: PostgresStore
) -> None:
    assert isinstance(_run(store, "x-0", "o-0"), p.Decision)
    with store._pool.connection() as conn:
        pid = conn.info.backend_pid
    before = _database(pg_dsn, pg_schema)
    definition = store.load_definition(BUSINESS, "two-node")
    assert definition is not None

    def make(killing: Callable[[], None]) -> Callable[[Definition], Any]:
        def build(found: Definition) -> tuple[p.AdmitRequest, list[Evidence]]:
            # Inside the admission's transaction, after its facts were read: the session ends.
            killing()
            request = p.AdmitRequest("x-1", BUSINESS, found.definition_id, found.revision, found.start, OPS)
            return request, [Evidence("x-1/input", "note", {})]

        return build

    def kill() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))

    with pytest.raises(StoreError) as raised:
        store.admit_run("x-1", BUSINESS, "two-node", None, make(kill))
    assert raised.value.code == "store_unavailable", raised.value
    assert _database(pg_dsn, pg_schema) == before
    # The pool replaced the connection; the next admission works.
    assert isinstance(_run(store, "x-2", "o-2"), p.Decision)
    assert store.execution_ids() == ["x-0", "x-2"]
