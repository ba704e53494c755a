"""The ``fencekeeper`` command line, through the installed console script.

Every test runs the real entry point in a subprocess, from a directory
outside the repository, so what is tested is what a user types: argument
parsing, exit codes, stdout and stderr, and that no traceback escapes.
Exit codes (adapters/cli.py): 0 success, 1 a check found a problem, 2 bad
usage or input.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fencekeeper.adapters.diagrams import render_diagram
from fencekeeper.kernel import EXECUTION, MACHINES, ExecutionEvent, ExecutionState

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs" / "machines"
FENCEKEEPER = Path(sys.executable).parent / "fencekeeper"


def fencekeeper(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FENCEKEEPER), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        # The docs quote the seeds' box-drawing arrows; decode as the CLI writes.
        encoding="utf-8",
        check=False,  # exit codes are part of what is tested
        timeout=60,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The CLI's contract for errors: one line on stderr, a non-zero code, no traceback."""
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fencekeeper: error: "), lines[0]
    return lines[0]


# --- demo ------------------------------------------------------------------------

# "  running      --finalize_succeeded--> succeeded    dispatch: succeeded"
_WALK_LINE = re.compile(r"^\s+(\w+)\s+--(\w+?)-*>\s+(\w+)\s+dispatch: (\w+)$")


def test_demo_walks_to_succeeded_and_shows_a_refusal(tmp_path: Path) -> None:
    result = fencekeeper("demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "[illegal_transition]" in result.stdout
    walk = [m.groups() for m in map(_WALK_LINE.match, result.stdout.splitlines()) if m]
    assert walk, result.stdout
    # Every line of the walk must be a step the kernel itself allows, each
    # starting where the previous one ended, from the initial state.
    state = EXECUTION.initial[0]
    for source, event, target, _dispatch in walk:
        assert source == state.value
        state = EXECUTION.step(state, ExecutionEvent(event))
        assert target == state.value
    assert state is ExecutionState.SUCCEEDED
    assert walk[-1][3] == "succeeded"


# --- diagram ------------------------------------------------------------------------


def test_diagram_prints_mermaid(tmp_path: Path) -> None:
    result = fencekeeper("diagram", "execution", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stateDiagram-v2" in result.stdout
    assert result.stdout == render_diagram(EXECUTION.spec, "mermaid")


def test_diagram_prints_dot(tmp_path: Path) -> None:
    result = fencekeeper("diagram", "node", "--format", "dot", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("digraph")
    assert result.stdout == render_diagram(MACHINES["node"].spec, "dot")


def test_diagram_of_unknown_machine_is_a_usage_error(tmp_path: Path) -> None:
    result = fencekeeper("diagram", "nosuchmachine", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("usage: fencekeeper diagram")
    assert "invalid choice: 'nosuchmachine'" in result.stderr
    for name in MACHINES:
        assert repr(name) in result.stderr  # the error lists what would have worked


# --- export-specs --------------------------------------------------------------------


def test_export_specs_writes_the_committed_files(tmp_path: Path) -> None:
    out = tmp_path / "machines"
    out.mkdir()
    result = fencekeeper("export-specs", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in out.iterdir())
    committed = sorted(p.name for p in SPECS.glob("*.toml"))
    assert len(written) == 5
    assert written == committed
    for name in written:
        assert (out / name).read_bytes() == (SPECS / name).read_bytes(), f"{name} differs from specs/machines/{name}"


def test_export_specs_to_a_file_is_one_error_line(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me\n", encoding="utf-8")
    line = assert_one_error_line(fencekeeper("export-specs", target, cwd=tmp_path), code=2)
    assert str(target) in line and "not a directory" in line
    assert target.read_text(encoding="utf-8") == "keep me\n"


def test_export_specs_to_a_missing_directory_is_one_error_line(tmp_path: Path) -> None:
    target = tmp_path / "missing"
    line = assert_one_error_line(fencekeeper("export-specs", target, cwd=tmp_path), code=2)
    assert str(target) in line
    assert not target.exists()


# --- docs ---------------------------------------------------------------------------


def test_docs_prints_the_committed_page(tmp_path: Path) -> None:
    result = fencekeeper("docs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.encode("utf-8") == (ROOT / "docs" / "machines.md").read_bytes(), (
        "fencekeeper docs differs from docs/machines.md; run `make specs`"
    )


# --- check-spec ----------------------------------------------------------------------


def test_check_spec_accepts_the_committed_specs(tmp_path: Path) -> None:
    files = sorted(SPECS.glob("*.toml"))
    result = fencekeeper("check-spec", *files, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [line.split(": ok")[0] for line in result.stdout.splitlines()] == [str(p) for p in files]


def test_check_spec_names_the_broken_transition(tmp_path: Path) -> None:
    # Duplicating a transition breaks the unique (source, event) rule.
    text = (SPECS / "execution.toml").read_text(encoding="utf-8")
    first = text.index("[[transitions]]")
    second = text.index("[[transitions]]", first + 1)
    broken = tmp_path / "execution.toml"
    broken.write_text(text + "\n" + text[first:second], encoding="utf-8")
    line = assert_one_error_line(fencekeeper("check-spec", broken, cwd=tmp_path), code=1)
    assert str(broken) in line and "duplicate (source, event) pair" in line and "claim: eligible -> running" in line


def test_check_spec_of_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    line = assert_one_error_line(fencekeeper("check-spec", missing, cwd=tmp_path), code=2)
    assert str(missing) in line and "cannot read" in line


@pytest.mark.parametrize("args", [(), ("nosuchcommand",)])
def test_missing_or_unknown_command_is_a_usage_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = fencekeeper(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: fencekeeper")
    assert "Traceback" not in result.stderr
