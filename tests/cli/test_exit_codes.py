"""One exit-code rule for every command: 2 when what was typed cannot be acted on, 1 when the answer is no.

The rule is the README's exit-code paragraph (and adapters/cli.py's
header).  This sweep gives every command the same kinds of bad input and
checks that each kind gets the same code from every command that takes it:

- 2, and nothing written: a ``--db`` that names no usable store (no file,
  not a database, no server), a malformed ``--business`` or ``--as``, an
  EXECUTION_ID that names nothing (unknown, or of another business), a
  malformed value of the command's own;
- 1: a store that is there but cannot be used as it is (a schema newer than
  this code), a kernel refusal, a conflict with what is stored, a problem a
  check found;
- 3, from ``conformance`` alone: a run in which every case was skipped.

The command list comes from the parser, so a new command without its cases
fails :func:`test_every_command_is_swept`.  The commands run in-process
(``cli.main``): the subprocess tests elsewhere already prove the console
script, and this sweep runs about a hundred commands.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fencekeeper.adapters import cli, examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import EXAMPLES, snapshot

PURCHASE = str(EXAMPLES / "purchase_approval.toml")
GOOD = '{"amount": 2500, "order_id": "o-1", "order_revision": 1}'

# Valid arguments for each command that takes --db (with --db added by each case).
WITH_DB: dict[str, list[str]] = {
    "demo": [],
    "run": [PURCHASE, "--input", GOOD, "--id", "po-new"],
    "worker": ["--until-idle"],
    "inspect": ["po-1"],
    "list": [],
    "event": ["payment.received", "--correlation", '{"order_id": "o-1"}'],
    "decide": ["po-1", "--approve", "--as", "user:manager"],
    "cancel": ["po-1"],
    "reconcile": ["po-1"],
    "migrate": [],
    "check": [],
    # Everything is checked before the server starts, so none of these cases serves.
    "serve": ["--auth", "tests.http.deployment", "--port", "1"],
    "export": ["--sink", "stdout", "--until-idle"],
    "prune": [],
}
CREATES = {"demo", "run", "migrate"}
"""These create a missing SQLite file; given one in a missing directory, they have nothing usable."""
WITH_BUSINESS = ("worker", "list", "event", "decide", "cancel", "reconcile", "run")
WITH_EXECUTION_ID = ("inspect", "decide", "cancel", "reconcile")

# Commands without --db: (arguments, code, words in the error line).
WITHOUT_DB: list[tuple[list[str], int, str]] = [
    (["diagram", "nosuchmachine"], 2, ""),
    (["docs", "extra"], 2, ""),
    (["export-specs", "{dir}/notes.txt/machines"], 2, "cannot create"),
    (["modelcheck", "--workers", "0"], 2, ""),
    (["check-spec", "{dir}/missing.toml"], 2, "cannot read"),
    (["check-spec", "{dir}/notes.txt"], 1, "not valid TOML"),
    # The journal and durable-operation groups: a subcommand is required; their stores are their own.
    (["journal"], 2, "SUBCOMMAND"),
    (["journal", "verify", "{dir}/missing.jsonl"], 2, "--db"),
    (["op"], 2, "OP_COMMAND"),
    (["op", "status", "--db", "{dir}/missing/x.db", "nope"], 2, "does not exist"),
    # The conformance runner: nothing to run, no case files, a driver that cannot start.
    (["conformance"], 2, "--driver"),
    (["conformance", "--driver", "true", "--cases", "{dir}/missing"], 2, "no case file"),
    (["conformance", "--driver", "{dir}/no-such-driver", "--layer", "machines"], 2, "cannot start"),
    (["conformance", "--driver", "echo not-json", "--layer", "machines"], 2, "broke the protocol"),
    # Its own code: a driver without a store checks nothing of the store layer, and that is no success.
    (["conformance", "--driver", f"{sys.executable} -m fencekeeper.adapters.conformance.driver", "--layer", "store"],
     3, "no case ran"),
]

# Understood, and the answer is no.
REFUSED: list[tuple[list[str], str]] = [
    (["run", PURCHASE, "--db", "{db}", "--input", GOOD, "--id", "po-1"], "already exists"),
    (["run", "{dir}/changed.toml", "--db", "{db}", "--input", GOOD], "already registered with different content"),
    (["decide", "--db", "{db}", "po-1", "--approve", "--as", "user:operator"], "[not_authorized]"),
    (["decide", "--db", "{db}", "po-done", "--approve", "--as", "user:manager"], "has no approval request"),
    (["cancel", "--db", "{db}", "po-done"], "[illegal_transition]"),
    (["reconcile", "--db", "{db}", "po-1"], "not reconciliation_required or suspended"),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shop.db: po-1 waiting for a manager, po-done succeeded; future.db: a schema newer than this code."""
    directory = tmp_path_factory.mktemp("sweep")
    store = SQLiteStore(directory / "shop.db")
    try:
        policy = examples.grants("default", "user:operator")
        definition = parse_definition(Path(PURCHASE).read_text(encoding="utf-8"), "purchase_approval.toml")
        service.register(store, definition, "default", "user:operator", policy)
        for execution_id, amount in (("po-1", 2500), ("po-done", 5)):
            service.run(
                store, policy, business_id="default", principal_id="user:operator",
                definition_id=definition.definition_id, execution_id=execution_id,
                input={"amount": amount, "order_id": execution_id, "order_revision": 1},
            )  # fmt: skip
        worker = Worker(store, "w-1", policy, examples.handler(), business_id="default")
        while worker.run_pass().claimed:
            pass
        # po-done's order waits for its payment; the event settles it.
        service.publish(
            store, policy, business_id="default", principal_id="user:operator",
            event_type="payment.received", correlation={"order_id": "po-done"},
        )  # fmt: skip
        while worker.run_pass().claimed:
            pass
        assert store.read("po-done") is not None
    finally:
        store.close()
    shutil.copy(directory / "shop.db", directory / "future.db")
    with contextlib.closing(sqlite3.connect(directory / "future.db")) as conn, conn:
        conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', '-', '2099-01-01T00:00:00Z')")
    (directory / "notes.txt").write_text("not a database\n", encoding="utf-8")
    (directory / "changed.toml").write_text(
        Path(PURCHASE).read_text(encoding="utf-8").replace('title = "Purchase approval"', 'title = "Purchases"'),
        encoding="utf-8",
    )
    return directory


def run(template: Path, tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run one command in a fresh copy of the template; returns its exit code and its error line."""
    for item in template.iterdir():
        shutil.copy(item, tmp_path / item.name)
    filled = [a.replace("{db}", str(tmp_path / "shop.db")).replace("{dir}", str(tmp_path)) for a in args]
    capsys.readouterr()
    try:
        code = cli.main(filled)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


def _unusable_db_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for command, args in WITH_DB.items():
        missing = "{dir}/nowhere/x.db" if command in CREATES else "{dir}/absent.db"
        cases += [
            (f"{command}: --db missing", [command, *args, "--db", missing]),
            (f"{command}: --db not a database", [command, *args, "--db", "{dir}/notes.txt"]),
            (f"{command}: --db unknown scheme", [command, *args, "--db", "mysql://localhost/x"]),
        ]
    cases.append(("check: --db no server", ["check", "--db", "postgresql://nobody@127.0.0.1:1/x"]))
    cases.append(("list: --db no server", ["list", "--db", "postgresql://nobody@127.0.0.1:1/x"]))
    return cases


def _malformed_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for command in WITH_BUSINESS:
        cases.append((f"{command}: --business malformed", [command, *WITH_DB[command], "--db", "{db}", "--business", "a b"]))
    for command in ("run", "event", "cancel", "reconcile", "worker"):
        cases.append((f"{command}: --as malformed", [command, *WITH_DB[command], "--db", "{db}", "--as", "a b"]))
    for command in WITH_EXECUTION_ID:
        rest = WITH_DB[command][1:]
        cases.append((f"{command}: unknown id", [command, "po-404", *rest, "--db", "{db}"]))
        cases.append((f"{command}: malformed id", [command, "a b", *rest, "--db", "{db}"]))
    for command in ("decide", "cancel", "reconcile"):
        rest = WITH_DB[command][1:]
        cases.append((f"{command}: id of another business", [command, "po-1", *rest, "--db", "{db}", "--business", "other"]))
    return cases


@pytest.mark.parametrize("args", [c[1] for c in _unusable_db_cases() + _malformed_cases()],
                         ids=[c[0] for c in _unusable_db_cases() + _malformed_cases()])  # fmt: skip
def test_what_cannot_be_acted_on_exits_2_and_writes_nothing(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    for item in template.iterdir():
        shutil.copy(item, tmp_path / item.name)
    before = snapshot(tmp_path)
    code, line = run(template, tmp_path, args, capsys)
    assert code == 2, (args, code, line)
    assert snapshot(tmp_path) == before, "bad input wrote something"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["check", "--actions", ""], "--actions"),
        (["check", "--actions", ".relative"], "--actions"),
        (["serve", "--auth", "", "--port", "1"], "--auth"),
        (["serve", "--auth", ".relative", "--port", "1"], "--auth"),
        (["serve", "--auth", "tests.http.deployment", "--actions", "", "--port", "1"], "--actions"),
    ],
    ids=["check-actions-empty", "check-actions-relative", "serve-auth-empty", "serve-auth-relative", "serve-actions-empty"],
)
def test_a_module_name_that_cannot_be_imported_is_its_option_s_error(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], option: str
) -> None:
    """An empty or relative module name is what was typed, as a missing module is: exit 2, never an internal error."""
    for item in template.iterdir():
        shutil.copy(item, tmp_path / item.name)
    before = snapshot(tmp_path)
    code, line = run(template, tmp_path, [*args, "--db", "{db}"], capsys)
    assert code == 2, (args, code, line)
    assert line.startswith(f"fencekeeper: error: {option}: cannot import"), line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", sorted(WITH_DB))
def test_a_store_that_cannot_be_used_as_it_is_exits_1(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, line = run(template, tmp_path, [command, *WITH_DB[command], "--db", "{dir}/future.db"], capsys)
    assert code == 1, (command, code, line)
    if command != "check":  # check reports it in its table, on stdout
        assert "[schema_too_new]" in line, line


@pytest.mark.parametrize(("args", "words"), REFUSED, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in REFUSED])
def test_an_answer_of_no_exits_1(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    code, line = run(template, tmp_path, args, capsys)
    assert code == 1, (args, code, line)
    assert words in line, line


@pytest.mark.parametrize("case", WITHOUT_DB, ids=[" ".join(c[0]) for c in WITHOUT_DB])
def test_commands_without_a_store(
    template: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[list[str], int, str]
) -> None:
    args, code, words = case
    got, line = run(template, tmp_path, args, capsys)
    assert got == code, (args, got, line)
    assert words in line, line


def test_every_command_is_swept() -> None:
    parser = cli._parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    swept = set(WITH_DB) | {args[0] for args, _, _ in WITHOUT_DB}
    assert set(commands.choices) == swept


def test_the_command_groups_load_only_when_a_command_line_may_need_them() -> None:
    """Every command is either defined in cli.py or a group; a plain command's parser is that command's alone."""
    parser = cli._parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(cli._COMMAND_PARSERS) | {"journal", "op", "export", "prune", "serve", "conformance"}
    for name in cli._COMMAND_PARSERS:
        alone = cli._parser(only=name)
        [one] = [a for a in alone._actions if isinstance(a, argparse._SubParsersAction)]
        assert set(one.choices) == {name}
    assert cli._chosen_command(["worker", "--db", "x.db"]) == "worker"
    assert cli._chosen_command(["--debug", "--debug", "worker", "--db", "x.db"]) == "worker"
    assert cli._chosen_command(["journal", "show"]) is None and cli._chosen_command(["op", "status"]) is None
    assert cli._chosen_command(["serve", "--db", "x.db"]) is None
    assert cli._chosen_command(["--help"]) is None and cli._chosen_command(["no-such-command"]) is None
    assert cli._chosen_command([]) is None
    # Whatever comes before the command but --debug may be the top-level parser's to answer (its help, the
    # version, an error naming every command: "-1" is a positional to argparse, so an invalid choice).
    for before in ("-h", "--help", "--version", "--no-such-option", "-1", "--debug=1"):
        assert cli._chosen_command([before, "worker", "--db", "x.db"]) is None, before


def test_a_worker_command_line_imports_neither_group() -> None:
    """What the groups cost at start-up is paid only by their own commands (a fresh interpreter, so nothing is cached)."""
    probe = (
        "import sys\n"
        "from fencekeeper.adapters import cli\n"
        "try:\n"
        "    cli.main(['worker', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = [m for m in ('fencekeeper.adapters.cli_journal', 'fencekeeper.adapters.cli_ops') if m in sys.modules]\n"
        "sys.stderr.write(repr(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stderr == "[]", done.stderr


def test_a_worker_reporting_in_json_starts_without_rich(tmp_path: Path) -> None:
    """rich draws for a person at a terminal; a worker that prints JSON, as deployed ones do, does not load it."""
    db = tmp_path / "empty.db"
    with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
        assert cli.main(["migrate", "--db", str(db)]) == 0
    probe = (
        "import sys\n"
        "from fencekeeper.adapters import cli\n"
        "code = cli.main(['worker', '--db', sys.argv[1], '--until-idle', '--json'])\n"
        "loaded = sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.'))\n"
        "sys.stderr.write(repr((code, loaded)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(db)], capture_output=True, text=True, check=True)
    assert done.stderr == "(0, [])", done.stderr
    assert json.loads(done.stdout)["stopped_by"] == "idle"


def test_a_worker_given_its_id_starts_without_socket(tmp_path: Path) -> None:
    """Only the default worker id asks for the host name; a SQLite worker given --id never loads socket."""
    db = tmp_path / "empty.db"
    with contextlib.redirect_stdout(None), contextlib.redirect_stderr(None):
        assert cli.main(["migrate", "--db", str(db)]) == 0
    probe = (
        "import contextlib, io, json, os, sys\n"
        "from fencekeeper.adapters import cli\n"
        "def run(*extra):\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        assert cli.main(['worker', '--db', sys.argv[1], '--until-idle', '--json', *extra]) == 0\n"
        "    return json.loads(out.getvalue())['workers'], 'socket' in sys.modules\n"
        "given = run('--id', 'w')\n"
        "default = run()\n"
        "import socket\n"
        "sys.stderr.write(repr((given, default == ([f\"{socket.gethostname().split('.')[0]}-{os.getpid()}-1\"], True))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(db)], capture_output=True, text=True, check=True)
    assert done.stderr == "((['w-1'], False), True)", done.stderr
