"""An admission's writes travel with its COMMIT on PostgreSQL: what that must not change.

``service.run`` is one transaction.  The first admission of a definition
that a store makes takes two round trips: ``BEGIN`` with the statement that
reads the admission's facts, then the decision's one write statement,
``NOTIFY`` and ``COMMIT`` in one pipelined exchange
(``_PostgresBackend.write_last``, ``commit_kept``).  Every later one takes
one: decided on predicted facts (the identity free, the latest revision that
store last read, the moment ``PREDICTED_AT``), its ``BEGIN``, write
statement, ``NOTIFY`` and ``COMMIT`` go in one exchange, and the statement
checks each prediction where it writes (``PostgresStore.admit_run``).  The
writes' result is then only known at the commit, so these tests pin what
must hold anyway:

- an admission in one exchange writes exactly what one decided on read facts
  writes, at the database's time, and returns the kernel's decision at it;
  the kernel's ``admit`` at ``PREDICTED_AT`` is its decision at any moment
  with that moment written in (what the store relies on);
- a revision registered by another process since, a repeated identity, an
  input that carries the predicted moment's text: each is decided on read
  facts, with the answer a read would give, and nothing else written;
- many stores admitting one identity in one exchange each: one execution;

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

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import pq

from fencekeeper.adapters import codec, examples, postgres_store, service
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


def _tables(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s AND table_type = 'BASE TABLE'",
            (schema,),
        )
    ]


def _database(pg_dsn: str, schema: str) -> dict[str, list[str]]:
    """Every row of every table of the schema, as text, sorted: the database as a client cannot see it."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        tables = _tables(conn, schema)
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
        # Decided on predicted facts, then twice on read ones, each time failing on the taken id:
        # today's answer to a conflict the facts cannot see, as when the writes were sent before the commit.
        assert raised.value.code == "guard_conflict", raised.value
        assert len(failures) == 3 and all(isinstance(f, _GuardFailed) for f in failures), failures
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


@pytest.mark.parametrize("predicted", [True, False], ids=["predicted", "read"])
def test_a_connection_lost_before_the_kept_write_is_store_unavailable(
    pg_dsn: str, pg_schema: str, store: PostgresStore, predicted: bool
) -> None:
    assert isinstance(_run(store, "x-0", "o-0"), p.Decision)
    if not predicted:
        # No revision known: the facts are read, in the transaction the session is ended in.
        store._heads.clear()
    with store._pool.connection() as conn:
        pid = conn.info.backend_pid
    before = _database(pg_dsn, pg_schema)
    definition = store.load_definition(BUSINESS, "two-node")
    assert definition is not None

    def make(killing: Callable[[], None]) -> Callable[[Definition], Any]:
        def build(found: Definition) -> tuple[p.AdmitRequest, list[Evidence]]:
            # Before the admission's writes are sent (after its facts were read, or predicted): the session ends.
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


# --- admissions in one exchange (PostgresStore.admit_run) ------------------------------

_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?(\+00(:00)?)?")


def _written_for(pg_dsn: str, schema: str, execution_id: str) -> dict[str, list[str]]:
    """Every row an admission of ``execution_id`` wrote, its id, times, message id and sequence numbers made alike."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        found = {}
        for table in _tables(conn, schema):
            rows = [str(r[0]) for r in conn.execute(f'SELECT (to_jsonb(t) - \'seq\')::text FROM "{schema}"."{table}" t')]
            mine = [r for r in rows if f'"{execution_id}' in r]
            if mine:
                found[table] = sorted(
                    re.sub(r"/1/[0-9a-f]{16}", "/1/H", _TIME.sub("T", r)).replace(execution_id, "X") for r in mine
                )
        return found


def _exchanges(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each exchange the store's admissions send, by kind: ``read`` (a statement's own) or ``kept`` (writes and COMMIT)."""
    sent: list[str] = []
    run, kept = postgres_store._run, postgres_store._run_kept

    def counted_run(*args: Any, **kwargs: Any) -> Any:
        sent.append("read")
        return run(*args, **kwargs)

    def counted_kept(*args: Any, **kwargs: Any) -> Any:
        sent.append("kept, begun" if kwargs.get("begin") else "kept")
        return kept(*args, **kwargs)

    monkeypatch.setattr(postgres_store, "_run", counted_run)
    monkeypatch.setattr(postgres_store, "_run_kept", counted_kept)
    return sent


def test_an_admission_in_one_exchange_writes_what_one_decided_on_read_facts_writes(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = _exchanges(monkeypatch)
    assert isinstance(_run(store, "x-0", "o"), p.Decision)
    # The first reads its facts (BEGIN and the read), then the revision's body, not yet in the
    # store's memory; then the writes, NOTIFY and COMMIT.
    assert sent == ["read", "read", "kept"], sent
    sent.clear()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        before = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        decided = _run(store, "x-1", "o")
        after = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    # The next is one exchange: BEGIN, the writes, NOTIFY and COMMIT.
    assert sent == ["kept, begun"], sent
    assert _written_for(pg_dsn, pg_schema, "x-1") == _written_for(pg_dsn, pg_schema, "x-0")
    assert isinstance(decided, p.Decision), decided
    # At the database's time, the statement's own, and everywhere the decision has its time.
    assert decided.dispatch is not None and len(decided.evidence) == 1
    at = decided.evidence[0].at
    assert before < at < after and decided.dispatch.eligible_at == at
    view = store.read("x-1")
    assert view is not None
    assert (view.execution, view.dispatch, view.history) == (decided.execution, decided.dispatch, decided.evidence)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT at, payload FROM "{pg_schema}".outbox WHERE subject_id = %s', ("x-1",)).fetchall()
    assert [(r[0], json.loads(r[1])["at"]) for r in rows] == [(at, codec.encode_time(at))]


def test_a_revision_registered_since_is_pinned_not_the_one_predicted(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(_run(store, "x-0", "o"), p.Decision)
    other = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        service.register(other, parse_definition(TWO_NODE.replace("revision = 1", "revision = 2")), BUSINESS, PRINCIPAL, POLICY)
    finally:
        other.close()
    failures = _kept_failures(monkeypatch)
    decided = _run(store, "x-1", "o")
    # Predicted at revision 1, refused by the statement's guard, decided again on read facts.
    assert len(failures) == 1 and isinstance(failures[0], _GuardFailed), failures
    assert isinstance(decided, p.Decision) and decided.execution.definition_revision == 2, decided
    view = store.read("x-1")
    assert view is not None and view.execution == decided.execution and len(view.history) == 1
    # Learned: the next is predicted at revision 2, and holds.
    failures.clear()
    third = _run(store, "x-2", "o")
    assert isinstance(third, p.Decision) and third.execution.definition_revision == 2 and failures == []
    assert store.execution_ids() == ["x-0", "x-1", "x-2"]


def test_a_revision_asked_for_is_pinned_in_one_exchange_and_one_not_registered_is_not_found(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service.register(store, parse_definition(TWO_NODE.replace("revision = 1", "revision = 2")), BUSINESS, PRINCIPAL, POLICY)
    assert isinstance(_run(store, "x-0", "o"), p.Decision)
    assert store.load_definition(BUSINESS, "two-node", 1) is not None  # in memory: revision 1 can be predicted
    sent = _exchanges(monkeypatch)

    def run(execution_id: str, revision: int) -> p.Outcome:
        return service.run(
            store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-node",
            input={"order_id": "o"}, execution_id=execution_id, revision=revision,
        )

    first = run("x-1", 1)
    assert isinstance(first, p.Decision) and first.execution.definition_revision == 1, first
    assert sent == ["kept, begun"], sent
    before = _database(pg_dsn, pg_schema)
    with pytest.raises(service.OperationError) as raised:
        run("x-2", 3)
    assert raised.value.code == "definition_not_found", raised.value
    assert _database(pg_dsn, pg_schema) == before


def test_a_repeated_admission_gets_the_answer_a_read_gives_and_writes_nothing(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(_run(store, "x-0", "o"), p.Decision)
    assert isinstance(_run(store, "x-1", "o"), p.Decision)
    before = _database(pg_dsn, pg_schema)
    failures = _kept_failures(monkeypatch)
    asked: list[str] = []
    check = POLICY.check

    def counted(principal_id: str, business_id: str, operation: str, targets: Any = ()) -> p.Authority:
        asked.append(operation)
        return check(principal_id, business_id, operation, targets)

    monkeypatch.setattr(POLICY, "check", counted)
    again = _run(store, "x-1", "o")
    # The identity's unique key refused the predicted writes; the read facts find the execution,
    # decided on the request already made: its authority was asked once.
    assert len(failures) == 1 and isinstance(failures[0], _GuardFailed), failures
    assert asked == ["workflow_run"], asked
    monkeypatch.undo()
    fresh = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        assert _run(fresh, "x-1", "o") == again  # a store that predicts nothing answers the same
    finally:
        fresh.close()
    assert isinstance(again, p.Refusal) and again.code == p.RefusalCode.ALREADY_EXISTS, again
    assert _database(pg_dsn, pg_schema) == before


def test_an_input_carrying_the_predicted_moment_is_decided_on_read_facts_and_kept_as_given(
    pg_dsn: str, pg_schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(_run(store, "x-0", "o"), p.Decision)
    moment = codec.encode_time(postgres_store.PREDICTED_AT)
    sent = _exchanges(monkeypatch)
    text = f'"at":"{moment}"'
    decided = _run(store, "x-1", text)
    # Its text is written as given, never as the admission's time: decided on read facts.
    assert sent == ["read", "kept"], sent
    assert isinstance(decided, p.Decision), decided
    view = store.read("x-1")
    assert view is not None and [e.body["input"] for e in view.evidence] == [{"order_id": text}]


def test_a_derived_moment_is_never_written_as_predicted() -> None:
    # A value the decision derived from the predicted moment other than itself (a deadline after
    # it, say) could not be rewritten as the database's time: the admission is decided on read facts.
    parts = ("INSERT INTO t (a, b) VALUES (%s, %s)",)
    later = postgres_store.PREDICTED_AT + timedelta(seconds=5)
    with pytest.raises(postgres_store._CannotPredict):
        postgres_store._predicted_statement(parts, [postgres_store.PREDICTED_AT, later], ("d", BUSINESS, 1, 1))
    day = postgres_store.PREDICTED_AT.date().isoformat()
    with pytest.raises(postgres_store._CannotPredict):
        postgres_store._predicted_statement(parts, [postgres_store.PREDICTED_AT, f"due {day}"], ("d", BUSINESS, 1, 1))
    statement, values = postgres_store._predicted_statement(parts, [postgres_store.PREDICTED_AT, "kept"], ("d", BUSINESS, 1, 1))
    assert "VALUES ((SELECT at FROM fencekeeper_now), %s)" in statement
    assert values == ["kept", "d", BUSINESS, 1, 1]


def test_many_stores_admitting_one_identity_in_one_exchange_each_admit_it_once(pg_dsn: str, pg_schema: str, store: PostgresStore) -> None:
    stores = [PostgresStore(pg_dsn, schema=pg_schema, pool_size=1) for _ in range(6)]
    try:
        for n, each in enumerate(stores):
            assert isinstance(_run(each, f"x-learn-{n}", "o"), p.Decision)  # each now predicts
        gate = threading.Barrier(len(stores))
        outcomes: list[Any] = [None] * len(stores)

        def admit(n: int) -> None:
            gate.wait()
            outcomes[n] = _run(stores[n], "x-same", f"o-{n}")

        threads = [threading.Thread(target=admit, args=(n,)) for n in range(len(stores))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for each in stores:
            each.close()
    decisions = [o for o in outcomes if isinstance(o, p.Decision)]
    refusals = [o for o in outcomes if isinstance(o, p.Refusal)]
    assert len(decisions) == 1 and len(refusals) == len(stores) - 1, outcomes
    assert all(r.code == p.RefusalCode.ALREADY_EXISTS for r in refusals), refusals
    view = store.read("x-same")
    assert view is not None and len(view.history) == 1
    winner = outcomes.index(decisions[0])
    assert [e.body["input"]["order_id"] for e in view.evidence] == [f"o-{winner}"]


def _moment_written(value: Any, at: datetime) -> Any:
    """``value`` (attrs.asdict of a decision) with every ``PREDICTED_AT`` in it replaced by ``at``."""
    if value == postgres_store.PREDICTED_AT:
        return at
    if isinstance(value, dict):
        return {k: _moment_written(v, at) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_moment_written(v, at) for v in value)
    return value


@settings(max_examples=200, deadline=None)
@given(
    at=st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
    execution_id=st.sampled_from(["x-1", "e/2", "order-ñ"]),
    granted=st.booleans(),
)
def test_an_admission_at_the_predicted_moment_is_the_admission_at_any_moment_with_it_written_in(
    at: datetime, execution_id: str, granted: bool
) -> None:
    # What the store relies on (specs/protocol.md, "An admission decided on predicted facts"):
    # admit uses its time only to record it, so the decision at the database's moment is the
    # one at PREDICTED_AT with that moment written where PREDICTED_AT stands, and nothing else.
    request = p.AdmitRequest(execution_id, BUSINESS, "two-node", 1, "ship", p.Authority(granted, "ops"))
    predicted = p.admit(None, request, postgres_store.PREDICTED_AT, id_taken=False)
    decided = p.admit(None, request, at, id_taken=False)
    assert type(predicted) is type(decided)
    if isinstance(decided, p.Decision):
        assert isinstance(predicted, p.Decision)
        assert _moment_written(attrs.asdict(predicted, recurse=True), at) == attrs.asdict(decided, recurse=True)
    else:
        assert predicted == decided
