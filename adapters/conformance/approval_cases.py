"""Protocol-layer cases for a reviewer's decision on an approval request (specs/interpreter.md, Approvals).

Rules of this module:

- Each case is the stored request (or none), its evidence revision, the
  stored decision with the same identity (or none) and the reviewer's
  decision; the expectation is :func:`fencekeeper.kernel.approvals.decide`'s
  answer in the JSON of :func:`.wire.approval_outcome`.
- The cases start from one pending request and one decision that would be
  accepted, and break one thing at a time, so that every step of the
  order in specs/interpreter.md is reached with the later ones still
  satisfied; a few break two at once to pin the order between them.
- A reviewer refused now is asked with the identity of a stored decision
  and on a decided request: the refusal is ``not_authorized``, never an
  answer from what is stored (cases 2.4.0).
- The decision reads no clock: ``now`` is given, as in every protocol case,
  and ignored.
"""

from __future__ import annotations

from typing import Any

from fencekeeper.kernel import approvals
from fencekeeper.kernel.evidence import Evidence

from . import wire
from .basis import T0, Case

REQUEST: dict[str, Any] = {
    "request_id": "apr-1", "execution_id": "e-1", "business_id": "b-1", "node_id": "approve",
    "attempt_id": "a-2", "binding": {"operation": "refund", "targets": [["order-1", 3]], "policies": [["p-refunds", 2]]},
    "requester_id": "user:clerk", "reviewers": ["user:lead", "user:clerk"], "distinct_reviewer": True,
    "state": "pending", "decided_by": None, "decision_id": None,
}
DECISION: dict[str, Any] = {
    "decision_id": "d-1", "request_id": "apr-1", "business_id": "b-1", "reviewer_id": "user:lead",
    "determination": "approved", "binding": REQUEST["binding"],
    "authority": {"granted": True, "principal_id": "user:lead"}, "rationale": "within policy",
}


def _decided(determination: str) -> dict[str, Any]:
    return {**REQUEST, "state": determination, "decided_by": "user:lead", "decision_id": "d-0"}


def _prior(decision: dict[str, Any]) -> dict[str, Any]:
    """The stored decision evidence for ``decision``, as an accepted first determination left it."""
    content = wire.parse_approval_decision(decision).content()
    object_id = approvals.decision_object_id(decision["request_id"], decision["decision_id"])
    stored = Evidence(object_id, approvals.APPROVAL_DECISION, {**content, "status": "accepted"}, 1, "accepted")
    found: dict[str, Any] = wire.evidence(stored)
    return found


def _binding(**changes: Any) -> dict[str, Any]:
    return {**REQUEST["binding"], **changes}


def _worlds() -> dict[str, tuple[dict[str, Any] | None, int, dict[str, Any] | None]]:
    """(request, request_revision, prior decision) by name."""
    decided = {**DECISION, "decision_id": "d-0"}
    return {
        "pending": (REQUEST, 1, None),
        "no_request": (None, 1, None),
        "other_business": ({**REQUEST, "business_id": "b-2"}, 1, None),
        "closed": ({**REQUEST, "state": "closed"}, 2, None),
        "approved": (_decided("approved"), 2, None),
        "rejected": (_decided("rejected"), 2, None),
        "same_id_recorded": (_decided("approved"), 2, _prior(decided)),
    }


def _decisions() -> dict[str, dict[str, Any]]:
    d = DECISION
    return {
        "approve": d,
        "reject": {**d, "determination": "rejected"},
        "determination_unknown": {**d, "determination": "maybe"},
        "rationale_not_text": {**d, "rationale": "a\u0000b"},
        "authority_denied": {**d, "authority": {"granted": False, "principal_id": "user:lead"}},
        "reviewer_out_of_scope": {**d, "reviewer_id": "user:other"},
        "requester_reviews_own": {**d, "reviewer_id": "user:clerk"},
        "operation_differs": {**d, "binding": _binding(operation="refund_all")},
        "target_revision_stale": {**d, "binding": _binding(targets=[["order-1", 2]])},
        "target_differs": {**d, "binding": _binding(targets=[["order-2", 3]])},
        "policy_revision_stale": {**d, "binding": _binding(policies=[["p-refunds", 1]])},
        "policy_missing": {**d, "binding": _binding(policies=[])},
        "same_id_same_content": {**d, "decision_id": "d-0"},
        "same_id_other_content": {**d, "decision_id": "d-0", "determination": "rejected"},
        "same_id_other_rationale": {**d, "decision_id": "d-0", "rationale": "changed my mind"},
        "misbound_by_out_of_scope": {**d, "reviewer_id": "user:other", "binding": _binding(operation="refund_all")},
        # The stored decision's identity from a reviewer refused now: current authority answers, not what is stored.
        "same_id_authority_denied": {**d, "decision_id": "d-0", "authority": {"granted": False, "principal_id": "user:lead"}},
        "same_id_other_content_denied": {**d, "decision_id": "d-0", "determination": "rejected",
                                         "authority": {"granted": False, "principal_id": "user:lead"}},
        "same_id_out_of_scope": {**d, "decision_id": "d-0", "reviewer_id": "user:other"},
        "same_id_requester": {**d, "decision_id": "d-0", "reviewer_id": "user:clerk"},
    }


# Which decisions each world is asked: every decision of the pending request, and on the other worlds
# the ones whose order against that world's refusal matters.
_ASKED = {
    "pending": None,
    "no_request": ("approve", "determination_unknown", "authority_denied", "same_id_other_content"),
    "other_business": ("approve", "operation_differs"),
    "closed": ("approve", "reject", "operation_differs", "authority_denied", "same_id_same_content"),
    "approved": ("approve", "reject", "operation_differs", "authority_denied", "requester_reviews_own"),
    "rejected": ("approve", "reject"),
    "same_id_recorded": ("same_id_same_content", "same_id_other_content", "same_id_other_rationale",
                         "determination_unknown", "same_id_authority_denied", "same_id_other_content_denied",
                         "same_id_out_of_scope", "same_id_requester"),
}


def approval_cases() -> list[Case]:
    decisions = _decisions()
    cases: list[Case] = []
    now = wire.time_text(T0)
    for world, (request, revision, prior) in _worlds().items():
        for label in _ASKED[world] or tuple(decisions):
            rows = {"execution": None, "dispatch": None, "approval_request": request, "request_revision": revision,
                    "prior_decision": prior}
            body = decisions[label]
            expected = wire.approval_outcome(rows, body)
            normative = ["outcome", "code"] if expected["outcome"] == "unchanged" else (
                ["outcome", "code", "field"] if expected["outcome"] == "refusal" else ["outcome", "evidence"])
            cases.append({
                "id": f"decide_approval/{world}/{label}",
                "input": {"decision": "decide_approval", "rows": rows, "request": body, "now": now},
                "expected": expected,
                "normative": normative,
            })
    return cases
