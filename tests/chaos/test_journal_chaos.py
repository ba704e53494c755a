"""The journal's chaos run, small and on SQLite: it ends with ``violations: 0``, and its checks see forged violations.

``make chaos`` runs the real thing (both stores, twenty seconds each); this
keeps the script working in ``make test``: four seconds of faults over
three appenders and two journals, run end to end as ``python -m
tests.chaos.journal``.  Its opening makes the appenders race for one head
before the faults begin, so the run has contention to audit however busy
the machine (a run left to its timing sometimes saw no stale head in four
seconds).  Then a copy of the files it kept is tampered with,
one forgery at a time, past the tables' append-only triggers (dropped and
put back, as someone with the file could), and the checks must report each:
a byte of an acknowledged event changed, and the last acknowledged appends
of a journal cut off with its head row moved back, which the chain alone
cannot show.  A refusal is forged into an appender's log as well: a
``stale_head`` naming the very head the request expected.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.journal import audit, read_logs
from tests.chaos.operations import sqlite_rows

ROOT = Path(__file__).resolve().parents[2]
CHECKS = (
    "each ordinal holds exactly one event",
    "every stored journal replays and journal verify says it is whole",
    "a restart loads each journal to the head and states its bytes replay to",
    "no request id names two sets of events or two digests",
    "every append answered appended or unchanged is stored as answered",
    "no writer was rebased",
    "every refused request left nothing",
    "every answer was the right one",
    "requests of unknown outcome are wholly present or wholly absent",
    "of writers expecting the same head, one appended",
    "every appender kept appending until it was stopped",
)


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    keep = tmp_path_factory.mktemp("jchaos")
    proc = subprocess.run(
        [
            sys.executable, "-m", "tests.chaos.journal", "--store", "sqlite", "--seconds", "4", "--seed", "7",
            "--appenders", "3", "--journals", "2", "--keep", str(keep),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    (directory,) = keep.iterdir()
    return output, directory


def _checked(directory: Path, *, command_line: bool = True) -> list[str]:
    db = directory / "chaos.db"
    violations, _, _ = audit(sqlite_rows(db), directory, str(db), command_line=command_line)
    return violations


def _copy(directory: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(directory, copy)
    return copy


def _forge(db: Path, triggers: tuple[str, ...], statements: list[tuple[str, tuple[object, ...]]]) -> None:
    """Run ``statements`` with the named append-only triggers dropped, then put them back as they were."""
    conn = sqlite3.connect(db)
    try:
        saved = [
            conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (name,)).fetchone()[0]
            for name in triggers
        ]
        for name in triggers:
            conn.execute(f"DROP TRIGGER {name}")
        for sql, params in statements:
            conn.execute(sql, params)
        for sql in saved:
            conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


def _acknowledged(directory: Path, journal: str) -> list[tuple[int, str]]:
    """The ordinal and request id of each event an appender was answered appended with, in ``journal``."""
    found: list[tuple[int, str]] = []
    for entry in read_logs(directory):
        if entry["journal"] != journal:
            continue
        for result in entry.get("results", []):
            if result["outcome"] == "appended":
                found.extend((json.loads(r)["ordinal"], json.loads(r)["request"]["id"]) for r in result["records"])
    assert found, f"no append to {journal} was acknowledged"
    return sorted(found)


def test_a_short_run_ends_with_no_violations(kept: tuple[str, Path]) -> None:
    output, directory = kept
    assert output.rstrip().endswith("violations: 0"), output
    for check in CHECKS:
        assert re.search(rf"^  {check}: .*; 0 violations$", output, re.MULTILINE), (check, output)
    events = re.search(r"^journals: jc-1 (\d+) events, jc-2 (\d+) events$", output, re.MULTILINE)
    assert events is not None and int(events[1]) > 0 and int(events[2]) > 0, output
    answers = re.search(r"^requests: .*answers: (.*)$", output, re.MULTILINE)
    assert answers is not None and "repeat unchanged" in answers[1], output
    # The opening: three appenders sent a step expecting the same head, and the ones that lost were told so.
    assert re.search(r"opening refused \(stale_head\) [12](,|$)", answers[1]), answers[1]
    contended = re.search(r"^  of writers expecting the same head, one appended: (\d+) heads expected by two or more "
                          r"requests, (\d+) of them taken by one; 0 violations$", output, re.MULTILINE)  # fmt: skip
    assert contended is not None and int(contended[1]) >= 1 and int(contended[2]) >= 1, output
    # The same checks over the kept files agree (journal verify, which the run ran, aside).
    assert _checked(directory, command_line=False) == []


def test_an_altered_event_is_reported(kept: tuple[str, Path], tmp_path: Path) -> None:
    copy = _copy(kept[1], tmp_path)
    db = copy / "chaos.db"
    acknowledged = _acknowledged(copy, "jc-1")
    ordinal, request = acknowledged[len(acknowledged) // 2]
    # One byte of the rationale: the record still parses, its digest no longer matches.
    _forge(
        db,
        ("journal_events_no_update",),
        [
            (
                "UPDATE journal_events SET record = CAST(replace(CAST(record AS TEXT), 'chaos step', 'chaos stop') AS BLOB) "
                "WHERE execution_id = 'jc-1' AND ordinal = ?",
                (ordinal,),
            )
        ],
    )
    violations = _checked(copy)
    replays = "every stored journal replays and journal verify says it is whole: jc-1: "
    assert f"{replays}does not replay: the first bad record is {ordinal}: [altered_digest]" in "\n".join(violations), (
        violations
    )
    assert any(v.startswith(f"{replays}journal verify exits 1: ") and "altered_digest" in v for v in violations), (
        violations
    )
    stored = "every append answered appended or unchanged is stored as answered: "
    assert any(
        v.startswith(stored)
        and f"{request} answered appended with event {ordinal}, which the chain holds otherwise" in v
        for v in violations
    ), violations


def test_acknowledged_appends_cut_off_are_reported(kept: tuple[str, Path], tmp_path: Path) -> None:
    copy = _copy(kept[1], tmp_path)
    db = copy / "chaos.db"
    ordinal, request = _acknowledged(copy, "jc-2")[-1]
    conn = sqlite3.connect(db)
    try:
        (previous,) = conn.execute(
            "SELECT json_extract(CAST(record AS TEXT), '$.previous') FROM journal_events "
            "WHERE execution_id = 'jc-2' AND ordinal = ?",
            (ordinal,),
        ).fetchone()
    finally:
        conn.close()
    # Everything from that append on, and the head row moved back to match: a chain that verifies on its own.
    _forge(
        db,
        ("journal_events_no_delete", "journal_heads_move_forward"),
        [
            ("DELETE FROM journal_events WHERE execution_id = 'jc-2' AND ordinal >= ?", (ordinal,)),
            ("UPDATE journal_heads SET head = ?, length = ? WHERE execution_id = 'jc-2'", (previous, ordinal - 1)),
        ],
    )
    violations = _checked(copy)
    assert not any(v.startswith("every stored journal replays") for v in violations), violations
    assert any(
        v.startswith("every append answered appended or unchanged is stored as answered: ")
        and f"{request} answered appended with event {ordinal}, which the chain holds not at all" in v
        for v in violations
    ), violations


def test_a_stale_refusal_of_the_current_head_is_reported(kept: tuple[str, Path], tmp_path: Path) -> None:
    copy = _copy(kept[1], tmp_path)
    # A request that expected the head it found, refused as if another writer had moved it.
    entry = next(e for e in read_logs(copy) if e["outcome"] == "appended")
    name, head = entry["appender"], entry["commands"][0]["expected_head"]
    command = {**entry["commands"][0], "request": f"{name}-forged"}
    with (copy / f"{name}.jsonl").open("a") as handle:
        handle.write(json.dumps({"kind": "request", "appender": name, "n": 10**6, "journal": entry["journal"],
                                 "what": "new", "commands": [command], "t": 0}) + "\n")  # fmt: skip
        handle.write(json.dumps({"kind": "answer", "appender": name, "n": 10**6, "outcome": "refused",
                                 "code": "stale_head", "at": 1, "t": 0,
                                 "message": f"expected head {head}, but the head is {head}"}) + "\n")  # fmt: skip
    violations = _checked(copy, command_line=False)
    assert any(
        v.startswith(f"every answer was the right one: {name} request 1000000 (new, ") and "refused stale_head" in v
        for v in violations
    ), violations
