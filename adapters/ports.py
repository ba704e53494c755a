"""The two ports the interpreter calls out through: authority and commands.

The workflow execution contract (seed 000: Purpose and Invariants; Security;
``local_command``).  Rules of this module:

- :class:`AuthorityPolicy` answers "may this principal perform this
  operation on these targets in this Business, now?" against *current*
  facts (membership, grant, Policy).  It is asked at every consequential
  node and for every operation a caller requests; its answer is evidence,
  and a denial fails closed.  A lease, a worker identity or an Event is
  never authority.
- :class:`CommandHandler` is the sole mutation authority for a node's
  consequential work.  It receives one stable Command envelope, carrying
  its identity (``command_id``) and the fence of the lease it was issued
  under.  It must report ``UNKNOWN`` whenever it cannot classify the result
  conclusively (a timeout, a lost connection): the interpreter then never
  resends, and ``reconcile`` later settles the Command by looking, not by
  repeating it.  The contract a handler must keep is written out on
  :class:`CommandHandler`; the store's fence stops a replaced worker's
  writes, and only the handler can stop its effects.
- The implementations here are small and explicit, for examples, the demo
  and tests: a grant table and a scripted handler.  Real deployments
  implement the two protocols against their own systems.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import attrs

from fencekeeper.kernel.interpreter import Command, CommandResult, CommandStatus, Rejection
from fencekeeper.kernel.protocol import Authority

WORKFLOW_RUN = "workflow_run"
WORKFLOW_DISPATCH = "workflow_dispatch"
WORKFLOW_CANCEL = "workflow_cancel"
WORKFLOW_RECONCILE = "workflow_reconcile"
EVENT_PUBLISH = "event_publish"
APPROVAL_DECIDE = "approval_decide"
DEFINITION_REGISTER = "definition_register"

SYSTEM_PRINCIPAL = "system:timer"
"""The principal due one-time wakes are fired as."""
SYSTEM_PRINCIPAL_GRANTS = ((SYSTEM_PRINCIPAL, WORKFLOW_DISPATCH),)
"""What a deployment's policy must grant for timeouts to fire: the timer dispatches, nothing else."""


class AuthorityPolicy(Protocol):
    """Answers, against current facts, whether a principal may perform an operation: the deployment's to write.

    ``operation`` is one of the operation ids of this module
    (:data:`WORKFLOW_RUN`, :data:`APPROVAL_DECIDE`, ...) or a node's own
    operation (``purchase.approve``); ``targets`` are the (id, revision)
    pairs it acts on.  The answer is recorded as evidence; a denial
    (``granted=False``, with a reason) fails closed.  It must grant
    :data:`SYSTEM_PRINCIPAL_GRANTS` for timeouts to fire.
    """

    def check(
        self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()
    ) -> Authority:
        """May ``principal_id`` perform ``operation`` on ``targets`` in ``business_id``, now?"""
        ...


def ask(
    policy: AuthorityPolicy, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()
) -> Authority:
    """``policy.check(...)``, which must answer an :class:`Authority`; TypeError naming the policy otherwise.

    Every caller asks through this, before anything is written: an answer
    such as ``True`` was an AttributeError deep inside a request, or a
    worker's step refused with its lease still held.
    """
    answer = policy.check(principal_id, business_id, operation, targets)
    if not isinstance(answer, Authority):
        raise TypeError(
            f"{type(policy).__name__}.check returned {answer!r} ({type(answer).__name__}) for {operation!r}, "
            "not an Authority"
        )
    return answer


class CommandHandler(Protocol):
    """The system that applies Commands, and the only one that can refuse a replaced worker's effect.

    The contract (specs/interpreter.md, The handler contract):

    - ``execute`` applies a Command at most once per ``command_id``: a
      repeat of an applied Command returns its recorded result and applies
      nothing.  It reports UNKNOWN whenever it cannot classify the result.
    - It should refuse a Command whose ``fence`` is lower than the highest
      fence it has seen for the same execution (``Rejection.STALE_FENCE``):
      the Command comes from a worker whose lease was replaced.
    - ``reconcile`` never applies anything.  It answers SUCCEEDED only if
      the Command was applied, and "not applied" (REJECTED) only if it can
      guarantee that the Command never will be: it must durably record the
      ``command_id`` as settled-not-applied *before* answering, and refuse
      it from then on, because a paused worker may still be about to send
      it.  A "not applied" answer is final.  When it cannot guarantee
      either, it answers UNKNOWN and nothing is recorded or resumed.
    """

    def execute(self, command: Command) -> CommandResult:
        """Apply ``command`` at most once.  Report UNKNOWN whenever the result cannot be classified conclusively."""
        ...

    def reconcile(self, command: Command) -> CommandResult:
        """Find out what became of an earlier ``command`` without applying it; "not applied" must be final."""
        ...


@attrs.frozen
class Grant:
    """One grant: ``principal_id`` may perform ``operation`` (or every operation, ``*``) in ``business_id``."""

    principal_id: str
    business_id: str
    operation: str
    """An operation id, or ``*`` for every operation."""


class GrantTable:
    """An AuthorityPolicy over an explicit, mutable set of grants (revocation takes effect at once)."""

    def __init__(self, grants: Iterable[Grant] = ()) -> None:
        # Each grant kept as the tuple of its fields, equal exactly when the Grants are: a question
        # (every visit asks one or two) then hashes and compares in C, where a Grant's generated
        # __hash__ and __eq__ run in Python, about 10 us a question.
        self._grants = {(g.principal_id, g.business_id, g.operation) for g in grants}
        self._lock = threading.Lock()

    def grant(self, principal_id: str, business_id: str, operation: str = "*") -> None:
        """Grant ``operation`` (default: every operation) to ``principal_id`` in ``business_id``."""
        with self._lock:
            self._grants.add((principal_id, business_id, operation))

    def revoke(self, principal_id: str, business_id: str, operation: str = "*") -> None:
        """Take a grant back; it takes effect at the next question."""
        with self._lock:
            self._grants.discard((principal_id, business_id, operation))

    def check(
        self, principal_id: str, business_id: str, operation: str, targets: Sequence[tuple[str, int]] = ()
    ) -> Authority:
        """Granted when the principal holds the operation, or ``*``, in the business."""
        with self._lock:
            grants = self._grants
            held = (principal_id, business_id, operation) in grants or (principal_id, business_id, "*") in grants
        if held:
            return Authority(True, principal_id, f"granted {operation} in {business_id}")
        return Authority(False, principal_id, f"no grant of {operation} to {principal_id} in {business_id}")


Script = Callable[[Command], CommandResult]


def succeed(**outputs: object) -> Script:
    """A script that reports SUCCEEDED with ``outputs``."""
    return lambda command: CommandResult(CommandStatus.SUCCEEDED, None, f"{command.operation} applied", outputs)


def reject(rejection: Rejection, detail: str) -> Script:
    """A script that reports REJECTED for ``rejection`` with ``detail``."""
    return lambda command: CommandResult(CommandStatus.REJECTED, rejection, detail)


def unknown(detail: str) -> Script:
    """A script that reports UNKNOWN (the reply was lost) with ``detail``."""
    return lambda command: CommandResult(CommandStatus.UNKNOWN, None, detail)


class ScriptedHandler:
    """A CommandHandler whose results are scripted per operation, and which remembers every Command.

    ``settled`` scripts what ``reconcile`` finds out later for an operation
    whose execution reported UNKNOWN (by default: still unknown).
    """

    def __init__(
        self, scripts: Mapping[str, Script], settled: Mapping[str, Script] | None = None
    ) -> None:
        self.scripts = dict(scripts)
        self.settled = dict(settled or {})
        self.executed: list[Command] = []
        self.reconciled: list[Command] = []
        self._lock = threading.Lock()

    def execute(self, command: Command) -> CommandResult:
        """Record the Command and answer with its operation's script (REJECTED when there is none)."""
        with self._lock:
            self.executed.append(command)
        script = self.scripts.get(command.operation)
        if script is None:
            return CommandResult(CommandStatus.REJECTED, Rejection.VALIDATION, f"no handler for {command.operation}")
        return script(command)

    def reconcile(self, command: Command) -> CommandResult:
        """Record the Command and answer with its operation's ``settled`` script (UNKNOWN when there is none)."""
        with self._lock:
            self.reconciled.append(command)
        script = self.settled.get(command.operation)
        if script is None:
            return CommandResult(CommandStatus.UNKNOWN, None, "the outcome is still not known")
        return script(command)


__all__ = [
    "APPROVAL_DECIDE",
    "DEFINITION_REGISTER",
    "EVENT_PUBLISH",
    "SYSTEM_PRINCIPAL",
    "SYSTEM_PRINCIPAL_GRANTS",
    "WORKFLOW_CANCEL",
    "WORKFLOW_DISPATCH",
    "WORKFLOW_RECONCILE",
    "WORKFLOW_RUN",
    "AuthorityPolicy",
    "CommandHandler",
    "Grant",
    "GrantTable",
    "Script",
    "ScriptedHandler",
    "ask",
    "reject",
    "succeed",
    "unknown",
]
