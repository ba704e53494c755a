"""Options are spelt in full: an abbreviation (``--conc`` for ``--concurrency``) is an unknown option.

argparse accepts any unambiguous prefix by default.  A script written with
one would break, or change meaning, the day an option sharing the prefix is
added, and a typo could pick an option nobody meant.  Every parser of the
command line is built with ``allow_abbrev=False`` (adapters/cli.py): the
top-level parser, each command, each subcommand of a group (argparse does
not pass the setting down), and the conformance driver's.

An abbreviation is refused like any unknown option: exit 2, nothing on
stdout, the usage of the command it was given to and then one ``fencekeeper
COMMAND: error: unrecognized arguments: ...`` line, and nothing opened or
written.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencekeeper.adapters import cli
from fencekeeper.adapters.conformance import driver
from tests.cli.runner import fencekeeper


def _parsers(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_no_parser_of_the_command_line_takes_an_abbreviation() -> None:
    parsers = dict(_parsers(cli._parser(), "fencekeeper"))
    assert {"fencekeeper worker", "fencekeeper journal show", "fencekeeper op status"} <= set(parsers)
    assert [path for path, parser in parsers.items() if parser.allow_abbrev] == []


# (an abbreviation as a script might have typed it, the same command line spelt in full)
ABBREVIATED = [
    (["--deb", "list", "--db", "{db}"], ["--debug", "list", "--db", "{db}"]),
    (["--vers", "list", "--db", "{db}"], None),  # abbreviated, it printed the version and exited 0
    (["worker", "--db", "{db}", "--conc", "8"], ["worker", "--db", "{db}", "--concurrency", "8"]),
    (["worker", "--db", "{db}", "--proc", "2"], ["worker", "--db", "{db}", "--processes", "2"]),
    (["worker", "--db", "{db}", "--until"], ["worker", "--db", "{db}", "--until-idle"]),
    (["worker", "--db={db}", "--log"], ["worker", "--db={db}", "--log-json"]),
    # --debug and --json come from parent parsers: spelt in full there too.
    (["list", "--db", "{db}", "--js"], ["list", "--db", "{db}", "--json"]),
    (["list", "--deb", "--db", "{db}"], ["list", "--debug", "--db", "{db}"]),
    (
        ["reconcile", "x-1", "--db", "{db}", "--resume", "n", "--because", "why"],
        ["reconcile", "x-1", "--db", "{db}", "--resume-at", "n", "--because", "why"],
    ),
    (
        ["decide", "x-1", "--db", "{db}", "--approve", "--as", "u", "--rat", "ok"],
        ["decide", "x-1", "--db", "{db}", "--approve", "--as", "u", "--rationale", "ok"],
    ),
    (["journal", "show", "j-1", "--db", "{db}", "--js"], ["journal", "show", "j-1", "--db", "{db}", "--json"]),
    (["op", "status", "o-1", "--db", "{db}", "--names", "n"], ["op", "status", "o-1", "--db", "{db}", "--namespace", "n"]),
    (["export", "--db", "{db}", "--until"], ["export", "--db", "{db}", "--until-idle"]),
    (["serve", "--db", "{db}", "--auth", "m", "--act", "a"], ["serve", "--db", "{db}", "--auth", "m", "--actions", "a"]),
    (["conformance", "--gen", "d"], ["conformance", "--generate", "d"]),
]


@pytest.mark.parametrize(("abbreviated", "full"), ABBREVIATED, ids=[" ".join(a) for a, _ in ABBREVIATED])
def test_an_abbreviation_is_an_unknown_option(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    abbreviated: list[str],
    full: list[str] | None,
) -> None:
    # Where a command taken in a wrong sense would write (conformance --generate d), it writes nothing.
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "shop.db")
    with pytest.raises(SystemExit) as exc:
        cli.main([arg.replace("{db}", db) for arg in abbreviated])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0].startswith("usage: fencekeeper")
    assert [line for line in lines if "error" in line] == [lines[-1]]
    # Refused by the parser whose usage is shown: the command's own after its name (test_subcommand_usage.py).
    prog = lines[0].removeprefix("usage: ").split(" [")[0]
    assert lines[-1].startswith(f"{prog}: error: unrecognized arguments: ")
    spelt = {option for _, parser in _parsers(cli._parser(), "") for option in parser._option_string_actions}
    [word] = [arg for arg in abbreviated if arg.startswith("--") and arg.split("=")[0] not in spelt]
    assert word in lines[-1]
    assert list(tmp_path.iterdir()) == []
    if full is not None:
        # The same command line spelt in full is understood (parsed only: nothing runs).
        cli._parser().parse_args([arg.replace("{db}", db) for arg in full])


def test_the_console_script_refuses_an_abbreviation_before_opening_anything(tmp_path: Path) -> None:
    result = fencekeeper("worker", "--db", tmp_path / "shop.db", "--conc", "8", "--until-idle", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == "fencekeeper worker: error: unrecognized arguments: --conc 8"
    assert list(tmp_path.iterdir()) == []


def test_the_conformance_driver_takes_its_options_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        driver.main(["--sto", "memory"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --sto memory" in capsys.readouterr().err
