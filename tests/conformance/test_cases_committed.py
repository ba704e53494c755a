"""specs/conformance/ is exactly what the kernel generates, and covers what it promises to.

The case files are the language-neutral export of the kernel's answers (as
specs/machines/ is of its tables): regenerating them must not change a byte,
they must satisfy their own JSON Schema, and together they must reach every
refusal code of the protocol, every machine pair and sub-second times.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fencekeeper.adapters.conformance import cases
from fencekeeper.kernel import operations
from fencekeeper.kernel.machines import MACHINES
from fencekeeper.kernel.modelcheck import Invariant
from fencekeeper.kernel.protocol import RefusalCode, UnchangedCode
from tests.definitions.test_schema import schema_errors

CASES = Path(__file__).resolve().parents[2] / "specs" / "conformance"
SCHEMA = json.loads((CASES / "cases.schema.json").read_text(encoding="utf-8"))

def _layer(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("layer", cases.LAYERS)
def test_committed_cases_are_the_generated_ones(layer: str) -> None:
    committed = (CASES / f"{layer}.json").read_text(encoding="utf-8")
    assert committed == cases.render_layer(layer), (
        f"specs/conformance/{layer}.json differs from what the kernel generates; run `make specs`"
    )


def test_no_stray_case_files() -> None:
    assert sorted(p.stem for p in CASES.glob("*.json") if p.name != "cases.schema.json") == sorted(cases.LAYERS)


@pytest.mark.parametrize("layer", cases.LAYERS)
def test_case_files_satisfy_their_schema(layer: str) -> None:
    assert schema_errors(_layer(layer), SCHEMA) == []


def test_the_schema_refuses_a_malformed_case() -> None:
    document = _layer("machines")
    document["cases"] = [{**document["cases"][0], "expected": {"target": "running", "illegal": True}}]
    assert schema_errors(document, SCHEMA) != []
    document["cases"] = [{"id": "machines/x", "input": {}, "expected": {}}]
    assert any("normative" in e for e in schema_errors(document, SCHEMA))


def test_every_machine_pair_is_a_case() -> None:
    pairs = {c["id"] for c in _layer("machines")["cases"]}
    expected = {f"{n}/{s.value}/{e.value}" for n, m in MACHINES.items() for s in m.state_type for e in m.event_type}
    assert pairs == expected


def test_every_refusal_and_unchanged_code_is_reached() -> None:
    codes = {
        c["expected"].get("code")
        for layer in ("protocol", "recovery")
        for c in _layer(layer)["cases"]
    }
    wanted = {c.value for c in RefusalCode}
    wanted |= {UnchangedCode.ALREADY_WOKEN.value, UnchangedCode.RECOVERY_REPLAYED.value, UnchangedCode.ALREADY_DECIDED.value}
    assert wanted - codes == set()


def test_every_operations_code_is_reached() -> None:
    # Every code a decision returns; a store's own refusals (a row it cannot read) are no decision's.
    codes = {c["expected"].get("code") for c in _layer("operations")["cases"]}
    decided = {c for c in operations.RefusalCode if c not in operations.STORE_REFUSALS}
    wanted = {c.value for c in decided} | {c.value for c in operations.UnchangedCode}
    assert wanted - codes == set()
    assert not codes & {c.value for c in operations.STORE_REFUSALS}


def test_the_journal_layer_agrees_with_the_fixture_manifest() -> None:
    manifest = json.loads((CASES.parent / "journal" / "fixtures" / "manifest.json").read_text(encoding="utf-8"))
    by_name = {c["id"].split("/", 1)[1]: c["expected"] for c in _layer("journal")["cases"]}
    assert sorted(by_name) == sorted(c["name"] for c in manifest["cases"])
    for entry in manifest["cases"]:
        got, expect = by_name[entry["name"]], entry["expect"]
        assert got["valid"] == entry["valid"], entry["name"]
        for part in ("code", "ordinal", "head", "events", "states", "attempts"):
            if part in expect:
                assert got[part] == expect[part], (entry["name"], part)


def test_every_normative_part_is_in_the_expectation_or_null() -> None:
    for layer in cases.LAYERS:
        for case in _layer(layer)["cases"]:
            assert set(case["normative"]) <= set(case["expected"]) | {"code", "field", "illegal", "target"}, case["id"]


def test_times_carry_microseconds() -> None:
    text = (CASES / "protocol.json").read_text(encoding="utf-8") + (CASES / "store.json").read_text(encoding="utf-8")
    assert ".123457Z" in text and ".123458Z" in text
    assert "T12:00:00.000000Z" not in text


def test_lease_boundaries_are_both_sides_of_expiry() -> None:
    found = {c["id"].rsplit("/", 1)[1]: c["expected"] for c in _layer("protocol")["cases"] if c["id"].startswith("renew/running/")}
    assert found["last_microsecond_of_lease"]["outcome"] == "decision"
    assert found["at_expiry"]["code"] == "lease_expired"


def test_every_decision_of_the_protocol_table_has_cases() -> None:
    """A decision protocol.md lists but no case asks leaves other implementations unchecked on it."""
    text = (CASES.parent / "protocol.md").read_text(encoding="utf-8")
    section = text[text.index("## Decisions\n") : text.index("\n### ", text.index("## Decisions\n"))]
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    assert {"renew", "fenced", "finalize"} <= listed, listed
    asked = {c["input"]["decision"] for layer in ("protocol", "recovery") for c in _layer(layer)["cases"]}
    assert listed - asked == set()


def test_an_evidence_append_is_fenced_like_a_renewal() -> None:
    """The fenced decision: a live lease writes no row under a live-lease guard; every stale lease is refused."""
    found = {c["id"].split("/", 1)[1]: c["expected"] for c in _layer("protocol")["cases"]
             if c["input"]["decision"] == "fenced"}
    live = found["running/good"]
    assert live["outcome"] == "decision"
    assert (live["execution"], live["dispatch"], live["registration"], live["lease"]) == (None, None, None, None)
    assert live["guard"]["requires_live_lease"] is True and live["guard"]["expected_fence"] == 1
    assert found["running/last_microsecond_of_lease"]["outcome"] == "decision"
    for case, code in (
        ("running/at_expiry", "lease_expired"),
        ("reclaimed/replaced_holder", "lease_token_mismatch"),
        ("reclaimed/replaced_fence", "stale_fence"),
        ("running/stale_fence", "stale_fence"),
        ("running/other_worker", "worker_mismatch"),
        ("claimed_dispatch_eligible_execution/good", "execution_not_running"),
        ("waiting/good", "dispatch_not_claimed"),
    ):
        assert (found[case]["outcome"], found[case]["code"]) == ("refusal", code), case
    assert found["reclaimed/good"]["guard"]["expected_fence"] == 2


def test_store_races_list_two_different_serial_orders() -> None:
    races = [c for c in _layer("store")["cases"] if c["id"].startswith("race/")]
    assert len(races) >= 6
    for race in races:
        first, second = race["expected"]["serial_orders"]
        assert first != second, race["id"]


def test_every_invariant_has_cases_on_its_boundary() -> None:
    covered = {
        invariant
        for layer in ("protocol", "recovery")
        for case in _layer(layer)["cases"]
        for invariant in case.get("covers", [])
    }
    # INV-COMPOSED-REFINES compares two whole explorations (kernel/modelcheck.py, check_refinement); no
    # single decision sits on its boundary, and each decision of a composed transaction is one of these cases.
    assert covered == {i.value for i in Invariant} - {Invariant.COMPOSED_REFINES.value}


def test_the_model_checkers_calls_are_cases() -> None:
    model = [c for c in _layer("protocol")["cases"] if c["id"].startswith("model/")]
    decisions = {c["input"]["decision"] for c in model}
    assert decisions == {"claim", "renew", "record_step", "release", "finalize", "wake", "cancel"}
    # The checker's zombies: a stale holder refused after its replacement claimed.
    assert any(c["expected"].get("code") == "lease_token_mismatch" for c in model)
