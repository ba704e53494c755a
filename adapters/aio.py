"""The asyncio client: every operation of :class:`~fencekeeper.adapters.client.Client` as a coroutine.

``await fencekeeper.connect_async(url, policy=..., handler=...)`` returns an
:class:`AsyncClient`.  Rules of this module:

- The answers, the typed exceptions and ``raise_on_refusal`` are exactly the
  synchronous client's: every coroutine runs the synchronous client's own
  call, so the two cannot disagree.  What differs is where its I/O waits.
- On PostgreSQL the calls are native: the client's store is an
  :class:`~fencekeeper.adapters.postgres_async.AsyncPostgresStore` (psycopg's
  ``AsyncConnection``), and each call runs on the event loop's own thread
  through :func:`~fencekeeper.adapters.bridge.run_sync`, awaiting the server
  wherever the store would block.  One decision is still one transaction,
  decided by the same kernel under the same guard, written by the same SQL.
  The deployment's ``AuthorityPolicy`` is then asked on the loop's thread
  too: keep it quick, as a policy that reads memory or a cache is.
- Three calls run a ``CommandHandler``, which is synchronous code that may
  block on its own system: :meth:`AsyncClient.run_until_idle`,
  :meth:`AsyncClient.settle` and the pool of :meth:`AsyncClient.start_workers`.
  They run in threads on a synchronous store of their own (on PostgreSQL one
  more pool, opened when first needed), never on the loop.
- On SQLite (and the in-memory store) every call runs the synchronous client
  in a worker thread (:func:`asyncio.to_thread`): ``sqlite3`` has no
  asynchronous API, and the store serializes writers on the file anyway.
- Cancelling an awaiting task: a native call gets the cancellation at the
  statement it was waiting on, and its transaction rolls back (or, the
  COMMIT already on its way, may have committed whole).  A threaded call
  cannot be interrupted: the CancelledError comes once its thread has
  returned, having committed whole or not at all, and the passes of
  :meth:`AsyncClient.run_until_idle` stop after their current visit, handing
  its lease back.  Either way nothing partial is written, nothing more is
  written in the call's name once the CancelledError is raised, and
  :meth:`AsyncClient.get` shows what happened.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

from fencekeeper.kernel import approvals
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

from . import bridge, service
from . import connect as connecting
from .client import (
    DEFAULT_BUSINESS,
    DEFAULT_LEASE,
    DEFAULT_PRINCIPAL,
    Client,
    Decided,
    DefinitionSource,
    Registered,
    WorkerPool,
    _opening,
    _url_text,
    check_connect_arguments,
    translated,
    wait_arguments,
)
from .client import connect as connect_sync
from .errors import StoreFailure
from .ports import AuthorityPolicy, CommandHandler
from .store import Clock, ExecutionView, PublishResult
from .worker import PassReport

T = TypeVar("T")

# The keyword arguments are passed through unchanged; the overloads restate
# the synchronous client's so that a caller's type checker sees the same
# narrowing (``raise_on_refusal=False`` adds the kernel's Refusal).


class AsyncClient:
    """The :class:`~fencekeeper.adapters.client.Client`'s operations as coroutines (see the module's rules)."""

    def __init__(self, client: Client, *, native: bool = False, workers: Callable[[], Client] | None = None) -> None:
        self.sync = client
        """The synchronous client every coroutine runs.  With ``native``, its store awaits its I/O
        (:class:`~fencekeeper.adapters.postgres_async.AsyncPostgresStore`) and its calls work only
        through this client's coroutines."""
        self.native = native
        """Whether the calls run on the event loop (PostgreSQL) rather than in threads."""
        self._runner: Callable[..., Awaitable[Any]] = bridge.run_sync if native else self._in_thread
        self._open_workers = workers
        self._workers: Client | None = None if native else client
        # Held while the workers' client is opened (in a thread) and while close() takes it: a close
        # that comes meanwhile closes the one just opened, and none is opened after it.
        self._workers_lock = threading.Lock()
        self._closed = False
        # The calls running in threads (their futures), and the stop of each run_until_idle among
        # them: close() stops those and waits for every one before it closes a store under them.
        self._threads: set[asyncio.Future[Any]] = set()
        self._stops: set[threading.Event] = set()
        self._closing: asyncio.Future[None] | None = None
        # Native: the loop whose connections these are (psycopg's AsyncConnection, its locks, the
        # pool's tasks), set by the first call when the client was made outside any loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        if native:
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()

    def _on_its_loop(self) -> None:
        """RuntimeError unless the running loop is the one this (native) client's connections belong to."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            # Used anyway, another loop worked the same sockets and asyncio locks as the first (in
            # another thread, at the same time), and close() failed once the first had closed.
            closed = " (now closed)" if self._loop.is_closed() else ""
            raise RuntimeError(
                f"this AsyncClient's PostgreSQL connections belong to the event loop that opened it{closed}; "
                "call it from that loop, or connect_async again on this one"
            )

    async def _call(self, call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        # Where ``call`` is overloaded, its caller states the precise result
        # type, which its own overloads have already narrowed for the caller.
        if self.native:
            self._on_its_loop()
        result: T = await self._runner(call, *args, **kwargs)
        return result

    async def _in_thread(
        self, call: Callable[..., T], /, *args: Any, stop: threading.Event | None = None, **kwargs: Any
    ) -> T:
        """``call`` in a thread; cancelled, it sets ``stop`` and returns once that thread has (or when cancelled again).

        ``asyncio.to_thread`` hands the cancellation back at once while the
        thread runs on: a cancelled run_until_idle went on claiming and
        running Commands, and a close() after it closed the store under a
        visit, whose lease was then left to expire.  Here the passes stop
        after the current visit (its lease handed back), and when the
        CancelledError reaches the caller whatever the call committed is
        final and nothing more will be written in its name.
        """
        running = asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))
        # Until the thread has returned, not the caller: close() waits for a thread left behind too.
        self._threads.add(running)
        running.add_done_callback(self._threads.discard)
        if stop is not None:
            self._stops.add(stop)
            running.add_done_callback(lambda _: self._stops.discard(stop))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            if stop is not None:
                stop.set()
            # A second cancellation is not held back (a Command that never returns must not hold
            # the task forever): the thread then ends on its own, stopped, and is told to nobody.
            running.add_done_callback(_retrieved)
            await asyncio.wait([running])
            raise

    def _worker_side(self) -> Client:
        """The client whose calls run a CommandHandler in threads: the same one, or (native) a synchronous one.

        StoreFailure ``store_unavailable`` once this client is closed, as every other call: a closed
        client opens no store again.
        """
        with self._workers_lock:
            if self._closed:
                raise StoreFailure("store_unavailable", "this client is closed; connect again to use the store")
            if self._workers is None:
                assert self._open_workers is not None
                self._workers = self._open_workers()
            return self._workers

    async def _workers_client(self) -> Client:
        """:meth:`_worker_side`, opened in a thread; StoreFailure if close() began meanwhile.

        Its caller starts its thread (:meth:`_in_thread`) with no await in
        between, so close() either refuses it here or waits for it.
        """
        workers = await asyncio.to_thread(self._worker_side)
        if self._closed:
            raise StoreFailure("store_unavailable", "this client is closed; connect again to use the store")
        return workers

    def _take_workers(self) -> Client | None:
        """Mark this client closed and hand over the workers' own client, if one was opened, to be closed."""
        with self._workers_lock:
            self._closed = True
            workers, self._workers = self._workers, None
        return workers if workers is not self.sync else None

    async def close(self) -> None:
        """Close the store's connections (and the workers' store, if one was opened); a second close does nothing.

        Calls running in threads are waited for first, and the passes of
        :meth:`run_until_idle` are asked to stop after their current visit,
        so no store is closed under a visit; a pool of :meth:`start_workers`
        still running is stopped as :meth:`WorkerPool.stop
        <fencekeeper.adapters.client.WorkerPool.stop>` stops it, in a thread.
        Cancelling the caller does not stop the closing: it goes on.

        Every call after it raises StoreFailure ``store_unavailable``.
        """
        if self.native:
            self._on_its_loop()  # before anything is closed: the client can still be closed on its loop
        # From here no call starts on the workers' client (_workers_client).
        self._closed = True
        closing = self._closing
        if closing is not None and closing.done() and not closing.cancelled() and closing.exception() is None:
            return
        if closing is None or closing.done():
            self._closing = closing = asyncio.ensure_future(self._close_all())
        # Shielded: a caller cancelled while close() waits for a visit (a TaskGroup's sibling failed, say)
        # must not leave the stores open behind a client that refuses every call; the close goes on.
        await asyncio.shield(closing)

    async def _close_all(self) -> None:
        # The passes of run_until_idle stop after their current visit, and every call in a thread returns.
        while self._threads:
            for stop in self._stops:
                stop.set()
            await asyncio.wait(set(self._threads))
        # In a thread: the lock may be held by a thread opening the workers' store.
        workers = await asyncio.to_thread(self._take_workers)
        if workers is not None:
            await asyncio.to_thread(workers.close)
        await self._call(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @overload
    async def register(
        self, definition: DefinitionSource, *, principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> Registered: ...
    @overload
    async def register(
        self, definition: DefinitionSource, *, principal: str | None = ..., raise_on_refusal: bool
    ) -> Registered | p.Refusal: ...
    async def register(self, definition: DefinitionSource, **options: Any) -> Registered | p.Refusal:
        """:meth:`Client.register <fencekeeper.adapters.client.Client.register>`, awaited."""
        result: Registered | p.Refusal = await self._call(self.sync.register, definition, **options)
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
        raise_on_refusal: Literal[True] = ...,
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
        raise_on_refusal: bool,
    ) -> p.Execution | p.Refusal: ...
    async def run(
        self, definition: DefinitionSource, input: Mapping[str, Any] | None = None, **options: Any
    ) -> p.Execution | p.Refusal:
        """:meth:`Client.run <fencekeeper.adapters.client.Client.run>`, awaited."""
        result: p.Execution | p.Refusal = await self._call(self.sync.run, definition, input, **options)
        return result

    async def list(self, state: ExecutionState | str | None = None) -> builtins.list[p.Execution]:
        """:meth:`Client.list <fencekeeper.adapters.client.Client.list>`, awaited."""
        return await self._call(self.sync.list, state)

    async def get(self, execution_id: str) -> p.Execution:
        """:meth:`Client.get <fencekeeper.adapters.client.Client.get>`, awaited."""
        return await self._call(self.sync.get, execution_id)

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
        return await self._call(self.sync.inspect, execution_id)

    @overload
    async def publish(
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
    async def publish(
        self,
        event_type: str,
        correlation: Mapping[str, object],
        payload: Mapping[str, Any] | None = ...,
        *,
        event_id: str | None = ...,
        principal: str | None = ...,
        raise_on_refusal: bool,
    ) -> PublishResult | p.Refusal: ...
    async def publish(
        self, event_type: str, correlation: Mapping[str, object], payload: Mapping[str, Any] | None = None, **options: Any
    ) -> PublishResult | p.Refusal:
        """:meth:`Client.publish <fencekeeper.adapters.client.Client.publish>`, awaited."""
        result: PublishResult | p.Refusal = await self._call(self.sync.publish, event_type, correlation, payload, **options
        )
        return result

    async def approval(self, execution_id: str) -> approvals.ApprovalRequest | None:
        """:meth:`Client.approval <fencekeeper.adapters.client.Client.approval>`, awaited."""
        return await self._call(self.sync.approval, execution_id)

    @overload
    async def decide(
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
    async def decide(
        self,
        execution_id: str,
        determination: Literal["approved", "rejected"],
        *,
        reviewer: str | None = ...,
        decision_id: str | None = ...,
        rationale: str = ...,
        raise_on_refusal: bool,
    ) -> Decided | p.Refusal: ...
    async def decide(
        self, execution_id: str, determination: Literal["approved", "rejected"], **options: Any
    ) -> Decided | p.Refusal:
        """:meth:`Client.decide <fencekeeper.adapters.client.Client.decide>`, awaited."""
        result: Decided | p.Refusal = await self._call(self.sync.decide, execution_id, determination, **options)
        return result

    async def approve(
        self, execution_id: str, *, reviewer: str | None = None, decision_id: str | None = None, rationale: str = ""
    ) -> Decided:
        """:meth:`Client.approve <fencekeeper.adapters.client.Client.approve>`, awaited."""
        return await self._call(self.sync.approve, execution_id, reviewer=reviewer, decision_id=decision_id, rationale=rationale
        )

    async def reject(
        self, execution_id: str, *, reviewer: str | None = None, decision_id: str | None = None, rationale: str = ""
    ) -> Decided:
        """:meth:`Client.reject <fencekeeper.adapters.client.Client.reject>`, awaited."""
        return await self._call(self.sync.reject, execution_id, reviewer=reviewer, decision_id=decision_id, rationale=rationale
        )

    @overload
    async def cancel(
        self, execution_id: str, *, reason: str = ..., principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> p.Execution: ...
    @overload
    async def cancel(
        self, execution_id: str, *, reason: str = ..., principal: str | None = ..., raise_on_refusal: bool
    ) -> p.Execution | p.Refusal: ...
    async def cancel(self, execution_id: str, **options: Any) -> p.Execution | p.Refusal:
        """:meth:`Client.cancel <fencekeeper.adapters.client.Client.cancel>`, awaited."""
        result: p.Execution | p.Refusal = await self._call(self.sync.cancel, execution_id, **options)
        return result

    async def quarantine_expired(self, *, principal: str | None = None) -> service.Sweep:
        """:meth:`Client.quarantine_expired <fencekeeper.adapters.client.Client.quarantine_expired>`, awaited."""
        return await self._call(self.sync.quarantine_expired, principal=principal)

    @overload
    async def review(self, execution_id: str, *, raise_on_refusal: Literal[True] = ...) -> service.RecoveryView: ...
    @overload
    async def review(
        self, execution_id: str, *, raise_on_refusal: bool
    ) -> service.RecoveryView | p.Refusal: ...
    async def review(self, execution_id: str, **options: Any) -> service.RecoveryView | p.Refusal:
        """:meth:`Client.review <fencekeeper.adapters.client.Client.review>`, awaited."""
        result: service.RecoveryView | p.Refusal = await self._call(self.sync.review, execution_id, **options)
        return result

    @overload
    async def settle(
        self, execution_id: str, *, principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> service.Reconciled: ...
    @overload
    async def settle(
        self, execution_id: str, *, principal: str | None = ..., raise_on_refusal: bool
    ) -> service.Reconciled | p.Refusal: ...
    async def settle(self, execution_id: str, **options: Any) -> service.Reconciled | p.Refusal:
        """:meth:`Client.settle <fencekeeper.adapters.client.Client.settle>`, awaited."""
        # It asks the CommandHandler: in a thread, on the workers' store.
        workers = await self._workers_client()
        result: service.Reconciled | p.Refusal = await self._in_thread(
            functools.partial(workers.settle, execution_id, **options)
        )
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
        raise_on_refusal: Literal[True] = ...,
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
        raise_on_refusal: bool,
    ) -> p.Execution | p.Refusal: ...
    async def resume(self, execution_id: str, **options: Any) -> p.Execution | p.Refusal:
        """:meth:`Client.resume <fencekeeper.adapters.client.Client.resume>`, awaited."""
        result: p.Execution | p.Refusal = await self._call(self.sync.resume, execution_id, **options)
        return result

    @overload
    async def fail(
        self, execution_id: str, *, rationale: str = ..., principal: str | None = ..., raise_on_refusal: Literal[True] = ...
    ) -> p.Execution: ...
    @overload
    async def fail(
        self, execution_id: str, *, rationale: str = ..., principal: str | None = ..., raise_on_refusal: bool
    ) -> p.Execution | p.Refusal: ...
    async def fail(self, execution_id: str, **options: Any) -> p.Execution | p.Refusal:
        """:meth:`Client.fail <fencekeeper.adapters.client.Client.fail>`, awaited."""
        result: p.Execution | p.Refusal = await self._call(self.sync.fail, execution_id, **options)
        return result

    async def run_until_idle(
        self, *, worker_id: str | None = None, lease: timedelta | float = DEFAULT_LEASE, max_passes: int = 1000
    ) -> PassReport:
        """:meth:`Client.run_until_idle <fencekeeper.adapters.client.Client.run_until_idle>`, in a thread.

        The passes run the CommandHandler, so they run in a thread (on
        PostgreSQL on the workers' own synchronous store), never on the loop.
        Cancelled (or at :meth:`close`), they stop after the current visit:
        its lease is handed back (the execution is eligible again), nothing
        more is claimed, and the call returns (or raises CancelledError) once
        the thread has stopped, which takes as long as that visit's Command.
        """
        workers = await self._workers_client()
        stop = threading.Event()
        return await self._in_thread(workers._run_until_idle, worker_id, lease, max_passes, stop, stop=stop)

    def start_workers(self, concurrency: int = 1, **options: Any) -> WorkerPool:
        """:meth:`Client.start_workers <fencekeeper.adapters.client.Client.start_workers>` (it only starts threads).

        On PostgreSQL the first call opens the workers' synchronous store,
        which blocks the loop for one connection.  Stop the pool without
        blocking the loop: ``await asyncio.to_thread(pool.stop)``.
        """
        return self._worker_side().start_workers(concurrency, **options)


async def connect_async(
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
) -> AsyncClient:
    """:func:`fencekeeper.connect`, for asyncio: native on PostgreSQL, in threads on SQLite (see the module's rules).

    ``migrate=True`` runs the migrations in a thread (they are DDL, once).
    """
    named = _url_text(url)
    options: dict[str, Any] = {
        "policy": policy,
        "handler": handler,
        "business": business,
        "principal": principal,
        "schema": schema,
        "clock": clock,
        "pool_size": pool_size,
    }
    # First, as connect does: a malformed URL or schema is the caller's RequestError, not the store's failure.
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
    location = _postgres_location(named, schema)
    if location is None:
        client = await asyncio.to_thread(connect_sync, named, migrate=migrate, **options)
        return AsyncClient(client)
    assert location.dsn is not None and location.schema is not None
    from .postgres_async import open_async_store  # noqa: PLC0415 - psycopg loads only for PostgreSQL URLs

    with _opening():
        if migrate:
            await asyncio.to_thread(connecting.migrate, named, schema=schema)
        store = await open_async_store(location.dsn, schema=location.schema, clock=clock, pool_size=pool_size)
    try:
        client = Client(store, policy=policy, handler=handler, business=business, principal=principal)
    except BaseException:
        await bridge.run_sync(store.close)
        raise
    return AsyncClient(client, native=True, workers=functools.partial(connect_sync, named, **options))


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a cancelled call's outcome as seen: its caller was told of the cancellation instead."""
    if not future.cancelled():
        future.exception()


def _postgres_location(url: object, schema: str | None) -> connecting.Location | None:
    """Where a PostgreSQL ``url`` points; None for anything else (it goes the synchronous way, errors included)."""
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        return None
    with translated():
        return connecting.parse_url(url, schema=schema)


__all__ = ["AsyncClient", "connect_async"]
