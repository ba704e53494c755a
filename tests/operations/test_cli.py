"""``fencekeeper op``: submit, status, history, decide, cancel and worker, with their exit codes and --json."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters import cli, cli_ops
from tests.cli.runner import EXAMPLES, assert_one_error_line, fencekeeper, snapshot


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["op", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def data(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def one_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencekeeper: error: "), err
    return lines[0]


def test_a_transfer_from_submission_to_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "ops.db")
    transfer = '{"from": "acc-1", "to": "acc-2", "amount": 250}'
    first = data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer)
    again = data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer)
    assert first["created"] and not again["created"]
    assert first["operation_id"] == again["operation_id"]
    op_id = first["operation_id"]

    code, _, err = run(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer.replace("250", "251"))
    assert code == 1 and "[idempotency_conflict]" in one_error(err)

    report = data(capsys, "worker", "--db", db, "--until-idle", "--id", "cli")
    assert [(r["operation_id"], r["outcome"]) for r in report["reports"]] == [(op_id, "succeeded")]

    status = data(capsys, "status", op_id, "--db", db)
    assert (status["state"], status["outcome"], status["result"]) == (
        "succeeded", "succeeded", {"from_balance": 9750, "to_balance": 250},
    )
    assert [a["state"] for a in status["attempts"]] == ["succeeded"]
    history = data(capsys, "history", op_id, "--db", db)["history"]
    assert [h["to"] for h in history] == ["admitted", "running", "succeeded"]

    code, _, err = run(capsys, "cancel", op_id, "--db", db)
    assert code == 1 and "[cancel_too_late]" in one_error(err)


def test_an_approval_from_another_principal_lets_the_capture_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ops.db")
    op_id = data(capsys, "submit", "capture_payment", "--db", db, "--key", "c-1", "--input",
                 '{"order": "o-1", "amount": 999}')["operation_id"]
    assert data(capsys, "worker", "--db", db, "--until-idle")["reports"] == []
    code, _, err = run(capsys, "decide", op_id, "--db", db, "--approve", "--as", "users:v1:operator")
    assert code == 1 and "[self_approval]" in one_error(err)
    code, _, err = run(capsys, "decide", op_id, "--db", db, "--approve", "--as", "users:v1:bob", "--digest", "0" * 64)
    assert code == 1 and "[approval_misbound]" in one_error(err)
    decided = data(capsys, "decide", op_id, "--db", db, "--approve", "--as", "users:v1:bob")
    assert (decided["state"], decided["approved_by"]) == ("admitted", "users:v1:bob")
    report = data(capsys, "worker", "--db", db, "--until-idle")
    assert [r["outcome"] for r in report["reports"]] == ["succeeded"]
    status = data(capsys, "status", op_id, "--db", db)
    assert (status["effect_id"], status["effect_unsettled"]) == (f"{op_id}/effect", False)
    code, out, _ = run(capsys, "status", op_id, "--db", db)
    assert code == 0 and f"  external effect id {op_id}/effect (settled)\n" in out


def test_a_refused_cancellation_or_decision_names_the_policy_that_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Neither refusal is the action's authorizer's: the service's own policies (may_cancel, may_decide) decide.
    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.operations.memory import MemoryOperationStore  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableOperationError,
        DurableOperationService,
        PrincipalReference,
    )

    db = str(tmp_path / "ops.db")
    op_id = data(capsys, "submit", "capture_payment", "--db", db, "--key", "c-1", "--as", "users:v1:alice", "--input",
                 '{"order": "o-1", "amount": 999}')["operation_id"]  # fmt: skip
    code, _, err = run(capsys, "cancel", op_id, "--db", db, "--as", "users:v1:bob")
    line = one_error(err)
    assert code == 1 and line.endswith(
        "'users:v1:bob' may not cancel: the cancellation policy refused (may_cancel; by default only the requester "
        "may cancel) [not_authorized]"
    )
    assert "authorizer" not in line

    service = DurableOperationService(
        MemoryOperationStore(), examples.registry(), examples.resolvers(), may_decide=lambda resolution, record: False
    )
    alice, bob = PrincipalReference.parse("users:v1:alice"), PrincipalReference.parse("users:v1:bob")
    admitted = service.submit(
        tenant="t", principal=alice, action="capture_payment", input={"order": "o-1", "amount": 5}, client_key="k"
    )
    with pytest.raises(DurableOperationError) as raised:
        service.decide(admitted.operation_id, approver=bob, approve=True)
    assert (raised.value.code, raised.value.message) == (
        "not_authorized", "'users:v1:bob' may not decide this operation: the decision policy refused (may_decide)"
    )


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_service_refuses_a_cancellation_reason_over_2000_characters_and_writes_nothing(
    tmp_path: Path, kind: str
) -> None:
    from fencekeeper.adapters.operations import examples  # noqa: PLC0415
    from fencekeeper.adapters.operations.memory import MemoryOperationStore  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableOperationError,
        DurableOperationService,
        PrincipalReference,
    )
    from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore  # noqa: PLC0415

    store = MemoryOperationStore() if kind == "memory" else SQLiteOperationStore(tmp_path / "ops.db")
    try:
        service = DurableOperationService(store, examples.registry(), examples.resolvers())
        alice = PrincipalReference.parse("users:v1:alice")
        admitted = service.submit(
            tenant="t", principal=alice, action="capture_payment", input={"order": "o-1", "amount": 5}, client_key="k"
        )
        before = service.history(admitted.operation_id)
        with pytest.raises(DurableOperationError) as raised:
            service.cancel(admitted.operation_id, principal=alice, reason="é" * 2001)
        assert (raised.value.code, raised.value.field, raised.value.message) == (
            "invalid_request", "reason", "reason: must be at most 2000 characters, got 2001"
        )
        assert service.history(admitted.operation_id) == before
        # Characters, not bytes: 2,000 of them, 4,000 bytes in UTF-8, are a reason.
        cancelled = service.cancel(admitted.operation_id, principal=alice, reason="é" * 2000)
        assert cancelled.state.value == "cancelled"
        assert service.history(admitted.operation_id)[-1].reason == "é" * 2000
    finally:
        store.close()


TRANSFER = '{"from": "acc-1", "to": "acc-2", "amount": 5}'

# (arguments, exit code, what the error names on a path with no database, and on an existing store)
BAD_INPUT = [
    (("submit", "nope", "--key", "k"), 2, "[unknown_action]", None),
    (("submit", "transfer", "--key", "k", "--input", "{bad"), 2, "--input: not valid JSON", None),
    (("submit", "transfer", "--key", "k", "--input", '{"from": "a", "to": "a", "amount": 1}'), 2, "[invalid_input]", None),
    # docs/operations.md's normaliser given a list raises AttributeError: still the input's fault.
    (("submit", "transfer", "--key", "k", "--input", "[1]", "--actions", "tests.operations.docs_actions"), 2,
     "input: rejected by transfer v1: AttributeError: 'list' object has no attribute 'get' [invalid_input]", None),
    (("submit", "transfer", "--key", "k", "--version", "9"), 2, "[unknown_action]", None),
    # A lone surrogate that the normaliser lets through has no UTF-8 form: the input's fault, not an internal error.
    (("submit", "transfer", "--key", "k", "--input", '{"from": "\\ud800", "to": "acc-2", "amount": 5}', "--actions",
      "tests.operations.docs_actions"), 2, "input: contains an unpaired surrogate (U+D800)", None),
    (("submit", "transfer", "--key", "k", "--input", "[" * 100_000 + "]" * 100_000), 2,
     "--input: not valid JSON: nested too deeply", None),
    (("submit", "transfer", "--key", "k", "--as", "alice"), 2, "RESOLVER:vVERSION:SUBJECT", None),
    # Read as every JSON option of the command line reads (adapters/cli.py): inline, @FILE or - (stdin).
    (("submit", "transfer", "--key", "k", "--input", "@/nonexistent/transfer.json"), 2,
     "--input: /nonexistent/transfer.json: cannot read: No such file or directory", None),
    (("submit", "transfer", "--key", "k", "--input", '{"from": "acc-1", "to": "acc-2", "amount": NaN}'), 2,
     "--input: not valid JSON: NaN is not a JSON number", None),
    (("submit", "transfer", "--key", "k", "--input", '{"from": "acc-1", "to": "acc-2", "amount": 5, "amount": 500}'),
     2, "--input: not valid JSON: duplicate key 'amount' in an object", None),
    (("submit", "transfer", "--key", "bad key", "--input", TRANSFER), 2, "client_key: malformed", None),
    (("submit", "transfer", "--key", "k", "--input", TRANSFER, "--tenant", "a b"), 2, "tenant: malformed", None),
    (("submit", "transfer", "--key", "k", "--input", TRANSFER, "--namespace", "a b"), 2, "--namespace: malformed", None),
    (("submit", "transfer", "--key", "k", "--actions", "no.such.module"), 2, "--actions", None),
    # The module's own fault, checked before anything is opened: not an internal error, nor a claim and then a crash.
    (("submit", "transfer", "--key", "k", "--input", TRANSFER, "--actions", "tests.operations.broken_actions"), 2,
     "--actions: tests.operations.broken_actions.registry() returned tuple, not a DurableActionRegistry", None),
    (("worker", "--until-idle", "--actions", "tests.operations.broken_actions"), 2,
     "--actions: tests.operations.broken_actions.registry() returned tuple, not a DurableActionRegistry", None),
    # Decided only by the store, once opened: a principal no resolver knows.
    (("submit", "transfer", "--key", "k", "--input", TRANSFER, "--as", "nobody:v1:x"), 1, "[not_authorized]", None),
    # Checked before the store is opened, as for submit: a worker with a lease no store or thread can use.
    (("worker", "--until-idle", "--lease", "nan"), 2, "--lease: must be a positive number of seconds", None),
    (("worker", "--until-idle", "--lease", "inf"), 2, "--lease: must be a positive number of seconds", None),
    (("worker", "--until-idle", "--lease", "86401"), 2, "--lease: must be a positive number of seconds", None),
    # Positive, yet no timedelta: each worker thread refused it as it started, and the command exited 0.
    (("worker", "--until-idle", "--lease", "1e-9"), 2, "--lease: must be at least a microsecond, got 1e-09 s", None),
    (("worker", "--until-idle", "--poll", "nan"), 2, "--poll: must be a positive number of seconds", None),
    # Each worker thread refused these as it started: a traceback per thread, and exit 0.
    (("worker", "--until-idle", "--tenant", "a b"), 2, "--tenant: malformed identifier", None),
    (("worker", "--until-idle", "--id", "a b"), 2, "--id: malformed identifier", None),
    # As `fencekeeper worker` checks them: an empty --id, one too long to number every thread of every process, and
    # more threads than one process can use.
    (("worker", "--until-idle", "--id", ""), 2, "--id: malformed identifier ''", None),
    (("worker", "--until-idle", "--id", "w" * 126, "--processes", "2", "--concurrency", "5"), 2,
     "is too long to name workers", None),
    (("worker", "--until-idle", "--concurrency", "65"), 2, "--concurrency: must be between 1 and 64", None),
    (("status", "op-missing"), 2, "no database at", "[operation_not_found]"),
    (("history", "op-missing"), 2, "no database at", "[operation_not_found]"),
    (("cancel", "op-missing"), 2, "no database at", "[operation_not_found]"),
    # {op} is the operation the store holds.  A reason is at most as long as a workflow execution's review decision's
    # rationale (2,000 characters); a longer one was kept in the transition.
    (("cancel", "{op}", "--reason", "x" * 2001), 2, "no database at",
     "reason: must be at most 2000 characters, got 2001 [invalid_request]"),
    (("cancel", "{op}", "--reason", "é" * 2001), 2, "no database at", "got 2001 [invalid_request]"),
    (("decide", "op-missing", "--approve", "--as", "users:v1:bob"), 2, "no database at", "[operation_not_found]"),
]


@pytest.mark.parametrize(("args", "code", "fragment"), [case[:3] for case in BAD_INPUT])
def test_bad_input_on_a_new_path_is_one_line_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, fragment: str
) -> None:
    result, _, err = run(capsys, *args, "--db", str(tmp_path / "ops.db"))
    assert result == code
    assert fragment in one_error(err)
    assert snapshot(tmp_path) == {}, "the refused command left a file behind"


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_to_a_store_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[tuple[str, ...], int, str, str | None]
) -> None:
    args, code, new, fragment = case
    db = str(tmp_path / "ops.db")
    op_id = data(capsys, "submit", "transfer", "--db", db, "--key", "k", "--input", TRANSFER)["operation_id"]
    before = snapshot(tmp_path)
    assert list(before) == ["ops.db"]
    result, _, err = run(capsys, *(arg.replace("{op}", op_id) for arg in args), "--db", db)
    assert result == code
    assert (fragment or new) in one_error(err)
    assert snapshot(tmp_path) == before
    # The identity is taken: other input under it is refused, and that writes nothing either.
    result, _, err = run(capsys, "submit", "transfer", "--db", db, "--key", "k", "--input", TRANSFER.replace("5", "6"))
    assert result == 1 and "[idempotency_conflict]" in one_error(err)
    assert snapshot(tmp_path) == before


def test_submit_reads_its_input_inline_from_a_file_or_from_stdin_as_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--input @FILE` was taken as JSON text ("not valid JSON: Expecting value"), and `-` too.
    db = str(tmp_path / "ops.db")
    (tmp_path / "transfer.json").write_text(TRANSFER, encoding="utf-8")
    inline = data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", TRANSFER)
    from_file = data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", f"@{tmp_path}/transfer.json")
    piped = fencekeeper("op", "submit", "transfer", "--db", "ops.db", "--key", "t-1", "--input", "-", "--json",
                        cwd=tmp_path, stdin=TRANSFER)  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    # The same input: the same operation, found again.
    assert inline["created"] and not from_file["created"] and not json.loads(piped.stdout)["created"]
    assert from_file["operation_id"] == json.loads(piped.stdout)["operation_id"] == inline["operation_id"]
    assert from_file["input"] == inline["input"] == {"from": "acc-1", "to": "acc-2", "amount": 5}

    # A file that cannot be read, or empty stdin, is the error `fencekeeper run` gives, and writes nothing.
    before = snapshot(tmp_path)
    (tmp_path / "folder.json").mkdir()
    purchase = str(EXAMPLES / "purchase_approval.toml")
    for given in (f"@{tmp_path}/missing.json", f"@{tmp_path}/folder.json"):
        code, out, err = run(capsys, "submit", "transfer", "--db", db, "--key", "t-2", "--input", given)
        assert (code, out) == (2, "")
        assert cli.main(["run", purchase, "--db", db, "--input", given]) == 2
        assert one_error(err) == one_error(capsys.readouterr().err)
    empty = fencekeeper("op", "submit", "transfer", "--db", "ops.db", "--key", "t-2", "--input", "-", cwd=tmp_path,
                        stdin="")  # fmt: skip
    assert assert_one_error_line(empty, 2) == (
        "fencekeeper: error: --input: stdin: not valid JSON: Expecting value (line 1, column 1)"
    )
    (tmp_path / "folder.json").rmdir()
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args", [("submit", "transfer", "--key", "k", "--input", TRANSFER), ("status", "op-x"), ("check",)])
def test_an_actions_module_whose_registry_raises_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    from fencekeeper.adapters.operations import examples  # noqa: PLC0415

    db = str(tmp_path / "ops.db")
    data(capsys, "submit", "transfer", "--db", db, "--key", "first", "--input", TRANSFER)
    before = snapshot(tmp_path)

    def unconfigured() -> None:
        raise RuntimeError("the directory is not\nconfigured")

    monkeypatch.setattr(examples, "resolvers", unconfigured)
    result, out, err = run(capsys, *args, "--db", db)
    assert (result, out) == (2, "")
    assert one_error(err).endswith(
        f"--actions: {cli_ops.DEFAULT_ACTIONS}.resolvers() raised RuntimeError: the directory is not configured"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "args",
    [
        ("check", "--namespace", "default", "--tenant", "default"),
        ("serve", "--auth", "tests.http.deployment", "--port", "1"),
    ],
)
def test_check_and_serve_take_an_actions_module_as_op_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    # `fencekeeper check` was an internal error on it, and `serve` served an app whose every operation would fail.
    import uvicorn  # noqa: PLC0415

    def served(*args: object, **kwargs: object) -> None:
        raise AssertionError("serve started serving")

    monkeypatch.setattr(uvicorn, "run", served)
    db = str(tmp_path / "ops.db")
    data(capsys, "submit", "transfer", "--db", db, "--key", "first", "--input", TRANSFER)
    before = snapshot(tmp_path)
    code = cli.main([*args, "--db", db, "--actions", "tests.operations.broken_actions"])
    err = capsys.readouterr().err
    assert code == 2
    assert one_error(err).endswith(
        "--actions: tests.operations.broken_actions.registry() returned tuple, not a DurableActionRegistry"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "args",
    [("worker", "--until-idle"), ("worker", "--until-idle", "--processes", "2"), ("status", "op-x"), ("check",)],
)
def test_a_db_path_that_does_not_exist_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    # A mistyped --db: as `fencekeeper inspect` and `journal show`, not an empty store and a worker finding nothing.
    result, out, err = run(capsys, *args, "--db", str(tmp_path / "typo.db"))
    assert result == 2 and out == ""
    line = one_error(err)
    assert "no database" in line and str(tmp_path / "typo.db") in line
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("command", ["status", "history"])
def test_status_and_history_do_not_migrate_the_file_they_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # As `fencekeeper inspect`: a command that only reads refused an empty (unmigrated) file only after migrating it.
    (tmp_path / "ops.db").touch()
    result, out, err = run(capsys, command, "op-x", "--db", str(tmp_path / "ops.db"))
    assert result == 1 and out == ""
    assert "it is not migrated when only read" in one_error(err) and "[schema_outdated]" in err
    assert snapshot(tmp_path) == {"ops.db": b""}


def test_a_submission_creates_a_new_file_holding_only_what_it_admitted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ops.db")
    op_id = data(capsys, "submit", "transfer", "--db", db, "--key", "k", "--input", TRANSFER)["operation_id"]
    assert list(snapshot(tmp_path)) == ["ops.db"], "a scratch file or a journal was left beside the store"
    assert data(capsys, "status", op_id, "--db", db)["state"] == "admitted"
    assert [r["operation_id"] for r in data(capsys, "worker", "--db", db, "--until-idle")["reports"]] == [op_id]


def test_a_file_created_meanwhile_is_kept_and_the_submission_goes_into_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fencekeeper.adapters.cli_ops import _submit_new_file  # noqa: PLC0415 - the step under test

    db = tmp_path / "ops.db"
    admitted: list[str] = []

    def submit(url: str) -> Any:
        if url != str(db) and not db.exists():
            # Another command creates the file between this one's look and its link.
            admitted.append(data(capsys, "submit", "transfer", "--db", str(db), "--key", "other", "--input", TRANSFER)["operation_id"])
        assert cli.main(["op", "submit", "transfer", "--db", url, "--key", "k", "--input", TRANSFER, "--json"]) == 0
        answer = json.loads(capsys.readouterr().out)
        admitted.append(answer["operation_id"])
        return answer

    _submit_new_file(db, submit)
    assert list(snapshot(tmp_path)) == ["ops.db"]
    other, scratch, kept = admitted
    assert data(capsys, "status", other, "--db", str(db))["state"] == "admitted"
    assert data(capsys, "status", kept, "--db", str(db))["state"] == "admitted"
    code, _, err = run(capsys, "status", scratch, "--db", str(db))
    assert code == 2 and "[operation_not_found]" in one_error(err)


def test_any_normaliser_failure_is_invalid_input_naming_the_action() -> None:
    from fencekeeper.adapters.operations.memory import MemoryOperationStore  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableOperationError,
        DurableOperationService,
        PrincipalReference,
    )
    from tests.operations import docs_actions  # noqa: PLC0415

    store = MemoryOperationStore()
    service = DurableOperationService(store, docs_actions.registry(), docs_actions.resolvers())
    for payload, named in (([1], "AttributeError: 'list' object has no attribute 'get'"), ({"amount": 5}, "'from'")):
        with pytest.raises(DurableOperationError) as raised:
            service.submit(
                tenant="t", principal=PrincipalReference.parse("users:v1:alice"), action="transfer", input=payload,
                client_key="k",
            )  # fmt: skip
        assert raised.value.code == "invalid_input"
        assert raised.value.message == f"input: rejected by transfer v1: {named}"
    assert store.operation_ids() == []


def test_an_input_the_store_could_not_keep_is_invalid_input_and_nothing_is_written() -> None:
    from fencekeeper.adapters.operations.memory import MemoryOperationStore  # noqa: PLC0415
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableOperationError,
        DurableOperationService,
        PrincipalReference,
    )
    from tests.operations import docs_actions  # noqa: PLC0415

    store = MemoryOperationStore()
    service = DurableOperationService(store, docs_actions.registry(), docs_actions.resolvers())
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    for payload, named in (
        ({"from": "acc-1", "to": "\udc00", "amount": 5}, "contains an unpaired surrogate (U+DC00)"),
        ({"from": "acc-1", "to": deep, "amount": 5}, "not JSON: nested too deeply"),
    ):
        with pytest.raises(DurableOperationError) as raised:
            service.submit(
                tenant="t", principal=PrincipalReference.parse("users:v1:alice"), action="transfer", input=payload,
                client_key="k",
            )  # fmt: skip
        assert raised.value.code == "invalid_input"
        assert named in raised.value.message
    assert store.operation_ids() == []


@pytest.mark.parametrize(
    "args", [("--debug", "op", "status", "op-x"), ("op", "status", "op-x", "--debug"), ("op", "--debug", "history", "x")]
)
def test_debug_before_or_after_an_op_subcommand_shows_the_traceback(tmp_path: Path, args: tuple[str, ...]) -> None:
    # As for every other command (adapters/cli.py): --debug before or after the command name.
    result = fencekeeper(*args, "--db", tmp_path / "none.db", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "no database at" in result.stderr
    assert snapshot(tmp_path) == {}


def test_an_unreachable_postgresql_is_one_line_at_once(tmp_path: Path) -> None:
    # The pool alone would retry for its whole timeout (about 10 s) and log its warnings first.
    url = "postgresql://nobody@127.0.0.1:1/x"
    for args in (("status", "op-x"), ("worker", "--until-idle"), ("submit", "transfer", "--key", "k", "--input", TRANSFER)):
        started = time.monotonic()
        result = fencekeeper("op", *args, "--db", url, cwd=tmp_path)
        seconds = time.monotonic() - started
        line = assert_one_error_line(result, 2)
        assert "--db: cannot connect to PostgreSQL" in line and "port=1" in line
        # Well under the pool's 10 s, with room for a process start-up on a loaded machine (one took 5.4 s).
        assert seconds < 8, f"op {args[0]} took {seconds:.1f} s to give up"


def test_the_deployment_check_blocks_on_a_missing_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "ops.db")
    data(capsys, "submit", "balance", "--db", db, "--key", "b-1", "--input", '{"account": "acc-1"}')
    assert data(capsys, "check", "--db", db) == {
        "ok": True, "missing_actions": [], "missing_resolvers": [], "unreadable_principals": [],
        "blocking": [], "warnings": [],
    }
    code, out, _ = run(capsys, "check", "--db", db, "--actions", "tests.operations.empty_actions")
    assert code == 1
    assert "action balance v1 is not registered" in out
    assert "principal resolver users v1 is not registered" in out


def test_op_check_is_the_deployment_check_for_its_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "ops.db")
    data(capsys, "submit", "balance", "--db", db, "--key", "b-1", "--input", '{"account": "acc-1"}', "--tenant", "acme")
    before = (tmp_path / "ops.db").read_bytes()
    empty = ("--actions", "tests.operations.empty_actions")
    code, out, _ = run(capsys, "check", "--db", db, "--tenant", "acme", *empty, "--json")
    narrow = json.loads(out)
    assert code == 1 and narrow["missing_actions"] == [{"name": "balance", "version": 1}]
    assert narrow["missing_resolvers"] == [{"name": "users", "version": 1}]
    # Word for word what `fencekeeper check` blocks on for the same tenant: one check, two shapes.
    assert cli.main(["check", "--db", db, "--tenant", "acme", *empty, "--json"]) == 1
    assert narrow["blocking"] == json.loads(capsys.readouterr().out)["blocking"]
    # Per tenant, as the whole check is: the default tenant has nothing open.
    assert data(capsys, "check", "--db", db, *empty)["ok"] is True
    assert (tmp_path / "ops.db").read_bytes() == before, "the check wrote to the store"


def test_op_check_blocks_on_what_the_narrower_check_could_not_see(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ops.db"
    data(capsys, "submit", "balance", "--db", str(db), "--key", "b-1", "--input", '{"account": "acc-1"}')
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', '-', '2099-01-01T00:00:00Z')")
    conn.close()
    code, out, _ = run(capsys, "check", "--db", str(db), "--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["missing_actions"] == []
    assert any("99" in b or "newer" in b for b in report["blocking"]), report["blocking"]
    # No usable store: one error line and exit 2, as every op command; and no file is created.
    code, _, err = run(capsys, "check", "--db", str(tmp_path / "absent.db"))
    assert code == 2 and one_error(err)
    assert not (tmp_path / "absent.db").exists()


def test_op_worker_sessions_lose_a_stalled_transaction_within_the_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fencekeeper.adapters import cli_ops  # noqa: PLC0415

    db = str(tmp_path / "ops.db")
    assert data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", '{"from": "acc-1", "to": "acc-2", "amount": 1}')
    opened: list[dict[str, Any]] = []
    real = cli_ops.open_operation_store

    def recording(url: str, **options: Any) -> Any:
        opened.append(options)
        return real(url, **options)

    monkeypatch.setattr(cli_ops, "open_operation_store", recording)
    assert data(capsys, "worker", "--db", db, "--until-idle", "--lease", "7")["reports"]
    assert [o["idle_in_transaction_timeout"] for o in opened] == [7.0]


def test_the_idle_timeout_reaches_the_postgresql_session(pg_dsn: str, pg_schema: str) -> None:
    from fencekeeper.adapters.operations.connect import open_operation_store  # noqa: PLC0415

    store = open_operation_store(f"{pg_dsn}?schema={pg_schema}", idle_in_transaction_timeout=7)
    try:
        with store._pool.connection() as conn:  # type: ignore[attr-defined]
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("7s",)
    finally:
        store.close()


def test_submit_keeps_the_identity_for_the_retention_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "ops.db")
    transfer = '{"from": "acc-1", "to": "acc-2", "amount": 5}'
    month = 30 * 86_400
    admitted = data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer, "--retention", str(month))
    with sqlite3.connect(db) as conn:
        kept, created = conn.execute(
            "SELECT i.retain_until, o.admitted_at FROM operation_identities i JOIN operations o USING (operation_id) "
            "WHERE o.operation_id = ?",
            (admitted["operation_id"],),
        ).fetchone()
    from datetime import datetime  # noqa: PLC0415

    assert (datetime.fromisoformat(kept) - datetime.fromisoformat(created)).total_seconds() == month
    for bad in ("0", "-5", "nan", str(11 * 366 * 86_400)):
        before = sorted(p.name for p in tmp_path.iterdir())
        code, _, err = run(capsys, "submit", "transfer", "--db", db, "--key", "t-2", "--input", transfer, "--retention", bad)
        assert code == 2 and one_error(err).startswith("fencekeeper: error: --retention: "), (bad, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_op_worker_rides_out_a_lost_connection_and_exits_1_on_an_error_it_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker thread that ended on a store error used to end quietly: the command exited 0 once
    # every thread had, and a supervisor restarting failed processes saw nothing to restart.
    from fencekeeper.adapters.operations.worker import DurableOperationWorker  # noqa: PLC0415
    from fencekeeper.adapters.store import StoreError  # noqa: PLC0415

    db = str(tmp_path / "ops.db")
    transfer = '{"from": "acc-1", "to": "acc-2", "amount": 5}'
    op_id = data(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer)["operation_id"]
    real = DurableOperationWorker.run_once
    raised: list[str] = []

    def flaky(self: DurableOperationWorker) -> Any:
        if len(raised) < 2:
            raised.append("store_unavailable")
            raise StoreError("store_unavailable", "PostgreSQL connection failed: the connection is closed")
        return real(self)

    monkeypatch.setattr(DurableOperationWorker, "run_once", flaky)
    report = data(capsys, "worker", "--db", db, "--until-idle")
    assert raised == ["store_unavailable"] * 2
    assert [(r["operation_id"], r["outcome"]) for r in report["reports"]] == [(op_id, "succeeded")]
    assert report["stopped_by"] == "idle" and "errors" not in report

    def broken(self: DurableOperationWorker) -> Any:
        raise StoreError("schema_altered", "the operations table has changed under this worker")

    monkeypatch.setattr(DurableOperationWorker, "run_once", broken)
    code, out, err = run(capsys, "worker", "--db", db, "--until-idle", "--concurrency", "2", "--json")
    assert code == 1
    assert json.loads(out)["stopped_by"] == "error"
    assert "[schema_altered]" in one_error(err)


def test_a_file_another_writer_holds_is_store_locked_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As PostgreSQL's row_locked and the executions' store_locked: the store is there and the request is refused for
    # now (exit 1), not a --db that names nothing usable (store_unavailable, exit 2).
    from fencekeeper.adapters import sqlite_store  # noqa: PLC0415
    from fencekeeper.adapters.operations import sqlite as operations_sqlite  # noqa: PLC0415

    db = tmp_path / "ops.db"
    op_id = data(capsys, "submit", "capture_payment", "--db", str(db), "--key", "c-1", "--as", "users:v1:alice",
                 "--input", '{"order": "o-1", "amount": 5}')["operation_id"]  # fmt: skip
    # A fifth of a second's wait for the lock rather than the store's ten.
    monkeypatch.setattr(operations_sqlite, "_open", lambda path: sqlite_store._open(path, 0.2))
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        for args in (("cancel", op_id, "--as", "users:v1:alice"), ("decide", op_id, "--approve", "--as", "users:v1:bob")):
            code, out, err = run(capsys, *args, "--db", str(db))
            line = one_error(err)
            assert (code, out) == (1, ""), line
            assert "the database is locked by another writer" in line and line.endswith("[store_locked]")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert data(capsys, "status", op_id, "--db", str(db))["state"] == "awaiting_approval"


def test_status_shows_the_stored_approval_decision_rejected_or_consumed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rejected operation's status names its rejecter (not "none yet"); an approval shows its expiry and consumption."""
    db = str(tmp_path / "ops.db")
    rejected = data(capsys, "submit", "capture_payment", "--db", db, "--key", "c-1", "--input",
                    '{"order": "o-1", "amount": 1}')["operation_id"]
    data(capsys, "decide", rejected, "--db", db, "--reject", "--as", "users:v1:bob", "--id", "ap-r")
    status = data(capsys, "status", rejected, "--db", db)
    assert status["approved_by"] is None
    assert {k: status["approval"][k] for k in ("approval_id", "approver", "approved", "consumed_by_attempt")} == {
        "approval_id": "ap-r", "approver": "users:v1:bob", "approved": False, "consumed_by_attempt": None,
    }
    code, out, _ = run(capsys, "status", rejected, "--db", db)
    assert code == 0 and "none yet" not in out and "  approval: rejected by users:v1:bob" in out

    approved = data(capsys, "submit", "capture_payment", "--db", db, "--key", "c-2", "--input",
                    '{"order": "o-2", "amount": 1}')["operation_id"]
    assert data(capsys, "status", approved, "--db", db)["approval"] is None
    data(capsys, "decide", approved, "--db", db, "--approve", "--as", "users:v1:bob", "--id", "ap-a")
    data(capsys, "worker", "--db", db, "--until-idle")
    status = data(capsys, "status", approved, "--db", db)
    assert (status["approval"]["approved"], status["approval"]["consumed_by_attempt"]) == (True, 1)
    code, out, _ = run(capsys, "status", approved, "--db", db)
    assert f"  approval: approved by users:v1:bob until {status['approval']['expires_at']}, consumed by attempt 1" in out


def test_the_worker_names_no_attempt_for_an_operation_that_ended_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An approval that expired before any attempt used it ends the operation with no attempt made.
    db = str(tmp_path / "ops.db")
    op_id = data(capsys, "submit", "capture_payment", "--db", db, "--key", "c-1", "--input",
                 '{"order": "o-1", "amount": 999}')["operation_id"]
    data(capsys, "decide", op_id, "--db", db, "--approve", "--as", "users:v1:bob", "--expires", "1")
    time.sleep(1.2)
    code, _, err = run(capsys, "worker", "--db", db, "--until-idle")
    assert code == 0
    assert f": {op_id}: approval_expired\n" in err and "None" not in err, err
    assert run(capsys, "submit", "transfer", "--db", db, "--key", "t-1", "--input", TRANSFER)[0] == 0
    code, _, err = run(capsys, "worker", "--db", db, "--until-idle")
    assert code == 0 and " attempt 1: succeeded\n" in err, err


def test_a_row_edited_into_a_contradiction_is_one_error_line_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admitted row with an owner left over: every command that reads it names the operation and the field."""
    db = str(tmp_path / "ops.db")
    op_id = data(capsys, "submit", "transfer", "--db", db, "--key", "k", "--input", TRANSFER)["operation_id"]

    def operation_rows() -> list[list[tuple[Any, ...]]]:
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            return [
                sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
                for table in ("operations", "operation_identities", "operation_attempts", "operation_transitions",
                              "outbox")
            ]
        finally:
            conn.close()

    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("UPDATE operations SET owner = 'w-old' WHERE operation_id = ?", (op_id,))
    finally:
        conn.close()

    def refused(*args: str) -> None:
        code, _, err = run(capsys, *args, "--db", db)
        line = one_error(err)
        assert code == 1, (args, line)
        assert "[malformed_row]" in line and f"operation {op_id!r}: owner: " in line, (args, line)

    # The worker creates the teaching examples' account tables first (their prepare), then passes over the row.
    rows = operation_rows()
    code, _, err = run(capsys, "worker", "--until-idle", "--db", db)
    assert code == 1 and err.splitlines()[-1].startswith("fencekeeper: error: ") and "[malformed_row]" in err, err
    assert operation_rows() == rows
    before = snapshot(tmp_path)
    for args in (("cancel", op_id), ("status", op_id), ("submit", "transfer", "--key", "k", "--input", TRANSFER)):
        refused(*args)
        assert snapshot(tmp_path) == before, args


OWNER_LEFT_OVER = "UPDATE operations SET owner = 'w-old' WHERE operation_id = ?"


@pytest.fixture(params=["sqlite", "postgres"])
def ops_db(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[..., Any]]:
    """A --db for the worker, and how to hand-edit an operation's rows (by default: an admitted row keeps an owner).

    ``damage(op_id, sql)`` runs ``sql`` (``?`` the operation's id; None: nothing) and returns what is stored of the
    operation.
    """
    tables = ("operations", "operation_attempts", "operation_transitions")
    if request.param == "sqlite":
        path = str(tmp_path / "ops.db")

        def damage_sqlite(op_id: str, sql: str | None = OWNER_LEFT_OVER) -> Any:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                if sql is not None:
                    conn.execute(sql, (op_id,))
                return [conn.execute(f"SELECT * FROM {t} WHERE operation_id = ?", (op_id,)).fetchall() for t in tables]
            finally:
                conn.close()

        return path, damage_sqlite
    dsn: str = request.getfixturevalue("pg_dsn")
    schema: str = request.getfixturevalue("pg_schema")

    def damage_postgres(op_id: str, sql: str | None = OWNER_LEFT_OVER) -> Any:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            if sql is not None:
                conn.execute(sql.replace("?", "%s"), (op_id,))
            return [
                conn.execute(f"SELECT * FROM {t} WHERE operation_id = %s ORDER BY 2", (op_id,)).fetchall()
                for t in tables
            ]

    return f"{dsn}?schema={schema}", damage_postgres


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_the_worker_passes_over_a_malformed_row_runs_the_rest_and_exits_1_when_idle(
    capsys: pytest.CaptureFixture[str], ops_db: tuple[str, Callable[..., Any]], as_json: bool
) -> None:
    db, damage = ops_db
    submitted = [
        data(capsys, "submit", "transfer", "--db", db, "--key", key, "--input", TRANSFER)["operation_id"]
        for key in ("k-bad", "k-good-1", "k-good-2")
    ]
    bad, good = submitted[0], submitted[1:]
    row = damage(bad)

    code, out, err = run(capsys, "worker", "--db", db, "--until-idle", *(["--json"] if as_json else []))

    assert code == 1, err
    lines = err.splitlines()
    # The last line says the run ended with a row passed over, naming it and the code; nothing else is an error.
    assert lines[-1].startswith("fencekeeper: error: ") and bad in lines[-1] and lines[-1].endswith("[malformed_row]")
    assert [line for line in lines if line.startswith("fencekeeper: error: ")] == lines[-1:]
    assert damage(bad) == row, "the malformed row was changed"
    for op_id in good:
        assert data(capsys, "status", op_id, "--db", db)["outcome"] == "succeeded"
    if as_json:
        report = json.loads(out)
        assert report["stopped_by"] == "idle" and "errors" not in report
        assert report["malformed"] == [bad]
        outcomes = {r["operation_id"]: r["outcome"] for r in report["reports"]}
        assert outcomes == {bad: "malformed_row", **dict.fromkeys(good, "succeeded")}
        passed = next(r for r in report["reports"] if r["operation_id"] == bad)
        assert f"operation {bad!r}: owner: " in passed["detail"]
        assert lines == lines[-1:]
    else:
        # Reported once, as one line naming the operation, the code and the field, then the others ran.
        reported = [line for line in lines if f": {bad}: " in line]
        assert len(reported) == 1 and ": malformed_row: " in reported[0] and "owner: " in reported[0], lines
        assert sum(": succeeded" in line for line in lines) == 2, lines


def test_the_worker_passes_over_an_input_that_is_not_json_without_using_an_attempt(
    capsys: pytest.CaptureFixture[str], ops_db: tuple[str, Callable[..., Any]]
) -> None:
    """The claim reads the input before it commits: no traceback, no attempt used, the tenant's other work runs."""
    db, damage = ops_db
    bad, good = (
        data(capsys, "submit", "transfer", "--db", db, "--key", key, "--input", TRANSFER)["operation_id"]
        for key in ("k-bad", "k-good")
    )
    rows = damage(bad, "UPDATE operations SET input = '{not json' WHERE operation_id = ?")

    code, _, err = run(capsys, "worker", "--db", db, "--until-idle")

    assert code == 1, err
    lines = err.splitlines()
    assert lines[-1].startswith("fencekeeper: error: ") and bad in lines[-1] and lines[-1].endswith("[malformed_row]")
    reported = [line for line in lines if f": {bad}: " in line]
    assert len(reported) == 1 and ": malformed_row: " in reported[0] and "input: " in reported[0], lines
    assert "Traceback" not in err
    assert damage(bad, None) == rows, "the row with the damaged input was changed"
    assert data(capsys, "status", good, "--db", db)["outcome"] == "succeeded"
    code, _, err = run(capsys, "status", bad, "--db", db)
    line = one_error(err)
    assert code == 1 and "[malformed_row]" in line and f"operation {bad!r}: input: " in line, line
    assert [h["to"] for h in data(capsys, "history", bad, "--db", db)["history"]] == ["admitted"]


@pytest.mark.parametrize(
    ("column", "sql"),
    [
        ("operation_attempts.state", "UPDATE operation_attempts SET state = 'bogus' WHERE operation_id = ?"),
        (
            "operation_transitions.event",
            "INSERT INTO operation_transitions (operation_id, revision, event, from_state, to_state, at, actor, fence, "
            "reason) SELECT operation_id, 99, 'bogus', from_state, to_state, at, actor, fence, reason "
            "FROM operation_transitions WHERE operation_id = ? AND revision = 1",
        ),
    ],
    ids=["attempt state", "transition event"],
)
def test_status_and_history_of_a_damaged_attempt_or_transition_are_one_error_line(
    capsys: pytest.CaptureFixture[str], ops_db: tuple[str, Callable[..., Any]], column: str, sql: str
) -> None:
    db, damage = ops_db
    op_id = data(capsys, "submit", "transfer", "--db", db, "--key", "k", "--input", TRANSFER)["operation_id"]
    assert run(capsys, "worker", "--db", db, "--until-idle")[0] == 0
    rows = damage(op_id, sql)
    for command in ("status", "history"):
        for as_json in ([], ["--json"]):
            code, out, err = run(capsys, command, op_id, "--db", db, *as_json)
            line = one_error(err)
            assert code == 1 and out == "", (command, out)
            assert line.endswith("[malformed_row]") and f"operation {op_id!r}: {column}: " in line, line
    assert damage(op_id, None) == rows


def test_deployment_modules_are_found_beside_where_the_command_runs(tmp_path: Path) -> None:
    # As --handler and `python -m` find them: a deployment's own, uninstalled modules in the current directory.
    (tmp_path / "my_actions.py").write_text(
        "from fencekeeper.adapters.operations.examples import registry, resolvers\n", encoding="utf-8"
    )
    (tmp_path / "my_auth.py").write_text("def policy():\n    return None\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    submitted = fencekeeper(
        "op", "submit", "transfer", "--db", "ops.db", "--key", "k-1", "--input", TRANSFER, "--actions", "my_actions",
        "--json", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["created"] is True
    # serve imports --auth the same way: found, and then judged on what it holds.
    line = assert_one_error_line(
        fencekeeper("serve", "--db", "ops.db", "--auth", "my_auth", "--port", "8765", cwd=tmp_path, env=env), 2
    )
    assert line == "fencekeeper: error: --auth: my_auth has no authenticate(request) function", line
