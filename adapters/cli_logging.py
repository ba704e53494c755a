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
  outage, and so is every loss while its requests still fail;
- an outage whose note was said is answered by one note, once a request
  that failed in it goes through again (:func:`store_answered`): how long
  after the first note, and how many requests failed meanwhile
  (:func:`store_failed`), counted across the command's worker threads;
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


def answers_again(seconds: float, failures: int) -> str:
    """The note that pairs the lost-connection note: the store answers, after how long and how many failed requests."""
    requests = "request" if failures == 1 else "requests"
    return f"the store answers again after {seconds:.1f} s ({failures} {requests} failed); continuing"


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
        back: Callable[[float, int], None] | None,
        debug: bool,
        clock: Callable[[], float],
    ) -> None:
        super().__init__(logging.WARNING)
        self._say = say
        self._warn = warn
        self._lost = lost
        self._back = back if lost is not None else None
        self._debug = debug
        self._clock = clock
        # Under _outage: the last loss (for OUTAGE_GAP), and the outage whose note awaits its answer.
        self._outage = threading.Lock()
        self._last_loss: float | None = None
        self._since: float | None = None
        """When the open outage's note was said; None: no note awaits an answer."""
        self._failed = 0
        """Requests that failed since then, whichever worker thread made them."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not _is_lost_connection(record):
                self._warn(record.name, _one_line(record))
                return
            with self._outage:
                now = self._clock()
                recent = self._last_loss is not None and now - self._last_loss < OUTAGE_GAP
                # Requests still failing: the store has not answered, however long since the last loss
                # (a restarting server's reconnections are refused further and further apart).
                new = not recent and not (self._since is not None and self._failed)
                self._last_loss = now
                if new and self._back is not None:
                    self._since, self._failed = now, 0
            if new and self._lost is not None:
                self._say(self._lost)
            if self._debug:
                self._warn(record.name, _one_line(record))
        except Exception:
            # Writing a note failed (stderr closed): logging's own report of it, never a crash of the command.
            self.handleError(record)

    def failed(self) -> None:
        with self._outage:
            if self._since is None:
                return
            assert self._last_loss is not None
            if not self._failed and self._clock() - self._last_loss >= OUTAGE_GAP:
                # No request failed in the outage, and its last loss is long past: it ended unseen (the
                # connections a pool found dead were replaced before a request met them).  This failure
                # is another matter, a row held or a file busy: its wait is not the outage's length.
                self._since = None
                return
            self._failed += 1

    def answered(self, failures: int) -> None:
        if self._since is None:  # read without the lock: the common case, a run of failures outside any outage
            return
        with self._outage:
            if self._since is None or not (self._failed or failures):
                return
            seconds, counted = self._clock() - self._since, max(self._failed, failures)
            self._since, self._failed = None, 0
        assert self._back is not None
        self._back(seconds, counted)


_current: _Router | None = None
"""The router of the command running in this process (:func:`routed`): whom the worker loops tell."""


@contextlib.contextmanager
def routed(
    say: Callable[[str], None],
    warn: Callable[[str, str], None],
    *,
    lost: str | None,
    back: Callable[[float, int], None] | None = None,
    debug: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
    """Library records through the command's notes while the block runs; the root logger as it was after.

    ``say(text)`` writes one of the command's notes; ``warn(logger, text)``
    one library warning; ``lost`` is the note for an outage (None: the
    command reports the failures it meets itself, and the records are
    folded silently); ``back(seconds, failures)`` says that the store
    answers again, once per outage whose note was said (None: nothing is
    said; the command's loops do not tell :func:`store_answered`).
    """
    global _current  # noqa: PLW0603 - one command runs at a time in a process; its loops find its router here
    root = logging.getLogger()
    handler = _Router(say, warn, lost, back=back, debug=debug, clock=clock)
    previous, _current = _current, handler
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        _current = previous


def store_failed() -> None:
    """One request of the command failed and is waited out (its loop's ``StorePatience``): counted in the outage."""
    router = _current
    if router is not None:
        router.failed()


def store_answered(failures: int) -> None:
    """A request went through after ``failures`` in a row of its loop failed: the open outage, if any, is over.

    Said once per outage, by whichever worker thread gets through first;
    the others' answers find it closed.  A loop tells it only after failures
    of its own: a thread that met none says nothing of an outage another
    thread is still waiting out.
    """
    router = _current
    if router is not None and failures:
        router.answered(failures)


__all__ = ["OUTAGE_GAP", "answers_again", "routed", "store_answered", "store_failed"]
