"""Where the libraries' log records go while a command runs: through the command's own notes on stderr.

With no logging configured, Python prints a library's warning raw on stderr
(``logging.lastResort``), between a command's own lines.  psycopg and its
pool warn of every connection a server restart, a failover or an
administrator's ``pg_terminate_backend`` kills ("discarding closed
connection: <psycopg.Connection [BAD] at 0x...>"), although the command
rides that out (:class:`~fencekeeper.adapters.store.StorePatience`): the
reader saw noise about an event that was handled, once per connection.

Only the command line installs this, for the length of one command
(:func:`routed`); the stores and the kernel never configure logging, so an
application that imports them keeps its own.  While it is installed:

- a record that says a store connection was lost is one note per outage,
  in the command's words (or nothing, where the command reports the
  failure itself): losses less than :data:`OUTAGE_GAP` seconds apart are one
  outage;
- any other warning or error of any library is one line in the command's
  format, naming its logger (``fencekeeper: warning: psycopg.pool: ...``),
  or one JSON object on a ``--log-json`` stream: never lost, never raw;
- with ``--debug``, a lost connection's own records are shown as well.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

from .render import printable

OUTAGE_GAP = 10.0
"""Seconds without a lost connection after which the next one is a new outage, said again.

An administrator ending a role's sessions kills every connection of a pool at
once, and a restarting server fails every reconnection for a while: each
connection is a record, the outage is one."""

_LOST = frozenset({
    "discarding closed connection: %s",  # psycopg_pool: a connection came back dead
    "discarding broken connection: %s",  # psycopg_pool: an idle one failed its check
    "error connecting in %r: %s",  # psycopg_pool: a reconnection the server refused (still restarting)
})  # fmt: skip
"""psycopg_pool's message templates for a connection found dead: lost, whatever the error."""

_LOST_IF_OPERATIONAL = frozenset({
    "error ignored in rollback on %s: %s",  # psycopg, and the PostgreSQL store's own connection context
    "rollback failed: %s: %s. Discarding connection %s",  # psycopg_pool
    "task run %s failed: %s: %s",  # psycopg_pool's background task (a reconnection)
})  # fmt: skip
"""Templates that mean a lost connection when what failed is psycopg's OperationalError (the connection)."""


def _is_lost_connection(record: logging.LogRecord) -> bool:
    if not record.name.startswith("psycopg"):
        return False
    if record.msg in _LOST:
        return True
    if record.msg not in _LOST_IF_OPERATIONAL:
        return False
    psycopg = sys.modules.get("psycopg")
    args = record.args if isinstance(record.args, tuple) else ()
    return psycopg is not None and any(isinstance(arg, psycopg.OperationalError) for arg in args)


def _one_line(record: logging.LogRecord) -> str:
    try:
        message = record.getMessage()
    except Exception:  # a library's bad format arguments: still say what it tried to say
        message = f"{record.msg!s} {record.args!r}"
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        message = f"{message}: {type(exc).__name__}: {exc}"
    return printable(" ".join(message.split()))


class _Router(logging.Handler):
    """The root logger's handler while a command runs (see the module's docstring)."""

    def __init__(
        self,
        say: Callable[[str], None],
        warn: Callable[[str, str], None],
        lost: str | None,
        *,
        debug: bool,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(logging.WARNING)
        self._say = say
        self._warn = warn
        self._lost = lost
        self._debug = debug
        self._clock = clock
        self._last_loss: float | None = None
        self._outage = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not _is_lost_connection(record):
                self._warn(record.name, _one_line(record))
                return
            with self._outage:
                now = self._clock()
                new = self._last_loss is None or now - self._last_loss >= OUTAGE_GAP
                self._last_loss = now
            if new and self._lost is not None:
                self._say(self._lost)
            if self._debug:
                self._warn(record.name, _one_line(record))
        except Exception:
            # Writing a note failed (stderr closed): logging's own report of it, never a crash of the command.
            self.handleError(record)


@contextlib.contextmanager
def routed(
    say: Callable[[str], None],
    warn: Callable[[str, str], None],
    *,
    lost: str | None,
    debug: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
    """Library records through the command's notes while the block runs; the root logger as it was after.

    ``say(text)`` writes one of the command's notes; ``warn(logger, text)``
    one library warning; ``lost`` is the note for an outage (None: the
    command reports the failures it meets itself, and the records are
    folded silently).
    """
    root = logging.getLogger()
    handler = _Router(say, warn, lost, debug=debug, clock=clock)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
