"""Bad input: one clear error line naming the argument, a non-zero exit, and nothing written.

Each case starts from a copy of the same small database (one execution
waiting for an approval) and compares every file in the directory, byte for
byte, before and after: no row, no new file, no WAL left behind.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
from pathlib import Path

import pytest

from fencekeeper.adapters import connect, examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import EXAMPLES, assert_one_error_line, fencekeeper, snapshot

PURCHASE = EXAMPLES / "purchase_approval.toml"
GOOD_INPUT = '{"amount": 2500, "order_id": "o-1", "order_revision": 1}'


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shop.db with po-1 waiting for a manager, built through the Python API (no subprocess needed)."""
    directory = tmp_path_factory.mktemp("template")
    store = SQLiteStore(directory / "shop.db")
    try:
        policy = examples.grants("default", "user:operator")
        definition = parse_definition(PURCHASE.read_text(encoding="utf-8"), PURCHASE.name)
        service.register(store, definition, "default", "user:operator", policy)
        service.run(
            store,
            policy,
            business_id="default",
            principal_id="user:operator",
            definition_id=definition.definition_id,
            input={"amount": 2500, "order_id": "o-1", "order_revision": 1},
            execution_id="po-1",
        )
        Worker(store, "w-1", policy, examples.handler(), business_id="default").run_pass()
    finally:
        store.close()
    (directory / "changed.toml").write_text(
        PURCHASE.read_text(encoding="utf-8").replace('title = "Purchase approval"', 'title = "Purchases"'),
        encoding="utf-8",
    )
    (directory / "broken.toml").write_text('id = "x"\nrevision = \n', encoding="utf-8")
    (directory / "unknown_field.toml").write_text(
        PURCHASE.read_text(encoding="utf-8").replace('operation = "order.place"', 'operation = "order.place"\ncolour = 1'),
        encoding="utf-8",
    )
    (directory / "notes.txt").write_text("not a database\n", encoding="utf-8")
    (directory / "not-json.json").write_text("{amount: 1}\n", encoding="utf-8")
    (directory / "broken.json").write_text('{"id": "x", "revision": }', encoding="utf-8")
    return directory


# (name, arguments with {db} and {dir} placeholders, exit code, words the one error line must contain)
CASES = [
    ("run: missing definition", ["run", "{dir}/missing.toml", "--db", "{db}"], 2, ["missing.toml", "cannot read"]),
    ("run: malformed TOML", ["run", "{dir}/broken.toml", "--db", "{db}"], 2, ["broken.toml", "not valid TOML"]),
    (
        "run: unknown field",
        ["run", "{dir}/unknown_field.toml", "--db", "{db}", "--input", GOOD_INPUT],
        2,
        ["unknown_field.toml", "node 'place_order'", "colour"],
    ),
    ("run: --input not JSON", ["run", str(PURCHASE), "--db", "{db}", "--input", "{amount: 1}"], 2, ["--input", "not valid JSON"]),
    ("run: --input not an object", ["run", str(PURCHASE), "--db", "{db}", "--input", "[1]"], 2, ["--input", "JSON object"]),
    (
        "run: --input incomplete",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": 1, "order_id": "o-2"}'],
        2,
        ["--input", "input.order_revision", "missing"],
    ),
    ("run: --id malformed", ["run", str(PURCHASE), "--db", "{db}", "--input", GOOD_INPUT, "--id", "a b"], 2, ["--id", "'a b'"]),
    ("run: --id taken", ["run", str(PURCHASE), "--db", "{db}", "--input", GOOD_INPUT, "--id", "po-1"], 1, ["--id", "already exists"]),
    (
        "run: changed definition, same revision",
        ["run", "{dir}/changed.toml", "--db", "{db}", "--input", GOOD_INPUT],
        1,
        ["changed.toml", "revision 1 is already registered with different content"],
    ),
    ("run: no such directory", ["run", str(PURCHASE), "--db", "{dir}/nowhere/x.db", "--input", GOOD_INPUT], 2, ["nowhere", "does not exist"]),
    ("migrate: --db a directory", ["migrate", "--db", "{dir}"], 2, ["is a directory, not a SQLite database"]),
    ("inspect: unknown id", ["inspect", "po-404", "--db", "{db}"], 2, ["EXECUTION_ID", "po-404"]),
    ("inspect: no database file", ["inspect", "po-1", "--db", "{dir}/other.db"], 2, ["--db", "other.db", "migrate"]),
    ("inspect: not a database", ["inspect", "po-1", "--db", "{dir}/notes.txt"], 2, ["notes.txt", "not a usable SQLite database"]),
    ("list: unknown scheme", ["list", "--db", "mysql://localhost/x"], 2, ["--db", "unknown scheme 'mysql'"]),
    ("list: unreachable server", ["list", "--db", "postgresql://nobody@127.0.0.1:1/x"], 2, ["--db", "cannot connect", "port=1"]),
    ("list: unparsable DSN", ["list", "--db", "postgresql://[oops"], 2, ["--db", "not a valid PostgreSQL URL"]),
    ("decide: unknown id", ["decide", "--db", "{db}", "po-404", "--approve", "--as", "user:manager"], 2, ["EXECUTION_ID", "po-404"]),
    ("cancel: unknown id", ["cancel", "--db", "{db}", "po-404"], 2, ["EXECUTION_ID", "po-404"]),
    ("reconcile: unknown id", ["reconcile", "--db", "{db}", "po-404"], 2, ["EXECUTION_ID", "po-404"]),
    (
        "reconcile: an execution of another business",
        ["reconcile", "--db", "{db}", "po-1", "--business", "other"],
        2,
        ["EXECUTION_ID", "no execution 'po-1' in business 'other'"],
    ),
    ("reconcile: nothing asked", ["reconcile", "--db", "{db}"], 2, ["EXECUTION_ID", "--quarantine"]),
    (
        "event: --correlation not JSON",
        ["event", "--db", "{db}", "payment.received", "--correlation", "order_id=o-7"],
        2,
        ["--correlation", "not valid JSON"],
    ),
    (
        "event: --payload not JSON",
        ["event", "--db", "{db}", "payment.received", "--correlation", "{}", "--payload", "{'paid': 1}"],
        2,
        ["--payload", "not valid JSON"],
    ),
    (
        "event: no correlation",
        ["event", "--db", "{db}", "payment.received", "--correlation", "{}"],
        2,
        ["--correlation", "at least one value"],
    ),
    (
        "event: correlation value",
        ["event", "--db", "{db}", "payment.received", "--correlation", '{"order_id": [1]}'],
        2,
        ["--correlation", "order_id"],
    ),
    (
        "run: lone surrogate in --input",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": 2500, "order_id": "o-\\ud800", "order_revision": 1}'],
        2,
        ["--input", "input.order_id", "unpaired surrogate (U+D800)"],
    ),
    (
        "run: NUL in --input",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": 2500, "order_id": "o-\\u0000", "order_revision": 1}'],
        2,
        ["--input", "input.order_id", "NUL"],
    ),
    (
        "run: NaN in --input",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": NaN, "order_id": "o-1", "order_revision": 1}'],
        2,
        ["--input", "NaN is not a JSON number"],
    ),
    (
        # json keeps the last of two equal members without a word: an input naming "amount" twice is refused.
        "run: a member named twice in --input",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": 1, "amount": 2500, "order_id": "o-1", "order_revision": 1}'],
        2,
        ["--input", "not valid JSON: duplicate key 'amount' in an object"],
    ),
    (
        # A names-only number is what a condition reads: a 64-bit integer, not 2^64 (it would suspend there).
        "run: an integer beyond 64 bits in --input",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": 18446744073709551616, "order_id": "o-1", "order_revision": 1}'],
        2,
        ["--input", "input.amount", "integer 18446744073709551616 is outside the 64-bit signed range"],
    ),
    (
        # Longer than Python converts: json's bare ValueError was an internal error.
        "run: an integer of 5000 digits in --input",
        ["run", str(PURCHASE), "--db", "{db}", "--input", '{"amount": ' + "9" * 5000 + ', "order_id": "o-1", "order_revision": 1}'],
        2,
        ["--input", "not valid JSON: an integer of 5000 digits is longer than this reader converts"],
    ),
    ("run: --input @ without a file", ["run", str(PURCHASE), "--db", "{db}", "--input", "@"], 2, ["--input", "'@' names no file"]),
    ("run: --input @missing", ["run", str(PURCHASE), "--db", "{db}", "--input", "@{dir}/missing.json"], 2, ["--input", "missing.json", "cannot read"]),
    ("run: --input @file not JSON", ["run", str(PURCHASE), "--db", "{db}", "--input", "@{dir}/not-json.json"], 2, ["--input", "not-json.json", "not valid JSON"]),
    ("run: --input - empty stdin", ["run", str(PURCHASE), "--db", "{db}", "--input", "-"], 2, ["--input: stdin", "not valid JSON"]),
    ("run: broken JSON definition", ["run", "{dir}/broken.json", "--db", "{db}", "--input", GOOD_INPUT], 2, ["broken.json", "not valid JSON"]),
    (
        "event: NUL in --correlation",
        ["event", "--db", "{db}", "payment.received", "--correlation", '{"order_id": "o-\\u0000"}'],
        2,
        ["--correlation", "correlation.order_id", "NUL"],
    ),
    (
        "event: surrogate in --payload",
        ["event", "--db", "{db}", "payment.received", "--correlation", '{"order_id": "o-1"}', "--payload", '{"n": {"\\udfff": 1}}'],
        2,
        ["--payload", "payload.n key", "unpaired surrogate"],
    ),
    (
        "event: stdin twice",
        ["event", "--db", "{db}", "payment.received", "--correlation", "-", "--payload", "-"],
        2,
        ["--correlation and --payload both read stdin"],
    ),
    (
        # An empty --id is a malformed id, not a missing one: no Event is published under a fresh id.
        "event: empty --id",
        ["event", "--db", "{db}", "payment.received", "--correlation", '{"order_id": "o-1"}', "--id", ""],
        2,
        ["--id", "malformed identifier ''"],
    ),
    (
        # A reason is recorded only by a resume or a fail: with neither it would be dropped unseen.
        "reconcile: --because without a choice",
        ["reconcile", "--db", "{db}", "po-1", "--because", "checked with the provider"],
        2,
        ["--because", "only with --resume-at or --fail"],
    ),
    (
        "reconcile: --handler without --settle",
        ["reconcile", "--db", "{db}", "--quarantine", "--handler", "my.handlers:make"],
        2,
        ["--handler", "only with --settle"],
    ),
    (
        # Checked before the store is opened: the request is not shown, as if the decision were under way.
        "decide: --rationale too long",
        ["decide", "--db", "{db}", "po-1", "--approve", "--as", "user:manager", "--rationale", "r" * 2001],
        2,
        ["--rationale", "at most 2000 characters, got 2001"],
    ),
    (
        "decide: a byte that is not UTF-8 in --rationale",
        ["decide", "--db", "{db}", "po-1", "--approve", "--as", "user:manager", "--rationale", "bad \udcff byte"],
        2,
        ["--rationale", "unpaired surrogate (U+DCFF)"],
    ),
    ("worker: --handler", ["worker", "--db", "{db}", "--handler", "no_such_module:make"], 2, ["--handler", "no_such_module"]),
]


@pytest.mark.parametrize(("args", "code", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_writes_nothing(
    template: Path, tmp_path: Path, args: list[str], code: int, words: list[str]
) -> None:
    for item in template.iterdir():
        shutil.copy(item, tmp_path / item.name)
    before = snapshot(tmp_path)
    placeholders = {"{db}": str(tmp_path / "shop.db"), "{dir}": str(tmp_path)}
    filled = [arg.replace("{db}", placeholders["{db}"]).replace("{dir}", placeholders["{dir}"]) for arg in args]
    result = fencekeeper(*filled, cwd=tmp_path)
    line = assert_one_error_line(result, code)
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert result.stdout == "", "a refused command printed data"
    assert snapshot(tmp_path) == before, "the command wrote something"


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = fencekeeper("--debug", "inspect", "po-1", "--db", tmp_path / "none.db", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "no database at" in result.stderr
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize(
    ("because", "words"),
    [
        ("bad \udcff byte", ["--because", "unpaired surrogate (U+DCFF)"]),
        ("x" * 2001, ["--because", "at most 2000 characters, got 2001"]),
    ],
    ids=["non-utf8-byte", "too-long"],
)
@pytest.mark.parametrize("choice", [["--fail"], ["--resume-at", "refunded"]], ids=["fail", "resume"])
def test_a_malformed_reason_for_a_review_decision_is_exit_2_and_writes_nothing(
    tmp_path: Path, choice: list[str], because: str, words: list[str]
) -> None:
    # A byte that is not UTF-8 in an argument reaches the command as a lone surrogate; a
    # rationale over the kernel's limit is a malformed field (invalid_request): both are 2.
    # An execution really in review: the example provider's reply to a refund is lost.
    store = SQLiteStore(tmp_path / "shop.db")
    try:
        policy = examples.grants("default", "user:operator")
        refund = EXAMPLES / "refund_needs_reconciliation.toml"
        definition = parse_definition(refund.read_text(encoding="utf-8"), refund.name)
        service.register(store, definition, "default", "user:operator", policy)
        service.run(
            store, policy, business_id="default", principal_id="user:operator",
            definition_id=definition.definition_id, input={"amount": 5, "payment_id": "p-1"}, execution_id="rf-1",
        )  # fmt: skip
        Worker(store, "w-1", policy, examples.handler(), business_id="default").run_pass()
    finally:
        store.close()
    before = snapshot(tmp_path)
    line = assert_one_error_line(
        fencekeeper("reconcile", "--db", tmp_path / "shop.db", "rf-1", *choice, "--because", because, cwd=tmp_path), 2
    )
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert snapshot(tmp_path) == before, "the command wrote something"


@pytest.mark.parametrize(
    ("corrected", "words"),
    [
        ('{"amount": "x\\ud800", "order_id": "o-1", "order_revision": 1}', ["input.amount", "unpaired surrogate"]),
        ('{"order_id": "o-1", "order_revision": 1}', ["input.amount", "missing"]),
        ('{"amount": -9223372036854775809, "order_id": "o-1", "order_revision": 1}', ["input.amount", "64-bit"]),
    ],
    ids=["surrogate", "missing", "beyond-64-bits"],
)
def test_a_corrected_input_that_does_not_fit_is_named_by_its_option_and_writes_nothing(
    tmp_path: Path, corrected: str, words: list[str]
) -> None:
    # A mistyped amount suspends the execution at its condition; the operator resumes it with a fix.
    store = SQLiteStore(tmp_path / "shop.db")
    try:
        policy = examples.grants("default", "user:operator")
        definition = parse_definition(PURCHASE.read_text(encoding="utf-8"), PURCHASE.name)
        service.register(store, definition, "default", "user:operator", policy)
        service.run(
            store, policy, business_id="default", principal_id="user:operator",
            definition_id=definition.definition_id, input={"amount": "lots", "order_id": "o-1", "order_revision": 1},
            execution_id="po-9",
        )  # fmt: skip
        Worker(store, "w-1", policy, examples.handler(), business_id="default").run_pass()
        found = store.read("po-9")
        assert found is not None and found.execution.state.value == "suspended"
    finally:
        store.close()
    before = snapshot(tmp_path)
    result = fencekeeper(
        "reconcile", "--db", tmp_path / "shop.db", "po-9", "--resume-at", "check_amount", "--because", "fixed",
        "--input", corrected, cwd=tmp_path,
    )  # fmt: skip
    line = assert_one_error_line(result, 2)
    assert line.startswith("fencekeeper: error: --input: "), line
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert snapshot(tmp_path) == before, "the command wrote something"


def test_check_reports_an_execution_state_edited_by_hand_instead_of_failing(template: Path, tmp_path: Path) -> None:
    """The deployment check is what an operator runs on a damaged store: it names the row's state and blocks."""
    db = tmp_path / "shop.db"
    shutil.copy(template / "shop.db", db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE objects SET state = 'bogus' WHERE object_id = 'po-1'")
    conn.close()
    before = snapshot(tmp_path)
    result = fencekeeper("check", "--db", db, "--json", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (1, ""), result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["executions"] == {"bogus": 1}
    [problem] = report["problems"]
    assert "1 in state 'bogus'" in problem and "edited by hand" in problem
    assert "Traceback" not in fencekeeper("check", "--db", db, cwd=tmp_path).stdout
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("url", "schema", "shown"),
    [
        ("shop.db", None, "--db shop.db"),
        ("my shop.db", None, "--db 'my shop.db'"),
        ("postgresql://fk@db/app", "s", "--db postgresql://fk@db/app --schema s"),
        ("postgresql://fk:s3cret@db:5432/app?schema=x&sslmode=require", None,
         "--db 'postgresql://fk@db:5432/app?schema=x&sslmode=require'"),
        ("postgresql://fk@db/app?password=s3cret&sslmode=require", None,
         "--db 'postgresql://fk@db/app?sslmode=require'"),
        ("postgresql://fk:a@db/app?password=b", "s", "--db postgresql://fk@db/app --schema s"),
    ],
)  # fmt: skip
def test_a_suggested_command_names_the_store_as_typed_without_its_password(
    url: str, schema: str | None, shown: str
) -> None:
    """What the output suggests running again is a shell word for --db, and never carries a password (libpq finds it)."""
    assert connect.db_option(url, schema) == shown


def test_the_review_names_its_choices_with_the_store_and_business_they_need(tmp_path: Path) -> None:
    """Each choice reconcile prints is a command that reaches the execution, run as printed: its --db, and outside the
    default business its --business."""
    store = SQLiteStore(tmp_path / "shop.db")
    try:
        policy = examples.grants("acme", "user:operator")
        refund = EXAMPLES / "refund_needs_reconciliation.toml"
        definition = parse_definition(refund.read_text(encoding="utf-8"), refund.name)
        service.register(store, definition, "acme", "user:operator", policy)
        service.run(
            store, policy, business_id="acme", principal_id="user:operator",
            definition_id=definition.definition_id, input={"amount": 5, "payment_id": "p-1"}, execution_id="rf-1",
        )  # fmt: skip
        Worker(store, "w-1", policy, examples.handler(), business_id="acme").run_pass()
    finally:
        store.close()
    shown = fencekeeper("reconcile", "--db", tmp_path / "shop.db", "rf-1", "--business", "acme", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    choices = [line.strip() for line in shown.stdout.splitlines() if line.strip().startswith("fencekeeper reconcile")]
    assert len(choices) == 2, shown.stdout  # --settle and --fail
    reaches = f"fencekeeper reconcile --db {shlex.quote(str(tmp_path / 'shop.db'))} --business acme rf-1 --"
    assert all(choice.startswith(reaches) for choice in choices), choices
    # Copied into a shell from another directory, the printed choice acts on the same execution.
    [fail] = [choice for choice in choices if " --fail" in choice]
    chosen = fencekeeper(*shlex.split(fail.replace("[--because TEXT]", ""))[1:], cwd=tmp_path.parent)
    assert chosen.returncode == 0, chosen.stderr
    assert "failed" in chosen.stdout
