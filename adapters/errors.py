"""The typed exceptions of the Python API: one class per family, each code an enum.

Rules of this module:

- Every exception the client (:mod:`fencekeeper.adapters.client`) raises on
  purpose derives from :class:`FencekeeperError` and carries ``code``, a
  member of its family's enum, whose values are stable and published (the
  refusal codes in specs/protocol.md, the others listed here).  Callers
  branch on ``code``, never on the message.
- Three families, by what the caller can do about it:

  * :class:`Refused` -- understood, and the answer is no: the kernel refused
    (``code`` is the kernel's own :class:`~fencekeeper.kernel.protocol.RefusalCode`).
    Nothing was written.  The client returns the kernel's ``Refusal`` value
    instead of raising when a call is made with ``raise_on_refusal=False``.
  * :class:`RequestError` -- the request cannot be made as given: a malformed
    argument, a definition that does not parse, an input that does not fit,
    an id that names nothing, a revision already registered with other
    content.  ``field`` names the parameter.  Nothing was written.
  * :class:`StoreFailure` -- the store cannot do it now or as it is (no
    server answering, a schema from another version, a lock held too long).
    Nothing was written by the request that raised.

- These are the command line's exit codes in exception form: a
  ``RequestError`` is its exit 2, a ``Refused`` or ``StoreFailure`` its exit
  1 (a ``StoreFailure`` whose code is ``store_unavailable`` or
  ``not_a_database`` names no usable store: exit 2).
"""

from __future__ import annotations

import enum

from fencekeeper.kernel.protocol import Refusal, RefusalCode


class FencekeeperError(Exception):
    """Base class of every exception the Python API raises on purpose; ``code`` is a stable enum member."""

    code: enum.Enum

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Refused(FencekeeperError):
    """The kernel refused the request: nothing was written.  ``code`` is the kernel's :class:`RefusalCode`.

    ``refusal`` is the kernel's value itself (what ``raise_on_refusal=False``
    returns instead); ``execution_id`` names the execution it concerns, when
    there is one.
    """

    code: RefusalCode

    def __init__(self, refusal: Refusal, execution_id: str | None = None) -> None:
        super().__init__(f"[{refusal.code.value}] {refusal.message}")
        self.code = refusal.code
        self.refusal = refusal
        self.field = refusal.field
        self.execution_id = execution_id


class RequestCode(enum.Enum):
    """Why a request cannot be made as given.  Values are stable."""

    INVALID_ARGUMENT = "invalid_argument"
    """An argument of the wrong type or out of range (``field`` names it)."""
    INVALID_IDENTIFIER = "invalid_identifier"
    """Not 1-128 of ``A-Z a-z 0-9 . _ : @ / -``, starting with a letter or digit."""
    INVALID_DEFINITION = "invalid_definition"
    """The definition does not parse or does not validate (specs/definitions.md)."""
    DEFINITION_CONFLICT = "definition_conflict"
    """The definition's revision is already registered with other content."""
    DEFINITION_NOT_FOUND = "definition_not_found"
    """No registered definition (or revision) of that id in the business."""
    INVALID_INPUT = "invalid_input"
    """An execution's input that does not fit the definition's declared inputs."""
    INVALID_EVENT = "invalid_event"
    """An Event whose type, correlation or payload is malformed."""
    EXECUTION_NOT_FOUND = "execution_not_found"
    """No execution of that id in the business (another business's executions do not exist for the caller)."""
    NO_HANDLER = "no_handler"
    """The operation needs the CommandHandler, and the client was connected with ``handler=None``."""
    WORKER_SETTING = "worker_setting"
    """A worker setting outside its bounds (lease, concurrency)."""


class RequestError(FencekeeperError, ValueError):
    """The request cannot be made as given; ``field`` names the parameter.  Nothing was written."""

    code: RequestCode

    def __init__(self, code: RequestCode, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field


class StoreCode(enum.Enum):
    """Why a store cannot do what was asked.  Values are the store's stable codes (``StoreError.code``)."""

    STORE_UNAVAILABLE = "store_unavailable"
    NOT_A_DATABASE = "not_a_database"
    SCHEMA_MISSING = "schema_missing"
    SCHEMA_OUTDATED = "schema_outdated"
    SCHEMA_TOO_NEW = "schema_too_new"
    SCHEMA_ALTERED = "schema_altered"
    READ_ONLY = "read_only"
    STORE_LOCKED = "store_locked"
    """SQLite: another writer has held the write lock past the busy timeout."""
    ROW_LOCKED = "row_locked"
    """PostgreSQL: a row the request needs is held by another transaction past the lock timeout."""
    GUARD_CONFLICT = "guard_conflict"
    MALFORMED_ROW = "malformed_row"
    """A stored row that cannot be what it claims (edited by hand or damaged): an Operation whose fields contradict
    its state, or an execution whose current revision has no readable body; it is repaired, not retried."""
    EVIDENCE_CONFLICT = "evidence_conflict"
    REGISTRATION_CONFLICT = "registration_conflict"
    EVENT_CONFLICT = "event_conflict"
    OTHER = "store_error"
    """A code this version of the client does not know; ``store_code`` keeps the store's own."""


class StoreFailure(FencekeeperError):
    """The store cannot do what was asked, now or as it is.  Nothing was written by the request that raised."""

    code: StoreCode

    def __init__(self, store_code: str, message: str) -> None:
        super().__init__(f"{message} [{store_code}]")
        known = {member.value for member in StoreCode}
        self.code = StoreCode(store_code) if store_code in known else StoreCode.OTHER
        self.store_code = store_code


__all__ = [
    "FencekeeperError",
    "RefusalCode",
    "Refused",
    "RequestCode",
    "RequestError",
    "StoreCode",
    "StoreFailure",
]
