"""docs/journal.md runs as written, in a copy of docs/examples/journal.

The same conventions as docs/tutorial.md (tests/cli/test_tutorial.py): a
fenced ``console`` block holds ``$`` commands and what they print; a
command must succeed unless what is shown is an error line; the lines shown
must appear in its output in order (``...`` lines left out, ``…`` any text).

A plain ``fencekeeper ...`` command (no shell syntax) runs in this process,
through the same ``main`` the console script calls, with the same
arguments, stdout, stderr and exit code: starting the interpreter and
importing the command line costs about a second a command on a busy
machine, which is most of this test.  Anything with shell syntax runs in
bash with the installed ``fencekeeper`` first on PATH, as the tutorial's
commands do.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import shutil
from pathlib import Path

import pytest

from fencekeeper.adapters import cli, journal_fixtures
from fencekeeper.kernel import journal as j
from fencekeeper.kernel.dag import verify_workflow, workflow_from_json
from tests.cli.runner import ROOT
from tests.cli.test_tutorial import Command, _pattern, run, steps

DOC = ROOT / "docs" / "journal.md"
EXAMPLE = ROOT / "docs" / "examples" / "journal"


def check(command: Command, output: str, returncode: int) -> None:
    where = f"docs/journal.md:{command.line}: $ {command.command}"
    lines = [line.rstrip() for line in output.splitlines()]
    if any(line.startswith("fencekeeper: error:") for line in command.shown):
        assert returncode != 0, f"{where}: expected a failure, exit 0\n{output}"
    else:
        assert returncode == 0, f"{where}: exit {returncode}\n{output}"
    position = 0
    for shown in command.shown:
        if shown.strip() in ("...", ""):
            continue
        pattern = _pattern(shown)
        while position < len(lines) and not pattern.fullmatch(lines[position]):
            position += 1
        assert position < len(lines), f"{where}: {shown!r} not found (in order) in:\n" + "\n".join(lines)
        position += 1


def in_process(command: str) -> tuple[str, int] | None:
    """Run a plain ``fencekeeper`` command through ``cli.main``; None if it needs a shell."""
    # Anything a shell would expand or connect, outside single quotes, needs bash.
    raw = shlex.split(command, posix=False)
    if raw[0] != "fencekeeper" or any(c in "$|&;<>`" for word in raw if not word.startswith("'") for c in word):
        return None
    words = shlex.split(command)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(words[1:])
    return stdout.getvalue() + stderr.getvalue(), code


def test_the_journal_guide_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in EXAMPLE.iterdir():
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    commands = 0
    for step in steps(DOC.read_text(encoding="utf-8")):
        assert isinstance(step, Command), "docs/journal.md writes no files; its files are docs/examples/journal"
        done = in_process(step.command)
        if done is None:
            result = run(step, tmp_path)
            done = (result.stdout + result.stderr, result.returncode)
        check(step, *done)
        commands += 1
    assert commands >= 15


def test_the_example_is_the_fixture_packs_review() -> None:
    workflow = verify_workflow(workflow_from_json(json.loads((EXAMPLE / "review.workflow.json").read_bytes())))
    policy = j.verify_policy(j.policy_from_json(json.loads((EXAMPLE / "review.policy.json").read_bytes())), workflow)
    expected_workflow, expected_policy = journal_fixtures.verified()
    assert workflow.digest == expected_workflow.digest
    assert policy.digest == expected_policy.digest
