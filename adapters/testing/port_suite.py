"""The parts of the Store port the request tests barely reach: scoping, order, identities and time.

Rules every test here checks, through the port alone:

- **Due timers** are returned earliest ``wake_at`` first, then by execution
  id, scoped to one Business when asked, and the limit is applied after
  the scope and the order (seed 000, wait_for_event: "one-time UTC wake";
  specs/protocol.md, due timers).
- **Event lookup** when a waiter registers takes only Events of its own
  Business, and of several matching Events the first committed (seed 000,
  wait_for_event: "the first committed wake wins"), whatever their ids.
- **Evidence revisions** land only on top of the current one, past the
  second too: revision n+1 on n, never n+2, never a repeat; several
  consecutive revisions may come in one decision; an object keeps the kind
  it was created with, and the current revision is the newest.
- **One identity space**: an evidence id may not be an execution's id, and
  an execution may not be admitted under an evidence object's id.
- **Time below the second**: every time a store keeps (``eligible_at``,
  ``lease_expires_at``, wake times, transition times) comes back with its
  microseconds, and every comparison with the store's time (due, expired,
  claimable) is exact to the microsecond.
- **Recovery commands** replay by their identity, the older ones too
  after a newer command moved the execution on; **quarantine**, the
  sweep's form of recovery, decides exactly as ``recover`` does.
- **After close** every call of the port is ``StoreError('store_unavailable')``
  saying the store is closed, a revision kept in memory included, never a
  driver's own error or an answer; a second close does nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta

import attrs
import pytest

from fencekeeper.adapters.store import Evidence, ManualClock, Store, StoreError
from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

from .suite import (
    GRANTED,
    LEASE,
    RC,
    RequestTests,
    _definition,
    _event,
    admit,
    claim,
    decided,
    finalize_request,
    recovery_request,
    refused,
    register_pinned,
    snapshot,
    step_request,
    store_error,
    unchanged,
    view,
    wait_spec,
    wake_request,
)


class PortTests(RequestTests):
    """Tests of the port's less travelled parts (inherited through :class:`~fencekeeper.adapters.testing.StoreTests`)."""

    def waiting_in(self, store: Store, execution_id: str, business_id: str, spec: p.WaitSpec) -> p.WaitKey:
        """``execution_id`` of ``business_id``, admitted, claimed and parked on ``spec``."""
        admit(store, execution_id, business_id)
        claimed, credential = claim(store, f"w-{execution_id}", business_id=business_id)
        assert claimed == execution_id
        decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.WAITING, wait=spec)))
        return p.WaitKey(execution_id, spec.node_id, spec.attempt_id)

    # --- due timers ---------------------------------------------------------------------------

    def test_due_timers_come_earliest_first_and_scoped_by_business(self, store: Store, clock: ManualClock) -> None:
        start = clock.now()
        # Id order, business order and insertion order all differ from wake order.
        at = {
            "e-a": ("b-2", start + timedelta(seconds=3, microseconds=500_000)),
            "e-b": ("b-1", start + timedelta(seconds=2, microseconds=1)),
            "e-c": ("b-1", start + timedelta(seconds=1, microseconds=250_000)),
            "e-d": ("b-2", start + timedelta(seconds=2, microseconds=1)),  # ties e-b: id decides
            "e-e": ("b-1", start + timedelta(seconds=9)),  # not yet due
        }
        keys = {
            eid: self.waiting_in(store, eid, business, wait_spec(f"a-{eid}", event_type=None, wake_at=due))
            for eid, (business, due) in at.items()
        }
        clock.set(start + timedelta(seconds=1, microseconds=249_999))
        assert store.due_wakes() == []
        clock.set(start + timedelta(seconds=4))
        everything = [keys["e-c"], keys["e-b"], keys["e-d"], keys["e-a"]]
        assert store.due_wakes() == everything, "due timers must come by wake_at, then execution id"
        assert store.due_wakes(2) == everything[:2]
        assert store.due_wakes(business_id="b-1") == [keys["e-c"], keys["e-b"]]
        assert store.due_wakes(business_id="b-2") == [keys["e-d"], keys["e-a"]]
        assert store.due_wakes(1, business_id="b-2") == [keys["e-d"]], "the limit applies after the scope"
        assert store.due_wakes(business_id="b-3") == []
        decided(store.fire_timer(keys["e-d"], GRANTED))
        assert store.due_wakes(business_id="b-2") == [keys["e-a"]]
        assert store.due_wakes(business_id="b-1") == [keys["e-c"], keys["e-b"]]

    def test_fire_timer_before_its_time_or_for_nothing_changes_nothing(
        self, store: Store, clock: ManualClock
    ) -> None:
        due = clock.now() + timedelta(seconds=2, microseconds=7)
        key = self.waiting_in(store, "e-1", "b-1", wait_spec("a-1", event_type=None, wake_at=due))
        clock.set(due - timedelta(microseconds=1))
        refused(store, lambda: store.fire_timer(key, GRANTED), RC.WAKE_NOT_DUE)
        refused(store, lambda: store.fire_timer(attrs.evolve(key, attempt_id="a-x"), GRANTED), RC.NOT_WAITING)
        clock.set(due)
        decided(store.fire_timer(key, GRANTED))
        registration = view(store, "e-1").registrations[0]
        assert (registration.woken_by, registration.wake_reason) == ("a-1/timer", p.WakeReason.TIMER)
        unchanged(store, lambda: store.fire_timer(key, GRANTED), p.UnchangedCode.ALREADY_WOKEN)

    # --- event lookup ---------------------------------------------------------------------------

    def test_a_registering_waiter_takes_the_first_event_of_its_own_business(self, store: Store) -> None:
        # Committed in this order; the ids sort the other way round.
        for event_id, business in (("ev-z-other", "b-2"), ("ev-y-first", "b-1"), ("ev-x-second", "b-1")):
            assert store.publish_event(_event(event_id, ("order", "o-1"), business=business), GRANTED).woken == ()
        own = self.waiting_in(store, "e-1", "b-1", wait_spec("a-1"))
        found = view(store, "e-1")
        assert found.execution.state == ExecutionState.ELIGIBLE
        assert found.registrations[0].key == own
        assert found.registrations[0].woken_by == "ev-y-first", (
            f"woken by {found.registrations[0].woken_by!r}: of the matching Events, the first committed in the "
            "waiter's own Business wakes it"
        )
        other = self.waiting_in(store, "e-2", "b-2", wait_spec("a-2"))
        assert view(store, "e-2").registrations[0].key == other
        assert view(store, "e-2").registrations[0].woken_by == "ev-z-other"
        self.waiting_in(store, "e-3", "b-3", wait_spec("a-3"))
        assert view(store, "e-3").execution.state == ExecutionState.WAITING

    def test_an_event_wakes_waiters_only_in_its_own_business(self, store: Store) -> None:
        self.waiting_in(store, "e-1", "b-1", wait_spec("a-1"))
        self.waiting_in(store, "e-2", "b-2", wait_spec("a-2"))
        self.waiting_in(store, "e-3", "b-2", wait_spec("a-3"))
        result = store.publish_event(_event("ev-1", ("order", "o-1"), business="b-2"), GRANTED)
        assert result.woken == ("e-2", "e-3")
        assert view(store, "e-1").execution.state == ExecutionState.WAITING
        assert store.publish_event(_event("ev-2", ("order", "o-1"), business="b-1"), GRANTED).woken == ("e-1",)

    # --- evidence revisions ---------------------------------------------------------------------

    def test_evidence_revisions_past_the_second_land_only_in_order(self, store: Store) -> None:
        credential = self.running(store)
        item = Evidence("att-1", "StepAttempt", {"status": "pending", "n": 1}, 1, "pending")
        revisions = [item]
        for n, state in enumerate(("running", "waiting", "running"), start=2):
            revisions.append(revisions[-1].next(state, {"n": n}))
        for revision_item in revisions:
            decided(store.append_evidence("e-1", credential, [revision_item]))
        fourth = revisions[-1]
        for stale in (revisions[2], attrs.evolve(fourth, revision=6), fourth, attrs.evolve(fourth, revision=3)):
            store_error(store, _appending(store, credential, stale), "evidence_conflict")
        # Two consecutive revisions in one decision.
        fifth = fourth.next("completed", {"n": 5})
        decided(store.append_evidence("e-1", credential, [fifth, fifth.next("closed", {"n": 6})]))
        found = view(store, "e-1")
        assert [(e.revision, e.state, e.body["n"]) for e in found.evidence_revisions] == [
            (1, "pending", 1), (2, "running", 2), (3, "waiting", 3), (4, "running", 4), (5, "completed", 5),
            (6, "closed", 6),
        ]
        assert [(e.object_id, e.revision, e.state, e.kind) for e in found.evidence] == [
            ("att-1", 6, "closed", "StepAttempt")
        ]
        assert dict(found.evidence[0].body) == {"status": "pending", "n": 6}

    def test_a_later_revision_of_an_object_nobody_made_is_a_conflict_that_names_it(self, store: Store) -> None:
        # A caller's bug (a revision planned on top of evidence that never committed) gets the same one error
        # on every store, naming the object, and writes nothing: not a database's own constraint error.
        credential = self.running(store)
        decided(store.append_evidence("e-1", credential, [Evidence("att-1", "StepAttempt", {}, 1, "pending")]))
        for items in (
            [Evidence("att-missing", "StepAttempt", {}, 2, "running")],
            [Evidence("att-missing", "StepAttempt", {}, 2, "running"), Evidence("att-missing", "StepAttempt", {}, 3, "done")],
            [Evidence("ev-new", "note"), Evidence("att-missing", "StepAttempt", {}, 5, "running")],
        ):
            appending = functools.partial(store.append_evidence, "e-1", credential, items)
            error = store_error(store, appending, "evidence_conflict")
            assert "'att-missing'" in error.message, error.message
        request = step_request(store, "e-1", credential)
        missing = [Evidence("att-missing", "StepAttempt", {}, 2, "running")]
        error = store_error(store, lambda: store.record_step("e-1", request, missing), "evidence_conflict")
        assert "'att-missing'" in error.message, error.message
        assert [(e.object_id, e.revision) for e in view(store, "e-1").evidence] == [("att-1", 1)]

    def test_an_evidence_object_keeps_its_kind(self, store: Store) -> None:
        credential = self.running(store)
        first = Evidence("att-1", "StepAttempt", {}, 1, "pending")
        decided(store.append_evidence("e-1", credential, [first, first.next("running", {})]))
        renamed = Evidence("att-1", "Command", {}, 3, "issued")
        store_error(store, lambda: store.append_evidence("e-1", credential, [renamed]), "evidence_conflict")
        decided(store.append_evidence("e-1", credential, [attrs.evolve(renamed, kind="StepAttempt")]))
        found = view(store, "e-1")
        assert {e.kind for e in found.evidence_revisions} == {"StepAttempt"}
        assert [(e.revision, e.kind) for e in found.evidence] == [(3, "StepAttempt")]

    def test_current_evidence_comes_in_creation_order_with_its_newest_revision(self, store: Store) -> None:
        credential = self.running(store)
        made = [Evidence(object_id, "note", {"i": i}) for i, object_id in enumerate(("ev-z", "ev-a", "ev-m"))]
        for item in made:
            decided(store.append_evidence("e-1", credential, [item]))
        decided(store.append_evidence("e-1", credential, [made[0].next("edited", {"i": 9})]))
        found = view(store, "e-1")
        assert [(e.object_id, e.revision) for e in found.evidence] == [("ev-z", 2), ("ev-a", 1), ("ev-m", 1)]
        assert [(e.object_id, e.revision) for e in found.evidence_revisions] == [
            ("ev-z", 1), ("ev-z", 2), ("ev-a", 1), ("ev-m", 1)
        ]

    # --- one identity space ---------------------------------------------------------------------

    def test_evidence_may_not_take_an_executions_id(self, store: Store) -> None:
        credential = self.running(store, "e-1")
        admit(store, "e-2")
        for object_id in ("e-2", "e-1"):
            store_error(store, _appending(store, credential, Evidence(object_id, "note")), "evidence_conflict")

    def test_an_execution_may_not_take_an_evidence_id(self, store: Store) -> None:
        credential = self.running(store, "e-1")
        decided(store.append_evidence("e-1", credential, [Evidence("e-shared", "note", {"kept": True})]))
        refused(
            store,
            lambda: store.admit(p.AdmitRequest("e-shared", "b-1", "d-1", 1, "start", GRANTED)),
            RC.ALREADY_EXISTS,
            "e-shared",
        )
        assert store.read("e-shared") is None
        assert [dict(e.body) for e in view(store, "e-1").evidence] == [{"kept": True}]

    # --- time below the second --------------------------------------------------------------------

    def test_microseconds_survive_a_round_trip(self, store: Store, clock: ManualClock) -> None:
        clock.set(clock.now() + timedelta(seconds=1, microseconds=123_457))
        admitted = clock.now()
        admit(store, "e-1")
        assert view(store, "e-1").dispatch.eligible_at == admitted
        clock.advance(timedelta(microseconds=999_999))
        lease = timedelta(seconds=2, microseconds=500_001)
        _, credential = claim(store, lease=lease)
        found = view(store, "e-1")
        assert found.dispatch.lease_expires_at == clock.now() + lease
        assert [r.at for r in found.history] == [admitted, clock.now()]
        wake_at = clock.now() + timedelta(microseconds=654_321)
        spec = wait_spec("a-1", event_type=None, wake_at=wake_at)
        decided(store.finalize(finalize_request(store, "e-1", credential, ExecutionState.WAITING, wait=spec)))
        assert view(store, "e-1").registrations[0].spec.wake_at == wake_at
        assert view(store, "e-1").execution.wait == p.WaitKey("e-1", "n-wait", "a-1")

    def test_comparisons_with_the_time_are_exact_to_the_microsecond(
        self, store: Store, clock: ManualClock
    ) -> None:
        start = clock.now()
        clock.set(start + timedelta(microseconds=600_000))
        admit(store, "e-late")  # eligible at .6
        clock.set(start + timedelta(microseconds=400_000))
        admit(store, "e-early")  # eligible at .4; id order would put it first anyway, so e-zz checks order
        clock.set(start + timedelta(microseconds=200_000))
        admit(store, "e-zz")  # eligible at .2
        clock.set(start + timedelta(microseconds=300_000))
        assert claim(store, "w-1", lease=timedelta(microseconds=400_000))[0] == "e-zz"  # expires at .7
        before = snapshot(store)
        clock.set(start + timedelta(microseconds=399_999))
        assert store.claim_next(p.ClaimRequest("w-2", "t-early", timedelta(seconds=1))) is None
        assert snapshot(store) == before
        clock.set(start + timedelta(microseconds=699_999))
        assert store.expired() == []
        assert claim(store, "w-2")[0] == "e-early"
        clock.set(start + timedelta(microseconds=700_000))
        assert store.expired() == ["e-zz"]
        # A lease that ends a microsecond from now is still live.
        ends = view(store, "e-early").dispatch.lease_expires_at
        assert ends is not None
        clock.set(ends - timedelta(microseconds=1))
        assert store.expired() == ["e-zz"]
        assert claim(store, "w-3")[0] == "e-late"
        due = clock.now() + timedelta(microseconds=3)
        admit(store, "e-timer")
        timer_id, holder = claim(store, "w-4")
        assert timer_id == "e-timer"
        decided(
            store.finalize(
                finalize_request(
                    store, "e-timer", holder, ExecutionState.WAITING, wait=wait_spec("a-t", event_type=None, wake_at=due)
                )
            )
        )
        clock.set(due - timedelta(microseconds=1))
        assert store.due_wakes() == []
        clock.set(due)
        assert store.due_wakes() == [p.WaitKey("e-timer", "n-wait", "a-t")]

    def test_an_older_recovery_command_still_replays_after_a_newer_one(
        self, store: Store, clock: ManualClock
    ) -> None:
        self.in_review(store, clock)  # q-1 quarantined e-1
        quarantined = view(store, "e-1").recoveries[0]
        failed = decided(store.recover(recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1")))
        older = p.RecoveryRequest(
            "q-1", p.RecoveryKind.QUARANTINE_EXPIRED, "e-1", "b-1", quarantined.expected_revision, "ops", GRANTED
        )
        replay = unchanged(store, lambda: store.recover(older), p.UnchangedCode.RECOVERY_REPLAYED)
        assert replay.record == quarantined
        newer = recovery_request(store, "e-1", p.RecoveryKind.FAIL, "f-1", expected_revision=failed.guard.expected_revision)
        assert unchanged(store, lambda: store.recover(newer), p.UnchangedCode.RECOVERY_REPLAYED).record == failed.recovery

    # --- quarantine, the sweep's recovery ----------------------------------------------------------

    def test_quarantine_decides_as_recover_does(self, store: Store, clock: ManualClock) -> None:
        self.running(store)
        request = recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")
        clock.advance(timedelta(seconds=30) - timedelta(microseconds=1))
        refused(store, lambda: store.quarantine(request), RC.LEASE_NOT_EXPIRED)
        clock.advance(timedelta(microseconds=1))
        decision = decided(store.quarantine(request))
        found = view(store, "e-1")
        assert found.execution == decision.execution and found.execution.state == ExecutionState.RECONCILIATION_REQUIRED
        assert found.recoveries == (decision.recovery,)
        replay = unchanged(store, lambda: store.quarantine(request), p.UnchangedCode.RECOVERY_REPLAYED)
        assert replay.record == decision.recovery

    # --- after close -------------------------------------------------------------------------------

    def test_every_call_after_close_is_store_unavailable(self, store: Store) -> None:
        register_pinned(store)
        assert store.load_definition("b-1", "d-1", 1) is not None  # kept in memory from now on
        credential = self.running(store, "e-1")
        admit(store, "e-2")
        key = p.WaitKey("e-1", "n-wait", "a-wait")
        step = step_request(store, "e-1", credential)
        finalize = finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED)
        recovery = recovery_request(store, "e-1", p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")
        binding = approvals.Binding("purchase.approve", (("o-1", 3),), ())
        approval = approvals.ApprovalDecision("d-1", "att-1/approval", "b-1", "rev-1", "approved", binding, GRANTED)
        store.close()
        calls: dict[str, Callable[[], object]] = {
            "admit": lambda: store.admit(p.AdmitRequest("e-3", "b-1", "d-1", 1, "start", GRANTED)),
            "claim_next": lambda: store.claim_next(p.ClaimRequest("w-2", "t-closed", LEASE)),
            "renew": lambda: store.renew("e-1", p.RenewRequest(credential, LEASE)),
            "record_step": lambda: store.record_step("e-1", step),
            "release": lambda: store.release("e-1", p.ReleaseRequest(credential, step.expected_revision)),
            "finalize": lambda: store.finalize(finalize),
            "append_evidence": lambda: store.append_evidence("e-1", credential, [Evidence("ev-c", "step_attempt", {})]),
            "wake": lambda: store.wake(wake_request(key)),
            "cancel": lambda: store.cancel(p.CancelRequest("e-2", "b-1", 1, GRANTED)),
            "recover": lambda: store.recover(recovery),
            "quarantine": lambda: store.quarantine(recovery),
            "expired": store.expired,
            "read": lambda: store.read("e-1"),
            "read_for_visit": lambda: store.read_for_visit("e-1"),
            "execution_ids": store.execution_ids,
            "register_definition": lambda: store.register_definition(_definition(2), "b-1", GRANTED),
            "load_definition kept": lambda: store.load_definition("b-1", "d-1", 1),
            "load_definition latest": lambda: store.load_definition("b-1", "d-1"),
            "publish_event": lambda: store.publish_event(_event("ev-closed", ("order", "o-1")), GRANTED),
            "decide_approval": lambda: store.decide_approval(approval),
            "due_wakes": store.due_wakes,
            "fire_timer": lambda: store.fire_timer(key, GRANTED),
        }
        for name, call in calls.items():
            with pytest.raises(StoreError) as caught:
                call()
            assert caught.value.code == "store_unavailable", (name, caught.value)
            # Said as it is, and not as a fault to look for: a closed PostgreSQL pool's refusal
            # read "PostgreSQL connection failed: the pool ... is already closed".
            assert "is closed" in str(caught.value), (name, caught.value)
            assert "connection failed" not in str(caught.value), (name, caught.value)
        store.close()  # a second close does nothing


def _appending(store: Store, credential: p.LeaseCredential, item: Evidence) -> Callable[[], p.Outcome]:
    """A call that appends ``item`` to e-1 under ``credential``."""
    return lambda: store.append_evidence("e-1", credential, [item])


__all__ = ["PortTests"]
