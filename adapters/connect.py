"""Opening a store from a URL, and the deployment check: how ``--db`` becomes a store.

Rules of this module:

- A URL names one store.  ``demo.db``, ``./runs/demo.db`` and
  ``sqlite:///demo.db`` are SQLite files (``sqlite:////srv/fk.db`` is the
  absolute path ``/srv/fk.db``, as in SQLAlchemy); ``postgresql://...`` and
  ``postgres://...`` are PostgreSQL DSNs, with an optional ``?schema=NAME``
  (default ``fencekeeper``).  Anything else is refused as a usage error.
- Opening PostgreSQL never migrates: the store runs the deployment check
  when it opens and refuses a schema that is missing, outdated, newer than
  this code or altered.  Only :func:`migrate` creates or upgrades a schema,
  and only a command that says so (``fencekeeper migrate``, ``fencekeeper
  demo --db``) calls it.
- A SQLite file is the SQLite store's own: opening it checks it and, as that
  store always does (docs/stores.md), brings an older file forward.  With
  ``create=False`` a path that does not exist is refused rather than created,
  so that reading, or a mistyped path, never leaves an empty database behind.
  With ``read_only=True`` (commands that only read) the file is opened only
  to read: a read-only file, directory or mount works, and nothing is
  created beside the file or migrated.
- :func:`check` looks without touching: it reads the recorded migrations and
  counts rows, and never migrates or writes, whatever it finds.
- Every error is a :class:`StoreError` with a one-line message that names the
  URL (never a password); ``store_unavailable`` and ``not_a_database`` mean the
  URL itself is wrong or unreachable, the ``schema_*`` codes that the store is
  there but cannot be used as it is.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

from fencekeeper.kernel.common import shown, shown_text
from fencekeeper.kernel.machines import ExecutionState

from .sql import DEFINITION_TYPE, EXECUTION_TYPE
from .store import Clock, StoreError, TransactionalStore

if TYPE_CHECKING:  # psycopg is imported only when a PostgreSQL URL is opened
    from .postgres_store import PostgresStore

DEFAULT_SCHEMA = "fencekeeper"
CONNECT_TIMEOUT_SECONDS = 5


@attrs.frozen
class Location:
    """Where a URL points: a SQLite file, or a PostgreSQL DSN and schema."""

    kind: str
    """``sqlite`` or ``postgresql``."""
    path: Path | None = None
    dsn: str | None = None
    """Without the ``schema`` parameter, which is fencekeeper's and not libpq's."""
    schema: str | None = None

    def describe(self) -> str:
        """For messages: the path, or the DSN without its password and the schema."""
        if self.kind == "sqlite":
            return str(self.path)
        assert self.dsn is not None
        return f"{_safe_dsn(self.dsn)} schema {self.schema}"


def db_option(url: str, schema: str | None = None) -> str:
    """``--db URL`` (and ``--schema``) as a shell would be given them again: for a command the output suggests.

    A password in a PostgreSQL URL is left out, as from every message: libpq
    reads it from ``PGPASSWORD`` or ``~/.pgpass`` when the command is run.
    """
    if url.startswith(("postgresql://", "postgres://")):
        with contextlib.suppress(ValueError):
            parts = kept = urlsplit(url)
            if parts.password is not None:
                user, _, host = parts.netloc.rpartition("@")
                kept = kept._replace(netloc=f"{user.partition(':')[0]}@{host}")
            # libpq also takes the password as a parameter of the URL's query.
            query = parse_qsl(parts.query, keep_blank_values=True)
            if any(key == "password" for key, _ in query):
                kept = kept._replace(query=urlencode([(key, value) for key, value in query if key != "password"]))
            if kept is not parts:
                url = urlunsplit(kept)
    return f"--db {shlex.quote(url)}" + ("" if schema is None else f" --schema {shlex.quote(schema)}")


def parse_url(url: str, *, schema: str | None = None) -> Location:
    """Where ``url`` points; ``schema`` (``--schema``) may name the PostgreSQL schema instead of ``?schema=``."""
    if not url:
        raise StoreError("store_unavailable", "--db: empty; give a SQLite file path or a postgresql:// DSN")
    if url.startswith(("postgresql://", "postgres://")):
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise StoreError("store_unavailable", f"--db: not a valid PostgreSQL URL: {exc}") from None
        query = parse_qsl(parts.query, keep_blank_values=True)
        named = [value for key, value in query if key == "schema"]
        if len(named) > 1:
            raise StoreError("store_unavailable", "--db: ?schema= is given more than once")
        if named and schema is not None and named[0] != schema:
            raise StoreError(
                "store_unavailable", f"--db names schema {shown(named[0])} but --schema names {shown(schema)}; give one"
            )
        chosen = schema if schema is not None else (named[0] if named else DEFAULT_SCHEMA)
        rest = urlencode([(key, value) for key, value in query if key != "schema"])
        return Location("postgresql", dsn=urlunsplit(parts._replace(query=rest)), schema=chosen)
    if schema is not None:
        raise StoreError("store_unavailable", "--schema applies to PostgreSQL only; --db names a SQLite file")
    if url.startswith("sqlite://"):
        rest = url[len("sqlite://") :]
        if not rest.startswith("/") or len(rest) < 2:
            raise StoreError(
                "store_unavailable", f"--db: {shown(url)}: write sqlite:///relative.db or sqlite:////absolute.db"
            )
        return Location("sqlite", path=Path(rest[1:]))
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise StoreError(
            "store_unavailable", f"--db: unknown scheme {shown(scheme)}; give a SQLite file path or a postgresql:// DSN"
        )
    return Location("sqlite", path=Path(url))


def open_store(
    url: str,
    *,
    clock: Clock | None = None,
    schema: str | None = None,
    create: bool = True,
    pool_size: int = 4,
    read_only: bool = False,
) -> TransactionalStore:
    """The store ``url`` names (see the module's rules); raises StoreError with a one-line message.

    ``read_only`` is for callers that only read: a SQLite file is then
    opened without writing, creating or migrating anything (PostgreSQL
    opening writes nothing anyway).
    """
    location = parse_url(url, schema=schema)
    if location.kind == "sqlite":
        assert location.path is not None
        if (read_only or not create) and not _exists(location.path):
            raise no_database(location.path)
        from . import sqlite_store  # noqa: PLC0415 - as psycopg for PostgreSQL: a worker loads one store

        return sqlite_store.SQLiteStore(location.path, clock, read_only=read_only)
    from .postgres_store import PostgresStore  # noqa: PLC0415 - psycopg loads only for PostgreSQL URLs

    assert location.dsn is not None and location.schema is not None
    probe_server(location)
    store: PostgresStore = PostgresStore(location.dsn, schema=location.schema, clock=clock, pool_size=pool_size)
    return store


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a path the system cannot even look up (too long: ENAMETOOLONG) is --db's error."""
    try:
        return path.exists()
    except OSError as exc:
        raise StoreError("store_unavailable", f"--db: {shown_text(path)}: cannot be used: {exc.strerror}") from None


def no_database(path: Path) -> StoreError:
    """The refusal of a SQLite path that does not exist, by a command that does not create one."""
    named = shown_text(path)
    return StoreError(
        "store_unavailable", f"--db: no database at {named} (`fencekeeper migrate --db {named}` creates one)"
    )


def migrate(url: str, *, schema: str | None = None) -> tuple[Location, list[int]]:
    """Create or upgrade the store ``url`` names; returns the migration versions applied now."""
    location = parse_url(url, schema=schema)
    if location.kind == "sqlite":
        assert location.path is not None
        # Only a file can hold versions; anything else at the path is for the store's own checks to name.
        before = _sqlite_versions(location.path) if location.path.is_file() else []
        from . import sqlite_store  # noqa: PLC0415 - as in open_store

        # The SQLite store migrates forward when it is opened, after checking the file is its own.
        sqlite_store.SQLiteStore(location.path).close()
        after = _sqlite_versions(location.path)
        return location, [v for v in after if v not in before]
    from . import postgres_store  # noqa: PLC0415 - as in open_store

    assert location.dsn is not None and location.schema is not None
    probe_server(location)
    return location, postgres_store.migrate(location.dsn, location.schema)


def _sqlite_versions(path: Path) -> list[int]:
    import sqlite3  # noqa: PLC0415 - as the stores in open_store: a PostgreSQL worker does not load it

    with contextlib.closing(sqlite3.connect(path)) as conn:
        try:
            return [int(row[0]) for row in conn.execute("SELECT version FROM schema_migrations")]
        except sqlite3.Error:
            return []


def probe_server(location: Location) -> None:
    """Fail fast, in one line, on a DSN that does not parse or a server that does not answer.

    The connection pool would otherwise retry for its whole timeout before
    reporting anything.
    """
    import psycopg  # noqa: PLC0415 - as in open_store

    assert location.dsn is not None
    try:
        psycopg.connect(location.dsn, connect_timeout=CONNECT_TIMEOUT_SECONDS).close()
    except psycopg.Error as exc:
        raise StoreError(
            "store_unavailable", f"--db: cannot connect to PostgreSQL ({_safe_dsn(location.dsn)}): {_one_line(exc)}"
        ) from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _safe_dsn(dsn: str) -> str:
    """The DSN without its password."""
    import psycopg  # noqa: PLC0415 - as in open_store
    from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: PLC0415

    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "an unparsable DSN"
    params.pop("password", None)
    return make_conninfo("", **params)


# --- the deployment check -----------------------------------------------------------------


@attrs.frozen
class Migration:
    """One applied schema migration: its number, name and when it was applied."""

    version: int
    name: str
    applied_at: str


@attrs.frozen
class CheckReport:
    """What the deployment check found.  ``problems`` block running; ``notes`` do not."""

    location: Location
    code_version: int
    """The newest migration this code knows."""
    schema_version: int | None
    """The version the store records; None when there is no store to read."""
    migrations: tuple[Migration, ...] = ()
    definitions: int | None = None
    executions: Mapping[str, int] = attrs.field(factory=dict)
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    time_source: str | None = None
    """How far this machine's clock is from the database's (PostgreSQL): information only, never a note
    that asks for something to be done, since leases are judged by the database's clock alone."""
    reachable: bool = True
    """False when the URL names no usable store (no file, not a database, no answer): bad input, as for any command."""

    @property
    def ok(self) -> bool:
        """True when nothing blocks running."""
        return not self.problems


def check(url: str, *, schema: str | None = None) -> CheckReport:
    """The deployment check: schema version, migrations applied, registered definitions; never writes."""
    location = parse_url(url, schema=schema)
    if location.kind == "sqlite":
        return _check_sqlite(location)
    return _check_postgres(location)


def _check_sqlite(location: Location) -> CheckReport:
    from . import sqlite_store  # noqa: PLC0415 - as in open_store

    path = location.path
    assert path is not None
    newest = max(number for number, _, _ in sqlite_store.MIGRATIONS)
    blank = CheckReport(location, newest, None)
    unusable = attrs.evolve(blank, reachable=False)
    if not path.exists():
        return attrs.evolve(
            unusable, problems=(f"{path}: no database here (`fencekeeper migrate --db {path}` creates one)",)
        )
    if path.is_dir():
        return attrs.evolve(unusable, problems=(f"{path}: is a directory, not a SQLite database",))
    if not os.access(path, os.R_OK):
        return attrs.evolve(unusable, problems=(f"{path}: cannot be read",))
    try:
        # Read-only, so that checking a read-only file leaves nothing beside it.
        conn = sqlite_store.connect_read_only(path)
    except StoreError as exc:
        return attrs.evolve(blank, problems=(exc.message,))
    with contextlib.closing(conn):
        try:
            # The SQLite store's own checks, run here without the migration
            # that opening the store would perform.
            version = sqlite_store.check_database(conn, path)
        except StoreError as exc:
            return attrs.evolve(
                blank, problems=(exc.message,), reachable=exc.code not in ("not_a_database", "store_unavailable")
            )
        problems: list[str] = []
        notes: list[str] = []
        read_only = sqlite_store.read_only_problem(path)
        if read_only is not None:
            problems.append(read_only)
        if version == 0:
            notes.append(f"{path}: an empty SQLite file; the store creates its schema when first opened")
            return attrs.evolve(blank, schema_version=0, problems=tuple(problems), notes=tuple(notes))
        migrations = tuple(
            Migration(int(v), str(n), str(at))
            for v, n, at in conn.execute("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
        )
        if version < newest:
            notes.append(
                f"{path}: schema version {version}, this fencekeeper's is {newest}; the SQLite store migrates "
                "it forward when next opened (`fencekeeper migrate` does it now)"
            )
        definitions, executions = _counts(conn.execute, "?")
        problems.extend(_unknown_states(executions))
    return CheckReport(location, newest, version, migrations, definitions, executions, tuple(problems), tuple(notes))


def _counts(execute: Any, placeholder: str, prefix: str = "") -> tuple[int, dict[str, int]]:
    """Registered definition revisions are counted per definition object; executions per state."""
    definitions = execute(
        f"SELECT count(*) FROM {prefix}objects WHERE object_type = {placeholder}", (DEFINITION_TYPE,)
    ).fetchone()[0]
    rows = execute(
        f"SELECT state, count(*) FROM {prefix}objects WHERE object_type = {placeholder} GROUP BY state",
        (EXECUTION_TYPE,),
    ).fetchall()
    order = [state.value for state in ExecutionState]
    # A state this code does not know (a row edited by hand or damaged) is counted after the known ones,
    # by name, and reported by the caller; it must not stop the check that is meant to find it.
    ranked = sorted(rows, key=lambda r: (order.index(r[0]) if r[0] in order else len(order), str(r[0])))
    executions = {str(state): int(count) for state, count in ranked}
    return int(definitions), executions


def _unknown_states(executions: Mapping[str, int]) -> list[str]:
    """A problem for each execution state no version of this code writes: nothing can act on those executions."""
    known = {state.value for state in ExecutionState}
    return [
        f"executions: {count} in state {state!r}, which this fencekeeper does not know "
        "(a row edited by hand or damaged); repair the rows"
        for state, count in executions.items()
        if state not in known
    ]


def _check_postgres(location: Location) -> CheckReport:
    import psycopg  # noqa: PLC0415 - as in open_store
    from psycopg import sql as pgsql  # noqa: PLC0415

    from . import postgres_store  # noqa: PLC0415

    assert location.dsn is not None and location.schema is not None
    newest = max(number for number, _, _ in postgres_store.MIGRATIONS)
    blank = CheckReport(location, newest, None)
    try:
        postgres_store.check_schema_name(location.schema)
        probe_server(location)
        conn = psycopg.connect(location.dsn, connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True)
    except (StoreError, psycopg.Error) as exc:
        message = exc.message if isinstance(exc, StoreError) else _one_line(exc)
        return attrs.evolve(blank, problems=(message,), reachable=False)
    with conn:
        try:
            version = postgres_store.check_schema(conn, location.schema)
        except StoreError as exc:
            migrations: tuple[Migration, ...] = ()
            with contextlib.suppress(psycopg.Error):
                migrations = _pg_migrations(conn, location.schema)
            recorded = max((m.version for m in migrations), default=None)
            return attrs.evolve(blank, schema_version=recorded, migrations=migrations, problems=(exc.message,))
        migrations = _pg_migrations(conn, location.schema)
        prefix = pgsql.Identifier(location.schema).as_string(conn) + "."
        try:
            definitions, executions = _counts(conn.execute, "%s", prefix)
        except psycopg.errors.InsufficientPrivilege as exc:
            # A role that may read schema_migrations but not the store's tables: a grant to give, one problem.
            # The connection is in autocommit, so the privilege lookup runs on it after the refusal; it names
            # the table as PostgreSQL did, unqualified, so the schema goes on the search path first.
            conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(location.schema)))
            refused = postgres_store.permission_denied(exc, lambda statement, params: conn.execute(statement, params).fetchall())
            return attrs.evolve(blank, schema_version=version, migrations=migrations, problems=(refused.message,))
        database_now = conn.execute("SELECT clock_timestamp()").fetchone()
    time_source = None
    if database_now is not None:
        skew = (datetime.now(UTC) - database_now[0]).total_seconds()
        time_source = (
            f"the database's clock_timestamp(); this machine's clock differs by {skew:+.3f} s "
            "(leases are judged by the database alone)"
        )
    return CheckReport(
        location, newest, version, migrations, definitions, executions, tuple(_unknown_states(executions)),
        time_source=time_source,
    )


def _pg_migrations(conn: Any, schema: str) -> tuple[Migration, ...]:
    from psycopg import sql as pgsql  # noqa: PLC0415 - as in open_store

    rows: Sequence[tuple[Any, ...]] = conn.execute(
        pgsql.SQL("SELECT version, name, applied_at FROM {}.schema_migrations ORDER BY version").format(
            pgsql.Identifier(schema)
        )
    ).fetchall()
    return tuple(
        Migration(int(v), str(n), at.astimezone(UTC).isoformat() if isinstance(at, datetime) else str(at))
        for v, n, at in rows
    )


@contextlib.contextmanager
def opened(url: str, **options: Any) -> Iterator[TransactionalStore]:
    """:func:`open_store` as a context manager that closes the store."""
    store = open_store(url, **options)
    try:
        yield store
    finally:
        store.close()


__all__ = [
    "DEFAULT_SCHEMA",
    "CheckReport",
    "Location",
    "Migration",
    "check",
    "db_option",
    "migrate",
    "no_database",
    "open_store",
    "opened",
    "parse_url",
    "probe_server",
]
