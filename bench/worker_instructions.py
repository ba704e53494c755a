"""The worker's own instructions per execution, counted under callgrind, this tree beside another in the same run.

Run: ``python -m bench.worker_instructions --against DIR`` (DIR: another
checkout of fencekeeper with its own ``.venv``, such as a clone of the
commit to compare with; PostgreSQL from FENCEKEEPER_PG_DSN or
postgresql://postgres@127.0.0.1:5432/test; valgrind must be installed).

Rules of this module:

- **What is counted.**  One in-process
  :class:`~fencekeeper.adapters.worker.Worker` drains two-node executions
  (``local_command``, then ``end``) on PostgreSQL as ``fencekeeper worker``
  does (``run_pass`` with one claim at a time until a pass finds nothing),
  with the no-op handler of ``bench.e2e``, in the main thread, under
  ``valgrind --tool=callgrind``: user-space instructions of the client
  process, the server's not included.
- **Per execution, start-up cancelled.**  Two drains per tree, of 1 and of
  N + 1 executions, each after one warm pass (the definition loaded, the
  statements prepared); the difference over N is what one more execution
  costs.  The due-timer lookup, paced by the process clock and so by how
  slow valgrind makes the run, is pushed out of the drain
  (``timer_interval``), so that the count does not depend on time.
- **Counting is not timing.**  Instructions do not depend on the machine's
  load, so one run compares two trees to a fraction of a percent where a
  timed run on a shared machine cannot; they say nothing of waits on the
  server.  ``PYTHONHASHSEED=0`` fixes the dict layouts of both runs.
- Each tree runs its own code from its own directory and ``.venv``; this
  file is copied to neither, the drain is a ``-c`` program.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

DSN = os.environ.get("FENCEKEEPER_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
ROOT = Path(__file__).resolve().parent.parent

_DRAIN = """
import sys
from bench.e2e import BUSINESS, PRINCIPAL, FencekeeperTarget, admit
from bench.e2e_handler import NoopHandler
from fencekeeper.adapters import connect, examples
from fencekeeper.adapters.worker import Worker

dsn, schema, n, what = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if what == "admit":
    admit(FencekeeperTarget(dsn, schema), "two-node", n)
    raise SystemExit(0)
store = connect.open_store(dsn, schema=schema)
worker = Worker(store, "w-1", examples.grants(BUSINESS, PRINCIPAL), NoopHandler(), timer_interval=1e9)
worker.run_pass(max_claims=1)
while worker.run_pass(max_claims=1).claimed:
    pass
store.close()
"""


class BenchError(Exception):
    """The measurement cannot be made: the message says why."""


def drained(tree: Path, executions: int) -> int:
    """Instructions of one process draining ``executions`` two-node executions in ``tree``, after one warm pass."""
    python = tree / ".venv" / "bin" / "python"
    if not python.exists():
        raise BenchError(f"{tree}: no .venv/bin/python (run `make .venv/.installed` there)")
    schema = f"fk_instr_{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    try:
        subprocess.run([str(python), "-c", _DRAIN, DSN, schema, str(executions), "admit"], cwd=tree, env=env, check=True)
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute("ANALYZE")
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
             str(python), "-c", _DRAIN, DSN, schema, str(executions), "drain"],
            cwd=tree, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[arg-type]
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise BenchError(f"{tree}: callgrind printed no count:\n{run.stderr[-2000:]}")
    return int(found[1])


def per_execution(tree: Path, executions: int) -> float:
    """What one more two-node execution costs the worker in ``tree``, in instructions."""
    return (drained(tree, executions + 1) - drained(tree, 1)) / executions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.worker_instructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, required=True, help="another checkout, with its own .venv")
    parser.add_argument("--executions", type=int, default=300, help="executions per counted drain (default 300)")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench.worker_instructions: valgrind is not installed", file=sys.stderr)
        return 2
    try:
        ours = per_execution(ROOT, args.executions)
        reference = per_execution(args.against.resolve(), args.executions)
    except (BenchError, subprocess.CalledProcessError, psycopg.OperationalError) as exc:
        print(f"bench.worker_instructions: {exc}", file=sys.stderr)
        return 1
    print(f"two-node execution, worker instructions (callgrind, {args.executions} executions, PostgreSQL)")
    print(f"  this tree ({ROOT}): {ours / 1000:,.1f}k")
    print(f"  reference ({args.against}): {reference / 1000:,.1f}k")
    print(f"  ratio: {ours / reference:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
