// One node visit of the workflow interpreter, planned from the execution's view
// (specs/interpreter.md: Resolution and pinning, Bindings, Step attempts, the
// step limit of The dispatcher pass, Node semantics, The handler contract;
// specs/conformance.md, `interpreter`; seed 000, Node Semantics).
//
// visit(machines, input) takes what the visit reads -- the execution row, the
// pinned definition revision, the evidence, `now`, the lease, the node's
// authority answer and the CommandHandler's result -- and returns the plan:
//   { plan: "step", step, evidence }                               -- record_step
//   { plan: "finish", target, error_code, step, wait, evidence }   -- finalize
//   { plan: "invoke", command, evidence, settled }                 -- issue one Command
//   { plan: "refused", code: "invalid_view", field }               -- nothing is planned
// Rules this module keeps:
// - It is pure: nothing is read from a store or a clock; `now` is the visit's time.
// - The view is checked first, field by field in the order specs/conformance.md
//   lists them, and the first malformed one is named.
// - Evidence is every revision the plan commits, in order; a later revision keeps
//   the whole body of the one before and adds to it, so nothing recorded is lost.
// - Attempt states move only along specs/machines/attempt.toml (machines.js).
// - Free text for people (a handler's `detail`) is not written: only codes, states
//   and values are compared.
// - A stored definition is read by definitions.js, leniently (definitions.md, Lenient
//   reading of a stored definition): every field's form and bound and the rules of the
//   whole revision, as the definitions layer reads one, but for what a stored one keeps.
// - The view's values are plain JSON: a number with a fraction is a decimal, one
//   without an integer (JSON.parse cannot tell 2.0 from 2; no case holds one).

"use strict";

const crypto = require("crypto");
const { step: tableStep } = require("./machines");
const { evaluate } = require("./expr");
const { readDefinition: readStored, DefinitionError } = require("./definitions");
const { STEP_LIMIT } = require("./protocol");
const { isRecord, isStorableText, codePoints, byCodePoint, parseTime, Invalid } = require("./values");

const MAX_IDENTITY = 128;
const KINDS = ["condition", "wait_for_event", "request_approval", "local_command", "end"];
// The handler contract's bounds on a result (specs/interpreter.md, What a result may hold).
const STATUSES = ["succeeded", "rejected", "unknown"];
const REJECTIONS = ["validation", "authorization", "stale_version", "rejected", "stale_fence"];
const MAX_RESULT_LENGTH = 65536;
const MAX_OUTPUTS_DEPTH = 32;
const MAX_OUTPUTS_JSON = 65536;

// --- values ---------------------------------------------------------------------------

// A boolean is never an integer here (typeof rules it out), as specs/conformance.md asks.
const isInt = (v, min) => typeof v === "number" && Number.isInteger(v) && v >= min;
const nonEmpty = (v) => typeof v === "string" && v !== "";

const sortedPairs = (object) => Object.keys(object).sort(byCodePoint).map((k) => [k, object[k]]);

// A plain JSON value as expr.js's tagged binding (specs/conformance.md, Values): the
// expression language tells an integer from a decimal, and JSON numbers with a fraction
// are decimals.
function tagged(value) {
  if (value === null || value === undefined) return { type: "null" };
  if (typeof value === "string") return { type: "string", value };
  if (typeof value === "boolean") return { type: "bool", value };
  if (typeof value === "number") {
    return Number.isInteger(value) ? { type: "integer", value: BigInt(value).toString() } : { type: "decimal", value: String(value) };
  }
  if (Array.isArray(value)) return { type: "array", value: value.map(tagged) };
  const map = {};
  for (const [k, v] of Object.entries(value)) map[k] = tagged(v);
  return { type: "map", value: map };
}

// A correlation value's canonical string (interpreter.md, Bindings): a string as it is,
// an integer in decimal, a boolean as true/false; anything else has none (null).
function canonicalString(value) {
  if (typeof value === "string") return value;
  if (typeof value === "boolean") return String(value);
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value).toString();
  return null;
}

// --- the view ---------------------------------------------------------------------------

const isReference = (v) => isRecord(v) && Object.keys(v).length === 1 && typeof v.from === "string";

// The definition as a stored revision is read (definitions.js, leniently): id -> node, or
// null when none was found.  Any refusal of the reader is a definition the view cannot use.
function readDefinition(definition) {
  if (definition === null) return null;
  try {
    return readStored(definition, { lenient: true });
  } catch (err) {
    if (err instanceof DefinitionError) throw new Invalid("definition");
    throw err;
  }
}

// The order of specs/conformance.md (`interpreter`, refused): the first field that fails.
function checkView(input) {
  const x = input.execution;
  if (!isRecord(x)) throw new Invalid("execution");
  for (const f of ["execution_id", "business_id", "definition_id", "current_node_id"]) {
    if (!nonEmpty(x[f])) throw new Invalid(`execution.${f}`);
  }
  for (const f of ["revision", "definition_revision"]) if (!isInt(x[f], 1)) throw new Invalid(`execution.${f}`);
  if (!isInt(x.step_count, 0)) throw new Invalid("execution.step_count");
  if (!isInt(x.fence, 1)) throw new Invalid("execution.fence");
  // Only a running execution under its lease is visited.
  if (x.state !== "running") throw new Invalid("execution.state");
  const definition = readDefinition(input.definition === undefined ? null : input.definition);
  if (!Array.isArray(input.evidence)) throw new Invalid("evidence");
  input.evidence.forEach((e, n) => {
    if (!isRecord(e) || typeof e.object_id !== "string" || typeof e.kind !== "string" || typeof e.state !== "string" ||
        !isInt(e.revision, Number.MIN_SAFE_INTEGER) || !isRecord(e.body)) throw new Invalid(`evidence[${n}]`);
  });
  // The wire's one form of a time (values.js); kept as its text, so started_at is written back exactly.
  if (parseTime(input.now) === null) throw new Invalid("now");
  const now = input.now;
  const lease = input.lease;
  if (!isRecord(lease)) throw new Invalid("lease");
  if (!nonEmpty(lease.worker_id)) throw new Invalid("lease.worker_id");
  if (!isInt(lease.fence, 1)) throw new Invalid("lease.fence");
  const authority = input.authority === undefined ? null : input.authority;
  if (authority !== null && !(isRecord(authority) && typeof authority.granted === "boolean")) throw new Invalid("authority");
  const result = input.result === undefined ? null : input.result;
  if (result !== null && !isRecord(result)) throw new Invalid("result");
  return { execution: x, definition, evidence: input.evidence, now, lease, authority, result };
}

// --- bindings ---------------------------------------------------------------------------

// What the visit reads from the evidence (interpreter.md, Bindings): the admission input
// and principal, and each node's outputs -- those of its latest completed attempt, so a
// failed or unfinished later attempt never hides or replaces them.
function readEvidence(evidence) {
  let admission = { principal_id: null, input: {} };
  const outputs = new Map();
  const attempts = [];
  for (const e of evidence) {
    if (e.kind === "ExecutionInput") {
      admission = { principal_id: e.body.principal_id ?? null, input: isRecord(e.body.input) ? e.body.input : {} };
    } else if (e.kind === "StepAttempt") {
      attempts.push(e);
      // The latest completed attempt decides, even one that recorded no outputs.
      if (e.state === "completed") outputs.set(e.body.node_id, isRecord(e.body.outputs) ? e.body.outputs : {});
    }
  }
  return { admission, outputs, attempts };
}

// A binding's value, or undefined when it has none (missing).
function lookup(read, name) {
  const dot = name.indexOf(".");
  const [source, field] = [name.slice(0, dot), name.slice(dot + 1)];
  const values = source === "input" ? read.admission.input : read.outputs.get(source);
  return values !== undefined && Object.prototype.hasOwnProperty.call(values, field) ? values[field] : undefined;
}

// The binding names a node reads: a condition's declared bindings, else the references
// of its operands in field order (correlation, targets, payload).
function bindingNames(node) {
  if (node.kind === "condition") return [...node.bindings];
  const names = [];
  const add = (operand) => {
    if (isReference(operand) && !names.includes(operand.from)) names.push(operand.from);
  };
  if (node.kind === "wait_for_event") Object.values(node.correlation).forEach(add);
  for (const t of node.targets || []) {
    add(t.id);
    add(t.revision);
  }
  if (node.kind === "local_command") Object.values(node.payload || {}).forEach(add);
  return names;
}

// An operand's value: a literal as written, a reference as read (undefined or null: missing).
const resolve = (read, operand) => (isReference(operand) ? lookup(read, operand.from) : operand);
const missing = (value) => value === undefined || value === null;

// Targets as [[ID, REVISION], ...], or null when one does not resolve (interpreter.md,
// Bindings): an id is a string, or an integer written in decimal; a revision an integer
// of at least 1.
function resolveTargets(read, targets) {
  const resolved = [];
  for (const t of targets || []) {
    const id = resolve(read, t.id), revision = resolve(read, t.revision);
    const text = typeof id === "string" ? id : Number.isInteger(id) ? BigInt(id).toString() : null;
    if (text === null || !isInt(revision, 1)) return null;
    resolved.push([text, revision]);
  }
  return resolved;
}

// The declared payload with its references read, or null when one has no scalar value:
// a node reads strings, numbers and booleans only (definitions.md, Typed inputs).
function resolvePayload(read, payload) {
  const values = {};
  for (const [name, operand] of Object.entries(payload || {})) {
    const value = resolve(read, operand);
    if (missing(value) || typeof value === "object") return null;
    values[name] = value;
  }
  return values;
}

// The node ids a node may continue at, timeout included: each must name a node.
function continuationsOf(node) {
  switch (node.kind) {
    case "condition": return [node.true_next, node.false_next];
    case "wait_for_event": return [node.next, ...(node.timeout ? [node.timeout.next] : [])];
    case "request_approval": return [node.approved_next, node.rejected_next, ...(node.timeout ? [node.timeout.next] : [])];
    case "local_command": return [node.next, node.on_failure];
    default: return [];
  }
}

// --- the attempt and its revisions -----------------------------------------------------------

// `<execution>/a<revision>`, or, past the 128 characters of an identifier, a prefix and
// a digest of the long form (interpreter.md, Step attempts), so identities never collide.
function attemptIdentity(executionId, revision) {
  const long = `${executionId}/a${revision}`;
  if (codePoints(long) <= MAX_IDENTITY) return long;
  const digest = crypto.createHash("sha256").update(long, "utf8").digest("hex").slice(0, 24);
  return Array.from(`${Array.from(executionId).slice(0, 98).join("")}/a${revision}.${digest}`).slice(0, MAX_IDENTITY).join("");
}

class Attempt {
  constructor(machines, view, nodeId, node, inputs) {
    this.machine = machines.attempt;
    this.id = attemptIdentity(view.execution.execution_id, view.execution.revision);
    this.nodeId = nodeId;
    this.state = "pending";
    this.revision = 1;
    this.body = {
      attempt_id: this.id,
      execution_id: view.execution.execution_id,
      execution_revision: view.execution.revision,
      business_id: view.execution.business_id,
      definition_id: view.execution.definition_id,
      definition_revision: view.execution.definition_revision,
      node_id: nodeId,
      node_revision: node ? node.revision : 0,
      node_kind: node ? (KINDS.includes(node.kind) ? node.kind : "unsupported") : "unresolved",
      step: view.execution.step_count + 1,
      started_at: view.now,
      worker_id: view.lease.worker_id,
      fence: view.lease.fence,
      inputs,
      status: "pending",
    };
    this.revisions = [this.snapshot()];
  }

  snapshot() {
    return { object_id: this.id, kind: "StepAttempt", revision: this.revision, state: this.state,
      body: JSON.parse(JSON.stringify(this.body)) };
  }

  // The next revision: the state the attempt table gives the event, with evidence added.
  move(event, added = {}) {
    const target = tableStep(this.machine, this.state, event);
    if (target === null) throw new Error(`attempt: ${event} is illegal from ${this.state}`);
    this.state = target;
    this.revision += 1;
    Object.assign(this.body, added, { status: target });
    const revision = this.snapshot();
    this.revisions.push(revision);
    return revision;
  }

  stepRow(next = null) {
    return { node_id: this.nodeId, attempt_id: this.id, next_node_id: next };
  }
}

const finish = (target, errorCode, step, wait, evidence) => ({ plan: "finish", target, error_code: errorCode, step, wait, evidence });
const stepPlan = (step, evidence) => ({ plan: "step", step, evidence });

// The attempt fails before its work (event `reject`, pending -> failed) and the execution
// is suspended for review with the reason.
function suspendBefore(attempt, reason, evidence = []) {
  attempt.move("reject", { reason });
  return finish("suspended", reason, attempt.stepRow(), null, [...attempt.revisions, ...evidence]);
}

// --- node kinds -------------------------------------------------------------------------

function visitCondition(attempt, node, read) {
  const bindings = {};
  for (const name of node.bindings) {
    const value = lookup(read, name);
    if (value !== undefined) bindings[name] = tagged(value);
  }
  attempt.move("start");
  const result = evaluate(node.tree, bindings);
  if (result === "unknown") {
    // Unknown is never false (seed 000, Node Semantics, condition): the attempt fails and
    // records which bindings had no value; the execution waits for review.
    const absent = [...node.bindings].sort(byCodePoint).filter((n) => missing(lookup(read, n)));
    attempt.move("fail", { result: "unknown", missing: absent, reason: "condition_unknown" });
    return finish("suspended", "condition_unknown", attempt.stepRow(), null, attempt.revisions);
  }
  const next = result === "true" ? node.true_next : node.false_next;
  attempt.move("complete", { result, next_node_id: next, outputs: { result: result === "true" } });
  return stepPlan(attempt.stepRow(next), attempt.revisions);
}

function visitWait(attempt, node, read) {
  const correlation = {};
  for (const [name, operand] of Object.entries(node.correlation)) {
    const text = canonicalString(resolve(read, operand));
    if (text === null) return suspendBefore(attempt, "unresolved_binding");
    correlation[name] = text;
  }
  attempt.move("start", { waiting_for: { event_type: node.event_type, correlation } });
  const continuations = [["event", node.next]];
  if (node.timeout) continuations.push(["timeout", node.timeout.next]);
  const wait = registration(attempt, node.event_type, sortedPairs(correlation), node.timeout, continuations);
  return finish("waiting", null, attempt.stepRow(), wait, attempt.revisions);
}

function registration(attempt, eventType, correlation, timeout, continuations) {
  return {
    node_id: attempt.nodeId,
    attempt_id: attempt.id,
    event_type: eventType,
    correlation,
    // Relative: the store's time at commit makes it a wake_at (protocol.md, finalize).
    wake_at: null,
    timeout: Boolean(timeout),
    wake_after: timeout ? timeout.after_seconds * 1000000 : null,
    continuations: continuations.sort((a, b) => byCodePoint(a[0], b[0])),
  };
}

const granted = (authority) => authority !== null && authority.granted === true;

function visitApproval(attempt, node, read, view) {
  // The targets first: authority is asked for the operation on them.
  const targets = resolveTargets(read, node.targets);
  if (targets === null) return suspendBefore(attempt, "unresolved_binding");
  // No check made is a denial: authority fails closed (interpreter.md, Authority).
  if (!granted(view.authority)) return suspendBefore(attempt, "not_authorized");
  const requestId = `${attempt.id}/approval`;
  attempt.move("start", { approval_request: requestId });
  const request = {
    object_id: requestId, kind: "ApprovalRequest", revision: 1, state: "pending",
    body: {
      request_id: requestId,
      execution_id: view.execution.execution_id,
      business_id: view.execution.business_id,
      node_id: attempt.nodeId,
      attempt_id: attempt.id,
      binding: {
        operation: node.operation,
        targets,
        policies: (node.policies || []).map((p) => [p.id, p.revision]),
      },
      requester_id: read.admission.principal_id,
      reviewers: [...node.reviewers].sort(byCodePoint),
      distinct_reviewer: node.distinct_reviewer !== false,
      state: "pending",
      decided_by: null,
      decision_id: null,
    },
  };
  const continuations = [["approved", node.approved_next], ["rejected", node.rejected_next]];
  if (node.timeout) continuations.push(["timeout", node.timeout.next]);
  // Only a decision wakes it: its Event Type is the kernel's own and its one predicate the request.
  const wait = registration(attempt, "fencekeeper.approval", [["request_id", requestId]], node.timeout, continuations);
  return finish("waiting", null, attempt.stepRow(), wait, [...attempt.revisions, request]);
}

// The depth of a JSON value (an object or array is one level more than its deepest
// member), walked level by level so that no nesting can exhaust the stack.
function depthOf(value) {
  let level = [value], depth = 0;
  while (level.length) {
    const next = [];
    for (const v of level) if (v !== null && typeof v === "object") next.push(...Object.values(v));
    if (level.some((v) => v !== null && typeof v === "object")) depth += 1;
    level = next;
    if (depth > MAX_OUTPUTS_DEPTH) return depth;
  }
  return depth;
}

function allText(value) {
  const stack = [value];
  while (stack.length) {
    const v = stack.pop();
    if (typeof v === "string" && !isStorableText(v)) return false;
    if (typeof v === "number" && !Number.isFinite(v)) return false;
    if (v !== null && typeof v === "object") {
      for (const [k, member] of Object.entries(v)) {
        if (!Array.isArray(v) && !isStorableText(k)) return false;
        stack.push(member);
      }
    }
  }
  return true;
}

// Whether every store keeps the result alike (interpreter.md, What a result may hold).
function keepable(result) {
  if (!STATUSES.includes(result.status)) return false;
  if (result.rejection !== null && !REJECTIONS.includes(result.rejection)) return false;
  if (!isStorableText(result.detail) || codePoints(result.detail) > MAX_RESULT_LENGTH) return false;
  const outputs = result.outputs;
  if (!isRecord(outputs) || !allText(outputs) || depthOf(outputs) > MAX_OUTPUTS_DEPTH) return false;
  return codePoints(JSON.stringify(outputs)) <= MAX_OUTPUTS_JSON;
}

// What the handler's answer commits: the attempt's and the Command's second revisions, and
// where the execution goes.  Only a conclusive answer follows a continuation.
function settle(attempt, node, command, result) {
  const recorded = (state, extra) => ({
    object_id: command.command_id, kind: "Command", revision: 2, state,
    body: { ...command, status: state, ...extra },
  });
  const unknown = (commandRevision) => {
    attempt.move("outcome_unknown");
    return finish("reconciliation_required", "command_unknown", attempt.stepRow(), null,
      [attempt.revisions[attempt.revisions.length - 1], commandRevision]);
  };
  // A result no store keeps may hide an applied Command: unknown, and none of it is written.
  if (!keepable(result)) return unknown(recorded("unknown", { outputs: {} }));
  const outputs = JSON.parse(JSON.stringify(result.outputs));
  // The answer is recorded as given: a kind it names is kept whatever its status.
  const answer = result.rejection === null ? { outputs } : { outputs, rejection: result.rejection };
  if (result.status === "succeeded") {
    const revision = attempt.move("complete", { outputs, next_node_id: node.next });
    return stepPlan(attempt.stepRow(node.next), [revision, recorded("succeeded", answer)]);
  }
  if (result.status === "rejected" && result.rejection !== null) {
    const revision = attempt.move("fail", { rejection: result.rejection, next_node_id: node.on_failure });
    return stepPlan(attempt.stepRow(node.on_failure), [revision, recorded("rejected", answer)]);
  }
  // An unknown answer, or a rejection that names no kind: not conclusive, so the recorded
  // answer stands as given and the attempt awaits reconciliation.
  return unknown(recorded(result.status, answer));
}

function visitCommand(attempt, node, read, view) {
  // An earlier attempt at this node never settled: its Command may have been applied, so
  // nothing is issued, and this visit records no attempt and counts no step; reconciliation
  // settles the earlier one.
  const unsettled = read.attempts.some((a) => a.body.node_id === node.id && a.body.node_kind === "local_command" &&
    a.state !== "completed" && a.state !== "failed");
  if (unsettled) return finish("reconciliation_required", "command_unsettled", null, null, []);
  // The envelope first: authority is asked for the operation on its targets.
  const targets = resolveTargets(read, node.targets);
  const payload = resolvePayload(read, node.payload);
  if (targets === null || payload === null) return suspendBefore(attempt, "unresolved_binding");
  // A denial before issuing is a failure continuation, with nothing issued.
  if (!granted(view.authority)) {
    attempt.move("reject", { reason: "not_authorized", next_node_id: node.on_failure });
    return stepPlan(attempt.stepRow(node.on_failure), attempt.revisions);
  }
  const commandId = `${attempt.id}/command`;
  const command = {
    command_id: commandId,
    execution_id: view.execution.execution_id,
    attempt_id: attempt.id,
    // Server-supplied: the workflow principal recorded at admission, never the definition's.
    principal_id: read.admission.principal_id,
    business_id: view.execution.business_id,
    operation: node.operation,
    targets,
    payload,
    // The lease's fence reaches the effect, so a handler can refuse a replaced worker.
    fence: view.lease.fence,
  };
  attempt.move("start", { command_id: commandId });
  const issued = { object_id: commandId, kind: "Command", revision: 1, state: "issued", body: command };
  const evidence = [...attempt.revisions, issued];
  const settled = view.result === null ? null : settle(attempt, node, command, view.result);
  return { plan: "invoke", command, evidence, settled };
}

function visitEnd(attempt, node) {
  attempt.move("start");
  const failed = node.outcome === "failed";
  attempt.move("complete", { outcome: node.outcome, error_code: failed ? node.error_code : null });
  return finish(node.outcome, failed ? node.error_code : null, attempt.stepRow(), null, attempt.revisions);
}

// --- the visit --------------------------------------------------------------------------

function visit(machines, input) {
  let view;
  try {
    view = checkView(input);
  } catch (err) {
    if (err instanceof Invalid) return { plan: "refused", code: "invalid_view", field: err.field };
    throw err;
  }
  const { execution, definition } = view;
  // The step limit is checked before the definition is read: no visit, no attempt, no step.
  if (execution.step_count >= STEP_LIMIT) return finish("suspended", "step_limit", null, null, []);
  const read = readEvidence(view.evidence);
  const nodeId = execution.current_node_id;
  // Resolution: execution -> pinned definition revision -> node; nothing newer is consulted.
  const pinned = definition !== null && definition.id === execution.definition_id &&
    definition.revision === execution.definition_revision;
  const node = pinned ? definition.nodes.get(nodeId) : undefined;
  const known = node !== undefined && KINDS.includes(node.kind);
  const inputs = {};
  if (known) for (const name of bindingNames(node)) inputs[name] = lookup(read, name) ?? null;
  const attempt = new Attempt(machines, view, nodeId, node, inputs);
  // The order of interpreter.md (Resolution and pinning); an unsupported node declares no
  // continuations, so its check and the continuations' commute.
  if (!pinned) return suspendBefore(attempt, "definition_not_pinned");
  if (node === undefined) return suspendBefore(attempt, "dangling_continuation");
  if (!known) return suspendBefore(attempt, "unsupported_node");
  if (continuationsOf(node).some((next) => !definition.nodes.has(next))) return suspendBefore(attempt, "dangling_continuation");
  switch (node.kind) {
    case "condition": return visitCondition(attempt, node, read);
    case "wait_for_event": return visitWait(attempt, node, read);
    case "request_approval": return visitApproval(attempt, node, read, view);
    case "local_command": return visitCommand(attempt, node, read, view);
    default: return visitEnd(attempt, node);
  }
}

module.exports = { visit };
