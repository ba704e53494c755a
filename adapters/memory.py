"""The in-memory reference store: the model every other store is compared with.

Rules of this module:

- It is kept as simple as a store can be: all rows are one immutable value;
  a transaction works on the current value under one lock, and the new value
  replaces it only on commit, so a failed guard or an exception leaves
  nothing behind.
- It decides nothing (the shared loop in ``store.py`` asks the kernel) and
  applies a decision only if ``Guard.holds``, the guard's reference
  semantics.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime

import attrs

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionState

from .store import Backend, Clock, Evidence, ExecutionView, StoreError, TransactionalStore, registration_conflict


@attrs.frozen
class _Rows:
    """Everything the memory store holds, as one immutable value swapped on commit."""

    executions: Mapping[str, p.Execution] = attrs.field(factory=dict)
    dispatches: Mapping[str, p.Dispatch] = attrs.field(factory=dict)
    revisions: Mapping[str, tuple[p.Execution, ...]] = attrs.field(factory=dict)
    history: Mapping[str, tuple[p.TransitionRecord, ...]] = attrs.field(factory=dict)
    registrations: Mapping[p.WaitKey, p.WaitRegistration] = attrs.field(factory=dict)
    recoveries: Mapping[str, p.RecoveryRecord] = attrs.field(factory=dict)
    evidence: Mapping[str, tuple[Evidence, ...]] = attrs.field(factory=dict)


class _MemoryBackend(Backend):
    def __init__(self, rows: _Rows) -> None:
        self.rows = rows

    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        return self.rows.executions.get(execution_id), self.rows.dispatches.get(execution_id)

    def object_exists(self, object_id: str) -> bool:
        return object_id in self.rows.executions or any(
            item.object_id == object_id for items in self.rows.evidence.values() for item in items
        )

    def load_registration(self, key: p.WaitKey) -> p.WaitRegistration | None:
        return self.rows.registrations.get(key)

    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None:
        return self.rows.recoveries.get(command_id)

    def next_eligible(self, now: datetime, business_id: str | None) -> str | None:
        due = [
            (d.eligible_at, d.workflow_execution_id)
            for d in self.rows.dispatches.values()
            if d.dispatch_state == DispatchState.ELIGIBLE
            and d.eligible_at <= now
            and (business_id is None or self.rows.executions[d.workflow_execution_id].business_id == business_id)
        ]
        return min(due)[1] if due else None

    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        guard = decision.guard
        execution, dispatch = self.load(guard.execution_id)
        if not guard.holds(execution, dispatch, now):
            return False
        rows = self.rows
        eid = guard.execution_id
        executions, dispatches = dict(rows.executions), dict(rows.dispatches)
        revisions, history = dict(rows.revisions), dict(rows.history)
        if decision.execution is not None:
            executions[eid] = decision.execution
            revisions[eid] = (*revisions.get(eid, ()), decision.execution)
        if decision.dispatch is not None:
            dispatches[eid] = decision.dispatch
        history[eid] = (*history.get(eid, ()), *decision.evidence)
        registrations = dict(rows.registrations)
        new = decision.registration
        if new is not None and new.woken_by is None and new.key in registrations:
            raise registration_conflict(new.key)
        if decision.registration is not None:
            registrations[decision.registration.key] = decision.registration
        recoveries = dict(rows.recoveries)
        if decision.recovery is not None:
            recoveries[decision.recovery.command_id] = decision.recovery
        stored = dict(rows.evidence)
        ids = [item.object_id for item in evidence]
        # Evidence shares one identity space with every other generic object.
        taken = {item.object_id for items in stored.values() for item in items} | set(executions)
        if len(set(ids)) != len(ids) or taken.intersection(ids):
            raise StoreError(
                "evidence_conflict",
                f"evidence {', '.join(map(repr, ids))}: an id already exists; evidence is never overwritten",
            )
        if evidence:
            stored[eid] = (*stored.get(eid, ()), *evidence)
        self.rows = _Rows(executions, dispatches, revisions, history, registrations, recoveries, stored)
        return True


class MemoryStore(TransactionalStore):
    """The reference store: the kernel's decisions over plain values, one lock for isolation.

    It is the model every other store is compared with, so it is kept as
    simple as a store can be: a transaction works on the current value and
    the new value replaces it only on commit.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__(clock)
        self._rows = _Rows()
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with self._lock:
            backend = _MemoryBackend(self._rows)
            yield backend
            self._rows = backend.rows

    def expired(self) -> list[str]:
        now = self.clock.now()
        with self._lock:
            return sorted(
                eid
                for eid, d in self._rows.dispatches.items()
                if d.dispatch_state == DispatchState.CLAIMED and d.lease_expires_at is not None
                and d.lease_expires_at <= now
            )

    def read(self, execution_id: str) -> ExecutionView | None:
        with self._lock:
            rows = self._rows
            execution = rows.executions.get(execution_id)
            dispatch = rows.dispatches.get(execution_id)
            if execution is None or dispatch is None:
                return None
            return ExecutionView(
                execution=execution,
                dispatch=dispatch,
                revisions=rows.revisions.get(execution_id, ()),
                history=rows.history.get(execution_id, ()),
                registrations=tuple(r for k, r in rows.registrations.items() if k.execution_id == execution_id),
                recoveries=tuple(r for r in rows.recoveries.values() if r.execution_id == execution_id),
                evidence=rows.evidence.get(execution_id, ()),
            )

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        with self._lock:
            return sorted(
                eid for eid, e in self._rows.executions.items() if state is None or e.state == state
            )

    def close(self) -> None:
        """Nothing to release; present so every store can be used the same way."""
