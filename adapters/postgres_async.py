"""The PostgreSQL store for asyncio: psycopg's ``AsyncConnection``, the synchronous store's every decision.

Rules of this module:

- :class:`AsyncPostgresStore` is :class:`~fencekeeper.adapters.postgres_store.PostgresStore`
  with another way to reach its connections and nothing else: a pool of
  ``psycopg.AsyncConnection`` (``psycopg_pool.AsyncConnectionPool``), whose
  every wait on the server is awaited on the event loop.  The transaction
  loop, the locks, the kernel's decisions, the guards and the SQL are the
  synchronous store's own code (``store.py``, ``sql.py``,
  ``postgres_store.py``), run by :func:`~fencekeeper.adapters.bridge.run_sync`
  on the loop's thread; so a refusal here is the same refusal, and a guard
  that does not hold rolls back the same transaction.
- Open it with :func:`open_async_store` and call it only inside
  :func:`~fencekeeper.adapters.bridge.run_sync` (the asyncio client does
  both); from any other code its first statement raises ``RuntimeError``.
  No thread is started, and none is used for I/O.
- It has no ``wait_for_work``: workers, whose command handlers are
  synchronous code, run on a synchronous store in threads of their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import bridge
from .postgres_store import PostgresStore, _one_line, _safe
from .store import Clock, StoreError


class AsyncPostgresStore(PostgresStore):
    """A :class:`~fencekeeper.adapters.postgres_store.PostgresStore` whose connections are psycopg's async ones."""

    _async_pool: AsyncConnectionPool[Any]
    # psycopg's transaction block ends each transaction here (_begun): the store sends no COMMIT of its own.
    _commits_with_last = False
    # So nothing rides behind a COMMIT either, nor is a claim kept for one; and no worker runs on this store.
    reads_ahead = False
    composes_claims = False

    def _open_pool(self, dsn: str, pool_size: int, settings: dict[str, Any]) -> None:
        self._async_pool = AsyncConnectionPool(
            dsn, min_size=1, max_size=pool_size, kwargs=settings, open=False, timeout=10
        )
        try:
            bridge.await_only(self._async_pool.open(wait=True, timeout=10))
        except BaseException:
            # Cancelled (connect_async under a timeout) or timed out while its first connection was
            # made: the pool is open already, and its tasks and connection would outlive the store.
            bridge.await_only(self._async_pool.close())
            raise

    def _pooled(self) -> contextlib.AbstractContextManager[Any]:
        return bridge.entered(self._async_pool.connection())

    def _begun(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        return bridge.entered(conn.transaction())

    def _statement(self, conn: Any, statement: Any, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return bridge.await_only(_rows(conn, statement, params))

    def _close_pool(self) -> None:
        bridge.await_only(self._async_pool.close())

    def _check_pool(self) -> None:
        bridge.await_only(self._async_pool.check())

    def wait_for_work(self, timeout: float) -> bool:
        """Not offered: workers run on the synchronous store (see the module's rules)."""
        raise NotImplementedError("workers run on fencekeeper.adapters.postgres_store.PostgresStore")


async def _rows(conn: psycopg.AsyncConnection[Any], statement: Any, params: Sequence[object]) -> list[tuple[Any, ...]]:
    cursor = await conn.execute(statement, params)
    return await cursor.fetchall() if cursor.description is not None else []


async def open_async_store(
    dsn: str, *, schema: str, clock: Clock | None = None, pool_size: int = 4
) -> AsyncPostgresStore:
    """Open an :class:`AsyncPostgresStore` on the running loop; StoreError as the synchronous store raises."""
    try:
        # Fail fast, in one line, on a server that does not answer (the pool would retry for its timeout).
        probe = await psycopg.AsyncConnection.connect(dsn, connect_timeout=5)
    except psycopg.Error as exc:
        raise StoreError("store_unavailable", f"cannot connect to PostgreSQL ({_safe(dsn)}): {_one_line(exc)}") from None
    await probe.close()
    return await bridge.run_sync(AsyncPostgresStore, dsn, schema=schema, clock=clock, pool_size=pool_size)


__all__ = ["AsyncPostgresStore", "open_async_store"]
