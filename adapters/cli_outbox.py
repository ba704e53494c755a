"""The ``fencekeeper export`` and ``fencekeeper prune`` commands: the outbox exporter and bounded retention.

Registered from ``cli.py`` (:func:`add_parsers`, :func:`run_export`,
:func:`run_prune`); the exporter, the sinks and the pruner load only when one
of these commands runs.  Conventions are the command line's (``cli.py``
module header): data on stdout (one JSON document with ``--json``), one
``fencekeeper: error: ...`` line on stderr, exit 0 on success, 1 when the
store refuses, something is parked or the sink's reader went away, 2 for
bad usage or input (a ``--db`` that names no store, a malformed ``--sink``,
an unknown message id).  A store that fails once export runs is waited out
as ``fencekeeper worker`` waits it out (``StorePatience``); still failing
after ``RIDE_OUT_SECONDS``, export exits 1 naming the error.

With ``--sink stdout`` the messages are the data, one JSON document per
line, and the summary goes to stderr.

Stopping ``export``: SIGINT or SIGTERM, as they stop ``fencekeeper worker``
(``cli.py`` module header): the send in progress ends, what was sent is
marked and the rest of the claim released; exit 0 with the summary.  A
second signal exits at once (130); what is still claimed waits out its lease.
A store that does not answer then is given ``outbox.STOP_GRACE`` seconds
(5) and one more: past them export exits 1 saying so, and what it sent and
could not mark is delivered again once its claim's lease ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from fencekeeper.kernel.common import SHOWN_LENGTH, shown, shown_text

from .render import Output
from .store import RETRYABLE_STORE_CODES, RIDE_OUT_SECONDS, StoreError

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
_PARKED_SHOWN = 1000
"""The most parked messages ``--parked`` lists, the oldest first."""
_USAGE_STORE_CODES = frozenset({"store_unavailable", "not_a_database", "invalid_input", "message_not_found"})


def _duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``15m``, ``90s``, ``50ms`` or a number of seconds."""
    units = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
    if text.endswith("ms"):  # before "s": a pause between batches is often a fraction of a second
        number, unit = text[:-2], 0.001
    else:
        number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (like 30d, 12h, 15m, 90s, 50ms): {shown(text)}") from None
    if not 0 <= value * unit < 86_400 * 366 * 100:
        raise argparse.ArgumentTypeError(f"must be zero or more and under a century, got {text}")
    return timedelta(seconds=value * unit)


def _spelt(window: timedelta) -> str:
    """A duration as ``_duration`` takes it: ``40d``, ``12h``, ``90s``, ``1.5s``."""
    seconds = window.total_seconds()
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {shown(text)}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def _count(text: str, most: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {shown(text)}") from None
    if value < 1 or (most is not None and value > most):
        raise argparse.ArgumentTypeError(
            f"must be at least 1{'' if most is None else f' and at most {most}'}, got {value}"
        )
    return value


def _count_up_to(most: int) -> Callable[[str], int]:
    """A count the library refuses above ``most``: refused here, before a sink file is opened, naming the option."""

    def count(text: str) -> int:
        return _count(text, most)

    return count


def _poll(text: str) -> timedelta:
    """Above zero: an exporter polling every 0 s claims in a busy loop, a transaction after another, while idle."""
    value = _duration(text)
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _timeout(text: str) -> timedelta:
    """As WebhookSink takes it: above zero and at most ten minutes."""
    value = _duration(text)
    if not timedelta(0) < value <= timedelta(seconds=600):
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 600 seconds, got {text}")
    return value


def add_parsers(command: Callable[..., argparse.ArgumentParser], db_option: Callable[[argparse.ArgumentParser], None]) -> None:
    export = command(
        "export",
        "deliver committed transitions from the outbox to a sink, at least once, in order per subject",
        prints_data=True,
        description="Claims outbox rows in order, delivers them to --sink (stdout, file:PATH as JSON lines, or an "
        "http(s):// webhook that gets one POST per message), and marks them exported. A message that keeps failing "
        "is parked with its error after --max-attempts; --parked lists them, --requeue and --discard act on one. "
        "SIGINT/SIGTERM stop it after the current send, releasing the rest of its batch; a second signal exits at once.",
    )
    db_option(export)
    what = export.add_mutually_exclusive_group()
    what.add_argument("--sink", metavar="SINK", help="stdout, file:PATH or an http(s):// URL")
    what.add_argument("--parked", action="store_true", help="list parked messages with their last error")
    what.add_argument("--requeue", metavar="MESSAGE_ID", help="give a parked message a fresh set of attempts")
    what.add_argument("--discard", metavar="MESSAGE_ID", help="give up on a parked message; its subject goes on")
    what.add_argument(
        "--status",
        action="store_true",
        help="how many messages wait, are parked, were exported; when the oldest waiting and oldest parked committed",
    )
    # Defaults are None here and filled in by run_export (_DELIVERY_DEFAULTS), so that an option given to an
    # action it does not apply to is refused rather than silently ignored.
    export.add_argument("--until-idle", action="store_true", default=None,
                        help="with --sink: stop once nothing is left to deliver now")  # fmt: skip
    export.add_argument("--batch", type=_count_up_to(10_000), metavar="N",
                        help="with --sink: messages per claim (default 100)")  # fmt: skip
    export.add_argument("--max-attempts", type=_count, metavar="N", help="with --sink: before parking (default 10)")
    export.add_argument("--timeout", type=_timeout, metavar="DURATION",
                        help="with an http(s):// --sink: webhook timeout (default 10s)")  # fmt: skip
    export.add_argument("--poll", type=_poll, metavar="DURATION",
                        help="with --sink: wait between empty claims (default 1s)")  # fmt: skip

    prune = command(
        "prune",
        "remove what has ended and is past its retention window, in small batches",
        prints_data=True,
        description="Never touches an Operation or a workflow execution that has not ended, an identity inside its "
        "promised window, or an outbox row not yet exported. Executions are pruned only with --executions, once their outbox messages are exported. Each batch is one short transaction; run it again to resume.",
    )
    db_option(prune)
    prune.add_argument("--operations", type=_duration, default=timedelta(days=30), metavar="DURATION",
                       help="ended Operations' records (default 30d)")  # fmt: skip
    prune.add_argument("--results", type=_duration, default=timedelta(days=7), metavar="DURATION",
                       help="result bodies (default 7d)")  # fmt: skip
    prune.add_argument("--identities", type=_duration, default=timedelta(0), metavar="DURATION",
                       help="beyond each identity's own window, after its Operation ended (default 0)")  # fmt: skip
    prune.add_argument("--history", type=_duration, default=timedelta(days=14), metavar="DURATION",
                       help="transition history of ended Operations (default 14d)")  # fmt: skip
    prune.add_argument("--outbox", type=_duration, default=timedelta(days=7), metavar="DURATION",
                       help="exported outbox rows, after export (default 7d)")  # fmt: skip
    prune.add_argument("--executions", type=_duration, metavar="DURATION",
                       help="ended workflow executions, after their last change (default: kept)")  # fmt: skip
    prune.add_argument("--batch", type=_count_up_to(100_000), default=500, metavar="N",
                       help="rows per transaction (default 500)")  # fmt: skip
    prune.add_argument("--max-batches", type=_count, metavar="N", help="stop after N transactions")
    prune.add_argument("--pause", type=_duration, default=timedelta(0), metavar="DURATION",
                       help="between batches (default 0)")  # fmt: skip
    prune.add_argument("--duty", type=_fraction, default=0.25, metavar="FRACTION",
                       help="the most of the time it may hold the store (default 0.25)")  # fmt: skip


def _open(args: argparse.Namespace, *, read_only: bool = False) -> Any:
    """The store at ``--db``; a SQLite file must already exist (export and prune create nothing).

    ``read_only`` for the reports (``--status``, ``--parked``): a SQLite file is
    then opened only to read, as ``inspect`` opens it, and is neither migrated
    nor locked.
    """
    from .operations.connect import open_operation_store  # noqa: PLC0415 - loads only for these commands

    # create=False: a path with nothing at it is refused as every command refuses it, and one
    # with something else there (a directory) is named for what it is by the store's own checks.
    return open_operation_store(args.db, schema=args.schema, pool_size=2, read_only=read_only, create=False)


def _guarded(body: Callable[[argparse.Namespace, Output], int]) -> Callable[[argparse.Namespace, Output], int]:
    def run(args: argparse.Namespace, out: Output) -> int:
        try:
            return body(args, out)
        except StoreError as exc:
            out.note(f"fencekeeper: error: {exc.message} [{exc.code}]")
            return EXIT_USAGE if exc.code in _USAGE_STORE_CODES else EXIT_PROBLEM

    return run


_DELIVERY_DEFAULTS: dict[str, Any] = {
    "until_idle": False,
    "batch": 100,
    "max_attempts": 10,
    "timeout": timedelta(seconds=10),
    "poll": timedelta(seconds=1),
}
"""The options that only a delivery (``--sink``) reads, with their defaults."""


def _delivery_options(args: argparse.Namespace, sink_file: Callable[[str], str | None]) -> None:
    """Refuse a delivery option given to an action that does not deliver, then fill in the defaults.

    ``--status --batch 5`` or ``--requeue ID --poll 2s`` used to run with the
    option ignored, which let a typo in a script pass for a setting.
    ``--timeout`` applies to a webhook only: a file or stdout sink has none.
    """
    given = [name for name in _DELIVERY_DEFAULTS if getattr(args, name) is not None]
    if not args.sink and given:
        action = next(flag for flag in ("--parked", "--status", "--requeue", "--discard")
                      if getattr(args, flag[2:]) not in (None, False))  # fmt: skip
        option = "--" + given[0].replace("_", "-")
        raise StoreError("invalid_input", f"{option}: applies only with --sink, not with {action}")
    if args.sink and args.timeout is not None and (args.sink in ("stdout", "-") or sink_file(args.sink) is not None):
        raise StoreError("invalid_input", f"--timeout: applies only to an http(s):// sink, not {shown_text(args.sink)}")
    for name, default in _DELIVERY_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


@_guarded
def run_export(args: argparse.Namespace, out: Output) -> int:
    from . import outbox  # noqa: PLC0415 - the exporter loads only for this command

    given = {"--sink": args.sink, "--requeue": args.requeue, "--discard": args.discard}
    if all(value is None for value in given.values()) and not (args.parked or args.status):
        raise StoreError("invalid_input", "one of --sink, --parked, --requeue, --discard or --status is required")
    for option, value in given.items():
        # Given but empty is a mistake of its own, not the absence of every choice.
        if value == "":
            raise StoreError("invalid_input", f"{option}: empty")
    _delivery_options(args, outbox.sink_file)
    for option, value in (("--requeue", args.requeue), ("--discard", args.discard)):
        # No message id holds a control character or a byte no UTF-8 decodes (a lone surrogate, from the
        # command line): looked up, such a value failed in the store's encoder as an internal error.
        if value is not None and not value.isprintable():
            raise StoreError(
                "invalid_input", f"{option}: {shown(value)} is no message id (it holds a character that is not printable text)"
            )
    if args.sink:
        outbox.check_sink(args.sink, timeout=args.timeout.total_seconds())
        named = outbox.sink_file(args.sink)
        if named is not None and _is_the_database(Path(named), args):
            # Appended to, the file the exporter reads would lose the messages at its next checkpoint, and a
            # cut back of an unended last line (JsonLinesSink) would truncate the database itself.
            raise StoreError(
                "invalid_input",
                f"--sink: {shown_text(args.sink)} is the SQLite database --db names (or one of its own files); "
                "appending messages to it would corrupt it",
            )
    store = _open(args, read_only=args.parked or args.status)
    sink = None
    try:
        # Opened only once the store is: bad input creates no file.
        sink = outbox.open_sink(args.sink, timeout=args.timeout.total_seconds()) if args.sink else None
        if args.parked:
            parked = outbox.parked_messages(store, limit=_PARKED_SHOWN)
            # The oldest are listed; how many there are in all is counted, not taken from the list's length.
            total = outbox.outbox_status(store).parked if len(parked) == _PARKED_SHOWN else len(parked)
            if out.json_mode:
                out.data({"parked": [_parked_json(m) for m in parked], "total": total})
            else:
                for m in parked:
                    out.line(f"{m.message_id} ({m.topic}, seq {m.seq}): {m.attempts} attempts; {m.last_error}")
                shown_part = f"; the oldest {len(parked)} are listed" if total > len(parked) else ""
                out.note(f"{total} parked{shown_part}")
            return EXIT_OK
        if args.status:
            status = outbox.outbox_status(store)
            oldest = None if status.oldest_pending_at is None else status.oldest_pending_at.isoformat()
            oldest_parked = None if status.oldest_parked_at is None else status.oldest_parked_at.isoformat()
            # Parked rows wait for an operator, not the exporter: apart, so they never pass for an old backlog.
            result = {"pending": status.pending, "parked": status.parked, "exported": status.exported,
                      "oldest_pending_at": oldest, "oldest_parked_at": oldest_parked}  # fmt: skip
            if out.json_mode:
                out.data(result)
            else:
                out.line(" ".join(f"{k} {'-' if v is None else v}" for k, v in result.items()))
            return EXIT_PROBLEM if status.parked else EXIT_OK
        if args.requeue or args.discard:
            message_id = args.requeue or args.discard
            done = (outbox.requeue if args.requeue else outbox.discard)(store, message_id)
            if not done:
                raise StoreError("message_not_found", f"{shown_text(message_id, SHOWN_LENGTH)}: no parked outbox message has this id")
            verb = "requeued" if args.requeue else "discarded"
            if out.json_mode:
                out.data({verb: message_id})
            else:
                out.line(f"{message_id} {verb}")
            return EXIT_OK
        assert sink is not None
        exporter = outbox.OutboxExporter(
            store, sink, batch_size=args.batch, retry=outbox.ExportRetry(maximum_attempts=args.max_attempts),
            log=out.note,
        )  # fmt: skip
        try:
            report = _export_until_stopped(exporter, args, out)
        except StoreError as exc:
            if exc.code not in RETRYABLE_STORE_CODES:
                raise
            # What `fencekeeper worker` does with a store still failing after it was waited out: exit 1 naming
            # the error, for the service manager to restart; 2 is for a --db that named no store to begin with.
            out.note(
                f"fencekeeper: error: {exc.message} [{exc.code}]; the store failed for {RIDE_OUT_SECONDS:g} s in a "
                "row; what was claimed and not marked is delivered again once its lease ends"
            )
            return EXIT_PROBLEM
        except _StoppedUnanswered as exc:
            cause = exc.__cause__
            why = f" ({cause.message})" if isinstance(cause, StoreError) else ""
            out.note(
                f"fencekeeper: error: stopped with the store not answering{why}; what was sent and not marked "
                "exported is delivered again once its claim's lease ends [store_unavailable]"
            )
            return EXIT_PROBLEM
        except outbox.SinkClosed as exc:
            if args.sink in ("stdout", "-"):
                # Nothing more reaches the reader; the interpreter's own flush at exit must not fail too.
                with contextlib.suppress(OSError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            out.note(f"fencekeeper: error: {exc}; what it did not acknowledge is delivered again by the next export")
            return EXIT_PROBLEM
        summary = {"delivered": report.delivered, "failed": report.failed, "parked": report.parked}
        if args.sink in ("stdout", "-"):
            out.note(json.dumps(summary, sort_keys=True))
        elif out.json_mode:
            out.data(summary)
        else:
            out.line(f"delivered {report.delivered}, failed {report.failed}, parked {report.parked}")
        return EXIT_PROBLEM if report.parked else EXIT_OK
    finally:
        store.close()
        close = getattr(sink, "close", None)
        if close is not None:
            close()


def _export_until_stopped(exporter: Any, args: argparse.Namespace, out: Output) -> Any:
    """Run ``exporter`` until idle (``--until-idle``), stopped by SIGINT or SIGTERM, or failed.

    As ``fencekeeper worker`` stops: the first signal lets the send in
    progress end, marks what was sent and releases the rest of the claim, so
    that the next exporter delivers it at once rather than after the claim's
    lease; a second signal exits at once (130), leaving the claim to its
    lease.  The exporter runs in a thread of its own, so that the handler, in
    the main thread, only sets an event that nothing else holds a lock of.
    """
    from . import outbox  # noqa: PLC0415 - loaded already by the command that calls this

    stop = threading.Event()
    signals = 0
    outcome: dict[str, Any] = {}

    stopped_at: list[float] = []

    def on_signal(number: int, frame: FrameType | None) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            os._exit(130)
        # Set before it is said: once the line is out, no further send begins.
        stop.set()
        stopped_at.append(time.monotonic())
        out.note("stopping after the current send; send the signal again to quit at once")

    def export() -> None:
        try:
            outcome["report"] = exporter.run(
                until_idle=args.until_idle, poll_interval=args.poll.total_seconds(), stop=stop
            )
        except BaseException as exc:  # raised again in the main thread, where the command's errors are handled
            outcome["error"] = exc

    previous = {number: signal.signal(number, on_signal) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        thread = threading.Thread(target=export, name="export", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=0.2)
            if stopped_at and time.monotonic() - stopped_at[0] > outbox.STOP_GRACE + 1:
                # The store does not answer (a claim waiting for a connection, a marking tried for
                # STOP_GRACE): the command's store.close() ends what the thread still waits for.
                raise _StoppedUnanswered
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    error = outcome.get("error")
    if stopped_at and isinstance(error, StoreError) and error.code in RETRYABLE_STORE_CODES:
        raise _StoppedUnanswered from error
    if error is not None:
        raise error
    return outcome["report"]


class _StoppedUnanswered(Exception):
    """A stop that the store did not let finish within ``STOP_GRACE`` and a second."""


def _is_the_database(path: Path, args: argparse.Namespace) -> bool:
    """Whether ``path`` is the SQLite file ``--db`` names, or one of SQLite's own files beside it."""
    from .connect import parse_url  # noqa: PLC0415 - loads only for these commands

    location = parse_url(args.db, schema=args.schema)
    if location.kind != "sqlite" or location.path is None:
        return False
    database = [Path(f"{location.path}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")]
    if path.exists():
        return any(d.exists() and os.path.samefile(path, d) for d in database)
    return any(path.resolve() == d.resolve() for d in database)


def _parked_json(m: Any) -> dict[str, Any]:
    return {
        "message_id": m.message_id, "seq": m.seq, "kind": m.kind, "subject_id": m.subject_id, "topic": m.topic,
        "at": m.at.isoformat(), "attempts": m.attempts, "last_error": m.last_error, "parked_at": m.parked_at.isoformat(),
    }  # fmt: skip


@_guarded
def run_prune(args: argparse.Namespace, out: Output) -> int:
    from . import retention  # noqa: PLC0415 - the pruner loads only for this command

    # RetentionWindows refuses these too, in the Python API's words (`results`, `40 days, 0:00:00`): here the
    # options are named as they were typed.
    for option in ("results", "history"):
        window = getattr(args, option)
        if window > args.operations:
            raise StoreError(
                "invalid_input",
                f"--{option}: {_spelt(window)} is longer than --operations ({_spelt(args.operations)}); an "
                f"Operation's {option} cannot outlive its record",
            )
    windows = retention.RetentionWindows(
        operations=args.operations, results=args.results, identities=args.identities, history=args.history,
        outbox=args.outbox, executions=args.executions,
    )  # fmt: skip
    store = _open(args)
    try:
        report = retention.prune(
            store, windows, batch_size=args.batch, max_batches=args.max_batches, pause=args.pause.total_seconds(),
            duty=args.duty,
        )
    finally:
        store.close()
    removed = {
        "results_expired": report.results_expired, "identities": report.identities,
        "transitions": report.transitions, "attempts": report.attempts, "operations": report.operations,
        "outbox": report.outbox, "executions": report.executions, "execution_rows": report.execution_rows,
        "batches": report.batches, "finished": report.finished,
    }  # fmt: skip
    if out.json_mode:
        out.data(removed)
    else:
        out.line(", ".join(f"{k} {v}" for k, v in removed.items()))
    return EXIT_OK


__all__ = ["add_parsers", "run_export", "run_prune"]
