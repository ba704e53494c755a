"""How the command-line tests run ``fencekeeper``: the installed console script, in a subprocess.

What is tested is what a user types: argument parsing, exit codes, stdout
and stderr, and that no traceback escapes.  Exit codes (adapters/cli.py):
0 success, 1 a check found a problem or the kernel refused, 2 bad usage or
input.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
FENCEKEEPER = Path(sys.executable).parent / "fencekeeper"

# Plain output must not depend on the environment the suite runs in.
_COLOUR_VARIABLES = {"FORCE_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"}

# The workers' two notes of a store outage, as a user reads them (adapters/cli_logging.py, docs/operating-postgres.md).
LOST_NOTE = "the store's connection was lost; reconnecting and trying again for up to 30 s"
ANSWERED_NOTE = re.compile(r"the store answers again after (\d+\.\d) s \((\d+) requests? failed\); continuing")


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _COLOUR_VARIABLES}
    env.update(extra)
    return env


def fencekeeper(
    *args: str | Path,
    cwd: Path,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FENCEKEEPER), *map(str, args)],
        cwd=cwd,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        # The docs quote the seeds' box-drawing arrows; decode as the CLI writes.
        encoding="utf-8",
        check=False,  # exit codes are part of what is tested
        timeout=timeout,
        env=environment(**(env or {})),
    )


def started(*args: str | Path, cwd: Path, **env: str) -> subprocess.Popen[str]:
    """A long-running ``fencekeeper`` command (a worker), its stdout and stderr piped as text; ``env`` added."""
    return subprocess.Popen(
        [str(FENCEKEEPER), *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        env=environment(**env),
    )


def stderr_lines(worker: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """Every line ``worker`` writes on stderr, appended as it comes by a reader thread (returned, started).

    Read meanwhile, not after: a worker whose stderr pipe filled would block.
    """
    lines: list[str] = []

    def read() -> None:
        assert worker.stderr is not None
        lines.extend(line.rstrip("\n") for line in worker.stderr)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return lines, reader


def reached(worker: subprocess.Popen[str], marker: Path, what: str, seconds: float = 30) -> None:
    """Wait until ``worker`` has made ``marker`` (a handler or action saying where it is), failing if it exits first."""
    deadline = time.monotonic() + seconds
    while not marker.exists():
        assert worker.poll() is None, worker.communicate()
        assert time.monotonic() < deadline, f"{what} was never called"
        time.sleep(0.02)


def ok(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command that must succeed, with nothing on stderr that looks like an error."""
    result = fencekeeper(*args, cwd=cwd)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert "error" not in result.stderr, result.stderr
    return result


def data(*args: str | Path, cwd: Path) -> Any:
    """The one JSON document a ``--json`` command writes on stdout."""
    return json.loads(ok(*args, "--json", cwd=cwd).stdout)


def assert_one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The CLI's contract for errors: one line on stderr, a non-zero code, no traceback."""
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fencekeeper: error: "), lines[0]
    return lines[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` and its bytes: equal snapshots mean nothing was written."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def catches(pid: int, number: int) -> bool:
    """Whether process ``pid`` has installed a handler for signal ``number`` (Linux: SigCgt in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (number - 1) & 1)


def end_sessions(dsn: str, application: str) -> int:
    """End every PostgreSQL session named ``application`` (libpq's PGAPPNAME), as an administrator would; how many."""
    import psycopg  # noqa: PLC0415 - only the PostgreSQL tests need it, and it is slow to import

    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s", (application,)
        ).fetchone()
    assert found is not None
    return int(found[0])


def sane_outage(seconds: float, failures: int) -> None:
    """What a worker says of an outage its test made by ending its sessions: short, and at least one request failed."""
    # Ended sessions are replaced at once: the store answers within the first backoffs, long before the
    # ride-out is spent; at least the request that met a dead connection failed, and a handful at most.
    assert 0.0 <= seconds < 30.0 and 1 <= failures <= 40, (seconds, failures)
