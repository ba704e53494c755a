"""The SQLite store passes the shipped store suite, run exactly as a third party runs it.

One import and one fixture: every conformance test of
``fencekeeper.adapters.testing.StoreTests`` runs against a ``SQLiteStore`` in
a fresh file under ``tmp_path`` (WAL, synchronous FULL: the real settings),
and the stateful machine compares it with the pure kernel model request by
request, one new database file per Hypothesis example.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fencekeeper.adapters.sqlite_store import SQLiteStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing import StoreFactory, StoreTests


def factory_in(directory: Path) -> StoreFactory:
    names = itertools.count(1)

    def make(clock: ManualClock) -> SQLiteStore:
        return SQLiteStore(directory / f"store-{next(names)}.db", clock=clock)

    return make


class TestSQLiteStore(StoreTests):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> StoreFactory:
        return factory_in(tmp_path)

