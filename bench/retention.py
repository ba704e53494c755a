"""Worker throughput while pruning runs, beside the same workers without it, measured in the same run.

Run: ``python -m bench.retention [--seconds S] [--rounds N] [--workers W] [--backends sqlite,postgresql]``
(PostgreSQL: FENCEKEEPER_PG_DSN or a server at postgresql://postgres@127.0.0.1:5432/test).

The store is filled with ``--backlog`` Operations that ended 90 days ago,
each with its transitions, attempt, identity and exported outbox rows
(cloned in SQL from one real Operation, so filling takes seconds).  Each
round measures W worker processes submitting and completing operations
(``bench.operations``' loop: three transactions per operation) for S
seconds alone, then for S seconds while one more process prunes that
backlog (``retention.prune``, default windows, ``--batch`` rows per
transaction) in a loop.  The figure is the median of the rounds' own
ratios, with-pruning over without; the target (issue 20) is at least 80%.
The pruner's own rate is printed beside it, to show it was working.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.operations import ALICE, DSN, _actions, _database, _ops_worker
from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.operations.service import DurableOperationService
from fencekeeper.adapters.operations.sql import COLUMNS
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.outbox import OutboxExporter
from fencekeeper.adapters.retention import RetentionWindows, prune
from fencekeeper.adapters.store import ManualClock

_ = DSN  # the PostgreSQL server bench.operations uses


class _Nowhere:
    def send(self, message: object) -> None:
        pass

    def flush(self) -> None:
        pass


def _fill(url: str, backlog: int) -> None:
    """``backlog`` ended Operations from 90 days ago: one made through the service, cloned in SQL."""
    clock = ManualClock(datetime.now(UTC) - timedelta(days=90))
    store = open_operation_store(url, clock=clock, pool_size=1)
    resolvers = examples.resolvers()
    service = DurableOperationService(store, _actions(), resolvers)
    template = service.submit(tenant="old", principal=ALICE, action="noop", input={"n": 0},
                              client_key=f"tmpl-{uuid.uuid4().hex[:6]}").operation_id  # fmt: skip
    worker = DurableOperationWorker(store, _actions(), resolvers, tenant="old", worker_id="w-old",
                                    lease=timedelta(seconds=60))  # fmt: skip
    assert worker.run_once() is not None
    OutboxExporter(store, _Nowhere()).run(until_idle=True)
    pg = url.startswith("postgresql://")
    series = "generate_series(1, ?) AS n(i)" if pg else "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) SELECT i FROM s) AS n"
    new_id = f"'{template}-' || n.i"
    columns = [*COLUMNS, "input", "ended_at", "result_expired_at"]
    chosen = [new_id if c == "operation_id" else ("'k-' || n.i" if c == "client_key" else c) for c in columns]
    run = getattr(store, "application_execute")  # noqa: B009 - both SQL stores have it
    run(f"INSERT INTO operations ({', '.join(columns)}) SELECT {', '.join(chosen)} FROM operations, {series} "
        "WHERE operation_id = ?", (backlog, template))  # fmt: skip
    run(f"INSERT INTO operation_transitions (operation_id, revision, event, from_state, to_state, at, actor, fence, "
        f"reason) SELECT {new_id}, revision, event, from_state, to_state, at, actor, fence, reason "
        f"FROM operation_transitions, {series} WHERE operation_id = ?", (backlog, template))  # fmt: skip
    run(f"INSERT INTO operation_attempts (operation_id, number, worker_id, state, started_at, ended_at, error_code) "
        f"SELECT {new_id}, number, worker_id, state, started_at, ended_at, error_code FROM operation_attempts, "
        f"{series} WHERE operation_id = ?", (backlog, template))  # fmt: skip
    run(f"INSERT INTO operation_identities (namespace, tenant, principal, client_key, operation_id, retain_until) "
        f"SELECT namespace, tenant, principal, 'k-' || n.i, {new_id}, retain_until FROM operation_identities, "
        f"{series} WHERE operation_id = ?", (backlog, template))  # fmt: skip
    run(f"INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload, exported_at) "
        f"SELECT {new_id} || '/' || n.i || '/' || seq, kind, {new_id}, tenant, topic, at, payload, exported_at "
        f"FROM outbox, {series} WHERE subject_id = ?", (backlog, template))  # fmt: skip
    store.close()


def _pruner(url: str, batch: int, seconds: float, barrier: Any, counts: mp.Queue) -> None:  # type: ignore[type-arg]
    store = open_operation_store(url, pool_size=1)
    barrier.wait()
    report = prune(store, RetentionWindows(), batch_size=batch, time_limit=seconds)
    removed = report.identities + report.transitions + report.attempts + report.operations + report.outbox
    removed += report.results_expired
    store.close()
    counts.put(-removed - 1)  # negative: told apart from the workers' counts


def _round(url: str, workers: int, seconds: float, batch: int, pruning: bool) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    counts = ctx.Queue()
    barrier = ctx.Barrier(workers + int(pruning))
    names = [f"b{uuid.uuid4().hex[:6]}-{k}" for k in range(workers)]
    procs = [ctx.Process(target=_ops_worker, args=(url, name, seconds, barrier, counts)) for name in names]
    if pruning:
        procs.append(ctx.Process(target=_pruner, args=(url, batch, seconds, barrier, counts)))
    for proc in procs:
        proc.start()
    results = [counts.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    done = sum(r for r in results if r >= 0)
    pruned = sum(-r - 1 for r in results if r < 0)
    return done / seconds, pruned / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        with _database(backend) as url:
            _fill(url, args.backlog)
            pairs = []
            for _ in range(args.rounds):
                alone, _ = _round(url, args.workers, args.seconds, args.batch, pruning=False)
                busy, rate = _round(url, args.workers, args.seconds, args.batch, pruning=True)
                pairs.append((busy, alone, rate))
            ratios = [b / a for b, a, _ in pairs]
            print(
                f"{backend} {args.workers} workers: {statistics.median(b for b, _, _ in pairs):,.0f} ops/s while "
                f"pruning (batch {args.batch}), {statistics.median(a for _, a, _ in pairs):,.0f} ops/s without; "
                f"median ratio {statistics.median(ratios):.1%}; pruner {statistics.median(r for _, _, r in pairs):,.0f} "
                f"rows/s (rounds {', '.join(f'{b:,.0f}/{a:,.0f}' for b, a, _ in pairs)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
