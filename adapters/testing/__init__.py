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
  every test: request by request, the port's less travelled parts, two
  requests racing between their reads and their commits, and the stateful
  comparison with a pure kernel model (:class:`StoreStateMachine`) under
  a budget (:mod:`~fencekeeper.adapters.testing.budget`);
- the pytest plugin (``pytest11`` entry point ``fencekeeper``), with which
  a factory named on the command line is enough:
  ``pytest --pyargs fencekeeper.adapters.testing.run_suite --fencekeeper-store mystore:make_store``;
- :class:`OperationStoreTests`, the same for an operation store (durable
  operations, through the ``OperationStore`` port and the service): subclass
  it with an ``ops_store_factory`` fixture, or run ``pytest --pyargs
  fencekeeper.adapters.testing.run_operations_suite
  --fencekeeper-operation-store mystore:make_operation_store``.

Example (a complete test module for a third-party store)::

    import itertools

    import pytest

    from fencekeeper.adapters.testing import StoreFactory, StoreTests
    from mystore import MyStore

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store_factory(self, tmp_path) -> StoreFactory:
            names = itertools.count()
            return lambda clock: MyStore(tmp_path / f"{next(names)}.db", clock=clock)

docs/conformance.md (The Python store suite) has the rest: the second
session the concurrency tests open, and the budget options.

The suite needs pytest and Hypothesis (``pip install 'fencekeeper[testing]'``); importing this
package without them fails, which is the only cost to code that never
imports it.
"""

from .budget import BUDGETS, Budget
from .concurrency import RendezvousClock, SessionOpener, race, reopen, same_session
from .operations_suite import OperationStoreTests, OpsStoreFactory, run_operation_state_machine
from .stateful import DEFAULT_SETTINGS, StoreStateMachine, normative, run_store_state_machine
from .store_tests import StoreTests
from .suite import StoreFactory

__all__ = [
    "BUDGETS",
    "DEFAULT_SETTINGS",
    "Budget",
    "OperationStoreTests",
    "OpsStoreFactory",
    "RendezvousClock",
    "SessionOpener",
    "StoreFactory",
    "StoreStateMachine",
    "StoreTests",
    "normative",
    "race",
    "reopen",
    "run_operation_state_machine",
    "run_store_state_machine",
    "same_session",
]
