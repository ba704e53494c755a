"""A refused value of any length is quoted by its start: the error line stays one readable line.

Every message that quotes a value someone gave quotes it through
``kernel.common.shown`` (its repr, cut at 132 characters ending ``...``, above any identifier) or,
for text named unquoted such as a path, ``shown_text`` (cut in the middle at
240 characters); argparse's own messages are cut word by word
(``cli._Parser``), and the whole line is bounded last.  A value of ordinary
length reads exactly as before.

The sweep gives each option that takes a value, and each positional, a
100,000-character value it refuses, in-process (``cli.main``), and checks
the error line: one line, exit 2, naming what was given, at most
:data:`LONGEST` characters and never a long run of the value.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from fencekeeper.adapters import cli
from fencekeeper.kernel.common import SHOWN_LENGTH, SHOWN_TEXT_LENGTH, shown, shown_text
from fencekeeper.kernel.definition import DefinitionError, parse_definition
from fencekeeper.kernel.events import Event, EventError
from fencekeeper.kernel.interpreter import InputError, input_evidence
from fencekeeper.kernel.machines import MACHINES
from tests.cli.runner import EXAMPLES, assert_one_error_line, fencekeeper

HUGE = "a" * 100_000
LONGEST = 600
PURCHASE = str(EXAMPLES / "purchase_approval.toml")

# (case, arguments with {db} and {dir}, words the line names)
CASES: list[tuple[str, list[str], list[str]]] = [
    ("EXECUTION_ID", ["inspect", HUGE, "--db", "{db}"], ["EXECUTION_ID", "malformed identifier"]),
    ("--business", ["list", "--db", "{db}", "--business", HUGE], ["--business"]),
    ("--state (argparse choices)", ["list", "--db", "{db}", "--state", HUGE], ["--state", "invalid choice"]),
    ("run --id", ["run", PURCHASE, "--db", "{db}", "--id", HUGE], ["--id"]),
    ("run --as", ["run", PURCHASE, "--db", "{db}", "--as", HUGE], ["--as"]),
    ("--input unknown name", ["run", PURCHASE, "--db", "{db}", "--input", f'{{"{HUGE}": 1}}'], ["--input", "not an input"]),
    ("--input @FILE", ["run", PURCHASE, "--db", "{db}", "--input", "@{dir}/" + HUGE], ["--input", "cannot read"]),
    ("--input key twice", ["run", PURCHASE, "--db", "{db}", "--input", f'{{"{HUGE}": 1, "{HUGE}": 2}}'], ["duplicate key"]),
    ("DEFINITION path", ["run", "{dir}/" + HUGE, "--db", "{db}"], ["cannot read"]),
    ("--db path", ["inspect", "x-1", "--db", "{dir}/" + HUGE], ["--db", "cannot be used"]),
    ("--db scheme", ["inspect", "x-1", "--db", HUGE + "://x"], ["--db", "unknown scheme"]),
    ("--db sqlite URL", ["inspect", "x-1", "--db", "sqlite://" + HUGE], ["--db", "sqlite:///"]),
    ("event TYPE", ["event", HUGE, "--db", "{db}", "--correlation", '{"a": 1}'], ["TYPE", "event_type"]),
    ("--correlation name", ["event", "t", "--db", "{db}", "--correlation", f'{{"{HUGE}": 1}}'], ["--correlation", "malformed name"]),
    ("event --id", ["event", "t", "--db", "{db}", "--correlation", '{"a": 1}', "--id", HUGE], ["--id"]),
    ("decide --as", ["decide", "x-1", "--db", "{db}", "--approve", "--as", HUGE], ["--as"]),
    ("--resume-at", ["reconcile", "x-1", "--db", "{db}", "--resume-at", HUGE, "--because", "x"], ["--resume-at"]),
    ("--concurrency", ["worker", "--db", "{db}", "--concurrency", HUGE], ["--concurrency", "not a whole number"]),
    ("--processes", ["worker", "--db", "{db}", "--processes", HUGE], ["--processes", "not a whole number"]),
    ("--lease", ["worker", "--db", "{db}", "--lease", HUGE], ["--lease", "not a number of seconds"]),
    ("--poll (argparse type)", ["worker", "--db", "{db}", "--poll", HUGE], ["--poll", "not a number of seconds"]),
    ("--handler", ["worker", "--db", "{db}", "--handler", HUGE], ["--handler", "MODULE:FACTORY"]),
    ("--handler module", ["worker", "--db", "{db}", "--handler", HUGE + ":make"], ["--handler", "cannot import"]),
    ("--handler factory", ["worker", "--db", "{db}", "--handler", "os:" + HUGE], ["--handler", "no callable"]),
    ("--metrics-port", ["worker", "--db", "{db}", "--metrics-port", HUGE], ["--metrics-port"]),
    ("--namespace", ["check", "--db", "{db}", "--namespace", HUGE], ["--namespace"]),
    ("--actions", ["check", "--db", "{db}", "--actions", HUGE], ["--actions", "cannot import"]),
    ("MACHINE (argparse choices)", ["diagram", HUGE], ["MACHINE", "invalid choice"]),
    ("--workers (argparse type)", ["modelcheck", "--workers", HUGE], ["--workers", "not a whole number"]),
    ("check-spec FILE", ["check-spec", "{dir}/" + HUGE], ["cannot read"]),
    ("export-specs DIR", ["export-specs", "{dir}/" + HUGE], ["cannot be used"]),
    ("op submit ACTION", ["op", "submit", HUGE, "--db", "{db}", "--key", "k"], ["no action"]),
    ("op status OPERATION_ID", ["op", "status", HUGE, "--db", "{db}"], ["operation", "does not exist"]),
    ("journal show EXECUTION_ID", ["journal", "show", HUGE, "--db", "{db}"], ["EXECUTION_ID", "no journal"]),
    ("journal --workflow", ["journal", "new", "j", "--db", "{db}", "--workflow", "{dir}/" + HUGE, "--policy", "p", "--as", "h"], ["--workflow"]),
    ("export --sink", ["export", "--db", "{db}", "--sink", HUGE], ["--sink"]),
    ("export --timeout (argparse type)", ["export", "--db", "{db}", "--timeout", HUGE], ["--timeout", "not a duration"]),
    ("export --requeue", ["export", "--db", "{db}", "--requeue", HUGE], ["no parked outbox message"]),
    ("serve --auth", ["serve", "--db", "{db}", "--auth", HUGE], ["--auth", "cannot import"]),
    ("an unknown argument", ["list", "--db", "{db}", HUGE], ["unrecognized arguments"]),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("long")
    with contextlib.redirect_stdout(None):
        assert cli.main(["migrate", "--db", str(directory / "shop.db")]) == 0
    return directory


def _fill(args: list[str], directory: Path) -> list[str]:
    return [a.replace("{db}", str(directory / "shop.db")).replace("{dir}", str(directory)) for a in args]


@pytest.mark.parametrize(("args", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_huge_value_is_quoted_by_its_start(
    template: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: list[str],
) -> None:
    for item in template.iterdir():
        shutil.copy(item, tmp_path / item.name)
    capsys.readouterr()
    try:
        code = cli.main(_fill(args, tmp_path))
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code == 2, err[:2000]
    assert out == ""
    errors = [line for line in err.splitlines() if "error: " in line]
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1], err[:2000]
    [line] = errors
    assert len(line) <= LONGEST, line[:2000]
    assert "a" * SHOWN_TEXT_LENGTH not in line
    assert "aaaa" in line, "the value is quoted by its start"
    for word in words:
        assert word in line, (word, line)


def test_the_console_script_bounds_the_line_too(template: Path) -> None:
    line = assert_one_error_line(fencekeeper("inspect", HUGE, "--db", template / "shop.db", cwd=template), code=2)
    assert line == f"fencekeeper: error: EXECUTION_ID: malformed identifier {shown(HUGE)} {MALFORMED}"
    assert shown(HUGE) == "'" + "a" * (SHOWN_LENGTH - 4) + "..."


def test_an_identifier_of_any_valid_length_is_named_whole(template: Path) -> None:
    # Only a value no identifier could be is cut: a message naming a real execution, operation or
    # journal by its id names it whole, up to the 128 characters an identifier may have.
    longest = "o" * 128
    assert shown(longest) == repr(longest)
    assert shown("o" * 200).endswith("...")
    result = fencekeeper("inspect", longest, "--db", template / "shop.db", cwd=template)
    assert result.returncode != 0 and repr(longest) in result.stderr


# A value of ordinary length reads exactly as it always has.
MALFORMED = "(1-128 of A-Z a-z 0-9 . _ : @ / -, not starting with a symbol)"
SCHEMES = "give a SQLite file path or a postgresql:// DSN [store_unavailable]"
SHORT = [
    (["worker", "--db", "{db}", "--concurrency", "x"], "fencekeeper: error: --concurrency: not a whole number: 'x'"),
    (["list", "--db", "{db}", "--business", "a b"], f"fencekeeper: error: --business: malformed identifier 'a b' {MALFORMED}"),
    (["inspect", "x-1", "--db", "mysql://h/x"], f"fencekeeper: error: --db: unknown scheme 'mysql'; {SCHEMES}"),
    (
        ["diagram", "nope"],
        "fencekeeper diagram: error: argument MACHINE: invalid choice: 'nope' "
        f"(choose from {', '.join(map(repr, sorted(MACHINES)))})",
    ),
    (["list", "--db", "{db}", "stray"], "fencekeeper list: error: unrecognized arguments: stray"),
]


@pytest.mark.parametrize(("args", "expected"), SHORT, ids=[" ".join(a[:2]) for a, _ in SHORT])
def test_a_value_of_ordinary_length_reads_as_before(
    template: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    capsys.readouterr()
    try:
        code = cli.main(_fill(args, template))
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == expected


def test_a_path_keeps_its_end_and_a_long_path_of_ordinary_length_is_whole() -> None:
    ordinary = "/home/someone/projects/" + "deployments/" * 10 + "purchase_approval.toml"
    assert len(ordinary) < SHOWN_TEXT_LENGTH and shown_text(ordinary) == ordinary
    cut = shown_text("/x/" + HUGE + "/purchase_approval.toml")
    assert len(cut) == SHOWN_TEXT_LENGTH
    assert cut.startswith("/x/aaa") and "..." in cut and cut.endswith("/purchase_approval.toml")


def test_shown_is_repr_up_to_its_bound_and_names_what_has_no_repr() -> None:
    assert shown("po-1") == "'po-1'"
    assert shown("a" * (SHOWN_LENGTH - 2)) == repr("a" * (SHOWN_LENGTH - 2))  # exactly at the bound: whole
    assert shown("a" * (SHOWN_LENGTH - 1)).endswith("...") and len(shown("a" * (SHOWN_LENGTH - 1))) == SHOWN_LENGTH
    assert shown({"k": HUGE}).startswith("{'k': 'aaa") and len(shown({"k": HUGE})) == SHOWN_LENGTH
    assert shown(10**5000) == "<int too large to show>"  # its repr would raise: longer than Python prints


# The kernel's own messages, as the Python API and HTTP give them (no command line in between).


def test_the_kernels_messages_bound_what_they_quote() -> None:
    with pytest.raises(EventError) as event:
        Event.build("e-1", "default", "t", {HUGE: 1})
    assert len(str(event.value)) < 200 and shown(HUGE) in str(event.value)
    with pytest.raises(EventError) as event_id:
        Event.build(HUGE, "default", "t", {"a": 1})
    assert len(str(event_id.value)) < 200
    definition = parse_definition(Path(PURCHASE).read_text(encoding="utf-8"), "purchase_approval.toml")
    with pytest.raises(InputError) as unknown:
        input_evidence("x-1", definition, "user:operator", {"amount": 1, "order_id": "o", "order_revision": 1, HUGE: 1})
    assert len(str(unknown.value)) < 300 and f"input.{shown(HUGE)}: not an input" in str(unknown.value)
    with pytest.raises(InputError) as nested:
        input_evidence("x-1", definition, "user:operator", {"amount": 1, "order_id": {HUGE: "\x00"}, "order_revision": 1})
    assert len(str(nested.value)) < 300
    kind = Path(PURCHASE).read_text(encoding="utf-8").replace('kind = "end"', f'kind = "{HUGE}"', 1)
    with pytest.raises(DefinitionError) as refused:
        parse_definition(kind, "purchase_approval.toml")
    assert len(str(refused.value)) < 300 and f"unknown node kind {shown(HUGE)}" in str(refused.value)


def test_a_path_through_long_keys_is_cut_too() -> None:
    """``op submit``'s input check names the key that is not a string by its path; a long key on it is cut."""
    from fencekeeper.adapters.operations.service import DurableOperationError, _check_input_keys  # noqa: PLC0415

    with pytest.raises(DurableOperationError) as caught:
        _check_input_keys({HUGE: {1: "one"}})
    assert len(str(caught.value)) < 300 and str(caught.value).startswith('input["aaa')
    with pytest.raises(DurableOperationError) as short:
        _check_input_keys({"order": {1: "one"}})
    assert str(short.value).startswith("input.order: key 1 (int) is not a string")
