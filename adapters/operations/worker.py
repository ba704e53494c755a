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
  holds the Operation's row, so its lease must cover it.
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
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any, Final

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.common import duration_problem, identifier_problem, shown

from .ports import ClaimRefused, GuardedContext, MalformedRow, OperationStore
from .service import (
    ActionFailed,
    DurableAction,
    DurableActionRegistry,
    DurableOperationError,
    EffectResult,
    EffectStatus,
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

    def run_once(self) -> WorkReport | None:
        if self._paused is not None and self.store.now() < self._paused.until:
            return None
        skip = self._passing_over()
        for _ in range(_REMEMBERED):
            # Passing over the rows this worker already reported: a pass ends with a claim, a report or None.
            outcome = self.store.claim_next(
                self.tenant, self.worker_id, self.lease, namespace=self.namespace, runs=self.actions.has,
                **({"skip": skip} if skip else {}),
            )
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
        return self._run(operation, outcome.credential)

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
        try:
            if action.effect_class is o.EffectClass.ATOMIC:
                return self._atomic(action, credential, authority, payload)
            with self._heartbeats(credential):
                if action.effect_class is o.EffectClass.READ_ONLY:
                    result = _result_json(action.handler(payload))
                else:
                    return self._external(action, operation, credential, authority, payload)
            return self._complete(credential, authority, result)
        except ActionFailed as failure:
            return self._fail(credential, failure.code, retryable=failure.retryable, detail=str(failure))
        except Exception as exc:
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
        def write(context: GuardedContext) -> str:
            return _result_json(action.handler(context, payload))

        outcome = self.store.complete(o.CompleteRequest(credential, authority), write)
        if isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.DEADLINE_EXCEEDED:
            return self._past_deadline(credential, outcome)
        return self._report(credential, outcome)

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
        intent = self.store.record_intent(o.IntentRequest(credential))
        if isinstance(intent, o.Refusal) and intent.code is o.RefusalCode.DEADLINE_EXCEEDED:
            if plan is o.EffectPlan.RECONCILE and operation.effect_id is not None:
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
        effect_id = intent.operation.effect_id
        assert effect_id is not None
        if plan is o.EffectPlan.RECONCILE:
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
            renewed = self.store.heartbeat(o.HeartbeatRequest(credential, self.lease))
            if not isinstance(renewed, o.Decision):
                return self._report(credential, renewed)
        try:
            outcome = adapter.perform(effect_id, request)
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
        return self._report(credential, self.store.complete(o.CompleteRequest(credential, authority, result)))

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
        outcome = self.store.fail(request)
        report = self._report(credential, outcome)
        return attrs.evolve(report, detail=detail or report.detail)

    def _past_deadline(self, credential: o.Credential, refusal: o.Refusal) -> WorkReport:
        """The store refused to let this Attempt start its effect past the overall deadline: end the Operation so.

        A retryable failure from the deadline on ends ``deadline_exceeded`` (the kernel's ``fail``), at once,
        rather than leaving the Operation running until the lease runs out.  If the lease ran out too, the
        failure is refused as well and the next claim ends it ``deadline_exceeded``: nothing is retried here.
        """
        return self._fail(credential, "deadline_exceeded", retryable=True, detail=refusal.message)

    def _unknown(self, credential: o.Credential, detail: str) -> WorkReport:
        return self._report(credential, self.store.outcome_unknown(o.UnknownRequest(credential, detail)))

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
        self.thread: threading.Thread | None = None

    def start(self, credential: o.Credential) -> None:
        with self.changed:
            self.credential = credential
            self.generation += 1
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
                due = time.monotonic() + self.interval
                while self.generation == generation and (left := due - time.monotonic()) > 0:
                    self.changed.wait(left)
                if self.generation != generation:
                    continue
                self.busy = True
                self.changed.release()
                try:
                    renewed = isinstance(self.store.heartbeat(o.HeartbeatRequest(credential, self.lease)), o.Decision)
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


def _ended(operation: o.Operation, attempt: int | None) -> WorkReport:
    if operation.outcome is not None:
        return WorkReport(operation.operation_id, attempt, operation.outcome.value, operation.error_code or "")
    return WorkReport(operation.operation_id, attempt, "retry", f"eligible again {operation.next_eligible_at.isoformat()}")
