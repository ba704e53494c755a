"""fencekeeper[testing] installs exactly what the store suite imports, and its pytest plugin is registered and finds a
factory beside where it runs."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE_FILES = [*sorted((ROOT / "adapters" / "testing").glob("*.py")), ROOT / "adapters" / "pytest_plugin.py"]


def _distribution(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower()


def test_the_testing_extra_is_exactly_what_the_suite_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = {_distribution(r) for r in project["dependencies"]}
    extra = {_distribution(r) for r in project["optional-dependencies"]["testing"]}
    imported: set[str] = set()
    for path in SUITE_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {name for name in imported - set(sys.stdlib_module_names) if name != "fencekeeper"} - core
    assert third_party == extra == {"pytest", "hypothesis"}, (third_party, extra)


def test_the_pytest_plugin_is_registered() -> None:
    plugins = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")}
    assert plugins.get("fencekeeper") == "fencekeeper.adapters.pytest_plugin"


def test_the_plugin_finds_a_factory_in_the_directory_pytest_runs_in(tmp_path: Path) -> None:
    """docs/conformance.md's command, run with the ``pytest`` script beside an uninstalled ``mystore`` package."""
    package = tmp_path / "mystore"
    package.mkdir()
    (package / "__init__.py").write_text("from fencekeeper.adapters.sqlite_store import SQLiteStore as MyStore\n")
    (package / "testing.py").write_text(
        "from mystore import MyStore\n\n\ndef make_store(clock, directory):\n"
        "    return MyStore(directory / 'store.db', clock=clock)\n"
    )
    script = Path(sys.executable).parent / "pytest"
    command = [str(script), "--pyargs", "fencekeeper.adapters.testing.run_suite", "--collect-only", "-q"]
    result = subprocess.run(
        [*command, "--fencekeeper-store", "mystore.testing:make_store", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No module named" not in result.stdout + result.stderr
