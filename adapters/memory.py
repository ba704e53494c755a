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
from fencekeeper.kernel.events import Event, matches
from fencekeeper.kernel.machines import DispatchState, ExecutionState

from .store import (
    Backend,
    Clock,
    Evidence,
    ExecutionView,
    StoreError,
    TransactionalStore,
    evidence_revision_conflict,
    registration_conflict,
)


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
    """Every revision of every evidence object, per execution, in commit order."""
    objects: Mapping[str, tuple[str, Evidence]] = attrs.field(factory=dict)
    """The current revision of every evidence object, with the execution it belongs to."""
    definitions: Mapping[str, tuple[tuple[str, int, str], ...]] = attrs.field(factory=dict)
    events: Mapping[str, Event] = attrs.field(factory=dict)
    """Committed Events in commit order (dicts keep insertion order)."""


class _MemoryBackend(Backend):
    def __init__(self, rows: _Rows) -> None:
        self.rows = rows

    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        return self.rows.executions.get(execution_id), self.rows.dispatches.get(execution_id)

    def object_exists(self, object_id: str) -> bool:
        return (
            object_id in self.rows.executions
            or object_id in self.rows.objects
            or object_id in self.rows.definitions
        )

    def append_objects(self, execution_id: str, evidence: Sequence[Evidence], now: datetime) -> bool:
        objects = self._checked(execution_id, evidence, dict(self.rows.objects))
        stored = dict(self.rows.evidence)
        stored[execution_id] = (*stored.get(execution_id, ()), *evidence)
        self.rows = attrs.evolve(self.rows, evidence=stored, objects=objects)
        return True

    def _checked(
        self, execution_id: str, evidence: Sequence[Evidence], objects: dict[str, tuple[str, Evidence]]
    ) -> dict[str, tuple[str, Evidence]]:
        """The object index after ``evidence``; raises on a reused identity or a revision not on top of the last."""
        for item in evidence:
            if item.revision == 1:
                if item.object_id in objects or item.object_id in self.rows.executions:
                    raise StoreError(
                        "evidence_conflict",
                        f"evidence {item.object_id!r}: an id already exists; evidence is never overwritten",
                    )
            else:
                current = objects.get(item.object_id)
                if (
                    current is None
                    or current[0] != execution_id
                    or current[1].revision != item.revision - 1
                    or current[1].kind != item.kind
                ):
                    raise evidence_revision_conflict(item)
            objects[item.object_id] = (execution_id, item)
        return objects

    def execution_evidence(self, execution_id: str) -> list[Evidence]:
        order = dict.fromkeys(item.object_id for item in self.rows.evidence.get(execution_id, ()))
        return [self.rows.objects[object_id][1] for object_id in order]

    def load_evidence(self, object_id: str) -> Evidence | None:
        found = self.rows.objects.get(object_id)
        return None if found is None else found[1]

    def definition_revisions(self, object_id: str) -> list[tuple[str, int, str]]:
        return list(self.rows.definitions.get(object_id, ()))

    def insert_definition(self, object_id: str, business_id: str, revision: int, body: str, now: datetime) -> bool:
        definitions = dict(self.rows.definitions)
        known = definitions.get(object_id, ())
        if len(known) != revision - 1:
            return False
        definitions[object_id] = (*known, (business_id, revision, body))
        self.rows = attrs.evolve(self.rows, definitions=definitions)
        return True

    def load_event(self, event_id: str) -> Event | None:
        return self.rows.events.get(event_id)

    def insert_event(self, event: Event, now: datetime) -> None:
        self.rows = attrs.evolve(self.rows, events={**self.rows.events, event.event_id: event})

    def matching_events(self, spec: p.WaitSpec, business_id: str) -> list[Event]:
        return [e for e in self.rows.events.values() if matches(spec, business_id, e)]

    def waiting_registrations(self, business_id: str, event_type: str) -> list[p.WaitRegistration]:
        return sorted(
            (
                r
                for r in self.rows.registrations.values()
                if r.is_open and r.business_id == business_id and r.spec.event_type == event_type
            ),
            key=lambda r: (r.key.execution_id, r.key.node_id, r.key.attempt_id),
        )

    def due_registrations(self, now: datetime, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        due = sorted(
            (r.spec.wake_at, r.key.execution_id, r.key)
            for r in self.rows.registrations.values()
            if r.is_open
            and self._waits_on(r.key)
            and r.spec.wake_at is not None
            and r.spec.wake_at <= now
            and (business_id is None or r.business_id == business_id)
        )
        return [key for _, _, key in due[:limit]]

    def _waits_on(self, key: p.WaitKey) -> bool:
        """Whether the execution still waits on this registration: only then can a timer act on it."""
        execution = self.rows.executions.get(key.execution_id)
        return execution is not None and execution.state == ExecutionState.WAITING and execution.wait == key

    def load_registration(self, key: p.WaitKey) -> p.WaitRegistration | None:
        return self.rows.registrations.get(key)

    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None:
        return self.rows.recoveries.get(command_id)

    def next_eligible(self, now: datetime, business_id: str | None, skip: frozenset[str] = frozenset()) -> str | None:
        due = [
            (d.eligible_at, d.workflow_execution_id)
            for d in self.rows.dispatches.values()
            if d.dispatch_state == DispatchState.ELIGIBLE
            and d.eligible_at <= now
            and (business_id is None or self.rows.executions[d.workflow_execution_id].business_id == business_id)
            and d.workflow_execution_id not in skip
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
        closure = decision.closes
        if closure is not None:
            # Closing an already closed (or woken) registration changes nothing.
            current = registrations.get(closure.key)
            if current is not None and current.is_open:
                registrations[closure.key] = attrs.evolve(current, closed_by=closure.by.value)
        recoveries = dict(rows.recoveries)
        if decision.recovery is not None:
            recoveries[decision.recovery.command_id] = decision.recovery
        stored = dict(rows.evidence)
        # Evidence shares one identity space with every other generic object.
        if decision.guard.expected_revision == 0 and eid in rows.objects:
            return False
        objects = self._checked(eid, evidence, dict(rows.objects))
        if evidence:
            stored[eid] = (*stored.get(eid, ()), *evidence)
        self.rows = attrs.evolve(
            rows,
            executions=executions,
            dispatches=dispatches,
            revisions=revisions,
            history=history,
            registrations=registrations,
            recoveries=recoveries,
            evidence=stored,
            objects=objects,
        )
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

    def _rows_now(self) -> _Rows:
        # Called with the lock held.  After close the store answered as if
        # nothing had happened, where every other store refuses.
        if self._closed:
            raise StoreError("store_unavailable", "the in-memory store is closed; what it held is gone")
        return self._rows

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with self._lock:
            backend = _MemoryBackend(self._rows_now())
            yield backend
            self._rows = backend.rows

    def expired(self) -> list[str]:
        now = self.clock.now()
        with self._lock:
            return sorted(
                eid
                for eid, d in self._rows_now().dispatches.items()
                if d.dispatch_state == DispatchState.CLAIMED and d.lease_expires_at is not None
                and d.lease_expires_at <= now
            )

    def read(self, execution_id: str) -> ExecutionView | None:
        with self._lock:
            rows = self._rows_now()
            execution = rows.executions.get(execution_id)
            dispatch = rows.dispatches.get(execution_id)
            if execution is None or dispatch is None:
                return None
            order = {
                object_id: index
                for index, object_id in enumerate(
                    dict.fromkeys(item.object_id for item in rows.evidence.get(execution_id, ()))
                )
            }
            return ExecutionView(
                execution=execution,
                dispatch=dispatch,
                revisions=rows.revisions.get(execution_id, ()),
                history=rows.history.get(execution_id, ()),
                registrations=tuple(r for k, r in rows.registrations.items() if k.execution_id == execution_id),
                recoveries=tuple(r for r in rows.recoveries.values() if r.execution_id == execution_id),
                evidence=tuple(
                    rows.objects[object_id][1]
                    for object_id in dict.fromkeys(item.object_id for item in rows.evidence.get(execution_id, ()))
                ),
                evidence_revisions=tuple(
                    sorted(
                        rows.evidence.get(execution_id, ()),
                        key=lambda item: (order[item.object_id], item.revision),
                    )
                ),
            )

    def leased_to(self, worker_id: str, lease_token: str) -> str | None:
        with self._lock:
            for eid, d in self._rows_now().dispatches.items():
                if d.dispatch_state == DispatchState.CLAIMED and (d.leased_by, d.lease_token) == (worker_id, lease_token):
                    return eid
            return None

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        with self._lock:
            return sorted(
                eid for eid, e in self._rows_now().executions.items() if state is None or e.state == state
            )

    def close(self) -> None:
        """Drop what the store holds; every call after it is StoreError('store_unavailable'), as on every store."""
        with self._lock:
            self._closed = True
            self._rows = _Rows()


__all__ = [
    "MemoryStore",
]
