"""``fencekeeper export`` as a long-running process: it stops cleanly on a signal, and outlasts a store that goes
away for a moment, on SQLite and PostgreSQL.

Each test runs the real command in a child process, as a service manager
runs it, and reads what it left in the store.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest

from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import OutboxExporter
from fencekeeper.adapters.store import ManualClock, StoreError, StorePatience
from fencekeeper.adapters.testing.operations_suite import World, open_accounts
from tests.outbox.conftest import rows
from tests.outbox.test_exporter import Recording, make_operations

ROOT = Path(__file__).resolve().parents[2]
APPLICATION = "fk-export-under-test"


class Store:
    """An operation store the test writes through, and the ``--db`` the child process is given for it."""

    def __init__(self, store: TransactionalOperationStore, url: str, clock: ManualClock) -> None:
        self.store, self.url, self.world = store, url, World(store, clock)


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    clock = ManualClock(datetime.now(UTC))
    opened: TransactionalOperationStore
    if request.param == "sqlite":
        url = str(tmp_path / "ops.db")
        opened = SQLiteOperationStore(url, clock)
    else:
        from fencekeeper.adapters.operations.postgres import PostgresOperationStore  # noqa: PLC0415

        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        opened = PostgresOperationStore(dsn, schema=schema, clock=clock, pool_size=2)
        url = f"{dsn}{'&' if '?' in dsn else '?'}application_name={APPLICATION}&schema={schema}"
    open_accounts(opened, {"acc-1": 1000, "acc-2": 0})
    yield Store(opened, url, clock)
    opened.close()


def export(url: str, *options: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fencekeeper.adapters.cli", "export", "--db", url, *options],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def until(condition: Any, what: str, seconds: float = 60) -> None:
    """Wait for ``condition()``; a deadline far past what it takes only keeps a broken run from hanging."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def said_stopping(proc: subprocess.Popen[str]) -> None:
    """Read its stderr up to the line saying it stops: the stop is set before that line is written."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        if "stopping after the current send" in line:
            return
        seen.append(line)
    raise AssertionError(f"it never said it was stopping: {''.join(seen)}")


class _Held(http.server.BaseHTTPRequestHandler):
    """A receiver that takes each POST but answers the first only once the test lets it."""

    received: ClassVar[list[str]] = []
    arrived: ClassVar[threading.Event] = threading.Event()
    answer: ClassVar[threading.Event] = threading.Event()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        first = not self.received
        self.received.append(body["message_id"])
        if first:
            self.arrived.set()
            self.answer.wait(60)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def held_webhook() -> Iterator[str]:
    _Held.received, _Held.arrived, _Held.answer = [], threading.Event(), threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Held)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/events"
    _Held.answer.set()
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_send_in_progress_marks_it_and_releases_the_rest_of_the_claim(
    target: Store, held_webhook: str, number: signal.Signals
) -> None:
    make_operations(target.world, 3)  # 3 Operations, 9 messages: one claim takes them all
    total = rows(target.store, "SELECT count(*) FROM outbox")[0][0]
    proc = export(target.url, "--sink", held_webhook)
    try:
        assert _Held.arrived.wait(60), "the first message's POST never arrived"
        proc.send_signal(number)
        said_stopping(proc)
        _Held.answer.set()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "delivered 1," in out, out
    assert _Held.received == [rows(target.store, "SELECT message_id FROM outbox ORDER BY seq LIMIT 1")[0][0]]
    # What it sent is marked; nothing else is claimed, failed or parked: the next exporter needs no lease to end.
    assert rows(target.store, "SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL") == [(1,)]
    assert rows(target.store, "SELECT count(*) FROM outbox WHERE claimed_by IS NOT NULL OR claimed_until IS NOT NULL "
                "OR attempts > 0 OR parked_at IS NOT NULL") == [(0,)]  # fmt: skip
    sink = Recording()
    OutboxExporter(target.store, sink).run(until_idle=True)
    assert len(sink.sent) == total - 1


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_a_second_signal_exits_at_once(target: Store, held_webhook: str) -> None:
    make_operations(target.world, 1)
    proc = export(target.url, "--sink", held_webhook)
    try:
        assert _Held.arrived.wait(60), "the first message's POST never arrived"
        proc.send_signal(signal.SIGTERM)
        said_stopping(proc)
        proc.send_signal(signal.SIGTERM)
        # The receiver has not answered: only a process that leaves at once ends now.
        code = proc.wait(timeout=60)
    finally:
        _Held.answer.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130
    assert rows(target.store, "SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL") == [(0,)]


@pytest.mark.parametrize("target", ["postgresql"], indirect=True)
def test_export_outlasts_its_backends_being_terminated(target: Store, tmp_path: Path, pg_dsn: str) -> None:
    out = tmp_path / "events.jsonl"

    def lines() -> int:
        return len(out.read_text(encoding="utf-8").splitlines()) if out.exists() else 0

    make_operations(target.world, 2)
    first = rows(target.store, "SELECT count(*) FROM outbox")[0][0]
    assert isinstance(first, int)
    proc = export(target.url, "--sink", f"file:{out}", "--poll", "50ms")
    try:
        until(lambda: lines() == first, "the first messages exported")
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            terminated = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (APPLICATION,),
            ).fetchone()
        assert terminated is not None and terminated[0] >= 1
        for key in ("later-1", "later-2"):  # keys of their own: new Operations, new messages
            target.world.transfer(key, 1)
        worker = target.world.worker("w2")
        while worker.run_once() is not None:
            pass
        total = rows(target.store, "SELECT count(*) FROM outbox")[0][0]
        assert isinstance(total, int) and total > first
        until(lambda: lines() == total or proc.poll() is not None, "the messages committed since exported")
        assert proc.poll() is None, f"it stopped (exit {proc.returncode}): {proc.communicate()[1]}"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "the store failed:" in err and "[store_unavailable]" in err, err
    # One pair for the outage: the failure, then the answer with how long it took and how many requests failed.
    said = err.splitlines()
    failed = [n for n, line in enumerate(said) if line.startswith("the store failed:")]
    back = [n for n, line in enumerate(said) if line.startswith("the store answers again")]
    assert len(failed) == 1 and len(back) == 1 and failed[0] < back[0], err
    answered = re.fullmatch(r"the store answers again after (\d+\.\d) s \((\d+) requests? failed\); exporting", said[back[0]])
    assert answered is not None, said[back[0]]
    assert 0.0 <= float(answered[1]) < 30.0 and 1 <= int(answered[2]) <= 40, said[back[0]]
    assert rows(target.store, "SELECT count(*) FROM outbox WHERE exported_at IS NULL") == [(0,)]


def test_an_export_the_store_never_fails_says_neither_note(target: Store, tmp_path: Path) -> None:
    make_operations(target.world, 2)
    proc = export(target.url, "--sink", f"file:{tmp_path / 'events.jsonl'}", "--until-idle")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "delivered" in out and "the store" not in err, err


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
def test_a_marking_the_store_failed_is_made_again_so_nothing_is_sent_twice(
    target: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_operations(target.world, 2)
    sink = Recording()
    exporter = OutboxExporter(target.store, sink)
    mark = exporter._mark
    failures = [StoreError("store_unavailable", "the connection was lost")]

    def flaky(*args: Any) -> int:
        if failures:
            raise failures.pop()
        return mark(*args)

    monkeypatch.setattr(exporter, "_mark", flaky)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    exporter.run(until_idle=True)
    assert not failures
    total = rows(target.store, "SELECT count(*) FROM outbox")[0][0]
    assert len(sink.sent) == total, "each message once"
    assert rows(target.store, "SELECT count(*) FROM outbox WHERE exported_at IS NULL") == [(0,)]


def test_a_store_that_keeps_failing_stops_export_with_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fencekeeper.adapters import cli, outbox  # noqa: PLC0415

    path = tmp_path / "ops.db"
    opened = SQLiteOperationStore(path, ManualClock())
    open_accounts(opened, {"acc-1": 10, "acc-2": 0})
    opened.close()
    calls = [0]

    def down(self: OutboxExporter, stop: Any = None) -> Any:
        calls[0] += 1
        raise StoreError("store_unavailable", "server closed the connection unexpectedly")

    monkeypatch.setattr(OutboxExporter, "export_batch", down)
    # No time to wait it out: the second failure in a row is past it.
    monkeypatch.setattr(outbox, "StorePatience", functools.partial(StorePatience, budget=0.0))
    capsys.readouterr()
    code = cli.main(["export", "--db", str(path), "--sink", f"file:{tmp_path / 'out.jsonl'}"])
    err = capsys.readouterr().err
    assert (code, calls[0]) == (1, 2), err
    assert "the store failed: server closed the connection unexpectedly [store_unavailable]; trying again" in err
    assert err.splitlines()[-1].startswith("fencekeeper: error: server closed the connection unexpectedly "
                                           "[store_unavailable]")  # fmt: skip
