"""The operation store suite and the service state machine, against the in-memory reference store."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.ports import ClaimRefused
from fencekeeper.adapters.operations.worker import MAX_LEASE, DurableOperationWorker
from fencekeeper.adapters.store import ManualClock, SystemClock
from fencekeeper.adapters.testing.operations_suite import (
    ALICE,
    TENANT,
    OperationStoreTests,
    OpsStoreFactory,
    World,
)
from fencekeeper.kernel import operations as o


class TestMemoryOperationStore(OperationStoreTests):
    state_machine_examples = 40

    @pytest.fixture
    def ops_store_factory(self) -> OpsStoreFactory:
        return MemoryOperationStore



def test_a_long_external_action_keeps_its_lease_by_heartbeats() -> None:
    world = World(MemoryOperationStore(SystemClock()), ManualClock())
    original = world.provider.capture

    def slow_capture(key: str, amount: int) -> str:
        time.sleep(0.5)  # longer than the lease: only heartbeats keep it
        return original(key, amount)

    world.provider.capture = slow_capture  # type: ignore[method-assign]
    op_id = world.service.submit(
        tenant=TENANT, principal=ALICE, action="capture_unapproved", input={"order": "o-1", "amount": 1},
        client_key="slow",
    ).operation_id
    worker = DurableOperationWorker(
        world.store, world.actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=timedelta(milliseconds=300)
    )
    report = worker.run_once()
    assert report is not None and report.outcome == "succeeded", report
    assert any(line.event == "heartbeat" for line in world.service.history(op_id))


def test_one_heartbeat_thread_renews_each_action_and_nothing_after_it() -> None:
    """The worker's heartbeat thread outlives an action; it renews the next one's lease, and never one that ended."""
    world = World(MemoryOperationStore(SystemClock()), ManualClock())
    original = world.provider.capture
    renewals: list[str] = []
    heartbeat = world.store.heartbeat

    def counted(request: o.HeartbeatRequest) -> o.Outcome:
        renewals.append(request.credential.operation_id)
        return heartbeat(request)

    world.store.heartbeat = counted  # type: ignore[method-assign]

    def slow_capture(key: str, amount: int) -> str:
        time.sleep(0.4)  # longer than the lease: only heartbeats keep it
        return original(key, amount)

    world.provider.capture = slow_capture  # type: ignore[method-assign]
    worker = DurableOperationWorker(
        world.store, world.actions, world.resolvers, tenant=TENANT, worker_id="w-renewing", lease=timedelta(milliseconds=300)
    )
    ids = []
    for n in (1, 2):
        ids.append(world.service.submit(
            tenant=TENANT, principal=ALICE, action="capture_unapproved", input={"order": f"o-{n}", "amount": 1},
            client_key=f"slow-{n}",
        ).operation_id)
        report = worker.run_once()
        assert report is not None and report.outcome == "succeeded", report
    assert set(renewals) == set(ids)  # each action's lease was renewed, by the one thread
    after = len(renewals)
    time.sleep(0.35)  # three renewal intervals with no action running
    assert len(renewals) == after
    assert [t.name for t in threading.enumerate()].count("w-renewing-heartbeat") == 1


def test_a_caller_asking_for_its_tenant_does_not_see_another_tenants_operation() -> None:
    from fencekeeper.adapters.operations.service import DurableOperationError  # noqa: PLC0415

    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    operation_id = world.transfer("t-1")
    assert world.service.get(operation_id, tenant=TENANT) is not None
    assert [line.to_state for line in world.service.history(operation_id, tenant=TENANT)] == ["admitted"]
    assert world.service.get(operation_id, tenant="other") is None
    with pytest.raises(DurableOperationError, match="does not exist"):
        world.service.history(operation_id, tenant="other")


def test_the_record_says_whether_an_external_effect_is_unsettled() -> None:
    from fencekeeper.adapters.testing.operations_suite import leave_an_unanswered_and_a_succeeded_capture  # noqa: PLC0415

    clock = ManualClock()
    world = World(MemoryOperationStore(clock), clock)
    crashed, succeeded = leave_an_unanswered_and_a_succeeded_capture(world)
    unanswered, answered = world.service.get(crashed), world.service.get(succeeded)
    assert unanswered is not None and unanswered.effect_unsettled and unanswered.to_json()["effect_unsettled"] is True
    assert answered is not None and not answered.effect_unsettled and answered.effect_id is not None


def test_an_authorizer_that_raises_fails_closed_without_ending_the_worker() -> None:
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableAction,
        DurableActionRegistry,
        DurableOperationError,
        DurableOperationService,
    )

    clock = ManualClock()
    world = World(MemoryOperationStore(clock), clock)
    broken = [False]

    def authorize(resolution: object, value: object) -> bool:
        if broken[0]:
            raise LookupError("the policy store is down")
        return True

    actions = DurableActionRegistry(
        (DurableAction("check", 1, o.EffectClass.READ_ONLY, lambda v: v, authorize=authorize),)
    )
    service = DurableOperationService(world.store, actions, world.resolvers, namespace="shop")
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="check", input={"a": 1}, client_key="k1").operation_id
    broken[0] = True
    # Current authorization that cannot be established is not granted: a denial, for submission as for the worker.
    with pytest.raises(DurableOperationError) as raised:
        service.submit(tenant=TENANT, principal=ALICE, action="check", input={"a": 2}, client_key="k2")
    assert raised.value.code == "not_authorized" and "LookupError: the policy store is down" in raised.value.message
    worker = DurableOperationWorker(
        world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=timedelta(seconds=30)
    )
    report = worker.run_once()
    assert report is not None and report.outcome == "not_authorized" and "policy store is down" in report.detail, report
    record = service.get(op_id)
    assert record is not None and [(a.state, a.error_code) for a in record.attempts] == [("failed", "not_authorized")]


def test_heartbeats_do_not_carry_a_running_attempt_past_the_overall_deadline() -> None:
    """A handler that outlives the deadline while its worker renews the lease ends deadline_exceeded, not succeeded."""
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableAction,
        DurableActionRegistry,
        DurableOperationService,
    )

    def slow(value: object) -> object:
        time.sleep(0.9)  # three leases and past the deadline: only heartbeats could keep it
        return value

    store = MemoryOperationStore(SystemClock())
    world = World(store, ManualClock())
    policy = o.RetryPolicy(maximum_attempts=1, schedule_to_close=timedelta(milliseconds=450))
    actions = DurableActionRegistry((DurableAction("slow", 1, o.EffectClass.READ_ONLY, slow, policy=policy),))
    service = DurableOperationService(store, actions, world.resolvers, namespace="shop")
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="slow", input={"n": 1}, client_key="k").operation_id
    worker = DurableOperationWorker(
        store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=timedelta(milliseconds=300)
    )
    first = worker.run_once()
    assert first is not None and first.outcome == "lease_expired", first
    record = service.get(op_id)
    assert record is not None and record.deadline < record.attempts[0].started_at + timedelta(milliseconds=900)
    ended = worker.run_once()
    assert ended is not None and ended.outcome == "deadline_exceeded", ended
    history = service.history(op_id)
    assert history[-1].event == "deadline_exceeded"
    assert all(line.at < record.deadline for line in history if line.event == "heartbeat")


def test_decide_and_cancel_for_one_tenant_do_not_find_another_tenants_operation() -> None:
    """As get and history: asked for another tenant, the Operation does not exist, and nothing says whose it is."""
    from fencekeeper.adapters.operations.service import DurableOperationError, PrincipalReference  # noqa: PLC0415

    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    op_id = world.service.submit(
        tenant=TENANT, principal=ALICE, action="capture_payment", input={"order": "o-1", "amount": 1}, client_key="k"
    ).operation_id
    bob = PrincipalReference("users", 1, "bob")
    for call in (
        lambda: world.service.decide(op_id, approver=bob, approve=True, tenant="tenant-b"),
        lambda: world.service.cancel(op_id, principal=ALICE, tenant="tenant-b"),
    ):
        with pytest.raises(DurableOperationError) as raised:
            call()
        assert raised.value.code == "operation_not_found" and TENANT not in raised.value.message
    record = world.service.get(op_id)
    assert record is not None and record.state.value == "awaiting_approval"
    # Within the tenant both work as before.
    assert world.service.decide(op_id, approver=bob, approve=True, tenant=TENANT).approved_by == bob.ref
    assert world.service.cancel(op_id, principal=ALICE, tenant=TENANT).state.value == "cancelled"


@pytest.mark.parametrize("answer", ["another_principal", "not_a_resolution"])
def test_a_resolver_that_answers_for_someone_else_fails_closed(answer: str) -> None:
    """The provenance binding is verified: a resolution of another reference (or none at all) grants nothing."""
    from fencekeeper.adapters.operations.service import (  # noqa: PLC0415
        DurableOperationError,
        PrincipalReference,
        PrincipalResolution,
        PrincipalResolverRegistry,
        ResolutionStatus,
    )

    clock = ManualClock()
    world = World(MemoryOperationStore(clock), clock)
    op_id = world.transfer("k1", 10)
    carol = PrincipalReference("users", 1, "carol")

    class Confused:
        def resolve(self, reference: PrincipalReference) -> object:
            if answer == "not_a_resolution":
                return None
            return PrincipalResolution(ResolutionStatus.ACTIVE, carol, frozenset({TENANT}))

    confused = PrincipalResolverRegistry(retries=0, pause=0)
    confused.register("users", 1, Confused())  # type: ignore[arg-type]
    world.resolvers = confused
    world.service.resolvers = confused
    with pytest.raises(DurableOperationError) as raised:
        world.transfer("k2", 10)
    assert raised.value.code == "not_authorized"
    report = world.worker("w1").run_once()
    assert report is not None and report.outcome == "not_authorized", report
    record = world.service.get(op_id)
    assert record is not None and record.outcome is not None and record.outcome.value == "not_authorized"


def test_a_refusal_that_names_no_row_pauses_the_worker_instead_of_spinning() -> None:
    """A store whose claim refusal names no Operation cannot be passed over: the worker reports it and pauses."""
    clock = ManualClock()
    world = World(MemoryOperationStore(clock), clock)
    answers: list[o.Outcome | None] = []

    class Refusing(MemoryOperationStore):
        def claim_next(self, *args: object, **kwargs: object) -> o.Outcome | None:
            answers.append(o.Refusal(o.RefusalCode.NOT_ELIGIBLE, "refused"))
            return answers[-1]

    store = Refusing(clock)
    worker = DurableOperationWorker(store, world.actions, world.resolvers, tenant=TENANT, worker_id="w1")
    reports = worker.run_until_idle(limit=50)
    assert [(r.operation_id, r.outcome) for r in reports] == [("?", "not_eligible")]
    assert "paused until" in reports[0].detail and len(answers) == 1
    clock.advance(worker.lease)
    assert [r.outcome for r in worker.run_until_idle(limit=50)] == ["not_eligible"]  # asked once more, then paused
    clock.advance(worker.lease)
    assert worker.run_until_idle(limit=50) == [] and len(answers) == 2  # the second pause is twice as long


def test_a_malformed_claim_is_refused_as_it_is_and_names_no_row() -> None:
    """A refusal of the request itself says nothing about the row found due: it is not a ClaimRefused."""
    clock = ManualClock()
    world = World(MemoryOperationStore(clock), clock)
    world.transfer("k1")
    outcome = world.store.claim_next(TENANT, "w1", timedelta(0))
    assert isinstance(outcome, o.Refusal) and not isinstance(outcome, ClaimRefused)
    assert (outcome.code, outcome.field) == (o.RefusalCode.INVALID_REQUEST, "lease_duration")


def test_a_principal_or_version_of_the_wrong_type_is_invalid_input_naming_it() -> None:
    """A reference given as its stored text, or a version as a string, is named, and nothing is written."""
    from fencekeeper.adapters.operations.service import DurableOperationError  # noqa: PLC0415

    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    submission = {"tenant": TENANT, "action": "capture_payment", "input": {"order": "o-1", "amount": 1}}
    op_id = world.service.submit(**submission, principal=ALICE, client_key="k").operation_id
    history = world.service.history(op_id)
    for field, call in (
        ("principal", lambda: world.service.submit(**submission, principal=ALICE.ref, client_key="k-2")),
        ("version", lambda: world.service.submit(**submission, principal=ALICE, client_key="k-3", version="1")),
        ("approver", lambda: world.service.decide(op_id, approver="users:v1:bob", approve=True)),
        ("principal", lambda: world.service.cancel(op_id, principal=ALICE.ref)),
    ):
        with pytest.raises(DurableOperationError) as raised:
            call()
        assert (raised.value.code, raised.value.field) == ("invalid_input", field), raised.value
        assert raised.value.message.startswith(f"{field}: ")
    assert world.service.history(op_id) == history
    assert world.store.operation_ids() == [op_id]


@pytest.mark.parametrize(
    ("setting", "code"),
    [
        ({"lease": timedelta(0)}, "invalid_request"),
        ({"lease": 30}, "invalid_request"),
        ({"lease": MAX_LEASE + timedelta(microseconds=1)}, "invalid_request"),
        ({"lease": timedelta(days=10**6)}, "invalid_request"),
        ({"tenant": "a b"}, "invalid_input"),
        ({"worker_id": "a b"}, "invalid_input"),
        ({"namespace": ""}, "invalid_input"),
    ],
    ids=["zero-lease", "lease-in-seconds", "lease-past-a-day", "lease-of-a-million-days", "tenant", "worker_id", "namespace"],
)
def test_a_worker_setting_that_cannot_work_is_refused_when_the_worker_is_made(setting: dict[str, object], code: str) -> None:
    """A zero lease spun run_until_idle through a refusal at every claim; a lease in seconds was a TypeError there."""
    from fencekeeper.adapters.operations.service import DurableOperationError  # noqa: PLC0415

    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    world.transfer("k1", 10)
    options: dict[str, object] = {"tenant": TENANT, "lease": timedelta(seconds=30), **setting}
    with pytest.raises(DurableOperationError) as raised:
        DurableOperationWorker(world.store, world.actions, world.resolvers, **options)  # type: ignore[arg-type]
    field = next(iter(setting))
    assert (raised.value.code, raised.value.field) == (code, field)
    assert raised.value.message.startswith(f"{field}: ")


def test_a_lease_of_a_day_is_the_longest_a_worker_takes_as_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past a day the heartbeat thread died with OverflowError; the command line's --lease stopped at a day already."""
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    world = World(MemoryOperationStore(SystemClock()), ManualClock())
    original = world.provider.capture

    def slow_capture(key: str, amount: int) -> str:
        time.sleep(0.2)  # the heartbeat thread is waiting its third of the lease meanwhile
        return original(key, amount)

    world.provider.capture = slow_capture  # type: ignore[method-assign]
    op_id = world.service.submit(
        tenant=TENANT, principal=ALICE, action="capture_unapproved", input={"order": "o-1", "amount": 1},
        client_key="a-day",
    ).operation_id
    worker = DurableOperationWorker(world.store, world.actions, world.resolvers, tenant=TENANT, lease=MAX_LEASE)
    report = worker.run_once()
    assert report is not None and (report.operation_id, report.outcome) == (op_id, "succeeded"), report
    assert died == []


@pytest.mark.parametrize(
    "setting",
    [
        {"approval_validity": "1h"}, {"approval_validity": timedelta(0)}, {"retention": 86400}, {"retention": timedelta(-1)},
        {"approval_validity": timedelta.max}, {"retention": timedelta(days=3_000_000)},
    ],
    ids=["validity-text", "validity-zero", "retention-seconds", "retention-negative", "validity-max", "retention-past-9999"],
)
def test_a_service_setting_that_cannot_work_is_refused_when_the_service_is_made(setting: dict[str, object]) -> None:
    """approval_validity="1h" was a TypeError at the first decision; a zero one refused every decision as expired.

    One that reaches past the last representable time was an OverflowError at every decision, and such a
    retention refused every submission.
    """
    from fencekeeper.adapters.operations.service import DurableOperationError, DurableOperationService  # noqa: PLC0415

    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    with pytest.raises(DurableOperationError) as raised:
        DurableOperationService(world.store, world.actions, world.resolvers, **setting)  # type: ignore[arg-type]
    field = next(iter(setting))
    assert (raised.value.code, raised.value.field) == ("invalid_request", field)
