"""The SQLite and PostgreSQL journal stores: append-only, atomic, compare-and-set on the head, replayable.

Every test runs against both stores (PostgreSQL where a server is
reachable; see tests/conftest.py).  "Restart" is a new store object on the
same database, which has nothing cached.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from fencekeeper.adapters import journal_fixtures as fx
from fencekeeper.adapters.journal_store import JournalStore, SQLiteJournalStore
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.journal_codes import JournalError
from fencekeeper.kernel.machines import NodeEvent, NodeState

Opener = Callable[[], JournalStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[JournalStore] = []
    clock = ManualClock(fx.T0)
    if request.param == "sqlite":
        path = tmp_path / "journal.db"

        def make() -> JournalStore:
            store = SQLiteJournalStore(path, clock=clock)
            opened.append(store)
            return store
    else:
        from fencekeeper.adapters.journal_postgres import PostgresJournalStore  # noqa: PLC0415

        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")

        def make() -> JournalStore:
            store = PostgresJournalStore(dsn, schema=schema, clock=clock)
            opened.append(store)
            return store

    make.sql = _sql_runner(request.param, tmp_path, request)  # type: ignore[attr-defined]
    yield make
    for store in opened:
        store.close()


def _sql_runner(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], None]:
    if kind == "sqlite":

        def run(statement: str) -> None:
            conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
            try:
                conn.executescript(statement)
            finally:
                conn.close()

        return run
    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")

    def run_pg(statement: str) -> None:
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    return run_pg


class StoreScript(fx.Script):
    """The example's script, with every command appended through a store instead of the bare kernel."""

    def __init__(self, store: JournalStore, journal: j.Journal) -> None:
        super().__init__(journal)
        self.store = store

    def send(self, command: j.Command) -> j.Appended:
        outcome = self.store.append(self.journal.execution_id, command)
        assert isinstance(outcome, j.Appended), outcome
        self.journal = outcome.journal
        return outcome


def created(store: JournalStore, execution_id: str = "review-1") -> j.Journal:
    journal = fx.new(execution_id).journal
    store.create(journal)
    return journal


def test_a_journal_survives_a_restart_byte_for_byte(open_store: Opener) -> None:
    store = open_store()
    script = fx.review(StoreScript(store, created(store)))
    script.send(fx.invalidation(script))
    script.send(fx.binding(script, fx.successor_journal().journal))
    expected = script.journal

    restarted = open_store()
    chain = restarted.stored("review-1")
    assert chain is not None
    assert chain.header == j.encode_header(expected.header)
    assert list(chain.events) == [j.encode_event(e) for e in expected.events]
    assert (chain.head, chain.length) == (expected.head, len(expected.events))
    loaded = restarted.load("review-1")
    assert loaded is not None
    assert loaded.head == expected.head
    assert dict(loaded.states) == dict(expected.states)
    assert dict(loaded.attempts) == dict(expected.attempts)
    assert restarted.execution_ids() == ["review-1"]
    assert restarted.load("nobody") is None


def test_two_concurrent_appenders_exactly_one_wins(open_store: Opener) -> None:
    first, second = open_store(), open_store()
    journal = created(first)
    assert second.load("review-1") is not None  # both now hold the same head
    barrier = threading.Barrier(2)
    outcomes: dict[str, j.Outcome] = {}

    def append(name: str, store: JournalStore, actor: str) -> None:
        command = j.Transition(
            request_id=f"start-by-{name}", expected_head=journal.head, node_id="search",
            event=NodeEvent.WORK_STARTED, prior_state=NodeState.READY, actor_id=actor, role="searcher",
            attempt=j.AttemptRef(f"search-{name}", 1),
        )  # fmt: skip
        barrier.wait()
        outcomes[name] = store.append("review-1", command)

    threads = [
        threading.Thread(target=append, args=("one", first, "bot:search")),
        threading.Thread(target=append, args=("two", second, "bot:search")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [name for name, o in outcomes.items() if isinstance(o, j.Appended)]
    lost = [o for o in outcomes.values() if isinstance(o, j.Refusal)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert lost[0].code is C.STALE_HEAD
    loaded = open_store().load("review-1")
    assert loaded is not None
    assert len(loaded.events) == 1
    assert loaded.events[0].request_id == f"start-by-{won[0]}"


def test_a_writer_behind_the_database_is_refused_not_rebased(open_store: Opener) -> None:
    first, second = open_store(), open_store()
    journal = created(first)
    assert second.load("review-1") is not None
    start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    appended = first.append("review-1", start)
    assert isinstance(appended, j.Appended)
    # second's cache is behind; a command that expected the old head is stale ...
    other = j.Transition("b", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-2", 1))  # fmt: skip
    refused = second.append("review-1", other)
    assert isinstance(refused, j.Refusal) and refused.code is C.STALE_HEAD
    # ... one that names the new head is accepted, though second had not seen it ...
    block = j.Transition("c", appended.journal.head, "search", NodeEvent.WORK_BLOCKED, NodeState.ACTIVE, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    assert isinstance(second.append("review-1", block), j.Appended)
    # ... and first's repeat of its own request is recognised as a repeat.
    assert isinstance(first.append("review-1", start), j.Unchanged)


def test_a_refusal_or_a_repeat_writes_nothing(open_store: Opener) -> None:
    store = open_store()
    journal = created(store)
    start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    assert isinstance(store.append("review-1", start), j.Appended)
    before = store.stored("review-1")
    forged = j.Transition("b", store.stored("review-1").head, "search", NodeEvent.WORK_BLOCKED,  # type: ignore[union-attr]
                          NodeState.ACTIVE, "mallory", "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    refused = store.append("review-1", forged)
    assert isinstance(refused, j.Refusal) and refused.code is C.FORGED_ROLE
    assert isinstance(store.append("review-1", start), j.Unchanged)
    assert open_store().stored("review-1") == before


def test_create_refuses_an_existing_journal(open_store: Opener) -> None:
    store = open_store()
    created(store)
    with pytest.raises(StoreError) as caught:
        open_store().create(fx.new("review-1", start=fx.T0 + timedelta(hours=1)).journal)
    assert caught.value.code == "journal_exists"


def test_headers_and_events_are_append_only(open_store: Opener) -> None:
    store = open_store()
    journal = created(store)
    start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    assert isinstance(store.append("review-1", start), j.Appended)
    run: Callable[[str], None] = open_store.sql  # type: ignore[attr-defined]
    for statement in (
        "UPDATE journal_events SET digest = 'x'",
        "DELETE FROM journal_events",
        "UPDATE journal_headers SET digest = 'x'",
        "DELETE FROM journal_headers",
    ):
        with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="append-only"):
            run(statement)


def test_a_head_row_that_disagrees_with_the_chain_is_reported(open_store: Opener) -> None:
    store = open_store()
    journal = created(store)
    start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    assert isinstance(store.append("review-1", start), j.Appended)
    run: Callable[[str], None] = open_store.sql  # type: ignore[attr-defined]
    # Roll the guard back to the header, as if the last event had been lost.
    run(f"UPDATE journal_heads SET head = '{journal.head}', length = 0")
    with pytest.raises(JournalError) as caught:
        open_store().load("review-1")
    assert caught.value.reason is C.BROKEN_CHAIN


def test_records_are_the_times_of_the_store_clock(open_store: Opener) -> None:
    store = open_store()
    journal = created(store)
    clock = store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(timedelta(minutes=5))
    start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    appended = store.append("review-1", start)
    assert isinstance(appended, j.Appended)
    assert appended.events[0].at == j.format_time(fx.T0 + timedelta(minutes=5))
