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
