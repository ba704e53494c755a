"""The command handler and grants the teaching workflows in docs/examples run with.

Rules of this module:

- It stands in for the systems a real deployment connects (an order
  service, a payment provider), with fixed, documented behaviour, so that
  every example runs the same way from the command line, the demo and the
  tests:

  * ``order.place``, ``order.ship`` and ``order.cancel`` succeed;
  * ``order.place`` of an amount above 100,000 is rejected (validation);
  * ``payment.refund`` is applied, but its reply is lost: the worker sees
    UNKNOWN, and asking afterwards (``reconcile``) finds that the refund was
    applied.

- It tells the truth, because it keeps a real effect log
  (:class:`EffectLog`): ``reconcile`` reports what the log holds, never an
  invented outcome.  A Command the log has never seen is settled as *not
  applied*, and that answer is made final by recording it first: the
  Command is refused if a paused worker sends it later.  A Command issued
  under a fence lower than one already seen for its execution is refused as
  stale.  This is the handler contract of
  :class:`~fencekeeper.adapters.ports.CommandHandler`, kept by example.
- The effect log outlives the process when it is a file
  (:func:`effect_log_for`), so that ``fencekeeper worker`` and a later
  ``fencekeeper reconcile`` see the same effects.
- Nothing here is used unless a caller asks for it: deployments implement
  :class:`~fencekeeper.adapters.ports.CommandHandler` and
  :class:`~fencekeeper.adapters.ports.AuthorityPolicy` themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from fencekeeper.kernel.interpreter import Command, CommandResult, CommandStatus, Rejection

from .ports import SYSTEM_PRINCIPAL_GRANTS, GrantTable

if TYPE_CHECKING:
    import sqlite3

ORDER_LIMIT = 100_000

APPLIED = "applied"
REJECTED = "rejected"
NOT_APPLIED = "not_applied"
"""Settled by reconcile as never applied: final, so the Command is refused from then on."""
REFUSED_STALE = "refused_stale"


@attrs.frozen
class Entry:
    """What the effect log holds for one Command."""

    command_id: str
    execution_id: str
    fence: int
    operation: str
    status: str
    result: Mapping[str, Any] = attrs.field(factory=dict, eq=False)


class EffectLog(Protocol):
    """The external system's own record of what it applied: one entry per Command identity."""

    def atomically(self) -> contextlib.AbstractContextManager[None]:
        """A critical section: a lookup and the record that follows it cannot interleave with another's."""
        ...

    def get(self, command_id: str) -> Entry | None:
        """The entry recorded for ``command_id``, if any."""
        ...

    def put(self, entry: Entry) -> None:
        """Record (or replace) the entry of one Command."""
        ...

    def highest_fence(self, execution_id: str) -> int:
        """The highest fence any Command of ``execution_id`` was seen with (0 for none)."""
        ...

    def entries(self) -> list[Entry]:
        """Every entry, oldest first."""
        ...


class MemoryEffectLog:
    """An effect log in memory (one process): for tests and the in-process demo."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def atomically(self) -> Iterator[None]:
        """A critical section over this log (a lock)."""
        with self._lock:
            yield

    def get(self, command_id: str) -> Entry | None:
        """The entry recorded for ``command_id``, if any."""
        return self._entries.get(command_id)

    def put(self, entry: Entry) -> None:
        """Record (or replace) the entry of one Command."""
        self._entries[entry.command_id] = entry

    def highest_fence(self, execution_id: str) -> int:
        """The highest fence any Command of ``execution_id`` was seen with (0 for none)."""
        return max((e.fence for e in self._entries.values() if e.execution_id == execution_id), default=0)

    def entries(self) -> list[Entry]:
        """Every entry, oldest first."""
        return list(self._entries.values())


_OPENING = threading.Lock()
"""Held while a thread opens a log: two threads opening one at once failed one of them."""


def _open_log(path: Path) -> sqlite3.Connection:
    """A connection to the log at ``path``, in WAL mode, with its table; waits out another opener.

    Switching a file to WAL and creating its table take locks that SQLite
    does not wait for as it waits for a transaction's: two workers' first
    Commands at the same moment failed one of them at once with "database
    is locked", so that Command was reported UNKNOWN and its execution went
    to review (about 3% of first uses by three threads at once).  Threads
    of one process open one at a time (``_OPENING``); processes retry for
    as long as a transaction would wait.
    """
    # Imported here, as the log is opened: a worker over PostgreSQL that has nothing to do never loads sqlite3.
    import sqlite3  # noqa: PLC0415
    import time  # noqa: PLC0415

    deadline = time.monotonic() + _LOG_TIMEOUT
    while True:
        conn = sqlite3.connect(path, timeout=_LOG_TIMEOUT, isolation_level=None)
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS effects (command_id TEXT PRIMARY KEY, execution_id TEXT NOT NULL, "
                "fence INTEGER NOT NULL, operation TEXT NOT NULL, status TEXT NOT NULL, result TEXT NOT NULL)"
            )
            return conn
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
        except BaseException:
            conn.close()
            raise


_LOG_TIMEOUT = 30.0
"""Seconds a Command waits for another process's hold on the log (its transactions and its opening)."""


class FileEffectLog:
    """An effect log in its own SQLite file, shared by every process on this machine that names it.

    It is deliberately *not* the store: it stands for another system, with
    its own transactions, which is exactly why a Command's outcome can be
    unknown to the store.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._local = threading.local()

    @property
    def _conn(self) -> sqlite3.Connection:
        # Opened on first use, not before: a command that fails on its input
        # must not leave an effect log behind.
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            with _OPENING:
                conn = _open_log(self.path)
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def atomically(self) -> Iterator[None]:
        """A critical section: one immediate SQLite transaction on the log's file."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def get(self, command_id: str) -> Entry | None:
        """The entry recorded for ``command_id``, if any."""
        row = self._conn.execute(
            "SELECT command_id, execution_id, fence, operation, status, result FROM effects WHERE command_id = ?",
            (command_id,),
        ).fetchone()
        return None if row is None else Entry(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]))

    def put(self, entry: Entry) -> None:
        """Record (or replace) the entry of one Command."""
        self._conn.execute(
            "INSERT OR REPLACE INTO effects VALUES (?, ?, ?, ?, ?, ?)",
            (entry.command_id, entry.execution_id, entry.fence, entry.operation, entry.status,
             json.dumps(dict(entry.result), sort_keys=True)),
        )

    def highest_fence(self, execution_id: str) -> int:
        """The highest fence any Command of ``execution_id`` was seen with (0 for none)."""
        row = self._conn.execute("SELECT MAX(fence) FROM effects WHERE execution_id = ?", (execution_id,)).fetchone()
        return int(row[0] or 0)

    def entries(self) -> list[Entry]:
        """Every entry, oldest first."""
        rows = self._conn.execute(
            "SELECT command_id, execution_id, fence, operation, status, result FROM effects ORDER BY rowid"
        ).fetchall()
        return [Entry(r[0], r[1], r[2], r[3], r[4], json.loads(r[5])) for r in rows]


def effect_log_for(db: str) -> FileEffectLog:
    """The example system's effect log for a store: beside a SQLite file, or per DSN in the user's state directory."""
    target = db.removeprefix("sqlite:///") if db.startswith("sqlite:///") else db
    if "://" not in target and "=" not in target:
        return FileEffectLog(f"{target}.effects")
    state = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "fencekeeper"
    state.mkdir(parents=True, exist_ok=True)
    return FileEffectLog(state / f"example-effects-{hashlib.sha256(db.encode()).hexdigest()[:12]}.db")


Effect = Callable[[Command], CommandResult]


def _place(command: Command) -> CommandResult:
    amount = command.payload.get("amount")
    if isinstance(amount, (int, float)) and not isinstance(amount, bool) and amount > ORDER_LIMIT:
        return CommandResult(
            CommandStatus.REJECTED, Rejection.VALIDATION, f"amount {amount} is above the order limit {ORDER_LIMIT}"
        )
    return CommandResult(CommandStatus.SUCCEEDED, None, "order placed", {"placed": True})


def _succeed(**outputs: object) -> Effect:
    return lambda command: CommandResult(CommandStatus.SUCCEEDED, None, f"{command.operation} applied", outputs)


EFFECTS: Mapping[str, Effect] = {
    "order.place": _place,
    "order.ship": _succeed(shipped=True),
    "order.cancel": _succeed(cancelled=True),
    "payment.refund": _succeed(refunded=True),
}
LOST_REPLIES = frozenset({"payment.refund"})
"""Operations applied whose reply never reaches the worker: it sees UNKNOWN and must reconcile."""


def _result_of(entry: Entry) -> CommandResult:
    body = entry.result
    rejection = body.get("rejection")
    return CommandResult(
        CommandStatus(body["status"]),
        None if rejection is None else Rejection(rejection),
        str(body.get("detail", "")),
        dict(body.get("outputs", {})),
    )


def _body(result: CommandResult) -> dict[str, Any]:
    return {
        "status": result.status.value,
        "rejection": None if result.rejection is None else result.rejection.value,
        "detail": result.detail,
        "outputs": dict(result.outputs),
    }


class ExampleHandler:
    """A CommandHandler over :data:`EFFECTS` and an :class:`EffectLog`, keeping the handler contract."""

    def __init__(
        self,
        log: EffectLog | None = None,
        effects: Mapping[str, Effect] = EFFECTS,
        lost_replies: frozenset[str] = LOST_REPLIES,
    ) -> None:
        self.log: EffectLog = log if log is not None else MemoryEffectLog()
        self.effects = effects
        self.lost_replies = lost_replies
        self.executed: list[Command] = []
        self.reconciled: list[Command] = []

    def execute(self, command: Command) -> CommandResult:
        """Apply the Command at most once, refusing a stale fence; a lost reply is reported UNKNOWN."""
        self.executed.append(command)
        with self.log.atomically():
            entry = self.log.get(command.command_id)
            if entry is not None:
                return self._repeat(entry)
            highest = self.log.highest_fence(command.execution_id)
            if command.fence < highest:
                refusal = CommandResult(
                    CommandStatus.REJECTED,
                    Rejection.STALE_FENCE,
                    f"issued under fence {command.fence}; fence {highest} already acts for {command.execution_id}",
                )
                self.log.put(self._entry(command, REFUSED_STALE, refusal))
                return refusal
            effect = self.effects.get(command.operation)
            result = (
                CommandResult(CommandStatus.REJECTED, Rejection.VALIDATION, f"no handler for {command.operation}")
                if effect is None
                else effect(command)
            )
            self.log.put(
                self._entry(command, APPLIED if result.status == CommandStatus.SUCCEEDED else REJECTED, result)
            )
        if command.operation in self.lost_replies and result.status == CommandStatus.SUCCEEDED:
            return CommandResult(CommandStatus.UNKNOWN, None, "the payment provider did not answer in time")
        return result

    def _repeat(self, entry: Entry) -> CommandResult:
        if entry.status == NOT_APPLIED:
            return CommandResult(
                CommandStatus.REJECTED,
                Rejection.REJECTED,
                f"{entry.command_id} was settled as not applied by reconciliation; it is never applied",
            )
        # Applied, rejected or refused before: the same answer, and no second effect.
        return _result_of(entry)

    def reconcile(self, command: Command) -> CommandResult:
        """Report what the effect log holds; a Command it never saw is recorded as not applied, finally."""
        self.reconciled.append(command)
        with self.log.atomically():
            entry = self.log.get(command.command_id)
            if entry is None:
                # Recorded before answering: from now on the Command is
                # refused, so "not applied" stays true (the answer is final).
                answer = CommandResult(
                    CommandStatus.REJECTED,
                    Rejection.REJECTED,
                    f"{command.command_id} never reached {command.operation}; recorded as not applied, and refused "
                    "if it ever arrives",
                )
                self.log.put(self._entry(command, NOT_APPLIED, answer))
                return answer
        if entry.status == APPLIED:
            return CommandResult(
                CommandStatus.SUCCEEDED, None, f"{command.operation} applied", dict(entry.result.get("outputs", {}))
            )
        return _result_of(entry)

    @staticmethod
    def _entry(command: Command, status: str, result: CommandResult) -> Entry:
        return Entry(command.command_id, command.execution_id, command.fence, command.operation, status, _body(result))


def handler(log: EffectLog | None = None) -> ExampleHandler:
    """A fresh example handler over ``log`` (a new in-memory log by default)."""
    return ExampleHandler(log)


def grants(business_id: str, *principals: str) -> GrantTable:
    """A grant table giving ``principals`` every operation in ``business_id``, plus the timer's dispatch grant."""
    table = GrantTable()
    for principal in principals:
        table.grant(principal, business_id)
    for principal, operation in SYSTEM_PRINCIPAL_GRANTS:
        table.grant(principal, business_id, operation)
    return table


__all__ = [
    "APPLIED",
    "EFFECTS",
    "LOST_REPLIES",
    "NOT_APPLIED",
    "ORDER_LIMIT",
    "REFUSED_STALE",
    "REJECTED",
    "Effect",
    "EffectLog",
    "Entry",
    "ExampleHandler",
    "FileEffectLog",
    "MemoryEffectLog",
    "effect_log_for",
    "grants",
    "handler",
]
