"""Generates the language-neutral conformance cases of specs/conformance/ from the kernel.

Rules of this module:

- Every expected result is computed by the kernel (``fencekeeper.kernel``),
  never written by hand; the inputs are chosen here to reach every state,
  every refusal code and every boundary (a lease one microsecond before and
  exactly at its expiry, the 99th and 100th step, a timer one microsecond
  early and exactly due).  ``make specs`` writes the files, and
  ``tests/conformance/test_cases_committed.py`` fails if a regeneration
  would change a byte.
- Output is deterministic: cases in a fixed order, JSON with sorted keys,
  ids unique per layer.
- Every case names the parts of its expectation that are normative; free
  text never is (and is never written).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs

from fencekeeper.kernel import expr as x
from fencekeeper.kernel import modelcheck
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import DefinitionError, definition_from_mapping, parse_definition, to_mapping
from fencekeeper.kernel.machines import MACHINES, DispatchState, ExecutionState
from fencekeeper.kernel.recovery import RecoveryFacts, recover

from . import wire

SUITE_VERSION = "1.0.0"
"""Semantic version of the case format and contents (specs/conformance.md, Versioning)."""

Case = dict[str, Any]

LAYERS = ("machines", "protocol", "recovery", "expressions", "definitions", "operations", "journal", "store")

# Times carry odd microseconds so that an implementation rounding to seconds fails.
T0 = datetime(2026, 3, 1, 12, 0, 0, 123457, tzinfo=UTC)
LEASE = timedelta(seconds=30, microseconds=1)
US = timedelta(microseconds=1)
B = "b-1"
OK = p.Authority(True, "user:ops")
NO = p.Authority(False, "user:intruder")


# --- machines ---------------------------------------------------------------------------


def machine_cases() -> list[Case]:
    """Every (machine, state, event) pair: its target, or illegal."""
    cases = []
    for name, machine in MACHINES.items():
        for state in machine.state_type:
            for event in machine.event_type:
                found = machine.table.get((state, event))
                expected = {"illegal": True} if found is None else {"target": found.value}
                cases.append(
                    {
                        "id": f"{name}/{state.value}/{event.value}",
                        "input": {"machine": name, "state": state.value, "event": event.value},
                        "expected": expected,
                        "normative": ["illegal", "target"],
                    }
                )
    return cases


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
    for target, spec in (("waiting", EVENT_WAIT), ("waiting_timer", TIMER_WAIT), ("waiting_timeout", TIMEOUT_WAIT)):
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


def _case(decision: str, world: World, request: Any, now: Any, label: str) -> Case:
    rows: dict[str, Any] = {
        "execution": wire.execution(world.execution),
        "dispatch": wire.dispatch(world.dispatch),
    }
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


def protocol_cases() -> list[Case]:
    w = worlds()
    cases: list[Case] = []
    lease_states = ["running", "reclaimed", "released", "waiting", "succeeded", "no_dispatch", "foreign_dispatch",
                    "running_dispatch_eligible", "claimed_dispatch_eligible_execution", "none"]

    # admit
    for world in (w["none"], w["eligible"]):
        base = _request_json(_admit_request())
        for label, request, now in _mutations(
            base, T0, {"execution_id": BAD_ID, "definition_revision": 0, "authority.granted": 1,
                       "start_node_id": "", "business_id": BAD_ID},
        ):
            cases.append(_case("admit", world, request, now, label))
        cases.append(_case("admit", world, {**base, "authority": _j(NO)}, T0, "not_authorized"))
    cases.append(_case("admit", attrs.evolve(w["none"], name="id_taken"), _request_json(_admit_request()), T0, "good"))

    # claim
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

    # renew, record_step, release: the fenced writes
    for decision in ("renew", "record_step", "release"):
        for name in dict.fromkeys(("running_at_99_steps", "running_at_100_steps", *lease_states)):
            world = w[name]
            cred = w["running"].credential if world.credential is None else world.credential
            assert cred is not None
            execution = world.execution
            revision = execution.revision if execution is not None else 1
            if decision == "renew":
                base = _request_json(p.RenewRequest(cred, LEASE))
            elif decision == "record_step":
                base = _request_json(p.StepRequest(cred, revision, p.StepRecord("check", "a-1", "ask"), OK))
            else:
                base = _request_json(p.ReleaseRequest(cred, revision))
            now = T0 + 20 * US
            cases.append(_case(decision, world, base, now, "good"))
            if name == "running":
                for label, request, at in _credential_variants(world, base, now):
                    cases.append(_case(decision, world, request, at, label))
                invalid: dict[str, Any] = {"credential.worker_id": BAD_ID, "credential.fence": 0,
                                           "credential.lease_token": ""}
                if decision == "renew":
                    invalid["lease_duration"] = 0
                else:
                    invalid["expected_revision"] = 0
                if decision == "record_step":
                    invalid["step.node_id"] = BAD_ID
                    invalid["authority.granted"] = "yes"
                for label, request, at in _mutations(base, now, invalid):
                    cases.append(_case(decision, world, request, at, label))
                if decision != "renew":
                    cases.append(_case(decision, world, {**base, "expected_revision": revision + 1}, now, "stale_revision"))
                if decision == "record_step":
                    cases.append(_case(decision, world, {**base, "authority": _j(NO)}, now, "not_authorized"))

    # finalize
    running = w["running"]
    now = T0 + 20 * US
    for target in ("waiting", "succeeded", "failed", "suspended", "reconciliation_required", "cancelled",
                   "eligible", "running"):
        base = _request_json(_finalize_request(running, target, wait=EVENT_WAIT if target == "waiting" else None))
        cases.append(_case("finalize", running, base, now, f"to_{target}"))
    base = _request_json(_finalize_request(running, "succeeded"))
    for name in lease_states:
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
        ("error_code", {"target_state": "failed", "error_code": "order_rejected"}),
    ):
        cases.append(_case("finalize", running, {**base, **changed}, now, label))
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

    # wake
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

    # cancel
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
    cases += model_cases()
    return [_tagged(case) for case in _unique(cases)]


_TERMINAL = {"succeeded", "failed", "cancelled"}
_REVIEW = {"suspended", "reconciliation_required"}
_LEASE_CODES = {"lease_token_mismatch", "worker_mismatch", "lease_expired", "stale_fence", "dispatch_not_claimed",
                "execution_not_running"}
_FENCED = {"renew", "record_step", "release", "finalize"}


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


def _shift(value: Any) -> Any:
    """Every time in a JSON value moved by MODEL_SHIFT (relative order and distances are kept)."""
    if isinstance(value, dict):
        return {k: _shift(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift(v) for v in value]
    if isinstance(value, str):
        moment = wire.parse_time(value)
        if isinstance(moment, datetime) and moment.tzinfo is not None:
            return wire.time_text(moment + MODEL_SHIFT)
    return value


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
        data = _shift({"decision": name, "rows": rows, "request": _request_json(request), "now": wire.time_text(now)})
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
    suspended = w["suspended"]
    cases.append(_case("recover", suspended, request(suspended, "resume_suspended", next_node_id="check"), end,
                       "without_rationale"))
    return [_tagged(case) for case in _unique(cases)]


def _recover_outcome(world: World, request: dict[str, Any], now: datetime) -> p.Outcome:
    return recover(
        world.execution, world.dispatch, world.recovery, wire.parse_request("recover", request), now,
        facts=RecoveryFacts(),
    )


# --- expressions ---------------------------------------------------------------------------

BIG = 2**63


def tagged(value: object) -> Any:
    """A binding in the tagged form of specs/conformance.md (numbers keep integer or decimal)."""
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "integer", "value": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"type": "decimal", "value": "nan"}
        if value in (float("inf"), float("-inf")):
            return {"type": "decimal", "value": "inf" if value > 0 else "-inf"}
        return {"type": "decimal", "value": repr(value)}
    if isinstance(value, str):
        return {"type": "string", "value": value}
    if value is None:
        return {"type": "null"}
    if isinstance(value, list | tuple):
        return {"type": "array", "value": [tagged(v) for v in value]}
    if isinstance(value, dict):
        return {"type": "map", "value": {str(k): tagged(v) for k, v in value.items()}}
    raise TypeError(value)


def untagged(data: Any) -> object:
    kind = data["type"]
    if kind == "bool":
        return bool(data["value"])
    if kind == "integer":
        return int(data["value"])
    if kind == "decimal":
        return float(data["value"])
    if kind == "string":
        return str(data["value"])
    if kind == "null":
        return None
    if kind == "array":
        return [untagged(v) for v in data["value"]]
    if kind == "map":
        return {k: untagged(v) for k, v in data["value"].items()}
    raise ValueError(f"unknown binding type {kind!r}")


def evaluate_expression(source: str, bindings: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one expression case."""
    try:
        tree = x.parse(source)
    except x.ExpressionError as exc:
        return {"result": "error", "code": exc.code, "position": exc.position}
    return {"result": x.evaluate(tree, {k: untagged(v) for k, v in bindings.items()}).value}


_EVALUATIONS: list[tuple[str, dict[str, object]]] = [
    ("a == 1", {"a": 1}), ("a == 1", {"a": 2}), ("a == 1", {"a": 1.0}), ("a == 1.5", {"a": 1.5}),
    ("a != 1", {"a": 2}), ("a != 1", {"a": 1}), ("a < 2", {"a": 1}), ("a < 2", {"a": 2}),
    ("a <= 2", {"a": 2}), ("a <= 2", {"a": 2.5}), ("a > 2", {"a": 3}), ("a > 2", {"a": 2}),
    ("a >= 2", {"a": 2.0}), ("a >= 2", {"a": 1.999}), ("a > -1", {"a": 0}), ("a == -0.0", {"a": 0}),
    ("a < 1.0e16", {"a": 10**15}), ("a == 9007199254740993", {"a": 9007199254740992.0}),
    ("a == 9223372036854775807", {"a": 2**63 - 1}), ("a == -9223372036854775808", {"a": -(2**63)}),
    ("a == b", {"a": 3, "b": 3}), ("1 < 2", {}), ("a == 'x'", {"a": "x"}), ('a == "x"', {"a": "y"}),
    ("a != 'x'", {"a": "y"}), ("a < 'b'", {"a": "a"}), ("a < 'a'", {"a": "Z"}), ("a >= 'ab'", {"a": "b"}),
    ("a <= ''", {"a": "x"}), ("a == 'it\\'s'", {"a": "it's"}), ('a == "\\\\"', {"a": "\\"}),
    ("a < 'é'", {"a": "z"}), ("a < '\U0001f600'", {"a": "\uffff"}),
    ("a == true", {"a": True}), ("a == false", {"a": True}), ("a != true", {"a": False}),
    ("a < true", {"a": False}), ("a >= false", {"a": True}), ("true", {}), ("false", {}),
    ("a", {"a": True}), ("a", {"a": False}), ("(a > 1) == true", {"a": 2}), ("(a > 1) == b", {"a": 0, "b": False}),
    ("(a > 1) == true", {}), ("(a and b) != (a or b)", {"a": True, "b": False}),
    ("a == 1", {"a": "1"}), ("a == 'x'", {"a": 1}), ("a == 1", {"a": True}), ("a == true", {"a": 1}),
    ("a < 1", {"a": "0"}), ("a == b", {"a": 1, "b": "1"}), ("a != 1", {"a": "x"}),
    ("a == 1", {}), ("a != 1", {}), ("a == 1", {"a": None}), ("a != 1", {"a": None}),
    ("a == 1", {"a": float("nan")}), ("a > 1", {"a": float("inf")}), ("a == 1", {"a": BIG}),
    ("a == 1", {"a": -BIG - 1}), ("a == 1", {"a": [1]}), ("a == 1", {"a": {"b": 1}}),
    ("a.b == 1", {"a": {"b": 1}}), ("a.b == 1", {"a.b": 1}), ("1", {}), ("'yes'", {}), ("a", {"a": 1}),
    ("a", {"a": "true"}), ("a", {}), ("not a", {"a": 0}), ("a and true", {"a": "x"}), ("a or false", {"a": None}),
    ("a in [1, 2]", {"a": 2}), ("a in [1, 2]", {"a": 3}), ("a in [1, 2.5]", {"a": 2.5}), ("a in [1, 2]", {"a": 1.0}),
    ("a in ['x', 'y']", {"a": "y"}), ("a in ['x', 'y']", {"a": "z"}), ("a in [true]", {"a": True}),
    ("a in [true]", {"a": False}), ("a in []", {"a": 1}), ("a in []", {}), ("a in [1, 2]", {"a": "1"}),
    ("a in [1, 2]", {"a": True}), ("a in [1, 2]", {}), ("a not in [1, 2]", {"a": 3}),
    ("a not in [1, 2]", {"a": 1}), ("a not in [1, 2]", {"a": "1"}), ("a not in [1, 2]", {}),
    ("a in b", {"a": 1, "b": [0, 1]}), ("a in b", {"a": 2, "b": [0, 1]}), ("a in b", {"a": 2, "b": []}),
    ("a in b", {"a": 1, "b": [1, "x"]}), ("a in b", {"a": 2, "b": [1, "x"]}), ("a in b", {"a": 1, "b": [1, None]}),
    ("a in b", {"a": 1, "b": [1, [1]]}), ("a in b", {"a": 1, "b": [1, float("nan")]}),
    ("a in b", {"a": "a", "b": "abc"}), ("a in b", {"a": 1, "b": {"1": 1}}), ("a in b", {"a": 1, "b": 1}),
    ("a in b", {"a": 1}), ("a not in b", {"a": 2, "b": [0, 1]}), ("a not in b", {"a": 1, "b": [0, 1]}),
    ("a not in b", {"a": 1}), ("not a == 1", {"a": 1}), ("not a in [1]", {"a": 2}),
    ("a or b and c", {"a": True, "b": False, "c": False}), ("(a or b) and c", {"a": True, "b": False, "c": False}),
    ("not a or b", {"a": True, "b": True}), ("not (a or b)", {"a": False, "b": True}),
    ("input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
     {"input.amount": 250, "input.currency": "EUR", "await_payment.refunded": False}),
    ("input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
     {"input.amount": 250, "input.currency": "EUR"}),
    ("input.amount >= 100 and input.currency in ['EUR', 'USD'] and not await_payment.refunded",
     {"input.amount": 50, "input.currency": "EUR"}),
    ("a == 0.1", {"a": 0.1}), ("a == 1e-5", {}), ("a == 1.5e-5", {"a": 1.5e-5}), ("a < 1.0e308", {"a": 5}),
]

_REFUSED_SOURCES = [
    "", "   ", "x" * 1001, "a ==", "a == b c", "a < b < c", "x == 'abc", "'a\\nb'", "a = 1", "a && b", "True",
    "in == 1", "x.not == 1", "__import__('os')", "a[0]", "a == 1 + 1", "007 == a", "a in [1, 'x']",
    "(" * 17 + "a" + ")" * 17, "not " * 17 + "a", "a in [" + ", ".join(["1"] * 65) + "]",
    " or ".join(["a"] * 101), "1e5 == a", "1. == a", "1.5.2 == a", "2x == a", "- 1 == a", "-a == 1",
    "Amount == 1", "a == 1.0e999", "a == 9223372036854775808", "a == -9223372036854775809",
    "a == '" + "x" * 257 + "'", "a == 'x\u0001'", "a in [1,]", "a in [b]", "a == [1]", "not", "a and",
    "(a", "a)", "a == b == c", "a in b in c", "a not b", "'unterminated\n'", "a == \"\\x\"", "a == 1 !",
    "a.b. == 1", "a..b == 1", "_ == 1", "a == tru", "a ==", "[1] == a",
]

_BOUNDARY_SOURCES = [
    "(" * 16 + "a" + ")" * 16, "not " * 16 + "a", "a in [" + ", ".join(["1"] * 64) + "]",
    " or ".join(["a"] * 100), "a == '" + "x" * 256 + "'", "a == 9223372036854775807",
    "a == -9223372036854775808", "x" * 1000,
]

_KLEENE = {"T": True, "F": False, "U": None}


def expression_cases() -> list[Case]:
    cases: list[Case] = []
    seen: set[str] = set()

    def add(group: str, source: str, bindings: dict[str, object]) -> None:
        tags = {k: tagged(v) for k, v in bindings.items()}
        key = json.dumps([source, tags], sort_keys=True)
        if key in seen:
            return
        seen.add(key)
        expected = evaluate_expression(source, tags)
        normative = ["result", "code"]
        cases.append(
            {
                "id": f"{group}/{len(cases):04d}",
                "input": {"source": source, "bindings": tags},
                "expected": expected,
                "normative": normative,
                "informative": ["position"] if expected["result"] == "error" else [],
            }
        )

    for source, bindings in _EVALUATIONS:
        add("evaluate", source, bindings)
    for op in ("and", "or"):
        for p_name, p_value in _KLEENE.items():
            for q_name, q_value in _KLEENE.items():
                bindings = {k: v for k, v in (("p", p_value), ("q", q_value)) if v is not None}
                add(f"kleene_{op}_{p_name}{q_name}", f"p {op} q", bindings)
    for p_value in _KLEENE.values():
        add("kleene_not", "not p", {} if p_value is None else {"p": p_value})
    for source in _REFUSED_SOURCES:
        add("refuse", source, {})
    for source in _BOUNDARY_SOURCES:
        add("limit", source, {"a": 1, "x" * 1000: True})
    return cases


# --- definitions --------------------------------------------------------------------------

_EXAMPLE = """\
id = "purchase-approval"
revision = 1
start = "check_amount"
inputs = ["amount", "order_id"]

[[nodes]]
id = "check_amount"
kind = "condition"
revision = 1
expression = "input.amount >= 1000"
bindings = ["input.amount"]
true_next = "ask_manager"
false_next = "place_order"

[[nodes]]
id = "ask_manager"
kind = "request_approval"
revision = 1
operation = "purchase.approve"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
reviewers = ["user:manager"]
approved_next = "place_order"
rejected_next = "rejected"
timeout = { after_seconds = 86400, next = "rejected" }

[[nodes]]
id = "place_order"
kind = "local_command"
revision = 1
operation = "order.place"
next = "await_payment"
on_failure = "rejected"

[[nodes]]
id = "await_payment"
kind = "wait_for_event"
revision = 1
event_type = "payment.received"
correlation = { order_id = { from = "input.order_id" } }
next = "done"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "rejected"
kind = "end"
revision = 1
outcome = "failed"
error_code = "order_rejected"
"""

_DELETE = object()


def _edit(top: dict[str, Any] | None = None, node: str | None = None, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        target = data if node is None else next(n for n in data["nodes"] if n["id"] == node)
        for key, value in {**(top or {}), **fields}.items():
            if value is _DELETE:
                target.pop(key, None)
            else:
                target[key] = value
    return apply


_DEFINITION_EDITS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("valid", _edit()),
    ("unknown_top_level_field", _edit(colour="red")),
    ("missing_id", _edit(id=_DELETE)),
    ("missing_start", _edit(start=_DELETE)),
    ("missing_nodes", _edit(nodes=_DELETE)),
    ("bad_id", _edit(id="purchase approval")),
    ("revision_0", _edit(revision=0)),
    ("revision_boolean", _edit(revision=True)),
    ("revision_string", _edit(revision="1")),
    ("revision_too_big", _edit(revision=2**53)),
    ("title_not_string", _edit(title=7)),
    ("inputs_not_array", _edit(inputs="amount")),
    ("bad_input_name", _edit(inputs=["Amount"])),
    ("duplicate_input", _edit(inputs=["amount", "amount"])),
    ("start_names_nothing", _edit(start="nowhere")),
    ("unknown_node_field", _edit(node="done", colour="red")),
    ("unknown_kind", _edit(node="done", kind="teleport")),
    ("end_without_outcome", _edit(node="done", outcome=_DELETE)),
    ("end_bad_outcome", _edit(node="done", outcome="maybe")),
    ("failed_end_without_error_code", _edit(node="rejected", error_code=_DELETE)),
    ("succeeded_end_with_error_code", _edit(node="done", error_code="x")),
    ("condition_bad_expression", _edit(node="check_amount", expression="input.amount >= ")),
    ("condition_undeclared_binding", _edit(node="check_amount", expression="input.other >= 1")),
    ("condition_dangling_true_next", _edit(node="check_amount", true_next="nowhere")),
    ("node_revision_0", _edit(node="done", revision=0)),
    ("wait_without_event_type", _edit(node="await_payment", event_type=_DELETE)),
    ("wait_bad_timeout", _edit(node="await_payment", timeout={"after_seconds": 0, "next": "done"})),
    ("approval_without_reviewers", _edit(node="ask_manager", reviewers=[])),
    ("command_without_operation", _edit(node="place_order", operation=_DELETE)),
    ("binding_of_undeclared_input", _edit(node="check_amount", bindings=["input.nothing"],
                                          expression="input.nothing >= 1")),
    ("float_revision", _edit(node="done", revision=1.5)),
]


def _definition_result(data: dict[str, Any]) -> dict[str, Any]:
    try:
        definition = definition_from_mapping(data, "<case>")
    except DefinitionError as exc:
        return {"valid": False, "code": exc.code, "node": exc.node_id, "field": exc.field}
    return {"valid": True, "code": None, "node": None, "field": None, "start": definition.start}


def evaluate_definition(data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's answer to one definition case."""
    return _definition_result(data)


def definition_cases() -> list[Case]:
    base = to_mapping(parse_definition(_EXAMPLE))
    cases = []
    for name, edit in _DEFINITION_EDITS:
        data = json.loads(json.dumps(base))
        edit(data)
        expected = evaluate_definition(data)
        cases.append(
            {
                "id": f"definition/{name}",
                "input": {"definition": data},
                "expected": expected,
                "normative": ["valid", "code", "node", "field"],
            }
        )
    return cases


# --- files --------------------------------------------------------------------------------

_DESCRIPTIONS = {
    "machines": "Every (machine, state, event) pair of specs/machines/*.toml: its target, or illegal.",
    "protocol": "Pure lease and fencing decisions of specs/protocol.md: rows before, request and now; "
    "then the refusal code and field, the unchanged code, or the writes and the guard.",
    "recovery": "Governed recovery decisions of specs/protocol.md (recover rows) on a store holding no evidence.",
    "expressions": "specs/expressions.md: source and bindings, then true, false, unknown, or the parse error code.",
    "definitions": "specs/definitions.md: a definition in its JSON form, then valid, or the error code, node and field.",
    "operations": "Durable-operation decisions of specs/operations.md: the Operation, the request and now; then "
    "the refusal code and field, the unchanged code and Operation, or the writes and the guard.",
    "journal": "The journal fixture pack of specs/journal.md (section 9): workflow, policy and chain; then valid "
    "with the head, event count, node states and attempt history, or the refusal code and ordinal.",
    "store": "Whole-store scripts (specs/conformance.md, Store layer): sessions, requests, outcomes and "
    "final rows, including concurrent interleavings.",
}


def layer_cases(layer: str) -> list[Case]:
    if layer == "machines":
        return machine_cases()
    if layer == "protocol":
        return protocol_cases()
    if layer == "recovery":
        return recovery_cases()
    if layer == "expressions":
        return expression_cases()
    if layer == "definitions":
        return definition_cases()
    if layer == "operations":
        from .operations_cases import operation_cases  # noqa: PLC0415 - it builds on this module's wire form

        return operation_cases()
    if layer == "journal":
        from .journal_cases import journal_cases  # noqa: PLC0415 - loaded only when generating this layer

        return journal_cases()
    if layer == "store":
        from .store_cases import store_cases  # noqa: PLC0415 - store_cases builds on this module

        return store_cases()
    raise ValueError(layer)


def render_layer(layer: str) -> str:
    cases = layer_cases(layer)
    ids = [c["id"] for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise AssertionError(f"{layer}: duplicate case ids {duplicates[:5]}")
    document = {
        "$schema": "cases.schema.json",
        "suite": "fencekeeper-conformance",
        "version": SUITE_VERSION,
        "layer": layer,
        "description": _DESCRIPTIONS[layer],
        "cases": cases,
    }
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def generate(directory: Path) -> list[Path]:
    """Write one file per layer into ``directory``; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for layer in LAYERS:
        path = directory / f"{layer}.json"
        path.write_text(render_layer(layer), encoding="utf-8")
        written.append(path)
    return written
