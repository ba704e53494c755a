"""docs/chaos.md's tables of checks are the checks each chaos run makes, no more and no fewer.

Each run (tests/chaos/run.py, operations.py, journal.py) names its checks
in calls ``check("name", summary, problems)`` and prints them by those
names; the page lists them, one table a run, in its first column.  A check
added to a run, renamed or removed fails here until the page says so.  The
runs themselves are not started: they take minutes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "chaos.md"

RUNS = {
    "run.py": "## What the audit checks\n",
    "operations.py": "### What the checks check\n",
    "journal.py": "## Journal\n",
}


def _checks_of(module: str) -> set[str]:
    tree = ast.parse((ROOT / "tests" / "chaos" / module).read_text(encoding="utf-8"))
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "check"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


def _first_table_after(heading: str) -> set[str]:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(heading)
    table = re.search(r"^\| check \| from \| a violation is \|\n\|[-| ]+\|\n((?:\|.*\n)+)", text[start:], re.M)
    assert table is not None, f"no table of checks after {heading.strip()!r}"
    return {row.split("|")[1].strip() for row in table.group(1).splitlines()}


@pytest.mark.parametrize("module", sorted(RUNS))
def test_the_page_lists_exactly_the_checks_the_run_makes(module: str) -> None:
    made = _checks_of(module)
    assert len(made) >= 5, made
    listed = _first_table_after(RUNS[module])
    assert listed == made, {"not on the page": sorted(made - listed), "not made": sorted(listed - made)}
