"""The glossary and the teaching pages link only to what exists, and define what the docs use.

- every relative link in README.md and docs/*.md names a file that exists
  and, with ``#anchor``, a heading of that file (GitHub's anchor rule), so a
  renamed heading cannot leave a reader at a dead end;
- the glossary defines the terms a learner reported undefined and the three
  contracts, each entry with a link to where it is defined precisely;
- every refusal and unchanged code the kernel can return is defined in the
  protocol's table the glossary links to;
- no page cites a contract by the file name it was delivered as (a file the
  reader cannot open): prose names the contract; only the glossary gives
  the file names, once, for the machine tables' ``source`` fields, and a
  code block may quote such a field.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fencekeeper.kernel import protocol as p

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "glossary.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {_anchor(line.lstrip("#")) for line in lines if re.match(r"^#{1,6} ", line)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (page.parent / name).resolve() if name else page
        dead_anchor = path.exists() and bool(anchor) and path.suffix == ".md" and anchor not in _anchors(path)
        if not path.exists() or dead_anchor:
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_the_glossary_defines_the_terms_learners_asked_about_and_the_contracts() -> None:
    text = GLOSSARY.read_text(encoding="utf-8")
    entries = dict(re.findall(r"^(?:- )?\*\*(.+?)\*\*(.*?)(?=^(?:- )?\*\*|^## |\Z)", text, re.S | re.M))
    names = " ".join(entries).lower()
    for term in (
        "business",
        "authority fact",
        "governed",
        "evidence",
        "review state",
        "fence",
        "guard",
        "lease",
        "quarantine",
        "safe-resume proof",
        "zombie",
        "command",
        "reconcile",
    ):
        assert term in names, term
    for contract in ("workflow execution contract", "durable operations contract", "dag node journal contract"):
        assert contract in names, contract
    unlinked = [name for name, body in entries.items() if not _LINK.search(body)]
    assert not unlinked, f"entries without a link to their definition: {unlinked}"


def test_every_code_the_kernel_returns_is_defined_in_the_protocol() -> None:
    protocol = (ROOT / "specs" / "protocol.md").read_text(encoding="utf-8")
    codes = [c.value for c in p.RefusalCode] + [c.value for c in p.UnchangedCode]
    missing = [c for c in codes if f"`{c}`" not in protocol]
    assert not missing, missing


_CONTRACT_FILE = re.compile(r"\b00[0-2]_[0-9a-f]{16}\.txt\b")
_FENCED = re.compile(r"^```.*?^```", re.S | re.M)


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "specs").glob("*.md"))],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_prose_names_contracts_not_their_files(page: Path) -> None:
    prose = _FENCED.sub("", page.read_text(encoding="utf-8"))
    found = _CONTRACT_FILE.findall(prose)
    if page == GLOSSARY:
        assert sorted(found) == sorted(set(found)) and len(found) == 3, found
    else:
        assert not found, (
            f"{page.name} cites a contract by its file name: {found}; name the contract (docs/glossary.md)"
        )
