"""The store layer's scripts, with expectations computed by the reference in-memory store.

Rules of this module:

- A script is a list of steps, each one call of the store port with its
  ``now`` (specs/conformance.md, Store layer).  Expectations come from
  running the script on :class:`~fencekeeper.adapters.memory.MemoryStore`,
  whose decisions are the kernel's.
- A concurrent case races two sessions: ``a`` is held at its commit point,
  ``b`` runs, then ``a`` is released.  A correct store behaves as if the two
  calls ran one after the other, in some order: the expectation lists the
  results of both serial orders, and the runner accepts exactly those.
- The races whose first call chooses its rows by a search (a claim's
  candidate, an Event's waiters, a due timer) run a second time with ``a``
  held at its first clock read instead (``race/at_clock/...``, protocol
  1.1): a store that searched before its transaction began searched rows
  that ``b`` then changes.  The serial orders are the same.
- Times carry microseconds; two timers a microsecond apart must keep their
  order.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from fencekeeper.adapters.memory import MemoryStore

from . import wire
from .basis import LEASE, T0, US, Case
from .store_driver import StoreHarness

Step = dict[str, Any]

OPS = {"granted": True, "principal_id": "user:ops"}
TIMER = {"granted": True, "principal_id": "system:timer"}
LEASE_US = wire.duration_us(LEASE)


def _t(offset_us: int) -> str:
    text = wire.time_text(T0 + timedelta(microseconds=offset_us))
    assert text is not None
    return text


def admit(execution_id: str, at: int, business_id: str = "b-1") -> Step:
    return {"call": "admit", "now": _t(at), "args": {
        "execution_id": execution_id, "business_id": business_id, "definition_id": "purchase",
        "definition_revision": 1, "start_node_id": "check", "authority": OPS}}


def claim(worker: str, token: str, at: int, business_id: str | None = None, session: str = "a") -> Step:
    args: dict[str, Any] = {"worker_id": worker, "lease_token": token, "lease_duration": LEASE_US}
    if business_id is not None:
        args["business_id"] = business_id
    return {"session": session, "call": "claim_next", "now": _t(at), "args": args}


def cred(worker: str, token: str, fence: int = 1) -> dict[str, Any]:
    return {"worker_id": worker, "lease_token": token, "fence": fence}


def renew(execution_id: str, credential: dict[str, Any], at: int) -> Step:
    return {"call": "renew", "now": _t(at), "args": {
        "execution_id": execution_id, "credential": credential, "lease_duration": LEASE_US}}


def step(execution_id: str, credential: dict[str, Any], revision: int, at: int, session: str = "a") -> Step:
    return {"session": session, "call": "record_step", "now": _t(at), "args": {
        "execution_id": execution_id, "credential": credential, "expected_revision": revision,
        "step": {"node_id": "check", "attempt_id": f"a-r{revision}", "next_node_id": "ask"}, "authority": OPS}}


def release(execution_id: str, credential: dict[str, Any], revision: int, at: int, session: str = "a") -> Step:
    return {"session": session, "call": "release", "now": _t(at), "args": {
        "execution_id": execution_id, "credential": credential, "expected_revision": revision}}


def finalize(execution_id: str, credential: dict[str, Any], revision: int, target: str, at: int, *,
             wait: dict[str, Any] | None = None, business_id: str = "b-1", session: str = "a") -> Step:
    args = {
        "execution_id": execution_id, "dispatch_id": execution_id, "worker_id": credential["worker_id"],
        "lease_token": credential["lease_token"], "fence": credential["fence"], "target_state": target,
        "business_id": business_id, "expected_revision": revision, "authority": OPS,
        "step": {"node_id": "check", "attempt_id": f"a-f{revision}", "next_node_id": None}, "wait": wait,
    }
    return {"session": session, "call": "finalize", "now": _t(at), "args": args}


def event_wait(node: str, attempt: str, order: str) -> dict[str, Any]:
    return {"node_id": node, "attempt_id": attempt, "event_type": "payment.received",
            "correlation": [["order_id", order]], "wake_at": None, "timeout": False, "wake_after": None,
            "continuations": [["event", "done"]]}


def timer_wait(node: str, attempt: str, wake_at_us: int) -> dict[str, Any]:
    return {"node_id": node, "attempt_id": attempt, "event_type": None, "correlation": [],
            "wake_at": _t(wake_at_us), "timeout": False, "wake_after": None, "continuations": []}


def cancel(execution_id: str, revision: int, at: int, business_id: str = "b-1", session: str = "a") -> Step:
    return {"session": session, "call": "cancel", "now": _t(at), "args": {
        "execution_id": execution_id, "business_id": business_id, "expected_revision": revision, "authority": OPS}}


def wake_event(execution_id: str, source: str, at: int, *, node: str = "await", attempt: str = "a-2",
               order: str = "o-1", session: str = "a") -> Step:
    return {"session": session, "call": "wake", "now": _t(at), "args": {
        "key": {"execution_id": execution_id, "node_id": node, "attempt_id": attempt}, "reason": "event",
        "source_id": source, "business_id": "b-1", "authority": OPS, "event_type": "payment.received",
        "correlation": [["order_id", order]]}}


def publish(event_id: str, order: str, at: int, business_id: str = "b-1", payload: Any = None) -> Step:
    step: Step = {"call": "publish_event", "now": _t(at), "args": {
        "event_id": event_id, "business_id": business_id, "event_type": "payment.received",
        "correlation": {"order_id": order}, "authority": OPS}}
    if payload is not None:
        # Left out when absent, so that the cases before payloads were given did not change (cases 2.11.0).
        step["args"]["payload"] = payload
    return step


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _levels(levels: int) -> dict[str, Any]:
    """A payload nesting exactly ``levels`` levels, itself the first."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def quarantine(execution_id: str, revision: int, at: int, actor: str = "user:ops", session: str = "a") -> Step:
    return {"session": session, "call": "recover", "now": _t(at), "args": {
        "command_id": f"q-{execution_id}-r{revision}", "kind": "quarantine_expired", "execution_id": execution_id,
        "business_id": "b-1", "expected_revision": revision, "actor_id": actor, "authority": OPS}}


def recover(execution_id: str, command: str, kind: str, revision: int, at: int, *, call: str = "recover") -> Step:
    return {"call": call, "now": _t(at), "args": {
        "command_id": command, "kind": kind, "execution_id": execution_id, "business_id": "b-1",
        "expected_revision": revision, "actor_id": "user:ops", "authority": OPS}}


def expired(at: int) -> Step:
    return {"call": "expired", "now": _t(at), "args": {}}


def ids(state: str | None, at: int = 10**9) -> Step:
    return {"call": "execution_ids", "now": _t(at), "args": {"state": state}}


def history(execution_id: str, at: int = 10**9) -> Step:
    return {"call": "history", "now": _t(at), "args": {"execution_id": execution_id}}


def current_evidence(execution_id: str, at: int = 10**9) -> Step:
    return {"call": "evidence", "now": _t(at), "args": {"execution_id": execution_id}}


def due(at: int, limit: int = 100, business_id: str | None = None) -> Step:
    args: dict[str, Any] = {"limit": limit}
    if business_id is not None:
        args["business_id"] = business_id
    return {"call": "due_wakes", "now": _t(at), "args": args}


def fire(execution_id: str, node: str, attempt: str, at: int) -> Step:
    return {"call": "fire_timer", "now": _t(at), "args": {
        "key": {"execution_id": execution_id, "node_id": node, "attempt_id": attempt}, "authority": TIMER}}


def evidence(execution_id: str, credential: dict[str, Any], at: int, *items: tuple[str, str, int, str | None]) -> Step:
    return {"call": "append_evidence", "now": _t(at), "args": {
        "execution_id": execution_id, "credential": credential,
        "evidence": [{"object_id": o, "kind": k, "revision": r, "state": s, "body": {"n": r}} for o, k, r, s in items]}}


def read(execution_id: str, at: int = 10**9) -> Step:
    return {"call": "read", "now": _t(at), "args": {"execution_id": execution_id}}


W1 = cred("w-1", "tok-1")
W2 = cred("w-2", "tok-2")
END = wire.duration_us(LEASE) or 0
ONE = wire.duration_us(US) or 1


def _scripts() -> dict[str, list[Step]]:
    waiting = [admit("e-1", 0), claim("w-1", "tok-1", 1),
               finalize("e-1", W1, 2, "waiting", 2, wait=event_wait("await", "a-2", "o-1"))]
    return {
        "lifecycle_to_success": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), renew("e-1", W1, 2), step("e-1", W1, 2, 3),
            finalize("e-1", W1, 3, "succeeded", 4), read("e-1"),
        ],
        "admit_twice": [admit("e-1", 0), admit("e-1", 1), read("e-1")],
        "claim_takes_earliest_eligible_first": [
            admit("e-2", 0), admit("e-1", 1), claim("w-1", "tok-1", 2), read("e-1"), read("e-2"),
        ],
        "claim_nothing_due": [claim("w-1", "tok-1", 0)],
        # Seed 000, Dispatcher Pass: 'ordered by eligible_at ASC, workflow_execution_id ASC'.
        "claim_ties_on_eligible_at_by_execution_id": [
            admit("e-2", 0), admit("e-1", 0), claim("w-1", "tok-1", 1), claim("w-2", "tok-2", 2),
        ],
        "claim_scoped_to_business": [
            admit("e-1", 0, "b-1"), claim("w-1", "tok-1", 1, business_id="b-2"),
            claim("w-1", "tok-1", 2, business_id="b-1"), read("e-1"),
        ],
        "renew_at_the_microsecond_boundary": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), renew("e-1", W1, 1 + END - ONE),
            renew("e-1", W1, 1 + END - ONE + END), read("e-1"),
        ],
        "stale_holder_fenced_out": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), release("e-1", W1, 2, 2), claim("w-2", "tok-2", 3),
            step("e-1", W1, 4, 4), renew("e-1", {**W2, "fence": 1}, 5), step("e-1", cred("w-2", "tok-2", 2), 4, 6),
            read("e-1"),
        ],
        "expired_lease_quarantined": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), quarantine("e-1", 2, END),
            quarantine("e-1", 2, END + 1, actor="w-1"), quarantine("e-1", 2, END + 1), finalize("e-1", W1, 2, "succeeded", END + 2),
            quarantine("e-1", 2, END + 3), read("e-1"),
        ],
        "cancel_eligible_and_refuse_running": [
            admit("e-1", 0), admit("e-2", 1), cancel("e-1", 1, 2), claim("w-1", "tok-1", 3), cancel("e-2", 2, 4),
            cancel("e-1", 2, 5), read("e-1"), read("e-2"),
        ],
        "wait_then_event_wakes": [
            *waiting, publish("ev-0", "o-9", 3), publish("ev-1", "o-1", 4), publish("ev-1", "o-1", 5),
            wake_event("e-1", "ev-2", 6), read("e-1"),
        ],
        # interpreter.md, Events: 32 levels and 65,536 characters of compact JSON; past either, invalid_event
        # and nothing written, so the same identity then publishes afresh and wakes the waiter.
        "a_payload_past_its_bounds_is_refused_and_writes_nothing": [
            *waiting, publish("ev-1", "o-1", 3, payload=_levels(33)),
            publish("ev-1", "o-1", 4, payload={"blob": "x" * (65_536 - len('{"blob":""}') + 1)}),
            publish("ev-1", "o-1", 5, payload={**_levels(32), "blob": "x" * (65_536 - len(_compact(_levels(32))) - 10)}),
            read("e-1"),
        ],
        "event_of_another_business_wakes_nothing": [
            *waiting, publish("ev-1", "o-1", 3, business_id="b-2"), read("e-1"),
        ],
        "cancel_waiting_closes_registration": [
            *waiting, cancel("e-1", 3, 3), publish("ev-1", "o-1", 4), read("e-1"),
        ],
        "evidence_revisions_past_the_first": [
            admit("e-1", 0), claim("w-1", "tok-1", 1),
            evidence("e-1", W1, 2, ("cmd-1", "command", 1, "issued"), ("att-1", "attempt", 1, "started")),
            evidence("e-1", W1, 3, ("cmd-1", "command", 2, "unknown")),
            evidence("e-1", W1, 4, ("cmd-1", "command", 3, "succeeded"), ("att-1", "attempt", 2, "applied")),
            evidence("e-1", W1, 5, ("cmd-1", "command", 3, "failed")),
            evidence("e-1", W1, 6, ("cmd-1", "command", 5, "failed")),
            evidence("e-1", W1, 7, ("cmd-1", "attempt", 4, "failed")),
            evidence("e-1", W1, 1 + END, ("cmd-1", "command", 4, "failed")),
            read("e-1"),
        ],
        "evidence_revision_of_an_object_nobody_made": [
            admit("e-1", 0), claim("w-1", "tok-1", 1),
            evidence("e-1", W1, 2, ("att-1", "attempt", 1, "started")),
            evidence("e-1", W1, 3, ("cmd-9", "command", 2, "issued")),
            evidence("e-1", W1, 4, ("cmd-8", "command", 1, "issued"), ("cmd-9", "command", 3, "unknown")),
            current_evidence("e-1"),
        ],
        "ids_are_one_space_for_executions_and_evidence": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), evidence("e-1", W1, 2, ("e-2", "command", 1, "issued")),
            admit("e-2", 3), evidence("e-1", W1, 4, ("e-1", "command", 1, "issued")), read("e-1"), read("e-2"),
        ],
        "competing_events_across_businesses": [
            admit("e-1", 0, "b-1"), admit("e-2", 1, "b-2"), claim("w-1", "tok-1", 2), claim("w-2", "tok-2", 3),
            finalize("e-1", W1, 2, "waiting", 4, wait=event_wait("await", "a-1", "o-1")),
            finalize("e-2", W2, 2, "waiting", 5, wait=event_wait("await", "a-2", "o-1"), business_id="b-2"),
            publish("ev-1", "o-2", 6, business_id="b-1"), publish("ev-2", "o-1", 7, business_id="b-2"),
            publish("ev-2", "o-9", 8, business_id="b-2"), publish("ev-3", "o-1", 9, business_id="b-1"),
            publish("ev-4", "o-1", 10, business_id="b-1"), read("e-1"), read("e-2"),
        ],
        "timers_in_order_across_businesses": [
            admit("e-1", 0, "b-1"), admit("e-2", 1, "b-2"), admit("e-3", 2, "b-1"),
            claim("w-1", "tok-1", 3), claim("w-2", "tok-2", 4), claim("w-3", "tok-3", 5),
            finalize("e-1", W1, 2, "waiting", 6, wait=timer_wait("sleep", "a-1", 1000 + 2)),
            finalize("e-2", W2, 2, "waiting", 7, wait=timer_wait("sleep", "a-2", 1000 + 1), business_id="b-2"),
            finalize("e-3", cred("w-3", "tok-3"), 2, "waiting", 8, wait=timer_wait("sleep", "a-3", 1000 + 3)),
            due(1000), due(1001), due(1003), due(1003, limit=1), due(1003, limit=2), due(1003, business_id="b-1"),
            due(1003, business_id="b-2"), fire("e-1", "sleep", "a-1", 1001), fire("e-1", "sleep", "a-1", 1002),
            due(1003), read("e-1"),
        ],
        # Equal wake times come out by execution id, whatever order they were admitted or registered in.
        "timers_due_at_the_same_time_in_execution_id_order": [
            admit("e-2", 0), admit("e-1", 1), claim("w-1", "tok-1", 2), claim("w-2", "tok-2", 3),
            finalize("e-2", W1, 2, "waiting", 4, wait=timer_wait("sleep", "a-2", 1000)),
            finalize("e-1", W2, 2, "waiting", 5, wait=timer_wait("sleep", "a-1", 1000)),
            due(1000), due(1000, limit=1),
        ],
        # fencekeeper.* Event Types are the kernel's own waits (an approval's), which only a decision wakes.
        "publish_of_a_reserved_event_type_is_refused": [
            *waiting,
            {**publish("ev-1", "o-1", 3), "args": {**publish("ev-1", "o-1", 3)["args"], "event_type": "fencekeeper.approval"}},
            {**publish("ev-2", "o-1", 4), "args": {**publish("ev-2", "o-1", 4)["args"], "event_type": "fencekeeper.other"}},
            read("e-1"),
        ],
        "registering_waiter_takes_the_first_event_of_its_business": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), publish("ev-9", "o-1", 2, business_id="b-2"),
            publish("ev-1", "o-1", 3), publish("ev-2", "o-1", 4),
            finalize("e-1", W1, 2, "waiting", 5, wait=event_wait("await", "a-2", "o-1")), read("e-1"),
        ],
        "current_evidence_in_creation_order": [
            admit("e-1", 0), claim("w-1", "tok-1", 1),
            evidence("e-1", W1, 2, ("z-1", "command", 1, "issued")),
            evidence("e-1", W1, 3, ("a-1", "attempt", 1, "started")),
            evidence("e-1", W1, 4, ("z-1", "command", 2, "succeeded")), current_evidence("e-1"),
        ],
        "quarantine_replays_its_command": [
            admit("e-1", 0), claim("w-1", "tok-1", 1),
            recover("e-1", "sweep-1", "quarantine_expired", 2, 1 + END, call="quarantine"),
            recover("e-1", "sweep-1", "quarantine_expired", 2, 2 + END, call="quarantine"), read("e-1"),
        ],
        "older_recovery_command_replays": [
            admit("e-1", 0), claim("w-1", "tok-1", 1),
            recover("e-1", "rc-1", "quarantine_expired", 2, 1 + END),
            recover("e-1", "rc-2", "fail", 3, 2 + END),
            recover("e-1", "rc-1", "quarantine_expired", 2, 3 + END),
            recover("e-1", "rc-2", "fail", 3, 4 + END), read("e-1"),
        ],
        "expired_to_the_microsecond_and_after_renew": [
            admit("e-1", 0), claim("w-1", "tok-1", 1), expired(END), expired(1 + END - ONE),
            renew("e-1", W1, 2), expired(1 + END), expired(2 + END - ONE), expired(2 + END),
        ],
        "claimable_only_from_eligible_at_to_the_microsecond": [
            # The clock reads earlier than the admission (another host's clock, a step back): work
            # becomes claimable at its eligible_at exactly, not at the start of that second.
            admit("e-1", 500_000), claim("w-1", "tok-1", 0), claim("w-1", "tok-1", 500_000 - ONE),
            claim("w-1", "tok-1", 500_000), read("e-1"),
        ],
        "history_in_commit_order_when_the_clock_moves_back": [
            admit("e-1", 0), claim("w-1", "tok-1", 5_000), step("e-1", W1, 2, 1_000),
            finalize("e-1", W1, 3, "succeeded", 2_000), history("e-1"),
        ],
        "state_lists_follow_every_decision": [
            admit("e-1", 0), admit("e-2", 1), claim("w-1", "tok-1", 2), ids("running"),
            finalize("e-1", W1, 2, "waiting", 3, wait=timer_wait("sleep", "a-1", 1000)), ids("waiting"),
            fire("e-1", "sleep", "a-1", 1000), ids("waiting"), ids("eligible"), ids(None),
        ],
    }


def _races() -> dict[str, tuple[list[Step], Step, Step, list[Step]]]:
    """(setup, a, b, then): ``a`` is held at commit while ``b`` runs."""
    waiting = [admit("e-1", 0), claim("w-1", "tok-1", 1),
               finalize("e-1", W1, 2, "waiting", 2, wait=event_wait("await", "a-2", "o-1"))]
    running = [admit("e-1", 0), claim("w-1", "tok-1", 1)]
    timer_waiting = [admit("e-1", 0), claim("w-1", "tok-1", 1),
                     finalize("e-1", W1, 2, "waiting", 2, wait=timer_wait("sleep", "a-1", 1000))]
    return {
        "claim_races_claim_for_two": ([admit("e-1", 0), admit("e-2", 1)], claim("w-1", "tok-1", 5),
                                      claim("w-2", "tok-2", 5, session="b"), [read("e-1"), read("e-2")]),
        "claim_races_claim": ([admit("e-1", 0)], claim("w-1", "tok-1", 5), claim("w-2", "tok-2", 5, session="b"),
                              [read("e-1")]),
        "claim_races_cancel": ([admit("e-1", 0)], claim("w-1", "tok-1", 5), cancel("e-1", 1, 5, session="b"),
                               [read("e-1")]),
        "cancel_races_claim": ([admit("e-1", 0)], cancel("e-1", 1, 5), claim("w-1", "tok-1", 5, session="b"),
                               [read("e-1")]),
        "wake_races_cancel": (waiting, wake_event("e-1", "ev-1", 5),
                              cancel("e-1", 3, 5, session="b"), [read("e-1")]),
        "wake_races_wake": (waiting, wake_event("e-1", "ev-1", 5),
                            wake_event("e-1", "ev-2", 5, session="b"), [read("e-1")]),
        "step_races_step": (running, step("e-1", W1, 2, 5), step("e-1", W1, 2, 5, session="b"), [read("e-1")]),
        "finalize_races_release": (running, finalize("e-1", W1, 2, "succeeded", 5),
                                   release("e-1", W1, 2, 5, session="b"), [read("e-1")]),
        "release_races_finalize": (running, release("e-1", W1, 2, 5),
                                   finalize("e-1", W1, 2, "failed", 5, session="b"), [read("e-1")]),
        "finalize_races_quarantine": (running, finalize("e-1", W1, 2, "succeeded", END),
                                      {**quarantine("e-1", 2, END + 1), "session": "b"}, [read("e-1")]),
        "event_races_cancel": (waiting, publish("ev-1", "o-1", 5), cancel("e-1", 3, 5, session="b"), [read("e-1")]),
        "timer_races_cancel": (timer_waiting, fire("e-1", "sleep", "a-1", 1000),
                               cancel("e-1", 3, 1000, session="b"), [read("e-1")]),
    }


AT_CLOCK = ("claim_races_claim_for_two", "claim_races_claim", "claim_races_cancel", "event_races_cancel",
            "timer_races_cancel")
"""The races run again with ``a`` held at its first clock read (``race/at_clock/NAME``)."""


def _run(harness: StoreHarness, steps: list[Step]) -> list[Any]:
    return [harness.handle({"step": s}) for s in steps]


def store_cases() -> list[Case]:
    harness = StoreHarness(MemoryStore)
    cases: list[Case] = []
    try:
        for name, steps in _scripts().items():
            harness.reset()
            results = _run(harness, steps)
            cases.append({
                "id": f"script/{name}",
                "input": {"steps": steps},
                "expected": {"results": results},
                "normative": ["results"],
            })
        at_clock: list[Case] = []
        races = _races()
        assert set(AT_CLOCK) <= set(races)
        for name, (setup, first, second, then) in races.items():
            orders = []
            for order in ((first, second), (second, first)):
                harness.reset()
                setup_results = _run(harness, setup)
                a, b = (harness.handle({"step": s}) for s in order)
                if order[0] is second:
                    a, b = b, a
                orders.append({"setup": setup_results, "a": a, "b": b, "then": _run(harness, then)})
            cases.append({
                "id": f"race/{name}",
                "input": {"setup": setup, "a": first, "b": second, "then": then},
                "expected": {"serial_orders": orders},
                "normative": ["serial_orders"],
            })
            if name in AT_CLOCK:
                at_clock.append({
                    "id": f"race/at_clock/{name}",
                    "input": {"setup": setup, "a": first, "b": second, "then": then, "hold": "clock"},
                    "expected": {"serial_orders": orders},
                    "normative": ["serial_orders"],
                })
        cases.extend(at_clock)
    finally:
        harness.close()
    return cases
