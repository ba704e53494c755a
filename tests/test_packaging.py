"""The distribution is laid out as promised, and its types reach a client.

``api/``, ``kernel/`` and ``adapters/`` are installed as ``fencekeeper``,
``fencekeeper.kernel`` and ``fencekeeper.adapters``, and ``specs/`` as the
data of ``fencekeeper.specs`` (pyproject.toml, ``package-dir``), in a strict
editable install: a tree of links into the repository.  These tests check
that what Python imports is the repository's code (not a stale copy), that
every module and the ``py.typed`` markers are installed, that the console
script exists, and that mypy, run from an unrelated directory, sees the
kernel's real types.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import fencekeeper
import fencekeeper.adapters
import fencekeeper.kernel
from fencekeeper.adapters.cli import main

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PACKAGES = {
    "fencekeeper": ROOT / "api",
    "fencekeeper.kernel": ROOT / "kernel",
    "fencekeeper.adapters": ROOT / "adapters",
}
REINSTALL = "a new module needs `make .venv/.installed` (the editable install is a strict link tree)"


def test_fencekeeper_is_the_front_door() -> None:
    # A regular package whose __init__ is api/__init__.py: it has a version and the client.
    assert fencekeeper.__file__ is not None
    assert Path(fencekeeper.__file__).resolve() == ROOT / "api" / "__init__.py"
    assert fencekeeper.__version__ == importlib.metadata.version("fencekeeper")
    assert callable(fencekeeper.connect)


def test_the_specs_are_package_data() -> None:
    shipped = importlib.resources.files("fencekeeper") / "specs"
    for source in (ROOT / "specs").rglob("*"):
        if source.is_file():
            relative = source.relative_to(ROOT / "specs")
            installed = shipped
            for part in relative.parts:
                installed = installed / part
            assert installed.is_file(), f"specs/{relative} is not installed; {REINSTALL}"
            assert installed.read_bytes() == source.read_bytes()


@pytest.mark.parametrize(
    "package", [fencekeeper, fencekeeper.kernel, fencekeeper.adapters], ids=lambda m: m.__name__
)
def test_package_resolves_into_the_repository(package: ModuleType) -> None:
    name = package.__name__
    source = PACKAGES[name]
    assert package.__file__ is not None
    installed = Path(package.__file__)
    # The link tree lives outside the repository; resolving the link must land in it.
    assert installed.resolve() == source / "__init__.py", f"{name} is imported from {installed}, not {source}"
    assert installed.read_bytes() == (source / "__init__.py").read_bytes()


@pytest.mark.parametrize(
    "source",
    sorted(p for directory in PACKAGES.values() for p in directory.rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_module_is_installed(source: Path) -> None:
    # The module name follows the path below its top-level package (subpackages included).
    package, root = next((name, d) for name, d in PACKAGES.items() if d in source.parents)
    parts = [*source.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    module = ".".join([package, *parts])
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{module} is not installed; {REINSTALL}"
    assert Path(spec.origin).resolve() == source, f"{module} comes from {spec.origin}; {REINSTALL}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_py_typed_is_installed(package: str) -> None:
    assert (PACKAGES[package] / "py.typed").is_file()
    marker = importlib.resources.files(package) / "py.typed"
    assert marker.is_file(), f"{package} has no py.typed marker; mypy would treat it as untyped"


def test_console_script() -> None:
    script = BIN / "fencekeeper"
    assert script.is_file() and os.access(script, os.X_OK), f"no executable {script}"
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="fencekeeper")
    assert entry.value == "fencekeeper.adapters.cli:main"
    assert entry.load() is main


# --- mypy on a client outside the repository ---------------------------------------------------

CLIENT = '''\
"""A client of the installed package, type-checked with --strict."""

import fencekeeper
from fencekeeper.kernel import EXECUTION, ExecutionEvent, ExecutionState, IllegalTransition


def advance(state: ExecutionState, event: ExecutionEvent) -> ExecutionState:
    return EXECUTION.step(state, event)


def refusal_code(state: ExecutionState, event: ExecutionEvent) -> str | None:
    try:
        EXECUTION.step(state, event)
    except IllegalTransition as exc:
        return exc.code
    return None


running: ExecutionState = advance(ExecutionState.ELIGIBLE, ExecutionEvent.CLAIM)
legal: tuple[ExecutionEvent, ...] = EXECUTION.events_from(running)
done: frozenset[ExecutionState] = EXECUTION.terminal
code: str | None = refusal_code(ExecutionState.SUCCEEDED, ExecutionEvent.CLAIM)


def through_the_front_door(client: fencekeeper.Client) -> fencekeeper.RefusalCode | None:
    admitted: fencekeeper.Execution = client.run("purchase-approval", {"amount": 1})
    cancelled = client.cancel(admitted.execution_id, raise_on_refusal=False)
    if isinstance(cancelled, fencekeeper.Refusal):
        return cancelled.code
    state: ExecutionState = cancelled.state
    return None if state is ExecutionState.CANCELLED else fencekeeper.RefusalCode.ILLEGAL_TRANSITION


def refusals_as_the_caller_chooses(client: fencekeeper.Client, raising: bool) -> fencekeeper.Refusal | None:
    # The documented default spelt out, and a flag decided at run time: both were "no overload matches".
    admitted: fencekeeper.Execution = client.run("purchase-approval", {"amount": 1}, raise_on_refusal=True)
    answer = client.cancel(admitted.execution_id, raise_on_refusal=raising)
    return answer if isinstance(answer, fencekeeper.Refusal) else None


async def flagged_and_awaited(client: fencekeeper.AsyncClient, raising: bool) -> fencekeeper.Refusal | None:
    answer = await client.decide("x-1", "rejected", raise_on_refusal=raising)
    return answer if isinstance(answer, fencekeeper.Refusal) else None


async def the_same_awaited(client: fencekeeper.AsyncClient) -> ExecutionState:
    admitted: fencekeeper.Execution = await client.run("purchase-approval", {"amount": 1})
    answer = await client.decide(admitted.execution_id, "approved", raise_on_refusal=False)
    if isinstance(answer, fencekeeper.Refusal):
        return admitted.state
    status: fencekeeper.DecisionStatus = answer.status
    assert status is fencekeeper.DecisionStatus.ACCEPTED
    return (await client.wait(admitted.execution_id, timeout=30.0)).state


reveal_type(EXECUTION)
x: int = EXECUTION.step(ExecutionState.ELIGIBLE, ExecutionEvent.CLAIM)
'''
DELIBERATE_LINE = (
    CLIENT.splitlines().index("x: int = EXECUTION.step(ExecutionState.ELIGIBLE, ExecutionEvent.CLAIM)") + 1
)
REVEAL_LINE = CLIENT.splitlines().index("reveal_type(EXECUTION)") + 1


@pytest.fixture(scope="module")
def mypy_on_client(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[str]]:
    workdir = tmp_path_factory.mktemp("client")
    # Outside the repository, so mypy can only find the package the way a
    # user's mypy would: installed, through the environment's site-packages.
    assert ROOT not in workdir.resolve().parents
    (workdir / "client.py").write_text(CLIENT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in {"MYPYPATH", "PYTHONPATH"}}
    result = subprocess.run(
        [
            str(BIN / "mypy"),
            "--strict",
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            ".mypy_cache",
            "client.py",
        ],
        check=False,  # mypy exits 1 on the deliberate error; the tests read its output
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, (result.stdout + result.stderr).splitlines()


def test_mypy_finds_the_installed_types(mypy_on_client: tuple[int, list[str]]) -> None:
    _code, lines = mypy_on_client
    output = "\n".join(lines)
    for symptom in (
        "py.typed",
        "missing library stubs",
        "Cannot find implementation",
        "import-not-found",
        "import-untyped",
    ):
        assert symptom not in output, output
    # The revealed type proves mypy read the annotations rather than falling back to Any.
    revealed = [line for line in lines if line.startswith(f"client.py:{REVEAL_LINE}: note: Revealed type")]
    assert revealed, output
    assert "fencekeeper.kernel.machines.Machine[fencekeeper.kernel.machines.ExecutionState" in revealed[0], output


def test_mypy_reports_exactly_the_deliberate_error(mypy_on_client: tuple[int, list[str]]) -> None:
    code, lines = mypy_on_client
    errors = [line for line in lines if re.match(r"^[^:]+:\d+: error:", line)]
    assert code == 1, "\n".join(lines)
    assert len(errors) == 1, "\n".join(lines)
    assert errors[0].startswith(f"client.py:{DELIBERATE_LINE}: error: Incompatible types in assignment")
    assert '"ExecutionState"' in errors[0] and '"int"' in errors[0] and errors[0].endswith("[assignment]")


def test_version_flag_and_python_dash_m(tmp_path: Path) -> None:
    expected = f"fencekeeper {importlib.metadata.version('fencekeeper')}"
    for command in ([str(BIN / "fencekeeper"), "--version"], [sys.executable, "-m", "fencekeeper", "--version"]):
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert (result.returncode, result.stdout.strip(), result.stderr) == (0, expected, "")
    result = subprocess.run(
        [sys.executable, "-m", "fencekeeper", "nosuchcommand"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False,
    )
    assert result.returncode == 2 and "invalid choice: 'nosuchcommand'" in result.stderr


def test_the_license_is_an_spdx_expression_with_its_file() -> None:
    metadata = importlib.metadata.metadata("fencekeeper")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]
    assert "Version 2.0, January 2004" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]
