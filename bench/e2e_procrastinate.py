"""The Procrastinate side of `bench.e2e`: an app with one no-op task, for `procrastinate --app` to load.

Only the bench's subprocesses import this module (``procrastinate --app
bench.e2e_procrastinate.app worker ...``), and the bench's own admission loop
when Procrastinate is selected; nothing in the test suite does.  It needs the
``bench`` extra (``pip install -e '.[bench]'``), which is why Procrastinate is
imported at the top here and nowhere else: ``--app`` must find an ``App``
object at import.

The connection string comes from ``FK_BENCH_PROCRASTINATE_DSN``: the bench
gives each drain a fresh schema through libpq's ``options`` (search_path), so
no two measurements share a table.
"""

from __future__ import annotations

import os

import procrastinate

DSN = os.environ.get("FK_BENCH_PROCRASTINATE_DSN", "postgresql://postgres@127.0.0.1:5432/test")

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))


@app.task(name="noop")
def noop() -> None:
    """The job: nothing, as the fencekeeper side's handler does nothing.

    A plain function: Procrastinate runs each such job in a thread of its own
    (``sync_to_async``), as it runs the code of a user who writes one.
    """


@app.task(name="noop_async")
async def noop_async() -> None:
    """The same job as a coroutine: run on the worker's event loop, with no thread per job.

    The reference issue 16's targets are measured against (``bench/e2e.py``,
    TARGETS); bench/README.md, run 22, compares the two forms.
    """
