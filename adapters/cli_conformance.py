"""``fencekeeper conformance``: run the language-neutral suite against any implementation's driver.

Rules of this module:

- It is imported only when the command runs (``cli.py`` imports it lazily),
  so the rest of the command line pays nothing for it.
- Exit codes are the command line's: 0 when no case failed, 1 when any case
  failed, 2 when what was typed cannot be acted on (no such case directory,
  a driver that cannot be started or breaks the protocol), and one of this
  command's own, 3, when the run checked nothing: every case of the chosen
  layers was skipped.  A CI job that runs a driver declaring nothing, or
  misspelling every layer, must not report success; a code of its own lets a
  script that means to accept an empty run say so (``|| test $? -eq 3``)
  without a flag here.  A skipped layer is reported as skipped, never as
  passed.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from pathlib import Path

from fencekeeper.kernel.common import shown, shown_text

from .render import Output

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
EXIT_NOTHING_RAN = 3
"""No case passed or failed: every one was skipped, so the run says nothing about the implementation."""
MAX_TIMEOUT = 3600.0
"""The longest wait for one answer --timeout takes: an hour, past which a driver has surely stopped."""


def run(args: argparse.Namespace, out: Output) -> int:
    from .conformance import cases, runner  # noqa: PLC0415 - loaded only for this command

    if args.generate is not None:
        try:
            written = cases.generate(args.generate)
        except OSError as exc:
            out.note(f"fencekeeper: error: {args.generate}: cannot write: {exc.strerror}")
            return EXIT_USAGE
        if getattr(args, "json", False):
            out.data([str(path) for path in written])
        else:
            for path in written:
                print(path)
        return EXIT_OK
    if not args.driver:
        out.note("fencekeeper: error: give --driver CMD (the implementation's driver) or --generate DIR")
        return EXIT_USAGE
    timeout = args.timeout
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT:
        out.note(f"fencekeeper: error: --timeout: must be more than 0 and at most {MAX_TIMEOUT:g} seconds, got {timeout:g}")
        return EXIT_USAGE
    directory = args.cases if args.cases is not None else runner.packaged_cases()
    layers = args.layer or list(cases.LAYERS)
    missing = [layer for layer in layers if not (directory / f"{layer}.json").is_file()]
    if missing:
        out.note(f"fencekeeper: error: {directory}: no case file for {', '.join(missing)}")
        return EXIT_USAGE
    try:
        shlex.split(args.driver)
        reports = runner.run(
            args.driver, layers, directory, response_timeout=timeout,
            warn=lambda message: out.note(f"fencekeeper: warning: {message}"),
        )
    except runner.CaseFileError as exc:
        out.note(f"fencekeeper: error: {exc}")
        return EXIT_USAGE
    except (OSError, ValueError) as exc:
        out.note(f"fencekeeper: error: --driver {shown(args.driver)}: cannot start: {shown_text(exc)}")
        return EXIT_USAGE
    except runner.DriverError as exc:
        out.note(f"fencekeeper: error: the driver broke the protocol: {exc}")
        return EXIT_USAGE
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(runner.as_json(reports), indent=2, sort_keys=True) + "\n")
    else:
        print(runner.render(reports, args.driver))
    if any(r.failed for r in reports):
        return EXIT_PROBLEM
    if not any(r.passed for r in reports):
        reasons = sorted({r.skip_reason for r in reports if r.skip_reason})
        out.note(f"fencekeeper: error: no case ran: every case of {', '.join(r.layer for r in reports)} was skipped"
                 + (f" ({'; '.join(reasons)})" if reasons else ""))
        return EXIT_NOTHING_RAN
    return EXIT_OK


def add_parser(command: object) -> None:
    """Add ``conformance`` through ``cli.py``'s ``command`` helper."""
    assert callable(command)
    parser: argparse.ArgumentParser = command(
        "conformance",
        "run the language-neutral conformance suite against an implementation's driver",
        prints_data=True,
        description="Starts CMD, sends it the cases of specs/conformance one JSON line at a time and reports, "
        "per layer, how many passed, failed and were skipped, with the first difference in full "
        "(docs/conformance.md). Exits 1 on any failure, 3 when every case was skipped.",
    )
    parser.add_argument("--driver", metavar="CMD", help="the command that starts the implementation's driver")
    parser.add_argument(
        "--layer",
        action="append",
        choices=("machines", "protocol", "recovery", "expressions", "definitions", "operations", "journal", "journal-append", "interpreter", "store"),
        help="run only this layer (repeatable; default: all)",
    )
    parser.add_argument("--cases", type=Path, metavar="DIR", help="case files (default: the ones shipped)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help=f"how long to wait for each answer of the driver (default 30, at most {MAX_TIMEOUT:g}): a slow store's driver may need more",
    )
    parser.add_argument("--generate", type=Path, metavar="DIR", help="write the case files from the kernel into DIR")
