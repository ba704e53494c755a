// The machine tables, read from specs/machines/*.toml.
//
// The TOML files use a small, regular part of TOML: `key = value` lines whose
// values are strings, booleans or arrays of strings, and `[[transitions]]`
// tables.  This reader understands exactly that part and throws on anything
// else, so a change of format is noticed rather than misread.

"use strict";

const fs = require("fs");
const path = require("path");

function parseString(text, where) {
  // A TOML basic string: JSON's escapes are a superset of what the files use.
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`${where}: cannot read string ${text}`);
  }
}

function parseValue(text, where) {
  if (text === "true") return true;
  if (text === "false") return false;
  if (text.startsWith('"')) return parseString(text, where);
  if (text.startsWith("[")) {
    const inner = text.slice(1, -1).trim();
    if (inner === "") return [];
    // Arrays hold only simple strings without commas or brackets inside them.
    return inner.split(",").map((item) => parseString(item.trim(), where));
  }
  throw new Error(`${where}: unsupported value ${text}`);
}

function parseMachineToml(text, where) {
  const machine = { transitions: [] };
  let current = machine;
  text.split("\n").forEach((raw, index) => {
    const line = raw.trim();
    const at = `${where}:${index + 1}`;
    if (line === "" || line.startsWith("#")) return;
    if (line === "[[transitions]]") {
      current = {};
      machine.transitions.push(current);
      return;
    }
    const eq = line.indexOf(" = ");
    if (eq < 0) throw new Error(`${at}: not a key = value line`);
    current[line.slice(0, eq)] = parseValue(line.slice(eq + 3), at);
  });
  return machine;
}

// name -> { states, events, table: Map("state\0event" -> target) }
function loadMachines(specsDir) {
  const dir = path.join(specsDir, "machines");
  const machines = {};
  for (const file of fs.readdirSync(dir).sort()) {
    if (!file.endsWith(".toml")) continue;
    const spec = parseMachineToml(fs.readFileSync(path.join(dir, file), "utf8"), file);
    const table = new Map();
    const events = [];
    for (const t of spec.transitions) {
      const key = `${t.source}\u0000${t.event}`;
      if (table.has(key)) throw new Error(`${file}: two transitions for ${t.source} on ${t.event}`);
      table.set(key, t.target);
      if (!events.includes(t.event)) events.push(t.event);
    }
    machines[spec.name] = { states: spec.states, events, table };
  }
  return machines;
}

// The state `event` leads to from `state`, or null when the table has no row: illegal.
function step(machine, state, event) {
  const target = machine.table.get(`${state}\u0000${event}`);
  return target === undefined ? null : target;
}

module.exports = { loadMachines, step };
