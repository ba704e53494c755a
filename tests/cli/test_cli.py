"""The machine-facing commands: diagram, docs, export-specs, check-spec, and usage errors.

Every test runs the real entry point in a subprocess (tests/cli/runner.py),
from a directory outside the repository.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fencekeeper.adapters.diagrams import render_diagram
from fencekeeper.kernel import EXECUTION, MACHINES
from tests.cli.runner import ROOT, assert_one_error_line, fencekeeper

SPECS = ROOT / "specs" / "machines"


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
    out = tmp_path / "specs"
    out.mkdir()
    result = fencekeeper("export-specs", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (out / "machines").iterdir())
    committed = sorted(p.name for p in SPECS.glob("*.toml"))
    assert len(written) == 5
    assert written == committed
    for name in written:
        assert (out / "machines" / name).read_bytes() == (SPECS / name).read_bytes(), (
            f"{name} differs from specs/machines/{name}"
        )
    # Every other spec, as shipped: the whole tree, byte for byte.
    everything = sorted(p.relative_to(SPECS.parent) for p in SPECS.parent.rglob("*") if p.is_file())
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == everything
    for relative in everything:
        assert (out / relative).read_bytes() == (SPECS.parent / relative).read_bytes(), relative


def test_export_specs_to_a_file_is_one_error_line(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("keep me\n", encoding="utf-8")
    line = assert_one_error_line(fencekeeper("export-specs", target, cwd=tmp_path), code=2)
    assert str(target) in line and "is not a directory" in line
    assert target.read_text(encoding="utf-8") == "keep me\n"


def test_export_specs_creates_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "new" / "specs"
    result = fencekeeper("export-specs", target, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (target / "machines").iterdir()) == sorted(p.name for p in SPECS.glob("*.toml"))
    assert (target / "protocol.md").is_file() and (target / "definition.schema.json").is_file()


def test_export_specs_under_a_file_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("keep me\n", encoding="utf-8")
    target = tmp_path / "a-file" / "machines"
    line = assert_one_error_line(fencekeeper("export-specs", target, cwd=tmp_path), code=2)
    assert str(target) in line and "cannot create" in line


@pytest.mark.parametrize(("conflict", "kind"), [("machines", "file"), ("conformance", "file"), ("protocol.md", "dir")])
def test_export_specs_over_a_conflicting_path_is_one_error_line_naming_it_and_writes_nothing(
    tmp_path: Path, conflict: str, kind: str
) -> None:
    # Before: a file where a spec directory goes was blamed on DIR itself, or
    # ended as "internal error: FileExistsError" / "IsADirectoryError", with
    # the specs before it already written.
    target = tmp_path / "specs"
    target.mkdir()
    if kind == "file":
        (target / conflict).write_text("keep me\n", encoding="utf-8")
    else:
        (target / conflict).mkdir()
    line = assert_one_error_line(fencekeeper("export-specs", target, cwd=tmp_path), code=2)
    assert line.startswith(f"fencekeeper: error: {target / conflict}: "), line
    assert "internal error" not in line
    assert sorted(p.name for p in target.iterdir()) == [conflict]


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
