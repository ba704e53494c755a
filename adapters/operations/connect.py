"""Open an operation store from a ``--db`` URL: a SQLite file or a PostgreSQL DSN (``connect.parse_url``'s rules).

Opening follows the executions' ``connect.open_store``: with ``create=False``
a SQLite path that does not exist is refused (``no database at ...``) rather
than created, so a mistyped ``--db`` never leaves an empty database behind
nor runs a worker on one; and a PostgreSQL server is probed once, with a short
connect timeout, before the pool is opened, so that a server that does not
answer is one ``store_unavailable`` line at once rather than the pool's
retries and warnings for its whole timeout.
"""

from __future__ import annotations

from ..connect import no_database, parse_url, probe_server
from ..store import Clock, StoreError
from .base import TransactionalOperationStore


def open_operation_store(
    url: str,
    *,
    schema: str | None = None,
    clock: Clock | None = None,
    pool_size: int = 4,
    tenant: str | None = None,
    create: bool = True,
    idle_in_transaction_timeout: float | None = None,
    read_only: bool = False,
) -> TransactionalOperationStore:
    """``tenant`` binds a PostgreSQL store's session to one tenant (the row-level security setting); SQLite ignores it.

    ``create=False`` refuses a SQLite path that does not exist instead of
    creating the file (PostgreSQL is never created here: ``fencekeeper
    migrate`` does that).  ``idle_in_transaction_timeout`` (seconds; PostgreSQL
    only, default the store's) bounds how long a stalled holder keeps an
    operation's row: a worker keeps it no longer than its lease.  ``read_only``
    is for commands that only read: a SQLite file is then opened without
    migrating it or creating anything beside it (``connect.open_store``'s rule).
    """
    location = parse_url(url, schema=schema)
    if location.kind == "sqlite":
        assert location.path is not None
        if not location.path.parent.exists():
            raise StoreError("store_unavailable", f"--db: directory {location.path.parent} does not exist")
        if (read_only or not create) and not location.path.exists():
            raise no_database(location.path)
        from .sqlite import SQLiteOperationStore  # noqa: PLC0415 - each store loads only when its URL is opened

        return SQLiteOperationStore(location.path, clock, read_only=read_only)
    from .postgres import PostgresOperationStore  # noqa: PLC0415 - psycopg loads only for PostgreSQL URLs

    assert location.dsn is not None and location.schema is not None
    probe_server(location)
    return PostgresOperationStore(
        location.dsn,
        schema=location.schema,
        clock=clock,
        pool_size=pool_size,
        tenant=tenant,
        idle_in_transaction_timeout=idle_in_transaction_timeout,
    )
