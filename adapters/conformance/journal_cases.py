"""The ``journal`` layer: replay of the journal fixture pack (specs/journal.md, section 9) through the driver protocol.

Rules of this module:

- The inputs are the pack's own files (``specs/journal/fixtures``): the
  workflow, the policy and each chain, its lines as text exactly as stored
  (a non-canonical line must reach the implementation unchanged), and the
  other executions' headers the case's successor lookup finds (none for
  most cases).
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
from fencekeeper.kernel.journal_codes import JournalError

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


def journal_cases() -> list[Case]:
    directory = pack()
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    workflow = json.loads((directory / manifest["workflow"]).read_text(encoding="utf-8"))
    policy = json.loads((directory / manifest["policy"]).read_text(encoding="utf-8"))
    cases = []
    for entry in manifest["cases"]:
        text = (directory / entry["chain"]).read_bytes().decode("utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        headers = [(directory / name).read_bytes().decode("utf-8").rstrip("\n") for name in entry.get("headers", [])]
        data = {"workflow": workflow, "policy": policy, "chain": lines, "headers": headers}
        expected = replay_answer(data)
        normative = ["valid", "code", "ordinal"] + (["head", "events", "states", "attempts"] if expected["valid"] else [])
        cases.append({"id": f"journal/{entry['name']}", "input": data, "expected": expected, "normative": normative})
    return cases
