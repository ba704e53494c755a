"""The ``operations`` layer: durable-operation decisions (specs/operations.md), from the operations model checker.

Rules of this module:

- The inputs are the calls ``kernel/opsmodel.py`` makes while it explores
  every interleaving of submitters (one no longer authorized), workers, an approver and a canceller
  (reclaims of expired owners and zombie completions included), a few per
  (decision, outcome, code), with every time moved off the whole second;
  to each are added its boundary twins: the same call at the instant the
  owner's lease expires, and with a time that is not UTC.
- Every expectation is the kernel's answer to the JSON form of the input
  (:mod:`.values`): what another implementation would receive.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from fencekeeper.kernel import operations as o
from fencekeeper.kernel import opsmodel

from . import wire
from .basis import US
from .values import missing_member, structure, unstructure
from .wire import MISSING

Case = dict[str, Any]

MODEL_BOUNDS = (
    opsmodel.Bounds(workers=0, submitters=3, approval=False, cancel=False, max_depth=6, revoked_submitter=True),
    opsmodel.Bounds(workers=2, max_claims=2, max_tick=4, maximum_attempts=2, max_depth=7),
)
SHIFT = timedelta(microseconds=654321)
PER_OUTCOME = 3

_REQUESTS: dict[str, type[Any]] = {
    "submit": o.SubmitRequest,
    "claim": o.ClaimRequest,
    "heartbeat": o.HeartbeatRequest,
    "record_intent": o.IntentRequest,
    "complete": o.CompleteRequest,
    "fail": o.FailRequest,
    "outcome_unknown": o.UnknownRequest,
    "decide": o.DecideRequest,
    "cancel": o.CancelRequest,
}


def decide_operation(data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's outcome for one operations case, in its JSON form.

    A request that leaves out a required member, or holds one of another JSON type, reaches the kernel as it
    is (the missing member as :data:`~.values.MISSING`), which refuses it ``invalid_request`` naming the field
    in its order (operations.md, "Well-formed requests"); so does a missing ``now`` or ``request``.  The
    layer has no refusal for a case whose ``decision`` is no decision or whose stored ``operation`` is
    malformed: those are the suite's input broken, a :class:`~.wire.WireError` naming the member.
    """
    decision = data.get("decision", MISSING)
    if decision != "expire" and (not isinstance(decision, str) or decision not in _REQUESTS):
        raise wire.WireError(f"input.decision: not an operations decision: {decision!r}")
    if "operation" not in data:
        raise wire.WireError("input.operation: missing (null when there is no Operation)")
    stored = data["operation"]
    absent = missing_member(o.Operation | None, stored, "operation")
    if absent is not None:
        raise wire.WireError(f"input.{absent}: missing")
    if stored is not None and not isinstance(stored, dict):
        raise wire.WireError(f"input.operation: must be an object or null, got {type(stored).__name__}")
    try:
        operation = structure(o.Operation | None, stored)
    except (TypeError, ValueError) as exc:  # InvalidOperation is a ValueError: a row whose fields contradict
        raise wire.WireError(f"input.operation: {exc}") from None
    now = wire.parse_time(data.get("now", MISSING))
    request_data = data.get("request", MISSING)
    if decision == "expire":
        if not isinstance(request_data, dict):
            # As every other decision refuses a request that is no request, before its fields.
            return {"outcome": "refusal", "code": "invalid_request", "field": "request"}
        result = o.expire(operation, now, request_data.get("actor", MISSING))
    else:
        request = structure(_REQUESTS[decision], request_data)
        result = getattr(o, decision)(operation, request, now)
    if isinstance(result, o.Refusal):
        return {"outcome": "refusal", "code": result.code.value, "field": result.field}
    if isinstance(result, o.Unchanged):
        return {"outcome": "unchanged", "code": result.code.value, "operation": unstructure(result.operation)}
    return {
        "outcome": "decision",
        "guard": unstructure(result.guard),
        "operation": unstructure(result.operation),
        "attempts": unstructure(result.attempts),
        "outbox": unstructure(result.outbox),
        "credential": unstructure(result.credential),
    }


def _explored_calls() -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def recording(name: str, decide: Callable[..., o.Outcome]) -> Callable[..., o.Outcome]:
        def call(operation: o.Operation | None, request: Any, now: datetime) -> o.Outcome:
            calls.append(
                {"decision": name, "operation": unstructure(operation), "request": unstructure(request),
                 "now": wire.time_text(now)}
            )
            return decide(operation, request, now)

        return call

    proto = opsmodel.OpsProtocol(
        submit=recording("submit", o.submit),
        claim=recording("claim", o.claim),
        heartbeat=recording("heartbeat", o.heartbeat),
        complete=recording("complete", o.complete),
        fail=recording("fail", o.fail),
        decide=recording("decide", o.decide),
        cancel=recording("cancel", o.cancel),
        due_claim=o.claim,
    )
    for bounds in MODEL_BOUNDS:
        result = opsmodel.explore(bounds, proto)
        assert result.violation is None, result.violation
    return [wire.shift_times(call, SHIFT) for call in calls]


def _case(case_id: str, data: dict[str, Any]) -> Case:
    expected = decide_operation(data)
    if expected["outcome"] == "decision":
        normative = ["outcome", "guard", "operation", "attempts", "outbox", "credential"]
    elif expected["outcome"] == "unchanged":
        normative = ["outcome", "code", "operation"]
    else:
        normative = ["outcome", "code", "field"]
    return {"id": case_id, "input": data, "expected": expected, "normative": normative}


def _owner_mutations(label: str, data: dict[str, Any]) -> list[Case]:
    """A written owner's call with one thing wrong: the worker, the fence, the authority."""
    request = data["request"]
    credential = request.get("credential") if isinstance(request, dict) else None
    if credential is None:
        return []
    fence = credential["fence"]
    changes = {
        "other_worker": {"credential": {**credential, "worker_id": "w-x"}},
        "stale_fence": {"credential": {**credential, "fence": fence - 1 if fence > 1 else fence + 1}},
        "fence_zero": {"credential": {**credential, "fence": 0}},
    }
    if "authority" in request:
        changes["not_authorized"] = {"authority": {**request["authority"], "granted": False}}
    found = [_case(f"{label}/{name}", {**data, "request": {**request, **change}}) for name, change in changes.items()]
    # The effect class decides what an owner may do: an intent only for an external effect, and an
    # external effect completes only after its intent.
    operation = data["operation"]
    found.append(_case(f"{label}/intent", {**data, "decision": "record_intent", "request": {"credential": credential}}))
    external = {**operation, "effect_class": "external"}
    found.append(_case(f"{label}/intent_external", {**data, "decision": "record_intent", "operation": external,
                                                    "request": {"credential": credential}}))
    found.append(_case(f"{label}/external_without_intent", {**data, "operation": external}))
    found.append(_case(f"{label}/unknown_outcome", {**data, "decision": "outcome_unknown", "operation": external,
                                                    "request": {"credential": credential, "detail": "timed out"}}))
    return found


def _decide_mutations(label: str, data: dict[str, Any]) -> list[Case]:
    """An approval decision that is self-approved, bound to other content, or already expired."""
    request, operation = data["request"], data["operation"]
    requester = operation["identity"]["principal"]
    changes = {
        "self_approval": {"approver": requester, "authority": {**request["authority"], "principal": requester}},
        "misbound_digest": {"input_digest": "f" * 64},
        "misbound_version": {"action_version": request["action_version"] + 1},
        "expired": {"expires_at": data["now"]},
    }
    resolver, version, subject = requester.split(":", 2)
    # The requester under another version of their resolver is still the requester.
    other = f"{resolver}:v{int(version[1:]) + 1}:{subject}"
    changes["self_approval_other_resolver_version"] = {
        "approver": other, "authority": {**request["authority"], "principal": other}
    }
    found = [_case(f"{label}/{name}", {**data, "request": {**request, **change}}) for name, change in changes.items()]
    # Past the Operation's own deadline no decision is stored: it can only end approval_expired.
    found.append(_case(f"{label}/at_deadline", {**data, "now": operation["deadline"]}))
    decided = decide_operation(data)
    if decided["outcome"] == "decision":
        again = {**data, "operation": decided["operation"]}
        found.append(_case(f"{label}/same_again", again))
        found.append(_case(f"{label}/contradicting", {**again, "request": {**request, "approved": not request["approved"]}}))
        # Current authority is asked before the stored decision answers.
        denied = {**request["authority"], "granted": False}
        found.append(_case(f"{label}/same_again_not_authorized", {**again, "request": {**request, "authority": denied}}))
    return found


def _deadline_mutations(label: str, data: dict[str, Any]) -> list[Case]:
    """A heartbeat once the deadline has passed (refused), and one whose renewal the deadline caps."""
    operation = data["operation"]
    now = wire.parse_time(data["now"])
    lease = timedelta(microseconds=data["request"]["lease_duration"])
    # The live lease ends before the deadline, which comes before now + lease: the renewal stops at the deadline.
    capped = {
        **operation,
        "lease_expires_at": wire.time_text(now + lease / 2),
        "deadline": wire.time_text(now + lease * 3 / 4),
    }
    return [
        _case(f"{label}/at_deadline", {**data, "operation": {**operation, "deadline": data["now"]}}),
        _case(f"{label}/capped_by_deadline", {**data, "operation": capped}),
    ]


def _submit_mutations(label: str, data: dict[str, Any]) -> list[Case]:
    """A resubmission under the identity with other content, and either without current authority.

    And the same submitter under the next version of their resolver: the
    identity's key is the stable reference, so the store hands the decision
    the Operation admitted under the earlier version, which answers it.
    """
    request = data["request"]
    denied = {"authority": {**request["authority"], "granted": False, "reason": "revoked"}}
    resolver, version, subject = request["identity"]["principal"].split(":", 2)
    later = f"{resolver}:v{int(version[1:]) + 1}:{subject}"
    moved = {"identity": {**request["identity"], "principal": later},
             "authority": {**request["authority"], "principal": later}}
    moved_denied = {"authority": {**moved["authority"], "granted": False, "reason": "revoked"}}
    return [
        _case(f"{label}/other_digest", {**data, "request": {**request, "input_digest": "e" * 64}}),
        _case(f"{label}/other_version", {**data, "request": {**request, "action_version": request["action_version"] + 1}}),
        _case(f"{label}/not_authorized", {**data, "request": {**request, **denied}}),
        _case(f"{label}/other_digest_not_authorized",
              {**data, "request": {**request, "input_digest": "e" * 64, **denied}}),
        _case(f"{label}/other_resolver_version", {**data, "request": {**request, **moved}}),
        _case(f"{label}/other_resolver_version_other_digest",
              {**data, "request": {**request, **moved, "input_digest": "e" * 64}}),
        _case(f"{label}/other_resolver_version_not_authorized",
              {**data, "request": {**request, **moved, **moved_denied}}),
        # Admitted before numbers were canonical: the retry's canonical digest differs, and the digest the
        # same input had then is the stored one (operations.md, "Equal input").
        _case(f"{label}/earlier_digest",
              {**data, "request": {**request, "input_digest": "e" * 64,
                                   "earlier_input_digest": request["input_digest"]}}),
        _case(f"{label}/other_earlier_digest",
              {**data, "request": {**request, "input_digest": "e" * 64, "earlier_input_digest": "d" * 64}}),
    ]


def operation_cases() -> list[Case]:
    unique: dict[str, dict[str, Any]] = {}
    for data in _explored_calls():
        unique.setdefault(json.dumps(data, sort_keys=True), data)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for text in sorted(unique):
        data = unique[text]
        expected = decide_operation(data)
        groups.setdefault((data["decision"], expected["outcome"], expected.get("code") or ""), []).append(data)
    cases: list[Case] = []
    for (decision, outcome, code), inputs in sorted(groups.items()):
        for index, data in enumerate(inputs[:PER_OUTCOME]):
            label = f"model/{decision}/{outcome}_{code or 'written'}_{index}"
            cases.append(_case(label, data))
            operation = data["operation"]
            if operation is not None and operation.get("lease_expires_at") and decision in (
                "heartbeat", "complete", "fail"
            ):
                cases.append(_case(f"{label}/at_expiry", {**data, "now": operation["lease_expires_at"]}))
                before = wire.parse_time(operation["lease_expires_at"]) - timedelta(microseconds=1)
                cases.append(_case(f"{label}/last_microsecond", {**data, "now": wire.time_text(before)}))
            if index == 0:
                cases.append(_case(f"{label}/naive_now", {**data, "now": data["now"].rstrip("Z")}))
                cases.append(_case(f"{label}/no_operation", {**data, "operation": None}))
            if index == 0 and outcome == "decision":
                cases += _owner_mutations(label, data)
            if index == 0 and decision == "decide" and outcome == "decision":
                cases += _decide_mutations(label, data)
            if index == 0 and decision == "submit" and outcome == "unchanged":
                cases += _submit_mutations(label, data)
            if index == 0 and decision == "heartbeat" and outcome == "decision":
                cases += _deadline_mutations(label, data)
            if index == 0 and decision == "cancel" and outcome == "decision":
                cancelled = decide_operation(data)["operation"]
                cases.append(_case(f"{label}/again", {**data, "operation": cancelled}))
            if index == 0 and decision == "cancel" and outcome in ("decision", "refusal") and (
                outcome == "decision" or code == "cancel_too_late"
            ):
                # Current authority is asked before a terminal Operation answers (already_cancelled, too late).
                ended = decide_operation(data)["operation"] if outcome == "decision" else data["operation"]
                denied = {**data["request"], "authority": {**data["request"]["authority"], "granted": False}}
                cases.append(_case(f"{label}/ended_not_authorized", {**data, "operation": ended, "request": denied}))
    # Expiry of the overall deadline is a sweep's decision, not a model move: one on each side.
    admitted = next(c["input"]["operation"] for c in cases if c["input"]["decision"] == "claim"
                    and c["input"]["operation"] is not None)
    deadline = wire.parse_time(admitted["deadline"])
    for label, moment in (("before_deadline", deadline - timedelta(microseconds=1)), ("at_deadline", deadline)):
        data = {"decision": "expire", "operation": admitted, "request": {"actor": "system:deadline"},
                "now": wire.time_text(moment)}
        cases.append(_case(f"expire/{label}", data))
    cases += _due_is_claimed_cases(cases)
    cases += _rule_cases(cases)
    return cases


def _due_is_claimed_cases(cases: list[Case]) -> list[Case]:
    """A claim never refuses an Operation ``due`` reports due (``INV-OP-DUE-CLAIMED``): rows no decision makes.

    An approval that authorizes nothing (as old or edited rows may hold) ends the Operation
    ``approval_misbound``, a replacement's after the expired owner's Attempt is abandoned; an admitted
    Operation past its deadline ends ``deadline_exceeded`` whatever its next eligibility.
    """
    first = next(
        c["input"] for c in cases if c["input"]["decision"] == "claim" and c["expected"].get("credential")
        and c["input"]["operation"]["state"] == "admitted" and c["input"]["operation"]["approval"] is not None
    )
    operation, approval = first["operation"], first["operation"]["approval"]
    found: list[Case] = []
    for label, change in (
        ("self_approval", {"approver": operation["identity"]["principal"]}),
        ("self_approval_other_resolver_version", {"approver": "users:v2:requester"}),
        ("other_operation", {"operation_id": "op-other"}),
        ("other_input", {"input_digest": "f" * 64}),
        ("other_tenant", {"tenant": "tenant-other"}),
        ("other_requester", {"requester": "users:v1:someone"}),
        ("rejection", {"approved": False}),
    ):
        edited = {**operation, "approval": {**approval, **change}}
        found.append(_case(f"claim/approval_misbound/{label}", {**first, "operation": edited}))
    found.append(_case("claim/approval_misbound/none", {**first, "operation": {**operation, "approval": None}}))
    # The first claim's Operation, its owner's lease expired: a replacement finds the approval edited.
    running = decide_operation(first)["operation"]
    edited = {**running, "approval": {**running["approval"], "approver": running["identity"]["principal"]}}
    expired = {**first, "operation": edited, "now": running["lease_expires_at"]}
    found.append(_case("claim/approval_misbound/replacement", expired))
    late = {**operation, "next_eligible_at": wire.time_text(wire.parse_time(operation["deadline"]) + timedelta(hours=1))}
    found.append(_case("claim/deadline_before_eligibility", {**first, "operation": late, "now": operation["deadline"]}))
    return found


def _shifted(text: str, delta: timedelta) -> str:
    moved = wire.time_text(wire.parse_time(text) + delta)
    assert moved is not None  # a time moved is a time
    return moved


def _rule_cases(cases: list[Case]) -> list[Case]:
    """Written outcomes of operations.md the model's calls above do not reach, one case per rule (cases 2.9.0).

    The calls above are a few per (decision, outcome, code), so a written decision stands for every kind of
    write its decision makes: these add each other kind, built from the first claim's Operation.  A
    replacement claim and the limits that end it, in their order (deadline, then attempts, then the
    approval); every end of ``fail`` and its backoff (growth, cap, rounding, the deadline's instant); the
    external effect's unsettled window through intent, answer, success, unknown outcome and cancellation;
    a rejection; the deadline sweep on each state; a submission past its window, with other unbound fields,
    and requiring approval; a lease the claim granted past the deadline, which a heartbeat never shortens; no
    effect begun from the deadline on, and an answer to a call begun before it still recorded (cases 3.0.0);
    an issued call nobody answered looked up or ended unknown, never ended as a missed deadline (cases 4.0.0),
    a limit of Attempts or a failure (cases 4.2.0), or an approval that authorizes nothing; an authority refused
    when it answers for another principal than the one the request acts for (cases 4.3.0).
    """
    first = next(
        c["input"] for c in cases if c["input"]["decision"] == "claim" and c["expected"].get("credential")
        and c["input"]["operation"]["state"] == "admitted" and c["input"]["operation"]["approval"] is not None
    )
    admitted, claim_request = first["operation"], first["request"]
    running = decide_operation(first)["operation"]
    started, expiry = running["attempt_started_at"], running["lease_expires_at"]
    live = _shifted(started, timedelta(seconds=1))
    credential = {"operation_id": running["operation_id"], "worker_id": running["owner"], "fence": running["fence"]}
    second = {**running, "fence": 2, "attempt_count": 2}
    found: list[Case] = []

    def add(label: str, decision: str, operation: dict[str, Any] | None, request: dict[str, Any], now: str) -> None:
        found.append(_case(f"rule/{label}", {"decision": decision, "operation": operation, "request": request,
                                              "now": now}))

    replacement = {**claim_request, "worker_id": "w2"}
    misbound = {**running["approval"], "approver": running["identity"]["principal"]}
    add("claim/replacement", "claim", running, replacement, expiry)
    add("claim/replacement_attempts_used", "claim", second, replacement, expiry)
    add("claim/replacement_at_deadline", "claim", {**running, "deadline": expiry}, replacement, expiry)
    add("claim/replacement_at_deadline_attempts_used", "claim", {**second, "deadline": expiry}, replacement, expiry)
    add("claim/replacement_attempts_used_misbound", "claim", {**second, "approval": misbound}, replacement, expiry)
    unconsumed = admitted["approval"]
    add("claim/approval_expired", "claim", {**admitted, "approval": {**unconsumed, "expires_at": first["now"]}},
        claim_request, first["now"])
    add("claim/approval_expired_misbound", "claim",
        {**admitted, "approval": {**unconsumed, "expires_at": first["now"], "approved": False}},
        claim_request, first["now"])
    awaiting = {**admitted, "state": "awaiting_approval", "approval": None}
    add("claim/awaiting_approval", "claim", awaiting, claim_request, first["now"])
    add("claim/awaiting_approval_at_deadline", "claim", awaiting, claim_request, admitted["deadline"])

    # A consumed approval stays valid for every replacement, expired or not.
    lapsed = {**running, "approval": {**running["approval"], "expires_at": started}}
    add("claim/replacement_approval_expired_after_consumed", "claim", lapsed, replacement, expiry)

    # The owner checks in their order: missing, fence, running, worker, lease; the first that fails answers.
    heartbeat_request = {"credential": credential, "lease_duration": claim_request["lease_duration"]}
    ended_later = {**second, "state": "cancelled", "outcome": "cancelled", "error_code": "cancelled",
                   "owner": None, "lease_expires_at": None, "attempt_started_at": None}
    add("owner/another_operation", "heartbeat", {**ended_later, "operation_id": "op-other"}, heartbeat_request,
        expiry)
    add("owner/stale_fence_on_an_ended_operation", "heartbeat", ended_later, heartbeat_request, expiry)
    add("owner/not_running_with_another_worker", "heartbeat", {**ended_later, "fence": 1},
        {**heartbeat_request, "credential": {**credential, "worker_id": "w-x"}}, expiry)
    add("owner/another_worker_past_the_lease", "heartbeat", running,
        {**heartbeat_request, "credential": {**credential, "worker_id": "w-x"}}, expiry)

    # No effect begins from the deadline on, even under a live lease: an external intent and an atomic success
    # are refused deadline_exceeded (cases 3.0.0; until 2.13.0 both were decided).
    overdue = {**running, "deadline": started}
    add("complete/past_the_deadline_live_lease", "complete", overdue,
        {"credential": credential, "authority": {"granted": True, "principal": running["identity"]["principal"]}},
        live)
    add("record_intent/past_the_deadline_live_lease", "record_intent", {**overdue, "effect_class": "external"},
        {"credential": credential}, live)

    backing_off = {"credential": credential, "error_code": "busy", "retryable": True}
    add("fail/not_retryable", "fail", running, {**backing_off, "retryable": False}, live)
    add("fail/not_authorized", "fail", running, {**backing_off, "not_authorized": True}, live)
    add("fail/not_authorized_attempts_used", "fail", second, {**backing_off, "not_authorized": True,
                                                             "credential": {**credential, "fence": 2}}, live)
    add("fail/attempts_used", "fail", second, {**backing_off, "credential": {**credential, "fence": 2}}, live)
    pause = timedelta(microseconds=running["policy"]["initial_interval"])
    add("fail/backoff_reaches_deadline", "fail", {**running, "deadline": _shifted(live, pause)}, backing_off, live)
    add("fail/backoff_before_deadline", "fail", {**running, "deadline": _shifted(live, pause + US)}, backing_off, live)
    second_us = 1_000_000
    for label, coefficient, maximum, made in (
        ("grows", 2.0, 10 * second_us, 3),  # 1 s * 2^2
        ("capped", 2.0, 10 * second_us, 6),  # 1 s * 2^5 = 32 s, capped at 10 s
        ("rounded", 1.7, 10 * second_us, 3),  # 1.7^2 s is 2.8899999999999997 in binary: 2.890000 s, not 2.889999 s
    ):
        policy = {**running["policy"], "backoff_coefficient": coefficient, "maximum_interval": maximum,
                  "maximum_attempts": 9}
        add(f"fail/backoff_{label}", "fail", {**running, "policy": policy, "fence": made, "attempt_count": made},
            {**backing_off, "credential": {**credential, "fence": made}}, live)
    add("fail/effect_not_applied_not_external", "fail", running, {**backing_off, "effect_not_applied": True}, live)

    three = {**running["policy"], "maximum_attempts": 3}
    external = {**running, "policy": three, "effect_class": "external", "effect_id": f"{running['operation_id']}/effect",
                "effect_unsettled_since": 1}
    earlier = {**external, "fence": 2, "attempt_count": 2}
    answered = {**external, "effect_unsettled_since": None}
    later = {**credential, "fence": 2}
    not_applied = {**backing_off, "error_code": "effect_failed", "effect_not_applied": True}
    add("record_intent/earlier_issue_unanswered", "record_intent", earlier, {"credential": later}, live)
    add("record_intent/after_not_applied", "record_intent", answered, {"credential": credential}, live)
    add("complete/external_after_intent", "complete", external,
        {"credential": credential, "authority": {"granted": True, "principal": running["identity"]["principal"]},
         "result": "{\"ok\":true}"}, live)
    add("complete/external_after_not_applied", "complete", answered,
        {"credential": credential, "authority": {"granted": True, "principal": running["identity"]["principal"]}},
        live)
    add("fail/effect_not_applied_own_issue", "fail", external, not_applied, live)
    add("fail/effect_not_applied_earlier_issue", "fail", earlier, {**not_applied, "credential": later}, live)
    add("fail/effect_not_applied_no_intent", "fail", answered, not_applied, live)
    add("fail/effect_ambiguous", "fail", external, {**backing_off, "error_code": "handler_error"}, live)
    add("outcome_unknown/unsettled", "outcome_unknown", external, {"credential": credential, "detail": "timed out"},
        live)
    add("outcome_unknown/earlier_issue", "outcome_unknown", earlier, {"credential": later, "detail": ""}, live)
    add("outcome_unknown/after_not_applied", "outcome_unknown", answered, {"credential": credential, "detail": ""},
        live)
    # The detail is kept in the transition: text a store can keep, bounded as a cancellation's reason.
    for label, detail in (("nul", "a\x00b"), ("lone_surrogate", "\ud800"), ("too_long", "x" * 2001),
                          ("longest", "x" * 2000)):
        add(f"outcome_unknown/detail_{label}", "outcome_unknown", external,
            {"credential": credential, "detail": detail}, live)
    canceller = {"operation_id": running["operation_id"], "principal": "users:v1:canceller",
                 "authority": {"granted": True, "principal": "users:v1:canceller"}, "reason": "no longer needed"}
    add("cancel/running_external_unsettled", "cancel", external, canceller, live)
    add("cancel/retrying_external_unsettled", "cancel",
        {**external, "state": "admitted", "owner": None, "lease_expires_at": None, "attempt_started_at": None},
        canceller, live)
    add("cancel/awaiting_approval", "cancel", awaiting, canceller, first["now"])

    decided = next(c["input"] for c in cases if c["id"] == "model/decide/decision_written_0")
    add("decide/rejection", "decide", decided["operation"], {**decided["request"], "approved": False},
        decided["now"])

    sweep = {"actor": "system:deadline"}
    add("expire/awaiting_approval", "expire", awaiting, sweep, admitted["deadline"])
    add("expire/running_live_owner", "expire", {**running, "deadline": started}, sweep, live)
    add("expire/running_expired_owner", "expire", {**running, "deadline": started}, sweep, expiry)
    add("expire/terminal", "expire", {**admitted, "state": "failed", "outcome": "action_failed"}, sweep,
        admitted["deadline"])

    resubmitted = next(c["input"] for c in cases if c["id"] == "model/submit/unchanged_same_submission_0")
    stored, request = resubmitted["operation"], resubmitted["request"]
    ended = {**stored, "state": "succeeded", "outcome": "succeeded"}
    window = stored["retain_until"]
    add("submit/window_passed_ended", "submit", ended, request, window)
    add("submit/window_last_microsecond_ended", "submit", ended, request, _shifted(window, -US))
    add("submit/window_passed_active", "submit", stored, request, window)
    add("submit/window_passed_active_other_digest", "submit", stored, {**request, "input_digest": "e" * 64}, window)
    add("submit/unbound_fields_differ", "submit", stored,
        {**request, "effect_class": "external", "requires_approval": True, "retention": 1,
         "policy": {**request["policy"], "maximum_attempts": 9}}, resubmitted["now"])
    add("submit/requires_approval", "submit", None, {**request, "requires_approval": True}, resubmitted["now"])
    add("submit/retention_shorter_than_deadline", "submit", None, {**request, "retention": 1}, resubmitted["now"])

    found += _malformed_cases(first, running, credential=credential, live=live, decided=decided,
                              resubmitted=resubmitted)
    found += _stated_cases(running, credential=credential, live=live, resubmitted=resubmitted)

    beyond = {**running, "deadline": _shifted(started, timedelta(milliseconds=1500))}
    heartbeat = {"credential": credential, "lease_duration": claim_request["lease_duration"]}
    add("heartbeat/claimed_lease_past_deadline_stands", "heartbeat", beyond, heartbeat, live)

    # The overall deadline and effects (cases 3.0.0).  Before the deadline, a decision that begins an effect is
    # guarded until the earlier of the lease and the deadline, so its commit past the deadline writes nothing.
    authorized = {"granted": True, "principal": running["identity"]["principal"]}
    add("record_intent/deadline_before_lease", "record_intent", {**beyond, "effect_class": "external"},
        {"credential": credential}, live)
    add("complete/atomic_deadline_before_lease", "complete", beyond,
        {"credential": credential, "authority": authorized}, live)
    # Owner checks and current authority come first; the deadline is the atomic success's own check after them.
    add("complete/atomic_past_the_deadline_and_the_lease", "complete", overdue,
        {"credential": credential, "authority": authorized}, expiry)
    add("complete/atomic_past_the_deadline_not_authorized", "complete", overdue,
        {"credential": credential, "authority": {**authorized, "granted": False}}, live)
    # A call begun in time is answered past the deadline: its success, its "not applied" and its unknown outcome
    # are recorded, never lost.  A read-only result begins no effect.
    external_overdue = {**external, "deadline": started}
    add("complete/external_past_the_deadline_after_intent", "complete", external_overdue,
        {"credential": credential, "authority": authorized, "result": "{\"ok\":true}"}, live)
    add("complete/read_only_past_the_deadline", "complete", {**overdue, "effect_class": "read_only"},
        {"credential": credential, "authority": authorized}, live)
    add("fail/effect_not_applied_past_the_deadline", "fail", external_overdue, not_applied, live)
    add("outcome_unknown/past_the_deadline", "outcome_unknown", external_overdue,
        {"credential": credential, "detail": "timed out"}, live)
    # A retryable failure from the deadline on names the deadline before the attempts, as a claim does.
    add("fail/past_the_deadline_attempts_used", "fail", {**second, "deadline": started},
        {**backing_off, "error_code": "deadline_exceeded", "credential": {**credential, "fence": 2}}, live)

    # An issued call nobody answered is never ended as a missed deadline (cases 4.0.0): a claim past the deadline
    # hands out an Attempt that may only look, or with none left ends it external_outcome_unknown, as the sweep
    # and a failure the deadline ends do.
    unanswered = {**external_overdue, "policy": three}
    add("claim/replacement_past_the_deadline_call_unanswered", "claim", unanswered, replacement, expiry)
    add("claim/replacement_past_the_deadline_call_unanswered_attempts_used", "claim",
        {**unanswered, "fence": 3, "attempt_count": 3}, replacement, expiry)
    retrying = {**unanswered, "state": "admitted", "owner": None, "lease_expires_at": None,
                "attempt_started_at": None, "next_eligible_at": _shifted(expiry, timedelta(hours=1))}
    add("claim/admitted_past_the_deadline_call_unanswered", "claim", retrying, claim_request, expiry)
    add("claim/admitted_past_the_deadline_call_answered", "claim", {**retrying, "effect_unsettled_since": None},
        claim_request, expiry)
    add("expire/running_expired_owner_call_unanswered", "expire", unanswered, sweep, expiry)
    add("expire/admitted_call_unanswered", "expire", retrying, sweep, expiry)
    add("fail/past_the_deadline_call_unanswered", "fail", unanswered,
        {**backing_off, "error_code": "effect_ambiguous"}, live)
    add("fail/backoff_reaches_deadline_call_unanswered", "fail", {**external, "deadline": _shifted(live, pause)},
        {**backing_off, "error_code": "effect_ambiguous"}, live)

    # Nor as a limit of Attempts or a failure (cases 4.2.0): a replacement that finds every Attempt used, and a
    # failure that ends the Operation -- the last Attempt's, a denial, one that is not retryable -- end an
    # issued, unanswered call external_outcome_unknown, the failure's own code kept; a failure whose own "not
    # applied" answer settles the effect keeps its outcome.  An external success is recorded whatever the
    # authority says: it answers a call already issued.
    last = {**external, "fence": 3, "attempt_count": 3}
    third = {**credential, "fence": 3}
    add("claim/replacement_attempts_used_call_unanswered", "claim", last, replacement, expiry)
    add("claim/replacement_attempts_used_call_answered", "claim", {**last, "effect_unsettled_since": None},
        replacement, expiry)
    add("fail/attempts_used_call_unanswered", "fail", last,
        {**backing_off, "error_code": "effect_ambiguous", "credential": third}, live)
    add("fail/not_retryable_call_unanswered", "fail", external, {**backing_off, "error_code": "card_rejected",
                                                                  "retryable": False}, live)
    add("fail/not_authorized_call_unanswered", "fail", external,
        {**backing_off, "error_code": "not_authorized", "retryable": False, "not_authorized": True}, live)
    add("fail/not_retryable_own_call_not_applied", "fail", external, {**not_applied, "retryable": False}, live)
    add("fail/not_retryable_earlier_call_unanswered", "fail", earlier,
        {**not_applied, "retryable": False, "credential": later}, live)
    denied = {**authorized, "granted": False, "reason": "revoked"}
    add("complete/external_not_authorized", "complete", external,
        {"credential": credential, "authority": denied, "result": "{\"ok\":true}"}, live)
    add("complete/external_not_authorized_without_intent", "complete", answered,
        {"credential": credential, "authority": denied}, live)

    # An approval that authorizes nothing, found after an issued call (a row an earlier release left, cases 4.3.0):
    # the claim ends the Operation external_outcome_unknown, its error_code approval_misbound; with every call
    # answered it keeps approval_misbound.
    issued_misbound = {**external, "approval": misbound}
    waiting_misbound = {**issued_misbound, "state": "admitted", "owner": None, "lease_expires_at": None,
                        "attempt_started_at": None}
    add("claim/replacement_misbound_call_unanswered", "claim", issued_misbound, replacement, expiry)
    add("claim/admitted_misbound_call_unanswered", "claim", waiting_misbound, claim_request, expiry)
    add("claim/admitted_misbound_call_answered", "claim", {**waiting_misbound, "effect_unsettled_since": None},
        claim_request, expiry)

    # An authority answers for one principal (cases 4.3.0): an answer for another than the one the request acts
    # for -- the submitter, the Operation's principal on completion, the approver, the canceller -- is refused
    # not_authorized naming authority.principal, granted or not, before anything stored answers; the same
    # principal under another version of its resolver is that principal.
    requester = running["identity"]["principal"]
    other = {"granted": True, "principal": "users:v1:mallory"}
    resolver, version, subject = requester.split(":", 2)
    moved = {"granted": True, "principal": f"{resolver}:v{int(version[1:]) + 1}:{subject}"}
    submitted = {**request, "authority": other}
    add("authority/submit_new_other_principal", "submit", None, submitted, resubmitted["now"])
    add("authority/submit_identical_other_principal", "submit", stored, submitted, resubmitted["now"])
    add("authority/submit_other_digest_other_principal", "submit", stored, {**submitted, "input_digest": "e" * 64},
        resubmitted["now"])
    add("authority/submit_other_principal_denied", "submit", None,
        {**request, "authority": {**other, "granted": False, "reason": "revoked"}}, resubmitted["now"])
    add("authority/submit_other_resolver_version", "submit", None, {**request, "authority": moved}, resubmitted["now"])
    for label, operation in (("atomic", running), ("read_only", {**running, "effect_class": "read_only"}),
                             ("external_after_intent", external)):
        add(f"authority/complete_{label}_other_principal", "complete", operation,
            {"credential": credential, "authority": other, "result": "{\"ok\":true}"}, live)
    add("authority/complete_stale_fence_other_principal", "complete", running,
        {"credential": {**credential, "fence": 2}, "authority": other}, live)
    add("authority/complete_other_resolver_version", "complete", running,
        {"credential": credential, "authority": moved}, live)
    deciding = decided["request"]
    approver = deciding["approver"]
    resolver, version, subject = approver.split(":", 2)
    add("authority/decide_other_principal", "decide", decided["operation"], {**deciding, "authority": other},
        decided["now"])
    add("authority/decide_other_resolver_version", "decide", decided["operation"],
        {**deciding, "authority": {"granted": True, "principal": f"{resolver}:v{int(version[1:]) + 1}:{subject}"}},
        decided["now"])
    add("authority/cancel_other_principal", "cancel", running, {**canceller, "authority": other}, live)
    add("authority/cancel_ended_other_principal", "cancel", {**admitted, "state": "cancelled", "outcome": "cancelled"},
        {**canceller, "authority": other}, live)
    add("authority/cancel_other_resolver_version", "cancel", running,
        {**canceller, "principal": requester, "authority": moved}, live)
    return found


def _stated_cases(
    running: dict[str, Any], *, credential: dict[str, Any], live: str, resubmitted: dict[str, Any],
) -> list[Case]:
    """Rules of operations.md, "Well-formed requests", that a reader of the spec alone may read otherwise (4.6.0).

    The default of every field a request may leave out (and ``null``, which is given, not left out); the
    idempotency window's last instant for other content; ``wrong_effect_class`` named before the deadline; a
    ``result`` checked as text (the tokens JSON lacks refused, an escape and a numeral of any size kept) and by
    its depth, 32 levels; and the 2000-character bound counted in code points.
    """
    found: list[Case] = []

    def add(label: str, decision: str, operation: dict[str, Any] | None, request: dict[str, Any], now: str) -> None:
        found.append(_case(f"rule/{label}", {"decision": decision, "operation": operation, "request": request,
                                              "now": now}))

    grant = {"granted": True, "principal": running["identity"]["principal"]}
    submission, stored, at = resubmitted["request"], resubmitted["operation"], resubmitted["now"]
    bare = {k: v for k, v in submission.items() if k not in ("policy", "retention", "requires_approval")}
    add("omitted/submit_policy_retention_approval", "submit", None, bare, at)
    add("omitted/submit_policy_fields", "submit", None, {**bare, "policy": {"maximum_attempts": 2}}, at)
    add("omitted/submit_policy_empty", "submit", None, {**bare, "policy": {}}, at)
    for field in ("policy", "retention", "requires_approval"):
        add(f"omitted/submit_{field}_null", "submit", None, {**submission, field: None}, at)
    external = {**running, "effect_class": "external", "effect_id": f"{running['operation_id']}/effect",
                "effect_unsettled_since": 1}
    # Were either flag true by default, the unanswered call would be settled, or the Operation end not_authorized.
    add("omitted/fail_flags", "fail", external, {"credential": credential, "error_code": "busy", "retryable": True},
        live)
    add("omitted/fail_flags_null", "fail", external,
        {"credential": credential, "error_code": "busy", "retryable": True, "not_authorized": None}, live)
    add("omitted/complete_result", "complete", running, {"credential": credential, "authority": grant}, live)
    add("omitted/complete_result_null", "complete", running,
        {"credential": credential, "authority": grant, "result": None}, live)
    add("omitted/outcome_unknown_detail", "outcome_unknown", external, {"credential": credential}, live)
    add("omitted/outcome_unknown_detail_null", "outcome_unknown", external, {"credential": credential, "detail": None},
        live)
    canceller = {"operation_id": running["operation_id"], "principal": "users:v1:canceller",
                 "authority": {"granted": True, "principal": "users:v1:canceller"}}
    add("omitted/cancel_reason", "cancel", running, canceller, live)
    add("omitted/cancel_reason_null", "cancel", running, {**canceller, "reason": None}, live)

    # The window ends at retain_until (now < retain_until): there an ended Operation's identity is free, for other
    # content too; a microsecond before, other content is a conflict.
    ended = {**stored, "state": "succeeded", "outcome": "succeeded"}
    other = {**submission, "input_digest": "e" * 64}
    add("submit/window_passed_ended_other_digest", "submit", ended, other, stored["retain_until"])
    add("submit/window_last_microsecond_ended_other_digest", "submit", ended, other,
        _shifted(stored["retain_until"], -US))

    # The effect class is the first check after the owner's: an Operation with no effect to begin is told so, past
    # its deadline too.
    overdue = {**running, "deadline": running["attempt_started_at"]}
    for effect_class in ("atomic", "read_only"):
        add(f"record_intent/{effect_class}_past_the_deadline", "record_intent", {**overdue, "effect_class": effect_class},
            {"credential": credential}, live)

    # A result is JSON text, checked as text: NaN and the infinities are no JSON; an escaped lone surrogate is JSON
    # (a store keeps the escape), and so is a numeral no double holds; a bracket inside a string nests nothing.
    for label, result in (
        ("minus_infinity", "-Infinity"),
        ("nan_in_an_object", '{"a":NaN}'),
        ("escaped_lone_surrogate", '"\\ud800"'),
        ("numeral_past_every_double", "1e400"),
        ("numerals_past_every_double", "[1e400,-1e400,1e-400]"),
        ("nan_as_a_string", '"NaN"'),
        ("depth_32_arrays", "[" * 32 + "]" * 32),
        ("depth_33_arrays", "[" * 33 + "]" * 33),
        ("depth_32_objects", '{"a":' * 31 + "{}" + "}" * 31),
        ("depth_33_objects", '{"a":' * 32 + "{}" + "}" * 32),
        ("depth_1000", "[" * 1000 + "]" * 1000),
        ("brackets_in_a_string", "[" * 31 + '"' + "[{" * 40 + '\\"' + '"' + "]" * 31),
    ):
        add(f"complete/result_{label}", "complete", running,
            {"credential": credential, "authority": grant, "result": result}, live)

    # A time has one spelling (specs/conformance.md, Values): any other is no time, UTC's "+00:00" included.
    stamp = live.removesuffix("Z")
    for label, moment in (("zero_offset", stamp + "+00:00"), ("space_for_t", stamp.replace("T", " ") + "Z"),
                          ("milliseconds", stamp[:-3] + "Z"), ("whole_seconds", stamp[:-7] + "Z"),
                          ("lower_case", stamp.replace("T", "t") + "z")):
        add(f"malformed/now_{label}", "complete", running, {"credential": credential, "authority": grant}, moment)

    # Characters are code points: 2000 beyond U+FFFF (4000 UTF-16 code units, 8000 bytes of UTF-8) are kept.
    astral = "\U0001F600"
    for label, text in (("2000_astral", astral * 2000), ("2001_astral", astral * 2001)):
        add(f"cancel/reason_{label}", "cancel", running, {**canceller, "reason": text}, live)
        add(f"outcome_unknown/detail_{label}", "outcome_unknown", external, {"credential": credential, "detail": text},
            live)
    return found


def _malformed_cases(
    first: dict[str, Any], running: dict[str, Any], *, credential: dict[str, Any], live: str,
    decided: dict[str, Any], resubmitted: dict[str, Any],
) -> list[Case]:
    """A malformed field of each decision's request, refused ``invalid_request`` naming it (operations.md,
    Well-formed requests); two at once are named in the decision's order, before anything else is asked."""
    found: list[Case] = []
    too_long = "a" * 129
    end_of_time = "9999-12-31T23:59:59.999999Z"

    def add(label: str, decision: str, operation: dict[str, Any] | None, request: dict[str, Any], now: str) -> None:
        found.append(_case(f"rule/malformed/{label}", {"decision": decision, "operation": operation,
                                                        "request": request, "now": now}))

    submission, stored = resubmitted["request"], resubmitted["operation"]
    at = resubmitted["now"]
    policy = submission["policy"]
    for label, change in (
        ("operation_id_too_long", {"operation_id": too_long}),
        ("operation_id_and_action_name", {"operation_id": ".op", "action_name": "a b"}),
        ("identity_principal_stable_form", {"identity": {**submission["identity"], "principal": "users:v*:alice"}}),
        ("identity_client_key_empty", {"identity": {**submission["identity"], "client_key": ""}}),
        ("action_version_zero", {"action_version": 0}),
        ("action_version_boolean", {"action_version": True}),
        ("effect_class_unknown", {"effect_class": "remote"}),
        ("input_digest_upper_case", {"input_digest": "A" * 64}),
        ("earlier_input_digest_short", {"earlier_input_digest": "e" * 63}),
        ("authority_granted_not_boolean", {"authority": {**submission["authority"], "granted": "yes"}}),
        ("authority_principal", {"authority": {**submission["authority"], "principal": "users v1"}}),
        ("policy_initial_interval_zero", {"policy": {**policy, "initial_interval": 0}}),
        ("policy_maximum_attempts_zero", {"policy": {**policy, "maximum_attempts": 0}}),
        ("policy_backoff_coefficient_below_one", {"policy": {**policy, "backoff_coefficient": 0.5}}),
        ("policy_backoff_coefficient_above_hundred", {"policy": {**policy, "backoff_coefficient": 101}}),
        ("policy_schedule_to_close_past_the_last_time", {"policy": {**policy, "schedule_to_close": 3 * 10**17}}),
        ("retention_negative", {"retention": -1}),
        ("requires_approval_not_boolean", {"requires_approval": 1}),
    ):
        # An existing Operation under the identity answers nothing: the request is refused first.
        add(f"submit/{label}", "submit", stored, {**submission, **change}, at)
    add("submit/not_authorized_and_malformed", "submit", stored,
        {**submission, "action_version": 0, "authority": {**submission["authority"], "granted": False}}, at)
    add("submit/at_the_last_time", "submit", None, {**submission, "retention": 1}, end_of_time)

    claiming = first["request"]
    add("claim/worker_id_too_long", "claim", first["operation"], {**claiming, "worker_id": too_long}, first["now"])
    add("claim/lease_duration_zero", "claim", first["operation"], {**claiming, "lease_duration": 0}, first["now"])
    add("claim/lease_past_the_last_time", "claim", first["operation"], claiming, end_of_time)

    renewal = {"credential": credential, "lease_duration": claiming["lease_duration"]}
    add("heartbeat/credential_worker_id", "heartbeat", running,
        {**renewal, "credential": {**credential, "worker_id": "w 1"}}, live)
    add("heartbeat/credential_fence_and_lease_duration", "heartbeat", running,
        {"credential": {**credential, "fence": -1}, "lease_duration": -1}, live)
    add("heartbeat/lease_duration_negative", "heartbeat", running, {**renewal, "lease_duration": -1}, live)
    grant = {"granted": True, "principal": running["identity"]["principal"]}
    for label, result in (("not_json", "{"), ("nan", "NaN"), ("infinity", "[Infinity]"), ("escaped_nul", '"a\\u0000b"'),
                          ("nul_text", "\x00"), ("lone_surrogate", '"\ud800"')):
        add(f"complete/result_{label}", "complete", running,
            {"credential": credential, "authority": grant, "result": result}, live)
    add("complete/authority_and_result", "complete", running,
        {"credential": credential, "authority": {**grant, "granted": None}, "result": "{"}, live)
    failing = {"credential": credential, "error_code": "busy", "retryable": True}
    add("fail/error_code_malformed", "fail", running, {**failing, "error_code": "no such thing"}, live)
    add("fail/retryable_not_boolean", "fail", running, {**failing, "retryable": "true"}, live)
    add("fail/effect_not_applied_not_boolean", "fail", running, {**failing, "effect_not_applied": 0}, live)

    deciding, awaiting = decided["request"], decided["operation"]
    for label, change in (
        ("approval_id_malformed", {"approval_id": "ap 1"}),
        ("tenant_malformed", {"tenant": ""}),
        ("approved_not_boolean", {"approved": "no"}),
        ("expires_at_naive", {"expires_at": deciding["expires_at"].rstrip("Z")}),
        ("approver_and_expires_at", {"approver": "", "expires_at": deciding["expires_at"].rstrip("Z")}),
    ):
        add(f"decide/{label}", "decide", awaiting, {**deciding, **change}, decided["now"])
    cancelling = {"operation_id": running["operation_id"], "principal": "users:v1:canceller",
                  "authority": {"granted": True, "principal": "users:v1:canceller"}}
    for label, reason in (("longest", "x" * 2000), ("too_long", "x" * 2001), ("nul", "a\x00b"),
                          ("lone_surrogate", "\ud800")):
        add(f"cancel/reason_{label}", "cancel", running, {**cancelling, "reason": reason}, live)
    add("cancel/reason_on_a_missing_operation", "cancel", None, {**cancelling, "reason": "x" * 2001}, live)
    add("expire/actor_malformed", "expire", running, {"actor": "system deadline"}, live)
    return found


__all__ = ["decide_operation", "operation_cases"]
