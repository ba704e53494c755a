"""The outbox row every transition appends: what it says, built once, never changed.

Rules of this module:

- One row per transition, of an Operation (seed 001) or of a workflow
  execution (seed 000), written by the store in the transaction that commits
  the transition (Debezium's transactional outbox: nothing is exported that
  did not commit, nothing that committed is lost).  This module only builds
  the row's values; the stores insert them beside the transition.
- ``message_id`` is stable: written once with the row and delivered with it
  every time, so a sink deduplicates on it.  An Operation's is
  ``<operation_id>/<revision>`` (each transition makes one revision); an
  execution's carries a random suffix, since a lease renewal records a
  transition without making a revision.
- ``payload`` is self-contained JSON text: a consumer needs nothing else
  from the database, and pruning the transition history later does not
  change what was or will be exported.  Results and inputs are not in it
  (they may be large or confidential); a consumer reads them by id.
- ``kind`` and ``subject_id`` name the stream whose order the exporter keeps
  (one Operation, one execution).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import TYPE_CHECKING

import attrs

from fencekeeper.kernel import protocol as p

from . import codec

if TYPE_CHECKING:
    # Annotations only: an execution store (a worker's) need not import the operations kernel.
    from fencekeeper.kernel import operations as o


@attrs.frozen
class OutboxRow:
    message_id: str
    kind: str
    subject_id: str
    tenant: str | None
    topic: str
    at: datetime
    payload: str


# One encoder for every row: json.dumps with options builds a new JSONEncoder on each call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _json(fields: dict[str, object]) -> str:
    return _ENCODER.encode(fields)


_quote = json.encoder.encode_basestring_ascii
"""How the encoder above writes a string (ensure_ascii, its default): quoted and escaped, in C."""


def operation_row(operation: o.Operation, transition: o.Transition) -> OutboxRow:
    """The row of an Operation's transition (``operation`` is the Operation after it)."""
    operation_id = operation.operation_id
    identity = operation.identity
    revision = transition.revision
    message_id = f"{operation_id}/{revision}"
    to_state = codec.OPERATION_TEXT[transition.to_state]
    topic = f"operation.{to_state}"
    event = None if transition.event is None else codec.OPERATION_TEXT[transition.event]
    from_state = None if transition.from_state is None else codec.OPERATION_TEXT[transition.from_state]
    outcome = None if operation.outcome is None else operation.outcome.value
    at = codec.encode_time(transition.at)
    texts = (operation_id, identity.namespace, identity.tenant, operation.action_name, transition.actor,
             transition.reason, to_state)
    optional = (event, from_state, outcome, operation.error_code)
    if (
        all(type(text) is str for text in texts)
        and all(value is None or type(value) is str for value in optional)
        and type(operation.action_version) is int
        and type(revision) is int
    ):
        # Written out in canonical order (the keys sorted), as execution_row writes its payload: the same text
        # as the generic encoder below, in about half its time, on the row of every Operation decision.
        payload = (
            f'{{"action_name":{_quote(operation.action_name)},"action_version":{operation.action_version},'
            f'"actor":{_quote(transition.actor)},"at":{_quote(at)},"error_code":{_optional(operation.error_code)},'
            f'"event":{_optional(event)},"from_state":{_optional(from_state)},"kind":"operation",'
            f'"message_id":{_quote(message_id)},"namespace":{_quote(identity.namespace)},'
            f'"operation_id":{_quote(operation_id)},"outcome":{_optional(outcome)},'
            f'"reason":{_quote(transition.reason)},"revision":{revision},"tenant":{_quote(identity.tenant)},'
            f'"to_state":{_quote(to_state)},"topic":{_quote(topic)}}}'
        )
    else:
        payload = _json(
            {
                "kind": "operation",
                "message_id": message_id,
                "topic": topic,
                "operation_id": operation_id,
                "namespace": identity.namespace,
                "tenant": identity.tenant,
                "action_name": operation.action_name,
                "action_version": operation.action_version,
                "revision": revision,
                "event": event,
                "from_state": from_state,
                "to_state": to_state,
                "at": at,
                "actor": transition.actor,
                "reason": transition.reason,
                "outcome": outcome,
                "error_code": operation.error_code,
            }
        )
    return OutboxRow(message_id, "operation", operation_id, identity.tenant, topic, transition.at, payload)


def _optional(text: str | None) -> str:
    return "null" if text is None else _quote(text)


def execution_row(record: p.TransitionRecord, business_id: str | None) -> OutboxRow:
    """The row of one execution transition record; ``business_id`` when the decision knows it."""
    r = record
    # 64 random bits, 16 hex digits: what the message id needs (unique per
    # transition, a renewal's too), without building a UUID (os.urandom is
    # a fifth of uuid4's cost, on two rows of every decision).
    message_id = f"{r.execution_id}/{r.revision}/{os.urandom(8).hex()}"
    to_state = codec.TEXT[r.to_state]
    topic = f"execution.{to_state}"
    event = None if r.event is None else codec.TEXT[r.event]
    from_state = None if r.from_state is None else codec.TEXT[r.from_state]
    at = codec.encode_time(r.at)
    if (
        type(r.execution_id) is str
        and type(r.revision) is int
        and type(r.fence) is int
        and type(r.actor) is str
        and type(r.reason) is str
        and (business_id is None or type(business_id) is str)
    ):
        # Written out in canonical order (the keys sorted), as codec.encode_execution writes an
        # execution: the same text as the generic encoder below, in a third of its time.
        payload = (
            f'{{"actor":{_quote(r.actor)},"at":"{at}",'
            + ("" if business_id is None else f'"business_id":{_quote(business_id)},')
            + f'"event":{"null" if event is None else _quote(event)},"execution_id":{_quote(r.execution_id)},'
            f'"fence":{r.fence},"from_state":{"null" if from_state is None else _quote(from_state)},'
            f'"kind":"execution","message_id":{_quote(message_id)},"reason":{_quote(r.reason)},'
            f'"revision":{r.revision},"to_state":{_quote(to_state)},"topic":{_quote(topic)}}}'
        )
        return OutboxRow(message_id, "execution", r.execution_id, business_id, topic, r.at, payload)
    fields: dict[str, object] = {
        "kind": "execution",
        "message_id": message_id,
        "topic": topic,
        "execution_id": r.execution_id,
        "revision": r.revision,
        "event": event,
        "from_state": from_state,
        "to_state": to_state,
        "at": at,
        "actor": r.actor,
        "fence": r.fence,
        "reason": r.reason,
    }
    if business_id is not None:
        fields["business_id"] = business_id
    return OutboxRow(message_id, "execution", r.execution_id, business_id, topic, r.at, _json(fields))


OUTBOX_INSERT = (
    "INSERT INTO outbox (message_id, kind, subject_id, tenant, topic, at, payload) VALUES (?, ?, ?, ?, ?, ?, ?)"
)

__all__ = ["OUTBOX_INSERT", "OutboxRow", "execution_row", "operation_row"]
