"""Durable-operation workers in background threads of one process: the loop ``fencekeeper op worker`` runs.

Seed 001 (Claims, leases, and fencing; Durable truth and recovery).  Rules of
this module:

- One thread per :class:`DurableOperationWorker`, each calling ``run_once``
  until it is stopped.  Each report goes to ``reports`` and to ``on_report``,
  in the worker's thread.
- A store failure that may pass (``StorePatience``: a lost connection, a row
  held past ``lock_timeout``, a busy SQLite file) is waited out with a
  backoff, and the worker asks again, for up to ``RIDE_OUT_SECONDS`` of
  failures in a row.  Any other error, or a store failing for longer, stops
  every worker of the pool and is listed in ``errors``: a pool that went on
  with fewer workers would hide from a supervisor what it should restart.
- Idle workers wait ``poll`` seconds, or until woken: by :meth:`poke`, by a
  stop, and on PostgreSQL by the store's notification of an Operation that
  became due at once (one listening thread; a notification is a hint, the
  poll still finds everything).
- Stopping never abandons an attempt the worker is in: each worker stops
  after its current ``run_once``.  One that holds an attempt whose store
  answer was lost (``holds_unfinished``) gives the store a few seconds more
  to answer (``take_up_before_stop``), so that an action that already ran is
  recorded under its lease instead of being left to expire; it claims
  nothing new there.  A worker stopped by an error takes nothing up.
- With ``until_idle``, a worker ends when a pass finds nothing due.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from types import TracebackType

from ..store import StoreError, StorePatience
from .service import DurableOperationError
from .worker import DurableOperationWorker, WorkReport

__all__ = ["LISTEN_WAIT", "MAX_POLL", "OperationWorkerPool"]

MAX_POLL = 86_400.0
"""The longest ``poll``, in seconds: a day, the bound of ``fencekeeper op worker --poll``."""

LISTEN_WAIT = 1.0
"""The listening thread waits at most this long at a time, so that it notices a stop promptly."""


class OperationWorkerPool:
    """Durable-operation workers running in background threads of this process.

    ``reports`` lists every report so far, ``errors`` what stopped the pool
    (each stops every worker).  Start it with :meth:`start` or by entering it
    as a context manager, whose exit stops it.  ``on_store_failed`` is called
    when a request's store failure is waited out, and
    ``on_store_answered(failures)`` after each request that went through,
    with the failures of that worker's run before it (0 when none): the
    command line says an outage and its end with them.
    """

    def __init__(
        self,
        workers: Sequence[DurableOperationWorker],
        *,
        poll: float = 1.0,
        until_idle: bool = False,
        on_report: Callable[[DurableOperationWorker, WorkReport], None] | None = None,
        on_store_failed: Callable[[], None] | None = None,
        on_store_answered: Callable[[int], None] | None = None,
    ) -> None:
        if not workers or not all(isinstance(w, DurableOperationWorker) for w in workers):
            raise DurableOperationError("invalid_request", "workers: at least one DurableOperationWorker", "workers")
        if isinstance(poll, bool) or not isinstance(poll, int | float) or not (0 < poll <= MAX_POLL):
            # nan compares false: refused too.
            raise DurableOperationError(
                "invalid_request", f"poll: must be a positive number of seconds, at most {MAX_POLL:g}, got {poll!r}", "poll"
            )
        self.workers = list(workers)
        self.poll = float(poll)
        self.until_idle = until_idle
        self.reports: list[WorkReport] = []
        self.errors: list[str] = []
        self._on_report = on_report
        self._on_store_failed = on_store_failed
        self._on_store_answered = on_store_answered
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._work = threading.Condition()
        self._started = False
        self._threads = [
            threading.Thread(target=self._loop, args=(w,), name=w.worker_id, daemon=True) for w in self.workers
        ]
        stores = {id(w.store): w.store for w in self.workers}
        self._listeners = [
            threading.Thread(target=self._listen, args=(wait,), name="listen", daemon=True)
            for store in stores.values()
            if callable(wait := getattr(store, "wait_for_work", None))
        ]

    # --- running --------------------------------------------------------------------------

    def start(self) -> OperationWorkerPool:
        """Start every worker thread (and, unless ``until_idle``, the listening one); once only."""
        with self._lock:
            if self._started:
                raise DurableOperationError("invalid_request", "this pool has been started already", "pool")
            self._started = True
        if not self.until_idle:
            for thread in self._listeners:
                thread.start()
        for thread in self._threads:
            thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether any worker thread is still running."""
        return any(t.is_alive() for t in self._threads)

    @property
    def stopping(self) -> bool:
        """Whether the pool was asked to stop (:meth:`request_stop`, :meth:`stop`, or an error that stopped it)."""
        return self._stop.is_set()

    def poke(self) -> None:
        """Wake idle workers now: an Operation may have become due."""
        with self._work:
            self._work.notify_all()

    def request_stop(self) -> None:
        """Ask every worker to stop after its current attempt, without waiting (safe in a signal handler)."""
        self._stop.set()
        self.poke()

    def wait_for_stop(self, seconds: float) -> bool:
        """Block for up to ``seconds``, or until a stop is asked; whether one was."""
        return self._stop.wait(seconds)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every worker thread to end (``timeout`` seconds in all, at most); whether they all did."""
        for thread in self._threads:
            # A worker's own callback may stop the pool: it cannot wait for itself.
            if thread is not threading.current_thread() and thread.is_alive():
                thread.join(timeout)
        return not self.running

    def stop(self, timeout: float | None = 30.0) -> bool:
        """:meth:`request_stop`, then :meth:`join`; whether every worker ended within ``timeout``."""
        self.request_stop()
        return self.join(timeout)

    def __enter__(self) -> OperationWorkerPool:
        if not self._started:
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # --- the threads ----------------------------------------------------------------------

    def _idle(self, seconds: float) -> None:
        with self._work:
            if not self._stop.is_set():
                self._work.wait(timeout=seconds)

    def _listen(self, wait_for_work: Callable[[float], bool]) -> None:
        wait = min(self.poll, LISTEN_WAIT)
        while not self._stop.is_set():
            try:
                if wait_for_work(wait):
                    self.poke()
            except Exception:
                # A lost listening connection is opened again by the next wait; meanwhile the workers poll.
                self._stop.wait(wait)

    def _failed(self, worker: DurableOperationWorker, said: str) -> None:
        with self._lock:
            self.errors.append(f"{worker.worker_id}: {' '.join(said.split())}")
        self.request_stop()

    def _told(self, worker: DurableOperationWorker, report: WorkReport) -> bool:
        """Keep ``report`` and pass it on; False when ``on_report`` raised, which stops the pool."""
        with self._lock:
            self.reports.append(report)
        if self._on_report is None:
            return True
        try:
            self._on_report(worker, report)
        except Exception as exc:
            self._failed(worker, f"on_report: {type(exc).__name__}: {exc}")
            return False
        return True

    def _loop(self, worker: DurableOperationWorker) -> None:
        patience = StorePatience()
        while not self._stop.is_set():
            try:
                report = worker.run_once()
            except StoreError as exc:
                wait = patience.failed(exc.code)
                if wait is None:
                    self._failed(worker, f"{exc.message} [{exc.code}]")
                    return
                if self._on_store_failed is not None:
                    self._on_store_failed()
                self._idle(wait)
                continue
            except Exception as exc:
                self._failed(worker, f"{type(exc).__name__}: {exc}")
                return
            if self._on_store_answered is not None:
                self._on_store_answered(patience.failures)
            patience.succeeded()
            if report is None:
                if self.until_idle:
                    return
                self._idle(self.poll)
                continue
            if not self._told(worker, report):
                return
        if worker.holds_unfinished():
            try:
                taken = worker.take_up_before_stop()
            except Exception as exc:
                self._failed(worker, f"{type(exc).__name__}: {exc}")
                return
            if taken is not None:
                self._told(worker, taken)
