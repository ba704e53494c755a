// An in-memory store: the store layer of specs/conformance.md ("`store`", its call table and
// "Holds"), applying this implementation's own decisions (protocol.js, recovery.js).
//
// Rules this module keeps:
// - It decides nothing itself.  Each call reads the rows it needs, asks the decision
//   (specs/protocol.md, "Shape of a decision"), and writes a Decision only if its guard holds
//   on the rows as they are at commit (specs/protocol.md, "The guard"); a refusal or an
//   `unchanged` writes nothing.
// - A call is one transaction: it works on a copy of everything the store holds, and the copy
//   replaces the store only when the call commits, so a call that fails half-way (an evidence
//   conflict after its decision was made) leaves nothing behind.
// - Writers are serialised by one lock: a session held inside its transaction (at its
//   commit, or at its first clock read) keeps every other session waiting until it commits,
//   so a race ends in one of its serial orders (specs/conformance.md, step 3 of a race: "a
//   store that serialises writers makes it wait for a").
// - Time is the store's clock, which the driver sets to each step's `now`; a call reads it
//   once, inside its transaction (specs/protocol.md, "Shape of a decision"; seed 001, Claims,
//   leases, and fencing: "PostgreSQL time controls eligibility and lease expiry").
// - Identities are one space: an execution and an evidence object never share one
//   (specs/conformance.md, `admit` of an id evidence holds is `already_exists`).
// - Events (specs/interpreter.md, Events): the request is checked alone before the store is
//   read; publishing commits the Event and wakes, in the same transaction, every open
//   registration it matches; a finalization to waiting looks for an Event already committed
//   ("The race is closed both ways").  Timers (specs/protocol.md, "Wait registrations close
//   when waiting ends", the store contract for timers).
// - Every revision an execution's decision writes leaves one history record
//   (specs/conformance.md, `history`).

"use strict";

const { decide } = require("./protocol");
const { recover } = require("./recovery");
const v = require("./values");

// --- Events: the request alone (specs/interpreter.md, Events) -----------------------------------

const MAX_CORRELATION = 16;
const MAX_VALUE_LENGTH = 256;
const MAX_PAYLOAD_DEPTH = 32;
const MAX_PAYLOAD_JSON = 65536;
const CORRELATION_NAME = /^[a-z][a-z0-9_]{0,63}$/;
const RESERVED_EVENT_TYPE_PREFIX = "fencekeeper.";

class EventInvalid extends Error {}

// A correlation value kept as its canonical string (specs/interpreter.md, Bindings): a string as
// it is, an integer in decimal, a boolean as `true` / `false`; nothing else has one.
function canonicalValue(value) {
  if (typeof value === "string") return value;
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number" && Number.isInteger(value)) return String(value);
  return null;
}

// The payload's bounds, checked level by level so that no nesting is followed on the stack.
function checkPayload(payload) {
  if (!v.isRecord(payload)) throw new EventInvalid("payload");
  let level = [payload];
  let depth = 0;
  while (level.length > 0) {
    depth += 1;
    if (depth > MAX_PAYLOAD_DEPTH) throw new EventInvalid("payload");
    const next = [];
    for (const item of level) {
      const entries = Array.isArray(item) ? item.map((x) => [null, x]) : Object.entries(item);
      for (const [key, value] of entries) {
        if (key !== null && !v.isStorableText(key)) throw new EventInvalid("payload");
        if (typeof value === "string" && !v.isStorableText(value)) throw new EventInvalid("payload");
        if (typeof value === "number" && !Number.isFinite(value)) throw new EventInvalid("payload");
        if (value !== null && typeof value === "object") next.push(value);
      }
    }
    level = next;
  }
  // Compact JSON, characters other than ASCII as themselves, counted in code points.
  if (v.codePoints(JSON.stringify(payload)) > MAX_PAYLOAD_JSON) throw new EventInvalid("payload");
}

// The Event a publication names, or EventInvalid naming what is at fault.
function eventOf(a) {
  for (const field of ["event_id", "business_id", "event_type"]) {
    if (!v.isIdentifier(a[field])) throw new EventInvalid(field);
  }
  if (a.event_type.startsWith(RESERVED_EVENT_TYPE_PREFIX)) throw new EventInvalid("event_type");
  const given = a.correlation;
  if (!v.isRecord(given)) throw new EventInvalid("correlation");
  const names = Object.keys(given);
  if (names.length < 1 || names.length > MAX_CORRELATION || !names.every((n) => CORRELATION_NAME.test(n))) {
    throw new EventInvalid("correlation");
  }
  const correlation = {};
  for (const name of names) {
    const text = canonicalValue(given[name]);
    if (text === null || v.codePoints(text) > MAX_VALUE_LENGTH || !v.isStorableText(text)) {
      throw new EventInvalid(`correlation.${name}`);
    }
    correlation[name] = text;
  }
  const payload = a.payload === undefined ? null : a.payload;
  if (payload !== null) checkPayload(payload);
  return { event_id: a.event_id, business_id: a.business_id, event_type: a.event_type, correlation, payload };
}

// JSON with members sorted, so that two Events' contents compare as values, not as spellings.
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (v.isRecord(value)) {
    return `{${Object.keys(value).sort(v.byCodePoint).map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

const sameContent = (x, y) => x.business_id === y.business_id && x.event_type === y.event_type
  && canonical(x.correlation) === canonical(y.correlation) && canonical(x.payload) === canonical(y.payload);

// A waiter matches an Event of its Business and exact type whose values equal all its predicates.
const matches = (registration, event) => registration.spec.event_type === event.event_type
  && registration.business_id === event.business_id
  && registration.spec.correlation.every(([name, value]) => event.correlation[name] === value);

// --- rows ---------------------------------------------------------------------------------------

const keyText = (key) => JSON.stringify([key.execution_id, key.node_id, key.attempt_id]);
const keyOut = (key) => ({ execution_id: key.execution_id, node_id: key.node_id, attempt_id: key.attempt_id });
const isOpen = (registration) => registration.woken_by === null && registration.closed_by === null;
const sameKey = (a, b) => a !== null && b !== null && a.execution_id === b.execution_id
  && a.node_id === b.node_id && a.attempt_id === b.attempt_id;

class StoreError extends Error {
  constructor(code) {
    super(code);
    this.code = code;
  }
}

// Everything the store holds.  Maps keep insertion order, which is commit order here.
function emptyRows() {
  return {
    executions: new Map(), dispatches: new Map(), history: new Map(), registrations: new Map(),
    recoveries: new Map(), evidence: new Map(), objects: new Map(), events: new Map(),
  };
}

// A transaction's copy: the maps are copied and their values are never changed in place.
function copyRows(rows) {
  const copy = {};
  for (const [name, map] of Object.entries(rows)) copy[name] = new Map(map);
  return copy;
}

// specs/protocol.md, The guard: the rows at commit are exactly those the decision was made on.
function guardHolds(guard, execution, dispatch, now) {
  if (guard.expected_revision === 0) return execution === null;
  if (execution === null || dispatch === null) return false;
  if (execution.revision !== guard.expected_revision || execution.state !== guard.expected_state) return false;
  if (dispatch.dispatch_state !== guard.expected_dispatch_state) return false;
  if (dispatch.lease_token !== guard.expected_lease_token) return false;
  if (dispatch.lease_expires_at !== guard.expected_lease_expires_at) return false;
  if (execution.fence !== guard.expected_fence) return false;
  return !guard.requires_live_lease || (dispatch.lease_expires_at !== null && now < v.timeOf(dispatch.lease_expires_at));
}

// The history record of a decision that writes an execution revision (specs/conformance.md,
// `history`): who decided, and under which lease and fence the rows were when it did.
function recordOf(call, request, before, beforeDispatch, decision, nowText) {
  const after = decision.execution;
  const admitted = before === null;
  let actor = null;
  if (call === "admit" || call === "wake" || call === "cancel") actor = request.authority.principal_id;
  else if (call === "claim" || call === "finalize") actor = request.worker_id;
  else if (call === "record_step" || call === "release") actor = request.credential.worker_id;
  else if (call === "recover") actor = request.actor_id;
  const linking = call === "recover" && request.kind === "reconcile_command";
  const claimed = call === "claim";
  return {
    execution_id: after.execution_id,
    event: admitted || linking ? null : eventName(call, request),
    from_state: admitted ? null : before.state,
    to_state: after.state,
    revision: after.revision,
    at: nowText,
    actor,
    lease_token: admitted || linking ? null : claimed ? decision.lease.lease_token : beforeDispatch.lease_token,
    fence: claimed ? after.fence : admitted ? 0 : before.fence,
  };
}

function eventName(call, request) {
  if (call === "finalize") return `finalize_${request.target_state}`;
  if (call === "recover") return request.kind;
  return call;
}

// --- the store ----------------------------------------------------------------------------------

class Store {
  constructor(machines) {
    this.machines = machines;
    this.rows = emptyRows();
  }

  // One call in one transaction: `run(tx, now)` works on a copy; `commit()` makes it the store's.
  begin(nowText) {
    return new Transaction(this, nowText);
  }
}

class Transaction {
  constructor(store, nowText) {
    this.store = store;
    this.machines = store.machines;
    this.rows = copyRows(store.rows);
    this.nowText = nowText;
    this.now = v.timeOf(nowText);
    this.wrote = false;
  }

  commit() {
    if (this.wrote) this.store.rows = this.rows;
  }

  load(executionId) {
    return {
      execution: this.rows.executions.get(executionId) ?? null,
      dispatch: this.rows.dispatches.get(executionId) ?? null,
    };
  }

  objectExists(id) {
    return this.rows.executions.has(id) || this.rows.objects.has(id);
  }

  // Write a decision under its guard, with the evidence revisions it carries; false when the
  // guard does not hold (nothing written).  An evidence revision not on top of its object's
  // current one is the store's own refusal, `evidence_conflict`.
  write(call, request, decision, evidence = []) {
    const guard = decision.guard;
    const { execution: before, dispatch: beforeDispatch } = this.load(guard.execution_id);
    if (!guardHolds(guard, before, beforeDispatch, this.now)) return false;
    const id = guard.execution_id;
    const rows = this.rows;
    if (decision.execution !== null) {
      rows.executions.set(id, decision.execution);
      rows.history.set(id, [...(rows.history.get(id) || []),
        recordOf(call, request, before, beforeDispatch, decision, this.nowText)]);
    }
    if (decision.dispatch !== null) rows.dispatches.set(id, decision.dispatch);
    const registration = decision.registration;
    if (registration) {
      const k = keyText(registration.key);
      if (registration.woken_by === null && rows.registrations.has(k)) throw new StoreError("registration_conflict");
      rows.registrations.set(k, registration);
    }
    if (decision.closes) {
      // Closing a registration already closed or woken changes nothing.
      const k = keyText(decision.closes.key);
      const current = rows.registrations.get(k);
      if (current && isOpen(current)) rows.registrations.set(k, { ...current, closed_by: decision.closes.by });
    }
    if (decision.recovery) rows.recoveries.set(decision.recovery.command_id, decision.recovery);
    this.appendObjects(id, evidence);
    this.wrote = true;
    return true;
  }

  // Evidence revisions: a first revision takes a free identity, a later one lands on top of its
  // object's current revision, of the same kind and execution (specs/conformance.md, `append_evidence`).
  appendObjects(executionId, evidence) {
    const rows = this.rows;
    for (const item of evidence) {
      if (item.revision === 1) {
        if (rows.objects.has(item.object_id) || rows.executions.has(item.object_id)) throw new StoreError("evidence_conflict");
      } else {
        const current = rows.objects.get(item.object_id);
        if (!current || current.execution_id !== executionId || current.item.revision !== item.revision - 1
          || current.item.kind !== item.kind) {
          throw new StoreError("evidence_conflict");
        }
      }
      rows.objects.set(item.object_id, { execution_id: executionId, item });
      rows.evidence.set(executionId, [...(rows.evidence.get(executionId) || []), item]);
    }
    if (evidence.length > 0) this.wrote = true;
  }

  // The current revision of each evidence object of an execution, in creation order.
  currentEvidence(executionId) {
    const ids = [...new Set((this.rows.evidence.get(executionId) || []).map((e) => e.object_id))];
    return ids.map((id) => this.rows.objects.get(id).item);
  }

  decide(call, rows, request) {
    return decide(this.machines, { decision: call, rows, request, now: this.nowText });
  }

  // A decision applied: written if it is one, answered whatever it is.
  apply(call, request, outcome, evidence = []) {
    if (outcome.outcome === "decision" && !this.write(call, request, outcome, evidence)) {
      // One lock serialises every writer, so the rows a call read are the rows at its commit.
      throw new Error(`guard of ${call} failed inside its own transaction`);
    }
    return outcome;
  }

  // A wake of a waiter by an Event, with the publisher's (or registrant's) authority.
  wakeByEvent(registration, event, authority) {
    const request = {
      key: registration.key, reason: "event", source_id: event.event_id, business_id: event.business_id,
      authority, event_type: event.event_type,
      correlation: registration.spec.correlation.map(([name]) => [name, event.correlation[name]]),
      outcome: null,
    };
    const rows = { ...this.load(registration.key.execution_id), registration: this.rows.registrations.get(keyText(registration.key)) ?? null };
    return this.apply("wake", request, this.decide("wake", rows, request));
  }
}

// --- the calls (specs/conformance.md, `store`, the call table) ----------------------------------

const CALLS = {
  admit(tx, a) {
    const { execution } = tx.load(a.execution_id);
    const idTaken = execution === null && tx.objectExists(a.execution_id);
    return tx.apply("admit", a, tx.decide("admit", { execution, dispatch: null, id_taken: idTaken }, a));
  },

  claim_next(tx, a) {
    let best = null;
    for (const d of tx.rows.dispatches.values()) {
      if (d.dispatch_state !== "eligible" || v.timeOf(d.eligible_at) > tx.now) continue;
      if (a.business_id != null && tx.rows.executions.get(d.workflow_execution_id).business_id !== a.business_id) continue;
      const at = v.timeOf(d.eligible_at);
      if (best === null || at < best.at || (at === best.at && v.byCodePoint(d.workflow_execution_id, best.id) < 0)) {
        best = { at, id: d.workflow_execution_id };
      }
    }
    if (best === null) return { outcome: "none" };
    const request = { worker_id: a.worker_id, lease_token: a.lease_token, lease_duration: a.lease_duration };
    return tx.apply("claim", request, tx.decide("claim", tx.load(best.id), request));
  },

  renew: (tx, a) => onRows(tx, "renew", a),
  record_step: (tx, a) => onRows(tx, "record_step", a),
  release: (tx, a) => onRows(tx, "release", a),
  cancel: (tx, a) => tx.apply("cancel", a, tx.decide("cancel", tx.load(a.execution_id), a)),

  finalize(tx, a) {
    const rows = tx.load(a.execution_id);
    const outcome = tx.apply("finalize", a, tx.decide("finalize", rows, a));
    const registration = outcome.outcome === "decision" ? outcome.registration : null;
    if (registration && registration.spec.event_type !== null) {
      // The first committed Event that matches wakes the waiter in the same commit.
      const found = [...tx.rows.events.values()].find((event) => matches(registration, event));
      if (found) tx.wakeByEvent(registration, found, a.authority);
    }
    return outcome;
  },

  wake(tx, a) {
    const key = v.isRecord(a.key) ? a.key : null;
    const rows = key === null ? { execution: null, dispatch: null, registration: null }
      : { ...tx.load(key.execution_id), registration: tx.rows.registrations.get(keyText(key)) ?? null };
    return tx.apply("wake", a, tx.decide("wake", rows, a));
  },

  recover: (tx, a) => recovered(tx, a),
  quarantine: (tx, a) => recovered(tx, a),

  append_evidence(tx, a) {
    const request = { credential: a.credential };
    const outcome = tx.decide("fenced", tx.load(a.execution_id), request);
    const items = (a.evidence || []).map((e) => ({
      object_id: e.object_id, kind: e.kind, revision: e.revision, state: e.state ?? null, body: e.body ?? {},
    }));
    return tx.apply("fenced", request, outcome, items);
  },

  due_wakes(tx, a) {
    const due = [];
    for (const r of tx.rows.registrations.values()) {
      if (!isOpen(r) || r.spec.wake_at === null || v.timeOf(r.spec.wake_at) > tx.now) continue;
      if (a.business_id != null && r.business_id !== a.business_id) continue;
      // Only the registration the execution's current revision waits on.
      const execution = tx.rows.executions.get(r.key.execution_id);
      if (!execution || execution.state !== "waiting" || !sameKey(execution.wait, r.key)) continue;
      due.push(r);
    }
    due.sort((x, y) => {
      const dx = v.timeOf(x.spec.wake_at), dy = v.timeOf(y.spec.wake_at);
      return dx < dy ? -1 : dx > dy ? 1 : v.byCodePoint(x.key.execution_id, y.key.execution_id);
    });
    return { outcome: "keys", keys: due.slice(0, a.limit ?? 100).map((r) => keyOut(r.key)) };
  },

  fire_timer(tx, a) {
    const key = a.key;
    const registration = tx.rows.registrations.get(keyText(key)) ?? null;
    const { execution, dispatch } = tx.load(key.execution_id);
    // A declared timeout is its own wake reason, never a matching Event.
    const reason = registration !== null && registration.spec.timeout ? "timeout" : "timer";
    const request = {
      key, reason, source_id: `${key.attempt_id}/${reason}`,
      business_id: execution === null ? "unknown" : execution.business_id,
      authority: a.authority, event_type: null, correlation: [], outcome: null,
    };
    return tx.apply("wake", request, tx.decide("wake", { execution, dispatch, registration }, request));
  },

  publish_event(tx, a) {
    const event = eventOf(a);
    if (!v.isRecord(a.authority) || a.authority.granted !== true) throw new StoreError("not_authorized");
    const existing = tx.rows.events.get(event.event_id);
    if (existing) {
      if (!sameContent(existing, event)) throw new StoreError("event_conflict");
      return { outcome: "published", duplicate: true, woken: [] };
    }
    tx.rows.events.set(event.event_id, event);
    tx.wrote = true;
    const waiters = [...tx.rows.registrations.values()]
      .filter((r) => isOpen(r) && matches(r, event))
      .sort((x, y) => v.byCodePoint(x.key.execution_id, y.key.execution_id));
    const woken = [];
    for (const registration of waiters) {
      if (tx.wakeByEvent(registration, event, a.authority).outcome === "decision") woken.push(registration.key.execution_id);
    }
    return { outcome: "published", duplicate: false, woken: woken.sort(v.byCodePoint) };
  },

  read(tx, a) {
    const { execution, dispatch } = tx.load(a.execution_id);
    if (execution === null || dispatch === null) {
      return { outcome: "view", execution: null, dispatch: null, registrations: [], evidence_revisions: [] };
    }
    const revisions = tx.rows.evidence.get(a.execution_id) || [];
    const order = [...new Set(revisions.map((e) => e.object_id))];
    const sorted = [...revisions].sort((x, y) => (order.indexOf(x.object_id) - order.indexOf(y.object_id))
      || (x.revision - y.revision));
    return {
      outcome: "view", execution, dispatch,
      registrations: [...tx.rows.registrations.values()].filter((r) => r.key.execution_id === a.execution_id),
      evidence_revisions: sorted.map(evidenceOut),
    };
  },

  history(tx, a) {
    if (!tx.rows.executions.has(a.execution_id)) return { outcome: "history", history: null };
    return { outcome: "history", history: tx.rows.history.get(a.execution_id) || [] };
  },

  evidence(tx, a) {
    if (!tx.rows.executions.has(a.execution_id)) return { outcome: "evidence", evidence: null };
    return { outcome: "evidence", evidence: tx.currentEvidence(a.execution_id).map(evidenceOut) };
  },

  expired(tx) {
    const ids = [];
    for (const d of tx.rows.dispatches.values()) {
      if (d.dispatch_state === "claimed" && d.lease_expires_at !== null && v.timeOf(d.lease_expires_at) <= tx.now) {
        ids.push(d.workflow_execution_id);
      }
    }
    return { outcome: "ids", ids: ids.sort(v.byCodePoint) };
  },

  execution_ids(tx, a) {
    const state = a.state ?? null;
    const ids = [...tx.rows.executions.values()].filter((e) => state === null || e.state === state).map((e) => e.execution_id);
    return { outcome: "ids", ids: ids.sort(v.byCodePoint) };
  },
};

// The calls that name their execution beside a request: renew, record_step, release.
function onRows(tx, call, a) {
  const { execution_id: id, ...request } = a;
  return tx.apply(call, request, tx.decide(call, tx.load(id), request));
}

// A governed recovery, on the store's facts read in its own transaction (specs/protocol.md,
// Safe-resume proof): the execution's evidence, no registered definition (the store layer
// registers none), nothing submitted.
function recovered(tx, a) {
  const rows = tx.load(a.execution_id);
  const stored = typeof a.command_id === "string" ? tx.rows.recoveries.get(a.command_id) ?? null : null;
  const facts = { evidence: rows.execution === null ? [] : tx.currentEvidence(a.execution_id).map(evidenceOut),
    definition: null, submitted: [] };
  const outcome = recover(tx.machines, { ...rows, recovery: stored, facts }, a, tx.nowText);
  // The attempts a resume settles are written as revisions; their bodies' detail is text the
  // decision does not answer (specs/conformance.md, `recovery`), so they are kept empty here.
  const objects = outcome.outcome === "decision" ? (outcome.objects || []).map((o) => ({ ...o, body: o.body ?? {} })) : [];
  return tx.apply("recover", a, outcome, objects);
}

const evidenceOut = (e) => ({ object_id: e.object_id, kind: e.kind, revision: e.revision, state: e.state, body: e.body });

// An outcome in the protocol layer's form, whole (specs/conformance.md, `protocol`): a decision
// carries its `recovery`, an `unchanged` answer its `record`, null where there is none.
function wire(outcome) {
  if (outcome.outcome === "decision") {
    const { guard, execution, dispatch, registration, lease, closes } = outcome;
    return { outcome: "decision", guard, execution, dispatch, registration, lease, closes, recovery: outcome.recovery ?? null };
  }
  if (outcome.outcome === "refusal") return { outcome: "refusal", code: outcome.code, field: outcome.field ?? null };
  if (outcome.outcome === "unchanged") return { outcome: "unchanged", code: outcome.code, record: outcome.record ?? null };
  return outcome;
}

// Which calls read the store's clock: the reads of rows alone do not.
const READS_CLOCK = (call) => !["read", "history", "evidence", "execution_ids"].includes(call);

// One step in its transaction: the answer, and whether it has writes to commit.
function run(store, step, nowText) {
  const tx = store.begin(nowText);
  const call = CALLS[step.call];
  if (!call) return { tx, result: { outcome: "error", code: "unknown_call" } };
  try {
    return { tx, result: wire(call(tx, step.args || {})) };
  } catch (err) {
    if (err instanceof EventInvalid) return { tx: null, result: { outcome: "error", code: "invalid_event" } };
    if (err instanceof StoreError) return { tx: null, result: { outcome: "error", code: err.code } };
    throw err;
  }
}

module.exports = { Store, run, READS_CLOCK };
