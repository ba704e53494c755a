"""Worker processes forked from one command: start-up paid once, every core used.

``fencekeeper worker --processes N`` runs N processes of ``--concurrency``
workers each.  Threads of one process share one interpreter lock, so a
worker process keeps at most one core busy with its own Python; and N
commands each pay the interpreter's start-up, the imports and the store's
deployment check again, which on a small machine costs more than the work
of a short queue.  Forking after that start-up gives N processes for one.

Rules of this module:

- The parent does its start-up once (imports, argument checks, the store's
  deployment check, the handler's module), then forks.  When it forks it
  holds no connection, no open store and no thread of its own: a database
  connection or a pool's thread must never cross a fork, so every child
  opens its own store.  Where ``os.fork`` does not exist, more than one
  process is refused (:func:`check_processes`).
- A child never returns into the parent's code.  Whatever happens in it, it
  reports one JSON document in a file of its own and ends with
  ``os._exit``: no cleanup of the parent's runs twice, nothing the parent
  buffered is written twice.
- Stopping keeps the one-process rules in every child: its first SIGINT or
  SIGTERM lets it finish the visit it is in and hand back its lease; a
  second exits at once.  The parent relays what it receives through a pipe
  per child.  A relayed stop is idempotent: a child that the same signal
  also reached directly (a terminal's Ctrl-C reaches the whole process
  group, systemd's default stop the whole control group) is not stopped
  twice, and so is not made to quit.  A relayed second signal quits at
  once, as a second signal does.
- A child whose parent is gone (its pipe's end of file) stops as on a first
  signal: no child outlives its supervisor by more than a visit, and none is
  left holding a lease it could hand back.
- One child ending in error (an error in its report, an end by a signal, no
  report at all) stops the others as a first signal would, as one worker
  thread's error stops its siblings in one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import IO, Any, Final

import attrs

MAX_PROCESSES: Final = 64
"""At most this many processes from one command: more only queue for the machine's cores and the database's connections."""

PARENT_EXITED: Final = "parent_exited"
"""The stop reason a child gives when its parent is gone."""

SIBLING_FAILED: Final = "sibling_failed"
"""The stop reason a child is given when another child ended in error."""

_QUIT: Final = b"quit\n"


class ProcessesError(ValueError):
    """``--processes`` cannot be used as given; the message says why."""


def check_processes(processes: int) -> int:
    """``processes`` if one command may fork that many worker processes here; ProcessesError otherwise."""
    if not isinstance(processes, int) or isinstance(processes, bool):
        raise ProcessesError(f"must be a whole number, got {processes!r}")
    if not 1 <= processes <= MAX_PROCESSES:
        raise ProcessesError(f"must be between 1 and {MAX_PROCESSES}, got {processes}")
    if processes > 1 and not hasattr(os, "fork"):
        raise ProcessesError(
            "more than one process needs os.fork, which this system lacks; start one command per process"
        )
    return processes


class Lifeline:
    """A child's end of its pipe from the parent: stop requests, the quit request, and the parent's death."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def heed(self, stop: Callable[[str], None]) -> None:
        """Call ``stop(reason)`` for each stop the parent relays or when the parent is gone; quit at its quit.

        Runs in a daemon thread of its own: a child that ends while its
        parent lives leaves it blocked on the pipe, and ``os._exit`` ends it.
        """

        def listen() -> None:
            with open(self._fd, "rb", buffering=0, closefd=True) as pipe:
                for line in _lines(pipe):
                    if line == _QUIT:
                        os._exit(130)
                    stop(line.decode("ascii", "replace").strip())
            stop(PARENT_EXITED)

        threading.Thread(target=listen, name="lifeline", daemon=True).start()


def _lines(pipe: IO[bytes]) -> Iterator[bytes]:
    pending = b""
    while chunk := pipe.read(256):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line + b"\n"


@attrs.frozen
class ChildEnd:
    """How one child process ended: its number (1-based), exit code (negative: the signal) and report."""

    number: int
    pid: int
    exit_code: int
    report: dict[str, Any] | None
    """The child's JSON report: ``{"result": ...}`` or ``{"error": message, "exit": code}``; None if it wrote none."""

    @property
    def failed(self) -> bool:
        return self.report is None or "error" in self.report or self.exit_code != 0

    @property
    def result(self) -> Any:
        """What the child's function returned; None when it did not return."""
        return None if self.report is None else self.report.get("result")

    def problem(self) -> str:
        """Why the child has no result, in words: its error, the signal that ended it, or its silent exit."""
        if self.report is not None and "error" in self.report:
            return f"worker process {self.number} (pid {self.pid}): {self.report['error']}"
        if self.exit_code < 0:
            return f"worker process {self.number} (pid {self.pid}): ended by {signal.Signals(-self.exit_code).name}"
        return f"worker process {self.number} (pid {self.pid}): ended with exit code {self.exit_code} and no report"


def run(
    processes: int,
    child: Callable[[int, Lifeline], Any],
    *,
    describe: Callable[[BaseException], tuple[str, int]],
    failed: Callable[[Any], bool],
    note: Callable[[str], None],
    finishes: str = "visit",
) -> tuple[list[ChildEnd], str | None]:
    """Fork ``processes`` children running ``child(number, lifeline)``; wait for all; their ends and the signal received.

    ``child`` returns a JSON-serialisable result or raises; ``describe``
    turns what it raised into (message, exit code).  ``failed(result)`` says
    whether a result that returned is still an error (a worker's error list),
    which stops the siblings.  ``note`` tells the operator what the parent
    does on a signal, and ``finishes`` names what each worker completes
    before it stops (an execution's node ``visit``, an operation's
    ``attempt``).  The second value is the name of the first signal the
    parent received, None when none came.
    """
    reports = [tempfile.TemporaryFile() for _ in range(processes)]  # noqa: SIM115 - closed below
    pipes = [os.pipe() for _ in range(processes)]
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    try:
        for number in range(1, processes + 1):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, which never returns (covered by the CLI tests)
                _child(number, child, pipes, reports[number - 1], describe)
            children[pid] = number
    except OSError as exc:
        # The system would not make another process: the ones already started lose their lifeline,
        # stop as on a first signal, and are waited for, so that none is left behind.
        for read, write in pipes:
            os.close(read)
            os.close(write)
        for pid in children:
            os.waitpid(pid, 0)
        for report in reports:
            report.close()
        raise ProcessesError(f"could not start worker process {len(children) + 1}: {exc.strerror or exc}") from None
    for read, _ in pipes:
        os.close(read)
    writers = {number: write for number, (_, write) in enumerate(pipes, start=1)}
    received: list[str] = []

    def tell(line: bytes) -> None:
        for number, fd in list(writers.items()):
            try:
                os.write(fd, line)
            except OSError:  # that child has ended: nothing to tell it
                writers.pop(number, None)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def on_signal(number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        received.append(name)
        if len(received) > 1:
            tell(_QUIT)
            os._exit(130)
        note(f"{name}: every worker process stops after its current {finishes}; send the signal again to quit at once")
        tell(f"{name}\n".encode("ascii"))

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    ends: list[ChildEnd] = []
    try:
        while children:
            pid, status = os.wait()
            if pid not in children:
                continue
            number = children.pop(pid)
            end = ChildEnd(number, pid, os.waitstatus_to_exitcode(status), _read(reports[number - 1]))
            ends.append(end)
            fd = writers.pop(number, None)
            if fd is not None:
                os.close(fd)
            if end.failed or failed(end.result):
                tell(f"{SIBLING_FAILED}\n".encode("ascii"))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for fd in writers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        for report in reports:
            report.close()
    ends.sort(key=lambda e: e.number)
    return ends, received[0] if received else None


def common_error(ends: list[ChildEnd]) -> tuple[str, int] | None:
    """The error every child reported alike, with its exit code; None when any child did otherwise.

    A child that fails before it does any work (a handler factory that
    returns no handler) fails in every child the same way: the command
    then says it once, with the exit code one process would have given.
    """
    errors = {(str(e.report["error"]), int(e.report.get("exit", 1))) for e in ends if e.report and "error" in e.report}
    if len(errors) == 1 and all(e.report and "error" in e.report for e in ends):
        return errors.pop()
    return None


def _child(
    number: int,
    child: Callable[[int, Lifeline], Any],
    pipes: list[tuple[int, int]],
    report: IO[bytes],
    describe: Callable[[BaseException], tuple[str, int]],
) -> None:  # pragma: no cover - runs in a forked child
    code = 1
    try:
        for k, (read, write) in enumerate(pipes, start=1):
            os.close(write)  # only the parent's write end may keep a lifeline open
            if k != number:
                os.close(read)
        payload: dict[str, Any]
        try:
            payload = {"result": child(number, Lifeline(pipes[number - 1][0]))}
            code = 0
        except BaseException as exc:  # every end is reported; none escapes into the parent's code
            message, code = describe(exc)
            payload = {"error": message, "exit": code}
        report.write(json.dumps(payload).encode("utf-8"))
        report.flush()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _read(report: IO[bytes]) -> dict[str, Any] | None:
    report.seek(0)
    data = report.read()
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
