"""The sequence diagram shows every refusal code the history records, and nothing but the history.

A refusal returned to a caller writes nothing, but a visit that refuses its
own node records why: an attempt rejected for want of authority
(``not_authorized``), a Command the handler rejected (``stale_fence``).
Both must appear in the picture with their codes; a run that recorded no
such thing must show none.  A wake names what woke it (an Event by its id,
or the timeout that came due, fired by the timer's principal).  A
suspension shows its code, and the governed ways out of it, a resume at
the node it stopped at and a fail, show who decided and why.
"""

from __future__ import annotations

from datetime import timedelta

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.demo import workflow_text
from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.ports import (
    DEFINITION_REGISTER,
    WORKFLOW_DISPATCH,
    WORKFLOW_RECONCILE,
    WORKFLOW_RUN,
    GrantTable,
    ScriptedHandler,
    reject,
)
from fencekeeper.adapters.sequence import Observed, sequence_diagram
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.worker import Worker
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel.definition import parse_definition

OPS = "user:operator"


def _refund(policy: GrantTable, handler: ScriptedHandler) -> MemoryStore:
    store = MemoryStore(ManualClock())
    definition = parse_definition(workflow_text("refund_needs_reconciliation.toml"))
    service.register(store, definition, "default", OPS, policy)
    service.run(
        store,
        policy,
        business_id="default",
        principal_id=OPS,
        definition_id="refund",
        input={"amount": 10, "payment_id": "pay-1"},
        execution_id="r-1",
    )
    Worker(store, "w-1", policy, handler, business_id="default").run_pass()
    return store


def _policy(*operations: str) -> GrantTable:
    policy = GrantTable()
    for operation in (DEFINITION_REGISTER, WORKFLOW_RUN, WORKFLOW_DISPATCH, *operations):
        policy.grant(OPS, "default", operation)
    return policy


def test_an_attempt_refused_for_want_of_authority_shows_its_code() -> None:
    handler = ScriptedHandler({})
    store = _refund(_policy(), handler)
    view = store.read("r-1")
    assert view is not None
    diagram = sequence_diagram(view)
    assert "Note over W1: attempt r-1/a2 failed [not_authorized]: no grant of payment.refund" in diagram
    assert "command handler" not in diagram and handler.executed == []
    assert "now failed at refund_failed" in diagram and "last error refund_rejected" in diagram


def test_a_command_the_handler_rejected_shows_its_code() -> None:
    handler = ScriptedHandler({"payment.refund": reject(i.Rejection.STALE_FENCE, "a newer fence was seen")})
    store = _refund(_policy("payment.refund"), handler)
    view = store.read("r-1")
    assert view is not None
    diagram = sequence_diagram(view)
    assert "H-->>W1: rejected [stale_fence]: a newer fence was seen" in diagram
    assert "Note over W1: attempt r-1/a2 failed [stale_fence]: a newer fence was seen" in diagram


def test_nothing_but_the_history_without_observations() -> None:
    handler = ScriptedHandler({"payment.refund": reject(i.Rejection.STALE_FENCE, "a newer fence was seen")})
    store = _refund(_policy("payment.refund"), handler)
    view = store.read("r-1")
    assert view is not None
    plain = sequence_diagram(view)
    assert "--x" not in plain and "not stored" not in plain
    seen = sequence_diagram(view, [Observed(2, "w-1", "renew (fence 1)", "REFUSED lease_expired")])
    extra = [line for line in seen.splitlines() if line not in plain.splitlines()]
    assert extra == ["    W1->>S: renew (fence 1)", "    S--xW1: REFUSED lease_expired (returned, not stored)"]


def test_a_wake_names_what_woke_it() -> None:
    clock = ManualClock()
    store = MemoryStore(clock)
    policy = examples.grants("default", OPS)
    service.register(store, parse_definition(workflow_text("payment_with_timeout.toml")), "default", OPS, policy)
    for execution_id, order in (("pay-1", "o-7"), ("pay-2", "o-8")):
        service.run(
            store,
            policy,
            business_id="default",
            principal_id=OPS,
            definition_id="payment-with-timeout",
            input={"amount": 40, "order_id": order},
            execution_id=execution_id,
        )
    worker = Worker(store, "w-1", policy, examples.handler(), business_id="default")
    worker.run_pass()
    service.publish(
        store,
        policy,
        business_id="default",
        principal_id=OPS,
        event_type="payment.received",
        correlation={"order_id": "o-7"},
        payload={"paid": 40},
        event_id="ev-1",
    )
    clock.advance(timedelta(days=2))
    worker.run_pass()
    paid, late = store.read("pay-1"), store.read("pay-2")
    assert paid is not None and late is not None
    assert "P1->>S: publish Event ev-1 (payment.received): wake" in sequence_diagram(paid)
    timed_out = sequence_diagram(late)
    assert "actor P2 as system:timer" in timed_out
    assert "P2->>S: wake: the timeout of pay-2/a2 is due" in timed_out


def test_a_suspension_and_both_ways_out_of_it_are_drawn() -> None:
    store = MemoryStore(ManualClock())
    # No grant to request the approval: the visit to ask_manager suspends (not_authorized).
    policy = _policy(WORKFLOW_RECONCILE)
    service.register(store, parse_definition(workflow_text("purchase_approval.toml")), "default", OPS, policy)
    for execution_id, order in (("po-1", "o-1"), ("po-2", "o-2")):
        service.run(
            store,
            policy,
            business_id="default",
            principal_id=OPS,
            definition_id="purchase-approval",
            input={"amount": 2500, "order_id": order, "order_revision": 1},
            execution_id=execution_id,
        )
    worker = Worker(store, "w-1", policy, ScriptedHandler({}), business_id="default")
    worker.run_pass()
    policy.grant(OPS, "default", "purchase.approve")
    service.resume(
        store,
        policy,
        business_id="default",
        principal_id=OPS,
        execution_id="po-1",
        at_node="ask_manager",
        rationale="purchase.approve is granted now",
    )
    service.fail(store, policy, business_id="default", principal_id=OPS, execution_id="po-2", rationale="not wanted")
    worker.run_pass()
    resumed, failed = store.read("po-1"), store.read("po-2")
    assert resumed is not None and failed is not None
    for diagram in (sequence_diagram(resumed), sequence_diagram(failed)):
        assert "Note over W1: attempt " in diagram and " failed [not_authorized]: " in diagram
        assert "S-->>W1: running -> suspended, revision 4" in diagram
    resumed_lines = sequence_diagram(resumed).splitlines()
    at = resumed_lines.index("    S-->>P1: suspended -> eligible, revision 5")
    assert resumed_lines[at - 1].startswith("    P1->>S: resume_suspended (command ")
    assert resumed_lines[at - 1].endswith(" at ask_manager because purchase.approve is granted now")
    assert "S-->>W1: running -> waiting" in "\n".join(resumed_lines[at:])
    failed_lines = sequence_diagram(failed).splitlines()
    at = failed_lines.index("    S-->>P1: suspended -> failed, revision 5")
    assert failed_lines[at - 1] == "    P1->>S: fail (command r-po-2-fail-r4) because not wanted"
