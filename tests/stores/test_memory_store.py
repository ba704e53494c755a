"""The in-memory reference store passes the shipped store suite, run exactly as a third party runs it.

One import and one fixture: every conformance test of
``fencekeeper.adapters.testing.StoreTests`` runs against ``MemoryStore``, and
the stateful machine compares it with the pure kernel model request by
request.
"""

from __future__ import annotations

import pytest

from fencekeeper.adapters.memory import MemoryStore
from fencekeeper.adapters.store import ManualClock
from fencekeeper.adapters.testing import StoreFactory, StoreTests


def make_store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock)


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        return make_store

