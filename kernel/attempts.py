"""Step attempts: one generic object per node visit, its lifecycle driven by the attempt table.

The workflow execution contract (seed 000: Generic Step-Attempt Object).  Rules of
this module:

- Every node visit is its own attempt with an immutable identity, its
  execution/revision/node binding, start evidence and original inputs, all
  in revision 1, which is created ``pending`` *before* the node's
  consequential work.
- A lifecycle change is a new revision whose state is what
  ``machines.ATTEMPT`` says the event leads to: a change the table does not
  admit raises :class:`~fencekeeper.kernel.errors.IllegalTransition`, so an
  attempt can never, say, leave ``completed``.  Outcome evidence is added
  to the body; nothing in an earlier revision is removed or changed.
- An attempt's identity is derived from the execution revision at which the
  visit starts.  Every visit ends in a new execution revision (a step, a
  finalization) or in an expired lease, after which only a governed
  recovery, itself a new revision, lets a visit happen again; so no two
  visits share an identity, and a retry is always a new attempt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from .evidence import Evidence
from .machines import ATTEMPT, AttemptEvent, AttemptState
from .protocol import Execution

STEP_ATTEMPT: Final = "StepAttempt"
_MAX_ID: Final = 128


def attempt_id(execution: Execution) -> str:
    """The identity of the visit that starts at this execution revision."""
    candidate = f"{execution.execution_id}/a{execution.revision}"
    if len(candidate) <= _MAX_ID:
        return candidate
    # Identifiers are at most 128 characters; a long execution id keeps a
    # readable prefix and a digest that still makes the identity unique.
    digest = hashlib.sha256(candidate.encode()).hexdigest()[:24]
    return f"{execution.execution_id[:_MAX_ID - 30]}/a{execution.revision}.{digest}"[:_MAX_ID]


def start(
    execution: Execution,
    *,
    node_id: str,
    node_revision: int,
    node_kind: str,
    worker_id: str,
    fence: int,
    inputs: Mapping[str, Any],
    now: datetime,
) -> Evidence:
    """Revision 1: identity, binding, start evidence and inputs; ``pending``."""
    identity = attempt_id(execution)
    return Evidence(
        identity,
        STEP_ATTEMPT,
        {
            "attempt_id": identity,
            "execution_id": execution.execution_id,
            "execution_revision": execution.revision,
            "business_id": execution.business_id,
            "definition_id": execution.definition_id,
            "definition_revision": execution.definition_revision,
            "node_id": node_id,
            "node_revision": node_revision,
            "node_kind": node_kind,
            "step": execution.step_count + 1,
            "started_at": now.isoformat(),
            "worker_id": worker_id,
            "fence": fence,
            "inputs": dict(inputs),
            "status": AttemptState.PENDING.value,
        },
        1,
        AttemptState.PENDING.value,
    )


def state_of(attempt: Evidence) -> AttemptState:
    """The attempt machine's state of a step attempt's evidence object (its ``state`` field, as the enum)."""
    known = _ATTEMPT_STATES.get(attempt.state) if type(attempt.state) is str else None
    return known if known is not None else AttemptState(attempt.state)


_ATTEMPT_STATES: Final[dict[str, AttemptState]] = {state.value: state for state in AttemptState}
"""The state each value names: what ``AttemptState(value)`` returns, by a lookup (every attempt revision asks)."""


def advance(attempt: Evidence, event: AttemptEvent, **outcome: Any) -> Evidence:
    """The next revision after ``event``; raises IllegalTransition if the attempt table does not admit it."""
    state = ATTEMPT.step(state_of(attempt), event)
    value = state.value
    return attempt.next(value, {**outcome, "status": value})


def settle(attempt: Evidence, *events: AttemptEvent, **outcome: Any) -> tuple[Evidence, ...]:
    """Several lifecycle steps committed together (a pure node starts and completes in one commit)."""
    revisions: list[Evidence] = []
    current = attempt
    for index, event in enumerate(events):
        current = advance(current, event, **(outcome if index == len(events) - 1 else {}))
        revisions.append(current)
    return tuple(revisions)


def completed_by_wake(
    attempt: Evidence | None,
    reason: str,
    source_id: str,
    outputs: Mapping[str, Any],
    payload_withheld: str | None = None,
) -> tuple[Evidence, ...]:
    """The waiting attempt's completion, committed with the wake that ends its wait.

    A wait or approval attempt stays ``running`` while it waits; whatever
    wakes it (an Event, a Decision, a timeout) completes it, recording what
    woke it and the outputs later nodes may read.  Nothing for an attempt that
    is not waiting (absent, or already settled).  ``payload_withheld`` says
    why an Event's payload is not among the outputs
    (:func:`~fencekeeper.kernel.events.wake_outputs`); the wake records it.
    """
    if attempt is None or attempt.state != AttemptState.RUNNING.value:
        return ()
    wake = {"reason": reason, "source_id": source_id}
    if payload_withheld is not None:
        wake["payload_withheld"] = payload_withheld
    return (advance(attempt, AttemptEvent.COMPLETE, wake=wake, outputs=dict(outputs)),)


__all__ = [
    "STEP_ATTEMPT",
    "advance",
    "attempt_id",
    "completed_by_wake",
    "settle",
    "start",
    "state_of",
]
