"""The reference store with its isolation removed: the bug the store layer's races exist to catch.

Each transaction still works on its own snapshot and still checks the guard,
but on that snapshot rather than on the rows as they are at commit, and
without the lock two transactions interleave: the last commit silently
overwrites the first (a lost update), though both report success.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fencekeeper.adapters.memory import MemoryStore, _MemoryBackend
from fencekeeper.adapters.store import Backend


class UnlockedMemoryStore(MemoryStore):
    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Backend]:
        backend = _MemoryBackend(self._rows_now())
        yield backend
        self._rows = backend.rows
