"""Quarantine sweeps on SQLite: many at once are safe and idempotent, and a paused writer is named.

What these tests prove:

- two sweeps started together (threads, each with its own store on the
  same file, as two machines would) quarantine every expired execution
  exactly once, each interrupted attempt once, and report the executions
  the other sweep took first as moved on, never as a problem and never as
  a crash;
- two ``fencekeeper reconcile --quarantine`` processes started together
  both exit 0;
- a writer that holds the file's write lock (a paused process) makes
  another store's write fail, after the busy timeout, with one
  ``StoreError('store_locked')`` that says the database is locked by
  another writer, which process has it open, and what to do; nothing is
  written, and the same write succeeds once the writer lets go.
"""

from __future__ import annotations

import sqlite3
import subprocess
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock, StoreError, TransactionalStore
from fencekeeper.adapters.testing.suite import GRANTED, admit, claim, decided, snapshot
from fencekeeper.kernel import attempts
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.machines import ExecutionState
from tests.cli.runner import FENCEKEEPER, environment

BUSINESS = "b-1"
LEASE = timedelta(seconds=30)


def expired_with_attempts(store: TransactionalStore, clock: ManualClock, count: int) -> list[str]:
    """``count`` executions claimed, each with a running attempt, whose leases have all expired."""
    ids = [f"e-{n:03d}" for n in range(count)]
    for execution_id in ids:
        admit(store, execution_id, BUSINESS)
    for execution_id in ids:
        claimed, credential = claim(store, f"w-{execution_id}", lease=LEASE)
        view = store.read(claimed)
        assert view is not None
        attempt = attempts.start(
            view.execution,
            node_id="start",
            node_revision=1,
            node_kind="local_command",
            worker_id=credential.worker_id,
            fence=credential.fence,
            inputs={},
            now=clock.now(),
        )
        decided(store.append_evidence(claimed, credential, [attempt]))
    clock.advance(LEASE)
    return ids


def sweep_together(stores: list[TransactionalStore]) -> list[service.Sweep]:
    """One sweep per store, started at the same moment; every sweep's result (a crash fails the test)."""
    policy = examples.grants(BUSINESS, "user:ops-1", "user:ops-2")
    start = threading.Barrier(len(stores))
    results: list[service.Sweep | BaseException | None] = [None] * len(stores)

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = service.quarantine_expired(
                stores[index], policy, business_id=BUSINESS, principal_id=f"user:ops-{index + 1}"
            )
        except BaseException as exc:  # reported below, with the sweep it came from
            results[index] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a sweep did not end"
    sweeps = []
    for index, result in enumerate(results):
        assert isinstance(result, service.Sweep), f"sweep {index + 1} failed: {result!r}"
        sweeps.append(result)
    return sweeps


def assert_each_quarantined_once(
    store: TransactionalStore, ids: list[str], sweeps: list[service.Sweep]
) -> None:
    for sweep in sweeps:
        assert sweep.problems == {} and sweep.locked == {}, sweep
    taken = [x for sweep in sweeps for x in sweep.quarantined]
    assert sorted(taken) == ids, "every expired execution is quarantined by exactly one sweep"
    for sweep in sweeps:
        # What a sweep listed and did not take, the other took first: moved on, or the identical command
        # replayed.  A sweep lists what is expired when it starts, so what the other had already
        # quarantined by then is not listed at all: under load the other's first commits can come before
        # this sweep's listing, and those executions are in neither set (a missing one is no problem).
        others = set(ids) - set(sweep.quarantined)
        seen = set(sweep.moved_on) | {x for x, o in sweep.outcomes.items() if isinstance(o, p.Unchanged)}
        assert seen <= others, sweep
    for execution_id in ids:
        view = store.read(execution_id)
        assert view is not None
        assert view.execution.state == ExecutionState.RECONCILIATION_REQUIRED
        assert len(view.recoveries) == 1
        attempt = next(e for e in view.evidence if e.kind == attempts.STEP_ATTEMPT)
        assert attempt.state == "reconciliation_required" and attempt.revision == 2


def test_two_sweeps_at_once_quarantine_every_execution_once(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "store.db"
    stores: list[TransactionalStore] = [SQLiteStore(path, clock=clock), SQLiteStore(path, clock=clock)]
    try:
        ids = expired_with_attempts(stores[0], clock, 30)
        sweeps = sweep_together(stores)
        assert_each_quarantined_once(stores[0], ids, sweeps)
        # A third sweep finds nothing left to do.
        again = service.quarantine_expired(
            stores[1], examples.grants(BUSINESS, "user:ops"), business_id=BUSINESS, principal_id="user:ops"
        )
        assert again == service.Sweep()
    finally:
        for store in stores:
            store.close()


def test_two_reconcile_quarantine_commands_at_once_both_exit_0(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock)
    # The command line reads the system clock: leases that ended a year ago have expired for it.
    clock.advance(-timedelta(days=365))
    try:
        ids = expired_with_attempts(store, clock, 40)
    finally:
        store.close()
    command = [str(FENCEKEEPER), "reconcile", "--db", str(path), "--business", BUSINESS, "--quarantine"]
    processes = [
        subprocess.Popen(
            [*command, "--as", f"user:ops-{n}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            env=environment(),
        )
        for n in (1, 2)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, f"exit {process.returncode}\n{out}\n{err}"
        assert "Traceback" not in err and "error" not in err, err
    lines = [line for out, _ in outputs for line in out.splitlines()]
    assert sorted(line.split(":")[0] for line in lines if "quarantined, running ->" in line) == ids
    store = SQLiteStore(path)
    try:
        assert store.execution_ids(ExecutionState.RECONCILIATION_REQUIRED) == ids
    finally:
        store.close()


def _holding_the_write_lock(path: Path) -> Callable[[], None]:
    """Another connection takes the file's write lock and keeps it (a paused writer); returns its release."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")

    def release() -> None:
        conn.execute("ROLLBACK")
        conn.close()

    return release


def test_a_paused_writer_gives_one_clear_error_that_names_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    clock = ManualClock()
    store = SQLiteStore(path, clock=clock, busy_timeout=0.2)
    try:
        admit(store, "e-1", BUSINESS)
        before = snapshot(store)
        release = _holding_the_write_lock(path)
        try:
            with pytest.raises(StoreError) as caught:
                store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED))
        finally:
            release()
        error = caught.value
        assert error.code == "store_locked"
        message = error.message
        assert "\n" not in message
        assert str(path) in message and "locked by another writer" in message and "0.2 s" in message
        # The other connection is this very process, which the search leaves out: the message says how to look.
        assert "fuser" in message
        assert "resume it" in message and "retry" in message
        assert snapshot(store) == before, "a write refused for the lock changed the store"
        decided(store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED)))
    finally:
        store.close()


def test_a_paused_writer_in_another_process_is_named_by_its_pid(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(path, busy_timeout=0.2)
    admit(store, "e-1", BUSINESS)
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import sqlite3, sys, time\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        encoding="utf-8",
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreError) as caught:
            store.cancel(p.CancelRequest("e-1", BUSINESS, 1, GRANTED))
        assert caught.value.code == "store_locked"
        assert f"pid {holder.pid} (" in caught.value.message and "python3" in caught.value.message
    finally:
        holder.kill()
        holder.wait()
        store.close()
