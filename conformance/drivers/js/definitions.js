// A workflow definition read from its JSON form (specs/definitions.md: The two forms,
// Values, Names, Binding names, Top level, Typed inputs, Nodes, Validation, Refusals,
// Lenient reading of a stored definition; specs/conformance.md, `definitions`; seed 000,
// Purpose and Invariants, Node Semantics).
//
// readDefinition(data, { lenient }) returns { id, revision, title, start, inputs, nodes },
// `nodes` a Map of node id -> the node as written (a condition also carries its parsed
// `tree`), or throws DefinitionError { node, field }.  parseJson(text) reads JSON text as
// a definition's reader must, where JSON.parse cannot.
// Rules this module keeps:
// - Checks run in the order of Validation, and the first failure refuses the whole
//   definition, naming the node and field to blame: the same broken definition is always
//   refused the same way.  Only node and field are compared, so a refusal carries no text.
// - A definition is exact data: a number written with a fraction or an exponent is a
//   float and refused wherever it stands, even `1.0`, which JSON.parse would have made 1;
//   so is an integer past ±(2^53 − 1), kept as a BigInt so it is never rounded into range.
// - Lenient reading (a stored revision) relaxes exactly the four points Lenient reading
//   lists and nothing else.

"use strict";

const { parse } = require("./expr");
const { IDENTIFIER, isRecord, isUnicodeText, codePoints } = require("./values");

const MAX_SAFE = 9007199254740991;
const KINDS = ["condition", "wait_for_event", "request_approval", "local_command", "end"];
const NAME = /^[a-z][a-z0-9_]{0,63}$/;
// Words the expression language reserves: a binding named with one could never be read.
const RESERVED = new Set(["and", "or", "not", "in", "true", "false"]);
const INPUT_TYPES = ["string", "integer", "number", "boolean", "object", "array"];
const MAX_TIMEOUT = 31622400;

class DefinitionError extends Error {
  constructor(node, field) {
    super(`node ${node}: field ${field}`);
    this.code = "invalid_definition";
    this.node = node;
    this.field = field;
  }
}

// A JSON number written with a fraction or an exponent (or NaN, Infinity): never an integer.
class JsonFloat {
  constructor(text) {
    this.text = text;
  }
}

// --- JSON text ------------------------------------------------------------------------------
// JSON.parse keeps the last of two equal keys, reads 2.0 as 2 and rounds 2^53 + 1; a
// definition must refuse the first and second and see the third as out of bounds.  The
// runner's JSON writer may emit NaN and Infinity, so those are read too, as floats the
// reader refuses at their field (definitions.md, Values: "NaN ... refused").  A duplicate
// key is marked on its object, for the reader to refuse as not JSON.
const DUPLICATE = Symbol("duplicate key");

function parseJson(text) {
  let i = 0;
  const fail = () => {
    throw new SyntaxError(`not valid JSON at ${i}`);
  };
  const space = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const literal = (word, value) => {
    if (text.startsWith(word, i)) {
      i += word.length;
      return value;
    }
    return fail();
  };
  function string() {
    let out = "";
    i++;
    for (;;) {
      const c = text[i];
      if (c === undefined || c < " ") fail();
      if (c === '"') {
        i++;
        return out;
      }
      if (c !== "\\") {
        out += c;
        i++;
        continue;
      }
      const e = text[i + 1];
      const simple = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
      if (e in simple) {
        out += simple[e];
        i += 2;
      } else if (e === "u" && /^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) {
        // A lone surrogate escape is kept as it is, for the reader to refuse as no text.
        out += String.fromCharCode(parseInt(text.slice(i + 2, i + 6), 16));
        i += 6;
      } else {
        fail();
      }
    }
  }
  function number() {
    const m = /^-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i));
    if (!m) {
      if (text.startsWith("-Infinity", i)) return literal("-Infinity", new JsonFloat("-Infinity"));
      return fail();
    }
    i += m[0].length;
    if (m[1] !== undefined || m[2] !== undefined) return new JsonFloat(m[0]);
    const n = Number(m[0]);
    return Number.isSafeInteger(n) ? n : BigInt(m[0]);
  }
  function value() {
    space();
    const c = text[i];
    if (c === "{") {
      i++;
      const object = {};
      space();
      if (text[i] === "}") {
        i++;
        return object;
      }
      for (;;) {
        space();
        if (text[i] !== '"') fail();
        const key = string();
        space();
        if (text[i] !== ":") fail();
        i++;
        const item = value();
        if (Object.prototype.hasOwnProperty.call(object, key)) object[DUPLICATE] = true;
        object[key] = item;
        space();
        if (text[i] === ",") i++;
        else if (text[i] === "}") {
          i++;
          return object;
        } else fail();
      }
    }
    if (c === "[") {
      i++;
      const array = [];
      space();
      if (text[i] === "]") {
        i++;
        return array;
      }
      for (;;) {
        array.push(value());
        space();
        if (text[i] === ",") i++;
        else if (text[i] === "]") {
          i++;
          return array;
        } else fail();
      }
    }
    if (c === '"') return string();
    if (c === "t") return literal("true", true);
    if (c === "f") return literal("false", false);
    if (c === "n") return literal("null", null);
    if (c === "N") return literal("NaN", new JsonFloat("NaN"));
    if (c === "I") return literal("Infinity", new JsonFloat("Infinity"));
    return number();
  }
  const result = value();
  space();
  if (i !== text.length) fail();
  return result;
}

// Not JSON at all, though it parsed: an object with a duplicate key.  (NaN and Infinity
// are read as floats, refused at their field as the float they are on the wire.)
function notJson(value) {
  if (Array.isArray(value)) return value.some(notJson);
  if (value !== null && typeof value === "object") return Boolean(value[DUPLICATE]) || Object.values(value).some(notJson);
  return false;
}

// --- values ---------------------------------------------------------------------------------

// A float is read as an object (JsonFloat), and is no table.
const isTable = (v) => isRecord(v) && !(v instanceof JsonFloat);
const isInteger = (v) => (typeof v === "number" && Number.isInteger(v)) || typeof v === "bigint";
const has = (object, key) => Object.prototype.hasOwnProperty.call(object, key);

// Reads one node's fields (or the top level's) and throws the first problem, naming them.
class Reader {
  constructor(node) {
    this.node = node;
  }

  fail(field) {
    throw new DefinitionError(this.node, field);
  }

  // Unicode text, NUL included (Values: "Strings are Unicode text"); what a store refuses of an
  // input's value is admission's to refuse (Typed inputs), not the definition's.
  string(field, value, max) {
    if (!isUnicodeText(value)) this.fail(field);
    if (max !== undefined && codePoints(value) > max) this.fail(field);
    return value;
  }

  pattern(field, value, regex) {
    this.string(field, value);
    if (!regex.test(value)) this.fail(field);
    return value;
  }

  identifier(field, value) {
    return this.pattern(field, value, IDENTIFIER);
  }

  name(field, value) {
    return this.pattern(field, value, NAME);
  }

  // `<name>.<name>`, neither part a reserved word: node ids and input names have no dots.
  binding(field, value) {
    this.string(field, value);
    const parts = value.split(".");
    if (parts.length !== 2 || !parts.every((p) => NAME.test(p) && !RESERVED.has(p))) this.fail(field);
    return value;
  }

  integer(field, value, min, max) {
    if (!isInteger(value)) this.fail(field);
    if (value < min || value > max) this.fail(field);
    return value;
  }

  boolean(field, value) {
    if (typeof value !== "boolean") this.fail(field);
    return value;
  }

  table(field, value) {
    if (!isTable(value)) this.fail(field);
    return value;
  }

  array(field, value, min, max) {
    if (!Array.isArray(value)) this.fail(field);
    if (value.length < min || value.length > max) this.fail(field);
    return value;
  }

  // Exactly the allowed fields: unknown ones first, then the missing required ones, each
  // the first in the order written (unknown) or listed (required).
  fields(field, value, allowed, required) {
    const prefix = field === null ? "" : `${field}.`;
    const unknown = Object.keys(value).find((k) => !allowed.includes(k));
    if (unknown !== undefined) this.fail(`${prefix}${unknown}`);
    const absent = required.find((k) => !has(value, k));
    if (absent !== undefined) this.fail(`${prefix}${absent}`);
  }

  // A scalar (string of at most 256 characters, integer, boolean) or a reference.
  operand(field, value) {
    if (typeof value === "string") return this.string(field, value, 256);
    if (typeof value === "boolean") return value;
    if (isInteger(value)) return this.integer(field, value, -MAX_SAFE, MAX_SAFE);
    if (isTable(value)) {
      this.fields(field, value, ["from"], ["from"]);
      this.binding(`${field}.from`, value.from);
      return value;
    }
    return this.fail(field);
  }

  operands(field, value, min, max) {
    this.table(field, value);
    const keys = Object.keys(value);
    if (keys.length < min || keys.length > max) this.fail(field);
    // Entry by entry, as a list is read.  A key that is not a name is the table's fault: it has
    // no field of its own to blame.
    for (const key of keys) {
      if (!NAME.test(key)) this.fail(field);
      this.operand(`${field}.${key}`, value[key]);
    }
    return value;
  }

  // A list of strings, each of its form and none twice, entry by entry: a repeat is found
  // before the form of any entry after it is read.
  names(field, value, min, max, check) {
    this.array(field, value, min, max);
    value.forEach((item, n) => {
      check(`${field}[${n}]`, item);
      if (value.indexOf(item) !== n) this.fail(field);
    });
    return value;
  }

  timeout(field, value) {
    if (value === undefined) return;
    this.table(field, value);
    this.fields(field, value, ["after_seconds", "next"], ["after_seconds", "next"]);
    this.integer(`${field}.after_seconds`, value.after_seconds, 1, MAX_TIMEOUT);
    this.name(`${field}.next`, value.next);
  }

  targets(field, value, min) {
    this.array(field, value, min, 16);
    // Two equal targets would bind one object twice: the later one repeats the earlier.
    const key = (t) => JSON.stringify([t.id, t.revision], (k, v) => (typeof v === "bigint" ? String(v) : v));
    value.forEach((t, n) => {
      const at = `${field}[${n}]`;
      this.table(at, t);
      this.fields(at, t, ["id", "revision"], ["id", "revision"]);
      if (typeof t.id === "string") {
        this.string(`${at}.id`, t.id, 256);
        if (t.id === "") this.fail(`${at}.id`);
      } else if (isTable(t.id)) {
        this.operand(`${at}.id`, t.id);
      } else {
        this.fail(`${at}.id`);
      }
      if (isTable(t.revision)) this.operand(`${at}.revision`, t.revision);
      else this.integer(`${at}.revision`, t.revision, 1, MAX_SAFE);
      // An entry of a list of tables that repeats an earlier one is blamed, not the list.
      if (value.slice(0, n).some((earlier) => key(earlier) === key(t))) this.fail(at);
    });
  }

  policies(field, value) {
    this.array(field, value, 0, 16);
    value.forEach((p, n) => {
      const at = `${field}[${n}]`;
      this.table(at, p);
      this.fields(at, p, ["id", "revision"], ["id", "revision"]);
      this.identifier(`${at}.id`, p.id);
      this.integer(`${at}.revision`, p.revision, 1, MAX_SAFE);
      if (value.slice(0, n).some((earlier) => earlier.id === p.id)) this.fail(at);
    });
  }
}

// --- inputs ---------------------------------------------------------------------------------

const KEYWORDS_OF = {
  string: ["enum", "minLength", "maxLength"],
  integer: ["enum", "minimum", "maximum"],
  number: ["enum", "minimum", "maximum"],
  boolean: ["enum"],
  object: [],
  array: [],
};
const KEYWORD_ORDER = ["minimum", "maximum", "minLength", "maxLength", "enum"];
const TYPE_FIELDS = ["type", "required", "description", "enum", "minimum", "maximum", "minLength", "maxLength"];

// Typed inputs, each in the order written: its name, its fields, `type`, the keywords that
// do not apply to it, the bounds, `required`, `description`, then `enum` entry by entry.
function readTyped(r, inputs) {
  const names = Object.keys(inputs);
  if (names.length > 64) r.fail("inputs");
  for (const name of names) {
    const at = `inputs.${name}`;
    if (!NAME.test(name)) r.fail("inputs");
    const type = r.table(at, inputs[name]);
    r.fields(at, type, TYPE_FIELDS, ["type"]);
    if (typeof type.type !== "string" || !INPUT_TYPES.includes(type.type)) r.fail(`${at}.type`);
    // The keywords in this order, whatever order they are written in.
    const misplaced = KEYWORD_ORDER.find((k) => has(type, k) && !KEYWORDS_OF[type.type].includes(k));
    if (misplaced !== undefined) r.fail(`${at}.${misplaced}`);
    for (const k of ["minimum", "maximum"]) if (has(type, k)) r.integer(`${at}.${k}`, type[k], -MAX_SAFE, MAX_SAFE);
    for (const k of ["minLength", "maxLength"]) if (has(type, k)) r.integer(`${at}.${k}`, type[k], 0, 4096);
    if (has(type, "minimum") && has(type, "maximum") && type.maximum < type.minimum) r.fail(`${at}.maximum`);
    if (has(type, "minLength") && has(type, "maxLength") && type.maxLength < type.minLength) r.fail(`${at}.maxLength`);
    if (has(type, "required")) r.boolean(`${at}.required`, type.required);
    if (has(type, "description")) r.string(`${at}.description`, type.description, 256);
    if (has(type, "enum")) {
      r.array(`${at}.enum`, type.enum, 1, 64);
      // `true` is not 1: equal entries are equal values of one type.
      const key = (e) => `${typeof e === "bigint" ? "number" : typeof e}:${String(e)}`;
      type.enum.forEach((entry, n) => {
        admissible(r, `${at}.enum[${n}]`, type, entry);
        if (type.enum.slice(0, n).some((earlier) => key(earlier) === key(entry))) r.fail(`${at}.enum`);
      });
    }
  }
}

// An enum entry that admission could accept: a literal of the type, within its bounds.
function admissible(r, field, type, entry) {
  if (isTable(entry) || Array.isArray(entry) || entry instanceof JsonFloat || entry === null) r.fail(field);
  switch (type.type) {
    case "string":
      r.string(field, entry, 256);
      if (has(type, "minLength") && codePoints(entry) < type.minLength) r.fail(field);
      if (has(type, "maxLength") && codePoints(entry) > type.maxLength) r.fail(field);
      return;
    case "integer":
    case "number":
      r.integer(field, entry, -MAX_SAFE, MAX_SAFE);
      if (has(type, "minimum") && entry < type.minimum) r.fail(field);
      if (has(type, "maximum") && entry > type.maximum) r.fail(field);
      return;
    default:
      r.boolean(field, entry);
  }
}

// --- nodes ------------------------------------------------------------------------------------

const NODE_FIELDS = {
  condition: [["expression", "bindings", "true_next", "false_next"], []],
  wait_for_event: [["event_type", "correlation", "next"], ["timeout"]],
  request_approval: [["operation", "targets", "reviewers", "approved_next", "rejected_next"],
    ["policies", "distinct_reviewer", "timeout"]],
  local_command: [["operation", "next", "on_failure"], ["targets", "payload"]],
  end: [["outcome"], ["error_code"]],
};

function readKind(r, node, lenient) {
  switch (node.kind) {
    case "condition": {
      r.names("bindings", node.bindings, 0, 64, (f, v) => r.binding(f, v));
      r.string("expression", node.expression);
      try {
        node.tree = parse(node.expression);
      } catch (err) {
        r.fail("expression");
      }
      if (!namesOf(node.tree).every((n) => node.bindings.includes(n))) r.fail("expression");
      r.name("true_next", node.true_next);
      r.name("false_next", node.false_next);
      return;
    }
    case "wait_for_event":
      r.identifier("event_type", node.event_type);
      // Only a reviewer's Decision wakes the kernel's own waits; a stored one is kept.
      if (node.event_type.startsWith("fencekeeper.") && !lenient) r.fail("event_type");
      r.operands("correlation", node.correlation, 1, 16);
      r.name("next", node.next);
      r.timeout("timeout", node.timeout);
      return;
    case "request_approval":
      r.identifier("operation", node.operation);
      r.targets("targets", node.targets, 1);
      if (has(node, "policies")) r.policies("policies", node.policies);
      r.names("reviewers", node.reviewers, 1, 64, (f, v) => r.identifier(f, v));
      if (has(node, "distinct_reviewer")) r.boolean("distinct_reviewer", node.distinct_reviewer);
      r.name("approved_next", node.approved_next);
      r.name("rejected_next", node.rejected_next);
      r.timeout("timeout", node.timeout);
      return;
    case "local_command":
      r.identifier("operation", node.operation);
      if (has(node, "targets")) r.targets("targets", node.targets, 0);
      if (has(node, "payload")) r.operands("payload", node.payload, 0, 64);
      r.name("next", node.next);
      r.name("on_failure", node.on_failure);
      return;
    case "end":
      if (node.outcome !== "succeeded" && node.outcome !== "failed") r.fail("outcome");
      if (node.outcome === "failed" && !has(node, "error_code")) r.fail("error_code");
      if (node.outcome === "succeeded" && has(node, "error_code")) r.fail("error_code");
      if (has(node, "error_code")) r.identifier("error_code", node.error_code);
      return;
    default:
      throw new Error(`no kind ${node.kind}`);
  }
}

// Validation 3, for one node: id, kind, unknown fields, missing fields, then the kind's own.
function readNode(raw, n, ids, lenient) {
  const anonymous = new Reader(null);
  // `nodes` is "an array of 1 to 200 tables" (Validation 2): an entry of another type is its fault.
  if (!isTable(raw)) anonymous.fail("nodes");
  if (!has(raw, "id")) anonymous.fail("id");
  anonymous.name("id", raw.id);
  if (raw.id === "input") anonymous.fail("id");
  // The duplicate is blamed on its id: which of the two is meant, only the author knows.
  if (ids.has(raw.id)) new Reader(raw.id).fail("id");
  const r = new Reader(raw.id);
  const node = { ...raw };
  if (!has(raw, "kind")) r.fail("kind");
  r.string("kind", raw.kind);
  if (!KINDS.includes(raw.kind)) {
    if (!lenient || !IDENTIFIER.test(raw.kind)) r.fail("kind");
    // Kept to suspend on: its other fields are a newer reader's to examine.
    if (!has(raw, "revision")) r.fail("revision");
    r.integer("revision", raw.revision, 1, MAX_SAFE);
    node.unsupported = true;
    return node;
  }
  const [required, optional] = NODE_FIELDS[raw.kind];
  r.fields(null, raw, ["id", "kind", "revision", ...required, ...optional], ["id", "kind", "revision", ...required]);
  r.integer("revision", raw.revision, 1, MAX_SAFE);
  readKind(r, node, lenient);
  return node;
}

// Every name an expression reads (definitions.md, condition: each must be declared).
function namesOf(tree) {
  const found = [];
  const stack = [tree];
  while (stack.length) {
    const t = stack.pop();
    if (t.t === "name") found.push(t.name);
    else if (t.t === "cmp") stack.push(t.left, t.right);
    else if (t.t === "in") stack.push(t.item, t.coll);
    else if (t.t === "not") stack.push(t.operand);
    else if (t.t === "and" || t.t === "or") stack.push(...t.operands);
  }
  return found;
}

// The continuations of a known kind, each with its field, in the order of its table.
function continuations(node) {
  const timeout = node.timeout ? [["timeout.next", node.timeout.next]] : [];
  switch (node.kind) {
    case "condition": return [["true_next", node.true_next], ["false_next", node.false_next]];
    case "wait_for_event": return [["next", node.next], ...timeout];
    case "request_approval": return [["approved_next", node.approved_next], ["rejected_next", node.rejected_next], ...timeout];
    case "local_command": return [["next", node.next], ["on_failure", node.on_failure]];
    default: return [];
  }
}

// Every binding name a node reads, with the field that reads it: a condition's `bindings`,
// then each reference in field order, blamed on the operand that holds it (the binding's
// own form, `.from`, was checked with the node).
function readings(node) {
  if (node.kind === "condition") return node.bindings.map((name) => ["bindings", name]);
  // An unsupported node's fields were not read: what it reads is a newer reader's to say.
  if (node.unsupported) return [];
  const found = [];
  const add = (field, operand) => {
    if (isTable(operand)) found.push([field, operand.from]);
  };
  for (const [k, v] of Object.entries(node.correlation || {})) add(`correlation.${k}`, v);
  (node.targets || []).forEach((t, n) => {
    add(`targets[${n}].id`, t.id);
    add(`targets[${n}].revision`, t.revision);
  });
  for (const [k, v] of Object.entries(node.payload || {})) add(`payload.${k}`, v);
  return found;
}

const ACTING = ["wait_for_event", "request_approval", "local_command"];

// Validation 4 to 8: the rules of the whole revision.
function checkGraph(start, inputs, nodes, lenient) {
  if (!nodes.has(start)) new Reader(null).fail("start");
  for (const node of nodes.values()) {
    for (const [field, next] of continuations(node)) {
      // A stored revision keeps a dangling continuation: the visit suspends on it.
      if (!nodes.has(next) && !lenient) new Reader(node.id).fail(field);
    }
  }
  for (const node of nodes.values()) {
    for (const [field, name] of readings(node)) {
      const [source, output] = name.split(".");
      if (source === "input") {
        if (!has(inputs, output)) new Reader(node.id).fail(field);
        if (inputs[output].type === "object" || inputs[output].type === "array") new Reader(node.id).fail(field);
        continue;
      }
      const from = nodes.get(source);
      if (from === undefined || source === node.id || !(ACTING.includes(from.kind) || from.unsupported)) {
        new Reader(node.id).fail(field);
      }
    }
  }
  // A cycle of conditions alone could never wait, act or end.  Depth first over conditions,
  // from each in file order, each continuation in field order: the first continuation back
  // to a node on the path closes a cycle, which is blamed on the node it closes at and on
  // that node's first continuation to the next node of the cycle.
  const done = new Set();
  const path = [];
  const visit = (node) => {
    path.push(node.id);
    for (const [, next] of continuations(node)) {
      const at = path.indexOf(next);
      if (at !== -1) {
        const after = path[at + 1] ?? next;
        const [field] = continuations(nodes.get(next)).find(([, t]) => t === after);
        new Reader(next).fail(field);
      }
      const target = nodes.get(next);
      if (target !== undefined && target.kind === "condition" && !done.has(next)) visit(target);
    }
    path.pop();
    done.add(node.id);
  };
  for (const node of nodes.values()) if (node.kind === "condition" && !done.has(node.id)) visit(node);
  // An unsupported node's continuations are unknown, so nothing is unreachable for sure.
  if ([...nodes.values()].some((n) => n.unsupported)) return;
  const reached = new Set([start]);
  const queue = [start];
  while (queue.length) {
    for (const [, next] of continuations(nodes.get(queue.shift()))) {
      if (nodes.has(next) && !reached.has(next)) {
        reached.add(next);
        queue.push(next);
      }
    }
  }
  const lost = [...nodes.keys()].find((id) => !reached.has(id));
  if (lost !== undefined) new Reader(lost).fail(null);
}

// --- the definition -------------------------------------------------------------------------

const TOP_REQUIRED = ["id", "revision", "start", "nodes"];
const TOP_FIELDS = ["id", "revision", "title", "start", "inputs", "nodes"];

function readDefinition(data, { lenient = false } = {}) {
  const r = new Reader(null);
  if (notJson(data)) r.fail(null);
  if (!isTable(data)) r.fail(null);
  r.fields(null, data, TOP_FIELDS, TOP_REQUIRED);
  r.identifier("id", data.id);
  r.integer("revision", data.revision, 1, MAX_SAFE);
  const title = has(data, "title") ? r.string("title", data.title, 256) : "";
  let inputs = {};
  if (has(data, "inputs")) {
    if (Array.isArray(data.inputs)) {
      r.names("inputs", data.inputs, 0, 64, (f, v) => r.name(f, v));
      inputs = Object.fromEntries(data.inputs.map((name) => [name, { type: null }]));
    } else if (isTable(data.inputs)) {
      readTyped(r, data.inputs);
      inputs = data.inputs;
    } else {
      r.fail("inputs");
    }
  }
  r.name("start", data.start);
  r.array("nodes", data.nodes, 1, 200);
  const nodes = new Map();
  data.nodes.forEach((raw, n) => {
    const node = readNode(raw, n, nodes, lenient);
    nodes.set(node.id, node);
  });
  checkGraph(data.start, inputs, nodes, lenient);
  return { id: data.id, revision: data.revision, title, start: data.start, inputs, nodes };
}

// The answer of the `definitions` layer (specs/conformance.md).
function definitionCase(input) {
  // A case without its definition is the suite's input broken, not a definition to refuse
  // (specs/conformance.md, "A case's input is whole"): the driver answers it as an error.
  if (input === null || typeof input !== "object" || !("definition" in input)) {
    throw new Error("malformed case input: input.definition: missing");
  }
  try {
    const definition = readDefinition(input.definition);
    return { valid: true, code: null, node: null, field: null, start: definition.start };
  } catch (err) {
    if (err instanceof DefinitionError) return { valid: false, code: err.code, node: err.node, field: err.field };
    throw err;
  }
}

module.exports = { readDefinition, definitionCase, parseJson, DefinitionError };
