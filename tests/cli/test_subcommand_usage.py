"""An option a subcommand does not know is refused by that subcommand, with its own usage.

argparse passes a subcommand's unknown arguments up to the top-level parser,
which refused them with its own usage (``fencekeeper [-h] [--debug]
[--version] COMMAND ...``): ``fencekeeper worker --db x --concurency 4``
never showed the options ``worker`` takes.  Every parser of the command line
now refuses what it does not know itself (``cli._Subcommands``), and the
conventions of any usage error hold: exit 2, nothing on stdout, the usage
and then one error line, nothing opened or written.

The cases are the parser tree itself, walked from ``cli._parser()``: a
command or subcommand added later is covered without being listed here.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekeeper.adapters import cli
from tests.cli.runner import fencekeeper

UNKNOWN = "--no-such-option"


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _value(action: argparse.Action) -> list[str]:
    """A value ``action`` parses, or none for a flag: the command line must be complete but for the unknown option."""
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    for candidate in ("1", "1s", "x"):
        try:
            if callable(action.type):
                action.type(candidate)
        except (argparse.ArgumentTypeError, TypeError, ValueError):
            continue
        return [candidate]
    raise AssertionError(f"no value parses for {action.dest}")


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """What ``parser`` requires of its own, spelt so that it parses (its subcommand, if any, excepted)."""
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            if action.required:
                words += [action.option_strings[0], *_value(action)]
        elif action.nargs not in ("?", "*"):
            words += _value(action)
    for group in parser._mutually_exclusive_groups:
        if group.required:
            first = group._group_actions[0]
            words += [*first.option_strings[:1], *_value(first)]
    return words


def _first_leaf(parser: argparse.ArgumentParser) -> tuple[tuple[str, ...], list[str]]:
    """The words after ``parser``'s name that make a complete command line, through its first subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name, sub = next(iter(action.choices.items()))
            path, words = _first_leaf(sub)
            return (name, *path), [*_required(parser), name, *words]
    return (), _required(parser)


def _command_line(path: tuple[str, ...], tree: dict[tuple[str, ...], argparse.ArgumentParser]) -> list[str]:
    """A complete command line through ``path`` (and on to a first subcommand where ``path`` names a group)."""
    words: list[str] = []
    for depth in range(1, len(path)):
        words += [path[depth - 1], *_required(tree[path[:depth]])]
    _, rest = _first_leaf(tree[path])
    return [*words, path[-1], *rest]


TREE = dict(_parsers(cli._parser()))
COMMANDS = sorted(path for path in TREE if path)
# (the command whose parser must refuse, the command line with the unknown option in it)
CASES: list[tuple[tuple[str, ...], list[str]]] = []
for _path in COMMANDS:
    _line = _command_line(_path, TREE)
    _at = len(_path)  # right after the command's own name: before anything it requires, and before any subcommand
    CASES.append((_path, [*_line[:_at], UNKNOWN, *_line[_at:]]))
    if not _first_leaf(TREE[_path])[0]:  # a command without subcommands: last, too, as a typo is typed
        CASES.append((_path, [*_line, UNKNOWN]))


def test_the_cases_are_the_whole_parser_tree() -> None:
    assert {("worker",), ("op", "submit"), ("journal", "append"), ("export",), ("prune",), ("serve",)} <= set(COMMANDS)
    assert {("op",), ("journal",), ("conformance",)} <= set(COMMANDS)
    assert {path for path, _ in CASES} == set(COMMANDS)


@pytest.mark.parametrize("command_line", [line for _, line in CASES], ids=[" ".join(line) for _, line in CASES])
def test_each_complete_command_line_parses(command_line: list[str]) -> None:
    # Without the unknown option the line is complete: the refusal below can only be the unknown option's.
    cli._parser().parse_args([word for word in command_line if word != UNKNOWN])


@pytest.mark.parametrize(("path", "command_line"), CASES, ids=[" ".join(line) for _, line in CASES])
def test_an_unknown_option_is_refused_with_the_usage_of_its_command(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    path: tuple[str, ...],
    command_line: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(command_line)
    assert exc.value.code == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    prog = " ".join(("fencekeeper", *path))
    assert lines[0].startswith(f"usage: {prog} "), lines[0]
    assert [line for line in lines if "error" in line] == [lines[-1]]
    assert lines[-1] == f"{prog}: error: unrecognized arguments: {UNKNOWN}"
    # The usage is that command's own: it shows the options the command takes.
    usage = " ".join(line.strip() for line in lines[:-1])
    for action in TREE[path]._actions:
        if action.option_strings and action.help is not argparse.SUPPRESS:
            assert action.option_strings[0] in usage, (action.option_strings[0], usage)
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_option_before_the_command_is_the_top_level_parsers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([UNKNOWN, "list", "--db", "x.db"])
    assert exc.value.code == cli.EXIT_USAGE
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("usage: fencekeeper [-h]")
    assert lines[-1] == f"fencekeeper: error: unrecognized arguments: {UNKNOWN}"


def test_the_console_script_shows_the_worker_options_for_a_mistyped_one(tmp_path: Path) -> None:
    result = fencekeeper("worker", "--db", tmp_path / "shop.db", "--concurency", "4", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("usage: fencekeeper worker ")
    assert "--concurrency N" in result.stderr
    assert lines[-1] == "fencekeeper worker: error: unrecognized arguments: --concurency 4"
    assert list(tmp_path.iterdir()) == []
