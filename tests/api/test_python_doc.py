"""docs/python.md runs as written: its Python blocks, top to bottom, in one fresh interpreter.

The blocks run outside the repository, as a user's script would, against the
installed package; each block's own ``assert`` statements are what it claims.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "python.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_page_has_the_recipe() -> None:
    text = PAGE.read_text(encoding="utf-8")
    blocks = BLOCK.findall(text)
    assert len(blocks) >= 5
    # The recipe shows a deployment's own policy and handler, and says the example ones are examples.
    assert "class ShopPolicy" in blocks[0] and "class OrderSystem" in blocks[0]
    assert "**examples**" in text


def test_every_python_block_runs(tmp_path: Path) -> None:
    script = "\n\n".join(BLOCK.findall(PAGE.read_text(encoding="utf-8")))
    (tmp_path / "recipe.py").write_text(script, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "recipe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "[not_authorized]" in result.stdout
