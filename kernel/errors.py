"""Every error the kernel raises, each with a stable machine-readable code.

Rules of this module:

- Every kernel error derives from :class:`KernelError` and carries a ``code``
  that never changes once published.  Callers (and other implementations
  reading ``specs/``) branch on the code, never on the message text.
- A message names the thing that was wrong (machine, state, event, file,
  field) so that one line is enough to act on.
- Raising an error never leaves anything half-done: every kernel function is
  pure, so there is nothing to roll back.

Protocol *refusals* (a stale lease, an expired token, ...) are not errors:
they are ordinary return values (see ``protocol.py``), because a refused
request is an expected outcome of a race, not a programming mistake.
"""

from __future__ import annotations

from .common import shown


class KernelError(Exception):
    """Base class of every error the kernel raises."""

    code: str = "kernel_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class IllegalTransition(KernelError):
    """An event that the machine's table does not admit in the given state.

    Mirrors h11's single ``LocalProtocolError``: one error type, one precise
    message naming machine, state and event, and nothing changed.
    """

    code = "illegal_transition"

    def __init__(self, machine: str, state: str, event: str) -> None:
        super().__init__(
            f"machine {machine!r} cannot handle event {event!r} in state {state!r}"
        )
        self.machine = machine
        self.state = state
        self.event = event


class InvalidSpec(KernelError):
    """A machine specification that is malformed or fails validation.

    The message always names the file and, where one is to blame, the
    transition (``event: source -> target``) or field.
    """

    code = "invalid_spec"

    def __init__(self, filename: str, problem: str) -> None:
        super().__init__(f"{filename}: {problem}")
        self.filename = filename
        self.problem = problem


class InvalidOperation(KernelError, ValueError):
    """An Operation whose fields contradict its state (``kernel/operations.py``, ``Operation``).

    No decision makes one: it comes from a stored row that old code, a hand
    edit or damage left inconsistent, such as a running Operation without an
    owner.  It is refused where the value is made, so no decision ever
    reasons about it (where it would end as a bare assertion or a misleading
    refusal).  The message names the Operation and the field.
    """

    code = "invalid_operation"

    def __init__(self, operation_id: str, field: str, problem: str) -> None:
        super().__init__(f"operation {shown(operation_id)}: {field}: {problem}")
        self.operation_id = operation_id
        self.field = field
        self.problem = problem


__all__ = [
    "IllegalTransition",
    "InvalidOperation",
    "InvalidSpec",
    "KernelError",
]
