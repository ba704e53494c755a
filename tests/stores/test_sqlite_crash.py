"""SIGKILL a worker process inside its transactions, again and again; no torn decision is ever visible.

What this proves, about ``SQLiteStore`` on one file (WAL, synchronous=FULL):

- a process killed with SIGKILL at any point inside a write transaction
  (right after BEGIN IMMEDIATE, between any two guarded statements of a
  decision, just before COMMIT) leaves nothing of that transaction behind:
  the unique thing the operation would have written (the admitted execution,
  the claim's token, the evidence id, the recovery command, the wake's source)
  is absent;
- after every one of at least 50 such kills (and a few at random moments),
  the file passes ``PRAGMA integrity_check`` and no torn decision is visible:
  each execution's object row equals its newest revision, revisions are
  contiguous and each has exactly the transition record its decision wrote,
  dispatch agrees with the execution and has lease fields iff claimed, step
  counts agree, wait registrations, recovery commands and evidence exist
  exactly when the transition that commits them does (evidence and
  finalization land together, or neither does);
- the executions the killed workers abandoned (running, their lease expired
  after the last kill) are exactly what ``store.expired()`` returns, and
  quarantine (``recover`` QUARANTINE_EXPIRED) succeeds for each of them and
  is refused for every other execution.

The children are ``tests/stores/crash_worker.py``; how they put the kill
inside a transaction is described there.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from fencekeeper.adapters import codec
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import SystemClock
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState, dispatch_state_of
from tests.stores.crash_worker import COMMITTING, IN_WRITE, OUTSIDE, STATUS_SIZE, Status, read_status

ROOT = Path(__file__).resolve().parents[2]
KILLS_INSIDE = 63  # kills that must land inside a write transaction: 7 for each operation
LEASE_SECONDS = 0.4
# A guard against a hang, not a speed target: about 30 s on a quiet 2-core machine,
# several times that when the machine is loaded (the suite runs a process per core).
BUDGET_SECONDS = 300.0
OPS = p.Authority(True, "ops")
PARK_OPS = ("admit", "claim", "step", "renew", "append", "release", "finalize", "recover", "wake")

# What each operation would write that nothing else ever does.
MARKER_QUERIES = {
    "admit": "SELECT count(*) FROM objects WHERE object_id = ?",
    "claim": "SELECT count(*) FROM execution_transitions WHERE lease_token = ?",
    "step": "SELECT count(*) FROM objects WHERE object_id = ?",
    "append": "SELECT count(*) FROM objects WHERE object_id = ?",
    "finalize": "SELECT count(*) FROM objects WHERE object_id = ?",
    "release": "SELECT count(*) FROM execution_transitions WHERE event = 'release' AND lease_token = ?",
    "recover": "SELECT count(*) FROM commands WHERE command_id = ?",
    "wake": "SELECT count(*) FROM wait_registrations WHERE woken_by = ?",
}


# --- torn decisions -----------------------------------------------------------------------


def torn_decisions(conn: sqlite3.Connection) -> list[str]:
    """Everything that would show a decision half applied; empty when the file is coherent."""
    problems: list[str] = []
    if conn.execute("PRAGMA integrity_check").fetchall() != [("ok",)]:
        return ["integrity_check failed"]
    if conn.execute("PRAGMA foreign_key_check").fetchall():
        problems.append("foreign_key_check found orphans")
    conn.row_factory = sqlite3.Row
    try:
        problems += _torn(conn)
    finally:
        conn.row_factory = None
    return problems


def _torn(conn: sqlite3.Connection) -> list[str]:
    problems: list[str] = []
    executions = {
        r["object_id"]: r for r in conn.execute("SELECT * FROM objects WHERE object_type = 'WorkflowExecution'")
    }
    dispatch = {r["workflow_execution_id"]: r for r in conn.execute("SELECT * FROM workflow_dispatch")}
    if dispatch.keys() != executions.keys():
        problems.append(f"executions without dispatch or back: {sorted(dispatch.keys() ^ executions.keys())}")
    revisions: dict[str, list[sqlite3.Row]] = collections.defaultdict(list)
    for r in conn.execute("SELECT * FROM object_revisions ORDER BY object_id, revision"):
        revisions[r["object_id"]].append(r)
    history: dict[str, list[sqlite3.Row]] = collections.defaultdict(list)
    # Revision rows carry the transition that made them (migration 4); the
    # view shows those beside the transitions table's, in order per execution.
    for r in conn.execute("SELECT * FROM execution_transitions ORDER BY execution_id, revision, rank, seq"):
        history[r["execution_id"]].append(r)
    registrations: dict[str, list[sqlite3.Row]] = collections.defaultdict(list)
    for r in conn.execute("SELECT * FROM wait_registrations"):
        registrations[r["execution_id"]].append(r)
    evidence: dict[str, list[sqlite3.Row]] = collections.defaultdict(list)
    for r in conn.execute("SELECT * FROM objects WHERE parent_id IS NOT NULL"):  # evidence, not definitions
        evidence[r["parent_id"]].append(r)
        if len(revisions.get(r["object_id"], [])) != 1:
            problems.append(f"evidence {r['object_id']} without exactly one revision row")

    for eid, obj in executions.items():
        revs = revisions[eid]
        transitions = history[eid]
        d = dispatch.get(eid)
        if [r["revision"] for r in revs] != list(range(1, obj["revision"] + 1)):
            problems.append(f"{eid}: revisions {[r['revision'] for r in revs]} but object at {obj['revision']}")
            continue
        body = json.loads(revs[-1]["body"])
        if (revs[-1]["state"], body["state"], body["revision"]) != (obj["state"], obj["state"], obj["revision"]):
            problems.append(f"{eid}: object row {obj['state']}@{obj['revision']} is not its newest revision")
        if d is not None:
            if d["dispatch_state"] != dispatch_state_of(ExecutionState(obj["state"])).value:
                problems.append(f"{eid}: execution {obj['state']} but dispatch {d['dispatch_state']}")
            claimed = d["dispatch_state"] == "claimed"
            if any((d[f] is not None) != claimed for f in ("lease_token", "leased_by", "lease_expires_at")):
                problems.append(f"{eid}: lease fields do not match dispatch state {d['dispatch_state']}")
            if d["step_count"] != body["step_count"]:
                problems.append(f"{eid}: step_count {d['step_count']} in dispatch, {body['step_count']} in execution")
        # Each revision was written by exactly one transition record, which
        # moved from the previous revision's state to this one's, at the
        # same instant; renewals write no revision.
        writers = [t for t in transitions if t["event"] != "renew"]
        if [t["revision"] for t in writers] != [r["revision"] for r in revs]:
            problems.append(f"{eid}: transition revisions {[t['revision'] for t in writers]} vs {len(revs)} revisions")
            continue
        previous = None
        for t, r in zip(writers, revs, strict=True):
            if (t["from_state"], t["to_state"], t["at"]) != (previous, r["state"], r["committed_at"]):
                problems.append(f"{eid}: revision {r['revision']} and its transition disagree")
            previous = r["state"]
        for t in transitions:
            if t["event"] == "renew" and revs[t["revision"] - 1]["state"] != "running":
                problems.append(f"{eid}: renewal recorded on a {revs[t['revision'] - 1]['state']} revision")

        # Wait registrations commit with finalize_waiting; the first wake
        # marks the registration in the same commit as the wake transition.
        regs = registrations[eid]
        if len(regs) != sum(t["event"] == "finalize_waiting" for t in transitions):
            problems.append(f"{eid}: {len(regs)} registrations for its waiting finalizations")
        woken = {r["woken_by"] for r in regs if r["woken_by"] is not None}
        wakes = {t["reason"].removeprefix("woken by event ") for t in transitions if t["event"] == "wake"}
        if woken != wakes:
            problems.append(f"{eid}: registrations woken by {woken}, wake transitions {wakes}")
        if obj["state"] == "waiting":
            wait = body["wait"]
            if not any(
                [r["execution_id"], r["node_id"], r["attempt_id"]] == wait and r["woken_by"] is None for r in regs
            ):
                problems.append(f"{eid}: waiting without its open registration")

        # Evidence lands with the decision it belongs to: same transaction,
        # so the same instant as that decision's transition.
        items = evidence[eid]
        for kind, events in (("outcome", "finalize_"), ("step_attempt", "record_step")):
            at_items = sorted(i["created_at"] for i in items if i["object_type"] == kind)
            at_transitions = sorted(
                t["at"]
                for t in transitions
                if (t["event"] or "").startswith(events) and t["actor"].startswith("crash-")
            )
            if at_items != at_transitions:
                problems.append(f"{eid}: {kind} evidence at {at_items}, its transitions at {at_transitions}")

    # Recovery commands land with their transition.
    commands = {r["command_id"]: json.loads(r["body"]) for r in conn.execute("SELECT command_id, body FROM commands")}
    recoveries = {
        # "recovery KIND by command ID", then ": what it decided" for a resume.
        t["reason"].split(" by command ", 1)[1].split(":", 1)[0]: t
        for ts in history.values()
        for t in ts
        if t["event"] in ("quarantine_expired", "fail", "resume_safe")
    }
    if commands.keys() != recoveries.keys():
        problems.append(f"recovery commands without transitions or back: {sorted(commands.keys() ^ recoveries.keys())}")
    for command_id in commands.keys() & recoveries.keys():
        t = recoveries[command_id]
        body = commands[command_id]
        if (body["execution_id"], body["resulting_revision"], body["kind"]) != (
            t["execution_id"],
            t["revision"],
            t["event"],
        ):
            problems.append(f"command {command_id} does not match its transition")
    return problems


def marker_survived(conn: sqlite3.Connection, status: Status) -> bool:
    query = MARKER_QUERIES.get(status.op)
    if query is None or not status.marker:
        return False
    return bool(conn.execute(query, (status.marker,)).fetchone()[0])


# --- the test ----------------------------------------------------------------------------


def test_sigkill_inside_transactions_leaves_no_torn_decision(tmp_path: Path) -> None:
    started = time.monotonic()
    rng = random.Random(20260101)
    db = tmp_path / "crash.db"
    SQLiteStore(db, SystemClock()).close()  # the schema exists before the first child, so no kill hits a migration
    status_path = tmp_path / "status"
    error_path = tmp_path / "child.err"

    kills: collections.Counter[str] = collections.Counter()
    positions: collections.Counter[str] = collections.Counter()
    markers_checked = 0
    child = 0
    audit_seconds = 0.0
    while kills["inside a write transaction"] < KILLS_INSIDE:
        assert time.monotonic() - started < BUDGET_SECONDS, f"too slow: {dict(kills)} after {BUDGET_SECONDS} s"
        child += 1
        # Three kills in four are aimed: each operation in turn, at a random
        # statement of its transaction; the fourth lands at a random moment.
        mode = "random" if child % 4 == 0 else "park"
        park_op = PARK_OPS[(child - child // 4) % len(PARK_OPS)]
        status_path.write_bytes(b"\0" * STATUS_SIZE)
        errors = error_path.open("w")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.stores.crash_worker",
                "--db",
                str(db),
                "--child",
                str(child),
                "--seed",
                str(rng.randrange(2**32)),
                "--lease",
                str(LEASE_SECONDS),
                "--mode",
                mode,
                "--park-op",
                park_op,
                "--park-at",
                str(rng.randint(1, 11)),
                "--status",
                str(status_path),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            give_up = time.monotonic() + 15
            if mode == "park":
                # Kill the child while it sleeps holding the write lock between two statements.
                while not read_status(status_path).parked:
                    assert proc.poll() is None, f"child {child} exited: {error_path.read_text()}"
                    assert time.monotonic() < give_up, f"child {child} never parked: {read_status(status_path)}"
                    time.sleep(0.002)
            else:
                # Kill it at a random moment once it is working.
                while read_status(status_path).operations < 1:
                    assert proc.poll() is None, f"child {child} exited: {error_path.read_text()}"
                    assert time.monotonic() < give_up, f"child {child} never started"
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.01, 0.2))
            assert proc.poll() is None, f"child {child} exited: {error_path.read_text()}"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            errors.close()
        assert proc.returncode == -signal.SIGKILL, (child, proc.returncode)
        status = read_status(status_path)
        where = {OUTSIDE: "outside a transaction", IN_WRITE: "inside a write transaction", COMMITTING: "during COMMIT"}
        kills[where[status.state]] += 1
        if status.state == IN_WRITE:
            statement = status.sql if status.sql.startswith("COMMIT") else status.sql.split(" (")[0][:48]
            positions[f"{status.op} after statement {status.statements}: {statement}"] += 1

        before_audit = time.monotonic()
        conn = sqlite3.connect(db)
        try:
            problems = torn_decisions(conn)
            assert problems == [], f"after kill {child} ({status}): {problems[:10]}"
            if status.state == IN_WRITE:
                # Killed before COMMIT was issued: the transaction's own
                # unique write must not be there.
                assert not marker_survived(conn, status), f"kill {child}: a killed transaction committed: {status}"
                markers_checked += 1 if status.op in MARKER_QUERIES and status.marker else 0
        finally:
            conn.close()
        audit_seconds += time.monotonic() - before_audit

    # --- the abandoned executions -----------------------------------------------------------
    time.sleep(LEASE_SECONDS + 0.2)  # every lease granted before the last kill has expired
    conn = sqlite3.connect(db)
    try:
        now = codec.encode_time(datetime.now(UTC))
        running = {
            eid
            for eid, expires in conn.execute(
                "SELECT o.object_id, d.lease_expires_at FROM objects o JOIN workflow_dispatch d "
                "ON d.workflow_execution_id = o.object_id WHERE o.object_type = 'WorkflowExecution' "
                "AND o.state = 'running'"
            )
            if expires is not None and expires <= now
        }
        all_running = conn.execute(
            "SELECT count(*) FROM objects WHERE object_type = 'WorkflowExecution' AND state = 'running'"
        ).fetchone()[0]
    finally:
        conn.close()
    assert len(running) == all_running, "a running execution without an expired lease after all workers died"
    assert running, "the children abandoned nothing: the last part of the test would prove nothing"

    store = SQLiteStore(db, SystemClock())
    try:
        assert set(store.expired()) == running
        states: collections.Counter[str] = collections.Counter()
        for eid in store.execution_ids():
            view = store.read(eid)
            assert view is not None
            states[view.execution.state.value] += 1
            outcome = store.recover(
                p.RecoveryRequest(
                    f"final-{uuid.uuid4().hex}",
                    p.RecoveryKind.QUARANTINE_EXPIRED,
                    eid,
                    view.execution.business_id,
                    view.execution.revision,
                    "ops",
                    OPS,
                )
            )
            if eid in running:
                assert isinstance(outcome, p.Decision), (eid, outcome)
                assert outcome.execution is not None
                assert outcome.execution.state == ExecutionState.RECONCILIATION_REQUIRED
            else:
                assert isinstance(outcome, p.Refusal), (eid, outcome)
                assert outcome.code == p.RefusalCode.EXECUTION_NOT_RUNNING, (eid, outcome)
        assert store.expired() == []
        assert store.execution_ids(ExecutionState.RUNNING) == []
    finally:
        store.close()
    conn = sqlite3.connect(db)
    try:
        assert torn_decisions(conn) == []
        counts = {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("objects", "execution_transitions", "commands", "wait_registrations")
        }
    finally:
        conn.close()

    report = {
        "children killed": child,
        "kills": dict(kills),
        "killed transactions whose marker was checked absent": markers_checked,
        "kill positions inside transactions": dict(sorted(positions.items())),
        "states before the final quarantine": dict(states),
        "abandoned and quarantined": len(running),
        "rows": counts,
        "seconds": {"total": round(time.monotonic() - started, 2), "audits": round(audit_seconds, 2)},
    }
    print(json.dumps(report, indent=2))
    assert sum(kills.values()) >= 50
