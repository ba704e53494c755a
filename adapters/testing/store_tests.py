"""StoreTests: the whole store suite as one pytest base class, the only thing a store's tests subclass.

It gathers, for one ``store_factory``:

- the request-by-request tests (:mod:`~fencekeeper.adapters.testing.suite`);
- the tests of the port's less travelled parts: due-timer scoping and
  order, Event lookup across Businesses, evidence revisions, one identity
  space, microseconds (:mod:`~fencekeeper.adapters.testing.port_suite`);
- the concurrency tests, two requests held together between their reads
  and their commits (:mod:`~fencekeeper.adapters.testing.races`);
- the stateful test against the kernel model, under the chosen budget
  (:mod:`~fencekeeper.adapters.testing.stateful`,
  :mod:`~fencekeeper.adapters.testing.budget`).
"""

from __future__ import annotations

from .port_suite import PortTests
from .races import RaceTests
from .stateful import run_store_state_machine
from .suite import StoreFactory


class StoreTests(PortTests, RaceTests):
    """Conformance tests for a store.  Subclass it and provide the store factory; nothing else is needed.

    The factory is the ``store_factory`` fixture (override it in the
    subclass), or else the ``fencekeeper_store_factory`` fixture (a
    conftest.py, or the pytest plugin's ``--fencekeeper-store``): a callable
    that takes a :class:`~fencekeeper.adapters.store.ManualClock` and returns
    a fresh, empty store reading its time from it.  The class name does not
    start with ``Test``, so pytest collects only the subclasses, once per
    store.
    """

    def test_stateful_machine_agrees_with_the_kernel_model(self, store_factory: StoreFactory) -> None:
        run_store_state_machine(store_factory)


__all__ = ["StoreTests"]
