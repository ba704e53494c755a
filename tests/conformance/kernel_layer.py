"""One layer of the committed cases run through the driver protocol in this process, against the kernel.

For the layers a driver answers from the pure kernel alone (``journal-append``,
``interpreter``): no store is made.  A test breaks a rule of the kernel first
(with ``monkeypatch``), so the report says whether the cases catch it.
"""

from __future__ import annotations

from typing import Any

from fencekeeper.adapters.conformance.runner import InProcessDriver, LayerReport, run


def run_kernel_layer(layer: str, declared: tuple[str, ...] | None = None) -> LayerReport:
    """The report of ``layer``'s cases; ``declared``: the layers a driver of an earlier version declares instead."""

    def no_store(clock: Any) -> None:
        raise AssertionError(f"the {layer} layer needs no store")

    driver = InProcessDriver(no_store)
    if declared is not None:
        driver._layers = declared
    (report,) = run(driver, layers=(layer,))
    return report
