"""What the tests of claims made after a finalize or read ahead share (test_claim_after_finalize.py,
test_claim_chains.py, test_read_ahead.py)."""

from __future__ import annotations

from collections.abc import Callable

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.store import Composed, NextClaim, TransactionalStore
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p


def admit_in_order(store: TransactionalStore, business_id: str, principal_id: str, *workflows: str) -> list[str]:
    """One execution of each of ``workflows`` (registered already), admitted in that order: the claims' order."""
    policy = examples.grants(business_id, principal_id)
    admitted = []
    for n, workflow in enumerate(workflows):
        outcome = service.run(
            store, policy, business_id=business_id, principal_id=principal_id, definition_id=workflow,
            input={"order_id": f"o-{n}"} if workflow == "two-node" else {},
        )
        assert isinstance(outcome, p.Decision) and outcome.execution is not None, outcome
        admitted.append(outcome.execution.execution_id)
    return admitted


class CountingHandler:
    """A handler that succeeds and counts its calls per Command; a Command it is asked to reconcile fails the test.

    A claim made after a finalize commits its Command's intent with it, and the worker calls that
    handler once, even across a lost answer: reconciling it would mean the intent was forgotten.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def execute(self, command: i.Command) -> i.CommandResult:
        self.calls[command.execution_id] = self.calls.get(command.execution_id, 0) + 1
        return i.CommandResult(i.CommandStatus.SUCCEEDED)

    def reconcile(self, command: i.Command) -> i.CommandResult:
        raise AssertionError("a Command whose handler was never called is called, not reconciled")


class Watching:
    """Keeps what each watched transaction was offered and what it made; fails once after it, when asked.

    Mixed into a store whose composed method calls :meth:`watch`.  ``fail_after`` is raised after a
    transaction that made a claim after a finalize has committed: the answer lost on its way back (a
    ``StoreError``), or the process interrupted there (``KeyboardInterrupt``).
    """

    offered: list[NextClaim | None]
    made: list[Composed]
    fail_after: BaseException | None = None

    def watch(self, next_claim: NextClaim | None, call: Callable[[], Composed]) -> Composed:
        self.offered.append(next_claim)
        composed = call()
        self.made.append(composed)
        failing, self.fail_after = self.fail_after, None
        if failing is not None and composed.then is not None:
            raise failing
        return composed
