"""A CommandHandler that does no I/O, for `bench.e2e`: the worker's own cost, without an external system's.

The example handler (``fencekeeper.adapters.examples``) keeps a durable effect
log, one more SQLite transaction per Command (about 0.7 ms), which is the
example system's cost, not the protocol's.  Procrastinate's no-op job and a
DBOS step that returns at once do no I/O either, so the bench plugs this one
in with ``fencekeeper worker --handler bench.e2e_handler:make`` (run from the
repository root: the worker puts the current directory on the import path).

Rules of this module:

- ``execute`` applies nothing and answers SUCCEEDED: applying nothing any
  number of times is applying it at most once.
- ``reconcile`` answers UNKNOWN: it keeps no record, so it can promise
  neither "applied" nor "never applied" (the handler contract,
  ``fencekeeper.adapters.ports.CommandHandler``).  The bench never reaches
  reconcile; a run that did would show it as executions left unfinished.
- It imports only the kernel's value types, so a worker pays nothing more to
  load it.
"""

from __future__ import annotations

from fencekeeper.kernel.interpreter import Command, CommandResult, CommandStatus


class NoopHandler:
    """Answers every Command at once, without touching anything."""

    def execute(self, command: Command) -> CommandResult:
        """Applied (there is nothing to apply)."""
        return CommandResult(CommandStatus.SUCCEEDED)

    def reconcile(self, command: Command) -> CommandResult:
        """Unknown: no record is kept, so nothing can be promised."""
        return CommandResult(CommandStatus.UNKNOWN, detail="the bench's no-op handler keeps no record")


def make() -> NoopHandler:
    """The factory ``--handler bench.e2e_handler:make`` names."""
    return NoopHandler()
