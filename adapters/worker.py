"""The dispatcher pass: claim eligible executions in order and interpret them under their leases.

The workflow execution contract (seed 000: Dispatcher Pass; Lease; Node Semantics).
Rules of this module:

- The worker decides nothing.  For every visit it takes the execution's
  durable objects as the last decision committed them (the claim and each
  step hand back the view their own transaction wrote; otherwise it reads
  them), asks the pure interpreter (``kernel.interpreter``) for a
  plan, asks the AuthorityPolicy the questions the plan needs, and hands the
  plan to the store as protocol requests under its lease credential.  The
  store applies each under its guard, in one transaction, or not at all.
- A visit that calls no handler (a condition, an end) is planned inside the
  transaction of the claim or step before it and joins it (specs/protocol.md,
  "Composed decisions"): the kernel decides it on the rows that transaction
  wrote, under its own guard, and the transaction commits both or neither.
  A visit that calls a handler joins with its Command's intent only, which
  ends the transaction; the handler is called after it commits, outside
  every transaction.  Until that Command's result is committed,
  :meth:`Worker.holds_command` tells a stopping worker's hook not to hand
  the lease back.
- A pass first fires due one-time wakes (while every pass finds work, at
  most once per ``timer_interval``; a pass that finds none always looks),
  then claims eligible executions in the store's order (eligible_at, then id) and drives each until it leaves
  running.  Where the store composes claims, a step that finalizes its execution may make the pass's next
  claim in its own transaction (offered while the pass would claim again, is not stopping and, in a loop of
  one-claim passes, for ``timer_interval``); the pass drives that execution next, as its own claim.  So may
  a claim whose transaction finalizes its execution, up to :data:`CLAIMS_PER_TRANSACTION` executions in all,
  each claimed after the one before finalized, offered on the same terms, and only while the last
  execution this worker claimed was finalized in its claim's transaction too (otherwise the offer would
  lock candidates for nothing).  One node
  visit is one step; renewal is not a step.  At 100
  steps the interpreter suspends the execution with reason ``step_limit``;
  nothing here resets the count or creates another execution.
- Any refusal ends the worker's work on that execution at once: a refused
  request means the lease expired, was replaced, or the rows moved on, and
  a fenced worker must not try anything else.  The refusal is reported.
- A Command is issued only after its attempt and envelope are committed
  under the lease, and its result is committed with the visit's step.  A
  handler that raises is treated as UNKNOWN: the work may have happened.
  So is one interrupted by KeyboardInterrupt or SystemExit, which the
  worker raises again once that UNKNOWN is committed.
- A KeyboardInterrupt or SystemExit that lands anywhere else while the
  worker holds a lease (after its claim, planning, between decisions)
  hands the lease back (``release``, running -> eligible) before it is
  raised, so that the execution continues at once rather than when its
  lease expires and a sweep sends it to review.  Never while a Command's
  intent may be committed without its result (:meth:`Worker.holds_command`,
  set from the moment a transaction may commit the intent): that lease is
  left to expire, for quarantine and reconciliation (seed 000, Lease: "A
  process crash leaves the lease to expire").
- One that lands inside the claim call, after its transaction committed
  and before the worker holds the credential it returns, is handled the
  same way: the worker asks the store which execution runs under the token
  it asked for (``leased_to``, read on that way out, and by the next pass
  after a claim of unknown outcome, below) and hands that lease back.
  What is left to expire: a lease whose claim composed a Command's
  intent, as above; and one the store could not name
  (it was down, or is a wrapper without ``leased_to``), whose execution a
  quarantine sweep sends to review once the lease has run out, nothing
  lost or run twice.
- A decision whose outcome the store could not report (its connection was
  lost: a retryable ``StoreError``) may have committed or not; one a lock
  or a busy file failed (the other retryable codes) wrote nothing, and is
  treated the same, the read telling.  The worker remembers what it held
  (:class:`_Unfinished`) and raises; the next pass, once the store answers
  again, starts with it before claiming anything: it reads the execution
  afresh and goes on only where the read shows it running under this very
  lease (a claim of unknown outcome is looked up by its token,
  ``leased_to``, and so is a claim a step of unknown outcome was offered,
  after the stepped execution).  A Command's handler is called there only for the intent
  this worker planned, which the read shows committed and unsettled, and
  whose handler it has not called; a handler's answer still in hand is
  committed, never asked for again.  Anything else is planned afresh from
  the read, where an unsettled Command goes to reconciliation as after a
  crash.  A lease found expired is left to the quarantine sweep, and said
  (``lapsed``).  Every write is still a decision under the lease's guard, so a
  lease that expired or was replaced meanwhile is refused as always; what
  this saves is the wait for the lease to run out and the operator's
  review after it (specs/protocol.md, "A decision of unknown outcome").
- The lease is renewed when less than half of it remains before a visit.
- A claim whose candidate's row is malformed (it names a revision with no
  stored body, or a body that is no execution revision: edited by hand or
  damaged) has written nothing, and the worker claims again passing over
  that execution, so one damaged row never stalls the queue.  It is
  reported once per worker (``PassReport.malformed``, and a ``malformed``
  event) and passed over for a lease, then twice as long each time it is
  still malformed, at most :data:`MALFORMED_PAUSE_LIMIT`: a row repaired
  meanwhile is claimed again by a new worker at once, and by this one when
  its pause ends.  Nothing is ever written for the row; the kernel never
  decides on it (it is the store's error, not a decision).
- A lease shorter than :data:`MIN_LEASE`, or not shorter than
  :data:`MAX_LEASE`, is refused when the worker is made
  (:class:`WorkerSettingError`), and so is a process asking for more than
  :data:`MAX_CONCURRENCY` workers: settings that cannot work are an error,
  never executions claimed and left to expire.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import attrs

from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition
from fencekeeper.kernel.machines import ExecutionState

from .ports import SYSTEM_PRINCIPAL, WORKFLOW_DISPATCH, AuthorityPolicy, CommandHandler, ask
from .store import (
    RETRYABLE_STORE_CODES,
    Composed,
    NextClaim,
    NextVisit,
    StoreError,
    TransactionalStore,
    VisitView,
    tried_before_stop,
)

MIN_LEASE: Final = timedelta(seconds=1)
"""The shortest lease a worker takes.

A lease must outlast one claim-and-visit cycle: the claim's commit, reading
the execution and committing the node visit, which take milliseconds on a
healthy store.  The worker renews when less than half the lease is left
before a visit, so below a second the ordinary jitter of a loaded machine (an
fsync, a garbage-collector pause, a scheduler stall) eats that half: work is
claimed and its lease expires before the first commit, so every visit is
refused and the execution waits, stranded, for a quarantine sweep.  The
default is 30 seconds; a lease should also be well above the longest Command
a handler runs between renewals."""

MAX_CONCURRENCY: Final = 64
"""The most workers (threads) one process runs.

Each is a thread of one Python process sharing one interpreter lock and the
store's connections (``--concurrency`` + 1 to PostgreSQL, whose default
``max_connections`` is 100; SQLite serializes every write anyway): beyond a
few dozen, threads only queue for those.  Run more processes instead."""

CLAIMS_PER_TRANSACTION: Final = 4
"""The most executions one claim's transaction takes, where the store composes claims: the claim, and
the claims it is offered to make after its finalize, each after the one before finalized its execution.

Each one after the first saves its own transaction (BEGIN, COMMIT, an exchange, the claim's reads):
about three quarters of a one-node execution's work on PostgreSQL.  Offered only while the worker's
last claim was finalized in its claim's transaction, so two-node work never locks candidates for
nothing; each one made is a claim of the pass, within its ``max_claims``, but for a caller that
``continues``, whose pass may claim up to three more.  Four keeps a transaction's row locks brief (its
executions call no handler) and leaves the rest of the queue to the other workers."""


MALFORMED_PAUSE_LIMIT: Final = timedelta(hours=1)
"""The longest a worker passes over an execution whose row it found malformed before its claim may meet it again.

The first pause is the worker's lease; each time the row is still
malformed it doubles, up to this.  A worker started after the row is
repaired claims it at once."""

_MALFORMED_REMEMBERED: Final = 1000
"""Malformed rows a worker passes over at most: past that, the oldest are forgotten (and met again)."""


class WorkerSettingError(ValueError):
    """A worker setting outside its bounds; ``field`` names it and the message says the bound and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


MAX_LEASE: Final = timedelta(days=366)
"""A lease must be shorter than this (``fencekeeper worker --lease`` says "under a year").

A worker that stops without releasing holds its execution for the whole
lease; and one long enough to carry the expiry past the last datetime has
every claim refused by the kernel, which a worker passes over as a lost
race: it ran and claimed nothing, without a word.
"""


def check_lease(lease: timedelta) -> timedelta:
    """``lease`` if a worker may take it; WorkerSettingError('lease') otherwise."""
    if not isinstance(lease, timedelta):
        raise WorkerSettingError("lease", f"must be a timedelta, got {type(lease).__name__}")
    if lease >= MAX_LEASE:
        raise WorkerSettingError("lease", f"must be under a year ({MAX_LEASE.days} days), got {lease}")
    if lease < MIN_LEASE:
        raise WorkerSettingError(
            "lease",
            f"{lease.total_seconds():g} s is below the minimum of {MIN_LEASE.total_seconds():g} s: a shorter lease "
            "expires before a visit can commit, leaving claimed work stranded until a quarantine sweep",
        )
    return lease


def check_concurrency(concurrency: int) -> int:
    """``concurrency`` if one process may run that many workers; WorkerSettingError('concurrency') otherwise."""
    if not isinstance(concurrency, int) or isinstance(concurrency, bool):
        raise WorkerSettingError("concurrency", f"must be a whole number, got {concurrency!r}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise WorkerSettingError(
            "concurrency",
            f"must be between 1 and {MAX_CONCURRENCY}, got {concurrency}: more threads in one process only "
            "queue for its interpreter lock and the store's connections; run more processes instead",
        )
    return concurrency


def _valid_lease(instance: Any, attribute: Any, value: timedelta) -> None:
    check_lease(value)


@attrs.frozen
class Refused:
    """A refusal the worker met on an execution: its code and message (the worker stopped work on it)."""

    execution_id: str
    code: str
    message: str


@attrs.define
class PassReport:
    """What one dispatcher pass did."""

    claimed: list[str] = attrs.field(factory=list)
    steps: int = 0
    timers_fired: int = 0
    finished: Counter[str] = attrs.field(factory=Counter)
    """Per state an execution left running for (waiting, succeeded, ...)."""
    refused: list[Refused] = attrs.field(factory=list)
    renewals: int = 0
    """Leases renewed (renewal is not a step)."""
    claim_seconds: list[float] = attrs.field(factory=list)
    """How long each claim that found work took, store round trips included: the claim latency.

    The claim's whole transaction, with the visits composed into it (a condition, an end, the next
    Command's intent; the handler is never inside it)."""
    malformed: list[Refused] = attrs.field(factory=list)
    """Executions passed over because their stored row is malformed (code ``malformed_row``, the store's
    message): nothing was written for them, and they stay eligible until the row is repaired."""


@attrs.frozen
class _Pause:
    """How long a malformed row is passed over: until ``until`` (the worker's process clock), for ``length`` s."""

    until: float
    length: float


@attrs.frozen
class _Pending:
    """A Command this worker planned: its intent, under ``execution``'s revision, and its handler's answer once called."""

    execution: p.Execution
    invoke: i.Invoke
    authority: p.Authority
    settled: i.Step | i.Finish | None = None
    """What the handler's answer commits; None until the handler has been called."""


@attrs.frozen
class _Unfinished:
    """The lease a worker may still hold after a decision of unknown outcome, to take up on its next pass.

    ``execution_id`` and ``credential`` are None when the claim itself is
    what failed: only the token it asked with is known, and the store is
    asked which execution, if any, runs under it.
    """

    lease_token: str
    execution_id: str | None = None
    credential: p.LeaseCredential | None = None


@attrs.frozen
class WorkerEvent:
    """One line of a worker's timeline, as data: what the structured log writes and metrics may count.

    ``what`` is ``claimed``, ``renewed``, ``command``, ``step``, ``timer``,
    ``refused``, or the state an execution left running for (``waiting``,
    ``succeeded``, ...).  ``fence`` is the fence of the lease the worker
    held, when it held one; ``code`` is the refusal code of a ``refused``
    event, or the error code a finalization recorded.
    """

    worker_id: str
    execution_id: str
    what: str
    detail: str
    fence: int | None = None
    code: str | None = None
    node_id: str | None = None
    """The node visited (``command``, ``step`` and finishing events)."""


class _Bookkeeping:
    """A worker's own state between and within visits, set several times a visit.

    A plain class with slots, not a field of the attrs :class:`Worker`:
    ``attrs.define`` sends every assignment to a Worker attribute through its
    ``on_setattr`` hook (which validates ``lease``), a Python call or a caught
    ``KeyError`` per assignment; a dozen a visit were about 1% of a two-node
    execution's CPU in the worker.
    """

    __slots__ = (
        "answered",
        "carried",
        "chained",
        "claims_finish",
        "compose_until",
        "holding",
        "intent",
        "interrupted",
        "lease",
        "next_claim",
        "offered",
        "queue_busy",
        "timers_looked_at",
        "unfinished",
        "unfinished_claim",
    )

    def __init__(self) -> None:
        self.queue_busy: bool = False
        """Whether the last pass stopped at its claim limit with work possibly left (timers are then looked at less often)."""
        self.holding: str | None = None
        """The execution whose Command's intent may be committed, until its result's transaction returns.

        Set before the transaction that may commit the intent (a composed one, when its planner plans it;
        ``append_evidence``), so that an interruption inside it, committed or not, counts as holding."""
        self.timers_looked_at: float = 0.0
        """When the due timers were last looked for (the process clock)."""
        self.interrupted: BaseException | None = None
        """A KeyboardInterrupt or SystemExit that came while the handler ran, raised again after the visit."""
        self.unfinished: _Unfinished | None = None
        """The lease of a decision whose outcome the store could not report: the next pass takes it up first."""
        self.carried: PassReport | None = None
        """The report of a pass a lost connection ended with a lease to take up: the next pass goes on with it."""
        self.intent: _Pending | None = None
        """The last Command whose intent this worker sent and whose handler it has not called."""
        self.answered: _Pending | None = None
        """The last Command whose handler answered and whose result's transaction has not returned."""
        self.next_claim: NextClaim | None = None
        """The claim this pass makes next, while it drives an execution: a store that reads ahead may send
        its locking read behind the COMMIT of the transaction that finishes this one (:class:`NextClaim`)."""
        self.lease: tuple[str, str] | None = None
        """The execution this worker drives and the lease token it holds it by (its claim's, or a take-up's)."""
        self.offered: p.ClaimRequest | None = None
        """The claim offered to the step's transaction in flight, to make after its finalize (a store that
        ``composes_claims``): an interruption or a lost answer there may have committed it."""
        self.chained: list[tuple[Composed, p.ClaimRequest]] = []
        """The claims a transaction made after a finalize, and their visits, each with the request offered for
        it, in order: the pass drives them next."""
        self.unfinished_claim: list[str] = []
        """The lease tokens of such claims whose answer was lost, in order: taken up after :attr:`unfinished`."""
        self.claims_finish: bool = False
        """Whether the last execution this worker claimed was finalized in its claim's transaction: its next
        claim is then offered claims after, where the store composes claims (one-node work, say)."""
        self.compose_until: float = 0.0
        """Until when (the process clock) a pass that ``continues`` lets a step's transaction claim next:
        its timer_interval, after which the next pass looks at due timers."""


@attrs.define
class Worker:
    """One worker: claims eligible executions and drives each under its lease until it leaves running.

    It decides nothing (see the module's rules); ``on_event`` receives its live timeline.
    """

    store: TransactionalStore
    worker_id: str
    policy: AuthorityPolicy
    handler: CommandHandler
    lease: timedelta = attrs.field(default=timedelta(seconds=30), validator=_valid_lease)
    business_id: str | None = None
    make_token: Callable[[], str] = lambda: secrets.token_hex(16)
    on_event: Callable[[str, str, str], None] | None = None
    """Called with (execution_id, what, detail) for every visit and refusal: the live timeline."""
    on_record: Callable[[WorkerEvent], None] | None = None
    """Called with the same timeline as structured records (the JSON log)."""
    stopping: Callable[[], bool] = lambda: False
    """True once the worker is asked to stop.  From then on every visit reads the execution afresh
    instead of planning from the view the last decision handed back: a stopping worker's
    ``on_event`` hook hands the lease back after a committed visit (``fencekeeper worker`` and
    ``client.WorkerPool`` do), and the visit must then see the execution eligible, not plan on.
    A pass claims nothing more once the execution it drives leaves its hands."""
    timer_interval: float = 1.0
    """Seconds between due-timer lookups while every pass finds work (see :meth:`run_pass`).

    The lookup is a hint (each timer found is fired by a decision that
    checks it is due); this bounds how late a busy worker notices one."""
    monotonic: Callable[[], float] = time.monotonic
    """The process clock that paces the lookups; never the time of a decision."""
    _at: _Bookkeeping = attrs.field(factory=_Bookkeeping, init=False)
    """What the worker holds between and within visits (see :class:`_Bookkeeping`)."""
    _passing_over: dict[str, _Pause] = attrs.field(factory=dict, init=False)
    """Executions whose row this worker found malformed, with how long it passes over each."""

    def _tell(
        self,
        execution_id: str,
        what: str,
        detail: str,
        *,
        fence: int | None = None,
        code: str | None = None,
        node_id: str | None = None,
    ) -> None:
        if self.on_event is not None:
            self.on_event(execution_id, what, detail)
        if self.on_record is not None:
            self.on_record(WorkerEvent(self.worker_id, execution_id, what, detail, fence, code, node_id))

    def fire_due_timers(self, report: PassReport) -> None:
        """Fire every due one-time wake (as the timer principal), counting them in ``report``.

        A waiting execution whose row is malformed is passed over as a claim passes over one.
        """
        skip = self._skipped() if self._passing_over else frozenset()
        for key in self.store.due_wakes(business_id=self.business_id):
            if key.execution_id in skip:
                continue
            try:
                authority = ask(self.policy, SYSTEM_PRINCIPAL, self._business_of(key.execution_id), WORKFLOW_DISPATCH)
                outcome = self.store.fire_timer(key, authority)
            except StoreError as exc:
                if _malformed(exc) != key.execution_id:
                    raise
                self._pass_over(key.execution_id, exc.message, report)
                skip = skip | {key.execution_id}
                continue
            if isinstance(outcome, p.Decision):
                report.timers_fired += 1
                self._tell(key.execution_id, "timer", outcome.evidence[-1].reason)

    def _business_of(self, execution_id: str) -> str:
        view = self.store.read_for_visit(execution_id)
        return view.execution.business_id if view is not None else ""

    def run_pass(self, *, max_claims: int | None = None, continues: bool = False) -> PassReport:
        """One bounded pass: due timers, then every eligible execution (at most ``max_claims``).

        ``continues``: the caller runs the next pass at once when this one
        claims (a worker's loop).  Its last claim may then read the next
        one ahead, as every claim before it in the pass may, where the store
        does (:class:`~fencekeeper.adapters.store.NextClaim`); the next pass's
        claim uses it, and anything else the worker asks of the store first
        rolls it back.  A caller that stops calling says so with
        :meth:`drop_read_ahead`.

        The due-timer lookup is skipped at the start of a pass only while
        the queue is busy: the previous pass stopped at ``max_claims`` with
        work possibly left, and the last lookup is less than
        ``timer_interval`` seconds old.  A pass that then finds the queue
        empty looks before it ends, so a pass that reports nothing claimed
        and no timer fired has always looked.
        """
        # A lease this worker may still hold, ticking: before any timer or claim.
        report = self.take_up()
        looked = False
        if not self._at.queue_busy or self.monotonic() - self._at.timers_looked_at >= self.timer_interval:
            self._look_for_timers(report)
            looked = True
        self._at.queue_busy = False
        skip = self._skipped() if self._passing_over else frozenset()
        reads_ahead = _reads_ahead(self.store)
        going_on = False
        try:
            going_on = self._claim_all(report, skip, looked, max_claims, reads_ahead=reads_ahead, continues=continues)
        finally:
            self._at.next_claim = None
            if not going_on:
                # A claim read ahead behind this pass's last COMMIT will not be made (the pass stopped, or failed).
                self.drop_read_ahead()
        return report

    def drop_read_ahead(self) -> None:
        """Roll back a claim this worker's thread read ahead and will not make (see ``continues``); nothing was written."""
        if _reads_ahead(self.store):
            self.store.drop_read_ahead()  # type: ignore[attr-defined]

    def _claim_all(
        self,
        report: PassReport,
        skip: frozenset[str],
        looked: bool,
        max_claims: int | None,
        *,
        reads_ahead: bool,
        continues: bool,
    ) -> bool:
        """:meth:`run_pass`'s claims: each eligible execution in turn, driven, until none is left or ``max_claims``.

        Returns whether the pass stopped at ``max_claims`` for a caller that ``continues``: a claim
        read ahead behind its last COMMIT is then the next pass's.

        A claim that a step's transaction made after its finalize (``chained``, a store that
        ``composes_claims``) is driven next, as a claim of this pass: it was offered only while the pass
        would claim again, and, for a caller that ``continues``, for ``timer_interval`` seconds, after
        which the next pass looks at due timers.
        """
        self._at.compose_until = self.monotonic() + self.timer_interval if continues else math.inf
        chained: tuple[Composed, p.ClaimRequest] | None = None
        while chained is not None or max_claims is None or len(report.claimed) < max_claims:
            started = time.perf_counter()
            # The claim after this one, when there will be one: a store that reads ahead may send its locking
            # read with the COMMIT that finishes this execution (NextClaim).  A hint, never a decision.
            then = (
                NextClaim(self.business_id, skip, chain=CLAIMS_PER_TRANSACTION)
                if reads_ahead and (continues or max_claims is None or len(report.claimed) + 1 < max_claims)
                else None
            )
            if chained is not None:
                # Claimed by the transaction of the execution before, after its finalize, its visits committed with it.
                composed, request = chained
                chained = None
            else:
                request = p.ClaimRequest(self.worker_id, self.make_token(), self.lease)
                # As many as the pass would claim besides this one: all it may, for a caller that continues.
                room = CLAIMS_PER_TRANSACTION - 1
                if max_claims is not None and not continues:
                    room = min(room, max_claims - len(report.claimed) - 1)
                offered = self._offers(then, room) if self._at.claims_finish else ()
                try:
                    # ``skip`` only while there is something to pass over: a store that wraps another
                    # (a ledger, a proxy) and predates it is then called exactly as before; ``next_claim``
                    # only to a store that reads ahead.
                    extra: dict[str, Any] = {"skip": skip} if skip else {}
                    if then is not None:
                        extra["next_claim"] = (
                            attrs.evolve(then, request=offered[0], more=offered[1:]) if offered else then
                        )
                    composed = self.store.claim_and_visit(
                        request, self._plan_next, business_id=self.business_id, **extra
                    )
                except (KeyboardInterrupt, SystemExit) as exc:
                    # Inside the claim: its transaction may have committed, and only the store knows what
                    # it claimed, and claimed after its finalizes.  Looked up by the tokens asked for.
                    try:
                        for made in (request, *offered):
                            self._let_go_of_claim(made, exc)
                    finally:
                        self._at.holding = None
                    raise
                except StoreError as exc:
                    if exc.code in RETRYABLE_STORE_CODES:
                        # The claim may have committed: the next pass asks the store what runs under its
                        # token, and then under the tokens of the claims offered after its finalizes.
                        self._at.unfinished = _Unfinished(request.lease_token)
                        self._at.unfinished_claim = [made.lease_token for made in offered]
                        self._carry(report, exc)
                        raise
                    # The claim met a damaged row at the head of the queue and wrote nothing; claimed
                    # again without it, the rest of the queue runs.  (One already passed over means a
                    # store that ignores ``skip``: its error goes to the caller, as it always did.)
                    passed = _malformed(exc)
                    if passed is None or passed in skip:
                        raise
                    self._pass_over(passed, exc.message, report)
                    skip = skip | {passed}
                    continue
                # Claimed after this claim's finalize, each after the one before's, their visits committed
                # with it: driven next, in order.
                self._at.chained.extend(zip(composed.claimed_after, offered, strict=False))
            outcome = composed.outcome
            if outcome is None:
                if not looked:
                    self._look_for_timers(report)
                break
            if not isinstance(outcome, p.Decision) or outcome.lease is None or outcome.execution is None:
                break
            self._at.claims_finish = composed.finished
            execution_id = outcome.execution.execution_id
            self._at.holding = execution_id if _issues_a_command(composed.followed) else None
            self._at.lease = (execution_id, outcome.lease.lease_token)
            try:
                report.claim_seconds.append(time.perf_counter() - started)
                if self._passing_over:
                    self._passing_over.pop(execution_id, None)  # repaired: met afresh if damaged again
                report.claimed.append(execution_id)
                self._tell(
                    execution_id,
                    "claimed",
                    f"fence {outcome.lease.fence}, token {outcome.lease.lease_token[:8]}",
                    fence=outcome.lease.fence,
                )
            except (KeyboardInterrupt, SystemExit) as exc:
                # Between the claim and the visit (a hook's output, say): the lease is this worker's, and so
                # is the one its transaction claimed after the finalize, if any.
                self._let_go(execution_id, outcome.lease, exc)
                self._let_go_of_chained(exc)
                self._at.holding = None
                raise
            try:
                try:
                    self._at.next_claim = then
                    self.drive(execution_id, outcome.lease, report, composed.view, composed.followed)
                except StoreError as exc:
                    self._carry(report, exc)
                    # Damaged while this worker drove it: the decision that met it wrote nothing, and
                    # the lease runs out as a stopped worker's does.  The queue goes on without it.
                    if _malformed(exc) != execution_id:
                        raise
                    self._pass_over(execution_id, exc.message, report)
                    skip = skip | {execution_id}
                finally:
                    self._at.next_claim = None
            except BaseException:
                leftover, self._at.chained = self._at.chained, []
                # Claimed by a transaction this visit committed, or the claim's, and not driven: a next pass
                # takes each up.
                self._at.unfinished_claim.extend(made.lease_token for _, made in leftover)
                raise
            chained = self._at.chained.pop(0) if self._at.chained else None
            if chained is not None:
                # Claimed already: driven even by a stopping worker, whose hook hands it back after its visit.
                continue
            if self.stopping():
                # Claim nothing more: a stopping worker's hook hands each lease back after the
                # visit, and the next claim would take the same execution again, endlessly.
                break
        else:
            self._at.queue_busy = True
            return continues
        return False

    def take_up(self) -> PassReport:
        """Go on with the lease a decision of unknown outcome left this worker, and nothing else (see the module's rules).

        Every pass starts with it.  A stopping worker's caller calls it on
        its own, so that a visit whose answer was lost is finished under its
        lease and handed back, rather than left to expire into review.  The
        report is the pass's that the loss ended, completed; StoreError
        while the store still fails, the lease still remembered.
        """
        # A pass a lost connection ended hands on what it did, so that nothing it did goes uncounted.
        report, self._at.carried = self._at.carried or PassReport(), None
        if self._at.unfinished is None and self._at.unfinished_claim:
            # A claim a transaction made after a finalize: only its token is known.
            self._at.unfinished = _Unfinished(self._at.unfinished_claim.pop(0))
        while self._at.unfinished is not None:
            try:
                self._take_up(report)
            except StoreError as exc:
                self._carry(report, exc)
                raise
            if self._at.unfinished is None and self._at.unfinished_claim:
                self._at.unfinished = _Unfinished(self._at.unfinished_claim.pop(0))
        return report

    def take_up_before_stop(self, sleep: Callable[[float], None] = time.sleep) -> PassReport | None:
        """A stopping worker's last look at a lease a lost answer left it (:meth:`take_up`); None if the store stays away.

        The visit is finished under the lease and a stop hook hands the
        lease back, as after any visit of a stopping worker.  A store still
        failing after :data:`~fencekeeper.adapters.store.STOP_TAKE_UP_WAITS`
        leaves the lease to expire, for the sweep: a stopping process does
        not wait out an outage.  Any other error is raised, as an error in a
        pass is.
        """
        return tried_before_stop(self.take_up, sleep)

    def _carry(self, report: PassReport, exc: StoreError) -> None:
        """Keep ``report`` for the next pass when ``exc`` left a lease to take up there."""
        if exc.code in RETRYABLE_STORE_CODES and (self._at.unfinished is not None or self._at.unfinished_claim):
            self._at.carried = report

    def _skipped(self) -> frozenset[str]:
        """The executions whose pause has not ended: the claims of this pass pass over them."""
        now = self.monotonic()
        return frozenset(execution_id for execution_id, pause in self._passing_over.items() if now < pause.until)

    def _pass_over(self, execution_id: str, message: str, report: PassReport) -> None:
        """Pass over ``execution_id``, whose row is malformed; reported in ``report``, and told the first time."""
        earlier = self._passing_over.pop(execution_id, None)
        lease = self.lease.total_seconds()
        length = lease if earlier is None else min(earlier.length * 2, MALFORMED_PAUSE_LIMIT.total_seconds())
        if len(self._passing_over) >= _MALFORMED_REMEMBERED:
            del self._passing_over[next(iter(self._passing_over))]
        self._passing_over[execution_id] = _Pause(self.monotonic() + length, length)
        report.malformed.append(Refused(execution_id, MALFORMED_ROW, message))
        if earlier is None:
            # Once per worker, not once per pass: the row is met again only after its pause.
            self._tell(
                execution_id,
                "malformed",
                f"{message}; this worker passes over it (and tries it again after {length:g} s, then less "
                f"often) until the row is repaired: `fencekeeper inspect {execution_id}` shows the error, "
                "`fencekeeper check` lists every damaged execution",
                code=MALFORMED_ROW,
            )

    def _look_for_timers(self, report: PassReport) -> None:
        self._at.timers_looked_at = self.monotonic()
        self.fire_due_timers(report)

    def drive(
        self,
        execution_id: str,
        credential: p.LeaseCredential,
        report: PassReport,
        view: VisitView | None = None,
        followed: Sequence[tuple[NextVisit, p.Outcome]] = (),
    ) -> None:
        """Visit nodes under ``credential`` until the execution leaves running or a request is refused.

        ``view`` is the execution as the claim's transaction committed it,
        and ``followed`` the visits composed into that transaction (they are
        reported first); after each step, the view and the visits of that
        step's transaction are used in the same way.  A visit reads the
        execution only when it has no view.
        """
        self._drive_guarded(execution_id, credential, report, view, followed, pending=None)

    def _drive_guarded(
        self,
        execution_id: str,
        credential: p.LeaseCredential,
        report: PassReport,
        view: VisitView | None,
        followed: Sequence[tuple[NextVisit, p.Outcome]],
        *,
        pending: _Pending | None,
    ) -> None:
        try:
            self._drive(execution_id, credential, report, view, followed, pending=pending)
        except StoreError as exc:
            if exc.code in RETRYABLE_STORE_CODES:
                # The decision in flight may have committed: the next pass reads what it did, and then
                # what runs under the claim offered to it, or made by it (a step's that claims next).
                self._at.unfinished = _Unfinished(credential.lease_token, execution_id, credential)
                self._at.unfinished_claim.extend(self._claim_in_doubt())
            raise
        except (KeyboardInterrupt, SystemExit) as exc:
            # Outside the handler (which records its own interruption, _invoke): planning, a hook,
            # a decision's call.  The lease is handed back when that is safe (_let_go).
            self._let_go(execution_id, credential, exc)
            offered, self._at.offered = self._at.offered, None
            if offered is not None:
                self._let_go_of_claim(offered, exc)
            self._let_go_of_chained(exc)
            raise
        finally:
            self._at.holding = None
            self._at.offered = None
            interrupted, self._at.interrupted = self._at.interrupted, None
            if interrupted is not None:
                # The caller asked to stop: that comes first, whatever failed after it as its context.
                raise interrupted

    def _drive(
        self,
        execution_id: str,
        credential: p.LeaseCredential,
        report: PassReport,
        view: VisitView | None,
        followed: Sequence[tuple[NextVisit, p.Outcome]],
        *,
        pending: _Pending | None,
    ) -> None:
        while True:
            issued: _Pending | None = None
            if pending is not None:
                # Taken up after a decision of unknown outcome (_take_up): the intent is committed.
                issued, pending = pending, None
                if (
                    issued.settled is None
                    and view is not None
                    and self._renewal_due(view, self.store.clock.now())
                    and not self._renewed(execution_id, credential, report)
                ):
                    # The outage may have used up much of the lease since the intent committed: its handler
                    # gets the half a lease every visit starts with, as the visit it belongs to did.  Refused
                    # (the lease ran out meanwhile, or is another's), it is never called: the intent is forgotten.
                    self._at.intent = None
                    return
            elif followed:
                going, issued = self._report_followed(execution_id, credential, report, followed)
                if not going:
                    return
            if issued is not None:
                # A committed intent: call its handler now, unless it has answered already.
                execution, authority = issued.execution, issued.authority
                settled = issued.settled if issued.settled is not None else self._call(issued)
            else:
                if view is None or self.stopping():
                    view = self.store.read_for_visit(execution_id)
                if view is None or view.execution.state != ExecutionState.RUNNING:
                    return
                if self._renewal_due(view, self.store.clock.now()) and not self._renewed(
                    execution_id, credential, report
                ):
                    return
                execution = view.execution
                definition = self.store.load_definition(
                    execution.business_id, execution.definition_id, execution.definition_revision
                )
                try:
                    plan, authority = self._plan(view, definition, credential, self.store.clock.now())
                except Exception as exc:
                    # The AuthorityPolicy raised or answered something that is no Authority: the
                    # deployment's fault, not the execution's.  Nothing of the visit was written; the
                    # lease is handed back, so that the execution is not left running until it expires,
                    # and the error goes to the worker's caller (`fencekeeper worker` exits 1 naming it).
                    self._hand_back(execution_id, credential, execution, exc)
                    raise
                if isinstance(plan, i.Invoke):
                    # Held from before the intent's commit: interrupted inside it, the intent may be committed.
                    self._at.holding = execution_id
                    self._at.intent = _Pending(execution, plan, authority)
                    outcome = self.store.append_evidence(execution_id, credential, plan.evidence)
                    if not self._applied(execution_id, outcome, report, "issue command", credential.fence):
                        self._at.intent = None
                        return
                    self._report_command(execution_id, execution, credential, plan)
                    settled = self._call(self._at.intent)
                else:
                    settled = plan
            if isinstance(settled, i.Finish):
                request = self._finalize_request(execution, credential, settled, authority)
                outcome = self.store.finalize(request, settled.evidence)
                self._at.holding = None
                self._at.answered = None
                if self._applied(execution_id, outcome, report, "finalize", credential.fence):
                    self._report_finish(execution_id, execution, credential, settled, report)
                return
            then = self._at.next_claim
            self._at.offered = next(iter(self._offers(then, 1)), None)
            if then is not None and self._at.offered is not None:
                # The step's transaction may claim this pass's next execution after the finalize, and its
                # visits: one transaction less (specs/protocol.md, "Composed decisions").
                then = attrs.evolve(then, request=self._at.offered)
            composed = self.store.record_step_and_visit(
                execution_id,
                p.StepRequest(credential, execution.revision, settled.step, authority),
                settled.evidence,
                self._plan_next,
                **({"next_claim": then} if then is not None else {}),
            )
            offered, self._at.offered = self._at.offered, None
            if composed.then is not None and offered is not None:
                # Claimed and its visits committed with this step: driven next by this pass (_claim_all).
                self._at.chained.append((composed.then, offered))
            self._at.answered = None
            self._at.holding = execution_id if _issues_a_command(composed.followed) else None
            assert composed.outcome is not None  # a step's transaction always decides
            if not self._applied(execution_id, composed.outcome, report, "step", credential.fence):
                return
            self._report_step(execution_id, credential, settled.step, report)
            view, followed = composed.view, composed.followed

    def _call(self, intent: _Pending) -> i.Step | i.Finish:
        """Call the handler of ``intent`` (its intent is committed) once, and keep its answer until it commits.

        Forgotten as the next intent before the call, so that no later pass
        ever calls it again; its answer is kept (``_answered``) until the
        transaction carrying it returns, so that a pass after a lost
        connection commits it instead of sending the execution to review.
        """
        self._at.intent = None
        settled = self._invoke(intent.invoke)
        self._at.answered = _Pending(intent.execution, intent.invoke, intent.authority, settled)
        return settled

    def _take_up(self, report: PassReport) -> None:
        """Go on with the lease a decision of unknown outcome left this worker, if the store shows it is.

        Reads first (raising, with the lease still remembered, while the
        store fails); then, only where the execution runs under this
        worker's very lease token: a Command's answer in hand is committed,
        an intent of this worker's that committed without its handler
        being called has it called, and anything else is planned afresh
        from the read.  Every write is decided under the lease, as always.
        """
        unfinished = self._at.unfinished
        assert unfinished is not None
        execution_id = unfinished.execution_id
        if execution_id is None:
            lookup = getattr(self.store, "leased_to", None)
            execution_id = None if lookup is None else lookup(self.worker_id, unfinished.lease_token)
        view = None if execution_id is None else self.store.read_for_visit(execution_id)
        self._at.unfinished = None
        if (
            execution_id is None
            or view is None
            or view.execution.state != ExecutionState.RUNNING
            or view.dispatch.lease_token != unfinished.lease_token
            or view.dispatch.leased_by != self.worker_id
            or view.dispatch.lease_expires_at is None
        ):
            # Not committed, finished, or no longer this worker's: nothing of it is left to do here.  A claim
            # found under no execution forgets nothing while the claim offered after its finalize is still to
            # be taken up: that claim's Command intent may be the one kept.
            if execution_id is not None or not self._at.unfinished_claim:
                self._forget_pending(execution_id)
            return
        if view.dispatch.lease_expires_at <= self.store.clock.now():
            # Still this worker's lease, run out while the store was away: the quarantine sweep's, as after a
            # crash.  Said, since nothing else tells an operator which execution now waits for the sweep.
            self._forget_pending(execution_id)
            self._tell(
                execution_id,
                LAPSED,
                f"the store was away past this lease's expiry ({view.dispatch.lease_expires_at.isoformat()}); "
                "nothing more is written under it: a quarantine sweep (`fencekeeper reconcile --quarantine`) "
                "sends the execution to review",
                fence=view.execution.fence,
            )
            return
        credential = unfinished.credential or p.LeaseCredential(
            self.worker_id, unfinished.lease_token, view.execution.fence
        )
        pending = next(
            (
                held
                for held in (self._at.answered, self._at.intent)
                if held is not None and i.intent_as_planned(held.invoke, held.execution, view.execution, view.evidence)
            ),
            None,
        )
        if pending is None:
            self._forget_pending(execution_id)
        if unfinished.execution_id is None:
            report.claimed.append(execution_id)
        # Before the event: a stopping worker's hook hands the lease back on it unless a Command is pending
        # (hands_back_after), instead of running the next visit first.
        self._at.holding = execution_id if pending is not None else None
        self._at.lease = (execution_id, credential.lease_token)
        self._tell(
            execution_id,
            "resumed",
            "the store answers again and the execution still runs under this lease"
            + ("" if pending is None else f"; Command {pending.invoke.command.command_id} "
               + ("is answered: its result is committed now" if pending.settled is not None
                  else "was not yet sent: it is sent now")),
            fence=credential.fence,
        )
        try:
            self._drive_guarded(execution_id, credential, report, view, (), pending=pending)
        except StoreError as exc:
            if _malformed(exc) != execution_id:
                raise
            self._pass_over(execution_id, exc.message, report)

    def _forget_pending(self, execution_id: str | None) -> None:
        """Forget the Command intent and answer kept for ``execution_id`` (every one kept, for None).

        A step's transaction that claimed next may leave two executions to
        take up after a lost answer, the stepped one and the one claimed,
        whose Command's intent it committed: taking up the first keeps the
        second's, so that its handler is called rather than reconciled.
        """
        def kept_for(held: _Pending | None) -> bool:
            return held is not None and execution_id in (None, held.execution.execution_id)

        if kept_for(self._at.intent):
            self._at.intent = None
        if kept_for(self._at.answered):
            self._at.answered = None

    def holds_unfinished(self) -> bool:
        """Whether a decision of unknown outcome left this worker a lease its next pass takes up first.

        A caller that makes a new worker after a StoreError instead of
        passing again with this one leaves that lease to expire into review.
        """
        return self._at.unfinished is not None or bool(self._at.unfinished_claim)

    def holds_command(self, execution_id: str) -> bool:
        """True while a Command this worker issued on ``execution_id`` (or may have) awaits its result's commit.

        A composed transaction may commit a Command's intent together with
        the claim or step before it, so the ``claimed`` or ``step`` event it
        reports comes before the handler runs.  A hook that hands the lease
        back on those events when the worker is stopping must not do so
        while this is True: the handler would then run under no lease, and
        its result could not be committed.  It is False again once the
        result's transaction has returned (its ``step`` event may hand the
        lease back as usual).
        """
        return self._at.holding == execution_id

    def lease_token_of(self, execution_id: str) -> str | None:
        """The lease token this worker holds ``execution_id`` by, as its claim or take-up gave it; None if it holds none.

        What a stopping worker's hook hands the lease back with
        (:meth:`hands_back_after`).  Not the last token the worker made: a
        step may be offered a claim with a token of its own (a store that
        composes claims) that it never uses.
        """
        lease = self._at.lease
        return lease[1] if lease is not None and lease[0] == execution_id else None

    def hands_back_after(self, execution_id: str, what: str) -> bool:
        """Whether a stopping worker's hook should hand ``execution_id``'s lease back after the event ``what``.

        After a committed claim or step (``claimed``, ``step``), or a lease
        taken up after a lost answer (``resumed``), once the worker is
        stopping, so that another worker continues at once; not while
        :meth:`holds_command`, since the Command's result comes next and its
        ``step`` hands the lease back then.  ``fencekeeper worker`` and
        ``WorkerPool`` both ask this, so they hand back at the same points.
        """
        return what in ("claimed", "resumed", "step") and self.stopping() and not self.holds_command(execution_id)

    def _let_go(self, execution_id: str, credential: p.LeaseCredential, exc: BaseException) -> None:
        """Hand back the lease of a visit a KeyboardInterrupt or SystemExit ended outside the handler, if safe.

        Not while :meth:`holds_command`: a Command's intent may be committed
        without its result, and releasing would make the execution eligible
        for a worker that plans the visit again without knowing whether the
        Command ran.  That lease expires, and quarantine sends the execution
        to review (seed 000, Lease).  Otherwise the execution is read afresh
        (the interruption may have come after a decision committed) and, if
        it is still running, released under ``credential``: the kernel's
        release refuses a lease that is no longer this worker's.  Any error
        on the way is dropped: the interruption is the one to raise.
        """
        if self.holds_command(execution_id):
            return
        try:
            view = self.store.read_for_visit(execution_id)
            if view is None or view.execution.state != ExecutionState.RUNNING:
                return
            outcome = self.store.release(execution_id, p.ReleaseRequest(credential, view.execution.revision))
        except Exception:
            return
        if isinstance(outcome, p.Decision):
            self._tell(
                execution_id, "released", f"interrupted by {type(exc).__name__}", fence=credential.fence
            )

    def _offers(self, then: NextClaim | None, count: int) -> tuple[p.ClaimRequest, ...]:
        """The ``count`` claims to offer a transaction that may finalize its execution, to make after it; () for none.

        Offered while the pass would claim again (``then``), the store composes
        claims, the worker is not stopping, and within the pass's
        ``compose_until``.  Each lease token is fresh, as every claim's.
        """
        if then is None or not _composes_claims(self.store) or self.stopping() or not self._may_compose():
            return ()
        return tuple(p.ClaimRequest(self.worker_id, self.make_token(), self.lease) for _ in range(count))

    def _may_compose(self) -> bool:
        """Whether a transaction may claim next now: within the pass's ``compose_until``."""
        return self.monotonic() < self._at.compose_until

    def _claim_in_doubt(self) -> list[str]:
        """The lease tokens of the claims a transaction was offered, or made, that no pass has driven yet.

        Asked when that transaction's answer, or a later one of the visit,
        was lost: the next pass asks the store what runs under each token.
        """
        offered, self._at.offered = self._at.offered, None
        chained, self._at.chained = self._at.chained, []
        return [made.lease_token for _, made in chained] + ([] if offered is None else [offered.lease_token])

    def _let_go_of_chained(self, exc: BaseException) -> None:
        """Hand back the claims a transaction made after a finalize, interrupted before they were driven, where safe.

        Not when a claim's transaction also committed its Command's intent
        (the handler is next): that lease expires, as after an interrupted
        claim whose transaction issued one (:meth:`_let_go`).  One whose
        execution the transaction finalized holds nothing to hand back.
        """
        chained, self._at.chained = self._at.chained, []
        for composed, _ in chained:
            outcome = composed.outcome
            if (
                isinstance(outcome, p.Decision)
                and outcome.lease is not None
                and outcome.execution is not None
                and not _issues_a_command(composed.followed)
                and not composed.finished
            ):
                self._let_go(outcome.execution.execution_id, outcome.lease, exc)

    def _let_go_of_claim(self, request: p.ClaimRequest, exc: BaseException) -> None:
        """Hand back the lease of a claim a KeyboardInterrupt or SystemExit interrupted, if it committed and it is safe.

        The claim's transaction may have committed before the interruption
        (inside the store's call, or on its way back): the worker then holds
        a lease it never saw.  The store is asked which execution runs under
        the token this claim asked for (``leased_to``); none, and the claim
        did not commit, or its composed visits finished the execution.  Found,
        it is released as :meth:`_let_go` releases, and not while a Command's
        intent may have been committed with it (the planner marked it held).
        A store without ``leased_to`` (a wrapper written before it), or one
        that fails to answer, leaves the lease to expire, as before: the
        execution is claimed again once a sweep has sent it to review.
        The caller forgets what the planner held once every claim of the
        transaction (its own, and one made after its finalize) is looked up.
        """
        try:
            lookup = getattr(self.store, "leased_to", None)
            execution_id = None if lookup is None else lookup(request.worker_id, request.lease_token)
            view = None if execution_id is None else self.store.read_for_visit(execution_id)
        except Exception:
            view = None
        if view is not None and view.dispatch.lease_token == request.lease_token:
            credential = p.LeaseCredential(request.worker_id, request.lease_token, view.execution.fence)
            self._let_go(view.execution.execution_id, credential, exc)

    def _hand_back(self, execution_id: str, credential: p.LeaseCredential, execution: p.Execution, exc: Exception) -> None:
        """Release the lease of a visit that could not be planned (``running -> eligible``), and say why."""
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        try:
            outcome = self.store.release(execution_id, p.ReleaseRequest(credential, execution.revision))
        except Exception:  # the planning error is the one to raise; the lease then expires
            return
        if isinstance(outcome, p.Decision):
            self._tell(execution_id, "released", f"the visit could not be planned: {why}", fence=credential.fence)

    def _invoke(self, plan: i.Invoke) -> i.Step | i.Finish:
        """Call the handler (its intent is committed), and what its result commits."""
        try:
            result = self.handler.execute(plan.command)
        except Exception as exc:
            result = i.CommandResult(i.CommandStatus.UNKNOWN, None, f"handler raised {exc!r}")
        except (KeyboardInterrupt, SystemExit) as exc:
            # Ctrl-C, or a signal handler's sys.exit, while the Command ran (where an interruption of
            # run_until_idle mostly lands): its outcome is unknown, as a handler's that raised.  Raised
            # at once, it left the execution running under this lease until the lease expired and a
            # quarantine sweep sent it to review; recorded first, the review can start now.  drive()
            # raises it again once the visit's finalization has returned.
            self._at.interrupted = exc
            result = i.CommandResult(i.CommandStatus.UNKNOWN, None, f"handler interrupted by {type(exc).__name__}")
        if not isinstance(result, i.CommandResult):
            # An answer that says nothing says no more than a handler that raised: the Command may have been
            # applied.  Left as it was, settle() raised AttributeError and the execution stayed running, leased.
            result = i.CommandResult(
                i.CommandStatus.UNKNOWN, None, f"handler returned {type(result).__name__}, not a CommandResult"
            )
        return i.settle(plan, result)

    def _report_command(
        self, execution_id: str, execution: p.Execution, credential: p.LeaseCredential, plan: i.Invoke
    ) -> None:
        self._tell(
            execution_id,
            "command",
            f"{plan.command.operation} as {plan.command.command_id}",
            fence=credential.fence,
            node_id=execution.current_node_id,
        )

    def _renewed(self, execution_id: str, credential: p.LeaseCredential, report: PassReport) -> bool:
        """Renew the lease for a whole ``self.lease``; whether it was (a refusal is reported, and the visit ends)."""
        renewed = self.store.renew(execution_id, p.RenewRequest(credential, self.lease))
        if not self._applied(execution_id, renewed, report, "renew", credential.fence):
            return False
        report.renewals += 1
        self._tell(execution_id, "renewed", f"lease of {self.lease.total_seconds():g} s", fence=credential.fence)
        return True

    def _renewal_due(self, view: VisitView, now: datetime) -> bool:
        """Whether less than half the lease is left at ``now``: the lease is renewed before the visit."""
        expires = view.dispatch.lease_expires_at
        return expires is not None and expires - now < self.lease / 2

    def _plan(
        self, view: VisitView, definition: Definition | None, credential: p.LeaseCredential, now: datetime
    ) -> tuple[i.Plan, p.Authority]:
        """The visit's plan at ``now``, and the dispatch authority its decision carries: the policy is asked here."""
        execution = view.execution
        ctx = i.context_from_evidence(execution, definition, view.evidence)
        query = i.authority_query(ctx)
        node_authority = (
            None
            if query is None
            else ask(self.policy, query.principal_id, query.business_id, query.operation, query.targets)
        )
        plan = i.plan_visit(
            ctx,
            now,
            worker_id=self.worker_id,
            fence=credential.fence,
            node_authority=node_authority,
        )
        dispatch_authority = ask(
            self.policy,
            ctx.principal_id,
            execution.business_id,
            WORKFLOW_DISPATCH,
            ((execution.execution_id, execution.revision),),
        )
        return plan, dispatch_authority

    def _plan_next(self, view: VisitView, now: datetime, credential: p.LeaseCredential) -> NextVisit | None:
        """The next visit, planned inside the transaction of the decision before it.

        Composed decisions (specs/protocol.md): a visit that only steps or
        finishes (a condition, an end) joins the transaction that committed
        the claim or step before it, and so does the intent of a visit that
        calls a handler, which ends the transaction: the handler is called
        once it has committed.  None leaves the visit to :meth:`drive`: a
        stopping worker, a lease due for renewal, or a definition revision
        not yet in memory (the planner must not use the store).
        """
        execution = view.execution
        if self.stopping() or execution.state != ExecutionState.RUNNING:
            return None
        if self._renewal_due(view, now):
            return None
        definition = self.store.known_definition(
            execution.business_id, execution.definition_id, execution.definition_revision
        )
        if definition is None:
            return None
        try:
            plan, authority = self._plan(view, definition, credential, now)
        except Exception:
            # Raised here, it would roll back the transaction it is planned in, a step carrying a
            # Command's result included.  Left to drive instead, which asks again outside it.
            return None
        if isinstance(plan, i.Invoke):
            # Held from here: the transaction this joins may commit the intent, and an interruption may come
            # before it returns.  Set again from what it committed once it has.
            self._at.holding = execution.execution_id
            self._at.intent = _Pending(execution, plan, authority)
            return NextVisit("intent", credential, tuple(plan.evidence), (execution, plan, authority))
        if isinstance(plan, i.Step):
            request = p.StepRequest(credential, execution.revision, plan.step, authority)
            return NextVisit("step", request, tuple(plan.evidence), (execution, plan, authority))
        finish = self._finalize_request(execution, credential, plan, authority)
        return NextVisit("finish", finish, tuple(plan.evidence), (execution, plan, authority))

    def _report_followed(
        self,
        execution_id: str,
        credential: p.LeaseCredential,
        report: PassReport,
        followed: Sequence[tuple[NextVisit, p.Outcome]],
    ) -> tuple[bool, _Pending | None]:
        """Report the visits a transaction composed.

        Returns whether the execution is still running under the lease, and
        the Command whose intent the transaction committed last, if it did
        (its handler is the next thing to call).
        """
        for visit, outcome in followed:
            execution, plan, authority = visit.plan
            what = {"step": "step", "finish": "finalize", "intent": "issue command"}[visit.kind]
            if not self._applied(execution_id, outcome, report, what, credential.fence):
                return False, None
            if isinstance(plan, i.Invoke):
                self._report_command(execution_id, execution, credential, plan)
                held = self._at.intent  # the planner's own, unless a store planned it otherwise
                return True, held if held is not None and held.invoke is plan else _Pending(execution, plan, authority)
            if isinstance(plan, i.Step):
                self._report_step(execution_id, credential, plan.step, report)
            else:
                self._report_finish(execution_id, execution, credential, plan, report)
                return False, None
        return True, None

    @staticmethod
    def _finalize_request(
        execution: p.Execution, credential: p.LeaseCredential, plan: i.Finish, authority: p.Authority
    ) -> p.FinalizeRequest:
        return p.FinalizeRequest(
            execution_id=execution.execution_id,
            dispatch_id=execution.execution_id,
            worker_id=credential.worker_id,
            lease_token=credential.lease_token,
            fence=credential.fence,
            target_state=plan.target,
            business_id=execution.business_id,
            expected_revision=execution.revision,
            authority=authority,
            step=plan.step,
            wait=plan.wait,
            reason=plan.reason,
            error_code=plan.error_code,
        )

    def _report_step(
        self, execution_id: str, credential: p.LeaseCredential, step: p.StepRecord, report: PassReport
    ) -> None:
        report.steps += 1
        self._tell(
            execution_id,
            "step",
            f"{step.node_id} -> {step.next_node_id}",
            fence=credential.fence,
            node_id=step.node_id,
        )

    def _report_finish(
        self,
        execution_id: str,
        execution: p.Execution,
        credential: p.LeaseCredential,
        plan: i.Finish,
        report: PassReport,
    ) -> None:
        if plan.step is not None:
            report.steps += 1
        report.finished[plan.target.value] += 1
        self._tell(
            execution_id,
            plan.target.value,
            plan.reason,
            fence=credential.fence,
            code=plan.error_code,
            node_id=execution.current_node_id,
        )

    def _applied(
        self, execution_id: str, outcome: p.Outcome, report: PassReport, what: str, fence: int | None = None
    ) -> bool:
        if isinstance(outcome, p.Decision):
            return True
        code = outcome.code.value
        report.refused.append(Refused(execution_id, code, outcome.message))
        self._tell(execution_id, "refused", f"{what}: {code}: {outcome.message}", fence=fence, code=code)
        return False


MALFORMED_ROW: Final = "malformed_row"

LAPSED: Final = "lapsed"
"""The event of a lease a worker would have taken up again after a lost answer, found expired: the sweep's now."""


def _composes_claims(store: object) -> bool:
    """Whether ``store`` makes a claim in the transaction that finalizes the execution before it (``NextClaim.request``)."""
    return _says(store, "composes_claims")


def _reads_ahead(store: object) -> bool:
    """Whether ``store`` takes a worker's ``next_claim`` (:class:`~fencekeeper.adapters.store.NextClaim`)."""
    return _says(store, "reads_ahead")


def _says(store: object, capability: str) -> bool:
    """Whether ``store``'s own class declares ``capability`` (a class attribute, or a property of its own).

    Asked of the class: a store that wraps another and hands on its
    attributes (a ledger, a proxy) has none unless it says so itself.
    """
    declared = getattr(type(store), capability, False)
    if isinstance(declared, property):
        declared = getattr(store, capability, False)
    return declared is True


def _malformed(exc: StoreError) -> str | None:
    """The execution a ``malformed_row`` error names, if it names one."""
    return exc.execution_id if exc.code == MALFORMED_ROW else None


def _issues_a_command(followed: Sequence[tuple[NextVisit, p.Outcome]]) -> bool:
    """Whether a composed transaction committed a Command's intent (its last visit, when it did)."""
    return bool(followed) and followed[-1][0].kind == "intent" and isinstance(followed[-1][1], p.Decision)


__all__ = [
    "CLAIMS_PER_TRANSACTION",
    "MALFORMED_PAUSE_LIMIT",
    "MAX_CONCURRENCY",
    "MAX_LEASE",
    "MIN_LEASE",
    "SYSTEM_PRINCIPAL",
    "PassReport",
    "Refused",
    "Worker",
    "WorkerEvent",
    "WorkerSettingError",
    "check_concurrency",
    "check_lease",
]
