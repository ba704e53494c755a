"""Fixtures shared by the journal's tests."""

from __future__ import annotations

import pytest

from fencekeeper.kernel import journal as j

from .examples import Driver, bind, fresh, invalidate_screening, reviewed, stored


@pytest.fixture(scope="module")
def chain() -> tuple[j.Journal, bytes, list[bytes]]:
    """The worked example's journal, with an invalidation and a successor bound: its header and event bytes."""
    driver = reviewed(Driver(fresh()))
    invalidate_screening(driver)
    bind(driver, fresh("review-2", supersedes="review-1"))
    header, events = stored(driver.journal)
    return driver.journal, header, events
