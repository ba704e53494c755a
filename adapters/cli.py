"""The ``fencekeeper`` command line.

Rules of this module:

- It translates: arguments in, store and service calls, text out.  It
  decides nothing the kernel or a store decides; every "refused" it prints is
  a kernel refusal, with the kernel's code.
- Input is checked before anything is opened or written: a definition file
  that is missing or malformed, invalid JSON in ``--input``,
  ``--correlation`` or ``--payload``, an ``--id`` that is no identifier, a
  ``--db`` that does not parse or does not answer, an execution id that does
  not exist.  Each is one error line naming the argument, and the store is
  left exactly as it was.
- Only ``run``, ``migrate``, ``demo`` and ``op submit`` create a SQLite
  file; every other command refuses a ``--db`` path that does not exist.  ``list``,
  ``inspect`` and ``check`` only read, and open the file only to read, so a
  read-only store can be read and nothing is created beside it.
- Every string shown in text output goes through ``render.printable``:
  stored values are shown, never obeyed by the terminal.
- JSON options (``--input``, ``op submit``'s too, ``--correlation``,
  ``--payload``) take inline JSON, ``@FILE`` or ``-`` (stdin, for one option
  at a time), all read by :func:`json_option`; a definition
  file is JSON when it is named ``.json`` or starts with ``{``, else TOML.  No command migrates
  PostgreSQL except ``migrate`` (and ``demo``, which says so).
- Every error is one line on stderr, ``fencekeeper: error: ...``; a traceback
  appears only with ``--debug``.  A value it quotes is quoted by its start
  (``kernel.common.shown``: 132 characters, above any identifier; a path by its start and end, 240),
  so a refused 100,000-character id or document does not flood a terminal
  or a log; argparse's own messages are cut the same way (:class:`_Parser`).
- Options are spelt in full: every parser, each subcommand's included, is
  built with ``allow_abbrev=False``, so an abbreviation is an unknown option
  (exit 2) and cannot change meaning when an option sharing its prefix is
  added.  An unknown option is refused by the command or subcommand it was
  given to, after that command's usage (:class:`_Subcommands`), so the user
  sees the options it takes.
- Data goes to stdout and nothing else does; with ``--json`` stdout is one
  JSON document.  Notes and live progress go to stderr.  On a terminal the
  output is rich (tables, colour); in a pipe it is plain text
  (``adapters/render.py``).

Exit codes, one rule for every command: **2 when what was typed cannot be
acted on, 1 when it was understood and the answer is no** (0 is success,
including an idempotent repeat: a decision or event already recorded changes
nothing and is not an error).  So:

- 2: an unknown option, a malformed value (an identifier, a number, JSON,
  an input that does not fit the definition), or a file, ``--db`` or id
  that names nothing usable (no such file, not a database, no server
  answering, no such execution) -- whichever command it is given to,
  ``check`` included;
- 1: the kernel refused (the refusal code is printed; a refusal for a
  malformed request field, ``invalid_request``, is the 2 above), the request
  conflicts with what is stored (an id already taken, a registered revision
  with other content), the store is there but cannot be used as it is (its
  schema, read-only), a check found a problem (``check``, ``check-spec``,
  ``modelcheck``), or an internal error (a bug: ``--debug`` shows its
  traceback);
- 3, from ``conformance`` alone: no case ran, so the run checked nothing
  (``cli_conformance.py``).

Stopping a worker: SIGINT or SIGTERM lets each worker thread finish the node
visit it is in (its Command may already have been sent; the visit's result
must be committed), then release its lease (``running -> eligible``) so that
another worker continues at once.  A worker holds no lease between visits it
does not finish.  A second signal exits at once: a lease still held then,
like the lease of a worker that was killed, simply expires, and
``fencekeeper reconcile --quarantine`` finds it.  With ``--processes`` the
command's own process relays each signal to its worker processes, which
follow the same two rules (``adapters/prefork.py``).

Authority: the command line is the local operator's tool.  It answers every
authority question with ``examples.grants(BUSINESS, PRINCIPAL)``: the
principal named by ``--as`` (default ``user:operator``) holds every operation
in the business named by ``--business`` (default ``default``), and the timer
may dispatch there.  The kernel's own rules still apply on top: a reviewer
outside an approval request's reviewer scope, or the requester deciding their
own request, is refused whatever the grants say.  Deployments plug their own
:class:`~fencekeeper.adapters.ports.AuthorityPolicy` into the Python API
(``fencekeeper.connect``; docs/python.md).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import math
import os
import re
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import attrs

from fencekeeper.kernel import approvals, strict_json
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.common import SHOWN_LENGTH, shown, shown_text
from fencekeeper.kernel.definition import IDENTIFIER, Definition, DefinitionError, from_json, parse_definition
from fencekeeper.kernel.errors import KernelError
from fencekeeper.kernel.events import Event, EventError
from fencekeeper.kernel.machines import MACHINES, ExecutionState
from fencekeeper.kernel.recovery import MAX_RATIONALE
from fencekeeper.kernel.spec import parse_machine_spec, render_machine_spec
from fencekeeper.kernel.text import problem as text_problem

# The service functions (and their OperationError) and the sequence diagram are imported by the
# commands that use them: a worker's start-up never needs them (about 8 ms of imports).
from . import cli_logging, connect, examples, observe, prefork, render
from .ports import AuthorityPolicy, CommandHandler
from .render import Output, state, text
from .store import RIDE_OUT_SECONDS, ExecutionView, StoreError, StorePatience, TransactionalStore
from .worker import (
    MAX_CONCURRENCY,
    MAX_LEASE,
    MIN_LEASE,
    PassReport,
    Worker,
    WorkerEvent,
    WorkerSettingError,
    check_concurrency,
    check_lease,
)

if TYPE_CHECKING:
    # Annotations only: rich loads when something is drawn for a person (adapters/render.py).
    from rich.text import Text

    from fencekeeper.kernel.modelcheck import Bounds

    from . import service

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

DEFAULT_BUSINESS = "default"
DEFAULT_PRINCIPAL = "user:operator"

# StoreError codes that mean --db itself is wrong (usage), not that a reachable store blocks.
_USAGE_STORE_CODES = frozenset({"store_unavailable", "not_a_database"})
# OperationError codes that mean the input was wrong, not that a request was refused.
_USAGE_OPERATION_CODES = frozenset({"execution_not_found", "definition_not_found", "invalid_input", "invalid_event"})


# The longest error message printed: a last bound, for text no message builder quoted through shown().
_MESSAGE_LENGTH = 1000


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose own error messages are bounded as ours are (``kernel.common.shown``).

    argparse builds those messages itself, quoting what was typed (an
    invalid choice, an argument it does not know, a value its type refused),
    so they are bounded on their finished text: each word cut to
    ``SHOWN_LENGTH`` characters, and the whole to ``_MESSAGE_LENGTH``.
    Subparsers are made of the same class (``add_subparsers`` takes the
    parent's), and each parser's subcommands are chosen by
    :class:`_Subcommands`, so that an option a subcommand does not know is
    refused by that subcommand, with its own usage.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)

    def error(self, message: str) -> NoReturn:
        words = (word if len(word) <= SHOWN_LENGTH else word[: SHOWN_LENGTH - 3] + "..." for word in message.split(" "))
        super().error(shown_text(" ".join(words), _MESSAGE_LENGTH))


class _Subcommands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """argparse's choice of a subcommand, whose unknown arguments the subcommand itself refuses.

    argparse hands the unknown arguments of a subcommand up to the top-level
    parser, which refuses them with its own usage (``fencekeeper [-h]
    [--debug] [--version] COMMAND ...``): a mistyped ``--concurency`` on
    ``worker`` was answered without showing the options ``worker`` takes.
    Every argument after a subcommand's name is that subcommand's (no parser
    above it takes one), so what it does not know is unknown to the whole
    command line, and its parser says so: the same exit code and the same
    one error line, after the usage of the command that was typed.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        unknown = vars(namespace).pop(argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if unknown:
            self._name_parser_map[values[0]].error(f"unrecognized arguments: {' '.join(unknown)}")


class CliError(Exception):
    """An error the user can act on; printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- arguments ------------------------------------------------------------------------------


# The journal, op, export, prune, serve and conformance commands live in
# modules of their own (cli_journal, cli_ops, cli_outbox, cli_serve,
# cli_conformance), imported only when a command line may need them:
# importing them (the journal's and durable operations' kernels and stores)
# cost every `fencekeeper worker` about 0.13 s of start-up for commands it
# never runs.  The commands defined here are built one by one for the same
# reason (below).

_AddCommand = Callable[..., argparse.ArgumentParser]
"""``command(name, help, *, prints_data=False, **kwargs)`` of :func:`_parser`: a subcommand's parser, added."""


def _chosen_command(argv: Sequence[str] | None) -> str | None:
    """The command defined in this module that ``argv`` runs, when its parser alone parses ``argv`` alike; else None.

    A command line that starts with such a command's name (after any
    ``--debug``) is all that command's: every word after the name is its
    parser's, and the top-level parser, whose usage names no command
    (``COMMAND ...``), is left nothing it could refuse.  Anything else
    (``--help``, ``--version``, a group's command, a word that is no command)
    may need every command's parser: for the help's list of commands, or
    argparse's "choose from" list.
    """
    words = sys.argv[1:] if argv is None else argv
    for word in words:
        if word != "--debug":
            return word if word in _COMMAND_PARSERS else None
    return None


def _parser(*, only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``only`` (see :func:`_chosen_command`), with that command's parser alone.

    Building a parser costs argparse's message lookups (gettext) and the
    options' objects: a worker's command line took about 6 ms to build and
    parse with the parsers of every command here, 3 ms with its own alone.
    """
    # --debug is accepted before or after the command name; --json after it, on commands that print data.
    # allow_abbrev=False on every parser, parents and subparsers alike (argparse does not pass it down): an
    # abbreviation (--conc for --concurrency) would change meaning, or stop parsing, the day an option sharing
    # its prefix is added, and a typo could pick an option never meant.
    common = _Parser(add_help=False, allow_abbrev=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    data = _Parser(add_help=False, allow_abbrev=False)
    data.add_argument("--json", action="store_true", help="machine-readable output: one JSON document on stdout")

    parser = _Parser(
        prog="fencekeeper",
        allow_abbrev=False,
        description="A formally specified kernel for durable workflow execution.",
        epilog="Exit codes: 0 success; 2 when what was typed cannot be acted on (a malformed value, or a file, --db "
        "or id that names nothing usable); 1 when it was understood and the answer is no (a refusal, a conflict, "
        "a store that cannot be used as it is, a problem a check found).",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"fencekeeper {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, *, prints_data: bool = False, **kwargs: Any) -> argparse.ArgumentParser:
        parents = [common, data] if prints_data else [common]
        return sub.add_parser(name, help=help, parents=parents, allow_abbrev=False, **kwargs)

    for name, build in _COMMAND_PARSERS.items():
        if only in (None, name):
            build(command)
    if only is None:
        from . import cli_conformance, cli_journal, cli_ops, cli_outbox, cli_serve  # noqa: PLC0415 - only when needed (above)

        cli_journal.register(sub, common, data)
        cli_ops.add_parser(command)
        cli_outbox.add_parsers(command, _db_option)
        cli_serve.add_parser(command)
        cli_conformance.add_parser(command)
    return parser


def _demo_parser(command: _AddCommand) -> None:
    demo = command(
        "demo",
        "a real scenario: two workers, an expired lease fenced out, a recovery, approvals",
        description="Plays a real scenario through the kernel, a store, workers and the service functions. "
        "Without --db it uses a fresh SQLite file in a temporary directory and keeps it, so the printed "
        "inspect command works afterwards. With a PostgreSQL --db it migrates the schema first.",
    )
    _db_option(demo, required=False)


def _run_parser(command: _AddCommand) -> None:
    run = command("run", "register a definition file and admit an execution of it; prints its id", prints_data=True)
    run.add_argument("definition", type=Path, metavar="DEFINITION", help="a definition file, TOML or JSON (.json)")
    _db_option(run)
    run.add_argument(
        "--input",
        metavar="JSON",
        help="the execution's input, a JSON object (default: {}); @FILE reads it from FILE, - from stdin",
    )
    _who_options(run)
    run.add_argument("--id", metavar="EXECUTION_ID", help="the execution's id (default: a fresh x-... id)")


def _worker_parser(command: _AddCommand) -> None:
    worker = command(
        "worker",
        "run dispatcher passes until stopped (or until idle)",
        prints_data=True,
        description="Runs N workers in threads, each with its own worker id, claiming eligible executions "
        "of --business and interpreting them under their leases; --processes P runs P such processes, forked "
        "after one start-up, with worker ids numbered across them. Commands go to the example handler "
        "(fencekeeper.adapters.examples.handler) unless --handler names another. SIGINT or SIGTERM stops "
        "each worker after its current node visit and releases what it holds; a second signal exits at once, "
        "and a lease still held then expires, for `reconcile --quarantine` to find.",
    )
    _db_option(worker)
    # Checked by _worker_settings, not by argparse: one error line naming the flag, and the same bounds
    # as the Python API (fencekeeper.adapters.worker.check_concurrency, check_lease).
    worker.add_argument(
        "--concurrency",
        default="1",
        metavar="N",
        help=f"workers (threads; default 1, at most {MAX_CONCURRENCY})",
    )
    worker.add_argument(
        "--processes",
        default="1",
        metavar="N",
        help=f"worker processes, each running --concurrency workers, forked after one start-up (default 1, at most "
        f"{prefork.MAX_PROCESSES}; needs fork: Linux, macOS)",
    )
    worker.add_argument(
        "--lease",
        default="30",
        metavar="SECONDS",
        help=f"lease length (default 30, at least {MIN_LEASE.total_seconds():g})",
    )
    worker.add_argument("--until-idle", action="store_true", help="stop when a pass finds nothing to do")
    worker.add_argument("--poll", type=_seconds, default=1.0, metavar="SECONDS", help="idle poll interval (default 1)")
    worker.add_argument(
        "--business", default=DEFAULT_BUSINESS, help=f"the business served (default: {DEFAULT_BUSINESS})"
    )
    worker.add_argument(
        "--as",
        dest="principals",
        action="append",
        metavar="PRINCIPAL",
        help=f"a workflow principal the worker may act for; repeatable (default: {DEFAULT_PRINCIPAL})",
    )
    worker.add_argument(
        "--handler", metavar="MODULE:FACTORY", help="a CommandHandler factory (default: the example handler)"
    )
    worker.add_argument(
        "--id", dest="worker_prefix", metavar="PREFIX", help="worker ids are PREFIX-1..N (default: host-pid)"
    )
    worker.add_argument("-v", "--verbose", action="store_true", help="print every visit on stderr")
    worker.add_argument(
        "--log-json", action="store_true", help="log every visit, refusal and note on stderr as one JSON object a line"
    )
    worker.add_argument(
        "--metrics-port",
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (HOST default: every interface; "
        "needs pip install 'fencekeeper[metrics]')",
    )


def _inspect_parser(command: _AddCommand) -> None:
    inspect = command("inspect", "an execution's whole timeline", prints_data=True)
    inspect.add_argument("execution_id", metavar="EXECUTION_ID")
    _db_option(inspect)
    inspect.add_argument(
        "--format", choices=("table", "mermaid"), default="table",
        help="table (default), or mermaid: the history as a sequence diagram (adapters/sequence.py)",
    )


def _list_parser(command: _AddCommand) -> None:
    listing = command("list", "executions, with their state and node", prints_data=True)
    _db_option(listing)
    listing.add_argument("--state", choices=[s.value for s in ExecutionState], metavar="STATE")
    listing.add_argument("--business", help="only this business")


def _event_parser(command: _AddCommand) -> None:
    event = command("event", "publish an Event; prints which executions it woke", prints_data=True)
    _db_option(event)
    event.add_argument("event_type", metavar="TYPE")
    event.add_argument(
        "--correlation",
        required=True,
        metavar="JSON",
        help='exact correlation values, e.g. {"order_id": "o-7"}; @FILE reads them from FILE, - from stdin',
    )
    event.add_argument("--payload", metavar="JSON", help="the Event's payload, a JSON object; @FILE or - as above")
    event.add_argument(
        "--id", metavar="EVENT_ID", help="the Event's identity (republishing the same Event is idempotent)"
    )
    _who_options(event)


def _decide_parser(command: _AddCommand) -> None:
    decide = command("decide", "approve or reject an execution's pending approval request", prints_data=True)
    _db_option(decide)
    decide.add_argument("execution_id", metavar="EXECUTION_ID")
    verdict = decide.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--approve", action="store_const", dest="determination", const="approved")
    verdict.add_argument("--reject", action="store_const", dest="determination", const="rejected")
    decide.add_argument("--as", dest="principal", required=True, metavar="REVIEWER", help="the reviewer deciding")
    decide.add_argument("--business", default=DEFAULT_BUSINESS, help=f"default: {DEFAULT_BUSINESS}")
    decide.add_argument("--id", metavar="DECISION_ID", help="the decision's identity (repeat it to retry idempotently)")
    decide.add_argument("--rationale", default="", metavar="TEXT")


def _cancel_parser(command: _AddCommand) -> None:
    cancel = command("cancel", "cancel an eligible or waiting execution", prints_data=True)
    _db_option(cancel)
    cancel.add_argument("execution_id", metavar="EXECUTION_ID")
    _who_options(cancel)


def _reconcile_parser(command: _AddCommand) -> None:
    reconcile = command(
        "reconcile",
        "quarantine expired executions; review, settle, resume or fail one in review",
        prints_data=True,
        description="--quarantine moves every running execution whose lease has expired to "
        "reconciliation_required. With EXECUTION_ID alone it writes nothing: it shows what is known "
        "(unsettled Commands, the continuations the evidence permits) and the choices. Each choice is a "
        "separate, authorized decision: --settle asks the handler what became of the unsettled Command "
        "(its reconcile, never its execute) and records a conclusive answer; --resume-at NODE --because "
        "TEXT resumes there once the kernel's safe-resume proof holds; --fail ends it as failed.",
    )
    _db_option(reconcile)
    reconcile.add_argument("execution_id", nargs="?", metavar="EXECUTION_ID")
    reconcile.add_argument("--quarantine", action="store_true", help="quarantine every expired execution first")
    choice = reconcile.add_mutually_exclusive_group()
    choice.add_argument("--settle", action="store_true", help="ask the handler about the unsettled Command and record it")
    choice.add_argument("--resume-at", metavar="NODE", help="resume at NODE (a continuation the evidence permits)")
    choice.add_argument("--fail", action="store_true", help="end the execution as failed")
    reconcile.add_argument(
        "--because", metavar="TEXT",
        help="with --resume-at (required) or --fail: why the choice is safe, recorded with it",
    )
    reconcile.add_argument(
        "--input", metavar="JSON", help="with --resume-at on a suspended execution: the corrected input"
    )
    reconcile.add_argument(
        "--handler", metavar="MODULE:FACTORY", help="a CommandHandler factory (default: the example handler)"
    )
    _who_options(reconcile)


def _migrate_parser(command: _AddCommand) -> None:
    mig = command("migrate", "create or upgrade a store's schema (forward-only, numbered migrations)", prints_data=True)
    _db_option(mig)


def _check_parser(command: _AddCommand) -> None:
    check = command(
        "check",
        "the deployment check: schema, migrations, actions, resolvers and definitions work not yet ended needs",
        prints_data=True,
        description="Reads, never writes. Exits 1 when anything blocks running: no database, a schema "
        "that is missing, outdated (PostgreSQL), newer than this fencekeeper, altered or corrupt; an action or "
        "principal resolver version that an operation not yet ended needs and --actions does not register; a "
        "definition revision an execution not yet ended is pinned to and the store lacks. Outbox lag, parked "
        "outbox rows and rows past their retention window are warnings.",
    )
    _db_option(check)
    check.add_argument("--namespace", default="default", help="the operations' namespace (default: default)")
    check.add_argument("--tenant", default="default", help="the tenant whose operations are checked (default: default)")
    check.add_argument(
        "--actions",
        metavar="MODULE",
        help="the deployment's registry: a module with registry() and resolvers(), as `fencekeeper op` takes "
        "(without it, what is referenced is listed but not compared)",
    )


def _diagram_parser(command: _AddCommand) -> None:
    diagram = command("diagram", "render a machine's diagram from its spec")
    diagram.add_argument("machine", choices=sorted(MACHINES), metavar="MACHINE", help=", ".join(MACHINES))
    diagram.add_argument("--format", choices=("mermaid", "dot"), default="mermaid")


def _docs_parser(command: _AddCommand) -> None:
    command("docs", "print docs/machines.md as generated from the kernel's tables")


def _export_specs_parser(command: _AddCommand) -> None:
    export = command(
        "export-specs",
        "write the language-neutral specs into DIR: the machine tables from the kernel's tables, and the "
        "protocol, interpreter, definition format and schema this fencekeeper ships",
    )
    export.add_argument("directory", type=Path)


def _modelcheck_parser(command: _AddCommand) -> None:
    mc = command(
        "modelcheck",
        "explore every interleaving of the lease protocol and check every invariant",
        description="Without options, runs the standard configurations of specs/protocol.md.",
    )
    mc.add_argument("--workers", type=_positive, metavar="N")
    mc.add_argument("--executions", type=_positive, metavar="N")
    mc.add_argument("--claims", type=_positive, metavar="N", help="claims per execution (the fence bound)")
    mc.add_argument("--ticks", type=_positive, metavar="N", help="the last clock tick (leases last 2)")
    mc.add_argument("--depth", type=_positive, metavar="N", help="cut the search at this many moves")
    mc.add_argument("--steps", type=_positive, metavar="N", help="node steps per execution")
    mc.add_argument(
        "--compose",
        action="store_true",
        help="let a claim or a step commit with the holder's next decision in one transaction, and check "
        "that this reaches no world the uncomposed protocol does not (without bounds: the composed "
        "configuration of specs/protocol.md only)",
    )


def _check_spec_parser(command: _AddCommand) -> None:
    spec = command("check-spec", "validate machine spec TOML files")
    spec.add_argument("files", type=Path, nargs="+", metavar="FILE")


_COMMAND_PARSERS: dict[str, Callable[[_AddCommand], None]] = {
    "demo": _demo_parser,
    "run": _run_parser,
    "worker": _worker_parser,
    "inspect": _inspect_parser,
    "list": _list_parser,
    "event": _event_parser,
    "decide": _decide_parser,
    "cancel": _cancel_parser,
    "reconcile": _reconcile_parser,
    "migrate": _migrate_parser,
    "check": _check_parser,
    "diagram": _diagram_parser,
    "docs": _docs_parser,
    "export-specs": _export_specs_parser,
    "modelcheck": _modelcheck_parser,
    "check-spec": _check_spec_parser,
}
"""The commands defined in this module, in the order the help lists them; each builds its own parser."""


def _db_option(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--db",
        required=required,
        metavar="URL",
        help="a SQLite file (path or sqlite:///path) or a postgresql:// DSN (optionally ?schema=NAME)",
    )
    parser.add_argument("--schema", metavar="NAME", help="PostgreSQL schema (default: fencekeeper)")


def _who_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--business", default=DEFAULT_BUSINESS, help=f"default: {DEFAULT_BUSINESS}")
    parser.add_argument(
        "--as", dest="principal", default=DEFAULT_PRINCIPAL, metavar="PRINCIPAL", help=f"default: {DEFAULT_PRINCIPAL}"
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {shown(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {shown(text)}") from None
    if not 0 < value < 86_400 * 366:
        raise argparse.ArgumentTypeError(f"must be positive and under a year, got {text}")
    return value


# --- entry point ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser(only=_chosen_command(argv)).parse_args(argv)
    try:
        return _run(args)
    except _one_line_errors() as exc:
        if args.debug:
            raise
        _say_error(args, render.printable(shown_text(_message(exc), _MESSAGE_LENGTH)))
        return _exit_code(exc)
    except KeyboardInterrupt:
        # Ctrl-C outside a worker (which handles it itself): what was committed stays committed.
        _say_error(args, "interrupted")
        return 130
    except BrokenPipeError:
        # The reader went away (`fencekeeper list | head -1`); that is not an error.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        # A bug, not bad input: still one line, with the way to the traceback.
        if args.debug:
            raise
        detail = render.printable(shown_text(" ".join(str(exc).split()), _MESSAGE_LENGTH))
        _say_error(args, f"internal error: {type(exc).__name__}: {detail} (rerun with --debug for the traceback)")
        return EXIT_PROBLEM


def _say_error(args: argparse.Namespace, message: str) -> None:
    """A command's closing error: ``fencekeeper: error: ...``, or under ``--log-json`` the log's ``error`` object.

    A worker's log collector reads every line of stderr as JSON; the line
    that says why the run ended must parse too.
    """
    if getattr(args, "log_json", False):
        observe.JsonLog(sys.stderr).line("error", "error", detail=message)
    else:
        print(f"fencekeeper: error: {message}", file=sys.stderr)


def _one_line_errors() -> tuple[type[Exception], ...]:
    """The errors a command reports in one line (``--debug`` shows their traceback).

    Asked for only once an exception has come: OperationError is the service
    functions' error, and their module loads with the commands that call them.
    """
    from .service import OperationError  # noqa: PLC0415 - see the module's imports

    return (CliError, KernelError, StoreError, OperationError)


def _message(exc: Exception) -> str:
    from .service import OperationError  # noqa: PLC0415 - see the module's imports

    if isinstance(exc, StoreError):
        return f"{exc.message} [{exc.code}]"
    if isinstance(exc, OperationError):
        return f"{exc.message} [{exc.code}]"
    return " ".join(str(exc).split())


def _exit_code(exc: Exception) -> int:
    from .service import OperationError  # noqa: PLC0415 - see the module's imports

    if isinstance(exc, CliError):
        return exc.exit_code
    if isinstance(exc, StoreError):
        return EXIT_USAGE if exc.code in _USAGE_STORE_CODES else EXIT_PROBLEM
    if isinstance(exc, OperationError):
        return EXIT_USAGE if exc.code in _USAGE_OPERATION_CODES else EXIT_PROBLEM
    return EXIT_PROBLEM


def _run(args: argparse.Namespace) -> int:
    out = Output(json_mode=getattr(args, "json", False))
    # Who acts, checked alike for every command that takes them, before anything is opened.
    _identifier("--business", getattr(args, "business", None))
    _identifier("--as", getattr(args, "principal", None))
    for principal in getattr(args, "principals", None) or ():
        _identifier("--as", principal)
    handlers: dict[str, Callable[[argparse.Namespace, Output], int | None]] = {
        "demo": _demo,
        "run": _run_definition,
        "worker": _worker,
        "inspect": _inspect,
        "list": _list,
        "event": _event,
        "decide": _decide,
        "cancel": _cancel,
        "reconcile": _reconcile,
        "migrate": _migrate,
        "check": _check,
        "diagram": _diagram,
        "docs": _docs,
        "export-specs": _export_specs,
        "modelcheck": _modelcheck,
        "check-spec": _check_spec,
        "journal": _journal,
        "op": _op,
        "export": _export,
        "prune": _prune,
        "serve": _serve,
        "conformance": _conformance,
    }
    say, warn, back = _library_notes(args, out)
    with cli_logging.routed(
        say,
        warn,
        lost=_lost_connection_note(args),
        back=back if _is_worker(args) else None,  # `serve` answers each request: no loop of its own tells
        debug=getattr(args, "debug", False),
    ):
        return handlers[args.command](args, out) or EXIT_OK


def _library_notes(
    args: argparse.Namespace, out: Output
) -> tuple[Callable[[str], None], Callable[[str, str], None], Callable[[float, int], None]]:
    """How a library's log record is said, and that the store answers again: a note in the command's format, or a
    line of the worker's JSON log."""
    if getattr(args, "log_json", False):
        log = observe.JsonLog(sys.stderr)
        return (
            lambda message: log.line("warning", "store_connection_lost", detail=message),
            lambda logger, message: log.line("warning", "library_warning", logger=logger, detail=message),
            lambda seconds, failures: log.line(
                "info",
                "store_answers_again",
                seconds=round(seconds, 3),
                failures=failures,
                detail=cli_logging.answers_again(seconds, failures),
            ),
        )
    return (
        out.note,
        lambda logger, message: out.note(f"fencekeeper: warning: {logger}: {message}"),
        lambda seconds, failures: out.note(cli_logging.answers_again(seconds, failures)),
    )


def _lost_connection_note(args: argparse.Namespace) -> str | None:
    """What a command says, once per outage, when its store's connections are lost (cli_logging); None: nothing.

    The workers ride the loss out without a word of their own: this is it,
    and once a request goes through again, ``cli_logging.answers_again``
    (their loops tell the router: ``store_failed``, ``store_answered``).
    `export` says it itself, with what it does about the batch in hand;
    any other command either never meets it or fails with its own one-line
    error, which names it.
    """
    if _is_worker(args):
        return f"the store's connection was lost; reconnecting and trying again for up to {RIDE_OUT_SECONDS:g} s"
    if args.command == "serve":
        return "the store's connection was lost; reconnecting"
    return None


def _is_worker(args: argparse.Namespace) -> bool:
    """`worker` or `op worker`: a command whose loops ride a store outage out (StorePatience)."""
    return bool(args.command == "worker" or (args.command == "op" and getattr(args, "op_command", None) == "worker"))


def _journal(args: argparse.Namespace, out: Output) -> int:
    from . import cli_journal  # noqa: PLC0415 - see _GROUPS

    return cli_journal.run(args, out)


def _op(args: argparse.Namespace, out: Output) -> int:
    from . import cli_ops  # noqa: PLC0415 - see _GROUPS

    return cli_ops.run(args, out)


def _export(args: argparse.Namespace, out: Output) -> int:
    from . import cli_outbox  # noqa: PLC0415 - see _GROUPS

    return cli_outbox.run_export(args, out)


def _prune(args: argparse.Namespace, out: Output) -> int:
    from . import cli_outbox  # noqa: PLC0415 - see _GROUPS

    return cli_outbox.run_prune(args, out)


def _serve(args: argparse.Namespace, out: Output) -> int:
    from . import cli_ops, cli_serve  # noqa: PLC0415 - see _GROUPS

    _identifier("--namespace", args.namespace)
    try:
        return cli_serve.run(args, out)
    except (cli_serve.ServeError, cli_ops.RegistryError) as exc:
        raise CliError(str(exc)) from None


@contextlib.contextmanager
def _store(
    args: argparse.Namespace, *, create: bool = False, pool_size: int = 4, read_only: bool = False
) -> Iterator[TransactionalStore]:
    store = connect.open_store(args.db, schema=args.schema, create=create, pool_size=pool_size, read_only=read_only)
    try:
        yield store
    finally:
        store.close()


def _refused(outcome: p.Refusal | p.Unchanged, what: str) -> CliError:
    code = EXIT_USAGE if outcome.code == p.RefusalCode.INVALID_REQUEST else EXIT_PROBLEM
    return CliError(f"{what} refused [{outcome.code.value}]: {outcome.message}", code)


def _json_object(option: str, value: str | None) -> dict[str, Any]:
    """The JSON object an option gives: inline, ``@FILE`` (read from the file) or ``-`` (read from stdin)."""
    if value is None:
        return {}
    parsed, where = json_option(option, value)
    if not isinstance(parsed, dict):
        raise CliError(f"{where}: must be a JSON object, not {type(parsed).__name__}")
    return parsed


def json_option(option: str, value: str) -> tuple[Any, str]:
    """The JSON value an option gives, and where it was read (``--input: FILE``) for the caller's own messages.

    Inline JSON, ``@FILE`` (read from the file) or ``-`` (read from stdin);
    every JSON option of every command reads through this, so each takes the
    same forms and fails the same way (one ``CliError`` naming the option
    and the file).
    """
    where = option
    if value == "-":
        where, value = f"{option}: stdin", _read_stdin(option)
    elif value.startswith("@"):
        if value == "@":
            # Path("") is the current directory: the read would fail as "is a directory", naming no file given.
            raise CliError(f"{option}: '@' names no file; write @FILE")
        path = Path(value[1:])
        where, value = f"{option}: {shown_text(path)}", _read(path, option=option)
    try:
        return strict_json.loads(value), where
    except json.JSONDecodeError as exc:
        raise CliError(f"{where}: not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except strict_json.StrictJsonError as exc:
        raise CliError(f"{where}: not valid JSON: {exc}") from None


def _read_stdin(option: str) -> str:
    try:
        return sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{option}: stdin: not UTF-8 text") from None
    except (OSError, AttributeError, ValueError) as exc:
        raise CliError(f"{option}: stdin: cannot read: {exc}") from None


def _one_stdin(**options: str | None) -> None:
    """Standard input can be read once: refuse two options that both ask for it."""
    reading = [name for name, value in options.items() if value == "-"]
    if len(reading) > 1:
        raise CliError(f"{' and '.join(reading)} both read stdin ('-'); give one of them @FILE or inline JSON")


def _identifier(option: str, value: str | None) -> None:
    if value is not None and not IDENTIFIER.fullmatch(value):
        raise CliError(
            f"{option}: malformed identifier {shown(value)} (1-128 of A-Z a-z 0-9 . _ : @ / -, not starting with a symbol)"
        )


def _reason(option: str, value: str) -> None:
    """A reason a person gives (a decision's, a recovery's): storable text of at most MAX_RATIONALE characters.

    The kernel refuses the same, but only once the store is open and, for a
    decision, after the request has been shown; checked here, it is the
    option's one error line.
    """
    problem = text_problem(value)
    if problem is None and len(value) > MAX_RATIONALE:
        problem = f"must be at most {MAX_RATIONALE} characters, got {len(value)}"
    if problem is not None:
        raise CliError(f"{option}: {problem}")


def _where(args: argparse.Namespace) -> str:
    """The store --db names, for a message: a DSN without its password (``Location.describe``)."""
    return connect.parse_url(args.db, schema=args.schema).describe()


def _read_view(store: TransactionalStore, execution_id: str, db: str, *, business: str | None = None) -> ExecutionView:
    """The execution an EXECUTION_ID names; with ``business``, only one of that business.

    An execution of another business does not exist for the caller (seed 000,
    Business isolation): it is the same bad input as an id that names nothing.
    """
    _identifier("EXECUTION_ID", execution_id)
    view = store.read(execution_id)
    if view is None or (business is not None and view.execution.business_id != business):
        where = f"business {business!r} of {db}" if view is not None else db
        raise CliError(f"EXECUTION_ID: no execution {execution_id!r} in {where}")
    return view


def _handler_factory(spec: str | None, db: str) -> Callable[[], CommandHandler]:
    """``module:factory``; the current directory is on the import path, as with ``python -m``.

    The default is the example handler over the effect log kept for ``db``,
    so that a worker and a later ``reconcile`` see the same effects.
    """
    if spec is None:
        return lambda: examples.handler(examples.effect_log_for(db))
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CliError(f"--handler: {shown(spec)}: write MODULE:FACTORY, e.g. mycompany.handlers:make_handler")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"--handler: cannot import {shown(module_name)}: {shown_text(exc)}") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise CliError(f"--handler: {shown(module_name)} has no callable {shown(attribute)}")

    def make() -> CommandHandler:
        handler = factory()
        if not callable(getattr(handler, "execute", None)) or not callable(getattr(handler, "reconcile", None)):
            raise CliError(
                f"--handler: {shown_text(spec)} returned {type(handler).__name__}, which has no execute and reconcile"
            )
        for name in ("execute", "reconcile"):
            # An async def answers a coroutine, which a worker takes for a handler that says nothing:
            # every Command's outcome would be unknown and every execution would go to reconciliation.
            if inspect.iscoroutinefunction(getattr(handler, name)):
                raise CliError(
                    f"--handler: {shown_text(spec)} returned {type(handler).__name__}, whose {name} is a coroutine function "
                    "(async def); a CommandHandler is synchronous code, which workers call in threads"
                )
        return handler  # type: ignore[no-any-return]

    return make


# --- demo -----------------------------------------------------------------------------------


def _demo(args: argparse.Namespace, out: Output) -> int:
    from . import demo  # noqa: PLC0415 - the demo's scenario loads only when it is played

    return demo.run(out, db=args.db, schema=args.schema)


# --- run ------------------------------------------------------------------------------------


def _load_definition(path: Path) -> Definition:
    """A definition file: JSON when its name ends in .json or its first non-blank character is '{', else TOML."""
    content = _read(path)
    try:
        if path.suffix.lower() == ".json" or content.lstrip().startswith("{"):
            return from_json(content, source=str(path))
        return parse_definition(content, str(path))
    except DefinitionError as exc:
        raise CliError(str(exc)) from None


def _run_definition(args: argparse.Namespace, out: Output) -> int:
    from . import service  # noqa: PLC0415 - see the module's imports

    definition = _load_definition(args.definition)
    inputs = _json_object("--input", args.input)
    _identifier("--id", args.id)
    _identifier("--business", args.business)
    _identifier("--as", args.principal)
    try:
        # The admission record is pure: checking it first means bad input writes nothing.
        i.input_evidence(args.id or "x-check", definition, args.principal, inputs)
    except i.InputError as exc:
        raise CliError(f"--input: {exc}") from None
    policy = examples.grants(args.business, args.principal)
    with _store(args, create=True) as store:
        if args.id is not None and store.read(args.id) is not None:
            raise CliError(f"--id: execution {args.id!r} already exists", EXIT_PROBLEM)
        try:
            registered = service.register(store, definition, args.business, args.principal, policy)
        except DefinitionError as exc:
            raise CliError(f"{args.definition}: {exc}", EXIT_PROBLEM) from None
        outcome = service.run(
            store,
            policy,
            business_id=args.business,
            principal_id=args.principal,
            definition_id=definition.definition_id,
            input=inputs,
            revision=definition.revision,
            execution_id=args.id,
        )
    if not isinstance(outcome, p.Decision) or outcome.execution is None:
        raise _refused(outcome, "admission")  # type: ignore[arg-type]
    execution = outcome.execution
    if out.json_mode:
        out.data(
            {
                "execution_id": execution.execution_id,
                "business_id": execution.business_id,
                "definition_id": execution.definition_id,
                "definition_revision": execution.definition_revision,
                "definition_registered": registered,
                "state": execution.state,
                "current_node_id": execution.current_node_id,
            }
        )
        return EXIT_OK
    out.line(execution.execution_id)
    out.note(
        f"{definition.definition_id} revision {definition.revision} ",
        "registered" if registered else "already registered",
        f"; {execution.execution_id} admitted: ",
        state(execution.state),
        f" at {execution.current_node_id}",
    )
    return EXIT_OK


# --- worker ---------------------------------------------------------------------------------


@attrs.define
class _Tally:
    """What every worker thread did so far, summed under a lock."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    claimed: int = 0
    steps: int = 0
    timers_fired: int = 0
    finished: Counter[str] = attrs.field(factory=Counter)
    refused: list[dict[str, str]] = attrs.field(factory=list)
    released: list[str] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    in_flight: dict[str, str] = attrs.field(factory=dict)
    malformed: dict[str, dict[str, str]] = attrs.field(factory=dict)
    """Executions passed over because their row is malformed, each once (as its first worker met it)."""

    def add(self, report: PassReport) -> None:
        with self.lock:
            self.claimed += len(report.claimed)
            self.steps += report.steps
            self.timers_fired += report.timers_fired
            # Summed key by key: Counter.update first asks whether its argument is a Mapping (an ABC
            # check) on every pass, and a pass finishes at most a few executions.
            for name, count in report.finished.items():
                self.finished[name] += count
            if report.refused:
                self.refused.extend(
                    {"execution_id": r.execution_id, "code": r.code, "message": r.message} for r in report.refused
                )
            for r in report.malformed:
                self.malformed.setdefault(
                    r.execution_id, {"execution_id": r.execution_id, "code": r.code, "message": r.message}
                )

    def line(self) -> Text:
        with self.lock:
            parts: list[str | Text | tuple[str, str]] = [
                f"claimed {self.claimed}  steps {self.steps}  timers {self.timers_fired}  "
            ]
            for name, count in sorted(self.finished.items()):
                parts += [state(name), f" {count}  "]
            parts.append((f"refused {len(self.refused)}", render.REFUSED_STYLE if self.refused else ""))
            if self.in_flight:
                parts.append("  running: " + ", ".join(f"{x} ({w})" for x, w in sorted(self.in_flight.items())))
        return text(*parts)


class _Stop:
    """Set by SIGINT/SIGTERM; wakes idle workers at once."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.work = threading.Condition()

    def set(self) -> None:
        self.event.set()
        self.poke()

    def poke(self) -> None:
        with self.work:
            self.work.notify_all()

    def idle(self, seconds: float) -> None:
        with self.work:
            if not self.event.is_set():
                self.work.wait(timeout=seconds)


def _worker_settings(args: argparse.Namespace) -> tuple[int, timedelta]:
    """--concurrency and --lease, within the worker's bounds; CliError naming the flag otherwise."""
    try:
        concurrency = int(args.concurrency)
    except ValueError:
        raise CliError(f"--concurrency: not a whole number: {shown(args.concurrency)}") from None
    try:
        seconds = float(args.lease)
    except ValueError:
        raise CliError(f"--lease: not a number of seconds: {shown(args.lease)}") from None
    if not math.isfinite(seconds):
        raise CliError(f"--lease: must be a finite number of seconds, got {shown(args.lease)}")
    if seconds >= MAX_LEASE.total_seconds():
        raise CliError(f"--lease: must be under a year, got {shown_text(args.lease, SHOWN_LENGTH)}")
    try:
        check_concurrency(concurrency)
        lease = check_lease(timedelta(seconds=seconds))
    except WorkerSettingError as exc:
        raise CliError(f"--{exc.field}: {exc.message}") from None
    return concurrency, lease


def _worker(args: argparse.Namespace, out: Output) -> int:
    args.concurrency, lease = _worker_settings(args)
    processes = _processes(args.processes)
    principals = args.principals or [DEFAULT_PRINCIPAL]
    for principal in principals:
        _identifier("--as", principal)
    _identifier("--business", args.business)
    prefix = args.worker_prefix or _default_worker_prefix()
    if args.worker_prefix is not None:
        _identifier("--id", args.worker_prefix)
    elif not IDENTIFIER.fullmatch(prefix):
        raise CliError(f"--id: the default worker id {prefix!r} (host name and process id) is not an identifier; give --id")
    # The ids the workers take (the prefix, a dash and a number) must fit too: a prefix at the length limit does not.
    suffixed = f"{prefix}-{processes * args.concurrency}"
    if not IDENTIFIER.fullmatch(suffixed):
        raise CliError(f"--id: {prefix!r} is too long to name workers: {suffixed!r} must be at most 128 characters")
    make_handler = _handler_factory(args.handler, args.db)
    policy = examples.grants(args.business, *principals)
    try:
        metrics_at = None if args.metrics_port is None else observe.parse_address(args.metrics_port)
    except ValueError as exc:
        raise CliError(f"--metrics-port: {exc}") from None
    if processes > 1 and metrics_at is not None:
        raise CliError(
            "--metrics-port: serves the workers of one process; with --processes, start one worker command per port"
        )

    def serve(first: int, lifeline: prefork.Lifeline | None) -> dict[str, Any]:
        return _work(
            args, out, policy, make_handler, lease=lease, prefix=prefix, first=first, metrics_at=metrics_at,
            lifeline=lifeline,
        )

    summary = serve(1, None) if processes == 1 else _worker_processes(args, out, processes, serve)
    if out.json_mode:
        out.data(summary)
    else:
        rows = [
            ("workers", ", ".join(summary["workers"])),
            ("stopped by", summary["stopped_by"]),
            ("claimed", str(summary["claimed"])),
            ("steps", str(summary["steps"])),
            ("timers fired", str(summary["timers_fired"])),
            *[(f"finished {name}", str(count)) for name, count in summary["finished"].items()],
            ("refused", str(len(summary["refused"]))),
            *[("  " + r["execution_id"], f"{r['code']}: {r['message']}") for r in summary["refused"]],
            *[("released", x) for x in summary["released"]],
            *([("malformed", str(len(summary["malformed"])))] if summary["malformed"] else []),
            *[("  " + r["execution_id"], f"{r['code']}: {r['message']}") for r in summary["malformed"]],
        ]
        out.table(("worker", "summary"), rows)
    if summary["errors"]:
        raise CliError("; ".join(summary["errors"]), EXIT_PROBLEM)
    if summary["malformed"] and args.until_idle:
        # The queue is drained except for rows no worker can claim: an exit 0 would tell a script or an
        # operator that it is done.  Without --until-idle the workers keep running, passing over the rows.
        damaged = [r["execution_id"] for r in summary["malformed"]]
        raise CliError(
            f"passed over {len(damaged)} execution(s) whose stored row is damaged: {', '.join(damaged)}; "
            "`fencekeeper inspect ID` shows each; repair the row (docs/operating.md, \"A damaged execution row\") "
            "[malformed_row]",
            EXIT_PROBLEM,
        )
    return EXIT_OK


def _default_worker_prefix() -> str:
    """The worker ids' prefix without --id: the host's name and the process id."""
    # Imported for this default alone: a worker given --id starts without socket (about 3 ms of imports,
    # which psycopg pays anyway for PostgreSQL).
    import socket  # noqa: PLC0415

    return f"{socket.gethostname().split('.')[0]}-{os.getpid()}"


def _processes(text: str) -> int:
    """--processes, a whole number within :func:`prefork.check_processes`'s bounds; CliError naming the flag."""
    try:
        return prefork.check_processes(int(text))
    except ValueError as exc:
        message = str(exc) if isinstance(exc, prefork.ProcessesError) else f"not a whole number: {shown(text)}"
        raise CliError(f"--processes: {message}") from None


def _worker_processes(
    args: argparse.Namespace,
    out: Output,
    processes: int,
    serve: Callable[[int, prefork.Lifeline | None], dict[str, Any]],
) -> dict[str, Any]:
    """``serve`` in ``processes`` forked processes (adapters/prefork.py); their summaries summed into one."""
    # The deployment check once, here, before the fork: a --db that does not answer is one error, not N, and
    # every child inherits the store's modules already imported.  Nothing of this store crosses the fork.
    with _store(args, pool_size=1):
        pass

    def describe(exc: BaseException) -> tuple[str, int]:
        if isinstance(exc, _one_line_errors()):
            return render.printable(_message(exc)), _exit_code(exc)
        if isinstance(exc, KeyboardInterrupt):  # a Ctrl-C that came before the process's own handlers
            return "interrupted", 130
        if args.debug:
            import traceback  # noqa: PLC0415 - only for --debug, which shows the child's traceback

            traceback.print_exception(exc)
        return f"internal error: {type(exc).__name__}: {render.printable(' '.join(str(exc).split()))}", EXIT_PROBLEM

    def note(message: str) -> None:
        if args.log_json:
            observe.JsonLog(sys.stderr).line("info", "note", detail=message)
        else:
            out.note(message)

    try:
        ends, received = prefork.run(
            processes,
            lambda number, lifeline: serve((number - 1) * args.concurrency + 1, lifeline),
            describe=describe,
            failed=lambda result: bool(result and result.get("errors")),
            note=note,
        )
    except prefork.ProcessesError as exc:
        raise CliError(f"--processes: {exc}", EXIT_PROBLEM) from None
    common = prefork.common_error(ends)
    if common is not None:
        raise CliError(*common)
    summary: dict[str, Any] = {
        "workers": [],
        "stopped_by": received or ("idle" if args.until_idle else "signal"),
        "claimed": 0,
        "steps": 0,
        "timers_fired": 0,
        "finished": Counter(),
        "refused": [],
        "released": [],
        "errors": [],
        "malformed": [],
    }
    malformed: dict[str, dict[str, str]] = {}
    for end in ends:
        result = end.result
        if result is None:
            summary["errors"].append(end.problem())
            continue
        for key in ("claimed", "steps", "timers_fired"):
            summary[key] += result[key]
        summary["finished"].update(result["finished"])
        for key in ("workers", "refused", "released", "errors"):
            summary[key].extend(result[key])
        for row in result["malformed"]:
            malformed.setdefault(row["execution_id"], row)  # every process meets the row: named once
    summary["finished"] = dict(sorted(summary["finished"].items()))
    summary["malformed"] = list(malformed.values())
    return summary


def _work(
    args: argparse.Namespace,
    out: Output,
    policy: AuthorityPolicy,
    make_handler: Callable[[], CommandHandler],
    *,
    lease: timedelta,
    prefix: str,
    first: int,
    metrics_at: tuple[str, int] | None,
    lifeline: prefork.Lifeline | None,
) -> dict[str, Any]:
    """One process's workers, numbered from ``first``, until they stop; the summary of what they did."""
    handlers = [make_handler() for _ in range(args.concurrency)]
    tally = _Tally()
    stop = _Stop()
    stopped_by = ["idle" if args.until_idle else "signal"]
    # A JSON log owns stderr: no live line and no text notes there beside it.
    log = observe.JsonLog(sys.stderr) if args.log_json else None
    # A span per node visit whenever OpenTelemetry is installed; the deployment's SDK exports them.
    record = observe.fan_out(log, observe.visit_spans())
    # One live line per terminal: a forked worker process leaves it to nobody rather than draw over its siblings.
    live_console = out.err if out.err_terminal and log is None and lifeline is None else None

    with _store(args, pool_size=args.concurrency + 1) as store, contextlib.ExitStack() as cleanup:
        metrics: observe.WorkerMetrics | None = None
        if metrics_at is not None:
            try:
                metrics = observe.WorkerMetrics(store)
                host, port = metrics.serve(*metrics_at)
            except observe.MetricsUnavailable as exc:
                raise CliError(f"--metrics-port: {exc}") from None
            except OSError as exc:
                raise CliError(f"--metrics-port: cannot listen on {args.metrics_port}: {exc.strerror}") from None
            cleanup.callback(metrics.close)
            if log is not None:
                log.line("info", "metrics_listening", url=f"http://{host}:{port}/metrics")
            else:
                out.note(f"metrics at http://{host}:{port}/metrics")

        def note(*parts: str | Text | tuple[str, str]) -> None:
            if log is not None:
                log.line("info", "note", detail=text(*parts).plain)
            else:
                out.note(*parts)

        def say(*parts: str | Text | tuple[str, str]) -> None:
            if log is not None or args.verbose or live_console is not None:
                note(*parts)

        def make_worker(number: int, handler: CommandHandler) -> Worker:
            worker_id = f"{prefix}-{number}"
            made: list[Worker] = []

            def make_token() -> str:
                return secrets.token_hex(16)

            def on_event(execution_id: str, what: str, detail: str) -> None:
                first = False
                with tally.lock:
                    if what in ("claimed", "resumed"):
                        tally.in_flight[execution_id] = worker_id
                    elif what not in ("step", "command", "renewed"):
                        tally.in_flight.pop(execution_id, None)
                    if what == "malformed" and execution_id not in told:
                        told.add(execution_id)
                        first = True
                if first and log is None:
                    # Said whatever the verbosity, once per process (each worker meets the row): what to do.
                    # The JSON log has it from each worker's record, as a warning.
                    out.note(f"{worker_id}: execution {execution_id}: malformed_row: {detail}")
                if args.verbose and log is None:
                    style = render.REFUSED_STYLE if what == "refused" else render.STATE_STYLES.get(what, "")
                    out.note(f"{worker_id}  {execution_id}  ", (what, style), f"  {detail}")
                if made[0].hands_back_after(execution_id, what):
                    # The clean shutdown: the visit that just committed was the last; the lease is
                    # handed back so that another worker continues at once instead of after expiry.
                    _release(
                        store,
                        worker_id=worker_id,
                        lease_token=made[0].lease_token_of(execution_id),
                        execution_id=execution_id,
                        tally=tally,
                        say=say,
                        record=record if log is not None else None,
                    )

            made.append(
                Worker(
                    store,
                    worker_id,
                    policy,
                    handler,
                    lease=lease,
                    business_id=args.business,
                    make_token=make_token,
                    on_event=on_event,
                    on_record=record,
                    stopping=stop.event.is_set,
                )
            )
            return made[0]

        told: set[str] = set()
        workers = [make_worker(n, handler) for n, handler in enumerate(handlers, start=first)]

        def loop(worker: Worker) -> None:
            try:
                claims(worker)
            finally:
                # A claim read ahead for a pass that will not come (continues): rolled back, its row let go.
                worker.drop_read_ahead()

        def claims(worker: Worker) -> None:
            patience = StorePatience()
            while not stop.event.is_set():
                try:
                    report = worker.run_pass(max_claims=1, continues=True)
                except StoreError as exc:
                    # A lost connection, or a row or file another transaction holds: the
                    # pool replaces the one, the holder lets go of the other; try again shortly.
                    wait = patience.failed(exc.code)
                    if wait is None:
                        with tally.lock:
                            tally.errors.append(f"{worker.worker_id}: {exc.message} [{exc.code}]")
                        stop.set()
                        return
                    cli_logging.store_failed()
                    stop.idle(wait)
                    continue
                except Exception as exc:
                    with tally.lock:
                        tally.errors.append(f"{worker.worker_id}: {type(exc).__name__}: {' '.join(str(exc).split())}")
                    stop.set()
                    if args.debug:
                        raise
                    return
                # The outage's other note, once per process whichever thread gets through first (cli_logging).
                cli_logging.store_answered(patience.failures)
                patience.succeeded()
                tally.add(report)
                if metrics is not None:
                    metrics.record(report)
                if report.claimed or report.timers_fired:
                    continue
                if args.until_idle:
                    return
                stop.idle(args.poll)
            if worker.holds_unfinished():
                # Stopped while a visit's answer was lost: finished under its lease and handed back if the
                # store answers within a few seconds, rather than left to expire into review.
                try:
                    taken = worker.take_up_before_stop()
                except Exception as exc:
                    with tally.lock:
                        tally.errors.append(f"{worker.worker_id}: {type(exc).__name__}: {' '.join(str(exc).split())}")
                    return
                if taken is not None:
                    tally.add(taken)

        wait_for_work = getattr(store, "wait_for_work", None)

        def listen() -> None:
            # PostgreSQL: NOTIFY wakes idle workers when work is committed, not on their next poll.
            while not stop.event.is_set():
                try:
                    if wait_for_work is not None and wait_for_work(args.poll):
                        stop.poke()
                except Exception:
                    stop.idle(args.poll)

        threads = [threading.Thread(target=loop, args=(w,), name=w.worker_id, daemon=True) for w in workers]
        if wait_for_work is not None and not args.until_idle:
            threads.append(threading.Thread(target=listen, name="listen", daemon=True))

        signals = 0

        def on_signal(number: int, frame: FrameType | None) -> None:
            nonlocal signals
            signals += 1
            stopped_by[0] = signal.Signals(number).name
            if signals > 1:
                # A second signal: leave now; leases still held simply expire and quarantine finds them.
                os._exit(130)
            note("stopping after the current visit; send the signal again to quit at once")
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        if lifeline is not None:

            def relayed(reason: str) -> None:
                # Idempotent, unlike a signal: the parent relays what may have reached this process already.
                if not stop.event.is_set():
                    stopped_by[0] = reason
                    stop.set()

            lifeline.heed(relayed)
        try:
            _watch(threads, tally, live_console)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            stop.set()
    return {
        "workers": [w.worker_id for w in workers],
        "stopped_by": stopped_by[0],
        "claimed": tally.claimed,
        "steps": tally.steps,
        "timers_fired": tally.timers_fired,
        "finished": dict(sorted(tally.finished.items())),
        "refused": tally.refused,
        "released": tally.released,
        "errors": tally.errors,
        "malformed": list(tally.malformed.values()),
    }


def _watch(threads: list[threading.Thread], tally: _Tally, console: Any) -> None:
    for thread in threads:
        thread.start()
    workers = [t for t in threads if t.name != "listen"]
    if console is None:
        while any(t.is_alive() for t in workers):
            for t in workers:
                t.join(0.2)
        return
    # Imported here: a worker that reports in JSON, as the ones a
    # deployment runs do, starts without the live display's modules.
    from rich.live import Live  # noqa: PLC0415

    with Live(tally.line(), console=console, refresh_per_second=4, transient=False) as live:
        while any(t.is_alive() for t in workers):
            time.sleep(0.25)
            live.update(tally.line())
        live.update(tally.line())


def _release(
    store: TransactionalStore,
    *,
    worker_id: str,
    lease_token: str | None,
    execution_id: str,
    tally: _Tally,
    say: Callable[..., None],
    record: Callable[[WorkerEvent], None] | None = None,
) -> None:
    """Hand back a stopping worker's lease; said as a ``released`` event in the JSON log (``record``), else a note."""
    view = store.read(execution_id)
    if view is None or lease_token is None or view.execution.state is not ExecutionState.RUNNING:
        # Nothing to hand back: the visits composed into the same transaction finished it.
        return
    credential = p.LeaseCredential(worker_id, lease_token, view.execution.fence)
    outcome = store.release(execution_id, p.ReleaseRequest(credential, view.execution.revision))
    if isinstance(outcome, p.Decision):
        with tally.lock:
            tally.released.append(execution_id)
            tally.in_flight.pop(execution_id, None)
        detail = "running -> eligible, for another worker to continue"
        if record is not None:
            # The event a Worker says for every lease it hands back (Python code's too): one key to alert on.
            record(WorkerEvent(worker_id, execution_id, "released", detail, credential.fence))
        else:
            say(f"{worker_id}  {execution_id}  released: {detail}")
    else:
        say(f"{worker_id}  {execution_id}  release refused [{outcome.code.value}]: {outcome.message}")


# --- inspect and list -----------------------------------------------------------------------


def _inspect(args: argparse.Namespace, out: Output) -> int:
    with _store(args, read_only=True) as store:
        view = _read_view(store, args.execution_id, _where(args))
        expired = args.execution_id in store.expired()
    # Rows that read but that no decision is made on (two step counts that disagree): a worker passes over
    # the execution and its log sends the operator here, so this is where the reason must show.
    damaged = p.snapshot_problem(view.execution, view.dispatch)
    if args.format == "mermaid":
        from . import sequence  # noqa: PLC0415 - see the module's imports

        diagram = sequence.sequence_diagram(view)
        if out.json_mode:
            out.data({"execution_id": args.execution_id, "mermaid": diagram})
        else:
            out.out.file.write(diagram)
        return EXIT_OK
    if out.json_mode:
        out.data(
            {
                "execution": view.execution,
                "dispatch": view.dispatch,
                "lease_expired": expired,
                "damaged": damaged,
                "revisions": view.revisions,
                "history": view.history,
                "registrations": view.registrations,
                "recoveries": view.recoveries,
                "evidence": view.evidence_revisions or view.evidence,
            }
        )
        return EXIT_OK
    x = view.execution
    out.line(
        ("execution ", "bold"),
        (x.execution_id, "bold"),
        f"  business {x.business_id}  definition {x.definition_id} revision {x.definition_revision}",
    )
    out.line(
        "state ",
        state(x.state),
        f"  revision {x.revision}  node {x.current_node_id or '-'}  steps {x.step_count}  fence {x.fence}",
    )
    if damaged is not None:
        out.line(
            ("damaged", render.REFUSED_STYLE),
            f" [malformed_row] {damaged} (no decision is made on these rows, and workers pass over the execution, "
            "until they are repaired)",
        )
    out.line("")
    rows = [(r.time, r.revision, r.who, r.token, r.fence, r.what, r.detail) for r in render.timeline(view)]
    out.table(render.TIMELINE_COLUMNS, rows)
    out.line("")
    out.table(("dispatch", ""), render.dispatch_rows(view, expired=expired))
    return EXIT_OK


def _list(args: argparse.Namespace, out: Output) -> int:
    chosen = ExecutionState(args.state) if args.state else None
    with _store(args, read_only=True) as store:
        views = [v for v in (store.read(x) for x in store.execution_ids(chosen)) if v is not None]
    if args.business is not None:
        views = [v for v in views if v.execution.business_id == args.business]
    items: list[dict[str, Any]] = [
        {
            "execution_id": v.execution.execution_id,
            "business_id": v.execution.business_id,
            "definition_id": v.execution.definition_id,
            "definition_revision": v.execution.definition_revision,
            "state": v.execution.state.value,
            "current_node_id": v.execution.current_node_id,
            "revision": v.execution.revision,
            "step_count": v.execution.step_count,
            "fence": v.execution.fence,
            "last_error_code": v.dispatch.last_error_code,
            "updated_at": v.history[-1].at if v.history else None,
        }
        for v in views
    ]
    if out.json_mode:
        out.data(items)
        return EXIT_OK
    if not items:
        out.note("no executions" + (f" in state {args.state}" if args.state else ""))
        return EXIT_OK
    out.table(
        ("execution", "business", "definition", "state", "node", "steps", "fence", "last error", "updated (UTC)"),
        [
            (
                item["execution_id"],
                item["business_id"],
                f"{item['definition_id']}@{item['definition_revision']}",
                state(item["state"]),
                item["current_node_id"] or "-",
                str(item["step_count"]),
                str(item["fence"]),
                item["last_error_code"] or "-",
                render.when(item["updated_at"]),
            )
            for item in items
        ],
    )
    return EXIT_OK


# --- event, decide, cancel, reconcile -------------------------------------------------------


def _event(args: argparse.Namespace, out: Output) -> int:
    from . import service  # noqa: PLC0415 - see the module's imports

    _one_stdin(**{"--correlation": args.correlation, "--payload": args.payload})
    correlation = _json_object("--correlation", args.correlation)
    payload = _json_object("--payload", args.payload) if args.payload is not None else None
    _identifier("--as", args.principal)
    try:
        # An empty --id is malformed, not absent: it must not fall back to a fresh id.
        Event.build("ev-check" if args.id is None else args.id, args.business, args.event_type, correlation, payload)
    except EventError as exc:
        field = re.split(r"[.\[ ]", str(exc).split(":", 1)[0], maxsplit=1)[0]
        option = {"correlation": "--correlation", "payload": "--payload", "event_type": "TYPE", "event_id": "--id"}
        raise CliError(f"{option.get(field, '--' + field)}: {exc}") from None
    policy = examples.grants(args.business, args.principal)
    with _store(args) as store:
        result = service.publish(
            store,
            policy,
            business_id=args.business,
            principal_id=args.principal,
            event_type=args.event_type,
            correlation=correlation,
            payload=payload,
            event_id=args.id,
        )
    if out.json_mode:
        out.data({"event_id": result.event_id, "duplicate": result.duplicate, "woken": list(result.woken)})
        return EXIT_OK
    if result.duplicate:
        out.line(f"{result.event_id}: already published (idempotent); nothing changed")
    elif result.woken:
        out.line(f"{result.event_id}: woke {', '.join(result.woken)}")
    else:
        out.line(f"{result.event_id}: published; no waiter matched")
    return EXIT_OK


def _binding(request: approvals.ApprovalRequest) -> str:
    b = request.binding
    targets = ", ".join(f"{t}@{r}" for t, r in b.targets) or "-"
    policies = ", ".join(f"{t}@{r}" for t, r in b.policies) or "-"
    return (
        f"{b.operation} on {targets} under {policies}; reviewers {', '.join(request.reviewers)}"
        f"{' (distinct from the requester)' if request.distinct_reviewer else ''}; requested by {request.requester_id}"
    )


def _decide(args: argparse.Namespace, out: Output) -> int:
    from . import service  # noqa: PLC0415 - see the module's imports

    _identifier("--as", args.principal)
    _identifier("--id", args.id)
    _identifier("--business", args.business)
    _reason("--rationale", args.rationale)
    policy = examples.grants(args.business, args.principal)
    decision_id = args.id or f"d-{secrets.token_hex(6)}"
    with _store(args) as store:
        view = _read_view(store, args.execution_id, _where(args), business=args.business)
        request = service.approval_request(store, view.execution.execution_id)
        if request is None:
            raise CliError(
                f"{args.execution_id} has no approval request (it is {view.execution.state.value})", EXIT_PROBLEM
            )
        outcome = service.decide(
            store,
            policy,
            business_id=args.business,
            reviewer_id=args.principal,
            request=request,
            determination=args.determination,
            decision_id=decision_id,
            rationale=args.rationale,
        )
    result: dict[str, Any] = {
        "request": request.to_json(),
        "decision_id": decision_id,
        "reviewer_id": args.principal,
        "determination": args.determination,
        **render.outcome_json(outcome),
    }
    if isinstance(outcome, p.Decision):
        result["outcome"] = "accepted"
    elif isinstance(outcome, p.Unchanged):
        result["outcome"] = "already_decided"
    elif isinstance(outcome, approvals.Recorded):
        result["outcome"] = "recorded_conflicting"
    if out.json_mode:
        out.data(result)
    else:
        out.line(f"request {request.request_id} (", state(request.state), f"): {_binding(request)}")
        if isinstance(outcome, p.Decision) and outcome.execution is not None:
            out.line(
                ("accepted", "green"),
                f": {decision_id} {args.determination} by {args.principal}; {outcome.execution.execution_id} woken, ",
                state(outcome.execution.state),
                f" at {outcome.execution.current_node_id}",
            )
        elif isinstance(outcome, p.Unchanged):
            out.line(("already decided", "yellow"), f" (idempotent): {outcome.message}; nothing changed")
        elif isinstance(outcome, approvals.Recorded):
            out.line(("recorded as conflicting", "yellow"), f": {outcome.message}")
    if isinstance(outcome, p.Refusal):
        raise _refused(outcome, "decision")
    return EXIT_OK


def _cancel(args: argparse.Namespace, out: Output) -> int:
    from . import service  # noqa: PLC0415 - see the module's imports

    _identifier("--as", args.principal)
    policy = examples.grants(args.business, args.principal)
    with _store(args) as store:
        view = _read_view(store, args.execution_id, _where(args), business=args.business)
        outcome = service.cancel(
            store, policy, business_id=args.business, principal_id=args.principal, execution_id=args.execution_id
        )
    if not isinstance(outcome, p.Decision) or outcome.execution is None:
        raise _refused(outcome, "cancellation")  # type: ignore[arg-type]
    if out.json_mode:
        out.data({"execution_id": args.execution_id, **render.outcome_json(outcome)})
    else:
        out.line(f"{args.execution_id}: ", state(view.execution.state), " -> ", state(outcome.execution.state))
    return EXIT_OK


def _reconcile(args: argparse.Namespace, out: Output) -> int:
    if args.execution_id is None and not args.quarantine:
        raise CliError("give EXECUTION_ID, --quarantine, or both")
    if args.execution_id is None and (args.settle or args.resume_at or args.fail):
        raise CliError("--settle, --resume-at and --fail need an EXECUTION_ID")
    # A reason or a handler given to a command that does not use it would be dropped without a word.
    if args.because is not None and args.resume_at is None and not args.fail:
        raise CliError("--because: only with --resume-at or --fail, the choices that record a reason")
    if args.handler is not None and not args.settle:
        raise CliError("--handler: only with --settle, the choice that asks the handler")
    args.because = args.because or ""
    if args.resume_at is not None and not args.because.strip():
        raise CliError("--because: say why resuming there is safe (it is recorded as the idempotency contract)")
    # Bytes that are not UTF-8 reach argv as lone surrogates: no store can keep them.
    _reason("--because", args.because)
    if args.input is not None and args.resume_at is None:
        raise CliError("--input: only with --resume-at, to correct a suspended execution's input")
    _identifier("--as", args.principal)
    _identifier("--resume-at", args.resume_at)
    corrected = _json_object("--input", args.input) if args.input is not None else None
    make_handler = _handler_factory(args.handler, args.db) if args.settle else None
    policy = examples.grants(args.business, args.principal)
    result: dict[str, Any] = {}
    refused = False
    with _store(args) as store:
        if args.execution_id is not None:
            # Of --business, as decide and cancel look it up: another business's execution is no execution here.
            _read_view(store, args.execution_id, _where(args), business=args.business)
        if args.quarantine:
            refused = _quarantine_sweep(store, policy, args, out, result)
        try:
            if args.execution_id is None:
                pass
            elif args.settle:
                assert make_handler is not None
                _settle(store, policy, make_handler(), args, out=out, result=result)
            elif args.resume_at is not None or args.fail:
                _decide_review(store, policy, args, out=out, result=result, corrected=corrected)
            else:
                _show_review(store, args, out, result)
        except CliError:
            # The sweep has committed what it moved: --json reports it even when the review after it cannot go on,
            # as the plain output already has, line by line.
            if out.json_mode and args.quarantine:
                out.data(result)
            raise
    if out.json_mode:
        out.data(result)
    decided = result.get("reconciled", {})
    if decided.get("outcome") in ("refused", "unchanged") and decided.get("code") != "recovery_replayed":
        # A malformed field (invalid_request) is what was typed: 2, as for every command.
        code = EXIT_USAGE if decided.get("code") == p.RefusalCode.INVALID_REQUEST.value else EXIT_PROBLEM
        raise CliError(f"reconciliation refused [{decided['code']}]: {decided['message']}", code)
    return EXIT_PROBLEM if refused else EXIT_OK


def _quarantine_sweep(
    store: TransactionalStore, policy: AuthorityPolicy, args: argparse.Namespace, out: Output, result: dict[str, Any]
) -> bool:
    """Quarantine every expired execution; True when a row was refused or left locked (exit 1)."""
    from . import service  # noqa: PLC0415 - see the module's imports

    refused = False
    sweep = service.quarantine_expired(store, policy, business_id=args.business, principal_id=args.principal)
    # A lost race (another sweep got there first) and an identical repeat
    # are not problems: only a refusal that is one, or a row left locked,
    # makes the sweep exit 1.
    result["quarantined"] = {x: render.outcome_json(o) for x, o in sweep.outcomes.items()}
    result["moved_on"] = dict(sweep.moved_on)
    result["locked"] = dict(sweep.locked)
    if not (sweep.outcomes or sweep.moved_on or sweep.locked):
        out.line("no expired executions to quarantine")
    for x, o in sweep.outcomes.items():
        if isinstance(o, p.Decision) and o.execution is not None:
            out.line(f"{x}: quarantined, running -> ", state(o.execution.state))
        elif isinstance(o, p.Unchanged):
            out.line(f"{x}: ", ("already quarantined", "yellow"), f" (idempotent): {o.message}")
        elif isinstance(o, p.Refusal):
            refused = True
            out.line(f"{x}: ", ("refused", render.REFUSED_STYLE), f" [{o.code.value}] {o.message}")
    for x, why in sweep.moved_on.items():
        out.line(f"{x}: ", ("skipped", "yellow"), f", another sweep or recovery moved it first: {why}")
    for x, why in sweep.locked.items():
        refused = True
        out.line(f"{x}: ", ("locked", render.REFUSED_STYLE), f", skipped for the next sweep: {why}")
    return refused


def _review(store: TransactionalStore, args: argparse.Namespace) -> service.RecoveryView:
    from . import service  # noqa: PLC0415 - see the module's imports

    try:
        return service.recovery_view(store, business_id=args.business, execution_id=args.execution_id)
    except service.OperationError as exc:
        raise CliError(_as_argument(exc.message), EXIT_PROBLEM if exc.code == "not_in_review" else EXIT_USAGE) from None


def _as_argument(message: str) -> str:
    """A recovery service message names its field ``execution_id``; here that is the argument EXECUTION_ID."""
    field = "execution_id: "
    return f"EXECUTION_ID: {message[len(field):]}" if message.startswith(field) else message


def _show_review(store: TransactionalStore, args: argparse.Namespace, out: Output, result: dict[str, Any]) -> None:
    """What is known, and the explicit choices: nothing is written and no handler is asked."""
    review = _review(store, args)
    execution = review.execution
    result["review"] = {
        "execution_id": execution.execution_id,
        "state": execution.state.value,
        "node": execution.current_node_id,
        "last_error_code": review.last_error_code,
        "unresolved_commands": [c.to_json() for c in review.unresolved],
        "inert_attempts": list(review.inert_attempts),
        "permitted_continuations": list(review.permitted),
        "definition_registered": review.definition_registered,
    }
    x = execution.execution_id
    again = _reconcile_again(args)
    out.line(
        f"{x}: ", state(execution.state), f" at {execution.current_node_id} (revision {execution.revision}, "
        f"last error {review.last_error_code or '-'}, step {execution.step_count})"
    )
    for command in review.unresolved:
        out.line(
            f"  unsettled Command {command.command_id}: {command.operation} issued under fence {command.fence}; "
            "it may have been applied, so it is never resent"
        )
    for attempt in review.inert_attempts:
        out.line(f"  attempt {attempt} issued no Command: a resume settles it as not applied")
    if not review.definition_registered:
        out.line("  its pinned definition revision is not registered: register it before resuming")
    out.line("choose one (each is recorded with who chose it):")
    if review.unresolved:
        out.line(f"  {again} --settle        ask the handler what became of it and record the answer")
    for node in review.permitted:
        out.line(f"  {again} --resume-at {node} --because TEXT")
    out.line(f"  {again} --fail [--because TEXT]")


def _reconcile_again(args: argparse.Namespace) -> str:
    """The reconcile command that reaches this execution again, to be run as printed.

    It names the store (``--db`` is required) and the business outside the
    default one.  ``--handler`` is left to the reader: only ``--settle``
    takes it, and the review itself cannot be given one.
    """
    business = "" if args.business == DEFAULT_BUSINESS else f" --business {args.business}"
    return f"fencekeeper reconcile {connect.db_option(args.db, args.schema)}{business} {args.execution_id}"


def _settle(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    handler: CommandHandler,
    args: argparse.Namespace,
    *,
    out: Output,
    result: dict[str, Any],
) -> None:
    from . import service  # noqa: PLC0415 - see the module's imports

    _review(store, args)
    try:
        reconciled = service.reconcile(
            store, policy, handler, business_id=args.business, principal_id=args.principal,
            execution_id=args.execution_id,
        )
    except service.OperationError as exc:
        raise CliError(_as_argument(exc.message), EXIT_PROBLEM) from None
    outcome = reconciled.outcome
    result["reconciled"] = {
        "execution_id": args.execution_id,
        "command_id": reconciled.command_id,
        "result": reconciled.result,
        **render.outcome_json(outcome),
    }
    if reconciled.command_id is not None and reconciled.result is not None:
        out.line(
            f"{reconciled.command_id}: the handler reports ",
            state(reconciled.result.status.value),
            f" ({reconciled.result.detail})",
        )
    if isinstance(outcome, p.Decision) and outcome.execution is not None:
        out.line(
            f"{args.execution_id}: settled and recorded; it stays ", state(outcome.execution.state),
            f" until a resume or fail is chosen ({_reconcile_again(args)})",
        )


def _decide_review(
    store: TransactionalStore,
    policy: AuthorityPolicy,
    args: argparse.Namespace,
    *,
    out: Output,
    result: dict[str, Any],
    corrected: dict[str, Any] | None,
) -> None:
    from . import service  # noqa: PLC0415 - see the module's imports

    before = _review(store, args).execution
    try:
        if args.fail:
            outcome = service.fail(
                store, policy, business_id=args.business, principal_id=args.principal,
                execution_id=args.execution_id, rationale=args.because,
            )
        else:
            outcome = service.resume(
                store, policy, business_id=args.business, principal_id=args.principal,
                execution_id=args.execution_id, at_node=args.resume_at, rationale=args.because, input=corrected,
            )
    except service.OperationError as exc:
        # A corrected input that does not fit is named by its option, as run names it.
        named = corrected is not None and exc.code == i.InputError.code and exc.message.startswith("input.")
        raise CliError(f"--input: {exc.message}" if named else _as_argument(exc.message), EXIT_USAGE) from None
    result["reconciled"] = {"execution_id": args.execution_id, **render.outcome_json(outcome)}
    if isinstance(outcome, p.Decision) and outcome.execution is not None:
        record = outcome.evidence[-1] if outcome.evidence else None
        out.line(
            f"{args.execution_id}: ",
            record.event.value if record is not None and record.event is not None else "recovered",
            f", {before.state.value} -> ",
            state(outcome.execution.state),
            f" at {outcome.execution.current_node_id}",
        )


# --- migrate and check ----------------------------------------------------------------------


def _migrate(args: argparse.Namespace, out: Output) -> int:
    location, applied = connect.migrate(args.db, schema=args.schema)
    if out.json_mode:
        out.data({"store": location.kind, "location": location.describe(), "applied": applied})
    else:
        out.line(f"{location.describe()}: " + (f"applied migrations {applied}" if applied else "schema is current"))
    return EXIT_OK


def _check(args: argparse.Namespace, out: Output) -> int:
    from . import cli_ops, deployment  # noqa: PLC0415 - the operations service loads only for the commands that use it

    _identifier("--namespace", args.namespace)
    _identifier("--tenant", args.tenant)
    actions = resolvers = None
    if args.actions is not None:
        try:
            _, actions, resolvers = cli_ops.load_registries(args.actions)
        except cli_ops.RegistryError as exc:
            raise CliError(str(exc)) from None
    full = deployment.check_deployment(
        args.db, schema=args.schema, namespace=args.namespace, tenant=args.tenant, actions=actions, resolvers=resolvers
    )
    report = full.base
    if out.json_mode:
        out.data(full.to_json())
    else:
        version = "-" if report.schema_version is None else str(report.schema_version)
        rows: list[tuple[str, str | Text]] = [
            ("store", f"{report.location.kind} {report.location.describe()}"),
            ("schema version", f"{version} (this fencekeeper: {report.code_version})"),
            *[(f"migration {m.version}", f"{m.name}, applied {m.applied_at}") for m in report.migrations],
            ("definitions", "-" if report.definitions is None else str(report.definitions)),
            (
                "executions",
                text(*[part for name, n in report.executions.items() for part in (state(name), f" {n}  ")])
                if report.executions
                else "none",
            ),
            *[
                (f"action {r.name} v{r.version}", f"{r.count} open; " + _registered(r.registered))
                for r in full.actions
            ],
            *[
                (f"resolver {r.name} v{r.version}", f"{r.count} open; " + _registered(r.registered))
                for r in full.resolvers
            ],
            *[
                (f"definition {r.name} r{r.version}", f"{r.count} open; " + ("in the store" if r.registered else "MISSING"))
                for r in full.definitions
            ],
            (
                "outbox",
                "-" if full.outbox is None
                else f"{full.outbox.rows} rows, pending "
                + ("unknown" if full.outbox.pending is None else f"{full.outbox.pending}, lag {full.outbox.lag_seconds or 0:.0f} s")
                + ("" if full.outbox.parked is None else f", parked {full.outbox.parked}"),
            ),
            (
                "oldest unpruned",
                "none past its window" if full.oldest_unpruned is None
                else f"{full.oldest_unpruned.table} {full.oldest_unpruned.key}, "
                f"{full.oldest_unpruned.overdue_seconds:.0f} s overdue",
            ),
            *([] if report.time_source is None else [("time source", report.time_source)]),
            *[("warning", warning) for warning in full.warnings],
            *[("PROBLEM", text((problem, render.REFUSED_STYLE))) for problem in full.blocking],
        ]
        out.table(("check", f"{args.namespace}/{args.tenant}: " + ("ok" if full.ok else "BLOCKED")), rows)
    if not report.reachable:
        # The same --db makes every other command exit 2: it names no usable store.
        return EXIT_USAGE
    return EXIT_OK if full.ok else EXIT_PROBLEM


def _registered(registered: bool | None) -> str:
    return "not compared (no --actions)" if registered is None else ("registered" if registered else "NOT REGISTERED")


# --- the machines ---------------------------------------------------------------------------


def _diagram(args: argparse.Namespace, out: Output) -> int:
    from .diagrams import render_diagram  # noqa: PLC0415 - transitions and graphviz load only when drawing

    sys.stdout.write(render_diagram(MACHINES[args.machine].spec, args.format))
    return EXIT_OK


def _docs(args: argparse.Namespace, out: Output) -> int:
    from .diagrams import machines_markdown  # noqa: PLC0415 - as in _diagram

    sys.stdout.write(machines_markdown())
    return EXIT_OK


def _conformance(args: argparse.Namespace, out: Output) -> int:
    from . import cli_conformance  # noqa: PLC0415 - imported only when the command runs

    return cli_conformance.run(args, out)


def _check_spec(args: argparse.Namespace, out: Output) -> int:
    for path in args.files:
        spec = parse_machine_spec(_read(path), str(path))
        print(f"{path}: ok ({spec.name}: {len(spec.states)} states, {len(spec.transitions)} transitions)")
    return EXIT_OK


def _modelcheck(args: argparse.Namespace, out: Output) -> int:
    from fencekeeper.kernel import modelcheck  # noqa: PLC0415 - the explorer loads only when it runs

    chosen = {
        "workers": args.workers,
        "executions": args.executions,
        "claims_per_execution": args.claims,
        "steps_per_execution": args.steps,
        "max_tick": args.ticks,
        "max_depth": args.depth,
    }
    overrides = {k: v for k, v in chosen.items() if v is not None}
    configs: list[tuple[str, modelcheck.Bounds, bool]]
    if overrides:
        configs = [("custom", attrs.evolve(modelcheck.Bounds(), **overrides), args.compose)]
    else:
        plain = [] if args.compose else [(title, bounds, False) for title, bounds in modelcheck.STANDARD]
        configs = [*plain, *((title, bounds, True) for title, bounds in modelcheck.COMPOSED)]
    for title, bounds, composed in configs:
        started = time.perf_counter()
        refined: str | None = None
        if composed and bounds.max_depth is None:
            # Complete: the composed search checks every invariant, and its worlds are compared with the
            # uncomposed protocol's (INV-COMPOSED-REFINES).
            refinement = modelcheck.check_refinement(bounds)
            result = refinement.composed
            violation = refinement.violation
            if refinement.complete and violation is None:
                refined = f"every world also reachable without composition ({refinement.plain.states:,} states)"
        else:
            result = modelcheck.explore(bounds, modelcheck.Protocol(compose=composed))
            violation = result.violation
            if composed and violation is None:
                refined = "refinement not checked (the search was cut)"
        seconds = time.perf_counter() - started
        scope = "complete" if result.complete else f"to depth {result.depth}"
        print(
            f"{title}: {_bounds_text(bounds)}"
            + (", composed" if composed else "")
            + f": {result.states:,} states explored, {result.transitions:,} decisions, {scope}"
            + (f", {refined}" if refined else "")
            + f", {seconds:.1f}s"
        )
        if violation is not None:
            print(f"VIOLATION {violation.invariant.value}: {violation.message}")
            print("shortest trace:")
            for number, label in enumerate(violation.trace, start=1):
                print(f"  {number:>2}. {label}")
            return EXIT_PROBLEM
        if not result.complete and bounds.max_depth is None:
            print(f"stopped at {bounds.max_states:,} states before the bounds were exhausted")
            return EXIT_PROBLEM
    print("every invariant of specs/protocol.md held in every explored state and write")
    if not overrides and not args.compose:
        from . import cli_ops  # noqa: PLC0415 - see _GROUPS

        return cli_ops.modelcheck_operations()
    return EXIT_OK


def _bounds_text(bounds: Bounds) -> str:
    """Every bound a model-checker search ran under, as ``fencekeeper modelcheck`` prints it.

    The node steps too, which change what is explored with or without
    ``--compose``; the lease length only where it is not the default, which
    no option changes.
    """
    from fencekeeper.kernel import modelcheck  # noqa: PLC0415 - the explorer loads only when it runs

    lease = "" if bounds.lease_ticks == modelcheck.Bounds().lease_ticks else f"leases of {_number(bounds.lease_ticks, 'tick')}, "
    return (
        f"{_number(bounds.workers, 'worker')}, {_number(bounds.executions, 'execution')}, "
        f"{_number(bounds.claims_per_execution, 'claim')} each, ticks 0-{bounds.max_tick}, {lease}"
        f"{_number(bounds.steps_per_execution, 'step')} each"
    )


def _number(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: ``1 worker``, ``3 workers``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _read(path: Path, *, option: str | None = None) -> str:
    prefix = f"{option}: {shown_text(path)}" if option else shown_text(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{prefix}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"{prefix}: not UTF-8 text") from None


def _version() -> str:
    from fencekeeper import __version__  # noqa: PLC0415 - the front door's own module, loaded on demand

    return __version__


def _export_specs(args: argparse.Namespace, out: Output) -> int:
    directory: Path = args.directory
    # The machine tables are written from the kernel, the rest as shipped in the package
    # (fencekeeper/specs); a file that already is the shipped one (`make specs` in the
    # repository, whose editable install links to it) is left alone.
    import importlib.resources  # noqa: PLC0415 - only export-specs reads the shipped files
    from importlib.resources.abc import Traversable  # noqa: PLC0415

    shipped = importlib.resources.files("fencekeeper") / "specs"
    folders: list[Path] = [directory, directory / "machines"]
    # Each destination with what goes there: a shipped file, or a machine table's text.
    files: list[tuple[Path, Traversable | bytes]] = []
    pending = [(shipped, directory)]
    while pending:
        source, target = pending.pop()
        for item in source.iterdir():
            if item.is_dir():
                folders.append(target / item.name)
                pending.append((item, target / item.name))
            elif not (target == directory / "machines" and item.name.endswith(".toml")):
                files.append((target / item.name, item))
    for machine in MACHINES.values():
        files.append((directory / "machines" / f"{machine.name}.toml", render_machine_spec(machine.spec).encode("utf-8")))
    # Every path is checked before anything is written: a conflict is one error naming it, and nothing is written.
    try:
        for folder in folders:
            if folder.exists() and not folder.is_dir():
                raise CliError(f"{shown_text(folder)}: exists and is not a directory")
        for destination, _ in files:
            if destination.is_dir():
                raise CliError(f"{shown_text(destination)}: is a directory, where a spec file goes")
    except OSError as exc:  # a path the system cannot look up (ENAMETOOLONG): what was typed, not a bug
        raise CliError(f"{shown_text(exc.filename or directory)}: cannot be used: {exc.strerror}") from None
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"{shown_text(exc.filename or directory)}: cannot create: {exc.strerror}") from None
    try:
        for destination, content in files:
            if isinstance(content, bytes):
                destination.write_bytes(content)
            elif not (isinstance(content, Path) and destination.exists() and destination.samefile(content)):
                destination.write_bytes(content.read_bytes())
    except OSError as exc:
        raise CliError(f"{shown_text(exc.filename or directory)}: cannot write: {exc.strerror}") from None
    return EXIT_OK

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
