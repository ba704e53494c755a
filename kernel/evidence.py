"""Generic evidence objects: what a decision commits beside the execution's own rows.

The workflow execution contract (seed 000: Purpose and Invariants; Generic
Step-Attempt Object; Persistence) keeps every semantic fact in the generic
object/revision model.  Rules of this module:

- An evidence object has a stable identity (``object_id``), a type
  (``kind``: ``StepAttempt``, ``ApprovalRequest``, ``ApprovalDecision``,
  ``CommandOutcome``, ``ExecutionInput``, ...), a revision and a body.
- Revision 1 creates the object; revision *n* + 1 appends to it and is
  accepted only on top of revision *n* (a compare-and-set on the object's
  revision, checked by the store in the same transaction as the decision).
  Nothing is ever overwritten: every revision stays readable, which is how
  "an existing attempt is never overwritten to conceal a prior try" holds.
- ``state`` is the lifecycle state the revision records (an attempt's
  ``running``, ``completed``, ...), kept beside the body so that stores can
  index it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

# Built once: json.dumps with options builds a new encoder on every call.  It
# keeps no state between calls, so sharing it writes the same text.
_BODY_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


@attrs.frozen
class Evidence:
    """One revision of a generic evidence object, committed with a decision."""

    object_id: str
    kind: str
    body: Mapping[str, Any] = attrs.field(factory=dict, eq=False, hash=False)
    revision: int = 1
    state: str | None = None

    def body_json(self) -> str:
        """The body as canonical JSON text (sorted keys), as stores write it."""
        return _BODY_ENCODER.encode(self.body)

    def next(self, state: str | None, body: Mapping[str, Any]) -> Evidence:
        """The following revision of this object, with ``body`` merged over the current one."""
        return Evidence(self.object_id, self.kind, {**self.body, **body}, self.revision + 1, state)


__all__ = [
    "Evidence",
]
