"""The worker as a user runs it, beside Procrastinate and DBOS on the same server in the same run.

Run: ``make bench-e2e`` (installs the optional ``bench`` extra first), or
``python -m bench.e2e [--quick] [--rounds N] [--executions N] ...``.  The
PostgreSQL server is ``FENCEKEEPER_PG_DSN`` (default
postgresql://postgres@127.0.0.1:5432/test); the bench creates a database of
its own there, ``fk_bench_e2e_<pid>``, gives every measurement a fresh schema
in it, and drops the database when it ends.

Rules of this module:

- **What a user runs.** fencekeeper is measured through the
  ``fencekeeper worker --until-idle`` processes a user starts (1, 4 and 8 of
  them, each one worker thread; also one such process of 8 threads,
  ``fencekeeper-1p``, and one command of 8 processes forked after one
  start-up, ``--processes 8``, ``fencekeeper-fork``), Procrastinate through its own
  ``procrastinate worker --one-shot`` process (concurrency 1 and 8), DBOS
  through a process that launches DBOS and runs its queue (worker concurrency
  1 and 8).  A drain is timed from the moment the first process is started
  until the queue is empty: fencekeeper's and Procrastinate's workers exit
  when they find nothing to do; DBOS has no such mode, so the bench polls its
  system database every 20 ms and stops it when every workflow succeeded.
  Process start-up is inside every drain, as it is for a user; the bench
  prints each system's start-up on an empty queue beside it.  While a drain
  runs, the bench also polls each system's own record of finished work every
  20 ms, and reports a *steady* rate from the first completion it sees to the
  last: start-up left out, for every system alike.  Each poll counts rows of
  one table that holds one row per execution, job or workflow
  (:data:`FENCEKEEPER_PROBE`, ``procrastinate_jobs``, ``workflow_status``),
  so that the bench's own reads take about as much of the server from each
  system.
- **The same work.** fencekeeper's Commands go to a handler that does no I/O
  (``bench/e2e_handler.py``, plugged in with ``--handler
  bench.e2e_handler:make``; ``--handler example`` uses the example handler and
  its durable effect log instead).  Procrastinate's job and DBOS's steps do
  nothing either.  Workloads: ``one-node`` (start at ``end``), ``two-node``
  (``local_command``, then ``end``: two nodes visited) and ``five-node`` (a
  condition, two ``local_command`` nodes and ``end``: four visited, a fifth,
  the failure end, never reached), against Procrastinate's no-op job and DBOS
  workflows of one and three no-op steps; and, asked for, ``mixed`` (one-node
  and two-node executions drawn at random, :data:`MIXES`), which no target
  judges.  Procrastinate's job is measured
  twice: as a coroutine, which its worker runs on its event loop with no
  thread per job (the reference of every target), and as a plain
  function, which it runs in a thread per job (the reference of runs 1 to
  21 in bench/README.md, printed beside it).  DBOS's workflows are plain
  functions: written as coroutines they drained no faster.
- **Admission is timed apart,** before the drain, one at a time:
  ``service.run`` (the service API, which reads the pinned definition, checks
  the input and the policy, then admits: one transaction, of one round trip after a store's first admission
  of a definition), Procrastinate's
  ``defer`` one job at a time, DBOS's ``Queue.enqueue`` one workflow at a time.
- **Every measurement starts clean.**  A fresh schema (a fresh file on
  SQLite) and a ``CHECKPOINT`` before admission (where the role may), then
  ``ANALYZE`` of the bench's database after admission (for every system
  alike: issue 16's Procrastinate figures were taken after ANALYZE) and a
  ``CHECKPOINT`` again, so that neither the admission nor the drain pays
  for what the drain before it left dirty (a checkpoint that starts during
  a loop of single-row commits makes each first write to a page log the
  whole page).
- **A drain that did not finish everything is not a measurement.**  The bench
  checks that every admitted execution, job or workflow succeeded and stops
  with the reason otherwise.
- **Rounds alternate the order of the systems** (fencekeeper first in odd
  rounds, last in even ones), so a burst of load from elsewhere does not
  always fall on the same side.  Figures are medians over the rounds; each
  target's ratio is the median of the rounds' own ratios, each ratio taken
  between two drains of the same round.
- **Round trips are counted, not timed.**  The server this project runs on
  does not load ``pg_stat_statements`` (``SHOW shared_preload_libraries`` is
  empty), so a worker is run under libpq's own protocol trace (``PQtrace``,
  enabled on every connection it opens; ``--traced`` below): a round trip is a
  message the client then waits on (``Query`` or ``Sync``), a statement an
  ``Execute`` or a ``Query``.  Start-up and the last, empty claim are taken out
  by subtracting a run over an empty queue from a run over N executions.
  Procrastinate's worker is counted the same way.

Nothing here asserts a time; ``--check`` only turns missed targets into exit
status 1.  Procrastinate and DBOS are imported only inside the functions (and
the two helper modules, ``bench/e2e_procrastinate.py`` and
``bench/e2e_dbos.py``, run as their own processes) that use them, so the
fencekeeper side runs without the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import attrs

from fencekeeper.adapters import connect, examples, service
from fencekeeper.kernel import protocol as p
from fencekeeper.kernel.definition import parse_definition

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BASE_DSN = os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BUSINESS = "default"
PRINCIPAL = "user:operator"
NOOP_HANDLER = "bench.e2e_handler:make"
ONE_PROCESS = "fencekeeper-1p"
"""The system name of one ``fencekeeper worker --concurrency N`` process: N worker threads, one start-up."""
FORKED = "fencekeeper-fork"
"""The system name of one ``fencekeeper worker --processes N`` command: N processes forked after one start-up."""


def forked_system(processes: int, threads: int) -> str:
    """The system name of ``--processes P --concurrency T``: FORKED for one thread each, else ``fencekeeper-PxT``."""
    return FORKED if threads == 1 else f"fencekeeper-{processes}x{threads}"
DRAIN_TIMEOUT = 600.0

_END = """
[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"

[[nodes]]
id = "failed"
kind = "end"
revision = 1
outcome = "failed"
error_code = "bench_failed"
"""

_COMMAND = """
[[nodes]]
id = "{id}"
kind = "local_command"
revision = 1
operation = "{operation}"
targets = [{{ id = {{ from = "input.order_id" }}, revision = 1 }}]
payload = {{ carrier = "standard" }}
next = "{next}"
on_failure = "failed"
"""

WORKFLOWS: dict[str, str] = {
    "one-node": """
id = "bench-one-node"
revision = 1
start = "done"
inputs = ["order_id", "amount"]

[[nodes]]
id = "done"
kind = "end"
revision = 1
outcome = "succeeded"
""",
    "two-node": """
id = "bench-two-node"
revision = 1
start = "ship"
inputs = ["order_id", "amount"]
"""
    + _COMMAND.format(id="ship", operation="order.ship", next="done")
    + _END,
    "five-node": """
id = "bench-five-node"
revision = 1
start = "check"
inputs = ["order_id", "amount"]

[[nodes]]
id = "check"
kind = "condition"
revision = 1
expression = "input.amount >= 0"
bindings = ["input.amount"]
true_next = "ship"
false_next = "failed"
"""
    + _COMMAND.format(id="ship", operation="order.ship", next="notify")
    + _COMMAND.format(id="notify", operation="order.notify", next="done")
    + _END,
}
"""Each workload's definition.  The end ``failed`` is there because a Command node must name where a
deterministic rejection goes; no execution reaches it."""

MIXES: dict[str, tuple[str, ...]] = {"mixed": ("one-node", "two-node")}
"""Workloads of several definitions, each execution's drawn at random (a fixed seed, so every run admits the
same sequence): what a deployment running more than one kind of work drains.  A worker that composes claims
guesses from its last claim whether the next one will finalize in its own transaction; here the guess is
often wrong, and what that costs is measured.  No target: there is no peer figure of the same mix."""

MIX_SEED = 16

DBOS_STEPS = {"one-step": 1, "three-step": 3}


class BenchError(Exception):
    """A measurement that could not be taken as described: the message says which and why."""


@attrs.frozen
class Drain:
    """One timed drain: ``executions`` admitted one by one in ``admit_seconds``, then drained in ``seconds``."""

    system: str
    workload: str
    store: str
    workers: int
    executions: int
    admit_seconds: float
    timing: Timing

    @property
    def seconds(self) -> float:
        """From the first process's start to the queue empty."""
        return self.timing.seconds

    @property
    def steady_rate(self) -> float:
        """Completed per second between the first completion seen and the last: start-up left out."""
        t = self.timing
        return t.window_done / t.window_seconds if t.window_seconds > 0 else 0.0

    @property
    def key(self) -> tuple[str, str, str, int]:
        """What identifies the same measurement across rounds."""
        return (self.system, self.workload, self.store, self.workers)

    @property
    def rate(self) -> float:
        """Executions (jobs, workflows) completed per second, start-up included."""
        return self.executions / self.seconds

    @property
    def admit_rate(self) -> float:
        """Admissions (defers, enqueues) per second, one transaction each."""
        return self.executions / self.admit_seconds if self.admit_seconds > 0 else 0.0


@attrs.frozen
class Counted:
    """Per execution, from a libpq protocol trace: messages that wait on the server, statements, transactions."""

    system: str
    workload: str
    executions: int
    round_trips: float
    statements: float
    transactions: float
    timer_lookups: int = 0
    """Due-timer lookups in the larger traced run (none of them in ``round_trips``)."""


def _counts(n: int) -> tuple[int, int]:
    """The two runs a count takes: a warm base of about a fifth of ``n``, and ``n``."""
    return max(1, n // 5), n


def _per_execution(system: str, what: str, runs: tuple[int, int], counts: list[TraceCount]) -> Counted:
    """What one more execution costs: the difference between the two runs, over the difference in executions.

    Both runs start the program, do whatever it does once (a definition's
    first load, preparing its statements) and end with an empty claim, so
    all of that cancels out, leaving what each execution adds.
    """
    d = counts[1] - counts[0]
    n = runs[1] - runs[0]
    return Counted(system, what, n, d.round_trips / n, d.statements / n, d.transactions / n, counts[1].timer_lookups)


# --- the PostgreSQL server ------------------------------------------------------------------


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


class Server:
    """The bench's own database on the PostgreSQL server, created on entry and dropped on exit."""

    def __init__(self, base_url: str) -> None:
        import psycopg  # noqa: PLC0415 - only when PostgreSQL is measured

        self._psycopg = psycopg
        self.base_url = base_url
        self.database = f"fk_bench_e2e_{os.getpid()}"
        self.url = _with_database(base_url, self.database)
        self._names = itertools.count(1)
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.database}")
            conn.execute(f"CREATE DATABASE {self.database}")
        self.conn = psycopg.connect(self.url, autocommit=True)
        self.preload = str(self.scalar("SHOW shared_preload_libraries"))
        self.version = str(self.scalar("SHOW server_version"))

    def scalar(self, sql: str) -> Any:
        """The first column of the first row ``sql`` returns."""
        row = self.conn.execute(sql).fetchone()
        return None if row is None else row[0]

    def fresh_schema(self, prefix: str) -> str:
        """A schema name no measurement has used (not created: each system creates its own)."""
        return f"{prefix}_{next(self._names)}"

    def drop_schema(self, schema: str) -> None:
        """Drop one measurement's schema, with everything in it."""
        self.conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

    def settle(self) -> None:
        """ANALYZE the bench's database, then CHECKPOINT if the role may: every drain starts from the same state."""
        self.conn.execute("ANALYZE")
        self.checkpoint()

    def checkpoint(self) -> None:
        """CHECKPOINT if the role may: an admission then starts with nothing of the drain before it to write out."""
        with contextlib.suppress(self._psycopg.errors.InsufficientPrivilege):
            self.conn.execute("CHECKPOINT")

    def close(self) -> None:
        """Drop the bench's database (whatever a failed measurement left in it goes with it)."""
        self.conn.close()
        with self._psycopg.connect(self.base_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")


# --- fencekeeper ----------------------------------------------------------------------------


@attrs.frozen
class FencekeeperTarget:
    """Where a fencekeeper measurement's store is: the ``--db`` (and ``--schema``) a worker is given."""

    url: str
    schema: str | None

    def worker_args(self) -> list[str]:
        """The store options of ``fencekeeper worker``."""
        return ["--db", self.url, *(["--schema", self.schema] if self.schema else [])]


def _fencekeeper_target(store: str, server: Server | None, directory: Path) -> FencekeeperTarget:
    if store == "pg":
        assert server is not None
        return FencekeeperTarget(server.url, server.fresh_schema("fk"))
    return FencekeeperTarget(str(directory / f"fk-{uuid.uuid4().hex[:8]}.db"), None)


def admit(target: FencekeeperTarget, workload: str, executions: int) -> float:
    """Migrate, register the workload's definitions and admit ``executions`` through ``service.run``; seconds taken.

    A mix (:data:`MIXES`) draws each execution's definition with :data:`MIX_SEED`, before the clock starts.
    """
    connect.migrate(target.url, schema=target.schema)
    names = MIXES.get(workload, (workload,))
    definitions = [parse_definition(WORKFLOWS[name], f"bench:{name}") for name in names]
    draw = random.Random(MIX_SEED)
    drawn = [definitions[draw.randrange(len(definitions))].definition_id for _ in range(executions)]
    policy = examples.grants(BUSINESS, PRINCIPAL)
    store = connect.open_store(target.url, schema=target.schema, pool_size=1)
    try:
        for definition in definitions:
            service.register(store, definition, BUSINESS, PRINCIPAL, policy)
        started = time.perf_counter()
        for n in range(executions):
            outcome = service.run(
                store,
                policy,
                business_id=BUSINESS,
                principal_id=PRINCIPAL,
                definition_id=drawn[n],
                input={"order_id": f"o-{n}", "amount": n},
                execution_id=f"e-{n}",
            )
            if not isinstance(outcome, p.Decision):
                raise BenchError(f"fencekeeper: admission {n} refused: {outcome}")
        return time.perf_counter() - started
    finally:
        store.close()


def worker_command(
    target: FencekeeperTarget, number: int, handler: str, concurrency: int = 1, processes: int = 1
) -> list[str]:
    """One ``fencekeeper worker --until-idle`` command, as a user starts it (``concurrency`` threads, ``processes``)."""
    return [
        str(BIN / "fencekeeper"),
        "worker",
        *target.worker_args(),
        "--until-idle",
        "--json",
        "--id",
        f"bench{number}",
        *(["--concurrency", str(concurrency)] if concurrency > 1 else []),
        *(["--processes", str(processes)] if processes > 1 else []),
        *(["--handler", handler] if handler != "example" else []),
    ]


def _worker_env(directory: Path) -> dict[str, str]:
    # The example handler keeps its effect log for a DSN under XDG_STATE_HOME: the bench's own directory.
    return dict(os.environ, XDG_STATE_HOME=str(directory / "state"))


@attrs.frozen
class Timing:
    """A drain's clock: from the first start to the last exit (or the queue empty), and its busy window.

    The window runs from the first poll that saw a finished execution to the
    first that saw them all, and ``window_done`` executions finished inside
    it: a rate over it leaves process start-up out, for every system alike.
    """

    seconds: float
    window_seconds: float = 0.0
    window_done: int = 0


def _poll_window(count: Callable[[], int], total: int, started: float, running: Callable[[], bool]) -> Timing:
    """Poll ``count`` every 20 ms while ``running``, until it reaches ``total``; the drain's Timing."""
    first: tuple[float, int] | None = None
    while True:
        done = count()
        now = time.perf_counter()
        if done and first is None:
            first = (now, done)
        if done >= total:
            break
        if not running():
            raise BenchError(f"the drain stopped with {done} of {total} finished")
        if now - started > DRAIN_TIMEOUT:
            raise BenchError(f"{done} of {total} finished after {DRAIN_TIMEOUT:.0f} s")
        time.sleep(0.02)
    assert first is not None
    return Timing(now - started, now - first[0], total - first[1])


def _run_all(
    commands: Sequence[Sequence[str]],
    env: dict[str, str],
    *,
    count: Callable[[], int] | None = None,
    total: int = 0,
) -> tuple[Timing, list[str]]:
    """Start every command at once and wait for all; their Timing (polling ``count`` if given) and stdouts.

    Output goes to files, not pipes, so that a chatty worker never blocks on a
    full pipe while the bench is polling instead of reading.
    """
    with tempfile.TemporaryDirectory(prefix="fk-bench-out-") as scratch:
        files = [
            (open(Path(scratch) / f"{n}.out", "w+"), open(Path(scratch) / f"{n}.err", "w+"))  # noqa: SIM115
            for n in range(len(commands))
        ]
        started = time.perf_counter()
        procs = [
            subprocess.Popen(c, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
            for c, (out, err) in zip(commands, files, strict=True)
        ]
        try:
            timing = None
            if count is not None:
                timing = _poll_window(count, total, started, lambda: any(proc.poll() is None for proc in procs))
            for proc in procs:
                proc.wait(timeout=DRAIN_TIMEOUT)
            if timing is None:
                timing = Timing(time.perf_counter() - started)
            outputs = []
            for proc, (out, err) in zip(procs, files, strict=True):
                out.seek(0)
                err.seek(0)
                if proc.returncode != 0:
                    raise BenchError(f"{' '.join(proc.args)}: exit {proc.returncode}: {err.read().strip()[-2000:]}")  # type: ignore[arg-type]
                outputs.append(out.read())
            return timing, outputs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for out, err in files:
                out.close()
                err.close()


FENCEKEEPER_PROBE = "SELECT count(*) FROM {}workflow_dispatch WHERE dispatch_state = 'succeeded'"
"""The drain's probe of finished executions: one row per execution, as Procrastinate's and DBOS's probes read.

workflow_dispatch mirrors each execution's state, written in the transaction
that writes the execution's, so this count is exact.  The probe read the
``objects`` table until run 47: five rows per two-node execution, and no
index on the state (dropped so that decisions update those rows in place),
so each poll read up to 25,000 rows, about 4.4 ms of the server's CPU
against 0.45 ms for Procrastinate's, 50 times a second, inside the window
it timed: about a tenth of this machine's two cores taken from fencekeeper's
workers by the bench alone."""


def _fencekeeper_succeeded(target: FencekeeperTarget, server: Server | None) -> Callable[[], int]:
    query = FENCEKEEPER_PROBE
    if server is not None and target.schema is not None:
        sql = query.format(f"{target.schema}.")
        return lambda: int(server.scalar(sql))
    return _sqlite_count(target.url, query.format(""))


def _sqlite_count(path: str, sql: str) -> Callable[[], int]:
    def count() -> int:
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)) as conn:
                return int(conn.execute(sql).fetchone()[0])
        except sqlite3.OperationalError:
            return 0  # busy, or not created yet: ask again at the next poll

    return count


def fencekeeper_drain(
    store: str,
    workload: str,
    executions: int,
    workers: int,
    *,
    server: Server | None,
    directory: Path,
    handler: str = NOOP_HANDLER,
    one_process: bool = False,
    forked: int = 0,
) -> Drain:
    """Admit ``executions`` of ``workload``, then time ``workers`` worker processes draining them.

    ``one_process``: one process of ``workers`` worker threads (``--concurrency``) instead,
    the shape of Procrastinate's ``--concurrency`` and DBOS's ``worker_concurrency``.
    ``forked``: one command of processes forked after one start-up (``--processes``), each of
    ``forked`` worker threads, ``workers`` threads in all.
    """
    target = _fencekeeper_target(store, server, directory)
    if one_process:
        commands = [worker_command(target, 1, handler, concurrency=workers)]
    elif forked:
        commands = [worker_command(target, 1, handler, concurrency=forked, processes=workers // forked)]
    else:
        commands = [worker_command(target, n, handler) for n in range(1, workers + 1)]
    system = ONE_PROCESS if one_process else forked_system(workers // forked, forked) if forked else "fencekeeper"
    try:
        if server is not None:
            server.checkpoint()
        admit_seconds = admit(target, workload, executions)
        if server is not None:
            server.settle()
        timing, outputs = _run_all(
            commands,
            _worker_env(directory),
            count=_fencekeeper_succeeded(target, server),
            total=executions,
        )
        summaries = [json.loads(out) for out in outputs]
        succeeded = sum(s["finished"].get("succeeded", 0) for s in summaries)
        problems = [x for s in summaries for x in (*s["errors"], *s["refused"])]
        if succeeded != executions or problems:
            raise BenchError(
                f"fencekeeper {workload} on {store}, {workers} workers: {succeeded} of {executions} succeeded; {problems[:3]}"
            )
        return Drain(system, workload, store, workers, executions, admit_seconds, timing)
    finally:
        if server is not None and target.schema is not None:
            server.drop_schema(target.schema)


def fencekeeper_start(store: str, *, server: Server | None, directory: Path) -> float:
    """Seconds one ``fencekeeper worker --until-idle`` takes over an empty store: start-up and one empty claim."""
    target = _fencekeeper_target(store, server, directory)
    try:
        connect.migrate(target.url, schema=target.schema)
        timing, _ = _run_all([worker_command(target, 1, NOOP_HANDLER)], _worker_env(directory))
        return timing.seconds
    finally:
        if server is not None and target.schema is not None:
            server.drop_schema(target.schema)


# --- Procrastinate --------------------------------------------------------------------------


def _search_path_url(url: str, schema: str) -> str:
    return f"{url}?options={quote(f'-csearch_path={schema}')}"


def procrastinate_command(concurrency: int) -> list[str]:
    """Procrastinate's own worker command, as its documentation runs it, stopping when the queue is empty."""
    return [
        str(BIN / "procrastinate"),
        "--app",
        "bench.e2e_procrastinate.app",
        "worker",
        "--one-shot",
        "--concurrency",
        str(concurrency),
    ]


PROCRASTINATE_TASKS = {"no-op job": "noop", "async no-op job": "noop_async"}
"""Procrastinate's two no-op jobs, by workload name: a plain function (a thread per job) and a coroutine."""


def procrastinate_drain(executions: int, concurrency: int, *, server: Server, workload: str = "no-op job") -> Drain:
    """Defer ``executions`` no-op jobs one by one, ANALYZE, then time one ``procrastinate worker --one-shot``."""


    schema = server.fresh_schema("procrastinate")
    dsn = _search_path_url(server.url, schema)
    try:
        server.conn.execute(f"CREATE SCHEMA {schema}")
        server.checkpoint()
        admit_seconds = _defer(dsn, executions, PROCRASTINATE_TASKS[workload])
        server.settle()
        env = dict(os.environ, FK_BENCH_PROCRASTINATE_DSN=dsn, PYTHONPATH=str(ROOT))
        sql = f"SELECT count(*) FROM {schema}.procrastinate_jobs WHERE status = 'succeeded'"
        timing, _ = _run_all(
            [procrastinate_command(concurrency)], env, count=lambda: int(server.scalar(sql)), total=executions
        )
        done = server.scalar(sql)
        if done != executions:
            raise BenchError(f"procrastinate, concurrency {concurrency}: {done} of {executions} jobs succeeded")
        return Drain("procrastinate", workload, "pg", concurrency, executions, admit_seconds, timing)
    finally:
        server.drop_schema(schema)


def procrastinate_start(*, server: Server) -> float:
    """Seconds one ``procrastinate worker --one-shot`` takes over an empty queue."""


    schema = server.fresh_schema("procrastinate")
    dsn = _search_path_url(server.url, schema)
    try:
        server.conn.execute(f"CREATE SCHEMA {schema}")
        _defer(dsn, 0)
        env = dict(os.environ, FK_BENCH_PROCRASTINATE_DSN=dsn, PYTHONPATH=str(ROOT))
        timing, _ = _run_all([procrastinate_command(1)], env)
        return timing.seconds
    finally:
        server.drop_schema(schema)


# --- DBOS -----------------------------------------------------------------------------------


def _dbos_location(store: str, server: Server | None, directory: Path) -> tuple[str, str]:
    if store == "pg":
        assert server is not None
        return server.url, server.fresh_schema("dbos")
    return f"sqlite:///{directory / f'dbos-{uuid.uuid4().hex[:8]}.sqlite'}", "dbos"


def _dbos_succeeded(store: str, url: str, schema: str, server: Server | None) -> Callable[[], int]:
    if store == "pg":
        assert server is not None
        return lambda: int(server.scalar(f"SELECT count(*) FROM {schema}.workflow_status WHERE status = 'SUCCESS'"))
    return _sqlite_count(url.removeprefix("sqlite:///"), "SELECT count(*) FROM workflow_status WHERE status = 'SUCCESS'")


def dbos_drain(
    store: str, workload: str, executions: int, concurrency: int, *, server: Server | None, directory: Path
) -> Drain:
    """Enqueue ``executions`` workflows one by one in one process, then time a DBOS worker process draining them."""
    url, schema = _dbos_location(store, server, directory)
    args = [url, schema, str(DBOS_STEPS[workload]), str(executions), str(concurrency)]
    module = [sys.executable, "-m", "bench.e2e_dbos"]
    try:
        if server is not None:
            server.checkpoint()
        _, outputs = _run_all([[*module, "admit", *args]], dict(os.environ))
        admit_seconds = float(json.loads(outputs[0].strip().splitlines()[-1])["seconds"])
        if server is not None:
            server.settle()
        succeeded = _dbos_succeeded(store, url, schema, server)
        log = directory / f"dbos-{schema}-{uuid.uuid4().hex[:6]}.err"
        with log.open("w") as err:
            started = time.perf_counter()
            proc = subprocess.Popen([*module, "drain", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        try:
            timing = _poll_window(succeeded, executions, started, lambda: proc.poll() is None)
        except BenchError as exc:
            raise BenchError(f"dbos {workload} on {store}: {exc}: {log.read_text()[-2000:]}") from None
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return Drain("dbos", workload, store, concurrency, executions, admit_seconds, timing)
    finally:
        if server is not None:
            server.drop_schema(schema)


# --- counting round trips -------------------------------------------------------------------


def traced(argv: Sequence[str]) -> int:
    """``python -m bench.e2e --traced DIR fencekeeper|procrastinate ARGS...``: that command line, every connection traced.

    Each psycopg connection the process opens (sync or async, pooled or not)
    gets libpq's protocol trace into a file of its own in DIR.  The stdio
    streams are flushed when the process exits normally, which both commands
    do when their queue is empty.
    """
    directory, program, *rest = argv
    import psycopg  # noqa: PLC0415
    from psycopg import pq  # noqa: PLC0415

    numbers = itertools.count()

    def trace(conn: Any) -> None:
        fd = os.open(Path(directory) / f"trace-{os.getpid()}-{next(numbers)}.txt", os.O_WRONLY | os.O_CREAT, 0o644)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    sync_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    async_connect = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

    def connect_traced(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = sync_connect(cls, *args, **kwargs)
        trace(conn)
        return conn

    async def aconnect_traced(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = await async_connect(cls, *args, **kwargs)
        trace(conn)
        return conn

    psycopg.Connection.connect = classmethod(connect_traced)  # type: ignore[assignment,method-assign]
    psycopg.AsyncConnection.connect = classmethod(aconnect_traced)  # type: ignore[assignment,method-assign]
    if program == "fencekeeper":
        from fencekeeper.adapters.cli import main as fencekeeper_main  # noqa: PLC0415

        return fencekeeper_main(rest)
    if program == "admit":
        url, schema, workload, count = rest
        admit(FencekeeperTarget(url, schema), workload, int(count))
        return 0
    if program == "defer":
        dsn, count = rest
        _defer(dsn, int(count))
        return 0
    from procrastinate.cli import main as procrastinate_main  # noqa: PLC0415

    sys.argv = ["procrastinate", *rest]
    procrastinate_main()  # type: ignore[no-untyped-call]
    return 0


@attrs.frozen
class TraceCount:
    """What one traced run sent and committed: messages that wait on the server, statements, transactions."""

    round_trips: int
    statements: int
    transactions: int
    timer_lookups: int = 0
    """Round trips that looked for due timers (not in ``round_trips``): a worker's, once a second while busy."""

    def __sub__(self, other: TraceCount) -> TraceCount:
        return TraceCount(
            self.round_trips - other.round_trips,
            self.statements - other.statements,
            self.transactions - other.transactions,
            self.timer_lookups - other.timer_lookups,
        )


TIMER_LOOKUP = "SELECT w.execution_id, w.node_id, w.attempt_id FROM wait_registrations w"
"""How fencekeeper's due-timer lookup begins (``SqlBackend.due_registrations``), as a trace's ``Parse`` shows it."""


def count_trace(directory: Path) -> TraceCount:
    """Count what every trace file in ``directory`` shows (libpq's format: ``F|B<TAB>len<TAB>Type<TAB>fields``).

    A round trip is one flight of frontend messages followed by the server's
    answer: the client sent, then waited.  Messages sent together in pipeline
    mode (``BEGIN`` with a statement, or a statement with its ``COMMIT``,
    each behind a ``Sync`` of its own) are one round trip, however many
    ``Sync`` messages the flight holds.  A flight of nothing but ``Parse`` and
    ``Sync`` is not counted: that is a statement being prepared, once per
    connection, which a run over N executions may do and the run over none
    not, so it would not cancel out;
    a statement is a ``Query`` or an ``Execute``; a transaction is a
    completed ``COMMIT``, or a ``ReadyForQuery`` that reports the session
    idle after at least one other completed command since the one before (a
    statement run in autocommit, as Procrastinate runs them).  A ``COMMIT``
    is counted where it completes, not where the session next reports idle:
    fencekeeper's worker sends its next claim's ``BEGIN`` and locking read
    behind it, in the same segment, so the session may never be idle between
    two transactions.  A ``ROLLBACK`` commits nothing and is not counted.

    A flight that runs fencekeeper's due-timer lookup (a prepared statement
    whose ``Parse`` shows :data:`TIMER_LOOKUP`) is counted apart, in
    ``timer_lookups``, and its statement not at all: a worker sends it once a
    second while its queue is busy, whatever the number of executions, so
    it belongs to no execution.
    """
    round_trips = statements = transactions = timer_lookups = 0
    for path in directory.glob("trace-*.txt"):
        completed = False
        flight: set[str] = set()
        looks_for_timers = answering_timer_lookup = False
        timer_statements: set[str] = set()
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split("\t", 3)
            if len(fields) < 3:
                continue
            side, kind = fields[0], fields[2]
            rest = fields[3].strip() if len(fields) > 3 else ""
            if side == "F":
                flight.add(kind)
                if kind == "Parse" and TIMER_LOOKUP in rest and not rest.startswith('""'):
                    timer_statements.add(rest.split(" ", 1)[0])
                elif kind == "Bind" and rest.split(" ", 2)[1:2] and rest.split(" ", 2)[1] in timer_statements:
                    looks_for_timers = True
                statements += kind in ("Query", "Execute") and not (kind == "Execute" and looks_for_timers)
                continue
            if flight:
                # The first answer after a flight: the client waited once for all of it.
                if looks_for_timers:
                    timer_lookups += 1
                else:
                    round_trips += not flight <= {"Parse", "Sync"}
                answering_timer_lookup = looks_for_timers
                flight = set()
                looks_for_timers = False
            if kind == "CommandComplete":
                tag = rest.strip('"')
                if tag == "COMMIT":
                    transactions += not answering_timer_lookup
                    completed = False
                else:
                    completed = tag != "ROLLBACK"
            elif kind == "ReadyForQuery":
                transactions += completed and rest == "I" and not answering_timer_lookup
                completed = False
    return TraceCount(round_trips, statements, transactions, timer_lookups)


def _defer(dsn: str, count: int, task: str = "noop") -> float:
    """Apply Procrastinate's schema at ``dsn``, then defer ``count`` jobs of ``task`` one by one; the seconds they took."""
    import procrastinate  # noqa: PLC0415 - the bench extra

    from bench.e2e_procrastinate import app  # noqa: PLC0415

    with app.replace_connector(procrastinate.SyncPsycopgConnector(conninfo=dsn)) as sync_app, sync_app.open():
        sync_app.schema_manager.apply_schema()
        started = time.perf_counter()
        for _ in range(count):
            sync_app.configure_task(task).defer()
        return time.perf_counter() - started


def count_admissions(system: str, executions: int, *, server: Server, directory: Path) -> Counted:
    """Round trips per admission: ``service.run`` (two-node) or Procrastinate's ``defer``, traced (:func:`_per_execution`)."""
    counts = []
    runs = _counts(executions)
    for n in runs:
        schema = server.fresh_schema("fk" if system == "fencekeeper" else "procrastinate")
        try:
            if system == "fencekeeper":
                args = ["admit", server.url, schema, "two-node", str(n)]
            else:
                server.conn.execute(f"CREATE SCHEMA {schema}")
                args = ["defer", _search_path_url(server.url, schema), str(n)]
            trace_dir = directory / f"trace-{args[0]}-{n}-{uuid.uuid4().hex[:6]}"
            counts.append(_traced_run(["python", *args[1:]], args[0], _worker_env(directory), trace_dir))
        finally:
            server.drop_schema(schema)
    return _per_execution(system, "service.run" if system == "fencekeeper" else "defer", runs, counts)


def _traced_run(command: Sequence[str], program: str, env: dict[str, str], directory: Path) -> TraceCount:
    directory.mkdir(parents=True)
    _run_all([[sys.executable, "-m", "bench.e2e", "--traced", str(directory), program, *command[1:]]], env)
    return count_trace(directory)


def count_fencekeeper(workload: str, executions: int, *, server: Server, directory: Path) -> Counted:
    """Round trips per execution of one traced ``fencekeeper worker --until-idle`` (one worker; :func:`_per_execution`)."""
    counts = []
    runs = _counts(executions)
    for n in runs:
        target = _fencekeeper_target("pg", server, directory)
        try:
            admit(target, workload, n)
            trace_dir = directory / f"trace-fk-{workload}-{n}-{uuid.uuid4().hex[:6]}"
            counts.append(_traced_run(worker_command(target, 1, NOOP_HANDLER), "fencekeeper", _worker_env(directory), trace_dir))
        finally:
            assert target.schema is not None
            server.drop_schema(target.schema)
    return _per_execution("fencekeeper", workload, runs, counts)


def count_procrastinate(executions: int, *, server: Server, directory: Path) -> Counted:
    """Round trips per job of one traced ``procrastinate worker --one-shot`` (concurrency 1; :func:`_per_execution`)."""
    counts = []
    runs = _counts(executions)
    for n in runs:
        schema = server.fresh_schema("procrastinate")
        dsn = _search_path_url(server.url, schema)
        try:
            server.conn.execute(f"CREATE SCHEMA {schema}")
            _defer(dsn, n)
            env = dict(os.environ, FK_BENCH_PROCRASTINATE_DSN=dsn, PYTHONPATH=str(ROOT))
            trace_dir = directory / f"trace-procrastinate-{n}-{uuid.uuid4().hex[:6]}"
            counts.append(_traced_run(procrastinate_command(1), "procrastinate", env, trace_dir))
        finally:
            server.drop_schema(schema)
    return _per_execution("procrastinate", "no-op job", runs, counts)


# --- the run --------------------------------------------------------------------------------


@attrs.frozen
class Plan:
    """What one run measures."""

    rounds: int
    executions: int
    sqlite_executions: int
    workers: tuple[int, ...]
    threads: tuple[int, ...]
    forked: tuple[tuple[int, int], ...]
    """Processes and threads of each ``--processes`` shape measured."""
    sqlite_workers: tuple[int, ...]
    peer_concurrency: tuple[int, ...]
    workloads: tuple[str, ...]
    systems: tuple[str, ...]
    stores: tuple[str, ...]
    handler: str
    count_executions: int


Step = Callable[[], Drain]


def _round_steps(plan: Plan, server: Server | None, directory: Path) -> dict[str, list[tuple[str, Step]]]:
    """Each system's measurements of one round, in order, each a label and a callable."""
    steps: dict[str, list[tuple[str, Step]]] = {"fencekeeper": [], "procrastinate": [], "dbos": []}
    stores = [(s, plan.workers if s == "pg" else plan.sqlite_workers) for s in plan.stores]
    for store, counts in stores:
        n = plan.executions if store == "pg" else plan.sqlite_executions
        for workload in plan.workloads:
            for workers in counts:
                step = functools.partial(
                    fencekeeper_drain, store, workload, n, workers, server=server, directory=directory, handler=plan.handler
                )
                steps["fencekeeper"].append((f"fencekeeper {workload} {store} x{workers}", step))
            # The two other shapes of N workers, PostgreSQL only: one process of N threads, one command of N processes.
            shapes = [(n_, {"one_process": True}, f"1 process c{n_}") for n_ in plan.threads] + [
                (p_ * t_, {"forked": t_}, f"--processes {p_}" + (f" c{t_}" if t_ > 1 else "")) for p_, t_ in plan.forked
            ]
            for workers, shape, label in shapes if store == "pg" else ():
                step = functools.partial(
                    fencekeeper_drain, store, workload, n, workers, server=server, directory=directory,
                    handler=plan.handler, **shape,
                )  # fmt: skip
                steps["fencekeeper"].append((f"fencekeeper {workload} {store} {label}", step))
    if "pg" in plan.stores and server is not None:
        for concurrency in plan.peer_concurrency:
            for workload, task in PROCRASTINATE_TASKS.items():
                step = functools.partial(procrastinate_drain, plan.executions, concurrency, server=server, workload=workload)
                steps["procrastinate"].append((f"procrastinate {task} pg c{concurrency}", step))
    for store in plan.stores:
        n = plan.executions if store == "pg" else plan.sqlite_executions
        concurrencies = plan.peer_concurrency if store == "pg" else plan.sqlite_workers
        for workload in DBOS_STEPS:
            for concurrency in concurrencies:
                step = functools.partial(dbos_drain, store, workload, n, concurrency, server=server, directory=directory)
                steps["dbos"].append((f"dbos {workload} {store} c{concurrency}", step))
    return {system: steps[system] for system in plan.systems}


def run(plan: Plan, *, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Every round of ``plan``; returns the drains, start-ups and counts (also printed through ``out``)."""
    drains: list[tuple[int, Drain]] = []
    starts: dict[str, list[float]] = {}
    counted: list[Counted] = []
    with contextlib.ExitStack() as stack:
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fk-bench-e2e-")))
        server: Server | None = None
        if "pg" in plan.stores:
            server = Server(BASE_DSN)
            stack.callback(server.close)
            loaded = server.preload or "(none)"
            out(f"server: PostgreSQL {server.version}, database {server.database}; shared_preload_libraries: {loaded}")
        for number in range(1, plan.rounds + 1):
            order = list(_round_steps(plan, server, directory).items())
            if number % 2 == 0:
                order.reverse()
            out(f"round {number}: " + ", then ".join(system for system, _ in order))
            for system, steps in order:
                for store in plan.stores:
                    label = f"{system} start-up, empty queue, {store}"
                    if system == "fencekeeper":
                        starts.setdefault(label, []).append(fencekeeper_start(store, server=server, directory=directory))
                    elif system == "procrastinate" and store == "pg" and server is not None:
                        starts.setdefault(label, []).append(procrastinate_start(server=server))
                for label, step in steps:
                    drain = step()
                    drains.append((number, drain))
                    out(
                        f"  {label:<40} admitted {drain.admit_rate:7.1f}/s   drained {drain.executions:5d} in "
                        f"{drain.seconds:6.2f} s = {drain.rate:7.1f}/s   steady {drain.steady_rate:7.1f}/s"
                    )
        if server is not None and plan.count_executions > 0:
            if "fencekeeper" in plan.systems:
                for workload in plan.workloads:
                    counted.append(count_fencekeeper(workload, plan.count_executions, server=server, directory=directory))
                counted.append(count_admissions("fencekeeper", plan.count_executions, server=server, directory=directory))
            if "procrastinate" in plan.systems:
                counted.append(count_procrastinate(plan.count_executions, server=server, directory=directory))
                counted.append(count_admissions("procrastinate", plan.count_executions, server=server, directory=directory))
    return {"drains": drains, "starts": starts, "counted": counted}


# --- the report -----------------------------------------------------------------------------

Key = tuple[str, str | None, str, int | None]

TARGETS: list[tuple[str, Key, Key, float | None, str]] = [
    # (what, ours, reference, at least (None: shown, no target), rate or admit); None in a key matches any workers.
    ("PG, 8 workers: one-node vs Procrastinate async no-op (c8)", ("fencekeeper", "one-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 2.0, "rate"),
    ("PG, 8 workers: two-node vs Procrastinate async no-op (c8)", ("fencekeeper", "two-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 1.0, "rate"),
    ("PG, 8 workers: two-node vs DBOS one-step (c8)", ("fencekeeper", "two-node", "pg", 8), ("dbos", "one-step", "pg", 8), 3.0, "rate"),
    ("PG, 8 workers: five-node vs DBOS three-step (c8)", ("fencekeeper", "five-node", "pg", 8), ("dbos", "three-step", "pg", 8), None, "rate"),
    # The same three targets for eight workers as the peers run them: threads of one process.
    ("PG, 1 process c8: one-node vs Procrastinate async no-op (c8)", (ONE_PROCESS, "one-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 2.0, "rate"),
    ("PG, 1 process c8: two-node vs Procrastinate async no-op (c8)", (ONE_PROCESS, "two-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 1.0, "rate"),
    ("PG, 1 process c8: two-node vs DBOS one-step (c8)", (ONE_PROCESS, "two-node", "pg", 8), ("dbos", "one-step", "pg", 8), 3.0, "rate"),
    # And as one command of eight processes forked after one start-up (`--processes 8`).
    ("PG, --processes 8: one-node vs Procrastinate async no-op (c8)", (FORKED, "one-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 2.0, "rate"),
    ("PG, --processes 8: two-node vs Procrastinate async no-op (c8)", (FORKED, "two-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 1.0, "rate"),
    ("PG, --processes 8: two-node vs DBOS one-step (c8)", (FORKED, "two-node", "pg", 8), ("dbos", "one-step", "pg", 8), 3.0, "rate"),
    # And as a process per core of this 2-core machine, four threads each (`--processes 2 --concurrency 4`).
    ("PG, --processes 2 c4: one-node vs Procrastinate async no-op (c8)", (forked_system(2, 4), "one-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 2.0, "rate"),
    ("PG, --processes 2 c4: two-node vs Procrastinate async no-op (c8)", (forked_system(2, 4), "two-node", "pg", 8), ("procrastinate", "async no-op job", "pg", 8), 1.0, "rate"),
    ("PG, --processes 2 c4: two-node vs DBOS one-step (c8)", (forked_system(2, 4), "two-node", "pg", 8), ("dbos", "one-step", "pg", 8), 3.0, "rate"),
    # Procrastinate's no-op as a plain function, which it runs in a thread per job: the reference of runs 1 to 21.
    ("PG, 8 workers: one-node vs Procrastinate no-op, a plain function (c8)", ("fencekeeper", "one-node", "pg", 8), ("procrastinate", "no-op job", "pg", 8), None, "rate"),
    ("PG, 8 workers: two-node vs Procrastinate no-op, a plain function (c8)", ("fencekeeper", "two-node", "pg", 8), ("procrastinate", "no-op job", "pg", 8), None, "rate"),
    ("PG, 1 worker: two-node vs Procrastinate async no-op (c1)", ("fencekeeper", "two-node", "pg", 1), ("procrastinate", "async no-op job", "pg", 1), None, "rate"),
    # Both of Procrastinate's tasks are deferred alike: every defer of the round is its reference.
    ("PG admission: service.run vs Procrastinate defer", ("fencekeeper", "two-node", "pg", None), ("procrastinate", None, "pg", None), 1.0, "admit"),
    ("PG admission: service.run vs DBOS enqueue", ("fencekeeper", "two-node", "pg", None), ("dbos", "one-step", "pg", None), None, "admit"),
    ("SQLite, 1 worker: two-node vs DBOS one-step on SQLite", ("fencekeeper", "two-node", "sqlite", 1), ("dbos", "one-step", "sqlite", 1), 3.0, "rate"),
    ("SQLite admission: service.run vs DBOS enqueue", ("fencekeeper", "two-node", "sqlite", None), ("dbos", "one-step", "sqlite", None), None, "admit"),
]
"""Issue 16's targets, and beside them the comparisons a reader choosing between the three would ask for."""
ROUND_TRIP_TARGET = 12.0


def _value(drain: Drain, how: str) -> float:
    return {"admit": drain.admit_rate, "rate": drain.rate, "steady": drain.steady_rate}[how]


def _ratio(drains: list[tuple[int, Drain]], ours: Key, reference: Key, how: str) -> tuple[float, float, float] | None:
    """Ours, the reference and the median of the rounds' own ratios; None when no round measured both."""
    pairs: list[tuple[float, float]] = []
    for number in sorted({n for n, _ in drains}):
        mine = [_value(d, how) for n, d in drains if n == number and _matches(d, ours)]
        theirs = [_value(d, how) for n, d in drains if n == number and _matches(d, reference)]
        if mine and theirs and statistics.median(theirs) > 0:
            pairs.append((statistics.median(mine), statistics.median(theirs)))
    if not pairs:
        return None
    return (
        statistics.median(a for a, _ in pairs),
        statistics.median(b for _, b in pairs),
        statistics.median(a / b for a, b in pairs),
    )


def _matches(drain: Drain, key: Key) -> bool:
    return all(want is None or want == have for want, have in zip(key, drain.key, strict=True))


def report(result: dict[str, Any], *, out: Callable[[str], None] = print) -> bool:
    """Print the medians, the targets' ratios and the counts; True when every target measured is met."""
    drains: list[tuple[int, Drain]] = result["drains"]
    by_key: dict[tuple[str, str, str, int], list[Drain]] = {}
    for _, drain in drains:
        by_key.setdefault(drain.key, []).append(drain)
    out("")
    out("medians over the rounds. drained: from the first worker's start to the queue empty, start-up included;")
    out("steady: from the first completion seen to the last (start-up left out); polled every 20 ms")
    out(
        f"workers: fencekeeper's processes (commands); {ONE_PROCESS}'s threads in one process; {FORKED}'s processes "
        "of one command (fencekeeper-PxT: P processes of T threads); Procrastinate's and DBOS's concurrency"
    )
    out(
        f"{'system':<16}{'workload':<17}{'store':<8}{'workers':>8}{'admitted/s':>12}{'drained/s':>11}{'steady/s':>10}"
        "  rounds (drained/s)"
    )
    for (system, workload, store, workers), items in by_key.items():
        admitted = statistics.median(d.admit_rate for d in items)
        rate = statistics.median(d.rate for d in items)
        steady = statistics.median(d.steady_rate for d in items)
        rounds = " / ".join(f"{d.rate:.0f}" for d in items)
        out(f"{system:<16}{workload:<17}{store:<8}{workers:>8}{admitted:>12.1f}{rate:>11.1f}{steady:>10.1f}  {rounds}")
    for label, seconds in result["starts"].items():
        out(f"{label}: {statistics.median(seconds):.2f} s (median of {len(seconds)})")
    out("")
    out("targets (ratio: median of the rounds' own ratios, ours / reference, both from the same round)")
    met = True
    for what, ours, reference, least, how in TARGETS:
        measured = _ratio(drains, ours, reference, how)
        if measured is None:
            out(f"  {what}: not measured in this run")
            continue
        ours_v, ref_v, ratio = measured
        if least is None:
            verdict = "no target"
        else:
            verdict = f"target >= {least:g}x: " + ("met" if ratio >= least else "NOT met")
            met = met and ratio >= least
        without_start = ""
        if how == "rate" and (s := _ratio(drains, ours, reference, "steady")) is not None:
            without_start = f"; steady {s[0]:.1f} vs {s[1]:.1f}/s = {s[2]:.2f}x"
        out(f"  {what}: {ours_v:.1f} vs {ref_v:.1f}/s = {ratio:.2f}x ({verdict}){without_start}")
    counted: list[Counted] = result["counted"]
    if counted:
        out("")
        out(
            "per execution, counted (libpq protocol trace of one worker, concurrency 1; a run over N+M "
            "executions minus a run over M, so start-up, first loads and the last empty claim cancel out; "
            "fencekeeper's due-timer lookups, once a second while busy, are counted apart):"
        )
        out(
            f"{'system':<14}{'workload':<12}{'N':>5}{'round trips':>13}{'statements':>12}{'transactions':>14}"
            f"{'timer lookups':>15}"
        )
        for c in counted:
            out(
                f"{c.system:<14}{c.workload:<12}{c.executions:>5}{c.round_trips:>13.2f}{c.statements:>12.2f}"
                f"{c.transactions:>14.2f}{c.timer_lookups:>15d}"
            )
        for c in counted:
            if c.system == "fencekeeper" and c.workload == "two-node":
                verdict = "met" if c.round_trips <= ROUND_TRIP_TARGET else "NOT met"
                met = met and c.round_trips <= ROUND_TRIP_TARGET
                out(
                    f"  round trips per two-node execution: {c.round_trips:.2f} (target <= {ROUND_TRIP_TARGET:g}): "
                    f"{verdict}; and {c.timer_lookups} due-timer lookups in the traced drain"
                )
    return met


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"give whole numbers of at least 1: {text!r}")
    return values


def _ints_or_none(text: str) -> tuple[int, ...]:
    return () if text == "none" else _ints(text)


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    """``8,2x4``: processes, or processes x threads each; 'none' for none."""
    if text == "none":
        return ()
    shapes = []
    for item in text.split(","):
        processes, _, threads = item.partition("x")
        try:
            shape = (int(processes), int(threads or 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: write P or PxT, e.g. 8 or 2x4") from None
        if min(shape) < 1:
            raise argparse.ArgumentTypeError(f"{item!r}: processes and threads must be positive")
        shapes.append(shape)
    return tuple(shapes)


def _choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(x for x in text.split(",") if x)
        unknown = [x for x in values if x not in allowed]
        if unknown or not values:
            raise argparse.ArgumentTypeError(f"{unknown or text!r}: choose from {', '.join(allowed)}")
        return values

    return parse


def parse_args(argv: Sequence[str] | None) -> tuple[Plan, bool]:
    """The plan the command line asks for, and whether to exit 1 on a missed target."""
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, 100 executions, 1 and 8 workers (about 2 minutes)")
    parser.add_argument("--rounds", type=int, help="rounds; medians are taken over them (default 3)")
    parser.add_argument("--executions", type=int, help="executions (jobs, workflows) per PostgreSQL drain (default 500)")
    parser.add_argument("--sqlite-executions", type=int, help="per SQLite drain (default: as --executions)")
    parser.add_argument("--workers", type=_ints, help="fencekeeper worker processes on PostgreSQL (default 1,4,8)")
    parser.add_argument(
        "--threads",
        type=_ints_or_none,
        default=(8,),
        help="also one fencekeeper worker process with this --concurrency, on PostgreSQL ('none' to skip; default 8)",
    )
    parser.add_argument(
        "--forked",
        type=_shapes,
        default=((8, 1), (2, 4)),
        help="also one fencekeeper worker command of P processes (PxT: of T threads each), on PostgreSQL "
        "('none' to skip; default 8,2x4)",
    )
    parser.add_argument("--sqlite-workers", type=_ints, default=(1,), help="on SQLite, for both systems (default 1)")
    parser.add_argument("--peer-concurrency", type=_ints, default=(1, 8), help="Procrastinate's and DBOS's (default 1,8)")
    parser.add_argument(
        "--workloads",
        type=_choices((*WORKFLOWS, *MIXES)),
        default=tuple(WORKFLOWS),
        help="fencekeeper's (default: the three single ones; 'mixed' draws one-node and two-node at random)",
    )
    parser.add_argument(
        "--systems",
        type=_choices(("fencekeeper", "procrastinate", "dbos")),
        default=("fencekeeper", "procrastinate", "dbos"),
        help="default: all three; procrastinate and dbos need the bench extra",
    )
    parser.add_argument("--stores", type=_choices(("pg", "sqlite")), default=("pg", "sqlite"), help="default: pg,sqlite")
    parser.add_argument(
        "--handler",
        default=NOOP_HANDLER,
        help=f"fencekeeper's CommandHandler: MODULE:FACTORY, or 'example' for the example handler (default {NOOP_HANDLER})",
    )
    parser.add_argument("--count", type=int, help="executions in the round-trip count, 0 to skip (default 50)")
    parser.add_argument("--check", action="store_true", help="exit with status 1 when a target is missed")
    args = parser.parse_args(argv)
    executions = args.executions or (100 if args.quick else 500)
    plan = Plan(
        rounds=args.rounds or (1 if args.quick else 3),
        executions=executions,
        sqlite_executions=args.sqlite_executions or executions,
        workers=args.workers or ((1, 8) if args.quick else (1, 4, 8)),
        threads=args.threads,
        forked=args.forked,
        sqlite_workers=args.sqlite_workers,
        peer_concurrency=args.peer_concurrency,
        workloads=args.workloads,
        systems=args.systems,
        stores=args.stores,
        handler=args.handler,
        count_executions=args.count if args.count is not None else (20 if args.quick else 50),
    )
    return plan, args.check


def _versions(plan: Plan) -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    names = ["fencekeeper", "psycopg"] + [s for s in plan.systems if s != "fencekeeper"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, " + ", ".join(found)


def compile_bytecode() -> Path:
    """Write the installed package's bytecode, as ``pip install`` of a wheel does; the package's directory.

    An editable install has none until an import writes it, and where
    PYTHONDONTWRITEBYTECODE is set no import ever does: every worker process
    then compiled about thirty modules from source at start-up, some 0.3 s
    of CPU each, a cost no installed fencekeeper pays.
    """
    import compileall  # noqa: PLC0415

    import fencekeeper  # noqa: PLC0415

    # Not resolved: an editable install's package is a tree of links, and its bytecode goes beside them.
    package = Path(fencekeeper.__file__).parent
    if not compileall.compile_dir(package, quiet=1):
        raise BenchError(f"{package}: could not compile the package's bytecode")
    return package


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["--traced"]:
        return traced(arguments[1:])
    plan, check = parse_args(arguments)
    print(f"bytecode compiled in {compile_bytecode()}, as an installed wheel has it")
    print(f"fencekeeper bench e2e: {_versions(plan)}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(
        f"{plan.rounds} rounds; {plan.executions} executions a PostgreSQL drain, {plan.sqlite_executions} a SQLite one; "
        f"handler {plan.handler}"
    )
    try:
        result = run(plan)
    except BenchError as exc:
        print(f"bench e2e: {exc}", file=sys.stderr)
        return 2
    met = report(result)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 1 if check and not met else 0


if __name__ == "__main__":
    sys.exit(main())
