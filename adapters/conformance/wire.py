"""The JSON form of the protocol's values, as the conformance cases and drivers spell them.

Rules of this module (specs/conformance.md, "Values"):

- A time is an RFC 3339 string with exactly six fractional digits and ``Z``
  (``2026-01-01T00:00:00.000001Z``): microseconds are part of every case, so
  an implementation that keeps whole seconds fails.  A time the kernel must
  refuse (no offset, another offset) is sent as written; decoding never
  "fixes" one.
- A duration is an integer number of microseconds.
- Field names are the kernel's (specs/protocol.md), so a reader can match a
  case to a table row there.  Free text (refusal messages, history reasons,
  authority reasons) is never encoded: comparisons use codes, states,
  fields and values only.
- Decoding is lenient in type (a malformed field reaches the kernel, which
  names it in its refusal); encoding is total over what the kernel returns.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import from_json, to_json
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState
from fencekeeper.kernel.recovery import RecoveryFacts, recover

Json = Any


class WireError(ValueError):
    """A request whose JSON does not have the shape of the conformance format (not a kernel refusal)."""


def _get(data: Any, name: str, default: Any = None) -> Any:
    """A field of a JSON object, as Any: what a field holds is for the kernel to judge."""
    return data.get(name, default)


# --- times and durations -----------------------------------------------------------


def time_text(value: datetime | None) -> str | None:
    """A time in the one spelling the cases use: six fractional digits, ``Z`` for UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
    offset = value.utcoffset()
    if offset == timedelta(0):
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value.isoformat(timespec="microseconds")


def parse_time(value: Json) -> Any:
    """A datetime from its text; anything else is passed on for the kernel to refuse."""
    if not isinstance(value, str):
        return value
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return value
    if parsed.tzinfo is not None and parsed.utcoffset() == timedelta(0):
        return parsed.astimezone(UTC)
    return parsed


def shift_times(value: Json, by: timedelta) -> Json:
    """``value`` with every time in it (at any depth) moved by ``by``; relative order and distances kept."""
    if isinstance(value, dict):
        return {k: shift_times(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [shift_times(v, by) for v in value]
    if isinstance(value, str):
        moment = parse_time(value)
        if isinstance(moment, datetime) and moment.tzinfo is not None:
            return time_text(moment + by)
    return value


def duration_us(value: timedelta | None) -> int | None:
    if value is None:
        return None
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def parse_duration(value: Json) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return timedelta(microseconds=value)
        except OverflowError:
            return value
    return value


# --- snapshots -----------------------------------------------------------------------


def _key(key: p.WaitKey | None) -> Json:
    if key is None:
        return None
    return {"execution_id": key.execution_id, "node_id": key.node_id, "attempt_id": key.attempt_id}


def parse_key(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.WaitKey(_get(data, "execution_id"), _get(data, "node_id"), _get(data, "attempt_id"))


def execution(value: p.Execution | None) -> Json:
    if value is None:
        return None
    return {
        "execution_id": value.execution_id,
        "business_id": value.business_id,
        "state": value.state.value,
        "revision": value.revision,
        "definition_id": value.definition_id,
        "definition_revision": value.definition_revision,
        "current_node_id": value.current_node_id,
        "step_count": value.step_count,
        "fence": value.fence,
        "wait": _key(value.wait),
    }


def parse_execution(data: Json) -> p.Execution | None:
    if data is None:
        return None
    return p.Execution(
        execution_id=data["execution_id"],
        business_id=data["business_id"],
        state=ExecutionState(data["state"]),
        revision=data["revision"],
        definition_id=data["definition_id"],
        definition_revision=data["definition_revision"],
        current_node_id=data["current_node_id"],
        step_count=data["step_count"],
        fence=data["fence"],
        wait=parse_key(data["wait"]) if data["wait"] is not None else None,
    )


def dispatch(value: p.Dispatch | None) -> Json:
    if value is None:
        return None
    return {
        "workflow_execution_id": value.workflow_execution_id,
        "dispatch_state": value.dispatch_state.value,
        "eligible_at": time_text(value.eligible_at),
        "lease_token": value.lease_token,
        "leased_by": value.leased_by,
        "lease_expires_at": time_text(value.lease_expires_at),
        "step_count": value.step_count,
        "last_error_code": value.last_error_code,
    }


def parse_dispatch(data: Json) -> p.Dispatch | None:
    if data is None:
        return None
    return p.Dispatch(
        workflow_execution_id=data["workflow_execution_id"],
        dispatch_state=DispatchState(data["dispatch_state"]),
        eligible_at=parse_time(data["eligible_at"]),
        lease_token=data["lease_token"],
        leased_by=data["leased_by"],
        lease_expires_at=parse_time(data["lease_expires_at"]),
        step_count=data["step_count"],
        last_error_code=data["last_error_code"],
    )


def _pairs(value: tuple[tuple[str, str], ...]) -> Json:
    return [[a, b] for a, b in value]


def _parse_pairs(data: Json) -> Any:
    if isinstance(data, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in data):
        return tuple((pair[0], pair[1]) for pair in data)
    return data


def wait_spec(value: p.WaitSpec | None) -> Json:
    if value is None:
        return None
    return {
        "node_id": value.node_id,
        "attempt_id": value.attempt_id,
        "event_type": value.event_type,
        "correlation": _pairs(value.correlation),
        "wake_at": time_text(value.wake_at),
        "timeout": value.timeout,
        "wake_after": duration_us(value.wake_after),
        "continuations": _pairs(value.continuations),
    }


def parse_wait_spec(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.WaitSpec(
        node_id=_get(data, "node_id"),
        attempt_id=_get(data, "attempt_id"),
        event_type=_get(data, "event_type"),
        correlation=_parse_pairs(_get(data, "correlation", [])),
        wake_at=parse_time(_get(data, "wake_at")),
        timeout=_get(data, "timeout", False),
        wake_after=parse_duration(_get(data, "wake_after")),
        continuations=_parse_pairs(_get(data, "continuations", [])),
    )


def registration(value: p.WaitRegistration | None) -> Json:
    if value is None:
        return None
    return {
        "key": _key(value.key),
        "business_id": value.business_id,
        "spec": wait_spec(value.spec),
        "woken_by": value.woken_by,
        "wake_reason": value.wake_reason.value if value.wake_reason is not None else None,
        "closed_by": value.closed_by,
    }


def parse_registration(data: Json) -> p.WaitRegistration | None:
    if data is None:
        return None
    return p.WaitRegistration(
        key=parse_key(data["key"]),
        business_id=data["business_id"],
        spec=parse_wait_spec(data["spec"]),
        woken_by=data["woken_by"],
        wake_reason=p.WakeReason(data["wake_reason"]) if data["wake_reason"] is not None else None,
        closed_by=data["closed_by"],
    )


def recovery_record(value: p.RecoveryRecord | None) -> Json:
    if value is None:
        return None
    proof = value.proof
    return {
        "command_id": value.command_id,
        "kind": value.kind.value,
        "execution_id": value.execution_id,
        "expected_revision": value.expected_revision,
        "resulting_revision": value.resulting_revision,
        "resulting_state": value.resulting_state.value,
        "proof": None
        if proof is None
        else {
            "no_unresolved_command": proof.no_unresolved_command,
            "dependencies_current": proof.dependencies_current,
            "continuation_approved": proof.continuation_approved,
            "continuation": proof.continuation,
            "approved_by": proof.approved_by,
        },
    }


def parse_recovery_record(data: Json) -> p.RecoveryRecord | None:
    if data is None:
        return None
    # A stored record is given without its proof: replay compares identity only.
    return p.RecoveryRecord(
        command_id=data["command_id"],
        kind=p.RecoveryKind(data["kind"]),
        execution_id=data["execution_id"],
        expected_revision=data["expected_revision"],
        resulting_revision=data["resulting_revision"],
        resulting_state=ExecutionState(data["resulting_state"]),
    )


# --- requests -------------------------------------------------------------------------


def authority(value: p.Authority) -> Json:
    return {"granted": value.granted, "principal_id": value.principal_id}


def parse_authority(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.Authority(granted=_get(data, "granted"), principal_id=_get(data, "principal_id"))


def credential(value: p.LeaseCredential | None) -> Json:
    if value is None:
        return None
    return {"worker_id": value.worker_id, "lease_token": value.lease_token, "fence": value.fence}


def parse_credential(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.LeaseCredential(_get(data, "worker_id"), _get(data, "lease_token"), _get(data, "fence"))


def step(value: p.StepRecord | None) -> Json:
    if value is None:
        return None
    return {"node_id": value.node_id, "attempt_id": value.attempt_id, "next_node_id": value.next_node_id}


def parse_step(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.StepRecord(_get(data, "node_id"), _get(data, "attempt_id"), _get(data, "next_node_id"))


def parse_request(decision: str, data: Json) -> Any:
    """The kernel request a decision takes, from its JSON form."""
    d = data
    if decision == "admit":
        return p.AdmitRequest(
            d["execution_id"], d["business_id"], d["definition_id"], d["definition_revision"],
            d["start_node_id"], parse_authority(d["authority"]),
        )
    if decision == "claim":
        return p.ClaimRequest(d["worker_id"], d["lease_token"], parse_duration(d["lease_duration"]))
    if decision == "renew":
        return p.RenewRequest(parse_credential(d["credential"]), parse_duration(d["lease_duration"]))
    if decision == "record_step":
        return p.StepRequest(
            parse_credential(d["credential"]), d["expected_revision"], parse_step(d["step"]),
            parse_authority(d["authority"]),
        )
    if decision == "release":
        return p.ReleaseRequest(parse_credential(d["credential"]), d["expected_revision"])
    if decision == "fenced":
        # An evidence append names no request of its own: the credential it is made under is the request.
        return parse_credential(d["credential"])
    if decision == "finalize":
        return p.FinalizeRequest(
            execution_id=d["execution_id"], dispatch_id=d["dispatch_id"], worker_id=d["worker_id"],
            lease_token=d["lease_token"], fence=d["fence"], target_state=d["target_state"],
            business_id=d["business_id"], expected_revision=d["expected_revision"],
            authority=parse_authority(d["authority"]),
            step=parse_step(d["step"]) if d.get("step") is not None else None,
            wait=parse_wait_spec(d["wait"]) if d.get("wait") is not None else None,
            reason=d.get("reason", ""), error_code=d.get("error_code"),
        )
    if decision == "wake":
        reason: Any = d["reason"]
        with contextlib.suppress(ValueError):
            reason = p.WakeReason(reason)
        return p.WakeRequest(
            key=parse_key(d["key"]), reason=reason, source_id=d["source_id"], business_id=d["business_id"],
            authority=parse_authority(d["authority"]), event_type=d.get("event_type"),
            correlation=_parse_pairs(d.get("correlation", [])), outcome=d.get("outcome"),
        )
    if decision == "cancel":
        return p.CancelRequest(d["execution_id"], d["business_id"], d["expected_revision"], parse_authority(d["authority"]))
    if decision == "recover":
        return p.RecoveryRequest(
            command_id=d["command_id"], kind=p.RecoveryKind(d["kind"]), execution_id=d["execution_id"],
            business_id=d["business_id"], expected_revision=d["expected_revision"], actor_id=d["actor_id"],
            authority=parse_authority(d["authority"]), command_to_reconcile=d.get("command_to_reconcile"),
            next_node_id=d.get("next_node_id"), rationale=d.get("rationale", ""),
        )
    raise WireError(f"unknown decision {decision!r}")


# --- outcomes -------------------------------------------------------------------------


def guard(value: p.Guard) -> Json:
    return {
        "execution_id": value.execution_id,
        "expected_revision": value.expected_revision,
        "expected_state": value.expected_state.value if value.expected_state is not None else None,
        "expected_dispatch_state": (
            value.expected_dispatch_state.value if value.expected_dispatch_state is not None else None
        ),
        "expected_lease_token": value.expected_lease_token,
        "expected_lease_expires_at": time_text(value.expected_lease_expires_at),
        "expected_fence": value.expected_fence,
        "requires_live_lease": value.requires_live_lease,
    }


def outcome(value: p.Outcome | None) -> Json:
    """An outcome in the form the cases compare: codes, fields, states and values only."""
    if value is None:
        return {"outcome": "none"}
    if isinstance(value, p.Refusal):
        return {"outcome": "refusal", "code": value.code.value, "field": value.field}
    if isinstance(value, p.Unchanged):
        return {"outcome": "unchanged", "code": value.code.value, "record": recovery_record(value.record)}
    closes = value.closes
    return {
        "outcome": "decision",
        "guard": guard(value.guard),
        "execution": execution(value.execution),
        "dispatch": dispatch(value.dispatch),
        "registration": registration(value.registration),
        "recovery": recovery_record(value.recovery),
        "lease": credential(value.lease),
        "closes": None if closes is None else {"key": _key(closes.key), "by": closes.by.value},
    }


def decide(decision: str, rows: Json, request: Json, now: Json) -> Json:
    """The kernel's outcome for one protocol-decision case, in JSON form: the reference driver's answer."""
    if decision == "decide_approval":
        return approval_outcome(rows, request)
    at = parse_time(now)
    execution_row = parse_execution(rows.get("execution"))
    dispatch_row = parse_dispatch(rows.get("dispatch"))
    parsed = parse_request(decision, request)
    result: p.Outcome
    if decision == "admit":
        result = p.admit(execution_row, parsed, at, id_taken=bool(rows.get("id_taken", False)))
    elif decision == "claim":
        result = p.claim(execution_row, dispatch_row, parsed, at)
    elif decision == "renew":
        result = p.renew(execution_row, dispatch_row, parsed, at)
    elif decision == "record_step":
        result = p.record_step(execution_row, dispatch_row, parsed, at)
    elif decision == "release":
        result = p.release(execution_row, dispatch_row, parsed, at)
    elif decision == "fenced":
        result = p.fenced(execution_row, dispatch_row, parsed, at)
    elif decision == "finalize":
        result = p.finalize(execution_row, dispatch_row, parsed, at)
    elif decision == "wake":
        result = p.wake(execution_row, dispatch_row, parse_registration(rows.get("registration")), parsed, at)
    elif decision == "cancel":
        result = p.cancel(execution_row, dispatch_row, parsed, at)
    elif decision == "recover":
        result = recover(
            execution_row, dispatch_row, parse_recovery_record(rows.get("recovery")), parsed, at,
            facts=parse_facts(rows.get("facts")),
        )
        if "facts" in rows:
            # Cases 2.10.0: with the store's facts a resume settles attempts itself; what it writes of
            # them is compared by identity, revision and state (a settlement's detail is text).
            written = outcome(result)
            if isinstance(result, p.Decision):
                written["objects"] = [
                    {"object_id": o.object_id, "kind": o.kind, "revision": o.revision, "state": o.state}
                    for o in result.objects
                ]
            return written
    else:
        raise WireError(f"unknown decision {decision!r}")
    return outcome(result)


def facts(value: RecoveryFacts) -> Json:
    """The store's facts a recovery decides on (cases 2.10.0): evidence, the pinned definition, the submission."""
    return {
        "evidence": [evidence(item) for item in value.evidence],
        "definition": None if value.definition is None else json.loads(to_json(value.definition)),
        "submitted": [evidence(item) for item in value.submitted],
    }


def parse_facts(data: Json) -> RecoveryFacts:
    """The facts of a ``recover`` case; a case without them is a store that holds nothing."""
    if data is None:
        return RecoveryFacts()
    definition = data.get("definition")
    return RecoveryFacts(
        evidence=tuple(parse_evidence(item) for item in data.get("evidence", [])),  # type: ignore[misc]
        definition=None if definition is None else from_json(json.dumps(definition)),
        submitted=tuple(parse_evidence(item) for item in data.get("submitted", [])),  # type: ignore[misc]
    )


EVENTS = tuple(e.value for e in ExecutionEvent)


def evidence(value: Evidence) -> Json:
    return {"object_id": value.object_id, "kind": value.kind, "revision": value.revision, "state": value.state,
            "body": dict(value.body)}


def transition(value: p.TransitionRecord) -> Json:
    """A history line without its free-text reason (specs/protocol.md makes only codes normative)."""
    return {
        "execution_id": value.execution_id,
        "event": value.event.value if value.event is not None else None,
        "from_state": value.from_state.value if value.from_state is not None else None,
        "to_state": value.to_state.value,
        "revision": value.revision,
        "at": time_text(value.at),
        "actor": value.actor,
        "lease_token": value.lease_token,
        "fence": value.fence,
    }


def parse_evidence(data: Json) -> Evidence | None:
    if data is None:
        return None
    return Evidence(data["object_id"], data["kind"], data.get("body", {}), data["revision"], data.get("state"))


def parse_approval_decision(data: Json) -> approvals.ApprovalDecision:
    return approvals.ApprovalDecision(
        decision_id=data["decision_id"],
        request_id=data["request_id"],
        business_id=data["business_id"],
        reviewer_id=data["reviewer_id"],
        determination=data["determination"],
        binding=approvals.Binding.from_json(data["binding"]),
        authority=parse_authority(data["authority"]),
        rationale=data.get("rationale", ""),
    )


def approval_outcome(rows: Json, request: Json) -> Json:
    """The kernel's answer to a reviewer's decision (specs/interpreter.md, Approvals), in JSON form.

    ``rows`` holds the stored ``approval_request`` (its body, or null), its
    evidence ``request_revision``, and ``prior_decision``: the stored
    decision with the same identity, or null.
    """
    stored = rows.get("approval_request")
    result = approvals.decide(
        None if stored is None else approvals.ApprovalRequest.from_json(stored),
        int(rows.get("request_revision", 1)),
        parse_evidence(rows.get("prior_decision")),
        parse_approval_decision(request),
    )
    if isinstance(result, approvals.Accepted):
        return {"outcome": "accepted", "evidence": [evidence(e) for e in result.evidence]}
    if isinstance(result, approvals.Recorded):
        return {"outcome": "recorded", "evidence": [evidence(e) for e in result.evidence]}
    return outcome(result)
