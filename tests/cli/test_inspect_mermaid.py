"""``fencekeeper inspect ID --format mermaid``: the history as a sequence diagram, drawn from stored facts only.

What it proves, on a real run through the command line (a refund whose
reply is lost, settled by asking the handler, resumed, finished):

- every transition record is drawn exactly once, as a reply naming its
  revision, and every claim shows its fence and token prefix;
- the settlement is drawn as the handler's reconcile (never execute) before
  the recovery that records it, and the resume shows its proof;
- every line is a mermaid statement over declared participants, so a
  stored value cannot break the picture;
- reading writes nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fencekeeper.adapters.sequence import label
from tests.cli.runner import EXAMPLES, data, ok, snapshot

REFUND = EXAMPLES / "refund_needs_reconciliation.toml"
_STATEMENT = re.compile(
    r"^(sequenceDiagram"
    r"|    title .+"
    r"|    (actor|participant) (?P<declared>\w+) as .+"
    r"|    (?P<source>\w+)(->>|-->>|--x)(?P<target>\w+): .+"
    r"|    Note over (?P<over>\w+): .+)$"
)


def _refund_settled_and_finished(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    ok("run", REFUND, "--db", db, "--id", "r-1", "--input", '{"amount": 10, "payment_id": "pay-1"}', cwd=tmp_path)
    ok("worker", "--db", db, "--until-idle", cwd=tmp_path)
    ok("reconcile", "r-1", "--db", db, "--settle", cwd=tmp_path)
    ok("reconcile", "r-1", "--db", db, "--resume-at", "refunded", "--because", "the provider applied it", cwd=tmp_path)
    ok("worker", "--db", db, "--until-idle", cwd=tmp_path)


def test_the_diagram_draws_every_record_once_and_every_claim_with_its_fence(tmp_path: Path) -> None:
    _refund_settled_and_finished(tmp_path)
    db = tmp_path / "shop.db"
    before = snapshot(tmp_path)
    diagram = ok("inspect", "r-1", "--db", db, "--format", "mermaid", cwd=tmp_path).stdout
    assert snapshot(tmp_path) == before
    history = data("inspect", "r-1", "--db", db, cwd=tmp_path)["history"]
    lines = diagram.splitlines()
    assert lines[0] == "sequenceDiagram"
    for record in history:
        replies = [
            line for line in lines if "-->>" in line and re.search(rf"\brevision {record['revision']}\b(?!\d)", line)
        ]
        assert len(replies) == 1, (record, replies)
        if record["event"] == "claim":
            assert f"lease fence {record['fence']}, token {record['lease_token'][:8]}" in replies[0]
    settle = next(n for n, line in enumerate(lines) if "reconcile r-1/a2/command (never execute)" in line)
    assert "H-->>P1: succeeded" in lines[settle + 1]
    assert "reconcile_command" in lines[settle + 2]
    assert any(
        line.startswith("    Note over S: proof from the stored facts: 1 Command(s), every one settled")
        for line in lines
    )
    assert "execute payment.refund r-1/a2/command (fence 1)" in diagram
    assert lines[-1].startswith("    Note over S: now succeeded at refunded, fence 2")


def test_every_line_is_a_statement_over_declared_participants(tmp_path: Path) -> None:
    _refund_settled_and_finished(tmp_path)
    diagram = ok("inspect", "r-1", "--db", tmp_path / "shop.db", "--format", "mermaid", cwd=tmp_path).stdout
    declared: set[str] = set()
    for line in diagram.splitlines():
        m = _STATEMENT.match(line)
        assert m, f"not a mermaid statement: {line!r}"
        if m.group("declared"):
            declared.add(m.group("declared"))
        for used in (m.group("source"), m.group("target"), m.group("over")):
            assert used is None or used in declared, f"{used} is not declared: {line!r}"


def test_json_wraps_the_same_diagram(tmp_path: Path) -> None:
    _refund_settled_and_finished(tmp_path)
    db = tmp_path / "shop.db"
    plain = ok("inspect", "r-1", "--db", db, "--format", "mermaid", cwd=tmp_path).stdout
    wrapped = json.loads(ok("inspect", "r-1", "--db", db, "--format", "mermaid", "--json", cwd=tmp_path).stdout)
    assert wrapped == {"execution_id": "r-1", "mermaid": plain}


def test_a_stored_value_cannot_end_a_message_or_open_a_tag() -> None:
    hostile = "a;b#c<script>\nNote over S: forged\u202e"
    shown = label(hostile)
    assert (
        "\n" not in shown
        and "<" not in shown
        and ";" not in shown.replace("#59;", "").replace("#35;", "").replace("#60;", "")
    )
    assert shown.startswith("a#59;b#35;c#60;script>")
    assert "\\x0aNote over S" in shown and "\\u202e" in shown
