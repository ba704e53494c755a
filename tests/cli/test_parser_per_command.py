"""A command line that names a command of cli.py builds that command's parser alone, and parses exactly as the whole one.

Building every command's parser cost each ``fencekeeper worker`` about 3
ms of start-up more than building its own (``cli._parser``).  What a user
sees must not change with it: the top-level help, every command's help and
usage, every usage error and every parsed value are compared here, command
by command, with those of the parser of every command (``cli._parser()``),
which the top-level help, the groups' commands and anything unusual before
the command still use.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from fencekeeper.adapters import cli
from tests.cli.runner import environment, fencekeeper

WIDTH = "100"  # argparse wraps help to the terminal's width; both sides are given the same


def _parsed(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[object, str, str]:
    """What parsing ``argv`` gives: the exit code (or the namespace's values) and what was printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: object = vars(parser.parse_args(argv))
        except SystemExit as exc:
            result = ("exit", exc.code)
    return result, out.getvalue(), err.getvalue()


def _lines(name: str) -> list[list[str]]:
    """Command lines through ``name``: help, usage errors of every kind and complete lines, of its options and others'."""
    return [
        [name],
        [name, "--help"],
        [name, "-h"],
        ["--debug", name, "--help"],
        ["--debug", "--debug", name, "--no-such-option"],
        [name, "--no-such-option"],
        [name, "--db"],
        [name, "--db", "x.db", "--json", "--debug"],
        [name, "--db", "x.db", "--concurrency", "2", "--until-idle", "--as", "user:a", "--as", "user:b"],
        [name, "x", "--db", "x.db", "--format", "dot"],
        [name, "--db", "x.db", "--state", "no-such-state"],
        [name, "e-1", "--db", "x.db", "--approve", "--reject", "--as", "user:r"],
        [name, "--poll", "0", "--db", "x.db"],
        [name, "--db", "x.db", "--conc", "2"],
    ]


# (the command whose parser alone is built, or None for every command's; the command line)
CASES = [(name, line) for name in cli._COMMAND_PARSERS for line in _lines(name)] + [
    (None, line)
    for line in (["--help"], ["-h"], ["help"], [], ["--version"], ["-1", "worker"], ["--debug"], ["--debug", "-h"])
]


@pytest.fixture(autouse=True)
def _width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", WIDTH)


@pytest.mark.parametrize(("chosen", "argv"), CASES, ids=[" ".join(line) or "(nothing)" for _, line in CASES])
def test_the_parser_built_for_a_command_line_parses_it_as_the_whole_parser(chosen: str | None, argv: list[str]) -> None:
    assert cli._chosen_command(argv) == chosen
    assert _parsed(cli._parser(only=chosen), argv) == _parsed(cli._parser(), argv)


def test_the_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    shown = capsys.readouterr().out
    assert shown == cli._parser().format_help()
    [commands] = [a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in commands.choices:
        assert re.search(rf"^    {re.escape(name)}\s", shown, re.MULTILINE), name


@pytest.mark.parametrize("name", list(cli._COMMAND_PARSERS))
def test_each_commands_help_is_the_whole_parsers(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    [commands] = [a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)]
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == commands.choices[name].format_help()


def test_the_console_script_shows_the_worker_help_of_the_whole_parser(tmp_path: Path) -> None:
    result = fencekeeper("worker", "--help", cwd=tmp_path, env=environment(COLUMNS=WIDTH))
    assert result.returncode == 0, result.stderr
    [commands] = [a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert result.stdout == commands.choices["worker"].format_help()
