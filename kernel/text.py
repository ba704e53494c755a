"""What a string kept by a store may hold.

Rules of this module:

- Every string a store keeps ends up as UTF-8 text, in a TEXT column or
  inside a JSON document.  Two code points cannot be kept that way on every
  store, so no request may carry them:

  - a lone surrogate (U+D800 to U+DFFF) is not a character and has no UTF-8
    form: a value holding one could be stored by one path (escaped in JSON)
    and then never be read back or shown by another;
  - NUL (U+0000): PostgreSQL's text type cannot hold it, while SQLite can.
    Refusing it everywhere keeps the two stores in agreement, instead of one
    of them failing inside its transaction.

- The check is the kernel's, made before any decision is written, and every
  refusal names the field (``correlation.order_id``, ``input.note``,
  ``payload.lines[2].sku``).
- Other control characters are text and are kept as they are; whoever shows
  them on a terminal escapes them (``adapters/render.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .common import SHOWN_LENGTH, shown

_SURROGATES: Final = range(0xD800, 0xE000)


def problem(value: str) -> str | None:
    """Why ``value`` cannot be stored, or None when it can."""
    if "\x00" in value:
        return "contains NUL (U+0000), which a store cannot keep in text"
    # ASCII holds no surrogate, and strict UTF-8 encodes every code point but
    # the surrogates: both ask in C what the loop below asks one character at
    # a time, which is kept to name the first one (a decision's reason, an
    # input's every key and value, are checked on every request).
    if value.isascii():
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return None
    for ch in value:
        if ord(ch) in _SURROGATES:
            return f"contains an unpaired surrogate (U+{ord(ch):04X}), which is not a character"
    return None


def member(field: str, key: object) -> str:
    """How a message names the member ``key`` of the object named ``field``: ``field.key``, or ``field[...]``.

    A key that would garble the message, or flood it, is named as Python
    spells it, cut as :func:`~fencekeeper.kernel.common.shown` cuts a value.
    """
    try:
        spelled = str(key)
    except ValueError:
        # An integer key longer than Python prints (sys.get_int_max_str_digits): named by its type.
        spelled = f"<{type(key).__name__}>"
    plain = spelled.isprintable() and len(spelled) <= SHOWN_LENGTH
    return f"{field}.{spelled}" if plain else f"{field}[{shown(key)}]"


def first_problem(value: object, field: str) -> tuple[str, str] | None:
    """The first string in a JSON-like ``value`` (keys included) that cannot be stored: ``(field, problem)``.

    ``field`` names ``value``; nested fields are named ``field.key`` and
    ``field[index]``.
    """
    if isinstance(value, str):
        found = problem(value)
        return None if found is None else (field, found)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                found = problem(key)
                if found is not None:
                    return (f"{field} key {shown(key)}", found)
            nested = first_problem(item, member(field, key))
            if nested is not None:
                return nested
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            nested = first_problem(item, f"{field}[{index}]")
            if nested is not None:
                return nested
    return None


__all__ = ["first_problem", "member", "problem"]
