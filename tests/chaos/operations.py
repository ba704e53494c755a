"""The operations' chaos run: real ``fencekeeper op worker`` processes, killed, stopped and cut off, then a full audit.

Run as ``python -m tests.chaos.operations --store sqlite|postgres|both --seconds N --seed S``
(``make chaos`` runs both stores after the executions' run).  It exits 0 when
the audit prints ``violations: 0`` and 1 otherwise.  Rules of the run:

- **The workers are ``fencekeeper op worker``** processes, two threads each,
  leases of 2 s, ``--poll 0.2``, with the actions of ``tests/chaos/op_actions.py``:
  an atomic transfer between the application's accounts, and two external
  effects over a provider log every process shares (a capture that needs an
  approval and can be reconciled, a payout that can be neither reconciled
  nor repeated).
- **The driver** (this process) does what clients and approvers do, through
  the Python service (``DurableOperationService``): submits operations,
  submits some of them again identically (the same operation must come
  back) and some under the same key with other input (``idempotency_conflict``),
  approves or rejects the captures (with a requester trying to approve their
  own, a repeated decision and a contradicting one), and cancels at random.
- **The faults**, at random moments chosen by the seed: SIGKILL of a worker
  (another is started in its place), SIGSTOP of a worker for 1.5-2.5 leases
  and then SIGCONT, and on PostgreSQL ``pg_terminate_backend`` of the
  workers' connections.
- **The end**: the workers are stopped (SIGTERM, SIGKILL after 10 s), every
  capture still awaiting a decision is decided, the leases are left to
  expire, and a fresh ``op worker --until-idle`` runs (again, while retries
  are still waiting for their time) until nothing is due.  Operations replace
  an expired owner on their own (seed 001, Claims, leases, and fencing):
  there is no recovery step for an operator here.
- **The audit** (:func:`audit`) reads the database, the provider log and
  the driver's record (``driver.json``) and prints each check with its
  counts, every violation, and ``violations: N``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import logging
import os
import random
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.adapters import codec
from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.operations.service import (
    DurableOperationError,
    DurableOperationService,
    PrincipalReference,
)
from fencekeeper.adapters.store import StoreError
from fencekeeper.kernel.operations import stable_principal
from tests.chaos import op_actions
from tests.chaos.run import (
    DEFAULT_PG_DSN,
    Crew,
    PostgresTarget,
    RunOutcome,
    SqliteTarget,
    Target,
    add_run_arguments,
    finish_run,
    print_report_end,
    run_stores,
)

ROOT = Path(__file__).resolve().parents[2]
TENANT = "chaos"
NAMESPACE = "chaos"
WORKER_PREFIX = "chaos-opw"
APPLICATION_PREFIX = "fkop-"
THREADS = 2
REQUESTERS = ("alice", "carol")
APPROVERS = ("bob", "dave")
ACTIONS = "tests.chaos.op_actions"
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "outcome_unknown"})
TIME_COLUMNS = frozenset(
    {"at", "started_at", "ended_at", "admitted_at", "deadline", "next_eligible_at", "lease_expires_at", "due_at"}
)


@attrs.define
class Config:
    store: str
    seconds: float
    seed: int
    workers: int = 3
    lease: float = 2.0
    dsn: str = DEFAULT_PG_DSN
    keep: Path | None = None
    quiet: bool = False
    max_operations: int | None = None


def say(config: Config, text: str) -> None:
    if not config.quiet:
        print(text, flush=True)


Rows = Callable[[str], list[dict[str, Any]]]


def sqlite_rows(path: Path) -> Rows:
    def run(sql: str) -> list[dict[str, Any]]:
        conn = sqlite3.connect(path)
        conn.row_factory = sqlite3.Row
        try:
            return [
                {k: codec.decode_time(r[k]) if k in TIME_COLUMNS and isinstance(r[k], str) else r[k] for k in r.keys()}  # noqa: SIM118 - sqlite3.Row has no iterator of keys
                for r in conn.execute(sql)
            ]
        finally:
            conn.close()

    return run


def postgres_rows(target: PostgresTarget) -> Rows:
    reader = target.rows()

    def run(sql: str) -> list[dict[str, Any]]:
        return list(reader(sql))

    return run


def fencekeeper_command() -> list[str]:
    """The installed command line, as an operator runs it."""
    script = Path(sys.executable).with_name("fencekeeper")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from fencekeeper.adapters.cli import main; sys.exit(main())"]


def worker_command(target: Target, name: str, lease: float, *, until_idle: bool = False) -> list[str]:
    return [
        *fencekeeper_command(), "op", "worker", "--db", target.url(f"{APPLICATION_PREFIX}{name}"),
        "--tenant", TENANT, "--namespace", NAMESPACE, "--actions", ACTIONS, "--concurrency", str(THREADS),
        "--lease", str(lease), "--poll", "0.2", "--id", name, *(["--until-idle"] if until_idle else []),
    ]  # fmt: skip


def worker_env(directory: Path, seed: int) -> dict[str, str]:
    # The command line finds --actions by import: the repository's root is where tests.chaos lives.
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {
        **os.environ,
        "PYTHONPATH": path,
        op_actions.CAPTURES_ENV: str(directory / "captures.jsonl"),
        op_actions.SEED_ENV: str(seed),
    }


class OpCrew(Crew):
    """The executions' crew (kill, stop and resume, stop all), starting ``fencekeeper op worker`` processes."""

    def start(self, *, final: bool = False) -> str:
        self.generation += 1
        name = f"{WORKER_PREFIX}{self.generation}"
        with (self.directory / f"{name}.err").open("w") as stderr:
            proc = subprocess.Popen(
                worker_command(self.target, name, self.config.lease),
                cwd=ROOT, env=worker_env(self.directory, self.config.seed), stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        self.running[name] = proc
        self.started.append(name)
        self.pids[proc.pid] = name
        return name

    @property
    def pids(self) -> dict[int, str]:
        """Which worker process each pid was: the provider's log knows callers by pid."""
        if not hasattr(self, "_pids"):
            self._pids: dict[int, str] = {}
        return self._pids


def lease_holders(rows: Rows) -> set[str]:
    """The worker processes holding an Attempt's lease now."""
    return {
        str(r["owner"]).rsplit("-", 1)[0]
        for r in rows("SELECT owner FROM operations WHERE state = 'running'")
        if r["owner"]
    }


# --- the driver --------------------------------------------------------------------------------


class Driver:
    """What clients and approvers do during the run, through the Python service; everything it was told is kept."""

    def __init__(self, service: DurableOperationService, rng: random.Random) -> None:
        self.service = service
        self.rng = rng
        self.identities: dict[str, dict[str, Any]] = {}
        """client key -> principal, action, input, the operation id it was answered with (None: unknown)."""
        self.answers: list[dict[str, Any]] = []
        """Every resubmission, conflict, decision and cancellation, with the answer it got."""
        self.decided: set[str] = set()
        self.stats: collections.Counter[str] = collections.Counter()

    def _store_error(self, what: str, exc: StoreError) -> None:
        self.stats[f"{what}: store error {exc.code}"] += 1

    def submit_new(self) -> None:
        n = len(self.identities) + 1
        action = self.rng.choices(("transfer", "capture", "payout"), weights=(6, 2, 2))[0]
        if action == "transfer":
            source, target = self.rng.sample(sorted(op_actions.ACCOUNTS), 2)
            # Now and then more than an account holds: insufficient_funds, a conclusive failure.
            value: dict[str, Any] = {"from": source, "to": target, "amount": self.rng.randint(1, 700)}
        else:
            value = {"order": f"o-{n}", "amount": self.rng.randint(1, 500)}
        key = f"k-{n:04d}"
        principal = self.rng.choice(REQUESTERS)
        self.identities[key] = {"principal": principal, "action": action, "input": value, "operation_id": None}
        if self.rng.random() < 0.1:
            self._submit_twice_at_once(key)
            return
        try:
            admission = self._submit(key, action, value)
        except StoreError as exc:
            self.identities[key]["lost"] = True  # the answer is lost: submitted again later, identically
            self._store_error("submit", exc)
            return
        except DurableOperationError as exc:
            self.identities[key]["refused"] = exc.code
            self.stats[f"submit refused: {exc.code}"] += 1
            return
        self.identities[key]["operation_id"] = admission.operation_id
        self.identities[key]["created"] = admission.created
        self.stats["submitted"] += 1

    def _submit_twice_at_once(self, key: str) -> None:
        """A new identity submitted from two threads at the same moment: one operation, created once."""
        identity = self.identities[key]
        answers: list[Any] = [None, None]
        start = threading.Barrier(2)

        def submit(number: int) -> None:
            start.wait()
            try:
                answers[number] = self._submit(key, identity["action"], dict(identity["input"]))
            except (StoreError, DurableOperationError) as exc:
                answers[number] = exc

        threads = [threading.Thread(target=submit, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for answer in answers:
            if isinstance(answer, StoreError):
                self._store_error("submit twice at once", answer)
            elif isinstance(answer, DurableOperationError):
                self.answers.append({"what": "at once", "key": key, "error": answer.code})
            else:
                identity["operation_id"] = identity["operation_id"] or answer.operation_id
                self.answers.append(
                    {"what": "at once", "key": key, "operation_id": answer.operation_id, "created": answer.created}
                )
        self.stats["submitted twice at once"] += 1

    def _submit(self, key: str, action: str, value: dict[str, Any]) -> Any:
        identity = self.identities[key]
        return self.service.submit(
            tenant=TENANT,
            principal=PrincipalReference("users", 1, identity["principal"]),
            action=action,
            input=value,
            client_key=key,
        )

    def resubmit(self) -> None:
        """The same submission again, as a client that timed out would: the same operation comes back."""
        if not self.identities:
            return
        key = self.rng.choice(sorted(self.identities))
        identity = self.identities[key]
        try:
            admission = self._submit(key, identity["action"], dict(identity["input"]))
        except StoreError as exc:
            self._store_error("resubmit", exc)
            return
        except DurableOperationError as exc:
            self.answers.append({"what": "resubmit", "key": key, "error": exc.code})
            return
        if identity["operation_id"] is None:
            identity["operation_id"] = admission.operation_id  # an admission whose answer was lost: now known
        self.answers.append(
            {"what": "resubmit", "key": key, "operation_id": admission.operation_id, "created": admission.created}
        )
        self.stats["resubmitted identically"] += 1

    def conflict(self) -> None:
        """The same key with other input (or another action): refused, idempotency_conflict."""
        # Only an identity whose Operation is known to exist: one whose first answer was lost may never
        # have committed, and "conflicting" input would then be the first submission of that key.
        known = self._known()
        if not known:
            return
        key, identity = self.rng.choice(known)
        value = dict(identity["input"])
        action = identity["action"]
        if self.rng.random() < 0.5 or action == "transfer":
            value["amount"] += 1
        else:
            action = "payout" if action == "capture" else "capture"
        try:
            admission = self._submit(key, action, value)
        except StoreError as exc:
            self._store_error("conflicting resubmission", exc)
            return
        except DurableOperationError as exc:
            self.answers.append({"what": "conflict", "key": key, "error": exc.code})
            self.stats[f"conflicting resubmission: {exc.code}"] += 1
            return
        self.answers.append({"what": "conflict", "key": key, "operation_id": admission.operation_id})

    def _known(self, action: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        return [
            (k, i) for k, i in sorted(self.identities.items())
            if i["operation_id"] is not None and (action is None or i["action"] == action)
        ]  # fmt: skip

    def decide(self, *, everything: bool = False) -> None:
        """Decide a capture that awaits approval; ``everything``: every one of them (the end of the run)."""
        waiting = [(k, i) for k, i in self._known("capture") if i["operation_id"] not in self.decided]
        if not waiting:
            return
        for key, identity in waiting if everything else [self.rng.choice(waiting)]:
            self._decide_one(key, identity)

    def _decide_one(self, key: str, identity: dict[str, Any]) -> None:
        operation_id = identity["operation_id"]
        requester = identity["principal"]
        approver = self.rng.choice(APPROVERS)
        approve = self.rng.random() < 0.8
        plan = [(approver, approve, f"ap-{key}")]
        roll = self.rng.random()
        if roll < 0.15:
            plan.insert(0, (requester, True, f"self-{key}"))  # the requester may not decide their own
        elif roll < 0.3:
            plan.append((approver, approve, f"ap-{key}"))  # the same decision delivered twice
        elif roll < 0.45:
            other = APPROVERS[1 - APPROVERS.index(approver)]
            plan.append((other, not approve, f"ap2-{key}"))  # a contradicting second decision
        for who, verdict, approval_id in plan:
            try:
                record = self.service.decide(
                    operation_id, approver=PrincipalReference("users", 1, who), approve=verdict, approval_id=approval_id
                )
            except StoreError as exc:
                self._store_error("decide", exc)
                return  # decided again later
            except DurableOperationError as exc:
                answer: dict[str, Any] = {"error": exc.code}
            else:
                answer = {"state": record.state.value}
            self.answers.append(
                {"what": "decide", "key": key, "operation_id": operation_id, "approver": who, "approve": verdict,
                 "approval_id": approval_id, "self": who == requester, **answer}
            )  # fmt: skip
            self.stats[f"decisions: {answer.get('error') or 'recorded'}"] += 1
        self.decided.add(operation_id)

    def cancel(self) -> None:
        # Mostly one of the newest, which may still be waiting, running or retrying: a race with its effect.
        known = self._known()[-8:] if self.rng.random() < 0.8 else self._known()
        if not known:
            return
        key, identity = self.rng.choice(known)
        operation_id = identity["operation_id"]
        try:
            record = self.service.cancel(
                operation_id, principal=PrincipalReference("users", 1, identity["principal"]), reason="chaos"
            )
        except StoreError as exc:
            self._store_error("cancel", exc)
            return
        except DurableOperationError as exc:
            self.answers.append({"what": "cancel", "key": key, "operation_id": operation_id, "error": exc.code})
            self.stats[f"cancellations: {exc.code}"] += 1
            return
        self.answers.append({"what": "cancel", "key": key, "operation_id": operation_id, "state": record.state.value})
        self.stats[f"cancellations: {record.state.value}"] += 1

    def tick(self, admitting: bool) -> None:
        if admitting and self.rng.random() < 0.5:
            self.submit_new()
        if self.rng.random() < 0.15:
            self.resubmit()
        if self.rng.random() < 0.04:
            self.conflict()
        if self.rng.random() < 0.3:
            self.decide()
        if self.rng.random() < 0.04:
            self.cancel()

    def settle_unknown(self) -> None:
        """Admissions whose answer was lost: submitted again, identically, until the store answers."""
        for key, identity in sorted(self.identities.items()):
            if identity["operation_id"] is None and "refused" not in identity:
                for _ in range(5):
                    try:
                        admission = self._submit(key, identity["action"], dict(identity["input"]))
                    except StoreError:
                        time.sleep(0.5)
                        continue
                    identity["operation_id"] = admission.operation_id
                    self.answers.append(
                        {"what": "resubmit", "key": key, "operation_id": admission.operation_id,
                         "created": admission.created}
                    )  # fmt: skip
                    break

    def record(self) -> dict[str, Any]:
        return {"identities": self.identities, "answers": self.answers}


# --- the run -----------------------------------------------------------------------------------------


def drain(config: Config, target: Target, directory: Path, rows: Rows) -> collections.Counter[str]:
    """``op worker --until-idle``, again while operations wait for a retry's time, until none is left to run."""
    tally: collections.Counter[str] = collections.Counter()
    give_up = time.monotonic() + 60
    rounds = 0
    while time.monotonic() < give_up:
        rounds += 1
        name = f"{WORKER_PREFIX}-drain{rounds}"
        proc = subprocess.run(
            worker_command(target, name, config.lease, until_idle=True),
            cwd=ROOT, env=worker_env(directory, config.seed), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        (directory / f"{name}.err").write_text(proc.stderr)
        tally[f"op worker --until-idle exited {proc.returncode}"] += 1
        if tally["op worker --until-idle exited 2"] >= 3:
            break  # it cannot start (--db, --actions): the audit shows what is left
        left = rows("SELECT state, next_eligible_at FROM operations WHERE state IN ('admitted', 'running')")
        if not left:
            break
        time.sleep(0.3)
    tally["rounds"] = rounds
    return tally


def run_one(config: Config, kind: str) -> RunOutcome:
    started = time.monotonic()
    rng = random.Random(f"{config.seed}-{kind}-operations")
    directory = Path(tempfile.mkdtemp(prefix=f"fencekeeper-opchaos-{kind}-"))
    target: Target = SqliteTarget(directory) if kind == "sqlite" else PostgresTarget(config.dsn)
    say(config, f"operations chaos: {kind}, {config.seconds:.0f} s of faults, seed {config.seed}, files in {directory}")
    store: TransactionalOperationStore = open_operation_store(target.url(f"{APPLICATION_PREFIX}driver"), tenant=TENANT)
    op_actions.prepare(store)
    rows: Rows = sqlite_rows(directory / "chaos.db") if isinstance(target, SqliteTarget) else postgres_rows(target)  # type: ignore[arg-type]
    service = DurableOperationService(store, op_actions.registry(), op_actions.resolvers(), namespace=NAMESPACE)
    driver = Driver(service, rng)
    crew = OpCrew(config, target, directory, rng)  # type: ignore[arg-type]
    faults: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    completed = False
    try:
        for _ in range(config.workers):
            crew.start()
        end = time.monotonic() + config.seconds
        next_kill = time.monotonic() + rng.uniform(2, 5)
        next_stop = time.monotonic() + rng.uniform(1, 3)
        next_cut = time.monotonic() + rng.uniform(1, 3)
        while time.monotonic() < end:
            now = time.monotonic()
            crew.reap()
            crew.resume_due()
            step_started = time.monotonic()
            driver.tick(
                admitting=now < end - 3
                and (config.max_operations is None or len(driver.identities) < config.max_operations)
            )
            if now >= next_kill:
                crew.sigkill_one(lease_holders(rows))
                faults["workers SIGKILLed (and replaced)"] += 1
                next_kill = now + rng.uniform(3, 7)
            if now >= next_stop:
                if crew.sigstop_one(lease_holders(rows)):
                    faults["workers SIGSTOPped past their lease, then SIGCONTed"] += 1
                next_stop = now + rng.uniform(2, 5)
            if isinstance(target, PostgresTarget) and now >= next_cut:
                one = rng.random() < 0.5 and crew.running
                pattern = (
                    f"{APPLICATION_PREFIX}{rng.choice(sorted(crew.running))}"
                    if one
                    else f"{APPLICATION_PREFIX}{WORKER_PREFIX}%"
                )
                faults["backends terminated (pg_terminate_backend)"] += target.kill_backends(pattern)
                if rng.random() < 0.2:
                    # The driver's own sessions too: a client whose request fails submits the same identity again.
                    faults["the driver's backends terminated"] += target.kill_backends(f"{APPLICATION_PREFIX}driver")
                next_cut = now + rng.uniform(1, 3)
            # A stopped worker inside its transaction makes the driver wait on its lock: the longest wait is reported.
            slowest = max(slowest, time.monotonic() - step_started)
            time.sleep(0.05)
        chaos_seconds = time.monotonic() - started

        # The end: stop the workers, decide what awaits a decision, let the leases run out, drain.
        crew.stop_all()
        for _ in range(3):  # a store error leaves an admission or a decision for the next round
            driver.settle_unknown()
            driver.decide(everything=True)
        time.sleep(config.lease + 0.5)
        drained = drain(config, target, directory, rows)
        completed = True
    finally:
        crew.abort()
        store.close()
        if not completed and isinstance(target, PostgresTarget):
            target.close(drop=config.keep is None)
    (directory / "driver.json").write_text(json.dumps(driver.record(), sort_keys=True, indent=1))
    (directory / "workers.json").write_text(
        json.dumps({"exits": dict(crew.exits), "started": crew.started, "pids": crew.pids}, indent=1)
    )
    audit_started = time.monotonic()
    violations, checks, noted = audit(rows, directory, config.lease)
    report = {
        "faults": dict(faults),
        "driver": dict(sorted(driver.stats.items())),
        "final drain": dict(drained),
        "checks": checks,
        "noted": noted,
        "seconds": {
            "chaos": round(chaos_seconds, 1),
            "end and drain": round(audit_started - started - chaos_seconds, 1),
            "audit": round(time.monotonic() - audit_started, 1),
            "slowest round of the driver": round(slowest, 1),
        },
    }
    return finish_run(
        kind, started, target=target, directory=directory, keep=config.keep, violations=violations, report=report
    )


# --- the audit -----------------------------------------------------------------------------------------


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def audit(rows: Rows, directory: Path, lease: float) -> tuple[list[str], dict[str, str], list[str]]:
    """Every check, over the database, the provider log and the driver's record in ``directory``.

    Returns the violations, one line per check with its counts, and the
    things noted, not violations: operations left awaiting a decision, and
    calls that reached the provider from an Attempt already replaced.
    """
    checks: dict[str, str] = {}
    violations: list[str] = []

    def check(name: str, summary: str, problems: list[str]) -> None:
        checks[name] = f"{summary}; {len(problems)} violations"
        violations.extend(f"{name}: {problem}" for problem in problems)

    record = json.loads((directory / "driver.json").read_text())
    provider = op_actions.read_log(directory / "captures.jsonl")
    operations = {r["operation_id"]: r for r in rows("SELECT * FROM operations")}
    attempts: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows("SELECT * FROM operation_attempts ORDER BY operation_id, number"):
        attempts[r["operation_id"]].append(r)
    history: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows("SELECT * FROM operation_transitions ORDER BY operation_id, revision"):
        history[r["operation_id"]].append(r)

    check_identities(rows, record, operations, check)
    check_answers(record, operations, history, check)
    check_transfers(rows, operations, attempts, check)
    workers = json.loads((directory / "workers.json").read_text()) if (directory / "workers.json").exists() else {}
    pids = {int(pid): name for pid, name in workers.get("pids", {}).items()}
    noted: list[str] = []
    check_effects(provider, operations, history, attempts, pids=pids, check=check, noted=noted)
    check_attempts(operations, attempts, history, timedelta(seconds=lease), check)
    check_history(rows, operations, history, check)
    check_cancellation(rows, operations, history, provider=provider, record=record, check=check)

    check_workers(directory, check)

    # Nothing is left running or due: every operation ended, or awaits an approver (listed).
    now = datetime.now(UTC)
    listed, stuck = [], []
    for operation_id, op in sorted(operations.items()):
        if op["state"] in TERMINAL:
            continue
        if op["state"] == "awaiting_approval" and now < op["deadline"]:
            listed.append(f"{operation_id}: awaiting_approval until {op['deadline'].isoformat()}")
            continue
        stuck.append(f"{operation_id}: left {op['state']} (due {op['due_at']})")
    open_attempts = [
        f"{a['operation_id']} attempt {a['number']}: still running"
        for ats in attempts.values() for a in ats if a["state"] == "running"
    ]  # fmt: skip
    states = collections.Counter(
        f"{op['state']}" + (f" ({op['outcome']})" if op["outcome"] not in (None, op["state"]) else "")
        for op in operations.values()
    )
    check(
        "nothing is left running or due",
        f"{len(operations)} operations ({', '.join(f'{s} {n}' for s, n in sorted(states.items()))}); "
        f"{len(listed)} awaiting a decision (listed)",
        stuck + open_attempts,
    )
    return violations, checks, listed + noted


def check_identities(
    rows: Rows,
    record: dict[str, Any],
    operations: dict[str, dict[str, Any]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """Every submitted identity maps to exactly one operation, the one the driver was told, with its input."""
    problems: list[str] = []
    by_identity: dict[tuple[str, str, str, str], list[str]] = collections.defaultdict(list)
    for operation_id, op in operations.items():
        by_identity[(op["namespace"], op["tenant"], op["principal"], op["client_key"])].append(operation_id)
    for identity, ids in sorted(by_identity.items()):
        if len(ids) > 1:
            problems.append(f"identity {identity} maps to {len(ids)} operations: {', '.join(sorted(ids))}")
    # The table keys identities by the principal's stable reference (operations.identity_key).
    table = {
        (r["namespace"], r["tenant"], r["principal"], r["client_key"]): r["operation_id"]
        for r in rows("SELECT * FROM operation_identities")
    }
    submitted = record["identities"]
    seen: set[str] = set()
    for key, identity in sorted(submitted.items()):
        full = (NAMESPACE, TENANT, f"users:v1:{identity['principal']}", key)
        found = by_identity.get(full, [])
        if "refused" in identity:
            problems.append(f"{key}: a new submission was refused ({identity['refused']})")
            continue
        if len(found) != 1:
            problems.append(f"{key}: {len(found)} operations hold its identity")
            continue
        (operation_id,) = found
        seen.add(operation_id)
        stable = (NAMESPACE, TENANT, stable_principal(full[2]), key)
        if table.get(stable) != operation_id:
            problems.append(f"{key}: the identity table names {table.get(stable)}, not {operation_id}")
        if identity["operation_id"] not in (None, operation_id):
            problems.append(
                f"{key}: the driver was answered {identity['operation_id']}, the store holds {operation_id}"
            )
        if identity.get("created") is False:
            problems.append(f"{key}: its first submission was answered as a repeat")
        op = operations[operation_id]
        if op["action_name"] != identity["action"] or json.loads(op["input"]) != identity["input"]:
            problems.append(f"{key}: {operation_id} holds {op['action_name']} {op['input']}, not what was submitted")
    for operation_id in sorted(operations.keys() - seen):
        problems.append(f"{operation_id} exists but the driver submitted no identity for it")
    unknown = sum(1 for i in submitted.values() if i["operation_id"] is None)
    lost = sum(1 for i in submitted.values() if i.get("lost"))
    check(
        "every submitted identity maps to exactly one operation",
        f"{len(submitted)} identities submitted ({lost} first answers lost, {unknown} never received), "
        f"{len(operations)} operations, "
        f"{len(table)} identity rows",
        problems,
    )


def check_answers(
    record: dict[str, Any],
    operations: dict[str, dict[str, Any]],
    history: dict[str, list[dict[str, Any]]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """Each answer the driver got was the right one: repeats, conflicts, decisions."""
    problems: list[str] = []
    counts: collections.Counter[str] = collections.Counter()
    identities = record["identities"]
    first_recorded: dict[str, bool] = {}
    created_at_once: collections.Counter[str] = collections.Counter()
    for answer in record["answers"]:
        what, key = answer["what"], answer["key"]
        expected = identities[key]["operation_id"]
        if what == "resubmit":
            counts["identical resubmissions"] += 1
            if "error" in answer:
                problems.append(f"{key}: an identical resubmission was refused ({answer['error']})")
            elif answer["operation_id"] != expected:
                problems.append(f"{key}: an identical resubmission returned {answer['operation_id']}, not {expected}")
        elif what == "at once":
            counts["submissions twice at once"] += 1
            if "error" in answer:
                problems.append(f"{key}: one of two identical submissions at once was refused ({answer['error']})")
            elif answer["operation_id"] != expected:
                problems.append(
                    f"{key}: one of two submissions at once returned {answer['operation_id']}, not {expected}"
                )
            elif answer["created"]:
                created_at_once[key] += 1
        elif what == "conflict":
            counts["conflicting resubmissions"] += 1
            if answer.get("error") != "idempotency_conflict":
                problems.append(f"{key}: a conflicting resubmission was answered {answer}, not idempotency_conflict")
        elif what == "decide":
            counts["decisions"] += 1
            if answer["self"] and answer.get("error") not in ("self_approval", "not_awaiting_approval"):
                problems.append(f"{key}: the requester's own approval was answered {answer}, not self_approval")
            if answer["approval_id"].startswith("ap-"):
                first_recorded[key] = "state" in answer
            contradicting = answer["approval_id"].startswith("ap2-") and first_recorded.get(key)
            if contradicting and answer.get("error") != "decision_conflict":
                problems.append(f"{key}: a contradicting second decision was answered {answer}, not decision_conflict")
    for key, n in sorted(created_at_once.items()):
        if n > 1:
            problems.append(f"{key}: both of two identical submissions at once were answered as created")
    # An operation that ran after an approval ran only with an approval that another principal gave.
    ran_unapproved = []
    for operation_id, op in operations.items():
        if not op["requires_approval"]:
            continue
        approval = json.loads(op["approval"]) if op["approval"] else None
        claimed = any(t["event"] in ("claim", "reclaim_expired") for t in history.get(operation_id, []))
        if claimed and (approval is None or not approval["approved"] or approval["approver"] == approval["requester"]):
            ran_unapproved.append(f"{operation_id} was claimed without an approval by another principal ({approval})")
        if approval is not None and not approval["approved"] and op["state"] != "failed":
            ran_unapproved.append(f"{operation_id} was rejected but is {op['state']}")
    check(
        "every answer to the driver was the right one",
        ", ".join(f"{n} {c}" for c, n in sorted(counts.items())) or "none",
        problems + ran_unapproved,
    )


def check_transfers(
    rows: Rows,
    operations: dict[str, dict[str, Any]],
    attempts: dict[str, list[dict[str, Any]]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """Each succeeded transfer applied exactly once, by its succeeded Attempt; nothing else applied; balances add up."""
    problems: list[str] = []
    postings: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows("SELECT * FROM chaos_postings"):
        postings[r["operation_id"]].append(r)
    recorded = {r["operation_id"]: r for r in rows("SELECT * FROM app_transfers")}
    balances = {r["account_id"]: int(r["balance"]) for r in rows("SELECT * FROM app_accounts")}
    succeeded = 0
    for operation_id, op in sorted(operations.items()):
        if op["action_name"] != "transfer":
            continue
        mine = postings.get(operation_id, [])
        value = json.loads(op["input"])
        if op["state"] == "succeeded":
            succeeded += 1
            winner = [a["number"] for a in attempts.get(operation_id, []) if a["state"] == "succeeded"]
            if len(mine) != 1:
                problems.append(f"{operation_id} succeeded and was applied {len(mine)} times")
            elif [mine[0]["fence"]] != winner:
                problems.append(
                    f"{operation_id} was applied by fence {mine[0]['fence']}, its succeeded attempt is {winner}"
                )
            for p in mine:
                if (p["from_account"], p["to_account"], int(p["amount"])) != (
                    value["from"],
                    value["to"],
                    value["amount"],
                ):
                    problems.append(f"{operation_id}: posting {p} is not its input {value}")
            if operation_id not in recorded:
                problems.append(f"{operation_id} succeeded but app_transfers has no row for it")
        else:
            if mine:
                problems.append(f"{operation_id} is {op['state']} ({op['outcome']}) but was applied {len(mine)} times")
            if operation_id in recorded:
                problems.append(f"{operation_id} is {op['state']} but app_transfers records it")
    for operation_id in sorted(postings.keys() - operations.keys()):
        problems.append(f"a posting names {operation_id}, which is no operation")
    expected = dict(op_actions.ACCOUNTS)
    for ps in postings.values():
        for p in ps:
            expected[p["from_account"]] -= int(p["amount"])
            expected[p["to_account"]] += int(p["amount"])
    for account in sorted(expected.keys() | balances.keys()):
        if balances.get(account) != expected.get(account):
            problems.append(f"{account} holds {balances.get(account)}, its postings make {expected.get(account)}")
    if sum(balances.values()) != sum(op_actions.ACCOUNTS.values()):
        problems.append(f"the accounts hold {sum(balances.values())} in all, not {sum(op_actions.ACCOUNTS.values())}")
    check(
        "each succeeded transfer applied exactly once, balances conserved",
        f"{sum(1 for op in operations.values() if op['action_name'] == 'transfer')} transfers, {succeeded} succeeded, "
        f"{sum(len(p) for p in postings.values())} postings; {sum(balances.values())} held in "
        f"{len(balances)} accounts",
        problems,
    )


def _callers(
    events: list[dict[str, Any]], mine: list[dict[str, Any]], pids: dict[int, str]
) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Which Attempt made each call and lookup of one effect, and which calls came from an Attempt already replaced.

    An event is known by its process (the log's pid), and made by the newest
    Attempt that process had begun on the operation by then.  A call is late
    when a later Attempt had been claimed before it.
    """
    who: dict[int, dict[str, Any]] = {}
    late: set[int] = set()
    for index, e in enumerate(events):
        if e["kind"] not in ("call", "lookup"):
            continue
        process = pids.get(int(e.get("pid", -1)))
        if process is None:
            continue
        at = datetime.fromtimestamp(e["t"], UTC)
        ours = [a for a in mine if a["worker_id"].rsplit("-", 1)[0] == process and a["started_at"] <= at]
        if not ours:
            continue
        who[index] = ours[-1]
        if e["kind"] == "call" and any(a["number"] > ours[-1]["number"] and a["started_at"] <= at for a in mine):
            late.add(index)
    return who, late


def check_effects(
    provider: list[dict[str, Any]],
    operations: dict[str, dict[str, Any]],
    history: dict[str, list[dict[str, Any]]],
    attempts: dict[str, list[dict[str, Any]]],
    *,
    pids: dict[int, str],
    check: Callable[[str, str, list[str]], None],
    noted: list[str],
) -> None:
    """The provider log against itself and the operations: never resent blindly, never after an unknown end.

    A late call (:func:`_late_calls`) is noted, not counted: no worker can
    recall a request it sent before it was stopped, and the provider here
    neither deduplicates nor is fenced, so such a call may apply an effect
    that its replacement looked up, did not find, and performed (seed 001:
    "Exactly-once external effects are not guaranteed"; docs/operations.md:
    the call whose reply was lost may still land).  Every call by an
    Attempt that still owned the operation is held to the rules.
    """
    problems: list[str] = []
    by_effect: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in provider:
        by_effect[e["effect_id"]].append(e)
    effects_of = {op["effect_id"]: operation_id for operation_id, op in operations.items() if op["effect_id"]}
    kinds: collections.Counter[str] = collections.Counter(e["kind"] for e in provider)
    late_calls = 0
    for effect_id, events in sorted(by_effect.items()):
        operation_id = effects_of.get(effect_id)
        if operation_id is None:
            problems.append(f"{effect_id} reached the provider, but no operation recorded its intent")
            continue
        op = operations[operation_id]
        callers, late = _callers(events, attempts.get(operation_id, []), pids)
        who = {
            i: f"attempt {a['number']} ({a['worker_id']}){', already replaced' if i in late else ''}"
            for i, a in callers.items()
        }
        late_calls += len(late)
        # A late call is the limit above only if nothing the Attempt did stood between its last
        # guarded write (its intent) and the call: one made on a lookup the Attempt made after
        # its intent went out without the Attempt's ownership being confirmed again.
        intents_by_fence = collections.defaultdict(list)
        for t in history[operation_id]:
            if t["event"] == "record_intent":
                intents_by_fence[t["fence"]].append(_epoch(t["at"]))
        unconfirmed = set()
        for index in late:
            number = callers[index]["number"]
            since = max((t for t in intents_by_fence[number] if t <= events[index]["t"]), default=0.0)
            if any(
                e["kind"] == "lookup"
                and callers.get(i, {}).get("number") == number
                and since < e["t"] < events[index]["t"]
                for i, e in enumerate(events)
            ):
                unconfirmed.add(index)

        def trail(events: list[dict[str, Any]] = events, who: dict[int, str] = who) -> str:
            return "; ".join(
                f"{e['kind']}{'' if e['kind'] != 'lookup' else (' found' if e['found'] else ' not found')}"
                f"{' by ' + who[i] if i in who else ''} at {datetime.fromtimestamp(e['t'], UTC).time()}"
                for i, e in enumerate(events)
            )

        # Each call after the first: every earlier call must be known not applied -- declined, or
        # dropped and then looked up and not found before this call.
        applied = owned_applied = 0
        blind: str | None = None  # why a next call would be blind
        answering_late = False
        found_problem = False
        for index, e in enumerate(events):
            if e["kind"] == "call":
                answering_late = index in late and index not in unconfirmed
                if index in unconfirmed:
                    problems.append(
                        f"{effect_id} was performed by {who[index]}, on a lookup it made after its intent and "
                        f"before its replacement, without confirming it still owned the operation: {trail()}"
                    )
                    found_problem = True
                elif blind is not None and not answering_late:
                    problems.append(f"{effect_id} was performed again after {blind}: {trail()}")
                    found_problem = True
            elif e["kind"] == "applied":
                applied += 1
                owned_applied += 0 if answering_late else 1
                blind = "it took effect"
            elif e["kind"] == "dropped":
                blind = blind or "an ambiguous call, without looking it up"
            elif e["kind"] == "lookup" and not e["found"] and blind == "an ambiguous call, without looking it up":
                blind = None
        if owned_applied > 1:
            problems.append(f"{effect_id} took effect {owned_applied} times: {trail()}")
            found_problem = True
        if late and not found_problem:
            noted.append(f"{effect_id}: {len(late)} late calls ({op['outcome']}, {applied} applied): {trail()}")
        ended = history[operation_id][-1] if op["outcome"] == "external_outcome_unknown" else None
        if ended is not None:
            after = [i for i, e in enumerate(events) if e["kind"] == "call" and e["t"] > _epoch(ended["at"])]
            if [i for i in after if i not in late]:
                problems.append(f"{effect_id} was performed after its operation ended unknown: {trail()}")
        intents = [t for t in history[operation_id] if t["event"] == "record_intent"]
        first_call = next((e for e in events if e["kind"] == "call"), None)
        if first_call is not None and (not intents or _epoch(intents[0]["at"]) > first_call["t"]):
            problems.append(f"{effect_id} was performed before its intent was committed")
        value = json.loads(op["input"])
        if op["state"] == "succeeded":
            if applied < 1:
                problems.append(f"{operation_id} succeeded, but its effect never took effect: {trail()}")
            result = json.loads(op["result"])
            if result.get("amount") != value["amount"]:
                problems.append(f"{operation_id} succeeded with {result}, its input is {value}")
        elif owned_applied and op["effect_unsettled_since"] is None:
            problems.append(
                f"{operation_id} ended {op['outcome']} with its effect recorded settled, but the effect took effect"
            )
    for operation_id, op in sorted(operations.items()):
        if op["effect_class"] == "external" and op["state"] == "succeeded" and op["effect_id"] not in by_effect:
            problems.append(f"{operation_id} succeeded, but its effect never reached the provider")
    outcomes = collections.Counter(
        op["outcome"] or op["state"] for op in operations.values() if op["effect_class"] == "external"
    )
    check(
        "each external effect performed at most once, never blindly",
        f"{len(by_effect)} effect ids, {kinds['call']} calls ({kinds['applied']} applied, {kinds['declined']} declined, "
        f"{kinds['dropped']} dropped; {late_calls} late, from an attempt already replaced), {kinds['lookup']} lookups; "
        "external operations: " + ", ".join(f"{o} {n}" for o, n in sorted(outcomes.items())),
        problems,
    )


def check_attempts(
    operations: dict[str, dict[str, Any]],
    attempts: dict[str, list[dict[str, Any]]],
    history: dict[str, list[dict[str, Any]]],
    lease: timedelta,
    check: Callable[[str, str, list[str]], None],
) -> None:
    """Attempts are fenced: numbered by increasing fences, one open at a time, a replaced one abandoned, writes under its lease."""
    problems: list[str] = []
    replaced = writes = 0
    for operation_id, op in sorted(operations.items()):
        mine = attempts.get(operation_id, [])
        numbers = [a["number"] for a in mine]
        if numbers != list(range(1, len(mine) + 1)) or len(mine) != op["fence"] or op["attempt_count"] != op["fence"]:
            problems.append(
                f"{operation_id}: attempts {numbers}, fence {op['fence']}, attempt_count {op['attempt_count']}"
            )
        running = [a["number"] for a in mine if a["state"] == "running"]
        if len(running) > 1 or (running and (op["state"] != "running" or running != [op["fence"]])):
            problems.append(f"{operation_id} is {op['state']} at fence {op['fence']} with attempts {running} running")
        for earlier, later in itertools.pairwise(mine):
            if earlier["ended_at"] is None or earlier["ended_at"] > later["started_at"]:
                problems.append(
                    f"{operation_id}: attempt {earlier['number']} (ended {earlier['ended_at']}) was open when attempt "
                    f"{later['number']} began ({later['started_at']})"
                )
        by_number = {a["number"]: a for a in mine}
        fence = 0
        expires: datetime | None = None
        for t in history.get(operation_id, []):
            if t["event"] in ("claim", "reclaim_expired"):
                if t["fence"] != fence + 1:
                    problems.append(
                        f"{operation_id} revision {t['revision']}: a claim took fence {t['fence']} after {fence}"
                    )
                attempt = by_number.get(t["fence"])
                if attempt is None or attempt["worker_id"] != t["actor"] or attempt["started_at"] != t["at"]:
                    problems.append(
                        f"{operation_id} revision {t['revision']}: claim by {t['actor']} has no such attempt"
                    )
                if t["event"] == "reclaim_expired":
                    replaced += 1
                    old = by_number.get(fence)
                    if old is None or old["state"] != "abandoned" or old["ended_at"] != t["at"]:
                        problems.append(
                            f"{operation_id}: attempt {fence} was replaced at {t['at']} but is recorded "
                            f"{None if old is None else (old['state'], old['ended_at'])}, not abandoned then"
                        )
                    if expires is None or t["at"] < expires:
                        problems.append(
                            f"{operation_id}: attempt {fence} was replaced at {t['at']}, its lease ran to {expires}"
                        )
                fence = t["fence"]
                expires = t["at"] + lease
                continue
            if t["fence"] != fence:
                problems.append(
                    f"{operation_id} revision {t['revision']} ({t['event']}) was written with fence {t['fence']}, current {fence}"
                )
            if t["from_state"] != "running" or not t["actor"].startswith(WORKER_PREFIX):
                continue
            attempt = by_number.get(t["fence"])
            if attempt is not None and attempt["state"] == "abandoned" and attempt["ended_at"] == t["at"]:
                # A claim that found the owner's lease expired and ended the operation by a limit.
                replaced += 1
                if expires is None or t["at"] < expires:
                    problems.append(
                        f"{operation_id}: attempt {fence} was abandoned at {t['at']}, its lease ran to {expires}"
                    )
                continue
            writes += 1
            if attempt is None or attempt["worker_id"] != t["actor"]:
                problems.append(
                    f"{operation_id} revision {t['revision']}: {t['actor']} wrote {t['event']} at fence {t['fence']}, "
                    "which it does not own"
                )
            if expires is None or t["at"] >= expires:
                problems.append(
                    f"{operation_id} revision {t['revision']}: {t['event']} by {t['actor']} at {t['at']}, after its "
                    f"lease ran out at {expires}"
                )
            if t["event"] == "heartbeat":
                expires = t["at"] + lease
    check(
        "attempts are fenced",
        f"{sum(len(a) for a in attempts.values())} attempts, {replaced} replaced after their lease, "
        f"{writes} owner writes checked against their fence and lease",
        problems,
    )


def check_history(
    rows: Rows,
    operations: dict[str, dict[str, Any]],
    history: dict[str, list[dict[str, Any]]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """Gapless revisions, exactly one terminal transition (the last), agreeing with the row; one outbox message each."""
    problems: list[str] = []
    outcome_states = {"succeeded": "succeeded", "cancelled": "cancelled", "external_outcome_unknown": "outcome_unknown"}
    for operation_id, op in sorted(operations.items()):
        mine = history.get(operation_id, [])
        revisions = [t["revision"] for t in mine]
        if revisions != list(range(1, len(mine) + 1)) or op["revision"] != len(mine):
            problems.append(
                f"{operation_id}: revisions {revisions[:3]}...{revisions[-3:]}, row revision {op['revision']}"
            )
        for before, after in itertools.pairwise(mine):
            if after["from_state"] != before["to_state"]:
                problems.append(
                    f"{operation_id} revision {after['revision']} moves from {after['from_state']}, not {before['to_state']}"
                )
        ends = [t for t in mine if t["to_state"] in TERMINAL]
        if op["state"] in TERMINAL:
            if len(ends) != 1 or ends[0] is not mine[-1]:
                problems.append(
                    f"{operation_id}: {len(ends)} terminal transitions ({[t['revision'] for t in ends]}) of {len(mine)}"
                )
            expected = outcome_states.get(op["outcome"], "failed")
            if op["outcome"] is None or op["state"] != expected:
                problems.append(f"{operation_id} is {op['state']} with outcome {op['outcome']}")
        elif ends or op["outcome"] is not None:
            problems.append(
                f"{operation_id} is {op['state']}, outcome {op['outcome']}, after {len(ends)} terminal transitions"
            )
        if mine and mine[-1]["to_state"] != op["state"]:
            problems.append(
                f"{operation_id}: its last transition leads to {mine[-1]['to_state']}, the row is {op['state']}"
            )
    messages = collections.Counter(
        r["subject_id"] for r in rows("SELECT subject_id FROM outbox WHERE kind = 'operation'")
    )
    for operation_id in sorted(operations):
        if messages[operation_id] != len(history.get(operation_id, [])):
            problems.append(
                f"{operation_id}: {messages[operation_id]} outbox messages for {len(history.get(operation_id, []))} transitions"
            )
    check(
        "every history is whole",
        f"{sum(len(h) for h in history.values())} transitions, {sum(messages.values())} outbox messages",
        problems,
    )


def check_cancellation(
    rows: Rows,
    operations: dict[str, dict[str, Any]],
    history: dict[str, list[dict[str, Any]]],
    *,
    provider: list[dict[str, Any]],
    record: dict[str, Any],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """A cancelled operation applied nothing (an external one: nothing it did not say it may have issued); a succeeded one was never cancelled."""
    problems: list[str] = []
    postings = collections.Counter(r["operation_id"] for r in rows("SELECT operation_id FROM chaos_postings"))
    applied = {e["effect_id"] for e in provider if e["kind"] == "applied"}
    cancelled = 0
    for operation_id, op in sorted(operations.items()):
        cancels = [t for t in history.get(operation_id, []) if t["event"] == "cancel"]
        if op["state"] == "cancelled":
            cancelled += 1
            if postings[operation_id]:
                problems.append(f"{operation_id} was cancelled and its transfer applied")
            if op["effect_id"] in applied and not any("may have been issued" in t["reason"] for t in cancels):
                problems.append(
                    f"{operation_id} was cancelled and its effect took effect, which its history does not say"
                )
        elif cancels:
            problems.append(
                f"{operation_id} is {op['state']} after a cancellation at revision {cancels[0]['revision']}"
            )
    told = collections.Counter()
    for answer in record["answers"]:
        if answer["what"] != "cancel":
            continue
        told[answer.get("state") or answer.get("error")] += 1
        op = operations.get(answer["operation_id"])
        if op is None:
            continue
        if answer.get("state") == "cancelled" and op["state"] != "cancelled":
            problems.append(
                f"{answer['operation_id']}: a cancellation was answered cancelled, the operation is {op['state']}"
            )
        if answer.get("error") == "cancel_too_late" and op["state"] == "cancelled":
            problems.append(
                f"{answer['operation_id']}: a cancellation was answered cancel_too_late, yet it is cancelled"
            )
    check(
        "cancellation and success exclude each other",
        f"{cancelled} cancelled; the driver's cancellations were answered "
        + (", ".join(f"{k} {n}" for k, n in sorted(told.items())) or "never"),
        problems,
    )


_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def check_workers(directory: Path, check: Callable[[str, str, list[str]], None]) -> None:
    """Every worker kept claiming until it was killed or told to stop: a fault of the store is waited out, not fatal.

    A worker thread that ends on an exception, or a process that exits
    before it was stopped, leaves its share of the work to the others in
    silence (and, with every thread gone, exits as if it had been stopped).
    """
    problems: list[str] = []
    threads = 0
    taken_up = 0
    for path in sorted(directory.glob(f"{WORKER_PREFIX}*.err")):
        lines = path.read_text(errors="replace").splitlines()
        # An attempt whose write lost its answer, finished by its own worker once the store answered.
        taken_up += sum(1 for line in lines if ": resumed: " in line)
        for number, line in enumerate(lines):
            if line.startswith("Exception in thread"):
                threads += 1
                # The traceback's last line names the exception; a pool's log lines may come between.
                last = next((x for x in lines[number + 1 :] if _EXCEPTION_LINE.match(x)), "")
                problems.append(f"{path.stem}: a worker thread ended on {last[:200]}")
    workers = json.loads((directory / "workers.json").read_text()) if (directory / "workers.json").exists() else {}
    exits = workers.get("exits", {})
    for what, n in sorted(exits.items()):
        if "on its own" in what:
            problems.append(f"{what} ({n} worker processes)")
    check(
        "every worker kept working until it was stopped",
        f"{len(workers.get('started', []))} worker processes started; exits: "
        + (", ".join(f"{w} {n}" for w, n in sorted(exits.items())) or "none")
        + f"; {taken_up} attempts taken up by their own worker after a lost answer",
        problems,
    )


def print_outcome(outcome: RunOutcome) -> None:
    report = outcome.report
    print(f"\n== operations chaos audit: {outcome.store}, {outcome.seconds:.0f} s ==")
    for section in ("faults", "driver", "final drain"):
        values = report[section]
        print(f"{section}: " + (", ".join(f"{k} {v}" for k, v in values.items()) or "none"))
    for name, summary in report["checks"].items():
        print(f"  {name}: {summary}")
    if report["noted"]:
        print("noted, not violations (an approver's decision to make; a call held up past its attempt's replacement):")
        for line in report["noted"]:
            print(f"  {line}")
    print_report_end(report, outcome.violations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.operations", description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, seconds=30.0)
    parser.add_argument("--workers", type=int, default=3, help="worker processes, two threads each (default 3)")
    parser.add_argument("--lease", type=float, default=2.0, help="the workers' lease in seconds (default 2)")
    parser.add_argument("--max-operations", type=int, metavar="N", help="submit at most N operations per store")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    # The driver's sessions are cut on purpose: the pool's note of each one it discards is not news.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    config = Config(
        args.store, args.seconds, args.seed, args.workers, args.lease, args.dsn, args.keep,
        max_operations=args.max_operations,
    )  # fmt: skip

    def run(kind: str) -> list[str]:
        outcome = run_one(config, kind)
        print_outcome(outcome)
        return outcome.violations

    return run_stores(args.store, run)


if __name__ == "__main__":
    raise SystemExit(main())
