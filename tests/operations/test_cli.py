"""``fencekeeper op``: submit, status, history, decide, cancel and worker, with their exit codes and --json."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import cli


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
    assert status["effect_id"] == f"{op_id}/effect"


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (("submit", "nope", "--key", "k"), 2, "[unknown_action]"),
        (("submit", "transfer", "--key", "k", "--input", "{bad"), 2, "--input: not valid JSON"),
        (("submit", "transfer", "--key", "k", "--input", '{"from": "a", "to": "a", "amount": 1}'), 2, "[invalid_input]"),
        (("submit", "transfer", "--key", "k", "--version", "9"), 2, "[unknown_action]"),
        (("submit", "transfer", "--key", "k", "--as", "alice"), 2, "RESOLVER:vVERSION:SUBJECT"),
        (("status", "op-missing"), 2, "[operation_not_found]"),
        (("cancel", "op-missing"), 2, "[operation_not_found]"),
        (("submit", "transfer", "--key", "k", "--actions", "no.such.module"), 2, "--actions"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: int, fragment: str
) -> None:
    db = str(tmp_path / "ops.db")
    result, _, err = run(capsys, *args, "--db", db)
    assert result == code
    assert fragment in one_error(err)
    assert data(capsys, "worker", "--db", db, "--until-idle")["reports"] == []


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
