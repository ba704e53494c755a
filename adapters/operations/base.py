"""What every operation store does the same way: one transaction per decision, under its guard.

Rules of this module:

- A store subclass supplies only a transaction (:class:`Tx`): how rows are
  locked and read, where time comes from, how a decision is written under
  its guard.  The order of a request is always: lock, read the time, decide
  (the kernel), write under the guard, commit.  Nothing decides here.
- A guard that fails at write time (which row locks make rare) rolls the
  transaction back and the request is decided again on the rows as they now
  are, a bounded number of times.
- A live-lease guard is judged with the store's time read again just before
  the write, so a decision made while the lease was live does not commit
  after it expired (an atomic action may take time between the two).
- A refusal leaves the store exactly as it was: its transaction is rolled
  back, including whatever an atomic action wrote.
- A stored Operation whose fields contradict its state (old code, a hand
  edit, damage: ``operations.operation_problem``) is never decided on: the
  request fails with ``StoreError('malformed_row')`` naming the operation
  and the field, and its transaction is rolled back.  ``claim_next``, which
  names no row, returns it as a ``ClaimRefused`` coded ``malformed_row``
  instead, so its caller can pass over it and claim the tenant's other work.
  So is a due row whose input cannot be decoded: the claim that would hand
  it to a worker decodes it before the claim is written.
  What the kernel refuses before it looks at the Operation (an invalid
  request, a submitter without current authority) is refused so on every
  store, and tells nothing of the row (``_read``).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any, TypeVar

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.errors import InvalidOperation
from fencekeeper.kernel.machines import OperationState

from ..store import StoreError
from .ports import AtomicAction, ClaimRefused, GuardedContext, MalformedRow, OperationView, decode_stored_json

_ATTEMPTS = 5

R = TypeVar("R")
K = TypeVar("K")


def due_at(operation: o.Operation) -> datetime | None:
    """When a claim (or the deadline sweep) next has something to do with ``operation``; None: never.

    The SQL stores index this column; ``operations.due`` is its reference.
    """
    state = operation.state
    if state is OperationState.ADMITTED:
        return min(operation.next_eligible_at, operation.deadline)
    if state is OperationState.RUNNING:
        return operation.lease_expires_at
    if state is OperationState.AWAITING_APPROVAL:
        return operation.deadline
    return None


class Tx(abc.ABC):
    """One transaction of a store."""

    checks_live_lease: bool = False
    """True when :meth:`write` itself checks a guard's ``live_until`` against the store's time at write."""

    claim_token: str | None = None
    """The token the claiming worker made for the claim this transaction writes (set by ``claim_next``).

    Kept on the claim's new Attempt, and nowhere else: the worker finds that Attempt by it if the claim's answer
    is lost (:meth:`running_under`), whatever other process runs under the same worker id.
    """

    def token_of(self, decision: o.Decision, attempt: o.Attempt) -> str | None:
        """The claim token ``attempt`` is written with: this transaction's, on the Attempt its claim begins."""
        credential = decision.credential
        return self.claim_token if credential is not None and attempt.number == credential.fence else None

    @abc.abstractmethod
    def now(self) -> datetime:
        """The store's authoritative time, read now."""

    @abc.abstractmethod
    def lock_operation(self, operation_id: str) -> o.Operation | None: ...

    @abc.abstractmethod
    def lock_identity(self, identity: o.Identity) -> o.Operation | None:
        """Serialize submissions of ``identity`` and return the Operation it names, if any.

        Only the identity is locked: the Operation is read as committed, not
        locked, so that a resubmission never waits for a worker holding the
        Operation's row (an atomic action runs while it holds it).  Admission
        reads only what never changes (the binding) and whether the
        Operation has ended, and writes only the identity and a new
        Operation, whose guard names the identity's holder.
        """

    @abc.abstractmethod
    def lock_next_due(
        self, tenant: str, namespace: str | None, skip: frozenset[str] = frozenset()
    ) -> o.Operation | None:
        """Lock the Operation of ``tenant`` due longest at the store's time (skipping rows others hold, and ``skip``)."""

    @abc.abstractmethod
    def write(self, decision: o.Decision, input_json: str | None) -> bool:
        """Apply ``decision`` under its guard; False (and nothing written) if the guard does not hold."""

    @abc.abstractmethod
    def input_of(self, operation_id: str) -> str | None: ...

    @abc.abstractmethod
    def prune_identities(self, limit: int) -> int:
        """Forget up to ``limit`` identities whose window has passed and whose Operation has ended."""

    def running_under(
        self, tenant: str, namespace: str | None, worker_id: str, claim_token: str | None = None
    ) -> list[str]:
        """The ids of ``tenant``'s Operations running with ``worker_id`` as their owner, whatever their lease.

        With ``claim_token``, only those whose current Attempt its claim wrote with that token.  Asked only by
        a worker whose claim lost its answer, which knows whom it claimed as but not what
        (:meth:`TransactionalOperationStore.running_under`).  A transaction that cannot say answers none:
        such a claim's lease then runs out, as after a crash.
        """
        return []

    @abc.abstractmethod
    def context(self, operation: o.Operation) -> GuardedContext: ...

    @abc.abstractmethod
    def close_context(self, context: GuardedContext) -> None: ...


class _GuardFailed(Exception):
    pass


class _Rollback(Exception):
    def __init__(self, outcome: o.Outcome) -> None:
        super().__init__("rolled back")
        self.outcome = outcome


class TransactionalOperationStore(abc.ABC):
    """The operation port, for any store that can give a :class:`Tx`."""

    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[Tx]: ...

    @abc.abstractmethod
    def now(self) -> datetime: ...

    @abc.abstractmethod
    def view(self, operation_id: str) -> OperationView | None: ...

    @abc.abstractmethod
    def outbox(self, after: str | None = None, limit: int = 100) -> list[o.OutboxMessage]: ...

    @abc.abstractmethod
    def active_references(self) -> list[tuple[str, int, str]]: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def tenant_scope(self, tenant: str) -> contextlib.AbstractContextManager[None]:
        """Every transaction opened inside runs as ``tenant`` where the store enforces tenants itself.

        PostgreSQL with the tenant policies (migration 9) sets
        ``fencekeeper.tenant`` for each transaction; the other stores have no
        second boundary beside the service's own filter and ignore it.
        """
        return contextlib.nullcontext()

    _claimed_inputs: dict[str, Any]

    @property
    def _claimed(self) -> dict[str, Any]:
        """Inputs read and decoded by claims in their own transaction, until the claiming worker asks for them."""
        try:
            return self._claimed_inputs
        except AttributeError:
            self._claimed_inputs = {}
            return self._claimed_inputs

    def input_of(self, operation_id: str) -> str | None:
        return self._read_input(operation_id)

    def input_value(self, operation_id: str) -> Any:
        claimed = self._claimed
        if operation_id in claimed:
            return claimed.pop(operation_id)
        # Not claimed through this store object: read now (the row may have been damaged since a claim read it).
        view = self.view(operation_id)
        return None if view is None else decode_stored_json(view.operation, "input", view.input)

    def _read_input(self, operation_id: str) -> str | None:
        view = self.view(operation_id)
        return None if view is None else view.input

    def get(self, operation_id: str) -> o.Operation | None:
        view = self.view(operation_id)
        return None if view is None else view.operation

    # --- the request shape ------------------------------------------------------------

    def _run(self, body: Callable[[Tx], o.Outcome]) -> o.Outcome:
        for _ in range(_ATTEMPTS):
            try:
                with self._transaction() as tx:
                    return body(tx)
            except _GuardFailed:
                continue
            except _Rollback as rollback:
                return rollback.outcome
            except InvalidOperation as error:
                # Raised by the kernel on a value a store of values holds (the SQL stores refuse the row as they
                # read it); the transaction has rolled back.
                raise MalformedRow(error) from None
        raise StoreError("guard_contention", f"a decision's guard failed {_ATTEMPTS} times in a row; try again")

    @staticmethod
    def _write(tx: Tx, decision: o.Decision, input_json: str | None = None) -> None:
        if decision.guard.live_until is not None and not tx.checks_live_lease:
            # The kernel names it: an expired lease, or the deadline for a decision that starts an effect.
            late = o.commit_refusal(decision, tx.now())
            if late is not None:
                raise _Rollback(late)
        if not tx.write(decision, input_json):
            raise _GuardFailed()

    def _decide(
        self, operation_id: str, decide: Callable[[o.Operation | None, R, datetime], o.Outcome], request: R
    ) -> o.Outcome:
        def body(tx: Tx) -> o.Outcome:
            operation = _read(tx, tx.lock_operation, operation_id, decide, request)
            outcome = decide(operation, request, tx.now())
            if isinstance(outcome, o.Decision):
                self._write(tx, outcome)
            return outcome

        return self._run(body)

    # --- the port -----------------------------------------------------------------------

    def submit(self, request: o.SubmitRequest, input_json: str) -> o.Outcome:
        def body(tx: Tx) -> o.Outcome:
            existing = _read(tx, tx.lock_identity, request.identity, o.submit, request)
            outcome = o.submit(existing, request, tx.now())
            if isinstance(outcome, o.Decision):
                self._write(tx, outcome, input_json)
            return outcome

        return self._run(body)

    def claim_next(
        self,
        tenant: str,
        worker_id: str,
        lease: timedelta,
        *,
        namespace: str | None = None,
        skip: Collection[str] = (),
        runs: Callable[[str, int], bool] | None = None,
        claim_token: str | None = None,
    ) -> o.Outcome | None:
        request = o.ClaimRequest(worker_id, lease)
        passed_over = frozenset(skip)

        def body(tx: Tx) -> o.Outcome:
            tx.claim_token = claim_token
            operation: o.Operation | None = None
            try:
                operation = _read(
                    tx, lambda _: tx.lock_next_due(tenant, namespace, passed_over), None, o.claim, request
                )
                if operation is None:
                    raise _Rollback(_NOTHING)
                outcome = o.claim(operation, request, tx.now())
            except MalformedRow as malformed:  # a SQL store's, as it read the row
                raise _Rollback(_unreadable(malformed)) from None
            except InvalidOperation as error:  # the kernel's, on a value a store of values holds
                if operation is None:
                    raise  # no row was read, so none can be named: _run reports it as for any request
                raise _Rollback(
                    _unreadable(MalformedRow(error, operation.identity.namespace, operation.identity.tenant))
                ) from None
            if isinstance(outcome, o.Refusal) and outcome.code is not o.RefusalCode.INVALID_REQUEST:
                # Found due and refused: nothing is written and the row stays first in the queue.  Named, so the
                # caller can pass over it instead of being handed the same row by every later claim.  (A
                # malformed request is the caller's, not the row's: it is refused as it is.)
                return ClaimRefused(
                    outcome.code,
                    f"operation {operation.operation_id!r} is due but its claim is refused: {outcome.message}",
                    outcome.field,
                    operation_id=operation.operation_id,
                )
            if (isinstance(outcome, o.Decision) and outcome.credential is not None and runs is not None
                    and not runs(operation.action_name, operation.action_version)):
                # An Attempt this worker could only fail (an old worker during a rolling deployment, a
                # registry that lost a version): not written, so no attempt is used, and named, so the
                # worker passes over the row and a worker that has the version claims it.
                raise _Rollback(ClaimRefused(
                    o.RefusalCode.ACTION_NOT_REGISTERED,
                    f"operation {operation.operation_id!r} is due but this worker has no action "
                    f"{operation.action_name!r} version {operation.action_version}: not claimed, no attempt used",
                    "action",
                    operation_id=operation.operation_id,
                ))
            if isinstance(outcome, o.Decision) and outcome.credential is not None:
                # The worker runs the action on the input next: read and decode it in this transaction, before the
                # claim is written (on PostgreSQL the write commits).  An input no worker can read is then a due
                # row this claim cannot read, passed over like any other, instead of a claim that commits and a
                # worker that fails on it, using up an attempt each time, while the queue waits behind it.
                try:
                    payload = decode_stored_json(operation, "input", tx.input_of(operation.operation_id))
                except MalformedRow as malformed:
                    raise _Rollback(_unreadable(malformed)) from None
                self._write(tx, outcome)
                claimed = self._claimed
                if len(claimed) > 1000:  # inputs nobody asked for (a worker that died): forget them
                    claimed.clear()
                claimed[operation.operation_id] = payload
            elif isinstance(outcome, o.Decision):
                self._write(tx, outcome)
            return outcome

        outcome = self._run(body)
        return None if outcome is _NOTHING else outcome

    def prune_identities(self, limit: int = 1000) -> int:
        """One batch of identity pruning: identities are kept for their whole window, and while their work is active.

        Returns how many were forgotten; call again until it returns 0.  The
        Operations themselves and their history stay.
        """
        if not isinstance(limit, int) or limit < 1:
            raise StoreError("invalid_input", f"limit: must be a positive integer, got {limit!r}")
        pruned = [0]

        def body(tx: Tx) -> o.Outcome:
            pruned[0] = tx.prune_identities(limit)
            return _NOTHING

        self._run(body)
        return pruned[0]

    claim_tokens = True
    """This store keeps the token of ``claim_next(claim_token=...)`` and finds by it (:meth:`running_under`)."""

    def running_under(
        self, tenant: str, worker_id: str, *, namespace: str | None = None, claim_token: str | None = None
    ) -> list[str]:
        """The ids of ``tenant``'s Operations (of ``namespace``, if given) running with ``worker_id`` as their owner.

        With ``claim_token``, only the one whose current Attempt the claim made with that token began.  Not the
        port's: a worker whose ``claim_next`` lost its answer (a ``StoreError`` it may recover from) asks it on
        its next pass, to go on with what that claim may have committed (specs/operations.md, "An owner write
        of unknown outcome").  The lease is not judged here: the worker reads each Operation and judges its
        credential itself.
        """
        found: list[str] = []

        def body(tx: Tx) -> o.Outcome:
            found.extend(tx.running_under(tenant, namespace, worker_id, claim_token))
            return _NOTHING

        self._run(body)
        return found

    def claim(self, operation_id: str, request: o.ClaimRequest) -> o.Outcome:
        return self._decide(operation_id, o.claim, request)

    def heartbeat(self, request: o.HeartbeatRequest) -> o.Outcome:
        return self._decide(request.credential.operation_id, o.heartbeat, request)

    def record_intent(self, request: o.IntentRequest) -> o.Outcome:
        return self._decide(request.credential.operation_id, o.record_intent, request)

    def fail(self, request: o.FailRequest) -> o.Outcome:
        return self._decide(request.credential.operation_id, o.fail, request)

    def outcome_unknown(self, request: o.UnknownRequest) -> o.Outcome:
        return self._decide(request.credential.operation_id, o.outcome_unknown, request)

    def decide(self, request: o.DecideRequest) -> o.Outcome:
        return self._decide(request.operation_id, o.decide, request)

    def cancel(self, request: o.CancelRequest) -> o.Outcome:
        return self._decide(request.operation_id, o.cancel, request)

    def complete(self, request: o.CompleteRequest, action: AtomicAction | None = None) -> o.Outcome:
        """The guarded completion; with ``action``, the atomic action's writes commit with it or not at all."""

        def body(tx: Tx) -> o.Outcome:
            operation = _read(tx, tx.lock_operation, request.credential.operation_id, o.complete, request)
            now = tx.now()
            if action is None:
                outcome = o.complete(operation, request, now)
                if isinstance(outcome, o.Decision):
                    self._write(tx, outcome)
                return outcome
            # Refused before the action runs, or it runs: the success itself is decided on its result below.
            refusal = o.complete_refusal(operation, request, now)
            if refusal is not None:
                return refusal
            assert operation is not None
            if operation.effect_class is not o.EffectClass.ATOMIC:
                return o.Refusal(
                    o.RefusalCode.WRONG_EFFECT_CLASS,
                    f"{operation.effect_class.value} actions do not write through the guarded context",
                )
            context = tx.context(operation)
            try:
                result = action(context)
            finally:
                tx.close_context(context)
            outcome = o.complete(operation, attrs.evolve(request, result=result), now)
            if not isinstance(outcome, o.Decision):
                raise _Rollback(outcome)
            self._write(tx, outcome)
            return outcome

        return self._run(body)


def _read(
    tx: Tx,
    read: Callable[[K], o.Operation | None],
    key: K,
    decide: Callable[[o.Operation | None, R, datetime], o.Outcome],
    request: R,
) -> o.Operation | None:
    """``read(key)``; a malformed row it meets is the store's error only if the kernel would look at the row.

    The kernel judges the request itself (and a submitter's current authority) before the Operation it is
    given, and refuses what fails there without reading it: the memory store, which hands it the value, answers
    so.  A SQL store refuses the row as it reads it, so the kernel is asked what it answers without one; a
    refusal other than ``operation_not_found`` is that answer, told without anything of the row.
    """
    try:
        return read(key)
    except MalformedRow:
        answer = decide(None, request, tx.now())
        if isinstance(answer, o.Refusal) and answer.code is not o.RefusalCode.OPERATION_NOT_FOUND:
            raise _Rollback(answer) from None
        raise


def _unreadable(malformed: MalformedRow) -> ClaimRefused:
    """The due row ``claim_next`` met and cannot read as an Operation, named so that its caller passes over it.

    Not raised, as for a request naming the row: one damaged row would stop every claim of its tenant's queue
    (it stays due and first).  Rolled back, so nothing is written; the row stays as it is until repaired.
    """
    return ClaimRefused(
        o.RefusalCode.MALFORMED_ROW, malformed.message, malformed.field, operation_id=malformed.operation_id
    )


_NOTHING = o.Refusal(o.RefusalCode.NOT_ELIGIBLE, "nothing is due")

