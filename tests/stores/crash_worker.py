"""The child process of the crash test (``tests/stores/test_sqlite_crash.py``): works until it is SIGKILLed.

Run as ``python -m tests.stores.crash_worker --db FILE --child N --seed S --lease SECONDS
--mode park|random [--park-op OP --park-at K] --status FILE``.

It runs an endless random mix of every kind of store write (admit, claim,
record step with evidence, renew, append evidence, release, finalize to every
target with evidence, wake, and the governed recoveries: quarantine of expired
leases, resume_safe, fail) against one SQLite file, and is meant to be killed
with SIGKILL by the parent in the middle of one of its transactions.

To put the kill *inside* a transaction, and to know afterwards where it
landed, the store's connection is wrapped (in this process only; the store
code is not changed) by :class:`Tripwire`, which after every statement of a
write transaction:

- records in a small shared memory-mapped status file whether a write
  transaction is open, how many statements it has run, which operation it
  belongs to, the last statement, and a *marker*: something unique the
  operation would write (the execution id it admits, the token it claims
  with, the evidence id, the recovery command id, the wake's source id), so
  the parent can check that a killed transaction left none of it behind;
- in ``park`` mode, inside the first transaction of operation ``--park-op``
  that reaches statement ``--park-at`` (BEGIN IMMEDIATE is statement 1), or
  just before the COMMIT of one that wrote something but has fewer
  statements, stops and sleeps while holding the write lock (status
  ``parked``) until the parent kills it: the kill lands exactly between two
  statements of one guarded transaction.  The child heads for that operation
  (claiming, finalizing to waiting or letting a lease expire first when the
  operation needs it) four times in ten, and otherwise does a random mix;
- in ``random`` mode, sleeps a random 0-3 ms after every statement, so the
  process spends most of its time inside transactions and a kill at a random
  moment most likely lands inside one.

The status file is written through a shared mapping, so what the child wrote
last survives its death.
"""

from __future__ import annotations

import argparse
import mmap
import random
import struct
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import Evidence, SystemClock
from fencekeeper.adapters.testing.suite import resume_at_current_node
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

# --- the status file ------------------------------------------------------------------

STATUS_SIZE = 256
_HEADER = struct.Struct("<iiii")  # state, statements in this transaction, operations begun, parked
_OP = (16, 16)  # offset, length
_MARKER = (32, 128)
_SQL = (160, 96)

OUTSIDE = 0
"""No write transaction open (idle, reading, or between operations)."""
IN_WRITE = 1
"""BEGIN IMMEDIATE has run and COMMIT has not been issued: nothing of this transaction may survive a kill."""
COMMITTING = 2
"""COMMIT was issued: a kill now may or may not find the transaction committed."""


@attrs.frozen
class Status:
    state: int
    statements: int
    operations: int
    parked: bool
    op: str
    marker: str
    sql: str


def read_status(path: Path) -> Status:
    data = path.read_bytes()[:STATUS_SIZE]
    state, statements, operations, parked = _HEADER.unpack_from(data, 0)

    def text(field: tuple[int, int]) -> str:
        offset, length = field
        return data[offset : offset + length].rstrip(b"\0").decode("utf-8", "replace")

    return Status(state, statements, operations, bool(parked), text(_OP), text(_MARKER), text(_SQL))


class StatusWriter:
    def __init__(self, path: Path) -> None:
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), STATUS_SIZE)
        self.state = OUTSIDE
        self.statements = 0
        self.operations = 0
        self.parked = False

    def header(self) -> None:
        _HEADER.pack_into(self._map, 0, self.state, self.statements, self.operations, int(self.parked))

    def text(self, field: tuple[int, int], value: str) -> None:
        offset, length = field
        raw = value.encode("utf-8")[:length]
        self._map[offset : offset + length] = raw + b"\0" * (length - len(raw))

    def begin_operation(self, op: str, marker: str) -> None:
        # The marker is written before the operation's transaction begins, so
        # whatever state a kill finds, the marker names the operation in flight.
        self.operations += 1
        self.text(_OP, op)
        self.text(_MARKER, marker)
        self.header()


# --- the tripwire ------------------------------------------------------------------------


class Tripwire:
    """A stand-in for the store's ``sqlite3.Connection`` that reports and stops between statements.

    ``park`` mode stops inside the first write transaction of operation
    ``park_op`` that reaches statement ``park_at`` (BEGIN IMMEDIATE is
    statement 1), or, if the transaction wrote something but has fewer
    statements, just before its COMMIT is issued.
    """

    def __init__(
        self, conn: Any, status: StatusWriter, rng: random.Random, *, mode: str, park_op: str, park_at: int
    ) -> None:
        self._conn = conn
        self._status = status
        self._rng = rng
        self._mode = mode
        self._park_op = park_op
        self._park_at = park_at
        self._op = ""
        self._wrote = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> Any:
        return self._run(sql, lambda: self._conn.execute(sql, *args))

    def executemany(self, sql: str, rows: Iterable[Any]) -> Any:
        return self._run(sql, lambda: self._conn.executemany(sql, rows))

    def operation(self, op: str) -> None:
        self._op = op

    def _park(self) -> None:
        self._status.parked = True
        self._status.header()
        time.sleep(3600)  # holding the write lock until SIGKILL

    def _parking(self) -> bool:
        return self._mode == "park" and self._op == self._park_op

    def _run(self, sql: str, call: Any) -> Any:
        head = sql.lstrip()[:15].upper()
        status = self._status
        ending = status.state == IN_WRITE and head.startswith(("COMMIT", "ROLLBACK"))
        if ending and head.startswith("COMMIT"):
            if self._parking() and self._wrote:
                # Everything is written, nothing is committed.
                status.text(_SQL, "COMMIT (not yet issued)")
                self._park()
            status.state = COMMITTING
            status.header()
        cursor = call()
        if head.startswith("BEGIN IMMEDIATE"):
            status.state, status.statements, self._wrote = IN_WRITE, 1, False
        elif ending:
            status.state, status.statements = OUTSIDE, 0
        elif status.state == IN_WRITE:
            status.statements += 1
            self._wrote = self._wrote or not head.startswith("SELECT")
        else:
            return cursor  # reads outside write transactions are not interesting
        status.text(_SQL, " ".join(sql.split()))
        status.header()
        if status.state == IN_WRITE:
            if self._parking() and status.statements == self._park_at:
                self._park()
            elif self._mode == "random":
                time.sleep(self._rng.uniform(0, 0.003))
        return cursor


# --- the work ------------------------------------------------------------------------------

OPS_AUTHORITY = p.Authority(True, "ops")
TARGETS = (
    ExecutionState.SUCCEEDED,
    ExecutionState.SUCCEEDED,
    ExecutionState.FAILED,
    ExecutionState.WAITING,
    ExecutionState.SUSPENDED,
    ExecutionState.RECONCILIATION_REQUIRED,
)


@attrs.define
class Held:
    execution_id: str
    business_id: str
    credential: p.LeaseCredential
    revision: int


class Child:
    def __init__(self, args: argparse.Namespace) -> None:
        self.number: int = args.child
        self.worker_id = f"crash-{args.child}"
        self.rng = random.Random(args.seed)
        self.lease = timedelta(seconds=args.lease)
        self.store = SQLiteStore(args.db, SystemClock())
        self.status = StatusWriter(Path(args.status))
        # The only change to the store: its connection, wrapped (this process only).
        self.tripwire = Tripwire(
            self.store._conn, self.status, self.rng, mode=args.mode, park_op=args.park_op, park_at=args.park_at
        )
        self.store._conn = self.tripwire  # type: ignore[assignment]
        self.park_op: str = args.park_op
        self.authority = p.Authority(True, self.worker_id)
        self.held: list[Held] = []
        self.admitted = 0
        self.serial = 0

    def begin(self, op: str, marker: str) -> None:
        self.status.begin_operation(op, marker)
        self.tripwire.operation(op)

    def _id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.number}-{self.serial}-{uuid.uuid4().hex[:8]}"

    def admit(self) -> None:
        self.admitted += 1
        execution_id = f"k{self.number:03d}-{self.admitted:03d}"
        self.begin("admit", execution_id)
        self.store.admit(
            p.AdmitRequest(execution_id, f"biz-{self.number % 3}", "crash", 1, "start", p.Authority(True, "admin"))
        )

    def claim(self) -> bool:
        token = uuid.uuid4().hex
        self.begin("claim", token)
        outcome = self.store.claim_next(p.ClaimRequest(self.worker_id, token, self.lease))
        if not isinstance(outcome, p.Decision):
            return False
        assert outcome.execution is not None and outcome.lease is not None
        self.held.append(
            Held(
                outcome.execution.execution_id, outcome.execution.business_id, outcome.lease, outcome.execution.revision
            )
        )
        return True

    def _evidence(self, kind: str, held: Held) -> Evidence:
        object_id = self._id(f"{kind}:{held.execution_id}:{held.credential.fence}")
        return Evidence(object_id, kind, {"execution": held.execution_id, "fence": held.credential.fence})

    def with_lease(self, op: str | None = None, target: ExecutionState | None = None) -> None:
        """One write under a held lease: ``op`` if given, else a random one."""
        held = self.rng.choice(self.held)
        c = held.credential
        if op is None:
            op = self.rng.choices(("step", "renew", "append", "release", "finalize"), (3, 1, 1, 1, 4))[0]
        outcome: p.Outcome
        if op == "step":
            evidence = self._evidence("step_attempt", held)
            self.begin("step", evidence.object_id)
            outcome = self.store.record_step(
                held.execution_id,
                p.StepRequest(c, held.revision, p.StepRecord("work", self._id("attempt")), self.authority),
                [evidence],
            )
        elif op == "renew":
            self.begin("renew", "")
            outcome = self.store.renew(held.execution_id, p.RenewRequest(c, self.lease))
        elif op == "append":
            evidence = self._evidence("note", held)
            self.begin("append", evidence.object_id)
            outcome = self.store.append_evidence(held.execution_id, c, [evidence])
        elif op == "release":
            self.begin("release", c.lease_token)
            outcome = self.store.release(held.execution_id, p.ReleaseRequest(c, held.revision))
        else:
            target = target or self.rng.choice(TARGETS)
            evidence = self._evidence("outcome", held)
            self.begin("finalize", evidence.object_id)
            outcome = self.store.finalize(
                p.FinalizeRequest(
                    execution_id=held.execution_id,
                    dispatch_id=held.execution_id,
                    worker_id=c.worker_id,
                    lease_token=c.lease_token,
                    fence=c.fence,
                    target_state=target,
                    business_id=held.business_id,
                    expected_revision=held.revision,
                    authority=self.authority,
                    step=p.StepRecord("end", self._id("attempt")),
                    wait=(
                        p.WaitSpec("approve", self._id("wait"), "approved", (("execution", held.execution_id),))
                        if target == ExecutionState.WAITING
                        else None
                    ),
                ),
                [evidence],
            )
        if isinstance(outcome, p.Decision):
            if outcome.execution is not None:
                held.revision = outcome.execution.revision
            if outcome.dispatch is not None and outcome.dispatch.lease_token is None:
                self.held.remove(held)  # released or finalized
        else:
            self.held.remove(held)  # refused: the lease expired or was taken; forget it

    def recover(self) -> None:
        # Quarantine first (other children died holding leases), then decide
        # one execution in review.
        for execution_id in self.store.expired()[:2]:
            view = self.store.read(execution_id)
            if view is None:
                continue
            command_id = self._id("cmd")
            self.begin("recover", command_id)
            self.store.recover(
                p.RecoveryRequest(
                    command_id,
                    p.RecoveryKind.QUARANTINE_EXPIRED,
                    execution_id,
                    view.execution.business_id,
                    view.execution.revision,
                    "ops",
                    OPS_AUTHORITY,
                )
            )
        review = self.store.execution_ids(ExecutionState.RECONCILIATION_REQUIRED)
        if review:
            view = self.store.read(self.rng.choice(review))
            assert view is not None
            kind = self.rng.choice((p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.FAIL))
            command_id = self._id("cmd")
            self.begin("recover", command_id)
            if kind == p.RecoveryKind.RESUME_SAFE:
                request = resume_at_current_node(self.store, view, command_id, "ops", OPS_AUTHORITY)
            else:
                request = p.RecoveryRequest(
                    command_id,
                    kind,
                    view.execution.execution_id,
                    view.execution.business_id,
                    view.execution.revision,
                    "ops",
                    OPS_AUTHORITY,
                )
            self.store.recover(request)

    def wake(self) -> None:
        waiting = self.store.execution_ids(ExecutionState.WAITING)
        if not waiting:
            # Make something to wake: finalize a held execution to waiting.
            if self.held:
                self.with_lease("finalize", ExecutionState.WAITING)
            elif not self.claim():
                self.admit()
            return
        view = self.store.read(self.rng.choice(waiting))
        assert view is not None and view.execution.wait is not None
        source = self._id("evt")
        self.begin("wake", source)
        self.store.wake(
            p.WakeRequest(
                key=view.execution.wait,
                reason=p.WakeReason.EVENT,
                source_id=source,
                business_id=view.execution.business_id,
                authority=OPS_AUTHORITY,
                event_type="approved",
                correlation=(("execution", view.execution.execution_id),),
            )
        )

    def targeted(self) -> None:
        """Head for the operation the parent wants to kill, doing what it needs first."""
        op = self.park_op
        if op == "admit":
            self.admit()
        elif op == "claim":
            if not self.claim():
                self.admit()
        elif op == "recover":
            self.recover()
        elif op == "wake":
            self.wake()
        elif self.held:
            self.with_lease(op)
        elif not self.claim():
            self.admit()

    def run(self) -> None:
        while True:
            roll = self.rng.random()
            if roll < 0.4:
                self.targeted()
            elif roll < 0.46:
                self.admit()
            elif roll < 0.52:
                self.recover()
            elif roll < 0.56:
                self.wake()
            elif self.held and (len(self.held) >= 3 or roll < 0.85):
                self.with_lease()
            elif not self.claim():
                self.admit()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stores.crash_worker")
    parser.add_argument("--db", required=True)
    parser.add_argument("--child", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--lease", type=float, default=0.4)
    parser.add_argument("--mode", choices=("park", "random"), required=True)
    parser.add_argument("--park-op", default="", help="park mode: the operation to stop inside")
    parser.add_argument("--park-at", type=int, default=1, help="park mode: stop after this statement (1 = BEGIN)")
    parser.add_argument("--status", required=True, help=f"a file of {STATUS_SIZE} bytes, shared with the parent")
    args = parser.parse_args(argv)
    Child(args).run()  # never returns: the parent kills it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
