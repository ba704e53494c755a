"""Running the stores' synchronous code on an event loop, its I/O awaited: one implementation for both worlds.

Rules of this module:

- :func:`run_sync` runs a synchronous call (a client call, a store
  transaction, the decision loop of ``store.py``) inside a greenlet on the
  event loop's own thread.  Where that code reaches I/O it calls
  :func:`await_only`, which hands the awaitable (a psycopg
  ``AsyncConnection``'s wait on the socket) to the coroutine that started
  it; the coroutine awaits it on the loop, so other tasks run meanwhile,
  and switches back with the answer or the exception.  This is how
  SQLAlchemy's asyncio support shares its synchronous ORM with async
  drivers (``sqlalchemy.util.concurrency``).
- The call sees a copy of the caller's context variables, as a call that
  ``asyncio.to_thread`` runs does; what it sets stays inside it.
- Nothing here runs in another thread, and nothing is decided here: the
  decisions, the guards and the SQL are exactly the code the synchronous
  stores run, so the two cannot disagree.
- :func:`await_only` outside :func:`run_sync` raises ``RuntimeError``: a
  store opened for asyncio cannot be used from plain synchronous code (a
  worker thread, say), where nobody would await its I/O.
- Cancelling the task that awaits :func:`run_sync` raises
  ``CancelledError`` inside the synchronous code at the I/O it was waiting
  on; its ``with`` blocks unwind (a store transaction rolls back, its
  connection returns to the pool) and the cancellation propagates.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import greenlet

T = TypeVar("T")


class _Bridged(greenlet.greenlet):  # type: ignore[misc]  # greenlet has no type information
    """A greenlet whose parent awaits what it hands up."""


def in_bridge() -> bool:
    """Whether the running code was started by :func:`run_sync` (and so may call :func:`await_only`)."""
    return isinstance(greenlet.getcurrent(), _Bridged)


def await_only(awaitable: Awaitable[T]) -> T:
    """The result of ``awaitable``, awaited by the coroutine that called :func:`run_sync`."""
    current = greenlet.getcurrent()
    if not isinstance(current, _Bridged):
        close = getattr(awaitable, "close", None)
        if callable(close):
            close()  # no "never awaited" warning on top of this error
        raise RuntimeError(
            "a store opened for asyncio was used outside its event loop's calls; "
            "use the synchronous store (fencekeeper.connect) from threads"
        )
    result: T = current.parent.switch(awaitable)
    return result


async def run_sync(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``call(*args, **kwargs)`` on this thread, awaiting each awaitable it hands to :func:`await_only`."""
    context = _Bridged(call, greenlet.getcurrent())
    # A new greenlet starts in an empty context: the caller's context variables (a request's
    # identity for the AuthorityPolicy, a tracing span, a logging context) would be unset inside.
    # A copy, as asyncio.to_thread gives the threaded calls: what the call sets stays inside it.
    context.gr_context = contextvars.copy_context()
    handed = context.switch(*args, **kwargs)
    while not context.dead:
        try:
            value = await handed
        except BaseException:
            handed = context.throw(*sys.exc_info())
        else:
            handed = context.switch(value)
    result: T = handed
    return result


@contextlib.contextmanager
def entered(manager: contextlib.AbstractAsyncContextManager[T]) -> Iterator[T]:
    """An async context manager, entered and exited from synchronous code through :func:`await_only`."""
    value = await_only(manager.__aenter__())
    try:
        yield value
    except BaseException:
        if not await_only(manager.__aexit__(*sys.exc_info())):
            raise
    else:
        await_only(manager.__aexit__(None, None, None))


__all__ = ["await_only", "entered", "in_bridge", "run_sync"]
