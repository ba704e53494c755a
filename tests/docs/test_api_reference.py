"""The API reference builds from the docstrings, without a single warning.

``make apidocs`` runs pdoc over the front door, the kernel and the
adapters.  pdoc reports what it cannot render (an annotation it cannot
evaluate, a module that fails to import, a broken reference) as ``Warn:``
lines on stderr and carries on; this test makes each of them a failure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make_variable(name: str) -> list[str]:
    line = next(x for x in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines() if x.startswith(f"{name} :="))
    return line.split(":=", 1)[1].split()


def test_the_reference_builds_without_warnings(tmp_path: Path) -> None:
    # Exactly what `make apidocs` runs.
    modules = _make_variable("APIDOC_MODULES")
    assert modules == ["fencekeeper", "fencekeeper.kernel", "fencekeeper.adapters"]
    result = subprocess.run(
        [sys.executable, "-m", "pdoc", *_make_variable("APIDOC_FLAGS"), "--output-directory", str(tmp_path / "api"),
         *modules],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
    pages = {p.relative_to(tmp_path / "api").as_posix() for p in (tmp_path / "api").rglob("*.html")}
    for page in ("fencekeeper.html", "fencekeeper/kernel.html", "fencekeeper/adapters/client.html",
                 "fencekeeper/adapters/errors.html", "fencekeeper/adapters/ports.html"):
        assert page in pages, sorted(pages)
    front = (tmp_path / "api" / "fencekeeper.html").read_text(encoding="utf-8")
    # The docstrings are what the pages say.
    assert "for the store <code>url</code> names" in front or re.search(r"for the store .{0,40}url.{0,40} names", front)
    client = (tmp_path / "api" / "fencekeeper" / "adapters" / "client.html").read_text(encoding="utf-8")
    assert "raise_on_refusal" in client and "Settle the execution" in client
