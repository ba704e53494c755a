"""Durable-operation throughput, each figure beside a bare commit loop measured in the same run.

Run: ``python -m bench.operations [--seconds S] [--rounds N] [--backends sqlite,postgresql]``
(PostgreSQL: FENCEKEEPER_PG_DSN or a server at postgresql://postgres@127.0.0.1:5432/test).
Every figure is the median of several rounds; these machines are noisy, and
each round measures ours and the bare loop back to back, the ratio being the
median of the rounds' own ratios.

1. Operations submitted and completed per second: each worker *process*
   submits a transfer-shaped operation of an atomic no-op action under a
   fresh idempotency key and then runs one worker pass (claim, resolve the
   principal, the guarded completion): three transactions per operation.
   Beside it, a bare loop of ``UPDATE ...; COMMIT`` on as many connections,
   each updating its own row.  Target (issue 17): at 8 workers on
   PostgreSQL at least 25% of the bare commit rate.
   The same loop also runs in 8 threads of one process sharing one store
   (``op worker --concurrency 8``'s shape), beside the same bare loop.
2. Where the CPU goes (PostgreSQL on this machine only): one process runs
   the loop of 1. and then the bare loop, and each is charged its own CPU
   and that of the server backend serving its connection, read from
   ``/proc/<pid>/stat`` (user and system time; skipped when the server's
   processes cannot be read).  With eight workers on two cores both
   systems are CPU-bound, so the ratio of the two totals is about the
   throughput ratio above, and the server's share alone bounds what any
   change to the client can reach.
3. Submission alone, one process: ``submit`` with an idempotency key (the
   identity's lock, the lookup, the insert of the operation, its identity
   and its transition) beside a bare single-row ``INSERT; COMMIT``.  Target:
   at least 50% of the bare rate.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    DurableOperationService,
    PrincipalReference,
)
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.postgres_store import migrate
from fencekeeper.kernel.operations import EffectClass, RetryPolicy

DSN = os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ALICE = PrincipalReference("users", 1, "alice")
NOOP = DurableAction(
    "noop", 1, EffectClass.ATOMIC, lambda context, value: None, policy=RetryPolicy(maximum_attempts=3)
)


def _actions() -> DurableActionRegistry:
    return DurableActionRegistry((NOOP,))


def _ops_worker(url: str, name: str, seconds: float, barrier: Any, counts: mp.Queue) -> None:  # type: ignore[type-arg]
    store = open_operation_store(url, pool_size=1)
    resolvers = examples.resolvers()
    service = DurableOperationService(store, _actions(), resolvers)
    worker = DurableOperationWorker(store, _actions(), resolvers, tenant=name, worker_id=name,
                                    lease=timedelta(seconds=60))
    barrier.wait()
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        service.submit(tenant=name, principal=ALICE, action="noop", input={"n": done}, client_key=f"{name}-{done}")
        report = worker.run_once()
        assert report is not None and report.outcome == "succeeded", report
        done += 1
    store.close()
    counts.put(done)


THREADS = 8


def _ops_threads(url: str, name: str, seconds: float, barrier: Any, counts: mp.Queue) -> None:  # type: ignore[type-arg]
    """``_ops_worker``'s loop in THREADS threads of one process sharing one store, as ``op worker --concurrency``."""
    store = open_operation_store(url, pool_size=THREADS)
    resolvers = examples.resolvers()
    service = DurableOperationService(store, _actions(), resolvers)
    done = [0] * THREADS
    start = threading.Barrier(THREADS + 1)

    def loop(k: int) -> None:
        tenant = f"{name}-t{k}"
        worker = DurableOperationWorker(store, _actions(), resolvers, tenant=tenant, worker_id=tenant,
                                        lease=timedelta(seconds=60))
        start.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            service.submit(tenant=tenant, principal=ALICE, action="noop", input={"n": done[k]},
                           client_key=f"{tenant}-{done[k]}")
            report = worker.run_once()
            assert report is not None and report.outcome == "succeeded", report
            done[k] += 1

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start.wait()
    for thread in threads:
        thread.join()
    store.close()
    counts.put(sum(done))


def _submitter(url: str, name: str, seconds: float, barrier: Any, counts: mp.Queue) -> None:  # type: ignore[type-arg]
    store = open_operation_store(url, pool_size=1)
    service = DurableOperationService(store, _actions(), examples.resolvers())
    barrier.wait()
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        service.submit(tenant=name, principal=ALICE, action="noop", input={"n": done}, client_key=f"{name}-{done}")
        done += 1
    store.close()
    counts.put(done)


def _bare(url: str, name: str, seconds: float, barrier: Any, counts: mp.Queue, *, insert: bool = False) -> None:  # type: ignore[type-arg]
    row = abs(hash(name)) % 1_000_000
    done = 0
    if url.startswith("postgresql://"):
        dsn, schema = url.split("?schema=")
        with psycopg.connect(dsn) as conn:
            conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
            conn.execute("INSERT INTO bare (id, n) VALUES (%s, 0) ON CONFLICT DO NOTHING", (row,))
            conn.commit()
            barrier.wait()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if insert:
                    conn.execute("INSERT INTO bare_insert (id) VALUES (%s)", (f"{name}-{done}",))
                else:
                    conn.execute("UPDATE bare SET n = n + 1 WHERE id = %s", (row,))
                conn.commit()
                done += 1
    else:
        conn = sqlite3.connect(url, isolation_level=None, timeout=30)
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("INSERT OR IGNORE INTO bare (id, n) VALUES (?, 0)", (row,))
        barrier.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            conn.execute("BEGIN IMMEDIATE")
            if insert:
                conn.execute("INSERT INTO bare_insert (id) VALUES (?)", (f"{name}-{done}",))
            else:
                conn.execute("UPDATE bare SET n = n + 1 WHERE id = ?", (row,))
            conn.execute("COMMIT")
            done += 1
        conn.close()
    counts.put(done)


def _bare_insert(url: str, name: str, seconds: float, barrier: Any, counts: mp.Queue) -> None:  # type: ignore[type-arg]
    _bare(url, name, seconds, barrier, counts, insert=True)


def _run(target: object, url: str, processes: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    counts = ctx.Queue()
    barrier = ctx.Barrier(processes)
    names = [f"b{uuid.uuid4().hex[:6]}-{k}" for k in range(processes)]
    procs = [ctx.Process(target=target, args=(url, name, seconds, barrier, counts)) for name in names]
    for proc in procs:
        proc.start()
    total = sum(counts.get(timeout=600) for _ in procs)
    for proc in procs:
        proc.join()
    return total / seconds


@contextlib.contextmanager
def _database(backend: str) -> Any:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            path = str(Path(directory) / "bench.db")
            open_operation_store(path).close()
            conn = sqlite3.connect(path)
            conn.execute("CREATE TABLE bare (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
            conn.execute("CREATE TABLE bare_insert (id TEXT PRIMARY KEY)")
            conn.commit()
            conn.close()
            yield path
        return
    schema = f"fk_opsbench_{uuid.uuid4().hex[:8]}"
    migrate(DSN, schema)
    with psycopg.connect(DSN) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        conn.execute("CREATE TABLE bare (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute("CREATE TABLE bare_insert (id text PRIMARY KEY)")
    try:
        yield f"{DSN}?schema={schema}"
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        with _database(backend) as url:
            for workers in (1, 8):
                _report(f"{backend} {workers} worker(s): operations submitted and completed",
                        "bare commits", _pairs(_ops_worker, _bare, url, workers, args))
            # Eight workers as `fencekeeper op worker --concurrency 8` runs them: threads of one
            # process; the bare loop beside it is the same eight connections' as above.
            _report(f"{backend} 1 process of {THREADS} worker threads: operations submitted and completed",
                    f"bare commits ({THREADS} connections)",
                    _pairs(_ops_threads, _bare, url, (1, THREADS), args))
            if backend == "postgresql":
                cpu_split(url, 500, args.rounds)
            _report(f"{backend} submission with an idempotency key", "bare single-row inserts",
                    _pairs(_submitter, _bare_insert, url, 1, args))


def _backend_cpu(pid: int) -> tuple[float, float] | None:
    """User and system CPU seconds of server process ``pid``; None where it cannot be read (a remote server)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _charged(loop: Any, pid: int, count: int) -> tuple[float, float, float] | None:
    """Client CPU, the backend's user CPU and its system CPU per iteration of ``loop``, in microseconds."""
    before = _backend_cpu(pid)
    started = time.process_time()
    loop(count)
    client = time.process_time() - started
    after = _backend_cpu(pid)
    if before is None or after is None:
        return None
    return 1e6 * client / count, 1e6 * (after[0] - before[0]) / count, 1e6 * (after[1] - before[1]) / count


def cpu_split(url: str, count: int, rounds: int) -> None:
    """Section 2: client and server CPU per operation and per bare commit, one connection each."""
    store = open_operation_store(url, pool_size=1)
    resolvers = examples.resolvers()
    service = DurableOperationService(store, _actions(), resolvers)
    worker = DurableOperationWorker(store, _actions(), resolvers, tenant="cpu", worker_id="cpu",
                                    lease=timedelta(seconds=60))  # fmt: skip
    assert isinstance(store, PostgresOperationStore)
    pid = int(store.application_execute("SELECT pg_backend_pid()")[0][0])
    done = [0]

    def ours(n: int) -> None:
        for _ in range(n):
            k = done[0] = done[0] + 1
            service.submit(tenant="cpu", principal=ALICE, action="noop", input={"n": k}, client_key=f"cpu-{k}")
            report = worker.run_once()
            assert report is not None and report.outcome == "succeeded", report

    dsn, schema = url.split("?schema=")
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        conn.execute("INSERT INTO bare (id, n) VALUES (0, 0) ON CONFLICT DO NOTHING")
        conn.commit()
        bare_pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        conn.commit()

        def bare(n: int) -> None:
            for _ in range(n):
                conn.execute("UPDATE bare SET n = n + 1 WHERE id = 0")
                conn.commit()

        ours(50)
        bare(50)
        results = []
        for _ in range(rounds):
            mine, theirs = _charged(ours, pid, count), _charged(bare, bare_pid, count * 4)
            if mine is None or theirs is None:
                print("CPU split: the server's processes cannot be read here (not on this machine); skipped")
                store.close()
                return
            results.append((mine, theirs))
    store.close()
    op = [statistics.median(r[0][i] for r in results) for i in range(3)]
    commit = [statistics.median(r[1][i] for r in results) for i in range(3)]
    print(f"CPU per submitted-and-completed operation (µs, medians of {rounds} rounds of {count}): "
          f"client {op[0]:,.0f}, server user {op[1]:,.0f}, server system {op[2]:,.0f}, total {sum(op):,.0f}; "
          f"per bare commit: client {commit[0]:,.0f}, server user {commit[1]:,.0f}, server system "
          f"{commit[2]:,.0f}, total {sum(commit):,.0f}.  CPU-bound ratio {sum(commit) / sum(op):.1%}; "
          f"with no client CPU at all {sum(commit) / (op[1] + op[2]):.1%}", flush=True)  # fmt: skip


def _pairs(
    ours: object, bare: object, url: str, workers: int | tuple[int, int], args: argparse.Namespace
) -> list[tuple[float, float]]:
    """Each round measures ours and then the bare loop right after it: the disk under other load changes
    its fsync time from one minute to the next, so a ratio is taken within a round, never across rounds.
    ``workers``: processes of each, or (ours, the bare loop's) when they differ."""
    mine, theirs = workers if isinstance(workers, tuple) else (workers, workers)
    return [(_run(ours, url, mine, args.seconds), _run(bare, url, theirs, args.seconds)) for _ in range(args.rounds)]


def _report(what: str, reference: str, pairs: list[tuple[float, float]]) -> None:
    ratios = [o / b for o, b in pairs]
    print(
        f"{what}: {statistics.median(o for o, _ in pairs):,.0f}/s, {reference} "
        f"{statistics.median(b for _, b in pairs):,.0f}/s; median ratio {statistics.median(ratios):.1%} "
        f"(rounds {', '.join(f'{o:,.0f}/{b:,.0f}' for o, b in pairs)})",
        flush=True,
    )

if __name__ == "__main__":
    main()
