"""The operation store suite and the service state machine against PostgreSQL (a schema per test)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import pq

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.postgres import PostgresOperationStore, _PgOpsTx
from fencekeeper.adapters.operations.service import (
    ActionFailed,
    DurableAction,
    DurableActionRegistry,
    DurableOperationService,
    PrincipalReference,
)
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.postgres_store import migrate
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import (
    OpsStoreFactory,
    SqlOperationStoreTests,
    World,
    check_an_older_intent_is_reconciled_not_resent,
    check_identities_after_the_migration,
    leave_an_unanswered_and_a_succeeded_capture,
    leave_identities_keyed_by_the_whole_reference,
    open_accounts,
)
from fencekeeper.kernel import operations as o
from fencekeeper.kernel.operations import EffectClass, RetryPolicy


@pytest.fixture(scope="module")
def shared_schema(pg_dsn: str) -> Iterator[str]:
    """One migrated schema for the module; each store made from it starts from emptied tables."""
    schema = f"fk_ops_{uuid.uuid4().hex[:12]}"
    migrate(pg_dsn, schema)
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def factory_for(pg_dsn: str, schema: str) -> OpsStoreFactory:
    def make(clock: object) -> PostgresOperationStore:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
            conn.execute(
                "TRUNCATE outbox, operation_transitions, operation_attempts, operation_identities, "
                "operations"
            )
            conn.execute("DROP TABLE IF EXISTS app_accounts, app_transfers")
        return PostgresOperationStore(pg_dsn, schema=schema, clock=clock, pool_size=2)  # type: ignore[arg-type]

    return make


class TestPostgresOperationStore(SqlOperationStoreTests):
    state_machine_examples = 5

    @pytest.fixture
    def ops_store_factory(self, pg_dsn: str, shared_schema: str) -> OpsStoreFactory:
        return factory_for(pg_dsn, shared_schema)


def test_migration_13_leaves_an_older_intent_unsettled_for_good(pg_dsn: str, pg_schema: str) -> None:
    clock = ManualClock()
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    crashed, succeeded = leave_an_unanswered_and_a_succeeded_capture(World(store, clock))
    store.close()
    # What a schema at version 12 held: intents, and nothing said whether they were answered
    # (and nothing of the migrations after 13).
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        conn.execute("ALTER TABLE operations DROP COLUMN effect_unsettled_since")
        conn.execute("DROP FUNCTION fencekeeper_journal_head_forward CASCADE")
        conn.execute("DELETE FROM schema_migrations WHERE version >= 13")
    assert migrate(pg_dsn, pg_schema) == [13, 14, 15, 16]  # 15 changes rows only, 16 adds only what is missing
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    try:
        check_an_older_intent_is_reconciled_not_resent(World(store, clock), crashed, succeeded)
    finally:
        store.close()


def test_migration_15_keys_identities_by_the_stable_reference_and_loses_nothing(pg_dsn: str, pg_schema: str) -> None:
    clock = ManualClock()
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    before = leave_identities_keyed_by_the_whole_reference(World(store, clock))
    store.close()
    # What a schema at version 14 held: identities keyed by the whole reference, two of them one
    # principal's under two versions of its resolver.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        with conn.transaction():
            for statement in before.statements:
                conn.execute(statement)  # type: ignore[arg-type]
            conn.execute("DELETE FROM schema_migrations WHERE version >= 15")
    assert migrate(pg_dsn, pg_schema) == [15, 16]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        keys = "SELECT client_key, principal, operation_id FROM operation_identities ORDER BY 1, 2"
        migrated = conn.execute(keys).fetchall()
        # Run again (its record lost), it changes nothing.
        conn.execute("DELETE FROM schema_migrations WHERE version >= 15")
        assert migrate(pg_dsn, pg_schema) == [15, 16]
        assert conn.execute(keys).fetchall() == migrated
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, clock=clock, pool_size=1)
    try:
        check_identities_after_the_migration(World(store, clock), before)
    finally:
        store.close()


def test_database_time_decides_without_an_injected_clock(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresOperationStore(pg_dsn, schema=pg_schema)
    try:
        with psycopg.connect(pg_dsn) as conn:
            database_now = conn.execute("SELECT clock_timestamp()").fetchone()
        assert database_now is not None
        assert abs((store.now() - database_now[0]).total_seconds()) < 5
    finally:
        store.close()


def test_a_lease_that_expires_during_the_action_is_judged_by_database_time(pg_dsn: str, shared_schema: str) -> None:
    import time  # noqa: PLC0415
    from datetime import timedelta  # noqa: PLC0415

    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.testing.operations_suite import accounts, open_accounts  # noqa: PLC0415
    from fencekeeper.kernel import operations as o  # noqa: PLC0415

    store = factory_for(pg_dsn, shared_schema)(None)  # emptied tables; no clock: the database's time
    try:
        open_accounts(store, {"acc-1": 100, "acc-2": 0})
        service = examples.registry()
        from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
            DurableOperationService,
            PrincipalReference,
        )

        DurableOperationService(store, service, examples.resolvers()).submit(
            tenant="t", principal=PrincipalReference("users", 1, "alice"), action="transfer",
            input={"from": "acc-1", "to": "acc-2", "amount": 10}, client_key="k",
        )
        claim = store.claim_next("t", "w1", timedelta(milliseconds=400))
        assert isinstance(claim, o.Decision) and claim.credential is not None
        ran: list[int] = []

        def slow(context: object) -> str:
            ran.append(1)
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})  # type: ignore[arg-type]
            time.sleep(0.6)
            return "null"

        outcome = store.complete(o.CompleteRequest(claim.credential, o.Authority(True, "users:v1:alice")), slow)
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.LEASE_EXPIRED
        assert ran == [1], "decided again after the failed write, the kernel refuses before running the action"
        assert accounts(store) == {"acc-1": 100, "acc-2": 0}
    finally:
        store.close()


# --- round trips and the identity's race ----------------------------------------------------------------


def _noop_registry() -> DurableActionRegistry:
    return DurableActionRegistry(
        (DurableAction("noop", 1, EffectClass.ATOMIC, lambda context, value: None, policy=RetryPolicy(maximum_attempts=3)),)
    )


def test_round_trips_per_submission_and_worker_pass(
    pg_dsn: str, shared_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each wait of a connection is one exchange with the server, but the pool's commit of a
    # connection with no transaction open, which sends nothing.
    trips: list[str] = []
    waiting = psycopg.Connection.wait

    def counted(self: psycopg.Connection[Any], gen: Any, *args: Any, **kwargs: Any) -> Any:
        if not (getattr(gen, "__qualname__", "").endswith("_commit_gen")
                and self.pgconn.transaction_status == pq.TransactionStatus.IDLE):
            trips.append(getattr(gen, "__qualname__", "?"))
        return waiting(self, gen, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "wait", counted)
    store = factory_for(pg_dsn, shared_schema)(None)
    try:
        service = DurableOperationService(store, _noop_registry(), examples.resolvers())
        worker = DurableOperationWorker(store, _noop_registry(), examples.resolvers(), tenant="acme", worker_id="w")
        alice = PrincipalReference("users", 1, "alice")
        for n in range(3):  # statements are prepared on their first use: count the steady state
            service.submit(tenant="acme", principal=alice, action="noop", input={"n": n}, client_key=f"warm-{n}")
            assert worker.run_once() is not None
        trips.clear()
        service.submit(tenant="acme", principal=alice, action="noop", input={"n": 9}, client_key="counted")
        submission = len(trips)
        trips.clear()
        report = worker.run_once()
        assert report is not None and report.outcome == "succeeded"
        # BEGIN with the identity's lock, its lookup and the time; the write with COMMIT.
        assert submission == 2, trips
        # The claim (BEGIN with the locking read bringing the time and the input; the write with
        # COMMIT), then the completion (BEGIN with the locking read; the write with COMMIT).
        assert len(trips) == 4, trips
    finally:
        store.close()


def test_a_submission_that_waited_for_the_identity_finds_the_first_one(
    pg_dsn: str, shared_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity's lookup reads a snapshot from before its lock was granted; the guard catches that."""
    store = factory_for(pg_dsn, shared_schema)(None)
    service = DurableOperationService(store, _noop_registry(), examples.resolvers())
    alice = PrincipalReference("users", 1, "alice")
    first_decided = threading.Event()
    release = threading.Event()
    written: dict[str, list[bool]] = {"first": [], "second": []}
    write = _PgOpsTx.write

    def held(self: _PgOpsTx, decision: Any, input_json: str | None) -> bool:
        if not first_decided.is_set():
            first_decided.set()
            assert release.wait(30)  # the first submission holds the identity's lock here
        result = write(self, decision, input_json)
        # By thread, not in order: the write carries its COMMIT, so the second may write before the first notes it.
        written[threading.current_thread().name].append(result)
        return result

    monkeypatch.setattr(_PgOpsTx, "write", held)
    answers: dict[str, Any] = {}

    def submit(name: str) -> None:
        answers[name] = service.submit(tenant="acme", principal=alice, action="noop", input={"n": 1}, client_key="k")

    try:
        first = threading.Thread(target=submit, args=("first",), name="first")
        first.start()
        assert first_decided.wait(30)
        second = threading.Thread(target=submit, args=("second",), name="second")
        second.start()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            for _ in range(300):  # until the second one waits for the identity's advisory lock
                waiting = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND ((classid::bigint << 32) | objid::bigint) = hashtextextended(%s, 1)",
                    ("\x1f".join((shared_schema, "default", "acme", o.stable_principal(alice.ref), "k")),),
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("the second submission never waited for the identity's lock")
        release.set()
        first.join(30)
        second.join(30)
        assert answers["first"].created and not answers["second"].created
        assert answers["first"].operation_id == answers["second"].operation_id
        # The second decided on a snapshot without the identity, its write was refused by the
        # identity's key (nothing written), and it decided again on the committed Operation.
        assert written == {"first": [True], "second": [False]}
        assert store.application_execute("SELECT count(*) FROM operations") == [(1,)]
    finally:
        release.set()
        store.close()


def test_stores_in_two_schemas_never_wait_for_each_others_identities(
    pg_dsn: str, shared_schema: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Advisory locks are the whole database's: the identity's lock is keyed by the schema too."""
    held_store = factory_for(pg_dsn, shared_schema)(None)
    other_store = factory_for(pg_dsn, pg_schema)(None)
    alice = PrincipalReference("users", 1, "alice")
    holding = threading.Event()
    release = threading.Event()
    write = _PgOpsTx.write

    def held(self: _PgOpsTx, decision: Any, input_json: str | None) -> bool:
        if self.schema == shared_schema:
            holding.set()
            assert release.wait(30)  # this submission holds its identity's lock here
        return write(self, decision, input_json)

    monkeypatch.setattr(_PgOpsTx, "write", held)

    def submit(store: PostgresOperationStore) -> Any:
        service = DurableOperationService(store, _noop_registry(), examples.resolvers())
        return service.submit(tenant="acme", principal=alice, action="noop", input={"n": 1}, client_key="both")

    first = threading.Thread(target=submit, args=(held_store,))
    try:
        first.start()
        assert holding.wait(30)
        started = time.monotonic()
        # The same identity in the other schema: admitted at once, not after the held one commits.
        admission = submit(other_store)
        assert admission.created
        assert time.monotonic() - started < 10
    finally:
        release.set()
        first.join(30)
        held_store.close()
        other_store.close()


def test_a_guard_that_fails_at_the_write_rolls_the_transaction_back_on_the_server(
    pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The write's COMMIT travels with it: a guard that did not hold must abort the transaction first."""
    from datetime import timedelta  # noqa: PLC0415

    import attrs  # noqa: PLC0415

    from fencekeeper.kernel import operations as o  # noqa: PLC0415

    store = PostgresOperationStore(pg_dsn, schema=pg_schema)
    try:
        store.application_execute("CREATE TABLE app_marks (mark integer)")
        DurableOperationService(store, _noop_registry(), examples.resolvers()).submit(
            tenant="acme", principal=PrincipalReference("users", 1, "alice"), action="noop", input={}, client_key="k"
        )
        [(operation_id,)] = store.application_execute("SELECT operation_id FROM operations")
        before = store.view(operation_id)
        assert before is not None
        with store._transaction() as tx:
            assert isinstance(tx, _PgOpsTx)
            operation = tx.lock_operation(operation_id)
            assert operation is not None
            decision = o.claim(operation, o.ClaimRequest("w", timedelta(seconds=30)), tx.now())
            assert isinstance(decision, o.Decision)
            # Everything else of a real decision, on a revision that is no longer the row's.
            stale = attrs.evolve(decision, guard=attrs.evolve(decision.guard, expected_revision=operation.revision + 1))
            tx.application("INSERT INTO app_marks VALUES (1)", ())
            with caplog.at_level(logging.WARNING, logger="psycopg.pool"):
                assert tx.write(stale, None) is False
                # The COMMIT sent behind the write was skipped with it: the transaction is aborted, not committed.
                assert tx.conn.pgconn.transaction_status == pq.TransactionStatus.INERROR
                conn_used = tx.conn
        # The store's transaction rolled it back itself, before handing the connection back to the pool
        # (which would otherwise warn that it rolled back a returned connection).
        assert conn_used.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg.pool")] == []
        assert store.application_execute("SELECT count(*) FROM app_marks") == [(0,)]
        assert store.view(operation_id) == before, "neither the Operation nor its history changed"
        with psycopg.connect(pg_dsn) as conn:
            conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
            with pytest.raises(psycopg.DatabaseError) as refused:
                conn.execute("SELECT fencekeeper_guard_held(false)")
            assert refused.value.sqlstate == "ZG001"
    finally:
        store.close()


# --- an atomic action inside its transaction; waiting for a stalled holder ------------------------------


def test_a_transaction_ended_behind_the_stores_back_is_never_a_success(
    pg_dsn: str, shared_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last line of defence: with the statement filter and the extended protocol both taken away, a
    COMMIT gets through; the store notices that its transaction ended and the attempt ends conclusively."""
    from fencekeeper.adapters.operations import postgres  # noqa: PLC0415
    from fencekeeper.adapters.operations.ports import GuardedContext  # noqa: PLC0415
    from fencekeeper.adapters.store import ManualClock  # noqa: PLC0415
    from fencekeeper.adapters.testing.operations_suite import LEASE, TENANT, World, open_accounts  # noqa: PLC0415

    monkeypatch.setattr(postgres, "transaction_control", lambda sql: None)
    monkeypatch.setattr(postgres, "_extended_cursor", lambda: psycopg.Cursor)
    clock = ManualClock()
    store = factory_for(pg_dsn, shared_schema)(clock)
    try:
        open_accounts(store, {"acc-1": 100, "acc-2": 0})
        world = World(store, clock)
        op_id = world.transfer("k1", 10)

        def leaks(context: GuardedContext, value: Any) -> Any:
            context.execute("UPDATE app_accounts SET balance = balance - 10 WHERE account_id = 'acc-1'; COMMIT")
            return {}

        actions = DurableActionRegistry((DurableAction("transfer", 1, EffectClass.ATOMIC, leaks),))
        worker = DurableOperationWorker(store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=LEASE)
        report = worker.run_once()
        assert report is not None and report.outcome == "action_failed"
        record = world.service.get(op_id)
        assert record is not None
        assert (record.state.value, record.error_code, record.result) == ("failed", "transaction_escaped", None)
        clock.advance(timedelta(minutes=10))
        assert worker.run_once() is None, "a transaction that escaped is never retried"
    finally:
        store.close()


def test_a_decision_waits_for_a_locked_row_at_most_lock_timeout(pg_dsn: str, pg_schema: str) -> None:
    from fencekeeper.adapters.store import StoreError  # noqa: PLC0415
    from fencekeeper.kernel import operations as o  # noqa: PLC0415

    with pytest.raises(ValueError, match="lock_timeout"):
        PostgresOperationStore(pg_dsn, schema=pg_schema, lock_timeout=0)
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, lock_timeout=0.2, idle_in_transaction_timeout=5)
    try:
        examples.prepare(store)
        service = DurableOperationService(store, examples.registry(), examples.resolvers())
        op_id = service.submit(
            tenant="default", principal=PrincipalReference("users", 1, "alice"), action="transfer",
            input={"from": "acc-1", "to": "acc-2", "amount": 1}, client_key="k",
        ).operation_id
        with psycopg.connect(pg_dsn) as holder:
            holder.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
            holder.execute("SELECT 1 FROM operations WHERE operation_id = %s FOR UPDATE", (op_id,))
            started = time.monotonic()
            with pytest.raises(StoreError) as raised:
                store.cancel(o.CancelRequest(op_id, "users:v1:alice", o.Authority(True, "users:v1:alice")))
            waited = time.monotonic() - started
            holder.rollback()
        assert raised.value.code == "row_locked" and "0.2 s (lock_timeout)" in raised.value.message
        assert 0.15 < waited < 2
        record = service.get(op_id)
        assert record is not None and record.state.value == "admitted"
    finally:
        store.close()


def test_a_timeout_under_a_millisecond_is_one_millisecond_not_zero(pg_dsn: str, pg_schema: str) -> None:
    # PostgreSQL reads 0 as "no timeout": a lease of a fraction of a millisecond must not switch off
    # the server's end of a stalled session, nor a tiny lock_timeout the bounded wait.  (A live store
    # cannot be shown it: a millisecond idle in a transaction ends the session the store checks with.)
    from fencekeeper.adapters.postgres_store import _milliseconds  # noqa: PLC0415

    assert [_milliseconds(s) for s in (0.0001, 0.0004, 0.0006, 0.2, 86_400)] == [1, 1, 1, 200, 86_400_000]
    # Both stores send their timeouts so (a lock_timeout of a millisecond does not hinder opening).
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

    migrate(pg_dsn, pg_schema)
    for store in (
        PostgresOperationStore(pg_dsn, schema=pg_schema, lock_timeout=0.0004),
        PostgresStore(pg_dsn, schema=pg_schema, lock_timeout=0.0004),
    ):
        try:
            with store._pool.connection() as conn:
                conn.autocommit = True
                assert conn.execute("SHOW lock_timeout").fetchone() == ("1ms",)
                conn.autocommit = False
        finally:
            store.close()


def test_a_connection_lost_while_the_store_opens_is_store_unavailable(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cut between the pool's connection and the schema check: the store's own error, as on every other
    # call, never psycopg's (which a worker that waits out StoreError would die of).
    from fencekeeper.adapters.operations import postgres as ops_postgres  # noqa: PLC0415
    from fencekeeper.adapters.store import StoreError  # noqa: PLC0415

    real = ops_postgres.check_schema

    def cut_then_check(conn: psycopg.Connection[Any], schema: str) -> int:
        with psycopg.connect(pg_dsn, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        return real(conn, schema)

    monkeypatch.setattr(ops_postgres, "check_schema", cut_then_check)
    with pytest.raises(StoreError) as raised:
        PostgresOperationStore(pg_dsn, schema=pg_schema)
    assert raised.value.code == "store_unavailable"


def test_an_identical_resubmission_does_not_wait_for_the_operations_row(pg_dsn: str, pg_schema: str) -> None:
    """A worker inside an atomic action holds the Operation's row; a client's retry of its submission is answered anyway.

    Admission decides on the identity (serialized by its own lock) and on the
    Operation's immutable binding and whether it has ended: nothing it writes
    depends on the Operation's row lock.
    """
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, lock_timeout=0.2, idle_in_transaction_timeout=5)
    try:
        examples.prepare(store)
        service = DurableOperationService(store, examples.registry(), examples.resolvers())
        alice = PrincipalReference("users", 1, "alice")
        payload = {"from": "acc-1", "to": "acc-2", "amount": 1}
        first = service.submit(tenant="default", principal=alice, action="transfer", input=payload, client_key="k")
        with psycopg.connect(pg_dsn) as holder:
            holder.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
            holder.execute("SELECT 1 FROM operations WHERE operation_id = %s FOR UPDATE", (first.operation_id,))
            started = time.monotonic()
            again = service.submit(tenant="default", principal=alice, action="transfer", input=payload, client_key="k")
            waited = time.monotonic() - started
            holder.rollback()
        assert not again.created and again.operation_id == first.operation_id
        assert waited < 0.15
    finally:
        store.close()


def test_a_cancel_during_the_atomic_action_waits_for_its_row_and_is_too_late(pg_dsn: str, shared_schema: str) -> None:
    """Effect first, concurrently: the cancellation meets the action on the Operation's row and loses, changing nothing."""
    from datetime import timedelta  # noqa: PLC0415

    from fencekeeper.adapters.operations.service import DurableOperationError  # noqa: PLC0415
    from fencekeeper.adapters.testing.operations_suite import accounts, open_accounts  # noqa: PLC0415
    from fencekeeper.kernel import operations as o  # noqa: PLC0415

    store = factory_for(pg_dsn, shared_schema)(None)
    try:
        open_accounts(store, {"acc-1": 100, "acc-2": 0})
        service = DurableOperationService(store, examples.registry(), examples.resolvers())
        alice = PrincipalReference("users", 1, "alice")
        op_id = service.submit(
            tenant="t", principal=alice, action="transfer", input={"from": "acc-1", "to": "acc-2", "amount": 10},
            client_key="k",
        ).operation_id
        claim = store.claim_next("t", "w1", timedelta(seconds=30))
        assert isinstance(claim, o.Decision) and claim.credential is not None
        inside, release = threading.Event(), threading.Event()
        # Each thread's answer kept apart: once the action's COMMIT frees the row, either thread may answer first.
        effected: list[object] = []
        cancelled: list[object] = []

        def held(context: object) -> str:
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})  # type: ignore[arg-type]
            inside.set()
            assert release.wait(30)
            return "null"

        def cancel() -> None:
            try:
                cancelled.append(service.cancel(op_id, principal=alice))
            except DurableOperationError as exc:
                cancelled.append(exc.code)

        effect = threading.Thread(
            target=lambda: effected.append(store.complete(o.CompleteRequest(claim.credential, o.Authority(True, alice.ref)), held))  # type: ignore[arg-type]
        )
        effect.start()
        assert inside.wait(30)
        canceller = threading.Thread(target=cancel)
        canceller.start()
        time.sleep(0.3)
        assert canceller.is_alive(), "the cancellation waits for the row the action holds"
        release.set()
        effect.join(30)
        canceller.join(30)
        assert len(effected) == 1 and isinstance(effected[0], o.Decision), effected
        assert cancelled == ["cancel_too_late"], cancelled
        assert accounts(store) == {"acc-1": 90, "acc-2": 10}
        record = service.get(op_id)
        assert record is not None and record.state.value == "succeeded"
    finally:
        release.set()
        store.close()


def test_a_decision_that_leaves_an_operation_due_at_once_wakes_idle_workers(pg_dsn: str, pg_schema: str) -> None:
    # A notification is sent with exactly the writes that leave an Operation claimable at once (a submission,
    # an approval granted), committed with them: not for one that waits (approval, a retry's backoff), nor
    # for an identical resubmission, which writes nothing.
    actions = DurableActionRegistry(
        (
            DurableAction("noop", 1, EffectClass.ATOMIC, lambda context, value: None),
            DurableAction("gated", 1, EffectClass.ATOMIC, lambda context, value: None, requires_approval=True),
            DurableAction(
                "flaky", 1, EffectClass.ATOMIC, _fails,
                policy=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=600)),
            ),
        )
    )  # fmt: skip
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=2)
    waiter = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        service = DurableOperationService(store, actions, examples.resolvers())
        worker = DurableOperationWorker(store, actions, examples.resolvers(), tenant="acme", worker_id="w")
        alice, bob = PrincipalReference("users", 1, "alice"), PrincipalReference("users", 1, "bob")
        assert waiter.wait_for_work(0.05) is False  # subscribes; nothing pending

        def submit(action: str, key: str) -> str:
            return service.submit(tenant="acme", principal=alice, action=action, input={}, client_key=key).operation_id

        submit("noop", "k1")
        assert waiter.wait_for_work(5.0) is True
        submit("noop", "k1")  # the same identity: the same Operation, nothing written
        assert waiter.wait_for_work(0.5) is False
        report = worker.run_once()  # a claim and a success: nothing left due
        assert report is not None and report.outcome == "succeeded", report
        assert waiter.wait_for_work(0.5) is False

        gated = submit("gated", "k2")
        assert waiter.wait_for_work(0.5) is False  # awaiting approval
        service.decide(gated, approver=bob, approve=True)
        assert waiter.wait_for_work(5.0) is True
        report = worker.run_once()
        assert report is not None and report.operation_id == gated and report.outcome == "succeeded", report

        submit("flaky", "k3")
        assert waiter.wait_for_work(5.0) is True
        report = worker.run_once()  # fails; the retry is due in ten minutes
        assert report is not None and report.outcome == "retry", report
        assert waiter.wait_for_work(0.5) is False
    finally:
        waiter.close()
        store.close()
    assert not waiter._listener.listening


def _fails(context: object, value: object) -> None:
    raise ActionFailed("declined", "the provider said no", retryable=True)
