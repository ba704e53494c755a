"""What an application's own code hands the operations service and worker: handlers, failures, policies.

Each test is a mistake an application can make in its actions or policies,
and what it must come to: one clear error when the action or service is
made, or a failure the worker records, never an Attempt left running, and
never authority granted that was not.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.service import (
    ActionFailed,
    DurableAction,
    DurableActionRegistry,
    DurableOperationError,
    DurableOperationService,
    PrincipalReference,
    PrincipalResolverRegistry,
    ResolutionStatus,
    referenced_versions,
)
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing.operations_suite import ALICE, BOB, TENANT, World
from fencekeeper.kernel import operations as o


def _world(*actions: DurableAction) -> tuple[World, DurableOperationService, DurableActionRegistry]:
    clock = ManualClock()
    world = World(MemoryOperationStore(clock), clock)
    registry = DurableActionRegistry(actions)
    return world, DurableOperationService(world.store, registry, world.resolvers, namespace="shop"), registry


def _worker(world: World, registry: DurableActionRegistry) -> DurableOperationWorker:
    return DurableOperationWorker(
        world.store, registry, world.resolvers, tenant=TENANT, worker_id="w1", lease=timedelta(seconds=30)
    )


def test_a_handler_that_raises_the_services_own_error_fails_its_attempt_and_not_the_worker() -> None:
    # A handler that submits a follow-up operation may meet idempotency_conflict; raised out of run_once, the
    # worker stopped and the Attempt stayed running until its lease ran out.
    def follow_up(value: Any) -> Any:
        raise DurableOperationError("idempotency_conflict", "the follow-up's key names another request")

    world, service, registry = _world(DurableAction("follow", 1, o.EffectClass.READ_ONLY, follow_up))
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="follow", input={}, client_key="k1").operation_id
    report = _worker(world, registry).run_once()
    assert report is not None and report.outcome == "retry", report
    assert "idempotency_conflict" in report.detail, report
    record = service.get(op_id)
    assert record is not None and record.state.value == "admitted"
    assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]


@pytest.mark.parametrize("effect_class", [o.EffectClass.READ_ONLY, o.EffectClass.ATOMIC], ids=lambda e: e.value)
@pytest.mark.parametrize(
    ("result", "named"),
    [
        ({1: "a"}, 'result: key 1 (int) is not a string; an object\'s keys are strings, and JSON would take this one for the string "1"'),
        ({"lines": [{True: 1}]}, "result.lines[0]: key True (bool) is not a string"),
        ({"totals": {"eur": 1, 2: 3}}, "result.totals: key 2 (int) is not a string"),
        ({None: 1}, 'result: key None (NoneType) is not a string; an object\'s keys are strings, and JSON would take this one for the string "null"'),
    ],
    ids=["int-key", "nested-bool-key", "mixed-keys", "none-key"],
)
def test_a_result_whose_object_key_is_no_string_is_the_handlers_error_not_a_changed_result(
    effect_class: o.EffectClass, result: Any, named: str
) -> None:
    # Was: {1: "a"} was stored, and handed to the caller, as {"1": "a"}, without a word (a result with mixed
    # keys failed in the encoder's words, "'<' not supported between instances of 'str' and 'int'").  An
    # input is refused for the same key (invalid_input); a result is the action's error, retried.
    def handler(*args: Any) -> Any:
        return result

    world, service, registry = _world(DurableAction("r", 1, effect_class, handler))
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="r", input={}, client_key="k1").operation_id
    report = _worker(world, registry).run_once()
    assert report is not None and report.outcome == "retry", report
    assert report.detail.startswith(f"ValueError: {named}"), report.detail
    record = service.get(op_id)
    assert record is not None and record.state.value == "admitted" and record.result is None
    assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]


@pytest.mark.parametrize("effect_class", [o.EffectClass.READ_ONLY, o.EffectClass.ATOMIC], ids=lambda e: e.value)
def test_a_result_nested_past_the_bound_is_the_handlers_error(effect_class: o.EffectClass) -> None:
    # complete refuses a result nested deeper than 32 levels (operations.md, "The depth of a result"); a worker
    # that passed one on would have its success refused and its Attempt left running until the lease expired.
    deep: Any = []
    for _ in range(o.MAX_RESULT_DEPTH):
        deep = [deep]

    def handler(*args: Any) -> Any:
        return deep

    world, service, registry = _world(DurableAction("r", 1, effect_class, handler))
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="r", input={}, client_key="k1").operation_id
    report = _worker(world, registry).run_once()
    assert report is not None and report.outcome == "retry", report
    assert report.detail.startswith("ValueError: result: must be JSON text nested at most 32 levels"), report.detail
    record = service.get(op_id)
    assert record is not None and record.state.value == "admitted" and record.result is None
    assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]


def test_a_result_with_string_keys_is_stored_as_it_was_returned() -> None:
    # The key walk runs only for a result that holds an object; what it passes is stored as before.
    result = {"order": {"lines": [{"sku": "a{", "qty": 1.0}], "1": None}, "note": "no {object} here"}
    world, service, registry = _world(DurableAction("r", 1, o.EffectClass.READ_ONLY, lambda value: result))
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="r", input={}, client_key="k1").operation_id
    report = _worker(world, registry).run_once()
    assert report is not None and report.outcome == "succeeded", report
    record = service.get(op_id)
    assert record is not None and record.result == result


@pytest.mark.parametrize(
    "failure",
    [lambda: ActionFailed("insufficient funds"), lambda: ActionFailed(402), lambda: ActionFailed("x", retryable="no")],
    ids=["code-with-a-space", "code-an-int", "retryable-text"],
)
def test_an_action_failed_the_store_cannot_record_is_refused_where_it_is_made(failure: Callable[[], Any]) -> None:
    # The store refused to record such a failure (invalid_request), so the Attempt stayed running until its
    # lease ran out, and the next claim met the same failure again.
    with pytest.raises(DurableOperationError) as raised:
        failure()
    assert raised.value.code == "invalid_request" and raised.value.field in ("code", "retryable")

    def handler(value: Any) -> Any:
        raise failure()

    world, service, registry = _world(DurableAction("pay", 1, o.EffectClass.READ_ONLY, handler))
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="pay", input={}, client_key="k1").operation_id
    report = _worker(world, registry).run_once()
    assert report is not None and report.outcome == "retry" and "ActionFailed" in report.detail, report
    record = service.get(op_id)
    assert record is not None and [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]


async def _coroutine(*args: Any) -> Any:
    return True


class _AsyncAdapter:
    idempotent = True

    async def perform(self, effect_id: str, payload: Any) -> Any:
        return None

    def reconcile(self, effect_id: str) -> Any:
        return None


class _UndecidedAdapter:
    def perform(self, effect_id: str, payload: Any) -> Any:
        return None

    def reconcile(self, effect_id: str) -> Any:
        return None


def _echo(value: Any) -> Any:
    return value


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"handler": _coroutine}, "handler"),
        ({"handler": _coroutine, "effect_class": o.EffectClass.ATOMIC}, "handler"),
        ({"normalize": _coroutine}, "normalize"),
        ({"authorize": _coroutine}, "authorize"),
        ({"effect_class": o.EffectClass.EXTERNAL, "adapter": _AsyncAdapter()}, "adapter.perform"),
        ({"effect_class": o.EffectClass.EXTERNAL, "adapter": _UndecidedAdapter()}, "adapter.idempotent"),
        ({"handler": None}, "handler"),
        ({"normalize": None}, "normalize"),
        ({"effect_class": "read_only"}, "effect_class"),
        ({"requires_approval": "yes"}, "requires_approval"),
        ({"policy": 3}, "policy"),
    ],
    ids=[
        "async-handler", "async-atomic-handler", "async-normalize", "async-authorize", "async-perform",
        "adapter-without-idempotent", "handler-none", "normalize-none", "effect-class-text", "approval-text",
        "policy-int",
    ],
)
def test_an_action_that_cannot_run_as_written_is_refused_when_it_is_made(arguments: dict[str, Any], field: str) -> None:
    # Accepted, an async authorizer's coroutine was a truthy answer: every submission and every attempt was
    # authorized.  An async handler's coroutine was never awaited and failed every attempt as "not JSON"; a
    # normaliser that was None blamed the caller's input.
    fields: dict[str, Any] = {"effect_class": o.EffectClass.READ_ONLY, "handler": _echo} | arguments
    effect_class, handler = fields.pop("effect_class"), fields.pop("handler")
    with pytest.raises(DurableOperationError) as raised:
        DurableAction("check", 1, effect_class, handler, **fields)
    assert (raised.value.code, raised.value.field) == ("invalid_action", field)
    assert raised.value.message.startswith(f"action check v1: {field}: "), raised.value.message


def test_an_authorizer_that_answers_no_bool_denies_submission_and_attempt_alike() -> None:
    # A branch that forgot to return answers None: the service took that for a grant and admitted the
    # operation, which the worker, asking the same authorizer, then failed not_authorized.
    def authorize(resolution: Any, value: Any) -> Any:
        if value.get("small"):
            return True
        return None

    world, service, registry = _world(DurableAction("pay", 1, o.EffectClass.READ_ONLY, _echo, authorize=authorize))
    with pytest.raises(DurableOperationError) as raised:
        service.submit(tenant=TENANT, principal=ALICE, action="pay", input={"small": False}, client_key="k1")
    assert raised.value.code == "not_authorized" and "answered None, not True or False" in raised.value.message
    assert world.store.outbox() == []  # nothing was written
    op_id = service.submit(tenant=TENANT, principal=ALICE, action="pay", input={"small": True}, client_key="k2").operation_id
    # The authorizer's answer changes before the attempt (a policy edited since): the worker too denies on None.
    object.__setattr__(registry.get("pay"), "authorize", lambda resolution, value: None)
    report = _worker(world, registry).run_once()
    assert report is not None and report.outcome == "not_authorized", report
    assert "answered None, not True or False" in report.detail, report
    record = service.get(op_id)
    assert record is not None and record.outcome is not None and record.outcome.value == "not_authorized"


@pytest.mark.parametrize("policy", ["may_decide", "may_cancel"])
def test_a_decision_or_cancellation_policy_that_answers_no_bool_refuses(policy: str) -> None:
    # Only an answer of False refused: a policy meant to let only administrators decide, answering None for
    # everyone else, let everyone decide.
    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    service = DurableOperationService(
        world.store, world.actions, world.resolvers, namespace="shop", **{policy: lambda resolution, record: None}
    )
    op_id = service.submit(
        tenant=TENANT, principal=ALICE, action="capture_payment", input={"order": "o-1", "amount": 5}, client_key="k1"
    ).operation_id
    with pytest.raises(DurableOperationError) as raised:
        if policy == "may_decide":
            service.decide(op_id, approver=BOB, approve=True)
        else:
            service.cancel(op_id, principal=ALICE)
    assert raised.value.code == "not_authorized" and "answered None, not True or False" in raised.value.message
    record = service.get(op_id)
    assert record is not None and record.state.value == "awaiting_approval" and record.approval is None


@pytest.mark.parametrize("given", [_coroutine, 5], ids=["async-def", "not-callable"])
@pytest.mark.parametrize("policy", ["may_decide", "may_cancel"])
def test_a_decision_or_cancellation_policy_that_cannot_answer_is_refused_when_the_service_is_made(
    policy: str, given: Any
) -> None:
    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    with pytest.raises(DurableOperationError) as raised:
        DurableOperationService(world.store, world.actions, world.resolvers, **{policy: given})
    assert (raised.value.code, raised.value.field) == ("invalid_request", policy)


@pytest.mark.parametrize(
    ("arguments", "code", "field"),
    [
        ({"approval_id": ""}, "invalid_request", "approval_id"),
        ({"action": "capture_payment"}, "invalid_input", "action"),
        ({"action": ("capture_payment", 1, "extra")}, "invalid_input", "action"),
    ],
    ids=["empty-approval-id", "action-a-name", "action-a-triple"],
)
def test_a_decision_naming_its_id_or_action_malformed_is_one_error_and_writes_nothing(
    arguments: dict[str, Any], code: str, field: str
) -> None:
    # An empty approval id was replaced by a fresh one, so the decision was stored under an id its repeat could
    # never match (decision_conflict); an action given as a name was a bare ValueError.
    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    service = DurableOperationService(world.store, world.actions, world.resolvers, namespace="shop")
    op_id = service.submit(
        tenant=TENANT, principal=ALICE, action="capture_payment", input={"order": "o-1", "amount": 5}, client_key="k1"
    ).operation_id
    with pytest.raises(DurableOperationError) as raised:
        service.decide(op_id, approver=BOB, approve=True, **arguments)
    assert (raised.value.code, raised.value.field) == (code, field), raised.value
    record = service.get(op_id)
    assert record is not None and record.approval is None and len(service.history(op_id)) == 1


@pytest.mark.parametrize(
    "text",
    ["users:v\u00b2:alice", "users:v\u0661:alice", "users:v" + "9" * 5000 + ":alice", 5, "users:1:alice"],
    ids=["superscript-two", "arabic-indic-one", "five-thousand-digits", "an-int", "no-v"],
)
def test_a_reference_that_is_no_resolver_version_subject_is_one_error(text: Any) -> None:
    # str.isdigit() took "²" (then int() raised a bare ValueError) and "١" (read as 1: the reference parsed was
    # not its text); 5000 digits were int()'s own ValueError, an int an AttributeError.
    with pytest.raises(DurableOperationError) as raised:
        PrincipalReference.parse(text)
    assert raised.value.code == "invalid_input" and "is not RESOLVER:vVERSION:SUBJECT" in raised.value.message
    # What reads stored references classifies such a one as unreadable, rather than failing on it.
    assert referenced_versions([("pay", 1, text, 1)]).unreadable_principals == (str(text),)


class _AsyncResolver:
    async def resolve(self, reference: Any) -> Any:
        return None


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (("users", "1", None), "version"),
        (("users", True, None), "version"),
        (("us:ers", 1, None), "name"),
        (("", 1, None), "name"),
        (("users", 1, "directory"), "resolver"),
        (("users", 1, _AsyncResolver()), "resolver"),
    ],
    ids=["version-text", "version-bool", "name-with-colon", "name-empty", "no-resolve", "async-resolve"],
)
def test_a_resolver_that_could_never_be_asked_is_refused_when_it_is_registered(arguments: tuple[Any, ...], field: str) -> None:
    # A version given as text was a key no reference matches, and registered() (so the deployment check) then
    # failed comparing it with the int versions; a resolver without a plain resolve failed closed on everyone.
    name, version, resolver = arguments
    directory = World(MemoryOperationStore(ManualClock()), ManualClock()).directory
    registry = PrincipalResolverRegistry()
    registry.register("users", 2, directory)
    with pytest.raises(DurableOperationError) as raised:
        registry.register(name, version, resolver if resolver is not None else directory)
    assert (raised.value.code, raised.value.field) == ("invalid_request", field)
    assert registry.registered() == [("users", 2)]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [({"retries": -1}, "retries"), ({"retries": "2"}, "retries"), ({"pause": float("nan")}, "pause"), ({"pause": -1}, "pause")],
    ids=["retries-negative", "retries-text", "pause-nan", "pause-negative"],
)
def test_a_resolver_registry_setting_that_cannot_work_is_refused_when_it_is_made(arguments: dict[str, Any], field: str) -> None:
    # retries=-1 skipped the resolver (every principal an unexplained failure); pause=-1 was time.sleep's own
    # ValueError at the first unavailable answer.
    with pytest.raises(DurableOperationError) as raised:
        PrincipalResolverRegistry(**arguments)
    assert (raised.value.code, raised.value.field) == ("invalid_request", field)


def test_an_action_registry_refuses_what_is_no_action() -> None:
    # register("transfer") was AttributeError: 'str' object has no attribute 'name'.
    with pytest.raises(DurableOperationError) as raised:
        DurableActionRegistry(("transfer",))  # type: ignore[arg-type]
    assert (raised.value.code, raised.value.field) == ("invalid_action", "action")


def test_a_principal_still_unavailable_after_the_retries_is_principal_unavailable_for_the_service() -> None:
    # It was not_authorized: authority neither granted nor denied, told as a denial no caller retries.
    world = World(MemoryOperationStore(ManualClock()), ManualClock())
    service = DurableOperationService(world.store, world.actions, world.resolvers, namespace="shop")
    op_id = service.submit(
        tenant=TENANT, principal=ALICE, action="capture_payment", input={"order": "o-1", "amount": 5}, client_key="k1"
    ).operation_id
    world.directory.set("alice", ResolutionStatus.UNAVAILABLE)
    world.directory.set("bob", ResolutionStatus.UNAVAILABLE)
    for attempt in (
        lambda: service.submit(
            tenant=TENANT, principal=ALICE, action="capture_payment", input={"order": "o-2", "amount": 5}, client_key="k2"
        ),
        lambda: service.decide(op_id, approver=BOB, approve=True),
        lambda: service.cancel(op_id, principal=ALICE),
    ):
        with pytest.raises(DurableOperationError) as raised:
            attempt()
        assert (raised.value.code, raised.value.field) == ("principal_unavailable", "principal")
    assert len(world.store.outbox()) == 1  # the first admission's, and nothing since


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: PrincipalReference("", 1, "alice"), "principal.resolver"),
        (lambda: PrincipalReference("users", 1, "al ice"), "principal.subject"),
        (lambda: PrincipalReference("users", 0, "alice"), "principal.version"),
        (lambda: PrincipalReference.parse("alice"), "principal"),
    ],
    ids=["resolver", "subject", "version", "parse"],
)
def test_a_malformed_principal_reference_names_its_field_on_the_error(make: Callable[[], Any], field: str) -> None:
    # The message named it, but the error's field was None: a caller reading DurableOperationError.field, as
    # for every other malformed request, had nothing to go on.
    with pytest.raises(DurableOperationError) as raised:
        make()
    assert (raised.value.code, raised.value.field) == ("invalid_input", field)
