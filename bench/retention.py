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

``--kind executions``: the backlog is of workflow executions that ended 90
days ago instead (each with its evidence objects, revisions and dispatch
row, cloned in SQL from one real purchase approval), and the pruner runs
with ``executions=30d``; the workers are the same Operation workers, so the
figure is what pruning executions costs the rest of the store.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.operations import ALICE, DSN, _actions, _database, _ops_worker
from fencekeeper.adapters import connect, service
from fencekeeper.adapters import examples as execution_examples
from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.operations.service import DurableOperationService
from fencekeeper.adapters.operations.sql import COLUMNS
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.outbox import OutboxExporter
from fencekeeper.adapters.retention import RetentionWindows, prune
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel.definition import parse_definition

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


def _fill_executions(url: str, backlog: int) -> None:
    """``backlog`` workflow executions that ended 90 days ago: one run through a worker, cloned in SQL."""
    clock = ManualClock(datetime.now(UTC) - timedelta(days=90))
    store = connect.open_store(url, clock=clock)
    policy = execution_examples.grants("default", "user:operator")
    path = Path(__file__).resolve().parents[1] / "docs" / "examples" / "purchase_approval.toml"
    definition = parse_definition(path.read_text(encoding="utf-8"), path.name)
    service.register(store, definition, "default", "user:operator", policy)
    template = f"tmpl-{uuid.uuid4().hex[:6]}"
    service.run(store, policy, business_id="default", principal_id="user:operator",
                definition_id=definition.definition_id, execution_id=template,
                input={"amount": 5, "order_id": "o-1", "order_revision": 1})  # fmt: skip
    worker = Worker(store, "w-old", policy, execution_examples.handler(), business_id="default")
    while worker.run_pass().claimed:
        pass
    store.close()
    ops = open_operation_store(url, pool_size=1)
    pg = url.startswith("postgresql://")
    series = "generate_series(1, ?) AS n(i)" if pg else "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?) SELECT i FROM s) AS n"
    run = getattr(ops, "application_execute")  # noqa: B009 - both SQL stores have it
    mine = "(object_id = ? OR parent_id = ?)"
    # The execution's objects first, then its evidence (which references it), each id suffixed with n.
    for first in ("parent_id IS NULL", "parent_id IS NOT NULL"):
        run(f"INSERT INTO objects (object_id, object_type, business_id, parent_id, revision, state, created_at, "
            f"updated_at) SELECT object_id || '-' || n.i, object_type, business_id, parent_id || '-' || n.i, revision, "
            f"state, created_at, updated_at FROM objects, {series} WHERE {mine} AND {first}",
            (backlog, template, template))  # fmt: skip
    run(f"INSERT INTO object_revisions (object_id, revision, state, body, committed_at, event, from_state, actor, "
        f"lease_token, fence, reason) SELECT r.object_id || '-' || n.i, r.revision, r.state, r.body, r.committed_at, "
        f"r.event, r.from_state, r.actor, r.lease_token, r.fence, r.reason FROM object_revisions r "
        f"JOIN objects o ON o.object_id = r.object_id, {series} WHERE (o.object_id = ? OR o.parent_id = ?)",
        (backlog, template, template))  # fmt: skip
    run(f"INSERT INTO workflow_dispatch (workflow_execution_id, dispatch_state, eligible_at, lease_token, leased_by, "
        f"lease_expires_at, step_count, last_error_code) SELECT workflow_execution_id || '-' || n.i, dispatch_state, "
        f"eligible_at, lease_token, leased_by, lease_expires_at, step_count, last_error_code FROM workflow_dispatch, "
        f"{series} WHERE workflow_execution_id = ?", (backlog, template))  # fmt: skip
    if pg:
        # What autovacuum would have done after so many inserts: without statistics the planner takes
        # the tables for empty and scans them whole in every batch.
        for table in ("objects", "object_revisions", "workflow_dispatch"):
            run(f"ANALYZE {table}")
    ops.close()


def _pruner(url: str, batch: int, seconds: float, barrier: Any, counts: mp.Queue) -> None:  # type: ignore[type-arg]
    store = open_operation_store(url, pool_size=1)
    barrier.wait()
    report = prune(store, RetentionWindows(executions=timedelta(days=30)), batch_size=batch, time_limit=seconds)
    removed = report.identities + report.transitions + report.attempts + report.operations + report.outbox
    removed += report.results_expired + report.execution_rows
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
    parser.add_argument("--kind", choices=("operations", "executions"), default="operations", help="the backlog")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        with _database(backend) as url:
            (_fill if args.kind == "operations" else _fill_executions)(url, args.backlog)
            pairs = []
            for _ in range(args.rounds):
                alone, _ = _round(url, args.workers, args.seconds, args.batch, pruning=False)
                busy, rate = _round(url, args.workers, args.seconds, args.batch, pruning=True)
                pairs.append((busy, alone, rate))
            ratios = [b / a for b, a, _ in pairs]
            print(
                f"{backend} {args.kind} backlog, {args.workers} workers: {statistics.median(b for b, _, _ in pairs):,.0f} ops/s while "
                f"pruning (batch {args.batch}), {statistics.median(a for _, a, _ in pairs):,.0f} ops/s without; "
                f"median ratio {statistics.median(ratios):.1%}; pruner {statistics.median(r for _, _, r in pairs):,.0f} "
                f"rows/s (rounds {', '.join(f'{b:,.0f}/{a:,.0f}' for b, a, _ in pairs)})",
                flush=True,
            )


if __name__ == "__main__":
    main()
