"""A worker or a client in its own process, for the operation fault tests.

``python -m tests.operations.fault_child MODE URL [ARG]``:

- ``kill-inside``: claims the one due transfer and runs it with an atomic
  action that writes the application's tables, prints ``INSIDE`` and then
  sleeps inside the transaction until it is killed;
- ``stop-before``: claims it (lease 1 s), prints ``CLAIMED`` and pauses
  half a second before the effect (the test stops it there), then runs the
  transfer and prints the report's outcome;
- ``stop-inside IDLE``: claims it (lease 1 s) and runs the transfer with an
  atomic action that prints ``INSIDE`` after its writes and pauses half a
  second inside the transaction (the test stops it there), then returns;
  prints the report's outcome.  On PostgreSQL its sessions are ended by the
  server after IDLE seconds idle in a transaction: the completion's answer
  is lost, the pass raises (printed ``LOST`` and the code), and a second
  pass takes it up, as ``op worker``'s loop does, before the report;
- ``submit START``: waits until the epoch second START, submits one fixed
  identity and prints ``operation_id created``.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any

from fencekeeper.adapters.connect import parse_url
from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.operations.ports import GuardedContext
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    DurableOperationService,
    PrincipalReference,
)
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.store import StoreError
from fencekeeper.kernel.operations import EffectClass

TENANT = "default"


def _transfer_then_hang(context: GuardedContext, value: dict[str, Any]) -> dict[str, Any]:
    result = examples.transfer(context, value)
    print("INSIDE", flush=True)
    time.sleep(60)
    return result


def _pause_inside(context: GuardedContext, value: dict[str, Any]) -> dict[str, Any]:
    result = examples.transfer(context, value)
    print("INSIDE", flush=True)
    time.sleep(0.5)
    return result


def _open(url: str, idle: float | None) -> TransactionalOperationStore:
    location = parse_url(url)
    if idle is None or location.kind != "postgresql":
        return open_operation_store(url)
    from fencekeeper.adapters.operations.postgres import PostgresOperationStore  # noqa: PLC0415

    assert location.dsn is not None and location.schema is not None
    return PostgresOperationStore(location.dsn, schema=location.schema, idle_in_transaction_timeout=idle)


def main(mode: str, url: str, *rest: str) -> None:
    store = _open(url, float(rest[0]) if mode == "stop-inside" else None)
    resolvers = examples.resolvers()
    if mode == "submit":
        start = float(rest[0])
        service = DurableOperationService(store, examples.registry(), resolvers)
        time.sleep(max(0.0, start - time.time()))
        admission = service.submit(
            tenant=TENANT,
            principal=PrincipalReference("users", 1, "alice"),
            action="transfer",
            input={"from": "acc-1", "to": "acc-2", "amount": 5},
            client_key="same-key",
        )
        print(admission.operation_id, admission.created, flush=True)
        return
    if mode == "kill-inside":
        hanging = DurableAction(
            "transfer", 1, EffectClass.ATOMIC, _transfer_then_hang, normalize=examples.normalize_transfer
        )
        worker = DurableOperationWorker(
            store, DurableActionRegistry((hanging,)), resolvers, tenant=TENANT, worker_id="doomed",
            lease=timedelta(seconds=1),
        )
        worker.run_once()
        return
    if mode == "stop-inside":
        pausing = DurableAction("transfer", 1, EffectClass.ATOMIC, _pause_inside, normalize=examples.normalize_transfer)
        worker = DurableOperationWorker(
            store, DurableActionRegistry((pausing,)), resolvers, tenant=TENANT, worker_id="stalled",
            lease=timedelta(seconds=1),
        )
        try:
            report = worker.run_once()
        except StoreError as exc:
            print("LOST", exc.code, flush=True)
            report = worker.run_once()
        print("REPORT", None if report is None else report.outcome, flush=True)
        return
    if mode == "stop-before":

        def pause(operation: object) -> None:
            print("CLAIMED", flush=True)
            time.sleep(0.5)

        worker = DurableOperationWorker(
            store, examples.registry(), resolvers, tenant=TENANT, worker_id="sleeper",
            lease=timedelta(seconds=1), before_effect=pause,
        )
        report = worker.run_once()
        print("REPORT", None if report is None else report.outcome, flush=True)
        return
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
