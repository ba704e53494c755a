"""The SQLite and PostgreSQL journal stores: the shipped conformance suite, and what each does with its SQL.

Each store runs every test of ``fencekeeper.adapters.testing.journal.JournalStoreTests``
(PostgreSQL where a server is reachable; see tests/conftest.py), then the
tests of their SQL: the header and event tables refuse UPDATE and DELETE,
the head row refuses DELETE and any UPDATE that does not move it forward,
and a head row that disagrees with the chain is reported on load.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from fencekeeper.adapters import journal_fixtures
from fencekeeper.adapters.journal_store import JournalStore, JournalStoreBase, SQLiteJournalStore
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.journal import JournalStoreTests, Opener, StoreScript, created
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.common import MAX_RATIONALE
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.journal_codes import JournalError
from fencekeeper.kernel.machines import NodeEvent, NodeState


def _a_cache_one_event_behind(open_store: Opener) -> tuple[JournalStore, j.Transition]:
    """A store whose cache ends at event 1 while another appended event 2, and the command it appends next.

    Appending that command makes the first store catch its cache up: it reads
    event 2's row, which the tests then alter.
    """
    writer = open_store()
    journal = created(writer)
    attempt = j.AttemptRef("s-1", 1)
    start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=attempt)  # fmt: skip
    first = writer.append("review-1", start)
    assert isinstance(first, j.Appended)
    block = j.Transition("b", first.journal.head, "search", NodeEvent.WORK_BLOCKED, NodeState.ACTIVE,
                         "bot:search", "searcher", attempt=attempt)  # fmt: skip
    blocked = open_store().append("review-1", block)
    assert isinstance(blocked, j.Appended)
    clear = j.Transition("c", blocked.journal.head, "search", NodeEvent.BLOCK_CLEARED, NodeState.BLOCKED,
                         "bot:search", "searcher", attempt=attempt)  # fmt: skip
    return writer, clear


class SqlTests:
    """Tests of what a SQL journal store does beyond the port; subclasses provide ``sql``."""

    def test_headers_and_events_are_append_only(self, open_store: Opener, sql: Callable[[str], None]) -> None:
        store = open_store()
        journal = created(store)
        start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                             "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        assert isinstance(store.append("review-1", start), j.Appended)
        for statement in (
            "UPDATE journal_events SET digest = 'x'",
            "DELETE FROM journal_events",
            "UPDATE journal_headers SET digest = 'x'",
            "DELETE FROM journal_headers",
        ):
            with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="append-only"):
                sql(statement)

    def test_the_head_row_is_never_deleted_and_moves_only_forward(
        self, open_store: Opener, sql: Callable[[str], None]
    ) -> None:
        store = open_store()
        journal = created(store)
        start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                             "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        first = store.append("review-1", start)
        assert isinstance(first, j.Appended)
        # Without its head row a journal cannot be appended to or loaded; moved
        # back (or not at all) it would accept a writer that expects an old head.
        for statement in (
            "DELETE FROM journal_heads",
            "DELETE FROM journal_heads WHERE execution_id = 'review-1'",
            f"UPDATE journal_heads SET head = '{journal.head}', length = 0",
            "UPDATE journal_heads SET head = 'sha256:forged'",
            "UPDATE journal_heads SET execution_id = 'review-2'",
        ):
            with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="journal_heads"):
                sql(statement)
        # Appends still move it, and the journal loads as it was.
        block = j.Transition("b", first.journal.head, "search", NodeEvent.WORK_BLOCKED, NodeState.ACTIVE,
                             "bot:search", "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        assert isinstance(store.append("review-1", block), j.Appended)
        loaded = open_store().load("review-1")
        assert loaded is not None and len(loaded.events) == 2

    def test_a_head_row_that_disagrees_with_the_chain_is_reported(
        self, open_store: Opener, sql: Callable[[str], None]
    ) -> None:
        store = open_store()
        journal = created(store)
        start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                             "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        assert isinstance(store.append("review-1", start), j.Appended)
        # The guard lets the head row move forward to anything (the chain, not
        # the row, says where it may go): moved past the events, as if an
        # event had been lost, it disagrees with the chain, and a load says so.
        sql(f"UPDATE journal_heads SET head = 'sha256:{'0' * 64}', length = 2")
        with pytest.raises(JournalError) as caught:
            open_store().load("review-1")
        assert caught.value.reason is C.BROKEN_CHAIN


    def test_a_successor_binding_written_past_the_kernel_is_checked_on_load(self, open_store: Opener) -> None:
        # A forged binding (every digest right) to ghost-9, which no stored
        # header is, written by a faulty writer straight into the tables: a
        # load checks it against the stored headers, as an append would have.
        store = open_store()
        created(store)
        case = next(c for c in journal_fixtures.cases() if c.name == "successor-unknown")
        assert case.lines[0] == store.stored("review-1").header  # type: ignore[union-attr]
        events = [j.decode_event(line) for line in case.lines[1:]]
        assert isinstance(store, JournalStoreBase)
        written = list(zip(events, case.lines[1:], strict=True))
        assert store._commit_events("review-1", json.loads(case.lines[0])["digest"], written, len(events))
        for opened in (open_store(), store):
            with pytest.raises(JournalError) as caught:
                opened.load("review-1")
            assert (caught.value.reason, caught.value.ordinal) == (C.BAD_SUCCESSOR_BINDING, case.ordinal)


    def test_a_chain_stored_with_longer_text_before_the_bound_loads_and_takes_appends(self, open_store: Opener) -> None:
        # The bound on free text is an append-time check: a chain an earlier
        # release stored with longer text loads, catches up and is appended
        # to, and a request it recorded is still a repeat.
        store = open_store()
        created(store)
        assert isinstance(store, JournalStoreBase)
        case = next(c for c in journal_fixtures.cases() if c.name == "valid-long-text")
        assert case.lines[0] == store.stored("review-1").header  # type: ignore[union-attr]
        events = [j.decode_event(line) for line in case.lines[1:]]
        assert store._commit_events("review-1", events[0].previous, list(zip(events, case.lines[1:], strict=True)), len(events))
        failure = next(e for e in events if e.event is NodeEvent.WORK_FAILED)
        assert min(len(failure.rationale), len(failure.error or "")) > MAX_RATIONALE
        again = j.Transition(failure.request_id, failure.previous, "search", NodeEvent.WORK_FAILED, NodeState.ACTIVE,
                             failure.actor_id, failure.role, failure.rationale, failure.attempt, error=failure.error)  # fmt: skip
        ready = j.Transition("ready-a", events[-1].digest, "screen-a", NodeEvent.DEPENDENCIES_SATISFIED,
                             NodeState.PENDING, "bot:search", "scheduler")  # fmt: skip
        loaded = open_store().load("review-1")
        assert loaded is not None and loaded.head == case.expect["head"]  # type: ignore[index]
        # The store that created it catches its cache up by replaying the rows it had not seen.
        assert isinstance(store.append("review-1", again), j.Unchanged)
        over = store.append("review-1", attrs.evolve(ready, rationale=failure.rationale))
        assert isinstance(over, j.Refusal) and over.code is C.INVALID_REQUEST
        appended = open_store().append("review-1", ready)
        assert isinstance(appended, j.Appended)
        assert open_store().load("review-1").head == appended.journal.head  # type: ignore[union-attr]

    @pytest.mark.parametrize(("table", "where", "ordinal"), [
        ("journal_events", "ordinal = 2", 2),
        ("journal_headers", "execution_id = 'review-1'", 0),
    ])  # fmt: skip
    def test_a_digest_column_that_disagrees_with_its_record_is_altered_digest(
        self, open_store: Opener, rewrite: Callable[[str, str], None], table: str, where: str, ordinal: int
    ) -> None:
        store = open_store()
        created(store)
        assert isinstance(store, JournalStoreBase)
        case = next(c for c in journal_fixtures.cases() if c.name == "valid-review")
        written = [(j.decode_event(line), line) for line in case.lines[1:4]]
        assert store._commit_events("review-1", json.loads(case.lines[0])["digest"], written, 3)
        before = open_store().stored("review-1")
        rewrite(table, f"UPDATE {table} SET digest = 'sha256:{'0' * 64}' WHERE {where}")
        for opened in (open_store(), store):
            with pytest.raises(JournalError) as caught:
                opened.load("review-1")
            assert (caught.value.reason, caught.value.ordinal) == (C.ALTERED_DIGEST, ordinal), caught.value
            assert "digest column" in caught.value.detail
        # Only the column was changed: the records are what they were, and are not rewritten.
        after = open_store().stored("review-1")
        assert before is not None and after is not None
        assert (after.header, after.events, after.head) == (before.header, before.events, before.head)
        assert (after.header_digest, *after.event_digests) != (before.header_digest, *before.event_digests)

    @pytest.mark.parametrize(("setting", "where", "ordinal"), [
        ("ordinal = 103", "ordinal = 3", 3),
        # Every row from the second on moved up: the rows' order is the records' still.
        ("ordinal = ordinal + 100", "ordinal >= 2", 2),
    ])  # fmt: skip
    def test_an_ordinal_column_that_disagrees_with_its_record_is_ordinal_gap(
        self, open_store: Opener, rewrite: Callable[[str, str], None], setting: str, where: str, ordinal: int
    ) -> None:
        store = open_store()
        created(store)
        assert isinstance(store, JournalStoreBase)
        case = next(c for c in journal_fixtures.cases() if c.name == "valid-review")
        written = [(j.decode_event(line), line) for line in case.lines[1:4]]
        assert store._commit_events("review-1", json.loads(case.lines[0])["digest"], written, 3)
        before = open_store().stored("review-1")
        rewrite("journal_events", f"UPDATE journal_events SET {setting} WHERE {where}")
        for opened in (open_store(), store):
            with pytest.raises(JournalError) as caught:
                opened.load("review-1")
            assert (caught.value.reason, caught.value.ordinal) == (C.ORDINAL_GAP, ordinal), caught.value
            assert f"ordinal column holds {ordinal + 100}, but the record's ordinal is {ordinal}" in caught.value.detail
        after = open_store().stored("review-1")
        assert before is not None and after is not None
        assert (after.events, after.event_digests) == (before.events, before.event_digests)

    @pytest.mark.parametrize(("name", "moved", "refused"), [
        # Replay refuses event 7 by its rules, which come after its ordinal: the column is named.
        ("forged-role", 7, (C.ORDINAL_GAP, 7)),
        ("forged-role", 5, (C.ORDINAL_GAP, 5)),
        # A record of another execution is refused before its ordinal is looked at.
        ("cross-execution-splice", 3, (C.FOREIGN_RECORD, 3)),
        ("cross-execution-splice", 2, (C.ORDINAL_GAP, 2)),
    ])  # fmt: skip
    def test_an_ordinal_column_is_compared_where_replay_compares_the_ordinal(
        self, open_store: Opener, rewrite: Callable[[str, str], None], name: str, moved: int, refused: tuple[C, int]
    ) -> None:
        store = open_store()
        created(store)
        assert isinstance(store, JournalStoreBase)
        case = next(c for c in journal_fixtures.cases() if c.name == name)
        assert case.lines[0] == store.stored("review-1").header  # type: ignore[union-attr]
        written = [(j.decode_event(line), line) for line in case.lines[1:]]
        assert store._commit_events("review-1", json.loads(case.lines[0])["digest"], written, len(written))
        rewrite("journal_events", f"UPDATE journal_events SET ordinal = ordinal + 100 WHERE ordinal >= {moved}")
        with pytest.raises(JournalError) as caught:
            open_store().load("review-1")
        assert (caught.value.reason, caught.value.ordinal) == refused, caught.value

    def test_catching_a_cache_up_holds_the_new_rows_ordinal_columns(
        self, open_store: Opener, rewrite: Callable[[str, str], None]
    ) -> None:
        writer, clear = _a_cache_one_event_behind(open_store)
        rewrite("journal_events", "UPDATE journal_events SET ordinal = 100 WHERE ordinal = 2")
        # writer's cache ends at event 1: it reads event 2 (its row now past 100) to catch up, and refuses it.
        with pytest.raises(JournalError) as caught:
            writer.append("review-1", clear)
        assert (caught.value.reason, caught.value.ordinal) == (C.ORDINAL_GAP, 2)
        chain = open_store().stored("review-1")
        assert chain is not None and chain.length == 2 and len(chain.events) == 2

    def test_the_header_lookup_holds_the_digest_column_to_the_header(
        self, open_store: Opener, rewrite: Callable[[str, str], None]
    ) -> None:
        store = open_store()
        script = journal_fixtures.review(StoreScript(store, created(store)))
        script.send(journal_fixtures.invalidation(script))
        successor = journal_fixtures.successor_journal().journal
        store.create(successor)
        rewrite("journal_headers", f"UPDATE journal_headers SET digest = 'sha256:{'0' * 64}' "
                "WHERE execution_id = 'review-2'")  # fmt: skip
        for opened in (open_store(), store):
            with pytest.raises(JournalError) as caught:
                opened.header("review-2")
            assert (caught.value.reason, caught.value.ordinal) == (C.ALTERED_DIGEST, 0), caught.value
            assert caught.value.detail == (
                f"the row's digest column holds 'sha256:{'0' * 64}', but the record's digest is "
                f"{successor.header.digest}: one of them was changed outside the store"
            )
        # The record itself is the successor's: only its row's column betrays it, and the binding is refused.
        refused = store.append("review-1", journal_fixtures.binding(script, successor))
        assert isinstance(refused, j.Refusal) and refused.code is C.BAD_SUCCESSOR_BINDING, refused
        assert "its header cannot be read: the row's digest column holds" in refused.message
        assert open_store().header("review-1") is not None

    def test_catching_a_cache_up_holds_the_new_rows_digest_columns(
        self, open_store: Opener, rewrite: Callable[[str, str], None]
    ) -> None:
        writer, clear = _a_cache_one_event_behind(open_store)
        rewrite("journal_events", f"UPDATE journal_events SET digest = 'sha256:{'0' * 64}' WHERE ordinal = 2")
        # writer's cache ends at event 1: it reads event 2 to catch up, and refuses it as a load would.
        with pytest.raises(JournalError) as caught:
            writer.append("review-1", clear)
        assert (caught.value.reason, caught.value.ordinal) == (C.ALTERED_DIGEST, 2)
        chain = open_store().stored("review-1")
        assert chain is not None and chain.length == 2

    def test_a_cache_catching_up_names_the_first_bad_record_as_a_load_does(
        self, open_store: Opener, rewrite: Callable[[str, str], None]
    ) -> None:
        writer, clear = _a_cache_one_event_behind(open_store)
        # Both rows altered: event 1, which writer's cache already holds, and event 2, which it reads to catch up.
        rewrite("journal_events", f"UPDATE journal_events SET digest = 'sha256:{'0' * 64}' WHERE ordinal IN (1, 2)")
        with pytest.raises(JournalError) as loaded:
            open_store().load("review-1")
        assert (loaded.value.reason, loaded.value.ordinal) == (C.ALTERED_DIGEST, 1)
        # The catch-up named event 2, the first bad record of the rows it read, where a load names event 1.
        with pytest.raises(JournalError) as caught:
            writer.append("review-1", clear)
        assert (caught.value.reason, caught.value.ordinal, caught.value.detail) == (
            loaded.value.reason, loaded.value.ordinal, loaded.value.detail
        )
        chain = open_store().stored("review-1")
        assert chain is not None and chain.length == 2

    @pytest.mark.parametrize("count", [1, 3])
    def test_a_commit_from_a_head_that_moved_writes_nothing(self, open_store: Opener, count: int) -> None:
        # One event and a batch take different statements; both are refused
        # by the head's compare-and-set, whole, and the head row stays put.
        store = open_store()
        created(store)
        assert isinstance(store, JournalStoreBase)
        case = next(c for c in journal_fixtures.cases() if c.name == "valid-review")
        lines = case.lines[1 : 1 + count]
        written = [(j.decode_event(line), line) for line in lines]
        root = json.loads(case.lines[0])["digest"]
        assert not store._commit_events("review-1", "sha256:" + "0" * 64, written, count)
        chain = store.stored("review-1")
        assert chain is not None and (chain.events, chain.head, chain.length) == ((), root, 0)
        assert store._commit_events("review-1", root, written, count)
        chain = store.stored("review-1")
        assert chain is not None and (chain.events, chain.head, chain.length) == (tuple(lines), written[-1][0].digest, count)
        # The head the commit moved from is now stale in its turn.
        assert not store._commit_events("review-1", root, written, count)
        assert open_store().load("review-1") is not None


class TestSQLiteJournalStore(JournalStoreTests, SqlTests):
    @pytest.fixture
    def open_store(self, tmp_path: Path, clock: ManualClock) -> Iterator[Opener]:
        opened: list[JournalStore] = []

        def make() -> JournalStore:
            opened.append(SQLiteJournalStore(tmp_path / "journal.db", clock=clock))
            return opened[-1]

        yield make
        for store in opened:
            store.close()

    @pytest.fixture
    def sql(self, tmp_path: Path) -> Callable[[str], None]:
        def run(statement: str) -> None:
            conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
            try:
                conn.executescript(statement)
            finally:
                conn.close()

        return run

    @pytest.fixture
    def rewrite(self, tmp_path: Path) -> Callable[[str, str], None]:
        """Run an UPDATE of ``table`` past its append-only trigger, putting the trigger back."""

        def run(table: str, statement: str) -> None:
            conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
            try:
                trigger = f"{table}_no_update"
                (saved,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (trigger,)).fetchone()
                conn.execute(f"DROP TRIGGER {trigger}")
                conn.execute(statement)
                conn.execute(saved)
            finally:
                conn.close()

        return run


class TestPostgresJournalStore(JournalStoreTests, SqlTests):
    @pytest.fixture
    def open_store(self, pg_dsn: str, pg_schema: str, clock: ManualClock) -> Iterator[Opener]:
        from fencekeeper.adapters.journal_postgres import PostgresJournalStore  # noqa: PLC0415

        opened: list[JournalStore] = []

        def make() -> JournalStore:
            opened.append(PostgresJournalStore(pg_dsn, schema=pg_schema, clock=clock))
            return opened[-1]

        yield make
        for store in opened:
            store.close()

    @pytest.fixture
    def sql(self, pg_dsn: str, pg_schema: str) -> Callable[[str], None]:
        def run(statement: str) -> None:
            with psycopg.connect(pg_dsn, autocommit=True, options=f"-c search_path={pg_schema}") as conn:
                conn.execute(statement)  # type: ignore[arg-type]

        return run

    @pytest.fixture
    def rewrite(self, pg_dsn: str, pg_schema: str) -> Callable[[str, str], None]:
        """Run an UPDATE of ``table`` with its append-only trigger disabled, enabling it again."""

        def run(table: str, statement: str) -> None:
            with psycopg.connect(pg_dsn, autocommit=True, options=f"-c search_path={pg_schema}") as conn:
                conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {table}_append_only")  # type: ignore[arg-type]
                conn.execute(statement)  # type: ignore[arg-type]
                conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER {table}_append_only")  # type: ignore[arg-type]

        return run


def test_a_killed_postgresql_connection_is_a_store_error_and_the_next_call_reconnects(pg_dsn: str, pg_schema: str) -> None:
    # Like the execution store: whichever call finds the connection dead fails
    # as StoreError('store_unavailable'), never psycopg's own error (which the
    # command line would report as an internal error).
    from fencekeeper.adapters.journal_postgres import PostgresJournalStore  # noqa: PLC0415

    name = f"fk-journal-kill-{pg_schema[-8:]}"
    stale = j.Transition("a", "sha256:" + "0" * 64, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                         "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
    calls: list[Callable[[PostgresJournalStore], object]] = [
        lambda store: store.header("review-1"),
        lambda store: store.execution_ids(),
        lambda store: store.stored("review-1"),
        # Refused on the cached journal: the store then reads the stored head.
        lambda store: store.append("review-1", stale),
    ]
    for call in calls:
        store = PostgresJournalStore(f"{pg_dsn}?application_name={name}", schema=pg_schema)
        try:
            if not store.execution_ids():
                created(store)
            assert store.load("review-1") is not None
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                killed = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchone()
            assert killed is not None and killed[0] == 1
            with pytest.raises(StoreError) as caught:
                call(store)
            assert caught.value.code == "store_unavailable"
            # The next call opens a new connection: a long-lived store outlives a lost one.
            assert store.execution_ids() == ["review-1"]
            head = store.load("review-1")
            assert head is not None
            state = head.states["search"]
            event = {NodeState.READY: NodeEvent.WORK_STARTED, NodeState.ACTIVE: NodeEvent.WORK_BLOCKED,
                     NodeState.BLOCKED: NodeEvent.BLOCK_CLEARED}[state]  # fmt: skip
            outcome = store.append("review-1", attrs.evolve(stale, request_id=f"after-{len(head.events)}",
                                                            expected_head=head.head, event=event, prior_state=state))  # fmt: skip
            assert isinstance(outcome, j.Appended), outcome
            assert PostgresJournalStore(pg_dsn, schema=pg_schema).load("review-1").head == outcome.journal.head
        finally:
            store.close()


def test_a_connection_lost_while_the_journal_store_opens_is_store_unavailable(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencekeeper.adapters import journal_postgres  # noqa: PLC0415

    real = journal_postgres.check_schema

    def cut_then_check(conn: psycopg.Connection[Any], schema: str) -> int:
        with psycopg.connect(pg_dsn, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        return real(conn, schema)

    monkeypatch.setattr(journal_postgres, "check_schema", cut_then_check)
    with pytest.raises(StoreError) as raised:
        journal_postgres.PostgresJournalStore(pg_dsn, schema=pg_schema)
    assert raised.value.code == "store_unavailable"


def test_a_sqlite_file_another_writer_holds_is_store_locked_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the executions' and operations' stores of the same file say it: the store is there and the write is refused
    # for now (store_locked, naming the holders; the command line's exit 1), not a store that cannot be used
    # (store_unavailable, exit 2).
    from fencekeeper.adapters import sqlite_store  # noqa: PLC0415

    path = tmp_path / "journal.db"
    real = sqlite_store._open
    # A fifth of a second's wait for the lock rather than the store's ten.
    monkeypatch.setattr(sqlite_store, "_open", lambda opened: real(opened, 0.2))
    store = SQLiteJournalStore(path)
    try:
        journal = created(store)
        before = store.stored("review-1")
        start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                             "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            for write in (lambda: store.append("review-1", start), lambda: created(store, "review-2")):
                with pytest.raises(StoreError) as caught:
                    write()
                assert caught.value.code == "store_locked", caught.value
                assert caught.value.message.startswith(f"{path}: the database is locked by another writer")
                assert "nothing was written" in caught.value.message
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert store.stored("review-1") == before
        assert store.execution_ids() == ["review-1"]
        # Once the holder is gone the same append goes through.
        assert isinstance(store.append("review-1", start), j.Appended)
    finally:
        store.close()
