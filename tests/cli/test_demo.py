"""``fencekeeper demo`` (what ``make demo`` runs), through the installed console script.

The demo is a real scenario, so the test checks what the store and kernel
did, read from the demo's own output and then from the database it keeps:
the paused worker's late writes are refused with the fencing codes, the
final states are the ones the decisions lead to, and the ``inspect`` command
the demo prints works on the file it names.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.cli.runner import fencekeeper, ok

FINAL_STATES = {"po-1": "succeeded", "po-2": "succeeded", "po-3": "failed", "po-4": "waiting"}


def test_demo_fences_out_the_paused_worker_and_reaches_the_final_states(tmp_path: Path) -> None:
    # The demo's fresh SQLite file goes to a temporary directory; here, one inside tmp_path.
    result = fencekeeper("demo", cwd=tmp_path, env={"TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    out = result.stdout
    lines = out.splitlines()

    def first(pattern: str) -> int:
        found = [n for n, line in enumerate(lines) if re.search(pattern, line)]
        assert found, f"no line matches {pattern!r} in:\n{out}"
        return found[0]

    # w-1 claims, pauses past its lease, and is refused twice: expired, then replaced.
    claimed = first(r"w-1\s+po-1\s+claim\s+eligible -> running\s+fence 1 token [0-9a-f]{8}")
    expired = first(r"w-1\s+po-1\s+record_step\s+REFUSED \[lease_expired\]")
    quarantined = first(r"user:operator\s+po-1\s+quarantine_expired\s+running -> reconciliation_required")
    resumed = first(r"user:operator\s+po-1\s+resume_safe\s+reconciliation_required -> eligible")
    reclaimed = first(r"w-2\s+po-1\s+claim\s+eligible -> running\s+fence 2 token [0-9a-f]{8}")
    replaced = first(r"w-1\s+po-1\s+record_step\s+REFUSED \[lease_token_mismatch\]")
    assert claimed < expired < quarantined < resumed < reclaimed < replaced
    # The decisions: accepted and woken, idempotent, kept in history, a rejection, a refusal.
    accepted = first(r"user:manager\s+po-1\s+decide approved\s+accepted")
    assert first(r"user:manager\s+po-1\s+wake\s+waiting -> eligible") > accepted
    assert first(r"user:manager\s+po-1\s+decide approved\s+unchanged \[already_decided\]") > accepted
    assert "kept in history" in lines[first(r"user:cfo\s+po-1\s+decide rejected")]
    assert first(r"user:operator\s+po-4\s+decide approved\s+REFUSED \[not_authorized\]") > accepted

    table = lines[first(r"^execution\s+amount\s+state") + 1 :]
    states = {row.split()[0]: row.split()[2] for row in table if row.startswith("po-")}
    assert states == FINAL_STATES
    assert "w-1 was refused twice and changed nothing" in out

    # The inspect command it prints works: the database was kept.
    command = shlex.split(lines[first(r"^\s+fencekeeper inspect po-1 --db ")])
    database = Path(command[command.index("--db") + 1])
    assert database.is_file() and tmp_path in database.parents
    inspected = ok(*command[1:], cwd=tmp_path).stdout
    assert re.search(r"\bw-1\s+[0-9a-f]{8}\s+1\s+claim: eligible -> running", inspected)
    assert re.search(r"quarantine_expired: running -> reconciliation_required", inspected)
    assert re.search(r"finalize_succeeded: running -> succeeded", inspected)
    assert "decision d-po-1-2 by user:cfo: rejected" in inspected
    listed = ok("list", "--db", database, "--json", cwd=tmp_path).stdout
    assert '"state": "waiting"' in listed


def test_demo_writes_the_fenced_out_execution_as_a_sequence_diagram_beside_its_database(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = fencekeeper("demo", "--db", db, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    said = next(n for n, line in enumerate(lines) if "as a mermaid sequence diagram" in line)
    picture = Path(lines[said + 1].strip())
    assert picture == tmp_path / "po-1.sequence.mmd" and picture.is_file()
    diagram = picture.read_text(encoding="utf-8")
    # What inspect --format mermaid draws from the store, and the two refusals only the run saw, in order.
    stored = ok("inspect", "po-1", "--db", db, "--format", "mermaid", cwd=tmp_path).stdout
    refusals = [line for line in diagram.splitlines() if "--x" in line]
    assert [re.sub(r".*REFUSED (\w+).*", r"\1", r) for r in refusals] == ["lease_expired", "lease_token_mismatch"]
    assert all("(returned, not stored)" in r for r in refusals)
    assert "--x" not in stored
    without = [line for line in diagram.splitlines() if "--x" not in line and "(its old lease)" not in line]
    assert without == stored.splitlines()
    # Inspect alone draws every participant, every claim with its fence, the decisions and the recovery.
    for declared in (
        "actor P1 as user:operator",
        "actor P2 as user:manager",
        "actor P3 as user:cfo",
        "participant S as store",
        "participant W1 as w-1",
        "participant W2 as w-2",
        "participant H as command handler",
    ):
        assert f"    {declared}\n" in stored, declared
    moments = [
        "S-->>W1: eligible -> running: lease fence 1",
        "P1->>S: quarantine_expired",
        "P1->>S: resume_safe",
        "Note over S: proof from the stored facts",
        "S-->>W2: eligible -> running: lease fence 2",
        "W2->>S: finalize_waiting (fence 2)",
        "P2->>S: decide approved",
        "wake: waiting -> eligible",
        "rejected_conflict",
        "S-->>W2: eligible -> running: lease fence 3",
        "W2->>H: execute order.place",
        "S-->>W2: running -> succeeded",
    ]
    at = [stored.find(m) for m in moments]
    assert -1 not in at and at == sorted(at), dict(zip(moments, at, strict=True))
    order = [diagram.index(s) for s in ("lease fence 1", "lease_expired", "quarantine_expired", "lease fence 2",
                                        "lease_token_mismatch")]
    assert order == sorted(order)
