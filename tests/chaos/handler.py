"""The chaos run's CommandHandler: the example handler's answers, over an effect log that tells the truth.

``fencekeeper worker --handler tests.chaos.handler:make`` loads it in every
worker process; the effect log is the file named by the environment
variable ``FENCEKEEPER_CHAOS_EFFECTS``, shared by every process of a run, as
an external system's own records would be.  Rules of this module:

- The answers are the example handler's (``fencekeeper.adapters.examples``):
  orders are placed (unless above the limit), shipped and cancelled;
  ``payment.refund`` never answers in time.  A refund is *applied* before
  its answer is lost, except for one command in three (chosen by its id),
  whose request is lost before the provider sees it.
- Every call is one line of the log, written under an exclusive lock on the
  log file, and so is every effect: ``call`` (execute was asked),
  ``applied`` (the effect happened), ``rejected`` (a deterministic
  rejection, no effect), ``lost`` (the request never reached the provider),
  ``not_applied`` (reconcile decided it never happened) and ``late`` (a send
  that arrived after that decision, refused).
- ``reconcile`` looks, never applies: it answers ``applied`` from an
  ``applied`` line, ``rejected`` from a ``rejected`` one, and otherwise
  records ``not_applied`` and answers so.  That answer is final: a late
  ``execute`` of the same Command (a worker stopped between committing the
  Command and sending it) is refused and applies nothing.
- A send takes a while, as a call to another system does: 50-300 ms before
  the provider acts and as long again before its answer arrives, so that a
  kill or a stop often lands between a Command's commit, its effect and the
  commit of its result.
- When the lock cannot be had within a few seconds (a process was stopped
  holding it) the answer is UNKNOWN and nothing is written: the provider is
  unreachable, which is exactly what UNKNOWN is for.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fencekeeper.adapters import examples
from fencekeeper.kernel.interpreter import Command, CommandResult, CommandStatus, Rejection

EFFECTS_ENV = "FENCEKEEPER_CHAOS_EFFECTS"
EXECUTE_LOCK_SECONDS = 5.0
RECONCILE_LOCK_SECONDS = 2.0
LATENCY_SECONDS = (0.05, 0.3)


class Busy(Exception):
    """The effect log's lock could not be had in time."""


def read_effects(path: Path) -> list[dict[str, Any]]:
    """Every line of an effect log; a line cut by SIGKILL (only ever the last) is skipped."""
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def refund_is_lost(command_id: str) -> bool:
    return hashlib.sha256(command_id.encode()).digest()[0] % 3 == 0


class EffectLogHandler:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.example = examples.handler()

    @contextlib.contextmanager
    def _locked(self, seconds: float) -> Iterator[Any]:
        with self.path.open("a+", encoding="utf-8") as handle:
            give_up = time.monotonic() + seconds
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > give_up:
                        raise Busy from None
                    time.sleep(0.01)
            try:
                yield handle
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _about(self, handle: Any, command_id: str) -> list[dict[str, Any]]:
        """Every line of the log about ``command_id``, oldest first."""
        handle.seek(0)
        found = []
        for line in handle.read().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut by a SIGKILL mid-write
            if entry.get("command_id") == command_id:
                found.append(entry)
        return found

    def _write(self, handle: Any, kind: str, command: Command, **extra: Any) -> None:
        entry = {
            "kind": kind,
            "command_id": command.command_id,
            "execution_id": command.execution_id,
            "operation": command.operation,
            "pid": os.getpid(),
            "t": time.time(),
            **extra,
        }
        handle.seek(0, os.SEEK_END)
        handle.write(json.dumps(entry, sort_keys=True) + "\n")
        handle.flush()

    def execute(self, command: Command) -> CommandResult:
        time.sleep(random.uniform(*LATENCY_SECONDS))
        try:
            result = self._execute(command)
        finally:
            time.sleep(random.uniform(*LATENCY_SECONDS))
        return result

    def _execute(self, command: Command) -> CommandResult:
        try:
            with self._locked(EXECUTE_LOCK_SECONDS) as log:
                prior = {e["kind"] for e in self._about(log, command.command_id)}
                self._write(log, "call", command)
                if "not_applied" in prior:
                    self._write(log, "late", command)
                    return CommandResult(
                        CommandStatus.REJECTED,
                        Rejection.STALE_VERSION,
                        f"{command.command_id} was reconciled as not applied; a late send is refused",
                    )
                if "applied" in prior or "rejected" in prior:
                    # A second send of one Command: answered from the record, applied never again.
                    return self.reconcile_locked(log, command)
                result = self.example.execute(command)
                if command.operation == "payment.refund":
                    if refund_is_lost(command.command_id):
                        self._write(log, "lost", command)
                    else:
                        self._write(log, "applied", command, outputs={"refunded": True})
                    return result  # the example's UNKNOWN: the answer never arrives
                if result.status == CommandStatus.SUCCEEDED:
                    self._write(log, "applied", command, outputs=dict(result.outputs))
                elif result.status == CommandStatus.REJECTED:
                    self._write(log, "rejected", command, detail=result.detail)
                return result
        except Busy:
            return CommandResult(CommandStatus.UNKNOWN, None, "the provider did not answer (its log is locked)")

    def reconcile(self, command: Command) -> CommandResult:
        try:
            with self._locked(RECONCILE_LOCK_SECONDS) as log:
                return self.reconcile_locked(log, command)
        except Busy:
            return CommandResult(CommandStatus.UNKNOWN, None, "the provider did not answer (its log is locked)")

    def reconcile_locked(self, log: Any, command: Command) -> CommandResult:
        mine = self._about(log, command.command_id)
        applied = [e for e in mine if e["kind"] == "applied"]
        if applied:
            return CommandResult(
                CommandStatus.SUCCEEDED, None, f"{command.operation} applied", applied[0].get("outputs", {})
            )
        rejected = [e for e in mine if e["kind"] == "rejected"]
        if rejected:
            return CommandResult(CommandStatus.REJECTED, Rejection.VALIDATION, rejected[0].get("detail", "rejected"))
        if not any(e["kind"] == "not_applied" for e in mine):
            self._write(log, "not_applied", command)
        return CommandResult(
            CommandStatus.REJECTED, Rejection.REJECTED, f"{command.command_id} was never applied, and never will be"
        )


def make() -> EffectLogHandler:
    """The factory ``--handler tests.chaos.handler:make`` names."""
    path = os.environ.get(EFFECTS_ENV)
    if not path:
        raise RuntimeError(f"{EFFECTS_ENV} must name the run's effect log")
    return EffectLogHandler(Path(path))
