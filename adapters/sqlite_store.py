"""The SQLite store: the embedded default, with fenced and coherent commits.

Rules of this module:

- Every request is one ``BEGIN IMMEDIATE`` transaction: the write lock is
  taken before anything is read, so the rows the kernel decides on are the
  rows the writes land on.  The guard is nonetheless carried into every
  UPDATE's WHERE clause; a guarded write that touches no row rolls the whole
  transaction back (defence in depth against anything that bypasses the
  store, and the same code shape as the PostgreSQL store, where it matters).
- Nothing is overwritten to hide history: execution revisions, transition
  records and evidence are appended; triggers refuse UPDATE and DELETE on
  the append-only tables.  ``workflow_dispatch`` has exactly the seed's
  fields (seed 000, Persistence) and a CHECK that its lease fields are set
  if and only if it is claimed.
- The schema is built by numbered, immutable, forward-only migrations
  recorded in ``schema_migrations`` with a checksum.  Opening a database
  whose recorded version is newer than this code, whose recorded migration
  differs from this code's, or whose schema was altered by hand is refused
  with a ``StoreError`` naming the version; nothing is written first.
- A file that is not a SQLite database, is corrupt or cannot be written is
  refused before any write, so it is left exactly as it was.
- sqlite-utils builds nothing by hand-written string concatenation of
  schema: it executes the migrations and answers introspection (tables,
  columns); the hot path uses the ``sqlite3`` connection directly, which
  avoids sqlite-utils' per-call overhead (see bench/sqlite_store.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

import sqlite_utils

from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import DispatchState, ExecutionEvent, ExecutionState

from . import codec
from .store import Backend, Clock, Evidence, ExecutionView, StoreError, TransactionalStore

BUSY_TIMEOUT_MS = 10_000

_DISPATCH_STATES = ", ".join(f"'{s.value}'" for s in DispatchState)

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "initial",
        f"""
CREATE TABLE objects (
    object_id    TEXT PRIMARY KEY,
    object_type  TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    parent_id    TEXT REFERENCES objects(object_id),
    revision     INTEGER NOT NULL CHECK (revision >= 1),
    state        TEXT,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);
CREATE INDEX objects_parent ON objects (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX objects_type_state ON objects (object_type, state);

CREATE TABLE object_revisions (
    object_id    TEXT NOT NULL REFERENCES objects(object_id),
    revision     INTEGER NOT NULL CHECK (revision >= 1),
    state        TEXT,
    body         TEXT NOT NULL,
    committed_at TEXT NOT NULL,
    PRIMARY KEY (object_id, revision)
);
CREATE TRIGGER object_revisions_no_update BEFORE UPDATE ON object_revisions
BEGIN SELECT RAISE(ABORT, 'object_revisions is append-only'); END;
CREATE TRIGGER object_revisions_no_delete BEFORE DELETE ON object_revisions
BEGIN SELECT RAISE(ABORT, 'object_revisions is append-only'); END;

CREATE TABLE workflow_dispatch (
    workflow_execution_id TEXT PRIMARY KEY REFERENCES objects(object_id),
    dispatch_state        TEXT NOT NULL CHECK (dispatch_state IN ({_DISPATCH_STATES})),
    eligible_at           TEXT NOT NULL,
    lease_token           TEXT,
    leased_by             TEXT,
    lease_expires_at      TEXT,
    step_count            INTEGER NOT NULL DEFAULT 0 CHECK (step_count BETWEEN 0 AND {p.STEP_LIMIT}),
    last_error_code       TEXT,
    CHECK (
        (dispatch_state = 'claimed'
            AND lease_token IS NOT NULL AND leased_by IS NOT NULL AND lease_expires_at IS NOT NULL)
        OR (dispatch_state <> 'claimed'
            AND lease_token IS NULL AND leased_by IS NULL AND lease_expires_at IS NULL)
    )
);
CREATE INDEX workflow_dispatch_eligible ON workflow_dispatch (eligible_at, workflow_execution_id)
    WHERE dispatch_state = 'eligible';
CREATE INDEX workflow_dispatch_claimed ON workflow_dispatch (lease_expires_at)
    WHERE dispatch_state = 'claimed';

CREATE TABLE transitions (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id TEXT NOT NULL REFERENCES objects(object_id),
    event        TEXT,
    from_state   TEXT,
    to_state     TEXT NOT NULL,
    revision     INTEGER NOT NULL,
    at           TEXT NOT NULL,
    actor        TEXT NOT NULL,
    lease_token  TEXT,
    fence        INTEGER NOT NULL,
    reason       TEXT NOT NULL
);
CREATE INDEX transitions_execution ON transitions (execution_id, seq);
CREATE TRIGGER transitions_no_update BEFORE UPDATE ON transitions
BEGIN SELECT RAISE(ABORT, 'transitions is append-only'); END;
CREATE TRIGGER transitions_no_delete BEFORE DELETE ON transitions
BEGIN SELECT RAISE(ABORT, 'transitions is append-only'); END;

CREATE TABLE wait_registrations (
    execution_id TEXT NOT NULL REFERENCES objects(object_id),
    node_id      TEXT NOT NULL,
    attempt_id   TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    spec         TEXT NOT NULL,
    woken_by     TEXT,
    wake_reason  TEXT,
    PRIMARY KEY (execution_id, node_id, attempt_id)
);

CREATE TABLE events (
    event_id     TEXT PRIMARY KEY,
    business_id  TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    correlation  TEXT NOT NULL,
    committed_at TEXT NOT NULL
);
CREATE INDEX events_type ON events (business_id, event_type);

CREATE TABLE commands (
    command_id   TEXT PRIMARY KEY,
    command_type TEXT NOT NULL,
    business_id  TEXT NOT NULL,
    execution_id TEXT REFERENCES objects(object_id),
    body         TEXT NOT NULL,
    recorded_at  TEXT NOT NULL
);
CREATE INDEX commands_execution ON commands (execution_id);
CREATE TRIGGER commands_no_update BEFORE UPDATE ON commands
BEGIN SELECT RAISE(ABORT, 'commands is append-only'); END;
CREATE TRIGGER commands_no_delete BEFORE DELETE ON commands
BEGIN SELECT RAISE(ABORT, 'commands is append-only'); END;
""",
    ),
)
"""Numbered, immutable, forward-only.  Never edit one: add the next."""

EXECUTION_TYPE = "WorkflowExecution"
RECOVERY_COMMAND_TYPE = "workflow_reconcile"


def _checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def _schema_fingerprint(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
        "AND name <> 'schema_migrations' ORDER BY type, name"
    ).fetchall()
    return [(str(t), str(n), " ".join(str(s).split())) for t, n, s in rows]


def _expected_fingerprint(version: int) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(":memory:")
    try:
        for number, _, sql in MIGRATIONS:
            if number <= version:
                conn.executescript(sql)
        return _schema_fingerprint(conn)
    finally:
        conn.close()


class _SQLiteBackend(Backend):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def load(self, execution_id: str) -> tuple[p.Execution | None, p.Dispatch | None]:
        row = self.conn.execute(
            "SELECT r.body FROM objects o JOIN object_revisions r "
            "ON r.object_id = o.object_id AND r.revision = o.revision "
            "WHERE o.object_id = ? AND o.object_type = ?",
            (execution_id, EXECUTION_TYPE),
        ).fetchone()
        execution = None if row is None else codec.decode_execution(row[0])
        return execution, _load_dispatch(self.conn, execution_id)

    def load_registration(self, key: p.WaitKey) -> p.WaitRegistration | None:
        row = self.conn.execute(
            "SELECT business_id, spec, woken_by, wake_reason FROM wait_registrations "
            "WHERE execution_id = ? AND node_id = ? AND attempt_id = ?",
            (key.execution_id, key.node_id, key.attempt_id),
        ).fetchone()
        if row is None:
            return None
        return p.WaitRegistration(
            key=key,
            business_id=row[0],
            spec=codec.decode_wait_spec(row[1]),
            woken_by=row[2],
            wake_reason=None if row[3] is None else p.WakeReason(row[3]),
        )

    def load_recovery(self, command_id: str) -> p.RecoveryRecord | None:
        row = self.conn.execute(
            "SELECT body FROM commands WHERE command_id = ? AND command_type = ?",
            (command_id, RECOVERY_COMMAND_TYPE),
        ).fetchone()
        return None if row is None else codec.decode_recovery(row[0])

    def next_eligible(self, now: datetime, business_id: str | None) -> str | None:
        if business_id is None:
            row = self.conn.execute(
                "SELECT workflow_execution_id FROM workflow_dispatch "
                "WHERE dispatch_state = 'eligible' AND eligible_at <= ? "
                "ORDER BY eligible_at, workflow_execution_id LIMIT 1",
                (codec.encode_time(now),),
            ).fetchone()
        else:
            row = self.conn.execute(
                "SELECT d.workflow_execution_id FROM workflow_dispatch d "
                "JOIN objects o ON o.object_id = d.workflow_execution_id "
                "WHERE d.dispatch_state = 'eligible' AND d.eligible_at <= ? AND o.business_id = ? "
                "ORDER BY d.eligible_at, d.workflow_execution_id LIMIT 1",
                (codec.encode_time(now), business_id),
            ).fetchone()
        return None if row is None else str(row[0])

    def write(self, decision: p.Decision, evidence: Sequence[Evidence], now: datetime) -> bool:
        guard = decision.guard
        at = codec.encode_time(now)
        eid = guard.execution_id
        conn = self.conn
        execution = decision.execution
        if guard.expected_revision == 0:
            if execution is None or decision.dispatch is None:
                return False
            try:
                conn.execute(
                    "INSERT INTO objects (object_id, object_type, business_id, revision, state, created_at, "
                    "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (eid, EXECUTION_TYPE, execution.business_id, execution.revision, execution.state.value, at, at),
                )
            except sqlite3.IntegrityError:
                return False
            conn.execute(
                "INSERT INTO workflow_dispatch (workflow_execution_id, dispatch_state, eligible_at, lease_token, "
                "leased_by, lease_expires_at, step_count, last_error_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (eid, *_dispatch_values(decision.dispatch)),
            )
        else:
            if execution is not None:
                cursor = conn.execute(
                    "UPDATE objects SET revision = ?, state = ?, updated_at = ? "
                    "WHERE object_id = ? AND object_type = ? AND revision = ? AND state = ?",
                    (
                        execution.revision,
                        execution.state.value,
                        at,
                        eid,
                        EXECUTION_TYPE,
                        guard.expected_revision,
                        None if guard.expected_state is None else guard.expected_state.value,
                    ),
                )
                if cursor.rowcount != 1:
                    return False
            # The dispatch row is always written under its part of the guard;
            # when the execution object is not written, the guard's revision
            # is checked by the same statement, so a renewal cannot land on a
            # revision it did not see.
            dispatch = decision.dispatch
            values = _dispatch_values(dispatch) if dispatch is not None else None
            sql = (
                "UPDATE workflow_dispatch SET dispatch_state = ?, eligible_at = ?, lease_token = ?, leased_by = ?, "
                "lease_expires_at = ?, step_count = ?, last_error_code = ? "
                if values is not None
                else "UPDATE workflow_dispatch SET dispatch_state = dispatch_state "
            )
            sql += (
                "WHERE workflow_execution_id = ? AND dispatch_state = ? AND lease_token IS ? "
                "AND lease_expires_at IS ?"
            )
            params: list[object] = list(values) if values is not None else []
            params += [
                eid,
                None if guard.expected_dispatch_state is None else guard.expected_dispatch_state.value,
                guard.expected_lease_token,
                codec.encode_optional_time(guard.expected_lease_expires_at),
            ]
            if guard.requires_live_lease:
                sql += " AND lease_expires_at > ?"
                params.append(at)
            if execution is None:
                sql += (
                    " AND EXISTS (SELECT 1 FROM objects WHERE object_id = ? AND revision = ? AND state = ?)"
                )
                params += [
                    eid,
                    guard.expected_revision,
                    None if guard.expected_state is None else guard.expected_state.value,
                ]
            if conn.execute(sql, params).rowcount != 1:
                return False
        if execution is not None:
            conn.execute(
                "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) VALUES (?, ?, ?, ?, ?)",
                (eid, execution.revision, execution.state.value, codec.encode_execution(execution), at),
            )
        if decision.registration is not None and not self._write_registration(decision.registration):
            return False
        if decision.recovery is not None:
            business = execution.business_id if execution is not None else None
            try:
                conn.execute(
                    "INSERT INTO commands (command_id, command_type, business_id, execution_id, body, recorded_at) "
                    "VALUES (?, ?, COALESCE(?, (SELECT business_id FROM objects WHERE object_id = ?)), ?, ?, ?)",
                    (
                        decision.recovery.command_id,
                        RECOVERY_COMMAND_TYPE,
                        business,
                        eid,
                        eid,
                        codec.encode_recovery(decision.recovery),
                        at,
                    ),
                )
            except sqlite3.IntegrityError:
                return False
        conn.executemany(
            "INSERT INTO transitions (execution_id, event, from_state, to_state, revision, at, actor, lease_token, "
            "fence, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    r.execution_id,
                    None if r.event is None else r.event.value,
                    None if r.from_state is None else r.from_state.value,
                    r.to_state.value,
                    r.revision,
                    codec.encode_time(r.at),
                    r.actor,
                    r.lease_token,
                    r.fence,
                    r.reason,
                )
                for r in decision.evidence
            ],
        )
        for item in evidence:
            self._write_evidence(eid, item, at)
        return True

    def _write_registration(self, registration: p.WaitRegistration) -> bool:
        key = registration.key
        if registration.woken_by is None:
            try:
                self.conn.execute(
                    "INSERT INTO wait_registrations (execution_id, node_id, attempt_id, business_id, spec) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        key.execution_id,
                        key.node_id,
                        key.attempt_id,
                        registration.business_id,
                        codec.encode_wait_spec(registration.spec),
                    ),
                )
            except sqlite3.IntegrityError:
                return False
            return True
        cursor = self.conn.execute(
            "UPDATE wait_registrations SET woken_by = ?, wake_reason = ? "
            "WHERE execution_id = ? AND node_id = ? AND attempt_id = ? AND woken_by IS NULL",
            (
                registration.woken_by,
                None if registration.wake_reason is None else registration.wake_reason.value,
                key.execution_id,
                key.node_id,
                key.attempt_id,
            ),
        )
        return cursor.rowcount == 1

    def _write_evidence(self, execution_id: str, item: Evidence, at: str) -> None:
        try:
            self.conn.execute(
                "INSERT INTO objects (object_id, object_type, business_id, parent_id, revision, state, created_at, "
                "updated_at) SELECT ?, ?, business_id, object_id, 1, NULL, ?, ? FROM objects WHERE object_id = ?",
                (item.object_id, item.kind, at, at, execution_id),
            )
        except sqlite3.IntegrityError:
            raise StoreError(
                "evidence_conflict", f"evidence {item.object_id!r} already exists; evidence is never overwritten"
            ) from None
        self.conn.execute(
            "INSERT INTO object_revisions (object_id, revision, state, body, committed_at) VALUES (?, 1, NULL, ?, ?)",
            (item.object_id, item.body_json(), at),
        )


def _dispatch_values(d: p.Dispatch) -> tuple[object, ...]:
    return (
        d.dispatch_state.value,
        codec.encode_time(d.eligible_at),
        d.lease_token,
        d.leased_by,
        codec.encode_optional_time(d.lease_expires_at),
        d.step_count,
        d.last_error_code,
    )


def _load_dispatch(conn: sqlite3.Connection, execution_id: str) -> p.Dispatch | None:
    row = conn.execute(
        "SELECT dispatch_state, eligible_at, lease_token, leased_by, lease_expires_at, step_count, last_error_code "
        "FROM workflow_dispatch WHERE workflow_execution_id = ?",
        (execution_id,),
    ).fetchone()
    if row is None:
        return None
    return p.Dispatch(
        workflow_execution_id=execution_id,
        dispatch_state=DispatchState(row[0]),
        eligible_at=codec.decode_time(row[1]),
        lease_token=row[2],
        leased_by=row[3],
        lease_expires_at=codec.decode_optional_time(row[4]),
        step_count=row[5],
        last_error_code=row[6],
    )


class SQLiteStore(TransactionalStore):
    """A store in one SQLite file.  One connection per store object; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str], clock: Clock | None = None) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = _open(self.path)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        with self._lock:
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError("store_unavailable", f"{self.path}: cannot begin a write: {exc}") from None
            try:
                yield _SQLiteBackend(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # A read transaction, so that a view is taken from one consistent snapshot.
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    def expired(self) -> list[str]:
        now = codec.encode_time(self.clock.now())
        with self._read() as conn:
            rows = conn.execute(
                "SELECT workflow_execution_id FROM workflow_dispatch WHERE dispatch_state = 'claimed' "
                "AND lease_expires_at <= ? ORDER BY workflow_execution_id",
                (now,),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def execution_ids(self, state: ExecutionState | None = None) -> list[str]:
        with self._read() as conn:
            if state is None:
                rows = conn.execute(
                    "SELECT object_id FROM objects WHERE object_type = ? ORDER BY object_id", (EXECUTION_TYPE,)
                ).fetchall()
            else:
                rows = conn.execute(
                    "SELECT object_id FROM objects WHERE object_type = ? AND state = ? ORDER BY object_id",
                    (EXECUTION_TYPE, state.value),
                ).fetchall()
        return [str(r[0]) for r in rows]

    def read(self, execution_id: str) -> ExecutionView | None:
        with self._read() as conn:
            backend = _SQLiteBackend(conn)
            execution, dispatch = backend.load(execution_id)
            if execution is None or dispatch is None:
                return None
            revisions = tuple(
                codec.decode_execution(r[0])
                for r in conn.execute(
                    "SELECT body FROM object_revisions WHERE object_id = ? ORDER BY revision", (execution_id,)
                )
            )
            history = tuple(
                p.TransitionRecord(
                    execution_id=execution_id,
                    event=None if r[0] is None else ExecutionEvent(r[0]),
                    from_state=None if r[1] is None else ExecutionState(r[1]),
                    to_state=ExecutionState(r[2]),
                    revision=r[3],
                    at=codec.decode_time(r[4]),
                    actor=r[5],
                    lease_token=r[6],
                    fence=r[7],
                    reason=r[8],
                )
                for r in conn.execute(
                    "SELECT event, from_state, to_state, revision, at, actor, lease_token, fence, reason "
                    "FROM transitions WHERE execution_id = ? ORDER BY seq",
                    (execution_id,),
                )
            )
            keys = conn.execute(
                "SELECT node_id, attempt_id FROM wait_registrations WHERE execution_id = ? "
                "ORDER BY rowid",
                (execution_id,),
            ).fetchall()
            registrations = tuple(
                r
                for r in (backend.load_registration(p.WaitKey(execution_id, k[0], k[1])) for k in keys)
                if r is not None
            )
            recoveries = tuple(
                codec.decode_recovery(r[0])
                for r in conn.execute(
                    "SELECT body FROM commands WHERE execution_id = ? AND command_type = ? ORDER BY rowid",
                    (execution_id, RECOVERY_COMMAND_TYPE),
                )
            )
            evidence = tuple(
                Evidence(r[0], r[1], json.loads(r[2]))
                for r in conn.execute(
                    "SELECT o.object_id, o.object_type, v.body FROM objects o JOIN object_revisions v "
                    "ON v.object_id = o.object_id AND v.revision = o.revision "
                    "WHERE o.parent_id = ? ORDER BY o.rowid",
                    (execution_id,),
                )
            )
        return ExecutionView(execution, dispatch, revisions, history, registrations, recoveries, evidence)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


# --- opening, checking and migrating ----------------------------------------------------


def _open(path: Path) -> sqlite3.Connection:
    """Open ``path``, refuse it without writing if it is not ours, then migrate it forward."""
    existed = path.exists()
    if existed and path.is_dir():
        raise StoreError("not_a_database", f"{path}: is a directory, not a SQLite database")
    if not existed and not path.parent.exists():
        raise StoreError("store_unavailable", f"{path}: directory {path.parent} does not exist")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreError("store_unavailable", f"{path}: cannot open: {exc}") from None
    try:
        _check_readable(conn, path)
        version = _check_schema(conn, path)
        _configure(conn, path)
        _migrate(conn, path, version)
    except BaseException:
        conn.close()
        raise
    return conn


def _check_readable(conn: sqlite3.Connection, path: Path) -> None:
    # Reading the schema touches every page header SQLite needs; a file that is
    # not a database or is damaged fails here, before anything is written.
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if conn.execute("PRAGMA quick_check").fetchone() != ("ok",):
            raise StoreError("not_a_database", f"{path}: the database is corrupt (quick_check failed)")
    except sqlite3.DatabaseError as exc:
        raise StoreError("not_a_database", f"{path}: not a usable SQLite database: {exc}") from None


def _check_schema(conn: sqlite3.Connection, path: Path) -> int:
    db = sqlite_utils.Database(conn)
    tables = set(db.table_names())
    if "schema_migrations" not in tables:
        ours = {"objects", "workflow_dispatch"} & tables
        if tables and ours:
            raise StoreError("schema_altered", f"{path}: has fencekeeper tables but no schema_migrations record")
        if tables:
            raise StoreError(
                "not_a_database", f"{path}: is a SQLite database of something else (tables {sorted(tables)[:5]})"
            )
        return 0
    recorded = conn.execute("SELECT version, name, checksum FROM schema_migrations ORDER BY version").fetchall()
    known = {number: (name, _checksum(sql)) for number, name, sql in MIGRATIONS}
    newest = max(known)
    version = 0
    for number, name, checksum in recorded:
        if number > newest:
            raise StoreError(
                "schema_too_new",
                f"{path}: schema version {number} ({name}) is newer than this fencekeeper, which knows up to "
                f"version {newest}; upgrade fencekeeper",
            )
        if known.get(number) != (name, checksum):
            raise StoreError(
                "schema_altered", f"{path}: migration {number} ({name}) differs from this fencekeeper's version {number}"
            )
        version = number
    if _schema_fingerprint(conn) != _expected_fingerprint(version):
        raise StoreError(
            "schema_altered", f"{path}: the schema at version {version} was altered outside fencekeeper's migrations"
        )
    return version


def _configure(conn: sqlite3.Connection, path: Path) -> None:
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    except sqlite3.OperationalError as exc:
        raise StoreError("read_only", f"{path}: cannot be written: {exc}") from None
    if mode is None or str(mode[0]).lower() != "wal":
        raise StoreError("read_only", f"{path}: cannot switch to WAL mode (got {mode}); is it read-only?")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys=ON")
    # FULL: a committed decision survives power loss, not only a crash.
    conn.execute("PRAGMA synchronous=FULL")


def _migrate(conn: sqlite3.Connection, path: Path, version: int) -> None:
    pending = [(n, name, sql) for n, name, sql in MIGRATIONS if n > version]
    if not pending:
        return
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "checksum TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for number, name, sql in pending:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
                "VALUES (?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                (number, name, _checksum(sql)),
            )
        conn.execute("COMMIT")
    except sqlite3.OperationalError as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        if "readonly" in str(exc) or "read-only" in str(exc):
            raise StoreError("read_only", f"{path}: cannot be written: {exc}") from None
        raise StoreError("store_unavailable", f"{path}: migration failed: {exc}") from None


def _statements(script: str) -> Iterator[str]:
    # executescript() would COMMIT the surrounding transaction; split instead,
    # keeping trigger bodies (which contain ';') whole.
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                yield buffer.strip()
            buffer = ""
    if buffer.strip():
        raise ValueError(f"incomplete migration statement: {buffer.strip()[:60]}")
