"""JSON as a person writes it (a definition, an input, a journal command), read to mean exactly one thing.

Rules of this module:

- :func:`loads` is ``json.loads`` with four refusals added, each a
  :class:`StrictJsonError` whose message completes "not valid JSON: ...":
  a member named twice in one object (``json`` keeps the last without a
  word, so ``{"amount": 1, "amount": 100}`` would be taken to mean one of
  them; TOML refuses it, and so does this reader, so that a definition's two
  forms mean one thing); ``NaN``, ``Infinity`` and ``-Infinity``, which are
  not JSON numbers; and nesting deeper than the parser can follow. An
  integer literal longer than Python converts (``sys.get_int_max_str_digits``,
  4300 digits by default) is refused the same way, not left to ``json``'s
  bare ``ValueError``.
- ``json``'s own syntax errors (``json.JSONDecodeError``) are the caller's
  to word: it knows whether a line and column help its reader.
- Nothing else is checked here: what a value must be is the reader's of
  that value (the definition's, the journal's, an action's normaliser).
"""

from __future__ import annotations

import json
from typing import Any

from .common import shown

__all__ = ["StrictJsonError", "loads"]


class StrictJsonError(ValueError):
    """JSON that parses but does not mean one thing; the message completes "not valid JSON: ..."."""


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise StrictJsonError(f"duplicate key {shown(key)} in an object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise StrictJsonError(f"{name} is not a JSON number")


def _integer(digits: str) -> int:
    try:
        return int(digits)
    except ValueError:
        # Longer than sys.get_int_max_str_digits(): json would raise a bare ValueError no caller words.
        raise StrictJsonError(f"an integer of {len(digits.lstrip('-'))} digits is longer than this reader converts") from None


def loads(text: str | bytes) -> Any:
    """The value ``text`` holds; :class:`StrictJsonError` or ``json.JSONDecodeError`` if it holds none."""
    try:
        return json.loads(text, object_pairs_hook=_unique_members, parse_constant=_no_constant, parse_int=_integer)
    except RecursionError:
        raise StrictJsonError("nested too deeply") from None
