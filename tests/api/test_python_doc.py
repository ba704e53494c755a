"""docs/python.md and docs/kernel.md run as written: each page's Python blocks, top to bottom, in one fresh interpreter.

README.md's one block runs too, as written, beside a copy of the example's file.

The blocks run outside the repository, as a user's script would, against the
installed package; each block's own ``assert`` statements are what it claims.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fencekeeper

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "python.md"
PAGES = [ROOT / "docs" / "python.md", ROOT / "docs" / "kernel.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_page_has_the_recipe() -> None:
    text = PAGE.read_text(encoding="utf-8")
    blocks = BLOCK.findall(text)
    assert len(blocks) >= 5
    # The recipe shows a deployment's own policy and handler, and says the example ones are examples.
    assert "class ShopPolicy" in blocks[0] and "class OrderSystem" in blocks[0]
    assert "**examples**" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_runs(tmp_path: Path, page: Path) -> None:
    script = "\n\n".join(BLOCK.findall(page.read_text(encoding="utf-8")))
    (tmp_path / "page.py").write_text(script, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "page.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    shown = {"python.md": "[not_authorized]", "kernel.md": "lease_expired - "}[page.name]
    assert shown in result.stdout


README = ROOT / "README.md"
EXAMPLES = ROOT / "docs" / "examples"


def test_the_readmes_python_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README.md's "From Python" as written, with the one thing it leaves to the reader: a copy of the example's file.

    It defines its own policy and handler (the example ones), so that a reader can paste it and run it.
    """
    (block,) = BLOCK.findall(README.read_text(encoding="utf-8"))
    shutil.copy(EXAMPLES / "purchase_approval.toml", tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(block, str(README), "exec"), namespace)  # the page's own code, as a reader runs it
    execution = namespace["execution"]
    with fencekeeper.connect("shop.db", policy=namespace["my_policy"], handler=None) as client:
        # Above the threshold it waited for the manager, whose approval the block gave last.
        assert client.get(execution.execution_id).state is fencekeeper.ExecutionState.ELIGIBLE
        assert client.inspect(execution.execution_id).execution.current_node_id == "place_order"
