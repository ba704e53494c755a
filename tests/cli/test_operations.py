"""Every operating command against one SQLite database: run, worker, list, inspect, event, decide, cancel, reconcile, check, migrate.

The scenarios run the teaching workflows of docs/examples through the
installed console script, alternating plain and ``--json`` output; each
``--json`` document is parsed, and what it says is checked against what the
plain output and the next command show.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

from fencekeeper.adapters import sqlite_store
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.kernel import protocol as p
from tests.cli.runner import EXAMPLES, assert_one_error_line, data, fencekeeper, ok, snapshot

PURCHASE = EXAMPLES / "purchase_approval.toml"
PAYMENT = EXAMPLES / "payment_with_timeout.toml"
REFUND = EXAMPLES / "refund_needs_reconciliation.toml"


def _order(amount: int, order: str) -> str:
    return json.dumps({"amount": amount, "order_id": order, "order_revision": 1})


def _states(cwd: Path, db: Path) -> dict[str, str]:
    return {item["execution_id"]: item["state"] for item in data("list", "--db", db, cwd=cwd)}


def test_the_teaching_workflows_from_admission_to_the_end(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"

    # run: the plain output is the id alone; the note goes to stderr.
    admitted = ok("run", PURCHASE, "--db", db, "--input", _order(2500, "o-1"), "--id", "po-1", cwd=tmp_path)
    assert admitted.stdout == "po-1\n"
    assert "purchase-approval revision 1 registered; po-1 admitted: eligible at check_amount" in admitted.stderr
    small = data("run", PURCHASE, "--db", db, "--input", _order(50, "o-2"), "--id", "po-2", cwd=tmp_path)
    assert small == {
        "execution_id": "po-2",
        "business_id": "default",
        "definition_id": "purchase-approval",
        "definition_revision": 1,
        "definition_registered": False,
        "state": "eligible",
        "current_node_id": "check_amount",
    }
    generated = ok("run", PURCHASE, "--db", db, "--input", _order(5000, "o-3"), cwd=tmp_path).stdout.strip()
    assert re.fullmatch(r"x-[0-9a-f]{12}", generated)
    ok("run", REFUND, "--db", db, "--input", '{"amount": 40, "payment_id": "p-7"}', "--id", "rf-1", cwd=tmp_path)
    for n in (1, 2):
        payment = json.dumps({"amount": 40, "order_id": f"o-7{n}"})
        ok("run", PAYMENT, "--db", db, "--input", payment, "--id", f"pay-{n}", cwd=tmp_path)

    # worker: one pass over everything; --json is its summary.
    summary = data("worker", "--db", db, "--until-idle", "--concurrency", "2", "--id", "w", cwd=tmp_path)
    assert summary["workers"] == ["w-1", "w-2"]
    assert summary["stopped_by"] == "idle"
    assert summary["claimed"] == 6
    assert summary["finished"] == {"reconciliation_required": 1, "succeeded": 1, "waiting": 4}
    assert summary["refused"] == [] and summary["errors"] == []
    assert _states(tmp_path, db) == {
        "po-1": "waiting",
        "po-2": "succeeded",
        generated: "waiting",
        "rf-1": "reconciliation_required",
        "pay-1": "waiting",
        "pay-2": "waiting",
    }
    waiting = ok("list", "--db", db, "--state", "waiting", cwd=tmp_path).stdout.splitlines()
    assert waiting[0].split()[:4] == ["execution", "business", "definition", "state"]
    assert sorted(line.split()[0] for line in waiting[1:]) == sorted(["pay-1", "pay-2", "po-1", generated])
    assert all(line == line.rstrip() for line in waiting)

    # event: wakes exactly the matching waiter; the same Event again changes nothing.
    woke = data(
        "event", "--db", db, "payment.received", "--correlation", '{"order_id": "o-71"}',
        "--payload", '{"paid": 40}', "--id", "ev-1", cwd=tmp_path,
    )  # fmt: skip
    assert woke == {"event_id": "ev-1", "duplicate": False, "woken": ["pay-1"]}
    again = ok(
        "event", "--db", db, "payment.received", "--correlation", '{"order_id": "o-71"}',
        "--payload", '{"paid": 40}', "--id", "ev-1", cwd=tmp_path,
    )  # fmt: skip
    assert again.stdout == "ev-1: already published (idempotent); nothing changed\n"
    nobody = ok("event", "--db", db, "payment.received", "--correlation", '{"order_id": "o-99"}', cwd=tmp_path)
    assert re.fullmatch(r"ev-[0-9a-f]{12}: published; no waiter matched\n", nobody.stdout)

    # decide: accepted (and woken), idempotent, kept in history, refused.
    accepted = data("decide", "--db", db, "po-1", "--approve", "--as", "user:manager", "--id", "d-1", cwd=tmp_path)
    assert accepted["outcome"] == "accepted"
    assert accepted["request"]["binding"] == {
        "operation": "purchase.approve",
        "targets": [["o-1", 1]],
        "policies": [["purchasing", 3]],
    }
    assert accepted["execution"]["state"] == "eligible"
    assert accepted["execution"]["current_node_id"] == "place_order"
    repeat = ok("decide", "--db", db, "po-1", "--approve", "--as", "user:manager", "--id", "d-1", cwd=tmp_path)
    assert repeat.stdout.splitlines()[0].startswith(
        "request po-1/a3/approval (approved): purchase.approve on o-1@1 under purchasing@3"
    )
    assert repeat.stdout.splitlines()[1].startswith("already decided (idempotent)")
    late = ok(
        "decide", "--db", db, "po-1", "--reject", "--as", "user:cfo", "--id", "d-2", "--rationale", "too late",
        cwd=tmp_path,
    )  # fmt: skip
    assert "recorded as conflicting" in late.stdout and "the first committed determination wins" in late.stdout
    own = fencekeeper("decide", "--db", db, generated, "--approve", "--as", "user:operator", cwd=tmp_path)
    line = assert_one_error_line(own, code=1)
    assert "refused [not_authorized]" in line and "outside the reviewer scope" in line
    assert own.stdout.startswith(f"request {generated}/a3/approval (pending)")

    # cancel: a waiting execution is cancelled; a finished one is refused by the kernel.
    cancelled = data("cancel", "--db", db, "pay-2", cwd=tmp_path)
    assert cancelled["outcome"] == "decision" and cancelled["execution"]["state"] == "cancelled"
    refused = fencekeeper("cancel", "--db", db, "po-2", cwd=tmp_path)
    assert "cancellation refused [" in assert_one_error_line(refused, code=1)

    # reconcile: the unknown refund is settled by asking, not by resending.
    # Without a choice, reconcile only shows what is known, and writes nothing.
    review = data("reconcile", "--db", db, "rf-1", cwd=tmp_path)["review"]
    assert [c["command_id"] for c in review["unresolved_commands"]] == ["rf-1/a2/command"]
    assert review["permitted_continuations"] == [] and review["state"] == "reconciliation_required"
    settled = data("reconcile", "--db", db, "rf-1", "--settle", cwd=tmp_path)["reconciled"]
    assert settled["command_id"] == "rf-1/a2/command"
    assert settled["result"]["status"] == "succeeded"
    # Settled and recorded, but still in review: resuming is a separate decision.
    assert settled["outcome"] == "decision" and settled["execution"]["state"] == "reconciliation_required"
    unsafe = fencekeeper("reconcile", "--db", db, "rf-1", "--resume-at", "send_refund", "--because", "x", cwd=tmp_path)
    assert "unsafe_resume" in assert_one_error_line(unsafe, code=1)
    resumed = data(
        "reconcile", "--db", db, "rf-1", "--resume-at", "refunded", "--because", "the refund was applied",
        cwd=tmp_path,
    )["reconciled"]
    assert resumed["execution"]["state"] == "eligible" and resumed["execution"]["current_node_id"] == "refunded"
    nothing = ok("reconcile", "--db", db, "--quarantine", cwd=tmp_path)
    assert nothing.stdout == "no expired executions to quarantine\n"

    # worker again: plain summary; everything woken runs to its end.
    finished = ok("worker", "--db", db, "--until-idle", "--id", "w2", cwd=tmp_path).stdout
    assert re.search(r"^finished succeeded\s+3$", finished, re.MULTILINE), finished
    assert re.search(r"^refused\s+0$", finished, re.MULTILINE), finished
    assert _states(tmp_path, db) == {
        "po-1": "succeeded",
        "po-2": "succeeded",
        generated: "waiting",
        "rf-1": "succeeded",
        "pay-1": "succeeded",
        "pay-2": "cancelled",
    }

    # inspect: the whole timeline, plain and as JSON.
    timeline = ok("inspect", "po-1", "--db", db, cwd=tmp_path).stdout
    for expected in (
        r"^execution po-1  business default  definition purchase-approval revision 1$",
        r"^state succeeded  revision 8  node done  steps 4  fence 2$",
        r"\s1\s+user:operator\s+-\s+0\s+admit: -> eligible\s+admitted$",
        r"\s2\s+w-[12]\s+[0-9a-f]{8}\s+1\s+claim: eligible -> running\s+claimed$",
        r"attempt po-1/a3 ask_manager \(request_approval\)",
        r"wait registered\s+fencekeeper.approval request_id=po-1/a3/approval; timeout at ",
        r"woken by d-1\s+reason decision$",
        r"decision d-2 by user:cfo: rejected\s+on po-1/a3/approval, rationale \"too late\"$",
        r"r1 rejected_conflict$",
        r"command po-1/a6/command order.place\s+as user:operator on \[\[o-1, 1\]\], payload amount=2500 channel=web$",
        r"finalize_succeeded: running -> succeeded\s+end done: succeeded$",
        r"^lease\s+none$",
    ):
        assert re.search(expected, timeline, re.MULTILINE), f"{expected!r} not in:\n{timeline}"
    view = data("inspect", "rf-1", "--db", db, cwd=tmp_path)
    assert view["execution"]["state"] == "succeeded" and view["lease_expired"] is False
    command = [e["state"] for e in view["evidence"] if e["object_id"] == "rf-1/a2/command"]
    assert command == ["issued", "unknown", "succeeded"]
    assert [r["event"] for r in view["history"]] == [
        None, "claim", "finalize_reconciliation_required", None, "resume_safe", "claim", "finalize_succeeded",
    ]  # fmt: skip
    assert [r["kind"] for r in view["recoveries"]] == ["reconcile_command", "resume_safe"]

    # check and migrate: the deployment is sound and current.
    report = data("check", "--db", db, cwd=tmp_path)
    assert report["ok"] is True and report["problems"] == []
    assert report["schema_version"] == report["code_version"] == max(n for n, _, _ in sqlite_store.MIGRATIONS)
    assert [m["version"] for m in report["migrations"]] == [n for n, _, _ in sqlite_store.MIGRATIONS]
    assert report["definitions"] == 3
    assert report["executions"] == {"waiting": 1, "succeeded": 4, "cancelled": 1}
    assert ok("migrate", "--db", f"sqlite:///{db.name}", cwd=tmp_path).stdout == "shop.db: schema is current\n"


def test_an_expired_lease_is_shown_quarantined_and_recovered(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    ok("run", PURCHASE, "--db", db, "--input", _order(50, "o-1"), "--id", "po-1", cwd=tmp_path)
    # A worker that claims and then disappears: its lease is all that is left of it.
    store = SQLiteStore(db)
    try:
        claim = store.claim_next(p.ClaimRequest("gone-1", secrets.token_hex(16), timedelta(milliseconds=200)))
        assert isinstance(claim, p.Decision)
    finally:
        store.close()
    time.sleep(0.3)
    shown = ok("inspect", "po-1", "--db", db, cwd=tmp_path).stdout
    assert re.search(r"^lease\s+held by gone-1, token [0-9a-f]{8}, expires .* \(expired: quarantine takes it\)$",
                     shown, re.MULTILINE), shown  # fmt: skip
    assert data("inspect", "po-1", "--db", db, cwd=tmp_path)["lease_expired"] is True

    quarantined = data("reconcile", "--db", db, "--quarantine", cwd=tmp_path)["quarantined"]
    assert list(quarantined) == ["po-1"]
    assert quarantined["po-1"]["execution"]["state"] == "reconciliation_required"
    # Without a choice it shows the facts and the choices; the operator then chooses explicitly.
    shown = ok("reconcile", "--db", db, "po-1", cwd=tmp_path).stdout
    assert "--resume-at check_amount --because TEXT" in shown and "--fail" in shown
    unexplained = fencekeeper("reconcile", "--db", db, "po-1", "--resume-at", "check_amount", cwd=tmp_path)
    assert "--because" in assert_one_error_line(unexplained, code=2)
    resumed = ok(
        "reconcile", "--db", db, "po-1", "--resume-at", "check_amount", "--because", "its visit committed nothing",
        cwd=tmp_path,
    ).stdout
    assert resumed == "po-1: resume_safe, reconciliation_required -> eligible at check_amount\n"
    again = fencekeeper("reconcile", "--db", db, "po-1", "--fail", cwd=tmp_path)
    # Named as the argument was typed, as every EXECUTION_ID error of the command line is.
    assert assert_one_error_line(again, code=1) == (
        "fencekeeper: error: EXECUTION_ID: 'po-1' is eligible, not reconciliation_required or suspended"
    )
    ok("worker", "--db", db, "--until-idle", cwd=tmp_path)
    assert _states(tmp_path, db) == {"po-1": "succeeded"}


def test_a_sweep_with_a_review_that_cannot_go_on_still_reports_what_it_quarantined(tmp_path: Path) -> None:
    """--quarantine ID: the sweep commits before ID is looked at; --json must say what it moved, as the text does."""
    db = tmp_path / "ops.db"
    ok("run", PURCHASE, "--db", db, "--input", _order(50, "o-1"), "--id", "po-1", cwd=tmp_path)
    ok("run", PURCHASE, "--db", db, "--input", _order(50, "o-2"), "--id", "po-2", cwd=tmp_path)
    store = SQLiteStore(db)
    try:
        claim = store.claim_next(p.ClaimRequest("gone-1", secrets.token_hex(16), timedelta(milliseconds=200)))
        assert isinstance(claim, p.Decision) and claim.execution is not None
        gone = claim.execution.execution_id
    finally:
        store.close()
    time.sleep(0.3)
    other = "po-2" if gone == "po-1" else "po-1"  # eligible, so not in review: the review is refused
    swept = fencekeeper("reconcile", "--db", db, "--quarantine", other, "--json", cwd=tmp_path)
    assert "not reconciliation_required or suspended" in assert_one_error_line(swept, code=1)
    report = json.loads(swept.stdout)
    assert list(report["quarantined"]) == [gone]
    assert report["quarantined"][gone]["execution"]["state"] == "reconciliation_required"
    assert _states(tmp_path, db)[gone] == "reconciliation_required"


def test_check_exits_1_when_the_store_cannot_be_used_and_2_when_there_is_none(tmp_path: Path) -> None:
    # No store at all is what every command calls a --db that names nothing usable: exit 2.
    missing = fencekeeper("check", "--db", "absent.db", "--json", cwd=tmp_path)
    assert missing.returncode == 2 and json.loads(missing.stdout)["problems"][0].startswith("absent.db: no database")
    assert not (tmp_path / "absent.db").exists()

    (tmp_path / "notes.db").write_text("shopping list\n", encoding="utf-8")
    garbage = fencekeeper("check", "--db", "notes.db", cwd=tmp_path)
    assert garbage.returncode == 2
    assert re.search(r"^PROBLEM\s+notes.db: not a usable SQLite database", garbage.stdout, re.MULTILINE), garbage.stdout
    assert (tmp_path / "notes.db").read_text(encoding="utf-8") == "shopping list\n"

    ok("migrate", "--db", "future.db", cwd=tmp_path)
    with contextlib.closing(sqlite3.connect(tmp_path / "future.db")) as conn, conn:
        conn.execute("INSERT INTO schema_migrations VALUES (99, 'future', '-', '2099-01-01T00:00:00Z')")
    before = snapshot(tmp_path)
    newer = fencekeeper("check", "--db", "future.db", "--json", cwd=tmp_path)
    assert newer.returncode == 1
    report = json.loads(newer.stdout)
    assert report["ok"] is False and "newer than this fencekeeper" in report["problems"][0]
    refused = fencekeeper("list", "--db", "future.db", cwd=tmp_path)
    assert "[schema_too_new]" in assert_one_error_line(refused, code=1)
    assert snapshot(tmp_path) == before
