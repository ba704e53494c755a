"""Four worker processes drain 1,000 executions from one SQLite file; stale commits leave no trace.

What this proves, about ``SQLiteStore`` under real multi-process contention
(separate processes, separate connections, one file, the system clock, leases
of 0.3 s that expire mid-work because workers pause past them):

- the run ends: every execution reaches a terminal state or a review state
  and nothing is left eligible, running or waiting;
- each execution is finished exactly once: its history has exactly one
  transition into a terminal state and nothing after it, or (ending in review)
  none at all;
- a refused request wrote nothing: the writes the workers made with their
  credentials (transition records, and through them execution revisions) are
  exactly the requests their ledgers say were accepted, no evidence object of
  a refused request exists, and no record, revision or evidence carrying a
  credential is dated at or after a refusal that declared that credential
  dead (expired, displaced, finalized, released);
- every deliberate zombie retry (finalize, renew, release, append evidence,
  record step with a dead credential, sometimes presenting the current
  revision) was refused;
- the rows are coherent: dispatch agrees with the execution (running is
  claimed), lease fields are set iff claimed, step counts agree, revisions are
  contiguous and each has exactly one transition that wrote it, and
  ``PRAGMA integrity_check`` is ok.

The reconciler runs in this (the parent) process: it quarantines expired
executions (``expired()`` then ``recover`` QUARANTINE_EXPIRED with a fresh
command id, actor ``ops``), then resumes some (at most twice per execution, so
the run ends) and fails the others, replays some quarantine commands to check
they are idempotent, and wakes waiting executions (sometimes twice, to check
that the second wake is ``Unchanged``).
"""

from __future__ import annotations

import collections
import json
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import SystemClock
from fencekeeper.adapters.testing.suite import resume_at_current_node
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState
from tests.stores.audit import check_finished_once, load
from tests.stores.drain_worker import DEAD_CODES, WAIT_EVENT

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4
EXECUTIONS = 1_000
LEASE_SECONDS = 0.3
PAUSE_PROBABILITY = 0.1
DRAIN_BUDGET_SECONDS = 75.0  # the whole test must stay under 90 s on 2 shared cores
MAX_RESUMES = 2

OPS = p.Authority(True, "ops")
ADMIN = p.Authority(True, "admin")


# --- the reconciler (parent process) -------------------------------------------------


class Reconciler:
    def __init__(self, store: SQLiteStore, seed: int) -> None:
        self.store = store
        self.rng = random.Random(seed)
        self.resumes: collections.Counter[str] = collections.Counter()
        self.stats: collections.Counter[str] = collections.Counter()
        self.expired_since: dict[str, float] = {}
        self.grace: dict[str, float] = {}

    def _recover(
        self, kind: p.RecoveryKind, execution_id: str, business_id: str, revision: int, command_id: str | None = None
    ) -> p.Outcome:
        command_id = command_id or f"cmd-{uuid.uuid4().hex}"
        if kind == p.RecoveryKind.RESUME_SAFE:
            found = self.store.read(execution_id)
            assert found is not None
            return self.store.recover(resume_at_current_node(self.store, found, command_id, "ops", OPS))
        return self.store.recover(
            p.RecoveryRequest(
                command_id=command_id,
                kind=kind,
                execution_id=execution_id,
                business_id=business_id,
                expected_revision=revision,
                actor_id="ops",
                authority=OPS,
            )
        )

    def quarantine_expired(self) -> None:
        now = time.monotonic()
        for execution_id in self.store.expired():
            # Leave an expired lease alone for a random while first, so that
            # its paused holder sometimes comes back to an expired but not yet
            # quarantined lease (lease_expired) and sometimes to a quarantined
            # or reclaimed one.
            first_seen = self.expired_since.setdefault(execution_id, now)
            if now - first_seen < self.grace.setdefault(execution_id, self.rng.uniform(0, 0.3)):
                continue
            del self.expired_since[execution_id], self.grace[execution_id]
            view = self.store.read(execution_id)
            assert view is not None
            execution = view.execution
            command_id = f"cmd-{uuid.uuid4().hex}"
            outcome = self._recover(
                p.RecoveryKind.QUARANTINE_EXPIRED, execution_id, execution.business_id, execution.revision, command_id
            )
            # Nobody else can write an execution whose lease has expired: the
            # holder is fenced by expiry and only this loop recovers.
            assert isinstance(outcome, p.Decision), (execution_id, outcome)
            assert outcome.execution is not None
            self.stats["quarantined"] += 1
            if self.rng.random() < 0.2:
                replay = self._recover(
                    p.RecoveryKind.QUARANTINE_EXPIRED,
                    execution_id,
                    execution.business_id,
                    execution.revision,
                    command_id,
                )
                assert isinstance(replay, p.Unchanged), replay
                assert replay.code == p.UnchangedCode.RECOVERY_REPLAYED
                self.stats["quarantine replayed (unchanged)"] += 1
            revision = outcome.execution.revision
            if self.resumes[execution_id] < MAX_RESUMES and self.rng.random() < 0.6:
                self.resumes[execution_id] += 1
                kind = p.RecoveryKind.RESUME_SAFE
            else:
                kind = p.RecoveryKind.FAIL
            decided = self._recover(kind, execution_id, execution.business_id, revision)
            assert isinstance(decided, p.Decision), (execution_id, decided)
            self.stats[f"recovered by {kind.value}"] += 1

    def wake_waiting(self) -> None:
        for execution_id in self.store.execution_ids(ExecutionState.WAITING):
            view = self.store.read(execution_id)
            assert view is not None and view.execution.wait is not None
            key = view.execution.wait
            request = p.WakeRequest(
                key=key,
                reason=p.WakeReason.EVENT,
                source_id=f"evt-{uuid.uuid4().hex}",
                business_id=view.execution.business_id,
                authority=OPS,
                event_type=WAIT_EVENT,
                correlation=(("execution", execution_id),),
            )
            outcome = self.store.wake(request)
            assert isinstance(outcome, p.Decision), (execution_id, outcome)
            self.stats["woken"] += 1
            if self.rng.random() < 0.3:
                again = self.store.wake(request)
                assert isinstance(again, p.Unchanged) and again.code == p.UnchangedCode.ALREADY_WOKEN, again
                self.stats["duplicate wake (unchanged)"] += 1

    def unfinished(self) -> dict[str, int]:
        return {
            state.value: len(self.store.execution_ids(state))
            for state in (ExecutionState.ELIGIBLE, ExecutionState.RUNNING, ExecutionState.WAITING)
        }


# --- reading the results ---------------------------------------------------------------


def read_ledgers(paths: list[Path]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for path in paths:
        with path.open(encoding="utf-8") as handle:
            entries.extend(json.loads(line) for line in handle)
    return entries


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def rows(conn: sqlite3.Connection, sql: str) -> Iterator[sqlite3.Row]:
    yield from conn.execute(sql)


# --- the test ---------------------------------------------------------------------------


def test_four_worker_processes_drain_a_thousand_executions(tmp_path: Path) -> None:
    started = time.monotonic()
    db = tmp_path / "drain.db"
    store = SQLiteStore(db, SystemClock())
    for number in range(EXECUTIONS):
        outcome = store.admit(p.AdmitRequest(f"ex-{number:04d}", f"biz-{number % 7}", "drain", 1, "start", ADMIN))
        assert isinstance(outcome, p.Decision), outcome
    admitted = time.monotonic() - started

    stop = tmp_path / "stop"
    deadline = time.time() + DRAIN_BUDGET_SECONDS + 10  # the workers' own backstop
    ledgers = [tmp_path / f"w{n}.jsonl" for n in range(WORKERS)]
    errors = [tmp_path / f"w{n}.err" for n in range(WORKERS)]
    error_files = [path.open("w") for path in errors]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.stores.drain_worker",
                "--db",
                str(db),
                "--worker",
                f"worker-{n}",
                "--seed",
                str(1000 + n),
                "--lease",
                str(LEASE_SECONDS),
                "--pause",
                str(PAUSE_PROBABILITY),
                "--stop",
                str(stop),
                "--log",
                str(ledgers[n]),
                "--deadline",
                str(deadline),
                # The last worker reuses one token for all its claims: only
                # the fence separates its old credentials from its new ones.
                *(["--reuse-token"] if n == WORKERS - 1 else []),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=error_files[n],
        )
        for n in range(WORKERS)
    ]
    reconciler = Reconciler(store, seed=99)
    drain_started = time.monotonic()
    try:
        while True:
            if time.monotonic() - started > DRAIN_BUDGET_SECONDS:
                raise AssertionError(
                    f"the drain did not finish within {DRAIN_BUDGET_SECONDS:.0f} s: still {reconciler.unfinished()}"
                )
            dead_workers = [n for n, proc in enumerate(procs) if proc.poll() is not None]
            assert not dead_workers, [errors[n].read_text() for n in dead_workers]
            reconciler.quarantine_expired()
            reconciler.wake_waiting()
            if not any(reconciler.unfinished().values()):
                break
            time.sleep(0.02)
    finally:
        stop.touch()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for handle in error_files:
            handle.close()
    drained = time.monotonic() - drain_started
    for n, proc in enumerate(procs):
        assert proc.returncode == 0, (n, proc.returncode, errors[n].read_text())
    # Nothing is left for anyone: expiry finds nothing either.
    assert store.expired() == []
    store.close()

    entries = read_ledgers(ledgers)
    conn = sqlite3.connect(db)
    try:
        report = audit(conn, entries)
    finally:
        conn.close()
    report["stats"] = dict(reconciler.stats)
    report["seconds"] = {
        "admission": round(admitted, 2),
        "drain": round(drained, 2),
        "total": round(time.monotonic() - started, 2),
    }
    print(json.dumps(report, indent=2, sort_keys=True))
    assert report["stats"].get("quarantined", 0) > 0, "no lease expired mid-work: the run proved nothing about zombies"
    assert report["zombie requests"].get("dead", 0) > 0 and report["zombie requests"].get("forged", 0) > 0
    # Each way a credential dies was exercised (the fence alone, through the
    # worker that reuses its token, included).
    assert {"lease_expired", "dispatch_not_claimed", "lease_token_mismatch", "worker_mismatch", "stale_fence"} <= set(
        report["refusals by code"]
    ), report["refusals by code"]


def audit(conn: sqlite3.Connection, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Every check that compares the file with the ledgers; returns the counts for the report."""
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.row_factory = sqlite3.Row

    loaded = load(lambda sql: rows(conn, sql))
    assert len(loaded.executions) == EXECUTIONS
    final_states = check_finished_once(loaded)
    history = loaded.history

    # --- the ledgers against the file ---------------------------------------------------------
    decided = [e for e in entries if e["result"] == "decision"]
    refused = [e for e in entries if e["result"] == "refusal"]
    assert all(e["result"] in ("decision", "refusal") for e in entries), "a worker got None or Unchanged"
    assert not [e for e in refused if e["op"] == "claim"], "claim_next picked work it could not claim"
    # Deliberate zombies must all be refused; a live holder is only ever
    # refused because its credential died (expired, displaced).
    zombies = [e for e in entries if e["zombie"]]
    assert [e for e in zombies if e["result"] != "refusal"] == [], "a zombie request was accepted"
    assert {e["code"] for e in refused} <= DEAD_CODES, collections.Counter(e["code"] for e in refused)

    # Writes made with a credential are exactly the accepted requests: the
    # transitions by a worker (actor = the worker) against the ledgers' decisions.
    accepted = collections.Counter(
        (e["execution_id"], event, e["worker"], e["token"], e["fence"]) for e in decided for event in e["events"]
    )
    written = collections.Counter(
        (t["execution_id"], t["event"], t["actor"], t["lease_token"], t["fence"])
        for ts in history.values()
        for t in ts
        if t["actor"] not in ("ops", "admin")
    )
    assert written == accepted, (written - accepted, accepted - written)

    # A credential declared dead stays dead, in the ledger and in the file.
    # A credential is (worker, token, fence) on one execution: a forged one
    # shares the token and fence of a live credential but not its worker, and
    # the token-reusing worker has the same token and fence on many executions.
    dead_since: dict[tuple[str, str, str, int], datetime] = {}
    for e in sorted(refused, key=lambda e: e["before"]):
        if e["code"] in DEAD_CODES:
            dead_since.setdefault((e["execution_id"], e["worker"], e["token"], e["fence"]), _time(e["before"]))
    for e in decided:
        since = dead_since.get((e["execution_id"], e["worker"], e["token"], e["fence"]))
        assert since is None or _time(e["before"]) < since, f"accepted after its credential was refused: {e}"
    for ts in history.values():
        for t in ts:
            if t["actor"] in ("ops", "admin"):
                continue  # a quarantine record names the expired token; it is not a write made with it
            since = dead_since.get((t["execution_id"], t["actor"], t["lease_token"], t["fence"]))
            assert since is None or _time(t["at"]) < since, f"a dead credential wrote {dict(t)}"

    evidence = {
        r["object_id"]: r
        for r in rows(
            conn,
            "SELECT o.object_id, o.object_type, o.parent_id, o.created_at, v.body FROM objects o "
            "JOIN object_revisions v ON v.object_id = o.object_id WHERE o.parent_id IS NOT NULL",
        )
    }
    accepted_evidence = {object_id for e in decided for object_id in e["evidence"]}
    refused_evidence = {object_id for e in refused for object_id in e["evidence"]}
    assert refused_evidence and accepted_evidence
    assert refused_evidence.isdisjoint(evidence), "evidence of a refused request exists"
    assert evidence.keys() == accepted_evidence, "evidence without an accepted request, or one lost"
    for object_id, r in evidence.items():
        body = json.loads(r["body"])
        _, execution_id, worker, fence, token, _ = object_id.split(":")
        assert r["parent_id"] == execution_id and (body["token"], str(body["fence"])) == (token, fence)
        since = dead_since.get((execution_id, worker, token, int(fence)))
        assert since is None or _time(r["created_at"]) < since, f"evidence {object_id} committed after refusal"

    # Recovery commands: one durable record per governed decision, each with its transition.
    commands = list(rows(conn, "SELECT body FROM commands"))
    recovery_transitions = [t for ts in history.values() for t in ts if t["actor"] == "ops" and t["event"] != "wake"]
    assert len(commands) == len(recovery_transitions)

    by_op: collections.Counter[str] = collections.Counter(e["op"] for e in decided)
    return {
        "final states": dict(final_states),
        "claims": by_op["claim"],
        "accepted by operation": dict(by_op),
        "refusals by code": dict(collections.Counter(e["code"] for e in refused)),
        "refusals by operation": dict(collections.Counter(e["op"] for e in refused)),
        "zombie requests": dict(collections.Counter(e["zombie"] for e in zombies)),
        "evidence objects": len(evidence),
        "refused evidence ids (absent)": len(refused_evidence),
        "transitions": sum(len(ts) for ts in history.values()),
    }
