"""``fencekeeper export`` and ``fencekeeper prune`` from the command line: data, exit codes, nothing written on bad input."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from fencekeeper.adapters import cli, cli_outbox
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import ExportRetry, OutboxExporter
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import World, open_accounts
from tests.outbox.test_exporter import Recording, make_operations


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ops.db"
    store = SQLiteOperationStore(path, ManualClock())  # 2026-01-01: long ago, for the default windows
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    make_operations(World(store, ManualClock()), 2)
    store.close()
    return path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli.main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_export_to_a_file_then_prune_what_is_past_its_windows(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "events.jsonl"
    code, stdout, _ = run(["export", "--db", str(db), "--sink", f"file:{out}", "--until-idle", "--json"], capsys)
    assert code == 0
    assert json.loads(stdout) == {"delivered": 6, "failed": 0, "parked": 0}
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    first = [m["topic"] for m in lines if m["subject_id"] == lines[0]["subject_id"]]
    assert first == ["operation.admitted", "operation.running", "operation.succeeded"]
    code, stdout, _ = run(["export", "--db", str(db), "--status", "--json"], capsys)
    assert (code, json.loads(stdout)["exported"]) == (0, 6)
    # Nothing pending or parked: the plain line says so with a dash, as the other tables do, not Python's None.
    code, stdout, _ = run(["export", "--db", str(db), "--status"], capsys)
    assert (code, stdout) == (0, "pending 0 parked 0 exported 6 oldest_pending_at - oldest_parked_at -\n")
    code, stdout, _ = run(["prune", "--db", str(db), "--json"], capsys)
    report = json.loads(stdout)
    assert code == 0 and report["finished"]
    # Ended long ago, but exported just now: the outbox window counts from the export.
    assert (report["operations"], report["outbox"], report["identities"]) == (2, 0, 2)
    code, stdout, _ = run(["prune", "--db", str(db), "--outbox", "0s", "--json"], capsys)
    # The newest row stays, so that SQLite numbers the next message past every seq delivered (retention.py).
    assert (code, json.loads(stdout)["outbox"]) == (0, 5)


@pytest.mark.parametrize("prefix", ["FILE:", "File:"])
def test_the_file_prefix_is_read_in_any_case_as_a_url_scheme_is(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], prefix: str
) -> None:
    # As HTTP://host/ is a webhook (RFC 3986, section 3.1), FILE:PATH is the file PATH: it was taken for a
    # URL and refused, "expected stdout, file:PATH or an http(s):// URL".
    out = tmp_path / "Events.jsonl"
    code, stdout, err = run(["export", "--db", str(db), "--sink", f"{prefix}{out}", "--until-idle", "--json"], capsys)
    assert (code, err) == (0, "")
    assert json.loads(stdout)["delivered"] == 6
    assert len(out.read_text().splitlines()) == 6
    # The database itself is refused as a sink whatever the prefix's case: the check reads it as the sink does.
    before = db.read_bytes()
    code, _, err = run(["export", "--db", str(db), "--sink", f"{prefix}{db}", "--until-idle"], capsys)
    assert code == 2 and "is the SQLite database --db names" in err, err
    code, _, err = run(["export", "--db", str(db), "--sink", prefix], capsys)
    assert code == 2 and "--sink: file: needs a path (file:PATH)" in err, err
    assert db.read_bytes() == before


def test_status_reports_parked_rows_apart_from_the_pending_backlog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ops.db"
    clock = ManualClock()
    store = SQLiteOperationStore(path, clock)
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    world = World(store, clock)
    [first] = make_operations(world, 1)
    sink = Recording()
    sink.failing.add(f"{first}/3")  # its last message: nothing of its subject is held behind it
    assert OutboxExporter(store, sink, retry=ExportRetry(maximum_attempts=1)).run(until_idle=True).parked == 1
    parked_row_at = clock.now()  # when its transition committed
    clock.advance(timedelta(hours=6))
    world.transfer("later", 1)  # a fresh backlog, six hours younger than the parked row
    worker = world.worker("w1")
    while worker.run_once() is not None:
        pass
    store.close()
    code, stdout, _ = run(["export", "--db", str(path), "--status", "--json"], capsys)
    status = json.loads(stdout)
    assert code == 1, "a parked row is a problem"
    assert (status["pending"], status["parked"], status["exported"]) == (3, 1, 2)
    # The backlog is six hours younger than the parked row, and says so; the parked row is reported apart.
    assert datetime.fromisoformat(status["oldest_pending_at"]) == clock.now()
    assert datetime.fromisoformat(status["oldest_parked_at"]) == parked_row_at
    code, stdout, _ = run(["export", "--db", str(path), "--status"], capsys)
    assert code == 1
    assert f"oldest_pending_at {clock.now().isoformat()}" in stdout
    assert f"oldest_parked_at {parked_row_at.isoformat()}" in stdout


def test_bad_input_exits_2_and_creates_nothing(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = db.read_bytes()
    for args, words in (
        (["export", "--db", str(db), "--sink", "ftp://x"], "expected stdout, file:PATH"),
        # A URL no request can go to: each delivery failed, and every message was parked after its attempts.
        (["export", "--db", str(db), "--sink", "http://", "--until-idle"], "--sink: 'http://' names no host"),
        (["export", "--db", str(db), "--sink", "https:///events", "--until-idle"], "names no host"),
        (["export", "--db", str(db), "--sink", "http://hooks:80a/", "--until-idle"], "--sink: 'http://hooks:80a/' is not a URL"),
        (["export", "--db", str(db), "--sink", "http://hooks:99999/", "--until-idle"], "is not a URL"),
        (["export", "--db", str(db), "--sink", "http://hooks.example/a b", "--until-idle"], "contains a space"),
        # The database itself, or SQLite's own files beside it: appended to, it would be corrupted.
        (["export", "--db", str(db), "--sink", f"file:{db}", "--until-idle"], "is the SQLite database --db names"),
        (["export", "--db", f"sqlite:///{db}", "--sink", f"file:{db}-wal"], "is the SQLite database --db names"),
        (["export", "--db", str(db), "--sink", f"file:{tmp_path}/../{tmp_path.name}/{db.name}"], "is the SQLite"),
        (["export", "--db", str(db), "--sink", f"file:{tmp_path}/no/such/dir/x.jsonl"], "does not exist"),
        (["export", "--db", str(tmp_path / "absent.db"), "--sink", f"file:{tmp_path}/x.jsonl"], "no database at"),
        # Something is at the path, but not a database: named for what it is, not said to be missing.
        (["export", "--db", str(tmp_path), "--status"], "is a directory, not a SQLite database"),
        (["prune", "--db", str(tmp_path)], "is a directory, not a SQLite database"),
        (["export", "--db", str(db), "--requeue", "nope/1"], "[message_not_found]"),
        (["export", "--db", str(db)], "one of --sink"),
        # An option given empty is named, not taken for no option at all.
        (["export", "--db", str(db), "--requeue", ""], "--requeue: empty"),
        (["export", "--db", str(db), "--discard", ""], "--discard: empty"),
        # A byte no UTF-8 decodes (a lone surrogate in argv) failed in the store's encoder: an internal error, exit 1.
        (["export", "--db", str(db), "--requeue", "op-1/\udcff"], "--requeue: 'op-1/\\udcff' is no message id"),
        (["export", "--db", str(db), "--discard", "op-1/\x01"], "--discard: 'op-1/\\x01' is no message id"),
        (["export", "--db", str(db), "--sink", ""], "--sink: empty"),
        # Named as typed, not in the Python API's words (`results: 40 days, 0:00:00 ...`).
        (["prune", "--db", str(db), "--results", "40d"], "--results: 40d is longer than --operations (30d)"),
        (["prune", "--db", str(db), "--operations", "36h"], "--results: 7d is longer than --operations (36h)"),
        (
            ["prune", "--db", str(db), "--operations", "90s", "--results", "0", "--history", "1.6m"],
            "--history: 96s is longer than --operations (90s)",
        ),
        (["prune", "--db", str(db), "--outbox", "soon"], "not a duration"),
    ):
        code, _, err = run(args, capsys)
        assert code == 2, (args, err)
        assert words in err, (args, err)
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "absent.db").exists()
    assert db.read_bytes() == before


def test_an_out_of_range_option_is_named_and_opens_no_sink(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = db.read_bytes()
    sink = tmp_path / "x.jsonl"
    for args, words in (
        (["export", "--db", str(db), "--sink", f"file:{sink}", "--batch", "20000"], "--batch"),
        (["export", "--db", str(db), "--sink", "http://127.0.0.1:9/", "--timeout", "0s"], "--timeout"),
        (["export", "--db", str(db), "--sink", "http://127.0.0.1:9/", "--timeout", "11m"], "--timeout"),
        (["prune", "--db", str(db), "--batch", "200000"], "--batch"),
        # Polling every 0 s, an idle exporter claimed in a busy loop, one transaction after another.
        (["export", "--db", str(db), "--sink", f"file:{sink}", "--until-idle", "--poll", "0s"], "--poll: must be above 0, got 0s"),
        (["export", "--db", str(db), "--sink", f"file:{sink}", "--until-idle", "--poll", "0"], "--poll"),
    ):
        code, _, err = run(args, capsys)
        assert code == 2, (args, err)
        assert words in err and err.count("error:") == 1, (args, err)
    assert not sink.exists(), "a refused export creates no sink file"
    assert db.read_bytes() == before


@pytest.mark.parametrize(
    ("action", "option"),
    [
        (["--status"], ["--batch", "5"]),
        (["--parked"], ["--until-idle"]),
        (["--requeue", "op-1/1"], ["--poll", "2s"]),
        (["--discard", "op-1/1"], ["--max-attempts", "3"]),
        (["--status"], ["--timeout", "5s"]),
    ],
)
def test_a_delivery_option_given_to_an_action_that_delivers_nothing_is_refused(
    db: Path, capsys: pytest.CaptureFixture[str], action: list[str], option: list[str]
) -> None:
    # Ignored before: `export --status --batch 5` ran, and a typo in a script passed for a setting.
    before = db.read_bytes()
    code, stdout, err = run(["export", "--db", str(db), *action, *option], capsys)
    assert (code, stdout) == (2, "")
    assert f"{option[0]}: applies only with --sink, not with {action[0]}" in err and err.count("error:") == 1, err
    assert db.read_bytes() == before


@pytest.mark.parametrize("sink", ["stdout", "-", "file:{dir}/x.jsonl", "FILE:{dir}/x.jsonl"])
def test_a_webhook_timeout_given_to_another_sink_is_refused(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sink: str
) -> None:
    spec = sink.format(dir=tmp_path)
    code, stdout, err = run(["export", "--db", str(db), "--sink", spec, "--until-idle", "--timeout", "5s"], capsys)
    assert (code, stdout) == (2, "")
    assert "--timeout: applies only to an http(s):// sink" in err, err
    assert not (tmp_path / "x.jsonl").exists()
    # Without it the same export runs, with every default filled in.
    code, _, err = run(["export", "--db", str(db), "--sink", spec, "--until-idle", "--json"], capsys)
    assert code == 0, err


def test_the_pause_docs_outbox_md_suggests_is_taken_in_milliseconds(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # docs/outbox.md spaces a SQLite prune's batches with `--pause 50ms`: a pause is often under a second.
    code, out, err = run(["prune", "--db", str(db), "--pause", "50ms", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["finished"] is True
    code, _, err = run(["prune", "--db", str(db), "--pause", "50us"], capsys)
    assert code == 2 and "--pause: not a duration (like 30d, 12h, 15m, 90s, 50ms): '50us'" in err


def test_status_and_parked_only_read_so_a_held_write_lock_does_not_stop_them(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer stalled mid-transaction is what --status is run to look into: it must answer, not wait for the lock."""
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        before = db.read_bytes()
        started = time.monotonic()
        code, stdout, err = run(["export", "--db", str(db), "--status", "--json"], capsys)
        assert (code, err) == (0, ""), err
        assert json.loads(stdout)["pending"] == 6
        code, stdout, err = run(["export", "--db", str(db), "--parked", "--json"], capsys)
        assert (code, json.loads(stdout), err) == (0, {"parked": [], "total": 0}, "")
        assert time.monotonic() - started < 5, "it waited for the writer's lock"
        assert db.read_bytes() == before
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_parked_counts_every_parked_message_when_it_lists_only_the_oldest(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--parked lists the oldest of them; the count it prints is of them all, not of the list (it said "1000 parked")."""
    store = SQLiteOperationStore(db, ManualClock())
    sink = Recording()
    sink.failing = {str(r[0]) for r in store.application_execute("SELECT message_id FROM outbox")}
    assert OutboxExporter(store, sink, retry=ExportRetry(maximum_attempts=1)).run(until_idle=True).parked == 2
    store.close()
    monkeypatch.setattr(cli_outbox, "_PARKED_SHOWN", 1)  # as if there were more parked than it lists
    code, stdout, err = run(["export", "--db", str(db), "--parked"], capsys)
    assert code == 0
    assert len(stdout.splitlines()) == 1
    assert err == "2 parked; the oldest 1 are listed\n"
    code, stdout, err = run(["export", "--db", str(db), "--parked", "--json"], capsys)
    listed = json.loads(stdout)
    assert (len(listed["parked"]), listed["total"]) == (1, 2)
    monkeypatch.setattr(cli_outbox, "_PARKED_SHOWN", 1000)
    code, stdout, err = run(["export", "--db", str(db), "--parked"], capsys)
    assert (len(stdout.splitlines()), err) == (2, "2 parked\n")
