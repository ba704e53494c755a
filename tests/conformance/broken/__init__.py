"""Stores broken on purpose, one realistic bug each: the suite must catch every one.

``VARIANTS`` maps a variant's name to its maker, ``make(clock, directory)``:
it returns a fresh, empty store reading ``clock``; a file-backed variant
keeps its database in ``directory`` (a new file per call).  The first line
of each maker's docstring says what is broken (``DESCRIPTIONS``), and
``GROUPS`` says which kind of gap in a suite the bug would slip through:

- ``concurrency``: a guard checked when the rows are read, not when they
  are written, or a SQLite write lock taken too late; caught only by two
  requests at once;
- ``port``: parts of the port the request-by-request tests barely reach
  (due-timer scoping and order, Event lookup, evidence revisions and
  identities, the sweep's recovery);
- ``time``: times kept or compared in whole seconds or milliseconds;
- ``stateful``: bugs that only a sequence of requests shows.

``CORRECT`` holds stores that must pass: the reference stores, and one that
words its history in its own way (the suite compares codes, not text).
tests/conformance/test_broken_stores.py runs the suite against each;
another runner may drive the same makers through another protocol.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock, Store

from . import memory, sqlite

Maker = Callable[[ManualClock, Path], Store]

_files = itertools.count(1)


def _in_memory(cls: type[MemoryStore]) -> Maker:
    def make(clock: ManualClock, directory: Path) -> Store:
        return cls(clock)

    make.__doc__ = cls.__doc__
    make.__name__ = cls.__name__
    return make


def _in_file(cls: type[SQLiteStore]) -> Maker:
    def make(clock: ManualClock, directory: Path) -> Store:
        return cls(directory / f"store-{next(_files)}.db", clock=clock)

    make.__doc__ = cls.__doc__
    make.__name__ = cls.__name__
    return make


_VARIANTS: tuple[tuple[str, str, Maker], ...] = (
    ("claim-guard-at-read", "concurrency", _in_memory(memory.ClaimGuardAtRead)),
    ("claim-candidate-before-lock", "concurrency", _in_memory(memory.ClaimCandidateBeforeLock)),
    ("step-guard-at-read", "concurrency", _in_memory(memory.StepGuardAtRead)),
    ("finalize-guard-at-read", "concurrency", _in_memory(memory.FinalizeGuardAtRead)),
    ("wake-guard-at-read", "concurrency", _in_memory(memory.WakeGuardAtRead)),
    ("cancel-guard-at-read", "concurrency", _in_memory(memory.CancelGuardAtRead)),
    ("sqlite-deferred-begin", "concurrency", _in_file(sqlite.DeferredBegin)),
    ("due-timers-ignore-business", "port", _in_memory(memory.DueTimersIgnoreBusiness)),
    ("due-timers-by-execution-id", "port", _in_memory(memory.DueTimersByExecutionId)),
    ("due-timers-limit-before-order", "port", _in_memory(memory.DueTimersLimitBeforeOrder)),
    ("event-lookup-any-business", "port", _in_memory(memory.EventLookupAnyBusiness)),
    ("event-lookup-newest-first", "port", _in_memory(memory.EventLookupNewestFirst)),
    ("evidence-revision-unchecked-past-second", "port", _in_memory(memory.EvidenceRevisionUncheckedPastSecond)),
    ("evidence-kind-may-change", "port", _in_memory(memory.EvidenceKindMayChange)),
    ("evidence-id-may-name-an-execution", "port", _in_memory(memory.EvidenceIdMayNameAnExecution)),
    ("execution-id-may-name-evidence", "port", _in_memory(memory.ExecutionIdMayNameEvidence)),
    ("evidence-listed-by-id", "port", _in_memory(memory.EvidenceListedById)),
    ("quarantine-without-replay", "port", _in_memory(memory.QuarantineWithoutReplay)),
    ("recovery-replay-only-latest", "port", _in_memory(memory.RecoveryReplayOnlyLatest)),
    ("sqlite-times-in-whole-seconds", "time", _in_file(sqlite.TimesInWholeSeconds)),
    ("sqlite-times-in-milliseconds", "time", _in_file(sqlite.TimesInMilliseconds)),
    ("expiry-in-whole-seconds", "time", _in_memory(memory.ExpiryInWholeSeconds)),
    ("due-in-whole-seconds", "time", _in_memory(memory.DueInWholeSeconds)),
    ("claimable-in-whole-seconds", "time", _in_memory(memory.ClaimableInWholeSeconds)),
    ("history-by-time", "stateful", _in_memory(memory.HistoryByTime)),
    ("state-list-stale-after-timer", "stateful", _in_memory(memory.StateListStaleAfterTimer)),
    ("expiry-index-stale-after-renew", "stateful", _in_memory(memory.ExpiryIndexStaleAfterRenew)),
)

VARIANTS: dict[str, Maker] = {name: make for name, _, make in _VARIANTS}
"""Every broken store, by name."""
GROUPS: dict[str, str] = {name: group for name, group, _ in _VARIANTS}
"""Which kind of gap each variant's bug would slip through."""


def _memory(clock: ManualClock, directory: Path) -> Store:
    """The in-memory reference store."""
    return MemoryStore(clock)


def _sqlite(clock: ManualClock, directory: Path) -> Store:
    """The SQLite store."""
    return SQLiteStore(directory / f"store-{next(_files)}.db", clock=clock)


CORRECT: dict[str, Maker] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "memory-reworded-history": _in_memory(memory.RewordedHistory),
}
"""Stores that must pass."""


def _first_line(make: Maker) -> str:
    return (make.__doc__ or "").strip().splitlines()[0]


DESCRIPTIONS: dict[str, str] = {name: _first_line(make) for name, make in {**VARIANTS, **CORRECT}.items()}
"""One line each: what is broken (or, for CORRECT, what the store is)."""

__all__ = ["CORRECT", "DESCRIPTIONS", "GROUPS", "VARIANTS", "Maker"]
