"""``fencekeeper journal ...``: the execution journal on the command line.

Registered from ``adapters/cli.py`` (:func:`register`, :func:`run`) and
following its conventions: data on stdout (one JSON document with
``--json``), one ``fencekeeper: error: ...`` line on stderr, a traceback only
with ``--debug``; exit 0 for success (an idempotent repeat included), 1 when
the journal refuses a command or a verification finds a bad record, 2 for
bad usage or input (a missing or malformed file or value, a refusal of a
malformed field, ``invalid_request``, a ``--db`` that cannot be opened, an
unknown execution).  Rules of this module:

- It translates.  Every refusal it prints is the kernel's, with the
  kernel's code; every verification is ``journal.replay``.
- Input is read and checked before a store is opened: a malformed workflow,
  policy or command file writes nothing.
- Commands carry the head they expect.  ``append`` applies the commands
  of a file in order, each expecting the head the one before it produced,
  the first the ``HEAD`` of ``--expect HEAD``; a command naming its own
  ``expected_head`` keeps it.  ``--head-file FILE`` is the same with the
  head read from FILE, and the head this writer last appended written back
  to it: the operator's own record of the head it has seen.  Nothing here
  ever reads the current head from the store to fill in a command: a writer
  whose head is stale is refused.
- A successor binding whose ``successor`` leaves out ``digest`` names the
  successor execution's header digest as stored in the same database; an
  execution that is not there is an input error.  Whatever the digest, the
  store checks the successor's stored header on every binding (the
  kernel's rule), ``--records`` or not.
- ``append`` appends all of its commands or none: a file is decided command
  by command and written in one transaction, so a refusal of command k
  leaves the journal as it was, and says so.
- Only ``new`` creates a SQLite file, and only once the header it would
  write has been checked; every other command refuses a path that does not
  exist.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fencekeeper.kernel import journal as j
from fencekeeper.kernel import strict_json
from fencekeeper.kernel.canonical import is_digest
from fencekeeper.kernel.common import shown, shown_text
from fencekeeper.kernel.dag import VerifiedWorkflow, verify_workflow, workflow_from_json
from fencekeeper.kernel.journal_codes import JournalCode, JournalError

from . import connect, journal_fixtures, render
from .journal_store import DirectoryResolver, JournalStore, SQLiteJournalStore, replay_chain, replay_stored
from .render import Output, state
from .store import StoreError, SystemClock

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

_USAGE_STORE_CODES = frozenset({"store_unavailable", "not_a_database", "journal_not_found"})


class JournalCliError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- arguments -------------------------------------------------------------------------------


def register(sub: Any, common: argparse.ArgumentParser, data: argparse.ArgumentParser) -> None:
    """Add the ``journal`` command group to the top-level subparsers ``sub``."""
    group = sub.add_parser(
        "journal",
        help="the execution journal: a hash-chained, replayable record of a DAG's node states",
        description="Seed 002's execution journal (docs/journal.md, specs/journal.md).",
        parents=[common],
        allow_abbrev=False,  # as every parser of the command line (cli.py)
    )
    commands = group.add_subparsers(dest="journal_command", required=True, metavar="SUBCOMMAND")

    def command(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, parents=[common, data], allow_abbrev=False, **kwargs)  # type: ignore[no-any-return]

    new = command("new", "create a journal: verify the workflow and policy, write the header")
    new.add_argument("execution_id", metavar="EXECUTION_ID")
    _db(new)
    new.add_argument("--workflow", type=Path, required=True, metavar="WORKFLOW.json")
    new.add_argument("--policy", type=Path, required=True, metavar="POLICY.json")
    new.add_argument("--as", dest="creator", required=True, metavar="HUMAN", help="the creating human (a policy actor)")
    new.add_argument("--supersedes", metavar="EXECUTION_ID", help="the execution this one takes over from")
    new.add_argument("--head-file", type=Path, metavar="FILE", help="write the new head (the header's digest) here")

    append = command(
        "append",
        "append commands (a JSON object, or a file of JSON lines) to a journal",
        description="Each command is a JSON object (specs/journal.md, section 6). A command without expected_head "
        "expects the head the command before it produced, the first command the head --expect or --head-file gives.",
    )
    append.add_argument("execution_id", metavar="EXECUTION_ID")
    _db(append)
    _records(append)
    source = append.add_mutually_exclusive_group(required=True)
    # dest: "command" is the top-level parser's (which command group runs).
    source.add_argument("--command", dest="command_json", metavar="JSON", help="one command")
    source.add_argument("--file", type=Path, metavar="COMMANDS.jsonl", help="commands, one JSON object a line")
    expect = append.add_mutually_exclusive_group()
    expect.add_argument("--expect", metavar="HEAD", help="the head the first command expects")
    expect.add_argument(
        "--head-file",
        type=Path,
        metavar="FILE",
        help="the head the first command expects is in FILE; after the last append, FILE holds the new head",
    )

    show = command("show", "a journal's events and node states")
    show.add_argument("execution_id", metavar="EXECUTION_ID")
    _db(show)
    show.add_argument("--head", action="store_true", help="print only the head digest")

    verify = command(
        "verify",
        "replay a stored journal or an exported file and name the first bad record",
        description="Give EXECUTION_ID and --db, or --file with --workflow and --policy (and --db to check the "
        "successor executions the file binds against that database's headers).",
    )
    verify.add_argument("execution_id", nargs="?", metavar="EXECUTION_ID")
    _db(verify, required=False)
    verify.add_argument("--file", type=Path, metavar="CHAIN.jsonl")
    verify.add_argument("--workflow", type=Path, metavar="WORKFLOW.json")
    verify.add_argument("--policy", type=Path, metavar="POLICY.json")
    _records(verify)
    verify.add_argument(
        "--kept-head",
        metavar="HEAD",
        help="a head kept elsewhere earlier: the chain must contain it (it may have grown since)",
    )

    export = command("export", "write a journal as JSON lines (header first), exactly as stored")
    export.add_argument("execution_id", metavar="EXECUTION_ID")
    _db(export)
    export.add_argument("--out", type=Path, metavar="CHAIN.jsonl", help="write here instead of stdout")
    export.add_argument("--workflow-out", type=Path, metavar="WORKFLOW.json", help="also write the workflow")
    export.add_argument("--policy-out", type=Path, metavar="POLICY.json", help="also write the policy")

    replay = command("replay", "rebuild node states, attempts and head from the stored chain alone")
    replay.add_argument("execution_id", metavar="EXECUTION_ID")
    _db(replay)

    fixtures = command("fixtures", "write the fixture pack (specs/journal/fixtures) into DIRECTORY")
    fixtures.add_argument("directory", type=Path, metavar="DIRECTORY")


def _records(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records",
        type=Path,
        metavar="DIR",
        help="resolve every referenced record as DIR/KIND/ID, whose SHA-256 must be its digest",
    )


def _resolver(args: argparse.Namespace) -> j.Resolver | None:
    if args.records is None:
        return None
    if not args.records.is_dir():
        raise JournalCliError(f"--records {args.records}: not a directory")
    return DirectoryResolver(args.records)


def _db(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--db", required=required, metavar="URL", help="a SQLite file or a postgresql:// DSN (optionally ?schema=NAME)"
    )
    parser.add_argument("--schema", metavar="NAME", help="PostgreSQL schema (default: fencekeeper)")


# --- running -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, out: Output) -> int:
    """Run one ``journal`` subcommand; errors become one line on stderr and an exit code."""
    handlers = {
        "new": _new,
        "append": _append,
        "show": _show,
        "verify": _verify,
        "export": _export,
        "replay": _replay,
        "fixtures": _fixtures,
    }
    try:
        return handlers[args.journal_command](args, out)
    except (JournalCliError, StoreError, JournalError) as exc:
        if getattr(args, "debug", False):
            raise
        # As in cli.py: a path or value the user gave is shown, never obeyed by the terminal.
        print(f"fencekeeper: error: {render.printable(_message(exc))}", file=sys.stderr)
        if isinstance(exc, JournalCliError):
            return exc.exit_code
        if isinstance(exc, StoreError):
            return EXIT_USAGE if exc.code in _USAGE_STORE_CODES else EXIT_PROBLEM
        return EXIT_PROBLEM


def _message(exc: Exception) -> str:
    if isinstance(exc, StoreError):
        return f"{' '.join(str(exc).split())} [{exc.code}]"
    if isinstance(exc, JournalError):
        return f"{exc.message} [{exc.code}]"
    return " ".join(str(exc).split())


@contextmanager
def _store(args: argparse.Namespace, *, create: bool = False) -> Iterator[JournalStore]:
    location = connect.parse_url(args.db, schema=args.schema)
    store: JournalStore
    if location.kind == "sqlite":
        assert location.path is not None
        if not create and not location.path.exists():
            raise JournalCliError(f"--db: no database at {location.path} (`fencekeeper journal new` creates one)")
        store = SQLiteJournalStore(location.path)
    else:
        from .journal_postgres import PostgresJournalStore  # noqa: PLC0415 - psycopg loads only for PostgreSQL

        assert location.dsn is not None and location.schema is not None
        store = PostgresJournalStore(location.dsn, schema=location.schema)
    try:
        yield store
    finally:
        store.close()


def _read_json(path: Path, option: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JournalCliError(f"{option} {shown_text(path)}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise JournalCliError(f"{option} {shown_text(path)}: not UTF-8 text") from None
    return _parse_json(text, f"{option} {path}")


def _parse_json(text: str, where: str) -> Any:
    """The JSON value of a file or option the user gave; one input error (exit 2) naming ``where`` otherwise."""
    try:
        return strict_json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if "\n" in text.rstrip("\n") else f"column {exc.colno}"
        raise JournalCliError(f"{where}: not valid JSON: {exc.msg} ({at})") from None
    except strict_json.StrictJsonError as exc:
        raise JournalCliError(f"{where}: not valid JSON: {exc}") from None


def _input(what: str, action: Any) -> Any:
    """Run a parser of user input; its JournalError is an input error (exit 2), naming ``what``."""
    try:
        return action()
    except JournalError as exc:
        raise JournalCliError(f"{what}: {exc.message} [{exc.code}]") from None


def _authority(workflow_path: Path, policy_path: Path) -> tuple[VerifiedWorkflow, j.VerifiedPolicy]:
    workflow_json = _read_json(workflow_path, "--workflow")
    policy_json = _read_json(policy_path, "--policy")
    workflow = _input(f"--workflow {workflow_path}", lambda: verify_workflow(workflow_from_json(workflow_json)))
    policy = _input(f"--policy {policy_path}", lambda: j.policy_from_json(policy_json))
    # A policy that does not bind this workflow is a refusal of authority, not bad JSON.
    return workflow, j.verify_policy(policy, workflow)


def _where(args: argparse.Namespace) -> str:
    """The store --db names, for a message: a DSN without its password (``Location.describe``)."""
    return connect.parse_url(args.db, schema=args.schema).describe()


def _loaded(store: JournalStore, execution_id: str, db: str) -> j.Journal:
    journal = store.load(execution_id)
    if journal is None:
        raise JournalCliError(f"EXECUTION_ID: no journal {shown(execution_id)} in {db}")
    return journal


def _states_json(journal: j.Journal) -> dict[str, Any]:
    return {
        "execution_id": journal.execution_id,
        "head": journal.head,
        "events": len(journal.events),
        "states": {n: journal.states[n].value for n in journal.workflow.order},
        "attempts": {
            n: [
                {"id": a.attempt_id, "sequence": a.sequence, "status": a.status.value, "error": a.error,
                 "ended_by": a.ended_by}
                for a in history
            ]
            for n, history in journal.attempts.items()
        },
    }  # fmt: skip


def _print_states(journal: j.Journal, out: Output) -> None:
    rows = []
    for node_id in journal.workflow.order:
        history = journal.attempts.get(node_id, ())
        attempts = ", ".join(_attempt_text(a) for a in history) or "-"
        rows.append((node_id, journal.workflow.nodes[node_id].kind.value, state(journal.states[node_id]), attempts))
    out.table(("node", "kind", "state", "attempts"), rows)
    out.line(f"head {journal.head} after {len(journal.events)} events")


def _attempt_text(attempt: j.Attempt) -> str:
    text = f"#{attempt.sequence} {attempt.attempt_id} {attempt.status.value}"
    # An invalidation event names no attempt: say which event cut this one off.
    return text if attempt.ended_by is None else f"{text} by event {attempt.ended_by}"


# --- the subcommands ---------------------------------------------------------------------------


def _new(args: argparse.Namespace, out: Output) -> int:
    workflow, policy = _authority(args.workflow, args.policy)
    # The header is checked before the store is opened, so that a refused
    # `new` creates no database file; it is made again at the store's time.
    try:
        j.create_header(
            args.execution_id,
            workflow,
            policy,
            created_by=args.creator,
            now=SystemClock().now(),
            supersedes=args.supersedes,
        )
    except JournalError as exc:
        # A malformed id is what was typed (exit 2); a refusal of authority stays a refusal.
        if exc.reason is JournalCode.INVALID_REQUEST:
            raise JournalCliError(f"{exc.message} [{exc.code}]") from None
        raise
    if args.head_file is not None:
        _check_writable(args.head_file, "--head-file", args)
        for given, option in ((args.workflow, "--workflow"), (args.policy, "--policy")):
            if args.head_file.resolve() == given.resolve():
                raise JournalCliError(f"--head-file {args.head_file}: is also {option}; it would be overwritten")
    with _store(args, create=True) as store:
        header = j.create_header(
            args.execution_id, workflow, policy, created_by=args.creator, now=store.clock.now(), supersedes=args.supersedes
        )
        journal = j.new_journal(header, workflow, policy)
        store.create(journal)
    if args.head_file is not None:
        _write_head(args.head_file, journal.head)
    if out.json_mode:
        out.data(_states_json(journal))
    else:
        out.line(f"{journal.execution_id}: created; head {journal.head}")
    return EXIT_OK


def _commands(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.command_json is not None:
        return [_object(_parse_json(args.command_json, "--command"), "--command")]
    try:
        text = args.file.read_text(encoding="utf-8")
    except OSError as exc:
        raise JournalCliError(f"--file {args.file}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise JournalCliError(f"--file {args.file}: not UTF-8 text") from None
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"--file {args.file}:{number}"
        found.append(_object(_parse_json(line, where), where))
    if not found:
        raise JournalCliError(f"--file {args.file}: holds no command")
    return found


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise JournalCliError(f"{where}: a command is a JSON object")
    return value


def _resolve_successor(store: JournalStore, value: dict[str, Any], where: str) -> dict[str, Any]:
    successor = value.get("successor")
    if value.get("command") != "bind-successor" or not isinstance(successor, dict) or "digest" in successor:
        return value
    successor_id = successor.get("id")
    try:
        header = store.header(successor_id) if isinstance(successor_id, str) else None
    except JournalError as exc:
        # A stored header that does not decode names no digest: the stored data is bad, not what was typed.
        raise JournalCliError(
            f"{where}: successor {shown(successor_id)}: its stored header cannot be read: {exc.detail} [{exc.code}]",
            EXIT_PROBLEM,
        ) from None
    if header is None:
        raise JournalCliError(f"{where}: successor {shown(successor_id)} is not in this database; give its digest")
    return {**value, "successor": {**successor, "digest": header.digest}}


def _read_head(path: Path) -> str:
    try:
        head = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise JournalCliError(f"--head-file {shown_text(path)}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise JournalCliError(f"--head-file {shown_text(path)}: not UTF-8 text") from None
    if not is_digest(head):
        raise JournalCliError(f"--head-file {shown_text(path)}: holds {head[:80]!r}, not a sha256: digest")
    return head


def _check_writable(path: Path, option: str, args: argparse.Namespace) -> None:
    """Refuse an output that could not be written, before anything (a journal, another output) is."""
    if path.is_dir():
        raise JournalCliError(f"{option} {shown_text(path)}: is a directory")
    if not path.parent.is_dir():
        raise JournalCliError(f"{option} {shown_text(path)}: cannot write: directory {shown_text(path.parent)} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise JournalCliError(f"{option} {shown_text(path)}: cannot write: permission denied")
    if _is_the_database(path, args):
        # A slip of the keyboard would replace the append-only journal with a head or an export of it.
        raise JournalCliError(f"{option} {shown_text(path)}: is the SQLite database --db names; it would be overwritten")


def _is_the_database(path: Path, args: argparse.Namespace) -> bool:
    location = connect.parse_url(args.db, schema=args.schema)
    if location.kind != "sqlite":
        return False
    assert location.path is not None
    # SQLite's own files beside it are the database too.
    database = [Path(f"{location.path}{suffix}") for suffix in ("", "-wal", "-shm", "-journal")]
    if path.exists():
        return any(d.exists() and os.path.samefile(path, d) for d in database)
    return any(path.resolve() == d.resolve() for d in database)


def _write_head(path: Path, head: str) -> None:
    try:
        path.write_text(head + "\n", encoding="utf-8")
    except OSError as exc:
        raise JournalCliError(f"--head-file {shown_text(path)}: cannot write: {exc.strerror}") from None


def _append(args: argparse.Namespace, out: Output) -> int:
    raw = _commands(args)
    if args.head_file is not None:
        args.expect = _read_head(args.head_file)
        _check_writable(args.head_file, "--head-file", args)
    elif args.expect is not None and not is_digest(args.expect):
        raise JournalCliError(f"--expect: {args.expect[:80]!r} is not a sha256: digest")
    where = "--command" if args.command_json is not None else f"--file {args.file}"
    # Checked before the store is opened: a malformed command writes nothing.
    # (The head and a successor's digest are only known later; stand-ins
    # let the shape be checked now.)
    stand_in = "sha256:" + "0" * 64
    for number, value in enumerate(raw, start=1):
        shaped = value
        successor = value.get("successor")
        if value.get("command") == "bind-successor" and isinstance(successor, dict) and "digest" not in successor:
            shaped = {**value, "successor": {**successor, "digest": stand_in}}
        headless = number == 1 and args.expect is None and value.get("expected_head") is None
        if headless:
            # A null expected_head is none: the rest of the command is checked first, then said so.
            shaped = {k: v for k, v in shaped.items() if k != "expected_head"}
        # where="": the message names the command already, so a field is named alone, not "command 1: command: ".
        _input(f"{where} command {number}", lambda v=shaped: j.command_from_json(v, args.expect or stand_in, ""))
        if headless:
            # Every later command expects the head the one before it produced; the first has none to take.
            raise JournalCliError(
                f"{where} command 1: missing field 'expected_head': give the head it expects as its expected_head, "
                "or with --expect HEAD or --head-file FILE [missing_field]"
            )
    resolve = _resolver(args)
    with _store(args) as store:
        _loaded(store, args.execution_id, _where(args))

        def source(number: int, value: dict[str, Any]) -> Callable[[str | None], j.Command]:
            def make(previous: str | None) -> j.Command:
                # Each command expects the head the one before it left, the first --expect's.
                expected = args.expect if number == 1 else previous
                resolved = _resolve_successor(store, value, f"{where} command {number}")
                return _input(f"{where} command {number}", lambda: j.command_from_json(resolved, expected, ""))  # type: ignore[no-any-return]

            return make

        outcomes = store.append_all(
            args.execution_id, [source(number, value) for number, value in enumerate(raw, start=1)], resolve
        )
    refusal = outcomes[-1] if isinstance(outcomes[-1], j.Refusal) else None
    if refusal is not None:
        # Nothing was written: the refused command's number, and that none of the file was appended.
        message = f"{where} command {len(outcomes)} refused [{refusal.code.value}]: {refusal.message}"
        if len(raw) > 1:
            message += f"; nothing was appended (all {len(raw)} commands or none)"
        if out.json_mode:
            out.data({"execution_id": args.execution_id, "appended": 0, "refused": len(outcomes),
                      "code": refusal.code.value, "message": refusal.message, "head": None})  # fmt: skip
        # As for every command, a refusal of a malformed field is what was typed.
        raise JournalCliError(message, EXIT_USAGE if refusal.code is JournalCode.INVALID_REQUEST else EXIT_PROBLEM)
    results: list[dict[str, Any]] = []
    expected: str | None = args.expect
    for outcome in outcomes:
        assert not isinstance(outcome, j.Refusal)
        if isinstance(outcome, j.Unchanged):
            # The next command of a file being sent again expects the head
            # this request made when it was first recorded.
            expected = outcome.events[-1].digest if outcome.events else outcome.journal.head
            results.append({"request": outcome.request_id, "outcome": "unchanged", "head": expected})
            out.line(f"{outcome.request_id}: already recorded (idempotent); nothing changed")
            continue
        expected = outcome.journal.head
        results.append(
            {
                "request": outcome.events[0].request_id,
                "outcome": "appended",
                "events": [e.to_json() for e in outcome.events],
                "head": expected,
            }
        )
        for event in outcome.events:
            out.line(
                f"{event.ordinal:>4} {event.node_id}: {event.prior_state.value} --{event.event.value}--> ",
                state(event.resulting_state),
                f"  ({event.actor_id} as {event.role})",
            )
    if args.head_file is not None and expected is not None:
        _write_head(args.head_file, expected)
    if out.json_mode:
        out.data({"execution_id": args.execution_id, "results": results, "head": expected})
    else:
        out.line(f"head {expected}")
    return EXIT_OK


def _show(args: argparse.Namespace, out: Output) -> int:
    with _store(args) as store:
        journal = _loaded(store, args.execution_id, _where(args))
    if args.head:
        if out.json_mode:
            out.data({"execution_id": journal.execution_id, "head": journal.head})
        else:
            out.line(journal.head)
        return EXIT_OK
    if out.json_mode:
        out.data({**_states_json(journal), "header": journal.header.to_json(), "records": [e.to_json() for e in journal.events]})
        return EXIT_OK
    header = journal.header
    out.line(
        f"{header.execution_id}: workflow {journal.workflow.workflow_id} ({header.workflow_digest[:19]}…), "
        f"policy {journal.policy.policy.policy_id}, created by {header.created_by} at {header.created_at}"
        + (f", supersedes {header.supersedes}" if header.supersedes else "")
    )
    out.table(
        ("#", "at", "node", "event", "state", "who", "detail"),
        [
            (
                str(e.ordinal),
                e.at,
                e.node_id,
                e.event.value,
                state(e.resulting_state),
                f"{e.actor_id} as {e.role}",
                _detail(e),
            )
            for e in journal.events
        ],
    )
    _print_states(journal, out)
    return EXIT_OK


def _detail(event: j.Event) -> str:
    parts = []
    if event.attempt is not None:
        parts.append(f"attempt {event.attempt.attempt_id} #{event.attempt.sequence}")
    if event.error:
        parts.append(f"error: {event.error}")
    parts.extend(f"{r.kind}/{r.ref_id}" for r in event.records)
    if event.approvals:
        parts.append("approved by " + ", ".join(f"{a.actor_id} ({a.role})" for a in event.approvals))
    if event.invalidation is not None:
        source = event.invalidation.source
        parts.append(f"because of {source.kind}/{source.ref_id} under {event.invalidation.policy}")
    if event.successor is not None:
        parts.append(f"succeeded by {event.successor.ref_id}")
    return "; ".join(parts)


def _verify(args: argparse.Namespace, out: Output) -> int:
    if (args.file is None) == (args.execution_id is None):
        raise JournalCliError("give EXECUTION_ID with --db, or --file with --workflow and --policy")
    if args.execution_id is not None and (args.workflow is not None or args.policy is not None):
        # Ignoring them would say "ok" of a workflow and policy that were never looked at.
        option = "--workflow" if args.workflow is not None else "--policy"
        raise JournalCliError(
            f"{option} applies to --file: a stored journal is verified against the workflow and policy stored with it "
            "(export it to verify it against your own)"
        )
    if args.kept_head is not None and not is_digest(args.kept_head):
        raise JournalCliError(f"--kept-head: {args.kept_head[:80]!r} is not a sha256: digest")
    # A file's records are named by their line too: "event 7" is the
    # seventh after the header, whatever ordinal a line removed left in it.
    numbered = args.file is not None
    try:
        if args.file is not None:
            if args.workflow is None or args.policy is None:
                raise JournalCliError("--file needs --workflow and --policy")
            what = str(args.file)
            workflow, policy = _authority(args.workflow, args.policy)
            chain_file = _chain_file(args.file)
            if chain_file is None:
                # A chain cut down to nothing, as a file holding one blank
                # line is: its first bad record is the header, and that is
                # what verify reports (exit 1), not an input error; it has no line.
                numbered = False
                raise JournalError(JournalCode.NON_CANONICAL, "the file is empty: there is no header", 0)
            header, events = chain_file
            resolve = _resolver(args)
            if args.db is not None:
                # The successors a file binds are checked against the headers in --db.
                with _store(args) as store:
                    journal = j.replay(header, events, workflow, policy, resolve, headers=store.header)
            else:
                journal = j.replay(header, events, workflow, policy, resolve)
        else:
            if args.db is None:
                raise JournalCliError("EXECUTION_ID needs --db")
            what = args.execution_id
            with _store(args) as store:
                chain = store.stored(args.execution_id)
                if chain is None:
                    raise JournalCliError(f"EXECUTION_ID: no journal {shown(args.execution_id)} in {_where(args)}")
                journal = replay_stored(chain, _resolver(args), headers=store.header)
    except JournalError as exc:
        # The header is line 1, event n line n + 1.
        line = exc.ordinal + 1 if numbered and exc.ordinal is not None else None
        if out.json_mode:
            out.data({"ok": False, "journal": what, "code": exc.code, "ordinal": exc.ordinal,
                      **({"line": line} if args.file is not None else {}), "message": exc.detail})  # fmt: skip
        elif exc.ordinal is None:
            # No record is to blame (the workflow and policy do not bind each other): none is named.
            out.line(("BAD", "bold red"), f" {what}: [{exc.code}] {exc.detail}")
        else:
            where = "header" if exc.ordinal == 0 else f"event {exc.ordinal}"
            if line is not None:
                where += f" (line {line})"
            out.line(("BAD", "bold red"), f" {what}: the first bad record is {where}: [{exc.code}] {exc.detail}")
        return EXIT_PROBLEM
    if args.kept_head is not None and not _contains_head(journal, args.kept_head):
        message = f"the chain does not contain the kept head {args.kept_head}: it was rewritten, not only extended"
        if out.json_mode:
            out.data({"ok": False, "journal": what, "code": "broken_chain", "ordinal": None,
                      **({"line": None} if args.file is not None else {}), "message": message})  # fmt: skip
        else:
            out.line(("BAD", "bold red"), f" {what}: {message}")
        return EXIT_PROBLEM
    if out.json_mode:
        out.data({"ok": True, "journal": what, "head": journal.head, "events": len(journal.events)})
    else:
        out.line(("ok", "green"), f" {what}: {len(journal.events)} events, every rule holds; head {journal.head}")
    return EXIT_OK


def _contains_head(journal: j.Journal, head: str) -> bool:
    """Whether ``head`` is the header's digest or an event's: a head this chain passed through."""
    return head == journal.header.digest or any(e.digest == head for e in journal.events)


def _chain_file(path: Path) -> tuple[bytes, Sequence[bytes]] | None:
    """The header and event lines of a chain file; None if it is empty."""
    try:
        return journal_fixtures.read_chain(path)
    except OSError as exc:
        raise JournalCliError(f"--file {shown_text(path)}: cannot read: {exc.strerror}") from None
    except ValueError:
        return None


def _export(args: argparse.Namespace, out: Output) -> int:
    outputs = ((args.out, "--out"), (args.workflow_out, "--workflow-out"), (args.policy_out, "--policy-out"))
    taken: dict[Path, str] = {}
    for output, option in outputs:
        if output is not None:
            _check_writable(output, option, args)
            # Written one after the other, two outputs in one file would leave only the last.
            if output.resolve() in taken:
                raise JournalCliError(f"{option} {output}: is also {taken[output.resolve()]}; give each its own file")
            taken[output.resolve()] = option
    with _store(args) as store:
        chain = store.stored(args.execution_id)
    if chain is None:
        raise JournalCliError(f"EXECUTION_ID: no journal {shown(args.execution_id)} in {_where(args)}")
    data = b"".join(line + b"\n" for line in (chain.header, *chain.events))
    written: dict[str, str] = {}
    for path, payload, name in (
        (args.out, data, "chain"),
        (args.workflow_out, chain.workflow + b"\n", "workflow"),
        (args.policy_out, chain.policy + b"\n", "policy"),
    ):
        if path is not None:
            try:
                path.write_bytes(payload)
            except OSError as exc:
                raise JournalCliError(f"{shown_text(path)}: cannot write: {exc.strerror}") from None
            written[name] = str(path)
    if args.out is None:
        if out.json_mode:
            out.data({"execution_id": chain.execution_id, "records": [json.loads(r) for r in (chain.header, *chain.events)]})
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
    elif out.json_mode:
        out.data({"execution_id": chain.execution_id, "events": len(chain.events), "head": chain.head, "written": written})
    return EXIT_OK


def _replay(args: argparse.Namespace, out: Output) -> int:
    with _store(args) as store:
        chain = store.stored(args.execution_id)
    if chain is None:
        raise JournalCliError(f"EXECUTION_ID: no journal {shown(args.execution_id)} in {_where(args)}")
    # Replay from the stored bytes alone: the header, the events, and the
    # workflow and policy the header binds (and each row's digest column
    # held to its record's).
    journal = replay_chain(chain)
    if out.json_mode:
        out.data({**_states_json(journal), "stored_head": chain.head, "agrees": journal.head == chain.head})
    else:
        _print_states(journal, out)
    if journal.head != chain.head or len(journal.events) != chain.length:
        raise JournalCliError(
            f"the chain replays to head {journal.head} after {len(journal.events)} events, but the store's head is "
            f"{chain.head} after {chain.length}",
            EXIT_PROBLEM,
        )
    return EXIT_OK


def _fixtures(args: argparse.Namespace, out: Output) -> int:
    if not args.directory.is_dir():
        raise JournalCliError(f"{args.directory}: not a directory")
    try:
        written = journal_fixtures.write_pack(args.directory)
    except OSError as exc:
        raise JournalCliError(f"{args.directory}: cannot write the pack: {exc.filename}: {exc.strerror}") from None
    if out.json_mode:
        out.data({"written": [str(p) for p in written]})
    else:
        for path in written:
            out.line(str(path))
    return EXIT_OK


__all__ = ["register", "run"]
