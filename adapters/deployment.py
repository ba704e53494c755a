"""The deployment check for one namespace and tenant: what must hold before workers start.

Seed 001 (Upgrade and operation, steps 3 and 4; Required production
profile): run ``check_durable_operations()`` for each deployed namespace and
tenant, and treat a missing schema, action or principal resolver as
blocking.  :func:`check_deployment` answers that for both subsystems in one
machine-readable :class:`DeploymentReport`; ``fencekeeper check`` prints it.

Rules of this module:

- It reads and never writes, whatever it finds (``connect.check``'s rule):
  SQLite is opened read-only, PostgreSQL in a READ ONLY transaction.
- **Blocking** (``ok`` is False, the command exits 1): a schema that is
  missing, outdated (PostgreSQL), altered or newer than this code; an action
  name/version or a principal resolver name/version that an Operation not
  yet ended refers to and the deployment's registry lacks; a principal
  reference that cannot be read; a definition revision that an execution
  not yet ended is pinned to and the store does not hold.
- **Warnings** (reported, ``ok`` stays True): an execution not yet ended
  whose row is damaged (``malformed_row``; workers pass over it), a SQLite file a migration
  behind (the store brings it forward when opened), outbox rows waiting
  longer than ``outbox_lag_warning``, parked outbox rows (counted apart:
  they wait for an operator, not the exporter), rows past their retention window that
  pruning has not removed yet, and a check run without the registry (what
  is referenced is listed but cannot be compared).
- Operations are counted for the given namespace and tenant only: the
  registries are per deployment, and seed 001 asks the check per tenant
  profile.  On PostgreSQL the connection also sets ``fencekeeper.tenant``
  to that tenant, so the tenant policies (migration 9) filter exactly as
  they would for the application; the check reads the executions' tables
  too, so it runs as the operator's role, not the restricted one.
- The outbox rows counted are the tenant's Operations' in the namespace
  and the workflow executions' of the business the tenant names (their
  rows carry it as their tenant): the exporter delivers both.
- Outbox lag is measured from the outbox table's export progress column
  (:data:`OUTBOX_PROGRESS_COLUMNS`); a schema whose outbox records no export
  progress reports the lag as null, with a note saying why.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs

from fencekeeper.kernel.common import identifier_problem

from . import codec, connect, postgres_store, sqlite_store
from .codec import decode_time
from .operations.service import (
    DurableActionRegistry,
    DurableOperationError,
    PrincipalResolverRegistry,
    referenced_versions,
)
from .sql import DEFINITION_TYPE, EXECUTION_TYPE
from .store import StoreError, definition_object_id

OUTBOX_PROGRESS_COLUMNS = ("exported_at",)
"""A column of ``outbox`` that is NULL until the exporter has delivered the row."""

_TERMINAL_EXECUTIONS = ("succeeded", "failed", "cancelled")

Execute = Callable[[str, Sequence[Any]], Any]

_DAMAGED_SHOWN = 10
"""Damaged executions a warning names (``damaged_executions`` lists them all)."""


@attrs.frozen
class Reference:
    """A name and version that Operations (or executions) not yet ended refer to, how many, and whether it is registered."""

    name: str
    version: int
    count: int
    registered: bool | None
    """None when no registry was given to compare with."""
    business: str | None = None
    """A definition's Business (definitions are registered per Business); None for actions and resolvers."""

    def to_json(self) -> dict[str, Any]:
        found = {"name": self.name, "version": self.version, "count": self.count, "registered": self.registered}
        return found if self.business is None else {"business": self.business, **found}


@attrs.frozen
class OutboxStatus:
    rows: int
    """Outbox rows of this namespace and tenant still in the table."""
    pending: int | None
    """Rows not yet exported nor parked; None when the schema records no export progress."""
    oldest_pending_at: datetime | None
    lag_seconds: float | None
    """How long the oldest pending row has waited."""
    note: str = ""
    parked: int | None = None
    """Rows the exporter gave up on, waiting for an operator: apart from ``pending``, so they never pass for lag."""
    oldest_parked_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "pending": self.pending,
            "oldest_pending_at": None if self.oldest_pending_at is None else self.oldest_pending_at.isoformat(),
            "lag_seconds": self.lag_seconds,
            "parked": self.parked,
            "oldest_parked_at": None if self.oldest_parked_at is None else self.oldest_parked_at.isoformat(),
            "note": self.note,
        }


@attrs.frozen
class UnprunedRow:
    """The row that has been past its retention window longest and is still stored."""

    table: str
    key: str
    retain_until: datetime
    overdue_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "key": self.key,
            "retain_until": self.retain_until.isoformat(),
            "overdue_seconds": self.overdue_seconds,
        }


@attrs.frozen
class DeploymentReport:
    """What :func:`check_deployment` found; ``blocking`` stops a deployment, ``warnings`` do not."""

    base: connect.CheckReport
    namespace: str
    tenant: str
    missing_migrations: tuple[int, ...] = ()
    actions: tuple[Reference, ...] = ()
    resolvers: tuple[Reference, ...] = ()
    unreadable_principals: tuple[str, ...] = ()
    definitions: tuple[Reference, ...] = ()
    registered_actions: tuple[tuple[str, int], ...] | None = None
    registered_resolvers: tuple[tuple[str, int], ...] | None = None
    outbox: OutboxStatus | None = None
    oldest_unpruned: UnprunedRow | None = None
    damaged_executions: tuple[str, ...] = ()
    """Executions not yet ended whose row is damaged (``malformed_row``), by id: a warning, since workers
    pass over them and run everything else."""
    blocking: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.blocking

    @property
    def reachable(self) -> bool:
        return self.base.reachable

    def to_json(self) -> dict[str, Any]:
        base = self.base
        return {
            "ok": self.ok,
            "store": base.location.kind,
            "location": base.location.describe(),
            "namespace": self.namespace,
            "tenant": self.tenant,
            "schema_version": base.schema_version,
            "code_version": base.code_version,
            "migrations": [attrs.asdict(m) for m in base.migrations],
            "missing_migrations": list(self.missing_migrations),
            "definitions": base.definitions,
            "executions": dict(base.executions),
            "operations": {
                "registered_actions": None
                if self.registered_actions is None
                else [{"name": n, "version": v} for n, v in self.registered_actions],
                "registered_resolvers": None
                if self.registered_resolvers is None
                else [{"name": n, "version": v} for n, v in self.registered_resolvers],
                "referenced_actions": [r.to_json() for r in self.actions],
                "referenced_resolvers": [r.to_json() for r in self.resolvers],
                "unreadable_principals": list(self.unreadable_principals),
            },
            "referenced_definitions": [r.to_json() for r in self.definitions],
            "damaged_executions": list(self.damaged_executions),
            "outbox": None if self.outbox is None else self.outbox.to_json(),
            "oldest_unpruned": None if self.oldest_unpruned is None else self.oldest_unpruned.to_json(),
            "blocking": list(self.blocking),
            "warnings": list(self.warnings),
            # The executions check's own words, kept under their earlier names.
            "problems": list(base.problems),
            "notes": list(base.notes) + ([] if base.time_source is None else [f"time source: {base.time_source}"]),
        }


def check_deployment(
    url: str,
    *,
    schema: str | None = None,
    namespace: str = "default",
    tenant: str = "default",
    actions: DurableActionRegistry | None = None,
    resolvers: PrincipalResolverRegistry | None = None,
    outbox_lag_warning: timedelta = timedelta(minutes=5),
) -> DeploymentReport:
    """The deployment check of ``url`` for ``namespace`` and ``tenant`` (see the module's rules); never writes."""
    for name, value in (("namespace", namespace), ("tenant", tenant)):
        problem = identifier_problem(value)
        if problem is not None:
            raise DurableOperationError("invalid_input", f"{name}: {problem}")
    base = connect.check(url, schema=schema)
    report = DeploymentReport(base, namespace, tenant, blocking=base.problems, warnings=base.notes)
    if not base.reachable or base.problems or not base.schema_version:
        return report
    location = base.location
    known = [n for n, _, _ in (sqlite_store.MIGRATIONS if location.kind == "sqlite" else postgres_store.MIGRATIONS)]
    applied = {m.version for m in base.migrations}
    report = attrs.evolve(report, missing_migrations=tuple(n for n in known if n not in applied))
    with _reading(location, tenant) as (execute, now):
        tables = _tables(execute, location)
        refused = _unreadable(execute, location, tables)
        if refused:
            # Read nothing: a table the role may not read would end the check in PostgreSQL's error,
            # and leaving it out would report a deployment as checked that was not.
            return attrs.evolve(report, blocking=(*report.blocking, *refused))
        if "operations" in tables:
            report = _operations(report, execute, actions, resolvers)
            report = attrs.evolve(
                report,
                outbox=_outbox(execute, namespace, tenant, now, tables),
                oldest_unpruned=_oldest_unpruned(execute, namespace, tenant, now),
            )
        definitions, damaged = _definitions(execute)
        report = attrs.evolve(report, definitions=definitions, damaged_executions=damaged)
    blocking = list(report.blocking)
    warnings = list(report.warnings)
    if actions is None or resolvers is None:
        warnings.append("no registry given (--actions): the actions and resolvers referenced are listed, not compared")
    for ref in report.actions:
        if ref.registered is False:
            blocking.append(f"action {ref.name} v{ref.version} is not registered; {ref.count} operation(s) not yet ended need it")
    for ref in report.resolvers:
        if ref.registered is False:
            blocking.append(
                f"principal resolver {ref.name} v{ref.version} is not registered; {ref.count} operation(s) not yet ended need it"
            )
    blocking.extend(f"principal reference {p!r} cannot be read" for p in report.unreadable_principals)
    for ref in report.definitions:
        if ref.registered is False:
            blocking.append(
                f"definition {ref.name} revision {ref.version} of business {ref.business} is not in the store; "
                f"{ref.count} execution(s) not yet ended are pinned to it"
            )
    if report.damaged_executions:
        shown = ", ".join(report.damaged_executions[:_DAMAGED_SHOWN])
        more = len(report.damaged_executions) - _DAMAGED_SHOWN
        warnings.append(
            f"executions: {len(report.damaged_executions)} not yet ended whose stored row is damaged "
            f"(malformed_row: its revision has no stored body, or one that is no execution revision, or its dispatch "
            f"row counts other steps): "
            f"{shown}{f' and {more} more' if more > 0 else ''}; workers pass over them, and they stay as they are "
            "until the rows are repaired (`fencekeeper inspect ID` shows the error)"
        )
    outbox = report.outbox
    if outbox is not None:
        if outbox.pending is None:
            warnings.append(f"outbox lag unknown: {outbox.note}")
        elif outbox.lag_seconds is not None and outbox.lag_seconds > outbox_lag_warning.total_seconds():
            warnings.append(
                f"outbox: {outbox.pending} row(s) waiting for export, the oldest for {outbox.lag_seconds:.0f} s; is the exporter running?"
            )
        if outbox.parked:
            warnings.append(
                f"outbox: {outbox.parked} row(s) parked after their last failed delivery, waiting for an operator "
                "(fencekeeper export --parked, then --requeue or --discard)"
            )
    if report.oldest_unpruned is not None:
        row = report.oldest_unpruned
        warnings.append(
            f"retention: {row.table} {row.key} is {row.overdue_seconds:.0f} s past its window and still stored; run pruning"
        )
    return attrs.evolve(report, blocking=tuple(blocking), warnings=tuple(warnings))


@contextlib.contextmanager
def _reading(location: connect.Location, tenant: str) -> Iterator[tuple[Execute, datetime]]:
    """A read-only connection: its ``execute`` with ``?`` placeholders, and the store's time."""
    if location.kind == "sqlite":
        assert location.path is not None
        with contextlib.closing(sqlite_store.connect_read_only(location.path)) as lite:
            yield lite.execute, datetime.now(UTC)
        return
    import psycopg  # noqa: PLC0415 - psycopg loads only for PostgreSQL URLs
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415

    from .operations.postgres import to_pyformat  # noqa: PLC0415

    assert location.dsn is not None and location.schema is not None
    # The tenant setting lets the restricted application role see this tenant's rows (migration 9).
    options = f"-c search_path={location.schema} -c fencekeeper.tenant={tenant}"
    dsn = make_conninfo(location.dsn, options=options, connect_timeout=connect.CONNECT_TIMEOUT_SECONDS)
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None

        def execute(sql: str, params: Sequence[Any] = ()) -> Any:
            return conn.execute(to_pyformat(sql), tuple(params))

        yield execute, row[0].astimezone(UTC)
        conn.rollback()


def _time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return decode_time(str(value))


_READ = ("objects", "object_revisions", "operations", "operation_identities", "outbox")
"""The tables the check reads past the base check, when the schema has them."""


def _tables(execute: Execute, location: connect.Location) -> dict[str, bool]:
    """The schema's tables, each with whether the role may SELECT from it."""
    if location.kind == "sqlite":
        return {str(r[0]): True for r in execute("SELECT name FROM sqlite_master WHERE type = 'table'", ()).fetchall()}
    # The catalogs, not information_schema: information_schema lists only the tables the role holds some
    # privilege on, so a table it may not read would pass for one the schema does not have, and the check
    # would skip what it holds (the operations, the outbox) and call the deployment ok.
    rows = execute(
        "SELECT c.relname, has_table_privilege(c.oid, 'SELECT') FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relkind IN ('r', 'p')",
        (location.schema,),
    )
    return {str(name): bool(readable) for name, readable in rows.fetchall()}


def _unreadable(execute: Execute, location: connect.Location, tables: dict[str, bool]) -> list[str]:
    """A ``permission_denied`` problem for each table the check reads that the role may not (none on SQLite)."""

    def query(statement: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        # The privilege lookup is written with psycopg's placeholders; execute takes the store's.
        return list(execute(statement.replace("%s", "?"), params).fetchall())

    return [
        postgres_store.unreadable_table(query, str(location.schema), table).message
        for table in _READ
        if not tables.get(table, True)
    ]


def _operations(
    report: DeploymentReport,
    execute: Execute,
    actions: DurableActionRegistry | None,
    resolvers: PrincipalResolverRegistry | None,
) -> DeploymentReport:
    rows = execute(
        "SELECT action_name, action_version, principal, count(*) FROM operations WHERE outcome IS NULL "
        "AND namespace = ? AND tenant = ? GROUP BY action_name, action_version, principal",
        (report.namespace, report.tenant),
    ).fetchall()
    found = referenced_versions((str(n), int(v), str(p), int(c)) for n, v, p, c in rows)
    registered_actions = None if actions is None else set(actions.names())
    registered_resolvers = None if resolvers is None else set(resolvers.registered())

    def refs(counts: tuple[tuple[str, int, int], ...], registered: set[tuple[str, int]] | None) -> tuple[Reference, ...]:
        return tuple(Reference(n, v, c, None if registered is None else (n, v) in registered) for n, v, c in counts)

    return attrs.evolve(
        report,
        actions=refs(found.actions, registered_actions),
        resolvers=refs(found.resolvers, registered_resolvers),
        unreadable_principals=found.unreadable_principals,
        registered_actions=None if registered_actions is None else tuple(sorted(registered_actions)),
        registered_resolvers=None if registered_resolvers is None else tuple(sorted(registered_resolvers)),
    )


def _outbox(
    execute: Execute, namespace: str, tenant: str, now: datetime, tables: Mapping[str, bool]
) -> OutboxStatus | None:
    if "outbox" not in tables:
        return None
    cursor = execute("SELECT * FROM outbox WHERE 1 = 0", ())
    columns = {str(d[0]) for d in cursor.description or ()}
    cursor.fetchall()
    # The tenant's Operations of this namespace, and the workflow executions of the business the tenant
    # names (an execution's row carries its business as its tenant, and executions have no namespace):
    # the exporter delivers both, so a stalled exporter is lag for both.
    scope = (
        "FROM outbox m LEFT JOIN operations o ON m.kind = 'operation' AND o.operation_id = m.subject_id "
        "WHERE ((o.namespace = ? AND o.tenant = ?) OR (m.kind = 'execution' AND m.tenant = ?))"
    )
    params = (namespace, tenant, tenant)
    row = execute(f"SELECT count(*) {scope}", params).fetchone()
    total = int(row[0]) if row is not None else 0
    progress = next((c for c in OUTBOX_PROGRESS_COLUMNS if c in columns), None)
    if progress is None:
        return OutboxStatus(
            total, None, None, None, "this schema's outbox records no export progress (no exporter has been set up)"
        )
    if "parked_at" not in columns:
        row = execute(f"SELECT count(*), min(m.at) {scope} AND m.{progress} IS NULL", params).fetchone()
        pending = int(row[0]) if row is not None else 0
        oldest = _time(row[1]) if row is not None else None
        lag = None if oldest is None else max(0.0, (now - oldest).total_seconds())
        return OutboxStatus(total, pending, oldest, lag)
    # A parked row waits for an operator, not for the exporter: counted apart, it is not lag.
    row = execute(
        f"SELECT count(*) FILTER (WHERE m.parked_at IS NULL), min(m.at) FILTER (WHERE m.parked_at IS NULL), "
        f"count(*) FILTER (WHERE m.parked_at IS NOT NULL), min(m.at) FILTER (WHERE m.parked_at IS NOT NULL) "
        f"{scope} AND m.{progress} IS NULL",
        params,
    ).fetchone()
    pending = int(row[0]) if row is not None else 0
    oldest = _time(row[1]) if row is not None else None
    lag = None if oldest is None else max(0.0, (now - oldest).total_seconds())
    parked = int(row[2]) if row is not None else 0
    return OutboxStatus(total, pending, oldest, lag, parked=parked, oldest_parked_at=_time(row[3]) if row else None)


def _oldest_unpruned(execute: Execute, namespace: str, tenant: str, now: datetime) -> UnprunedRow | None:
    """The ended Operation or the idempotency identity longest past its window (nonterminal work is never pruned)."""
    candidates: list[UnprunedRow] = []
    for table, key, ended in (
        ("operations", "operation_id", " AND outcome IS NOT NULL"),
        ("operation_identities", "client_key", ""),
    ):
        row = execute(
            f"SELECT {key}, retain_until FROM {table} WHERE namespace = ? AND tenant = ?{ended} "
            "ORDER BY retain_until LIMIT 1",
            (namespace, tenant),
        ).fetchone()
        if row is None:
            continue
        until = _time(row[1])
        assert until is not None
        if until < now:
            candidates.append(UnprunedRow(table, str(row[0]), until, (now - until).total_seconds()))
    return max(candidates, key=lambda c: c.overdue_seconds, default=None)


def _definitions(execute: Execute) -> tuple[tuple[Reference, ...], tuple[str, ...]]:
    """Definition revisions that executions not yet ended are pinned to, and whether the store holds each;
    and the executions not yet ended whose row is damaged.

    Each execution's current revision is read as a worker reads it (``codec.decode_execution``): a row
    that names a revision with no stored body, or a body that is no execution revision, is damaged
    (``malformed_row``), is pinned to nothing this check can name, and is listed instead; so is one
    whose dispatch row counts other steps than its revision (a claim refuses to decide on the pair).  Read in SQL
    (PostgreSQL's ``body::jsonb``), one body that is no JSON ended the whole check in an error.
    """
    terminal = ", ".join(f"'{s}'" for s in _TERMINAL_EXECUTIONS)
    rows = execute(
        "SELECT o.object_id, o.business_id, (SELECT v.body FROM object_revisions v "
        "WHERE v.object_id = o.object_id AND v.revision = o.revision), d.step_count FROM objects o "
        "LEFT JOIN workflow_dispatch d ON d.workflow_execution_id = o.object_id "
        f"WHERE o.object_type = ? AND o.state NOT IN ({terminal}) ORDER BY o.object_id",
        (EXECUTION_TYPE,),
    )
    pinned: Counter[tuple[str, str, int]] = Counter()
    damaged: list[str] = []
    for object_id, business, body, steps in rows:
        try:
            execution = codec.decode_execution(body, str(object_id))
        except StoreError:
            damaged.append(str(object_id))
            continue
        if steps is not None and steps != execution.step_count:
            # Both rows count the same steps; the kernel will not decide on a pair that disagrees.
            damaged.append(str(object_id))
        pinned[(str(business), execution.definition_id, execution.definition_revision)] += 1
    references = []
    for (business, name, version), count in sorted(pinned.items()):
        held = execute(
            "SELECT 1 FROM objects o JOIN object_revisions v ON v.object_id = o.object_id "
            "WHERE o.object_id = ? AND o.object_type = ? AND o.business_id = ? AND v.revision = ?",
            (definition_object_id(str(business), str(name)), DEFINITION_TYPE, str(business), int(version)),
        ).fetchone()
        references.append(Reference(str(name), int(version), int(count), held is not None, str(business)))
    return tuple(references), tuple(damaged)


__all__ = ["OUTBOX_PROGRESS_COLUMNS", "DeploymentReport", "OutboxStatus", "Reference", "UnprunedRow", "check_deployment"]
