"""The durable-operations Python API: actions, principals, the service, and the values it returns.

The durable operations contract (seed 001: Stable v0.7 additions) names the
surface: ``DurableAction`` and a registry, ``PrincipalReference`` and a
resolver registry, a service for admission, lookup, status, approval
decision, cancellation and history, ``OperationRecord``,
``OperationAdmission``, ``OperationState`` and ``EffectClass``.

Rules of this module:

- Bad input gets one :class:`DurableOperationError` whose code is stable and
  whose message names the field, and nothing is written: an unknown action
  or version, input the action's normaliser rejects, an identity reused with
  other input, a decision on the wrong operation or input digest, an
  expired approval.  Kernel refusals become errors with the refusal's code.
- Stored provenance is never permission.  The service resolves the
  principal's *current* identity (fail closed: missing, disabled or revoked,
  or a policy that raises, is ``not_authorized``) before admission, approval and cancellation; the
  worker does so again before every side effect.  A resolver that answers
  "temporarily unavailable" is asked again a bounded number of times.
- Normalised input is canonical JSON (sorted keys, no insignificant
  whitespace, UTF-8, an integral number as the integer it equals); its
  sha-256 is the digest idempotency and approvals are bound to, so ``1``
  and ``1.0`` are one input (specs/operations.md, "Equal input").  Floats
  that are not finite, and object keys that are not strings, are refused.
  An action's result is kept as the encoder writes it: the worker's path
  makes no extra pass over it.
- Identifiers the service makes (operation ids, approval ids) are random
  (uuid4): a store never trusts a caller's clock or counter.  A test may
  pass ``new_id`` so that a replayed sequence makes the same ids (and the
  store's order among equally due Operations, which ties on the id, repeats).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import inspect
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import attrs

from fencekeeper.kernel import operations as o
from fencekeeper.kernel.common import SHOWN_LENGTH, duration_problem, identifier_problem, shown, shown_text
from fencekeeper.kernel.machines import OperationState
from fencekeeper.kernel.operations import EffectClass, RetryPolicy, TerminalOutcome

from .ports import MalformedRow, OperationStore, OperationView, decode_stored_json

__all__ = [
    "ActionFailed",
    "ApprovalRecord",
    "CheckedSubmission",
    "DeploymentCheck",
    "DurableAction",
    "DurableActionRegistry",
    "DurableOperationError",
    "DurableOperationService",
    "EffectClass",
    "EffectResult",
    "EffectStatus",
    "ExternalEffectAdapter",
    "OperationAdmission",
    "OperationRecord",
    "OperationState",
    "PrincipalReference",
    "PrincipalResolution",
    "PrincipalResolverRegistry",
    "ReferencedVersions",
    "ResolutionStatus",
    "RetryPolicy",
    "TerminalOutcome",
    "canonical_json",
    "check_durable_operations",
    "check_submission",
    "input_digest",
    "referenced_versions",
]


class DurableOperationError(Exception):
    """One clear error: a stable ``code`` and a message naming the field or the operation."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message
        self.field = field
        """The request's field at fault, when there is one (the message names it too)."""


def _refused(outcome: o.Refusal) -> DurableOperationError:
    return DurableOperationError(outcome.code.value, outcome.message, outcome.field)


# --- canonical input --------------------------------------------------------------------------


# One encoder for every input and result (json.dumps with options builds a new one on each call);
# encoding keeps no state between calls, so it is shared by threads too.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

# Where the encoder wrote an integral float: repr gives one a trailing ".0" below 1e16 and an "e+" exponent from
# there on (every float that large is integral).  A number is followed by a separator or the end of the text; a
# match inside a string only costs the exact look below, never a wrong answer.
_INTEGRAL_FLOAT = re.compile(r"[0-9]\.0(?=[,\]}]|$)|[0-9]e\+")

_CONTAINERS = (dict, list, tuple)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _json_text(value: Any, field: str) -> str:
    """``value`` as the encoder writes it, or the error naming ``field``: the text of a result, and of an input
    before its numbers are made canonical (what an Operation admitted before that rule was digested from)."""
    try:
        text = _CANONICAL.encode(value)
    except (TypeError, ValueError) as exc:
        raise DurableOperationError("invalid_input", f"{field}: not JSON: {exc}", field) from None
    except RecursionError:
        raise DurableOperationError("invalid_input", f"{field}: not JSON: nested too deeply", field) from None
    # The encoder keeps a lone surrogate as it is (ensure_ascii=False), and it has no UTF-8 form: the digest and
    # the store would fail on it later, after the store was opened.  An ASCII text is known at no cost to have none.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            character = f"U+{ord(text[exc.start]):04X}"
            raise DurableOperationError(
                "invalid_input",
                f"{field}: contains an unpaired surrogate ({character}), which is not a character",
                field,
            ) from None
    return text


class _KeyNotText(Exception):
    """An object key that is not a string, and the path to its object, innermost step first."""

    def __init__(self, key: object) -> None:
        super().__init__()
        self.key = key
        self.steps: list[str] = []


def _check_keys(value: Any) -> None:
    """Raise :class:`_KeyNotText` for the first object key in ``value`` that is not a string.

    The encoder writes ``1``, ``True`` and ``None`` as the keys ``"1"``, ``"true"`` and ``"null"`` without a
    word, so ``{1: "a"}`` would be digested, stored and handed to the action as ``{"1": "a"}``.  Only
    containers are visited; the path is built on the way out, and only for the key at fault (this walk runs
    only once :func:`_keys_are_strings` has found one).
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _KeyNotText(key)
            if isinstance(item, _CONTAINERS):
                try:
                    _check_keys(item)
                except _KeyNotText as exc:
                    # A long key is cut as shown() cuts a value: the path names where, it does not repeat the key.
                    plain = _NAME.fullmatch(key) and len(key) <= SHOWN_LENGTH
                    spelled = shown_text(json.dumps(key, ensure_ascii=False), SHOWN_LENGTH)
                    exc.steps.append(f".{key}" if plain else f"[{spelled}]")
                    raise
    else:
        for index, item in enumerate(value):
            if isinstance(item, _CONTAINERS):
                try:
                    _check_keys(item)
                except _KeyNotText as exc:
                    exc.steps.append(f"[{index}]")
                    raise


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _keys_are_strings(value: Any) -> bool:
    """Whether every object key in ``value`` is a string: the common case, checked without building a path.

    ``"".join`` runs over an object's keys in C and takes nothing but strings; only values that are not
    plain scalars are visited further.
    """
    if isinstance(value, dict):
        try:
            "".join(value)
        except TypeError:
            return False
        for item in value.values():
            if type(item) not in _SCALARS and not _keys_are_strings(item):
                return False
    elif isinstance(value, list | tuple):
        for item in value:
            if type(item) not in _SCALARS and not _keys_are_strings(item):
                return False
    return True


def _integral_as_int(value: Any) -> Any:
    """``value`` with every integral float an int (``-0.0`` is ``0``); only called when it holds one."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _integral_as_int(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_integral_as_int(item) for item in value]
    return value


def _canonical_input(value: Any) -> tuple[str, str | None]:
    """The canonical text of ``value``, and the text it had before numbers were canonical if that differs.

    Seed 001 (Scoped idempotency) compares the "normalized semantic input": a JSON value, in which ``1`` and
    ``1.0``, ``0`` and ``-0.0`` are one number (RFC 8785 writes each the one way; JavaScript has no other).  An
    integral float becomes the int it equals, exactly, whatever its size.  The encoder runs first and refuses
    what is no JSON (and a cycle, so the walks below end); a text without an integral float is kept as it is,
    so the digest of every input that holds none is the one earlier releases stored.
    """
    try:
        text = _json_text(value, "input")
    except DurableOperationError:
        # A key that is no string is named where it is, not in the encoder's words ("'<' not supported between
        # instances of 'str' and 'int'", from sorting an object's mixed keys).
        with contextlib.suppress(RecursionError):  # a cycle: the encoder's own error says so
            _check_input_keys(value)
        raise
    try:
        _check_input_keys(value)
    except RecursionError:
        raise DurableOperationError("invalid_input", "input: not JSON: nested too deeply", "input") from None
    if (".0" not in text and "e+" not in text) or _INTEGRAL_FLOAT.search(text) is None:
        return text, None
    canonical = _CANONICAL.encode(_integral_as_int(value))
    return canonical, (None if canonical == text else text)


def _check_input_keys(value: Any) -> None:
    """The error naming the first object key in ``value`` that is not a string, if there is one."""
    problem = _key_problem(value, "input")
    if problem is not None:
        raise DurableOperationError("invalid_input", problem, "input")


def _key_problem(value: Any, field: str) -> str | None:
    """The message naming the first object key in ``value`` (called ``field``) that is not a string, or None.

    An input's is the caller's ``invalid_input``; a result's is the action's error (the worker's
    ``handler_error``).  May raise RecursionError for a value nested too deeply.
    """
    if _keys_are_strings(value):
        return None
    try:
        _check_keys(value)
    except _KeyNotText as exc:
        path = field + "".join(reversed(exc.steps))
        key = exc.key
        why = "JSON has no form for it"
        if key is None or isinstance(key, bool):
            why = f"JSON would take this one for the string {json.dumps(json.dumps(key))}"
        elif isinstance(key, int | float):  # as the encoder writes it: an IntEnum as its number
            written = int.__repr__(key) if isinstance(key, int) else float.__repr__(key)
            why = f"JSON would take this one for the string {json.dumps(written)}"
        return f"{path}: key {shown(key)} ({type(key).__name__}) is not a string; an object's keys are strings, and {why}"
    return None


def canonical_json(value: Any) -> str:
    """The canonical text of a JSON value: sorted keys, no spaces, UTF-8, finite numbers only.

    Numbers are written as the values they are: an integral float as the integer it equals (``1.0`` as ``1``,
    ``-0.0`` as ``0``).  An object key that is not a string is refused (``invalid_input``, the message naming
    where), not turned into one.  ``input_digest(canonical_json(value))`` is the digest a submission of
    ``value`` (normalised) is admitted and compared under.
    """
    return _canonical_input(value)[0]


def input_digest(canonical: str) -> str:
    """The SHA-256 (lower-case hex) of canonical JSON text: what idempotency and approvals are bound to."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --- principals ---------------------------------------------------------------------------------


_VERSION = re.compile(r"v[0-9]+")
"""A reference's version as ``PrincipalReference.ref`` writes it."""


@attrs.frozen
class PrincipalReference:
    """Non-secret provenance: which resolver (name and version) and which subject.  Never a credential."""

    resolver: str
    version: int
    subject: str

    def __attrs_post_init__(self) -> None:
        for name in ("resolver", "subject"):
            problem = identifier_problem(getattr(self, name))
            if problem is not None or (":" in getattr(self, name) and name == "resolver"):
                raise DurableOperationError(
                    "invalid_input", f"principal.{name}: {problem or 'may not contain :'}", f"principal.{name}"
                )
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise DurableOperationError(
                "invalid_input",
                f"principal.version: must be a positive integer, got {shown(self.version)}",
                "principal.version",
            )

    @property
    def ref(self) -> str:
        """The stored form: ``resolver:vN:subject``."""
        return f"{self.resolver}:v{self.version}:{self.subject}"

    @classmethod
    def parse(cls, text: str) -> PrincipalReference:
        parts = text.split(":", 2) if isinstance(text, str) else []
        # ASCII digits only, as ``ref`` writes them: str.isdigit() also took "²" (then a bare ValueError from
        # int()) and "١" (parsed as 1, so the reference was not the text), and a version of thousands of digits
        # was int()'s own ValueError.  Each such text ended the deployment check that reads stored references.
        version: int | None = None
        if len(parts) == 3 and _VERSION.fullmatch(parts[1]) is not None:
            with contextlib.suppress(ValueError):  # longer than int() converts (sys.get_int_max_str_digits)
                version = int(parts[1][1:])
        if version is None:
            raise DurableOperationError(
                "invalid_input",
                f"principal: {shown(text)} is not RESOLVER:vVERSION:SUBJECT (e.g. users:v1:alice)",
                "principal",
            )
        return cls(parts[0], version, parts[2])


class ResolutionStatus(enum.Enum):
    ACTIVE = "active"
    MISSING = "missing"
    DISABLED = "disabled"
    REVOKED = "revoked"
    UNAVAILABLE = "unavailable"
    """Temporarily: the identity provider could not answer.  The only status that is retried."""


@attrs.frozen
class PrincipalResolution:
    """What a resolver says about a reference *now*."""

    status: ResolutionStatus
    reference: PrincipalReference
    tenants: frozenset[str] = frozenset()
    """The tenants the principal currently belongs to."""
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.status is ResolutionStatus.ACTIVE

    def member_of(self, tenant: str) -> bool:
        """``*`` among the tenants is an explicit grant of every tenant (a local operator's directory)."""
        return tenant in self.tenants or "*" in self.tenants


class PrincipalResolver(Protocol):
    def resolve(self, reference: PrincipalReference) -> PrincipalResolution: ...


class PrincipalResolverRegistry:
    """Resolvers by (name, version).  An unregistered resolver fails closed, and so does one that raises or
    answers anything but a resolution of the very reference it was asked about (the provenance binding).

    ``retries`` bounds how often a temporarily unavailable answer is asked
    again (with ``pause`` seconds between), after which it stays
    unavailable: the caller treats that as a retryable failure, never as a
    grant.
    """

    def __init__(self, *, retries: int = 2, pause: float = 0.05) -> None:
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise DurableOperationError(
                "invalid_request", f"retries: must be a whole number, 0 or more, got {shown(retries)}", "retries"
            )
        if not isinstance(pause, int | float) or isinstance(pause, bool) or not 0 <= pause <= 60:
            raise DurableOperationError(
                "invalid_request", f"pause: must be seconds from 0 to 60, got {shown(pause)}", "pause"
            )
        self._resolvers: dict[tuple[str, int], PrincipalResolver] = {}
        self.retries = retries
        self.pause = pause

    def register(self, name: str, version: int, resolver: PrincipalResolver) -> None:
        """Register ``resolver`` for references ``name:vVERSION:...``; one that could never be asked is refused.

        Accepted, a version given as text was a key no reference matches (every principal of it failed
        closed, as if unregistered) and made :meth:`registered`, and so the deployment check, fail on
        comparing it; a resolver without a plain ``resolve`` failed closed on every principal.
        """
        problem = identifier_problem(name)
        if problem is not None or ":" in name:
            raise DurableOperationError("invalid_request", f"name: {problem or 'may not contain :'}", "name")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise DurableOperationError(
                "invalid_request", f"version: must be a positive integer, got {shown(version)}", "version"
            )
        resolve = getattr(resolver, "resolve", None)
        if not callable(resolve) or inspect.iscoroutinefunction(resolve):
            raise DurableOperationError(
                "invalid_request",
                f"resolver: {type(resolver).__name__} has no plain resolve(reference) method"
                f"{' (resolve is async def; resolvers are called synchronously)' if callable(resolve) else ''}",
                "resolver",
            )
        self._resolvers[(name, version)] = resolver

    def registered(self) -> list[tuple[str, int]]:
        return sorted(self._resolvers)

    def resolve(self, reference: PrincipalReference) -> PrincipalResolution:
        resolver = self._resolvers.get((reference.resolver, reference.version))
        if resolver is None:
            return PrincipalResolution(
                ResolutionStatus.MISSING,
                reference,
                reason=f"no resolver {reference.resolver} v{reference.version} is registered",
            )
        for attempt in range(self.retries + 1):
            try:
                resolution = resolver.resolve(reference)
            except Exception as exc:  # a resolver that breaks fails closed, never open
                return PrincipalResolution(ResolutionStatus.MISSING, reference, reason=f"resolver failed: {exc}")
            # The provenance binding (seed 001, Current authorization): only a resolution of this very
            # reference speaks for it.  One of another principal, or no resolution at all, fails closed.
            if not isinstance(resolution, PrincipalResolution):
                return PrincipalResolution(
                    ResolutionStatus.MISSING, reference,
                    reason=f"resolver answered {type(resolution).__name__}, not a PrincipalResolution",
                )
            if resolution.reference is not reference and resolution.reference != reference:
                return PrincipalResolution(
                    ResolutionStatus.MISSING, reference,
                    reason=f"resolver answered for {resolution.reference.ref}, not {reference.ref}",
                )
            if resolution.status is not ResolutionStatus.UNAVAILABLE or attempt == self.retries:
                return resolution
            time.sleep(self.pause)
        raise AssertionError("unreachable")


# --- actions ---------------------------------------------------------------------------------------


class ActionFailed(Exception):
    """Raised by a handler for a failure it can classify: ``retryable`` or conclusive.

    ``code`` is what the Attempt and the Operation record as their error code: an identifier
    (``insufficient_funds``), and ``retryable`` a bool.  Anything else is refused here, where the
    handler makes the mistake: the store refuses to record it, and a failure it will not record left
    the Attempt running until its lease ran out, to be claimed and failed the same way again.
    """

    def __init__(self, code: str, message: str = "", *, retryable: bool = False) -> None:
        problem = identifier_problem(code)
        if problem is not None:
            raise DurableOperationError("invalid_request", f"ActionFailed code: {problem}", "code")
        if not isinstance(retryable, bool):
            raise DurableOperationError(
                "invalid_request", f"ActionFailed retryable: must be True or False, got {shown(retryable)}", "retryable"
            )
        super().__init__(message or code)
        self.code = code
        self.retryable = retryable


class EffectStatus(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Conclusively not applied."""
    NOT_FOUND = "not_found"
    """Reconciliation: the provider has no effect under this id (it was not applied)."""
    AMBIGUOUS = "ambiguous"
    """May or may not have been applied (a timeout, a lost connection)."""


@attrs.frozen
class EffectResult:
    status: EffectStatus
    result: Any = None
    detail: str = ""
    retryable: bool = False


class ExternalEffectAdapter(Protocol):
    """A provider boundary.  ``effect_id`` is stable for the whole Operation: pass it as the provider's idempotency key."""

    idempotent: bool
    """True if performing twice with one effect id applies the effect once."""

    def perform(self, effect_id: str, payload: Any) -> EffectResult: ...

    def reconcile(self, effect_id: str) -> EffectResult | None:
        """What became of ``effect_id``, without performing it; None when the provider cannot say."""
        ...


def _same(value: Any) -> Any:
    return value


def _allow(resolution: PrincipalResolution, payload: Any) -> bool:
    return True


@attrs.frozen
class DurableAction:
    """A code-controlled action: name and version, effect class, handler, normaliser, authorizer and limits.

    The handler's shape follows the effect class: ``atomic``:
    ``handler(context, input) -> result`` (writes only through the guarded
    context); ``read_only``: ``handler(input) -> result``; ``external``: the
    ``adapter`` is the handler and ``handler`` builds its payload from the
    input.  ``authorize(resolution, input)`` is the application's current
    object and permission policy, asked before every side effect.
    """

    name: str
    version: int
    effect_class: EffectClass
    handler: Callable[..., Any]
    normalize: Callable[[Any], Any] = _same
    authorize: Callable[[PrincipalResolution, Any], bool] = _allow
    requires_approval: bool = False
    policy: RetryPolicy = attrs.Factory(RetryPolicy)
    adapter: ExternalEffectAdapter | None = None

    def __attrs_post_init__(self) -> None:
        problem = identifier_problem(self.name)
        if problem is not None:
            raise DurableOperationError("invalid_action", f"action name: {problem}")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise DurableOperationError("invalid_action", f"action {self.name}: version must be a positive integer")
        named = f"action {self.name} v{self.version}"
        if not isinstance(self.effect_class, EffectClass):
            raise DurableOperationError(
                "invalid_action", f"{named}: effect_class: must be an EffectClass, got {shown(self.effect_class)}", "effect_class"
            )
        if not isinstance(self.requires_approval, bool):
            raise DurableOperationError(
                "invalid_action",
                f"{named}: requires_approval: must be True or False, got {shown(self.requires_approval)}",
                "requires_approval",
            )
        if not isinstance(self.policy, RetryPolicy):
            raise DurableOperationError(
                "invalid_action", f"{named}: policy: must be a RetryPolicy, got {type(self.policy).__name__}", "policy"
            )
        # Each is called synchronously, in a worker's thread or the caller's: an async def answers a coroutine,
        # which was taken for the answer (a truthy one: an async authorizer granted everything) and never awaited.
        _synchronous(named, "handler", self.handler)
        _synchronous(named, "normalize", self.normalize)
        _synchronous(named, "authorize", self.authorize)
        if (self.effect_class is EffectClass.EXTERNAL) != (self.adapter is not None):
            raise DurableOperationError(
                "invalid_action", f"{named}: an adapter is required exactly for external effects", "adapter"
            )
        if self.adapter is not None:
            _synchronous(named, "adapter.perform", getattr(self.adapter, "perform", None))
            _synchronous(named, "adapter.reconcile", getattr(self.adapter, "reconcile", None))
            idempotent = getattr(self.adapter, "idempotent", None)
            if not isinstance(idempotent, bool):
                raise DurableOperationError(
                    "invalid_action",
                    f"{named}: adapter.idempotent: must be True or False (does the provider deduplicate by "
                    f"effect id?), got {shown(idempotent)}",
                    "adapter.idempotent",
                )


def _synchronous(named: str, field: str, value: object) -> None:
    """``value`` must be a plain callable: not None, not an ``async def`` (nor an object whose ``__call__`` is one)."""
    if not callable(value):
        raise DurableOperationError(
            "invalid_action", f"{named}: {field}: must be callable, got {type(value).__name__}", field
        )
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(type(value).__call__):
        raise DurableOperationError(
            "invalid_action",
            f"{named}: {field}: is a coroutine function (async def); actions are synchronous code, which workers "
            "call in threads (from there, asyncio.run can await a coroutine)",
            field,
        )


class DurableActionRegistry:
    """Actions by name and version.  Old versions stay registered while operations reference them."""

    def __init__(self, actions: tuple[DurableAction, ...] = ()) -> None:
        self._actions: dict[tuple[str, int], DurableAction] = {}
        self._latest: dict[str, int] = {}
        """Each name's highest registered version: what a submission without a version gets, without a scan."""
        for action in actions:
            self.register(action)

    def register(self, action: DurableAction) -> None:
        if not isinstance(action, DurableAction):
            raise DurableOperationError(
                "invalid_action", f"action: must be a DurableAction, got {type(action).__name__}", "action"
            )
        key = (action.name, action.version)
        if key in self._actions and self._actions[key] != action:
            raise DurableOperationError("invalid_action", f"action {action.name} v{action.version} is already registered")
        self._actions[key] = action
        self._latest[action.name] = max(action.version, self._latest.get(action.name, action.version))

    def get(self, name: str, version: int | None = None) -> DurableAction:
        if version is None:
            latest = self._latest.get(name) if isinstance(name, str) else None
            if latest is None:
                raise DurableOperationError("unknown_action", f"action: no action {shown(name)} is registered", "action")
            version = latest
        action = self._actions.get((name, version))
        if action is None:
            known = sorted(v for (n, v) in self._actions if n == name)
            raise DurableOperationError(
                "unknown_action", f"action: {shown(name)} version {version} is not registered (registered: {known})", "action"
            )
        return action

    def names(self) -> list[tuple[str, int]]:
        return sorted(self._actions)

    def has(self, name: str, version: int) -> bool:
        """Whether ``name`` version ``version`` is registered (a worker claims only the Operations it can run)."""
        return (name, version) in self._actions


# --- values returned -------------------------------------------------------------------------------


@attrs.frozen
class AttemptRecord:
    number: int
    worker_id: str
    state: str
    started_at: datetime
    ended_at: datetime | None
    error_code: str | None


@attrs.frozen
class ApprovalRecord:
    """The stored approval decision, as a caller may see it: who decided what, until when, and whether it was used."""

    approval_id: str
    approver: str
    approved: bool
    expires_at: datetime
    decided_at: datetime
    consumed_by_attempt: int | None
    """The Attempt whose claim consumed it (the first); None while unused, and always for a rejection."""

    def to_json(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "approver": self.approver,
            "approved": self.approved,
            "expires_at": self.expires_at.isoformat(),
            "decided_at": self.decided_at.isoformat(),
            "consumed_by_attempt": self.consumed_by_attempt,
        }


@attrs.frozen
class OperationRecord:
    """What a caller may know of an Operation (internal columns, fences' meaning and SQL are not the contract)."""

    operation_id: str
    namespace: str
    tenant: str
    principal: str
    action_name: str
    action_version: int
    effect_class: EffectClass
    state: OperationState
    outcome: TerminalOutcome | None
    input_digest: str
    input: Any
    result: Any
    error_code: str | None
    attempt_count: int
    maximum_attempts: int
    admitted_at: datetime
    deadline: datetime
    next_eligible_at: datetime
    requires_approval: bool
    approved_by: str | None
    effect_id: str | None
    attempts: tuple[AttemptRecord, ...]
    effect_unsettled: bool = False
    """An issue of the external effect may have been applied with no conclusive answer yet: the next
    Attempt reconciles before anything is repeated, and never resends it blindly (specs/operations.md)."""
    approval: ApprovalRecord | None = None
    """The stored approval decision, approving or rejecting; None while none is stored."""

    @property
    def terminal(self) -> bool:
        return self.outcome is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "operation_id": self.operation_id,
            "namespace": self.namespace,
            "tenant": self.tenant,
            "principal": self.principal,
            "action": {"name": self.action_name, "version": self.action_version},
            "effect_class": self.effect_class.value,
            "state": self.state.value,
            "outcome": None if self.outcome is None else self.outcome.value,
            "input_digest": self.input_digest,
            "input": self.input,
            "result": self.result,
            "error_code": self.error_code,
            "attempt_count": self.attempt_count,
            "maximum_attempts": self.maximum_attempts,
            "admitted_at": self.admitted_at.isoformat(),
            "deadline": self.deadline.isoformat(),
            "next_eligible_at": self.next_eligible_at.isoformat(),
            "requires_approval": self.requires_approval,
            "approved_by": self.approved_by,
            "effect_id": self.effect_id,
            "effect_unsettled": self.effect_unsettled,
            "approval": None if self.approval is None else self.approval.to_json(),
            "attempts": [
                {
                    "number": a.number,
                    "worker_id": a.worker_id,
                    "state": a.state,
                    "started_at": a.started_at.isoformat(),
                    "ended_at": None if a.ended_at is None else a.ended_at.isoformat(),
                    "error_code": a.error_code,
                }
                for a in self.attempts
            ],
        }


@attrs.frozen
class OperationAdmission:
    """The answer to a submission: the Operation's id, and whether this submission created it."""

    operation_id: str
    created: bool
    record: OperationRecord


@attrs.frozen
class HistoryLine:
    revision: int
    at: datetime
    event: str | None
    from_state: str | None
    to_state: str
    actor: str
    attempt: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "at": self.at.isoformat(),
            "event": self.event,
            "from": self.from_state,
            "to": self.to_state,
            "actor": self.actor,
            "attempt": self.attempt,
            "reason": self.reason,
        }


# --- the service ------------------------------------------------------------------------------------


@attrs.frozen
class CheckedSubmission:
    """A submission's input as admission records it: the action chosen, its normalised input and canonical JSON."""

    action: DurableAction
    normalised: Any
    canonical: str
    earlier: str | None = None
    """The text earlier releases digested the input from (numbers as the encoder wrote them), when it differs."""


def check_submission(
    actions: DurableActionRegistry,
    *,
    tenant: str,
    action: str,
    input: Any,
    client_key: str,
    version: int | None = None,
) -> CheckedSubmission:
    """What :meth:`DurableOperationService.submit` checks before it asks anyone: no store, no resolver.

    Raises the error ``submit`` would for the same arguments, so that a
    caller may check a submission before opening (or creating) a store.
    Anything the action's normaliser raises means the input is invalid: a
    normaliser written for a JSON object and given a list fails with
    AttributeError as surely as with ValueError, and either is the caller's
    input, not a fault of the service.
    """
    for name, value in (("tenant", tenant), ("client_key", client_key)):
        problem = identifier_problem(value)
        if problem is not None:
            raise DurableOperationError("invalid_input", f"{name}: {problem}", name)
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        # Looked up as given, version="1" was "'transfer' version 1 is not registered (registered: [1])".
        raise DurableOperationError("invalid_input", f"version: must be a positive integer, got {shown(version)}", "version")
    chosen = actions.get(action, version)
    try:
        normalised = chosen.normalize(input)
    except (ValueError, TypeError, KeyError) as exc:
        raise DurableOperationError(
            "invalid_input", f"input: rejected by {chosen.name} v{chosen.version}: {_line(exc)}", "input"
        ) from None
    except Exception as exc:  # any normaliser failure is the input's (see above)
        raise DurableOperationError(
            "invalid_input",
            f"input: rejected by {chosen.name} v{chosen.version}: {type(exc).__name__}: {_line(exc)}",
            "input",
        ) from None
    canonical, earlier = _canonical_input(normalised)
    return CheckedSubmission(chosen, normalised, canonical, earlier)


def _principal(field: str, value: object) -> PrincipalReference:
    """``value`` if it is a PrincipalReference; otherwise the error naming ``field``, before anything is asked."""
    if not isinstance(value, PrincipalReference):
        # Left to the resolver registry, a string was an AttributeError ('str' object has no attribute 'resolver').
        raise DurableOperationError(
            "invalid_input",
            f"{field}: must be a PrincipalReference (PrincipalReference.parse('users:v1:alice')), "
            f"not {type(value).__name__}",
            field,
        )
    return value


def _line(exc: BaseException) -> str:
    """An exception's message on one line (a normaliser's message may span several)."""
    return " ".join(str(exc).split())



class DurableOperationService:
    """Admission, lookup, history, approval decisions and cancellation of one application namespace."""

    def __init__(
        self,
        store: OperationStore,
        actions: DurableActionRegistry,
        resolvers: PrincipalResolverRegistry,
        *,
        namespace: str = "default",
        retention: timedelta = timedelta(days=1),
        approval_validity: timedelta = timedelta(hours=24),
        may_decide: Callable[[PrincipalResolution, OperationRecord], bool] | None = None,
        may_cancel: Callable[[PrincipalResolution, OperationRecord], bool] | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        problem = identifier_problem(namespace)
        if problem is not None:
            raise DurableOperationError("invalid_input", f"namespace: {problem}")
        # Checked once here: approval_validity="1h" was a TypeError at the first decision, and a zero or
        # negative one refused every decision as approval_expired; retention was checked only at each submit.
        for field, value in (("retention", retention), ("approval_validity", approval_validity)):
            problem = duration_problem(value)
            if problem is None:
                # Each is added to the time of every submission or decision: one that reaches past the last time a
                # datetime holds refused every submission (invalid_request), and every default-expiry decision
                # was a bare OverflowError (an HTTP 500).
                try:
                    datetime.now(UTC) + value
                except OverflowError:
                    problem = f"{value} from now is past the last representable time"
            if problem is not None:
                raise DurableOperationError("invalid_request", f"{field}: {problem}", field)
        for field, given in (("may_decide", may_decide), ("may_cancel", may_cancel)):
            if given is not None and (not callable(given) or inspect.iscoroutinefunction(given)
                                      or inspect.iscoroutinefunction(type(given).__call__)):
                raise DurableOperationError(
                    "invalid_request",
                    f"{field}: must be a plain function (resolution, record) -> bool, not "
                    f"{'an async def' if callable(given) else type(given).__name__}",
                    field,
                )
        self.store = store
        self.actions = actions
        self.resolvers = resolvers
        self.namespace = namespace
        self.retention = retention
        self.approval_validity = approval_validity
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        # By default any current member of the tenant may decide (not their own: the kernel refuses
        # that) and the requester may cancel, under any version of their resolver (the stable
        # reference, as idempotency and self-approval compare it); deployments pass their own policy.
        self.may_decide = may_decide or (lambda resolution, record: resolution.member_of(record.tenant))
        self.may_cancel = may_cancel or (
            lambda resolution, record: o.stable_principal(resolution.reference.ref) == o.stable_principal(record.principal)
            and resolution.member_of(record.tenant)
        )

    # --- authority ---------------------------------------------------------------------------

    def _authority(
        self,
        principal: PrincipalReference,
        tenant: str,
        policy: Callable[[PrincipalResolution], bool] | None = None,
        refused: str = "the action's authorizer refused",
    ) -> o.Authority:
        """Resolve ``principal`` now (once) and ask ``policy`` only of an active member of ``tenant``.

        ``refused`` says whose policy it is when it answers no: the action's, or the service's own.
        """
        resolution = self.resolvers.resolve(principal)
        if resolution.status is ResolutionStatus.UNAVAILABLE:
            # Still unavailable after the registry's bounded retries: authority is neither granted nor denied, and
            # not_authorized would tell the caller (an HTTP client: 403) not to try again.  Refused before the
            # store is asked, so nothing is written and nothing of any Operation is told.
            why = resolution.reason or "temporarily unavailable"
            raise DurableOperationError(
                "principal_unavailable",
                f"{principal.ref}: the resolver cannot say now whether this principal may act ({why}); "
                "nothing was written; try again",
                "principal",
            )
        try:
            allowed = None if policy is None or not resolution.active else policy(resolution)
        except Exception as exc:  # a policy that breaks fails closed, as a resolver that raises does
            return o.Authority(
                False, principal.ref, f"the authorization policy failed: {type(exc).__name__}: {_line(exc)}"
            )
        if not resolution.active:
            why = resolution.reason or resolution.status.value
            return o.Authority(False, principal.ref, f"{resolution.status.value}: {why}")
        if not resolution.member_of(tenant):
            return o.Authority(False, principal.ref, f"not a current member of tenant {tenant}")
        if policy is not None and allowed is not True:
            # Only True grants: a policy answering None (a branch that forgot to return) was taken for a grant here
            # while the worker, asking the same authorizer, denied.
            if allowed is not False:
                refused = f"the authorization policy answered {shown(allowed)}, not True or False"
            return o.Authority(False, principal.ref, refused)
        return o.Authority(True, principal.ref)

    # --- requests ------------------------------------------------------------------------------

    def submit(
        self,
        *,
        tenant: str,
        principal: PrincipalReference,
        action: str,
        input: Any,
        client_key: str,
        version: int | None = None,
    ) -> OperationAdmission:
        checked = check_submission(
            self.actions, tenant=tenant, action=action, input=input, client_key=client_key, version=version
        )
        _principal("principal", principal)
        chosen, normalised, canonical = checked.action, checked.normalised, checked.canonical
        authority = self._authority(principal, tenant, lambda resolution: chosen.authorize(resolution, normalised))
        request = o.SubmitRequest(
            operation_id=f"op-{self._new_id()}",
            identity=o.Identity(self.namespace, tenant, principal.ref, client_key),
            action_name=chosen.name,
            action_version=chosen.version,
            effect_class=chosen.effect_class,
            input_digest=input_digest(canonical),
            earlier_input_digest=None if checked.earlier is None else input_digest(checked.earlier),
            authority=authority,
            policy=chosen.policy,
            retention=self.retention,
            requires_approval=chosen.requires_approval,
        )
        outcome = self.store.submit(request, canonical)
        if isinstance(outcome, o.Refusal):
            raise _refused(outcome)
        operation = outcome.operation
        if isinstance(outcome, o.Decision):
            # A new Operation has no Attempts yet: its record needs no read.
            return OperationAdmission(operation.operation_id, True, _record(operation, canonical, ()))
        return OperationAdmission(operation.operation_id, False, self._record(operation.operation_id))

    def get(self, operation_id: str, *, tenant: str | None = None) -> OperationRecord | None:
        """The Operation, or None if it does not exist in this namespace (or, with ``tenant``, in that tenant).

        ``tenant`` is how a caller acting for one tenant asks: another
        tenant's Operation does not exist for it, rather than being shown.
        """
        view = self._view(operation_id, tenant)
        return None if view is None else _record(view.operation, view.input, view.attempts)

    def _view(self, operation_id: str, tenant: str | None) -> OperationView | None:
        if identifier_problem(operation_id) is not None:
            # No Operation has such an id, and a store need not be asked: PostgreSQL cannot take NUL as a parameter.
            return None
        try:
            view = self.store.view(operation_id)
        except MalformedRow as exc:
            if exc.namespace is not None and (
                exc.namespace != self.namespace or (tenant is not None and exc.tenant != tenant)
            ):
                return None  # another namespace's or tenant's row, damaged or not, does not exist for this caller
            raise
        if view is None or view.operation.identity.namespace != self.namespace:
            return None
        if tenant is not None and view.operation.identity.tenant != tenant:
            return None
        return view

    def _record(self, operation_id: str, tenant: str | None = None) -> OperationRecord:
        record = self.get(operation_id, tenant=tenant)
        if record is None:
            raise DurableOperationError("operation_not_found", f"operation {shown(operation_id)} does not exist")
        return record

    def history(self, operation_id: str, *, tenant: str | None = None) -> list[HistoryLine]:
        """The Operation's transitions, oldest first; ``tenant`` as for :meth:`get`."""
        view = self._view(operation_id, tenant)
        if view is None:
            raise DurableOperationError("operation_not_found", f"operation {shown(operation_id)} does not exist")
        return [
            HistoryLine(
                t.revision,
                t.at,
                None if t.event is None else t.event.value,
                None if t.from_state is None else t.from_state.value,
                t.to_state.value,
                t.actor,
                t.fence,
                t.reason,
            )
            for t in view.history
        ]

    def decide(
        self,
        operation_id: str,
        *,
        approver: PrincipalReference,
        approve: bool,
        input_digest: str | None = None,
        action: tuple[str, int] | None = None,
        expires_at: datetime | None = None,
        approval_id: str | None = None,
        tenant: str | None = None,
    ) -> OperationRecord:
        """Approve or reject.  ``input_digest`` and ``action`` bind the decision to what the approver saw.

        Without them the decision binds to the stored Operation as it is
        (an approver who saw nothing else).  A repeat with the same
        ``approval_id`` is answered with the stored record.  ``tenant`` as
        for :meth:`get`: another tenant's Operation is ``operation_not_found``,
        never a refusal that names its tenant or what it holds.
        """
        _principal("approver", approver)
        if action is not None and not (isinstance(action, tuple) and len(action) == 2):
            # Unpacked as it was, action="transfer" was a bare ValueError (too many values to unpack).
            raise DurableOperationError(
                "invalid_input", f"action: must be a (name, version) pair, got {shown(action)}", "action"
            )
        record = self._record(operation_id, tenant)
        authority = self._authority(
            approver, record.tenant, lambda resolution: self.may_decide(resolution, record),
            "the decision policy refused (may_decide)",
        )
        name, version = action if action is not None else (record.action_name, record.action_version)
        request = o.DecideRequest(
            # Only an absent id is made here: an empty one is the caller's, refused as malformed, not replaced by a
            # fresh id that a repeat of the same request could never match.
            approval_id=approval_id if approval_id is not None else f"ap-{self._new_id()}",
            operation_id=operation_id,
            input_digest=input_digest if input_digest is not None else record.input_digest,
            action_name=name,
            action_version=version,
            tenant=record.tenant,
            approver=approver.ref,
            approved=approve,
            expires_at=expires_at if expires_at is not None else self.store.now() + self.approval_validity,
            authority=authority,
        )
        outcome = self.store.decide(request)
        if isinstance(outcome, o.Refusal):
            raise _refused(outcome)
        return self._record(operation_id)

    def cancel(
        self, operation_id: str, *, principal: PrincipalReference, reason: str = "", tenant: str | None = None
    ) -> OperationRecord:
        """Cancel; ``tenant`` as for :meth:`decide`."""
        _principal("principal", principal)
        record = self._record(operation_id, tenant)
        # By default only the requester may cancel: say so, rather than blame the action's authorizer.
        authority = self._authority(
            principal, record.tenant, lambda resolution: self.may_cancel(resolution, record),
            "the cancellation policy refused (may_cancel; by default only the requester may cancel)",
        )
        outcome = self.store.cancel(o.CancelRequest(operation_id, principal.ref, authority, reason))
        if isinstance(outcome, o.Refusal):
            raise _refused(outcome)
        return self._record(operation_id)


def _record(operation: o.Operation, input_json: str, attempts: tuple[o.Attempt, ...]) -> OperationRecord:
    return OperationRecord(
        operation_id=operation.operation_id,
        namespace=operation.identity.namespace,
        tenant=operation.identity.tenant,
        principal=operation.identity.principal,
        action_name=operation.action_name,
        action_version=operation.action_version,
        effect_class=operation.effect_class,
        state=operation.state,
        outcome=operation.outcome,
        input_digest=operation.input_digest,
        input=decode_stored_json(operation, "input", input_json),
        result=None if operation.result is None else decode_stored_json(operation, "result", operation.result),
        error_code=operation.error_code,
        attempt_count=operation.attempt_count,
        maximum_attempts=operation.policy.maximum_attempts,
        admitted_at=operation.admitted_at,
        deadline=operation.deadline,
        next_eligible_at=operation.next_eligible_at,
        requires_approval=operation.requires_approval,
        approved_by=operation.approval.approver if operation.approval is not None and operation.approval.approved else None,
        effect_id=operation.effect_id,
        attempts=tuple(
            AttemptRecord(a.number, a.worker_id, a.state.value, a.started_at, a.ended_at, a.error_code) for a in attempts
        ),
        effect_unsettled=operation.effect_unsettled_since is not None,
        approval=None if operation.approval is None else _approval_record(operation.approval),
    )


def _approval_record(approval: o.Approval) -> ApprovalRecord:
    return ApprovalRecord(
        approval.approval_id,
        approval.approver,
        approval.approved,
        approval.expires_at,
        approval.decided_at,
        approval.consumed_by,
    )



@attrs.frozen
class DeploymentCheck:
    """What ``check_durable_operations`` found; ``ok`` is False when anything blocks running what is stored."""

    missing_actions: tuple[tuple[str, int], ...]
    missing_resolvers: tuple[tuple[str, int], ...]
    unreadable_principals: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not (self.missing_actions or self.missing_resolvers or self.unreadable_principals)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "missing_actions": [{"name": n, "version": v} for n, v in self.missing_actions],
            "missing_resolvers": [{"name": n, "version": v} for n, v in self.missing_resolvers],
            "unreadable_principals": list(self.unreadable_principals),
        }


@attrs.frozen
class ReferencedVersions:
    """Which action and principal resolver versions Operations not yet ended refer to, and how many refer to each."""

    actions: tuple[tuple[str, int, int], ...]
    """(name, version, count), sorted."""
    resolvers: tuple[tuple[str, int, int], ...]
    unreadable_principals: tuple[str, ...]
    """Principal references that do not parse: no resolver can be named for them."""


def referenced_versions(rows: Iterable[tuple[str, int, str, int]]) -> ReferencedVersions:
    """Count (action name, action version, principal reference, count) rows by action and by resolver version.

    The one reading of what unended Operations need: :func:`check_durable_operations`
    (any store) and the deployment check (``deployment.check_deployment``,
    straight from the tables, per tenant) both classify through it.
    """
    actions: dict[tuple[str, int], int] = {}
    resolvers: dict[tuple[str, int], int] = {}
    unreadable: set[str] = set()
    for name, version, principal, count in rows:
        key = (str(name), int(version))
        actions[key] = actions.get(key, 0) + int(count)
        try:
            reference = PrincipalReference.parse(str(principal))
        except DurableOperationError:
            unreadable.add(str(principal))
            continue
        rkey = (reference.resolver, reference.version)
        resolvers[rkey] = resolvers.get(rkey, 0) + int(count)
    return ReferencedVersions(
        tuple((n, v, c) for (n, v), c in sorted(actions.items())),
        tuple((n, v, c) for (n, v), c in sorted(resolvers.items())),
        tuple(sorted(unreadable)),
    )


def check_durable_operations(
    store: OperationStore, actions: DurableActionRegistry, resolvers: PrincipalResolverRegistry
) -> DeploymentCheck:
    """Seed 001 (Upgrade and operation, step 4): every action version and principal resolver version an
    Operation not yet ended refers to must be registered before workers claim work.  Reads, never writes.

    Works on any :class:`OperationStore` (the in-memory one included).  For a
    SQL store the whole deployment check (schema, definitions, outbox lag,
    retention; per namespace and tenant) is ``deployment.check_deployment``,
    which classifies through the same :func:`referenced_versions`.
    """
    registered_actions = set(actions.names())
    registered_resolvers = set(resolvers.registered())
    found = referenced_versions((name, version, principal, 1) for name, version, principal in store.active_references())
    return DeploymentCheck(
        tuple((n, v) for n, v, _ in found.actions if (n, v) not in registered_actions),
        tuple((n, v) for n, v, _ in found.resolvers if (n, v) not in registered_resolvers),
        found.unreadable_principals,
    )
