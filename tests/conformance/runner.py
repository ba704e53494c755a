"""Runs the shipped store suite, in this process, against one store maker, the way a third party runs it.

The route is the public one: ``pytest --pyargs
fencekeeper.adapters.testing.run_suite --fencekeeper-store MODULE:CALLABLE``
(the callable here hands each test's clock and directory to the maker
under test) with the budget given by ``--fencekeeper-budget``.  The run stops at the first
failing test (``-x``): one failure is a catch.  Hypothesis runs without its
example database and derandomized, so a catch does not depend on what an
earlier run saved, and the same run gives the same result.
"""

from __future__ import annotations

import time
from pathlib import Path

import attrs
import pytest
from hypothesis import settings

from fencekeeper.adapters.store import ManualClock, Store
from fencekeeper.adapters.testing import budget

from .broken import Maker

settings.register_profile("fencekeeper-broken-check", database=None, derandomize=True)
settings.register_profile("fencekeeper-broken-random", database=None)


_making: Maker | None = None


def store_under_test(clock: ManualClock, directory: Path) -> Store:
    """What ``--fencekeeper-store`` names: the maker of the run in progress."""
    assert _making is not None, "store_under_test is called only during run_suite"
    return _making(clock, directory)


@attrs.frozen
class SuiteRun:
    passed: int
    failed: tuple[str, ...]
    """Node ids of the failing tests (at most one with ``stop_at_first``)."""
    first_failure: str
    seconds: float


class _Reports:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: list[str] = []
        self.first_failure = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.passed and report.when == "call":
            self.passed += 1
        elif report.failed:
            self.failed.append(report.nodeid)
            if not self.first_failure:
                self.first_failure = report.longreprtext


def run_suite(
    make: Maker,
    directory: Path,
    *,
    suite_budget: str = "quick",
    stop_at_first: bool = True,
    derandomize: bool = True,
    select: str | None = None,
) -> SuiteRun:
    """The store suite against stores ``make`` makes (in a fresh directory per test under ``directory``)."""
    global _making  # noqa: PLW0603 - the one store maker the run's --fencekeeper-store names
    _making = make
    reports = _Reports()
    args = [
        "--pyargs",
        "fencekeeper.adapters.testing.run_suite",
        "--fencekeeper-store",
        f"{__name__}:store_under_test",
        "-qq",
        "--tb=short",
        "-p",
        "no:cacheprovider",
        "--fencekeeper-budget",
        suite_budget,
        "--basetemp",
        str(directory / "basetemp"),
    ]
    if stop_at_first:
        args.append("-x")
    if select is not None:
        args += ["-k", select]
    settings.load_profile("fencekeeper-broken-check" if derandomize else "fencekeeper-broken-random")
    started = time.perf_counter()
    try:
        pytest.main(args, plugins=[reports])
    finally:
        _making = None
        settings.load_profile("default")
        budget.choose(None)
    return SuiteRun(reports.passed, tuple(reports.failed), reports.first_failure, time.perf_counter() - started)
