"""The asyncio client: every operation of :class:`~fencekeeper.adapters.client.Client` as a coroutine.

``await fencekeeper.connect_async(url, policy=..., handler=...)`` returns an
:class:`AsyncClient`.  Rules of this module:

- Each coroutine runs the synchronous client's call in a worker thread
  (:func:`asyncio.to_thread`), for SQLite and PostgreSQL alike, so the event
  loop is never blocked by a store transaction.  The answers, the typed
  exceptions and ``raise_on_refusal`` are exactly the synchronous client's:
  this module adds no behaviour, so the two cannot disagree.
- Threads, not psycopg's async connections: the stores' transaction loop
  (one decision, one transaction, retried under its guard) is synchronous
  code shared by every store, and one implementation of it is what the test
  suite proves.  A native async PostgreSQL path would be a second one.
- Cancelling an awaiting task does not cancel the call already running in
  its thread: a store transaction commits whole or not at all, so the
  outcome is then what :meth:`AsyncClient.get` reads afterwards.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Collection, Mapping
from datetime import timedelta
from typing import Any, Literal, overload

from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

from . import service
from .client import (
    DEFAULT_BUSINESS,
    DEFAULT_LEASE,
    DEFAULT_PRINCIPAL,
    Client,
    Decided,
    DefinitionSource,
    Registered,
    WorkerPool,
    wait_arguments,
)
from .client import connect as connect_sync
from .ports import AuthorityPolicy, CommandHandler
from .store import Clock, ExecutionView, PublishResult
from .worker import PassReport

# The keyword arguments are passed through unchanged; the overloads restate
# the synchronous client's so that a caller's type checker sees the same
# narrowing (``raise_on_refusal=False`` adds the kernel's Refusal).


async def _in_thread(call: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    # Typed loosely on purpose: each caller states the precise result type,
    # which its overloads have already narrowed for the caller.
    return await asyncio.to_thread(call, *args, **kwargs)


class AsyncClient:
    """The :class:`~fencekeeper.adapters.client.Client`'s operations as coroutines (each runs in a thread)."""

    def __init__(self, client: Client) -> None:
        self.sync = client
        """The synchronous client every coroutine delegates to."""

    async def close(self) -> None:
        """Close the store's connections."""
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @overload
    async def register(self, definition: DefinitionSource, *, principal: str | None = ...) -> Registered: ...
    @overload
    async def register(
        self, definition: DefinitionSource, *, principal: str | None = ..., raise_on_refusal: Literal[False]
    ) -> Registered | p.Refusal: ...
    async def register(self, definition: DefinitionSource, **options: Any) -> Registered | p.Refusal:
        """:meth:`Client.register <fencekeeper.adapters.client.Client.register>`, awaited."""
        result: Registered | p.Refusal = await _in_thread(self.sync.register, definition, **options)
        return result

    @overload
    async def run(
        self,
        definition: DefinitionSource,
        input: Mapping[str, Any] | None = ...,
        *,
        execution_id: str | None = ...,
        revision: int | None = ...,
        principal: str | None = ...,
    ) -> p.Execution: ...
    @overload
    async def run(
        self,
        definition: DefinitionSource,
        input: Mapping[str, Any] | None = ...,
        *,
        execution_id: str | None = ...,
        revision: int | None = ...,
        principal: str | None = ...,
        raise_on_refusal: Literal[False],
    ) -> p.Execution | p.Refusal: ...
    async def run(
        self, definition: DefinitionSource, input: Mapping[str, Any] | None = None, **options: Any
    ) -> p.Execution | p.Refusal:
        """:meth:`Client.run <fencekeeper.adapters.client.Client.run>`, awaited."""
        result: p.Execution | p.Refusal = await _in_thread(self.sync.run, definition, input, **options)
        return result

    async def list(self, state: ExecutionState | str | None = None) -> builtins.list[p.Execution]:
        """:meth:`Client.list <fencekeeper.adapters.client.Client.list>`, awaited."""
        return await asyncio.to_thread(self.sync.list, state)

    async def get(self, execution_id: str) -> p.Execution:
        """:meth:`Client.get <fencekeeper.adapters.client.Client.get>`, awaited."""
        return await asyncio.to_thread(self.sync.get, execution_id)

    async def wait(
        self,
        execution_id: str,
        *,
        until: Collection[ExecutionState | str] | None = None,
        timeout: float = 30.0,
        poll: float = 0.1,
    ) -> p.Execution:
        """:meth:`Client.wait <fencekeeper.adapters.client.Client.wait>`, sleeping on the event loop between reads."""
        wanted = wait_arguments(until, timeout, poll)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            execution = await self.get(execution_id)
            if execution.state in wanted:
                return execution
            if loop.time() >= deadline:
                names = ", ".join(sorted(s.value for s in wanted))
                raise TimeoutError(
                    f"{execution_id} is still {execution.state.value} after {timeout:g} s (waited for {names})"
                )
            await asyncio.sleep(min(poll, max(deadline - loop.time(), 0)))

    async def inspect(self, execution_id: str) -> ExecutionView:
        """:meth:`Client.inspect <fencekeeper.adapters.client.Client.inspect>`, awaited."""
        return await asyncio.to_thread(self.sync.inspect, execution_id)

    @overload
    async def publish(
        self,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = ...,
        *,
        event_id: str | None = ...,
        principal: str | None = ...,
    ) -> PublishResult: ...
    @overload
    async def publish(
        self,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = ...,
        *,
        event_id: str | None = ...,
        principal: str | None = ...,
        raise_on_refusal: Literal[False],
    ) -> PublishResult | p.Refusal: ...
    async def publish(
        self, event_type: str, correlation: Mapping[str, object], payload: Mapping[str, Any] | None = None, **options: Any
    ) -> PublishResult | p.Refusal:
        """:meth:`Client.publish <fencekeeper.adapters.client.Client.publish>`, awaited."""
        result: PublishResult | p.Refusal = await _in_thread(self.sync.publish, event_type, correlation, payload, **options
        )
        return result

    async def approval(self, execution_id: str) -> approvals.ApprovalRequest | None:
        """:meth:`Client.approval <fencekeeper.adapters.client.Client.approval>`, awaited."""
        return await asyncio.to_thread(self.sync.approval, execution_id)

    @overload
    async def decide(
        self,
        execution_id: str,
        determination: Literal["approved", "rejected"],
        *,
        reviewer: str | None = ...,
        decision_id: str | None = ...,
        rationale: str = ...,
    ) -> Decided: ...
    @overload
    async def decide(
        self,
        execution_id: str,
        determination: Literal["approved", "rejected"],
        *,
        reviewer: str | None = ...,
        decision_id: str | None = ...,
        rationale: str = ...,
        raise_on_refusal: Literal[False],
    ) -> Decided | p.Refusal: ...
    async def decide(
        self, execution_id: str, determination: Literal["approved", "rejected"], **options: Any
    ) -> Decided | p.Refusal:
        """:meth:`Client.decide <fencekeeper.adapters.client.Client.decide>`, awaited."""
        result: Decided | p.Refusal = await _in_thread(self.sync.decide, execution_id, determination, **options)
        return result

    async def approve(
        self, execution_id: str, *, reviewer: str | None = None, decision_id: str | None = None, rationale: str = ""
    ) -> Decided:
        """:meth:`Client.approve <fencekeeper.adapters.client.Client.approve>`, awaited."""
        return await asyncio.to_thread(
            self.sync.approve, execution_id, reviewer=reviewer, decision_id=decision_id, rationale=rationale
        )

    async def reject(
        self, execution_id: str, *, reviewer: str | None = None, decision_id: str | None = None, rationale: str = ""
    ) -> Decided:
        """:meth:`Client.reject <fencekeeper.adapters.client.Client.reject>`, awaited."""
        return await asyncio.to_thread(
            self.sync.reject, execution_id, reviewer=reviewer, decision_id=decision_id, rationale=rationale
        )

    @overload
    async def cancel(self, execution_id: str, *, reason: str = ..., principal: str | None = ...) -> p.Execution: ...
    @overload
    async def cancel(
        self, execution_id: str, *, reason: str = ..., principal: str | None = ..., raise_on_refusal: Literal[False]
    ) -> p.Execution | p.Refusal: ...
    async def cancel(self, execution_id: str, **options: Any) -> p.Execution | p.Refusal:
        """:meth:`Client.cancel <fencekeeper.adapters.client.Client.cancel>`, awaited."""
        result: p.Execution | p.Refusal = await _in_thread(self.sync.cancel, execution_id, **options)
        return result

    async def quarantine_expired(self, *, principal: str | None = None) -> service.Sweep:
        """:meth:`Client.quarantine_expired <fencekeeper.adapters.client.Client.quarantine_expired>`, awaited."""
        return await asyncio.to_thread(self.sync.quarantine_expired, principal=principal)

    @overload
    async def review(self, execution_id: str) -> service.RecoveryView: ...
    @overload
    async def review(
        self, execution_id: str, *, raise_on_refusal: Literal[False]
    ) -> service.RecoveryView | p.Refusal: ...
    async def review(self, execution_id: str, **options: Any) -> service.RecoveryView | p.Refusal:
        """:meth:`Client.review <fencekeeper.adapters.client.Client.review>`, awaited."""
        result: service.RecoveryView | p.Refusal = await _in_thread(self.sync.review, execution_id, **options)
        return result

    @overload
    async def settle(self, execution_id: str, *, principal: str | None = ...) -> service.Reconciled: ...
    @overload
    async def settle(
        self, execution_id: str, *, principal: str | None = ..., raise_on_refusal: Literal[False]
    ) -> service.Reconciled | p.Refusal: ...
    async def settle(self, execution_id: str, **options: Any) -> service.Reconciled | p.Refusal:
        """:meth:`Client.settle <fencekeeper.adapters.client.Client.settle>`, awaited."""
        result: service.Reconciled | p.Refusal = await _in_thread(self.sync.settle, execution_id, **options)
        return result

    @overload
    async def resume(
        self,
        execution_id: str,
        *,
        at_node: str,
        rationale: str,
        input: Mapping[str, Any] | None = ...,
        principal: str | None = ...,
    ) -> p.Execution: ...
    @overload
    async def resume(
        self,
        execution_id: str,
        *,
        at_node: str,
        rationale: str,
        input: Mapping[str, Any] | None = ...,
        principal: str | None = ...,
        raise_on_refusal: Literal[False],
    ) -> p.Execution | p.Refusal: ...
    async def resume(self, execution_id: str, **options: Any) -> p.Execution | p.Refusal:
        """:meth:`Client.resume <fencekeeper.adapters.client.Client.resume>`, awaited."""
        result: p.Execution | p.Refusal = await _in_thread(self.sync.resume, execution_id, **options)
        return result

    @overload
    async def fail(self, execution_id: str, *, rationale: str = ..., principal: str | None = ...) -> p.Execution: ...
    @overload
    async def fail(
        self, execution_id: str, *, rationale: str = ..., principal: str | None = ..., raise_on_refusal: Literal[False]
    ) -> p.Execution | p.Refusal: ...
    async def fail(self, execution_id: str, **options: Any) -> p.Execution | p.Refusal:
        """:meth:`Client.fail <fencekeeper.adapters.client.Client.fail>`, awaited."""
        result: p.Execution | p.Refusal = await _in_thread(self.sync.fail, execution_id, **options)
        return result

    async def run_until_idle(
        self, *, worker_id: str | None = None, lease: timedelta | float = DEFAULT_LEASE, max_passes: int = 1000
    ) -> PassReport:
        """:meth:`Client.run_until_idle <fencekeeper.adapters.client.Client.run_until_idle>`, awaited."""
        return await asyncio.to_thread(self.sync.run_until_idle, worker_id=worker_id, lease=lease, max_passes=max_passes)

    def start_workers(self, concurrency: int = 1, **options: Any) -> WorkerPool:
        """:meth:`Client.start_workers <fencekeeper.adapters.client.Client.start_workers>` (it only starts threads).

        Stop the pool without blocking the loop: ``await asyncio.to_thread(pool.stop)``.
        """
        return self.sync.start_workers(concurrency, **options)


async def connect_async(
    url: str,
    *,
    policy: AuthorityPolicy,
    handler: CommandHandler | None,
    business: str = DEFAULT_BUSINESS,
    principal: str = DEFAULT_PRINCIPAL,
    schema: str | None = None,
    migrate: bool = False,
    clock: Clock | None = None,
    pool_size: int = 4,
) -> AsyncClient:
    """:func:`fencekeeper.connect`, for asyncio: opening the store runs in a thread too."""
    client = await asyncio.to_thread(
        connect_sync,
        url,
        policy=policy,
        handler=handler,
        business=business,
        principal=principal,
        schema=schema,
        migrate=migrate,
        clock=clock,
        pool_size=pool_size,
    )
    return AsyncClient(client)


__all__ = ["AsyncClient", "connect_async"]
