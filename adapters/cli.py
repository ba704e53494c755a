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
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from fencekeeper.kernel import modelcheck
from fencekeeper.kernel.errors import KernelError
from fencekeeper.kernel.machines import MACHINES
from fencekeeper.kernel.spec import parse_machine_spec, render_machine_spec

from . import demo, postgres_store, sqlite_store
from .diagrams import machines_markdown, render_diagram
from .store import StoreError

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

    mc = sub.add_parser(
        "modelcheck",
        help="explore every interleaving of the lease protocol and check every invariant",
        description="Without options, runs the standard configurations of specs/protocol.md.",
    )
    mc.add_argument("--workers", type=_positive, metavar="N")
    mc.add_argument("--executions", type=_positive, metavar="N")
    mc.add_argument("--claims", type=_positive, metavar="N", help="claims per execution (the fence bound)")
    mc.add_argument("--ticks", type=_positive, metavar="N", help="the last clock tick (leases last 2)")
    mc.add_argument("--depth", type=_positive, metavar="N", help="cut the search at this many moves")

    mig = sub.add_parser("migrate", help="create or upgrade a store's schema (forward-only, numbered migrations)")
    mig.add_argument("--db", required=True, metavar="URL", help="a SQLite file path, or a postgresql:// DSN")
    mig.add_argument("--schema", default="fencekeeper", help="PostgreSQL schema (default: fencekeeper)")

    check = sub.add_parser("check-spec", help="validate machine spec TOML files")
    check.add_argument("files", type=Path, nargs="+", metavar="FILE")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
    elif args.command == "modelcheck":
        return _modelcheck(args)
    elif args.command == "migrate":
        _migrate(args.db, args.schema)
    elif args.command == "check-spec":
        for path in args.files:
            spec = parse_machine_spec(_read(path), str(path))
            print(f"{path}: ok ({spec.name}: {len(spec.states)} states, {len(spec.transitions)} transitions)")
    return EXIT_OK


def _modelcheck(args: argparse.Namespace) -> int:
    chosen = {
        "workers": args.workers,
        "executions": args.executions,
        "claims_per_execution": args.claims,
        "max_tick": args.ticks,
        "max_depth": args.depth,
    }
    overrides = {k: v for k, v in chosen.items() if v is not None}
    configs = (
        [("custom", attrs.evolve(modelcheck.Bounds(), **overrides))] if overrides else list(modelcheck.STANDARD)
    )
    for title, bounds in configs:
        started = time.perf_counter()
        result = modelcheck.explore(bounds)
        seconds = time.perf_counter() - started
        scope = "complete" if result.complete else f"to depth {result.depth}"
        print(
            f"{title}: {bounds.workers} workers, {bounds.executions} executions, "
            f"{bounds.claims_per_execution} claims each, ticks 0-{bounds.max_tick}: "
            f"{result.states:,} states explored, {result.transitions:,} decisions, {scope}, {seconds:.1f}s"
        )
        if result.violation is not None:
            violation = result.violation
            print(f"VIOLATION {violation.invariant.value}: {violation.message}")
            print("shortest trace:")
            for number, label in enumerate(violation.trace, start=1):
                print(f"  {number:>2}. {label}")
            return EXIT_PROBLEM
        if not result.complete and bounds.max_depth is None:
            print(f"stopped at {bounds.max_states:,} states before the bounds were exhausted")
            return EXIT_PROBLEM
    print("every invariant of specs/protocol.md held in every explored state and write")
    return EXIT_OK


def _migrate(url: str, schema: str) -> None:
    try:
        if url.startswith(("postgresql://", "postgres://")):
            applied = postgres_store.migrate(url, schema)
            where = f"schema {schema!r}"
        else:
            # A SQLite store migrates forward when it is opened, after checking the file is its own.
            sqlite_store.SQLiteStore(url).close()
            applied, where = [], url
    except StoreError as exc:
        raise CliError(f"{exc.message} [{exc.code}]", EXIT_PROBLEM) from None
    print(f"{where}: " + (f"applied migrations {applied}" if applied else "schema is current"))


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
