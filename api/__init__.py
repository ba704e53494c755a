"""fencekeeper: durable workflow execution whose leases and fencing are decided by a pure kernel.

The front door::

    import fencekeeper
    from pathlib import Path

    with fencekeeper.connect("shop.db", policy=my_policy, handler=my_handler) as client:
        execution = client.run(Path("purchase_approval.toml"), {"order_id": "o-1", "order_revision": 1, "amount": 2500})
        client.run_until_idle()
        print(client.get(execution.execution_id).state)

``connect`` takes a SQLite file path or a ``postgresql://`` DSN, the
deployment's :class:`AuthorityPolicy` and its :class:`CommandHandler`
(docs/python.md shows both); ``connect_async`` is the same for asyncio.  A
kernel refusal raises :class:`Refused` with the kernel's :class:`RefusalCode`
(or is returned as a value with ``raise_on_refusal=False``); bad input raises
:class:`RequestError` naming the parameter and writes nothing.

The pure kernel is importable on its own as :mod:`fencekeeper.kernel`; this
module loads the client only when one of its names is first used, so that
``import fencekeeper.kernel`` stays free of stores, threads and I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
"""The distribution's version (pyproject.toml reads it from here)."""

if TYPE_CHECKING:
    from fencekeeper.adapters.aio import AsyncClient, connect_async
    from fencekeeper.adapters.client import (
        Client,
        Decided,
        DecisionStatus,
        DefinitionSource,
        Registered,
        WorkerPool,
        connect,
    )
    from fencekeeper.adapters.errors import (
        FencekeeperError,
        Refused,
        RequestCode,
        RequestError,
        StoreCode,
        StoreFailure,
    )
    from fencekeeper.adapters.ports import AuthorityPolicy, CommandHandler, GrantTable
    from fencekeeper.adapters.service import Reconciled, RecoveryView, Sweep
    from fencekeeper.adapters.store import ExecutionView, PublishResult
    from fencekeeper.adapters.worker import PassReport
    from fencekeeper.kernel.approvals import ApprovalRequest
    from fencekeeper.kernel.interpreter import Command, CommandResult, CommandStatus, Rejection
    from fencekeeper.kernel.machines import ExecutionState
    from fencekeeper.kernel.protocol import Authority, Execution, Refusal, RefusalCode

_EXPORTS: dict[str, str] = {
    "AsyncClient": "fencekeeper.adapters.aio",
    "connect_async": "fencekeeper.adapters.aio",
    "Client": "fencekeeper.adapters.client",
    "Decided": "fencekeeper.adapters.client",
    "DecisionStatus": "fencekeeper.adapters.client",
    "DefinitionSource": "fencekeeper.adapters.client",
    "Registered": "fencekeeper.adapters.client",
    "WorkerPool": "fencekeeper.adapters.client",
    "connect": "fencekeeper.adapters.client",
    "FencekeeperError": "fencekeeper.adapters.errors",
    "Refused": "fencekeeper.adapters.errors",
    "RequestCode": "fencekeeper.adapters.errors",
    "RequestError": "fencekeeper.adapters.errors",
    "StoreCode": "fencekeeper.adapters.errors",
    "StoreFailure": "fencekeeper.adapters.errors",
    "AuthorityPolicy": "fencekeeper.adapters.ports",
    "CommandHandler": "fencekeeper.adapters.ports",
    "GrantTable": "fencekeeper.adapters.ports",
    "Reconciled": "fencekeeper.adapters.service",
    "RecoveryView": "fencekeeper.adapters.service",
    "Sweep": "fencekeeper.adapters.service",
    "ExecutionView": "fencekeeper.adapters.store",
    "PublishResult": "fencekeeper.adapters.store",
    "PassReport": "fencekeeper.adapters.worker",
    "ApprovalRequest": "fencekeeper.kernel.approvals",
    "Command": "fencekeeper.kernel.interpreter",
    "CommandResult": "fencekeeper.kernel.interpreter",
    "CommandStatus": "fencekeeper.kernel.interpreter",
    "Rejection": "fencekeeper.kernel.interpreter",
    "ExecutionState": "fencekeeper.kernel.machines",
    "Authority": "fencekeeper.kernel.protocol",
    "Execution": "fencekeeper.kernel.protocol",
    "Refusal": "fencekeeper.kernel.protocol",
    "RefusalCode": "fencekeeper.kernel.protocol",
}


_SUBPACKAGES = ("kernel", "adapters")
"""Reached as ``fencekeeper.kernel`` after a bare ``import fencekeeper``, as docs/python.md names them."""


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562), so importing the kernel alone stays pure."""
    import importlib  # noqa: PLC0415 - loaded only when a name is first used

    if name in _SUBPACKAGES:
        # Without this, fencekeeper.kernel was an AttributeError until something had imported it.
        return importlib.import_module(f"fencekeeper.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fencekeeper' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "ApprovalRequest",
    "AsyncClient",
    "Authority",
    "AuthorityPolicy",
    "Client",
    "Command",
    "CommandHandler",
    "CommandResult",
    "CommandStatus",
    "Decided",
    "DecisionStatus",
    "DefinitionSource",
    "Execution",
    "ExecutionState",
    "ExecutionView",
    "FencekeeperError",
    "GrantTable",
    "PassReport",
    "PublishResult",
    "Reconciled",
    "RecoveryView",
    "Refusal",
    "RefusalCode",
    "Refused",
    "Registered",
    "Rejection",
    "RequestCode",
    "RequestError",
    "StoreCode",
    "StoreFailure",
    "Sweep",
    "WorkerPool",
    "__version__",
    "connect",
    "connect_async",
]
