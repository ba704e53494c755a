"""Random valid definitions under random event orders never break the protocol's invariants.

Hypothesis draws a definition (tests/definitions/strategies.py), inputs for
it, what each Command returns, and a sequence of world actions: dispatcher
passes, Events (matching a waiter or not, duplicated or not), approval
decisions (by any reviewer, either way, repeated), clock moves that fire
timeouts, cancellations, quarantines and reconciliations.  After every
action the store must satisfy the invariants below, which are the
interpreter's share of specs/protocol.md.
"""

from __future__ import annotations

import hashlib
import itertools
import tempfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencekeeper.adapters import service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.ports import ScriptedHandler
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock, TransactionalStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import Definition
from fencekeeper.kernel.machines import ATTEMPT, AttemptEvent, AttemptState, ExecutionState, dispatch_state_of

from ..definitions.strategies import valid_definitions

BUSINESS = "acme"
TERMINAL = {ExecutionState.SUCCEEDED, ExecutionState.FAILED, ExecutionState.CANCELLED}


class AllowAll:
    """Every principal may do everything: the kernel's own rules (scope, binding, leases) still apply."""

    def check(
        self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()
    ) -> p.Authority:
        return p.Authority(True, principal_id)


RESULTS = st.sampled_from(["succeeded", "rejected", "unknown", "raises"])


def _handler(outcomes: list[str]) -> ScriptedHandler:
    calls = {"n": 0}

    def script(command: i.Command) -> i.CommandResult:
        outcome = outcomes[calls["n"] % len(outcomes)]
        calls["n"] += 1
        if outcome == "succeeded":
            return i.CommandResult(i.CommandStatus.SUCCEEDED, None, "ok", {"status": "ok", "amount": 3})
        if outcome == "rejected":
            return i.CommandResult(i.CommandStatus.REJECTED, i.Rejection.REJECTED, "no")
        if outcome == "unknown":
            return i.CommandResult(i.CommandStatus.UNKNOWN, None, "lost")
        raise RuntimeError("handler failed")

    handler = ScriptedHandler({})
    handler.execute = lambda command: (handler.executed.append(command), script(command))[1]  # type: ignore[method-assign]
    handler.reconcile = lambda command: (  # type: ignore[method-assign]
        handler.reconciled.append(command),
        i.CommandResult(i.CommandStatus.SUCCEEDED, None, "found applied", {"status": "ok"}),
    )[1]
    return handler


PASS = st.just(("pass",))
EVENT = st.tuples(st.just("event"), st.booleans(), st.integers(0, 3))
DECIDE = st.tuples(st.just("decide"), st.sampled_from(["approved", "rejected"]), st.integers(0, 3), st.integers(0, 2))
# Passes, events and decisions are drawn more often than the actions that end everything.
ACTIONS = st.lists(
    st.one_of(
        PASS, PASS, PASS, EVENT, EVENT, DECIDE, DECIDE,
        st.tuples(st.just("advance"), st.integers(1, 200_000)),
        st.just(("cancel",)),
        st.just(("quarantine",)),
        st.just(("reconcile",)),
    ),
    min_size=1,
    max_size=16,
)


def _input_values(definition: Definition, draw: st.DrawFn) -> dict[str, Any]:
    return {
        # Mostly small positive integers, so that targets (which need revisions >= 1) and
        # correlations resolve and the waits are actually reached; sometimes not.
        name: draw(st.one_of(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.sampled_from(["a", True])))
        for name in definition.inputs
    }


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Definition, dict[str, Any], list[str], list[tuple[Any, ...]]]:
    # Declared types are dropped: these scenarios are about the interpreter, and their input
    # values are drawn to reach waits and targets (tests/interpreter/test_typed_inputs.py
    # covers admission against types).
    definition = attrs.evolve(draw(valid_definitions(max_nodes=8)), revision=1, input_types=None)
    return definition, _input_values(definition, draw), draw(st.lists(RESULTS, min_size=1, max_size=4)), draw(ACTIONS)


class Checker:
    """The invariants, checked after every action."""

    def __init__(self, store: TransactionalStore, handler: ScriptedHandler) -> None:
        self.store = store
        self.handler = handler
        self.finished: dict[str, int] = {}

    def check(self) -> None:
        command_ids = [c.command_id for c in self.handler.executed]
        assert len(command_ids) == len(set(command_ids)), "a Command was issued twice"
        for execution_id in self.store.execution_ids():
            view = self.store.read(execution_id)
            assert view is not None
            execution, dispatch = view.execution, view.dispatch
            assert dispatch.dispatch_state == dispatch_state_of(execution.state)
            assert (dispatch.lease_token is not None) == (execution.state == ExecutionState.RUNNING)
            assert 0 <= execution.step_count <= p.STEP_LIMIT
            assert [r.revision for r in view.revisions] == list(range(1, execution.revision + 1))
            # A terminal execution never changes again.
            if execution_id in self.finished:
                assert execution.revision == self.finished[execution_id], f"{execution_id} changed after finishing"
            if execution.state in TERMINAL:
                self.finished[execution_id] = execution.revision
            # Every visit that counted a step left exactly one attempt, and every attempt
            # moved only along the attempt table.
            attempts = [e for e in view.evidence if e.kind == "StepAttempt"]
            assert len({a.object_id for a in attempts}) == len(attempts)
            stepped = [a for a in attempts if "step" in a.body]
            assert len(stepped) >= execution.step_count
            for attempt in attempts:
                history = [r for r in view.evidence_revisions if r.object_id == attempt.object_id]
                assert [r.revision for r in history] == list(range(1, len(history) + 1))
                assert history[0].state == AttemptState.PENDING.value
                for before, after in itertools.pairwise(history):
                    allowed = {
                        ATTEMPT.step(AttemptState(before.state), event).value
                        for event in AttemptEvent
                        if ATTEMPT.allows(AttemptState(before.state), event)
                    }
                    assert after.state in allowed, (attempt.object_id, before.state, after.state)
            # At most one unwoken registration, and only while waiting on it.
            open_keys = [r.key for r in view.registrations if r.woken_by is None]
            if execution.state == ExecutionState.WAITING:
                assert open_keys == [execution.wait]
            else:
                assert execution.wait is None
            for registration in view.registrations:
                assert (registration.woken_by is None) == (registration.wake_reason is None)


Scenario = tuple[Definition, dict[str, Any], list[str], list[tuple[Any, ...]]]
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=150, deadline=None, suppress_health_check=HEALTH)
@given(scenarios(), st.data())
def test_random_definitions_and_event_orders_keep_the_invariants(scenario: Scenario, data: st.DataObject) -> None:
    clock = ManualClock()
    _run_scenario(scenario, data, MemoryStore(clock), clock)


@settings(max_examples=25, deadline=None, suppress_health_check=HEALTH)
@given(scenarios(), st.data())
def test_the_same_holds_on_a_sqlite_file(scenario: Scenario, data: st.DataObject) -> None:
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteStore(Path(directory) / "p.db", clock)
        try:
            _run_scenario(scenario, data, store, clock)
        finally:
            store.close()


def _run_scenario(scenario: Scenario, data: st.DataObject, store: TransactionalStore, clock: ManualClock) -> None:
    definition, values, outcomes, actions = scenario
    policy = AllowAll()
    handler = _handler(outcomes)
    checker = Checker(store, handler)
    store.register_definition(definition, BUSINESS, p.Authority(True, "user:a"))
    for n in range(2):
        admitted = service.run(
            store, policy, business_id=BUSINESS, principal_id="user:a", definition_id=definition.definition_id,
            input=values, execution_id=f"x-{n}",
        )
        assert isinstance(admitted, p.Decision)
    worker = Worker(store, "w-1", policy, handler)
    checker.check()
    for action in actions:
        _apply(action, store, worker, clock)
        checker.check()
        # Whenever something waits for an Event, the world may send it now (or not):
        # this is what makes matching, duplicate and late Events meet real waiters.
        if _open_event_waits(store) and data.draw(st.booleans(), label="send a matching event now"):
            _apply(("event", True, data.draw(st.integers(0, 3), label="salt")), store, worker, clock)
            checker.check()


def _open_event_waits(store: TransactionalStore) -> list[p.WaitRegistration]:
    """Registrations an Event could wake now: unwoken, of an execution still waiting on them.

    (A cancelled waiter's registration stays unwoken in history; it can never be woken.)
    """
    found = []
    for execution_id in store.execution_ids(ExecutionState.WAITING):
        view = store.read(execution_id)
        assert view is not None
        found += [
            r
            for r in view.registrations
            if r.key == view.execution.wait and r.spec.event_type and r.spec.event_type != i.APPROVAL_EVENT_TYPE
        ]
    return found


def _apply(action: tuple[Any, ...], store: TransactionalStore, worker: Worker, clock: ManualClock) -> None:
    policy, handler = AllowAll(), worker.handler
    kind = action[0]
    if kind == "pass":
        worker.run_pass()  # a handler that raises is an unknown result inside; nothing escapes
        return
    if kind == "advance":
        clock.advance(timedelta(seconds=action[1]))
        return
    ids = store.execution_ids()
    if kind == "event":
        matching, salt = action[1], action[2]
        registrations = _open_event_waits(store)
        if matching and registrations:
            spec = registrations[salt % len(registrations)].spec
            assert spec.event_type is not None
            # The id depends on the content, so a repeat is a true duplicate (idempotent).
            digest = hashlib.sha256(repr((spec.event_type, spec.correlation)).encode()).hexdigest()[:12]
            event_id = f"ev-{digest}-{salt}"
            result = service.publish(
                store, policy, business_id=BUSINESS, principal_id="user:a", event_type=spec.event_type,
                correlation=dict(spec.correlation), payload={"status": "ok", "amount": salt}, event_id=event_id,
            )
            assert result.duplicate or result.woken, "a matching Event woke nobody"
        else:
            try:
                service.publish(store, policy, business_id=BUSINESS, principal_id="user:a", event_type="other.type",
                                correlation={"k": str(salt)}, event_id=f"ev-other-{salt}")
            except Exception as exc:  # same id, other content: refused, never applied
                assert getattr(exc, "code", None) == "event_conflict"
        return
    if kind == "decide":
        determination, reviewer_index, decision_index = action[1], action[2], action[3]
        for execution_id in ids:
            request = service.approval_request(store, execution_id)
            if request is None:
                continue
            reviewers = [*request.reviewers, request.requester_id, "user:outsider"]
            service.decide(store, policy, business_id=BUSINESS, reviewer_id=reviewers[reviewer_index % len(reviewers)],
                           request=request, determination=determination, decision_id=f"d-{decision_index}")
        return
    for execution_id in ids:
        if kind == "cancel":
            service.cancel(store, policy, business_id=BUSINESS, principal_id="user:ops", execution_id=execution_id)
        elif kind == "quarantine":
            service.quarantine_expired(store, policy, business_id=BUSINESS, principal_id="user:ops")
        elif kind == "reconcile":
            view = store.read(execution_id)
            if view is not None and view.execution.state == ExecutionState.RECONCILIATION_REQUIRED:
                review = service.recovery_view(store, business_id=BUSINESS, execution_id=execution_id)
                if review.unresolved:
                    service.reconcile(store, policy, handler, business_id=BUSINESS, principal_id="user:ops",
                                      execution_id=execution_id)
                elif review.permitted:
                    service.resume(store, policy, business_id=BUSINESS, principal_id="user:ops",
                                   execution_id=execution_id, at_node=review.permitted[-1],
                                   rationale="chosen by the property test")
