"""Shared fixtures: where the repository's committed files are."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs" / "machines"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT
