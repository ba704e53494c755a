"""The HTTP boundary: dispatch, status, decision and cancellation of operations and workflow executions.

Seed 001 (Stable v0.7 additions) names ``create_durable_operations_router()``
as "an explicit generic dispatch, status, decision, and cancellation
boundary"; :func:`create_operations_app` is that boundary, a Starlette
application a deployment serves on its own (``fencekeeper serve``) or mounts
into its Starlette or FastAPI app (``app.mount("/fk", create_operations_app(...))``).

Rules of this module:

- Authentication is the deployment's.  Its :data:`Authenticate` turns a
  request into an :class:`HttpPrincipal` (who, and in which tenant) or None
  (401).  Nothing in a request body, path or header chooses its own principal
  or tenant: a body that names ``tenant``, ``principal``, ``namespace`` or
  any other field the route does not take is refused (422).
- Authorization is the services' own, asked now: the operation service
  resolves the principal's current identity and membership, the executions'
  :class:`~fencekeeper.adapters.ports.AuthorityPolicy` answers for the
  principal in its tenant.  A refusal is 403.  Another tenant's operation or
  execution does not exist for the caller (404), checked here as well as by
  the store (forced row-level security on PostgreSQL, through
  ``tenant_scope``).
- Every body is checked before anything is opened for writing; a malformed
  one is 422 naming the field, and nothing is written.
- Status codes: 200 an answer (an idempotent repeat included), 201 a new
  Operation or execution, 401, 403, 404, 409 a conflict with what is stored
  (an idempotency key reused with another request, an event id with other
  content, a decision or cancellation the state refuses), 413 a body over :data:`MAX_BODY_BYTES`,
  415 a POST that does not declare JSON, 422 a malformed request, 503 the store is unavailable.  Every error body is ``{"error": {"code", "message", "field"?}}``
  with the services' stable codes.
- Operation submission requires the ``Idempotency-Key`` header of the IETF
  draft "The Idempotency-Key HTTP Header Field", bare (``k-1``) or in the
  draft's string syntax (``"k-1"``), one key either way.  The statuses are
  this boundary's, not the draft's (400 and 422): a missing key is 422 as
  every malformed request is, a key reused with another request 409 as
  every conflict with what is stored is.
- Bodies are UTF-8 JSON (RFC 8259, section 8.1); a header that names one
  thing (``Authorization``, ``Content-Type``, ``Idempotency-Key``) is
  refused when sent twice rather than read as its first line.
- The services block (a database round trip); each request runs them in a
  worker thread, so the event loop never waits on the database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel import strict_json
from fencekeeper.kernel.common import identifier_problem, shown

from . import render
from .client import Client
from .errors import Refused, RequestCode, RequestError, StoreFailure
from .operations.base import TransactionalOperationStore
from .operations.service import (
    DurableActionRegistry,
    DurableOperationError,
    DurableOperationService,
    OperationRecord,
    PrincipalReference,
    PrincipalResolverRegistry,
)
from .ports import AuthorityPolicy
from .store import StoreError, TransactionalStore

__all__ = ["Authenticate", "BearerTokens", "HttpPrincipal", "create_operations_app"]


@attrs.frozen
class HttpPrincipal:
    """Who a request is, as the deployment's authentication established it, and the tenant it acts in."""

    reference: PrincipalReference
    """The operations' principal (resolver, version, subject); resolved again, now, before every change."""
    tenant: str
    """The operations' tenant, and the executions' business."""

    @property
    def executions_principal(self) -> str:
        """The principal id the executions' authority policy is asked about: the reference's stored form."""
        return self.reference.ref


Authenticate = Callable[[Request], HttpPrincipal | Awaitable[HttpPrincipal | None] | None]
"""The deployment's authentication: a principal, or None for a request without a valid identity (401).

A plain function runs on the event loop (right for a table lookup such as
:class:`BearerTokens`); one that waits on the network should be ``async``.
"""


class BearerTokens:
    """An :data:`Authenticate` over fixed bearer tokens: ``Authorization: Bearer TOKEN`` names one principal.

    For a deployment whose identities are few and provisioned (service
    accounts, a local operator); others plug in their own, e.g. one that
    verifies a JWT.  Tokens are kept only as SHA-256 digests, and a lookup
    compares digests, so the time a lookup takes says nothing about a
    token's characters.
    """

    def __init__(self, tokens: Mapping[str, HttpPrincipal]) -> None:
        self._by_digest = {hashlib.sha256(token.encode("utf-8")).digest(): who for token, who in tokens.items()}

    def __call__(self, request: Request) -> HttpPrincipal | None:
        given = request.headers.getlist("authorization")
        if len(given) != 1:
            # Two credentials (a client's and a proxy's, say) name no one principal: taking the first
            # authenticated whoever happened to come first.
            return None
        scheme, _, token = given[0].partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self._by_digest.get(hashlib.sha256(token.strip().encode("utf-8")).digest())


class _Problem(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    def response(self) -> JSONResponse:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        headers: dict[str, str] = {}
        if self.status == 401:
            # RFC 9110: a 401 names the scheme a client should authenticate with.
            headers["WWW-Authenticate"] = "Bearer"
        elif self.status == 503:
            # Every 503 here passes (a lock released, a server back): a client's retry logic (urllib3's
            # Retry, for one) waits as long as this says rather than guessing.
            headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return JSONResponse({"error": error}, status_code=self.status, headers=headers)


# The operation service's codes, by what they mean to an HTTP caller.
_OPERATION_STATUS = {
    "invalid_input": 422,
    "invalid_request": 422,
    "unknown_action": 422,
    "invalid_action": 422,
    "operation_not_found": 404,
    "not_authorized": 403,
}
_REQUEST_STATUS = {RequestCode.EXECUTION_NOT_FOUND: 404, RequestCode.DEFINITION_NOT_FOUND: 404}


def _from_operation_error(exc: DurableOperationError) -> _Problem:
    if exc.code == "principal_unavailable":
        # The identity provider's temporary outage passes: retry, as for an unavailable store.
        return _Problem(503, exc.code, exc.message)
    # Every other refusal (idempotency_conflict, cancel_too_late, approval_*) conflicts with what is stored.
    return _Problem(_OPERATION_STATUS.get(exc.code, 409), exc.code, exc.message, exc.field)


def _from_store_error(exc: StoreError) -> _Problem:
    if exc.code == "tenant_denied":
        return _Problem(403, exc.code, exc.message)
    if exc.code in ("store_unavailable", "row_locked", "store_locked"):
        # Each passes: a server back, a holder's transaction ended (at most its idle timeout), SQLite's
        # writer done. Retry, as the command line does.
        return _Problem(503, exc.code, exc.message)
    if exc.code in _CONFLICTS_WITH_STORED:
        # The request, not the server: an id the client chose already names other content (an event_id
        # published again with another payload was a 500, as if the server had failed).
        return _Problem(409, exc.code, exc.message)
    return _Problem(500, exc.code, exc.message)


# docs/stores.md, Refusals: an identity already stored with other content; the whole request changed nothing.
_CONFLICTS_WITH_STORED = frozenset({"event_conflict", "evidence_conflict", "registration_conflict"})


# --- bodies -------------------------------------------------------------------------------------

_CHOSEN_BY_AUTHENTICATION = frozenset({"tenant", "principal", "namespace", "business", "as", "requester", "approver"})


RETRY_AFTER_SECONDS = 1
"""The ``Retry-After`` of every 503: a store's lock or connection is the kind of thing a second mends."""

MAX_BODY_BYTES = 1 << 20
"""A body longer than this is refused (413) before it is parsed; an operation's input is a request, not a payload store."""


async def _read(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _Problem(413, "body_too_large", f"the body is {declared} bytes; at most {MAX_BODY_BYTES} are read")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _Problem(413, "body_too_large", f"the body is longer than {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # A client that gave up mid-upload (its own timeout) is no failure of the server: left to the 500
        # handler, each one logged a traceback as a bug. Nobody reads this answer; nothing was written.
        raise _Problem(400, "body_incomplete", "the connection closed before the whole body arrived") from None
    return b"".join(chunks)


async def _body(
    request: Request,
    allowed: Mapping[str, tuple[type, ...]],
    required: frozenset[str] = frozenset(),
    *,
    keyed: bool = False,
) -> dict[str, Any]:
    """The JSON object of the request, with only ``allowed`` fields of their types; anything else is 422."""
    # Every POST declares JSON, even with no body: a browser sends that cross-site only after a CORS
    # preflight this application never grants, so an authenticate that reads a session cookie is not
    # open to cross-site request forgery (a form, or a no-cors fetch, posts text/plain or nothing).
    declared = request.headers.getlist("content-type")
    if len(declared) > 1:
        # Which one the body is in is anyone's guess; the first was taken, so a JSON one hid a text/plain one.
        raise _Problem(
            415, "unsupported_media_type", f"Content-Type: given {len(declared)} times; send one", "Content-Type"
        )
    media = (declared[0] if declared else "").partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        given = shown(media) if media else "none"
        raise _Problem(
            415, "unsupported_media_type", f"Content-Type: must be application/json, got {given}", "Content-Type"
        )
    if not keyed and "idempotency-key" in request.headers:
        # Ignored, the header promised a safe retry this request does not keep: a POST /executions sent
        # again with it admitted a second execution.
        raise _Problem(
            422,
            "invalid_body",
            "Idempotency-Key: only POST /operations takes one; a retry of this request is safe with the body's own "
            "id (execution_id, event_id, decision_id), or is answered by what the first attempt did",
            "Idempotency-Key",
        )
    raw = await _read(request)
    try:
        # RFC 8259, section 8.1: JSON between systems is UTF-8. Given bytes, json would also take UTF-16 and
        # UTF-32, a byte order mark, and a surrogate encoded on its own: no client meant those as one text.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Problem(
            422, "invalid_body", f"the body is not UTF-8: byte {raw[exc.start]:#04x} at offset {exc.start}"
        ) from None
    if text.startswith("\ufeff"):
        raise _Problem(422, "invalid_body", "the body starts with a byte order mark; send JSON without one (RFC 8259)")
    if not text.strip(" \t\r\n"):
        data: Any = {}
    else:
        try:
            data = strict_json.loads(text)
        except strict_json.StrictJsonError as exc:
            # A member named twice, NaN, nesting too deep: read as the command line reads its JSON.
            raise _Problem(422, "invalid_body", f"the body is not JSON this boundary reads: {exc}") from None
        except ValueError as exc:
            # Not only JSONDecodeError: an integer longer than Python converts (sys.get_int_max_str_digits)
            # is a plain ValueError.
            raise _Problem(422, "invalid_body", f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _Problem(422, "invalid_body", f"the body must be a JSON object, not {_json_type(data)}")
    for name in data:
        if name in _CHOSEN_BY_AUTHENTICATION:
            raise _Problem(
                422, "invalid_body", f"{name}: chosen by the deployment's authentication, never by a request", name
            )
        if name not in allowed:
            raise _Problem(422, "invalid_body", f"{name}: not a field of this request (fields: {', '.join(sorted(allowed))})", name)
    for name in sorted(required):
        if name not in data:
            raise _Problem(422, "invalid_body", f"{name}: required", name)
    for name, value in data.items():
        types = allowed[name]
        if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            wanted = " or ".join(_JSON_TYPES[t] for t in types)
            raise _Problem(422, "invalid_body", f"{name}: must be {wanted}, got {_json_type(value)}", name)
    return data


# A request's types in JSON's words: a JavaScript or Go client has no "str" or "dict".
_JSON_TYPES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "an array",
    type(None): "null",
}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _identifier(name: str, value: str) -> str:
    problem = identifier_problem(value)
    if problem is not None:
        raise _Problem(422, "invalid_body", f"{name}: {problem}", name)
    return value


_ANY: tuple[type, ...] = ()

# A submission's parts as the operation service names them, and as a request sends them.
_SUBMISSION_FIELDS = {
    "action_name": "action",
    "action_version": "version",
    "input_digest": "input",
    "client_key": "Idempotency-Key",
}


# --- the application ------------------------------------------------------------------------------


def create_operations_app(
    *,
    authenticate: Authenticate,
    operations: TransactionalOperationStore | None = None,
    actions: DurableActionRegistry | None = None,
    resolvers: PrincipalResolverRegistry | None = None,
    namespace: str = "default",
    executions: TransactionalStore | None = None,
    policy: AuthorityPolicy | None = None,
    service_options: Mapping[str, Any] | None = None,
) -> Starlette:
    """The HTTP boundary as a Starlette application (mount it, or serve it).

    ``operations`` with ``actions`` and ``resolvers`` serve ``/operations``;
    ``executions`` with ``policy`` serve ``/executions`` and ``/events``.
    Either part may be left out.  The stores stay the caller's to close.
    ``service_options`` go to :class:`DurableOperationService` (retention,
    approval validity, decide and cancel policies).
    """
    routes: list[Route] = []
    if operations is not None:
        if actions is None or resolvers is None:
            raise ValueError("operations: actions and resolvers are required with an operation store")
        service = DurableOperationService(operations, actions, resolvers, namespace=namespace, **(service_options or {}))
        routes += _operation_routes(authenticate, operations, service)
    if executions is not None:
        if policy is None:
            raise ValueError("executions: an AuthorityPolicy is required with an execution store")
        routes += _execution_routes(authenticate, executions, policy)
    app = Starlette(routes=routes, exception_handlers={HTTPException: _routing_problem, Exception: _unexpected})
    # Starlette answered /operations/ with a bodiless 307 to /operations, built from the Host header (behind
    # a TLS proxy, an http:// address), which a client then followed with its body and credentials: a path
    # that is no route is the documented 404.
    app.router.redirect_slashes = False
    return app


async def _unexpected(request: Request, exc: Exception) -> Response:
    # A bug, here or in the deployment's code: the one error shape, nothing of the exception shown to the
    # caller. Starlette raises the exception again after this answer, so the server still logs it.
    return JSONResponse(
        {"error": {"code": "internal_error", "message": "the server failed to answer this request; it is logged"}},
        status_code=500,
    )


async def _routing_problem(request: Request, exc: Exception) -> Response:
    # Starlette's own 404 (no such route) and 405 (a route without this method) would otherwise be plain
    # text; every error of this boundary has the one JSON shape.  A 405 keeps its Allow header.
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        {"error": {"code": code, "message": f"{request.method} {request.url.path}: {exc.detail}"}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


Handler = Callable[[Request, HttpPrincipal], Awaitable[Response]]


def _query(request: Request, allowed: frozenset[str]) -> None:
    """Only ``allowed`` query parameters, each at most once: a misspelt filter is refused, not ignored."""
    for name in request.query_params:
        if name not in allowed:
            taken = f" (parameters: {', '.join(sorted(allowed))})" if allowed else " (this request takes none)"
            raise _Problem(422, "invalid_query", f"{name}: not a query parameter of this request{taken}", name)
        if len(request.query_params.getlist(name)) > 1:
            raise _Problem(422, "invalid_query", f"{name}: given more than once", name)


def _endpoint(
    authenticate: Authenticate, handler: Handler, query: frozenset[str] = frozenset()
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            principal = authenticate(request)
            if not isinstance(principal, HttpPrincipal) and principal is not None:
                principal = await principal
            if principal is None:
                raise _Problem(401, "not_authenticated", "no valid identity in this request")
            _query(request, query)
            return await handler(request, principal)
        except _Problem as problem:
            return problem.response()
        except DurableOperationError as exc:
            return _from_operation_error(exc).response()
        except StoreError as exc:
            return _from_store_error(exc).response()

    return endpoint


def _operation_routes(
    authenticate: Authenticate, store: TransactionalOperationStore, service: DurableOperationService
) -> list[Route]:
    def visible(principal: HttpPrincipal, operation_id: str) -> OperationRecord:
        """The caller's tenant's Operation; another tenant's does not exist for the caller."""
        record = service.get(operation_id, tenant=principal.tenant)
        if record is None:
            raise _Problem(404, "operation_not_found", f"operation {shown(operation_id)} does not exist")
        return record

    def scoped(principal: HttpPrincipal, work: Callable[[], Any]) -> Awaitable[Any]:
        def run() -> Any:
            with store.tenant_scope(principal.tenant):
                return work()

        return run_in_threadpool(run)

    async def submit(request: Request, principal: HttpPrincipal) -> Response:
        keys = request.headers.getlist("idempotency-key")
        if not keys:
            raise _Problem(422, "idempotency_key_missing", "Idempotency-Key: this request requires the header", "Idempotency-Key")
        if len(keys) > 1:
            # Two keys (a client's and a proxy's, say) name two identities: taking the first, as the header lookup
            # did, admitted under a key the client may not have meant, and a retry sending the other admitted again.
            raise _Problem(422, "invalid_body", f"Idempotency-Key: given {len(keys)} times; send one key", "Idempotency-Key")
        key = keys[0]
        if len(key) >= 2 and key[0] == key[-1] == '"':
            # The draft's syntax is a Structured Field string (RFC 8941), "k-1" with its quotes, and its
            # examples send that; a bare k-1 is the same key. An identifier holds no quote or backslash, so
            # a string with an escape in it is refused below.
            key = key[1:-1]
        _identifier("Idempotency-Key", key)
        body = await _body(request, {"action": (str,), "version": (int,), "input": _ANY}, frozenset({"action"}), keyed=True)
        version = body.get("version")
        if version is not None and version < 1:
            raise _Problem(422, "invalid_body", f"version: must be at least 1, got {version}", "version")
        try:
            admission = await scoped(
                principal,
                lambda: service.submit(
                    tenant=principal.tenant,
                    principal=principal.reference,
                    action=body["action"],
                    input=body.get("input"),
                    client_key=key,
                    version=version,
                ),
            )
        except DurableOperationError as exc:
            # The kernel names the stored column that differs (input_digest, action_name, ...); a caller
            # looks for the part of its own request, which has no field of that name.
            problem = _from_operation_error(exc)
            if problem.field is not None:
                problem.field = _SUBMISSION_FIELDS.get(problem.field, problem.field)
            raise problem from None
        payload = {"operation_id": admission.operation_id, "created": admission.created, **admission.record.to_json()}
        return JSONResponse(payload, status_code=201 if admission.created else 200)

    async def status(request: Request, principal: HttpPrincipal) -> Response:
        operation_id = request.path_params["operation_id"]
        record = await scoped(principal, lambda: visible(principal, operation_id))
        return JSONResponse(record.to_json())

    async def history(request: Request, principal: HttpPrincipal) -> Response:
        operation_id = request.path_params["operation_id"]

        def read() -> list[dict[str, Any]]:
            return [line.to_json() for line in service.history(operation_id, tenant=principal.tenant)]

        return JSONResponse({"operation_id": operation_id, "history": await scoped(principal, read)})

    async def decide(request: Request, principal: HttpPrincipal) -> Response:
        operation_id = request.path_params["operation_id"]
        body = await _body(
            request, {"approve": (bool,), "input_digest": (str,), "approval_id": (str,)}, frozenset({"approve"})
        )
        if "approval_id" in body:
            _identifier("approval_id", body["approval_id"])

        def run() -> OperationRecord:
            visible(principal, operation_id)
            return service.decide(
                operation_id,
                approver=principal.reference,
                approve=body["approve"],
                input_digest=body.get("input_digest"),
                approval_id=body.get("approval_id"),
                tenant=principal.tenant,
            )

        return JSONResponse((await scoped(principal, run)).to_json())

    async def cancel(request: Request, principal: HttpPrincipal) -> Response:
        operation_id = request.path_params["operation_id"]
        body = await _body(request, {"reason": (str,)})

        def run() -> OperationRecord:
            visible(principal, operation_id)
            return service.cancel(
                operation_id, principal=principal.reference, reason=body.get("reason", ""), tenant=principal.tenant
            )

        return JSONResponse((await scoped(principal, run)).to_json())

    def route(path: str, handler: Handler, method: str) -> Route:
        return Route(path, _endpoint(authenticate, handler), methods=[method])

    return [
        route("/operations", submit, "POST"),
        route("/operations/{operation_id}", status, "GET"),
        route("/operations/{operation_id}/history", history, "GET"),
        route("/operations/{operation_id}/decision", decide, "POST"),
        route("/operations/{operation_id}/cancel", cancel, "POST"),
    ]


def _execution_routes(authenticate: Authenticate, store: TransactionalStore, policy: AuthorityPolicy) -> list[Route]:
    def client(principal: HttpPrincipal) -> Client:
        # A client per request: the business and principal are the authenticated ones, never the request's.
        return Client(store, policy=policy, handler=None, business=principal.tenant, principal=principal.executions_principal)

    async def call(work: Callable[[], Any], members: Mapping[str, str] | None = None) -> Any:
        """``work`` in a thread, its errors as problems; ``members`` renames a client parameter to the body
        member that carried it, so that a refusal names the field the request sent."""

        def run() -> Any:
            try:
                return work()
            except Refused as exc:
                status = 403 if exc.code is p.RefusalCode.NOT_AUTHORIZED else 409
                # The kernel's own message: the code is the error's own field, not repeated in its text.
                raise _Problem(status, exc.code.value, exc.refusal.message) from None
            except RequestError as exc:
                # The client's hint for a Python caller (a definition file is passed as a pathlib.Path) means
                # nothing to a request, which names registered definitions only.
                message = str(exc).removesuffix(" (a file needs pathlib.Path)")
                field = (members or {}).get(exc.field, exc.field)
                if field != exc.field:
                    message = field + message.removeprefix(exc.field)
                raise _Problem(_REQUEST_STATUS.get(exc.code, 422), exc.code.value, message, field) from None
            except StoreFailure as exc:
                # By the store's own code, as the operation routes map it: StoreFailure.code folds the
                # codes the client does not know (tenant_denied) into store_error.
                raise _from_store_error(
                    StoreError(exc.store_code, exc.message.removesuffix(f" [{exc.store_code}]"))
                ) from None

        return await run_in_threadpool(run)

    async def run(request: Request, principal: HttpPrincipal) -> Response:
        body = await _body(
            request,
            {"definition": (str,), "revision": (int,), "input": (dict,), "execution_id": (str,)},
            frozenset({"definition"}),
        )
        # Only a registered definition, by id: registering definitions is the deployment's code, not a request's.
        definition = _identifier("definition", body["definition"])
        if "execution_id" in body:
            _identifier("execution_id", body["execution_id"])
        execution = await call(
            lambda: client(principal).run(
                definition, body.get("input"), execution_id=body.get("execution_id"), revision=body.get("revision")
            )
        )
        return JSONResponse(render.jsonable(execution), status_code=201)

    async def listing(request: Request, principal: HttpPrincipal) -> Response:
        state = request.query_params.get("state")
        executions = await call(lambda: client(principal).list(state))
        return JSONResponse({"executions": render.jsonable(executions)})

    async def inspect(request: Request, principal: HttpPrincipal) -> Response:
        execution_id = request.path_params["execution_id"]
        view = await call(lambda: client(principal).inspect(execution_id))
        return JSONResponse(
            {
                "execution": render.jsonable(view.execution),
                "dispatch": render.jsonable(view.dispatch),
                "history": render.jsonable(view.history),
            }
        )

    async def event(request: Request, principal: HttpPrincipal) -> Response:
        body = await _body(
            request,
            {"type": (str,), "correlation": (dict,), "payload": (dict,), "event_id": (str,)},
            frozenset({"type", "correlation"}),
        )
        if "event_id" in body:
            _identifier("event_id", body["event_id"])
        published = await call(
            lambda: client(principal).publish(
                body["type"], body["correlation"], body.get("payload"), event_id=body.get("event_id")
            ),
            {"event_type": "type"},
        )
        return JSONResponse(render.jsonable(published))

    async def decide(request: Request, principal: HttpPrincipal) -> Response:
        execution_id = request.path_params["execution_id"]
        body = await _body(
            request,
            {"determination": (str,), "decision_id": (str,), "rationale": (str,)},
            frozenset({"determination"}),
        )
        if body["determination"] not in p.DETERMINATIONS:
            raise _Problem(
                422, "invalid_body", f"determination: one of {', '.join(p.DETERMINATIONS)}", "determination"
            )
        if "decision_id" in body:
            _identifier("decision_id", body["decision_id"])
        decided = await call(
            lambda: client(principal).decide(
                execution_id,
                body["determination"],
                decision_id=body.get("decision_id"),
                rationale=body.get("rationale", ""),
            )
        )
        return JSONResponse(render.jsonable(decided))

    async def cancel(request: Request, principal: HttpPrincipal) -> Response:
        execution_id = request.path_params["execution_id"]
        body = await _body(request, {"reason": (str,)})
        execution = await call(lambda: client(principal).cancel(execution_id, reason=body.get("reason", "")))
        return JSONResponse(render.jsonable(execution))

    def route(path: str, handler: Handler, method: str) -> Route:
        return Route(path, _endpoint(authenticate, handler), methods=[method])

    async def run_or_list(request: Request, principal: HttpPrincipal) -> Response:
        if request.method == "POST":
            _query(request, frozenset())
            return await run(request, principal)
        return await listing(request, principal)

    return [
        # One route for both methods: a 405 on /executions then names both in its Allow header.
        Route("/executions", _endpoint(authenticate, run_or_list, frozenset({"state"})), methods=["GET", "POST"]),
        # An execution id may hold "/" (orders/o-1): a path parameter, or no route would reach it. No two
        # routes of one method overlap: GET has only the id, and POST ends in /decision or /cancel.
        route("/executions/{execution_id:path}", inspect, "GET"),
        route("/executions/{execution_id:path}/decision", decide, "POST"),
        route("/executions/{execution_id:path}/cancel", cancel, "POST"),
        route("/events", event, "POST"),
    ]
