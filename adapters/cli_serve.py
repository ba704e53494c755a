"""``fencekeeper serve``: the HTTP boundary (``adapters/http.py``) under uvicorn.

Registered from ``cli.py``; the command line's conventions hold (exit 2 for
what cannot be acted on, 1 for a store that cannot be used as it is).
Everything is checked before the server starts: the ``--auth`` and
``--actions`` modules, and both stores (a SQLite file must exist; a
PostgreSQL schema must be migrated), so a misconfigured deployment fails at
once, in one line, rather than on its first request.

``--auth MODULE`` is the deployment's authentication, never a default: the
module's ``authenticate(request)`` returns an
:class:`~fencekeeper.adapters.http.HttpPrincipal` or None, and its optional
``policy()`` returns the executions' AuthorityPolicy (without it only the
operations are served).  ``--actions MODULE`` is the registry module
``fencekeeper op`` takes.

uvicorn stops on SIGINT or SIGTERM after the requests in flight, then the
stores are closed and the command exits 0; a request cut off mid-way
committed all of its transaction or none of it.
"""

from __future__ import annotations

import argparse
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

from fencekeeper.kernel.common import shown, shown_text

from . import cli_ops, connect
from .operations.connect import open_operation_store
from .render import Output
from .store import StoreError


class ServeError(Exception):
    """What ``serve`` cannot act on; ``cli.py`` prints it as a usage error."""


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> None:
    serve = command(
        "serve",
        "serve the HTTP boundary: operations and workflow executions (needs fencekeeper[http])",
        description="Runs create_operations_app() with uvicorn. Authentication is the deployment's (--auth).",
    )
    serve.add_argument(
        "--db", required=True, metavar="URL", help="a SQLite file or a postgresql:// DSN (optionally ?schema=NAME)"
    )
    serve.add_argument("--schema", metavar="NAME", help="PostgreSQL schema (default: fencekeeper)")
    serve.add_argument(
        "--auth", required=True, metavar="MODULE", help="authenticate(request) -> HttpPrincipal | None; optional policy()"
    )
    serve.add_argument("--actions", default=cli_ops.DEFAULT_ACTIONS, metavar="MODULE", help="registry() and resolvers()")
    serve.add_argument("--namespace", default="default", help="the operations' namespace (default: default)")
    serve.add_argument("--host", default="127.0.0.1", help="default: 127.0.0.1 (loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="default: 8000")


def _auth_module(name: str) -> Any:
    try:
        module = cli_ops.import_deployment_module(name)
    except ImportError as exc:
        raise ServeError(f"--auth: cannot import {shown(name)}: {shown_text(exc)}") from None
    except Exception as exc:  # an empty or relative name, or the module's own failure; --debug shows it through the cause
        problem = shown_text(f"{type(exc).__name__}: {' '.join(str(exc).split())}")
        raise ServeError(f"--auth: cannot import {shown(name)}: {problem}") from exc
    if not callable(getattr(module, "authenticate", None)):
        raise ServeError(f"--auth: {shown_text(name)} has no authenticate(request) function")
    return module


def _listening(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the server starts.

    uvicorn's own bind reports a failure as a log line of its own and exit
    status 3; bound here, an address in use or a host that does not resolve is
    one ``--host``/``--port`` line and exit 2, as every other setting is.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ServeError(f"--host: cannot resolve {shown(host)}: {shown_text(exc)}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServeError(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _stopped(number: int, frame: FrameType | None) -> None:
    """The signal uvicorn raises again once it has stopped: nothing more to do."""


def run(args: argparse.Namespace, out: Output) -> int:
    if not 0 < args.port < 65536:
        raise ServeError(f"--port: must be 1-65535, got {args.port}")
    try:
        import uvicorn  # noqa: PLC0415 - the http extra loads only for this command

        from .http import create_operations_app  # noqa: PLC0415
    except ImportError as exc:
        raise ServeError(f"serve needs the http extra: pip install 'fencekeeper[http]' ({exc})") from None
    auth = _auth_module(args.auth)
    _, actions, resolvers = cli_ops.load_registries(args.actions)
    policy = auth.policy() if callable(getattr(auth, "policy", None)) else None
    if policy is not None and not callable(getattr(policy, "check", None)):
        # Otherwise every execution request would be refused, one by one, as the request's fault.
        raise ServeError(f"--auth: {args.auth}.policy() returned {type(policy).__name__}, not an AuthorityPolicy")
    location = connect.parse_url(args.db, schema=args.schema)
    if location.kind == "sqlite" and location.path is not None and not location.path.exists():
        # Serving never creates a store: a mistyped path is refused, not made.
        raise StoreError(
            "store_unavailable",
            f"--db: no database at {location.path} (`fencekeeper migrate --db {location.path}` creates one)",
        )
    listening = _listening(args.host, args.port)
    try:
        # The executions' store only when its routes are served: the restricted application role of
        # the operations' tenant boundary may hold no grants on the executions' tables.
        executions = connect.open_store(args.db, schema=args.schema, create=False) if policy is not None else None
    except BaseException:
        listening.close()
        raise
    try:
        operations = open_operation_store(args.db, schema=args.schema)
        try:
            app = create_operations_app(
                authenticate=auth.authenticate,
                operations=operations,
                actions=actions,
                resolvers=resolvers,
                namespace=args.namespace,
                executions=executions,
                policy=policy,
            )
            served = "operations and workflow executions" if policy is not None else "operations"
            out.note(f"serving {served} on http://{args.host}:{args.port} ({location.describe()})")
            # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again with the
            # handlers it found installed: these make that a normal return, so the stores are closed
            # and the command exits 0 rather than dying by the signal.
            previous = {number: signal.signal(number, _stopped) for number in (signal.SIGINT, signal.SIGTERM)}
            try:
                config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False)
                uvicorn.Server(config).run(sockets=[listening])
            finally:
                for number, handler in previous.items():
                    signal.signal(number, handler)
            out.note("stopped")
        finally:
            operations.close()
    finally:
        listening.close()
        if executions is not None:
            executions.close()
    return 0
