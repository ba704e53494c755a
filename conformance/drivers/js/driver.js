#!/usr/bin/env node
// A fencekeeper conformance driver in JavaScript (specs/conformance.md, protocol 1.2).
//
// It reads one JSON request per line on stdin and writes one JSON response per
// line on stdout.  It implements nine layers, every one but `store`, from specs/ alone:
//   machines        -- the tables of specs/machines/*.toml       (machines.js)
//   protocol        -- the decisions of specs/protocol.md         (protocol.js, approvals.js)
//   recovery        -- its governed `recover` decisions           (recovery.js)
//   expressions     -- the language of specs/expressions.md       (expr.js)
//   definitions     -- a definition read as specs/definitions.md  (definitions.js)
//   interpreter     -- one node visit of specs/interpreter.md     (interpreter.js)
//   journal         -- a chain replayed as specs/journal.md says  (journal.js)
//   journal-append  -- one command appended to a journal          (journal.js)
//   operations      -- the decisions of specs/operations.md       (operations.js)
// What every layer reads alike (a time, an identifier, text, a malformed field) is values.js's.
// The store layer is declared unsupported (there is no store here), so the runner skips it.
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

const SPECS = process.env.FENCEKEEPER_SPECS || path.join(__dirname, "..", "..", "..", "specs");
const machines = loadMachines(SPECS);
const LAYERS = ["machines", "protocol", "recovery", "expressions", "definitions", "interpreter", "journal", "journal-append", "operations"];

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
      return { protocol: 1, implementation: "fencekeeper-js", layers: LAYERS };
    case "case": {
      if (!LAYERS.includes(request.layer)) return { unsupported: true };
      try {
        return { output: answer(request.layer, request.input) };
      } catch (err) {
        return { error: String(err && err.stack ? err.stack : err) };
      }
    }
    case "reset":
    case "store":
      return { unsupported: true };
    case "bye":
      return { ok: true };
    default:
      return { error: `unknown op ${request.op}` };
  }
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
