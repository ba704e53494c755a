"""A Hypothesis state machine that compares a store with a pure kernel model after every request.

What it proves: for random sequences of requests -- admissions, claims
(scoped by business or not), renewals, steps, releases, finalizations to
every target (waiting with event, timer and timeout registrations) and to a
sixth one, wakes that match, mismatch, come too early, repeat or race,
cancellations, recovery commands of every kind under fresh, reused and
repeated identities, clock moves past lease expiry (and now and then a
little back), and zombie workers that
keep every credential they were ever given -- the store under test returns
exactly the outcome the kernel returns for the model's rows (same type,
same code, the same execution and dispatch values: the whole value except
its English text, see :func:`normative`), raises
``StoreError('evidence_conflict')`` exactly when an evidence id is reused,
and afterwards ``read()`` of every execution, ``execution_ids()`` (for
every state) and ``expired()`` agree with the model.  Invariants check, on
every execution the store shows, that execution and dispatch states agree,
that the lease fields are set if and only if the row is claimed, and that
the revisions are 1..n with the last one current.

Two liveness properties are checked too (issue: timers that starve, sweeps
that never end):

- *every due timer fires*: a registration is open exactly while its
  execution waits on it; ``due_wakes`` returns exactly the model's due
  registrations that a timer can act on, and a timer pass (``due_wakes``
  with a small limit, then ``fire_timer`` on each, repeated) fires every one
  of them, each firing applied, within as many passes as there are
  registrations; no registration nothing waits on can starve it;
- *a sweep terminates*: a quarantine sweep of a business decides each
  expired execution at most once, with the decision the kernel gives the
  model, ends, and leaves nothing of that business expired; a second sweep
  finds nothing to do.

The model is not a store: it is a few dicts of kernel snapshots, updated by
applying each :class:`~fencekeeper.kernel.protocol.Decision` only when
``Guard.holds`` on its rows (the guard's reference semantics; in a serial
run it always holds, and the model asserts that it does).  It never goes
through the Store port or the shared decide-then-apply loop, so a defect
there shows up as a disagreement.

Run it against a store with :func:`run_store_state_machine`, the way zarr's
``run_state_machine_as_test(lambda: Machine(store))`` is used.  How many
runs and requests it makes is its budget
(:mod:`fencekeeper.adapters.testing.budget`: ``FENCEKEEPER_SUITE_BUDGET``
or ``pytest --fencekeeper-budget``).

Only what specs/protocol.md makes normative is compared: types, codes,
fields, states and values.  The English of a refusal's message and of a
transition record's reason is free text that another implementation words
its own way, so :func:`normative` blanks it on both sides first.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import attrs
from hypothesis import event
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.ports import SYSTEM_PRINCIPAL
from fencekeeper.adapters.store import Evidence, ExecutionView, ManualClock, StoreError, TransactionalStore
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel import recovery
from fencekeeper.kernel.machines import DispatchState, ExecutionState

from . import budget
from .suite import CORRELATION, EVENT_TYPE, GOVERNOR, StoreFactory, assert_coherent, evidence_key

DEFAULT_SETTINGS = budget.stateful_settings(budget.BUDGETS["default"])
"""The ``default`` budget: fast enough for every test run, about 1,800 requests per store, a few seconds.

Shrinking is off: a failing run of this machine can take Hypothesis up to
five minutes to shrink, and the failure message already names the request,
the store's outcome and the model's.  To get the shortest failing sequence,
run with ``hypothesis.settings(DEFAULT_SETTINGS, phases=tuple(hypothesis.Phase))``.
"""

EXECUTIONS = ("e-1", "e-2", "e-3")
"""Admitted when a run starts; later admissions mostly use fresh ids, sometimes these again."""
BUSINESSES = ("b-1", "b-2")
WORKERS = ("w-1", "w-2", "w-3")
LEASES = (timedelta(seconds=3), timedelta(seconds=10), timedelta(seconds=60))
RATIONALES = {"full": "idempotent by command identity", "none": ""}
"""The reason a resume gives; the kernel derives the rest of the proof from the store's own facts."""
ACTIONS = (
    *("holder_acts",) * 6,
    *("claim_next",) * 3,
    *("wake",) * 2,
    *("recover",) * 2,
    *("advance_clock",) * 2,
    *("admit",) * 2,
    *("cancel",) * 2,
    *("park",) * 2,
    *("timer_pass",) * 2,
    "sweep",
)
"""What the machine does next, by weight: mostly lease holders (and zombies) acting."""
TIMER = p.Authority(True, SYSTEM_PRINCIPAL)
"""What the worker's timer loop presents: the dispatch grant of the system principal."""
MISSING = "e-missing"


def _current(evidence: Sequence[Evidence]) -> tuple[Evidence, ...]:
    """The newest revision of each evidence object, in creation order."""
    newest: dict[str, Evidence] = {}
    for item in evidence:
        if item.object_id not in newest or item.revision > newest[item.object_id].revision:
            newest[item.object_id] = item
    return tuple(newest.values())
"""An execution id no run ever admits."""


def _often(data: st.DataObject, label: str, one_in: int = 4) -> bool:
    """True except about once in ``one_in`` draws: how the machine mixes the usual with the odd."""
    return data.draw(st.integers(min_value=0, max_value=one_in - 1), label=label) > 0


def _pick(data: st.DataObject, label: str, *choices: str) -> str:
    return data.draw(st.sampled_from(choices), label=label)


@attrs.frozen
class Raises:
    """The model's expectation that the store raises ``StoreError(code)`` and writes nothing."""

    code: str


Expected = p.Outcome | Raises | None


class KernelModel:
    """What a store must hold: kernel snapshots, changed only by applying Decisions under their guard."""

    def __init__(self) -> None:
        self.executions: dict[str, p.Execution] = {}
        self.dispatches: dict[str, p.Dispatch] = {}
        self.revisions: dict[str, list[p.Execution]] = {}
        self.history: dict[str, list[p.TransitionRecord]] = {}
        self.registrations: dict[p.WaitKey, p.WaitRegistration] = {}
        self.recoveries: dict[str, p.RecoveryRecord] = {}
        self.evidence: dict[str, list[Evidence]] = {}

    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        return self.executions.get(execution_id), self.dispatches.get(execution_id)

    def evidence_ids(self) -> list[str]:
        return [item.object_id for items in self.evidence.values() for item in items]

    def next_eligible(self, now: datetime, business_id: str | None) -> str | None:
        due = sorted(
            (d.eligible_at, eid)
            for eid, d in self.dispatches.items()
            if d.dispatch_state == DispatchState.ELIGIBLE
            and d.eligible_at <= now
            and (business_id is None or self.executions[eid].business_id == business_id)
        )
        return due[0][1] if due else None

    def commit(self, outcome: p.Outcome, now: datetime, evidence: Sequence[Evidence] = ()) -> Expected:
        """Apply ``outcome`` if it is a Decision; what the store must return (or raise)."""
        if not isinstance(outcome, p.Decision):
            return outcome
        guard = outcome.guard
        eid = guard.execution_id
        assert guard.holds(*self.load(eid), now), f"the model's own decision on {eid} fails its guard: {guard}"
        ids = [item.object_id for item in evidence]
        if len(set(ids)) != len(ids) or set(ids) & set(self.evidence_ids()):
            return Raises("evidence_conflict")
        if outcome.execution is not None:
            self.executions[eid] = outcome.execution
            self.revisions.setdefault(eid, []).append(outcome.execution)
        if outcome.dispatch is not None:
            self.dispatches[eid] = outcome.dispatch
        self.history.setdefault(eid, []).extend(outcome.evidence)
        if outcome.registration is not None:
            self.registrations[outcome.registration.key] = outcome.registration
        closure = outcome.closes
        if closure is not None and closure.key in self.registrations and self.registrations[closure.key].is_open:
            self.registrations[closure.key] = attrs.evolve(self.registrations[closure.key], closed_by=closure.by.value)
        if outcome.recovery is not None:
            self.recoveries[outcome.recovery.command_id] = outcome.recovery
        if evidence:
            self.evidence.setdefault(eid, []).extend(evidence)
        return outcome

    def view(self, execution_id: str) -> ExecutionView | None:
        execution, dispatch = self.load(execution_id)
        if execution is None or dispatch is None:
            return None
        return ExecutionView(
            execution=execution,
            dispatch=dispatch,
            revisions=tuple(self.revisions.get(execution_id, ())),
            history=tuple(self.history.get(execution_id, ())),
            registrations=tuple(r for k, r in self.registrations.items() if k.execution_id == execution_id),
            recoveries=tuple(r for r in self.recoveries.values() if r.execution_id == execution_id),
            evidence=tuple(self.evidence.get(execution_id, ())),
            # The model appends first revisions only, so every revision is current.
            evidence_revisions=tuple(self.evidence.get(execution_id, ())),
        )

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        return sorted(eid for eid, e in self.executions.items() if state is None or e.state == state)

    def expired(self, now: datetime) -> list[str]:
        return sorted(
            eid
            for eid, d in self.dispatches.items()
            if d.dispatch_state == DispatchState.CLAIMED
            and d.lease_expires_at is not None
            and d.lease_expires_at <= now
        )

    def waits_on(self, key: p.WaitKey) -> bool:
        execution = self.executions.get(key.execution_id)
        return execution is not None and execution.state == ExecutionState.WAITING and execution.wait == key

    def due(self, now: datetime, limit: int | None = None) -> list[p.WaitKey]:
        """Open registrations whose wake is due and that their execution still waits on, earliest first."""
        due = sorted(
            (r.spec.wake_at, key.execution_id, key)
            for key, r in self.registrations.items()
            if r.is_open and self.waits_on(key) and r.spec.wake_at is not None and r.spec.wake_at <= now
        )
        return [key for _, _, key in due][:limit]


def normative(value: object) -> object:
    """``value`` with its free English text blanked: what two conforming stores must agree on.

    A refusal's and an idempotent repeat's ``message`` and a transition
    record's ``reason`` are for people; their codes, fields, states and
    values are the protocol (specs/protocol.md).  Everything else is kept.
    """
    if isinstance(value, p.TransitionRecord):
        return attrs.evolve(value, reason="")
    if isinstance(value, p.Refusal):
        return attrs.evolve(value, message="")
    if isinstance(value, p.Unchanged):
        return attrs.evolve(value, message="")
    if isinstance(value, p.Decision):
        return attrs.evolve(value, evidence=tuple(attrs.evolve(r, reason="") for r in value.evidence))
    if isinstance(value, ExecutionView):
        return attrs.evolve(value, history=tuple(attrs.evolve(r, reason="") for r in value.history))
    return value


def _normative_view(found: ExecutionView | None) -> ExecutionView | None:
    normal = normative(found)
    assert normal is None or isinstance(normal, ExecutionView)
    return normal


def _returning(outcome: p.Outcome) -> Callable[[], p.Outcome]:
    """A call that returns what a store already returned, for ``_expect`` to compare."""
    return lambda: outcome


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) < 2_000 else text[:2_000] + "..."


def _view_difference(actual: ExecutionView | None, expected: ExecutionView | None) -> str:
    """The fields of two views that differ, each with both values (the whole views are long)."""
    if actual is None or expected is None:
        return f"the store shows {_describe(actual)}; the model holds {_describe(expected)}"
    actual, expected = _normative_view(actual), _normative_view(expected)
    assert actual is not None and expected is not None
    lines = []
    for field in attrs.fields(ExecutionView):
        mine, theirs = getattr(actual, field.name), getattr(expected, field.name)
        if field.name == "evidence":
            mine = [(e.object_id, e.kind, e.body_json()) for e in mine]
            theirs = [(e.object_id, e.kind, e.body_json()) for e in theirs]
        if mine != theirs:
            pad = " " * len(field.name)
            lines.append(
                f"\n  {field.name}: the store shows {_describe(mine)}\n  {pad}  the model holds {_describe(theirs)}"
            )
    return "".join(lines)


class StoreStateMachine(RuleBasedStateMachine):
    """Random requests against a store and the kernel model; they must agree after every one.

    One rule, :meth:`act`, draws what happens next: a worker holding (or
    having held) a lease acts, a claim, an external wake, a cancellation, a
    governed recovery command, an admission, or the clock moves.  Each of
    those draws its own details, with labels, so a failing run reads as a
    list of requests.
    """

    def __init__(self, store_factory: StoreFactory) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.store = store_factory(self.clock)
        assert self.store.execution_ids() == [], "store_factory must return an empty store"
        self.model = KernelModel()
        self.held: list[tuple[str, p.LeaseCredential]] = []
        """Every credential any claim handed out, never forgotten: zombies keep theirs."""
        self.serial = itertools.count(1)

    def teardown(self) -> None:
        self.store.close()

    # --- comparing ------------------------------------------------------------------------

    def _expect(self, label: str, expected: Expected, call: Callable[[], p.Outcome | None]) -> None:
        # What happened, for --hypothesis-show-statistics: which outcomes a run reached.
        kind = label.split(" ", 1)[0]
        if isinstance(expected, p.Refusal | p.Unchanged):
            event(f"{kind}: {type(expected).__name__} {expected.code.value}")
        else:
            event(f"{kind}: {'nothing due' if expected is None else type(expected).__name__}")
        try:
            actual = call()
        except StoreError as exc:
            assert isinstance(expected, Raises), (
                f"{label}: the store raised StoreError({exc.code!r}: {exc.message}); "
                f"the model expected {_describe(expected)}"
            )
            assert exc.code == expected.code, f"{label}: StoreError({exc.code!r}), expected {expected.code!r}"
            return
        assert not isinstance(expected, Raises), (
            f"{label}: the model expected StoreError({expected.code!r}); the store returned {_describe(actual)}"
        )
        assert type(actual) is type(expected), (
            f"{label}: the store returned {_describe(actual)}; the model expected {_describe(expected)}"
        )
        if isinstance(expected, p.Refusal | p.Unchanged):
            assert isinstance(actual, p.Refusal | p.Unchanged)
            assert actual.code == expected.code, f"{label}: code {actual.code.value}, expected {expected.code.value}"
        if isinstance(expected, p.Decision):
            assert isinstance(actual, p.Decision)
            assert actual.execution == expected.execution, (
                f"{label}: execution {_describe(actual.execution)}, expected {_describe(expected.execution)}"
            )
            assert actual.dispatch == expected.dispatch, (
                f"{label}: dispatch {_describe(actual.dispatch)}, expected {_describe(expected.dispatch)}"
            )
        if isinstance(expected, p.Refusal):
            assert isinstance(actual, p.Refusal)
            assert actual.field == expected.field, f"{label}: field {actual.field!r}, expected {expected.field!r}"
        assert normative(actual) == normative(expected), f"{label}: {_describe(actual)} != {_describe(expected)}"

    # --- drawing request details --------------------------------------------------------------

    def _credential(self, data: st.DataObject) -> tuple[str, p.LeaseCredential]:
        """Mostly the newest credential of running work; sometimes a zombie's; sometimes altered."""
        held = sorted({eid for eid, _ in self.held})
        running = [eid for eid in held if self.model.executions[eid].state == ExecutionState.RUNNING]
        if running and _often(data, "prefer running work"):
            held = running
        execution_id = data.draw(st.sampled_from(held), label="held execution")
        mine = [credential for eid, credential in self.held if eid == execution_id]
        credential = mine[-1] if _often(data, "newest credential") else data.draw(st.sampled_from(mine))
        if not _often(data, "credential as given", 5):
            tamper = _pick(data, "tamper", "token", "worker", "fence")
            if tamper == "token":
                credential = attrs.evolve(credential, lease_token=f"t-forged-{next(self.serial)}")
            elif tamper == "worker":
                credential = attrs.evolve(credential, worker_id="w-other")
            else:
                credential = attrs.evolve(credential, fence=credential.fence + 1)
        return execution_id, credential

    def _revision(self, data: st.DataObject, execution_id: str) -> int:
        """Mostly the current revision; sometimes the one before it."""
        execution = self.model.executions.get(execution_id)
        current = execution.revision if execution is not None else 1
        return current if _often(data, "current revision") else max(1, current - 1)

    def _authority(self, data: st.DataObject, principal: str) -> p.Authority:
        return p.Authority(_often(data, "authorized", 6), principal)

    def _business(self, data: st.DataObject, execution_id: str) -> str:
        execution = self.model.executions.get(execution_id)
        right = execution.business_id if execution is not None else BUSINESSES[0]
        return right if _often(data, "right business", 6) else "b-other"

    def _evidence(self, data: st.DataObject, *, required: bool = False) -> list[Evidence]:
        """None, one item with a fresh id, or (rarely) one with an id already used."""
        if not required and not _often(data, "with evidence", 3):
            return []
        known = self.model.evidence_ids()
        if known and not _often(data, "fresh evidence id", 5):
            object_id = data.draw(st.sampled_from(known), label="reused evidence id")
        else:
            object_id = f"ev-{next(self.serial)}"
        return [Evidence(object_id, "step_attempt", {"serial": next(self.serial)})]

    def _execution(self, data: st.DataObject, *preferred: ExecutionState) -> str:
        """An execution the model holds, mostly one in a ``preferred`` state; rarely one that does not exist."""
        if not self.model.executions or not _often(data, "existing execution", 10):
            return MISSING
        choices = sorted(self.model.executions)
        likely = [eid for eid in choices if self.model.executions[eid].state in preferred]
        if likely and _often(data, "preferred state"):
            choices = likely
        return data.draw(st.sampled_from(choices), label="execution")

    # --- rules ------------------------------------------------------------------------------

    @initialize(businesses=st.lists(st.sampled_from(BUSINESSES), min_size=1, max_size=len(EXECUTIONS)))
    def admit_some(self, businesses: list[str]) -> None:
        # Every run starts with work, so that its steps are spent on the protocol.
        for execution_id, business_id in zip(EXECUTIONS, businesses, strict=False):
            self._admit(execution_id, business_id, GOVERNOR, granted=True)

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        """One request (or a clock move), its kind drawn by weight.

        One rule rather than one per request kind: Hypothesis chooses among
        rules unevenly and switches some off per example (swarm testing), so
        with few examples whole kinds of request would go untried.  Drawing
        the kind here keeps every kind in every run, in these proportions.
        """
        kind = data.draw(st.sampled_from(ACTIONS), label="request")
        if kind == "holder_acts" and not self.held:
            kind = "claim_next"
        if kind == "wake" and not self.model.registrations:
            kind = "cancel"
        if kind in ("park", "timer_pass", "sweep"):
            getattr(self, kind)(data)
            return
        if kind == "advance_clock":
            # Mostly forward, past lease expiry and wake times; sometimes a
            # little back (a clock corrected by NTP), so that work admitted
            # or released "later" is not yet due.
            forward = _often(data, "clock moves forward", 8)
            seconds = data.draw(st.integers(min_value=1, max_value=8 if forward else 3), label="seconds")
            self.advance_clock(seconds if forward else -seconds)
        else:
            getattr(self, kind)(data)

    def admit(self, data: st.DataObject) -> None:
        fresh = _often(data, "fresh execution id")
        execution_id = f"e-{next(self.serial)}" if fresh else data.draw(st.sampled_from(EXECUTIONS))
        business_id = data.draw(st.sampled_from(BUSINESSES), label="business")
        self._admit(execution_id, business_id, GOVERNOR, granted=_often(data, "authorized", 6))

    def _admit(self, execution_id: str, business_id: str, principal: str, *, granted: bool) -> None:
        request = p.AdmitRequest(execution_id, business_id, "d-1", 1, "start", p.Authority(granted, principal))
        now = self.clock.now()
        expected = self.model.commit(p.admit(self.model.executions.get(execution_id), request, now), now)
        self._expect(f"admit {execution_id}", expected, lambda: self.store.admit(request))

    def claim_next(self, data: st.DataObject) -> None:
        worker_id = data.draw(st.sampled_from(WORKERS), label="worker")
        business_id = None if _often(data, "any business") else data.draw(st.sampled_from(BUSINESSES))
        request = p.ClaimRequest(worker_id, f"t-{next(self.serial)}", data.draw(st.sampled_from(LEASES)))
        now = self.clock.now()
        execution_id = self.model.next_eligible(now, business_id)
        expected = (
            None
            if execution_id is None
            else self.model.commit(p.claim(*self.model.load(execution_id), request, now), now)
        )
        self._expect(
            f"claim by {worker_id} (business {business_id})",
            expected,
            lambda: self.store.claim_next(request, business_id=business_id),
        )
        if isinstance(expected, p.Decision) and expected.lease is not None and execution_id is not None:
            self.held.append((execution_id, expected.lease))

    def holder_acts(self, data: st.DataObject) -> None:
        """A worker that holds or once held a lease renews, steps, releases, finalizes or attaches evidence."""
        execution_id, credential = self._credential(data)
        action = _pick(data, "action", "renew", "step", "release", "finalize", "finalize", "evidence")
        now = self.clock.now()
        execution, dispatch = self.model.load(execution_id)
        label = f"{action} {execution_id} {credential}"
        if action == "renew":
            renewal = p.RenewRequest(credential, data.draw(st.sampled_from(LEASES)))
            expected = self.model.commit(p.renew(execution, dispatch, renewal, now), now)
            self._expect(label, expected, lambda: self.store.renew(execution_id, renewal))
        elif action == "step":
            step = p.StepRequest(
                credential,
                self._revision(data, execution_id),
                p.StepRecord("n-1", f"a-{next(self.serial)}"),
                self._authority(data, credential.worker_id),
            )
            items = self._evidence(data)
            expected = self.model.commit(p.record_step(execution, dispatch, step, now), now, items)
            self._expect(f"{label} {items}", expected, lambda: self.store.record_step(execution_id, step, items))
        elif action == "release":
            release = p.ReleaseRequest(credential, self._revision(data, execution_id))
            expected = self.model.commit(p.release(execution, dispatch, release, now), now)
            self._expect(label, expected, lambda: self.store.release(execution_id, release))
        elif action == "finalize":
            request = self._finalize_request(data, execution_id, credential)
            items = self._evidence(data)
            expected = self.model.commit(p.finalize(execution, dispatch, request, now), now, items)
            self._expect(
                f"{label} -> {request.target_state} {items}", expected, lambda: self.store.finalize(request, items)
            )
        else:
            items = self._evidence(data, required=True)
            expected = self.model.commit(p.fenced(execution, dispatch, credential, now), now, items)
            self._expect(
                f"{label} {items}", expected, lambda: self.store.append_evidence(execution_id, credential, items)
            )

    def _finalize_request(
        self, data: st.DataObject, execution_id: str, credential: p.LeaseCredential
    ) -> p.FinalizeRequest:
        target = data.draw(
            st.sampled_from((ExecutionState.WAITING, *p.FINALIZE_TARGETS, ExecutionState.CANCELLED)), label="target"
        )
        waits_for = _pick(data, "waits for", "event", "timer", "timeout", "event_timeout")
        now = self.clock.now()
        spec = p.WaitSpec(
            node_id="n-wait",
            attempt_id=f"a-{next(self.serial)}",  # fresh: a registration key is never reused here
            event_type=EVENT_TYPE if waits_for in ("event", "event_timeout") else None,
            correlation=CORRELATION if waits_for in ("event", "event_timeout") else (),
            wake_at=None if waits_for == "event" else now + timedelta(seconds=data.draw(st.integers(0, 10))),
            timeout=waits_for in ("timeout", "event_timeout"),
        )
        # Mostly the registration fits the target (waiting carries one, the
        # others none); sometimes it does not.
        carries = (target == ExecutionState.WAITING) == _often(data, "registration fits target", 6)
        return p.FinalizeRequest(
            execution_id=execution_id,
            dispatch_id=execution_id,
            worker_id=credential.worker_id,
            lease_token=credential.lease_token,
            fence=credential.fence,
            target_state=target,
            business_id=self._business(data, execution_id),
            expected_revision=self._revision(data, execution_id),
            authority=self._authority(data, credential.worker_id),
            step=p.StepRecord("n-end", f"a-{next(self.serial)}") if _often(data, "final step", 2) else None,
            wait=spec if carries else None,
        )

    def wake(self, data: st.DataObject) -> None:
        """An Event, a Decision or a timer, for an open registration, a woken one or one that does not exist."""
        open_keys = [k for k, r in self.model.registrations.items() if r.is_open]
        keys = open_keys if open_keys and _often(data, "open registration") else list(self.model.registrations)
        key = data.draw(st.sampled_from(keys), label="wait key")
        if not _often(data, "registered key", 8):
            key = attrs.evolve(key, attempt_id="a-unregistered")
        variant = _pick(data, "wake", "event", "decision", "wrong_type", "wrong_correlation", "timer", "timeout")
        reason = {
            "event": p.WakeReason.EVENT,
            "wrong_type": p.WakeReason.EVENT,
            "wrong_correlation": p.WakeReason.EVENT,
            "decision": p.WakeReason.DECISION,
            "timer": p.WakeReason.TIMER,
            "timeout": p.WakeReason.TIMEOUT,
        }[variant]
        event_like = reason in (p.WakeReason.EVENT, p.WakeReason.DECISION)
        source = _pick(data, "source", "src-1", "src-2")  # two sources, so wakes repeat and race
        request = p.WakeRequest(
            key=key,
            reason=reason,
            source_id=f"{source}.{key.attempt_id}",
            business_id=self._business(data, key.execution_id),
            authority=self._authority(data, GOVERNOR),
            event_type=("payment.refunded" if variant == "wrong_type" else EVENT_TYPE) if event_like else None,
            correlation=((("order", "o-2"),) if variant == "wrong_correlation" else CORRELATION) if event_like else (),
        )
        now = self.clock.now()
        execution, dispatch = self.model.load(key.execution_id)
        outcome = p.wake(execution, dispatch, self.model.registrations.get(key), request, now)
        expected = self.model.commit(outcome, now)
        self._expect(f"wake {key} by {variant} {source}", expected, lambda: self.store.wake(request))

    def cancel(self, data: st.DataObject) -> None:
        execution_id = self._execution(data, ExecutionState.ELIGIBLE, ExecutionState.WAITING, ExecutionState.RUNNING)
        request = p.CancelRequest(
            execution_id,
            self._business(data, execution_id),
            self._revision(data, execution_id),
            self._authority(data, GOVERNOR),
        )
        now = self.clock.now()
        expected = self.model.commit(p.cancel(*self.model.load(execution_id), request, now), now)
        self._expect(f"cancel {execution_id}", expected, lambda: self.store.cancel(request))

    def recover(self, data: st.DataObject) -> None:
        """A governed recovery command: fresh, under a reused identity, or the identical command again."""
        if self.model.recoveries and not _often(data, "new command", 4):
            record = self.model.recoveries[data.draw(st.sampled_from(sorted(self.model.recoveries)))]
            # The identical command again, as a retrying client sends it.
            self._recover(
                p.RecoveryRequest(
                    command_id=record.command_id,
                    kind=record.kind,
                    execution_id=record.execution_id,
                    business_id=self.model.executions[record.execution_id].business_id,
                    expected_revision=record.expected_revision,
                    actor_id=GOVERNOR,
                    authority=p.Authority(True, GOVERNOR),
                    command_to_reconcile=(
                        "cmd-unresolved" if record.kind == p.RecoveryKind.RECONCILE_COMMAND else None
                    ),
                    next_node_id=(
                        "n-1"
                        if record.kind in (p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.RESUME_SUSPENDED)
                        else None
                    ),
                    rationale=RATIONALES["full"],
                )
            )
            return
        execution_id = self._execution(
            data, ExecutionState.RUNNING, ExecutionState.RECONCILIATION_REQUIRED, ExecutionState.SUSPENDED
        )
        execution, dispatch = self.model.load(execution_id)
        if execution is not None and _often(data, "the decision the state invites"):
            kind = (
                p.RecoveryKind.QUARANTINE_EXPIRED
                if execution.state == ExecutionState.RUNNING
                else data.draw(st.sampled_from(tuple(p.RecoveryKind)[1:]), label="governed decision")
            )
        else:
            kind = data.draw(st.sampled_from(tuple(p.RecoveryKind)), label="decision")
        if self.model.recoveries and not _often(data, "fresh command id", 6):
            command_id = data.draw(st.sampled_from(sorted(self.model.recoveries)), label="reused command id")
        else:
            command_id = f"cmd-{next(self.serial)}"
        holder = dispatch.leased_by if dispatch is not None else None
        actor_id = holder if holder is not None and not _often(data, "governor acts", 5) else GOVERNOR
        self._recover(
            p.RecoveryRequest(
                command_id=command_id,
                kind=kind,
                execution_id=execution_id,
                business_id=self._business(data, execution_id),
                expected_revision=self._revision(data, execution_id),
                actor_id=actor_id,
                authority=self._authority(data, actor_id),
                command_to_reconcile="cmd-unresolved" if kind == p.RecoveryKind.RECONCILE_COMMAND else None,
                next_node_id=(
                    _pick(data, "continuation", "n-1", "n-2")
                    if kind in (p.RecoveryKind.RESUME_SAFE, p.RecoveryKind.RESUME_SUSPENDED)
                    else None
                ),
                rationale=RATIONALES[_pick(data, "rationale", "full", "full", "none")],
            )
        )

    def _recover(self, request: p.RecoveryRequest) -> None:
        now = self.clock.now()
        execution, dispatch = self.model.load(request.execution_id)
        # The model holds no definitions, so a resume's proof fails on
        # dependencies_current here, in the model and the store alike; the
        # shipped suite proves resumes on stores that hold them.
        facts = recovery.RecoveryFacts(_current(self.model.evidence.get(request.execution_id, ())), None, ())
        outcome = recovery.recover(
            execution, dispatch, self.model.recoveries.get(request.command_id), request, now, facts=facts
        )
        expected = self.model.commit(outcome, now)
        self._expect(
            f"recover {request.kind.value} {request.execution_id} by {request.command_id} as {request.actor_id}",
            expected,
            lambda: self.store.recover(request),
        )

    def advance_clock(self, seconds: int) -> None:
        self.clock.advance(timedelta(seconds=seconds))

    def park(self, data: st.DataObject) -> None:
        """The lease holder of running work finalizes it to waiting on a timer, as a wait node does."""
        running = sorted(
            eid for eid, _ in self.held if self.model.executions[eid].state == ExecutionState.RUNNING
        )
        if not running:
            self.claim_next(data)
            return
        execution_id = data.draw(st.sampled_from(running), label="parked execution")
        credential = [c for eid, c in self.held if eid == execution_id][-1]
        execution, dispatch = self.model.load(execution_id)
        assert execution is not None
        now = self.clock.now()
        with_event = not _often(data, "timer only", 3)
        spec = p.WaitSpec(
            node_id="n-wait",
            attempt_id=f"a-{next(self.serial)}",
            event_type=EVENT_TYPE if with_event else None,
            correlation=CORRELATION if with_event else (),
            wake_at=now + timedelta(seconds=data.draw(st.integers(0, 6), label="wake in")),
            timeout=data.draw(st.booleans(), label="timeout"),
        )
        request = p.FinalizeRequest(
            execution_id=execution_id,
            dispatch_id=execution_id,
            worker_id=credential.worker_id,
            lease_token=credential.lease_token,
            fence=credential.fence,
            target_state=ExecutionState.WAITING,
            business_id=execution.business_id,
            expected_revision=execution.revision,
            authority=p.Authority(True, credential.worker_id),
            wait=spec,
        )
        expected = self.model.commit(p.finalize(execution, dispatch, request, now), now)
        self._expect(f"park {execution_id} until {spec.wake_at}", expected, lambda: self.store.finalize(request))

    def timer_pass(self, data: st.DataObject) -> None:
        """The worker's timer loop with a small limit, until nothing is due: every due timer must fire."""
        limit = data.draw(st.integers(min_value=1, max_value=3), label="due_wakes limit")
        now = self.clock.now()
        for _ in range(len(self.model.registrations) + 1):
            keys = self.store.due_wakes(limit)
            assert keys == self.model.due(now, limit), (
                f"due_wakes({limit}) at {now.isoformat()}: the store returns {keys}, "
                f"the model's due registrations are {self.model.due(now, limit)}"
            )
            if not keys:
                break
            for key in keys:
                self._fire(key, now)
        assert self.model.due(now) == [], f"due timers left unfired after a whole timer loop: {self.model.due(now)}"

    def _fire(self, key: p.WaitKey, now: datetime) -> None:
        registration = self.model.registrations[key]
        execution, dispatch = self.model.load(key.execution_id)
        assert execution is not None
        reason = p.WakeReason.TIMEOUT if registration.spec.timeout else p.WakeReason.TIMER
        request = p.WakeRequest(key, reason, f"{key.attempt_id}/{reason.value}", execution.business_id, TIMER)
        expected = self.model.commit(p.wake(execution, dispatch, registration, request, now), now)
        assert isinstance(expected, p.Decision), f"a due timer {key} the model cannot fire: {expected}"
        self._expect(f"fire_timer {key}", expected, lambda: self.store.fire_timer(key, TIMER))

    def sweep(self, data: st.DataObject) -> None:
        """A quarantine sweep of one business: it ends, deciding each expired execution once, as the kernel does."""
        if not isinstance(self.store, TransactionalStore):
            return
        business_id = data.draw(st.sampled_from(BUSINESSES), label="sweep business")
        now = self.clock.now()
        expected: dict[str, Expected] = {}
        for execution_id in self.model.expired(now):
            execution, dispatch = self.model.load(execution_id)
            assert execution is not None
            if execution.business_id != business_id:
                continue
            request = p.RecoveryRequest(
                command_id=f"q-{execution_id}-r{execution.revision}",
                kind=p.RecoveryKind.QUARANTINE_EXPIRED,
                execution_id=execution_id,
                business_id=business_id,
                expected_revision=execution.revision,
                actor_id=GOVERNOR,
                authority=p.Authority(True, GOVERNOR),
            )
            prior = self.model.recoveries.get(request.command_id)
            expected[execution_id] = self.model.commit(recovery.recover(execution, dispatch, prior, request, now), now)
        policy = examples.grants(business_id, GOVERNOR)
        result = service.quarantine_expired(self.store, policy, business_id=business_id, principal_id=GOVERNOR)
        event(f"sweep: {len(result.outcomes)} decided")
        assert result.moved_on == {} and result.locked == {}, f"a sweep run alone lost a race: {result}"
        assert result.outcomes.keys() == expected.keys(), (
            f"the sweep decided on {sorted(result.outcomes)}; the model's expired executions of "
            f"{business_id} are {sorted(expected)}"
        )
        for execution_id, outcome in result.outcomes.items():
            self._expect(f"sweep quarantine {execution_id}", expected[execution_id], _returning(outcome))
        left = [x for x in self.store.expired() if self.model.executions[x].business_id == business_id]
        assert left == [], f"expired executions of {business_id} left after the sweep: {left}"
        again = service.quarantine_expired(self.store, policy, business_id=business_id, principal_id=GOVERNOR)
        assert again == service.Sweep(), f"a second sweep found work the first left: {again}"

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def store_shows_what_the_model_holds(self) -> None:
        now = self.clock.now()
        assert self.store.execution_ids() == self.model.execution_ids()
        for state in ExecutionState:
            assert self.store.execution_ids(state) == self.model.execution_ids(state), state
        assert self.store.expired() == self.model.expired(now), f"expired() at {now.isoformat()}"
        for execution_id in (*self.model.execution_ids(), MISSING):
            actual, expected = self.store.read(execution_id), self.model.view(execution_id)
            assert evidence_key(_normative_view(actual)) == evidence_key(_normative_view(expected)), (
                f"read({execution_id!r}) differs from the model: {_view_difference(actual, expected)}"
            )

    @invariant()
    def every_execution_is_coherent(self) -> None:
        for execution_id in self.store.execution_ids():
            found = self.store.read(execution_id)
            assert found is not None, f"{execution_id} is listed but read() finds nothing"
            assert_coherent(found)
            # A registration is open exactly while its execution waits on it.
            open_keys = [r.key for r in found.registrations if r.is_open]
            waits = found.execution.wait if found.execution.state == ExecutionState.WAITING else None
            assert open_keys == ([] if waits is None else [waits]), (
                f"{execution_id} is {found.execution.state.value} (waiting on {waits}) with open registrations "
                f"{open_keys}: a registration nothing waits on would be returned by no timer and closed by nothing"
            )


def run_store_state_machine(store_factory: StoreFactory, settings: hypothesis_settings | None = None) -> None:
    """Run :class:`StoreStateMachine` against stores made by ``store_factory`` (one per example).

    ``store_factory`` is called once per Hypothesis example and must return
    a fresh, empty store reading its time from the clock it is given; the
    machine closes it when the example ends.  ``settings`` replaces the
    chosen budget (:func:`fencekeeper.adapters.testing.budget.chosen`:
    ``FENCEKEEPER_SUITE_BUDGET``, ``pytest --fencekeeper-budget``, else
    ``default``).
    """

    class BoundStoreStateMachine(StoreStateMachine):
        def __init__(self) -> None:
            super().__init__(store_factory)

    run_state_machine_as_test(
        BoundStoreStateMachine, settings=settings if settings is not None else budget.stateful_settings()
    )


__all__ = [
    "ACTIONS",
    "BUSINESSES",
    "DEFAULT_SETTINGS",
    "EXECUTIONS",
    "LEASES",
    "MISSING",
    "RATIONALES",
    "TIMER",
    "WORKERS",
    "Expected",
    "KernelModel",
    "Raises",
    "StoreStateMachine",
    "normative",
    "run_store_state_machine",
]
