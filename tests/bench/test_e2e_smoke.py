"""bench/e2e.py's fencekeeper side, run small on SQLite, so that the bench cannot rot unnoticed.

Nothing here times anything: the checks are that every admitted execution
is drained by real ``fencekeeper worker --until-idle`` processes, that the
bench's own completeness check refuses a drain that did not succeed, and
that its protocol-trace counter reads libpq's trace format.  Procrastinate
and DBOS are not needed (they come from the ``bench`` extra).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench import e2e

REJECTING_HANDLER = '''\
from fencekeeper.kernel.interpreter import CommandResult, CommandStatus, Rejection


class Rejecting:
    def execute(self, command):
        return CommandResult(CommandStatus.REJECTED, Rejection.REJECTED, "no")

    def reconcile(self, command):
        return CommandResult(CommandStatus.UNKNOWN)


def make():
    return Rejecting()
'''


@pytest.mark.parametrize(("workload", "workers"), [("one-node", 1), ("two-node", 2), ("five-node", 1), ("mixed", 2)])
def test_worker_processes_drain_every_admitted_execution(tmp_path: Path, workload: str, workers: int) -> None:
    drain = e2e.fencekeeper_drain("sqlite", workload, 4, workers, server=None, directory=tmp_path)
    assert drain.key == ("fencekeeper", workload, "sqlite", workers)
    assert drain.executions == 4
    assert drain.seconds > 0 and drain.admit_seconds > 0
    assert drain.rate == pytest.approx(4 / drain.seconds)
    # The worker got the bench's no-I/O handler, not the example one: no effect log was written.
    assert not list(tmp_path.glob("*.effects"))


def test_a_mix_admits_each_of_its_definitions_in_the_same_order_every_run() -> None:
    draw = e2e.random.Random(e2e.MIX_SEED)
    drawn = [e2e.MIXES["mixed"][draw.randrange(2)] for _ in range(40)]
    assert set(drawn) == {"one-node", "two-node"}
    again = e2e.random.Random(e2e.MIX_SEED)
    assert drawn == [e2e.MIXES["mixed"][again.randrange(2)] for _ in range(40)]
    plan, _ = e2e.parse_args(["--workloads", "mixed,one-node"])
    assert plan.workloads == ("mixed", "one-node")


def test_one_process_of_worker_threads_drains_every_admitted_execution(tmp_path: Path) -> None:
    drain = e2e.fencekeeper_drain("sqlite", "two-node", 6, 3, server=None, directory=tmp_path, one_process=True)
    assert drain.key == (e2e.ONE_PROCESS, "two-node", "sqlite", 3)
    assert e2e.worker_command(e2e.FencekeeperTarget("x.db", None), 1, e2e.NOOP_HANDLER, concurrency=3)[-4:-2] == [
        "--concurrency",
        "3",
    ]


def test_the_bench_compiles_the_installed_package_as_a_wheel_install_would(tmp_path: Path) -> None:
    package = e2e.compile_bytecode()
    cached = list((package / "adapters" / "__pycache__").glob(f"cli.{sys.implementation.cache_tag}.pyc"))
    assert cached and cached[0].stat().st_mtime >= (package / "adapters" / "cli.py").stat().st_mtime


def test_a_drain_whose_executions_did_not_succeed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rejecting_handler.py").write_text(REJECTING_HANDLER, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(e2e.BenchError, match="0 of 3"):
        e2e.fencekeeper_drain(
            "sqlite", "two-node", 3, 1, server=None, directory=tmp_path, handler="rejecting_handler:make"
        )


def test_the_drain_probe_counts_the_executions_that_succeeded_and_no_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mix's one-node executions succeed without a handler; its two-node ones reach the rejecting handler and fail.
    (tmp_path / "rejecting_handler.py").write_text(REJECTING_HANDLER, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    target = e2e._fencekeeper_target("sqlite", None, tmp_path)
    e2e.admit(target, "mixed", 8)
    probe = e2e._fencekeeper_succeeded(target, None)
    assert probe() == 0
    e2e._run_all([e2e.worker_command(target, 1, "rejecting_handler:make")], e2e._worker_env(tmp_path))
    with sqlite3.connect(target.url) as conn:
        states = dict(
            conn.execute(
                "SELECT state, count(*) FROM objects WHERE object_type = 'WorkflowExecution' GROUP BY state"
            ).fetchall()
        )
    assert set(states) == {"succeeded", "failed"}
    assert probe() == states["succeeded"]


def test_a_run_reports_medians_and_leaves_unmeasured_targets_unjudged(tmp_path: Path) -> None:
    plan, check = e2e.parse_args(
        ["--systems", "fencekeeper", "--stores", "sqlite", "--workloads", "two-node", "--rounds", "1", "--executions", "3"]
    )
    assert not check and plan.sqlite_workers == (1,)
    lines: list[str] = []
    result = e2e.run(plan, out=lines.append)
    assert [d.key for _, d in result["drains"]] == [("fencekeeper", "two-node", "sqlite", 1)]
    assert list(result["starts"]) == ["fencekeeper start-up, empty queue, sqlite"]
    assert e2e.report(result, out=lines.append)
    rows = [line.split() for line in lines]
    assert any(row[:4] == ["fencekeeper", "two-node", "sqlite", "1"] for row in rows)
    assert sum("not measured in this run" in line for line in lines) == len(e2e.TARGETS)


def test_the_trace_counter_reads_libpq_trace_lines(tmp_path: Path) -> None:
    # One explicit transaction of two extended-protocol statements, then one autocommit query,
    # then a Parse alone (a statement prepared outside a transaction: neither a counted round trip,
    # since it happens once per connection, nor a transaction).
    trace = "\n".join(
        [
            'F\t10\tQuery\t "BEGIN"',
            'B\t10\tCommandComplete\t "BEGIN"',
            "B\t5\tReadyForQuery\t T",
            'F\t20\tBind\t "" "s1" 0',
            'F\t9\tExecute\t "" 0',
            "F\t4\tSync",
            'B\t13\tCommandComplete\t "SELECT 1"',
            "B\t5\tReadyForQuery\t T",
            'F\t20\tBind\t "" "s2" 0',
            'F\t9\tExecute\t "" 0',
            "F\t4\tSync",
            'B\t13\tCommandComplete\t "UPDATE 1"',
            "B\t5\tReadyForQuery\t T",
            'F\t11\tQuery\t "COMMIT"',
            'B\t11\tCommandComplete\t "COMMIT"',
            "B\t5\tReadyForQuery\t I",
            'F\t30\tQuery\t "SELECT procrastinate_fetch_job_v2()"',
            'B\t13\tCommandComplete\t "SELECT 1"',
            "B\t5\tReadyForQuery\t I",
            'F\t40\tParse\t "s3" "SELECT 1" 0',
            "F\t4\tSync",
            "B\t4\tParseComplete",
            "B\t5\tReadyForQuery\t I",
            # Pipeline mode: BEGIN and a statement behind one Sync, then COMMIT behind another, sent
            # in one flight before the client reads anything: one round trip, one transaction.
            'F\t20\tBind\t "" "" 0',
            'F\t9\tExecute\t "" 0',
            'F\t20\tBind\t "" "s3" 0',
            'F\t9\tExecute\t "" 0',
            "F\t4\tSync",
            'F\t20\tBind\t "" "" 0',
            'F\t9\tExecute\t "" 0',
            "F\t4\tSync",
            'B\t10\tCommandComplete\t "BEGIN"',
            'B\t13\tCommandComplete\t "SELECT 1"',
            "B\t5\tReadyForQuery\t T",
            'B\t11\tCommandComplete\t "COMMIT"',
            "B\t5\tReadyForQuery\t I",
            # fencekeeper's due-timer lookup, prepared, then run twice in autocommit: counted apart,
            # neither a round trip, a statement nor a transaction of any execution.
            f'F\t90\tParse\t "fencekeeper_9" "{e2e.TIMER_LOOKUP} JOIN objects o" 0',
            "F\t4\tSync",
            "B\t4\tParseComplete",
            "B\t5\tReadyForQuery\t I",
            *[
                line
                for _ in range(2)
                for line in (
                    'F\t30\tBind\t "" "fencekeeper_9" 0',
                    'F\t9\tExecute\t "" 0',
                    "F\t4\tSync",
                    'B\t13\tCommandComplete\t "SELECT 0"',
                    "B\t5\tReadyForQuery\t I",
                )
            ],
        ]
    )
    (tmp_path / "trace-1-0.txt").write_text(trace + "\n", encoding="utf-8")
    (tmp_path / "other.txt").write_text('F\t10\tQuery\t "BEGIN"\n', encoding="utf-8")
    count = e2e.count_trace(tmp_path)
    assert count == e2e.TraceCount(round_trips=6, statements=8, transactions=3, timer_lookups=2)


def test_the_trace_counter_counts_a_commit_with_the_next_transaction_begun_behind_it(tmp_path: Path) -> None:
    # A worker's writes, COMMIT, and its next claim's BEGIN and locking read in one segment (the claim
    # read ahead): the session reports itself in a transaction, never idle, yet one transaction
    # committed.  Then that claim's writes and COMMIT.  A ROLLBACK (a read ahead that found nothing)
    # commits nothing.
    trace = "\n".join(
        [
            'F\t20\tBind\t "" "w1" 0',
            'F\t9\tExecute\t "" 0',
            'F\t20\tBind\t "" "" 0',
            'F\t9\tExecute\t "" 0',
            'F\t20\tBind\t "" "" 0',
            'F\t9\tExecute\t "" 0',
            'F\t20\tBind\t "" "c1" 0',
            'F\t9\tExecute\t "" 0',
            "F\t4\tSync",
            'B\t13\tCommandComplete\t "SELECT 3"',
            'B\t11\tCommandComplete\t "COMMIT"',
            'B\t10\tCommandComplete\t "BEGIN"',
            'B\t13\tCommandComplete\t "SELECT 1"',
            "B\t5\tReadyForQuery\t T",
            'F\t20\tBind\t "" "w1" 0',
            'F\t9\tExecute\t "" 0',
            'F\t20\tBind\t "" "" 0',
            'F\t9\tExecute\t "" 0',
            "F\t4\tSync",
            'B\t13\tCommandComplete\t "SELECT 3"',
            'B\t11\tCommandComplete\t "COMMIT"',
            "B\t5\tReadyForQuery\t I",
        ]
    )
    (tmp_path / "trace-1-0.txt").write_text(trace + "\n", encoding="utf-8")
    assert e2e.count_trace(tmp_path) == e2e.TraceCount(round_trips=2, statements=6, transactions=2)
    rolled_back = "\n".join(
        ['F\t13\tQuery\t "ROLLBACK"', 'B\t13\tCommandComplete\t "ROLLBACK"', "B\t5\tReadyForQuery\t I"]
    )
    (tmp_path / "trace-1-0.txt").write_text(rolled_back + "\n", encoding="utf-8")
    assert e2e.count_trace(tmp_path) == e2e.TraceCount(round_trips=1, statements=1, transactions=0)


def test_the_traced_entry_runs_the_real_command_line(tmp_path: Path) -> None:
    # In a process of its own: the entry replaces psycopg's connect for the rest of its process.
    db = tmp_path / "empty.db"
    traces = tmp_path / "traces"
    traces.mkdir()
    command = [sys.executable, "-m", "bench.e2e", "--traced", str(traces), "fencekeeper", "migrate", "--db", str(db)]
    done = subprocess.run(command, cwd=e2e.ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert db.exists()
    # SQLite opens no psycopg connection: nothing was traced, so nothing is counted.
    assert e2e.count_trace(traces) == e2e.TraceCount(0, 0, 0)
