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
  ignored, or the budget too small), not that the contract is hard.  They
  get a run of their own with a budget of EXHAUSTIVE_TIMEOUT: CrossHair stops
  a contract as soon as its paths are exhausted, so the large budget costs
  nothing when they are healthy, and a loaded machine (``Machine.allows``
  needs 2-4 s of a quiet core for its 79 table pairs) cannot turn a finite
  proof into a spurious failure.
  ``Machine.step`` is finite too, but its refusal path formats an error
  message, and CrossHair treats the length of that text as symbolic, so
  that branch never closes; step's contracts get the time budget instead.

CrossHair cannot make symbolic values for ``Machine`` on its own (its
``state_type: type[S]`` field and the ``S``/``E`` type variables bound to
``enum.Enum`` have no values), so a plugin registers a factory that picks one
of the five real machines and draws ``state``/``event`` from *that*
machine's enums.  The contracts are therefore checked against the real
tables, every (machine, state, event) combination.

Nor can it build the attrs classes of ``kernel/protocol.py`` (snapshots,
requests, results): attrs generates their ``__init__`` outside the module,
so its string annotations (``from __future__ import annotations``) do not
resolve, and every attempt would be silently "not confirmed".  The same
plugin registers a factory for each of them; see
:func:`register_symbolic_protocol_values` for how it bounds the values.
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
# A hard wall-clock stop for the whole run, so a CrossHair hang cannot stall CI.  It is wall time
# while the budgets are CPU time: 30 contracts at 4 s of CPU each run beside the model checker and
# the journal's contracts on two cores, so a busy machine passed 150 s with every contract on its
# way to a clean report.  A hang is still caught, well inside CI's time.
OVERALL_TIMEOUT = 480.0
# Budget for each finite contract in the exhaustive run (see the module header).
EXHAUSTIVE_TIMEOUT = 60.0

# Contracts with finitely many paths: CrossHair must exhaust them.
EXHAUSTIVE = frozenset(
    {
        "fencekeeper.kernel.machines.Machine.allows",
        "fencekeeper.kernel.machines.Machine.events_from",
        "fencekeeper.kernel.machines.dispatch_state_of",
        "fencekeeper.kernel.machines.initial_node_state",
        # Its strings are only formatted, never branched on: three paths
        # (granted; denied with or without a reason).
        "fencekeeper.kernel.protocol._check_authorized",
    }
)

_PLUGIN = """\
from tests.contracts.run_crosshair import register_symbolic_machines, register_symbolic_protocol_values
register_symbolic_machines()
register_symbolic_protocol_values()
"""

# A deliberately false contract over protocol snapshots.  CrossHair can refute
# it only if the plugin builds Execution, Dispatch and LeaseCredential values;
# if the plugin ever stops doing so, every protocol contract would come back
# "not confirmed" (a pass) without one path run, so the runner checks this
# first-hand (see plugin_problems).
_SENTINEL = '''\
from fencekeeper.kernel.protocol import Dispatch, Execution, LeaseCredential


def same_lease(execution: Execution, dispatch: Dispatch, credential: LeaseCredential) -> bool:
    """
    post: __return__
    """
    return not (execution.fence == credential.fence and dispatch.lease_token == credential.lease_token)
'''

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


OWN_RUN = frozenset({"fencekeeper.kernel.dag", "fencekeeper.kernel.journal"})
"""Modules whose contracts tests/contracts/run_journal_crosshair.py checks, in its own process and time budget."""


def contract_modules(root: Path = ROOT, *, own_run: bool = False) -> dict[str, list[Contract]]:
    """Module name -> its contracts, for every package module that has any (``own_run``: those of OWN_RUN only)."""
    modules: dict[str, list[Contract]] = {}
    for directory, package in PACKAGES.items():
        for path in sorted((root / directory).rglob("*.py")):
            parts = path.relative_to(root / directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = ".".join([package, *parts])
            contracts = contracts_in(path, module)
            if contracts and (module in OWN_RUN) == own_run:
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


def register_symbolic_protocol_values() -> None:
    """CrossHair plugin: build the attrs classes of ``kernel/protocol.py`` field by field.

    Runs inside the ``crosshair`` process, like :func:`register_symbolic_machines`.
    Each attrs class of the protocol module gets a factory that resolves its
    field types against that module and builds each field:

    - ``datetime``, and every argument named ``now``: half the time an
      instant this path drew before, otherwise one of three UTC instants a
      second apart.  The helpers only compare instants, and three of them
      show every order (before, at, after); concrete instants also keep each
      path cheap (CrossHair's symbolic dates cost a solver call per field).
      Naive and non-UTC times never reach a helper: every decision refuses
      them first (``_check_utc``), which tests/protocol/test_decisions.py
      covers.
    - enums: half the time a member this path drew before for that enum,
      otherwise any member.  The protocol compares states across rows (a
      guard's expected state with the row's, a dispatch row's with its
      execution's); drawn independently, two states agree once in 64 paths
      and a contract would rarely get past that comparison.  A dispatch
      state may likewise be the one that mirrors the execution state drawn
      before it (seed 000: "A dispatch row must agree with the authoritative
      WorkflowExecution state").  Every combination stays reachable; equal
      values are only made likely.
    - ``X | None`` and other unions: any member, each equally likely;
    - everything else (strings, ints, bools, nested attrs classes, tuples):
      CrossHair's own symbolic values, so identifiers, tokens, revisions,
      fences and counts are unrestricted.  (Drawing strings from a few fixed
      values was tried: every string field then forks the path at creation,
      and the lease contracts no longer got past the first comparisons in
      budget; symbolic strings fork only where the helpers compare them.)

    Each path is one value per argument, so a contract's counterexample is
    real input; what the choices above change is only which inputs are
    tried first within the budget.
    """
    # Imported here for the same reason as in register_symbolic_machines.
    import enum  # noqa: PLC0415
    import types  # noqa: PLC0415
    import typing  # noqa: PLC0415
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    import attrs  # noqa: PLC0415
    from crosshair import SymbolicFactory, core, register_type  # noqa: PLC0415
    from crosshair.statespace import context_statespace  # noqa: PLC0415
    from crosshair.tracers import ResumedTracing  # noqa: PLC0415
    from crosshair.util import renamed_function  # noqa: PLC0415

    from fencekeeper.kernel import protocol  # noqa: PLC0415
    from fencekeeper.kernel.machines import DispatchState, ExecutionState, dispatch_state_of  # noqa: PLC0415

    start = datetime(2026, 1, 1, tzinfo=UTC)
    instants = [start + timedelta(seconds=n) for n in range(3)]

    # What this path has drawn so far, by type.  Paths are told apart by
    # their state space: a value drawn on another path must never be reused.
    drawn: dict[str, Any] = {}

    def drawn_on(factory: Any) -> dict[Any, list[Any]]:
        if drawn.get("space") is not factory.space:
            drawn.clear()
            drawn["space"] = factory.space
            drawn["values"] = {}
        return cast(dict[Any, list[Any]], drawn["values"])

    def choose(factory: Any, varname: str, options: Sequence[Any]) -> Any:
        """One of ``options``, each equally likely to be tried first."""
        for number, option in enumerate(options[:-1]):
            if factory.space.smt_fork(desc=f"{varname}#{number}", probability_true=1 / (len(options) - number)):
                return option
        return options[-1]

    def draw(factory: Any, hint: Any, varname: str, fresh: Sequence[Any]) -> Any:
        """Half the time a value this path drew before for ``hint``, otherwise any of ``fresh``."""
        values = drawn_on(factory)
        earlier = list(values.get(hint, ()))
        if hint is DispatchState and values.get(ExecutionState):
            earlier.insert(0, dispatch_state_of(values[ExecutionState][0]))
        earlier = list(dict.fromkeys(earlier))
        again = bool(earlier) and factory.space.smt_fork(desc=f"{varname}:again", probability_true=0.5)
        chosen = choose(factory, varname, earlier if again else fresh)
        values.setdefault(hint, []).append(chosen)
        return chosen

    def value(factory: Any, hint: Any, varname: str) -> Any:
        if hint is datetime:
            return draw(factory, datetime, varname, instants)
        if hint is type(None):
            return None
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return draw(factory, hint, varname, list(hint))
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            # Which member is itself drawn like an enum: rows that agree on
            # "no lease" (None) or "a lease" are likely, as with states.
            return value(factory, draw(factory, hint, varname, typing.get_args(hint)), varname)
        return factory(hint, "_" + varname.rsplit("_", 1)[-1])

    def register(cls: type) -> None:
        hints = typing.get_type_hints(cls, vars(protocol))
        names = [f.name for f in attrs.fields(cls)]

        def make(factory: Any) -> Any:
            fields = {name: value(factory, hints[name], f"{factory.varname}_{name}") for name in names}
            with ResumedTracing():  # type: ignore[no-untyped-call]
                return cls(**fields)

        register_type(cls, make)

    for candidate in vars(protocol).values():
        if isinstance(candidate, type) and attrs.has(candidate) and candidate.__module__ == protocol.__name__:
            register(candidate)

    def make_now(typ: Any, varname: str, allow_subtypes: bool = False) -> Any:
        if typ is datetime:
            return draw(SymbolicFactory(context_statespace(), datetime, varname), datetime, varname, instants)
        return core.proxy_for_type(typ, varname, allow_subtypes)

    # Only the time arguments, by name, like "state" and "event" above.
    core._ARG_GENERATION_RENAMES["now"] = renamed_function(cast(FunctionType, make_now), "proxy_arg_now")


def plugin_problems(directory: Path, plugin: Path) -> list[str]:
    """Problems if the plugin does not let CrossHair build protocol snapshots (the false sentinel survives)."""
    sentinel = directory / "protocol_sentinel.py"
    sentinel.write_text(_SENTINEL, encoding="utf-8")
    line = next(n for n, text in enumerate(_SENTINEL.splitlines(), start=1) if "post: __return__" in text)
    report = check([str(sentinel)], per_condition_timeout=2.0, plugins=[plugin], cwd=directory)
    if (os.path.realpath(sentinel), line) in report.refuted:
        return []
    return [
        "the plugin built no protocol snapshots: a false contract over Execution, Dispatch and LeaseCredential "
        f"was not refuted, so the protocol contracts would pass without being checked ({report.errors or 'silent'})"
    ]


def _problems(report: Report, contracts: Iterable[Contract], exhaustive: Report | None = None) -> list[str]:
    """What is wrong, given the module-wide ``report`` and the finite contracts' own run ``exhaustive``."""
    problems = list(report.errors)
    if exhaustive is not None:
        problems += exhaustive.errors
    proved = (exhaustive or report).confirmed
    for contract in contracts:
        key = (contract.path, contract.line)
        if key in report.refuted or (exhaustive is not None and key in exhaustive.refuted):
            continue  # already listed among the errors
        if key not in report.confirmed | report.unconfirmed:
            problems.append(f"{contract.where()}: crosshair did not report on this contract")
        elif contract.function in EXHAUSTIVE and key not in proved:
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
        plugin = write_plugin(Path(tmp))
        problems = plugin_problems(Path(tmp), plugin)
        report = check(sorted(modules), plugins=[plugin])
        exhaustive = check(sorted(EXHAUSTIVE), plugins=[plugin], per_condition_timeout=EXHAUSTIVE_TIMEOUT)
    problems += _problems(report, contracts, exhaustive)
    for problem in problems:
        print(f"crosshair: error: {problem}")
    if report.stderr.strip() and problems:
        print(report.stderr.rstrip(), file=sys.stderr)
    def count(keys: set[tuple[str, int]]) -> int:
        return sum((c.path, c.line) in keys for c in contracts)

    print(
        f"crosshair: {'FAILED' if problems else 'ok'}: {len(contracts)} contracts in {len(modules)} modules: "
        f"{count(report.confirmed | exhaustive.confirmed)} confirmed over all paths, {count(report.unconfirmed - exhaustive.confirmed)} not refuted within "
        f"{PER_CONDITION_TIMEOUT:g}s CPU each, {count(report.refuted)} refuted; {len(problems)} problems "
        f"({report.seconds + exhaustive.seconds:.1f}s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
