"""The glossary and the teaching pages link only to what exists, and define what the docs use.

- every relative link in README.md and docs/*.md names a file that exists
  and, with ``#anchor``, a heading of that file (GitHub's anchor rule), so a
  renamed heading cannot leave a reader at a dead end;
- the glossary defines the terms a learner reported undefined and the three
  contracts, each entry with a link to where it is defined precisely;
- every refusal and unchanged code the kernel can return is defined in the
  protocol's table the glossary links to, and every other family of stable
  codes (durable operations, the journal, the interpreter's reasons and a
  handler's rejections, the client's request errors, the stores' errors)
  is listed in full on a page the glossary links to;
- no page cites a contract by the file name it was delivered as (a file the
  reader cannot open): prose names the contract; only the glossary gives
  the file names, once, for the machine tables' ``source`` fields, and a
  code block may quote such a field.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

import pytest

from fencekeeper.adapters import errors
from fencekeeper.kernel import interpreter, journal_codes, operations
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
        # What Concepts puts in italics as a term, and what the other subsystems' pages and errors use.
        "credential",
        "kernel",
        "store",
        "worker",
        "revision",
        "refusal",
        "unchanged",
        "not applied",
        "abandoned",
        "effect class",
        "heartbeat",
        "release",
        "journal",
        "head",
        "outbox",
        "retention",
        "scoped idempotency",
        "outcome",
        "rejection",
        "request error",
        "store error",
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


def _families() -> list[tuple[str, list[str]]]:
    def values(*families: type[enum.Enum]) -> list[str]:
        return [str(member.value) for family in families for member in family]

    return [
        ("../specs/operations.md", values(operations.RefusalCode, operations.UnchangedCode)),
        ("../specs/journal.md", values(journal_codes.JournalCode)),
        ("../specs/interpreter.md", values(interpreter.Reason, interpreter.Rejection)),
        ("python.md", values(errors.RequestCode)),
        ("stores.md", values(errors.StoreCode)),
    ]


@pytest.mark.parametrize(("page", "codes"), _families(), ids=[page for page, _ in _families()])
def test_every_family_of_codes_is_listed_where_the_glossary_points(page: str, codes: list[str]) -> None:
    glossary = GLOSSARY.read_text(encoding="utf-8")
    assert f"]({page}" in glossary, f"the glossary does not link to {page}"
    text = (GLOSSARY.parent / page).read_text(encoding="utf-8")
    missing = [c for c in codes if f"`{c}`" not in text]
    assert not missing, f"{page} does not list {missing}"


def test_module_docs_name_contracts_not_their_files() -> None:
    # The API reference is generated from these docstrings; only the machine table keeps the file names, as data.
    sources = [p for d in ("kernel", "adapters", "api") for p in sorted((ROOT / d).rglob("*.py"))]
    citing = [str(p.relative_to(ROOT)) for p in sources if _CONTRACT_FILE.search(p.read_text(encoding="utf-8"))]
    assert citing == ["kernel/machines.py"], citing
