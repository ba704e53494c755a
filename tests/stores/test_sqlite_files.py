"""What only the SQLite store has to get right: its file, its settings, its schema and bad input.

What these tests prove:

- the connection runs in WAL mode with foreign keys on, a busy timeout
  (a write waits for another writer instead of failing) and synchronous
  FULL;
- the schema is built by the numbered migrations, each recorded in
  ``schema_migrations`` with the SHA-256 of its text, and re-opening an
  existing store keeps its data and migrates nothing again;
- bad input is refused with a ``StoreError`` whose stable code says what is
  wrong and whose message names the path, and the file is left exactly as
  it was: same bytes, same modification time, and no ``-wal``/``-shm``
  (or any other) file created beside it.  The cases: a corrupt database, a
  file that is not SQLite, a SQLite database of something else, a read-only
  path, a newer schema version, a schema altered by hand, a directory and a
  path in a missing directory;
- the append-only triggers refuse UPDATE and DELETE on object_revisions,
  transitions and commands, the CHECK refuses a claimed row without lease
  fields (and an unclaimed row with them), and ``PRAGMA integrity_check``
  and ``foreign_key_check`` are clean after a run.

Read-only for root: the tests run as root here, and root ignores permission
bits, so ``chmod`` alone would not make a path read-only.  When the effective
user is root the tests also set the immutable attribute (``FS_IMMUTABLE_FL``
via the ``FS_IOC_SETFLAGS`` ioctl, what ``chattr +i`` does), which the kernel
enforces for root too; every test checks first that the path really refuses
writes, and fails (never skips) if it cannot make it so.  The attribute is
always removed afterwards.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from fencekeeper.adapters import sqlite_store
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock, StoreError
from fencekeeper.adapters.testing.suite import (
    GRANTED,
    LEASE,
    admit,
    claim,
    decided,
    finalize_request,
    recovery_request,
    snapshot,
    step_request,
    view,
)
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState

# --- helpers -----------------------------------------------------------------------------------


def populated_store(path: Path) -> Path:
    """A real store file with some history (every table written), closed: no -wal or -shm left."""
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock)
    for i in range(12):
        admit(store, f"e-{i:02d}")
    execution_id, credential = claim(store, "w-1")
    # A renewal makes no revision, so it is the one transition kept in the transitions table.
    decided(store.renew(execution_id, p.RenewRequest(credential, LEASE)))
    decided(store.record_step(execution_id, step_request(store, execution_id, credential)))
    decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.SUCCEEDED)))
    execution_id, credential = claim(store, "w-2")
    clock.advance(LEASE)
    decided(store.recover(recovery_request(store, execution_id, p.RecoveryKind.QUARANTINE_EXPIRED, "q-1")))
    store.close()
    assert sorted(os.listdir(path.parent)) == [path.name], "closing the store must leave only its file"
    return path


def file_state(path: Path) -> tuple[object, ...]:
    """Everything a refusal must leave alone: the bytes, the mtime and what lies beside the file."""
    info = path.lstat()
    content = path.read_bytes() if path.is_file() else None
    return content, info.st_mtime_ns, stat.S_IMODE(info.st_mode), sorted(os.listdir(path.parent))


def refused_open(path: Path, code: str) -> StoreError:
    """Opening ``path`` must raise StoreError(code) naming the path, and change nothing on disk."""
    before = file_state(path)
    with pytest.raises(StoreError) as caught:
        SQLiteStore(path).close()
    error = caught.value
    assert error.code == code, f"expected {code}, got {error.code}: {error.message}"
    assert str(path) in error.message and str(path) in str(error), error.message
    assert file_state(path) == before, f"refusing {path} ({code}) changed it or created files beside it"
    return error


def store_connection(store: SQLiteStore) -> sqlite3.Connection:
    """The store's own connection: per-connection PRAGMAs can only be read through it."""
    conn = store._conn
    assert isinstance(conn, sqlite3.Connection)
    return conn


_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_IMMUTABLE_FL = 0x00000010


def _set_immutable(path: Path, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | _FS_IMMUTABLE_FL if on else flags[0] & ~_FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
    finally:
        os.close(fd)


def _refuses_writes(path: Path) -> bool:
    try:
        if path.is_dir():
            probe = path / ".write-probe"
            probe.touch()
            probe.unlink()
        else:
            with path.open("r+b"):
                pass
    except PermissionError:
        return True
    return False


@contextlib.contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """Make ``paths`` (files and directories) refuse writes, for this user even if it is root."""
    modes = {path: stat.S_IMODE(path.stat().st_mode) for path in paths}
    immutable: list[Path] = []
    try:
        for path in paths:
            path.chmod(0o555 if path.is_dir() else 0o444)
        if os.geteuid() == 0:
            for path in paths:
                try:
                    _set_immutable(path, True)
                except OSError as exc:
                    pytest.fail(
                        f"running as root, and {path} cannot be made immutable ({exc}): no honest read-only path"
                    )
                immutable.append(path)
        for path in paths:
            assert _refuses_writes(path), f"{path} still accepts writes; the test would prove nothing"
        yield
    finally:
        for path in reversed(immutable):
            _set_immutable(path, False)
        for path, mode in modes.items():
            path.chmod(mode)


# --- settings ----------------------------------------------------------------------------------


def test_wal_foreign_keys_busy_timeout_and_full_sync(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    try:
        conn = store_connection(store)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (sqlite_store.BUSY_TIMEOUT_MS,)
        assert sqlite_store.BUSY_TIMEOUT_MS >= 1_000
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)  # FULL
        # WAL is a property of the file, so a second connection sees it too.
        other = sqlite3.connect(path)
        try:
            assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            other.close()
    finally:
        store.close()


def test_foreign_keys_are_enforced_on_the_store_connection(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "store.db")
    try:
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            store_connection(store).execute(
                "INSERT INTO workflow_dispatch (workflow_execution_id, dispatch_state, eligible_at) "
                "VALUES ('e-nobody', 'eligible', '2026-01-01T00:00:00.000000+00:00')"
            )
        assert store.execution_ids() == []
    finally:
        store.close()


def test_a_write_waits_for_another_writer_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(path)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        released = threading.Event()

        def release_later() -> None:
            time.sleep(0.3)
            other.execute("COMMIT")
            released.set()

        thread = threading.Thread(target=release_later)
        started = time.monotonic()
        thread.start()
        admit(store, "e-1")  # blocks on the other writer, then commits
        waited = time.monotonic() - started
        thread.join()
        assert released.is_set() and waited >= 0.25, f"the write did not wait for the lock ({waited:.3f}s)"
        assert store.execution_ids() == ["e-1"]
    finally:
        other.close()
        store.close()


# --- migrations and re-opening -------------------------------------------------------------------


def test_migrations_are_recorded_with_their_checksum(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT version, name, checksum, applied_at FROM schema_migrations ORDER BY version"
        ).fetchall()
    finally:
        conn.close()
    expected = [(n, name, hashlib.sha256(sql.encode()).hexdigest()) for n, name, sql in sqlite_store.MIGRATIONS]
    assert [row[:3] for row in rows] == expected
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1)), "versions are numbered from 1 without gaps"
    assert all(isinstance(row[3], str) and row[3].startswith("20") for row in rows), rows


def test_reopening_keeps_the_data_and_migrates_nothing_again(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock)
    admit(store, "e-1")
    _, credential = claim(store, "w-1")
    before = view(store, "e-1")
    store.close()
    conn = sqlite3.connect(path)
    migrations = conn.execute("SELECT * FROM schema_migrations").fetchall()
    conn.close()

    again = SQLiteStore(path, clock=clock)
    try:
        assert view(again, "e-1") == before
        assert again.execution_ids() == ["e-1"]
        # The reopened store honours the lease taken before it closed.
        decided(again.finalize(finalize_request(again, "e-1", credential, ExecutionState.SUCCEEDED)))
    finally:
        again.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT * FROM schema_migrations").fetchall() == migrations
    finally:
        conn.close()


def test_opening_a_store_that_is_already_ours_does_not_import_sqlite_utils(tmp_path: Path) -> None:
    # sqlite-utils inspects a file that is not yet ours; importing it (and its
    # plugin scan) at every worker start-up cost about 60 ms, for nothing.
    path = tmp_path / "store.db"
    SQLiteStore(path).close()
    program = (
        "import sys; from pathlib import Path; from fencekeeper.adapters.sqlite_store import SQLiteStore; "
        "SQLiteStore(Path(sys.argv[1])).close(); print('sqlite_utils' in sys.modules)"
    )
    opened = subprocess.run([sys.executable, "-c", program, str(path)], capture_output=True, text=True, check=True)
    assert opened.stdout.strip() == "False"
    # A file of something else is still inspected, and named for what it holds.
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(StoreError, match=r"something else \(tables \['invoices'\]\)"):
        SQLiteStore(other)


def test_a_version_2_store_migrates_forward_keeping_every_row_and_its_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Migration 3 rebuilds the transitions table (without AUTOINCREMENT) and
    # replaces an index; migration 4 moves new transitions onto the revision
    # rows they make.  A store written at version 2 (by the code of that
    # version: every transition in its own table) must come through with the
    # same history, in the same order, and go on appending after it.
    path = tmp_path / "store.db"
    with monkeypatch.context() as patched:
        patched.setattr(sqlite_store, "MIGRATIONS", sqlite_store.MIGRATIONS[:2])
        patched.setattr(sqlite_store._SQLiteBackend, "revisions_carry_transitions", False)
        patched.setattr(sqlite_store._SQLiteBackend, "writes_outbox", False)
        populated_store(path)
        old = SQLiteStore(path)
        before = snapshot(old)
        old.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (2,)
        old_rows = conn.execute("SELECT * FROM transitions ORDER BY seq").fetchall()
        assert conn.execute("SELECT count(*) FROM sqlite_sequence WHERE name = 'transitions'").fetchone() == (1,)
    finally:
        conn.close()
    assert len(old_rows) > 12, "the version 2 store should hold some history"

    store = SQLiteStore(path, clock=ManualClock())
    try:
        assert snapshot(store) == before, "migrating changed what a client sees"
        execution_id, credential = claim(store, "w-3")
        decided(store.finalize(finalize_request(store, execution_id, credential, ExecutionState.FAILED)))
        assert store.execution_ids(ExecutionState.FAILED) == [execution_id]
    finally:
        store.close()
    conn = sqlite3.connect(path)
    try:
        assert [row[0] for row in conn.execute("SELECT version FROM schema_migrations ORDER BY version")] == [
            n for n, _, _ in sqlite_store.MIGRATIONS
        ]
        rows = conn.execute("SELECT * FROM transitions ORDER BY seq").fetchall()
        assert rows == old_rows, "every version 2 transition is kept, with its seq"
        carried = conn.execute(
            "SELECT execution_id, event, to_state FROM execution_transitions WHERE rank = 0 ORDER BY revision"
        ).fetchall()
        assert carried == [(execution_id, "claim", "running"), (execution_id, "finalize_failed", "failed")]
        assert conn.execute("SELECT count(*) FROM sqlite_sequence WHERE name = 'transitions'").fetchone() == (0,)
        assert "AUTOINCREMENT" not in conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'transitions'"
        ).fetchone()[0].upper()
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("DELETE FROM transitions")
    finally:
        conn.close()


def test_listing_by_state_uses_an_index_for_every_state_but_succeeded(tmp_path: Path) -> None:
    # Eligible and running executions are listed through workflow_dispatch's
    # partial indexes, the others through objects_execution_state; only
    # succeeded, where nearly every execution ends, is read by a scan.
    store = SQLiteStore(tmp_path / "store.db")
    try:
        conn = store_connection(store)
        for state in set(ExecutionState) - {ExecutionState.SUCCEEDED}:
            sql = _listing_sql(store, state)
            plan = " ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))
            assert "USING INDEX" in plan or "USING COVERING INDEX" in plan, (state, plan)
            assert "SCAN o" not in plan and "SCAN objects" not in plan, (state, plan)
    finally:
        store.close()


def _listing_sql(store: SQLiteStore, state: ExecutionState) -> str:
    statements: list[str] = []
    conn = store_connection(store)
    conn.set_trace_callback(statements.append)
    try:
        store.execution_ids(state)
    finally:
        conn.set_trace_callback(None)
    return next(s for s in statements if s.startswith("SELECT"))


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("table", ["workflow_dispatch", "object_revisions", "sqlite_schema"])
def test_a_corrupt_database_is_refused_untouched(tmp_path: Path, table: str) -> None:
    path = populated_store(tmp_path / "store.db")
    conn = sqlite3.connect(path)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        # The table's fullest leaf page.
        page = conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY unused, pageno LIMIT 1", (table,)
        ).fetchone()[0]
    finally:
        conn.close()
    start = (page - 1) * page_size
    with path.open("r+b") as f:
        # The leaf page's header (after the 100-byte file header on page 1) is
        # followed by its cell pointer array; overwrite the start of a cell in
        # the middle of the page, wherever the layout put it.
        header = start + (100 if page == 1 else 0)
        f.seek(header + 3)
        cells = int.from_bytes(f.read(2), "big")
        f.seek(header + 8 + 2 * (cells // 2))
        offset = start + int.from_bytes(f.read(2), "big")
        f.seek(offset)
        original = f.read(128)
        assert original.count(0) < 64, f"the cell at {offset - start} of page {page} is not in use"
        f.seek(offset)
        f.write(bytes(b ^ 0xA5 for b in original))
    refused_open(path, "not_a_database")


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 200)
    refused_open(path, "not_a_database")


def test_a_sqlite_database_of_something_else_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "inventory.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE parts (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO parts (name) VALUES ('bolt')")
    conn.commit()
    conn.close()
    error = refused_open(path, "not_a_database")
    assert "parts" in error.message


def test_a_read_only_store_is_refused_untouched(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = populated_store(directory / "store.db")
    with read_only(path, directory):
        refused_open(path, "read_only")


def test_a_read_only_store_file_in_a_writable_directory_is_refused_untouched(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    with read_only(path):
        refused_open(path, "read_only")


def test_a_new_store_in_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "store.db"
    with read_only(directory):
        with pytest.raises(StoreError) as caught:
            SQLiteStore(path).close()
        assert caught.value.code == "read_only", caught.value.message
        assert str(path) in caught.value.message
        assert os.listdir(directory) == []


def test_a_newer_schema_version_is_refused_untouched(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO schema_migrations (version, name, checksum, applied_at) "
        "VALUES (99, 'from_the_future', 'x', '2030-01-01T00:00:00Z')"
    )
    conn.commit()
    conn.close()
    error = refused_open(path, "schema_too_new")
    assert "99" in error.message


def test_an_altered_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE workflow_dispatch ADD COLUMN priority INTEGER")
    conn.commit()
    conn.close()
    refused_open(path, "schema_altered")


def test_an_edited_migration_record_is_refused_untouched(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE schema_migrations")
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL, "
        "applied_at TEXT NOT NULL)"
    )
    conn.execute("INSERT INTO schema_migrations VALUES (1, 'initial', 'not-the-checksum', '2026-01-01T00:00:00Z')")
    conn.commit()
    conn.close()
    refused_open(path, "schema_altered")


def test_a_directory_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "a-directory"
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    refused_open(path, "not_a_database")
    assert os.listdir(path) == ["keep.txt"]


def test_a_path_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "store.db"
    with pytest.raises(StoreError) as caught:
        SQLiteStore(path).close()
    assert caught.value.code == "store_unavailable", caught.value.message
    assert str(path) in caught.value.message
    assert not path.parent.exists(), "the store must not create directories"
    assert os.listdir(tmp_path) == []


# --- what the schema itself refuses -----------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE object_revisions SET state = 'succeeded'",
        "DELETE FROM object_revisions",
        "UPDATE transitions SET reason = 'rewritten'",
        "DELETE FROM transitions",
        "UPDATE commands SET body = '{}'",
        "DELETE FROM commands",
    ],
)
def test_append_only_tables_refuse_update_and_delete(tmp_path: Path, statement: str) -> None:
    path = populated_store(tmp_path / "store.db")
    table = statement.split()[2] if statement.startswith("DELETE") else statement.split()[1]
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(f"SELECT * FROM {table}").fetchall()
        assert rows, f"{table} must have rows for the refusal to mean anything"
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(statement)
        assert conn.execute(f"SELECT * FROM {table}").fetchall() == rows
    finally:
        conn.close()


@pytest.mark.parametrize(
    "statement",
    [
        # claimed without its lease fields
        "UPDATE workflow_dispatch SET dispatch_state = 'claimed' WHERE dispatch_state = 'eligible'",
        "UPDATE workflow_dispatch SET lease_token = NULL WHERE dispatch_state = 'claimed'",
        "UPDATE workflow_dispatch SET lease_expires_at = NULL WHERE dispatch_state = 'claimed'",
        # a lease on a row that is not claimed
        "UPDATE workflow_dispatch SET leased_by = 'w-9' WHERE dispatch_state = 'eligible'",
        # a state the tables do not have; a step count past the limit
        "UPDATE workflow_dispatch SET dispatch_state = 'running' WHERE dispatch_state = 'eligible'",
        f"UPDATE workflow_dispatch SET step_count = {p.STEP_LIMIT + 1} WHERE dispatch_state = 'eligible'",
    ],
)
def test_the_dispatch_check_refuses_incoherent_rows(tmp_path: Path, statement: str) -> None:
    path = populated_store(tmp_path / "store.db")
    store = SQLiteStore(path)
    try:
        claim(store, "w-3", lease=timedelta(hours=1))
        conn = store_connection(store)
        before = conn.execute("SELECT * FROM workflow_dispatch ORDER BY 1").fetchall()
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute(statement)
        assert conn.execute("SELECT * FROM workflow_dispatch ORDER BY 1").fetchall() == before
    finally:
        store.close()


def test_integrity_is_clean_after_a_run(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock)
    for i in range(30):
        admit(store, f"e-{i:02d}", f"b-{i % 3}")
    targets = [*p.FINALIZE_TARGETS[1:], ExecutionState.SUCCEEDED]
    for i in range(20):
        execution_id, credential = claim(store, f"w-{i % 4}")
        decided(store.record_step(execution_id, step_request(store, execution_id, credential)))
        if i % 5 == 4:
            continue  # left running, to expire
        request = finalize_request(store, execution_id, credential, targets[i % len(targets)])
        decided(store.finalize(request))
        clock.advance(timedelta(seconds=1))
    clock.advance(LEASE)
    for n, execution_id in enumerate(store.expired()):
        decided(store.recover(recovery_request(store, execution_id, p.RecoveryKind.QUARANTINE_EXPIRED, f"q-{n}")))
        decided(store.recover(recovery_request(store, execution_id, p.RecoveryKind.FAIL, f"f-{n}")))
    decided(store.cancel(p.CancelRequest("e-29", "b-2", 1, GRANTED)))
    store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        # 30 admissions, 20 claims, 20 steps, 16 finalizations, 4 quarantines, 4 resumptions, 1 cancel:
        # each made a revision, whose row carries it.
        assert conn.execute("SELECT count(*) FROM execution_transitions").fetchone()[0] == 95
        assert conn.execute("SELECT count(*) FROM object_revisions WHERE reason IS NOT NULL").fetchone()[0] == 95
        assert conn.execute("SELECT count(*) FROM transitions").fetchone()[0] == 0
    finally:
        conn.close()


# --- opened only to read ----------------------------------------------------------------------
#
# Commands that only read (list, inspect) and the deployment check open the
# file read-only: a read-only file, directory or mount is read, and nothing
# is created beside it, migrated or changed.


def _read_everything(path: Path) -> list[str]:
    store = SQLiteStore(path, read_only=True)
    try:
        ids = store.execution_ids()
        for execution_id in ids:
            assert store.read(execution_id) is not None
        return ids
    finally:
        store.close()


def test_a_read_only_store_can_be_read_and_is_left_untouched(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = populated_store(directory / "store.db")
    with read_only(path, directory):
        before = file_state(path)
        assert len(_read_everything(path)) == 12
        assert file_state(path) == before


def test_a_read_only_file_in_a_writable_directory_can_be_read_without_files_beside_it(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    with read_only(path):
        before = file_state(path)
        assert len(_read_everything(path)) == 12
        assert file_state(path) == before, "reading left -wal/-shm beside a read-only file"


def test_a_writable_store_opened_to_read_leaves_nothing_beside_it(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    before = file_state(path)
    assert len(_read_everything(path)) == 12
    assert file_state(path) == before


def test_reading_sees_commits_still_in_the_wal(tmp_path: Path) -> None:
    path = populated_store(tmp_path / "store.db")
    writer = SQLiteStore(path)
    try:
        admit(writer, "e-late")
        assert Path(f"{path}-wal").exists()
        assert "e-late" in _read_everything(path)
    finally:
        writer.close()


def test_opening_to_read_does_not_migrate_an_older_file(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    newest = max(number for number, _, _ in sqlite_store.MIGRATIONS)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "checksum TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        for number, name, sql in sqlite_store.MIGRATIONS[:-1]:
            for statement in sqlite_store._statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, ?, '2026-01-01T00:00:00Z')",
                (number, name, sqlite_store._checksum(sql)),
            )
    before = file_state(path)
    with pytest.raises(StoreError) as caught:
        SQLiteStore(path, read_only=True)
    assert caught.value.code == "schema_outdated", caught.value.message
    assert f"version {newest - 1}" in caught.value.message and "fencekeeper migrate" in caught.value.message
    assert file_state(path) == before
    missing = tmp_path / "absent.db"
    with pytest.raises(StoreError) as absent:
        SQLiteStore(missing, read_only=True)
    assert absent.value.code == "store_unavailable" and not missing.exists()


def test_the_check_of_a_read_only_store_reports_it_and_creates_nothing(tmp_path: Path) -> None:
    from fencekeeper.adapters import connect  # noqa: PLC0415 - the deployment check under test

    for directory_too in (False, True):
        directory = tmp_path / f"ro-{directory_too}"
        directory.mkdir()
        path = populated_store(directory / "store.db")
        with read_only(path, *([directory] if directory_too else [])):
            before = file_state(path)
            report = connect.check(str(path))
            assert file_state(path) == before, "the check created files beside a read-only store"
        assert report.schema_version == max(number for number, _, _ in sqlite_store.MIGRATIONS)
        assert report.executions, report
        assert report.problems and all("read-only" in problem for problem in report.problems), report.problems
        assert not any("not a usable" in problem for problem in report.problems)


def test_a_read_only_mount_is_reported_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a read-only mount does to SQLite (no -shm can be created, the file
    # cannot be written) is made by read_only(); that the file system says
    # "read-only" is what statvfs answers, stubbed here for this directory only.
    from fencekeeper.adapters import connect  # noqa: PLC0415 - the deployment check under test

    directory = tmp_path / "mnt"
    directory.mkdir()
    path = populated_store(directory / "store.db")
    real = os.statvfs

    def statvfs(target: str | os.PathLike[str]) -> object:
        found = real(target)
        if Path(target).resolve().is_relative_to(directory.resolve()):
            return _StatvfsResult(found, f_flag=found.f_flag | os.ST_RDONLY)
        return found

    monkeypatch.setattr(os, "statvfs", statvfs)
    with read_only(path, directory):
        before = file_state(path)
        report = connect.check(str(path))
        assert [p for p in report.problems if "read-only file system" in p], report.problems
        assert not any("not a usable" in p for p in report.problems)
        error = refused_open(path, "read_only")
        assert "read-only file system" in error.message
        assert len(_read_everything(path)) == 12
        assert file_state(path) == before


class _StatvfsResult:
    """Stands in for os.statvfs_result, with some fields changed."""

    def __init__(self, result: os.statvfs_result, **changes: int) -> None:
        self.__dict__.update({name: getattr(result, name) for name in dir(result) if name.startswith("f_")})
        self.__dict__.update(changes)
