"""specs/conformance.md says what a driver must answer: what the committed cases compare, it names.

A driver written from the spec alone must be able to pass.  Where a case's
normative answer carries a value the spec never mentions (a refusal's
``field``), such a driver fails with no way to know why.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "specs" / "conformance"


def _section(text: str, heading: str) -> str:
    start = text.index(f"### `{heading}`\n")
    end = text.find("\n### ", start + 1)
    return text[start:end]


def test_every_operations_refusal_field_the_cases_compare_is_named_in_the_spec() -> None:
    fields: dict[str, set[str]] = defaultdict(set)
    for case in json.loads((CASES / "operations.json").read_text(encoding="utf-8"))["cases"]:
        expected = case["expected"]
        if expected["outcome"] == "refusal" and expected.get("field") is not None:
            fields[expected["code"]].add(expected["field"])
    spec = " ".join(_section((ROOT / "specs" / "conformance.md").read_text(encoding="utf-8"), "operations").split())
    operations = (ROOT / "specs" / "operations.md").read_text(encoding="utf-8")
    for code, named in fields.items():
        assert f"`{code}`" in spec, f"specs/conformance.md (operations) never says {code} carries a field"
        if len(named) == 1 and code != "invalid_request":
            [field] = named
            assert re.search(rf"`{code}`,? \(?`(field` `)?{field}`", spec), (code, field)
            assert f"`{code}`, `field` `{field}`" in operations, f"specs/operations.md never names {code}'s {field}"


def _field_names(value: object, found: set[str]) -> None:
    if isinstance(value, dict):
        for name, inner in value.items():
            found.add(name)
            _field_names(inner, found)
    elif isinstance(value, list):
        for inner in value:
            _field_names(inner, found)


def test_every_field_a_written_operation_decision_is_compared_on_is_named_in_operations_md() -> None:
    """A decision's writes are compared whole (the Operation, its Attempts, guard, outbox, credential).

    A field the cases compare that specs/operations.md never names (``cancel_requested_by`` was one) is a value a
    driver written from the spec cannot know to write.
    """
    compared: set[str] = set()
    for case in json.loads((CASES / "operations.json").read_text(encoding="utf-8"))["cases"]:
        expected = case["expected"]
        if expected["outcome"] in ("decision", "unchanged"):
            for part in ("operation", "attempts", "guard", "outbox", "credential"):
                _field_names(expected.get(part), compared)
    spec = (ROOT / "specs" / "operations.md").read_text(encoding="utf-8")
    # A field is named in code spans, alone or in a value's tuple: `(operation_id, number, worker_id, ...)`.
    named = {word for span in re.findall(r"`([^`]+)`", spec) for word in re.findall(r"[A-Za-z_]+", span)}
    missing = sorted(compared - named)
    assert not missing, f"specs/operations.md never names these fields the operations cases compare: {missing}"


def test_every_field_an_interpreter_plan_is_compared_on_is_named_in_the_spec() -> None:
    """A plan is compared whole, its evidence bodies included: a member the layer's section never names is one a
    driver written from the spec cannot know to write; so is a refusal's field."""
    compared: set[str] = set()
    fields: set[str] = set()
    for case in json.loads((CASES / "interpreter.json").read_text(encoding="utf-8"))["cases"]:
        expected = case["expected"]
        if expected["plan"] == "refused":
            fields.add(expected["field"])
            continue
        for part in case["normative"]:
            compared.add(part)
            _field_names(expected.get(part), compared)
    section = _section((ROOT / "specs" / "conformance.md").read_text(encoding="utf-8"), "interpreter")
    named = {word for span in re.findall(r"`([^`]+)`", section) for word in re.findall(r"[A-Za-z_]+", span)}
    # Payload, input and output members are the case's own data, not names the spec defines.
    data = {"amount", "currency", "lines", "ref", "d", "r", "order_id", "note", "event_id"}
    missing = sorted(name for name in compared - named - data if "." not in name)  # a binding's name: `input.amount`
    assert not missing, f"specs/conformance.md (interpreter) never names these fields the cases compare: {missing}"
    unnamed = sorted(f for f in fields if f"`{f.split('[')[0]}" not in section)
    assert not unnamed, f"specs/conformance.md (interpreter) never names these refused fields: {unnamed}"
