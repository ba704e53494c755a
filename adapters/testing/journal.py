"""Conformance tests every journal store inherits: the journal port, append by append.

Subclass :class:`JournalStoreTests` and provide an ``open_store`` fixture:
a callable that opens the *same*, initially empty, database each time it is
called, with the store's clock reading ``clock`` (the fixture of that
name), and that closes what it opened at teardown.  Two objects it returns
are two writers on one database; a new one is a restart (nothing cached).
What the tests prove (the DAG node journal contract, seed 002: Typical developer
flow 5 and 6; specs/journal.md, Storage):

- a journal survives a restart byte for byte: the header and events are
  stored exactly as the kernel encoded them, the head row agrees, and
  replay reproduces the states, attempt history and head;
- of two writers appending concurrently from the same head exactly one
  wins and the other is refused ``stale_head``, with one event stored; four
  writers racing for 32 appends leave exactly the winners' events, and
  every loser was refused ``stale_head``;
- a writer whose cache is behind the database is refused when its command
  expected the old head, and accepted when it names the new one (never
  rebased), and a repeat of a request another writer stored is an
  idempotent repeat;
- a refusal and a repeat write nothing; a journal id is created once;
- a rationale or error over the bound (``MAX_RATIONALE`` characters) is
  refused ``invalid_request`` naming the field, and writes nothing;
- a batch of commands is appended whole or not at all;
- a successor binding is checked against the successor's stored header;
- a record's time is the store clock's;
- an execution id that is no identifier (empty, a NUL, a lone surrogate, a
  megabyte) names no journal on every store, and one that is not text is
  a TypeError naming it;
- a batch of no command, or of something that is not a command source, is
  an error naming ``commands``, and writes nothing;
- after ``close`` every call is ``StoreError('store_unavailable')`` saying
  the store is closed.

What a store does with its SQL (append-only triggers, the head row checked
on load) is its own business and tested beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import attrs
import pytest

from fencekeeper.adapters import journal_fixtures as fx
from fencekeeper.adapters.journal_store import JournalStore
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.common import MAX_RATIONALE
from fencekeeper.kernel.journal_codes import JournalCode as C
from fencekeeper.kernel.machines import NodeEvent, NodeState

Opener = Callable[[], JournalStore]


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


def _search_started(journal: j.Journal) -> j.Transition:
    """The first append a created journal takes: its ``search`` node started by its bot."""
    return j.Transition(
        request_id="start", expected_head=journal.head, node_id="search", event=NodeEvent.WORK_STARTED,
        prior_state=NodeState.READY, actor_id="bot:search", role="searcher", attempt=j.AttemptRef("search-1", 1),
    )  # fmt: skip


class JournalStoreTests:
    """The journal port's conformance tests; subclasses provide ``open_store``."""

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock(fx.T0)

    @pytest.fixture
    def open_store(self) -> Opener:
        raise NotImplementedError("a JournalStoreTests subclass provides the open_store fixture")

    def test_a_journal_survives_a_restart_byte_for_byte(self, open_store: Opener) -> None:
        store = open_store()
        script = fx.review(StoreScript(store, created(store)))
        script.send(fx.invalidation(script))
        successor = fx.successor_journal().journal
        # A binding is checked against the successor's header as stored.
        refused = store.append("review-1", fx.binding(script, successor))
        assert isinstance(refused, j.Refusal) and refused.code is C.BAD_SUCCESSOR_BINDING, refused
        store.create(successor)
        script.send(fx.binding(script, successor))
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
        assert restarted.execution_ids() == ["review-1", "review-2"]
        assert restarted.header("review-2") == successor.header
        assert restarted.header("nobody") is None
        assert restarted.load("nobody") is None

    def test_an_execution_id_that_is_no_identifier_names_no_journal_on_every_store(self, open_store: Opener) -> None:
        # Before: PostgreSQL raised its driver's DataError for a NUL (SQLite
        # answered None), both raised UnicodeEncodeError for a lone
        # surrogate, an id that was not text reached the SQL, and a refused
        # append quoted a megabyte id whole.
        store = open_store()
        journal = created(store)
        command = _search_started(journal)
        for bad in ("", "review-1\x00", "review\ud800", " review-1", "x" * 1_000_000):
            assert store.load(bad) is None and store.stored(bad) is None and store.header(bad) is None
            with pytest.raises(StoreError) as caught:
                store.append(bad, command)
            assert caught.value.code == "journal_not_found" and len(str(caught.value)) < 200, str(caught.value)[:200]
        for wrong in (None, 5, b"review-1"):
            for call in (store.load, store.stored, store.header, lambda e: store.append(e, command)):
                with pytest.raises(TypeError, match=r"^execution_id: must be of type str, got "):
                    call(wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"^journal: must be of type Journal, got str$"):
            store.create("review-2")  # type: ignore[arg-type]
        chain = store.stored("review-1")
        assert chain is not None and chain.length == 0 and store.execution_ids() == ["review-1"]

    def test_a_batch_that_is_not_one_is_an_error_naming_commands(self, open_store: Opener) -> None:
        # Before: append_all([]) raised IndexError from its missing last outcome.
        store = open_store()
        journal = created(store)
        command = _search_started(journal)
        with pytest.raises(ValueError, match=r"^commands: names no command"):
            store.append_all("review-1", [])
        for batch, message in ((None, r"^commands: must be"), ("abc", r"^commands: must be"), ([command], r"^commands\[0\]: ")):
            with pytest.raises(TypeError, match=message):
                store.append_all("review-1", batch)  # type: ignore[arg-type]
        chain = store.stored("review-1")
        assert chain is not None and chain.length == 0 and store.execution_ids() == ["review-1"]

    def test_two_concurrent_appenders_exactly_one_wins(self, open_store: Opener) -> None:
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

    def test_a_writer_behind_the_database_is_refused_not_rebased(self, open_store: Opener) -> None:
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

    def test_a_refusal_or_a_repeat_writes_nothing(self, open_store: Opener) -> None:
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

    def test_free_text_over_the_bound_is_refused_and_writes_nothing(self, open_store: Opener) -> None:
        store = open_store()
        journal = created(store)
        attempt = j.AttemptRef("s-1", 1)
        start = attrs.evolve(_search_started(journal), rationale="r" * (MAX_RATIONALE + 1))
        refused = store.append("review-1", start)
        assert isinstance(refused, j.Refusal) and refused.code is C.INVALID_REQUEST
        assert refused.message.startswith("rationale: must be at most")
        assert isinstance(store.append("review-1", attrs.evolve(start, rationale="r" * MAX_RATIONALE)), j.Appended)
        before = open_store().stored("review-1")
        assert before is not None
        failed = j.Transition("f", before.head, "search", NodeEvent.WORK_FAILED, NodeState.ACTIVE, "bot:search",
                              "searcher", attempt=attempt, error="e" * (MAX_RATIONALE + 1))  # fmt: skip
        for writer in (store, open_store()):
            refused = writer.append("review-1", failed)
            assert isinstance(refused, j.Refusal) and refused.code is C.INVALID_REQUEST
            assert refused.message.startswith("error: must be at most")
        assert open_store().stored("review-1") == before

    def test_a_batch_is_appended_whole_or_not_at_all(self, open_store: Opener) -> None:
        store = open_store()
        journal = created(store)
        attempt = j.AttemptRef("s-1", 1)

        def start(previous: str | None) -> j.Command:
            return j.Transition("a", previous or journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY,
                                "bot:search", "searcher", attempt=attempt)  # fmt: skip

        def block(previous: str | None) -> j.Command:
            assert previous is not None
            return j.Transition("b", previous, "search", NodeEvent.WORK_BLOCKED, NodeState.ACTIVE, "bot:search",
                                "searcher", attempt=attempt)  # fmt: skip

        def forged(previous: str | None) -> j.Command:
            assert previous is not None
            return j.Transition("c", previous, "search", NodeEvent.BLOCK_CLEARED, NodeState.BLOCKED, "mallory",
                                "searcher", attempt=attempt)  # fmt: skip

        before = store.stored("review-1")
        outcomes = store.append_all("review-1", [start, block, forged])
        assert [type(o) for o in outcomes] == [j.Appended, j.Appended, j.Refusal]
        assert isinstance(outcomes[-1], j.Refusal) and outcomes[-1].code is C.FORGED_ROLE
        # Command 3's refusal wrote nothing of commands 1 and 2.
        assert open_store().stored("review-1") == before
        outcomes = store.append_all("review-1", [start, block])
        assert [type(o) for o in outcomes] == [j.Appended, j.Appended]
        chain = open_store().stored("review-1")
        assert chain is not None and chain.length == 2
        # Sent again: two repeats, nothing written.
        assert [type(o) for o in store.append_all("review-1", [start, block])] == [j.Unchanged, j.Unchanged]
        assert open_store().stored("review-1") == chain

    def test_every_call_after_close_is_store_unavailable(self, open_store: Opener) -> None:
        store = open_store()
        journal = created(store)
        start = j.Transition("a", journal.head, "search", NodeEvent.WORK_STARTED, NodeState.READY, "bot:search",
                             "searcher", attempt=j.AttemptRef("s-1", 1))  # fmt: skip
        assert isinstance(store.append("review-1", start), j.Appended)  # cached from here on
        store.close()
        # Neither the driver's own error (sqlite3's ProgrammingError) nor an answer: the PostgreSQL store opened
        # its connection again, which nothing then closed, and a repeat was answered from the cache.
        calls: dict[str, Callable[[], object]] = {
            "append": lambda: store.append("review-1", start),
            "load": lambda: store.load("review-1"),
            "stored": lambda: store.stored("review-1"),
            "header": lambda: store.header("review-1"),
            "execution_ids": store.execution_ids,
            "create": lambda: store.create(fx.new("review-9").journal),
        }
        for name, call in calls.items():
            with pytest.raises(StoreError) as caught:
                call()
            assert caught.value.code == "store_unavailable" and "is closed" in str(caught.value), (name, caught.value)
        store.close()  # a second close does nothing

    def test_create_refuses_an_existing_journal(self, open_store: Opener) -> None:
        store = open_store()
        created(store)
        with pytest.raises(StoreError) as caught:
            open_store().create(fx.new("review-1", start=fx.T0 + timedelta(hours=1)).journal)
        assert caught.value.code == "journal_exists"

    def test_records_are_the_times_of_the_store_clock(self, open_store: Opener) -> None:
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

    def test_many_writers_racing_leave_one_valid_chain(self, open_store: Opener) -> None:
        # Four writers, each appending from the head it last loaded: every
        # append that wins moves the head, every other is refused stale_head,
        # and the chain is exactly the winners, in order, and replays.
        stores = [open_store() for _ in range(4)]
        created(stores[0])
        wins: list[str] = []
        refusals: list[C] = []
        lock = threading.Lock()
        barrier = threading.Barrier(len(stores))

        def writer(number: int, store: JournalStore) -> None:
            barrier.wait()
            for attempt in range(8):
                seen = store.load("review-1")
                assert seen is not None
                state = seen.states["search"]
                event = NodeEvent.WORK_STARTED if state is NodeState.READY else (
                    NodeEvent.WORK_BLOCKED if state is NodeState.ACTIVE else NodeEvent.BLOCK_CLEARED
                )  # fmt: skip
                command = j.Transition(
                    request_id=f"w{number}-{attempt}", expected_head=seen.head, node_id="search", event=event,
                    prior_state=state, actor_id="bot:search", role="searcher", attempt=j.AttemptRef("search-1", 1),
                )  # fmt: skip
                outcome = store.append("review-1", command)
                with lock:
                    if isinstance(outcome, j.Appended):
                        wins.append(command.request_id)
                    else:
                        assert isinstance(outcome, j.Refusal), outcome
                        refusals.append(outcome.code)

        threads = [threading.Thread(target=writer, args=(n, s)) for n, s in enumerate(stores)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert set(refusals) <= {C.STALE_HEAD}
        assert len(wins) + len(refusals) == 32 and wins
        final = open_store().load("review-1")
        assert final is not None
        assert sorted(e.request_id for e in final.events) == sorted(wins)
