"""The teaching workflows of docs/examples, end to end on every store (memory, SQLite, PostgreSQL).

Each test drives the real Worker, store and service operations, and checks
the outcome, the evidence left behind, and that no Command ran twice.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from fencekeeper.adapters import service
from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

from .conftest import MANAGER, OPS, RUNNER, World, example

BUSINESS = "acme"


def states(world: World, *execution_ids: str) -> list[ExecutionState]:
    return [world.view(e).execution.state for e in execution_ids]


def kinds(world: World, execution_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.state) for e in world.view(execution_id).evidence]


def decide(world: World, execution_id: str, determination: str, *, reviewer: str = MANAGER,
           decision_id: str = "d-1") -> object:
    request = service.approval_request(world.store, execution_id)
    assert request is not None
    return service.decide(
        world.store, world.policy, business_id=BUSINESS, reviewer_id=reviewer, request=request,
        determination=determination, decision_id=decision_id,
    )


# --- purchase approval ----------------------------------------------------------------------------


def test_purchase_approval_approved_places_the_order_once(world: World) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "big", amount=2500, order_id="o-1", order_revision=3)
    world.admit("purchase-approval", "small", amount=20, order_id="o-2", order_revision=1)
    report = world.run_pass()
    assert report.finished == {"waiting": 1, "succeeded": 1}
    assert states(world, "big", "small") == [ExecutionState.WAITING, ExecutionState.SUCCEEDED]
    # The small order never asked anyone: condition false -> place_order -> done.
    assert [c.payload["amount"] for c in world.handler.executed] == [20]

    woke = decide(world, "big", "approved")
    assert isinstance(woke, p.Decision) and woke.execution is not None
    assert woke.execution.state == ExecutionState.ELIGIBLE
    assert woke.execution.current_node_id == "place_order"  # the continuation committed with the wake
    # The same decision again is idempotent; a contradicting later one is kept, and changes nothing.
    again = decide(world, "big", "approved")
    assert isinstance(again, p.Unchanged) and again.code == p.UnchangedCode.ALREADY_DECIDED
    late = decide(world, "big", "rejected", decision_id="d-2")
    assert isinstance(late, approvals.Recorded)
    assert world.view("big").execution.current_node_id == "place_order"

    world.run_pass()
    view = world.view("big")
    assert view.execution.state == ExecutionState.SUCCEEDED
    placed = [c for c in world.handler.executed if c.payload["amount"] == 2500]
    assert len(placed) == 1 and placed[0].targets == (("o-1", 3),)
    assert placed[0].principal_id == RUNNER  # server-supplied: the principal recorded at admission
    decisions = {(e.object_id.rsplit("/", 1)[1], e.state) for e in view.evidence if e.kind == "ApprovalDecision"}
    assert decisions == {("d-1", "accepted"), ("d-2", "rejected_conflict")}
    request = next(e for e in view.evidence if e.kind == "ApprovalRequest")
    assert request.state == "approved" and request.body["decided_by"] == MANAGER


def test_purchase_approval_rejected_fails_without_placing_anything(world: World) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "big", amount=5000, order_id="o-1", order_revision=1)
    world.run_pass()
    assert isinstance(decide(world, "big", "rejected"), p.Decision)
    world.run_pass()
    view = world.view("big")
    assert view.execution.state == ExecutionState.FAILED
    assert view.dispatch.last_error_code == "order_rejected"
    assert world.handler.executed == []


def test_purchase_approval_times_out_and_a_late_decision_is_refused(world: World) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "big", amount=5000, order_id="o-1", order_revision=1)
    world.run_pass()
    world.clock.advance(timedelta(hours=23))
    assert world.run_pass().timers_fired == 0  # not due yet
    world.clock.advance(timedelta(hours=1))
    report = world.run_pass()
    assert report.timers_fired == 1
    view = world.view("big")
    assert view.execution.state == ExecutionState.FAILED
    [registration] = view.registrations
    assert registration.wake_reason == p.WakeReason.TIMEOUT  # a distinct wake reason, never a match
    late = decide(world, "big", "approved")
    assert isinstance(late, p.Refusal) and late.code == p.RefusalCode.APPROVAL_CLOSED
    assert world.handler.executed == []


@pytest.mark.parametrize(
    ("reviewer", "code"),
    [(RUNNER, p.RefusalCode.NOT_AUTHORIZED), (OPS, p.RefusalCode.NOT_AUTHORIZED), ("user:mallory", p.RefusalCode.NOT_AUTHORIZED)],
    ids=["requester-approves-own-request", "outside-reviewer-scope", "no-grant"],
)
def test_an_unauthorized_decision_neither_wakes_nor_writes(world: World, reviewer: str, code: p.RefusalCode) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "big", amount=5000, order_id="o-1", order_revision=1)
    world.run_pass()
    before = world.view("big")
    refused = decide(world, "big", "approved", reviewer=reviewer)
    assert isinstance(refused, p.Refusal) and refused.code == code
    assert world.view("big") == before


def test_a_misbound_decision_neither_wakes_nor_writes(world: World) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "big", amount=5000, order_id="o-1", order_revision=4)
    world.run_pass()
    before = world.view("big")
    request = service.approval_request(world.store, "big")
    assert request is not None
    stale = approvals.Binding(request.binding.operation, (("o-1", 3),), request.binding.policies)
    refused = world.store.decide_approval(
        approvals.ApprovalDecision(
            "d-9", request.request_id, BUSINESS, MANAGER, "approved", stale, p.Authority(True, MANAGER)
        )
    )
    assert isinstance(refused, p.Refusal) and refused.code == p.RefusalCode.APPROVAL_MISBOUND
    assert world.view("big") == before


def test_an_event_of_the_approval_type_is_refused_and_wakes_no_approval_waiter(world: World) -> None:
    # An approval wait registers the Event Type fencekeeper.approval with its request's id as predicate.
    # Only a reviewer's authorized Decision may wake it (seed 000, request_approval), so an Event of that
    # type is refused, whoever publishes it, before anything is written.
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "big", amount=5000, order_id="o-1", order_revision=1)
    world.run_pass()
    request = service.approval_request(world.store, "big")
    assert request is not None
    before = world.view("big")
    with pytest.raises(service.OperationError) as refused:
        world.publish("fencekeeper.approval", {"request_id": request.request_id}, event_id="ev-forged")
    assert refused.value.code == "invalid_event" and "event_type" in str(refused.value)
    assert world.view("big") == before
    assert world.view("big").execution.state == ExecutionState.WAITING


# --- payment with a timeout ------------------------------------------------------------------------


def test_payment_event_wakes_the_waiter_and_only_the_matching_one(world: World) -> None:
    world.register(example("payment_with_timeout"))
    world.admit("payment-with-timeout", "pay-7", order_id="o-7", amount=40)
    world.admit("payment-with-timeout", "pay-8", order_id="o-8", amount=40)
    world.run_pass()
    assert states(world, "pay-7", "pay-8") == [ExecutionState.WAITING] * 2
    other = world.publish("payment.received", {"order_id": "o-9"}, {"paid": 40}, event_id="ev-other")
    assert other.woken == ()  # kept as ordinary history, wakes nobody
    result = world.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}, event_id="ev-7")
    assert result.woken == ("pay-7",)
    duplicate = world.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}, event_id="ev-7")
    assert duplicate.duplicate and duplicate.woken == ()
    world.run_pass()
    assert states(world, "pay-7", "pay-8") == [ExecutionState.SUCCEEDED, ExecutionState.WAITING]
    assert [c.operation for c in world.handler.executed] == ["order.ship"]
    # The event's payload reached the condition through the wait attempt's outputs.
    waited = next(e for e in world.view("pay-7").evidence if e.body.get("node_id") == "await_payment")
    assert waited.state == "completed" and waited.body["outputs"]["paid"] == 40


def test_an_event_committed_before_the_waiter_registers_is_not_missed(world: World) -> None:
    world.register(example("payment_with_timeout"))
    world.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}, event_id="ev-early")
    world.admit("payment-with-timeout", "pay-7", order_id="o-7", amount=40)
    report = world.run_pass()
    # Registration found the committed Event and woke the waiter in the same commit;
    # the same pass then claimed it again and ran it to the end.
    assert world.view("pay-7").execution.state == ExecutionState.SUCCEEDED
    assert report.claimed == ["pay-7", "pay-7"]
    [registration] = world.view("pay-7").registrations
    assert registration.woken_by == "ev-early" and registration.wake_reason == p.WakeReason.EVENT


def test_an_underpayment_takes_the_false_branch_which_is_not_a_failure_of_the_condition(world: World) -> None:
    world.register(example("payment_with_timeout"))
    world.admit("payment-with-timeout", "pay-7", order_id="o-7", amount=40)
    world.run_pass()
    world.publish("payment.received", {"order_id": "o-7"}, {"paid": 10})
    world.run_pass()
    view = world.view("pay-7")
    assert view.execution.state == ExecutionState.FAILED and view.dispatch.last_error_code == "not_paid"
    condition = next(e for e in view.evidence if e.body.get("node_id") == "check_paid")
    assert condition.state == "completed" and condition.body["result"] == "false"
    assert [c.operation for c in world.handler.executed] == ["order.cancel"]


def test_no_payment_times_out_and_cancels_the_order(world: World) -> None:
    world.register(example("payment_with_timeout"))
    world.admit("payment-with-timeout", "pay-7", order_id="o-7", amount=40)
    world.run_pass()
    world.clock.advance(timedelta(hours=1))
    world.run_pass()
    view = world.view("pay-7")
    assert view.execution.state == ExecutionState.FAILED
    assert view.registrations[0].wake_reason == p.WakeReason.TIMEOUT
    assert [c.operation for c in world.handler.executed] == ["order.cancel"]
    # A payment after the timeout is kept as history and wakes nothing.
    assert world.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}).woken == ()


def test_an_event_of_another_business_wakes_nothing(world: World) -> None:
    world.register(example("payment_with_timeout"))
    world.admit("payment-with-timeout", "pay-7", order_id="o-7", amount=40)
    world.run_pass()
    world.policy.grant(RUNNER, "globex")
    assert world.publish("payment.received", {"order_id": "o-7"}, {"paid": 40}, business_id="globex").woken == ()
    assert world.view("pay-7").execution.state == ExecutionState.WAITING


# --- a refund whose outcome is unknown ------------------------------------------------------------


def test_an_unknown_refund_is_reconciled_never_resent(world: World) -> None:
    world.register(example("refund_needs_reconciliation"))
    world.admit("refund", "refund-1", payment_id="p-1", amount=40)
    world.run_pass()
    view = world.view("refund-1")
    assert view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert view.dispatch.last_error_code == "command_unknown"
    assert ("StepAttempt", "unknown") in kinds(world, "refund-1")
    # Nothing is eligible: another pass does not touch it, so nothing is resent.
    assert world.run_pass().claimed == []
    reconciled = service.reconcile(
        world.store, world.policy, world.handler, business_id=BUSINESS, principal_id=OPS, execution_id="refund-1"
    )
    assert isinstance(reconciled.outcome, p.Decision)
    # Settled, but still in review until a separate, explicit resume.
    assert world.view("refund-1").execution.state == ExecutionState.RECONCILIATION_REQUIRED
    assert world.run_pass().claimed == []
    review = service.recovery_view(world.store, business_id=BUSINESS, execution_id="refund-1")
    assert review.unresolved == () and review.permitted == ("refunded",)
    resumed = service.resume(
        world.store, world.policy, business_id=BUSINESS, principal_id=OPS, execution_id="refund-1",
        at_node="refunded", rationale="the provider reports the refund applied; only its end node remains",
    )
    assert isinstance(resumed, p.Decision)
    world.run_pass()
    view = world.view("refund-1")
    assert view.execution.state == ExecutionState.SUCCEEDED
    assert [c.operation for c in world.handler.executed] == ["payment.refund"]  # exactly once
    assert [c.command_id for c in world.handler.reconciled] == [world.handler.executed[0].command_id]
    attempt = next(e for e in view.evidence if e.object_id == world.handler.executed[0].attempt_id)
    assert [r.state for r in view.evidence_revisions if r.object_id == attempt.object_id] == [
        "pending", "running", "unknown", "completed"
    ]
    kinds_of_recovery = [r.kind for r in view.recoveries]
    assert kinds_of_recovery == [p.RecoveryKind.RECONCILE_COMMAND, p.RecoveryKind.RESUME_SAFE]


def test_a_refund_still_unknown_on_reconciliation_stays_in_review(world: World) -> None:
    world.handler.settled.clear()
    world.register(example("refund_needs_reconciliation"))
    world.admit("refund", "refund-1", payment_id="p-1", amount=40)
    world.run_pass()
    before = world.view("refund-1")
    reconciled = service.reconcile(
        world.store, world.policy, world.handler, business_id=BUSINESS, principal_id=OPS, execution_id="refund-1"
    )
    assert isinstance(reconciled.outcome, p.Refusal)
    assert world.view("refund-1") == before
    assert len(world.handler.executed) == 1
