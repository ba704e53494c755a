"""The journal layer reads the fixture pack's chain files as ``journal verify --file`` does (specs/journal.md, section 9)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
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


@pytest.mark.parametrize(("fault", "change", "said"), [
    ("no newline", lambda record: record.removesuffix(b"\n"), "the file's last line does not end with a newline"),
    ("a second newline", lambda record: record + b"\n", "a header file holds one record and its newline, found 2 lines"),
    ("trailing spaces", lambda record: record.removesuffix(b"\n") + b"  \n", "not the RFC 8785 canonical form"),
    ("a carriage return", lambda record: record.removesuffix(b"\n") + b"\r\n", "not the RFC 8785 canonical form"),
], ids=["no-newline", "second-newline", "trailing-spaces", "carriage-return"])  # fmt: skip
def test_a_header_file_not_framed_as_one_canonical_record_is_refused_naming_the_file(
    copied: Path, fault: str, change: Callable[[bytes], bytes], said: str
) -> None:
    # They were trimmed with rstrip, or kept, in silence: a header that then did not decode changed the
    # expectation of every case that looks it up, where `journal verify --file` refuses such a line.
    path = copied / "headers" / "review-2.json"
    path.write_bytes(change(path.read_bytes()))
    with pytest.raises(ValueError, match=re.escape(f"{path}: header: ")) as caught:
        journal_cases(copied)
    assert said in str(caught.value) and str(caught.value).endswith(" [non_canonical]"), (fault, caught.value)
