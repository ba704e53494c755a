"""One worker process of the PostgreSQL fault test (``tests/postgres/test_postgres_faults.py``).

Run as ``python -m tests.postgres.pg_drain_worker --dsn DSN --schema S --worker ID --seed N
--lease S --pause P --stop FILE --log FILE --deadline EPOCH [--reuse-token]``.

It *is* the SQLite drain worker (:class:`tests.stores.drain_worker.Worker`):
the same loop (claim, pause past the lease now and then, step with evidence,
renew, append evidence, release, finalize to a random permitted target), the
same deliberate zombie retries with dead and forged credentials, the same
ledger lines.  Three things differ, because here the store is a
``PostgresStore`` whose connections the test kills and whose process the test
SIGKILLs:

- **the store**: a ``PostgresStore`` on the test's schema with the database
  clock (no clock injected), connecting with ``application_name=fk-worker-<id>``
  so that the test can ``pg_terminate_backend`` exactly the workers'
  connections;
- **intent and done lines**: before every write request the ledger gets an
  ``intent`` line (operation, execution, credential, evidence ids, wall
  time) and after it a ``done`` line (``returned``, or ``unavailable`` with
  the exact error).  Ledgers are line buffered.  A request with an intent and no done line was cut by SIGKILL; one
  whose done line says ``unavailable`` lost its connection; one that returned
  but has no result line was SIGKILLed between its done and result lines (only ever a
  SIGKILLed worker's last request).  All three have an
  *unknown* outcome (the commit may have happened before the client heard of
  it) and the test treats them as "may or may not have written", never as
  accepted or refused;
- **a lost connection** (``StoreError('store_unavailable')``) fails that one
  request and the worker carries on, as a real worker would: it *abandons* the
  execution it was working on (it cannot know whether its last write landed,
  so it neither keeps using the credential nor counts it as dead), the lease
  expires and the reconciler quarantines it (an ``abandoned`` line says so).
  Reads are retried, since a read changes nothing; each failed read is a
  ``read_error`` line with what was raised.

Nothing of ``drain_worker`` is copied: the worker class is subclassed and
handed a :class:`LedgeredStore` over PostgreSQL as its store.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import psycopg

from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.store import Evidence, ExecutionView, StoreError
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState
from tests.stores import drain_worker

APP_PREFIX = "fk-worker-"
READ_PATIENCE = 15.0
"""Seconds a read is retried after lost connections before the worker fails.

A kill takes every idle connection of the pool (up to 4) at once, and each
is found dead only when used; the test kills again every 0.3-0.9 s, so on a
loaded machine the connections the pool opens next can be killed before a
read runs on them, more than once.  A fixed count of attempts (it was 8)
then failed a worker now and then although the pool recovered as it must;
a read the pool cannot serve for this long still fails the test."""


def application_name(worker_id: str) -> str:
    return f"{APP_PREFIX}{worker_id}"


def with_application_name(dsn: str, name: str) -> str:
    separator = "&" if "?" in dsn else "?"
    return f"{dsn}{separator}application_name={name}"


def open_store(dsn: str, schema: str) -> PostgresStore:
    """Open the store, retrying: a connection kill can land while it checks the schema at start-up."""
    for attempt in range(5):
        try:
            return PostgresStore(dsn, schema=schema)
        except (StoreError, psycopg.OperationalError):
            if attempt == 4:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


class LedgeredStore:
    """A worker's ``PostgresStore`` that writes intent and done lines, and survives lost connections.

    ``unavailable`` tells whether the last write request failed with
    ``store_unavailable`` (its outcome is unknown).  Every failure is written
    to the ledger with exactly what was raised, for the test's report (a
    SIGKILLed worker keeps nothing else).
    """

    def __init__(self, store: PostgresStore, ledger: TextIO) -> None:
        self._store = store
        self._ledger = ledger
        self.worker: PgWorker | None = None
        self.unavailable = False

    def note(self, entry: dict[str, Any]) -> None:
        self._ledger.write(json.dumps(entry, sort_keys=True) + "\n")

    def _write(
        self,
        op: str,
        execution_id: str | None,
        credential: p.LeaseCredential | None,
        evidence: Sequence[Evidence],
        call: Callable[[], p.Outcome | None],
        *,
        token: str | None = None,
    ) -> p.Outcome | None:
        worker = self.worker
        assert worker is not None
        key = {"worker": worker.worker_id, "seq": worker.seq}
        self.note(
            {
                **key,
                "intent": op,
                "t": time.time(),
                "execution_id": execution_id,
                "token": credential.lease_token if credential is not None else token,
                "fence": credential.fence if credential is not None else None,
                "evidence": [e.object_id for e in evidence],
            }
        )
        try:
            outcome = call()
        except StoreError as exc:
            if exc.code != "store_unavailable":
                raise
            self.unavailable = True
            self.note({**key, "done": "unavailable", "error": f"StoreError(store_unavailable): {exc.message}"})
            return None
        self.unavailable = False
        self.note({**key, "done": "returned"})
        return outcome

    def _read(self, what: str, call: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + READ_PATIENCE
        while True:
            try:
                return call()
            except StoreError as exc:
                if exc.code != "store_unavailable" or time.monotonic() > deadline:
                    raise
                self.note({"read_error": what, "error": f"StoreError(store_unavailable): {exc.message}"})
            except psycopg.OperationalError as exc:
                # PostgresStore's read paths do not translate a lost
                # connection into StoreError; counted apart so the report
                # shows it.
                if time.monotonic() > deadline:
                    raise
                error = f"{type(exc).__module__}.{type(exc).__name__}: {' '.join(str(exc).split())}"
                self.note({"read_error": what, "error": error})

    # --- the write requests drain_worker makes -----------------------------------------------

    def claim_next(self, request: p.ClaimRequest) -> p.Outcome | None:
        return self._write("claim", None, None, (), lambda: self._store.claim_next(request), token=request.lease_token)

    def renew(self, execution_id: str, request: p.RenewRequest) -> p.Outcome | None:
        return self._write(
            "renew", execution_id, request.credential, (), lambda: self._store.renew(execution_id, request)
        )

    def record_step(
        self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()
    ) -> p.Outcome | None:
        return self._write(
            "record_step",
            execution_id,
            request.credential,
            evidence,
            lambda: self._store.record_step(execution_id, request, evidence),
        )

    def release(self, execution_id: str, request: p.ReleaseRequest) -> p.Outcome | None:
        return self._write(
            "release", execution_id, request.credential, (), lambda: self._store.release(execution_id, request)
        )

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome | None:
        credential = p.LeaseCredential(request.worker_id, request.lease_token, request.fence)
        return self._write(
            f"finalize_{request.target_state.value}",
            request.execution_id,
            credential,
            evidence,
            lambda: self._store.finalize(request, evidence),
        )

    def append_evidence(
        self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]
    ) -> p.Outcome | None:
        return self._write(
            "append_evidence",
            execution_id,
            credential,
            evidence,
            lambda: self._store.append_evidence(execution_id, credential, evidence),
        )

    # --- reads ---------------------------------------------------------------------------------

    def read(self, execution_id: str) -> ExecutionView | None:
        view: ExecutionView | None = self._read("read", lambda: self._store.read(execution_id))
        return view

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        ids: list[str] = self._read("execution_ids", lambda: self._store.execution_ids(state))
        return ids

    def close(self) -> None:
        self._store.close()


class PgWorker(drain_worker.Worker):
    store: LedgeredStore  # type: ignore[assignment]

    def __init__(self, args: argparse.Namespace, ledger: TextIO) -> None:
        dsn = with_application_name(args.dsn, application_name(args.worker))
        super().__init__(args, ledger, LedgeredStore(open_store(dsn, args.schema), ledger))
        self.store.worker = self

    def displaced(self, held: drain_worker.Held) -> None:
        if self.store.unavailable:
            # The request failed on a lost connection: it may have committed or
            # not.  Abandon the execution; its lease runs out and the
            # reconciler quarantines it.  Retrying zombies with this
            # credential would be wrong: it may still be live.
            self.store.note({"abandoned": held.execution_id, "worker": self.worker_id})
            return
        super().displaced(held)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.postgres.pg_drain_worker")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lease", type=float, required=True, help="lease duration in seconds")
    parser.add_argument("--pause", type=float, required=True, help="probability of pausing past the lease")
    parser.add_argument("--reuse-token", action="store_true", help="use one token for every claim")
    parser.add_argument("--stop", required=True, help="the worker exits when this file exists")
    parser.add_argument("--log", required=True, help="the ledger, one JSON object a line")
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds; exit 3 if reached")
    args = parser.parse_args(argv)
    args.db = None  # drain_worker.Worker reads it; the swapped-in store ignores it
    # Line buffered: a SIGKILL loses at most the line being written.
    with open(args.log, "w", encoding="utf-8", buffering=1) as ledger:
        PgWorker(args, ledger).run()
    if not Path(args.stop).exists():
        print(f"{args.worker}: deadline reached before the stop file appeared", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
