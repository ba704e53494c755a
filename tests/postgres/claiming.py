"""What the tests of claims made after a finalize share (test_claim_after_finalize.py, test_claim_chains.py)."""

from __future__ import annotations

from fencekeeper.kernel import interpreter as i


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
