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
import re
import typing
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import from_json, to_json
from fencekeeper.kernel.evidence import Evidence
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState
from fencekeeper.kernel.recovery import RecoveryFacts, recover

Json = Any


class WireError(ValueError):
    """A request whose JSON does not have the shape of the conformance format (not a kernel refusal)."""


@typing.final
class Missing:
    """The value of a required member a JSON object leaves out: no value of any type a kernel check accepts.

    A request's member that is missing reaches the kernel as this, so that the kernel refuses it where its
    order of checks places it, naming the field, as it refuses a member of the wrong type.
    """

    def __repr__(self) -> str:
        return "<missing>"


MISSING: typing.Final = Missing()


def _get(data: Any, name: str, default: Any = None) -> Any:
    """A field of a JSON object, as Any: what a field holds is for the kernel to judge."""
    return data.get(name, default)


def _need(data: Any, name: str) -> Any:
    """A required member of a request: :data:`MISSING` when it is left out, for the kernel to refuse in its order."""
    return data.get(name, MISSING)


def _member(kind: Any, value: Any, where: str) -> Any:
    """``value`` as a member of the enumeration ``kind``, or a :class:`WireError` naming ``where``."""
    try:
        return kind(value)
    except (ValueError, TypeError):
        raise WireError(f"{where}: not a {kind.__name__}: {value!r}") from None


def _row(data: Any, name: str, where: str) -> Any:
    """A required member of a stored row (a snapshot): a row is the suite's fact, never judged by a decision,
    so a missing one is a :class:`WireError` naming it rather than a refusal."""
    if not isinstance(data, dict):
        raise WireError(f"{where}: must be an object, got {type(data).__name__}")
    if name not in data:
        raise WireError(f"{where}.{name}: missing")
    return data[name]


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


# The one form of a time (specs/conformance.md, Values): RFC 3339's date, ``T``, time with exactly six fractional
# digits, then ``Z``.  Without the offset, or with another one, it is still read, as the naive or offset time it
# is, for the kernel to refuse as not UTC; nothing else is a time.  ASCII digits only: ``\d`` would take others.
_TIME: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}(Z|[+-][0-9]{2}:[0-9]{2})?")


def parse_time(value: Json) -> Any:
    """A datetime from its text in the suite's one form; anything else is passed on for the kernel to refuse.

    Python's ``fromisoformat`` reads far more than that form (a space for ``T``, no fraction, a week date,
    a basic-format time): a driver in another language that reads only the form the spec states must not
    disagree with this one, so those are not times here either.
    """
    if not isinstance(value, str):
        return value
    found = _TIME.fullmatch(value)
    if found is None:
        return value
    text = value[:-1] + "+00:00" if found.group(1) == "Z" else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:  # a month 13, a 31st of April: the form, but no time
        return value
    if parsed.tzinfo is None or parsed.utcoffset() != timedelta(0):
        return parsed  # naive, or another offset: a time, which the kernel refuses as not UTC
    # ``+00:00`` is UTC's offset, but not its spelling here: passed on as text, so that it is refused too.
    return parsed.astimezone(UTC) if found.group(1) == "Z" else value


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
    return p.WaitKey(_need(data, "execution_id"), _need(data, "node_id"), _need(data, "attempt_id"))


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
        execution_id=_row(data, "execution_id", "rows.execution"),
        business_id=_row(data, "business_id", "rows.execution"),
        state=_member(ExecutionState, _row(data, "state", "rows.execution"), "rows.execution.state"),
        revision=_row(data, "revision", "rows.execution"),
        definition_id=_row(data, "definition_id", "rows.execution"),
        definition_revision=_row(data, "definition_revision", "rows.execution"),
        current_node_id=_row(data, "current_node_id", "rows.execution"),
        step_count=_row(data, "step_count", "rows.execution"),
        fence=_row(data, "fence", "rows.execution"),
        wait=None if _row(data, "wait", "rows.execution") is None else parse_key(data["wait"]),
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
        workflow_execution_id=_row(data, "workflow_execution_id", "rows.dispatch"),
        dispatch_state=_member(DispatchState, _row(data, "dispatch_state", "rows.dispatch"),
                               "rows.dispatch.dispatch_state"),
        eligible_at=parse_time(_row(data, "eligible_at", "rows.dispatch")),
        lease_token=_row(data, "lease_token", "rows.dispatch"),
        leased_by=_row(data, "leased_by", "rows.dispatch"),
        lease_expires_at=parse_time(_row(data, "lease_expires_at", "rows.dispatch")),
        step_count=_row(data, "step_count", "rows.dispatch"),
        last_error_code=_row(data, "last_error_code", "rows.dispatch"),
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
        key=parse_key(_row(data, "key", "rows.registration")),
        business_id=_row(data, "business_id", "rows.registration"),
        spec=parse_wait_spec(_row(data, "spec", "rows.registration")),
        woken_by=_row(data, "woken_by", "rows.registration"),
        wake_reason=None if _row(data, "wake_reason", "rows.registration") is None
        else _member(p.WakeReason, data["wake_reason"], "rows.registration.wake_reason"),
        closed_by=_row(data, "closed_by", "rows.registration"),
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
    # The stored record is read whole, its proof included: a repeat is compared by identity alone, but
    # what it answers is the durable result as stored (seed 000, Expired-lease quarantine: "returns its
    # durable result idempotently"; specs/protocol.md, Recovery command identity), and a resume's result
    # keeps the proof the resume rested on.
    return p.RecoveryRecord(
        command_id=_row(data, "command_id", "rows.recovery"),
        kind=_member(p.RecoveryKind, _row(data, "kind", "rows.recovery"), "rows.recovery.kind"),
        execution_id=_row(data, "execution_id", "rows.recovery"),
        expected_revision=_row(data, "expected_revision", "rows.recovery"),
        resulting_revision=_row(data, "resulting_revision", "rows.recovery"),
        resulting_state=_member(ExecutionState, _row(data, "resulting_state", "rows.recovery"),
                                "rows.recovery.resulting_state"),
        proof=parse_recovery_proof(_row(data, "proof", "rows.recovery")),
    )


def parse_recovery_proof(data: Json) -> p.SafeResumeEvidence | None:
    """A stored record's proof in its wire form (:func:`recovery_record`).

    The wire leaves out the proof's text (its ``idempotency_contract`` and ``basis``), so they read as
    empty; every member the wire carries is kept, and written back by :func:`recovery_record` as it came.
    """
    if data is None:
        return None
    where = "rows.recovery.proof"
    return p.SafeResumeEvidence(
        no_unresolved_command=_row(data, "no_unresolved_command", where),
        dependencies_current=_row(data, "dependencies_current", where),
        continuation_approved=_row(data, "continuation_approved", where),
        idempotency_contract="",
        continuation=_row(data, "continuation", where),
        approved_by=_row(data, "approved_by", where),
    )


# --- requests -------------------------------------------------------------------------


def authority(value: p.Authority) -> Json:
    return {"granted": value.granted, "principal_id": value.principal_id}


def parse_authority(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.Authority(granted=_need(data, "granted"), principal_id=_need(data, "principal_id"))


def credential(value: p.LeaseCredential | None) -> Json:
    if value is None:
        return None
    return {"worker_id": value.worker_id, "lease_token": value.lease_token, "fence": value.fence}


def parse_credential(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.LeaseCredential(_need(data, "worker_id"), _need(data, "lease_token"), _need(data, "fence"))


def step(value: p.StepRecord | None) -> Json:
    if value is None:
        return None
    return {"node_id": value.node_id, "attempt_id": value.attempt_id, "next_node_id": value.next_node_id}


def parse_step(data: Json) -> Any:
    if not isinstance(data, dict):
        return data
    return p.StepRecord(_need(data, "node_id"), _need(data, "attempt_id"), _need(data, "next_node_id"))


def _recovery_kind(value: Json) -> Any:
    with contextlib.suppress(ValueError, TypeError):
        return p.RecoveryKind(value)
    return value  # no kind of recovery: the kernel refuses it, naming ``kind``


def parse_request(decision: str, data: Json) -> Any:
    """The kernel request a decision takes, from its JSON form."""
    if not isinstance(data, dict):
        return data  # no request at all: the kernel's first check refuses it, naming ``request``
    d = data
    if decision == "admit":
        return p.AdmitRequest(
            _need(d, "execution_id"), _need(d, "business_id"), _need(d, "definition_id"), _need(d, "definition_revision"),
            _need(d, "start_node_id"), parse_authority(_need(d, "authority")),
        )
    if decision == "claim":
        return p.ClaimRequest(_need(d, "worker_id"), _need(d, "lease_token"), parse_duration(_need(d, "lease_duration")))
    if decision == "renew":
        return p.RenewRequest(parse_credential(_need(d, "credential")), parse_duration(_need(d, "lease_duration")))
    if decision == "record_step":
        return p.StepRequest(
            parse_credential(_need(d, "credential")), _need(d, "expected_revision"), parse_step(_need(d, "step")),
            parse_authority(_need(d, "authority")),
        )
    if decision == "release":
        return p.ReleaseRequest(parse_credential(_need(d, "credential")), _need(d, "expected_revision"))
    if decision == "fenced":
        # An evidence append names no request of its own: the credential it is made under is the request.
        return parse_credential(_need(d, "credential"))
    if decision == "finalize":
        return p.FinalizeRequest(
            execution_id=_need(d, "execution_id"), dispatch_id=_need(d, "dispatch_id"), worker_id=_need(d, "worker_id"),
            lease_token=_need(d, "lease_token"), fence=_need(d, "fence"), target_state=_need(d, "target_state"),
            business_id=_need(d, "business_id"), expected_revision=_need(d, "expected_revision"),
            authority=parse_authority(_need(d, "authority")),
            step=parse_step(_need(d, "step")) if d.get("step") is not None else None,
            wait=parse_wait_spec(_need(d, "wait")) if d.get("wait") is not None else None,
            reason=d.get("reason", ""), error_code=d.get("error_code"),
        )
    if decision == "wake":
        reason: Any = _need(d, "reason")
        with contextlib.suppress(ValueError):
            reason = p.WakeReason(reason)
        return p.WakeRequest(
            key=parse_key(_need(d, "key")), reason=reason, source_id=_need(d, "source_id"), business_id=_need(d, "business_id"),
            authority=parse_authority(_need(d, "authority")), event_type=d.get("event_type"),
            correlation=_parse_pairs(d.get("correlation", [])), outcome=d.get("outcome"),
        )
    if decision == "cancel":
        return p.CancelRequest(_need(d, "execution_id"), _need(d, "business_id"), _need(d, "expected_revision"), parse_authority(_need(d, "authority")))
    if decision == "recover":
        return p.RecoveryRequest(
            command_id=_need(d, "command_id"), kind=_recovery_kind(_need(d, "kind")), execution_id=_need(d, "execution_id"),
            business_id=_need(d, "business_id"), expected_revision=_need(d, "expected_revision"), actor_id=_need(d, "actor_id"),
            authority=parse_authority(_need(d, "authority")), command_to_reconcile=d.get("command_to_reconcile"),
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
    if not isinstance(rows, dict):
        raise WireError(f"rows: must be an object, got {type(rows).__name__}")
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
    """A reviewer's decision from its JSON form.

    Only ``determination`` and ``rationale`` have a refusal of their own (``invalid_request``,
    interpreter.md, Approvals); any other member missing or of the wrong JSON type is a
    :class:`WireError` naming it, never a reader's KeyError.
    """
    if data is MISSING:
        raise WireError("request: missing")
    if not isinstance(data, dict):
        raise WireError(f"request: must be an object, got {type(data).__name__}")
    for name in ("decision_id", "request_id", "business_id", "reviewer_id"):
        _row(data, name, "request")
    binding = _row(data, "binding", "request")
    try:
        bound = approvals.Binding.from_json(binding)
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"request.binding: not a binding ({type(exc).__name__}: {exc})") from None
    granted = _row(data, "authority", "request")
    if not isinstance(granted, dict):
        raise WireError(f"request.authority: must be an object, got {type(granted).__name__}")
    return approvals.ApprovalDecision(
        decision_id=data["decision_id"],
        request_id=data["request_id"],
        business_id=data["business_id"],
        reviewer_id=data["reviewer_id"],
        determination=_need(data, "determination"),
        binding=bound,
        authority=p.Authority(granted=_row(granted, "granted", "request.authority"),
                              principal_id=_row(granted, "principal_id", "request.authority")),
        rationale=data.get("rationale", ""),
    )


def approval_outcome(rows: Json, request: Json) -> Json:
    """The kernel's answer to a reviewer's decision (specs/interpreter.md, Approvals), in JSON form.

    ``rows`` holds the stored ``approval_request`` (its body, or null), its
    evidence ``request_revision``, and ``prior_decision``: the stored
    decision with the same identity, or null.
    """
    stored = rows.get("approval_request")
    try:
        found = None if stored is None else approvals.ApprovalRequest.from_json(stored)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireError(f"rows.approval_request: not a stored approval request ({type(exc).__name__}: {exc})") from None
    result = approvals.decide(
        found,
        int(rows.get("request_revision", 1)),
        parse_evidence(rows.get("prior_decision")),
        parse_approval_decision(request),
    )
    if isinstance(result, approvals.Accepted):
        return {"outcome": "accepted", "evidence": [evidence(e) for e in result.evidence]}
    if isinstance(result, approvals.Recorded):
        return {"outcome": "recorded", "evidence": [evidence(e) for e in result.evidence]}
    return outcome(result)
