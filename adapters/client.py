"""The Python client: one store, one authority policy, one command handler, and every operation on them.

``fencekeeper.connect(url, policy=..., handler=...)`` returns a :class:`Client`
(``fencekeeper.connect_async`` an :class:`~fencekeeper.adapters.aio.AsyncClient`).
Rules of this module:

- Nothing is plugged in implicitly.  The caller gives the
  :class:`~fencekeeper.adapters.ports.AuthorityPolicy` every operation is
  checked against and the :class:`~fencekeeper.adapters.ports.CommandHandler`
  workers and settlements call (``handler=None`` for a client that never
  runs work; those calls then raise ``RequestError(no_handler)``).  The
  example grants and handler (:mod:`fencekeeper.adapters.examples`) are
  examples, used only when a caller passes them.
- The client translates; it decides nothing.  Each call is one service
  operation (:mod:`fencekeeper.adapters.service`), which asks the policy
  and hands the kernel's request to the store.
- Every argument is checked before anything is written: a bad one raises
  :class:`~fencekeeper.adapters.errors.RequestError` naming the parameter,
  and the store is left exactly as it was.  Where a call writes twice
  (``run`` with a definition registers it, then admits), every check of
  the second write that can be made beforehand is made before the first.
- A kernel refusal raises :class:`~fencekeeper.adapters.errors.Refused`
  with the kernel's code, or, for a call made with
  ``raise_on_refusal=False``, is returned as the kernel's
  :class:`~fencekeeper.kernel.protocol.Refusal` value.  It is never
  dropped: every call returns what happened or raises.
- An idempotent repeat (the same decision, Event or recovery command again)
  is a success that says so; it is not a refusal.
- A client may be shared by threads, as its store may; workers started by
  :meth:`Client.start_workers` share it.
"""

from __future__ import annotations

import builtins
import contextlib
import enum
import inspect
import math
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import attrs

from fencekeeper.kernel import approvals
from fencekeeper.kernel import interpreter as i
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.common import shown, utc_problem
from fencekeeper.kernel.definition import (
    IDENTIFIER,
    Definition,
    DefinitionError,
    definition_from_mapping,
    from_json,
    parse_definition,
)
from fencekeeper.kernel.events import EventError
from fencekeeper.kernel.machines import EXECUTION, ExecutionState
from fencekeeper.kernel.recovery import MAX_RATIONALE
from fencekeeper.kernel.text import problem as text_problem

from . import connect as connecting
from . import service
from .errors import Refused, RequestCode, RequestError, StoreFailure
from .memory import MemoryStore
from .ports import DEFINITION_REGISTER, WORKFLOW_RUN, AuthorityPolicy, CommandHandler, ask
from .store import RIDE_OUT_SECONDS, Clock, ExecutionView, PublishResult, StoreError, StorePatience, TransactionalStore
from .worker import PassReport, Worker, WorkerSettingError, check_concurrency, check_lease

T = TypeVar("T")

DefinitionSource = Definition | Path | os.PathLike[str] | str | Mapping[str, Any]
"""What :meth:`Client.register` and :meth:`Client.run` accept as a definition.

A :class:`~fencekeeper.kernel.definition.Definition`; a path (``pathlib.Path``
or another ``os.PathLike``) to a TOML or JSON file; a string holding TOML or
JSON text; or a mapping of the same structure (as ``tomllib`` or ``json``
returns it).  :meth:`Client.run` also takes a plain identifier string: the id
of a definition already registered.
"""

DEFAULT_BUSINESS = "default"
DEFAULT_PRINCIPAL = "user:operator"
DEFAULT_LEASE = timedelta(seconds=30)
MEMORY = ":memory:"
"""The URL of the in-memory reference store (one process, nothing kept after close)."""


@attrs.frozen
class Registered:
    """A definition revision the store holds; ``new`` is False when the identical revision was already there."""

    definition_id: str
    revision: int
    new: bool


class DecisionStatus(enum.Enum):
    """What a reviewer's decision did.  None of them is a refusal."""

    ACCEPTED = "accepted"
    """The first determination: recorded, the request closed, the waiter woken."""
    ALREADY_DECIDED = "already_decided"
    """The identical decision again (same id): nothing changed."""
    RECORDED_CONFLICTING = "recorded_conflicting"
    """A later, contradicting decision: kept in history; the first committed determination wins."""


@attrs.frozen
class Decided:
    """The answer to :meth:`Client.decide`: what became of the decision, and the execution it woke."""

    status: DecisionStatus
    decision_id: str
    request_id: str
    reviewer_id: str
    determination: str
    message: str
    execution: p.Execution | None = None
    """The woken execution (``ACCEPTED`` only)."""


# --- argument checks: each names the parameter, before anything is written ---------------------


def _identifier(field: str, value: object) -> str:
    if not isinstance(value, str) or not IDENTIFIER.fullmatch(value):
        raise RequestError(
            RequestCode.INVALID_IDENTIFIER,
            field,
            f"malformed identifier {shown(value)} (1-128 of A-Z a-z 0-9 . _ : @ / -, not starting with a symbol)",
        )
    return value


def _optional_identifier(field: str, value: object) -> str | None:
    return None if value is None else _identifier(field, value)


def _mapping(field: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RequestError(RequestCode.INVALID_ARGUMENT, field, f"must be a mapping, not {type(value).__name__}")
    return value


def _text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise RequestError(RequestCode.INVALID_ARGUMENT, field, f"must be a string, not {type(value).__name__}")
    return value


def _reason(field: str, value: object) -> str:
    """A reason a person gives (a decision's, a recovery's, a cancellation's): storable text, bounded as the kernel bounds it.

    Checked here, before the execution is read, so that a malformed reason
    is the caller's RequestError whatever state the execution is in, not a
    refusal that depends on it.
    """
    text = _text(field, value)
    unstorable = text_problem(text)
    if unstorable is None and len(text) > MAX_RATIONALE:
        unstorable = f"must be at most {MAX_RATIONALE} characters, got {len(text)}"
    if unstorable is not None:
        raise RequestError(RequestCode.INVALID_ARGUMENT, field, unstorable)
    return text


def _lease(value: object) -> timedelta:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            value = timedelta(seconds=value)
        except (ValueError, OverflowError):
            # NaN, infinity or more days than a timedelta holds: timedelta's own error names nothing.
            raise RequestError(RequestCode.WORKER_SETTING, "lease", f"must be finite seconds, got {shown(value)}") from None
    try:
        return check_lease(value)  # type: ignore[arg-type]
    except WorkerSettingError as exc:
        raise RequestError(RequestCode.WORKER_SETTING, exc.field, exc.message) from None


def wait_arguments(
    until: Collection[ExecutionState | str] | None, timeout: float, poll: float
) -> frozenset[ExecutionState]:
    """The states :meth:`Client.wait` waits for (default: the terminal ones); RequestError naming a bad argument."""
    values = EXECUTION.terminal if until is None else until
    if isinstance(values, str) or not isinstance(values, Collection) or not values:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "until", "must be a non-empty collection of execution states")
    try:
        wanted = frozenset(ExecutionState(v) for v in values)
    except ValueError as exc:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "until", str(exc)) from None
    # Written so that NaN fails them: a NaN timeout never passes its deadline, a NaN poll cannot be slept.
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout >= 0:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "timeout", f"must be seconds >= 0, got {shown(timeout)}")
    if not isinstance(poll, (int, float)) or isinstance(poll, bool) or not 0 < poll < math.inf:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "poll", f"must be seconds > 0, got {shown(poll)}")
    return wanted


def load_definition(source: DefinitionSource, *, field: str = "definition") -> Definition:
    """The :class:`Definition` ``source`` gives (see :data:`DefinitionSource`); RequestError naming ``field``."""
    if isinstance(source, Definition):
        return source
    try:
        if isinstance(source, (Path, os.PathLike)):
            path = Path(source)
            try:
                content = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise RequestError(RequestCode.INVALID_DEFINITION, field, f"{path}: cannot read: {exc.strerror}") from None
            except UnicodeDecodeError:
                raise RequestError(RequestCode.INVALID_DEFINITION, field, f"{path}: not UTF-8 text") from None
            if path.suffix.lower() == ".json" or content.lstrip().startswith("{"):
                return from_json(content, source=str(path))
            return parse_definition(content, str(path))
        if isinstance(source, str):
            if source.lstrip().startswith("{"):
                return from_json(source, source="<definition text>")
            return parse_definition(source, "<definition text>")
        if isinstance(source, Mapping):
            return definition_from_mapping(source, "<definition mapping>")
    except DefinitionError as exc:
        hint = ""
        if isinstance(source, str) and "\n" not in source and source.endswith((".toml", ".json")):
            hint = " (a string is definition text; pass pathlib.Path(...) to read a file)"
        raise RequestError(RequestCode.INVALID_DEFINITION, field, f"{exc}{hint}") from None
    raise RequestError(
        RequestCode.INVALID_ARGUMENT,
        field,
        f"must be a Definition, a path, TOML or JSON text, or a mapping, not {type(source).__name__}",
    )


# --- translating what the layers below raise ---------------------------------------------------

_OPERATION_REQUEST_CODES = {
    "definition_not_found": (RequestCode.DEFINITION_NOT_FOUND, "definition"),
    "execution_not_found": (RequestCode.EXECUTION_NOT_FOUND, "execution_id"),
    "invalid_input": (RequestCode.INVALID_INPUT, "input"),
    "invalid_event": (RequestCode.INVALID_EVENT, "event"),
}
# The service answers these before asking the kernel; they are the kernel's own "no".
_OPERATION_REFUSALS = {
    "not_in_review": p.RefusalCode.NOT_IN_RECONCILIATION,
    "no_unresolved_command": p.RefusalCode.NO_UNRESOLVED_COMMAND,
}


_EVENT_PARAMETERS = frozenset({"event_type", "correlation", "payload", "event_id"})


def _event_field(message: str) -> str:
    """The parameter of :meth:`Client.publish` an Event's refusal is about.

    The kernel's message begins with the field at fault (kernel/events.py),
    a member of a parameter (``payload.lines``, ``correlation[0]``) named
    under it; naming the Event as a whole told an HTTP caller that sent a
    ``payload`` of a field its request did not carry.
    """
    head = re.split(r"[:.\[]", message, maxsplit=1)[0]
    return head if head in _EVENT_PARAMETERS else "event"


class _RefusedHere(Exception):
    """Internal: a refusal found below the kernel call, carried up to the caller's choice."""

    def __init__(self, refusal: p.Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """The layers' own exceptions, as the API's typed families."""
    try:
        yield
    except service.OperationError as exc:
        if exc.code in _OPERATION_REFUSALS:
            raise _RefusedHere(p.Refusal(_OPERATION_REFUSALS[exc.code], exc.message)) from None
        code, field = _OPERATION_REQUEST_CODES.get(exc.code, (RequestCode.INVALID_ARGUMENT, "request"))
        if code is RequestCode.INVALID_EVENT:
            field = _event_field(exc.message)
        message = exc.message
        if message.startswith(f"{field}: "):
            message = message[len(field) + 2 :]
        raise RequestError(code, field, message) from None
    except StoreError as exc:
        if exc.code == "not_authorized":
            raise _RefusedHere(p.Refusal(p.RefusalCode.NOT_AUTHORIZED, exc.message)) from None
        raise StoreFailure(exc.code, exc.message) from None
    except EventError as exc:
        field = _event_field(str(exc))
        raise RequestError(RequestCode.INVALID_EVENT, field, str(exc).removeprefix(f"{field}: ")) from None
    except i.InputError as exc:
        raise RequestError(RequestCode.INVALID_INPUT, "input", str(exc).removeprefix("input: ")) from None
    except DefinitionError as exc:
        # Raised on registration: the revision is taken by other content.
        raise RequestError(RequestCode.DEFINITION_CONFLICT, "definition", str(exc)) from None


@contextlib.contextmanager
def _opening() -> Iterator[None]:
    """:func:`translated`, around opening (or migrating) the store a ``url`` names.

    The opening layer words its failures for the command line (``--db:
    cannot connect to PostgreSQL ...``); a Python caller passed ``url``, and
    the message names its DSN already, so the flag is dropped, as for a
    ``url`` that names no store (:func:`check_connect_arguments`).  A schema
    that is missing or behind says how to migrate it from Python too.
    """
    with translated():
        try:
            yield
        except StoreError as exc:
            message = exc.message.removeprefix("--db: ")
            if exc.code in {"schema_missing", "schema_outdated"}:
                # The caller can migrate from where they are: say how, beside the command.
                message = _MIGRATE_HINT.sub("; connect with migrate=True, or run `fencekeeper migrate`", message)
            raise StoreError(exc.code, message) from None


_MIGRATE_HINT = re.compile(r"; run `fencekeeper migrate[^`]*`(?: first)?$")


def _answer(outcome: T | p.Refusal, raise_on_refusal: bool, execution_id: str | None = None) -> T | p.Refusal:
    if isinstance(outcome, p.Refusal) and raise_on_refusal:
        raise Refused(outcome, execution_id)
    return outcome


# --- the client ---------------------------------------------------------------------------------


class Client:
    """Every operation on one store, under one authority policy and one command handler.

    Made by :func:`connect`.  ``business`` is the Business every call acts in
    (an execution of another business does not exist for this client);
    ``principal`` is who acts when a call does not name someone else.  Use
    it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        store: TransactionalStore,
        *,
        policy: AuthorityPolicy,
        handler: CommandHandler | None,
        business: str = DEFAULT_BUSINESS,
        principal: str = DEFAULT_PRINCIPAL,
    ) -> None:
        _check_policy(policy)
        _check_handler(handler)
        self._store = store
        self._closed = False
        self.policy = policy
        self.handler = handler
        self.business = _identifier("business", business)
        self.principal = _identifier("principal", principal)
        self._pools: builtins.list[WorkerPool] = []
        self._held: builtins.list[tuple[Worker, _StopSwitch | None]] = []
        self._held_lock = threading.Lock()

    def _made_work(self) -> None:
        # Something may have become eligible: wake this client's idle workers now rather than at their next poll.
        self._pools = [pool for pool in self._pools if pool.running]
        for pool in self._pools:
            pool.poke()

    # -- lifetime

    @property
    def store(self) -> TransactionalStore:
        """The store this client acts on (the port of :mod:`fencekeeper.adapters.store`).

        StoreFailure ``store_unavailable`` once the client is closed: each
        store failed in its own way (SQLite with ``sqlite3.ProgrammingError``,
        the in-memory store not at all).
        """
        if self._closed:
            raise StoreFailure("store_unavailable", "this client is closed; connect again to use the store")
        return self._store

    def close(self) -> None:
        """Stop this client's workers, then close the store's connections; a second close does nothing.

        A pool of :meth:`start_workers` still running is stopped first, as
        :meth:`WorkerPool.stop` stops it: each worker finishes the visit it
        is in and hands its lease back.  Every call after it raises
        StoreFailure ``store_unavailable``.
        """
        if not self._closed:
            self._closed = True
            # Closed under a running pool, the store refused the step that records a Command's
            # result: the Command was applied, its result lost, and the execution left running
            # until its lease expired and an operator reconciled it.
            for pool in builtins.list(self._pools):
                pool.stop()
            self._store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _who(self, principal: str | None, field: str = "principal") -> str:
        return self.principal if principal is None else _identifier(field, principal)

    def _view(self, execution_id: str) -> ExecutionView:
        _identifier("execution_id", execution_id)
        with translated():
            view = self.store.read(execution_id)
        if view is None or view.execution.business_id != self.business:
            raise RequestError(
                RequestCode.EXECUTION_NOT_FOUND, "execution_id", f"no execution {shown(execution_id)} in {self.business!r}"
            )
        return view

    def _needs_handler(self) -> CommandHandler:
        if self.handler is None:
            raise RequestError(RequestCode.NO_HANDLER, "handler", "this client was connected with handler=None")
        return self.handler

    # -- definitions and executions

    @overload
    def register(
        self, definition: DefinitionSource, *, principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> Registered: ...
    @overload
    def register(
        self, definition: DefinitionSource, *, principal: str | None = ..., raise_on_refusal: bool
    ) -> Registered | p.Refusal: ...
    def register(
        self, definition: DefinitionSource, *, principal: str | None = None, raise_on_refusal: bool = True
    ) -> Registered | p.Refusal:
        """Register a definition revision (idempotent: the identical revision again is ``new=False``).

        RequestError ``invalid_definition`` when it does not parse,
        ``definition_conflict`` when its revision is registered with other
        content; Refused ``not_authorized`` without the register grant.
        """
        parsed = load_definition(definition)
        who = self._who(principal)
        try:
            with translated():
                new = service.register(self.store, parsed, self.business, who, self.policy)
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal)
        return Registered(parsed.definition_id, parsed.revision, new)

    @overload
    def run(
        self,
        definition: DefinitionSource,
        input: Mapping[str, Any] | None = ...,
        *,
        execution_id: str | None = ...,
        revision: int | None = ...,
        principal: str | None = ...,
        raise_on_refusal: Literal[True] = ...,
    ) -> p.Execution: ...
    @overload
    def run(
        self,
        definition: DefinitionSource,
        input: Mapping[str, Any] | None = ...,
        *,
        execution_id: str | None = ...,
        revision: int | None = ...,
        principal: str | None = ...,
        raise_on_refusal: bool,
    ) -> p.Execution | p.Refusal: ...
    def run(
        self,
        definition: DefinitionSource,
        input: Mapping[str, Any] | None = None,
        *,
        execution_id: str | None = None,
        revision: int | None = None,
        principal: str | None = None,
        raise_on_refusal: bool = True,
    ) -> p.Execution | p.Refusal:
        """Admit an execution and return it (``eligible``, at the start node); a worker then runs it.

        ``definition`` is a definition to register first (any
        :data:`DefinitionSource`), or the id of one already registered (its
        latest revision, or ``revision``).  ``input`` must fit the
        definition's declared inputs.  ``execution_id`` defaults to a fresh
        ``x-...`` id; an id already taken is refused (``already_exists``).
        """
        who = self._who(principal)
        _optional_identifier("execution_id", execution_id)
        data = _mapping("input", {} if input is None else input)
        if revision is not None and (not isinstance(revision, int) or isinstance(revision, bool) or revision < 1):
            raise RequestError(RequestCode.INVALID_ARGUMENT, "revision", f"must be a positive int, got {shown(revision)}")
        registered_id = isinstance(definition, str) and IDENTIFIER.fullmatch(definition) is not None
        parsed: Definition | None = None
        if registered_id:
            assert isinstance(definition, str)
            with translated():
                parsed = self.store.load_definition(self.business, definition, revision)
            if parsed is None:
                which = f"revision {revision} of " if revision is not None else ""
                raise RequestError(
                    RequestCode.DEFINITION_NOT_FOUND,
                    "definition",
                    f"no registered {which}{shown(definition)} in {self.business!r} (a file needs pathlib.Path)",
                )
        else:
            parsed = load_definition(definition)
            if revision is not None and revision != parsed.revision:
                raise RequestError(
                    RequestCode.INVALID_ARGUMENT, "revision", f"{revision} given, but the definition is {parsed.revision}"
                )
        # Everything admission will check that can be checked without writing, before the registration writes.
        with translated():
            i.input_evidence(execution_id or "x-check", parsed, who, data)
        if execution_id is not None:
            with translated():
                taken = self.store.read(execution_id) is not None
            if taken:
                refusal = p.Refusal(p.RefusalCode.ALREADY_EXISTS, f"execution {execution_id!r} already exists")
                return _answer(refusal, raise_on_refusal, execution_id)
        questions: list[tuple[str, tuple[tuple[str, int], ...]]] = [(WORKFLOW_RUN, ((parsed.definition_id, parsed.revision),))]
        if not registered_id:
            questions.append((DEFINITION_REGISTER, ()))
        for operation, targets in questions:
            authority = ask(self.policy, who, self.business, operation, targets)
            if not authority.granted:
                refusal = p.Refusal(p.RefusalCode.NOT_AUTHORIZED, authority.reason or f"{who!r} may not {operation}")
                return _answer(refusal, raise_on_refusal, execution_id)
        try:
            with translated():
                if not registered_id:
                    service.register(self.store, parsed, self.business, who, self.policy)
                outcome = service.run(
                    self.store,
                    self.policy,
                    business_id=self.business,
                    principal_id=who,
                    definition_id=parsed.definition_id,
                    input=data,
                    revision=parsed.revision,
                    execution_id=execution_id,
                )
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal, execution_id)
        if isinstance(outcome, p.Decision) and outcome.execution is not None:
            self._made_work()
            return outcome.execution
        return _answer(_as_refusal(outcome), raise_on_refusal, execution_id)

    def list(self, state: ExecutionState | str | None = None) -> builtins.list[p.Execution]:
        """This business's executions (optionally only those in ``state``), by id."""
        chosen: ExecutionState | None
        try:
            chosen = None if state is None else ExecutionState(state)
        except ValueError:
            names = ", ".join(s.value for s in ExecutionState)
            raise RequestError(RequestCode.INVALID_ARGUMENT, "state", f"{shown(state)} is not one of {names}") from None
        with translated():
            views = [self.store.read(x) for x in self.store.execution_ids(chosen)]
        return [v.execution for v in views if v is not None and v.execution.business_id == self.business]

    def get(self, execution_id: str) -> p.Execution:
        """The execution's current revision; RequestError ``execution_not_found`` when there is none."""
        return self._view(execution_id).execution

    def wait(
        self,
        execution_id: str,
        *,
        until: Collection[ExecutionState | str] | None = None,
        timeout: float = 30.0,
        poll: float = 0.1,
    ) -> p.Execution:
        """Block until the execution is in one of ``until`` (default: a terminal state) and return it.

        It only reads: workers (:meth:`run_until_idle`, :meth:`start_workers`,
        ``fencekeeper worker``) do the work.  Raises :class:`TimeoutError`
        when ``timeout`` seconds pass first.
        """
        wanted = wait_arguments(until, timeout, poll)
        deadline = time.monotonic() + timeout
        while True:
            execution = self._view(execution_id).execution
            if execution.state in wanted:
                return execution
            if time.monotonic() >= deadline:
                names = ", ".join(sorted(s.value for s in wanted))
                raise TimeoutError(
                    f"{execution_id} is still {execution.state.value} after {timeout:g} s (waited for {names})"
                )
            time.sleep(min(poll, max(deadline - time.monotonic(), 0)))

    def inspect(self, execution_id: str) -> ExecutionView:
        """The execution with its whole history: what ``fencekeeper inspect`` shows."""
        return self._view(execution_id)

    # -- events and approvals

    @overload
    def publish(
        self,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = ...,
        *,
        event_id: str | None = ...,
        principal: str | None = ...,
        raise_on_refusal: Literal[True] = ...,
    ) -> PublishResult: ...
    @overload
    def publish(
        self,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = ...,
        *,
        event_id: str | None = ...,
        principal: str | None = ...,
        raise_on_refusal: bool,
    ) -> PublishResult | p.Refusal: ...
    def publish(
        self,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = None,
        *,
        event_id: str | None = None,
        principal: str | None = None,
        raise_on_refusal: bool = True,
    ) -> PublishResult | p.Refusal:
        """Commit an Event and wake every waiter whose correlation it matches exactly.

        Republishing the same ``event_id`` with the same content is
        idempotent (``duplicate=True``).
        """
        who = self._who(principal)
        _optional_identifier("event_id", event_id)
        _mapping("correlation", correlation)
        if payload is not None:
            _mapping("payload", payload)
        try:
            with translated():
                published = service.publish(
                    self.store,
                    self.policy,
                    business_id=self.business,
                    principal_id=who,
                    event_type=_text("event_type", event_type),
                    correlation=correlation,
                    payload=payload,
                    event_id=event_id,
                )
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal)
        if published.woken:
            self._made_work()
        return published

    def approval(self, execution_id: str) -> approvals.ApprovalRequest | None:
        """The execution's newest approval request, as a reviewer is shown it; None if it never asked."""
        self._view(execution_id)
        with translated():
            return service.approval_request(self.store, execution_id)

    @overload
    def decide(
        self,
        execution_id: str,
        determination: Literal["approved", "rejected"],
        *,
        reviewer: str | None = ...,
        decision_id: str | None = ...,
        rationale: str = ...,
        raise_on_refusal: Literal[True] = ...,
    ) -> Decided: ...
    @overload
    def decide(
        self,
        execution_id: str,
        determination: Literal["approved", "rejected"],
        *,
        reviewer: str | None = ...,
        decision_id: str | None = ...,
        rationale: str = ...,
        raise_on_refusal: bool,
    ) -> Decided | p.Refusal: ...
    def decide(
        self,
        execution_id: str,
        determination: Literal["approved", "rejected"],
        *,
        reviewer: str | None = None,
        decision_id: str | None = None,
        rationale: str = "",
        raise_on_refusal: bool = True,
    ) -> Decided | p.Refusal:
        """A reviewer's decision on the execution's pending approval request.

        ``reviewer`` defaults to the client's principal.  Repeat a
        ``decision_id`` to retry idempotently.  The kernel refuses a reviewer
        outside the request's reviewer scope, or the requester deciding
        their own request where a distinct reviewer is required
        (``not_authorized``), whatever the policy grants.
        """
        who = self._who(reviewer, "reviewer")
        if determination not in p.DETERMINATIONS:
            raise RequestError(
                RequestCode.INVALID_ARGUMENT,
                "determination",
                f"must be one of {', '.join(p.DETERMINATIONS)}, not {shown(determination)}",
            )
        _optional_identifier("decision_id", decision_id)
        _reason("rationale", rationale)
        self._view(execution_id)
        decision = decision_id or f"d-{os.urandom(6).hex()}"
        try:
            with translated():
                request = service.approval_request(self.store, execution_id)
                if request is None:
                    raise _RefusedHere(
                        p.Refusal(p.RefusalCode.APPROVAL_NOT_FOUND, f"{execution_id!r} has no approval request")
                    )
                outcome = service.decide(
                    self.store,
                    self.policy,
                    business_id=self.business,
                    reviewer_id=who,
                    request=request,
                    determination=determination,
                    decision_id=decision,
                    rationale=rationale,
                )
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal, execution_id)
        if isinstance(outcome, p.Refusal):
            return _answer(outcome, raise_on_refusal, execution_id)

        def decided(status: DecisionStatus, message: str, execution: p.Execution | None = None) -> Decided:
            return Decided(status, decision, request.request_id, who, determination, message, execution)

        if isinstance(outcome, p.Decision):
            self._made_work()
            return decided(DecisionStatus.ACCEPTED, "accepted; the waiter wakes", outcome.execution)
        if isinstance(outcome, p.Unchanged):
            return decided(DecisionStatus.ALREADY_DECIDED, outcome.message)
        if isinstance(outcome, approvals.Recorded):
            return decided(DecisionStatus.RECORDED_CONFLICTING, outcome.message)
        # An Accepted that the store did not turn into a Decision would be a store bug.
        raise AssertionError(f"unexpected decision outcome {outcome!r}")

    def approve(
        self, execution_id: str, *, reviewer: str | None = None, decision_id: str | None = None, rationale: str = ""
    ) -> Decided:
        """:meth:`decide` with ``approved``."""
        return self.decide(execution_id, "approved", reviewer=reviewer, decision_id=decision_id, rationale=rationale)

    def reject(
        self, execution_id: str, *, reviewer: str | None = None, decision_id: str | None = None, rationale: str = ""
    ) -> Decided:
        """:meth:`decide` with ``rejected``."""
        return self.decide(execution_id, "rejected", reviewer=reviewer, decision_id=decision_id, rationale=rationale)

    # -- cancellation and recovery

    @overload
    def cancel(
        self, execution_id: str, *, reason: str = ..., principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> p.Execution: ...
    @overload
    def cancel(
        self, execution_id: str, *, reason: str = ..., principal: str | None = ..., raise_on_refusal: bool
    ) -> p.Execution | p.Refusal: ...
    def cancel(
        self, execution_id: str, *, reason: str = "", principal: str | None = None, raise_on_refusal: bool = True
    ) -> p.Execution | p.Refusal:
        """Cancel an eligible or waiting execution; running work is refused (``cancel_running``)."""
        who = self._who(principal)
        # The reason is kept in the cancellation's Command evidence, which the kernel does not check; bounded
        # as every other rationale a person gives is (a review decision's, an operation's cancellation).
        _reason("reason", reason)
        self._view(execution_id)
        return self._execution_after(
            lambda: service.cancel(
                self.store,
                self.policy,
                business_id=self.business,
                principal_id=who,
                execution_id=execution_id,
                reason=reason,
            ),
            execution_id,
            raise_on_refusal,
        )

    def quarantine_expired(self, *, principal: str | None = None) -> service.Sweep:
        """Move every expired running execution of the business to ``reconciliation_required``.

        Safe from many processes at once.  The :class:`~fencekeeper.adapters.service.Sweep`
        says what happened to each execution; refusals that are real
        problems are in ``sweep.problems`` (a lost race is ``moved_on``).
        """
        who = self._who(principal)
        with translated():
            return service.quarantine_expired(self.store, self.policy, business_id=self.business, principal_id=who)

    @overload
    def review(self, execution_id: str, *, raise_on_refusal: Literal[True] = ...) -> service.RecoveryView: ...
    @overload
    def review(
        self, execution_id: str, *, raise_on_refusal: bool
    ) -> service.RecoveryView | p.Refusal: ...
    def review(self, execution_id: str, *, raise_on_refusal: bool = True) -> service.RecoveryView | p.Refusal:
        """What is known about an execution in review, and its choices; writes nothing.

        Refused ``not_in_reconciliation`` when the execution is neither
        ``reconciliation_required`` nor ``suspended``.
        """
        self._view(execution_id)
        try:
            with translated():
                return service.recovery_view(self.store, business_id=self.business, execution_id=execution_id)
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal, execution_id)

    @overload
    def settle(
        self, execution_id: str, *, principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> service.Reconciled: ...
    @overload
    def settle(
        self, execution_id: str, *, principal: str | None = ..., raise_on_refusal: bool
    ) -> service.Reconciled | p.Refusal: ...
    def settle(
        self, execution_id: str, *, principal: str | None = None, raise_on_refusal: bool = True
    ) -> service.Reconciled | p.Refusal:
        """Settle the execution's unresolved Command by asking the handler what became of it (never resending).

        The execution stays in review: resuming is a separate decision
        (:meth:`resume`).  An answer that is still unknown records nothing
        and is refused as ``no_unresolved_command``.
        """
        who = self._who(principal)
        handler = self._needs_handler()
        self._view(execution_id)
        try:
            with translated():
                reconciled = service.reconcile(
                    self.store, self.policy, handler, business_id=self.business, principal_id=who, execution_id=execution_id
                )
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal, execution_id)
        if isinstance(reconciled.outcome, p.Refusal):
            return _answer(reconciled.outcome, raise_on_refusal, execution_id)
        return reconciled

    @overload
    def resume(
        self,
        execution_id: str,
        *,
        at_node: str,
        rationale: str,
        input: Mapping[str, Any] | None = ...,
        principal: str | None = ...,
        raise_on_refusal: Literal[True] = ...,
    ) -> p.Execution: ...
    @overload
    def resume(
        self,
        execution_id: str,
        *,
        at_node: str,
        rationale: str,
        input: Mapping[str, Any] | None = ...,
        principal: str | None = ...,
        raise_on_refusal: bool,
    ) -> p.Execution | p.Refusal: ...
    def resume(
        self,
        execution_id: str,
        *,
        at_node: str,
        rationale: str,
        input: Mapping[str, Any] | None = None,
        principal: str | None = None,
        raise_on_refusal: bool = True,
    ) -> p.Execution | p.Refusal:
        """Resume an execution in review at ``at_node``: an explicit, authorized decision.

        ``rationale`` says why entering ``at_node`` is safe and is recorded
        as the resume's idempotency contract.  From
        ``reconciliation_required`` the kernel derives the safe-resume proof
        from the stored evidence and refuses (``unsafe_resume``) when it does
        not hold; :meth:`review` shows the permitted continuations.  From
        ``suspended``, ``input`` may correct the execution's input.
        """
        who = self._who(principal)
        _identifier("at_node", at_node)
        if not isinstance(rationale, str) or not rationale.strip():
            raise RequestError(RequestCode.INVALID_ARGUMENT, "rationale", "say why resuming there is safe")
        _reason("rationale", rationale)
        if input is not None:
            _mapping("input", input)
        self._view(execution_id)
        return self._execution_after(
            lambda: service.resume(
                self.store,
                self.policy,
                business_id=self.business,
                principal_id=who,
                execution_id=execution_id,
                at_node=at_node,
                rationale=rationale,
                input=input,
            ),
            execution_id,
            raise_on_refusal,
        )

    @overload
    def fail(
        self, execution_id: str, *, rationale: str = ..., principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> p.Execution: ...
    @overload
    def fail(
        self, execution_id: str, *, rationale: str = ..., principal: str | None = ..., raise_on_refusal: bool
    ) -> p.Execution | p.Refusal: ...
    def fail(
        self, execution_id: str, *, rationale: str = "", principal: str | None = None, raise_on_refusal: bool = True
    ) -> p.Execution | p.Refusal:
        """End an execution in review as ``failed``: an explicit terminal decision; nothing is replayed."""
        who = self._who(principal)
        _reason("rationale", rationale)
        self._view(execution_id)
        return self._execution_after(
            lambda: service.fail(
                self.store,
                self.policy,
                business_id=self.business,
                principal_id=who,
                execution_id=execution_id,
                rationale=rationale,
            ),
            execution_id,
            raise_on_refusal,
        )

    def _execution_after(
        self, decide: Callable[[], p.Outcome], execution_id: str, raise_on_refusal: bool
    ) -> p.Execution | p.Refusal:
        """Make one governed decision on an execution; the execution it leaves, or the refusal as asked."""
        try:
            with translated():
                outcome = decide()
        except _RefusedHere as exc:
            return _answer(exc.refusal, raise_on_refusal, execution_id)
        if isinstance(outcome, p.Refusal):
            return _answer(outcome, raise_on_refusal, execution_id)
        if isinstance(outcome, p.Decision) and outcome.execution is not None:
            if outcome.execution.state is ExecutionState.ELIGIBLE:
                self._made_work()
            return outcome.execution
        # Unchanged: the identical command was already applied; the execution is as it left it.
        return self._view(execution_id).execution

    # -- workers

    def worker(self, worker_id: str | None = None, *, lease: timedelta | float = DEFAULT_LEASE) -> Worker:
        """A worker bound to this client's store, policy, handler and business (the low-level loop)."""
        handler = self._needs_handler()
        chosen = _identifier("worker_id", worker_id or f"py-{os.getpid()}-{os.urandom(3).hex()}")
        return Worker(self.store, chosen, self.policy, handler, lease=_lease(lease), business_id=self.business)

    def run_until_idle(
        self, *, worker_id: str | None = None, lease: timedelta | float = DEFAULT_LEASE, max_passes: int = 1000
    ) -> PassReport:
        """Run dispatcher passes in this thread until one finds nothing to do; what they did, summed.

        Work that becomes due later (a timeout) is not waited for.  A call
        that fails with StoreFailure while its worker's last decision may
        have committed (a lost connection) leaves that worker with the
        client: the next call goes on with it first, under its lease if the
        store shows it is still live (its ``worker_id`` and ``lease``, not
        the call's).
        """
        return self._run_until_idle(worker_id, lease, max_passes)

    def _run_until_idle(
        self,
        worker_id: str | None,
        lease: timedelta | float,
        max_passes: int,
        stop: threading.Event | None = None,
    ) -> PassReport:
        """:meth:`run_until_idle`; once ``stop`` is set, the passes end after the current visit, its lease handed back.

        For a caller that cannot wait for the passes to end on their own:
        the asyncio client's, cancelled, or closing.
        """
        if not isinstance(max_passes, int) or isinstance(max_passes, bool) or max_passes < 1:
            raise RequestError(RequestCode.INVALID_ARGUMENT, "max_passes", f"must be a positive int, got {shown(max_passes)}")
        worker, switch = self._held_worker() or (self.worker(worker_id, lease=lease), None)
        if stop is not None or switch is not None:
            # A held worker keeps the hook an earlier call gave it (with the lease token it remembers), asked
            # about this call's stop instead: one hook per worker, however many calls it serves.
            stopping = (lambda: False) if stop is None else stop.is_set
            if switch is None:
                switch = _StopSwitch(stopping)
                _hand_back_on_stop(worker, switch)
            else:
                switch.stopping = stopping
        total = PassReport()
        for _ in range(max_passes):
            if stop is not None and stop.is_set():
                break
            try:
                with translated():
                    report = worker.run_pass()
            except StoreFailure:
                if worker.holds_unfinished() and not (stop is not None and stop.is_set()):
                    # Its lease may still be live: the next call goes on with it (specs/protocol.md, "A
                    # decision of unknown outcome") instead of leaving it to expire into review.  A call
                    # that was asked to stop (cancelled, or its client closing) leaves it to expire.
                    with self._held_lock:
                        self._held.append((worker, switch))
                raise
            _add(total, report)
            if not report.claimed and not report.timers_fired:
                break
        return total

    def _held_worker(self) -> tuple[Worker, _StopSwitch | None] | None:
        """A worker an earlier :meth:`run_until_idle` left holding a lease of unknown outcome, to go on with."""
        with self._held_lock:
            return self._held.pop() if self._held else None

    def start_workers(
        self,
        concurrency: int = 1,
        *,
        lease: timedelta | float = DEFAULT_LEASE,
        poll: float = 1.0,
        prefix: str | None = None,
    ) -> WorkerPool:
        """Start ``concurrency`` workers in background threads of this process; stop them with ``pool.stop()``.

        Each claims one execution at a time and drives it until it leaves
        running, so a stopped worker holds no lease.
        """
        self._needs_handler()
        try:
            check_concurrency(concurrency)
        except WorkerSettingError as exc:
            raise RequestError(RequestCode.WORKER_SETTING, exc.field, exc.message) from None
        if not isinstance(poll, (int, float)) or isinstance(poll, bool) or not 0 < poll <= 3600:
            raise RequestError(RequestCode.INVALID_ARGUMENT, "poll", f"must be between 0 and 3600 seconds, got {shown(poll)}")
        chosen = _identifier("prefix", prefix or f"py-{os.getpid()}-{os.urandom(3).hex()}")
        workers = [self.worker(f"{chosen}-{n}", lease=lease) for n in range(1, concurrency + 1)]
        pool = WorkerPool(workers, poll=float(poll))
        self._pools.append(pool)
        pool.start()
        return pool


def _add(total: PassReport, report: PassReport) -> None:
    total.claimed.extend(report.claimed)
    total.steps += report.steps
    total.timers_fired += report.timers_fired
    total.finished.update(report.finished)
    total.refused.extend(report.refused)
    total.renewals += report.renewals
    total.claim_seconds.extend(report.claim_seconds)
    total.malformed.extend(report.malformed)


def _as_refusal(outcome: p.Outcome) -> p.Refusal:
    if isinstance(outcome, p.Refusal):
        return outcome
    return p.Refusal(p.RefusalCode.INVALID_REQUEST, f"unexpected outcome {outcome!r}")


class WorkerPool:
    """Workers running in background threads of this process (made by :meth:`Client.start_workers`).

    ``report`` sums what every pass did so far; ``errors`` holds what
    stopped a worker early (a store failure it could not retry, a handler
    bug).  Use it as a context manager, or call :meth:`stop`.

    Idle workers poll every ``poll`` seconds, and wake at once when work is
    made: by the client that started them (an admission, an Event, a
    decision, a resume), and, on PostgreSQL, by any process, through
    LISTEN/NOTIFY.  A wake-up is a hint; polling still finds everything.
    """

    RIDE_OUT = RIDE_OUT_SECONDS
    """Seconds of store failures in a row (a lost connection, a row or file held) a worker waits out, with a backoff,
    before it stops, as ``fencekeeper worker`` does: a server restart or a failover does not end the pool's workers."""

    def __init__(self, workers: list[Worker], *, poll: float) -> None:
        self.workers = workers
        self.poll = poll
        self.report = PassReport()
        self.errors: list[str] = []
        self.passes = 0
        """Dispatcher passes completed so far, by every worker."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._work = threading.Condition()
        self.released: builtins.list[str] = []
        """Executions a stopping worker handed back (running -> eligible) after its last committed visit."""
        for worker in workers:
            self._hand_back_on_stop(worker)
        self._threads = [threading.Thread(target=self._loop, args=(w,), name=w.worker_id, daemon=True) for w in workers]
        wait_for_work = getattr(workers[0].store, "wait_for_work", None) if workers else None
        if callable(wait_for_work):
            self._threads.append(
                threading.Thread(target=self._listen, args=(wait_for_work,), name="listen", daemon=True)
            )

    def _hand_back_on_stop(self, worker: Worker) -> None:
        """After a stop, release the lease at the next committed visit, as ``fencekeeper worker`` does.

        A long execution need not run to its end (or wait for its lease to
        expire) for the pool to stop: another worker continues it at once.
        """

        def released(execution_id: str) -> None:
            with self._lock:
                self.released.append(execution_id)

        _hand_back_on_stop(worker, self._stop.is_set, released)

    def poke(self) -> None:
        """Wake idle workers now: work may have become eligible."""
        with self._work:
            self._work.notify_all()

    def _idle(self, seconds: float) -> None:
        with self._work:
            if not self._stop.is_set():
                self._work.wait(timeout=seconds)

    def _listen(self, wait_for_work: Any) -> None:
        # PostgreSQL's NOTIFY, from any process; short waits so that stop() is prompt.
        while not self._stop.is_set():
            try:
                if wait_for_work(min(self.poll, 1.0)):
                    self.poke()
            except Exception:
                self._stop.wait(min(self.poll, 1.0))

    def start(self) -> None:
        """Start every worker thread (done by :meth:`Client.start_workers`)."""
        for thread in self._threads:
            thread.start()

    @property
    def running(self) -> bool:
        """Whether any worker thread is still running."""
        return any(t.is_alive() for t in self._threads)

    def wait_until_idle(self, timeout: float = 60.0, *, settle: float = 0.2) -> bool:
        """Block until no pass has found work for ``settle`` seconds (or ``timeout``); True if idle."""
        deadline = time.monotonic() + timeout
        last = (-1, -1)
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            with self._lock:
                now = (len(self.report.claimed), self.report.timers_fired)
            if now != last:
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= max(settle, self.poll * 1.5):
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float | None = 30.0) -> None:
        """Ask every worker to stop after its current execution leaves running, and wait for them."""
        self._stop.set()
        self.poke()
        for thread in self._threads:
            # A worker's own handler may close its client, which stops this pool: it cannot wait for itself.
            if thread is not threading.current_thread():
                thread.join(timeout)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _loop(self, worker: Worker) -> None:
        try:
            self._claims(worker)
        finally:
            # A claim read ahead for a pass that will not come (run_pass's continues): rolled back.
            worker.drop_read_ahead()

    def _claims(self, worker: Worker) -> None:
        patience = StorePatience(budget=self.RIDE_OUT)
        while not self._stop.is_set():
            try:
                report = worker.run_pass(max_claims=1, continues=True)
            except StoreError as exc:
                wait = patience.failed(exc.code)
                if wait is None:
                    with self._lock:
                        self.errors.append(f"{worker.worker_id}: {exc.message} [{exc.code}]")
                    return
                self._idle(wait)
                continue
            except Exception as exc:
                with self._lock:
                    self.errors.append(f"{worker.worker_id}: {type(exc).__name__}: {exc}")
                return
            patience.succeeded()
            with self._lock:
                _add(self.report, report)
                self.passes += 1
            if not report.claimed and not report.timers_fired:
                self._idle(self.poll)
        if worker.holds_unfinished():
            # Stopped while a visit's answer was lost: finished under its lease and handed back if the store
            # answers within a few seconds, as `fencekeeper worker` does, rather than left to expire into review.
            try:
                taken = worker.take_up_before_stop()
            except Exception as exc:
                with self._lock:
                    self.errors.append(f"{worker.worker_id}: {type(exc).__name__}: {exc}")
                return
            if taken is not None:
                with self._lock:
                    _add(self.report, taken)


class _StopSwitch:
    """What a worker's stop hook asks: re-pointed when a worker held after a lost answer serves another call."""

    __slots__ = ("stopping",)

    def __init__(self, stopping: Callable[[], bool]) -> None:
        self.stopping = stopping

    def __call__(self) -> bool:
        return self.stopping()


def _hand_back_on_stop(
    worker: Worker, stopping: Callable[[], bool], released: Callable[[str], None] | None = None
) -> None:
    """Make ``worker`` stop once ``stopping()``: it releases its lease after the next committed visit
    (``released`` is told which execution), and claims nothing more."""
    previous = worker.on_event

    def on_event(execution_id: str, what: str, detail: str) -> None:
        if previous is not None:
            previous(execution_id, what, detail)
        token = worker.lease_token_of(execution_id)
        if token is None or not worker.hands_back_after(execution_id, what):
            return
        view = worker.store.read(execution_id)
        if view is None or view.execution.state is not ExecutionState.RUNNING:
            return
        credential = p.LeaseCredential(worker.worker_id, token, view.execution.fence)
        outcome = worker.store.release(execution_id, p.ReleaseRequest(credential, view.execution.revision))
        if isinstance(outcome, p.Decision) and released is not None:
            released(execution_id)

    worker.on_event = on_event
    worker.stopping = stopping


def _check_policy(policy: object) -> None:
    check = getattr(policy, "check", None)
    if not callable(check):
        raise RequestError(RequestCode.INVALID_ARGUMENT, "policy", "must be an AuthorityPolicy (a check method)")
    # Called as it is, an ``async def check`` answers a coroutine, not an Authority: every operation
    # then failed on an AttributeError, and the coroutine was never awaited.
    if inspect.iscoroutinefunction(check):
        raise RequestError(
            RequestCode.INVALID_ARGUMENT,
            "policy",
            "check is a coroutine function (async def); an AuthorityPolicy answers synchronously "
            "(with connect_async, on the event loop's thread: from memory or a cache)",
        )


def _check_handler(handler: object) -> None:
    if handler is not None and not (
        callable(getattr(handler, "execute", None)) and callable(getattr(handler, "reconcile", None))
    ):
        raise RequestError(
            RequestCode.INVALID_ARGUMENT, "handler", "must be a CommandHandler (execute and reconcile) or None"
        )
    # An ``async def execute`` answers a coroutine, which the worker takes for a handler that says
    # nothing: every Command's outcome was unknown, and every execution went to reconciliation.
    for name in ("execute", "reconcile"):
        if handler is not None and inspect.iscoroutinefunction(getattr(handler, name)):
            raise RequestError(
                RequestCode.INVALID_ARGUMENT,
                "handler",
                f"{name} is a coroutine function (async def); a CommandHandler is synchronous code, "
                "which workers call in threads (from there, asyncio.run can await a coroutine)",
            )


def _check_clock(clock: object) -> None:
    if clock is None:
        return
    now = getattr(clock, "now", None)
    if not callable(now):
        raise RequestError(RequestCode.INVALID_ARGUMENT, "clock", f"must be a Clock (a now method), not {shown(clock)}")
    # Asked once here: a naive or non-UTC clock (ManualClock(datetime(2026, 1, 1))) otherwise failed at the
    # first write, as a bare ValueError on SQLite and as a refusal naming ``now`` on the in-memory store.
    moment = now()
    problem = utc_problem(moment)
    if problem is not None:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "clock", f"now() returned {shown(moment)}: {problem}")


def _check_location(url: str, schema: str | None) -> None:
    """RequestError naming ``url`` or ``schema`` when they name no store, before anything is opened.

    Left to the store, these were StoreFailure ``store_unavailable`` (a
    retry's code for a caller's mistake), worded for the command line's
    ``--db`` and ``--schema``.
    """

    def python_names(message: str) -> str:
        return message.removeprefix("--db: ").replace("--db", "url").replace("--schema", "schema")

    try:
        location = connecting.parse_url(url)
    except StoreError as exc:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "url", python_names(exc.message)) from None
    if schema is not None:
        try:
            location = connecting.parse_url(url, schema=schema)
        except StoreError as exc:
            raise RequestError(RequestCode.INVALID_ARGUMENT, "schema", python_names(exc.message)) from None
    if location.kind == "postgresql":
        assert location.schema is not None
        from .postgres_store import check_schema_name  # noqa: PLC0415 - psycopg loads only for PostgreSQL URLs

        try:
            check_schema_name(location.schema)
        except StoreError as exc:
            raise RequestError(
                RequestCode.INVALID_ARGUMENT, "url" if schema is None else "schema", exc.message
            ) from None


def check_connect_arguments(
    url: object,
    *,
    schema: object,
    business: object,
    principal: object,
    policy: object,
    pool_size: object = 4,
    handler: object = None,
    clock: object = None,
    migrate: object = False,
) -> None:
    """The checks :func:`connect` makes before opening anything; RequestError naming the argument."""
    location = _text("url", url)
    # Only a bool: ``migrate="no"`` was true, and migrated a schema its caller meant to leave alone.
    if not isinstance(migrate, bool):
        raise RequestError(RequestCode.INVALID_ARGUMENT, "migrate", f"must be a bool, got {shown(migrate)}")
    # Left to the pool, a bad size was a StoreFailure store_unavailable: a retry's code for a caller's mistake.
    if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
        raise RequestError(RequestCode.INVALID_ARGUMENT, "pool_size", f"must be a positive int, got {shown(pool_size)}")
    named = None if schema is None else _identifier("schema", schema)
    if location != MEMORY:
        _check_location(location, named)
    _identifier("business", business)
    _identifier("principal", principal)
    _check_policy(policy)
    # Checked by Client too, but only after the store was opened: a SQLite file was created for nothing.
    _check_handler(handler)
    _check_clock(clock)


def _url_text(url: object) -> object:
    """A path object (``pathlib.Path``) names its SQLite file as its text does; anything else is checked as given."""
    if isinstance(url, os.PathLike):
        text = os.fspath(url)
        if isinstance(text, str):
            return text
    return url


def connect(
    url: str | os.PathLike[str],
    *,
    policy: AuthorityPolicy,
    handler: CommandHandler | None,
    business: str = DEFAULT_BUSINESS,
    principal: str = DEFAULT_PRINCIPAL,
    schema: str | None = None,
    migrate: bool = False,
    clock: Clock | None = None,
    pool_size: int = 4,
) -> Client:
    """A :class:`Client` for the store ``url`` names: a SQLite file path or a ``postgresql://`` DSN.

    ``":memory:"`` is the in-memory reference store, which keeps nothing
    past :meth:`Client.close` (for tests, and for trying things).

    ``policy`` answers every authority question; ``handler`` runs and
    settles Commands (``None`` for a client that never does).  Both are
    required, so that what a deployment trusts is always written where it
    connects.  A SQLite file is created (and brought forward) when opened;
    PostgreSQL is never migrated unless ``migrate=True`` (or ``fencekeeper
    migrate`` was run).  Raises StoreFailure when the store cannot be used.
    A SQLite path may be given as a ``pathlib.Path`` too.
    """
    # Refused as "must be a string" before, although a path object is how Python code holds a file's name.
    named = _url_text(url)
    check_connect_arguments(
        named,
        schema=schema,
        business=business,
        principal=principal,
        policy=policy,
        pool_size=pool_size,
        handler=handler,
        clock=clock,
        migrate=migrate,
    )
    assert isinstance(named, str)  # checked above
    store: TransactionalStore
    if named == MEMORY:
        # The in-memory reference store: nothing persists past close; for tests and trying things.
        if schema is not None:
            raise RequestError(RequestCode.INVALID_ARGUMENT, "schema", "applies to PostgreSQL only")
        store = MemoryStore(clock)
    else:
        with _opening():
            if migrate:
                connecting.migrate(named, schema=schema)
            store = connecting.open_store(named, schema=schema, clock=clock, pool_size=pool_size)
    try:
        return Client(store, policy=policy, handler=handler, business=business, principal=principal)
    except BaseException:
        store.close()
        raise


__all__ = [
    "DEFAULT_BUSINESS",
    "DEFAULT_LEASE",
    "DEFAULT_PRINCIPAL",
    "MEMORY",
    "Client",
    "Decided",
    "DecisionStatus",
    "DefinitionSource",
    "Registered",
    "WorkerPool",
    "check_connect_arguments",
    "connect",
    "load_definition",
    "translated",
    "wait_arguments",
]
