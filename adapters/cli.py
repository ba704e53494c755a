"""The ``fencekeeper`` command line.

Rules of this module:

- It translates: arguments in, kernel calls, text out.  It decides nothing
  the kernel or a store should decide.
- Every error is one clear line on stderr naming the file or argument, and a
  non-zero exit; a traceback appears only with ``--debug``.
- Exit codes: 0 success, 1 a check found a problem (an invalid spec file),
  2 bad usage or input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fencekeeper.kernel.errors import KernelError
from fencekeeper.kernel.machines import MACHINES
from fencekeeper.kernel.spec import parse_machine_spec, render_machine_spec

from . import demo
from .diagrams import machines_markdown, render_diagram

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2


class CliError(Exception):
    """An error the user can act on; printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencekeeper",
        description="A formally specified kernel for durable workflow execution.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("demo", help="walk through the machines and the fencing protocol")

    diagram = sub.add_parser("diagram", help="render a machine's diagram from its spec")
    diagram.add_argument("machine", choices=sorted(MACHINES), metavar="MACHINE", help=", ".join(MACHINES))
    diagram.add_argument("--format", choices=("mermaid", "dot"), default="mermaid")

    sub.add_parser("docs", help="print docs/machines.md as generated from the kernel's tables")

    export = sub.add_parser("export-specs", help="write specs/machines/*.toml from the kernel's tables")
    export.add_argument("directory", type=Path)

    check = sub.add_parser("check-spec", help="validate machine spec TOML files")
    check.add_argument("files", type=Path, nargs="+", metavar="FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (CliError, KernelError) as exc:
        if args.debug:
            raise
        code = exc.exit_code if isinstance(exc, CliError) else EXIT_PROBLEM
        print(f"fencekeeper: error: {exc}", file=sys.stderr)
        return code


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        demo.run(sys.stdout)
    elif args.command == "diagram":
        sys.stdout.write(render_diagram(MACHINES[args.machine].spec, args.format))
    elif args.command == "docs":
        sys.stdout.write(machines_markdown())
    elif args.command == "export-specs":
        _export_specs(args.directory)
    elif args.command == "check-spec":
        for path in args.files:
            spec = parse_machine_spec(_read(path), str(path))
            print(f"{path}: ok ({spec.name}: {len(spec.states)} states, {len(spec.transitions)} transitions)")
    return EXIT_OK


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not UTF-8 text") from None


def _export_specs(directory: Path) -> None:
    if not directory.is_dir():
        raise CliError(f"{directory}: not a directory")
    for machine in MACHINES.values():
        (directory / f"{machine.name}.toml").write_text(render_machine_spec(machine.spec), encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
