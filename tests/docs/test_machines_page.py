"""docs/machines.md reads cleanly: one style block per diagram, each source named once.

- a mermaid diagram has exactly one style block (a class definition and the
  line that applies it to the review states), and no per-state paint;
- the review states, and only they, are styled;
- within a table no citation is printed twice (a row whose citation an
  earlier row printed refers to it and adds only its own rationale), and a
  citation every row shares is stated once above the table;
- every source is named as one of the three contracts, linked to the
  glossary, never by a file name a reader cannot open.
"""

from __future__ import annotations

import re

import pytest

from fencekeeper.adapters.diagrams import machines_markdown, render_diagram
from fencekeeper.kernel import MACHINES


@pytest.mark.parametrize("name", list(MACHINES))
def test_one_style_block_marks_exactly_the_review_states(name: str) -> None:
    spec = MACHINES[name].spec
    lines = render_diagram(spec, "mermaid").splitlines()
    defs = [line for line in lines if line.strip().startswith("classDef ")]
    applied = [line for line in lines if re.match(r"^\s*class ", line, re.IGNORECASE)]
    if spec.review:
        assert len(defs) == 1 and len(applied) == 1, lines
        styled = applied[0].strip().removeprefix("class ").rsplit(" ", 1)[0]
        assert [s.strip() for s in styled.split(",")] == list(spec.review)
    else:
        assert defs == [] and applied == []


def _sections(page: str) -> dict[str, str]:
    parts = re.split(r"^## (\S+)\n", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_no_table_prints_a_citation_twice() -> None:
    for name, body in _sections(machines_markdown()).items():
        cells = [row.rsplit(" | ", 1)[1] for row in body.splitlines() if row.startswith("| `")]
        # The citation alone, without the row's own rationale, which may differ where the citation repeats.
        cites = [c.split(" *Rationale:* ", 1)[0] for c in cells]
        repeated = {c for c in cites if cites.count(c) > 1 and not c.startswith("as `")}
        assert not repeated, f"{name}: {repeated}"


def test_a_repeated_citation_refers_to_the_row_that_printed_it() -> None:
    operation = _sections(machines_markdown())["operation"]
    row = next(r for r in operation.splitlines() if r.startswith("| `deadline_exceeded` | running"))
    assert "as `deadline_exceeded` from `admitted`, above. *Rationale:* An owner whose lease expired" in row


def test_a_shared_citation_is_stated_once_above_its_table() -> None:
    sections = _sections(machines_markdown())
    assert "Every row below cites Dispatch Lifecycle" in sections["dispatch"]
    assert "Dispatch Lifecycle" not in "".join(r for r in sections["dispatch"].splitlines() if r.startswith("| `"))
    rows = [r for r in sections["dispatch"].splitlines() if r.startswith("| `")]
    assert all("of [execution](#execution)" in r for r in rows)


def test_sources_are_named_contracts() -> None:
    for name, body in _sections(machines_markdown()).items():
        source = next(line for line in body.splitlines() if line.startswith("Source: "))
        assert re.match(
            r"Source: \[the [\w ]+ contract\]\(glossary\.md#the-three-contracts\) \(seed 00\d\): ", source
        ), (
            name,
            source,
        )
        assert not re.search(r"\d{3}_[0-9a-f]{16}\.txt", body), name
