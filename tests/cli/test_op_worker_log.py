"""``fencekeeper op worker --log-json``: every line on stderr one JSON object, every report one of them.

Run as an operator runs it, on SQLite: a few operations, one whose action
fails for good and one whose stored row contradicts its state, drained
with ``--until-idle`` in each worker shape; and a worker stopped by a
signal, whose note is an object of the log too.  The store outage's lines
are in tests/cli/test_op_worker_outage.py (PostgreSQL, sessions ended).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cli.runner import catches, data, fencekeeper, started, stderr_lines

TRANSFER = {"from": "acc-1", "to": "acc-2", "amount": 5}
REPORT_FIELDS = {"ts", "level", "event", "worker_id", "operation_id", "attempt", "detail"}
NOTE_FIELDS = {"ts", "level", "event", "detail"}
SHAPES = {
    "one": [],
    "threads": ["--concurrency", "3"],
    "processes": ["--processes", "2", "--concurrency", "2"],
}


def _submit(db: Path, key: str, value: dict[str, Any], cwd: Path) -> str:
    admitted = data("op", "submit", "transfer", "--db", db, "--key", key, "--input", json.dumps(value), cwd=cwd)
    return str(admitted["operation_id"])


def _damage(db: Path, operation_id: str) -> None:
    """An admitted row that names an owner: it contradicts its state (as in tests/docs/test_operations_page.py)."""
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.execute("UPDATE operations SET owner = 'w-old' WHERE operation_id = ?", (operation_id,))


def _records(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr`` as the object it is; a line that is not one fails here."""
    records = [json.loads(line) for line in stderr.splitlines()]
    assert records and all(isinstance(r, dict) for r in records), stderr
    for record in records:
        assert datetime.fromisoformat(record["ts"]).utcoffset() is not None, record
    return records


@pytest.mark.parametrize("shape", SHAPES)
def test_every_report_is_one_object_of_the_log_and_the_json_document_is_unchanged(tmp_path: Path, shape: str) -> None:
    db = tmp_path / "ops.db"
    good = [_submit(db, f"k-{n}", TRANSFER, tmp_path) for n in range(3)]
    failing = _submit(db, "k-unknown", {"from": "acc-9", "to": "acc-2", "amount": 5}, tmp_path)  # no such account
    damaged = _submit(db, "k-damaged", TRANSFER, tmp_path)
    _damage(db, damaged)
    result = fencekeeper(
        "op", "worker", "--db", db, "--until-idle", "--log-json", "--json", "--id", "w", *SHAPES[shape], cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    records = _records(result.stderr)
    summary = json.loads(result.stdout)  # stdout is still the one document, as without --log-json
    always = {"errors"} if shape == "processes" else set()  # with more than one process
    assert set(summary) == {"stopped_by", "at", "reports", "malformed"} | always, set(summary)
    assert summary["stopped_by"] == "idle" and summary["malformed"] == [damaged]
    reports = records[:-1]
    # Each report the document carries is one object of the log, with the same fields, its outcome the event.
    assert sorted((r["operation_id"], r["attempt"], r["event"], r["detail"]) for r in reports) == sorted(
        (r["operation_id"], r["attempt"], r["outcome"], r["detail"]) for r in summary["reports"]
    ), (reports, summary["reports"])
    assert all(set(r) == REPORT_FIELDS for r in reports), reports
    workers = {f"w-{n}" for n in range(1, 5)}
    assert {r["worker_id"] for r in reports} <= workers, reports
    said = {(r["operation_id"], r["event"], r["level"], r["attempt"]) for r in reports}
    # Succeeded: info; an operation that ended without its result: error; a row passed over: a warning, once per
    # worker that met it (each reports it once).
    assert said == {
        *((operation_id, "succeeded", "info", 1) for operation_id in good),
        (failing, "action_failed", "error", 1),
        (damaged, "malformed_row", "warning", None),
    }, said
    (unknown,) = [r for r in reports if r["operation_id"] == failing]
    assert "acc-9" in unknown["detail"], unknown
    for record in (r for r in reports if r["event"] == "malformed_row"):
        assert "owner: set only while running" in record["detail"], record
    # The run's end is the log's last object: what exit 1 means, as `fencekeeper: error: ...` says it in text.
    assert set(records[-1]) == NOTE_FIELDS and (records[-1]["level"], records[-1]["event"]) == ("error", "error")
    assert re.fullmatch(rf"passed over 1 operation\(s\) .*: {damaged}; .*\[malformed_row\]", records[-1]["detail"])


def test_without_json_the_log_still_owns_stderr_and_stdout_keeps_its_count(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    good = [_submit(db, f"k-{n}", TRANSFER, tmp_path) for n in range(2)]
    result = fencekeeper("op", "worker", "--db", db, "--until-idle", "--log-json", "--id", "w", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = _records(result.stderr)
    assert sorted((r["operation_id"], r["event"], r["worker_id"]) for r in records) == sorted(
        (operation_id, "succeeded", "w-1") for operation_id in good
    )
    assert result.stdout == "2 operation attempts reported\n"


@pytest.mark.parametrize("shape", ["one", "processes"])
def test_a_signals_note_is_an_object_of_the_log(tmp_path: Path, shape: str) -> None:
    db = tmp_path / "ops.db"
    first = _submit(db, "k-0", TRANSFER, tmp_path)
    worker = started(
        "op", "worker", "--db", db, "--poll", "0.1", "--log-json", "--json", "--id", "w", *SHAPES[shape], cwd=tmp_path
    )  # fmt: skip
    lines, reader = stderr_lines(worker)
    try:
        deadline = time.monotonic() + 30
        # Its report says the worker runs and has its handlers in place (they are set before its threads start).
        while not any(first in line for line in lines) or not catches(worker.pid, signal.SIGTERM):
            assert worker.poll() is None, lines
            assert time.monotonic() < deadline, f"no report of {first}: {lines}"
            time.sleep(0.02)
        worker.send_signal(signal.SIGTERM)
        # Waited for, not communicate()d with: that would read stderr too, racing the reader for its lines.
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    reader.join(timeout=10)
    assert worker.stdout is not None and worker.stderr is not None
    worker.stderr.close()
    stdout = worker.stdout.read()
    worker.stdout.close()
    assert worker.returncode == 0, lines
    records = _records("\n".join(lines))
    assert [(r["event"], r["operation_id"]) for r in records if r["event"] != "note"] == [("succeeded", first)]
    notes = [r for r in records if r["event"] == "note"]
    assert notes and all(set(r) == NOTE_FIELDS and r["level"] == "info" for r in notes), notes
    assert any("send the signal again to quit at once" in r["detail"] for r in notes), notes
    assert json.loads(stdout)["stopped_by"] == "signal"


def test_an_option_it_refuses_is_still_the_one_usage_line(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    _submit(db, "k-0", TRANSFER, tmp_path)
    result = fencekeeper("op", "worker", "--db", db, "--log-json", "--concurrency", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("fencekeeper: error: --concurrency: ") and result.stderr.count("\n") == 1
