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

Run twice: with the text log, whose lines name each resumed attempt as it
happens, and with ``--json --log-json``, whose one document on stdout
carries each report with ``"resumed": true`` (docs/operations.md, "Running
workers"), and whose JSON log on stderr says each report as it happens, the
outage's two lines among them (docs/operations.md, "The JSON log").
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from fencekeeper.adapters.operations.postgres import PostgresOperationStore
from fencekeeper.adapters.operations.service import DurableActionRegistry, DurableOperationService, PrincipalReference
from tests.cli.runner import ANSWERED_NOTE, LOST_NOTE, end_sessions, reached, sane_outage, started, stderr_lines
from tests.operations import outage_actions

BATCH = 30
BATCHES = 5
"""At most; a run stops after its second batch once a report said an attempt was resumed (in the text log or the
JSON log: both say each report as it happens)."""
PRINCIPAL = PrincipalReference.parse("users:v1:operator")
RESUMED = "resumed: the store answers again and attempt 1"
"""How a resumed attempt's detail starts, in either output: the write under attempt 1 committed or was sent again."""
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


@pytest.mark.parametrize("output", ["text", "json"])
def test_an_op_worker_whose_connections_are_ended_mid_attempt_succeeds_every_operation(
    pg_dsn: str, pg_schema: str, tmp_path: Path, output: str
) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=1)
    service = DurableOperationService(store, outage_actions.registry(), outage_actions.resolvers())
    application = f"fk-test-{uuid.uuid4().hex[:12]}"
    worker = started(
        "op", "worker", "--db", url, "--actions", "tests.operations.outage_actions",
        "--concurrency", "3", "--poll", "0.1", "--lease", "30", *(["--json", "--log-json"] if output == "json" else []),
        cwd=Path(__file__).resolve().parents[2],  # where tests.operations is importable from
        PGAPPNAME=application,
    )  # fmt: skip
    lines, reader = stderr_lines(worker)
    document: list[str] = []

    def read_document() -> None:
        assert worker.stdout is not None
        document.append(worker.stdout.read())  # read meanwhile: a document past a pipe's buffer would block the worker

    printed = threading.Thread(target=read_document, daemon=True)
    printed.start()
    operations = f"SELECT outcome, count(*) FROM {pg_schema}.operations WHERE outcome IS NOT NULL GROUP BY outcome"
    admitted = ended = 0
    try:
        for batch in range(BATCHES):
            _submit(service, batch)
            admitted += BATCH
            deadline = time.monotonic() + 25  # well inside the 30 s lease: no lease may be waited out
            next_kill = time.monotonic()
            progress = admitted - BATCH  # how many had ended when the sessions were last ended
            while (done := sum((outcomes := _count(pg_dsn, operations)).values())) < admitted:
                assert worker.poll() is None, (worker.returncode, lines[-5:])
                assert set(outcomes) <= {"succeeded"}, outcomes  # none failed (before: max_attempts_exceeded)
                assert time.monotonic() < deadline, f"not ended: {outcomes}; {lines[-5:]}"
                if time.monotonic() >= next_kill and done > progress:
                    # Often enough to land inside attempts, and only after the worker got work done since the last
                    # time: ended on a clock alone, on a loaded machine its backed-off requests met only sessions
                    # ended since they were opened, and nothing ended for the whole deadline.
                    ended += end_sessions(pg_dsn, application)
                    next_kill, progress = time.monotonic() + 0.4, done
                time.sleep(0.02)
            if batch >= 1 and any(": resumed: " in line or '"resumed": true' in line for line in lines):
                break
        worker.terminate()
        # Waited for, not communicate()d with: that would read stderr too, racing the reader for its lines (a JSON
        # line split between the two would not parse).  stdout's one document is read as it is written.
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        store.close()
    reader.join(timeout=10)
    printed.join(timeout=10)
    stdout = "".join(document)
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
    if output == "json":
        counts = _count(pg_dsn, f"SELECT operation_id, attempt_count FROM {pg_schema}.operations")
        _assert_json_reports(stdout, counts)
        _assert_json_log(lines, json.loads(stdout)["reports"])
        return
    # The outage is said as in any worker's run: the store answered again after a lost connection, in a
    # request or more that failed.
    lost = [n for n, line in enumerate(lines) if line == LOST_NOTE]
    back = [(n, m) for n, m in enumerate(map(ANSWERED_NOTE.fullmatch, lines)) if m is not None]
    assert lost and back and lost[0] < back[0][0], lines
    for _, matched in back:
        sane_outage(float(matched[1]), int(matched[2]))
    reports = [m for m in map(REPORT.fullmatch, lines) if m is not None]
    assert {m["outcome"] for m in reports} == {"succeeded"}, [m.string for m in reports if m["outcome"] != "succeeded"]
    assert stdout.strip() == f"{len(reports)} operation attempts reported"
    resumed = [m for m in reports if m["detail"] is not None]
    assert resumed, "no kill landed inside an owner write in any batch"
    # What each says: the attempt's write committed before its answer was lost, or was sent again under its lease.
    assert all(m["detail"].startswith(RESUMED) for m in resumed), resumed


REPORT_FIELDS = {"operation_id", "attempt", "outcome", "detail"}
"""A report's fields in ``op worker --json``, and ``resumed`` (only ever true) on an attempt taken up."""


def _assert_json_reports(stdout: str, attempts: dict[str, int]) -> None:
    summary = json.loads(stdout)  # the whole of stdout is the one document: anything more would not parse
    assert set(summary) == {"stopped_by", "at", "reports"} and summary["stopped_by"] == "signal", set(summary)
    reports: list[dict[str, object]] = summary["reports"]
    # One report per operation, of its one attempt, succeeded: a resumed attempt is reported once, not twice.
    assert {str(r["operation_id"]): r["attempt"] for r in reports} == attempts and len(reports) == len(attempts)
    assert set(attempts.values()) == {1} and {r["outcome"] for r in reports} == {"succeeded"}, reports
    resumed = [r for r in reports if "resumed" in r]
    assert resumed, "no kill landed inside an owner write in any batch"
    assert all(r["resumed"] is True and set(r) == REPORT_FIELDS | {"resumed"} for r in resumed), resumed
    assert all(str(r["detail"]).startswith(RESUMED) for r in resumed), resumed
    # The others carry no flag and no such detail: the flag is the report's own, not a guess from its words.
    others = [r for r in reports if "resumed" not in r]
    assert all(set(r) == REPORT_FIELDS and not str(r["detail"] or "").startswith("resumed:") for r in others), others


LOG_REPORT_FIELDS = {"ts", "level", "event", "worker_id", "operation_id", "attempt", "detail"}


def _assert_json_log(stderr: list[str], reports: list[dict[str, object]]) -> None:
    """``--log-json``'s log: every line an object; the outage's two as `fencekeeper worker` says them; every report."""
    records = [json.loads(line) for line in stderr]  # every line of stderr is one object: nothing else is there
    # The outage is said as in any worker's run: the store answered again after a lost connection, in a request or
    # more that failed, now as the executions worker's log says it (docs/operating-postgres.md).
    lost = [n for n, r in enumerate(records) if r["event"] == "store_connection_lost"]
    back = [(n, r) for n, r in enumerate(records) if r["event"] == "store_answers_again"]
    assert lost and back and lost[0] < back[0][0], records
    for n in lost:
        assert records[n] == {"ts": records[n]["ts"], "level": "warning", "event": "store_connection_lost",
                              "detail": LOST_NOTE}, records[n]  # fmt: skip
    for _, record in back:
        assert set(record) == {"ts", "level", "event", "seconds", "failures", "detail"} and record["level"] == "info"
        seconds, failures = record["seconds"], record["failures"]
        assert isinstance(seconds, int | float) and not isinstance(seconds, bool), record
        assert isinstance(failures, int) and not isinstance(failures, bool) and failures >= 1, record
        sane_outage(float(seconds), failures)
        assert ANSWERED_NOTE.fullmatch(record["detail"]), record
    # Each report, as it happened: the document's reports and the log's are the same, a resumed one flagged in both.
    said = [r for r in records if r["event"] not in {"store_connection_lost", "store_answers_again", "note"}]
    assert sorted((r["operation_id"], r["attempt"], r["event"], r["detail"], r.get("resumed")) for r in said) == sorted(
        (r["operation_id"], r["attempt"], r["outcome"], r["detail"], r.get("resumed")) for r in reports
    ), said
    resumed = [r for r in said if "resumed" in r]
    assert resumed and all(r["resumed"] is True and set(r) == LOG_REPORT_FIELDS | {"resumed"} for r in resumed), said
    assert all(r["level"] == "info" and str(r["detail"]).startswith(RESUMED) for r in resumed), resumed
    assert all(set(r) == LOG_REPORT_FIELDS and r["level"] == "info" for r in said if "resumed" not in r), said
    # The signal's note is the log's too.
    notes = [r for r in records if r["event"] == "note"]
    assert [str(r["detail"]).split(";")[0] for r in notes] == ["stopping after the current attempt"], notes


SLOW_ACTIONS = """
import pathlib
import time

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.service import DurableAction, DurableActionRegistry
from fencekeeper.kernel.operations import EffectClass, RetryPolicy


def look(value):
    pathlib.Path("in-action").touch()
    while not pathlib.Path("go-on").exists():
        time.sleep(0.01)
    with open("looked.log", "a", encoding="utf-8") as log:
        log.write("looked\\n")
    return {"looked": value["account"]}


def registry():
    return DurableActionRegistry((
        DurableAction("look", 1, EffectClass.READ_ONLY, look, policy=RetryPolicy(maximum_attempts=1)),
    ))


def resolvers():
    return examples.resolvers()
"""


def test_an_op_worker_stopped_while_its_store_was_lost_mid_attempt_finishes_the_attempt(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    # Its connections are ended while the action runs and SIGTERM comes before the action returns: the
    # completion's write fails, the loop stops, and the worker's last look sends the completion again.  Left
    # to expire instead, the Operation's one Attempt would end it max_attempts_exceeded with the result in hand.
    (tmp_path / "slow_actions.py").write_text(SLOW_ACTIONS, encoding="utf-8")
    url = f"{pg_dsn}?schema={pg_schema}"
    store = PostgresOperationStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        service = DurableOperationService(store, _slow_registry(tmp_path), outage_actions.resolvers())
        operation_id = service.submit(
            tenant="default", principal=PRINCIPAL, action="look", input={"account": "acc-1"}, client_key="k-1"
        ).operation_id
    finally:
        store.close()
    application = f"fk-test-{uuid.uuid4().hex[:12]}"
    worker = started(
        "op", "worker", "--db", url, "--actions", "slow_actions", "--poll", "0.1", "--json",
        cwd=tmp_path, PGAPPNAME=application,
    )  # fmt: skip
    try:
        reached(worker, tmp_path / "in-action", "the action")
        assert end_sessions(pg_dsn, application) >= 1
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the signal first: the completion is sent by a worker that is already stopping
        (tmp_path / "go-on").touch()
        stdout, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    reports = json.loads(stdout)["reports"]
    assert [(r["operation_id"], r["outcome"], r.get("resumed")) for r in reports] == [(operation_id, "succeeded", True)]
    outcomes = _count(pg_dsn, f"SELECT outcome, count(*) FROM {pg_schema}.operations GROUP BY outcome")
    attempts = _count(pg_dsn, f"SELECT state, count(*) FROM {pg_schema}.operation_attempts GROUP BY state")
    assert (outcomes, attempts) == ({"succeeded": 1}, {"succeeded": 1}), stderr
    assert (tmp_path / "looked.log").read_text(encoding="utf-8").splitlines() == ["looked"]


def _slow_registry(directory: Path) -> DurableActionRegistry:
    """The registry of ``SLOW_ACTIONS``, loaded from ``directory`` for the submitting side."""
    spec = importlib.util.spec_from_file_location("slow_actions_submit", directory / "slow_actions.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry: DurableActionRegistry = module.registry()
    return registry
