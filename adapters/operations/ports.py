"""The port every operation store implements, and the guarded context atomic actions write through.

Rules of this module:

- One Protocol for the operations subsystem (:class:`OperationStore`),
  beside the executions' ``store.Store``: a store implements the ports it
  supports.
- Every method that changes anything is one transaction that applies one
  kernel decision (``fencekeeper.kernel.operations``) under its guard, or
  nothing: a refusal leaves the store exactly as it was.  Time is the
  store's (the database's on PostgreSQL), read inside the transaction after
  the Operation's row is locked.
- :meth:`OperationStore.complete` takes the atomic action's writes as a
  callable.  The store locks the row, decides, and only on a Decision runs
  the callable with a :class:`GuardedContext` bound to the same
  transaction; the action's writes, the Attempt's success, the Operation's
  success, its result, transition and outbox row commit together, or none
  of them does.  The context refuses use once its transaction has ended,
  and the store refuses the commit when the fence is no longer current.
- What an atomic action sends through ``execute`` stays inside that
  transaction: a statement that would end it, split it or leave it
  (``COMMIT``, ``ROLLBACK``, ``SAVEPOINT``, ``BEGIN``, several statements
  in one string, ...) is refused with :class:`StatementRefused`, and so,
  on SQLite, is a write to the store's own tables (docs/operations.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.common import shown
from fencekeeper.kernel.errors import InvalidOperation

# ClaimRefused's __init__, written by attrs, carries Refusal's annotations as text (the kernel's
# postponed annotations): a reader that resolves them here, as the API reference does, needs this name.
from fencekeeper.kernel.operations import RefusalCode  # noqa: F401

from ..store import StoreError


class MalformedRow(StoreError):
    """``StoreError('malformed_row')``: a stored Operation whose fields contradict its state (``operation_problem``).

    ``namespace`` and ``tenant`` are the row's, when the store read them
    (None otherwise), so that a caller acting for another namespace or tenant
    is told the Operation does not exist, as for any other of its rows, and
    not what this one holds.
    """

    def __init__(self, error: InvalidOperation, namespace: str | None = None, tenant: str | None = None) -> None:
        super().__init__(
            "malformed_row",
            f"{error.message} (the stored row contradicts its state: it was edited by hand or damaged; "
            "nothing was written)",
        )
        self.operation_id = error.operation_id
        self.field = error.field
        self.namespace = namespace
        self.tenant = tenant


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


# NaN and the infinities are Python's extension of JSON: the store never writes them (canonical_json refuses them).
_STORED_JSON = json.JSONDecoder(parse_constant=_not_json)


def decode_stored_json(operation: o.Operation, column: str, text: Any) -> Any:
    """``operation``'s ``column`` (its ``input`` or ``result``) as the store wrote it: JSON text, decoded.

    Anything else (text that is not JSON, NaN, a value that is not text: a hand edit or damage) is
    :class:`MalformedRow` naming the column, never a bare decoding error from the worker or the status.
    """
    try:
        return _STORED_JSON.decode(text)
    except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        problem = f"{shown(text)} cannot be read as JSON ({type(exc).__name__}: {exc})"
        raise MalformedRow(
            InvalidOperation(operation.operation_id, column, problem),
            operation.identity.namespace,
            operation.identity.tenant,
        ) from None


class StaleContext(Exception):
    """The guarded context was used outside its transaction (after commit or rollback)."""

    code = "stale_context"


class StatementRefused(Exception):
    """An atomic action sent a statement that would end, split or leave its transaction, or write the store's tables.

    Raised before anything of the statement runs (or, for a string of
    several statements on PostgreSQL, by the server, which runs none of
    them).  The context then refuses everything else too, and the attempt
    fails like any other handler error: its transaction is rolled back, so
    nothing the action wrote is visible.
    """

    code = "statement_refused"


class GuardedContext(Protocol):
    """What an atomic action may do: write the application's own tables in the Operation's transaction.

    ``execute`` takes SQL with ``?`` placeholders on every SQL store (the
    PostgreSQL store translates them).  ``tables`` is the memory store's
    application state: a dict of tables, each a dict of rows by key, copied
    at the start of the transaction and published only with its commit.
    """

    operation_id: str
    fence: int
    dialect: str
    """``memory``, ``sqlite`` or ``postgresql``: which of ``tables`` and ``execute`` the action uses."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    @property
    def tables(self) -> dict[str, dict[Any, Any]]: ...


AtomicAction = Callable[[GuardedContext], str]
"""Runs inside the completion transaction and returns the result as JSON text."""


@attrs.frozen
class OperationView:
    """An Operation with its Attempts and history, oldest first."""

    operation: o.Operation
    input: str
    attempts: tuple[o.Attempt, ...]
    history: tuple[o.Transition, ...]


@attrs.frozen
class ClaimRefused(o.Refusal):
    """The kernel refused the claim of the Operation the store found due first, or the store could not read it.

    The kernel claims or ends every Operation its ``due`` says is due
    (``INV-OP-DUE-CLAIMED``), so this means the row and the kernel disagree
    (edited data, a store whose ``due_at`` is wrong), or, with code
    ``malformed_row``, that the row contradicts its state (:class:`MalformedRow`,
    whose message and field it carries).  Nothing was written and the row
    is still due and first: a caller passes over it with ``claim_next``'s
    ``skip`` so the rest of the tenant's work goes on.
    """

    operation_id: str = ""


class OperationStore(Protocol):
    def now(self) -> datetime: ...

    def submit(self, request: o.SubmitRequest, input_json: str) -> o.Outcome: ...

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
        """Claim (or end by its limits) the Operation of ``tenant`` that has been due longest; None if none is.

        Operations named in ``skip`` are passed over.  A refusal of the row found is a :class:`ClaimRefused`, and
        so is a row found that contradicts its state or that cannot be read, its input included when the claim
        would hand it to a worker (code ``malformed_row``): one damaged row does not stop the claims of every other.
        ``runs(action_name, action_version)`` says whether the caller can run an action version: a claim that would
        start an Attempt of one it cannot is not written (code ``action_not_registered``), so a worker deployed
        without an action never uses up an Operation's attempts.  A claim that ends the Operation by its limits
        is made whatever ``runs`` says: it runs nothing.

        A store whose ``claim_tokens`` attribute is True also takes ``claim_token``: a token the worker made for
        this claim, kept with the Attempt the claim begins, by which ``running_under`` finds it if the claim's
        answer is lost.  The stores here all do; a worker passes it only to a store that says so.
        """
        ...

    def heartbeat(self, request: o.HeartbeatRequest) -> o.Outcome: ...

    def record_intent(self, request: o.IntentRequest) -> o.Outcome: ...

    def complete(self, request: o.CompleteRequest, action: AtomicAction | None = None) -> o.Outcome: ...

    def fail(self, request: o.FailRequest) -> o.Outcome: ...

    def outcome_unknown(self, request: o.UnknownRequest) -> o.Outcome: ...

    def decide(self, request: o.DecideRequest) -> o.Outcome: ...

    def cancel(self, request: o.CancelRequest) -> o.Outcome: ...

    def get(self, operation_id: str) -> o.Operation | None: ...

    def view(self, operation_id: str) -> OperationView | None: ...

    def input_of(self, operation_id: str) -> str | None:
        """The Operation's normalised input (JSON text), without its history."""
        ...

    def input_value(self, operation_id: str) -> Any:
        """The Operation's input decoded, as a worker runs its action on it; None if there is no such Operation.

        After ``claim_next`` claimed it, the input that claim read and decoded in its own transaction.  Input the
        store cannot have written is :class:`MalformedRow` naming ``input`` (``claim_next`` refuses to claim it).
        """
        ...

    def outbox(self, after: str | None = None, limit: int = 100) -> list[o.OutboxMessage]: ...

    def active_references(self) -> list[tuple[str, int, str]]:
        """(action name, action version, principal reference) of every Operation not yet ended."""
        ...

    def prune_identities(self, limit: int = 1000) -> int:
        """One batch: forget identities past their window whose Operation has ended; how many."""
        ...

    def close(self) -> None: ...
