#!/usr/bin/env node
// A fencekeeper conformance driver in JavaScript (specs/conformance.md, protocol 1.2).
//
// It reads one JSON request per line on stdin and writes one JSON response per
// line on stdout.  It implements all ten layers from specs/ alone:
//   machines        -- the tables of specs/machines/*.toml       (machines.js)
//   protocol        -- the decisions of specs/protocol.md         (protocol.js, approvals.js)
//   recovery        -- its governed `recover` decisions           (recovery.js)
//   expressions     -- the language of specs/expressions.md       (expr.js)
//   definitions     -- a definition read as specs/definitions.md  (definitions.js)
//   interpreter     -- one node visit of specs/interpreter.md     (interpreter.js)
//   journal         -- a chain replayed as specs/journal.md says  (journal.js)
//   journal-append  -- one command appended to a journal          (journal.js)
//   operations      -- the decisions of specs/operations.md       (operations.js)
//   store           -- an in-memory store applying those decisions (store.js)
// What every layer reads alike (a time, an identifier, text, a malformed field) is values.js's.
//
// The store layer's sessions (specs/conformance.md, `store` and Holds): the store takes one
// writer at a time, so a session held inside its transaction (at its commit, or at its first
// read of the clock) keeps every other session's call waiting, answered `pending`, until
// `release` lets it commit; the waiting call then runs, and `await` answers it.  Node runs one
// call at a time anyway: a held call is kept as its uncommitted transaction (commit) or as
// the step not yet begun (clock), never as a paused thread.
//
// Run: fencekeeper conformance --driver "node conformance/drivers/js/driver.js"

"use strict";

const path = require("path");
const readline = require("readline");
const { loadMachines, step } = require("./machines");
const { decide } = require("./protocol");
const { parse, evaluate, ExpressionError } = require("./expr");
const { decideOperation } = require("./operations");
const { definitionCase, parseJson } = require("./definitions");
const { Store, run, READS_CLOCK } = require("./store");

const SPECS = process.env.FENCEKEEPER_SPECS || path.join(__dirname, "..", "..", "..", "specs");
const machines = loadMachines(SPECS);
const LAYERS = ["machines", "protocol", "recovery", "expressions", "definitions", "interpreter", "journal", "journal-append", "operations", "store"];
// The hold points offered (specs/conformance.md, Holds), and how a `store` request names each.
const HOLDS = ["commit", "clock"];
const HOLD_OF = (hold) => (hold === undefined || hold === null || hold === false ? null
  : hold === true ? "commit" : HOLDS.includes(hold) ? hold : undefined);

function answer(layer, input) {
  if (layer === "machines") {
    const target = step(machines[input.machine], input.state, input.event);
    return target === null ? { illegal: true } : { target };
  }
  if (layer === "protocol" || layer === "recovery") {
    return decide(machines, input);
  }
  if (layer === "operations") {
    return decideOperation(machines, input);
  }
  if (layer === "expressions") {
    try {
      return { result: evaluate(parse(input.source), input.bindings) };
    } catch (err) {
      if (err instanceof ExpressionError) return { result: "error", code: err.code, position: err.position };
      throw err;
    }
  }
  if (layer === "definitions") return definitionCase(input);
  if (layer === "interpreter") return require("./interpreter").visit(machines, input);
  if (layer === "journal") return require("./journal").replayCase(machines, input);
  if (layer === "journal-append") return require("./journal").appendCase(machines, input);
  return undefined;
}

function handle(request) {
  switch (request.op) {
    case "hello":
      return { protocol: 1, implementation: "fencekeeper-js", layers: LAYERS, holds: HOLDS };
    case "case": {
      if (!LAYERS.includes(request.layer)) return { unsupported: true };
      try {
        return { output: answer(request.layer, request.input) };
      } catch (err) {
        return { error: String(err && err.stack ? err.stack : err) };
      }
    }
    case "reset":
      sessions = { store: new Store(machines), clock: null, held: null, waiting: [], done: {} };
      return { ok: true };
    case "store":
      try {
        return storeRequest(request);
      } catch (err) {
        return { error: String(err && err.stack ? err.stack : err) };
      }
    case "bye":
      return { ok: true };
    default:
      return { error: `unknown op ${request.op}` };
  }
}

// The store of the case under way, its clock (the last step's `now`), the session held inside
// its transaction, the calls waiting behind it and the answers of those that ran once it committed.
let sessions = null;

function storeRequest(request) {
  if (sessions === null) return { unsupported: true };
  if (request.control === "release") {
    const held = sessions.held;
    sessions.held = null;
    let result;
    if (held.tx) {
      held.tx.commit();
      result = held.result;
    } else {
      result = committed(held.step);
    }
    // The writer is gone: the calls that waited for it run now, in the order they came.
    for (const { session, step } of sessions.waiting.splice(0)) sessions.done[session] = committed(step);
    return { output: result };
  }
  if (request.control === "await") return { output: sessions.done[request.session] };
  const step = request.step;
  const hold = HOLD_OF(request.hold);
  if (hold === undefined) return { unsupported: true };
  if (typeof step.now === "string") sessions.clock = step.now;
  const session = step.session ?? "a";
  if (sessions.held !== null) {
    sessions.waiting.push({ session, step });
    return { output: { pending: true } };
  }
  if (hold === "clock" && READS_CLOCK(step.call)) {
    // Stopped before its transaction's read of the clock returns: it has read nothing yet.
    sessions.held = { session, step };
    return { output: { held: "clock" } };
  }
  const { tx, result } = run(sessions.store, step, sessions.clock);
  if (hold === "commit" && tx !== null && tx.wrote) {
    // Decided, its writes not yet the store's: the point where the guard must still hold.
    sessions.held = { session, tx, result };
    return { output: { held: true } };
  }
  if (tx !== null) tx.commit();
  return { output: result };
}

function committed(step) {
  const { tx, result } = run(sessions.store, step, sessions.clock);
  if (tx !== null) tx.commit();
  return result;
}

// A definition is read from the request's own text (definitions.js, parseJson): JSON.parse
// would read 1.0 as 1 and keep the last of two equal keys, which a definition refuses.
function read(line) {
  const exact = parseJson(line);
  return exact.op === "case" && exact.layer === "definitions" ? exact : JSON.parse(line);
}

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  if (!line.trim()) return;
  const request = read(line);
  const response = handle(request);
  // Protocol 1.2: echo the request's number, so the runner can tell an answer from a stray line.
  if ("seq" in request) response.seq = request.seq;
  process.stdout.write(JSON.stringify(response) + "\n");
});
