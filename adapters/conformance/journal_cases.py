"""The ``journal`` layer: replay of the journal fixture pack (specs/journal.md, section 9) through the driver protocol.

Rules of this module:

- The inputs are the pack's own files (``specs/journal/fixtures``): the
  workflow, the policy and each chain, its lines as text exactly as stored
  (a non-canonical line must reach the implementation unchanged), and the
  other executions' headers the case's successor lookup finds (none for
  most cases).  A header file is read by the same rule: exactly one
  canonical header record and its newline, or an error naming the file.
- A chain file is split into lines by the reader ``journal verify --file``
  uses (``journal_fixtures.read_chain``), so the pack is framed by one rule
  (specs/journal.md, section 9).  A chain whose last line has no newline is
  refused, naming the file: its fault is in the framing, which the lines a
  driver is given cannot carry, so no driver could reach its expectation.
- The expectation is the kernel's replay of that input; a test checks it
  agrees with the pack's manifest.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path
from typing import Any

from fencekeeper.kernel import journal as j
from fencekeeper.kernel.dag import verify_workflow, workflow_from_json
from fencekeeper.kernel.journal_codes import JournalCode, JournalError

from .. import journal_fixtures

Case = dict[str, Any]


def pack() -> Path:
    return Path(str(importlib.resources.files("fencekeeper") / "specs" / "journal" / "fixtures"))


def replay_answer(data: dict[str, Any]) -> dict[str, Any]:
    """The kernel's replay of one journal case, in the layer's output form."""
    try:
        workflow = verify_workflow(workflow_from_json(data["workflow"]))
        policy = j.verify_policy(j.policy_from_json(data["policy"]), workflow)
        lines = [line.encode("utf-8") for line in data["chain"]]
        # The successor lookup finds exactly the case's headers.
        known = {h.execution_id: h for h in (j.decode_header(line.encode("utf-8")) for line in data["headers"])}
        journal = j.replay(lines[0], lines[1:], workflow, policy, headers=known.get)
    except JournalError as exc:
        return {"valid": False, "code": str(getattr(exc.code, "value", exc.code)), "ordinal": exc.ordinal}
    return {
        "valid": True,
        "code": None,
        "ordinal": None,
        "head": journal.head,
        "events": len(journal.events),
        "states": {node: state.value for node, state in sorted(journal.states.items())},
        "attempts": {
            node: [{"id": a.attempt_id, "sequence": a.sequence, "status": a.status.value} for a in history]
            for node, history in sorted(journal.attempts.items())
        },
    }


def chain_lines(path: Path) -> list[str]:
    """A chain file's lines as text, each without its newline; ValueError naming the file if it is not framed."""
    try:
        header, events = journal_fixtures.read_chain(path)
        records = [header, *events]
    except JournalError as exc:
        raise ValueError(f"{path}: {exc} [{exc.code}]") from None
    return [record.decode("utf-8") for record in records]


def _header_line(path: Path) -> str:
    """A header file's one record as text, without its newline; ValueError naming the file if it is not exactly that.

    Framed as a chain file is (one record's canonical bytes and a newline,
    specs/journal.md, section 9), by the same reader: a missing or extra
    newline, trailing spaces or a carriage return were trimmed or kept
    silently, and a header that then did not decode changed the expectation
    of every case that looks it up instead of naming the file.
    """
    try:
        line, rest = journal_fixtures.read_chain(path)
        if len(rest):
            raise JournalError(
                JournalCode.NON_CANONICAL,
                f"a header file holds one record and its newline, found {len(rest) + 1} lines",
                0,
            )
        j.decode_header(line)
    except JournalError as exc:
        raise ValueError(f"{path}: {exc} [{exc.code}]") from None
    return line.decode("utf-8")


def journal_cases(directory: Path | None = None) -> list[Case]:
    """The layer's cases, from the pack in ``directory`` (the installed one by default)."""
    directory = pack() if directory is None else directory
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    workflow = json.loads((directory / manifest["workflow"]).read_text(encoding="utf-8"))
    policy = json.loads((directory / manifest["policy"]).read_text(encoding="utf-8"))
    cases = []
    for entry in manifest["cases"]:
        lines = chain_lines(directory / entry["chain"])
        headers = [_header_line(directory / name) for name in entry.get("headers", [])]
        data = {"workflow": workflow, "policy": policy, "chain": lines, "headers": headers}
        expected = replay_answer(data)
        normative = ["valid", "code", "ordinal"] + (["head", "events", "states", "attempts"] if expected["valid"] else [])
        cases.append({"id": f"journal/{entry['name']}", "input": data, "expected": expected, "normative": normative})
    return cases
