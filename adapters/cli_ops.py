"""The ``fencekeeper op`` commands (durable operations, seed 001) and the operations part of ``modelcheck``.

Registered from ``cli.py`` (:func:`add_parser`, :func:`run`); the
conventions are the command line's own (``cli.py`` module header): data on
stdout (one JSON document with ``--json``), one ``fencekeeper: error: ...``
line on stderr, exit 0 on success, 1 when a request is refused (the code is
printed: ``idempotency_conflict``, ``cancel_too_late``, ...) or a store
blocks, 2 for bad usage or input (invalid JSON, an unknown action, version
or operation id, input the action's normaliser rejects, a ``--db`` that
names no database or no server that answers).  Only ``op submit`` creates a
SQLite file; every other command refuses a path that does not exist.
``op submit`` checks its input before opening anything, and creates a new
file only with its admission in it (:func:`_submit_new_file`), so an error
writes nothing.

Actions and principal resolvers come from a module with ``registry()`` and
``resolvers()`` (and optionally ``prepare(store)``, run before a worker
starts): ``--actions MODULE``, by default the teaching examples
(``fencekeeper.adapters.operations.examples``: ``transfer``,
``capture_payment``, ``balance``; principals ``users:v1:NAME``, every one
active in every tenant -- the local operator's tool).

``op worker`` runs N worker threads for one tenant.  SIGINT or SIGTERM stops
each after the attempt it is running, and says so on stderr, as ``fencekeeper
worker`` does; a second signal exits at once with code 130, whatever attempt is
in flight (nothing more is printed), and a lease still held then
simply expires: the next claim replaces it automatically (seed 001), unlike
a workflow execution's.  A due row that
contradicts its state is reported on one line and passed over; with
``--until-idle`` the command then exits 1, naming it on its last line
(``malformed`` in ``--json``), since work is left that no worker can claim.
With ``--log-json`` every line it writes on stderr once its options are
accepted is one JSON object (:func:`_log_report`, :func:`_note`,
:func:`_stopped`), made by the executions worker's log
(:class:`~fencekeeper.adapters.observe.JsonLog`); the store's outage notes
and other libraries' warnings come through the command line's router
(``cli_logging``) into the same log.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from fencekeeper.kernel.common import identifier_problem, shown, shown_text
from fencekeeper.kernel.operations import RefusalCode, TerminalOutcome
from fencekeeper.kernel.recovery import MAX_RATIONALE

from . import cli_logging, observe, prefork
from .cli import CliError, json_option
from .connect import parse_url
from .operations.base import TransactionalOperationStore
from .operations.connect import open_operation_store
from .operations.pool import OperationWorkerPool
from .operations.service import (
    DurableActionRegistry,
    DurableOperationError,
    DurableOperationService,
    OperationAdmission,
    OperationRecord,
    PrincipalReference,
    PrincipalResolverRegistry,
    check_submission,
)
from .operations.worker import MAX_LEASE, DurableOperationWorker, WorkReport, default_worker_id
from .render import Output
from .store import StoreError, StorePatience
from .worker import WorkerSettingError, check_concurrency

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

DEFAULT_ACTIONS = "fencekeeper.adapters.operations.examples"
DEFAULT_TENANT = "default"
DEFAULT_NAMESPACE = "default"
DEFAULT_PRINCIPAL = "users:v1:operator"
_USAGE_CODES = frozenset({"invalid_input", "unknown_action", "operation_not_found", "invalid_request", "invalid_action"})
_USAGE_STORE_CODES = frozenset({"store_unavailable", "not_a_database"})
MALFORMED_ROW = RefusalCode.MALFORMED_ROW.value
"""A worker's report of a due row it passed over because the row contradicts its state."""


class _Usage(Exception):
    pass


_MAX_RETENTION_SECONDS = 10 * 366 * 86_400


# --- arguments ---------------------------------------------------------------------------------


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``op`` and its subcommands through ``cli.py``'s ``command`` helper."""
    op = command(
        "op",
        "durable operations: submit, status, history, decide, cancel, check, worker",
        description="Durable operations (seed 001): one logical request under a scoped idempotency key, run by "
        "workers as fenced Attempts; an expired owner is replaced automatically.",
    )
    sub = op.add_subparsers(dest="op_command", required=True, metavar="OP_COMMAND")

    def subcommand(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help, allow_abbrev=False, **kwargs)  # as every parser (cli.py)
        # Accepted after the subcommand too, as by every other command (cli.py); SUPPRESS keeps an earlier --debug.
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        parser.add_argument("--json", action="store_true", help="machine-readable output: one JSON document")
        parser.add_argument("--db", required=True, metavar="URL", help="a SQLite file or a postgresql:// DSN")
        parser.add_argument("--schema", metavar="NAME", help="PostgreSQL schema (default: fencekeeper)")
        parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=f"default: {DEFAULT_NAMESPACE}")
        parser.add_argument("--actions", default=DEFAULT_ACTIONS, metavar="MODULE", help="registry() and resolvers()")
        return parser

    submit = subcommand("submit", "submit an operation; an identical resubmission returns the same one")
    submit.add_argument("action", metavar="ACTION")
    submit.add_argument(
        "--input",
        default="{}",
        metavar="JSON",
        help="the action's input (default: {}); @FILE reads it from FILE, - from stdin",
    )
    submit.add_argument("--key", required=True, metavar="KEY", help="the client's idempotency key")
    submit.add_argument("--version", type=int, metavar="N", help="the action version (default: the newest)")
    submit.add_argument("--tenant", default=DEFAULT_TENANT, help=f"default: {DEFAULT_TENANT}")
    submit.add_argument("--as", dest="principal", default=DEFAULT_PRINCIPAL, metavar="RESOLVER:vN:SUBJECT")
    submit.add_argument(
        "--retention",
        type=float,
        default=86_400.0,
        metavar="SECONDS",
        help="how long the idempotency identity is kept from submission, at least until the deadline (default 86400: a day)",
    )

    status = subcommand("status", "an operation's state, outcome, result and attempts")
    status.add_argument("operation_id", metavar="OPERATION_ID")

    history = subcommand("history", "an operation's transitions, oldest first")
    history.add_argument("operation_id", metavar="OPERATION_ID")

    decide = subcommand("decide", "approve or reject an operation awaiting approval")
    decide.add_argument("operation_id", metavar="OPERATION_ID")
    verdict = decide.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--approve", action="store_true")
    verdict.add_argument("--reject", action="store_true")
    decide.add_argument("--as", dest="principal", required=True, metavar="RESOLVER:vN:SUBJECT")
    decide.add_argument("--digest", metavar="SHA256", help="the input digest the approver saw (binds the decision)")
    decide.add_argument("--expires", type=float, default=86_400, metavar="SECONDS", help="validity (default 1 day)")
    decide.add_argument("--id", dest="approval_id", metavar="APPROVAL_ID", help="repeat it to retry idempotently")

    cancel = subcommand("cancel", "cancel an operation (it never undoes a committed effect)")
    cancel.add_argument("operation_id", metavar="OPERATION_ID")
    cancel.add_argument("--as", dest="principal", default=DEFAULT_PRINCIPAL, metavar="RESOLVER:vN:SUBJECT")
    cancel.add_argument(
        "--reason", default="", metavar="TEXT", help=f"kept in the history; at most {MAX_RATIONALE} characters"
    )

    check = subcommand(
        "check",
        "the deployment check for one tenant (as `fencekeeper check`): exits 1 when anything blocks running it",
    )
    check.add_argument("--tenant", default=DEFAULT_TENANT, help=f"default: {DEFAULT_TENANT}")

    worker = subcommand(
        "worker",
        "claim and run due operations of one tenant until stopped (or idle)",
        description="SIGINT or SIGTERM stops each worker after its current attempt; a second signal exits at once "
        "(code 130), as `fencekeeper worker` does, and a lease still held then expires: the next claim replaces it.",
    )
    worker.add_argument("--tenant", default=DEFAULT_TENANT, help=f"default: {DEFAULT_TENANT}")
    worker.add_argument("--concurrency", type=int, default=1, metavar="N", help="worker threads (default 1, at most 64)")
    worker.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="P",
        help="worker processes, each of --concurrency threads, forked after one start-up (default 1; needs fork)",
    )
    worker.add_argument("--lease", type=float, default=30.0, metavar="SECONDS", help="lease length (default 30)")
    worker.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="idle poll interval (default 1)")
    worker.add_argument("--until-idle", action="store_true", help="stop when nothing is due")
    worker.add_argument("--id", dest="worker_prefix", metavar="PREFIX", help="worker ids PREFIX-1..N (default: host-pid)")
    worker.add_argument(
        "--log-json", action="store_true", help="log every report and note on stderr as one JSON object a line"
    )


# --- running -------------------------------------------------------------------------------------


def run(args: argparse.Namespace, out: Output) -> int:
    """Run one ``op`` subcommand; errors are printed here, as one line, with the command line's exit codes."""
    try:
        return _COMMANDS[args.op_command](args, out)
    except (_Usage, DurableOperationError, StoreError) as exc:
        if getattr(args, "debug", False):
            raise  # main() shows its traceback, as for every other command's errors
        message, code = _describe(exc)
        out.note(f"fencekeeper: error: {message}")
        return code


class RegistryError(_Usage):
    """``--actions`` names no module with ``registry()`` and ``resolvers()``."""


def import_deployment_module(name: str) -> ModuleType:
    """``name`` imported with the current directory on the import path, as ``--handler`` and ``python -m`` have it.

    A deployment's own modules (``--actions``, ``--auth``) usually sit beside
    where its commands are run, uninstalled: the ``fencekeeper`` script's
    own directory is what Python puts first, not the current one.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def load_registry_module(name: str) -> ModuleType:
    """The deployment's registry module (``--actions``): ``registry()``, ``resolvers()``, optionally ``prepare(store)``."""
    try:
        module = import_deployment_module(name)
    except ImportError as exc:
        raise RegistryError(f"--actions: cannot import {shown(name)}: {shown_text(exc)}") from None
    except Exception as exc:  # an empty or relative name, or the module's own failure; --debug shows it through the cause
        problem = shown_text(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
        raise RegistryError(f"--actions: cannot import {shown(name)}: {problem}") from exc
    for needed in ("registry", "resolvers"):
        if not callable(getattr(module, needed, None)):
            raise RegistryError(f"--actions: {name} has no {needed}() function")
    return module


_module = load_registry_module


def load_registries(name: str) -> tuple[ModuleType, DurableActionRegistry, PrincipalResolverRegistry]:
    """The ``--actions`` module with what its ``registry()`` and ``resolvers()`` return, checked before anything is opened.

    Either failing, or answering something else, is the module's fault, not
    fencekeeper's: one ``--actions`` line (exit 2) rather than an internal
    error, and never a worker that claims an operation and then fails on it.
    """
    module = _module(name)
    found: list[Any] = []
    for needed, kind in (("registry", DurableActionRegistry), ("resolvers", PrincipalResolverRegistry)):
        try:
            value = getattr(module, needed)()
        except Exception as exc:  # --debug shows the module's own traceback through the cause
            raise RegistryError(f"--actions: {name}.{needed}() raised {type(exc).__name__}: {' '.join(str(exc).split())}") from exc
        if not isinstance(value, kind):
            raise RegistryError(f"--actions: {name}.{needed}() returned {type(value).__name__}, not a {kind.__name__}")
        found.append(value)
    return module, found[0], found[1]


@contextmanager
def _service(
    args: argparse.Namespace,
    *,
    db: str | None = None,
    idle_in_transaction_timeout: float | None = None,
    retention: timedelta = timedelta(days=1),
    read_only: bool = False,
) -> Iterator[tuple[DurableOperationService, TransactionalOperationStore, ModuleType]]:
    """The service on ``--db`` (or ``db``), which must already exist: only ``op submit`` creates a file.

    ``read_only`` for the commands that only read (``status``, ``history``): as
    ``fencekeeper inspect``, they neither migrate a SQLite file nor need to write it.
    """
    module, actions, resolvers = load_registries(args.actions)
    # A command given --tenant acts in that tenant only: on PostgreSQL the store's session is bound to
    # it, so the restricted application role's row-level security admits it (docs/operating-postgres.md).
    store = open_operation_store(
        db or args.db,
        schema=args.schema,
        tenant=getattr(args, "tenant", None),
        create=db is not None,
        idle_in_transaction_timeout=idle_in_transaction_timeout,
        read_only=read_only,
    )
    try:
        service = DurableOperationService(store, actions, resolvers, namespace=args.namespace, retention=retention)
        yield service, store, module
    finally:
        store.close()


def _prepare_patiently(prepare: Callable[[Any], object], store: TransactionalOperationStore, pool: OperationWorkerPool) -> None:
    """The actions module's ``prepare(store)``, a lost connection waited out as the worker loop waits it out.

    It runs once, as the worker starts, on a store that has just answered:
    a connection ended under it then (a failover, an administrator's
    ``pg_terminate_backend``) is no more a reason to exit than the same loss
    a moment later, inside the loop.  What the loop gives up on, it gives up
    on: another code, a store failing past ``RIDE_OUT_SECONDS``, or a stop.
    """
    patience = StorePatience()
    while True:
        try:
            prepare(store)
        except StoreError as exc:
            wait = patience.failed(exc.code)
            if wait is None or pool.stopping:
                raise
            cli_logging.store_failed()
            pool.wait_for_stop(wait)
            continue
        cli_logging.store_answered(patience.failures)
        return


def _principal(text: str) -> PrincipalReference:
    return PrincipalReference.parse(text)


def _show(out: Output, record: OperationRecord, extra: dict[str, Any] | None = None) -> None:
    if out.json_mode:
        out.data({**(extra or {}), **record.to_json()})
        return
    outcome = f" ({record.outcome.value})" if record.outcome is not None and record.outcome.value != record.state.value else ""
    out.line(f"{record.operation_id}: {record.state.value}{outcome}")
    out.line(f"  action {record.action_name} v{record.action_version} ({record.effect_class.value}), tenant {record.tenant}")
    out.line(f"  attempts {record.attempt_count} of {record.maximum_attempts}; deadline {record.deadline.isoformat()}")
    if record.requires_approval:
        out.line(f"  approval: {_approval_text(record)}; input digest {record.input_digest}")
    if record.effect_id is not None:
        settled = "unsettled: the next attempt reconciles first" if record.effect_unsettled else "settled"
        out.line(f"  external effect id {record.effect_id} ({settled})")
    if record.result is not None:
        out.line(f"  result {json.dumps(record.result, sort_keys=True)}")
    if record.error_code is not None:
        out.line(f"  error {record.error_code}")
    for attempt in record.attempts:
        ended = attempt.ended_at.isoformat() if attempt.ended_at else "-"
        error = f" {attempt.error_code}" if attempt.error_code else ""
        out.line(f"  attempt {attempt.number} by {attempt.worker_id}: {attempt.state}{error} (ended {ended})")


def _approval_text(record: OperationRecord) -> str:
    """The stored decision in words: a rejection is a decision too, never "none yet"."""
    approval = record.approval
    if approval is None:
        return "none yet"
    if not approval.approved:
        return f"rejected by {approval.approver}"
    used = (
        f"consumed by attempt {approval.consumed_by_attempt}"
        if approval.consumed_by_attempt is not None
        else "not used yet"
    )
    return f"approved by {approval.approver} until {approval.expires_at.isoformat()}, {used}"


def _submit(args: argparse.Namespace, out: Output) -> int:
    try:
        # Any JSON value: the action's normaliser decides what it accepts.
        payload, _ = json_option("--input", args.input)
    except CliError as exc:
        raise _Usage(str(exc)) from None
    principal = _principal(args.principal)
    # Checked before anything is opened: bad input never creates (or touches) a store.
    check_submission(
        load_registries(args.actions)[1],
        tenant=args.tenant, action=args.action, input=payload, client_key=args.key, version=args.version,
    )  # fmt: skip
    problem = identifier_problem(args.namespace)
    if problem is not None:
        raise DurableOperationError("invalid_input", f"--namespace: {problem}")
    if not 0 < args.retention <= _MAX_RETENTION_SECONDS:  # also false for nan
        raise _Usage(f"--retention: must be a positive number of seconds, at most ten years; got {args.retention}")
    retention = timedelta(seconds=args.retention)

    def submit(db: str) -> OperationAdmission:
        with _service(args, db=db, retention=retention) as (service, _, _):
            return service.submit(
                tenant=args.tenant,
                principal=principal,
                action=args.action,
                input=payload,
                client_key=args.key,
                version=args.version,
            )

    location = parse_url(args.db, schema=args.schema)
    if location.kind == "sqlite" and location.path is not None and not location.path.exists():
        admission = _submit_new_file(location.path, submit)
    else:
        admission = submit(args.db)
    if out.json_mode:
        out.data({"operation_id": admission.operation_id, "created": admission.created, **admission.record.to_json()})
    else:
        out.line(admission.operation_id)
        out.note("admitted" if admission.created else "the same operation as an earlier identical submission")
    return EXIT_OK


def _submit_new_file(path: Path, submit: Callable[[str], OperationAdmission]) -> OperationAdmission:
    """``submit`` into a SQLite file that does not exist yet: the file appears only holding its admission.

    What only the store decides (a principal refused, say) can still refuse
    the submission after the store is opened, so the store is created under
    a scratch name beside ``path`` and linked to ``path`` only once the
    admission has committed: a refusal leaves nothing, and a command that
    created ``path`` meanwhile keeps its file (this submission then goes
    into it, as into any existing file).
    """
    scratch = path.with_name(f".{path.name}.{secrets.token_hex(6)}.new")
    try:
        # A URL rather than the bare path, which parse_url would misread if a directory's name held "://".
        # Closed on return: the write-ahead log is checkpointed into the file and removed.
        admission = submit(f"sqlite:///{scratch}")
        try:
            os.link(scratch, path)
        except FileExistsError:
            return submit(f"sqlite:///{path}")
        except OSError:
            # A file system without hard links: a rename, which could replace a file created
            # meanwhile, so only when there still is none.
            if path.exists():
                return submit(f"sqlite:///{path}")
            os.replace(scratch, path)
        return admission
    finally:
        for leftover in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{scratch}{leftover}")


def _status(args: argparse.Namespace, out: Output) -> int:
    with _service(args, read_only=True) as (service, _, _):
        record = service.get(args.operation_id)
    if record is None:
        raise DurableOperationError("operation_not_found", f"operation {shown(args.operation_id)} does not exist")
    _show(out, record)
    return EXIT_OK


def _history(args: argparse.Namespace, out: Output) -> int:
    with _service(args, read_only=True) as (service, _, _):
        lines = service.history(args.operation_id)
    if out.json_mode:
        out.data({"operation_id": args.operation_id, "history": [line.to_json() for line in lines]})
        return EXIT_OK
    out.table(
        ("rev", "at", "event", "from", "to", "actor", "attempt", "reason"),
        [
            (str(h.revision), h.at.isoformat(), h.event or "admit", h.from_state or "-", h.to_state, h.actor,
             str(h.attempt), h.reason)
            for h in lines
        ],
        title=args.operation_id,
    )
    return EXIT_OK


def _decide(args: argparse.Namespace, out: Output) -> int:
    if not 0 < args.expires < 86_400 * 366:
        raise _Usage(f"--expires: must be positive and under a year, got {args.expires}")
    with _service(args) as (service, store, _):
        record = service.decide(
            args.operation_id,
            approver=_principal(args.principal),
            approve=bool(args.approve),
            input_digest=args.digest,
            expires_at=store.now() + timedelta(seconds=args.expires),
            approval_id=args.approval_id,
        )
    _show(out, record)
    return EXIT_OK


def _cancel(args: argparse.Namespace, out: Output) -> int:
    with _service(args) as (service, _, _):
        record = service.cancel(args.operation_id, principal=_principal(args.principal), reason=args.reason)
    _show(out, record)
    return EXIT_OK


def _worker(args: argparse.Namespace, out: Output) -> int:
    try:
        check_concurrency(args.concurrency)
    except WorkerSettingError as exc:
        raise _Usage(f"--concurrency: {exc.message}") from None
    problem = identifier_problem(args.tenant)
    if problem is not None:
        raise _Usage(f"--tenant: {problem}")
    longest = MAX_LEASE.total_seconds()
    for flag, seconds in (("--lease", args.lease), ("--poll", args.poll)):
        # At most a day (the worker's MAX_LEASE): the lease is also the PostgreSQL sessions' idle-in-transaction
        # timeout, which the store bounds so; nan and infinity are no number of seconds (and would end each worker
        # thread at its start).
        if not 0 < seconds <= longest:  # also false for nan
            raise _Usage(f"{flag}: must be a positive number of seconds, at most a day ({longest:g}), got {seconds}")
    if timedelta(seconds=args.lease) <= timedelta(0):
        # Under half a microsecond the lease is no duration at all: each worker thread would refuse it as it starts
        # (DurableOperationWorker), with a traceback each, and the command would exit 0 having run nothing.
        raise _Usage(f"--lease: must be at least a microsecond, got {args.lease:g} s")
    try:
        processes = prefork.check_processes(args.processes)
    except prefork.ProcessesError as exc:
        raise _Usage(f"--processes: {exc}") from None
    # Refused here, once, as usage, as `fencekeeper worker` does: each worker thread would refuse them as it starts
    # (DurableOperationWorker), and the ids of every thread of every process must be identifiers.
    prefix = args.worker_prefix or default_worker_id()
    if args.worker_prefix is not None:
        problem = identifier_problem(args.worker_prefix)
        if problem is not None:
            raise _Usage(f"--id: {problem}")
    elif identifier_problem(prefix) is not None:
        raise _Usage(f"--id: the default worker id {prefix!r} (host name and process id) is not an identifier; give --id")
    last = f"{prefix}-{processes * args.concurrency}"
    if identifier_problem(last) is not None:
        raise _Usage(f"--id: {prefix!r} is too long to name workers: {last!r} must be at most 128 characters")
    try:
        return _run_workers(args, out, prefix, processes)
    except (_Usage, DurableOperationError, StoreError) as exc:
        # Options accepted, the log has begun: an --actions or a --db that cannot be used is its last line, not a
        # line of text a log collector cannot parse.  Without it, run() says it as every op command's error.
        if not args.log_json or getattr(args, "debug", False):
            raise
        message, code = _describe(exc)
        _stopped(args, out, message)
        return code


def _run_workers(args: argparse.Namespace, out: Output, prefix: str, processes: int) -> int:
    errors: list[str] = []
    if processes == 1:
        reports, idle, errors = _work(args, out, prefix, 1, None)
    else:
        # Opened once before the fork: a --db or --actions that cannot be used is one error, not one per
        # process, and every process inherits the modules already imported.  Nothing of it crosses the fork.
        with _service(args):
            pass
        try:
            ends, received = prefork.run(
                processes,
                lambda number, lifeline: _work(args, out, prefix, (number - 1) * args.concurrency + 1, lifeline),
                describe=_describe,
                failed=lambda result: bool(result and result[2]),
                note=lambda message: _note(args, out, message),
                finishes="attempt",
            )
        except prefork.ProcessesError as exc:
            _stopped(args, out, f"--processes: {exc}")
            return EXIT_PROBLEM
        common = prefork.common_error(ends)
        if common is not None:
            message, code = common
            _stopped(args, out, message)
            return code
        reports, idle = [], received is None
        for end in ends:
            if end.result is None:
                errors.append(end.problem())
                continue
            reports += end.result[0]
            idle = idle and end.result[1]
            errors += end.result[2]
    # Rows passed over because they contradict their state (each worker reports one once): the queue went on
    # without them, but they stay due until repaired.
    malformed = list(dict.fromkeys(r["operation_id"] for r in reports if r["outcome"] == MALFORMED_ROW))
    if out.json_mode:
        out.data(
            {
                "stopped_by": "error" if errors else "idle" if args.until_idle and idle else "signal",
                "at": datetime.now(UTC).isoformat(),
                "reports": reports,
                **({"errors": errors} if processes > 1 or errors else {}),
                **({"malformed": malformed} if malformed else {}),
            }
        )
    else:
        out.line(f"{len(reports)} operation attempts reported")
    if errors:
        _stopped(args, out, "; ".join(errors))
        return EXIT_PROBLEM
    if malformed and args.until_idle:
        # Idle, yet work is left that no worker can claim: an exit 0 would tell a script or an operator that the
        # queue is done.  Without --until-idle the workers keep running (and the rows stay passed over).
        _stopped(
            args,
            out,
            f"passed over {len(malformed)} operation(s) whose stored row contradicts its state: "
            f"{', '.join(malformed)}; repair the row (docs/operations.md) [{MALFORMED_ROW}]",
        )
        return EXIT_PROBLEM
    return EXIT_OK


_SAID_WELL = frozenset({TerminalOutcome.SUCCEEDED.value, "retry", TerminalOutcome.CANCELLED.value,
                        TerminalOutcome.APPROVAL_REJECTED.value})  # fmt: skip
"""The outcomes the log says at level ``info``: what was asked happened, or will be tried again, or a person decided."""
_SAID_AS_ERRORS = frozenset(o.value for o in TerminalOutcome) - _SAID_WELL
"""An operation ended without its result (``max_attempts_exceeded``, ``external_outcome_unknown``, ...): ``error``,
as an execution that left for ``failed`` is in the executions worker's log.  Every other report is a refusal
(``malformed_row``, ``lease_expired``, ``action_not_registered``, ...): ``warning``, as a refused visit is there."""


def _log_report(log: observe.JsonLog, worker_id: str, report: WorkReport) -> None:
    """One report as one object of the ``--log-json`` log: its outcome is the ``event`` an operator alerts on."""
    level = "info" if report.outcome in _SAID_WELL else "error" if report.outcome in _SAID_AS_ERRORS else "warning"
    log.line(
        level,
        report.outcome,
        worker_id=worker_id,
        operation_id=report.operation_id,
        attempt=report.attempt,
        detail=report.detail,
        **({"resumed": True} if report.resumed else {}),
    )


def _note(args: argparse.Namespace, out: Output, message: str) -> None:
    """One of op worker's own notes: a line of text, or with ``--log-json`` a ``note`` of the log."""
    if args.log_json:
        observe.JsonLog(sys.stderr).line("info", "note", detail=message)
    else:
        out.note(message)


def _stopped(args: argparse.Namespace, out: Output, message: str) -> None:
    """What ends an op worker run that exits 1 or 2: ``fencekeeper: error: ...``, or with ``--log-json`` an ``error``."""
    if args.log_json:
        observe.JsonLog(sys.stderr).line("error", "error", detail=message)
    else:
        out.note(f"fencekeeper: error: {message}")


def _work(
    args: argparse.Namespace, out: Output, prefix: str, first: int, lifeline: prefork.Lifeline | None
) -> tuple[list[dict[str, Any]], bool, list[str]]:
    """One process's worker threads, numbered from ``first``.

    What they reported, whether they ran out of work, and the errors that
    stopped them (each stops every thread of the process).
    """
    # A signal may come before the pool is made (while the store opens, while `prepare` runs): it is kept here.
    asked = threading.Event()
    made: list[OperationWorkerPool] = []
    signals = [0]

    def ask_stop() -> None:
        asked.set()
        for pool in made:
            pool.request_stop()

    def on_signal(number: int, frame: FrameType | None) -> None:
        signals[0] += 1
        if signals[0] > 1:
            # A second signal: leave now, as `fencekeeper worker` does; a lease still held simply expires.
            # Raising KeyboardInterrupt instead unwound through the store's close, which waited for an
            # attempt in flight (an atomic action's transaction) to end, and let it commit.
            os._exit(130)
        # As `fencekeeper worker` says it: an operator who pressed Ctrl-C learns why the command has not ended yet.
        _note(args, out, "stopping after the current attempt; send the signal again to quit at once")
        ask_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    if lifeline is not None:
        # A relayed stop is idempotent, unlike a signal: it may have reached this process already.
        lifeline.heed(lambda reason: ask_stop())
    # A JSON log owns stderr, as `fencekeeper worker --log-json`'s does: every report is one of its objects.
    log = observe.JsonLog(sys.stderr) if args.log_json else None

    def tell(worker: DurableOperationWorker, report: WorkReport) -> None:
        if log is not None:
            _log_report(log, worker.worker_id, report)
        elif not out.json_mode:
            # An operation can end with no attempt made (an approval that expired first).
            attempt = "" if report.attempt is None else f" attempt {report.attempt}"
            # A damaged row is told with what the store found wrong (field and repair are the
            # operator's), on the one line: the worker passes over it and goes on.
            # So is an attempt taken up after its store lost a write's answer (`resumed: ...`).
            shown = report.outcome == MALFORMED_ROW or report.resumed
            why = f": {' '.join(report.detail.split())}" if shown else ""
            out.note(f"{worker.worker_id}: {report.operation_id}{attempt}: {report.outcome}{why}")

    try:
        # The idle-in-transaction timeout is the lease: a worker stalled inside an atomic action loses its
        # session (its row lock, its commit) once its lease is over, when a replacement may claim the
        # operation, and never while an action is still within it, however long the lease.
        with _service(args, idle_in_transaction_timeout=args.lease) as (service, store, module):
            workers = [
                DurableOperationWorker(
                    store,
                    service.actions,
                    service.resolvers,
                    tenant=args.tenant,
                    worker_id=f"{prefix}-{number}",
                    lease=timedelta(seconds=args.lease),
                    namespace=args.namespace,
                )
                for number in range(first, first + args.concurrency)
            ]
            # The loop every worker thread runs, as a Python program runs it (adapters/operations/pool.py): a store
            # failure waited out for up to RIDE_OUT_SECONDS (said once per outage and process, as `fencekeeper
            # worker` says it: cli_logging), anything else stopping every worker, so that the command exits 1 and a
            # supervisor restarts it; idle workers woken by a submission's NOTIFY on PostgreSQL.
            pool = OperationWorkerPool(
                workers,
                poll=args.poll,
                until_idle=args.until_idle,
                on_report=tell,
                on_store_failed=cli_logging.store_failed,
                on_store_answered=cli_logging.store_answered,
            )
            made.append(pool)
            if asked.is_set():
                pool.request_stop()
            prepare = getattr(module, "prepare", None)
            if callable(prepare):
                _prepare_patiently(prepare, store, pool)
            pool.start()
            while not pool.join(0.2):
                pass
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    reports, errors = pool.reports, pool.errors
    listed = [
        {
            "operation_id": r.operation_id, "attempt": r.attempt, "outcome": r.outcome, "detail": r.detail,
            **({"resumed": True} if r.resumed else {}),
        }
        for r in reports
    ]  # fmt: skip
    return listed, not pool.stopping, errors


def _describe(exc: BaseException) -> tuple[str, int]:
    """What a worker process that raised ``exc`` reports: the one-line message and exit code ``run`` would give."""
    if isinstance(exc, _Usage):
        return str(exc), EXIT_USAGE
    if isinstance(exc, KeyboardInterrupt):  # a second signal, or a Ctrl-C before the process's own handlers
        return "interrupted", 130
    if isinstance(exc, DurableOperationError):
        return f"{exc.message} [{exc.code}]", EXIT_USAGE if exc.code in _USAGE_CODES else EXIT_PROBLEM
    if isinstance(exc, StoreError):
        return f"{exc.message} [{exc.code}]", EXIT_USAGE if exc.code in _USAGE_STORE_CODES else EXIT_PROBLEM
    return f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}", EXIT_PROBLEM


def _check(args: argparse.Namespace, out: Output) -> int:
    """``fencekeeper check`` for the operations' namespace and tenant, in this command's older, narrower shape.

    One check: :func:`deployment.check_deployment` decides (schema, actions,
    resolvers, definitions; it reads and never writes).  The JSON keeps the
    keys this command has always printed, with every blocking sentence and
    warning beside them.
    """
    from . import deployment  # noqa: PLC0415 - loads only for this command

    _, actions, resolvers = load_registries(args.actions)
    report = deployment.check_deployment(
        args.db, schema=args.schema, namespace=args.namespace, tenant=args.tenant, actions=actions, resolvers=resolvers
    )
    if not report.reachable:
        # What every other op command says of this --db, and the same exit code.
        raise StoreError("store_unavailable", "; ".join(report.blocking) or f"--db: {args.db} names no usable store")
    if out.json_mode:
        out.data(
            {
                "ok": report.ok,
                "missing_actions": [{"name": r.name, "version": r.version} for r in report.actions if r.registered is False],
                "missing_resolvers": [
                    {"name": r.name, "version": r.version} for r in report.resolvers if r.registered is False
                ],
                "unreadable_principals": list(report.unreadable_principals),
                "blocking": list(report.blocking),
                "warnings": list(report.warnings),
            }
        )
    else:
        out.line("check: ok" if report.ok else "check: BLOCKED")
        for problem in report.blocking:
            out.line(f"  {problem}")
        for warning in report.warnings:
            out.line(f"  warning: {warning}")
    return EXIT_OK if report.ok else EXIT_PROBLEM


_COMMANDS: dict[str, Callable[[argparse.Namespace, Output], int]] = {
    "check": _check,
    "submit": _submit,
    "status": _status,
    "history": _history,
    "decide": _decide,
    "cancel": _cancel,
    "worker": _worker,
}


# --- modelcheck -------------------------------------------------------------------------------------


def modelcheck_operations() -> int:
    """Run the operation model checker's standard configurations; print as ``modelcheck`` does."""
    from fencekeeper.kernel import opsmodel  # noqa: PLC0415 - the model checker loads only for modelcheck, not for op worker
    for title, bounds in opsmodel.STANDARD:
        started = time.perf_counter()
        result = opsmodel.explore(bounds)
        seconds = time.perf_counter() - started
        scope = "complete" if result.complete else f"to depth {result.depth}"
        print(
            f"{title}: {bounds.workers} workers, {bounds.submitters} submitters, {bounds.max_claims} claims, "
            f"ticks 0-{bounds.max_tick}: {result.states:,} states explored, {result.transitions:,} decisions, "
            f"{scope}, {seconds:.1f}s"
        )
        if result.violation is not None:
            print(f"VIOLATION {result.violation.invariant.value}: {result.violation.message}")
            print("shortest trace:")
            for number, label in enumerate(result.violation.trace, start=1):
                print(f"  {number:>2}. {label}")
            return EXIT_PROBLEM
        if not result.complete and bounds.max_depth is None:
            print(f"stopped at {bounds.max_states:,} states before the bounds were exhausted")
            return EXIT_PROBLEM
    print("every invariant of specs/operations.md held in every explored state and write")
    return EXIT_OK
