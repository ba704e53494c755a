"""``fencekeeper op worker`` whose connections are ended mid-attempt, over and over: every operation still succeeds.

Before, an owner write in progress when its backend was ended (a
completion, an intent, a failure) either sent a ``handler_error`` failure on
the next connection or left the operation running under the worker until
its lease expired, when the next claim recorded the Attempt abandoned; with
one Attempt allowed, the operation then ended ``max_attempts_exceeded`` (or
``external_outcome_unknown``) although the worker had its result.  Now the
worker reads the operation once the store answers and finishes the write
under its own credential (specs/operations.md, "An owner write of unknown
outcome"), so every operation succeeds under its one Attempt, well within
one lease.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psycopg

from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableOperationService, PrincipalReference
from tests.cli.runner import FENCEKEEPER, end_sessions, environment
from tests.operations import outage_actions

BATCH = 30
BATCHES = 5
PRINCIPAL = PrincipalReference.parse("users:v1:operator")
REPORT = re.compile(r"(?P<worker>\S+): (?P<operation>op-\w+) attempt (?P<attempt>\d+): (?P<outcome>\w+)(?:: (?P<detail>.*))?")


def _count(dsn: str, sql: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {str(key): int(n) for key, n in conn.execute(sql).fetchall()}


def _submit(service: DurableOperationService, batch: int) -> None:
    for n in range(BATCH):
        action, value = (
            ("transfer", {"from": "acc-1", "to": "acc-2", "amount": 5}),
            ("balance", {"account": f"acc-{n}"}),
            ("capture", {"order": f"o-{batch}-{n}", "amount": 100 + n}),
        )[n % 3]
        service.submit(tenant="default", principal=PRINCIPAL, action=action, input=value, client_key=f"k-{batch}-{n}")


def test_an_op_worker_whose_connections_are_ended_mid_attempt_succeeds_every_operation(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=1)
    service = DurableOperationService(store, outage_actions.registry(), outage_actions.resolvers())
    application = f"fk-test-{uuid.uuid4().hex[:12]}"
    worker = subprocess.Popen(
        [str(FENCEKEEPER), "op", "worker", "--db", url, "--actions", "tests.operations.outage_actions",
         "--concurrency", "3", "--poll", "0.1", "--lease", "30"],
        cwd=Path(__file__).resolve().parents[2],  # where tests.operations is importable from
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(PGAPPNAME=application),
    )  # fmt: skip
    lines: list[str] = []

    def read_log() -> None:
        assert worker.stderr is not None
        lines.extend(line.rstrip("\n") for line in worker.stderr)

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    operations = f"SELECT outcome, count(*) FROM {pg_schema}.operations WHERE outcome IS NOT NULL GROUP BY outcome"
    admitted = ended = 0
    try:
        for batch in range(BATCHES):
            _submit(service, batch)
            admitted += BATCH
            deadline = time.monotonic() + 25  # well inside the 30 s lease: no lease may be waited out
            next_kill = time.monotonic()
            while sum((outcomes := _count(pg_dsn, operations)).values()) < admitted:
                assert worker.poll() is None, (worker.returncode, lines[-5:])
                assert set(outcomes) <= {"succeeded"}, outcomes  # none failed (before: max_attempts_exceeded)
                assert time.monotonic() < deadline, f"not ended: {outcomes}; {lines[-5:]}"
                if time.monotonic() >= next_kill:
                    # Often enough to land inside attempts, seldom enough for the worker to get work done between.
                    ended += end_sessions(pg_dsn, application)
                    next_kill = time.monotonic() + 0.4
                time.sleep(0.02)
            if batch >= 1 and any(": resumed: " in line for line in lines):
                break
        worker.terminate()
        stdout, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
        store.close()
    reader.join(timeout=10)
    assert worker.returncode == 0, lines[-10:]
    assert ended > 0
    # Every operation succeeded under its one Attempt: none failed, none was abandoned and claimed again.
    assert _count(pg_dsn, operations) == {"succeeded": admitted}
    attempts = _count(pg_dsn, f"SELECT state, count(*) FROM {pg_schema}.operation_attempts GROUP BY state")
    assert attempts == {"succeeded": admitted}, attempts
    # Each transfer was applied once, in the application's own tables.
    transfers = _count(pg_dsn, f"SELECT 'all', count(*) FROM {pg_schema}.app_transfers")
    assert transfers == {"all": admitted // 3}
    balances = _count(pg_dsn, f"SELECT account_id, balance FROM {pg_schema}.app_accounts")
    assert balances == {"acc-1": 10_000 - 5 * admitted // 3, "acc-2": 5 * admitted // 3}
    reports = [m for m in map(REPORT.fullmatch, lines) if m is not None]
    assert {m["outcome"] for m in reports} == {"succeeded"}, [m.string for m in reports if m["outcome"] != "succeeded"]
    assert stdout.strip() == f"{len(reports)} operation attempts reported"
    resumed = [m for m in reports if m["detail"] is not None]
    assert resumed, "no kill landed inside an owner write in any batch"
    # What each says: the attempt's write committed before its answer was lost, or was sent again under its lease.
    assert all(m["detail"].startswith("resumed: the store answers again and attempt 1") for m in resumed), resumed
