"""The execution journal: appends per second on SQLite and PostgreSQL, and replay speed, each beside a reference.

Run it with ``python -m bench.journal`` (PostgreSQL is measured when
``FENCEKEEPER_PG_DSN``, default postgresql://postgres@127.0.0.1:5432/test,
answers; ``--no-pg`` skips it).  One run measures:

1. **Appends per second to one journal** through ``SQLiteJournalStore``,
   beside a bare insert-commit loop on a second file with the same settings
   (WAL, ``synchronous=FULL``): one ``INSERT`` of a row as large as an event
   record, one commit.  An append is one transaction that moves the head
   under compare-and-set and inserts the event, after the kernel has
   checked the command.  The two loops alternate in chunks within each
   round, so load from elsewhere falls on both.  Target: at least 40% of
   the bare rate.
2. The same on PostgreSQL, ``PostgresJournalStore`` in a fresh schema, beside
   a bare autocommit ``INSERT`` of the same size in the same schema.
3. **Replay of a 100,000-event journal** (``journal.replay``: strict
   decoding, digests, the chain and every rule, from the stored bytes),
   beside ``hashlib.sha256`` alone over the same records.  Target: at least
   25% of the hashing rate.  Beside both, ``json.loads`` of each record and
   nothing else: the ceiling of any replay that decodes its records with the
   standard library, as a share of the same hashing rate.

The journal appended to is one automated node per 50 events: work-started,
then work-blocked/block-cleared alternating, each event referencing one
record, so events are about 700 bytes, like the review's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fencekeeper.adapters.journal_store import SQLiteJournalStore
from fencekeeper.adapters.sqlite_store import BUSY_TIMEOUT_MS
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.canonical import digest_bytes
from fencekeeper.kernel.dag import Artifact, NodeDefinition, NodeKind, WorkflowDefinition, verify_workflow
from fencekeeper.kernel.machines import NodeEvent, NodeState

APPEND_TARGET = 0.40
REPLAY_TARGET = 0.25
T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVENTS_PER_NODE = 50


class Clock:
    def __init__(self) -> None:
        self.moment = T0

    def now(self) -> datetime:
        self.moment += timedelta(microseconds=10)
        return self.moment


def workflow_and_policy(nodes: int) -> tuple[j.Journal, Callable[[str], j.Journal]]:
    definition = WorkflowDefinition(
        "bench",
        tuple(
            NodeDefinition(f"n{i:05d}", NodeKind.AUTOMATED, (), ("worker",), (Artifact("result", f"r{i}"),))
            for i in range(nodes)
        ),
    )
    workflow = verify_workflow(definition)
    policy = j.verify_policy(
        j.AuthorityPolicy("bench-policy", "bench", workflow.digest, "proto", (
            j.Assignment("bot", j.ActorKind.AUTOMATION, ("worker",)),
            j.Assignment("human", j.ActorKind.HUMAN, ("worker",)),
        ), "human"),
        workflow,
    )  # fmt: skip

    def fresh(execution_id: str) -> j.Journal:
        header = j.create_header(execution_id, workflow, policy, created_by="human", now=T0)
        return j.new_journal(header, workflow, policy)

    return fresh("bench-0"), fresh


def commands(count: int) -> Iterator[Callable[[str, int], j.Transition]]:
    """Command makers (head, ordinal) for ``count`` valid events, in order."""
    record = (j.RecordRef("evidence", "log", digest_bytes(b"evidence")),)
    for n in range(count):
        node = f"n{n // EVENTS_PER_NODE:05d}"
        step = n % EVENTS_PER_NODE
        attempt = j.AttemptRef(f"{node}-1", 1)
        if step == 0:
            event, prior = NodeEvent.WORK_STARTED, NodeState.READY
        elif step % 2 == 1:
            event, prior = NodeEvent.WORK_BLOCKED, NodeState.ACTIVE
        else:
            event, prior = NodeEvent.BLOCK_CLEARED, NodeState.BLOCKED

        def make(head: str, ordinal: int, *, node: str = node, event: NodeEvent = event, prior: NodeState = prior,
                 attempt: j.AttemptRef = attempt) -> j.Transition:
            return j.Transition(f"req-{ordinal}", head, node, event, prior, "bot", "worker",
                                rationale="benchmark step", attempt=attempt, records=record)  # fmt: skip

        yield make


def build_chain(count: int) -> tuple[j.Journal, bytes, list[bytes]]:
    """A valid chain of ``count`` events, built through the kernel's own rules in one pass."""
    journal, _ = workflow_and_policy(count // EVENTS_PER_NODE + 1)
    # preview/append copy the history on every call (a Journal is an
    # immutable value); one builder extends it in place, with the same rules.
    builder = j._Builder(journal)
    clock = Clock()
    for number, make in enumerate(commands(count), start=1):
        command = make(builder.head, number)
        if j._apply(builder, command, j.format_time(clock.now())):
            raise AssertionError("a repeat while building")
    built = builder.journal()
    return built, j.encode_header(built.header), [j.encode_event(e) for e in built.events]


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Timed sections run without the cyclic garbage collector, on both sides, as the other benches do."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- appends ---------------------------------------------------------------------------------


def bare_sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE rows (k TEXT NOT NULL, n INTEGER NOT NULL, digest TEXT NOT NULL, record BLOB NOT NULL, "
                 "PRIMARY KEY (k, n)) WITHOUT ROWID")  # fmt: skip
    return conn


def settings(conn: sqlite3.Connection) -> tuple[str, int]:
    return str(conn.execute("PRAGMA journal_mode").fetchone()[0]), int(conn.execute("PRAGMA synchronous").fetchone()[0])


def measure_appends(
    append: Callable[[j.Command], j.Outcome],
    bare: Callable[[int, bytes], None],
    journal: j.Journal,
    *,
    rounds: int,
    per_round: int,
    chunk: int,
) -> list[tuple[float, float]]:
    makers = commands(rounds * per_round)
    head, ordinal = journal.head, 0
    record = j.encode_event(build_chain(1)[0].events[0])
    results = []
    bare_n = 0
    for _ in range(rounds):
        store_time = bare_time = 0.0
        done = 0
        with no_gc():
            while done < per_round:
                size = min(chunk, per_round - done)
                started = time.perf_counter()
                for _ in range(size):
                    ordinal += 1
                    outcome = append(next(makers)(head, ordinal))
                    if not isinstance(outcome, j.Appended):
                        raise AssertionError(outcome)
                    head = outcome.journal.head
                store_time += time.perf_counter() - started
                started = time.perf_counter()
                for _ in range(size):
                    bare_n += 1
                    bare(bare_n, record)
                bare_time += time.perf_counter() - started
                done += size
        results.append((per_round / store_time, per_round / bare_time))
    return results


def report_appends(title: str, results: list[tuple[float, float]]) -> float:
    print(f"\n{title}")
    print(f"{'round':>6} {'appends/s':>11} {'bare/s':>9} {'ratio':>7}")
    for number, (store, bare) in enumerate(results, start=1):
        print(f"{number:>6} {store:>11.0f} {bare:>9.0f} {store / bare:>7.1%}")
    store_median = statistics.median(r[0] for r in results)
    bare_median = statistics.median(r[1] for r in results)
    ratio = statistics.median(r[0] / r[1] for r in results)
    print(f"{'median':>6} {store_median:>11.0f} {bare_median:>9.0f} {ratio:>7.1%}  "
          f"(target {APPEND_TARGET:.0%}: {'met' if ratio >= APPEND_TARGET else 'MISSED'})")  # fmt: skip
    return ratio


def sqlite_appends(directory: Path, rounds: int, per_round: int) -> float:
    journal, _ = workflow_and_policy(rounds * per_round // EVENTS_PER_NODE + 1)
    store = SQLiteJournalStore(directory / "journal.db", clock=Clock())
    store.create(journal)
    conn = bare_sqlite(directory / "bare.db")
    store_settings = settings(store._conn)
    if store_settings != settings(conn):
        raise SystemExit(f"settings differ: store {store_settings}, bare {settings(conn)}")
    print(f"sqlite: journal_mode={store_settings[0]}, synchronous={store_settings[1]} on both files")

    def bare(n: int, record: bytes) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO rows (k, n, digest, record) VALUES (?, ?, ?, ?)", ("bench", n, "d", record))
        conn.execute("COMMIT")

    results = measure_appends(lambda c: store.append("bench-0", c), bare, journal, rounds=rounds,
                              per_round=per_round, chunk=50)  # fmt: skip
    store.close()
    conn.close()
    return report_appends("SQLite: appends to one journal vs bare INSERT + COMMIT", results)


def postgres_appends(dsn: str, rounds: int, per_round: int) -> float | None:
    import psycopg  # noqa: PLC0415

    from fencekeeper.adapters.journal_postgres import PostgresJournalStore  # noqa: PLC0415
    from fencekeeper.adapters.postgres_store import migrate  # noqa: PLC0415

    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as exc:
        print(f"\nPostgreSQL: skipped ({' '.join(str(exc).split())})")
        return None
    schema = f"bench_journal_{uuid.uuid4().hex[:8]}"
    migrate(dsn, schema)
    try:
        journal, _ = workflow_and_policy(rounds * per_round // EVENTS_PER_NODE + 1)
        store = PostgresJournalStore(dsn, schema=schema, clock=Clock())
        store.create(journal)
        conn = psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}")
        conn.execute("CREATE TABLE rows (k text NOT NULL, n integer NOT NULL, digest text NOT NULL, "
                     "record bytea NOT NULL, PRIMARY KEY (k, n))")  # fmt: skip

        def bare(n: int, record: bytes) -> None:
            conn.execute("INSERT INTO rows (k, n, digest, record) VALUES (%s, %s, %s, %s)", ("bench", n, "d", record))

        results = measure_appends(lambda c: store.append("bench-0", c), bare, journal, rounds=rounds,
                                  per_round=per_round, chunk=50)  # fmt: skip
        store.close()
        conn.close()
        return report_appends("PostgreSQL: appends to one journal vs bare autocommit INSERT", results)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


# --- replay ------------------------------------------------------------------------------------


def replay(events: int, rounds: int) -> float:
    started = time.perf_counter()
    journal, header, lines = build_chain(events)
    print(f"\nreplay: built a {events:,}-event chain ({sum(map(len, lines)) / len(lines):.0f} bytes an event) "
          f"in {time.perf_counter() - started:.1f}s")  # fmt: skip
    workflow, policy = journal.workflow, journal.policy
    # The ceiling beside the target: decoding each record with the standard library's JSON reader, and
    # nothing else (no canonical check, no digest, no rule), as a share of the same hashing rate.
    print(f"{'round':>6} {'replay ev/s':>12} {'sha256 ev/s':>12} {'ratio':>7} {'json.loads ev/s':>16} {'ratio':>7}")
    rates = []
    decoded = []
    for number in range(1, rounds + 1):
        with no_gc():
            started = time.perf_counter()
            replayed = j.replay(header, lines, workflow, policy)
            replay_time = time.perf_counter() - started
        if replayed.head != journal.head:
            raise AssertionError("replay reached another head")
        del replayed
        with no_gc():
            started = time.perf_counter()
            for line in lines:
                hashlib.sha256(line).digest()
            hash_time = time.perf_counter() - started
        with no_gc():
            started = time.perf_counter()
            for line in lines:
                json.loads(line)
            decode_time = time.perf_counter() - started
        rates.append((events / replay_time, events / hash_time))
        decoded.append(events / decode_time)
        print(f"{number:>6} {rates[-1][0]:>12.0f} {rates[-1][1]:>12.0f} {rates[-1][0] / rates[-1][1]:>7.1%} "
              f"{decoded[-1]:>16.0f} {decoded[-1] / rates[-1][1]:>7.1%}")  # fmt: skip
    ratio = statistics.median(r[0] / r[1] for r in rates)
    ceiling = statistics.median(d / r[1] for d, r in zip(decoded, rates, strict=True))
    print(f"{'median':>6} {statistics.median(r[0] for r in rates):>12.0f} {statistics.median(r[1] for r in rates):>12.0f} "
          f"{ratio:>7.1%}  (target {REPLAY_TARGET:.0%}: {'met' if ratio >= REPLAY_TARGET else 'MISSED'})")  # fmt: skip
    print(f"decoding alone (json.loads of each record, nothing checked): {statistics.median(decoded):,.0f} ev/s, "
          f"{ceiling:.1%} of hashing: no replay that reads its records with the standard library's decoder "
          "can pass this")  # fmt: skip
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--appends", type=int, default=400, help="appends per round (default 400)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--events", type=int, default=100_000, help="length of the replayed journal (default 100000)")
    parser.add_argument("--replay-rounds", type=int, default=3)
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    parser.add_argument("--dir", type=Path, help="where the SQLite files go (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fencekeeper-bench-journal-", dir=args.dir) as scratch:
        sqlite_appends(Path(scratch), args.rounds, args.appends)
    if not args.no_pg:
        postgres_appends(os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
                         args.rounds, args.appends)  # fmt: skip
    replay(args.events, args.replay_rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
