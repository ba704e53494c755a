"""Open an operation store from a ``--db`` URL: a SQLite file or a PostgreSQL DSN (``connect.parse_url``'s rules)."""

from __future__ import annotations

from ..connect import parse_url
from ..store import Clock, StoreError
from .base import TransactionalOperationStore


def open_operation_store(
    url: str, *, schema: str | None = None, clock: Clock | None = None, pool_size: int = 4, tenant: str | None = None
) -> TransactionalOperationStore:
    """``tenant`` binds a PostgreSQL store's session to one tenant (the row-level security setting); SQLite ignores it."""
    location = parse_url(url, schema=schema)
    if location.kind == "sqlite":
        assert location.path is not None
        if not location.path.parent.exists():
            raise StoreError("store_unavailable", f"--db: directory {location.path.parent} does not exist")
        from .sqlite import SQLiteOperationStore  # noqa: PLC0415 - each store loads only when its URL is opened

        return SQLiteOperationStore(location.path, clock)
    from .postgres import PostgresOperationStore  # noqa: PLC0415 - psycopg loads only for PostgreSQL URLs

    assert location.dsn is not None and location.schema is not None
    return PostgresOperationStore(
        location.dsn, schema=location.schema, clock=clock, pool_size=pool_size, tenant=tenant
    )
