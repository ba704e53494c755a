"""What every layer's generated cases share: the suite's version, its layers and its times.

Rules of this module:

- Times carry odd microseconds, so that an implementation that rounds to
  the second or the millisecond fails; every layer builds its moments from
  :data:`T0`.
- It imports nothing of the layers, so each layer's module can import it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

SUITE_VERSION = "4.8.0"
"""Semantic version of the case format and contents (specs/conformance.md, Versions)."""

Case = dict[str, Any]

LAYERS = ("machines", "protocol", "recovery", "expressions", "definitions", "operations", "journal", "journal-append", "interpreter", "store")

T0 = datetime(2026, 3, 1, 12, 0, 0, 123457, tzinfo=UTC)
LEASE = timedelta(seconds=30, microseconds=1)
US = timedelta(microseconds=1)
