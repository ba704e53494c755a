"""Two requests at once: the suite's tests of guards that must hold at commit time, not only when read.

A serial test cannot tell a store that enforces the kernel's guard when it
commits from one that only checks it when it reads: the rows never change
in between.  These tests make them change.  Rules of this module:

- :class:`RendezvousClock` is a :class:`~fencekeeper.adapters.store.ManualClock`
  that, while a race is armed, holds each racing thread at its first clock
  reading until the other racer reads it too, or until ``hold`` seconds
  pass.  A store reads its authoritative time once per transaction, after
  it has begun it and before it commits, so two transactions that are
  *not* serialized are held there together: both read the same rows, both
  decide, and only a guard checked at commit stops the second write.  A
  store that serializes its transactions (a lock taken before the time is
  read: ``BEGIN IMMEDIATE``, ``SELECT ... FOR UPDATE``, a mutex) never lets
  the second racer reach the clock while the first holds it; the first
  then goes on alone after ``hold`` seconds, which costs that much time and
  proves nothing wrong.
- :func:`race` runs two calls in two threads, each on its own session of
  the same store (``store_session``: another connection to the same
  database; for a store that is one object in memory, the object itself),
  and returns what each returned or raised.  A store error, a crash or a
  hang of either racer fails the test: contention must end in the kernel's
  precise outcome, never in an exception.
- What the tests assert is linearizability, in the kernel's terms: exactly
  one racer's request is applied; the other's outcome is the one the
  kernel gives for its request on the rows the winner left (so its exact
  refusal code, never a generic conflict); and the store shows exactly one
  new transition, one set of evidence, and the winner's lease or wake.

Sources: seed 000, sections Lease (one holder), Fenced Execution
Finalization (the guard is checked by the write), wait_for_event (the first
committed wake wins) and Cancellation.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import attrs

from fencekeeper.adapters.store import ManualClock, Store

HOLD_SECONDS = float(os.environ.get("FENCEKEEPER_SUITE_HOLD", "0.25"))
"""How long a racer waits at the clock for the other (FENCEKEEPER_SUITE_HOLD overrides it).

A serializing store pays it once per race, so it is kept short; it only has
to be longer than it takes the second thread to start and begin its
transaction (a few milliseconds)."""

RACE_TIMEOUT = 60.0
"""Seconds after which a racer that has not returned is a hang, and the test fails."""


class RendezvousClock(ManualClock):
    """A ManualClock that can hold two racing threads together at their first reading of the time.

    Outside :meth:`rendezvous` it is exactly a ManualClock.  Inside it, each
    registered racer's first ``now()`` waits, at most ``hold`` seconds, for
    the other racer's first ``now()``; any other reading (a second one, the
    test's own thread) never waits.
    """

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        super().__init__(start)
        self._barrier: threading.Barrier | None = None
        self._racers: set[int] = set()
        self._guard = threading.Lock()
        self.met = False
        """Whether the last race held both racers at the clock together (the store did not serialize them)."""

    @contextlib.contextmanager
    def rendezvous(self, hold: float = HOLD_SECONDS) -> Iterator[None]:
        """Arm the clock for one race; racers register with :meth:`join`."""
        with self._guard:
            self._barrier = threading.Barrier(2, timeout=hold)
            self._racers = set()
            self.met = False
        try:
            yield
        finally:
            with self._guard:
                self._barrier = None
                self._racers = set()

    def join(self) -> None:
        """Register the calling thread as a racer of the armed race."""
        with self._guard:
            self._racers.add(threading.get_ident())

    def now(self) -> datetime:
        with self._guard:
            barrier = self._barrier
            me = threading.get_ident()
            waits = barrier is not None and me in self._racers
            if waits:
                self._racers.discard(me)  # only the first reading waits
        if waits:
            assert barrier is not None
            try:
                barrier.wait()
                self.met = True
            except threading.BrokenBarrierError:
                pass  # the other racer is held elsewhere (a lock): this one goes on alone
        return super().now()


@attrs.frozen
class Raced:
    """What one racer got: its outcome, or the exception it raised."""

    outcome: Any = None
    error: BaseException | None = None

    def value(self) -> Any:
        """The outcome; a racer that raised fails the test with its exception."""
        if self.error is not None:
            raise AssertionError(
                f"a racer raised {type(self.error).__name__}: {self.error}; two concurrent requests must each "
                "end in the kernel's outcome (a decision, a refusal, nothing to claim), never in an error"
            ) from self.error
        return self.outcome


def race(clock: ManualClock, first: Callable[[], Any], second: Callable[[], Any], hold: float = HOLD_SECONDS) -> tuple[Raced, Raced]:
    """Run ``first`` and ``second`` in two threads, held together at the clock when the store lets them."""
    if not isinstance(clock, RendezvousClock):
        raise TypeError(
            "the concurrency tests need the store to read a RendezvousClock: the store_factory must give the "
            "store the clock it is passed"
        )
    results: list[Raced] = [Raced(), Raced()]
    start = threading.Barrier(2)

    def run(index: int, call: Callable[[], Any]) -> None:
        clock.join()
        start.wait()
        try:
            results[index] = Raced(outcome=call())
        except BaseException as exc:  # reported by Raced.value, in the test's own thread
            results[index] = Raced(error=exc)

    with clock.rendezvous(hold):
        threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate((first, second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(RACE_TIMEOUT)
        hung = [i for i, thread in enumerate(threads) if thread.is_alive()]
        assert not hung, f"racer {hung} did not return within {RACE_TIMEOUT:g} s: the store deadlocked"
    return results[0], results[1]


SessionOpener = Callable[[Store, ManualClock], Store]
"""Opens another session (connection) on the database of a store, reading the same clock."""


def same_session(store: Store, clock: ManualClock) -> Store:
    """The default session opener: a store that lives in one object is its own second session."""
    return store


def reopen(store: Store, clock: ManualClock) -> Store:
    """A second session for the stores shipped here: a new connection to the same file or schema.

    A SQLite store shares one connection between threads behind a mutex, so
    two threads of one object never overlap; a PostgreSQL store's pool may
    hand both the same connection.  Only a second connection shows whether
    the database itself serializes the two transactions.  Other stores are
    their own second session (:func:`same_session`).
    """
    # Imported here: a third-party store's suite run need not load the shipped stores' drivers.
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415
    from fencekeeper.adapters.sqlite_store import SQLiteStore  # noqa: PLC0415

    if isinstance(store, SQLiteStore):
        return type(store)(store.path, clock=clock)
    if isinstance(store, PostgresStore):
        return type(store)(store.dsn, schema=store.schema, clock=clock, pool_size=1)
    return store


__all__ = [
    "HOLD_SECONDS",
    "RACE_TIMEOUT",
    "Raced",
    "RendezvousClock",
    "SessionOpener",
    "race",
    "reopen",
    "same_session",
]
