"""``fencekeeper worker --processes N``: worker processes forked from one command (adapters/prefork.py).

What must hold, as for one process: every execution is finished once, by
workers whose ids are numbered across the processes; a stop lets every
process finish the visit it is in and hand back its lease, however the
signal arrives (to the parent alone, or to the whole process group as a
terminal's Ctrl-C sends it); a child that dies stops its siblings and fails
the command; no child outlives its parent by more than a visit; and bad
input is one error line with nothing written.  The handler sleeps in every
Command, so that each process has work in flight when the signal comes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fencekeeper.adapters import examples, service
from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import TransactionalStore
from fencekeeper.adapters.testing.roundtrips import TWO_NODE
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition
from tests.cli.runner import FENCEKEEPER, assert_one_error_line, catches, environment, fencekeeper, ok, snapshot

BUSINESS = "default"
PRINCIPAL = "user:operator"

PAUSING_HANDLER = '''\
"""Answers every Command after a pause, and marks that one started."""

import os
import pathlib
import time

from fencekeeper.kernel import interpreter as i


class Pausing:
    def execute(self, command):
        pathlib.Path(f"started-{os.getpid()}").write_text(command.command_id)
        # With BARRIER=N, no Command goes on until N processes have each started one (20 s at most,
        # inside the lease): on a loaded machine a process forked late would otherwise find the
        # queue already drained by its siblings.
        deadline = time.monotonic() + 20
        while len(list(pathlib.Path().glob("started-*"))) < int(os.environ.get("BARRIER", "0")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        time.sleep(float(os.environ.get("PAUSE", "0.05")))
        return i.CommandResult(i.CommandStatus.SUCCEEDED)

    def reconcile(self, command):
        return i.CommandResult(i.CommandStatus.SUCCEEDED)


def make():
    return Pausing()
'''


def _admit(store: TransactionalStore, count: int) -> list[str]:
    policy = examples.grants(BUSINESS, PRINCIPAL)
    service.register(store, parse_definition(TWO_NODE), BUSINESS, PRINCIPAL, policy)
    ids = []
    for n in range(count):
        outcome = service.run(
            store,
            policy,
            business_id=BUSINESS,
            principal_id=PRINCIPAL,
            definition_id="two-node",
            input={"order_id": f"o-{n}"},
        )
        assert isinstance(outcome, p.Decision) and outcome.execution is not None, outcome
        ids.append(outcome.execution.execution_id)
    return ids


def _queue(tmp_path: Path, count: int) -> list[str]:
    (tmp_path / "pausing_handler.py").write_text(PAUSING_HANDLER, encoding="utf-8")
    store = SQLiteStore(tmp_path / "q.db")
    try:
        return _admit(store, count)
    finally:
        store.close()


def _start(
    tmp_path: Path, *args: str, pause: str = "0.05", session: bool = False, barrier: int = 0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(FENCEKEEPER), "worker", "--db", "q.db", "--handler", "pausing_handler:make", "--json", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(PAUSE=pause, BARRIER=str(barrier)),
        start_new_session=session,
    )


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
        except OSError:
            continue
        # pid (comm) state ppid ...: the command name may hold spaces, so read after its closing parenthesis.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def _wait_for(condition, what: str, worker: subprocess.Popen[str], seconds: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert worker.poll() is None, worker.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _running_children(worker: subprocess.Popen[str], count: int) -> list[int]:
    """The worker's ``count`` children once each has its own signal handlers (its workers are running)."""
    _wait_for(lambda: len(_children(worker.pid)) == count, f"{count} worker processes never started", worker)
    children = _children(worker.pid)
    _wait_for(lambda: all(catches(c, signal.SIGTERM) for c in children), "the workers never installed handlers", worker)
    return children


def _history_actors(db: Path, ids: list[str]) -> set[str]:
    store = SQLiteStore(db)
    try:
        actors = set()
        for execution_id in ids:
            view = store.read(execution_id)
            assert view is not None
            actors |= {r.actor for r in view.history if r.event is not None and r.event.value == "claim"}
        return actors
    finally:
        store.close()


def test_processes_share_the_queue_and_finish_each_execution_once(tmp_path: Path) -> None:
    ids = _queue(tmp_path, 24)
    worker = _start(tmp_path, "--until-idle", "--processes", "3", "--concurrency", "2", "--id", "w", barrier=3)
    stdout, stderr = worker.communicate(timeout=120)
    assert worker.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["workers"] == [f"w-{n}" for n in range(1, 7)]
    assert summary["finished"] == {"succeeded": 24}
    assert summary["claimed"] == 24 and summary["steps"] == 48
    assert summary["errors"] == [] and summary["refused"] == []
    # Three processes did the work: each wrote its own marker, and claims came from workers of more than one.
    assert len(list(tmp_path.glob("started-*"))) == 3
    actors = _history_actors(tmp_path / "q.db", ids)
    assert actors <= {f"w-{n}" for n in range(1, 7)}
    processes = {(int(a.removeprefix("w-")) - 1) // 2 for a in actors}
    assert len(processes) > 1, actors


@pytest.mark.parametrize("to_group", [False, True], ids=["to-the-parent", "to-the-process-group"])
def test_a_stop_lets_every_process_finish_its_visit_and_hand_back_its_lease(tmp_path: Path, to_group: bool) -> None:
    _queue(tmp_path, 8)
    worker = _start(tmp_path, "--processes", "2", "--poll", "0.1", "--id", "w", pause="1.0", session=to_group)
    try:
        children = _running_children(worker, 2)
        _wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2, "each process never had a Command", worker)
        if to_group:
            # As a terminal's Ctrl-C: every process of the group gets it, and the parent relays it too;
            # the relayed stop must not count as a second signal (which would quit at once).
            os.killpg(worker.pid, signal.SIGINT)
        else:
            worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["stopped_by"] == ("SIGINT" if to_group else "SIGTERM")
    assert summary["errors"] == []
    # Each process finished the visit it was in: the Command in flight was recorded, and what was
    # still leased was handed back, so nothing waits for a lease to expire.
    assert summary["steps"] >= 2
    assert len(summary["released"]) >= 1
    # The command waited for its worker processes: none is left, not even as a zombie.
    assert [c for c in children if Path(f"/proc/{c}").exists()] == []
    store = SQLiteStore(tmp_path / "q.db")
    try:
        assert store.expired() == []
        views = [store.read(x) for x in store.execution_ids()]
        assert [v.execution.execution_id for v in views if v is not None and v.dispatch.lease_token is not None] == []
    finally:
        store.close()
    # The rest are there for the next worker, which finishes them all.
    rest = ok("worker", "--db", "q.db", "--until-idle", "--handler", "pausing_handler:make", "--json", cwd=tmp_path)
    after = json.loads(rest.stdout)
    assert after["finished"] == {"succeeded": 8 - summary["finished"].get("succeeded", 0)}


def test_a_worker_process_that_dies_stops_its_siblings_and_fails_the_command(tmp_path: Path) -> None:
    ok("migrate", "--db", "q.db", cwd=tmp_path)
    (tmp_path / "pausing_handler.py").write_text(PAUSING_HANDLER, encoding="utf-8")
    worker = _start(tmp_path, "--processes", "3", "--poll", "0.1", "--id", "w")
    try:
        children = _running_children(worker, 3)
        os.kill(children[1], signal.SIGKILL)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 1, stderr
    summary = json.loads(stdout)
    # The two that lived reported and stopped; the dead one is named in the error.
    assert summary["workers"] == ["w-1", "w-3"]
    assert summary["errors"] == [f"worker process 2 (pid {children[1]}): ended by SIGKILL"]
    assert stderr.strip() == f"fencekeeper: error: worker process 2 (pid {children[1]}): ended by SIGKILL"


def test_worker_processes_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    ok("migrate", "--db", "q.db", cwd=tmp_path)
    (tmp_path / "pausing_handler.py").write_text(PAUSING_HANDLER, encoding="utf-8")
    worker = _start(tmp_path, "--processes", "2", "--poll", "0.1", "--id", "w")
    try:
        children = _running_children(worker, 2)
        worker.kill()
        worker.communicate(timeout=30)
        # Orphans: the lifeline's end of file stops them as a first signal would, within a poll.
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children):
            assert time.monotonic() < deadline, "a worker process outlived its parent"
            time.sleep(0.05)
    finally:
        for c in children if "children" in locals() else []:
            if Path(f"/proc/{c}").exists():
                os.kill(c, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--processes", "0"], "--processes: must be between 1 and 64, got 0"),
        (["--processes", "two"], "--processes: not a whole number: 'two'"),
        (["--processes", "65"], "--processes: must be between 1 and 64, got 65"),
        (["--processes", "2", "--metrics-port", "9464"], "--metrics-port: serves the workers of one process"),
        (["--processes", "2", "--id", "x" * 127, "--concurrency", "5"], "--id: "),
    ],
)
def test_bad_processes_input_is_one_error_and_writes_nothing(tmp_path: Path, args: list[str], flag: str) -> None:
    ok("migrate", "--db", "q.db", cwd=tmp_path)
    before = snapshot(tmp_path)
    line = assert_one_error_line(fencekeeper("worker", "--db", "q.db", "--until-idle", *args, cwd=tmp_path), 2)
    assert line.startswith(f"fencekeeper: error: {flag}"), line
    assert snapshot(tmp_path) == before


def test_processes_drain_a_postgresql_queue(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    from fencekeeper.adapters.postgres_store import PostgresStore  # noqa: PLC0415 - only where a server answers

    (tmp_path / "pausing_handler.py").write_text(PAUSING_HANDLER, encoding="utf-8")
    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        ids = _admit(store, 30)
    finally:
        store.close()
    result = ok(
        "worker",
        "--db",
        pg_dsn,
        "--schema",
        pg_schema,
        "--until-idle",
        "--processes",
        "3",
        "--handler",
        "pausing_handler:make",
        "--id",
        "pg",
        "--json",
        cwd=tmp_path,
    )
    summary = json.loads(result.stdout)
    assert summary["workers"] == ["pg-1", "pg-2", "pg-3"]
    assert summary["finished"] == {"succeeded": 30}
    store = PostgresStore(pg_dsn, schema=pg_schema, pool_size=1)
    try:
        views = [store.read(x) for x in ids]
        assert all(v is not None and v.execution.state.value == "succeeded" for v in views)
        # Exactly one claim per execution: no execution was driven by two processes.
        claims = [
            r for v in views if v is not None for r in v.history if r.event is not None and r.event.value == "claim"
        ]
        assert len(claims) == 30
    finally:
        store.close()


def test_op_worker_processes_run_each_operation_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fencekeeper.adapters import cli  # noqa: PLC0415 - submissions in this process, the worker in its own

    db = str(tmp_path / "ops.db")
    submitted = set()
    for n in range(12):
        transfer = json.dumps({"from": "acc-1", "to": "acc-2", "amount": 10})
        assert cli.main(["op", "submit", "transfer", "--db", db, "--key", f"t-{n}", "--input", transfer, "--json"]) == 0
        submitted.add(json.loads(capsys.readouterr().out)["operation_id"])
    result = ok(
        "op", "worker", "--db", db, "--until-idle", "--processes", "3", "--concurrency", "2", "--json", cwd=tmp_path
    )
    summary = json.loads(result.stdout)
    assert summary["stopped_by"] == "idle" and summary["errors"] == []
    assert sorted(r["operation_id"] for r in summary["reports"]) == sorted(submitted)
    assert {(r["attempt"], r["outcome"]) for r in summary["reports"]} == {(1, "succeeded")}, summary["reports"]
    # Each transfer was applied once, in the application's own table, one after another: the balances
    # the twelve saw after their own debit are 12 distinct steps of 10 from 10,000.
    balances = set()
    for operation_id in submitted:
        assert cli.main(["op", "status", operation_id, "--db", db, "--json"]) == 0
        balances.add(json.loads(capsys.readouterr().out)["result"]["from_balance"])
    assert balances == {10_000 - 10 * k for k in range(1, 13)}
    before = snapshot(tmp_path)
    line = assert_one_error_line(fencekeeper("op", "worker", "--db", db, "--processes", "0", cwd=tmp_path), 2)
    assert line == "fencekeeper: error: --processes: must be between 1 and 64, got 0"
    assert snapshot(tmp_path) == before


def test_a_failure_every_process_meets_is_said_once_as_one_process_says_it(tmp_path: Path) -> None:
    ok("migrate", "--db", "q.db", cwd=tmp_path)
    (tmp_path / "not_a_handler.py").write_text("def make():\n    return object()\n", encoding="utf-8")
    one = fencekeeper("worker", "--db", "q.db", "--until-idle", "--handler", "not_a_handler:make", cwd=tmp_path)
    many = fencekeeper(
        "worker", "--db", "q.db", "--until-idle", "--handler", "not_a_handler:make", "--processes", "3", cwd=tmp_path
    )
    line = assert_one_error_line(one, 2)
    assert "returned object, which has no execute and reconcile" in line
    assert assert_one_error_line(many, 2) == line


def test_a_handler_of_coroutines_is_one_error_before_anything_is_claimed(tmp_path: Path) -> None:
    # Its answers would be coroutines, which a worker takes for a handler that says nothing: every
    # execution would go to reconciliation, unannounced.
    ids = _queue(tmp_path, 2)
    (tmp_path / "async_handler.py").write_text(
        "class Handler:\n"
        "    async def execute(self, command):\n        pass\n"
        "    def reconcile(self, command):\n        pass\n"
        "def make():\n    return Handler()\n",
        encoding="utf-8",
    )
    before = snapshot(tmp_path)
    for more in ((), ("--processes", "2")):
        result = fencekeeper("worker", "--db", "q.db", "--until-idle", "--handler", "async_handler:make", *more, cwd=tmp_path)
        line = assert_one_error_line(result, 2)
        assert "whose execute is a coroutine function (async def)" in line, line
    assert snapshot(tmp_path) == before
    assert _history_actors(tmp_path / "q.db", ids) == set()


def test_op_worker_processes_on_a_db_path_that_does_not_exist_is_one_error_before_any_fork(tmp_path: Path) -> None:
    # A mistyped --db is refused once, by the parent, not created and worked empty by every process.
    result = fencekeeper("op", "worker", "--db", "typo.db", "--until-idle", "--processes", "3", cwd=tmp_path)
    line = assert_one_error_line(result, 2)
    assert line.startswith("fencekeeper: error: --db: no database at typo.db")
    assert result.stdout == ""
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "two-processes"])
def test_op_worker_says_on_a_first_signal_that_it_stops_after_the_current_attempt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], processes: int
) -> None:
    # As `fencekeeper worker` says it, in the operations' word: one process said nothing on SIGINT, and
    # --processes spoke of a "visit", which operations do not have.
    from fencekeeper.adapters import cli  # noqa: PLC0415 - the store made in this process, the worker in its own

    db = str(tmp_path / "ops.db")
    transfer = json.dumps({"from": "acc-1", "to": "acc-2", "amount": 10})
    assert cli.main(["op", "submit", "transfer", "--db", db, "--key", "t-1", "--input", transfer, "--json"]) == 0
    operation_id = json.loads(capsys.readouterr().out)["operation_id"]

    def succeeded() -> bool:
        assert cli.main(["op", "status", operation_id, "--db", db, "--json"]) == 0
        return bool(json.loads(capsys.readouterr().out)["state"] == "succeeded")

    worker = subprocess.Popen(
        [str(FENCEKEEPER), "op", "worker", "--db", "ops.db", "--poll", "0.1", "--processes", str(processes), "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(),
    )
    try:
        if processes == 1:
            # SIGTERM, not SIGINT: Python catches SIGINT from its start; the worker installs both at once.
            _wait_for(lambda: catches(worker.pid, signal.SIGTERM), "the worker never installed handlers", worker)
        else:
            _running_children(worker, processes)
        _wait_for(succeeded, "the operation never ran", worker)
        worker.send_signal(signal.SIGINT)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, stderr
    said = (
        "stopping after the current attempt; send the signal again to quit at once"
        if processes == 1
        else "SIGINT: every worker process stops after its current attempt; send the signal again to quit at once"
    )
    assert stderr.splitlines() == [said]
    summary = json.loads(stdout)
    assert summary["stopped_by"] == "signal" and summary.get("errors", []) == []
    assert [(r["attempt"], r["outcome"]) for r in summary["reports"]] == [(1, "succeeded")]


SLOW_TRANSFER_ACTIONS = '''\
"""The teaching examples' actions, with a transfer that pauses inside its transaction (a marker says it started)."""

import pathlib
import time

from fencekeeper.adapters.operations import examples
from fencekeeper.adapters.operations.service import DurableAction, DurableActionRegistry
from fencekeeper.kernel.operations import EffectClass


def slow_transfer(context, value):
    pathlib.Path("started").write_text("1")
    time.sleep(60)
    return examples.transfer(context, value)


def registry():
    action = DurableAction("transfer", 1, EffectClass.ATOMIC, slow_transfer, normalize=examples.normalize_transfer)
    return DurableActionRegistry((action,))


resolvers = examples.resolvers
prepare = examples.prepare
'''


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_op_worker_quits_at_once_on_a_second_signal_as_fencekeeper_worker_does(tmp_path: Path, number: int) -> None:
    # It raised KeyboardInterrupt, which unwound through the store's close: that waited for the attempt in
    # flight (here a minute inside its transaction) and let it commit, where `fencekeeper worker` exits 130 at once.
    (tmp_path / "slow_actions.py").write_text(SLOW_TRANSFER_ACTIONS, encoding="utf-8")
    env = environment(PYTHONPATH=str(tmp_path))
    options = ["--db", "ops.db", "--actions", "slow_actions"]
    transfer = json.dumps({"from": "acc-1", "to": "acc-2", "amount": 10})
    submitted = fencekeeper("op", "submit", "transfer", *options, "--key", "t-1", "--input", transfer, "--json", cwd=tmp_path, env=env)
    assert submitted.returncode == 0, submitted.stderr
    operation_id = json.loads(submitted.stdout)["operation_id"]
    worker = subprocess.Popen(
        [str(FENCEKEEPER), "op", "worker", *options, "--poll", "0.1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=env,
    )
    try:
        _wait_for((tmp_path / "started").exists, "the attempt never started", worker)
        worker.send_signal(number)
        time.sleep(0.3)
        worker.send_signal(number)
        started = time.monotonic()
        _, stderr = worker.communicate(timeout=45)
        took = time.monotonic() - started
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 130, stderr
    assert took < 10, f"the second signal took {took:.1f} s to end the command"
    assert stderr.splitlines() == ["stopping after the current attempt; send the signal again to quit at once"]
    status = fencekeeper("op", "status", operation_id, *options, "--json", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] != "succeeded"
