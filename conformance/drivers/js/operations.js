// The durable-operation decisions of specs/operations.md, as pure functions.
//
// Each decision takes the Operation as a store read it (or null), the request
// and `now`, and returns one of three results (specs/operations.md, "Shape of
// a decision"; the wire form is specs/conformance.md, `operations`):
//   { outcome: "refusal", code, field }         -- nothing is written
//   { outcome: "unchanged", code, operation }   -- an idempotent repeat: the stored Operation
//   { outcome: "decision", guard, operation, attempts, outbox, credential }
// The rules it follows, by section of specs/operations.md:
//   - "Well-formed requests": every field is checked first, in the table's
//     order, and the first malformed one is `invalid_request` naming it,
//     before the Operation is looked at or any authority is read.
//   - "Decisions" (the table) and "Owner checks": then the preconditions in
//     the order the table gives; the first that fails names the refusal.
//   - "An authority answers for one principal": an authority for anybody
//     else (under any version of the same resolver is the same principal)
//     is refused before its `granted` is read.
//   - "What each decision writes": the Operation's next revision, the Attempt
//     rows, one outbox message ("Outbox") and the guard, field by field.
//   - "The overall deadline and effects" and "Endings with a call
//     unanswered": no effect begins from the deadline on, and an issued,
//     unanswered call of an external effect is never ended as anything but
//     a success, a cancellation or `external_outcome_unknown`.
// States change only through the `operation` machine (specs/machines/operation.toml,
// read by machines.js): a decision names its event and asks the table where it leads.
//
// The wire's values (times as BigInt microseconds, since the cases test the last
// microsecond of a lease; identifiers; text) are read by values.js, as in protocol.js.

"use strict";

const { step: tableStep } = require("./machines");
const {
  isRecord, isStorableText, parseTime, timeOf, timeText,
  Invalid, refusal, validated, checkId, checkPositiveInt, checkDuration, checkBool, checkTime, later, checkFreeText,
} = require("./values");

const EFFECT_CLASSES = ["atomic", "read_only", "external"];
const TERMINAL = ["succeeded", "failed", "cancelled", "outcome_unknown"];
// An input's digest: bare hex ("Values"), not a journal record's `sha256:` form (journal.js).
const INPUT_DIGEST = /^[0-9a-f]{64}$/;
// The longest pause a retry policy gives, in seconds ("Values", Retry policy).
const MAX_PAUSE_SECONDS = 1e9;
// What a submission that leaves them out gets ("Well-formed requests", omitted fields):
// durations in microseconds.
const DEFAULT_POLICY = {
  initial_interval: 1000000,
  backoff_coefficient: 2.0,
  maximum_interval: 300000000,
  maximum_attempts: 5,
  schedule_to_close: 3600000000,
};
const DEFAULT_RETENTION = 86400000000;

// --- values ---------------------------------------------------------------------------

const given = (value) => value !== null && value !== undefined;

function checkDigest(field, value) {
  if (typeof value !== "string" || !INPUT_DIGEST.test(value)) throw new Invalid(field);
}

// An omitted flag is false ("Well-formed requests", omitted fields).
function checkFlag(field, value) {
  if (value === undefined) return false;
  checkBool(field, value);
  return value;
}

const checkNow = (value) => checkTime("now", value);

// A lease asked for from `now` (claim, heartbeat): a duration, then `now`, then that the lease
// ends by the last representable time.
function checkLease(r, nowText) {
  const lease = checkDuration("lease_duration", r.lease_duration);
  const now = checkNow(nowText);
  later("lease_duration", now, lease);
  return { now, lease };
}

// An authority names its `principal` ("An authority answers for one principal"); a workflow's
// Authority fact (protocol.js) names a `principal_id`, and is its own rule.
function checkAuthority(value) {
  if (!isRecord(value)) throw new Invalid("authority");
  checkBool("authority.granted", value.granted);
  checkId("authority.principal", value.principal);
}

// An owner's credential ("Owner checks"): its Operation, worker and fence.  A workflow lease's
// credential (protocol.js) is another: a lease token where this has the Operation.
function checkCredential(value) {
  if (!isRecord(value)) throw new Invalid("credential");
  checkId("credential.operation_id", value.operation_id);
  checkId("credential.worker_id", value.worker_id);
  checkPositiveInt("credential.fence", value.fence);
}

// Free text (omitted, it is empty), with the bound of a recovery's rationale ("Decisions", `cancel`).
function checkText(field, value) {
  if (value !== undefined) checkFreeText(field, value);
}

// How deeply a result may nest, each array or object a level ("Well-formed requests").
const MAX_RESULT_DEPTH = 32;

// A JSON string (its escapes included) or a bracket: the depth is counted from these, strings skipped.
const RESULT_TOKEN = /"[^"\\]*(?:\\[\s\S][^"\\]*)*"|[[\]{}]/g;

// Whether JSON text nests deeper than MAX_RESULT_DEPTH, counted by a scan rather than by parsing, so
// that no parser's own limit (each language has its own) decides.
function nestsTooDeeply(text) {
  let depth = 0;
  for (const [token] of text.matchAll(RESULT_TOKEN)) {
    if (token === "[" || token === "{") {
      depth += 1;
      if (depth > MAX_RESULT_DEPTH) return true;
    } else if (token === "]" || token === "}") {
      depth -= 1;
    }
  }
  return false;
}

// A result is JSON text a store can keep and read back: the text itself has no NUL and no lone
// surrogate, it nests at most 32 levels, and it parses as JSON (so `NaN` and `Infinity`, which JSON
// does not have, are refused). It is kept as written: an escape inside a string (`\u0000`) is JSON,
// and so is a numeral of any size (`1e400`), so what JSON.parse would make of the value is never asked.
function checkResult(value) {
  if (!isStorableText(value) || nestsTooDeeply(value)) throw new Invalid("result");
  try {
    JSON.parse(value);
  } catch (err) {
    throw new Invalid("result");
  }
}

// --- principals -------------------------------------------------------------------------

// The stable form of `resolver:vVERSION:subject` is `resolver:v*:subject` ("Values", Identity
// key): identities are found by it and self-approval compares it, so a resolver's new version
// is a new way to look up the same people.  The resolver is the text before the first colon,
// VERSION one or more ASCII digits, the subject all the rest (colons included, never empty);
// a reference of any other shape is its own.
const REFERENCE = /^([^:]*):v[0-9]+:([\s\S]+)$/;

function stablePrincipal(reference) {
  const m = REFERENCE.exec(reference);
  return m ? `${m[1]}:v*:${m[2]}` : reference;
}

const samePrincipal = (a, b) => stablePrincipal(a) === stablePrincipal(b);

// An authority answers for one principal ("An authority answers for one principal"): one for
// anybody else authorizes nothing, and is refused before its `granted` is read, the field saying
// which of the two it was.
function authorityRefusal(authority, principal) {
  if (!samePrincipal(authority.principal, principal)) return refusal("not_authorized", "authority.principal");
  return authority.granted ? null : refusal("not_authorized");
}

// --- retry ------------------------------------------------------------------------------

// Rounds a non-negative double to the nearest integer, ties to even.
function roundHalfEven(x) {
  const floor = Math.floor(x);
  const rest = x - floor;
  if (rest > 0.5) return floor + 1;
  if (rest < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

// Bits kept while a power is multiplied out: far more than a double's 53, so that rounding the
// result once is rounding the exact power.
const POWER_BITS = 200n;

const bitLength = (n) => BigInt(n.toString(2).length);

// `base ** k` as the double nearest the exact power ("Values", Retry policy).  JavaScript's `**`
// may be a unit in the last place off, which a pause of days shows as a microsecond; so the
// power is multiplied out in integers, each product cut to POWER_BITS bits (remembering whether
// anything was cut), and rounded once, ties to even.  A power past 2^70 makes every pause the
// bound of 10^9 seconds, whatever its last bits, so the estimate is enough there.
function power(base, k) {
  const estimate = base ** k;
  if (k === 0 || base === 1 || !(estimate < 2 ** 70)) return estimate;
  // base = mantissa * 2^exponent exactly: a double is a 53-bit integer scaled by a power of two.
  let exponent = Math.floor(Math.log2(base)) - 52;
  let mantissa = BigInt(base / 2 ** exponent);
  while (mantissa % 2n === 0n) {
    mantissa /= 2n;
    exponent += 1;
  }
  let m = 1n, e = 0n, cut = false;
  let sm = mantissa, se = BigInt(exponent);
  const keep = (x, xe) => {
    const extra = bitLength(x) - POWER_BITS;
    if (extra <= 0n) return [x, xe];
    if (x & ((1n << extra) - 1n)) cut = true;
    return [x >> extra, xe + extra];
  };
  for (let rest = k; rest > 0; rest = Math.floor(rest / 2)) {
    if (rest % 2 === 1) [m, e] = keep(m * sm, e + se);
    if (rest > 1) [sm, se] = keep(sm * sm, se + se);
  }
  const extra = bitLength(m) - 53n;
  if (extra <= 0n) return Number(m) * 2 ** Number(e);
  let q = m >> extra;
  const rest = m & ((1n << extra) - 1n);
  const half = 1n << (extra - 1n);
  // What was cut is below the kept bits, so an exact half with a cut is more than half.
  if (rest > half || (rest === half && (cut || q % 2n === 1n))) q += 1n;
  return Number(q) * 2 ** Number(e + extra);
}

// The pause after the n-th failed Attempt ("Values", Retry policy): in seconds as IEEE doubles,
// at most 10^9 seconds (an overflowing power is that bound too), rounded to the nearest
// microsecond, ties to even, then capped by maximum_interval.  The whole seconds are exact and
// only the fraction is rounded, so a pause of 10^9 seconds keeps every microsecond.
function backoff(policy, n) {
  const seconds = Math.min((policy.initial_interval / 1e6) * power(policy.backoff_coefficient, Math.max(0, n - 1)),
    MAX_PAUSE_SECONDS);
  const whole = Math.trunc(seconds);
  const micros = BigInt(whole) * 1000000n + BigInt(roundHalfEven((seconds - whole) * 1e6));
  const cap = BigInt(policy.maximum_interval);
  return micros < cap ? micros : cap;
}

// --- writes -----------------------------------------------------------------------------

const isTerminal = (op) => TERMINAL.includes(op.state);
const unsettled = (op) => op.effect_class === "external" && given(op.effect_unsettled_since);

// The Operation after `event`: the machine decides the state, every write is one revision
// higher, and an Operation that leaves `running` has no owner, lease or Attempt start.
function move(machines, op, event, fields = {}) {
  const state = tableStep(machines.operation, op.state, event);
  if (state === null) throw new Error(`the operation machine has no ${event} from ${op.state}`);
  const next = { ...op, ...fields, state, revision: op.revision + 1 };
  if (state !== "running") {
    next.owner = null;
    next.lease_expires_at = null;
    next.attempt_started_at = null;
  }
  return next;
}

// One outbox message per Decision, numbered by the revision it made ("Outbox").
function outboxOf(op, nowText) {
  return [{
    message_id: `${op.operation_id}/${op.revision}`,
    operation_id: op.operation_id,
    topic: `operation.${op.state}`,
    at: nowText,
  }];
}

// The current Attempt ended in `state` with `code` ("What each decision writes": ended S, C).
function ended(op, state, code, nowText) {
  return {
    operation_id: op.operation_id,
    number: op.fence,
    worker_id: op.owner,
    state,
    started_at: op.attempt_started_at,
    ended_at: nowText,
    error_code: code,
  };
}

// The guard names the row as it was read (its id, revision and fence), so a decision made on an
// earlier revision, or by an older fence, fails at commit; `live_until` only for an owner's write.
function guardOf(op, liveUntil = null) {
  return {
    operation_id: op.operation_id,
    expected_revision: op.revision,
    expected_fence: op.fence,
    identity: null,
    expected_holder: null,
    live_until: liveUntil,
  };
}

function decision(guard, op, nowText, attempts = [], credential = null) {
  return { outcome: "decision", guard, operation: op, attempts, outbox: outboxOf(op, nowText), credential };
}

const earlier = (a, b) => (timeOf(a) <= timeOf(b) ? a : b);

// Ends the Operation by a limit (a claim or the deadline sweep): a running owner's Attempt is
// written abandoned first, `error_code` is the outcome's name unless another is given,
// effect_unsettled_since is kept.
function endByLimit(machines, op, event, outcome, nowText, errorCode = outcome) {
  const attempts = op.state === "running" ? [ended(op, "abandoned", "lease_expired", nowText)] : [];
  const next = move(machines, op, event, { outcome, error_code: errorCode });
  return decision(guardOf(op), next, nowText, attempts);
}

// The deadline's ending ("The overall deadline and effects", as `expire` decides it): an
// Operation awaiting approval ends approval_expired, whatever its row says of an effect (it has
// never been claimed, and the machine has no other way out of that state past the deadline); an
// issued, unanswered call of an external effect ends external_outcome_unknown, because
// deadline_exceeded would say nothing happened; anything else ends deadline_exceeded.
function endByDeadline(machines, op, nowText) {
  if (op.state === "awaiting_approval") return endByLimit(machines, op, "approval_expired", "approval_expired", nowText);
  if (unsettled(op)) return endByLimit(machines, op, "outcome_unknown", "external_outcome_unknown", nowText);
  return endByLimit(machines, op, "deadline_exceeded", "deadline_exceeded", nowText);
}

// --- owner checks -----------------------------------------------------------------------

// Every request made under a credential, in this order ("Owner checks"): the fence before the
// state, because once fence N+1 exists N can do nothing, whatever else holds.
function ownerRefusal(op, credential, now) {
  if (op === null || op.operation_id !== credential.operation_id) return refusal("operation_not_found");
  if (credential.fence !== op.fence) return refusal("stale_fence");
  if (op.state !== "running") return refusal("not_running");
  if (op.owner !== credential.worker_id) return refusal("worker_mismatch");
  if (now >= timeOf(op.lease_expires_at)) return refusal("lease_expired");
  return null;
}

// --- decisions --------------------------------------------------------------------------

// A submission with its omitted fields filled in, each with its default; a policy's fields
// are filled one by one, so a policy that names only its limit of Attempts keeps the rest.
function withDefaults(r) {
  const policy = r.policy === undefined ? {} : r.policy;
  return {
    ...r,
    policy: isRecord(policy) ? { ...DEFAULT_POLICY, ...policy } : policy,
    retention: r.retention === undefined ? DEFAULT_RETENTION : r.retention,
    requires_approval: r.requires_approval === undefined ? false : r.requires_approval,
    earlier_input_digest: r.earlier_input_digest === undefined ? null : r.earlier_input_digest,
  };
}

function submit(machines, op, request, nowText) {
  const r = withDefaults(request);
  const checked = validated(() => {
    checkId("operation_id", r.operation_id);
    const identity = r.identity;
    if (!isRecord(identity)) throw new Invalid("identity");
    for (const key of ["namespace", "tenant", "principal", "client_key"]) checkId(`identity.${key}`, identity[key]);
    checkId("action_name", r.action_name);
    checkPositiveInt("action_version", r.action_version);
    if (!EFFECT_CLASSES.includes(r.effect_class)) throw new Invalid("effect_class");
    checkDigest("input_digest", r.input_digest);
    if (given(r.earlier_input_digest)) checkDigest("earlier_input_digest", r.earlier_input_digest);
    checkAuthority(r.authority);
    const policy = r.policy;
    if (!isRecord(policy)) throw new Invalid("policy");
    checkDuration("policy.initial_interval", policy.initial_interval);
    checkDuration("policy.maximum_interval", policy.maximum_interval);
    const toClose = checkDuration("policy.schedule_to_close", policy.schedule_to_close);
    checkPositiveInt("policy.maximum_attempts", policy.maximum_attempts);
    const c = policy.backoff_coefficient;
    if (typeof c !== "number" || !(c >= 1 && c <= 100)) throw new Invalid("policy.backoff_coefficient");
    const retention = checkDuration("retention", r.retention);
    checkBool("requires_approval", r.requires_approval);
    const now = checkNow(nowText);
    later("policy.schedule_to_close", now, toClose);
    later("retention", now, retention);
    return { now, toClose, retention };
  });
  if (checked.refused) return checked.refused;
  const { now, toClose, retention } = checked.value;
  // Current authority first, whatever the identity names: stored provenance is never
  // permission, and only an authorized caller may have an Operation's state back.
  const denied = authorityRefusal(r.authority, r.identity.principal);
  if (denied) return denied;
  let holder = null;
  if (op !== null) {
    // The identity is free again only once its window has passed *and* its Operation ended.
    if (now < timeOf(op.retain_until) || !isTerminal(op)) {
      if (op.action_name !== r.action_name) return refusal("idempotency_conflict", "action_name");
      if (op.action_version !== r.action_version) return refusal("idempotency_conflict", "action_version");
      // An Operation admitted before inputs were canonical is stored under the earlier digest.
      const digests = [r.input_digest, ...(given(r.earlier_input_digest) ? [r.earlier_input_digest] : [])];
      if (!digests.includes(op.input_digest)) return refusal("idempotency_conflict", "input_digest");
      return { outcome: "unchanged", code: "same_submission", operation: op };
    }
    holder = op.operation_id;
  }
  const admitted = {
    operation_id: r.operation_id,
    identity: r.identity,
    action_name: r.action_name,
    action_version: r.action_version,
    effect_class: r.effect_class,
    input_digest: r.input_digest,
    state: "admitted",
    revision: 1,
    policy: r.policy,
    admitted_at: nowText,
    deadline: timeText(now + toClose),
    // An identity never lapses while its Operation can still run.
    retain_until: timeText(now + (retention > toClose ? retention : toClose)),
    next_eligible_at: nowText,
    requires_approval: r.requires_approval,
    approval: null,
    fence: 0,
    attempt_count: 0,
    owner: null,
    lease_expires_at: null,
    attempt_started_at: null,
    effect_id: null,
    effect_unsettled_since: null,
    outcome: null,
    error_code: null,
    result: null,
    cancel_requested_by: null,
  };
  let written = admitted;
  if (r.requires_approval) {
    // The new Operation is revision 1 whatever its state: require_approval is part of admission.
    written = { ...admitted, state: tableStep(machines.operation, "admitted", "require_approval") };
  }
  const guard = {
    operation_id: r.operation_id,
    expected_revision: 0,
    expected_fence: 0,
    identity: r.identity,
    expected_holder: holder,
    live_until: null,
  };
  return decision(guard, written, nowText);
}

// Whether the stored approval authorizes a claim: an approving decision bound to this exact
// Operation, its input, action, version, tenant and requester, not given by the requester under
// any version of their resolver, and, on a replacement, one the first Attempt consumed.
function approvalAuthorizes(op) {
  const a = op.approval;
  if (!given(a) || a.approved !== true) return false;
  if (a.operation_id !== op.operation_id || a.input_digest !== op.input_digest) return false;
  if (a.action_name !== op.action_name || a.action_version !== op.action_version) return false;
  if (a.tenant !== op.identity.tenant || a.requester !== op.identity.principal) return false;
  if (stablePrincipal(a.approver) === stablePrincipal(op.identity.principal)) return false;
  if (op.state === "running" && !given(a.consumed_by)) return false;
  return true;
}

function claim(machines, op, r, nowText) {
  const checked = validated(() => {
    checkId("worker_id", r.worker_id);
    return checkLease(r, nowText);
  });
  if (checked.refused) return checked.refused;
  const { now, lease } = checked.value;
  if (op === null) return refusal("operation_not_found");
  const deadline = timeOf(op.deadline);
  const past = now >= deadline;
  // Not claimable: terminal, a live owner, backoff or awaiting approval before the deadline.
  if (isTerminal(op)) return refusal("not_eligible");
  if (op.state === "running" && now < timeOf(op.lease_expires_at)) return refusal("not_eligible");
  if (op.state === "admitted" && now < timeOf(op.next_eligible_at) && !past) return refusal("not_eligible");
  if (op.state === "awaiting_approval" && !past) return refusal("not_eligible");
  const replacement = op.state === "running";
  // An Attempt is left for an admitted Operation, or a replacement with Attempts unused; never for
  // one awaiting approval, which no Attempt may start until a decision admits it.
  const attemptsLeft = op.state === "admitted" || (replacement && op.attempt_count < op.policy.maximum_attempts);
  if (past) {
    // An issued, unanswered call with an Attempt left gets that Attempt, which may only ask the
    // provider (its intent is refused past the deadline); anything else ends as the sweep ends it.
    if (!(unsettled(op) && attemptsLeft)) return endByDeadline(machines, op, nowText);
  }
  if (replacement && !attemptsLeft) {
    if (unsettled(op)) return endByLimit(machines, op, "outcome_unknown", "external_outcome_unknown", nowText);
    return endByLimit(machines, op, "fail", "max_attempts_exceeded", nowText);
  }
  // A misbound approval can never become usable (decide refuses every decision once one is
  // stored), so the claim ends the Operation rather than leave it due and refused for ever; with
  // an issued call unanswered it ends external_outcome_unknown ("Endings with a call unanswered":
  // the approval authorizes no Attempt, so none may look), the code still naming the approval.
  if (op.requires_approval) {
    if (!approvalAuthorizes(op)) {
      if (unsettled(op)) {
        return endByLimit(machines, op, "outcome_unknown", "external_outcome_unknown", nowText, "approval_misbound");
      }
      return endByLimit(machines, op, "approval_misbound", "approval_misbound", nowText);
    }
    if (!given(op.approval.consumed_by) && now >= timeOf(op.approval.expires_at)) {
      return endByLimit(machines, op, "approval_expired", "approval_expired", nowText);
    }
  }
  const fence = op.fence + 1;
  const fields = {
    fence,
    attempt_count: op.attempt_count + 1,
    owner: r.worker_id,
    attempt_started_at: nowText,
    // Not capped by the deadline: an owner whose call is out when it comes keeps its lease.
    lease_expires_at: timeText(now + lease),
  };
  if (op.requires_approval && !given(op.approval.consumed_by)) fields.approval = { ...op.approval, consumed_by: fence };
  const next = move(machines, op, replacement ? "reclaim_expired" : "claim", fields);
  // The expired owner's Attempt is written abandoned before the new one, in the same decision.
  const attempts = replacement ? [ended(op, "abandoned", "lease_expired", nowText)] : [];
  attempts.push({
    operation_id: op.operation_id, number: fence, worker_id: r.worker_id, state: "running",
    started_at: nowText, ended_at: null, error_code: null,
  });
  const credential = { operation_id: op.operation_id, worker_id: r.worker_id, fence };
  return decision(guardOf(op), next, nowText, attempts, credential);
}

function heartbeat(machines, op, r, nowText) {
  const checked = validated(() => {
    checkCredential(r.credential);
    return checkLease(r, nowText);
  });
  if (checked.refused) return checked.refused;
  const { now, lease } = checked.value;
  const refused = ownerRefusal(op, r.credential, now);
  if (refused) return refused;
  // From the deadline on no renewal: an Attempt that keeps renewing cannot outrun the limit.
  const deadline = timeOf(op.deadline);
  if (now >= deadline) return refusal("deadline_exceeded");
  const current = timeOf(op.lease_expires_at);
  const asked = now + lease < deadline ? now + lease : deadline;
  // Never shortened: a lease the claim granted past the deadline stands.
  const next = move(machines, op, "heartbeat", { lease_expires_at: timeText(asked > current ? asked : current) });
  return decision(guardOf(op, op.lease_expires_at), next, nowText);
}

function recordIntent(machines, op, r, nowText) {
  const checked = validated(() => {
    checkCredential(r.credential);
    return checkNow(nowText);
  });
  if (checked.refused) return checked.refused;
  const now = checked.value;
  const refused = ownerRefusal(op, r.credential, now);
  if (refused) return refused;
  if (op.effect_class !== "external") return refusal("wrong_effect_class");
  // The intent precedes the provider call, so refusing it past the deadline starts no call.
  if (now >= timeOf(op.deadline)) return refusal("deadline_exceeded");
  const next = move(machines, op, "record_intent", {
    // A later Attempt keeps the first effect id, and the fence that began the unanswered issues.
    effect_id: op.effect_id ?? `${op.operation_id}/effect`,
    effect_unsettled_since: op.effect_unsettled_since ?? op.fence,
  });
  return decision(guardOf(op, earlier(op.lease_expires_at, op.deadline)), next, nowText);
}

function complete(machines, op, r, nowText) {
  const checked = validated(() => {
    checkCredential(r.credential);
    checkAuthority(r.authority);
    // An omitted result is the JSON text `null` ("Well-formed requests": omitted fields).
    const result = r.result === undefined ? "null" : r.result;
    checkResult(result);
    return { now: checkNow(nowText), result };
  });
  if (checked.refused) return checked.refused;
  const { now, result } = checked.value;
  const refused = ownerRefusal(op, r.credential, now);
  if (refused) return refused;
  // The authority must answer for the Operation's principal, whatever the effect class.  An
  // external success records the provider's answer to a call already issued and begins nothing,
  // so it is decided whatever that answer says; the others need it granted now.
  if (!samePrincipal(r.authority.principal, op.identity.principal)) return refusal("not_authorized", "authority.principal");
  if (op.effect_class !== "external" && !r.authority.granted) return refusal("not_authorized");
  if (op.effect_class === "external" && !given(op.effect_unsettled_since)) return refusal("intent_required");
  // An atomic success is its effect, which may not begin from the deadline on.
  const atomic = op.effect_class === "atomic";
  if (atomic && now >= timeOf(op.deadline)) return refusal("deadline_exceeded");
  const next = move(machines, op, "succeed", {
    outcome: "succeeded", result, error_code: null, effect_unsettled_since: null,
  });
  const liveUntil = atomic ? earlier(op.lease_expires_at, op.deadline) : op.lease_expires_at;
  return decision(guardOf(op, liveUntil), next, nowText, [ended(op, "succeeded", null, nowText)]);
}

function fail(machines, op, r, nowText) {
  const checked = validated(() => {
    checkCredential(r.credential);
    checkId("error_code", r.error_code);
    checkBool("retryable", r.retryable);
    const notAuthorized = checkFlag("not_authorized", r.not_authorized);
    const notApplied = checkFlag("effect_not_applied", r.effect_not_applied);
    return { now: checkNow(nowText), notAuthorized, notApplied };
  });
  if (checked.refused) return checked.refused;
  const { now, notAuthorized, notApplied } = checked.value;
  const refused = ownerRefusal(op, r.credential, now);
  if (refused) return refused;
  if (notApplied && op.effect_class !== "external") return refusal("wrong_effect_class");
  // A conclusive "not applied" settles the effect only when this Attempt's own call was the
  // only issue since the last answer; an earlier Attempt's issue stays unanswered.
  let stillUnsettled = op.effect_unsettled_since;
  if (notApplied && stillUnsettled === op.fence) stillUnsettled = null;
  const deadline = timeOf(op.deadline);
  const pause = backoff(op.policy, op.attempt_count);
  let ending = null;
  if (notAuthorized) ending = ["fail", "not_authorized"];
  else if (!r.retryable) ending = ["fail", "action_failed"];
  else if (now >= deadline) ending = ["deadline_exceeded", "deadline_exceeded"];
  else if (op.attempt_count >= op.policy.maximum_attempts) ending = ["fail", "max_attempts_exceeded"];
  else if (now + pause >= deadline) ending = ["deadline_exceeded", "deadline_exceeded"];
  const attempts = [ended(op, "failed", r.error_code, nowText)];
  const guard = guardOf(op, op.lease_expires_at);
  if (ending === null) {
    const next = move(machines, op, "retry", {
      next_eligible_at: timeText(now + pause), error_code: r.error_code, effect_unsettled_since: stillUnsettled,
    });
    return decision(guard, next, nowText, attempts);
  }
  let [event, outcome] = ending;
  // An issued call still unanswered after this failure may have been applied: no ending may say
  // nothing happened, and no Attempt may repeat the call.
  if (op.effect_class === "external" && given(stillUnsettled)) [event, outcome] = ["outcome_unknown", "external_outcome_unknown"];
  const next = move(machines, op, event, { outcome, error_code: r.error_code, effect_unsettled_since: stillUnsettled });
  return decision(guard, next, nowText, attempts);
}

function outcomeUnknown(machines, op, r, nowText) {
  const checked = validated(() => {
    checkCredential(r.credential);
    checkText("detail", r.detail);
    return checkNow(nowText);
  });
  if (checked.refused) return checked.refused;
  const now = checked.value;
  const refused = ownerRefusal(op, r.credential, now);
  if (refused) return refused;
  if (op.effect_class !== "external") return refusal("wrong_effect_class");
  // Only an issued, unanswered call can have an unknown outcome.
  if (!given(op.effect_unsettled_since)) return refusal("intent_required");
  const next = move(machines, op, "outcome_unknown", {
    outcome: "external_outcome_unknown", error_code: "external_outcome_unknown",
  });
  return decision(guardOf(op, op.lease_expires_at), next, nowText,
    [ended(op, "outcome_unknown", "external_outcome_unknown", nowText)]);
}

function decide(machines, op, r, nowText) {
  const checked = validated(() => {
    checkId("approval_id", r.approval_id);
    checkId("operation_id", r.operation_id);
    checkDigest("input_digest", r.input_digest);
    checkId("action_name", r.action_name);
    checkPositiveInt("action_version", r.action_version);
    checkId("tenant", r.tenant);
    checkId("approver", r.approver);
    checkBool("approved", r.approved);
    const expires = checkTime("expires_at", r.expires_at);
    checkAuthority(r.authority);
    return { now: checkNow(nowText), expires };
  });
  if (checked.refused) return checked.refused;
  const { now, expires } = checked.value;
  if (op === null || op.operation_id !== r.operation_id) return refusal("operation_not_found");
  // The approver's own current authority, before anything stored answers: a refused approver
  // learns nothing of a decision stored earlier.
  const denied = authorityRefusal(r.authority, r.approver);
  if (denied) return denied;
  if (r.input_digest !== op.input_digest) return refusal("approval_misbound", "input_digest");
  if (r.action_name !== op.action_name) return refusal("approval_misbound", "action_name");
  if (r.action_version !== op.action_version) return refusal("approval_misbound", "action_version");
  if (r.tenant !== op.identity.tenant) return refusal("approval_misbound", "tenant");
  if (given(op.approval)) {
    const a = op.approval;
    if (a.approval_id === r.approval_id && a.approver === r.approver && a.approved === r.approved) {
      return { outcome: "unchanged", code: "already_decided", operation: op };
    }
    return refusal("decision_conflict");
  }
  if (op.state !== "awaiting_approval") return refusal("not_awaiting_approval");
  // Past its deadline the Operation can only end approval_expired: no decision changes that.
  if (now >= timeOf(op.deadline)) return refusal("deadline_exceeded");
  if (stablePrincipal(r.approver) === stablePrincipal(op.identity.principal)) return refusal("self_approval", "approver");
  if (expires <= now) return refusal("approval_expired", "expires_at");
  const approval = {
    approval_id: r.approval_id,
    operation_id: op.operation_id,
    input_digest: op.input_digest,
    action_name: op.action_name,
    action_version: op.action_version,
    tenant: op.identity.tenant,
    // The whole reference the Operation was admitted under, its version included.
    requester: op.identity.principal,
    approver: r.approver,
    approved: r.approved,
    expires_at: timeText(expires),
    decided_at: nowText,
    consumed_by: null,
  };
  const next = r.approved
    ? move(machines, op, "approve", { approval, next_eligible_at: nowText })
    : move(machines, op, "reject", { approval, outcome: "approval_rejected", error_code: "approval_rejected" });
  return decision(guardOf(op), next, nowText);
}

function cancel(machines, op, r, nowText) {
  const checked = validated(() => {
    checkId("operation_id", r.operation_id);
    checkId("principal", r.principal);
    checkAuthority(r.authority);
    checkText("reason", r.reason);
    return checkNow(nowText);
  });
  if (checked.refused) return checked.refused;
  if (op === null || op.operation_id !== r.operation_id) return refusal("operation_not_found");
  // The canceller's authority before the state answers, so a refused caller learns nothing.
  const denied = authorityRefusal(r.authority, r.principal);
  if (denied) return denied;
  if (op.state === "cancelled") return { outcome: "unchanged", code: "already_cancelled", operation: op };
  if (isTerminal(op)) return refusal("cancel_too_late");
  const attempts = op.state === "running" ? [ended(op, "cancelled", "cancelled", nowText)] : [];
  // It never undoes a committed effect: effect_unsettled_since stays as it was.
  const next = move(machines, op, "cancel", {
    outcome: "cancelled", error_code: "cancelled", cancel_requested_by: r.principal,
  });
  return decision(guardOf(op), next, nowText, attempts);
}

function expire(machines, op, r, nowText) {
  const checked = validated(() => {
    checkId("actor", r.actor);
    return checkNow(nowText);
  });
  if (checked.refused) return checked.refused;
  const now = checked.value;
  if (op === null) return refusal("operation_not_found");
  if (isTerminal(op) || now < timeOf(op.deadline)) return refusal("not_eligible");
  // A live owner keeps its chance to commit.
  if (op.state === "running" && now < timeOf(op.lease_expires_at)) return refusal("not_eligible");
  return endByDeadline(machines, op, nowText);
}

const DECISIONS = {
  submit, claim, heartbeat, record_intent: recordIntent, complete, fail,
  outcome_unknown: outcomeUnknown, decide, cancel, expire,
};

function decideOperation(machines, input) {
  const fn = DECISIONS[input.decision];
  if (!fn) return null;
  // Every time a decision writes is in the one form of the wire (six digits and `Z`), the only
  // form read as a time; a `now` in any other is no time and is passed on as it is, for the
  // decision to refuse where its table checks `now`.
  const now = parseTime(input.now);
  return fn(machines, input.operation, input.request, now === null ? input.now : timeText(now));
}

module.exports = { decideOperation };
