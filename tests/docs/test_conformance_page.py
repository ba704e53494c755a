"""docs/conformance.md shows what the runner prints: its report of the JavaScript driver is a real run's.

The page's first report is the one a reader gets from the first command it
shows (``fencekeeper conformance --driver "node conformance/drivers/js/driver.js"``),
run from the repository root.  Case counts grow as cases are added to
specs/conformance, so the page is compared with a fresh run, line by line.
The Store port's method count the page states is the port's.  A driver
command is shown as the runner's ``--driver``, never as a command of its own
(run alone, a driver waits on its standard input for requests).  The number
of tests the page says the store suite has "now" is what pytest collects.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.cli.runner import ROOT, fencekeeper

PAGE = ROOT / "docs" / "conformance.md"
COMMAND = "node conformance/drivers/js/driver.js"


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_report_shown_is_the_javascript_drivers_report() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert f'fencekeeper conformance --driver "{COMMAND}"' in page
    shown = re.search(r"```text\n(.*?)```", _section(page, "Reading the report"), re.S)
    assert shown is not None, "the page shows no report"
    if shutil.which("node") is None:
        if os.environ.get("FENCEKEEPER_REQUIRE_NODE"):
            pytest.fail("FENCEKEEPER_REQUIRE_NODE is set but node is not on PATH")
        pytest.skip("node is not on PATH: the JavaScript driver cannot run (set FENCEKEEPER_REQUIRE_NODE=1 to fail)")
    run = fencekeeper("conformance", "--driver", COMMAND, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == shown.group(1).splitlines()


def test_the_port_has_as_many_methods_as_the_page_says() -> None:
    numbers = {"twenty-one": 21, "twenty-two": 22, "twenty-three": 23, "twenty-four": 24}
    said = re.search(r"`fencekeeper\.adapters\.store\.Store`, ([a-z-]+) methods", PAGE.read_text(encoding="utf-8"))
    assert said is not None and said.group(1) in numbers
    tree = ast.parse((ROOT / "adapters" / "store.py").read_text(encoding="utf-8"))
    port = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Store")
    methods = [node.name for node in port.body if isinstance(node, ast.FunctionDef)]
    assert numbers[said.group(1)] == len(methods), methods


def test_every_driver_command_is_shown_as_the_runners_driver() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)
    lines = [line for block in blocks for line in block.splitlines() if "conformance.driver" in line]
    assert lines, "the page shows no driver command"
    alone = [line for line in lines if not re.match(r'fencekeeper conformance --driver "python -m fencekeeper\.', line)]
    assert alone == [], alone


def test_the_store_suites_size_is_the_one_the_page_states() -> None:
    said = re.search(r"test of the suite \(\d+ when this was measured; (\d+) now\)", PAGE.read_text(encoding="utf-8"))
    assert said is not None
    route = ["--pyargs", "fencekeeper.adapters.testing.run_suite", "--fencekeeper-store"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *route,
         "fencekeeper.adapters.memory:MemoryStore"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    collected = re.search(r"^(\d+) tests? collected", result.stdout, re.M)
    assert collected is not None, result.stdout + result.stderr
    assert int(said.group(1)) == int(collected.group(1))
