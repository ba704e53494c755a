"""The chaos run, small and on SQLite only: it ends with ``violations: 0``, and its audit sees forged violations.

``make chaos`` runs the real thing (both stores, minutes); this keeps the
script itself working in ``make test``: a few seconds of faults over a
handful of executions, run end to end as ``python -m tests.chaos.run``.
Then the files it kept are tampered with, one forgery at a time, and the
audit must report each: a write made after its lease expired, a write made
with a lease that had been replaced, and a Command that took effect twice.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.chaos.run import audit_kept_sqlite

ROOT = Path(__file__).resolve().parents[2]
LEASE = 1.0


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    keep = tmp_path_factory.mktemp("chaos")
    proc = subprocess.run(
        [
            sys.executable, "-m", "tests.chaos.run", "--store", "sqlite", "--seconds", "5", "--seed", "7",
            "--workers", "2", "--lease", str(LEASE), "--max-executions", "12", "--keep", str(keep),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    (directory,) = keep.iterdir()
    return output, directory


def test_a_short_run_ends_with_no_violations(kept: tuple[str, Path]) -> None:
    output, _ = kept
    assert output.rstrip().endswith("violations: 0"), output
    # Every check ran and printed its count.
    for check in (
        "every admission is present",
        "every write came under a live, current lease",
        "no refused write landed, no accepted write lost",
        "every command took effect at most once",
        "the rows agree",
        "no execution is stuck",
    ):
        assert re.search(rf"^  {check}: .*; 0 violations$", output, re.MULTILINE), (check, output)
    admitted = re.search(r"every admission is present: (\d+) admitted, (\d+) present", output)
    assert admitted is not None and 0 < int(admitted[1]) == int(admitted[2]) <= 12, output
    assert re.search(r"(\d+) leases, (\d+) writes on them replayed", output), output


def _copy(directory: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(directory, copy)
    return copy


def _claims(db: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(
            "SELECT * FROM execution_transitions WHERE event = 'claim' ORDER BY execution_id, revision"
        ).fetchall()
    finally:
        conn.close()


def _forge_renewal(db: Path, under: sqlite3.Row, credential: sqlite3.Row, at: datetime) -> None:
    """A renewal at ``under``'s revision, with ``credential``'s worker, token and fence, committed ``at``."""
    conn = sqlite3.connect(db)
    try:
        conn.execute(
            "INSERT INTO transitions (execution_id, event, from_state, to_state, revision, at, actor, lease_token, "
            "fence, reason) VALUES (?, 'renew', 'running', 'running', ?, ?, ?, ?, ?, 'forged')",
            (
                under["execution_id"], under["revision"], at.isoformat(), credential["actor"],
                credential["lease_token"], credential["fence"],
            ),
        )
        conn.commit()
    finally:
        conn.close()


def test_the_audit_of_the_kept_files_agrees(kept: tuple[str, Path]) -> None:
    _, directory = kept
    violations, checks, _ = audit_kept_sqlite(directory, LEASE)
    assert violations == [], violations
    assert len(checks) == 7  # seven checks, each with its counts


def test_a_write_after_the_lease_expired_is_reported(kept: tuple[str, Path], tmp_path: Path) -> None:
    copy = _copy(kept[1], tmp_path)
    claim = _claims(copy / "chaos.db")[0]
    late = datetime.fromisoformat(claim["at"]) + timedelta(seconds=LEASE + 1)
    _forge_renewal(copy / "chaos.db", claim, claim, late)
    violations, _, _ = audit_kept_sqlite(copy, LEASE)
    where = f"{claim['execution_id']} revision {claim['revision']} renew by {claim['actor']}"
    assert any(v.startswith("every write came under a live, current lease") and where in v
               and "after the lease expired" in v for v in violations), violations
    assert any(v.startswith("no refused write landed") and "no request of that worker was accepted" in v
               for v in violations), violations


def test_a_write_with_a_replaced_lease_is_reported(kept: tuple[str, Path], tmp_path: Path) -> None:
    copy = _copy(kept[1], tmp_path)
    claims = _claims(copy / "chaos.db")
    # A stale credential: an earlier claim's token and fence, presented while a later claim's lease is open.
    # Where no execution was claimed twice, a credential of another execution stands in for it.
    by_execution: dict[str, list[sqlite3.Row]] = {}
    for c in claims:
        by_execution.setdefault(c["execution_id"], []).append(c)
    twice = [cs for cs in by_execution.values() if len(cs) > 1]
    old, current = (twice[0][0], twice[0][1]) if twice else (claims[1], claims[0])
    at = datetime.fromisoformat(current["at"]) + timedelta(seconds=LEASE / 10)
    _forge_renewal(copy / "chaos.db", current, old, at)
    violations, _, _ = audit_kept_sqlite(copy, LEASE)
    assert any(v.startswith("every write came under a live, current lease") and "but the open lease is" in v
               for v in violations), violations


def test_a_command_that_took_effect_twice_is_reported(kept: tuple[str, Path], tmp_path: Path) -> None:
    copy = _copy(kept[1], tmp_path)
    effects = copy / "effects.jsonl"
    applied = [json.loads(line) for line in effects.read_text().splitlines() if '"kind": "applied"' in line]
    assert applied, "the run applied no Command"
    with effects.open("a") as handle:
        handle.write(json.dumps(applied[0], sort_keys=True) + "\n")
    violations, _, _ = audit_kept_sqlite(copy, LEASE)
    command_id = applied[0]["command_id"]
    assert f"every command took effect at most once: {command_id} took effect 2 times" in violations, violations
