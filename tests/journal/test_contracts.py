"""The journal's CrossHair contracts are found by their own run, and only by it (tests/contracts)."""

from __future__ import annotations

from tests.contracts.run_crosshair import OWN_RUN, contract_modules


def test_the_journal_contracts_are_checked_in_their_own_run() -> None:
    own = contract_modules(own_run=True)
    functions = {c.function for cs in own.values() for c in cs}
    assert {"fencekeeper.kernel.dag.descendant_closure", "fencekeeper.kernel.journal.link_error"} <= functions
    assert set(own) == OWN_RUN
    assert not set(contract_modules()) & OWN_RUN
