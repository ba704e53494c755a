"""Every reason the execution journal refuses something, as one stable code.

The DAG node journal contract (seed 002: Failure and refusal behavior) lists the
categories; each member below is one of them, or one of the canonical
codec's.  Rules of this module:

- A value, once published in ``specs/journal.md``, never changes meaning.
  Callers, stores, the command line and other implementations running the
  fixture pack (``specs/journal/fixtures``) branch on the value, never on
  the message text.
- A refusal of a command is a returned value (:class:`Refusal`); a record
  or definition that cannot be read is a raised :class:`JournalError`
  carrying the same code.  Either way nothing was changed: every function of
  the journal is pure.
- ``ordinal`` says where a stored chain first went wrong: 0 for the header,
  the event's one-based ordinal otherwise, None when no record is to blame.
"""

from __future__ import annotations

import enum

import attrs

from .errors import KernelError


class JournalCode(enum.Enum):
    """The journal's stable refusal codes (specs/journal.md, section 8); the value is what records and tools show.

    The names are a contract: a caller, a store and the fixture pack
    (specs/journal.md, section 9) match on the code, never on the message.
    """

    # The verified workflow (seed 002: Key types, "VerifiedWorkflowDefinition").
    INVALID_WORKFLOW = "invalid_workflow"
    DUPLICATE_NODE = "duplicate_node"
    UNKNOWN_PREDECESSOR = "unknown_predecessor"
    WORKFLOW_CYCLE = "workflow_cycle"
    # Failure and refusal behavior: the journal's categories, in the seed's order.
    UNVERIFIED_AUTHORITY = "unverified_authority"
    UNKNOWN_NODE = "unknown_node"
    DEPENDENCY_GAP = "dependency_gap"
    INVALID_TRANSITION = "invalid_transition"
    INVALID_ATTEMPT = "invalid_attempt"
    STALE_HEAD = "stale_head"
    PRIOR_STATE_MISMATCH = "prior_state_mismatch"
    BROKEN_CHAIN = "broken_chain"
    FORGED_ROLE = "forged_role"
    NOT_INDEPENDENT = "not_independent"
    AUTOMATION_CLAIMS_HUMAN = "automation_claims_human"
    MISSING_DECLARED_OUTPUT = "missing_declared_output"
    INVALID_APPROVAL = "invalid_approval"
    CONFLICTING_REQUEST = "conflicting_request"
    PARTIAL_INVALIDATION = "partial_invalidation"
    BAD_SUCCESSOR_BINDING = "bad_successor_binding"
    # Key types and services: records are referenced "through a resolver".
    UNRESOLVED_RECORD = "unresolved_record"
    INVALID_REQUEST = "invalid_request"
    # The canonical codec: "Canonical codecs reject unknown fields, noncanonical
    # bytes, altered digests, gaps, and cross-journal records."
    UNKNOWN_FIELD = "unknown_field"
    MISSING_FIELD = "missing_field"
    MALFORMED_RECORD = "malformed_record"
    NON_CANONICAL = "non_canonical"
    ALTERED_DIGEST = "altered_digest"
    ORDINAL_GAP = "ordinal_gap"
    FOREIGN_RECORD = "foreign_record"


@attrs.frozen
class Refusal:
    """A command the journal did not accept; the journal is exactly as it was."""

    code: JournalCode
    message: str
    ordinal: int | None = None


class JournalError(KernelError):
    """A record, chain or definition that cannot be accepted, with the refusal's stable code."""

    def __init__(self, code: JournalCode, message: str, ordinal: int | None = None) -> None:
        where = "" if ordinal is None else ("header: " if ordinal == 0 else f"event {ordinal}: ")
        super().__init__(where + message)
        # ``code`` is the string every KernelError carries; ``reason`` the typed member.
        self.code = code.value
        self.reason = code
        self.ordinal = ordinal
        self.detail = message

    @property
    def refusal(self) -> Refusal:
        """The error as the :class:`Refusal` value a command returns, with the same code, message and ordinal."""
        return Refusal(self.reason, self.detail, self.ordinal)

    def at(self, ordinal: int) -> JournalError:
        """The same error, blamed on the record at ``ordinal`` (0 for the header)."""
        return JournalError(self.reason, self.detail, ordinal)
