"""The scenarios docs/concepts.md draws, run for real, and the page's generated diagrams.

Rules of this module:

- Each scenario drives the real kernel through the in-memory reference
  store, real :class:`~fencekeeper.adapters.worker.Worker` objects, the
  service calls an operator or reviewer makes and the example command
  handler with its effect log.  Nothing is scripted but the order of moves
  and the clock: a :class:`~fencekeeper.adapters.store.ManualClock` and
  fixed lease tokens make every run draw the same picture, so a committed
  diagram can be compared with a fresh run's byte for byte
  (``tests/docs/test_concepts_diagrams.py``).
- A scenario checks its own story: if the store ever accepted a write the
  story expects it to refuse, it raises :class:`ScenarioError` rather than
  draw a picture of something that did not happen.
- What a caller was refused is passed to the diagram as
  :class:`~fencekeeper.adapters.sequence.Observed` (a refusal writes
  nothing, so no store holds it); everything else is drawn from what
  ``fencekeeper inspect`` reads.
- ``python -m fencekeeper.adapters.scenarios docs/concepts.md`` rewrites,
  in place, exactly the fenced blocks between ``<!-- scenario: NAME -->``
  and ``<!-- end scenario -->``; ``make specs`` runs it.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition

from . import examples, service
from .demo import workflow_text
from .memory import MemoryStore
from .ports import WORKFLOW_CANCEL, WORKFLOW_DISPATCH, GrantTable, ask
from .sequence import Observed, sequence_diagram
from .store import ManualClock
from .worker import PassReport, Worker

BUSINESS = "default"
OPERATOR = "user:operator"
MANAGER = "user:manager"
CFO = "user:cfo"
LEASE = timedelta(seconds=30)


class ScenarioError(Exception):
    """The store did something the story says it must not: no picture is drawn of it."""


def _tokens(*fixed: str) -> Callable[[], str]:
    """Lease tokens in a fixed order, so that the pictures are the same on every run."""
    supply: Iterator[str] = iter(fixed)
    spare = (f"{n:08x}{n:08x}{n:08x}{n:08x}" for n in itertools.count(0x5EED0001))
    return lambda: next(supply, None) or next(spare)


def _refused(outcome: object, what: str) -> p.Refusal:
    if not isinstance(outcome, p.Refusal):
        raise ScenarioError(f"{what} was not refused: {outcome!r}")
    return outcome


def _applied(outcome: object, what: str) -> p.Decision:
    if not isinstance(outcome, p.Decision):
        raise ScenarioError(f"{what} was not applied: {outcome!r}")
    return outcome


def _world(workflow: str, *principals: str) -> tuple[MemoryStore, ManualClock, GrantTable, str]:
    clock = ManualClock()
    store = MemoryStore(clock)
    policy = examples.grants(BUSINESS, OPERATOR, *principals)
    definition = parse_definition(workflow_text(workflow), workflow)
    service.register(store, definition, BUSINESS, OPERATOR, policy)
    return store, clock, policy, definition.definition_id


def fenced_out() -> str:
    """The demo's story: w-1 pauses past its lease, is quarantined and fenced out; w-2 finishes."""
    store, clock, policy, definition_id = _world("purchase_approval.toml", MANAGER, CFO)
    _applied(
        service.run(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=OPERATOR,
            definition_id=definition_id,
            input={"amount": 2500, "order_id": "o-1001", "order_revision": 1},
            execution_id="po-1",
        ),
        "admission",
    )
    claim = _applied(store.claim_next(p.ClaimRequest("w-1", "7f3a91c2" * 4, LEASE), business_id=BUSINESS), "claim")
    assert claim.lease is not None
    stale = claim.lease
    view = store.read("po-1")
    assert view is not None
    ctx = i.context_from_evidence(view.execution, store.load_definition(BUSINESS, definition_id, 1), view.evidence)
    plan = i.plan_visit(ctx, clock.now(), worker_id="w-1", fence=stale.fence)
    if not isinstance(plan, i.Step):
        raise ScenarioError(f"w-1 planned {type(plan).__name__}, not a step")
    authority = ask(policy, OPERATOR, BUSINESS, WORKFLOW_DISPATCH, (("po-1", view.execution.revision),))
    late = p.StepRequest(stale, view.execution.revision, plan.step, authority)
    observed: list[Observed] = []
    clock.advance(LEASE + timedelta(seconds=1))  # w-1 pauses (a GC pause, a stopped VM) past its lease
    first = _refused(store.record_step("po-1", late, plan.evidence), "w-1's late step")
    observed.append(Observed.refusal(2, "w-1", "record_step (fence 1), after its pause", first))
    service.quarantine_expired(store, policy, business_id=BUSINESS, principal_id=OPERATOR)
    review = service.recovery_view(store, business_id=BUSINESS, execution_id="po-1")
    _applied(
        service.resume(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=OPERATOR,
            execution_id="po-1",
            at_node=review.permitted[0],
            rationale="w-1's visit committed nothing and its node has no external effect",
        ),
        "resume",
    )
    worker = Worker(
        store,
        "w-2",
        policy,
        examples.handler(),
        lease=LEASE,
        business_id=BUSINESS,
        make_token=_tokens("2b9e4d71" * 4, "c05e1a38" * 4),
    )
    reclaim = _applied(
        store.claim_next(p.ClaimRequest("w-2", worker.make_token(), LEASE), business_id=BUSINESS), "reclaim"
    )
    assert reclaim.lease is not None
    second = _refused(store.record_step("po-1", late, plan.evidence), "w-1's second try")
    observed.append(Observed.refusal(5, "w-1", "record_step (fence 1), tries again", second))
    worker.drive("po-1", reclaim.lease, PassReport())
    request = service.approval_request(store, "po-1")
    if request is None:
        raise ScenarioError("po-1 asked for no approval")
    for reviewer, determination, decision_id in ((MANAGER, "approved", "d-po-1-1"), (CFO, "rejected", "d-po-1-2")):
        service.decide(
            store,
            policy,
            business_id=BUSINESS,
            reviewer_id=reviewer,
            request=request,
            determination=determination,
            decision_id=decision_id,
        )
    worker.run_pass()
    return _diagram(store, "po-1", observed)


def zombie_after_reconciliation() -> str:
    """A worker pauses between committing its Command and sending it; the Command is settled meanwhile."""
    store, clock, policy, definition_id = _world("refund_needs_reconciliation.toml")
    log = examples.MemoryEffectLog()
    handler = examples.handler(log)
    _applied(
        service.run(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=OPERATOR,
            definition_id=definition_id,
            input={"amount": 10, "payment_id": "pay-1"},
            execution_id="r-1",
        ),
        "admission",
    )
    claim = _applied(store.claim_next(p.ClaimRequest("w-1", "7f3a91c2" * 4, LEASE), business_id=BUSINESS), "claim")
    assert claim.lease is not None
    view = store.read("r-1")
    assert view is not None
    ctx = i.context_from_evidence(view.execution, store.load_definition(BUSINESS, definition_id, 1), view.evidence)
    plan = i.plan_visit(
        ctx, clock.now(), worker_id="w-1", fence=claim.lease.fence, node_authority=p.Authority(True, OPERATOR)
    )
    if not isinstance(plan, i.Invoke):
        raise ScenarioError(f"w-1 planned {type(plan).__name__}, not a Command")
    _applied(store.append_evidence("r-1", claim.lease, plan.evidence), "the Command's intent")
    clock.advance(LEASE + timedelta(seconds=1))  # w-1 pauses before sending
    service.quarantine_expired(store, policy, business_id=BUSINESS, principal_id=OPERATOR)
    reconciled = service.reconcile(
        store, policy, handler, business_id=BUSINESS, principal_id=OPERATOR, execution_id="r-1"
    )
    _applied(reconciled.outcome, "the settlement")
    _applied(
        service.resume(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=OPERATOR,
            execution_id="r-1",
            at_node="send_refund",
            rationale="the provider recorded the first refund as not applied and refuses it from now on",
        ),
        "resume",
    )
    worker = Worker(
        store, "w-2", policy, handler, lease=LEASE, business_id=BUSINESS, make_token=_tokens("2b9e4d71" * 4)
    )
    worker.run_pass()  # fence 2 sends its own refund; the example provider's reply is lost
    after = store.read("r-1")
    assert after is not None
    revision = after.execution.revision
    observed: list[Observed] = []
    late = handler.execute(plan.command)  # w-1 wakes and sends the Command it committed
    if late.status != i.CommandStatus.REJECTED:
        raise ScenarioError(f"the zombie's Command was not refused: {late}")
    observed.append(
        Observed(
            revision,
            "w-1",
            f"execute {plan.command.operation} {plan.command.command_id} (fence 1), after its pause",
            f"{late.status.value}: {late.detail}",
            to_handler=True,
        )
    )
    settled = i.settle(plan, late)
    if isinstance(settled, i.Step):
        write = p.StepRequest(claim.lease, revision, settled.step, p.Authority(True, OPERATOR))
        refusal = _refused(store.record_step("r-1", write, settled.evidence), "the zombie's step")
        observed.append(Observed.refusal(revision, "w-1", "record_step (fence 1)", refusal))
    _applied(
        service.reconcile(
            store, policy, handler, business_id=BUSINESS, principal_id=OPERATOR, execution_id="r-1"
        ).outcome,
        "the second settlement",
    )
    _applied(
        service.resume(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=OPERATOR,
            execution_id="r-1",
            at_node="refunded",
            rationale="the provider reports the fence 2 refund applied",
        ),
        "the second resume",
    )
    worker.run_pass()
    applied = [e for e in log.entries() if e.status == examples.APPLIED]
    if [(e.operation, e.fence) for e in applied] != [("payment.refund", 2)]:
        raise ScenarioError(f"the provider applied {applied}, not exactly the fence 2 refund")
    return _diagram(store, "r-1", observed)


def cancel_racing_a_claim() -> str:
    """The operator reads an eligible execution and cancels; a worker's claim commits first."""
    store, _clock, policy, definition_id = _world("purchase_approval.toml", MANAGER)
    _applied(
        service.run(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=OPERATOR,
            definition_id=definition_id,
            input={"amount": 5000, "order_id": "o-1004", "order_revision": 1},
            execution_id="po-4",
        ),
        "admission",
    )
    read = store.read("po-4")
    assert read is not None
    seen = read.execution.revision  # the operator decides to cancel what it read: eligible, revision 1
    worker = Worker(
        store, "w-1", policy, examples.handler(), lease=LEASE, business_id=BUSINESS, make_token=_tokens("7f3a91c2" * 4)
    )
    claim = _applied(store.claim_next(p.ClaimRequest("w-1", worker.make_token(), LEASE), business_id=BUSINESS), "claim")
    assert claim.lease is not None
    authority = ask(policy, OPERATOR, BUSINESS, WORKFLOW_CANCEL, (("po-4", seen),))
    lost = _refused(store.cancel(p.CancelRequest("po-4", BUSINESS, seen, authority)), "the stale cancel")
    observed = [Observed.refusal(2, OPERATOR, f"cancel (read at revision {seen})", lost)]
    running = _refused(
        service.cancel(store, policy, business_id=BUSINESS, principal_id=OPERATOR, execution_id="po-4"),
        "the cancel of running work",
    )
    observed.append(Observed.refusal(2, OPERATOR, "cancel (read again: revision 2)", running))
    worker.drive("po-4", claim.lease, PassReport())
    _applied(
        service.cancel(store, policy, business_id=BUSINESS, principal_id=OPERATOR, execution_id="po-4"),
        "the cancel of waiting work",
    )
    return _diagram(store, "po-4", observed)


def _diagram(store: MemoryStore, execution_id: str, observed: list[Observed]) -> str:
    view = store.read(execution_id)
    assert view is not None
    return sequence_diagram(view, observed)


SCENARIOS: dict[str, Callable[[], str]] = {
    "fenced-out": fenced_out,
    "zombie-after-reconciliation": zombie_after_reconciliation,
    "cancel-racing-a-claim": cancel_racing_a_claim,
}

_BLOCK = re.compile(
    r"(<!-- scenario: (?P<name>[a-z-]+) -->\n```mermaid\n)(?P<body>.*?)(```\n<!-- end scenario -->)", re.S
)


def rewrite(markdown: str) -> str:
    """``markdown`` with every scenario block replaced by a fresh run's diagram."""

    def fresh(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in SCENARIOS:
            raise ScenarioError(f"no scenario {name!r}; there are {', '.join(SCENARIOS)}")
        return match.group(1) + SCENARIOS[name]() + match.group(4)

    return _BLOCK.sub(fresh, markdown)


def main(argv: list[str]) -> int:
    for name in argv:
        path = Path(name)
        path.write_text(rewrite(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


__all__ = [
    "SCENARIOS",
    "ScenarioError",
    "cancel_racing_a_claim",
    "fenced_out",
    "rewrite",
    "zombie_after_reconciliation",
]
