"""What every subsystem's decisions check the same way: identifiers, UTC times, durations; how a message quotes a value.

Rules of this module:

- It sits below ``protocol.py`` (workflow executions) and
  ``operations.py`` (durable operations) and imports neither, so that the
  subsystems share one definition of a well-formed identifier and of the
  authoritative time instead of copying them.
- Each check returns ``None`` for a good value and otherwise the *problem*,
  one phrase a refusal message can follow a field name with.  Turning a
  problem into a refusal is the caller's business: each subsystem has its
  own stable refusal codes.
- A message that quotes a value someone gave quotes it through
  :func:`shown` (or :func:`shown_text` for text named unquoted, such as a
  path): a 100,000-character id or a whole JSON document refused is shown
  by its start, never in full, so one error line stays one line of a log.
  A value of ordinary length reads exactly as its ``repr`` (or itself).
- Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Final

SHOWN_LENGTH: Final = 132
"""The most characters :func:`shown` gives for one value, the ``...`` that marks a cut included.

Above the repr of any identifier (128 characters and two quotes): a message
that names an execution, an operation or a journal by a valid id names it
whole, and only a value no identifier could be is cut."""

SHOWN_TEXT_LENGTH: Final = 240
"""The most characters :func:`shown_text` gives: above any path or URL typed in practice."""


def shown(value: object) -> str:
    """``value`` as a message quotes it: its ``repr``, cut to :data:`SHOWN_LENGTH` characters ending ``...``.

    A value whose ``repr`` cannot be made (an integer longer than Python
    prints, a structure nested past the recursion limit) is named by its type.
    """
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__} too large to show>"[:SHOWN_LENGTH]
    return text if len(text) <= SHOWN_LENGTH else text[: SHOWN_LENGTH - 3] + "..."


def shown_text(value: object, limit: int = SHOWN_TEXT_LENGTH) -> str:
    """``str(value)`` as a message names it unquoted (a path, a URL), its middle cut to keep ``limit`` characters.

    The middle goes, not the end: the end of a path names its file.  ``limit`` is at least 5.
    """
    text = str(value)
    if len(text) <= limit:
        return text
    head = (limit - 3) // 2
    return text[:head] + "..." + text[len(text) - (limit - 3 - head) :]


MAX_RATIONALE: Final = 2000
"""The most characters of the free text given with a decision: a finalization's ``reason``, a recovery's
or a review decision's ``rationale``, an operation's cancellation ``reason``, a journal command's
``rationale`` and a failure's ``error``.  Each is kept with the history, a line an operator reads; what a
visit found in full stays in its evidence objects (seed 000, Persistence: bounded diagnostics on the
coordination rows, 'detailed evidence remains generic objects'), as a journal's evidence stays in the
records its events reference (seed 002, Attempts, people, approvals, and outputs).  Here, below every
subsystem, so that all of them bound free text alike."""


IDENTIFIER: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}")
"""An identifier: 1-128 characters, a letter or digit first, then letters, digits and ``. _ : @ / -``."""


def identifier_problem(value: object) -> str | None:
    """Why ``value`` is not an identifier, or None.

    post: (__return__ is None) == (isinstance(value, str) and IDENTIFIER.fullmatch(value) is not None)
    """
    if isinstance(value, str) and IDENTIFIER.fullmatch(value):
        return None
    return f"malformed identifier {shown(value)} (1-128 of A-Z a-z 0-9 . _ : @ / -)"


def utc_problem(value: object) -> str | None:
    """Why ``value`` is not an aware UTC datetime, or None.  Every subsystem is UTC only."""
    if not isinstance(value, datetime):
        return f"must be a datetime, got {type(value).__name__}"
    if value.tzinfo is None or value.utcoffset() is None:
        return "naive datetime; the protocol is UTC only"
    if value.utcoffset() != timedelta(0):
        return f"offset {value.utcoffset()} is not UTC; the protocol is UTC only"
    return None


def duration_problem(value: object) -> str | None:
    """Why ``value`` is not a positive duration, or None."""
    if not isinstance(value, timedelta):
        return f"must be a timedelta, got {type(value).__name__}"
    if value <= timedelta(0):
        return f"must be positive, got {value}"
    return None


def later_problem(now: datetime, duration: timedelta) -> str | None:
    """Why ``now + duration`` cannot be represented, or None."""
    try:
        now + duration
    except OverflowError:
        return f"{duration} from {now.isoformat()} is past the last representable time"
    return None


__all__ = [
    "IDENTIFIER",
    "MAX_RATIONALE",
    "SHOWN_LENGTH",
    "SHOWN_TEXT_LENGTH",
    "duration_problem",
    "identifier_problem",
    "later_problem",
    "shown",
    "shown_text",
    "utc_problem",
]
