// The lease and fencing decisions of specs/protocol.md, as pure functions.
//
// Each decision takes the rows as a store read them, the request and `now`,
// and returns one of three results (specs/protocol.md, "Shape of a decision"):
//   { outcome: "refusal", code, field }      -- nothing is written
//   { outcome: "unchanged", code }           -- an idempotent repeat
//   { outcome: "decision", guard, execution, dispatch, registration, lease, closes }
// Checks run in the order the spec's tables list them; the first that fails
// names the refusal.  Malformed input is refused first, naming the field.
// States change only through the machine tables (machines.js).  The governed `recover`
// decisions are recovery.js's, which builds on the helpers this module exports.
//
// The wire's values (times as BigInt microseconds, identifiers, text) are read by values.js,
// which also turns a malformed field into the invalid_request refusal naming it.

"use strict";

const { decideApproval, DETERMINATIONS } = require("./approvals");
const { step: tableStep } = require("./machines");
const {
  isRecord, byCodePoint, isStorableText, timeOf, timeText,
  Invalid, refusal, validated, checkId, checkPositiveInt, checkDuration, checkBool, checkTime, later,
  checkFreeText,
} = require("./values");

// The most steps one dispatcher pass takes (seed 000, Persistence: "the 100-step bound");
// recovery.js and interpreter.js count against the same bound.
const STEP_LIMIT = 100;
const FINALIZE_TARGETS = ["waiting", "succeeded", "failed", "suspended", "reconciliation_required"];
const STATES = ["eligible", "running", "waiting", "succeeded", "failed", "cancelled", "suspended",
  "reconciliation_required"];
const WAKE_REASONS = ["event", "decision", "timer", "timeout"];
const WAKE_OUTCOMES = ["approved", "event", "rejected", "timeout", "timer"];

// --- the request's values ---------------------------------------------------------------

// The Authority fact (specs/protocol.md): `granted` and a `principal_id`; an Operation's authority
// (operations.js) names a `principal`, and is another rule.
function checkAuthority(field, value) {
  if (!isRecord(value)) throw new Invalid(field);
  checkBool(`${field}.granted`, value.granted);
  checkId(`${field}.principal_id`, value.principal_id);
}

// A lease credential: the worker, its lease token and the fence.  An Operation owner's credential
// (operations.js) is another rule, naming its Operation and no token.
function checkCredential(value) {
  if (!isRecord(value)) throw new Invalid("credential");
  checkId("credential.worker_id", value.worker_id);
  checkId("credential.lease_token", value.lease_token);
  checkPositiveInt("credential.fence", value.fence);
}

function checkStep(field, value) {
  if (!isRecord(value)) throw new Invalid(field);
  checkId(`${field}.node_id`, value.node_id);
  checkId(`${field}.attempt_id`, value.attempt_id);
  if (value.next_node_id !== null && value.next_node_id !== undefined) checkId(`${field}.next_node_id`, value.next_node_id);
}

function isPairs(value) {
  return Array.isArray(value) && value.every((p) => Array.isArray(p) && p.length === 2);
}

function sortedUnique(names) {
  for (let i = 1; i < names.length; i++) if (byCodePoint(names[i - 1], names[i]) >= 0) return false;
  return true;
}

function checkCorrelation(field, value) {
  if (!isPairs(value) || !value.every((p) => typeof p[0] === "string" && typeof p[1] === "string")) {
    throw new Invalid(field);
  }
  if (!sortedUnique(value.map((p) => p[0]))) throw new Invalid(field);
  for (const [name, text] of value) {
    checkId(`${field}['${name}']`, name);
    if (!isStorableText(text)) throw new Invalid(`${field}['${name}']`);
  }
}

function checkWaitSpec(field, value) {
  if (!isRecord(value)) throw new Invalid(field);
  checkId(`${field}.node_id`, value.node_id);
  checkId(`${field}.attempt_id`, value.attempt_id);
  if (value.event_type !== null && value.event_type !== undefined) checkId(`${field}.event_type`, value.event_type);
  checkCorrelation(`${field}.correlation`, value.correlation ?? []);
  const hasAt = value.wake_at !== null && value.wake_at !== undefined;
  const hasAfter = value.wake_after !== null && value.wake_after !== undefined;
  if (hasAt) checkTime(`${field}.wake_at`, value.wake_at);
  if (hasAfter) {
    checkDuration(`${field}.wake_after`, value.wake_after);
    if (hasAt) throw new Invalid(`${field}.wake_after`);
  }
  const timed = hasAt || hasAfter;
  const hasEvent = value.event_type !== null && value.event_type !== undefined;
  if (!hasEvent && !timed) throw new Invalid(field);
  if (value.timeout && !timed) throw new Invalid(`${field}.timeout`);
  const pairs = value.continuations ?? [];
  if (!isPairs(pairs) || !pairs.every((p) => WAKE_OUTCOMES.includes(p[0]))) throw new Invalid(`${field}.continuations`);
  if (!sortedUnique(pairs.map((p) => p[0]))) throw new Invalid(`${field}.continuations`);
  for (const [outcome, node] of pairs) checkId(`${field}.continuations[${outcome}]`, node);
}

// --- rows -------------------------------------------------------------------------------

const dispatchStateOf = (state) => (state === "running" ? "claimed" : state);

function guardOf(execution, dispatch, live) {
  return {
    execution_id: execution.execution_id,
    expected_revision: execution.revision,
    expected_state: execution.state,
    expected_dispatch_state: dispatch.dispatch_state,
    expected_lease_token: dispatch.lease_token,
    expected_lease_expires_at: dispatch.lease_expires_at,
    expected_fence: execution.fence,
    requires_live_lease: live,
  };
}

// Both rows after `event`: the tables decide the states; every move is one new revision.
function move(machines, execution, dispatch, event, opts) {
  const state = tableStep(machines.execution, execution.state, event);
  const dispatchState = tableStep(machines.dispatch, dispatch.dispatch_state, event);
  if (state === null || dispatchState !== dispatchStateOf(state)) {
    throw new Error(`tables disagree on ${event} from ${execution.state}`);
  }
  const steps = execution.step_count + (opts.step ? 1 : 0);
  let node = execution.current_node_id;
  if (opts.node_id) node = opts.node_id;
  else if (opts.step) node = opts.step.next_node_id || opts.step.node_id;
  const keep = Boolean(opts.keepLease) && dispatchState === "claimed";
  let lastError = dispatch.last_error_code;
  if (opts.error_code) lastError = opts.error_code;
  else if (state === "succeeded") lastError = null;
  return [
    {
      ...execution,
      state,
      revision: execution.revision + 1,
      step_count: steps,
      current_node_id: node,
      wait: opts.wait ?? null,
      fence: opts.fence ?? execution.fence,
    },
    {
      ...dispatch,
      dispatch_state: dispatchState,
      eligible_at: opts.eligible_at ?? dispatch.eligible_at,
      lease_token: keep ? dispatch.lease_token : null,
      leased_by: keep ? dispatch.leased_by : null,
      lease_expires_at: keep ? dispatch.lease_expires_at : null,
      step_count: steps,
      last_error_code: lastError,
    },
  ];
}

function decision(guard, execution, dispatch, extra = {}) {
  return { outcome: "decision", guard, execution, dispatch, registration: null, lease: null, closes: null, ...extra };
}

// Finalization preconditions 1-3 (specs/protocol.md, "the twelve preconditions").
function checkPair(execution, dispatch, executionId) {
  if (execution === null) return refusal("execution_not_found");
  if (dispatch === null) return refusal("dispatch_not_found");
  if (execution.execution_id !== executionId || dispatch.workflow_execution_id !== execution.execution_id) {
    return refusal("identity_mismatch");
  }
  return null;
}

// Preconditions 4-8 and the fence.
function checkLease(execution, dispatch, credential, now) {
  if (dispatch.dispatch_state !== "claimed") return refusal("dispatch_not_claimed");
  if (execution.state !== "running") return refusal("execution_not_running");
  if (dispatch.lease_token !== credential.lease_token) return refusal("lease_token_mismatch");
  if (dispatch.leased_by !== credential.worker_id) return refusal("worker_mismatch");
  if (dispatch.lease_expires_at === null || now >= timeOf(dispatch.lease_expires_at)) return refusal("lease_expired");
  if (credential.fence !== execution.fence) return refusal("stale_fence");
  return null;
}

function checkHeld(execution, dispatch, credential, now) {
  const id = execution === null ? "?" : execution.execution_id;
  return checkPair(execution, dispatch, id) || checkLease(execution, dispatch, credential, now);
}

const checkBusiness = (execution, business) => (execution.business_id !== business ? refusal("business_mismatch") : null);
const checkRevision = (execution, expected) => (execution.revision !== expected ? refusal("stale_revision") : null);
const checkAuthorized = (authority) => (authority.granted ? null : refusal("not_authorized"));

// --- decisions ----------------------------------------------------------------------------

function admit(m, rows, r, nowText) {
  let now;
  const { refused: bad } = validated(() => {
    checkId("execution_id", r.execution_id);
    checkId("business_id", r.business_id);
    checkId("definition_id", r.definition_id);
    checkPositiveInt("definition_revision", r.definition_revision);
    checkId("start_node_id", r.start_node_id);
    checkAuthority("authority", r.authority);
    now = checkTime("now", nowText);
  });
  if (bad) return bad;
  if (rows.execution !== null || rows.id_taken) return refusal("already_exists");
  const denied = checkAuthorized(r.authority);
  if (denied) return denied;
  const execution = {
    execution_id: r.execution_id, business_id: r.business_id, state: "eligible", revision: 1,
    definition_id: r.definition_id, definition_revision: r.definition_revision, current_node_id: r.start_node_id,
    step_count: 0, fence: 0, wait: null,
  };
  const dispatch = {
    workflow_execution_id: r.execution_id, dispatch_state: "eligible", eligible_at: timeText(now), lease_token: null,
    leased_by: null, lease_expires_at: null, step_count: 0, last_error_code: null,
  };
  const guard = {
    execution_id: r.execution_id, expected_revision: 0, expected_state: null, expected_dispatch_state: null,
    expected_lease_token: null, expected_lease_expires_at: null, expected_fence: 0, requires_live_lease: false,
  };
  return decision(guard, execution, dispatch);
}

function claim(m, { execution, dispatch }, r, nowText) {
  let now, expires;
  const { refused: bad } = validated(() => {
    checkId("worker_id", r.worker_id);
    checkId("lease_token", r.lease_token);
    const duration = checkDuration("lease_duration", r.lease_duration);
    now = checkTime("now", nowText);
    expires = later("lease_duration", now, duration);
  });
  if (bad) return bad;
  const pair = checkPair(execution, dispatch, execution === null ? "?" : execution.execution_id);
  if (pair) return pair;
  if (execution.state !== "eligible" || dispatch.dispatch_state !== "eligible") return refusal("not_eligible");
  if (now < timeOf(dispatch.eligible_at)) return refusal("not_eligible");
  const fence = execution.fence + 1;
  const [e, d] = move(m, execution, dispatch, "claim", { fence });
  d.lease_token = r.lease_token;
  d.leased_by = r.worker_id;
  d.lease_expires_at = timeText(expires);
  return decision(guardOf(execution, dispatch, false), e, d, {
    lease: { worker_id: r.worker_id, lease_token: r.lease_token, fence },
  });
}

function renew(m, { execution, dispatch }, r, nowText) {
  let now, expires;
  const { refused: bad } = validated(() => {
    checkCredential(r.credential);
    const duration = checkDuration("lease_duration", r.lease_duration);
    now = checkTime("now", nowText);
    expires = later("lease_duration", now, duration);
  });
  if (bad) return bad;
  const held = checkHeld(execution, dispatch, r.credential, now);
  if (held) return held;
  // Renewal writes the dispatch row only: lease metadata is not the execution object.
  return decision(guardOf(execution, dispatch, true), null, { ...dispatch, lease_expires_at: timeText(expires) });
}

function recordStep(m, { execution, dispatch }, r, nowText) {
  let now;
  const { refused: bad } = validated(() => {
    checkCredential(r.credential);
    checkPositiveInt("expected_revision", r.expected_revision);
    checkStep("step", r.step);
    checkAuthority("authority", r.authority);
    now = checkTime("now", nowText);
  });
  if (bad) return bad;
  const first = checkHeld(execution, dispatch, r.credential, now)
    || checkRevision(execution, r.expected_revision) || checkAuthorized(r.authority);
  if (first) return first;
  if (execution.step_count >= STEP_LIMIT) return refusal("step_limit_reached");
  const [e, d] = move(m, execution, dispatch, "record_step", { keepLease: true, step: r.step });
  return decision(guardOf(execution, dispatch, true), e, d);
}

function release(m, { execution, dispatch }, r, nowText) {
  let now;
  const { refused: bad } = validated(() => {
    checkCredential(r.credential);
    checkPositiveInt("expected_revision", r.expected_revision);
    now = checkTime("now", nowText);
  });
  if (bad) return bad;
  const first = checkHeld(execution, dispatch, r.credential, now) || checkRevision(execution, r.expected_revision);
  if (first) return first;
  const [e, d] = move(m, execution, dispatch, "release", { eligible_at: timeText(now) });
  return decision(guardOf(execution, dispatch, true), e, d);
}

// The decision a store applies when it appends evidence under a lease: the request is the credential
// alone.  Evidence changes no row, so a live lease is decided with no row written and the guard of a
// renewal, which asks the store to recheck expiry at commit.
function fenced(m, { execution, dispatch }, r, nowText) {
  let now;
  const { refused: bad } = validated(() => {
    checkCredential(r.credential);
    now = checkTime("now", nowText);
  });
  if (bad) return bad;
  const held = checkHeld(execution, dispatch, r.credential, now);
  if (held) return held;
  return decision(guardOf(execution, dispatch, true), null, null);
}

function finalize(m, { execution, dispatch }, r, nowText) {
  let now;
  const { refused: bad } = validated(() => {
    checkId("execution_id", r.execution_id);
    checkId("dispatch_id", r.dispatch_id);
    checkId("worker_id", r.worker_id);
    checkId("lease_token", r.lease_token);
    checkPositiveInt("fence", r.fence);
    if (!STATES.includes(r.target_state)) throw new Invalid("target_state");
    checkId("business_id", r.business_id);
    checkPositiveInt("expected_revision", r.expected_revision);
    checkAuthority("authority", r.authority);
    if (r.step != null) checkStep("step", r.step);
    if (r.wait != null) checkWaitSpec("wait", r.wait);
    if (r.error_code != null) checkId("error_code", r.error_code);
    checkFreeText("reason", r.reason ?? "");
    now = checkTime("now", nowText);
  });
  if (bad) return bad;
  let first = checkPair(execution, dispatch, r.execution_id);
  if (!first && r.dispatch_id !== dispatch.workflow_execution_id) first = refusal("identity_mismatch");
  if (first) return first;
  const credential = { worker_id: r.worker_id, lease_token: r.lease_token, fence: r.fence };
  first = checkLease(execution, dispatch, credential, now) || checkBusiness(execution, r.business_id)
    || checkRevision(execution, r.expected_revision) || checkAuthorized(r.authority);
  if (first) return first;
  const target = r.target_state;
  if (!FINALIZE_TARGETS.includes(target)) return refusal("target_not_permitted");
  const wait = r.wait ?? null;
  if ((target === "waiting") !== (wait !== null)) return refusal("wait_registration_required", "wait");
  const step = r.step ?? null;
  if (step !== null && execution.step_count >= STEP_LIMIT) return refusal("step_limit_reached");
  const key = wait === null ? null
    : { execution_id: execution.execution_id, node_id: wait.node_id, attempt_id: wait.attempt_id };
  const [e, d] = move(m, execution, dispatch, `finalize_${target}`, {
    step, wait: key, error_code: r.error_code ?? null,
  });
  let registration = null;
  if (wait !== null) {
    let wakeAt = wait.wake_at ?? null;
    if (wait.wake_after != null) {
      const { refused: bad2 } = validated(() => { wakeAt = timeText(later("wait.wake_after", now, BigInt(wait.wake_after))); });
      if (bad2) return bad2;
    }
    registration = {
      key,
      business_id: execution.business_id,
      spec: {
        node_id: wait.node_id, attempt_id: wait.attempt_id, event_type: wait.event_type ?? null,
        correlation: wait.correlation ?? [], wake_at: wakeAt, timeout: Boolean(wait.timeout), wake_after: null,
        continuations: wait.continuations ?? [],
      },
      woken_by: null, wake_reason: null, closed_by: null,
    };
  }
  return decision(guardOf(execution, dispatch, true), e, d, { registration });
}

const sameKey = (a, b) => a !== null && b !== null && a.execution_id === b.execution_id
  && a.node_id === b.node_id && a.attempt_id === b.attempt_id;
const samePairs = (a, b) => a.length === b.length && a.every((p, i) => p[0] === b[i][0] && p[1] === b[i][1]);

function wake(m, { execution, dispatch, registration }, r, nowText) {
  let now;
  const { refused: bad } = validated(() => {
    if (!isRecord(r.key)) throw new Invalid("key");
    checkId("key.execution_id", r.key.execution_id);
    checkId("key.node_id", r.key.node_id);
    checkId("key.attempt_id", r.key.attempt_id);
    if (!WAKE_REASONS.includes(r.reason)) throw new Invalid("reason");
    checkId("source_id", r.source_id);
    checkId("business_id", r.business_id);
    checkAuthority("authority", r.authority);
    if (r.event_type != null) checkId("event_type", r.event_type);
    checkCorrelation("correlation", r.correlation ?? []);
    if (r.outcome != null && (r.reason !== "decision" || !DETERMINATIONS.includes(r.outcome))) {
      throw new Invalid("outcome");
    }
    now = checkTime("now", nowText);
  });
  if (bad) return bad;
  // Only the registration the wake names answers for it: another attempt's never wakes, nor counts as a repeat.
  const named = Boolean(registration) && sameKey(registration.key, r.key);
  if (named && registration.woken_by !== null) {
    // Who woke the waiter is told only to a caller who may know it.
    if (registration.business_id !== r.business_id) return refusal("business_mismatch");
    return checkAuthorized(r.authority) || { outcome: "unchanged", code: "already_woken" };
  }
  const pair = checkPair(execution, dispatch, r.key.execution_id);
  if (pair) return pair;
  const open = registration && registration.woken_by === null && registration.closed_by === null;
  if (execution.state !== "waiting" || dispatch.dispatch_state !== "waiting" || !sameKey(execution.wait, r.key)
    || !named || !open) {
    return refusal("not_waiting");
  }
  const first = checkBusiness(execution, r.business_id) || checkAuthorized(r.authority);
  if (first) return first;
  const spec = registration.spec;
  if (r.reason === "event" || r.reason === "decision") {
    if (spec.event_type === null || r.event_type !== spec.event_type || !samePairs(r.correlation ?? [], spec.correlation)) {
      return refusal("wake_mismatch");
    }
  } else {
    if (spec.wake_at === null || spec.timeout !== (r.reason === "timeout")) return refusal("wake_mismatch");
    if (now < timeOf(spec.wake_at)) return refusal("wake_not_due");
  }
  const outcome = r.reason === "decision" ? r.outcome : r.reason;
  const found = spec.continuations.find((p) => p[0] === outcome);
  const [e, d] = move(m, execution, dispatch, "wake", {
    eligible_at: timeText(now), node_id: found ? found[1] : null,
  });
  return decision(guardOf(execution, dispatch, false), e, d, {
    registration: { ...registration, woken_by: r.source_id, wake_reason: r.reason },
  });
}

function cancel(m, { execution, dispatch }, r, nowText) {
  const { refused: bad } = validated(() => {
    checkId("execution_id", r.execution_id);
    checkId("business_id", r.business_id);
    checkPositiveInt("expected_revision", r.expected_revision);
    checkAuthority("authority", r.authority);
    checkTime("now", nowText);
  });
  if (bad) return bad;
  const first = checkPair(execution, dispatch, r.execution_id) || checkBusiness(execution, r.business_id)
    || checkRevision(execution, r.expected_revision) || checkAuthorized(r.authority);
  if (first) return first;
  if (execution.state === "running") return refusal("cancel_running");
  const allowed = tableStep(m.execution, execution.state, "cancel") !== null
    && tableStep(m.dispatch, dispatch.dispatch_state, "cancel") !== null
    && dispatch.dispatch_state === dispatchStateOf(execution.state);
  if (!allowed) return refusal("illegal_transition");
  const [e, d] = move(m, execution, dispatch, "cancel", {});
  // Leaving waiting other than by a wake closes the registration it waited on.
  const closes = execution.state === "waiting" && execution.wait !== null ? { key: execution.wait, by: "cancel" } : null;
  return decision(guardOf(execution, dispatch, false), e, d, { closes });
}

const DECISIONS = { admit, claim, renew, record_step: recordStep, release, fenced, finalize, wake, cancel };

function decide(machines, input) {
  if (input.decision === "decide_approval") return decideApproval(input.rows, input.request);
  // Required here, not above: recovery.js builds on this module's helpers.
  if (input.decision === "recover") return require("./recovery").recover(machines, { recovery: null, ...input.rows }, input.request, input.now);
  const fn = DECISIONS[input.decision];
  if (!fn) return null;
  const rows = { registration: null, ...input.rows };
  // Requests in the cases carry every field; a missing optional one reads as null.
  return fn(machines, rows, input.request, input.now);
}

module.exports = {
  decide,
  STEP_LIMIT,
  // What recovery.js shares: the authority's check, the rows' checks, a move and its guard.
  checkAuthority, checkPair, checkBusiness, checkRevision, checkAuthorized, guardOf, move, decision,
};
