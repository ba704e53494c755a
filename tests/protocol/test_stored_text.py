"""Strings the stores keep, and the error code a success leaves behind.

What this module proves:

- a string no store can keep as text (a NUL, which PostgreSQL's text type
  refuses while SQLite accepts it, or a lone surrogate, which has no UTF-8
  form) is refused by the kernel before any decision, naming the field: an
  Event's correlation values and payload, a waiter's correlation values, a
  finalization's reason, a reviewer's rationale and a governed recovery's
  rationale (kernel/text.py); a finalization's reason, like every
  rationale, is at most ``MAX_RATIONALE`` (2000) characters;
- other control characters are text and are accepted (they are escaped
  only when shown);
- a success clears the dispatch row's ``last_error_code``: an error the
  execution got past is no longer its last word; a failure still records
  its own code, and a move that is not a success keeps the earlier one.
"""

from __future__ import annotations

import attrs
import pytest

from fencekeeper.kernel import approvals, operations, recovery, text
from fencekeeper.kernel.events import Event, EventError
from fencekeeper.kernel.machines import ExecutionState
from fencekeeper.kernel.protocol import (
    MAX_RATIONALE,
    RecoveryKind,
    Refusal,
    RefusalCode,
    ReleaseRequest,
    finalize,
    release,
)
from fencekeeper.kernel.recovery import recover

from .test_decisions import (
    EVENT_SPEC,
    GRANTED,
    T0,
    decided,
    finalize_request,
    in_state,
    leased,
    recovery_request,
    refused,
)


@pytest.mark.parametrize(
    ("correlation", "payload", "field", "problem"),
    [
        ({"order_id": "o-\x001"}, None, "correlation.order_id", "contains NUL (U+0000)"),
        ({"order_id": "o-\ud800"}, None, "correlation.order_id", "contains an unpaired surrogate (U+D800)"),
        ({"order_id": "o-1"}, {"lines": [{"sku": "a\x00"}]}, "payload.lines[0].sku", "contains NUL"),
        ({"order_id": "o-1"}, {"note": "\udcff"}, "payload.note", "contains an unpaired surrogate (U+DCFF)"),
    ],
)
def test_an_event_with_unstorable_text_is_refused_naming_the_field(
    correlation: dict[str, object], payload: dict[str, object] | None, field: str, problem: str
) -> None:
    with pytest.raises(EventError) as caught:
        Event.build("ev-1", "biz-1", "order.paid", correlation, payload)
    assert str(caught.value).startswith(f"{field}: {problem}"), caught.value


@pytest.mark.parametrize(
    ("key", "named"),
    [("a\x00", "payload['a\\x00']"), ("\udc00", "payload['\\udc00']"), ("k" * 200, "payload['kkk")],
    ids=["NUL", "surrogate", "long"],
)
def test_a_payload_value_that_is_no_json_is_named_by_a_storable_field(key: str, named: str) -> None:
    # The key's own problem comes second (JSON values are checked first): the field that names the NaN
    # under it used to quote the key whole, NUL or lone surrogate or 200 characters included.
    with pytest.raises(EventError) as caught:
        Event.build("ev-1", "biz-1", "order.paid", {"order_id": "o-1"}, {key: float("nan")})
    message = str(caught.value)
    assert message.startswith(named) and message.endswith("must be a finite number"), message
    assert text.problem(message) is None and len(message) < 200


def test_other_control_characters_are_text() -> None:
    event = Event.build("ev-1", "biz-1", "order.paid", {"order_id": "o-\x1b[31m1\t"}, {"note": "\x07"})
    assert event.correlation == (("order_id", "o-\x1b[31m1\t"),)


@pytest.mark.parametrize("value", ["o-\x00", "\ud800"])
def test_a_waiter_correlation_value_no_store_can_keep_is_refused(value: str) -> None:
    snap = leased()
    spec = attrs.evolve(EVENT_SPEC, correlation=(("order_id", value), ("tenant", "t-1")))
    request = finalize_request(snap, ExecutionState.WAITING, wait=spec)
    refusal = refused(finalize(snap.execution, snap.dispatch, request, T0), RefusalCode.INVALID_REQUEST)
    assert refusal.field == "wait.correlation['order_id']", refusal


def test_a_finalization_reason_no_store_can_keep_is_refused() -> None:
    snap = leased()
    request = finalize_request(snap, ExecutionState.SUSPENDED, reason="bad \x00 reason")
    refusal = refused(finalize(snap.execution, snap.dispatch, request, T0), RefusalCode.INVALID_REQUEST)
    assert refusal.field == "reason"


@pytest.mark.parametrize("target", [ExecutionState.FAILED, ExecutionState.SUSPENDED, ExecutionState.WAITING])
def test_a_finalization_reason_is_bounded_as_every_rationale_is(target: ExecutionState) -> None:
    # Was: only a NUL or a lone surrogate was refused, so a reason of any
    # length was kept with the history, while a recovery's or a reviewer's
    # rationale and an operation's cancellation reason stop at 2000.
    snap = leased()
    longest = "x" * MAX_RATIONALE
    decision = decided(finalize(snap.execution, snap.dispatch, finalize_request(snap, target, reason=longest), T0))
    assert decision.evidence[0].reason == longest
    request = finalize_request(snap, target, reason=longest + "x")
    refusal = refused(finalize(snap.execution, snap.dispatch, request, T0), RefusalCode.INVALID_REQUEST)
    assert (refusal.field, refusal.message) == ("reason", "reason: must be at most 2000 characters, got 2001")


def test_one_bound_for_every_free_text_given_with_a_decision() -> None:
    # The names the adapters and the other kernel modules import are the one constant.
    assert MAX_RATIONALE == approvals.MAX_RATIONALE == recovery.MAX_RATIONALE == operations.MAX_RATIONALE == 2000


@pytest.mark.parametrize(
    ("rationale", "says"),
    [("ok\udcff", "rationale: "), ("x" * (approvals.MAX_RATIONALE + 1), "at most 2000 characters, got 2001")],
)
def test_a_rationale_no_store_can_keep_is_refused(rationale: str, says: str) -> None:
    decision = approvals.ApprovalDecision(
        decision_id="d-1",
        request_id="x/a1/approval",
        business_id="biz-1",
        reviewer_id="user:m",
        determination="approved",
        binding=approvals.Binding("purchase.approve", (("o-1", 1),), ()),
        authority=GRANTED,
        rationale=rationale,
    )
    outcome = approvals.decide(None, 1, None, decision)
    assert outcome.code == RefusalCode.INVALID_REQUEST and outcome.field == "rationale", outcome
    assert says in outcome.message, outcome
    at_the_bound = attrs.evolve(decision, rationale="x" * approvals.MAX_RATIONALE)
    # Past the rationale, to the next check: no request of that id exists.
    passed = approvals.decide(None, 1, None, at_the_bound)
    assert isinstance(passed, Refusal) and passed.code == RefusalCode.APPROVAL_NOT_FOUND, passed


@pytest.mark.parametrize("kind", [RecoveryKind.FAIL, RecoveryKind.RESUME_SUSPENDED])
@pytest.mark.parametrize("value", ["bad \x00 why", "bad \udcff byte"], ids=["nul", "surrogate"])
def test_a_recovery_rationale_no_store_can_keep_is_refused(kind: RecoveryKind, value: str) -> None:
    # A byte that is not UTF-8 in a command-line argument arrives as a lone surrogate: the
    # decision must refuse it, naming the field, before a store fails to encode it.
    snap = in_state(ExecutionState.SUSPENDED)
    request = recovery_request(snap, kind, rationale=value)
    refusal = refused(recover(snap.execution, snap.dispatch, None, request, T0), RefusalCode.INVALID_REQUEST)
    assert refusal.field == "rationale", refusal


def test_success_clears_the_last_error_code() -> None:
    snap = leased()
    with_error = attrs.evolve(snap.dispatch, last_error_code="command_unknown")
    succeeded = decided(finalize(snap.execution, with_error, finalize_request(snap, ExecutionState.SUCCEEDED), T0))
    assert succeeded.dispatch is not None and succeeded.dispatch.last_error_code is None
    # A failure records its own code; a move that is not a success keeps the earlier one.
    failed = decided(
        finalize(snap.execution, with_error, finalize_request(snap, ExecutionState.FAILED, error_code="rejected"), T0)
    )
    assert failed.dispatch is not None and failed.dispatch.last_error_code == "rejected"
    released = decided(release(snap.execution, with_error, ReleaseRequest(snap.lease, snap.execution.revision), T0))
    assert released.dispatch is not None and released.dispatch.last_error_code == "command_unknown"
