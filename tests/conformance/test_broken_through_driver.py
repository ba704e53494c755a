"""The language-neutral store cases, run through the driver protocol, catch the stores broken on purpose.

Every variant in tests/conformance/broken (and every correct store) is
driven by ``runner.run_factory``: the same JSON requests and responses a
driver in another language answers, here answered in this process by the
Python store driver.  A variant is caught when at least one store case
fails; a correct store must pass every one.

The runs go on in threads at once: a run spends most of its time waiting
(each race waits a fifth of a second for a session that a correct store
blocks), so the whole check takes about as long as the slowest few runs.

A race holds its first session at one of two points (specs/conformance.md,
Holds): its commit point, or its first clock read.  The second is what
catches ``claim-candidate-before-lock``, which picks its candidate from a
snapshot taken before its transaction begins: held at the clock, between
that snapshot and its transaction, it claims what the other session has
already claimed.  No variant is exempt.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters.conformance.runner import LayerReport, run_factory

from .broken import CORRECT, DESCRIPTIONS, VARIANTS, Maker


def _run(make: Maker, directory: Path) -> LayerReport:
    def factory(clock: Any) -> Any:
        return make(clock, directory)

    (report,) = run_factory(factory)
    return report


@pytest.fixture(scope="module")
def reports() -> dict[str, LayerReport]:
    stores = {**VARIANTS, **CORRECT}
    with tempfile.TemporaryDirectory() as directory, ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(_run, make, Path(directory)) for name, make in stores.items()}
        return {name: future.result(timeout=300) for name, future in futures.items()}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_store_cases_catch_the_broken_store(name: str, reports: dict[str, LayerReport]) -> None:
    report = reports[name]
    assert report.passed + report.failed > 0, "no store case ran"
    assert report.failed, f"{name} ({DESCRIPTIONS[name]}) passed all {report.passed} store cases"


def test_the_clock_hold_is_what_catches_a_candidate_chosen_before_the_transaction(
    reports: dict[str, LayerReport],
) -> None:
    # Held only at commit, the other session's snapshot waits behind the held transaction and the
    # serial outcome follows: only the races held at the clock can fail this store.
    report = reports["claim-candidate-before-lock"]
    assert report.first_failure is not None
    assert report.first_failure["id"].startswith("race/at_clock/claim_races_claim"), report.first_failure["id"]


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_store_passes_every_store_case(name: str, reports: dict[str, LayerReport]) -> None:
    report = reports[name]
    assert report.skipped == 0
    assert report.failed == 0, f"{name} failed: {report.first_failure}"
