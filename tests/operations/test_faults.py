"""Process faults against the SQLite and PostgreSQL operation stores.

- SIGKILL a worker inside an atomic action's transaction: nothing of it is
  visible, and the next claim (after the lease) replaces it automatically
  and applies the transfer once.
- SIGSTOP a worker after its claim, past its lease; a replacement finishes
  the operation; SIGCONT: the stopped worker's commit is refused
  (``stale_fence``) and the application's table is unchanged.
- SIGSTOP a worker inside an atomic action's transaction (PostgreSQL): the
  server ends its session after ``idle_in_transaction_session_timeout``,
  which releases the row; meanwhile ``op cancel`` and ``op decide`` wait at
  most ``lock_timeout`` for it and fail ``row_locked``; a replacement
  finishes the operation, the transfer applied once; SIGCONT: the stalled
  worker's commit is refused and nothing of it is visible.
- Eight processes submitting the same identity at the same moment get one
  operation.

Each test is bounded (a few seconds); the soak versions belong to bench.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.base import TransactionalOperationStore
from fencekeeper.adapters.operations.connect import open_operation_store
from fencekeeper.adapters.operations.worker import DurableOperationWorker
from fencekeeper.adapters.postgres_store import migrate
from fencekeeper.adapters.testing.operations_suite import accounts, transfers
from fencekeeper.kernel.machines import OperationState

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "ops.db")
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    schema = f"fk_opsfault_{uuid.uuid4().hex[:10]}"
    migrate(dsn, schema)
    yield f"{dsn}?schema={schema}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.operations.fault_child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == word, f"expected {word}, got {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"


def opened(url: str) -> TransactionalOperationStore:
    store = open_operation_store(url)
    examples.prepare(store)
    return store


def submit_transfer(store: TransactionalOperationStore) -> str:
    from fencekeeper.adapters.operations.service import DurableOperationService, PrincipalReference  # noqa: PLC0415

    service = DurableOperationService(store, examples.registry(), examples.resolvers())
    return service.submit(
        tenant="default", principal=PrincipalReference("users", 1, "alice"), action="transfer",
        input={"from": "acc-1", "to": "acc-2", "amount": 100}, client_key=f"k-{uuid.uuid4().hex[:6]}",
    ).operation_id


def replace_after_lease(store: TransactionalOperationStore, name: str) -> str:
    """Run a fresh worker until the expired lease lets it claim (database time decides when)."""
    worker = DurableOperationWorker(store, examples.registry(), examples.resolvers(), tenant="default",
                                    worker_id=name, lease=timedelta(seconds=30))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        report = worker.run_once()
        if report is not None:
            return report.outcome
        time.sleep(0.2)
    raise AssertionError("the expired lease was never replaced")


def within(seconds: float, call: Callable[..., int], *args: Any) -> int:
    """``call(*args)``'s answer, which must come within ``seconds`` (the call is left blocked otherwise)."""
    answers: list[int] = []
    runner = threading.Thread(target=lambda: answers.append(call(*args)), daemon=True)
    runner.start()
    runner.join(seconds)
    assert answers, f"still waiting after {seconds} s"
    return answers[0]


def test_sigkill_inside_an_atomic_transaction_leaves_nothing(url: str) -> None:
    store = opened(url)
    try:
        op_id = submit_transfer(store)
        proc = child("kill-inside", url)
        try:
            wait_for(proc, "INSIDE")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert transfers(store) == set()
        assert accounts(store) == {"acc-1": 10_000, "acc-2": 0}
        view = store.view(op_id)
        assert view is not None and view.operation.state is OperationState.RUNNING
        assert [a.state.value for a in view.attempts] == ["running"]
        assert replace_after_lease(store, "rescuer") == "succeeded"
        view = store.view(op_id)
        assert view is not None
        assert [(a.worker_id, a.state.value) for a in view.attempts] == [("doomed", "abandoned"), ("rescuer", "succeeded")]
        assert transfers(store) == {op_id}
        assert accounts(store) == {"acc-1": 9_900, "acc-2": 100}
    finally:
        store.close()


@contextlib.contextmanager
def never_left_stopped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``proc`` for the block; after it, whatever the block raised, not left stopped or running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()


def resumed(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """A stopped worker let go on: what it printed until it ended."""
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=20)
    return out, err


def refused_after_replacement(
    store: Any, op_id: str, stopped: str, applied: dict[str, int], *, out: str, err: str,
    said: tuple[str, ...] = ("REPORT stale_fence",),
) -> Any:
    """The stopped worker, resumed, was refused (or wrote nothing); the replacement's one transfer is all the accounts show."""
    assert tuple(out.strip().splitlines()[-len(said):]) == said, (out, err)
    assert accounts(store) == applied == {"acc-1": 9_900, "acc-2": 100}
    assert transfers(store) == {op_id}
    view = store.view(op_id)
    assert view is not None
    assert [(a.worker_id, a.state.value) for a in view.attempts] == [
        (stopped, "abandoned"), ("replacement", "succeeded"),
    ]  # fmt: skip
    return view


def test_sigstop_past_the_lease_then_sigcont_is_refused(url: str) -> None:
    store = opened(url)
    try:
        op_id = submit_transfer(store)
        with never_left_stopped(child("stop-before", url)) as proc:
            wait_for(proc, "CLAIMED")
            os.kill(proc.pid, signal.SIGSTOP)
            assert replace_after_lease(store, "replacement") == "succeeded"
            applied = accounts(store)
            out, err = resumed(proc)
        refused_after_replacement(store, op_id, "sleeper", applied, out=out, err=err)
    finally:
        store.close()


def test_eight_processes_submitting_one_identity_get_one_operation(url: str) -> None:
    store = opened(url)
    store.close()
    start = time.time() + 2
    procs = [child("submit", url, str(start)) for _ in range(8)]
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        op_id, created = out.split()
        answers.append((op_id, created == "True"))
    assert len({op_id for op_id, _ in answers}) == 1
    assert sum(created for _, created in answers) == 1
    store = open_operation_store(url)
    try:
        rows = getattr(store, "application_execute")("SELECT count(*) FROM operations")  # noqa: B009
        assert rows == [(1,)]
    finally:
        store.close()


def test_sigstop_inside_an_atomic_transaction_loses_the_session_and_is_replaced(
    pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fencekeeper.adapters import cli  # noqa: PLC0415
    from fencekeeper.adapters.operations import postgres  # noqa: PLC0415

    url = f"{pg_dsn}?schema={pg_schema}"
    store = opened(url)
    try:
        op_id = submit_transfer(store)
        # Its sessions end after 2 s idle inside a transaction.
        with never_left_stopped(child("stop-inside", url, "2")) as proc:
            wait_for(proc, "INSIDE")
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            # The row is locked by the stopped transaction: cancel and decide give up after lock_timeout,
            # each with one error line, exit 1, instead of waiting for the holder.
            monkeypatch.setattr(postgres, "LOCK_TIMEOUT", 0.2)
            for command in (["cancel", op_id], ["decide", op_id, "--approve", "--as", "users:v1:bob"]):
                code = within(5, cli.main, ["op", *command, "--db", url])
                err = capsys.readouterr().err.splitlines()
                assert code == 1 and len(err) == 1 and "[row_locked]" in err[0], (command, err)
                assert "lock_timeout" in err[0]
            assert time.monotonic() - stopped < 2, "the lock waits were not bounded by lock_timeout"
            assert replace_after_lease(store, "replacement") == "succeeded"
            assert time.monotonic() - stopped < 8
            applied = accounts(store)
            out, err = resumed(proc)
        # Its session ended under it, so its completion's answer is lost (nothing of it committed): the next
        # pass reads the operation, finds the replacement's success, and writes nothing.
        view = refused_after_replacement(
            store, op_id, "stalled", applied, out=out, err=err, said=("LOST store_unavailable", "REPORT None")
        )
        assert view.operation.state is OperationState.SUCCEEDED and view.operation.fence == 2
    finally:
        store.close()
