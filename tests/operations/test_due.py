"""A row a store finds due is one the kernel claims or ends: never one a claim refuses.

Stores find a tenant's next work by ``due_at`` (``adapters/operations/base.py``)
and hand the first due row to ``operations.claim``.  A claim that refused a due
row would write nothing, leave it due and first in order, and stall every later
claim of the tenant behind it (``INV-OP-DUE-CLAIMED``).  Checked here in every
state the model checker reaches, and for Operations no decision makes (old or
hand-edited rows: an approval ``decide`` would refuse, an eligibility past the
deadline).  A row whose fields contradict its state (a running row without an
owner) is not handed to a claim at all: the store refuses it as it reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from fencekeeper.adapters.operations.base import due_at
from fencekeeper.kernel import operations as o
from fencekeeper.kernel.machines import OPERATION, OperationState
from fencekeeper.kernel.opsmodel import Bounds, OpsProtocol, World, initial_world, moves

from .kernel_fixtures import LEASE, SECOND, T0, admitted

MICROSECOND = timedelta(microseconds=1)
EXECUTION = Bounds(workers=2, max_claims=3, max_tick=5, max_depth=10)
EXTERNAL = Bounds(
    workers=2, approval=False, cancel=False, max_claims=2, max_tick=3, maximum_attempts=2, max_depth=12, external=True
)


def _reachable(bounds: Bounds) -> Iterator[World]:
    seen = {initial_world(bounds)}
    frontier = [next(iter(seen))]
    for _ in range(bounds.max_depth or 0):
        following = []
        for world in frontier:
            for move in moves(world, bounds, OpsProtocol())[0]:
                if move.world not in seen:
                    seen.add(move.world)
                    following.append(move.world)
        frontier = following
    yield from seen


def _moments(operation: o.Operation, now: datetime) -> set[datetime]:
    """``now`` and every time the Operation names, with the microsecond on either side of each."""
    named = [operation.next_eligible_at, operation.deadline, operation.lease_expires_at]
    if operation.approval is not None:
        named.append(operation.approval.expires_at)
    return {now} | {t + step for t in named if t is not None for step in (-MICROSECOND, timedelta(0), MICROSECOND)}


def _check(operation: o.Operation, now: datetime) -> None:
    when = due_at(operation)
    store_due = when is not None and when <= now
    assert store_due == o.due(operation, now), (operation, now, when)
    if store_due:
        outcome = o.claim(operation, o.ClaimRequest("w-due", LEASE), now)
        assert not isinstance(outcome, o.Refusal), (operation, now, outcome)
        assert isinstance(outcome, o.Decision)
        # An end writes a transition and its outbox row like any end; an Attempt comes with a credential.
        assert outcome.outbox and (outcome.credential is not None or outcome.operation.outcome is not None)


def test_every_reachable_state_due_in_a_store_is_claimed_or_ended() -> None:
    checked = 0
    for bounds in (EXECUTION, EXTERNAL):
        for world in _reachable(bounds):
            for operation in world.operations:
                for moment in _moments(operation, world.now):
                    _check(operation, moment)
                    checked += 1
    assert checked > 10_000


def _approval(operation: o.Operation, **changes: object) -> o.Approval:
    fields: dict[str, object] = {
        "approval_id": "ap-1",
        "operation_id": operation.operation_id,
        "input_digest": operation.input_digest,
        "action_name": operation.action_name,
        "action_version": operation.action_version,
        "tenant": operation.identity.tenant,
        "requester": operation.identity.principal,
        "approver": "users:v1:bob",
        "approved": True,
        "expires_at": T0 + 60 * SECOND,
        "decided_at": T0,
    }
    fields.update(changes)
    return o.Approval(**fields)  # type: ignore[arg-type]


_FLAWS: list[dict[str, object]] = [
    {},
    {"approved": False},
    {"operation_id": "op-other"},
    {"input_digest": "f" * 64},
    {"action_name": "other"},
    {"action_version": 2},
    {"tenant": "tenant-b"},
    {"requester": "users:v1:carol"},
    {"approver": "users:v1:alice"},
    {"approver": "users:v7:alice"},
    {"consumed_by": 1},
    {"expires_at": T0 + SECOND},
]


@st.composite
def _operations(draw: st.DrawFn) -> o.Operation:
    """Any Operation a store's row can hold: every state, approval and order of its times, as data may be edited."""
    operation = admitted()
    state = draw(st.sampled_from(OperationState))
    offsets = st.integers(min_value=-5, max_value=700).map(lambda n: T0 + n * SECOND)
    changes: dict[str, object] = {
        "state": state,
        "next_eligible_at": draw(offsets),
        "deadline": draw(offsets),
        "requires_approval": draw(st.booleans()),
        "fence": draw(st.integers(min_value=0, max_value=4)),
        "attempt_count": draw(st.integers(min_value=0, max_value=4)),
    }
    flaw = draw(st.none() | st.sampled_from(_FLAWS))
    changes["approval"] = None if flaw is None else _approval(operation, **flaw)
    if state is OperationState.RUNNING:
        # A running row has an owner, a lease and a start, and was claimed (a row without them is refused as
        # it is read: operations.operation_problem, tests/operations/test_malformed_rows.py).
        changes.update(owner="w1", lease_expires_at=draw(offsets), attempt_started_at=T0, fence=max(1, draw(
            st.integers(min_value=1, max_value=4))), attempt_count=draw(st.integers(min_value=1, max_value=4)))
    elif state is OperationState.AWAITING_APPROVAL:
        changes["requires_approval"] = True
    elif state in OPERATION.terminal:
        changes["outcome"] = draw(st.sampled_from(_OUTCOMES[state]))
    return attrs.evolve(operation, **changes)


_OUTCOMES = {
    OperationState.SUCCEEDED: [o.TerminalOutcome.SUCCEEDED],
    OperationState.CANCELLED: [o.TerminalOutcome.CANCELLED],
    OperationState.OUTCOME_UNKNOWN: [o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN],
    OperationState.FAILED: [t for t in o.TerminalOutcome if t.value not in ("succeeded", "cancelled",
                                                                           "external_outcome_unknown")],
}


@settings(max_examples=2000, deadline=None)
@given(_operations(), st.integers(min_value=-5, max_value=700))
def test_any_row_due_in_a_store_is_claimed_or_ended(operation: o.Operation, seconds: int) -> None:
    for moment in _moments(operation, T0 + seconds * SECOND):
        _check(operation, moment)


def test_an_unusable_approval_ends_the_operation_approval_misbound() -> None:
    operation = attrs.evolve(admitted(requires_approval=True), state=OperationState.ADMITTED)
    for flaw in _FLAWS[1:10]:
        edited = attrs.evolve(operation, approval=_approval(operation, **flaw))
        outcome = o.claim(edited, o.ClaimRequest("w1", LEASE), T0)
        assert isinstance(outcome, o.Decision), (flaw, outcome)
        ended = outcome.operation
        assert (ended.state, ended.outcome, ended.error_code, ended.fence, ended.attempt_count) == (
            OperationState.FAILED, o.TerminalOutcome.APPROVAL_MISBOUND, "approval_misbound", 0, 0
        ), flaw
        assert outcome.credential is None and outcome.attempts == ()
        assert outcome.transition.event is not None and outcome.transition.event.value == "approval_misbound"
        assert outcome.outbox[0].topic == "operation.failed"
    missing = o.claim(attrs.evolve(operation, approval=None), o.ClaimRequest("w1", LEASE), T0)
    assert isinstance(missing, o.Decision) and missing.operation.outcome is o.TerminalOutcome.APPROVAL_MISBOUND


def test_a_replacement_that_finds_an_unusable_approval_abandons_the_owner_and_ends() -> None:
    operation = admitted(requires_approval=True)
    approval = _approval(operation, consumed_by=1)
    running = attrs.evolve(
        operation,
        state=OperationState.RUNNING,
        approval=attrs.evolve(approval, approver="users:v1:alice"),
        fence=1,
        attempt_count=1,
        owner="w1",
        lease_expires_at=T0 + LEASE,
        attempt_started_at=T0,
    )
    outcome = o.claim(running, o.ClaimRequest("w2", LEASE), T0 + LEASE)
    assert isinstance(outcome, o.Decision)
    assert [(a.number, a.state) for a in outcome.attempts] == [(1, o.AttemptState.ABANDONED)]
    assert (outcome.operation.state, outcome.operation.outcome, outcome.operation.fence) == (
        OperationState.FAILED, o.TerminalOutcome.APPROVAL_MISBOUND, 1
    )
    assert outcome.operation.owner is None and outcome.credential is None


def test_an_admitted_operation_past_its_deadline_ends_whatever_its_next_eligibility() -> None:
    operation = attrs.evolve(admitted(), next_eligible_at=T0 + 700 * SECOND)
    at = operation.deadline
    assert o.due(operation, at) and due_at(operation) == operation.deadline
    outcome = o.claim(operation, o.ClaimRequest("w1", LEASE), at)
    assert isinstance(outcome, o.Decision) and outcome.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED
    early = o.claim(operation, o.ClaimRequest("w1", LEASE), at - MICROSECOND)
    assert isinstance(early, o.Refusal) and early.code is o.RefusalCode.NOT_ELIGIBLE

