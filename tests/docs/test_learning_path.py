"""A newcomer finds the teaching pages in order, and every page says what it assumes.

- the README's first link to a page, after its opening commands, is
  Concepts;
- its 15-minute learning path is the demo, Concepts, the tutorial and the
  protocol, in that order;
- a reader is told how to type `fencekeeper` (it is in .venv/bin) before
  the README and Concepts first show it;
- every page under docs/ and specs/ states in its opening (the lines before
  its first section) what it assumes the reader knows, so a reader who
  lands on it from a search knows where to start instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "specs").glob("*.md"))]


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_concepts_is_the_first_page_the_readme_links_after_its_commands() -> None:
    text = README.read_text(encoding="utf-8")
    after_commands = text[text.index("```\n", text.index("```sh")) :]
    first = re.search(r"\]\(([^)#\s]+\.md)[^)]*\)", after_commands)
    assert first is not None and first.group(1) == "docs/concepts.md"


def test_the_learning_path_is_demo_concepts_tutorial_protocol() -> None:
    path = _section(README.read_text(encoding="utf-8"), "Learn it in 15 minutes")
    steps = re.findall(r"^\d\. (.+)$", path, re.M)
    assert len(steps) == 4, steps
    wanted = ["make demo", "docs/concepts.md", "docs/tutorial.md", "specs/protocol.md"]
    found = [path.find(w) for w in wanted]
    assert -1 not in found and found == sorted(found), dict(zip(wanted, found, strict=True))
    minutes = sum(int(m) for m in re.findall(r"\((\d+) minutes", path))
    assert minutes <= 15


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_page_opens_with_what_it_assumes(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    opening = text.split("\n## ", 1)[0]
    assert "*Assumes:*" in opening, f"{page.relative_to(ROOT)}: its opening does not say what it assumes"


def test_the_reader_is_told_how_to_type_fencekeeper_before_the_first_page_asks_for_it() -> None:
    """`make demo` installs the command into .venv/bin; the README and Concepts come before the tutorial's PATH step."""
    readme = README.read_text(encoding="utf-8")
    assert 'PATH="$PWD/.venv/bin:$PATH"' in readme.split("## Learn it in 15 minutes", 1)[0]
    concepts = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    before_first_command = concepts.split("```sh\nfencekeeper ", 1)[0]
    assert "`.venv/bin`" in before_first_command.rstrip().rsplit("\n\n", 1)[-1], "Concepts' first command is not told apart"
