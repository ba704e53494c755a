"""Counting what a store sends to its database: round trips and transactions, for tests and benches.

Rules of this module:

- Counting is not timing: the figures are the same on a fast or a slow
  machine, so a test may assert a bound on them.
- PostgreSQL: one round trip is one wait on a connection
  (``psycopg.Connection.wait``) that actually waits for the server: the
  store's prepared path (``postgres_store._run``), psycopg's BEGIN and
  COMMIT, and a NOTIFY each make one.  A wait whose generator finishes
  without waiting once (psycopg's ``commit()`` on a connection with no open
  transaction, which sends nothing) is not counted.  Preparing a statement
  the first time on a connection is a round trip of its own, so
  steady-state figures are taken after a warm-up.
- SQLite: one round trip is one statement the connection runs (the trace
  callback), BEGIN and COMMIT included; nothing crosses a process boundary,
  but every statement is a call into the library with its own cost.
- A transaction is one entry into a store's ``_transaction`` or ``_read``,
  or one ``read_for_visit`` (one statement, which the database runs as a
  transaction of its own).
- Counting patches methods for the duration of a ``with`` block only, and
  counts every thread's work: use it where one worker runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg

from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore

# The two workflows the counts are taken over (tests/cli/test_worker_round_trips.py asserts
# their bounds, bench/worker_path.py measures them): a start at `end`, and one local Command
# then `end`.
ONE_NODE = """
id = "one-node"
revision = 1
start = "done"
inputs = []

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
"""

TWO_NODE = """
id = "two-node"
revision = 1
start = "ship"
inputs = ["order_id"]

[[nodes]]
id = "ship"
kind = "local_command"
revision = 1
operation = "order.ship"
targets = [{ id = { from = "input.order_id" }, revision = 1 }]
next = "done"
on_failure = "failed"

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "failed"
kind = "end"
revision = 1
outcome = "failed"
error_code = "ship_failed"
"""


@attrs.define
class Tally:
    """Round trips (statements on SQLite) and transactions counted so far."""

    round_trips: int = 0
    transactions: int = 0
    write_transactions: int = 0
    """Of ``transactions``, those entered through ``_transaction``: where every decision is made."""
    lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False, eq=False)

    def add(self, *, round_trips: int = 0, transactions: int = 0, write_transactions: int = 0) -> None:
        with self.lock:
            self.round_trips += round_trips
            self.transactions += transactions
            self.write_transactions += write_transactions


@contextlib.contextmanager
def counting(store: TransactionalStore) -> Iterator[Tally]:
    """Count the round trips and transactions ``store`` makes inside the block."""
    tally = Tally()
    with contextlib.ExitStack() as stack:
        for name in ("_transaction", "_read", "read_for_visit"):
            original = getattr(store, name)

            def counted(*args: Any, _original: Any = original, _writes: int = int(name == "_transaction"), **kwargs: Any) -> Any:
                tally.add(transactions=1, write_transactions=_writes)
                return _original(*args, **kwargs)

            setattr(store, name, counted)
            stack.callback(delattr, store, name)
        if isinstance(store, SQLiteStore):
            store._conn.set_trace_callback(lambda statement: tally.add(round_trips=1))
            stack.callback(store._conn.set_trace_callback, None)
        else:
            wait = psycopg.Connection.wait

            def waited(conn: psycopg.Connection[Any], gen: Any, *args: Any, **kwargs: Any) -> Any:
                return wait(conn, _counted(gen, tally), *args, **kwargs)

            psycopg.Connection.wait = waited  # type: ignore[method-assign, assignment]
            stack.callback(setattr, psycopg.Connection, "wait", wait)
        yield tally


def _counted(gen: Any, tally: Tally) -> Any:
    """``gen``, counting one round trip if it waits for the server at least once."""
    try:
        ready = gen.send(None)
    except StopIteration as stop:
        return stop.value
    tally.add(round_trips=1)
    while True:
        answer = yield ready
        try:
            ready = gen.send(answer)
        except StopIteration as stop:
            return stop.value


__all__ = ["ONE_NODE", "TWO_NODE", "Tally", "counting"]
