"""Check the kernel's PEP 316 docstring contracts with CrossHair; exit non-zero on any failure.

Run from the repository root as ``python -m tests.contracts.run_crosshair``
(``make contracts``).  It runs the installed ``crosshair check`` CLI over
every module under ``kernel/`` and ``adapters/`` whose docstrings carry
``post:`` lines, with a per-condition CPU budget, and fails if CrossHair:

- reports a counterexample or any other error, or exits non-zero;
- does not report on every ``post:`` line it was given (a contract CrossHair
  silently skips proves nothing);
- cannot confirm, over *all* paths, a contract whose inputs are finite
  (``Machine.allows``, ``Machine.events_from``, ``dispatch_state_of``,
  ``initial_node_state``).  Those have a few hundred paths at most, so "not
  confirmed" there means the analysis did not really run (every attempt
  ignored, or the budget too small), not that the contract is hard.
  ``Machine.step`` is finite too, but its refusal path formats an error
  message, and CrossHair treats the length of that text as symbolic, so
  that branch never closes; step's contracts get the time budget instead.

CrossHair cannot make symbolic values for ``Machine`` on its own (its
``state_type: type[S]`` field and the ``S``/``E`` type variables bound to
``enum.Enum`` have no values), so a plugin registers a factory that picks one
of the five real machines and draws ``state``/``event`` from *that*
machine's enums.  The contracts are therefore checked against the real
tables, every (machine, state, event) combination.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FunctionType
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"kernel": "fencekeeper.kernel", "adapters": "fencekeeper.adapters"}
PER_CONDITION_TIMEOUT = 4.0
# A hard wall-clock stop for the whole run, so a CrossHair hang cannot stall CI.
OVERALL_TIMEOUT = 150.0

# Contracts whose whole input space is finite: CrossHair must exhaust it.
EXHAUSTIVE = frozenset(
    {
        "fencekeeper.kernel.machines.Machine.allows",
        "fencekeeper.kernel.machines.Machine.events_from",
        "fencekeeper.kernel.machines.dispatch_state_of",
        "fencekeeper.kernel.machines.initial_node_state",
    }
)

_PLUGIN = """\
from tests.contracts.run_crosshair import register_symbolic_machines
register_symbolic_machines()
"""

_MESSAGE = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<kind>error|info|warning): (?P<text>.*)$")
_MAX_MESSAGE = 400
_POST = re.compile(r"^\s*:?post(\[[\w\s,.]*\])?::?\s*(?P<expr>.*?)\s*$")


def crosshair_executable() -> Path:
    """The ``crosshair`` CLI installed next to the running interpreter."""
    return Path(sys.executable).with_name("crosshair")


@dataclass(frozen=True)
class Contract:
    """One ``post:`` condition: where CrossHair will report on it, and whose it is."""

    path: str
    line: int
    function: str

    def where(self) -> str:
        return f"{os.path.relpath(self.path, ROOT)}:{self.line} ({self.function})"


@dataclass
class Report:
    """What one ``crosshair check`` run said, line by line."""

    returncode: int
    seconds: float
    errors: list[str] = field(default_factory=list)
    refuted: set[tuple[str, int]] = field(default_factory=set)
    confirmed: set[tuple[str, int]] = field(default_factory=set)
    unconfirmed: set[tuple[str, int]] = field(default_factory=set)
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.errors


def check(
    targets: Sequence[str],
    *,
    per_condition_timeout: float = PER_CONDITION_TIMEOUT,
    plugins: Sequence[Path] = (),
    timeout: float = OVERALL_TIMEOUT,
    cwd: Path = ROOT,
) -> Report:
    """Run ``crosshair check`` on ``targets`` (modules, functions or files) and parse what it says."""
    command = [
        str(crosshair_executable()),
        "check",
        *targets,
        "--analysis_kind=PEP316",
        f"--per_condition_timeout={per_condition_timeout}",
        "--report_all",
    ]
    if plugins:
        # --extra_plugin takes several values, so it must come after the targets.
        command += ["--extra_plugin", *map(str, plugins)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Report(returncode=-1, seconds=time.monotonic() - start, errors=[f"crosshair ran over {timeout:.0f}s"])
    report = Report(returncode=done.returncode, seconds=time.monotonic() - start, stderr=done.stderr)
    for line in done.stdout.splitlines():
        match = _MESSAGE.match(line)
        if not match:
            if line.strip():
                report.errors.append(f"unexpected crosshair output: {line}")
            continue
        path = os.path.realpath(match["file"])
        key = (path, int(match["line"]))
        if match["kind"] != "info":
            report.refuted.add(key)
            text = match["text"]
            # A counterexample repr can be pages long (a whole Machine); the
            # head names the call and the file:line says which contract.
            text = text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."
            report.errors.append(f"{os.path.relpath(path, cwd)}:{key[1]}: {match['kind']}: {text}")
        elif match["text"].startswith("Confirmed over all paths"):
            report.confirmed.add(key)
        elif match["text"].startswith("Not confirmed"):
            report.unconfirmed.add(key)
        else:
            report.errors.append(f"unexpected crosshair message: {line}")
    if done.returncode != 0 and not report.errors:
        last = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        report.errors.append(f"crosshair failed: {last[0]}")
    return report


def contracts_in(path: Path, module: str) -> list[Contract]:
    """Every inline ``post:`` condition in the docstrings of ``path``, with its qualified owner."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: list[Contract] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = child.body
                if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    doc = body[0].value
                    if isinstance(doc.value, str):
                        # The raw source lines of the docstring, so line numbers are
                        # the ones CrossHair reports.
                        first, last = doc.lineno, doc.end_lineno or doc.lineno
                        for number in range(first, last + 1):
                            match = _POST.match(lines[number - 1].strip().strip('"'))
                            if match and match["expr"]:
                                found.append(Contract(os.path.realpath(path), number, f"{module}.{prefix}{child.name}"))
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return found


def contract_modules(root: Path = ROOT) -> dict[str, list[Contract]]:
    """Module name -> its contracts, for every package module that has any."""
    modules: dict[str, list[Contract]] = {}
    for directory, package in PACKAGES.items():
        for path in sorted((root / directory).rglob("*.py")):
            parts = path.relative_to(root / directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = ".".join([package, *parts])
            contracts = contracts_in(path, module)
            if contracts:
                modules[module] = contracts
    return modules


def write_plugin(directory: Path) -> Path:
    """Write the ``--extra_plugin`` file that calls :func:`register_symbolic_machines`.

    CrossHair ``exec``s a plugin's text inside one of its own functions, so
    names the plugin defines are invisible to functions it defines; the
    plugin therefore only imports this module and calls one function.
    """
    plugin = directory / "symbolic_machines.py"
    plugin.write_text(_PLUGIN, encoding="utf-8")
    return plugin


def register_symbolic_machines() -> None:
    """CrossHair plugin: make ``Machine`` arguments one of the real machines.

    Runs inside the ``crosshair`` process (loaded through ``--extra_plugin``).
    ``self`` is generated before ``state`` and ``event``, so remembering the
    machine chosen for this path lets the type variables be resolved to its
    enums.  This reaches into ``crosshair.core._ARG_GENERATION_RENAMES``
    (the per-parameter argument makers), which is why crosshair-tool is
    pinned in constraints.txt; if that ever changes, the "confirmed over all
    paths" requirement above fails loudly rather than passing vacuously.
    """
    # Imported here, not at the top: these are needed only inside the
    # crosshair process, and the runner itself must not depend on
    # CrossHair's internals just to start a subprocess.
    from crosshair import IgnoreAttempt, core, register_type  # noqa: PLC0415
    from crosshair.util import renamed_function  # noqa: PLC0415

    from fencekeeper.kernel import machines  # noqa: PLC0415

    chosen: list[machines.Machine[Any, Any]] = []

    def symbolic_machine(factory: Any, *type_args: Any) -> machines.Machine[Any, Any]:
        candidates = list(machines.MACHINES.values())
        pick = candidates[-1]
        for machine in candidates[:-1]:
            if factory.space.smt_fork(desc=f"machine_{machine.name}"):
                pick = machine
                break
        chosen[:] = [pick]
        return pick

    register_type(machines.Machine, symbolic_machine)

    def argument_maker(name: str, resolve: Callable[[machines.Machine[Any, Any]], type]) -> Callable[..., Any]:
        def make(typ: Any, varname: str, allow_subtypes: bool = False) -> Any:
            if typ is machines.S or typ is machines.E:
                if not chosen:
                    raise IgnoreAttempt(f"{name!r} generated before its machine")  # type: ignore[no-untyped-call]
                typ = resolve(chosen[-1])
            return core.proxy_for_type(typ, varname, allow_subtypes)

        # CrossHair tells arguments apart by the maker's code name.
        return cast(Callable[..., Any], renamed_function(cast(FunctionType, make), f"proxy_arg_{name}"))

    core._ARG_GENERATION_RENAMES["state"] = argument_maker("state", lambda m: m.state_type)
    core._ARG_GENERATION_RENAMES["event"] = argument_maker("event", lambda m: m.event_type)


def _problems(report: Report, contracts: Iterable[Contract]) -> list[str]:
    problems = list(report.errors)
    for contract in contracts:
        key = (contract.path, contract.line)
        if key in report.refuted:
            continue  # already listed among the errors
        if key not in report.confirmed | report.unconfirmed:
            problems.append(f"{contract.where()}: crosshair did not report on this contract")
        elif contract.function in EXHAUSTIVE and key not in report.confirmed:
            problems.append(f"{contract.where()}: not confirmed over all paths of a finite input space")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    modules = contract_modules()
    contracts = [c for cs in modules.values() for c in cs]
    if not contracts:
        print("crosshair: error: no PEP 316 contracts found under kernel/ or adapters/")
        return 1
    with tempfile.TemporaryDirectory(prefix="fencekeeper-crosshair-") as tmp:
        report = check(sorted(modules), plugins=[write_plugin(Path(tmp))])
    problems = _problems(report, contracts)
    for problem in problems:
        print(f"crosshair: error: {problem}")
    if report.stderr.strip() and problems:
        print(report.stderr.rstrip(), file=sys.stderr)
    def count(keys: set[tuple[str, int]]) -> int:
        return sum((c.path, c.line) in keys for c in contracts)

    print(
        f"crosshair: {'FAILED' if problems else 'ok'}: {len(contracts)} contracts in {len(modules)} modules: "
        f"{count(report.confirmed)} confirmed over all paths, {count(report.unconfirmed)} not refuted within "
        f"{PER_CONDITION_TIMEOUT:g}s CPU each, {count(report.refuted)} refuted; {len(problems)} problems "
        f"({report.seconds:.1f}s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
