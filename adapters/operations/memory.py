"""The in-memory operation store: the reference every other store is compared with.

Rules of this module:

- One lock serializes every transaction (the memory store's row lock is
  the whole store).  A transaction works on copies of the tables and
  publishes them only when it commits, so a refusal, a failed guard or an
  atomic action that raises leaves everything exactly as it was.
- The application's own state lives here too (``tables``), so atomic
  actions have something to write in the same transaction.
- Time is the injected clock's, read inside the transaction.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.errors import InvalidOperation
from fencekeeper.kernel.machines import OperationState

from ..store import Clock, StoreError, SystemClock
from .base import TransactionalOperationStore, Tx, due_at
from .ports import GuardedContext, MalformedRow, OperationView, StaleContext


@attrs.define
class _State:
    operations: dict[str, o.Operation] = attrs.Factory(dict)
    inputs: dict[str, str] = attrs.Factory(dict)
    identities: dict[o.IdentityKey, str] = attrs.Factory(dict)
    """By the identity's key (``operations.identity_key``): one principal under every version of its resolver."""
    attempts: dict[str, list[o.Attempt]] = attrs.Factory(dict)
    history: dict[str, list[o.Transition]] = attrs.Factory(dict)
    outbox: list[o.OutboxMessage] = attrs.Factory(list)
    tables: dict[str, dict[Any, Any]] = attrs.Factory(dict)
    claim_tokens: dict[tuple[str, int], str] = attrs.Factory(dict)
    """By (operation, Attempt number): the token of the claim that began the Attempt, where it carried one."""

    def copy(self) -> _State:
        return _State(
            dict(self.operations),
            dict(self.inputs),
            dict(self.identities),
            {k: list(v) for k, v in self.attempts.items()},
            {k: list(v) for k, v in self.history.items()},
            list(self.outbox),
            copy.deepcopy(self.tables),
            dict(self.claim_tokens),
        )


class _Context:
    def __init__(self, state: _State, operation: o.Operation) -> None:
        self.operation_id = operation.operation_id
        self.fence = operation.fence
        self.dialect = "memory"
        self._state: _State | None = state

    @property
    def tables(self) -> dict[str, dict[Any, Any]]:
        if self._state is None:
            raise StaleContext("the operation's transaction has ended; nothing more may be written through it")
        return self._state.tables

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise StaleContext("the memory store has no SQL; write to context.tables")

    def close(self) -> None:
        self._state = None


class _MemoryTx(Tx):
    def __init__(self, state: _State, clock: Clock) -> None:
        self.state = state
        self.clock = clock

    def now(self) -> datetime:
        return self.clock.now()

    def lock_operation(self, operation_id: str) -> o.Operation | None:
        return self.state.operations.get(operation_id)

    def lock_identity(self, identity: o.Identity) -> o.Operation | None:
        holder = self.state.identities.get(o.identity_key(identity))
        return None if holder is None else self.state.operations[holder]

    def lock_next_due(
        self, tenant: str, namespace: str | None, skip: frozenset[str] = frozenset()
    ) -> o.Operation | None:
        now = self.now()
        due = [
            (when, op.operation_id)
            for op in self.state.operations.values()
            if op.identity.tenant == tenant
            and (namespace is None or op.identity.namespace == namespace)
            and op.operation_id not in skip
            and (when := due_at(op)) is not None
            and when <= now
        ]
        return self.state.operations[min(due)[1]] if due else None

    def running_under(
        self, tenant: str, namespace: str | None, worker_id: str, claim_token: str | None = None
    ) -> list[str]:
        return sorted(
            op.operation_id
            for op in self.state.operations.values()
            if op.identity.tenant == tenant
            and (namespace is None or op.identity.namespace == namespace)
            and op.state is OperationState.RUNNING
            and op.owner == worker_id
            and (claim_token is None or self.state.claim_tokens.get((op.operation_id, op.fence)) == claim_token)
        )

    def write(self, decision: o.Decision, input_json: str | None) -> bool:
        state = self.state
        guard = decision.guard
        current = state.operations.get(guard.operation_id)
        key = o.identity_key(guard.identity) if guard.identity is not None else None
        holder = state.identities.get(key) if key is not None else None
        if not guard.holds(current, holder, self.now()):
            return False
        new = decision.operation
        state.operations[new.operation_id] = new
        if key is not None:
            state.identities[key] = new.operation_id
        if input_json is not None:
            state.inputs[new.operation_id] = input_json
        attempts = state.attempts.setdefault(new.operation_id, [])
        for attempt in decision.attempts:
            attempts[:] = [a for a in attempts if a.number != attempt.number] + [attempt]
            attempts.sort(key=lambda a: a.number)
            token = self.token_of(decision, attempt)
            if token is not None:
                state.claim_tokens[(attempt.operation_id, attempt.number)] = token
        state.history.setdefault(new.operation_id, []).append(decision.transition)
        state.outbox.extend(decision.outbox)
        return True

    def input_of(self, operation_id: str) -> str | None:
        return self.state.inputs.get(operation_id)

    def prune_identities(self, limit: int) -> int:
        now = self.now()
        expired = [
            identity
            for identity, holder in self.state.identities.items()
            if self.state.operations[holder].retain_until <= now and self.state.operations[holder].outcome is not None
        ][:limit]
        for identity in expired:
            del self.state.identities[identity]
        return len(expired)

    def context(self, operation: o.Operation) -> GuardedContext:
        return _Context(self.state, operation)

    def close_context(self, context: GuardedContext) -> None:
        assert isinstance(context, _Context)
        context.close()


class MemoryOperationStore(TransactionalOperationStore):
    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._state = _State()
        self._lock = threading.RLock()
        self._closed = False

    def _open(self) -> _State:
        # Held under the lock.  After close every call is store_unavailable, as on the SQL stores,
        # rather than answering from rows a closed store no longer has.
        if self._closed:
            raise StoreError("store_unavailable", "the in-memory operation store is closed")
        return self._state

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        with self._lock:
            working = self._open().copy()
            yield _MemoryTx(working, self.clock)
            self._state = working

    def now(self) -> datetime:
        with self._lock:
            self._open()
        return self.clock.now()

    def view(self, operation_id: str) -> OperationView | None:
        with self._lock:
            state = self._open()
            operation = state.operations.get(operation_id)
            if operation is None:
                return None
            problem = o.operation_problem(operation)
            if problem is not None:
                # Refused as the SQL stores refuse the row they read: a view is read as every request is.
                raise MalformedRow(
                    InvalidOperation(operation_id, *problem), operation.identity.namespace, operation.identity.tenant
                )
            return OperationView(
                operation,
                state.inputs.get(operation_id, "null"),
                tuple(state.attempts.get(operation_id, ())),
                tuple(state.history.get(operation_id, ())),
            )

    def outbox(self, after: str | None = None, limit: int = 100) -> list[o.OutboxMessage]:
        with self._lock:
            messages = self._open().outbox
            start = next((i + 1 for i, m in enumerate(messages) if m.message_id == after), 0) if after else 0
            return messages[start : start + limit]

    def tables(self) -> dict[str, dict[Any, Any]]:
        """A copy of the application's tables as committed."""
        with self._lock:
            return copy.deepcopy(self._open().tables)

    def seed_table(self, name: str, rows: dict[Any, Any]) -> None:
        """Set an application table, as an application's own setup would (outside any Operation)."""
        with self._lock:
            self._open().tables[name] = copy.deepcopy(rows)

    def active_references(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return sorted(
                {(op.action_name, op.action_version, op.identity.principal)
                 for op in self._open().operations.values() if op.outcome is None}
            )

    def operation_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._open().operations)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._state = _State()
