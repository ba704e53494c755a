"""The exporter: at least once, in order per subject, retries with backoff, parks poison, survives SIGKILL.

Sinks here record what they were sent; the crash test runs the exporter in
a child process (``export_child``) and kills it mid-batch.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pytest

from fencekeeper.adapters import codec
from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.sqlite import SQLiteOperationStore
from fencekeeper.adapters.outbox import (
    ExportedMessage,
    ExportRetry,
    JsonLinesSink,
    OutboxExporter,
    SinkClosed,
    SinkError,
    WebhookSink,
    check_sink,
    discard,
    open_sink,
    outbox_status,
    parked_messages,
    requeue,
    sink_file,
)
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.operations_suite import World, open_accounts
from tests.outbox.conftest import rows

ROOT = Path(__file__).resolve().parents[2]
FAST = ExportRetry(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=8), maximum_attempts=3)


class Recording:
    """A sink that keeps what it was sent, and fails for the message ids in ``failing``."""

    def __init__(self) -> None:
        self.sent: list[ExportedMessage] = []
        self.failing: set[str] = set()
        self.lock = threading.Lock()

    def send(self, message: ExportedMessage) -> None:
        if message.message_id in self.failing:
            raise SinkError(f"refused {message.message_id}")
        with self.lock:
            self.sent.append(message)

    def flush(self) -> None:
        pass


def make_operations(world: World, count: int) -> list[str]:
    ids = [world.transfer(f"k{n}", 1) for n in range(count)]
    worker = world.worker("w1")
    while worker.run_once() is not None:
        pass
    return ids


def in_order_per_subject(messages: list[ExportedMessage]) -> dict[str, list[int]]:
    seen: set[str] = set()
    by_subject: dict[str, list[int]] = {}
    for m in messages:
        if m.message_id in seen:  # a redelivery: at least once
            continue
        seen.add(m.message_id)
        by_subject.setdefault(m.subject_id, []).append(m.seq)
    return by_subject


def test_delivers_every_row_once_in_order_and_marks_it(world: World, store: TransactionalOperationStore) -> None:
    ids = make_operations(world, 6)
    sink = Recording()
    report = OutboxExporter(store, sink, batch_size=4).run(until_idle=True)
    total = rows(store, "SELECT count(*) FROM outbox")[0][0]
    assert report.delivered == total == len(sink.sent)
    assert [m.seq for m in sink.sent] == sorted(m.seq for m in sink.sent)
    assert set(in_order_per_subject(sink.sent)) == set(ids)
    assert rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NULL") == [(0,)]
    # Marked: a second run sends nothing.
    assert OutboxExporter(store, sink).run(until_idle=True).delivered == 0
    assert len(sink.sent) == total


def test_a_failing_row_backs_off_then_parks_holding_only_its_own_subject(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    first, second = make_operations(world, 2)
    sink = Recording()
    poison = f"{first}/2"  # the claim of the first Operation: its admission goes out, the rest waits behind it
    sink.failing.add(poison)
    exporter = OutboxExporter(store, sink, batch_size=50, retry=FAST)
    exporter.run(until_idle=True)
    delivered = {m.message_id for m in sink.sent}
    assert f"{first}/1" in delivered and not any(m.startswith(f"{first}/") and m != f"{first}/1" for m in delivered)
    assert {f"{second}/1", f"{second}/2", f"{second}/3"} <= delivered, "another subject is not held back"
    [(attempts, error, next_at)] = rows(store, "SELECT attempts, last_error, next_attempt_at FROM outbox "
                                              "WHERE message_id = ?", (poison,))  # fmt: skip
    assert (attempts, error) == (1, f"refused {poison}")
    assert next_at is not None
    # Not retried before its backoff; then retried with a doubled wait; parked at the third failure.
    assert exporter.export_batch().claimed == 0
    clock.advance(timedelta(seconds=1))
    assert exporter.export_batch().failed == 1
    clock.advance(timedelta(seconds=1))
    assert exporter.export_batch().claimed == 0, "the second wait is 2 s"
    clock.advance(timedelta(seconds=1))
    report = exporter.export_batch()
    assert (report.failed, report.parked) == (1, 1)
    [parked] = parked_messages(store)
    assert (parked.message_id, parked.attempts, parked.last_error) == (poison, 3, f"refused {poison}")
    clock.advance(timedelta(hours=1))
    assert exporter.export_batch().claimed == 0, "a parked row and what follows it wait for an operator"
    # The operator fixes the sink and requeues: the subject goes on, in order.
    sink.failing.clear()
    assert requeue(store, poison) and not requeue(store, poison)
    exporter.run(until_idle=True)
    tail = [m.message_id for m in sink.sent if m.subject_id == first]
    assert tail == [f"{first}/1", f"{first}/2", f"{first}/3"]
    assert outbox_status(store).pending == 0


def test_discarding_a_parked_row_lets_its_subject_go_on(world: World, store: TransactionalOperationStore) -> None:
    [op] = make_operations(world, 1)
    sink = Recording()
    sink.failing.add(f"{op}/1")
    exporter = OutboxExporter(store, sink, retry=ExportRetry(maximum_attempts=1))
    assert exporter.run(until_idle=True).parked == 1
    assert discard(store, f"{op}/1") and not discard(store, f"{op}/1")
    exporter.run(until_idle=True)
    assert [m.message_id for m in sink.sent] == [f"{op}/2", f"{op}/3"]
    [(error,)] = rows(store, "SELECT last_error FROM outbox WHERE message_id = ?", (f"{op}/1",))
    assert str(error).startswith("discarded: refused")


def test_a_flush_failure_marks_nothing_exported(world: World, store: TransactionalOperationStore) -> None:
    make_operations(world, 1)

    class BadFlush(Recording):
        def flush(self) -> None:
            raise OSError("disk full")

    report = OutboxExporter(store, BadFlush(), retry=FAST).export_batch()
    # Sent but never made durable: every message of the batch counts as failed, and is sent again later.
    assert (report.claimed, report.delivered, report.failed) == (3, 0, 3)
    assert rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL") == [(0,)]
    assert rows(store, "SELECT DISTINCT last_error, attempts FROM outbox") == [("flush failed: OSError: disk full", 1)]


def _whole_lines(path: Path) -> list[dict[str, object]]:
    """Every line of a JSON-lines file, parsed; fails on a line that is not whole JSON, or an unended last line."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), f"the file ends inside a line: {text[-40:]!r}"
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize("fault", ["short_write_then_disk_full", "fsync"])
def test_a_file_sink_batch_that_fails_midway_leaves_the_file_as_it_was_and_is_delivered_again(
    world: World, store: TransactionalOperationStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    make_operations(world, 2)
    out = tmp_path / "events.jsonl"
    sink = JsonLinesSink(out)
    exporter = OutboxExporter(store, sink, batch_size=3, retry=FAST)
    assert exporter.export_batch().delivered == 3
    before = out.read_bytes()
    inode = out.stat().st_ino
    real_write, real_fsync = os.write, os.fsync
    calls: list[int] = []

    def ours(fd: int) -> bool:
        return os.fstat(fd).st_ino == inode

    def write(fd: int, data: bytes) -> int:
        if not ours(fd):
            return real_write(fd, data)
        calls.append(len(data))
        if len(calls) == 1:  # the disk fills halfway through the batch: a short write, then ENOSPC
            return real_write(fd, bytes(data)[: len(data) // 2 + 7])
        raise OSError(errno.ENOSPC, "No space left on device")

    def fsync(fd: int) -> None:
        if ours(fd):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    if fault == "fsync":
        monkeypatch.setattr(os, "fsync", fsync)
    else:
        monkeypatch.setattr(os, "write", write)
    report = exporter.export_batch()
    assert (report.claimed, report.delivered, report.failed) == (3, 0, 3)
    assert out.read_bytes() == before, "the failed batch left nothing of itself in the file"
    monkeypatch.undo()
    # The same sink goes on after its backoff: the batch is delivered again, after the whole lines before it.
    world.clock.advance(timedelta(seconds=2))
    exporter.run(until_idle=True)
    sink.close()
    lines = _whole_lines(out)
    committed = [str(m) for (m,) in rows(store, "SELECT message_id FROM outbox ORDER BY seq")]
    assert [line["message_id"] for line in lines] == committed, "each row once, in order, whole"
    assert [line["attempt"] for line in lines] == [1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_file_sink_cuts_a_line_left_unended_before_it_appends(
    world: World, store: TransactionalOperationStore, tmp_path: Path
) -> None:
    # A writer killed in the middle of a line (or a cut back that failed) left part of one: a message of a
    # batch never marked exported, so delivered again.  Appended after, it would join the next line.
    make_operations(world, 1)
    out = tmp_path / "events.jsonl"
    whole = '{"message_id":"earlier"}\n'
    out.write_text(whole + '{"message_id":"op-x/1","se', encoding="utf-8")
    sink = JsonLinesSink(out)
    OutboxExporter(store, sink).run(until_idle=True)
    sink.close()
    lines = _whole_lines(out)
    assert lines[0] == {"message_id": "earlier"}
    assert len(lines) == 1 + rows(store, "SELECT count(*) FROM outbox")[0][0]


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "tail",
    [
        pytest.param('{"message_id":"whole"}', id="a-whole-message-without-its-newline"),
        pytest.param("a line another program wrote", id="text-not-its-own"),
    ],
)
def test_a_file_sink_keeps_an_unended_line_it_cannot_tell_is_its_own(
    world: World, store: TransactionalOperationStore, tmp_path: Path, tail: str
) -> None:
    # Cutting it would delete data the sink did not write (a file given to it by mistake), or a
    # message that is whole: it is ended with a newline instead, and the batch goes after it.
    make_operations(world, 1)
    out = tmp_path / "events.jsonl"
    out.write_text("first line\n" + tail, encoding="utf-8")
    sink = JsonLinesSink(out)
    OutboxExporter(store, sink).run(until_idle=True)
    sink.close()
    text = out.read_text(encoding="utf-8")
    assert text.startswith("first line\n" + tail + "\n"), text[:120]
    appended = text.splitlines()[2:]
    assert len(appended) == rows(store, "SELECT count(*) FROM outbox")[0][0]
    assert all(json.loads(line)["message_id"] for line in appended)


class _Hook(http.server.BaseHTTPRequestHandler):
    statuses: ClassVar[list[int]] = []
    received: ClassVar[list[tuple[str, dict[str, object]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        status = self.statuses.pop(0) if self.statuses else 200
        if status == 200:
            self.received.append((self.headers["Idempotency-Key"], body))
        self.send_response(status)
        if 300 <= status < 400:
            self.send_header("Location", "/moved")
            self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # where a redirect leads: a page, not a receiver of events
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    _Hook.statuses, _Hook.received = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/events"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_webhook_posts_each_message_with_its_id_and_retries_an_error_status(
    world: World, store: TransactionalOperationStore, clock: ManualClock, webhook: str
) -> None:
    [op] = make_operations(world, 1)
    _Hook.statuses = [503]
    exporter = OutboxExporter(store, WebhookSink(webhook, timeout=5), retry=FAST)
    first = exporter.export_batch()
    assert (first.delivered, first.failed) == (0, 1)
    assert rows(store, "SELECT last_error FROM outbox WHERE message_id = ?", (f"{op}/1",)) == [
        (f"HTTP 503 from {webhook}",)
    ]
    clock.advance(timedelta(seconds=1))
    exporter.run(until_idle=True)
    assert [key for key, _ in _Hook.received] == [f"{op}/1", f"{op}/2", f"{op}/3"]
    assert [body["message_id"] for _, body in _Hook.received] == [key for key, _ in _Hook.received]
    assert _Hook.received[0][1]["attempt"] == 2


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize("scheme", ["HTTP", "Http"])
def test_a_webhook_url_whose_scheme_is_in_capitals_is_taken(
    world: World, store: TransactionalOperationStore, webhook: str, scheme: str
) -> None:
    # RFC 3986, section 3.1: a scheme is case-insensitive, so HTTP://host/ names what http://host/ does.
    url = scheme + webhook[len("http") :]
    check_sink(url)
    check_sink("HTTPS://hooks.example/fk")
    [op] = make_operations(world, 1)
    sink = open_sink(url, timeout=5)
    assert isinstance(sink, WebhookSink)
    assert OutboxExporter(store, sink).run(until_idle=True).delivered == 3
    assert [key for key, _ in _Hook.received] == [f"{op}/1", f"{op}/2", f"{op}/3"]
    for refused in ("HTTPX://host/", "ftp://host/", "FILEX:/tmp/x"):
        with pytest.raises(StoreError, match="expected stdout, file:PATH or an http"):
            check_sink(refused)


@pytest.mark.parametrize("prefix", ["file:", "FILE:", "File:"])
def test_a_file_sink_prefix_is_read_in_any_case_and_the_path_keeps_its_own(tmp_path: Path, prefix: str) -> None:
    # Consistent with the webhook's scheme above: FILE:/tmp/x was taken for a URL and refused.
    path = tmp_path / "Out.jsonl"
    assert sink_file(prefix + str(path)) == str(path)
    check_sink(prefix + str(path))
    sink = open_sink(prefix + str(path))
    assert isinstance(sink, JsonLinesSink)
    sink.close()
    assert path.exists() and not (tmp_path / "out.jsonl").exists()
    with pytest.raises(StoreError, match="needs a path"):
        check_sink(prefix)
    with pytest.raises(StoreError, match="does not exist"):
        check_sink(f"{prefix}{tmp_path}/no/such/x.jsonl")


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize("status", [301, 302, 303, 307])
def test_webhook_redirect_is_a_failure_not_a_delivery(
    world: World, store: TransactionalOperationStore, webhook: str, status: int
) -> None:
    [op] = make_operations(world, 1)
    _Hook.statuses = [status]
    report = OutboxExporter(store, WebhookSink(webhook, timeout=5), retry=FAST).export_batch()
    assert (report.delivered, report.failed) == (0, 1), "only a 2xx answer to the POST is a delivery"
    assert rows(store, "SELECT exported_at, last_error FROM outbox WHERE message_id = ?", (f"{op}/1",)) == [
        (None, f"HTTP {status} from {webhook}")
    ]


def test_webhook_unreachable_is_a_failure_not_a_crash(tmp_path: Path, clock: ManualClock) -> None:
    store = SQLiteOperationStore(tmp_path / "ops.db", clock)
    try:
        open_accounts(store, {"acc-1": 10, "acc-2": 0})
        World(store, clock).transfer("k1", 1)
        report = OutboxExporter(store, WebhookSink("http://127.0.0.1:9/nothing", timeout=1), retry=FAST).export_batch()
        assert (report.delivered, report.failed) == (0, 1)
        [(error,)] = rows(store, "SELECT last_error FROM outbox")
        assert str(error).startswith("POST http://127.0.0.1:9/nothing failed")
    finally:
        store.close()


def test_sigkill_mid_batch_then_rerun_delivers_every_committed_row_in_order(tmp_path: Path) -> None:
    db, out = tmp_path / "ops.db", tmp_path / "out.jsonl"
    store = SQLiteOperationStore(db, ManualClock(datetime.now(UTC)))
    open_accounts(store, {"acc-1": 1000, "acc-2": 0})
    ids = make_operations(World(store, ManualClock()), 30)
    store.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.outbox.export_child", str(db), str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        # Into the third batch of 25: two batches marked, one half sent.
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 62):
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    sent_before = len(out.read_text().splitlines())
    # Later than the dead exporter's lease, so its claim is taken over.
    store = SQLiteOperationStore(db, ManualClock(datetime.now(UTC) + timedelta(minutes=1)))
    try:
        exported_before = rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NOT NULL")[0][0]
        assert isinstance(exported_before, int) and exported_before < sent_before, "the kill landed mid-batch"
        sink = JsonLinesSink(out)
        OutboxExporter(store, sink).run(until_idle=True)
        sink.close()
        committed = rows(store, "SELECT seq, message_id, subject_id FROM outbox ORDER BY seq")
        assert rows(store, "SELECT count(*) FROM outbox WHERE exported_at IS NULL") == [(0,)]
    finally:
        store.close()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    delivered = [
        ExportedMessage(d["message_id"], d["seq"], d["kind"], d["subject_id"], d["tenant"], d["topic"],
                        datetime.fromisoformat(d["at"]), json.dumps(d["payload"]), d["attempt"])
        for d in lines
    ]  # fmt: skip
    assert {m.message_id for m in delivered} == {str(r[1]) for r in committed}, "every committed row, at least once"
    assert len(delivered) > len(committed), "the interrupted batch was delivered again"
    expected: dict[str, list[int]] = {}
    for seq, _, subject in committed:
        expected.setdefault(str(subject), []).append(int(str(seq)))
    assert in_order_per_subject(delivered) == expected
    assert set(expected) == set(ids)


@pytest.mark.parametrize("store", ["postgresql"], indirect=True)
def test_two_exporters_at_once_share_the_rows_and_keep_each_subjects_order(
    world: World, store: TransactionalOperationStore
) -> None:
    make_operations(world, 20)
    sink = Recording()
    exporters = [OutboxExporter(store, sink, batch_size=7, exporter_id=f"x{n}") for n in range(2)]
    threads = [threading.Thread(target=e.run, kwargs={"until_idle": True}) for e in exporters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Until idle may stop one while the other still holds rows; finish what is left.
    exporters[0].run(until_idle=True)
    total = rows(store, "SELECT count(*) FROM outbox")[0][0]
    assert len(sink.sent) == total, "each row once: no crash, no double claim"
    assert len({m.message_id for m in sink.sent}) == total
    for seqs in in_order_per_subject(sink.sent).values():
        assert seqs == sorted(seqs)


def test_a_reader_that_went_away_stops_the_exporter_and_fails_no_message(
    world: World, store: TransactionalOperationStore
) -> None:
    make_operations(world, 3)
    read, write = os.pipe()
    os.close(read)  # the consumer of `fencekeeper export --sink stdout | consumer` died
    with os.fdopen(write, "w", encoding="utf-8") as stream:
        exporter = OutboxExporter(store, JsonLinesSink(stream), retry=ExportRetry(maximum_attempts=1))
        with pytest.raises(SinkClosed):
            exporter.run(until_idle=True)
        with contextlib.suppress(BrokenPipeError):
            stream.close()
    touched = "attempts > 0 OR parked_at IS NOT NULL OR exported_at IS NOT NULL OR claimed_by IS NOT NULL"
    assert rows(store, f"SELECT count(*) FROM outbox WHERE {touched}") == [(0,)], "no attempt spent, nothing parked"
    sink = Recording()
    OutboxExporter(store, sink).run(until_idle=True)
    assert len(sink.sent) == rows(store, "SELECT count(*) FROM outbox")[0][0], "the next exporter delivers them all"


def test_export_to_stdout_whose_reader_went_away_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "ops.db"
    store = SQLiteOperationStore(path, ManualClock())
    open_accounts(store, {"acc-1": 100, "acc-2": 0})
    make_operations(World(store, ManualClock()), 2)
    store.close()
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fencekeeper.adapters.cli", "export", "--db", str(path), "--sink", "stdout"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("fencekeeper: error:") == 1 and "Traceback" not in done.stderr, done.stderr
    reopened = SQLiteOperationStore(path, ManualClock())
    try:
        assert rows(reopened, "SELECT count(*) FROM outbox WHERE attempts > 0 OR exported_at IS NOT NULL") == [(0,)]
    finally:
        reopened.close()


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_an_exporter_sends_nothing_once_its_claims_lease_has_run_out(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    make_operations(world, 2)
    lease = timedelta(seconds=0.6)
    sent: list[tuple[str, str]] = []
    other = Recording()

    class Slow(Recording):
        """A webhook that takes 0.25 s an answer; the other exporter starts once the first one's lease is over."""

        def send(self, message: ExportedMessage) -> None:
            time.sleep(0.25)
            clock.advance(timedelta(seconds=0.25))
            sent.append(("slow", message.message_id))
            if clock.now() - started >= lease and not other.sent:
                OutboxExporter(store, other, lease=lease, exporter_id="other").export_batch()
                sent.extend(("other", m.message_id) for m in other.sent)

    started = clock.now()
    report = OutboxExporter(store, Slow(), lease=lease, exporter_id="slow").export_batch()
    first_other = next((k for k, (who, _) in enumerate(sent) if who == "other"), len(sent))
    assert all(who == "other" for who, _ in sent[first_other:]), "nothing sent beside the exporter now holding them"
    assert report.held > 0 and report.delivered + report.held == report.claimed
    OutboxExporter(store, other).run(until_idle=True)
    total = rows(store, "SELECT count(*) FROM outbox")[0][0]
    assert len({m for _, m in sent} | {m.message_id for m in other.sent}) == total, "each delivered, at least once"


def test_a_row_that_failed_many_times_waits_the_maximum_interval(
    world: World, store: TransactionalOperationStore, clock: ManualClock
) -> None:
    [op] = make_operations(world, 1)
    retry = ExportRetry(maximum_attempts=10_000)
    for attempts in (47, 48, 1100):
        assert retry.delay(attempts) == retry.maximum_interval
    rows(store, "UPDATE outbox SET attempts = 1100 WHERE message_id = ?", (f"{op}/1",))
    sink = Recording()
    sink.failing = {f"{op}/1"}
    report = OutboxExporter(store, sink, retry=retry).export_batch()
    assert (report.failed, report.parked) == (1, 0)
    [(attempts, waits_until)] = rows(store, "SELECT attempts, next_attempt_at FROM outbox WHERE message_id = ?",
                                     (f"{op}/1",))  # fmt: skip
    assert attempts == 1101
    until = waits_until if isinstance(waits_until, datetime) else codec.decode_time(str(waits_until))
    assert until == clock.now() + retry.maximum_interval


@pytest.mark.parametrize("text", ["cannot write /data/\udcff.log", "answer b'\x00\x01' is no JSON"])
def test_a_sink_error_no_store_takes_as_text_is_recorded_escaped_and_parks(
    world: World, store: TransactionalOperationStore, text: str
) -> None:
    """A lone surrogate (a path decoded with surrogateescape) or a NUL in a sink's error is stored escaped.

    Stored as it was, it failed the marking transaction (no UTF-8; PostgreSQL's
    text holds no NUL): the exporter stopped with the row still claimed, and
    every later claim of it stopped it again, so the message never parked.
    """
    [op] = make_operations(world, 1)

    class Failing(Recording):
        def send(self, message: ExportedMessage) -> None:
            if message.message_id == f"{op}/1":
                raise RuntimeError(text)
            super().send(message)

    report = OutboxExporter(store, Failing(), retry=ExportRetry(maximum_attempts=1)).export_batch()
    assert (report.failed, report.parked) == (1, 1)
    [parked] = parked_messages(store)
    assert parked.message_id == f"{op}/1"
    assert parked.last_error.startswith("RuntimeError: ")
    assert "\\udcff" in parked.last_error or "\\x00" in parked.last_error, parked.last_error
    assert rows(store, "SELECT count(*) FROM outbox WHERE claimed_by IS NOT NULL") == [(0,)], "nothing left claimed"


def test_attempt_counts_failures_not_deliveries(world: World, store: TransactionalOperationStore) -> None:
    """docs/outbox.md: a delivery again after an exporter's claim was lost carries the same attempt number."""
    [op] = make_operations(world, 1)
    first = f"{op}/1"
    lost = OutboxExporter(store, Recording(), exporter_id="lost")
    claimed = lost._claim("lost/token")  # claimed, then the exporter is killed: nothing marked
    assert [m.attempt for m in claimed if m.message_id == first] == [1]
    rows(store, "UPDATE outbox SET claimed_until = NULL WHERE claimed_by = ?", ("lost/token",))  # its lease ran out
    sink = Recording()
    OutboxExporter(store, sink).run(until_idle=True)
    assert [m.attempt for m in sink.sent if m.message_id == first] == [1], "delivered again, not a failure"
