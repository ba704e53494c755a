// The governed recovery decisions of specs/protocol.md: the `recover` rows of Decisions
// (quarantine_expired, fail, resume_safe, reconcile_command, resume_suspended), Recovery
// command identity, Safe-resume proof, Where recovered work queues and Leaving suspended;
// specs/conformance.md, `recovery`; seed 000, Recovery and reconciliation extension.
//
// recover(machines, rows, request, now) returns, as protocol.js's decisions do,
//   { outcome: "refusal", code, field }
//   { outcome: "unchanged", code: "recovery_replayed", record }
//   { outcome: "decision", guard, execution, dispatch, registration, lease, closes, recovery, objects }
// Rules this module keeps:
// - It is pure: the store's facts (its evidence, the pinned definition, the settlement
//   submitted) are rows read in the decision's transaction, and nothing is taken from the
//   caller's word but the continuation it names and the reason it gives.  A case without
//   facts is decided on a store holding no evidence and no registered definition.
// - Order is the spec's: the request's fields, then the command identity (replay or
//   conflict, told only to a caller who may see it), then preconditions 1-3, then the
//   checks of the decision's row.
// - The proof is derived, never assumed: no Command unresolved, the pinned definition
//   registered and holding the continuation, the continuation permitted by what the
//   evidence records, and a reason given.  current_node_id and step_count prove nothing
//   (seed 000, Safe-resume proof: "are not proof of safety by themselves").
// - States move only along the tables (machines.js): the execution's and the dispatch
//   row's, and an attempt the resume settles, along specs/machines/attempt.toml.

"use strict";

const { step: tableStep } = require("./machines");
const { readDefinition } = require("./definitions");
const p = require("./protocol");
const v = require("./values");

const KINDS = ["quarantine_expired", "fail", "resume_safe", "reconcile_command", "resume_suspended"];
const REVIEW = ["reconciliation_required", "suspended"];
const RESUMES = ["resume_safe", "resume_suspended"];
// A Command still open: issued and not answered, or answered unknown (interpreter.md, The
// handler contract).  Every other state is an answer that settles it.
const UNRESOLVED_COMMAND = ["issued", "unknown"];
// An attempt is settled when it is terminal in specs/machines/attempt.toml.
const SETTLED_ATTEMPT = ["completed", "failed"];
// An attempt with no Command of its own in one of these states never reached the handler
// (a Command is committed before it is sent), so the resume settles it as not applied.
const INERT_ATTEMPT = { pending: "reject", unknown: "reconcile_not_applied", reconciliation_required: "reconcile_not_applied" };

// --- the request ----------------------------------------------------------------------------

// The fields in the order specs/protocol.md (Recovery requests) lists them.
function checkRequest(r, nowText) {
  v.checkId("command_id", r.command_id);
  if (!KINDS.includes(r.kind)) throw new v.Invalid("kind");
  v.checkId("execution_id", r.execution_id);
  v.checkId("business_id", r.business_id);
  v.checkPositiveInt("expected_revision", r.expected_revision);
  v.checkId("actor_id", r.actor_id);
  p.checkAuthority("authority", r.authority);
  if (r.command_to_reconcile != null) v.checkId("command_to_reconcile", r.command_to_reconcile);
  if (r.next_node_id != null) {
    v.checkId("next_node_id", r.next_node_id);
    // Only a resume enters a node: a continuation named to any other decision is a mistake.
    if (!RESUMES.includes(r.kind)) throw new v.Invalid("next_node_id");
  }
  // Left out, the rationale is empty; given as null it is not a string, and refused.
  v.checkFreeText("rationale", r.rationale === undefined ? "" : r.rationale);
  return v.checkTime("now", nowText);
}

// --- the store's facts ----------------------------------------------------------------------

// The facts as the store passes them; a case without them has none (no evidence, no
// registered definition, nothing submitted).  Evidence of another execution, or a
// definition that is not one, is a row no store could have read for this one: raised,
// never decided on.
function factsOf(rows, execution) {
  const given = rows.facts || {};
  const facts = { evidence: given.evidence || [], submitted: given.submitted || [], definition: null };
  // A registered revision was read strictly when it was registered.
  if (given.definition != null) facts.definition = readDefinition(given.definition);
  for (const e of [...facts.evidence, ...facts.submitted]) {
    const owner = e.body && e.body.execution_id;
    if (execution !== null && owner !== undefined && owner !== execution.execution_id) {
      throw new Error(`evidence ${e.object_id} belongs to execution ${owner}`);
    }
  }
  return facts;
}

const attemptsOf = (evidence) => evidence.filter((e) => e.kind === "StepAttempt");
// An attempt that issued a Command says so (`command_id` in its body), or its Command
// `<attempt>/command` is there to say it.
const hasOwnCommand = (evidence, attempt) => "command_id" in attempt.body
  || evidence.some((e) => e.kind === "Command" && e.object_id === `${attempt.object_id}/command`);
// The newest revision of an object among those given.
const newest = (list, objectId) => list.filter((e) => e.object_id === objectId)
  .reduce((best, e) => (best === null || e.revision > best.revision ? e : best), null);

// no_unresolved_command: no Command open, every local_command attempt settled, and the
// attempts that never reached a handler settled as not applied by the resume itself.
function unresolved(machines, evidence) {
  const settles = [];
  if (evidence.some((e) => e.kind === "Command" && UNRESOLVED_COMMAND.includes(e.state))) return { holds: false, settles };
  for (const attempt of attemptsOf(evidence)) {
    if (SETTLED_ATTEMPT.includes(attempt.state)) continue;
    if (!hasOwnCommand(evidence, attempt) && attempt.state in INERT_ATTEMPT) {
      const target = tableStep(machines.attempt, attempt.state, INERT_ATTEMPT[attempt.state]);
      settles.push({ object_id: attempt.object_id, kind: attempt.kind, revision: attempt.revision + 1, state: target });
      continue;
    }
    if (attempt.body.node_kind === "local_command") return { holds: false, settles };
  }
  return { holds: true, settles };
}

// The continuations the evidence permits at the execution's current node: with no attempt
// there, the node itself; after the last one settled as not applied (failed, or inert and
// settled by this resume), the node or its recorded continuation; after one applied
// (completed), only its recorded continuation.
function permitted(execution, evidence, settles) {
  const node = execution.current_node_id;
  const here = attemptsOf(evidence).filter((a) => a.body.node_id === node);
  if (here.length === 0) return [node];
  const last = here[here.length - 1];
  const settled = settles.find((s) => s.object_id === last.object_id);
  const state = settled ? settled.state : last.state;
  const recorded = last.body.next_node_id == null ? [] : [last.body.next_node_id];
  if (state === "completed") return recorded;
  if (state === "failed") return [node, ...recorded];
  return [];
}

// The safe-resume proof: the record of it, or null when a fact does not hold.
// resume_suspended re-enters the node its visit stopped at, and only that (Leaving suspended).
function prove(machines, execution, facts, r, onlyCurrent) {
  const { holds, settles } = unresolved(machines, facts.evidence);
  // The definition given is the pinned one only if it is the execution's id and revision.
  const d = facts.definition;
  const definition = d !== null && d.id === execution.definition_id && d.revision === execution.definition_revision ? d : null;
  const next = r.next_node_id ?? null;
  const dependencies = definition !== null && next !== null && definition.nodes.has(next);
  const allowed = onlyCurrent ? [execution.current_node_id] : permitted(execution, facts.evidence, settles);
  const approved = next !== null && allowed.includes(next);
  const contract = typeof r.rationale === "string" && r.rationale.trim() !== "";
  if (!holds || !dependencies || !approved || !contract) return null;
  return {
    proof: {
      approved_by: r.authority.principal_id,
      continuation: next,
      continuation_approved: true,
      dependencies_current: true,
      no_unresolved_command: true,
    },
    settles,
  };
}

// reconcile_command: the named Command is the execution's and still open, and the newest
// revision the caller submits of it, and of the attempt its body names, settles each
// conclusively.  Returns { attempt }, the attempt as the store holds it (or null), or null
// when there is nothing to settle.
function settlement(evidence, submitted, commandId) {
  const command = evidence.find((e) => e.kind === "Command" && e.object_id === commandId);
  if (!command || !UNRESOLVED_COMMAND.includes(command.state)) return null;
  const attemptId = String(command.body.attempt_id ?? "");
  const settledCommand = newest(submitted, commandId);
  const settledAttempt = newest(submitted, attemptId);
  if (!settledCommand || UNRESOLVED_COMMAND.includes(settledCommand.state)) return null;
  if (!settledAttempt || !SETTLED_ATTEMPT.includes(settledAttempt.state)) return null;
  return { attempt: newest(evidence, attemptId) };
}

// --- the decision ---------------------------------------------------------------------------

const recordOf = (r, execution, resulting) => ({
  command_id: r.command_id,
  execution_id: r.execution_id,
  expected_revision: r.expected_revision,
  kind: r.kind,
  proof: null,
  resulting_revision: resulting.revision,
  resulting_state: resulting.state,
});

function recover(machines, rows, r, nowText) {
  let now;
  const { refused: bad } = v.validated(() => {
    now = checkRequest(r, nowText);
  });
  if (bad) return bad;
  const { execution, dispatch } = rows;
  const stored = rows.recovery ?? null;
  // A stored result, or that the identity is taken, is told only to a caller who may see it.
  if (stored !== null) {
    if (execution !== null && execution.business_id !== r.business_id) return v.refusal("business_mismatch");
    if (!r.authority.granted) return v.refusal("not_authorized");
    const same = stored.kind === r.kind && stored.execution_id === r.execution_id
      && stored.expected_revision === r.expected_revision;
    // Compared by identity alone, never by its proof; answered as stored, proof included: a repeat
    // "returns its durable result" (seed 000, Expired-lease quarantine; specs/conformance.md, `recovery`).
    return same ? { outcome: "unchanged", code: "recovery_replayed", record: stored }
      : v.refusal("recovery_conflict");
  }
  const pair = p.checkPair(execution, dispatch, r.execution_id);
  if (pair) return pair;
  const facts = factsOf(rows, execution);
  const business = () => p.checkBusiness(execution, r.business_id);
  const revision = () => p.checkRevision(execution, r.expected_revision);
  const authority = () => p.checkAuthorized(r.authority);
  const guard = p.guardOf(execution, dispatch, false);

  if (r.kind === "quarantine_expired") {
    // Seed 000, Expired-lease quarantine, conditions 1-6, then authority; never by the holder.
    if (execution.state !== "running") return v.refusal("execution_not_running");
    if (dispatch.dispatch_state !== "claimed") return v.refusal("dispatch_not_claimed");
    const first = business()
      || (dispatch.lease_expires_at === null || v.timeOf(dispatch.lease_expires_at) > now ? v.refusal("lease_not_expired") : null)
      || revision() || authority();
    if (first) return first;
    if (dispatch.leased_by !== null && r.actor_id === dispatch.leased_by) return v.refusal("worker_cannot_recover");
    const [e, d] = p.move(machines, execution, dispatch, "quarantine_expired", { error_code: "quarantine_expired" });
    return p.decision(guard, e, d, { recovery: recordOf(r, execution, e), objects: [] });
  }

  if (r.kind === "resume_suspended") {
    if (execution.state !== "suspended" || dispatch.dispatch_state !== "suspended") return v.refusal("not_suspended");
  } else {
    const states = r.kind === "fail" ? REVIEW : ["reconciliation_required"];
    if (!states.includes(execution.state) || dispatch.dispatch_state !== execution.state) {
      return v.refusal("not_in_reconciliation");
    }
  }
  const first = business() || revision() || authority();
  if (first) return first;

  if (r.kind === "fail") {
    const [e, d] = p.move(machines, execution, dispatch, "fail", { error_code: "fail" });
    return p.decision(guard, e, d, { recovery: recordOf(r, execution, e), objects: [] });
  }

  if (r.kind === "reconcile_command") {
    const settled = r.command_to_reconcile == null ? null
      : settlement(facts.evidence, facts.submitted, r.command_to_reconcile);
    if (settled === null) return v.refusal("no_unresolved_command", "command_to_reconcile");
    // A quarantined visit was never counted by its worker; the settlement counts it, within the bound.
    const attempt = settled.attempt;
    const quarantined = attempt !== null && (attempt.state === "reconciliation_required" || attempt.state === "running");
    const steps = execution.step_count + (quarantined && execution.step_count < p.STEP_LIMIT ? 1 : 0);
    const e = { ...execution, revision: execution.revision + 1, step_count: steps };
    const d = { ...dispatch, step_count: steps };
    return p.decision(guard, e, d, { recovery: recordOf(r, execution, e), objects: [] });
  }

  // resume_safe, resume_suspended: the proof, then eligible where the operator named.
  if (r.kind === "resume_suspended" && dispatch.last_error_code === "step_limit") {
    // A later pass "must not ... reset the step counter": it would suspend again at once.
    return v.refusal("unsafe_resume", "kind");
  }
  const proven = prove(machines, execution, facts, r, r.kind === "resume_suspended");
  if (proven === null) return v.refusal("unsafe_resume", "next_node_id");
  const eligible = v.timeOf(dispatch.eligible_at);
  const [e, d] = p.move(machines, execution, dispatch, r.kind, {
    node_id: proven.proof.continuation,
    eligible_at: v.timeText(eligible < now ? eligible : now),
  });
  return p.decision(guard, e, d, { recovery: { ...recordOf(r, execution, e), proof: proven.proof }, objects: proven.settles });
}

module.exports = { recover };
