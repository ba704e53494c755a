"""The journal layer reads the fixture pack's chain files as ``journal verify --file`` does (specs/journal.md, section 9)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from fencekeeper.adapters.conformance.journal_cases import journal_cases, pack


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    directory = tmp_path / "fixtures"
    shutil.copytree(pack(), directory)
    return directory


def test_a_copy_of_the_pack_gives_the_same_cases(copied: Path) -> None:
    # Every chain file of the pack ends its last line with a newline.
    assert all(path.read_bytes().endswith(b"}\n") for path in (copied / "chains").glob("*.jsonl"))
    assert journal_cases(copied) == journal_cases()


@pytest.mark.parametrize(("name", "named"), [
    ("valid-review", "event 20: "),
    ("removal", "event 19: "),
    ("valid-empty", "header: "),
])  # fmt: skip
def test_a_chain_whose_last_line_has_no_newline_is_refused_naming_the_file(
    copied: Path, name: str, named: str
) -> None:
    path = copied / "chains" / f"{name}.jsonl"
    path.write_bytes(path.read_bytes().removesuffix(b"\n"))
    with pytest.raises(ValueError, match=re.escape(f"{path}: {named}the file's last line does not end with a newline")) as caught:
        journal_cases(copied)
    assert str(caught.value).endswith(" [non_canonical]"), caught.value
