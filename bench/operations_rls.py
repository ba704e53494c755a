"""What the tenant boundary costs: operations as the restricted role under forced row-level security.

Run: ``python -m bench.operations_rls [--seconds S] [--rounds N]`` (PostgreSQL:
FENCEKEEPER_PG_DSN or a server at postgresql://postgres@127.0.0.1:5432/test).

One process submits an operation of an atomic no-op action and runs one
worker pass on it (claim, resolve, guarded completion: three transactions),
for S seconds, three ways, back to back in each round:

- reference: as the schema's owner, a superuser, whom the policies of
  migration 9 do not bind (what every operation cost before them);
- bound: as a restricted role whose store is bound to its tenant (the
  setting travels in the connection request), so every statement is
  filtered and every write checked by the policies;
- scoped: the same role with the store unbound and each call inside
  ``tenant_scope`` (the HTTP boundary's way: one ``set_config`` more per
  transaction).

Printed: each figure's median over the rounds, and the median of the
rounds' own ratios to the reference.  A role made for the run is dropped
at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
from psycopg.conninfo import make_conninfo

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    DurableOperationService,
    PrincipalReference,
)
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.postgres_store import migrate
from fencekeeper.kernel.operations import EffectClass

DSN = os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ALICE = PrincipalReference("users", 1, "alice")
NOOP = DurableAction("noop", 1, EffectClass.ATOMIC, lambda context, value: None)
TABLES = "operations, operation_identities, operation_attempts, operation_transitions, operation_outbox"


def _rate(store: PostgresOperationStore, tenant: str, seconds: float, wrap: Callable[[], contextlib.AbstractContextManager[None]]) -> float:
    actions = DurableActionRegistry((NOOP,))
    resolvers = examples.resolvers()
    service = DurableOperationService(store, actions, resolvers)
    worker = DurableOperationWorker(store, actions, resolvers, tenant=tenant, worker_id="w", lease=timedelta(seconds=60))
    prefix = uuid.uuid4().hex[:8]
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        with wrap():
            service.submit(tenant=tenant, principal=ALICE, action="noop", input={"n": done}, client_key=f"{prefix}-{done}")
            report = worker.run_once()
        assert report is not None and report.outcome == "succeeded", report
        done += 1
    return done / seconds


@contextlib.contextmanager
def _schema_and_role() -> Iterator[tuple[str, str]]:
    schema = f"fk_rlsbench_{uuid.uuid4().hex[:8]}"
    role = f"fk_rlsbench_{uuid.uuid4().hex[:8]}"
    migrate(DSN, schema)
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS")  # type: ignore[arg-type]
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")  # type: ignore[arg-type]
        conn.execute(f"GRANT SELECT ON {schema}.schema_migrations TO {role}")  # type: ignore[arg-type]
        conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON {TABLES} TO {role}")  # type: ignore[arg-type]
    try:
        yield schema, role
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
            conn.execute(f"DROP OWNED BY {role}")  # type: ignore[arg-type]
            conn.execute(f"DROP ROLE {role}")  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"reference": [], "bound": [], "scoped": []}
    with _schema_and_role() as (schema, role):
        as_role = make_conninfo(DSN, user=role)
        owner = PostgresOperationStore(DSN, schema=schema, pool_size=1)
        bound = PostgresOperationStore(as_role, schema=schema, pool_size=1, tenant="t-bound")
        scoped = PostgresOperationStore(as_role, schema=schema, pool_size=1)
        try:
            for _ in range(args.rounds):
                figures["reference"].append(_rate(owner, "t-owner", args.seconds, contextlib.nullcontext))
                figures["bound"].append(_rate(bound, "t-bound", args.seconds, contextlib.nullcontext))
                figures["scoped"].append(_rate(scoped, "t-scoped", args.seconds, lambda: scoped.tenant_scope("t-scoped")))
        finally:
            for store in (owner, bound, scoped):
                store.close()
    reference = figures["reference"]
    print(f"operations submitted and completed per second, one process, median of {args.rounds} rounds of {args.seconds:g} s")
    print(f"  reference (owner, policies bypassed): {statistics.median(reference):8.1f}/s")
    for name in ("bound", "scoped"):
        ratios = [ours / ref for ours, ref in zip(figures[name], reference, strict=True)]
        print(f"  restricted role, {name:<6}:             {statistics.median(figures[name]):8.1f}/s  ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
