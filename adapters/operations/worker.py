"""The durable-operation worker: claims due operations of one tenant and runs each by its effect class.

Seed 001 (Claims, leases, and fencing; Current authorization; Tasks,
external effects, history, and retention).  Rules of this module:

- A worker is explicitly tenant-scoped.  Each pass claims one due
  Operation (the store's time decides what is due; an expired owner is
  replaced by the claim), or ends one that has run out of time or
  Attempts.
- Before every side effect the initiating principal is resolved *now*
  through the resolver registry and the action re-authorized; a missing,
  disabled or revoked identity fails the Operation closed, a temporarily
  unavailable one (after the registry's bounded retry) fails the Attempt
  retryably.  An approval never stands in for this.  A look at the
  provider is no side effect: before a denial, or an unavailability that
  ends the Operation (its last Attempt, or past its deadline), an external
  action whose earlier issue is unanswered asks ``reconcile`` and records
  a succeeded answer; anything else leaves the failure to end the
  Operation ``external_outcome_unknown``.
- ``atomic``: the handler runs inside the completion transaction and writes
  only through the guarded context; its writes commit with the Attempt's
  success or not at all.  ``read_only``: the handler's result is the only
  write.  ``external``: the intent and the stable effect id commit first.
  The provider's payload is built before the intent, so a payload builder
  that raises issues nothing; when an earlier Attempt's issue is
  unanswered, the worker asks ``reconcile`` before that failure is
  reported, as before a denial, and records a succeeded answer.  What
  happens before the provider is the kernel's ``effect_plan``: an effect
  an earlier Attempt may have issued without a conclusive answer (a lost
  reply, a timeout, a crash, a replaced owner) is reconciled before
  anything is repeated (and the lease renewed, under the fence, between the
  lookup's answer and the call), repeated with the same id only if the
  adapter is idempotent, and otherwise ends ``external_outcome_unknown``: an
  ambiguous result is never resent blindly.  An effect whose every issue
  the provider answered "failed" (not applied) is performed again, with the
  same id.  Only the provider's own FAILED reply to this Attempt's call is
  reported as that answer; anything else leaves the effect unsettled.  An
  adapter's ``perform`` that raises has answered ambiguously, like a
  timeout, and is reconciled at once.
- While a read-only or external action runs, a heartbeat renews the lease
  every third of it; an atomic action runs inside the transaction that
  holds the Operation's row, so its lease must cover it.  A renewal the
  store fails retryably (a lost connection) is tried again a second later,
  not given up: the lease still runs.
- An owner write whose outcome the store could not report (its connection
  was lost: a retryable ``StoreError``) may have committed or not; one a
  lock or a busy file failed (the other retryable codes) wrote nothing,
  and is treated the same, the read telling.  The worker remembers the
  request, exactly as sent, with what it needs to send it again
  (:class:`_Unfinished`), and raises (never taken for the action's own failure: no ``handler_error``
  is sent for it); its next pass, before it claims anything, reads that
  Operation.  Where the read shows the request committed (its Attempt ended as the
  request ends it), the outcome is reported and nothing is written.  Where
  the Operation still runs under this very credential, its lease live on
  the store's clock, the same request is sent again: the same completion
  with the same result, the same failure; an atomic completion runs its
  action again inside the new transaction (nothing of the lost one
  committed, since the Attempt is still open: a reread, then no blind
  write, seed 001, Durable truth and recovery); an effect's intent that the
  read shows committed goes on to the provider's call, after a renewal,
  and only then.  A provider's answer in hand is recorded, never asked for
  again.  Anything else (the lease ran out, another owner, an end by
  cancellation or a limit) is left alone for the ordinary reclaim; a lease
  of this very Attempt found expired is said (``lease_expired``).  Every
  request sent again is a decision under the same fence, so a replaced or
  expired owner is refused as always (specs/operations.md, "An owner write
  of unknown outcome").  A claim of unknown outcome names no Operation
  before it commits, so each claim carries a token the worker makes for it
  (where the store keeps one, ``claim_tokens``), kept with the Attempt it
  begins: the next pass asks the store which of the tenant's Operations
  run under this worker's id with that token (``running_under``), and runs
  that Attempt, if its lease is live, from its start, under the credential
  the read shows (the worker never had the claim's answer, so it did
  nothing of that Attempt).  No other worker's Attempt can answer, whoever
  shares the id, in this process or another.  With a store that keeps no
  token the lookup goes by id alone, and is made only while no other
  worker of this process with the same id is busy (the Python default id,
  host and process, is shared by every worker of a process made without
  one); otherwise such a claim's lease runs out as before.
- A handler's :class:`ActionFailed` is classified by its ``retryable``
  flag; any other exception is a retryable ``handler_error`` (bounded by
  the policy's maximum attempts), and so is a result that is not JSON (or
  holds an object key that is not a string, which JSON would rename), and
  an adapter's ``perform`` or ``reconcile`` answer that is not an
  ``EffectResult`` (the message names the action and what it returned; the
  intent stays unanswered, so the next Attempt reconciles first).  An
  authorizer that raises denies (fails closed).  Every refusal the store
  returns (a stale fence after a replacement, a cancellation that won) is
  reported, never retried: the fence says this worker no longer owns the
  Operation.  One refusal is answered: ``deadline_exceeded`` for an
  external intent or an atomic completion (the overall deadline came while
  the lease is live, and no effect may begin) is followed by the owner's
  retryable failure, code ``deadline_exceeded``, which ends the Operation
  so at once; an external action whose earlier issue is unanswered asks
  the provider first, completes from a succeeded answer and otherwise
  ends ``external_outcome_unknown`` (a claim past the deadline gives such
  an Operation an Attempt for this look).
- A claim the kernel refuses for the row the store found due (the kernel
  claims or ends every due Operation, so only a row that disagrees with it:
  edited data, a store's wrong ``due_at``) is reported once and then passed
  over, for a pause that doubles while it is refused again: the rest of the
  tenant's work goes on, and the worker neither spins on the row nor keeps
  reporting it.  So is a due row the store cannot read because it
  contradicts its state or its input is not JSON (outcome
  ``malformed_row``): one damaged row does not halt its tenant's queue.  A
  store's refusal that names no row pauses the worker.
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any, Final

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.common import duration_problem, identifier_problem, shown
from fencekeeper.kernel.machines import OperationEvent

from ..store import RETRYABLE_STORE_CODES, StoreError, tried_before_stop
from .ports import ClaimRefused, GuardedContext, MalformedRow, OperationStore, OperationView
from .service import (
    ActionFailed,
    DurableAction,
    DurableActionRegistry,
    DurableOperationError,
    EffectResult,
    EffectStatus,
    ExternalEffectAdapter,
    PrincipalReference,
    PrincipalResolverRegistry,
    ResolutionStatus,
    _json_text,
    _key_problem,
)


@attrs.frozen
class WorkReport:
    """What one pass did: the Operation, and how it ended for this worker."""

    operation_id: str
    attempt: int | None
    outcome: str
    """A terminal outcome (``succeeded``, ``max_attempts_exceeded``, ...), ``retry``, or a refusal code."""
    detail: str = ""
    resumed: bool = False
    """The Attempt was taken up after an owner write of unknown outcome, once the store answered again.

    ``detail`` then starts with ``resumed:`` and says whether the write (or the claim) had committed before
    its answer was lost, was sent again now, or found its lease run out (outcome ``lease_expired``).
    """


# A stored reference's parse is a pure function of its text (a frozen value): made once per text.
# Only the parse: the principal behind it is resolved again before every side effect.
_reference = functools.lru_cache(maxsize=1024)(PrincipalReference.parse)


MAX_LEASE: Final = timedelta(days=1)
"""The longest lease a worker takes, in Python as on the command line (``fencekeeper op worker --lease``).

There the lease is also the PostgreSQL sessions' idle-in-transaction timeout, which the store bounds at a
day; and a heartbeat, waiting a third of the lease, cannot wait past what ``threading`` can time.
"""

_LONGEST_PAUSE = timedelta(hours=1)
"""The longest a refused row is passed over (or a worker paused) before its claim is tried again."""
_REMEMBERED = 1000
"""Refused rows remembered at most: past that, the oldest pauses are forgotten (their rows are tried again)."""


@attrs.frozen
class _Pause:
    until: datetime
    length: timedelta


_OwnerRequest = o.CompleteRequest | o.FailRequest | o.UnknownRequest | o.IntentRequest | o.HeartbeatRequest

_RENEWAL_RETRY = 1.0
"""Seconds before a heartbeat the store failed retryably is tried again (the lease is still running)."""


@attrs.frozen
class _Unfinished:
    """An owner write whose outcome the store could not report: the worker's next pass takes it up first.

    ``request`` is exactly what was sent.  ``send`` sends it again and goes
    on with the Attempt from there, as the first sending would have (for an
    atomic completion, the action runs again inside the new transaction; for
    an intent or a renewal, the provider's call follows).  ``go_on`` is for
    an intent the read shows committed: the rest of the Attempt, from the
    Operation as read.  ``beats``: what follows calls the provider, so the
    lease is renewed while it runs.
    """

    request: _OwnerRequest
    send: Callable[[], WorkReport]
    go_on: Callable[[o.Operation], WorkReport] | None = None
    beats: bool = False

    @property
    def what(self) -> str:
        """The request, in words, for the report."""
        request = self.request
        if isinstance(request, o.CompleteRequest):
            return "completion"
        if isinstance(request, o.FailRequest):
            return f"failure ({request.error_code})"
        if isinstance(request, o.UnknownRequest):
            return "unknown outcome"
        if isinstance(request, o.IntentRequest):
            return "effect's intent"
        return "lease renewal"


@attrs.frozen
class _Call:
    """An external action's Attempt, as far as its provider's call: who calls, with what payload, by which plan."""

    action: DurableAction
    adapter: ExternalEffectAdapter
    credential: o.Credential
    authority: o.Authority
    payload: Any
    """What the action's handler built for the provider, once, before the intent."""
    plan: o.EffectPlan
    """The kernel's ``effect_plan`` for the Operation as claimed."""


@attrs.frozen
class _Namesakes:
    """The workers of this process under one id that hold or may hold an Attempt now, and their lock."""

    lock: threading.Lock = attrs.field(factory=threading.Lock)
    busy: weakref.WeakSet[DurableOperationWorker] = attrs.field(factory=weakref.WeakSet)


_NAMESAKES: dict[str, _Namesakes] = {}
"""By worker id: a claim of unknown outcome is looked up by id only where no other worker of it is busy."""
_NAMESAKES_LOCK = threading.Lock()


def _namesakes(worker_id: str) -> _Namesakes:
    with _NAMESAKES_LOCK:
        return _NAMESAKES.setdefault(worker_id, _Namesakes())


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class DurableOperationWorker:
    def __init__(
        self,
        store: OperationStore,
        actions: DurableActionRegistry,
        resolvers: PrincipalResolverRegistry,
        *,
        tenant: str,
        worker_id: str | None = None,
        lease: timedelta = timedelta(seconds=30),
        namespace: str | None = None,
        before_effect: Callable[[o.Operation], None] | None = None,
    ) -> None:
        # Checked here, once: a zero lease was refused at every claim with a pause of the lease's length, so
        # run_until_idle spun through thousands of refusals; a malformed tenant claimed nothing, silently.
        for field, problem in (
            ("tenant", identifier_problem(tenant)),
            ("worker_id", None if worker_id is None else identifier_problem(worker_id)),
            ("namespace", None if namespace is None else identifier_problem(namespace)),
        ):
            if problem is not None:
                raise DurableOperationError("invalid_input", f"{field}: {problem}", field)
        problem = duration_problem(lease)
        if problem is None and lease > MAX_LEASE:
            # Accepted, a lease of a million days ended the heartbeat thread with OverflowError at the first action.
            problem = f"must be at most a day ({MAX_LEASE}), got {lease}"
        if problem is not None:
            raise DurableOperationError("invalid_request", f"lease: {problem}", "lease")
        self.store = store
        self.actions = actions
        self.resolvers = resolvers
        self.tenant = tenant
        self.worker_id = worker_id or default_worker_id()
        self.lease = lease
        self.namespace = namespace
        self.before_effect = before_effect
        """Called after the claim and before the effect (fault tests stop the process here)."""
        self._refused: dict[str, _Pause] = {}
        """Rows whose claim was refused, passed over until their pause ends (the store's time)."""
        self._paused: _Pause | None = None
        """The worker's own pause after a refusal that named no row."""
        self._unfinished: _Unfinished | None = None
        """An owner write whose outcome the store could not report: the next pass takes it up before any claim."""
        self._claim_lost = False
        """A claim whose outcome the store could not report (or whose Attempt a failed read kept from beginning):
        the next pass asks what runs under this worker."""
        self._claim_token: str | None = None
        """The token of the last claim sent, where the store keeps one (``claim_tokens``): the Attempt that claim
        began, if it committed, is the one running under this worker with that token, and no other."""
        self._namesakes = _namesakes(self.worker_id)

    def run_once(self) -> WorkReport | None:
        with self._busy():
            return self._pass()

    def holds_unfinished(self) -> bool:
        """Whether a write or a claim of unknown outcome left this worker an Attempt its next pass takes up first."""
        return self._unfinished is not None or self._claim_lost

    def take_up_before_stop(self, sleep: Callable[[float], None] = time.sleep) -> WorkReport | None:
        """A stopping worker's last look at an Attempt a lost answer left it; None if there is none or the store stays away.

        The take-up a pass starts with, and nothing else (no claim): the
        write is finished under the lease, so that an Attempt whose action
        already ran is not left to expire (and, at its last Attempt, fail
        the Operation).  A store still failing after
        :data:`~fencekeeper.adapters.store.STOP_TAKE_UP_WAITS` leaves it to
        the ordinary reclaim: a stopping process does not wait out an
        outage.  Any other error is raised.
        """
        return tried_before_stop(self._taken_up_busy, sleep)

    def _taken_up_busy(self) -> WorkReport | None:
        with self._busy():
            return self._taken_up()

    @contextmanager
    def _busy(self) -> Iterator[None]:
        # Busy from before its claim until nothing of the pass is left to take up: while it is, what runs
        # under this worker's id may be this worker's, and no namesake of the process takes it up.
        with self._namesakes.lock:
            self._namesakes.busy.add(self)
        try:
            yield
        finally:
            if self._unfinished is None and not self._claim_lost:
                with self._namesakes.lock:
                    self._namesakes.busy.discard(self)

    def _taken_up(self) -> WorkReport | None:
        """An Attempt this worker may still own, its lease running, taken up; None when there is none to go on with."""
        if self._unfinished is not None:
            resumed = self._take_up(self._unfinished)
            if resumed is not None:
                return resumed
        if self._claim_lost:
            return self._take_up_claim()
        return None

    def _pass(self) -> WorkReport | None:
        # Taken up before any claim (or pause).
        resumed = self._taken_up()
        if resumed is not None:
            return resumed
        if self._paused is not None and self.store.now() < self._paused.until:
            return None
        skip = self._passing_over()
        tokens = getattr(self.store, "claim_tokens", False) is True
        for _ in range(_REMEMBERED):
            # Passing over the rows this worker already reported: a pass ends with a claim, a report or None.
            # Each claim its own token, made here (the kernel makes none): the one that may commit is the last sent.
            self._claim_token = secrets.token_hex(16) if tokens else None
            # Passed only where given, so that a store of an older port (neither argument) still claims.
            extra: dict[str, Any] = {"skip": skip} if skip else {}
            if tokens:
                extra["claim_token"] = self._claim_token
            try:
                outcome = self.store.claim_next(
                    self.tenant, self.worker_id, self.lease, namespace=self.namespace, runs=self.actions.has, **extra
                )
            except StoreError as exc:
                # The claim may have committed: the next pass asks the store what runs under this worker.
                self._claim_lost = exc.code in RETRYABLE_STORE_CODES
                raise
            if not isinstance(outcome, ClaimRefused) or outcome.operation_id in skip:
                break  # (a store that ignores ``skip``: the worker pauses below)
            if self._pass_over(outcome.operation_id):
                detail = self._passed_over(outcome.operation_id, outcome.message)
                return WorkReport(outcome.operation_id, None, outcome.code.value, detail)
            skip = skip | {outcome.operation_id}
        if outcome is None:
            self._paused = None
            return None
        if isinstance(outcome, o.Refusal):
            # No row named, so none can be passed over: the worker pauses instead of asking again at once.
            length = self.lease if self._paused is None else min(self._paused.length * 2, _LONGEST_PAUSE)
            self._paused = _Pause(self.store.now() + length, length)
            return WorkReport("?", None, outcome.code.value, f"{outcome.message}; paused until {self._paused.until.isoformat()}")
        self._paused = None
        operation = outcome.operation
        self._refused.pop(operation.operation_id, None)
        if not isinstance(outcome, o.Decision) or outcome.credential is None:
            # The claim ended the Operation by a limit (deadline, attempts, an unused approval's expiry).
            return _ended(operation, None)
        return self._begin(operation, outcome.credential)

    def _begin(self, operation: o.Operation, credential: o.Credential) -> WorkReport:
        """Run the Attempt of ``credential``; a read the store fails before any write leaves it to the next pass.

        Only a write is remembered as such (``_unfinished``); a StoreError without one came from a read before
        the first write (the input, the time), so nothing of the Attempt happened, and the next pass finds it
        as after a claim whose answer was lost.
        """
        try:
            return self._run(operation, credential)
        except StoreError as exc:
            if exc.code in RETRYABLE_STORE_CODES and self._unfinished is None:
                self._claim_lost = True
            raise

    def _passing_over(self) -> frozenset[str]:
        """The refused rows whose pause has not ended, at the store's time (read only when there are some)."""
        if not self._refused:
            return frozenset()
        now = self.store.now()
        return frozenset(operation_id for operation_id, pause in self._refused.items() if now < pause.until)

    def _pass_over(self, operation_id: str) -> bool:
        """Pause ``operation_id`` (twice as long as last time it was refused); whether this is its first refusal."""
        earlier = self._refused.pop(operation_id, None)
        length = self.lease if earlier is None else min(earlier.length * 2, _LONGEST_PAUSE)
        if len(self._refused) >= _REMEMBERED:
            del self._refused[next(iter(self._refused))]
        self._refused[operation_id] = _Pause(self.store.now() + length, length)
        return earlier is None

    def _passed_over(self, operation_id: str, message: str) -> str:
        """What the report of a row passed over says: why, and until when."""
        return f"{message}; passed over until {self._refused[operation_id].until.isoformat()}"

    def run_until_idle(self, limit: int = 10_000) -> list[WorkReport]:
        reports: list[WorkReport] = []
        for _ in range(limit):
            report = self.run_once()
            if report is None:
                break
            reports.append(report)
        return reports

    # --- one attempt ------------------------------------------------------------------------

    def _run(self, operation: o.Operation, credential: o.Credential) -> WorkReport:
        try:
            payload = self.store.input_value(operation.operation_id)
        except MalformedRow as malformed:
            # The claim decoded the input before it committed; this is a store that did not, or a row damaged
            # since.  Reported and passed over like a due row the claim could not read: nothing more is written,
            # and once the lease expires the next claim meets the row and refuses it.
            self._pass_over(operation.operation_id)
            detail = self._passed_over(operation.operation_id, malformed.message)
            return WorkReport(operation.operation_id, credential.fence, malformed.code, detail)
        try:
            action = self.actions.get(operation.action_name, operation.action_version)
        except DurableOperationError as exc:
            # The store's claim already declines a version this worker lacks (claim_next's ``runs``); a store
            # that ignores ``runs`` lands here: retried (within its limits), not ended for good.
            return self._fail(credential, "action_not_registered", retryable=True, detail=exc.message)
        reference = _reference(operation.identity.principal)
        resolution = self.resolvers.resolve(reference)
        if resolution.status is ResolutionStatus.UNAVAILABLE:
            if self._last_chance(operation):
                # This failure ends it (no Attempt or no time is left): ask the provider about the unanswered call
                # first, which needs no authority, rather than leave its outcome unknown unasked.
                looked = self._look(action, operation, credential, o.Authority(False, reference.ref, resolution.reason))
                if looked is not None:
                    return looked
            return self._fail(credential, "principal_unavailable", retryable=True, detail=resolution.reason)
        why = resolution.reason or resolution.status.value
        try:
            authorized = (
                resolution.active and resolution.member_of(self.tenant) and action.authorize(resolution, payload)
            )
        except Exception as exc:  # an authorizer that breaks fails closed, as a resolver that raises does
            authorized, why = False, f"the action's authorizer failed: {type(exc).__name__}: {exc}"
        if authorized is not True and not isinstance(authorized, bool):
            # Only True grants, as for the service's submission: an answer that is no bool (None from a branch
            # that forgot to return) is authority that was not established.
            why = f"the action's authorizer answered {shown(authorized)}, not True or False"
        if authorized is not True:
            # Failing closed begins nothing; but an earlier Attempt's call may have been applied unanswered, and a
            # look at the provider is no side effect, so it needs no current authority: its success is recorded.
            looked = self._look(action, operation, credential, o.Authority(False, reference.ref, why))
            if looked is not None:
                return looked
            return self._fail(credential, "not_authorized", retryable=False, denied=True, detail=why)
        authority = o.Authority(True, reference.ref)
        if self.before_effect is not None:
            self.before_effect(operation)

        def attempt() -> WorkReport:
            if action.effect_class is o.EffectClass.ATOMIC:
                return self._atomic(action, credential, authority, payload)
            with self._heartbeats(credential):
                if action.effect_class is o.EffectClass.READ_ONLY:
                    result = _result_json(action.handler(payload))
                else:
                    return self._external(action, operation, credential, authority, payload)
            return self._complete(credential, authority, result)

        return self._classified(credential, attempt)

    def _classified(self, credential: o.Credential, attempt: Callable[[], WorkReport]) -> WorkReport:
        """``attempt()``, with what its action raises reported as the Attempt's failure."""
        try:
            return attempt()
        except ActionFailed as failure:
            return self._fail(credential, failure.code, retryable=failure.retryable, detail=str(failure))
        except Exception as exc:
            if isinstance(exc, StoreError) and self._unfinished is not None:
                # The worker's own write lost its answer (_send): no failure of the action, and none to send
                # now.  Sent here, it could go through on another connection and end an Attempt whose result
                # was in hand (the last one: the whole Operation) handler_error.
                raise
            # A DurableOperationError included: one the handler's own code met (a follow-up submission refused, a
            # value canonical_json refused) is the handler's failure, not the worker's, as is an adapter's answer
            # that is no EffectResult (_answer); raised from here, it ended run_once with the Attempt still
            # running, to be retried only after its lease ran out.
            return self._fail(credential, "handler_error", retryable=True, detail=f"{type(exc).__name__}: {exc}")

    def _last_chance(self, operation: o.Operation) -> bool:
        """Whether a failure of this Attempt ends the Operation by a limit: its last Attempt, or past the deadline."""
        if operation.attempt_count >= operation.policy.maximum_attempts:
            return True
        return self.store.now() >= operation.deadline

    def _look(
        self, action: DurableAction, operation: o.Operation, credential: o.Credential, authority: o.Authority
    ) -> WorkReport | None:
        """Before a failure that ends the Operation: ask the provider about an earlier Attempt's unanswered call.

        A report when the provider says it succeeded (recorded, whatever the authority: it begins nothing);
        None when there is nothing to ask or no conclusive success, and the failure goes on (the kernel then
        ends the Operation ``external_outcome_unknown``, the call being still unanswered).
        """
        if action.effect_class is not o.EffectClass.EXTERNAL:
            return None
        with self._heartbeats(credential):
            result = _looked_up(action, operation)
        return None if result is None else self._complete(credential, authority, result)

    def _atomic(
        self, action: DurableAction, credential: o.Credential, authority: o.Authority, payload: Any
    ) -> WorkReport:
        raised: list[BaseException] = []

        def write(context: GuardedContext) -> str:
            try:
                return _result_json(action.handler(context, payload))
            except BaseException as exc:
                raised.append(exc)
                raise

        def answered(outcome: o.Outcome) -> WorkReport:
            if isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.DEADLINE_EXCEEDED:
                return self._past_deadline(credential, outcome)
            return self._report(credential, outcome)

        request = o.CompleteRequest(credential, authority)
        # A StoreError the handler itself raised (a store of its own) is its failure, not a lost answer: the
        # store's own loss of the transaction, a statement of the handler's included, is the store's error.
        return self._send(
            request, lambda: self.store.complete(request, write), answered, lost=lambda exc: exc not in raised
        )

    def _external(
        self,
        action: DurableAction,
        operation: o.Operation,
        credential: o.Credential,
        authority: o.Authority,
        payload: Any,
    ) -> WorkReport:
        adapter = action.adapter
        assert adapter is not None
        plan = o.effect_plan(operation)
        # The provider's payload is built before the intent commits: a builder that raises has
        # issued nothing, and fails the Attempt like any handler error without leaving an
        # ambiguous issue behind for the next Attempt to reconcile.
        try:
            request = action.handler(payload)
        except Exception:
            # But an earlier Attempt's call may be unanswered, and this failure comes before the look step 3
            # would make: on the last Attempt (or past the deadline) it would end the Operation
            # external_outcome_unknown with the provider never asked.  Look first, as before a denial; a
            # success is recorded, and anything else lets the failure go on as the handler raised it.
            if plan is o.EffectPlan.RECONCILE:
                found = _looked_up(action, operation)
                if found is not None:
                    return self._complete(credential, authority, found)
            raise
        call = _Call(action, adapter, credential, authority, request, plan)
        intent = o.IntentRequest(credential)
        return self._send(
            intent,
            lambda: self.store.record_intent(intent),
            lambda outcome: self._intended(call, operation, outcome),
            # Taken up (_take_up): the intent committed and only its answer was lost; the provider was never called.
            go_on=lambda read: self._issue(call, _effect_id(read), renew=True),
            beats=True,
        )

    def _intended(self, call: _Call, operation: o.Operation, intent: o.Outcome) -> WorkReport:
        """What follows the store's answer to the intent: the provider's call, or what stands in for it."""
        action, adapter, credential, authority = call.action, call.adapter, call.credential, call.authority
        if isinstance(intent, o.Refusal) and intent.code is o.RefusalCode.DEADLINE_EXCEEDED:
            if call.plan is o.EffectPlan.RECONCILE and operation.effect_id is not None:
                # No new call may start, but an earlier Attempt's call may have been applied: look, and record
                # its success rather than end the Operation as if the provider had done nothing.  A claim past
                # the deadline hands out an Attempt for exactly this look.
                settled = _answer(action, "reconcile", adapter.reconcile(operation.effect_id))
                if settled is not None and settled.status is EffectStatus.SUCCEEDED:
                    return self._complete(credential, authority, _result_json(settled.result))
                # Nothing conclusive (a look that finds nothing leaves a lost call free to land) and nothing may be
                # repeated: the ambiguous result the seed names, whether or not the adapter deduplicates.
                found = "no answer" if settled is None else settled.status.value
                return self._unknown(
                    credential,
                    f"effect {operation.effect_id} was issued and never answered; past the deadline "
                    f"{operation.deadline.isoformat()} the provider's look found {found}",
                )
            return self._past_deadline(credential, intent)
        if not isinstance(intent, o.Decision):
            return self._report(credential, intent)
        return self._issue(call, _effect_id(intent.operation), renew=False)

    def _issue(self, call: _Call, effect_id: str, *, renew: bool) -> WorkReport:
        """The provider's call under a committed intent (``renew``: after a renewal, the intent's write being old)."""
        action, adapter, credential, authority = call.action, call.adapter, call.credential, call.authority
        if call.plan is o.EffectPlan.RECONCILE:
            # An earlier Attempt's issue may have been applied unanswered: look before repeating anything.
            settled = _answer(action, "reconcile", adapter.reconcile(effect_id))
            if settled is not None and settled.status is EffectStatus.SUCCEEDED:
                return self._complete(credential, authority, _result_json(settled.result))
            known_absent = settled is not None and settled.status in (EffectStatus.NOT_FOUND, EffectStatus.FAILED)
            if not known_absent and not adapter.idempotent:
                return self._unknown(credential, f"effect {effect_id} may have been issued and cannot be reconciled")
            # The look took time in which this Attempt may have been replaced (a stop, a slow answer):
            # its intent, written before it, no longer shows that it still owns the Operation.  Once
            # fence N+1 owns it, N may not retry (seed 001, "Claims, leases, and fencing"): a guarded
            # write (a renewal, under the fence and the live lease, at the database's time) comes
            # between the answer and the call, or a replacement's own call could be repeated.
            renew = True
        if not renew:
            return self._perform(call, effect_id)
        renewal = o.HeartbeatRequest(credential, self.lease)

        def renewed(outcome: o.Outcome) -> WorkReport:
            if not isinstance(outcome, o.Decision):
                return self._report(credential, outcome)
            return self._perform(call, effect_id)

        return self._send(renewal, lambda: self.store.heartbeat(renewal), renewed, beats=True)

    def _perform(self, call: _Call, effect_id: str) -> WorkReport:
        """Call the provider, once, and record its answer."""
        action, adapter, credential, authority = call.action, call.adapter, call.credential, call.authority
        try:
            outcome = adapter.perform(effect_id, call.payload)
        except Exception as exc:
            # The call may have reached the provider before the adapter raised: an ambiguous answer like a
            # timeout, reconciled at once, and never a plain handler error a non-idempotent provider would
            # see repeated (or that would end the operation by its limits with the effect unknown).
            outcome = EffectResult(EffectStatus.AMBIGUOUS, detail=f"{type(exc).__name__}: {exc}")
        outcome = _performed(action, outcome)
        if outcome.status is EffectStatus.SUCCEEDED:
            return self._complete(credential, authority, _result_json(outcome.result))
        if outcome.status is EffectStatus.FAILED:
            # The provider's conclusive answer to this call: recorded, so a retry performs instead of
            # treating the effect as ambiguous.
            return self._fail(
                credential, "effect_failed", retryable=outcome.retryable, detail=outcome.detail, not_applied=True
            )
        settled = _answer(action, "reconcile", adapter.reconcile(effect_id))
        return self._after_ambiguity(credential, authority, effect_id, settled, idempotent=adapter.idempotent)

    def _after_ambiguity(
        self,
        credential: o.Credential,
        authority: o.Authority,
        effect_id: str,
        settled: EffectResult | None,
        *,
        idempotent: bool,
    ) -> WorkReport:
        if settled is not None and settled.status is EffectStatus.SUCCEEDED:
            return self._complete(credential, authority, _result_json(settled.result))
        if settled is not None and settled.status in (EffectStatus.NOT_FOUND, EffectStatus.FAILED):
            # Not applied as far as the provider can see now: a later Attempt reconciles again (the call
            # whose reply was lost may still land) and may then perform it, with the same effect id.
            return self._fail(credential, "effect_not_applied", retryable=True, detail=settled.detail)
        if idempotent:
            return self._fail(credential, "effect_ambiguous", retryable=True, detail="the provider deduplicates by id")
        return self._unknown(credential, f"effect {effect_id}: ambiguous result and no reconciliation")

    @contextmanager
    def _heartbeats(self, credential: o.Credential) -> Iterator[None]:
        """Renew the lease every third of it while a read-only or external action runs.

        Not for atomic actions: they run inside the transaction that holds the
        Operation's row, so their lease must cover them.  A refused heartbeat
        (replaced, cancelled) stops renewing; the completion is then refused
        by the store as well.  When this returns, no renewal is in flight and
        none will be sent for ``credential``.
        """
        if self._beater is None:
            self._beater = _Heartbeat(self.store, self.lease, self.worker_id)
        self._beater.start(credential)
        try:
            yield
        finally:
            self._beater.stop()

    _beater: _Heartbeat | None = None

    # --- reporting ----------------------------------------------------------------------------

    def _complete(self, credential: o.Credential, authority: o.Authority, result: str) -> WorkReport:
        request = o.CompleteRequest(credential, authority, result)
        return self._send(request, lambda: self.store.complete(request), lambda outcome: self._report(credential, outcome))

    def _fail(
        self,
        credential: o.Credential,
        code: str,
        *,
        retryable: bool,
        denied: bool = False,
        detail: str = "",
        not_applied: bool = False,
    ) -> WorkReport:
        request = o.FailRequest(credential, code, retryable, not_authorized=denied, effect_not_applied=not_applied)

        def answered(outcome: o.Outcome) -> WorkReport:
            report = self._report(credential, outcome)
            return attrs.evolve(report, detail=detail or report.detail)

        return self._send(request, lambda: self.store.fail(request), answered)

    def _past_deadline(self, credential: o.Credential, refusal: o.Refusal) -> WorkReport:
        """The store refused to let this Attempt start its effect past the overall deadline: end the Operation so.

        A retryable failure from the deadline on ends ``deadline_exceeded`` (the kernel's ``fail``), at once,
        rather than leaving the Operation running until the lease runs out.  If the lease ran out too, the
        failure is refused as well and the next claim ends it ``deadline_exceeded``: nothing is retried here.
        """
        return self._fail(credential, "deadline_exceeded", retryable=True, detail=refusal.message)

    def _unknown(self, credential: o.Credential, detail: str) -> WorkReport:
        request = o.UnknownRequest(credential, detail)
        return self._send(
            request, lambda: self.store.outcome_unknown(request), lambda outcome: self._report(credential, outcome)
        )

    # --- an owner write of unknown outcome ------------------------------------------------------

    def _send(
        self,
        request: _OwnerRequest,
        call: Callable[[], o.Outcome],
        answered: Callable[[o.Outcome], WorkReport],
        *,
        lost: Callable[[StoreError], bool] = lambda exc: True,
        go_on: Callable[[o.Operation], WorkReport] | None = None,
        beats: bool = False,
    ) -> WorkReport:
        """``call()`` (the store's decision on ``request``), then ``answered`` with its outcome.

        A retryable StoreError from ``call`` (one ``lost`` says is the store's) leaves the write's outcome
        unknown: it is remembered for the next pass, and raised.  Only ``call`` is watched: a write that
        ``answered`` makes is remembered by its own ``_send``.
        """

        def send() -> WorkReport:
            try:
                outcome = call()
            except StoreError as exc:
                if exc.code in RETRYABLE_STORE_CODES and lost(exc):
                    self._unfinished = _Unfinished(request, send, go_on, beats)
                raise
            return answered(outcome)

        return send()

    def _take_up(self, unfinished: _Unfinished) -> WorkReport | None:
        """Read the Operation of an owner write of unknown outcome, and finish that write if it is still this worker's.

        Raises, still remembering it, while the store fails.  A report when the read shows the write
        committed (nothing is written) or when the Attempt still runs under this credential, its lease live
        on the store's clock (the write is sent again, and the Attempt goes on from there); None when anything
        else holds the Operation now (nothing is written: the ordinary reclaim handles it).
        """
        credential = unfinished.request.credential
        try:
            view = self.store.view(credential.operation_id)
        except MalformedRow:
            # Damaged meanwhile: the claim that meets the row names it and passes over it.
            self._unfinished = None
            return None
        now = self.store.now()
        self._unfinished = None
        if view is None:
            return None
        attempt = next((a for a in view.attempts if a.number == credential.fence), None)
        if attempt is not None and attempt.worker_id == credential.worker_id and _ended_by(unfinished.request, attempt):
            # Committed; only its answer was lost.
            return self._resumed(
                _settled(view, credential),
                f"attempt {credential.fence}'s {unfinished.what} had committed before its answer was lost",
            )
        refusal = o.check_owner(view.operation, credential, now)
        if refusal is not None and refusal.code is o.RefusalCode.LEASE_EXPIRED:
            # Still this worker's Attempt, its lease run out while the store was away: the next claim's to record
            # abandoned, as after a crash.  Said, so that the Attempt the store lost is not dropped in silence.
            expired = view.operation.lease_expires_at
            assert expired is not None
            return self._resumed(
                WorkReport(credential.operation_id, credential.fence, refusal.code.value),
                f"attempt {credential.fence}'s lease ran out ({expired.isoformat()}) while it was away: nothing more "
                f"is written under it, and the next claim replaces the attempt",
            )
        if refusal is not None:
            # Another worker holds it, or a cancellation or a limit ended it: not this worker's any more, and
            # nothing of it is written here.
            return None
        send: Callable[[], WorkReport] = unfinished.send
        said = f"its {unfinished.what} is sent again"
        if unfinished.go_on is not None and _intent_committed(view, credential):
            # Only the intent's answer was lost: the provider has not been called, and is called now, once.
            send = functools.partial(unfinished.go_on, view.operation)
            said = "its effect's intent had committed: the provider is called now"
        if unfinished.beats:
            send = functools.partial(self._beating, credential, send)
        return self._resumed(
            self._classified(credential, send),
            f"attempt {credential.fence} still runs under this worker's lease; {said}",
        )

    def _take_up_claim(self) -> WorkReport | None:
        """Run the Attempt a claim of unknown outcome committed, if the store shows one this worker holds.

        The claim names no Operation before it commits, so the store is asked which of the tenant's
        Operations run under this worker's id and the claim's token (``running_under``; with a store without
        it nothing is taken up, nor, with a store that keeps no token, while another worker of this process
        under the same id is busy: such a claim's lease runs out as after a crash).  Of those whose lease is
        live on the store's clock, the one claimed last is run from its start under the credential the read
        shows: nothing of that Attempt was done, since this worker never had the claim's answer.  Raises,
        still asking, while the store fails.
        """
        lookup = getattr(self.store, "running_under", None)
        token = self._claim_token
        with self._namesakes.lock:
            # Held until the choice is made: a namesake that starts a pass meanwhile claims only after it.
            if lookup is None or (token is None and set(self._namesakes.busy) != {self}):
                # A store that keeps no claim token, and another worker of this process with this id busy (the
                # Python default id is the host and process): what runs under it may be that one's, running now.
                # Nothing is taken up, and such a claim's lease runs out, as after a crash.  With a token, only
                # the Attempt this worker's own claim began is found, whoever else shares the id.
                self._claim_lost = False
                return None
            found: list[str] = lookup(
                self.tenant, self.worker_id, namespace=self.namespace, **({"claim_token": token} if token else {})
            )
            live: list[o.Operation] = []
            for operation_id in found:
                try:
                    view = self.store.view(operation_id)
                except MalformedRow:
                    continue  # the claim that meets the row names it and passes over it
                if view is not None:
                    live.append(view.operation)
            now = self.store.now()
            self._claim_lost = False
        mine = [
            operation for operation in live
            if o.check_owner(operation, o.Credential(operation.operation_id, self.worker_id, operation.fence), now) is None
        ]  # fmt: skip
        if not mine:
            return None  # not committed, or no longer this worker's: the claims go on as usual
        operation = max(mine, key=lambda op: (op.attempt_started_at or now, op.fence))
        credential = o.Credential(operation.operation_id, self.worker_id, operation.fence)
        self._refused.pop(operation.operation_id, None)
        return self._resumed(
            self._begin(operation, credential),
            f"attempt {credential.fence}'s claim had committed before its answer was lost: the attempt runs now",
        )

    def _beating(self, credential: o.Credential, body: Callable[[], WorkReport]) -> WorkReport:
        with self._heartbeats(credential):
            return body()

    @staticmethod
    def _resumed(report: WorkReport, said: str) -> WorkReport:
        detail = f"resumed: the store answers again and {said}"
        return attrs.evolve(report, detail=f"{detail}; {report.detail}" if report.detail else detail, resumed=True)

    @staticmethod
    def _report(credential: o.Credential, outcome: o.Outcome) -> WorkReport:
        if isinstance(outcome, o.Refusal):
            return WorkReport(credential.operation_id, credential.fence, outcome.code.value, outcome.message)
        if isinstance(outcome, o.Unchanged):
            return WorkReport(credential.operation_id, credential.fence, outcome.code.value, outcome.message)
        return _ended(outcome.operation, credential.fence)


class _Heartbeat:
    """One thread per worker renewing the lease of the action running now, parked between actions.

    A thread per action cost more CPU than the rest of a read-only pass; this
    one is started once and ends on its own after a while with nothing to
    renew.  ``start`` hands it a credential, ``stop`` takes it back and waits
    out a renewal in flight, so nothing is renewed for an action that ended.
    """

    _IDLE = 5.0
    """Seconds with nothing to renew after which the thread ends (the next action starts another)."""

    def __init__(self, store: OperationStore, lease: timedelta, worker_id: str) -> None:
        self.store = store
        self.lease = lease
        self.interval = lease.total_seconds() / 3
        self.name = f"{worker_id}-heartbeat"
        self.changed = threading.Condition()
        self.credential: o.Credential | None = None
        self.generation = 0
        self.busy = False
        self.failing = False
        """The last renewal failed retryably: the next one is tried sooner."""
        self.thread: threading.Thread | None = None

    def start(self, credential: o.Credential) -> None:
        with self.changed:
            self.credential = credential
            self.generation += 1
            self.failing = False
            if self.thread is None or not self.thread.is_alive():  # not yet, ended idle, or lost in a fork
                self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self.thread.start()
            self.changed.notify_all()

    def stop(self) -> None:
        with self.changed:
            self.credential = None
            self.generation += 1
            self.changed.notify_all()
            while self.busy:
                self.changed.wait()

    def _run(self) -> None:
        with self.changed:
            while True:
                if self.credential is None:
                    if not self.changed.wait(self._IDLE) and self.credential is None:
                        self.thread = None  # under the lock: the next start() sees it gone and starts one
                        return
                    continue
                credential, generation = self.credential, self.generation
                due = time.monotonic() + (min(self.interval, _RENEWAL_RETRY) if self.failing else self.interval)
                while self.generation == generation and (left := due - time.monotonic()) > 0:
                    self.changed.wait(left)
                if self.generation != generation:
                    continue
                self.busy = True
                self.changed.release()
                self.failing = False
                try:
                    renewed = isinstance(self.store.heartbeat(o.HeartbeatRequest(credential, self.lease)), o.Decision)
                except StoreError as exc:
                    if exc.code not in RETRYABLE_STORE_CODES:
                        traceback.print_exc()
                    # The store is away for a moment (a lost connection, a busy file): the lease still runs, so
                    # renewing goes on, a second later.  Given up, a blip ran a long action's lease out under it.
                    renewed = self.failing = exc.code in RETRYABLE_STORE_CODES
                except Exception:
                    renewed = False
                    traceback.print_exc()  # as the thread's own death printed it: renewing this action stops
                finally:
                    self.changed.acquire()
                    self.busy = False
                    self.changed.notify_all()
                if not renewed and self.generation == generation:
                    self.credential = None  # refused (replaced, cancelled): stop renewing this action


def _answer(action: DurableAction, method: str, value: object, *, none: bool = True) -> EffectResult | None:
    """An adapter's answer as the worker reads it, or the error naming the action and what came back instead.

    Read unchecked, a ``perform`` that returned a dict failed deep in the worker with "'dict' object has no
    attribute 'status'", a status given as the string "succeeded" was taken for an ambiguous answer, and a
    ``retryable`` that is no bool was a failure the kernel refused to record, leaving the Attempt running
    until its lease ran out.  Raised from here, it is the action's error like any other a handler raises: a
    retryable ``handler_error``.  The intent stays unanswered, so the next Attempt reconciles before it
    performs anything.
    """
    if isinstance(value, EffectResult):
        if not isinstance(value.status, EffectStatus):
            problem = f"an EffectResult whose status is {shown(value.status)}, not an EffectStatus"
        elif not isinstance(value.retryable, bool):
            problem = f"an EffectResult whose retryable is {shown(value.retryable)}, not True or False"
        else:
            return value
    elif value is None and none:
        return None
    else:
        returned = "None" if value is None else type(value).__name__
        problem = f"{returned}, not an EffectResult" + (" or None" if none else "")
    raise TypeError(f"action {action.name!r} v{action.version}: the adapter's {method} returned {problem}")


def _looked_up(action: DurableAction, operation: o.Operation) -> str | None:
    """The result an earlier Attempt's unanswered call had, if the provider's ``reconcile`` says it succeeded.

    None when there is nothing to ask (no adapter, no intent, every issue answered) and when the look answers
    anything but a success, or breaks (a look that raises has answered nothing: the call stays unanswered).
    """
    adapter = action.adapter
    if adapter is None or operation.effect_id is None or o.effect_plan(operation) is not o.EffectPlan.RECONCILE:
        return None
    try:
        settled = _answer(action, "reconcile", adapter.reconcile(operation.effect_id))
        if settled is None or settled.status is not EffectStatus.SUCCEEDED:
            return None
        return _result_json(settled.result)
    except Exception:
        return None


def _performed(action: DurableAction, value: object) -> EffectResult:
    """``perform``'s answer: an EffectResult, never None (see :func:`_answer`)."""
    answer = _answer(action, "perform", value, none=False)
    assert answer is not None
    return answer


def _result_json(value: Any) -> str:
    """An action's result as JSON text, as the encoder writes it (a result's numbers are not rewritten).

    A result that is not JSON is the action's error (a retryable ``handler_error``), not the caller's input:
    the encoder's own error would end the worker and leave its Attempt running until the lease expires.  So
    is an object key that is not a string, which the encoder would write as one without a word (``{1: "a"}``
    stored as ``{"1": "a"}``), named where it is as an input's is.  The keys are walked only when the text
    holds an object, or when the encoder failed (mixed keys fail its sorting, in words that name nothing).
    """
    try:
        text = _json_text(value, "result")
    except DurableOperationError as exc:
        problem = None
        with suppress(RecursionError):  # nested too deeply: the encoder's own error says so
            problem = _key_problem(value, "result")
        raise ValueError(problem or exc.message) from None
    deep = o.result_depth_problem(text)
    if deep is not None:
        # complete would refuse it (invalid_request): the action's error, so the Attempt fails and is retried
        # rather than left running until its lease expires.
        raise ValueError(f"result: {deep}")
    if "{" in text:
        problem = _key_problem(value, "result")
        if problem is not None:
            raise ValueError(problem)
    return text


def _ended_by(request: _OwnerRequest, attempt: o.Attempt) -> bool:
    """Whether ``attempt`` ended as ``request`` ends it (an intent or a renewal ends no Attempt)."""
    if isinstance(request, o.CompleteRequest):
        return attempt.state is o.AttemptState.SUCCEEDED
    if isinstance(request, o.FailRequest):
        return attempt.state is o.AttemptState.FAILED and attempt.error_code == request.error_code
    if isinstance(request, o.UnknownRequest):
        return attempt.state is o.AttemptState.OUTCOME_UNKNOWN
    return False


def _settled(view: OperationView, credential: o.Credential) -> WorkReport:
    """The report of a write that ended the Attempt of ``credential``, from the Operation as read."""
    if view.operation.fence == credential.fence:
        return _ended(view.operation, credential.fence)
    # Retried, and claimed again since: this Attempt's end was a retry.
    return WorkReport(view.operation.operation_id, credential.fence, "retry", f"claimed again as attempt {view.operation.fence}")


def _effect_id(operation: o.Operation) -> str:
    """The effect id of an Operation whose intent is committed (the intent sets it, and nothing clears it)."""
    assert operation.effect_id is not None
    return operation.effect_id


def _intent_committed(view: OperationView, credential: o.Credential) -> bool:
    """Whether the history holds the effect's intent recorded under ``credential``'s fence (only its owner records one)."""
    return any(
        t.event is OperationEvent.RECORD_INTENT and t.fence == credential.fence for t in view.history
    )


def _ended(operation: o.Operation, attempt: int | None) -> WorkReport:
    if operation.outcome is not None:
        return WorkReport(operation.operation_id, attempt, operation.outcome.value, operation.error_code or "")
    return WorkReport(operation.operation_id, attempt, "retry", f"eligible again {operation.next_eligible_at.isoformat()}")
