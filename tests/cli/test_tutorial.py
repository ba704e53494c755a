"""docs/tutorial.md runs as written: every file it shows is written, every command it shows is run.

The tutorial is read top to bottom.  A fenced ``toml`` or ``json`` block
preceded by ``<!-- file: NAME -->`` is written to NAME; a fenced ``console`` block holds
commands (lines starting with ``$ ``, continued with a trailing backslash)
and what they print.  Each command runs in a shell in a fresh directory with
the installed ``fencekeeper`` first on PATH, and:

- it must succeed, unless what the tutorial shows for it is an error line
  (``fencekeeper: error: ...``), in which case it must fail;
- the lines the tutorial shows must appear in its output (stdout, then
  stderr), in order; ``...`` stands for lines left out, ``…`` for a part of
  a line that differs from run to run (a time, a token, a generated id), and
  runs of spaces match any alignment.

Run ``python -m tests.cli.test_tutorial`` to print what each command prints
now, for writing the tutorial.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs

from tests.cli.runner import FENCEKEEPER, ROOT, environment

TUTORIAL = ROOT / "docs" / "tutorial.md"
_FILE_MARKER = re.compile(r"<!-- file: (\S+) -->")


@attrs.frozen
class File:
    name: str
    text: str


@attrs.frozen
class Command:
    line: int
    command: str
    shown: tuple[str, ...]


def steps(markdown: str) -> Iterator[File | Command]:
    lines = markdown.splitlines()
    pending: str | None = None
    n = 0
    while n < len(lines):
        line = lines[n]
        marker = _FILE_MARKER.fullmatch(line.strip())
        if marker:
            pending = marker.group(1)
        elif line.startswith("```"):
            language = line[3:].strip()
            end = lines.index("```", n + 1)
            body = lines[n + 1 : end]
            if language in ("toml", "json") and pending is not None:
                yield File(pending, "\n".join(body) + "\n")
                pending = None
            elif language == "console":
                yield from _commands(body, n + 2)
            n = end
        n += 1


def _commands(body: list[str], first_line: int) -> Iterator[Command]:
    current: list[str] = []
    shown: list[str] = []
    start = first_line
    for offset, line in enumerate(body):
        if line.startswith("$ "):
            if current:
                yield Command(start, " ".join(current), tuple(shown))
            current, shown, start = [line[2:]], [], first_line + offset
        elif current and current[-1].endswith("\\"):
            current[-1] = current[-1][:-1].rstrip()
            current.append(line.strip())
        else:
            shown.append(line)
    if current:
        yield Command(start, " ".join(current), tuple(shown))


def _pattern(shown: str) -> re.Pattern[str]:
    parts = re.split(r"( +|…)", shown.rstrip())
    spelled = "".join(" +" if p.startswith(" ") else ".*" if p == "…" else re.escape(p) for p in parts if p)
    return re.compile(spelled)


def run(command: Command, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = environment(PATH=f"{FENCEKEEPER.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(
        ["bash", "-c", command.command],
        cwd=cwd,
        capture_output=True,
        encoding="utf-8",
        check=False,
        timeout=60,
        env=env,
    )


def check(command: Command, result: subprocess.CompletedProcess[str]) -> None:
    where = f"docs/tutorial.md:{command.line}: $ {command.command}"
    output = [line.rstrip() for line in (result.stdout + result.stderr).splitlines()]
    expect_error = any(line.startswith("fencekeeper: error:") for line in command.shown)
    if expect_error:
        assert result.returncode != 0, f"{where}: expected a failure, exit 0\n{result.stdout}"
    else:
        assert result.returncode == 0, f"{where}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    position = 0
    for shown in command.shown:
        if shown.strip() in ("...", ""):
            continue
        pattern = _pattern(shown)
        while position < len(output) and not pattern.fullmatch(output[position]):
            position += 1
        assert position < len(output), f"{where}: {shown!r} not found (in order) in:\n" + "\n".join(output)
        position += 1


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    commands = 0
    for step in steps(TUTORIAL.read_text(encoding="utf-8")):
        if isinstance(step, File):
            (tmp_path / step.name).write_text(step.text, encoding="utf-8")
        else:
            check(step, run(step, tmp_path))
            commands += 1
    assert commands >= 15, "the tutorial should be a tour of the command line"


def test_before_you_start_leaves_the_reader_in_an_empty_directory_each_time(tmp_path: Path) -> None:
    """Its setup, run from the repository root twice: a second run of the tutorial starts empty, not on the first's ids."""
    section = TUTORIAL.read_text(encoding="utf-8").split("## Before you start", 1)[1].split("\n## ", 1)[0]
    [setup] = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert 'export PATH="$PWD/.venv/bin:$PATH"' in setup
    script = f"{setup}\npwd\nls -A\n"

    def run_setup() -> list[str]:
        result = subprocess.run(
            ["bash", "-e", "-c", script], cwd=ROOT, env=environment(TMPDIR=str(tmp_path)),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    first = run_setup()
    assert len(first) == 1, first  # the directory, and nothing in it
    (Path(first[0]) / "shop.db").touch()  # the first run's store
    second = run_setup()
    assert len(second) == 1 and second != first, (first, second)

if __name__ == "__main__":  # pragma: no cover - a helper for writing the tutorial
    with tempfile.TemporaryDirectory() as scratch:
        for item in steps(TUTORIAL.read_text(encoding="utf-8")):
            if isinstance(item, File):
                (Path(scratch) / item.name).write_text(item.text, encoding="utf-8")
                continue
            outcome = run(item, Path(scratch))
            sys.stdout.write(f"$ {item.command}\n{outcome.stdout}{outcome.stderr}[exit {outcome.returncode}]\n\n")
