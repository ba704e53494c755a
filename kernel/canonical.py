"""The journal's canonical codec: RFC 8785 (JCS) bytes and their SHA-256 digests.

The DAG node journal contract (seed 002: Key types and services,
``WorkflowExecutionCanonicalCodec``; Hash chain, requests, and concurrency).
The byte-level specification is ``specs/journal.md``; rules of this module:

- A record has exactly one byte string: the RFC 8785 canonical form of its
  JSON value, UTF-8, with nothing before or after it.  Canonicalisation is
  the ``rfc8785`` package's, not ours: key order by UTF-16 code units,
  ECMAScript number formatting and the escape rules are easy to get subtly
  wrong, and another implementation can use any conforming JCS library and
  produce the same bytes.
- A digest is ``"sha256:"`` and 64 lowercase hexadecimal digits, over those
  bytes.  The prefix names the algorithm inside the chain itself, so a later
  algorithm can be told apart from this one by reading a record.
- Reading is strict (:func:`parse_canonical`): the bytes must be valid
  UTF-8 JSON, an object, with no duplicate member, no float, no integer
  outside JSON's exact range, and must be byte-for-byte the canonical form
  of what they parse to.  Anything else is refused with a stable code
  (:class:`~.journal_codes.JournalCode`); nothing is repaired or normalised on the way in,
  because a record that was re-encoded is no longer the record that was
  digested.
- The journal's records hold strings, whole numbers, booleans, null,
  arrays and objects only.  Floats are refused on both sides: a number that
  two languages may print differently has no place in a digest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Final, TypeAlias

import rfc8785

from .journal_codes import JournalCode, JournalError

Json: TypeAlias = str | int | bool | Sequence["Json"] | Mapping[str, "Json"] | None
"""A JSON value the codec accepts (no floats)."""

DIGEST: Final = re.compile(r"sha256:[0-9a-f]{64}")
"""The only digest spelling: algorithm prefix, 64 lowercase hex digits."""

_MAX_EXACT = 2**53 - 1


def canonical_bytes(value: Json) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value``, from the ``rfc8785`` package.

    Raises JournalError(``malformed_record``) for a float, an integer outside
    JSON's exact range, or a string that is not valid Unicode.
    """
    _refuse_floats(value)
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError, TypeError) as exc:
        raise JournalError(JournalCode.MALFORMED_RECORD, f"cannot canonicalise: {exc}") from None


def record_bytes(value: Json) -> bytes:
    """:func:`canonical_bytes` for the journal's own records, by the standard library's encoder.

    For a value whose member names are ASCII and whose numbers are whole
    numbers in JSON's exact range, ``json.dumps`` with sorted keys, no
    whitespace and no ASCII escaping writes exactly the RFC 8785 bytes: for
    ASCII names, code-point order is UTF-16 code-unit order, and both escape
    exactly ``"``, ``\\`` and the control characters, with the same short
    forms and lowercase ``\\u00xx`` for the rest.  The journal's headers,
    events and requests are built from typed values that are always such
    values (member names are the format's, numbers are ordinals and attempt
    sequences, checked in range), so they are encoded in C, about twenty
    times faster; tests/journal/test_codec.py checks the two encoders agree
    on that domain.
    """
    try:
        return _dumps(value)
    except (UnicodeEncodeError, ValueError) as exc:
        raise JournalError(JournalCode.MALFORMED_RECORD, f"cannot canonicalise: {exc}") from None


# One encoder for every record: json.dumps with these options would build a new one per call.
_ENCODER: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dumps(value: object) -> bytes:
    return _ENCODER.encode(value).encode()


# The encoder's own string escaper (json.encoder passes this very function
# to its C encoder when ensure_ascii is off), called without the encoder.
_escape: Final = json.encoder.encode_basestring


def value_text(value: Json) -> str:
    """The text :func:`record_bytes` writes for ``value`` as a member of a record.

    For assembling a record from its members' texts, in canonical order,
    where building the whole value and encoding it would cost several times
    more: strings, whole numbers and null (nearly every member) are written
    as the encoder writes them, without setting it up; anything else is the
    encoder's.  The text is str: :func:`text_bytes` makes the record's bytes.
    """
    if type(value) is str:
        return _escape(value)
    if value is None:
        return "null"
    if type(value) is int:
        return int.__repr__(value)
    try:
        return _ENCODER.encode(value)
    except ValueError as exc:
        raise JournalError(JournalCode.MALFORMED_RECORD, f"cannot canonicalise: {exc}") from None


def text_bytes(text: str) -> bytes:
    """The UTF-8 bytes of a record assembled from :func:`value_text`, refused as :func:`record_bytes` refuses."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise JournalError(JournalCode.MALFORMED_RECORD, f"cannot canonicalise: {exc}") from None


def digest_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(value: Json) -> str:
    """The digest of ``value``'s canonical bytes."""
    return digest_bytes(canonical_bytes(value))


def is_digest(text: object) -> bool:
    return isinstance(text, str) and DIGEST.fullmatch(text) is not None


def _refuse_floats(value: Json) -> None:
    if isinstance(value, float):
        raise JournalError(JournalCode.MALFORMED_RECORD, f"a float ({value!r}) is not allowed in a record")
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if not -_MAX_EXACT <= value <= _MAX_EXACT:
            raise JournalError(JournalCode.MALFORMED_RECORD, f"integer {value} is outside JSON's exact range")
        return
    if isinstance(value, Mapping):
        for item in value.values():
            _refuse_floats(item)
        return
    for item in value:
        _refuse_floats(item)


def _exact_int(text: str) -> int:
    value = int(text)
    if not -_MAX_EXACT <= value <= _MAX_EXACT:
        raise JournalError(JournalCode.MALFORMED_RECORD, f"integer {text} is outside JSON's exact range")
    return value


def _no_float(text: str) -> object:
    raise JournalError(JournalCode.MALFORMED_RECORD, f"a float ({text}) is not allowed in a record")


def _no_constant(text: str) -> object:
    raise JournalError(JournalCode.NON_CANONICAL, f"{text} is not JSON")


def parse_canonical(data: bytes) -> dict[str, object]:
    """The JSON object ``data`` holds, if ``data`` is exactly its canonical form.

    Raises JournalError: ``non_canonical`` for bytes that are not JSON, not
    UTF-8, or not byte-identical to the canonical form of their value;
    ``malformed_record`` for a value that is not an object or holds a float.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JournalError(JournalCode.NON_CANONICAL, f"not UTF-8 at byte {exc.start}") from None
    try:
        value = json.loads(text, parse_float=_no_float, parse_int=_exact_int, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise JournalError(JournalCode.NON_CANONICAL, f"not JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:
        # Bytes anyone can write (a chain file, a row): too deep to read is a bad record, not a crash.
        raise JournalError(JournalCode.NON_CANONICAL, "not JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise JournalError(JournalCode.MALFORMED_RECORD, f"a record is a JSON object, not {type(value).__name__}")
    # A member given twice parses to one member and so re-encodes shorter:
    # the comparison refuses duplicates too.  ASCII bytes have ASCII member
    # names and (floats and big integers refused above) only exact whole
    # numbers, where record_bytes is exact; anything else takes the package.
    expected = record_bytes(value) if data.isascii() else canonical_bytes(value)
    if expected != data:
        raise JournalError(JournalCode.NON_CANONICAL, "the bytes are not the RFC 8785 canonical form of their value")
    return value
