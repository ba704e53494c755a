"""The whole operation store suite as a test module, for ``pytest --pyargs`` with a factory named on the command line.

::

    pytest --pyargs fencekeeper.adapters.testing.run_operations_suite --fencekeeper-operation-store mystore.testing:make

``--fencekeeper-operation-store`` (the pytest plugin this package installs)
names the factory (docs/conformance.md, The operation store suite).
"""

from __future__ import annotations

from .operations_suite import OperationStoreTests


class TestOperationStore(OperationStoreTests):
    """Every test of the suite, against the store ``--fencekeeper-operation-store`` (or a ``fencekeeper_operation_store_factory`` fixture) makes."""
