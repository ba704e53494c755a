"""docs/journal.md's Python, run as a reader would paste it, on the page's own example files.

The page's command-line samples are run by tests/journal/test_docs.py; this
runs its one Python block with the values the page says it takes (the
example's workflow, policy and first command), and checks that the first
command of the review is appended.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "journal.md"
EXAMPLE = ROOT / "docs" / "examples" / "journal"


def test_the_pages_python_block_appends_the_reviews_first_command() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(blocks) == 1
    first = (EXAMPLE / "review-1.jsonl").read_text(encoding="utf-8").splitlines()[0]
    namespace: dict[str, Any] = {
        "workflow_json": json.loads((EXAMPLE / "review.workflow.json").read_text(encoding="utf-8")),
        "policy_json": json.loads((EXAMPLE / "review.policy.json").read_text(encoding="utf-8")),
        "command_json": json.loads(first),
        "now": datetime.now(UTC),
    }
    exec(compile(blocks[0], str(PAGE), "exec"), namespace)  # the page's own code, as a reader runs it
    j = namespace["j"]
    outcome = namespace["outcome"]
    assert isinstance(outcome, j.Appended), outcome
    assert outcome.journal.states["search"].value == "active"
    # preview decides and writes nothing: the journal it was given is unchanged.
    assert namespace["journal"].states["search"].value == "ready"
