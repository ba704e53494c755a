"""The suite's concurrency tests: claims, steps, finalizes, wakes and cancels, two at a time.

Each test sets up rows serially, then races two requests on two sessions of
the store (:mod:`fencekeeper.adapters.testing.concurrency`), both held at
the clock between their reads and their commits where the store lets them
be.  Rules every test checks (seed 000: Lease, Fenced Execution
Finalization, wait_for_event, Cancellation):

- neither racer raises (a busy database, a deadlock, a constraint error
  are the store's to resolve, not the caller's);
- exactly one racer's request is applied, or, for two claims of two
  executions, each claims its own;
- the other racer's outcome is exactly what the kernel returns for its
  request on the rows the winner left: the same type and the same code;
- the store shows exactly one new transition, the winner's evidence and
  none of the loser's, and the rows the winner wrote.

A store that checks the kernel's guard only when it reads, or a SQLite
store that begins its transactions without taking the write lock, fails
them (tests/conformance/broken has one of each).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fencekeeper.adapters.store import Evidence, ManualClock, Store
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

from .concurrency import Raced, SessionOpener, race, reopen
from .suite import (
    GRANTED,
    LEASE,
    RequestTests,
    admit,
    decided,
    finalize_request,
    revision,
    step_request,
    view,
    wait_spec,
    wake_request,
)
from .suite import _event as event


def _brief(outcome: object) -> str:
    """An outcome in a few words: a Decision by what it wrote, a refusal by its code."""
    if isinstance(outcome, p.Decision):
        execution = outcome.execution
        what = "evidence only" if execution is None else f"{execution.execution_id} -> {execution.state.value} r{execution.revision}"
        lease = "" if outcome.lease is None else f", lease {outcome.lease.lease_token}"
        return f"Decision({what}{lease})"
    if isinstance(outcome, p.Refusal | p.Unchanged):
        return f"{type(outcome).__name__}({outcome.code.value})"
    return repr(outcome)


def _one_winner(first: Raced, second: Raced) -> tuple[int, p.Decision, Any]:
    """Exactly one racer got a Decision: its index, its decision and the other racer's outcome."""
    outcomes = (first.value(), second.value())
    winners = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, p.Decision)]
    assert len(winners) == 1, (
        f"two concurrent requests on the same rows were both applied ({_brief(outcomes[0])} and "
        f"{_brief(outcomes[1])}): "
        "the guard was not enforced when the second one committed"
        if len(winners) == 2
        else f"neither of two concurrent requests was applied: {_brief(outcomes[0])}, {_brief(outcomes[1])}"
    )
    index = winners[0]
    return index, outcomes[index], outcomes[1 - index]


def _same_outcome(actual: object, expected: p.Outcome | None, what: str) -> None:
    """The loser got what the kernel gives its request on the winner's rows: type and code."""
    assert type(actual) is type(expected), (
        f"{what}: the losing racer got {actual!r}; on the rows the winner left the kernel answers {expected!r}"
    )
    if isinstance(expected, p.Refusal | p.Unchanged):
        assert isinstance(actual, p.Refusal | p.Unchanged)
        assert actual.code == expected.code, (
            f"{what}: the losing racer was refused with {actual.code.value}; on the rows the winner left the "
            f"kernel refuses with {expected.code.value}"
        )


class RaceTests(RequestTests):
    """Concurrency tests every store inherits (through :class:`~fencekeeper.adapters.testing.StoreTests`)."""

    @pytest.fixture
    def store_session(self, request: pytest.FixtureRequest) -> SessionOpener:
        """Opens a second session on a store's database.

        The default is the ``fencekeeper_store_session`` fixture where one is
        defined (the plugin's ``--fencekeeper-session``), else
        :func:`~fencekeeper.adapters.testing.concurrency.reopen`: a new
        connection for the SQLite and PostgreSQL stores, and any other store
        object itself.  Override it for a store whose object serializes its
        own calls (one connection behind a mutex), so that the races reach
        the database.
        """
        try:
            opener: SessionOpener = request.getfixturevalue("fencekeeper_store_session")
        except pytest.FixtureLookupError:
            return reopen
        return opener

    @pytest.fixture
    def other(self, store: Store, clock: ManualClock, store_session: SessionOpener) -> Iterator[Store]:
        """The second racer's session on ``store``'s database."""
        session = store_session(store, clock)
        yield session
        if session is not store:
            session.close()

    # --- claims ---------------------------------------------------------------------------------

    def test_two_claims_of_one_execution_lease_it_once(self, store: Store, other: Store, clock: ManualClock) -> None:
        admit(store, "e-1")
        first, second = race(
            clock,
            lambda: store.claim_next(p.ClaimRequest("w-1", "t-race-1", LEASE)),
            lambda: other.claim_next(p.ClaimRequest("w-2", "t-race-2", LEASE)),
        )
        _, won, lost = _one_winner(first, second)
        assert lost is None, f"the losing claim got {lost!r}; with nothing else eligible it must get nothing (None)"
        found = view(store, "e-1")
        assert won.lease is not None and found.dispatch.lease_token == won.lease.lease_token
        assert (found.execution.revision, found.execution.fence) == (2, 1)
        assert len(found.history) == 2

    def test_two_claims_of_two_executions_take_one_each(self, store: Store, other: Store, clock: ManualClock) -> None:
        admit(store, "e-1")
        admit(store, "e-2")
        first, second = race(
            clock,
            lambda: store.claim_next(p.ClaimRequest("w-1", "t-race-1", LEASE)),
            lambda: other.claim_next(p.ClaimRequest("w-2", "t-race-2", LEASE)),
        )
        outcomes = (first.value(), second.value())
        for outcome in outcomes:
            assert isinstance(outcome, p.Decision), (
                f"two claims with two executions eligible must both succeed; one got {outcome!r}: a claim that "
                "picks its candidate before it holds the rows must look again, not refuse"
            )
        claimed = sorted(o.execution.execution_id for o in outcomes if o.execution is not None)
        assert claimed == ["e-1", "e-2"], f"two claims took {claimed}: one execution was leased twice"
        for execution_id in claimed:
            found = view(store, execution_id)
            assert (found.execution.revision, found.execution.fence, len(found.history)) == (2, 1, 2)

    # --- steps ----------------------------------------------------------------------------------

    def test_two_steps_on_one_revision_record_one(self, store: Store, other: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        requests = [
            step_request(store, "e-1", credential, step=p.StepRecord("n-1", f"a-race-{i}")) for i in (1, 2)
        ]
        items = [[Evidence(f"ev-race-{i}", "step_attempt", {"racer": i})] for i in (1, 2)]
        first, second = race(
            clock,
            lambda: store.record_step("e-1", requests[0], items[0]),
            lambda: other.record_step("e-1", requests[1], items[1]),
        )
        index, won, lost = _one_winner(first, second)
        found = view(store, "e-1")
        _same_outcome(lost, p.record_step(found.execution, found.dispatch, requests[1 - index], clock.now()), "step")
        assert found.execution == won.execution and found.execution.step_count == found.dispatch.step_count == 1
        assert [e.object_id for e in found.evidence] == [f"ev-race-{index + 1}"]
        assert len(found.history) == 3

    # --- finalizes ------------------------------------------------------------------------------

    def test_two_finalizes_of_one_lease_apply_one(self, store: Store, other: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        targets = (ExecutionState.SUCCEEDED, ExecutionState.FAILED)
        requests = [finalize_request(store, "e-1", credential, target, error_code="e.race") for target in targets]
        items = [[Evidence(f"ev-outcome-{t.value}", "outcome", {"target": t.value})] for t in targets]
        first, second = race(
            clock,
            lambda: store.finalize(requests[0], items[0]),
            lambda: other.finalize(requests[1], items[1]),
        )
        index, won, lost = _one_winner(first, second)
        found = view(store, "e-1")
        _same_outcome(lost, p.finalize(found.execution, found.dispatch, requests[1 - index], clock.now()), "finalize")
        assert found.execution == won.execution and found.execution.state == targets[index]
        assert [e.object_id for e in found.evidence] == [items[index][0].object_id]
        assert len(found.history) == 3

    def test_a_finalize_racing_a_release_applies_one(self, store: Store, other: Store, clock: ManualClock) -> None:
        credential = self.running(store)
        final = finalize_request(store, "e-1", credential, ExecutionState.SUCCEEDED)
        release = p.ReleaseRequest(credential, revision(store, "e-1"))
        first, second = race(
            clock, lambda: store.finalize(final, [Evidence("ev-final", "outcome")]), lambda: other.release("e-1", release)
        )
        index, won, lost = _one_winner(first, second)
        found = view(store, "e-1")
        expected = (
            p.release(found.execution, found.dispatch, release, clock.now())
            if index == 0
            else p.finalize(found.execution, found.dispatch, final, clock.now())
        )
        _same_outcome(lost, expected, "finalize against release")
        assert found.execution == won.execution and len(found.history) == 3
        assert [e.object_id for e in found.evidence] == (["ev-final"] if index == 0 else [])

    # --- wakes ----------------------------------------------------------------------------------

    def test_two_wakes_of_one_registration_wake_it_once(
        self, store: Store, other: Store, clock: ManualClock
    ) -> None:
        key = self.waiting(store, wait_spec("a-race"))
        requests = [wake_request(key, source_id=f"ev-race-{i}") for i in (1, 2)]
        first, second = race(clock, lambda: store.wake(requests[0]), lambda: other.wake(requests[1]))
        index, won, lost = _one_winner(first, second)
        found = view(store, "e-1")
        registration = found.registrations[0]
        _same_outcome(
            lost, p.wake(found.execution, found.dispatch, registration, requests[1 - index], clock.now()), "wake"
        )
        assert registration.woken_by == f"ev-race-{index + 1}", (
            f"the registration shows woken_by={registration.woken_by!r}; the applied wake was ev-race-{index + 1}"
        )
        assert found.execution == won.execution and len(found.history) == 4

    def test_two_events_racing_for_one_waiter_wake_it_once(
        self, store: Store, other: Store, clock: ManualClock
    ) -> None:
        self.waiting(store, wait_spec("a-race"))
        first, second = race(
            clock,
            lambda: store.publish_event(event("ev-race-1", ("order", "o-1")), GRANTED),
            lambda: other.publish_event(event("ev-race-2", ("order", "o-1")), GRANTED),
        )
        woken = [r.value().woken for r in (first, second)]
        assert sorted(woken) == [(), ("e-1",)], f"two Events woke {woken}: one waiter must be woken exactly once"
        found = view(store, "e-1")
        winner = "ev-race-1" if woken[0] else "ev-race-2"
        assert found.registrations[0].woken_by == winner and len(found.history) == 4

    # --- cancels --------------------------------------------------------------------------------

    def test_two_cancels_of_one_revision_cancel_once(self, store: Store, other: Store, clock: ManualClock) -> None:
        admit(store, "e-1")
        requests = [p.CancelRequest("e-1", "b-1", 1, p.Authority(True, f"ops-{i}")) for i in (1, 2)]
        first, second = race(clock, lambda: store.cancel(requests[0]), lambda: other.cancel(requests[1]))
        index, won, lost = _one_winner(first, second)
        found = view(store, "e-1")
        _same_outcome(lost, p.cancel(found.execution, found.dispatch, requests[1 - index], clock.now()), "cancel")
        assert found.execution == won.execution and found.execution.state == ExecutionState.CANCELLED
        assert len(found.history) == 2 and found.history[-1].actor == f"ops-{index + 1}"

    def test_a_cancel_racing_a_claim_applies_one(self, store: Store, other: Store, clock: ManualClock) -> None:
        admit(store, "e-1")
        cancel = p.CancelRequest("e-1", "b-1", 1, GRANTED)
        claim = p.ClaimRequest("w-1", "t-race", LEASE)
        first, second = race(clock, lambda: store.cancel(cancel), lambda: other.claim_next(claim))
        found = view(store, "e-1")
        cancelled, claimed = first.value(), second.value()
        if isinstance(cancelled, p.Decision):
            assert claimed is None, f"a claim after the cancel got {claimed!r}; a cancelled execution is not eligible"
            assert found.execution.state == ExecutionState.CANCELLED and found.dispatch.lease_token is None
        else:
            decided(claimed)
            _same_outcome(cancelled, p.cancel(found.execution, found.dispatch, cancel, clock.now()), "cancel")
            assert found.execution.state == ExecutionState.RUNNING and found.dispatch.lease_token == "t-race"
        assert len(found.history) == 2


__all__ = ["RaceTests"]
