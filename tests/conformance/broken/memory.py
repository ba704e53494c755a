"""Broken variants of the in-memory reference store: each differs from MemoryStore by one realistic bug.

Every class here is a MemoryStore with one method replaced by the version
an implementer could plausibly write: a lock released too early, a filter
forgotten, a comparison made on whole seconds, an index not maintained.
The bug is the whole difference, so that the suite catching the class is
the suite catching the bug.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import attrs

from fencekeeper.adapters.memory import MemoryStore, _MemoryBackend
from fencekeeper.adapters.store import Backend, Evidence, ExecutionView, StoreError, evidence_revision_conflict
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel import recovery
from fencekeeper.kernel.events import Event, matches
from fencekeeper.kernel.machines import DispatchState, ExecutionState


class _Store(MemoryStore):
    """A MemoryStore whose transactions use ``backend``: the variants replace a Backend method there."""

    backend: type[_MemoryBackend] = _MemoryBackend

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with self._lock:
            backend = self.backend(self._rows_now())
            yield backend
            self._rows = backend.rows


# --- concurrency: the guard checked when the rows are read, not when they are written -----------


class _DecidesOutsideTheLock(_Store):
    """The listed requests read a snapshot under the lock, decide without it, and write the rows back whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outside = threading.local()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        if not getattr(self._outside, "on", False):
            with super()._transaction() as backend:
                yield backend
            return
        with self._lock:
            rows = self._rows
        backend = self.backend(rows)
        yield backend  # the guard is checked against ``rows``: it always holds
        with self._lock:
            self._rows = backend.rows

    @contextlib.contextmanager
    def outside(self) -> Iterator[None]:
        self._outside.on = True
        try:
            yield
        finally:
            self._outside.on = False


class ClaimGuardAtRead(_DecidesOutsideTheLock):
    """claim_next decides on a snapshot outside the lock and writes it back: two workers lease one execution."""

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> p.Outcome | None:
        with self.outside():
            return super().claim_next(request, business_id=business_id)


class StepGuardAtRead(_DecidesOutsideTheLock):
    """record_step decides on a snapshot outside the lock: two steps on one revision are both recorded."""

    def record_step(self, execution_id: str, request: p.StepRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        with self.outside():
            return super().record_step(execution_id, request, evidence)


class FinalizeGuardAtRead(_DecidesOutsideTheLock):
    """finalize decides on a snapshot outside the lock: a lease is finalized twice, the last write wins."""

    def finalize(self, request: p.FinalizeRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        with self.outside():
            return super().finalize(request, evidence)


class WakeGuardAtRead(_DecidesOutsideTheLock):
    """wake and publish_event decide on a snapshot outside the lock: one waiter is woken twice."""

    def wake(self, request: p.WakeRequest) -> p.Outcome:
        with self.outside():
            return super().wake(request)

    def publish_event(self, event: Event, authority: p.Authority) -> Any:
        with self.outside():
            return super().publish_event(event, authority)


class CancelGuardAtRead(_DecidesOutsideTheLock):
    """cancel decides on a snapshot outside the lock: a cancel lands on top of a claim it never saw."""

    def cancel(self, request: p.CancelRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        with self.outside():
            return super().cancel(request, evidence)


class ClaimCandidateBeforeLock(_Store):
    """claim_next picks its candidate before taking the lock: a worker that loses the race is refused, not given the next one."""

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> p.Outcome | None:
        with self._lock:
            rows = self._rows
        candidate = self.backend(rows).next_eligible(self.clock.now(), business_id)
        if candidate is None:
            return None
        return self._one(lambda tx, now: p.claim(*tx.load(candidate), request, now), lock=candidate)


# --- the port's less travelled parts ---------------------------------------------------------------


class _DueIgnoresBusiness(_MemoryBackend):
    def due_registrations(self, now: datetime, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        return super().due_registrations(now, limit, None)


class DueTimersIgnoreBusiness(_Store):
    """due_wakes(business_id=...) returns the due timers of every Business."""

    backend = _DueIgnoresBusiness


class _DueByExecution(_MemoryBackend):
    def due_registrations(self, now: datetime, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        due = super().due_registrations(now, 10**9, business_id)
        return sorted(due, key=lambda key: key.execution_id)[:limit]


class DueTimersByExecutionId(_Store):
    """due_wakes orders due timers by execution id instead of by wake time."""

    backend = _DueByExecution


class _DueLimitFirst(_MemoryBackend):
    def due_registrations(self, now: datetime, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        # The limit taken in insertion order (a LIMIT inside the subquery), sorted afterwards.
        due = [
            (r.spec.wake_at, r.key.execution_id, r.key)
            for r in self.rows.registrations.values()
            if r.is_open and self._waits_on(r.key) and r.spec.wake_at is not None and r.spec.wake_at <= now
            and (business_id is None or r.business_id == business_id)
        ][:limit]
        return [key for _, _, key in sorted(due)]


class DueTimersLimitBeforeOrder(_Store):
    """due_wakes(limit) takes the first registrations by insertion, then orders them: a later-registered earlier timer waits."""

    backend = _DueLimitFirst


class _EventsOfAnyBusiness(_MemoryBackend):
    def matching_events(self, spec: p.WaitSpec, business_id: str) -> list[Event]:
        return [e for e in self.rows.events.values() if matches(spec, e.business_id, e)]


class EventLookupAnyBusiness(_Store):
    """A registering waiter is woken by a matching Event committed in another Business."""

    backend = _EventsOfAnyBusiness


class _NewestEventFirst(_MemoryBackend):
    def matching_events(self, spec: p.WaitSpec, business_id: str) -> list[Event]:
        return list(reversed(super().matching_events(spec, business_id)))


class EventLookupNewestFirst(_Store):
    """A registering waiter is woken by the newest matching Event, not the first committed."""

    backend = _NewestEventFirst


class _Evidence(_MemoryBackend):
    """``_checked`` as MemoryStore has it, with switches for the variants' one change each."""

    check_revision_past_second = True
    check_kind = True
    check_executions = True

    def _checked(
        self, execution_id: str, evidence: Sequence[Evidence], objects: dict[str, tuple[str, Evidence]]
    ) -> dict[str, tuple[str, Evidence]]:
        for item in evidence:
            if item.revision == 1:
                if item.object_id in objects or (self.check_executions and item.object_id in self.rows.executions):
                    raise StoreError("evidence_conflict", f"evidence {item.object_id!r}: an id already exists")
            else:
                current = objects.get(item.object_id)
                if (
                    current is None
                    or current[0] != execution_id
                    or ((self.check_revision_past_second or item.revision == 2) and current[1].revision != item.revision - 1)
                    or (self.check_kind and current[1].kind != item.kind)
                ):
                    raise evidence_revision_conflict(item)
            objects[item.object_id] = (execution_id, item)
        return objects


class _RevisionUncheckedPastSecond(_Evidence):
    check_revision_past_second = False


class EvidenceRevisionUncheckedPastSecond(_Store):
    """An evidence revision past the second is accepted on top of any revision (only 2-on-1 is checked)."""

    backend = _RevisionUncheckedPastSecond


class _KindMayChange(_Evidence):
    check_kind = False


class EvidenceKindMayChange(_Store):
    """An evidence object's later revision may carry another kind, and the object takes it."""

    backend = _KindMayChange


class _EvidenceShadowsExecution(_Evidence):
    check_executions = False


class EvidenceIdMayNameAnExecution(_Store):
    """Evidence may be created under an execution's id: the identity space is split by table."""

    backend = _EvidenceShadowsExecution


class _ExecutionShadowsEvidence(_MemoryBackend):
    def object_exists(self, object_id: str) -> bool:
        return object_id in self.rows.executions or object_id in self.rows.definitions


class ExecutionIdMayNameEvidence(_Store):
    """An execution may be admitted under an evidence object's id: admission checks only executions."""

    backend = _ExecutionShadowsEvidence


class EvidenceListedById(_Store):
    """read() lists an execution's current evidence sorted by id, not in creation order."""

    def read(self, execution_id: str) -> ExecutionView | None:
        found = super().read(execution_id)
        if found is None:
            return None
        return attrs.evolve(found, evidence=tuple(sorted(found.evidence, key=lambda e: e.object_id)))


class QuarantineWithoutReplay(_Store):
    """quarantine (the sweep's recovery) does not look up its command id, so an identical repeat is decided afresh."""

    def quarantine(self, request: p.RecoveryRequest, evidence: Sequence[Evidence] = ()) -> p.Outcome:
        def decide(tx: Backend, now: datetime) -> p.Outcome:
            return recovery.recover(*tx.load(request.execution_id), None, request, now)

        return self._one(decide, evidence, lock=request.execution_id)


# --- time below the second ------------------------------------------------------------------------


def _second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


class ExpiryInWholeSeconds(_Store):
    """expired() compares lease expiry with the time in whole seconds (an epoch-seconds column)."""

    def expired(self) -> list[str]:
        now = _second(self.clock.now())
        with self._lock:
            return sorted(
                eid
                for eid, d in self._rows.dispatches.items()
                if d.dispatch_state == DispatchState.CLAIMED and d.lease_expires_at is not None
                and _second(d.lease_expires_at) <= now
            )


class _DueInSeconds(_MemoryBackend):
    def due_registrations(self, now: datetime, limit: int, business_id: str | None = None) -> list[p.WaitKey]:
        due = sorted(
            (r.spec.wake_at, r.key.execution_id, r.key)
            for r in self.rows.registrations.values()
            if r.is_open and self._waits_on(r.key) and r.spec.wake_at is not None
            and _second(r.spec.wake_at) <= now
            and (business_id is None or r.business_id == business_id)
        )
        return [key for _, _, key in due[:limit]]


class DueInWholeSeconds(_Store):
    """due_wakes compares wake times truncated to the second: a timer is returned up to a second early."""

    backend = _DueInSeconds


class _EligibleInSeconds(_MemoryBackend):
    def next_eligible(self, now: datetime, business_id: str | None, skip: frozenset[str] = frozenset()) -> str | None:
        due = [
            (d.eligible_at, d.workflow_execution_id)
            for d in self.rows.dispatches.values()
            if d.dispatch_state == DispatchState.ELIGIBLE
            and _second(d.eligible_at) <= now
            and (business_id is None or self.rows.executions[d.workflow_execution_id].business_id == business_id)
            and d.workflow_execution_id not in skip
        ]
        return min(due)[1] if due else None


class ClaimableInWholeSeconds(_Store):
    """claim_next compares eligible_at truncated to the second: work is claimed before it is due."""

    backend = _EligibleInSeconds


# --- bugs only a sequence of requests shows -----------------------------------------------------------


class HistoryByTime(_Store):
    """read() orders an execution's history by each record's time, not by commit order (ORDER BY at)."""

    def read(self, execution_id: str) -> ExecutionView | None:
        found = super().read(execution_id)
        return None if found is None else attrs.evolve(found, history=tuple(sorted(found.history, key=lambda r: r.at)))


class _LatestRecoveryOnly(_MemoryBackend):
    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None:
        record = super().load_recovery(command_id)
        if record is None:
            return None
        latest = [r for r in self.rows.recoveries.values() if r.execution_id == record.execution_id][-1]
        return record if latest.command_id == command_id else None


class RecoveryReplayOnlyLatest(_Store):
    """A recovery command is found for replay only while it is its execution's latest one."""

    backend = _LatestRecoveryOnly


class _RecordsWrites(_MemoryBackend):
    wrote = False

    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        self.wrote = True
        return super().write(decision, evidence, now)


class StateListStaleAfterTimer(_Store):
    """execution_ids(state) is answered from an index that every decision but a timer's updates."""

    backend = _RecordsWrites

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._states: dict[str, ExecutionState] = {}
        self._timer = threading.local()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with super()._transaction() as backend:
            yield backend
        assert isinstance(backend, _RecordsWrites)
        if backend.wrote and not getattr(self._timer, "firing", False):
            with self._lock:
                self._states = {eid: e.state for eid, e in self._rows.executions.items()}

    def fire_timer(self, key: p.WaitKey, authority: p.Authority) -> p.Outcome:
        self._timer.firing = True
        try:
            return super().fire_timer(key, authority)
        finally:
            self._timer.firing = False

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        if state is None:
            return super().execution_ids()
        with self._lock:
            return sorted(eid for eid, s in self._states.items() if s == state)


class ExpiryIndexStaleAfterRenew(_Store):
    """expired() reads lease expiry from an index written at claim time that renew does not update."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._expiry: dict[str, datetime] = {}

    def claim_next(self, request: p.ClaimRequest, *, business_id: str | None = None) -> p.Outcome | None:
        outcome = super().claim_next(request, business_id=business_id)
        if isinstance(outcome, p.Decision) and outcome.dispatch is not None and outcome.dispatch.lease_expires_at:
            self._expiry[outcome.dispatch.workflow_execution_id] = outcome.dispatch.lease_expires_at
        return outcome

    def expired(self) -> list[str]:
        now = self.clock.now()
        with self._lock:
            return sorted(
                eid
                for eid, d in self._rows.dispatches.items()
                if d.dispatch_state == DispatchState.CLAIMED and self._expiry.get(eid, d.lease_expires_at) is not None
                and self._expiry.get(eid, d.lease_expires_at) <= now  # type: ignore[operator]
            )


# --- a correct store worded differently --------------------------------------------------------------


def _reworded(record: p.TransitionRecord) -> p.TransitionRecord:
    return attrs.evolve(record, reason=f"[de] {record.reason[::-1]}")


class _RewordingBackend(_MemoryBackend):
    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        return super().write(attrs.evolve(decision, evidence=tuple(map(_reworded, decision.evidence))), evidence, now)


class RewordedHistory(_Store):
    """Correct, with its own wording: every history reason and repeat message is its own text (must pass)."""

    backend = _RewordingBackend

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        outcome = super()._run(*args, **kwargs)
        if isinstance(outcome, p.Decision):
            return attrs.evolve(outcome, evidence=tuple(map(_reworded, outcome.evidence)))
        if isinstance(outcome, p.Unchanged):
            return attrs.evolve(outcome, message=f"[de] {outcome.message[::-1]}")
        return outcome
