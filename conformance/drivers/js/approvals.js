// A reviewer's decision on an approval request (specs/interpreter.md, Approvals),
// answered for the protocol layer's "decide_approval" cases (specs/conformance.md).
//
// Input rows: approval_request (the stored request body, or null),
// request_revision (its evidence revision) and prior_decision (the stored
// decision with the same identity, or null).  The checks run in the order of
// specs/interpreter.md; the first that fails is the refusal, and nothing is
// written.  Output:
//   { outcome: "accepted", evidence: [decision, request revision] }  -- the first determination
//   { outcome: "recorded", evidence: [decision] }                    -- a later, contradicting one
//   { outcome: "unchanged", code: "already_decided" } | { outcome: "refusal", code, field }

"use strict";

const { refusal, isFreeText } = require("./values");

// A reviewer's determination; a wake by a decision carries one of them too (protocol.js).
const DETERMINATIONS = ["approved", "rejected"];

// JSON with sorted keys, only to compare two values: they are the same when these texts are.
// Not journal.js's canonical(), which makes a record's bytes and refuses what a record may not hold.
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

const binding = (b) => ({ operation: b.operation, targets: b.targets, policies: b.policies });

// What identifies a decision's content: a repeat with the same id must match it exactly.
function content(d) {
  return {
    decision_id: d.decision_id,
    request_id: d.request_id,
    business_id: d.business_id,
    reviewer_id: d.reviewer_id,
    determination: d.determination,
    binding: binding(d.binding),
    rationale: d.rationale === undefined ? "" : d.rationale,
  };
}

function decideApproval(rows, d) {
  const request = rows.approval_request;
  const prior = rows.prior_decision;
  // 1. the determination is one of the two, and the rationale is storable text of at most 2000 characters
  if (!DETERMINATIONS.includes(d.determination)) return refusal("invalid_request", "determination");
  if (!isFreeText(d.rationale === undefined ? "" : d.rationale)) return refusal("invalid_request", "rationale");
  // 2. another Business's request does not exist for this caller
  if (request === null || request.business_id !== d.business_id) return refusal("approval_not_found");
  // 3. current authority, reviewer scope, distinct reviewer: before anything stored answers, so that a
  //    reviewer refused now learns nothing of a decision stored earlier
  if (!d.authority.granted) return refusal("not_authorized");
  if (!request.reviewers.includes(d.reviewer_id)) return refusal("not_authorized");
  if (request.distinct_reviewer && d.reviewer_id === request.requester_id) return refusal("not_authorized");
  // 4. a decision identity is used once
  if (prior !== null) {
    const stored = { ...prior.body };
    delete stored.status;
    if (canonical(stored) === canonical(content(d))) return { outcome: "unchanged", code: "already_decided" };
    return refusal("decision_conflict", "decision_id");
  }
  // 5. the binding is exactly the request's
  if (canonical(binding(d.binding)) !== canonical(binding(request.binding))) return refusal("approval_misbound", "binding");
  // 6. a closed request accepts no determination
  if (request.state === "closed") return refusal("approval_closed");
  const objectId = `${request.request_id}/decision/${d.decision_id}`;
  const decisionEvidence = (status) => ({
    object_id: objectId, kind: "ApprovalDecision", revision: 1, state: status, body: { ...content(d), status },
  });
  // 7. the first determination is recorded, with the request's next revision
  if (request.state === "pending") {
    const decided = {
      request_id: request.request_id, execution_id: request.execution_id, business_id: request.business_id,
      node_id: request.node_id, attempt_id: request.attempt_id, binding: binding(request.binding),
      requester_id: request.requester_id, reviewers: request.reviewers, distinct_reviewer: request.distinct_reviewer,
      state: d.determination, decided_by: d.reviewer_id, decision_id: d.decision_id,
    };
    return {
      outcome: "accepted",
      evidence: [
        decisionEvidence("accepted"),
        { object_id: request.request_id, kind: "ApprovalRequest", revision: rows.request_revision + 1,
          state: d.determination, body: decided },
      ],
    };
  }
  // 8. later: agreeing changes nothing; contradicting is kept in history only
  if (request.state === d.determination) return { outcome: "unchanged", code: "already_decided" };
  return { outcome: "recorded", evidence: [decisionEvidence("rejected_conflict")] };
}

module.exports = { decideApproval, DETERMINATIONS };
