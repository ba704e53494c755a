"""The worker on a schema PostgreSQL has no statistics for, beside the same drain after ``ANALYZE``.

Run: ``python -m bench.fresh_schema [--executions N] [--rounds R]`` (PostgreSQL from
FENCEKEEPER_PG_DSN or postgresql://postgres@127.0.0.1:5432/test; the server must be
on this machine, since its backend's CPU is read from ``/proc``).

A new deployment's first queue meets a planner without statistics until
autovacuum analyses the tables (up to a minute after enough rows changed,
by default).  Each round drains ``N`` two-node executions with one
in-process worker on one connection twice: on a new schema whose tables
were never analysed, and on a new schema analysed after admission (the
reference: the plans PostgreSQL makes once it knows the tables).  Printed:
the client's CPU, the server backend's CPU (user and system) and the wall
time per execution, and the ratio of the server's CPU without statistics to
with them.  A ratio near 1 means no statement's plan depends on statistics
the first minutes lack (bench/README.md, "Plans made without statistics").
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psycopg

from fencekeeper.adapters import examples
from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.worker import Worker

from .worker_path import BUSINESS, DSN, PRINCIPAL, NoopHandler, admit, drain, pg_schema


def _cpu(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def one_drain(executions: int, *, analysed: bool) -> tuple[float, float, float, float]:
    """(client, server user, server system, wall) microseconds per two-node execution, one worker, one connection."""
    with pg_schema() as schema:
        admitting = PostgresStore(DSN, schema=schema, pool_size=1)
        store = PostgresStore(DSN, schema=schema, pool_size=1)
        try:
            worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), NoopHandler(), business_id=BUSINESS)
            # A warm-up on the new tables: the store prepares its statements, and PostgreSQL plans them,
            # while the tables are small, as a deployment's first executions do.
            admit(admitting, "two-node", 20)
            drain(worker)
            admit(admitting, "two-node", executions)
            if analysed:
                with psycopg.connect(DSN, autocommit=True) as conn:
                    conn.execute(f"ANALYZE {schema}.objects, {schema}.object_revisions, {schema}.workflow_dispatch")
            with store._pool.connection() as conn:
                [(pid,)] = conn.execute("SELECT pg_backend_pid()").fetchall()
            before, started, clock = _cpu(pid), time.process_time(), time.perf_counter()
            assert drain(worker) == executions
            wall, client, after = time.perf_counter() - clock, time.process_time() - started, _cpu(pid)
        finally:
            store.close()
            admitting.close()
    per = 1e6 / executions
    return client * per, (after[0] - before[0]) * per, (after[1] - before[1]) * per, wall * per


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"two-node executions, {args.executions} queued, one in-process worker on one connection; "
          "microseconds per execution")  # fmt: skip
    print(f"{'round':>5} {'statistics':>11} {'client':>8} {'srv user':>9} {'srv sys':>8} {'wall':>8}")
    ratios = []
    for number in range(1, args.rounds + 1):
        # Alternated, so that a slower minute of the machine does not fall on one side only.
        order = (False, True) if number % 2 else (True, False)
        results = {}
        for analysed in order:
            results[analysed] = one_drain(args.executions, analysed=analysed)
            client, user, system, wall = results[analysed]
            label = "analysed" if analysed else "none"
            print(f"{number:>5} {label:>11} {client:>8.0f} {user:>9.0f} {system:>8.0f} {wall:>8.0f}", flush=True)
        ratios.append(sum(results[False][1:3]) / sum(results[True][1:3]))
    print(f"server CPU without statistics / with them: median {statistics.median(ratios):.2f} "
          f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
