// The values every layer reads alike, and the one way a malformed field is refused.
//
// Each rule here is stated once in the specs and was once written out in each layer
// that needed it; a layer that reads one of these values asks this module, so two
// layers cannot come to read the same value two ways.  The rules, by where they are stated:
//   - A time has one form on the wire (specs/conformance.md, Values): the date, `T`,
//     the time with six fractional digits, and `Z`.  It must name a real instant
//     (no 30 February, no 24:00, no year 0), from 0001-01-01 to MAX_TIME.  Times are
//     BigInt microseconds since the epoch, since a JavaScript Date keeps milliseconds.
//   - An identifier is 1 to 128 characters of a fixed ASCII set (specs/protocol.md,
//     specs/operations.md, specs/definitions.md and specs/journal.md state the same one).
//   - Lengths are counted in Unicode code points, and strings are ordered by code point
//     (specs/conformance.md, Values; specs/expressions.md), never by UTF-16 code units,
//     which is what a JavaScript string's `length` and default sort count.
//   - Text comes in two strengths, which are different rules and kept apart:
//       Unicode text has no lone surrogate (specs/definitions.md, Values; specs/journal.md,
//       section 1, where NUL is text like any other character);
//       storable text, what a store keeps, has no NUL either (specs/protocol.md,
//       specs/operations.md, "Well-formed requests"; specs/interpreter.md).
//   - Free text given with a decision (a finalization's reason, a recovery's or a review
//     decision's rationale, a cancellation's reason) is storable text of at most
//     MAX_FREE_TEXT characters (specs/protocol.md, MAX_RATIONALE; specs/operations.md,
//     `cancel`, which names that bound; specs/interpreter.md, Approvals).
//   - A request's fields are checked in turn and the first malformed one is refused naming
//     it (specs/protocol.md and specs/operations.md, `invalid_request`; the interpreter
//     names it `invalid_view`): a check throws Invalid, and the layer says which code.
//
// The RFC 8785 form of a journal record (journal.js) orders members by UTF-16 code
// units, as that RFC says; it is another rule than the code point order here, and stays there.

"use strict";

// --- identifiers ----------------------------------------------------------------------------

const IDENTIFIER = /^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$/;

const isIdentifier = (value) => typeof value === "string" && IDENTIFIER.test(value);

// A JSON object: an array is an object to typeof, but no record of anything.
const isRecord = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

// --- text -----------------------------------------------------------------------------------

// Characters are code points, as every spec counts them; a string's length counts UTF-16 units.
const codePoints = (text) => Array.from(text).length;

// Code point order: a character beyond U+FFFF (a surrogate pair) sorts after U+FFFF, where
// UTF-16 order would put it among U+D800 to U+DFFF.
function byCodePoint(a, b) {
  const x = Array.from(a), y = Array.from(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

// A lone surrogate is no character, and has no UTF-8 form.
const isUnicodeText = (value) => typeof value === "string" && value.isWellFormed();

// What every store keeps alike as text: no lone surrogate, and no NUL, which PostgreSQL refuses.
const isStorableText = (value) => isUnicodeText(value) && !value.includes("\u0000");

const MAX_FREE_TEXT = 2000;

const isFreeText = (value) => isStorableText(value) && codePoints(value) <= MAX_FREE_TEXT;

// --- time -----------------------------------------------------------------------------------

const TIME = /^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{6})Z$/;

// The last representable time: 9999-12-31T23:59:59.999999Z.
const MAX_TIME = BigInt(Date.UTC(9999, 11, 31, 23, 59, 59)) * 1000n + 999999n;

// A time from its text, as BigInt microseconds, or null when the text is no time.
function parseTime(text) {
  if (typeof text !== "string") return null;
  const m = TIME.exec(text);
  if (!m) return null;
  // Year 0 matches the form, but there is no such year in any calendar the specs' times use.
  if (m[1] === "0000") return null;
  // setUTCFullYear, not Date.UTC, which reads the years 0-99 as 1900-1999.
  const date = new Date(0);
  date.setUTCFullYear(+m[1], +m[2] - 1, +m[3]);
  date.setUTCHours(+m[4], +m[5], +m[6], 0);
  // A field that overflows is carried into the next (30 February is 2 March): a time that
  // does not read back as written is no time.
  if (Number.isNaN(date.getTime()) || date.toISOString().slice(0, 19) !== text.slice(0, 19)) return null;
  return BigInt(date.getTime()) * 1000n + BigInt(m[7]);
}

// A stored row's time (written by a decision, so in the one form), or null for none.
const timeOf = (text) => (text === null || text === undefined ? null : parseTime(text));

// The one form, always.
function timeText(us) {
  if (us === null) return null;
  // Floored, not truncated: before 1970 the microseconds are counted up from the second before.
  let seconds = us / 1000000n;
  if (seconds * 1000000n > us) seconds -= 1n;
  const date = new Date(Number(seconds * 1000n));
  return `${date.toISOString().slice(0, 19)}.${String(us - seconds * 1000000n).padStart(6, "0")}Z`;
}

// --- refusing a malformed field -------------------------------------------------------------

// A malformed field, named as the refusal names it.
class Invalid extends Error {
  constructor(field) {
    super(field);
    this.field = field;
  }
}

// A decision's refusal: nothing is written.
const refusal = (code, field = null) => ({ outcome: "refusal", code, field });

// Runs the checks: { value } with what they return, or { refused }, the invalid_request refusal
// naming the first malformed field.
function validated(check) {
  try {
    return { value: check(), refused: null };
  } catch (err) {
    if (err instanceof Invalid) return { refused: refusal("invalid_request", err.field) };
    throw err;
  }
}

function checkId(field, value) {
  if (!isIdentifier(value)) throw new Invalid(field);
}

// An integer of at least 1; JSON true is not one, though it would compare equal to 1 elsewhere.
function checkPositiveInt(field, value) {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 1) throw new Invalid(field);
}

// Durations are integer microseconds on the wire, and positive.
function checkDuration(field, value) {
  if (typeof value !== "number" || !Number.isInteger(value) || value <= 0) throw new Invalid(field);
  return BigInt(value);
}

function checkBool(field, value) {
  if (typeof value !== "boolean") throw new Invalid(field);
}

function checkTime(field, value) {
  const us = parseTime(value);
  if (us === null) throw new Invalid(field);
  return us;
}

// `now` plus a duration, which must end by the last representable time: else the duration's field.
function later(field, now, duration) {
  if (now + duration > MAX_TIME) throw new Invalid(field);
  return now + duration;
}

function checkFreeText(field, value) {
  if (!isFreeText(value)) throw new Invalid(field);
}

module.exports = {
  IDENTIFIER, isIdentifier, isRecord,
  codePoints, byCodePoint, isUnicodeText, isStorableText, MAX_FREE_TEXT, isFreeText,
  MAX_TIME, parseTime, timeOf, timeText,
  Invalid, refusal, validated, checkId, checkPositiveInt, checkDuration, checkBool, checkTime, later, checkFreeText,
};
