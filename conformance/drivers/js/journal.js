// The DAG node journal of specs/journal.md: canonical bytes, the chain, replay and append.
//
// A journal is a header and a chain of events, each a JSON record written in
// its RFC 8785 form and digested with SHA-256 (section 1).  Replay (section 7)
// reads a chain record by record, rebuilds the command each event records and
// checks it by the same rules an append checks (section 6), so one function,
// `apply`, decides both: what a command appends, or the code that refuses it.
// Checks run in the order section 6 numbers them; the first that fails names
// the refusal, and nothing is appended.
//
// The rules follow these sections of specs/journal.md:
//   1 bytes and digests   -- canonical(), digest(), parseLine(), the spellings
//   2 the verified workflow, 3 the authority policy -- loadAuthority()
//   4 the header, 5 events -- the forms HEADER and eventForm()
//   6 commands and requests -- readCommand() (the JSON form), apply() (rules 1 to 6 in order)
//   7 replay and the projection -- replay(), project()
// The node states and events are those of specs/machines/node.toml (machines.js).
// The conformance layers `journal` and `journal-append` (specs/conformance.md)
// are replayCase() and appendCase().
//
// The workflow and policy are always the fixture pack's, which are valid:
// loadAuthority() derives what the rules look up (topological order,
// independence both ways, the digests) and checks that the policy binds the
// workflow, but not the rest of section 2's shape rules.
//
// The journal has no clock of its own: an event's time is the `now` it is given.

"use strict";

const crypto = require("crypto");
const { step } = require("./machines");
const { isIdentifier: isId, isUnicodeText, codePoints, parseTime } = require("./values");

const FORMAT = "fencekeeper.journal/1";
// Free text given with a command: at most this many code points, checked when it is appended (section 6, rule 2).
const MAX_TEXT = 2000;
// A record's digest names its hash (section 1), unlike an Operation's bare input digest (operations.js).
const DIGEST = /^sha256:[0-9a-f]{64}$/;
const MAX_WHOLE = Number.MAX_SAFE_INTEGER; // 2^53 - 1: the largest whole number a record may hold (section 1)
// The two events a transition command may not carry: they belong to the batch commands.
const BATCH_EVENTS = { "work-invalidated": "invalidate", "successor-bound": "bind-successor" };
// The attempt statuses of section 7 that leave an attempt open.
const OPEN = new Set(["authorized", "active", "blocked"]);

class JournalError extends Error {
  constructor(code, ordinal = null) {
    super(code);
    this.code = code;
    this.ordinal = ordinal;
  }
}

const fail = (code) => {
  throw new JournalError(code);
};

// A batch command that leaves out nodes its request must cover.  Replay
// needs to tell this from every other refusal: a batch cut short by a record
// it cannot read is reported as that record (section 7, the last paragraph).
const failLeavesOut = (code) => {
  const err = new JournalError(code);
  err.leavesOut = true;
  throw err;
};

// --- 1. Bytes and digests --------------------------------------------------------------

// The RFC 8785 form of a value.  JSON.stringify already writes strings and
// whole numbers as JCS does; only member order is left to do.  A string with
// an unpaired surrogate has no UTF-8 form and so no canonical bytes: that is
// `malformed_record`, never a U+FFFD carried on (section 1, "Text is Unicode").
function canonical(value) {
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "string") {
    if (!value.isWellFormed()) fail("malformed_record");
    return JSON.stringify(value);
  }
  if (typeof value === "number") {
    // No floats: only whole numbers a double holds exactly (section 1, "No floats").
    if (!Number.isSafeInteger(value)) fail("malformed_record");
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  // Array.prototype.sort compares UTF-16 code units, which is JCS's member order.
  const names = Object.keys(value).sort();
  return `{${names.map((name) => `${canonical(name)}:${canonical(value[name])}`).join(",")}}`;
}

function digest(value) {
  return `sha256:${crypto.createHash("sha256").update(canonical(value), "utf8").digest("hex")}`;
}

// A record's own digest covers the record without its `digest` member (section 1).
function ownDigest(record) {
  const rest = { ...record };
  delete rest.digest;
  return digest(rest);
}

const isDigest = (v) => typeof v === "string" && DIGEST.test(v);

// The spelling is fixed, and it must name a real instant (no 31 February, no 24:00): values.js.
const isTime = (v) => parseTime(v) !== null;

// --- Reading JSON values against a form -----------------------------------------------
//
// A form is a small description of a record: the exact members of an object,
// the type of each.  `read` refuses a value that does not fit with the codes of
// section 5 (and of section 6, "The JSON form of a command"):
// a member not in the form `unknown_field`, one absent `missing_field` (unless
// the form lists it in `optional`), one of another type or value
// `malformed_record`.  Every unknown member of an object is reported before
// any missing one, and both before its members' values, read in order.

const T = {
  string: (v) => typeof v === "string",
  // A number with a fraction, or beyond 2^53 - 1, is no number of a record (section 1).
  whole: (v) => typeof v === "number" && Number.isSafeInteger(v),
  digest: isDigest,
  time: isTime,
};

function read(value, form) {
  if (typeof form === "function") {
    if (!form(value)) fail("malformed_record");
    return;
  }
  if (form.nullable) {
    if (value !== null) read(value, form.nullable);
    return;
  }
  if (form.array) {
    if (!Array.isArray(value)) fail("malformed_record");
    value.forEach((item) => read(item, form.array));
    return;
  }
  if (form.members) {
    if (value === null || typeof value !== "object" || Array.isArray(value)) fail("malformed_record");
    const names = Object.keys(form.members);
    const optional = form.optional || {};
    if (Object.keys(value).some((name) => !names.includes(name))) fail("unknown_field");
    if (names.some((name) => !(name in value) && !(name in optional))) fail("missing_field");
    // Members are read in the form's order: it is the order the spec gives the JSON form.
    for (const name of names) if (name in value) read(value[name], form.members[name]);
    return;
  }
  throw new Error(`no such form ${JSON.stringify(form)}`);
}

// The node machine's events and states, for reading records and commands (section 5).
function nodeForms(machine) {
  const states = new Set(machine.states);
  const events = new Set(machine.events);
  return { state: (v) => states.has(v), event: (v) => events.has(v) };
}

// --- 2, 3. The verified workflow and the authority policy --------------------------------

// The workflow written out whole, every member present: its digest is over this form (section 2).
function fullWorkflow(workflow) {
  return {
    workflow: workflow.workflow,
    nodes: workflow.nodes.map((n) => ({
      id: n.id,
      kind: n.kind,
      predecessors: n.predecessors || [],
      roles: n.roles || [],
      outputs: n.outputs || [],
      independent_of: n.independent_of || [],
      approval: n.approval === undefined ? null : n.approval,
    })),
  };
}

// Kahn's algorithm, always taking the earliest written node that is free (section 2, "Topological order").
function topologicalOrder(nodes) {
  const placed = new Set();
  const order = [];
  while (order.length < nodes.length) {
    const next = nodes.find((n) => !placed.has(n.id) && n.predecessors.every((p) => placed.has(p)));
    if (next === undefined) fail("workflow_cycle");
    placed.add(next.id);
    order.push(next.id);
  }
  return order;
}

// The policy as it is digested: the flag written out, and `invalidation_policies`
// only when it lists something, so a policy declaring none keeps the bytes it
// had before the member existed (section 3, "Invalidation policies").
function fullPolicy(policy) {
  const full = { ...policy };
  const declared = (policy.invalidation_policies || []).map((p) => ({
    policy: p.policy,
    roles: p.roles,
    automation_may_invalidate_human_work: p.automation_may_invalidate_human_work === true,
  }));
  delete full.invalidation_policies;
  if (declared.length > 0) full.invalidation_policies = declared;
  return full;
}

// The workflow and policy a journal is written under, with what the rules look up in them.
// The cases give the fixture pack's workflow and policy, which are valid; a
// policy that does not bind this workflow is still refused, since every
// header check depends on it (section 3).
function loadAuthority(workflowJson, policyJson) {
  const workflow = fullWorkflow(workflowJson);
  const nodes = new Map(workflow.nodes.map((n) => [n.id, n]));
  const order = topologicalOrder(workflow.nodes);
  // "Holds both ways": a node is independent of those it names and of those naming it (section 2).
  const independent = new Map(workflow.nodes.map((n) => [n.id, new Set(n.independent_of)]));
  for (const n of workflow.nodes) for (const other of n.independent_of) independent.get(other).add(n.id);
  const children = new Map(workflow.nodes.map((n) => [n.id, []]));
  for (const n of workflow.nodes) for (const p of n.predecessors) children.get(p).push(n.id);
  const policy = fullPolicy(policyJson);
  const workflowDigest = digest(workflow);
  const actors = new Map(policy.assignments.map((a) => [a.actor, a]));
  const invalidationPolicies = new Map((policy.invalidation_policies || []).map((p) => [p.policy, p]));
  const approver = actors.get(policy.approved_by);
  if (policy.workflow_digest !== workflowDigest || actors.size !== policy.assignments.length
      || approver === undefined || approver.kind !== "human") fail("unverified_authority");
  return {
    workflow, nodes, order, independent, children, policy, actors, invalidationPolicies,
    workflowDigest, policyDigest: digest(policy),
  };
}

// --- 4, 5. Records ----------------------------------------------------------------------

const RECORD_REF = { members: { kind: T.string, id: T.string, digest: T.digest } };

const HEADER = {
  members: {
    format: T.string, execution: T.string, workflow_digest: T.digest, policy_digest: T.digest,
    protocol: T.string, nodes: { array: T.string }, created_by: T.string, created_at: T.time,
    supersedes: { nullable: T.string }, digest: T.digest,
  },
};

function eventForm(node) {
  return {
    members: {
      execution: T.string, ordinal: T.whole, previous: T.digest,
      request: { members: { id: T.string, digest: T.digest } },
      node: T.string, event: node.event, prior_state: node.state, resulting_state: node.state,
      actor: T.string, role: T.string, at: T.time, rationale: T.string,
      // A sequence below 0 is no sequence at all; 0 is one that numbers no attempt (rule 1, in step 3).
      attempt: { nullable: { members: { id: T.string, sequence: (v) => T.whole(v) && v >= 0 } } },
      records: { array: RECORD_REF },
      approvals: { array: { members: { actor: T.string, role: T.string, record: RECORD_REF } } },
      error: { nullable: T.string },
      invalidation: { nullable: { members: { source: RECORD_REF, policy: T.string } } },
      successor: { nullable: RECORD_REF },
      digest: T.digest,
    },
  };
}

// One line of a chain or header file: the record's canonical bytes, and exactly those (sections 1 and 9).
function parseLine(line) {
  let value;
  try {
    value = JSON.parse(line);
  } catch (err) {
    fail("non_canonical");
  }
  // NaN and Infinity are not JSON, so JSON.parse has already refused them as non_canonical.
  // A value with no canonical bytes (a lone surrogate, a float) is malformed_record, raised by canonical().
  if (value === null || typeof value !== "object" || Array.isArray(value)) fail("malformed_record");
  // JSON.parse reads 3.0 as 3, but the record held a float, which no record may (section 1).
  if (writesFraction(line)) fail("malformed_record");
  if (canonical(value) !== line) fail("non_canonical");
  return value;
}

// Whether a JSON text writes a number with a fraction or an exponent, outside its strings.
function writesFraction(text) {
  let inString = false;
  for (let i = 0; i < text.length; i += 1) {
    const ch = text[i];
    if (inString) {
      if (ch === "\\") i += 1;
      else if (ch === '"') inString = false;
    } else if (ch === '"') {
      inString = true;
    } else if (ch === ".") {
      return true; // outside a string, only a number's fraction
    } else if ((ch === "e" || ch === "E") && /[0-9]/.test(text[i - 1] || "")) {
      return true; // an exponent follows a digit; the e of true and false does not
    }
  }
  return false;
}

// A header, strictly decoded: its bytes, members, digest (section 7, step 1, up to the binding).
function decodeHeader(line) {
  const header = parseLine(line);
  read(header, HEADER);
  if (header.format !== FORMAT) fail("malformed_record");
  if (ownDigest(header) !== header.digest) fail("altered_digest");
  return header;
}

// Whether a header binds the workflow and policy it is replayed with (section 4).
function checkBinding(header, auth) {
  const creator = auth.actors.get(header.created_by);
  if (header.workflow_digest !== auth.workflowDigest || header.policy_digest !== auth.policyDigest
      || header.protocol !== auth.policy.protocol || header.nodes.join("\u0000") !== auth.order.join("\u0000")
      || creator === undefined || creator.kind !== "human") fail("unverified_authority");
  // Read under the rules the header was written under: identifiers, and no execution superseding itself.
  if (!isId(header.execution) || (header.supersedes !== null && !isId(header.supersedes))) fail("malformed_record");
  if (header.supersedes === header.execution) fail("bad_successor_binding");
}

// --- 7. The projection ------------------------------------------------------------------

// The journal as replay derives it: never stored, always rebuilt from the records.
function emptyJournal(auth, header) {
  const states = new Map();
  for (const n of auth.workflow.nodes) states.set(n.id, n.predecessors.length === 0 ? "ready" : "pending");
  return {
    header,
    head: header.digest,
    count: 0,
    states,
    attempts: new Map(auth.workflow.nodes.map((n) => [n.id, []])),
    requests: new Map(), // request id -> request digest
    workedOn: new Map(auth.workflow.nodes.map((n) => [n.id, new Set()])), // node -> actors who did work on it
  };
}

// Extend the projection by one event (section 7, "The projection").
function project(journal, auth, event) {
  const history = journal.attempts.get(event.node);
  const last = history[history.length - 1];
  switch (event.event) {
    case "work-started":
      if (last !== undefined && last.status === "authorized") last.status = "active";
      else history.push({ id: event.attempt.id, sequence: event.attempt.sequence, status: "active", ended_by: null });
      break;
    case "retry-authorized":
      history.push({ id: event.attempt.id, sequence: event.attempt.sequence, status: "authorized", ended_by: null });
      break;
    case "work-blocked": last.status = "blocked"; break;
    case "block-cleared": last.status = "active"; break;
    case "work-completed": last.status = "completed"; break;
    case "work-failed": last.status = "failed"; break;
    case "work-invalidated":
      // The invalidation ends the open attempt: it could never complete or fail now.
      if (last !== undefined && OPEN.has(last.status)) {
        last.status = "invalidated";
        last.ended_by = event.ordinal;
      }
      break;
    default: break;
  }
  // Work is a transition other than dependencies-satisfied; invalidating and binding are not work (section 6, rule 5).
  if (!(event.event in BATCH_EVENTS) && event.event !== "dependencies-satisfied") {
    journal.workedOn.get(event.node).add(event.actor);
  }
  journal.states.set(event.node, event.resulting_state);
  journal.requests.set(event.request.id, event.request.digest);
  journal.head = event.digest;
  journal.count = event.ordinal;
}

// --- 6. Commands ------------------------------------------------------------------------

// The request digest covers the command without its id and without the time (section 6).
function requestDigest(command) {
  const common = { command: command.command, actor: command.actor, expected_head: command.expected_head,
    rationale: command.rationale, role: command.role };
  if (command.command === "transition") {
    return digest({ ...common, approvals: command.approvals, attempt: command.attempt, error: command.error,
      event: command.event, node: command.node, prior_state: command.prior_state, records: command.records });
  }
  const nodes = [...command.nodes].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  if (command.command === "invalidate") {
    return digest({ ...common, nodes, policy: command.policy, source: command.source });
  }
  return digest({ ...common, nodes, successor: command.successor });
}

// Rule 1: the shape of a command (invalid_request).
function checkShape(c) {
  const ok = (cond) => {
    if (!cond) fail("invalid_request");
  };
  const ref = (r) => ok(isId(r.kind) && isId(r.id) && isDigest(r.digest));
  // Text is Unicode (section 1): no unpaired surrogate, but NUL is text, escaped as JSON escapes it.
  const text = (t) => ok(isUnicodeText(t));
  ok(isId(c.request) && isId(c.actor) && isId(c.role) && isDigest(c.expected_head));
  text(c.rationale);
  if (c.command === "transition") {
    ok(isId(c.node));
    if (c.attempt !== null) {
      ok(isId(c.attempt.id) && Number.isInteger(c.attempt.sequence)
        && c.attempt.sequence >= 1 && c.attempt.sequence <= MAX_WHOLE);
    }
    if (c.error !== null) text(c.error);
    c.records.forEach(ref);
    const seen = new Set(c.records.map((r) => `${r.kind}\u0000${r.id}`));
    ok(seen.size === c.records.length);
    for (const a of c.approvals) {
      ok(isId(a.actor) && isId(a.role));
      ref(a.record);
    }
    ok(!(c.event in BATCH_EVENTS));
    return;
  }
  ok(c.nodes.length > 0 && new Set(c.nodes.map((n) => n.node)).size === c.nodes.length);
  c.nodes.forEach((n) => ok(isId(n.node)));
  if (c.command === "invalidate") {
    ref(c.source);
    ok(isId(c.policy));
  } else {
    ref(c.successor);
  }
}

// Rule 4 for one node: it exists, is in the stated state, and the table has the event from there.
function checkNode(journal, auth, machine, node, prior, event, withTable = true) {
  if (!auth.nodes.has(node)) fail("unknown_node");
  if (journal.states.get(node) !== prior) fail("prior_state_mismatch");
  if (!withTable) return null;
  const target = step(machine, prior, event);
  if (target === null) fail("invalid_transition");
  return target;
}

const holdsRole = (auth, actor, role) => {
  const a = auth.actors.get(actor);
  return a !== undefined && a.roles.includes(role);
};
const isHuman = (auth, actor) => {
  const a = auth.actors.get(actor);
  return a !== undefined && a.kind === "human";
};

// Rule 6, approvals on an approval node's completion: each in turn, then all together.
function checkApprovals(auth, node, approvals) {
  const requirement = node.approval;
  const admitted = requirement.roles.length > 0 ? requirement.roles : node.roles;
  for (const a of approvals) {
    if (!holdsRole(auth, a.actor, a.role)) fail("forged_role");
    if (!admitted.includes(a.role)) fail("invalid_approval");
    if (requirement.human_only && !isHuman(auth, a.actor)) fail("invalid_approval");
  }
  const records = new Set(approvals.map((a) => `${a.record.kind}\u0000${a.record.id}`));
  const decisions = new Set(approvals.map((a) => `${a.actor}\u0000${a.role}`));
  const actors = new Set(approvals.map((a) => a.actor));
  if (records.size !== approvals.length) fail("invalid_approval");
  if (approvals.length < requirement.minimum) fail("invalid_approval");
  if (requirement.distinct_actors && actors.size !== approvals.length) fail("invalid_approval");
  if (decisions.size !== approvals.length) fail("invalid_approval");
  if (requirement.roles.some((role) => !approvals.some((a) => a.role === role))) fail("invalid_approval");
}

// Rule 6 for a transition's attempt: which attempt the event must bind.
function checkAttempt(history, event, attempt) {
  const last = history[history.length - 1];
  const bad = () => fail("invalid_attempt");
  if (event === "dependencies-satisfied") {
    if (attempt !== null) bad();
    return;
  }
  if (attempt === null) bad();
  const isNew = () => !history.some((a) => a.id === attempt.id) && attempt.sequence === history.length + 1;
  if (event === "work-started") {
    if (last !== undefined && last.status === "authorized") {
      if (attempt.id !== last.id || attempt.sequence !== last.sequence) bad();
    } else if (!isNew()) bad();
    return;
  }
  if (event === "retry-authorized") {
    if (!isNew()) bad();
    return;
  }
  // Blocked, cleared, completed, failed: the current attempt, the open one.
  if (last === undefined || attempt.id !== last.id || attempt.sequence !== last.sequence) bad();
}

function transition(journal, auth, machine, c) {
  const node = auth.nodes.get(c.node);
  const target = checkNode(journal, auth, machine, c.node, c.prior_state, c.event);
  // Rule 5: authority.
  if (!holdsRole(auth, c.actor, c.role)) fail("forged_role");
  if (c.event !== "dependencies-satisfied" && node.roles.length > 0 && !node.roles.includes(c.role)) fail("forged_role");
  const needsHuman = node.kind === "human"
    ? c.event !== "dependencies-satisfied"
    : (node.kind === "hybrid" || node.kind === "approval") && (c.event === "work-completed" || c.event === "retry-authorized");
  if (needsHuman && !isHuman(auth, c.actor)) fail("automation_claims_human");
  if (c.event !== "dependencies-satisfied") {
    for (const other of auth.independent.get(c.node)) {
      if (journal.workedOn.get(other).has(c.actor)) fail("not_independent");
    }
  }
  // Rule 6: the event's own rules.
  if (c.event === "dependencies-satisfied" && node.predecessors.some((p) => journal.states.get(p) !== "completed")) {
    fail("dependency_gap");
  }
  checkAttempt(journal.attempts.get(c.node), c.event, c.attempt);
  // An error says what went wrong, so only a failure carries one, and never an empty one.
  if (c.event === "work-failed" ? typeof c.error !== "string" || c.error === "" : c.error !== null) fail("invalid_request");
  if (c.event === "work-completed"
      && node.outputs.some((o) => !c.records.some((r) => r.kind === o.kind && r.id === o.id))) {
    fail("missing_declared_output");
  }
  if (c.approvals.length > 0 && !(node.kind === "approval" && c.event === "work-completed")) fail("invalid_approval");
  if (node.kind === "approval" && c.event === "work-completed") checkApprovals(auth, node, c.approvals);
  return [{ node: c.node, event: c.event, prior_state: c.prior_state, resulting_state: target,
    attempt: c.attempt, records: c.records, approvals: c.approvals, error: c.error,
    invalidation: null, successor: null }];
}

function invalidate(journal, auth, machine, c) {
  const named = new Set(c.nodes.map((n) => n.node));
  for (const n of c.nodes) checkNode(journal, auth, machine, n.node, n.prior_state, "work-invalidated");
  const declared = auth.invalidationPolicies.get(c.policy);
  if (declared === undefined) fail("unverified_authority");
  // Undoing work is not doing it: the invalidation policy's roles decide, not the node's.
  if (!holdsRole(auth, c.actor, c.role) || !declared.roles.includes(c.role)) fail("forged_role");
  // The batch: the named nodes and every descendant still current.
  const batch = new Set(named);
  const queue = [...named];
  while (queue.length > 0) {
    for (const child of auth.children.get(queue.shift())) {
      const state = journal.states.get(child);
      if (!batch.has(child) && state !== "invalidated" && state !== "superseded") {
        batch.add(child);
        queue.push(child);
      }
    }
  }
  if ([...batch].some((n) => !named.has(n))) failLeavesOut("partial_invalidation");
  if (auth.actors.get(c.actor).kind === "automation" && !declared.automation_may_invalidate_human_work) {
    const humanWork = (n) => [...journal.workedOn.get(n)].some((actor) => isHuman(auth, actor));
    if ([...batch].some(humanWork)) fail("automation_claims_human");
  }
  const priors = new Map(c.nodes.map((n) => [n.node, n.prior_state]));
  return auth.order.filter((n) => batch.has(n)).map((n) => ({
    node: n, event: "work-invalidated", prior_state: priors.get(n), resulting_state: step(machine, priors.get(n), "work-invalidated"),
    attempt: null, records: [], approvals: [], error: null,
    invalidation: { source: c.source, policy: c.policy }, successor: null,
  }));
}

function bindSuccessor(journal, auth, c, headers) {
  const execution = journal.header.execution;
  if (c.successor.kind !== "execution" || c.successor.id === execution) fail("bad_successor_binding");
  for (const n of c.nodes) checkNode(journal, auth, null, n.node, n.prior_state, "successor-bound", false);
  // Bound only to invalidated work, and to all of it.
  if (c.nodes.some((n) => n.prior_state !== "invalidated")) fail("bad_successor_binding");
  const invalidated = [...journal.states].filter(([, state]) => state === "invalidated");
  if (invalidated.length !== c.nodes.length) failLeavesOut("bad_successor_binding");
  if (!holdsRole(auth, c.actor, c.role)) fail("forged_role");
  if (!isHuman(auth, c.actor)) fail("automation_claims_human");
  // Without a header lookup nothing can show the successor takes over from this execution.
  const header = headers === null ? undefined : headers.get(c.successor.id);
  if (header === undefined || header.execution !== c.successor.id || header.digest !== c.successor.digest
      || header.supersedes !== execution || header.workflow_digest !== journal.header.workflow_digest) {
    fail("bad_successor_binding");
  }
  const named = new Set(c.nodes.map((n) => n.node));
  return auth.order.filter((n) => named.has(n)).map((n) => ({
    node: n, event: "successor-bound", prior_state: "invalidated", resulting_state: "superseded",
    attempt: null, records: [], approvals: [], error: null, invalidation: null, successor: c.successor,
  }));
}

// Decide one command against the journal: { unchanged: true }, or the events
// it appends (each a whole record, digest included), or a JournalError.
// `options`: now (the events' time), resolves (null, or a Set of
// "kind\0id\0digest" the resolver finds), headers (null, or execution id ->
// decoded header), replay (true when rebuilding a stored event: the free-text
// bound is not applied, section 6 rule 2).
function apply(journal, auth, machine, c, options) {
  checkShape(c);
  const requestDigestValue = requestDigest(c);
  // Rule 2: a recorded request is a repeat or a conflict, whatever else it says.
  if (journal.requests.has(c.request)) {
    if (!options.replay && journal.requests.get(c.request) === requestDigestValue) return { unchanged: true };
    fail("conflicting_request");
  }
  if (!options.replay) {
    if (codePoints(c.rationale) > MAX_TEXT) fail("invalid_request");
    if (c.command === "transition" && c.error !== null && codePoints(c.error) > MAX_TEXT) fail("invalid_request");
  }
  // Rule 3: the head, then the references.
  if (c.expected_head !== journal.head) fail("stale_head");
  if (options.resolves !== null) {
    const refs = c.command === "transition" ? [...c.records, ...c.approvals.map((a) => a.record)]
      : c.command === "invalidate" ? [c.source] : [];
    if (refs.some((r) => !options.resolves.has(`${r.kind}\u0000${r.id}\u0000${r.digest}`))) fail("unresolved_record");
  }
  let bodies;
  if (c.command === "transition") bodies = transition(journal, auth, machine, c);
  else if (c.command === "invalidate") bodies = invalidate(journal, auth, machine, c);
  else bodies = bindSuccessor(journal, auth, c, options.headers);
  // Chain the events: each names the head before it.
  let previous = journal.head;
  return {
    events: bodies.map((body, index) => {
      const event = { execution: journal.header.execution, ordinal: journal.count + index + 1, previous,
        request: { id: c.request, digest: requestDigestValue }, ...body, actor: c.actor, role: c.role,
        at: options.now, rationale: c.rationale };
      event.digest = ownDigest(event);
      previous = event.digest;
      return event;
    }),
  };
}

// --- The command's JSON form (specs/journal.md, section 6, "The JSON form of a command") ----

// Read before rule 1: a value the form does not take is unknown_field,
// missing_field or malformed_record.  A record reference's digest is spelled
// here, as a stored event's references are; `expected_head`'s spelling is left
// to rule 1 (invalid_request), as the section says.  The sequence need only
// be a whole number from 0 here; that 0 numbers no attempt is rule 1's.
function commandForm(kind, node) {
  const ref = { members: { kind: T.string, id: T.string, digest: T.digest } };
  const nodes = { array: { members: { node: T.string, prior_state: node.state } } };
  const common = { command: T.string, request: T.string, expected_head: T.string, actor: T.string,
    role: T.string, rationale: T.string };
  if (kind === "transition") {
    return {
      members: { ...common,
        attempt: { nullable: { members: { id: T.string, sequence: (v) => T.whole(v) && v >= 0 } } },
        approvals: { array: { members: { actor: T.string, role: T.string, record: ref } } },
        node: T.string, event: node.event, prior_state: node.state, records: { array: ref },
        error: { nullable: T.string } },
      optional: { rationale: "", attempt: null, approvals: [], records: [], error: null },
    };
  }
  if (kind === "invalidate") return { members: { ...common, nodes, source: ref, policy: T.string }, optional: { rationale: "" } };
  return { members: { ...common, nodes, successor: ref }, optional: { rationale: "" } };
}

// The command a JSON value states, its omitted members filled in.  There is
// no head to fill in here, so `expected_head` is required (the command line
// fills it from the command before; the conformance layer has no such head).
function readCommand(value, machine) {
  if (value === null || typeof value !== "object" || Array.isArray(value)
      || !["transition", "invalidate", "bind-successor"].includes(value.command)) fail("malformed_record");
  const form = commandForm(value.command, nodeForms(machine));
  read(value, form);
  return { ...form.optional, ...value };
}

// --- 7. Replay ----------------------------------------------------------------------------

// The command a stored event, or a batch of them, records (section 7, step 3).
function rebuild(events) {
  const [first] = events;
  // An invalidation or binding whose record lacks its source or successor records no command at all.
  if ((first.event === "work-invalidated" && first.invalidation === null)
      || (first.event === "successor-bound" && first.successor === null)) fail("malformed_record");
  const common = { request: first.request.id, expected_head: first.previous, actor: first.actor,
    role: first.role, rationale: first.rationale };
  if (first.event === "work-invalidated") {
    return { command: "invalidate", ...common, source: first.invalidation.source, policy: first.invalidation.policy,
      nodes: events.map((e) => ({ node: e.node, prior_state: e.prior_state })) };
  }
  if (first.event === "successor-bound") {
    return { command: "bind-successor", ...common, successor: first.successor,
      nodes: events.map((e) => ({ node: e.node, prior_state: e.prior_state })) };
  }
  return { command: "transition", ...common, node: first.node, event: first.event, prior_state: first.prior_state,
    attempt: first.attempt, records: first.records, approvals: first.approvals, error: first.error };
}

// Compare what the rebuilt command appends with what is stored, record by record (section 7, step 3).
function compare(produced, stored) {
  for (let i = 0; i < stored.length; i += 1) {
    const p = produced[i];
    const s = stored[i];
    if (p === undefined) fail("malformed_record");
    if (p.resulting_state !== s.resulting_state) fail("invalid_transition");
    if (p.request.digest !== s.request.digest) fail("altered_digest");
    if (canonical(p) !== canonical(s)) fail("malformed_record");
  }
}

// Replay a chain (its lines as stored) into the journal it describes, or throw
// a JournalError naming the ordinal of the first bad record.
function replay(lines, auth, machine, headers) {
  const at = (ordinal, fn) => {
    try {
      return fn();
    } catch (err) {
      if (err instanceof JournalError && err.ordinal === null) err.ordinal = ordinal;
      throw err;
    }
  };
  const header = at(0, () => {
    const h = decodeHeader(lines[0]);
    checkBinding(h, auth);
    return h;
  });
  const journal = emptyJournal(auth, header);
  const form = eventForm(nodeForms(machine));
  let index = 1;
  while (index < lines.length) {
    const first = readEvent(lines[index], form, journal, index, at);
    const batch = [first];
    // A batch is one request's consecutive invalidations or bindings, read
    // whole before its command is checked, up to a record of another request
    // or one that cannot be read.
    let unreadable = null;
    if (first.event in BATCH_EVENTS) {
      while (index + batch.length < lines.length) {
        const ordinal = index + batch.length;
        const after = { ...journal, head: batch[batch.length - 1].digest, count: ordinal - 1 };
        let next;
        try {
          next = readEvent(lines[ordinal], form, after, ordinal, at);
        } catch (err) {
          if (!(err instanceof JournalError)) throw err;
          unreadable = err;
          break;
        }
        if (next.event !== first.event || next.request.id !== first.request.id) break;
        batch.push(next);
      }
    }
    at(index, () => {
      try {
        const command = rebuild(batch);
        const result = apply(journal, auth, machine, command, { now: first.at, resolves: null, headers, replay: true });
        compare(result.events, batch);
      } catch (err) {
        // Left out because a record could not be read: that record is what happened.
        if (err instanceof JournalError && err.leavesOut && unreadable !== null) throw unreadable;
        throw err;
      }
    });
    for (const event of batch) project(journal, auth, event);
    index += batch.length;
  }
  return journal;
}

// Section 7, step 2, for one event: bytes, members and types, digest, execution, previous, ordinal.
function readEvent(line, form, journal, ordinal, at) {
  return at(ordinal, () => {
    const event = parseLine(line);
    read(event, form);
    if (ownDigest(event) !== event.digest) fail("altered_digest");
    if (event.execution !== journal.header.execution) fail("foreign_record");
    if (event.previous !== journal.head) fail("broken_chain");
    if (event.ordinal !== journal.count + 1) fail("ordinal_gap");
    return event;
  });
}

// The header lookup of a case: its header lines, strictly decoded, by execution id.
function headerLookup(lines) {
  const headers = new Map();
  for (const line of lines) {
    const header = decodeHeader(line);
    headers.set(header.execution, header);
  }
  return headers;
}

// --- The conformance layer ------------------------------------------------------------------

// One `journal-append` case: replay the chain, append the command, say what happened.
function appendCase(machines, input) {
  const machine = machines.node;
  const auth = loadAuthority(input.workflow, input.policy);
  const headers = headerLookup(input.headers);
  // The chain is valid (the layer says so): an error here is the driver's, not a refusal.
  const journal = replay(input.chain, auth, machine, headers);
  const resolves = input.resolves === null ? null
    : new Set(input.resolves.map((r) => `${r.kind}\u0000${r.id}\u0000${r.digest}`));
  try {
    const command = readCommand(input.command, machine);
    const result = apply(journal, auth, machine, command, { now: input.now, resolves, headers, replay: false });
    if (result.unchanged) return { outcome: "unchanged", head: journal.head };
    const records = result.events.map((e) => e.digest);
    return { outcome: "appended", head: records[records.length - 1], records };
  } catch (err) {
    if (err instanceof JournalError) return { outcome: "refused", code: err.code };
    throw err;
  }
}

// One `journal` case: replay a chain of the fixture pack, and say what it holds or where it breaks.
function replayCase(machines, input) {
  const machine = machines.node;
  const auth = loadAuthority(input.workflow, input.policy);
  const headers = headerLookup(input.headers);
  let journal;
  try {
    journal = replay(input.chain, auth, machine, headers);
  } catch (err) {
    if (err instanceof JournalError) return { valid: false, code: err.code, ordinal: err.ordinal };
    throw err;
  }
  const states = {};
  const attempts = {};
  for (const node of auth.workflow.nodes) {
    states[node.id] = journal.states.get(node.id);
    // Only a node that has an attempt has a history to show (specs/conformance.md, `journal`).
    const history = journal.attempts.get(node.id);
    if (history.length > 0) attempts[node.id] = history.map((a) => ({ id: a.id, sequence: a.sequence, status: a.status }));
  }
  return { valid: true, code: null, ordinal: null, head: journal.head, events: journal.count, states, attempts };
}

module.exports = { appendCase, replayCase, replay, loadAuthority, headerLookup, canonical, digest, JournalError };
