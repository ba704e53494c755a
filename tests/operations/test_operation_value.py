"""An Operation value holds together per state, and a broken one is one clear error naming the operation and field.

Stores build Operations from their rows, which old code, a hand edit or damage
may have left contradicting their state (a running row without an owner).
Such a value must never reach a decision's own checks, where it would fail
as a bare AssertionError or as a misleading refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.errors import InvalidOperation, KernelError
from fencekeeper.kernel.machines import OperationState

from .kernel_fixtures import GRANTED, LEASE, SECOND, T0, admitted, claimed, submit_request


def running() -> tuple[o.Operation, o.Credential]:
    operation, credential, _ = claimed(admitted(), "w1", T0)
    return operation, credential


def ended(state: OperationState, outcome: o.TerminalOutcome) -> o.Operation:
    return attrs.evolve(admitted(), state=state, outcome=outcome, error_code=outcome.value)


BROKEN_RUNNING: list[tuple[str, dict[str, Any]]] = [
    ("owner", {"owner": None}),
    ("attempt_started_at", {"attempt_started_at": None}),
    ("lease_expires_at", {"lease_expires_at": None}),
    ("fence", {"fence": 0}),
    ("attempt_count", {"attempt_count": 0}),
    ("outcome", {"outcome": o.TerminalOutcome.SUCCEEDED}),
]


@pytest.mark.parametrize(("field", "changes"), BROKEN_RUNNING, ids=[f for f, _ in BROKEN_RUNNING])
def test_a_running_operation_without_what_running_needs_cannot_be_made(field: str, changes: dict[str, Any]) -> None:
    operation, _ = running()
    with pytest.raises(InvalidOperation) as raised:
        attrs.evolve(operation, **changes)
    error = raised.value
    assert (error.code, error.operation_id, error.field) == ("invalid_operation", "op-1", field)
    assert error.message.startswith(f"operation 'op-1': {field}: ")
    assert isinstance(error, KernelError) and isinstance(error, ValueError)


@pytest.mark.parametrize(
    ("field", "make"),
    [
        ("owner", lambda: attrs.evolve(admitted(), owner="w1")),
        ("lease_expires_at", lambda: attrs.evolve(admitted(), lease_expires_at=T0)),
        ("attempt_started_at", lambda: attrs.evolve(admitted(), attempt_started_at=T0)),
        ("outcome", lambda: attrs.evolve(admitted(), outcome=o.TerminalOutcome.CANCELLED)),
        ("outcome", lambda: attrs.evolve(admitted(), state=OperationState.SUCCEEDED)),
        ("outcome", lambda: ended(OperationState.CANCELLED, o.TerminalOutcome.SUCCEEDED)),
        ("outcome", lambda: ended(OperationState.SUCCEEDED, o.TerminalOutcome.ACTION_FAILED)),
        ("outcome", lambda: ended(OperationState.FAILED, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN)),
        ("requires_approval", lambda: attrs.evolve(admitted(), state=OperationState.AWAITING_APPROVAL)),
        ("effect_id", lambda: attrs.evolve(admitted(), effect_unsettled_since=1)),
    ],
)
def test_every_other_state_holds_its_own_fields_together(field: str, make: Any) -> None:
    with pytest.raises(InvalidOperation) as raised:
        make()
    assert (raised.value.operation_id, raised.value.field) == ("op-1", field)


def test_every_state_a_decision_makes_is_a_valid_value() -> None:
    # The same combinations, as the decisions themselves make them: none is refused.
    waiting = admitted(requires_approval=True)
    assert waiting.state is OperationState.AWAITING_APPROVAL
    operation, credential = running()
    done = o.complete(operation, o.CompleteRequest(credential, GRANTED), T0 + SECOND)
    assert isinstance(done, o.Decision) and done.operation.state is OperationState.SUCCEEDED
    for outcome in (o.TerminalOutcome.ACTION_FAILED, o.TerminalOutcome.DEADLINE_EXCEEDED):
        assert ended(OperationState.FAILED, outcome).outcome is outcome
    assert ended(OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN).owner is None


def damaged(operation: o.Operation, **changes: Any) -> o.Operation:
    """``operation`` changed around its constructor: what a store holding values, not rows, could be handed."""
    copy = attrs.evolve(operation)
    for name, value in changes.items():
        object.__setattr__(copy, name, value)
    return copy


@pytest.mark.parametrize(("field", "changes"), BROKEN_RUNNING[:4], ids=[f for f, _ in BROKEN_RUNNING[:4]])
def test_every_decision_on_a_damaged_value_is_the_same_clear_error(field: str, changes: dict[str, Any]) -> None:
    operation, credential = running()
    broken = damaged(operation, **changes)
    later = T0 + LEASE + SECOND  # the lease expired: a claim replaces the owner, ending its Attempt
    decisions: list[Callable[[], o.Outcome]] = [
        lambda: o.claim(broken, o.ClaimRequest("w2", LEASE), later),
        lambda: o.heartbeat(broken, o.HeartbeatRequest(credential, LEASE), T0 + SECOND),
        lambda: o.complete(broken, o.CompleteRequest(credential, GRANTED), T0 + SECOND),
        lambda: o.fail(broken, o.FailRequest(credential, "boom", retryable=True), T0 + SECOND),
        lambda: o.cancel(broken, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0 + SECOND),
        lambda: o.expire(broken, broken.deadline + LEASE),
    ]
    for decide in decisions:
        with pytest.raises(InvalidOperation) as raised:
            decide()
        assert (raised.value.operation_id, raised.value.field) == ("op-1", field)


NAIVE = T0.replace(tzinfo=None)
BROKEN_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("state", {"state": "admitted"}),
    ("revision", {"revision": 0}),
    ("revision", {"revision": True}),
    ("fence", {"fence": -1}),
    ("attempt_count", {"attempt_count": -1}),
    ("action_version", {"action_version": "1"}),
    ("effect_class", {"effect_class": "atomic"}),
    ("outcome", {"outcome": "cancelled"}),
    ("next_eligible_at", {"next_eligible_at": NAIVE}),
    ("deadline", {"deadline": None}),
    ("retain_until", {"retain_until": "2026-01-01T00:00:00Z"}),
]


@pytest.mark.parametrize(("field", "changes"), BROKEN_FIELDS, ids=[f"{f}-{v!r}" for f, c in BROKEN_FIELDS for v in c.values()])
def test_a_field_not_of_its_type_or_range_cannot_be_made_and_is_never_decided_on(
    field: str, changes: dict[str, Any]
) -> None:
    # Before: such a value was made, and a decision raised an AttributeError
    # or a datetime comparison error on it, or (a revision of 0) was decided
    # on, with a guard expecting revision 0.
    with pytest.raises(InvalidOperation) as raised:
        attrs.evolve(admitted(), **changes)
    assert (raised.value.operation_id, raised.value.field) == ("op-1", field)
    broken = damaged(admitted(), **changes)
    for decide in (
        lambda: o.claim(broken, o.ClaimRequest("w2", LEASE), T0 + SECOND),
        lambda: o.cancel(broken, o.CancelRequest("op-1", "users:v1:alice", GRANTED), T0 + SECOND),
    ):
        with pytest.raises(InvalidOperation) as raised:
            decide()
        assert raised.value.field == field


def test_a_snapshot_that_is_no_operation_is_a_type_error_naming_the_argument() -> None:
    with pytest.raises(TypeError, match=r"^operation: must be of type Operation or None, got str"):
        o.claim("op-1", o.ClaimRequest("w2", LEASE), T0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^existing: must be of type Operation or None, got str"):
        o.submit("op-1", submit_request(), T0)  # type: ignore[arg-type]
