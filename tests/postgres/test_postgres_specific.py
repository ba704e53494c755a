"""What only the PostgreSQL store does: its schema check, business isolation, LISTEN/NOTIFY, SKIP LOCKED, database time.

The behaviour every store shares is proven by the shipped suite
(tests/stores); these tests cover what that suite cannot see.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import psycopg
import pytest

from fencekeeper.adapters import codec, postgres_store, sql
from fencekeeper.adapters import store as store_module
from fencekeeper.adapters.postgres_store import MIGRATIONS, Listener, PostgresStore, migrate
from fencekeeper.adapters.store import Evidence, ManualClock, StoreError
from fencekeeper.adapters.testing.bulk import admit_in_bulk
from fencekeeper.adapters.testing.suite import (
    admit,
    claim,
    decided,
    finalize_request,
    recovery_request,
    snapshot,
    step_request,
    wait_spec,
)
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

OPS = p.Authority(True, "ops")
LEASE = timedelta(seconds=30)


@pytest.fixture
def store(pg_dsn: str, pg_schema: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_dsn, schema=pg_schema)
    yield s
    s.close()


def _admit(store: PostgresStore, eid: str, business: str = "acme") -> None:
    outcome = store.admit(p.AdmitRequest(eid, business, "d", 1, "start", OPS))
    assert isinstance(outcome, p.Decision), outcome


def _sql(pg_dsn: str, schema: str, statement: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        conn.execute(statement)  # type: ignore[arg-type]


def test_a_pool_that_never_fills_is_closed_with_the_error(pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pool is opened before its first connection is awaited: if that wait fails, no store is made to
    # close it, so the store closes it itself (its threads and any connection would outlive the error).
    from psycopg_pool import ConnectionPool, PoolTimeout  # noqa: PLC0415

    opened: list[ConnectionPool] = []
    real_wait = ConnectionPool.wait

    def wait(self: ConnectionPool, timeout: float = 30.0) -> None:
        opened.append(self)
        real_wait(self, timeout)
        raise PoolTimeout("no connection came in time")

    monkeypatch.setattr(ConnectionPool, "wait", wait)
    with pytest.raises(StoreError) as raised:
        PostgresStore(pg_dsn, schema=pg_schema)
    assert raised.value.code == "store_unavailable" and "no connection came in time" in raised.value.message
    assert len(opened) == 1 and opened[0].closed


def test_a_missing_schema_is_a_blocking_error(pg_dsn: str) -> None:
    with pytest.raises(StoreError) as raised:
        PostgresStore(pg_dsn, schema="fk_never_migrated")
    assert raised.value.code == "schema_missing"
    assert "fencekeeper migrate" in raised.value.message


def test_a_newer_schema_is_refused_naming_the_version(pg_dsn: str, pg_schema: str) -> None:
    _sql(pg_dsn, pg_schema, "INSERT INTO schema_migrations (version, name, checksum) VALUES (99, 'future', 'x')")
    with pytest.raises(StoreError) as raised:
        PostgresStore(pg_dsn, schema=pg_schema)
    assert raised.value.code == "schema_too_new"
    assert "99" in raised.value.message


def test_an_edited_migration_is_refused(pg_dsn: str, pg_schema: str) -> None:
    _sql(pg_dsn, pg_schema, "UPDATE schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(StoreError) as raised:
        PostgresStore(pg_dsn, schema=pg_schema)
    assert raised.value.code == "schema_altered"


def test_migrate_is_idempotent_and_records_every_migration(pg_dsn: str, pg_schema: str) -> None:
    assert migrate(pg_dsn, pg_schema) == []
    with psycopg.connect(pg_dsn) as conn:
        versions = [r[0] for r in conn.execute(f"SELECT version FROM {pg_schema}.schema_migrations")]  # type: ignore[arg-type]
    assert versions == [number for number, _, _ in MIGRATIONS]


def test_a_bad_dsn_is_one_clear_error() -> None:
    with pytest.raises(StoreError) as raised:
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", schema="x")
    assert raised.value.code == "store_unavailable"
    assert "\n" not in raised.value.message


def test_one_business_can_neither_read_nor_change_another(pg_dsn: str, pg_schema: str) -> None:
    everyone = PostgresStore(pg_dsn, schema=pg_schema)
    acme = PostgresStore(pg_dsn, schema=pg_schema, business_id="acme")
    other = PostgresStore(pg_dsn, schema=pg_schema, business_id="globex")
    try:
        _admit(everyone, "e-acme", "acme")
        _admit(everyone, "e-globex", "globex")
        assert other.read("e-acme") is None
        assert other.read_for_visit("e-acme") is None
        found = acme.read_for_visit("e-acme")
        assert found is not None and found.execution.business_id == "acme"
        assert other.execution_ids() == ["e-globex"]
        assert acme.execution_ids() == ["e-acme"]
        before = everyone.read("e-acme")
        cancel = other.cancel(p.CancelRequest("e-acme", "globex", 1, OPS))
        assert isinstance(cancel, p.Refusal) and cancel.code == p.RefusalCode.EXECUTION_NOT_FOUND
        # Even presenting the right business, a store scoped to another cannot touch it.
        cancel = other.cancel(p.CancelRequest("e-acme", "acme", 1, OPS))
        assert isinstance(cancel, p.Refusal) and cancel.code == p.RefusalCode.EXECUTION_NOT_FOUND
        claim = other.claim_next(p.ClaimRequest("w-globex", "t1", LEASE))
        assert isinstance(claim, p.Decision) and claim.execution is not None
        assert claim.execution.execution_id == "e-globex"
        assert other.claim_next(p.ClaimRequest("w-globex", "t2", LEASE)) is None
        assert everyone.read("e-acme") == before
    finally:
        for s in (everyone, acme, other):
            s.close()


def test_database_time_decides_lease_expiry(store: PostgresStore, pg_dsn: str) -> None:
    _admit(store, "e1")
    before = datetime.now(UTC)
    claim = store.claim_next(p.ClaimRequest("w1", "t1", LEASE))
    after = datetime.now(UTC)
    assert isinstance(claim, p.Decision) and claim.dispatch is not None
    expires = claim.dispatch.lease_expires_at
    assert expires is not None
    # The expiry is the server's clock_timestamp() plus the lease (same machine, so close to ours).
    assert before + LEASE - timedelta(seconds=2) <= expires <= after + LEASE + timedelta(seconds=2)


def test_a_decision_that_waited_for_a_lock_reads_the_time_after_it(store: PostgresStore, pg_dsn: str) -> None:
    # The locking read brings the decision's time with the rows.  Rows held
    # by another transaction are waited for, and the time must be read after
    # the wait, not when the statement began: a time from before it could
    # make an expired lease look live.
    _admit(store, "e1")
    claim = store.claim_next(p.ClaimRequest("w1", "t1", LEASE))
    assert isinstance(claim, p.Decision) and claim.lease is not None
    credential = claim.lease
    holder = psycopg.connect(pg_dsn)
    try:
        holder.execute(f"SELECT 1 FROM {store.schema}.objects WHERE object_id = 'e1' FOR UPDATE")  # type: ignore[arg-type]
        outcome: list[p.Outcome] = []
        thread = threading.Thread(target=lambda: outcome.append(store.renew("e1", p.RenewRequest(credential, LEASE))))
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive(), "the renewal should be waiting for the row lock"
        released = holder.execute("SELECT clock_timestamp()").fetchone()
        assert released is not None
        holder.rollback()
        thread.join(timeout=10)
    finally:
        holder.close()
    [renewed] = outcome
    assert isinstance(renewed, p.Decision) and renewed.dispatch is not None
    expires = renewed.dispatch.lease_expires_at
    assert expires is not None and expires >= released[0] + LEASE, (expires, released[0] + LEASE)


def test_concurrent_claims_skip_locked_rows(pg_dsn: str, pg_schema: str) -> None:
    stores = [PostgresStore(pg_dsn, schema=pg_schema) for _ in range(4)]
    try:
        for i in range(40):
            _admit(stores[0], f"e{i:03}")
        claimed: list[str] = []
        lock = threading.Lock()

        def drain(s: PostgresStore, worker: str) -> None:
            n = 0
            while True:
                n += 1
                outcome = s.claim_next(p.ClaimRequest(worker, f"{worker}-{n}", LEASE))
                if outcome is None:
                    return
                assert isinstance(outcome, p.Decision) and outcome.execution is not None
                with lock:
                    claimed.append(outcome.execution.execution_id)

        threads = [threading.Thread(target=drain, args=(s, f"w{k}")) for k, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(claimed) == [f"e{i:03}" for i in range(40)], "every execution claimed exactly once"
        assert stores[0].execution_ids(ExecutionState.RUNNING) == sorted(claimed)
    finally:
        for s in stores:
            s.close()


def test_an_idle_worker_is_woken_promptly_when_work_becomes_eligible(pg_dsn: str, pg_schema: str) -> None:
    waiter = PostgresStore(pg_dsn, schema=pg_schema)
    admitter = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        assert waiter.wait_for_work(0.05) is False  # subscribes; nothing pending
        woke: list[float] = []

        def wait() -> None:
            started = time.monotonic()
            if waiter.wait_for_work(10.0):
                woke.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        _admit(admitter, "e-new")
        thread.join(timeout=15)
        assert woke, "the notification never arrived"
        # Far sooner than the 10 s poll fallback: the admission's commit woke it.
        assert woke[0] < 5.0
        claim = waiter.claim_next(p.ClaimRequest("w1", "t1", LEASE))
        assert isinstance(claim, p.Decision)
    finally:
        waiter.close()
        admitter.close()


def test_a_refused_decision_sends_no_notification(pg_dsn: str, pg_schema: str) -> None:
    waiter = PostgresStore(pg_dsn, schema=pg_schema)
    actor = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        _admit(actor, "e1")
        # Subscribe, and drain the admission's notice.
        while waiter.wait_for_work(0.1):
            pass
        refused = actor.cancel(p.CancelRequest("e1", "acme", 99, OPS))
        assert isinstance(refused, p.Refusal)
        assert waiter.wait_for_work(0.5) is False
    finally:
        waiter.close()
        actor.close()


def test_waiting_for_work_after_close_is_store_unavailable_and_listens_no_more(pg_dsn: str, pg_schema: str) -> None:
    # The suite's after-close test cannot see this: wait_for_work is no part of the port, and
    # it opened its listening connection again, which nothing then closed.
    store = PostgresStore(pg_dsn, schema=pg_schema)
    assert store.wait_for_work(0.01) is False  # listening
    store.close()
    with pytest.raises(StoreError) as caught:
        store.wait_for_work(0.01)
    assert caught.value.code == "store_unavailable" and "closed" in str(caught.value), caught.value
    assert not store._listener.listening
    store.close()  # a second close does nothing


def test_a_killed_connection_is_replaced_or_reported_never_leaked(pg_dsn: str, pg_schema: str) -> None:
    # pg_terminate_backend on the store's idle connections: the request that
    # finds one dead fails as StoreError('store_unavailable'), never psycopg's
    # own error, the pool discards it, and the next request works.
    name = f"fk-kill-{pg_schema[-8:]}"
    store = PostgresStore(f"{pg_dsn}?application_name={name}", schema=pg_schema)
    try:
        _admit(store, "e1")
        assert store.expired() == []
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (name,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        time.sleep(0.2)
        for attempt in range(5):
            try:
                assert store.execution_ids() == ["e1"]
                assert store.read("e1") is not None
                _admit(store, f"e-after-{attempt}")
                break
            except StoreError as exc:
                assert exc.code == "store_unavailable"
        else:
            pytest.fail("the store never recovered from killed connections")
    finally:
        store.close()


def _fresh_schema() -> str:
    return f"fk_test_{uuid.uuid4().hex[:12]}"


def _drop(pg_dsn: str, schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def _rows(pg_dsn: str, schema: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        return conn.execute(query).fetchall()  # type: ignore[arg-type]


def _load_registration_before_closed_by(self: sql.SqlBackend, key: p.WaitKey) -> p.WaitRegistration | None:
    """How the code of versions before 6 read a registration: there was no closed_by yet."""
    row = self._execute(
        "SELECT business_id, spec, woken_by, wake_reason FROM wait_registrations "
        "WHERE execution_id = ? AND node_id = ? AND attempt_id = ?",
        (key.execution_id, key.node_id, key.attempt_id),
    ).fetchone()
    if row is None:
        return None
    wake_reason = None if row[3] is None else p.WakeReason(row[3])
    return p.WaitRegistration(key, row[0], codec.decode_wait_spec(row[1]), row[2], wake_reason)


def test_a_version_2_schema_migrates_forward_keeping_every_row_and_its_order(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Migration 3 drops an index and adds another; migration 4 moves new
    # transitions onto the revision rows they make; migration 5 drops two
    # indexes of objects, one of them a unique constraint.  A schema written at
    # version 2 (by the code of that version: every transition in its own
    # table) must come through with the same history, in the same order, and
    # go on appending after it.
    schema = _fresh_schema()
    try:
        with monkeypatch.context() as patched:
            patched.setattr(postgres_store, "MIGRATIONS", MIGRATIONS[:2])
            patched.setattr(postgres_store._PostgresBackend, "revisions_carry_transitions", False)
            patched.setattr(sql.SqlBackend, "load_registration", _load_registration_before_closed_by)
            # The code of that version wrote no outbox (migration 10 made it).
            patched.setattr(postgres_store._PostgresBackend, "writes_outbox", False)
            # Nor checked a guard on the server (migration 11 made fencekeeper_guard_held).
            patched.setattr(postgres_store._PostgresBackend, "guards_on_server", False)
            assert migrate(pg_dsn, schema) == [1, 2]
            clock = ManualClock()
            old = PostgresStore(pg_dsn, schema=schema, clock=clock)
            try:
                for i in range(12):
                    admit(old, f"e-{i:02d}")
                execution_id, credential = claim(old, "w-1")
                decided(old.renew(execution_id, p.RenewRequest(credential, LEASE)))
                decided(old.record_step(execution_id, step_request(old, execution_id, credential)))
                decided(
                    old.finalize(
                        finalize_request(old, execution_id, credential, ExecutionState.WAITING, wait=wait_spec())
                    )
                )
                execution_id, credential = claim(old, "w-2")
                clock.advance(LEASE)
                decided(old.recover(recovery_request(old, execution_id, p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))
                before = snapshot(old)
            finally:
                old.close()
        old_rows = _rows(pg_dsn, schema, "SELECT * FROM transitions ORDER BY seq")
        assert len(old_rows) > 12, "the version 2 schema should hold some history"

        assert migrate(pg_dsn, schema) == [n for n, _, _ in MIGRATIONS if n > 2]
        store = PostgresStore(pg_dsn, schema=schema, clock=clock)
        try:
            assert snapshot(store) == before, "migrating changed what a client sees"
            execution_id, credential = claim(store, "w-3")
            decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.FAILED)))
            assert store.execution_ids(ExecutionState.FAILED) == [execution_id]
            assert len(store.execution_ids(ExecutionState.WAITING)) == 1, "written at version 2, listed at 5"
        finally:
            store.close()
        assert _rows(pg_dsn, schema, "SELECT * FROM transitions ORDER BY seq") == old_rows
        carried = _rows(
            pg_dsn,
            schema,
            "SELECT execution_id, event, to_state FROM execution_transitions WHERE rank = 0 ORDER BY revision",
        )
        assert carried == [(execution_id, "claim", "running"), (execution_id, "finalize_failed", "failed")]
        assert (
            _rows(
                pg_dsn,
                schema,
                f"SELECT indexname FROM pg_indexes WHERE indexname = 'objects_type_state' AND schemaname = '{schema}'",
            )
            == []
        )
    finally:
        _drop(pg_dsn, schema)


def test_every_execution_state_is_listed_through_an_index_or_by_design_by_reading_all() -> None:
    # Eligible and running executions are found through workflow_dispatch's
    # partial indexes and succeeded ones are read in full (nearly every
    # execution ends there); a new state must be added to migration 3's index
    # (by a new migration), not silently listed by a full read.
    by_dispatch_or_full_read = {ExecutionState.ELIGIBLE, ExecutionState.RUNNING, ExecutionState.SUCCEEDED}
    assert set(postgres_store._LISTED_BY_REVISION) == {s.value for s in ExecutionState} - {
        s.value for s in by_dispatch_or_full_read
    }
    index = next(text for number, _, text in MIGRATIONS if number == 3)
    assert postgres_store._LISTED_CONDITION in index


@pytest.mark.parametrize("state", [ExecutionState(s) for s in postgres_store._LISTED_BY_REVISION])
def test_listing_executions_by_state_can_use_the_revision_index(
    pg_dsn: str, pg_schema: str, state: ExecutionState
) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        # On an empty table the planner would rightly read it all; forbidding
        # that shows whether the index's condition matches the query at all.
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {postgres_store.listing_sql(state)}"))  # type: ignore[arg-type]
    assert "object_revisions_listed" in plan, plan


def test_a_decision_updates_its_execution_row_in_place(pg_dsn: str, pg_schema: str) -> None:
    # A HOT update writes no index entry; any index on a column a decision
    # changes (revision, state, updated_at) would make every update a full
    # one.  The counters are the server's own.
    store = PostgresStore(pg_dsn, schema=pg_schema)
    try:
        for i in range(10):
            _admit(store, f"e-{i}")
        for _ in range(10):
            execution_id, credential = claim(store, "w-1")
            decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.SUCCEEDED)))
    finally:
        # A backend reports its counters when its connection ends.
        store.close()
    query = (
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        f"WHERE schemaname = '{pg_schema}' AND relname = 'objects'"
    )
    deadline = time.monotonic() + 10
    while True:
        [(updates, hot)] = _rows(pg_dsn, pg_schema, query)
        if updates >= 20 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert updates == 20, "two execution updates per run: claim and finalize"
    assert hot == updates, f"only {hot} of {updates} updates of objects were HOT"


def test_an_evidence_object_is_entered_into_two_indexes_and_its_seq_is_generated_always(
    pg_dsn: str, pg_schema: str
) -> None:
    # Migration 5 dropped the two indexes of objects that no query reads.
    # The seq's uniqueness now rests on the identity column alone: values
    # only from its sequence, never from an INSERT.
    with psycopg.connect(pg_dsn) as conn:
        indexes = {
            r[0]
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'objects'", (pg_schema,)
            )
        }
        identity = conn.execute(
            "SELECT a.attidentity FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = 'objects' AND a.attname = 'seq'",
            (pg_schema,),
        ).fetchone()
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        with pytest.raises(psycopg.errors.GeneratedAlways):
            conn.execute(
                "INSERT INTO objects (seq, object_id, object_type, business_id, revision, created_at, updated_at) "
                "VALUES (1, 'x', 'step_attempt', 'acme', 1, now(), now())"
            )
    assert indexes == {"objects_pkey", "objects_parent"}
    assert identity == ("a",)


@pytest.mark.parametrize("scoped", [False, True])
def test_a_claim_searches_the_eligible_index_only_up_to_its_time(pg_dsn: str, pg_schema: str, scoped: bool) -> None:
    # The bound must be an index condition, not a filter: executions
    # scheduled for later (retries, timers) would otherwise be read on every
    # claim.  Forced generic, as the store's prepared statement runs.
    sql = postgres_store.claim_sql("statement_timestamp()", scoped=scoped).replace("?", "$1")
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET enable_seqscan = off")
        conn.execute(f"PREPARE claim AS {sql}")  # type: ignore[arg-type]
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN EXECUTE claim('acme')" if scoped else "EXPLAIN EXECUTE claim")
        )
    assert "Index Scan using workflow_dispatch_eligible" in plan, plan
    assert "Index Cond: (eligible_at <= statement_timestamp())" in plan, plan


CLAIMS = 30


@pytest.mark.parametrize("business_id", [None, "acme"])
@pytest.mark.parametrize("clock", ["database", "injected"])
def test_the_claim_is_planned_once_not_on_every_claim(
    pg_dsn: str, pg_schema: str, business_id: str | None, clock: str
) -> None:
    # PostgreSQL plans a prepared statement's first five runs for their
    # parameters, then keeps a generic plan unless it looks dearer; a claim
    # planned again on every call cost the server about a seventh of its time.
    # With an injected clock the bound is a parameter.
    store = PostgresStore(
        pg_dsn,
        schema=pg_schema,
        business_id=business_id,
        pool_size=1,
        clock=ManualClock(datetime.now(UTC) + timedelta(seconds=1)) if clock == "injected" else None,
    )
    try:
        # The planner's choice depends on the table: with a few rows even a
        # statement it would plan every time looks cheap enough as generic.
        admit_in_bulk(pg_dsn, pg_schema, 20_000, prefix="bulk-", business_id="acme")
        for i in range(CLAIMS):
            claimed = store.claim_next(p.ClaimRequest("w1", f"t{i}", LEASE))
            assert isinstance(claimed, p.Decision)
        with store._pool.connection() as conn:
            rows = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%LIMIT 1 FOR UPDATE OF o, d SKIP LOCKED) c'"
            ).fetchall()
    finally:
        store.close()
    # The store prepares a statement on its first run; PostgreSQL then plans
    # at most the first five runs of it for their parameters.
    [(generic, custom)] = rows
    assert custom <= 5 and generic == CLAIMS - custom, (generic, custom)


def _drain(store: PostgresStore, prefix: str, count: int) -> None:
    """Admit, claim and finalize ``count`` executions, each with one evidence object."""
    for i in range(count):
        _admit(store, f"{prefix}-{i}")
        execution_id, credential = claim(store, "w-1")
        request = finalize_request(store, execution_id, credential, ExecutionState.SUCCEEDED)
        decided(store.finalize(request, [Evidence(f"{execution_id}.a1", "step_attempt", {"node": "end"})]))


def _prepared(store: PostgresStore) -> dict[str, int]:
    """The prepared statements of the store's one connection, each with how often it ran."""
    with store._pool.connection() as conn:
        rows = conn.execute("SELECT name, generic_plans + custom_plans FROM pg_prepared_statements").fetchall()
    return {str(name): int(runs) for name, runs in rows}


def test_each_statement_is_prepared_once_per_connection_and_then_run_by_name(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        _drain(store, "a", 5)
        first = _prepared(store)
        _drain(store, "b", 20)
        then = _prepared(store)
    finally:
        store.close()
    assert first and all(name.startswith("fencekeeper_") for name in first), first
    # Twenty more executions ran on the statements already there: none was
    # prepared again, and each execution ran at least its admission's,
    # claim's and finalization's writes by name.
    assert then.keys() == first.keys()
    assert sum(then.values()) - sum(first.values()) >= 20 * 3


def test_a_rolled_back_decision_leaves_the_prepared_statements_in_place(pg_dsn: str, pg_schema: str) -> None:
    # psycopg's own preparing deallocates every statement of a connection
    # after a rollback; the store's statements must outlive one.
    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        _drain(store, "a", 2)
        before = _prepared(store)
        _admit(store, "c-1")
        execution_id, credential = claim(store, "w-1")
        request = finalize_request(store, execution_id, credential, ExecutionState.SUCCEEDED)
        with pytest.raises(StoreError) as raised:
            store.finalize(request, [Evidence("a-0.a1", "outcome")])  # an id already taken: rolled back
        assert raised.value.code == "evidence_conflict"
        assert before.keys() <= _prepared(store).keys()
        decided(store.finalize(request, [Evidence("c-1.a1", "outcome")]))
    finally:
        store.close()


def test_statements_beyond_the_prepared_limit_run_unprepared(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_store, "PREPARED_MAX", 0)
    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        _drain(store, "a", 3)
        assert _prepared(store) == {}
        assert store.execution_ids(ExecutionState.SUCCEEDED) == ["a-0", "a-1", "a-2"]
    finally:
        store.close()


def test_statements_deallocated_by_something_else_fail_one_request_then_are_prepared_again(
    pg_dsn: str, pg_schema: str
) -> None:
    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        _drain(store, "a", 1)
        before = snapshot(store, "b-1")
        with store._pool.connection() as conn:
            conn.execute("DEALLOCATE ALL")
        with pytest.raises(StoreError) as raised:
            _admit(store, "b-1")
        assert raised.value.code == "store_unavailable" and "deallocated" in raised.value.message
        assert snapshot(store, "b-1") == before
        _admit(store, "b-1")
        assert store.execution_ids(ExecutionState.ELIGIBLE) == ["b-1"]
        assert _prepared(store)
    finally:
        store.close()


def test_every_statement_of_the_store_is_numbered_and_a_stray_percent_is_refused() -> None:
    assert postgres_store._numbered("SELECT %s, x = %s") == b"SELECT $1, x = $2"
    assert postgres_store._numbered("SELECT 1") == b"SELECT 1"
    with pytest.raises(ValueError, match="not a placeholder"):
        postgres_store._numbered("SELECT %s WHERE name LIKE 'a%'")


# --- a guarded write kept for the COMMIT -------------------------------------------------------


def _stale(decision: p.Decision) -> p.Decision:
    """``decision`` with a guard no row matches: the execution's revision as it never was."""
    guard = decision.guard
    return attrs.evolve(decision, guard=attrs.evolve(guard, expected_revision=guard.expected_revision + 7))


def test_a_guarded_write_kept_for_the_commit_fails_there_and_writes_nothing(store: PostgresStore) -> None:
    # The write goes with the COMMIT, so its guard cannot be read back first: the database checks it
    # in the statement (fencekeeper_guard_held), the statement fails, and the COMMIT is a rollback.
    _admit(store, "e-1")
    execution_id, credential = claim(store)
    before = snapshot(store)
    with pytest.raises(store_module._KeptWriteFailed), store._transaction() as tx:
        tx.lock(execution_id)
        now = tx.now(store.clock)
        decision = decided(p.renew(*tx.load(execution_id), p.RenewRequest(credential, LEASE), now))
        # Kept, and taken to hold until the COMMIT finds out otherwise.
        assert tx.write_last(_stale(decision), (), now) is True
    assert snapshot(store) == before
    # The connection went back to the pool usable, and the same request, decided afresh, lands.
    decided(store.renew(execution_id, p.RenewRequest(credential, LEASE)))
    assert snapshot(store) != before


def test_a_request_whose_kept_write_failed_is_decided_again_its_writes_checked_one_by_one(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _admit(store, "e-1")
    execution_id, credential = claim(store)
    real = p.renew
    calls: list[bool] = []

    def renew_stale_once(*args: Any) -> p.Outcome:
        outcome = real(*args)
        calls.append(True)
        # The first decision's guard fails only on the server, at the COMMIT; the second is the kernel's own.
        return _stale(outcome) if len(calls) == 1 and isinstance(outcome, p.Decision) else outcome

    monkeypatch.setattr(p, "renew", renew_stale_once)
    renewed = decided(store.renew(execution_id, p.RenewRequest(credential, LEASE)))
    assert len(calls) == 2
    found = store.read(execution_id)
    assert found is not None and found.dispatch.lease_expires_at == renewed.dispatch.lease_expires_at
    assert [t.event for t in found.history].count(p.ExecutionEvent.RENEW) == 1


def _has_statistics(pg_dsn: str, schema: str, table: str) -> bool:
    """Whether PostgreSQL holds column statistics for ``table`` (ANALYZE of rows, by hand or by autovacuum)."""
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stats WHERE schemaname = %s AND tablename = %s", (schema, table)
        ).fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("statistics", ["none yet", "analysed while empty"])
def test_a_claim_of_one_business_walks_the_eligible_index_in_order_whatever_the_statistics(
    pg_dsn: str, pg_schema: str, statistics: str
) -> None:
    # Without statistics on the queue's tables PostgreSQL took a business to
    # match one row in 200 and planned a claim of one business as a bitmap
    # scan of every eligible row, joined and sorted: every claim of a new
    # schema's first queue read the whole queue.  A claim reads the index in
    # its order and stops at the first row it can have.
    if statistics == "analysed while empty":
        _sql(pg_dsn, pg_schema, "ANALYZE")
    admit_in_bulk(pg_dsn, pg_schema, 2_000, prefix="a-", business_id="acme")
    admit_in_bulk(pg_dsn, pg_schema, 2_000, prefix="b-", business_id="other")
    assert not _has_statistics(pg_dsn, pg_schema, "workflow_dispatch"), "the case is a queue without statistics"
    store = PostgresStore(pg_dsn, schema=pg_schema, business_id="acme", pool_size=1)
    try:
        for _ in range(7):  # past the five runs PostgreSQL plans for their parameters: the generic plan too
            with store._transaction() as tx:
                assert isinstance(tx, postgres_store._PostgresBackend)
                tx.claim_time(store.clock, "acme")
                [(entries,)] = tx.conn.execute(
                    "SELECT pg_stat_get_xact_tuples_returned('workflow_dispatch_eligible'::regclass)"
                ).fetchall()
                assert entries <= 10, f"the claim read {entries} of the 4,000 eligible rows' index entries"
    finally:
        store.close()


def _pooled_rows(store: PostgresStore, pg_dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_dsn) as conn:
        return conn.execute(f"SELECT n FROM {store.schema}.{table} ORDER BY n").fetchall()  # type: ignore[arg-type]


def test_a_pooled_connection_commits_on_a_normal_exit_and_rolls_back_on_an_exception(
    store: PostgresStore, pg_dsn: str
) -> None:
    # The store's own connection context (_Checkout) must end a transaction as the pool's
    # connection() does: committed when the block ends normally, rolled back when it raises,
    # and the connection back in the pool with no transaction open either way.
    _sql(pg_dsn, store.schema, "CREATE TABLE pooled_probe (n int)")
    with store._pooled() as conn:
        conn.execute("INSERT INTO pooled_probe VALUES (1)")
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert _pooled_rows(store, pg_dsn, "pooled_probe") == [(1,)]
    with pytest.raises(RuntimeError, match="cut short"), store._pooled() as conn:
        conn.execute("INSERT INTO pooled_probe VALUES (2)")
        raise RuntimeError("cut short")
    assert _pooled_rows(store, pg_dsn, "pooled_probe") == [(1,)]
    # A failed statement leaves the transaction aborted: the exception it raises rolls it back.
    with pytest.raises(psycopg.errors.UndefinedTable), store._pooled() as conn:
        conn.execute("INSERT INTO pooled_probe VALUES (3)")
        conn.execute("INSERT INTO no_such_table VALUES (3)")
    assert _pooled_rows(store, pg_dsn, "pooled_probe") == [(1,)]
    for _ in range(3):  # every connection of the pool is idle again, and usable
        with store._pooled() as conn:
            assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.execute("SELECT count(*) FROM pooled_probe").fetchone() == (1,)
    # A connection closed inside the block goes back to the pool, which replaces it.
    with store._pooled() as conn:
        conn.close()
    with store._pooled() as conn:
        assert not conn.closed and conn.execute("SELECT 1").fetchone() == (1,)


def test_an_evidence_read_planned_on_a_new_table_looks_bodies_up_by_key_as_the_table_grows(
    pg_dsn: str, pg_schema: str
) -> None:
    # PostgreSQL keeps a prepared statement's generic plan until statistics
    # change.  Planned as a join while object_revisions was new and a few
    # pages, the read of an execution's evidence hashed the whole table, and
    # went on doing so on every visit as the table grew.
    store = PostgresStore(pg_dsn, schema=pg_schema, business_id="acme", pool_size=1)
    try:
        admit_in_bulk(pg_dsn, pg_schema, 1, prefix="first-", business_id="acme")
        # One evidence object: a join with nothing to hash would not read the table at all.
        _sql(
            pg_dsn,
            pg_schema,
            "INSERT INTO objects (object_id, object_type, business_id, parent_id, revision, created_at, updated_at) "
            "VALUES ('first-00000001.a1', 'step_attempt', 'acme', 'first-00000001', 1, now(), now()); "
            "INSERT INTO object_revisions (object_id, revision, body, committed_at) "
            "VALUES ('first-00000001.a1', 1, '{\"node\": \"end\"}', now())",
        )
        for _ in range(7):  # past the five runs PostgreSQL plans for their parameters: the generic plan is kept
            with store._transaction() as tx:
                assert isinstance(tx, postgres_store._PostgresBackend)
                tx.lock("first-00000001", evidence=True)
        admit_in_bulk(pg_dsn, pg_schema, 3_000, prefix="more-", business_id="acme")
        assert not _has_statistics(pg_dsn, pg_schema, "object_revisions"), "the case is a table without statistics"
        with store._transaction() as tx:
            assert isinstance(tx, postgres_store._PostgresBackend)
            tx.lock("first-00000001", evidence=True)
            assert [e.object_id for e in tx._views["first-00000001"].evidence] == ["first-00000001.a1"]
            [(scanned,)] = tx.conn.execute(
                "SELECT pg_stat_get_xact_tuples_returned('object_revisions'::regclass)"
            ).fetchall()
        assert scanned == 0, f"the evidence read scanned {scanned} of the 3,002 revision rows"
    finally:
        store.close()


def test_a_claim_that_passes_over_nothing_is_the_statement_it_always_was() -> None:
    # The claim is the worker's hottest statement: passing over malformed rows must cost it nothing
    # until a worker meets one (no parameter more, no condition on every row).
    for scoped in (False, True):
        plain = postgres_store.claim_sql("statement_timestamp()", scoped=scoped)
        assert plain == postgres_store.claim_sql("statement_timestamp()", scoped=scoped, skipping=False)
        assert "ALL(" not in plain and plain.count("?") == int(scoped)


def test_a_claim_that_passes_over_executions_still_walks_the_eligible_index_in_order(
    pg_dsn: str, pg_schema: str
) -> None:
    sql = postgres_store.claim_sql("statement_timestamp()", scoped=False, skipping=True).replace("?", "$1")
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"SET search_path TO {pg_schema}")  # type: ignore[arg-type]
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET enable_seqscan = off")
        conn.execute(f"PREPARE claim AS {sql}")  # type: ignore[arg-type]
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE claim(ARRAY['x-1'])"))
    assert "Index Scan using workflow_dispatch_eligible" in plan, plan
    assert "Index Cond: (eligible_at <= statement_timestamp())" in plan, plan
    assert "Sort" not in plan, plan
    # The executions passed over are a filter below the row locks: the claim never locks them.
    assert plan.index("LockRows") < plan.index("<> ALL"), plan


def test_closing_a_store_never_waits_for_its_listener_to_connect(pg_dsn: str) -> None:
    # A listening connection being opened towards a server that does not answer (a partition: the connection is
    # accepted, nothing comes back) held the listener's lock, so the store's close waited for libpq's connect
    # to time out.  A worker stopped during such an outage then hung on its way out.
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, host="127.0.0.1", port=silent.getsockname()[1], connect_timeout=30)
    listener = Listener(dsn, "fencekeeper_eligible:nowhere", "the test's store")
    def wait() -> None:
        with contextlib.suppress(psycopg.Error, StoreError):  # the connect fails once the server goes
            listener.wait(0.1)

    waiting = threading.Thread(target=wait, daemon=True)
    try:
        waiting.start()
        deadline = time.monotonic() + 10
        while not accepted:  # the listener's connect is under way, and will not be answered
            assert time.monotonic() < deadline
            time.sleep(0.01)
        started = time.monotonic()
        listener.close()
        assert time.monotonic() - started < 2.0
        with pytest.raises(StoreError) as caught:
            listener.wait(0.01)
        assert caught.value.code == "store_unavailable" and "closed" in caught.value.message
    finally:
        for sock in accepted:
            sock.close()  # the connect fails now; a connection it made after the close is closed, not kept
        silent.close()
        waiting.join(timeout=10)
    assert not waiting.is_alive() and not listener.listening
