"""Eight worker processes drain 2,000 executions from PostgreSQL while their connections are killed and they are SIGKILLed.

The workers (``tests/postgres/pg_drain_worker.py``, the SQLite drain worker
of ``tests/stores`` on a ``PostgresStore``) are separate processes sharing
nothing but the server.  Leases are 0.4 s on the database's clock; workers
pause past them, renew, record steps with evidence, append evidence, release,
finalize (mostly succeeded; also failed, suspended, reconciliation_required
and waiting), and deliberately retry with credentials that died (displaced,
expired, released, finalized) or that they forged.  The reconciler of the
SQLite drain test runs in this process: it quarantines what ``expired()``
reports (fresh command ids, actor ``ops``), then resumes it with the full
safe-resume proof or fails it, and wakes waiting executions.

Faults, all during the run:

- every 0.3-0.9 s, ``pg_terminate_backend`` on the connections whose
  ``application_name`` is ``fk-worker-*`` (all of them, or one worker's);
  a worker whose request fails with ``StoreError('store_unavailable')``
  abandons that execution and carries on with its next request;
- every 2-4 s, one worker process is SIGKILLed and a replacement started;
- near the end, every worker is SIGKILLed at once, so that executions are
  left running with nobody to finish them; after their leases have expired on
  the database clock the test checks that ``expired()`` finds exactly them,
  quarantines them, and lets a fresh crew drain the rest.

What is proven afterwards, from the database and the workers' ledgers:

- **nothing is lost**: all 2,000 executions exist, each terminal or in review,
  with a dispatch row that agrees (no lease left on it) and revisions,
  transitions and evidence that match;
- **nothing is finalized twice**: at most one transition into a terminal state
  per execution, and nothing after it;
- **no stale credential ever committed**: replaying each execution's history
  in commit order, every write made on a lease (renew, step, release,
  finalize) carries exactly the worker, token and fence of the lease open at
  that moment and was committed before that lease's expiry (claim or last
  renewal plus the lease, both on the database clock); fences in records
  never decrease and nothing with fence < n follows the claim of fence n;
  each claim takes fence n + 1 of an unleased execution; a quarantine takes
  only an expired lease; every evidence object was committed under the live
  lease its id names; no evidence of a refused request exists; every
  deliberate zombie retry was refused (or lost its connection), never
  accepted;
- **the ledgers and the database agree**: every accepted request's transition
  is in the database, and every transition a worker wrote is either an
  accepted request or one whose outcome the worker could not know (its
  connection was killed, or the worker was SIGKILLed, mid-request);
- **every abandoned execution is found**: during the run, every lease ends
  by its holder's release or finalization or by a quarantine, and none is
  left open; with every worker dead, the running executions are exactly
  those with an expired lease, exactly what ``expired()`` returns, and each
  is quarantined;
- **the pool survives ``pg_terminate_backend``**: a lost connection fails
  only the request that used it, as ``StoreError('store_unavailable')`` for
  writes, and no worker sees more than three pools' worth of failed write
  requests in a row (each dead connection is discarded when it fails);
- **the tables are consistent** by ``count(*)``: objects = executions +
  evidence, revision rows contiguous 1..revision for every object, one
  transition per execution revision, one command per governed recovery, one
  registration per waiting finalization.

The counts (claims, refusals by code, connection kills, SIGKILLs, quarantines,
lost requests, the exceptions seen) are printed as one JSON report.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from fencekeeper.adapters.postgres_store import PostgresStore
from fencekeeper.adapters.testing.suite import resume_at_current_node
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState
from tests.postgres.pg_drain_worker import APP_PREFIX, application_name, with_application_name
from tests.stores.audit import check_finished_once, load
from tests.stores.drain_worker import DEAD_CODES
from tests.stores.ledger_audit import Ledger, compare_writes, evidence_problems, replay_leases
from tests.stores.test_sqlite_concurrency import MAX_RESUMES, Reconciler

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 8
EXECUTIONS = 2_000
LEASE_SECONDS = 0.4
LEASE = timedelta(seconds=LEASE_SECONDS)
PAUSE_PROBABILITY = 0.08
# A guard against a hang, not a speed target: under two minutes on a quiet 2-core
# machine, several times that when the machine is loaded (the suite runs a process per core).
BUDGET_SECONDS = 420.0
TAIL = 150
"""The first phase ends when this few executions are unfinished; then every worker is SIGKILLed at once."""
CONNECTION_KILL_EVERY = (0.3, 0.9)
SIGKILL_EVERY = (2.0, 4.0)
MIN_SIGKILLS = 4
REUSE_TOKEN_SLOTS = frozenset(range(2, WORKERS))
"""These slots' workers claim with one token throughout: only the fence tells their credentials apart.

Six slots of eight: the fence-only refusal (``stale_fence``) needs a worker
to reclaim an execution it held before and still remember its old
credential, which only a long-lived worker does (a few times a run, mostly
the ones never SIGKILLed); with fewer such workers some runs had none.  The
two other slots claim with fresh tokens, as careful workers do."""
POOL_SIZE = 4
"""PostgresStore's default pool size: one kill can take at most this many connections of a worker."""

OPS = p.Authority(True, "ops")
ADMIN = p.Authority(True, "admin")
KILL_CONNECTIONS = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE %s"
)


# --- the worker processes -----------------------------------------------------------------


class Crew:
    """The worker processes: started, SIGKILLed, replaced, stopped; every exit accounted for."""

    def __init__(self, tmp: Path, dsn: str, schema: str, deadline: float) -> None:
        self.tmp = tmp
        self.dsn = dsn
        self.schema = schema
        self.deadline = deadline
        self.stop = tmp / "stop"
        self.rng = random.Random(7)
        self.running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        self.slots: dict[str, int] = {}
        self.started: list[str] = []
        self.sigkilled: set[str] = set()

    def start(self, slot: int, generation: str) -> None:
        worker_id = f"w{slot}{generation}"
        ledger = self.tmp / f"{worker_id}.jsonl"
        errors = self.tmp / f"{worker_id}.err"
        with errors.open("w") as stderr:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.postgres.pg_drain_worker",
                    "--dsn",
                    self.dsn,
                    "--schema",
                    self.schema,
                    "--worker",
                    worker_id,
                    "--seed",
                    str(self.rng.randrange(2**32)),
                    "--lease",
                    str(LEASE_SECONDS),
                    "--pause",
                    str(PAUSE_PROBABILITY),
                    "--stop",
                    str(self.stop),
                    "--log",
                    str(ledger),
                    "--deadline",
                    str(self.deadline),
                    *(["--reuse-token"] if slot in REUSE_TOKEN_SLOTS else []),
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        self.running[worker_id] = (proc, errors)
        self.slots[worker_id] = slot
        self.started.append(worker_id)

    def check(self) -> None:
        """No worker may die on its own: a crash is a failure, with its stderr."""
        for worker_id, (proc, errors) in self.running.items():
            assert proc.poll() is None, f"{worker_id} exited with {proc.returncode}: {errors.read_text()[-3000:]}"

    def sigkill(self, worker_id: str) -> None:
        proc, _ = self.running.pop(worker_id)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL, (worker_id, proc.returncode)
        self.sigkilled.add(worker_id)

    def sigkill_one_and_replace(self, generation: str) -> str:
        worker_id = self.rng.choice(sorted(self.running))
        self.sigkill(worker_id)
        self.start(self.slots[worker_id], generation)
        return worker_id

    def sigkill_all(self) -> None:
        for worker_id in sorted(self.running):
            self.sigkill(worker_id)

    def stop_all(self) -> None:
        self.stop.touch()
        for worker_id, (proc, errors) in sorted(self.running.items()):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.returncode == 0, (worker_id, proc.returncode, errors.read_text()[-3000:])
        self.running.clear()

    def abort(self) -> None:
        for proc, _ in self.running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.running.clear()

    def ledgers(self) -> dict[str, Path]:
        return {worker_id: self.tmp / f"{worker_id}.jsonl" for worker_id in self.started}


# --- talking to the database directly ------------------------------------------------------


def connect(dsn: str, schema: str) -> psycopg.Connection[dict[str, Any]]:
    # Named so that the kills (fk-worker-*) never take the test's own connection.
    conn = psycopg.connect(with_application_name(dsn, "fk-test-parent"), autocommit=True, row_factory=dict_row)
    conn.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
    return conn


def unfinished(conn: psycopg.Connection[dict[str, Any]]) -> int:
    row = conn.execute(
        "SELECT count(*) AS n FROM objects WHERE object_type = 'WorkflowExecution' "
        "AND state IN ('eligible', 'running', 'waiting')"
    ).fetchone()
    assert row is not None
    return int(row["n"])


def kill_connections(conn: psycopg.Connection[dict[str, Any]], pattern: str) -> int:
    return sum(1 for row in conn.execute(KILL_CONNECTIONS, (pattern,)) if row["pg_terminate_backend"])


def recover(store: PostgresStore, kind: p.RecoveryKind, execution_id: str) -> p.Outcome:
    view = store.read(execution_id)
    assert view is not None, execution_id
    command_id = f"final-{uuid.uuid4().hex}"
    if kind == p.RecoveryKind.RESUME_SAFE:
        return store.recover(resume_at_current_node(store, view, command_id, "ops", OPS))
    return store.recover(
        p.RecoveryRequest(
            command_id=command_id,
            kind=kind,
            execution_id=execution_id,
            business_id=view.execution.business_id,
            expected_revision=view.execution.revision,
            actor_id="ops",
            authority=OPS,
        )
    )


# --- the test ---------------------------------------------------------------------------------


def test_eight_workers_drain_two_thousand_executions_through_kills(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    started = time.monotonic()
    rng = random.Random(20260101)
    store = PostgresStore(pg_dsn, schema=pg_schema)
    conn = connect(pg_dsn, pg_schema)
    crew = Crew(tmp_path, pg_dsn, pg_schema, deadline=time.time() + BUDGET_SECONDS + 10)
    faults: collections.Counter[str] = collections.Counter()
    seconds: dict[str, float] = {}
    try:
        try:
            admit_all(store)
            seconds["admission"] = time.monotonic() - started

            # --- phase 1: drain under connection kills and SIGKILLs -------------------------
            for slot in range(WORKERS):
                crew.start(slot, "")
            reconciler = Reconciler(store, seed=99)  # type: ignore[arg-type]  # typed for SQLiteStore, uses the port
            next_kill = time.monotonic() + rng.uniform(*CONNECTION_KILL_EVERY)
            next_sigkill = time.monotonic() + rng.uniform(*SIGKILL_EVERY)
            while True:
                budget_check(started, f"first phase, {unfinished(conn)} unfinished, faults {dict(faults)}")
                crew.check()
                reconciler.quarantine_expired()
                reconciler.wake_waiting()
                now = time.monotonic()
                if now >= next_kill:
                    # Half the time every worker's connections, else one worker's.
                    if rng.random() < 0.5:
                        faults["backends terminated"] += kill_connections(conn, f"{APP_PREFIX}%")
                    else:
                        faults["backends terminated"] += kill_connections(
                            conn, application_name(rng.choice(sorted(crew.running)))
                        )
                    faults["connection kill rounds"] += 1
                    next_kill = now + rng.uniform(*CONNECTION_KILL_EVERY)
                if now >= next_sigkill:
                    crew.sigkill_one_and_replace(f"r{faults['SIGKILLs, replaced'] + 1}")
                    faults["SIGKILLs, replaced"] += 1
                    next_sigkill = now + rng.uniform(*SIGKILL_EVERY)
                if unfinished(conn) <= TAIL and faults["SIGKILLs, replaced"] >= MIN_SIGKILLS:
                    break
                time.sleep(0.05)
            seconds["first phase"] = time.monotonic() - started - seconds["admission"]

            # --- phase 2: every worker dies at once; what they held must be found ---------------
            phase2 = time.monotonic()
            crew.sigkill_all()
            faults["SIGKILLs, all at once"] = WORKERS
            abandoned = find_abandoned(conn, store)
            quarantined_at_end: collections.Counter[str] = collections.Counter()
            for execution_id in abandoned:
                outcome = recover(store, p.RecoveryKind.QUARANTINE_EXPIRED, execution_id)
                assert isinstance(outcome, p.Decision) and outcome.execution is not None, (execution_id, outcome)
                assert outcome.execution.state == ExecutionState.RECONCILIATION_REQUIRED
                # Resume what may still be resumed, so the next crew finishes it under a new fence.
                if reconciler.resumes[execution_id] < MAX_RESUMES:
                    reconciler.resumes[execution_id] += 1
                    kind = p.RecoveryKind.RESUME_SAFE
                else:
                    kind = p.RecoveryKind.FAIL
                decided = recover(store, kind, execution_id)
                assert isinstance(decided, p.Decision), (execution_id, decided)
                quarantined_at_end[kind.value] += 1
            assert store.expired() == []
            assert store.execution_ids(ExecutionState.RUNNING) == []
            seconds["second phase"] = time.monotonic() - phase2

            # --- phase 3: a fresh crew drains the rest ------------------------------------------
            phase3 = time.monotonic()
            for slot in range(WORKERS):
                crew.start(slot, "f")
            while unfinished(conn):
                budget_check(started, f"last phase, {unfinished(conn)} unfinished")
                crew.check()
                reconciler.quarantine_expired()
                reconciler.wake_waiting()
                time.sleep(0.05)
            crew.stop_all()
            seconds["last phase"] = time.monotonic() - phase3
            assert store.expired() == []
        finally:
            crew.abort()
            store.close()

        audit_started = time.monotonic()
        report = audit(conn, Ledger.read(crew.ledgers(), crew.sigkilled))
        seconds["audit"] = time.monotonic() - audit_started
    finally:
        conn.close()
    seconds["total"] = time.monotonic() - started
    report["faults"] = dict(faults)
    report["abandoned when every worker was SIGKILLed, quarantined then"] = dict(quarantined_at_end)
    report["reconciler"] = dict(reconciler.stats)
    report["seconds"] = {k: round(v, 2) for k, v in seconds.items()}
    print(json.dumps(report, indent=2, sort_keys=True))

    # The run must have exercised what it claims to prove.
    assert faults["backends terminated"] > 0 and faults["SIGKILLs, replaced"] >= MIN_SIGKILLS
    assert report["write requests that lost their connection"] > 0, "no kill ever hit a request"
    assert sum(quarantined_at_end.values()) > 0, "nothing was abandoned when every worker died"
    assert reconciler.stats["quarantined"] > 0, "no lease expired mid-work"
    assert report["zombie requests"].get("dead", 0) > 0 and report["zombie requests"].get("forged", 0) > 0
    assert {"lease_expired", "dispatch_not_claimed", "lease_token_mismatch", "worker_mismatch", "stale_fence"} <= set(
        report["refusals by code"]
    ), report["refusals by code"]
    assert seconds["total"] < BUDGET_SECONDS


def budget_check(started: float, what: str) -> None:
    assert time.monotonic() - started < BUDGET_SECONDS, f"not done within {BUDGET_SECONDS:.0f} s: {what}"


def admit_all(store: PostgresStore) -> None:
    # Four threads share the store's pool: admission is I/O bound, and this
    # keeps the 2,000 admissions to a few seconds.
    def admit(number: int) -> p.Outcome:
        return store.admit(p.AdmitRequest(f"ex-{number:04d}", f"biz-{number % 7}", "drain", 1, "start", ADMIN))

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(admit, range(EXECUTIONS)))
    assert all(isinstance(o, p.Decision) for o in outcomes)


def find_abandoned(conn: psycopg.Connection[dict[str, Any]], store: PostgresStore) -> list[str]:
    """With every worker dead: running executions are exactly the expired leases, and ``expired()`` finds them all."""
    # A SIGKILLed client cannot commit once its backend is gone; wait for that
    # so nothing changes under the checks below.
    give_up = time.monotonic() + 10
    while conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE %s",
        (f"{APP_PREFIX}%",),
    ).fetchone():
        assert time.monotonic() < give_up, "backends of SIGKILLed workers are still there"
        time.sleep(0.02)
    # Wait, on the database clock, until every lease has run out.
    give_up = time.monotonic() + LEASE_SECONDS * 4 + 5
    while conn.execute(
        "SELECT 1 FROM workflow_dispatch WHERE dispatch_state = 'claimed' AND lease_expires_at > clock_timestamp()"
    ).fetchone():
        assert time.monotonic() < give_up, "a lease outlived every worker"
        time.sleep(0.05)
    rows = conn.execute(
        "SELECT o.object_id, o.state, d.dispatch_state, d.lease_expires_at <= clock_timestamp() AS expired "
        "FROM objects o JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id "
        "WHERE o.object_type = 'WorkflowExecution' AND (o.state = 'running' OR d.dispatch_state = 'claimed') "
        "ORDER BY o.object_id"
    ).fetchall()
    for row in rows:
        assert (row["state"], row["dispatch_state"], row["expired"]) == ("running", "claimed", True), row
    running = [row["object_id"] for row in rows]
    assert store.expired() == running
    return running


# --- the audit ----------------------------------------------------------------------------------


def is_worker(actor: str) -> bool:
    return actor not in ("ops", "admin")


def rows(conn: psycopg.Connection[dict[str, Any]], sql: str) -> Iterator[dict[str, Any]]:
    yield from conn.execute(sql)  # type: ignore[arg-type]


def count(conn: psycopg.Connection[dict[str, Any]], sql: str) -> int:
    row = conn.execute(sql).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(next(iter(row.values())))


def audit(conn: psycopg.Connection[dict[str, Any]], ledger: Ledger) -> dict[str, Any]:
    """Every check of the database against itself and against the ledgers; returns the counts for the report."""
    loaded = load(lambda sql: rows(conn, sql))
    assert sorted(loaded.executions) == [f"ex-{n:04d}" for n in range(EXECUTIONS)], "an execution was lost or invented"
    final_states = check_finished_once(loaded)
    history = loaded.history

    leases, problems = replay_leases(history, lambda worker: LEASE, is_worker=is_worker)
    assert not problems, problems
    assert not ledger.problems, ledger.problems

    # --- the ledgers against the database -----------------------------------------------------------
    results = list(ledger.results.values())
    decided = [e for e in results if e["result"] == "decision"]
    refused = [e for e in results if e["result"] == "refusal"]
    lost = [e for e in results if e["result"] == "none"]
    assert {e["result"] for e in results} <= {"decision", "refusal", "none"}, "a worker got Unchanged"
    # "none" is what a worker logs for a request that lost its connection, and only then.
    assert all(
        ledger.done[(e["worker"], e["seq"])]["done"] == ("unavailable" if e["result"] == "none" else "returned")
        for e in results
    )
    assert not [e for e in refused if e["op"] == "claim"], "claim_next picked work it could not claim"
    zombies = [e for e in results if e["zombie"]]
    assert [e for e in zombies if e["result"] == "decision"] == [], "a zombie request was accepted"
    assert {e["code"] for e in refused} <= DEAD_CODES, collections.Counter(e["code"] for e in refused)

    landed, problems = compare_writes(history, ledger, is_worker=is_worker)
    assert not problems, problems
    unknown = ledger.unknown()

    # Evidence: exactly the accepted requests' (plus perhaps some of unknown
    # outcome), none of a refused request, each under the live lease it names.
    evidence = {
        r["object_id"]: r
        for r in rows(
            conn,
            "SELECT o.object_id, o.object_type, o.parent_id, o.revision, o.created_at, v.body FROM objects o "
            "JOIN object_revisions v ON v.object_id = o.object_id WHERE o.parent_id IS NOT NULL",
        )
    }
    accepted_evidence = {object_id for e in decided for object_id in e["evidence"]}
    refused_evidence = {object_id for e in refused for object_id in e["evidence"]}
    unknown_evidence = {object_id for i in unknown for object_id in i["evidence"]}
    assert refused_evidence and accepted_evidence
    assert refused_evidence.isdisjoint(evidence), "evidence of a refused request exists"
    assert accepted_evidence <= evidence.keys(), "evidence of an accepted request was lost"
    assert evidence.keys() <= accepted_evidence | unknown_evidence, "evidence without a request"
    for object_id, r in evidence.items():
        _, execution_id, worker, fence, token, _ = object_id.split(":")
        body = json.loads(r["body"])
        assert r["parent_id"] == execution_id and (body["token"], str(body["fence"])) == (token, fence)
        assert r["revision"] == 1
        assert any(
            (lease.worker, lease.token, lease.fence) == (worker, token, int(fence)) and lease.live_at(r["created_at"])
            for lease in leases[execution_id]
        ), f"evidence {object_id} was not committed under the live lease it names"
    _, problems = evidence_problems(
        {object_id: (r["parent_id"], r["created_at"]) for object_id, r in evidence.items()}, ledger, leases
    )
    assert not problems, problems

    # --- count(*) consistency ------------------------------------------------------------------------
    n_evidence = len(evidence)
    # Definitions are registered only for resumes (the kernel derives a resume's proof from them).
    assert count(conn, "SELECT count(*) FROM objects WHERE object_type <> 'WorkflowDefinition'") == (
        EXECUTIONS + n_evidence
    )
    assert count(conn, "SELECT count(*) FROM object_revisions") == count(
        conn, "SELECT coalesce(sum(revision), 0) FROM objects"
    )
    assert (
        count(
            conn,
            "SELECT count(*) FROM (SELECT o.object_id FROM objects o LEFT JOIN object_revisions v "
            "ON v.object_id = o.object_id GROUP BY o.object_id, o.revision "
            "HAVING count(v.revision) <> o.revision OR min(v.revision) <> 1 OR max(v.revision) <> o.revision) gaps",
        )
        == 0
    ), "an object whose revision rows are not exactly 1..revision"
    assert count(conn, "SELECT count(*) FROM execution_transitions WHERE event IS DISTINCT FROM 'renew'") == count(
        conn, "SELECT sum(revision) FROM objects WHERE object_type = 'WorkflowExecution'"
    )
    assert count(conn, "SELECT count(*) FROM commands") == count(
        conn, "SELECT count(*) FROM execution_transitions WHERE event IN ('quarantine_expired', 'fail', 'resume_safe')"
    )
    assert count(conn, "SELECT count(*) FROM wait_registrations") == count(
        conn, "SELECT count(*) FROM execution_transitions WHERE event = 'finalize_waiting'"
    )
    assert count(conn, "SELECT count(*) FROM wait_registrations WHERE woken_by IS NOT NULL") == count(
        conn, "SELECT count(*) FROM execution_transitions WHERE event = 'wake'"
    )

    by_op: collections.Counter[str] = collections.Counter(e["op"] for e in decided)
    lost_by_op = collections.Counter(
        ledger.intents[key]["intent"] for key, d in ledger.done.items() if d["done"] == "unavailable"
    )
    lost_claims = lost_by_op["claim"]  # claim_next logs no result line when it returns None
    # The pool must recover: a kill round costs a worker at most one failed
    # request per pooled connection (each dead one is discarded when it
    # fails).  A run of failures can straddle a second round (or, rarely, a
    # third) when the next round lands before the dead connections are used
    # up; a pool that handed out broken connections again would fail on and on.
    requests_by_worker: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
    for (worker_id, seq), d in ledger.done.items():
        requests_by_worker[worker_id].append((seq, d["done"]))
    longest_failing_run = 0
    for requests in requests_by_worker.values():
        run = 0
        for _, done in sorted(requests):
            run = run + 1 if done == "unavailable" else 0
            longest_failing_run = max(longest_failing_run, run)
    assert longest_failing_run <= 3 * POOL_SIZE, f"{longest_failing_run} write requests failed in a row"
    # Why each quarantined lease ran out: its holder abandoned it after a
    # lost connection, was SIGKILLed holding it (it was that worker's last
    # claim), or paused or ran slow past it.
    abandoned = {(e["worker"], e["abandoned"]) for e in ledger.abandoned}
    # A worker's claims are one after another, each at the database time of
    # its own transaction (the revision rows that carry them have no seq).
    last_claim: dict[str, tuple[str, datetime]] = {}
    for ts in history.values():
        for t in ts:
            if t["event"] == "claim" and (t["actor"] not in last_claim or t["at"] > last_claim[t["actor"]][1]):
                last_claim[t["actor"]] = (t["execution_id"], t["at"])
    quarantine_causes: collections.Counter[str] = collections.Counter()
    reclaims = 0
    for execution_id, held in leases.items():
        reclaims += sum(1 for a, b in itertools.pairwise(held) if a.worker == b.worker)
        for lease in held:
            if not lease.quarantined:
                continue
            if (lease.worker, execution_id) in abandoned:
                quarantine_causes["holder lost its connection"] += 1
            elif lease.worker in ledger.sigkilled and last_claim[lease.worker][0] == execution_id:
                quarantine_causes["holder SIGKILLed holding it"] += 1
            else:
                quarantine_causes["holder paused or ran slow"] += 1
    errors: collections.Counter[str] = collections.Counter()
    for entry in ledger.done.values():
        if entry["done"] == "unavailable":
            errors[f"write: {entry['error']}"] += 1
    for entry in ledger.read_errors:
        errors[f"read ({entry['read_error']}): {entry['error']}"] += 1
    return {
        "final states": dict(final_states),
        "claims": by_op["claim"],
        "claims in the database": sum(1 for ts in history.values() for t in ts if t["event"] == "claim"),
        "accepted by operation": dict(by_op),
        "refusals by code": dict(collections.Counter(e["code"] for e in refused)),
        "zombie requests": dict(collections.Counter(e["zombie"] for e in zombies)),
        "write requests that lost their connection": len(lost) + lost_claims,
        "write requests that lost their connection, by operation": dict(lost_by_op),
        "longest run of failed write requests in one worker": longest_failing_run,
        "requests cut by SIGKILL": sum(1 for key in ledger.intents if key not in ledger.done),
        "writes of unknown outcome that landed": landed,
        "executions abandoned after a lost connection": len(ledger.abandoned),
        "quarantines, by why the lease ran out": dict(quarantine_causes),
        "claims by the worker that held the execution's previous lease": reclaims,
        "exceptions seen by workers": dict(errors),
        "evidence objects": n_evidence,
        "refused evidence ids (absent)": len(refused_evidence),
        "transitions": sum(len(ts) for ts in history.values()),
    }
