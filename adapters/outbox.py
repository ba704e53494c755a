"""The outbox exporter: committed transitions out of the database, at least once, in order per subject.

Rules of this module:

- The outbox (``outbox_rows``) is written by the stores in each
  transition's own transaction; this module only reads it and writes the
  delivery columns (``attempts``, ``next_attempt_at``, ``claimed_by``,
  ``claimed_until``, ``last_error``, ``parked_at``, ``exported_at``).  A
  trigger refuses any change to what a row says.
- A batch is claim, deliver, mark, in three steps, and no transaction is
  open while a sink works: a slow webhook never holds a lock a worker needs.
  The claim writes a lease (``claimed_by``, ``claimed_until``) in one short
  transaction; PostgreSQL takes the rows ``FOR UPDATE SKIP LOCKED`` so two
  exporters never wait on each other.  Marking is guarded by the claim's
  token: an exporter whose lease expired (it was stopped, or killed) marks
  nothing, and the rows are claimed again -- delivered at least once, never
  lost.  An exporter whose sink is slower than its lease sends nothing
  after the lease has run out: the rest is held, for the next claim.  ``message_id`` never changes, so a sink deduplicates on it.
- Order per subject (one Operation, one execution): a row is claimed only
  together with every earlier undelivered row of its subject, so no two
  exporters hold one subject at once, and within a batch a subject's rows
  go out in ``seq`` order.  When one fails, the rest of its subject in
  that batch is not sent; other subjects go on.
- A failure is retried with exponential backoff (``ExportRetry``, the
  retry vocabulary of ``RetryPolicy``); after ``maximum_attempts`` the row
  is *parked* with its last error.  A parked row holds back only its own
  subject (order is kept) and never the others; an operator inspects it
  (:meth:`OutboxExporter.parked`), then requeues or discards it.
- Time is the store's (the database's on PostgreSQL), read inside each
  transaction.
- A running exporter outlasts a store that stops answering for a while,
  as a worker does (``StorePatience``: a backoff of 0.2 s doubling to 5 s,
  for up to ``RIDE_OUT_SECONDS`` of failures in a row); a marking that
  fails is made again, so a blip delivers nothing twice.  Past that, or on
  any other store error, it stops with the error.
- A stop (``run``'s ``stop``) ends the batch after the send in progress:
  what was sent is marked, the rest of the claim released at once rather
  than left to its lease.  A store that fails then is tried for
  ``STOP_GRACE`` seconds, not the whole ride-out: what was sent and not
  marked is delivered again once the claim's lease ends, never lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, Final, Protocol

import attrs

from fencekeeper.kernel.common import shown

from . import codec
from .operations.base import TransactionalOperationStore
from .operations.sql import SqlTx
from .store import RIDE_OUT_SECONDS, StoreError, StorePatience

if sys.platform != "win32":
    import fcntl

# --- what a sink receives --------------------------------------------------------------------------


@attrs.frozen
class ExportedMessage:
    """One outbox row as delivered: ``message_id`` is stable across every delivery of it."""

    message_id: str
    seq: int
    kind: str
    """``operation`` or ``execution``."""
    subject_id: str
    """The Operation or execution id: order is kept per subject."""
    tenant: str | None
    topic: str
    at: datetime
    payload: str
    """The JSON text the store wrote with the transition."""
    attempt: int
    """1 until a delivery of it fails, then one more after each recorded failure (``attempts`` + 1).

    A delivery again after an exporter was killed, or after its claim's
    lease ran out, carries the same number; a requeued message starts at 1
    again.  It tells a consumer nothing about duplicates: ``message_id`` does.
    """

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "seq": self.seq,
            "kind": self.kind,
            "subject_id": self.subject_id,
            "tenant": self.tenant,
            "topic": self.topic,
            "at": codec.encode_time(self.at),
            "attempt": self.attempt,
            "payload": json.loads(self.payload),
        }


class Sink(Protocol):
    """Where exported messages go.  Implement both methods to write your own.

    ``send`` delivers one message, or raises to say it was not delivered
    (the exporter retries it later; the message's text is its error).
    ``flush`` makes everything sent so far durable; the exporter marks a
    batch exported only after it returns.  Either may see a message again
    (at least once): deduplicate on ``message_id``.
    """

    def send(self, message: ExportedMessage) -> None: ...

    def flush(self) -> None: ...


class SinkError(Exception):
    """A delivery that failed, with the reason recorded on the row."""


class SinkClosed(Exception):
    """The sink can take nothing more (the reader of its pipe went away): the exporter stops.

    No message of the batch is failed or marked, since none can be delivered
    until the sink is opened again; their claims are released, and the next
    exporter delivers them (at least once).
    """


class JsonLinesSink:
    """One JSON document per line, to a file (appended, fsynced on flush) or a stream such as stdout.

    A regular file is written a batch at a time, so that a batch that fails
    leaves the file as it was before it: ``send`` keeps the batch's lines,
    and ``flush`` appends them under an exclusive lock of the file (where
    the platform has ``flock``), fsyncs, and on any failure (a disk that
    filled halfway through a line, a failed fsync) cuts the file back to
    where the batch began before it raises.  The exporter then counts the
    batch as failed and delivers it again, after the whole lines before it.
    A flush also cuts an unended last line before it appends, when it is a
    message cut short (what a writer killed mid-line, or a cut back that
    itself failed, leaves): it belongs to a batch never marked exported, so
    it is delivered again too.  Any other unended line is kept and ended
    (``_whole_lines_end``).  One
    file may be shared by several exporters; each cuts back only its own
    batch, since each appends under the lock.

    A stream (stdout, a pipe, a FIFO given as ``file:``) cannot be cut back:
    each line is written as it is sent, and a write that fails midway may
    leave part of a line in it, which its reader must skip.
    """

    def __init__(self, target: str | os.PathLike[str] | IO[str]) -> None:
        self.path: Path | None = None
        self._fd: int | None = None
        self._batch: list[bytes] = []
        if isinstance(target, (str, os.PathLike)):
            self.path = Path(target)
            try:
                if self.path.exists() and not stat.S_ISREG(self.path.stat().st_mode):
                    self._stream: IO[str] = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
                    return
                # Read as well as written: a flush reads the last bytes to find an unended line.
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
            except OSError as exc:
                raise StoreError("invalid_input", f"--sink: cannot open {self.path} to append: {exc.strerror}") from None
        else:
            self._stream = target

    def send(self, message: ExportedMessage) -> None:
        line = json.dumps(message.to_json(), sort_keys=True, separators=(",", ":")) + "\n"
        if self._fd is not None:
            self._batch.append(line.encode("utf-8"))
            return
        try:
            self._stream.write(line)
        except BrokenPipeError:
            raise SinkClosed("the sink's reader closed its end of the pipe") from None

    def flush(self) -> None:
        if self._fd is None:
            try:
                self._stream.flush()
            except BrokenPipeError:
                raise SinkClosed("the sink's reader closed its end of the pipe") from None
            return
        # Whatever happens, these lines are done with: on a failure the exporter sends them again.
        data, self._batch = b"".join(self._batch), []
        if not data:
            return
        fd = self._fd
        with _locked(fd):
            start = _whole_lines_end(fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException:
                # Cut back to where the batch began.  Should that fail too, the next flush cuts the unended line.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                    os.fsync(fd)
                raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        elif self.path is not None:
            self._stream.close()


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    """The file's exclusive lock, where the platform has ``flock``: batches of two exporters never interleave."""
    if sys.platform == "win32":
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _whole_lines_end(fd: int) -> int:
    """Where the next batch begins: after the last whole line, once an unended last line is dealt with.

    Only a line this sink's own kind of writer left half written is cut: a
    tail that starts as a message does (``{"``) and is not whole JSON.
    Anything else unended (a whole JSON document missing its newline, or
    text another program wrote to a file it was wrongly given) is kept and
    ended with a newline: a sink never deletes what it cannot tell is its
    own.
    """
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        begin = max(0, end - 65536)
        os.lseek(fd, begin, os.SEEK_SET)
        chunk = os.read(fd, end - begin)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            end = begin + newline + 1
            break
        end = begin
    if end == size:
        return size
    if size - end <= _MAX_LINE_CUT:
        os.lseek(fd, end, os.SEEK_SET)
        tail = os.read(fd, size - end)
        if tail.startswith(b'{"') and not _whole_json(tail):
            os.ftruncate(fd, end)
            return end
    os.write(fd, b"\n")
    return size + 1


_MAX_LINE_CUT = 16 * 1024 * 1024
"""The longest unended tail a sink cuts: longer than any message it writes, so anything longer is not its own."""


def _whole_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


class _RefuseRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx answer is the answer: followed, a POST would become a GET, its 2xx a delivery the receiver never had."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_RefuseRedirect)


def _http_url(spec: str) -> str | None:
    """``spec`` with its scheme in lower case when it is an http(s) URL, or None.

    A scheme is case-insensitive (RFC 3986, section 3.1): ``HTTP://host/``
    names what ``http://host/`` does, and is sent there.
    """
    for scheme in ("http://", "https://"):
        if spec[: len(scheme)].lower() == scheme:
            return scheme + spec[len(scheme) :]
    return None


def _url_problem(url: str) -> str | None:
    """Why no request can be sent to the http(s) ``url``, or None."""
    if any(character.isspace() or not character.isprintable() for character in url):
        return "contains a space or a control character (percent-encode it)"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - read for its check: a port that is no number, or out of range, raises
    except ValueError as exc:
        return f"is not a URL: {exc}"
    if not parts.hostname:
        return "names no host"
    return None


class WebhookSink:
    """An HTTP POST of each message's JSON; any 2xx answer is a delivery.

    The message id goes in the ``Idempotency-Key`` header too, so a receiver
    that already deduplicates requests deduplicates redeliveries.
    """

    def __init__(self, url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None) -> None:
        lowered = _http_url(url)
        if lowered is None:
            raise StoreError(
                "invalid_input", f"--sink: expected stdout, file:PATH or an http(s):// URL, got {shown(url)}"
            )
        url = lowered
        # Refused here, before a message is tried: taken, a URL no request can go to failed every delivery,
        # spending each message's attempts until all were parked.
        problem = _url_problem(url)
        if problem is not None:
            raise StoreError("invalid_input", f"--sink: {shown(url)} {problem}")
        if not 0 < timeout <= 600:
            raise StoreError("invalid_input", f"timeout: must be between 0 and 600 seconds, got {timeout}")
        self.url = url
        self.timeout = timeout
        self.headers = dict(headers or {})

    def send(self, message: ExportedMessage) -> None:
        body = json.dumps(message.to_json(), sort_keys=True).encode("utf-8")
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": message.message_id,
                **self.headers,
            },
        )
        try:
            with _NO_REDIRECTS.open(request, timeout=self.timeout) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            raise SinkError(f"HTTP {exc.code} from {self.url}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SinkError(f"POST {self.url} failed: {reason}") from None
        if not 200 <= status < 300:
            raise SinkError(f"HTTP {status} from {self.url}")

    def flush(self) -> None:
        """Each POST was answered: nothing is buffered."""


# --- the exporter ----------------------------------------------------------------------------------


@attrs.frozen
class ExportRetry:
    """When a failed message is tried again, and when it is parked instead."""

    initial_interval: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    maximum_interval: timedelta = timedelta(minutes=5)
    maximum_attempts: int = 10

    def __attrs_post_init__(self) -> None:
        if self.initial_interval <= timedelta(0):
            raise StoreError("invalid_input", "initial_interval: must be positive")
        if self.backoff_coefficient < 1:
            raise StoreError("invalid_input", "backoff_coefficient: must be at least 1")
        if self.maximum_interval < self.initial_interval:
            raise StoreError("invalid_input", "maximum_interval: must be at least initial_interval")
        if self.maximum_attempts < 1:
            raise StoreError("invalid_input", "maximum_attempts: must be at least 1")

    def delay(self, attempts: int) -> timedelta:
        """The wait after the ``attempts``-th failed delivery."""
        try:
            seconds = self.initial_interval.total_seconds() * self.backoff_coefficient ** max(0, attempts - 1)
        except OverflowError:  # past every float after enough failures: capped, as RetryPolicy.backoff caps it
            seconds = 10**9
        # Bounded before it becomes a timedelta, which overflows long before a float does (some 48 failures).
        return min(timedelta(seconds=min(seconds, 10**9)), self.maximum_interval)


@attrs.frozen
class ExportReport:
    """What one batch did."""

    claimed: int
    delivered: int
    failed: int
    parked: int
    held: int
    """Claimed but not sent: behind a failure of their own subject in this batch, or past the claim's lease."""


@attrs.frozen
class ParkedMessage:
    message_id: str
    seq: int
    kind: str
    subject_id: str
    topic: str
    at: datetime
    attempts: int
    last_error: str
    parked_at: datetime


@attrs.frozen
class OutboxStatus:
    """How far export is behind.  Parked rows are counted apart from the pending ones: they wait for an operator,
    not for the exporter, so they do not age the backlog (a row held behind a parked one of its subject does)."""

    pending: int
    """Not exported and not parked: what the exporter still has to deliver."""
    parked: int
    exported: int
    oldest_pending_at: datetime | None
    """When the oldest pending row's transition committed."""
    oldest_parked_at: datetime | None = None
    """When the oldest parked row's transition committed."""


_COLUMNS = "seq, message_id, kind, subject_id, tenant, topic, at, payload, attempts"

STOP_GRACE: Final = 5.0
"""Seconds a stopping exporter keeps trying to mark the batch it sent on a store that fails.

Without a stop it tries for ``RIDE_OUT_SECONDS`` (30 s), each try waiting up
to the PostgreSQL pool's 10 s for a connection: a Ctrl-C seemed to hang.
Stopping, it tries this long, each try waiting no longer than what is left
(PostgreSQL; a SQLite file held by another writer is waited for up to its
busy timeout), then stops.  Nothing is lost: what it sent and could not mark
stays claimed and is delivered again once the claim's lease ends, as after
a kill.  ``fencekeeper export`` waits at most this long, and one second
more, after its first signal."""


class OutboxExporter:
    """Claims outbox rows in order, delivers them to ``sink``, marks them exported (module header)."""

    def __init__(
        self,
        store: TransactionalOperationStore,
        sink: Sink,
        *,
        batch_size: int = 100,
        lease: timedelta = timedelta(seconds=60),
        retry: ExportRetry | None = None,
        exporter_id: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or not 1 <= batch_size <= 10_000:
            raise StoreError("invalid_input", f"batch_size: must be between 1 and 10000, got {batch_size!r}")
        if lease <= timedelta(0):
            raise StoreError("invalid_input", "lease: must be positive")
        self.store = store
        self.sink = sink
        self.batch_size = batch_size
        self.lease = lease
        self.retry = retry or ExportRetry()
        self.exporter_id = exporter_id or f"exporter-{os.getpid()}"
        self.log = log
        """Told when the store fails and is waited out, and when it answers again."""
        self._view_checked = False

    # -- one batch --------------------------------------------------------------------------------

    def export_batch(self, stop: threading.Event | None = None) -> ExportReport:
        """Claim, deliver, mark one batch.  Once ``stop`` is set, the send in progress ends it: the rest is released."""
        token = f"{self.exporter_id}/{uuid.uuid4().hex[:12]}"
        # Read before the claim, so it ends no later than the lease the claim writes: once it has, another
        # exporter may hold these subjects, and sending on would deliver beside it (two holders of a subject).
        lease_ends = time.monotonic() + self.lease.total_seconds()
        claimed = self._claim(token)
        if not claimed:
            return ExportReport(0, 0, 0, 0, 0)
        delivered: list[int] = []
        failed: list[tuple[ExportedMessage, str]] = []
        held: list[int] = []
        broken: set[tuple[str, str]] = set()
        for message in claimed:
            subject = (message.kind, message.subject_id)
            if subject in broken or time.monotonic() >= lease_ends or (stop is not None and stop.is_set()):
                held.append(message.seq)
                continue
            try:
                self.sink.send(message)
            except SinkClosed:
                self._release(token, claimed)
                raise
            except Exception as exc:  # the sink's failure is data: recorded on the row, retried later
                failed.append((message, _error_text(exc)))
                broken.add(subject)
                continue
            delivered.append(message.seq)
        try:
            self.sink.flush()
        except SinkClosed:
            self._release(token, claimed)
            raise
        except Exception as exc:
            reason = f"flush failed: {_error_text(exc)}"
            by_seq = {m.seq: m for m in claimed}
            failed += [(by_seq[seq], reason) for seq in delivered]
            delivered = []
        parked = self._mark_patiently(token, delivered, failed, held, stop)
        return ExportReport(len(claimed), len(delivered), len(failed), parked, len(held))

    def _mark_patiently(
        self,
        token: str,
        delivered: Sequence[int],
        failed: Sequence[tuple[ExportedMessage, str]],
        held: Sequence[int],
        stop: threading.Event | None = None,
    ) -> int:
        """``_mark``, made again while the store is waited out: the batch is out, and unmarked it would be sent again.

        Safe to repeat: each update is guarded by the claim's token, so one
        that committed although its answer was lost changes nothing the
        second time.  Once ``stop`` is set, for :data:`STOP_GRACE` seconds
        only, each try waiting for a connection no longer than what is left
        of them (where the store can bound it): then the StoreError is
        raised, and what was sent stays claimed, to be delivered again once
        the claim's lease ends.
        """
        patience = StorePatience()
        deadline: float | None = None
        while True:
            bound = None
            if stop is not None and stop.is_set():
                now = time.monotonic()
                deadline = now + STOP_GRACE if deadline is None else deadline
                bound = max(deadline - now, 0.1)
            try:
                parked = (
                    self._mark(token, delivered, failed, held)
                    if bound is None
                    else self._mark(token, delivered, failed, held, wait=bound)
                )
            except StoreError as exc:
                wait = patience.failed(exc.code)
                if wait is None:
                    raise
                if deadline is not None and time.monotonic() + min(wait, 0.5) >= deadline:
                    if self.log is not None:
                        self.log(
                            f"stopping with the store failing ({exc.message} [{exc.code}]): {len(delivered)} "
                            "message(s) sent and not marked exported are delivered again once the claim's lease ends"
                        )
                    raise
                self._told_failure(exc, first=patience.failures == 1)
                if deadline is not None:
                    time.sleep(min(wait, 0.5, max(deadline - time.monotonic(), 0.0)))
                elif stop is not None:
                    stop.wait(wait)  # a stop meanwhile starts the grace at once
                else:
                    time.sleep(wait)
                continue
            if patience.failures:
                self._told_back(patience)
            return parked

    def _told_failure(self, exc: StoreError, *, first: bool) -> None:
        if self.log is not None and first:
            self.log(
                f"the store failed: {exc.message} [{exc.code}]; trying again for up to {RIDE_OUT_SECONDS:g} s"
            )

    def _told_back(self, patience: StorePatience) -> None:
        # The other half of _told_failure's note: how long the store failed (from the first failure, the note's
        # moment) and how many requests, so that a log read later shows the outage's length.
        if self.log is not None:
            failures = patience.failures
            self.log(
                f"the store answers again after {patience.failing_for():.1f} s "
                f"({failures} request{'' if failures == 1 else 's'} failed); exporting"
            )

    def _claim(self, token: str) -> list[ExportedMessage]:
        with self.store._transaction() as tx:
            assert isinstance(tx, SqlTx)
            if not self._view_checked:
                tx.refuse_partial_view("the outbox exporter", "outbox")
                self._view_checked = True
            now = tx.d.encode_time(tx.now())
            rows = tx.run(
                f"SELECT {_COLUMNS} FROM outbox o WHERE exported_at IS NULL AND parked_at IS NULL "
                "AND (next_attempt_at IS NULL OR next_attempt_at <= ?) AND (claimed_until IS NULL OR claimed_until <= ?) "
                # A row behind one that is parked, backing off or held by another exporter waits with its subject:
                # left out here, so such rows never fill a batch and starve the others.
                "AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.kind = o.kind AND e.subject_id = o.subject_id "
                "AND e.seq < o.seq AND e.exported_at IS NULL AND (e.parked_at IS NOT NULL OR e.next_attempt_at > ? "
                "OR e.claimed_until > ?)) "
                f"ORDER BY seq LIMIT ?{tx.skip_locked()}",
                (now, now, now, now, self.batch_size),
            ).fetchall()
            if not rows:
                return []
            chosen = self._in_order(tx, rows)
            if not chosen:
                return []
            until = tx.d.encode_time(tx.d.decode_time(now) + self.lease)
            seqs = [int(r[0]) for r in chosen]
            tx.run(
                f"UPDATE outbox SET claimed_by = ?, claimed_until = ? WHERE seq IN ({', '.join('?' for _ in seqs)})",
                (token, until, *seqs),
            )
            return [
                ExportedMessage(
                    message_id=str(r[1]),
                    seq=int(r[0]),
                    kind=str(r[2]),
                    subject_id=str(r[3]),
                    tenant=None if r[4] is None else str(r[4]),
                    topic=str(r[5]),
                    at=tx.d.decode_time(r[6]),
                    payload=str(r[7]),
                    attempt=int(r[8]) + 1,
                )
                for r in chosen
            ]

    @staticmethod
    def _in_order(tx: SqlTx, rows: Sequence[Sequence[Any]]) -> list[Sequence[Any]]:
        """The candidates that begin their subject's undelivered rows, each subject's run up to its first gap.

        A gap is an undelivered row of the subject this claim did not get
        (another exporter's, or one skipped as locked): sending past it
        would overtake it.
        """
        subjects = sorted({(str(r[2]), str(r[3])) for r in rows})
        last = max(int(r[0]) for r in rows)
        pending: dict[tuple[str, str], list[int]] = {}
        for start in range(0, len(subjects), 200):
            part = subjects[start : start + 200]
            values = ", ".join("(?, ?)" for _ in part)
            for kind, subject_id, seq in tx.run(
                f"SELECT kind, subject_id, seq FROM outbox WHERE exported_at IS NULL AND seq <= ? "
                f"AND (kind, subject_id) IN (VALUES {values}) ORDER BY seq",
                (last, *[v for pair in part for v in pair]),
            ).fetchall():
                pending.setdefault((str(kind), str(subject_id)), []).append(int(seq))
        mine = {int(r[0]) for r in rows}
        allowed: set[int] = set()
        for seqs in pending.values():
            for seq in seqs:
                if seq not in mine:
                    break
                allowed.add(seq)
        return [r for r in rows if int(r[0]) in allowed]

    def _release(self, token: str, claimed: Sequence[ExportedMessage]) -> None:
        """Not the messages' failure: nothing could reach the sink.  Neither failed nor marked (SinkClosed)."""
        self._mark(token, [], [], [m.seq for m in claimed])

    def _mark(
        self,
        token: str,
        delivered: Sequence[int],
        failed: Sequence[tuple[ExportedMessage, str]],
        held: Sequence[int],
        *,
        wait: float | None = None,
    ) -> int:
        parked = 0
        with self._writing(wait) as tx:
            assert isinstance(tx, SqlTx)
            moment = tx.now()
            now = tx.d.encode_time(moment)
            for start in range(0, len(delivered), 500):
                part = delivered[start : start + 500]
                tx.run(
                    "UPDATE outbox SET exported_at = ?, claimed_by = NULL, claimed_until = NULL, last_error = NULL "
                    f"WHERE claimed_by = ? AND seq IN ({', '.join('?' for _ in part)})",
                    (now, token, *part),
                )
            for message, error in failed:
                attempts = message.attempt
                park = attempts >= self.retry.maximum_attempts
                changed = tx.run(
                    "UPDATE outbox SET attempts = ?, last_error = ?, next_attempt_at = ?, parked_at = ?, "
                    "claimed_by = NULL, claimed_until = NULL WHERE claimed_by = ? AND seq = ?",
                    (
                        attempts,
                        error[:2000],
                        tx.d.encode_time(moment + self.retry.delay(attempts)),
                        now if park else None,
                        token,
                        message.seq,
                    ),
                )
                parked += int(park and changed.rowcount == 1)
            for start in range(0, len(held), 500):
                part = held[start : start + 500]
                tx.run(
                    "UPDATE outbox SET claimed_by = NULL, claimed_until = NULL "
                    f"WHERE claimed_by = ? AND seq IN ({', '.join('?' for _ in part)})",
                    (token, *part),
                )
        return parked

    def _writing(self, wait: float | None) -> contextlib.AbstractContextManager[Any]:
        """The store's write transaction; waiting at most ``wait`` seconds for a connection where the store says how.

        The PostgreSQL store's pool otherwise waits its own 10 s for a
        connection while the server is away; a stopping exporter has less.
        """
        if wait is not None and getattr(self.store, "BOUNDS_CONNECTION_WAIT", False):
            opened: contextlib.AbstractContextManager[Any] = getattr(self.store, "_transaction")(wait=wait)  # noqa: B009
            return opened
        return self.store._transaction()

    # -- running ---------------------------------------------------------------------------------

    def run(
        self,
        *,
        until_idle: bool = False,
        poll_interval: float = 1.0,
        stop: threading.Event | None = None,
    ) -> ExportReport:
        """Export batch after batch; with ``until_idle``, return once a batch finds nothing to claim.

        Returns the totals.  ``stop`` ends the loop after the send in
        progress: what was sent is marked exported and the rest of the batch
        released for the next claim.  A sink that can take nothing more ends
        it by raising :class:`SinkClosed`.  A store that fails with a code it
        may recover from (``RETRYABLE_STORE_CODES``) is waited out for up to
        ``RIDE_OUT_SECONDS`` in a row, as a worker waits it out; still
        failing then, or failing otherwise, it raises the ``StoreError``.
        Once ``stop`` is set a failing store is tried for ``STOP_GRACE``
        seconds at most, then its ``StoreError`` is raised: what was sent and
        not marked is delivered again once the claim's lease ends.
        """
        totals = [0, 0, 0, 0, 0]
        stop = stop or threading.Event()
        patience = StorePatience()
        while not stop.is_set():
            try:
                report = self.export_batch(stop)
                waiting_only = report.claimed > 0 and report.delivered == 0 and until_idle and self._only_waiting()
            except StoreError as exc:
                # A lost connection (the pool replaces it), a row held past lock_timeout, a busy SQLite
                # file: a long-running exporter that exited here would leave its subjects to wait for a
                # restart.  What it had claimed and not marked stays claimed until its lease ends.
                # Stopping, it is not waited out (the marking had its STOP_GRACE): the caller learns
                # that the stop was not clean.
                if stop.is_set():
                    raise
                wait = patience.failed(exc.code)
                if wait is None:
                    raise
                self._told_failure(exc, first=patience.failures == 1)
                stop.wait(wait)
                continue
            if patience.failures:
                self._told_back(patience)
            patience.succeeded()
            for k, value in enumerate(attrs.astuple(report)):
                totals[k] += value
            if report.claimed == 0:
                if until_idle:
                    break
                stop.wait(poll_interval)
            elif waiting_only:
                break
        return ExportReport(*totals)

    def _only_waiting(self) -> bool:
        """True when every undelivered row is parked or backing off: nothing more to do now."""
        with self.store._transaction() as tx:
            assert isinstance(tx, SqlTx)
            now = tx.d.encode_time(tx.now())
            row = tx.run(
                "SELECT count(*) FROM outbox WHERE exported_at IS NULL AND parked_at IS NULL "
                "AND (next_attempt_at IS NULL OR next_attempt_at <= ?)",
                (now,),
            ).fetchone()
        return row is None or int(row[0]) == 0

    # -- operators ---------------------------------------------------------------------------------

    def parked(self, limit: int = 100) -> list[ParkedMessage]:
        return parked_messages(self.store, limit)

    def requeue(self, message_id: str) -> bool:
        return requeue(self.store, message_id)

    def discard(self, message_id: str) -> bool:
        return discard(self.store, message_id)


def _reading(store: TransactionalOperationStore) -> contextlib.AbstractContextManager[Any]:
    """A transaction that only reads, where the store has one: it waits for no writer's lock.

    The SQL stores read with a plain ``BEGIN`` (SQLite) or a ``READ ONLY``
    transaction (PostgreSQL); a report of the outbox must answer while a
    writer holds the SQLite file, and on a file opened only to read.
    """
    reading = getattr(store, "_reading", None)
    return reading() if callable(reading) else store._transaction()


def parked_messages(store: TransactionalOperationStore, limit: int = 100) -> list[ParkedMessage]:
    """Parked rows, oldest first, with their last error."""
    with _reading(store) as tx:
        assert isinstance(tx, SqlTx)
        tx.refuse_partial_view("listing parked outbox messages", "outbox")
        rows = tx.run(
            "SELECT message_id, seq, kind, subject_id, topic, at, attempts, last_error, parked_at FROM outbox "
            "WHERE parked_at IS NOT NULL AND exported_at IS NULL ORDER BY seq LIMIT ?",
            (limit,),
        ).fetchall()
        return [
            ParkedMessage(
                str(r[0]), int(r[1]), str(r[2]), str(r[3]), str(r[4]), tx.d.decode_time(r[5]), int(r[6]),
                str(r[7] or ""), tx.d.decode_time(r[8]),
            )
            for r in rows
        ]


def requeue(store: TransactionalOperationStore, message_id: str) -> bool:
    """Give a parked row a fresh set of attempts, now; False if no parked row has that id."""
    with store._transaction() as tx:
        assert isinstance(tx, SqlTx)
        tx.refuse_partial_view("requeueing an outbox message", "outbox")
        changed = tx.run(
            "UPDATE outbox SET parked_at = NULL, attempts = 0, next_attempt_at = NULL WHERE message_id = ? "
            "AND parked_at IS NOT NULL AND exported_at IS NULL",
            (message_id,),
        )
        return int(changed.rowcount) == 1


def discard(store: TransactionalOperationStore, message_id: str) -> bool:
    """Give up on a parked row: it counts as exported (its error stays) and its subject goes on."""
    with store._transaction() as tx:
        assert isinstance(tx, SqlTx)
        tx.refuse_partial_view("discarding an outbox message", "outbox")
        changed = tx.run(
            "UPDATE outbox SET exported_at = ?, last_error = 'discarded: ' || coalesce(last_error, '') "
            "WHERE message_id = ? AND parked_at IS NOT NULL AND exported_at IS NULL",
            (tx.d.encode_time(tx.now()), message_id),
        )
        return int(changed.rowcount) == 1


def outbox_status(store: TransactionalOperationStore) -> OutboxStatus:
    """How far export is behind: rows waiting, parked, exported, and the oldest waiting and oldest parked row's time."""
    with _reading(store) as tx:
        assert isinstance(tx, SqlTx)
        tx.refuse_partial_view("the outbox's status", "outbox")
        row = tx.run(
            "SELECT count(*) FILTER (WHERE exported_at IS NULL AND parked_at IS NULL), "
            "count(*) FILTER (WHERE exported_at IS NULL AND parked_at IS NOT NULL), "
            "count(*) FILTER (WHERE exported_at IS NOT NULL), "
            "min(at) FILTER (WHERE exported_at IS NULL AND parked_at IS NULL), "
            "min(at) FILTER (WHERE exported_at IS NULL AND parked_at IS NOT NULL) FROM outbox",
            (),
        ).fetchone()
        assert row is not None
        return OutboxStatus(
            int(row[0]),
            int(row[1]),
            int(row[2]),
            None if row[3] is None else tx.d.decode_time(row[3]),
            None if row[4] is None else tx.d.decode_time(row[4]),
        )


def _error_text(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    # Stored on the row, so it must be text both stores take: a lone surrogate (a path or an answer decoded
    # with surrogateescape) is no UTF-8, and PostgreSQL's text holds no NUL.  Either failed the marking
    # transaction itself: the exporter stopped, the row stayed claimed, and every later claim of it
    # stopped the exporter again, so the message was never parked and its subject never went on.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if isinstance(exc, SinkError) else f"{type(exc).__name__}: {text}"


def sink_file(spec: str) -> str | None:
    """The path of a ``file:PATH`` sink spec (empty when none follows the prefix), or None for another sink.

    The prefix is read in any case, as a URL scheme is (:func:`_http_url`,
    RFC 3986, section 3.1): ``FILE:/tmp/x`` is the file ``/tmp/x``, as
    ``HTTPS://host/`` is a webhook.  The path keeps its case.  Every reader of
    the spec asks here, so that the check that refuses the database itself
    as a sink cannot read a spec otherwise than the sink that opens it.
    """
    prefix = "file:"
    return spec[len(prefix) :] if spec[: len(prefix)].lower() == prefix else None


def check_sink(spec: str, *, timeout: float = 10.0) -> None:
    """Refuse a malformed sink spec (``invalid_input``) without opening anything."""
    if spec in ("stdout", "-"):
        return
    named = sink_file(spec)
    if named is not None:
        if not named:
            raise StoreError("invalid_input", "--sink: file: needs a path (file:PATH)")
        path = Path(named)
        if not path.parent.is_dir():
            raise StoreError("invalid_input", f"--sink: directory {path.parent} does not exist")
        return
    WebhookSink(spec, timeout=timeout)


def open_sink(spec: str, *, timeout: float = 10.0) -> Sink:
    """``stdout``, ``file:PATH`` or an ``http(s)://`` URL, as ``fencekeeper export --sink`` takes them."""
    if spec in ("stdout", "-"):
        return JsonLinesSink(sys.stdout)
    path = sink_file(spec)
    if path is not None:
        if not path:
            raise StoreError("invalid_input", "--sink: file: needs a path (file:PATH)")
        return JsonLinesSink(path)
    if _http_url(spec) is not None:
        return WebhookSink(spec, timeout=timeout)
    raise StoreError("invalid_input", f"--sink: expected stdout, file:PATH or an http(s):// URL, got {shown(spec)}")


__all__ = [
    "STOP_GRACE",
    "ExportReport",
    "ExportRetry",
    "ExportedMessage",
    "JsonLinesSink",
    "OutboxExporter",
    "OutboxStatus",
    "ParkedMessage",
    "Sink",
    "SinkClosed",
    "SinkError",
    "WebhookSink",
    "check_sink",
    "discard",
    "open_sink",
    "outbox_status",
    "parked_messages",
    "requeue",
    "sink_file",
]
