"""The pytest plugin of ``fencekeeper[testing]``: a third-party store runs the store suite with only a factory.

Installed as a ``pytest11`` entry point, so pytest loads it wherever
fencekeeper is installed.  Rules of this module:

- Loading it costs nothing and needs nothing beyond pytest: it adds four
  options and three fixtures, and imports the suite (and Hypothesis) only
  when a test asks for them.
- ``--fencekeeper-store MODULE:CALLABLE`` names the store factory, called
  with the clock the store must read (and, if it takes a second argument,
  a fresh temporary directory for the store's files).  It becomes the
  ``fencekeeper_store_factory`` fixture, which ``StoreTests`` uses when a
  subclass does not override ``store_factory``; a conftest.py fixture of
  that name does the same without the option.
- ``--fencekeeper-session MODULE:CALLABLE`` names a second-session opener
  for the concurrency tests: ``opener(store, clock)`` returns another
  connection to the same database (default:
  :func:`fencekeeper.adapters.testing.concurrency.reopen`).
- ``--fencekeeper-budget NAME|EXAMPLESxSTEPS`` sets the stateful test's
  budget (:mod:`fencekeeper.adapters.testing.budget`).
- ``--fencekeeper-operation-store MODULE:CALLABLE`` does for the operation
  store suite (``OperationStoreTests``) what ``--fencekeeper-store`` does for
  ``StoreTests``, with the same calling rules: it becomes the
  ``fencekeeper_operation_store_factory`` fixture.
- A bad option is one usage error naming it, before any test runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fencekeeper", "fencekeeper store suite (docs/conformance.md)")
    group.addoption(
        "--fencekeeper-store",
        metavar="MODULE:CALLABLE",
        help="the store factory the suite runs against: CALLABLE(clock[, directory]) returns a fresh, empty store",
    )
    group.addoption(
        "--fencekeeper-session",
        metavar="MODULE:CALLABLE",
        help="opens a second session on a store's database for the concurrency tests: CALLABLE(store, clock)",
    )
    group.addoption(
        "--fencekeeper-operation-store",
        metavar="MODULE:CALLABLE",
        help="the operation store factory the operation suite runs against: CALLABLE(clock[, directory])",
    )
    group.addoption(
        "--fencekeeper-budget",
        metavar="NAME|EXAMPLESxSTEPS",
        help="the stateful test's budget: quick, default, ci, or e.g. 500x120 (also FENCEKEEPER_SUITE_BUDGET)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for option in ("fencekeeper_store", "fencekeeper_session", "fencekeeper_operation_store"):
        spec = config.getoption(option)
        if spec is not None:
            try:
                resolve(spec)
            except (ImportError, AttributeError, ValueError) as exc:
                name = "--" + option.replace("_", "-")
                raise pytest.UsageError(f"{name} {spec}: {exc}") from None
    budget = config.getoption("fencekeeper_budget")
    if budget is not None:
        from fencekeeper.adapters.testing import budget as budgets  # noqa: PLC0415 - Hypothesis only when asked for

        try:
            budgets.choose(budget)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None


def resolve(spec: str) -> Any:
    """The object ``MODULE:NAME`` (NAME may be dotted) names, with the current directory on the import path.

    A store's own package usually sits, uninstalled, where its tests are
    run; the ``pytest`` script puts its own directory first on the path,
    not the current one (``python -m pytest`` does), and the command line's
    ``--handler`` and ``--actions`` look there too.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError("expected MODULE:CALLABLE, e.g. mystore.testing:make_store")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"{attribute} is not callable")
    return found


@pytest.fixture
def fencekeeper_store_factory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """The factory ``--fencekeeper-store`` names; override this fixture in a conftest.py to give one in code."""
    spec = request.config.getoption("fencekeeper_store")
    if spec is None:
        raise pytest.UsageError(
            "the store suite needs a store factory: run pytest with --fencekeeper-store MODULE:CALLABLE, define a "
            "fencekeeper_store_factory fixture, or override store_factory in the StoreTests subclass"
        )
    return _factory(spec, tmp_path_factory)


@pytest.fixture
def fencekeeper_operation_store_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Any]:
    """The factory ``--fencekeeper-operation-store`` names; override this fixture in a conftest.py to give one in code."""
    spec = request.config.getoption("fencekeeper_operation_store")
    if spec is None:
        raise pytest.UsageError(
            "the operation store suite needs a store factory: run pytest with --fencekeeper-operation-store "
            "MODULE:CALLABLE, define a fencekeeper_operation_store_factory fixture, or override ops_store_factory "
            "in the OperationStoreTests subclass"
        )
    return _factory(spec, tmp_path_factory)


def _factory(spec: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """The callable ``spec`` names, given a fresh temporary directory on each call if it takes a second argument."""
    factory = resolve(spec)
    if len(inspect.signature(factory).parameters) < 2:
        return factory  # type: ignore[no-any-return]

    def with_directory(clock: Any) -> Any:
        directory: Path = tmp_path_factory.mktemp("store")
        return factory(clock, directory)

    return with_directory


@pytest.fixture
def fencekeeper_store_session(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """The second-session opener ``--fencekeeper-session`` names, or the suite's default."""
    spec = request.config.getoption("fencekeeper_session")
    if spec is not None:
        return resolve(spec)  # type: ignore[no-any-return]
    from fencekeeper.adapters.testing.concurrency import reopen  # noqa: PLC0415 - the suite only when a test runs it

    return reopen
