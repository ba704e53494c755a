"""The ``protocol`` and ``recovery`` layers: lease and fencing decisions (specs/protocol.md), generated from the kernel.

Rules of this module:

- Every expectation is the kernel's answer to the case's JSON form
  (:func:`.wire.decide`), never written by hand.  The inputs start from
  rows the kernel's own decisions produce (:func:`worlds`), break one thing
  at a time, and sit on both sides of every time boundary: a lease one
  microsecond before and exactly at its expiry, the 99th and 100th step, a
  timer one microsecond early and exactly due.
- :func:`model_cases` adds the calls the model checker makes while it
  explores; :func:`_covers` tags each case with the invariants whose
  boundary it sits on (informative).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs

from fencekeeper.kernel import modelcheck
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionState
from fencekeeper.kernel.recovery import RecoveryFacts, recover

from . import wire
from .approval_cases import approval_cases
from .basis import LEASE, T0, US, Case

B = "b-1"
OK = p.Authority(True, "user:ops")
NO = p.Authority(False, "user:intruder")


# --- protocol decisions -------------------------------------------------------------------


@attrs.frozen
class World:
    """Rows as a store would hand them to a decision, and the credential of the current holder."""

    name: str
    execution: p.Execution | None
    dispatch: p.Dispatch | None
    registration: p.WaitRegistration | None = None
    credential: p.LeaseCredential | None = None
    recovery: p.RecoveryRecord | None = None


def _apply(world: World, name: str, outcome: p.Outcome, **extra: Any) -> World:
    assert isinstance(outcome, p.Decision), (name, outcome)
    registration = outcome.registration if outcome.registration is not None else world.registration
    if outcome.closes is not None and registration is not None:
        registration = attrs.evolve(registration, closed_by=outcome.closes.by.value)
    return World(
        name=name,
        execution=outcome.execution if outcome.execution is not None else world.execution,
        dispatch=outcome.dispatch if outcome.dispatch is not None else world.dispatch,
        registration=registration,
        credential=outcome.lease if outcome.lease is not None else extra.get("credential", world.credential),
        recovery=outcome.recovery if outcome.recovery is not None else world.recovery,
    )


def _admit_request(execution_id: str = "e-1", **changes: Any) -> p.AdmitRequest:
    return attrs.evolve(p.AdmitRequest(execution_id, B, "purchase", 1, "check", OK), **changes)


def _finalize_request(world: World, target: str, **changes: Any) -> p.FinalizeRequest:
    assert world.execution is not None and world.credential is not None
    c = world.credential
    request = p.FinalizeRequest(
        execution_id=world.execution.execution_id, dispatch_id=world.execution.execution_id,
        worker_id=c.worker_id, lease_token=c.lease_token, fence=c.fence, target_state=target,
        business_id=world.execution.business_id, expected_revision=world.execution.revision, authority=OK,
        step=p.StepRecord("check", "a-1", None),
    )
    return attrs.evolve(request, **changes)


EVENT_WAIT = p.WaitSpec(
    "await", "a-2", "payment.received", (("order_id", "o-1"),), continuations=(("event", "done"),)
)
TIMER_WAIT = p.WaitSpec("sleep", "a-3", None, wake_at=T0 + timedelta(seconds=60, microseconds=7))
FAR_WAIT = p.WaitSpec(
    "await", "a-5", "payment.received", (("order_id", "o-1"),), wake_after=timedelta(days=999_999_999),
    timeout=True, continuations=(("event", "done"), ("timeout", "rejected")),
)
APPROVAL_WAIT = p.WaitSpec(
    "ask", "a-6", "fencekeeper.approval", (("request_id", "a-6/approval"),), wake_after=timedelta(hours=1),
    timeout=True, continuations=(("approved", "place"), ("rejected", "rejected"), ("timeout", "rejected")),
)
TIMEOUT_WAIT = p.WaitSpec(
    "await", "a-4", "payment.received", (("order_id", "o-1"),), wake_after=timedelta(seconds=5, microseconds=3),
    timeout=True, continuations=(("event", "done"), ("timeout", "rejected")),
)


def worlds() -> dict[str, World]:
    """The worlds the protocol cases start from, each reached by the kernel's own decisions."""
    empty = World("none", None, None)
    eligible = _apply(empty, "eligible", p.admit(None, _admit_request(), T0))
    running = _apply(
        eligible, "running", p.claim(eligible.execution, eligible.dispatch, p.ClaimRequest("w-1", "tok-1", LEASE), T0 + US)
    )
    out = {w.name: w for w in (empty, eligible, running)}
    assert running.execution is not None and running.dispatch is not None and running.credential is not None
    at_limit = attrs.evolve(
        running,
        name="running_at_99_steps",
        execution=attrs.evolve(running.execution, step_count=p.STEP_LIMIT - 1),
        dispatch=attrs.evolve(running.dispatch, step_count=p.STEP_LIMIT - 1),
    )
    out[at_limit.name] = at_limit
    full = attrs.evolve(
        running,
        name="running_at_100_steps",
        execution=attrs.evolve(running.execution, step_count=p.STEP_LIMIT),
        dispatch=attrs.evolve(running.dispatch, step_count=p.STEP_LIMIT),
    )
    out[full.name] = full
    released = _apply(
        running, "released",
        p.release(running.execution, running.dispatch, p.ReleaseRequest(running.credential, 2), T0 + 2 * US),
        credential=running.credential,
    )
    out[released.name] = released
    reclaimed = _apply(
        released, "reclaimed",
        p.claim(released.execution, released.dispatch, p.ClaimRequest("w-2", "tok-2", LEASE), T0 + 3 * US),
    )
    out[reclaimed.name] = reclaimed
    for target, spec in (("waiting", EVENT_WAIT), ("waiting_timer", TIMER_WAIT), ("waiting_timeout", TIMEOUT_WAIT),
                         ("waiting_approval", APPROVAL_WAIT)):
        w = _apply(
            running, target,
            p.finalize(running.execution, running.dispatch, _finalize_request(running, "waiting", wait=spec), T0 + 5 * US),
            credential=running.credential,
        )
        out[w.name] = w
    for target in ("succeeded", "failed", "suspended", "reconciliation_required"):
        w = _apply(
            running, target,
            p.finalize(running.execution, running.dispatch, _finalize_request(running, target), T0 + 5 * US),
            credential=running.credential,
        )
        out[w.name] = w
    waiting = out["waiting"]
    assert waiting.execution is not None and waiting.registration is not None
    woken = _apply(
        waiting, "woken",
        p.wake(
            waiting.execution, waiting.dispatch, waiting.registration,
            p.WakeRequest(waiting.registration.key, p.WakeReason.EVENT, "ev-1", B, OK, "payment.received", (("order_id", "o-1"),)),
            T0 + 6 * US,
        ),
    )
    out[woken.name] = woken
    cancelled = _apply(
        waiting, "cancelled",
        p.cancel(waiting.execution, waiting.dispatch, p.CancelRequest("e-1", B, waiting.execution.revision, OK), T0 + 6 * US),
    )
    out[cancelled.name] = cancelled
    # Rows that disagree, as a broken or concurrent writer could leave them.
    out["no_dispatch"] = attrs.evolve(running, name="no_dispatch", dispatch=None)
    out["foreign_dispatch"] = attrs.evolve(
        running, name="foreign_dispatch", dispatch=attrs.evolve(running.dispatch, workflow_execution_id="e-2")
    )
    out["running_dispatch_eligible"] = attrs.evolve(
        running, name="running_dispatch_eligible",
        dispatch=attrs.evolve(
            running.dispatch, dispatch_state=DispatchState.ELIGIBLE, lease_token=None, leased_by=None,
            lease_expires_at=None,
        ),
    )
    out["claimed_dispatch_eligible_execution"] = attrs.evolve(
        running, name="claimed_dispatch_eligible_execution",
        execution=attrs.evolve(running.execution, state=ExecutionState.ELIGIBLE),
    )
    waiting_row = out["waiting"]
    assert waiting_row.dispatch is not None
    # A holder of an execution that got past an error (resumed after quarantine, then claimed again):
    # its dispatch row still carries that error's code, which only a move to succeeded clears.
    out["running_after_error"] = attrs.evolve(
        running, name="running_after_error",
        dispatch=attrs.evolve(running.dispatch, last_error_code="quarantine_expired"),
    )
    # Suspended at the bound, as the interpreter leaves it: no visit, the reason step_limit.
    full_world = out["running_at_100_steps"]
    out["suspended_at_step_limit"] = _apply(
        full_world, "suspended_at_step_limit",
        p.finalize(
            full_world.execution, full_world.dispatch,
            _finalize_request(full_world, "suspended", step=None, error_code="step_limit"), T0 + 5 * US,
        ),
        credential=full_world.credential,
    )
    out["waiting_dispatch_eligible"] = attrs.evolve(
        waiting_row, name="waiting_dispatch_eligible",
        dispatch=attrs.evolve(waiting_row.dispatch, dispatch_state=DispatchState.ELIGIBLE),
    )
    return out


def _lease_end(world: World) -> datetime:
    assert world.dispatch is not None and world.dispatch.lease_expires_at is not None
    return world.dispatch.lease_expires_at


# Malformed values, one field at a time, as JSON (the kernel refuses each, naming the field).
BAD_ID = "not an id"
NAIVE = "2026-03-01T12:00:00.123457"
OFFSET = "2026-03-01T13:00:00.123457+01:00"


def _case(decision: str, world: World, request: Any, now: Any, label: str, *, facts: Any = None) -> Case:
    rows: dict[str, Any] = {
        "execution": wire.execution(world.execution),
        "dispatch": wire.dispatch(world.dispatch),
    }
    if facts is not None:
        # Cases 2.10.0: the evidence and pinned definition a store holds for a recovery.
        rows["facts"] = facts
    if decision == "admit" and world.name == "id_taken":
        # The identity already names another object (an evidence object): one space of identities.
        rows["id_taken"] = True
    if decision == "wake":
        rows["registration"] = wire.registration(world.registration)
    if decision == "recover":
        rows["recovery"] = wire.recovery_record(world.recovery)
    now_text = now if isinstance(now, str) else wire.time_text(now)
    data = {"decision": decision, "rows": rows, "request": request, "now": now_text}
    expected = wire.decide(decision, rows, request, now_text)
    normative = ["outcome", "code", "field"]
    if expected["outcome"] == "decision":
        normative = ["outcome", "guard", "execution", "dispatch", "registration", "lease", "closes"]
        if decision == "recover":
            normative.append("recovery")
        if facts is not None:
            normative.append("objects")
    elif expected["outcome"] == "unchanged" and decision == "recover":
        normative = ["outcome", "code", "record"]
    elif expected["outcome"] == "unchanged":
        normative = ["outcome", "code"]
    return {
        "id": f"{decision}/{world.name}/{label}",
        "input": data,
        "expected": expected,
        "normative": normative,
    }


def _j(value: Any) -> Any:
    """JSON form of a request value built with the kernel's own classes."""
    if isinstance(value, p.Authority):
        return wire.authority(value)
    if isinstance(value, p.LeaseCredential):
        return wire.credential(value)
    if isinstance(value, p.StepRecord):
        return wire.step(value)
    if isinstance(value, p.WaitSpec):
        return wire.wait_spec(value)
    if isinstance(value, p.WaitKey):
        return {"execution_id": value.execution_id, "node_id": value.node_id, "attempt_id": value.attempt_id}
    if isinstance(value, timedelta):
        return wire.duration_us(value)
    if isinstance(value, ExecutionState | p.WakeReason | p.RecoveryKind):
        return value.value
    if isinstance(value, tuple):
        return [_j(v) for v in value]
    return value


def _request_json(request: Any) -> dict[str, Any]:
    return {f.name: _j(getattr(request, f.name)) for f in attrs.fields(type(request))}


Variant = tuple[str, dict[str, Any], Any]


def _mutations(base: dict[str, Any], now: datetime, invalid: dict[str, Any]) -> Iterator[Variant]:
    yield "well_formed", base, now
    yield "naive_now", base, NAIVE
    yield "offset_now", base, OFFSET
    for field, value in invalid.items():
        changed = json.loads(json.dumps(base))
        target = changed
        parts = field.split(".")
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = value
        yield f"bad_{field}", changed, now


def _credential_variants(world: World, base: dict[str, Any], now: datetime) -> Iterator[Variant]:
    """The lease checks, each broken alone, and the expiry boundary on both sides."""
    c = world.credential
    assert c is not None
    for label, changed in (
        ("other_token", {"lease_token": "tok-x"}),
        ("other_worker", {"worker_id": "w-x"}),
        ("stale_fence", {"fence": max(1, c.fence - 1) if c.fence > 1 else c.fence + 1}),
    ):
        data = json.loads(json.dumps(base))
        holder = data.get("credential", data)
        holder.update(changed)
        yield label, data, now
    end = _lease_end(world)
    yield "last_microsecond_of_lease", base, end - US
    yield "at_expiry", base, end


_LEASE_STATES = ("running", "reclaimed", "released", "waiting", "succeeded", "no_dispatch", "foreign_dispatch",
                 "running_dispatch_eligible", "claimed_dispatch_eligible_execution", "none")
"""Worlds every fenced write is tried in: the holder's, its successors', and rows that disagree."""


def _admit_cases(w: dict[str, World]) -> list[Case]:
    """Admit: a new execution, an existing one, a taken identity."""
    cases: list[Case] = []
    for world in (w["none"], w["eligible"]):
        base = _request_json(_admit_request())
        for label, request, now in _mutations(
            base, T0, {"execution_id": BAD_ID, "definition_revision": 0, "authority.granted": 1,
                       "start_node_id": "", "business_id": BAD_ID},
        ):
            cases.append(_case("admit", world, request, now, label))
        cases.append(_case("admit", world, {**base, "authority": _j(NO)}, T0, "not_authorized"))
    cases.append(_case("admit", attrs.evolve(w["none"], name="id_taken"), _request_json(_admit_request()), T0, "good"))
    return cases


def _claim_cases(w: dict[str, World]) -> list[Case]:
    """Claim: every state, eligible_at on both sides, malformed fields."""
    cases: list[Case] = []
    claim = _request_json(p.ClaimRequest("w-9", "tok-9", LEASE))
    for name in ("eligible", "released", "running", "waiting", "woken", "cancelled", "none", "no_dispatch",
                 "foreign_dispatch", "waiting_dispatch_eligible", "reconciliation_required"):
        cases.append(_case("claim", w[name], claim, T0 + 10 * US, "good"))
    released = w["released"]
    assert released.dispatch is not None
    cases.append(_case("claim", released, claim, released.dispatch.eligible_at - US, "before_eligible_at"))
    cases.append(_case("claim", released, claim, released.dispatch.eligible_at, "at_eligible_at"))
    for label, request, now in _mutations(
        claim, T0 + 10 * US, {"worker_id": BAD_ID, "lease_token": "", "lease_duration": 0}
    ):
        cases.append(_case("claim", w["eligible"], request, now, label))
    cases.append(_case("claim", w["eligible"], {**claim, "lease_duration": -5}, T0, "negative_duration"))
    cases.append(_case("claim", w["eligible"], {**claim, "lease_duration": 400 * 365 * 86_400 * 10**6 * 25}, T0,
                       "expiry_past_last_time"))
    return cases


def _fenced_cases(w: dict[str, World]) -> list[Case]:
    """Renew, record_step, release, fenced: the fenced writes, in every state and with each lease check broken.

    ``fenced`` is the decision a store applies when it appends evidence under a lease: it writes no
    row, so its request is the credential alone and its cases check the refusal or the guard.
    """
    cases: list[Case] = []
    for decision in ("renew", "record_step", "release", "fenced"):
        for name in dict.fromkeys(("running_at_99_steps", "running_at_100_steps", "running_after_error",
                                   *_LEASE_STATES)):
            world = w[name]
            cred = w["running"].credential if world.credential is None else world.credential
            assert cred is not None
            execution = world.execution
            revision = execution.revision if execution is not None else 1
            if decision == "renew":
                base = _request_json(p.RenewRequest(cred, LEASE))
            elif decision == "record_step":
                base = _request_json(p.StepRequest(cred, revision, p.StepRecord("check", "a-1", "ask"), OK))
            elif decision == "release":
                base = _request_json(p.ReleaseRequest(cred, revision))
            else:
                base = {"credential": _j(cred)}
            now = T0 + 20 * US
            cases.append(_case(decision, world, base, now, "good"))
            if name == "running":
                for label, request, at in _credential_variants(world, base, now):
                    cases.append(_case(decision, world, request, at, label))
                invalid: dict[str, Any] = {"credential.worker_id": BAD_ID, "credential.fence": 0,
                                           "credential.lease_token": ""}
                if decision == "renew":
                    invalid["lease_duration"] = 0
                elif decision != "fenced":
                    invalid["expected_revision"] = 0
                if decision == "record_step":
                    invalid["step.node_id"] = BAD_ID
                    invalid["authority.granted"] = "yes"
                for label, request, at in _mutations(base, now, invalid):
                    cases.append(_case(decision, world, request, at, label))
                if decision in ("record_step", "release"):
                    cases.append(_case(decision, world, {**base, "expected_revision": revision + 1}, now, "stale_revision"))
                if decision == "record_step":
                    cases.append(_case(decision, world, {**base, "authority": _j(NO)}, now, "not_authorized"))
                if decision == "fenced":
                    cases.append(_case(decision, world, {"credential": None}, now, "without_credential"))
    # The holder whose lease was replaced (released, then claimed by another worker with the next fence)
    # still carries its old credential: evidence appended under it is refused, and under the new holder's
    # credential with the old fence too.
    reclaimed, running = w["reclaimed"], w["running"]
    assert reclaimed.credential is not None and running.credential is not None
    now = T0 + 20 * US
    cases.append(_case("fenced", reclaimed, {"credential": _j(running.credential)}, now, "replaced_holder"))
    cases.append(_case("fenced", reclaimed, {"credential": {**_j(reclaimed.credential), "fence": running.credential.fence}},
                       now, "replaced_fence"))
    return cases


def _finalize_cases(w: dict[str, World]) -> list[Case]:
    """Finalize: the five targets and others, the twelve preconditions, the wait registration, the step limit."""
    cases: list[Case] = []
    running = w["running"]
    now = T0 + 20 * US
    for target in ("waiting", "succeeded", "failed", "suspended", "reconciliation_required", "cancelled",
                   "eligible", "running"):
        base = _request_json(_finalize_request(running, target, wait=EVENT_WAIT if target == "waiting" else None))
        cases.append(_case("finalize", running, base, now, f"to_{target}"))
    base = _request_json(_finalize_request(running, "succeeded"))
    for name in _LEASE_STATES:
        world = w[name]
        cases.append(_case("finalize", world, base, now, "to_succeeded"))
    for label, request, at in _credential_variants(running, base, now):
        cases.append(_case("finalize", running, request, at, label))
    for label, changed in (
        ("other_dispatch_id", {"dispatch_id": "e-2"}),
        ("other_execution_id", {"execution_id": "e-2"}),
        ("other_business", {"business_id": "b-2"}),
        ("stale_revision", {"expected_revision": 1}),
        ("not_authorized", {"authority": _j(NO)}),
        ("waiting_without_registration", {"target_state": "waiting"}),
        ("registration_on_other_target", {"wait": _j(EVENT_WAIT)}),
        ("timer_wait", {"target_state": "waiting", "wait": _j(TIMER_WAIT)}),
        ("relative_timeout_wait", {"target_state": "waiting", "wait": _j(TIMEOUT_WAIT)}),
        ("without_step", {"step": None}),
        # The final step moves current_node_id to the continuation it names, as record_step does.
        ("step_with_next", {"step": {"node_id": "check", "attempt_id": "a-1", "next_node_id": "done"}}),
        ("error_code", {"target_state": "failed", "error_code": "order_rejected"}),
        ("reason_at_the_bound", {"target_state": "failed", "reason": "r" * p.MAX_RATIONALE}),
        ("reason_over_the_bound", {"target_state": "failed", "reason": "r" * (p.MAX_RATIONALE + 1)}),
        # A relative wake whose wake_at would lie past the last representable time is malformed, but it is
        # turned into wake_at only once every precondition holds: a broken lease check names the refusal.
        ("relative_wait_past_last_time", {"target_state": "waiting", "wait": _j(FAR_WAIT)}),
        ("relative_wait_past_last_time_other_token",
         {"target_state": "waiting", "wait": _j(FAR_WAIT), "lease_token": "tok-x"}),
        ("relative_wait_past_last_time_on_other_target", {"wait": _j(FAR_WAIT)}),
    ):
        cases.append(_case("finalize", running, {**base, **changed}, now, label))
    # last_error_code: a move to succeeded that sets no code clears it; every other move keeps it unless
    # it sets its own (specs/protocol.md, Snapshots).
    after_error = w["running_after_error"]
    for label, changed in (
        ("to_succeeded", {}),
        ("to_suspended", {"target_state": "suspended"}),
        ("to_failed_with_error_code", {"target_state": "failed", "error_code": "order_rejected"}),
        ("to_waiting", {"target_state": "waiting", "wait": _j(EVENT_WAIT)}),
    ):
        cases.append(_case("finalize", after_error, {**base, **changed}, now, label))
    for label, request, at in _mutations(
        base, now,
        {"execution_id": BAD_ID, "worker_id": "", "fence": 0, "target_state": "finished", "expected_revision": -1,
         "authority.principal_id": BAD_ID, "error_code": BAD_ID, "step.attempt_id": ""},
    ):
        cases.append(_case("finalize", running, request, at, label))
    bad_wait = dict(_request_json(_finalize_request(running, "waiting", wait=EVENT_WAIT)))
    cases.append(_case("finalize", running, {**bad_wait, "wait": {**bad_wait["wait"], "event_type": None}}, now,
                       "wait_for_nothing"))
    cases.append(_case("finalize", running, {**bad_wait, "wait": {**bad_wait["wait"], "node_id": BAD_ID}}, now,
                       "bad_wait.node_id"))
    for name in ("running_at_99_steps", "running_at_100_steps"):
        cases.append(_case("finalize", w[name], base, now, "with_step"))
        cases.append(_case("finalize", w[name], {**base, "step": None, "target_state": "suspended"}, now, "without_step"))
    return cases


def _wake_cases(w: dict[str, World]) -> list[Case]:
    """Wake: every state, each mismatch, timers on both sides of due."""
    cases: list[Case] = []
    waiting = w["waiting"]
    assert waiting.registration is not None
    event_wake = _request_json(
        p.WakeRequest(waiting.registration.key, p.WakeReason.EVENT, "ev-2", B, OK, "payment.received",
                      (("order_id", "o-1"),))
    )
    now = T0 + 30 * US
    for name in ("waiting", "woken", "cancelled", "eligible", "running", "succeeded", "none", "no_dispatch",
                 "waiting_dispatch_eligible", "reconciliation_required"):
        cases.append(_case("wake", w[name], event_wake, now, "event"))
    woken = w["woken"]
    cases.append(_case("wake", woken, {**event_wake, "source_id": "ev-1"}, now, "same_source_again"))
    cases.append(_case("wake", woken, {**event_wake, "business_id": "b-2"}, now, "other_business"))
    cases.append(_case("wake", woken, {**event_wake, "authority": _j(NO)}, now, "not_authorized"))
    for label, changed in (
        ("other_event_type", {"event_type": "payment.refunded"}),
        ("other_correlation", {"correlation": [["order_id", "o-2"]]}),
        ("no_correlation", {"correlation": []}),
        ("other_business", {"business_id": "b-2"}),
        ("not_authorized", {"authority": _j(NO)}),
        ("other_attempt", {"key": {**event_wake["key"], "attempt_id": "a-9"}}),
        ("timer_reason", {"reason": "timer", "event_type": None, "correlation": []}),
        ("decision_approved", {"reason": "decision", "outcome": "approved"}),
        ("outcome_on_event", {"outcome": "approved"}),
        ("unknown_reason", {"reason": "alarm"}),
        ("bad_source", {"source_id": BAD_ID}),
        ("unsorted_correlation", {"correlation": [["z", "1"], ["a", "2"]]}),
    ):
        cases.append(_case("wake", waiting, {**event_wake, **changed}, now, label))
    for label, request, at in _mutations(event_wake, now, {"key.node_id": BAD_ID, "authority.granted": None}):
        cases.append(_case("wake", waiting, request, at, label))
    for name, reason in (("waiting_timer", "timer"), ("waiting_timeout", "timeout")):
        world = w[name]
        assert world.registration is not None and world.registration.spec.wake_at is not None
        due = world.registration.spec.wake_at
        timer = _request_json(p.WakeRequest(world.registration.key, p.WakeReason(reason), f"{reason}-1", B, OK))
        cases.append(_case("wake", world, timer, due - US, "one_microsecond_early"))
        cases.append(_case("wake", world, timer, due, "exactly_due"))
        other = "timeout" if reason == "timer" else "timer"
        cases.append(_case("wake", world, {**timer, "reason": other}, due, f"as_{other}"))
    cases.append(_case("wake", w["waiting_timer"], {**event_wake, "key": _j(_timer_key(w))}, now, "event_on_timer"))
    # A decision selects the continuation its determination names; without one the execution stays at the node.
    approval = w["waiting_approval"]
    assert approval.registration is not None
    decision_wake = _request_json(
        p.WakeRequest(approval.registration.key, p.WakeReason.DECISION, "d-1", B, OK, "fencekeeper.approval",
                      (("request_id", "a-6/approval"),), "approved")
    )
    for label, changed in (
        ("approved", {}),
        ("rejected", {"outcome": "rejected"}),
        ("without_outcome", {"outcome": None}),
        ("other_request", {"correlation": [["request_id", "a-9/approval"]]}),
    ):
        cases.append(_case("wake", approval, {**decision_wake, **changed}, now, f"decision_{label}"))
    cases.append(_case("wake", w["waiting_timer"], {**decision_wake, "key": _j(_timer_key(w))}, now,
                       "decision_on_timer"))
    # The registration the wake names must be given, open: none, or one already closed, wakes nothing.
    cases.append(_case("wake", attrs.evolve(waiting, name="waiting_without_registration", registration=None),
                       event_wake, now, "event"))
    closed = attrs.evolve(waiting.registration, closed_by="cancel")
    cases.append(_case("wake", attrs.evolve(waiting, name="waiting_registration_closed", registration=closed),
                       event_wake, now, "event"))
    # The registration handed over with a wake must be the one it names: an earlier attempt's never answers for it.
    earlier = attrs.evolve(waiting.registration, key=attrs.evolve(waiting.registration.key, attempt_id="a-0"))
    for label, registration in (
        ("earlier_attempts_registration", earlier),
        ("earlier_attempts_woken_registration", attrs.evolve(earlier, woken_by="ev-0", wake_reason=p.WakeReason.EVENT)),
    ):
        cases.append(_case("wake", attrs.evolve(waiting, registration=registration), event_wake, now, label))
    return cases


def _cancel_cases(w: dict[str, World]) -> list[Case]:
    """Cancel: every state, and each of its checks broken."""
    cases: list[Case] = []
    for name in ("eligible", "waiting", "running", "woken", "cancelled", "succeeded", "suspended",
                 "reconciliation_required", "none", "no_dispatch", "foreign_dispatch", "waiting_dispatch_eligible"):
        world = w[name]
        revision = world.execution.revision if world.execution is not None else 1
        base = _request_json(p.CancelRequest("e-1", B, revision, OK))
        cases.append(_case("cancel", world, base, T0 + 40 * US, "good"))
    eligible = w["eligible"]
    base = _request_json(p.CancelRequest("e-1", B, 1, OK))
    for label, changed in (
        ("other_business", {"business_id": "b-2"}),
        ("stale_revision", {"expected_revision": 2}),
        ("not_authorized", {"authority": _j(NO)}),
    ):
        cases.append(_case("cancel", eligible, {**base, **changed}, T0, label))
    for label, request, at in _mutations(base, T0, {"execution_id": BAD_ID, "expected_revision": True}):
        cases.append(_case("cancel", eligible, request, at, label))
    return cases


def protocol_cases() -> list[Case]:
    w = worlds()
    cases = [
        *_admit_cases(w), *_claim_cases(w), *_fenced_cases(w), *_finalize_cases(w), *_wake_cases(w),
        *_cancel_cases(w), *model_cases(), *approval_cases(),
    ]
    return [_tagged(case) for case in _unique(cases)]


_TERMINAL = {"succeeded", "failed", "cancelled"}
_REVIEW = {"suspended", "reconciliation_required"}
_LEASE_CODES = {"lease_token_mismatch", "worker_mismatch", "lease_expired", "stale_fence", "dispatch_not_claimed",
                "execution_not_running"}
_FENCED = {"renew", "record_step", "release", "finalize", "fenced"}


def _covers(case: Case) -> list[str]:
    """The invariants of specs/protocol.md whose boundary a protocol or recovery case sits on.

    Informative: it tells an implementer which rule a failing case guards, and lets a test
    check that every invariant has cases.
    """
    data, expected = case["input"], case["expected"]
    decision, outcome, code = data["decision"], expected["outcome"], expected.get("code")
    execution, dispatch = data["rows"]["execution"], data["rows"]["dispatch"]
    state = execution["state"] if execution else None
    written = outcome == "decision"
    found = set()
    if execution and dispatch and dispatch["dispatch_state"] != ("claimed" if state == "running" else state):
        found.add("INV-AGREE")
    if written and decision in ("claim", "release", "finalize"):
        found.add("INV-LEASE-IFF-CLAIMED")
    if (decision == "claim" and state == "running") or (decision in _FENCED and code in _LEASE_CODES):
        found.add("INV-ONE-LIVE-LEASE")
    if decision in _FENCED and (code in _LEASE_CODES or written):
        found.add("INV-FENCED-WRITES")
    if state in _TERMINAL and not written:
        found.add("INV-TERMINAL-ABSORBING")
    if written:
        found.add("INV-REVISION-PLUS-ONE")
    if code == "step_limit_reached" or (execution and execution["step_count"] >= p.STEP_LIMIT - 1):
        found.add("INV-STEP-LIMIT")
    if code == "wait_registration_required" or (written and expected.get("registration") and decision == "finalize"):
        found.add("INV-WAITING-REGISTERED")
    if decision == "wake" and (written or code in ("already_woken", "not_waiting")):
        found.add("INV-ONE-WAKE")
    if code == "cancel_running":
        found.add("INV-CANCEL-NOT-RUNNING")
    if code == "target_not_permitted":
        found.add("INV-FINALIZE-TARGETS")
    if code in ("lease_not_expired", "worker_cannot_recover"):
        found.add("INV-QUARANTINE-EXPIRED-ONLY")
    if state in _REVIEW and decision != "recover" and not written:
        found.add("INV-REVIEW-GOVERNED")
    if code in ("recovery_replayed", "recovery_conflict"):
        found.add("INV-RECOVERY-IDEMPOTENT")
    if code == "unsafe_resume":
        found.add("INV-SAFE-RESUME-PROVEN")
    if decision == "recover" and state in _REVIEW and written:
        found.add("INV-GOVERNED-EXIT")
    if code in ("illegal_transition", "not_eligible", "not_waiting", "not_in_reconciliation", "not_suspended"):
        found.add("INV-TABLES")
    return sorted(found)


def _tagged(case: Case) -> Case:
    covers = _covers(case)
    return {**case, "covers": covers} if covers else case


def _unique(cases: list[Case]) -> list[Case]:
    """Drop repeats of the same case (the loops above reach some twice); a clash of ids is a defect."""
    seen: dict[str, Case] = {}
    for case in cases:
        earlier = seen.setdefault(case["id"], case)
        assert earlier == case, f"two different cases named {case['id']!r}"
    return list(seen.values())


# --- cases from the model checker's exploration ----------------------------------------------------

# Small enough to explore in under a second, large enough for a holder, its replacement after expiry or
# release, a zombie, racing wakes and cancels (kernel/modelcheck.py, Bounds).
MODEL_BOUNDS = modelcheck.Bounds(workers=2, executions=1, claims_per_execution=2, max_tick=3, max_depth=6)
MODEL_SHIFT = timedelta(microseconds=123457)
"""Added to every time of an explored call: the checker counts whole seconds, the cases must not."""
PER_OUTCOME = 3


def _row_args(name: str, args: tuple[Any, ...]) -> tuple[World, Any, Any]:
    if name == "wake":
        execution, dispatch, registration, request, now = args
    else:
        execution, dispatch, request, now = args
        registration = None
    return World("model", execution, dispatch, registration), request, now


def model_cases() -> list[Case]:
    """Decisions the model checker makes while it explores, a few per (decision, outcome, code).

    The checker calls the real decisions on every world it reaches, zombies, expired leases and
    in-flight races included; recording those calls yields inputs no hand-written list would think
    of.  Each is re-decided here on its JSON form, so the expectation is the kernel's as always.
    """
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def recording(name: str, decide: Callable[..., p.Outcome]) -> Callable[..., p.Outcome]:
        def call(*args: Any) -> p.Outcome:
            calls.append((name, args))
            return decide(*args)

        return call

    proto = modelcheck.Protocol(
        claim=recording("claim", p.claim),
        renew=recording("renew", p.renew),
        record_step=recording("record_step", p.record_step),
        release=recording("release", p.release),
        finalize=recording("finalize", p.finalize),
        wake=recording("wake", p.wake),
        cancel=recording("cancel", p.cancel),
    )
    result = modelcheck.explore(MODEL_BOUNDS, proto)
    assert result.violation is None, result.violation
    found: dict[str, Case] = {}
    for name, args in calls:
        world, request, now = _row_args(name, args)
        rows = {"execution": wire.execution(world.execution), "dispatch": wire.dispatch(world.dispatch)}
        if name == "wake":
            rows["registration"] = wire.registration(world.registration)
        data = wire.shift_times(
            {"decision": name, "rows": rows, "request": _request_json(request), "now": wire.time_text(now)}, MODEL_SHIFT
        )
        found.setdefault(json.dumps(data, sort_keys=True), data)
    by_outcome: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for text in sorted(found):
        data = found[text]
        expected = wire.decide(data["decision"], data["rows"], data["request"], data["now"])
        group = (data["decision"], expected["outcome"], expected.get("code") or "")
        by_outcome.setdefault(group, []).append(data)
    cases = []
    for (decision, outcome, code), inputs in sorted(by_outcome.items()):
        for index, data in enumerate(inputs[:PER_OUTCOME]):
            world = World("model", wire.parse_execution(data["rows"]["execution"]),
                          wire.parse_dispatch(data["rows"]["dispatch"]),
                          wire.parse_registration(data["rows"].get("registration")))
            case = _case(decision, world, data["request"], data["now"], f"{outcome}_{code or 'written'}_{index}")
            case["id"] = "model/" + case["id"].split("/", 1)[0] + "/" + case["id"].rsplit("/", 1)[1]
            cases.append(case)
    return cases


def _timer_key(w: dict[str, World]) -> p.WaitKey:
    registration = w["waiting_timer"].registration
    assert registration is not None
    return registration.key


def recovery_cases() -> list[Case]:
    """Governed recovery decisions (specs/protocol.md, recover rows) without stored evidence."""
    w = worlds()
    cases: list[Case] = []
    running = w["running"]
    end = _lease_end(running)

    def request(world: World, kind: str, **changes: Any) -> dict[str, Any]:
        revision = world.execution.revision if world.execution is not None else 1
        base = p.RecoveryRequest(
            command_id=f"q-{kind}", kind=p.RecoveryKind(kind), execution_id="e-1", business_id=B,
            expected_revision=revision, actor_id="user:ops", authority=OK,
        )
        return {**_request_json(base), **changes}

    for name in ("running", "reclaimed", "waiting", "reconciliation_required", "suspended", "none", "no_dispatch"):
        world = w[name]
        for kind in ("quarantine_expired", "fail", "resume_safe", "reconcile_command", "resume_suspended"):
            extra: dict[str, Any] = {}
            if kind.startswith("resume"):
                extra = {"next_node_id": "check", "rationale": "nothing was sent"}
            if kind == "reconcile_command":
                extra = {"command_to_reconcile": "cmd-1"}
            at = _lease_end(world) if world.dispatch is not None and world.dispatch.lease_expires_at else end
            cases.append(_case("recover", world, request(world, kind, **extra), at, kind))
    cases.append(_case("recover", running, request(running, "quarantine_expired"), end - US, "lease_live"))
    cases.append(_case("recover", running, request(running, "quarantine_expired", actor_id="w-1"), end, "by_holder"))
    cases.append(_case("recover", running, request(running, "quarantine_expired", authority=_j(NO)), end,
                       "not_authorized"))
    cases.append(_case("recover", running, request(running, "quarantine_expired", business_id="b-2"), end,
                       "other_business"))
    cases.append(_case("recover", running, request(running, "quarantine_expired", expected_revision=1), end,
                       "stale_revision"))
    quarantined = _apply(
        running, "quarantined",
        _recover_outcome(running, request(running, "quarantine_expired"), end),
    )
    replay = request(running, "quarantine_expired")
    cases.append(_case("recover", quarantined, replay, end + US, "replayed"))
    cases.append(_case("recover", quarantined, {**replay, "kind": "fail"}, end + US, "conflict"))
    cases.append(_case("recover", quarantined, {**replay, "command_id": BAD_ID}, end + US, "bad_command_id"))
    # A stored result answers only a caller who may see it; a conflict is told only to one as well.
    cases.append(_case("recover", quarantined, {**replay, "authority": _j(NO)}, end + US, "replayed_not_authorized"))
    cases.append(_case("recover", quarantined, {**replay, "business_id": "b-2"}, end + US, "replayed_other_business"))
    cases.append(_case("recover", quarantined, {**replay, "kind": "fail", "authority": _j(NO)}, end + US,
                       "conflict_not_authorized"))
    cases.append(_case("recover", quarantined, {**replay, "expected_revision": 1}, end + US, "conflict_other_revision"))
    suspended = w["suspended"]
    cases.append(_case("recover", suspended, request(suspended, "resume_suspended", next_node_id="check"), end,
                       "without_rationale"))
    # The review decisions' checks after the state, in order: business, revision, authority.
    for name in ("reconciliation_required", "suspended"):
        world = w[name]
        for kind in ("fail", "resume_suspended" if name == "suspended" else "resume_safe"):
            extra = {"next_node_id": "check", "rationale": "nothing was sent"} if kind.startswith("resume") else {}
            for label, changed in (
                ("other_business", {"business_id": "b-2", "expected_revision": 1, "authority": _j(NO)}),
                ("stale_revision", {"expected_revision": 1, "authority": _j(NO)}),
                ("not_authorized", {"authority": _j(NO)}),
            ):
                cases.append(_case("recover", world, request(world, kind, **extra, **changed), end, f"{kind}_{label}"))
    # A step_limit suspension (the dispatch row's last_error_code) can be failed, never resumed.
    at_limit = w["suspended_at_step_limit"]
    cases.append(_case("recover", at_limit, request(at_limit, "fail"), end, "fail"))
    cases.append(_case("recover", at_limit, request(at_limit, "resume_suspended", next_node_id="check",
                                                     rationale="the bound was raised"), end, "resume_suspended"))
    cases.extend(_recovery_fact_cases(w, request))
    cases.extend(_recovery_request_cases(w, request))
    cases.extend(_recovery_rule_cases(w, request))
    return [_tagged(case) for case in _unique(cases)]


def _recovery_request_cases(w: dict[str, World], request: Callable[..., dict[str, Any]]) -> list[Case]:
    """Cases 4.7.0: the recovery request, checked field by field (specs/protocol.md, Recovery requests).

    Each order case breaks two fields next to each other in the table and expects the first; the holder
    cases pin who the lease holder is and where that check stands among the others.
    """
    running, review, reclaimed = w["running"], w["reconciliation_required"], w["reclaimed"]
    end = _lease_end(running)
    bad_authority = {"granted": 1, "principal_id": "user:ops"}
    cases: list[Case] = []
    for label, kind, changes in (
        ("command_id_before_kind", "fail", {"command_id": BAD_ID, "kind": "reboot"}),
        ("kind_before_execution_id", "fail", {"kind": "reboot", "execution_id": BAD_ID}),
        ("execution_id_before_business_id", "fail", {"execution_id": BAD_ID, "business_id": BAD_ID}),
        ("business_id_before_expected_revision", "fail", {"business_id": BAD_ID, "expected_revision": 0}),
        ("expected_revision_before_actor_id", "fail", {"expected_revision": 0, "actor_id": BAD_ID}),
        ("actor_id_before_authority", "fail", {"actor_id": BAD_ID, "authority": bad_authority}),
        ("authority_before_command_to_reconcile", "reconcile_command",
         {"authority": bad_authority, "command_to_reconcile": BAD_ID}),
        ("command_to_reconcile_before_next_node_id", "resume_safe",
         {"command_to_reconcile": BAD_ID, "next_node_id": BAD_ID}),
        ("next_node_id_before_rationale", "resume_safe", {"next_node_id": BAD_ID, "rationale": 7}),
        ("continuation_of_no_resume_before_rationale", "fail", {"next_node_id": "check", "rationale": 7}),
        ("rationale_before_now", "fail", {"rationale": "x" * 2001}),
    ):
        now = NAIVE if label == "rationale_before_now" else wire.time_text(end)
        cases.append(_case("recover", review, {**request(review, kind), **changes}, now, f"request/{label}"))
    # A malformed request is refused before the rows are read: here they hold no execution at all.
    cases.append(_case("recover", w["none"], request(review, "fail", rationale="x" * 2001), end,
                       "request/before_the_rows"))
    # Only a resume names a continuation; any other decision naming one is refused, even a well-formed one.
    for world, kind, extra in (
        (running, "quarantine_expired", {}),
        (review, "fail", {}),
        (review, "reconcile_command", {"command_to_reconcile": "cmd-1"}),
    ):
        cases.append(_case("recover", world, request(world, kind, next_node_id="check", **extra), end,
                           f"request/{kind}_names_a_continuation"))
    # The rationale: at most 2000 characters (code points), text a store can keep.
    for label, rationale in (
        ("rationale_of_2000_characters", "x" * 2000),
        ("rationale_of_2000_characters_beyond_u_ffff", "\U0001f600" * 2000),
        ("rationale_of_2001_characters_beyond_u_ffff", "\U0001f600" * 2001),
        ("rationale_with_nul", "nothing\x00was sent"),
        ("rationale_with_lone_surrogate", "nothing\ud800was sent"),
    ):
        cases.append(_case("recover", review, request(review, "fail", rationale=rationale), end, f"request/{label}"))
    # The lease holder is the dispatch row's leased_by, compared with the request's actor_id alone.
    cases.append(_case("recover", running, request(running, "quarantine_expired",
                                                   authority=_j(p.Authority(True, "w-1"))), end,
                       "holder/principal_is_the_holder"))
    reclaimed_end = _lease_end(reclaimed)
    cases.append(_case("recover", reclaimed, request(reclaimed, "quarantine_expired", actor_id="w-1"), reclaimed_end,
                       "holder/an_earlier_holder"))
    cases.append(_case("recover", reclaimed, request(reclaimed, "quarantine_expired", actor_id="w-2"), reclaimed_end,
                       "holder/the_current_holder"))
    # The holder check comes after the lease's expiry, the revision and the authority.
    held: tuple[tuple[str, dict[str, Any], datetime], ...] = (
        ("holder_with_live_lease", {}, end - US),
        ("holder_with_stale_revision", {"expected_revision": 1}, end),
        ("holder_not_authorized", {"authority": _j(NO)}, end),
    )
    for label, changes, at in held:
        cases.append(_case("recover", running, request(running, "quarantine_expired", actor_id="w-1", **changes), at,
                           f"holder/{label}"))
    return cases


def _evidence(object_id: str, kind: str, state: str, revision: int, **body: Any) -> dict[str, Any]:
    return {"object_id": object_id, "kind": kind, "revision": revision, "state": state,
            "body": {"execution_id": "e-1", "status": state, **body}}


def _step(object_id: str, node_id: str, state: str, revision: int, node_kind: str = "local_command",
          **body: Any) -> dict[str, Any]:
    return _evidence(object_id, "StepAttempt", state, revision, attempt_id=object_id, node_id=node_id,
                     node_kind=node_kind, **body)


def _cmd(object_id: str, attempt_id: str, state: str, revision: int) -> dict[str, Any]:
    return _evidence(object_id, "Command", state, revision, command_id=object_id, attempt_id=attempt_id)


def _recovery_rule_cases(w: dict[str, World], request: Callable[..., dict[str, Any]]) -> list[Case]:
    """Cases 4.7.0: the safe-resume proof and a settlement as specs/protocol.md now states them.

    Which attempt decides the permitted continuations (the newest at the current node, after the inert
    ones are settled), which definition is the pinned one, what counts as a rationale, what
    resume_suspended permits, and which submitted revisions settle a Command and its attempt.
    """
    review, suspended = w["reconciliation_required"], w["suspended"]
    assert review.dispatch is not None
    later = wire.time_text(review.dispatch.eligible_at + timedelta(seconds=90))
    at_check = {"next_node_id": "check", "rationale": "the visit issued no Command"}
    at_done = {**at_check, "next_node_id": "done"}
    a1, a2 = "e-1/a1", "e-1/a2"
    applied = (_step(a1, "check", "completed", 4, command_id=f"{a1}/command", next_node_id="done"),
               _cmd(f"{a1}/command", a1, "succeeded", 3))
    not_applied = (_step(a2, "check", "failed", 4, command_id=f"{a2}/command"), _cmd(f"{a2}/command", a2, "rejected", 3))
    cases: list[Case] = []

    def resume(label: str, changes: dict[str, Any], *evidence: dict[str, Any], definition: Any = _PINNED,
               world: World = review, kind: str = "resume_safe") -> None:
        facts = {"evidence": list(evidence), "definition": definition, "submitted": []}
        cases.append(_case("recover", world, request(world, kind, **changes), later, f"facts/{label}", facts=facts))

    # Inert attempts are settled first, whatever their kind and node, and the proof reads the settlements.
    resume("inert_attempt_of_another_kind", at_check, _step(a1, "check", "unknown", 2, node_kind="wait_for_event"))
    resume("inert_attempt_at_another_node", at_check, _step(a1, "done", "reconciliation_required", 3))
    resume("newest_attempt_inert_after_an_applied_one", at_check, *applied, _step(a2, "check", "pending", 1))
    # The newest attempt at the current node decides, in creation order.
    resume("newest_not_applied_after_applied", at_check, *applied, *not_applied)
    resume("newest_applied_after_not_applied", at_check, *not_applied, *applied)
    resume("newest_applied_after_not_applied_continued", at_done, *not_applied, *applied)
    resume("newest_at_another_node_does_not_decide", at_check, *applied,
           _step(a2, "done", "failed", 4, node_kind="end"))
    resume("not_applied_at_its_recorded_continuation", at_done,
           _step(a1, "check", "failed", 4, command_id=f"{a1}/command", next_node_id="done"),
           _cmd(f"{a1}/command", a1, "rejected", 3))
    resume("newest_running_permits_none", at_check, _step(a1, "check", "running", 2, node_kind="wait_for_event"))
    # The pinned definition is the one at the execution's id and revision, nothing else.
    resume("definition_of_another_revision", at_check, definition={**_PINNED, "revision": 2})
    resume("definition_of_another_id", at_check, definition={**_PINNED, "id": "purchase-v2"})
    # A rationale that is empty or only whitespace is none.
    resume("empty_rationale", {**at_check, "rationale": ""})
    resume("whitespace_rationale", {**at_check, "rationale": " \t\n "})
    resume("suspended_whitespace_rationale", {**at_check, "rationale": " \t\n "}, world=suspended,
           kind="resume_suspended")
    # resume_suspended permits its current node, whatever the evidence records.
    resume("suspended_after_an_applied_attempt", at_check, *applied, world=suspended, kind="resume_suspended")
    resume("suspended_not_at_the_recorded_continuation", at_done, *applied, world=suspended, kind="resume_suspended")
    resume("suspended_settles_an_inert_attempt", at_check, _step(a1, "check", "pending", 1), world=suspended,
           kind="resume_suspended")

    # A settlement: the newest submitted revision (by number, not by place) of the Command and of the
    # attempt its body names decides.
    command = "cmd-9"
    stored = (_step(a1, "check", "reconciliation_required", 3, command_id=command), _cmd(command, a1, "unknown", 2))

    def settle(label: str, *submitted: dict[str, Any], evidence: tuple[dict[str, Any], ...] = stored,
               named: str = command) -> None:
        facts = {"evidence": list(evidence), "definition": _PINNED, "submitted": list(submitted)}
        cases.append(_case("recover", review, request(review, "reconcile_command", command_to_reconcile=named), later,
                           f"facts/{label}", facts=facts))

    done_attempt = _step(a1, "check", "completed", 4, command_id=command, next_node_id="done")
    settle("settled_by_the_newest_command_revision", _cmd(command, a1, "succeeded", 4), _cmd(command, a1, "unknown", 3),
           done_attempt)
    settle("unsettled_by_the_newest_command_revision", _cmd(command, a1, "unknown", 4),
           _cmd(command, a1, "succeeded", 3), done_attempt)
    settle("attempt_settled_by_its_newest_revision", _cmd(command, a1, "succeeded", 3), done_attempt,
           _step(a1, "check", "reconciliation_required", 3, command_id=command))
    settle("attempt_unsettled_by_its_newest_revision", _cmd(command, a1, "succeeded", 3),
           _step(a1, "check", "reconciliation_required", 5, command_id=command), done_attempt)
    settle("attempt_settled_as_failed", _cmd(command, a1, "rejected", 3),
           _step(a1, "check", "failed", 4, command_id=command))
    settle("another_attempt_settled", _cmd(command, a1, "succeeded", 3),
           _step(a2, "check", "completed", 4, command_id=command, next_node_id="done"))
    settle("named_object_not_a_command", _cmd(command, a1, "succeeded", 3), done_attempt, named=a1)
    return cases


# A pinned definition holding the node the worlds stand at ("check") and its continuation.
_PINNED = {
    "id": "purchase", "revision": 1, "start": "check", "inputs": [],
    "nodes": [
        {"id": "check", "kind": "local_command", "revision": 1, "operation": "order.place", "targets": [],
         "payload": {}, "next": "done", "on_failure": "done"},
        {"id": "done", "kind": "end", "revision": 1, "outcome": "succeeded"},
    ],
}
_ATTEMPT = "e-1/a5"
_COMMAND = "e-1/a5/command"


def _attempt(state: str, revision: int, **body: Any) -> dict[str, Any]:
    return {"object_id": _ATTEMPT, "kind": "StepAttempt", "revision": revision, "state": state,
            "body": {"attempt_id": _ATTEMPT, "execution_id": "e-1", "node_id": "check", "node_kind": "local_command",
                     "status": state, **body}}


def _command(state: str, revision: int) -> dict[str, Any]:
    return {"object_id": _COMMAND, "kind": "Command", "revision": revision, "state": state,
            "body": {"command_id": _COMMAND, "attempt_id": _ATTEMPT, "execution_id": "e-1", "status": state}}


def _facts(*evidence: dict[str, Any], definition: bool = True, submitted: tuple[dict[str, Any], ...] = ()) -> Any:
    return {"evidence": list(evidence), "definition": _PINNED if definition else None, "submitted": list(submitted)}


def _recovery_fact_cases(w: dict[str, World], request: Callable[..., dict[str, Any]]) -> list[Case]:
    """Recoveries decided on the store's facts (cases 2.10.0): what a resume and a settlement write.

    The proof is the kernel's, from the evidence and the pinned definition (specs/protocol.md, Safe-resume
    proof); each case breaks one fact, or shows what the decision writes when all hold.
    """
    review, suspended = w["reconciliation_required"], w["suspended"]
    assert review.dispatch is not None
    later = review.dispatch.eligible_at + timedelta(seconds=90)
    resume = {"next_node_id": "check", "rationale": "the visit issued no Command"}
    pending = _attempt("pending", 1)
    unknown_attempt = _attempt("unknown", 3, command_id=_COMMAND)
    quarantined = _attempt("reconciliation_required", 3, command_id=_COMMAND)
    applied = _attempt("completed", 4, command_id=_COMMAND, next_node_id="done")
    settled = (_command("succeeded", 3), _attempt("completed", 4, command_id=_COMMAND, next_node_id="done"))
    cases: list[Case] = []
    for label, kind, changes, facts, now in (
        # No attempt at the node: the node itself may be entered again, as a new attempt.
        ("no_evidence", "resume_safe", resume, _facts(), later),
        # The store's clock below the row's eligible_at: the resume queues at now, claimable at once.
        ("clock_behind_eligible_at", "resume_safe", resume, _facts(), review.dispatch.eligible_at - timedelta(seconds=1)),
        # An attempt that never issued its Command is settled as not applied by the resume itself.
        ("inert_attempt", "resume_safe", resume, _facts(pending), later),
        ("inert_quarantined_attempt", "resume_safe", resume, _facts(_attempt("reconciliation_required", 3)), later),
        ("inert_attempt_at_its_continuation", "resume_safe", {**resume, "next_node_id": "done"}, _facts(pending), later),
        ("unknown_command", "resume_safe", resume, _facts(unknown_attempt, _command("unknown", 2)), later),
        ("issued_command", "resume_safe", resume, _facts(quarantined, _command("issued", 1)), later),
        ("applied_then_reentered", "resume_safe", resume, _facts(applied, _command("succeeded", 3)), later),
        ("applied_then_continued", "resume_safe", {**resume, "next_node_id": "done"},
         _facts(applied, _command("succeeded", 3)), later),
        ("definition_not_registered", "resume_safe", resume, _facts(definition=False), later),
        ("node_not_in_definition", "resume_safe", {**resume, "next_node_id": "elsewhere"}, _facts(), later),
        ("without_continuation", "resume_safe", {"rationale": "the visit issued no Command"}, _facts(), later),
        ("without_rationale", "resume_safe", {"next_node_id": "check"}, _facts(), later),
        # A settlement: the quarantined visit counts its step here; one its handler left unknown was counted.
        ("quarantined_visit_settled", "reconcile_command", {"command_to_reconcile": _COMMAND},
         _facts(quarantined, _command("unknown", 2), submitted=settled), later),
        ("unknown_visit_settled", "reconcile_command", {"command_to_reconcile": _COMMAND},
         _facts(unknown_attempt, _command("unknown", 2), submitted=settled), later),
        ("settlement_still_unknown", "reconcile_command", {"command_to_reconcile": _COMMAND},
         _facts(quarantined, _command("unknown", 2)), later),
        ("command_already_settled", "reconcile_command", {"command_to_reconcile": _COMMAND},
         _facts(applied, _command("succeeded", 3), submitted=settled), later),
    ):
        cases.append(_case("recover", review, request(review, kind, **changes), wire.time_text(now), f"facts/{label}",
                           facts=facts))
    for label, changes in (("at_its_node", resume), ("elsewhere", {**resume, "next_node_id": "done"})):
        cases.append(_case("recover", suspended, request(suspended, "resume_suspended", **changes),
                           wire.time_text(later), f"facts/{label}", facts=_facts()))
    return cases


def _recover_outcome(world: World, request: dict[str, Any], now: datetime) -> p.Outcome:
    return recover(
        world.execution, world.dispatch, world.recovery, wire.parse_request("recover", request), now,
        facts=RecoveryFacts(),
    )
