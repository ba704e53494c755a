"""The DBOS side of `bench.e2e`, run as ``python -m bench.e2e_dbos``: admit, or drain, one queue.

DBOS is a singleton per process, so each phase is a process of its own, as a
user's web process and queue worker would be:

- ``admit URL SCHEMA STEPS N C``: launch DBOS listening to no queue, register
  the queue ``bench`` (``worker_concurrency`` C, polled every 10 ms: the
  default second would cap a drain at C workflows a second), enqueue N
  workflows of STEPS no-op steps one by one (each ``Queue.enqueue`` commits
  the workflow before returning, as Procrastinate's ``defer`` commits its job
  and ``service.run`` its execution), print ``{"admitted": N, "seconds": S}`` and exit.
- ``drain URL SCHEMA STEPS N C``: launch DBOS listening to ``bench`` and run
  until stopped; the bench times it from start until its own poll of the
  system database sees all N workflows ``SUCCESS``, then stops it.

Both processes define the same workflows from this same file, so they have
the same application version, which is what lets the worker dequeue what the
first process enqueued.  Needs the ``bench`` extra; nothing in the test
suite imports this module.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

from dbos import DBOS, DBOSConfig


@DBOS.step()
def noop_step() -> None:
    """A step that does nothing: the durable checkpoint is all it costs."""


@DBOS.workflow()
def one_step() -> None:
    """One no-op step: the counterpart of a two-node execution (one Command, then the end)."""
    noop_step()


@DBOS.workflow()
def three_steps() -> None:
    """Three no-op steps: the counterpart of the five-node execution's work."""
    noop_step()
    noop_step()
    noop_step()


WORKFLOWS = {1: one_step, 3: three_steps}


def main(argv: list[str]) -> None:
    mode, url, schema, steps, count, concurrency = argv
    config: DBOSConfig = {
        "name": "fencekeeper-bench",
        "system_database_url": url,
        "log_level": "WARNING",
    }
    if url.startswith("postgresql"):
        config["dbos_system_schema"] = schema
    DBOS(config=config)
    workflow = WORKFLOWS[int(steps)]
    if mode == "admit":
        DBOS.listen_queues([])
        DBOS.launch()
        queue = DBOS.register_queue("bench", worker_concurrency=int(concurrency), polling_interval_sec=0.01)
        started = time.perf_counter()
        for _ in range(int(count)):
            queue.enqueue(workflow)
        seconds = time.perf_counter() - started
        DBOS.destroy()
        print(json.dumps({"admitted": int(count), "seconds": seconds}))
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS.launch()
    print("launched", flush=True)
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
