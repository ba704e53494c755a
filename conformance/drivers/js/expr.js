// The condition expression language of specs/expressions.md: parse, then evaluate to
// "true", "false" or "unknown".
//
// parse() throws ExpressionError (code "invalid_expression") for every source the
// spec refuses; the position it reports is a courtesy, since the spec makes only
// the code normative.  Integers are BigInt, so that 64-bit values and exact
// integer/decimal comparison (9007199254740993 == 9007199254740992.0 is false)
// come for free: JavaScript compares a BigInt with a Number exactly.

"use strict";

const { codePoints, byCodePoint } = require("./values");

const MAX_SOURCE = 1000, MAX_DEPTH = 16, MAX_NODES = 200, MAX_ITEMS = 64, MAX_STRING = 256;
const KEYWORDS = new Set(["and", "or", "not", "in", "true", "false"]);
const INT_MIN = -(2n ** 63n), INT_MAX = 2n ** 63n - 1n;
const IDENT = /^[a-z_][a-z0-9_]*$/;

class ExpressionError extends Error {
  constructor(position, problem) {
    super(`at ${position}: ${problem}`);
    this.code = "invalid_expression";
    this.position = position;
  }
}

// --- lexer ------------------------------------------------------------------------------
// Tokens: {kind, text, value, position}; kinds: keyword, name, int, dec, str, op, "(", ")", "[", "]", ",", end.

const isDigit = (c) => c >= "0" && c <= "9";
const isWordStart = (c) => /[A-Za-z_]/.test(c);
const isWordChar = (c) => /[A-Za-z0-9_.]/.test(c);
const forbiddenInString = (c) => {
  const cp = c.codePointAt(0);
  return cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f) || (cp >= 0xd800 && cp <= 0xdfff);
};

function lex(chars) {
  const tokens = [];
  let i = 0;
  while (i < chars.length) {
    const c = chars[i];
    if (" \t\r\n".includes(c)) { i++; continue; }
    const start = i;
    if ("()[],".includes(c)) { tokens.push({ kind: c, position: start }); i++; continue; }
    if (c === "=" || c === "!" || c === "<" || c === ">") {
      const two = c + (chars[i + 1] || "");
      if (["==", "!=", "<=", ">="].includes(two)) { tokens.push({ kind: "op", text: two, position: start }); i += 2; continue; }
      if (c === "<" || c === ">") { tokens.push({ kind: "op", text: c, position: start }); i++; continue; }
      throw new ExpressionError(start, `'${c}' is not an operator`);
    }
    if (c === '"' || c === "'") {
      let value = "";
      i++;
      for (;;) {
        if (i >= chars.length || chars[i] === "\n" || chars[i] === "\r") throw new ExpressionError(start, "unterminated string");
        const d = chars[i];
        if (d === c) { i++; break; }
        if (d === "\\") {
          const e = chars[i + 1];
          if (e !== "\\" && e !== '"' && e !== "'") throw new ExpressionError(i, "unknown escape");
          value += e;
          i += 2;
          continue;
        }
        if (forbiddenInString(d)) throw new ExpressionError(i, "control character or surrogate in a string");
        value += d;
        i++;
      }
      if (codePoints(value) > MAX_STRING) throw new ExpressionError(start, "string too long");
      tokens.push({ kind: "str", value, position: start });
      continue;
    }
    if (isDigit(c) || (c === "-" && isDigit(chars[i + 1] || ""))) {
      let j = i + (c === "-" ? 1 : 0);
      let text = c === "-" ? "-" : "";
      const digits = () => { let s = ""; while (j < chars.length && isDigit(chars[j])) s += chars[j++]; return s; };
      const whole = digits();
      text += whole;
      let decimal = false;
      if (chars[j] === "." && isDigit(chars[j + 1] || "")) {
        j++;
        text += "." + digits();
        decimal = true;
        if (chars[j] === "e" && (isDigit(chars[j + 1] || "") || (chars[j + 1] === "-" && isDigit(chars[j + 2] || "")))) {
          text += "e";
          j++;
          if (chars[j] === "-") { text += "-"; j++; }
          text += digits();
        }
      }
      if (j < chars.length && isWordChar(chars[j])) throw new ExpressionError(start, "malformed number");
      if (whole.length > 1 && whole[0] === "0") throw new ExpressionError(start, "leading zeros are not allowed");
      if (decimal) {
        const value = Number(text);
        if (!Number.isFinite(value)) throw new ExpressionError(start, "decimal out of range");
        tokens.push({ kind: "dec", value, position: start });
      } else {
        const value = BigInt(text);
        if (value < INT_MIN || value > INT_MAX) throw new ExpressionError(start, "integer out of range");
        tokens.push({ kind: "int", value, position: start });
      }
      i = j;
      continue;
    }
    if (isWordStart(c)) {
      let j = i;
      while (j < chars.length && isWordChar(chars[j])) j++;
      const text = chars.slice(i, j).join("");
      i = j;
      if (KEYWORDS.has(text)) { tokens.push({ kind: "keyword", text, position: start }); continue; }
      const parts = text.split(".");
      for (const part of parts) {
        if (KEYWORDS.has(part)) throw new ExpressionError(start, `'${part}' is reserved and cannot be part of a name`);
        if (!IDENT.test(part)) throw new ExpressionError(start, `malformed name '${text}'`);
      }
      tokens.push({ kind: "name", text, position: start });
      continue;
    }
    throw new ExpressionError(start, `unexpected character '${c}'`);
  }
  tokens.push({ kind: "end", position: chars.length });
  return tokens;
}

// --- parser -------------------------------------------------------------------------------
// Nodes: {t:"lit", v}, {t:"name", name}, {t:"cmp", op, left, right}, {t:"in", item, coll, negated},
// {t:"list", items}, {t:"not", operand}, {t:"and"|"or", operands}.

function parse(source) {
  const chars = Array.from(source);
  if (chars.length > MAX_SOURCE) throw new ExpressionError(MAX_SOURCE, "expression too long");
  const tokens = lex(chars);
  if (tokens.length === 1) throw new ExpressionError(0, "the expression is empty");
  let at = 0, level = 0, nodes = 0;
  const peek = (k = 0) => tokens[Math.min(at + k, tokens.length - 1)];
  const advance = () => tokens[at++];
  const isKw = (tok, word) => tok.kind === "keyword" && tok.text === word;
  const count = (tok, n = 1) => { nodes += n; if (nodes > MAX_NODES) throw new ExpressionError(tok.position, "too many nodes"); };
  const enter = (tok) => { level++; if (level > MAX_DEPTH) throw new ExpressionError(tok.position, "nested too deep"); };
  const atNotIn = () => isKw(peek(), "not") && isKw(peek(1), "in");
  const isLiteral = (tok) => ["int", "dec", "str"].includes(tok.kind) || isKw(tok, "true") || isKw(tok, "false");
  const literalValue = (tok) => (tok.kind === "keyword" ? tok.text === "true" : tok.kind === "int"
    ? { int: tok.value } : tok.kind === "dec" ? { dec: tok.value } : tok.value);
  const typeName = (v) => (typeof v === "boolean" ? "boolean" : typeof v === "string" ? "string" : "number");

  function chain(word, operand) {
    const first = operand();
    if (!isKw(peek(), word)) return first;
    count(peek());
    const operands = [first];
    while (isKw(peek(), word)) { advance(); operands.push(operand()); }
    return { t: word, operands };
  }
  const expression = () => chain("or", andExpr);
  const andExpr = () => chain("and", notExpr);
  function notExpr() {
    let nots = 0;
    while (isKw(peek(), "not")) {
      const tok = advance();
      enter(tok);
      count(tok);
      nots++;
    }
    let expr = comparison();
    for (let k = 0; k < nots; k++) expr = { t: "not", operand: expr };
    level -= nots;
    return expr;
  }
  function comparison() {
    const left = operand();
    const tok = peek();
    let expr;
    if (tok.kind === "op") {
      advance();
      count(tok);
      expr = { t: "cmp", op: tok.text, left, right: operand() };
    } else if (isKw(tok, "in") || atNotIn()) {
      const negated = isKw(tok, "not");
      advance();
      if (negated) advance();
      count(tok);
      expr = { t: "in", item: left, coll: collection(), negated };
    } else {
      return left;
    }
    const next = peek();
    if (next.kind === "op" || isKw(next, "in") || atNotIn()) throw new ExpressionError(next.position, "comparisons do not chain");
    return expr;
  }
  function operand() {
    const tok = peek();
    if (tok.kind === "(") {
      advance();
      enter(tok);
      const inner = expression();
      if (peek().kind !== ")") throw new ExpressionError(peek().position, "expected ')'");
      advance();
      level--;
      return inner;
    }
    if (isLiteral(tok)) { advance(); count(tok); return { t: "lit", v: literalValue(tok) }; }
    if (tok.kind === "name") return name();
    throw new ExpressionError(tok.position, "expected a value");
  }
  function name() {
    const tok = advance();
    count(tok);
    const next = peek();
    if (next.kind === "(" || next.kind === "[") throw new ExpressionError(next.position, "no calls and no indexing");
    return { t: "name", name: tok.text };
  }
  function collection() {
    const tok = peek();
    if (tok.kind === "name") return name();
    if (tok.kind !== "[") throw new ExpressionError(tok.position, "expected a list or a name");
    const opening = advance();
    count(opening);
    const items = [];
    if (peek().kind === "]") { advance(); return { t: "list", items }; }
    for (;;) {
      const item = peek();
      if (!isLiteral(item)) throw new ExpressionError(item.position, "a list holds only literals");
      if (items.length === MAX_ITEMS) throw new ExpressionError(item.position, "too many list items");
      const value = literalValue(item);
      if (items.length && typeName(plain(value)) !== typeName(plain(items[0]))) {
        throw new ExpressionError(item.position, "a list holds values of one type");
      }
      advance();
      count(item);
      items.push(value);
      const sep = peek();
      if (sep.kind === ",") advance();
      else if (sep.kind === "]") { advance(); return { t: "list", items }; }
      else throw new ExpressionError(sep.position, "expected ',' or ']'");
    }
  }

  const tree = expression();
  if (peek().kind !== "end") throw new ExpressionError(peek().position, "expected an operator or the end");
  return tree;
}

// --- values and evaluation -----------------------------------------------------------------
// A value is a string, a boolean, or a number {int: BigInt} / {dec: Number}; null is undecidable.

function plain(value) {
  if (value !== null && typeof value === "object") return value.int !== undefined ? value.int : value.dec;
  return value;
}

// A tagged binding (specs/conformance.md, expression layer) as a scalar value, or null.
function scalar(binding) {
  if (binding === undefined || binding === null) return null;
  switch (binding.type) {
    case "string": return binding.value;
    case "bool": return binding.value;
    case "integer": {
      const v = BigInt(binding.value);
      return v < INT_MIN || v > INT_MAX ? null : { int: v };
    }
    case "decimal": {
      const v = Number(binding.value);
      return Number.isFinite(v) ? { dec: v } : null;
    }
    default: return null;
  }
}

function compare(op, left, right) {
  const l = plain(left), r = plain(right);
  const kind = (v) => (typeof v === "boolean" ? "bool" : typeof v === "string" ? "str" : "num");
  if (kind(l) !== kind(r)) return "unknown";
  let order;
  if (kind(l) === "bool") {
    if (op === "==") return l === r ? "true" : "false";
    if (op === "!=") return l !== r ? "true" : "false";
    return "unknown";
  }
  if (kind(l) === "str") order = byCodePoint(l, r);
  else order = l < r ? -1 : l > r ? 1 : 0; // exact across BigInt and Number
  const holds = { "==": order === 0, "!=": order !== 0, "<": order < 0, "<=": order <= 0, ">": order > 0, ">=": order >= 0 }[op];
  return holds ? "true" : "false";
}

function evaluate(tree, bindings) {
  const NOT = { true: "false", false: "true", unknown: "unknown" };
  function operandValue(node) {
    if (node.t === "lit") return node.v;
    if (node.t === "name") return scalar(bindings[node.name]);
    const t = truth(node);
    return t === "unknown" ? null : t === "true";
  }
  function collectionValues(node) {
    if (node.t === "list") return node.items;
    const bound = bindings[node.name];
    if (!bound || bound.type !== "array") return null;
    const values = bound.value.map(scalar);
    return values.some((v) => v === null) ? null : values;
  }
  function truth(node) {
    switch (node.t) {
      case "lit": return typeof node.v === "boolean" ? String(node.v) : "unknown";
      case "name": {
        const v = scalar(bindings[node.name]);
        return typeof v === "boolean" ? String(v) : "unknown";
      }
      case "cmp": {
        const l = operandValue(node.left), r = operandValue(node.right);
        return l === null || r === null ? "unknown" : compare(node.op, l, r);
      }
      case "in": {
        const x = operandValue(node.item), c = collectionValues(node.coll);
        let result;
        if (x === null || c === null) result = "unknown";
        else {
          const each = c.map((e) => compare("==", x, e));
          result = each.includes("true") ? "true" : each.every((r) => r === "false") ? "false" : "unknown";
        }
        return node.negated ? NOT[result] : result;
      }
      case "not": return NOT[truth(node.operand)];
      case "and": {
        const all = node.operands.map(truth);
        return all.includes("false") ? "false" : all.includes("unknown") ? "unknown" : "true";
      }
      case "or": {
        const all = node.operands.map(truth);
        return all.includes("true") ? "true" : all.includes("unknown") ? "unknown" : "false";
      }
      default: throw new Error(`unknown node ${node.t}`);
    }
  }
  return truth(tree);
}

module.exports = { parse, evaluate, ExpressionError };
