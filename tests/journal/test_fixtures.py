"""The fixture pack in specs/journal/fixtures: committed as generated, and every case replays as it says.

The loader below reads only the pack's files (JSON and JSON lines), as
another implementation's runner would: the workflow and policy from their
files, each chain line by line, and the expected result from the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters import journal_fixtures
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.dag import verify_workflow, workflow_from_json
from fencekeeper.kernel.journal_codes import JournalCode, JournalError

PACK = Path(__file__).resolve().parents[2] / "specs" / "journal" / "fixtures"
MANIFEST: dict[str, Any] = json.loads((PACK / "manifest.json").read_text(encoding="utf-8"))

# Every adversarial case the issue and seed 002 name; the pack must hold each.
REQUIRED = {
    "removal": "broken_chain",
    "reordering": "broken_chain",
    "insertion": "broken_chain",
    "duplication": "broken_chain",
    "batch-removal": "broken_chain",
    "cross-execution-splice": "foreign_record",
    "altered-digest": "altered_digest",
    "unknown-field": "unknown_field",
    "non-canonical": "non_canonical",
    "ordinal-gap": "ordinal_gap",
    "forged-role": "forged_role",
    "automation-claims-human": "automation_claims_human",
    "missing-artifact": "missing_declared_output",
    "partial-invalidation": "partial_invalidation",
    "bad-successor": "bad_successor_binding",
    "invalid-approval": "invalid_approval",
    "approval-record-shared": "invalid_approval",
    "dependency-gap": "dependency_gap",
    "not-independent": "not_independent",
    "unauthorized-invalidation": "forged_role",
    "undeclared-invalidation-policy": "unverified_authority",
    "automation-invalidates-human-work": "automation_claims_human",
    "successor-not-superseding": "bad_successor_binding",
    "successor-other-workflow": "bad_successor_binding",
    "successor-unknown": "bad_successor_binding",
    "successor-digest": "bad_successor_binding",
    # One for each rule of specs/journal.md no case above breaks alone.
    "header-other-workflow": "unverified_authority",
    "header-other-policy": "unverified_authority",
    "header-other-protocol": "unverified_authority",
    "header-node-order": "unverified_authority",
    "header-automation-creator": "unverified_authority",
    "request-id-reused": "conflicting_request",
    "unknown-node": "unknown_node",
    "prior-state-mismatch": "prior_state_mismatch",
    "attempt-out-of-sequence": "invalid_attempt",
    "attempt-on-dependencies": "invalid_attempt",
    "attempt-not-current": "invalid_attempt",
    "error-without-failure": "invalid_request",
    "failure-without-error": "invalid_request",
    "batch-out-of-order": "malformed_record",
    "superseded-bound-again": "bad_successor_binding",
    "superseded-invalidated": "invalid_transition",
    "successor-by-automation": "automation_claims_human",
    "successor-self": "bad_successor_binding",
    "successor-not-execution": "bad_successor_binding",
    "successor-partial": "bad_successor_binding",
    "role-not-assigned": "forged_role",
    "role-not-admitted": "forged_role",
    "approvals-off-approval-node": "invalid_approval",
    "approvals-on-start": "invalid_approval",
    "approval-forged-role": "forged_role",
    "approval-other-role": "invalid_approval",
    "approval-by-automation": "invalid_approval",
    "approval-same-actor": "invalid_approval",
    "approval-order": "invalid_approval",
    "attempt-id-reused": "invalid_attempt",
    "attempt-not-authorized": "invalid_attempt",
    "hybrid-completed-by-automation": "automation_claims_human",
    "hybrid-retry-by-automation": "automation_claims_human",
    "missing-field": "missing_field",
    "time-spelling": "malformed_record",
    "digest-spelling": "malformed_record",
    "number-fraction": "malformed_record",
    "number-range": "malformed_record",
    "event-identifier": "invalid_request",
    "attempt-sequence-zero": "invalid_request",
    "records-repeated": "invalid_request",
    "batch-node-repeated": "invalid_request",
    # What a reader of the spec alone got wrong while every case above passed (cases 4.3.0).
    "number-integral-fraction": "malformed_record",
    "attempt-sequence-negative": "malformed_record",
    "batch-cut-short-after-forged-role": "forged_role",
    "invalidation-missing": "malformed_record",
}


def test_regenerating_the_pack_changes_no_byte(tmp_path: Path) -> None:
    written = journal_fixtures.write_pack(tmp_path)
    fresh = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in written}
    committed = {p.relative_to(PACK).as_posix(): p.read_bytes() for p in PACK.rglob("*") if p.is_file()}
    assert sorted(fresh) == sorted(committed), "files differ; run `fencekeeper journal fixtures specs/journal/fixtures`"
    for name, data in fresh.items():
        assert committed[name] == data, f"{name} differs from the kernel's output; regenerate the pack"


def test_the_pack_holds_every_required_case() -> None:
    expected = {c["name"]: c["expect"].get("code") for c in MANIFEST["cases"]}
    for name, code in REQUIRED.items():
        assert expected.get(name) == code, name
    assert all(code in {c.value for c in JournalCode} for code in expected.values() if code is not None)
    assert sum(c["valid"] for c in MANIFEST["cases"]) >= 3


@pytest.fixture(scope="module")
def authority() -> tuple[Any, j.VerifiedPolicy]:
    workflow = verify_workflow(workflow_from_json(json.loads((PACK / MANIFEST["workflow"]).read_bytes())))
    assert workflow.digest == MANIFEST["workflow_digest"]
    policy = j.verify_policy(j.policy_from_json(json.loads((PACK / MANIFEST["policy"]).read_bytes())), workflow)
    assert policy.digest == MANIFEST["policy_digest"]
    return workflow, policy


@pytest.mark.parametrize("case", MANIFEST["cases"], ids=[c["name"] for c in MANIFEST["cases"]])
def test_each_case_replays_as_the_manifest_says(case: dict[str, Any], authority: tuple[Any, j.VerifiedPolicy]) -> None:
    workflow, policy = authority
    header, events = journal_fixtures.read_chain(PACK / case["chain"])
    expect = case["expect"]
    # The successors a chain binds are checked against the case's headers, and only those.
    known = [j.decode_header(journal_fixtures.read_chain(PACK / name)[0]) for name in case.get("headers", [])]
    headers = {h.execution_id: h for h in known}.get
    if case["valid"]:
        journal = j.replay(header, events, workflow, policy, headers=headers)
        assert journal.head == expect["head"]
        assert len(journal.events) == expect["events"]
        assert {n: s.value for n, s in journal.states.items()} == expect["states"]
        attempts = {
            n: [{"id": a.attempt_id, "sequence": a.sequence, "status": a.status.value} for a in history]
            for n, history in journal.attempts.items()
        }
        assert attempts == expect["attempts"]
    else:
        with pytest.raises(JournalError) as caught:
            j.replay(header, events, workflow, policy, headers=headers)
        assert (caught.value.code, caught.value.ordinal) == (expect["code"], expect["ordinal"]), caught.value.message
