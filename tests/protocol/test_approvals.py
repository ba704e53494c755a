"""A reviewer's decision on an approval request: current authority is asked before what is stored.

What this module proves (seed 000: ``request_approval``, "Unauthorized,
expired, revoked, stale, or misbound decisions do not wake the execution";
Security: membership, grants and approval scope "are checked at the
consequential node boundary"; specs/interpreter.md, Approvals):

- a reviewer without current authority, outside the request's reviewer
  scope, or the requester where distinct reviewers are required, is refused
  ``not_authorized`` whatever is stored: a decision stored earlier under the
  same identity (identical or not) answers neither ``already_decided`` nor
  ``decision_conflict``, and the request's determination and its reviewer
  are not named; the refusal is exactly the one a new decision by that
  reviewer on a pending request gets;
- an authorized reviewer still meets the stored decision before the
  binding and the request's state: a repeat is ``already_decided``, the
  same identity with other content ``decision_conflict``.
"""

from __future__ import annotations

import attrs
import pytest

from fencekeeper.kernel import approvals
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.protocol import Authority, Refusal, RefusalCode, Unchanged, UnchangedCode

LEAD = "user:lead"
CLERK = "user:clerk"
BINDING = approvals.Binding("refund", (("order-1", 3),), (("p-refunds", 2),))
PENDING = approvals.ApprovalRequest(
    request_id="apr-1",
    execution_id="e-1",
    business_id="b-1",
    node_id="approve",
    attempt_id="a-2",
    binding=BINDING,
    requester_id=CLERK,
    reviewers=(LEAD, CLERK),
    distinct_reviewer=True,
)
FIRST = approvals.ApprovalDecision(
    decision_id="d-0",
    request_id="apr-1",
    business_id="b-1",
    reviewer_id=LEAD,
    determination="approved",
    binding=BINDING,
    authority=Authority(True, LEAD),
    rationale="within policy",
)
REVOKED = Authority(False, LEAD, "grant revoked")


def _worlds() -> dict[str, tuple[approvals.ApprovalRequest, int, Evidence | None]]:
    """(request, its revision, the stored decision with the identity asked) by name."""
    first = approvals.decide(PENDING, 1, None, FIRST)
    assert isinstance(first, approvals.Accepted), first
    return {
        "decided_with_this_identity": (first.request, 2, first.evidence[0]),
        "decided_by_another": (first.request, 2, None),
        "closed": (attrs.evolve(PENDING, state=approvals.ApprovalState.CLOSED), 2, None),
    }


# Each with the identity of the stored decision, so that today's order would answer from what is stored.
UNAUTHORIZED = {
    "revoked_repeat": attrs.evolve(FIRST, authority=REVOKED),
    "revoked_other_content": attrs.evolve(FIRST, authority=REVOKED, determination="rejected"),
    "out_of_scope": attrs.evolve(FIRST, reviewer_id="user:other", authority=Authority(True, "user:other")),
    "requester": attrs.evolve(FIRST, reviewer_id=CLERK, authority=Authority(True, CLERK)),
}


@pytest.mark.parametrize("world", ["decided_with_this_identity", "decided_by_another", "closed"])
@pytest.mark.parametrize("label", list(UNAUTHORIZED))
def test_an_unauthorized_reviewer_learns_nothing_of_what_is_stored(world: str, label: str) -> None:
    request, revision, prior = _worlds()[world]
    decision = UNAUTHORIZED[label]
    outcome = approvals.decide(request, revision, prior, decision)
    assert isinstance(outcome, Refusal) and outcome.code == RefusalCode.NOT_AUTHORIZED, outcome
    # The very refusal a new decision by this reviewer gets where nothing is decided yet.
    assert outcome == approvals.decide(PENDING, 1, None, decision)
    assert LEAD not in outcome.message or decision.reviewer_id == LEAD, outcome
    assert "approved" not in outcome.message and "already" not in outcome.message, outcome


def test_an_authorized_reviewer_meets_the_stored_decision_before_the_binding() -> None:
    request, revision, prior = _worlds()["decided_with_this_identity"]
    repeat = approvals.decide(request, revision, prior, FIRST)
    assert isinstance(repeat, Unchanged) and repeat.code == UnchangedCode.ALREADY_DECIDED, repeat
    other = attrs.evolve(FIRST, determination="rejected", binding=attrs.evolve(BINDING, operation="refund_all"))
    conflict = approvals.decide(request, revision, prior, other)
    assert isinstance(conflict, Refusal) and conflict.code == RefusalCode.DECISION_CONFLICT, conflict
    assert conflict.field == "decision_id"
