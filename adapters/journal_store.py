"""Journal stores: the port, the logic every store shares, and the SQLite store.

The DAG node journal contract (seed 002: Typical developer flow, 5 and 6:
"Persist canonical header/events atomically in order; do not persist
projection as authority"; "After restart, strictly rehydrate and replay the
complete chain").  Storage is specs/journal.md section 10.  Rules of this
module:

- A store translates; the kernel decides.  Every append runs
  ``journal.preview`` on the journal at the stored head and writes exactly
  the events it returns, or nothing.
- What is stored is the canonical bytes of the header and of each event,
  never a projection.  ``journal_headers`` and ``journal_events`` are
  append-only (triggers refuse UPDATE and DELETE).  ``journal_heads`` holds
  one row per journal, the head digest and the event count: the
  compare-and-set guard.  Its triggers refuse DELETE and any UPDATE that
  does not keep the execution and raise the count, so it moves only
  forward, as an append moves it.  It is derived from the events and
  checked against them on every load, so a head that disagrees with the
  chain is reported, never believed.
- Beside each record its row keeps the record's digest (``digest``), and
  each event's row its ordinal (``ordinal``, which orders the rows); every
  read of a chain (a load, a verify, catching a cache up) holds both columns
  to the record: a row whose column disagrees was written past the store,
  and is ``altered_digest`` (the digest) or ``ordinal_gap`` (the ordinal) at
  that record.
- An append writes its events and moves the head in one transaction, and
  only if the head is still the one the kernel decided on (``UPDATE ...
  WHERE head = ?``).  Of two writers that expected the same head exactly
  one succeeds; the other is refused ``stale_head``.  A writer is never
  rebased: when the head moved, the store reloads the journal from the
  database and asks the kernel again with the command unchanged, and the
  kernel refuses it unless its expected head is the new head (or it is an
  idempotent repeat).  A refusal decided on a cached journal is returned
  only if the stored head is still the cached one, so the code is always
  the one the stored journal earns.
- A loaded journal is cached per execution with its head; the cache is
  only a shortcut to the projection the chain yields, and is refreshed
  whenever the database's head differs from it, by replaying only the
  events appended since (``journal.continue_replay``, which checks that
  they follow the cached head).  ``load`` always replays the whole chain,
  and so does a catch-up that finds a bad record: its refusal is the
  load's, naming the chain's first bad record, not the first of the rows
  it read.
- The time of a record is the store's clock's (``Clock``, UTC), read once
  per append.
- ``append_all`` appends a batch of commands whole or not at all: the
  kernel decides each on the journal the ones before it made, and the
  events of all of them are written in one transaction under one head
  guard; a refusal of any writes nothing.  ``append`` is a batch of one.
- An execution id that is not an identifier (specs/journal.md, section 1)
  names no journal and never reaches the database: a read answers None, an
  append ``journal_not_found``, whatever the store (PostgreSQL cannot take
  a NUL as a parameter, SQLite can); one that is not text is a TypeError
  naming it.
- Every append, load and catching up gives the kernel the store's header
  lookup (``header``), so a successor binding is checked against the
  successor's stored header whether or not records are resolved, and
  whoever wrote it.  The lookup holds the header row's digest column to
  the header, as a read of its chain does.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Protocol

import attrs

from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import canonical_bytes, digest_bytes, parse_canonical
from fencekeeper.kernel.common import IDENTIFIER, shown
from fencekeeper.kernel.dag import VerifiedWorkflow, verify_workflow, workflow_from_json
from fencekeeper.kernel.journal_codes import JournalCode, JournalError

from . import sqlite_store
from .store import Clock, StoreError, SystemClock

CommandSource = Callable[[str | None], j.Command]
"""Builds a command of a batch, given the head the command before it left (None for the first)."""

Tail = tuple[list[bytes], list[str], list[int | str], str, int]
"""Events read after a cached journal: their records, digest and ordinal columns, then the head row's head and length."""


@attrs.frozen
class StoredChain:
    """A journal exactly as stored: canonical bytes, and the head row that guards it."""

    execution_id: str
    header: bytes
    events: tuple[bytes, ...]
    workflow: bytes
    policy: bytes
    head: str
    length: int
    header_digest: str
    """The header row's ``digest`` column, as stored."""
    event_digests: tuple[str, ...]
    """Each event row's ``digest`` column, as stored, in the order of ``events``."""
    event_ordinals: tuple[int | str, ...]
    """Each event row's ``ordinal`` column, as stored (its text if it is not an integer), in the order of ``events``."""


class JournalStore(Protocol):
    """The journal port: what the command line and services need from any journal store."""

    clock: Clock
    """Where the time of every record comes from."""

    def create(self, journal: j.Journal) -> None:
        """Store a new journal's header (and its workflow and policy); StoreError ``journal_exists`` if taken."""
        ...

    def append(self, execution_id: str, command: j.Command, resolve: j.Resolver | None = None) -> j.Outcome:
        """Append ``command`` atomically under the head guard: the kernel's outcome, written or not."""
        ...

    def append_all(
        self, execution_id: str, commands: Sequence[CommandSource], resolve: j.Resolver | None = None
    ) -> list[j.Outcome]:
        """Append every command or none, in one transaction under the head guard.

        Each source builds its command from the head the command before it
        left (the first from None).  The outcomes are in order; if one is a
        refusal it is the last, and nothing was written.  A batch of no
        command is a ValueError, and one that is not a sequence of callables
        a TypeError, each naming ``commands``.
        """
        ...

    def header(self, execution_id: str) -> j.Header | None:
        """The stored header of ``execution_id``, strictly decoded (a successor's, say); None if there is none."""
        ...

    def load(self, execution_id: str) -> j.Journal | None:
        """Replay the stored chain (JournalError names the first bad record); None if there is no such journal."""
        ...

    def stored(self, execution_id: str) -> StoredChain | None: ...

    def execution_ids(self) -> list[str]: ...

    def close(self) -> None: ...


def authority_of(workflow: bytes, policy: bytes) -> tuple[VerifiedWorkflow, j.VerifiedPolicy]:
    """The verified workflow and policy a header was stored with."""
    verified = verify_workflow(workflow_from_json(parse_canonical(workflow)))
    return verified, j.verify_policy(j.policy_from_json(parse_canonical(policy)), verified)


def replay_chain(
    chain: StoredChain, resolve: j.Resolver | None = None, *, headers: j.HeaderLookup | None = None
) -> j.Journal:
    """The journal ``chain``'s records hold, every row's digest and ordinal columns its record's; JournalError otherwise.

    The head row is not compared: :func:`replay_stored` does.
    """
    workflow, policy = authority_of(chain.workflow, chain.policy)
    return _columns_held(
        lambda: j.replay(chain.header, chain.events, workflow, policy, resolve, headers=headers),
        (chain.header, *chain.events),
        (chain.header_digest, *chain.event_digests),
        (None, *chain.event_ordinals),
        first=0,
    )


def replay_stored(
    chain: StoredChain, resolve: j.Resolver | None = None, *, headers: j.HeaderLookup | None = None
) -> j.Journal:
    """The journal ``chain`` holds, checked against its digest and ordinal columns and its head row; JournalError otherwise."""
    journal = replay_chain(chain, resolve, headers=headers)
    if (journal.head, len(journal.events)) != (chain.head, chain.length):
        raise JournalError(
            JournalCode.BROKEN_CHAIN,
            f"the stored head is {chain.head} after {chain.length} events, but the chain ends at {journal.head} "
            f"after {len(journal.events)}: records were added or removed outside the store",
            len(journal.events),
        )
    return journal


# The checks of an event that replay makes after its digest and before its
# ordinal (specs/journal.md, section 7, step 2), and its ordinal's own: a
# record replay refused for one of them is not also held to its ordinal column.
_BEFORE_ORDINAL = frozenset({JournalCode.FOREIGN_RECORD, JournalCode.BROKEN_CHAIN, JournalCode.ORDINAL_GAP})


def _columns_held(
    run: Callable[[], j.Journal],
    records: Sequence[bytes],
    digests: Sequence[str],
    ordinals: Sequence[int | str | None],
    *,
    first: int,
) -> j.Journal:
    """``run()``, the replay of ``records`` (ordinals ``first`` on), with each row's columns held to its record.

    ``digests`` and ``ordinals`` are the rows' ``digest`` and ``ordinal``
    columns (None for the header's row, which has no ordinal).  Each column
    is compared where replay compares the record's own value (specs/journal.md,
    section 7, step 2: the digest first, the ordinal last), so the record
    named is still the first bad one: when replay refuses record k, the
    columns up to k are compared first (their records read), and a column
    that disagrees is the refusal instead, unless replay refused k for a
    check that comes before that column's.
    """
    try:
        journal = run()
    except JournalError as exc:
        if exc.ordinal is None or not first <= exc.ordinal < first + len(records):
            raise
        for ordinal in range(first, exc.ordinal + 1):
            record, index = records[ordinal - first], ordinal - first
            try:
                decoded = j.decode_header(record) if ordinal == 0 else j.decode_event(record)
            except JournalError:
                break  # the record itself cannot be read: replay's refusal names it
            if digests[index] != decoded.digest:
                raise _altered_column(digests[index], decoded.digest, ordinal) from None
            column = ordinals[index]
            if isinstance(decoded, j.Event) and column is not None and column != decoded.ordinal:
                if ordinal == exc.ordinal and exc.reason in _BEFORE_ORDINAL:
                    break
                raise _misplaced_column(column, decoded.ordinal, ordinal) from None
        raise
    if first == 0:
        held: list[tuple[str, int | None]] = [(journal.header.digest, None)]
        held += [(e.digest, e.ordinal) for e in journal.events]
    else:
        # Catching up reads only the new events; indexing the log reaches them without walking the rest.
        held = [(journal.events[i].digest, journal.events[i].ordinal) for i in range(first - 1, len(journal.events))]
    for index, ((digest, own), column) in enumerate(zip(held, ordinals, strict=True)):
        if digests[index] != digest:
            raise _altered_column(digests[index], digest, first + index)
        if own is not None and column != own:
            raise _misplaced_column(column, own, first + index)
    return journal


def _altered_column(column: str, digest: str, ordinal: int) -> JournalError:
    return JournalError(
        JournalCode.ALTERED_DIGEST,
        f"the row's digest column holds {column[:80]!r}, but the record's digest is {digest}: "
        "one of them was changed outside the store",
        ordinal,
    )


def _misplaced_column(column: int | str | None, own: int, ordinal: int) -> JournalError:
    shown = repr(column[:80]) if isinstance(column, str) else str(column)
    return JournalError(
        JournalCode.ORDINAL_GAP,
        f"the row's ordinal column holds {shown}, but the record's ordinal is {own}: "
        "one of them was changed outside the store",
        ordinal,
    )


def _can_name_a_journal(execution_id: object) -> bool:
    """Whether ``execution_id`` could name a stored journal; TypeError naming it if it is not text.

    Only an identifier (specs/journal.md, section 1) was ever created, so any
    other text names no journal, and is not sent to the database at all: a
    NUL or a lone surrogate cannot be a query parameter (PostgreSQL text
    refuses NUL, and neither driver can encode a surrogate), and the two
    stores answered such an id differently, one with None, one with a
    driver's exception.
    """
    if not isinstance(execution_id, str):
        raise TypeError(f"execution_id: must be of type str, got {type(execution_id).__name__}")
    return IDENTIFIER.fullmatch(execution_id) is not None


def _check_sources(commands: object) -> None:
    """A batch that is not one: an error naming ``commands``, before anything is decided or written."""
    if not isinstance(commands, Sequence) or isinstance(commands, str | bytes | bytearray):
        raise TypeError(f"commands: must be a sequence of command sources, got {type(commands).__name__}")
    if not commands:
        # Its outcomes would say nothing, and the last of them is what a caller reads.
        raise ValueError("commands: names no command; a batch appends at least one")
    for n, source in enumerate(commands):
        if not callable(source):
            raise TypeError(f"commands[{n}]: must be a command source (a callable), got {type(source).__name__}")


def stale(expected: str, head: str) -> j.Refusal:
    return j.Refusal(JournalCode.STALE_HEAD, f"expected head {expected}, but another writer moved it to {head}")


class JournalStoreBase:
    """What every SQL journal store does; subclasses supply the statements' transport."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._cache: dict[str, j.Journal] = {}
        self._cache_lock = threading.Lock()

    # --- what a subclass provides ---------------------------------------------------------------

    def _insert_header(self, journal: j.Journal, workflow: bytes, policy: bytes) -> bool:
        raise NotImplementedError

    def _commit_events(
        self, execution_id: str, expected: str, events: Sequence[tuple[j.Event, bytes]], length: int
    ) -> bool:
        """Write ``events`` (each with its record bytes) and move the head from ``expected``, atomically.

        False, and nothing written, if the head had moved.
        """
        raise NotImplementedError

    def _stored(self, execution_id: str) -> StoredChain | None:
        raise NotImplementedError

    def _stored_head(self, execution_id: str) -> str | None:
        raise NotImplementedError

    def _tail(self, execution_id: str, after: int) -> Tail | None:
        """The events after ordinal ``after`` and their digest and ordinal columns, with the head row, from one snapshot.

        None if there is no journal.
        """
        raise NotImplementedError

    def execution_ids(self) -> list[str]:
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------------

    def stored(self, execution_id: str) -> StoredChain | None:
        if not _can_name_a_journal(execution_id):
            return None
        return self._stored(execution_id)

    def create(self, journal: j.Journal) -> None:
        if not isinstance(journal, j.Journal):
            raise TypeError(f"journal: must be of type Journal, got {type(journal).__name__}")
        if journal.events:
            raise StoreError("journal_exists", "a journal is created empty; append its events afterwards")
        workflow = canonical_bytes(journal.workflow.definition.to_json())
        policy = canonical_bytes(journal.policy.policy.to_json())
        if not self._insert_header(journal, workflow, policy):
            raise StoreError("journal_exists", f"a journal {journal.execution_id!r} already exists")
        with self._cache_lock:
            self._cache[journal.execution_id] = journal

    def load(self, execution_id: str) -> j.Journal | None:
        chain = self.stored(execution_id)
        if chain is None:
            return None
        journal = replay_stored(chain, headers=self.header)
        with self._cache_lock:
            self._cache[execution_id] = journal
        return journal

    def header(self, execution_id: str) -> j.Header | None:
        if not _can_name_a_journal(execution_id):
            return None
        row = self._header_row(execution_id)
        if row is None:
            return None
        data, column = row
        header = j.decode_header(data)
        # A successor's binding is checked against this header: its row's
        # digest column is held to it as on every read of a chain.
        if column != header.digest:
            raise _altered_column(column, header.digest, 0)
        return header

    def _header_row(self, execution_id: str) -> tuple[bytes, str] | None:
        """The header row's record and its ``digest`` column; None if there is none."""
        raise NotImplementedError

    def append(self, execution_id: str, command: j.Command, resolve: j.Resolver | None = None) -> j.Outcome:
        return self.append_all(execution_id, [lambda _head: command], resolve)[0]

    def append_all(
        self, execution_id: str, commands: Sequence[CommandSource], resolve: j.Resolver | None = None
    ) -> list[j.Outcome]:
        if not _can_name_a_journal(execution_id):
            raise StoreError("journal_not_found", f"no journal {shown(execution_id)}: not an identifier")
        _check_sources(commands)
        with self._cache_lock:
            journal = self._cache.get(execution_id)
        if journal is None:
            journal = self._reload(execution_id)
        now = self.clock.now()
        for reloaded in (False, True):
            outcomes = self._decide_all(journal, commands, now, resolve)
            last = outcomes[-1]
            if isinstance(last, j.Refusal):
                if reloaded or self._stored_head(execution_id) == journal.head:
                    # A refusal stands when it was decided on the stored head.
                    return outcomes
            else:
                appended = [
                    pair
                    for o in outcomes
                    if isinstance(o, j.Appended)
                    for pair in zip(o.events, o.stored_records(), strict=True)
                ]
                if not appended:
                    # Every command an idempotent repeat: one whatever else was appended since.
                    return outcomes
                final = next(o.journal for o in reversed(outcomes) if isinstance(o, j.Appended))
                if self._commit_events(execution_id, journal.head, appended, len(final.events)):
                    with self._cache_lock:
                        self._cache[execution_id] = final
                    return outcomes
                if reloaded:
                    # Moved twice while this append ran: the commands were
                    # decided against a head that is no longer the head.
                    return [stale(journal.head, "a newer head")]
            # The cached journal is behind the database (another writer
            # appended): read the chain again and ask the kernel again, so
            # that a refusal is always the one the stored journal earns.
            journal = self._reload(execution_id)
        raise AssertionError("unreachable")  # pragma: no cover

    def _decide_all(
        self, journal: j.Journal, commands: Sequence[CommandSource], now: datetime, resolve: j.Resolver | None
    ) -> list[j.Outcome]:
        """The kernel's outcome for each command in turn, on the journal the ones before it made, up to a refusal."""
        outcomes: list[j.Outcome] = []
        head: str | None = None
        for source in commands:
            outcome = j.preview(journal, source(head), now, resolve, headers=self.header)
            outcomes.append(outcome)
            if isinstance(outcome, j.Refusal):
                break
            journal = outcome.journal
            # After a repeat, the next command of a batch sent again expects
            # the head this request made when it was first recorded.
            head = outcome.events[-1].digest if outcome.events else journal.head
        return outcomes

    def _reload(self, execution_id: str) -> j.Journal:
        """The stored journal, catching the cached one up by the events appended since, or replaying it all."""
        with self._cache_lock:
            cached = self._cache.get(execution_id)
        if cached is not None:
            tail = self._tail(execution_id, len(cached.events))
            if tail is None:
                raise StoreError("journal_not_found", f"no journal {shown(execution_id)}")
            events, digests, ordinals, head, length = tail
            # The first new event must name the cached head: continue_replay
            # checks the link, so a cache that is not a prefix of the stored
            # chain is refused, never silently extended.
            try:
                journal = _columns_held(
                    lambda: j.continue_replay(cached, events, headers=self.header),
                    events,
                    digests,
                    ordinals,
                    first=len(cached.events) + 1,
                )
            except JournalError:
                # The refusal is a full load's: it names the chain's first bad record, where the
                # catch-up could name only the first of the rows it read (an altered row the cache
                # already held comes before them).  Only a refusal pays for the whole replay.
                return self._loaded(execution_id)
            if (journal.head, len(journal.events)) == (head, length):
                with self._cache_lock:
                    self._cache[execution_id] = journal
                return journal
        return self._loaded(execution_id)

    def _loaded(self, execution_id: str) -> j.Journal:
        journal = self.load(execution_id)
        if journal is None:
            raise StoreError("journal_not_found", f"no journal {shown(execution_id)}")
        return journal


# --- resolving records -----------------------------------------------------------------------------


class DirectoryResolver:
    """Records as files: ``DIRECTORY/<kind>/<id>``, whose SHA-256 must be the reference's digest.

    A reference whose path would leave the directory never resolves.  (A
    successor execution's header is not a record here: the kernel finds it
    through the store's header lookup, on every binding.)
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()

    def __call__(self, record: j.RecordRef) -> bool:
        path = (self.directory / record.kind / record.ref_id).resolve()
        if not path.is_relative_to(self.directory) or not path.is_file():
            return False
        return digest_bytes(path.read_bytes()) == record.digest


# --- SQLite ----------------------------------------------------------------------------------------


def _column_text(value: bytes) -> str:
    # Read CAST AS BLOB, as the records are: a column rewritten by hand may
    # hold a number or bytes that are not UTF-8, and must be reported as a
    # digest that disagrees, not fail on its type.
    return bytes(value).decode("utf-8", errors="replace")


def _column_ordinal(value: object) -> int | str:
    # The column is INTEGER, but SQLite keeps what a hand-written UPDATE
    # gives it that is not one (text, a real): its text, which is never
    # equal to a record's ordinal.
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _column_text(value) if isinstance(value, bytes) else str(value)


_MOVE_HEAD = "UPDATE journal_heads SET head = ?, length = ? WHERE execution_id = ? AND head = ?"
_INSERT_EVENT = "INSERT INTO journal_events (execution_id, ordinal, digest, record) VALUES (?, ?, ?, ?)"


class SQLiteJournalStore(JournalStoreBase):
    """Journals in a fencekeeper SQLite file (opened, checked and migrated as the SQLite store does)."""

    def __init__(self, path: str | os.PathLike[str], clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = sqlite_store._open(self.path)
        self._closed = False

    def _connection(self) -> sqlite3.Connection:
        # Called under the lock.  After close, sqlite3's own ProgrammingError reached the caller.
        if self._closed:
            raise StoreError("store_unavailable", f"{self.path}: the journal store is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                # Another writer held the file past the busy timeout: store_locked, naming the holders, as the executions'
                # and operations' stores of the same file say it (exit 1, retry), not a store that cannot be used.
                raise sqlite_store.begin_error(exc, self.path, sqlite_store.BUSY_TIMEOUT_MS / 1000) from None
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                # A failed commit (disk full, I/O error) leaves the transaction
                # open; end it, so that nothing of it is ever committed later.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError("store_unavailable", f"{self.path}: cannot commit: {exc}") from None

    def _insert_header(self, journal: j.Journal, workflow: bytes, policy: bytes) -> bool:
        header = journal.header
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM journal_headers WHERE execution_id = ?", (header.execution_id,)).fetchone():
                return False
            conn.execute(
                "INSERT INTO journal_headers (execution_id, header, digest, workflow, policy) VALUES (?, ?, ?, ?, ?)",
                (header.execution_id, j.encode_header(header), header.digest, workflow, policy),
            )
            conn.execute(
                "INSERT INTO journal_heads (execution_id, head, length) VALUES (?, ?, 0)",
                (header.execution_id, header.digest),
            )
        return True

    def _commit_events(
        self, execution_id: str, expected: str, events: Sequence[tuple[j.Event, bytes]], length: int
    ) -> bool:
        with self._write() as conn:
            moved = conn.execute(_MOVE_HEAD, (events[-1][0].digest, length, execution_id, expected)).rowcount
            if moved != 1:
                return False
            if len(events) == 1:
                # executemany's own set-up costs more than the insert of one row.
                event, record = events[0]
                conn.execute(_INSERT_EVENT, (execution_id, event.ordinal, event.digest, record))
            else:
                conn.executemany(_INSERT_EVENT, [(execution_id, e.ordinal, e.digest, record) for e, record in events])
        return True

    def _stored(self, execution_id: str) -> StoredChain | None:
        # Every record is read CAST AS BLOB, here and below: a row rewritten
        # by hand may hold TEXT (SQLite's replace() returns it) or a number,
        # and verification must name that record, not fail on its type.
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT CAST(h.header AS BLOB), CAST(h.workflow AS BLOB), CAST(h.policy AS BLOB), g.head, g.length, "
                    "CAST(h.digest AS BLOB) "
                    "FROM journal_headers h "
                    "JOIN journal_heads g USING (execution_id) WHERE h.execution_id = ?",
                    (execution_id,),
                ).fetchone()
                if row is None:
                    return None
                events = conn.execute(
                    "SELECT CAST(record AS BLOB), CAST(digest AS BLOB), ordinal FROM journal_events "
                    "WHERE execution_id = ? ORDER BY ordinal",
                    (execution_id,),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
        return StoredChain(
            execution_id=execution_id,
            header=bytes(row[0]),
            events=tuple(bytes(r[0]) for r in events),
            workflow=bytes(row[1]),
            policy=bytes(row[2]),
            head=str(row[3]),
            length=int(row[4]),
            header_digest=_column_text(row[5]),
            event_digests=tuple(_column_text(r[1]) for r in events),
            event_ordinals=tuple(_column_ordinal(r[2]) for r in events),
        )

    def _stored_head(self, execution_id: str) -> str | None:
        with self._lock:
            row = self._connection().execute("SELECT head FROM journal_heads WHERE execution_id = ?", (execution_id,)).fetchone()
        return None if row is None else str(row[0])

    def _header_row(self, execution_id: str) -> tuple[bytes, str] | None:
        with self._lock:
            row = self._connection().execute(
                "SELECT CAST(header AS BLOB), CAST(digest AS BLOB) FROM journal_headers WHERE execution_id = ?",
                (execution_id,),
            ).fetchone()
        return None if row is None else (bytes(row[0]), _column_text(row[1]))

    def _tail(self, execution_id: str, after: int) -> Tail | None:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT head, length FROM journal_heads WHERE execution_id = ?", (execution_id,)
                ).fetchone()
                if row is None:
                    return None
                events = conn.execute(
                    "SELECT CAST(record AS BLOB), CAST(digest AS BLOB), ordinal FROM journal_events "
                    "WHERE execution_id = ? AND ordinal > ? ORDER BY ordinal",
                    (execution_id, after),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
        return (
            [bytes(r[0]) for r in events],
            [_column_text(r[1]) for r in events],
            [_column_ordinal(r[2]) for r in events],
            str(row[0]),
            int(row[1]),
        )

    def execution_ids(self) -> list[str]:
        with self._lock:
            rows = self._connection().execute("SELECT execution_id FROM journal_headers ORDER BY execution_id").fetchall()
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()
        with self._cache_lock:
            # Nothing is answered from it after close: an append of repeats only would have been.
            self._cache.clear()


__all__ = [
    "CommandSource",
    "DirectoryResolver",
    "JournalStore",
    "JournalStoreBase",
    "SQLiteJournalStore",
    "StoredChain",
    "authority_of",
    "replay_chain",
    "replay_stored",
]
