"""docs/operating.md's log lines against a worker's real ones: the same fields, the same events, the same levels.

An operator writes a log pipeline from the page's sample lines and its
field table; a field the worker writes and the page leaves out (or the
reverse) would break that pipeline without a word.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.cli.runner import EXAMPLES, fencekeeper, ok

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


def _page_lines() -> list[dict[str, object]]:
    block = re.search(r"```json\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert block is not None
    return [json.loads(line) for line in block.group(1).splitlines()]


def _table_fields() -> set[str]:
    section = PAGE.read_text(encoding="utf-8").split("## Logs", 1)[1].split("## Metrics", 1)[0]
    fields: set[str] = set()
    for row in re.findall(r"^\| (`[^|]+`) \|", section, flags=re.MULTILINE):
        fields.update(re.findall(r"`([a-z_]+)`", row))
    return fields


def test_the_pages_log_lines_have_the_fields_a_worker_writes(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    order = '{"amount": 50, "order_id": "o-1", "order_revision": 1}'
    ok("run", EXAMPLES / "purchase_approval.toml", "--db", db, "--input", order, "--id", "po-1", cwd=tmp_path)
    refund = '{"amount": 40, "payment_id": "p-7"}'
    ok("run", EXAMPLES / "refund_needs_reconciliation.toml", "--db", db, "--input", refund, "--id", "rf-1", cwd=tmp_path)
    result = fencekeeper(
        "worker", "--db", db, "--until-idle", "--log-json", "--metrics-port", "127.0.0.1:0", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    real = [json.loads(line) for line in result.stderr.splitlines()]
    by_event: dict[str, dict[str, object]] = {}
    for line in real:
        by_event.setdefault(line["event"], line)  # the first of each: po-1's first step is check_amount
    assert {"claimed", "step", "command", "succeeded", "reconciliation_required"} <= set(by_event)

    documented = _page_lines()
    for line in documented:
        # A refusal is hard to provoke in a few seconds; its fields are those of every other worker line.
        assert list(line) == list(by_event["claimed"]), f"the page's {line['event']} line: {list(line)}"
    assert by_event["claimed"]["node_id"] is None and by_event["step"]["node_id"] == "check_amount"
    assert by_event["succeeded"]["level"] == "info" and by_event["reconciliation_required"]["level"] == "error"
    # Every field of every line but the time is explained in the page's table, the worker's own lines' too.
    assert "metrics_listening" in by_event
    for line in real:
        assert set(line) - {"ts"} <= _table_fields(), line
