"""adapters/prefork.py on its own: what a child is told, what it reports, and a fork the system refuses.

The command-line tests (test_worker_processes.py) run whole worker commands;
these fork small functions, so that each rule is seen alone.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import prefork


def _describe(exc: BaseException) -> tuple[str, int]:
    return f"{type(exc).__name__}: {exc}", 3


def _run(processes: int, child: Any) -> tuple[list[prefork.ChildEnd], str | None]:
    return prefork.run(processes, child, describe=_describe, failed=lambda result: False, note=lambda message: None)


def test_each_child_reports_what_it_returned_or_raised() -> None:
    def child(number: int, lifeline: prefork.Lifeline) -> Any:
        if number == 2:
            raise ValueError("no handler")
        return {"number": number, "pid": os.getpid()}

    ends, received = _run(3, child)
    assert received is None
    assert [e.number for e in ends] == [1, 2, 3]
    assert [e.result["number"] if e.result else None for e in ends] == [1, None, 3]
    assert all(e.result["pid"] == e.pid and e.pid != os.getpid() for e in (ends[0], ends[2]))
    assert not ends[0].failed and ends[1].failed
    assert ends[1].report == {"error": "ValueError: no handler", "exit": 3}
    assert ends[1].exit_code == 3
    assert ends[1].problem() == f"worker process 2 (pid {ends[1].pid}): ValueError: no handler"
    assert prefork.common_error(ends) is None


def test_the_same_error_in_every_child_is_common() -> None:
    def child(number: int, lifeline: prefork.Lifeline) -> Any:
        raise ValueError("--handler: returned object")

    ends, _ = _run(2, child)
    assert prefork.common_error(ends) == ("ValueError: --handler: returned object", 3)


def test_a_child_that_ends_in_error_stops_its_siblings(tmp_path: Path) -> None:
    def child(number: int, lifeline: prefork.Lifeline) -> Any:
        if number == 1:
            raise RuntimeError("gone")
        told = threading.Event()
        reasons: list[str] = []

        def stop(reason: str) -> None:
            reasons.append(reason)
            told.set()

        lifeline.heed(stop)
        assert told.wait(30), "never told to stop"
        return reasons[0]

    ends, _ = _run(3, child)
    assert [e.result for e in ends[1:]] == [prefork.SIBLING_FAILED, prefork.SIBLING_FAILED]


def test_a_refused_fork_stops_and_waits_for_the_children_already_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fork = os.fork
    forks: list[int] = []

    def fork() -> int:
        forks.append(1)
        if len(forks) > 1:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    marker = tmp_path / "stopped"

    def child(number: int, lifeline: prefork.Lifeline) -> Any:
        told = threading.Event()

        def stop(reason: str) -> None:
            marker.write_text(reason)
            told.set()

        lifeline.heed(stop)
        told.wait(30)
        return None

    with pytest.raises(prefork.ProcessesError, match="could not start worker process 2: Resource temporarily"):
        _run(3, child)
    # The first child lost its lifeline when the parent gave up, stopped as on a first signal, and was waited for.
    assert marker.read_text() == prefork.PARENT_EXITED


@pytest.mark.parametrize("processes", [0, 65, True, "2"])
def test_a_number_of_processes_out_of_bounds_is_refused(processes: Any) -> None:
    with pytest.raises(prefork.ProcessesError):
        prefork.check_processes(processes)
