"""The store test suite, shipped with the package so that any store can prove it keeps the protocol.

A store is correct when it applies the kernel's decisions exactly: every
outcome is the one ``fencekeeper.kernel.protocol`` returns for the rows as
they are, a decision's writes land together or not at all, and a refused
request leaves the store exactly as it was.  This package checks that
through the :class:`~fencekeeper.adapters.store.Store` port alone, so it
runs unchanged against the in-memory reference store, the SQLite store and
a store written elsewhere:

- :class:`StoreTests`, an abstract pytest base class: subclass it, provide
  one ``store_factory`` fixture (a callable that takes a
  :class:`~fencekeeper.adapters.store.ManualClock` and returns a fresh,
  empty store reading its time from that clock) and the subclass inherits
  the conformance tests;
- :func:`run_store_state_machine`, which drives random request sequences
  against the store and against a pure kernel model kept beside it
  (:class:`StoreStateMachine`), comparing every outcome and every view.

Example (a complete test module for a third-party store)::

    import itertools

    import pytest

    from fencekeeper.adapters.testing import StoreFactory, StoreTests, run_store_state_machine
    from mystore import MyStore

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store_factory(self, tmp_path) -> StoreFactory:
            names = itertools.count()
            return lambda clock: MyStore(tmp_path / f"{next(names)}.db", clock=clock)

    def test_stateful_matches_kernel_model(tmp_path):
        names = itertools.count()
        run_store_state_machine(lambda clock: MyStore(tmp_path / f"m{next(names)}.db", clock=clock))

The suite needs pytest and Hypothesis (the ``dev`` extra); importing this
package without them fails, which is the only cost to code that never
imports it.
"""

from .stateful import DEFAULT_SETTINGS, StoreStateMachine, run_store_state_machine
from .suite import StoreFactory, StoreTests

__all__ = ["DEFAULT_SETTINGS", "StoreFactory", "StoreStateMachine", "StoreTests", "run_store_state_machine"]
