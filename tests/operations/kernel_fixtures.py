"""Small builders for operation decisions: one identity, one clock origin, digests of short texts."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from fencekeeper.kernel import operations as o

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SECOND = timedelta(seconds=1)
LEASE = timedelta(seconds=10)
IDENTITY = o.Identity("shop", "tenant-a", "users:v1:alice", "key-1")
GRANTED = o.Authority(True, "users:v1:alice")
POLICY = o.RetryPolicy(
    initial_interval=SECOND,
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    schedule_to_close=timedelta(minutes=10),
)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def submit_request(**changes: object) -> o.SubmitRequest:
    fields: dict[str, object] = {
        "operation_id": "op-1",
        "identity": IDENTITY,
        "action_name": "transfer",
        "action_version": 1,
        "effect_class": o.EffectClass.ATOMIC,
        "input_digest": digest("in"),
        "authority": GRANTED,
        "policy": POLICY,
    }
    fields.update(changes)
    return o.SubmitRequest(**fields)  # type: ignore[arg-type]


def admitted(**changes: object) -> o.Operation:
    outcome = o.submit(None, submit_request(**changes), T0)
    assert isinstance(outcome, o.Decision), outcome
    return outcome.operation


def claimed(operation: o.Operation, worker: str, now: datetime) -> tuple[o.Operation, o.Credential, o.Decision]:
    outcome = o.claim(operation, o.ClaimRequest(worker, LEASE), now)
    assert isinstance(outcome, o.Decision), outcome
    assert outcome.credential is not None
    return outcome.operation, outcome.credential, outcome
