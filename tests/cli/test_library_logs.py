"""A lost store connection is one line of the command's own, not the libraries' warnings printed raw.

psycopg and its pool warn of every connection a server restart, a failover
or ``pg_terminate_backend`` kills; with no logging configured, Python printed
each raw on stderr ("discarding closed connection: <psycopg.Connection [BAD]
at 0x...>"), between the worker's own lines, for an event the worker rides
out.  The command line routes library records through its notes
(adapters/cli_logging.py): a lost connection is one note per outage, and any
other library warning still shows, in the command's format, with its logger.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from fencekeeper.adapters import cli_logging
from tests.cli.runner import EXAMPLES, FENCEKEEPER, catches, environment, ok

EXECUTIONS = 6
PURCHASE = EXAMPLES / "purchase_approval.toml"
NOTE = "the store's connection was lost; reconnecting and trying again for up to 30 s"


def _sessions(dsn: str, application: str, *, end: bool = False) -> int:
    """The sessions of this test's worker, counted or ended as an administrator would: other tests share the database."""
    call = "pg_terminate_backend(pid)" if end else "pid"
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            f"SELECT count({call}) FROM pg_stat_activity WHERE application_name = %s",  # type: ignore[arg-type]
            (application,),
        ).fetchone()
    assert found is not None
    return int(found[0])


def _succeeded(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            f"SELECT count(*) FROM {schema}.objects WHERE object_type = 'WorkflowExecution' AND state = 'succeeded'"  # type: ignore[arg-type]
        ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize("log", ["text", "json"])
def test_a_worker_whose_connections_are_ended_says_so_once_prints_nothing_raw_and_runs_everything(
    pg_dsn: str, pg_schema: str, tmp_path: Path, log: str
) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    application = f"fk-test-{uuid.uuid4().hex[:12]}"
    worker = subprocess.Popen(
        [str(FENCEKEEPER), "worker", "--db", url, "--concurrency", "2", "--poll", "0.2", "--json",
         *(["--log-json"] if log == "json" else [])],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(PGAPPNAME=application),  # libpq names each of the worker's sessions so
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (catches(worker.pid, signal.SIGTERM) and _sessions(pg_dsn, application) >= 2):
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.05)
        # Ended while the worker idles, holding no lease: a visit whose record is lost is taken up again
        # (tests/cli/test_worker_outage.py), which is not what this test is about.
        assert _sessions(pg_dsn, application, end=True) >= 2
        for n in range(EXECUTIONS):
            order = json.dumps({"amount": 50, "order_id": f"o-{n}", "order_revision": 1})
            ok("run", PURCHASE, "--db", url, "--input", order, "--id", f"o-{n}", cwd=tmp_path)
        deadline = time.monotonic() + 120
        while _succeeded(pg_dsn, pg_schema) < EXECUTIONS:
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker did not run the executions to their end"
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    summary = json.loads(stdout)  # --json: stdout is the one summary document, nothing else
    assert summary["finished"] == {"succeeded": EXECUTIONS} and summary["errors"] == [], summary
    lines = stderr.splitlines()
    if log == "json":
        # Every line of stderr is an object of the log; the outage is one of them, and no library record is.
        events = [json.loads(line)["event"] for line in lines]
        assert events.count("store_connection_lost") == 1 and "library_warning" not in events, stderr
        assert [json.loads(line)["detail"] for line in lines if "store_connection_lost" in line] == [NOTE]
        return
    assert lines.count(NOTE) == 1, stderr
    # Nothing else but the worker's own note of the signal: no psycopg record, raw or routed.
    assert [line for line in lines if line != NOTE and not line.startswith("stopping")] == [], stderr


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _record(logger: str, msg: str, *args: object) -> None:
    logging.getLogger(logger).warning(msg, *args)


def test_lost_connections_are_one_note_per_outage_and_other_warnings_keep_their_logger() -> None:
    said: list[str] = []
    warned: list[tuple[str, str]] = []
    clock = Clock()
    lost = psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
    with cli_logging.routed(said.append, lambda logger, text: warned.append((logger, text)), lost="lost", clock=clock):
        for _ in range(4):  # a pool's connections, all ended at once
            _record("psycopg.pool", "discarding closed connection: %s", "<psycopg.Connection [BAD] at 0x1>")
        _record("psycopg", "error ignored in rollback on %s: %s", "<conn>", lost)
        clock.now += cli_logging.OUTAGE_GAP - 1
        _record("psycopg.pool", "error connecting in %r: %s", "pool-1", lost)  # still the same outage
        clock.now += cli_logging.OUTAGE_GAP
        _record("psycopg.pool", "discarding broken connection: %s", "<conn>")  # a new one
        # Not a lost connection: a rollback that failed for another reason, and another library's warning.
        _record("psycopg", "error ignored in rollback on %s: %s", "<conn>", psycopg.ProgrammingError("odd\nstate"))
        _record("somelib.part", "disk %s is %d%% full", "/var", 97)
    assert said == ["lost", "lost"]
    assert warned == [
        ("psycopg", "error ignored in rollback on <conn>: odd state"),
        ("somelib.part", "disk /var is 97% full"),
    ]
    # Installed for the command only: gone after it, for an application that imports the library.
    assert not any(isinstance(h, cli_logging._Router) for h in logging.getLogger().handlers)


def test_without_an_outage_note_the_losses_are_folded_and_debug_shows_them(capsys: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    warned: list[tuple[str, str]] = []
    with cli_logging.routed(said.append, lambda logger, text: warned.append((logger, text)), lost=None):
        _record("psycopg.pool", "discarding closed connection: %s", "<conn>")
    assert said == [] and warned == []
    with cli_logging.routed(said.append, lambda logger, text: warned.append((logger, text)), lost="lost", debug=True):
        _record("psycopg.pool", "discarding closed connection: %s", "<conn>")
    assert said == ["lost"] and warned == [("psycopg.pool", "discarding closed connection: <conn>")]
    assert capsys.readouterr().err == ""  # nothing raw (logging.lastResort) while routed


def test_the_operating_page_quotes_the_line_and_the_outage_gap() -> None:
    page = (EXAMPLES.parent / "operating-postgres.md").read_text(encoding="utf-8")
    assert f"```text\n{NOTE}\n```" in page
    assert f"less than {cli_logging.OUTAGE_GAP:g} seconds apart are one outage" in page
