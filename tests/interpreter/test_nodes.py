"""Node semantics, step attempts and the dispatcher pass, one rule per test, on every store."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import attrs
import pytest

from fencekeeper.adapters import service
from fencekeeper.adapters.ports import (
    APPROVAL_DECIDE,
    EVENT_PUBLISH,
    WORKFLOW_CANCEL,
    WORKFLOW_DISPATCH,
    WORKFLOW_RECONCILE,
    WORKFLOW_RUN,
    reject,
    unknown,
)
from fencekeeper.adapters.store import Backend, _Written, definition_object_id
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.attempts import attempt_id
from fencekeeper.kernel.definition import Definition, from_json, parse_definition, to_json
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import ExecutionState

from .conftest import BUSINESS, EXAMPLES, MANAGER, OPS, RUNNER, World, example

LOOP = """
id = "loop"
revision = 1
start = "poll"
inputs = ["target"]

[[nodes]]
id = "poll"
kind = "local_command"
revision = 1
operation = "job.poll"
next = "done_yet"
on_failure = "broken"

[[nodes]]
id = "done_yet"
kind = "condition"
revision = 1
expression = "poll.count >= input.target"
bindings = ["input.target", "poll.count"]
true_next = "finished"
false_next = "poll"

[[nodes]]
id = "finished"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "broken"
kind = "end"
revision = 1
outcome = "failed"
error_code = "poll_failed"
"""


def loop_world(world: World) -> None:
    counter = {"n": 0}

    def poll(command: i.Command) -> i.CommandResult:
        counter["n"] += 1
        return i.CommandResult(i.CommandStatus.SUCCEEDED, None, "polled", {"count": counter["n"]})

    world.handler.scripts["job.poll"] = poll
    world.register(parse_definition(LOOP, "loop.toml"))


def test_the_step_limit_suspends_with_step_limit_and_never_resets(world: World) -> None:
    loop_world(world)
    world.admit("loop", "x-1", target=1000)
    report = world.run_pass()
    view = world.view("x-1")
    assert view.execution.state == ExecutionState.SUSPENDED
    assert view.dispatch.last_error_code == "step_limit"
    assert view.execution.step_count == p.STEP_LIMIT == report.steps
    assert world.store.execution_ids() == ["x-1"]  # no second execution
    attempts = [e for e in view.evidence if e.kind == "StepAttempt"]
    assert len(attempts) == p.STEP_LIMIT and len({a.object_id for a in attempts}) == p.STEP_LIMIT
    assert world.run_pass().claimed == []  # suspended is a review state: nothing resumes it silently


def test_a_loop_that_finishes_counts_one_step_per_visit(world: World) -> None:
    loop_world(world)
    world.admit("loop", "x-1", target=3)
    report = world.run_pass()
    view = world.view("x-1")
    assert view.execution.state == ExecutionState.SUCCEEDED
    # poll, done_yet three times each, then finished: 7 visits, 7 steps, 7 attempts.
    assert view.execution.step_count == report.steps == 7
    assert sum(1 for e in view.evidence if e.kind == "StepAttempt") == 7


def test_an_unknown_condition_suspends_and_the_attempt_records_why(world: World) -> None:
    loop_world(world)
    world.admit("loop", "x-1", target="three")  # a string compared with a number: unknown, not false
    world.run_pass()
    view = world.view("x-1")
    assert view.execution.state == ExecutionState.SUSPENDED
    assert view.dispatch.last_error_code == "condition_unknown"
    attempt = [e for e in view.evidence if e.body.get("node_id") == "done_yet"][-1]
    assert attempt.state == "failed" and attempt.body["result"] == "unknown"
    assert attempt.body["inputs"] == {"input.target": "three", "poll.count": 1}


def test_an_unsupported_kind_reached_at_run_time_suspends_with_a_reason(world: World) -> None:
    # A definition revision stored by newer code, with a kind this code does
    # not know: it loads leniently, and the interpreter stops at that node.
    loop_world(world)
    stored = (
        to_json(parse_definition(LOOP, "loop.toml"))
        .replace('"kind":"condition"', '"kind":"parallel"')
        .replace('"revision":1,"start"', '"revision":2,"start"')
    )
    lenient = from_json(stored, strict=False)
    assert lenient.revision == 2
    node = lenient.node("done_yet")
    assert node is not None and node.kind == "unsupported"
    _store_raw_definition(world, "loop", 2, stored)
    world.admit("loop", "x-1", target=3)
    world.run_pass()
    view = world.view("x-1")
    assert view.execution.definition_revision == 2
    assert view.execution.state == ExecutionState.SUSPENDED
    assert view.dispatch.last_error_code == "unsupported_node"
    attempt = [e for e in view.evidence if e.body.get("node_id") == "done_yet"][-1]
    assert attempt.state == "failed" and "parallel" in attempt.body["detail"]


def _store_raw_definition(world: World, definition_id: str, revision: int, body: str) -> None:
    """Write a definition revision the way a newer version of this code would have."""

    def decide(tx: Backend, now: datetime) -> _Written:
        tx.insert_definition(definition_object_id(BUSINESS, definition_id), BUSINESS, revision, body, now)
        return _Written(True)

    world.store._run(decide)


def test_an_execution_follows_its_pinned_revision_not_the_newest(world: World) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "x-1", amount=5000, order_id="o-1", order_revision=1)
    text = (EXAMPLES / "purchase_approval.toml").read_text()
    newer = parse_definition(
        text.replace("revision = 1\ntitle", "revision = 2\ntitle")
        .replace('"input.amount >= 1000"', '"input.amount >= 1000000"')
        .replace('id = "check_amount"\nkind = "condition"\nrevision = 1', 'id = "check_amount"\nkind = "condition"\nrevision = 2'),
        "purchase_approval.toml",
    )
    assert newer.revision == 2
    world.register(newer)
    world.run_pass()
    view = world.view("x-1")
    # Pinned to revision 1 (threshold 1000): it waits for approval; revision 2 would have placed the order.
    assert view.execution.definition_revision == 1
    assert view.execution.state == ExecutionState.WAITING
    assert world.handler.executed == []
    world.admit("purchase-approval", "x-2", amount=5000, order_id="o-2", order_revision=1)
    world.run_pass()
    assert world.view("x-2").execution.definition_revision == 2
    assert world.view("x-2").execution.state == ExecutionState.SUCCEEDED


def test_a_denied_command_is_evidence_and_follows_on_failure(world: World) -> None:
    loop_world(world)
    world.policy.revoke(RUNNER, BUSINESS)
    world.policy.grant(RUNNER, BUSINESS, WORKFLOW_DISPATCH)
    world.policy.grant(RUNNER, BUSINESS, "workflow_run")
    world.admit("loop", "x-1", target=1)
    world.run_pass()
    view = world.view("x-1")
    assert view.execution.state == ExecutionState.FAILED and view.dispatch.last_error_code == "poll_failed"
    assert world.handler.executed == []  # fails closed: nothing was issued
    denied = next(e for e in view.evidence if e.body.get("node_id") == "poll")
    assert denied.state == "failed" and denied.body["reason"] == "not_authorized"


def test_a_rejected_command_is_explicit_evidence_and_follows_on_failure(world: World) -> None:
    loop_world(world)
    world.handler.scripts["job.poll"] = reject(i.Rejection.STALE_VERSION, "target moved on")
    world.admit("loop", "x-1", target=1)
    world.run_pass()
    view = world.view("x-1")
    assert view.execution.state == ExecutionState.FAILED
    command = next(e for e in view.evidence if e.kind == "Command")
    assert command.state == "rejected" and command.body["rejection"] == "stale_version"
    assert len(world.handler.executed) == 1


def test_without_dispatch_authority_the_worker_commits_nothing(world: World) -> None:
    loop_world(world)
    world.admit("loop", "x-1", target=1)
    world.policy.revoke(RUNNER, BUSINESS)
    report = world.run_pass()
    assert [r.code for r in report.refused] == ["not_authorized"]
    view = world.view("x-1")
    assert view.execution.state == ExecutionState.RUNNING and view.execution.step_count == 0
    # The lease is left to expire; quarantine then makes it an explicit review item.
    world.clock.advance(world.lease)
    results = service.quarantine_expired(world.store, world.policy, business_id=BUSINESS, principal_id=OPS)
    assert isinstance(results.outcomes["x-1"], p.Decision)
    assert world.view("x-1").execution.state == ExecutionState.RECONCILIATION_REQUIRED


def test_a_worker_that_dies_after_issuing_a_command_never_has_it_resent(world: World) -> None:
    world.register(example("refund_needs_reconciliation"))
    world.admit("refund", "refund-1", payment_id="p-1", amount=40)

    class Crash(BaseException):
        pass

    def crash(command: i.Command) -> i.CommandResult:
        raise Crash

    world.handler.scripts["payment.refund"] = crash
    with pytest.raises(Crash):
        world.run_pass()
    assert world.view("refund-1").execution.state == ExecutionState.RUNNING
    world.clock.advance(world.lease)
    service.quarantine_expired(world.store, world.policy, business_id=BUSINESS, principal_id=OPS)
    view = world.view("refund-1")
    attempt = next(e for e in view.evidence if e.kind == "StepAttempt")
    assert attempt.state == "reconciliation_required"
    reconciled = service.reconcile(
        world.store, world.policy, world.handler, business_id=BUSINESS, principal_id=OPS, execution_id="refund-1"
    )
    assert isinstance(reconciled.outcome, p.Decision)
    view = world.view("refund-1")
    # The quarantined visit is counted once its Command is settled.
    assert view.execution.step_count == view.dispatch.step_count == 1
    resumed = service.resume(
        world.store, world.policy, business_id=BUSINESS, principal_id=OPS, execution_id="refund-1",
        at_node="refunded", rationale="the refund was applied; only its end node remains",
    )
    assert isinstance(resumed, p.Decision)
    world.run_pass()
    assert world.view("refund-1").execution.state == ExecutionState.SUCCEEDED
    assert len(world.handler.executed) == 1 and len(world.handler.reconciled) == 1


def test_a_stale_worker_cannot_commit_its_visit(world: World) -> None:
    loop_world(world)
    world.admit("loop", "x-1", target=1)
    claimed = world.store.claim_next(p.ClaimRequest("w-old", "tok-old", world.lease))
    assert isinstance(claimed, p.Decision) and claimed.lease is not None and claimed.execution is not None
    execution = claimed.execution
    definition = world.store.load_definition(BUSINESS, "loop", 1)
    ctx = i.context_from_evidence(execution, definition, world.view("x-1").evidence)
    plan = i.plan_visit(ctx, world.clock.now(), worker_id="w-old", fence=claimed.lease.fence,
                        node_authority=p.Authority(True, RUNNER))
    assert isinstance(plan, i.Invoke)
    world.clock.advance(world.lease + timedelta(seconds=1))  # paused past its lease
    before = world.view("x-1")
    refused = world.store.append_evidence("x-1", claimed.lease, plan.evidence)
    assert isinstance(refused, p.Refusal) and refused.code == p.RefusalCode.LEASE_EXPIRED
    assert world.view("x-1") == before
    assert world.handler.executed == []


def test_cancellation_of_a_waiter_wins_and_a_later_decision_cannot_wake_it(world: World) -> None:
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "x-1", amount=5000, order_id="o-1", order_revision=1)
    world.run_pass()
    cancelled = service.cancel(world.store, world.policy, business_id=BUSINESS, principal_id=OPS, execution_id="x-1")
    assert isinstance(cancelled, p.Decision)
    request = service.approval_request(world.store, "x-1")
    assert request is not None
    late = service.decide(world.store, world.policy, business_id=BUSINESS, reviewer_id="user:manager",
                          request=request, determination="approved")
    assert isinstance(late, p.Refusal)
    assert world.view("x-1").execution.state == ExecutionState.CANCELLED


def test_a_reviewer_without_current_authority_learns_nothing_of_a_stored_decision(world: World) -> None:
    # specs/interpreter.md, Approvals: the reviewer's authority and scope come before the stored decision,
    # so a repeat or a reused identity tells a reviewer refused now neither that nor how it was decided.
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "x-1", amount=5000, order_id="o-1", order_revision=1)
    world.run_pass()
    request = service.approval_request(world.store, "x-1")
    assert request is not None

    def decide(reviewer: str, determination: str) -> object:
        return service.decide(world.store, world.policy, business_id=BUSINESS, reviewer_id=reviewer,
                              request=request, determination=determination, decision_id="d-1")

    assert isinstance(decide(MANAGER, "approved"), p.Decision)
    # Still authorized: the stored decision answers.
    repeat = decide(MANAGER, "approved")
    assert isinstance(repeat, p.Unchanged) and repeat.code == p.UnchangedCode.ALREADY_DECIDED, repeat
    before = world.view("x-1")
    world.policy.revoke(MANAGER, BUSINESS)
    # OPS holds every grant of the Business but is outside the request's reviewers; RUNNER requested it.
    for reviewer, determination in ((MANAGER, "approved"), (MANAGER, "rejected"), (OPS, "approved"),
                                    (RUNNER, "rejected")):
        refused = decide(reviewer, determination)
        assert isinstance(refused, p.Refusal) and refused.code == p.RefusalCode.NOT_AUTHORIZED, (reviewer, refused)
        assert "already" not in refused.message and "d-1" not in refused.message, refused
    assert world.view("x-1") == before


@pytest.mark.parametrize("who", ["without the cancel grant", "revoked", "unknown", "of another business"])
@pytest.mark.parametrize("state", [ExecutionState.ELIGIBLE, ExecutionState.WAITING])
def test_cancellation_without_current_authority_is_refused_and_writes_nothing(
    world: World, state: ExecutionState, who: str
) -> None:
    # Seed 000, Cancellation: only an authorized cancellation commits, and the kernel's cancel decision
    # refuses a denied Authority (not_authorized) before anything is written, on every store.
    world.register(example("purchase_approval"))
    world.admit("purchase-approval", "x-1", amount=5000, order_id="o-1", order_revision=1)
    if state == ExecutionState.WAITING:
        world.run_pass()
    principal = "user:clerk"
    if who == "without the cancel grant":
        # Every other operation of the business, as a clerk who runs and decides but may not cancel.
        for operation in (WORKFLOW_RUN, WORKFLOW_DISPATCH, WORKFLOW_RECONCILE, EVENT_PUBLISH, APPROVAL_DECIDE):
            world.policy.grant(principal, BUSINESS, operation)
    elif who == "revoked":
        world.policy.grant(principal, BUSINESS)
        world.policy.revoke(principal, BUSINESS)
    elif who == "of another business":
        world.policy.grant(principal, "globex")
    before = world.view("x-1")
    assert before.execution.state == state
    refused = service.cancel(world.store, world.policy, business_id=BUSINESS, principal_id=principal, execution_id="x-1")
    assert isinstance(refused, p.Refusal) and refused.code == p.RefusalCode.NOT_AUTHORIZED, refused
    assert refused.message == f"'{principal}' is not authorized: no grant of workflow_cancel to {principal} in {BUSINESS}"
    assert world.view("x-1") == before
    assert [e.object_id for e in world.view("x-1").evidence] == [e.object_id for e in before.evidence]
    # The same request by a principal holding the grant cancels.
    world.policy.grant(principal, BUSINESS, WORKFLOW_CANCEL)
    cancelled = service.cancel(world.store, world.policy, business_id=BUSINESS, principal_id=principal, execution_id="x-1")
    assert isinstance(cancelled, p.Decision), cancelled
    assert world.view("x-1").execution.state == ExecutionState.CANCELLED


def test_cancellation_of_running_work_is_refused(world: World) -> None:
    loop_world(world)
    world.admit("loop", "x-1", target=1)
    assert isinstance(world.store.claim_next(p.ClaimRequest("w-1", "tok-1", world.lease)), p.Decision)
    refused = service.cancel(world.store, world.policy, business_id=BUSINESS, principal_id=OPS, execution_id="x-1")
    assert isinstance(refused, p.Refusal) and refused.code == p.RefusalCode.CANCEL_RUNNING


def test_inputs_are_checked_against_the_definition_before_anything_is_written(world: World) -> None:
    loop_world(world)
    for data, field in (({}, "input.target"), ({"target": 1, "extra": 2}, "input.extra"),
                        ({"target": [1]}, "input.target")):
        try:
            world.admit("loop", "x-1", **data)
        except service.OperationError as exc:
            assert exc.code == "invalid_input" and field in exc.message
        else:
            raise AssertionError(f"{data} was admitted")
    assert world.store.execution_ids() == []


def test_definitions_of_another_business_do_not_exist(world: World) -> None:
    loop_world(world)
    assert world.store.load_definition("globex", "loop") is None
    world.policy.grant(RUNNER, "globex")
    try:
        service.run(world.store, world.policy, business_id="globex", principal_id=RUNNER, definition_id="loop",
                    input={"target": 1})
    except service.OperationError as exc:
        assert exc.code == "definition_not_found"
    else:
        raise AssertionError("ran another business's definition")


def test_a_worker_scoped_to_a_business_fires_only_that_business_timers(world: World) -> None:
    world.policy.grant(RUNNER, "globex")
    for business in (BUSINESS, "globex"):
        service.register(world.store, example("payment_with_timeout"), business, RUNNER, world.policy)
        service.run(world.store, world.policy, business_id=business, principal_id=RUNNER,
                    definition_id="payment-with-timeout", input={"order_id": "o-1", "amount": 1},
                    execution_id=f"x-{business}")
    Worker(world.store, "w-all", world.policy, world.handler).run_pass()
    world.clock.advance(timedelta(hours=2))
    assert world.store.due_wakes(business_id="globex") == [world.view("x-globex").execution.wait]
    scoped = Worker(world.store, "w-acme", world.policy, world.handler, business_id=BUSINESS).run_pass()
    assert scoped.timers_fired == 1 and scoped.refused == []
    assert world.view("x-acme").execution.state == ExecutionState.FAILED  # timed out and cancelled the order
    assert world.view("x-globex").execution.state == ExecutionState.WAITING  # not this worker's Business


# A finalization's reason is at most protocol.MAX_RATIONALE characters (specs/protocol.md, invalid_request), but a
# visit's reason quotes what it met.  Cut to the bound, the finalization commits; the evidence keeps every word.


def test_a_handler_detail_longer_than_the_bound_still_reaches_reconciliation(world: World) -> None:
    world.register(example("refund_needs_reconciliation"))
    detail = "the provider answered: " + "x" * 5000
    world.handler.scripts["payment.refund"] = unknown(detail)
    world.admit("refund", "refund-1", payment_id="p-1", amount=40)
    report = world.run_pass()
    assert report.refused == []
    view = world.view("refund-1")
    assert view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
    reason = view.history[-1].reason
    assert len(reason) == p.MAX_RATIONALE and reason.endswith("\u2026") and "has no conclusive result" in reason
    attempt = next(e for e in view.evidence if e.kind == "StepAttempt")
    assert attempt.body["detail"] == detail


def test_a_wait_on_a_long_correlation_value_still_commits_its_registration(world: World) -> None:
    world.register(example("payment_with_timeout"))
    order_id = "o-" + "7" * 4000  # a names-only input may be 4096 characters
    world.admit("payment-with-timeout", "pay-1", order_id=order_id, amount=40)
    report = world.run_pass()
    assert report.refused == []
    view = world.view("pay-1")
    assert view.execution.state == ExecutionState.WAITING
    assert len(view.history[-1].reason) == p.MAX_RATIONALE
    (registration,) = view.registrations
    assert registration.spec.correlation == (("order_id", order_id),)


# --- reasons the stores never reach on their own: planned from the context a store would read -------------------

WAITER = """
id = "waiter"
revision = 1
start = "poll"
inputs = ["order_id"]

[[nodes]]
id = "poll"
kind = "local_command"
revision = 1
operation = "job.poll"
next = "await"
on_failure = "await"

[[nodes]]
id = "await"
kind = "wait_for_event"
revision = 1
event_type = "payment.received"
correlation = { order_id = { from = "input.order_id" }, ref = { from = "poll.ref" } }
next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
"""

def _planned(node_id: str, *, definition: Definition | None, inputs: dict[str, object],
             outputs: dict[str, dict[str, object]], unsettled: tuple[Evidence, ...] = ()) -> i.Plan:
    execution = p.Execution("e-1", BUSINESS, ExecutionState.RUNNING, 3, "waiter", 1, node_id, 1, 1)
    ctx = i.Context(execution, definition, RUNNER, inputs, outputs, unsettled)
    return i.plan_visit(
        ctx, datetime(2026, 3, 1, 12, 0, 0, 123457, tzinfo=UTC), worker_id="w-1", fence=1,
        node_authority=p.Authority(True, RUNNER),
    )


def test_a_pinned_revision_that_cannot_be_found_suspends_definition_not_pinned() -> None:
    plan = _planned("poll", definition=None, inputs={"order_id": "o-1"}, outputs={})
    assert isinstance(plan, i.Finish) and plan.target == ExecutionState.SUSPENDED
    assert plan.error_code == "definition_not_pinned"
    # The visit is still recorded, as a rejected attempt, and counted.
    assert plan.step is not None and [e.state for e in plan.evidence] == ["pending", "failed"]


@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [
        ({"order_id": "o-1"}, {}),  # poll.ref: poll never completed
        ({"order_id": "o-1"}, {"poll": {"ref": 1.5}}),  # a decimal has no canonical correlation string
        ({"order_id": "o-1"}, {"poll": {"ref": None}}),
        ({"order_id": "o-1"}, {"poll": {"ref": ["r-1"]}}),
    ],
    ids=["missing", "decimal", "null", "array"],
)
def test_a_correlation_without_a_comparable_value_suspends_unresolved_binding(
    inputs: dict[str, object], outputs: dict[str, dict[str, object]]
) -> None:
    definition = parse_definition(WAITER, "waiter.toml")
    plan = _planned("await", definition=definition, inputs=inputs, outputs=outputs)
    assert isinstance(plan, i.Finish) and plan.target == ExecutionState.SUSPENDED
    assert plan.error_code == "unresolved_binding" and "ref" in plan.reason
    assert plan.wait is None


def test_a_correlation_of_strings_integers_and_booleans_registers_their_canonical_strings() -> None:
    definition = parse_definition(WAITER, "waiter.toml")
    for value, text in (("r-1", "r-1"), (-12, "-12"), (True, "true"), (False, "false")):
        plan = _planned("await", definition=definition, inputs={"order_id": "o-1"}, outputs={"poll": {"ref": value}})
        assert isinstance(plan, i.Finish) and plan.wait is not None
        assert plan.wait.correlation == (("order_id", "o-1"), ("ref", text))


def test_a_command_node_with_an_unsettled_earlier_attempt_issues_nothing_and_goes_to_review() -> None:
    definition = parse_definition(WAITER, "waiter.toml")
    earlier = _planned("poll", definition=definition, inputs={"order_id": "o-1"}, outputs={})
    assert isinstance(earlier, i.Invoke)
    interrupted = earlier.attempt
    plan = _planned("poll", definition=definition, inputs={"order_id": "o-1"}, outputs={}, unsettled=(interrupted,))
    assert isinstance(plan, i.Finish) and plan.target == ExecutionState.RECONCILIATION_REQUIRED
    assert plan.error_code == "command_unsettled"
    # Nothing of this visit is written: no attempt, no Command, no step.
    assert plan.step is None and plan.evidence == ()


def _read_back(item: Evidence) -> Evidence:
    """``item`` as a store hands it back: its body through JSON (lists where the plan has tuples)."""
    return Evidence(item.object_id, item.kind, json.loads(item.body_json()), item.revision, item.state)


def _intent_and_read() -> tuple[i.Invoke, p.Execution, list[Evidence]]:
    definition = parse_definition(WAITER, "waiter.toml")
    plan = _planned("poll", definition=definition, inputs={"order_id": "o-1"}, outputs={})
    assert isinstance(plan, i.Invoke)
    planned = p.Execution("e-1", BUSINESS, ExecutionState.RUNNING, 3, "waiter", 1, "poll", 1, 1)
    # A read holds each object at its newest revision, and the execution's other evidence beside it.
    newest = {item.object_id: item for item in plan.evidence}
    admitted = Evidence("e-1/input", i.EXECUTION_INPUT, {"order_id": "o-1"})
    return plan, planned, [_read_back(admitted), *(_read_back(item) for item in newest.values())]


def test_a_read_of_exactly_the_planned_intent_lets_its_command_be_sent() -> None:
    # specs/protocol.md, "A decision of unknown outcome": an intent whose COMMIT's answer was lost is sent to
    # its handler once, only where the read is that intent and nothing after it.
    plan, planned, read = _intent_and_read()
    assert i.intent_as_planned(plan, planned, planned, read)
    assert i.intent_as_planned(plan, planned, planned, list(reversed(read)))


@pytest.mark.parametrize(
    "change",
    ["execution revision", "current node", "attempt settled", "command settled", "command missing",
     "attempt missing", "payload", "attempt state", "kind"],
)
def test_a_read_that_differs_from_the_planned_intent_in_anything_is_planned_afresh(change: str) -> None:
    # Planned afresh, an unsettled Command goes to reconciliation: never to its handler a second time.
    plan, planned, read = _intent_and_read()
    execution = planned
    attempt = next(n for n, item in enumerate(read) if item.object_id == plan.attempt.object_id)
    command = next(n for n, item in enumerate(read) if item.object_id == plan.command.command_id)
    if change == "execution revision":
        execution = attrs.evolve(planned, revision=planned.revision + 1)
    elif change == "current node":
        execution = attrs.evolve(planned, current_node_id="await")
    elif change == "attempt settled":
        read[attempt] = read[attempt].next("completed", {"outputs": {"ref": "r-1"}})
    elif change == "command settled":
        read[command] = read[command].next("succeeded", {"status": "succeeded"})
    elif change == "command missing":
        del read[command]
    elif change == "attempt missing":
        del read[attempt]
    elif change == "payload":
        item = read[command]
        read[command] = Evidence(item.object_id, item.kind, {**item.body, "payload": {"x": 1}}, item.revision, item.state)
    elif change == "attempt state":
        item = read[attempt]
        read[attempt] = Evidence(item.object_id, item.kind, item.body, item.revision, "pending")
    else:
        item = read[command]
        read[command] = Evidence(item.object_id, "Other", item.body, item.revision, item.state)
    assert not i.intent_as_planned(plan, planned, execution, read)


@pytest.mark.parametrize(("length", "revision"), [(10, 7), (125, 7), (126, 7), (128, 7), (128, 12345)])
def test_an_attempt_identity_is_spelt_as_the_spec_spells_it(length: int, revision: int) -> None:
    # specs/interpreter.md, Step attempts: '<execution>/a<revision>', or past 128 characters the first 98 of
    # the execution id, '/a<revision>', '.' and the first 24 lower-case hex digits of the long form's
    # SHA-256, cut at 128.  Another engine must spell it alike: it is the identity every record names.
    execution_id = ("e-" + "x" * 200)[:length]
    execution = p.Execution(execution_id, BUSINESS, ExecutionState.RUNNING, revision, "loop", 1, "poll", 0, 1)
    long_form = f"{execution_id}/a{revision}"
    if len(long_form) <= 128:
        expected = long_form
    else:
        digest = hashlib.sha256(long_form.encode("utf-8")).hexdigest()[:24]
        expected = f"{execution_id[:98]}/a{revision}.{digest}"[:128]
    assert attempt_id(execution) == expected and len(expected) <= 128
