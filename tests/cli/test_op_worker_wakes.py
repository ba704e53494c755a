"""``fencekeeper op worker`` on PostgreSQL claims a submission when it commits, not on its next poll.

The worker polls every 60 s here, so a report within a few seconds of a
submission can only come from the submission's ``NOTIFY`` waking the idle
worker (adapters/operations/postgres.py, and docs/operations.md, "Workers").
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg

from tests.cli.runner import data, started, stderr_lines

TRANSFER = {"from": "acc-1", "to": "acc-2", "amount": 5}
POLL = 60.0
WOKEN_WITHIN = 15.0
"""Far inside the poll: a report this soon after a submission was woken by its notification."""


def _listening(pg_dsn: str, schema: str) -> bool:
    # An idle session's `query` is the last statement it ran: the listening thread's LISTEN.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s",
            (f'LISTEN "fencekeeper_operations:{schema}"',),
        ).fetchone()
    return row is not None and row[0] > 0


def test_an_idle_op_worker_claims_a_submission_when_it_commits(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    worker = started("op", "worker", "--db", url, "--poll", str(POLL), "--log-json", "--id", "w", cwd=tmp_path)
    lines, reader = stderr_lines(worker)
    try:
        deadline = time.monotonic() + 30
        while not _listening(pg_dsn, pg_schema):
            assert worker.poll() is None, lines
            assert time.monotonic() < deadline, f"the worker never listened: {lines}"
            time.sleep(0.05)
        # Each worker thread has made its first claim, found nothing and gone idle for POLL seconds.
        time.sleep(1.0)
        for n in range(2):  # the second after the first's report: a worker woken once is woken again
            submitted = time.monotonic()
            admitted = data("op", "submit", "transfer", "--db", url, "--key", f"k-{n}", "--input", json.dumps(TRANSFER), cwd=tmp_path)  # fmt: skip
            operation_id = admitted["operation_id"]
            while not any(operation_id in line for line in lines):
                assert worker.poll() is None, lines
                assert time.monotonic() - submitted < WOKEN_WITHIN, f"{operation_id} waited for the poll: {lines}"
                time.sleep(0.02)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    reader.join(timeout=10)
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records if r["event"] != "note"] == ["succeeded", "succeeded"], records
