"""The store port: what every store offers, and the one loop that applies kernel decisions.

Rules of this module:

- A store decides nothing.  For every request it opens one transaction,
  reads the authoritative time once, loads the snapshots the kernel needs,
  asks the kernel (``fencekeeper.kernel.protocol``) for an outcome and, if
  the outcome is a :class:`~fencekeeper.kernel.protocol.Decision`, writes
  everything it lists under its guard, all of it or nothing.
- A guard that does not hold rolls the whole transaction back.  The store
  then decides once more on the rows as they now are, so the caller gets the
  kernel's precise refusal rather than a generic conflict.
- Refusals and ``Unchanged`` outcomes write nothing; a refused request
  leaves the store exactly as it was.
- Evidence (step attempts, outcomes, command links) is committed in the
  same transaction as the decision it belongs to: seed 000 allows a separate
  transaction, every store here provides the stronger boundary.
- Concrete stores implement :class:`Backend` (what one transaction can read
  and write) and :meth:`TransactionalStore._transaction`; everything else is
  shared, so the in-memory reference store and the database stores differ
  only in how rows are kept.
"""

from __future__ import annotations

import abc
import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import attrs

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState


class StoreError(Exception):
    """A store cannot do what was asked (a broken file, a schema it does not know, a failed write).

    ``code`` is stable: ``store_unavailable``, ``schema_too_new``,
    ``schema_altered``, ``schema_missing``, ``schema_outdated``, ``not_a_database``, ``read_only``,
    ``guard_conflict``, ``evidence_conflict``, ``registration_conflict``.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def registration_conflict(key: p.WaitKey) -> StoreError:
    """A wait registration key used twice: each visit must register under its own attempt identity."""
    return StoreError(
        "registration_conflict",
        f"wait registration ({key.execution_id}, {key.node_id}, {key.attempt_id}) already exists; "
        "a registration is unique per execution, node and attempt and is never reopened",
    )


# --- time -------------------------------------------------------------------------


class Clock(Protocol):
    """The authoritative time of a store: read once per transaction, always aware UTC."""

    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock tests move by hand; thread-safe so concurrent tests can share it."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = moment


# --- values -----------------------------------------------------------------------


@attrs.frozen
class Evidence:
    """A generic evidence object committed with a decision (seed 000: generic object/revision model).

    ``object_id`` is its stable identity; ``kind`` its type (``step_attempt``,
    ``outcome``, ``command``, ...); ``body`` any JSON-serializable mapping.
    """

    object_id: str
    kind: str
    body: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)

    def body_json(self) -> str:
        return json.dumps(self.body, sort_keys=True, separators=(",", ":"), default=str)


@attrs.frozen
class ExecutionView:
    """An execution with its whole history, oldest first (what ``fencekeeper inspect`` shows)."""

    execution: p.Execution
    dispatch: p.Dispatch
    revisions: tuple[p.Execution, ...]
    history: tuple[p.TransitionRecord, ...]
    registrations: tuple[p.WaitRegistration, ...]
    recoveries: tuple[p.RecoveryRecord, ...]
    evidence: tuple[Evidence, ...]


# --- the port -----------------------------------------------------------------------


class Store(Protocol):
    """What every store offers.  Every method is one transaction; every outcome is the kernel's."""

    clock: Clock

    def admit(self, request: p.AdmitRequest) -> p.Outcome: ...

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> p.Outcome | None:
        """Claim the first eligible execution (eligible_at, then id); None when there is none."""
        ...

    def renew(self, execution_id: str, request: p.RenewRequest) -> p.Outcome: ...

    def record_step(
        self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()
    ) -> p.Outcome: ...

    def release(self, execution_id: str, request: p.ReleaseRequest) -> p.Outcome: ...

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome: ...

    def append_evidence(
        self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]
    ) -> p.Outcome: ...

    def wake(self, request: p.WakeRequest) -> p.Outcome: ...

    def cancel(self, request: p.CancelRequest) -> p.Outcome: ...

    def recover(self, request: p.RecoveryRequest) -> p.Outcome:
        """quarantine_expired, fail, resume_safe and reconcile_command."""
        ...

    def expired(self) -> list[str]:
        """Ids of running executions whose lease has expired now: what quarantine would take."""
        ...

    def read(self, execution_id: str) -> ExecutionView | None: ...

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]: ...

    def close(self) -> None: ...


class Backend(abc.ABC):
    """What one transaction of a concrete store can read and write."""

    def lock(self, execution_id: str) -> None:  # noqa: B027 - a hook; most stores lock the whole file
        """Take the row locks a decision on ``execution_id`` needs, before the time is read.

        Reading the time after the locks are held means that waiting for a
        lock can never make a lease look younger than it is.
        """

    def now(self, clock: Clock) -> datetime:
        """The authoritative time of this transaction; by default the store's clock."""
        return clock.now()

    @abc.abstractmethod
    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]: ...

    @abc.abstractmethod
    def object_exists(self, object_id: str) -> bool:
        """Whether any generic object (an execution, an evidence object, ...) has this identity."""

    @abc.abstractmethod
    def load_registration(self, key: p.WaitKey) -> p.WaitRegistration | None: ...

    @abc.abstractmethod
    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None: ...

    @abc.abstractmethod
    def next_eligible(self, now: datetime, business_id: str | None) -> str | None:
        """The first eligible execution due at ``now``: eligible_at ASC, workflow_execution_id ASC."""

    @abc.abstractmethod
    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        """Write everything ``decision`` lists under its guard; False (having written nothing) if it fails."""


class _GuardFailed(Exception):
    """Internal: unwinds a transaction whose guard did not hold, so that it rolls back."""


Decide = Callable[[Backend, datetime], p.Outcome | None]


class TransactionalStore(abc.ABC):
    """The shared half of every store: one transaction per request, the kernel decides."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Backend]:
        """A write transaction: commits on normal exit, rolls back on any exception."""

    def _run(
        self, decide: Decide, evidence: Sequence[Evidence] = (), lock: str | None = None
    ) -> p.Outcome | None:
        for _ in range(2):
            try:
                with self._transaction() as tx:
                    if lock is not None:
                        tx.lock(lock)
                    now = tx.now(self.clock)
                    outcome = decide(tx, now)
                    if isinstance(outcome, p.Decision) and not tx.write(outcome, evidence, now):
                        raise _GuardFailed
                    return outcome
            except _GuardFailed:
                continue
        # Two guard failures inside write-locked transactions mean something
        # outside the store changes rows: refuse to guess.
        raise StoreError("guard_conflict", "the rows changed under a write-locked transaction twice")

    def _one(self, decide: Decide, evidence: Sequence[Evidence] = (), lock: str | None = None) -> p.Outcome:
        outcome = self._run(decide, evidence, lock)
        assert outcome is not None
        return outcome

    def admit(self, request: p.AdmitRequest) -> p.Outcome:
        def decide(tx: Backend, now: datetime) -> p.Outcome:
            existing = tx.load(request.execution_id)[0]
            taken = existing is None and tx.object_exists(request.execution_id)
            return p.admit(existing, request, now, id_taken=taken)

        return self._one(decide)

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> p.Outcome | None:
        def decide(tx: Backend, now: datetime) -> p.Outcome | None:
            execution_id = tx.next_eligible(now, business_id)
            if execution_id is None:
                return None
            return p.claim(*tx.load(execution_id), request, now)

        return self._run(decide)

    def renew(self, execution_id: str, request: p.RenewRequest) -> p.Outcome:
        return self._one(lambda tx, now: p.renew(*tx.load(execution_id), request, now), lock=execution_id)

    def record_step(
        self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()
    ) -> p.Outcome:
        return self._one(
            lambda tx, now: p.record_step(*tx.load(execution_id), request, now), evidence, lock=execution_id
        )

    def release(self, execution_id: str, request: p.ReleaseRequest) -> p.Outcome:
        return self._one(lambda tx, now: p.release(*tx.load(execution_id), request, now), lock=execution_id)

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        return self._one(
            lambda tx, now: p.finalize(*tx.load(request.execution_id), request, now),
            evidence,
            lock=request.execution_id,
        )

    def append_evidence(
        self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]
    ) -> p.Outcome:
        return self._one(
            lambda tx, now: p.fenced(*tx.load(execution_id), credential, now), evidence, lock=execution_id
        )

    def wake(self, request: p.WakeRequest) -> p.Outcome:
        def decide(tx: Backend, now: datetime) -> p.Outcome:
            execution, dispatch = tx.load(request.key.execution_id)
            return p.wake(execution, dispatch, tx.load_registration(request.key), request, now)

        return self._one(decide, lock=request.key.execution_id)

    def cancel(self, request: p.CancelRequest) -> p.Outcome:
        return self._one(
            lambda tx, now: p.cancel(*tx.load(request.execution_id), request, now), lock=request.execution_id
        )

    def recover(self, request: p.RecoveryRequest) -> p.Outcome:
        def decide(tx: Backend, now: datetime) -> p.Outcome:
            execution, dispatch = tx.load(request.execution_id)
            return p.recover(execution, dispatch, tx.load_recovery(request.command_id), request, now)

        return self._one(decide, lock=request.execution_id)
