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

import attrs

from fencekeeper.adapters.conformance.basis import LAYERS
from fencekeeper.kernel import operations as o

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


def _omitted_fields_paragraph() -> str:
    spec = (ROOT / "specs" / "operations.md").read_text(encoding="utf-8")
    start = spec.index("- **Omitted fields.**")
    return " ".join(spec[start : spec.index("\n- ", start + 1) if "\n- " in spec[start + 1 :] else None].split())


def test_every_request_field_the_operations_cases_leave_out_has_its_default_in_operations_md() -> None:
    """A case that leaves a request field out expects the decision its default gives.

    ``rule/complete/read_only_past_the_deadline`` has no ``result`` and expects the Operation to hold the JSON
    text ``null``: a driver written from the spec must be told that default, not guess null.  Every request
    field with a default is named, so the next case that leaves one out is covered too.
    """
    paragraph = _omitted_fields_paragraph()
    left_out: set[str] = set()
    given: dict[str, set[str]] = defaultdict(set)
    requests: dict[str, list[set[str]]] = defaultdict(list)
    for case in json.loads((CASES / "operations.json").read_text(encoding="utf-8"))["cases"]:
        request = set(case["input"]["request"])
        requests[case["input"]["decision"]].append(request)
        given[case["input"]["decision"]] |= request
    for decision, seen in requests.items():
        left_out |= {name for request in seen for name in given[decision] - request}
    assert left_out, "no case leaves a field out: this test checks nothing"
    defaults = {
        f.name for kind in (o.SubmitRequest, o.CompleteRequest, o.FailRequest, o.UnknownRequest, o.CancelRequest)
        for f in attrs.fields(kind) if f.default is not attrs.NOTHING
    }
    defaults |= {f"policy.{f.name}" for f in attrs.fields(o.RetryPolicy)}
    unnamed = sorted(name for name in left_out | defaults if f"`{name.removeprefix('policy.')}`" not in paragraph)
    assert not unnamed, f"specs/operations.md (Well-formed requests, Omitted fields) never gives these defaults: {unnamed}"
    assert "`result` the JSON text `null`" in paragraph, o.CompleteRequest.__attrs_attrs__.result.default


def test_the_stable_principals_the_spec_spells_are_the_kernels() -> None:
    """specs/operations.md spells the stable form of a reference; the kernel keys identities by its own."""
    spec = " ".join((ROOT / "specs" / "operations.md").read_text(encoding="utf-8").split())
    start = spec.index("- **Identity key**")
    bullet = spec[start : spec.index(" - **", start + 1)]
    # The rule's own pattern, `resolver:vVERSION:subject`, is not an example of it.
    pairs = [p for p in re.findall(r"`([^`*]+)` is `([^`]*\*[^`]*)`", bullet) if "VERSION" not in p[0]]
    assert pairs, "the spec spells no stable form"
    for reference, stable in pairs:
        assert o.stable_principal(reference) == stable, (reference, stable)
    own = re.search(r"any other shape \(((?:`[^`]+`,? ?(?:and )?)+)\) is its own", bullet)
    assert own is not None, "the spec gives no reference that is its own stable form"
    for reference in re.findall(r"`([^`]+)`", own.group(1)):
        assert o.stable_principal(reference) == reference, reference


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


def test_the_specs_index_names_every_layer_of_the_suite() -> None:
    # specs/README.md is where a reader of the specs alone first learns which layers exist.
    index = " ".join((ROOT / "specs" / "README.md").read_text(encoding="utf-8").split())
    missing = [layer for layer in LAYERS if f"`{layer}`" not in index]
    assert not missing, f"specs/README.md never names the layers {missing}"
