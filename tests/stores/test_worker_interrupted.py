"""A KeyboardInterrupt or SystemExit outside the handler hands the lease back, unless a Command may be in flight.

One inside the handler was recorded as the Command's unknown outcome before
it was raised again (tests/api/test_client.py).  One that landed anywhere
else while the worker held a lease (the ``claimed`` hook, planning, a step
just committed) was raised at once, and the execution stayed running under
that lease until it expired and a quarantine sweep sent it to review, where
nothing needed reviewing.  Now the worker releases the lease on the way out
(running -> eligible), and another worker continues at once.  Never while a
Command's intent may be committed without its result: that lease is left to
expire, for quarantine and reconciliation, and the Command is not run again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.ports import WORKFLOW_DISPATCH, Authority
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import Evidence, ManualClock, StoreError, TransactionalStore
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState

BUSINESS = "default"
PRINCIPAL = "user:operator"
POLICY = examples.grants(BUSINESS, PRINCIPAL)
DEFINITION = parse_definition(
    """\
id = "two-steps"
revision = 1
start = "first"
inputs = ["order_id"]

[[nodes]]
id = "first"
kind = "local_command"
revision = 1
operation = "order.first"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "second"
on_failure = "failed"

[[nodes]]
id = "second"
kind = "local_command"
revision = 1
operation = "order.second"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "done"
on_failure = "failed"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "failed"
kind = "end"
revision = 1
outcome = "failed"
error_code = "order_failed"
""",
    "two-steps.toml",
)
INTERRUPTIONS = pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit])


class Handler:
    def __init__(self) -> None:
        self.executed: list[str] = []

    def execute(self, command: i.Command) -> i.CommandResult:
        self.executed.append(command.operation)
        return i.CommandResult(i.CommandStatus.SUCCEEDED, None, "done")

    def reconcile(self, command: i.Command) -> i.CommandResult:
        return i.CommandResult(i.CommandStatus.SUCCEEDED, None, "it was done")


class Uncomposed:
    """The store, with no visit composed into a claim or a step: every visit is the worker's own, in drive.

    ``after_intent`` is raised once the intent's ``append_evidence`` has committed, before it returns;
    ``after_step`` once a step has, its following visits composed as the worker plans them.
    """

    def __init__(
        self,
        inner: TransactionalStore,
        after_intent: type[BaseException] | None = None,
        after_step: type[BaseException] | None = None,
    ) -> None:
        self._inner = inner
        self._after_intent = after_intent
        self._after_step = after_step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim_and_visit(self, request: p.ClaimRequest, plan: Any, **kwargs: Any) -> Any:
        return self._inner.claim_and_visit(request, lambda *_: None, **kwargs)

    def record_step_and_visit(self, execution_id: str, request: p.StepRequest, evidence: Any, plan: Any) -> Any:
        if self._after_step is None:
            return self._inner.record_step_and_visit(execution_id, request, evidence, lambda *_: None)
        self._inner.record_step_and_visit(execution_id, request, evidence, plan)
        raise self._after_step()

    def append_evidence(self, execution_id: str, credential: p.LeaseCredential, evidence: Sequence[Evidence]) -> Any:
        outcome = self._inner.append_evidence(execution_id, credential, evidence)
        if self._after_intent is not None:
            raise self._after_intent()
        return outcome


class InterruptedPolicy:
    """The grants, until the dispatch authority of a visit is asked for: then the interruption."""

    def __init__(self, interruption: type[BaseException]) -> None:
        self.interruption = interruption

    def check(self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()) -> Authority:
        if operation == WORKFLOW_DISPATCH and targets:
            raise self.interruption()
        return POLICY.check(principal_id, business_id, operation, targets)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "store.db")
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    try:
        yield opened
    finally:
        opened.close()


def interrupting_at(what: str, interruption: type[BaseException], seen: list[str]) -> Callable[[str, str, str], None]:
    """An ``on_event`` hook that raises ``interruption`` at the first event ``what``."""

    def hook(execution_id: str, event: str, detail: str) -> None:
        seen.append(event)
        if event == what and seen.count(what) == 1:
            raise interruption()

    return hook


def dispatch_of(store: TransactionalStore) -> tuple[ExecutionState, str | None, DispatchState, str | None]:
    view = store.read("x-1")
    assert view is not None
    return view.execution.state, view.execution.current_node_id, view.dispatch.dispatch_state, view.dispatch.leased_by


def finish(store: TransactionalStore, handler: Handler) -> None:
    """Another worker continues, at once: no lease to wait out."""
    worker = Worker(store, "w-2", POLICY, handler)
    while worker.run_pass().claimed:
        pass
    assert dispatch_of(store)[0] == ExecutionState.SUCCEEDED


@INTERRUPTIONS
def test_between_the_claim_and_the_visit_the_lease_is_handed_back(
    store: SQLiteStore, interruption: type[BaseException]
) -> None:
    handler, seen = Handler(), []
    worker = Worker(Uncomposed(store), "w-1", POLICY, handler, on_event=interrupting_at("claimed", interruption, seen))  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(store) == (ExecutionState.ELIGIBLE, "first", DispatchState.ELIGIBLE, None)
    assert seen == ["claimed", "released"] and handler.executed == []
    finish(store, handler)
    assert handler.executed == ["order.first", "order.second"]


@INTERRUPTIONS
def test_while_planning_the_lease_is_handed_back(store: SQLiteStore, interruption: type[BaseException]) -> None:
    # An AuthorityPolicy that a Ctrl-C interrupts (a slow lookup, say): nothing of the visit was written.
    handler, seen = Handler(), []
    worker = Worker(
        Uncomposed(store), "w-1", InterruptedPolicy(interruption), handler,  # type: ignore[arg-type]
        on_event=lambda _x, what, _d: seen.append(what),
    )  # fmt: skip
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(store) == (ExecutionState.ELIGIBLE, "first", DispatchState.ELIGIBLE, None)
    assert seen == ["claimed", "released"] and handler.executed == []
    finish(store, handler)


@INTERRUPTIONS
def test_after_a_commands_result_is_committed_the_lease_is_handed_back(
    store: SQLiteStore, interruption: type[BaseException]
) -> None:
    # The first Command's result is committed with its step; the interruption comes at that step's event.
    handler, seen = Handler(), []
    worker = Worker(Uncomposed(store), "w-1", POLICY, handler, on_event=interrupting_at("step", interruption, seen))  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(store) == (ExecutionState.ELIGIBLE, "second", DispatchState.ELIGIBLE, None)
    assert seen[-2:] == ["step", "released"] and handler.executed == ["order.first"]
    finish(store, handler)
    assert handler.executed == ["order.first", "order.second"]


@INTERRUPTIONS
def test_after_a_commands_intent_is_committed_the_lease_is_left_to_expire(
    store: SQLiteStore, interruption: type[BaseException]
) -> None:
    # The intent is committed and the handler not called: released, the next worker would plan the visit
    # again without knowing whether the Command ran.  The lease runs out, and quarantine sends it to review.
    handler, seen = Handler(), []
    worker = Worker(Uncomposed(store), "w-1", POLICY, handler, on_event=interrupting_at("command", interruption, seen))  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(store) == (ExecutionState.RUNNING, "first", DispatchState.CLAIMED, "w-1")
    assert "released" not in seen and handler.executed == []
    view = store.read("x-1")
    assert view is not None and [e.state for e in view.evidence if e.kind == i.COMMAND] == ["issued"]


@INTERRUPTIONS
def test_inside_the_intents_commit_the_lease_is_left_to_expire(
    store: SQLiteStore, interruption: type[BaseException]
) -> None:
    # Interrupted before append_evidence returned, the worker cannot tell whether the intent committed.
    handler, seen = Handler(), []
    worker = Worker(
        Uncomposed(store, after_intent=interruption), "w-1", POLICY, handler,  # type: ignore[arg-type]
        on_event=lambda _x, what, _d: seen.append(what),
    )  # fmt: skip
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(store) == (ExecutionState.RUNNING, "first", DispatchState.CLAIMED, "w-1")
    assert "released" not in seen and handler.executed == []
    view = store.read("x-1")
    assert view is not None and [e.state for e in view.evidence if e.kind == i.COMMAND] == ["issued"]


@INTERRUPTIONS
def test_a_claim_that_committed_the_intent_keeps_its_lease(store: SQLiteStore, interruption: type[BaseException]) -> None:
    # The definition in memory, the claim's transaction composes the first visit's intent with the claim.
    assert store.load_definition(BUSINESS, "two-steps", 1) is not None
    handler, seen = Handler(), []
    worker = Worker(store, "w-1", POLICY, handler, on_event=interrupting_at("claimed", interruption, seen))
    with pytest.raises(interruption):
        worker.run_pass()
    assert worker.holds_command("x-1") is False  # the visit is over; the worker holds nothing now
    assert dispatch_of(store) == (ExecutionState.RUNNING, "first", DispatchState.CLAIMED, "w-1")
    assert seen == ["claimed"] and handler.executed == []
    view = store.read("x-1")
    assert view is not None and [e.state for e in view.evidence if e.kind == i.COMMAND] == ["issued"]


CHECK_FIRST = parse_definition(
    """\
id = "check-first"
revision = 1
start = "check"
inputs = ["order_id"]

[[nodes]]
id = "check"
kind = "condition"
revision = 1
expression = "1 < 2"
bindings = []
true_next = "first"
false_next = "failed"

[[nodes]]
id = "first"
kind = "local_command"
revision = 1
operation = "order.first"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "done"
on_failure = "failed"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "failed"
kind = "end"
revision = 1
outcome = "failed"
error_code = "order_failed"
""",
    "check-first.toml",
)


@INTERRUPTIONS
def test_inside_a_step_that_composed_the_next_intent_the_lease_is_left_to_expire(
    store: SQLiteStore, interruption: type[BaseException]
) -> None:
    # The condition's step is the worker's own; its transaction composes the next node's intent, and the
    # interruption comes before it returns: the worker held no Command until that transaction planned one.
    service.register(store, CHECK_FIRST, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="check-first",
        input={"order_id": "o-2"}, execution_id="x-2",
    )  # fmt: skip
    # x-1, admitted first, out of the way: the pass claims x-2.
    service.cancel(store, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1")
    assert store.load_definition(BUSINESS, "check-first", 1) is not None
    handler, seen = Handler(), []
    worker = Worker(
        Uncomposed(store, after_step=interruption), "w-1", POLICY, handler,  # type: ignore[arg-type]
        on_event=lambda _x, what, _d: seen.append(what),
    )  # fmt: skip
    with pytest.raises(interruption):
        worker.run_pass()
    view = store.read("x-2")
    assert view is not None
    assert (view.execution.state, view.execution.current_node_id, view.dispatch.leased_by) == (
        ExecutionState.RUNNING, "first", "w-1"
    )
    assert [e.state for e in view.evidence if e.kind == i.COMMAND] == ["issued"]
    assert "released" not in seen and handler.executed == []


# --- inside the claim call ----------------------------------------------------------------------
#
# The claim's transaction may commit before an interruption that lands inside the store's call (or on
# its way back), and the worker then never sees the credential it returns.  It asks the store which
# execution runs under the token it claimed with (``leased_to``) and hands that lease back, unless the
# claim composed a Command's intent.  On every store.


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TransactionalStore]:
    opened: TransactionalStore
    if request.param == "memory":
        opened = MemoryStore(ManualClock())
    elif request.param == "sqlite":
        opened = SQLiteStore(tmp_path / "store.db", ManualClock())
    else:
        from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415

        opened = PostgresStore(request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"))
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    try:
        yield opened
    finally:
        opened.close()


class InterruptedClaim:
    """The store, interrupted inside ``claim_and_visit``: before its transaction commits, or after.

    ``composed`` keeps the worker's planner (the claim's transaction may then compose the first visit's
    intent); otherwise the claim is the transaction's only decision.
    """

    def __init__(
        self, inner: TransactionalStore, interruption: type[BaseException], *, committed: bool, composed: bool = False
    ) -> None:
        self._inner = inner
        self._interruption = interruption
        self._committed = committed
        self._composed = composed
        self.tokens: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def claim_and_visit(self, request: p.ClaimRequest, plan: Any, **kwargs: Any) -> Any:
        self.tokens.append(request.lease_token)
        interruption = self._interruption

        def planner(view: Any, now: Any, held: Any) -> Any:
            if not self._committed:
                raise interruption()  # inside the transaction: it rolls back
            return plan(view, now, held) if self._composed else None

        self._inner.claim_and_visit(request, planner, **kwargs)
        raise interruption()  # committed; the credential never reaches the worker


@INTERRUPTIONS
def test_inside_the_claim_after_it_committed_the_lease_is_handed_back(
    any_store: TransactionalStore, interruption: type[BaseException]
) -> None:
    handler, seen = Handler(), []
    store = InterruptedClaim(any_store, interruption, committed=True)
    worker = Worker(store, "w-1", POLICY, handler, on_event=lambda _x, what, _d: seen.append(what))  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    # Claimed (fence 1) and handed back: eligible at once, no lease to wait out, nothing run.
    assert dispatch_of(any_store) == (ExecutionState.ELIGIBLE, "first", DispatchState.ELIGIBLE, None)
    view = any_store.read("x-1")
    assert view is not None and view.execution.fence == 1
    assert [t.event for t in view.history][-2:] == [ExecutionEvent.CLAIM, ExecutionEvent.RELEASE]
    assert seen == ["released"] and handler.executed == [] and worker.holds_command("x-1") is False
    finish(any_store, handler)
    assert handler.executed == ["order.first", "order.second"]


@INTERRUPTIONS
def test_inside_the_claim_before_it_committed_nothing_is_claimed(
    any_store: TransactionalStore, interruption: type[BaseException]
) -> None:
    handler, seen = Handler(), []
    store = InterruptedClaim(any_store, interruption, committed=False)
    worker = Worker(store, "w-1", POLICY, handler, on_event=lambda _x, what, _d: seen.append(what))  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(any_store) == (ExecutionState.ELIGIBLE, "first", DispatchState.ELIGIBLE, None)
    view = any_store.read("x-1")
    assert view is not None and view.execution.fence == 0, "rolled back: the claim never happened"
    assert seen == [] and handler.executed == []
    finish(any_store, handler)


@INTERRUPTIONS
def test_inside_a_claim_that_committed_an_intent_the_lease_is_left_to_expire(
    any_store: TransactionalStore, interruption: type[BaseException]
) -> None:
    # The claim's transaction composed the first visit's intent: whether the Command ran is for
    # reconciliation to find out, so the lease is kept, as after any committed intent.
    assert any_store.load_definition(BUSINESS, "two-steps", 1) is not None
    handler, seen = Handler(), []
    store = InterruptedClaim(any_store, interruption, committed=True, composed=True)
    worker = Worker(store, "w-1", POLICY, handler, on_event=lambda _x, what, _d: seen.append(what))  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(any_store) == (ExecutionState.RUNNING, "first", DispatchState.CLAIMED, "w-1")
    assert any_store.leased_to("w-1", store.tokens[0]) == "x-1"
    view = any_store.read("x-1")
    assert view is not None and [e.state for e in view.evidence if e.kind == i.COMMAND] == ["issued"]
    assert seen == [] and handler.executed == [] and worker.holds_command("x-1") is False


class Unanswering(InterruptedClaim):
    """As InterruptedClaim, on a store that cannot say what the claim took (it went away meanwhile)."""

    def leased_to(self, worker_id: str, lease_token: str) -> str | None:
        raise StoreError("store_unavailable", "the store went away")


@INTERRUPTIONS
def test_a_claim_the_store_cannot_name_expires_and_is_swept_to_review_with_nothing_lost(
    tmp_path: Path, interruption: type[BaseException]
) -> None:
    # The window left open: the lease runs out, a sweep sends the execution to review, and an operator's
    # resume continues it where it was.  No Command was issued, so none is in doubt.
    clock = ManualClock()
    opened = SQLiteStore(tmp_path / "store.db", clock)
    service.register(opened, DEFINITION, BUSINESS, PRINCIPAL, POLICY)
    service.run(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, definition_id="two-steps",
        input={"order_id": "o-1"}, execution_id="x-1",
    )  # fmt: skip
    handler = Handler()
    worker = Worker(Unanswering(opened, interruption, committed=True), "w-1", POLICY, handler)  # type: ignore[arg-type]
    with pytest.raises(interruption):
        worker.run_pass()
    assert dispatch_of(opened) == (ExecutionState.RUNNING, "first", DispatchState.CLAIMED, "w-1")
    assert opened.expired() == []
    clock.advance(worker.lease)
    sweep = service.quarantine_expired(opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL)
    assert sweep.quarantined == ["x-1"]
    outcome = service.resume(
        opened, POLICY, business_id=BUSINESS, principal_id=PRINCIPAL, execution_id="x-1", at_node="first",
        rationale="interrupted inside its claim; no Command was issued",
    )  # fmt: skip
    assert isinstance(outcome, p.Decision)
    finish(opened, handler)
    assert handler.executed == ["order.first", "order.second"]
    opened.close()
