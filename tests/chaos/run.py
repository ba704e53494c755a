"""The chaos run: real workers, killed, stopped past their leases and cut off, then recovery and a full audit.

Run as ``python -m tests.chaos.run --store sqlite|postgres|both --seconds N --seed S``
(``make chaos`` runs both stores).  It exits 0 when the audit prints
``violations: 0`` and 1 otherwise.  Rules of the run:

- **The workers are ``fencekeeper worker``** processes (``tests/chaos/worker.py``:
  the command line itself, with a ledger of its write requests), two threads
  each, short leases, the shipped workflows (``adapters/workflows``) with
  their timeouts shortened to seconds so that timers fire during the run,
  and the effect-log handler of ``tests/chaos/handler.py``.
- **The driver** (this process) does what people do, through the service
  functions: admits executions of the three workflows, publishes payment
  Events (some short, some twice, some before the waiter registers, some
  never), decides approvals (approvals, rejections, a contradicting second
  decision, a repeated one, the requester trying to approve), and cancels
  executions at random (running ones are refused).
- **The faults**, at random moments chosen by the seed: SIGKILL of a worker
  (a supervisor restarts it), SIGSTOP of a worker for 1.5-2.5 leases and then
  SIGCONT (it wakes a zombie), and on PostgreSQL ``pg_terminate_backend`` of
  the workers' connections.
- **Recovery is the documented one** (README, docs/operating-postgres.md
  "Stopping, and workers that die"), in :func:`recover` and nowhere else:
  quarantine every expired lease, then settle each execution in
  ``reconciliation_required`` by asking the handler.  It runs every couple of
  seconds during the run, as an operator's timer would, and at the end, after
  the workers are stopped (SIGTERM, then SIGKILL for what does not stop) and
  their leases have run out; then a fresh crew finishes what was resumed.
- **The audit** (:func:`audit`) prints each check with its count, every
  violation it found, and ``violations: N``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.adapters import connect, examples, service
from fencekeeper.adapters.ports import CommandHandler, GrantTable
from fencekeeper.adapters.store import StoreError, TransactionalStore
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import ExecutionState
from tests.chaos.handler import EFFECTS_ENV, EffectLogHandler, read_effects
from tests.chaos.worker import evidence_key
from tests.stores.audit import TERMINAL, Loaded, load, row_problems
from tests.stores.ledger_audit import Ledger, compare_writes, evidence_problems, replay_leases

ROOT = Path(__file__).resolve().parents[2]
BUSINESS = "chaos"
OPERATOR = "user:operator"
REVIEWERS = ("user:manager", "user:cfo")
WORKER_PREFIX = "chaos-w"
THREADS = 2
"""Worker threads per process; the command line names them PROCESS-1 .. PROCESS-THREADS."""
DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"
WORKFLOWS = ("purchase_approval.toml", "payment_with_timeout.toml", "refund_needs_reconciliation.toml")
TIMEOUT_SECONDS = {"3600": 3, "86400": 5}
"""The shipped workflows wait an hour and a day; the run shortens them so that every timer fires in it."""
LEFT_FOR_REVIEW = frozenset({"waiting", "suspended", "reconciliation_required"})
"""States an execution may legitimately be left in; the report lists each one."""


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
    max_executions: int | None = None


def say(config: Config, text: str) -> None:
    if not config.quiet:
        print(text, flush=True)


# --- where the run happens -------------------------------------------------------------------


class Target:
    """One store of the run: how the driver and the workers open it, and how its connections are cut."""

    kind: str

    def url(self, application: str) -> str:
        raise NotImplementedError

    def open(self) -> TransactionalStore:
        return connect.open_store(self.url("fk-chaos-driver"), create=True)

    def rows(self) -> Callable[[str], Iterator[dict[str, Any]]]:
        raise NotImplementedError

    def kill_backends(self, pattern: str) -> int:
        return 0

    def close(self) -> None:
        pass


class SqliteTarget(Target):
    kind = "sqlite"

    def __init__(self, directory: Path) -> None:
        self.path = directory / "chaos.db"

    def url(self, application: str) -> str:
        return str(self.path)

    def rows(self) -> Callable[[str], Iterator[dict[str, Any]]]:
        conn = sqlite3.connect(self.path)
        conn.row_factory = sqlite3.Row

        def run(sql: str) -> Iterator[dict[str, Any]]:
            for row in conn.execute(sql):
                yield {k: _moment(k, row[k]) for k in row.keys()}  # noqa: SIM118 - sqlite3.Row has no iterator of keys

        return run


def _moment(key: str, value: Any) -> Any:
    # SQLite keeps moments as ISO text; the audit compares them as datetimes, as PostgreSQL returns them.
    if isinstance(value, str) and key in ("at", "committed_at", "created_at", "lease_expires_at", "recorded_at"):
        return datetime.fromisoformat(value)
    return value


class PostgresTarget(Target):
    kind = "postgres"

    def __init__(self, dsn: str) -> None:
        import psycopg  # noqa: PLC0415 - only for a PostgreSQL run

        self.dsn = dsn
        self.schema = f"fk_chaos_{uuid.uuid4().hex[:10]}"
        connect.migrate(dsn, schema=self.schema)
        self.conn = psycopg.connect(self._with("fk-chaos-audit"), autocommit=True)

    def _with(self, application: str) -> str:
        separator = "&" if "?" in self.dsn else "?"
        return f"{self.dsn}{separator}application_name={application}"

    def url(self, application: str) -> str:
        return f"{self._with(application)}&schema={self.schema}"

    def rows(self) -> Callable[[str], Iterator[dict[str, Any]]]:
        from psycopg.rows import dict_row  # noqa: PLC0415

        def run(sql: str) -> Iterator[dict[str, Any]]:
            with self.conn.cursor(row_factory=dict_row) as cursor:
                cursor.execute(f"SET search_path TO {self.schema}")  # type: ignore[arg-type]
                yield from cursor.execute(sql).fetchall()  # type: ignore[arg-type]

        return run

    def kill_backends(self, pattern: str) -> int:
        rows = self.conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s",
            (pattern,),
        ).fetchall()
        return sum(1 for (killed,) in rows if killed)

    def close(self, *, drop: bool = True) -> None:
        if drop:
            self.conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")  # type: ignore[arg-type]
        self.conn.close()


# --- the workers ------------------------------------------------------------------------------


class Crew:
    """The worker processes: started, SIGKILLed, stopped and resumed, terminated; every exit accounted for."""

    def __init__(self, config: Config, target: Target, directory: Path, rng: random.Random) -> None:
        self.config = config
        self.target = target
        self.directory = directory
        self.rng = rng
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped_until: dict[str, float] = {}
        self.timers: dict[str, threading.Timer] = {}
        self.started: list[str] = []
        self.sigkilled: set[str] = set()
        self.exits: collections.Counter[str] = collections.Counter()
        self.generation = 0

    def start(self, *, final: bool = False) -> str:
        self.generation += 1
        name = f"{WORKER_PREFIX}{self.generation}{'f' if final else ''}"
        env = {**os.environ, EFFECTS_ENV: str(self.directory / "effects.jsonl")}
        with (self.directory / f"{name}.err").open("w") as stderr:
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "tests.chaos.worker", "--ledger", str(self.directory / f"{name}.jsonl"), "--",
                    "worker", "--db", self.target.url(f"fk-chaos-{name}"), "--business", BUSINESS, "--as", OPERATOR,
                    "--concurrency", str(THREADS), "--lease", str(self.config.lease), "--poll", "0.2", "--id", name,
                    "--handler", "tests.chaos.handler:make", "-v",
                ],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
            )
        self.running[name] = proc
        self.started.append(name)
        return name

    def taken_up(self) -> int:
        """Leases the workers took up again after a decision's answer was lost (their ``resumed`` lines, from ``-v``)."""
        return sum(
            line.split()[2:3] == ["resumed"]
            for name in self.started
            for line in (self.directory / f"{name}.err").read_text(errors="replace").splitlines()
        )

    def reap(self) -> None:
        """A worker that exits on its own is noted with its last error line and replaced, as a supervisor would."""
        for name, proc in list(self.running.items()):
            if proc.poll() is not None:
                del self.running[name]
                self.stopped_until.pop(name, None)
                timer = self.timers.pop(name, None)
                if timer is not None:
                    timer.cancel()
                lines = (self.directory / f"{name}.err").read_text(errors="replace").strip().splitlines()
                last = lines[-1] if lines else ""
                self.exits[f"exited {proc.returncode} on its own: {last[:160]}"] += 1
                self.start()

    def sigkill(self, name: str) -> None:
        proc = self.running.pop(name)
        self.stopped_until.pop(name, None)
        timer = self.timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.sigkilled.add(name)

    def _pick(self, candidates: set[str], holders: set[str]) -> str | None:
        """Mostly a worker holding a lease (so the fault strands work), else any."""
        preferred = sorted(candidates & holders)
        if preferred and self.rng.random() < 0.8:
            return self.rng.choice(preferred)
        return self.rng.choice(sorted(candidates)) if candidates else None

    def sigkill_one(self, holders: set[str]) -> None:
        name = self._pick(set(self.running), holders)
        if name is not None:
            self.sigkill(name)
            self.start()

    def sigstop_one(self, holders: set[str]) -> bool:
        name = self._pick(set(self.running) - set(self.stopped_until), holders)
        if name is None:
            return False
        proc = self.running[name]
        seconds = self.config.lease * self.rng.uniform(1.5, 2.5)
        proc.send_signal(signal.SIGSTOP)
        # SIGCONT comes from a timer of its own, never from the driver's loop: on PostgreSQL a worker
        # stopped inside its transaction holds row locks, and the driver may be the one waiting on them.
        timer = threading.Timer(seconds, proc.send_signal, (signal.SIGCONT,))
        timer.daemon = True
        timer.start()
        self.timers[name] = timer
        self.stopped_until[name] = time.monotonic() + seconds
        return True

    def resume_due(self, *, all_now: bool = False) -> None:
        for name, until in list(self.stopped_until.items()):
            if all_now or time.monotonic() >= until:
                self.timers.pop(name).cancel()
                proc = self.running.get(name)
                if proc is not None:
                    proc.send_signal(signal.SIGCONT)  # again, or for the first time if the timer was cancelled
                del self.stopped_until[name]

    def stop_all(self) -> None:
        """SIGTERM (stop after the current visit, release the lease); SIGKILL what has not stopped in 10 s."""
        self.resume_due(all_now=True)
        for proc in self.running.values():
            proc.send_signal(signal.SIGTERM)
        give_up = time.monotonic() + 10
        for name, proc in sorted(self.running.items()):
            try:
                proc.wait(timeout=max(0.1, give_up - time.monotonic()))
                self.exits[f"stopped by SIGTERM, exit {proc.returncode}"] += 1
                if proc.returncode < 0:
                    # Terminated before its handler was installed (it had just started): like a kill,
                    # it may have left no ledger, or cut its last line.
                    self.sigkilled.add(name)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.sigkilled.add(name)
                self.exits["did not stop on SIGTERM, SIGKILLed"] += 1
        self.running.clear()

    def abort(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
        self.running.clear()

    def killed_ids(self) -> set[str]:
        """The processes killed mid-work, and the worker ids of their threads, as the ledger audit names them."""
        return self.sigkilled | worker_ids(self.sigkilled)

    def ledgers(self) -> dict[str, Path]:
        # Every worker id of a process shares its ledger; the ledger keys lines by worker id and seq.
        return {name: self.directory / f"{name}.jsonl" for name in self.started}


def worker_ids(processes: set[str]) -> set[str]:
    return {f"{name}-{n}" for name in processes for n in range(1, THREADS + 1)}


def lease_holders(store: TransactionalStore) -> set[str]:
    """The worker processes holding a lease now."""
    holders = set()
    for execution_id in store.execution_ids(ExecutionState.RUNNING):
        view = store.read(execution_id)
        if view is not None and view.dispatch.leased_by is not None:
            holders.add(view.dispatch.leased_by.rsplit("-", 1)[0])
    return holders


# --- the driver --------------------------------------------------------------------------------


def shipped_definitions() -> list[str]:
    """The shipped workflows' text, with their timeouts shortened from an hour or a day to seconds."""
    texts = []
    for name in WORKFLOWS:
        text = (resources.files("fencekeeper.adapters") / "workflows" / name).read_text(encoding="utf-8")
        texts.append(re.sub(r"after_seconds = (\d+)", lambda m: f"after_seconds = {TIMEOUT_SECONDS[m.group(1)]}", text))
    return texts


class Driver:
    """What people do to the executions during the run, through the service functions."""

    def __init__(self, store: TransactionalStore, policy: GrantTable, rng: random.Random) -> None:
        self.store = store
        self.policy = policy
        self.rng = rng
        self.kinds: dict[str, str] = {}
        self.inputs: dict[str, dict[str, Any]] = {}
        self.admitted: list[str] = []
        self.admission_unknown: list[str] = []
        self.paid: set[str] = set()
        self.decided: set[str] = set()
        self.cancel_tried: set[str] = set()
        self.stats: collections.Counter[str] = collections.Counter()

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except service.OperationError as exc:
            self.stats[f"{what}: error {exc.code}"] += 1
        except StoreError as exc:
            self.stats[f"{what}: store error {_store_error(exc)}"] += 1
        return None

    def admit(self) -> None:
        n = len(self.kinds) + 1
        kind = self.rng.choice(("purchase", "payment", "refund"))
        amount = self.rng.choice((40, 400, 2500, 12_000, 250_000))
        execution_id = f"{kind}-{n:04d}"
        if kind == "purchase":
            definition, data = "purchase-approval", {"amount": amount, "order_id": f"o-{n}", "order_revision": 1}
        elif kind == "payment":
            definition, data = "payment-with-timeout", {"amount": amount, "order_id": f"o-{n}"}
        else:
            definition, data = "refund", {"amount": amount, "payment_id": f"pay-{n}"}
        self.kinds[execution_id] = kind
        self.inputs[execution_id] = data
        try:
            outcome = service.run(
                self.store, self.policy, business_id=BUSINESS, principal_id=OPERATOR, definition_id=definition,
                input=data, execution_id=execution_id,
            )
        except StoreError as exc:
            self.admission_unknown.append(execution_id)
            self.stats[f"admit: store error {_store_error(exc)}"] += 1
            return
        if isinstance(outcome, p.Decision):
            self.admitted.append(execution_id)
            self.stats["admitted"] += 1
        else:
            self.stats[f"admit refused: {outcome.code.value}"] += 1

    def pay(self) -> None:
        unpaid = [x for x, k in self.kinds.items() if k == "payment" and x not in self.paid]
        if not unpaid:
            return
        execution_id = self.rng.choice(unpaid)
        self.paid.add(execution_id)
        data = self.inputs[execution_id]
        short = self.rng.random() < 0.2
        event_id = f"paid-{data['order_id']}"
        for _ in range(2 if self.rng.random() < 0.2 else 1):
            result = self._call("publish", lambda: service.publish(
                self.store, self.policy, business_id=BUSINESS, principal_id=OPERATOR, event_type="payment.received",
                correlation={"order_id": data["order_id"]}, payload={"paid": data["amount"] - (1 if short else 0)},
                event_id=event_id,
            ))
            if result is not None:
                self.stats["events: republished (unchanged)" if result.duplicate else "events published"] += 1
                self.stats["events: waiters woken"] += len(result.woken)

    def decide(self) -> None:
        waiting = set(self.store.execution_ids(ExecutionState.WAITING))
        candidates = sorted(x for x in waiting if self.kinds.get(x) == "purchase" and x not in self.decided)
        if not candidates:
            return
        execution_id = self.rng.choice(candidates)
        request = service.approval_request(self.store, execution_id)
        if request is None:
            return
        self.decided.add(execution_id)
        reviewer = self.rng.choice(REVIEWERS)
        determination = "approved" if self.rng.random() < 0.7 else "rejected"
        decision_id = f"d-{execution_id}"
        plan = [(reviewer, determination, decision_id)]
        roll = self.rng.random()
        if roll < 0.15:
            plan.append((reviewer, determination, decision_id))  # the same decision delivered twice
        elif roll < 0.3:
            other = REVIEWERS[1 - REVIEWERS.index(reviewer)]
            plan.append((other, "rejected" if determination == "approved" else "approved", f"d2-{execution_id}"))
        elif roll < 0.4:
            plan.insert(0, (OPERATOR, "approved", f"d0-{execution_id}"))  # the requester may not decide
        for who, what, did in plan:
            result = self._call("decide", lambda who=who, what=what, did=did: service.decide(
                self.store, self.policy, business_id=BUSINESS, reviewer_id=who, request=request,
                determination=what, decision_id=did,
            ))
            if result is not None:
                code = getattr(result, "code", None)
                label = type(result).__name__ if code is None else f"{type(result).__name__} {getattr(code, 'value', code)}"
                self.stats[f"decisions: {label}"] += 1

    def cancel(self) -> None:
        open_ones = [x for x in self.admitted if x not in self.cancel_tried]
        if not open_ones:
            return
        execution_id = self.rng.choice(open_ones)
        self.cancel_tried.add(execution_id)
        outcome = self._call("cancel", lambda: service.cancel(
            self.store, self.policy, business_id=BUSINESS, principal_id=OPERATOR, execution_id=execution_id,
            reason="chaos",
        ))
        if isinstance(outcome, p.Decision):
            self.stats["cancellations: cancelled"] += 1
        elif outcome is not None:
            self.stats[f"cancellations: refused {outcome.code.value}"] += 1

    def tick(self, admitting: bool) -> None:
        if admitting and self.rng.random() < 0.5:
            self.admit()
        if self.rng.random() < 0.3:
            self.pay()
        if self.rng.random() < 0.4:
            self.decide()
        if self.rng.random() < 0.04:
            self.cancel()


# --- recovery ------------------------------------------------------------------------------------


def _settle_and_resume(
    store: TransactionalStore,
    policy: GrantTable,
    handler: CommandHandler,
    *,
    business_id: str,
    principal_id: str,
    execution_id: str,
) -> str:
    """One execution in review: settle its Command if it has one, then resume where the evidence leads."""
    review = service.recovery_view(store, business_id=business_id, execution_id=execution_id)
    how = "no Command was issued"
    if review.unresolved:
        reconciled = service.reconcile(
            store, policy, handler, business_id=business_id, principal_id=principal_id, execution_id=execution_id
        )
        if not isinstance(reconciled.outcome, p.Decision):
            return f"left in review: {reconciled.outcome.code.value}"
        how = "by its Command's answer"
        review = service.recovery_view(store, business_id=business_id, execution_id=execution_id)
    if review.permitted:
        outcome = service.resume(
            store, policy, business_id=business_id, principal_id=principal_id, execution_id=execution_id,
            at_node=review.permitted[-1], rationale=f"settled {how}; resumed where the evidence leads",
        )
    else:
        outcome = service.fail(
            store, policy, business_id=business_id, principal_id=principal_id, execution_id=execution_id,
            rationale="the evidence permits no continuation",
        )
    if isinstance(outcome, p.Decision) and outcome.execution is not None:
        return f"settled ({how}): -> {outcome.execution.state.value}"
    return f"left in review: {outcome.code.value}"


def recover(
    store: TransactionalStore, policy: GrantTable, handler: CommandHandler, *, business_id: str, principal_id: str
) -> collections.Counter[str]:
    """Recover as the documentation says: quarantine every expired lease, then settle and resume each one.

    README (``fencekeeper reconcile``) and docs/operating-postgres.md
    ("Stopping, and workers that die"): ``reconcile --quarantine`` moves each
    running execution whose lease has expired to reconciliation_required.
    For each one, ``reconcile ID`` shows what is known; ``--settle`` asks the
    handler about its unsettled Command (never resending it) and records the
    answer; the operator then resumes it at the continuation the evidence
    records (``--resume-at``, the last one the review offers: the answer's),
    or fails it when the evidence permits none.  This is the one place the
    run recovers; the service calls are the ones those commands make.
    """
    tally: collections.Counter[str] = collections.Counter()
    try:
        sweep = service.quarantine_expired(store, policy, business_id=business_id, principal_id=principal_id)
    except StoreError as exc:
        # As an operator's timer would, try again next time; what committed before the error stays.
        tally[f"quarantine failed, retried later: {_store_error(exc)}"] += 1
    else:
        for outcome in sweep.outcomes.values():
            tally["quarantined" if isinstance(outcome, p.Decision) else f"quarantine refused: {outcome.code.value}"] += 1
        tally["quarantine lost a race"] += len(sweep.moved_on)
        tally["quarantine skipped a locked row"] += len(sweep.locked)
    for execution_id in store.execution_ids(ExecutionState.RECONCILIATION_REQUIRED):
        try:
            tally[_settle_and_resume(
                store, policy, handler, business_id=business_id, principal_id=principal_id, execution_id=execution_id
            )] += 1
        except service.OperationError as exc:
            tally[f"reconcile error: {exc.code}"] += 1
        except StoreError as exc:
            tally[f"reconcile failed, retried later: {_store_error(exc)}"] += 1
    return tally


def _store_error(exc: StoreError) -> str:
    # The message names the file or DSN; the report keeps what went wrong, e.g. "database is locked".
    return f"{exc.code} ({exc.message.rsplit(': ', 1)[-1]})"


# --- the run ---------------------------------------------------------------------------------------


@attrs.define
class RunOutcome:
    store: str
    seconds: float
    violations: list[str]
    report: dict[str, Any]


def run_one(config: Config, kind: str) -> RunOutcome:
    started = time.monotonic()
    rng = random.Random(f"{config.seed}-{kind}")
    directory = Path(tempfile.mkdtemp(prefix=f"fencekeeper-chaos-{kind}-"))
    target: Target = SqliteTarget(directory) if kind == "sqlite" else PostgresTarget(config.dsn)
    say(config, f"chaos: {kind}, {config.seconds:.0f} s of faults, seed {config.seed}, files in {directory}")
    policy = examples.grants(BUSINESS, OPERATOR, *REVIEWERS)
    store = target.open()
    for text in shipped_definitions():
        service.register(store, parse_definition(text), BUSINESS, OPERATOR, policy)
    handler = EffectLogHandler(directory / "effects.jsonl")
    driver = Driver(store, policy, rng)
    crew = Crew(config, target, directory, rng)
    faults: collections.Counter[str] = collections.Counter()
    recovery: collections.Counter[str] = collections.Counter()
    final_recovery: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    completed = False
    try:
        for _ in range(config.workers):
            crew.start()
        end = time.monotonic() + config.seconds
        next_kill = time.monotonic() + rng.uniform(2, 5)
        next_stop = time.monotonic() + rng.uniform(1, 3)
        next_cut = time.monotonic() + rng.uniform(1, 3)
        next_recovery = time.monotonic() + 2
        while time.monotonic() < end:
            now = time.monotonic()
            crew.reap()
            crew.resume_due()
            step_started = time.monotonic()
            driver.tick(
                admitting=now < end - 3
                and (config.max_executions is None or len(driver.kinds) < config.max_executions)
            )
            if now >= next_kill:
                crew.sigkill_one(lease_holders(store))
                faults["workers SIGKILLed (and restarted)"] += 1
                next_kill = now + rng.uniform(3, 7)
            if now >= next_stop:
                if crew.sigstop_one(lease_holders(store)):
                    faults["workers SIGSTOPped past their lease, then SIGCONTed"] += 1
                next_stop = now + rng.uniform(2, 5)
            if kind == "postgres" and now >= next_cut:
                pattern = f"fk-chaos-{rng.choice(sorted(crew.running))}" if rng.random() < 0.5 else "fk-chaos-chaos-w%"
                faults["backends terminated (pg_terminate_backend)"] += target.kill_backends(pattern)
                next_cut = now + rng.uniform(1, 3)
            if now >= next_recovery:
                recovery.update(recover(store, policy, handler, business_id=BUSINESS, principal_id=OPERATOR))
                next_recovery = now + 2
            # A stopped worker's transaction makes people wait on its locks: the longest wait is reported.
            slowest = max(slowest, time.monotonic() - step_started)
            time.sleep(0.05)
        chaos_seconds = time.monotonic() - started

        # The end: stop every worker, let the leases run out, recover, let a fresh crew finish.
        crew.stop_all()
        time.sleep(config.lease + 0.5)
        final_recovery.update(recover(store, policy, handler, business_id=BUSINESS, principal_id=OPERATOR))
        crew.start(final=True)
        give_up = time.monotonic() + max(TIMEOUT_SECONDS.values()) + 25
        quiet_rounds = 0
        while time.monotonic() < give_up and quiet_rounds < 2:
            time.sleep(0.5)
            crew.reap()
            tally = recover(store, policy, handler, business_id=BUSINESS, principal_id=OPERATOR)
            final_recovery.update(tally)
            busy = any(store.execution_ids(s) for s in (ExecutionState.ELIGIBLE, ExecutionState.RUNNING))
            waiting = store.execution_ids(ExecutionState.WAITING)
            quiet_rounds = quiet_rounds + 1 if not busy and not waiting and not tally else 0
        crew.stop_all()
        time.sleep(config.lease + 0.5)
        final_recovery.update(recover(store, policy, handler, business_id=BUSINESS, principal_id=OPERATOR))
        completed = True
    finally:
        crew.abort()
        store.close()
        if not completed and isinstance(target, PostgresTarget):
            target.close(drop=config.keep is None)  # a broken run leaves no schema behind unless asked to
    audit_started = time.monotonic()
    ledger = Ledger.read(crew.ledgers(), crew.killed_ids())
    violations, checks, listed = audit(target.rows(), ledger, read_effects(directory / "effects.jsonl"), driver, config)
    report = {
        "faults": dict(faults),
        "driver": dict(sorted(driver.stats.items())),
        "recovery during the run": dict(
            sorted(recovery.items()), **{"taken up by their own worker after a lost answer": crew.taken_up()}
        ),
        "recovery at the end": dict(sorted(final_recovery.items())),
        "worker exits": dict(crew.exits),
        "checks": checks,
        "left for review": listed,
        "seconds": {
            "chaos": round(chaos_seconds, 1),
            "end and recovery": round(audit_started - started - chaos_seconds, 1),
            "audit": round(time.monotonic() - audit_started, 1),
            "slowest round of the driver and recovery": round(slowest, 1),
        },
    }
    return finish_run(
        kind, started, target=target, directory=directory, keep=config.keep, violations=violations, report=report
    )


# --- the audit ---------------------------------------------------------------------------------


def audit(
    rows: Callable[[str], Iterator[dict[str, Any]]],
    ledger: Ledger,
    effects: list[dict[str, Any]],
    driver: Driver | None,
    config: Config,
) -> tuple[list[str], dict[str, str], list[str]]:
    """Every check, over the database, the workers' ledgers and the effect log.

    Returns the violations, one line per check with its counts, and the
    executions left in a state that waits for someone (listed, not violations).
    """
    checks: dict[str, str] = {}
    violations: list[str] = []

    def check(name: str, summary: str, problems: list[str]) -> None:
        checks[name] = f"{summary}; {len(problems)} violations"
        violations.extend(f"{name}: {problem}" for problem in problems)

    loaded = load(rows)
    lease = timedelta(seconds=config.lease)

    def is_worker(actor: str) -> bool:
        return actor.startswith(WORKER_PREFIX)

    # 1. Every admission is present.
    admitted = set(driver.admitted) if driver is not None else set(loaded.executions)
    unknown = set(driver.admission_unknown) if driver is not None else set()
    problems = [f"{x} was admitted and is missing" for x in sorted(admitted - loaded.executions.keys())]
    problems += [f"{x} exists but was never admitted" for x in sorted(loaded.executions.keys() - admitted - unknown)]
    check("every admission is present", f"{len(admitted)} admitted, {len(admitted & loaded.executions.keys())} present",
          problems)

    # 2. Every write came under a live, current lease: the database's history replayed.
    leases, problems = replay_leases(loaded.history, lambda worker: lease, is_worker=is_worker)
    lease_writes = sum(1 for ts in loaded.history.values() for t in ts if is_worker(t["actor"]) and t["event"] != "claim")
    quarantines = sum(1 for held in leases.values() for x in held if x.quarantined)
    check(
        "every write came under a live, current lease",
        f"{sum(len(x) for x in leases.values())} leases, {lease_writes} writes on them replayed, "
        f"{quarantines} quarantined after expiry",
        problems + ledger.problems,
    )

    # 3. The workers' ledgers agree with the database: nothing refused was written, nothing accepted lost.
    results = list(ledger.results.values())
    refused = [e for e in results if e["result"] == "refusal"]
    landed, problems = compare_writes(loaded.history, ledger, is_worker=is_worker)
    committed = {
        evidence_key(r["object_id"], r["revision"], r["body"]): (r["parent_id"], r["committed_at"])
        for r in rows(
            "SELECT v.object_id, v.revision, v.body, v.committed_at, o.parent_id FROM object_revisions v "
            "JOIN objects o ON o.object_id = v.object_id WHERE o.object_type <> 'WorkflowExecution'"
        )
    }
    counts, evidence = evidence_problems(committed, ledger, leases)
    refusals = collections.Counter(e["code"] for e in refused)
    check(
        "no refused write landed, no accepted write lost",
        f"{sum(1 for e in results if e['result'] == 'decision')} requests accepted, {len(refused)} refused "
        f"({', '.join(f'{c} {n}' for c, n in sorted(refusals.items())) or 'none'}), {len(ledger.unknown())} of unknown "
        f"outcome ({landed} landed); evidence: {counts['checked under their lease']} revisions under their lease, "
        f"{counts['refused']} of refused requests absent",
        problems + evidence,
    )

    # 4. Every command took effect at most once, and the database tells the truth about it.
    check_commands(rows, loaded, effects, check)

    # 5. The rows agree.
    states, problems = row_problems(loaded, TERMINAL | LEFT_FOR_REVIEW)
    registrations = list(rows("SELECT execution_id, woken_by, closed_by FROM wait_registrations"))
    open_by_execution = collections.Counter(
        r["execution_id"] for r in registrations if r["woken_by"] is None and r["closed_by"] is None
    )
    for execution_id, obj in sorted(loaded.executions.items()):
        if obj["state"] == "waiting" and open_by_execution[execution_id] != 1:
            problems.append(f"{execution_id}: waiting with {open_by_execution[execution_id]} open wait registrations")
    recoveries = sum(1 for _ in rows("SELECT command_id FROM commands"))
    recovery_transitions = sum(
        1 for ts in loaded.history.values() for t in ts
        if t["event"] in ("quarantine_expired", "fail", "resume_safe", "resume_suspended")
        or (t["event"] is None and t["from_state"] is not None)
    )
    if recoveries != recovery_transitions:
        problems.append(f"{recoveries} recovery commands, {recovery_transitions} recovery transitions")
    check(
        "the rows agree",
        f"{len(loaded.executions)} executions ({', '.join(f'{s} {n}' for s, n in sorted(states.items()))}), "
        f"{sum(len(r) for r in loaded.revisions.values())} revisions, {recoveries} recovery commands",
        problems,
    )

    # 6. Nothing is stuck: every execution ended, or waits in a state with a governed way out.
    listed = []
    for execution_id, obj in sorted(loaded.executions.items()):
        if obj["state"] in LEFT_FOR_REVIEW:
            d = loaded.dispatch[execution_id]
            listed.append(f"{execution_id}: {obj['state']} at {obj['current_node_id']} ({d['last_error_code'] or '-'})")
    stuck = [f"{x}: {o['state']}" for x, o in sorted(loaded.executions.items()) if o["state"] not in TERMINAL | LEFT_FOR_REVIEW]
    check("no execution is stuck", f"{len(listed)} left waiting or in review (listed)", stuck)

    # A wait registration is open exactly while its execution waits on it: one left open after its
    # execution moved on (a cancellation) would be offered to every timer pass and refused, forever.
    stale = sorted(x for x in open_by_execution if loaded.executions[x]["state"] != "waiting")
    refused_timers = sum(
        1 for e in results if e["op"] == "fire_timer" and e["result"] == "refusal" and e.get("code") == "not_waiting"
    )
    check(
        "wait registrations close with their wait",
        f"{len(registrations)} registrations; {refused_timers} timer firings refused as not_waiting",
        [f"{x}: a wait registration is still open, but the execution is {loaded.executions[x]['state']}"
         for x in stale],
    )
    return violations, checks, listed


def audit_kept_sqlite(directory: Path, lease: float) -> tuple[list[str], dict[str, str], list[str]]:
    """The audit again, over the files a SQLite run kept (``--keep``); the driver's own record is not kept.

    Every admission is taken as present (the driver's list is gone), and every
    ledger may end in a cut line (who was killed is not kept either).
    """
    target = SqliteTarget(directory)
    ledgers = {path.stem: path for path in directory.glob(f"{WORKER_PREFIX}*.jsonl")}
    ledger = Ledger.read(ledgers, set(ledgers) | worker_ids(set(ledgers)))
    config = Config("sqlite", 0, 0, lease=lease)
    return audit(target.rows(), ledger, read_effects(directory / "effects.jsonl"), None, config)


def check_commands(
    rows: Callable[[str], Iterator[dict[str, Any]]],
    loaded: Loaded,
    effects: list[dict[str, Any]],
    check: Callable[[str, str, list[str]], None],
) -> None:
    """The effect log against itself and against the Commands the database holds."""
    problems: list[str] = []
    kinds: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for e in effects:
        kinds[e["command_id"]][e["kind"]] += 1
    applied_by_operation = collections.Counter(
        (e["execution_id"], e["operation"]) for e in effects if e["kind"] == "applied"
    )
    for command_id, seen in sorted(kinds.items()):
        if seen["call"] > 1:
            problems.append(f"{command_id} was sent {seen['call']} times")
        if seen["applied"] > 1:
            problems.append(f"{command_id} took effect {seen['applied']} times")
        if seen["applied"] and seen["not_applied"]:
            problems.append(f"{command_id} took effect after it was reconciled as not applied")
    # No operation of the shipped workflows is on a cycle: one effect per execution and operation at most.
    for (execution_id, operation), n in sorted(applied_by_operation.items()):
        if n > 1:
            problems.append(f"{execution_id}: {operation} took effect {n} times")
    commands = {
        r["object_id"]: r
        for r in rows(f"SELECT object_id, parent_id, state FROM objects WHERE object_type = '{i.COMMAND}'")
        if r["object_id"].endswith("/command")
    }
    for command_id in sorted(kinds.keys() - commands.keys()):
        problems.append(f"{command_id} reached the handler but is not a committed Command")
    settled: collections.Counter[str] = collections.Counter()
    for command_id, r in sorted(commands.items()):
        seen = kinds.get(command_id, collections.Counter())
        state = r["state"]
        settled[state] += 1
        execution_state = loaded.executions[r["parent_id"]]["state"]
        if state == "succeeded" and not seen["applied"]:
            problems.append(f"{command_id} is recorded as succeeded, but never took effect")
        elif state == "rejected" and seen["applied"]:
            problems.append(f"{command_id} is recorded as not applied, but took effect")
        elif state in ("issued", "unknown") and execution_state != "reconciliation_required":
            problems.append(f"{command_id} is unsettled ({state}) but its execution is {execution_state}")
    applied = sum(1 for e in effects if e["kind"] == "applied")
    check(
        "every command took effect at most once",
        f"{len(commands)} Commands committed ({', '.join(f'{s} {n}' for s, n in sorted(settled.items()))}), "
        f"{sum(1 for e in effects if e['kind'] == 'call')} sends, {applied} effects, "
        f"{sum(1 for e in effects if e['kind'] == 'late')} late sends refused after reconciliation",
        problems,
    )


def print_outcome(outcome: RunOutcome) -> None:
    report = outcome.report
    print(f"\n== chaos audit: {outcome.store}, {outcome.seconds:.0f} s ==")
    for section in ("faults", "driver", "recovery during the run", "recovery at the end", "worker exits"):
        values = report[section]
        print(f"{section}: " + (", ".join(f"{k} {v}" for k, v in values.items()) or "none"))
    for name, summary in report["checks"].items():
        print(f"  {name}: {summary}")
    if report["left for review"]:
        print("left waiting or in review (each has a governed way out):")
        for line in report["left for review"]:
            print(f"  {line}")
    print_report_end(report, outcome.violations)


# --- what the three runs (this one, tests.chaos.operations, tests.chaos.journal) share ------------


def finish_run(
    kind: str,
    started: float,
    *,
    target: Target,
    directory: Path,
    keep: Path | None,
    violations: list[str],
    report: dict[str, Any],
) -> RunOutcome:
    """Drop the run's schema and files, or move them under ``keep``; the run's outcome."""
    if isinstance(target, PostgresTarget):
        target.close(drop=keep is None)
    if keep is not None:
        destination = keep / directory.name
        shutil.move(str(directory), destination)
        report["kept"] = str(destination) + (f" (schema {target.schema})" if isinstance(target, PostgresTarget) else "")
    else:
        shutil.rmtree(directory, ignore_errors=True)
    return RunOutcome(kind, time.monotonic() - started, violations, report)


def print_report_end(report: dict[str, Any], violations: list[str]) -> None:
    """The end of an audit's report: where its files are kept, its timings, and every violation."""
    if "kept" in report:
        print(f"files kept in {report['kept']}")
    print(f"seconds: {json.dumps(report['seconds'])}")
    for violation in violations:
        print(f"VIOLATION {violation}")
    print(f"violations: {len(violations)}")


def add_run_arguments(parser: argparse.ArgumentParser, *, seconds: float) -> None:
    """The options every run takes; ``seconds`` is its default length of the faults phase."""
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--seconds", type=float, default=seconds, help=f"seconds of faults per store (default {seconds:g})"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dsn", default=os.environ.get("FENCEKEEPER_PG_DSN", DEFAULT_PG_DSN))
    parser.add_argument("--keep", type=Path, help="keep each run's files (and PostgreSQL schema) under this directory")


def run_stores(store: str, run: Callable[[str], list[str]]) -> int:
    """``run`` on each store ``store`` names (it prints its report and returns its violations); the exit code."""
    kinds = ("sqlite", "postgres") if store == "both" else (store,)
    total = sum(len(run(kind)) for kind in kinds)
    if len(kinds) > 1:
        print(f"\nviolations: {total} (all stores)")
    return 0 if total == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, seconds=50.0)
    parser.add_argument("--workers", type=int, default=3, help="worker processes, two threads each (default 3)")
    parser.add_argument("--lease", type=float, default=2.0, help="the workers' lease in seconds (default 2)")
    parser.add_argument("--max-executions", type=int, metavar="N", help="admit at most N executions per store")
    args = parser.parse_args(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    config = Config(
        args.store, args.seconds, args.seed, args.workers, args.lease, args.dsn, args.keep,
        max_executions=args.max_executions,
    )

    def run(kind: str) -> list[str]:
        outcome = run_one(config, kind)
        print_outcome(outcome)
        return outcome.violations

    return run_stores(args.store, run)


if __name__ == "__main__":
    raise SystemExit(main())
