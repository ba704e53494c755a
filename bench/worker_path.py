"""The path a user runs, ``fencekeeper worker``, beside a bare commit loop measured in the same run.

Run: ``python -m bench.worker_path`` (PostgreSQL from FENCEKEEPER_PG_DSN or
postgresql://postgres@127.0.0.1:5432/test; skipped when unreachable).

1. Round trips.  One in-process :class:`~fencekeeper.adapters.worker.Worker`
   drains executions the way ``fencekeeper worker`` does (``run_pass`` with
   one claim at a time until a pass finds nothing), with a handler that does
   no I/O.  Printed: round trips (statements on SQLite) and transactions per
   execution, counted by :mod:`fencekeeper.adapters.testing.roundtrips`
   after a warm-up, so statements prepared once per connection are not
   counted.  Counting is not timing: these figures do not depend on load.
2. In-process throughput: the same worker, timed (after a warm-up)
   draining ``--executions``, beside the bare commit loop below.
3. Throughput.  ``--executions`` are admitted through ``service.run``, then
   1 or 8 ``fencekeeper worker --until-idle`` processes (each one thread)
   drain them; the time runs from the start of the processes to the exit of
   the last, start-up included, as a user pays it.  The reference, in the
   same round: a bare loop committing one small UPDATE per transaction, on
   one connection (the cheapest durable decision a database offers).
   Printed: executions/s, bare commits/s, and their ratio, medians over
   ``--rounds``.

Workflows: one node (start at ``end``) and two nodes (``local_command``,
then ``end``).  The machine these run on is shared: quote medians, and
compare ratios rather than absolute figures.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.postgres_store import PostgresStore, migrate
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.adapters.testing.roundtrips import ONE_NODE, TWO_NODE, counting
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState

DSN = os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BUSINESS = "default"
PRINCIPAL = "user:operator"
ROOT = Path(__file__).resolve().parent.parent

WORKFLOWS = {"one-node": ONE_NODE, "two-node": TWO_NODE}


class NoopHandler:
    """A handler that applies nothing and answers SUCCEEDED: the no-op job of a queue benchmark."""

    def execute(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)

    def reconcile(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED)


def noop_handler() -> NoopHandler:
    """``--handler bench.worker_path:noop_handler``."""
    return NoopHandler()


def admit(store: TransactionalStore, workflow: str, count: int) -> None:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(WORKFLOWS[workflow]), BUSINESS, PRINCIPAL, policy)
    for n in range(count):
        outcome = service.run(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=PRINCIPAL,
            definition_id=workflow,
            input={"order_id": f"o-{n}"} if workflow == "two-node" else {},
        )
        assert isinstance(outcome, p.Decision), outcome


def drain(worker: Worker) -> int:
    """Run passes as ``fencekeeper worker`` does (one claim each) until one finds nothing; executions finished."""
    finished = 0
    while True:
        report = worker.run_pass(max_claims=1)
        assert not report.refused, report.refused
        finished += sum(report.finished.values())
        if not report.claimed and not report.timers_fired:
            return finished


@contextmanager
def pg_schema() -> Iterator[str]:
    schema = f"fk_bench_{uuid.uuid4().hex[:10]}"
    migrate(DSN, schema)
    try:
        yield schema
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@contextmanager
def opened(backend: str) -> Iterator[tuple[TransactionalStore, str]]:
    """A fresh store and the --db URL that names it."""
    if backend == "postgresql":
        with pg_schema() as schema:
            store = PostgresStore(DSN, schema=schema, pool_size=2)
            try:
                yield store, f"{DSN}?schema={schema}"
            finally:
                store.close()
        return
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bench.db"
        sqlite_store = SQLiteStore(path)
        try:
            yield sqlite_store, str(path)
        finally:
            sqlite_store.close()


def per_execution(backend: str, workflow: str, count: int, warm: int = 5) -> tuple[float, float]:
    """(round trips, transactions) per execution, for one in-process worker, after ``warm`` executions."""
    with opened(backend) as (store, _):
        worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), NoopHandler(), business_id=BUSINESS)
        admit(store, workflow, warm)
        assert drain(worker) == warm
        admit(store, workflow, count)
        with counting(store) as tally:
            assert drain(worker) == count
        return tally.round_trips / count, tally.transactions / count


def in_process(backend: str, workflow: str, count: int) -> float:
    """Executions/s of one in-process worker draining ``count`` (no process start-up; a warm-up first)."""
    with opened(backend) as (store, _):
        worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), NoopHandler(), business_id=BUSINESS)
        admit(store, workflow, 5)
        drain(worker)
        admit(store, workflow, count)
        started = time.perf_counter()
        assert drain(worker) == count
        return count / (time.perf_counter() - started)


def bare_commits(backend: str, count: int) -> float:
    """Commits/s of one small UPDATE per transaction on one connection."""
    if backend == "postgresql":
        with pg_schema() as schema, psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {schema}.bare (id int PRIMARY KEY, n bigint)")
            conn.execute(f"INSERT INTO {schema}.bare VALUES (1, 0)")
            query = f"UPDATE {schema}.bare SET n = n + 1 WHERE id = 1"
            started = time.perf_counter()
            for _ in range(count):
                conn.execute(query)
            return count / (time.perf_counter() - started)
    with tempfile.TemporaryDirectory() as directory:
        lite = sqlite3.connect(Path(directory) / "bare.db", isolation_level=None)
        lite.execute("PRAGMA journal_mode=WAL")
        lite.execute("PRAGMA synchronous=FULL")
        lite.execute("CREATE TABLE bare (id INTEGER PRIMARY KEY, n INTEGER)")
        lite.execute("INSERT INTO bare VALUES (1, 0)")
        started = time.perf_counter()
        for _ in range(count):
            lite.execute("BEGIN IMMEDIATE")
            lite.execute("UPDATE bare SET n = n + 1 WHERE id = 1")
            lite.execute("COMMIT")
        elapsed = time.perf_counter() - started
        lite.close()
        return count / elapsed


def worker_processes(backend: str, workflow: str, count: int, processes: int) -> float:
    """Executions/s of ``processes`` ``fencekeeper worker --until-idle`` processes draining ``count``."""
    with opened(backend) as (store, url):
        admit(store, workflow, count)
        command = [
            str(Path(sys.executable).parent / "fencekeeper"), "worker", "--db", url, "--until-idle",
            "--handler", "bench.worker_path:noop_handler",
        ]
        started = time.perf_counter()
        running = [
            subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(processes)
        ]
        for process in running:
            _, err = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"fencekeeper worker exited {process.returncode}: {err.decode()}")
        elapsed = time.perf_counter() - started
        left = [x for x in store.execution_ids() if x not in store.execution_ids(ExecutionState.SUCCEEDED)]
        assert not left, f"{len(left)} executions not succeeded"
        return count / elapsed


def _pg_reachable() -> bool:
    try:
        psycopg.connect(DSN, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


def _median_row(label: str, ours: list[float], reference: list[float]) -> str:
    ratios = [a / b for a, b in zip(ours, reference, strict=True)]
    return (
        f"{label:<36} {statistics.median(ours):>9,.0f}/s  [{', '.join(f'{x:,.0f}' for x in ours)}]"
        f"   bare {statistics.median(reference):>7,.0f}/s   ratio {statistics.median(ratios):.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.worker_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--backend", choices=["postgresql", "sqlite"], nargs="+", default=["postgresql", "sqlite"])
    parser.add_argument("--workflow", choices=sorted(WORKFLOWS), nargs="+", default=list(WORKFLOWS))
    parser.add_argument("--count-only", action="store_true", help="print the round-trip counts only")
    parser.add_argument("--no-count", action="store_true", help="skip the round-trip counts")
    parser.add_argument("--in-process-only", action="store_true", help="skip the worker processes")
    args = parser.parse_args(argv)
    backends = [b for b in args.backend if b != "postgresql" or _pg_reachable()]
    print(f"fencekeeper bench: the worker path; python {sys.version.split()[0]}, psycopg {psycopg.__version__}")
    print("shared machine: figures are medians of rounds; compare ratios, not absolute rates\n")
    for backend in [] if args.no_count else backends:
        for workflow in args.workflow:
            trips, transactions = per_execution(backend, workflow, 50)
            unit = "round trips" if backend == "postgresql" else "statements"
            print(f"{backend:<10} {workflow:<9} in-process worker: {trips:5.1f} {unit}, "
                  f"{transactions:4.1f} transactions per execution")
    if args.count_only:
        return 0
    print()
    for backend in backends:
        for workflow in args.workflow:
            rates: list[float] = []
            bare: list[float] = []
            for _ in range(args.rounds):
                bare.append(bare_commits(backend, 2000))
                rates.append(in_process(backend, workflow, args.executions))
            print(_median_row(f"{backend} {workflow} in-process worker", rates, bare), flush=True)
    if args.in_process_only:
        return 0
    print()
    for backend in backends:
        for workflow in args.workflow:
            for processes in args.processes:
                ours: list[float] = []
                reference: list[float] = []
                for _ in range(args.rounds):
                    reference.append(bare_commits(backend, 2000))
                    ours.append(worker_processes(backend, workflow, args.executions, processes))
                label = f"{backend} {workflow} x{processes} worker"
                print(_median_row(label, ours, reference), flush=True)
    return 0


run: Callable[[list[str] | None], int] = main

if __name__ == "__main__":
    raise SystemExit(main())
