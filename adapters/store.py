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
- A composed transaction (``claim_and_visit``, ``record_step_and_visit``;
  specs/protocol.md, "Composed decisions") carries a claim or a step, the
  visits after it that call no handler, and at most one Command's intent,
  last: each is the kernel's decision on the rows as the one before it
  left them, written under its own guard, and all of them commit together
  or not at all.  No handler is ever called inside a transaction.  The
  planner that names each next visit runs inside the transaction and must
  not use the store.
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
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol, TypeVar

import attrs

from fencekeeper.kernel import approvals, attempts, recovery
from fencekeeper.kernel import definition as d
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.events import Event, checked_payload, matches, projection, wake_outputs
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionState


class StoreError(Exception):
    """A store cannot do what was asked (a broken file, a schema it does not know, a failed write).

    ``code`` is stable: ``store_unavailable``, ``schema_too_new``,
    ``schema_altered``, ``schema_missing``, ``schema_outdated``, ``not_a_database``, ``read_only``,
    ``guard_conflict``, ``evidence_conflict``, ``registration_conflict``, ``store_locked`` (SQLite:
    another writer has held the database's write lock past the busy timeout), ``row_locked``
    (PostgreSQL: a row the request needs is held by another transaction past the lock timeout, or
    past a sweep's shorter wait), ``malformed_row`` (an operation store: a stored Operation's fields
    contradict its state, such as a running row without an owner, or a column of it, its attempts or
    its history cannot be read; the message names the operation and the field; an execution store: an
    execution's row names a revision with no stored body, or the body cannot be read; the message names
    the execution, and so does ``execution_id``).  Nothing is written
    by a request that raises.
    """

    def __init__(self, code: str, message: str, *, execution_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.execution_id = execution_id
        """The execution whose stored row a ``malformed_row`` error is about, when it names one: a
        worker passes over it (:class:`~fencekeeper.adapters.worker.Worker`) and claims the others."""


_T = TypeVar("_T")

RETRYABLE_STORE_CODES = frozenset({"store_unavailable", "row_locked", "store_locked"})
"""StoreError codes a running worker waits out: the store is reachable again soon, or a holder lets go."""

STOP_TAKE_UP_WAITS = (0.2, 0.4, 0.8, 1.6)
"""Pauses between a stopping worker's tries at work whose answer was lost, while the store still fails: 3 s in all.

Both workers (executions and durable operations) take such work up on
their way out, so that it is finished under its lease rather than left to
expire; a stopping process does not wait out a longer outage."""


def tried_before_stop(attempt: Callable[[], _T], sleep: Callable[[float], None] = time.sleep) -> _T | None:
    """``attempt()``, tried again after each of :data:`STOP_TAKE_UP_WAITS` while the store fails retryably.

    None once the last try failed so too; any other error is raised.  For a
    stopping worker's last look at work whose answer was lost.
    """
    for wait in (*STOP_TAKE_UP_WAITS, None):
        try:
            return attempt()
        except StoreError as exc:
            if exc.code not in RETRYABLE_STORE_CODES:
                raise
            if wait is None:
                return None
            sleep(wait)
    return None

RIDE_OUT_SECONDS = 30.0
"""How long a worker keeps trying a store that fails every time before it gives up and its command exits 1.

Long enough for what passes by itself: a server restarting, a failover, an administrator ending the
role's sessions (which kills every idle connection of a pool at once, so several requests in a row meet
a dead one).  A store that is still failing after that is left to the process supervisor."""


@attrs.define
class StorePatience:
    """A worker loop's answer to a StoreError: how long to wait before trying again, or to give up.

    Retryable codes are waited out with a backoff (0.2 s, doubling, at most 5 s) while the store has
    failed every request for less than ``budget`` seconds; any other code, or a failure once the
    budget is spent, gives up.  ``succeeded`` starts the count again.  A request that fails is never retried
    here: the worker makes its next request, which the kernel decides afresh.
    """

    budget: float = RIDE_OUT_SECONDS
    clock: Callable[[], float] = time.monotonic
    _since: float | None = attrs.field(default=None, init=False)
    _failures: int = attrs.field(default=0, init=False)

    def failed(self, code: str) -> float | None:
        """Seconds to wait before the next request after a StoreError coded ``code``; None: give up."""
        if code not in RETRYABLE_STORE_CODES:
            return None
        now = self.clock()
        if self._since is None:
            self._since = now
        elif now - self._since >= self.budget:
            return None
        self._failures += 1
        return float(min(2.0**self._failures / 10, 5.0))

    @property
    def failures(self) -> int:
        """Failures waited out since the last success: 1 on the first of a run of them."""
        return self._failures

    def failing_for(self) -> float:
        """Seconds since the first failure of the run waited out (``clock``); 0.0 with none since the last success."""
        return 0.0 if self._since is None else max(self.clock() - self._since, 0.0)

    def succeeded(self) -> None:
        """A request went through: the store is back."""
        self._since = None
        self._failures = 0


def checked_again_if_lost(check: Callable[[], _T], lost: type[BaseException], *, tries: int = 3) -> _T:
    """``check()``, tried again on a ``lost`` error (a connection dropped after the server answered), ``tries`` in all.

    A store opens by checking its schema on a connection the server has just
    given it.  An administrator ending that backend in between
    (``pg_terminate_backend``, a failover) says nothing about the store: a
    worker starting at that moment would exit with nothing wrong, where the
    same loss a moment later is ridden out by its loop
    (:class:`StorePatience`).  The pool hands each try a fresh connection; a
    server that cannot be reached at all is not this (the pool's own
    connecting fails first, and is reported at once).
    """
    for attempt in range(1, tries + 1):
        try:
            return check()
        except lost:
            if attempt == tries:
                raise
            time.sleep(0.1 * attempt)
    raise AssertionError("unreachable")


def registration_conflict(key: p.WaitKey) -> StoreError:
    """A wait registration key used twice: each visit must register under its own attempt identity."""
    return StoreError(
        "registration_conflict",
        f"wait registration ({key.execution_id}, {key.node_id}, {key.attempt_id}) already exists; "
        "a registration is unique per execution, node and attempt and is never reopened",
    )


def evidence_revision_conflict(item: Evidence) -> StoreError:
    """A revision of an evidence object that is not on top of its current one: someone else moved it."""
    return StoreError(
        "evidence_conflict",
        f"evidence {item.object_id!r}: revision {item.revision} is not on top of revision {item.revision - 1} "
        "of this execution's object; an evidence revision is never overwritten",
    )


DEFINITION_CACHE = 1024
"""Definition revisions a store keeps parsed in memory; past it the cache starts again empty."""

SWEEP_LOCK_WAIT = 2.0
"""Seconds a sweep waits for a row another transaction holds before skipping it as locked.

A decision holds its rows for milliseconds, so a sweep racing another one
on the same row gets it well within this; a holder past it has stalled."""


# --- time -------------------------------------------------------------------------


class Clock(Protocol):
    """The authoritative time of a store: read once per transaction, always aware UTC."""

    def now(self) -> datetime:
        """The authoritative time, timezone-aware UTC."""
        ...


class SystemClock:
    """The machine's clock, in UTC (PostgreSQL stores use the database's clock instead)."""

    def now(self) -> datetime:
        """The machine's current time in UTC."""
        return datetime.now(UTC)


class ManualClock:
    """A clock tests move by hand; thread-safe so concurrent tests can share it."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """The time it was last set or advanced to."""
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta``; returns the new time."""
        with self._lock:
            self._now += delta
            return self._now

    def set(self, moment: datetime) -> None:
        """Set the clock to ``moment`` (timezone-aware)."""
        with self._lock:
            self._now = moment


# --- values -----------------------------------------------------------------------


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
    """The current revision of every evidence object, in creation order."""
    evidence_revisions: tuple[Evidence, ...] = ()
    """Every revision of every evidence object: objects in creation order, each object's revisions in order."""


@attrs.frozen
class VisitView:
    """What a worker plans one node visit from: the execution, its dispatch row and its current evidence.

    Read from one snapshot, as :class:`ExecutionView` is, without the
    history a visit never looks at (revisions, transitions, registrations,
    recoveries).
    """

    execution: p.Execution
    dispatch: p.Dispatch
    evidence: tuple[Evidence, ...]
    """The current revision of every evidence object, in creation order."""


@attrs.frozen
class NextVisit:
    """The next visit's decision, or its Command's intent, applied in the transaction of the decision before it.

    Composed decisions (specs/protocol.md, "Composed decisions"): ``kind``
    is ``step`` (:func:`~fencekeeper.kernel.protocol.record_step`, with
    ``request`` a StepRequest), ``finish``
    (:func:`~fencekeeper.kernel.protocol.finalize`, with a FinalizeRequest)
    or ``intent`` (a Command's intent, the evidence that must be durable
    before its handler is called, under
    :func:`~fencekeeper.kernel.protocol.fenced`, with the LeaseCredential).
    A finish or an intent ends the transaction's visits: the handler is
    called only after it commits.  ``plan`` is the caller's own, handed
    back untouched with the outcome.
    """

    kind: str
    request: p.StepRequest | p.FinalizeRequest | p.LeaseCredential
    evidence: tuple[Evidence, ...]
    plan: Any = None


Planner = Callable[[VisitView, datetime, p.LeaseCredential], NextVisit | None]
"""Plans the next visit from the execution as the transaction has it so far, at the transaction's time,
under the worker's credential; None ends the transaction there.  It runs inside the transaction, holding
the execution's row locks: it must be quick and must not use the store."""


@attrs.frozen
class Composed:
    """What a composed transaction committed: its first decision, each next visit's, and the view it left."""

    outcome: p.Outcome | None
    """The first decision's outcome (the claim's, or the step's); None when a claim found nothing due."""
    followed: tuple[tuple[NextVisit, p.Outcome], ...] = ()
    """Each next visit planned in the transaction, with its outcome, in order.  A refusal is the last:
    nothing of it was written, and what came before it committed."""
    view: VisitView | None = None
    """The execution as the transaction left it, while it may still be running under the lease; None
    when the last decision finalized it, issued a Command (its handler is next) or was refused."""
    then: Composed | None = None
    """The next execution's claim and its visits, made in the same transaction after this execution's
    finalize (:attr:`NextClaim.request`, where the store ``composes_claims``); None when none was made.
    Its own ``then`` is the claim after its finalize (:attr:`NextClaim.more`), and so on."""

    @property
    def finished(self) -> bool:
        """Whether this execution's last visit finalized it, decided: the holder's lease ends with the transaction."""
        return bool(self.followed) and self.followed[-1][0].kind == "finish" and isinstance(
            self.followed[-1][1], p.Decision
        )

    @property
    def claimed_after(self) -> tuple[Composed, ...]:
        """The claims the transaction made after this execution's finalize, in order (``then``, its ``then``, ...)."""
        made: list[Composed] = []
        then = self.then
        while then is not None:
            made.append(then)
            then = then.then
        return tuple(made)


MAX_COMPOSED = 16
"""The most next visits one transaction carries.

Each is a node visit that calls no handler (a condition, an end), or a
Command's intent, which ends them; a
definition's run of them is short, and the step limit (100) bounds any
run anyway.  The bound keeps one transaction's row locks brief."""


# --- the port -----------------------------------------------------------------------


class Store(Protocol):
    """What every store offers.  Every method is one transaction; every outcome is the kernel's."""

    clock: Clock

    def admit(self, request: p.AdmitRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.admit` in one transaction."""
        ...

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> p.Outcome | None:
        """Claim the first eligible execution (eligible_at, then id); None when there is none."""
        ...

    def renew(self, execution_id: str, request: p.RenewRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.renew` in one transaction."""
        ...

    def record_step(
        self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()
    ) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.record_step` with the visit's evidence, in one transaction."""
        ...

    def release(self, execution_id: str, request: p.ReleaseRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.release` in one transaction."""
        ...

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.finalize` with its evidence, in one transaction."""
        ...

    def append_evidence(
        self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]
    ) -> p.Outcome:
        """Write evidence under a live lease without moving the execution (a Command before it is issued)."""
        ...

    def wake(self, request: p.WakeRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.wake` in one transaction."""
        ...

    def cancel(self, request: p.CancelRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.cancel` in one transaction."""
        ...

    def recover(self, request: p.RecoveryRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """quarantine_expired, fail, resume_safe and reconcile_command."""
        ...

    def quarantine(self, request: p.RecoveryRequest) -> p.Outcome:
        """As recover, for a sweep: a row held past a brief wait (SWEEP_LOCK_WAIT) is StoreError('row_locked')."""
        ...

    def expired(self) -> list[str]:
        """Ids of running executions whose lease has expired now: what quarantine would take."""
        ...

    def read(self, execution_id: str) -> ExecutionView | None:
        """The execution with its whole history, from one snapshot; None when there is none."""
        ...

    def read_for_visit(self, execution_id: str) -> VisitView | None:
        """The execution, its dispatch row and its current evidence, from one snapshot; None when there is none."""
        ...

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        """Every execution's id (only those in ``state`` when given), sorted."""
        ...

    def close(self) -> None:
        """Release the store's connections; every call after it is StoreError('store_unavailable'), a second close nothing."""
        ...

    # What the interpreter needs beyond the protocol's decisions.

    def register_definition(self, definition: d.Definition, business_id: str, authority: p.Authority) -> bool:
        """Register the next definition revision of a Business; False when identical to a registered one."""
        ...

    def load_definition(
        self, business_id: str, definition_id: str, revision: int | None = None
    ) -> d.Definition | None:
        """A registered definition revision (the latest when ``revision`` is None), or None."""
        ...

    def publish_event(self, event: Event, authority: p.Authority) -> PublishResult:
        """Commit an Event and wake every waiter it matches exactly, in one transaction.

        A payload past the publication bounds raises ``EventError`` (``invalid_event``) and writes nothing.
        """
        ...

    def decide_approval(self, decision: approvals.ApprovalDecision) -> approvals.DecideOutcome | p.Decision:
        """Apply a reviewer's decision: the first determination wakes the waiter; later ones are kept in history."""
        ...

    def due_wakes(self, limit: int = 100, *, business_id: str | None = None) -> list[p.WaitKey]:
        """Open wait registrations whose timer is due now (at most ``limit``)."""
        ...

    def fire_timer(self, key: p.WaitKey, authority: p.Authority) -> p.Outcome:
        """Wake the waiter of a due timer, as the timer principal."""
        ...


def definition_object_id(business_id: str, definition_id: str) -> str:
    """Definitions are generic objects named per Business: one Business never sees another's."""
    return f"definition:{business_id}:{definition_id}"


def _completed_by_event(attempt: Evidence | None, event: Event) -> tuple[Evidence, ...]:
    """The waiting attempt, completed by ``event``: what it gives the nodes after the wait (kernel ``wake_outputs``)."""
    outputs, withheld = wake_outputs(event)
    return attempts.completed_by_wake(attempt, p.WakeReason.EVENT.value, event.event_id, outputs, withheld)


@attrs.frozen
class NextClaim:
    """The claim a worker makes next when a composed transaction finishes its execution.

    Given to :meth:`TransactionalStore.claim_and_visit` or
    :meth:`TransactionalStore.record_step_and_visit`, it is a hint, never a
    decision: a store that reads ahead (``reads_ahead``, PostgreSQL) may send
    that claim's locking read in the same exchange as the finishing
    transaction's ``COMMIT``, as the first statement of the claim's own
    transaction, and use what it locked when the worker's next
    :meth:`~TransactionalStore.claim_and_visit` names the same
    ``business_id`` and ``skip``.  Anything else the worker asks of the
    store on that thread first rolls that transaction back, unused, having
    written nothing.

    With ``request``, a store that ``composes_claims`` (PostgreSQL) makes
    that claim in the same transaction instead, after the finalize, with
    ``request``'s lease token, and the claimed execution's visits after it
    (:attr:`Composed.then`; specs/protocol.md, "Composed decisions").  Its
    candidate is read with the transaction's first locking read, so the claim
    costs no exchange of its own.  A claim's transaction makes ``more``
    claims after that, each after the finalize of the one before, while
    each finalizes its execution (a step's makes one: it reads one candidate).
    """

    business_id: str | None
    skip: frozenset[str] = frozenset()
    request: p.ClaimRequest | None = None
    """The claim to make after the finalize, where the store composes claims; None: read ahead only."""
    more: tuple[p.ClaimRequest, ...] = ()
    """Claims to make after that one's finalize, in order, where the store composes claims (a claim's transaction)."""
    chain: int = 1
    """The most executions the worker's next claim takes in its transaction (itself and the claims it will offer
    after it, :meth:`~fencekeeper.adapters.worker.Worker.run_pass`): a claim read ahead locks that many
    candidates.  The store reads one instead unless the execution this transaction finalized last was
    claimed in it too (the worker offers its next claim claims after only then)."""


@attrs.frozen
class _Claim:
    """A transaction that claims: its time may come with its candidate."""

    business_id: str | None
    skip: frozenset[str] = frozenset()
    """Executions the claim passes over: a worker's, whose rows it found malformed (empty as a rule)."""


class Backend(abc.ABC):
    """What one transaction of a concrete store can read and write."""

    def lock(self, execution_id: str, *, wait: float | None = None) -> None:  # noqa: B027 - a hook; most stores lock the whole file
        """Take the row locks a decision on ``execution_id`` needs, before the time is read.

        Reading the time after the locks are held means that waiting for a
        lock can never make a lease look younger than it is.  ``wait`` bounds,
        in seconds, how long a row another transaction holds is waited for
        (None: the store's own bound); past it the store raises
        ``StoreError('row_locked')`` and writes nothing.
        """

    def lock_for_visit(self, execution_id: str) -> None:
        """:meth:`lock`, for a transaction of composed decisions on ``execution_id`` (``record_step_and_visit``).

        A store may read the execution's evidence with the locks, to make the
        views its next visits are planned from without reading them
        (:meth:`write_and_view`).
        """
        self.lock(execution_id)

    def now(self, clock: Clock) -> datetime:
        """The authoritative time of this transaction; by default the store's clock."""
        return clock.now()

    def claim_time(self, clock: Clock, business_id: str | None, skip: frozenset[str] = frozenset()) -> datetime:
        """The authoritative time of a claim's transaction.

        A store may find the claim's candidate in the same statement that
        reads the time (one round trip fewer); ``next_eligible`` with the
        time returned here and the same ``business_id`` and ``skip`` then
        returns it.
        """
        return self.now(clock)

    @abc.abstractmethod
    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        """The execution and its dispatch row as this transaction sees them (None, None when absent)."""
        ...

    @abc.abstractmethod
    def object_exists(self, object_id: str) -> bool:
        """Whether any generic object (an execution, an evidence object, ...) has this identity."""

    @abc.abstractmethod
    def load_registration(self, key: p.WaitKey) -> p.WaitRegistration | None:
        """The wait registration stored under ``key``, if any."""
        ...

    @abc.abstractmethod
    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None:
        """The recorded result of a recovery command, by its identity, if any."""
        ...

    @abc.abstractmethod
    def next_eligible(self, now: datetime, business_id: str | None, skip: frozenset[str] = frozenset()) -> str | None:
        """The first eligible execution due at ``now``: eligible_at ASC, workflow_execution_id ASC.

        Executions named in ``skip`` are passed over: a worker names those whose row it found
        malformed, so that one damaged row does not stop its claims (empty as a rule, and then the
        store's statement is the one it always runs).
        """

    @abc.abstractmethod
    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        """Write everything ``decision`` lists under its guard; False (having written nothing) if it fails."""

    keeps_writes: bool = True
    """Whether :meth:`write_last` may keep the writes for the COMMIT (the store's loop turns it off when a
    kept write failed there, and decides the request again)."""

    read_ahead: NextClaim | None = None
    """The claim to read ahead behind this transaction's COMMIT (:class:`NextClaim`); set by a composed
    transaction that finished its execution, and ignored by a store that does not read ahead."""

    claim_after: NextClaim | None = None
    """A claim this transaction may make after its execution's finalize (:attr:`NextClaim.request`); set
    before the transaction's locking read, so that a store may read the claim's candidate with it."""

    def next_claimed_after(self) -> str | None:
        """The candidate of :attr:`claim_after`, as the transaction's locking read locked it; None when there is none.

        Its rows are then what :meth:`load` answers.  This default reads none:
        only a store that ``composes_claims`` reads one.
        """
        return None

    def write_last(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        """:meth:`write`, as the transaction's last action: nothing is read or written in it afterwards.

        (But for a claim after a finalize, where the store composes claims: decided on rows read before,
        its writes kept for the same ``COMMIT``.)

        A store may then keep the writes and send them with the transaction's
        ``COMMIT`` (PostgreSQL: one exchange instead of two), and True is
        returned.  For a decision whose one possible failure is a conflict on
        a unique key (an admission: inserts only), such a conflict is raised
        when the transaction ends, as :class:`_GuardFailed`, with nothing
        written: what False would have caused here.  For a guarded decision
        the guard is checked by the database inside the kept statement, and
        any failure there is raised as :class:`_KeptWriteFailed`, with
        nothing written: the request is decided again, its writes checked one
        by one.  By default, :meth:`write`.
        """
        return self.write(decision, evidence, now)

    def lock_topic(self, business_id: str, event_type: str) -> None:  # noqa: B027 - a hook, as lock() is
        """Serialize Event publication with waiter registration for one Business and Event Type."""

    @abc.abstractmethod
    def append_objects(self, execution_id: str, evidence: Sequence[Evidence], now: datetime) -> bool:
        """Evidence of ``execution_id`` that no row change accompanies; False if a revision check fails."""

    @abc.abstractmethod
    def execution_evidence(self, execution_id: str) -> list[Evidence]:
        """The current revision of every evidence object of an execution, in creation order."""

    def admission_facts(
        self, execution_id: str, definition_object_id: str, business_id: str
    ) -> tuple[p.Execution | None, bool, int | None]:
        """What an admission decides on: the execution already under ``execution_id`` (if any, as
        :meth:`load` sees it), whether the identity is taken by another object, and the latest
        registered revision of the definition object in ``business_id`` (None: not registered).

        Read before the transaction's time, so a store may read all of it, and the time, in one
        statement.  Revisions of a definition are registered one after the other from 1, so every
        revision up to the latest is registered.
        """
        existing = self.load(execution_id)[0]
        taken = existing is None and self.object_exists(execution_id)
        numbers = [number for owner, number, _ in self.definition_revisions(definition_object_id) if owner == business_id]
        return existing, taken, (max(numbers) if numbers else None)

    def write_and_view(
        self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime, execution_id: str
    ) -> tuple[bool, VisitView | None]:
        """:meth:`write`, then :meth:`view_so_far` when it held.

        A store may send both in one exchange, or keep the writes for a later
        one and make the view from what its locking read brought (PostgreSQL:
        docs/stores.md, "What a worker sends per execution").
        """
        if not self.write(decision, evidence, now):
            return False, None
        return True, self.view_so_far(execution_id)

    def view_so_far(self, execution_id: str) -> VisitView | None:
        """The execution's :class:`VisitView` as this transaction has it so far, which goes on after it.

        What a composed decision plans its next visit from: read after the
        writes before it, under the row locks they hold.
        """
        execution, dispatch = self.load(execution_id)
        if execution is None or dispatch is None:
            return None
        return VisitView(execution, dispatch, tuple(self.execution_evidence(execution_id)))

    @abc.abstractmethod
    def load_evidence(self, object_id: str) -> Evidence | None:
        """The current revision of an evidence object."""

    @abc.abstractmethod
    def definition_revisions(self, object_id: str) -> list[tuple[str, int, str]]:
        """Every registered revision of a definition object: (business_id, revision, canonical JSON)."""

    @abc.abstractmethod
    def insert_definition(self, object_id: str, business_id: str, revision: int, body: str, now: datetime) -> bool:
        """Register the next revision of a definition object; False (nothing written) if one was registered meanwhile.

        The caller's transaction then rolls back and decides again on what
        the other registration committed.
        """

    @abc.abstractmethod
    def load_event(self, event_id: str) -> Event | None:
        """A committed Event by its id, if any."""
        ...

    @abc.abstractmethod
    def insert_event(self, event: Event, now: datetime) -> None:
        """Write a new Event in this transaction."""
        ...

    @abc.abstractmethod
    def matching_events(self, spec: p.WaitSpec, business_id: str) -> list[Event]:
        """Committed Events that match a waiter exactly, oldest first."""

    @abc.abstractmethod
    def waiting_registrations(self, business_id: str, event_type: str) -> list[p.WaitRegistration]:
        """Unwoken registrations waiting on this Business and Event Type."""

    @abc.abstractmethod
    def due_registrations(self, now: datetime, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        """Unwoken registrations whose one-time UTC wake is due, earliest first, of ``business_id`` if given."""


_NEEDS_FACTS = frozenset(
    {p.RecoveryKind.RECONCILE_COMMAND, p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.RESUME_SUSPENDED}
)


def _claim_on_rows(tx: Backend, execution_id: str, request: p.ClaimRequest, now: datetime) -> p.Outcome:
    """The kernel's claim of ``execution_id`` on its rows; StoreError('malformed_row') naming it if they are damaged.

    The kernel raises :class:`~fencekeeper.kernel.protocol.MalformedSnapshot` on rows no decision could
    have written, naming the row's field (``execution.``, ``dispatch.``: two step counts that disagree, a
    revision of 0): the stored rows were edited by hand or damaged, as when a revision cannot be read, and
    a worker passes over the execution as it does then.  Anything else it raises goes to the caller as it is.
    """
    execution, dispatch = tx.load(execution_id)
    # A try, not _rows_of: every claim passes here, and a generator's context costs more than a try.
    try:
        return p.claim(execution, dispatch, request, now)
    except p.MalformedSnapshot as exc:
        raise _malformed_rows(execution_id, exc) from None


@contextlib.contextmanager
def _rows_of(execution_id: str) -> Iterator[None]:
    """A kernel decision on ``execution_id``'s stored rows: :class:`~fencekeeper.kernel.protocol.MalformedSnapshot` is ``malformed_row`` naming it.

    For a transaction that decides on an execution it did not lock by its id (an Event's wakes, an
    approval's): damaged rows are reported as the codec reports them, one error naming the execution,
    which a worker passes over; nothing of the transaction is written.  A transaction run with
    ``lock`` gets the same from :meth:`TransactionalStore._run`.
    """
    try:
        yield
    except p.MalformedSnapshot as exc:
        raise _malformed_rows(execution_id, exc) from None


def _malformed_rows(execution_id: str, exc: p.MalformedSnapshot) -> StoreError:
    return StoreError(
        "malformed_row",
        f"execution {execution_id!r}: {exc} (the stored rows were edited by hand or damaged; nothing was written)",
        execution_id=execution_id,
    )


def _pinned_definition(tx: Backend, execution: p.Execution) -> d.Definition | None:
    """The execution's pinned definition revision as the store holds it now, or None."""
    object_id = definition_object_id(execution.business_id, execution.definition_id)
    for business_id, revision, body in tx.definition_revisions(object_id):
        if business_id == execution.business_id and revision == execution.definition_revision:
            return d.from_json(body, strict=False, source=f"{execution.definition_id} revision {revision}")
    return None


class _GuardFailed(Exception):
    """Internal: unwinds a transaction whose guard did not hold, so that it rolls back."""


class _KeptWriteFailed(_GuardFailed):
    """Internal: a guarded write kept for the COMMIT (``write_last``) failed there, so nothing was written.

    A guard that did not hold and a conflict on a unique key look alike from
    there; the request is decided again with every write checked as it is
    made, so that the caller gets exactly what it would have without keeping.
    """


@attrs.frozen
class _Written:
    """Internal: a composite decision already wrote what it decided; here is what to return."""

    outcome: Any


@attrs.frozen
class PublishResult:
    """What publishing an Event did: whether it was new, and which waiters it woke."""

    event_id: str
    duplicate: bool
    woken: tuple[str, ...]


def _apply(tx: Backend, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> None:
    if not tx.write(decision, evidence, now):
        raise _GuardFailed


def _finalized(
    tx: Backend,
    now: datetime,
    rows: tuple[p.Execution | None, p.Dispatch | None],
    request: p.FinalizeRequest,
    evidence: Sequence[Evidence],
) -> p.Outcome | _Written:
    """A finalization decided on ``rows`` (the execution and its dispatch row) as this transaction has them.

    A waiting target first looks for Events that already match its
    registration, and one found wakes the waiter in the same transaction
    (:meth:`TransactionalStore.finalize`).  Returns the kernel's outcome
    for the caller to write, or ``_Written`` when it wrote it here.
    """
    outcome = p.finalize(*rows, request, now)
    wait = request.wait
    if not isinstance(outcome, p.Decision) or outcome.registration is None or wait is None:
        return outcome
    registration = outcome.registration
    found = tx.matching_events(wait, registration.business_id)
    if not found:
        return outcome
    _apply(tx, outcome, evidence, now)
    event = found[0]
    woke = p.wake(
        outcome.execution,
        outcome.dispatch,
        registration,
        p.WakeRequest(
            key=registration.key,
            reason=p.WakeReason.EVENT,
            source_id=event.event_id,
            business_id=event.business_id,
            authority=request.authority,
            event_type=event.event_type,
            correlation=projection(wait, event),
        ),
        now,
    )
    if isinstance(woke, p.Decision):
        # The attempt's newest revision is in this very decision's evidence.
        latest = [item for item in evidence if item.object_id == registration.key.attempt_id]
        completed = _completed_by_event(latest[-1] if latest else None, event)
        _apply(tx, woke, completed, now)
    return _Written(outcome)


def _wake_evidence(
    tx: Backend, key: p.WaitKey, reason: p.WakeReason, source_id: str, outputs: Mapping[str, Any]
) -> list[Evidence]:
    """The waiting attempt completes with what woke it (seed 000: the wake commits its evidence)."""
    return list(attempts.completed_by_wake(tx.load_evidence(key.attempt_id), reason.value, source_id, outputs))


def _written_then_viewed(
    tx: Backend, decision: p.Decision, evidence: Sequence[Evidence], now: datetime, execution_id: str
) -> VisitView | None:
    """Write ``decision`` under its guard (or unwind), then read the view it leaves, in one exchange where the store can."""
    written, view = tx.write_and_view(
        decision, (*evidence, *decision.objects) if decision.objects else evidence, now, execution_id
    )
    if not written:
        raise _GuardFailed
    return view


def _composable(visit: NextVisit) -> bool:
    """Whether ``visit`` may join the transaction of the decision before it.

    A finalization to waiting for an Event takes the Event topic's lock,
    which comes before any row's in the one lock order of every store; a
    transaction already holding the execution's rows must not take it, so
    that visit is left to a transaction of its own.
    """
    if visit.kind in ("step", "intent"):
        return True
    request = visit.request
    return visit.kind == "finish" and isinstance(request, p.FinalizeRequest) and not (
        isinstance(request.wait, p.WaitSpec) and isinstance(request.wait.event_type, str)
    )


Decide = Callable[[Backend, datetime], "p.Outcome | _Written | None"]


class TransactionalStore(abc.ABC):
    """The shared half of every store: one transaction per request, the kernel decides."""

    composes_claims: ClassVar[bool] = False
    """Whether a composed transaction that finalizes its execution may also make the worker's next claim
    (:attr:`NextClaim.request`); a store that does reads that claim's candidate with its first locking read."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        # Registered definition revisions by (business, definition, revision):
        # immutable once registered (load_definition).  Shared by the store's
        # threads; a Definition is a frozen value.
        self._definitions: dict[tuple[str, str, int | None], d.Definition] = {}
        # The latest revision number of each (business, definition) that an
        # admission's facts last found: a prediction, never a fact.  Revisions
        # only ever grow, so a store that decides an admission on it checks it
        # in the admission's own statement (PostgresStore.admit_run).
        self._heads: dict[tuple[str, str], int] = {}
        # Set by close(): from then on every call is StoreError('store_unavailable').
        self._closed = False

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Backend]:
        """A write transaction: commits on normal exit, rolls back on any exception."""

    def _claim_transaction(self, claim: _Claim) -> contextlib.AbstractContextManager[Backend]:
        """The transaction of a claim: :meth:`_transaction`, unless the store read this claim ahead (:class:`NextClaim`)."""
        del claim
        return self._transaction()

    @abc.abstractmethod
    def read(self, execution_id: str) -> ExecutionView | None:
        """The execution with its whole history, from one consistent snapshot."""

    def read_for_visit(self, execution_id: str) -> VisitView | None:
        """The execution, its dispatch row and its current evidence, from one snapshot; None when there is none.

        Stores read it in one statement (:meth:`Backend.visit_view`); this
        default takes it from :meth:`read`.
        """
        view = self.read(execution_id)
        if view is None:
            return None
        return VisitView(view.execution, view.dispatch, view.evidence)

    @abc.abstractmethod
    def expired(self) -> list[str]:
        """Ids of running executions whose lease has expired now."""

    @abc.abstractmethod
    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        """Every execution's id (only those in ``state`` when given), sorted."""
        ...

    def leased_to(self, worker_id: str, lease_token: str) -> str | None:
        """The execution running under the lease ``lease_token`` of ``worker_id`` now, or None.

        Read only by a worker whose claim may have committed without its
        answer reaching it: a KeyboardInterrupt or SystemExit stopped it
        inside the claim (:meth:`~fencekeeper.adapters.worker.Worker.run_pass`),
        or the store failed it retryably and the next pass takes it up
        (:meth:`~fencekeeper.adapters.worker.Worker.take_up`).  The worker
        knows the token it asked for, not the execution it got.  Tokens are fresh per claim, so at
        most one execution holds one.  This default reads every running
        execution; the stores ask their index of claimed rows.
        """
        for execution_id in self.execution_ids(ExecutionState.RUNNING):
            view = self.read_for_visit(execution_id)
            if view is not None and (view.dispatch.leased_by, view.dispatch.lease_token) == (worker_id, lease_token):
                return execution_id
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections and set ``_closed``: every call after it is StoreError('store_unavailable').

        A second close does nothing.
        """
        ...

    def _run(
        self,
        decide: Decide,
        evidence: Sequence[Evidence] = (),
        lock: str | None = None,
        topic: tuple[str, str] | None = None,
        claim: _Claim | None = None,
        *,
        wait: float | None = None,
        before: Callable[[Backend], None] | None = None,
        visit: bool = False,
        claim_after: NextClaim | None = None,
    ) -> p.Outcome | None:
        failures = 0
        keep = True
        while failures < 2:
            try:
                with self._transaction() if claim is None else self._claim_transaction(claim) as tx:
                    tx.keeps_writes = keep
                    tx.claim_after = claim_after
                    # Topic first, then rows: the one lock order of every store.
                    if topic is not None:
                        tx.lock_topic(*topic)
                    if lock is not None and visit:
                        tx.lock_for_visit(lock)
                    elif lock is not None:
                        tx.lock(lock, wait=wait)
                    if before is not None:
                        # Reads a decision needs ahead of its time (admit_run's facts).
                        before(tx)
                    now = tx.now(self.clock) if claim is None else tx.claim_time(self.clock, claim.business_id, claim.skip)
                    outcome = decide(tx, now)
                    if isinstance(outcome, _Written):
                        return outcome.outcome  # type: ignore[no-any-return]
                    # The decision is the transaction's last action: its writes may go with the COMMIT.
                    if isinstance(outcome, p.Decision) and not tx.write_last(
                        outcome, (*evidence, *outcome.objects) if outcome.objects else evidence, now
                    ):
                        raise _GuardFailed
                    return outcome
            except _KeptWriteFailed:
                # Decided again with every write checked as it is made (a backend that kept
                # writes all the same is a guard failure, as any other).
                if keep:
                    keep = False
                else:
                    failures += 1
            except _GuardFailed:
                failures += 1
            except p.MalformedSnapshot as exc:
                # Every decision on one execution's rows (a renewal, a step, a release, a finalization, a
                # cancellation, a recovery) reports damaged rows as a claim does: malformed_row naming the
                # execution, not the kernel's bare ValueError; the transaction was rolled back, nothing written.
                if lock is None:
                    raise
                raise _malformed_rows(lock, exc) from None
        # Two guard failures inside write-locked transactions mean something
        # outside the store changes rows: refuse to guess.
        raise StoreError(
            "guard_conflict",
            "the rows changed under a write-locked transaction twice: something outside the store is writing them, "
            "or a row was edited by hand so that it contradicts its own revision",
        )

    def _one(self, decide: Decide, evidence: Sequence[Evidence] = (), lock: str | None = None) -> p.Outcome:
        outcome = self._run(decide, evidence, lock)
        assert outcome is not None
        return outcome

    def admit(self, request: p.AdmitRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.admit` and the admission evidence in one transaction."""
        def decide(tx: Backend, now: datetime) -> p.Outcome:
            existing = tx.load(request.execution_id)[0]
            taken = existing is None and tx.object_exists(request.execution_id)
            return p.admit(existing, request, now, id_taken=taken)

        return self._one(decide, evidence)

    def admit_run(
        self,
        execution_id: str,
        business_id: str,
        definition_id: str,
        revision: int | None,
        make: Callable[[d.Definition], tuple[p.AdmitRequest, Sequence[Evidence]]],
    ) -> p.Outcome | None:
        """Admit an execution of a registered definition revision, in one transaction; None when none is registered.

        The registration check and the admission are one decision: the
        definition's latest registered revision is read in the admission's
        transaction (the latest when ``revision`` is None; else ``revision``,
        which must be registered), and its content comes from the store's
        memory of immutable revisions (:meth:`load_definition`) when it is
        there.  ``make`` builds the request and its evidence from the
        definition; whatever it raises rolls the transaction back, with
        nothing written.
        """
        object_id = definition_object_id(business_id, definition_id)
        facts: list[tuple[p.Execution | None, bool, int | None]] = []

        def read_facts(tx: Backend) -> None:
            facts[:] = [tx.admission_facts(execution_id, object_id, business_id)]

        def decide(tx: Backend, now: datetime) -> _Written:
            existing, taken, head = facts[0]
            if head is not None:
                self._remember_head((business_id, definition_id), head)
            number = head if revision is None else revision
            if head is None or number is None or not 1 <= number <= head:
                return _Written(None)
            definition = self._definitions.get((business_id, definition_id, number))
            if definition is None:
                bodies = [b for owner, n, b in tx.definition_revisions(object_id) if owner == business_id and n == number]
                if not bodies:
                    return _Written(None)
                definition = d.from_json(bodies[0], strict=False, source=f"{definition_id} revision {number}")
                self._remember_definition((business_id, definition_id, number), definition)
            request, evidence = make(definition)
            if request.execution_id != execution_id:
                raise ValueError("admit_run: make() must admit the execution_id it was given")
            outcome = p.admit(existing, request, now, id_taken=taken)
            # The transaction's last action (nothing follows _Written): a store
            # may send these writes with its COMMIT.  An admission that lost the
            # race for its id then fails at the commit, as _GuardFailed, and is
            # decided again on what the other one committed, as here.
            if isinstance(outcome, p.Decision) and not tx.write_last(outcome, evidence, now):
                raise _GuardFailed
            return _Written(outcome)

        outcome = self._run(decide, before=read_facts)
        assert outcome is None or isinstance(outcome, p.Decision | p.Refusal | p.Unchanged)
        return outcome

    def claim_next(
        self, request: p.ClaimRequest, *, business_id: str | None = None, skip: Collection[str] = ()
    ) -> p.Outcome | None:
        """Claim the first eligible execution that is due (by eligible_at, then id); None when there is none.

        Executions named in ``skip`` are passed over (see :meth:`claim_and_visit`).
        """
        passed_over = frozenset(skip)

        def decide(tx: Backend, now: datetime) -> p.Outcome | None:
            execution_id = tx.next_eligible(now, business_id, passed_over)
            if execution_id is None:
                return None
            return _claim_on_rows(tx, execution_id, request, now)

        return self._run(decide, claim=_Claim(business_id, passed_over))

    # --- composed decisions (specs/protocol.md, "Composed decisions") ------------------

    def claim_and_visit(
        self,
        request: p.ClaimRequest,
        plan: Planner,
        *,
        business_id: str | None = None,
        skip: Collection[str] = (),
        next_claim: NextClaim | None = None,
    ) -> Composed:
        """:meth:`claim_next`, and the visits after it that call no handler, in the claim's transaction.

        The claim's writes travel with the read of the :class:`VisitView`
        they leave (:meth:`Backend.write_and_view`).  ``plan`` is asked for the next visit on the view the claim wrote, and
        again after each step it plans; each visit's decision is the kernel's,
        on the rows as the decision before it left them, under its own guard.
        The transaction commits all of them or none.

        Executions named in ``skip`` are passed over: a claim whose candidate's row is malformed
        raises ``StoreError('malformed_row')`` with its ``execution_id``, having written nothing,
        and a worker claims again without it, so that the rest of the queue runs.
        ``next_claim``: see :class:`NextClaim`.
        """
        passed_over = frozenset(skip)

        def first(tx: Backend, now: datetime) -> p.Outcome | None:
            execution_id = tx.next_eligible(now, business_id, passed_over)
            if execution_id is None:
                return None
            return _claim_on_rows(tx, execution_id, request, now)

        return self._compose(first, (), plan, claim=_Claim(business_id, passed_over), next_claim=next_claim)

    def record_step_and_visit(
        self,
        execution_id: str,
        request: p.StepRequest,
        evidence: Sequence[Evidence],
        plan: Planner,
        *,
        next_claim: NextClaim | None = None,
    ) -> Composed:
        """:meth:`record_step`, and the visits after it that call no handler, in the step's transaction.

        ``next_claim``: see :class:`NextClaim`.
        """
        return self._compose(
            lambda tx, now: p.record_step(*tx.load(execution_id), request, now),
            evidence,
            plan,
            lock=execution_id,
            credential=request.credential,
            next_claim=next_claim,
        )

    def _compose(
        self,
        first: Callable[[Backend, datetime], p.Outcome | None],
        evidence: Sequence[Evidence],
        plan: Planner,
        *,
        lock: str | None = None,
        claim: _Claim | None = None,
        credential: p.LeaseCredential | None = None,
        next_claim: NextClaim | None = None,
    ) -> Composed:
        # A claim after the finalize only where the store makes one (its candidate is read with the lock).
        after = next_claim if next_claim is not None and next_claim.request is not None and self.composes_claims else None

        def decide(tx: Backend, now: datetime) -> _Written:
            outcome = first(tx, now)
            if not isinstance(outcome, p.Decision) or outcome.execution is None:
                return _Written(Composed(outcome))
            execution_id = outcome.execution.execution_id
            view = _written_then_viewed(tx, outcome, evidence, now, execution_id)
            held = outcome.lease if outcome.lease is not None else credential
            assert held is not None
            composed = Composed(outcome, *self._follow(tx, now, view, held, plan))
            if after is not None and after.request is not None and composed.finished:
                # The holder's lease ends with the finalize: the same worker's next claims, and their visits.
                composed = attrs.evolve(composed, then=self._claims_after(tx, now, (after.request, *after.more), plan))
            if next_claim is not None and (composed.claimed_after or (composed,))[-1].finished:
                # The last lease of this transaction ends with it: its worker claims next, and offers that
                # claim claims after it only when this transaction claimed the execution it finalized last.
                chains = self.composes_claims and (claim is not None or composed.then is not None)
                tx.read_ahead = next_claim if chains or next_claim.chain == 1 else attrs.evolve(next_claim, chain=1)
            return _Written(composed)

        composed = self._run(decide, lock=lock, claim=claim, visit=True, claim_after=after)
        assert isinstance(composed, Composed)
        return composed

    def _follow(
        self, tx: Backend, now: datetime, view: VisitView | None, held: p.LeaseCredential, plan: Planner
    ) -> tuple[tuple[tuple[NextVisit, p.Outcome], ...], VisitView | None]:
        """The visits after a claim or a step that call no handler, each decided on the rows the one before left."""
        followed: list[tuple[NextVisit, p.Outcome]] = []
        for _ in range(MAX_COMPOSED):
            visit = None if view is None else plan(view, now, held)
            if view is None or visit is None or not _composable(visit):
                break
            result, view = self._next_visit(tx, now, view, visit)
            followed.append((visit, result))
            if not isinstance(result, p.Decision) or visit.kind != "step":
                break
        return tuple(followed), view

    def _claims_after(
        self, tx: Backend, now: datetime, requests: Sequence[p.ClaimRequest], plan: Planner
    ) -> Composed | None:
        """The claims of ``requests`` after a finalize, each made while the one before finalized its execution.

        The first made is returned, each next one as the :attr:`Composed.then` of the one before; None: none made.
        """
        made: list[Composed] = []
        for request in requests:
            claimed = self._claim_after(tx, now, request, plan)
            if claimed is None:
                break
            made.append(claimed)
            if not claimed.finished:
                break
        then = None
        for claimed in reversed(made):
            then = attrs.evolve(claimed, then=then)
        return then

    def _claim_after(self, tx: Backend, now: datetime, request: p.ClaimRequest, plan: Planner) -> Composed | None:
        """The claim of ``request`` on the next candidate the transaction's locking read found, and its visits; None: none made.

        A candidate whose rows are malformed, or a claim the kernel refuses,
        makes nothing: the worker's own next claim meets it, as it would have.
        """
        try:
            execution_id = tx.next_claimed_after()
            if execution_id is None:
                return None
            execution, dispatch = tx.load(execution_id)
            outcome = p.claim(execution, dispatch, request, now)
        except p.MalformedSnapshot:
            return None
        except StoreError as exc:
            if exc.code != "malformed_row":
                raise
            return None
        if not isinstance(outcome, p.Decision) or outcome.lease is None:
            return None
        view = _written_then_viewed(tx, outcome, (), now, execution_id)
        return Composed(outcome, *self._follow(tx, now, view, outcome.lease, plan))

    @staticmethod
    def _next_visit(tx: Backend, now: datetime, view: VisitView, visit: NextVisit) -> tuple[p.Outcome, VisitView | None]:
        """Decide ``visit`` on ``view`` (this transaction's rows so far) and write it under its guard.

        Returns its outcome and, after a step, the view it leaves.
        """
        request = visit.request
        if visit.kind == "step":
            assert isinstance(request, p.StepRequest)
            outcome = p.record_step(view.execution, view.dispatch, request, now)
            if not isinstance(outcome, p.Decision):
                return outcome, None
            execution_id = view.execution.execution_id
            return outcome, _written_then_viewed(tx, outcome, visit.evidence, now, execution_id)
        # An intent or a finish is the transaction's last action: its writes may go with the COMMIT.
        if visit.kind == "intent":
            assert isinstance(request, p.LeaseCredential)
            fenced = p.fenced(view.execution, view.dispatch, request, now)
            if isinstance(fenced, p.Decision) and not tx.write_last(fenced, visit.evidence, now):
                raise _GuardFailed
            return fenced, None
        assert visit.kind == "finish" and isinstance(request, p.FinalizeRequest)
        decided = _finalized(tx, now, (view.execution, view.dispatch), request, visit.evidence)
        if isinstance(decided, _Written):
            return decided.outcome, None
        if isinstance(decided, p.Decision) and not tx.write_last(
            decided, (*visit.evidence, *decided.objects) if decided.objects else visit.evidence, now
        ):
            raise _GuardFailed
        return decided, None

    def renew(self, execution_id: str, request: p.RenewRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.renew` in one transaction."""
        return self._one(lambda tx, now: p.renew(*tx.load(execution_id), request, now), lock=execution_id)

    def record_step(
        self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()
    ) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.record_step` with the visit's evidence, in one transaction."""
        return self._one(
            lambda tx, now: p.record_step(*tx.load(execution_id), request, now), evidence, lock=execution_id
        )

    def release(self, execution_id: str, request: p.ReleaseRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.release` in one transaction."""
        return self._one(lambda tx, now: p.release(*tx.load(execution_id), request, now), lock=execution_id)

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """Finalization; a waiting target first looks for Events that already match its registration.

        Seed 000, wait_for_event: 'if the Event commits first, waiter
        registration performs a bounded lookup against committed Event/index
        data before releasing'.  A match found here wakes the waiter in the
        same transaction, so the Event that came first is never missed.
        """
        def decide(tx: Backend, now: datetime) -> p.Outcome | _Written:
            return _finalized(tx, now, tx.load(request.execution_id), request, evidence)

        wait = request.wait
        topic = (
            (request.business_id, wait.event_type)
            if isinstance(wait, p.WaitSpec) and isinstance(wait.event_type, str)
            else None
        )
        outcome = self._run(decide, evidence, lock=request.execution_id, topic=topic)
        assert outcome is not None
        return outcome

    def append_evidence(
        self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]
    ) -> p.Outcome:
        """Write evidence under a live lease without moving the execution (a Command before it is issued)."""
        return self._one(
            lambda tx, now: p.fenced(*tx.load(execution_id), credential, now), evidence, lock=execution_id
        )

    def wake(self, request: p.WakeRequest) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.wake` in one transaction."""
        def decide(tx: Backend, now: datetime) -> p.Outcome:
            execution, dispatch = tx.load(request.key.execution_id)
            return p.wake(execution, dispatch, tx.load_registration(request.key), request, now)

        return self._one(decide, lock=request.key.execution_id)

    def cancel(self, request: p.CancelRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """Apply :func:`~fencekeeper.kernel.protocol.cancel` with the cancellation Command, in one transaction."""
        return self._one(
            lambda tx, now: p.cancel(*tx.load(request.execution_id), request, now),
            evidence,
            lock=request.execution_id,
        )

    def recover(self, request: p.RecoveryRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """A governed recovery decision, on facts read in its own transaction (seed 000, workflow_reconcile)."""

        def decide(tx: Backend, now: datetime) -> p.Outcome:
            execution, dispatch = tx.load(request.execution_id)
            facts = None
            if execution is not None and request.kind in _NEEDS_FACTS:
                facts = recovery.RecoveryFacts(
                    tuple(tx.execution_evidence(execution.execution_id)),
                    _pinned_definition(tx, execution),
                    tuple(evidence),
                )
            return recovery.recover(execution, dispatch, tx.load_recovery(request.command_id), request, now, facts=facts)

        return self._one(decide, evidence, lock=request.execution_id)

    def quarantine(self, request: p.RecoveryRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        """A sweep's governed decision on one execution: as :meth:`recover`, waiting for its rows only briefly.

        A row another transaction holds for longer than ``SWEEP_LOCK_WAIT``
        raises ``StoreError('row_locked')``, so that one stalled transaction
        cannot hold up a whole sweep: the sweep reports the row and goes on.
        A transaction that is merely committing (another sweep on the same
        row) lets go within milliseconds, and the kernel then sees the row
        as it left it.  Stores that lock the whole database (SQLite) wait
        for its lock as for any write.
        """

        def decide(tx: Backend, now: datetime) -> p.Outcome:
            execution, dispatch = tx.load(request.execution_id)
            return recovery.recover(execution, dispatch, tx.load_recovery(request.command_id), request, now)

        outcome = self._run(decide, evidence, request.execution_id, wait=SWEEP_LOCK_WAIT)
        assert outcome is not None
        return outcome

    # --- definitions --------------------------------------------------------------

    def register_definition(self, definition: d.Definition, business_id: str, authority: p.Authority) -> bool:
        """Register a definition revision for ``business_id``: True if new, False if identical to a registered one.

        Raises DefinitionError when the revision does not follow, or reuses a
        revision or node revision with other content; StoreError
        ``not_authorized`` when the caller may not register definitions.
        """
        if not authority.granted:
            raise StoreError("not_authorized", f"{authority.principal_id!r} may not register definitions")
        object_id = definition_object_id(business_id, definition.definition_id)

        def decide(tx: Backend, now: datetime) -> _Written:
            registered = [
                d.from_json(body, strict=False, source=f"{definition.definition_id} revision {revision}")
                for _, revision, body in tx.definition_revisions(object_id)
            ]
            if not d.check_registration(definition, registered):
                return _Written(False)
            if not tx.insert_definition(object_id, business_id, definition.revision, d.to_json(definition), now):
                raise _GuardFailed
            return _Written(True)

        return bool(self._run(decide))

    def load_definition(self, business_id: str, definition_id: str, revision: int | None = None) -> d.Definition | None:
        """A registered definition revision of ``business_id`` (the latest when ``revision`` is None).

        A revision asked for by number is kept once found: a registered
        revision never changes (registration refuses the same revision with
        other content, and its rows are append-only), so every worker visit
        after the first reads its execution's pinned revision from memory,
        not from the database.  The latest revision, and a revision not
        found, are always read: either may change when one is registered.
        """
        key = (business_id, definition_id, revision)
        # A closed store answers nothing, from memory either: the read below raises its store_unavailable.
        if revision is not None and not self._closed:
            cached = self._definitions.get(key)
            if cached is not None:
                return cached
        object_id = definition_object_id(business_id, definition_id)

        def decide(tx: Backend, now: datetime) -> _Written:
            rows = [r for r in tx.definition_revisions(object_id) if r[0] == business_id]
            chosen = [r for r in rows if revision is None or r[1] == revision]
            if not chosen:
                return _Written(None)
            _, number, body = chosen[-1]
            # Lenient: a stored revision written by newer code still loads, and
            # the interpreter suspends at whatever it cannot run.
            return _Written(d.from_json(body, strict=False, source=f"{definition_id} revision {number}"))

        result = self._run(decide)
        if not isinstance(result, d.Definition):
            return None
        if revision is not None:
            self._remember_definition(key, result)
        return result

    def known_definition(self, business_id: str, definition_id: str, revision: int) -> d.Definition | None:
        """A registered revision :meth:`load_definition` already keeps in memory, without a read; None otherwise.

        What a planner inside a transaction may use (it must not use the store).
        """
        return self._definitions.get((business_id, definition_id, revision))

    def _remember_head(self, key: tuple[str, str], head: int) -> None:
        """Keep the latest revision an admission's facts found for ``key`` (business, definition), as a prediction."""
        if key not in self._heads and len(self._heads) >= DEFINITION_CACHE:
            self._heads.clear()
        self._heads[key] = head

    def _remember_definition(self, key: tuple[str, str, int | None], definition: d.Definition) -> None:
        """Keep a registered revision, found by its number, in memory (it never changes)."""
        if len(self._definitions) >= DEFINITION_CACHE:
            self._definitions.clear()
        self._definitions[key] = definition

    # --- events, approvals, timers -------------------------------------------------

    def publish_event(self, event: Event, authority: p.Authority) -> PublishResult:
        """Commit ``event`` and wake every waiter it matches exactly, in one transaction.

        Seed 000, wait_for_event: 'if the waiter commits first, the Event
        publication/wake path evaluates committed wait registrations before
        releasing'.  Republishing the same Event is idempotent; the same
        identity with other content is refused (StoreError ``event_conflict``).

        The payload is held to the bounds of publication here as well as by
        ``Event.build`` (kernel ``checked_payload``, :class:`EventError`
        ``invalid_event``, the same message), before anything is read: an
        Event made directly cannot be stored past what a waiter reads.  The
        same content as an Event stored before the bound is refused too, not
        answered as a duplicate (specs/interpreter.md, Events: "Publishing
        such an Event's identity again is a new publication").
        """
        checked_payload(event.payload)
        if not authority.granted:
            raise StoreError("not_authorized", f"{authority.principal_id!r} may not publish events")

        def decide(tx: Backend, now: datetime) -> _Written:
            existing = tx.load_event(event.event_id)
            if existing is not None:
                if not existing.same_content(event):
                    raise StoreError(
                        "event_conflict",
                        f"event {event.event_id!r} was already published with other content; an Event is immutable",
                    )
                return _Written(PublishResult(event.event_id, True, ()))
            tx.insert_event(event, now)
            woken: list[str] = []
            candidates = [
                r for r in tx.waiting_registrations(event.business_id, event.event_type)
                if matches(r.spec, r.business_id, event)
            ]
            for registration in sorted(candidates, key=lambda r: r.key.execution_id):
                tx.lock(registration.key.execution_id)
                execution, dispatch = tx.load(registration.key.execution_id)
                # A waiter whose rows are damaged fails the publication, naming it, rather than being
                # passed over: the Event would commit without the wake it owes that execution, and once
                # repaired it would wait for an Event already published (nothing is lost).
                with _rows_of(registration.key.execution_id):
                    outcome = p.wake(
                        execution,
                        dispatch,
                        tx.load_registration(registration.key),
                        p.WakeRequest(
                            key=registration.key,
                            reason=p.WakeReason.EVENT,
                            source_id=event.event_id,
                            business_id=event.business_id,
                            authority=authority,
                            event_type=event.event_type,
                            correlation=projection(registration.spec, event),
                        ),
                        now,
                    )
                if isinstance(outcome, p.Decision):
                    items = list(_completed_by_event(tx.load_evidence(registration.key.attempt_id), event))
                    _apply(tx, outcome, items, now)
                    woken.append(registration.key.execution_id)
            return _Written(PublishResult(event.event_id, False, tuple(woken)))

        result = self._run(decide, topic=(event.business_id, event.event_type))
        assert isinstance(result, PublishResult)
        return result

    def decide_approval(self, decision: approvals.ApprovalDecision) -> approvals.DecideOutcome | p.Decision:
        """A reviewer's Decision: the first committed determination wakes the waiter with its continuation."""

        def decide(tx: Backend, now: datetime) -> p.Outcome | _Written:
            stored = tx.load_evidence(decision.request_id)
            if stored is None or stored.kind != approvals.APPROVAL_REQUEST:
                return _Written(approvals.decide(None, 0, None, decision))
            request = approvals.ApprovalRequest.from_json(stored.body)
            tx.lock(request.execution_id)
            stored = tx.load_evidence(decision.request_id)
            if stored is None:  # pruned with its ended execution while this waited for the lock
                return _Written(approvals.decide(None, 0, None, decision))
            request = approvals.ApprovalRequest.from_json(stored.body)
            prior = tx.load_evidence(approvals.decision_object_id(request.request_id, decision.decision_id))
            result = approvals.decide(request, stored.revision, prior, decision)
            if isinstance(result, approvals.Recorded):
                if not tx.append_objects(request.execution_id, result.evidence, now):
                    raise _GuardFailed
                return _Written(result)
            if not isinstance(result, approvals.Accepted):
                return _Written(result)
            key = p.WaitKey(request.execution_id, request.node_id, request.attempt_id)
            execution, dispatch = tx.load(request.execution_id)
            registration = tx.load_registration(key)
            with _rows_of(request.execution_id):
                woke = p.wake(
                    execution,
                    dispatch,
                    registration,
                    p.WakeRequest(
                        key=key,
                        reason=p.WakeReason.DECISION,
                        source_id=decision.decision_id,
                        business_id=decision.business_id,
                        authority=decision.authority,
                        event_type=None if registration is None else registration.spec.event_type,
                        correlation=() if registration is None else registration.spec.correlation,
                        outcome=decision.determination,
                    ),
                    now,
                )
            if not isinstance(woke, p.Decision):
                # Not waiting any more (cancelled, timed out): nothing is recorded.
                return _Written(woke)
            outputs = {
                "determination": decision.determination,
                "reviewer": decision.reviewer_id,
                "decision_id": decision.decision_id,
            }
            wake_items = _wake_evidence(tx, key, p.WakeReason.DECISION, decision.decision_id, outputs)
            _apply(tx, woke, [*result.evidence, *wake_items], now)
            return _Written(woke)

        return self._run(decide)  # type: ignore[return-value]

    def due_wakes(self, limit: int = 100, *, business_id: str | None = None) -> list[p.WaitKey]:
        """Registrations whose one-time UTC wake is due now, earliest first (of one Business, when given)."""

        def decide(tx: Backend, now: datetime) -> _Written:
            return _Written(tx.due_registrations(now, limit, business_id))

        result = self._run(decide)
        assert isinstance(result, list)
        return result

    def fire_timer(self, key: p.WaitKey, authority: p.Authority) -> p.Outcome:
        """A due one-time wake: a declared timeout is its own wake reason, never a matching Event."""

        def decide(tx: Backend, now: datetime) -> p.Outcome | _Written:
            registration = tx.load_registration(key)
            execution, dispatch = tx.load(key.execution_id)
            reason = (
                p.WakeReason.TIMEOUT if registration is not None and registration.spec.timeout else p.WakeReason.TIMER
            )
            source = f"{key.attempt_id}/{reason.value}"
            outcome = p.wake(
                execution,
                dispatch,
                registration,
                p.WakeRequest(key, reason, source, execution.business_id if execution else "unknown", authority),
                now,
            )
            if not isinstance(outcome, p.Decision):
                return outcome
            items = _wake_evidence(tx, key, reason, source, {"timed_out": reason == p.WakeReason.TIMEOUT})
            assert registration is not None  # wake() decided on it
            # An approval's registration names its request: the request a timeout closes.
            request_id = dict(registration.spec.correlation).get("request_id")
            if request_id is not None:
                items += approvals.closed_by_timeout(tx.load_evidence(request_id), reason.value)
            _apply(tx, outcome, items, now)
            return _Written(outcome)

        return self._one(decide, lock=key.execution_id)


__all__ = [
    "MAX_COMPOSED",
    "RETRYABLE_STORE_CODES",
    "RIDE_OUT_SECONDS",
    "STOP_TAKE_UP_WAITS",
    "Backend",
    "Clock",
    "Composed",
    "Evidence",
    "ExecutionView",
    "ManualClock",
    "NextClaim",
    "NextVisit",
    "Planner",
    "PublishResult",
    "Store",
    "StoreError",
    "StorePatience",
    "SystemClock",
    "TransactionalStore",
    "VisitView",
    "checked_again_if_lost",
    "definition_object_id",
    "evidence_revision_conflict",
    "registration_conflict",
    "tried_before_stop",
]
