"""The whole store suite as a test module, for ``pytest --pyargs`` with a factory named on the command line.

::

    pytest --pyargs fencekeeper.adapters.testing.run_suite --fencekeeper-store mystore.testing:make_store

``--fencekeeper-store`` (the pytest plugin this package installs) names the
factory; ``--fencekeeper-session`` optionally names a second-session
opener for the concurrency tests, and ``--fencekeeper-budget`` the stateful
budget (docs/conformance.md, The Python store suite).
"""

from __future__ import annotations

from .store_tests import StoreTests


class TestStore(StoreTests):
    """Every test of the suite, against the store ``--fencekeeper-store`` (or a ``fencekeeper_store_factory`` fixture) makes."""
