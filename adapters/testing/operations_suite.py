"""Conformance tests every operation store inherits, and a Hypothesis state machine over the service.

Subclass :class:`OperationStoreTests` and provide an ``ops_store_factory``
fixture (a callable taking a :class:`~fencekeeper.adapters.store.ManualClock`
and returning a fresh, empty store that reads its time from it), or name the
factory with the pytest plugin's ``--fencekeeper-operation-store`` and run
``pytest --pyargs fencekeeper.adapters.testing.run_operations_suite``
(docs/conformance.md, The operation store suite).  The tests
go through the Python API (``DurableOperationService``,
``DurableOperationWorker``) and the port, and prove, for that store:

- scoped idempotency: an identical submission is the same Operation, a
  different one under the identity is ``idempotency_conflict`` and writes
  nothing; after the window (once its Operation ended) the identity names a
  new Operation, and pruning forgets only such identities; one principal
  under two versions of its resolver is one identity, submissions racing
  included, and the Operation keeps the reference it was admitted under;
- bad input (unknown action or version, input the normaliser rejects, a
  decision on the wrong input digest, self-approval, an expired approval)
  is one error with a stable code, and nothing is written;
- an atomic transfer's writes commit with the Attempt's success; a handler
  failure leaves the application's tables unchanged;
- an expired owner is replaced automatically (its Attempt recorded
  ``abandoned``) and its late completion is refused ``stale_fence`` with the
  application's tables unchanged;
- cancellation and the effect: whichever commits first wins, the other is
  refused;
- approvals gate claims, bind to the digest, and are consumed once;
- external effects: intent first, one stable effect id, reconciliation
  before any repeat, ``external_outcome_unknown`` instead of a blind resend;
  a provider's conclusive "declined" is recorded, so the retry performs
  again (same effect id) whatever the provider, while a lost reply, a
  timeout or a crash after the intent is never resent unreconciled;
- limits: backoff, maximum attempts, deadline, each a named outcome; an
  issued call left unanswered makes any ending but a success or a
  cancellation ``external_outcome_unknown``, after a look at the provider
  where an Attempt can make one (a payload builder that raises included);
- current authorization: a revoked principal fails closed (after a look at
  an unanswered call, which needs no authority), and gets no Operation back
  by resubmitting its identity;
- (SQL stores, :class:`SqlOperationStoreTests`) an atomic action's
  statements never end, split or leave its transaction: ``COMMIT``,
  ``ROLLBACK``, ``SAVEPOINT``, ``BEGIN``, one behind a comment, two
  statements in one string are refused, and nothing of the action is
  visible after the attempt.

The state machine (:func:`run_operation_state_machine`, one test of every
subclass, ``state_machine_examples`` sequences) drives random
sequences of submissions, claims, completions by current and stale owners,
failures, approvals, cancellations and clock moves, and checks after every
step the invariants of specs/operations.md on what the store shows.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.base import TransactionalOperationStore, Tx
from fencekeeper.adapters.operations.memory import MemoryOperationStore
from fencekeeper.adapters.operations.ports import GuardedContext, OperationStore, StatementRefused
from fencekeeper.adapters.operations.service import (
    DurableAction,
    DurableActionRegistry,
    DurableOperationError,
    DurableOperationService,
    EffectResult,
    EffectStatus,
    PrincipalReference,
    PrincipalResolution,
    PrincipalResolverRegistry,
    ResolutionStatus,
)
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.kernel import operations as o
from fencekeeper.kernel.machines import OperationState

OpsStoreFactory = Callable[[ManualClock], OperationStore]

TENANT = "tenant-a"
ALICE = PrincipalReference("users", 1, "alice")
BOB = PrincipalReference("users", 1, "bob")
ALICE_V2 = PrincipalReference("users", 2, "alice")
"""Alice under the next version of the ``users`` resolver: the same principal (register the version first)."""
LEASE = timedelta(seconds=30)


# --- application tables, whatever the store -----------------------------------------------------


def open_accounts(store: OperationStore, balances: dict[str, int]) -> None:
    if isinstance(store, MemoryOperationStore):
        store.seed_table("app_accounts", balances)
        store.seed_table("app_transfers", {})
        return
    run = getattr(store, "application_execute")  # noqa: B009 - every SQL store has it; the port does not
    for statement in examples.ACCOUNTS_SQL:
        run(statement)
    for account, amount in balances.items():
        run("INSERT INTO app_accounts (account_id, balance) VALUES (?, ?)", (account, amount))


def accounts(store: OperationStore) -> dict[str, int]:
    if isinstance(store, MemoryOperationStore):
        return dict(store.tables().get("app_accounts", {}))
    rows = getattr(store, "application_execute")("SELECT account_id, balance FROM app_accounts")  # noqa: B009
    return {str(r[0]): int(r[1]) for r in rows}


def transfers(store: OperationStore) -> set[str]:
    if isinstance(store, MemoryOperationStore):
        return set(store.tables().get("app_transfers", {}))
    rows = getattr(store, "application_execute")("SELECT operation_id FROM app_transfers")  # noqa: B009
    return {str(r[0]) for r in rows}



def hand_edit(store: OperationStore, operation_id: str, **changes: Any) -> o.Operation:
    """Rewrite an Operation's row as old or hand-edited data may hold it, through the store's own guarded write.

    For states no decision makes (an approval ``decide`` would refuse):
    the stores must still keep every tenant's queue moving when they meet one.
    """
    if not isinstance(store, TransactionalOperationStore):
        pytest.skip("rows are edited through a TransactionalOperationStore's own write")

    def body(tx: Tx) -> o.Outcome:
        before = tx.lock_operation(operation_id)
        assert before is not None
        after = attrs.evolve(before, revision=before.revision + 1, **changes)
        record = o.Transition(
            operation_id, after.revision, None, before.state, after.state, tx.now(), "system:edit", after.fence,
            "edited by hand",
        )
        decision = o.Decision(o.Guard(operation_id, before.revision, before.fence), after, record)
        store._write(tx, decision)
        return decision

    outcome = store._run(body)
    assert isinstance(outcome, o.Decision)
    return outcome.operation


class World:
    """A service, a directory, a provider and workers over one store."""

    def __init__(self, store: OperationStore, clock: ManualClock, *, new_id: Callable[[], str] | None = None) -> None:
        self.store = store
        self.clock = clock
        self.directory = examples.Directory()
        for subject in ("alice", "bob", "carol"):
            self.directory.set(subject, ResolutionStatus.ACTIVE, frozenset({TENANT}))
        self.resolvers = PrincipalResolverRegistry(retries=2, pause=0)
        self.resolvers.register("users", 1, self.directory)
        self.provider = examples.FakePaymentProvider()
        self.adapter = examples.PaymentCaptureAdapter(self.provider)
        self.actions = DurableActionRegistry(
            (
                examples.TRANSFER,
                examples.BALANCE,
                DurableAction(
                    "capture_payment",
                    1,
                    o.EffectClass.EXTERNAL,
                    lambda value: value,
                    normalize=examples.normalize_capture,
                    adapter=self.adapter,
                    requires_approval=True,
                ),
                DurableAction(
                    "capture_unapproved",
                    1,
                    o.EffectClass.EXTERNAL,
                    lambda value: value,
                    normalize=examples.normalize_capture,
                    adapter=self.adapter,
                ),
                DurableAction(
                    "capture_built",
                    1,
                    o.EffectClass.EXTERNAL,
                    self._build_capture,
                    normalize=examples.normalize_capture,
                    adapter=self.adapter,
                ),
            )
        )
        self.build_fails = False
        """Whether ``capture_built``'s payload builder raises (a bug, a lookup that failed) instead of returning."""
        self.service = DurableOperationService(store, self.actions, self.resolvers, namespace="shop", new_id=new_id)

    def _build_capture(self, value: Any) -> Any:
        if self.build_fails:
            raise LookupError("the customer's payment method could not be loaded")
        return value

    def worker(self, name: str) -> DurableOperationWorker:
        return DurableOperationWorker(self.store, self.actions, self.resolvers, tenant=TENANT, worker_id=name, lease=LEASE)

    def transfer(self, key: str, amount: int = 10, source: str = "acc-1", target: str = "acc-2") -> str:
        admission = self.service.submit(
            tenant=TENANT, principal=ALICE, action="transfer", input={"from": source, "to": target, "amount": amount},
            client_key=key,
        )
        return admission.operation_id


class OperationStoreTests:
    """Conformance tests for an operation store.  Subclass it and provide the store factory; nothing else is needed.

    The factory is the ``ops_store_factory`` fixture (override it in the
    subclass), or else the ``fencekeeper_operation_store_factory`` fixture (a
    conftest.py, or the pytest plugin's ``--fencekeeper-operation-store``):
    a callable that takes a :class:`~fencekeeper.adapters.store.ManualClock`
    and returns a fresh, empty store reading its time from it.  As with
    ``StoreTests``, the class name does not start with ``Test``, so pytest
    collects only the subclasses, once per store.  ``state_machine_examples``
    is how many random sequences the service state machine runs.
    """

    state_machine_examples: int = 25

    @pytest.fixture
    def ops_store_factory(self, request: pytest.FixtureRequest) -> OpsStoreFactory:
        """The store under test: override this fixture, or provide ``fencekeeper_operation_store_factory``."""
        try:
            factory: OpsStoreFactory = request.getfixturevalue("fencekeeper_operation_store_factory")
        except pytest.FixtureLookupError:
            raise NotImplementedError(
                "the operation store suite needs a store factory: override the ops_store_factory fixture in the "
                "OperationStoreTests subclass, define a fencekeeper_operation_store_factory fixture (conftest.py), "
                "or run pytest with --fencekeeper-operation-store module:callable (docs/conformance.md)"
            ) from None
        return factory

    def test_a_closed_store_answers_store_unavailable_not_its_drivers_error(self, world: World) -> None:
        # Every store, the in-memory one included: none answers from what it held before close.
        op_id = world.transfer("k1", 10)
        world.store.close()
        for call in (lambda: world.service.get(op_id), lambda: world.transfer("k2", 10), world.worker("w1").run_once,
                     world.store.outbox):
            with pytest.raises(StoreError) as raised:
                call()
            assert raised.value.code == "store_unavailable", raised.value
            # Said as it is: a closed PostgreSQL pool's refusal read "PostgreSQL connection failed".
            assert "is closed" in str(raised.value) and "connection failed" not in str(raised.value), raised.value

    def test_service_state_machine_keeps_the_invariants(self, ops_store_factory: OpsStoreFactory) -> None:
        run_operation_state_machine(ops_store_factory, max_examples=self.state_machine_examples)

    @pytest.fixture
    def clock(self) -> ManualClock:
        return ManualClock()

    @pytest.fixture
    def world(self, ops_store_factory: OpsStoreFactory, clock: ManualClock) -> Iterator[World]:
        store = ops_store_factory(clock)
        open_accounts(store, {"acc-1": 100, "acc-2": 0})
        yield World(store, clock)
        store.close()

    # --- admission ---------------------------------------------------------------------------

    def test_identical_submission_is_the_same_operation(self, world: World) -> None:
        first = world.service.submit(tenant=TENANT, principal=ALICE, action="transfer",
                                     input={"from": "acc-1", "to": "acc-2", "amount": 5}, client_key="k1")
        # Key order and the version default do not matter: the normalised input is the same.
        again = world.service.submit(tenant=TENANT, principal=ALICE, action="transfer",
                                     input={"amount": 5, "to": "acc-2", "from": "acc-1"}, client_key="k1", version=1)
        assert first.created and not again.created
        assert again.operation_id == first.operation_id
        # Another principal with the same key is another identity.
        other = world.service.submit(tenant=TENANT, principal=BOB, action="transfer",
                                     input={"from": "acc-1", "to": "acc-2", "amount": 5}, client_key="k1")
        assert other.created and other.operation_id != first.operation_id

    def test_reuse_with_other_input_is_a_conflict_and_writes_nothing(self, world: World) -> None:
        op_id = world.transfer("k1", 5)
        before = world.store.view(op_id)
        with pytest.raises(DurableOperationError) as raised:
            world.transfer("k1", 6)
        assert raised.value.code == "idempotency_conflict"
        assert "input_digest" in raised.value.message
        assert world.store.view(op_id) == before

    @pytest.mark.parametrize(
        ("action", "version", "payload", "code"),
        [
            ("nope", None, {}, "unknown_action"),
            ("transfer", 7, {"from": "acc-1", "to": "acc-2", "amount": 1}, "unknown_action"),
            ("transfer", None, {"from": "acc-1", "to": "acc-2", "amount": -1}, "invalid_input"),
            ("transfer", None, {"from": "acc-1", "to": "acc-1", "amount": 1}, "invalid_input"),
        ],
    )
    def test_bad_submission_is_one_error_and_writes_nothing(
        self, world: World, action: str, version: int | None, payload: Any, code: str
    ) -> None:
        with pytest.raises(DurableOperationError) as raised:
            world.service.submit(tenant=TENANT, principal=ALICE, action=action, input=payload, client_key="k", version=version)
        assert raised.value.code == code
        assert world.worker("w1").run_once() is None

    # The input as it is: an action without a normaliser of its own, so the numbers and keys reach the digest.
    RECORD = DurableAction("record", 1, o.EffectClass.READ_ONLY, lambda value: {"recorded": value})

    def _recording(self, world: World) -> DurableOperationService:
        actions = DurableActionRegistry((self.RECORD,))
        return DurableOperationService(world.store, actions, world.resolvers, namespace="shop")

    def test_numbers_equal_in_json_are_one_input(self, world: World) -> None:
        # Seed 001, Scoped idempotency: the "normalized semantic input" must match.  A client whose JSON library
        # writes 1.0 as 1 (JavaScript's has no other way) resends the same request, not another one.
        service = self._recording(world)
        written = {"amount": 1.0, "credit": -0.0, "large": 1e20, "rate": 0.5, "lines": [{"qty": 2.0}]}
        first = service.submit(tenant=TENANT, principal=ALICE, action="record", input=written, client_key="k1")
        canonical = '{"amount":1,"credit":0,"large":100000000000000000000,"lines":[{"qty":2}],"rate":0.5}'
        assert world.store.input_of(first.operation_id) == canonical
        assert first.record.input_digest == hashlib.sha256(canonical.encode()).hexdigest()
        for resent in (
            {"amount": 1, "credit": 0, "large": 10**20, "rate": 0.5, "lines": [{"qty": 2}]},
            {"amount": 1.0, "credit": 0.0, "large": 10**20, "rate": 0.5, "lines": [{"qty": 2.0}]},
        ):
            again = service.submit(tenant=TENANT, principal=ALICE, action="record", input=resent, client_key="k1")
            assert (again.operation_id, again.created) == (first.operation_id, False)
        before = world.store.view(first.operation_id)
        with pytest.raises(DurableOperationError) as raised:
            service.submit(tenant=TENANT, principal=ALICE, action="record", input={**written, "rate": 1.5},
                           client_key="k1")
        assert (raised.value.code, raised.value.field) == ("idempotency_conflict", "input_digest")
        assert world.store.view(first.operation_id) == before

    def test_an_operation_admitted_before_numbers_were_canonical_is_found_by_its_faithful_retry(
        self, world: World
    ) -> None:
        # What an earlier release wrote for {"amount": 1.0}: the digest of the number as Python wrote it.
        # Its digest is stored; the retry of the same request after an upgrade is that Operation, not a conflict.
        service = self._recording(world)
        written = '{"amount":1.0,"credit":-0.0}'
        earlier = o.SubmitRequest(
            operation_id="op-earlier",
            identity=o.Identity("shop", TENANT, ALICE.ref, "k-earlier"),
            action_name="record",
            action_version=1,
            effect_class=o.EffectClass.READ_ONLY,
            input_digest=hashlib.sha256(written.encode()).hexdigest(),
            authority=o.Authority(True, ALICE.ref),
        )
        assert isinstance(world.store.submit(earlier, written), o.Decision)
        retry = service.submit(tenant=TENANT, principal=ALICE, action="record",
                               input={"amount": 1.0, "credit": -0.0}, client_key="k-earlier")
        assert (retry.operation_id, retry.created) == ("op-earlier", False)
        assert retry.record.input_digest == earlier.input_digest
        # The other spelling was another digest then, and still is for this Operation (specs/operations.md,
        # "Equal input"): only Operations admitted since compare as JSON values.
        with pytest.raises(DurableOperationError) as raised:
            service.submit(tenant=TENANT, principal=ALICE, action="record", input={"amount": 1, "credit": 0},
                           client_key="k-earlier")
        assert raised.value.code == "idempotency_conflict"
        report = DurableOperationWorker(
            world.store, DurableActionRegistry((self.RECORD,)), world.resolvers, tenant=TENANT, worker_id="w1"
        ).run_once()
        assert report is not None and report.outcome == "succeeded", report

    @pytest.mark.parametrize(
        ("value", "where"),
        [
            ({1: "a"}, "input: key 1 (int)"),
            ({"lines": [{"sku": "x"}, {True: "a"}]}, "input.lines[1]: key True (bool)"),
            ({"by id": {None: 1}}, 'input["by id"]: key None (NoneType)'),
            ({"a": {1: "x", "b": 2}}, "input.a: key 1 (int)"),
        ],
        ids=["int", "bool-in-a-list", "none-under-a-quoted-name", "mixed"],
    )
    def test_an_object_key_that_is_not_a_string_is_refused_naming_where_and_writes_nothing(
        self, world: World, value: Any, where: str
    ) -> None:
        # The encoder would write {1: "a"} as {"1": "a"} without a word: one request for two.
        service = self._recording(world)
        with pytest.raises(DurableOperationError) as raised:
            service.submit(tenant=TENANT, principal=ALICE, action="record", input=value, client_key="k1")
        assert (raised.value.code, raised.value.field) == ("invalid_input", "input")
        assert raised.value.message.startswith(where) and "not a string" in raised.value.message, raised.value
        assert world.store.claim_next(TENANT, "w1", LEASE) is None
        as_text = service.submit(tenant=TENANT, principal=ALICE, action="record", input={"1": "a"}, client_key="k1")
        assert as_text.created

    def test_the_identity_is_free_again_after_its_window(self, world: World) -> None:
        first = world.transfer("k1", 5)
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "succeeded"
        world.clock.advance(timedelta(days=2))
        second = world.transfer("k1", 6)
        assert second != first
        assert world.service.get(first) is not None

    def test_pruning_keeps_identities_for_their_window_and_while_work_is_active(self, world: World) -> None:
        ended = world.transfer("k1", 5)
        world.worker("w1").run_once()
        active = world.transfer("k2", 5)
        assert world.store.prune_identities() == 0
        world.clock.advance(timedelta(days=2))
        assert world.store.prune_identities(limit=10) == 1
        assert world.store.prune_identities() == 0
        # The ended operation stays readable; its key is free again, the active one's is not.
        assert world.service.get(ended) is not None
        assert world.transfer("k1", 6) not in (ended, active)
        assert world.transfer("k2", 5) == active

    def test_a_disabled_principal_cannot_submit(self, world: World) -> None:
        world.directory.set("alice", ResolutionStatus.DISABLED)
        with pytest.raises(DurableOperationError) as raised:
            world.transfer("k1")
        assert raised.value.code == "not_authorized"

    @pytest.mark.parametrize("lost", ["disabled", "revoked", "not_a_member"])
    def test_a_principal_no_longer_authorized_gets_nothing_by_resubmitting(self, world: World, lost: str) -> None:
        # Stored provenance is never permission (seed 001, Current authorization): the identity names
        # alice's Operation, but only an authorized caller may have it back (Durable truth and recovery).
        op_id = world.transfer("k1", 5)
        before = world.store.view(op_id)
        if lost == "not_a_member":
            world.directory.set("alice", ResolutionStatus.ACTIVE, frozenset({"tenant-b"}))
        else:
            world.directory.set("alice", ResolutionStatus(lost))
        refusals = []
        for key, amount in (("k1", 5), ("k1", 6), ("k-new", 5)):  # identical, conflicting, a new identity
            with pytest.raises(DurableOperationError) as raised:
                world.transfer(key, amount)
            refusals.append((raised.value.code, raised.value.message, raised.value.field))
        assert refusals[0][0] == "not_authorized"
        assert refusals[0] == refusals[1] == refusals[2], "the refusal a new submission gets, and nothing more"
        assert op_id not in refusals[0][1]
        assert world.store.view(op_id) == before, "nothing written"
        assert world.worker("w1").run_once() is not None and world.worker("w1").run_once() is None, "no new Operation"
        # Authorized again, the same submission is answered with the same Operation.
        world.directory.set("alice", ResolutionStatus.ACTIVE, frozenset({TENANT}))
        assert world.transfer("k1", 5) == op_id

    # --- a principal's resolver moves to a new version ------------------------------------------

    def test_a_retry_under_a_new_resolver_version_is_the_same_operation(self, world: World) -> None:
        # Seed 001 keys the identity by the *stable* principal reference and expects resolver versions
        # to change while work is in flight: the retry of a payment must not be a second payment.
        asked: list[str] = []
        world.resolvers.register("users", 2, _Recording(world.directory, asked))
        payload = {"from": "acc-1", "to": "acc-2", "amount": 5}
        first = world.service.submit(tenant=TENANT, principal=ALICE, action="transfer", input=payload, client_key="k1")
        again = world.service.submit(tenant=TENANT, principal=ALICE_V2, action="transfer", input=payload,
                                     client_key="k1")
        assert first.created and not again.created
        assert again.operation_id == first.operation_id
        before = world.store.view(first.operation_id)
        assert before is not None and before.operation.identity.principal == ALICE.ref, "its provenance is kept"
        with pytest.raises(DurableOperationError) as raised:
            world.service.submit(tenant=TENANT, principal=ALICE_V2, action="transfer",
                                 input={**payload, "amount": 6}, client_key="k1")
        assert raised.value.code == "idempotency_conflict" and raised.value.field == "input_digest"
        assert world.store.view(first.operation_id) == before
        # Another subject, or another resolver, under the same key is another identity.
        bob = world.service.submit(tenant=TENANT, principal=PrincipalReference("users", 2, "bob"), action="transfer",
                                   input=payload, client_key="k1")
        world.resolvers.register("staff", 1, world.directory)
        staff = world.service.submit(tenant=TENANT, principal=PrincipalReference("staff", 1, "alice"),
                                     action="transfer", input=payload, client_key="k1")
        assert bob.created and staff.created and len({first.operation_id, bob.operation_id, staff.operation_id}) == 3
        # One Operation, run once, resolved under the version it was admitted under.
        asked_at_submission = list(asked)
        reports = [world.worker("w1").run_once() for _ in range(4)]
        assert [r.outcome if r else None for r in reports] == ["succeeded"] * 3 + [None]
        assert accounts(world.store) == {"acc-1": 85, "acc-2": 15}
        resolved = asked[len(asked_at_submission):]
        assert "users:v2:bob" in resolved and ALICE_V2.ref not in resolved, "alice's is resolved as users:v1:alice"

    def test_a_retry_under_a_new_resolver_version_is_asked_for_authority_first(self, world: World) -> None:
        revoked = examples.Directory()
        revoked.set("alice", ResolutionStatus.REVOKED)
        world.resolvers.register("users", 2, revoked)
        op_id = world.transfer("k1", 5)
        before = world.store.view(op_id)
        with pytest.raises(DurableOperationError) as raised:
            world.service.submit(tenant=TENANT, principal=ALICE_V2, action="transfer",
                                 input={"from": "acc-1", "to": "acc-2", "amount": 5}, client_key="k1")
        assert raised.value.code == "not_authorized" and op_id not in raised.value.message
        assert world.store.view(op_id) == before

    def test_concurrent_submissions_under_two_resolver_versions_are_one_operation(self, world: World) -> None:
        world.resolvers.register("users", 2, world.directory)
        principals = [ALICE, ALICE_V2] * 3
        start = threading.Barrier(len(principals))
        answers: list[Any] = []
        errors: list[BaseException] = []

        def submit(principal: PrincipalReference) -> None:
            start.wait(30)
            try:
                answers.append(world.service.submit(
                    tenant=TENANT, principal=principal, action="transfer",
                    input={"from": "acc-1", "to": "acc-2", "amount": 5}, client_key="k-race",
                ))
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=submit, args=(p,)) for p in principals]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == [] and len(answers) == len(principals)
        assert len({a.operation_id for a in answers}) == 1
        assert [a.created for a in answers].count(True) == 1
        assert world.worker("w1").run_once() is not None and world.worker("w1").run_once() is None

    # --- atomic --------------------------------------------------------------------------------

    def test_a_worker_without_the_action_leaves_the_operation_to_one_that_has_it(self, world: World) -> None:
        # An old worker during a rolling deployment, or one deployed without an action, must not use up an
        # Operation's attempts failing it: its claim is not written, and the row is passed over.
        op_id = world.transfer("k1", 30)
        old = DurableOperationWorker(
            world.store, DurableActionRegistry((examples.BALANCE,)), world.resolvers, tenant=TENANT, worker_id="old",
            lease=LEASE,
        )
        report = old.run_once()
        assert report is not None and (report.operation_id, report.outcome) == (op_id, "action_not_registered")
        assert "'transfer' version 1" in report.detail and "no attempt used" in report.detail
        record = world.service.get(op_id)
        assert record is not None
        assert (record.state, record.attempt_count, record.attempts) == (OperationState.ADMITTED, 0, ())
        assert [line.to_state for line in world.service.history(op_id)] == ["admitted"]
        assert old.run_once() is None  # passed over, not refused again at once
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "succeeded"
        record = world.service.get(op_id)
        assert record is not None and [(a.number, a.worker_id) for a in record.attempts] == [(1, "w1")]

    def test_atomic_transfer_commits_with_the_attempt(self, world: World) -> None:
        op_id = world.transfer("k1", 30)
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "succeeded"
        assert accounts(world.store) == {"acc-1": 70, "acc-2": 30}
        assert transfers(world.store) == {op_id}
        record = world.service.get(op_id)
        assert record is not None
        assert (record.state, record.outcome, record.result) == (
            OperationState.SUCCEEDED, o.TerminalOutcome.SUCCEEDED, {"from_balance": 70, "to_balance": 30},
        )
        assert [a.state for a in record.attempts] == ["succeeded"]
        assert [line.to_state for line in world.service.history(op_id)] == ["admitted", "running", "succeeded"]
        # One outbox message per transition, in order, each named by the revision it made.
        messages = [m for m in world.store.outbox() if m.operation_id == op_id]
        assert [m.topic for m in messages] == ["operation.admitted", "operation.running", "operation.succeeded"]
        assert [m.message_id for m in messages] == [f"{op_id}/1", f"{op_id}/2", f"{op_id}/3"]

    def test_a_failing_handler_leaves_the_tables_unchanged(self, world: World) -> None:
        op_id = world.transfer("k1", 500)
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "action_failed"
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        record = world.service.get(op_id)
        assert record is not None and record.error_code == "insufficient_funds"

    @pytest.mark.parametrize("effect", [o.EffectClass.ATOMIC, o.EffectClass.READ_ONLY])
    def test_a_result_that_is_not_json_fails_the_attempt_and_not_the_worker(
        self, world: World, effect: o.EffectClass
    ) -> None:
        op_id = world.transfer("k1", 10)

        def atomic(context: GuardedContext, value: Any) -> Any:
            examples.transfer(context, value)
            return {"moved": float("nan")}

        handler = atomic if effect is o.EffectClass.ATOMIC else (lambda value: {"accounts": {value["from"]}})
        actions = DurableActionRegistry((DurableAction("transfer", 1, effect, handler),))
        worker = DurableOperationWorker(
            world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=LEASE
        )
        report = worker.run_once()
        assert report is not None and report.outcome == "retry" and "result: not JSON" in report.detail, report
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.ADMITTED
        assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]

    def test_an_expired_owner_is_replaced_and_its_commit_refused(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        claim = world.store.claim_next(TENANT, "zombie", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        world.clock.advance(LEASE)
        report = world.worker("w2").run_once()
        assert report is not None and (report.outcome, report.attempt) == ("succeeded", 2)
        record = world.service.get(op_id)
        assert record is not None
        assert [(a.number, a.worker_id, a.state) for a in record.attempts] == [
            (1, "zombie", "abandoned"), (2, "w2", "succeeded"),
        ]
        ran: list[str] = []

        def write(context: GuardedContext) -> str:
            ran.append("ran")
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})
            return "null"

        late = world.store.complete(o.CompleteRequest(claim.credential, o.Authority(True, ALICE.ref)), write)
        assert isinstance(late, o.Refusal) and late.code is o.RefusalCode.STALE_FENCE
        assert ran == []
        assert accounts(world.store) == {"acc-1": 90, "acc-2": 10}
        for stale in (
            world.store.heartbeat(o.HeartbeatRequest(claim.credential, LEASE)),
            world.store.fail(o.FailRequest(claim.credential, "boom", retryable=True)),
        ):
            assert isinstance(stale, o.Refusal) and stale.code is o.RefusalCode.STALE_FENCE

    def test_the_guarded_context_refuses_use_after_its_transaction(self, world: World) -> None:
        world.transfer("k1", 10)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        kept: list[GuardedContext] = []

        def write(context: GuardedContext) -> str:
            kept.append(context)
            return "null"

        assert isinstance(world.store.complete(o.CompleteRequest(claim.credential, o.Authority(True, ALICE.ref)), write), o.Decision)
        from fencekeeper.adapters.operations.ports import StaleContext  # noqa: PLC0415

        with pytest.raises(StaleContext):
            if kept[0].dialect == "memory":
                kept[0].tables["x"] = {}
            else:
                kept[0].execute("SELECT 1")

    def test_a_lease_that_expires_during_the_action_refuses_the_commit(self, world: World) -> None:
        world.transfer("k1", 10)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None

        def slow(context: GuardedContext) -> str:
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})
            world.clock.advance(LEASE)
            return "null"

        outcome = world.store.complete(o.CompleteRequest(claim.credential, o.Authority(True, ALICE.ref)), slow)
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.LEASE_EXPIRED
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}

    def test_an_action_for_an_operation_that_is_not_atomic_is_refused_before_it_runs(self, world: World) -> None:
        """Only an atomic Operation's completion runs an action in the store's transaction (operations.md, Effect
        classes): a read-only one's writes would otherwise commit with its success."""
        op_id = world.service.submit(
            tenant=TENANT, principal=ALICE, action="balance", input={"account": "acc-1"}, client_key="b1"
        ).operation_id
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        before = world.store.view(op_id)
        ran: list[str] = []

        def writes(context: GuardedContext) -> str:
            ran.append("ran")
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})
            return "null"

        outcome = world.store.complete(o.CompleteRequest(claim.credential, o.Authority(True, ALICE.ref)), writes)
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.WRONG_EFFECT_CLASS, outcome
        assert ran == [] and accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        assert world.store.view(op_id) == before

    # --- cancellation ---------------------------------------------------------------------------

    def test_cancel_first_refuses_the_effect(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        record = world.service.cancel(op_id, principal=ALICE, reason="customer asked")
        assert record.state is OperationState.CANCELLED
        assert [a.state for a in record.attempts] == ["cancelled"]
        late = world.store.complete(
            o.CompleteRequest(claim.credential, o.Authority(True, ALICE.ref)),
            lambda c: str(examples.transfer(c, {"from": "acc-1", "to": "acc-2", "amount": 10}) and "null"),
        )
        assert isinstance(late, o.Refusal) and late.code is o.RefusalCode.NOT_RUNNING
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        assert world.service.cancel(op_id, principal=ALICE).state is OperationState.CANCELLED

    def test_effect_first_makes_cancel_too_late(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        world.worker("w1").run_once()
        with pytest.raises(DurableOperationError) as raised:
            world.service.cancel(op_id, principal=ALICE)
        assert raised.value.code == "cancel_too_late"
        assert accounts(world.store) == {"acc-1": 90, "acc-2": 10}

    def test_only_the_requester_may_cancel(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        with pytest.raises(DurableOperationError) as raised:
            world.service.cancel(op_id, principal=BOB)
        assert raised.value.code == "not_authorized"
        # The requester under the next version of their resolver is the requester still.
        world.resolvers.register("users", 2, world.directory)
        with pytest.raises(DurableOperationError) as raised:
            world.service.cancel(op_id, principal=PrincipalReference("users", 2, "bob"))
        assert raised.value.code == "not_authorized"
        cancelled = world.service.cancel(op_id, principal=ALICE_V2)
        assert cancelled.state is OperationState.CANCELLED and cancelled.principal == ALICE.ref

    # --- approvals and external effects -----------------------------------------------------------

    def _capture(self, world: World, key: str = "c1", action: str = "capture_payment") -> str:
        return world.service.submit(
            tenant=TENANT, principal=ALICE, action=action, input={"order": "o-1", "amount": 2500}, client_key=key
        ).operation_id

    def test_approval_gates_binds_and_is_consumed_once(self, world: World) -> None:
        op_id = self._capture(world)
        assert world.worker("w1").run_once() is None
        for approver, digest, code in (
            (ALICE, None, "self_approval"),
            (BOB, "0" * 64, "approval_misbound"),
        ):
            with pytest.raises(DurableOperationError) as raised:
                world.service.decide(op_id, approver=approver, approve=True, input_digest=digest)
            assert raised.value.code == code
        with pytest.raises(DurableOperationError) as raised:
            world.service.decide(op_id, approver=BOB, approve=True, expires_at=world.clock.now())
        assert raised.value.code == "approval_expired"
        record = world.service.decide(op_id, approver=BOB, approve=True, approval_id="ap-1")
        assert record.state is OperationState.ADMITTED and record.approved_by == BOB.ref
        assert world.service.decide(op_id, approver=BOB, approve=True, approval_id="ap-1").state is OperationState.ADMITTED
        with pytest.raises(DurableOperationError) as raised:
            world.service.decide(op_id, approver=BOB, approve=False, approval_id="ap-2")
        assert raised.value.code == "decision_conflict"
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "succeeded"
        assert world.provider.calls == [f"{op_id}/effect"]

    @pytest.mark.parametrize(
        "flaw",
        [
            {"approver": ALICE.ref},  # the requester approving their own Operation
            {"approver": "users:v2:alice"},  # ... under another version of their resolver
            {"input_digest": "0" * 64},
            {"operation_id": "another-operation"},
        ],
        ids=["self_approval", "self_approval_other_version", "other_input", "other_operation"],
    )
    def test_an_approval_that_can_never_be_used_ends_its_operation_and_the_queue_moves_on(
        self, world: World, flaw: dict[str, Any]
    ) -> None:
        """``decide`` never stores such an approval, but old or hand-edited rows may hold one.

        The claim that finds it ends the Operation ``approval_misbound`` (a
        transition and its outbox row like any end), so the tenant's next
        Operation is claimed instead of the same refused row forever.
        """
        op_id = self._capture(world)
        world.service.decide(op_id, approver=BOB, approve=True, approval_id="ap-1")
        stored = world.store.get(op_id)
        assert stored is not None and stored.approval is not None
        hand_edit(world.store, op_id, approval=attrs.evolve(stored.approval, **flaw))
        world.clock.advance(timedelta(seconds=1))
        behind = world.transfer("k-behind", 10)
        reports = world.worker("w1").run_until_idle(limit=5)
        assert [(r.operation_id, r.outcome) for r in reports] == [
            (op_id, "approval_misbound"), (behind, "succeeded")
        ]
        ended = world.store.get(op_id)
        assert ended is not None and ended.state is OperationState.FAILED
        assert (ended.outcome, ended.error_code, ended.attempt_count) == (
            o.TerminalOutcome.APPROVAL_MISBOUND, "approval_misbound", 0
        )
        assert world.provider.calls == []
        last = world.service.history(op_id)[-1]
        assert (last.event, last.to_state) == ("approval_misbound", "failed")
        assert f"{op_id}/{ended.revision}" in {m.message_id for m in world.store.outbox(limit=1000)}
        assert accounts(world.store) == {"acc-1": 90, "acc-2": 10}

    def test_a_claim_refused_anyway_is_reported_once_and_the_rest_of_the_queue_runs(
        self, world: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A row the store finds due and the kernel refuses (it never does for a row ``due`` reports due: here it is
        made to, for one Operation) does not stall its tenant: the worker reports it once, passes over it while
        the rest of the queue runs, and tries it again after its pause."""
        stuck = world.transfer("k-stuck", 1)
        world.clock.advance(timedelta(seconds=1))
        behind = [world.transfer(f"k-behind-{n}", 1) for n in range(2)]
        claim = o.claim

        def refusing(operation: o.Operation | None, request: o.ClaimRequest, now: Any) -> o.Outcome:
            if operation is not None and operation.operation_id == stuck:
                return o.Refusal(o.RefusalCode.NOT_ELIGIBLE, "the row and the kernel disagree")
            return claim(operation, request, now)

        monkeypatch.setattr(o, "claim", refusing)
        before = world.store.view(stuck)
        worker = world.worker("w1")
        reports = worker.run_until_idle(limit=20)
        assert (reports[0].operation_id, reports[0].outcome) == (stuck, "not_eligible")
        assert sorted((r.operation_id, r.outcome) for r in reports[1:]) == sorted((b, "succeeded") for b in behind)
        assert stuck in reports[0].detail and "passed over until" in reports[0].detail
        assert worker.run_until_idle(limit=20) == []  # neither spinning on it nor reporting it again
        world.clock.advance(LEASE)
        assert worker.run_until_idle(limit=20) == []  # refused again after its pause: passed over, silently
        assert world.store.view(stuck) == before  # every refusal wrote nothing
        monkeypatch.undo()
        world.clock.advance(2 * LEASE)
        reports = worker.run_until_idle(limit=20)
        assert [(r.operation_id, r.outcome) for r in reports] == [(stuck, "succeeded")]
        assert accounts(world.store) == {"acc-1": 97, "acc-2": 3}

    def test_lost_reply_is_reconciled_not_resent(self, world: World) -> None:
        op_id = self._capture(world, action="capture_unapproved")
        world.provider.mode = "lost_reply"
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "succeeded"
        assert world.provider.calls == [f"{op_id}/effect"]
        assert world.provider.captures == {f"{op_id}/effect": 2500}

    def test_unreconcilable_ambiguity_is_external_outcome_unknown(self, world: World) -> None:
        world.adapter.reconcilable = False
        world.adapter.idempotent = False
        op_id = self._capture(world, action="capture_unapproved")
        world.provider.mode = "timeout"
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "external_outcome_unknown"
        world.clock.advance(timedelta(hours=2))
        assert world.worker("w2").run_once() is None
        assert len(world.provider.calls) == 1
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.OUTCOME_UNKNOWN

    @pytest.mark.parametrize(
        ("reconcilable", "outcome"), [(True, "succeeded"), (False, "external_outcome_unknown")],
        ids=["reconcilable", "neither"],
    )  # fmt: skip
    def test_an_adapter_that_raises_is_an_ambiguous_answer_reconciled_at_once(
        self, world: World, reconcilable: bool, outcome: str
    ) -> None:
        # The provider applies the capture, then the adapter raises (a reset connection): an ambiguous
        # answer like a lost reply, reconciled by this Attempt, not left to a retry as a handler error.
        world.adapter.idempotent, world.adapter.reconcilable = False, reconcilable
        op_id = self._capture(world, action="capture_unapproved")
        original = world.provider.capture

        def reset_after_capture(key: str, amount: int) -> str:
            original(key, amount)
            raise ConnectionResetError("connection reset by peer")

        world.provider.capture = reset_after_capture  # type: ignore[method-assign]
        report = world.worker("w1").run_once()
        assert report is not None and (report.outcome, report.attempt) == (outcome, 1), report
        assert world.provider.calls == [f"{op_id}/effect"]
        record = world.service.get(op_id)
        assert record is not None and record.attempt_count == 1 and record.outcome is o.TerminalOutcome(outcome)

    @pytest.mark.parametrize(
        ("answer", "returned"),
        [
            ({"status": "succeeded"}, "perform returned dict, not an EffectResult"),
            (None, "perform returned None, not an EffectResult"),
            (EffectResult("succeeded"), "perform returned an EffectResult whose status is 'succeeded'"),  # type: ignore[arg-type]
            (EffectResult(EffectStatus.FAILED, retryable="yes"), "whose retryable is 'yes', not True or False"),  # type: ignore[arg-type]
        ],
        ids=["dict", "none", "status-text", "retryable-text"],
    )
    def test_an_adapter_answer_that_is_no_effect_result_is_a_handler_error_naming_it(
        self, world: World, answer: Any, returned: str
    ) -> None:
        # Read unchecked, a dict was "AttributeError: 'dict' object has no attribute 'status'", a status
        # written as text was taken for an ambiguous answer, and a retryable that is no bool a failure the
        # kernel refused to record, the Attempt left running until its lease ran out.
        adapter = _Answering(answer)
        actions = DurableActionRegistry(
            (DurableAction("notify", 1, o.EffectClass.EXTERNAL, lambda value: value, adapter=adapter),)
        )
        service = DurableOperationService(world.store, actions, world.resolvers, namespace="shop")
        op_id = service.submit(tenant=TENANT, principal=ALICE, action="notify", input={"to": "a"}, client_key="n1")
        worker = DurableOperationWorker(world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1")
        report = worker.run_once()
        assert report is not None and report.outcome == "retry", report
        assert report.detail.startswith("TypeError: action 'notify' v1: the adapter's ") and returned in report.detail
        record = service.get(op_id.operation_id)
        assert record is not None and record.state is OperationState.ADMITTED
        assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]
        # The call was made and its answer is unknown: the next Attempt reconciles before anything is repeated,
        # and a reconcile answer that is no EffectResult (nor None) is named the same way.
        adapter.reconciled = "done"
        world.clock.advance(timedelta(minutes=1))
        report = worker.run_once()
        assert report is not None and report.outcome == "retry", report
        assert "the adapter's reconcile returned str, not an EffectResult or None" in report.detail
        assert adapter.performed == 1

    def test_a_call_not_found_at_once_after_a_timeout_is_looked_up_again_before_any_repeat(
        self, world: World
    ) -> None:
        """A lookup right after an ambiguous answer that finds nothing is no answer to the call (operations.md, An
        Attempt, step by step): the call may still land, so the Attempt's failure leaves the effect unsettled and
        the next Attempt reconciles before it performs.  Recorded as the provider's "not applied", the next Attempt
        would capture again, and a provider that does not deduplicate would be charged twice."""
        world.adapter.idempotent = False
        op_id = self._capture(world, action="capture_unapproved")
        effect_id = f"{op_id}/effect"
        world.provider.mode = "timeout"
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "retry", report
        operation = world.store.get(op_id)
        assert operation is not None and o.effect_plan(operation) is o.EffectPlan.RECONCILE
        # The call that timed out lands at the provider after all.
        world.provider.captures[effect_id] = 2500
        world.provider.mode = "ok"
        world.clock.advance(timedelta(minutes=1))
        report = world.worker("w2").run_once()
        assert report is not None and report.outcome == "succeeded", report
        assert world.provider.calls == [effect_id]

    def test_a_replacement_reconciles_before_performing_with_the_same_effect_id(self, world: World) -> None:
        op_id = self._capture(world, action="capture_unapproved")
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        intent = world.store.record_intent(o.IntentRequest(claim.credential))
        assert isinstance(intent, o.Decision)
        # w1 dies here, before or after calling the provider: nobody knows.
        world.clock.advance(LEASE)
        report = world.worker("w2").run_once()
        assert report is not None and report.outcome == "succeeded"
        assert world.provider.calls == [f"{op_id}/effect"]

    def test_an_attempt_replaced_while_it_reconciles_does_not_perform(self, world: World) -> None:
        # Seed 001: once fence N+1 owns the Operation, N may not retry.  Attempt 2 looks the
        # effect up (not found); while it waits for the answer its lease runs out and attempt 3
        # replaces it, finds nothing, performs and succeeds.  Attempt 2 must not perform on its
        # stale look: a provider that neither deduplicates would apply the effect twice.
        world.adapter.idempotent = False
        op_id = self._capture(world, action="capture_unapproved")
        effect_id = f"{op_id}/effect"
        first = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(first, o.Decision) and first.credential is not None
        assert isinstance(world.store.record_intent(o.IntentRequest(first.credential)), o.Decision)
        world.clock.advance(LEASE)  # attempt 1 died after its intent: its issue is unanswered
        lookup = world.provider.lookup
        replacement: list[Any] = []

        def stalled_lookup(key: str) -> int | None:
            answer = lookup(key)
            if not replacement:
                replacement.append(None)
                world.clock.advance(LEASE)
                replacement[0] = world.worker("w3").run_once()
            return answer

        world.provider.lookup = stalled_lookup  # type: ignore[method-assign]
        report = world.worker("w2").run_once()
        assert replacement[0] is not None and replacement[0].outcome == "succeeded", replacement
        assert report is not None and report.outcome == "stale_fence", report
        assert world.provider.calls == [effect_id]
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.SUCCEEDED

    def test_a_payload_that_cannot_be_built_leaves_no_effect_to_reconcile(self, world: World) -> None:
        # The payload is built before the intent commits: a builder that raises has issued
        # nothing, so even a provider that neither deduplicates nor reconciles is called on the
        # retry, once, instead of the operation ending external_outcome_unknown.
        world.adapter.idempotent = world.adapter.reconcilable = False
        op_id = self._capture(world, action="capture_built")
        world.build_fails = True
        first = world.worker("w1").run_once()
        assert first is not None and first.outcome == "retry" and "LookupError" in first.detail, first
        stored = world.store.get(op_id)
        assert stored is not None and stored.effect_unsettled_since is None
        assert o.effect_plan(stored) is o.EffectPlan.PERFORM
        assert world.provider.calls == []
        world.build_fails = False
        world.clock.advance(timedelta(minutes=1))
        second = world.worker("w2").run_once()
        assert second is not None and second.outcome == "succeeded", second
        assert world.provider.calls == [f"{op_id}/effect"]

    @pytest.mark.parametrize("idempotent, reconcilable", [(True, True), (False, False)], ids=["idempotent", "neither"])
    def test_a_declined_capture_is_performed_again_with_the_same_effect_id(
        self, world: World, idempotent: bool, reconcilable: bool
    ) -> None:
        world.adapter.idempotent, world.adapter.reconcilable = idempotent, reconcilable
        op_id = self._capture(world, action="capture_unapproved")
        effect_id = f"{op_id}/effect"
        world.provider.mode = "declined"
        first = world.worker("w1").run_once()
        assert first is not None and first.outcome == "retry"
        stored = world.store.get(op_id)
        # The answer is durable: the effect is known not applied, so nothing is ambiguous.
        assert stored is not None and stored.effect_id == effect_id and stored.effect_unsettled_since is None
        assert o.effect_plan(stored) is o.EffectPlan.PERFORM
        world.provider.mode = "ok"
        world.clock.advance(timedelta(minutes=1))
        second = world.worker("w2").run_once()
        assert second is not None and second.outcome == "succeeded", second
        assert world.provider.calls == [effect_id, effect_id]
        assert world.provider.captures == {effect_id: 2500}
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.SUCCEEDED

    @pytest.mark.parametrize("failure", ["lost_reply", "timeout", "crash_after_intent", "declined_then_lost_reply"])
    def test_an_unanswered_capture_of_an_unreconcilable_provider_is_never_resent(
        self, world: World, failure: str
    ) -> None:
        world.adapter.idempotent = world.adapter.reconcilable = False
        op_id = self._capture(world, action="capture_unapproved")
        calls = 1
        if failure == "crash_after_intent":
            claim = world.store.claim_next(TENANT, "w1", LEASE)
            assert isinstance(claim, o.Decision) and claim.credential is not None
            assert isinstance(world.store.record_intent(o.IntentRequest(claim.credential)), o.Decision)
            # w1 dies here, before or after calling the provider: nobody knows.
            world.clock.advance(LEASE)
            calls = 0
        else:
            if failure == "declined_then_lost_reply":
                world.provider.mode = "declined"
                report = world.worker("w1").run_once()
                assert report is not None and report.outcome == "retry"
                world.clock.advance(timedelta(minutes=1))
                calls = 2
            world.provider.mode = failure.removeprefix("declined_then_")
        report = world.worker("w2").run_once()
        assert report is not None and report.outcome == "external_outcome_unknown", report
        world.clock.advance(timedelta(hours=2))
        assert world.worker("w3").run_once() is None
        assert world.provider.calls == [f"{op_id}/effect"] * calls
        stored = world.store.get(op_id)
        assert stored is not None and stored.effect_unsettled_since is not None
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.OUTCOME_UNKNOWN

    # --- limits and authorization -------------------------------------------------------------------

    def test_retries_back_off_then_end_with_max_attempts_exceeded(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        world.directory.set("alice", ResolutionStatus.UNAVAILABLE)
        reports = []
        for _ in range(5):
            reports.append(world.worker("w1").run_once())
            world.clock.advance(timedelta(minutes=10))
        outcomes = [r.outcome for r in reports if r is not None]
        assert outcomes == ["retry", "retry", "max_attempts_exceeded"]
        record = world.service.get(op_id)
        assert record is not None and record.attempt_count == 3
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}

    def test_a_revoked_principal_fails_closed(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        world.directory.set("alice", ResolutionStatus.REVOKED)
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "not_authorized"
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        record = world.service.get(op_id)
        assert record is not None and record.attempt_count == 1

    def test_past_the_deadline_the_claim_ends_it(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        world.clock.advance(timedelta(hours=2))
        report = world.worker("w1").run_once()
        assert report is not None and (report.outcome, report.attempt) == ("deadline_exceeded", None)
        record = world.service.get(op_id)
        assert record is not None and record.attempt_count == 0

    # --- the overall deadline and effects (specs/operations.md, "The overall deadline and effects") ------------

    @staticmethod
    def _to_the_deadline_less(world: World, op_id: str, before: timedelta) -> datetime:
        """Move the clock to ``before`` ahead of the Operation's deadline; the deadline."""
        record = world.service.get(op_id)
        assert record is not None
        world.clock.advance(record.deadline - before - world.clock.now())
        return record.deadline

    @staticmethod
    def _past_the_deadline(world: World) -> None:
        """From half a lease before the deadline: past it, the lease claimed then still live."""
        world.clock.advance(LEASE / 4 * 3)

    def test_an_atomic_action_reached_past_the_deadline_commits_nothing_and_ends_deadline_exceeded(
        self, world: World
    ) -> None:
        op_id = world.transfer("k1", 10)
        self._to_the_deadline_less(world, op_id, LEASE / 2)
        worker = world.worker("w1")
        # Claimed before the deadline under a lease that outlives it; the action is reached after it.
        worker.before_effect = lambda operation: self._past_the_deadline(world)
        report = worker.run_once()
        assert report is not None and (report.outcome, report.attempt) == ("deadline_exceeded", 1), report
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0} and transfers(world.store) == set()
        record = world.service.get(op_id)
        assert record is not None and (record.state, record.outcome) == (
            OperationState.FAILED, o.TerminalOutcome.DEADLINE_EXCEEDED,
        )
        assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "deadline_exceeded")]

    def test_an_atomic_action_that_runs_across_the_deadline_commits_nothing(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        deadline = self._to_the_deadline_less(world, op_id, LEASE / 2)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        assert claim.operation.lease_expires_at is not None and claim.operation.lease_expires_at > deadline

        def slow(context: GuardedContext) -> str:
            examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})
            world.clock.advance(LEASE / 4 * 3)  # past the deadline, the lease still live
            return "null"

        before = world.store.view(op_id)
        outcome = world.store.complete(o.CompleteRequest(claim.credential, o.Authority(True, ALICE.ref)), slow)
        assert isinstance(outcome, o.Refusal) and outcome.code is o.RefusalCode.DEADLINE_EXCEEDED, outcome
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0} and transfers(world.store) == set()
        assert world.store.view(op_id) == before
        # The owner's retryable failure from the deadline on ends the Operation by the deadline.
        ended = world.store.fail(o.FailRequest(claim.credential, "deadline_exceeded", retryable=True))
        assert isinstance(ended, o.Decision) and ended.operation.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED

    def test_an_external_intent_past_the_deadline_is_refused_and_the_provider_never_called(
        self, world: World
    ) -> None:
        op_id = self._capture(world, action="capture_unapproved")
        self._to_the_deadline_less(world, op_id, LEASE / 2)
        worker = world.worker("w1")
        worker.before_effect = lambda operation: self._past_the_deadline(world)
        report = worker.run_once()
        assert report is not None and (report.outcome, report.attempt) == ("deadline_exceeded", 1), report
        assert world.provider.calls == [] and world.provider.captures == {}
        record = world.service.get(op_id)
        assert record is not None and record.outcome is o.TerminalOutcome.DEADLINE_EXCEEDED
        assert record.effect_id is None  # no intent was written
        assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "deadline_exceeded")]

    def test_past_the_deadline_an_earlier_attempts_applied_call_is_reconciled_not_lost(self, world: World) -> None:
        op_id = self._capture(world, action="capture_unapproved")
        self._to_the_deadline_less(world, op_id, 2 * LEASE)
        zombie = world.store.claim_next(TENANT, "w0", LEASE)
        assert isinstance(zombie, o.Decision) and zombie.credential is not None
        assert isinstance(world.store.record_intent(o.IntentRequest(zombie.credential)), o.Decision)
        world.provider.capture(f"{op_id}/effect", 2500)  # applied; its reply never recorded
        world.clock.advance(LEASE * 3 / 2)  # w0's lease ran out; half a lease before the deadline
        worker = world.worker("w1")
        worker.before_effect = lambda operation: self._past_the_deadline(world)
        report = worker.run_once()
        assert report is not None and (report.outcome, report.attempt) == ("succeeded", 2), report
        assert world.provider.calls == [f"{op_id}/effect"]  # looked up, never called again
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.SUCCEEDED
        assert [(a.number, a.state) for a in record.attempts] == [(1, "abandoned"), (2, "succeeded")]

    def _issued_then_abandoned_across_the_deadline(self, world: World, *, applied: bool) -> str:
        """w0 records its intent before the deadline (its call applied, or never made) and is lost; past the
        deadline and past w0's lease, whatever happened there is still unanswered."""
        op_id = self._capture(world, action="capture_unapproved")
        self._to_the_deadline_less(world, op_id, 2 * LEASE)
        zombie = world.store.claim_next(TENANT, "w0", LEASE)
        assert isinstance(zombie, o.Decision) and zombie.credential is not None
        assert isinstance(world.store.record_intent(o.IntentRequest(zombie.credential)), o.Decision)
        if applied:
            world.provider.capture(f"{op_id}/effect", 2500)  # applied; its reply never recorded
        world.clock.advance(LEASE * 5 / 2)  # past w0's lease and half a lease past the deadline
        return op_id

    def test_an_unanswered_call_past_the_deadline_is_looked_up_and_its_success_recorded(self, world: World) -> None:
        op_id = self._issued_then_abandoned_across_the_deadline(world, applied=True)
        report = world.worker("w1").run_once()
        assert report is not None and (report.outcome, report.attempt) == ("succeeded", 2), report
        assert world.provider.calls == [f"{op_id}/effect"]  # looked up, never called again
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.SUCCEEDED
        assert [(a.number, a.state) for a in record.attempts] == [(1, "abandoned"), (2, "succeeded")]
        claimed = world.service.history(op_id)[-2]
        assert (claimed.event, claimed.attempt) == ("reclaim_expired", 2)
        assert "never answered" in claimed.reason and "may only ask the provider" in claimed.reason

    def test_an_unanswered_call_the_provider_cannot_place_ends_outcome_unknown_not_deadline_exceeded(
        self, world: World
    ) -> None:
        op_id = self._issued_then_abandoned_across_the_deadline(world, applied=False)
        report = world.worker("w1").run_once()
        assert report is not None and (report.outcome, report.attempt) == ("external_outcome_unknown", 2), report
        assert world.provider.calls == []  # looked up only: nothing is called past the deadline
        record = world.service.get(op_id)
        assert record is not None and (record.state, record.outcome) == (
            OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN,
        )
        assert [(a.number, a.state) for a in record.attempts] == [(1, "abandoned"), (2, "outcome_unknown")]
        assert "never answered" in world.service.history(op_id)[-1].reason

    def test_a_retryable_failure_past_the_deadline_with_its_call_unanswered_ends_outcome_unknown(
        self, world: World
    ) -> None:
        op_id = self._capture(world, action="capture_unapproved")
        self._to_the_deadline_less(world, op_id, LEASE / 2)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        assert isinstance(world.store.record_intent(o.IntentRequest(claim.credential)), o.Decision)
        self._past_the_deadline(world)  # the call timed out; the lease is still live
        ended = world.store.fail(o.FailRequest(claim.credential, "effect_ambiguous", retryable=True))
        assert isinstance(ended, o.Decision), ended
        assert (ended.operation.state, ended.operation.outcome) == (
            OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN,
        )
        assert ended.operation.effect_unsettled_since == 1
        last = world.service.history(op_id)[-1]
        assert last.event == "outcome_unknown" and "never answered" in last.reason

    # --- every other ending with an issued call unanswered (specs/operations.md, "Endings with a call unanswered")

    @staticmethod
    def _recorded_lookups(world: World) -> list[str]:
        """The keys the provider is looked up by from now on, in order (it still answers as before)."""
        lookups: list[str] = []
        lookup = world.provider.lookup

        def recorded_lookup(key: str) -> int | None:
            lookups.append(key)
            return lookup(key)

        world.provider.lookup = recorded_lookup  # type: ignore[method-assign]
        return lookups

    def _issued_by_a_lost_attempt(
        self, world: World, *, left: int | None = None, applied: bool, action: str = "capture_unapproved"
    ) -> str:
        """Attempts fail retryably; then one records its intent (its call applied, or never made) and is lost, its
        lease run out, with ``left`` Attempts left after it (None: it is the first)."""
        op_id = self._capture(world, action=action)
        record = world.service.get(op_id)
        assert record is not None
        for _ in range(0 if left is None else record.maximum_attempts - left - 1):
            claim = world.store.claim_next(TENANT, "w0", LEASE)
            assert isinstance(claim, o.Decision) and claim.credential is not None
            assert isinstance(world.store.fail(o.FailRequest(claim.credential, "busy", retryable=True)), o.Decision)
            world.clock.advance(timedelta(minutes=1))
        zombie = world.store.claim_next(TENANT, "w0", LEASE)
        assert isinstance(zombie, o.Decision) and zombie.credential is not None
        assert isinstance(world.store.record_intent(o.IntentRequest(zombie.credential)), o.Decision)
        if applied:
            world.provider.capture(f"{op_id}/effect", 2500)  # applied; its reply never recorded
        world.clock.advance(LEASE)
        return op_id

    def _ended_unknown(self, world: World, op_id: str, error_code: str) -> None:
        record = world.service.get(op_id)
        assert record is not None and (record.state, record.outcome, record.error_code) == (
            OperationState.OUTCOME_UNKNOWN, o.TerminalOutcome.EXTERNAL_OUTCOME_UNKNOWN, error_code,
        ), record
        last = world.service.history(op_id)[-1]
        assert last.event == "outcome_unknown" and "never answered" in last.reason, last
        stored = world.store.get(op_id)
        assert stored is not None and stored.effect_unsettled_since is not None

    def test_a_replacement_finding_every_attempt_used_ends_an_unanswered_call_unknown(self, world: World) -> None:
        op_id = self._issued_by_a_lost_attempt(world, left=0, applied=True)
        report = world.worker("w1").run_once()
        assert report is not None and (report.outcome, report.attempt) == ("external_outcome_unknown", None), report
        assert world.provider.calls == [f"{op_id}/effect"]  # no Attempt is left to ask, and nothing is resent
        self._ended_unknown(world, op_id, "external_outcome_unknown")
        record = world.service.get(op_id)
        assert record is not None
        last = record.maximum_attempts
        assert [a.state for a in record.attempts] == ["failed"] * (last - 1) + ["abandoned"]
        assert f"external effect {op_id}/effect was issued by attempt {last}" in world.service.history(op_id)[-1].reason

    def test_a_provider_that_keeps_timing_out_ends_unknown_not_max_attempts_exceeded(self, world: World) -> None:
        # Each Attempt's look right after its timeout finds nothing, but the calls may still land: the last one
        # ends with its outcome unknown, not as a limit hit with nothing done.
        op_id = self._capture(world, action="capture_unapproved")
        record = world.service.get(op_id)
        assert record is not None
        last = record.maximum_attempts
        world.provider.mode = "timeout"
        reports = []
        for number in range(1, last + 1):
            reports.append(world.worker(f"w{number}").run_once())
            world.clock.advance(timedelta(minutes=5))
        assert [(r.outcome, r.attempt) for r in reports if r is not None] == [
            *(("retry", n) for n in range(1, last)), ("external_outcome_unknown", last),
        ], reports
        assert world.provider.calls == [f"{op_id}/effect"] * last  # the adapter deduplicates by the effect id
        self._ended_unknown(world, op_id, "effect_not_applied")
        assert f"the last of {last} attempts" in world.service.history(op_id)[-1].reason

    @pytest.mark.parametrize("applied", [True, False], ids=["applied", "never_made"])
    def test_a_revoked_principal_with_a_call_unanswered_is_looked_up_before_failing_closed(
        self, world: World, applied: bool
    ) -> None:
        # A look at the provider is no side effect and needs no current authority: what it finds is recorded.
        op_id = self._issued_by_a_lost_attempt(world, applied=applied)
        world.directory.set("alice", ResolutionStatus.REVOKED)
        lookups = self._recorded_lookups(world)
        report = world.worker("w1").run_once()
        expected = "succeeded" if applied else "external_outcome_unknown"
        assert report is not None and (report.outcome, report.attempt) == (expected, 2), report
        assert lookups == [f"{op_id}/effect"]
        assert world.provider.calls == ([f"{op_id}/effect"] if applied else [])  # nothing sent after the denial
        if applied:
            record = world.service.get(op_id)
            assert record is not None and record.state is OperationState.SUCCEEDED and record.result == {
                "receipt": f"cap-{op_id}/effect", "amount": 2500,
            }
        else:
            self._ended_unknown(world, op_id, "not_authorized")
            assert "the denial of current authority" in world.service.history(op_id)[-1].reason

    def test_an_unavailable_principal_on_the_last_attempt_is_looked_up_before_the_failure_ends_it(
        self, world: World
    ) -> None:
        op_id = self._issued_by_a_lost_attempt(world, left=1, applied=True)
        world.directory.set("alice", ResolutionStatus.UNAVAILABLE)
        report = world.worker("w1").run_once()
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.SUCCEEDED
        assert report is not None and (report.outcome, report.attempt) == ("succeeded", record.maximum_attempts), report
        assert world.provider.calls == [f"{op_id}/effect"]

    def test_a_failure_that_is_not_retryable_with_a_call_unanswered_ends_unknown(self, world: World) -> None:
        op_id = self._issued_by_a_lost_attempt(world, applied=False)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        ended = world.store.fail(o.FailRequest(claim.credential, "card_rejected", retryable=False))
        assert isinstance(ended, o.Decision), ended
        self._ended_unknown(world, op_id, "card_rejected")
        assert "a failure that is not retryable" in world.service.history(op_id)[-1].reason

    @pytest.mark.parametrize(("left", "applied"), [(1, True), (1, False), (None, True)],
                             ids=["last_applied", "last_never_made", "first_applied"])
    def test_a_payload_builder_failing_on_a_replacement_looks_up_the_unanswered_call_first(
        self, world: World, left: int | None, applied: bool
    ) -> None:
        # The builder's failure comes before the look the replacement's reconcile plan makes: asked first, the
        # provider's success is recorded; on the last Attempt, without it, the Operation ended unknown unasked.
        op_id = self._issued_by_a_lost_attempt(world, left=left, applied=applied, action="capture_built")
        world.build_fails = True
        lookups = self._recorded_lookups(world)
        report = world.worker("w1").run_once()
        record = world.service.get(op_id)
        assert record is not None and report is not None
        assert lookups == [f"{op_id}/effect"], lookups
        assert world.provider.calls == ([f"{op_id}/effect"] if applied else [])  # looked up, nothing sent
        if applied:
            assert (report.outcome, record.state) == ("succeeded", OperationState.SUCCEEDED), report
            assert record.result == {"receipt": f"cap-{op_id}/effect", "amount": 2500}
            assert [a.state for a in record.attempts][-2:] == ["abandoned", "succeeded"]
        else:
            # Nothing found, and the builder's failure on the last Attempt ends it: unknown, its own code kept.
            assert report.outcome == "external_outcome_unknown" and "LookupError" in report.detail, report
            self._ended_unknown(world, op_id, "handler_error")
            assert "the last of" in world.service.history(op_id)[-1].reason

    def test_a_call_begun_before_the_deadline_records_its_answer_after_it(
        self, world: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        op_id = self._capture(world, action="capture_unapproved")
        self._to_the_deadline_less(world, op_id, LEASE / 2)
        capture = world.provider.capture

        def slow_capture(key: str, amount: int) -> str:
            receipt = capture(key, amount)
            world.clock.advance(LEASE / 4 * 3)  # the provider answers after the deadline
            return receipt

        monkeypatch.setattr(world.provider, "capture", slow_capture)
        report = world.worker("w1").run_once()
        assert report is not None and report.outcome == "succeeded", report
        assert world.provider.captures == {f"{op_id}/effect": 2500}
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.SUCCEEDED
        assert world.clock.now() >= record.deadline

    def test_the_deployment_check_names_what_active_operations_need(self, world: World) -> None:
        from fencekeeper.adapters.operations.service import check_durable_operations  # noqa: PLC0415

        world.transfer("k1", 5)
        assert check_durable_operations(world.store, world.actions, world.resolvers).ok
        bare = DurableActionRegistry((examples.BALANCE,))
        check = check_durable_operations(world.store, bare, PrincipalResolverRegistry())
        assert not check.ok
        assert check.missing_actions == (("transfer", 1),)
        assert check.missing_resolvers == (("users", 1),)
        world.worker("w1").run_once()
        assert check_durable_operations(world.store, bare, PrincipalResolverRegistry()).ok

    def test_workers_see_only_their_tenant(self, world: World) -> None:
        world.transfer("k1", 10)
        other = DurableOperationWorker(world.store, world.actions, world.resolvers, tenant="tenant-b", worker_id="wb")
        assert other.run_once() is None

    def test_a_refusal_leaves_the_store_as_it_was(self, world: World) -> None:
        op_id = world.transfer("k1", 10)
        claim = world.store.claim_next(TENANT, "w1", LEASE)
        assert isinstance(claim, o.Decision) and claim.credential is not None
        before = world.store.view(op_id)
        wrong = o.Credential(op_id, "w1", claim.credential.fence + 1)
        for outcome in (
            world.store.heartbeat(o.HeartbeatRequest(wrong, LEASE)),
            world.store.complete(o.CompleteRequest(claim.credential, o.Authority(False, ALICE.ref))),
            world.store.record_intent(o.IntentRequest(claim.credential)),
        ):
            assert isinstance(outcome, o.Refusal)
        assert world.store.view(op_id) == before


class SqlOperationStoreTests(OperationStoreTests):
    """The suite for a SQL store, and what only SQL can say: an atomic action's statements stay in its transaction.

    The memory store has no statements to refuse (its context is a copy of
    the tables, published only by the commit), so these are the SQL
    stores' alone.
    """

    @pytest.mark.parametrize(
        "statement",
        [
            "COMMIT",
            "ROLLBACK",
            "SAVEPOINT inside",
            "BEGIN",
            "END",
            "-- a note first\n/* and a block */ COMMIT",
            "; COMMIT",
            "UPDATE app_accounts SET balance = balance + 1 WHERE account_id = 'acc-2'; COMMIT",
        ],
    )
    def test_an_atomic_action_cannot_end_or_split_its_transaction(self, world: World, statement: str) -> None:
        op_id = world.transfer("k1", 10)
        met: list[BaseException] = []

        def escape(context: GuardedContext, value: Any) -> Any:
            context.execute("UPDATE app_accounts SET balance = balance - 10 WHERE account_id = 'acc-1'")
            try:
                context.execute(statement)  # no parameters: the case psycopg would send by the simple protocol
            except StatementRefused as exc:
                met.append(exc)
                raise
            return {}

        actions = DurableActionRegistry((DurableAction("transfer", 1, o.EffectClass.ATOMIC, escape),))
        worker = DurableOperationWorker(world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=LEASE)
        report = worker.run_once()
        assert len(met) == 1 and "refused in an atomic action" in str(met[0])
        assert report is not None and report.outcome == "retry" and "StatementRefused" in report.detail
        # Nothing of the action is visible, and the attempt failed like any handler error.
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.ADMITTED
        assert [(a.state, a.error_code) for a in record.attempts] == [("failed", "handler_error")]

    def test_an_action_that_swallows_a_refusal_still_commits_nothing(self, world: World) -> None:
        op_id = world.transfer("k1", 10)

        def stubborn(context: GuardedContext, value: Any) -> Any:
            context.execute("UPDATE app_accounts SET balance = balance - 10 WHERE account_id = 'acc-1'")
            with contextlib.suppress(StatementRefused):
                context.execute("COMMIT")
            with pytest.raises(StatementRefused):
                context.execute("SELECT 1")  # every statement after a refusal is refused too
            return {}

        actions = DurableActionRegistry((DurableAction("transfer", 1, o.EffectClass.ATOMIC, stubborn),))
        worker = DurableOperationWorker(world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=LEASE)
        report = worker.run_once()
        assert report is not None and report.outcome == "retry" and "StatementRefused" in report.detail
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        record = world.service.get(op_id)
        assert record is not None and record.state is OperationState.ADMITTED and record.result is None

    def test_a_rollback_to_a_savepoint_after_the_transfer_is_refused_and_undoes_nothing_alone(self, world: World) -> None:
        # The example transfer, then a ROLLBACK TO that would undo it behind the store's back.
        world.transfer("k1", 10)

        def undo(context: GuardedContext, value: Any) -> Any:
            result = examples.transfer(context, {"from": "acc-1", "to": "acc-2", "amount": 10})
            context.execute("ROLLBACK TO SAVEPOINT nowhere")
            return result

        actions = DurableActionRegistry((DurableAction("transfer", 1, o.EffectClass.ATOMIC, undo),))
        worker = DurableOperationWorker(world.store, actions, world.resolvers, tenant=TENANT, worker_id="w1", lease=LEASE)
        report = worker.run_once()
        assert report is not None and report.outcome == "retry" and "StatementRefused" in report.detail
        assert accounts(world.store) == {"acc-1": 100, "acc-2": 0}
        assert transfers(world.store) == set()
        # The next attempt, with the honest action, after the policy's backoff: the transfer, once.
        world.clock.advance(timedelta(seconds=2))
        report = world.worker("w2").run_once()
        assert report is not None and (report.outcome, report.attempt) == ("succeeded", 2)
        assert accounts(world.store) == {"acc-1": 90, "acc-2": 10}


# --- the state machine -----------------------------------------------------------------------------


@attrs.define
class _Answering:
    """An adapter answering ``perform`` and ``reconcile`` with whatever it was given, right or wrong."""

    performs: Any
    reconciled: Any = None
    idempotent: bool = False
    performed: int = 0

    def perform(self, effect_id: str, payload: Any) -> EffectResult:
        self.performed += 1
        return self.performs  # type: ignore[no-any-return]

    def reconcile(self, effect_id: str) -> EffectResult | None:
        return self.reconciled  # type: ignore[no-any-return]


class OperationServiceMachine(RuleBasedStateMachine):
    """Random sequences over the service, the worker steps and the clock; invariants checked after each."""

    factory: OpsStoreFactory

    @initialize()
    def start(self) -> None:
        self.clock = ManualClock()
        self.store = type(self).factory(self.clock)
        open_accounts(self.store, {"acc-1": 1000, "acc-2": 1000})
        # Ids in the order they are made: with random ones, a replayed sequence would claim another
        # of two equally due Operations (the store breaks the tie on the id) and draw differently.
        made = itertools.count(1)
        self.world = World(self.store, self.clock, new_id=lambda: f"{next(made):06d}")
        self.ids: set[str] = set()
        self.identities: dict[tuple[str, str], str] = {}
        self.credentials: list[o.Credential] = []
        self.ended: dict[str, o.Operation] = {}
        self.consumed: dict[str, int] = {}

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()

    @rule(key=st.sampled_from(["k1", "k2", "k3"]), amount=st.integers(1, 3), approval=st.booleans())
    def submit(self, key: str, amount: int, approval: bool) -> None:
        action = "capture_payment" if approval else "transfer"
        payload: Any = {"order": "o-1", "amount": amount} if approval else {"from": "acc-1", "to": "acc-2", "amount": amount}
        try:
            admission = self.world.service.submit(tenant=TENANT, principal=ALICE, action=action, input=payload, client_key=key)
        except DurableOperationError as exc:
            assert exc.code == "idempotency_conflict"
            assert (key, TENANT) in self.identities
            return
        known = self.identities.setdefault((key, TENANT), admission.operation_id)
        assert known == admission.operation_id, "one identity, one operation"
        assert admission.created == (admission.operation_id not in self.ids)
        self.ids.add(admission.operation_id)

    @rule(worker=st.sampled_from(["w1", "w2", "w3"]))
    def claim(self, worker: str) -> None:
        outcome = self.store.claim_next(TENANT, worker, LEASE)
        if isinstance(outcome, o.Decision) and outcome.credential is not None:
            self.credentials.append(outcome.credential)

    @rule(data=st.data(), atomic=st.booleans())
    def complete(self, data: st.DataObject, atomic: bool) -> None:
        if not self.credentials:
            return
        credential = data.draw(st.sampled_from(self.credentials))
        before = self.store.get(credential.operation_id)
        authority = o.Authority(True, ALICE.ref)
        if before is not None and before.effect_class is o.EffectClass.EXTERNAL:
            self.store.record_intent(o.IntentRequest(credential))
            outcome = self.store.complete(o.CompleteRequest(credential, authority, '{"captured":true}'))
        elif atomic:
            payload = {"from": "acc-1", "to": "acc-2", "amount": 1}
            outcome = self.store.complete(
                o.CompleteRequest(credential, authority),
                lambda c: str(examples.transfer(c, payload) and "null"),
            )
        else:
            outcome = self.store.complete(o.CompleteRequest(credential, authority))
        if before is None or o.check_owner(before, credential, self.clock.now()) is not None:
            assert isinstance(outcome, o.Refusal), "only the current, live owner may complete"

    @rule(data=st.data(), retryable=st.booleans(), not_applied=st.booleans())
    def fail(self, data: st.DataObject, retryable: bool, not_applied: bool) -> None:
        if self.credentials:
            credential = data.draw(st.sampled_from(self.credentials))
            before = self.store.get(credential.operation_id)
            outcome = self.store.fail(o.FailRequest(credential, "busy", retryable, effect_not_applied=not_applied))
            if not_applied and before is not None and before.effect_class is not o.EffectClass.EXTERNAL:
                assert isinstance(outcome, o.Refusal), "only an external effect has a provider's answer"

    @rule(data=st.data(), approve=st.booleans())
    def decide(self, data: st.DataObject, approve: bool) -> None:
        if self.ids:
            op_id = data.draw(st.sampled_from(sorted(self.ids)))
            try:
                self.world.service.decide(op_id, approver=BOB, approve=approve, approval_id=f"ap-{op_id}")
            except DurableOperationError as exc:
                assert exc.code in {"not_awaiting_approval", "decision_conflict", "deadline_exceeded"}
                if exc.code == "deadline_exceeded":
                    record = self.world.service.get(op_id)
                    assert record is not None and self.clock.now() >= record.deadline, "refused before its deadline"

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if self.ids:
            op_id = data.draw(st.sampled_from(sorted(self.ids)))
            try:
                self.world.service.cancel(op_id, principal=ALICE)
            except DurableOperationError as exc:
                assert exc.code == "cancel_too_late"

    @rule(seconds=st.sampled_from([1, 10, 31, 600, 4000]))
    def tick(self, seconds: int) -> None:
        self.clock.advance(timedelta(seconds=seconds))

    @invariant()
    def operations_keep_their_promises(self) -> None:
        if not hasattr(self, "store"):
            return
        applied = transfers(self.store)
        for op_id in sorted(self.ids):
            view = self.store.view(op_id)
            assert view is not None
            op = view.operation
            running = [a for a in view.attempts if a.state is o.AttemptState.RUNNING]
            assert len(running) <= 1, "at most one owner"
            if running:
                assert op.state is OperationState.RUNNING and running[0].number == op.fence
            assert [a.number for a in view.attempts] == list(range(1, op.fence + 1))
            assert op.attempt_count == op.fence <= op.policy.maximum_attempts
            if op_id in self.ended:
                assert op == self.ended[op_id], "a terminal operation is never written again"
            elif op.outcome is not None:
                self.ended[op_id] = op
            if op.approval is not None and op.approval.consumed_by is not None:
                assert self.consumed.setdefault(op_id, op.approval.consumed_by) == op.approval.consumed_by
            if op.action_name == "transfer":
                # The action's writes exist only with the operation's success (a completion may also
                # succeed without writing, when the machine completes it with no action).
                assert op_id not in applied or op.state is OperationState.SUCCEEDED
                if op.state is OperationState.CANCELLED:
                    assert op_id not in applied, "cancel and effect never both win"
            assert [t.revision for t in view.history] == list(range(1, op.revision + 1))
            # An unanswered effect is one whose intent some Attempt of this Operation committed.
            if op.effect_unsettled_since is not None:
                assert op.effect_id is not None and 1 <= op.effect_unsettled_since <= op.fence
        balances = accounts(self.store)
        assert sum(balances.values()) == 2000


# --- an intent recorded before settlement was (the stores' migration tests) ------------------------


def leave_an_unanswered_and_a_succeeded_capture(world: World) -> tuple[str, str]:
    """Two captures as a store held them: one whose owner died after its intent, one that succeeded."""

    def capture(order: str) -> str:
        payload = {"order": order, "amount": 2500}
        admission = world.service.submit(
            tenant=TENANT, principal=ALICE, action="capture_unapproved", input=payload, client_key=order
        )
        return admission.operation_id

    crashed = capture("o-1")
    claim = world.store.claim_next(TENANT, "w1", LEASE)
    assert isinstance(claim, o.Decision) and claim.credential is not None
    assert isinstance(world.store.record_intent(o.IntentRequest(claim.credential)), o.Decision)
    succeeded = capture("o-2")
    report = world.worker("w2").run_once()
    assert report is not None and report.operation_id == succeeded and report.outcome == "succeeded"
    return crashed, succeeded


def check_an_older_intent_is_reconciled_not_resent(world: World, crashed: str, succeeded: str) -> None:
    """After the migration: the older intent is unsettled for good, and a replacement never resends it."""
    unanswered, answered = world.store.get(crashed), world.store.get(succeeded)
    assert unanswered is not None and unanswered.effect_unsettled_since == 0
    assert answered is not None and answered.effect_unsettled_since is None
    world.adapter.idempotent = world.adapter.reconcilable = False
    calls = list(world.provider.calls)
    world.clock.advance(LEASE)
    report = world.worker("w3").run_once()
    assert report is not None and report.operation_id == crashed
    assert report.outcome == "external_outcome_unknown", report
    assert world.provider.calls == calls


# --- identities keyed by the full reference (the stores' migration tests) ----------------------------


class _Recording:
    """A resolver that records the references it was asked about, then asks ``inner``."""

    def __init__(self, inner: examples.Directory, asked: list[str]) -> None:
        self.inner = inner
        self.asked = asked

    def resolve(self, reference: PrincipalReference) -> PrincipalResolution:
        self.asked.append(reference.ref)
        return self.inner.resolve(reference)


@attrs.frozen
class IdentitiesBefore:
    """Operations a store held when its identities were keyed by the whole reference, version included.

    Two pairs of them are one principal under two versions of its resolver
    with one client key, the duplicate the old key let through: in
    ``active_pair`` both are still to run; in ``ended_pair`` the first ended
    before the second was admitted.  ``single`` has no twin.
    """

    active_pair: tuple[str, str]
    ended_pair: tuple[str, str]
    single: str
    statements: tuple[str, ...]
    """Run on the store's tables, they make its rows what the earlier code wrote."""


def leave_identities_keyed_by_the_whole_reference(world: World) -> IdentitiesBefore:
    """Admit the Operations of :class:`IdentitiesBefore` and say how to make their rows the earlier code's."""
    world.resolvers.register("users", 2, world.directory)

    def transfer(principal: PrincipalReference, key: str, amount: int) -> str:
        world.clock.advance(timedelta(seconds=1))  # admitted one after the other
        return world.service.submit(
            tenant=TENANT, principal=principal, action="transfer",
            input={"from": "acc-1", "to": "acc-2", "amount": amount}, client_key=key,
        ).operation_id

    ended_first = transfer(ALICE, "k-ended", 7)
    report = world.worker("w1").run_once()
    assert report is not None and report.operation_id == ended_first and report.outcome == "succeeded"
    ended_second = transfer(ALICE_V2, "k-ended-twin", 8)
    active_first = transfer(ALICE, "k-active", 5)
    active_second = transfer(ALICE_V2, "k-active-twin", 5)
    single = transfer(BOB, "k-single", 3)
    statements = (
        f"UPDATE operations SET client_key = 'k-ended' WHERE operation_id = '{ended_second}'",
        f"UPDATE operations SET client_key = 'k-active' WHERE operation_id = '{active_second}'",
        # The earlier key: the Operation's own reference and client key.
        "UPDATE operation_identities SET principal = (SELECT o.principal FROM operations o "
        "WHERE o.operation_id = operation_identities.operation_id), client_key = (SELECT o.client_key "
        "FROM operations o WHERE o.operation_id = operation_identities.operation_id)",
    )
    return IdentitiesBefore((active_first, active_second), (ended_first, ended_second), single, statements)


def check_identities_after_the_migration(world: World, before: IdentitiesBefore) -> None:
    """Every Operation is still there, each key names one, and a retry under either version finds it."""
    world.resolvers.register("users", 2, world.directory)
    run = getattr(world.store, "application_execute")  # noqa: B009 - every SQL store has it; the port does not
    (active_first, active_second), (ended_first, ended_second) = before.active_pair, before.ended_pair
    everything = (active_first, active_second, ended_first, ended_second, before.single)
    references = {op_id: world.store.get(op_id) for op_id in everything}
    assert {k: v.identity.principal if v else None for k, v in references.items()} == {
        active_first: ALICE.ref, active_second: ALICE_V2.ref, ended_first: ALICE.ref, ended_second: ALICE_V2.ref,
        before.single: BOB.ref,
    }, "every Operation is kept, with the reference it was admitted under"
    rows = {tuple(r) for r in run("SELECT client_key, principal, operation_id FROM operation_identities")}
    assert rows == {
        # Both still to run: the first admitted keeps the key.
        ("k-active", "users:v*:alice", active_first),
        # The first one ended: the one that can still run keeps it, as it keeps its identity at any time.
        ("k-ended", "users:v*:alice", ended_second),
        ("k-single", "users:v*:bob", before.single),
        # The others keep their earlier key, which no lookup asks for any more.
        ("k-active", ALICE_V2.ref, active_second),
        ("k-ended", ALICE.ref, ended_first),
    }

    def submit(principal: PrincipalReference, key: str, amount: int) -> Any:
        return world.service.submit(tenant=TENANT, principal=principal, action="transfer",
                                    input={"from": "acc-1", "to": "acc-2", "amount": amount}, client_key=key)

    for principal in (ALICE, ALICE_V2):
        assert (submit(principal, "k-active", 5).operation_id, submit(principal, "k-ended", 8).operation_id) == (
            active_first, ended_second
        )
    assert submit(PrincipalReference("users", 2, "bob"), "k-single", 3).operation_id == before.single
    with pytest.raises(DurableOperationError) as raised:
        submit(ALICE_V2, "k-ended", 7)
    assert raised.value.code == "idempotency_conflict"
    # Every Operation still to run runs, once.
    ran = set()
    while (report := world.worker("w2").run_once()) is not None:
        assert report.outcome == "succeeded", report
        ran.add(report.operation_id)
    assert ran == {active_first, active_second, ended_second, before.single}
    # The keys nobody asks for any more are pruned as every other, once their window has passed.
    world.clock.advance(timedelta(days=2))
    assert world.store.prune_identities() == len(rows)
    assert run("SELECT count(*) FROM operation_identities") == [(0,)]


def run_operation_state_machine(factory: OpsStoreFactory, *, max_examples: int = 25) -> None:
    machine = type("Machine", (OperationServiceMachine,), {"factory": staticmethod(factory)})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=max_examples, stateful_step_count=30, deadline=None, database=None),
    )


__all__ = [
    "IdentitiesBefore",
    "OperationServiceMachine",
    "OperationStoreTests",
    "OpsStoreFactory",
    "World",
    "check_an_older_intent_is_reconciled_not_resent",
    "check_identities_after_the_migration",
    "leave_an_unanswered_and_a_succeeded_capture",
    "leave_identities_keyed_by_the_whole_reference",
    "run_operation_state_machine",
]
