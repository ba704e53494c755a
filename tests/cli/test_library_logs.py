"""A lost store connection is one line of the command's own, not the libraries' warnings printed raw.

psycopg and its pool warn of every connection a server restart, a failover
or ``pg_terminate_backend`` kills; with no logging configured, Python printed
each raw on stderr ("discarding closed connection: <psycopg.Connection [BAD]
at 0x...>"), between the worker's own lines, for an event the worker rides
out.  The command line routes library records through its notes
(adapters/cli_logging.py): a lost connection is one note per outage, and any
other library warning still shows, in the command's format, with its logger.

Once a request that failed in the outage goes through, the outage is
answered by one note more, however many worker threads get through at once:
how long after the first note, and how many requests failed meanwhile, so
that a log read later shows the outage's length.  A run with no failure says
neither.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters import cli_logging
from tests.cli.runner import (
    ANSWERED_NOTE,
    EXAMPLES,
    FENCEKEEPER,
    LOST_NOTE,
    catches,
    environment,
    fencekeeper,
    ok,
    sane_outage,
)

EXECUTIONS = 6
PURCHASE = EXAMPLES / "purchase_approval.toml"
TRANSFERS = 4


def _answered_once(lines: list[str]) -> tuple[float, int]:
    """The one note that the store answers again, after the one lost-connection note: its seconds and failures."""
    back = [n for n, line in enumerate(lines) if line.startswith("the store answers again")]
    lost = [n for n, line in enumerate(lines) if line == LOST_NOTE]
    assert len(lost) == 1 and len(back) == 1 and lost[0] < back[0], lines
    matched = ANSWERED_NOTE.fullmatch(lines[back[0]])
    assert matched is not None, lines[back[0]]
    seconds, failures = float(matched[1]), int(matched[2])
    sane_outage(seconds, failures)
    return seconds, failures


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
        [str(FENCEKEEPER), "worker", "--db", url, "--concurrency", "3", "--poll", "0.2", "--json",
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
        # Every line of stderr is an object of the log; the outage is two of them, and no library record is.
        objects = [json.loads(line) for line in lines]
        events = [o["event"] for o in objects]
        assert events.count("store_connection_lost") == 1 and "library_warning" not in events, stderr
        assert [o["detail"] for o in objects if o["event"] == "store_connection_lost"] == [LOST_NOTE]
        # Three threads met the outage; the process answers it once, after the note of it.
        assert events.count("store_answers_again") == 1, stderr
        assert events.index("store_connection_lost") < events.index("store_answers_again"), stderr
        back = objects[events.index("store_answers_again")]
        assert back["level"] == "info" and isinstance(back["seconds"], float) and isinstance(back["failures"], int)
        sane_outage(back["seconds"], back["failures"])
        assert back["detail"] == cli_logging.answers_again(back["seconds"], back["failures"])
        assert ANSWERED_NOTE.fullmatch(back["detail"]), back
        return
    _answered_once(lines)
    # Nothing else but the worker's own note of the signal: no psycopg record, raw or routed.
    assert [
        line
        for line in lines
        if line != LOST_NOTE and not ANSWERED_NOTE.fullmatch(line) and not line.startswith("stopping")
    ] == [], stderr


def _transfers(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT count(*) FROM {schema}.app_transfers").fetchone()  # type: ignore[arg-type]
    assert found is not None
    return int(found[0])


def test_an_op_worker_whose_connections_are_ended_says_once_that_the_store_answers_again(
    pg_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    application = f"fk-test-{uuid.uuid4().hex[:12]}"
    worker = subprocess.Popen(
        [str(FENCEKEEPER), "op", "worker", "--db", url, "--concurrency", "3", "--poll", "0.2", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(PGAPPNAME=application),
    )
    try:
        deadline = time.monotonic() + 60
        # Its actions module's prepare has run once the accounts exist: the loops are polling by then.
        while not (catches(worker.pid, signal.SIGTERM) and _sessions(pg_dsn, application) >= 1 and _has_accounts(pg_dsn, pg_schema)):
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the op worker never started"
            time.sleep(0.05)
        time.sleep(0.3)  # past prepare: the loops are polling, no attempt in flight
        assert _sessions(pg_dsn, application, end=True) >= 1
        transfer = json.dumps({"from": "acc-1", "to": "acc-2", "amount": 5})
        for n in range(TRANSFERS):
            ok("op", "submit", "transfer", "--db", url, "--key", f"t-{n}", "--input", transfer, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while _transfers(pg_dsn, pg_schema) < TRANSFERS:
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the op worker did not run the transfers"
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, stderr
    assert [r["outcome"] for r in json.loads(stdout)["reports"]] == ["succeeded"] * TRANSFERS, stdout
    lines = stderr.splitlines()
    _answered_once(lines)
    assert [
        line
        for line in lines
        if line != LOST_NOTE and not ANSWERED_NOTE.fullmatch(line) and not line.startswith("stopping")
    ] == [], stderr


def _has_accounts(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.app_accounts",)).fetchone()
    return bool(found and found[0])


@pytest.mark.parametrize("command", ["worker", "worker --log-json", "op worker", "op worker --log-json"])
def test_a_run_with_no_store_failure_says_neither_note(pg_dsn: str, pg_schema: str, tmp_path: Path, command: str) -> None:
    url = f"{pg_dsn}?schema={pg_schema}"
    if command.startswith("op"):
        transfer = json.dumps({"from": "acc-1", "to": "acc-2", "amount": 5})
        ok("op", "worker", "--db", url, "--until-idle", cwd=tmp_path)  # its prepare makes the accounts
        for n in range(2):
            ok("op", "submit", "transfer", "--db", url, "--key", f"t-{n}", "--input", transfer, cwd=tmp_path)
    else:
        for n in range(2):
            order = json.dumps({"amount": 50, "order_id": f"o-{n}", "order_revision": 1})
            ok("run", PURCHASE, "--db", url, "--input", order, "--id", f"o-{n}", cwd=tmp_path)
    result = fencekeeper(*command.split(), "--db", url, "--until-idle", "--concurrency", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "the store" not in result.stderr and "store_" not in result.stderr, result.stderr
    if command.startswith("op"):
        assert _transfers(pg_dsn, pg_schema) == 2
    else:
        assert _succeeded(pg_dsn, pg_schema) == 2


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


def _lost_records(count: int = 1) -> None:
    for _ in range(count):
        _record("psycopg.pool", "discarding closed connection: %s", "<psycopg.Connection [BAD] at 0x1>")


class Notes:
    """What a command said while routed: its notes, and each answer's (seconds, failures)."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.back: list[tuple[float, int]] = []

    def routed(self, clock: Clock, *, lost: str | None = "lost") -> Any:
        return cli_logging.routed(
            self.said.append, lambda logger, text: None, lost=lost, back=lambda s, f: self.back.append((s, f)), clock=clock
        )


def test_threads_getting_through_together_answer_the_outage_once_with_its_length_and_failures() -> None:
    notes, clock = Notes(), Clock()
    threads = 8
    with notes.routed(clock):
        _lost_records(threads)  # the pool's connections, all ended at once
        for _ in range(threads * 2):  # each thread's request fails twice
            cli_logging.store_failed()
        clock.now += 4.25
        ready = threading.Barrier(threads)

        def through() -> None:
            ready.wait()
            cli_logging.store_answered(2)

        running = [threading.Thread(target=through) for _ in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join()
        assert notes.said == ["lost"] and notes.back == [(4.25, threads * 2)]
        # A straggler meets a dead connection left over from the same outage: neither said again.
        clock.now += 1
        _lost_records()
        cli_logging.store_failed()
        cli_logging.store_answered(1)
        assert notes.said == ["lost"] and len(notes.back) == 1
        # Past the gap, another outage: its own pair.
        clock.now += cli_logging.OUTAGE_GAP
        _lost_records()
        cli_logging.store_failed()
        clock.now += 0.5
        cli_logging.store_answered(1)
        assert notes.said == ["lost", "lost"] and notes.back == [(4.25, threads * 2), (0.5, 1)]
    # Outside a command nothing is told, and nothing fails.
    cli_logging.store_failed()
    cli_logging.store_answered(3)
    assert len(notes.back) == 2


def test_an_outage_still_failing_is_one_however_far_apart_its_losses() -> None:
    notes, clock = Notes(), Clock()
    with notes.routed(clock):
        _lost_records()
        cli_logging.store_failed()
        # A restarting server refuses the pool's reconnections further and further apart.
        for _ in range(3):
            clock.now += cli_logging.OUTAGE_GAP + 2
            _record("psycopg.pool", "error connecting in %r: %s", "pool-1", psycopg.OperationalError("refused"))
            cli_logging.store_failed()
        cli_logging.store_answered(4)
    assert notes.said == ["lost"] and notes.back == [(3 * (cli_logging.OUTAGE_GAP + 2), 4)]


def test_no_answer_is_said_without_a_failure_in_an_outage_whose_note_was_said() -> None:
    notes, clock = Notes(), Clock()
    with notes.routed(clock):
        cli_logging.store_answered(0)  # a request that went through, as every one does
        cli_logging.store_failed()  # a row another transaction held: waited out, no outage
        cli_logging.store_answered(1)
        assert notes.said == [] and notes.back == []
        # A loss no request met (the pool replaced the connection), then, long after, a held row.
        _lost_records()
        clock.now += cli_logging.OUTAGE_GAP + 60
        cli_logging.store_failed()
        cli_logging.store_answered(1)
        assert notes.said == ["lost"] and notes.back == []
        _lost_records()  # a new outage is said, and answered, as any other
        cli_logging.store_failed()
        clock.now += 1
        cli_logging.store_answered(1)
        assert notes.said == ["lost", "lost"] and notes.back == [(1.0, 1)]
    # A command that says no lost note (export says its own) answers none either.
    quiet = Notes()
    with quiet.routed(clock, lost=None):
        _lost_records()
        cli_logging.store_failed()
        cli_logging.store_answered(1)
    assert quiet.said == [] and quiet.back == []


def test_the_answer_counts_the_failure_that_came_before_its_loss_was_logged() -> None:
    notes, clock = Notes(), Clock()
    with notes.routed(clock):
        cli_logging.store_failed()  # a thread's failure, told before the pool logged the dead connection
        _lost_records()
        clock.now += 0.2
        cli_logging.store_answered(1)
    assert notes.back == [(pytest.approx(0.2), 1)]


def test_the_answer_reads_as_the_lost_note_does() -> None:
    assert cli_logging.answers_again(4.24, 3) == "the store answers again after 4.2 s (3 requests failed); continuing"
    assert cli_logging.answers_again(0.05, 1) == "the store answers again after 0.1 s (1 request failed); continuing"


def test_the_operating_page_quotes_the_line_and_the_outage_gap() -> None:
    page = (EXAMPLES.parent / "operating-postgres.md").read_text(encoding="utf-8")
    assert f"```text\n{LOST_NOTE}\n```" in page
    assert f"less than {cli_logging.OUTAGE_GAP:g} seconds apart are one outage" in page
    quoted = re.search(r"```text\n(the store answers again[^\n]*)\n```", page)
    assert quoted is not None and ANSWERED_NOTE.fullmatch(quoted[1]), "the page quotes the answer as the worker says it"
    assert '"event": "store_answers_again"' in " ".join(page.split())
