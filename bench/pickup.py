"""How soon an idle worker starts work submitted to it, beside Procrastinate's worker in the same run.

Run: ``python -m bench.pickup [--samples N] [--rounds N] [--gap SECONDS]`` (needs the ``bench`` extra,
``make .venv/.bench-installed``; PostgreSQL at FENCEKEEPER_PG_DSN or postgresql://postgres@127.0.0.1:5432/test).

Rules of this module:

- **What a user runs.** Each system's worker is the long-running command a user starts, with its
  defaults: ``fencekeeper op worker`` (durable operations, ``--poll`` 1 s), ``fencekeeper worker``
  (workflow executions, ``--poll`` 1 s) and ``procrastinate worker`` (its own LISTEN/NOTIFY and
  polling).  Each runs alone on an empty queue in a fresh schema of the bench's own database.
- **One submission at a time, to an idle worker.** The bench submits one piece of work (an atomic
  no-op transfer, a one-node execution through ``service.run``, a no-op coroutine job through
  ``defer``), then waits ``gap`` seconds, drawn afresh each time between one and two times
  ``--gap``, so that no submission lines up with a poll, and the worker has long finished and gone
  idle before the next.
- **Measured by the database's own clocks.** Pickup is the time from the submission's record to the
  start's, both written by the server: an Operation's ``admitted_at`` to its first Attempt's
  ``started_at``; an execution's first revision (its admission) to its second (the claim's transaction); a Procrastinate job's
  ``deferred`` event to its ``started`` one (Procrastinate stamps both with ``now()``, its
  transaction's start).  No process's clock and no polling of the bench's enters the figure.
- **Order and noise.** Rounds alternate which system goes first; each round prints each system's
  median, and the summary the median of the rounds' medians, the 90th percentile of every sample,
  and the ratio of the medians to Procrastinate's.  A worker that woke only on its poll would show
  a median near half its poll interval (500 ms at the defaults).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.e2e import BIN, BUSINESS, PRINCIPAL, ROOT, WORKFLOWS, Server, _search_path_url
from fencekeeper.adapters import connect, examples, service
from fencekeeper.adapters.operations import examples as op_examples
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableOperationService, PrincipalReference
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition

SYSTEMS = ("fencekeeper op worker", "fencekeeper worker", "procrastinate worker")
REFERENCE = "procrastinate worker"
STARTED_WITHIN = 30.0
"""Seconds a worker has to be listening and idle, and the last submission to be started, before the bench gives up."""


class PickupError(Exception):
    """A measurement that could not be taken as described: the message says which and why."""


def _gaps(samples: int, gap: float) -> list[float]:
    return [random.uniform(gap, 2 * gap) for _ in range(samples)]


def _started(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)


def _stopped(worker: subprocess.Popen[bytes], name: str) -> None:
    if worker.poll() is not None:
        raise PickupError(f"{name} exited early ({worker.returncode}): {worker.stderr.read().decode() if worker.stderr else ''}")
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _await(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STARTED_WITHIN
    while not done():
        if time.monotonic() > deadline:
            raise PickupError(f"not within {STARTED_WITHIN:g} s: {what}")
        time.sleep(0.05)


def _listening(server: Server, channel: str) -> bool:
    # An idle session's `query` is the last statement it ran: a worker's LISTEN.
    return bool(server.scalar(f"SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %{channel}%'"))


LISTENS_WITHIN = 5.0
"""Seconds a worker has to be seen listening; one that is not by then is said to poll only."""


def _ready(server: Server, channel: str, worker: subprocess.Popen[bytes], name: str) -> None:
    """Wait until ``worker`` listens on ``channel`` (or say it does not), then until its first claim found nothing."""
    deadline = time.monotonic() + LISTENS_WITHIN
    while not _listening(server, channel):
        if worker.poll() is not None:
            raise PickupError(f"{name} exited at its start ({worker.returncode})")
        if time.monotonic() > deadline:
            print(f"  ({name} is not listening on {channel}: it finds work by polling alone)", flush=True)
            break
        time.sleep(0.05)
    time.sleep(1.5)


def _milliseconds(rows: list[tuple[Any, ...]]) -> list[float]:
    return [(started - submitted).total_seconds() * 1000 for submitted, started in rows]


def _pickups(
    server: Server,
    *,
    name: str,
    command: list[str],
    env: dict[str, str],
    channel: str,
    submit: Callable[[int], object],
    finished: str,
    pickup: str,
    samples: int,
    gap: float,
) -> list[float]:
    """Start ``command``, ``submit`` ``samples`` times to it idle, then read each pickup (``pickup``: submitted, started)."""
    worker = _started(command, env)
    try:
        _ready(server, channel, worker, name)
        for n, pause in enumerate(_gaps(samples, gap)):
            submit(n)
            time.sleep(pause)
        _await(lambda: server.scalar(finished) == samples, f"{samples} submissions to {name} finished")
        _stopped(worker, name)
        return _milliseconds(server.conn.execute(pickup).fetchall())
    finally:
        if worker.poll() is None:
            worker.kill()


def operations(server: Server, samples: int, gap: float) -> list[float]:
    """Pickup of one atomic transfer at a time by an idle ``fencekeeper op worker``, in milliseconds."""
    schema = server.fresh_schema("fk_ops")
    connect.migrate(server.url, schema=schema)
    store = PostgresOperationStore(server.url, schema=schema, pool_size=1)
    service = DurableOperationService(store, op_examples.registry(), op_examples.resolvers())
    alice = PrincipalReference("users", 1, "alice")

    def submit(n: int) -> object:
        value = {"from": "acc-1", "to": "acc-2", "amount": 1}
        return service.submit(tenant="default", principal=alice, action="transfer", input=value, client_key=f"k-{n}")

    try:
        # A worker that never listens (a tree from before operations had a channel) is measured all the same:
        # it finds work by its poll alone, which is what the figure then shows.
        return _pickups(
            server,
            name="fencekeeper op worker",
            command=[str(BIN / "fencekeeper"), "op", "worker", "--db", f"{server.url}?schema={schema}", "--id", "pickup"],
            env=dict(os.environ),
            channel=f"fencekeeper_operations:{schema}",
            submit=submit,
            finished=f"SELECT count(*) FROM {schema}.operations WHERE outcome IS NOT NULL",
            pickup=f"SELECT o.admitted_at, a.started_at FROM {schema}.operations o "
            f"JOIN {schema}.operation_attempts a ON a.operation_id = o.operation_id AND a.number = 1",
            samples=samples,
            gap=gap,
        )
    finally:
        store.close()
        server.drop_schema(schema)


def executions(server: Server, samples: int, gap: float) -> list[float]:
    """Pickup of one one-node execution at a time by an idle ``fencekeeper worker``, in milliseconds."""
    schema = server.fresh_schema("fk")
    connect.migrate(server.url, schema=schema)
    definition = parse_definition(WORKFLOWS["one-node"], "bench:one-node")
    policy = examples.grants(BUSINESS, PRINCIPAL)
    store = connect.open_store(server.url, schema=schema, pool_size=1)

    def submit(n: int) -> object:
        outcome = service.run(
            store, policy, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id=definition.definition_id,
            input={"order_id": f"o-{n}", "amount": n}, execution_id=f"e-{n}",
        )  # fmt: skip
        if not isinstance(outcome, p.Decision):
            raise PickupError(f"fencekeeper: admission {n} refused: {outcome}")
        return outcome

    try:
        service.register(store, definition, BUSINESS, PRINCIPAL, policy)
        return _pickups(
            server,
            name="fencekeeper worker",
            command=[str(BIN / "fencekeeper"), "worker", "--db", server.url, "--schema", schema, "--id", "pickup", "--json"],
            env=dict(os.environ),
            channel=f"fencekeeper_eligible:{schema}",
            submit=submit,
            finished=f"SELECT count(*) FROM {schema}.objects WHERE object_type = 'WorkflowExecution' AND state = 'succeeded'",
            # The admission is the execution's first revision; the claim's transaction wrote its second.
            pickup=f"SELECT o.created_at, min(r.committed_at) FROM {schema}.objects o JOIN {schema}.object_revisions r "
            "ON r.object_id = o.object_id AND r.revision > 1 WHERE o.object_type = 'WorkflowExecution' "
            "GROUP BY o.object_id, o.created_at",
            samples=samples,
            gap=gap,
        )
    finally:
        store.close()
        server.drop_schema(schema)


def procrastinate(server: Server, samples: int, gap: float) -> list[float]:
    """Pickup of one no-op coroutine job at a time by an idle ``procrastinate worker``, in milliseconds."""
    import procrastinate  # noqa: PLC0415 - the bench extra

    from bench.e2e_procrastinate import app  # noqa: PLC0415

    schema = server.fresh_schema("procrastinate")
    dsn = _search_path_url(server.url, schema)
    server.conn.execute(f"CREATE SCHEMA {schema}")
    try:
        with app.replace_connector(procrastinate.SyncPsycopgConnector(conninfo=dsn)) as sync_app, sync_app.open():
            sync_app.schema_manager.apply_schema()
            return _pickups(
                server,
                name="procrastinate worker",
                command=[str(BIN / "procrastinate"), "--app", "bench.e2e_procrastinate.app", "worker", "--concurrency", "1"],
                env=dict(os.environ, FK_BENCH_PROCRASTINATE_DSN=dsn, PYTHONPATH=str(ROOT)),
                channel="procrastinate_any_queue",
                submit=lambda n: sync_app.configure_task("noop_async").defer(),
                finished=f"SELECT count(*) FROM {schema}.procrastinate_jobs WHERE status = 'succeeded'",
                pickup=f"SELECT d.at, s.at FROM {schema}.procrastinate_events d JOIN {schema}.procrastinate_events s "
                "ON s.job_id = d.job_id AND s.type = 'started' WHERE d.type = 'deferred'",
                samples=samples,
                gap=gap,
            )
    finally:
        server.drop_schema(schema)


MEASURE: dict[str, Callable[[Server, int, float], list[float]]] = {
    "fencekeeper op worker": operations,
    "fencekeeper worker": executions,
    "procrastinate worker": procrastinate,
}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pickup", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=40, help="submissions per system and round (default 40)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternating the order (default 3)")
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between submissions, at least (default 0.25)")
    args = parser.parse_args(argv)
    server = Server(os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"))
    print(f"PostgreSQL {server.version}; {args.samples} submissions a system and round, {args.gap:g} to {2 * args.gap:g} s apart")
    medians: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    every: dict[str, list[float]] = {name: [] for name in SYSTEMS}
    try:
        for round_number in range(args.rounds):
            order = SYSTEMS if round_number % 2 == 0 else tuple(reversed(SYSTEMS))
            for name in order:
                values = MEASURE[name](server, args.samples, args.gap)
                if len(values) != args.samples:
                    raise PickupError(f"{name}: {len(values)} pickups recorded of {args.samples}")
                medians[name].append(statistics.median(values))
                every[name] += values
                print(
                    f"round {round_number + 1}: {name:<22} median {statistics.median(values):7.1f} ms, "
                    f"90th percentile {_percentile(values, 0.9):7.1f} ms, max {max(values):7.1f} ms",
                    flush=True,
                )
    except PickupError as exc:
        print(f"bench.pickup: {exc}", file=sys.stderr)
        return 1
    finally:
        server.close()
    reference = statistics.median(medians[REFERENCE])
    print(f"\npickup by an idle worker, median of the rounds' medians (90th percentile of all {args.rounds * args.samples}):")
    for name in SYSTEMS:
        ours = statistics.median(medians[name])
        ratio = "" if name == REFERENCE else f"  {ours / reference:.2f}x {REFERENCE}'s"
        print(f"  {name:<22} {ours:7.1f} ms ({_percentile(every[name], 0.9):.1f} ms){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MEASURE", "SYSTEMS", "main"]

