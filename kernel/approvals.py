"""Approval requests and the decisions that resolve them, as pure decisions.

The workflow execution contract (seed 000: Node Semantics, ``request_approval``).
Rules of this module:

- An approval request is bound to one execution, wait registration, exact
  target ids and revisions, proposed operation, Policy ids and revisions,
  requester and permitted reviewer scope.  It exists as a durable evidence
  object; its existence executes nothing.
- A reviewer's decision must carry the *same* binding (Business, request,
  operation, targets and revisions, Policies and revisions).  A misbound or
  stale decision, an unauthorized reviewer, a reviewer outside the scope, or
  the requester approving their own request where distinct reviewers are
  required: each is a :class:`Refusal` that writes nothing and wakes
  nothing.  These are asked before any stored decision answers, so a
  reviewer refused now learns neither whether nor how the request was
  decided.
- The first committed determination wins.  The same decision again (same
  decision id and content) is :class:`Unchanged`; a later decision agreeing
  with the determination is :class:`Unchanged` too; a later decision that
  contradicts it is *recorded* (kept in Decision history as
  ``rejected_conflict``) and changes nothing else.
- A request closed by its declared timeout, or by cancellation, accepts no
  determination.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from .common import shown
from .evidence import Evidence
from .protocol import DETERMINATIONS, Authority, Refusal, RefusalCode, Unchanged, UnchangedCode
from .recovery import MAX_RATIONALE
from .text import problem as text_problem

APPROVAL_REQUEST: str = "ApprovalRequest"
APPROVAL_DECISION: str = "ApprovalDecision"


class ApprovalState(enum.Enum):
    """Where an approval request stands: pending until its first committed determination, then approved or rejected."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CLOSED = "closed"
    """Timed out or cancelled before any determination."""


@attrs.frozen
class Binding:
    """What a decision must name exactly: operation, targets and Policies, each with its revision."""

    operation: str
    targets: tuple[tuple[str, int], ...]
    policies: tuple[tuple[str, int], ...]

    def to_json(self) -> dict[str, Any]:
        """The binding as JSON, as stored with its request and every decision on it."""
        return {
            "operation": self.operation,
            "targets": [list(t) for t in self.targets],
            "policies": [list(p) for p in self.policies],
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Binding:
        """The binding a stored body holds."""
        return cls(
            body["operation"],
            tuple((str(i), int(r)) for i, r in body["targets"]),
            tuple((str(i), int(r)) for i, r in body["policies"]),
        )


@attrs.frozen
class ApprovalRequest:
    """An approval request as a reviewer is shown it: what is to be decided (its binding), by whom, and its state."""

    request_id: str
    execution_id: str
    business_id: str
    node_id: str
    attempt_id: str
    binding: Binding
    requester_id: str
    reviewers: tuple[str, ...]
    distinct_reviewer: bool
    state: ApprovalState = ApprovalState.PENDING
    decided_by: str | None = None
    decision_id: str | None = None

    def evidence(self, revision: int = 1) -> Evidence:
        """The request as an evidence object revision (``revision`` 1 when it is opened)."""
        return Evidence(self.request_id, APPROVAL_REQUEST, self.to_json(), revision, self.state.value)

    def to_json(self) -> dict[str, Any]:
        """The request as the JSON body its evidence object stores."""
        return {
            "request_id": self.request_id,
            "execution_id": self.execution_id,
            "business_id": self.business_id,
            "node_id": self.node_id,
            "attempt_id": self.attempt_id,
            "binding": self.binding.to_json(),
            "requester_id": self.requester_id,
            "reviewers": list(self.reviewers),
            "distinct_reviewer": self.distinct_reviewer,
            "state": self.state.value,
            "decided_by": self.decided_by,
            "decision_id": self.decision_id,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ApprovalRequest:
        """The request a stored evidence body holds."""
        return cls(
            request_id=body["request_id"],
            execution_id=body["execution_id"],
            business_id=body["business_id"],
            node_id=body["node_id"],
            attempt_id=body["attempt_id"],
            binding=Binding.from_json(body["binding"]),
            requester_id=body["requester_id"],
            reviewers=tuple(body["reviewers"]),
            distinct_reviewer=bool(body["distinct_reviewer"]),
            state=ApprovalState(body["state"]),
            decided_by=body.get("decided_by"),
            decision_id=body.get("decision_id"),
        )


@attrs.frozen
class ApprovalDecision:
    """A reviewer's governed Decision command; ``decision_id`` is its stable identity."""

    decision_id: str
    request_id: str
    business_id: str
    reviewer_id: str
    determination: str
    binding: Binding
    authority: Authority
    rationale: str = ""

    def content(self) -> dict[str, Any]:
        """What identifies the decision's content: a repeat with the same id must match it exactly."""
        return {
            "decision_id": self.decision_id,
            "request_id": self.request_id,
            "business_id": self.business_id,
            "reviewer_id": self.reviewer_id,
            "determination": self.determination,
            "binding": self.binding.to_json(),
            "rationale": self.rationale,
        }


def decision_object_id(request_id: str, decision_id: str) -> str:
    """Decision identities are scoped to their request, so two requests never share one."""
    return f"{request_id}/decision/{decision_id}"


@attrs.frozen
class Accepted:
    """The first determination: record it, close the request, and wake the waiter with it."""

    request: ApprovalRequest
    evidence: tuple[Evidence, ...]


@attrs.frozen
class Recorded:
    """A later, contradicting decision: kept in history, changes nothing else."""

    evidence: tuple[Evidence, ...]
    message: str


DecideOutcome = Accepted | Recorded | Refusal | Unchanged


def _refuse(code: RefusalCode, message: str, field: str | None = None) -> Refusal:
    return Refusal(code, message, field)


def decide(
    request: ApprovalRequest | None,
    request_revision: int,
    prior: Evidence | None,
    decision: ApprovalDecision,
) -> DecideOutcome:
    """Resolve ``request`` with ``decision``.  ``prior`` is a stored decision with the same identity, if any."""
    if decision.determination not in DETERMINATIONS:
        return _refuse(
            RefusalCode.INVALID_REQUEST,
            f"determination: must be one of {', '.join(DETERMINATIONS)}, not {shown(decision.determination)}",
            "determination",
        )
    unstorable = text_problem(decision.rationale) if isinstance(decision.rationale, str) else "must be a string"
    if unstorable is None and len(decision.rationale) > MAX_RATIONALE:
        # A recovery's rationale has the same bound: both are reasons people read, not payloads.
        unstorable = f"must be at most {MAX_RATIONALE} characters, got {len(decision.rationale)}"
    if unstorable is not None:
        return _refuse(RefusalCode.INVALID_REQUEST, f"rationale: {unstorable}", "rationale")
    if request is None or request.business_id != decision.business_id:
        # Another Business's request does not exist for this caller.
        return _refuse(RefusalCode.APPROVAL_NOT_FOUND, f"no approval request {decision.request_id!r}")
    # Current authority first (seed 000, Security: current grants and approval scope "are checked at the
    # consequential node boundary"; request_approval: unauthorized or revoked decisions do not wake the
    # execution): a reviewer refused now is answered neither by a decision stored under this identity nor
    # by the request's determination and who made it.
    if not decision.authority.granted:
        return _refuse(
            RefusalCode.NOT_AUTHORIZED,
            f"{decision.reviewer_id!r} is not authorized to decide: {decision.authority.reason or 'denied'}",
        )
    if decision.reviewer_id not in request.reviewers:
        return _refuse(
            RefusalCode.NOT_AUTHORIZED,
            f"{decision.reviewer_id!r} is outside the reviewer scope of {request.request_id!r}",
        )
    if request.distinct_reviewer and decision.reviewer_id == request.requester_id:
        return _refuse(
            RefusalCode.NOT_AUTHORIZED,
            f"{decision.reviewer_id!r} requested this approval and cannot also decide it",
        )
    if prior is not None:
        same = {k: v for k, v in prior.body.items() if k != "status"} == decision.content()
        if same:
            return Unchanged(UnchangedCode.ALREADY_DECIDED, f"decision {decision.decision_id!r} was already recorded")
        return _refuse(
            RefusalCode.DECISION_CONFLICT,
            f"decision {decision.decision_id!r} was already recorded with other content; a decision id is used once",
            "decision_id",
        )
    if decision.binding != request.binding:
        return _refuse(
            RefusalCode.APPROVAL_MISBOUND,
            "the decision is bound to another operation, target or Policy revision than the request "
            f"(request: {request.binding.to_json()})",
            "binding",
        )
    if request.state == ApprovalState.CLOSED:
        return _refuse(RefusalCode.APPROVAL_CLOSED, f"approval request {request.request_id!r} is closed")
    object_id = decision_object_id(request.request_id, decision.decision_id)
    if request.state == ApprovalState.PENDING:
        decided = attrs.evolve(
            request,
            state=ApprovalState(decision.determination),
            decided_by=decision.reviewer_id,
            decision_id=decision.decision_id,
        )
        return Accepted(
            decided,
            (
                Evidence(object_id, APPROVAL_DECISION, {**decision.content(), "status": "accepted"}, 1, "accepted"),
                decided.evidence(request_revision + 1),
            ),
        )
    if request.state.value == decision.determination:
        return Unchanged(
            UnchangedCode.ALREADY_DECIDED,
            f"approval request {request.request_id!r} is already {request.state.value}; nothing to change",
        )
    return Recorded(
        (
            Evidence(
                object_id,
                APPROVAL_DECISION,
                {**decision.content(), "status": "rejected_conflict"},
                1,
                "rejected_conflict",
            ),
        ),
        f"approval request {request.request_id!r} was already {request.state.value} by "
        f"{request.decided_by!r}; the first committed determination wins; this decision is kept in history",
    )


def closed_by_timeout(stored: Evidence | None, reason: str) -> tuple[Evidence, ...]:
    """A pending request its declared timeout ends: closed, so that no later determination is accepted."""
    if stored is None or stored.kind != APPROVAL_REQUEST or stored.state != ApprovalState.PENDING.value:
        return ()
    return (stored.next(ApprovalState.CLOSED.value, {"state": ApprovalState.CLOSED.value, "closed_by": reason}),)


__all__ = [
    "APPROVAL_DECISION",
    "APPROVAL_REQUEST",
    "Accepted",
    "ApprovalDecision",
    "ApprovalRequest",
    "ApprovalState",
    "Binding",
    "DecideOutcome",
    "Recorded",
    "closed_by_timeout",
    "decide",
    "decision_object_id",
]
